//! The engine's scheduler: over one page pool (an attention model), or over a hybrid recurrent
//! model's backend (`kv_groups::Hybrid`: the same pool as its one full-attention group, beside a
//! recurrent-state group; docs/HYBRID.md). The two schedulers are different types; [`Sched`] holds
//! either and forwards the engine's calls, so that `engine.rs` is written once.

use kvsched_core::adapter_pool::AdapterPool;
use kvsched_core::config::Config;
use kvsched_core::delta::BatchDelta;
use kvsched_core::error::{Error, PeftError};
use kvsched_core::ids::{RequestId, TaskId};
use kvsched_core::kv::PageMove;
use kvsched_core::kv_events::KvEvent;
use kvsched_core::kv_groups::{Attention, Group, Hybrid, KvGroups};
use kvsched_core::output::SchedulerOutput;
use kvsched_core::page_pool::KvPool;
use kvsched_core::request::RequestSpec;
use kvsched_core::scheduler::{Entry, Handle, Scheduler, TransferEnd};
use kvsched_core::state_pool::{Capture, Placement, StateConfig, StateMove};
use kvsched_core::storage::{Boxed, Owned};

/// Requests one engine holds at most.
pub(crate) const MAX_REQUESTS: usize = crate::KVSCHED_MAX_REQUESTS as usize;
/// Adapters one engine registers at most.
pub(crate) const MAX_ADAPTERS: usize = crate::KVSCHED_MAX_ADAPTERS as usize;

/// The engine's page pool (owning its buffers).
pub(crate) type Pool = KvPool<'static, Owned>;
type Peft = AdapterPool<MAX_ADAPTERS>;
/// A hybrid model's backend: the pool as one full-attention group, beside a state pool of a row
/// per request, its arrays on the heap.
pub(crate) type HybridKv = Hybrid<Pool, 1, MAX_REQUESTS, Boxed>;
/// Over the pool: its arrays on the heap, each its own allocation (`Boxed`), so building it never
/// puts them on the caller's stack; the value is about 5 KB (most of it the adapter cache).
type PlainSched = Scheduler<Pool, Peft, MAX_REQUESTS, MAX_ADAPTERS, Boxed>;
/// Over a hybrid backend.
type HybridSched = Scheduler<HybridKv, Peft, MAX_REQUESTS, MAX_ADAPTERS, Boxed>;
/// A pass's output.
pub(crate) type Output = SchedulerOutput<MAX_REQUESTS, Boxed>;

/// The scheduler, over a pool or over a hybrid backend. The plain one stays inline, as it was in the
/// engine before the hybrid one came (the engine itself is on the heap); the hybrid one is boxed.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Sched {
    /// An attention-only model: every layer's KV in one pool.
    Plain(PlainSched),
    /// A hybrid recurrent model: the pool beside a state group.
    Hybrid(Box<HybridSched>),
}

/// The hybrid scheduler, on the heap: its backend's state pool and per-request arrays are each a
/// heap allocation of their own (`Boxed`), so the value that passes through the stack is small.
fn hybrid(
    cfg: Config,
    pool: Pool,
    adapters: Peft,
    state: StateConfig,
) -> Result<Box<HybridSched>, Error> {
    let groups = KvGroups::new([Group {
        attention: Attention::Full,
        pool,
    }])?;
    let kv = Hybrid::new(groups, state)?;
    Ok(Box::new(Scheduler::boxed(cfg, kv, adapters)?))
}

/// `$body` with `$s` bound to whichever scheduler `$sched` holds.
macro_rules! on {
    ($sched:expr, $s:ident => $body:expr) => {
        match $sched {
            Sched::Plain($s) => $body,
            Sched::Hybrid($s) => $body,
        }
    };
}

impl Sched {
    /// A scheduler over `pool`, with a state group when `state` is given (`Invalid`, nothing
    /// built, for a state configuration the core refuses).
    pub(crate) fn new(
        cfg: Config,
        pool: Pool,
        adapters: Peft,
        state: Option<StateConfig>,
    ) -> Result<Self, Error> {
        match state {
            None => Ok(Self::Plain(Scheduler::boxed(cfg, pool, adapters)?)),
            Some(state) => Ok(Self::Hybrid(hybrid(cfg, pool, adapters, state)?)),
        }
    }

    /// The engine's page pool (a hybrid backend's full-attention group).
    pub(crate) fn pool(&self) -> &Pool {
        match self {
            Self::Plain(s) => s.kv(),
            Self::Hybrid(s) => &s.kv().attention().groups()[0].pool,
        }
    }

    /// The hybrid backend, if the engine has a state group.
    pub(crate) fn hybrid(&self) -> Option<&HybridKv> {
        match self {
            Self::Plain(_) => None,
            Self::Hybrid(s) => Some(s.kv()),
        }
    }

    /// The live GPU state slot of the request in table slot `row` (`u32::MAX`: none, or no state
    /// group).
    pub(crate) fn state_slot(&self, row: u16) -> u32 {
        match self.hybrid().map(|h| h.state().placement(row)) {
            Some(Placement::Gpu(g)) => g,
            _ => u32::MAX,
        }
    }

    /// The state moves logged since the last call (none without a state group).
    pub(crate) fn take_state_moves(&mut self) -> &[StateMove] {
        match self {
            Self::Plain(_) => &[],
            Self::Hybrid(s) => s.take_state_moves(),
        }
    }

    /// The snapshots to write during the step (none without a state group).
    pub(crate) fn take_captures(&mut self) -> &[Capture] {
        match self {
            Self::Plain(_) => &[],
            Self::Hybrid(s) => s.take_captures(),
        }
    }

    /// A fingerprint of the scheduler's own state and its backends' (the pool's, the state
    /// pool's), the adapter cache's included.
    pub(crate) fn fingerprint(&self, h: &mut impl std::hash::Hasher) {
        use std::hash::Hash;
        on!(self, s => {
            s.fingerprint().hash(h);
            // The adapter cache has no hash of its own: its Debug form names every field.
            format!("{:?}", s.adapters()).hash(h);
            s.adapters().hash_state(h);
        });
        self.pool().fingerprint().hash(h);
        if let Some(k) = self.hybrid() {
            k.state().fingerprint().hash(h);
        }
    }

    pub(crate) fn register_adapter(&mut self, id: TaskId, pages: u32) -> Result<(), PeftError> {
        on!(self, s => s.register_adapter(id, pages).map(|_| ()))
    }

    pub(crate) fn find(&self, id: RequestId) -> Option<Handle> {
        on!(self, s => s.find(id))
    }

    pub(crate) fn get(&self, h: Handle) -> Result<Entry<'_>, Error> {
        on!(self, s => s.get(h))
    }

    pub(crate) fn submit_with_prefix(
        &mut self,
        spec: RequestSpec,
        salt: u64,
        hashes: &[u64],
    ) -> Result<Handle, Error> {
        on!(self, s => s.submit_with_prefix(spec, salt, hashes))
    }

    pub(crate) fn fork(&mut self, parent: Handle, spec: RequestSpec) -> Result<Handle, Error> {
        on!(self, s => s.fork(parent, spec))
    }

    pub(crate) fn remove(&mut self, h: Handle) -> Result<RequestSpec, Error> {
        on!(self, s => s.remove(h))
    }

    pub(crate) fn set_inflight(&mut self, h: Handle, inflight: bool) -> Result<(), Error> {
        on!(self, s => s.set_inflight(h, inflight))
    }

    pub(crate) fn replayed_passes(&self) -> u64 {
        on!(self, s => s.replayed_passes())
    }

    pub(crate) fn schedule(&mut self, out: &mut Output) -> Result<(), Error> {
        on!(self, s => s.schedule(out))
    }

    pub(crate) fn ensure_batch(&mut self, out: &mut Output) -> Result<(), PeftError> {
        on!(self, s => s.ensure_batch(out))
    }

    pub(crate) fn take_delta(
        &mut self,
        out: &Output,
        delta: &mut BatchDelta<MAX_REQUESTS, Boxed>,
    ) -> Result<(), Error> {
        on!(self, s => s.take_delta(out, delta))
    }

    pub(crate) fn take_moves(&mut self) -> &[PageMove] {
        on!(self, s => s.take_moves())
    }

    pub(crate) fn take_kv_events(&mut self) -> &[KvEvent] {
        on!(self, s => s.take_kv_events())
    }

    pub(crate) fn complete_step(&mut self, out: &Output) -> Result<(), Error> {
        on!(self, s => s.complete_step(out))
    }

    pub(crate) fn end_send(&mut self, h: Handle, how: TransferEnd) -> Result<(), Error> {
        on!(self, s => s.end_send(h, how).map(|_| ()))
    }

    pub(crate) fn start_receive(&mut self, h: Handle) -> Result<(), Error> {
        on!(self, s => s.start_receive(h))
    }

    pub(crate) fn end_receive(&mut self, h: Handle, how: TransferEnd) -> Result<(), Error> {
        on!(self, s => s.end_receive(h, how))
    }

    pub(crate) fn len(&self) -> usize {
        on!(self, s => s.len())
    }
}
