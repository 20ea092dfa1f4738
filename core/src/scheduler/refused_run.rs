//! The refused run (issue 41): the waiting first chunks that end phase 2 and that their trials
//! (`trial.rs`) refused for pages, remembered so that the next pass skips them while nothing they
//! depend on changed. A queue that builds up behind a full pool is then not revisited pass after pass:
//! a pass costs what changed (the requests before the run, the arrivals after it), not the queue.
//!
//! A run member's visit changed nothing (a trial refusal with no KV call, no preemption scan, no
//! adapter, no deferral), and its verdict depends only on its prompt chain, the token budget left
//! when phase 2 reaches it and the pages available: the pages a chunk needs never shrink as the budget
//! grows, and a refused chunk stays refused while its chain and what the pool holds are unchanged and
//! the pages available do not grow. So the next pass skips the run, exactly, when
//! - nothing outside a pass changed the table but arrivals (`Scheduler::changed` forgets the run: a
//!   removal, an update, an adoption, a mark, a transfer's end, an adapter's registration);
//! - the same requests, and only they, stand between the run's first and last in the pending list (a
//!   request suspended or paused into the middle of it is seen);
//! - the prefix cache's version is the run's (no chain's frontier moved) and the pages available are
//!   at most the run's, the budget left at least the run's, and no block was contributed this pass.
//!
//! Only under FCFS admission with whole prompts or FCFS chunking, with no context-side preemption (a
//! tier below the GPU, or no recompute pause), and with the incremental pass on: the full-pass twin of
//! the differential checks (`set_incremental(false)`) visits every request, so they compare the two.

use crate::adapter::PeftBackend;
use crate::config::{Admission, ChunkPolicy};
use crate::kv::{KvBackend, KvCaps, PrefixReuse};
use crate::storage::Storage;

use super::pass::Pass;

/// A run of refused waiting first chunks at the end of a pass's phase 2.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct RefusedRun {
    /// Recorded by the last pass and not forgotten since.
    live: bool,
    first: u16,
    last: u16,
    count: u32,
    version: u64,
    available: u32,
    budget: u32,
}

impl RefusedRun {
    /// No run (a scheduler before its first pass).
    pub(crate) const NONE: RefusedRun = RefusedRun {
        live: false,
        first: 0,
        last: 0,
        count: 0,
        version: 0,
        available: 0,
        budget: 0,
    };

    /// Something outside a pass changed what a run depends on.
    pub(crate) fn forget(&mut self) {
        self.live = false;
    }
}

/// The run a pass is building: where it starts in the pending list, and what its verdicts read.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct RunStart {
    at: usize,
    version: u64,
    available: u32,
    budget: u32,
}

impl<K: KvBackend, P: PeftBackend, const N: usize, const T: usize, S: Storage>
    Pass<'_, K, P, N, T, S>
{
    /// The pass may skip and record runs: its configuration is one where a run's verdicts stand.
    pub(crate) fn runs_apply(&self) -> bool {
        let chunked_fcfs = self
            .cfg
            .chunking
            .is_none_or(|c| c.policy == ChunkPolicy::FirstComeFirstServed);
        self.run_enabled
            && chunked_fcfs
            && self.cfg.admission == Admission::Fcfs
            && (self.kv.limits().tier_below_gpu || !self.cfg.recompute_pause)
    }

    /// What a trial refusal read of the pool and the budget now (`None`: no trial marks).
    fn run_mark(&self) -> Option<RunStart> {
        let (version, available) = self.kv.caps().prefix?.trial_mark()?;
        Some(RunStart {
            at: 0,
            version,
            available,
            budget: self.budget.remaining().unwrap_or(u32::MAX),
        })
    }

    /// At pending position `k`: the end of the last pass's run when it starts here and still stands.
    pub(crate) fn skip_run(&self, k: usize) -> Option<usize> {
        let run = *self.run;
        let slot = |at: usize| self.table.slot(usize::from(self.pending[at].index));
        if !run.live || slot(k) != run.first || !self.contributed.is_empty() {
            return None;
        }
        let end = k + run.count as usize;
        if end > self.pending.len() || slot(end - 1) != run.last {
            return None;
        }
        let now = self.run_mark()?;
        let stands = now.version == run.version
            && now.available <= run.available
            && now.budget >= run.budget;
        stands.then_some(end)
    }

    /// After the request at pending position `k` was visited (`refused`: a clean trial refusal):
    /// the run goes on, starts, or ends.
    pub(crate) fn track_run(&mut self, k: usize, refused: bool, start: &mut Option<RunStart>) {
        if !refused {
            *start = None;
        } else if start.is_none() {
            *start = self.run_mark().map(|m| RunStart { at: k, ..m });
        }
    }

    /// At the end of phase 2 (`whole`: every pending request was visited or skipped): the run that
    /// ends it is the next pass's (`start` is `None` where runs do not apply: none was tracked).
    pub(crate) fn record_run(&mut self, start: Option<RunStart>, whole: bool) {
        *self.run = match start.filter(|_| whole) {
            Some(s) => RefusedRun {
                live: true,
                first: self.table.slot(usize::from(self.pending[s.at].index)),
                last: self
                    .table
                    .slot(usize::from(self.pending[self.pending.len() - 1].index)),
                count: crate::narrow::u32_of(self.pending.len() - s.at),
                version: s.version,
                available: s.available,
                budget: s.budget,
            },
            None => RefusedRun::NONE,
        };
    }
}
