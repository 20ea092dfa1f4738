//! The pass at depth (issue 41, item 5): a running decode batch that holds the GPU pool, and behind
//! it a waiting queue of 1k, 16k or 64k long prompts (8k–128k tokens, 256–4,096 blocks of 32 tokens)
//! whose first chunks are refused for pages every pass, over a prefix cache of about 100k or 10M
//! blocks; and the pathological shapes: every waiting prompt sharing one long prefix, every prompt
//! unique, a cache at capacity evicting every pass. `docs/SCENARIOS.md` defines them; `docs/BENCH.md`
//! ("The pass at depth: the bench family") has the figures.
//!
//! The iterations are not reset: a state is built, its first pass (every waiting request tried and
//! refused by its trial) is run untimed, and what is measured is the pass after it, as a server sees it
//! pass after pass. Every iteration asserts its outcome (64 decodes, no context chunk, no pause) and
//! how the queue was passed: skipped whole by the refused run, or (the evicting shape, whose
//! evictions move some chains) skipped but for the requests whose chains moved, with the evictions
//! asserted.
//!
//! The table's slots are `u16`: a scheduler holds at most 65,535 requests, so the deepest queue is
//! 65,535 less the running batch ([`MAX_WAITING`]), not 100k. Every scenario uses the same scheduler
//! type (`N` = [`DEPTH_N`], boxed storage), so what differs between them is the queue, not the table.

use std::hint::black_box;
use std::time::Instant;

use kvsched_core::adapter_pool::AdapterPool;
use kvsched_core::config::{ChunkPolicy, Chunking, Config};
use kvsched_core::ids::RequestId;
use kvsched_core::kv::{chain, ContextPrep, KvBackend, KvRef, PageMove, PrefixReuse, Tier};
use kvsched_core::kv_set::KvSet;
use kvsched_core::output::SchedulerOutput;
use kvsched_core::page_pool::{KvBuffers, KvPool, KvPoolConfig, PageInfo, PrefixBuffers, Seq};
use kvsched_core::phase::Phase;
use kvsched_core::request::RequestSpec;
use kvsched_core::scheduler::Adopt;
use kvsched_core::storage::{Boxed, Owned};

use crate::{allocations, floor_pass, percentile, timer_overhead_ns, Outcome, Sched};

/// The scheduler's request capacity in every depth scenario: the most a `u16` table slot can name.
pub const DEPTH_N: usize = 65_535;
/// Adapter tasks (no request has one).
pub const DEPTH_T: usize = 1;
/// Decoding requests in the running batch.
pub const RUNNING: u32 = 64;
/// The deepest waiting queue the table allows beside the running batch.
pub const MAX_WAITING: u32 = DEPTH_N as u32 - RUNNING;
/// Tokens per KV page.
const TPB: u32 = 32;
/// Blocks of a cached conversation (32k tokens).
pub const CONVERSATION: u32 = 1024;
/// GPU pages beside the running batch's: free (or, evicting, idle cached blocks). Fewer than the
/// least first chunk needs (256: an 8k prompt), so every waiting first chunk is refused.
const SPARE: u32 = 240;
/// A running request's KV: 16k tokens and 1–32 more (staggered, so 2 of the 64 take a page a pass).
const RUNNING_TOKENS: u32 = 16_384;
/// Longest page table: a 128k-token prompt's 4,096 blocks.
const MAX_BLOCKS: u32 = 4_097;
/// Passes one built state serves (the spare pages last 120): the untimed first and the timed ones.
pub const DEPTH_PASSES: u32 = 100;

/// How the waiting prompts meet the prefix cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Shape {
    /// Prompt `j` continues cached conversation `j mod C` for half its blocks (at most 1,024).
    Refused,
    /// Every prompt shares one cached 32k-token prefix (all but its last 32 blocks, at most 1,024).
    Shared,
    /// No prompt shares a block with the cache or another prompt.
    Unique,
    /// [`Shape::Refused`] over a cache at capacity: no free GPU page and a full host tier, so the two
    /// decodes that cross a page boundary each pass evict a cached block (the prefix cache's version
    /// moves, and the queue is tried again).
    Evicting,
}

/// A scenario of the depth family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Depth {
    /// The name used in `SCENARIOS.md`, by `kvsched bench` and by the gungraun benches.
    pub name: &'static str,
    /// How the waiting prompts meet the cache.
    pub shape: Shape,
    /// Waiting requests.
    pub waiting: u32,
    /// Cached conversations of [`CONVERSATION`] blocks (the prefix cache's size, on the host tier).
    pub conversations: u32,
}

/// About 100k cached blocks (98 conversations: 100,352 blocks).
pub const CACHE_100K: u32 = 98;
/// About 10M cached blocks (9,766 conversations: 10,000,384 blocks).
pub const CACHE_10M: u32 = 9_766;

const fn depth(name: &'static str, shape: Shape, waiting: u32, conversations: u32) -> Depth {
    Depth {
        name,
        shape,
        waiting,
        conversations,
    }
}

impl Depth {
    /// Every depth scenario, in table order.
    pub const ALL: [Depth; 12] = [
        depth("depth-1k", Shape::Refused, 1_024, CACHE_100K),
        depth("depth-16k", Shape::Refused, 16_384, CACHE_100K),
        depth("depth-64k", Shape::Refused, MAX_WAITING, CACHE_100K),
        depth("depth-1k-10M", Shape::Refused, 1_024, CACHE_10M),
        depth("depth-64k-10M", Shape::Refused, MAX_WAITING, CACHE_10M),
        depth("shared-1k", Shape::Shared, 1_024, CACHE_100K),
        depth("shared-64k", Shape::Shared, MAX_WAITING, CACHE_100K),
        depth("unique-1k", Shape::Unique, 1_024, CACHE_100K),
        depth("unique-64k", Shape::Unique, MAX_WAITING, CACHE_100K),
        depth("evicting-1k", Shape::Evicting, 1_024, CACHE_100K),
        depth("evicting-16k", Shape::Evicting, 16_384, CACHE_100K),
        depth("evicting-64k", Shape::Evicting, MAX_WAITING, CACHE_100K),
    ];

    /// Parses a name (case-insensitive).
    pub fn parse(name: &str) -> Option<Depth> {
        Self::ALL
            .iter()
            .copied()
            .find(|d| d.name.eq_ignore_ascii_case(name))
    }

    /// What every iteration must produce: the running batch decodes, nothing else is scheduled.
    pub const fn expected(self) -> Outcome {
        Outcome {
            generation: RUNNING as usize,
            context: 0,
            paused: 0,
            recompute: 0,
            resumed: 0,
            adapter_loads: 0,
        }
    }

    /// The waiting requests a steady pass skips (the refused run), at least: all of them; where the
    /// cache evicts every pass, all but those whose chains the evictions moved (at most a tenth).
    pub const fn skipped(self) -> u32 {
        match self.shape {
            Shape::Evicting => self.waiting - self.waiting / 10,
            _ => self.waiting,
        }
    }

    /// The pool: the running batch's pages and 240 spare on the GPU, the cache's blocks on the host; a
    /// slot for each request and one to fill the cache through (its rows are `max_blocks` long: 12
    /// bytes a block, 3.2 GB at 64k, so they are sized to the queue, not to `N`).
    pub const fn kv_config(self) -> KvPoolConfig {
        KvPoolConfig {
            tokens_per_block: TPB,
            gpu_pages: RUNNING * running_pages() + SPARE,
            host_pages: self.conversations * CONVERSATION,
            slots: RUNNING + self.waiting + 1,
            max_blocks: MAX_BLOCKS,
        }
    }

    /// Chunked prefill (FCFS) under a 16k-token budget, 1,024 requests a batch; the reference's
    /// defaults otherwise (MAX_UTILIZATION, recompute pause, prefix-aware).
    pub fn config(self) -> Config {
        Config {
            max_num_requests: 1_024,
            max_num_tokens: Some(16_384),
            max_context_length: Some(16_384),
            chunking: Some(Chunking {
                policy: ChunkPolicy::FirstComeFirstServed,
                unit: 64,
            }),
            ..Config::DEFAULT
        }
    }

    /// Waiting prompt `j`'s blocks: 256, 512, 1,024, 2,048, 4,096 in turn (8k–128k tokens).
    pub const fn prompt_blocks(j: u32) -> u32 {
        256 << (j % 5)
    }

    /// Waiting prompt `j`'s leading blocks that are a cached chain's, and which chain.
    fn shared(self, j: u32) -> (u32, u32) {
        let b = Self::prompt_blocks(j);
        match self.shape {
            Shape::Refused | Shape::Evicting => ((b / 2).min(CONVERSATION), j % self.conversations),
            Shape::Shared => ((b - 32).min(CONVERSATION), 0),
            Shape::Unique => (0, 0),
        }
    }
}

/// A running request's pages (its KV at most `RUNNING_TOKENS + 32` tokens).
const fn running_pages() -> u32 {
    RUNNING_TOKENS / TPB + 1
}

/// Block `k`'s hash in cached conversation `c`.
fn conversation_hash(c: u32, k: u32) -> u64 {
    1 << 62 | u64::from(c) << 32 | u64::from(k)
}

/// Block `k`'s hash in waiting prompt `j` past what it shares.
fn unique_hash(j: u32, k: u32) -> u64 {
    2 << 60 | u64::from(j) << 32 | u64::from(k)
}

/// The prefix root of a request with no adapter and no salt (`Scheduler::submit_with_prefix`'s).
fn root() -> u64 {
    chain(3, 0)
}

/// The KV backend of the depth benches: the page pool with a prefix cache, owning its buffers.
type DepthKv = KvPool<'static, Owned>;

/// The table slot the cache is filled through (before the scheduler exists): the pool's last.
fn fill_slot(pool: &DepthKv) -> u16 {
    (pool.config().slots - 1) as u16
}

/// `len` copies of `v` on the heap (zeros come from `calloc`: pages the pool never writes are never
/// touched, where `KvPool::owned` writes every buffer; the pool still clears its hash rows).
fn heap<T: Copy>(len: usize, v: T) -> Box<[T]> {
    vec![v; len].into_boxed_slice()
}

/// A pool with a prefix cache over buffers `calloc` zeroed: the 64k queue's page tables and hash
/// rows are 3.2 GB, and writing them first (as `KvBuffers::alloc` does, before `KvPool::new` clears
/// the hash rows again) cost seconds of page faults a build natively, a third of a 16k build under
/// callgrind (which counts a `memset` byte by byte).
fn new_pool(cfg: KvPoolConfig) -> DepthKv {
    let pages = cfg.page_info_len();
    let buffers = KvBuffers {
        gpu_free: heap(cfg.gpu_pages as usize, 0),
        host_free: heap(cfg.host_pages as usize, 0),
        tables: heap(cfg.table_len(), 0),
        seqs: heap(cfg.slots as usize, Seq::default()),
        moves: heap(cfg.move_log_len(), PageMove::default()),
        prefix: Some(PrefixBuffers {
            pages: heap(pages, PageInfo::default()),
            index: heap(cfg.index_len(), 0),
            hashes: heap(cfg.table_len(), 0),
            stamps: heap(cfg.stamps_len(), 0),
        }),
    };
    KvPool::new(cfg, buffers).expect("depth: KV pool")
}

/// Fills the cache through [`fill_slot`]: each conversation computed (a first chunk of its
/// [`CONVERSATION`] blocks, committed) and dropped, leaving its blocks cached; older ones are demoted
/// to the host tier as the GPU fills (and dropped, oldest first, once the host tier is full).
fn fill_cache(pool: &mut DepthKv, conversations: u32, buf: &mut Vec<u64>) {
    let tokens = CONVERSATION * TPB;
    for c in 0..conversations {
        let r = KvRef {
            slot: fill_slot(pool),
            id: RequestId(u64::MAX - u64::from(c)),
        };
        buf.clear();
        buf.extend((0..CONVERSATION).map(|k| conversation_hash(c, k)));
        pool.set_prefix(r, root(), buf);
        assert_eq!(pool.prepare_context(r, ContextPrep::first(tokens)), Some(0));
        assert!(pool.resize_context(r, tokens, true), "depth: cache fill");
        pool.commit(r, tokens);
        pool.free(r);
        let _ = pool.take_moves();
    }
}

/// The running batch's KV in slots `0..RUNNING`, and (not evicting) the idle cached blocks left on
/// the GPU demoted to the host by a row that takes every page beside it and gives them back free.
fn place_running(pool: &mut DepthKv, evicting: bool) {
    for i in 0..RUNNING {
        let r = KvRef {
            slot: i as u16,
            id: RequestId(u64::from(i)),
        };
        assert_eq!(pool.prepare_context(r, ContextPrep::first(512)), Some(0));
        assert!(pool.resize_context(r, RUNNING_TOKENS + 1 + i % 32, true));
        let _ = pool.take_moves();
    }
    if !evicting {
        let r = KvRef {
            slot: fill_slot(pool),
            id: RequestId(u64::MAX),
        };
        pool.set_prefix(r, root(), &[]);
        assert_eq!(pool.prepare_context(r, ContextPrep::first(1)), Some(0));
        assert!(
            pool.resize_context(r, SPARE * TPB, true),
            "depth: spare pages"
        );
        pool.free(r);
        let _ = pool.take_moves();
    }
}

/// A built depth scenario: the scheduler over its pool, its output, what to assert.
pub struct DepthBench {
    depth: Depth,
    sched: Sched<DEPTH_N, DEPTH_T, Boxed>,
    out: SchedulerOutput<DEPTH_N, Boxed>,
    passes_left: u32,
}

impl DepthBench {
    /// The pool of `d` with its cache filled and the running batch in place, checked.
    fn pool(d: Depth) -> DepthKv {
        let mut pool = new_pool(d.kv_config());
        let evicting = d.shape == Shape::Evicting;
        // Evicting: one conversation more than the host holds, so it is full once the GPU's
        // running batch is placed, with SPARE idle cached blocks beside it and no free page.
        let fill = d.conversations + u32::from(evicting);
        fill_cache(&mut pool, fill, &mut Vec::new());
        place_running(&mut pool, evicting);
        let (free, idle) = (pool.gpu_free(), pool.idle_pages(Tier::Gpu));
        let room = d.conversations * CONVERSATION + SPARE;
        let cached = pool.cached_pages(Tier::Host) + idle;
        assert_eq!(
            cached,
            room.min(fill * CONVERSATION),
            "depth: cached blocks"
        );
        if evicting {
            assert_eq!(
                (free, idle, pool.host_free()),
                (0, SPARE, 0),
                "depth: at capacity"
            );
        } else {
            assert_eq!((free, idle), (SPARE, 0), "depth: spare pages free");
        }
        pool
    }

    /// Builds `d` and runs its first pass (untimed: every waiting first chunk tried and refused), so
    /// that the next iteration is the steady pass a server runs.
    pub fn build(d: Depth) -> Self {
        let pool = Self::pool(d);
        let peft = AdapterPool::<DEPTH_T>::new(1, 1).expect("adapter pool");
        let kv = KvSet::with_pools(pool, None, None);
        let mut sched = Sched::<DEPTH_N, DEPTH_T, Boxed>::new_in(d.config(), kv, peft)
            .expect("depth: scheduler");
        for i in 0..RUNNING {
            let spec = RequestSpec::generation(u64::from(i), 512);
            let h = sched.adopt(spec, Adopt::Active).expect("depth: adopt");
            assert_eq!(u32::from(h.index()), i, "slot i = request i");
        }
        let mut buf = Vec::new();
        for j in 0..d.waiting {
            let (shared, c) = d.shared(j);
            buf.clear();
            buf.extend((0..Depth::prompt_blocks(j)).map(|k| {
                if k < shared {
                    conversation_hash(c, k)
                } else {
                    unique_hash(j, k)
                }
            }));
            let tokens = Depth::prompt_blocks(j) * TPB;
            let spec = RequestSpec::new(u64::from(RUNNING + j), Phase::ContextInit, tokens);
            sched
                .submit_with_prefix(spec, 0, &buf)
                .expect("depth: submit");
        }
        let mut b = Self {
            depth: d,
            sched,
            out: SchedulerOutput::new_in().expect("depth: output"),
            passes_left: DEPTH_PASSES,
        };
        b.check_reuse();
        b.pass();
        assert_eq!(b.sched.last_pass().skipped, 0, "the first pass tries all");
        b
    }

    /// The first waiting prompts would reuse what their shape says (the cache's root and keys are
    /// the ones the scheduler computes; at capacity, at most that).
    fn check_reuse(&self) {
        let pool = self.sched.kv().target();
        for j in 0..self.depth.waiting.min(5) {
            let r = KvRef {
                slot: (RUNNING + j) as u16,
                id: RequestId(u64::from(RUNNING + j)),
            };
            let prep = ContextPrep::first(Depth::prompt_blocks(j) * TPB);
            let reuse = pool.probe_context_reuse(r, prep);
            let want = self.depth.shared(j).0 * TPB;
            // At capacity the oldest conversations lost their deepest blocks already.
            let ok = match self.depth.shape {
                Shape::Evicting => reuse.is_some_and(|r| r <= want),
                _ => reuse == Some(want),
            };
            assert!(ok, "{}: prompt {j}'s reuse {reuse:?}", self.depth.name);
        }
    }

    /// The scenario.
    pub fn depth(&self) -> Depth {
        self.depth
    }

    /// The state must be rebuilt before the next iteration.
    pub fn spent(&self) -> bool {
        self.passes_left == 0
    }

    /// The scheduler (for inspection).
    pub fn scheduler(&self) -> &Sched<DEPTH_N, DEPTH_T, Boxed> {
        &self.sched
    }

    /// One pass, `ensure_batch` and the move log drained; the outcome asserted.
    fn pass(&mut self) {
        let name = self.depth.name;
        assert!(self.passes_left > 0, "{name}: state spent, rebuild it");
        self.passes_left -= 1;
        if let Err(e) = self.sched.schedule(&mut self.out) {
            panic!("{name}: pass failed: {e}");
        }
        if let Err(e) = self.sched.ensure_batch(&mut self.out) {
            panic!("{name}: ensure_batch failed: {e}");
        }
        black_box(self.sched.take_moves().len());
        let got = Outcome::of(&self.out);
        assert!(got == self.depth.expected(), "{name}: outcome {got}");
    }

    /// One steady iteration: the pass, `ensure_batch`, the move log drained, the outcome and how it
    /// passed the queue asserted (skipped whole; or, evicting, tried again after the pass's
    /// evictions). Allocation-free.
    #[inline(never)]
    pub fn iteration(&mut self) {
        let evicted = |b: &Self| {
            b.sched
                .kv()
                .target()
                .prefix_stats()
                .map_or(0, |s| s.evicted)
        };
        let before = evicted(self);
        self.pass();
        let skipped = self.sched.last_pass().skipped;
        let evicting = self.depth.shape == Shape::Evicting;
        assert!(
            skipped == self.depth.skipped() || evicting && skipped >= self.depth.skipped(),
            "{}: skipped {skipped}, expected {}",
            self.depth.name,
            self.depth.skipped()
        );
        if evicting {
            assert!(
                skipped < self.depth.waiting,
                "{}: the evictions moved no chain",
                self.depth.name
            );
            assert_eq!(evicted(self), before + 2, "{}: evictions", self.depth.name);
        }
    }

    /// The floor pass over the same requests (one read of each record).
    #[inline(never)]
    pub fn floor(&self) -> u64 {
        floor_pass(&self.sched)
    }
}

/// One depth scenario's measured figures.
#[derive(Debug, Clone, Copy)]
pub struct DepthMeasured {
    /// The scenario.
    pub depth: Depth,
    /// Timed iterations.
    pub iters: u64,
    /// Median ns per iteration.
    pub median_ns: f64,
    /// 99th percentile ns per iteration.
    pub p99_ns: f64,
    /// Median ns of the floor pass over the same requests.
    pub floor_ns: f64,
    /// Heap allocations counted during the timed iterations.
    pub allocations: u64,
    /// States built (each outside the timed region).
    pub builds: u64,
}

impl DepthMeasured {
    /// Median over floor.
    pub fn ratio_to_floor(&self) -> f64 {
        self.median_ns / self.floor_ns
    }
}

/// [`DepthBench::build`] and one steady iteration, both untimed: the build has just written
/// gigabytes, so the first steady pass would measure the caches it evicted.
fn warm(d: Depth) -> DepthBench {
    let mut b = DepthBench::build(d);
    b.iteration();
    b
}

/// Measures `d` over `iters` steady iterations, rebuilding the state (untimed) when it is spent.
pub fn measure_depth(d: Depth, iters: u64) -> DepthMeasured {
    let overhead = timer_overhead_ns();
    let mut samples = Vec::with_capacity(iters as usize);
    let (mut allocated, mut builds) = (0u64, 1u64);
    let mut b = warm(d);
    while (samples.len() as u64) < iters {
        if b.spent() {
            drop(b);
            b = warm(d);
            builds += 1;
        }
        let a = allocations();
        let t = Instant::now();
        b.iteration();
        let ns = t.elapsed().as_nanos() as f64;
        allocated += allocations() - a;
        samples.push((ns - overhead).max(0.0));
    }
    samples.sort_by(f64::total_cmp);
    let mut floors: Vec<f64> = (0..200)
        .map(|_| {
            let t = Instant::now();
            black_box(b.floor());
            (t.elapsed().as_nanos() as f64 - overhead).max(0.0)
        })
        .collect();
    floors.sort_by(f64::total_cmp);
    DepthMeasured {
        depth: d,
        iters,
        median_ns: percentile(&samples, 0.5),
        p99_ns: percentile(&samples, 0.99),
        floor_ns: percentile(&floors, 0.5),
        allocations: allocated,
        builds,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Where a build's time goes (`--ignored --nocapture`).
    #[test]
    #[ignore = "by hand: builds every depth scenario (minutes)"]
    fn build_times() {
        let only = std::env::var("DEPTH_ONLY").ok();
        for d in Depth::ALL {
            if only.as_deref().is_some_and(|o| o != d.name) {
                continue;
            }
            let t = Instant::now();
            let pool = DepthBench::pool(d);
            let pool_s = t.elapsed().as_secs_f64();
            drop(pool);
            let t = Instant::now();
            let mut b = DepthBench::build(d);
            let build_s = t.elapsed().as_secs_f64();
            let t = Instant::now();
            b.iteration();
            let pass = t.elapsed().as_secs_f64();
            eprintln!(
                "{}: pool {pool_s:.2} s, build {build_s:.2} s, pass {pass:.6} s",
                d.name
            );
        }
    }
}
