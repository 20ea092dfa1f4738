//! A hybrid recurrent model's caches as one backend: attention groups ([`PoolGroups`]) and a
//! recurrent-state group ([`StatePool`]), which holds one fixed-size state per request whatever its
//! length (the third kind of group, beside full attention and sliding window).
//!
//! **All or nothing, with the attention groups.** A request takes its live state where its cache is
//! created ([`KvBackend::prepare_context`] of a first chunk, [`KvBackend::prepare_disagg_gen_init`]):
//! when no slot can be had the preparation is refused and nothing is prepared, as a pool refuses a
//! request slot, and the pass waits. Wherever the attention caches are resumed the state is resumed
//! (a host copy needs a GPU slot: without one the resumption is refused, and the pass evicts by the
//! reference's rules as for pages); a suspension moves the state to the host tier
//! ([`StateOp::Move`](crate::state_pool::StateOp), or holds it on the GPU when the host tier is full);
//! a recompute pause and `free` drop it. So a request's state goes where its pages go, and its type
//! state (active, suspended, resumed) owns it as it owns them.
//!
//! **Prefix reuse needs a snapshot** ([`crate::state_pool`]): a hit is the deepest snapshot point at
//! or before the attention groups' hit whose block key has a ready snapshot; the attention groups
//! reuse exactly that much (a hit with no snapshot is no hit: the recurrent layers would have to
//! scan the prefix anyway), and the snapshot is copied into the new request's slot. A context chunk
//! captures at most two snapshots: its deepest snapshot point (where a follow-up turn resumes), and,
//! on a first chunk whose prompt matched more of the attention cache than it could reuse, the
//! deepest point of that match (a prefix others share: the next request with it resumes there).
//! They are pending until the chunk is committed; only then can a hit read them.

use super::{GroupPool, PoolGroups};
use crate::error::Error;
use crate::kv::{
    Absent, CacheState, ContextPrep, KvBackend, KvLimits, KvRef, PageMove, Reservation,
};
use crate::narrow::u16_of;
use crate::state_pool::{Capture, Placement, StateConfig, StateMove, StatePool};
use crate::storage::{Inline, Storage};

mod prefix;

/// A chunk's snapshot plan: where it starts and where the prompt's shared match ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct Chunk {
    start: u32,
    prompt: u32,
    /// The attention groups' own hit on the first chunk (0 after it).
    matched: u32,
}

/// Attention groups `G` of pools `P` and the recurrent state of up to `C` requests ([the module
/// docs](self)).
///
/// Its state pool and per-request arrays live in `S` ([`crate::storage`]): inside the value
/// ([`Inline`]) or each on the heap (`Boxed`, feature `alloc`: a backend of 1,024 requests is then a
/// few hundred bytes, built without passing its arrays through the stack).
pub struct Hybrid<P, const G: usize, const C: usize, S: Storage = Inline> {
    attention: PoolGroups<P, G>,
    state: StatePool<C, S>,
    chunks: S::Array<Chunk, C>,
    tokens_per_block: u32,
}

impl<P: core::fmt::Debug, const G: usize, const C: usize, S: Storage> core::fmt::Debug
    for Hybrid<P, G, C, S>
{
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Hybrid")
            .field("attention", &self.attention)
            .field("state", &self.state)
            .finish_non_exhaustive()
    }
}

impl<P: GroupPool, const G: usize, const C: usize, S: Storage> Hybrid<P, G, C, S> {
    /// The attention groups beside a state pool. `Invalid` (nothing built): a state configuration
    /// [`StateConfig::validate`] refuses against the leader's blocks, or pools with more request
    /// slots than `C` or than the state slots of both tiers could ever hold.
    pub fn new(attention: PoolGroups<P, G>, cfg: StateConfig) -> Result<Self, Error> {
        let geo = attention.groups()[0].pool.geometry();
        let state = StatePool::new(cfg, geo.tokens_per_block)?;
        if geo.slots as usize > C {
            return Err(Error::Invalid(
                "more request slots than the state pool's rows: raise its capacity parameter",
            ));
        }
        if u64::from(geo.slots) > u64::from(cfg.gpu_slots) + u64::from(cfg.host_slots) {
            return Err(Error::Invalid(
                "more live requests than state slots can ever hold: give the GPU and host tiers \
                 at least a slot per request slot",
            ));
        }
        Ok(Self {
            attention,
            state,
            chunks: S::array(Chunk::default)?,
            tokens_per_block: geo.tokens_per_block,
        })
    }

    /// The attention groups, read-only.
    pub fn attention(&self) -> &PoolGroups<P, G> {
        &self.attention
    }

    /// The state pool, read-only.
    pub fn state(&self) -> &StatePool<C, S> {
        &self.state
    }

    /// The page moves attention group `g` logged since the last call ([`PoolGroups::take_group_moves`]).
    pub fn take_group_moves(&mut self, g: usize) -> &[PageMove] {
        self.attention.take_group_moves(g)
    }

    /// The state moves logged since the last call, in order: the engine runs them before the step
    /// (after the page moves).
    pub fn take_state_moves(&mut self) -> &[StateMove] {
        self.state.take_moves()
    }

    /// The snapshots to write during the step ([`Capture`]).
    pub fn take_captures(&mut self) -> &[Capture] {
        self.state.take_captures()
    }

    /// The attention groups' invariants, the state pool's, and their agreement: a request has a
    /// live state exactly while its cache is active, a suspended one while it is inactive.
    pub fn check(&self) -> bool {
        self.attention.check()
            && self.state.check()
            && (0..C).all(|slot| {
                let r = KvRef {
                    slot: u16_of(slot),
                    id: crate::ids::RequestId(0),
                };
                let cache = self.attention.cache(r);
                match self.state.placement(u16_of(slot)) {
                    Placement::None => !cache.exists() || self.restorable(r),
                    Placement::Gpu(_) => cache.is_active(),
                    Placement::Host(_) | Placement::Held(_) => cache == CacheState::Inactive,
                }
            })
    }

    fn row(r: KvRef) -> u16 {
        r.slot
    }

    /// A first chunk of a request without a cache: its hit (capped at a snapshot), its cache and its
    /// state, all or nothing.
    fn prepare_fresh(&mut self, r: KvRef, prep: ContextPrep) -> Option<u32> {
        let row = Self::row(r);
        if self.state.placement(row) != Placement::None {
            return None;
        }
        let (matched, mut hit, mut from) = self.state_hit(r, prep);
        if !self.state.can_take(from) {
            (hit, from) = (0, None);
            if !self.state.can_take(None) {
                return None;
            }
        }
        self.state.drop_pending(row);
        let mut n = self
            .attention
            .prepare_context(r, prep.limited(prep.reuse_limit.min(hit)))?;
        if n != hit {
            // The groups reused less than they offered: only a state at exactly `n` would do.
            from = self.snapshot_at(r, n);
            if from.is_none() && n > 0 {
                self.attention.free(r);
                n = self.attention.prepare_context(r, prep.limited(0))?;
            }
        }
        let taken = self.state.take(row, r.id, from);
        assert!(taken, "a state slot checked obtainable");
        self.chunks[row as usize] = Chunk {
            start: n,
            prompt: prep.prompt,
            matched,
        };
        Some(n)
    }

    /// A later chunk, or a suspended cache's resumption: the state resumes with the caches (a
    /// cache with nothing written takes a fresh one).
    fn prepare_existing(&mut self, r: KvRef, prep: ContextPrep) -> Option<u32> {
        let row = Self::row(r);
        let fresh = self.state.placement(row) == Placement::None;
        // A state given up with a refused first chunk comes back as it was: zero, or its snapshot.
        let start = self.chunks[row as usize].start;
        let from = if fresh && start > 0 {
            Some(self.snapshot_at(r, start)?)
        } else {
            None
        };
        if fresh && !self.restorable(r) {
            return None;
        }
        let placeable = if fresh {
            self.state.can_take(from)
        } else {
            self.state.can_place(row)
        };
        if !placeable {
            return None;
        }
        self.state.drop_pending(row);
        let n = self.attention.prepare_context(r, prep)?;
        let placed = if fresh {
            self.state.take(row, r.id, from)
        } else {
            self.state.resume(row, r.id)
        };
        assert!(placed, "a state checked placeable");
        self.chunks[row as usize] = Chunk {
            start: prep.position,
            prompt: prep.prompt,
            matched: 0,
        };
        Some(n)
    }

    /// After a context growth to `capacity` ([`KvBackend::resize_context`]): the chunk's snapshots
    /// are set aside ([the module docs](self)).
    fn plan_captures(&mut self, r: KvRef, capacity: u32) {
        let row = Self::row(r);
        let c = self.chunks[row as usize];
        let interval = self.state.config().snapshot_interval;
        let end = capacity.min(c.prompt);
        let deepest = end / interval * interval;
        let shared = c.matched.min(end) / interval * interval;
        for p in [deepest, shared] {
            if p > c.start {
                if let Some(key) = self.key_at(r, p) {
                    let _ = self.state.capture(row, r.id, key, p);
                }
            }
        }
    }

    /// The key of the block ending at `position` (a whole number of blocks, more than 0).
    fn key_at(&self, r: KvRef, position: u32) -> Option<u64> {
        let k = (position / self.tokens_per_block).checked_sub(1)?;
        self.attention.groups()[0].pool.block_key(r, k)
    }

    /// The ready snapshot at exactly `position` of the request's prompt.
    fn snapshot_at(&self, r: KvRef, position: u32) -> Option<u32> {
        if position == 0 || position % self.state.config().snapshot_interval != 0 {
            return None;
        }
        self.state.find(self.key_at(r, position)?)
    }

    /// After a resumption by the caches that succeeded: the state's too (checked placeable).
    fn resumed(&mut self, r: KvRef) {
        let ok = self.state.resume(Self::row(r), r.id);
        assert!(ok, "a state checked placeable");
    }
}

impl<P: GroupPool, const G: usize, const C: usize, S: Storage> KvBackend for Hybrid<P, G, C, S> {
    type Draft = Absent;
    type Cross = Absent;
    type Transfers = Absent;
    type Prefix = Self;
    type Adapters = Absent;

    fn limits(&self) -> KvLimits {
        self.attention.limits()
    }

    fn cache(&self, r: KvRef) -> CacheState {
        self.attention.cache(r)
    }

    fn prepare_context(&mut self, r: KvRef, prep: ContextPrep) -> Option<u32> {
        let cache = self.attention.cache(r);
        if !cache.exists() {
            if !prep.first_chunk {
                return None;
            }
            return self.prepare_fresh(r, prep);
        }
        self.prepare_existing(r, prep)
    }

    fn prepare_disagg_gen_init(&mut self, r: KvRef, capacity: u32) -> bool {
        let row = Self::row(r);
        let fresh = !self.attention.cache(r).exists();
        let placeable = if fresh {
            self.state.placement(row) == Placement::None && self.state.can_take(None)
        } else {
            self.state.can_place(row)
        };
        if !placeable || !self.attention.prepare_disagg_gen_init(r, capacity) {
            return false;
        }
        if fresh {
            let taken = self.state.take(row, r.id, None);
            assert!(taken, "a state slot checked obtainable");
        } else {
            self.resumed(r);
        }
        true
    }

    fn resize_context(&mut self, r: KvRef, capacity: u32, first_chunk: bool) -> bool {
        let ok = self.attention.resize_context(r, capacity, first_chunk);
        self.after_resize(r, capacity, ok);
        ok
    }

    fn resize_reserving(
        &mut self,
        r: KvRef,
        capacity: u32,
        reservation: Reservation,
        first_chunk: bool,
    ) -> Option<u32> {
        let granted = self
            .attention
            .resize_reserving(r, capacity, reservation, first_chunk);
        self.after_resize(r, capacity, granted.is_some());
        granted
    }

    #[inline]
    fn try_allocate_generation(&mut self, r: KvRef, grow: u32) -> bool {
        if !self.state.can_place(Self::row(r)) {
            return false;
        }
        if !self.attention.try_allocate_generation(r, grow) {
            return false;
        }
        self.resumed(r);
        true
    }

    fn revert_allocate_generation(&mut self, r: KvRef) {
        self.attention.revert_allocate_generation(r);
    }

    fn rewind(&mut self, r: KvRef, tokens: u32) {
        self.attention.rewind(r, tokens);
    }

    fn suspend(&mut self, r: KvRef) {
        self.attention.suspend(r);
        self.state.suspend(Self::row(r), r.id);
    }

    /// The state goes with the caches; the copies into it this pass logged last are withdrawn (a
    /// first chunk the pass rolls back after its restore).
    fn free(&mut self, r: KvRef) {
        self.attention.free(r);
        self.state.withdraw(Self::row(r), r.id);
    }

    fn preempt(&mut self, r: KvRef) {
        self.attention.preempt(r);
        self.state.withdraw(Self::row(r), r.id);
    }

    fn take_moves(&mut self) -> &[PageMove] {
        self.attention.take_moves()
    }
}

impl<P: GroupPool, const G: usize, const C: usize, S: Storage> Hybrid<P, G, C, S> {
    /// A context growth granted (its snapshots planned) or refused (a first chunk's caches are left
    /// inactive by the groups: its state is suspended with them).
    fn after_resize(&mut self, r: KvRef, capacity: u32, granted: bool) {
        if granted {
            self.plan_captures(r, capacity);
        } else if !self.attention.cache(r).is_active() {
            // A first chunk refused: its state holds nothing it did not reuse (zero, or its
            // snapshot's copy, whose restore is withdrawn): given up, not copied to the host (the
            // pass frees such a chunk; a resumption takes it back as it was).
            self.state.withdraw(Self::row(r), r.id);
        }
    }

    /// The request's cache is inactive and holds nothing past what its first chunk started from
    /// (zero, or a reused prefix): a first chunk refused its pages, whose state is taken back as
    /// it was on resumption.
    fn restorable(&self, r: KvRef) -> bool {
        self.attention.cache(r) == CacheState::Inactive
            && self.attention.groups()[0].pool.capacity(r) == self.chunks[r.slot as usize].start
    }
}
