//! The request table and the scheduling pass.
//!
//! The pass follows the reference rule by rule (spec §1.4–§1.13): phase 0 counts pinned adapters;
//! phase 1 walks generation and disaggregated-generation-init requests in arrival order with a shrinking
//! end index (ordinary eviction from the tail) and defers context/encoder requests; phase 2 admits the
//! deferred context requests (chunked or whole), with context-side preemption when no tier lies below
//! the GPU; then deadlock detection and sorting by LoRA key.
//!
//! Every resource change goes through a type-state transition of [`crate::request`], so the PEFT lifecycle
//! of DESIGN.md §3 holds by construction: suspension returns the lease with pause, a resumed request
//! re-acquires its lease before it is listed, recompute pause and preemption return the lease with pause
//! and the replay re-acquires, a rolled-back first chunk makes no adapter call, and non-LoRA requests make
//! none at all.
//!
//! Invariants at the end of every pass (asserted by the property tests): no request appears in two
//! output lists; the scheduled batch respects the token (except unchecked last-chunk drafts, as upstream),
//! request and adapter-page budgets; every scheduled request is `Active` (settled from `Resumed` where it
//! came back this pass); the stall counter counts only passes with pending work and no progress.

use crate::adapter::{PeftBackend, TaskRef};
use crate::arena::{self, Arena};
use crate::budget::Budget;
use crate::config::{CapacityPolicy, ChunkPolicy, Config};
use crate::error::{Error, PeftError};
use crate::fmt::trace;
use crate::id_index::IdIndex;
use crate::kv::{ContextPrep, KvBackend, KvRef};
use crate::lease::AdapterDesk;
use crate::output::{self, Listed, SchedulerOutput, NO_BUCKET};
use crate::phase::Phase;
use crate::request::{
    Active, KvReturn, Paused, Recompute, Request, RequestId, RequestSpec, Suspended, TaskId,
    Waiting,
};

/// What a request owns, as stored in the table: one of the type-states.
#[derive(Debug)]
pub enum Residency {
    /// Owns nothing.
    Waiting(Request<Waiting>),
    /// KV active, lease held.
    Active(Request<Active>),
    /// KV suspended, paused on its adapter.
    Paused(Request<Suspended<Paused>>),
    /// KV freed, waiting to replay its prefill.
    Recompute(Request<Suspended<Recompute>>),
    /// Transient, only inside a transition.
    Moving,
}

/// The type-state of a request, without its resources.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ResidencyKind {
    /// [`Residency::Waiting`].
    Waiting,
    /// [`Residency::Active`].
    Active,
    /// [`Residency::Paused`].
    Paused,
    /// [`Residency::Recompute`].
    Recompute,
}

impl Residency {
    /// The kind.
    pub fn kind(&self) -> ResidencyKind {
        match self {
            Residency::Waiting(_) | Residency::Moving => ResidencyKind::Waiting,
            Residency::Active(_) => ResidencyKind::Active,
            Residency::Paused(_) => ResidencyKind::Paused,
            Residency::Recompute(_) => ResidencyKind::Recompute,
        }
    }
}

/// One request in the table.
#[derive(Debug)]
pub struct Entry {
    spec: RequestSpec,
    residency: Residency,
    task: Option<TaskRef>,
    lora: Option<TaskId>,
    inflight: bool,
    // Per-pass stamps: equal to the pass epoch when true in this pass.
    scheduled: u32,
    recomputed: u32,
    preempted: u32,
    evicted: u32,
    planned_chunk: u32,
    // GUARANTEED_NO_EVICT: KV tokens reserved at admission and not yet used by decode steps.
    headroom: u32,
}

impl Entry {
    /// Feeds every field (data, type-state with what it owns, task, marks and per-pass stamps) to `h`.
    fn hash_state<H: core::hash::Hasher>(&self, h: &mut H) {
        use core::hash::Hash;
        self.spec.hash(h);
        self.residency.kind().hash(h);
        match &self.residency {
            Residency::Waiting(r) => (r.kv_ref(), r.task()).hash(h),
            Residency::Active(r) => (r.kv_ref(), r.task(), r.lease().is_some()).hash(h),
            Residency::Paused(r) => (r.kv_ref(), r.task(), r.paused_on().is_some()).hash(h),
            Residency::Recompute(r) => (r.kv_ref(), r.task(), r.paused_on().is_some()).hash(h),
            Residency::Moving => 0xffu8.hash(h),
        }
        self.task.hash(h);
        self.lora.hash(h);
        self.inflight.hash(h);
        self.scheduled.hash(h);
        self.recomputed.hash(h);
        self.preempted.hash(h);
        self.evicted.hash(h);
        self.planned_chunk.hash(h);
        self.headroom.hash(h);
    }

    /// The request's data.
    pub fn spec(&self) -> &RequestSpec {
        &self.spec
    }
    /// What it owns.
    pub fn residency(&self) -> ResidencyKind {
        self.residency.kind()
    }
    /// Its adapter task, when an adapter cache is configured.
    pub fn task(&self) -> Option<TaskRef> {
        self.task
    }
    /// Marked in flight.
    pub fn inflight(&self) -> bool {
        self.inflight
    }
}

/// A handle to a request in the table.
pub type Handle = arena::Handle<Entry>;

/// How a request starts when it is adopted with resources a backend already holds (restoring state, or
/// scripted scenarios).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Adopt {
    /// Owns nothing.
    Waiting,
    /// Its cache is active: it takes a lease on its adapter.
    Active,
    /// Its cache is suspended: it is registered as paused on its adapter.
    Suspended,
}

/// What the decode fast path did with a request.
#[derive(Clone, Copy)]
enum Fast {
    Scheduled,
    Skip,
    Stop,
    Refused(Refusal),
    /// Not an active decode step: the general path handles it.
    General,
}

/// A refused decode step, for the ladder.
#[derive(Clone, Copy)]
struct Refusal {
    grow: u32,
    after: u32,
    tokens: u32,
    beam: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    Scheduled,
    Skip,
    Stop,
}

/// What the last pass did, beyond its output lists.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PassStats {
    /// Ordinary suspensions of other requests (victims).
    pub victims: u32,
    /// Self-evictions.
    pub self_evictions: u32,
    /// Destructive recompute pauses (generation side).
    pub recompute_pauses: u32,
    /// Context-side preemptions.
    pub preemptions: u32,
}

/// What the generation ladder reads of a request, gathered by the phase-1 loop in one table lookup.
#[derive(Clone, Copy)]
struct GenStep {
    slot: u16,
    id: RequestId,
    beam: u32,
    draft: u32,
    headroom: u32,
    active: bool,
}

struct PassState {
    epoch: u32,
    stats: PassStats,
    end: usize,
    frontier: usize,
    /// Beam width of the generation requests scheduled so far (0: none yet; a beam is at least 1).
    beam: u32,
    evictions: u32,
    recomputes: u32,
    /// After a preemption scan that found no candidate: the only request that can have become one since
    /// (that scan's requester, which it had to skip), or `usize::MAX` for none. Candidates only disappear
    /// during a pass otherwise (scheduled requests are protected, preempted ones are gone).
    preempt_only: Option<usize>,
    /// GUARANTEED_NO_EVICT: a first chunk's reservation did not fit; no new request is admitted after it.
    admissions_closed: bool,
}

/// The scheduler: a request table of `N` slots over a KV backend `K` and an adapter backend `P` with `T`
/// task slots.
pub struct Scheduler<K, P, const N: usize, const T: usize> {
    cfg: Config,
    kv: K,
    desk: AdapterDesk<P, T>,
    table: Arena<Entry, N>,
    order: heapless::Vec<u16, N>,
    ids: IdIndex<N>,
    stall: u32,
    epoch: u32,
    pending: heapless::Vec<u16, N>,
    scratch: [Listed; N],
    /// Per adapter task slot, `[part 0, part 1]` counters of the LoRA sort; the generation list's part 0
    /// is counted as it is filled (reset when the task enters the pass's adapter plan).
    sort_counts: [[u32; 2]; T],
    /// Generation entries without an adapter, counted as the list is filled.
    gen_plain: u32,
    last: PassStats,
}

impl<K, P, const N: usize, const T: usize> Drop for Scheduler<K, P, N, T> {
    /// Tearing the scheduler down takes its backends with it: every request's resources go too.
    fn drop(&mut self) {
        for &slot in self.order.iter() {
            if let Some(e) = self.table.at_mut(slot) {
                match core::mem::replace(&mut e.residency, Residency::Moving) {
                    Residency::Waiting(r) => r.abandon(),
                    Residency::Active(r) => r.abandon(),
                    Residency::Paused(r) => r.abandon(),
                    Residency::Recompute(r) => r.abandon(),
                    Residency::Moving => {}
                }
            }
        }
    }
}

/// A table slot named by the arrival order: live by invariant.
#[inline(always)]
fn live<E>(e: Option<E>) -> E {
    match e {
        Some(e) => e,
        None => unreachable!("order names a vacant slot"),
    }
}

/// A task enters the pass's adapter plan (the first request scheduled on it): listed, and its sort
/// counters start from 0.
#[inline(always)]
fn enter_plan<const N: usize>(t: TaskRef, counts: &mut [[u32; 2]], out: &mut SchedulerOutput<N>) {
    if let Some(c) = counts.get_mut(t.slot as usize) {
        *c = [0, 0];
    }
    let _ = out.adapters.push(t);
}

/// Counts a generation entry on task `t` (in the plan) for the LoRA sort.
#[inline(always)]
fn count_in(counts: &mut [[u32; 2]], t: TaskRef) {
    if let Some(c) = counts.get_mut(t.slot as usize) {
        c[0] += 1;
    }
}

impl<K: KvBackend, P: PeftBackend, const N: usize, const T: usize> Scheduler<K, P, N, T> {
    /// A scheduler over the given backends.
    pub fn new(cfg: Config, kv: K, peft: P) -> Result<Self, Error> {
        cfg.validate()?;
        Ok(Self {
            cfg,
            kv,
            desk: AdapterDesk::new(peft),
            table: Arena::new(),
            order: heapless::Vec::new(),
            ids: IdIndex::new(),
            stall: 0,
            epoch: 0,
            pending: heapless::Vec::new(),
            scratch: [Listed::default(); N],
            sort_counts: [[0; 2]; T],
            gen_plain: 0,
            last: PassStats::default(),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.cfg
    }
    /// The KV backend.
    pub fn kv(&self) -> &K {
        &self.kv
    }
    /// The KV backend, mutably (for its move log and statistics; changing caches behind the scheduler's
    /// back breaks its invariants).
    pub fn kv_mut(&mut self) -> &mut K {
        &mut self.kv
    }
    /// The adapter desk.
    pub fn adapters(&self) -> &AdapterDesk<P, T> {
        &self.desk
    }
    /// The adapter backend, mutably (for task registration and statistics).
    pub fn peft_mut(&mut self) -> &mut P {
        self.desk.backend_mut()
    }
    /// What the last pass did beyond its output lists (victims, self-evictions, recompute pauses,
    /// preemptions).
    pub fn last_pass(&self) -> PassStats {
        self.last
    }

    /// A fingerprint of the scheduler's own state: the request table (every slot's generation and entry,
    /// the free list), the arrival order, the id index, the stall counter, the pass epoch and the adapter desk's
    /// counters. Per-pass scratch (pending list, sort buffers, last pass statistics) and the backends
    /// are left out: fingerprint those with [`crate::KvPool::fingerprint`] and the adapter cache's
    /// `PartialEq`. Equal before and after a refused call = the call changed nothing.
    pub fn fingerprint(&self) -> u64 {
        use core::hash::{Hash, Hasher};
        let mut h = crate::fingerprint::Fingerprint::new();
        self.table.hash_state(&mut h, |e, h| e.hash_state(h));
        self.order.hash(&mut h);
        self.ids.hash_state(&mut h);
        self.stall.hash(&mut h);
        self.epoch.hash(&mut h);
        self.desk.hash_state(&mut h);
        h.finish()
    }

    /// Consecutive stalled passes.
    pub fn stall_count(&self) -> u32 {
        self.stall
    }
    /// Live requests.
    pub fn len(&self) -> usize {
        self.order.len()
    }
    /// No live requests.
    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }
    /// Requests in arrival order.
    pub fn requests(&self) -> impl Iterator<Item = (Handle, &Entry)> + '_ {
        self.order
            .iter()
            .filter_map(move |&s| Some((self.table.handle_at(s)?, self.table.at(s)?)))
    }
    /// One request.
    pub fn get(&self, h: Handle) -> Result<&Entry, Error> {
        self.table.get(h).ok_or(Error::StaleHandle)
    }
    /// The live handle of a table slot (as listed in the output).
    pub fn handle_of(&self, slot: u16) -> Option<Handle> {
        self.table.handle_at(slot)
    }
    /// Finds a request by id (O(1): the table keeps an id index).
    pub fn find(&self, id: RequestId) -> Option<Handle> {
        self.table.handle_at(self.ids.get(id)?)
    }

    fn check_spec(&self, spec: &RequestSpec) -> Result<Option<TaskRef>, Error> {
        if spec.position > spec.prompt {
            return Err(Error::Invalid("position is beyond the prompt"));
        }
        if self.ids.get(spec.id).is_some() {
            return Err(Error::DuplicateId(spec.id));
        }
        self.check_sizes(spec)?;
        let task = match spec.lora {
            None => None,
            Some(t) => {
                let peft = self.desk.backend();
                let max = peft.max_device_pages();
                if max == u32::MAX {
                    None // no adapter cache configured
                } else {
                    let tr = peft.lookup(t).ok_or(PeftError::UnknownTask(t))?;
                    Some(tr)
                }
            }
        };
        if self.order.is_full() {
            return Err(Error::CapacityExhausted {
                what: "request table",
                capacity: N as u32,
            });
        }
        Ok(task)
    }

    /// The per-step and whole-life sizes of a request: beam width at least 1, one step's tokens (beam +
    /// drafts) within `u32`, and prompt + reserved output + drafts within what one request can hold
    /// (capped at `u32::MAX`: token counts are `u32`, so no later sum can overflow).
    fn check_sizes(&self, spec: &RequestSpec) -> Result<(), Error> {
        if spec.beam == 0 {
            return Err(Error::Invalid("beam width must be at least 1"));
        }
        if spec.beam.checked_add(spec.draft).is_none() {
            return Err(Error::Invalid(
                "beam width plus draft tokens overflow one step's token count",
            ));
        }
        let tokens = spec.prompt as u64 + spec.max_new_tokens as u64 + spec.draft as u64;
        let limit = self.kv.max_tokens_per_request().min(u32::MAX as u64);
        if tokens > limit {
            return Err(Error::RequestTooLarge {
                id: spec.id,
                tokens,
                limit,
            });
        }
        Ok(())
    }

    /// Submits a new request (it owns nothing until the pass admits it). Refuses, changing nothing: a
    /// duplicate id, an unknown LoRA task, a request larger than the KV pool, a full table.
    pub fn submit(&mut self, spec: RequestSpec) -> Result<Handle, Error> {
        self.adopt(spec, Adopt::Waiting)
    }

    /// Submits a request that already has a cache in the KV backend (restoring state; scripted tests):
    /// `Active` takes a lease on its adapter, `Suspended` registers it as paused on its adapter.
    pub fn adopt(&mut self, spec: RequestSpec, how: Adopt) -> Result<Handle, Error> {
        let task = self.check_spec(&spec)?;
        // Insert first (so the slot is known), then build the type-state.
        let lora = spec.lora;
        let entry = Entry {
            spec,
            residency: Residency::Moving,
            task,
            lora,
            inflight: false,
            scheduled: 0,
            recomputed: 0,
            preempted: 0,
            evicted: 0,
            planned_chunk: 0,
            headroom: 0,
        };
        let h = self
            .table
            .insert(entry)
            .map_err(|_| Error::CapacityExhausted {
                what: "request table",
                capacity: N as u32,
            })?;
        let e = self.table.get_mut(h).ok_or(Error::StaleHandle)?;
        let r = KvRef {
            slot: h.index(),
            id: e.spec.id,
        };
        let waiting = Request::new(r, task);
        let residency = match how {
            Adopt::Waiting => Ok(Residency::Waiting(waiting)),
            Adopt::Active => {
                if !self.kv.is_active(r) {
                    Err((
                        waiting,
                        Error::Invalid("adopted as active but the KV backend has no active cache"),
                    ))
                } else {
                    waiting
                        .admit(&self.kv, &mut self.desk)
                        .map(Residency::Active)
                        .map_err(|refused| (refused.request, Error::Peft(refused.error)))
                }
            }
            Adopt::Suspended => {
                if !self.kv.has_cache(r) || self.kv.is_active(r) {
                    Err((
                        waiting,
                        Error::Invalid(
                            "adopted as suspended but the KV backend has no suspended cache",
                        ),
                    ))
                } else {
                    // Register as active, then pause: the request ends up paused on its adapter.
                    match self.desk_admit_suspended(waiting) {
                        Ok(p) => Ok(Residency::Paused(p)),
                        Err(x) => Err(x),
                    }
                }
            }
        };
        match residency {
            Ok(res) => {
                if let Some(e) = self.table.get_mut(h) {
                    e.residency = res;
                }
                let _ = self.order.push(h.index());
                self.ids.insert(r.id, h.index());
                Ok(h)
            }
            Err((waiting, err)) => {
                drop(waiting);
                // The handle never left this call: take the slot back without bumping its generation,
                // so a refused adoption leaves the table exactly as it was.
                self.table.cancel_insert(h);
                Err(err)
            }
        }
    }

    fn desk_admit_suspended(
        &mut self,
        w: Request<Waiting>,
    ) -> Result<Request<Suspended<Paused>>, (Request<Waiting>, Error)> {
        // A suspended cache with no lease: build Active through a lease, then suspend without touching KV.
        // The KV backend already holds it suspended, so only the adapter side is replayed here.
        let r = w.kv_ref();
        match w.task() {
            None => Ok(Request::<Suspended<Paused>>::adopt_suspended(w)),
            Some(t) => match self.desk.acquire(r.id, t, None) {
                Ok(lease) => {
                    let paused = self.desk.release(r.id, lease, true);
                    Ok(Request::<Suspended<Paused>>::adopt_suspended_with(
                        w, paused,
                    ))
                }
                Err((_, e)) => Err((w, Error::Peft(e))),
            },
        }
    }

    /// Marks a request in flight (it is skipped and uses no budget while marked).
    pub fn set_inflight(&mut self, h: Handle, inflight: bool) -> Result<(), Error> {
        self.table.get_mut(h).ok_or(Error::StaleHandle)?.inflight = inflight;
        Ok(())
    }

    /// Changes a request's per-step data (phase, position, beam, drafts, …). Its id and LoRA task cannot
    /// change; an inconsistent result (position past the prompt, beam 0, a step or a request too large,
    /// as at submission) is refused and nothing changes.
    pub fn update(&mut self, h: Handle, f: impl FnOnce(&mut RequestSpec)) -> Result<(), Error> {
        let e = self.table.get(h).ok_or(Error::StaleHandle)?;
        let mut s = e.spec.clone();
        f(&mut s);
        s.id = e.spec.id;
        s.lora = e.spec.lora;
        if s.position > s.prompt {
            return Err(Error::Invalid("position is beyond the prompt"));
        }
        self.check_sizes(&s)?;
        if let Some(e) = self.table.get_mut(h) {
            e.spec = s;
        }
        Ok(())
    }

    /// Removes a finished or cancelled request: everything it owns is released (a lease with
    /// pause = false, a paused registration dropped, its KV freed).
    pub fn remove(&mut self, h: Handle) -> Result<RequestSpec, Error> {
        let e = self.table.remove(h).ok_or(Error::StaleHandle)?;
        let gone = self.ids.remove(e.spec.id);
        debug_assert_eq!(gone, Some(h.index()));
        match e.residency {
            Residency::Waiting(r) => r.finish(&mut self.kv),
            Residency::Active(r) => r.finish(&mut self.kv, &mut self.desk),
            Residency::Paused(r) => r.finish(&mut self.kv, &mut self.desk),
            Residency::Recompute(r) => r.finish(&mut self.kv, &mut self.desk),
            Residency::Moving => {}
        }
        if let Some(i) = self.order.iter().position(|&s| s == h.index()) {
            self.order.remove(i);
        }
        Ok(e.spec)
    }

    /// Completes the step a pass scheduled, as an engine does between passes: a context chunk advances
    /// the position (a fully processed prompt moves to `GENERATION_IN_PROGRESS`); a recompute-paused
    /// request is reset to a first-chunk `CONTEXT_INIT` that replays its prefill.
    ///
    /// An entry whose request was removed after the pass (its slot empty, or reused by a newer request)
    /// is skipped: the output names slots, and the id tells a reused slot apart.
    pub fn complete_step(&mut self, out: &SchedulerOutput<N>) {
        for l in out.context.iter() {
            if let Some(e) = self.table.at_mut(l.slot).filter(|e| e.spec.id == l.id) {
                e.spec.position = e.spec.position.saturating_add(l.chunk).min(e.spec.prompt);
                if e.spec.position >= e.spec.prompt {
                    e.spec.phase = Phase::GenerationInProgress;
                }
            }
        }
        for l in out.recompute_paused.iter() {
            if let Some(e) = self.table.at_mut(l.slot).filter(|e| e.spec.id == l.id) {
                e.spec.phase = Phase::ContextInit;
                e.spec.position = 0;
            }
        }
    }

    /// Makes the scheduled batch's adapters resident on the device; `out.adapter_loads` lists the copies.
    /// With the pinned-adapter budget of the pass this never fails for a batch the pass produced.
    pub fn ensure_batch(&mut self, out: &mut SchedulerOutput<N>) -> Result<(), PeftError> {
        out.adapter_loads.clear();
        let loads = &mut out.adapter_loads;
        self.desk.ensure_batch(&out.adapters, &mut |t| {
            let _ = loads.push(t);
        })
    }

    // ---------------------------------------------------------------------------------------------
    // The pass.

    fn entry(&self, slot: u16) -> &Entry {
        // Invariant: every slot in `order` is live.
        match self.table.at(slot) {
            Some(e) => e,
            None => unreachable!("order names a vacant slot"),
        }
    }

    fn entry_mut(&mut self, slot: u16) -> &mut Entry {
        match self.table.at_mut(slot) {
            Some(e) => e,
            None => unreachable!("order names a vacant slot"),
        }
    }

    fn kv_ref(&self, slot: u16) -> KvRef {
        KvRef {
            slot,
            id: self.entry(slot).spec.id,
        }
    }

    fn take(&mut self, slot: u16) -> Residency {
        core::mem::replace(&mut self.entry_mut(slot).residency, Residency::Moving)
    }

    fn put(&mut self, slot: u16, r: Residency) {
        self.entry_mut(slot).residency = r;
    }

    fn listed(&self, slot: u16) -> Listed {
        let e = self.entry(slot);
        Listed {
            id: e.spec.id,
            slot,
            chunk: 0,
            last: false,
            key: e.lora.map_or(0, |t| t.0),
            lora: e.lora.is_some(),
            bucket: e.task.map_or(NO_BUCKET, |t| t.slot),
        }
    }

    fn peft_need(&mut self, slot: u16) -> Option<u32> {
        let e = self.entry(slot);
        match e.task {
            None => Some(0),
            Some(t) => {
                let id = e.spec.id;
                self.desk.pages_needed(id, t)
            }
        }
    }

    /// A request that must acquire a lease to run (it holds none) can get one, as far as the adapter
    /// backend can tell without side effects ([`PeftBackend::can_admit`]).
    fn lease_obtainable(&self, slot: u16) -> bool {
        let e = self.entry(slot);
        match e.task {
            Some(t) if !matches!(e.residency, Residency::Active(_)) => {
                self.desk.backend().can_admit(t)
            }
            _ => true,
        }
    }

    /// The pass has put a request's KV in place: its type-state takes ownership — admission (first
    /// chunk), replay (after a recompute pause) or resume (listed in `resumed`), each acquiring the lease.
    /// Returns whether the request is now `Active`; if the lease was refused it keeps its old state.
    fn take_ownership(&mut self, slot: u16, out: &mut SchedulerOutput<N>) -> bool {
        let owned = match self.take(slot) {
            Residency::Waiting(w) => w
                .admit(&self.kv, &mut self.desk)
                .map(Residency::Active)
                .map_err(|x| Residency::Waiting(x.request)),
            Residency::Recompute(rc) => rc
                .replay(&self.kv, &mut self.desk)
                .map(Residency::Active)
                .map_err(|x| Residency::Recompute(x.request)),
            Residency::Paused(p) => match p.resume(&mut self.kv, &mut self.desk, KvReturn::Context)
            {
                Ok(resumed) => {
                    let _ = out.resumed.push(self.listed(slot));
                    Ok(Residency::Active(resumed.settle()))
                }
                Err(x) => Err(Residency::Paused(x.request)),
            },
            active @ Residency::Active(_) => Ok(active),
            Residency::Moving => unreachable!(),
        };
        let ok = owned.is_ok();
        self.put(slot, owned.unwrap_or_else(|r| r));
        ok
    }

    /// A disaggregated generation request whose KV was prepared takes ownership of it (so that when its
    /// transfer completes it decodes as an ordinary active request). If its lease is refused, a cache it
    /// did not own before is released (a suspended one was put back as it was).
    fn admit_disagg(&mut self, slot: u16, out: &mut SchedulerOutput<N>) -> bool {
        if self.take_ownership(slot, out) {
            return true;
        }
        let r = self.kv_ref(slot);
        if !matches!(self.entry(slot).residency, Residency::Paused(_)) && self.kv.has_cache(r) {
            self.kv.free(r);
        }
        false
    }

    fn commit_peft(&mut self, slot: u16, pages: u32, out: &mut SchedulerOutput<N>) {
        if let Some(t) = self.entry(slot).task {
            if self.desk.commit(t, pages) {
                enter_plan(t, &mut self.sort_counts, out);
            }
        }
    }

    /// Runs one scheduling pass into `out`.
    pub fn schedule(&mut self, out: &mut SchedulerOutput<N>) -> Result<(), Error> {
        out.clear();
        self.epoch = self.epoch.wrapping_add(1).max(1);
        self.desk.begin_pass();
        let len = self.order.len();
        let mut st = PassState {
            epoch: self.epoch,
            end: len,
            frontier: len,
            stats: PassStats::default(),
            beam: 0,
            evictions: 0,
            recomputes: 0,
            preempt_only: None,
            admissions_closed: false,
        };
        let mut budget = Budget::new(&self.cfg);
        self.pending.clear();
        self.gen_plain = 0;

        // Phase 1: generation and disaggregated generation init; context and encoder are deferred.
        let window = self.cfg.window;
        let mut i = 0;
        while i < st.end {
            let slot = self.order[i];
            // The common case first: an active request's decode step, in one table lookup.
            match self.decode_step(slot, &mut budget, &mut st, out) {
                Fast::Scheduled | Fast::Skip => {
                    i += 1;
                    continue;
                }
                Fast::Stop => break,
                Fast::Refused(r) => {
                    if self.decode_refused(i, slot, r, &mut budget, &mut st, out) == Step::Stop {
                        break;
                    }
                    i += 1;
                    continue;
                }
                Fast::General => {}
            }
            let e = self.entry(slot);
            if e.recomputed == st.epoch || e.inflight {
                i += 1;
                continue;
            }
            let phase = e.spec.phase;
            if phase == Phase::GenerationInProgress {
                if budget.requests_full() {
                    break;
                }
            } else if phase == Phase::DisaggGenerationInit {
                let cap = e.spec.prompt + e.spec.draft;
                let Some(pages) = self.peft_need(slot) else {
                    break;
                };
                let r = self.kv_ref(slot);
                if self.lease_obtainable(slot) && self.kv.prepare_disagg_gen_init(r, cap) {
                    // The transferred prompt's KV is in place: the request owns it (and its adapter
                    // lease) from now on, so when its transfer completes it takes the generation path
                    // as an ordinary active request.
                    if self.admit_disagg(slot, out) {
                        let l = self.listed(slot);
                        let _ = out.disagg.push(l);
                        self.commit_peft(slot, pages, out);
                    }
                }
                i += 1;
                continue;
            } else if budget.requests_full() {
                break;
            } else if !window.contains(phase) {
                i += 1;
                continue;
            } else if phase == Phase::EncoderInit || phase == Phase::ContextInit {
                let _ = self.pending.push(i as u16);
                i += 1;
                continue;
            }
            let g = GenStep {
                slot,
                id: e.spec.id,
                beam: e.spec.beam,
                draft: e.spec.draft,
                headroom: e.headroom,
                active: matches!(e.residency, Residency::Active(_)),
            };
            let task = e.task;
            let pages = match task {
                // An active request holds a lease, so its adapter is pinned and was counted when the
                // pass began (it stays counted while a lease on it lives): nothing to add, no call.
                Some(t) if !g.active => self.desk.pages_needed(g.id, t),
                _ => Some(0),
            };
            debug_assert!(
                !g.active || task.is_none_or(|t| self.desk.is_counted(t)),
                "an active request's adapter is counted in the pass budget"
            );
            let Some(pages) = pages else {
                break;
            };
            if self.try_generation(i, g, pages, &mut budget, &mut st, out) == Step::Stop {
                break;
            }
            i += 1;
        }

        // Phase 2: deferred context and encoder requests.
        if let Some(c) = self.cfg.chunking {
            if c.policy == ChunkPolicy::EqualProgress {
                self.plan_equal_progress(&budget, c.unit);
            }
        }
        let mut k = 0;
        while k < self.pending.len() {
            let i = self.pending[k] as usize;
            k += 1;
            if budget.requests_full() {
                break;
            }
            let slot = self.order[i];
            let e = self.entry(slot);
            let phase = e.spec.phase;
            if let Some(c) = self.cfg.chunking {
                if phase == Phase::ContextInit && !budget.has_chunk_budget(c.policy, c.unit) {
                    continue;
                }
            }
            if e.preempted == st.epoch
                || (st.admissions_closed && phase == Phase::ContextInit && e.spec.position == 0)
            {
                continue;
            }
            let Some(pages) = self.peft_need(slot) else {
                continue;
            };
            if phase == Phase::EncoderInit {
                let e = self.entry(slot);
                let tokens = if e.spec.encoder_len > 0 {
                    e.spec.encoder_len
                } else {
                    e.spec.prompt
                };
                if !budget.fits(tokens) {
                    break;
                }
                let l = self.listed(slot);
                let _ = out.encoder.push(l);
                budget.commit(tokens);
                self.commit_peft(slot, pages, out);
                self.entry_mut(slot).scheduled = st.epoch;
                continue;
            }
            match self.try_context(i, pages, &mut budget, &mut st, out) {
                Step::Stop => break,
                Step::Skip | Step::Scheduled => {}
            }
        }

        let verdict = self.detect_deadlock(&mut st, out);
        self.last = st.stats;
        verdict?;
        self.sort(out);
        trace!(
            "pass: {} gen, {} ctx",
            out.generation.len(),
            out.context.len()
        );
        Ok(())
    }

    fn sort(&mut self, out: &mut SchedulerOutput<N>) {
        if out.adapters.len() > 1 {
            out.adapters.sort_unstable_by_key(|t| t.id);
        }
        // The generation list was counted as it was filled: no counting pass.
        output::sort_counted(
            &mut out.generation,
            &mut self.scratch,
            &out.adapters,
            &mut self.sort_counts,
            self.gen_plain,
        );
        output::sort_by_lora(
            &mut out.encoder,
            &mut self.scratch,
            false,
            &out.adapters,
            &mut self.sort_counts,
        );
        let partition = out.has_chunking;
        output::sort_by_lora(
            &mut out.context,
            &mut self.scratch,
            partition,
            &out.adapters,
            &mut self.sort_counts,
        );
    }

    fn detect_deadlock(
        &mut self,
        st: &mut PassState,
        out: &mut SchedulerOutput<N>,
    ) -> Result<(), Error> {
        let progress = !out.generation.is_empty()
            || !out.context.is_empty()
            || !out.encoder.is_empty()
            || !out.disagg.is_empty()
            || st.evictions > 0
            || st.recomputes > 0;
        if progress {
            self.stall = 0;
            return Ok(());
        }
        let gen_candidates = self.order.iter().any(|&s| {
            let e = self.entry(s);
            e.spec.phase.is_generation()
                && e.spec.phase != Phase::GenerationToComplete
                && !e.inflight
        });
        let ctx_candidates = self
            .pending
            .iter()
            .any(|&i| self.entry(self.order[i as usize]).preempted != st.epoch);
        if !gen_candidates && !ctx_candidates {
            self.stall = 0;
            return Ok(());
        }
        if self
            .order
            .iter()
            .any(|&s| self.entry(s).spec.phase.holds_transfer())
        {
            self.stall = 0;
            return Ok(());
        }
        if self.break_context_wedge(st, out) {
            // An eviction is progress (as every ordinary eviction is). Bounded: each one turns an active
            // partially prefilled context into a suspended one, and only a scheduled chunk turns one back.
            self.stall = 0;
            return Ok(());
        }
        self.stall += 1;
        if self.stall >= self.cfg.deadlock_threshold {
            crate::fmt::log_warn!("scheduler deadlock after {} stalled passes", self.stall);
            return Err(Error::Deadlock {
                stalled: self.stall,
            });
        }
        Ok(())
    }

    /// On a stalled pass (beyond the reference): with a tier below the GPU that absorbs suspended pages,
    /// two or more partially prefilled contexts can each hold pages the others' next chunks need, and the
    /// reference has nothing to free them (no context-side preemption with a lower tier; only generation
    /// steps evict). Then the youngest of them is suspended to the lower tier, so the older ones progress
    /// in the next pass. A productive pass is never disturbed and the oldest context is never the one to
    /// yield; once one wedged context is left, the stall counts (a wedge this cannot break still ends in
    /// a deadlock error). Returns whether it suspended one.
    fn break_context_wedge(&mut self, st: &mut PassState, out: &mut SchedulerOutput<N>) -> bool {
        if !self.kv.tier_below_gpu()
            || !self.kv.can_evict()
            || self.cfg.policy == CapacityPolicy::GuaranteedNoEvict
        {
            return false;
        }
        let wedged = |e: &Entry| {
            !e.inflight
                && e.spec.phase.is_context_init()
                && e.spec.started()
                && matches!(e.residency, Residency::Active(_))
        };
        let mut youngest = None;
        let mut count = 0;
        for &s in self.order.iter() {
            if wedged(self.entry(s)) {
                count += 1;
                youngest = Some(s);
            }
        }
        match (count >= 2, youngest) {
            (true, Some(s)) => {
                self.suspend(s, st, out);
                st.stats.victims += 1;
                true
            }
            _ => false,
        }
    }

    // --- Phase 1: the generation ladder (spec §1.5). ---

    fn try_generation(
        &mut self,
        i: usize,
        g: GenStep,
        pages: u32,
        budget: &mut Budget,
        st: &mut PassState,
        out: &mut SchedulerOutput<N>,
    ) -> Step {
        let GenStep {
            slot,
            id,
            beam,
            draft,
            headroom,
            active,
        } = g;
        let tokens = beam + draft;
        if !budget.fits(tokens) {
            return Step::Stop;
        }
        if st.beam != 0 && st.beam != beam {
            return Step::Skip;
        }
        if !active && !self.lease_obtainable(slot) {
            // A suspended request whose lease would be refused: evicting others for its KV is futile.
            return Step::Skip;
        }
        // Under GUARANTEED_NO_EVICT the admission reserved KV to completion: a step inside the
        // reservation asks the backend for no new tokens (else every step would grow the cache past its
        // reservation, and a request that fits alone could never finish).
        let step = draft.saturating_add(1);
        let grow = step.saturating_sub(headroom);
        let after = headroom.saturating_sub(step);
        // The common case, an active request: one table lookup for the whole step, the KV call in
        // between, no residency dispatch.
        let done = active && {
            let ok = self.kv.try_allocate_generation(KvRef { slot, id }, grow);
            if ok {
                self.scheduled_generation(slot, st.epoch, after, pages, out);
            }
            ok
        };
        if !done {
            // A refused active request goes straight to the ladder (one allocation attempt only).
            let ok = !active && self.allocate_generation(slot, grow, out);
            if !ok {
                if let Some(refused) = self.generation_ladder(i, grow, st, out) {
                    return refused;
                }
            }
            self.scheduled_generation(slot, st.epoch, after, pages, out);
        }
        budget.commit(tokens);
        st.beam = beam;
        Step::Scheduled
    }

    /// An active request's decode step (the common case of phase 1), in one table lookup: the same
    /// checks, in the same order, as the general path ([`Self::try_generation`]) takes for it. `General`
    /// when the request is not an active, schedulable `GENERATION_IN_PROGRESS` one (nothing was
    /// touched); `Refused` when its one KV attempt was refused (the ladder is next).
    #[inline(always)]
    fn decode_step(
        &mut self,
        slot: u16,
        budget: &mut Budget,
        st: &mut PassState,
        out: &mut SchedulerOutput<N>,
    ) -> Fast {
        let Self {
            table,
            kv,
            desk,
            sort_counts,
            gen_plain,
            ..
        } = self;
        let e = live(table.at_mut(slot));
        if e.recomputed == st.epoch || e.inflight {
            return Fast::Skip;
        }
        if e.spec.phase != Phase::GenerationInProgress {
            return Fast::General;
        }
        let Residency::Active(r) = &e.residency else {
            return Fast::General;
        };
        if budget.requests_full() {
            return Fast::Stop;
        }
        // An active request holds a lease, so its adapter is pinned and was counted when the pass
        // began: its adapter adds no pages and needs no budget query.
        debug_assert!(
            e.task.is_none_or(|t| desk.is_counted(t)),
            "an active request's adapter is counted in the pass budget"
        );
        let (beam, draft, headroom) = (e.spec.beam, e.spec.draft, e.headroom);
        // No overflow: admission and `update` keep beam (at least 1) + draft within u32.
        let tokens = beam + draft;
        if !budget.fits(tokens) {
            return Fast::Stop;
        }
        if st.beam != 0 && st.beam != beam {
            return Fast::Skip;
        }
        // See `try_generation`: a step inside a GUARANTEED_NO_EVICT reservation asks for no tokens.
        let step = draft + 1;
        let grow = step.saturating_sub(headroom);
        let after = headroom.saturating_sub(step);
        if !kv.try_allocate_generation(r.kv_ref(), grow) {
            return Fast::Refused(Refusal {
                grow,
                after,
                tokens,
                beam,
            });
        }
        e.scheduled = st.epoch;
        e.headroom = after;
        out.push_generation(r, e.lora);
        match e.task {
            Some(t) => {
                if desk.commit_counted(t) {
                    enter_plan(t, sort_counts, out);
                }
                count_in(sort_counts, t);
            }
            None => *gen_plain += u32::from(e.lora.is_none()),
        }
        budget.commit(tokens);
        st.beam = beam;
        Fast::Scheduled
    }

    /// An active request whose decode step was refused: the generation ladder (spec §1.5 steps 5–7).
    #[cold]
    #[inline(never)]
    fn decode_refused(
        &mut self,
        i: usize,
        slot: u16,
        r: Refusal,
        budget: &mut Budget,
        st: &mut PassState,
        out: &mut SchedulerOutput<N>,
    ) -> Step {
        if let Some(refused) = self.generation_ladder(i, r.grow, st, out) {
            return refused;
        }
        self.scheduled_generation(slot, st.epoch, r.after, 0, out);
        budget.commit(r.tokens);
        st.beam = r.beam;
        Step::Scheduled
    }

    /// Lists a generation request whose KV step succeeded, stamps it and commits its adapter.
    #[inline(always)]
    fn scheduled_generation(
        &mut self,
        slot: u16,
        epoch: u32,
        headroom: u32,
        pages: u32,
        out: &mut SchedulerOutput<N>,
    ) {
        let Self {
            table,
            desk,
            sort_counts,
            gen_plain,
            ..
        } = self;
        let e = live(table.at_mut(slot));
        e.scheduled = epoch;
        e.headroom = headroom;
        match &e.residency {
            Residency::Active(r) => out.push_generation(r, e.lora),
            _ => unreachable!("a scheduled generation request is active"),
        }
        match e.task {
            Some(t) => {
                if desk.commit(t, pages) {
                    enter_plan(t, sort_counts, out);
                }
                count_in(sort_counts, t);
            }
            None => *gen_plain += u32::from(e.lora.is_none()),
        }
    }

    /// The generation ladder after a refused allocation (spec §1.5 steps 5–7): ordinary eviction from the
    /// tail, recompute pause, then self-eviction. `None` when the request got its KV, else the step.
    #[cold]
    #[inline(never)]
    fn generation_ladder(
        &mut self,
        i: usize,
        grow: u32,
        st: &mut PassState,
        out: &mut SchedulerOutput<N>,
    ) -> Option<Step> {
        let slot = self.order[i];
        if self.cfg.policy == CapacityPolicy::GuaranteedNoEvict {
            // Never evict under GUARANTEED_NO_EVICT: the request waits.
            return Some(Step::Skip);
        }
        let mut ok = self.evict_for_generation(i, grow, st, out);
        if !ok && self.cfg.recompute_pause {
            ok = self.recompute_for_generation(i, grow, st, out);
        }
        if !ok {
            // Self-eviction: only an active cache can be suspended.
            if let Residency::Active(_) = self.entry(slot).residency {
                self.suspend(slot, st, out);
                st.stats.self_evictions += 1;
            }
            return Some(Step::Stop);
        }
        None
    }

    /// One allocation attempt; a suspended request that gets its KV back is resumed (lease re-acquired)
    /// and settled to `Active`.
    fn allocate_generation(&mut self, slot: u16, grow: u32, out: &mut SchedulerOutput<N>) -> bool {
        let r = self.kv_ref(slot);
        match self.entry(slot).residency.kind() {
            ResidencyKind::Active => self.kv.try_allocate_generation(r, grow),
            ResidencyKind::Paused => {
                if !self.kv.try_allocate_generation(r, grow) {
                    return false;
                }
                let Residency::Paused(p) = self.take(slot) else {
                    unreachable!()
                };
                match p.resume(&mut self.kv, &mut self.desk, KvReturn::Generation) {
                    Ok(resumed) => {
                        let _ = out.resumed.push(self.listed(slot));
                        self.put(slot, Residency::Active(resumed.settle()));
                        true
                    }
                    Err(refused) => {
                        self.put(slot, Residency::Paused(refused.request));
                        false
                    }
                }
            }
            ResidencyKind::Waiting | ResidencyKind::Recompute => {
                // No cache: the backend refuses (the call is still made, as upstream).
                let ok = self.kv.try_allocate_generation(r, grow);
                if ok {
                    self.kv.revert_allocate_generation(r);
                }
                false
            }
        }
    }

    fn suspend(&mut self, slot: u16, st: &mut PassState, out: &mut SchedulerOutput<N>) {
        let Residency::Active(a) = self.take(slot) else {
            unreachable!("only active requests are suspended")
        };
        let p = a.suspend(&mut self.kv, &mut self.desk);
        self.put(slot, Residency::Paused(p));
        let l = self.listed(slot);
        let _ = out.paused.push(l);
        self.entry_mut(slot).evicted = st.epoch;
        st.evictions += 1;
    }

    fn evictable(&self, slot: u16) -> bool {
        let e = self.entry(slot);
        !e.inflight && e.spec.started() && matches!(e.residency, Residency::Active(_))
    }

    fn recompute_candidate(&self, slot: u16) -> bool {
        let e = self.entry(slot);
        let s = &e.spec;
        !e.inflight
            && s.phase != Phase::GenerationToComplete
            && !(s.phase.is_generation() && s.multimodal)
            && s.started()
    }

    /// Ordinary eviction from the tail (spec §1.5 step 5): suspend the last evictable request before the
    /// end index, shrink the end index to it, retry.
    fn evict_for_generation(
        &mut self,
        i: usize,
        grow: u32,
        st: &mut PassState,
        out: &mut SchedulerOutput<N>,
    ) -> bool {
        let slot = self.order[i];
        loop {
            let mut victim = None;
            let mut j = st.end;
            while j > i + 1 {
                j -= 1;
                if self.evictable(self.order[j]) {
                    victim = Some(j);
                    break;
                }
            }
            let Some(j) = victim else { return false };
            self.suspend(self.order[j], st, out);
            st.stats.victims += 1;
            st.end = j;
            if self.allocate_generation(slot, grow, out) {
                return true;
            }
        }
    }

    /// Destructive recompute pause (spec §1.5 step 6): its own frontier and exact victim set.
    fn recompute_for_generation(
        &mut self,
        i: usize,
        grow: u32,
        st: &mut PassState,
        out: &mut SchedulerOutput<N>,
    ) -> bool {
        let slot = self.order[i];
        loop {
            let can_evict = self.kv.can_evict();
            let mut victim = None;
            let mut j = st.frontier;
            while j > i + 1 {
                j -= 1;
                let s = self.order[j];
                let e = self.entry(s);
                if e.recomputed == st.epoch || !self.recompute_candidate(s) {
                    continue;
                }
                if e.evicted == st.epoch && !can_evict {
                    continue;
                }
                victim = Some(j);
                break;
            }
            if victim.is_none() && can_evict {
                // Fall back to the first recompute-eligible request evicted in this pass.
                victim = out.paused.iter().find_map(|l| {
                    let e = self.entry(l.slot);
                    (e.recomputed != st.epoch && self.recompute_candidate(l.slot))
                        .then(|| self.order.iter().position(|&s| s == l.slot))
                        .flatten()
                });
            }
            let Some(j) = victim else { return false };
            let vslot = self.order[j];
            if let Some(p) = out.paused.iter().position(|l| l.slot == vslot) {
                out.paused.remove(p);
            }
            self.recompute(vslot, st, out);
            st.stats.recompute_pauses += 1;
            st.frontier = st.frontier.min(j);
            if self.allocate_generation(slot, grow, out) {
                return true;
            }
            if can_evict && self.evict_for_generation(i, grow, st, out) {
                return true;
            }
        }
    }

    fn recompute(&mut self, slot: u16, st: &mut PassState, out: &mut SchedulerOutput<N>) {
        let next = match self.take(slot) {
            Residency::Active(a) => a.recompute(&mut self.kv, &mut self.desk),
            Residency::Paused(p) => p.recompute(&mut self.kv),
            Residency::Waiting(w) => w.recompute(&mut self.kv),
            Residency::Recompute(r) => r,
            Residency::Moving => unreachable!(),
        };
        self.put(slot, Residency::Recompute(next));
        let l = self.listed(slot);
        let _ = out.recompute_paused.push(l);
        let e = self.entry_mut(slot);
        e.recomputed = st.epoch;
        e.headroom = 0;
        st.recomputes += 1;
    }

    // --- Phase 2: context admission (spec §1.6–§1.8). ---

    fn plan_equal_progress(&mut self, budget: &Budget, unit: u32) {
        let maxctx = self.cfg.max_context_length;
        let Some(mut left) = budget.remaining() else {
            for k in 0..self.pending.len() {
                let s = self.order[self.pending[k] as usize];
                let e = self.entry_mut(s);
                e.planned_chunk = e.spec.prompt - e.spec.position;
            }
            return;
        };
        for k in 0..self.pending.len() {
            let s = self.order[self.pending[k] as usize];
            self.entry_mut(s).planned_chunk = 0;
        }
        loop {
            let mut progressed = 0u32;
            for k in 0..self.pending.len() {
                let s = self.order[self.pending[k] as usize];
                let e = self.entry_mut(s);
                if e.spec.phase != Phase::ContextInit {
                    continue;
                }
                let remaining = e.spec.prompt - e.spec.position;
                let past = e.planned_chunk;
                let actual = (past + unit).min(remaining);
                let inc = actual - past;
                if inc == 0 || inc > left || maxctx.is_some_and(|m| actual > m) {
                    continue;
                }
                e.planned_chunk = actual;
                left -= inc;
                progressed += inc;
            }
            if progressed == 0 {
                break;
            }
        }
    }

    fn try_context(
        &mut self,
        i: usize,
        pages: u32,
        budget: &mut Budget,
        st: &mut PassState,
        out: &mut SchedulerOutput<N>,
    ) -> Step {
        let slot = self.order[i];
        if !self.lease_obtainable(slot) {
            // Its adapter cannot be admitted now: touch no KV (and preempt nobody) for a request whose
            // lease would be refused after the pages were found.
            return Step::Skip;
        }
        let first = self.entry(slot).spec.position == 0;
        let result = match self.cfg.chunking {
            None => self.context_whole(i, first, budget, st, out),
            Some(_) => self.context_chunked(i, first, budget, st, out),
        };
        let (tokens, chunk, last) = match result {
            Ok(x) => x,
            Err(step) => {
                self.roll_back_context(slot, first);
                return step;
            }
        };
        // KV is in place: the type-state transition takes the lease (first chunk, replay, resume).
        if !self.take_ownership(slot, out) {
            self.roll_back_context(slot, first);
            return Step::Skip;
        }
        let lora = self.entry(slot).lora;
        match &self.entry(slot).residency {
            Residency::Active(a) => out.push_context(a, chunk, last, lora),
            _ => unreachable!("an admitted context request is active"),
        }
        budget.commit(tokens);
        self.commit_peft(slot, pages, out);
        self.entry_mut(slot).scheduled = st.epoch;
        Step::Scheduled
    }

    /// A failed first chunk releases whatever cache it got and is rewound; a suspended later chunk whose
    /// KV came back without being scheduled is suspended again (so it never holds active KV without a
    /// lease).
    fn roll_back_context(&mut self, slot: u16, first: bool) {
        let r = self.kv_ref(slot);
        if first {
            if self.kv.has_cache(r) {
                self.kv.free(r);
            }
            let e = self.entry_mut(slot);
            e.spec.position = 0;
            e.headroom = 0;
        } else if matches!(self.entry(slot).residency, Residency::Paused(_)) && self.kv.is_active(r)
        {
            self.kv.suspend(r);
        }
    }

    fn prep(&self, slot: u16, first: bool) -> ContextPrep {
        let s = &self.entry(slot).spec;
        ContextPrep {
            first_chunk: first,
            prompt: s.prompt,
            position: s.position,
        }
    }

    /// Prepares the cache; a first chunk's reused prefix moves the position.
    fn prepare(&mut self, slot: u16, first: bool) -> bool {
        let r = self.kv_ref(slot);
        let prep = self.prep(slot, first);
        match self.kv.prepare_context(r, prep) {
            None => false,
            Some(reused) => {
                if first && reused > 0 {
                    let s = &mut self.entry_mut(slot).spec;
                    s.position = reused.min(s.prompt);
                }
                true
            }
        }
    }

    fn reserve(&self, slot: u16, capacity: u32) -> u32 {
        let s = &self.entry(slot).spec;
        if self.cfg.policy == CapacityPolicy::GuaranteedNoEvict {
            capacity.max(s.prompt + s.max_new_tokens + s.draft)
        } else {
            capacity
        }
    }

    fn resize(
        &mut self,
        i: usize,
        first: bool,
        capacity: u32,
        st: &mut PassState,
        out: &mut SchedulerOutput<N>,
    ) -> Result<(), Step> {
        let slot = self.order[i];
        let r = self.kv_ref(slot);
        let reserved = self.reserve(slot, capacity);
        if self.kv.resize_context(r, reserved, first) {
            // What the cache holds beyond this chunk stays reserved for the decode steps (under-
            // stating it is safe: a step then merely asks for tokens the cache already has room for).
            self.entry_mut(slot).headroom = reserved - capacity;
            return Ok(());
        }
        if self.cfg.policy == CapacityPolicy::GuaranteedNoEvict {
            // C++ GUARANTEED_NO_EVICT (spec §7): a block shortage ends the admission of new requests, so
            // later (smaller) ones cannot overtake one that waits for its whole reservation. Contexts
            // already admitted hold their reservation and keep going (else a new request waiting for
            // their pages would block them for good).
            if first {
                st.admissions_closed = true;
            }
            return Err(Step::Skip);
        }
        Err(if self.preempt_for_pages(i, st, out) {
            Step::Stop
        } else {
            Step::Skip
        })
    }

    /// Non-chunked admission: (tokens charged, chunk, last).
    fn context_whole(
        &mut self,
        i: usize,
        first: bool,
        budget: &mut Budget,
        st: &mut PassState,
        out: &mut SchedulerOutput<N>,
    ) -> Result<(u32, u32, bool), Step> {
        let slot = self.order[i];
        let (prompt, pos0, draft) = {
            let s = &self.entry(slot).spec;
            (s.prompt, s.position, s.draft)
        };
        let pre = prompt - pos0 + draft;
        if !self.cfg.prefix_aware && !budget.fits(pre) {
            return Err(Step::Stop);
        }
        if !self.prepare(slot, first) {
            return Err(Step::Stop);
        }
        let pos = self.entry(slot).spec.position;
        let post = prompt - pos + draft;
        if self.cfg.prefix_aware && !budget.fits(post) {
            return Err(Step::Stop);
        }
        self.resize(i, first, pos + post, st, out)?;
        let charged = if self.cfg.prefix_aware { post } else { pre };
        Ok((charged, prompt - pos, true))
    }

    /// Chunked admission: (tokens charged, chunk, last).
    fn context_chunked(
        &mut self,
        i: usize,
        first: bool,
        budget: &mut Budget,
        st: &mut PassState,
        out: &mut SchedulerOutput<N>,
    ) -> Result<(u32, u32, bool), Step> {
        let slot = self.order[i];
        let Some(ch) = self.cfg.chunking else {
            return Err(Step::Skip);
        };
        if !budget.has_chunk_budget(ch.policy, ch.unit) {
            return Err(Step::Skip);
        }
        let pos0 = self.entry(slot).spec.position;
        if !self.prepare(slot, first) {
            return Err(Step::Skip);
        }
        let e = self.entry(slot);
        let (prompt, pos, draft) = (e.spec.prompt, e.spec.position, e.spec.draft);
        let post_remaining = prompt - pos;
        let remaining = if self.cfg.prefix_aware {
            post_remaining
        } else {
            prompt - pos0
        };
        let next_snapshot = e
            .spec
            .snapshots
            .iter()
            .copied()
            .find(|&p| p > pos)
            .map(|p| p.min(prompt));
        let mut chunk = match ch.policy {
            ChunkPolicy::ForceChunk => next_snapshot.map_or(remaining, |p| p - pos),
            ChunkPolicy::EqualProgress => e.planned_chunk.min(remaining),
            ChunkPolicy::FirstComeFirstServed => {
                budget.remaining().map_or(remaining, |b| b.min(remaining))
            }
        };
        if let Some(m) = self.cfg.max_context_length {
            chunk = chunk.min(m);
        }
        if let Some(b) = budget.remaining() {
            chunk = chunk.min(b);
        }
        if chunk < remaining {
            let end = pos + chunk;
            let on_boundary = end == prompt || e.spec.snapshots.contains(&end);
            if ch.policy != ChunkPolicy::ForceChunk || !on_boundary {
                chunk = chunk / ch.unit * ch.unit;
            }
        }
        if chunk == 0 {
            return Err(Step::Skip);
        }
        let ctx_chunk = chunk.min(post_remaining);
        let last = pos + ctx_chunk >= prompt;
        let extra = if last { draft } else { 0 };
        self.resize(i, first, pos + ctx_chunk + extra, st, out)?;
        Ok((chunk + extra, ctx_chunk, last))
    }

    /// Context-side preemption (spec §1.8): only without a tier below the GPU.
    fn preempt_for_pages(
        &mut self,
        i: usize,
        st: &mut PassState,
        out: &mut SchedulerOutput<N>,
    ) -> bool {
        if self.kv.tier_below_gpu()
            || !self.cfg.recompute_pause
            || self.cfg.policy == CapacityPolicy::GuaranteedNoEvict
        {
            return false;
        }
        // Scan newest first over the whole list, or only the one index an earlier empty scan left open.
        let (mut j, lo) = match st.preempt_only {
            None => (self.order.len(), 0),
            Some(only) if only < self.order.len() => (only + 1, only),
            Some(_) => (0, 0),
        };
        while j > lo {
            j -= 1;
            if j == i || !self.preemptable(self.order[j], st) {
                continue;
            }
            let s = self.order[j];
            let rc = match self.take(s) {
                Residency::Active(a) => a.preempt(&mut self.kv, &mut self.desk),
                Residency::Paused(p) => {
                    // Suspended earlier in this pass: it is listed once, as preempted.
                    if let Some(k) = out.paused.iter().position(|l| l.slot == s) {
                        out.paused.remove(k);
                    }
                    p.preempt(&mut self.kv)
                }
                _ => unreachable!(),
            };
            self.put(s, Residency::Recompute(rc));
            let l = self.listed(s);
            let _ = out.recompute_paused.push(l);
            let e = self.entry_mut(s);
            e.preempted = st.epoch;
            e.headroom = 0;
            st.recomputes += 1;
            st.stats.preemptions += 1;
            return true;
        }
        st.preempt_only = Some(if self.preemptable(self.order[i], st) {
            i
        } else {
            usize::MAX
        });
        false
    }

    /// A context-side preemption candidate (spec §1.8): not scheduled in this pass, a recompute-pause
    /// candidate, with a cache on the GPU. Without a lower tier a suspended cache is HELD on the GPU:
    /// preempting it frees its pages just as preempting an active one does (the reference skips it, and
    /// a held request at the head of the line then wedges the pool for good).
    fn preemptable(&self, s: u16, st: &PassState) -> bool {
        let e = self.entry(s);
        e.scheduled != st.epoch
            && self.recompute_candidate(s)
            && matches!(e.residency, Residency::Active(_) | Residency::Paused(_))
    }
}
