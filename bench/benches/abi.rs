//! Wall-clock benchmark (criterion) of a steady decode pass through the C ABI against the same pass
//! in-process: 256 requests decoding, each iteration `kvsched_schedule` (the pass, `ensure_batch`, the
//! output's lists handed to C) and `kvsched_complete_step`, beside `Scheduler::schedule`,
//! `ensure_batch` and `complete_step` on a scheduler built as the C engine builds its own (the same
//! pool, adapter cache and configuration). The two run in one process; their ratio is the ABI's cost.
//!
//! `cargo bench -p kvsched-bench --bench abi`. Each side times runs of up to [`PASSES`] consecutive
//! passes between (untimed) rebuilds, as `iteration.rs` does for S1.

use std::hint::black_box;
use std::mem::MaybeUninit;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use kvsched_capi::{
    kvsched_complete_step, kvsched_engine_free, kvsched_engine_new, kvsched_schedule,
    kvsched_submit, Engine, KvschedConfig, KvschedOutput, KvschedRequest, KvschedStatus,
    KVSCHED_MAX_ADAPTERS, KVSCHED_MAX_REQUESTS,
};
use kvsched_core::adapter_pool::AdapterPool;
use kvsched_core::page_pool::{KvPool, KvPoolConfig};
use kvsched_core::request::RequestSpec;
use kvsched_core::storage::{Boxed, Owned};
use kvsched_core::{Config, Phase, Scheduler, SchedulerOutput};

const REQUESTS: u32 = 256;
const PROMPT: u32 = 16;
const TPB: u32 = 16;
/// Passes between rebuilds (each request's KV grows a token a pass).
const PASSES: u64 = 4096;
const BLOCKS: u32 = (PROMPT + PASSES as u32 + 16) / TPB + 1;
const N: usize = KVSCHED_MAX_REQUESTS as usize;
const T: usize = KVSCHED_MAX_ADAPTERS as usize;

fn config() -> KvschedConfig {
    KvschedConfig {
        tokens_per_block: TPB,
        gpu_pages: REQUESTS * BLOCKS,
        host_pages: 0,
        max_blocks_per_request: BLOCKS,
        max_requests: REQUESTS,
        max_batch: REQUESTS,
        max_num_tokens: 0,
        chunk_unit: 0,
        recompute_pause: 0,
        prefix_cache: 0,
        adapter_device_pages: 8,
        adapter_host_pages: 64,
        kv_events: 0,
        ..kvsched_capi::kvsched_config_default()
    }
}

/// The C engine with every request decoding (two passes run).
struct C {
    engine: *mut Engine,
    out: MaybeUninit<KvschedOutput>,
}

impl C {
    fn new() -> Self {
        let (cfg, mut engine) = (config(), std::ptr::null_mut());
        // SAFETY: both pointers are valid for the call.
        let s = unsafe { kvsched_engine_new(&raw const cfg, &raw mut engine) };
        assert_eq!(s, KvschedStatus::Ok);
        for id in 0..u64::from(REQUESTS) {
            let r = KvschedRequest {
                id,
                lora_task: 0,
                prompt: PROMPT,
                max_new_tokens: PASSES as u32 + 8,
                beam: 1,
                draft: 0,
                cache_salt: 0,
                arrival: id,
                has_lora: 0,
                kind: 0,
                priority: 0,
                service_class: 0,
            };
            // SAFETY: the engine is live; the request is valid; no hashes.
            let s = unsafe { kvsched_submit(engine, &raw const r, std::ptr::null(), 0) };
            assert_eq!(s, KvschedStatus::Ok);
        }
        let mut c = Self {
            engine,
            out: MaybeUninit::uninit(),
        };
        c.pass();
        c.pass();
        c
    }

    fn pass(&mut self) {
        // SAFETY: the engine is live and `out` is valid for a write.
        let s = unsafe { kvsched_schedule(self.engine, self.out.as_mut_ptr()) };
        assert_eq!(s, KvschedStatus::Ok);
        // SAFETY: the engine is live.
        let s = unsafe { kvsched_complete_step(self.engine) };
        assert_eq!(s, KvschedStatus::Ok);
        // SAFETY: the successful `kvsched_schedule` wrote the whole output.
        black_box(unsafe { self.out.assume_init_ref() }.n_generation);
    }
}

impl Drop for C {
    fn drop(&mut self) {
        // SAFETY: from `kvsched_engine_new`, freed once.
        unsafe { kvsched_engine_free(self.engine) };
    }
}

type Sched = Scheduler<KvPool<'static, Owned>, AdapterPool<T>, N, T, Boxed>;

/// The same scheduler in-process (as `capi/src/engine.rs` builds it).
struct Rust {
    sched: Box<Sched>,
    out: Box<SchedulerOutput<N, Boxed>>,
}

impl Rust {
    fn new() -> Self {
        let c = config();
        let pool = KvPool::owned(KvPoolConfig {
            tokens_per_block: c.tokens_per_block,
            gpu_pages: c.gpu_pages,
            host_pages: c.host_pages,
            slots: c.max_requests,
            max_blocks: c.max_blocks_per_request,
        })
        .expect("pool");
        let cfg = Config {
            max_num_requests: c.max_batch,
            max_num_tokens: None,
            max_context_length: None,
            chunking: None,
            recompute_pause: false,
            ..Config::default()
        };
        let adapters =
            AdapterPool::new(c.adapter_device_pages, c.adapter_host_pages).expect("peft");
        let mut sched = Box::new(Scheduler::boxed(cfg, pool, adapters).expect("scheduler"));
        for id in 0..u64::from(REQUESTS) {
            let mut s = RequestSpec::new(id, Phase::ContextInit, PROMPT);
            s.max_new_tokens = PASSES as u32 + 8;
            s.arrival = id;
            sched.submit(s).expect("submit");
        }
        let out = Box::new(SchedulerOutput::new_in().expect("output"));
        let mut r = Self { sched, out };
        r.pass();
        r.pass();
        r
    }

    fn pass(&mut self) {
        self.sched.schedule(&mut self.out).expect("pass");
        self.sched.ensure_batch(&mut self.out).expect("adapters");
        self.sched.complete_step(&self.out).expect("step");
        black_box(self.out.generation().len());
    }
}

/// `iters` passes of `build`'s state, rebuilt (untimed) every [`PASSES`].
fn timed<S>(iters: u64, build: fn() -> S, pass: fn(&mut S)) -> Duration {
    let mut total = Duration::ZERO;
    let mut left = iters;
    while left > 0 {
        let mut s = build();
        let k = left.min(PASSES);
        let t = Instant::now();
        for _ in 0..k {
            pass(&mut s);
        }
        total += t.elapsed();
        left -= k;
    }
    total
}

fn abi(c: &mut Criterion) {
    let mut g = c.benchmark_group("abi-S1-256");
    g.warm_up_time(Duration::from_millis(500));
    g.measurement_time(Duration::from_secs(3));
    g.bench_function("in-process", |b| {
        b.iter_custom(|iters| timed(iters, Rust::new, Rust::pass));
    });
    g.bench_function("c-abi", |b| {
        b.iter_custom(|iters| timed(iters, C::new, C::pass));
    });
    g.finish();
}

criterion_group!(benches, abi);
criterion_main!(benches);
