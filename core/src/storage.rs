//! Where fixed-capacity state lives: one type, two storages.
//!
//! - [`Buffers`] chooses where a page pool's buffers live: [`Borrowed`] from the caller (`&mut [T]`,
//!   no heap) or [`Owned`] by the pool (`Box<[T]>`, feature `alloc`, reserved with `try_reserve` so that
//!   an unaffordable geometry is an error, never an abort).

use core::fmt::Debug;
use core::marker::PhantomData;
use core::ops::DerefMut;

mod sealed {
    pub trait Sealed {}
}

/// Where a page pool's buffers live: [`Borrowed`] or [`Owned`].
pub trait Buffers: sealed::Sealed {
    /// A buffer of `T`s.
    type Buf<T: Copy + Debug + 'static>: DerefMut<Target = [T]> + Default + Debug;
}

/// Buffers lent by the caller (`&'a mut [T]`): statics, the stack, memory the host program owns. No
/// heap.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Borrowed<'a>(PhantomData<&'a mut ()>);

impl sealed::Sealed for Borrowed<'_> {}

impl<'a> Buffers for Borrowed<'a> {
    type Buf<T: Copy + Debug + 'static> = &'a mut [T];
}

#[cfg(feature = "alloc")]
mod heap;

#[cfg(feature = "alloc")]
pub(crate) use heap::boxed_slice;
#[cfg(feature = "alloc")]
pub use heap::Owned;
