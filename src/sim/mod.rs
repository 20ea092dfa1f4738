//! The simulated engine around the real scheduler: each iteration runs the real pass on the real
//! fixed-capacity backends, advances simulated time by a cost model of the forward pass, completes the step
//! (positions advance, tokens are generated, requests finish, recompute-paused requests replay) and admits
//! the arrivals whose time has come. The scheduler's own wall time per iteration is measured for real.

pub mod cli;
pub mod cost;
pub mod prefix;
pub mod report;
pub mod sweep;

use std::collections::VecDeque;
use std::time::Instant;

use kvsched_core::adapter::{AdapterPool, PeftBackend};
use kvsched_core::config::{CapacityPolicy, ChunkPolicy, Chunking, Config, Window};
use kvsched_core::kv::Tier;
use kvsched_core::kv::{KvBackend, Pool};
use kvsched_core::kv_set::{DraftMode, KvSet};
use kvsched_core::output::SchedulerOutput;
use kvsched_core::page_pool::{KvPool, KvPoolConfig};
use kvsched_core::request::Ownership;
use kvsched_core::request::{RequestSpec, TaskId};
use kvsched_core::scheduler::{Handle, Scheduler};
use kvsched_core::Phase;

use crate::memory::KvMemory;
use crate::workload::popularity::{pages_for_rank, AdapterRanks, AdapterSampler, PopularityLaw};
use crate::workload::Workload;

pub use cost::{CostModel, Engine, StepWork};
pub use report::Report;

/// Live requests the simulated engine hands the scheduler at once (more wait in the engine's queue).
pub const MAX_LIVE: usize = 1024;
/// Most adapters a simulation can use.
pub const MAX_ADAPTERS: usize = 1024;

type Sched<'a> = Scheduler<KvSet<KvPool<'a>>, AdapterPool<MAX_ADAPTERS>, MAX_LIVE, MAX_ADAPTERS>;
type Out = SchedulerOutput<MAX_LIVE>;

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
    /// Verify invariants after every iteration.
    pub check: bool,
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
            kv_gpu_pages: Engine::DEFAULT.kv_gpu_pages(32).unwrap_or(640),
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
            },
            cost: Engine::DEFAULT.model(32),
            engine: Engine::DEFAULT,
            slo_ttft_ms: None,
            slo_tpot_ms: None,
            seed: 1,
            check: false,
            progress: true,
            deadlock_threshold: 1000,
            prefix_reuse: true,
            spec_decode: None,
            draft_kv_pages: 0,
        }
    }
}

/// Why a simulation cannot run or stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SimError {
    /// Options that cannot work together; the text says what to change.
    Options(String),
    /// The scheduler refused something (deadlock, capacity).
    Scheduler(String),
}

impl std::fmt::Display for SimError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SimError::Options(s) => write!(f, "options do not fit: {s}"),
            SimError::Scheduler(s) => write!(f, "scheduler: {s}"),
        }
    }
}

impl std::error::Error for SimError {}

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
    /// GPU pages holding cached prefix blocks, %.
    pub cached_gpu: Vec<f64>,
    /// Host pages holding cached prefix blocks, %.
    pub cached_host: Vec<f64>,
    /// Adapters resident on the device.
    pub adapters: Vec<f64>,
}

fn check_options(o: &SimOptions, w: &Workload) -> Result<(KvPoolConfig, Vec<u32>), SimError> {
    let opt = |s: String| Err(SimError::Options(s));
    if o.tokens_per_block == 0 || o.kv_gpu_pages == 0 {
        return opt("--tokens-per-block and --kv-gpu-pages must be at least 1".into());
    }
    if o.max_batch == 0 || o.max_tokens == 0 {
        return opt("--max-batch and --max-tokens must be at least 1".into());
    }
    if let Some(c) = o.chunking {
        if c.unit == 0 || c.unit > o.max_tokens {
            return opt(format!(
                "--chunk-unit must be between 1 and --max-tokens ({})",
                o.max_tokens
            ));
        }
    } else if let Some(a) = w.arrivals.iter().max_by_key(|a| a.prompt_tokens) {
        if a.prompt_tokens > o.max_tokens {
            return opt(format!(
                "without chunking a {}-token prompt never fits the {}-token budget: raise --max-tokens or enable --chunking",
                a.prompt_tokens, o.max_tokens
            ));
        }
    }
    if o.prefix_reuse {
        let block = w
            .prefix_block_tokens
            .unwrap_or(crate::workload::sessions::BLOCK_TOKENS);
        if !prefix::compatible(block, o.tokens_per_block) {
            return opt(format!(
                "--tokens-per-block {} does not nest with the workload's {block}-token prefix blocks: use a divisor or a multiple of {block}, or --no-prefix-reuse",
                o.tokens_per_block
            ));
        }
    }
    let drafts = match o.spec_decode {
        None => 0,
        Some(s) if s.drafts == 0 || s.drafts > 64 || !(0.0..=1.0).contains(&s.accept) => {
            return opt(format!(
                "--spec-decode {}:{}: draft tokens between 1 and 64, acceptance between 0 and 1",
                s.drafts, s.accept
            ))
        }
        Some(s) => u64::from(s.drafts),
    };
    let pool_tokens = o.kv_gpu_pages as u64 * o.tokens_per_block as u64;
    let longest = w
        .arrivals
        .iter()
        .map(|a| a.prompt_tokens as u64 + a.output_tokens as u64 + drafts)
        .max()
        .unwrap_or(0);
    if drafts > 0 && o.draft_kv_pages > 0 {
        let draft_tokens = o.draft_kv_pages as u64 * o.tokens_per_block as u64;
        if longest > draft_tokens {
            return opt(format!(
                "a request of {longest} tokens (prompt + output + drafts) is longer than the whole draft pool ({} pages): raise --draft-kv-pages",
                o.draft_kv_pages
            ));
        }
    }
    if longest > pool_tokens {
        return opt(format!(
            "a request of {longest} tokens (prompt + output) is longer than the whole KV pool ({} pages x {} tokens = {pool_tokens}): raise --kv-gpu-pages or --tokens-per-block",
            o.kv_gpu_pages, o.tokens_per_block
        ));
    }
    let max_blocks = (longest.div_ceil(o.tokens_per_block as u64)).max(1) as u32;
    let table = MAX_LIVE as u64 * max_blocks as u64 * 4;
    if table > 1 << 30 {
        return opt(format!(
            "page tables would take {} MiB ({MAX_LIVE} requests x {max_blocks} pages): raise --tokens-per-block",
            table >> 20
        ));
    }
    let mut pages = Vec::new();
    let a = &o.adapters;
    if a.count > 0 {
        if a.count as usize > MAX_ADAPTERS {
            return opt(format!("--adapters is at most {MAX_ADAPTERS}"));
        }
        for id in 0..a.count {
            let p = pages_for_rank(a.ranks.rank_of(id), a.pages_per_rank8);
            let fits = a.device_pages.min(a.host_pages) as u64;
            if p > fits {
                return opt(format!(
                    "adapter {id} (rank {}) needs {p} pages but the adapter cache has {} device and {} host pages: raise --adapter-device-pages/--adapter-host-pages or lower --pages-per-rank8",
                    a.ranks.rank_of(id),
                    a.device_pages,
                    a.host_pages
                ));
            }
            pages.push(p as u32);
        }
    }
    let kv = KvPoolConfig {
        tokens_per_block: o.tokens_per_block,
        gpu_pages: o.kv_gpu_pages,
        host_pages: o.kv_host_pages,
        slots: MAX_LIVE as u32,
        max_blocks,
    };
    Ok((kv, pages))
}

pub(crate) fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// Invariants of DESIGN.md §7 checked after an iteration; returns how many failed.
fn check_invariants(s: &Sched<'_>, out: &Out, o: &SimOptions) -> u64 {
    let mut bad = 0;
    let pools = std::iter::once(s.kv().target()).chain(s.kv().draft().map(|(_, d)| d));
    for p in pools {
        bad += u64::from(!p.audit(&mut vec![0; p.config().page_info_len()]));
    }
    let pool = s.adapters().backend();
    bad += u64::from(!pool.check());
    for (slot, t) in pool.tasks().iter().enumerate() {
        bad += u64::from(s.adapters().leases(slot as u16) != t.active);
    }
    // The table's invariants, leases per task = requests holding one, ownership = the KV pool's state.
    bad += u64::from(!s.check());
    let mut seen = std::collections::HashSet::new();
    for l in out
        .context()
        .iter()
        .map(|c| &c.listed)
        .chain(out.generation())
        .chain(out.encoder())
        .chain(out.paused())
        .chain(out.recompute_paused())
    {
        bad += u64::from(!seen.insert(l.slot()));
    }
    // A decode step costs one token plus its drafts; a last chunk's drafts may overdraw (upstream).
    let drafts = u64::from(o.spec_decode.map_or(0, |s| s.drafts));
    let tokens: u64 = out.context().iter().map(|c| c.tokens as u64).sum::<u64>()
        + out.generation().len() as u64 * (1 + drafts);
    let overdraw = out.context().iter().filter(|c| c.last).count() as u64 * drafts;
    bad += u64::from(tokens > o.max_tokens as u64 + overdraw);
    bad += u64::from(out.generation().len() + out.context().len() > o.max_batch as usize);
    bad
}

/// Runs a simulation of `w`.
pub fn run(o: &SimOptions, mut w: Workload) -> Result<Report, SimError> {
    let (kv_cfg, adapter_pages) = check_options(o, &w)?;
    if o.adapters.count > 0 {
        let sampler = AdapterSampler::new(o.adapters.law, o.adapters.count)
            .map_err(|e| SimError::Options(e.to_string()))?;
        crate::workload::popularity::assign_adapters(&mut w.arrivals, &sampler, o.seed);
    }
    if o.prefix_reuse && w.prefix_block_tokens.is_none() {
        crate::workload::sessions::assign_sessions(&mut w, o.seed);
    }
    let block_tokens = w.prefix_block_tokens.unwrap_or(0);
    let mut hashes: Vec<u64> = Vec::new();
    let memory = |cfg: KvPoolConfig| {
        if o.prefix_reuse {
            KvMemory::with_prefix_cache(cfg)
        } else {
            KvMemory::new(cfg)
        }
    };
    let mut mem = memory(kv_cfg);
    let draft_cfg = KvPoolConfig {
        gpu_pages: if o.draft_kv_pages > 0 {
            o.draft_kv_pages
        } else {
            kv_cfg.gpu_pages
        },
        ..kv_cfg
    };
    let mut draft_mem = o.spec_decode.map(|_| memory(draft_cfg));
    let target = mem.pool().map_err(|e| SimError::Options(e.to_string()))?;
    let draft = match draft_mem.as_mut() {
        Some(m) => Some((
            DraftMode::Joint,
            m.pool().map_err(|e| SimError::Options(e.to_string()))?,
        )),
        None => None,
    };
    let kv = KvSet::with_pools(target, draft, None);
    let drafts = o.spec_decode.map_or(0, |s| s.drafts);
    let mut accept_rng = crate::workload::rng::Rng::new(o.seed ^ 0xacce_97ed);
    let mut pool: AdapterPool<MAX_ADAPTERS> =
        AdapterPool::new(o.adapters.device_pages.max(1), o.adapters.host_pages.max(1))
            .map_err(|e| SimError::Options(e.to_string()))?;
    for (id, &p) in adapter_pages.iter().enumerate() {
        pool.register(TaskId(id as u64), p)
            .map_err(|e| SimError::Options(e.to_string()))?;
    }
    let cfg = Config {
        max_num_requests: o.max_batch,
        max_num_tokens: Some(o.max_tokens),
        max_context_length: Some(o.max_tokens),
        chunking: o.chunking,
        policy: o.policy,
        recompute_pause: o.recompute_pause,
        prefix_aware: true,
        window: Window::Decoder,
        deadlock_threshold: o.deadlock_threshold,
        blocked_fast_path: true,
    };
    let mut sched: Box<Sched<'_>> =
        Box::new(Scheduler::new(cfg, kv, pool).map_err(|e| SimError::Options(e.to_string()))?);
    let mut out: Box<Out> = Box::default();

    let n = w.arrivals.len();
    let mut queue: VecDeque<usize> = VecDeque::new();
    let mut live: Vec<Option<Live>> = vec![None; MAX_LIVE];
    let mut next = 0usize;
    let mut now_ms = w.arrivals.first().map_or(0.0, |a| a.at_ms);
    let start_ms = now_ms;
    let mut r = Report::new(n);
    let mut samples = Samples::default();
    let mut sched_ns: Vec<f64> = Vec::new();
    let mut ttft = Vec::new();
    let mut tpot = Vec::new();
    let wall = Instant::now();
    let mut last_progress = Instant::now();
    let show_progress = o.progress && std::io::IsTerminal::is_terminal(&std::io::stderr());
    let mut kv_gpu_sum = 0.0;
    let mut adapter_sum = 0.0;
    let sample_every = (n / 4000).max(1) as u64;

    // Slots of the requests the step finished (reused every iteration).
    let mut finished: Vec<u16> = Vec::new();
    loop {
        while next < n && w.arrivals[next].at_ms <= now_ms {
            queue.push_back(next);
            next += 1;
        }
        while sched.len() < MAX_LIVE {
            let Some(&i) = queue.front() else { break };
            let a = &w.arrivals[i];
            let mut spec = RequestSpec::new(i as u64, Phase::ContextInit, a.prompt_tokens);
            spec.max_new_tokens = a.output_tokens;
            spec.lora = a.adapter.map(|x| TaskId(x as u64));
            spec.draft = drafts;
            hashes.clear();
            if o.prefix_reuse {
                let tpb = o.tokens_per_block;
                prefix::page_hashes(
                    &a.prefix_blocks,
                    block_tokens,
                    tpb,
                    a.prompt_tokens,
                    &mut hashes,
                );
            }
            let h = sched
                .submit_with_prefix(spec, 0, &hashes)
                .map_err(|e| SimError::Scheduler(e.to_string()))?;
            live[h.index() as usize] = Some(Live {
                arrival: i,
                handle: h,
                prompt0: a.prompt_tokens,
                output: a.output_tokens,
                generated: 0,
                first_token_ms: None,
                last_token_ms: 0.0,
                first_chunk: true,
                replay: false,
            });
            queue.pop_front();
        }
        if sched.is_empty() {
            if next >= n {
                break;
            }
            now_ms = w.arrivals[next].at_ms;
            continue;
        }

        let t0 = Instant::now();
        let pass = sched.schedule(&mut out);
        let ensured = pass.is_ok().then(|| sched.ensure_batch(&mut out));
        let ns = t0.elapsed().as_nanos() as f64;
        pass.map_err(|e| SimError::Scheduler(e.to_string()))?;
        if let Some(Err(e)) = ensured {
            r.invariant_violations += 1;
            return Err(SimError::Scheduler(format!(
                "ensure-batch failed for a scheduled batch: {e}"
            )));
        }
        sched_ns.push(ns);
        r.iterations += 1;
        let stats = sched.last_pass();
        r.suspended += stats.victims as u64 + stats.self_evictions as u64;
        r.self_evicted += stats.self_evictions as u64;
        r.recompute_paused += out.recompute_paused().len() as u64;
        r.preempted += stats.preemptions as u64;
        r.resumed += out.resumed().len() as u64;
        let mut page_moves = 0u64;
        for m in sched.take_moves() {
            page_moves += 1;
            match m.from {
                Tier::Gpu => r.pages_offloaded += 1,
                Tier::Host => r.pages_reloaded += 1,
            }
        }
        // The draft pool has no host tier: its log holds the reloads of claimed prefix blocks only.
        page_moves += sched.take_pool_moves(Pool::Draft).len() as u64;
        let mut load_pages = 0u64;
        for t in out.adapter_loads() {
            load_pages += sched.adapters().backend().tasks()[t.slot as usize].pages as u64;
        }
        r.adapter_loads += out.adapter_loads().len() as u64;
        if o.check {
            r.invariant_violations += check_invariants(&sched, &out, o);
        }
        // A first chunk starts at its reused prefix. The step's work: each chunk after the context
        // before it, each decode request at its context length.
        let mut work = StepWork {
            adapter_pages: load_pages,
            page_moves,
            ..StepWork::default()
        };
        for c in out.context() {
            let Some(lv) = live[c.listed.slot() as usize].as_mut() else {
                continue;
            };
            let spec = sched
                .get(lv.handle)
                .map_err(|e| SimError::Scheduler(e.to_string()))?
                .spec();
            work.chunk(u64::from(c.tokens), u64::from(spec.position));
            if std::mem::take(&mut lv.first_chunk) {
                r.prefill_tokens_saved += u64::from(spec.position);
                if !lv.replay {
                    r.admitted_prompt_tokens += u64::from(spec.prompt);
                    r.admitted_reused_tokens += u64::from(spec.position);
                }
            }
        }
        for g in out.generation() {
            let Some(lv) = live[g.slot() as usize].as_ref() else {
                continue;
            };
            // Speculative decoding verifies each request's drafts in the same forward pass.
            work.decode(
                u64::from(lv.prompt0) + u64::from(lv.generated),
                u64::from(drafts),
            );
        }

        let prefill = work.prefill_tokens;
        let busy = prefill > 0 || work.decode_requests > 0;
        let step_us = if busy {
            o.cost.step_us(&work)
        } else {
            // Nothing ran: wait for the next arrival or one idle step.
            let idle = o.cost.step_us(&StepWork {
                page_moves,
                ..StepWork::default()
            });
            if next < n {
                (w.arrivals[next].at_ms - now_ms).max(0.0) * 1000.0 + idle
            } else {
                idle
            }
        };
        now_ms += step_us / 1000.0;
        r.prefill_tokens += prefill;

        // Complete the step.
        sched
            .complete_step(&out)
            .map_err(|e| SimError::Scheduler(e.to_string()))?;
        finished.clear();
        for c in out.context() {
            let slot = c.listed.slot();
            let Some(lv) = live[slot as usize].as_mut() else {
                continue;
            };
            let e = sched
                .get(lv.handle)
                .map_err(|e| SimError::Scheduler(e.to_string()))?;
            if e.spec().phase == Phase::GenerationInProgress {
                // The last prefill chunk yields the first token.
                lv.generated += 1;
                r.tokens_generated += 1;
                if lv.first_token_ms.is_none() {
                    lv.first_token_ms = Some(now_ms);
                    ttft.push(now_ms - w.arrivals[lv.arrival].at_ms);
                }
                lv.last_token_ms = now_ms;
                if lv.generated >= lv.output {
                    finished.push(slot);
                } else if drafts > 0 {
                    // The last chunk reserved its drafts' slots; it yields one token.
                    sched
                        .rewind(lv.handle, drafts)
                        .map_err(|e| SimError::Scheduler(e.to_string()))?;
                }
            }
        }
        for l in out.generation() {
            let Some(lv) = live[l.slot() as usize].as_mut() else {
                continue;
            };
            // A step keeps one token plus the accepted run of its drafts; the rejected drafts' KV slots
            // are given back.
            let accepted = o.spec_decode.map_or(0, |s| {
                (0..s.drafts)
                    .take_while(|_| accept_rng.uniform() < s.accept)
                    .count() as u32
            });
            let kept = (1 + accepted).min(lv.output - lv.generated);
            lv.generated += kept;
            r.tokens_generated += u64::from(kept);
            r.decode_steps += 1;
            r.accepted_drafts += u64::from(kept - 1);
            lv.last_token_ms = now_ms;
            if lv.generated >= lv.output {
                finished.push(l.slot());
            } else if drafts > 0 {
                sched
                    .rewind(lv.handle, drafts - accepted)
                    .map_err(|e| SimError::Scheduler(e.to_string()))?;
            }
        }
        for l in out.recompute_paused() {
            // The replay re-prefills the prompt plus what was generated (beam 1), as upstream's pause.
            let Some(lv) = live[l.slot() as usize].as_mut() else {
                continue;
            };
            lv.first_chunk = true;
            lv.replay = true;
            let (h, prompt) = (lv.handle, lv.prompt0 + lv.generated);
            let remaining = lv.output - lv.generated;
            sched
                .update(h, |s| {
                    s.prompt = prompt;
                    s.max_new_tokens = remaining;
                })
                .map_err(|e| SimError::Scheduler(e.to_string()))?;
        }
        for &slot in &finished {
            let Some(lv) = live[slot as usize].take() else {
                continue;
            };
            sched
                .remove(lv.handle)
                .map_err(|e| SimError::Scheduler(e.to_string()))?;
            r.requests_completed += 1;
            r.completed_output_tokens += lv.output as u64;
            let first = lv.first_token_ms.unwrap_or(lv.last_token_ms);
            let its_tpot = if lv.output > 1 {
                let t = (lv.last_token_ms - first) / (lv.output - 1) as f64;
                tpot.push(t);
                t
            } else {
                0.0
            };
            // Goodput (DistServe): a request counts when it met both objectives.
            let its_ttft = first - w.arrivals[lv.arrival].at_ms;
            if o.slo_ttft_ms.is_none_or(|s| its_ttft <= s)
                && o.slo_tpot_ms.is_none_or(|s| its_tpot <= s)
            {
                r.slo_met += 1;
            }
        }

        // Utilization counts the pages requests hold; cached blocks nobody holds are the cache's.
        let kv = sched.kv().target();
        let pct = |n: u32, of: u32| {
            if of > 0 {
                100.0 * n as f64 / of as f64
            } else {
                0.0
            }
        };
        let (gpu, host) = (kv_cfg.gpu_pages, kv_cfg.host_pages);
        let kv_gpu = pct(gpu - kv.gpu_free() - kv.idle_pages(Tier::Gpu), gpu);
        let kv_host = pct(host - kv.host_free() - kv.idle_pages(Tier::Host), host);
        let resident = sched
            .adapters()
            .backend()
            .tasks()
            .iter()
            .filter(|t| t.on_device)
            .count() as f64;
        kv_gpu_sum += kv_gpu;
        adapter_sum += 100.0 * sched.adapters().backend().device_used() as f64
            / o.adapters.device_pages.max(1) as f64;
        r.peak_kv_gpu_pct = r.peak_kv_gpu_pct.max(kv_gpu);
        r.peak_kv_host_pct = r.peak_kv_host_pct.max(kv_host);
        if r.iterations % sample_every == 0 {
            let waiting = queue.len()
                + sched
                    .requests()
                    .filter(|(_, e)| e.ownership() == Ownership::Waiting)
                    .count();
            samples.t.push((now_ms - start_ms) / 1000.0);
            samples.queue.push(waiting as f64);
            samples
                .batch
                .push((out.generation().len() + out.context().len()) as f64);
            samples.kv_gpu.push(kv_gpu);
            samples.kv_host.push(kv_host);
            samples
                .cached_gpu
                .push(pct(kv.cached_pages(Tier::Gpu), gpu));
            samples
                .cached_host
                .push(pct(kv.cached_pages(Tier::Host), host));
            samples.adapters.push(resident);
        }
        if show_progress
            && last_progress.elapsed().as_millis() >= 200
            && wall.elapsed().as_secs_f64() > 2.0
        {
            last_progress = Instant::now();
            let done = r.requests_completed as f64 / n.max(1) as f64;
            let bar = (done * 30.0) as usize;
            eprint!(
                "\r[{}{}] {:>5.1}%  {} of {n} requests, {:.0} s simulated",
                "=".repeat(bar),
                " ".repeat(30 - bar.min(30)),
                done * 100.0,
                r.requests_completed,
                (now_ms - start_ms) / 1000.0
            );
        }
    }
    if show_progress && wall.elapsed().as_secs_f64() > 2.0 {
        eprintln!();
    }
    let stats = sched.adapters().backend().stats();
    r.adapter_evictions = stats.device_evictions;
    r.prefix_reuse = o.prefix_reuse;
    r.spec_drafts = drafts;
    r.engine = o.engine.to_string();
    if let Some(p) = sched.kv().target().prefix_stats() {
        r.cached_blocks_evicted = p.evicted;
        r.cached_blocks_demoted = p.demoted;
        r.host_cache_hits = p.host_hits;
    }
    r.prefix_hit_rate = if r.admitted_prompt_tokens > 0 {
        r.admitted_reused_tokens as f64 / r.admitted_prompt_tokens as f64
    } else {
        0.0
    };
    r.sim_seconds = (now_ms - start_ms) / 1000.0;
    r.arrival_span_seconds = w
        .arrivals
        .last()
        .map_or(0.0, |last| (last.at_ms - start_ms).max(0.0) / 1000.0);
    r.wall_seconds = wall.elapsed().as_secs_f64();
    r.kv_gpu_util_mean_pct = kv_gpu_sum / r.iterations.max(1) as f64;
    r.adapter_util_mean_pct = adapter_sum / r.iterations.max(1) as f64;
    r.slo = (o.slo_ttft_ms.is_some() || o.slo_tpot_ms.is_some())
        .then_some((o.slo_ttft_ms, o.slo_tpot_ms));
    r.throughput_tok_s = if r.sim_seconds > 0.0 {
        r.tokens_generated as f64 / r.sim_seconds
    } else {
        0.0
    };
    ttft.sort_by(f64::total_cmp);
    tpot.sort_by(f64::total_cmp);
    sched_ns.sort_by(f64::total_cmp);
    r.ttft_ms = (percentile(&ttft, 0.5), percentile(&ttft, 0.99));
    r.tpot_ms = (percentile(&tpot, 0.5), percentile(&tpot, 0.99));
    r.sched_ns_per_iter = (percentile(&sched_ns, 0.5), percentile(&sched_ns, 0.99));
    r.samples = samples;
    r.source = w.source.to_string();
    r.adapters = o.adapters.count;
    let _ = sched.kv().max_tokens_per_request();
    let _ = sched.adapters().backend().max_device_pages();
    Ok(r)
}
