//! The scheduler: the request table, its public API, and the scheduling pass — one file per rule of
//! spec §1:
//!
//! | file | what |
//! |---|---|
//! | `table.rs` | the table: typed ownership, hot records, arrival order, id index; `hot.rs`: the hot record |
//! | `pass.rs` | the [`PassStats`] and the `Pass` value: per-pass state, the algorithm in a few lines |
//! | `marks.rs` | what a pass did to each request, stamped so that no pass clears every slot |
//! | `generation.rs` | phase 1: the decode step (fast case first), §1.4–§1.5 |
//! | `victims.rs` | the generation ladder: eviction, recompute pause, self-eviction; §1.15 predicates |
//! | `context.rs` | phase 2: deferred contexts and encoders, ownership on admission, roll-back |
//! | `chunking.rs` | preparing, sizing and resizing a context chunk, §1.7 |
//! | `preempt.rs` | context-side preemption, §1.8 |
//! | `deadlock.rs` | deadlock detection and the remedies before a stall counts, §1.12 |
//! | `plan.rs` | the adapter plan: PEFT page budget and distinct adapters |
//! | `sort.rs` | the LoRA sort, §1.13 |
//! | `refusal_mark.rs` | a waiting first chunk's own refusal, remembered: skipped while it stands |
//! | `span.rs` | the refused run deferred whole by phase 1: the pending list reads it where it stands |
//! | `admission.rs` | the admission order beyond the reference, and the drain |
//! | `priority.rs` | priority that preempts: the blocked request, its victim, what it holds back |
//! | `classes.rs` | service classes: claims on a class's share, borrowers that yield, holds |
//! | `thrash.rs` | the thrash guard: new requests and younger replays held while a thrashing one waits to replay |
//! | `step_time.rs` | a step budget in time: chunks capped by the cost model |
//! | `checks.rs` | what submission and `update` refuse: sizes, multimodal runs, a LoRA request beside its adapter |
//! | `failed_loads.rs` | the KV connector at the pass boundary: failed or timed-out loads recompute |
//!
//! Its public API, beyond the engine's loop kept here, is grouped by what it serves: `requests.rs`
//! (submission, [`Adopt`]ion, marks, update, removal), `adapters.rs` (registering and reloading adapters,
//! their evictions and host-copy changes), `inspection.rs` (configuration, requests, fingerprint, check),
//! `reset.rs` (the prefix cache reset), `fork.rs` (a child on its parent's pages: parallel sampling,
//! beam search) and `transfer.rs` (the disaggregated ends).
//!
//! Every resource change goes through a type-state transition of [`crate::request`], so the PEFT
//! lifecycle of DESIGN.md §3 holds by construction.
//!
//! The engine's loop: [`Scheduler::schedule`] fills an output; [`Scheduler::ensure_batch`] makes its
//! adapters resident; [`Scheduler::take_moves`] hands the page moves to the copy engine (and settles
//! the resumed requests, whose pages those moves bring up); the step runs;
//! [`Scheduler::complete_step`] advances what it processed; finished requests are
//! [`removed`](Scheduler::remove).
//!
//! Invariants between calls (checked by [`Scheduler::check`] and the property tests): the table's
//! (`table.rs`); per task, live leases = the adapter cache's device refcount; no suspended or
//! recompute-paused request holds a lease or active KV.

mod adapters;
mod admission;
mod build;
mod checks;
mod chunking;
mod classes;
mod context;
mod cross;
mod deadlock;
mod delta;
mod failed_loads;
mod fork;
mod generation;
mod hot;
mod incremental;
mod inspection;
mod marks;
mod multimodal;
mod pass;
mod plan;
mod preempt;
mod prefix_skip;
mod priority;
mod refusal_mark;
mod refused_run;
mod requests;
mod reset;
mod resuspended;
mod sort;
mod span;
mod step_time;
mod table;
mod thrash;
mod transfer;
mod trial;
mod victims;

#[cfg(test)]
mod tests;

pub use pass::PassStats;
pub use requests::Adopt;
pub use table::{Entry, Handle};
pub use transfer::{TransferEnd, TransferStats};

use crate::adapter::PeftBackend;
use crate::config::Config;
use crate::error::{Error, PeftError};
use crate::kv::{
    AdapterPaging, CrossPool, DraftPairing, KvBackend, KvCaps, KvRef, PageMove, PrefixReuse,
};
use crate::lease::AdapterDesk;
use crate::output::SchedulerOutput;
use crate::phase::Phase;
use crate::request::{MovesTaken, Ownership};
use crate::storage::{FixedList, Inline, Storage};

use pass::{Pass, Scratch};
use table::{AnyRequest, Table};

/// The scheduler: a request table of `N` slots over a KV backend `K` and an adapter backend `P` with `T`
/// task slots, its fixed-capacity arrays where `S` keeps them (`build.rs`: [`Inline`], the default, or
/// `Boxed`; see the crate docs for where a scheduler may live).
pub struct Scheduler<K, P, const N: usize, const T: usize, S: Storage = Inline> {
    cfg: Config,
    kv: K,
    desk: AdapterDesk<P, T, S>,
    table: Table<N, S>,
    scratch: Scratch<N, T, S>,
    /// Consecutive stalled passes (the only state a pass leaves for the next, spec §1.1).
    stall: u32,
    /// The requests the last pass refused a resource, under priority and for a service class
    /// (`priority.rs`, `classes.rs`).
    blocked: priority::Records,
    /// Passes run; the output of the last one carries this number.
    passes: u64,
    /// The last pass whose step was completed.
    completed: u64,
    last: PassStats,
    /// The VTC counters (kept under [`crate::config::Admission::Vtc`] only).
    clients: admission::Clients<N, S>,
    /// Consecutive passes each slot's request was refused its adapter (fair admission's drain).
    adapter_waits: S::Array<u16, N>,
    /// Transfers ended so far (`transfer.rs`; the in-flight counts are left 0 here).
    transfer_ends: TransferStats,
    /// The incremental pass is on (`incremental.rs`; the default).
    incremental: bool,
    /// The last pass left a steady decode batch and nothing a pass reads changed since.
    steady: bool,
    /// Passes that replayed the last one.
    replays: u64,
    /// The last full pass (not incremental).
    last_full: u64,
    /// The batch delta (`delta.rs`): the pass of the last call, the batch it led to, and where each
    /// slot's request was in it.
    delta_pass: u64,
    shown: S::List<crate::output::Listed, N>,
    seen: S::Array<crate::delta::Seen, N>,
    /// The waiting first chunks that ended the last pass refused for pages (`refused_run.rs`).
    run: refused_run::RefusedRun,
}

impl<K, P, const N: usize, const T: usize, S: Storage> Drop for Scheduler<K, P, N, T, S> {
    /// Tearing the scheduler down takes its backends with it: every request's resources go too.
    fn drop(&mut self) {
        self.table.abandon_all();
    }
}

impl<K: KvBackend, P: PeftBackend, const N: usize, const T: usize, S: Storage>
    Scheduler<K, P, N, T, S>
{
    /// An encoder request the encoder window would admit, and no cross pool for it (spec §1.6 step 7,
    /// checked before the pass does anything).
    fn encoder_without_cross_pool(&self) -> bool {
        self.cfg.window == crate::config::Window::Encoder
            && self.kv.caps().cross.is_none()
            && self.table.order().iter().any(|&s| {
                let e = self.table.entry(s);
                e.spec().phase == Phase::EncoderInit && !e.sits_out()
            })
    }

    /// The arrival order is by priority, then arrival (`priority.rs`).
    fn by_priority(&self) -> bool {
        self.cfg.admission == crate::config::Admission::Priority
    }

    /// A checked request enters the table, waiting, at its place in the arrival order.
    fn enter(
        &mut self,
        spec: &crate::request::RequestSpec,
        task: Option<crate::adapter::TaskRef>,
    ) -> Result<Handle, Error> {
        let slots = self.kv.limits().slots;
        self.table
            .insert(spec.clone(), task, slots, self.by_priority())
    }

    /// VTC keeps counters.
    fn vtc(&self) -> bool {
        matches!(self.cfg.admission, crate::config::Admission::Vtc { .. })
    }

    /// VTC: the completed step's service, charged to its clients (context tokens at the input weight,
    /// generated tokens — beam and drafts — at the output weight).
    fn charge_service(&mut self, out: &SchedulerOutput<N, S>, input: u32, output: u32) {
        for c in out.context() {
            let l = c.listed;
            if self.table.is_live(l.slot(), l.handle().version()) {
                let service = u64::from(c.tokens) * u64::from(input);
                self.clients.charge(l.slot(), service);
            }
        }
        for l in out.generation() {
            if self.table.is_live(l.slot(), l.handle().version()) {
                let s = self.table.entry(l.slot()).spec();
                let service = u64::from(s.beam + s.draft) * u64::from(output);
                self.clients.charge(l.slot(), service);
            }
        }
    }

    /// Runs one scheduling pass into `out` (spec §1.2; the algorithm is `pass.rs`). Given the last
    /// pass's own output while its steady decode batch stands, the pass is incremental
    /// (`incremental.rs`): only the KV calls are made again, and the output keeps its lists.
    pub fn schedule(&mut self, out: &mut SchedulerOutput<N, S>) -> Result<(), Error> {
        if self.encoder_without_cross_pool() {
            return Err(Error::CrossPoolRequired);
        }
        self.passes += 1;
        self.sync_loads();
        let mut replayed = None;
        if self.may_replay(out) {
            match self.replay() {
                None => {
                    out.replayed(self.passes);
                    self.replays += 1;
                    return Ok(());
                }
                Some(refused) => replayed = Some(refused),
            }
        }
        self.last_full = self.passes;
        let Scratch {
            marks,
            clock,
            pending,
            plan,
            listed,
            chunks,
            contributed,
            client_sums,
            pending_slots,
            shorts,
            refusals,
        } = &mut self.scratch;
        let parts = pass::Parts {
            marks,
            clock,
            contributed,
            pending,
            plan,
            clients: &self.clients,
            client_sums,
            adapter_waits: &mut self.adapter_waits,
            failed_loads: pending_slots,
            run: &mut self.run,
            shorts,
            refusals,
            run_enabled: self.incremental,
            blocked: &mut self.blocked,
        };
        let pass = Pass::begin(
            &self.cfg,
            &mut self.kv,
            &mut self.desk,
            &mut self.table,
            parts,
            out,
        );
        let (stats, verdict, decoded) = pass.run((listed, chunks), &mut self.stall, replayed);
        out.set_pass(self.passes);
        self.last = stats;
        self.settle_steady(out, verdict.is_ok() && stats == PassStats::NONE, decoded);
        verdict
    }

    /// Makes the scheduled batch's adapters resident on the device; `out.adapter_loads()` lists the
    /// copies. With the pass's adapter page budget this never fails for a batch the pass produced.
    ///
    /// With unified paging every batch adapter is resident already (its leases pin it in the KV
    /// pool); the loads are the adapters the pool placed since the engine last looked.
    pub fn ensure_batch(&mut self, out: &mut SchedulerOutput<N, S>) -> Result<(), PeftError> {
        let (plan, loads) = out.plan_and_loads();
        loads.clear();
        self.desk.ensure_batch(plan, &mut |t| {
            let pushed = loads.push(t);
            assert!(pushed.is_ok(), "a load per planned adapter");
        })?;
        let desk = &self.desk;
        if let Some(a) = self.kv.adapters() {
            a.take_adapter_placements(&mut |slot| {
                // A placed adapter is pinned by a lease (of one of the `T` task slots): at most one
                // per live request.
                if usize::from(slot) < T {
                    let pushed = loads.push(desk.task_ref(slot));
                    assert!(pushed.is_ok(), "a load per pinned adapter");
                }
            });
        }
        Ok(())
    }

    /// Hands the page moves logged since the last call to the copy engine (in order; the log is then
    /// empty), and settles every resumed request: its pages come up with these moves, ordered before its
    /// step, so it is an ordinary active request from now on (arrow 5 of [`crate::request`]).
    pub fn take_moves(&mut self) -> &[PageMove] {
        if self.table.resumed() > 0 {
            self.settle_resumed(&MovesTaken::mint());
        }
        self.kv.take_moves()
    }

    /// The KV events the prefix cache logged since the last call, in order ([`crate::kv_events`]:
    /// empty without a prefix cache or an event log); what the engine publishes to a KV-aware router.
    pub fn take_kv_events(&mut self) -> &[crate::kv_events::KvEvent] {
        match self.kv.prefix() {
            Some(p) => p.take_kv_events(),
            None => &[],
        }
    }

    fn settle_resumed(&mut self, moves: &MovesTaken) {
        let slots = &mut self.scratch.pending_slots;
        self.table.take_resumed_slots(slots);
        for &slot in slots.iter() {
            // A vacant slot's hot record is the default one (waiting): only live resumed ones settle.
            if self.table.hot(slot).ownership() != Ownership::Resumed as u8 {
                continue;
            }
            self.table.transition(slot, |held| match held {
                AnyRequest::Resumed(r) => (r.settle(moves).into(), ()),
                other => (other, ()),
            });
        }
        assert_eq!(self.table.resumed(), 0, "every resumed request settled");
    }

    /// The page moves of one pool of the requests' caches (a [`crate::kv_set::KvSet`]'s draft and cross
    /// pools beside the target) since the last call, in order; the engine copies them with
    /// [`Scheduler::take_moves`]'s before the step. The target's are [`Scheduler::take_moves`] itself.
    pub fn take_pool_moves(&mut self, pool: crate::kv::Pool) -> &[PageMove] {
        match pool {
            crate::kv::Pool::Target => self.take_moves(),
            crate::kv::Pool::Draft => match self.kv.draft() {
                Some(d) => d.take_draft_moves(),
                None => &[],
            },
            crate::kv::Pool::Cross => match self.kv.cross() {
                Some(x) => x.take_cross_moves(),
                None => &[],
            },
        }
    }

    /// Speculative decoding: the engine verified the request's last step and rejected `tokens` of its
    /// draft tokens; its caches (target and a joint draft pool) give their slots back. Under
    /// GUARANTEED_NO_EVICT the slots stay (the admission reserved the request's whole life). Refused
    /// ([`Error::StaleHandle`], nothing changes) for a handle that names no live request.
    pub fn rewind(&mut self, h: Handle, tokens: u32) -> Result<(), Error> {
        let e = self.table.get(h).ok_or(Error::StaleHandle)?;
        if self.cfg.policy == crate::config::CapacityPolicy::GuaranteedNoEvict {
            return Ok(());
        }
        let r = KvRef {
            slot: h.index(),
            id: e.spec().id,
        };
        self.kv.rewind(r, tokens);
        Ok(())
    }

    /// Completes the step the last pass scheduled, as an engine does once it ran: a context chunk
    /// advances the position (a fully processed prompt moves to `GENERATION_IN_PROGRESS`, or, for a
    /// context-only request of disaggregated serving, starts sending its KV: `transfer.rs`); a
    /// recompute-paused request is reset to a first-chunk `CONTEXT_INIT` that replays its prefill; a
    /// generation step of a request whose transfer completed makes it `GENERATION_IN_PROGRESS`.
    ///
    /// Refused ([`Error::StaleOutput`], nothing changes) for an output that is not the last pass's, or
    /// whose step was completed already. An entry whose request was removed after the pass is skipped.
    pub fn complete_step(&mut self, out: &SchedulerOutput<N, S>) -> Result<(), Error> {
        if out.pass() != self.passes || self.completed == self.passes {
            return Err(Error::StaleOutput);
        }
        self.completed = self.passes;
        // A steady batch's step changes nothing a pass reads: its output holds decode steps of
        // GENERATION_IN_PROGRESS requests only (`incremental.rs`).
        debug_assert!(
            !self.steady || (out.context().is_empty() && out.recompute_paused().is_empty())
        );
        if let crate::config::Admission::Vtc {
            input_weight,
            output_weight,
        } = self.cfg.admission
        {
            self.charge_service(out, input_weight, output_weight);
        }
        for c in out.context() {
            let l = c.listed;
            if !self.table.is_live(l.slot(), l.handle().version()) {
                continue;
            }
            let (id, position, send) = self.table.edit(l.slot(), |e| {
                let s = e.spec_mut();
                s.position = s.position.saturating_add(c.tokens).min(s.prompt);
                let done = s.position >= s.prompt;
                let send = done && s.context_only;
                if done && !send {
                    s.phase = Phase::GenerationInProgress;
                }
                (s.id, s.position, send)
            });
            // The chunk's blocks are computed: they may join the prefix cache.
            let r = KvRef { slot: l.slot(), id };
            if let Some(p) = self.kv.prefix() {
                p.commit(r, position);
            }
            if send {
                self.start_send(l.slot());
            }
        }
        for l in out.generation() {
            let live = self.table.is_live(l.slot(), l.handle().version());
            if live
                && self.table.entry(l.slot()).spec().phase == Phase::DisaggGenerationTransComplete
            {
                self.table.edit(l.slot(), |e| {
                    e.spec_mut().phase = Phase::GenerationInProgress;
                });
            }
        }
        for l in out.recompute_paused() {
            if !self.table.is_live(l.slot(), l.handle().version()) {
                continue;
            }
            self.table.edit(l.slot(), |e| {
                let s = e.spec_mut();
                s.phase = Phase::ContextInit;
                s.position = 0;
            });
        }
        Ok(())
    }
}

/// A hybrid-attention model's scheduler: its KV groups' move logs.
impl<K, P, const G: usize, const N: usize, const T: usize, S>
    Scheduler<crate::kv_groups::PoolGroups<K, G>, P, N, T, S>
where
    K: crate::kv_groups::GroupPool,
    P: PeftBackend,
    S: Storage,
{
    /// The page moves KV group `g` logged since the last call, in order (group 0's are
    /// [`Scheduler::take_moves`], which also settles the resumed requests: call it first); the engine
    /// copies every group's before the step. Empty for a group that does not exist.
    pub fn take_group_moves(&mut self, g: usize) -> &[PageMove] {
        if g == 0 {
            return self.take_moves();
        }
        self.kv.take_group_moves(g)
    }
}

/// A hybrid recurrent model's scheduler: its attention groups' move logs, its state moves and the
/// snapshots to write ([`crate::kv_groups::Hybrid`]).
impl<K, P, const G: usize, const C: usize, const N: usize, const T: usize, S, H>
    Scheduler<crate::kv_groups::Hybrid<K, G, C, H>, P, N, T, S>
where
    K: crate::kv_groups::GroupPool,
    P: PeftBackend,
    S: Storage,
    H: Storage,
{
    /// The page moves attention group `g` logged since the last call, as for KV groups
    /// ([`Scheduler::take_moves`] first).
    pub fn take_group_moves(&mut self, g: usize) -> &[PageMove] {
        if g == 0 {
            return self.take_moves();
        }
        self.kv.take_group_moves(g)
    }

    /// The state moves logged since the last call, in order: run after the page moves, before the
    /// step.
    pub fn take_state_moves(&mut self) -> &[crate::state_pool::StateMove] {
        self.kv.take_state_moves()
    }

    /// The snapshots the step writes ([`crate::state_pool::Capture`]).
    pub fn take_captures(&mut self) -> &[crate::state_pool::Capture] {
        self.kv.take_captures()
    }
}
