//! The incremental pass: a steady decode batch is kept across passes instead of being rebuilt.
//!
//! A full pass whose every live request was a decode step of the fast case (active, not in flight,
//! `GENERATION_IN_PROGRESS`, its step fitting the budgets and the batch's beam) and that did nothing
//! else — no chunk, no suspension, resumption, recompute pause, preemption, deferral or failed load —
//! leaves the scheduler *steady*. Every call that can change what a pass decides ends it: submission,
//! adoption, removal, `update`, the in-flight and pending-load marks, the transfer ends, adapter
//! registration, a completed step that advanced a chunk or reset a request, a planted fault.
//!
//! The next pass of a steady scheduler, given the last pass's own output, is then known but for the KV
//! backend's answers: the same requests in the same arrival order ask for the same growth. So it only
//! makes those calls ([`Scheduler::replay`]), in that order, each from the request's 16-byte hot record,
//! and leaves the output's lists, the adapter plan and the LoRA order as they are. While every call
//! succeeds that is exactly the full pass's result (same lists, same order, same calls on the backends):
//! the full pass's phase 2, deadlock verdict and sort see the same batch and the same state. The first
//! refusal hands over to the full pass at that request (`Pass::replayed_prefix`): the output is rebuilt
//! for the requests whose calls were made, and the ladder starts where the full pass's would.
//!
//! What a replayed pass costs is the backend's per-request bookkeeping (the capacity its cache grows
//! by); everything the scheduler adds per request is gone. `Scheduler::set_incremental(false)` turns it
//! off, which is how the differential checks (`testkit`, the conformance runner, the simulator's
//! `--check`, the fuzz targets) run the full pass beside it and compare every field.

use crate::adapter::PeftBackend;
use crate::kv::KvBackend;
use crate::output::SchedulerOutput;
use crate::storage::Storage;

use super::generation::Refusal;
use super::hot::{READY, READY_MASK};
use super::marks::Mark;
use super::pass::{listed, Pass};
use super::table::AnyRequest;
use super::Scheduler;

impl<K: KvBackend, P: PeftBackend, const N: usize, const T: usize, S: Storage>
    Scheduler<K, P, N, T, S>
{
    /// Something changed that a pass reads: the next pass is a full one.
    #[inline]
    pub(crate) fn changed(&mut self) {
        self.steady = false;
        self.run.forget();
    }

    /// A waiting request joined the end of the arrival order: the next pass is a full one, and the
    /// last pass's refused run stands (every member is before the arrival, `refused_run.rs`).
    pub(crate) fn arrived(&mut self) {
        self.steady = false;
    }

    /// Whether the pass about to run may replay the last one into `out`: steady, given the last pass's
    /// own output (no other output, no stale one), with no connector load failed since.
    pub(crate) fn may_replay(&self, out: &SchedulerOutput<N, S>) -> bool {
        self.incremental
            && self.steady
            && out.pass() + 1 == self.passes
            && self.scratch.pending_slots.is_empty()
            && out.generation().len() == self.table.len()
    }

    /// After a full pass: whether it leaves the scheduler steady (`quiet`: it succeeded and suspended,
    /// paused, preempted, deferred and abandoned nothing; `decoded`: the requests its decode run
    /// scheduled).
    pub(crate) fn settle_steady(
        &mut self,
        out: &SchedulerOutput<N, S>,
        quiet: bool,
        decoded: usize,
    ) {
        // Every live request a decode step of the run: no request is in another list (one entry per
        // live request), and a quiet pass suspended none.
        let len = self.table.len();
        self.steady = quiet && len > 0 && decoded == len;
        debug_assert!(
            !self.steady || out.num_fitting() + out.paused().len() + out.disagg().len() == len,
            "a steady pass lists its decode steps only"
        );
    }

    /// The steady batch's KV calls, in arrival order, as the full pass's decode run makes them: each
    /// request's step grows its cache by its drafts + 1 beyond its headroom. `None` when every call
    /// succeeded (the pass is the last one again); else the arrival index of the first refusal, whose
    /// request's headroom is left as it was, and what the ladder needs. Never inlined: inlined into
    /// `schedule`, the loop spilled a register each request (one load and one store more, measured).
    #[inline(never)]
    pub(crate) fn replay(&mut self) -> Option<(usize, Refusal)> {
        let (order, hot, held) = self.table.decode_view();
        let kv = &mut self.kv;
        for (i, &slot) in order.iter().enumerate() {
            let h = &mut hot[usize::from(slot)];
            let Some(AnyRequest::Active(r)) = &held[usize::from(slot)] else {
                unreachable!("a steady batch holds active requests only");
            };
            debug_assert_eq!(
                h.code & READY_MASK,
                READY,
                "a steady request is a fast decode step"
            );
            let step = h.draft + 1;
            let grow = step.saturating_sub(h.headroom);
            let after = h.headroom.saturating_sub(step);
            if !kv.try_allocate_generation(r.kv_ref(), grow) {
                let refusal = Refusal {
                    grow,
                    after,
                    tokens: h.beam + h.draft,
                    beam: h.beam,
                };
                return Some((i, refusal));
            }
            h.headroom = after;
        }
        None
    }

    /// Turns the incremental pass on (the default) or off: off, every pass is a full one. The
    /// differential checks run a scheduler with it off beside one with it on and compare every pass.
    pub fn set_incremental(&mut self, on: bool) {
        self.incremental = on;
        self.steady = false;
    }

    /// Passes that were incremental: the last pass's batch kept, only its KV calls made again.
    pub fn replayed_passes(&self) -> u64 {
        self.replays
    }
}

impl<K: KvBackend, P: PeftBackend, const N: usize, const T: usize, S: Storage>
    Pass<'_, K, P, N, T, S>
{
    /// A replay refused at arrival index `k`: the requests before it made their calls, which succeeded;
    /// they are listed, counted and charged as the decode run lists them.
    pub(crate) fn replayed_prefix(&mut self, k: usize) {
        for i in 0..k {
            let slot = self.table.slot(i);
            let h = self.table.hot(slot);
            match self.table.entry(slot).held() {
                AnyRequest::Active(r) => listed(self.out.push_generation(r)),
                _ => unreachable!("a steady batch holds active requests only"),
            }
            self.plan.count_decode(h.bucket);
            self.mark(slot, Mark::SCHEDULED);
            self.budget.commit(h.beam + h.draft);
            self.beam = h.beam;
            self.decoded += 1;
        }
    }
}
