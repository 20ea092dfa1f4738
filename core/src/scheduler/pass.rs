//! One scheduling pass: the [`Pass`] value that holds all per-pass state and dies with the pass, and the
//! algorithm of spec §1.2 in a few lines ([`Pass::run`]).
//!
//! A pass borrows the scheduler's parts (configuration, backends, table) and the output, and owns its
//! budget, frontiers and statistics; its per-slot marks, pending list, adapter plan and sort buffers live
//! in [`Scratch`], storage the scheduler keeps so that a pass allocates nothing, which the pass clears
//! when it begins. Nothing of a pass survives it except what it did to the table and the output, and the
//! statistics the scheduler reads back.
//!
//! Invariants at the end of every pass (asserted by the property tests; the cheap ones here): no request
//! appears in two output lists; the batch respects the token budget (except unchecked last-chunk drafts,
//! as upstream), the request budget and the adapter page budget; every batched request is `Active` or
//! `Resumed`; every request the pass suspended, paused or preempted is listed exactly once.

use crate::adapter::{PeftBackend, TaskRef};
use crate::budget::Budget;
use crate::config::{ChunkPolicy, Config};
use crate::error::Error;
use crate::fmt::trace;
use crate::kv::KvBackend;
use crate::lease::AdapterDesk;
use crate::output::{Chunk, Full, Listed, SchedulerOutput};
use crate::storage::{FixedList, Inline, InlineArray, Storage};

use super::admission::Clients;
use super::marks::{Clock, Mark, Marks, Stamp};
use super::plan::Plan;
use super::priority::{Holds, Records};
use super::refusal_mark::RefusalMark;
use super::refused_run::RefusedRun;
use super::span::Span;
use super::table::Table;

/// What the last pass did, beyond its output lists.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PassStats {
    /// Ordinary suspensions of other requests (victims, and the wedge breaker's).
    pub victims: u32,
    /// Self-evictions.
    pub self_evictions: u32,
    /// Destructive recompute pauses (generation side).
    pub recompute_pauses: u32,
    /// Context-side preemptions (including the deadlock remedy's).
    pub preemptions: u32,
    /// First chunks deferred behind a contributor of their first new block (prefix-aware skip).
    pub deferred: u32,
    /// Requests recompute-paused because their connector load failed or timed out.
    pub failed_loads: u32,
    /// Waiting first chunks the last pass's refused run let this pass skip (`refused_run.rs`): their
    /// trials would refuse them again, exactly.
    pub skipped: u32,
    /// Running requests that yielded to a waiting request of higher priority (`priority.rs`).
    pub yielded: u32,
    /// New requests and replays the thrash guard held (`thrash.rs`).
    pub held: u32,
}

impl PassStats {
    /// Nothing done (a scheduler before its first pass).
    pub(crate) const NONE: PassStats = PassStats {
        victims: 0,
        self_evictions: 0,
        recompute_pauses: 0,
        preemptions: 0,
        deferred: 0,
        failed_loads: 0,
        skipped: 0,
        yielded: 0,
        held: 0,
    };
}

/// A deferred context or encoder request: its arrival index and, under EQUAL_PROGRESS, its planned
/// chunk.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Pending {
    pub(crate) index: u16,
    pub(crate) planned: u32,
    /// The admission policy's sort key (`admission.rs`; unused under FCFS).
    pub(crate) key: u64,
}

/// Storage a pass uses and clears: kept by the scheduler so that a pass allocates nothing (its arrays
/// where `S` keeps them).
pub(crate) struct Scratch<const N: usize, const T: usize, S: Storage = Inline> {
    pub(crate) marks: S::Array<Marks, N>,
    /// Which marks are the pass's own (`marks.rs`).
    pub(crate) clock: Clock,
    pub(crate) pending: S::List<Pending, N>,
    pub(crate) plan: Plan<T, S>,
    pub(crate) listed: S::Array<Listed, N>,
    pub(crate) chunks: S::Array<Chunk, N>,
    /// Prefix-aware skip: the first new block keys contributed this pass.
    pub(crate) contributed: S::List<u64, N>,
    /// Slots to settle when the engine takes the page moves (outside a pass); before a pass, the
    /// slots whose connector load failed or timed out.
    pub(crate) pending_slots: S::List<u16, N>,
    /// VTC ordering: per client entry, the remaining prompts of its requests already ordered.
    pub(crate) client_sums: S::Array<u64, N>,
    /// Kept across passes: per member of the refused run, the pages it was short of
    /// (`refused_run.rs`).
    pub(crate) shorts: S::Array<u32, N>,
    /// Kept across passes: per waiting first chunk, what its last clean trial refusal read
    /// (`refusal_mark.rs`).
    pub(crate) refusals: S::Array<RefusalMark, N>,
}

impl<const N: usize, const T: usize> Scratch<N, T> {
    pub(crate) const fn new() -> Self {
        Self {
            marks: InlineArray::new([Marks::NONE; N]),
            clock: Clock::NEW,
            pending: heapless::Vec::new(),
            plan: Plan::new(),
            listed: InlineArray::new([Listed::EMPTY; N]),
            chunks: InlineArray::new([Chunk::EMPTY; N]),
            contributed: heapless::Vec::new(),
            pending_slots: heapless::Vec::new(),
            client_sums: InlineArray::new([0; N]),
            shorts: InlineArray::new([0; N]),
            refusals: InlineArray::new([RefusalMark::NONE; N]),
        }
    }
}

impl<const N: usize, const T: usize, S: Storage> Scratch<N, T, S> {
    pub(crate) fn new_in() -> Result<Self, Error> {
        Ok(Self {
            marks: S::array(|| Marks::NONE)?,
            clock: Clock::NEW,
            pending: S::list(Pending::default())?,
            plan: Plan::new_in()?,
            listed: S::array(Listed::default)?,
            chunks: S::array(Chunk::default)?,
            contributed: S::list(0)?,
            pending_slots: S::list(0)?,
            client_sums: S::array(|| 0)?,
            shorts: S::array(|| 0)?,
            refusals: S::array(|| RefusalMark::NONE)?,
        })
    }
}

/// The scratch a pass borrows for its marks, pending list and plan.
pub(crate) struct Parts<'a, const N: usize, const T: usize, S: Storage> {
    pub(crate) marks: &'a mut [Marks; N],
    pub(crate) clock: &'a mut Clock,
    pub(crate) contributed: &'a mut S::List<u64, N>,
    pub(crate) pending: &'a mut S::List<Pending, N>,
    pub(crate) plan: &'a mut Plan<T, S>,
    pub(crate) clients: &'a Clients<N, S>,
    pub(crate) client_sums: &'a mut [u64; N],
    pub(crate) adapter_waits: &'a mut [u16; N],
    pub(crate) failed_loads: &'a [u16],
    /// The last pass's refused run, its members' shortfalls, and whether runs are skipped
    /// (`refused_run.rs`).
    pub(crate) run: &'a mut RefusedRun,
    pub(crate) shorts: &'a mut [u32; N],
    pub(crate) refusals: &'a mut [RefusalMark; N],
    pub(crate) run_enabled: bool,
    /// The last pass's blocked requests, this pass's when it ends (`priority.rs`, `classes.rs`).
    pub(crate) blocked: &'a mut Records,
}

/// What a rule decided for one request (spec §1.4–§1.7).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    /// Scheduled.
    Scheduled,
    /// Not this pass; go on with the next request.
    Skip,
    /// End the phase.
    Stop,
}

/// One pass over the scheduler's parts (`S`: where the scheduler keeps its arrays).
pub(crate) struct Pass<'a, K, P, const N: usize, const T: usize, S: Storage> {
    pub(crate) cfg: &'a Config,
    pub(crate) kv: &'a mut K,
    pub(crate) desk: &'a mut AdapterDesk<P, T, S>,
    pub(crate) table: &'a mut Table<N, S>,
    pub(crate) out: &'a mut SchedulerOutput<N, S>,
    pub(crate) marks: &'a mut [Marks; N],
    /// This pass's stamp: the marks it wrote (`marks.rs`).
    pub(crate) stamp: Stamp,
    pub(crate) contributed: &'a mut S::List<u64, N>,
    /// Prefix-aware skip is live this pass (`prefix_skip.rs`).
    pub(crate) skip_live: bool,
    pub(crate) pending: &'a mut S::List<Pending, N>,
    /// The last pass's refused run where phase 1 deferred it whole, and the slot of its first
    /// member, where phase 1 may meet it (`span.rs`).
    pub(crate) span: Span,
    pub(crate) span_first: u16,
    pub(crate) plan: &'a mut Plan<T, S>,
    /// The VTC counters (read-only in a pass: service is charged when a step completes).
    pub(crate) clients: &'a Clients<N, S>,
    pub(crate) client_sums: &'a mut [u64; N],
    /// Consecutive passes each request was refused its adapter (kept by the scheduler).
    pub(crate) adapter_waits: &'a mut [u16; N],
    pub(crate) budget: Budget,
    pub(crate) stats: PassStats,
    /// Ordinary eviction's end index (spec §1.5 step 5): nothing at or beyond it is visited again.
    pub(crate) end: usize,
    /// Recompute pause's own frontier (spec §1.5 step 6).
    pub(crate) frontier: usize,
    /// Beam width of the generation requests scheduled so far (0: none yet; a beam is at least 1).
    pub(crate) beam: u32,
    /// Ordinary evictions and recompute pauses / preemptions this pass (progress for the deadlock
    /// detector).
    pub(crate) evictions: u32,
    pub(crate) recomputes: u32,
    /// After a preemption scan that found no candidate: the only index that can have become one since
    /// (that scan's requester), or `usize::MAX` for none.
    pub(crate) preempt_only: Option<usize>,
    /// GUARANTEED_NO_EVICT: a first chunk's reservation did not fit; no new request is admitted after it.
    pub(crate) admissions_closed: bool,
    /// A fair policy's request could not get its adapter: no later request takes a new lease
    /// ([`crate::config::Admission::drains`]).
    pub(crate) draining: bool,
    /// A request was refused its adapter in this pass already.
    pub(crate) refused_one: bool,
    /// Slots whose connector load failed or timed out since the last pass (`failed_loads.rs`).
    pub(crate) failed_loads: &'a [u16],
    /// Requests the decode run scheduled (all of them: the pass may leave the scheduler steady,
    /// `incremental.rs`).
    pub(crate) decoded: usize,
    /// The last pass's refused run, this pass's when it ends (`refused_run.rs`).
    pub(crate) run: &'a mut RefusedRun,
    /// Per run member, the pages it was short of (`refused_run.rs`).
    pub(crate) shorts: &'a mut [u32; N],
    /// Per waiting first chunk, its last clean trial refusal (`refusal_mark.rs`).
    pub(crate) refusals: &'a mut [RefusalMark; N],
    /// Where the last pass's run ends in this pass's pending list, once its first member was found
    /// in place (0: not found).
    pub(crate) run_end: usize,
    /// Runs are skipped and recorded (the incremental pass is on).
    pub(crate) run_enabled: bool,
    /// The request just visited was a clean trial refusal (`trial.rs`): a run may hold it, short of
    /// `refused_short` pages.
    pub(crate) refused_clean: bool,
    pub(crate) refused_short: u32,
    /// The pages phase 2's chunks are sure to be granted, and the tokens a page holds (`trial.rs`,
    /// read at the first trial; `Some((0, _))` once spent or unknown).
    pub(crate) room: Option<(u32, u32)>,
    /// The last pass's blocked requests, this pass's when it ends (`priority.rs`, `classes.rs`).
    pub(crate) blocked: &'a mut Records,
    /// What this pass holds back (`priority.rs`, `classes.rs`, `thrash.rs`).
    pub(crate) holds: Holds,
}

impl<'a, K: KvBackend, P: PeftBackend, const N: usize, const T: usize, S: Storage>
    Pass<'a, K, P, N, T, S>
{
    /// Begins a pass: the output is emptied, the budgets are fresh, the marks clear, the pinned
    /// adapters counted.
    pub(crate) fn begin(
        cfg: &'a Config,
        kv: &'a mut K,
        desk: &'a mut AdapterDesk<P, T, S>,
        table: &'a mut Table<N, S>,
        Parts {
            marks,
            clock,
            contributed,
            pending,
            plan,
            clients,
            client_sums,
            adapter_waits,
            failed_loads,
            run,
            shorts,
            refusals,
            run_enabled,
            blocked,
        }: Parts<'a, N, T, S>,
        out: &'a mut SchedulerOutput<N, S>,
    ) -> Self {
        out.clear();
        let len = table.len();
        let stamp = clock.begin(marks);
        pending.clear();
        plan.begin(desk);
        Self {
            cfg,
            kv,
            desk,
            table,
            out,
            marks,
            stamp,
            contributed,
            skip_live: false,
            pending,
            span: Span::NONE,
            span_first: u16::MAX,
            plan,
            clients,
            client_sums,
            adapter_waits,
            budget: Budget::new(cfg),
            stats: PassStats::default(),
            end: len,
            frontier: len,
            beam: 0,
            evictions: 0,
            recomputes: 0,
            preempt_only: None,
            admissions_closed: false,
            draining: false,
            refused_one: false,
            failed_loads,
            decoded: 0,
            run,
            shorts,
            refusals,
            run_end: 0,
            run_enabled,
            refused_clean: false,
            refused_short: 0,
            room: None,
            blocked,
            holds: Holds::NONE,
        }
    }

    /// The pass (spec §1.2): generation first, then the deferred contexts, then the verdict on progress
    /// and the LoRA sort. `stall` is the scheduler's count of consecutive stalled passes; `replayed`,
    /// a replay refused at an arrival index (`incremental.rs`). Returns the statistics, the verdict
    /// and how many requests the decode run scheduled.
    pub(crate) fn run(
        mut self,
        scratch_sort: (&mut [Listed; N], &mut [Chunk; N]),
        stall: &mut u32,
        replayed: Option<(usize, super::generation::Refusal)>,
    ) -> (PassStats, Result<(), Error>, usize) {
        self.abandon_failed_loads();
        self.guard_thrash();
        self.honour_blocked();
        self.honour_claim();
        self.span_first = self.span_first();
        match replayed {
            None => self.generation_phase(0, None),
            Some((k, refusal)) => {
                self.replayed_prefix(k);
                self.generation_phase(k, Some(refusal));
            }
        }
        self.order_admissions();
        if let Some(c) = self.cfg.chunking {
            if c.policy == ChunkPolicy::EqualProgress {
                self.plan_equal_progress(c.unit);
            }
        }
        self.context_phase();
        self.keep_finishing();
        self.keep_claim();
        let verdict = self.detect_deadlock(stall);
        if verdict.is_ok() {
            self.sort(scratch_sort);
        }
        trace!(
            "pass: {} gen, {} ctx",
            self.out.generation().len(),
            self.out.context().len()
        );
        (self.stats, verdict, self.decoded)
    }

    // --- Shared helpers of the phases. ---

    /// This pass set `mark` on the slot.
    #[inline]
    pub(crate) fn marked(&self, slot: u16, mark: Mark) -> bool {
        self.stamp.reads(&self.marks[usize::from(slot)], mark)
    }

    /// This pass sets `mark` on the slot.
    #[inline]
    pub(crate) fn mark(&mut self, slot: u16, mark: Mark) {
        self.stamp.set(&mut self.marks[usize::from(slot)], mark);
    }

    /// Pages the request's adapter adds to the pass (`Some(0)` without one), `None` when it does not fit.
    pub(crate) fn peft_need(&mut self, slot: u16) -> Option<u32> {
        let e = self.table.entry(slot);
        match e.task() {
            None => Some(0),
            Some(t) => {
                let id = e.spec().id;
                self.plan.pages_needed(self.desk, id, t)
            }
        }
    }

    /// Commits a scheduled request's adapter to the plan.
    pub(crate) fn commit_peft(&mut self, slot: u16, pages: u32) {
        let task = self.table.entry(slot).task();
        if let Some(t) = task {
            self.commit_task(t, pages);
        }
        self.note_unbucketed(slot);
    }

    /// Commits a scheduled request's adapter `t` to the plan. `pages` was read before the request's
    /// step: a task un-counted since (the ladder suspended its last other lease holder to make room
    /// for this very request) is claimed again at its size, not at the 0 read while it was counted (a
    /// device cache over-committed under forks, found at 20,000 model cases).
    pub(crate) fn commit_task(&mut self, t: TaskRef, pages: u32) {
        let pages = if self.plan.is_counted(t) {
            pages
        } else {
            self.desk.known_pages(t.slot)
        };
        listed(self.plan.commit(t, pages, self.out));
    }

    /// A listed request with a LoRA task but no adapter-cache bucket: the sort orders by id.
    pub(crate) fn note_unbucketed(&mut self, slot: u16) {
        let e = self.table.entry(slot);
        if e.task().is_none() && e.spec().lora.is_some() {
            self.plan.unbucketed += 1;
        }
    }

    /// A lease on `task` may have been returned: the plan un-counts a task nobody pins or uses.
    pub(crate) fn lease_returned(&mut self, task: Option<TaskRef>) {
        if let Some(t) = task {
            self.plan.released(self.desk, t);
        }
    }
}

/// Asserts a push into the output (the module invariant of `output`: it cannot overflow).
#[inline(always)]
#[track_caller]
pub(crate) fn listed(r: Result<(), Full>) {
    assert!(r.is_ok(), "an output list holds one entry per live request");
}
