//! The adapter plan of one pass: the PEFT page budget (spec §1.3, with DESIGN.md §3 point 6) and the
//! distinct adapters of the scheduled batch.
//!
//! Every adapter pinned by a lease holder when the pass begins is *counted* (its pages are claimed),
//! scheduled or not, so the plan of a scheduled batch always fits the device cache and ensure-batch
//! never fails. A request whose adapter is not counted yet claims its pages when it is scheduled; its
//! task then enters the plan (listed once, in the output's adapter list). A counted task whose last
//! lease is returned during the pass and that no scheduled request uses is un-counted again
//! ([`Plan::released`]).
//!
//! The plan also keeps the LoRA sort's per-task counters, filled as the generation list is filled.
//!
//! A pass begins by clearing only the tasks the last pass touched (its pinned tasks and the ones it
//! counted): every other task slot's flags and counters are zero already, so a pass costs the tasks it
//! touches, not the `T` slots.
//!
//! Invariants (asserted): `claimed` = the pages of the counted tasks ≤ the device cache (each claim is
//! checked against it when made); a scheduled task is counted.

use crate::adapter::{PeftBackend, TaskRef};
use crate::ids::{RequestId, TaskSlot};
use crate::lease::AdapterDesk;
use crate::output::{Full, SchedulerOutput};
use crate::storage::{FixedList, Inline, InlineArray, Storage};

const COUNTED: u8 = 1;
const SCHEDULED: u8 = 2;

/// Per-task state of one pass (`T` task slots).
pub(crate) struct Plan<const T: usize, S: Storage = Inline> {
    flags: S::Array<u8, T>,
    /// The tasks pinned when the pass began (the decode steps of their lease holders are counted in
    /// `counts` only, and enter the plan after phase 1: [`Plan::enter_counted`]).
    pinned: S::List<TaskSlot, T>,
    /// The tasks this pass counted that were not pinned (cleared, with `pinned`, when the next pass
    /// begins).
    touched: S::List<TaskSlot, T>,
    /// Per task slot, `[part 0, part 1]` counters of the LoRA sort (zero when the pass begins; the
    /// generation list's part 0 is counted as it is filled).
    pub(crate) counts: S::Array<[u32; 2], T>,
    /// Per task slot in the plan, its rank among the plan's adapters by id (from 1), set by the sort.
    pub(crate) rank: S::Array<u16, T>,
    /// Generation entries without a LoRA task, counted as the list is filled.
    pub(crate) plain: u32,
    /// Listed requests with a LoRA task but no adapter cache bucket (they are sorted by id).
    pub(crate) unbucketed: u32,
    claimed: u32,
    max_pages: u32,
}

impl<const T: usize> Plan<T> {
    pub(crate) const fn new() -> Self {
        Self {
            flags: InlineArray::new([0; T]),
            pinned: heapless::Vec::new(),
            touched: heapless::Vec::new(),
            counts: InlineArray::new([[0; 2]; T]),
            rank: InlineArray::new([0; T]),
            plain: 0,
            unbucketed: 0,
            claimed: 0,
            max_pages: 0,
        }
    }
}

impl<const T: usize, S: Storage> Plan<T, S> {
    pub(crate) fn new_in() -> Result<Self, crate::Error> {
        Ok(Self {
            flags: S::array(|| 0)?,
            pinned: S::list(TaskSlot(0))?,
            touched: S::list(TaskSlot(0))?,
            counts: S::array(|| [0; 2])?,
            rank: S::array(|| 0)?,
            plain: 0,
            unbucketed: 0,
            claimed: 0,
            max_pages: 0,
        })
    }

    /// Starts a pass: every pinned adapter is counted.
    pub(crate) fn begin<P: PeftBackend>(&mut self, desk: &AdapterDesk<P, T, S>) {
        for &s in self.pinned.iter().chain(self.touched.iter()) {
            self.flags[s.index()] = 0;
            self.counts[s.index()] = [0, 0];
        }
        self.touched.clear();
        debug_assert!(
            self.flags.iter().all(|&f| f == 0),
            "only touched tasks were flagged"
        );
        debug_assert!(self.counts.iter().all(|&c| c == [0, 0]), "and counted");
        self.plain = 0;
        self.unbucketed = 0;
        self.max_pages = desk.backend().max_device_pages();
        self.claimed = desk.pinned_pages();
        self.pinned.clear();
        for &s in desk.pinned_tasks() {
            self.flags[s.index()] = COUNTED;
            let pushed = self.pinned.push(s);
            assert!(pushed.is_ok(), "one pinned entry per task slot");
        }
        assert!(
            self.max_pages == u32::MAX || self.claimed <= self.max_pages,
            "pinned adapters fit the device cache"
        );
    }

    /// The task's pages are counted in this pass.
    #[inline]
    pub(crate) fn is_counted(&self, task: TaskRef) -> bool {
        self.flags
            .get(task.slot.index())
            .is_some_and(|f| f & COUNTED != 0)
    }

    /// Pages this request's adapter adds to the pass (0 when already counted), or `None` when it does
    /// not fit in the device cache next to what is counted.
    pub(crate) fn pages_needed<P: PeftBackend>(
        &self,
        desk: &mut AdapterDesk<P, T, S>,
        req: RequestId,
        task: TaskRef,
    ) -> Option<u32> {
        if task.slot.index() >= T {
            return None;
        }
        if self.is_counted(task) {
            return Some(0);
        }
        let pages = desk.determine_pages(req, task);
        (u64::from(self.claimed) + u64::from(pages) <= u64::from(self.max_pages)).then_some(pages)
    }

    /// Commits a scheduled request's adapter (`pages` from [`Plan::pages_needed`]): counted, and listed
    /// in the plan the first time a request on it is scheduled.
    #[inline]
    pub(crate) fn commit<const N: usize>(
        &mut self,
        task: TaskRef,
        pages: u32,
        out: &mut SchedulerOutput<N, S>,
    ) -> Result<(), Full> {
        let f = &mut self.flags[task.slot.index()];
        if *f & COUNTED == 0 {
            if *f == 0 {
                let pushed = self.touched.push(task.slot);
                assert!(pushed.is_ok(), "a task is touched once a pass");
            }
            *f |= COUNTED;
            self.claimed += pages;
            assert!(self.claimed <= self.max_pages, "a claim was checked to fit");
        }
        self.schedule(task, out)
    }

    #[inline]
    fn schedule<const N: usize>(
        &mut self,
        task: TaskRef,
        out: &mut SchedulerOutput<N, S>,
    ) -> Result<(), Full> {
        let s = task.slot.index();
        if self.flags[s] & SCHEDULED != 0 {
            return Ok(());
        }
        self.flags[s] |= SCHEDULED;
        out.push_adapter(task)
    }

    /// After phase 1: the pinned tasks whose lease holders' decode steps were only counted enter the
    /// plan.
    pub(crate) fn enter_counted<P: PeftBackend, const N: usize>(
        &mut self,
        desk: &AdapterDesk<P, T, S>,
        out: &mut SchedulerOutput<N, S>,
    ) -> Result<(), Full> {
        for &s in self.pinned.iter() {
            let i = s.index();
            if self.counts[i][0] > 0 && self.flags[i] & SCHEDULED == 0 {
                assert!(self.flags[i] & COUNTED != 0, "a pinned task is counted");
                self.flags[i] |= SCHEDULED;
                out.push_adapter(desk.task_ref(s))?;
            }
        }
        Ok(())
    }

    /// A generation entry on task slot `bucket` (in the plan) is counted for the LoRA sort.
    #[inline]
    pub(crate) fn count_generation(&mut self, bucket: TaskSlot) {
        self.counts[bucket.index()][0] += 1;
    }

    /// A decode step of a request whose hot record names cache bucket `bucket` is counted for the LoRA
    /// sort: on its task slot, as plain ([`TaskSlot::NONE`]), or as unbucketed (a task past the cache's slots).
    #[inline(always)]
    pub(crate) fn count_decode(&mut self, bucket: TaskSlot) {
        match bucket {
            b if usize::from(b) < T => self.counts[usize::from(b)][0] += 1,
            TaskSlot::NONE => self.plain += 1,
            _ => self.unbucketed += 1,
        }
    }

    /// A lease on `task` was returned during the pass: if it was the last one and no scheduled request
    /// uses the task, its pages are no longer claimed.
    pub(crate) fn released<P: PeftBackend>(&mut self, desk: &AdapterDesk<P, T, S>, task: TaskRef) {
        let s = task.slot.index();
        // Scheduled (flagged, or a decode step counted): stays counted.
        if desk.leases(task.slot) > 0 || self.flags[s] != COUNTED || self.counts[s][0] > 0 {
            return;
        }
        self.flags[s] = 0;
        let pages = desk.known_pages(task.slot);
        assert!(self.claimed >= pages, "an un-counted task was claimed");
        self.claimed -= pages;
    }
}
