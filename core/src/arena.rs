//! A fixed-capacity versioned slot arena.
//!
//! Invariants (asserted in tests): every slot is either occupied or on the free list, never both;
//! a [`Handle`] names a slot *and* the version it was issued for, so a handle that outlived its
//! value is refused ([`None`]) and never resolves to a newer value in the same slot.

use core::marker::PhantomData;

use crate::error::Error;
use crate::narrow::u16_of;
use crate::storage::{FixedList, Inline, InlineArray, Storage};

/// A typed handle into an [`Arena`].
#[derive(Debug)]
pub struct Handle<T> {
    index: u16,
    version: u32,
    _t: PhantomData<fn() -> T>,
}

impl<T> Clone for Handle<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for Handle<T> {}
impl<T> PartialEq for Handle<T> {
    fn eq(&self, other: &Self) -> bool {
        self.index == other.index && self.version == other.version
    }
}
impl<T> Eq for Handle<T> {}
impl<T> core::hash::Hash for Handle<T> {
    fn hash<H: core::hash::Hasher>(&self, h: &mut H) {
        (self.index, self.version).hash(h);
    }
}
impl<T> PartialOrd for Handle<T> {
    fn partial_cmp(&self, other: &Self) -> Option<core::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl<T> Ord for Handle<T> {
    /// By slot, then version.
    fn cmp(&self, other: &Self) -> core::cmp::Ordering {
        (self.index, self.version).cmp(&(other.index, other.version))
    }
}

impl<T> Handle<T> {
    /// A handle naming `index` at `version`.
    pub const fn new(index: u16, version: u32) -> Self {
        Self {
            index,
            version,
            _t: PhantomData,
        }
    }
    /// The slot index (dense, `< N`).
    pub const fn index(self) -> u16 {
        self.index
    }
    /// The version the handle was issued for.
    pub const fn version(self) -> u32 {
        self.version
    }
}

/// A fixed-capacity arena of `N` slots (`N <= 65535`), stored as parallel arrays: the versions
/// (dense, 4 bytes a slot, for hot loops that only need a slot's handle) and the values, where `S`
/// ([`Storage`]) keeps them: inside the value ([`Inline`]) or each in a heap allocation of its own.
pub struct Arena<T, const N: usize, S: Storage = Inline> {
    versions: S::Array<u32, N>,
    values: S::Array<Option<T>, N>,
    free: S::List<u16, N>,
    len: usize,
}

impl<T, const N: usize> Default for Arena<T, N> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T, const N: usize> Arena<T, N> {
    /// An empty arena inside the value (const: a `static` can hold it).
    pub const fn new() -> Self {
        const {
            assert!(
                N > 0 && N <= u16::MAX as usize,
                "arena capacity must be 1..=65535"
            );
        };
        // Pop order hands out slot 0 first.
        let mut free = [0u16; N];
        let mut i = 0;
        while i < N {
            free[i] = u16_of(N - 1 - i);
            i += 1;
        }
        Self {
            versions: InlineArray::new([0; N]),
            values: InlineArray::new([const { None }; N]),
            free: heapless::Vec::from_array(free),
            len: 0,
        }
    }
}

impl<T, const N: usize, S: Storage> Arena<T, N, S> {
    /// An empty arena in storage `S` (refused only when `S` cannot have the memory).
    pub fn new_in() -> Result<Self, Error> {
        const {
            assert!(
                N > 0 && N <= u16::MAX as usize,
                "arena capacity must be 1..=65535"
            );
        };
        let mut free = S::list(0)?;
        for i in (0..N).rev() {
            let pushed = free.push(u16_of(i));
            debug_assert!(pushed.is_ok());
        }
        Ok(Self {
            versions: S::array(|| 0)?,
            values: S::array(|| None)?,
            free,
            len: 0,
        })
    }

    /// Capacity.
    pub const fn capacity(&self) -> usize {
        N
    }

    /// Live values.
    pub const fn len(&self) -> usize {
        self.len
    }

    /// No live values.
    pub const fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The handle the next [`Arena::insert`] will return, if there is room.
    pub fn vacancy(&self) -> Option<Handle<T>> {
        let &i = self.free.last()?;
        Some(Handle::new(i, self.versions[i as usize]))
    }

    /// Inserts a value; when full, hands it back.
    pub fn insert(&mut self, value: T) -> Result<Handle<T>, T> {
        let Some(index) = self.free.pop() else {
            return Err(value);
        };
        let slot = &mut self.values[index as usize];
        assert!(slot.is_none(), "a free slot is vacant");
        *slot = Some(value);
        self.len += 1;
        Ok(Handle::new(index, self.versions[index as usize]))
    }

    fn live(&self, h: Handle<T>) -> bool {
        self.versions.get(h.index as usize) == Some(&h.version)
    }

    /// The value, if the handle is live.
    pub fn get(&self, h: Handle<T>) -> Option<&T> {
        if !self.live(h) {
            return None;
        }
        self.values[h.index as usize].as_ref()
    }

    /// The value, mutably, if the handle is live.
    pub fn get_mut(&mut self, h: Handle<T>) -> Option<&mut T> {
        if !self.live(h) {
            return None;
        }
        self.values[h.index as usize].as_mut()
    }

    /// Value at a dense slot index (no version check; for internal iteration over known-live slots).
    #[inline]
    pub fn at(&self, index: u16) -> Option<&T> {
        self.values.get(index as usize)?.as_ref()
    }

    /// Mutable value at a dense slot index.
    #[inline]
    pub fn at_mut(&mut self, index: u16) -> Option<&mut T> {
        self.values.get_mut(index as usize)?.as_mut()
    }

    /// The version of a slot (the one its live value's handle carries).
    #[inline]
    pub fn version_at(&self, index: u16) -> u32 {
        self.versions[index as usize]
    }

    /// Replaces the live value at `index` by `f(value)`: the value moves out, through `f` and back, so
    /// `f` may consume it. Returns what `f` returned besides, or `None` (and calls nothing) for a vacant
    /// slot. Nothing can observe the slot while `f` runs: the arena is borrowed.
    pub fn update<R>(&mut self, index: u16, f: impl FnOnce(T) -> (T, R)) -> Option<R> {
        let slot = self.values.get_mut(index as usize)?;
        let value = slot.take()?;
        let (value, r) = f(value);
        *slot = Some(value);
        Some(r)
    }

    /// The live handle of a dense slot index.
    pub fn handle_at(&self, index: u16) -> Option<Handle<T>> {
        let v = self.values.get(index as usize)?;
        v.as_ref()
            .map(|_| Handle::new(index, self.versions[index as usize]))
    }

    /// Removes and returns the value; the handle (and every copy) becomes stale.
    pub fn remove(&mut self, h: Handle<T>) -> Option<T> {
        if !self.live(h) {
            return None;
        }
        let v = self.values[h.index as usize].take()?;
        let g = &mut self.versions[h.index as usize];
        *g = g.wrapping_add(1);
        self.len -= 1;
        // Cannot fail: the slot was occupied, so the free list has room for it.
        let pushed = self.free.push(h.index);
        assert!(pushed.is_ok(), "a freed slot fits the free list");
        Some(v)
    }

    /// Takes back a value whose handle was never handed out (an insertion rolled back inside one
    /// operation): unlike [`Arena::remove`], the version is not bumped, so the arena is exactly as
    /// it was before the insertion.
    pub fn cancel_insert(&mut self, h: Handle<T>) -> Option<T> {
        if !self.live(h) {
            return None;
        }
        let v = self.values[h.index as usize].take()?;
        self.len -= 1;
        // `insert` popped this index last; pushing it back restores the free list's order.
        let pushed = self.free.push(h.index);
        assert!(pushed.is_ok(), "a freed slot fits the free list");
        Some(v)
    }

    /// Feeds every slot (version and value), the free list and the length to `h`.
    pub fn hash_state<H: core::hash::Hasher>(&self, h: &mut H, value: impl Fn(&T, &mut H)) {
        use core::hash::Hash;
        for (g, v) in self.versions.iter().zip(self.values.iter()) {
            g.hash(h);
            match v {
                None => 0u8.hash(h),
                Some(v) => {
                    1u8.hash(h);
                    value(v, h);
                }
            }
        }
        self.free.hash(h);
        self.len.hash(h);
    }

    /// Iterates over live values with their handles.
    pub fn iter(&self) -> impl Iterator<Item = (Handle<T>, &T)> {
        self.values.iter().enumerate().filter_map(|(i, v)| {
            v.as_ref()
                .map(|v| (Handle::new(u16_of(i), self.versions[i]), v))
        })
    }

    /// Checks the arena's invariant: free + live = capacity and no slot is both.
    pub fn check(&self) -> bool {
        let live = self.values.iter().filter(|v| v.is_some()).count();
        live == self.len
            && self.free.len() + live == N
            && self.free.iter().all(|&i| self.values[i as usize].is_none())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn insert_get_remove_and_stale_handles() {
        let mut a: Arena<u32, 2> = Arena::new();
        let h0 = a.insert(10).unwrap();
        let h1 = a.insert(11).unwrap();
        assert_eq!(a.insert(12), Err(12), "full arena hands the value back");
        assert_eq!(a.get(h0), Some(&10));
        assert_eq!(a.remove(h0), Some(10));
        assert_eq!(a.get(h0), None, "removed handle is stale");
        let h2 = a.insert(20).unwrap();
        assert_eq!(h2.index(), h0.index(), "slot reused");
        assert_eq!(
            a.get(h0),
            None,
            "old handle does not resolve to the new value"
        );
        assert_eq!(a.remove(h0), None);
        assert_eq!(a.get(h2), Some(&20));
        assert_eq!(a.get(h1), Some(&11));
        assert!(a.check());
        assert_eq!(a.len(), 2);
    }

    #[test]
    fn cancelled_insert_leaves_the_arena_as_it_was() {
        use crate::fingerprint::Fingerprint;
        use core::hash::Hasher;
        let fp = |a: &Arena<u32, 3>| {
            let mut h = Fingerprint::new();
            a.hash_state(&mut h, core::hash::Hash::hash);
            h.finish()
        };
        let mut a: Arena<u32, 3> = Arena::new();
        let h0 = a.insert(1).unwrap();
        let before = fp(&a);
        let h1 = a.insert(2).unwrap();
        assert_eq!(a.cancel_insert(h1), Some(2));
        assert_eq!(fp(&a), before);
        assert_eq!(a.insert(3).unwrap(), h1, "the same handle is issued again");
        assert!(a.remove(h0).is_some());
        assert_ne!(fp(&a), before);
        assert!(a.check());
    }
}
