//! KV-cache groups: a hybrid-attention model's caches as one backend. Models such as Gemma 2 and 3,
//! GPT-OSS or Mistral's interleaved ones mix full-attention layers with sliding-window layers (a
//! query at position `p` reads only the keys of `[p − W + 1, p]`); each kind of layer is a group with a
//! page table of its own per request, and a sliding-window group gives up the pages that fall wholly
//! out of its window, so a long request holds about `W / tokens_per_block + 1` pages there instead of
//! one per block of its whole context.
//!
//! **One pool per group**, as the reference's variable-window KV cache manager keeps one pool per
//! window size (not vLLM's one block pool for all groups): a group's page holds the KV of that
//! group's layers only, so a full-attention group of 3 layers and a window group of 15 (Gemma 3 270M)
//! have pages of different byte sizes, sized apart; a single budget of equal pages would have to pad
//! the smaller. Each group's budget is its own pool's pages.
//!
//! The first group is the leader and must be full attention: it answers [`KvBackend::cache`] and the
//! limits, its move log is [`KvBackend::take_moves`] (the others' are [`KvGroups::take_group_moves`]).
//! Every operation acts on all groups of a request together, all or nothing: a growth one group
//! refuses is reverted in the others (a cache the operation resumed is suspended again), a first chunk
//! one group cannot prepare is freed in all. Before a growth (and again after it, for a cache the
//! growth resumed), each window group gives up the blocks no query from the first new position on can
//! read ([`KvPool::release_window`]): those wholly before `first new position − W + 1`. That release
//! stands even when the growth is refused (no later query could read those blocks either), and it
//! frees the pages the growth takes: a long prompt's chunks hold about (W + chunk) / page + 1.
//!
//! No prefix cache yet: a window group's released blocks, kept in a prefix cache, would stay there
//! (the cache evicts leaf first, and a released block is the parent of the request's later blocks),
//! so the window would save nothing; and a hit would need the window group to hold the blocks of the
//! last window before the hit point, which a leaf-first cache does not keep. Until a window-aware
//! cache exists, [`KvGroups::new`] refuses pools with one, rather than serve hybrid models with
//! prefix reuse that silently never hits.

use crate::error::Error;
use crate::kv::{
    Absent, CacheState, ContextPrep, KvBackend, KvLimits, KvRef, PageMove, PairedPool,
};
use crate::page_pool::KvPool;
use crate::storage::{Borrowed, Buffers};

/// What a group's layers attend to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Attention {
    /// Every earlier position.
    Full,
    /// The last `window` positions, the query's own included (a multiple of the pool's
    /// `tokens_per_block`).
    Sliding {
        /// Positions a query reads.
        window: u32,
    },
}

/// One group: what its layers attend to and the pool of their KV.
#[derive(Debug)]
pub struct Group<'a, B: Buffers = Borrowed<'a>> {
    /// What its layers attend to.
    pub attention: Attention,
    /// Its pages.
    pub pool: KvPool<'a, B>,
}

/// A request's caches in `G` groups, the first full attention ([the module docs](self)).
#[derive(Debug)]
pub struct KvGroups<'a, B: Buffers = Borrowed<'a>, const G: usize = 2> {
    groups: [Group<'a, B>; G],
}

impl<'a, B: Buffers, const G: usize> KvGroups<'a, B, G> {
    /// The groups as one backend. Refused (`Invalid`, nothing kept): no group, a first group that is
    /// not full attention, a window of 0, longer than a request or not a multiple of its pool's page,
    /// pools of different slots, page sizes or request lengths, a pool with a prefix cache (not yet
    /// supported with groups: the module docs say why).
    pub fn new(groups: [Group<'a, B>; G]) -> Result<Self, Error> {
        let Some(first) = groups.first() else {
            return Err(Error::Invalid("KV groups need at least one group"));
        };
        if first.attention != Attention::Full {
            return Err(Error::Invalid(
                "the first KV group must be full attention (it leads the others)",
            ));
        }
        let lead = first.pool.config();
        for g in &groups {
            let c = g.pool.config();
            if c.slots != lead.slots
                || c.tokens_per_block != lead.tokens_per_block
                || c.max_blocks != lead.max_blocks
            {
                return Err(Error::Invalid(
                    "KV groups' pools must have the same slots, page size and request length",
                ));
            }
            if g.pool.prefix_stats().is_some() {
                return Err(Error::Invalid(
                    "KV groups do not take a prefix cache yet (a window's released blocks would stay cached)",
                ));
            }
            if let Attention::Sliding { window } = g.attention {
                if window == 0
                    || u64::from(window) > u64::from(c.max_blocks) * u64::from(c.tokens_per_block)
                {
                    return Err(Error::Invalid(
                        "a sliding window must hold at least one position and at most a request",
                    ));
                }
                if window % c.tokens_per_block != 0 {
                    return Err(Error::Invalid(
                        "a sliding window must be a whole number of pages",
                    ));
                }
            }
        }
        Ok(Self { groups })
    }

    /// The groups, read-only (their pools' tables, counters and checks).
    pub fn groups(&self) -> &[Group<'a, B>; G] {
        &self.groups
    }

    /// The page moves group `g` logged since the last call, in order (group 0's are
    /// [`KvBackend::take_moves`]); empty for a group that does not exist.
    pub fn take_group_moves(&mut self, g: usize) -> &[PageMove] {
        match self.groups.get_mut(g) {
            Some(group) => group.pool.take_moves(),
            None => &[],
        }
    }

    /// Every group's invariants ([`KvPool::check`]).
    pub fn check(&self) -> bool {
        self.groups.iter().all(|g| g.pool.check())
    }

    fn capacity(&self, r: KvRef) -> u32 {
        self.groups[0].pool.seq(r.slot).capacity
    }

    /// After a growth from `before` tokens: each window group gives up what no new query reads.
    fn release_windows(&mut self, r: KvRef, before: u32) {
        for g in &mut self.groups {
            if let Attention::Sliding { window } = g.attention {
                g.pool
                    .release_window(r, (before + 1).saturating_sub(window));
            }
        }
    }

    /// Undoes the growth of groups `..upto` (the one that refused it undid its own), suspending again
    /// every cache the growth `resumed`.
    fn undo_growth(&mut self, r: KvRef, upto: usize, resumed: bool) {
        for g in &mut self.groups[..upto] {
            g.pool.revert_allocate_generation(r);
        }
        if resumed {
            for g in &mut self.groups {
                if g.pool.cache(r).is_active() {
                    g.pool.suspend(r);
                }
            }
        }
    }
}

impl<B: Buffers, const G: usize> KvBackend for KvGroups<'_, B, G> {
    type Draft = Absent;
    type Cross = Absent;
    type Transfers = Absent;
    type Prefix = Absent;
    type Adapters = Absent;

    fn limits(&self) -> KvLimits {
        let mut l = self.groups[0].pool.limits();
        for g in &self.groups[1..] {
            let o = g.pool.limits();
            l.tier_below_gpu &= o.tier_below_gpu;
            l.can_evict &= o.can_evict;
            l.slots = l.slots.min(o.slots);
            // A window group holds only its window: its pages do not bound a request's length.
            if g.attention == Attention::Full {
                l.max_tokens_per_request = l.max_tokens_per_request.min(o.max_tokens_per_request);
            }
        }
        l
    }

    fn cache(&self, r: KvRef) -> CacheState {
        self.groups[0].pool.cache(r)
    }

    fn prepare_context(&mut self, r: KvRef, prep: ContextPrep) -> Option<u32> {
        let fresh = !self.groups[0].pool.cache(r).exists();
        if !fresh && self.groups.iter().any(|g| g.pool.resume_blocked(r)) {
            return None;
        }
        for i in 0..G {
            if self.groups[i].pool.prepare_context(r, prep).is_none() {
                for g in &mut self.groups[..i] {
                    if fresh {
                        g.pool.free(r);
                    } else {
                        g.pool.suspend(r);
                    }
                }
                return None;
            }
        }
        // Without a prefix cache nothing is reused.
        Some(0)
    }

    fn prepare_disagg_gen_init(&mut self, r: KvRef, capacity: u32) -> bool {
        for i in 0..G {
            if !self.groups[i].pool.prepare_disagg_gen_init(r, capacity) {
                for g in &mut self.groups[..i] {
                    g.pool.free(r);
                }
                return false;
            }
        }
        true
    }

    fn resize_context(&mut self, r: KvRef, capacity: u32, first_chunk: bool) -> bool {
        let before = self.capacity(r);
        self.release_windows(r, before);
        for i in 0..G {
            if !self.groups[i].pool.resize_context(r, capacity, first_chunk) {
                for g in &mut self.groups[..i] {
                    g.pool.revert_allocate_generation(r);
                }
                if first_chunk {
                    // A refused first chunk is inactive in every group, as in the one that refused it.
                    for g in &mut self.groups {
                        g.pool.suspend(r);
                    }
                }
                return false;
            }
        }
        self.release_windows(r, before);
        true
    }

    fn try_allocate_generation(&mut self, r: KvRef, grow: u32) -> bool {
        let (before, resumed) = (self.capacity(r), !self.groups[0].pool.cache(r).is_active());
        if resumed && self.groups.iter().any(|g| g.pool.resume_blocked(r)) {
            return false;
        }
        self.release_windows(r, before);
        for i in 0..G {
            if !self.groups[i].pool.try_allocate_generation(r, grow) {
                self.undo_growth(r, i, resumed);
                return false;
            }
        }
        self.release_windows(r, before);
        true
    }

    fn revert_allocate_generation(&mut self, r: KvRef) {
        // The leader says whether the last growth stands: after a growth one group refused, the
        // others were reverted and the refusing group's own record is an older growth's.
        if self.groups[0].pool.seq(r.slot).last_grow == 0 {
            return;
        }
        for g in &mut self.groups {
            g.pool.revert_allocate_generation(r);
        }
    }

    fn rewind(&mut self, r: KvRef, tokens: u32) {
        for g in &mut self.groups {
            g.pool.rewind(r, tokens);
        }
    }

    fn suspend(&mut self, r: KvRef) {
        for g in &mut self.groups {
            g.pool.suspend(r);
        }
    }

    fn free(&mut self, r: KvRef) {
        for g in &mut self.groups {
            g.pool.free(r);
        }
    }

    fn preempt(&mut self, r: KvRef) {
        for g in &mut self.groups {
            g.pool.preempt(r);
        }
    }

    fn take_moves(&mut self) -> &[PageMove] {
        self.groups[0].pool.take_moves()
    }
}
