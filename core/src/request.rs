//! Requests: ids, per-request data, and the type-state lifecycle of what a request owns.
//!
//! The *phase* of a request ([`Phase`](crate::phase::Phase)) is runtime data. What it *owns* — KV pages and an adapter lease —
//! is its type-state: a [`Request<S>`] with `S` one of [`Waiting`], [`Active`], [`Resumed`],
//! [`Suspended<Paused>`], [`Suspended<Recompute>`] and [`Sending`]. Each numbered arrow is one consuming function:
//!
//! ```text
//!                 (1) admit: KV pages + adapter lease
//!    Waiting ────────────────────────────────────────▶ Active ──(8) finish──▶ released
//!       ▲                                               │   ▲  ╲
//!       │ (6) replay: first chunk                (2)    │   │   ╲ (9) send: KV pinned for the transfer
//!       │     re-acquires the lease         suspend     │   │    ╲    manager, lease returned (pause=false)
//!       │                                               │   │     ▶ Sending ──(10) sent──▶ KV freed
//!       │                                               ▼   │ (5) settle: the page moves were
//!       │                                               │   │     handed to the copy engine
//!    Suspended<Recompute> ◀──(4) recompute──── Suspended<Paused> ──(3) resume──▶ Resumed
//!       KV freed, paused       / (7) preempt    KV in a lower tier or HELD;     KV back on GPU AND
//!       on the adapter         (Active too)     lease returned (pause=true)     a fresh lease
//! ```
//!
//! 1. [`Request<Waiting>::admit`] — the pass allocated the first chunk's KV; the desk mints the lease
//!    (a fork's child: the lease first, then its parent's pages shared, `Scheduler::fork`).
//! 2. [`Request::suspend`] (on [`Active`] or [`Resumed`]) — victim or self-eviction: KV suspended, lease
//!    returned with pause.
//! 3. [`Request<Suspended<Paused>>::resume`] — needs the KV backend *and* the adapter desk; the only way
//!    to a [`Resumed`], which carries the fresh lease.
//! 4. [`Request::recompute`] (on a lease holder) / [`Request<Suspended<Paused>>::recompute`] —
//!    destructive recompute pause: KV freed, lease (if any) returned with pause.
//! 5. [`Request<Resumed>::settle`] — needs the proof [`MovesTaken`] that the pass's page moves (the
//!    copy-up of the resumed pages) were handed to the engine: only then does the request become an
//!    ordinary active one. Until then it is batched as a [`Resumed`] and the engine must copy its pages
//!    up before the step runs.
//! 6. [`Request<Suspended<Recompute>>::replay`] — the replay's first chunk acquires a new lease.
//! 7. [`Request::preempt`] — context-side preemption (pages given up), like 4; of a HELD
//!    [`Suspended<Paused>`] only as a deadlock remedy (the pass decides).
//! 8. `finish` on every state — everything it owns is released (lease with pause = false).
//! 9. [`Request::send`] — disaggregated serving: a context-only request's prompt is computed and the
//!    transfer manager sends its KV to a decode engine. The lease goes back (pause = false: sending
//!    reads KV, not the adapter); the pages stay on the GPU, pinned, until the send ends.
//! 10. [`Request<Sending>::sent`] — the send ended (delivered, failed or timed out): its pages are
//!     freed (its committed blocks stay cached).
//!
//! Every capability a transition needs — the KV backend, the [`AdapterDesk`], the [`MovesTaken`] proof —
//! is minted only inside this crate, and no public function hands out a request: the lifecycle can be read
//! here and is walked only by the scheduler. Activation checks (admit, resume and replay need the KV active
//! on the GPU) are always on and refuse with an error, handing the request back unchanged. A batch
//! ([`crate::output::SchedulerOutput`]) accepts only [`Schedulable`] states: [`Active`] and [`Resumed`]. A
//! request or lease dropped while it still owns resources panics in debug builds with the `std` feature
//! (the drop bomb does nothing while the thread is already panicking).
//!
//! The transitions out of the suspended states (3, 4, 6, 7 and their finish) are in `request/suspended.rs`;
//! what a request is ([`RequestSpec`]) in `request/spec.rs`.

use core::marker::PhantomData;

use crate::adapter::{PeftBackend, TaskRef};
use crate::bomb::Bomb;
use crate::ids::{RequestId, TaskId, TaskSlot};
use crate::kv::{KvBackend, KvRef};
use crate::lease::{AdapterDesk, AdapterLease, PausedOn};
use crate::{error::Error, storage::Storage};

mod spec;
mod suspended;
pub use spec::{RequestSpec, MAX_SNAPSHOTS};

/// What a request owns, as a runtime value: the one-byte tag the request table keeps next to each typed
/// request, derived from its type-state ([`State::OWNERSHIP`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Ownership {
    /// [`Waiting`]: owns nothing.
    Waiting = 0,
    /// [`Active`]: KV active on the GPU, lease held.
    Active = 1,
    /// [`Resumed`]: KV back on the GPU (pages to be copied up before the step), lease held.
    Resumed = 2,
    /// [`Suspended<Paused>`]: KV suspended, paused on its adapter.
    Paused = 3,
    /// [`Suspended<Recompute>`]: KV freed, waiting to replay its prefill.
    Recompute = 4,
    /// [`Sending`]: KV pinned on the GPU while the transfer manager sends it; no lease.
    Sending = 5,
}

impl Ownership {
    /// Its KV is active on the GPU and it holds its lease ([`Active`] or [`Resumed`]).
    pub const fn on_gpu(self) -> bool {
        matches!(self, Ownership::Active | Ownership::Resumed)
    }
}

mod sealed {
    pub trait Sealed {}
}

/// A type-state: what a request owns. Sealed: the six states below are all there are.
pub trait State: sealed::Sealed {
    /// The runtime tag of this state.
    const OWNERSHIP: Ownership;
}

/// States a batch accepts: [`Active`] and [`Resumed`].
pub trait Schedulable: State {}

/// States that own active KV and the lease: [`Active`] and [`Resumed`] (what suspension, recompute pause,
/// preemption and finishing consume).
pub trait OnGpu: State {
    /// The lease, if the request has an adapter.
    #[doc(hidden)]
    fn into_lease(self) -> Option<AdapterLease>;
    /// The lease, borrowed.
    #[doc(hidden)]
    fn lease_ref(&self) -> Option<&AdapterLease>;
}

/// Owns nothing (not admitted yet, or rolled back).
#[derive(Debug)]
pub struct Waiting;
/// KV pages active on the GPU and, for a LoRA request, a lease.
#[derive(Debug)]
pub struct Active {
    lease: Option<AdapterLease>,
}
/// Marker: KV suspended (moved to a lower tier, or HELD on the GPU).
#[derive(Debug)]
pub struct Paused;
/// Marker: KV freed; the request will replay its prefill.
#[derive(Debug)]
pub struct Recompute;
/// Owns no lease; registered as paused on its adapter (host copy pinned), if it has one.
#[derive(Debug)]
pub struct Suspended<M> {
    paused_on: Option<PausedOn>,
    _m: PhantomData<M>,
}
/// KV back on the GPU and a fresh lease: only [`Request<Suspended<Paused>>::resume`] makes one. Its
/// lower-tier pages are copied up by the engine before the step ([`Request<Resumed>::settle`]).
#[derive(Debug)]
pub struct Resumed {
    lease: Option<AdapterLease>,
}

/// KV pages pinned on the GPU while the transfer manager sends them to a decode engine (disaggregated
/// serving); no lease, never scheduled, never a victim. Only [`Request::send`] makes one.
#[derive(Debug)]
pub struct Sending;

/// Proof that the page moves of the passes so far were handed to the copy engine (minted by the
/// scheduler when the engine takes the move log): what [`Request<Resumed>::settle`] needs.
#[derive(Debug)]
#[must_use = "the proof settles the resumed requests"]
pub struct MovesTaken {
    _private: (),
}

impl MovesTaken {
    pub(crate) const fn mint() -> Self {
        Self { _private: () }
    }
}

impl<M> Suspended<M> {
    fn new(paused_on: Option<PausedOn>) -> Self {
        Self {
            paused_on,
            _m: PhantomData,
        }
    }
}

impl sealed::Sealed for Waiting {}
impl sealed::Sealed for Active {}
impl sealed::Sealed for Resumed {}
impl sealed::Sealed for Suspended<Paused> {}
impl sealed::Sealed for Suspended<Recompute> {}
impl sealed::Sealed for Sending {}
impl State for Waiting {
    const OWNERSHIP: Ownership = Ownership::Waiting;
}
impl State for Active {
    const OWNERSHIP: Ownership = Ownership::Active;
}
impl State for Resumed {
    const OWNERSHIP: Ownership = Ownership::Resumed;
}
impl State for Suspended<Paused> {
    const OWNERSHIP: Ownership = Ownership::Paused;
}
impl State for Suspended<Recompute> {
    const OWNERSHIP: Ownership = Ownership::Recompute;
}
impl State for Sending {
    const OWNERSHIP: Ownership = Ownership::Sending;
}
impl Schedulable for Active {}
impl Schedulable for Resumed {}
impl OnGpu for Active {
    fn into_lease(self) -> Option<AdapterLease> {
        self.lease
    }
    fn lease_ref(&self) -> Option<&AdapterLease> {
        self.lease.as_ref()
    }
}
impl OnGpu for Resumed {
    fn into_lease(self) -> Option<AdapterLease> {
        self.lease
    }
    fn lease_ref(&self) -> Option<&AdapterLease> {
        self.lease.as_ref()
    }
}

/// Where a request lives in the scheduler's table: its slot, its adapter task slot
/// ([`crate::ids::TaskSlot::NONE`] without one) and the slot's version — the layout of a list entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Place {
    pub(crate) slot: u16,
    pub(crate) task: TaskSlot,
    pub(crate) version: u32,
}

/// What a request is, whatever it owns: where it lives, its id, its adapter task's id (meaningful when
/// `place.task` names a slot). Moves unchanged through every transition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Core {
    place: Place,
    id: RequestId,
    task_id: TaskId,
}

impl Core {
    fn task(self) -> Option<TaskRef> {
        (self.place.task != TaskSlot::NONE).then_some(TaskRef {
            id: self.task_id,
            slot: self.place.task,
        })
    }
}

/// A request in type-state `S`.
#[derive(Debug)]
pub struct Request<S: State> {
    core: Core,
    state: S,
    bomb: Bomb,
}

static_assertions::assert_not_impl_any!(Request<Active>: Clone, Copy);
static_assertions::assert_not_impl_any!(Request<Resumed>: Clone, Copy);
static_assertions::assert_not_impl_any!(Request<Suspended<Paused>>: Clone, Copy, Schedulable);
static_assertions::assert_not_impl_any!(Suspended<Paused>: Schedulable);
static_assertions::assert_not_impl_any!(Suspended<Recompute>: Schedulable);
static_assertions::assert_not_impl_any!(Waiting: Schedulable);
static_assertions::assert_not_impl_any!(Sending: Schedulable, OnGpu);
static_assertions::assert_not_impl_any!(Request<Sending>: Clone, Copy);
static_assertions::assert_not_impl_any!(MovesTaken: Clone, Copy, Default);

/// Why a transition was refused; the request comes back unchanged.
#[derive(Debug)]
pub struct Refused<S: State> {
    /// The request, in its old state.
    pub request: Request<S>,
    /// Why.
    pub error: Error,
}

/// How the KV of a resumed request came back (so a refused lease can be rolled back exactly).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvReturn {
    /// Through `try_allocate_generation`: revert the growth, then suspend again.
    Generation,
    /// Through `prepare_context` + `resize_context`: suspend again.
    Context,
}

impl<S: State> Request<S> {
    /// The KV reference (slot and id).
    #[inline]
    pub fn kv_ref(&self) -> KvRef {
        KvRef {
            slot: self.core.place.slot,
            id: self.core.id,
        }
    }
    /// The request id.
    #[inline]
    pub fn id(&self) -> RequestId {
        self.core.id
    }
    /// The adapter task, when the request has one and an adapter cache is configured.
    #[inline]
    pub fn task(&self) -> Option<TaskRef> {
        self.core.task()
    }
    #[inline]
    pub(crate) fn place(&self) -> Place {
        self.core.place
    }
    /// Forgets the request's resources without releasing them: only for tearing down a whole scheduler,
    /// whose backends go away with it.
    pub(crate) fn abandon(self) {
        let (_, state) = self.into_parts();
        core::mem::forget(state);
    }

    #[inline]
    fn into_parts(self) -> (Core, S) {
        self.bomb.defuse();
        (self.core, self.state)
    }
    #[inline]
    fn build<T: State>(core: Core, state: T) -> Request<T> {
        Request {
            core,
            state,
            bomb: Bomb::armed(),
        }
    }
    fn not_on_gpu(self) -> Refused<S> {
        let error = Error::NotOnGpu(self.core.id);
        Refused {
            request: self,
            error,
        }
    }
}

impl Request<Waiting> {
    /// A request that owns nothing yet, at `place` in the table.
    pub(crate) fn new(place: Place, id: RequestId, task: Option<TaskRef>) -> Self {
        let core = Core {
            place: Place {
                task: task.map_or(TaskSlot::NONE, |t| t.slot),
                ..place
            },
            id,
            task_id: task.map_or(TaskId(0), |t| t.id),
        };
        Self::build(core, Waiting)
    }

    /// (1) Admission: the pass has given the first chunk its KV pages; the desk mints the lease. Refused
    /// (nothing changes) when the KV is not active or the adapter cache refuses the lease.
    pub fn admit<K: KvBackend, P: PeftBackend, const T: usize, St: Storage>(
        self,
        kv: &mut K,
        desk: &mut AdapterDesk<P, T, St>,
    ) -> Result<Request<Active>, Refused<Waiting>> {
        if !kv.cache(self.kv_ref()).is_active() {
            return Err(self.not_on_gpu());
        }
        let lease = match self.lease(kv, desk) {
            Ok(lease) => lease,
            Err(e) => {
                return Err(Refused {
                    request: self,
                    error: Error::Peft(e),
                })
            }
        };
        let (core, _) = self.into_parts();
        Ok(Self::build(core, Active { lease }))
    }

    /// (1) Admission of a fork's child (beyond the reference; `Scheduler::fork`): the desk mints the
    /// lease first, then `share` gives the request its parent's pages (the scheduler has asked the
    /// backend whether it can). Refused, nothing changed, when the adapter cache refuses the lease;
    /// if `share` fails after all, the lease goes back (pause = false) and the request is refused.
    pub(crate) fn admit_fork<K: KvBackend, P: PeftBackend, const T: usize, St: Storage>(
        self,
        kv: &mut K,
        desk: &mut AdapterDesk<P, T, St>,
        share: impl FnOnce(&mut K) -> bool,
    ) -> Result<Request<Active>, Refused<Waiting>> {
        let lease = match self.lease(kv, desk) {
            Ok(lease) => lease,
            Err(e) => {
                return Err(Refused {
                    request: self,
                    error: Error::Peft(e),
                })
            }
        };
        if !share(kv) || !kv.cache(self.kv_ref()).is_active() {
            if kv.cache(self.kv_ref()).exists() {
                kv.free(self.kv_ref());
            }
            if let Some(l) = lease {
                let _ = desk.release(kv, self.core.id, l, false);
            }
            return Err(Refused {
                request: self,
                error: Error::Invalid("the KV backend refused a fork it said it could make"),
            });
        }
        let (core, _) = self.into_parts();
        Ok(Self::build(core, Active { lease }))
    }

    /// A fresh lease on its adapter from the desk (none for a request without one); the desk's
    /// refusal changes nothing of the request.
    fn lease<K: KvBackend, P: PeftBackend, const T: usize, St: Storage>(
        &self,
        kv: &mut K,
        desk: &mut AdapterDesk<P, T, St>,
    ) -> Result<Option<AdapterLease>, crate::error::PeftError> {
        match self.task() {
            None => Ok(None),
            Some(t) => match desk.acquire(kv, self.core.id, t, None) {
                Ok(l) => Ok(Some(l)),
                Err((_, e)) => Err(e),
            },
        }
    }

    /// Registers a request whose cache the KV backend already holds suspended (adoption): it is paused
    /// on its adapter with `paused_on`.
    pub(crate) fn adopt_suspended(self, paused_on: Option<PausedOn>) -> Request<Suspended<Paused>> {
        let (core, _) = self.into_parts();
        Self::build(core, Suspended::new(paused_on))
    }

    /// (4) Recompute pause of a started request that owns no lease: any cache is freed and the request
    /// is marked for replay.
    pub fn recompute<K: KvBackend>(self, kv: &mut K) -> Request<Suspended<Recompute>> {
        kv.free(self.kv_ref());
        let (core, _) = self.into_parts();
        Self::build(core, Suspended::new(None))
    }

    /// (8) Finish: drops any cache left by a rolled-back admission.
    pub fn finish<K: KvBackend>(self, kv: &mut K) {
        let r = self.kv_ref();
        if kv.cache(r).exists() {
            kv.free(r);
        }
        let _ = self.into_parts();
    }
}

impl<S: OnGpu> Request<S> {
    /// The lease, if the request has an adapter.
    pub fn lease(&self) -> Option<&AdapterLease> {
        self.state.lease_ref()
    }

    /// (2) Ordinary suspension (victim or self-eviction): KV suspended, lease returned with pause = true.
    #[inline]
    pub fn suspend<K: KvBackend, P: PeftBackend, const T: usize, St: Storage>(
        self,
        kv: &mut K,
        desk: &mut AdapterDesk<P, T, St>,
    ) -> Request<Suspended<Paused>> {
        kv.suspend(self.kv_ref());
        self.pause_lease(kv, desk)
    }

    /// (4) Destructive recompute pause: KV freed, lease returned with pause = true.
    pub fn recompute<K: KvBackend, P: PeftBackend, const T: usize, St: Storage>(
        self,
        kv: &mut K,
        desk: &mut AdapterDesk<P, T, St>,
    ) -> Request<Suspended<Recompute>> {
        kv.free(self.kv_ref());
        self.pause_lease(kv, desk)
    }

    /// (7) Context-side preemption: pages given up, lease returned with pause = true.
    pub fn preempt<K: KvBackend, P: PeftBackend, const T: usize, St: Storage>(
        self,
        kv: &mut K,
        desk: &mut AdapterDesk<P, T, St>,
    ) -> Request<Suspended<Recompute>> {
        kv.preempt(self.kv_ref());
        self.pause_lease(kv, desk)
    }

    /// Returns the lease with pause = true: the request becomes suspended (`M`), paused on its adapter.
    fn pause_lease<M, K: KvBackend, P: PeftBackend, const T: usize, St: Storage>(
        self,
        kv: &mut K,
        desk: &mut AdapterDesk<P, T, St>,
    ) -> Request<Suspended<M>>
    where
        Suspended<M>: State,
    {
        let (core, state) = self.into_parts();
        let paused_on = state
            .into_lease()
            .and_then(|l| desk.release(kv, core.id, l, true));
        Self::build(core, Suspended::new(paused_on))
    }

    /// (9) Send: the prompt's KV stays on the GPU, pinned for the transfer manager; the lease is
    /// returned with pause = false (a send reads KV, not the adapter).
    pub fn send<K: KvBackend, P: PeftBackend, const T: usize, St: Storage>(
        self,
        kv: &mut K,
        desk: &mut AdapterDesk<P, T, St>,
    ) -> Request<Sending> {
        let (core, state) = self.into_parts();
        if let Some(l) = state.into_lease() {
            let paused = desk.release(kv, core.id, l, false);
            assert!(paused.is_none(), "a returned lease leaves no pause behind");
        }
        Self::build(core, Sending)
    }

    /// (8) Finish: KV freed, lease returned with pause = false.
    pub fn finish<K: KvBackend, P: PeftBackend, const T: usize, St: Storage>(
        self,
        kv: &mut K,
        desk: &mut AdapterDesk<P, T, St>,
    ) {
        kv.free(self.kv_ref());
        let (core, state) = self.into_parts();
        let id = core.id;
        if let Some(l) = state.into_lease() {
            let paused = desk.release(kv, id, l, false);
            assert!(paused.is_none(), "a finished lease leaves no pause behind");
        }
    }
}

impl Request<Sending> {
    /// (10) Sent: the send ended (delivered, failed or timed out); the pages are freed.
    pub fn sent<K: KvBackend>(self, kv: &mut K) {
        kv.free(self.kv_ref());
        let _ = self.into_parts();
    }
}

impl Request<Resumed> {
    /// (5) Settle: the engine has taken the page moves (the copy-up of this request's pages is ordered
    /// before its step), so the resumed request becomes an ordinary active one.
    pub fn settle(self, moves: &MovesTaken) -> Request<Active> {
        let _ = moves;
        let (core, state) = self.into_parts();
        Self::build(core, Active { lease: state.lease })
    }
}

#[cfg(test)]
mod tests;
