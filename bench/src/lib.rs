//! # kvsched-bench
//!
//! In-process benchmarks of the scheduling pass: the scenarios of `docs/SCENARIOS.md`, built on the
//! project's real fixed-capacity backends ([`KvPool`] owning its buffers, [`AdapterPool`]), the floor pass,
//! the measurement behind `kvsched bench` ([`measure`]) and the counting allocator ([`CountingAlloc`]).
//! The criterion (`iteration`) and gungraun (`instructions`) benches of this crate drive the same
//! scenarios.
//!
//! One *iteration* is [`Scheduler::schedule`] followed by [`Scheduler::ensure_batch`] and draining the KV
//! move log (what a serving loop does every step). Every iteration asserts its outcome (generation, context,
//! paused, recompute-paused, resumed and adapter-load counts), so nothing gets faster by doing less.
//!
//! Scenarios marked "reset" start every iteration from the same state: the harness rebuilds the scheduler
//! outside the timed region. S1 is not reset: each iteration grows every request by one token; its pool is
//! sized for [`S1_PASSES`] iterations and rebuilt (untimed) after that many.
//!
//! Heap use: building allocates (the scheduler and its output are boxed, the pools own their buffers); an
//! iteration allocates nothing (`tests/no_alloc.rs` counts it).
#![deny(missing_docs)]

pub mod depth;

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::time::Instant;

use kvsched_core::adapter::{AdapterHold, PeftBackend, TaskRef};
use kvsched_core::adapter_pool::AdapterPool;
use kvsched_core::config::{Admission, ChunkPolicy, Chunking, Config};
use kvsched_core::ids::{RequestId, TaskId};
use kvsched_core::kv::{ContextPrep, KvBackend, KvRef};
use kvsched_core::kv_set::{DraftMode, KvSet};
use kvsched_core::output::SchedulerOutput;
use kvsched_core::page_pool::{KvPool, KvPoolConfig};
use kvsched_core::phase::Phase;
use kvsched_core::request::RequestSpec;
use kvsched_core::scheduler::{Adopt, Scheduler};
use kvsched_core::storage::{Inline, Owned, Storage};

/// Iterations an S1 pool is sized for before it is rebuilt (outside the timed region).
pub const S1_PASSES: u32 = 4096;
/// Tokens per KV page (common setting).
pub const TOKENS_PER_BLOCK: u32 = 32;
/// Device pages of one adapter (common setting).
pub const ADAPTER_PAGES: u32 = 4;
/// Prompt length of every request (common setting).
pub const PROMPT: u32 = 512;
/// KV capacity of a generation request, in tokens (common setting).
pub const CAPACITY: u32 = 1000;
/// Iterations measured in a row of one side before the other's (the incremental pass and its full peer).
const ALTERNATE: u64 = 250;
/// Passes timed per clock read when measuring the floor (one pass is shorter than a clock read).
const FLOOR_BATCH: u32 = 64;

/// A benchmark scenario of `SCENARIOS.md`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scenario {
    /// 64 generation requests, not reset.
    S1_64,
    /// 256 generation requests, not reset.
    S1_256,
    /// 1024 generation requests, not reset.
    S1_1024,
    /// 256 generation + 64 context requests (chunked prefill fills the token budget).
    S2,
    /// Pool exhausted, no host tier, 16 suspended: ordinary eviction, then one recompute pause.
    S3,
    /// S3 with every request active: ordinary eviction, then self-eviction.
    S3s,
    /// S3 with a host tier and every request active: one eviction to the host.
    S3h,
    /// 1024 LoRA requests over 64 adapters, a 32-adapter device cache, 25% suspended coming back.
    S4,
    /// Prefix reuse: 256 decoding requests over 8 adapters and 64 waiting 512-token prompts, each its
    /// adapter's cached 4-block system prompt and a unique tail; 21 are admitted (20 whole, one
    /// 256-token chunk), each reusing 128 tokens.
    S5,
    /// Speculative decoding: S1-256 with 4 draft tokens a step and a joint draft pool (every step grows
    /// both pools by 5 tokens), not reset.
    S6,
    /// Fair admission: S2 under VTC (the 64 prompts' clients are their 8 LoRA tasks), so the pass
    /// orders the pending list by virtual token counter before admitting (beyond the reference).
    S7,
}

/// Draft tokens a decode step in S6.
pub const S6_DRAFTS: u32 = 4;

/// The counts one iteration of a scenario must produce.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Outcome {
    /// Generation requests scheduled.
    pub generation: usize,
    /// Context chunks scheduled.
    pub context: usize,
    /// Requests ordinarily suspended.
    pub paused: usize,
    /// Requests recompute-paused or preempted.
    pub recompute: usize,
    /// Suspended requests whose KV came back.
    pub resumed: usize,
    /// Adapters copied to the device by `ensure_batch`.
    pub adapter_loads: usize,
}

impl Outcome {
    /// The counts of one output.
    pub fn of<const N: usize, S: Storage>(out: &SchedulerOutput<N, S>) -> Self {
        Self {
            generation: out.generation().len(),
            context: out.context().len(),
            paused: out.paused().len(),
            recompute: out.recompute_paused().len(),
            resumed: out.resumed().len(),
            adapter_loads: out.adapter_loads().len(),
        }
    }
}

impl core::fmt::Display for Outcome {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(
            f,
            "{}/{}/{}/{}",
            self.generation, self.context, self.paused, self.recompute
        )?;
        if self.resumed > 0 || self.adapter_loads > 0 {
            write!(f, " resumed {} loads {}", self.resumed, self.adapter_loads)?;
        }
        Ok(())
    }
}

const fn outcome(generation: usize, context: usize, paused: usize, recompute: usize) -> Outcome {
    Outcome {
        generation,
        context,
        paused,
        recompute,
        resumed: 0,
        adapter_loads: 0,
    }
}

impl Scenario {
    /// Every scenario, in table order.
    pub const ALL: [Scenario; 11] = [
        Scenario::S1_64,
        Scenario::S1_256,
        Scenario::S1_1024,
        Scenario::S2,
        Scenario::S3,
        Scenario::S3s,
        Scenario::S3h,
        Scenario::S4,
        Scenario::S5,
        Scenario::S6,
        Scenario::S7,
    ];

    /// The name used in `SCENARIOS.md` and on the command line.
    pub const fn name(self) -> &'static str {
        match self {
            Scenario::S1_64 => "S1-64",
            Scenario::S1_256 => "S1-256",
            Scenario::S1_1024 => "S1-1024",
            Scenario::S2 => "S2",
            Scenario::S3 => "S3",
            Scenario::S3s => "S3s",
            Scenario::S3h => "S3h",
            Scenario::S4 => "S4",
            Scenario::S5 => "S5",
            Scenario::S6 => "S6",
            Scenario::S7 => "S7",
        }
    }

    /// Parses a name (case-insensitive).
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL
            .iter()
            .copied()
            .find(|s| s.name().eq_ignore_ascii_case(name))
    }

    /// Requests in the table.
    pub const fn requests(self) -> usize {
        match self {
            Scenario::S1_64 => 64,
            Scenario::S1_256 | Scenario::S3 | Scenario::S3s | Scenario::S3h | Scenario::S6 => 256,
            Scenario::S2 | Scenario::S5 | Scenario::S7 => 320,
            Scenario::S1_1024 | Scenario::S4 => 1024,
        }
    }

    /// Every iteration starts from the same state (rebuilt outside the timed region).
    pub const fn resets(self) -> bool {
        !matches!(
            self,
            Scenario::S1_64 | Scenario::S1_256 | Scenario::S1_1024 | Scenario::S6
        )
    }

    /// The reference figure, median µs per iteration: TensorRT-LLM's Python V2 scheduler (S1-S3h,
    /// `SCENARIOS.md`); for S5 vLLM 0.33's scheduler with its KV manager, prefix caching and LoRA in the
    /// same shape (the prefix-reuse issue's figure).
    pub const fn reference_us(self) -> Option<f64> {
        match self {
            Scenario::S1_64 => Some(105.7),
            Scenario::S1_256 => Some(410.9),
            Scenario::S1_1024 => Some(1696.5),
            Scenario::S2 => Some(558.3),
            Scenario::S3 => Some(427.5),
            Scenario::S3s => Some(680.8),
            Scenario::S3h => Some(417.3),
            Scenario::S4 => None,
            Scenario::S5 => Some(3630.0),
            Scenario::S6 | Scenario::S7 => None,
        }
    }

    /// What every iteration must produce.
    pub const fn expected(self) -> Outcome {
        match self {
            Scenario::S1_64 => outcome(64, 0, 0, 0),
            Scenario::S1_256 => outcome(256, 0, 0, 0),
            Scenario::S1_1024 => outcome(1024, 0, 0, 0),
            Scenario::S2 => outcome(256, 16, 0, 0),
            Scenario::S3 => outcome(129, 0, 111, 1),
            Scenario::S3s => outcome(128, 0, 128, 0),
            Scenario::S3h => outcome(255, 0, 1, 0),
            Scenario::S4 => Outcome {
                generation: 768,
                context: 0,
                paused: 256,
                recompute: 0,
                resumed: 256,
                adapter_loads: 8,
            },
            Scenario::S5 => outcome(256, 21, 0, 0),
            Scenario::S6 => outcome(256, 0, 0, 0),
            Scenario::S7 => outcome(256, 16, 0, 0),
        }
    }

    /// Iterations a built state serves before it must be rebuilt.
    pub const fn passes_per_build(self) -> u32 {
        if self.resets() {
            1
        } else {
            S1_PASSES
        }
    }

    /// The KV pool geometry.
    pub const fn kv_config(self) -> KvPoolConfig {
        let n = self.requests() as u32;
        match self {
            Scenario::S1_64 | Scenario::S1_256 | Scenario::S1_1024 | Scenario::S6 => {
                // Capacity 1000 + (i mod 32), one token (S6: five) per iteration: room for S1_PASSES
                // iterations.
                let step = if matches!(self, Scenario::S6) {
                    1 + S6_DRAFTS
                } else {
                    1
                };
                let max_blocks = (CAPACITY + 31 + step * S1_PASSES).div_ceil(TOKENS_PER_BLOCK) + 1;
                KvPoolConfig {
                    tokens_per_block: TOKENS_PER_BLOCK,
                    gpu_pages: n * max_blocks,
                    host_pages: 0,
                    slots: n,
                    max_blocks,
                }
            }
            // Room for all: 256 × 33 pages of generation, 64 × 17 of context (S5: and the 8 system
            // prompts' 4 cached blocks each).
            Scenario::S2 | Scenario::S5 | Scenario::S7 => KvPoolConfig {
                tokens_per_block: TOKENS_PER_BLOCK,
                gpu_pages: 256 * 33 + 64 * 17,
                host_pages: 0,
                slots: n,
                max_blocks: 40,
            },
            // 256 × 32 pages, none free.
            Scenario::S3 | Scenario::S3s => KvPoolConfig {
                tokens_per_block: TOKENS_PER_BLOCK,
                gpu_pages: 256 * 32,
                host_pages: 0,
                slots: n,
                max_blocks: 40,
            },
            Scenario::S3h => KvPoolConfig {
                tokens_per_block: TOKENS_PER_BLOCK,
                gpu_pages: 256 * 32,
                host_pages: 256 * 32,
                slots: n,
                max_blocks: 40,
            },
            // GPU: exactly the 768 active requests' pages. Host: the 256 suspended ones' pages plus room
            // for one more request, so each eviction moves a victim down before a returner comes up.
            Scenario::S4 => KvPoolConfig {
                tokens_per_block: TOKENS_PER_BLOCK,
                gpu_pages: 768 * 32,
                host_pages: 256 * 32 + 32,
                slots: n,
                max_blocks: 40,
            },
        }
    }

    /// Fresh, empty pools owning their buffers: the target (S5: with a prefix cache) and, in S6, the
    /// joint draft pool.
    pub fn pools(self) -> BenchKv {
        let target = match self {
            Scenario::S5 => KvPool::owned_with_prefix_cache(self.kv_config()),
            _ => KvPool::owned(self.kv_config()),
        };
        let draft = (self == Scenario::S6).then(|| {
            (
                DraftMode::Joint,
                KvPool::owned(self.kv_config()).expect("draft KV pool"),
            )
        });
        KvSet::with_pools(target.expect("KV pool"), draft, None)
    }

    /// Scheduler configuration: the common settings with the scenario's batch limit.
    pub fn config(self) -> Config {
        Config {
            max_num_requests: self.requests() as u32,
            max_num_tokens: Some(8192),
            max_context_length: Some(8192),
            chunking: Some(Chunking {
                policy: ChunkPolicy::FirstComeFirstServed,
                unit: 64,
            }),
            admission: if self == Scenario::S7 {
                Admission::VTC
            } else {
                Admission::Fcfs
            },
            // The reference's defaults: MAX_UTILIZATION, recompute pause, prefix-aware, decoder window.
            ..Config::DEFAULT
        }
    }
}

/// One request of a scenario's starting state.
#[derive(Debug, Clone)]
struct Start {
    spec: RequestSpec,
    /// KV capacity in tokens (0: no cache).
    capacity: u32,
    how: Adopt,
    /// The prompt's block hashes (S5), submitted with a waiting request.
    hashes: Vec<u64>,
}

/// S5's system prompt: 4 blocks of 32 tokens per adapter.
const SYSTEM_BLOCKS: u64 = 4;

/// The block hashes of an S5 prompt of `blocks` full blocks on adapter `task`: its system prompt, then
/// (for `unique` ≠ 0) a tail of its own.
fn s5_hashes(task: u64, unique: u64, blocks: u64) -> Vec<u64> {
    (0..blocks)
        .map(|k| {
            if k < SYSTEM_BLOCKS {
                (task + 1) << 32 | k
            } else {
                unique << 32 | k
            }
        })
        .collect()
}

/// The adapter cache of a scenario's starting state.
#[derive(Debug, Clone)]
struct Adapters {
    tasks: u64,
    device_pages: u32,
    host_pages: u32,
    /// Tasks resident on the device with no request on them (least recently used first).
    idle_on_device: Vec<u64>,
    /// Tasks resident only on the host with no request on them.
    idle_on_host: Vec<u64>,
}

fn generation(id: u64, task: u64, capacity: u32) -> Start {
    Start {
        spec: RequestSpec::generation(id, PROMPT).with_lora(task),
        capacity,
        how: Adopt::Active,
        hashes: Vec::new(),
    }
}

/// The starting state: requests in arrival order (request i has id i and gets table slot i).
fn starting_state(s: Scenario) -> (Vec<Start>, Adapters) {
    let eight = Adapters {
        tasks: 8,
        device_pages: 1024,
        host_pages: 1024,
        idle_on_device: Vec::new(),
        idle_on_host: Vec::new(),
    };
    match s {
        Scenario::S1_64 | Scenario::S1_256 | Scenario::S1_1024 | Scenario::S6 => {
            (decoding(s), eight)
        }
        Scenario::S2 | Scenario::S7 => (decoding_and_prompts(false), eight),
        Scenario::S5 => (decoding_and_prompts(true), eight),
        Scenario::S3 | Scenario::S3s | Scenario::S3h => (exhausted(s), eight),
        Scenario::S4 => s4_state(),
    }
}

/// S1 and S6: every request decoding, capacities staggered by `i mod 32` (S6: with draft tokens).
fn decoding(s: Scenario) -> Vec<Start> {
    let n = s.requests() as u64;
    let drafts = if s == Scenario::S6 { S6_DRAFTS } else { 0 };
    (0..n)
        .map(|i| {
            let mut r = generation(i, i % 8, CAPACITY + (i % 32) as u32);
            r.spec.draft = drafts;
            r
        })
        .collect()
}

/// S2, S7 and S5: 256 decoding requests and 64 waiting prompts (S5: `hashed`, each its adapter's system
/// prompt and a tail of its own).
fn decoding_and_prompts(hashed: bool) -> Vec<Start> {
    let mut reqs: Vec<Start> = (0..256).map(|i| generation(i, i % 8, CAPACITY)).collect();
    let blocks = u64::from(PROMPT / TOKENS_PER_BLOCK);
    reqs.extend((256..320).map(|i| Start {
        spec: RequestSpec::new(i, Phase::ContextInit, PROMPT).with_lora(i % 8),
        capacity: 0,
        how: Adopt::Waiting,
        hashes: if hashed {
            s5_hashes(i % 8, 1000 + i, blocks)
        } else {
            Vec::new()
        },
    }));
    reqs
}

/// S3, S3s, S3h: 256 decoding requests filling the pool, one of them needing a page more (S3: the last
/// 16 suspended).
fn exhausted(s: Scenario) -> Vec<Start> {
    (0..256)
        .map(|i| {
            let mut r = generation(i, i % 8, if i == 128 { 1024 } else { CAPACITY });
            if s == Scenario::S3 && i >= 240 {
                r.how = Adopt::Suspended;
            }
            r
        })
        .collect()
}

/// S4: 0..512 active on tasks 0..16; 512..768 suspended (pages on the host) on tasks 16..24;
/// 768..1024 active on tasks 24..32. Tasks 32..40 sit idle on the device (the device cache of 32 adapters
/// is full), 40..64 idle on the host. The pass brings the 256 suspended requests back, evicting the 256 at
/// the tail (their adapters are then done); ensure_batch loads tasks 16..24, evicting the idle 32..40. The
/// adapter plan (24 tasks) fits: DESIGN.md §3.6.
fn s4_state() -> (Vec<Start>, Adapters) {
    let reqs = (0..1024u64)
        .map(|i| {
            let task = match i {
                0..512 => i % 16,
                512..768 => 16 + i % 8,
                _ => 24 + i % 8,
            };
            let mut r = generation(i, task, CAPACITY);
            if (512..768).contains(&i) {
                r.how = Adopt::Suspended;
            }
            r
        })
        .collect();
    let adapters = Adapters {
        tasks: 64,
        device_pages: 32 * ADAPTER_PAGES,
        host_pages: 64 * ADAPTER_PAGES,
        idle_on_device: (32..40).collect(),
        idle_on_host: (40..64).collect(),
    };
    (reqs, adapters)
}

/// The KV backend of the benches: the real page pool owning its buffers (with a joint draft pool in S6).
pub type BenchKv = KvSet<KvPool<'static, Owned>>;

/// The scheduler type of the benches: the real page pools and adapter cache, the scheduler's arrays
/// where `S` keeps them (inside the value, [`Inline`]: what the benches measure).
pub type Sched<const N: usize, const T: usize, S = Inline> =
    Scheduler<BenchKv, AdapterPool<T>, N, T, S>;

/// A built scenario: a boxed scheduler over its own pools, its output, and the outcome to assert.
pub struct Bench<const N: usize, const T: usize, S: Storage = Inline> {
    scenario: Scenario,
    sched: Box<Sched<N, T, S>>,
    out: Box<SchedulerOutput<N, S>>,
    expect: Outcome,
    passes_left: u32,
}

fn task_ref<const T: usize>(p: &AdapterPool<T>, id: u64) -> TaskRef {
    p.lookup(TaskId(id)).expect("registered task")
}

impl<const N: usize, const T: usize, S: Storage> Bench<N, T, S> {
    /// Builds `s` over fresh pools ([`Scenario::pools`]). Panics when `N`/`T` are too small for it.
    pub fn build(s: Scenario) -> Self {
        let (reqs, ad) = starting_state(s);
        assert!(reqs.len() <= N, "{}: N = {N} is too small", s.name());
        assert!(ad.tasks as usize <= T, "{}: T = {T} is too small", s.name());
        let pool = kv_in_place(s, &reqs);
        let peft = adapters_in_place::<T>(&ad, &reqs);
        let sched = Sched::<N, T, S>::new_in(s.config(), pool, peft);
        let mut sched = Box::new(sched.expect("scheduler"));
        let mut waiting = Vec::new();
        for (i, r) in reqs.into_iter().enumerate() {
            if !r.hashes.is_empty() {
                waiting.push(r);
                continue;
            }
            let h = sched.adopt(r.spec, r.how).expect("adopt");
            assert_eq!(h.index() as usize, i, "slot i = request i");
        }
        if s == Scenario::S5 {
            warm_system_prompts(&mut sched);
        }
        for r in waiting {
            sched
                .submit_with_prefix(r.spec, 0, &r.hashes)
                .expect("submit");
        }

        Self {
            scenario: s,
            sched,
            out: Box::new(SchedulerOutput::new_in().expect("output")),
            expect: s.expected(),
            passes_left: s.passes_per_build(),
        }
    }

    /// [`Bench::build`], then two iterations (untimed where the state is built): the first pass of a
    /// not-reset scenario leaves a steady decode batch, which the second keeps (incremental, asserted),
    /// as the next one will. Panics for a reset scenario.
    pub fn steady(s: Scenario) -> Self {
        assert!(
            !s.resets(),
            "{}: a reset scenario has no next pass",
            s.name()
        );
        let mut b = Self::build(s);
        b.iteration();
        let before = b.sched.replayed_passes();
        b.iteration();
        assert_eq!(
            b.sched.replayed_passes(),
            before + 1,
            "{}: the pass after the first is incremental",
            s.name()
        );
        b
    }

    /// The scenario.
    pub fn scenario(&self) -> Scenario {
        self.scenario
    }

    /// Turns the scheduler's incremental pass on (the default) or off: off, every iteration runs the
    /// full pass, the peer an incremental iteration is measured against.
    pub fn set_incremental(&mut self, on: bool) {
        self.sched.set_incremental(on);
    }

    /// The scheduler (for inspection).
    pub fn scheduler(&self) -> &Sched<N, T, S> {
        &self.sched
    }

    /// The last iteration's output.
    pub fn output(&self) -> &SchedulerOutput<N, S> {
        &self.out
    }

    /// The state must be rebuilt before the next iteration (reset scenarios: after every iteration).
    pub fn spent(&self) -> bool {
        self.passes_left == 0
    }

    /// One iteration: the pass, the batch's adapters made resident, the KV move log drained; the outcome
    /// is asserted. Allocation-free.
    #[inline(never)]
    pub fn iteration(&mut self) {
        assert!(
            self.passes_left > 0,
            "{}: state spent, rebuild it",
            self.scenario.name()
        );
        self.passes_left -= 1;
        let out = &mut *self.out;
        if let Err(e) = self.sched.schedule(out) {
            panic!("{}: pass failed: {e}", self.scenario.name());
        }
        if let Err(e) = self.sched.ensure_batch(out) {
            panic!("{}: ensure_batch failed: {e}", self.scenario.name());
        }
        black_box(self.sched.take_moves().len());
        let got = Outcome::of(out);
        assert!(
            got == self.expect,
            "{}: outcome {got} (resumed {}, loads {}), expected {} (resumed {}, loads {})",
            self.scenario.name(),
            got.resumed,
            got.adapter_loads,
            self.expect,
            self.expect.resumed,
            self.expect.adapter_loads
        );
    }

    /// The floor pass: reads each request record once and sums its token cost.
    #[inline(never)]
    pub fn floor(&self) -> u64 {
        floor_pass(&self.sched)
    }
}

/// The KV pools of a starting state: each cache in place (slot i = request i), suspended ones moved down
/// (or HELD), the move log drained.
fn kv_in_place(s: Scenario, reqs: &[Start]) -> BenchKv {
    let mut pool = s.pools();
    for (i, r) in reqs.iter().enumerate() {
        if r.capacity == 0 {
            continue;
        }
        let kr = KvRef {
            slot: i as u16,
            id: r.spec.id,
        };
        let prep = ContextPrep::first(r.spec.prompt);
        assert_eq!(pool.prepare_context(kr, prep), Some(0));
        assert!(
            pool.resize_context(kr, r.capacity, true),
            "{}: KV setup",
            s.name()
        );
        if r.how == Adopt::Suspended {
            pool.suspend(kr);
        }
    }
    let _ = pool.take_moves();
    pool
}

/// The adapter cache of a starting state: every task registered; the idle ones warmed on the device
/// (oldest first) or on the host; the running requests' adapters on the device, as after the previous
/// step.
fn adapters_in_place<const T: usize>(ad: &Adapters, reqs: &[Start]) -> AdapterPool<T> {
    let mut peft = AdapterPool::<T>::new(ad.device_pages, ad.host_pages).expect("adapter pool");
    for t in 0..ad.tasks {
        peft.register(TaskId(t), ADAPTER_PAGES).expect("register");
    }
    let warm = RequestId(u64::MAX);
    for &t in &ad.idle_on_device {
        let tr = task_ref(&peft, t);
        peft.add_request(warm, tr, false).expect("warm");
        peft.ensure_batch(&[tr], &mut |_| {}).expect("warm");
        peft.mark_request_done(warm, tr, false, AdapterHold::Lease);
    }
    for &t in &ad.idle_on_host {
        let tr = task_ref(&peft, t);
        peft.add_request(warm, tr, false).expect("warm");
        peft.mark_request_done(warm, tr, false, AdapterHold::Lease);
    }
    let mut running: Vec<TaskRef> = reqs
        .iter()
        .filter(|r| r.how == Adopt::Active)
        .filter_map(|r| r.spec.lora.map(|t| task_ref(&peft, t.0)))
        .collect();
    running.sort_unstable_by_key(|t| t.slot);
    running.dedup();
    peft.ensure_batch(&running, &mut |_| {})
        .expect("running adapters fit");
    peft
}

/// S5's cache before the timed pass: one request per adapter computes the adapter's system prompt (one
/// pass, next to the decoding requests) and finishes, leaving its blocks cached.
fn warm_system_prompts<const N: usize, const T: usize, S: Storage>(sched: &mut Sched<N, T, S>) {
    let mut out = Box::new(SchedulerOutput::<N, S>::new_in().expect("output"));
    let tokens = (SYSTEM_BLOCKS as u32) * TOKENS_PER_BLOCK;
    let warm: Vec<_> = (0..8u64)
        .map(|t| {
            let spec = RequestSpec::new(100_000 + t, Phase::ContextInit, tokens).with_lora(t);
            let hashes = s5_hashes(t, 0, SYSTEM_BLOCKS);
            sched.submit_with_prefix(spec, 0, &hashes).expect("warm")
        })
        .collect();
    sched.schedule(&mut out).expect("warm pass");
    sched.ensure_batch(&mut out).expect("warm pass");
    let _ = sched.take_moves();
    assert_eq!(
        out.context().len(),
        8,
        "S5: the system prompts are computed"
    );
    sched.complete_step(&out).expect("warm pass");
    for h in warm {
        sched.remove(h).expect("warm");
    }
    let cached = sched
        .kv()
        .target()
        .cached_pages(kvsched_core::kv::Tier::Gpu);
    assert_eq!(
        u64::from(cached),
        8 * SYSTEM_BLOCKS,
        "S5: the system prompts are cached"
    );
}

/// The least work any scheduler must do: read each request record once and sum its token cost (a decode
/// step: beam + drafts; a prompt: what is left of it).
pub fn floor_pass<K, P, const N: usize, const T: usize, S: Storage>(
    s: &Scheduler<K, P, N, T, S>,
) -> u64
where
    K: KvBackend,
    P: PeftBackend,
{
    let mut sum = 0u64;
    for (_, e) in s.requests() {
        let r = e.spec();
        let cost = if r.phase.is_generation() {
            r.beam + r.draft
        } else {
            r.prompt - r.position
        };
        sum += cost as u64;
    }
    sum
}

/// Something to do with a scenario's monomorphised bench type (see [`dispatch`]).
pub trait Visit {
    /// What the visit returns.
    type Out;
    /// Called with the scenario's request capacity `N` and task capacity `T`.
    fn visit<const N: usize, const T: usize>(&mut self, s: Scenario) -> Self::Out;
}

/// Calls `v` with the `N` (requests) and `T` (adapter tasks) chosen for `s`.
pub fn dispatch<V: Visit>(s: Scenario, v: &mut V) -> V::Out {
    match s {
        Scenario::S1_64 => v.visit::<64, 8>(s),
        Scenario::S1_256 | Scenario::S3 | Scenario::S3s | Scenario::S3h | Scenario::S6 => {
            v.visit::<256, 8>(s)
        }
        Scenario::S1_1024 => v.visit::<1024, 8>(s),
        Scenario::S2 | Scenario::S5 | Scenario::S7 => v.visit::<320, 8>(s),
        Scenario::S4 => v.visit::<1024, 64>(s),
    }
}

impl<const N: usize, const T: usize, S: Storage> Bench<N, T, S> {
    /// Runs `iters` iterations of `s`, rebuilding the state (outside `run`) whenever it is spent:
    /// `run(bench, k)` must call [`Bench::iteration`] exactly `k` times (`k` ≥ 1; 1 for reset scenarios,
    /// up to [`S1_PASSES`] for S1).
    pub fn drive(s: Scenario, iters: u64, mut run: impl FnMut(&mut Self, u64)) {
        let mut done = 0u64;
        while done < iters {
            let mut b = Self::build(s);
            let k = (iters - done).min(u64::from(b.passes_left));
            run(&mut b, k);
            assert_eq!(
                u64::from(b.passes_left),
                u64::from(s.passes_per_build()) - k,
                "drive: run must call iteration exactly k times"
            );
            done += k;
        }
    }
}

// ---------------------------------------------------------------------------------------------------
// Allocation counting.

thread_local! {
    static ALLOCATIONS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

fn count() {
    // `try_with`: a thread being torn down may still free and allocate.
    let _ = ALLOCATIONS.try_with(|c| c.set(c.get() + 1));
}

/// A global allocator that counts the allocations (alloc, alloc_zeroed, realloc) each thread makes and
/// forwards to the system allocator. Counting per thread (a `const`-initialised thread-local, which never
/// allocates) keeps one thread's allocations out of another's count: a pass runs on the thread that calls
/// it, so its allocations are counted there, and test threads running beside it do not interfere. Install
/// it with `#[global_allocator] static A: kvsched_bench::CountingAlloc = kvsched_bench::CountingAlloc;`.
#[derive(Debug, Clone, Copy, Default)]
pub struct CountingAlloc;

// SAFETY: every method forwards to `System` with the caller's arguments unchanged; counting touches only a
// const-initialised thread-local `Cell`, which neither allocates nor re-enters the allocator.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: forwarded under the caller's contract.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: forwarded under the caller's contract.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        // SAFETY: forwarded under the caller's contract.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded under the caller's contract.
        unsafe { System.dealloc(ptr, layout) }
    }
}

/// Allocations the calling thread made so far, as [`CountingAlloc`] counted them (0 forever when it is
/// not the global allocator).
pub fn allocations() -> u64 {
    ALLOCATIONS.with(std::cell::Cell::get)
}

/// [`CountingAlloc`] is the process's global allocator.
pub fn counting_installed() -> bool {
    let before = allocations();
    drop(black_box(Box::new(black_box(1u64))));
    allocations() > before
}

// ---------------------------------------------------------------------------------------------------
// Measurement.

/// One scenario's measured figures.
#[derive(Debug, Clone, Copy)]
pub struct Measured {
    /// The scenario.
    pub scenario: Scenario,
    /// Timed iterations.
    pub iters: u64,
    /// Median ns per iteration.
    pub median_ns: f64,
    /// 99th percentile ns per iteration.
    pub p99_ns: f64,
    /// Median ns of the floor pass over the same requests.
    pub floor_ns: f64,
    /// Median ns per iteration with every pass a full one (measured in blocks alternating with the others).
    pub full_median_ns: f64,
    /// 99th percentile ns per iteration with every pass a full one.
    pub full_p99_ns: f64,
    /// The timed iterations whose pass was incremental (the last pass's batch kept).
    pub incremental: u64,
    /// Heap allocations counted during the timed iterations.
    pub allocations: u64,
    /// The outcome every iteration produced.
    pub outcome: Outcome,
}

impl Measured {
    /// Median over floor.
    pub fn ratio_to_floor(&self) -> f64 {
        self.median_ns / self.floor_ns
    }

    /// The full pass's median over the median (how many times cheaper the iteration is).
    pub fn speedup(&self) -> f64 {
        self.full_median_ns / self.median_ns
    }
}

/// The `p`-quantile (0 ≤ p ≤ 1) of `sorted` by nearest rank (as `kvsched-sim`'s reports take it); NaN
/// when nothing was measured.
pub(crate) fn percentile(sorted: &[f64], p: f64) -> f64 {
    let Some(last) = sorted.len().checked_sub(1) else {
        return f64::NAN;
    };
    let k = (last as f64 * p.clamp(0.0, 1.0)).round() as usize;
    sorted[k.min(last)]
}

/// Cost of an empty timed region (two clock reads), subtracted from every sample.
pub(crate) fn timer_overhead_ns() -> f64 {
    let mut v: Vec<f64> = (0..10_000)
        .map(|_| {
            let t = Instant::now();
            black_box(());
            t.elapsed().as_nanos() as f64
        })
        .collect();
    v.sort_by(f64::total_cmp);
    percentile(&v, 0.5)
}

struct Measure {
    iters: u64,
    warmup: u64,
    overhead_ns: f64,
}

impl Visit for Measure {
    type Out = Measured;
    fn visit<const N: usize, const T: usize>(&mut self, s: Scenario) -> Measured {
        // Warm-up (untimed), then the timed iterations, one sample each: the scheduler as built
        // (incremental) and its peer whose every pass is full, in alternating blocks.
        Bench::<N, T>::drive(s, self.warmup, |b, k| {
            for _ in 0..k {
                b.iteration();
            }
        });
        let build = |incremental: bool| {
            let mut b = Bench::<N, T>::build(s);
            b.set_incremental(incremental);
            b
        };
        let (mut inc, mut full) = (build(true), build(false));
        let mut samples = Vec::with_capacity(self.iters as usize);
        let mut full_samples = Vec::with_capacity(self.iters as usize);
        let (mut allocations, mut incremental) = (0u64, 0u64);
        // In blocks, so that each side runs with its own state in the caches.
        for block in 0..self.iters.div_ceil(ALTERNATE) {
            let k = ALTERNATE.min(self.iters - block * ALTERNATE);
            for _ in 0..k {
                if inc.spent() {
                    incremental += inc.scheduler().replayed_passes();
                    inc = build(true);
                }
                let a = self::allocations();
                let t = Instant::now();
                inc.iteration();
                let ns = t.elapsed().as_nanos() as f64;
                allocations += self::allocations() - a;
                samples.push((ns - self.overhead_ns).max(0.0));
            }
            for _ in 0..k {
                if full.spent() {
                    full = build(false);
                }
                let t = Instant::now();
                full.iteration();
                let ns = t.elapsed().as_nanos() as f64;
                full_samples.push((ns - self.overhead_ns).max(0.0));
            }
        }
        incremental += inc.scheduler().replayed_passes();
        full_samples.sort_by(f64::total_cmp);
        samples.sort_by(f64::total_cmp);

        // The floor over the scenario's starting requests, in batches (it is shorter than a clock read).
        let b = Bench::<N, T>::build(s);
        let outcome = s.expected();
        let mut floors: Vec<f64> = (0..(self.iters / 4).clamp(200, 5000))
            .map(|_| {
                let t = Instant::now();
                for _ in 0..FLOOR_BATCH {
                    black_box(b.floor());
                }
                (t.elapsed().as_nanos() as f64 - self.overhead_ns).max(0.0) / FLOOR_BATCH as f64
            })
            .collect();
        floors.sort_by(f64::total_cmp);
        Measured {
            scenario: s,
            iters: self.iters,
            median_ns: percentile(&samples, 0.5),
            p99_ns: percentile(&samples, 0.99),
            floor_ns: percentile(&floors, 0.5),
            full_median_ns: percentile(&full_samples, 0.5),
            full_p99_ns: percentile(&full_samples, 0.99),
            incremental,
            allocations,
            outcome,
        }
    }
}

/// Measures `s` over `iters` timed iterations (after an untimed warm-up).
pub fn measure(s: Scenario, iters: u64) -> Measured {
    let mut m = Measure {
        iters,
        warmup: (iters / 10).clamp(1, 1000),
        overhead_ns: timer_overhead_ns(),
    };
    dispatch(s, &mut m)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// S5's pass admits what its description says: 20 whole prompts and one 256-token chunk, each
    /// starting past its adapter's cached 128-token system prompt.
    #[test]
    fn s5_admits_21_prompts_each_reusing_its_system_prompt() {
        // Boxed: the scheduler off the test thread's stack (the pass is the same one).
        let mut b = Bench::<320, 8, kvsched_core::storage::Boxed>::build(Scenario::S5);
        b.iteration();
        let s = b.scheduler();
        let mut chunks: Vec<(u32, u32)> = b
            .output()
            .context()
            .iter()
            .map(|c| (s.get(c.listed.handle()).unwrap().spec().position, c.tokens))
            .collect();
        chunks.sort_unstable();
        let mut want = vec![(128, 384); 20];
        want.insert(0, (128, 256));
        assert_eq!(chunks, want);
    }
}
