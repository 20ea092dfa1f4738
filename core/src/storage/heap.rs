//! The heap storage (feature `alloc`): [`Owned`] pool buffers. Every
//! allocation is reserved first (`try_reserve_exact`), so memory that cannot be had is an
//! [`Error`], and every buffer is filled where it lies, on the heap.

use alloc::boxed::Box;
use alloc::vec::Vec;
use core::fmt::Debug;

use super::{sealed, Buffers};
use crate::error::Error;

/// `len` values made by `fill`, written straight into a reserved heap buffer.
fn filled<T>(len: usize, fill: impl FnMut() -> T) -> Result<Vec<T>, Error> {
    let mut v = Vec::new();
    v.try_reserve_exact(len)
        .map_err(|_| Error::Invalid("fixed-capacity storage does not fit in memory"))?;
    v.extend(core::iter::repeat_with(fill).take(len));
    Ok(v)
}

/// A buffer of `len` copies of `fill` on the heap; memory that cannot be had is an error.
pub(crate) fn boxed_slice<T: Copy>(len: usize, fill: T) -> Result<Box<[T]>, Error> {
    Ok(filled(len, || fill)?.into_boxed_slice())
}

/// Buffers the pool owns on the heap (`Box<[T]>`), reserved with `try_reserve`: build such a pool
/// with [`KvPool::owned`](crate::page_pool::KvPool::owned).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Owned;

impl sealed::Sealed for Owned {}

impl Buffers for Owned {
    type Buf<T: Copy + Debug + 'static> = Box<[T]>;
}
