//! Prefix reuse on a hybrid model: the attention groups' hit, capped at the deepest snapshot the
//! state pool holds ready ([the backend's docs](super)).

use super::{GroupPool, Hybrid};
use crate::kv::{ContextPrep, KvRef, PrefixCap, PrefixReuse, Reach};
use crate::storage::Storage;

impl<P: GroupPool, const G: usize, const C: usize, S: Storage> Hybrid<P, G, C, S> {
    /// Side-effect free: `(matched, hit, snapshot)`: the attention groups' own hit, the deepest
    /// snapshot point at or before it with a ready snapshot, and that snapshot's slot (`(m, 0,
    /// None)`: none). Each ready snapshot at or before the hit is checked against the request's key
    /// at its position, deepest first: as many key lookups as such snapshots, none without one.
    pub(super) fn state_hit(&self, r: KvRef, prep: ContextPrep) -> (u32, u32, Option<u32>) {
        let Some((_, agreed)) = self.attention.hits(r, prep) else {
            return (0, 0, None);
        };
        let interval = self.state.config().snapshot_interval;
        let mut best: Option<(u32, u32)> = None;
        for (slot, p, key) in self.state.ready() {
            let deeper = best.is_none_or(|(b, _)| p > b);
            if deeper && p <= agreed && p % interval == 0 && self.key_at(r, p) == Some(key) {
                best = Some((p, slot));
            }
        }
        match best {
            Some((p, slot)) => (agreed, p, Some(slot)),
            None => (agreed, 0, None),
        }
    }
}

/// The prefix cache, present while the attention groups have one.
impl<P: GroupPool, const G: usize, const C: usize, S: Storage> Reach<Hybrid<P, G, C, S>, PrefixCap>
    for Hybrid<P, G, C, S>
{
    #[inline]
    fn reach(k: &Self) -> Option<&Self> {
        k.attention.groups()[0].pool.has_prefix_cache().then_some(k)
    }
    #[inline]
    fn reach_mut(k: &mut Self) -> Option<&mut Self> {
        if k.attention.groups()[0].pool.has_prefix_cache() {
            Some(k)
        } else {
            None
        }
    }
}

impl<P: GroupPool, const G: usize, const C: usize, S: Storage> PrefixReuse for Hybrid<P, G, C, S> {
    fn set_prefix(&mut self, r: KvRef, root: u64, hashes: &[u64]) {
        self.attention.set_prefix(r, root, hashes);
    }

    /// The attention blocks join the prefix cache; the chunk's snapshots become ready.
    fn commit(&mut self, r: KvRef, computed: u32) {
        self.attention.commit(r, computed);
        self.state.commit(r.slot, computed);
    }

    fn all_blocks_reusable(&self) -> bool {
        self.attention.all_blocks_reusable()
    }

    fn drop_idle_blocks(&mut self) -> u32 {
        self.attention.drop_idle_blocks() + self.state.drop_ready()
    }

    fn probe_first_new_block(&self, r: KvRef, prep: ContextPrep) -> Option<u64> {
        if !prep.first_chunk {
            return self.attention.probe_first_new_block(r, prep);
        }
        let (_, hit, _) = self.state_hit(r, prep);
        self.attention.groups()[0]
            .pool
            .block_key(r, hit / self.tokens_per_block)
    }

    fn probe_context_reuse(&self, r: KvRef, prep: ContextPrep) -> Option<u32> {
        self.attention.probe_context_reuse(r, prep)?;
        Some(self.state_hit(r, prep).1)
    }

    /// The attention groups' leader's (a router matches a prompt against full-attention blocks).
    fn take_kv_events(&mut self) -> &[crate::kv_events::KvEvent] {
        self.attention.take_kv_events()
    }
}
