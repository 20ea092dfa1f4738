//! A fixed-capacity map from request id to table slot: open addressing with linear probing over `2N`
//! buckets (load factor at most 1/2), backward-shift deletion (no tombstones), no allocation.
//!
//! It makes the duplicate-id check of `submit`/`adopt` and `Scheduler::find` O(1) instead of a scan of the
//! whole table (which made submitting `N` requests O(N²)).
//!
//! Invariant (checked by [`IdIndex::check`] in tests): every live slot's id is reachable from its home
//! bucket without crossing an empty bucket, and no other bucket is occupied.

use crate::error::Error;
use crate::ids::RequestId;
use crate::storage::{Inline, InlineArray, Storage};

/// Id → slot for up to `N` slots (`N <= 65535`, as the table's).
pub(crate) struct IdIndex<const N: usize, S: Storage = Inline> {
    /// `2N` buckets (as `N` pairs): 0 = empty, else slot + 1.
    buckets: S::Array<[u16; 2], N>,
    /// The id of each occupied slot, by slot.
    ids: S::Array<u64, N>,
    len: usize,
}

impl<const N: usize> IdIndex<N> {
    /// An empty index inside the value.
    pub(crate) const fn new() -> Self {
        const {
            assert!(
                N > 0 && N <= u16::MAX as usize,
                "capacity must be 1..=65535"
            );
        };
        Self {
            buckets: InlineArray::new([[0; 2]; N]),
            ids: InlineArray::new([0; N]),
            len: 0,
        }
    }
}

impl<const N: usize, S: Storage> IdIndex<N, S> {
    /// An empty index in storage `S`.
    pub(crate) fn new_in() -> Result<Self, Error> {
        const {
            assert!(
                N > 0 && N <= u16::MAX as usize,
                "capacity must be 1..=65535"
            );
        };
        Ok(Self {
            buckets: S::array(|| [0; 2])?,
            ids: S::array(|| 0)?,
            len: 0,
        })
    }

    const BUCKETS: usize = 2 * N;

    /// Feeds every bucket, the slot ids and the length to `h` (for state fingerprints).
    pub(crate) fn hash_state<H: core::hash::Hasher>(&self, h: &mut H) {
        use core::hash::Hash;
        self.buckets.hash(h);
        self.ids.hash(h);
        self.len.hash(h);
    }

    /// Home bucket of an id (Fibonacci hashing, multiply-high into `0..2N`).
    fn home(id: u64) -> usize {
        let h = id.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        // The high half of `h * BUCKETS` is below `BUCKETS`: the cast keeps every bit.
        #[allow(clippy::cast_possible_truncation)]
        let home = ((u128::from(h) * Self::BUCKETS as u128) >> 64) as usize;
        home
    }

    fn bucket(&self, k: usize) -> u16 {
        self.buckets[k / 2][k % 2]
    }

    fn set(&mut self, k: usize, v: u16) {
        self.buckets[k / 2][k % 2] = v;
    }

    fn next(k: usize) -> usize {
        if k + 1 == Self::BUCKETS {
            0
        } else {
            k + 1
        }
    }

    /// The bucket holding `id`, if any.
    fn find(&self, id: u64) -> Option<usize> {
        let mut k = Self::home(id);
        // At most N buckets are occupied, so an empty one ends every probe.
        loop {
            let b = self.bucket(k);
            if b == 0 {
                return None;
            }
            if self.ids[usize::from(b - 1)] == id {
                return Some(k);
            }
            k = Self::next(k);
        }
    }

    /// The slot of `id`.
    pub(crate) fn get(&self, id: RequestId) -> Option<u16> {
        self.find(id.0).map(|k| self.bucket(k) - 1)
    }

    /// Records `id` at `slot`. The caller guarantees `id` is absent and `slot` is free.
    pub(crate) fn insert(&mut self, id: RequestId, slot: u16) {
        debug_assert!(self.find(id.0).is_none(), "duplicate id in the index");
        debug_assert!(self.len < N);
        let mut k = Self::home(id.0);
        while self.bucket(k) != 0 {
            k = Self::next(k);
        }
        self.set(k, slot + 1);
        self.ids[usize::from(slot)] = id.0;
        self.len += 1;
    }

    /// Forgets `id`; returns its slot.
    pub(crate) fn remove(&mut self, id: RequestId) -> Option<u16> {
        let mut hole = self.find(id.0)?;
        let slot = self.bucket(hole) - 1;
        // Backward shift: pull later entries of the cluster into the hole when their home allows it.
        let mut j = hole;
        loop {
            j = Self::next(j);
            let b = self.bucket(j);
            if b == 0 {
                break;
            }
            let home = Self::home(self.ids[usize::from(b - 1)]);
            let dist_entry = (j + Self::BUCKETS - home) % Self::BUCKETS;
            let dist_hole = (j + Self::BUCKETS - hole) % Self::BUCKETS;
            if dist_entry >= dist_hole {
                self.set(hole, b);
                hole = j;
            }
        }
        self.set(hole, 0);
        self.ids[usize::from(slot)] = 0;
        self.len -= 1;
        Some(slot)
    }

    /// Every occupied bucket is reachable from its entry's home bucket; the count matches.
    #[cfg(test)]
    pub(crate) fn check(&self) -> bool {
        let mut count = 0;
        for k in 0..Self::BUCKETS {
            let b = self.bucket(k);
            if b == 0 {
                continue;
            }
            count += 1;
            let id = self.ids[usize::from(b - 1)];
            if self.find(id) != Some(k) {
                return false;
            }
        }
        count == self.len
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn insert_get_remove_against_a_model() {
        // Ids that collide on purpose (multiples of a large power of two) and random ones.
        let mut idx: IdIndex<16> = IdIndex::new();
        let mut model: [Option<u64>; 16] = [None; 16];
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        for step in 0..20_000u32 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let slot = (seed % 16) as u16;
            let id = if step % 3 == 0 {
                (seed >> 40) << 32
            } else {
                seed >> 20
            };
            if let Some(old) = model[slot as usize] {
                assert_eq!(idx.remove(RequestId(old)), Some(slot));
                assert_eq!(idx.get(RequestId(old)), None);
                model[slot as usize] = None;
            } else {
                if model.contains(&Some(id)) {
                    continue;
                }
                idx.insert(RequestId(id), slot);
                model[slot as usize] = Some(id);
            }
            assert!(idx.check());
            for (s, m) in model.iter().enumerate() {
                if let Some(id) = m {
                    assert_eq!(idx.get(RequestId(*id)), Some(s as u16));
                }
            }
        }
    }
}
