//! What KV groups need of a group's pool ([`GroupPool`]), and the page pool's answers.

use crate::kv::{ContextPrep, KvBackend, KvRef, PairedPool, PrefixReuse};
use crate::page_pool::{KvPool, SeqState};
use crate::storage::Buffers;

/// A pool's geometry, which every group of a [`super::PoolGroups`] must share.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GroupGeometry {
    /// Request slots.
    pub slots: u32,
    /// Tokens per page.
    pub tokens_per_block: u32,
    /// Longest page table of one request.
    pub max_blocks: u32,
}

/// One group's pool, as [`super::PoolGroups`] drives it: a backend with prefix reuse (its
/// [`KvBackend`] and [`PrefixReuse`] calls are the group's share of every operation), plus what the
/// groups' rules read and ask of it. [`KvPool`] is one; the conformance runner's scripted pools are
/// another.
pub trait GroupPool: KvBackend + PrefixReuse {
    /// Its slots, page size and request length.
    fn geometry(&self) -> GroupGeometry;
    /// It has a prefix cache.
    fn has_prefix_cache(&self) -> bool;
    /// Its prefix cache holds committed blocks (a cache for groups must start empty).
    fn prefix_holds_blocks(&self) -> bool;
    /// Makes its prefix cache a sliding window's, whose queries read `blocks` blocks before their
    /// own; `false` (nothing changed) without a prefix cache or when the cache holds blocks.
    fn set_window(&mut self, blocks: u32) -> bool;
    /// It has neither a KV connector nor unified adapter paging (what groups require).
    fn plain(&self) -> bool;
    /// Gives up the request's blocks wholly before position `keep_from` (a sliding window's).
    fn release_window(&mut self, r: KvRef, keep_from: u32);
    /// The request's capacity in tokens.
    fn capacity(&self, r: KvRef) -> u32;
    /// The tokens its last growth added, 0 once reverted (a revert then does nothing).
    fn last_grow(&self, r: KvRef) -> u32;
    /// The key of block `k` of the request's prompt (`None` past its hashed blocks).
    fn block_key(&self, r: KvRef, k: u32) -> Option<u64>;
    /// Side-effect free: the tokens a first chunk's match would reuse (`None`: no answer), as
    /// [`PrefixReuse::probe_context_reuse`] but not counted as the scheduler's probe.
    fn reuse_hit(&self, r: KvRef, prep: ContextPrep) -> Option<u32>;
    /// Side-effect free: the request's suspended cache cannot resume now.
    fn resume_blocked(&self, r: KvRef) -> bool;
    /// Its invariants hold.
    fn check(&self) -> bool;
    /// What reservations in pages are counted against ([`PoolPages`]); `None` (the default): the
    /// pool does not keep them, and the groups reserve by capacity.
    fn pool_pages(&self) -> Option<PoolPages> {
        None
    }
    /// The pages of the cache in `slot` and its reservation ([`RowPages`]; zeros by default).
    fn row_pages(&self, slot: u16) -> RowPages {
        let _ = slot;
        RowPages::default()
    }
    /// Sets the most pages the request's reservation promises it at once (0 ends it).
    fn set_peak(&mut self, r: KvRef, peak: u32) {
        let _ = (r, peak);
    }
    /// While `on`, the calls this pool receives are the group set's compensation (undoing, in this
    /// group, an operation another group refused or the reservations do not back), not the
    /// scheduler's: a pool that records its calls can tell them apart. No-op by default.
    fn compensating(&mut self, on: bool) {
        let _ = on;
    }
}

/// A pool's pages as reservations count them ([`GroupPool::pool_pages`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct PoolPages {
    /// GPU pages that can be had: free, or cached and idle.
    pub available: u32,
    /// References beyond each page's first: pages one holder's release does not free.
    pub shared: u32,
}

/// A request's pages in a pool as reservations count them ([`GroupPool::row_pages`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct RowPages {
    /// Pages its active cache holds (0 for a suspended or absent one).
    pub held: u32,
    /// Leading blocks its sliding window gave up.
    pub released: u32,
    /// The most pages its reservation promises it at once (0: none).
    pub peak: u32,
}

impl RowPages {
    /// The pages its reservation still promises beyond those it holds.
    pub const fn promised(self) -> u32 {
        self.peak.saturating_sub(self.held)
    }
}

impl<B: Buffers> GroupPool for KvPool<'_, B> {
    fn geometry(&self) -> GroupGeometry {
        let c = self.config();
        GroupGeometry {
            slots: c.slots,
            tokens_per_block: c.tokens_per_block,
            max_blocks: c.max_blocks,
        }
    }
    fn has_prefix_cache(&self) -> bool {
        self.prefix_stats().is_some()
    }
    fn prefix_holds_blocks(&self) -> bool {
        self.prefix_stats().is_some_and(|s| s.committed > 0)
    }
    fn set_window(&mut self, blocks: u32) -> bool {
        KvPool::set_window(self, blocks)
    }
    fn plain(&self) -> bool {
        KvPool::plain(self)
    }
    fn release_window(&mut self, r: KvRef, keep_from: u32) {
        KvPool::release_window(self, r, keep_from);
    }
    fn capacity(&self, r: KvRef) -> u32 {
        self.seq(r.slot).capacity
    }
    fn last_grow(&self, r: KvRef) -> u32 {
        self.seq(r.slot).last_grow
    }
    fn block_key(&self, r: KvRef, k: u32) -> Option<u64> {
        KvPool::block_key(self, r.slot, k)
    }
    fn reuse_hit(&self, r: KvRef, prep: ContextPrep) -> Option<u32> {
        PrefixReuse::probe_context_reuse(self, r, prep)
    }
    fn resume_blocked(&self, r: KvRef) -> bool {
        PairedPool::resume_blocked(self, r)
    }
    fn check(&self) -> bool {
        KvPool::check(self)
    }
    fn pool_pages(&self) -> Option<PoolPages> {
        let (available, shared) = self.reservable();
        Some(PoolPages { available, shared })
    }
    fn row_pages(&self, slot: u16) -> RowPages {
        let s = self.seq(slot);
        let active = matches!(s.state, SeqState::Active | SeqState::Claimed);
        RowPages {
            held: if active { s.blocks - s.released } else { 0 },
            released: s.released,
            peak: s.peak,
        }
    }
    fn set_peak(&mut self, r: KvRef, peak: u32) {
        KvPool::set_peak(self, r, peak);
    }
}
