//! Requests: ids, per-request data, and the type-state lifecycle of what a request owns.
//!
//! The *phase* of a request ([`Phase`]) is runtime data. What it *owns* — KV pages and an adapter lease —
//! is its type-state: a [`Request<S>`] with `S` one of [`Waiting`], [`Active`], [`Suspended<Paused>`],
//! [`Suspended<Recompute>`] and [`Resumed`]. Each transition is one consuming function:
//!
//! ```text
//!                 (1) admit: KV pages + adapter lease
//!    Waiting ────────────────────────────────────────▶ Active ──(8) finish──▶ released
//!       ▲                                               │   ▲
//!       │ (6) replay: first chunk                (2)    │   │ (5) settle
//!       │     re-acquires the lease         suspend     ▼   │
//!    Suspended<Recompute> ◀──(4) recompute──── Suspended<Paused> ──(3) resume──▶ Resumed
//!       KV freed, paused       / (7) preempt    KV in a lower tier or HELD;     KV back on GPU AND
//!       on the adapter         (Active too)     lease returned (pause=true)     a fresh lease
//! ```
//!
//! 1. [`Request<Waiting>::admit`] — the pass allocated the first chunk's KV; the desk mints the lease.
//! 2. [`Request<Active>::suspend`] — victim or self-eviction: KV suspended, lease returned with pause.
//! 3. [`Request<Suspended<Paused>>::resume`] — needs the KV backend *and* the adapter desk; the only way
//!    to a [`Resumed`], which carries the fresh lease.
//! 4. [`Request<Suspended<Paused>>::recompute`] / [`Request<Active>::recompute`] — destructive recompute
//!    pause: KV freed, lease (if any) returned with pause.
//! 5. [`Request<Resumed>::settle`] — a resumed request becomes an ordinary active one.
//! 6. [`Request<Suspended<Recompute>>::replay`] — the replay's first chunk acquires a new lease.
//! 7. [`Request<Active>::preempt`] — context-side preemption (pages given up), like 4.
//! 8. `finish` on every state — everything it owns is released (lease with pause = false).
//!
//! A batch ([`crate::output::SchedulerOutput`]) accepts only [`Schedulable`] states: [`Active`] and
//! [`Resumed`]. A request or lease dropped while it still owns resources panics in debug builds with the
//! `std` feature (the drop bomb does nothing while the thread is already panicking).

use core::marker::PhantomData;

use crate::adapter::{PeftBackend, TaskRef};
use crate::error::PeftError;
use crate::kv::{KvBackend, KvRef};
use crate::lease::{AdapterDesk, AdapterLease, PausedOn};
use crate::phase::Phase;

/// A request id (unique among live requests).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct RequestId(pub u64);

/// A LoRA task (adapter) id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct TaskId(pub u64);

/// Most FORCE_CHUNK snapshot points one request carries.
pub const MAX_SNAPSHOTS: usize = 8;

/// What a request is: the data the pass reads. Phase and position change every step.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RequestSpec {
    /// Id.
    pub id: RequestId,
    /// LoRA task, if any.
    pub lora: Option<TaskId>,
    /// Current phase.
    pub phase: Phase,
    /// Prompt length in tokens.
    pub prompt: u32,
    /// Context tokens already processed (in the KV cache).
    pub position: u32,
    /// Beam width this iteration.
    pub beam: u32,
    /// Speculative draft tokens this iteration.
    pub draft: u32,
    /// Output tokens to reserve at admission (GUARANTEED_NO_EVICT) and to check against the pool.
    pub max_new_tokens: u32,
    /// Encoder output length (encoder requests); 0 = use `prompt`.
    pub encoder_len: u32,
    /// FORCE_CHUNK snapshot points (absolute token positions, ascending).
    pub snapshots: heapless::Vec<u32, MAX_SNAPSHOTS>,
    /// A generation request that carries multimodal data (its replay inputs are gone: not a recompute
    /// candidate).
    pub multimodal: bool,
}

impl RequestSpec {
    /// A request in `phase` with a `prompt`-token prompt and defaults elsewhere (position 0, beam 1).
    pub fn new(id: u64, phase: Phase, prompt: u32) -> Self {
        Self {
            id: RequestId(id),
            lora: None,
            phase,
            prompt,
            position: 0,
            beam: 1,
            draft: 0,
            max_new_tokens: 0,
            encoder_len: 0,
            snapshots: heapless::Vec::new(),
            multimodal: false,
        }
    }

    /// A decoding request whose prompt is fully processed.
    pub fn generation(id: u64, prompt: u32) -> Self {
        let mut s = Self::new(id, Phase::GenerationInProgress, prompt);
        s.position = prompt;
        s
    }

    /// With a LoRA task.
    pub fn with_lora(mut self, task: u64) -> Self {
        self.lora = Some(TaskId(task));
        self
    }

    /// Started (spec §1.15): a context-init phase past its first chunk, or a generation phase.
    pub fn started(&self) -> bool {
        (self.phase.is_context_init() && self.position > 0) || self.phase.is_generation()
    }
}

/// Debug drop bomb: armed while its owner holds resources. Defused by the consuming transition.
#[derive(Debug)]
pub(crate) struct Bomb {
    #[cfg(all(feature = "std", debug_assertions))]
    armed: bool,
}

impl Bomb {
    #[inline]
    pub(crate) fn armed() -> Self {
        Self {
            #[cfg(all(feature = "std", debug_assertions))]
            armed: true,
        }
    }
    #[inline]
    pub(crate) fn defused() -> Self {
        Self {
            #[cfg(all(feature = "std", debug_assertions))]
            armed: false,
        }
    }
    #[inline]
    #[allow(unused_mut)]
    pub(crate) fn defuse(mut self) {
        #[cfg(all(feature = "std", debug_assertions))]
        {
            self.armed = false;
        }
    }
}

impl Drop for Bomb {
    #[inline]
    fn drop(&mut self) {
        #[cfg(all(feature = "std", debug_assertions))]
        if self.armed && !std::thread::panicking() {
            panic!("a request or adapter lease was dropped while it still owns resources (KV pages or a lease)");
        }
    }
}

mod sealed {
    pub trait Sealed {}
}

/// A type-state: what a request owns.
pub trait Residency: sealed::Sealed {}

/// States a batch accepts: [`Active`] and [`Resumed`].
pub trait Schedulable: Residency {}

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
/// KV back on the GPU and a fresh lease: only [`Request<Suspended<Paused>>::resume`] makes one.
#[derive(Debug)]
pub struct Resumed {
    lease: Option<AdapterLease>,
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
impl<M> sealed::Sealed for Suspended<M> {}
impl sealed::Sealed for Resumed {}
impl Residency for Waiting {}
impl Residency for Active {}
impl<M> Residency for Suspended<M> {}
impl Residency for Resumed {}
impl Schedulable for Active {}
impl Schedulable for Resumed {}

/// A request in type-state `S`.
#[derive(Debug)]
pub struct Request<S: Residency> {
    kv: KvRef,
    task: Option<TaskRef>,
    state: S,
    bomb: Bomb,
}

static_assertions::assert_not_impl_any!(Request<Active>: Clone, Copy);
static_assertions::assert_not_impl_any!(Request<Suspended<Paused>>: Clone, Copy, Schedulable);
static_assertions::assert_not_impl_any!(Suspended<Paused>: Schedulable);
static_assertions::assert_not_impl_any!(Suspended<Recompute>: Schedulable);
static_assertions::assert_not_impl_any!(Waiting: Schedulable);

impl<S: Residency> Request<S> {
    /// The KV reference (slot and id).
    pub fn kv_ref(&self) -> KvRef {
        self.kv
    }
    /// The adapter task, when the request has one and an adapter cache is configured.
    pub fn task(&self) -> Option<TaskRef> {
        self.task
    }
    fn id(&self) -> crate::request::RequestId {
        self.kv.id
    }
    /// Forgets the request's resources without releasing them: only for tearing down a whole scheduler,
    /// whose backends go away with it.
    pub(crate) fn abandon(self) {
        let (_, _, state) = self.into_parts();
        core::mem::forget(state);
    }

    fn into_parts(self) -> (KvRef, Option<TaskRef>, S) {
        self.bomb.defuse();
        (self.kv, self.task, self.state)
    }
    fn build<T: Residency>(kv: KvRef, task: Option<TaskRef>, state: T, armed: bool) -> Request<T> {
        Request {
            kv,
            task,
            state,
            bomb: if armed {
                Bomb::armed()
            } else {
                Bomb::defused()
            },
        }
    }
}

/// Why a transition was refused; the request comes back unchanged.
#[derive(Debug)]
pub struct Refused<S: Residency> {
    /// The request, in its old state.
    pub request: Request<S>,
    /// Why.
    pub error: PeftError,
}

/// How the KV of a resumed request came back (so a refused lease can be rolled back exactly).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvReturn {
    /// Through `try_allocate_generation`: revert the growth, then suspend again.
    Generation,
    /// Through `prepare_context` + `resize_context`: suspend again.
    Context,
}

impl Request<Waiting> {
    /// A request that owns nothing yet.
    pub fn new(kv: KvRef, task: Option<TaskRef>) -> Self {
        Self::build(kv, task, Waiting, false)
    }

    /// (1) Admission: the pass has given the first chunk its KV pages; the desk mints the lease.
    pub fn admit<K: KvBackend, P: PeftBackend, const T: usize>(
        self,
        kv: &K,
        desk: &mut AdapterDesk<P, T>,
    ) -> Result<Request<Active>, Refused<Waiting>> {
        debug_assert!(
            kv.is_active(self.kv),
            "admit needs the first chunk's KV pages"
        );
        let lease = match self.task {
            None => None,
            Some(t) => match desk.acquire(self.id(), t, None) {
                Ok(l) => Some(l),
                Err((_, error)) => {
                    return Err(Refused {
                        request: self,
                        error,
                    })
                }
            },
        };
        let (kv, task, _) = self.into_parts();
        Ok(Self::build(kv, task, Active { lease }, true))
    }

    /// (8) Finish: drops any cache left by a rolled-back admission.
    pub fn finish<K: KvBackend>(self, kv: &mut K) {
        if kv.has_cache(self.kv) {
            kv.free(self.kv);
        }
        self.into_parts();
    }

    /// Recompute pause of a started request that owns no cache and no lease: nothing to free, but the
    /// request is marked for replay.
    pub fn recompute<K: KvBackend>(self, kv: &mut K) -> Request<Suspended<Recompute>> {
        kv.free(self.kv);
        let (kv, task, _) = self.into_parts();
        Self::build(kv, task, Suspended::new(None), true)
    }
}

impl Request<Active> {
    /// The lease, if the request has an adapter.
    pub fn lease(&self) -> Option<&AdapterLease> {
        self.state.lease.as_ref()
    }

    /// (2) Ordinary suspension (victim or self-eviction): KV suspended, lease returned with pause = true.
    #[inline]
    pub fn suspend<K: KvBackend, P: PeftBackend, const T: usize>(
        self,
        kv: &mut K,
        desk: &mut AdapterDesk<P, T>,
    ) -> Request<Suspended<Paused>> {
        kv.suspend(self.kv);
        self.pause_lease(desk)
    }

    /// (4) Destructive recompute pause: KV freed, lease returned with pause = true.
    pub fn recompute<K: KvBackend, P: PeftBackend, const T: usize>(
        self,
        kv: &mut K,
        desk: &mut AdapterDesk<P, T>,
    ) -> Request<Suspended<Recompute>> {
        kv.free(self.kv);
        self.pause_lease(desk)
    }

    /// (7) Context-side preemption: pages given up, lease returned with pause = true.
    pub fn preempt<K: KvBackend, P: PeftBackend, const T: usize>(
        self,
        kv: &mut K,
        desk: &mut AdapterDesk<P, T>,
    ) -> Request<Suspended<Recompute>> {
        kv.preempt(self.kv);
        self.pause_lease(desk)
    }

    /// Returns the lease with pause = true: the request becomes suspended (`M`), paused on its adapter.
    fn pause_lease<M, P: PeftBackend, const T: usize>(
        self,
        desk: &mut AdapterDesk<P, T>,
    ) -> Request<Suspended<M>> {
        let id = self.id();
        let (kv, task, state) = self.into_parts();
        let paused_on = state.lease.and_then(|l| desk.release(id, l, true));
        Self::build(kv, task, Suspended::new(paused_on), true)
    }

    /// (8) Finish: KV freed, lease returned with pause = false.
    pub fn finish<K: KvBackend, P: PeftBackend, const T: usize>(
        self,
        kv: &mut K,
        desk: &mut AdapterDesk<P, T>,
    ) {
        kv.free(self.kv);
        let id = self.id();
        let (_, _, state) = self.into_parts();
        if let Some(l) = state.lease {
            let none = desk.release(id, l, false);
            debug_assert!(none.is_none());
        }
    }
}

impl<M> Request<Suspended<M>> {
    /// The paused registration, if the request has an adapter.
    pub fn paused_on(&self) -> Option<&PausedOn> {
        self.state.paused_on.as_ref()
    }
}

impl Request<Suspended<Paused>> {
    /// Adoption of a cache the KV backend already holds suspended, for a request without an adapter.
    pub(crate) fn adopt_suspended(w: Request<Waiting>) -> Self {
        Self::adopt_suspended_with(w, None)
    }

    /// Adoption of a suspended cache with the request's paused registration.
    pub(crate) fn adopt_suspended_with(w: Request<Waiting>, paused_on: Option<PausedOn>) -> Self {
        let (kv, task, _) = w.into_parts();
        Self::build(kv, task, Suspended::new(paused_on), true)
    }

    /// (3) Resume: the pass brought the KV back (`how`); the desk mints a fresh lease, consuming the
    /// paused registration. Needs both the KV backend and the adapter desk. If the lease is refused, the
    /// KV is put back exactly as it was and the request is handed back.
    pub fn resume<K: KvBackend, P: PeftBackend, const T: usize>(
        self,
        kv: &mut K,
        desk: &mut AdapterDesk<P, T>,
        how: KvReturn,
    ) -> Result<Request<Resumed>, Refused<Suspended<Paused>>> {
        debug_assert!(kv.is_active(self.kv), "resume needs the KV back on the GPU");
        let id = self.id();
        let (r, task, state) = self.into_parts();
        let lease = match (task, state.paused_on) {
            (Some(t), paused) => match desk.acquire(id, t, paused) {
                Ok(l) => Some(l),
                Err((paused_on, error)) => {
                    if how == KvReturn::Generation {
                        kv.revert_allocate_generation(r);
                    }
                    kv.suspend(r);
                    let request = Self::build(r, task, Suspended::new(paused_on), true);
                    return Err(Refused { request, error });
                }
            },
            (None, paused) => {
                debug_assert!(paused.is_none());
                if let Some(p) = paused {
                    desk.drop_paused(id, p);
                }
                None
            }
        };
        Ok(Self::build(r, task, Resumed { lease }, true))
    }

    /// (4) Recompute pause of a suspended request: its KV (held or in the lower tier) is freed; it stays
    /// paused on its adapter for the replay.
    pub fn recompute<K: KvBackend>(self, kv: &mut K) -> Request<Suspended<Recompute>> {
        kv.free(self.kv);
        let (kv, task, state) = self.into_parts();
        Self::build(kv, task, Suspended::new(state.paused_on), true)
    }

    /// (7) Context-side preemption of a suspended request whose pages are HELD on the GPU (no lower
    /// tier): the pages are given up; it stays paused on its adapter for the replay.
    pub fn preempt<K: KvBackend>(self, kv: &mut K) -> Request<Suspended<Recompute>> {
        kv.preempt(self.kv);
        let (kv, task, state) = self.into_parts();
        Self::build(kv, task, Suspended::new(state.paused_on), true)
    }

    /// (8) Finish while suspended: KV freed, paused registration dropped.
    pub fn finish<K: KvBackend, P: PeftBackend, const T: usize>(
        self,
        kv: &mut K,
        desk: &mut AdapterDesk<P, T>,
    ) {
        kv.free(self.kv);
        let id = self.id();
        let (_, _, state) = self.into_parts();
        if let Some(p) = state.paused_on {
            desk.drop_paused(id, p);
        }
    }
}

impl Request<Suspended<Recompute>> {
    /// (6) Replay: the replay's first chunk got its KV pages; a new lease is acquired, consuming the
    /// paused registration.
    pub fn replay<K: KvBackend, P: PeftBackend, const T: usize>(
        self,
        kv: &K,
        desk: &mut AdapterDesk<P, T>,
    ) -> Result<Request<Active>, Refused<Suspended<Recompute>>> {
        debug_assert!(
            kv.is_active(self.kv),
            "replay needs the first chunk's KV pages"
        );
        let id = self.id();
        let (r, task, state) = self.into_parts();
        let lease = match (task, state.paused_on) {
            (Some(t), paused) => match desk.acquire(id, t, paused) {
                Ok(l) => Some(l),
                Err((paused_on, error)) => {
                    let request = Self::build(r, task, Suspended::new(paused_on), true);
                    return Err(Refused { request, error });
                }
            },
            (None, _) => None,
        };
        Ok(Self::build(r, task, Active { lease }, true))
    }

    /// (8) Finish before the replay: drops any cache and the paused registration.
    pub fn finish<K: KvBackend, P: PeftBackend, const T: usize>(
        self,
        kv: &mut K,
        desk: &mut AdapterDesk<P, T>,
    ) {
        if kv.has_cache(self.kv) {
            kv.free(self.kv);
        }
        let id = self.id();
        let (_, _, state) = self.into_parts();
        if let Some(p) = state.paused_on {
            desk.drop_paused(id, p);
        }
    }
}

impl Request<Resumed> {
    /// The fresh lease.
    pub fn lease(&self) -> Option<&AdapterLease> {
        self.state.lease.as_ref()
    }

    /// (5) A resumed request becomes an ordinary active one.
    pub fn settle(self) -> Request<Active> {
        let (kv, task, state) = self.into_parts();
        Self::build(kv, task, Active { lease: state.lease }, true)
    }
}
