//! Where fixed-capacity state lives: one type, two storages.
//!
//! - [`Storage`] chooses where a scheduler keeps its fixed-capacity arrays and lists (the request
//!   table, the pass scratch, the fairness counters, the per-slot arrays, the output lists): [`Inline`]
//!   keeps them inside the value (const-constructible, for a `static`; what the benches measure), and
//!   `Boxed` (feature `alloc`) gives every one its own heap allocation, built in place, so that the
//!   value itself is small and nothing large passes through the stack.
//! - [`Buffers`] chooses where a page pool's buffers live: [`Borrowed`] from the caller (`&mut [T]`,
//!   no heap) or `Owned` by the pool (`Box<[T]>`, feature `alloc`, reserved with `try_reserve` so that
//!   an unaffordable geometry is an error, never an abort).
//!
//! Code over a storage indexes an array as an array ([`Storage::Array`] dereferences to `[T; N]`) and
//! uses a list as a slice plus [`FixedList`]'s few mutations.

use core::fmt::Debug;
use core::marker::PhantomData;
use core::ops::{Deref, DerefMut};

use crate::error::Error;

mod sealed {
    pub trait Sealed {}
}

/// Where a scheduler's fixed-capacity arrays and lists live: [`Inline`] or `Boxed`.
pub trait Storage: sealed::Sealed + Sized + 'static {
    /// An array of `N` values.
    type Array<T, const N: usize>: DerefMut<Target = [T; N]>;
    /// A list of at most `N` values.
    type List<T: Copy + Debug, const N: usize>: FixedList<T> + Clone + Debug;
    /// An array of `N` values, each made by `fill`.
    fn array<T, const N: usize>(fill: impl FnMut() -> T) -> Result<Self::Array<T, N>, Error>;
    /// An empty list of capacity `N` (`fill`: what its unused room holds, where it holds anything).
    fn list<T: Copy + Debug, const N: usize>(fill: T) -> Result<Self::List<T, N>, Error>;
}

/// A fixed-capacity list: a slice (its items) that can grow up to a capacity fixed at construction.
pub trait FixedList<T>: DerefMut<Target = [T]> {
    /// Appends an item; hands it back when the list is full.
    fn push(&mut self, item: T) -> Result<(), T>;
    /// Removes the last item.
    fn pop(&mut self) -> Option<T>;
    /// Removes every item.
    fn clear(&mut self);
    /// Removes the item at `index`, shifting the later ones down. Panics when out of bounds.
    fn remove(&mut self, index: usize) -> T;
    /// Removes the item at `index`, moving the last one into its place. Panics when out of bounds.
    fn swap_remove(&mut self, index: usize) -> T;
    /// The list holds its capacity.
    fn is_full(&self) -> bool;
    /// Appends every item of `items`, or none when they do not all fit (`false`).
    fn extend_from_slice(&mut self, items: &[T]) -> bool;
}

/// The arrays and lists inside the value: const-constructible (a `static` can hold the whole
/// scheduler), and what every hot path reads without an indirection. Large for a large `N`: a value
/// of a few hundred KiB belongs in a `static`; on the heap, use `Boxed` (a `Box` of an inline value is
/// built on the stack first).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Inline;

impl sealed::Sealed for Inline {}

impl Storage for Inline {
    type Array<T, const N: usize> = InlineArray<T, N>;
    type List<T: Copy + Debug, const N: usize> = heapless::Vec<T, N>;

    #[inline]
    fn array<T, const N: usize>(mut fill: impl FnMut() -> T) -> Result<InlineArray<T, N>, Error> {
        Ok(InlineArray(core::array::from_fn(|_| fill())))
    }

    #[inline]
    fn list<T: Copy + Debug, const N: usize>(_: T) -> Result<heapless::Vec<T, N>, Error> {
        Ok(heapless::Vec::new())
    }
}

/// An array inside the value ([`Inline`]'s [`Storage::Array`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct InlineArray<T, const N: usize>([T; N]);

impl<T, const N: usize> InlineArray<T, N> {
    /// The array.
    #[inline(always)]
    pub const fn new(items: [T; N]) -> Self {
        Self(items)
    }
}

impl<T, const N: usize> Deref for InlineArray<T, N> {
    type Target = [T; N];
    #[inline(always)]
    fn deref(&self) -> &[T; N] {
        &self.0
    }
}

impl<T, const N: usize> DerefMut for InlineArray<T, N> {
    #[inline(always)]
    fn deref_mut(&mut self) -> &mut [T; N] {
        &mut self.0
    }
}

impl<T: Copy, const N: usize> FixedList<T> for heapless::Vec<T, N> {
    #[inline(always)]
    fn push(&mut self, item: T) -> Result<(), T> {
        heapless::Vec::push(self, item)
    }
    #[inline(always)]
    fn pop(&mut self) -> Option<T> {
        heapless::Vec::pop(self)
    }
    #[inline(always)]
    fn clear(&mut self) {
        heapless::Vec::clear(self);
    }
    #[inline(always)]
    fn remove(&mut self, index: usize) -> T {
        heapless::Vec::remove(self, index)
    }
    #[inline(always)]
    fn swap_remove(&mut self, index: usize) -> T {
        heapless::Vec::swap_remove(self, index)
    }
    #[inline(always)]
    fn is_full(&self) -> bool {
        heapless::Vec::is_full(self)
    }
    #[inline]
    fn extend_from_slice(&mut self, items: &[T]) -> bool {
        heapless::Vec::extend_from_slice(self, items).is_ok()
    }
}

/// Where a page pool's buffers live: [`Borrowed`] or `Owned`.
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
pub use heap::{Boxed, BoxedList, Owned};
