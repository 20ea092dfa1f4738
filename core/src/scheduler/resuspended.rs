//! Differences 3 and 7 together: a continuation that difference 3 suspended again counts, for
//! context-side preemption and the stall remedy, as the active cache upstream leaves it.
//!
//! Phase 2 resumes a suspended later chunk's cache to prepare it; when the chunk is then not scheduled
//! (its resize refused, or no chunk within the token budget) and the cache is still active, kvsched
//! suspends it again (difference 3: no request holds active KV without its lease). Upstream leaves it
//! resumed, and from then on it is an *active* preemption candidate there (spec §1.8) until it is
//! scheduled or preempted. Difference 7 asks "would upstream preempt here?" and the stall remedy takes
//! pages upstream cannot free; so that both see what upstream sees, such a request is marked
//! (the table record's `resuspended`, kept across passes, cleared by any transition out of
//! `Paused`) and counts as an active candidate, not as a held one:
//!
//! - a request refused pages preempts where upstream would (it takes the newest held candidate that is
//!   not marked, else the newest active one, marked ones included, as upstream);
//! - the stall remedy never takes a marked request: upstream retries it next pass, its prefill kept;
//! - the generation ladder's ordinary eviction takes a marked request where upstream's takes the cache
//!   it left resumed: it is listed in `paused`, its mark cleared (it is now suspended as upstream's is),
//!   the end index shrinks to it and it counts as a victim. Its KV is suspended already (no call).
//!
//! Before the mark such a request counted as held (never an active candidate): a request short of its
//! pages preempted nobody while another request's decode kept the pass "progressing", the stall remedy
//! discarded its prefill, and it could win the pages back each pass from an older active context, which
//! replayed into them first the next pass (a livelock; `core/tests/model.rs`,
//! `regression_a_held_continuation_and_an_older_context_do_not_preempt_each_other_for_ever` and the two
//! after it; scenarios HP05-HP08).
//!
//! Invariant: only a `Paused` later chunk is marked (any transition out of `Paused` clears the mark), and
//! `Pass::resuspended` also asks that its cache still exists (held, suspended).

use crate::adapter::PeftBackend;
use crate::kv::{KvBackend, KvRef};
use crate::request::Ownership;
use crate::storage::Storage;

use super::marks::Mark;
use super::pass::{listed, Pass};
use super::table::AnyRequest;

impl<K: KvBackend, P: PeftBackend, const N: usize, const T: usize, S: Storage>
    Pass<'_, K, P, N, T, S>
{
    /// A suspended later chunk at `slot` was not scheduled: `resumed` when its cache came back active
    /// (difference 3 suspends it again; upstream leaves it resumed), false when it is suspended as
    /// upstream's is. A marked request is a new preemption candidate of this pass.
    pub(crate) fn note_resuspended(&mut self, slot: u16, resumed: bool) {
        self.table.edit(slot, |r| r.resuspended = resumed);
        if resumed {
            // The scan that found no active candidate did not see this one (`preempt.rs`).
            self.preempt_only = None;
        }
    }

    /// Whether the request at `slot` is a continuation difference 3 suspended again, which upstream
    /// holds resumed: an active candidate for context-side preemption, never the stall remedy's.
    pub(crate) fn resuspended(&self, slot: u16) -> bool {
        let e = self.table.entry(slot);
        let r = KvRef {
            slot,
            id: e.spec().id,
        };
        e.record.resuspended
            && matches!(e.held(), AnyRequest::Paused(_))
            && self.kv.cache(r).exists()
    }

    /// An ordinary eviction candidate as upstream sees it (§1.15): `Some(false)` when evictable,
    /// `Some(true)` for a continuation difference 3 suspended again (upstream holds it resumed on the
    /// GPU), else `None`.
    #[inline]
    pub(crate) fn ladder_candidate(&self, slot: u16) -> Option<bool> {
        let h = self.table.hot(slot);
        if h.evictable() {
            return Some(false);
        }
        let paused = h.ownership() == Ownership::Paused as u8 && h.idle_started();
        (paused && self.marked_continuation(slot)).then_some(true)
    }

    /// [`Self::resuspended`], out of the ladder's scan (a suspended request is rare there).
    #[cold]
    #[inline(never)]
    fn marked_continuation(&self, slot: u16) -> bool {
        self.resuspended(slot)
    }

    /// Ordinary eviction takes the marked continuation at `slot`: upstream suspends the cache it left
    /// resumed; here the KV is suspended already, so the request is listed in `paused` and its mark
    /// cleared (it is suspended as upstream's now is), marked evicted for the rest of the pass.
    pub(crate) fn evict_resuspended(&mut self, slot: u16) {
        debug_assert!(self.resuspended(slot));
        self.table.edit(slot, |r| r.resuspended = false);
        match self.table.entry(slot).held() {
            AnyRequest::Paused(p) => listed(self.out.push_paused(p)),
            _ => unreachable!("a marked request is suspended"),
        }
        self.mark(slot, Mark::EVICTED);
        self.evictions += 1;
    }
}
