//! The thrash guard ([`crate::Config::thrash_guard`], beyond the reference; issue 45): under KV
//! oversubscription MAX_UTILIZATION can pause and recompute the same requests again and again, each
//! replay taking the pages the next admission then needs (TensorRT-LLM #16827: 40.6 % less throughput,
//! 9.1× worse p99 time per output token). The guard counts, per request, the times it gave its KV up
//! to recompute (recompute pause or preemption); while a request that did so twice or more waits to
//! replay (recompute-paused, or replaying its prompt), no request that arrived after it and owns nothing
//! is admitted — a new one, or a younger recompute-paused one's replay (the requests that thrash are
//! admitted ones replaying among themselves: holding new requests alone barely moved them): what runs
//! finishes, the senior replay gets the pages, and admissions open again once it is done. Later chunks,
//! suspended requests and decodes are never held, nor a request older than every thrashing one (the
//! progress bound: the oldest runnable request is never held for a younger one).

use crate::adapter::PeftBackend;
use crate::kv::KvBackend;
use crate::phase::Phase;
use crate::request::Ownership;
use crate::storage::Storage;

use super::pass::Pass;

/// Recomputes of one request that make it a thrashing one.
const REPEATED: u8 = 2;

impl<K: KvBackend, P: PeftBackend, const N: usize, const T: usize, S: Storage>
    Pass<'_, K, P, N, T, S>
{
    /// The request at `slot` gave its KV up to recompute: counted under the guard.
    pub(crate) fn count_recompute(&mut self, slot: u16) {
        if self.cfg.thrash_guard {
            self.table
                .edit(slot, |r| r.recomputed = r.recomputed.saturating_add(1));
        }
    }

    /// Before phase 1: admissions (new requests, replays) after the oldest request recomputed
    /// repeatedly that waits to replay are held.
    pub(crate) fn guard_thrash(&mut self) {
        if !self.cfg.thrash_guard {
            return;
        }
        self.holds.new_after = self.table.order().iter().position(|&s| {
            let e = self.table.entry(s);
            let replaying = e.ownership() == Ownership::Recompute
                || (e.spec().phase == Phase::ContextInit && e.spec().position < e.spec().prompt);
            e.recomputed() >= REPEATED && replaying
        });
    }

    /// The request at arrival index `i`, owning nothing (new, or recompute-paused), is held this pass.
    #[inline]
    pub(crate) fn holds_admission(&self, i: usize, slot: u16) -> bool {
        self.holds.new_after.is_some_and(|first| i > first)
            && matches!(
                self.table.entry(slot).ownership(),
                Ownership::Waiting | Ownership::Recompute
            )
    }

    /// [`Self::holds_admission`], counted.
    #[inline]
    pub(crate) fn thrash_held(&mut self, i: usize, slot: u16) -> bool {
        let held = self.holds_admission(i, slot);
        self.stats.held += u32::from(held);
        held
    }
}
