//! Priority that preempts ([`Admission::Priority`], beyond the reference; issue 45).
//!
//! The request table is ordered by priority (the lower value first, as vLLM's `priority`), then arrival
//! (`Table::insert`), so every rule of the reference reads it as its arrival order: the ladder evicts
//! the lowest priority's newest, a suspended request keeps its place among its priority. Phase 2's
//! pending list is ordered the same way (`admission.rs`). When a pass refuses the first request in that
//! order pages or a batch slot — after its other checks passed: the refusal is a resource's — it records
//! it ([`Blocked`]), and no lower priority grows into the room for the rest of the pass. The next pass
//! begins by honouring the record while that request still waits:
//!
//! - one running request of strictly lower priority yields ([`Pass::yield_one`]): the lowest priority
//!   first, the newest first within it; suspended where suspension frees its pages, else
//!   recompute-paused (where recompute pause is allowed); never one in a transfer. Its lease is returned
//!   as at any suspension and comes back with its KV;
//! - no request of lower priority that is not running is admitted, replayed or resumed in the pass
//!   (vLLM's priority queue stops at a head it cannot schedule), except a suspended one whose pages stay
//!   on the GPU (holding it back could only keep them there);
//! - once admitted, while its prompt is not done, lower priorities stay held back ([`Need::Finish`]),
//!   so a resumed victim does not take the pages of its next chunk.
//!
//! A request the device cache refuses its adapter is honoured too: a lease holder of another adapter
//! yields, by suspension only (its lease returned, its adapter paused and evictable from the device),
//! and only while the adapter backend would grant the request's lease (a suspended holder stays paused
//! on its adapter's host copy, so where the host tier refuses, a yield frees nothing); where nothing
//! can yield, the refusal only orders and holds nobody back (holding could keep the adapters' holders
//! from finishing). A refusal by the adapter backend itself is only ordered. (A first yield for
//! adapters over-committed the device at 20,000 model cases: the plan committed 0 pages for a request
//! whose task the ladder un-counted during its own step, `Pass::commit_task`, now mended.)
//! One victim a pass: the pass does not know how many pages a victim frees. Never among equal
//! priorities (the comparison is strict), never under GUARANTEED_NO_EVICT (it promises no eviction).
//! Context-side preemption takes no victim of strictly higher priority than its requester (`may_take`),
//! nor does the ladder's fallback over this pass's suspensions, so a resumed victim cannot evict the
//! request it yielded to.
//!
//! Progress: strict priority, no aging. A request waits on requests of higher priority as long as they
//! are live; once none is, the progress bound of issue 42 holds for it with a slack of two passes
//! (`core/tests/model.rs`, where the most senior runnable request is the first by priority, then
//! arrival).

use crate::adapter::PeftBackend;
use crate::config::{Admission, CapacityPolicy};
use crate::kv::KvBackend;
use crate::storage::Storage;

use super::marks::Mark;
use super::pass::Pass;

/// What a blocked request was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Need {
    /// A batch slot.
    Slot,
    /// KV pages.
    Pages,
    /// Its adapter's pages (the device cache's, under priority; a service class's also the backend's).
    Adapter,
}

/// The first request in phase 2's order that a pass refused a resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Blocked {
    pub(crate) slot: u16,
    /// The slot's version when recorded (a removed request's slot may be reused).
    pub(crate) version: u32,
    id: u64,
    pub(crate) need: Need,
    /// It was admitted since and its prompt is not done: what it was blocked by stays held back until
    /// it is (else a resumed victim takes the pages its next chunk needs, and the two take turns).
    pub(crate) admitted: bool,
}

/// The blocked requests a pass leaves for the next: one under priority, one for a service class
/// (`classes.rs`).
#[derive(Debug, Clone, Copy, Hash)]
pub(crate) struct Records {
    pub(crate) priority: Option<Blocked>,
    pub(crate) class: Option<Blocked>,
}

impl Records {
    /// No record (a new scheduler).
    pub(crate) const NONE: Records = Records {
        priority: None,
        class: None,
    };
}

/// What a pass holds back: under priority, for a service class (`classes.rs`), and under the thrash
/// guard (`thrash.rs`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Holds {
    /// Requests of a priority lower than this wait (`held_back`).
    held_below: Option<u8>,
    /// The last pass's blocked request, honoured in this one.
    honoured: Option<Blocked>,
    /// No new request after this arrival index is admitted (the thrash guard).
    pub(crate) new_after: Option<usize>,
    /// The service class claim honoured in this pass, and what it holds back.
    pub(crate) claim: Option<super::classes::Claim>,
    /// What the service classes use, read once a pass (`classes.rs`).
    pub(crate) usage: Option<super::classes::Usage>,
}

impl Holds {
    /// Nothing held back, nothing honoured (a pass's start).
    pub(crate) const NONE: Holds = Holds {
        held_below: None,
        honoured: None,
        new_after: None,
        claim: None,
        usage: None,
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
    pub(crate) fn waits(&self, slot: u16) -> bool {
        let e = self.table.entry(slot);
        let phase = e.spec().phase;
        let running = e.ownership().on_gpu() && phase.is_generation();
        self.cfg.window.contains(phase) && !running && !e.sits_out()
    }

    /// Phase 2 refused the request at `slot` a resource (`need`): recorded for the next pass, if it is
    /// the first this pass refused.
    pub(crate) fn note_blocked(&mut self, slot: u16, need: Need) {
        self.note_claim(slot, need);
        if !self.by_priority() || self.blocked.priority.is_some() {
            return;
        }
        self.blocked.priority = Some(self.record(slot, need));
        if need != Need::Adapter {
            // The rest of the pass leaves lower priorities where they are (no chunk grows into its
            // room).
            self.holds.held_below = Some(self.table.entry(slot).spec().priority);
        }
    }

    /// A record of the request at `slot`, refused `need`.
    pub(crate) fn record(&self, slot: u16, need: Need) -> Blocked {
        Blocked {
            slot,
            version: self.table.version_at(slot),
            id: self.table.entry(slot).spec().id.0,
            need,
            admitted: false,
        }
    }

    /// The request of a record, where it still waits (the same request, not held by the thrash
    /// guard), or, admitted, sits this pass out on the GPU (its step in flight: its prompt is not
    /// done): its arrival index.
    pub(crate) fn standing(&self, b: Blocked) -> Option<usize> {
        let at = self.table.index_of(b.slot)?;
        let e = self.table.entry(b.slot);
        let finishing = b.admitted && e.sits_out() && e.ownership().on_gpu();
        let live = self.table.version_at(b.slot) == b.version
            && e.spec().id.0 == b.id
            && (self.waits(b.slot) || finishing);
        (live && !self.holds_admission(at, b.slot)).then_some(at)
    }

    /// Phase 1 found the batch full: the most senior request not scheduled that waits (the first by
    /// priority, then arrival) is blocked.
    #[cold]
    pub(crate) fn batch_full(&mut self) {
        self.claim_slot();
        if !self.by_priority() || self.blocked.priority.is_some() {
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
        // A class's claim may be any waiting request's, not only this one's.
        self.claim_slot();
        if (!self.by_priority() && self.cfg.shares.is_none()) || k >= self.pending_len() {
            return;
        }
        let slot = self.table.slot(usize::from(self.pending_at(k).index));
        if !self.marked(slot, Mark::PREEMPTED) && !self.held_back(slot) {
            self.note_full(slot);
        }
    }

    /// The request at `slot` was refused a batch slot: blocked for room where its adapter would be had
    /// (its other checks).
    fn note_full(&mut self, slot: u16) {
        if self.peft_need(slot).is_some() && self.lease_obtainable(slot) {
            self.note_blocked(slot, Need::Slot);
        }
    }

    /// Before phase 1: the last pass's record, while its request still waits (the same request, not
    /// held by the thrash guard), holds back lower priorities and, for room, makes one running request
    /// of lower priority yield. Its current priority counts (`update` may have changed it).
    pub(crate) fn honour_blocked(&mut self) {
        let Some(b) = self.blocked.priority.take() else {
            return;
        };
        if !self.by_priority() || self.standing(b).is_none() {
            return;
        }
        let priority = self.table.entry(b.slot).spec().priority;
        self.holds.held_below = Some(priority);
        if !b.admitted {
            // Never the request a class's claim waits for (honoured next, `classes.rs`).
            let claimant = self.blocked.class.map(|c| c.slot);
            let lower = move |p: &Self, s: u16| p.table.entry(s).spec().priority > priority;
            let frees = self.frees_adapter_for(b);
            let yielded = self.yield_where(b.slot, move |p, s| {
                lower(p, s) && frees(p, s) && Some(s) != claimant
            });
            if !yielded && b.need == Need::Adapter {
                // No holder to take its adapter's pages from: holding lower priorities back could
                // only keep the adapters' holders from finishing (a wedge the model tests found).
                self.holds.held_below = None;
                return;
            }
        }
        self.holds.honoured = Some(b);
    }

    /// Which running requests yielding would help record `b`: any, for room; for its adapter (the
    /// device cache refused it), a lease holder of another adapter, only by suspension (a
    /// recompute-paused holder replays at once and takes its adapter back: the two took turns in the
    /// model tests), and only while the adapter backend would grant its lease (a suspended holder stays
    /// paused on its adapter's host copy: where the host tier is what refuses, it frees nothing, and
    /// the two took turns again).
    fn frees_adapter_for(&self, b: Blocked) -> impl Fn(&Self, u16) -> bool + Copy {
        let task = self.table.entry(b.slot).task().map(|t| t.slot);
        let helps = self.kv.limits().can_evict && self.lease_obtainable(b.slot);
        move |p: &Self, s: u16| {
            b.need != Need::Adapter
                || (helps
                    && p.table
                        .entry(s)
                        .task()
                        .is_some_and(|t| Some(t.slot) != task))
        }
    }

    /// After phase 2: a request honoured this pass and admitted, whose prompt is not done, keeps lower
    /// priorities held back next pass ([`Blocked::admitted`]), unless a refusal was recorded.
    pub(crate) fn keep_finishing(&mut self) {
        let kept = self.holds.honoured.and_then(|b| self.finishing(b));
        if self.blocked.priority.is_none() {
            self.blocked.priority = kept;
        }
    }

    /// A record honoured this pass, whose request was admitted and has not finished its prompt: kept
    /// for the next pass, admitted.
    pub(crate) fn finishing(&self, b: Blocked) -> Option<Blocked> {
        let e = self.table.entry(b.slot);
        let unfinished =
            e.spec().phase == crate::phase::Phase::ContextInit && e.ownership().on_gpu();
        (unfinished && self.table.version_at(b.slot) == b.version).then_some(Blocked {
            admitted: true,
            ..b
        })
    }

    /// One running request that `victim` accepts (not the one at `slot`) yields: the lowest priority
    /// first, the newest first within it. Returns whether one did.
    pub(crate) fn yield_where(&mut self, slot: u16, victim: impl Fn(&Self, u16) -> bool) -> bool {
        let (len, suspend) = (self.table.len(), self.kv.limits().can_evict);
        if !suspend && !self.cfg.recompute_pause {
            return false;
        }
        // `max_by_key` keeps the last of the lowest priority, the newest.
        let victim = (0..len)
            .map(|j| self.table.slot(j))
            .filter(|&s| s != slot && self.may_yield(s, suspend) && victim(self, s))
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

    /// The request at `slot` is the one a record honoured in this pass waits for (priority's or a
    /// service class's).
    pub(crate) fn claimant(&self, slot: u16) -> bool {
        let claim = self.holds.claim.map(super::classes::Claim::record);
        [self.holds.honoured, claim]
            .into_iter()
            .flatten()
            .any(|b| b.slot == slot)
    }

    /// A running request that can give its KV up now, not one a record honoured in this pass waits
    /// for.
    fn may_yield(&self, slot: u16, suspend: bool) -> bool {
        if self.claimant(slot) {
            return false;
        }
        let h = self.table.hot(slot);
        let movable = if suspend {
            h.evictable()
        } else {
            h.on_gpu() && h.recomputable()
        };
        // Never a request in a transfer (outside the schedulable window): its KV is being sent or
        // received.
        let e = self.table.entry(slot);
        movable && self.cfg.window.contains(e.spec().phase) && !self.marked(slot, Mark::PREEMPTED)
    }

    /// The request at `slot` waits this pass: of lower priority than a blocked request, or held by a
    /// service class's claim (`classes.rs`), and not a running decode step (a context request, or one
    /// off the GPU); never the request of a record honoured in this pass.
    #[inline]
    pub(crate) fn held_back(&self, slot: u16) -> bool {
        if !self.restrains() {
            return false;
        }
        if self.claimant(slot) {
            // Neither record holds the other's request back (the two would wait on each other).
            return false;
        }
        if self.claim_holds(slot) {
            return true;
        }
        let Some(p) = self.holds.held_below else {
            return false;
        };
        self.table.entry(slot).spec().priority > p && self.holdable(slot)
    }

    /// Whether this pass may hold a request back or keep it from a batch slot: under a record's
    /// holds, or with service classes (`displaces`). Off, the pass's per-request checks cost this load
    /// and nothing else.
    #[inline(always)]
    pub(crate) fn restrains(&self) -> bool {
        self.holds.held_below.is_some() || self.holds.claim.is_some() || self.cfg.shares.is_some()
    }

    /// The request at `slot` may be held back: not a running decode step (a context request, or one
    /// off the GPU), nor a suspended request whose pages stay on the GPU (no lower tier takes them:
    /// holding it back could only keep them there for ever).
    pub(crate) fn holdable(&self, slot: u16) -> bool {
        let e = self.table.entry(slot);
        let running = e.ownership().on_gpu() && e.spec().phase.is_generation();
        let kept =
            e.ownership() == crate::request::Ownership::Paused && !self.kv.limits().can_evict;
        !running && !kept
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
