//! A step budget in time against the token budget alone (issue 45; not run in CI): a stream decodes
//! while a prompt of about 1,800 tokens is admitted; how long does the stream wait between tokens?
//!
//! ```text
//! scripts/fetch-model.sh && cargo bench -p kvsched-engine --bench itl
//! ```
//!
//! One thread, SmolLM2-135M on the CPU engine, a 512-token step budget (`kvsched serve`'s default) in
//! chunks of any length (unit 1). The stream (a short prompt, 96 new tokens) has produced 8 tokens
//! when the long prompt (4 new tokens) is submitted. Two runs:
//!
//! - `tokens`: the token budget alone;
//! - `time`: the same and `Config::step_budget`, a target of `KVSCHED_ITL_MS` (default 30 ms) over the
//!   cost model `kvsched cost --fit` fitted to this engine (`CostModel::cpu_smollm2_135m`).
//!
//! Figures: the stream's inter-token gaps from the long prompt's submission to the stream's end (median
//! and worst, ms, and their ratio: the target is within 2×), the long prompt's time to its first token,
//! and the wall time until both ended (the time budget's cost in throughput).

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::Instant;

use kvsched_core::{ChunkPolicy, Chunking, StepBudget};
use kvsched_engine::{Engine, EngineConfig, Model, Sampler};
use kvsched_sim::cost::CostModel;

const STREAM_NEW: usize = 96;
const WARM: usize = 8;

/// One run's figures (milliseconds).
struct Run {
    median_gap: f64,
    worst_gap: f64,
    ttft: f64,
    total: f64,
    gaps: usize,
}

fn config(itl_ms: Option<u64>) -> EngineConfig {
    let mut c = EngineConfig {
        gpu_pages: 256,
        ..EngineConfig::default()
    };
    c.scheduler.max_num_tokens = Some(512);
    c.scheduler.chunking = Some(Chunking {
        policy: ChunkPolicy::FirstComeFirstServed,
        unit: 1,
    });
    c.scheduler.step_budget = itl_ms.map(|ms| StepBudget {
        itl_us: ms * 1000,
        cost: CostModel::cpu_smollm2_135m(c.tokens_per_block).step_cost(),
    });
    c
}

fn run(model: &Model, stream: &[u32], long: &[u32], itl_ms: Option<u64>) -> Run {
    let mut e = Engine::new(model, config(itl_ms)).expect("an engine");
    let s = e
        .submit(stream, STREAM_NEW, None, Sampler::greedy())
        .expect("the stream");
    while e.generated(s).unwrap_or(0) < WARM {
        e.step().expect("a step");
    }
    let began = Instant::now();
    let l = e
        .submit(long, 4, None, Sampler::greedy())
        .expect("the prompt");
    let (mut last, mut produced) = (Instant::now(), e.generated(s).unwrap_or(0));
    let (mut gaps, mut ttft) = (Vec::new(), None);
    while !e.is_empty() {
        let done = e.step().expect("a step");
        let now = Instant::now();
        let n = e
            .generated(s)
            .or_else(|| done.iter().find(|c| c.id == s).map(|c| c.tokens.len()))
            .unwrap_or(produced);
        if n > produced {
            gaps.push(now.duration_since(last).as_secs_f64() * 1e3);
            (last, produced) = (now, n);
        }
        let first = e.generated(l).is_some_and(|g| g > 0) || done.iter().any(|c| c.id == l);
        if ttft.is_none() && first {
            ttft = Some(now.duration_since(began).as_secs_f64() * 1e3);
        }
    }
    let total = began.elapsed().as_secs_f64() * 1e3;
    let worst_gap = gaps.iter().copied().fold(0.0, f64::max);
    let count = gaps.len();
    gaps.sort_by(f64::total_cmp);
    Run {
        median_gap: gaps[count / 2],
        worst_gap,
        ttft: ttft.unwrap_or(total),
        total,
        gaps: count,
    }
}

fn main() {
    let Some(path) = common::model_path() else {
        return;
    };
    kvsched_engine::init_threads(1);
    let model = Model::load(&path).expect("the model loads");
    let itl_ms: u64 = std::env::var("KVSCHED_ITL_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(30);
    let stream = common::long_prompt(&model, 20, 45);
    let long = common::long_prompt(&model, 1_680, 46);
    println!(
        "stream: {} prompt tokens, {STREAM_NEW} new; long prompt: {} tokens; 1 thread; target {itl_ms} ms",
        stream.len(),
        long.len()
    );
    println!("| budget | stream gaps | median gap ms | worst gap ms | worst / median | long prompt TTFT ms | both done ms |");
    println!("|---|---|---|---|---|---|---|");
    let mut totals = Vec::new();
    for (name, itl) in [("tokens", None), ("time", Some(itl_ms))] {
        let r = run(&model, &stream, &long, itl);
        totals.push(r.total);
        let ratio = r.worst_gap / r.median_gap;
        let cells = [r.median_gap, r.worst_gap, ratio, r.ttft, r.total];
        let cells: Vec<String> = cells.iter().map(|c| format!("{c:.2}")).collect();
        println!("| {name} | {} | {} |", r.gaps, cells.join(" | "));
    }
    println!(
        "time budget / token budget, wall time to both done: {:.2}x",
        totals[1] / totals[0]
    );
}
