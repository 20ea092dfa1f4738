//! The refused run (issue 41): the waiting first chunks that end phase 2 and that their trials
//! (`trial.rs`) refused for pages, remembered with how many pages each was short of, so that the next
//! pass skips them while nothing they depend on changed enough to admit them. A queue that builds up
//! behind a full pool is then not revisited pass after pass: a pass costs what changed (the requests
//! before the run, the members that may now fit, the arrivals after it), not the queue.
//!
//! A run member's visit changed nothing (a trial refusal with no KV call, no preemption scan, no
//! adapter, no deferral), and its verdict depends only on its prompt chain, the token budget left
//! when phase 2 reaches it and the pages available. A member short of `s` pages stays refused, exactly,
//! while its chain is unmoved and the pages available grew by less than `s` less the pages a chunk
//! shortened by the budget's shrinking can save ([`Pass::saved`]). So the next pass skips a member, without a trial, when
//! - nothing outside a pass changed the table but arrivals and removals of requests that hold KV on
//!   the GPU (`Scheduler::changed` forgets the run: a waiting request's removal, an update, an
//!   adoption, a mark, a transfer's end, an adapter's registration);
//! - the same requests, and only they, stand between the run's first and last in the pending list (a
//!   request suspended or paused into the middle of it is seen), and the member's first new block
//!   was not contributed this pass (prefix-aware scheduling would defer it);
//! - the prefix cache's version is the run's, or the member's chain is unmoved (the stamps of the
//!   keys its frontiers stand on, `page_pool/trial.rs`);
//! - its shortfall exceeds what the pages and the budget moved since the run was recorded, or no
//!   chunk budget is left (it would be skipped for that first).
//!
//! A skipped member's shortfall is carried into the next run as that bound less what moved. Only under
//! FCFS admission with whole prompts or FCFS chunking, with no context-side preemption (a tier below
//! the GPU, or no recompute pause), and with the incremental pass on: the full-pass twin of the
//! differential checks (`set_incremental(false)`) visits every request, so they compare the two.

use crate::adapter::PeftBackend;
use crate::config::{Admission, ChunkPolicy};
use crate::kv::{KvBackend, KvCaps, PrefixReuse, TrialMark};
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
    /// The members are consecutive in arrival order (phase 1 may defer them whole, `span.rs`).
    consecutive: bool,
    /// Counts the times a run was forgotten: a remembered refusal stands only in its epoch
    /// (`refusal_mark.rs`).
    epoch: u32,
    /// What the members' verdicts read: the backend's mark and the budget left.
    mark: RunStart,
}

impl RefusedRun {
    /// No run (a scheduler before its first pass).
    pub(crate) const NONE: RefusedRun = RefusedRun {
        live: false,
        first: 0,
        last: 0,
        count: 0,
        consecutive: false,
        epoch: 0,
        mark: RunStart {
            at: 0,
            mark: TrialMark {
                version: 0,
                available: 0,
                block: 0,
            },
            budget: 0,
            least: 0,
        },
    };

    /// Something outside a pass changed what a run depends on.
    pub(crate) fn forget(&mut self) {
        self.live = false;
        self.epoch = self.epoch.wrapping_add(1);
    }

    /// The times a run was forgotten.
    pub(crate) fn epoch(&self) -> u32 {
        self.epoch
    }

    /// Recorded, not forgotten, and its members consecutive in arrival order.
    pub(crate) fn consecutive(&self) -> bool {
        self.live && self.consecutive
    }

    /// Its first member's slot.
    pub(crate) fn first(&self) -> u16 {
        self.first
    }

    /// Its last member's slot.
    pub(crate) fn last(&self) -> u16 {
        self.last
    }

    /// Its members.
    pub(crate) fn len(&self) -> usize {
        self.count as usize
    }
}

/// The run a pass is building: where it starts in the pending list, and what its verdicts read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct RunStart {
    at: usize,
    mark: TrialMark,
    budget: u32,
    /// The least shortfall of its members (0: one bounds nothing).
    least: u32,
}

impl<K: KvBackend, P: PeftBackend, const N: usize, const T: usize, S: Storage>
    Pass<'_, K, P, N, T, S>
{
    /// The pass may skip and record runs: its configuration is one where a run's verdicts stand (not
    /// with service classes: a skipped refusal would record no claim).
    pub(crate) fn runs_apply(&self) -> bool {
        let chunked_fcfs = self
            .cfg
            .chunking
            .is_none_or(|c| c.policy == ChunkPolicy::FirstComeFirstServed);
        self.run_enabled
            && chunked_fcfs
            && self.cfg.step_budget.is_none()
            && self.cfg.shares.is_none()
            && self.cfg.admission == Admission::Fcfs
            && (self.kv.limits().tier_below_gpu || !self.cfg.recompute_pause)
    }

    /// What a trial refusal read of the pool and the budget now (`None`: no trial marks).
    fn run_mark(&self) -> Option<RunStart> {
        Some(RunStart {
            at: 0,
            mark: self.kv.caps().prefix?.trial_mark()?,
            budget: self.budget.remaining().unwrap_or(u32::MAX),
            least: u32::MAX,
        })
    }

    /// At pending position `k`: where the members of the last pass's run that certainly stay refused,
    /// from `k` on, end, and the least they are now short of (`None`: none is skipped here).
    pub(crate) fn skip_run(&mut self, k: usize) -> Option<(usize, u32)> {
        if self.run_end == 0 {
            self.run_end = self.run_in_place(k)?;
        }
        if k >= self.run_end {
            return None;
        }
        let (run, now) = (self.run.mark, self.run_mark()?);
        let shrunk = run.budget.saturating_sub(now.budget);
        let grown = i64::from(now.mark.available) - i64::from(run.mark.available);
        let same = now.mark.version == run.mark.version;
        // No chunk budget is left: every member is skipped for it (its first check), whatever it is
        // short of; what it is short of is still carried.
        let spent = self
            .cfg
            .chunking
            .is_some_and(|c| !self.budget.has_chunk_budget(c.policy, c.unit));
        let undeferred = !self.skip_live || self.contributed.is_empty();
        if same && shrunk == 0 && grown <= 0 && run.least > 0 && undeferred {
            // Nothing moved that can admit one (the steady case): every member is skipped in O(1),
            // and what each is short of stays a bound.
            return Some((self.run_end, run.least));
        }
        let (mut j, mut least) = (k, u32::MAX);
        while j < self.run_end {
            let slot = self.table.slot(usize::from(self.pending_at(j).index));
            let short = self.shorts[usize::from(slot)];
            let left = self.still_short(slot, short, grown, shrunk, now.mark.block, same);
            // Skipped for budget, a member is not tried whatever it is short of.
            if left.is_none() && !(spent && self.unmoved(slot, same)) {
                break;
            }
            if short != 0 && short != u32::MAX {
                // What it is short of now, at least (the next run's mark is this one); 0 when
                // nothing is known any more.
                self.shorts[usize::from(slot)] = left.unwrap_or(0).min(u32::MAX - 1);
            }
            least = least.min(self.shorts[usize::from(slot)]);
            j += 1;
        }
        (j > k).then_some((j, least))
    }

    /// A waiting first chunk whose trial found it `short` pages short, since when the pages available
    /// grew by `grown` and the budget shrank by `shrunk` (`same`: the prefix cache's version is the
    /// one read then): its trial would refuse it again, exactly, short of the returned pages at least
    /// (`None`: it may fit now, or its chain moved, or prefix-aware scheduling would defer it). A
    /// shortfall of 0 bounds nothing. The rule of both the refused run and a remembered refusal
    /// (`refusal_mark.rs`).
    #[inline(always)]
    pub(crate) fn still_short(
        &self,
        slot: u16,
        short: u32,
        grown: i64,
        shrunk: u32,
        block: u32,
        same: bool,
    ) -> Option<u32> {
        let moved = grown + self.saved(slot, shrunk, block);
        let refused = short > 0 && i64::from(short) > moved && !self.deferred_behind(slot);
        (refused && self.unmoved(slot, same))
            .then(|| u32::try_from(i64::from(short) - moved).unwrap_or(u32::MAX))
    }

    /// At most how many fewer pages the member's first chunk needs with `shrunk` tokens less budget:
    /// FCFS sizes the chunk to the budget, rounded down to the chunk unit, and a chunk that no longer
    /// ends the prompt loses its draft tokens (a chunk `t` tokens shorter needs at most
    /// `t / block + 1` fewer pages).
    fn saved(&self, slot: u16, shrunk: u32, block: u32) -> i64 {
        let Some(c) = self.cfg.chunking.filter(|_| shrunk > 0) else {
            return 0;
        };
        let draft = self.table.entry(slot).spec().draft;
        let tokens = u64::from(shrunk) + u64::from(c.unit) + u64::from(draft);
        i64::try_from(tokens / u64::from(block.max(1)) + 1).unwrap_or(i64::MAX)
    }

    /// The member's chain is unmoved since its last trial (`same`: the version is the run's).
    fn unmoved(&self, slot: u16, same: bool) -> bool {
        same || self
            .kv
            .caps()
            .prefix
            .is_some_and(|p| p.trial_unmoved(self.kv_ref(slot)))
    }

    /// A block contributed this pass is the member's first new one: prefix-aware scheduling would
    /// defer it (`prefix_skip.rs`), not refuse it.
    fn deferred_behind(&self, slot: u16) -> bool {
        self.skip_live
            && !self.contributed.is_empty()
            && self
                .probe(slot, true)
                .is_some_and(|key| self.contributed.contains(&key))
    }

    /// The last pass's run starts at pending position `k` and still holds the same requests: where it
    /// ends.
    fn run_in_place(&self, k: usize) -> Option<usize> {
        let run = *self.run;
        let slot = |at: usize| self.table.slot(usize::from(self.pending_at(at).index));
        if !run.live || slot(k) != run.first {
            return None;
        }
        let end = k + run.count as usize;
        (end <= self.pending_len() && slot(end - 1) == run.last).then_some(end)
    }

    /// After the request at pending position `k` was visited (`refused`: a clean trial refusal short
    /// of that many pages, kept) or skipped (the least its members are short of, kept by
    /// [`Pass::skip_run`]): the run goes on, starts, or ends.
    pub(crate) fn track_run(
        &mut self,
        k: usize,
        refused: Option<u32>,
        start: &mut Option<RunStart>,
    ) {
        let Some(short) = refused else {
            *start = None;
            return;
        };
        if start.is_none() {
            *start = self.run_mark().map(|m| RunStart { at: k, ..m });
        }
        if let Some(s) = start.as_mut() {
            s.least = s.least.min(short);
        }
    }

    /// A clean trial refusal of the request at `slot`, short of `short` pages: a run may hold it.
    pub(crate) fn keep_short(&mut self, slot: u16, short: u32) {
        self.shorts[usize::from(slot)] = short;
    }

    /// At the end of phase 2 (`whole`: every pending request was visited or skipped): the run that
    /// ends it is the next pass's (`start` is `None` where runs do not apply: none was tracked).
    pub(crate) fn record_run(&mut self, start: Option<RunStart>, whole: bool) {
        let epoch = self.run.epoch;
        *self.run = match start.filter(|_| whole) {
            Some(s) => {
                let (first, last) = (
                    self.pending_at(s.at).index,
                    self.pending_at(self.pending_len() - 1).index,
                );
                let count = self.pending_len() - s.at;
                RefusedRun {
                    live: true,
                    first: self.table.slot(usize::from(first)),
                    last: self.table.slot(usize::from(last)),
                    count: crate::narrow::u32_of(count),
                    consecutive: usize::from(last).wrapping_sub(usize::from(first)) + 1 == count,
                    epoch,
                    mark: s,
                }
            }
            None => RefusedRun {
                epoch,
                ..RefusedRun::NONE
            },
        };
    }
}
