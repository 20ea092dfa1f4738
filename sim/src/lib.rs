//! # kvsched-sim
//!
//! The simulated engine around the real scheduler: each iteration runs the real pass on the real
//! fixed-capacity backends, advances simulated time by a cost model of the forward pass ([`cost`]),
//! completes the step (positions advance, tokens are generated, requests finish, recompute-paused requests
//! replay) and admits the arrivals whose time has come. The scheduler's own wall time per iteration is
//! measured for real.
//!
//! The workloads come from `kvsched-workload`; the report is a table, a JSON document and (feature `plot`,
//! on by default) an SVG timeline drawn by [`plot`](mod@plot). The command line (`kvsched simulate`,
//! `kvsched cost`) lives in the `kvsched` binary: this crate's errors are typed ([`SimError`],
//! [`OptionsError`]) and the binary words them in terms of its flags.
#![deny(missing_docs)]

mod backend;
pub mod block_hashes;
pub mod check;
pub mod classes;
pub mod cluster;
pub mod cost;
pub mod disagg;
pub mod fairness;
pub mod faults;
pub mod fit;
pub mod groups;
pub mod hybrid;
pub mod kv_router;
#[cfg(feature = "plot")]
pub mod plot;
pub mod report;
mod run_loop;
pub mod starvation;
pub mod stats;
pub mod sweep;

use kvsched_core::adapter_pool::AdapterPool;
use kvsched_core::config::{Admission, CapacityPolicy, ChunkPolicy, Chunking, Config, Window};
use kvsched_core::ids::TaskId;
use kvsched_core::kv_set::{DraftMode, KvSet};
use kvsched_core::output::SchedulerOutput;
use kvsched_core::page_pool::{KvPool, KvPoolConfig};
use kvsched_core::scheduler::{Handle, Scheduler};
use kvsched_core::storage::{Boxed, Owned};

use kvsched_workload::popularity::{
    pages_for_rank, AdapterRanks, AdapterSampler, PopularityError, PopularityLaw,
};
use kvsched_workload::Workload;

pub use cost::{CostModel, Engine, StepWork};
pub use report::Report;

/// Live requests the simulated engine hands the scheduler at once (more wait in the engine's queue).
pub const MAX_LIVE: usize = 1024;
/// Most adapters a simulation can use.
pub const MAX_ADAPTERS: usize = 1024;

/// The simulated engine's scheduler on KV backend `K`: its arrays on the heap (`Boxed`), so the value
/// is small.
type Sched<'a, K = backend::Target<'a>> =
    Scheduler<K, AdapterPool<MAX_ADAPTERS>, MAX_LIVE, MAX_ADAPTERS, Boxed>;
type Out = SchedulerOutput<MAX_LIVE, Boxed>;

/// Adapter (multi-LoRA) settings.
#[derive(Debug, Clone, PartialEq)]
pub struct AdapterOptions {
    /// Number of adapters (0 = no LoRA).
    pub count: u32,
    /// Popularity law.
    pub law: PopularityLaw,
    /// Ranks, assigned round-robin by adapter id.
    pub ranks: AdapterRanks,
    /// Pages of a rank-8 adapter (pages grow linearly with rank).
    pub pages_per_rank8: u32,
    /// Device adapter pages.
    pub device_pages: u32,
    /// Host adapter pages.
    pub host_pages: u32,
    /// Unified paging (`--adapter-paging unified`, S-LoRA): the adapter cache's device pages join the
    /// KV pool, one page space for KV and adapters (an adapter page is a KV page); the split default
    /// keeps two fixed pools, as the reference.
    pub unified: bool,
}

/// Everything a simulation run needs besides the workload.
#[derive(Debug, Clone, PartialEq)]
pub struct SimOptions {
    /// GPU KV pages.
    pub kv_gpu_pages: u32,
    /// Host KV pages (0 = no host tier).
    pub kv_host_pages: u32,
    /// Tokens per KV page.
    pub tokens_per_block: u32,
    /// Token budget per iteration.
    pub max_tokens: u32,
    /// Request limit per iteration.
    pub max_batch: u32,
    /// Capacity policy.
    pub policy: CapacityPolicy,
    /// Chunked prefill (None = whole prompts).
    pub chunking: Option<Chunking>,
    /// Recompute pause and preemption allowed.
    pub recompute_pause: bool,
    /// Adapters.
    pub adapters: AdapterOptions,
    /// Cost model.
    pub cost: CostModel,
    /// The preset it started from (reports name it).
    pub engine: Engine,
    /// Service-level objectives for goodput: time to first token and time per output token, in
    /// milliseconds (`None`: unconstrained).
    pub slo_ttft_ms: Option<f64>,
    /// See `slo_ttft_ms`.
    pub slo_tpot_ms: Option<f64>,
    /// Seed (adapter assignment).
    pub seed: u64,
    /// Verify invariants (`check.rs`): the spot checks after every iteration, the exact audit every
    /// `check_every` iterations and at the end of the run.
    pub check: bool,
    /// Iterations between two exact audits under `check` (1: after every iteration, `--check=full`).
    pub check_every: u64,
    /// Every pass a full one: the incremental pass off (`--full-passes`). `check` runs a twin of the
    /// simulation with it and compares every pass.
    pub full_passes: bool,
    /// Show a progress bar on a terminal.
    pub progress: bool,
    /// Deadlock threshold (stalled passes).
    pub deadlock_threshold: u32,
    /// Prefix reuse: a prefix cache in the KV pool, prompts hashed from the trace's prefix blocks (or
    /// the conversation generator's, `workload::sessions`).
    pub prefix_reuse: bool,
    /// Speculative decoding: draft tokens per step and the probability that each is accepted (a step
    /// keeps the accepted run of drafts plus one token); a joint draft pool holds the draft model's KV.
    pub spec_decode: Option<SpecDecode>,
    /// GPU pages of the joint draft pool (0: as many as the target's GPU tier; its host tier is the
    /// target's size).
    pub draft_kv_pages: u32,
    /// The order of admissions (`--admission`). Under `Deadline`, a request's class is its adapter id
    /// modulo 4 (the base model's: 0) and its arrival is in microseconds.
    pub admission: Admission,
    /// Passes a request may be refused its adapter under a fair policy before admissions drain
    /// (`--drain-after`; 0 never drains).
    pub drain_after: u32,
    /// Engines behind the router (`--replicas`), each with its own scheduler and pools.
    pub replicas: u32,
    /// How the router spreads the requests over the replicas (`--route`).
    pub route: cluster::Route,
    /// `--route kv`: the weight of the prefill blocks in the router's cost (`kv_router.rs`; Dynamo's
    /// default 1.0), finite and at least 0.
    pub kv_overlap_weight: f64,
    /// A KV store the replicas share (`--remote-store`), attached to every engine's pool as its KV
    /// connector.
    pub remote_store: Option<cluster::RemoteStoreOptions>,
    /// Prefill/decode disaggregation (`--disagg P:D`): `P` prefill engines hand their requests' KV to
    /// `D` decode engines (instead of `replicas` mixed ones).
    pub disagg: Option<disagg::DisaggOptions>,
    /// The remote store's faults (`--store-faults`, `faults.rs`; needs `remote_store`).
    pub store_faults: Option<faults::StoreFaults>,
    /// The disaggregation link's faults (`--link-faults`, `faults.rs`; needs `disagg`).
    pub link_faults: Option<faults::LinkFaults>,
    /// KV groups (`groups.rs`): the KV pool (`kv_gpu_pages`, `kv_host_pages`) is a hybrid-attention
    /// model's full-attention group, beside a sliding-window group of its own pages (`None`: one pool,
    /// every layer full attention).
    pub kv_groups: Option<groups::KvGroupsOptions>,
    /// A hybrid recurrent model (`hybrid.rs`): `kv_gpu_pages` is the memory budget in pages of its
    /// full-attention twin, split into attention pages and state slots (`None`: no hybrid).
    pub hybrid: Option<hybrid::HybridOptions>,
    /// Samples of each request (`--samples N`, OpenAI's `n`; issue 44): once a request's prompt is
    /// computed its other `N - 1` samples are forked off it (`Scheduler::fork`), sharing its full
    /// pages; needs the prefix cache. 1: none.
    pub samples: u32,
    /// Two priority classes (`--priority-mix SHARE`, issue 45): that share of the requests (by
    /// arrival index, `classes::is_high`) is of priority 0, the rest 1; the report gives each class's
    /// TTFT, TPOT and goodput. `None`: priorities as `--admission deadline` sets them.
    pub priority_mix: Option<f64>,
    /// The thrash guard (`--thrash-guard`; `Config::thrash_guard`).
    pub thrash_guard: bool,
    /// The high class's share (`--class-share`; `Config::shares`, class 0): with `priority_mix`,
    /// requests carry their class as their service class.
    pub class_share: Option<kvsched_core::config::Share>,
}

/// Speculative decoding settings (`--spec-decode K:ACCEPT`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SpecDecode {
    /// Draft tokens per decode step.
    pub drafts: u32,
    /// Probability that one draft token is accepted (given the ones before it were).
    pub accept: f64,
}

impl Default for SimOptions {
    fn default() -> Self {
        Self {
            kv_gpu_pages: Engine::DEFAULT
                .kv_gpu_pages(32)
                .unwrap_or(cost::LEGACY_KV_GPU_PAGES),
            kv_host_pages: 4096,
            tokens_per_block: 32,
            max_tokens: 8192,
            max_batch: 256,
            policy: CapacityPolicy::MaxUtilization,
            chunking: Some(Chunking {
                policy: ChunkPolicy::FirstComeFirstServed,
                unit: 64,
            }),
            recompute_pause: true,
            adapters: AdapterOptions {
                count: 32,
                law: PopularityLaw::Power { alpha: 0.8 },
                ranks: AdapterRanks::new(vec![8, 16, 32, 64]).unwrap_or_else(|_| unreachable!()),
                pages_per_rank8: 2,
                device_pages: 64,
                host_pages: 1024,
                unified: false,
            },
            cost: Engine::DEFAULT.model(32),
            engine: Engine::DEFAULT,
            slo_ttft_ms: None,
            slo_tpot_ms: None,
            seed: 1,
            check: false,
            check_every: check::DEFAULT_AUDIT_EVERY,
            full_passes: false,
            progress: true,
            deadlock_threshold: 1000,
            prefix_reuse: true,
            samples: 1,
            priority_mix: None,
            thrash_guard: false,
            class_share: None,
            spec_decode: None,
            draft_kv_pages: 0,
            admission: Admission::Fcfs,
            drain_after: 256,
            replicas: 1,
            route: cluster::Route::RoundRobin,
            kv_overlap_weight: kv_router::OVERLAP_WEIGHT,
            remote_store: None,
            disagg: None,
            store_faults: None,
            link_faults: None,
            kv_groups: None,
            hybrid: None,
        }
    }
}

/// The admission policy `--admission NAME` names: `fcfs`, `vtc` (VTC's weights 1 and 2) or
/// `deadline`, whose four classes (an adapter's id modulo 4) get 1, 2, 4 and 8 times the TTFT
/// objective (`--slo-ttft-ms`, else 500 ms) as their deadlines, in µs.
///
/// # Errors
///
/// [`UnknownAdmission`] for another name.
pub fn admission(name: &str, slo_ttft_ms: Option<f64>) -> Result<Admission, UnknownAdmission> {
    match name {
        "fcfs" => Ok(Admission::Fcfs),
        "vtc" => Ok(Admission::VTC),
        "priority" => Ok(Admission::Priority),
        "deadline" => {
            let us = slo_ttft_ms.unwrap_or(500.0) * 1000.0;
            Ok(Admission::Deadline {
                ttft: core::array::from_fn(|class| (us * (1u64 << class) as f64) as u64),
            })
        }
        other => Err(UnknownAdmission(other.to_owned())),
    }
}

/// An admission policy name [`admission`] does not know.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown admission policy {0:?} (fcfs, vtc, deadline, priority)")]
pub struct UnknownAdmission(pub String);

/// Why a simulation cannot run or stopped.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SimError {
    /// Options that cannot work together: what to change.
    #[error("options do not fit: {0}")]
    Options(#[from] OptionsError),
    /// The scheduler refused a call of the serving loop (a deadlock, a capacity it cannot meet).
    #[error("scheduler: {0}")]
    Scheduler(#[from] kvsched_core::Error),
    /// The adapters of a batch the pass scheduled could not be made resident (an invariant broken).
    #[error("scheduler: ensure-batch failed for a scheduled batch: {0}")]
    EnsureBatch(kvsched_core::error::PeftError),
    /// A disaggregated transfer ended for a request the scheduler no longer holds.
    #[error("scheduler: transfer of {arrival} not live")]
    TransferNotLive {
        /// The request (its arrival's index).
        arrival: usize,
    },
    /// The differential check (`--check`): a pass of the run did not do what the same pass of its
    /// twin, whose every pass is a full one, did.
    #[error("scheduler: pass {pass} differs from the full pass's (after {incremental} incremental passes); rerun with --full-passes to run without the incremental pass")]
    Differential {
        /// The first pass that differs (1-based, over the engines' passes in order).
        pass: u64,
        /// Passes of the run that were incremental.
        incremental: u64,
    },
    /// One engine of a cluster stopped.
    #[error("replica {replica}: {source}")]
    Replica {
        /// The engine's index.
        replica: usize,
        /// Why it stopped.
        source: Box<SimError>,
    },
}

/// Options that cannot work together, found before a run starts: each says which settings
/// ([`SimOptions`]' fields) to change. The `kvsched` binary words them in terms of its flags.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum OptionsError {
    /// `tokens_per_block` or `kv_gpu_pages` is 0.
    #[error("tokens_per_block and kv_gpu_pages must be at least 1")]
    NoKvPool,
    /// `max_batch` or `max_tokens` is 0.
    #[error("max_batch and max_tokens must be at least 1")]
    NoBudget,
    /// The chunk unit is 0 or larger than the token budget.
    #[error("the chunk unit ({unit}) must be between 1 and max_tokens ({max_tokens})")]
    ChunkUnit {
        /// The chunk unit.
        unit: u32,
        /// The token budget.
        max_tokens: u32,
    },
    /// Without chunking, the longest prompt exceeds the token budget.
    #[error("without chunking a {prompt}-token prompt never fits the {max_tokens}-token budget")]
    PromptOverBudget {
        /// The longest prompt.
        prompt: u32,
        /// The token budget.
        max_tokens: u32,
    },
    /// `--samples` is 0, or above 1 without the prefix cache (whose reference counts share a
    /// request's pages with its samples), or with a pool that cannot fork (a draft pool, KV groups,
    /// a remote store).
    #[error("--samples {0}: at least 1; above 1 it needs the prefix cache, one KV group, no draft pool and no remote store")]
    Samples(u32),
    /// The KV-aware router's overlap weight is negative or not finite.
    #[error("the KV router's overlap weight must be a finite number at least 0, got {0}")]
    OverlapWeight(f64),
    /// The KV page size and the workload's prefix blocks do not nest.
    #[error("tokens_per_block {tokens_per_block} does not nest with the workload's {block}-token prefix blocks")]
    PrefixBlocks {
        /// Tokens per KV page.
        tokens_per_block: u32,
        /// Tokens per prefix block of the workload.
        block: u32,
    },
    /// Speculative decoding's settings are out of range.
    #[error("speculative decoding {drafts}:{accept}: draft tokens between 1 and 64, acceptance between 0 and 1")]
    SpecDecode {
        /// Draft tokens per step.
        drafts: u32,
        /// Acceptance probability.
        accept: f64,
    },
    /// A request is longer than the whole draft pool.
    #[error("a request of {longest} tokens (prompt + output + drafts) is longer than the whole draft pool ({draft_pages} pages)")]
    OverDraftPool {
        /// Prompt + output + drafts of the longest request.
        longest: u64,
        /// GPU pages of the draft pool.
        draft_pages: u32,
    },
    /// A request is longer than the whole KV pool.
    #[error("a request of {longest} tokens (prompt + output) is longer than the whole KV pool ({pages} pages x {tokens_per_block} tokens = {pool_tokens})")]
    OverPool {
        /// Prompt + output (+ drafts) of the longest request.
        longest: u64,
        /// GPU KV pages.
        pages: u32,
        /// Tokens per page.
        tokens_per_block: u32,
        /// The pool's tokens.
        pool_tokens: u64,
    },
    /// The page tables would not fit in memory.
    #[error("page tables would take {mib} MiB ({MAX_LIVE} requests x {max_blocks} pages)")]
    PageTables {
        /// Their size.
        mib: u64,
        /// Pages of the longest table.
        max_blocks: u32,
    },
    /// More adapters than the simulator holds.
    #[error("at most {MAX_ADAPTERS} adapters")]
    TooManyAdapters,
    /// An adapter is larger than the adapter cache's device or host tier.
    #[error("adapter {id} (rank {rank}) needs {pages} pages but the adapter cache has {device_pages} device and {host_pages} host pages")]
    AdapterTooLarge {
        /// The adapter.
        id: u32,
        /// Its rank.
        rank: u32,
        /// Its pages.
        pages: u64,
        /// Device pages of the cache.
        device_pages: u32,
        /// Host pages of the cache.
        host_pages: u32,
    },
    /// Unified paging: the longest request does not fit beside the largest adapter.
    #[error("a request of {longest} tokens does not fit beside the largest adapter ({largest} pages) in the unified pool of {total} pages")]
    UnifiedNoRoom {
        /// Prompt + output (+ drafts) of the longest request.
        longest: u64,
        /// Pages of the largest adapter.
        largest: u64,
        /// Pages of the unified pool.
        total: u64,
    },
    /// Unified paging: the KV and adapter pages together overflow a page index.
    #[error("the unified pool has too many pages")]
    UnifiedTooLarge,
    /// The adapter popularity law cannot draw `count` adapters.
    #[error("{0}")]
    Popularity(#[from] PopularityError),
    /// The core refused the pools', the adapter cache's or the scheduler's geometry.
    #[error("{0}")]
    Setup(#[from] kvsched_core::Error),
    /// Disaggregation without a decode engine.
    #[error("disaggregation needs a decode engine")]
    NoDecodeEngine,
    /// Faults of a store or link the run does not have.
    #[error("{faults} needs {needs}")]
    FaultsWithout {
        /// The faults' option.
        faults: &'static str,
        /// The option they need.
        needs: &'static str,
    },
    /// KV groups with a feature they do not support yet.
    #[error("KV groups do not support {0} yet")]
    GroupsUnsupported(groups::GroupsUnsupported),
    /// A hybrid model's options that cannot work.
    #[error("{0}")]
    Hybrid(hybrid::HybridError),
    /// A sliding window of 0 tokens, or not a whole number of pages.
    #[error("a sliding window of {window} tokens must be a positive multiple of tokens_per_block ({tokens_per_block})")]
    GroupWindow {
        /// The window.
        window: u32,
        /// Tokens per KV page.
        tokens_per_block: u32,
    },
    /// The sliding-window group's GPU pages cannot hold one request's window and a chunk.
    #[error("the sliding-window group's {pages} GPU pages cannot hold one request's window and chunk ({needed} pages)")]
    WindowPoolTooSmall {
        /// GPU pages of the window group.
        pages: u32,
        /// Pages the longest request needs there at once.
        needed: u32,
    },
}

/// One request as the engine tracks it.
#[derive(Debug, Clone)]
struct Live {
    arrival: usize,
    handle: Handle,
    prompt0: u32,
    output: u32,
    generated: u32,
    first_token_ms: Option<f64>,
    last_token_ms: f64,
    /// Its next context chunk is a first chunk (admission, or replay after a recompute pause).
    first_chunk: bool,
    /// It was recompute-paused: its first chunk is a replay.
    replay: bool,
    /// Which of its arrival's samples (`--samples`): 0 the request itself, each other a fork.
    sample: u32,
}

/// Per-iteration samples for the plot.
#[derive(Debug, Clone, Default)]
pub struct Samples {
    /// Simulated seconds.
    pub t: Vec<f64>,
    /// Requests waiting (engine queue + not yet admitted).
    pub queue: Vec<f64>,
    /// Requests in the running batch.
    pub batch: Vec<f64>,
    /// GPU KV utilization, %.
    pub kv_gpu: Vec<f64>,
    /// Host KV utilization, %.
    pub kv_host: Vec<f64>,
    /// GPU pages holding cached prefix blocks no request holds (evictable), %.
    pub idle_gpu: Vec<f64>,
    /// Host pages holding cached prefix blocks no request holds, %.
    pub idle_host: Vec<f64>,
    /// Free GPU pages, %.
    pub free_gpu: Vec<f64>,
    /// Free host pages, %.
    pub free_host: Vec<f64>,
    /// Adapters resident on the device.
    pub adapters: Vec<f64>,
}

/// The pool geometry and the adapters' pages of a run of `w` under `o`, or why they cannot work.
fn check_options(o: &SimOptions, w: &Workload) -> Result<(KvPoolConfig, Vec<u32>), OptionsError> {
    check_budgets(o, w)?;
    let forks = o.prefix_reuse
        && o.spec_decode.is_none()
        && o.kv_groups.is_none()
        && o.hybrid.is_none()
        && o.remote_store.is_none();
    if o.samples == 0 || (o.samples > 1 && !forks) {
        return Err(OptionsError::Samples(o.samples));
    }
    check_faults(o)?;
    let drafts = check_spec_decode(o)?;
    let longest = w
        .arrivals
        .iter()
        .map(|a| a.prompt_tokens as u64 + a.output_tokens as u64 + drafts)
        .max()
        .unwrap_or(0);
    let mut max_blocks = check_pools(o, longest, drafts)?;
    if let Some(g) = &o.kv_groups {
        max_blocks = groups::check(o, g, longest, max_blocks)?;
    }
    let pages = adapter_pages(o)?;
    let gpu_pages = unified_gpu_pages(o, longest, &pages)?;
    let kv = KvPoolConfig {
        tokens_per_block: o.tokens_per_block,
        gpu_pages,
        host_pages: o.kv_host_pages,
        slots: MAX_LIVE as u32,
        max_blocks,
    };
    Ok((kv, pages))
}

/// Faults only of a store or link the run has.
fn check_faults(o: &SimOptions) -> Result<(), OptionsError> {
    if o.store_faults.is_some() && o.remote_store.is_none() {
        return Err(OptionsError::FaultsWithout {
            faults: "--store-faults",
            needs: "--remote-store",
        });
    }
    if o.link_faults.is_some() && o.disagg.is_none() {
        return Err(OptionsError::FaultsWithout {
            faults: "--link-faults",
            needs: "--disagg",
        });
    }
    Ok(())
}

/// The budgets, the chunking and the page size against the workload's prompts and prefix blocks.
fn check_budgets(o: &SimOptions, w: &Workload) -> Result<(), OptionsError> {
    if o.tokens_per_block == 0 || o.kv_gpu_pages == 0 {
        return Err(OptionsError::NoKvPool);
    }
    if !(o.kv_overlap_weight.is_finite() && o.kv_overlap_weight >= 0.0) {
        return Err(OptionsError::OverlapWeight(o.kv_overlap_weight));
    }
    if o.max_batch == 0 || o.max_tokens == 0 {
        return Err(OptionsError::NoBudget);
    }
    if let Some(c) = o.chunking {
        if c.unit == 0 || c.unit > o.max_tokens {
            return Err(OptionsError::ChunkUnit {
                unit: c.unit,
                max_tokens: o.max_tokens,
            });
        }
    } else if let Some(a) = w.arrivals.iter().max_by_key(|a| a.prompt_tokens) {
        if a.prompt_tokens > o.max_tokens {
            return Err(OptionsError::PromptOverBudget {
                prompt: a.prompt_tokens,
                max_tokens: o.max_tokens,
            });
        }
    }
    if o.prefix_reuse {
        let block = w
            .prefix_block_tokens
            .unwrap_or(kvsched_workload::sessions::BLOCK_TOKENS);
        if !block_hashes::compatible(block, o.tokens_per_block) {
            return Err(OptionsError::PrefixBlocks {
                tokens_per_block: o.tokens_per_block,
                block,
            });
        }
    }
    Ok(())
}

/// The draft tokens a decode step adds (0 without speculative decoding).
fn check_spec_decode(o: &SimOptions) -> Result<u64, OptionsError> {
    match o.spec_decode {
        None => Ok(0),
        Some(s) if s.drafts == 0 || s.drafts > 64 || !(0.0..=1.0).contains(&s.accept) => {
            Err(OptionsError::SpecDecode {
                drafts: s.drafts,
                accept: s.accept,
            })
        }
        Some(s) => Ok(u64::from(s.drafts)),
    }
}

/// The longest page table, once the longest request (`longest` tokens) fits the pools.
fn check_pools(o: &SimOptions, longest: u64, drafts: u64) -> Result<u32, OptionsError> {
    let pool_tokens = o.kv_gpu_pages as u64 * o.tokens_per_block as u64;
    if drafts > 0 && o.draft_kv_pages > 0 {
        let draft_tokens = o.draft_kv_pages as u64 * o.tokens_per_block as u64;
        if longest > draft_tokens {
            return Err(OptionsError::OverDraftPool {
                longest,
                draft_pages: o.draft_kv_pages,
            });
        }
    }
    if longest > pool_tokens {
        return Err(OptionsError::OverPool {
            longest,
            pages: o.kv_gpu_pages,
            tokens_per_block: o.tokens_per_block,
            pool_tokens,
        });
    }
    let max_blocks = (longest.div_ceil(o.tokens_per_block as u64)).max(1) as u32;
    let table = MAX_LIVE as u64 * max_blocks as u64 * 4;
    if table > 1 << 30 {
        return Err(OptionsError::PageTables {
            mib: table >> 20,
            max_blocks,
        });
    }
    Ok(max_blocks)
}

/// Each adapter's pages, once every one fits the adapter cache.
fn adapter_pages(o: &SimOptions) -> Result<Vec<u32>, OptionsError> {
    let a = &o.adapters;
    if a.count as usize > MAX_ADAPTERS {
        return Err(OptionsError::TooManyAdapters);
    }
    let device = if a.unified {
        o.kv_gpu_pages.saturating_add(a.device_pages)
    } else {
        a.device_pages
    };
    let fits = device.min(a.host_pages) as u64;
    (0..a.count)
        .map(|id| {
            let rank = a.ranks.rank_of(id);
            let pages = pages_for_rank(rank, a.pages_per_rank8);
            if pages > fits {
                return Err(OptionsError::AdapterTooLarge {
                    id,
                    rank,
                    pages,
                    device_pages: a.device_pages,
                    host_pages: a.host_pages,
                });
            }
            Ok(pages as u32)
        })
        .collect()
}

/// The KV pool's GPU pages. Unified paging: the adapter cache's device pages join the pool, and a LoRA
/// request must fit beside its adapter.
fn unified_gpu_pages(o: &SimOptions, longest: u64, pages: &[u32]) -> Result<u32, OptionsError> {
    let a = &o.adapters;
    if !(a.unified && a.count > 0) {
        return Ok(o.kv_gpu_pages);
    }
    let largest = pages.iter().copied().max().unwrap_or(0) as u64;
    let total = o.kv_gpu_pages as u64 + a.device_pages as u64;
    if longest.div_ceil(o.tokens_per_block as u64) + largest > total {
        return Err(OptionsError::UnifiedNoRoom {
            longest,
            largest,
            total,
        });
    }
    u32::try_from(total).map_err(|_| OptionsError::UnifiedTooLarge)
}

/// The quantile of a report figure: 0 when nothing was measured.
pub(crate) fn percentile(sorted: &[f64], p: f64) -> f64 {
    stats::percentile(sorted, p).unwrap_or(0.0)
}

/// Runs a simulation of `w`: on one engine, or on `o.replicas` behind the router (`cluster.rs`).
///
/// Under `o.check`, differentially too: a twin of the run whose every pass is a full one must pass
/// through the same states (every pass's output; the scheduler's state every `check_every` passes; the
/// pools' at the end), or the run fails with [`SimError::Differential`].
pub fn run(o: &SimOptions, w: Workload) -> Result<Report, SimError> {
    if !o.check || o.full_passes {
        return run_once(o, w);
    }
    let twin = SimOptions {
        check: false,
        full_passes: true,
        progress: false,
        ..o.clone()
    };
    let mut r = run_once(o, w.clone())?;
    let full = run_once(&twin, w)?;
    differential(&r, &full)?;
    r.differential_passes = Some(r.iterations);
    Ok(r)
}

/// The differential check of a run `r` against its twin `full` (every pass a full one): every pass's
/// digest (`Report::digests`) equal, or [`SimError::Differential`] naming the first that is not.
pub fn differential(r: &Report, full: &Report) -> Result<(), SimError> {
    let (a, b) = (&r.digests, &full.digests);
    match (0..a.len().max(b.len())).find(|&k| a.get(k) != b.get(k)) {
        Some(pass) => Err(SimError::Differential {
            pass: pass as u64 + 1,
            incremental: r.incremental_passes,
        }),
        None => Ok(()),
    }
}

fn run_once(o: &SimOptions, mut w: Workload) -> Result<Report, SimError> {
    if let Some(h) = &o.hybrid {
        return hybrid::run(o, h, w);
    }
    check_options(o, &w)?;
    prepare(o, &mut w)?;
    if let Some(g) = &o.kv_groups {
        return groups::engine(o, g, &w);
    }
    if o.replicas > 1 || o.remote_store.is_some() || o.disagg.is_some() {
        return cluster::run(o, &w);
    }
    engine(o, &w)
}

/// Assigns `w`'s adapters and, with prefix reuse on a trace without prefix blocks, its sessions.
fn prepare(o: &SimOptions, w: &mut Workload) -> Result<(), SimError> {
    if o.adapters.count > 0 {
        let sampler = AdapterSampler::new(o.adapters.law, o.adapters.count)
            .map_err(OptionsError::Popularity)?;
        kvsched_workload::popularity::assign_adapters(&mut w.arrivals, &sampler, o.seed);
    }
    if o.prefix_reuse && w.prefix_block_tokens.is_none() {
        kvsched_workload::sessions::assign_sessions(w, o.seed);
    }
    Ok(())
}

/// One engine replaying `w` (its adapters and sessions assigned).
fn engine(o: &SimOptions, w: &Workload) -> Result<Report, SimError> {
    let mut e = Replica::new(o, w)?;
    let mut sim = e.sim(o, w, None, disagg::Role::Mixed)?;
    while sim.step()? {}
    Ok(sim.report())
}

/// What one simulated engine's pools are built from (a replica of the cluster): the geometry it was
/// sized for, and its connector's buffers.
struct Replica {
    kv_cfg: KvPoolConfig,
    adapter_pages: Vec<u32>,
    prefix: bool,
    unified: bool,
    draft_cfg: Option<KvPoolConfig>,
    connector_slots: Vec<kvsched_core::page_pool::ConnectorSlot>,
    connector_saves: Vec<u32>,
    /// Its pool logs KV events (a replica behind the KV-aware router).
    kv_events: bool,
}

impl Replica {
    /// The geometry of an engine replaying `w` under `o`.
    fn new(o: &SimOptions, w: &Workload) -> Result<Self, SimError> {
        let (kv_cfg, adapter_pages) = check_options(o, w)?;
        let draft_cfg = KvPoolConfig {
            gpu_pages: if o.draft_kv_pages > 0 {
                o.draft_kv_pages
            } else {
                kv_cfg.gpu_pages
            },
            ..kv_cfg
        };
        Ok(Self {
            kv_cfg,
            adapter_pages,
            prefix: o.prefix_reuse,
            unified: o.adapters.unified,
            draft_cfg: o.spec_decode.map(|_| draft_cfg),
            connector_slots: vec![
                kvsched_core::page_pool::ConnectorSlot::default();
                kv_cfg.slots as usize
            ],
            connector_saves: vec![0; kv_cfg.table_len()],
            kv_events: false,
        })
    }

    /// The same, its pool logging KV events when `on` (for the KV-aware router).
    fn logging_kv_events(mut self, on: bool) -> Self {
        self.kv_events = on;
        self
    }

    /// The engine's simulation of `w` in `role`: its scheduler over these buffers, with `connector`
    /// attached to its KV pool when given. A decode engine of a disaggregated cluster runs without
    /// recompute pause, as the reference's executor configures one: it received its prompts' KV and
    /// does not replay prefills.
    fn sim<'s, 'w>(
        &'s mut self,
        o: &'s SimOptions,
        w: &'w Workload,
        connector: Option<&'s mut dyn kvsched_core::connector::KvConnector>,
        role: disagg::Role,
    ) -> Result<run_loop::Sim<'s, 'w>, SimError> {
        let opt = |e: kvsched_core::Error| SimError::Options(OptionsError::Setup(e));
        let kv_cfg = self.kv_cfg;
        // Pools owning their buffers, with a prefix cache when the options reuse prefixes.
        let prefix = self.prefix;
        let pool = |cfg| {
            if prefix {
                KvPool::<'s, Owned>::owned_with_prefix_cache(cfg)
            } else {
                KvPool::owned(cfg)
            }
        };
        let mut target = pool(kv_cfg).map_err(opt)?;
        if self.kv_events && prefix {
            target = target.with_kv_events(KV_EVENTS).map_err(opt)?;
        }
        if self.unified {
            target = target.with_unified_adapters(MAX_ADAPTERS).map_err(opt)?;
        }
        if let Some(c) = connector {
            target
                .attach_connector(
                    c,
                    &mut self.connector_slots,
                    &mut self.connector_saves,
                    REMOTE_LOAD_TIMEOUT,
                )
                .map_err(opt)?;
        }
        let draft = match self.draft_cfg {
            Some(cfg) => Some((DraftMode::Joint, pool(cfg).map_err(opt)?)),
            None => None,
        };
        let kv = KvSet::with_pools(target, draft, None);
        let pool = adapter_pool(o, &self.adapter_pages, kv_cfg.gpu_pages)?;
        let cfg = sched_config(o, role);
        let sched: Box<Sched<'s>> = Box::new(Scheduler::boxed(cfg, kv, pool).map_err(opt)?);
        let out = Box::new(Out::new_in().map_err(opt)?);
        Ok(run_loop::Sim::new(o, w, sched, out, kv_cfg).with_role(role))
    }
}

/// The adapter cache of an engine under `o`, every adapter registered with its `pages`; under
/// unified paging it shares the KV pool's `kv_gpu_pages`.
fn adapter_pool(
    o: &SimOptions,
    pages: &[u32],
    kv_gpu_pages: u32,
) -> Result<AdapterPool<MAX_ADAPTERS>, SimError> {
    let opt = |e: kvsched_core::Error| SimError::Options(OptionsError::Setup(e));
    let (device, host) = (o.adapters.device_pages.max(1), o.adapters.host_pages.max(1));
    let pool = if o.adapters.unified {
        AdapterPool::<MAX_ADAPTERS>::unified(kv_gpu_pages, host)
    } else {
        AdapterPool::new(device, host)
    };
    let mut pool = pool.map_err(opt)?;
    for (id, &p) in pages.iter().enumerate() {
        pool.register(TaskId(id as u64), p)
            .map_err(|e| opt(e.into()))?;
    }
    Ok(pool)
}

/// The scheduler's configuration of an engine under `o` in `role`.
fn sched_config(o: &SimOptions, role: disagg::Role) -> Config {
    Config {
        max_num_requests: o.max_batch,
        max_num_tokens: Some(o.max_tokens),
        max_context_length: Some(o.max_tokens),
        chunking: o.chunking,
        policy: o.policy,
        recompute_pause: o.recompute_pause && role != disagg::Role::Decode,
        prefix_aware: true,
        window: Window::Decoder,
        deadlock_threshold: o.deadlock_threshold,
        blocked_fast_path: true,
        admission: o.admission,
        drain_after: o.drain_after,
        step_budget: None,
        thrash_guard: o.thrash_guard,
        shares: o.class_share.map(|s| {
            let none = kvsched_core::config::Share::default();
            [s, none, none, none]
        }),
    }
}

/// Events a replica's pool logs between two of the KV-aware router's reads (one step's): more
/// become a clear, which the router recovers from as it would from Dynamo's.
const KV_EVENTS: usize = 1 << 16;

/// Passes a remote store's load may stay unconfirmed before the pool abandons it.
const REMOTE_LOAD_TIMEOUT: u32 = 64;
