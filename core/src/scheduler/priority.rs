//! Priority that preempts ([`Admission::Priority`], beyond the reference; issue 45).
//!
//! Phase 2 orders the pending list by priority (the lower value first, as vLLM's `priority`), then
//! arrival, a request admitted before ahead of a waiting one of its priority, so a victim keeps its
//! place (`admission.rs`). When phase 2 refuses the first request in that order pages, a batch slot or
//! its adapter — after its other checks passed: the refusal is a resource's — the pass records it
//! ([`Blocked`]). The next pass begins by honouring the record while that request still waits:
//!
//! - one running request of strictly lower priority yields ([`Pass::yield_one`]): the lowest priority
//!   first, the newest first within it; suspended where a tier lies below the GPU, else recompute-
//!   paused (where recompute pause is allowed). Its lease is returned as at any suspension and comes
//!   back with its KV. For an adapter refusal only a holder of another adapter's lease yields;
//! - for pages or a batch slot, no request of strictly lower priority that is not on the GPU is
//!   admitted, replayed or resumed in the pass (vLLM's priority queue stops at a head it cannot
//!   schedule); for an adapter, nothing is held back (other adapters' requests run, as vLLM skips).
//!
//! One victim a pass: the pass does not know how many pages a victim frees, so the requester waits a
//! pass per victim it needs rather than emptying the batch for a request that then needs none of it.
//! Never among equal priorities (the comparison is strict), never under GUARANTEED_NO_EVICT (it
//! promises no eviction). The ladder and context-side preemption of every pass take no victim of
//! strictly higher priority than their requester (`may_take`), so a resumed victim cannot evict the
//! request it yielded to.
//!
//! Progress: strict priority, no aging. A request waits on requests of higher priority as long as they
//! are live; once none is, the progress bound of issue 42 holds for it (`core/tests/model.rs`, where
//! the most senior runnable request is the first by priority, then arrival).

use crate::adapter::PeftBackend;
use crate::config::{Admission, CapacityPolicy};
use crate::kv::KvBackend;
use crate::storage::Storage;

use super::marks::Mark;
use super::pass::Pass;

/// What a blocked request was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Need {
    /// Pages or a batch slot.
    Room,
    /// Its adapter's pages on the device.
    Adapter,
}

/// The first request in phase 2's order that a pass refused a resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Blocked {
    slot: u16,
    id: u64,
    priority: u8,
    need: Need,
    /// A lease holder yielded for its adapter while it stayed blocked: no other will (releasing a
    /// lease does not always make room for an adapter, and the holder comes back).
    adapter_yielded: bool,
}

/// What a pass holds back: under priority, and under the thrash guard (`thrash.rs`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Holds {
    /// Requests of a priority lower than this wait (`held_back`).
    held_below: Option<u8>,
    /// The last pass's blocked request, honoured in this one.
    honoured: Option<Blocked>,
    /// No new request after this arrival index is admitted (the thrash guard).
    pub(crate) new_after: Option<usize>,
}

impl Holds {
    /// Nothing held back, nothing honoured (a pass's start).
    pub(crate) const NONE: Holds = Holds {
        held_below: None,
        honoured: None,
        new_after: None,
    };
}

impl<K: KvBackend, P: PeftBackend, const N: usize, const T: usize, S: Storage>
    Pass<'_, K, P, N, T, S>
{
    /// Priority preemption applies: the policy orders by priority and may evict.
    #[inline]
    pub(crate) fn by_priority(&self) -> bool {
        self.cfg.admission == Admission::Priority
            && self.cfg.policy == CapacityPolicy::MaxUtilization
    }

    /// The request at `slot` waits to be scheduled: in the window, not a running decode step (a
    /// context request, or one off the GPU), not in flight.
    fn waits(&self, slot: u16) -> bool {
        let e = self.table.entry(slot);
        let phase = e.spec().phase;
        let running = e.ownership().on_gpu() && phase.is_generation();
        self.cfg.window.contains(phase) && !running && !e.sits_out()
    }

    /// Phase 2 refused the request at `slot` a resource (`need`): recorded for the next pass, if it is
    /// the first this pass refused.
    pub(crate) fn note_blocked(&mut self, slot: u16, need: Need) {
        if !self.by_priority() || self.blocked.is_some() {
            return;
        }
        let s = self.table.entry(slot).spec();
        let same = self
            .holds
            .honoured
            .filter(|b| b.id == s.id.0 && b.slot == slot);
        *self.blocked = Some(Blocked {
            slot,
            id: s.id.0,
            priority: s.priority,
            need,
            adapter_yielded: same.is_some_and(|b| b.adapter_yielded),
        });
        if need == Need::Room {
            // The rest of the pass leaves lower priorities where they are (no chunk grows into its
            // room).
            self.holds.held_below = Some(s.priority);
        }
    }

    /// Phase 1 found the batch full: the most senior request not scheduled that waits (the first by
    /// priority, then arrival) is blocked.
    #[cold]
    pub(crate) fn batch_full(&mut self) {
        if !self.by_priority() || self.blocked.is_some() {
            return;
        }
        let passed =
            |p: &Self, s: u16| p.marked(s, Mark::PREEMPTED) || p.marked(s, Mark::SCHEDULED);
        let senior = (0..self.table.len())
            .map(|j| self.table.slot(j))
            .filter(|&s| self.waits(s) && !passed(self, s))
            .min_by_key(|&s| self.table.entry(s).spec().priority);
        if let Some(s) = senior {
            self.note_full(s);
        }
    }

    /// Phase 2 found the batch full at its pending entry `k`: that request is blocked.
    pub(crate) fn full_before(&mut self, k: usize) {
        if !self.by_priority() || k >= self.pending_len() {
            return;
        }
        let slot = self.table.slot(usize::from(self.pending_at(k).index));
        if !self.marked(slot, Mark::PREEMPTED) && !self.held_back(slot) {
            self.note_full(slot);
        }
    }

    /// The request at `slot` was refused a batch slot: blocked for room where its adapter would be had
    /// (its other checks), else for its adapter.
    fn note_full(&mut self, slot: u16) {
        let adapter = self.peft_need(slot).is_some() && self.lease_obtainable(slot);
        self.note_blocked(slot, if adapter { Need::Room } else { Need::Adapter });
    }

    /// Before phase 1: the last pass's record, while its request still waits, holds back lower
    /// priorities (for room) and makes one running request of lower priority yield (for an adapter,
    /// once while it stays blocked).
    pub(crate) fn honour_blocked(&mut self) {
        let Some(mut b) = self.blocked.take() else {
            return;
        };
        let live = self.table.index_of(b.slot).is_some()
            && self.table.entry(b.slot).spec().id.0 == b.id
            && self.waits(b.slot);
        if !live || !self.by_priority() {
            return;
        }
        if b.need == Need::Room {
            self.holds.held_below = Some(b.priority);
        }
        if b.need == Need::Room || !b.adapter_yielded {
            let yielded = self.yield_one(b);
            b.adapter_yielded |= yielded && b.need == Need::Adapter;
        }
        self.holds.honoured = Some(b);
    }

    /// One running request of strictly lower priority than `b`'s yields (for an adapter, a holder of
    /// another adapter's lease). Returns whether one did.
    fn yield_one(&mut self, b: Blocked) -> bool {
        let task = self.table.entry(b.slot).task();
        let (len, suspend) = (self.table.len(), self.kv.limits().can_evict);
        if !suspend && !self.cfg.recompute_pause {
            return false;
        }
        let holds_other = |p: &Self, s: u16| {
            let e = p.table.entry(s);
            e.task().is_some() && e.task() != task
        };
        // Oldest first: `max_by_key` keeps the last of the lowest priority, the newest.
        let victim = (0..len)
            .map(|j| self.table.slot(j))
            .filter(|&s| s != b.slot && self.yields_to(s, b.priority, suspend))
            .filter(|&s| b.need == Need::Room || holds_other(self, s))
            .max_by_key(|&s| self.table.entry(s).spec().priority);
        let Some(v) = victim else {
            return false;
        };
        // Suspended where suspension frees its pages, else recompute-paused; nothing schedules it
        // again in this pass.
        if suspend {
            self.suspend(v);
        } else {
            self.preempt(v);
            self.mark(v, Mark::RECOMPUTED);
        }
        self.mark(v, Mark::PREEMPTED);
        self.stats.yielded += 1;
        true
    }

    /// A running request of priority lower than `priority` that can give its KV up now.
    fn yields_to(&self, slot: u16, priority: u8, suspend: bool) -> bool {
        let h = self.table.hot(slot);
        let movable = if suspend {
            h.evictable()
        } else {
            h.on_gpu() && h.recomputable()
        };
        movable && self.table.entry(slot).spec().priority > priority
    }

    /// The request at `slot` waits this pass: of lower priority than a blocked request, and not a
    /// running decode step (a context request, or one off the GPU).
    #[inline]
    pub(crate) fn held_back(&self, slot: u16) -> bool {
        let Some(p) = self.holds.held_below else {
            return false;
        };
        let e = self.table.entry(slot);
        e.spec().priority > p && !(e.ownership().on_gpu() && e.spec().phase.is_generation())
    }

    /// Context-side preemption may take `victim` for `requester`: never a request of strictly higher
    /// priority under [`Admission::Priority`].
    #[inline]
    pub(crate) fn may_take(&self, requester: u16, victim: u16) -> bool {
        self.cfg.admission != Admission::Priority
            || self.table.entry(victim).spec().priority
                >= self.table.entry(requester).spec().priority
    }
}
