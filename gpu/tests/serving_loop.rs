//! End to end: a real kvsched-core `Scheduler` (two-tier `KvPool`, LoRA `AdapterPool`) drives the
//! stores through the library binding (`kvsched_gpu::bind`), iteration after iteration, as a
//! serving binary would.
//!
//! Every iteration: requests arrive (most with a LoRA task), the pass runs, `ensure_batch` makes
//! the adapter plan, then `KvPages::apply_moves` executes the KV move log (`Scheduler::take_moves`,
//! which also settles the requests the pass resumed), `AdapterSlots::apply_plan` the adapter plan
//! (`Scheduler::take_adapter_evictions` and `SchedulerOutput::adapter_loads`) and
//! `KvPages::stage_tables` uploads the batch's block tables; the step is then completed
//! (`Scheduler::complete_step`, which refuses the same output twice). Each block the pool
//! hands out gets fresh bytes derived from (request id, block index, incarnation) — what the
//! step's kernels would write — and after every iteration the test checks that
//! - every live request's every block holds its bytes at the page its table names, on the tier the
//!   pool says (blocks are followed through the move log, which must agree with the tables);
//! - the uploaded block-table rows are the scheduled requests' GPU page lists, padded with -1;
//! - every adapter the core says is on the device has device pages holding its weights, and the
//!   binding's free device pages match the core's count;
//! - a request the pass resumed is `Resumed` until the moves are taken, then `Active`, and the
//!   scheduler's own invariants (`Scheduler::check`) hold.
//!
//! Free pages (KV on both tiers, adapter device pages) are then scribbled over, as other requests
//! and uploads would, so a skipped copy cannot go unnoticed. Requests finish after their output
//! tokens and are removed (a request stuck for `STALL_LIMIT` idle iterations is cancelled, as a
//! serving binary's timeout would); at the end the loop drains and every page must be free.

mod common;

use common::{cuda_or_skip, pattern};
use kvsched_core::adapter::{HostChange, TaskRef};
use kvsched_core::adapter_pool::AdapterPool;
use kvsched_core::config::{ChunkPolicy, Chunking, Config};
use kvsched_core::ids::{TaskId, TaskSlot};
use kvsched_core::kv::PageMove;
use kvsched_core::page_pool::{page_of, KvPool, KvPoolConfig, KvStats, KvStorage, Seq, SeqState};
use kvsched_core::request::{Ownership, RequestSpec};
use kvsched_core::scheduler::{Handle, Scheduler};
use kvsched_core::{Error, Phase, SchedulerOutput};
use kvsched_gpu::bind::{block_table_rows, AdapterSlotStats, KvPageStats};
use kvsched_gpu::{
    AdapterMemory, AdapterSlots, BlockTableShape, CudaAdapterStore, CudaKvStore, HostAdapterStore,
    HostKvStore, KvMemory, KvPages, PoolShape, Tier, BLOCK_TABLE_PAD,
};

/// Request table slots (and the batch limit).
const N: usize = 12;
/// Adapter task slots.
const T: usize = 6;
const KV: KvPoolConfig = KvPoolConfig {
    tokens_per_block: 2,
    gpu_pages: 24,
    host_pages: 16,
    slots: N as u32,
    max_blocks: 20,
};
const KV_SHAPE: PoolShape = PoolShape::new(32, KV.gpu_pages, KV.host_pages);
const TABLES: BlockTableShape = BlockTableShape::new(N as u32, KV.max_blocks);
/// Iterations without any work before the oldest request is cancelled.
const STALL_LIMIT: u32 = 20;
/// Pages of each task's adapter (task `i` has id `100 + i`).
const ADAPTER_PAGES: [u32; T] = [1, 2, 3, 1, 2, 3];
/// The core's adapter cache: device pages and host-budget pages.
const ADAPTER_DEVICE_PAGES: u32 = 6;
const ADAPTER_HOST_BUDGET: u32 = 8;
/// The adapter store: the core's device pages and its host budget (the six adapters need 12 pages:
/// host copies come and go with the core's host evictions).
const ADAPTER_SHAPE: PoolShape = PoolShape::new(24, ADAPTER_DEVICE_PAGES, ADAPTER_HOST_BUDGET);

/// The workload of one seed.
#[derive(Clone, Copy, Debug)]
struct Scenario {
    /// Token budget per pass.
    tokens: u32,
    /// Chunked prefill unit (`None`: whole prompts).
    chunk: Option<u32>,
    /// Longest prompt and longest output (uniform from 1).
    prompt: u32,
    output: u32,
}

impl Scenario {
    /// Whole prompts for one seed in three; chunked prefill with a tight token budget for the
    /// others (partly prefilled contexts resume in the same pass as generation steps evict, which
    /// gives move logs with offloads and reloads).
    fn of(seed: u64) -> Self {
        match seed % 3 {
            0 => Self {
                tokens: 64,
                chunk: None,
                prompt: 20,
                output: 16,
            },
            1 => Self {
                tokens: 24,
                chunk: Some(4),
                prompt: 30,
                output: 10,
            },
            _ => Self {
                tokens: 16,
                chunk: Some(4),
                prompt: 30,
                output: 10,
            },
        }
    }
}

/// splitmix64.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Where a block is and what it holds.
#[derive(Clone, Copy, Debug)]
struct Block {
    seed: u64,
    tier: Tier,
    page: u32,
}

/// A request the test submitted and has not finished.
#[derive(Debug)]
struct Live {
    handle: Handle,
    id: u64,
    prompt0: u32,
    output: u32,
    generated: u32,
    /// Blocks given out so far to this request (a freed and regrown cache counts again).
    incarnations: u64,
    blocks: Vec<Block>,
}

/// The bytes of a block: derived from the request id, the block index and its incarnation.
fn block_seed(id: u64, block: usize, incarnation: u64) -> u64 {
    (id << 32) ^ ((block as u64) << 16) ^ incarnation ^ 0x5eed_0000_0000_0000
}

/// Padded weights of task slot `slot` (each adapter ends in a partial page, to exercise padding).
fn weights(slot: usize) -> Vec<u8> {
    let bytes = ADAPTER_PAGES[slot] as usize * ADAPTER_SHAPE.page_bytes;
    let mut w = pattern(0xada9_7e00 + slot as u64, bytes - 5);
    w.resize(bytes, 0);
    w
}

/// What one run did, summed for the coverage assertions.
#[derive(Debug, Default)]
struct Totals {
    iterations: u64,
    /// Adapter host copies written or dropped.
    host_changes: u64,
    finished: u64,
    cancelled: u64,
    scheduled: u64,
    resumed: u64,
    /// Requests that were `Resumed` when the engine took the moves (settled to `Active`).
    settled: u64,
    recompute_paused: u64,
    kv_core: KvStats,
    kv_binding: KvPageStats,
    adapters: AdapterSlotStats,
    mixed_logs: u64,
    pages_checked: u64,
}

impl Totals {
    fn add(&mut self, other: &Totals) {
        self.iterations += other.iterations;
        self.host_changes += other.host_changes;
        self.finished += other.finished;
        self.cancelled += other.cancelled;
        self.scheduled += other.scheduled;
        self.resumed += other.resumed;
        self.settled += other.settled;
        self.recompute_paused += other.recompute_paused;
        self.kv_core.suspends += other.kv_core.suspends;
        self.kv_core.pages_offloaded += other.kv_core.pages_offloaded;
        self.kv_core.pages_reloaded += other.kv_core.pages_reloaded;
        self.kv_core.held_suspends += other.kv_core.held_suspends;
        let (a, b) = (&mut self.kv_binding, &other.kv_binding);
        a.pages_offloaded += b.pages_offloaded;
        a.pages_reloaded += b.pages_reloaded;
        a.offload_batches += b.offload_batches;
        a.reload_batches += b.reload_batches;
        a.split_logs += b.split_logs;
        a.ordering_waits += b.ordering_waits;
        a.table_uploads += b.table_uploads;
        let (a, b) = (&mut self.adapters, &other.adapters);
        a.loads += b.loads;
        a.host_fills += b.host_fills;
        a.host_drops += b.host_drops;
        a.evictions += b.evictions;
        a.pages_uploaded += b.pages_uploaded;
        a.uploads += b.uploads;
        self.mixed_logs += other.mixed_logs;
        self.pages_checked += other.pages_checked;
    }
}

type Sched<'a> = Scheduler<KvPool<'a>, AdapterPool<T>, N, T>;

/// Follows `live`'s blocks through this iteration's move log, checks the result against the
/// pool's table, and writes fresh bytes into the blocks the pool handed out.
fn follow<K: KvMemory>(
    slot: u16,
    live: &mut Live,
    pool: &KvPool<'_>,
    out: &SchedulerOutput<N>,
    log: &[PageMove],
    kv_mem: &mut K,
) {
    let seq = pool.seq(slot);
    if seq.state == SeqState::None || out.recompute_paused().iter().any(|l| l.slot() == slot) {
        // The cache was freed (recompute pause, preemption, rolled-back first chunk): whatever
        // it holds now is new.
        live.blocks.clear();
    }
    for block in &mut live.blocks {
        for m in log.iter().filter(|m| m.request.0 == live.id) {
            if m.from == block.tier && m.src == block.page {
                block.tier = block.tier.other();
                block.page = m.dst;
            }
        }
    }
    let table = pool.table(slot);
    let kept = live.blocks.len().min(table.len());
    for (index, (block, &entry)) in live.blocks.iter().zip(table).enumerate() {
        assert_eq!(
            (block.tier, block.page),
            page_of(entry),
            "request {} block {index}: the move log and the table disagree",
            live.id
        );
    }
    live.blocks.truncate(kept);
    for (index, &entry) in table.iter().enumerate().skip(kept) {
        let (tier, page) = page_of(entry);
        let seed = block_seed(live.id, index, live.incarnations);
        live.incarnations += 1;
        kv_mem
            .write_page(tier, page, &pattern(seed, KV_SHAPE.page_bytes))
            .expect("write a new block");
        live.blocks.push(Block { seed, tier, page });
    }
}

/// Every live block holds its bytes; returns the pages checked.
fn check_kv<K: KvMemory>(live: &[Option<Live>], pool: &KvPool<'_>, kv_mem: &K) -> u64 {
    let mut out = vec![0; KV_SHAPE.page_bytes];
    let mut checked = 0;
    for (slot, live) in live.iter().enumerate() {
        let Some(live) = live else {
            assert_eq!(pool.seq(slot as u16).state, SeqState::None, "slot {slot}");
            continue;
        };
        assert_eq!(live.blocks.len(), pool.table(slot as u16).len());
        for (index, block) in live.blocks.iter().enumerate() {
            kv_mem
                .read_page(block.tier, block.page, &mut out)
                .expect("read a block");
            assert!(
                out == pattern(block.seed, KV_SHAPE.page_bytes),
                "request {} block {index} at {} page {}: wrong bytes",
                live.id,
                block.tier,
                block.page
            );
            checked += 1;
        }
    }
    checked
}

/// The device block table holds the batch's rows.
fn check_tables<K: KvMemory>(rows: u32, sched: &Sched<'_>, out: &SchedulerOutput<N>, kv_mem: &K) {
    let pool = sched.kv();
    let width = TABLES.width as usize;
    let mut device = vec![0; rows as usize * width];
    kv_mem
        .read_block_tables(rows, &mut device)
        .expect("read block tables");
    let listed: Vec<_> = block_table_rows(out).collect();
    assert_eq!(listed.len(), rows as usize);
    for (row, listed) in listed.iter().enumerate() {
        let mut expected: Vec<i32> = pool
            .table(listed.slot())
            .iter()
            .map(|&p| p as i32)
            .collect();
        expected.resize(width, BLOCK_TABLE_PAD);
        let id = sched
            .get(listed.handle())
            .expect("a listed request")
            .spec()
            .id;
        assert_eq!(
            &device[row * width..(row + 1) * width],
            &expected[..],
            "row {row} (request {})",
            id.0
        );
    }
}

/// The adapters on the device per the core hold their weights in the binding's device pages.
fn check_adapters<A: AdapterMemory>(
    pool: &AdapterPool<T>,
    slots: &AdapterSlots,
    ad_mem: &A,
    out: &SchedulerOutput<N>,
) {
    assert_eq!(
        slots.device_free(),
        ADAPTER_DEVICE_PAGES - pool.device_used(),
        "free device pages"
    );
    assert_eq!(
        slots.host_free(),
        ADAPTER_HOST_BUDGET - pool.host_used(),
        "free host pages"
    );
    let page_bytes = ADAPTER_SHAPE.page_bytes;
    let mut bytes = vec![0; page_bytes];
    for (slot, task) in pool.tasks().iter().enumerate() {
        let host = slots.host_pages(TaskSlot(slot as u16));
        assert_eq!(host.is_some(), task.on_host, "task slot {slot}'s host copy");
        let w = weights(slot);
        for (index, &page) in host.unwrap_or(&[]).iter().enumerate() {
            ad_mem
                .read_page(Tier::Host, page, &mut bytes)
                .expect("read an adapter host page");
            assert!(
                bytes[..] == w[index * page_bytes..(index + 1) * page_bytes],
                "task slot {slot} weight page {index} at host page {page}: wrong bytes"
            );
        }
        let pages = slots.device_pages(TaskSlot(slot as u16));
        if !task.on_device {
            assert!(pages.is_none(), "task slot {slot} is not on the device");
            continue;
        }
        let pages = pages.expect("a resident adapter has device pages");
        assert_eq!(pages.len(), task.pages as usize);
        let w = weights(slot);
        for (index, &page) in pages.iter().enumerate() {
            ad_mem
                .read_page(Tier::Gpu, page, &mut bytes)
                .expect("read an adapter page");
            assert!(
                bytes[..] == w[index * page_bytes..(index + 1) * page_bytes],
                "task slot {slot} weight page {index} at device page {page}: wrong bytes"
            );
        }
    }
    for task in out.adapters() {
        assert!(
            slots.device_pages(task.slot).is_some(),
            "batch adapter {task:?} not on the device"
        );
    }
}

/// Overwrites every page no live block or resident adapter uses.
fn scribble<K: KvMemory, A: AdapterMemory>(
    rng: &mut Rng,
    live: &[Option<Live>],
    slots: &AdapterSlots,
    kv_mem: &mut K,
    ad_mem: &mut A,
) {
    let mut used_gpu = vec![false; KV.gpu_pages as usize];
    let mut used_host = vec![false; KV.host_pages as usize];
    for block in live.iter().flatten().flat_map(|l| &l.blocks) {
        match block.tier {
            Tier::Gpu => used_gpu[block.page as usize] = true,
            Tier::Host => used_host[block.page as usize] = true,
        }
    }
    for (tier, used) in [(Tier::Gpu, used_gpu), (Tier::Host, used_host)] {
        for page in (0..used.len()).filter(|&p| !used[p]) {
            let junk = pattern(rng.next(), KV_SHAPE.page_bytes);
            kv_mem
                .write_page(tier, page as u32, &junk)
                .expect("scribble");
        }
    }
    let mut used = vec![false; ADAPTER_DEVICE_PAGES as usize];
    for slot in 0..T as u16 {
        for &page in slots.device_pages(TaskSlot(slot)).unwrap_or(&[]) {
            used[page as usize] = true;
        }
    }
    for page in (0..used.len()).filter(|&p| !used[p]) {
        let junk = pattern(rng.next(), ADAPTER_SHAPE.page_bytes);
        ad_mem
            .write_page(Tier::Gpu, page as u32, &junk)
            .expect("scribble");
    }
}

/// Runs the serving loop for `iterations` iterations with arrivals, then drains it.
fn serve<K: KvMemory, A: AdapterMemory>(
    kv_mem: &mut K,
    ad_mem: &mut A,
    seed: u64,
    iterations: u64,
) -> Totals {
    let mut gpu_free = vec![0; KV.gpu_pages as usize];
    let mut host_free = vec![0; KV.host_pages as usize];
    let mut tables = vec![0; KV.table_len()];
    let mut seqs = vec![Seq::default(); N];
    let mut moves = vec![PageMove::default(); KV.move_log_len()];
    let pool = KvPool::new(
        KV,
        KvStorage {
            gpu_free: &mut gpu_free,
            host_free: &mut host_free,
            tables: &mut tables,
            seqs: &mut seqs,
            moves: &mut moves,
            prefix: None,
        },
    )
    .expect("KV pool");
    let mut adapter_pool: AdapterPool<T> =
        AdapterPool::new(ADAPTER_DEVICE_PAGES, ADAPTER_HOST_BUDGET).expect("adapter pool");
    let mut slots = AdapterSlots::new(ad_mem.shape()).expect("adapter slots");
    for (slot, &pages) in ADAPTER_PAGES.iter().enumerate() {
        let task = adapter_pool
            .register(TaskId(100 + slot as u64), pages)
            .expect("register task");
        assert_eq!(usize::from(task.slot), slot);
        slots.register_task(task, pages).expect("register task");
    }
    let scenario = Scenario::of(seed);
    let cfg = Config {
        max_num_requests: N as u32,
        max_num_tokens: Some(scenario.tokens),
        // Chunks of at most 40 tokens; without chunking the limit may not be below the budget
        // (`Config::validate`).
        max_context_length: Some(if scenario.chunk.is_some() {
            40
        } else {
            scenario.tokens
        }),
        chunking: scenario.chunk.map(|unit| Chunking {
            policy: ChunkPolicy::FirstComeFirstServed,
            unit,
        }),
        ..Config::default()
    };
    let mut sched: Sched<'_> = Scheduler::new(cfg, pool, adapter_pool).expect("scheduler");
    let mut kv = KvPages::new();
    let mut out = SchedulerOutput::<N>::new();
    // The adapter device evictions of one iteration (kept across iterations: no steady-state
    // allocation).
    let mut evicted: Vec<TaskRef> = Vec::with_capacity(T);
    let mut host_changes: Vec<(TaskRef, HostChange)> = Vec::with_capacity(T);
    let mut live: Vec<Option<Live>> = (0..N).map(|_| None).collect();
    let mut rng = Rng(seed);
    let mut totals = Totals::default();
    let mut next_id = 1;
    let mut iteration = 0;
    let mut stalled = 0;
    loop {
        let arriving = iteration < iterations;
        if !arriving && sched.is_empty() {
            break;
        }
        assert!(iteration < iterations + 1000, "the loop does not drain");
        iteration += 1;
        // Arrivals: 0–2 requests, three in four with a LoRA task.
        for _ in 0..if arriving { rng.below(3) } else { 0 } {
            if sched.len() == N {
                break;
            }
            let prompt = 1 + rng.below(u64::from(scenario.prompt)) as u32;
            let output = 1 + rng.below(u64::from(scenario.output)) as u32;
            let mut spec = RequestSpec::new(next_id, Phase::ContextInit, prompt);
            spec.max_new_tokens = output;
            spec.lora = (rng.below(4) != 0).then(|| TaskId(100 + rng.below(T as u64)));
            let handle = sched.submit(spec).expect("submit");
            live[usize::from(handle.index())] = Some(Live {
                handle,
                id: next_id,
                prompt0: prompt,
                output,
                generated: 0,
                incarnations: 0,
                blocks: Vec::new(),
            });
            next_id += 1;
        }

        // The pass and the adapter plan.
        sched.schedule(&mut out).expect("schedule");
        sched.ensure_batch(&mut out).expect("ensure_batch");

        // A request the pass resumed stays `Resumed` until the engine takes the moves.
        for listed in out.resumed() {
            let entry = sched
                .get(listed.handle())
                .expect("a resumed request is live");
            assert_eq!(entry.ownership(), Ownership::Resumed, "{listed:?}");
        }
        let resumed = sched
            .requests()
            .filter(|(_, entry)| entry.ownership() == Ownership::Resumed)
            .count();
        assert_eq!(
            resumed,
            out.resumed().len(),
            "only the listed requests are resumed"
        );

        // The binding: the KV moves (taking them settles the resumed requests) ...
        let moved = kv
            .apply_moves(sched.take_moves(), kv_mem)
            .expect("apply KV moves");
        moved.event.wait().expect("wait KV moves");
        for listed in out.resumed() {
            let entry = sched
                .get(listed.handle())
                .expect("a resumed request is live");
            assert_eq!(entry.ownership(), Ownership::Active, "{listed:?}");
        }
        totals.settled += resumed as u64;
        assert!(sched.take_moves().is_empty(), "the move log was taken once");
        let log = kv.last_log();
        if log.iter().any(|m| m.from == Tier::Gpu) && log.iter().any(|m| m.from == Tier::Host) {
            totals.mixed_logs += 1;
        }
        // ... then the adapters' host copies (the engine's source hands the unpadded weights; the
        // binding zero-pads the last page) ...
        host_changes.clear();
        sched.take_adapter_host_changes(|task, change| host_changes.push((task, change)));
        slots
            .apply_host_changes(ad_mem, &host_changes, &mut |task, buf| {
                let w = weights(usize::from(task.slot));
                buf[..w.len() - 5].copy_from_slice(&w[..w.len() - 5]);
                Ok(())
            })
            .expect("apply adapter host changes");
        totals.host_changes += host_changes.len() as u64;
        // ... then the adapter plan: device evictions and loads.
        evicted.clear();
        sched.take_adapter_evictions(|task| evicted.push(task));
        let uploaded = slots
            .apply_plan(ad_mem, sched.adapters().backend(), &evicted, &out)
            .expect("apply adapter plan");
        uploaded.event.wait().expect("wait adapter uploads");
        assert_eq!(uploaded.evicted as usize, evicted.len());
        assert_eq!(uploaded.loaded as usize, out.adapter_loads().len());
        for (slot, live) in live.iter_mut().enumerate() {
            if let Some(live) = live {
                follow(slot as u16, live, sched.kv(), &out, kv.last_log(), kv_mem);
            }
        }
        let staged = kv
            .stage_tables(sched.kv(), &out, kv_mem)
            .expect("stage block tables");
        staged.event.wait().expect("wait block tables");

        // The checks.
        assert!(sched.check(), "Scheduler::check");
        let pages = sched.kv().config().page_info_len();
        assert!(sched.kv().audit(&mut vec![0; pages]), "KvPool::audit");
        assert!(sched.adapters().backend().check(), "AdapterPool::check");
        check_tables(staged.rows, &sched, &out, kv_mem);
        totals.pages_checked += check_kv(&live, sched.kv(), kv_mem);
        check_adapters(sched.adapters().backend(), &slots, ad_mem, &out);
        scribble(&mut rng, &live, &slots, kv_mem, ad_mem);
        totals.scheduled += u64::from(staged.rows);
        totals.resumed += out.resumed().len() as u64;
        totals.recompute_paused += out.recompute_paused().len() as u64;

        // Complete the step: a prompt's last chunk and every decode step yield a token.
        sched.complete_step(&out).expect("complete_step");
        assert_eq!(
            sched.complete_step(&out),
            Err(Error::StaleOutput),
            "a step is completed once"
        );
        let mut finished = Vec::new();
        for chunk in out.context() {
            let slot = chunk.listed.slot();
            let Some(l) = live[usize::from(slot)].as_mut() else {
                continue;
            };
            let spec = sched.get(l.handle).expect("live request").spec();
            if spec.phase == Phase::GenerationInProgress {
                l.generated += 1;
                if l.generated >= l.output {
                    finished.push(slot);
                }
            }
        }
        for listed in out.generation() {
            let slot = listed.slot();
            let Some(l) = live[usize::from(slot)].as_mut() else {
                continue;
            };
            l.generated += 1;
            if l.generated >= l.output {
                finished.push(slot);
            }
        }
        for listed in out.recompute_paused() {
            // The replay re-prefills the prompt and what was generated.
            let Some(l) = live[usize::from(listed.slot())].as_ref() else {
                continue;
            };
            let (prompt, remaining) = (l.prompt0 + l.generated, l.output - l.generated);
            sched
                .update(l.handle, |s| {
                    s.prompt = prompt;
                    s.max_new_tokens = remaining;
                })
                .expect("update a recompute-paused request");
        }
        for slot in finished {
            if let Some(l) = live[usize::from(slot)].take() {
                sched.remove(l.handle).expect("remove");
                totals.finished += 1;
            }
        }
        // A serving binary times stuck requests out. Partly prefilled contexts can hold the GPU
        // pages each other's next chunk needs while nothing may suspend them (the core's
        // deadlock detector reports it after `deadlock_threshold` passes): cancel the oldest.
        if staged.rows == 0 && moved.batches == 0 && !sched.is_empty() {
            stalled += 1;
        } else {
            stalled = 0;
        }
        if stalled == STALL_LIMIT {
            let (handle, _) = sched.requests().next().expect("a live request");
            live[usize::from(handle.index())] = None;
            sched.remove(handle).expect("cancel");
            totals.cancelled += 1;
            stalled = 0;
        }
    }
    let pool = sched.kv();
    assert_eq!(
        (pool.gpu_free(), pool.host_free()),
        (KV.gpu_pages, KV.host_pages),
        "drained"
    );
    totals.iterations = iteration;
    totals.kv_core = pool.stats();
    totals.kv_binding = kv.stats();
    totals.adapters = slots.stats();
    assert_eq!(
        totals.kv_binding.pages_offloaded,
        totals.kv_core.pages_offloaded
    );
    assert_eq!(
        totals.kv_binding.pages_reloaded,
        totals.kv_core.pages_reloaded
    );
    let core = sched.adapters().backend().stats();
    assert_eq!(totals.adapters.loads, core.device_loads);
    assert_eq!(totals.adapters.evictions, core.device_evictions);
    // Host copies follow the core: every host load written, every host eviction freed.
    assert_eq!(totals.adapters.host_fills, core.host_loads);
    assert!(totals.adapters.host_drops <= core.host_evictions);
    totals
}

/// The scenario exercised what it is meant to: suspensions and resumes with page copies, mixed
/// logs, adapter loads and evictions, finished requests.
fn assert_coverage(totals: &Totals) {
    println!("{totals:#?}");
    assert!(totals.finished > 50, "requests finish");
    assert!(
        totals.cancelled * 20 < totals.finished,
        "stalls are rare: {} cancelled",
        totals.cancelled
    );
    assert!(totals.kv_core.pages_offloaded > 0, "suspensions copy pages");
    assert!(totals.kv_core.pages_reloaded > 0, "resumes copy pages");
    assert!(
        totals.settled > 0,
        "resumed requests are settled by taking the moves"
    );
    assert!(totals.mixed_logs > 0, "logs with both directions");
    assert!(totals.recompute_paused > 0, "recompute pauses free caches");
    assert!(totals.adapters.loads > 0 && totals.adapters.evictions > 0);
    assert!(
        totals.adapters.host_drops > 0,
        "host copies are evicted and freed ({} changes)",
        totals.host_changes
    );
    assert!(totals.pages_checked > 1000);
}

#[test]
fn host_serving_loop_keeps_every_page() {
    let mut totals = Totals::default();
    for seed in 1..=6 {
        let mut kv_mem = HostKvStore::new(KV_SHAPE, TABLES).expect("KV store");
        let mut ad_mem = HostAdapterStore::new(ADAPTER_SHAPE).expect("adapter store");
        totals.add(&serve(&mut kv_mem, &mut ad_mem, seed, 1000));
    }
    assert_coverage(&totals);
}

/// The same loop on the CUDA backend.
#[test]
fn cuda_serving_loop_keeps_every_page() {
    let Some(ctx) = cuda_or_skip("cuda_serving_loop_keeps_every_page") else {
        return;
    };
    let mut totals = Totals::default();
    for seed in 1..=4 {
        let mut kv_mem = CudaKvStore::new(&ctx, KV_SHAPE, TABLES).expect("KV store");
        let mut ad_mem = CudaAdapterStore::new(&ctx, ADAPTER_SHAPE).expect("adapter store");
        totals.add(&serve(&mut kv_mem, &mut ad_mem, seed, 600));
    }
    assert_coverage(&totals);
}
