//! A request's caches as one backend: the target pool, an optional draft pool (speculative decoding) and
//! an optional cross pool (encoder-decoder), each itself a [`KvBackend`] (target and draft also a
//! [`PairedPool`]).
//!
//! The scheduler holds one `K: KvBackend`; with `K = KvSet<…>` every call it makes acts on all of a
//! request's caches together, so suspending, preempting or freeing the target without its draft cannot
//! be written: [`KvSet`] lends its pools out read-only ([`KvSet::target`], [`KvSet::draft_pool`],
//! [`KvSet::cross_pool`]) and the scheduler lends the set out read-only too. Its capabilities are the
//! set itself, so none of them lends a pool out either.
//!
//! Capabilities follow the members: [`DraftPairing`] while there is a draft pool, [`CrossPool`] while
//! there is a cross pool; [`Transfers`] and [`AdapterPaging`] are the target's (a connector loads into
//! the target's pages, adapters share the target model's pages); [`PrefixReuse`] while the target or
//! the draft pool has a prefix cache (hashes and commits reach both, the pass's probes are the
//! target's).
//!
//! [`DraftPairing`]: crate::kv::DraftPairing
//! [`CrossPool`]: crate::kv::CrossPool
//! [`Transfers`]: crate::kv::Transfers
//! [`AdapterPaging`]: crate::kv::AdapterPaging
//!
//! The pairing rules are the reference's (spec §1.5 step 3, §1.7):
//!
//! - **Joint draft pool** (allocated with the target): a generation step grows both (a refused draft
//!   growth reverts the target's); a context chunk resizes the target (refused → both suspended, but a
//!   continuation keeps both active, difference 12), then the draft
//!   (`try_allocate_draft_context`: refused → the target's growth is reverted, or the draft freed when the
//!   target had to drop its cache, and both are suspended — a continuation keeps both active, difference 12
//!   of docs/conformance-format.md); a first chunk's reuse depth is one both pools claim (the smaller of
//!   their probes, no limit unless both answer; claims that disagree are retried at the target's depth,
//!   then at 0; a refused claim frees the request in both pools).
//! - **Unpaired draft pool** (a mirror the executor fills): the mirror is admitted after the target
//!   (`admit_mirror`: created if missing and resumed); refused → a generation step's target growth is
//!   reverted, a context preparation fails. Its preview makes the §1.11 blocked fast path possible.
//! - **Cross pool**: created (first chunk only) or resumed and resized to the encoder output by the pass
//!   after the target's allocation (§1.7 step 6); suspended separately, freed with the rest.
//!
//! Suspension acts on target and draft, freeing on all three pools, preemption frees the draft beside the
//! target's preemption (spec §1.8). The target decides [`KvBackend::cache`] for the pass, except that a
//! draft or cross cache left alone beside a target without one is [`CacheState::Inactive`], so a
//! rolled-back first chunk frees every pool.

use crate::kv::{
    AdaptersCap, CacheState, ContextPrep, CrossCap, DraftCap, KvBackend, KvCaps, KvLimits, KvRef,
    PageMove, PairedPool, PrefixCap, PrefixReuse, Reach, Reservation, TransfersCap,
};

mod caps;

/// How a draft pool pairs with the target.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DraftMode {
    /// Allocated with the target, step for step.
    Joint,
    /// A mirror admitted after the target; the executor fills it.
    Unpaired,
}

/// The target pool with an optional draft pool and an optional cross pool.
#[derive(Debug)]
pub struct KvSet<T, D = T, X = T> {
    target: T,
    draft: Option<(DraftMode, D)>,
    cross: Option<X>,
}

impl<P: PairedPool> KvSet<P, P, P> {
    /// The target pool alone.
    pub fn new(target: P) -> Self {
        Self {
            target,
            draft: None,
            cross: None,
        }
    }
}

/// A refused joint claim frees the request in both pools, whatever either holds (upstream's
/// `_free_kv_caches`); the claim is refused.
fn free_pair<T: KvBackend, D: KvBackend>(target: &mut T, draft: &mut D, r: KvRef) -> Option<u32> {
    target.free(r);
    draft.free(r);
    None
}

/// The tokens a first chunk could reuse in `pool` (its probe; a pool without a prefix cache reuses
/// nothing).
fn reuse_probe<P: KvBackend>(pool: &mut P, r: KvRef, prep: ContextPrep) -> Option<u32> {
    match pool.prefix() {
        Some(p) => p.probe_context_reuse(r, prep),
        None => Some(0),
    }
}

impl<T: PairedPool, D: PairedPool, X: KvBackend> KvSet<T, D, X> {
    /// The target, a draft pool paired by `mode`, and a cross pool (each optional but the target).
    pub fn with_pools(target: T, draft: Option<(DraftMode, D)>, cross: Option<X>) -> Self {
        Self {
            target,
            draft,
            cross,
        }
    }

    /// The target pool.
    pub fn target(&self) -> &T {
        &self.target
    }

    /// The draft pool and how it pairs.
    pub fn draft_pool(&self) -> Option<(DraftMode, &D)> {
        self.draft.as_ref().map(|(m, d)| (*m, d))
    }

    /// The cross pool.
    pub fn cross_pool(&self) -> Option<&X> {
        self.cross.as_ref()
    }

    fn joint(&mut self) -> Option<&mut D> {
        match &mut self.draft {
            Some((DraftMode::Joint, d)) => Some(d),
            _ => None,
        }
    }

    /// A joint first chunk's claims (spec §1.7 `_prepare_context_pair`): both pools claim one depth.
    /// Out of line: the other pairings' preparation stays as small as it was.
    #[inline(never)]
    fn claim_jointly(&mut self, r: KvRef, prep: ContextPrep) -> Option<u32> {
        let Some((_, draft)) = &mut self.draft else {
            return None;
        };
        let probes = (
            reuse_probe(draft, r, prep),
            reuse_probe(&mut self.target, r, prep),
        );
        // Only two answers pair a depth; with one missing the claims go unlimited and the claims'
        // reconciliation below settles the depth (spec §1.7 `_reuse_claim_limit`).
        let limit = match probes {
            (Some(d), Some(t)) => d.min(t),
            _ => ContextPrep::NO_LIMIT,
        }
        .min(prep.reuse_limit);
        let Some(d) = draft.prepare_context(r, prep.limited(limit)) else {
            return free_pair(&mut self.target, draft, r);
        };
        let Some(t) = self.target.prepare_context(r, prep.limited(d)) else {
            return free_pair(&mut self.target, draft, r);
        };
        if t == d {
            return Some(t);
        }
        // The shorter re-claim can fall short too (or be refused): then both pools drop to no reuse.
        draft.free(r);
        if draft.prepare_context(r, prep.limited(t)) == Some(t) {
            return Some(t);
        }
        free_pair(&mut self.target, draft, r);
        let t0 = self.target.prepare_context(r, prep.limited(0));
        let d0 = draft.prepare_context(r, prep.limited(0));
        match (t0, d0) {
            (Some(0), Some(0)) => Some(0),
            // Claims at depth 0 reuse nothing; a pool that still claims is broken: refuse the chunk.
            (Some(_), Some(_)) => None,
            _ => free_pair(&mut self.target, draft, r),
        }
    }

    /// After a refused target resize a joint pair is suspended together, as upstream does (spec §1.7
    /// `_full` step 4); an active continuation keeps both active (difference 12).
    #[cold]
    #[inline(never)]
    fn target_resize_refused(&mut self, r: KvRef, first_chunk: bool) {
        let suspended = first_chunk || !self.target.cache(r).is_active();
        if let Some((DraftMode::Joint, d)) = &mut self.draft {
            if suspended {
                self.target.suspend(r);
                d.suspend(r);
            }
        }
    }

    /// A joint continuation chunk: the target prepares, then the draft pool (not asked once the target
    /// refused, as upstream's `and`); a refusal suspends both unless the request was active (upstream
    /// suspends both; an active continuation keeps its caches, difference 12).
    fn prepare_continuation(&mut self, r: KvRef, prep: ContextPrep) -> Option<u32> {
        let Some((_, d)) = &mut self.draft else {
            return self.target.prepare_context(r, prep);
        };
        let was_active = self.target.cache(r).is_active();
        let prepared =
            self.target.prepare_context(r, prep).is_some() && d.prepare_context(r, prep).is_some();
        if !prepared {
            if !was_active {
                self.target.suspend(r);
                d.suspend(r);
            }
            return None;
        }
        Some(0)
    }
}

impl<T: PairedPool, D: PairedPool, X: KvBackend> KvBackend for KvSet<T, D, X> {
    type Draft = Self;
    type Cross = Self;
    type Transfers = Self;
    type Prefix = Self;
    type Adapters = Self;

    /// Suspension moves a request's caches down only where every pool it suspends has a lower tier: a
    /// draft pool without one keeps its pages held, so preemption must stay possible. A set with a
    /// draft pool reserves by capacity (the default [`KvBackend::resize_reserving`]); one without
    /// reserves as its target does.
    fn limits(&self) -> KvLimits {
        let t = self.target.limits();
        let cross = self.cross.as_ref().map_or(u32::MAX, |x| x.limits().slots);
        match &self.draft {
            None => KvLimits {
                slots: t.slots.min(cross),
                ..t
            },
            Some((_, d)) => {
                let d = d.limits();
                KvLimits {
                    tier_below_gpu: t.tier_below_gpu && d.tier_below_gpu,
                    can_evict: t.can_evict && d.can_evict,
                    max_tokens_per_request: t.max_tokens_per_request.min(d.max_tokens_per_request),
                    slots: t.slots.min(d.slots).min(cross),
                    sliding_windows: t.sliding_windows || d.sliding_windows,
                    reserves: false,
                }
            }
        }
    }

    /// The target's state decides; a draft or cross cache left alone beside a target without one is
    /// [`CacheState::Inactive`], so a rolled-back first chunk frees every pool.
    #[inline]
    fn cache(&self, r: KvRef) -> CacheState {
        match self.target.cache(r) {
            CacheState::NoCache => {
                let left = self
                    .draft
                    .as_ref()
                    .is_some_and(|(_, d)| d.cache(r).exists())
                    || self.cross.as_ref().is_some_and(|x| x.cache(r).exists());
                if left {
                    CacheState::Inactive
                } else {
                    CacheState::NoCache
                }
            }
            state => state,
        }
    }

    fn prepare_context(&mut self, r: KvRef, prep: ContextPrep) -> Option<u32> {
        match self.draft {
            Some((DraftMode::Joint, _)) if prep.first_chunk => self.claim_jointly(r, prep),
            Some((DraftMode::Joint, _)) => self.prepare_continuation(r, prep),
            Some((DraftMode::Unpaired, ref mut d)) => {
                let reused = self.target.prepare_context(r, prep)?;
                d.admit_mirror(r).then_some(reused)
            }
            None => self.target.prepare_context(r, prep),
        }
    }

    fn prepare_disagg_gen_init(&mut self, r: KvRef, capacity: u32) -> bool {
        if !self.target.prepare_disagg_gen_init(r, capacity) {
            return false;
        }
        let paired = match &mut self.draft {
            Some((DraftMode::Joint, d)) => d.prepare_disagg_gen_init(r, capacity),
            _ => true,
        };
        if !paired {
            self.target.suspend(r);
        }
        paired
    }

    fn resize_reserving(
        &mut self,
        r: KvRef,
        capacity: u32,
        reservation: Reservation,
        first_chunk: bool,
    ) -> Option<u32> {
        if self.draft.is_none() {
            return self
                .target
                .resize_reserving(r, capacity, reservation, first_chunk);
        }
        crate::kv::reserve_by_capacity(self, r, capacity, reservation, first_chunk)
    }

    fn resize_context(&mut self, r: KvRef, capacity: u32, first_chunk: bool) -> bool {
        if !self.target.resize_context(r, capacity, first_chunk) {
            self.target_resize_refused(r, first_chunk);
            return false;
        }
        let Some((DraftMode::Joint, draft)) = &mut self.draft else {
            return true;
        };
        if draft.resize_context(r, capacity, first_chunk) {
            return true;
        }
        if !first_chunk {
            // A continuation keeps its caches active with the target's growth undone (upstream
            // suspends both; difference 12: the request owns active KV with its lease).
            self.target.revert_allocate_generation(r);
            return false;
        }
        if self.target.revert_allocate_context(r) {
            self.target.suspend(r);
            draft.suspend(r);
        } else {
            draft.free(r);
        }
        false
    }

    #[inline(always)]
    fn try_allocate_generation(&mut self, r: KvRef, grow: u32) -> bool {
        match &mut self.draft {
            None => self.target.try_allocate_generation(r, grow),
            Some((mode, d)) => generation_paired(&mut self.target, *mode, d, r, grow),
        }
    }

    fn revert_allocate_generation(&mut self, r: KvRef) {
        self.target.revert_allocate_generation(r);
        if let Some(d) = self.joint() {
            d.revert_allocate_generation(r);
        }
    }

    fn rewind(&mut self, r: KvRef, tokens: u32) {
        self.target.rewind(r, tokens);
        if let Some(d) = self.joint() {
            d.rewind(r, tokens);
        }
    }

    #[inline]
    fn suspend(&mut self, r: KvRef) {
        self.target.suspend(r);
        if let Some((_, d)) = &mut self.draft {
            d.suspend(r);
        }
    }

    fn free(&mut self, r: KvRef) {
        if self.target.cache(r).exists() {
            self.target.free(r);
        }
        if let Some((_, d)) = &mut self.draft {
            if d.cache(r).exists() {
                d.free(r);
            }
        }
        if let Some(x) = &mut self.cross {
            if x.cache(r).exists() {
                x.free(r);
            }
        }
    }

    fn preempt(&mut self, r: KvRef) {
        self.target.preempt(r);
        if let Some((_, d)) = &mut self.draft {
            if d.cache(r).exists() {
                d.free(r);
            }
        }
        // A recompute-paused request owns no KV: its cross cache goes too (its replay's first chunk
        // creates it again). Kept, it pinned cross pages nobody owned, and a request needing them
        // waited for ever while the victim replayed (a livelock the model tests found).
        if let Some(x) = &mut self.cross {
            if x.cache(r).exists() {
                x.free(r);
            }
        }
    }

    #[inline]
    fn take_moves(&mut self) -> &[PageMove] {
        self.target.take_moves()
    }
}

/// The set is each of its capabilities while it has it: a draft or a cross pool beside the target, a
/// connector or unified adapter paging on the target, a prefix cache on the target or the draft pool.
/// `$has` answers from a shared borrow (`caps`), `$has_mut` from the exclusive one (the accessors).
macro_rules! reach_self {
    ($cap:ty, |$k:ident| $has:expr, $has_mut:expr) => {
        impl<T: PairedPool, D: PairedPool, X: KvBackend> Reach<KvSet<T, D, X>, $cap>
            for KvSet<T, D, X>
        {
            #[inline]
            fn reach($k: &Self) -> Option<&Self> {
                $has.then_some($k)
            }
            #[inline]
            fn reach_mut($k: &mut Self) -> Option<&mut Self> {
                if $has_mut {
                    Some($k)
                } else {
                    None
                }
            }
        }
    };
}

reach_self!(DraftCap, |k| k.draft.is_some(), k.draft.is_some());
reach_self!(CrossCap, |k| k.cross.is_some(), k.cross.is_some());
reach_self!(
    TransfersCap,
    |k| k.target.caps().transfers.is_some(),
    k.target.transfers().is_some()
);
reach_self!(
    PrefixCap,
    |k| k
        .draft
        .as_ref()
        .is_some_and(|(_, d)| d.caps().prefix.is_some())
        || k.target.caps().prefix.is_some(),
    k.draft.as_mut().is_some_and(|(_, d)| d.prefix().is_some()) || k.target.prefix().is_some()
);
reach_self!(
    AdaptersCap,
    |k| k.target.caps().adapters.is_some(),
    k.target.adapters().is_some()
);

/// A generation step on the target and its draft, all or nothing: a target the step resumed is
/// suspended again when the draft side refuses.
#[inline(always)]
fn generation_paired<T: KvBackend, D: PairedPool>(
    target: &mut T,
    mode: DraftMode,
    draft: &mut D,
    r: KvRef,
    grow: u32,
) -> bool {
    let was_active = target.cache(r).is_active();
    if !target.try_allocate_generation(r, grow) {
        return false;
    }
    let paired = match mode {
        DraftMode::Joint => draft.try_allocate_generation(r, grow),
        DraftMode::Unpaired => draft.admit_mirror(r),
    };
    if !paired {
        target.revert_allocate_generation(r);
        if !was_active {
            target.suspend(r);
        }
    }
    paired
}

/// A fault planted in the target pool (feature `fault-injection`).
#[cfg(feature = "fault-injection")]
impl<T: PairedPool + crate::page_pool::PlantFault, D: PairedPool, X: KvBackend>
    crate::page_pool::PlantFault for KvSet<T, D, X>
{
    fn plant(&mut self, fault: crate::page_pool::PoolFault) -> bool {
        self.target.plant(fault)
    }
}
