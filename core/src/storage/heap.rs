//! The heap storages (feature `alloc`): [`Boxed`] arrays and lists, [`Owned`] pool buffers. Every
//! allocation is reserved first (`try_reserve_exact`), so memory that cannot be had is an
//! [`Error`], and every buffer is filled where it lies, on the heap.

use alloc::boxed::Box;
use alloc::vec::Vec;
use core::fmt::Debug;
use core::ops::{Deref, DerefMut};

use super::{sealed, Buffers, FixedList, Storage};
use crate::error::Error;

/// Every array and list its own heap allocation, built in place: the value holding them is small
/// (a pointer an array), and building it never puts an array on the stack.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Boxed;

impl sealed::Sealed for Boxed {}

impl Storage for Boxed {
    type Array<T, const N: usize> = Box<[T; N]>;
    type List<T: Copy + Debug, const N: usize> = BoxedList<T, N>;

    fn array<T, const N: usize>(fill: impl FnMut() -> T) -> Result<Box<[T; N]>, Error> {
        let v = filled(N, fill)?;
        Box::<[T; N]>::try_from(v).map_err(|_| unreachable_len())
    }

    fn list<T: Copy + Debug, const N: usize>(fill: T) -> Result<BoxedList<T, N>, Error> {
        Ok(BoxedList {
            items: Self::array(|| fill)?,
            len: 0,
        })
    }
}

fn unreachable_len() -> Error {
    Error::Invalid("a buffer of N items did not make an array of N")
}

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

/// [`Boxed`]'s list: up to `N` items in one heap array.
#[derive(Clone)]
pub struct BoxedList<T, const N: usize> {
    items: Box<[T; N]>,
    len: usize,
}

impl<T: Debug, const N: usize> Debug for BoxedList<T, N> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_list()
            .entries(self.items[..self.len].iter())
            .finish()
    }
}

impl<T, const N: usize> Deref for BoxedList<T, N> {
    type Target = [T];
    #[inline]
    fn deref(&self) -> &[T] {
        &self.items[..self.len]
    }
}

impl<T, const N: usize> DerefMut for BoxedList<T, N> {
    #[inline]
    fn deref_mut(&mut self) -> &mut [T] {
        &mut self.items[..self.len]
    }
}

impl<T: Copy, const N: usize> FixedList<T> for BoxedList<T, N> {
    #[inline]
    fn push(&mut self, item: T) -> Result<(), T> {
        match self.items.get_mut(self.len) {
            Some(at) => {
                *at = item;
                self.len += 1;
                Ok(())
            }
            None => Err(item),
        }
    }
    #[inline]
    fn pop(&mut self) -> Option<T> {
        self.len = self.len.checked_sub(1)?;
        Some(self.items[self.len])
    }
    #[inline]
    fn clear(&mut self) {
        self.len = 0;
    }
    fn remove(&mut self, index: usize) -> T {
        assert!(index < self.len, "remove: index out of bounds");
        let item = self.items[index];
        self.items.copy_within(index + 1..self.len, index);
        self.len -= 1;
        item
    }
    fn swap_remove(&mut self, index: usize) -> T {
        assert!(index < self.len, "swap_remove: index out of bounds");
        let item = self.items[index];
        self.items[index] = self.items[self.len - 1];
        self.len -= 1;
        item
    }
    #[inline]
    fn is_full(&self) -> bool {
        self.len == N
    }
    fn extend_from_slice(&mut self, items: &[T]) -> bool {
        let end = self.len + items.len();
        if end > N {
            return false;
        }
        self.items[self.len..end].copy_from_slice(items);
        self.len = end;
        true
    }
}

/// Buffers the pool owns on the heap (`Box<[T]>`), reserved with `try_reserve`: build such a pool
/// with [`KvPool::owned`](crate::page_pool::KvPool::owned).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Owned;

impl sealed::Sealed for Owned {}

impl Buffers for Owned {
    type Buf<T: Copy + Debug + 'static> = Box<[T]>;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A boxed list against `heapless::Vec`, the inline one, operation by operation.
    #[test]
    fn a_boxed_list_is_an_inline_list() {
        let mut b = Boxed::list::<u16, 4>(0).unwrap();
        let mut v = heapless::Vec::<u16, 4>::new();
        let push = |b: &mut BoxedList<u16, 4>, v: &mut heapless::Vec<u16, 4>, x: u16| {
            assert_eq!(b.push(x), FixedList::push(v, x));
        };
        for x in [5, 6, 7, 8, 9] {
            push(&mut b, &mut v, x);
        }
        assert!(b.is_full() && *b == *v);
        assert_eq!(b.remove(1), v.remove(1));
        assert_eq!(b.swap_remove(0), v.swap_remove(0));
        assert_eq!(*b, *v);
        assert!(
            !b.extend_from_slice(&[1, 2, 3]) && *b == *v,
            "all or nothing"
        );
        assert!(b.extend_from_slice(&[1, 2]) && FixedList::extend_from_slice(&mut v, &[1, 2]));
        assert_eq!((b.pop(), b.pop()), (v.pop(), v.pop()));
        b.clear();
        assert!(b.is_empty() && b.pop().is_none());
        let a: Box<[u32; 3]> = Boxed::array(|| 7).unwrap();
        assert_eq!(*a, [7; 3]);
    }
}
