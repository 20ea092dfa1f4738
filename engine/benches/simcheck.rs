//! The simulator checked against the engine (not run in CI): this engine's step times measured into
//! the cost model's points format, a CPU cost model fitted to them (`kvsched cost --fit`'s fitter),
//! then one small trace replayed twice with the same options: on the real engine (wall clock, the
//! real scheduler, the model's forward passes) and in the simulator (the same scheduler, the fitted
//! cost model's clock). TTFT and TPOT side by side.
//!
//! ```text
//! scripts/fetch-model.sh && cargo bench -p kvsched-engine --bench simcheck
//! ```
//!
//! The trace: the first `KVSCHED_SIMCHECK_REQUESTS` (default 16) requests of the Azure
//! conversation trace (`data/azure_conv_head.csv`), their prompt and output lengths divided by 4
//! and clamped to 16..=192 and 4..=32 tokens (this model runs on two CPU cores), their arrivals
//! scaled to a mean of `KVSCHED_SIMCHECK_RATE` (default 0.5) requests a second. Prompts are
//! deterministic token ids; every request generates exactly its output length
//! ([`Sampler::ignoring_stop`]). candle runs on `KVSCHED_SIMCHECK_THREADS` (default 1) threads.
//! The measured points are written to `target/simcheck-points.jsonl` (or `KVSCHED_SIMCHECK_POINTS`).

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use kvsched_core::config::{CapacityPolicy, ChunkPolicy, Chunking, Config, Window};
use kvsched_engine::{
    Batch, BlockTableShape, Engine, EngineConfig, HostKvStore, Model, Sampler, Sequence,
};
use kvsched_sim::cost::{CostModel, MeasuredKind, MeasuredStep};
use kvsched_sim::{Engine as Preset, SimOptions};
use kvsched_workload::{Arrival, Workload};

const TOKENS_PER_BLOCK: u32 = 16;
const GPU_PAGES: u32 = 512;
const MAX_TOKENS: u32 = 256;
const MAX_BATCH: u32 = 16;
const CHUNK: u32 = 64;

fn env<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let Some(path) = common::model_path() else {
        return;
    };
    let threads = kvsched_engine::init_threads(env("KVSCHED_SIMCHECK_THREADS", 1));
    let model = Model::load(&path).expect("the model loads");
    let points = measure_points(&model);
    let out = std::env::var("KVSCHED_SIMCHECK_POINTS").unwrap_or_else(|_| {
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../target/simcheck-points.jsonl"
        )
        .to_owned()
    });
    write_points(&out, &points, &model, threads);
    let copy_us = page_copy_us(&model);
    let base = CostModel {
        page_copy_us: copy_us,
        ..CostModel::LEGACY
    };
    let cost = kvsched_sim::fit::fit(&points, &base).expect("a fit");
    let fit = kvsched_sim::cost::FitError::of(&cost, &points);
    println!(
        "{} points ({out}), fitted: floor {:.1} us, prefill token {:.2} us, decode request {:.2} us, \
         cached token {:.4} us, attention pair {:.5} us; median error {:.1} %, largest {:.1} %; \
         a {TOKENS_PER_BLOCK}-token page copied between tiers in {copy_us:.1} us",
        points.len(),
        cost.step_us,
        cost.prefill_us_per_token,
        cost.decode_us_per_request,
        cost.decode_us_per_cached_token,
        cost.attention_us_per_pair,
        100.0 * fit.median(),
        100.0 * fit.max()
    );
    let w = workload(
        env("KVSCHED_SIMCHECK_REQUESTS", 16),
        env("KVSCHED_SIMCHECK_RATE", 0.5),
    );
    let real = replay(&model, &w);
    let sim = simulate(&w, cost);
    report(&w, &real, &sim, threads);
}

/// Deterministic prompt tokens (ids the tokenizer produces for ordinary text live below 49k).
fn tokens(seed: u64, n: usize) -> Vec<u32> {
    let mut rng = common::Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    (0..n).map(|_| rng.below(40_000) as u32 + 100).collect()
}

/// The median of `reps` timings of `f`, in milliseconds.
fn median_ms(reps: usize, mut f: impl FnMut()) -> f64 {
    f();
    let mut t: Vec<f64> = (0..reps)
        .map(|_| {
            let s = Instant::now();
            f();
            s.elapsed().as_secs_f64() * 1000.0
        })
        .collect();
    t.sort_by(f64::total_cmp);
    t[reps / 2]
}

/// Step times: prefills of T tokens, decodes of B requests at context C, and mixed steps (a chunk
/// after prior context beside decodes), each the median of a few runs.
/// Sequences of the measuring store: 16 decoding ones and one for the chunks.
const SEQS: usize = 17;

/// A KV store of [`SEQS`] sequences of 640 positions, each of the first 16 holding 512 positions of
/// `ctx` (computed once); and the page tables.
fn measuring_store(model: &Model, ctx: &[u32]) -> (HostKvStore, Vec<Vec<u32>>) {
    let layout = model.kv_layout(TOKENS_PER_BLOCK as usize);
    let per_seq = layout.pages_for(640);
    let mut kv = HostKvStore::new(
        layout.pool_shape((SEQS * per_seq) as u32, 0),
        BlockTableShape::new(SEQS as u32, per_seq as u32),
    )
    .expect("a KV store");
    let tables: Vec<Vec<u32>> = (0..SEQS)
        .map(|i| ((i * per_seq) as u32..((i + 1) * per_seq) as u32).collect())
        .collect();
    for t in &tables[..SEQS - 1] {
        step(model, &mut kv, &[(ctx, 0, t)]);
    }
    (kv, tables)
}

fn measure_points(model: &Model) -> Vec<MeasuredStep> {
    let ctx = tokens(7, 512);
    let (mut kv, tables) = measuring_store(model, &ctx);
    let chunks = &tables[SEQS - 1];
    let mut points = Vec::new();
    let mut push = |batch: usize, context: usize, tokens: usize, prior: usize, ms| {
        points.push(MeasuredStep {
            kind: MeasuredKind::Step,
            batch: batch as u64,
            context: context as u64,
            tokens: tokens as u64,
            chunk_prior_context: prior as u64,
            ms_median: ms,
        });
    };
    for t in [16, 32, 64, 128, 256] {
        let p = tokens(t as u64, t);
        push(
            0,
            0,
            t,
            0,
            median_ms(3, || step(model, &mut kv, &[(&p, 0, chunks)])),
        );
    }
    let one = [ctx[0]];
    let decodes = [
        (1, 64),
        (1, 512),
        (4, 64),
        (4, 256),
        (8, 128),
        (8, 512),
        (16, 128),
        (16, 256),
    ];
    for (b, c) in decodes {
        let rows: Vec<_> = tables[..b].iter().map(|t| (&one[..], c, t)).collect();
        push(b, c, 0, 0, median_ms(5, || step(model, &mut kv, &rows)));
    }
    for (chunk, prior, b) in [
        (64, 0, 4),
        (64, 256, 4),
        (32, 128, 8),
        (64, 0, 12),
        (64, 128, 15),
    ] {
        let p = tokens(chunk as u64 + 1, chunk);
        let mut rows: Vec<_> = tables[..b].iter().map(|t| (&one[..], 256, t)).collect();
        rows.push((&p, prior, chunks));
        push(
            b,
            256,
            chunk,
            prior,
            median_ms(3, || step(model, &mut kv, &rows)),
        );
    }
    points
}

/// Microseconds to move one KV page between the host store's tiers (the median of 5 batches of 64
/// pages, GPU tier to host tier: the suspend copy of the CPU engine).
fn page_copy_us(model: &Model) -> f64 {
    use kvsched_core::kv::{PageMove, Tier};
    use kvsched_gpu::KvMemory;
    let layout = model.kv_layout(TOKENS_PER_BLOCK as usize);
    let mut kv = HostKvStore::new(layout.pool_shape(64, 64), BlockTableShape::new(1, 64))
        .expect("a KV store");
    let moves: Vec<PageMove> = (0..64)
        .map(|p| PageMove {
            request: kvsched_core::ids::RequestId(1),
            from: Tier::Gpu,
            src: p,
            dst: 63 - p,
        })
        .collect();
    let ms = median_ms(5, || {
        kv.offload(&moves)
            .expect("an offload")
            .wait()
            .expect("done");
    });
    ms * 1000.0 / 64.0
}

/// One forward step over `(tokens, start, pages)` rows.
fn step(model: &Model, kv: &mut HostKvStore, rows: &[(&[u32], usize, &Vec<u32>)]) {
    let mut batch = Batch::new();
    for &(tokens, start, pages) in rows {
        batch.push(Sequence {
            tokens,
            start,
            pages,
            local_pages: None,
            logits: true,
            adapter: None,
        });
    }
    model.step(&batch, kv, None).expect("a step");
}

fn write_points(path: &str, points: &[MeasuredStep], model: &Model, threads: usize) {
    let c = model.config();
    let mut text = serde_json::json!({
        "machine": format!("{} CPU threads (candle), {}", threads, std::env::consts::ARCH),
        "model": "SmolLM2-135M-Instruct, Q4_1 re-quantized to Q8_0 (kvsched-engine)",
        "layers": c.blocks, "kv_dim": c.kv_dim(), "vocab": c.vocab,
        "how": "engine/benches/simcheck.rs: Model::step on a HostKvStore, median of 3-5 runs",
    })
    .to_string();
    for p in points {
        text.push('\n');
        text.push_str(
            &serde_json::json!({
                "kind": "step", "batch": p.batch, "context": p.context, "tokens": p.tokens,
                "chunk_prior_context": p.chunk_prior_context, "ms_median": p.ms_median,
            })
            .to_string(),
        );
    }
    text.push('\n');
    if let Some(dir) = std::path::Path::new(path).parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    std::fs::write(path, text).expect("write the points");
}

/// The trace slice both runs replay.
fn workload(n: usize, rate: f64) -> Workload {
    let file = concat!(env!("CARGO_MANIFEST_DIR"), "/../data/azure_conv_head.csv");
    let mut w = kvsched_workload::load(file).expect("the Azure trace slice");
    w.arrivals.truncate(n);
    for a in &mut w.arrivals {
        a.prompt_tokens = (a.prompt_tokens / 4).clamp(16, 192);
        a.output_tokens = (a.output_tokens / 4).clamp(4, 32);
    }
    let span_s = w.span_ms() / 1000.0;
    if span_s > 0.0 {
        w.scale_time((n as f64 - 1.0) / rate / span_s);
    }
    w
}

/// The scheduler configuration both runs use (the simulator's own, for these options).
fn scheduler_config() -> Config {
    Config {
        max_num_requests: MAX_BATCH,
        max_num_tokens: Some(MAX_TOKENS),
        max_context_length: Some(MAX_TOKENS),
        chunking: Some(Chunking {
            policy: ChunkPolicy::FirstComeFirstServed,
            unit: CHUNK,
        }),
        policy: CapacityPolicy::MaxUtilization,
        recompute_pause: true,
        prefix_aware: true,
        window: Window::Decoder,
        ..Config::DEFAULT
    }
}

/// Per request: TTFT and TPOT in milliseconds; and the run's wall seconds.
struct Latencies {
    ttft: Vec<f64>,
    tpot: Vec<f64>,
    seconds: f64,
    stats: kvsched_engine::EngineStats,
}

/// The trace on the real engine, in wall-clock time: a request is submitted when its arrival time
/// has come; the first token is timed at the end of the step that sampled it.
fn replay(model: &Model, w: &Workload) -> Latencies {
    let cfg = EngineConfig {
        scheduler: scheduler_config(),
        tokens_per_block: TOKENS_PER_BLOCK,
        gpu_pages: GPU_PAGES,
        max_blocks: 16,
        ..EngineConfig::default()
    };
    let mut engine = Engine::new(model, cfg).expect("an engine");
    let start = Instant::now();
    let mut live: Vec<(u64, usize)> = Vec::new(); // (id, arrival index)
    let mut first = vec![None; w.arrivals.len()];
    let mut last = vec![0.0; w.arrivals.len()];
    let mut next = 0;
    while next < w.arrivals.len() || !engine.is_empty() {
        let now = start.elapsed().as_secs_f64() * 1000.0;
        while next < w.arrivals.len() && w.arrivals[next].at_ms <= now {
            let id = submit(&mut engine, &w.arrivals[next], next);
            live.push((id, next));
            next += 1;
        }
        if engine.is_empty() {
            let wait = w.arrivals[next].at_ms - now;
            std::thread::sleep(Duration::from_secs_f64(wait.max(0.0) / 1000.0));
            continue;
        }
        let done = engine.step().expect("a step");
        let t = start.elapsed().as_secs_f64() * 1000.0;
        for &(id, i) in &live {
            let generated = engine.generated(id).is_none_or(|n| n > 0);
            if first[i].is_none() && generated {
                first[i] = Some(t);
            }
        }
        for c in &done {
            if let Some(&(_, i)) = live.iter().find(|(id, _)| *id == c.id) {
                last[i] = t;
            }
        }
        live.retain(|(id, _)| done.iter().all(|c| c.id != *id));
    }
    latencies(
        w,
        &first,
        &last,
        start.elapsed().as_secs_f64(),
        engine.stats(),
    )
}

fn submit(engine: &mut Engine<'_>, a: &Arrival, i: usize) -> u64 {
    let prompt = tokens(1000 + i as u64, a.prompt_tokens as usize);
    let sampler = Sampler::greedy().ignoring_stop();
    engine
        .submit(&prompt, a.output_tokens as usize, None, sampler)
        .expect("a trace request fits the engine")
}

fn latencies(
    w: &Workload,
    first: &[Option<f64>],
    last: &[f64],
    seconds: f64,
    stats: kvsched_engine::EngineStats,
) -> Latencies {
    let mut ttft = Vec::new();
    let mut tpot = Vec::new();
    for (i, a) in w.arrivals.iter().enumerate() {
        let f = first[i].expect("every request got its first token");
        ttft.push(f - a.at_ms);
        if a.output_tokens > 1 {
            tpot.push((last[i] - f) / f64::from(a.output_tokens - 1));
        }
    }
    ttft.sort_by(f64::total_cmp);
    tpot.sort_by(f64::total_cmp);
    Latencies {
        ttft,
        tpot,
        seconds,
        stats,
    }
}

/// The same trace in the simulator, under the fitted cost model.
fn simulate(w: &Workload, cost: CostModel) -> kvsched_sim::Report {
    let o = SimOptions {
        kv_gpu_pages: GPU_PAGES,
        kv_host_pages: 0,
        tokens_per_block: TOKENS_PER_BLOCK,
        max_tokens: MAX_TOKENS,
        max_batch: MAX_BATCH,
        policy: CapacityPolicy::MaxUtilization,
        chunking: scheduler_config().chunking,
        recompute_pause: true,
        cost,
        engine: Preset::Legacy,
        check: true,
        progress: false,
        ..SimOptions::default()
    };
    kvsched_sim::run(&o, w.clone()).expect("the simulation runs")
}

fn median(sorted: &[f64]) -> f64 {
    kvsched_sim::stats::percentile(sorted, 0.5).unwrap_or(f64::NAN)
}

fn report(w: &Workload, real: &Latencies, sim: &kvsched_sim::Report, threads: usize) {
    let row = |name: &str, engine: f64, simulated: f64| {
        println!(
            "| {name} | {engine:.1} | {simulated:.1} | {:+.1} % |",
            100.0 * (simulated - engine) / engine
        );
    };
    println!(
        "\n{} requests of data/azure_conv_head.csv (lengths / 4), {threads} candle thread(s); \
         engine run {:.1} s, simulated {:.1} s",
        w.arrivals.len(),
        real.seconds,
        sim.sim_seconds
    );
    println!(
        "\n| median | engine (wall clock) | simulator (fitted CPU model) | simulator − engine |"
    );
    println!("|---|---|---|---|");
    row("TTFT ms", median(&real.ttft), sim.ttft_ms.p50);
    row("TPOT ms", median(&real.tpot), sim.tpot_ms.p50);
    let s = &real.stats;
    let ms = |ns: u64| ns as f64 / 1e6 / s.model_steps.max(1) as f64;
    println!(
        "\nengine: {} model steps, {:.2} ms a step, {:.2} ms of it in the model, {:.3} ms in the \
         scheduler ({:.3} % of step time)",
        s.model_steps,
        ms(s.step_ns),
        ms(s.model_ns),
        ms(s.scheduler_ns),
        100.0 * s.scheduler_ns as f64 / s.step_ns.max(1) as f64
    );
}
