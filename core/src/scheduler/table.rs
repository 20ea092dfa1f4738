//! The request table: every live request's typed ownership and spec (the entry), its hot record, the
//! arrival order and the id index.
//!
//! The entry holds the request *as its type-state* ([`AnyRequest`]: a `Request<Waiting>`, `Request<Active>`,
//! …). The hot record is the 16 bytes the decode loop reads: the ownership tag derived from that
//! type-state ([`State::OWNERSHIP`]), the phase and in-flight bits, beam, drafts, the KV headroom and the
//! adapter bucket. A transition moves the typed request out of its entry, through one consuming
//! function and back ([`Table::transition`]); nothing can observe the entry meanwhile.
//!
//! Invariants (checked by [`Table::check`], asserted where they can break):
//! 1. every slot in `order` is live, exactly once, and `order.len()` = live entries = indexed ids;
//! 2. `hot[slot]` agrees with the slot's entry: ownership tag, decode and in-flight bits, beam, drafts
//!    and adapter bucket are derived from the held request and the spec ([`Hot::derive`]);
//! 3. the id index maps each live request's id to its slot, and the held request names its own slot,
//!    version and id.

use crate::adapter::{PeftBackend, TaskRef};
use crate::arena::{Arena, Handle as ArenaHandle};
use crate::error::Error;
use crate::id_index::IdIndex;
use crate::ids::RequestId;
use crate::ids::TaskSlot;
use crate::kv::KvBackend;
use crate::lease::AdapterDesk;
use crate::request::{
    Active, Ownership, Paused, Place, Recompute, Request, RequestSpec, Resumed, Sending, State,
    Suspended, Waiting,
};
use crate::storage::{FixedList, Inline, InlineArray, Storage};

use super::hot::{Hot, OWNERSHIP_BITS};
use crate::narrow::u32_of;

mod check;

/// Why a [`AnyRequest::Sending`] request never reaches the pass's transitions: its phase is
/// `DISAGG_CONTEXT_TRANS_IN_PROGRESS` (outside the window, not started, so never a victim) and
/// `update` refuses to change it.
pub(crate) const NEVER_SCHEDULED: &str =
    "a sending request is never scheduled nor a victim (phase 21, which `update` cannot change)";

/// A request in the table, as its type-state.
#[derive(Debug)]
pub(crate) enum AnyRequest {
    Waiting(Request<Waiting>),
    Active(Request<Active>),
    Resumed(Request<Resumed>),
    Paused(Request<Suspended<Paused>>),
    Recompute(Request<Suspended<Recompute>>),
    Sending(Request<Sending>),
}

macro_rules! any_request_from {
    ($($s:ty => $v:ident),*) => {$(
        impl From<Request<$s>> for AnyRequest {
            #[inline]
            fn from(r: Request<$s>) -> Self {
                AnyRequest::$v(r)
            }
        }
    )*};
}
any_request_from!(Waiting => Waiting, Active => Active, Resumed => Resumed,
    Suspended<Paused> => Paused, Suspended<Recompute> => Recompute, Sending => Sending);

/// Applies `$f` to the request whatever its state.
macro_rules! each {
    ($held:expr, $r:ident => $f:expr) => {
        match $held {
            AnyRequest::Waiting($r) => $f,
            AnyRequest::Active($r) => $f,
            AnyRequest::Resumed($r) => $f,
            AnyRequest::Paused($r) => $f,
            AnyRequest::Recompute($r) => $f,
            AnyRequest::Sending($r) => $f,
        }
    };
}

impl AnyRequest {
    /// The runtime tag of the held type-state.
    #[inline]
    pub(crate) fn ownership(&self) -> Ownership {
        match self {
            AnyRequest::Waiting(_) => Waiting::OWNERSHIP,
            AnyRequest::Active(_) => Active::OWNERSHIP,
            AnyRequest::Resumed(_) => Resumed::OWNERSHIP,
            AnyRequest::Paused(_) => <Suspended<Paused>>::OWNERSHIP,
            AnyRequest::Recompute(_) => <Suspended<Recompute>>::OWNERSHIP,
            AnyRequest::Sending(_) => Sending::OWNERSHIP,
        }
    }

    fn place(&self) -> Place {
        each!(self, r => r.place())
    }

    fn id(&self) -> RequestId {
        each!(self, r => r.id())
    }

    /// (8) Finishes the request in whatever state it is: everything it owns is released.
    pub(crate) fn finish<K: KvBackend, P: PeftBackend, const T: usize, S: Storage>(
        self,
        kv: &mut K,
        desk: &mut AdapterDesk<P, T, S>,
    ) {
        match self {
            AnyRequest::Waiting(r) => r.finish(kv),
            AnyRequest::Active(r) => r.finish(kv, desk),
            AnyRequest::Resumed(r) => r.finish(kv, desk),
            AnyRequest::Paused(r) => r.finish(kv, desk),
            AnyRequest::Recompute(r) => r.finish(kv, desk),
            AnyRequest::Sending(r) => r.sent(kv),
        }
    }

    fn abandon(self) {
        each!(self, r => r.abandon());
    }

    fn hash_state<H: core::hash::Hasher>(&self, h: &mut H) {
        use core::hash::Hash;
        self.ownership().hash(h);
        self.place().hash(h);
        self.id().hash(h);
        let owns = match self {
            AnyRequest::Waiting(_) | AnyRequest::Sending(_) => false,
            AnyRequest::Active(r) => r.lease().is_some(),
            AnyRequest::Resumed(r) => r.lease().is_some(),
            AnyRequest::Paused(r) => r.paused_on().is_some(),
            AnyRequest::Recompute(r) => r.paused_on().is_some(),
        };
        owns.hash(h);
    }
}

/// A request's data in the table (its typed ownership is kept apart, in a dense array).
#[derive(Debug)]
pub struct Record {
    spec: RequestSpec,
    task: Option<TaskRef>,
    inflight: bool,
    /// A KV connector is loading into the request's pages (spec §1.15): never a victim.
    pending_load: bool,
    /// Suspended again, unscheduled, after a pass resumed it for a chunk (difference 3), where upstream
    /// leaves it resumed (`resuspended.rs`); false whenever the request is not `Paused`.
    pub(super) resuspended: bool,
    /// Times it was recompute-paused or preempted (counted under the thrash guard, `thrash.rs`).
    pub(super) recomputed: u8,
}

impl Record {
    pub(crate) fn spec_mut(&mut self) -> &mut RequestSpec {
        &mut self.spec
    }

    fn hash_state<H: core::hash::Hasher>(&self, h: &mut H) {
        use core::hash::Hash;
        self.spec.hash(h);
        self.task.hash(h);
        self.inflight.hash(h);
        self.pending_load.hash(h);
        self.resuspended.hash(h);
        self.recomputed.hash(h);
    }
}

/// A read-only view of one request in the table: its data and what it owns.
#[derive(Debug, Clone, Copy)]
pub struct Entry<'t> {
    pub(super) record: &'t Record,
    held: &'t Option<AnyRequest>,
}

impl<'t> Entry<'t> {
    /// The request's data.
    pub fn spec(&self) -> &'t RequestSpec {
        &self.record.spec
    }
    /// What it owns.
    pub fn ownership(&self) -> Ownership {
        self.held().ownership()
    }
    /// Its adapter task, when an adapter cache is configured.
    pub fn task(&self) -> Option<TaskRef> {
        self.record.task
    }
    /// Marked in flight.
    pub fn inflight(&self) -> bool {
        self.record.inflight
    }
    /// A KV connector load into its pages is pending ([`crate::Scheduler::set_pending_load`]).
    pub fn pending_load(&self) -> bool {
        self.record.pending_load
    }
    /// Times it gave its KV up to be recomputed, counted under the thrash guard
    /// ([`crate::Config::thrash_guard`]; 0 without it).
    pub fn recomputed(&self) -> u8 {
        self.record.recomputed
    }
    /// Sits this pass out: in flight, or a decoder context whose encoder output is not ready (spec §1.2
    /// step 1). Skipped, uses no budget, never a victim, not counted by the deadlock detector.
    pub fn sits_out(&self) -> bool {
        self.record.inflight || self.spec().waits_on_encoder()
    }
    pub(crate) fn held(&self) -> &'t AnyRequest {
        match self.held {
            Some(h) => h,
            None => panic!("a live entry holds its request"),
        }
    }
}

/// A handle to a request in the table.
pub type Handle = ArenaHandle<Record>;

/// The request table of `N` slots, its arrays where `S` keeps them.
pub(crate) struct Table<const N: usize, S: Storage = Inline> {
    records: Arena<Record, N, S>,
    /// The typed requests, by slot: `Some` exactly for the live slots (taken only inside
    /// [`Table::transition`]).
    held: S::Array<Option<AnyRequest>, N>,
    hot: S::Array<Hot, N>,
    order: S::List<u16, N>,
    ids: IdIndex<N, S>,
    /// Entries holding a `Resumed` request (settled when the engine takes the page moves).
    resumed: u32,
    /// Slots that became `Resumed` since the last settlement (a superset of the resumed ones; when it
    /// overflows, settlement scans the table).
    resumed_slots: S::List<u16, N>,
    resumed_overflow: bool,
    /// Entries whose hot record is an in-flight context request (a pass reads the table for them
    /// only when there is one: `prefix_skip.rs`).
    contexts_in_flight: u32,
}

impl<const N: usize> Table<N> {
    pub(crate) const fn new() -> Self {
        Self {
            records: Arena::new(),
            held: InlineArray::new([const { None }; N]),
            hot: InlineArray::new([Hot::EMPTY; N]),
            order: heapless::Vec::new(),
            ids: IdIndex::new(),
            resumed: 0,
            resumed_slots: heapless::Vec::new(),
            resumed_overflow: false,
            contexts_in_flight: 0,
        }
    }
}

impl<const N: usize, S: Storage> Table<N, S> {
    pub(crate) fn new_in() -> Result<Self, Error> {
        Ok(Self {
            records: Arena::new_in()?,
            held: S::array(|| None)?,
            hot: S::array(Hot::default)?,
            order: S::list(0)?,
            ids: IdIndex::new_in()?,
            resumed: 0,
            resumed_slots: S::list(0)?,
            resumed_overflow: false,
            contexts_in_flight: 0,
        })
    }

    /// The slots to look at for resumed requests (every live one after an overflow of the list), and
    /// the list cleared for the next settlement.
    pub(crate) fn take_resumed_slots(&mut self, into: &mut S::List<u16, N>) {
        into.clear();
        let from = if core::mem::take(&mut self.resumed_overflow) {
            &self.order
        } else {
            &self.resumed_slots
        };
        assert!(into.extend_from_slice(from), "a list of slots holds N");
        self.resumed_slots.clear();
    }

    /// Entries holding a `Resumed` request.
    pub(crate) fn resumed(&self) -> u32 {
        self.resumed
    }
    /// Live requests.
    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.order.len()
    }
    /// The table is full.
    pub(crate) fn is_full(&self) -> bool {
        self.order.is_full()
    }
    /// Slots in arrival order.
    #[inline]
    pub(crate) fn order(&self) -> &[u16] {
        &self.order
    }
    /// The slot at arrival index `i`.
    #[inline]
    pub(crate) fn slot(&self, i: usize) -> u16 {
        self.order[i]
    }
    /// The version of a slot (its live request's handle's).
    pub(crate) fn version_at(&self, slot: u16) -> u32 {
        self.records.version_at(slot)
    }
    /// The arrival index of a live slot.
    pub(crate) fn index_of(&self, slot: u16) -> Option<usize> {
        self.order.iter().position(|&s| s == slot)
    }
    /// The live entry at `slot` (invariant 1: every slot the pass names is live).
    #[inline]
    pub(crate) fn entry(&self, slot: u16) -> Entry<'_> {
        match self.records.at(slot) {
            Some(record) => Entry {
                record,
                held: &self.held[slot as usize],
            },
            None => panic!("table slot {slot} is vacant"),
        }
    }
    /// The hot record of a live slot.
    #[inline]
    pub(crate) fn hot(&self, slot: u16) -> Hot {
        self.hot[slot as usize]
    }
    /// What the decode loop reads and writes, as disjoint borrows: the arrival order, the hot records
    /// and the typed requests.
    #[inline]
    pub(crate) fn decode_view(&mut self) -> (&[u16], &mut [Hot; N], &[Option<AnyRequest>; N]) {
        (&self.order, &mut *self.hot, &*self.held)
    }

    /// Sets a slot's KV headroom.
    #[inline]
    pub(crate) fn set_headroom(&mut self, slot: u16, headroom: u32) {
        self.hot[slot as usize].headroom = headroom;
    }
    /// The entry of a live handle.
    pub(crate) fn get(&self, h: Handle) -> Option<Entry<'_>> {
        self.records.get(h)?;
        Some(self.entry(h.index()))
    }
    /// The live handle of a slot.
    pub(crate) fn handle_at(&self, slot: u16) -> Option<Handle> {
        self.records.handle_at(slot)
    }
    /// The slot of a live id.
    pub(crate) fn find(&self, id: RequestId) -> Option<u16> {
        self.ids.get(id)
    }
    /// A handle names this live request (slot and version).
    pub(crate) fn is_live(&self, slot: u16, version: u32) -> bool {
        self.records.at(slot).is_some() && self.records.version_at(slot) == version
    }

    /// Inserts a waiting request; its slot and version are known before the request is built. It
    /// joins the end of the arrival order, or, `by_priority`, the end of its priority's requests (under
    /// [`crate::config::Admission::Priority`] the order is by priority, then arrival). Refused when the
    /// table is full or its next slot is not below `slots` (the KV backend's).
    pub(crate) fn insert(
        &mut self,
        spec: RequestSpec,
        task: Option<TaskRef>,
        slots: u32,
        by_priority: bool,
    ) -> Result<Handle, Error> {
        let full = Error::CapacityExhausted {
            what: "request table",
            capacity: u32_of(N).min(slots),
        };
        let next = match self.records.vacancy() {
            Some(next) if !self.is_full() && u32::from(next.index()) < slots => next,
            _ => return Err(full),
        };
        let place = Place {
            slot: next.index(),
            task: TaskSlot::NONE,
            version: next.version(),
        };
        let (id, priority) = (spec.id, spec.priority);
        let record = Record {
            spec,
            task,
            inflight: false,
            pending_load: false,
            resuspended: false,
            recomputed: 0,
        };
        let Ok(h) = self.records.insert(record) else {
            return Err(full);
        };
        assert_eq!(h, next, "the arena hands out its announced vacancy");
        let slot = h.index();
        assert!(
            self.held[slot as usize].is_none(),
            "a vacant slot holds no request"
        );
        self.held[slot as usize] = Some(AnyRequest::Waiting(Request::new(place, id, task)));
        let at = if by_priority {
            self.end_of(priority)
        } else {
            self.order.len()
        };
        self.place(slot, at);
        self.ids.insert(id, slot);
        self.refresh(slot, 0);
        Ok(h)
    }

    /// Where a request of `priority` joins an order by priority, then arrival: after the last request
    /// of its priority or a higher one.
    fn end_of(&self, priority: u8) -> usize {
        let before = |&s: &u16| {
            self.records
                .at(s)
                .is_some_and(|r| r.spec.priority <= priority)
        };
        self.order.iter().rposition(before).map_or(0, |i| i + 1)
    }

    /// Puts `slot` at index `at` of the arrival order.
    fn place(&mut self, slot: u16, at: usize) {
        let pushed = self.order.push(slot);
        assert!(pushed.is_ok(), "order has room for every live slot");
        self.order[at..].rotate_right(1);
    }

    /// A request's priority changed in an order by priority, then arrival: it moves to the end of its
    /// new priority's requests (as if it arrived now).
    pub(crate) fn reorder(&mut self, slot: u16) {
        let i = self.index_of(slot);
        assert!(i.is_some(), "a live slot is in the arrival order");
        self.order.remove(i.unwrap_or_default());
        let at = self.end_of(self.entry(slot).spec().priority);
        self.place(slot, at);
    }

    /// Takes back an insertion whose handle was never handed out (a refused adoption): the table is
    /// exactly as it was before.
    pub(crate) fn cancel_insert(&mut self, h: Handle) {
        let at = self.index_of(h.index());
        assert!(at.is_some(), "the cancelled insertion is in the order");
        self.order.remove(at.unwrap_or_default());
        let Some(r) = self.records.cancel_insert(h) else {
            panic!("cancel_insert of a vacant slot");
        };
        let gone = self.ids.remove(r.spec.id);
        assert_eq!(gone, Some(h.index()));
        self.vacate_hot(h.index());
        match self.held[h.index() as usize].take() {
            Some(AnyRequest::Waiting(w)) => w.abandon(),
            _ => panic!("a cancelled insertion owns nothing"),
        }
    }

    /// Removes a live request: its typed request (for the caller to release what it owns) and its data.
    pub(crate) fn remove(&mut self, h: Handle) -> Option<(AnyRequest, RequestSpec)> {
        let r = self.records.remove(h)?;
        let slot = h.index();
        let gone = self.ids.remove(r.spec.id);
        assert_eq!(gone, Some(slot), "the id index follows the table");
        let i = self.index_of(slot);
        assert!(i.is_some(), "a live slot is in the arrival order");
        if let Some(i) = i {
            self.order.remove(i);
        }
        self.vacate_hot(slot);
        let Some(held) = self.held[slot as usize].take() else {
            panic!("a live slot holds its request");
        };
        if held.ownership() == Ownership::Resumed {
            self.resumed -= 1;
        }
        Some((held, r.spec))
    }

    /// Moves the typed request at `slot` through `f` (one consuming transition) and back; the hot
    /// record follows the new type-state.
    #[inline]
    pub(crate) fn transition<R>(
        &mut self,
        slot: u16,
        f: impl FnOnce(AnyRequest) -> (AnyRequest, R),
    ) -> R {
        let Some(before) = self.held[slot as usize].take() else {
            panic!("transition of vacant slot {slot}");
        };
        let was = before.ownership();
        let (after, r) = f(before);
        assert_eq!(
            after.place().slot,
            slot,
            "a transition keeps the request in its slot"
        );
        let now = after.ownership();
        self.held[slot as usize] = Some(after);
        if let (true, Some(r)) = (now != Ownership::Paused, self.records.at_mut(slot)) {
            r.resuspended = false;
        }
        let resumed = |o: Ownership| u32::from(o == Ownership::Resumed);
        self.resumed = self.resumed + resumed(now) - resumed(was);
        if now == Ownership::Resumed
            && was != Ownership::Resumed
            && self.resumed_slots.push(slot).is_err()
        {
            self.resumed_overflow = true;
        }
        // Only the ownership changed: the rest of the hot record stands.
        let hot = &mut self.hot[slot as usize];
        hot.code = (hot.code & !OWNERSHIP_BITS) | now as u8;
        r
    }

    /// Changes a live request's data through `f`; the hot record follows.
    pub(crate) fn edit<R>(&mut self, slot: u16, f: impl FnOnce(&mut Record) -> R) -> R {
        let r = match self.records.at_mut(slot) {
            Some(record) => f(record),
            None => panic!("edit of vacant slot {slot}"),
        };
        self.refresh(slot, self.hot[slot as usize].headroom);
        r
    }

    /// Marks a request in flight (or not).
    pub(crate) fn set_inflight(&mut self, slot: u16, inflight: bool) {
        self.edit(slot, |r| r.inflight = inflight);
    }

    /// Marks a request's connector load pending (or done).
    pub(crate) fn set_pending_load(&mut self, slot: u16, pending: bool) {
        self.edit(slot, |r| r.pending_load = pending);
    }

    fn refresh(&mut self, slot: u16, headroom: u32) {
        let hot = Hot::derive(self.entry(slot), headroom);
        let was = self.hot[slot as usize].context_in_flight();
        self.contexts_in_flight =
            self.contexts_in_flight + u32::from(hot.context_in_flight()) - u32::from(was);
        self.hot[slot as usize] = hot;
    }

    fn vacate_hot(&mut self, slot: u16) {
        self.contexts_in_flight -= u32::from(self.hot[slot as usize].context_in_flight());
        self.hot[slot as usize] = Hot::default();
    }

    /// Live context requests in flight.
    pub(crate) fn contexts_in_flight(&self) -> u32 {
        self.contexts_in_flight
    }

    /// Entries in arrival order, with their handles.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (Handle, Entry<'_>)> + '_ {
        self.order
            .iter()
            .map(move |&s| match self.records.handle_at(s) {
                Some(h) => (h, self.entry(s)),
                None => panic!("order names vacant slot {s}"),
            })
    }

    /// Tears the table down without releasing anything (the backends go with it).
    pub(crate) fn abandon_all(&mut self) {
        for held in self.held.iter_mut() {
            if let Some(h) = held.take() {
                h.abandon();
            }
        }
    }
}
