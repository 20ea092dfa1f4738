//! Context-side preemption (spec §1.8): when a context request's pages cannot be had and no tier lies
//! below the GPU, a request that is not protected gives its pages up.
//!
//! Protected: every request scheduled in this pass and the requester itself. Candidates: recompute
//! candidates (§1.15) whose KV is active on the GPU, newest first, and the continuations difference 3
//! suspended again, which upstream leaves active (`resuspended.rs`); where there is none, nobody is
//! preempted, as upstream. Where there is one, the newest suspended candidate whose pages are HELD (not
//! such a continuation) is taken instead (deliberate difference 7): without a lower tier it runs
//! nowhere and keeps them until it resumes, so taking the active request's pages can loop for ever
//! (preempt it, it replays into the pages freed, preempt it again) while the held pages never move. A
//! success ends phase 2 (the freed pages are reserved for the requester next pass); a failure lets the
//! pass continue. A held candidate with no active one beside it is the stall remedy's (`deadlock`), when
//! the pass would otherwise stall.
//!
//! Invariant: a scan that found no active candidate leaves only its requester as a possible later one
//! (active candidates only disappear during a pass otherwise, and a continuation suspended again
//! reopens the scan: `note_resuspended`), so later scans look at that one index; held candidates
//! appear when the pass suspends someone, so they are looked for every time.

use crate::adapter::PeftBackend;
use crate::config::CapacityPolicy;
use crate::kv::KvBackend;
use crate::storage::Storage;

use super::marks::Mark;
use super::pass::Pass;

impl<K: KvBackend, P: PeftBackend, const N: usize, const T: usize, S: Storage>
    Pass<'_, K, P, N, T, S>
{
    /// Preempts one candidate for the context request at index `i`; returns whether it did.
    pub(crate) fn preempt_for_pages(&mut self, i: usize) -> bool {
        if self.kv.limits().tier_below_gpu
            || !self.cfg.recompute_pause
            || self.cfg.policy == CapacityPolicy::GuaranteedNoEvict
        {
            return false;
        }
        let len = self.table.len();
        // Newest first over the whole list, or only the one index an earlier empty scan left open.
        let (hi, lo) = match self.preempt_only {
            None => (len, 0),
            Some(only) if only < len => (only + 1, only),
            Some(_) => (0, 0),
        };
        let me = self.table.slot(i);
        let takes = |p: &Self, j: usize| j != i && p.may_take(me, p.table.slot(j));
        let active = (lo..hi)
            .rev()
            .find(|&j| takes(self, j) && self.preemptable(self.table.slot(j)));
        let Some(active) = active else {
            // Upstream preempts nobody here: no active candidate (a held one waits for the stall remedy).
            // Under priority a candidate of higher priority may be another requester's: scan again.
            let requester = self.preemptable(me);
            let only = self.cfg.admission != crate::config::Admission::Priority;
            self.preempt_only = only.then_some(if requester { i } else { usize::MAX });
            return false;
        };
        // Deliberate difference 7: the newest held suspended candidate gives its pages up instead.
        // (A continuation difference 3 suspended again is not one: upstream holds it active.)
        let held = (0..len)
            .rev()
            .find(|&j| takes(self, j) && self.held_preemptable(self.table.slot(j)));
        self.preempt(self.table.slot(held.unwrap_or(active)));
        true
    }

    /// A suspended recompute candidate whose pages are HELD (not scheduled in this pass), and not a
    /// continuation upstream holds resumed (`resuspended.rs`).
    fn held_preemptable(&self, slot: u16) -> bool {
        let e = self.table.entry(slot);
        !self.marked(slot, Mark::SCHEDULED)
            && matches!(e.held(), super::table::AnyRequest::Paused(_))
            && self.kv.cache(self.kv_ref(slot)).exists()
            && self.recompute_candidate(slot)
            && !self.resuspended(slot)
    }

    /// A context-side preemption candidate (§1.8): not scheduled in this pass, a recompute candidate,
    /// KV active on the GPU — or a continuation difference 3 suspended again, active upstream.
    fn preemptable(&self, slot: u16) -> bool {
        !self.marked(slot, Mark::SCHEDULED)
            && (self.table.entry(slot).ownership().on_gpu() || self.resuspended(slot))
            && self.recompute_candidate(slot)
    }
}
