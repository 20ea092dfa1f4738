//! Parallel sampling on forks against separate requests (issue 44; not run in CI): one prompt of
//! about 400 tokens, 4 seeded samples of 32 tokens each, served three ways on one thread:
//!
//! - `fork`: `Engine::submit_samples` (the prompt computed once, the others forked off it);
//! - `separate+prefix`: 4 requests of the same prompt with the prefix cache (the pass defers the
//!   duplicates behind the first, which then reuse its committed blocks);
//! - `separate`: 4 requests without a prefix cache.
//!
//! ```text
//! scripts/fetch-model.sh && cargo bench -p kvsched-engine --bench samples
//! ```
//!
//! Figures, each the median of `KVSCHED_BENCH_REPS` runs (default 3): the peak of GPU pages
//! requests held (`EngineLoad::gpu_used`, taken after every step; cached idle blocks not counted)
//! beside the prompt's pages; tokens/s, the tokens generated over the time of all steps (prefill
//! included); prompt positions computed (`EngineStats::prefill_tokens`); steps.

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::Instant;

use kvsched_engine::{Engine, EngineConfig, Model, Sample, Sampler};

const SAMPLES: usize = 4;
const MAX_NEW: usize = 32;
const TOKENS_PER_BLOCK: u32 = 16;

/// One run's figures.
#[derive(Clone, Copy)]
struct Run {
    peak_pages: u32,
    tok_s: f64,
    prefill: u64,
    steps: u64,
}

fn config(prefix_cache: bool) -> EngineConfig {
    EngineConfig {
        tokens_per_block: TOKENS_PER_BLOCK,
        gpu_pages: 512,
        prefix_cache,
        ..EngineConfig::default()
    }
}

fn sampler(i: usize) -> Sampler {
    Sampler::seeded(1 + i as u64, 0.8)
}

/// Serves the samples one of the three ways; steps to the end, the peak taken after every step.
fn run(model: &Model, prompt: &[u32], mode: &str) -> Run {
    let mut e = Engine::new(model, config(mode != "separate")).expect("an engine");
    if mode == "fork" {
        let samples = (0..SAMPLES)
            .map(|i| Sample {
                sampler: sampler(i),
                guide: None,
            })
            .collect();
        e.submit_samples(prompt, MAX_NEW, None, samples, 0)
            .expect("submitted");
    } else {
        for i in 0..SAMPLES {
            e.submit(prompt, MAX_NEW, None, sampler(i))
                .expect("submitted");
        }
    }
    let (mut peak, mut tokens) = (0, 0);
    let began = Instant::now();
    while !e.is_empty() {
        tokens += e
            .step()
            .expect("a step")
            .iter()
            .map(|c| c.tokens.len())
            .sum::<usize>();
        peak = peak.max(e.load().gpu_used);
    }
    let secs = began.elapsed().as_secs_f64();
    let s = e.stats();
    Run {
        peak_pages: peak,
        tok_s: tokens as f64 / secs,
        prefill: s.prefill_tokens,
        steps: s.model_steps,
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let Some(path) = common::model_path() else {
        return;
    };
    kvsched_engine::init_threads(1);
    let model = Model::load(&path).expect("the model loads");
    let reps: usize = std::env::var("KVSCHED_BENCH_REPS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(3)
        .max(1);
    let prompt = common::long_prompt(&model, 300, 44);
    let pages = prompt.len().div_ceil(TOKENS_PER_BLOCK as usize);
    println!(
        "prompt: {} tokens ({pages} pages of {TOKENS_PER_BLOCK}); {SAMPLES} samples of {MAX_NEW} tokens; 1 thread; median of {reps}",
        prompt.len()
    );
    println!("| mode | peak GPU pages held | tokens/s | prompt positions computed | steps |");
    println!("|---|---|---|---|---|");
    let mut rates = Vec::new();
    for mode in ["fork", "separate+prefix", "separate"] {
        let runs: Vec<Run> = (0..reps).map(|_| run(&model, &prompt, mode)).collect();
        let r = runs[0];
        let tok_s = median(runs.iter().map(|r| r.tok_s).collect());
        rates.push(tok_s);
        println!(
            "| {mode} | {} | {tok_s:.1} | {} | {} |",
            r.peak_pages, r.prefill, r.steps
        );
        println!(
            "samples-bench mode={mode} peak_pages={} prompt_pages={pages} tok_s={tok_s:.1} prefill={} steps={}",
            r.peak_pages, r.prefill, r.steps
        );
    }
    println!(
        "fork / separate+prefix tokens/s: {:.2}x; fork / separate: {:.2}x",
        rates[0] / rates[1],
        rates[0] / rates[2]
    );
}
