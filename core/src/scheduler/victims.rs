//! The generation ladder (spec §1.5 steps 5–8) and the transitions the pass applies to other requests:
//! ordinary eviction from the tail, destructive recompute pause with its own frontier, self-eviction;
//! and the predicates of §1.15 that pick victims.
//!
//! Invariants: a victim lies after the requester in arrival order (the ladder never takes a request
//! already visited); ordinary eviction shrinks the end index to its last victim and recompute pause
//! lowers only its own frontier; a request is listed once (a paused victim that becomes a recompute
//! victim moves from `paused` to `recompute_paused`); every returned lease is reported to the plan.

use crate::adapter::PeftBackend;
use crate::config::CapacityPolicy;
use crate::kv::KvBackend;
use crate::storage::Storage;

use super::marks::Mark;
use super::pass::{listed, Pass, Step};
use super::table::AnyRequest;

impl<K: KvBackend, P: PeftBackend, const N: usize, const T: usize, S: Storage>
    Pass<'_, K, P, N, T, S>
{
    /// The ladder after a refused allocation of the request at index `i`: ordinary eviction from the
    /// tail, recompute pause, then self-eviction. `None` when the request got its KV, else the step.
    #[cold]
    #[inline(never)]
    pub(crate) fn generation_ladder(&mut self, i: usize, grow: u32) -> Option<Step> {
        if self.cfg.policy == CapacityPolicy::GuaranteedNoEvict {
            // Never evict under GUARANTEED_NO_EVICT: the request waits.
            return Some(Step::Skip);
        }
        let mut ok = self.evict_for_generation(i, grow);
        if !ok && self.cfg.recompute_pause {
            ok = self.recompute_for_generation(i, grow);
        }
        if ok {
            return None;
        }
        // Self-eviction: only a cache on the GPU, with no connector load pending, is suspended.
        let slot = self.table.slot(i);
        let h = self.table.hot(slot);
        if h.on_gpu() && !h.loading() {
            self.suspend(slot);
            self.stats.self_evictions += 1;
        }
        Some(Step::Stop)
    }

    /// Ordinary eviction (§1.5 step 5): suspend the last evictable request before the end index (a
    /// continuation difference 3 suspended again counts, as upstream's is active: `resuspended.rs`),
    /// shrink the end index to it, retry; until the allocation succeeds or no victim is left.
    fn evict_for_generation(&mut self, i: usize, grow: u32) -> bool {
        let slot = self.table.slot(i);
        loop {
            let Some((j, marked)) = (i + 1..self.end)
                .rev()
                .find_map(|j| self.ladder_candidate(self.table.slot(j)).map(|m| (j, m)))
            else {
                return false;
            };
            let victim = self.table.slot(j);
            if marked {
                self.evict_resuspended(victim);
            } else {
                self.suspend(victim);
            }
            self.stats.victims += 1;
            self.end = j;
            if self.allocate_generation(slot, grow) {
                return true;
            }
        }
    }

    /// Destructive recompute pause (§1.5 step 6): its own frontier and exact victim set.
    fn recompute_for_generation(&mut self, i: usize, grow: u32) -> bool {
        let slot = self.table.slot(i);
        loop {
            let can_evict = self.kv.limits().can_evict;
            let Some(j) = self.recompute_victim(i, can_evict) else {
                return false;
            };
            let victim = self.table.slot(j);
            self.out.unlist_paused(victim);
            self.recompute(victim);
            self.stats.recompute_pauses += 1;
            self.frontier = self.frontier.min(j);
            if self.allocate_generation(slot, grow) {
                return true;
            }
            if can_evict && self.evict_for_generation(i, grow) {
                return true;
            }
        }
    }

    /// The next recompute victim for the requester at index `i`: the last candidate before the frontier
    /// (one evicted in this pass only when a lower tier absorbed its pages), else the first candidate
    /// among this pass's evictions.
    fn recompute_victim(&self, i: usize, can_evict: bool) -> Option<usize> {
        let in_range = (i + 1..self.frontier).rev().find(|&j| {
            let s = self.table.slot(j);
            !self.marked(s, Mark::RECOMPUTED)
                && self.recompute_candidate(s)
                && (can_evict || !self.marked(s, Mark::EVICTED))
        });
        if in_range.is_some() || !can_evict {
            return in_range;
        }
        // A request that yielded to a higher priority (`priority.rs`) may lie before the requester:
        // never one of higher priority than it.
        let requester = self.table.slot(i);
        self.out.paused().iter().find_map(|l| {
            let s = l.slot();
            let candidate = !self.marked(s, Mark::RECOMPUTED) && self.recompute_candidate(s);
            (candidate && self.may_take(requester, s))
                .then(|| self.table.index_of(s))
                .flatten()
        })
    }

    /// (2) Suspends a request whose KV is on the GPU (victim, self-eviction, wedge breaker).
    pub(crate) fn suspend(&mut self, slot: u16) {
        let (kv, desk, out) = (&mut *self.kv, &mut *self.desk, &mut *self.out);
        let task = self.table.transition(slot, |held| {
            let p = match held {
                AnyRequest::Active(r) => r.suspend(kv, desk),
                AnyRequest::Resumed(r) => r.suspend(kv, desk),
                _ => panic!("only a request on the GPU is suspended"),
            };
            listed(out.push_paused(&p));
            let task = p.task();
            (p.into(), task)
        });
        self.lease_returned(task);
        self.mark(slot, Mark::EVICTED);
        self.evictions += 1;
    }

    /// (4) Recompute pause: whatever the request owns is freed; it replays its prefill.
    pub(crate) fn recompute(&mut self, slot: u16) {
        let (kv, desk, out) = (&mut *self.kv, &mut *self.desk, &mut *self.out);
        let task = self.table.transition(slot, |held| {
            let rc = match held {
                AnyRequest::Active(r) => r.recompute(kv, desk),
                AnyRequest::Resumed(r) => r.recompute(kv, desk),
                AnyRequest::Paused(r) => r.recompute(kv),
                AnyRequest::Waiting(r) => r.recompute(kv),
                AnyRequest::Recompute(r) => r,
                AnyRequest::Sending(_) => panic!("{}", super::table::NEVER_SCHEDULED),
            };
            listed(out.push_recompute(&rc));
            let task = rc.task();
            (rc.into(), task)
        });
        self.freed(slot, task, Mark::RECOMPUTED);
    }

    /// After a recompute pause or a preemption: the lease's return reported to the plan, no KV headroom
    /// left, the request marked for the rest of the pass, the pass counted as progress.
    fn freed(&mut self, slot: u16, task: Option<crate::adapter::TaskRef>, bit: Mark) {
        self.count_recompute(slot);
        self.lease_returned(task);
        self.table.set_headroom(slot, 0);
        self.mark(slot, bit);
        self.recomputes += 1;
    }

    /// (7) Preemption: the request's pages are given up; it replays its prefill. A suspended request is
    /// taken only by the deadlock remedy (its pages HELD on the GPU). Listed once, as preempted.
    pub(crate) fn preempt(&mut self, slot: u16) {
        self.out.unlist_paused(slot);
        let (kv, desk, out) = (&mut *self.kv, &mut *self.desk, &mut *self.out);
        let task = self.table.transition(slot, |held| {
            let rc = match held {
                AnyRequest::Active(r) => r.preempt(kv, desk),
                AnyRequest::Resumed(r) => r.preempt(kv, desk),
                AnyRequest::Paused(r) => r.preempt(kv),
                _ => panic!("only a request holding KV is preempted"),
            };
            listed(out.push_recompute(&rc));
            let task = rc.task();
            (rc.into(), task)
        });
        self.freed(slot, task, Mark::PREEMPTED);
        self.stats.preemptions += 1;
    }

    /// Recompute-pause candidate (§1.15): not in flight, not `GENERATION_TO_COMPLETE`, not a generation
    /// request carrying multimodal data, started. Its KV may be anywhere (from the hot record).
    #[inline]
    pub(crate) fn recompute_candidate(&self, slot: u16) -> bool {
        self.table.hot(slot).recomputable()
    }
}
