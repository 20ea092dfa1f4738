//! A request's caches as one backend: the target pool, an optional draft pool (speculative decoding) and
//! an optional cross pool (encoder-decoder), each itself a [`KvBackend`].
//!
//! The scheduler holds one `K: KvBackend`; with `K = KvSet<…>` every call it makes acts on all of a
//! request's caches together, so suspending, preempting or freeing the target without its draft cannot
//! be written: [`KvSet`] lends its pools out read-only ([`KvSet::target`], [`KvSet::draft`],
//! [`KvSet::cross`]) and the scheduler lends the set out read-only too.
//!
//! The pairing rules are the reference's (spec §1.5 step 3, §1.7):
//!
//! - **Joint draft pool** (allocated with the target): a generation step grows both (a refused draft
//!   growth reverts the target's); a context chunk resizes the target, then the draft
//!   (`try_allocate_draft_context`: refused → the target's growth is reverted, or the draft freed when the
//!   target had to drop its cache, and both are suspended — a continuation keeps both active, difference 12
//!   of docs/conformance-format.md); a first chunk's reuse depth is one both pools claim (the smaller of
//!   their probes; claims that disagree are retried at the target's depth, then at 0).
//! - **Unpaired draft pool** (a mirror the executor fills): the mirror is admitted after the target
//!   (`admit_mirror`: created if missing and resumed); refused → a generation step's target growth is
//!   reverted, a context preparation fails. Its preview makes the §1.11 blocked fast path possible.
//! - **Cross pool**: created (first chunk only) or resumed and resized to the encoder output by the pass
//!   after the target's allocation (§1.7 step 6); suspended separately, freed with the rest.
//!
//! Suspension acts on target and draft, freeing on all three pools, preemption frees the draft beside the
//! target's preemption (spec §1.8). The target decides `has_cache`/`is_active` for the pass; `has_cache`
//! also sees a draft or cross cache left alone, so a rolled-back first chunk frees every pool.

use crate::ids::RequestId;
use crate::kv::{ContextPrep, KvBackend, KvRef, PageMove, Pool};

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

impl<T: KvBackend> KvSet<T, T, T> {
    /// The target pool alone.
    pub fn new(target: T) -> Self {
        Self {
            target,
            draft: None,
            cross: None,
        }
    }
}

impl<T: KvBackend, D: KvBackend, X: KvBackend> KvSet<T, D, X> {
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
    pub fn draft(&self) -> Option<(DraftMode, &D)> {
        self.draft.as_ref().map(|(m, d)| (*m, d))
    }

    /// The cross pool.
    pub fn cross(&self) -> Option<&X> {
        self.cross.as_ref()
    }

    fn joint(&mut self) -> Option<&mut D> {
        match &mut self.draft {
            Some((DraftMode::Joint, d)) => Some(d),
            _ => None,
        }
    }

    /// A joint first chunk's claims (spec §1.7 `_prepare_context_pair`): both pools claim one depth.
    fn claim_jointly(&mut self, r: KvRef, prep: ContextPrep) -> Option<u32> {
        let Some((_, draft)) = &mut self.draft else {
            return None;
        };
        let probes = (
            draft.probe_context_reuse(r, prep),
            self.target.probe_context_reuse(r, prep),
        );
        let limit = match probes {
            (Some(d), Some(t)) => d.min(t),
            (Some(x), None) | (None, Some(x)) => x,
            (None, None) => ContextPrep::NO_LIMIT,
        }
        .min(prep.reuse_limit);
        let d = draft.prepare_context(r, prep.limited(limit))?;
        let t = self.target.prepare_context(r, prep.limited(d))?;
        if t == d {
            return Some(t);
        }
        draft.free(r);
        if draft.prepare_context(r, prep.limited(t))? == t {
            return Some(t);
        }
        draft.free(r);
        self.target.free(r);
        let d0 = draft.prepare_context(r, prep.limited(0))?;
        let t0 = self.target.prepare_context(r, prep.limited(0))?;
        // Claims at depth 0 reuse nothing; a pool that still claims is broken: refuse the chunk.
        (d0 == 0 && t0 == 0).then_some(0)
    }
}

impl<T: KvBackend, D: KvBackend, X: KvBackend> KvBackend for KvSet<T, D, X> {
    /// Suspension moves a request's caches down only where every pool it suspends has a lower tier: a
    /// draft pool without one keeps its pages held, so preemption must stay possible.
    fn tier_below_gpu(&self) -> bool {
        self.target.tier_below_gpu() && self.draft.as_ref().is_none_or(|(_, d)| d.tier_below_gpu())
    }

    fn can_evict(&self) -> bool {
        self.target.can_evict() && self.draft.as_ref().is_none_or(|(_, d)| d.can_evict())
    }

    fn has_cache(&self, r: KvRef) -> bool {
        self.target.has_cache(r)
            || self.draft.as_ref().is_some_and(|(_, d)| d.has_cache(r))
            || self.cross.as_ref().is_some_and(|x| x.has_cache(r))
    }

    fn prepare_context(&mut self, r: KvRef, prep: ContextPrep) -> Option<u32> {
        match self.draft {
            Some((DraftMode::Joint, _)) if prep.first_chunk => self.claim_jointly(r, prep),
            Some((DraftMode::Joint, ref mut d)) => {
                let was_active = self.target.is_active(r);
                let pair = (
                    self.target.prepare_context(r, prep),
                    d.prepare_context(r, prep),
                );
                if pair.0.is_none() || pair.1.is_none() {
                    // Upstream suspends both; an active continuation keeps its caches (difference 12).
                    if !was_active {
                        self.target.suspend(r);
                        d.suspend(r);
                    }
                    return None;
                }
                Some(0)
            }
            Some((DraftMode::Unpaired, ref mut d)) => {
                let reused = self.target.prepare_context(r, prep)?;
                d.admit_mirror(r).then_some(reused)
            }
            None => self.target.prepare_context(r, prep),
        }
    }

    fn resize_context(&mut self, r: KvRef, capacity: u32, first_chunk: bool) -> bool {
        if !self.target.resize_context(r, capacity, first_chunk) {
            // The draft follows the target: a refused first chunk's caches are suspended together.
            if !self.target.is_active(r) {
                if let Some(d) = self.joint() {
                    d.suspend(r);
                }
            }
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

    #[inline]
    fn is_active(&self, r: KvRef) -> bool {
        self.target.is_active(r)
    }
    fn revert_allocate_generation(&mut self, r: KvRef) {
        self.target.revert_allocate_generation(r);
        if let Some(d) = self.joint() {
            d.revert_allocate_generation(r);
        }
    }

    fn suspend(&mut self, r: KvRef) {
        self.target.suspend(r);
        if let Some((_, d)) = &mut self.draft {
            d.suspend(r);
        }
    }

    fn free(&mut self, r: KvRef) {
        if self.target.has_cache(r) {
            self.target.free(r);
        }
        if let Some((_, d)) = &mut self.draft {
            if d.has_cache(r) {
                d.free(r);
            }
        }
        if let Some(x) = &mut self.cross {
            if x.has_cache(r) {
                x.free(r);
            }
        }
    }

    fn preempt(&mut self, r: KvRef) {
        self.target.preempt(r);
        if let Some((_, d)) = &mut self.draft {
            if d.has_cache(r) {
                d.free(r);
            }
        }
        // A recompute-paused request owns no KV: its cross cache goes too (its replay's first chunk
        // creates it again). Kept, it pinned cross pages nobody owned, and a request needing them
        // waited for ever while the victim replayed (a livelock the model tests found).
        if let Some(x) = &mut self.cross {
            if x.has_cache(r) {
                x.free(r);
            }
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

    fn max_tokens_per_request(&self) -> u64 {
        let draft = self
            .draft
            .as_ref()
            .map_or(u64::MAX, |(_, d)| d.max_tokens_per_request());
        self.target.max_tokens_per_request().min(draft)
    }

    fn set_prefix(&mut self, r: KvRef, root: u64, hashes: &[u64]) {
        self.target.set_prefix(r, root, hashes);
        if let Some((_, d)) = &mut self.draft {
            d.set_prefix(r, root, hashes);
        }
    }

    fn commit(&mut self, r: KvRef, computed: u32) {
        self.target.commit(r, computed);
        if let Some(d) = self.joint() {
            d.commit(r, computed);
        }
    }

    fn prefix_skip(&self) -> bool {
        self.target.prefix_skip()
    }

    fn probe_first_new_block(&self, r: KvRef, prep: ContextPrep) -> Option<u64> {
        self.target.probe_first_new_block(r, prep)
    }

    fn take_moves(&mut self) -> &[PageMove] {
        self.target.take_moves()
    }

    fn take_pool_moves(&mut self, pool: Pool) -> &[PageMove] {
        match pool {
            Pool::Target => self.target.take_moves(),
            Pool::Draft => match &mut self.draft {
                Some((_, d)) => d.take_moves(),
                None => &[],
            },
            Pool::Cross => match &mut self.cross {
                Some(x) => x.take_moves(),
                None => &[],
            },
        }
    }

    fn probe_context_reuse(&self, r: KvRef, prep: ContextPrep) -> Option<u32> {
        self.target.probe_context_reuse(r, prep)
    }

    fn revert_allocate_context(&mut self, r: KvRef) -> bool {
        let kept = self.target.revert_allocate_context(r);
        if let Some(d) = self.joint() {
            d.revert_allocate_context(r);
        }
        kept
    }

    fn admission_certainly_blocked(&self, r: KvRef) -> bool {
        match &self.draft {
            Some((DraftMode::Unpaired, d)) => self.target.is_active(r) && d.resume_blocked(r),
            _ => false,
        }
    }

    fn has_cross_pool(&self) -> bool {
        self.cross.is_some()
    }

    fn prepare_cross(&mut self, r: KvRef, first_chunk: bool) -> bool {
        let Some(x) = &mut self.cross else {
            return false;
        };
        if !first_chunk && !x.has_cache(r) {
            return false;
        }
        let prep = ContextPrep {
            first_chunk: !x.has_cache(r),
            prompt: 0,
            position: 0,
            lookahead: 0,
            reuse_limit: 0,
        };
        x.prepare_context(r, prep).is_some()
    }

    fn resize_cross(&mut self, r: KvRef, tokens: u32) -> bool {
        self.cross
            .as_mut()
            .is_some_and(|x| x.resize_context(r, tokens, false))
    }

    fn rewind(&mut self, r: KvRef, tokens: u32) {
        self.target.rewind(r, tokens);
        if let Some(d) = self.joint() {
            d.rewind(r, tokens);
        }
    }

    fn max_cross_tokens_per_request(&self) -> u64 {
        self.cross
            .as_ref()
            .map_or(u64::MAX, |x| x.max_tokens_per_request())
    }

    fn has_connector(&self) -> bool {
        self.target.has_connector()
    }

    fn sends_in_flight(&self) -> bool {
        self.target.sends_in_flight()
    }

    fn take_load_changes(&mut self, f: &mut dyn FnMut(u16, crate::kv::LoadChange)) {
        self.target.take_load_changes(f);
    }

    // Unified paging is the target pool's: adapters share the target model's pages.
    #[inline]
    fn pages_adapters(&self) -> bool {
        self.target.pages_adapters()
    }

    fn max_tokens_beside_adapter(&self, pages: u32) -> u64 {
        let draft = self
            .draft
            .as_ref()
            .map_or(u64::MAX, |(_, d)| d.max_tokens_per_request());
        self.target.max_tokens_beside_adapter(pages).min(draft)
    }

    #[inline]
    fn can_pin_adapter(&self, task: u16, pages: u32) -> bool {
        self.target.can_pin_adapter(task, pages)
    }

    #[inline]
    fn pin_adapter(&mut self, who: RequestId, task: u16, pages: u32) -> bool {
        self.target.pin_adapter(who, task, pages)
    }

    #[inline]
    fn unpin_adapter(&mut self, task: u16) {
        self.target.unpin_adapter(task);
    }

    fn drop_adapter(&mut self, task: u16) {
        self.target.drop_adapter(task);
    }

    fn take_adapter_placements(&mut self, f: &mut dyn FnMut(u16)) {
        self.target.take_adapter_placements(f);
    }

    fn take_adapter_evictions(&mut self, f: &mut dyn FnMut(u16)) {
        self.target.take_adapter_evictions(f);
    }

    fn adapter_pins(&self, task: u16) -> Option<u32> {
        self.target.adapter_pins(task)
    }

    fn suspend_cross(&mut self, r: KvRef) {
        if let Some(x) = &mut self.cross {
            x.suspend(r);
        }
    }
}

/// A generation step on the target and its draft, all or nothing: a target the step resumed is
/// suspended again when the draft side refuses.
#[inline(always)]
fn generation_paired<T: KvBackend, D: KvBackend>(
    target: &mut T,
    mode: DraftMode,
    draft: &mut D,
    r: KvRef,
    grow: u32,
) -> bool {
    let was_active = target.is_active(r);
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
