//! The set's capabilities: each is the set itself, present as its members say (see [`super`]).

use crate::ids::{RequestId, TaskSlot};
use crate::kv::{
    AdapterPaging, ContextPrep, CrossPool, DraftPairing, KvBackend, KvCaps, KvRef, LoadChange,
    PageMove, PairedPool, PrefixReuse, Transfers, TrialMark,
};

use super::{DraftMode, KvSet};

/// A set is itself a pool that can be paired (a set inside a set pairs as its target does).
impl<T: PairedPool, D: PairedPool, X: KvBackend> PairedPool for KvSet<T, D, X> {
    fn revert_allocate_context(&mut self, r: KvRef) -> bool {
        let kept = self.target.revert_allocate_context(r);
        if let Some(d) = self.joint() {
            d.revert_allocate_context(r);
        }
        kept
    }

    fn admit_mirror(&mut self, r: KvRef) -> bool {
        self.target.admit_mirror(r)
    }

    fn resume_blocked(&self, r: KvRef) -> bool {
        self.target.resume_blocked(r)
    }
}

/// The draft pool (present while there is one).
impl<T: PairedPool, D: PairedPool, X: KvBackend> DraftPairing for KvSet<T, D, X> {
    fn admission_certainly_blocked(&self, r: KvRef) -> bool {
        match &self.draft {
            Some((DraftMode::Unpaired, d)) => {
                self.target.cache(r).is_active() && d.resume_blocked(r)
            }
            _ => false,
        }
    }

    fn take_draft_moves(&mut self) -> &[PageMove] {
        match &mut self.draft {
            Some((_, d)) => d.take_moves(),
            None => &[],
        }
    }
}

/// The cross pool (present while there is one): created or resumed and resized by the pass after the
/// target's allocation (§1.7 step 6), suspended apart, freed with the rest.
impl<T: PairedPool, D: PairedPool, X: KvBackend> CrossPool for KvSet<T, D, X> {
    fn prepare_cross(&mut self, r: KvRef, first_chunk: bool) -> bool {
        let Some(x) = &mut self.cross else {
            return false;
        };
        let exists = x.cache(r).exists();
        if !first_chunk && !exists {
            return false;
        }
        let prep = ContextPrep {
            first_chunk: !exists,
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

    fn suspend_cross(&mut self, r: KvRef) {
        if let Some(x) = &mut self.cross {
            x.suspend(r);
        }
    }

    fn max_cross_tokens(&self) -> u64 {
        self.cross
            .as_ref()
            .map_or(u64::MAX, |x| x.limits().max_tokens_per_request)
    }

    fn take_cross_moves(&mut self) -> &[PageMove] {
        match &mut self.cross {
            Some(x) => x.take_moves(),
            None => &[],
        }
    }
}

/// The target's connector (present while it has one).
impl<T: PairedPool, D: PairedPool, X: KvBackend> Transfers for KvSet<T, D, X> {
    fn take_load_changes(&mut self, f: &mut dyn FnMut(u16, LoadChange)) {
        if let Some(t) = self.target.transfers() {
            t.take_load_changes(f);
        }
    }

    fn sends_in_flight(&self) -> bool {
        self.target
            .caps()
            .transfers
            .is_some_and(super::super::kv::caps::Transfers::sends_in_flight)
    }
}

/// The prefix caches (present while the target or the draft pool has one): hashes reach both pools,
/// commits the target and a joint draft pool, the pass's probes are the target's.
impl<T: PairedPool, D: PairedPool, X: KvBackend> PrefixReuse for KvSet<T, D, X> {
    fn set_prefix(&mut self, r: KvRef, root: u64, hashes: &[u64]) {
        if let Some(p) = self.target.prefix() {
            p.set_prefix(r, root, hashes);
        }
        if let Some(p) = self.draft.as_mut().and_then(|(_, d)| d.prefix()) {
            p.set_prefix(r, root, hashes);
        }
    }

    fn commit(&mut self, r: KvRef, computed: u32) {
        if let Some(p) = self.target.prefix() {
            p.commit(r, computed);
        }
        if let Some(p) = self.joint().and_then(|d| d.prefix()) {
            p.commit(r, computed);
        }
    }

    /// The target's, without a draft or a cross pool (whose rows a fork would have to pair).
    fn can_fork(&self, parent: KvRef, child: KvRef, tokens: u32) -> Option<u32> {
        if self.draft.is_some() || self.cross.is_some() {
            return None;
        }
        self.target.caps().prefix?.can_fork(parent, child, tokens)
    }

    fn fork(&mut self, parent: KvRef, child: KvRef, tokens: u32) -> Option<u32> {
        if self.draft.is_some() || self.cross.is_some() {
            return None;
        }
        self.target.prefix()?.fork(parent, child, tokens)
    }

    fn drop_idle_blocks(&mut self) -> u32 {
        use super::super::kv::caps::PrefixReuse as Reuse;
        let target = self.target.prefix().map_or(0, Reuse::drop_idle_blocks);
        let draft = self.draft.as_mut().and_then(|(_, d)| d.prefix());
        target + draft.map_or(0, Reuse::drop_idle_blocks)
    }

    fn all_blocks_reusable(&self) -> bool {
        self.target
            .caps()
            .prefix
            .is_some_and(super::super::kv::caps::PrefixReuse::all_blocks_reusable)
    }

    fn probe_first_new_block(&self, r: KvRef, prep: ContextPrep) -> Option<u64> {
        self.target.caps().prefix?.probe_first_new_block(r, prep)
    }

    fn probe_context_reuse(&self, r: KvRef, prep: ContextPrep) -> Option<u32> {
        match self.target.caps().prefix {
            Some(p) => p.probe_context_reuse(r, prep),
            None => Some(0),
        }
    }

    /// The target's, without a draft pool (whose mirror a first chunk's preparation admits).
    fn trial_reuse(&mut self, r: KvRef, prep: ContextPrep) -> Option<u32> {
        if self.draft.is_some() {
            return None;
        }
        self.target.prefix()?.trial_reuse(r, prep)
    }

    fn trial_refused(
        &self,
        r: KvRef,
        prep: ContextPrep,
        reused: u32,
        capacity: u32,
    ) -> Option<u32> {
        if self.draft.is_some() {
            return None;
        }
        self.target
            .caps()
            .prefix?
            .trial_refused(r, prep, reused, capacity)
    }

    fn trial_mark(&self) -> Option<TrialMark> {
        if self.draft.is_some() {
            return None;
        }
        self.target.caps().prefix?.trial_mark()
    }

    fn trial_unmoved(&self, r: KvRef) -> bool {
        self.draft.is_none()
            && self
                .target
                .caps()
                .prefix
                .is_some_and(|p| p.trial_unmoved(r))
    }

    /// The target's (a router matches prompts against the target model's blocks).
    fn take_kv_events(&mut self) -> &[crate::kv_events::KvEvent] {
        match self.target.prefix() {
            Some(p) => p.take_kv_events(),
            None => &[],
        }
    }
}

/// Unified paging is the target pool's: adapters share the target model's pages.
impl<T: PairedPool, D: PairedPool, X: KvBackend> AdapterPaging for KvSet<T, D, X> {
    fn max_tokens_beside_adapter(&self, pages: u32) -> u64 {
        let draft = self
            .draft
            .as_ref()
            .map_or(u64::MAX, |(_, d)| d.limits().max_tokens_per_request);
        let target = self
            .target
            .caps()
            .adapters
            .map_or(self.target.limits().max_tokens_per_request, |a| {
                a.max_tokens_beside_adapter(pages)
            });
        target.min(draft)
    }

    #[inline]
    fn can_pin_adapter(&self, task: TaskSlot, pages: u32) -> bool {
        self.target
            .caps()
            .adapters
            .is_none_or(|a| a.can_pin_adapter(task, pages))
    }

    #[inline]
    fn pin_adapter(&mut self, who: RequestId, task: TaskSlot, pages: u32) -> bool {
        self.target
            .adapters()
            .is_none_or(|a| a.pin_adapter(who, task, pages))
    }

    #[inline]
    fn unpin_adapter(&mut self, task: TaskSlot) {
        if let Some(a) = self.target.adapters() {
            a.unpin_adapter(task);
        }
    }

    fn drop_adapter(&mut self, task: TaskSlot) {
        if let Some(a) = self.target.adapters() {
            a.drop_adapter(task);
        }
    }

    fn adapter_pins(&self, task: TaskSlot) -> Option<u32> {
        self.target.caps().adapters?.adapter_pins(task)
    }

    fn take_adapter_placements(&mut self, f: &mut dyn FnMut(TaskSlot)) {
        if let Some(a) = self.target.adapters() {
            a.take_adapter_placements(f);
        }
    }

    fn take_adapter_evictions(&mut self, f: &mut dyn FnMut(TaskSlot)) {
        if let Some(a) = self.target.adapters() {
            a.take_adapter_evictions(f);
        }
    }
}
