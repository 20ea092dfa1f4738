//! The refused run kept out of phase 1 (issue 41): a queue that builds up behind a full pool costs a
//! pass nothing, not one deferral a request.
//!
//! The last pass's refused run (`refused_run.rs`) is recorded with whether its members are consecutive
//! in arrival order. When they are, phase 1 reaching its first member defers the whole run at once:
//! instead of pushing a pending entry for each member, it notes a [`Span`], pending positions
//! `at..at + count` standing for arrival indices `arrival..arrival + count`, and goes on after it.
//! Phase 2 reads the pending list through [`Pass::pending_at`] and [`Pass::pending_len`], which see the
//! span where its entries would be. What phase 1 would have done to each member is exactly this: a
//! member is a fresh waiting first chunk (no KV, not in flight, unmarked), so each would have passed
//! `defer`'s checks and been pushed, in arrival order, unless the request budget was full (then the
//! phase stops at the first member, as before) or the end index cuts the run (then it is visited).
//!
//! The members are the same requests as when the run was recorded when the first and the last stand
//! `count - 1` arrival indices apart: between passes the table only gains arrivals at its end and loses
//! requests that forget the run or hold KV on the GPU (never a member), and it never reorders.
//!
//! Only where runs apply (FCFS admission, FCFS or no chunking): no policy sorts or plans the pending
//! list there, so the span is read, never written.

use crate::adapter::PeftBackend;
use crate::kv::KvBackend;
use crate::narrow::u16_of;
use crate::storage::Storage;

use super::pass::{Pass, Pending};

/// The last pass's refused run deferred whole: pending positions `at..at + count` are the arrival
/// indices `arrival..arrival + count`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Span {
    at: usize,
    arrival: usize,
    count: usize,
}

impl Span {
    /// No span (every pending entry is in the list).
    pub(crate) const NONE: Span = Span {
        at: usize::MAX,
        arrival: 0,
        count: 0,
    };

    /// The members' arrival indices, `from..to` (`0..0` for none).
    pub(crate) fn arrivals(&self) -> (usize, usize) {
        (self.arrival, self.arrival + self.count)
    }
}

impl<K: KvBackend, P: PeftBackend, const N: usize, const T: usize, S: Storage>
    Pass<'_, K, P, N, T, S>
{
    /// Where phase 1 may meet a span: the first member's slot of the last pass's run when it is
    /// consecutive and runs apply (`u16::MAX`, no slot, otherwise).
    pub(crate) fn span_first(&self) -> u16 {
        let run = *self.run;
        if run.consecutive() && self.runs_apply() {
            run.first()
        } else {
            u16::MAX
        }
    }

    /// Phase 1 at arrival index `i`, the first member of the last pass's run (`span_first`), which
    /// passed `defer`'s checks: when the run is whole here, it is deferred at once; returns its length
    /// (`None`: defer `i` alone).
    #[inline(never)]
    pub(crate) fn defer_span(&mut self, i: usize) -> Option<usize> {
        let run = *self.run;
        if self.span.count != 0 {
            return None;
        }
        let count = run.len();
        let end = i + count;
        let whole = end <= self.end && self.table.slot(end - 1) == run.last();
        if !whole {
            return None;
        }
        debug_assert!((i..end).all(|j| {
            let slot = self.table.slot(j);
            let e = self.table.entry(slot);
            self.table.hot(slot).deferred() && !e.sits_out() && !e.ownership().on_gpu()
        }));
        self.span = Span {
            at: self.pending.len(),
            arrival: i,
            count,
        };
        Some(count)
    }

    /// The pending entry at position `k` (the span's members where it stands).
    #[inline]
    pub(crate) fn pending_at(&self, k: usize) -> Pending {
        let s = self.span;
        if k < s.at {
            self.pending[k]
        } else if k - s.at < s.count {
            Pending {
                index: u16_of(s.arrival + (k - s.at)),
                planned: 0,
                key: 0,
            }
        } else {
            self.pending[k - s.count]
        }
    }

    /// Pending entries, the span's members counted.
    #[inline]
    pub(crate) fn pending_len(&self) -> usize {
        self.pending.len() + self.span.count
    }

    /// No span stands in the pending list: a policy may sort or plan it in place.
    pub(crate) fn no_span(&self) -> bool {
        self.span.count == 0
    }
}
