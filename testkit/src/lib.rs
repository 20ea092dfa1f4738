//! # kvsched-testkit
//!
//! The operation harness shared by the core's model-based property tests (`core/tests/model.rs`) and the
//! fuzz target (`fuzz/fuzz_targets/ops.rs`). It needs only `kvsched-core` (features `std` and `alloc`).
//!
//! A [`Harness`] drives a real [`Scheduler`] over the built-in [`KvPool`] (or [`KvGroups`] led by it:
//! [`Setup::windows`]) and [`AdapterPool`], each wrapped in a fault-injecting backend ([`FaultKv`],
//! [`FaultPeft`]) that refuses calls by a countdown schedule,
//! and keeps a naive model next to it: the live requests in arrival order with their expected phase,
//! position and output progress, and the ids that finished or were cancelled. Every [`Op`] is applied to
//! both, and [`Harness::check`] then compares them and checks the invariants of DESIGN.md §7:
//!
//! - page conservation per KV tier ([`KvPool::check`]) and in the adapter cache ([`AdapterPool::check`]);
//! - per task: leases held by the desk = the adapter cache's device refcount = active LoRA requests
//!   (= the KV pool's pins on the adapter, with unified paging);
//!   paused registrations = suspended and recompute-paused LoRA requests (so none of them holds a lease);
//! - residency agrees with the KV pool (waiting and recompute-paused: no cache; active: active cache;
//!   suspended: a suspended cache);
//! - no request lost or duplicated: the scheduler's live requests are exactly the model's, in order;
//! - after every pass: ensure-batch succeeds, the token budget holds (except last-chunk drafts), the
//!   request budget holds, the batch's distinct adapters plus the pinned ones fit the device cache, no
//!   request is in two output lists, every listed request is in the state its list says;
//! - deadlock detection fires only after `deadlock_threshold` stalled passes with work pending, never on an
//!   idle pass;
//! - a refused submission changes nothing (scheduler, KV pool and adapter cache fingerprints);
//! - with KV groups: every group's pool passes the audit, every group's cache state and capacity for a
//!   request equal the leader's, no window group gave up a block the first query that may still run
//!   reads, and right after a pass each scheduled request's window groups hold nothing wholly before
//!   its step's window and at most `window / tpb + 1` pages plus what the step adds.
//!
//! Failures are returned as a [`Violation`] describing the broken invariant (the callers panic with it).
#![deny(missing_docs)]

mod fork;
pub mod hybrid;
pub mod progress;

use std::cell::Cell;
use std::collections::{BTreeMap, BTreeSet};

use kvsched_core::adapter::{AdapterHold, HostChange, PeftBackend, TaskRef};
use kvsched_core::adapter_pool::AdapterPool;
pub use kvsched_core::config::Admission;
use kvsched_core::config::{
    CapacityPolicy, ChunkPolicy, Chunking, Config, Share, Window, SERVICE_CLASSES,
};
use kvsched_core::connector::{KvConnector, LoadEnd};
use kvsched_core::error::{Error, PeftError};
use kvsched_core::ids::{RequestId, TaskId, TaskSlot};
use kvsched_core::kv::{
    Absent, AdapterPaging, AdaptersCap, CacheState, ContextPrep, KvBackend, KvCaps, KvLimits,
    KvRef, LoadChange, PageMove, PairedPool, Pool, PrefixCap, PrefixReuse, Reach, Reservation,
    Tier, Transfers, TransfersCap,
};
use kvsched_core::kv_events::KvEventKind;
pub use kvsched_core::kv_groups::Attention;
use kvsched_core::kv_groups::{Group, KvGroups};
use kvsched_core::kv_set::{DraftMode, KvSet};
use kvsched_core::output::{Listed, SchedulerOutput};
use kvsched_core::page_pool::{ConnectorSlot, KvPool, KvPoolConfig, SeqState, HOST};
use kvsched_core::phase::Phase;
use kvsched_core::request::{Ownership, RequestSpec};
use kvsched_core::scheduler::{Handle, Scheduler, TransferEnd};
use kvsched_core::step_budget::{StepBudget, StepCost};
use kvsched_core::storage::Owned;

/// A broken invariant or an unexpected refusal: what the harness saw, in words.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Violation(pub String);

impl From<String> for Violation {
    fn from(what: String) -> Self {
        Self(what)
    }
}

impl From<&str> for Violation {
    fn from(what: &str) -> Self {
        Self(what.to_owned())
    }
}

/// Request table slots.
pub const N: usize = 16;
/// Adapter task slots.
pub const T: usize = 8;
/// Task id of adapter index `i` (so task ids and slots differ).
pub const fn task_id(i: u8) -> u64 {
    100 + i as u64
}

/// Chunked prefill setting of a [`Setup`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Chunk {
    /// Whole prompts.
    Off,
    /// First come, first served.
    Fcfs,
    /// Chunks end at snapshot points.
    Force,
    /// Equal progress.
    Equal,
}

/// One configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Setup {
    /// KV pages per tier: GPU.
    pub gpu_pages: u32,
    /// Host tier pages (0 = no host tier).
    pub host_pages: u32,
    /// Tokens per KV page.
    pub tokens_per_block: u32,
    /// Longest page table.
    pub max_blocks: u32,
    /// Chunking policy.
    pub chunk: Chunk,
    /// Chunk unit.
    pub unit: u32,
    /// GUARANTEED_NO_EVICT instead of MAX_UTILIZATION.
    pub no_evict: bool,
    /// Recompute pause and context-side preemption allowed.
    pub recompute_pause: bool,
    /// Token budget.
    pub max_num_tokens: Option<u32>,
    /// Request budget.
    pub max_num_requests: u32,
    /// Adapter cache (None = no PEFT: LoRA requests run without adapter work).
    pub peft: Option<PeftSetup>,
    /// Stalled passes before `Error::Deadlock`.
    pub deadlock_threshold: u32,
    /// The KV pool has a prefix cache (requests with a prompt family share blocks).
    pub prefix: bool,
    /// A draft pool (same geometry as the target) and how it pairs.
    pub draft: Option<DraftMode>,
    /// A cross pool (same geometry): submissions may carry an encoder output.
    pub cross: bool,
    /// The admission order (requests carry tenants, classes and arrivals for it).
    pub admission: Admission,
    /// A KV connector on the target pool (with the prefix cache only): a remote store holding the
    /// prompt families' blocks.
    pub connector: bool,
    /// KV groups: sliding-window groups beside the target pool, which then leads a
    /// [`KvGroups`] as its full-attention group (empty: a plain pool; one: 2 groups; two: 3 groups).
    /// Only where [`Setup::groups_allowed`].
    pub windows: Vec<WindowGroup>,
    /// A step budget in time: the inter-token-latency target in µs over [`STEP_COST`] (only with
    /// chunking).
    pub step_itl_us: Option<u64>,
    /// The thrash guard ([`Config::thrash_guard`]).
    pub thrash_guard: bool,
    /// Service classes' shares ([`Config::shares`]); requests carry classes whether or not.
    pub shares: Option<[Share; SERVICE_CLASSES]>,
    /// A recurrent-state group beside the attention groups (a hybrid recurrent model: the target
    /// leads a [`kvsched_core::kv_groups::Hybrid`]). Only where [`Setup::groups_allowed`].
    pub state: Option<hybrid::StateSetup>,
}

/// A sliding-window KV group of a [`Setup`] (its pool has the target's geometry but its GPU pages).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowGroup {
    /// The window, in pages (`pages * tokens_per_block` positions; at most `max_blocks`).
    pub pages: u32,
    /// The group's GPU pages (its host tier is the target's).
    pub gpu_pages: u32,
}

/// The KV memory of a [`Setup`]: how to build the target pool, and the draft and cross pools when
/// present (each owns its buffers); and the KV connector's store with its slots, which the target
/// borrows.
pub struct Memory {
    target: PoolSpec,
    windows: Vec<(Attention, PoolSpec)>,
    state: Option<kvsched_core::state_pool::StateConfig>,
    draft: Option<PoolSpec>,
    cross: Option<PoolSpec>,
    store: Option<(Store, Vec<ConnectorSlot>, Vec<u32>)>,
}

/// One pool of a [`Memory`]: its geometry, a prefix cache or not, unified paging for `T` adapter
/// slots or not.
#[derive(Debug, Clone, Copy)]
struct PoolSpec {
    cfg: KvPoolConfig,
    prefix: bool,
    unified: bool,
}

impl PoolSpec {
    fn build<'a>(self) -> Result<KvPool<'a, Owned>, Error> {
        let pool = if self.prefix {
            // A KV event log that holds any one operation's events (each page at most a move and
            // a drop; the harness drains it after every operation).
            let events = 4 * self.cfg.page_info_len() + 8;
            KvPool::owned_with_prefix_cache(self.cfg)?.with_kv_events(events)?
        } else {
            KvPool::owned(self.cfg)?
        };
        if self.unified {
            pool.with_unified_adapters(T)
        } else {
            Ok(pool)
        }
    }
}

/// The blocks a pool's prefix cache holds, by key, with their tier.
pub fn cached_blocks(pool: &KvPool<'_, Owned>) -> BTreeMap<u64, Tier> {
    let c = pool.config();
    let gpu = (0..c.gpu_pages).map(|p| (p, Tier::Gpu));
    let host = (0..c.host_pages).map(|h| (h | HOST, Tier::Host));
    gpu.chain(host)
        .filter_map(|(e, tier)| {
            let info = pool.page_info(e)?;
            info.cached().then(|| (info.key(), tier))
        })
        .collect()
}

/// Passes a connector load may stay unconfirmed in the model runs.
pub const LOAD_TIMEOUT: u32 = 4;

/// The remote store of the model runs: it holds every prompt family's blocks (the hashes below
/// 1,000,000), and ends every load at the next poll — unless a fault makes it fail
/// ([`Fault::LoadFail`]) or never end ([`Fault::LoadHang`]: the pool's timeout abandons it). It
/// accepts every save and ends it at the next poll, unless [`Fault::SaveHang`] keeps it reading (its
/// pages pinned) until the pool's timeout.
#[derive(Debug, Default)]
pub struct Store {
    /// Refusals by schedule, shared with the harness.
    pub faults: std::rc::Rc<Faults>,
    ends: Vec<(KvRef, LoadEnd)>,
    save_ends: Vec<KvRef>,
    /// Loads started.
    pub loads: u64,
    /// Loads failed by a fault.
    pub failed: u64,
    /// Loads left hanging by a fault.
    pub hung: u64,
    /// Saves accepted.
    pub saves: u64,
    /// The blocks the accepted saves read.
    pub saved_blocks: u64,
}

impl KvConnector for Store {
    fn matched_blocks(&mut self, _r: KvRef, _first: u32, _chain: u64, hashes: &[u64]) -> u32 {
        hashes.iter().take_while(|&&h| h < 1_000_000).count() as u32
    }
    fn start_load(&mut self, r: KvRef, _pages: &[u32], _first_block: u32) {
        self.loads += 1;
        if self.faults.fire(Fault::LoadHang) {
            self.hung += 1;
        } else if self.faults.fire(Fault::LoadFail) {
            self.failed += 1;
            self.ends.push((r, LoadEnd::Failed));
        } else {
            self.ends.push((r, LoadEnd::Done));
        }
    }
    fn cancel_load(&mut self, r: KvRef) {
        self.ends.retain(|(x, _)| *x != r);
    }
    fn take_load_ends(&mut self, ended: &mut dyn FnMut(KvRef, LoadEnd)) {
        for (r, e) in self.ends.drain(..) {
            ended(r, e);
        }
    }
    fn start_save(&mut self, r: KvRef, pages: &[u32], _first_block: u32) -> bool {
        self.saves += 1;
        self.saved_blocks += pages.len() as u64;
        if !self.faults.fire(Fault::SaveHang) {
            self.save_ends.push(r);
        }
        true
    }
    fn take_save_ends(&mut self, ended: &mut dyn FnMut(KvRef)) {
        for r in self.save_ends.drain(..) {
            ended(r);
        }
    }
    fn cancel_save(&mut self, r: KvRef) {
        self.save_ends.retain(|x| *x != r);
    }
}

/// The adapter cache of a [`Setup`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeftSetup {
    /// Device pages.
    pub device_pages: u32,
    /// Host pages.
    pub host_pages: u32,
    /// Pages of each registered task (task `i` has id `task_id(i)`); at most `T`.
    pub task_pages: Vec<u32>,
    /// Unified paging: the adapters' device copies live in the target KV pool (`device_pages` is
    /// unused).
    pub unified: bool,
}

/// The harness's step cost model: 1 µs a step, a prefill token and 2,000 attention pairs, 0.5 µs a
/// decode, 0.01 µs a cached token (targets of a few µs cap chunks at a few tokens).
pub const STEP_COST: StepCost = StepCost {
    step_ps: 1_000_000,
    prefill_token_ps: 1_000_000,
    decode_request_ps: 500_000,
    cached_token_ps: 10_000,
    pair_ps: 500,
};

impl Setup {
    /// The scheduler configuration.
    pub fn config(&self) -> Config {
        let chunking = match self.chunk {
            Chunk::Off => None,
            Chunk::Fcfs => Some(ChunkPolicy::FirstComeFirstServed),
            Chunk::Force => Some(ChunkPolicy::ForceChunk),
            Chunk::Equal => Some(ChunkPolicy::EqualProgress),
        }
        .map(|policy| Chunking {
            policy,
            unit: self.unit,
        });
        Config {
            max_num_requests: self.max_num_requests,
            max_num_tokens: self.max_num_tokens,
            max_context_length: None,
            chunking,
            policy: if self.no_evict {
                CapacityPolicy::GuaranteedNoEvict
            } else {
                CapacityPolicy::MaxUtilization
            },
            recompute_pause: self.recompute_pause,
            prefix_aware: true,
            window: Window::Decoder,
            deadlock_threshold: self.deadlock_threshold,
            blocked_fast_path: true,
            admission: self.admission,
            drain_after: 2,
            step_budget: self
                .step_itl_us
                .filter(|_| chunking.is_some())
                .map(|itl_us| StepBudget {
                    itl_us,
                    cost: STEP_COST,
                }),
            thrash_guard: self.thrash_guard,
            shares: self.shares,
        }
    }

    /// The KV pool geometry.
    pub fn pool(&self) -> KvPoolConfig {
        KvPoolConfig {
            tokens_per_block: self.tokens_per_block,
            gpu_pages: self.gpu_pages,
            host_pages: self.host_pages,
            slots: N as u32,
            max_blocks: self.max_blocks,
        }
    }

    /// The KV pools' buffers.
    pub fn memory(&self) -> Memory {
        let one = PoolSpec {
            cfg: self.pool(),
            prefix: self.prefix,
            unified: false,
        };
        let unified = self.peft.as_ref().is_some_and(|p| p.unified);
        let windows = self.windows.iter().map(|w| {
            let cfg = KvPoolConfig {
                gpu_pages: w.gpu_pages,
                ..self.pool()
            };
            let window = w.pages * self.tokens_per_block;
            (Attention::Sliding { window }, PoolSpec { cfg, ..one })
        });
        Memory {
            target: PoolSpec { unified, ..one },
            windows: windows.collect(),
            state: self.state.map(|st| st.config(self.tokens_per_block)),
            draft: self.draft.map(|_| one),
            cross: self.cross.then_some(PoolSpec {
                prefix: false,
                ..one
            }),
            store: (self.connector && self.prefix).then(|| {
                let saves = vec![0; self.pool().table_len()];
                (Store::default(), vec![ConnectorSlot::default(); N], saves)
            }),
        }
    }

    /// Whether this configuration may have KV groups ([`Setup::windows`]): what [`KvGroups`] takes —
    /// no draft or cross pool, no connector, no unified paging (its capabilities are `Absent`), and a
    /// prefix cache only once it takes one ([`groups_take_prefix`]). GUARANTEED_NO_EVICT included:
    /// the groups reserve in pages, per group.
    pub fn groups_allowed(&self) -> bool {
        let unified = self.peft.as_ref().is_some_and(|p| p.unified);
        self.draft.is_none()
            && !self.cross
            && !self.connector
            && !unified
            && (!self.prefix || groups_take_prefix())
    }

    /// This configuration on KV groups: the target leads, a sliding-window group per entry of
    /// `windows` follows (each window capped at `max_blocks` pages). What groups do not take is dropped
    /// ([`Setup::groups_allowed`]): the draft and cross pools, the connector, unified paging (the
    /// tasks then capped by the adapter cache's device pages), and the prefix cache until groups take
    /// one.
    pub fn with_groups(mut self, windows: Vec<WindowGroup>) -> Self {
        self.draft = None;
        self.cross = false;
        self.connector = false;
        self.prefix &= groups_take_prefix();
        if let Some(p) = self.peft.as_mut().filter(|p| p.unified) {
            p.unified = false;
            let cap = p.device_pages.min(p.host_pages);
            for t in &mut p.task_pages {
                *t = (*t).min(cap);
            }
        }
        let max_blocks = self.max_blocks;
        self.windows = windows
            .into_iter()
            .map(|w| WindowGroup {
                pages: w.pages.clamp(1, max_blocks),
                ..w
            })
            .collect();
        self
    }

    /// The GPU pages of KV group `g` (0: the target's).
    pub fn group_gpu_pages(&self, g: usize) -> u32 {
        match g.checked_sub(1) {
            Some(w) => self.windows[w].gpu_pages,
            None => self.gpu_pages,
        }
    }

    /// Most KV tokens one request may hold.
    pub fn max_tokens(&self) -> u64 {
        u64::from(self.max_blocks.min(self.gpu_pages)) * u64::from(self.tokens_per_block)
    }

    /// Most KV tokens one LoRA request may hold beside its adapter of `pages` pages (unified paging).
    pub fn max_tokens_beside(&self, pages: u32) -> u64 {
        let room = self.gpu_pages.saturating_sub(pages);
        u64::from(self.max_blocks.min(room)) * u64::from(self.tokens_per_block)
    }

    /// Registered tasks.
    pub fn tasks(&self) -> usize {
        self.peft.as_ref().map_or(0, |p| p.task_pages.len())
    }
}

/// Whether [`KvGroups::new`] takes pools with a prefix cache (asked once, of two small pools). Until
/// it does, [`Setup::groups_allowed`] leaves prefix configurations without KV groups; from then on
/// they get them, with nothing here to change.
pub fn groups_take_prefix() -> bool {
    static TAKES: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *TAKES.get_or_init(|| {
        let cfg = KvPoolConfig {
            tokens_per_block: 2,
            gpu_pages: 4,
            host_pages: 0,
            slots: 2,
            max_blocks: 4,
        };
        let pool = || KvPool::owned_with_prefix_cache(cfg);
        let (Ok(full), Ok(window)) = (pool(), pool()) else {
            return false;
        };
        KvGroups::new([
            Group {
                attention: Attention::Full,
                pool: full,
            },
            Group {
                attention: Attention::Sliding { window: 2 },
                pool: window,
            },
        ])
        .is_ok()
    })
}

/// Which backend call a fault refuses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// `prepare_context` (no slot, or the resume of a suspended cache refused).
    KvPrepare,
    /// `resize_context` (allocation refused).
    KvResize,
    /// `try_allocate_generation` (allocation, or the resume through it, refused).
    KvAllocate,
    /// `add_request` of the adapter cache (host cache full: admission, resume or replay refused).
    PeftAdd,
    /// `pin_adapter` of a unified pool (no room for the adapter: the lease is refused).
    KvPin,
    /// A connector load fails (the request must recompute).
    LoadFail,
    /// A connector load never ends (the pool's timeout abandons it).
    LoadHang,
    /// A connector save never ends (its pages stay pinned until the pool's timeout).
    SaveHang,
}

/// One operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// Submit a new request (or, with `duplicate`, one reusing a live id, which must be refused).
    Submit {
        /// Prompt tokens.
        prompt: u32,
        /// Output tokens it produces before it finishes (the last context chunk produces the first).
        out_len: u32,
        /// Adapter index (may name an unregistered task).
        lora: Option<u8>,
        /// Draft tokens per step.
        draft: u8,
        /// FORCE_CHUNK snapshot points every this many tokens (0 = none).
        snap_every: u8,
        /// Reuse a live id.
        duplicate: bool,
        /// The prompt family whose leading blocks it shares (1-3: 2, 4 or 6 blocks), or none (no block
        /// hashes).
        family: Option<u8>,
        /// A decoder request's encoder output, in tokens (0: none; ignored without a cross pool).
        encoder: u8,
    },
    /// Run a scheduling pass (completing the previous one first, as an engine executes every batch).
    Pass,
    /// Complete the last pass's step: contexts advance, generations produce a token, recompute-paused
    /// requests reset for replay, requests that produced their output finish.
    Complete,
    /// A generating request ends early (end of sequence).
    Finish {
        /// Which live request (modulo their number).
        pick: u8,
    },
    /// Cancel any live request.
    Cancel {
        /// Which live request.
        pick: u8,
    },
    /// Refuse the next `count` calls of `fault`.
    Inject {
        /// Which call.
        fault: Fault,
        /// How many.
        count: u8,
        /// Of which KV pool: 0 the target, 1 the draft, 2 the cross pool (absent pools: none).
        pool: u8,
    },
    /// Toggle a request's in-flight mark.
    Inflight {
        /// Which live request.
        pick: u8,
    },
    /// Toggle a request's pending connector load (it must then never be a victim).
    Load {
        /// Which live request.
        pick: u8,
    },
    /// Change a request's per-step beam width and draft tokens.
    Update {
        /// Which live request.
        pick: u8,
        /// New beam width (0 must be refused).
        beam: u8,
        /// New draft tokens.
        draft: u8,
    },
    /// Submit a request of disaggregated serving: context-only (it sends its KV when its prompt is
    /// computed) or a generation request whose prompt's KV a transfer delivers.
    Disagg {
        /// Prompt tokens.
        prompt: u32,
        /// Output tokens (a received request's first came from the context engine).
        out_len: u32,
        /// Adapter index (may name an unregistered task).
        lora: Option<u8>,
        /// The generation side (`DISAGG_GENERATION_INIT`), else context-only.
        generation: bool,
    },
    /// Fork a live request into a child sharing its full blocks (`Scheduler::fork`).
    Fork {
        /// Which live request.
        pick: u8,
        /// The child's output tokens (at most its parent's).
        out_len: u8,
    },
    /// End a transfer in flight (a send or a receive), delivered or failed; on a request with none,
    /// both ends must be refused and change nothing.
    EndTransfer {
        /// Which live request.
        pick: u8,
        /// Delivered, else failed.
        delivered: bool,
    },
}

/// Countdown fault schedule. The scheduler owns its backends and lends them out read-only, so the
/// schedule is set through a shared reference (cells), as a test double's remote control.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Faults {
    /// Refusals left per [`Fault`] kind, in declaration order.
    pub left: [Cell<u32>; 8],
    /// Refusals injected so far.
    pub injected: Cell<u64>,
}

impl Faults {
    fn fire(&self, f: Fault) -> bool {
        let n = &self.left[f as usize];
        if n.get() == 0 {
            return false;
        }
        n.set(n.get() - 1);
        self.injected.set(self.injected.get() + 1);
        true
    }

    /// Refuses the next `count` more calls of `f`.
    pub fn inject(&self, f: Fault, count: u32) {
        let n = &self.left[f as usize];
        n.set(n.get() + count);
    }

    /// Refuses nothing more.
    pub fn clear(&self) {
        for n in &self.left {
            n.set(0);
        }
    }
}

/// What a [`FaultKv`] wraps: the built-in pool, or one pool per KV group (a hybrid-attention model's
/// caches: the first group full attention, the others sliding windows).
#[derive(Debug)]
pub enum KvInner<'a> {
    /// One pool.
    Pool(Box<KvPool<'a, Owned>>),
    /// A full-attention group and a sliding-window group.
    Two(Box<KvGroups<'a, Owned, 2>>),
    /// A full-attention group and two sliding-window groups.
    Three(Box<KvGroups<'a, Owned, 3>>),
    /// A full-attention group beside a recurrent-state group.
    State(Box<hybrid::Hy<'a, 1>>),
    /// A full-attention group and a sliding-window group beside a recurrent-state group.
    WindowState(Box<hybrid::Hy<'a, 2>>),
}

/// `$body` with `$k` bound to the backend inside a [`KvInner`] (by reference, as `$inner` is).
macro_rules! each {
    ($inner:expr, $k:ident => $body:expr) => {
        match $inner {
            KvInner::Pool($k) => $body,
            KvInner::Two($k) => $body,
            KvInner::Three($k) => $body,
            KvInner::State($k) => $body,
            KvInner::WindowState($k) => $body,
        }
    };
}

/// Group 0's page moves, the other groups' drained first (the engine copies every group's before
/// the step; the harness follows no move).
fn leader_moves<'k, const G: usize>(k: &'k mut KvGroups<'_, Owned, G>) -> &'k [PageMove] {
    for g in 1..G {
        let _ = k.take_group_moves(g);
    }
    k.take_moves()
}

/// Groups as the harness reads them: each with its pool.
fn attention<'p, 'a, const G: usize>(
    groups: &'p [Group<'a, Owned>; G],
) -> Vec<(Attention, &'p KvPool<'a, Owned>)> {
    groups.iter().map(|g| (g.attention, &g.pool)).collect()
}

impl<'a> KvInner<'a> {
    /// The state group's counters (zeros without one).
    pub fn state_stats(&self) -> kvsched_core::state_pool::StateStats {
        match self {
            Self::State(k) => k.state().stats(),
            Self::WindowState(k) => k.state().stats(),
            _ => kvsched_core::state_pool::StateStats::default(),
        }
    }

    /// The state pool's checks and fingerprint (`Ok(None)`: no state group).
    pub fn state(&self) -> Result<Option<u64>, Violation> {
        match self {
            Self::State(k) => hybrid::check(k).map(|()| Some(k.state().fingerprint())),
            Self::WindowState(k) => hybrid::check(k).map(|()| Some(k.state().fingerprint())),
            _ => Ok(None),
        }
    }

    /// The target pool alone (`windows` empty), or it leading a group per window.
    fn build(
        target: PoolSpec,
        windows: &[(Attention, PoolSpec)],
        state: Option<kvsched_core::state_pool::StateConfig>,
    ) -> Result<Self, Error> {
        let group = |attention, spec: PoolSpec| -> Result<Group<'a, Owned>, Error> {
            Ok(Group {
                attention,
                pool: spec.build()?,
            })
        };
        let full = group(Attention::Full, target)?;
        if let Some(st) = state {
            return Ok(match windows {
                [] => Self::State(hybrid::build(KvGroups::new([full])?, st)?),
                [(a, w)] => {
                    let groups = KvGroups::new([full, group(*a, *w)?])?;
                    Self::WindowState(hybrid::build(groups, st)?)
                }
                _ => {
                    return Err(Error::Invalid(
                        "the harness builds one window beside a state",
                    ))
                }
            });
        }
        Ok(match windows {
            [] => Self::Pool(Box::new(full.pool)),
            [(a, w)] => Self::Two(Box::new(KvGroups::new([full, group(*a, *w)?])?)),
            [(a, w), (b, x)] => {
                let groups = [full, group(*a, *w)?, group(*b, *x)?];
                Self::Three(Box::new(KvGroups::new(groups)?))
            }
            _ => return Err(Error::Invalid("the harness builds at most 3 KV groups")),
        })
    }

    /// Every group with its pool, the leader first (a plain pool: itself, as full attention).
    pub fn groups(&self) -> Vec<(Attention, &KvPool<'a, Owned>)> {
        match self {
            Self::Pool(p) => vec![(Attention::Full, &**p)],
            Self::Two(k) => attention(k.groups()),
            Self::Three(k) => attention(k.groups()),
            Self::State(k) => attention(k.attention().groups()),
            Self::WindowState(k) => attention(k.attention().groups()),
        }
    }

    /// The pool of the request's full-attention KV: the plain pool, or group 0.
    pub fn leader(&self) -> &KvPool<'a, Owned> {
        match self {
            Self::Pool(p) => p,
            Self::Two(k) => &k.groups()[0].pool,
            Self::Three(k) => &k.groups()[0].pool,
            Self::State(k) => &k.attention().groups()[0].pool,
            Self::WindowState(k) => &k.attention().groups()[0].pool,
        }
    }

    /// The plain pool (`None` with groups, which only lend their pools out read-only).
    pub fn pool_mut(&mut self) -> Option<&mut KvPool<'a, Owned>> {
        match self {
            Self::Pool(p) => Some(p.as_mut()),
            _ => None,
        }
    }

    fn paired(&mut self) -> &mut KvPool<'a, Owned> {
        self.pool_mut()
            .expect("a plain pool's call: KV groups get no draft pool nor unified paging here")
    }
}

/// A KV backend behind a fault schedule: the built-in pool or KV groups ([`KvInner`]). Refusals honour
/// the backend contract: nothing changes, except that a refused first-chunk resize leaves the cache
/// inactive (as the pool and the groups do themselves).
#[derive(Debug)]
pub struct FaultKv<'a> {
    /// The pool or the groups.
    pub inner: KvInner<'a>,
    /// The schedule.
    pub faults: Faults,
}

impl FaultKv<'_> {
    /// Unified adapter paging is on (a pool's only: groups have no adapter capability).
    pub fn unified(&self) -> bool {
        each!(&self.inner, k => k.caps().adapters.is_some())
    }
}

/// The inner backend's capabilities are the wrapper's own, each forwarded while the inner one has it
/// (a pool's prefix cache and connector as they are; groups have none of them today, and get them
/// here as soon as they do), except that unified paging's pins go through the schedule.
impl KvBackend for FaultKv<'_> {
    type Draft = Absent;
    type Cross = Absent;
    type Transfers = Self;
    type Prefix = Self;
    type Adapters = Self;

    fn limits(&self) -> KvLimits {
        each!(&self.inner, k => k.limits())
    }
    fn cache(&self, r: KvRef) -> CacheState {
        each!(&self.inner, k => k.cache(r))
    }
    fn prepare_context(&mut self, r: KvRef, prep: ContextPrep) -> Option<u32> {
        if self.faults.fire(Fault::KvPrepare) {
            return None;
        }
        each!(&mut self.inner, k => k.prepare_context(r, prep))
    }
    fn prepare_disagg_gen_init(&mut self, r: KvRef, capacity: u32) -> bool {
        each!(&mut self.inner, k => k.prepare_disagg_gen_init(r, capacity))
    }
    fn resize_context(&mut self, r: KvRef, capacity: u32, first_chunk: bool) -> bool {
        if self.faults.fire(Fault::KvResize) {
            if first_chunk {
                each!(&mut self.inner, k => k.suspend(r));
            }
            return false;
        }
        each!(&mut self.inner, k => k.resize_context(r, capacity, first_chunk))
    }
    fn resize_reserving(
        &mut self,
        r: KvRef,
        capacity: u32,
        reservation: Reservation,
        first_chunk: bool,
    ) -> Option<u32> {
        if self.faults.fire(Fault::KvResize) {
            if first_chunk {
                each!(&mut self.inner, k => k.suspend(r));
            }
            return None;
        }
        each!(&mut self.inner, k => k.resize_reserving(r, capacity, reservation, first_chunk))
    }
    fn try_allocate_generation(&mut self, r: KvRef, grow: u32) -> bool {
        if self.faults.fire(Fault::KvAllocate) {
            return false;
        }
        each!(&mut self.inner, k => k.try_allocate_generation(r, grow))
    }
    fn revert_allocate_generation(&mut self, r: KvRef) {
        each!(&mut self.inner, k => k.revert_allocate_generation(r));
    }
    fn rewind(&mut self, r: KvRef, tokens: u32) {
        each!(&mut self.inner, k => k.rewind(r, tokens));
    }
    fn suspend(&mut self, r: KvRef) {
        each!(&mut self.inner, k => k.suspend(r));
    }
    fn free(&mut self, r: KvRef) {
        each!(&mut self.inner, k => k.free(r));
    }
    fn preempt(&mut self, r: KvRef) {
        each!(&mut self.inner, k => k.preempt(r));
    }
    fn take_moves(&mut self) -> &[PageMove] {
        match &mut self.inner {
            KvInner::Pool(p) => p.take_moves(),
            KvInner::Two(k) => leader_moves(k.as_mut()),
            KvInner::Three(k) => leader_moves(k.as_mut()),
            KvInner::State(k) => hybrid::leader_moves(k.as_mut()),
            KvInner::WindowState(k) => hybrid::leader_moves(k.as_mut()),
        }
    }
}

/// The wrapper as a capability while the inner backend has it (`has`, read from its caps).
fn reach_if<'k, 'a>(k: &'k FaultKv<'a>, has: bool) -> Option<&'k FaultKv<'a>> {
    has.then_some(k)
}

/// The inner backend's connector and transfers, while it has them.
impl<'a> Reach<FaultKv<'a>, TransfersCap> for FaultKv<'a> {
    fn reach<'k>(k: &'k FaultKv<'a>) -> Option<&'k Self> {
        reach_if(k, each!(&k.inner, x => x.caps().transfers.is_some()))
    }
    fn reach_mut<'k>(k: &'k mut FaultKv<'a>) -> Option<&'k mut Self> {
        let has = <Self as Reach<Self, TransfersCap>>::reach(k).is_some();
        has.then_some(k)
    }
}

/// The inner backend's prefix cache, while it has one.
impl<'a> Reach<FaultKv<'a>, PrefixCap> for FaultKv<'a> {
    fn reach<'k>(k: &'k FaultKv<'a>) -> Option<&'k Self> {
        reach_if(k, each!(&k.inner, x => x.caps().prefix.is_some()))
    }
    fn reach_mut<'k>(k: &'k mut FaultKv<'a>) -> Option<&'k mut Self> {
        let has = <Self as Reach<Self, PrefixCap>>::reach(k).is_some();
        has.then_some(k)
    }
}

/// Unified paging while the pool has it, with the schedule between the pass and the pins.
impl<'a> Reach<FaultKv<'a>, AdaptersCap> for FaultKv<'a> {
    fn reach<'k>(k: &'k FaultKv<'a>) -> Option<&'k Self> {
        reach_if(k, k.unified())
    }
    fn reach_mut<'k>(k: &'k mut FaultKv<'a>) -> Option<&'k mut Self> {
        let has = k.unified();
        has.then_some(k)
    }
}

/// The inner connector's loads and sends.
impl Transfers for FaultKv<'_> {
    fn take_load_changes(&mut self, f: &mut dyn FnMut(u16, LoadChange)) {
        each!(&mut self.inner, k => if let Some(t) = k.transfers() {
            t.take_load_changes(f);
        });
    }
    fn sends_in_flight(&self) -> bool {
        each!(&self.inner, k => k.caps().transfers.is_some_and(Transfers::sends_in_flight))
    }
}

/// The inner prefix cache.
impl PrefixReuse for FaultKv<'_> {
    fn set_prefix(&mut self, r: KvRef, root: u64, hashes: &[u64]) {
        each!(&mut self.inner, k => if let Some(p) = k.prefix() {
            p.set_prefix(r, root, hashes);
        });
    }
    fn commit(&mut self, r: KvRef, computed: u32) {
        each!(&mut self.inner, k => if let Some(p) = k.prefix() {
            p.commit(r, computed);
        });
    }
    fn all_blocks_reusable(&self) -> bool {
        each!(&self.inner, k => k.caps().prefix.is_some_and(PrefixReuse::all_blocks_reusable))
    }
    fn probe_first_new_block(&self, r: KvRef, prep: ContextPrep) -> Option<u64> {
        each!(&self.inner, k => k.caps().prefix?.probe_first_new_block(r, prep))
    }
    fn probe_context_reuse(&self, r: KvRef, prep: ContextPrep) -> Option<u32> {
        each!(&self.inner, k => k.caps().prefix?.probe_context_reuse(r, prep))
    }
    fn can_fork(&self, parent: KvRef, child: KvRef, tokens: u32) -> Option<u32> {
        each!(&self.inner, k => k.caps().prefix?.can_fork(parent, child, tokens))
    }
    fn fork(&mut self, parent: KvRef, child: KvRef, tokens: u32) -> Option<u32> {
        each!(&mut self.inner, k => k.prefix()?.fork(parent, child, tokens))
    }
    fn take_kv_events(&mut self) -> &[kvsched_core::kv_events::KvEvent] {
        match &mut self.inner {
            KvInner::Pool(p) => p.take_kv_events(),
            KvInner::Two(k) => PrefixReuse::take_kv_events(k.as_mut()),
            KvInner::Three(k) => PrefixReuse::take_kv_events(k.as_mut()),
            KvInner::State(k) => PrefixReuse::take_kv_events(k.as_mut()),
            KvInner::WindowState(k) => PrefixReuse::take_kv_events(k.as_mut()),
        }
    }
}

/// Mirror admission is refused like a generation step's allocation (a plain pool's only: the harness
/// pairs no draft pool with groups).
impl PairedPool for FaultKv<'_> {
    fn revert_allocate_context(&mut self, r: KvRef) -> bool {
        self.inner.paired().revert_allocate_context(r)
    }
    fn admit_mirror(&mut self, r: KvRef) -> bool {
        if self.faults.fire(Fault::KvAllocate) {
            return false;
        }
        self.inner.paired().admit_mirror(r)
    }
    fn resume_blocked(&self, r: KvRef) -> bool {
        self.inner.groups().iter().any(|(_, p)| p.resume_blocked(r))
    }
}

/// Unified paging (a plain pool's): a pin may be refused.
impl AdapterPaging for FaultKv<'_> {
    fn max_tokens_beside_adapter(&self, pages: u32) -> u64 {
        self.inner.leader().max_tokens_beside_adapter(pages)
    }
    fn can_pin_adapter(&self, task: TaskSlot, pages: u32) -> bool {
        self.inner.leader().can_pin_adapter(task, pages)
    }
    fn pin_adapter(&mut self, who: RequestId, task: TaskSlot, pages: u32) -> bool {
        if self.faults.fire(Fault::KvPin) {
            return false;
        }
        self.inner.paired().pin_adapter(who, task, pages)
    }
    fn unpin_adapter(&mut self, task: TaskSlot) {
        self.inner.paired().unpin_adapter(task);
    }
    fn drop_adapter(&mut self, task: TaskSlot) {
        self.inner.paired().drop_adapter(task);
    }
    fn adapter_pins(&self, task: TaskSlot) -> Option<u32> {
        self.inner.leader().adapter_pins(task)
    }
    fn take_adapter_placements(&mut self, f: &mut dyn FnMut(TaskSlot)) {
        AdapterPaging::take_adapter_placements(self.inner.paired(), f);
    }
    fn take_adapter_evictions(&mut self, f: &mut dyn FnMut(TaskSlot)) {
        AdapterPaging::take_adapter_evictions(self.inner.paired(), f);
    }
}

/// The adapter cache (or none) behind a fault schedule. `ensure_batch` is never refused: that it always
/// succeeds for a scheduled batch is one of the invariants under test.
#[derive(Debug, Clone)]
pub struct FaultPeft {
    /// The cache; `None` behaves like [`kvsched_core::NoPeft`].
    pub inner: Option<AdapterPool<T>>,
    /// The schedule.
    pub faults: Faults,
}

impl PeftBackend for FaultPeft {
    fn max_device_pages(&self) -> u32 {
        self.inner
            .as_ref()
            .map_or(u32::MAX, kvsched_core::PeftBackend::max_device_pages)
    }
    fn lookup(&self, task: TaskId) -> Option<TaskRef> {
        self.inner.as_ref()?.lookup(task)
    }
    fn determine_num_pages(&mut self, req: RequestId, task: TaskRef) -> u32 {
        self.inner
            .as_mut()
            .map_or(0, |p| p.determine_num_pages(req, task))
    }
    fn pages_of(&self, task: TaskRef) -> u32 {
        self.inner.as_ref().map_or(0, |p| p.pages_of(task))
    }
    fn can_admit(&self, task: TaskRef) -> bool {
        self.inner.as_ref().is_none_or(|p| p.can_admit(task))
    }
    fn add_request(
        &mut self,
        req: RequestId,
        task: TaskRef,
        from_pause: bool,
    ) -> Result<(), PeftError> {
        if self.faults.fire(Fault::PeftAdd) {
            return Err(PeftError::HostCacheFull(task.id));
        }
        match self.inner.as_mut() {
            Some(p) => p.add_request(req, task, from_pause),
            None => Ok(()),
        }
    }
    fn mark_request_done(&mut self, req: RequestId, task: TaskRef, pause: bool, held: AdapterHold) {
        if let Some(p) = self.inner.as_mut() {
            p.mark_request_done(req, task, pause, held);
        }
    }
    fn ensure_batch(
        &mut self,
        tasks: &[TaskRef],
        load: &mut dyn FnMut(TaskRef),
    ) -> Result<(), PeftError> {
        match self.inner.as_mut() {
            Some(p) => p.ensure_batch(tasks, load),
            None => Ok(()),
        }
    }
    fn take_device_evictions(&mut self, evicted: &mut dyn FnMut(TaskRef)) {
        if let Some(p) = self.inner.as_mut() {
            p.take_device_evictions(evicted);
        }
    }
    fn take_host_changes(&mut self, changed: &mut dyn FnMut(TaskRef, HostChange)) {
        if let Some(p) = self.inner.as_mut() {
            p.take_host_changes(changed);
        }
    }
}

/// A listed request with its chunk tokens and last-chunk flag (0 and false outside the context list).
type Row = (Listed, u32, bool);

/// What a pass's batch adds up to, as the listed requests are checked.
#[derive(Default)]
struct Batch {
    /// Tokens the step computes.
    tokens: u64,
    /// Drafts of last chunks (they may overdraw the budget).
    drafts: u64,
    /// The distinct adapters the batch (and the prepared disaggregated requests) use.
    tasks: Vec<TaskRef>,
}

/// Every list of an output as (entry, chunk tokens, last chunk).
fn output_lists(o: &SchedulerOutput<N>) -> [(&'static str, Vec<Row>); 6] {
    let plain = |l: &[Listed]| l.iter().map(|&x| (x, 0, false)).collect::<Vec<_>>();
    [
        (
            "context",
            o.context()
                .iter()
                .map(|c| (c.listed, c.tokens, c.last))
                .collect(),
        ),
        ("generation", plain(o.generation())),
        ("encoder", plain(o.encoder())),
        ("paused", plain(o.paused())),
        ("recompute_paused", plain(o.recompute_paused())),
        ("disagg", plain(o.disagg())),
    ]
}

/// No request in two lists (nor twice in one); every resumed request is scheduled.
fn listed_once(o: &SchedulerOutput<N>, lists: &[(&str, Vec<Row>); 6]) -> Result<(), Violation> {
    let mut seen = BTreeSet::new();
    for (name, list) in lists {
        for (l, _, _) in list {
            if !seen.insert(l.handle()) {
                return Err(format!("slot {} listed twice (again in {name})", l.slot()).into());
            }
        }
    }
    let batch: BTreeSet<Handle> = lists[0]
        .1
        .iter()
        .chain(lists[1].1.iter())
        .map(|x| x.0.handle())
        .collect();
    for r in o.resumed() {
        if !batch.contains(&r.handle()) {
            return Err(format!("resumed slot {} is not scheduled", r.slot()).into());
        }
    }
    Ok(())
}

/// A listed request's ownership agrees with its list (`name`) and with the resumed list; a pending
/// connector load keeps it off the victim lists (spec §1.15).
fn entry_state(
    name: &str,
    o: &SchedulerOutput<N>,
    l: Listed,
    own: Ownership,
    pending_load: bool,
    spec: &RequestSpec,
) -> Result<(), Violation> {
    let id = spec.id.0;
    let ok = match name {
        "context" | "generation" => own.on_gpu(),
        "paused" => own == Ownership::Paused,
        "recompute_paused" => own == Ownership::Recompute,
        "disagg" => own.on_gpu() && spec.phase == Phase::DisaggGenerationInit,
        _ => true,
    };
    if !ok {
        return Err(format!("{name}: request {id} is {own:?}").into());
    }
    if pending_load && matches!(name, "paused" | "recompute_paused") {
        return Err(format!("{name}: request {id} has a connector load pending").into());
    }
    let resumed = o.resumed().iter().any(|r| r.handle() == l.handle());
    if resumed != (own == Ownership::Resumed) {
        return Err(format!("{name}: request {id} is {own:?}, listed resumed: {resumed}").into());
    }
    Ok(())
}

/// A scheduled entry's tokens (a context chunk's also checked against its prompt) added to `batch`.
fn entry_tokens(
    name: &str,
    spec: &RequestSpec,
    chunk: u32,
    last: bool,
    batch: &mut Batch,
) -> Result<(), Violation> {
    let id = spec.id.0;
    match name {
        "generation" => batch.tokens += u64::from(spec.beam + spec.draft),
        "context" => {
            batch.tokens += u64::from(chunk);
            if last {
                batch.tokens += u64::from(spec.draft);
                batch.drafts += u64::from(spec.draft);
            }
            if chunk == 0 || spec.position + chunk > spec.prompt {
                return Err(format!(
                    "context chunk {chunk} of request {id} at {}/{}",
                    spec.position, spec.prompt
                )
                .into());
            }
            if last != (spec.position + chunk == spec.prompt) {
                return Err(format!("context chunk of request {id}: last flag wrong").into());
            }
        }
        _ => {}
    }
    Ok(())
}

/// A request's caches: the target pool, and the draft and cross pools when the setup has them, each
/// behind its own fault schedule.
pub type Kv<'a> = KvSet<FaultKv<'a>, FaultKv<'a>, FaultKv<'a>>;

/// The scheduler under test.
pub type Sched<'a> = Scheduler<Kv<'a>, FaultPeft, N, T>;

/// The model of one live request.
#[derive(Debug, Clone)]
struct Live {
    handle: Handle,
    id: u64,
    prompt: u32,
    out_len: u32,
    produced: u32,
    // Decode steps scheduled since the last (re)admission: the KV must hold prompt + this many tokens.
    steps: u32,
    phase: Phase,
    position: u32,
    inflight: bool,
    /// A connector load into its pages is pending.
    loading: bool,
    /// Context-only (disaggregated serving): it sends its KV when its prompt is computed.
    context_only: bool,
    /// The first query that may still run: the first position of the step in flight (a chunk's
    /// start, a decode step's first token), else where its next step starts. No window group may
    /// have given up a block that query reads.
    step_start: u32,
    /// The positions its scheduled steps write: where its next step starts.
    frontier: u32,
    /// Its priority (the order under [`Admission::Priority`]).
    priority: u8,
}

/// A transfer holds the request: it sends its KV, or waits for it to arrive.
fn transferring(p: Phase) -> bool {
    matches!(
        p,
        Phase::DisaggContextTransInProgress | Phase::DisaggGenerationTransInProgress
    )
}

/// Counters of what a run exercised.
#[derive(Debug, Clone, Copy, Default)]
pub struct Stats {
    /// Passes run.
    pub passes: u64,
    /// Passes that failed with `Error::Deadlock`.
    pub deadlocks: u64,
    /// Requests admitted.
    pub submitted: u64,
    /// Submissions refused (as the model predicted).
    pub refused: u64,
    /// Requests that produced their whole output.
    pub finished: u64,
    /// Requests cancelled or ended early.
    pub removed: u64,
    /// Ordinary suspensions seen in outputs.
    pub paused: u64,
    /// Recompute pauses and preemptions seen.
    pub recomputed: u64,
    /// Resumes seen.
    pub resumed: u64,
    /// Context chunks and generation steps scheduled.
    pub scheduled: u64,
    /// Prompt tokens first chunks reused from the prefix cache.
    pub reused: u64,
    /// Transfers ended (sends and receives, delivered or failed).
    pub transfers: u64,
    /// Blocks the scheduled steps' requests had released in their window groups (summed over steps
    /// and groups: that releases happen).
    pub released: u64,
    /// Passes that were incremental ([`run`]: each checked against a twin's full pass).
    pub replayed: u64,
    /// Children forked off live requests.
    pub forked: u64,
    /// Forks refused (as the model allows).
    pub fork_refused: u64,
    /// Forked children in an output's suspended, recompute-paused (or preempted) and resumed lists.
    pub children_moved: [u64; 3],
    /// Parents removed while a child of theirs lived.
    pub parents_first: u64,
    /// The state group's counters at the end of a run (a hybrid recurrent model's backend).
    pub state: kvsched_core::state_pool::StateStats,
    /// Running requests that yielded to a higher priority (`PassStats::yielded`).
    pub yielded: u64,
    /// New requests the thrash guard held (`PassStats::held`).
    pub held: u64,
}

/// How [`Harness::run_to_completion`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Done {
    /// Every request finished, after this many passes.
    Finished(u64),
    /// A pass failed with `Error::Deadlock`, after this many passes.
    Deadlock(u64),
}

/// Scheduler + model.
pub struct Harness<'a> {
    /// The configuration.
    pub setup: Setup,
    /// The scheduler.
    pub sched: Sched<'a>,
    /// The last pass's output.
    pub out: SchedulerOutput<N>,
    out_pending: bool,
    live: Vec<Live>,
    finished: BTreeSet<u64>,
    removed: BTreeSet<u64>,
    next_id: u64,
    /// Counters.
    pub stats: Stats,
    /// The adapter host copies a binding following `take_adapter_host_changes` holds, by task slot.
    host_copies: BTreeSet<TaskSlot>,
    /// The connector store's fault schedule (with a connector).
    pub store_faults: Option<std::rc::Rc<Faults>>,
    /// The blocks the KV events drained so far say the target's prefix cache holds.
    kv_blocks: BTreeMap<u64, Tier>,
    /// How long the oldest runnable request waited (`progress.rs`).
    pub progress: progress::Progress,
    /// Each forked child's parent, by id (`fork.rs`).
    forks: BTreeMap<u64, u64>,
}

fn pick<T>(v: &[T], p: u8) -> Option<usize> {
    (!v.is_empty()).then(|| p as usize % v.len())
}

/// Every KV pool of the scheduler's backend, with its role.
pub fn pools<'s, 'a>(s: &'s Sched<'a>) -> impl Iterator<Item = (&'static str, &'s FaultKv<'a>)> {
    let kv = s.kv();
    std::iter::once(("target", kv.target()))
        .chain(kv.draft_pool().map(|(_, d)| ("draft", d)))
        .chain(kv.cross_pool().map(|x| ("cross", x)))
}

/// What [`fingerprint`] returns: the scheduler's, every pool's groups' with its fault schedule, the
/// adapter cache and its schedule.
pub type Fingerprint = (u64, Vec<(Vec<u64>, Faults)>, Option<AdapterPool<T>>, Faults);

/// A combined fingerprint of the scheduler, its KV pools (every group's) and its adapter cache.
pub fn fingerprint(s: &Sched<'_>) -> Fingerprint {
    let groups = |p: &FaultKv<'_>| {
        let state = p.inner.state().ok().flatten();
        p.inner
            .groups()
            .iter()
            .map(|(_, g)| g.fingerprint())
            .chain(state)
            .collect()
    };
    (
        s.fingerprint(),
        pools(s)
            .map(|(_, p)| (groups(p), p.faults.clone()))
            .collect(),
        s.adapters().backend().inner.clone(),
        s.adapters().backend().faults.clone(),
    )
}

impl<'a> Harness<'a> {
    /// A harness over `mem` (from `setup.memory()`).
    pub fn new(setup: Setup, mem: &'a mut Memory) -> Result<Self, Violation> {
        let faulty = |m: PoolSpec| -> Result<FaultKv<'a>, Violation> {
            Ok(FaultKv {
                inner: KvInner::Pool(Box::new(m.build().map_err(|e| format!("pool: {e}"))?)),
                faults: Faults::default(),
            })
        };
        let (draft, cross) = (mem.draft, mem.cross);
        let (target, store_faults) = Self::target(&setup, mem)?;
        let draft = match (setup.draft, draft) {
            (Some(mode), Some(m)) => Some((mode, faulty(m)?)),
            _ => None,
        };
        let cross = match cross {
            Some(m) => Some(faulty(m)?),
            None => None,
        };
        let peft = match &setup.peft {
            None => None,
            Some(p) => {
                let cache = if p.unified {
                    AdapterPool::<T>::unified(setup.gpu_pages, p.host_pages)
                } else {
                    AdapterPool::<T>::new(p.device_pages, p.host_pages)
                };
                let mut cache = cache.map_err(|e| format!("adapter pool: {e}"))?;
                for (i, &pages) in p.task_pages.iter().enumerate() {
                    cache
                        .register(TaskId(task_id(i as u8)), pages)
                        .map_err(|e| format!("register: {e}"))?;
                }
                Some(cache)
            }
        };
        let sched = Scheduler::new(
            setup.config(),
            KvSet::with_pools(target, draft, cross),
            FaultPeft {
                inner: peft,
                faults: Faults::default(),
            },
        )
        .map_err(|e| format!("scheduler: {e}"))?;
        Ok(Self {
            setup,
            sched,
            out: SchedulerOutput::new(),
            out_pending: false,
            live: Vec::new(),
            finished: BTreeSet::new(),
            removed: BTreeSet::new(),
            forks: BTreeMap::new(),
            next_id: 1,
            stats: Stats::default(),
            host_copies: BTreeSet::new(),
            store_faults,
            kv_blocks: BTreeMap::new(),
            progress: progress::Progress::default(),
        })
    }

    /// The target backend of `mem` (the pool, or KV groups led by it) with the connector's store
    /// attached, and the store's fault schedule.
    fn target(
        setup: &Setup,
        mem: &'a mut Memory,
    ) -> Result<(FaultKv<'a>, Option<std::rc::Rc<Faults>>), Violation> {
        let grouped = !setup.windows.is_empty() || setup.state.is_some();
        if grouped && !setup.groups_allowed() {
            return Err("KV groups in a configuration they do not take".into());
        }
        let mut target = FaultKv {
            inner: KvInner::build(mem.target, &mem.windows, mem.state)
                .map_err(|e| format!("KV: {e}"))?,
            faults: Faults::default(),
        };
        let Some((store, slots, saves)) = mem.store.as_mut() else {
            return Ok((target, None));
        };
        let faults = store.faults.clone();
        target
            .inner
            .pool_mut()
            .ok_or("a connector on KV groups")?
            .attach_connector(store, slots, saves, LOAD_TIMEOUT)
            .map_err(|e| format!("connector: {e}"))?;
        Ok((target, Some(faults)))
    }

    /// Live requests (model).
    pub fn live(&self) -> usize {
        self.live.len()
    }

    /// Applies one operation and checks every invariant.
    pub fn apply(&mut self, op: &Op) -> Result<(), Violation> {
        match *op {
            Op::Submit {
                prompt,
                out_len,
                lora,
                draft,
                snap_every,
                duplicate,
                family,
                encoder,
            } => {
                let encoder = if self.setup.cross {
                    u32::from(encoder)
                } else {
                    0
                };
                let shape = (prompt, out_len, lora, draft, snap_every);
                self.submit(shape, duplicate, family, encoder, None)?;
            }
            Op::Disagg {
                prompt,
                out_len,
                lora,
                generation,
            } => {
                let shape = (prompt, out_len, lora, 0, 0);
                self.submit(shape, false, Some(1), 0, Some(generation))?;
            }
            Op::EndTransfer { pick: p, delivered } => {
                if let Some(i) = pick(&self.live, p) {
                    self.end_transfer(i, delivered)?;
                }
            }
            Op::Pass => self.pass()?,
            Op::Complete => self.complete()?,
            Op::Fork { pick: p, out_len } => self.fork(p, out_len)?,
            Op::Finish { pick: p } => {
                let generating: Vec<usize> = (0..self.live.len())
                    .filter(|&i| self.live[i].phase.is_generation())
                    .collect();
                if let Some(k) = pick(&generating, p) {
                    self.remove(generating[k], false)?;
                }
            }
            Op::Cancel { pick: p } => {
                if let Some(i) = pick(&self.live, p) {
                    self.remove(i, false)?;
                }
            }
            Op::Inject { fault, count, pool } => {
                let kv = self.sched.kv();
                let faults = match (fault, pool % 3) {
                    (Fault::PeftAdd, _) => Some(&self.sched.adapters().backend().faults),
                    (Fault::KvPin, _) => Some(&kv.target().faults),
                    (Fault::LoadFail | Fault::LoadHang | Fault::SaveHang, _) => {
                        self.store_faults.as_deref()
                    }
                    (_, 1) => kv.draft_pool().map(|(_, d)| &d.faults),
                    (_, 2) => kv.cross_pool().map(|x| &x.faults),
                    _ => Some(&kv.target().faults),
                };
                if let Some(f) = faults {
                    f.inject(fault, u32::from(count));
                }
            }
            Op::Inflight { pick: p } => {
                if let Some(i) = pick(&self.live, p) {
                    let l = &mut self.live[i];
                    l.inflight = !l.inflight;
                    self.sched
                        .set_inflight(l.handle, l.inflight)
                        .map_err(|e| format!("set_inflight: {e}"))?;
                }
            }
            Op::Load { pick: p } => {
                if let Some(i) = pick(&self.live, p) {
                    let l = &mut self.live[i];
                    l.loading = !l.loading;
                    self.sched
                        .set_pending_load(l.handle, l.loading)
                        .map_err(|e| format!("set_pending_load: {e}"))?;
                }
            }
            Op::Update {
                pick: p,
                beam,
                draft,
            } => {
                if let Some(i) = pick(&self.live, p) {
                    self.update(i, beam, draft)?;
                }
            }
        }
        self.replay_kv_events()?;
        self.check()
    }

    /// Drains the scheduler's KV events and replays them onto the blocks they say the target's (the
    /// leader's) prefix cache holds, by key and tier: the replay must be exactly its cached blocks,
    /// and the log never overflows here (its capacity covers any one operation).
    fn replay_kv_events(&mut self) -> Result<(), Violation> {
        for e in self.sched.take_kv_events() {
            let known = self.kv_blocks.get(&e.key).copied();
            match e.kind {
                KvEventKind::Stored if known.is_none() => {
                    self.kv_blocks.insert(e.key, e.tier);
                }
                KvEventKind::Removed if known == Some(e.tier) => {
                    self.kv_blocks.remove(&e.key);
                }
                _ => return Err(format!("KV event {e:?} on {known:?}").into()),
            }
        }
        let pool = self.sched.kv().target().inner.leader();
        if pool
            .kv_event_log()
            .is_some_and(|(_, overflows)| overflows > 0)
        {
            return Err("the KV event log overflowed within one operation".into());
        }
        let cached = cached_blocks(pool);
        if cached != self.kv_blocks {
            return Err(format!(
                "KV events replayed: {} blocks, the prefix cache holds {}",
                self.kv_blocks.len(),
                cached.len()
            )
            .into());
        }
        Ok(())
    }

    fn spec(
        &self,
        prompt: u32,
        out_len: u32,
        lora: Option<u8>,
        draft: u8,
        snap: u8,
    ) -> RequestSpec {
        let mut s = RequestSpec::new(self.next_id, Phase::ContextInit, prompt);
        s.lora = lora.map(|i| TaskId(task_id(i)));
        // Clients and classes for the admission policies: every third request has a tenant of its own.
        s.tenant = (self.next_id % 3 == 0).then_some((self.next_id % 5) as u32);
        s.priority = (self.next_id % 4) as u8;
        s.class = ((self.next_id / 2) % SERVICE_CLASSES as u64) as u8;
        s.arrival = self.next_id * 10;
        s.draft = u32::from(draft);
        // Enough KV for the whole output: every decode step grows the cache by 1 + drafts.
        s.max_new_tokens = out_len * (1 + u32::from(draft));
        if snap > 0 {
            let mut p = u32::from(snap);
            while p < prompt && s.snapshots.push(p).is_ok() {
                p += u32::from(snap);
            }
        }
        s
    }

    /// The refusal the model predicts for a submission, if any.
    fn predict(&self, s: &RequestSpec) -> Option<Error> {
        if self.live.iter().any(|l| l.id == s.id.0) {
            return Some(Error::DuplicateId(s.id));
        }
        let tokens = u64::from(s.prompt) + u64::from(s.max_new_tokens) + u64::from(s.draft);
        if tokens > self.setup.max_tokens() {
            return Some(Error::RequestTooLarge {
                id: s.id,
                tokens,
                limit: self.setup.max_tokens(),
            });
        }
        if self.setup.cross && u64::from(s.encoder_len) > self.setup.max_tokens() {
            return Some(Error::RequestTooLarge {
                id: s.id,
                tokens: u64::from(s.encoder_len),
                limit: self.setup.max_tokens(),
            });
        }
        if let (Some(t), Some(p)) = (s.lora, &self.setup.peft) {
            let i = (t.0 - task_id(0)) as usize;
            if i >= self.setup.tasks() {
                return Some(Error::Peft(PeftError::UnknownTask(t)));
            }
            let limit = self.setup.max_tokens_beside(p.task_pages[i]);
            if p.unified && tokens > limit {
                return Some(Error::RequestTooLarge {
                    id: s.id,
                    tokens,
                    limit,
                });
            }
        }
        if self.live.len() == N {
            return Some(Error::CapacityExhausted {
                what: "request table",
                capacity: N as u32,
            });
        }
        None
    }

    /// The block hashes of a prompt of `family`: its leading blocks the family's, the rest the request's.
    fn hashes(&self, id: u64, prompt: u32, family: Option<u8>) -> Vec<u64> {
        let Some(f) = family.filter(|_| self.setup.prefix) else {
            return Vec::new();
        };
        let f = u64::from(f % 3 + 1);
        let full = u64::from(prompt / self.setup.tokens_per_block);
        (0..full)
            .map(|k| {
                if k < 2 * f {
                    f * 1000 + k
                } else {
                    (id + 1) * 1_000_000 + k
                }
            })
            .collect()
    }

    /// A scheduled context chunk at `position`: a first chunk (the model at 0) may start past a reused
    /// prefix — whole blocks, never the last token nor the draft lookahead, and only with a prefix cache.
    fn reused(
        live: &mut [Live],
        setup: &Setup,
        stats: &mut Stats,
        (id, position, draft): (u64, u32, u32),
    ) -> Result<(), Violation> {
        let tpb = setup.tokens_per_block;
        let prefix = setup.prefix;
        let m = live
            .iter_mut()
            .find(|m| m.id == id)
            .ok_or(format!("context: {id} not in the model"))?;
        if m.position == position {
            return Ok(());
        }
        let limit = m.prompt.saturating_sub(1 + draft) / tpb * tpb;
        if m.position != 0 || !prefix || position % tpb != 0 || position > limit {
            return Err(format!(
                "context: request {id} scheduled at {position}, model at {} (prompt {}, reuse limit {limit})",
                m.position, m.prompt
            ).into());
        }
        m.position = position;
        stats.reused += u64::from(position);
        Ok(())
    }

    /// Submits a request; `disagg` makes it one of disaggregated serving: `Some(true)` a generation
    /// request whose KV a transfer delivers, `Some(false)` a context-only one.
    fn submit(
        &mut self,
        (prompt, out_len, lora, draft, snap): (u32, u32, Option<u8>, u8, u8),
        duplicate: bool,
        family: Option<u8>,
        encoder: u32,
        disagg: Option<bool>,
    ) -> Result<(), Violation> {
        let mut s = self.spec(prompt.max(1), out_len.max(1), lora, draft, snap);
        s.encoder_len = encoder;
        match disagg {
            Some(true) => s.phase = Phase::DisaggGenerationInit,
            Some(false) => s.context_only = true,
            None => {}
        }
        if duplicate {
            match self.live.first() {
                Some(l) => s.id = RequestId(l.id),
                None => return Ok(()),
            }
        }
        let expected = self.predict(&s);
        let before = fingerprint(&self.sched);
        let hashes = self.hashes(s.id.0, s.prompt, family);
        match (
            self.sched.submit_with_prefix(s.clone(), 0, &hashes),
            expected,
        ) {
            (Ok(h), None) => {
                self.next_id += 1;
                self.stats.submitted += 1;
                self.join(Live {
                    handle: h,
                    id: s.id.0,
                    prompt: s.prompt,
                    out_len: out_len.max(1),
                    produced: 0,
                    steps: 0,
                    phase: s.phase,
                    position: 0,
                    inflight: false,
                    loading: false,
                    context_only: s.context_only,
                    step_start: 0,
                    frontier: 0,
                    priority: s.priority,
                });
                Ok(())
            }
            (Err(e), Some(x)) if e == x => {
                if !duplicate {
                    self.next_id += 1;
                }
                self.stats.refused += 1;
                if fingerprint(&self.sched) != before {
                    return Err(format!("refused submit ({e}) changed the state").into());
                }
                Ok(())
            }
            (got, want) => Err(format!(
                "submit {s:?}: got {:?}, model expected {want:?}",
                got.map(|_| ())
            )
            .into()),
        }
    }

    /// Most tokens an update may leave a request of adapter `lora` holding: what one request can hold,
    /// and with unified paging what fits beside its adapter (as at submission).
    fn update_limit(&self, lora: Option<TaskId>) -> u64 {
        let beside = match (lora, &self.setup.peft) {
            (Some(t), Some(p)) if p.unified => p
                .task_pages
                .get((t.0 - task_id(0)) as usize)
                .map_or(u64::MAX, |&pages| self.setup.max_tokens_beside(pages)),
            _ => u64::MAX,
        };
        self.setup.max_tokens().min(beside)
    }

    fn update(&mut self, i: usize, beam: u8, draft: u8) -> Result<(), Violation> {
        let h = self.live[i].handle;
        let before = fingerprint(&self.sched);
        let (prompt, max_new, lora) = {
            let sp = self.sched.get(h).map_err(|e| format!("get: {e}"))?.spec();
            (sp.prompt, sp.max_new_tokens, sp.lora)
        };
        let tokens = u64::from(prompt) + u64::from(max_new) + u64::from(draft);
        let too_large = tokens > self.update_limit(lora);
        let r = self.sched.update(h, |s| {
            s.beam = u32::from(beam);
            s.draft = u32::from(draft);
        });
        let sending = self.live[i].phase == Phase::DisaggContextTransInProgress;
        let refused = match (&r, beam, too_large) {
            // A sending request cannot change until its send ends.
            (Err(Error::Invalid(_)), _, _) if sending => true,
            _ if sending => return Err(format!("update of a sending request: {r:?}").into()),
            (Err(Error::Invalid(_)), 0, _) => true,
            (Err(Error::RequestTooLarge { .. }), 1.., true) => true,
            (Ok(()), 1.., false) => false,
            _ => return Err(format!("update beam {beam} draft {draft}: {r:?}").into()),
        };
        if refused && fingerprint(&self.sched) != before {
            return Err("refused update changed the state".into());
        }
        Ok(())
    }

    fn remove(&mut self, i: usize, finished: bool) -> Result<(), Violation> {
        let l = self.live.remove(i);
        let parent = |p: &u64| *p == l.id;
        if self
            .live
            .iter()
            .any(|c| self.forks.get(&c.id).is_some_and(parent))
        {
            self.stats.parents_first += 1;
        }
        let slot = l.handle.index();
        let on_gpu = self
            .sched
            .get(l.handle)
            .is_ok_and(|e| e.ownership().on_gpu());
        if l.inflight && on_gpu {
            // Refused while its step is in flight (its pages may still be read), changing nothing; the
            // engine clears the mark once the step completes, then removes it.
            let before = fingerprint(&self.sched);
            if !matches!(self.sched.remove(l.handle), Err(Error::Invalid(_))) {
                return Err(format!("remove of {} in flight was not refused", l.id).into());
            }
            if fingerprint(&self.sched) != before {
                return Err(format!("a refused remove of {} changed the scheduler", l.id).into());
            }
            self.sched
                .set_inflight(l.handle, false)
                .map_err(|e| format!("set_inflight: {e}"))?;
        }
        let spec = self
            .sched
            .remove(l.handle)
            .map_err(|e| format!("remove {}: {e}", l.id))?;
        if spec.id.0 != l.id {
            return Err(format!("remove {} returned request {}", l.id, spec.id.0).into());
        }
        if self.sched.get(l.handle).is_ok() {
            return Err(format!("handle of removed request {} still resolves", l.id).into());
        }
        if self.sched.remove(l.handle).err() != Some(Error::StaleHandle) {
            return Err(format!("second remove of {} was not StaleHandle", l.id).into());
        }
        if self.holds_kv(slot) {
            return Err(format!("removed request {} left KV in slot {slot}", l.id).into());
        }
        if finished {
            self.finished.insert(l.id);
            self.stats.finished += 1;
        } else {
            self.removed.insert(l.id);
            self.stats.removed += 1;
        }
        Ok(())
    }

    /// Ends request `i`'s transfer: a send removes it and frees its pages; a delivered receive leaves it
    /// ready to decode (its first token came from the context engine), a failed one replays its prefill.
    /// On a request with no transfer in flight both ends are refused, changing nothing.
    fn end_transfer(&mut self, i: usize, delivered: bool) -> Result<(), Violation> {
        let how = if delivered {
            TransferEnd::Delivered
        } else {
            TransferEnd::Failed
        };
        let l = self.live[i].clone();
        let before = fingerprint(&self.sched);
        match l.phase {
            Phase::DisaggContextTransInProgress => {
                if self.sched.end_receive(l.handle, how).is_ok() {
                    return Err(format!("end_receive of sending request {}", l.id).into());
                }
                let spec = self
                    .sched
                    .end_send(l.handle, how)
                    .map_err(|e| format!("end_send {}: {e}", l.id))?;
                if spec.id.0 != l.id || self.sched.get(l.handle).is_ok() {
                    return Err(format!("end_send {}: not removed", l.id).into());
                }
                if self.holds_kv(l.handle.index()) {
                    return Err(format!("sent request {} left KV behind", l.id).into());
                }
                self.live.remove(i);
                self.finished.insert(l.id);
                self.stats.finished += 1;
            }
            Phase::DisaggGenerationTransInProgress => {
                if self.sched.end_send(l.handle, how).is_ok() {
                    return Err(format!("end_send of receiving request {}", l.id).into());
                }
                self.sched
                    .end_receive(l.handle, how)
                    .map_err(|e| format!("end_receive {}: {e}", l.id))?;
                let m = &mut self.live[i];
                if delivered {
                    (m.phase, m.position, m.produced) =
                        (Phase::DisaggGenerationTransComplete, m.prompt, 1);
                } else {
                    (m.phase, m.position, m.produced) = (Phase::ContextInit, 0, 0);
                }
                m.steps = 0;
                if !delivered {
                    (m.step_start, m.frontier) = (0, 0);
                }
            }
            _ => {
                let send = self.sched.end_send(l.handle, how);
                let receive = self.sched.end_receive(l.handle, how);
                if !matches!(
                    (send, receive),
                    (Err(Error::Invalid(_)), Err(Error::Invalid(_)))
                ) {
                    return Err(format!(
                        "a transfer end accepted for request {} ({:?})",
                        l.id, l.phase
                    )
                    .into());
                }
                if fingerprint(&self.sched) != before {
                    return Err("a refused transfer end changed the state".into());
                }
                return Ok(());
            }
        }
        self.stats.transfers += 1;
        Ok(())
    }

    /// Ends every transfer in flight, delivered (the engine's transceiver finishing its work).
    fn end_transfers(&mut self) -> Result<(), Violation> {
        let in_flight = |p: Phase| {
            matches!(
                p,
                Phase::DisaggContextTransInProgress | Phase::DisaggGenerationTransInProgress
            )
        };
        while let Some(i) = self.live.iter().position(|l| in_flight(l.phase)) {
            self.end_transfer(i, true)?;
        }
        Ok(())
    }

    /// Runs one pass (completing the previous step first).
    pub fn pass(&mut self) -> Result<(), Violation> {
        if self.out_pending {
            self.complete()?;
        }
        let stall_before = self.sched.stall_count();
        let oldest = self.oldest_runnable();
        let res = self.sched.schedule(&mut self.out);
        self.stats.passes += 1;
        self.stats.yielded += u64::from(self.sched.last_pass().yielded);
        self.stats.held += u64::from(self.sched.last_pass().held);
        let ran = res.is_ok() && oldest.is_some_and(|id| self.scheduled(id));
        self.progress.after(ran);
        match res {
            Ok(()) => {
                self.sched
                    .ensure_batch(&mut self.out)
                    .map_err(|e| format!("ensure_batch failed for a scheduled batch: {e}"))?;
                // A request recompute-paused for a failed connector load has its pending-load mark
                // cleared (the load ended); no other victim carries one.
                for l in self.out.recompute_paused() {
                    let id = self.sched.get(l.handle()).map(|e| e.spec().id.0);
                    if let Some(m) = self.live.iter_mut().find(|m| Ok(m.id) == id) {
                        m.loading = false;
                    }
                }
                self.check_output()?;
                self.out_pending = true;
                Ok(())
            }
            Err(Error::Deadlock { stalled, .. }) => {
                self.stats.deadlocks += 1;
                if self.live.is_empty() {
                    return Err("deadlock reported on an idle pass".into());
                }
                if stalled < self.setup.deadlock_threshold
                    || stalled != stall_before + 1
                    || stalled != self.sched.stall_count()
                {
                    return Err(format!(
                        "deadlock after {stalled} stalled passes (threshold {}, stall count before {stall_before})",
                        self.setup.deadlock_threshold
                    ).into());
                }
                let o = &self.out;
                if o.num_fitting()
                    + o.paused().len()
                    + o.recompute_paused().len()
                    + o.disagg().len()
                    > 0
                {
                    return Err("deadlock reported on a pass that made progress".into());
                }
                Ok(())
            }
            Err(e) => Err(format!("schedule: {e}").into()),
        }
    }

    /// A request joins the model's order: at the end, or under priority at the end of its priority's.
    fn join(&mut self, l: Live) {
        let at = if self.setup.admission == Admission::Priority {
            let before = self.live.iter().rposition(|x| x.priority <= l.priority);
            before.map_or(0, |i| i + 1)
        } else {
            self.live.len()
        };
        self.live.insert(at, l);
    }

    /// Before a pass: the oldest runnable request's id, its wait noted (`progress.rs`).
    fn oldest_runnable(&mut self) -> Option<u64> {
        let work = |l: &Live| {
            u64::from(l.prompt.saturating_sub(l.position))
                + u64::from(l.out_len.saturating_sub(l.produced))
        };
        // Under priority the order is by priority, then arrival: the first is the most senior.
        let oldest = self
            .live
            .iter()
            .find(|l| !l.inflight && !l.loading && !transferring(l.phase))
            .map(|l| l.id);
        let live = &self.live;
        self.progress.before(oldest, |id| {
            live.iter().filter(|l| l.id != id).map(work).sum()
        })
    }

    /// Whether the last pass scheduled request `id` (a chunk, a decode step or a transfer's pages).
    fn scheduled(&self, id: u64) -> bool {
        let o = &self.out;
        let is = |l: &Listed| {
            self.sched
                .get(l.handle())
                .is_ok_and(|e| e.spec().id.0 == id)
        };
        o.context().iter().any(|c| is(&c.listed))
            || o.generation().iter().any(is)
            || o.disagg().iter().any(is)
    }

    /// Completes the last pass's step.
    pub fn complete(&mut self) -> Result<(), Violation> {
        if !self.out_pending {
            return Ok(());
        }
        self.out_pending = false;
        // The engine hands the page moves to the copy engine (settling the resumed requests), runs the
        // step and completes it.
        let _ = self.sched.take_moves();
        let _ = self.sched.take_pool_moves(Pool::Draft);
        let _ = self.sched.take_pool_moves(Pool::Cross);
        self.follow_host_copies()?;
        let s = &self.sched;
        let id = |l: &Listed| s.get(l.handle()).ok().map(|e| e.spec().id.0);
        let context: Vec<(Option<u64>, u32)> = self
            .out
            .context()
            .iter()
            .map(|c| (id(&c.listed), c.tokens))
            .collect();
        let generation: Vec<Option<u64>> = self.out.generation().iter().map(id).collect();
        let disagg: Vec<Option<u64>> = self.out.disagg().iter().map(id).collect();
        let recomputed: Vec<Option<u64>> = self.out.recompute_paused().iter().map(id).collect();
        self.sched
            .complete_step(&self.out)
            .map_err(|e| format!("complete_step: {e}"))?;
        for (cid, tokens) in context {
            if let Some(l) = self.live.iter_mut().find(|l| Some(l.id) == cid) {
                l.position = (l.position + tokens).min(l.prompt);
                if l.position >= l.prompt && l.context_only {
                    // It sends its KV (and its first token) to a generation engine.
                    l.phase = Phase::DisaggContextTransInProgress;
                } else if l.position >= l.prompt {
                    l.phase = Phase::GenerationInProgress;
                    // The last context chunk produces the first token.
                    l.produced += 1;
                }
            }
        }
        for gid in generation {
            if let Some(l) = self.live.iter_mut().find(|l| Some(l.id) == gid) {
                l.produced += 1;
                if l.phase == Phase::DisaggGenerationTransComplete {
                    l.phase = Phase::GenerationInProgress;
                }
            }
        }
        // The transceiver starts the receives into the pages the pass prepared.
        for did in disagg {
            if let Some(l) = self.live.iter_mut().find(|l| Some(l.id) == did) {
                self.sched
                    .start_receive(l.handle)
                    .map_err(|e| format!("start_receive {}: {e}", l.id))?;
                l.phase = Phase::DisaggGenerationTransInProgress;
            }
        }
        self.ran(&recomputed);
        while let Some(i) = self
            .live
            .iter()
            .position(|l| l.phase.is_generation() && l.produced >= l.out_len)
        {
            self.remove(i, true)?;
        }
        Ok(())
    }

    /// The step ran: recompute-paused requests (`recomputed`) replay from the start, and every
    /// request's next query is where its next step starts.
    fn ran(&mut self, recomputed: &[Option<u64>]) {
        for l in &mut self.live {
            if recomputed.contains(&Some(l.id)) {
                l.phase = Phase::ContextInit;
                (l.position, l.steps, l.frontier) = (0, 0, 0);
            }
            l.step_start = l.frontier;
        }
    }

    /// Passes and completions until every request finished ([`Done::Finished`]) or a pass reports
    /// `Error::Deadlock` ([`Done::Deadlock`]); more than `max_passes` passes is an error (a livelock).
    pub fn run_to_completion(&mut self, max_passes: u64) -> Result<Done, Violation> {
        let start = self.stats.passes;
        let deadlocks = self.stats.deadlocks;
        while !self.live.is_empty() {
            if self.stats.passes - start >= max_passes {
                return Err(format!(
                    "{} requests still live after {max_passes} passes: {:?}",
                    self.live.len(),
                    self.live
                )
                .into());
            }
            self.pass()?;
            self.replay_kv_events()?;
            self.check()?;
            if self.stats.deadlocks > deadlocks {
                return Ok(Done::Deadlock(self.stats.passes - start));
            }
            self.complete()?;
            self.end_transfers()?;
            self.replay_kv_events()?;
            self.check()?;
        }
        Ok(Done::Finished(self.stats.passes - start))
    }

    /// Checks one pass's output (right after `schedule` and `ensure_batch`).
    fn check_output(&mut self) -> Result<(), Violation> {
        let o = &self.out;
        self.stats.scheduled += (o.context().len() + o.generation().len()) as u64;
        self.stats.paused += o.paused().len() as u64;
        self.stats.recomputed += o.recompute_paused().len() as u64;
        self.stats.resumed += o.resumed().len() as u64;
        for (k, list) in [o.paused(), o.recompute_paused(), o.resumed()]
            .iter()
            .enumerate()
        {
            let child = |l: &&Listed| {
                let id = self.sched.get(l.handle()).map(|e| e.spec().id.0);
                id.is_ok_and(|id| self.forks.contains_key(&id))
            };
            self.stats.children_moved[k] += list.iter().filter(child).count() as u64;
        }
        let lists = output_lists(o);
        listed_once(o, &lists)?;
        // Every listed request is live, named by its handle, and in the state its list says.
        let mut batch = Batch::default();
        for (name, list) in &lists {
            for &row in list {
                self.check_entry(name, row, &mut batch)?;
            }
        }
        self.check_budgets(&batch)?;
        self.check_plan(&mut batch.tasks)?;
        let (o, s) = (&self.out, &self.sched);
        if (!o.context().is_empty() || !o.generation().is_empty()) && s.stall_count() != 0 {
            return Err("stall counter not reset by a pass that scheduled work".into());
        }
        Ok(())
    }

    /// One listed request (`name`: its list): live, in the state its list says, with the caches and the
    /// KV room its step needs; its tokens and adapter added to `batch`.
    fn check_entry(&mut self, name: &str, row: Row, batch: &mut Batch) -> Result<(), Violation> {
        let (l, chunk, last) = row;
        let (o, s) = (&self.out, &self.sched);
        let e = s
            .get(l.handle())
            .map_err(|e| format!("{name}: slot {}: {e}", l.slot()))?;
        let id = e.spec().id.0;
        entry_state(name, o, l, e.ownership(), e.pending_load(), e.spec())?;
        let r = KvRef {
            slot: l.slot(),
            id: e.spec().id,
        };
        if name == "context" {
            let at = (id, e.spec().position, e.spec().draft);
            Self::reused(&mut self.live, &self.setup, &mut self.stats, at)?;
            // A decoder chunk runs with its cross cache in place.
            let cross = s.kv().cross_pool().is_none_or(|x| x.cache(r).is_active());
            if e.spec().encoder_len > 0 && !cross {
                return Err(format!("context: decoder {id} runs without its cross cache").into());
            }
        }
        if matches!(name, "context" | "generation")
            && s.kv()
                .draft_pool()
                .is_some_and(|(_, d)| !d.cache(r).is_active())
        {
            return Err(format!("{name}: {id} runs without its draft cache").into());
        }
        let scheduled = matches!(name, "context" | "generation" | "encoder");
        if scheduled && e.inflight() {
            return Err(format!("{name}: request {id} is in flight").into());
        }
        // A prepared disaggregated request's adapter is planned too: its lease pins it for the decode its
        // transfer leads to.
        if scheduled || name == "disagg" {
            if let Some(t) = e.task() {
                if !batch.tasks.contains(&t) {
                    batch.tasks.push(t);
                }
            }
        }
        // The KV holds what the step writes.
        let kv_tokens = s.kv().target().inner.leader().seq(l.slot()).capacity;
        let needed = Self::needed(&mut self.live, name, e.spec(), chunk)?;
        if kv_tokens < needed {
            return Err(format!(
                "{name}: request {id} needs {needed} KV tokens, its cache holds {kv_tokens}"
            )
            .into());
        }
        entry_tokens(name, e.spec(), chunk, last, batch)?;
        let (position, draft) = (e.spec().position, e.spec().draft);
        match name {
            "context" => self.stepped(r, Some(position), chunk + if last { draft } else { 0 }),
            "generation" => self.stepped(r, None, 1 + draft),
            _ => Ok(()),
        }
    }

    /// The KV tokens a listed request's step needs (`name`: its list; `chunk`: a context chunk's
    /// tokens); the model counts a decode step, and a prepared disaggregated request's next step
    /// starts past the prompt (and the drafts' room) its transfer brings.
    fn needed(
        live: &mut [Live],
        name: &str,
        spec: &RequestSpec,
        chunk: u32,
    ) -> Result<u32, Violation> {
        let id = spec.id.0;
        if !matches!(name, "generation" | "disagg") {
            return Ok(if name == "context" {
                spec.position + chunk
            } else {
                0
            });
        }
        let m = live.iter_mut().find(|m| m.id == id);
        let m = m.ok_or(format!("{name}: {id} not in the model"))?;
        if name == "generation" {
            m.steps += 1;
            return Ok(m.prompt + m.steps);
        }
        (m.step_start, m.frontier) = (spec.prompt + spec.draft, spec.prompt + spec.draft);
        Ok(spec.prompt)
    }

    /// The batch's tokens and requests within the budgets.
    fn check_budgets(&self, batch: &Batch) -> Result<(), Violation> {
        let (o, cfg) = (&self.out, self.sched.config());
        if let Some(limit) = cfg.max_num_tokens {
            let slack = if cfg.chunking.is_some() {
                batch.drafts
            } else {
                0
            };
            if batch.tokens > u64::from(limit) + slack {
                return Err(format!(
                    "batch of {} tokens over the budget {limit} (+{slack} drafts)",
                    batch.tokens
                )
                .into());
            }
        }
        if o.num_fitting() as u64 > u64::from(cfg.max_num_requests) {
            return Err(format!(
                "batch of {} requests over the limit {}",
                o.num_fitting(),
                cfg.max_num_requests
            )
            .into());
        }
        Ok(())
    }

    /// The adapter plan: exactly the distinct tasks of the batch (`tasks`); with the pinned ones they fit,
    /// and each is resident.
    fn check_plan(&self, tasks: &mut [TaskRef]) -> Result<(), Violation> {
        let (o, s) = (&self.out, &self.sched);
        let mut plan: Vec<TaskRef> = o.adapters().to_vec();
        plan.sort_by_key(|t| t.slot);
        tasks.sort_by_key(|t| t.slot);
        if plan != tasks {
            return Err(format!("adapter plan {plan:?} but the batch uses {tasks:?}").into());
        }
        let unified = s.kv().target().unified();
        if let (true, Some(_)) = (unified, &s.adapters().backend().inner) {
            // Unified paging: every planned adapter is resident in the KV pool, pinned by its leases.
            for t in &plan {
                let a = s.kv().target().inner.leader().adapter(t.slot);
                if !a.is_some_and(|a| a.resident() && a.pins() > 0) {
                    return Err(format!("task {} not pinned in the KV pool: {a:?}", t.id.0).into());
                }
            }
        } else if let Some(cache) = &s.adapters().backend().inner {
            let mut slots: BTreeSet<TaskSlot> = plan.iter().map(|t| t.slot).collect();
            slots.extend(s.adapters().pinned_tasks().iter().copied());
            let pages: u64 = slots
                .iter()
                .map(|&i| u64::from(cache.tasks()[i.index()].pages))
                .sum();
            if pages > u64::from(cache.max_device_pages()) {
                return Err(format!(
                    "batch + pinned adapters need {pages} device pages of {}",
                    cache.max_device_pages()
                )
                .into());
            }
            for t in &plan {
                if !cache.tasks()[t.slot.index()].on_device {
                    return Err(format!("task {} not on device after ensure_batch", t.id.0).into());
                }
            }
        }
        Ok(())
    }

    /// A request's caches stay together: with a joint draft pool the draft cache is in the target's
    /// state (none, active or suspended); with an unpaired one, a request that holds no target cache
    /// holds no mirror either.
    fn check_pairing(&self) -> Result<(), Violation> {
        let kv = self.sched.kv();
        let Some((mode, draft)) = kv.draft_pool() else {
            return Ok(());
        };
        for (h, e) in self.sched.requests() {
            let r = KvRef {
                slot: h.index(),
                id: e.spec().id,
            };
            let t = (
                kv.target().cache(r).exists(),
                kv.target().cache(r).is_active(),
            );
            let d = (draft.cache(r).exists(), draft.cache(r).is_active());
            let together = match mode {
                DraftMode::Joint => t == d,
                DraftMode::Unpaired => t.0 || !d.0,
            };
            if !together {
                return Err(format!(
                    "request {}: target (cache, active) {t:?} but {mode:?} draft {d:?}",
                    r.id.0
                )
                .into());
            }
        }
        Ok(())
    }

    /// Checks the invariants that hold between operations, and the model.
    /// Applies the adapter cache's host-copy changes as a binding would, refusing an impossible one (a
    /// drop of a copy not held, a fill of one held), then checks that the copies held are exactly the
    /// tasks the cache keeps on the host.
    fn follow_host_copies(&mut self) -> Result<(), Violation> {
        let mut changes = Vec::new();
        self.sched
            .take_adapter_host_changes(|t, c| changes.push((t.slot, c)));
        for (slot, change) in changes {
            let held = self.host_copies.contains(&slot);
            match change {
                HostChange::Dropped if held => {
                    self.host_copies.remove(&slot);
                }
                HostChange::Filled if !held => {
                    self.host_copies.insert(slot);
                }
                HostChange::Replaced if held => {}
                other => {
                    return Err(format!(
                        "adapter slot {slot}: host change {other:?} with a copy held: {held}"
                    )
                    .into())
                }
            }
        }
        if let Some(p) = &self.sched.adapters().backend().inner {
            let on_host: BTreeSet<TaskSlot> = p
                .tasks()
                .iter()
                .enumerate()
                .filter(|(_, t)| t.on_host)
                .map(|(i, _)| TaskSlot(i as u16))
                .collect();
            if on_host != self.host_copies {
                return Err(format!(
                    "adapter host copies {:?}, the cache keeps {on_host:?}",
                    self.host_copies
                )
                .into());
            }
        }
        Ok(())
    }

    /// Compares the scheduler with the model and checks the invariants of DESIGN.md §7 (the module
    /// docs list them); `Err` describes the first broken one.
    pub fn check(&self) -> Result<(), Violation> {
        let s = &self.sched;
        for (role, p) in pools(s) {
            p.inner
                .state()
                .map_err(|e| format!("{role} KV pool's state group: {}", e.0))?;
            for (g, (_, pool)) in p.inner.groups().into_iter().enumerate() {
                if !pool.audit(&mut vec![0; pool.config().page_info_len()]) {
                    return Err(format!(
                        "{role} KV pool (group {g}) audit failed (page conservation, reference counts, prefix cache)"
                    )
                    .into());
                }
                // The check mode's spot checks agree with the audit on a sound pool.
                let slots = 0..u16::try_from(pool.config().slots).unwrap_or(u16::MAX);
                if !pool.check_counts() || !slots.clone().all(|r| pool.check_row(r, 0)) {
                    return Err(format!(
                        "{role} KV pool (group {g}): a spot check failed where the audit passed"
                    )
                    .into());
                }
            }
        }
        if !s.check_requests(0..u16::try_from(N).unwrap_or(u16::MAX)) {
            return Err("a request's spot check failed".into());
        }
        self.check_pairing()?;
        // Requests: exactly the model's, in arrival order.
        let got: Vec<u64> = s.requests().map(|(_, e)| e.spec().id.0).collect();
        let want: Vec<u64> = self.live.iter().map(|l| l.id).collect();
        if got != want || s.len() != want.len() {
            return Err(format!("live requests {got:?}, model {want:?}").into());
        }
        for l in &self.live {
            if self.finished.contains(&l.id) || self.removed.contains(&l.id) {
                return Err(format!("request {} is live and gone", l.id).into());
            }
        }
        let (active, paused) = self.check_requests()?;
        if !s.check() {
            return Err("the scheduler's table or lease invariants are broken".into());
        }
        self.check_leases(&active, &paused)
    }

    /// Each live request against the model (handle, phase, position, marks) and its residency against
    /// the KV pool; the LoRA requests holding a lease (active) and those paused on their task, per task.
    fn check_requests(&self) -> Result<([u32; T], [u32; T]), Violation> {
        let s = &self.sched;
        let recompute_pending: BTreeSet<u64> = if self.out_pending {
            self.out
                .recompute_paused()
                .iter()
                .filter_map(|l| s.get(l.handle()).ok().map(|e| e.spec().id.0))
                .collect()
        } else {
            BTreeSet::new()
        };
        let mut active = [0u32; T];
        let mut paused = [0u32; T];
        for (l, (h, e)) in self.live.iter().zip(s.requests()) {
            if h != l.handle {
                return Err(format!("request {}: handle changed", l.id).into());
            }
            let sp = e.spec();
            let pending_reset = recompute_pending.contains(&l.id);
            if !pending_reset && (sp.phase != l.phase || sp.position != l.position) {
                return Err(format!(
                    "request {}: {:?} at {}, model {:?} at {}",
                    l.id, sp.phase, sp.position, l.phase, l.position
                )
                .into());
            }
            if e.inflight() != l.inflight {
                return Err(format!("request {}: in-flight mark lost", l.id).into());
            }
            if e.pending_load() != l.loading {
                return Err(format!("request {}: pending-load mark lost", l.id).into());
            }
            self.check_residency(h, e.ownership(), sp, pending_reset)?;
            let r = KvRef {
                slot: h.index(),
                id: sp.id,
            };
            self.check_groups(l, r, false)?;
            if let Some(t) = e.task() {
                match e.ownership() {
                    Ownership::Active | Ownership::Resumed => active[t.slot.index()] += 1,
                    Ownership::Paused | Ownership::Recompute => paused[t.slot.index()] += 1,
                    Ownership::Waiting | Ownership::Sending => {}
                }
            }
        }
        Ok((active, paused))
    }

    /// Request `r` was scheduled a step writing `written` positions (from `start` for a context chunk,
    /// else from where its last step ended): the model follows it, and its window groups hold exactly
    /// that step's windows.
    fn stepped(&mut self, r: KvRef, start: Option<u32>, written: u32) -> Result<(), Violation> {
        let m = self.live.iter_mut().find(|m| m.id == r.id.0);
        let m = m.ok_or(format!("request {} not in the model", r.id.0))?;
        m.step_start = start.unwrap_or(m.frontier);
        m.frontier = m.step_start + written;
        let m = m.clone();
        self.check_groups(&m, r, true)?;
        let groups = self.sched.kv().target().inner.groups();
        let released: u32 = groups
            .iter()
            .skip(1)
            .map(|(_, g)| g.seq(r.slot).released)
            .sum();
        self.stats.released += u64::from(released);
        Ok(())
    }

    /// Request `r`'s KV groups agree with the leader (cache state and capacity in every group), and
    /// each sliding-window group keeps its window rule: it never gave up a block the first query that
    /// may still run reads; right after a pass that scheduled a step (`scheduled`), it holds
    /// nothing wholly before that query's window, and at most `window / tpb + 1` pages plus what the
    /// step adds (not under GUARANTEED_NO_EVICT, whose reservation holds the whole request).
    fn check_groups(&self, l: &Live, r: KvRef, scheduled: bool) -> Result<(), Violation> {
        let groups = self.sched.kv().target().inner.groups();
        let (_, lead) = groups[0];
        let (state, seq) = (lead.cache(r), lead.seq(r.slot));
        let tpb = self.setup.tokens_per_block;
        for (g, &(attention, pool)) in groups.iter().enumerate().skip(1) {
            let s = pool.seq(r.slot);
            if pool.cache(r) != state || s.capacity != seq.capacity {
                return Err(format!(
                    "request {}: group {g} {:?} of {} tokens, the leader {state:?} of {}",
                    l.id,
                    pool.cache(r),
                    s.capacity,
                    seq.capacity
                )
                .into());
            }
            let Attention::Sliding { window } = attention else {
                continue;
            };
            if !state.exists() {
                continue;
            }
            // The blocks wholly before the window of the step's first query.
            let outside = (l.step_start + 1).saturating_sub(window) / tpb;
            let held = s.blocks - s.released;
            let bound =
                window / tpb + 1 + s.capacity.saturating_sub(l.step_start + 1).div_ceil(tpb);
            let kept = scheduled && (s.released < outside || held > bound);
            if s.released > outside || kept {
                return Err(format!(
                    "request {}: window group {g} (window {window}) released {} of {} blocks, holds {held} (bound {bound}); its step's first query at {} reads from block {outside}",
                    l.id, s.released, s.blocks, l.step_start
                )
                .into());
            }
        }
        Ok(())
    }

    /// A request's ownership follows its target cache (a cross cache may outlive a preemption).
    fn check_residency(
        &self,
        h: Handle,
        own: Ownership,
        sp: &RequestSpec,
        pending_reset: bool,
    ) -> Result<(), Violation> {
        let r = KvRef {
            slot: h.index(),
            id: sp.id,
        };
        let pool = self.sched.kv().target().inner.leader();
        let (has, act) = (pool.cache(r).exists(), pool.cache(r).is_active());
        let ok = match own {
            Ownership::Waiting => {
                let fresh = matches!(sp.phase, Phase::ContextInit | Phase::DisaggGenerationInit);
                !has && sp.position == 0 && fresh
            }
            // Pinned for its send, no lease.
            Ownership::Sending => act && sp.phase == Phase::DisaggContextTransInProgress,
            // A resumed request stays Resumed until the engine takes the page moves.
            Ownership::Active => act,
            Ownership::Resumed => act && self.out_pending,
            Ownership::Paused => has && !act,
            Ownership::Recompute => {
                !has && (pending_reset || (sp.position == 0 && sp.phase == Phase::ContextInit))
            }
        };
        if !ok {
            return Err(format!(
                "request {} is {own:?} ({:?} at {}) but its KV has_cache={has} active={act}",
                sp.id.0, sp.phase, sp.position
            )
            .into());
        }
        Ok(())
    }

    /// Leases = device refcount = active LoRA requests (`active`, per task slot); paused registrations =
    /// suspended ones (`paused`); with unified paging, the KV pool's pins are the leases.
    fn check_leases(&self, active: &[u32; T], paused: &[u32; T]) -> Result<(), Violation> {
        let s = &self.sched;
        let desk = s.adapters();
        let Some(cache) = &desk.backend().inner else {
            if (0..T as u16).any(|i| desk.leases(TaskSlot(i)) != 0) || desk.pinned_pages() != 0 {
                return Err("leases without an adapter cache".into());
            }
            if s.requests().any(|(_, e)| e.task().is_some()) {
                return Err("a request has a task without an adapter cache".into());
            }
            return Ok(());
        };
        if !cache.check() {
            return Err("adapter cache invariants broken".into());
        }
        let mut pinned = 0u32;
        for (i, t) in cache.tasks().iter().enumerate() {
            let leases = desk.leases(TaskSlot(i as u16));
            if leases != t.active || leases != active[i] {
                return Err(format!(
                    "task {}: {leases} leases, device refcount {}, {} active requests",
                    t.id.0, t.active, active[i]
                )
                .into());
            }
            if t.paused != paused[i] {
                return Err(format!(
                    "task {}: {} paused registrations, {} suspended requests",
                    t.id.0, t.paused, paused[i]
                )
                .into());
            }
            // Unified paging: the KV pool's pins on the adapter are its leases.
            if let Some(a) = s.kv().target().inner.leader().adapter(TaskSlot(i as u16)) {
                if a.pins() != leases || (leases > 0 && !a.resident()) {
                    return Err(format!(
                        "task {}: {leases} leases, {} pins in the KV pool (resident {})",
                        t.id.0,
                        a.pins(),
                        a.resident()
                    )
                    .into());
                }
            }
            if leases > 0 {
                pinned += t.pages;
            }
        }
        if desk.pinned_pages() != pinned {
            return Err(format!(
                "desk pins {} pages, leases pin {pinned}",
                desk.pinned_pages()
            )
            .into());
        }
        Ok(())
    }

    /// Arrivals stop, faults and in-flight marks are cleared: every live request must then finish, or
    /// a pass must report `Error::Deadlock` — never a livelock past a generous bound. (A request limit of
    /// 0 schedules nothing and, with only context requests waiting, is idle by the reference's rules:
    /// skipped.)
    pub fn settle(&mut self) -> Result<Done, Violation> {
        for (_, p) in pools(&self.sched) {
            p.faults.clear();
        }
        self.sched.adapters().backend().faults.clear();
        if let Some(f) = &self.store_faults {
            f.clear();
        }
        for l in self.live.iter_mut().filter(|l| l.inflight || l.loading) {
            (l.inflight, l.loading) = (false, false);
            self.sched
                .set_inflight(l.handle, false)
                .map_err(|e| format!("set_inflight: {e}"))?;
            self.sched
                .set_pending_load(l.handle, false)
                .map_err(|e| format!("set_pending_load: {e}"))?;
        }
        if self.setup.max_num_requests == 0 {
            return Ok(Done::Finished(0));
        }
        let work: u64 = self
            .live
            .iter()
            .map(|l| u64::from(l.prompt) + 3 * u64::from(l.out_len) + 4)
            .sum();
        self.run_to_completion(64 + 16 * work)
    }

    /// With no request, pool `role` (group `g`) holds only free pages, cached blocks and idle adapters.
    fn check_empty(&self, role: &str, g: usize, pool: &KvPool<'_, Owned>) -> Result<(), Violation> {
        let (adapters, idle) = pool.adapter_usage();
        if adapters != idle {
            return Err(format!(
                "{role} pool: {} adapter pages pinned with no request",
                adapters - idle
            )
            .into());
        }
        let gpu = pool.gpu_free() + pool.cached_pages(Tier::Gpu) + adapters;
        let host = pool.host_free() + pool.cached_pages(Tier::Host);
        let want = self.setup.group_gpu_pages(g);
        if gpu != want || host != self.setup.host_pages {
            return Err(format!(
                "{role} pool (group {g}) pages leaked: {gpu} of {want} GPU and {host} of {} host pages free or cached with no request",
                self.setup.host_pages
            ).into());
        }
        Ok(())
    }

    /// Slot `slot` has KV in some group of some pool.
    fn holds_kv(&self, slot: u16) -> bool {
        pools(&self.sched).any(|(_, p)| {
            p.inner
                .groups()
                .iter()
                .any(|(_, g)| g.seq(slot).state != SeqState::None)
        })
    }

    /// Removes every live request (the end of a run): afterwards every pool must be empty.
    pub fn drain(&mut self) -> Result<(), Violation> {
        while !self.live.is_empty() {
            self.remove(0, false)?;
            self.replay_kv_events()?;
            self.check()?;
        }
        // With no request, every page is free, holds a cached block nobody references (the audit
        // of `check` has counted the references: none) or an idle adapter (unified paging).
        for (role, p) in pools(&self.sched) {
            for (g, (_, pool)) in p.inner.groups().into_iter().enumerate() {
                self.check_empty(role, g, pool)?;
            }
        }
        if let Some(c) = &self.sched.adapters().backend().inner {
            if c.tasks().iter().any(|t| t.active != 0 || t.paused != 0) {
                return Err(format!("adapter registrations leaked: {:?}", c.tasks()).into());
            }
        }
        Ok(())
    }
}

/// Reads a [`Setup`] and an operation list from raw bytes (the fuzz target's input). Every byte string
/// decodes to something valid; missing bytes read as zero.
pub fn decode(data: &[u8]) -> (Setup, Vec<Op>) {
    let mut r = Bytes(data);
    let setup = decode_setup(&mut r);
    let mut ops = Vec::new();
    while !r.0.is_empty() && ops.len() < 4096 {
        ops.push(decode_op(&mut r));
    }
    (setup, ops)
}

/// The configuration a byte string starts with.
fn decode_setup(r: &mut Bytes<'_>) -> Setup {
    let gpu_pages = 4 + u32::from(r.byte() % 45);
    let host_pages = match r.byte() % 3 {
        0 => 0,
        _ => 1 + u32::from(r.byte() % 32),
    };
    let tokens_per_block = 1 + u32::from(r.byte() % 8);
    let max_blocks = 1 + u32::from(r.byte() % 24);
    let mode = r.byte();
    let chunk = match mode % 4 {
        0 => Chunk::Off,
        1 => Chunk::Fcfs,
        2 => Chunk::Force,
        _ => Chunk::Equal,
    };
    let no_evict = mode & 4 != 0;
    let recompute_pause = mode & 8 == 0;
    let prefix = mode & 16 != 0;
    let unit = 1 + u32::from(r.byte() % 16);
    let max_num_tokens = match r.byte() {
        0..=31 => None,
        b => Some(u32::from(b % 96)),
    };
    let max_num_requests = u32::from(r.byte() % 12);
    let peft = decode_peft(r, gpu_pages);
    let deadlock_threshold = 1 + u32::from(r.byte() % 16);
    let mut setup = Setup {
        gpu_pages,
        host_pages,
        tokens_per_block,
        max_blocks,
        chunk,
        unit,
        no_evict,
        recompute_pause,
        max_num_tokens,
        max_num_requests,
        peft,
        deadlock_threshold,
        prefix,
        draft: match (mode >> 5) & 3 {
            1 => Some(DraftMode::Joint),
            2 => Some(DraftMode::Unpaired),
            _ => None,
        },
        cross: mode & 0x80 != 0,
        admission: match r.byte() % 4 {
            0 => Admission::Fcfs,
            1 => Admission::VTC,
            2 => Admission::Priority,
            _ => Admission::Deadline {
                ttft: [0, 40, 200, 1000],
            },
        },
        connector: prefix && deadlock_threshold % 2 == 0,
        windows: Vec::new(),
        step_itl_us: (deadlock_threshold % 3 == 0).then_some(2 + u64::from(deadlock_threshold)),
        thrash_guard: deadlock_threshold % 4 == 1,
        shares: None,
        state: None,
    };
    // Draft bits 3 (no draft pool): KV groups.
    if (mode >> 5) & 3 == 3 {
        decode_groups(r, &mut setup);
        // No byte of its own either: a state group beside the groups for some of them.
        if deadlock_threshold % 5 == 0 {
            setup = setup.with_state(hybrid::StateSetup {
                gpu_slots: 1 + unit % 16,
                host_slots: max_num_requests,
                snapshot_slots: u32::from(mode & 3),
                interval_blocks: 1 + max_blocks % 3,
            });
        }
    }
    // No byte of its own, so that the seeds written before classes keep their meaning.
    setup.shares = (deadlock_threshold % 4 == 2).then(|| decode_shares(mode, &setup));
    setup
}

/// Service classes' shares for a decoded setup, from the bits of `b`: shares for classes 0 and 1
/// within the batch, the KV and the adapter pages.
fn decode_shares(b: u8, s: &Setup) -> [Share; SERVICE_CLASSES] {
    shares(
        b,
        s.max_num_requests,
        s.gpu_pages * s.tokens_per_block,
        s.peft.as_ref().map_or(0, |p| p.device_pages),
    )
}

/// Shares for classes 0 and 1 from the bits of `bits`: each a part (a half or a quarter) of the
/// batch's `requests`, of `kv_tokens` and of `adapter_pages`, within the batch together.
pub fn shares(
    bits: u8,
    requests: u32,
    kv_tokens: u32,
    adapter_pages: u32,
) -> [Share; SERVICE_CLASSES] {
    let part = |total: u32, bit: u8| total / if bits & bit != 0 { 2 } else { 4 };
    let first = Share {
        requests: part(requests, 1),
        kv_tokens: part(kv_tokens, 2),
        adapter_pages: part(adapter_pages, 4),
    };
    let second = Share {
        requests: part(requests, 8).min(requests - first.requests) / 2,
        kv_tokens: part(kv_tokens, 16) / 2,
        adapter_pages: part(adapter_pages, 32) / 2,
    };
    [first, second, Share::default(), Share::default()]
}

/// KV groups for a decoded setup, from one more byte: 2 or 3 groups, windows of 1–3 pages, each
/// window group's GPU pages either what one request can hold or the target's; the setup drops what
/// groups do not take ([`Setup::with_groups`]).
fn decode_groups(r: &mut Bytes<'_>, s: &mut Setup) {
    let g = r.byte();
    let least = s.max_blocks.min(s.gpu_pages);
    let count = 1 + usize::from(g & 1);
    let windows = (0..count)
        .map(|i| {
            let bits = g >> (1 + 3 * i);
            WindowGroup {
                pages: 1 + u32::from(bits % 3),
                gpu_pages: if bits & 4 == 0 { least } else { s.gpu_pages },
            }
        })
        .collect();
    *s = s.clone().with_groups(windows);
}

/// The adapter cache of a decoded setup (with unified paging a task's pages are capped by `gpu_pages`).
fn decode_peft(r: &mut Bytes<'_>, gpu_pages: u32) -> Option<PeftSetup> {
    if r.byte() % 2 == 0 {
        None
    } else {
        let device_pages = 1 + u32::from(r.byte() % 12);
        let host_pages = 1 + u32::from(r.byte() % 16);
        let unified = device_pages % 3 == 0;
        let device = if unified { gpu_pages } else { device_pages };
        let cap = device.min(host_pages);
        let tasks = 1 + r.byte() as usize % T;
        let task_pages = (0..tasks).map(|_| 1 + u32::from(r.byte()) % cap).collect();
        Some(PeftSetup {
            device_pages,
            host_pages,
            task_pages,
            unified,
        })
    }
}

/// One decoded operation.
fn decode_op(r: &mut Bytes<'_>) -> Op {
    let b = r.byte();
    match b % 16 {
        0..=3 => decode_submit(r, b),
        4..=8 => Op::Pass,
        9 | 10 => Op::Complete,
        11 if b & 0x80 != 0 => Op::EndTransfer {
            pick: r.byte(),
            delivered: b & 0x40 == 0,
        },
        11 => Op::Finish { pick: r.byte() },
        12 if b & 0x80 != 0 => Op::Disagg {
            prompt: 1 + u32::from(r.byte()) % 96,
            out_len: 1 + u32::from(r.byte() % 24),
            lora: {
                let l = r.byte();
                (l & 0x80 != 0).then_some(l % (T as u8 + 2))
            },
            generation: b & 0x40 != 0,
        },
        12 => Op::Cancel { pick: r.byte() },
        13 => decode_inject(r),
        14 if b & 0x80 != 0 => Op::Load { pick: r.byte() },
        14 if b & 0x40 != 0 => Op::Fork {
            pick: r.byte(),
            out_len: r.byte() % 24,
        },
        14 => Op::Inflight { pick: r.byte() },
        _ => Op::Update {
            pick: r.byte(),
            beam: r.byte() % 3,
            draft: r.byte() % 3,
        },
    }
}

/// A decoded submission (`b`: the operation's byte; its top bit makes the id a duplicate).
fn decode_submit(r: &mut Bytes<'_>, b: u8) -> Op {
    Op::Submit {
        prompt: 1 + u32::from(r.byte()) % 96,
        out_len: 1 + u32::from(r.byte() % 24),
        lora: {
            let l = r.byte();
            (l & 0x80 != 0).then_some(l % (T as u8 + 2))
        },
        draft: match r.byte() % 8 {
            0 => 1,
            1 => 3,
            _ => 0,
        },
        snap_every: r.byte() % 24,
        duplicate: b & 0x80 != 0,
        family: {
            let f = r.byte();
            (f & 0x80 != 0).then_some(f % 3 + 1)
        },
        encoder: match r.byte() {
            e if e & 0x80 != 0 => 1 + e % 16,
            _ => 0,
        },
    }
}

/// A decoded fault injection: the fault, how many calls it refuses, in which pool.
fn decode_inject(r: &mut Bytes<'_>) -> Op {
    let f = r.byte();
    Op::Inject {
        fault: match f % 8 {
            0 => Fault::KvPrepare,
            1 => Fault::KvResize,
            2 => Fault::KvAllocate,
            3 => Fault::PeftAdd,
            4 => Fault::KvPin,
            5 => Fault::LoadFail,
            6 => Fault::LoadHang,
            _ => Fault::SaveHang,
        },
        count: 1 + (f >> 2) % 8,
        pool: (f >> 5) % 3,
    }
}

struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn byte(&mut self) -> u8 {
        match self.0.split_first() {
            Some((&b, rest)) => {
                self.0 = rest;
                b
            }
            None => 0,
        }
    }
}

/// Runs a decoded input: applies every operation (checking after each), settles (every request
/// finishes or a deadlock is reported), then drains.
pub fn run(setup: Setup, ops: &[Op]) -> Result<Stats, Violation> {
    let (mut mem, mut twin_mem) = (setup.memory(), setup.memory());
    let mut h = Harness::new(setup.clone(), &mut mem)?;
    // The differential check: a twin whose every pass is a full one, given the same operations,
    // must be in the same state after each, and its outputs the same.
    let mut full = Harness::new(setup, &mut twin_mem)?;
    full.sched.set_incremental(false);
    // A persistent batch kept from the batch deltas alone, after every pass.
    let (mut batch, mut delta) = (BTreeMap::new(), kvsched_core::delta::BatchDelta::new());
    for (i, op) in ops.iter().enumerate() {
        let passes = h.stats.passes;
        h.apply(op).map_err(|e| format!("op {i} {op:?}: {e}"))?;
        full.apply(op)
            .map_err(|e| format!("op {i} {op:?} (full passes only): {e}"))?;
        same_as_full(&h, &full).map_err(|e| format!("op {i} {op:?}: {e}"))?;
        if h.stats.passes > passes && h.out.pass() > 0 {
            follow_delta(&mut h, &mut delta, &mut batch)
                .map_err(|e| format!("op {i} {op:?}: batch delta: {e}"))?;
        }
    }
    h.settle()
        .map_err(|e| format!("settling after {} ops: {e}", ops.len()))?;
    h.drain()?;
    h.stats.replayed = h.sched.replayed_passes();
    h.stats.state = h.sched.kv().target().inner.state_stats();
    Ok(h.stats)
}

/// The batch of an output as a persistent batch holds it: (slot, version) to its list (0 context,
/// 1 generation, 2 encoder).
fn batch_of(o: &SchedulerOutput<N>) -> BTreeMap<(u16, u32), u8> {
    let key = |l: &Listed| (l.slot(), l.handle().version());
    let ctx = o.context().iter().map(|c| (key(&c.listed), 0));
    ctx.chain(o.generation().iter().map(|l| (key(l), 1)))
        .chain(o.encoder().iter().map(|l| (key(l), 2)))
        .collect()
}

/// Applies the scheduler's batch delta to `batch` (what an engine's persistent batch does), which must
/// then be the output's batch; a request in both that is not `changed` kept its list as a decode step.
fn follow_delta(
    h: &mut Harness<'_>,
    delta: &mut kvsched_core::delta::BatchDelta<N>,
    batch: &mut BTreeMap<(u16, u32), u8>,
) -> Result<(), Violation> {
    h.sched
        .take_delta(&h.out, delta)
        .map_err(|e| format!("refused: {e}"))?;
    let key = |l: &Listed| (l.slot(), l.handle().version());
    let now = batch_of(&h.out);
    let changed: BTreeSet<_> = delta.changed().iter().map(key).collect();
    // A chunk is always news: a context entry in both batches is `changed`.
    if let Some(k) = now
        .iter()
        .find(|&(k, &list)| list == 0 && batch.contains_key(k) && !changed.contains(k))
    {
        return Err(format!("{k:?}: a chunk in both batches is not listed as changed").into());
    }
    for l in delta.left() {
        if batch.remove(&key(l)).is_none() || now.contains_key(&key(l)) {
            return Err(format!("{l:?} left, but was not in the batch or still is").into());
        }
    }
    let list = |l: &Listed| {
        now.get(&key(l))
            .copied()
            .ok_or_else(|| Violation::from(format!("{l:?} is in the delta, not in the batch")))
    };
    for l in delta.changed() {
        if batch.insert(key(l), list(l)?).is_none() {
            return Err(format!("{l:?} changed, but was not in the batch").into());
        }
    }
    for l in delta.entered() {
        if batch.insert(key(l), list(l)?).is_some() {
            return Err(format!("{l:?} entered, but was in the batch").into());
        }
    }
    if *batch != now {
        return Err(format!("the batch kept from deltas {batch:?}, the output's {now:?}").into());
    }
    Ok(())
}

/// The differential check: the incremental scheduler `h` and its twin `full` (every pass a full one)
/// are in the same state — the scheduler's, every pool's and the adapter cache's fingerprints — and
/// their last outputs are equal, list by list.
pub fn same_as_full(h: &Harness<'_>, full: &Harness<'_>) -> Result<(), Violation> {
    if fingerprint(&h.sched) != fingerprint(&full.sched) {
        return Err(format!(
            "the incremental scheduler's state is not the full passes' (after {} passes, {} incremental)",
            h.stats.passes,
            h.sched.replayed_passes()
        )
        .into());
    }
    same_output(&h.out, &full.out)
}

/// Two outputs are equal, every list, the adapter plan and loads, the pass number.
pub fn same_output<const M: usize>(
    a: &SchedulerOutput<M>,
    b: &SchedulerOutput<M>,
) -> Result<(), Violation> {
    let lists = |o: &SchedulerOutput<M>| {
        (
            o.context().to_vec(),
            [
                o.generation(),
                o.encoder(),
                o.paused(),
                o.recompute_paused(),
                o.disagg(),
                o.resumed(),
            ]
            .map(<[_]>::to_vec),
            o.adapters().to_vec(),
            o.adapter_loads().to_vec(),
            o.has_chunking(),
            o.pass(),
        )
    };
    if lists(a) != lists(b) {
        return Err(format!(
            "the incremental pass's output differs from the full pass's:\n  incremental {:?}\n  full        {:?}",
            lists(a),
            lists(b)
        )
        .into());
    }
    Ok(())
}
