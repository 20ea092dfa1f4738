//! Phase 2 (spec §1.6, §1.7): the deferred context and encoder requests, in arrival order, and what
//! admission does to a request's ownership.
//!
//! A context request is prepared and resized first (chunking decides how much, `chunking`); once its KV
//! is in place its type-state takes ownership — admission of a first chunk, replay after a recompute
//! pause, or resume of a suspended later chunk — each acquiring the lease. Anything refused on the way
//! is rolled back: a first chunk keeps no cache (and no reuse claim), a suspended later chunk whose KV
//! came back without being scheduled is suspended again, so no request holds active KV without its
//! lease.
//!
//! Invariants: a scheduled context chunk owns active KV and its lease; a rolled-back first chunk made no
//! adapter call; a request preempted in this pass is not admitted in it.

use crate::adapter::PeftBackend;
use crate::config::ChunkPolicy;
use crate::kv::{DraftPairing, KvBackend, KvCaps, KvRef};
use crate::phase::Phase;
use crate::request::KvReturn;
use crate::storage::Storage;

use super::marks::Mark;
use super::pass::{listed, Pass, Step};
use super::table::AnyRequest;

impl<K: KvBackend, P: PeftBackend, const N: usize, const T: usize, S: Storage>
    Pass<'_, K, P, N, T, S>
{
    /// Phase 2 over the deferred requests.
    pub(crate) fn context_phase(&mut self) {
        self.begin_prefix_skip();
        self.begin_step_time();
        let runs = self.runs_apply();
        let (mut k, mut run) = (0, None);
        // Phase 2 adds no pending entry.
        let len = self.pending_len();
        while k < len {
            if self.budget.requests_full() {
                self.full_before(k);
                return self.record_run(None, false);
            }
            // The last pass's refused run, skipped while it stands (`refused_run.rs`).
            if let Some((end, least)) = runs.then(|| self.skip_run(k)).flatten() {
                self.track_run(k, Some(least), &mut run);
                self.stats.skipped += crate::narrow::u32_of(end - k);
                k = end;
                continue;
            }
            let p = self.pending_at(k);
            let slot = self.table.slot(usize::from(p.index));
            // Its own last refusal, where it stands (`refusal_mark.rs`).
            if let Some(short) = runs.then(|| self.remembered_refusal(slot)).flatten() {
                self.keep_short(slot, short);
                self.track_run(k, Some(short), &mut run);
                self.stats.skipped += 1;
                k += 1;
                continue;
            }
            self.refused_clean = false;
            let step = self.pending_step(p.index as usize, slot, p.planned);
            if runs {
                let refused = self.refused_clean.then_some(self.refused_short);
                if let Some(short) = refused {
                    self.keep_short(slot, short);
                    self.remember_refusal(slot, short);
                }
                self.track_run(k, refused, &mut run);
            }
            k += 1;
            match step {
                Step::Stop => return self.record_run(None, false),
                // Not scheduled: its EQUAL_PROGRESS units go to the contexts after it.
                Step::Skip if p.planned > 0 => self.replan_equal_progress(k),
                _ => {}
            }
        }
        debug_assert_eq!(len, self.pending_len());
        self.record_run(run, true);
    }

    /// §1.6 steps 2–8 for one deferred request.
    fn pending_step(&mut self, i: usize, slot: u16, planned: u32) -> Step {
        let e = self.table.entry(slot);
        let phase = e.spec().phase;
        if let Some(c) = self.cfg.chunking {
            if phase == Phase::ContextInit && !self.budget.has_chunk_budget(c.policy, c.unit) {
                return Step::Skip;
            }
        }
        let first = self.first_chunk(slot);
        let closed = self.admissions_closed && phase == Phase::ContextInit && first;
        if self.marked(slot, Mark::PREEMPTED)
            || closed
            || self.held_back(slot)
            || self.thrash_held(i, slot)
        {
            return Step::Skip;
        }
        // §1.11: an unpaired draft pool that would certainly refuse the mirror (decision-neutral).
        if self.cfg.blocked_fast_path
            && self.cfg.chunking.is_some()
            && phase == Phase::ContextInit
            && self
                .kv
                .caps()
                .draft
                .is_some_and(|d| d.admission_certainly_blocked(self.kv_ref(slot)))
        {
            return Step::Skip;
        }
        // §1.6 step 5: before the adapter and any KV call, so a deferral costs nothing.
        let Ok(key) = self.prefix_probe(slot) else {
            return Step::Skip;
        };
        let Some(pages) = self.peft_need(slot) else {
            // Its adapter does not fit the device beside the pass's.
            self.adapter_refused(slot, true);
            return Step::Skip;
        };
        if phase == Phase::EncoderInit {
            return self.try_encoder(slot, pages);
        }
        let step = self.try_context(i, pages, planned);
        if let (Step::Scheduled, Some(k)) = (step, key) {
            self.contribute(k);
        }
        step
    }

    /// §1.6 step 7: an encoder request costs its encoder length and touches no KV pool.
    fn try_encoder(&mut self, slot: u16, pages: u32) -> Step {
        let s = self.table.entry(slot).spec();
        let tokens = if s.encoder_len > 0 {
            s.encoder_len
        } else {
            s.prompt
        };
        if !self.budget.fits(tokens) {
            return Step::Stop;
        }
        // Refused at submission otherwise (`checks.rs`, deliberate difference 16).
        debug_assert!(
            self.cfg.max_context_length.is_none_or(|m| tokens <= m),
            "an encoder request within the budget is within max_context_length"
        );
        match self.table.entry(slot).held() {
            AnyRequest::Waiting(r) => listed(self.out.push_encoder(r)),
            AnyRequest::Active(r) => listed(self.out.push_encoder(r)),
            AnyRequest::Resumed(r) => listed(self.out.push_encoder(r)),
            AnyRequest::Paused(r) => listed(self.out.push_encoder(r)),
            AnyRequest::Recompute(r) => listed(self.out.push_encoder(r)),
            AnyRequest::Sending(_) => panic!("{}", super::table::NEVER_SCHEDULED),
        }
        self.budget.commit(tokens);
        self.commit_peft(slot, pages);
        self.mark(slot, Mark::SCHEDULED);
        Step::Scheduled
    }

    /// §1.7: one context request (index `i`), whole or chunked.
    fn try_context(&mut self, i: usize, pages: u32, planned: u32) -> Step {
        let slot = self.table.slot(i);
        if !self.lease_obtainable(slot) {
            // Its adapter cannot be admitted now: touch no KV (and preempt nobody) for a request whose
            // lease would be refused after the pages were found.
            self.adapter_refused(slot, false);
            return Step::Skip;
        }
        if self.draining && self.takes_new_lease(slot) {
            return Step::Skip;
        }
        let first = self.first_chunk(slot);
        let admitted = match self.cfg.chunking {
            None => self.context_whole(i, first),
            Some(_) => self.context_chunked(i, first, planned),
        };
        let a = match admitted.and_then(|a| self.attach_cross(slot, first).map(|()| a)) {
            Ok(a) => a,
            Err(step) => {
                self.roll_back_context(slot, first);
                return step;
            }
        };
        // KV is in place: the type-state transition takes the lease (first chunk, replay, resume).
        if !self.take_ownership(slot) {
            self.roll_back_context(slot, first);
            return Step::Skip;
        }
        match self.table.entry(slot).held() {
            AnyRequest::Active(r) => listed(self.out.push_context(r, a.chunk, a.last)),
            AnyRequest::Resumed(r) => listed(self.out.push_context(r, a.chunk, a.last)),
            _ => panic!("an admitted context request owns active KV and its lease"),
        }
        self.budget.commit(a.charged);
        self.charge_time(slot, a.chunk);
        self.commit_peft(slot, pages);
        self.mark(slot, Mark::SCHEDULED);
        self.adapter_waits[slot as usize] = 0;
        Step::Scheduled
    }

    /// A request was refused its adapter this pass. Under a fair policy, once the first request the
    /// pass refused (the most deserving, in the policy's order) has waited `drain_after` passes, and
    /// while lease holders pin adapters, admissions drain: no later waiting request takes a new lease,
    /// so the device's adapters come free for it as their requests finish. `device`: refused by the
    /// device cache (priority's record: a lease holder may yield); else by the adapter backend (its
    /// host tier: a yield would leave the holder paused on the host copy, freeing nothing), which only
    /// a service class claims.
    fn adapter_refused(&mut self, slot: u16, device: bool) {
        if device {
            self.note_blocked(slot, super::priority::Need::Adapter);
        } else {
            self.note_claim(slot, super::priority::Need::Adapter);
        }
        let waited = &mut self.adapter_waits[slot as usize];
        *waited = waited.saturating_add(1);
        let first = !core::mem::replace(&mut self.refused_one, true);
        let after = self.cfg.drain_after;
        // Draining helps only while lease holders pin adapters that will come free.
        let pinned = self.desk.pinned_pages() > 0;
        if first
            && pinned
            && self.cfg.admission.drains()
            && after > 0
            && u32::from(*waited) >= after
        {
            self.draining = true;
        }
    }

    /// Admitting the request would start new work on an adapter: a waiting LoRA request's first
    /// chunk. (A suspended one owns KV: holding it back could wedge the pool; a replay's is rare.)
    fn takes_new_lease(&self, slot: u16) -> bool {
        let e = self.table.entry(slot);
        e.task().is_some() && e.ownership() == crate::request::Ownership::Waiting
    }

    /// The pass has put a request's KV in place: its type-state takes ownership — (1) admission of a
    /// first chunk, (6) replay after a recompute pause, (3) resume of a suspended one — each acquiring
    /// the lease. Returns whether it now owns its KV; if the lease was refused it keeps its old state.
    pub(crate) fn take_ownership(&mut self, slot: u16) -> bool {
        if matches!(self.table.entry(slot).held(), AnyRequest::Paused(_)) {
            return self.resume(slot, KvReturn::Context);
        }
        let (kv, desk) = (&mut *self.kv, &mut *self.desk);
        self.table.transition(slot, |held| match held {
            AnyRequest::Waiting(w) => match w.admit(kv, desk) {
                Ok(a) => (a.into(), true),
                Err(x) => (x.request.into(), false),
            },
            AnyRequest::Recompute(rc) => match rc.replay(kv, desk) {
                Ok(a) => (a.into(), true),
                Err(x) => (x.request.into(), false),
            },
            on_gpu @ (AnyRequest::Active(_) | AnyRequest::Resumed(_)) => (on_gpu, true),
            paused @ AnyRequest::Paused(_) => (paused, false),
            AnyRequest::Sending(_) => panic!("{}", super::table::NEVER_SCHEDULED),
        })
    }

    /// A failed first chunk releases whatever cache it got and is rewound (it keeps no reuse claim); a
    /// suspended later chunk whose KV came back without being scheduled is suspended again, and marked
    /// as the active candidate upstream leaves it (`resuspended.rs`).
    pub(crate) fn roll_back_context(&mut self, slot: u16, first: bool) {
        let e = self.table.entry(slot);
        let r = KvRef {
            slot,
            id: e.spec().id,
        };
        let paused = matches!(e.held(), AnyRequest::Paused(_));
        if first {
            if self.kv.cache(r).exists() {
                self.kv.free(r);
            }
            if e.spec().position != 0 {
                self.table.edit(slot, |e| e.spec_mut().position = 0);
            }
            self.table.set_headroom(slot, 0);
        } else if paused {
            // Difference 3: suspended again where upstream leaves it resumed (`resuspended.rs`).
            let resumed = self.kv.cache(r).is_active();
            if resumed {
                self.kv.suspend(r);
            }
            self.note_resuspended(slot, resumed);
        }
    }

    /// EQUAL_PROGRESS (C++ micro-batch scheduler): before admission, one unit at a time round-robin over
    /// the chunked contexts until the budget left after phase 1 is used; each request's plan is stored
    /// with its pending entry.
    pub(crate) fn plan_equal_progress(&mut self, unit: u32) {
        debug_assert!(self.no_span(), "runs apply under FCFS chunking only");
        let Some(left) = self.budget.remaining() else {
            for k in 0..self.pending.len() {
                let s = self
                    .table
                    .entry(self.table.slot(self.pending[k].index as usize))
                    .spec();
                self.pending[k].planned = s.prompt - s.position;
            }
            return;
        };
        self.plan_round_robin(0, unit, left);
        debug_assert!(self
            .cfg
            .chunking
            .is_some_and(|c| c.policy == ChunkPolicy::EqualProgress));
    }

    /// A context phase 2 did not schedule gave its units back: the contexts from index `from` on are
    /// planned again over the budget left, so the units a skipped context was planned (its adapter
    /// refused, admissions closed, a prefix skip…) go to those after it instead of to no one. C++ sizes
    /// only the contexts its capacity scheduler admitted; without this, a context planned less than a
    /// unit behind a skipped one never ran, while the skipped one waited for it (deliberate difference 9).
    fn replan_equal_progress(&mut self, from: usize) {
        let (Some(c), Some(left)) = (self.cfg.chunking, self.budget.remaining()) else {
            return;
        };
        debug_assert!(self.no_span(), "runs apply under FCFS chunking only");
        for k in from..self.pending.len() {
            self.pending[k].planned = 0;
        }
        self.plan_round_robin(from, c.unit, left);
    }

    /// The round robin of EQUAL_PROGRESS over the pending entries from index `from` on: `unit` tokens
    /// more to each context per round (its remainder when less) while the `left` budget holds them.
    fn plan_round_robin(&mut self, from: usize, unit: u32, mut left: u32) {
        let maxctx = self.cfg.max_context_length;
        loop {
            let mut progressed = 0u32;
            for k in from..self.pending.len() {
                let s = self
                    .table
                    .entry(self.table.slot(self.pending[k].index as usize))
                    .spec();
                if s.phase != Phase::ContextInit {
                    continue;
                }
                let remaining = s.prompt - s.position;
                let past = self.pending[k].planned;
                let actual = (past + unit).min(remaining);
                let inc = actual - past;
                if inc == 0 || inc > left || maxctx.is_some_and(|m| actual > m) {
                    continue;
                }
                self.pending[k].planned = actual;
                left -= inc;
                progressed += inc;
            }
            if progressed == 0 {
                break;
            }
        }
    }
}
