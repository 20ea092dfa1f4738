//! Prefix-aware skip (spec §1.10, the port of C++ `beneficialToSkip`): a first chunk whose first new
//! block another request contributes in this pass is deferred one pass, so it reuses that block instead
//! of computing it twice.
//!
//! Live only when prefix-aware scheduling is on and the KV backend reuses every block (the reference's
//! ALL_REUSABLE policy, [`crate::kv::PrefixReuse::all_blocks_reusable`]), and only when there is something to defer: a
//! first-chunk candidate, and either an in-flight continuation, a pending continuation or a second
//! candidate. The contributed set starts with the in-flight continuations' keys; a pending request adds
//! its key only once it is scheduled, so a failing contributor never causes a deferral.
//!
//! Invariant (kept for the deadlock detector): a deferral only ever happens behind a contributor that
//! runs this pass (or is in flight), and counts as progress.

use crate::adapter::PeftBackend;
use crate::kv::{KvBackend, KvCaps, KvRef, PrefixReuse};
use crate::phase::Phase;
use crate::storage::{FixedList, Storage};

use super::pass::Pass;

impl<K: KvBackend, P: PeftBackend, const N: usize, const T: usize, S: Storage>
    Pass<'_, K, P, N, T, S>
{
    /// A context request that owns no KV (waiting, or replaying after a recompute pause) or stands at
    /// position 0 starts with a first chunk.
    pub(crate) fn first_chunk(&self, slot: u16) -> bool {
        let e = self.table.entry(slot);
        e.spec().position == 0
            || !e.ownership().on_gpu() && !self.kv.cache(self.kv_ref(slot)).exists()
    }

    /// Decides whether the skip is live this pass and seeds the contributed set.
    pub(crate) fn begin_prefix_skip(&mut self) {
        self.contributed.clear();
        self.skip_live = false;
        let reusable = self
            .kv
            .caps()
            .prefix
            .is_some_and(super::super::kv::caps::PrefixReuse::all_blocks_reusable);
        if !self.cfg.prefix_aware || !reusable {
            return;
        }
        let context = |e: &crate::scheduler::Entry<'_>| e.spec().phase == Phase::ContextInit;
        let (mut candidates, mut pending_continuations) = (0u32, 0u32);
        for k in 0..self.pending_len() {
            let slot = self.table.slot(usize::from(self.pending_at(k).index));
            if !context(&self.table.entry(slot)) {
                continue;
            }
            if self.first_chunk(slot) {
                candidates += 1;
            } else {
                pending_continuations += 1;
            }
            if candidates > 0 && candidates + pending_continuations >= 2 {
                // Live whatever follows: the rest of the queue need not be counted.
                break;
            }
        }
        if candidates == 0 {
            return;
        }
        // The in-flight continuations seed the contributed set; with none, one candidate and no pending
        // continuation there is nothing to defer (and nothing was probed).
        // The span's members are fresh first chunks, none in flight (`span.rs`): not read; nor is the
        // table when no context request is in flight.
        let (from, to) = self.span.arrivals();
        let len = self.table.len();
        let seeds = if self.table.contexts_in_flight() == 0 {
            0
        } else {
            self.seed(0, from.min(len)) + self.seed(to.min(len), len)
        };
        self.skip_live = seeds > 0 || candidates >= 2 || pending_continuations > 0;
    }

    /// The in-flight continuations among arrival indices `from..to` contribute their next keys;
    /// returns how many there were.
    fn seed(&mut self, from: usize, to: usize) -> u32 {
        let mut seeds = 0u32;
        for i in from..to {
            let slot = self.table.slot(i);
            if self.table.hot(slot).inflight() && self.in_flight_continuation(slot) {
                seeds += 1;
                if let Some(key) = self.probe(slot, false) {
                    self.contribute(key);
                }
            }
        }
        seeds
    }

    /// A context request past its first chunk, in flight: it contributes whatever it computes next.
    fn in_flight_continuation(&self, slot: u16) -> bool {
        let e = self.table.entry(slot);
        e.inflight() && e.spec().phase == Phase::ContextInit && !self.first_chunk(slot)
    }

    /// The request's first new block key, when the skip is live and it is a context request: the probe
    /// of §1.6 step 5. `Err(())`: defer it (a first chunk behind a contributor).
    pub(crate) fn prefix_probe(&mut self, slot: u16) -> Result<Option<u64>, ()> {
        if !self.skip_live || self.table.entry(slot).spec().phase != Phase::ContextInit {
            return Ok(None);
        }
        let first = self.first_chunk(slot);
        let key = self.probe(slot, first);
        match key {
            Some(k) if first && self.contributed.contains(&k) => {
                self.stats.deferred += 1;
                Err(())
            }
            _ => Ok(key),
        }
    }

    /// A scheduled request contributes its first new block.
    pub(crate) fn contribute(&mut self, key: u64) {
        if !self.contributed.contains(&key) {
            let pushed = self.contributed.push(key);
            assert!(pushed.is_ok(), "one contribution per live request");
        }
    }

    /// The request's first new block key (§1.6 step 5's probe), side-effect free.
    pub(crate) fn probe(&self, slot: u16, first: bool) -> Option<u64> {
        let r: KvRef = self.kv_ref(slot);
        let prefix = self.kv.caps().prefix?;
        prefix.probe_first_new_block(r, self.context_prep(slot, first))
    }
}
