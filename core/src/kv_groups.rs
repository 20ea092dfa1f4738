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
//! **Generic over its pools** ([`PoolGroups`] over any [`GroupPool`]): [`KvGroups`] is the groups of
//! [`KvPool`]s the engines use, and the conformance runner groups its scripted pools the same way, so
//! that scenario files test these rules.
//!
//! The first group is the leader and must be full attention: it answers [`KvBackend::cache`] and the
//! limits, its move log is [`KvBackend::take_moves`] (the others' are [`PoolGroups::take_group_moves`]).
//! Every operation acts on all groups of a request together, all or nothing: a growth one group
//! refuses is reverted in the others (a cache the operation resumed is suspended again), a first chunk
//! one group cannot prepare is freed in all. Each window group gives up the blocks no query from the
//! first new position on can read ([`GroupPool::release_window`]): those wholly before `first new
//! position − W + 1`. For a later context chunk that position is the tokens computed, which its
//! preparation names ([`ContextPrep::position`]): the window is released when the chunk is prepared
//! (its capacity may be ahead of it: a chunk the pass rolls back after its resize keeps its growth).
//! For a generation step it is the capacity the step grows from, released before the growth (and
//! again after it, for a cache the growth resumed); that release stands even when the growth is
//! refused (no later query could read those blocks either), and it frees the pages the growth
//! takes. A long prompt's chunks hold about (W + chunk) / page + 1 pages.
//!
//! **GUARANTEED_NO_EVICT reserves in pages, per group** (`kv_groups/reserve.rs`): each group what the
//! request will hold there at most at once — a full group its whole length, a window group about its
//! window and one step — counted against the pool's available pages, so that a reserved request's
//! growth is always paid for; capacities stay the tokens computed ([`KvLimits::reserves`]).
//!
//! **Prefix reuse across groups** (when every pool has a prefix cache, or none does): a hit is the
//! longest prefix for which the full-attention groups hold every block and each window group the
//! blocks of the last `W` tokens before the hit point (vLLM's hybrid manager's rule). A window
//! group's cache evicts its idle blocks in LRU order whatever their children (its rows hold only
//! their window, so a released block is idle at once and the window saves its page); it matches the
//! window's blocks only ([`GroupPool::set_window`] makes a pool's cache a window's). The prefix-aware
//! probes answer with that hit too.

use crate::error::Error;
use crate::kv::{
    Absent, CacheState, ContextPrep, KvBackend, KvLimits, KvRef, PageMove, PrefixCap, PrefixReuse,
    Reach, Reservation,
};
use crate::page_pool::KvPool;
use crate::storage::Borrowed;

pub mod hybrid;
mod pool;
mod reserve;

pub use hybrid::Hybrid;
pub use pool::{GroupGeometry, GroupPool, PoolPages, RowPages};

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
pub struct PoolGroup<P> {
    /// What its layers attend to.
    pub attention: Attention,
    /// Its pages.
    pub pool: P,
}

/// A request's caches in `G` groups of pools `P`, the first full attention ([the module docs](self)).
#[derive(Debug)]
pub struct PoolGroups<P, const G: usize> {
    groups: [PoolGroup<P>; G],
    /// GUARANTEED_NO_EVICT's reservations are kept in pages, from the first
    /// [`KvBackend::resize_reserving`] on ([the module docs](self)).
    reserving: bool,
    /// Per group, the pages the rows' reservations still promise: `Σ max(peak − held, 0)`.
    claims: [u32; G],
}

/// One group of a page pool (a [`KvGroups`]' group).
pub type Group<'a, B = Borrowed<'a>> = PoolGroup<KvPool<'a, B>>;

/// A request's caches in `G` groups of page pools ([the module docs](self)).
pub type KvGroups<'a, B = Borrowed<'a>, const G: usize = 2> = PoolGroups<KvPool<'a, B>, G>;

impl<P: GroupPool, const G: usize> PoolGroups<P, G> {
    /// The groups as one backend. Refused (`Invalid`, nothing kept): no group, a first group that is
    /// not full attention, a window of 0, longer than a request or not a multiple of its pool's page,
    /// pools of different slots, page sizes or request lengths, a prefix cache in some pools and not
    /// in others, a pool with a KV connector or unified adapter paging (not supported with groups).
    pub fn new(mut groups: [PoolGroup<P>; G]) -> Result<Self, Error> {
        let Some(first) = groups.first() else {
            return Err(Error::Invalid("KV groups need at least one group"));
        };
        if first.attention != Attention::Full {
            return Err(Error::Invalid(
                "the first KV group must be full attention (it leads the others)",
            ));
        }
        let (lead, cached) = (first.pool.geometry(), first.pool.has_prefix_cache());
        for g in &groups {
            Self::validate(g, lead, cached)?;
        }
        for g in &mut groups {
            if let (Attention::Sliding { window }, true) = (g.attention, cached) {
                let set = g.pool.set_window(window / lead.tokens_per_block);
                assert!(set, "a validated window pool has an empty prefix cache");
            }
        }
        Ok(Self {
            groups,
            reserving: false,
            claims: [0; G],
        })
    }

    /// One group against the leader's geometry and prefix cache.
    fn validate(g: &PoolGroup<P>, lead: GroupGeometry, cached: bool) -> Result<(), Error> {
        let c = g.pool.geometry();
        if c != lead {
            return Err(Error::Invalid(
                "KV groups' pools must have the same slots, page size and request length",
            ));
        }
        if g.pool.has_prefix_cache() != cached {
            return Err(Error::Invalid(
                "KV groups take a prefix cache in every pool or in none",
            ));
        }
        if !g.pool.plain() {
            return Err(Error::Invalid(
                "KV groups do not take a KV connector or unified adapter paging",
            ));
        }
        if g.pool.prefix_holds_blocks() {
            return Err(Error::Invalid("KV groups take empty prefix caches"));
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
        Ok(())
    }

    /// The groups, read-only (their pools' tables, counters and checks).
    pub fn groups(&self) -> &[PoolGroup<P>; G] {
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

    /// Every group's invariants ([`GroupPool::check`]), and its reservations' claims: their rows', and
    /// covered by its pages ([the module docs](self)).
    pub fn check(&self) -> bool {
        self.groups.iter().all(|g| g.pool.check()) && self.claims_agree()
    }

    fn capacity(&self, r: KvRef) -> u32 {
        self.groups[0].pool.capacity(r)
    }

    /// Side-effect free: the tokens a first chunk reuses across the groups, the longest prefix the
    /// leader matches that every window group holds the last window of (`None` where the leader has
    /// no answer). A window group's hits are not closed downward (its blocks may be cached further
    /// in and not before), so the candidate shrinks until every group agrees.
    fn hit(&self, r: KvRef, prep: ContextPrep) -> Option<u32> {
        self.hits(r, prep).map(|(_, agreed)| agreed)
    }

    /// [`Self::hit`] with the leader's own hit first (`(leader, agreed)`), from one leader probe.
    fn hits(&self, r: KvRef, prep: ContextPrep) -> Option<(u32, u32)> {
        let lead = self.groups[0].pool.reuse_hit(r, prep)?;
        let mut m = lead;
        loop {
            let agreed = self.groups[1..].iter().fold(m, |m, g| {
                let limit = prep.limited(prep.reuse_limit.min(m));
                g.pool.reuse_hit(r, limit).unwrap_or(0).min(m)
            });
            if agreed == m {
                return Some((lead, m));
            }
            m = agreed;
        }
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

    /// Runs `f`, which undoes in some groups what another group refused (or the reservations do not
    /// back), with every pool told that its calls are the set's compensation (`GroupPool::compensating`).
    fn compensate(&mut self, f: impl FnOnce(&mut Self)) {
        for g in &mut self.groups {
            g.pool.compensating(true);
        }
        f(self);
        for g in &mut self.groups {
            g.pool.compensating(false);
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

impl<P: GroupPool, const G: usize> PoolGroups<P, G> {
    /// [`KvBackend::prepare_context`] in every group, all or nothing.
    fn prepare_all(&mut self, r: KvRef, prep: ContextPrep) -> Option<u32> {
        let fresh = !self.groups[0].pool.cache(r).exists();
        if !fresh && self.groups.iter().any(|g| g.pool.resume_blocked(r)) {
            return None;
        }
        let hit = if fresh && prep.first_chunk {
            self.hit(r, prep)
        } else {
            None
        };
        let prep = hit.map_or(prep, |m| prep.limited(prep.reuse_limit.min(m)));
        let mut reused = 0;
        for i in 0..G {
            let Some(n) = self.groups[i].pool.prepare_context(r, prep) else {
                self.compensate(|k| {
                    for g in &mut k.groups[..i] {
                        if fresh {
                            g.pool.free(r);
                        } else {
                            g.pool.suspend(r);
                        }
                    }
                });
                return None;
            };
            // Every group reuses the hit that all of them hold.
            assert!(i == 0 || n == reused, "KV groups reuse one prefix");
            reused = n;
        }
        if !fresh {
            // A later chunk starts at the tokens computed (its capacity may be ahead of them: a chunk
            // rolled back after its resize keeps its growth).
            self.release_windows(r, prep.position);
        }
        Some(reused)
    }

    /// [`KvBackend::resize_context`] in every group, all or nothing (a refused first chunk is left
    /// inactive in every group). The window was released where the chunk was prepared.
    fn grow_context(&mut self, r: KvRef, capacity: u32, first_chunk: bool) -> bool {
        for i in 0..G {
            if !self.groups[i].pool.resize_context(r, capacity, first_chunk) {
                self.compensate(|k| {
                    for g in &mut k.groups[..i] {
                        g.pool.revert_allocate_generation(r);
                    }
                    if first_chunk {
                        k.deactivate(r);
                    }
                });
                return false;
            }
        }
        true
    }

    /// Undoes a context growth every group took (a first chunk's cache is left inactive).
    fn undo_context(&mut self, r: KvRef, first_chunk: bool) {
        for g in &mut self.groups {
            g.pool.revert_allocate_generation(r);
        }
        if first_chunk {
            self.deactivate(r);
        }
    }

    /// Leaves the request's cache inactive in every group (a refused first chunk's, as in the pool
    /// that refused it), its reservation ended.
    fn deactivate(&mut self, r: KvRef) {
        for g in &mut self.groups {
            g.pool.set_peak(r, 0);
            if g.pool.cache(r).is_active() {
                g.pool.suspend(r);
            }
        }
    }

    /// [`KvBackend::try_allocate_generation`] in every group, all or nothing.
    fn grow_generation(&mut self, r: KvRef, grow: u32) -> bool {
        let (before, resumed) = (self.capacity(r), !self.groups[0].pool.cache(r).is_active());
        if resumed && self.groups.iter().any(|g| g.pool.resume_blocked(r)) {
            return false;
        }
        // A step inside a reservation by capacity asks for no token: its capacity is not its
        // position, and nothing is released (the window group holds the reservation).
        let releases = grow > 0;
        if releases {
            self.release_windows(r, before);
        }
        for i in 0..G {
            if !self.groups[i].pool.try_allocate_generation(r, grow) {
                self.compensate(|k| k.undo_growth(r, i, resumed));
                return false;
            }
        }
        if releases {
            self.release_windows(r, before);
            self.narrow_reservation(r, grow);
        }
        true
    }

    /// Undoes an operation that made the cache exist (`fresh`: freed) or active (suspended again).
    fn undo_admission(&mut self, r: KvRef, fresh: bool) {
        for g in &mut self.groups {
            if fresh {
                g.pool.free(r);
            } else if g.pool.cache(r).is_active() {
                g.pool.suspend(r);
            }
        }
    }
}

impl<P: GroupPool, const G: usize> KvBackend for PoolGroups<P, G> {
    type Draft = Absent;
    type Cross = Absent;
    type Transfers = Absent;
    type Prefix = Self;
    type Adapters = Absent;

    fn limits(&self) -> KvLimits {
        let mut l = self.groups[0].pool.limits();
        for g in &self.groups[1..] {
            let o = g.pool.limits();
            l.tier_below_gpu &= o.tier_below_gpu;
            l.can_evict &= o.can_evict;
            l.sliding_windows |= matches!(g.attention, Attention::Sliding { .. });
            l.slots = l.slots.min(o.slots);
            // A window group holds only its window: its pages do not bound a request's length.
            if g.attention == Attention::Full {
                l.max_tokens_per_request = l.max_tokens_per_request.min(o.max_tokens_per_request);
            }
        }
        l.reserves = self.counts();
        l
    }

    fn cache(&self, r: KvRef) -> CacheState {
        self.groups[0].pool.cache(r)
    }

    fn prepare_context(&mut self, r: KvRef, prep: ContextPrep) -> Option<u32> {
        let cache = self.groups[0].pool.cache(r);
        let fresh = !cache.exists();
        if (prep.first_chunk && fresh) || cache.is_active() {
            // A first chunk's hit is paid for by its reservation (`resize_reserving`, next); an
            // active cache takes no page here (its window's release gives pages back).
            return self.counted(r, |k| k.prepare_all(r, prep));
        }
        // A resumed cache's pages must fit now.
        let mut reused = None;
        let prepared = self.guarded(
            r,
            |k| {
                reused = k.prepare_all(r, prep);
                reused.is_some()
            },
            |k| k.undo_admission(r, fresh),
        );
        reused.filter(|_| prepared)
    }

    fn prepare_disagg_gen_init(&mut self, r: KvRef, capacity: u32) -> bool {
        let fresh = !self.groups[0].pool.cache(r).exists();
        let prepare = |k: &mut Self| {
            for i in 0..G {
                if !k.groups[i].pool.prepare_disagg_gen_init(r, capacity) {
                    k.compensate(|k| {
                        for g in &mut k.groups[..i] {
                            g.pool.free(r);
                        }
                    });
                    return false;
                }
            }
            true
        };
        self.guarded(r, prepare, |k| k.undo_admission(r, fresh))
    }

    fn resize_context(&mut self, r: KvRef, capacity: u32, first_chunk: bool) -> bool {
        self.guarded(
            r,
            |k| k.grow_context(r, capacity, first_chunk),
            |k| k.undo_context(r, first_chunk),
        )
    }

    fn resize_reserving(
        &mut self,
        r: KvRef,
        capacity: u32,
        reservation: Reservation,
        first_chunk: bool,
    ) -> Option<u32> {
        if !self.counts() {
            // Pools that do not count pages: the reservation by capacity.
            return crate::kv::reserve_by_capacity(self, r, capacity, reservation, first_chunk);
        }
        self.reserve(r, capacity, reservation, first_chunk)
            .then_some(0)
    }

    fn try_allocate_generation(&mut self, r: KvRef, grow: u32) -> bool {
        // Pages another request's reservation counts on are refused (the release stands).
        let resumed = !self.groups[0].pool.cache(r).is_active();
        self.guarded(
            r,
            |k| k.grow_generation(r, grow),
            |k| k.undo_growth(r, G, resumed),
        )
    }

    fn revert_allocate_generation(&mut self, r: KvRef) {
        // The leader says whether the last growth stands: after a growth one group refused, the
        // others were reverted and the refusing group's own record is an older growth's.
        if self.groups[0].pool.last_grow(r) == 0 {
            return;
        }
        self.counted(r, |k| {
            for g in &mut k.groups {
                g.pool.revert_allocate_generation(r);
            }
        });
    }

    fn rewind(&mut self, r: KvRef, tokens: u32) {
        self.counted(r, |k| {
            for g in &mut k.groups {
                g.pool.rewind(r, tokens);
            }
        });
    }

    fn suspend(&mut self, r: KvRef) {
        self.counted(r, |k| {
            for g in &mut k.groups {
                g.pool.set_peak(r, 0);
                g.pool.suspend(r);
            }
        });
    }

    fn free(&mut self, r: KvRef) {
        self.counted(r, |k| {
            for g in &mut k.groups {
                g.pool.set_peak(r, 0);
                // As `KvSet` frees: only a cache that exists (a request without one is not freed).
                if g.pool.cache(r).exists() {
                    g.pool.free(r);
                }
            }
        });
    }

    fn preempt(&mut self, r: KvRef) {
        self.counted(r, |k| {
            for g in &mut k.groups {
                g.pool.set_peak(r, 0);
                g.pool.preempt(r);
            }
        });
    }

    fn take_moves(&mut self) -> &[PageMove] {
        self.groups[0].pool.take_moves()
    }
}

/// The groups' prefix caches (present while the leader has one: then every pool has one).
impl<P: GroupPool, const G: usize> Reach<PoolGroups<P, G>, PrefixCap> for PoolGroups<P, G> {
    #[inline]
    fn reach(k: &Self) -> Option<&Self> {
        k.groups[0].pool.has_prefix_cache().then_some(k)
    }
    #[inline]
    fn reach_mut(k: &mut Self) -> Option<&mut Self> {
        if k.groups[0].pool.has_prefix_cache() {
            Some(k)
        } else {
            None
        }
    }
}

/// Prefix reuse by the window rule ([the module docs](self)): hashes, roots and commits go to every
/// group; the probes answer with the hit every group holds.
impl<P: GroupPool, const G: usize> PrefixReuse for PoolGroups<P, G> {
    fn set_prefix(&mut self, r: KvRef, root: u64, hashes: &[u64]) {
        for g in &mut self.groups {
            g.pool.set_prefix(r, root, hashes);
        }
    }

    fn commit(&mut self, r: KvRef, computed: u32) {
        for g in &mut self.groups {
            g.pool.commit(r, computed);
        }
    }

    fn all_blocks_reusable(&self) -> bool {
        self.groups[0].pool.all_blocks_reusable()
    }

    fn drop_idle_blocks(&mut self) -> u32 {
        self.groups
            .iter_mut()
            .map(|g| g.pool.drop_idle_blocks())
            .sum()
    }

    fn probe_first_new_block(&self, r: KvRef, prep: ContextPrep) -> Option<u64> {
        let lead = &self.groups[0].pool;
        if !prep.first_chunk || G == 1 {
            return lead.probe_first_new_block(r, prep);
        }
        // Where the window groups cut the leader's hit short, the first new block is the hit's end.
        match self.hits(r, prep) {
            Some((leader, m)) if m != leader => {
                lead.block_key(r, m / lead.geometry().tokens_per_block)
            }
            _ => lead.probe_first_new_block(r, prep),
        }
    }

    fn probe_context_reuse(&self, r: KvRef, prep: ContextPrep) -> Option<u32> {
        self.groups[0].pool.probe_context_reuse(r, prep)?;
        self.hit(r, prep)
    }

    /// The leader's (the full-attention group's blocks: what a router matches a prompt against).
    fn take_kv_events(&mut self) -> &[crate::kv_events::KvEvent] {
        self.groups[0].pool.take_kv_events()
    }
}
