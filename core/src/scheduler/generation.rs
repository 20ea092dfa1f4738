//! Phase 1 (spec §1.4, §1.5): generation and disaggregated-generation-init requests in arrival order,
//! with a shrinking end index; context and encoder requests are deferred to phase 2.
//!
//! One decode path: its first branch is the common case — an active, not in-flight
//! `GENERATION_IN_PROGRESS` request, read from its 16-byte hot record, whose KV step succeeds — and
//! every other request takes the general rule order of §1.4 below it. A refused KV step goes to the
//! ladder (`victims`).
//!
//! Invariants: a scheduled generation request owns active KV and its lease (`Active` or `Resumed`) and
//! was charged its token cost (beam + drafts); the first scheduled request fixes the pass's beam; a
//! request whose adapter would not fit stops the phase (§1.4 step 7) before any KV call.

use crate::adapter::PeftBackend;
use crate::config::CapacityPolicy;
use crate::ids::TaskSlot;
use crate::kv::{AdapterPaging, KvBackend, KvCaps, KvRef};
use crate::phase::Phase;
use crate::request::KvReturn;
use crate::storage::{FixedList, Storage};

use super::hot::{READY, READY_MASK};
use super::marks::Mark;
use super::pass::{listed, Pass, Step};
use super::table::AnyRequest;
use crate::narrow::u16_of;

/// A decode step whose one KV attempt was refused: what the ladder needs to finish it.
#[derive(Clone, Copy)]
pub(crate) struct Refusal {
    pub(crate) grow: u32,
    pub(crate) after: u32,
    pub(crate) tokens: u32,
    pub(crate) beam: u32,
}

/// Why a run of decode steps ended.
enum Exit {
    /// The end index was reached.
    End,
    /// The phase ends here (request or token budget).
    Stop,
    /// The request's one KV attempt was refused: the ladder is next.
    Refused(Refusal),
    /// Not an active decode step: the general rule order handles it.
    Other,
}

impl<K: KvBackend, P: PeftBackend, const N: usize, const T: usize, S: Storage>
    Pass<'_, K, P, N, T, S>
{
    /// Phase 1 over the arrival order: runs of decode steps, and the general rules between them;
    /// from arrival index `start`, where a replay (`incremental.rs`) was refused (`refused`), the
    /// requests before it listed already.
    pub(crate) fn generation_phase(&mut self, start: usize, mut refused: Option<Refusal>) {
        let mut i = start;
        while i < self.end {
            let slot = self.table.slot(i);
            let exit = if let Some(r) = refused.take() {
                Exit::Refused(r)
            } else if self.table.hot(slot).code & READY_MASK == READY {
                let (at, exit) = self.decode_run(i);
                i = at;
                exit
            } else {
                Exit::Other
            };
            let step = match exit {
                Exit::End => break,
                Exit::Stop => Step::Stop,
                Exit::Refused(r) => self.decode_refused(i, self.table.slot(i), r),
                Exit::Other if self.table.hot(self.table.slot(i)).deferred() => self.defer(&mut i),
                Exit::Other => self.general_step(i, self.table.slot(i)),
            };
            if step == Step::Stop {
                break;
            }
            i += 1;
        }
        listed(self.plan.enter_counted(self.desk, self.out));
    }

    /// The common case first, in a loop of its own: consecutive active, not in-flight
    /// `GENERATION_IN_PROGRESS` requests from index `start`, each read from its 16-byte hot record with
    /// the budgets in registers — the same checks in the same order as the general path (§1.4 step 4,
    /// §1.5 steps 1–3). A lease holder's adapter was counted when the pass began: its step only counts
    /// the request for the LoRA sort. Returns where the run stopped, and why.
    #[inline(never)]
    fn decode_run(&mut self, start: usize) -> (usize, Exit) {
        let (order, hot, held) = self.table.decode_view();
        let (kv, out, plan, marks) = (
            &mut *self.kv,
            &mut *self.out,
            &mut *self.plan,
            &mut *self.marks,
        );
        let stamp = self.stamp;
        let (used, cap, requests, max_requests) = self.budget.raw();
        // What the batch still takes, counted down: requests, and tokens (one register each).
        let mut room = max_requests.saturating_sub(requests);
        let mut tokens_left = cap.saturating_sub(used);
        let mut beam = self.beam;
        let mut i = start;
        let exit = 'run: {
            for &slot in &order[start..self.end] {
                let h = &mut hot[usize::from(slot)];
                if h.code & READY_MASK != READY {
                    break 'run Exit::Other;
                }
                if room == 0 {
                    break 'run Exit::Stop;
                }
                // No overflow: admission and `update` keep beam (at least 1) + drafts within u32.
                let tokens = h.beam + h.draft;
                if u64::from(tokens) > tokens_left {
                    break 'run Exit::Stop;
                }
                if h.beam != beam && beam != 0 {
                    i += 1; // §1.5 step 2: a beam mismatch skips
                    continue;
                }
                // Under GUARANTEED_NO_EVICT the admission reserved KV to completion: a step inside the
                // reservation asks the backend for no new tokens.
                let step = h.draft + 1;
                let grow = step.saturating_sub(h.headroom);
                let after = h.headroom.saturating_sub(step);
                let Some(AnyRequest::Active(r)) = &held[usize::from(slot)] else {
                    debug_assert!(false, "a READY hot record holds an Active request");
                    break 'run Exit::Other;
                };
                if !kv.try_allocate_generation(r.kv_ref(), grow) {
                    let beam = h.beam;
                    break 'run Exit::Refused(Refusal {
                        grow,
                        after,
                        tokens,
                        beam,
                    });
                }
                listed(out.push_generation(r));
                plan.count_decode(h.bucket);
                h.headroom = after;
                stamp.set(&mut marks[usize::from(slot)], Mark::SCHEDULED);
                tokens_left -= u64::from(tokens);
                room -= 1;
                beam = h.beam;
                i += 1;
            }
            Exit::End
        };
        let charged = cap.saturating_sub(used) - tokens_left;
        let scheduled = max_requests.saturating_sub(requests) - room;
        self.budget.set_raw(used + charged, requests + scheduled);
        self.decoded += scheduled as usize;
        self.beam = beam;
        (i, exit)
    }

    /// An active request whose decode step was refused: the ladder (§1.5 steps 5–8).
    #[cold]
    #[inline(never)]
    fn decode_refused(&mut self, i: usize, slot: u16, r: Refusal) -> Step {
        if let Some(refused) = self.generation_ladder(i, r.grow) {
            return refused;
        }
        self.scheduled_generation(slot, r.after, 0);
        self.budget.commit(r.tokens);
        self.beam = r.beam;
        Step::Scheduled
    }

    /// [`Pass::general_step`] for a context or encoder request, from its hot record alone (a queue of
    /// waiting requests costs a record read each, not an entry's): the same checks in the same order.
    /// The last pass's refused run, met at its first member, is deferred whole (`span.rs`): `i` moves
    /// to its last.
    fn defer(&mut self, i: &mut usize) -> Step {
        let slot = self.table.slot(*i);
        let phase = self.table.hot(slot).phase;
        debug_assert!(!self.table.entry(slot).sits_out());
        if self.marked(slot, Mark::RECOMPUTED) {
            return Step::Skip;
        }
        if self.budget.requests_full() {
            self.batch_full();
            return Step::Stop;
        }
        if !self.cfg.window.contains(phase) {
            return Step::Skip;
        }
        if slot == self.span_first {
            if let Some(count) = self.defer_span(*i) {
                *i += count - 1;
                return Step::Skip;
            }
        }
        self.push_pending(*i)
    }

    /// Defers the request at arrival index `i` to phase 2.
    fn push_pending(&mut self, i: usize) -> Step {
        let deferred = self.pending.push(super::pass::Pending {
            index: u16_of(i),
            planned: 0,
            key: 0,
        });
        assert!(deferred.is_ok(), "one pending entry per live request");
        Step::Skip
    }

    /// The rule order of §1.4 for everything but the first branch's case.
    #[inline(never)]
    fn general_step(&mut self, i: usize, slot: u16) -> Step {
        let e = self.table.entry(slot);
        if self.marked(slot, Mark::RECOMPUTED) || self.marked(slot, Mark::PREEMPTED) || e.sits_out()
        {
            return Step::Skip;
        }
        let phase = e.spec().phase;
        if phase == Phase::DisaggGenerationInit {
            return self.disagg_init(slot);
        }
        if self.budget.requests_full() {
            self.batch_full();
            return Step::Stop;
        }
        if !self.cfg.window.contains(phase) {
            return Step::Skip;
        }
        if phase == Phase::EncoderInit || phase == Phase::ContextInit {
            // Checked above already ([`Pass::defer`]'s checks, in the same order).
            return self.push_pending(i);
        }
        let (on_gpu, task, id) = (e.ownership().on_gpu(), e.task(), e.spec().id);
        if self.restrains() && (self.held_back(slot) || self.displaces(i, slot)) {
            return Step::Skip;
        }
        // A lease holder's adapter is counted: nothing to add. Another must fit (§1.4 step 7).
        let pages = match task {
            Some(t) if !on_gpu => self.plan.pages_needed(self.desk, id, t),
            _ => Some(0),
        };
        let Some(pages) = pages else {
            return Step::Stop;
        };
        self.try_generation(i, slot, pages)
    }

    /// §1.5 for a request the first branch did not take: a suspended one (its KV comes back through
    /// the allocation), one with no cache, or an active one in another generation phase.
    fn try_generation(&mut self, i: usize, slot: u16, pages: u32) -> Step {
        let h = self.table.hot(slot);
        let tokens = h.beam + h.draft;
        if !self.budget.fits(tokens) {
            return Step::Stop;
        }
        if self.beam != 0 && self.beam != h.beam {
            return Step::Skip;
        }
        if !self.lease_obtainable(slot) {
            // A suspended request whose lease would be refused: evicting others for its KV is futile.
            return Step::Skip;
        }
        let step = h.draft.saturating_add(1);
        let grow = step.saturating_sub(h.headroom);
        let after = h.headroom.saturating_sub(step);
        if !self.allocate_generation(slot, grow) {
            if let Some(refused) = self.generation_ladder(i, grow) {
                return refused;
            }
        }
        self.scheduled_generation(slot, after, pages);
        self.budget.commit(tokens);
        self.beam = h.beam;
        Step::Scheduled
    }

    /// Lists a generation request whose KV step succeeded, marks it and commits its adapter.
    pub(crate) fn scheduled_generation(&mut self, slot: u16, headroom: u32, pages: u32) {
        self.table.set_headroom(slot, headroom);
        match self.table.entry(slot).held() {
            AnyRequest::Active(r) => listed(self.out.push_generation(r)),
            AnyRequest::Resumed(r) => listed(self.out.push_generation(r)),
            _ => panic!("a scheduled generation request owns active KV and its lease"),
        }
        let task = self.table.entry(slot).task();
        if let Some(t) = task {
            self.commit_task(t, pages);
            self.plan.count_generation(t.slot);
        } else if self.table.hot(slot).bucket == TaskSlot::NONE {
            self.plan.plain += 1;
        } else {
            self.plan.unbucketed += 1;
        }
        self.mark(slot, Mark::SCHEDULED);
    }

    /// One allocation attempt (§1.5 step 3). A suspended request whose KV comes back is resumed: it
    /// re-acquires its lease before it is listed.
    pub(crate) fn allocate_generation(&mut self, slot: u16, grow: u32) -> bool {
        let e = self.table.entry(slot);
        let r = KvRef {
            slot,
            id: e.spec().id,
        };
        match e.held() {
            AnyRequest::Active(_) | AnyRequest::Resumed(_) => {
                self.kv.try_allocate_generation(r, grow)
            }
            AnyRequest::Paused(_) => {
                self.kv.try_allocate_generation(r, grow) && self.resume(slot, KvReturn::Generation)
            }
            AnyRequest::Waiting(_) | AnyRequest::Recompute(_) => {
                // No cache: the backend refuses (the call is still made, as upstream).
                if self.kv.try_allocate_generation(r, grow) {
                    self.kv.revert_allocate_generation(r);
                }
                false
            }
            AnyRequest::Sending(_) => panic!("{}", super::table::NEVER_SCHEDULED),
        }
    }

    /// (3) A suspended request whose KV came back (`how`) is resumed: fresh lease, listed in `resumed`.
    /// If the lease is refused the KV is put back and the request stays suspended.
    pub(crate) fn resume(&mut self, slot: u16, how: KvReturn) -> bool {
        let (kv, desk, out) = (&mut *self.kv, &mut *self.desk, &mut *self.out);
        self.table.transition(slot, |held| match held {
            AnyRequest::Paused(p) => match p.resume(kv, desk, how) {
                Ok(r) => {
                    listed(out.push_resumed(&r));
                    (r.into(), true)
                }
                Err(refused) => (refused.request.into(), false),
            },
            other => (other, false),
        })
    }

    /// A request that must acquire a lease to run (it holds none) can get one, as far as the adapter
    /// backend can tell without side effects ([`PeftBackend::can_admit`]).
    ///
    /// With unified paging the KV pool must also be able to place the adapter, unless it is pinned.
    pub(crate) fn lease_obtainable(&self, slot: u16) -> bool {
        let e = self.table.entry(slot);
        match e.task() {
            Some(t) if !e.ownership().on_gpu() => {
                self.desk.backend().can_admit(t)
                    && (self.desk.leases(t.slot) > 0
                        || self.kv.caps().adapters.is_none_or(|a| {
                            a.can_pin_adapter(t.slot, self.desk.known_pages(t.slot))
                        }))
            }
            _ => true,
        }
    }

    /// §1.4 step 3: a disaggregated generation request whose transferred prompt's KV is prepared takes
    /// ownership of it (and its lease), so it decodes as an ordinary active request once the transfer
    /// completes. Bypasses the window and the request budget; uses no tokens.
    ///
    /// A PEFT shortfall skips it (the reference breaks phase 1, §1.16 #4): with pinned adapters
    /// counted (difference 1) the shortfall can be the pages of a lease holder behind it, a context
    /// request the break would never defer — nothing would run again, and a disagg-init request is no
    /// stall candidate, so silently (difference 13).
    ///
    /// Under GUARANTEED_NO_EVICT the prepared pages are an admission: they reserve what the request
    /// needs until it completes, its output included, as a first chunk's do (difference 5); the decode
    /// steps then consume that headroom. Without it two received requests could each hold their prompt
    /// and wait for ever for pages to decode into, where nothing is ever evicted.
    fn disagg_init(&mut self, slot: u16) -> Step {
        let Some(pages) = self.peft_need(slot) else {
            return Step::Skip;
        };
        let e = self.table.entry(slot);
        let cap = e.spec().prompt + e.spec().draft;
        let r = KvRef {
            slot,
            id: e.spec().id,
        };
        let existed = self.kv.cache(r).exists();
        if !(self.lease_obtainable(slot) && self.kv.prepare_disagg_gen_init(r, cap)) {
            return Step::Skip;
        }
        let Some(headroom) = self.reserve_received(slot, cap, existed) else {
            return Step::Skip;
        };
        if !self.take_ownership(slot) {
            // A refused lease: a cache it did not own before is released (a suspended one was put back).
            let paused = matches!(self.table.entry(slot).held(), AnyRequest::Paused(_));
            if !paused && self.kv.cache(r).exists() {
                self.kv.free(r);
            }
            return Step::Skip;
        }
        match self.table.entry(slot).held() {
            AnyRequest::Active(a) => listed(self.out.push_disagg(a)),
            AnyRequest::Resumed(a) => listed(self.out.push_disagg(a)),
            _ => panic!("a prepared disagg request owns its KV and its lease"),
        }
        self.table.set_headroom(slot, headroom);
        self.commit_peft(slot, pages);
        Step::Skip
    }

    /// Under GUARANTEED_NO_EVICT, the disagg request at `slot`, just prepared to `cap` tokens, reserves
    /// what it needs until it completes; `None` when refused, its cache as it was before the pass (a
    /// cache it did not have is released, a suspended one suspended again). Elsewhere nothing is
    /// reserved. Returns the tokens the cache holds beyond `cap`.
    fn reserve_received(&mut self, slot: u16, cap: u32, existed: bool) -> Option<u32> {
        if self.cfg.policy != CapacityPolicy::GuaranteedNoEvict {
            return Some(0);
        }
        let r = self.kv_ref(slot);
        let reservation = self.reservation(slot, cap);
        let granted = self.kv.resize_reserving(r, cap, reservation, false);
        if granted.is_none() {
            if matches!(self.table.entry(slot).held(), AnyRequest::Paused(_)) {
                self.kv.suspend(r);
            } else if !existed {
                self.kv.free(r);
            }
        }
        granted
    }
}
