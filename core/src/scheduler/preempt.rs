//! Context-side preemption (spec §1.8): when a context request's pages cannot be had and no tier lies
//! below the GPU, the newest request that is not protected and holds active KV gives its pages up.
//!
//! Protected: every request scheduled in this pass and the requester itself. Candidates: recompute
//! candidates (§1.15) whose KV is active on the GPU; a suspended request is never a victim here (a
//! suspended request that can run this pass is resumed, not destroyed; HELD pages are the deadlock
//! remedy's, `deadlock`). A success ends phase 2 (the freed pages are reserved for the requester next
//! pass); a failure lets the pass continue.
//!
//! Invariant: a scan that found no candidate leaves only its requester as a possible later candidate
//! (candidates only disappear during a pass otherwise), so later scans look at that one index.

use crate::adapter::PeftBackend;
use crate::config::CapacityPolicy;
use crate::kv::KvBackend;

use super::pass::{mark, Pass};

impl<K: KvBackend, P: PeftBackend, const N: usize, const T: usize> Pass<'_, K, P, N, T> {
    /// Preempts one candidate for the context request at index `i`; returns whether it did.
    pub(crate) fn preempt_for_pages(&mut self, i: usize) -> bool {
        if self.kv.tier_below_gpu()
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
        let victim = (lo..hi)
            .rev()
            .find(|&j| j != i && self.preemptable(self.table.slot(j)));
        match victim {
            Some(j) => {
                self.preempt(self.table.slot(j));
                true
            }
            None => {
                let requester = self.preemptable(self.table.slot(i));
                self.preempt_only = Some(if requester { i } else { usize::MAX });
                false
            }
        }
    }

    /// A context-side preemption candidate (§1.8): not scheduled in this pass, a recompute candidate,
    /// KV active on the GPU.
    fn preemptable(&self, slot: u16) -> bool {
        !self.marked(slot, mark::SCHEDULED)
            && self.table.entry(slot).ownership().on_gpu()
            && self.recompute_candidate(slot)
    }
}
