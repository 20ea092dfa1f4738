//! Deadlock detection (spec §1.12) and the two remedies kvsched adds before a stalled pass counts.
//!
//! A pass made progress when it scheduled anything (generation, context, encoder, disagg) or evicted,
//! recompute-paused or preempted anything; progress resets the stall counter, and so do an idle pass
//! (no candidates) and a request whose transfer holds pages. Otherwise, before the stall counts:
//!
//! - **Wedge breaker** (deliberate difference 6): with a tier below the GPU that absorbs suspended
//!   pages, two or more partially prefilled contexts can each hold pages the others' next chunks need,
//!   and the reference has nothing to free them. The youngest is suspended, so the older ones progress.
//! - **Held-page remedy** (deliberate difference 7): without a lower tier, suspended requests keep their
//!   pages HELD on the GPU, and the reference's preemption takes only active caches. When nothing else
//!   can move, the newest suspended recompute candidate gives its held pages up (preempted, listed in
//!   `recompute_paused`). (Where context-side preemption finds an active candidate, it takes the
//!   newest held one instead: `preempt`.) A continuation that difference 3 suspended again is not
//!   taken: upstream holds it resumed and retries it next pass, its prefill kept (`resuspended.rs`).
//!   The first chunk it may block preempts it as upstream does (it counts as an active candidate).
//!
//! Either remedy is progress. Each is bounded: the wedge breaker turns an active partial context into a
//! suspended one (only a scheduled chunk turns one back), the held-page remedy turns a suspended request
//! into one with no KV. A pool truly too small still ends in `Error::Deadlock` after the threshold.

use crate::adapter::PeftBackend;
use crate::config::CapacityPolicy;
use crate::error::Error;
use crate::kv::{KvBackend, KvCaps};
use crate::phase::Phase;
use crate::storage::Storage;

use super::marks::Mark;
use super::pass::Pass;
use super::table::AnyRequest;

impl<K: KvBackend, P: PeftBackend, const N: usize, const T: usize, S: Storage>
    Pass<'_, K, P, N, T, S>
{
    /// The verdict on this pass; updates `stall`.
    pub(crate) fn detect_deadlock(&mut self, stall: &mut u32) -> Result<(), Error> {
        let out = &*self.out;
        let progress = !out.generation().is_empty()
            || !out.context().is_empty()
            || !out.encoder().is_empty()
            || !out.disagg().is_empty()
            || self.evictions > 0
            || self.recomputes > 0
            || self.stats.deferred > 0;
        if progress || !self.has_candidates() || self.transfer_holds_pages() {
            *stall = 0;
            return Ok(());
        }
        if self.break_context_wedge() || self.release_held_pages() {
            *stall = 0;
            return Ok(());
        }
        *stall += 1;
        if *stall >= self.cfg.deadlock_threshold {
            crate::fmt::log_warn!("scheduler deadlock after {} stalled passes", *stall);
            return Err(Error::Deadlock {
                stalled: *stall,
                connector: self.kv.transfers().is_some(),
            });
        }
        Ok(())
    }

    /// Work is pending: a generation request (not completing, not in flight, no connector load
    /// pending) or a deferred context that was not preempted in this pass.
    fn has_candidates(&self) -> bool {
        let generation = self.table.order().iter().any(|&s| {
            let e = self.table.entry(s);
            let p = e.spec().phase;
            p.is_generation()
                && p != Phase::GenerationToComplete
                && !e.sits_out()
                && !e.pending_load()
        });
        generation
            || (0..self.pending_len()).any(|k| {
                let s = self.table.slot(usize::from(self.pending_at(k).index));
                !self.marked(s, Mark::PREEMPTED)
            })
    }

    /// Pages that a transfer holds will come free (not a stall): a request in a transfer-holding
    /// state, an active request with a connector load pending, or sends of the KV backend's transfer
    /// manager in flight (spec §1.12).
    fn transfer_holds_pages(&self) -> bool {
        self.kv
            .caps()
            .transfers
            .is_some_and(super::super::kv::caps::Transfers::sends_in_flight)
            || self.table.order().iter().any(|&s| {
                let e = self.table.entry(s);
                e.spec().phase.holds_transfer() || (e.pending_load() && e.ownership().on_gpu())
            })
    }

    /// The wedge breaker (see the module docs). Returns whether it suspended one.
    fn break_context_wedge(&mut self) -> bool {
        let limits = self.kv.limits();
        if !limits.tier_below_gpu
            || !limits.can_evict
            || self.cfg.policy == CapacityPolicy::GuaranteedNoEvict
        {
            return false;
        }
        let wedged = |s: &u16| {
            let e = self.table.entry(*s);
            !e.sits_out()
                && !e.pending_load()
                && e.spec().phase.is_context_init()
                && e.spec().started()
                && e.ownership().on_gpu()
        };
        let count = self.table.order().iter().filter(|s| wedged(s)).count();
        let youngest = self.table.order().iter().rev().find(|s| wedged(s)).copied();
        match (count >= 2, youngest) {
            (true, Some(s)) => {
                self.suspend(s);
                self.stats.victims += 1;
                true
            }
            _ => false,
        }
    }

    /// The held-page remedy (see the module docs). Returns whether it preempted one.
    fn release_held_pages(&mut self) -> bool {
        if self.kv.limits().tier_below_gpu
            || !self.cfg.recompute_pause
            || self.cfg.policy == CapacityPolicy::GuaranteedNoEvict
        {
            return false;
        }
        let held = self.table.order().iter().rev().copied().find(|&s| {
            let e = self.table.entry(s);
            let r = crate::kv::KvRef {
                slot: s,
                id: e.spec().id,
            };
            matches!(e.held(), AnyRequest::Paused(_))
                && self.kv.cache(r).exists()
                && self.recompute_candidate(s)
                && !self.resuspended(s)
        });
        match held {
            Some(s) => {
                self.preempt(s);
                true
            }
            None => false,
        }
    }
}
