//! The serving loop on the real scheduler (not run in CI): 8 chat requests served one at a time
//! (serial) and all 8 submitted at once (batched), each on 1 and on 2 candle threads; the
//! scheduler's share of step time, the KV pool's bytes per token and the process's resident memory.
//!
//! ```text
//! scripts/fetch-model.sh && cargo bench -p kvsched-engine --bench serve
//! ```
//!
//! candle sizes its thread pool once per process, so the bench runs itself once per thread count
//! (`KVSCHED_BENCH_THREADS`; set it to run one count only) and prints a summary table of what the
//! runs measured. `KVSCHED_BENCH_REPS` (default 3) runs each mode that many times; a figure is the
//! median. Every figure is wall-clock time around [`Engine::step`] calls:
//!
//! - tokens/s: tokens generated over the time of all steps (prefill included);
//! - decode tok/s (1 stream): of the serial runs, the tokens of steps that ran no prompt chunk over
//!   those steps' time (what a single-stream decode rate is);
//! - prefill tok/s: one request with a 128-token prompt and one new token, over its one step;
//! - scheduler share: [`EngineStats::scheduler_ns`] over [`EngineStats::step_ns`] (`schedule`,
//!   `ensure_batch`, `take_moves` and `complete_step` against the whole step);
//! - batch preparation: [`EngineStats::prep_ns`] a step of the batched runs, the persistent batch
//!   (the scheduler's batch delta applied) against a rebuild from the full lists every step
//!   ([`EngineConfig::rebuild_batch`]), the two run alternately;
//! - memory: `VmHWM` (peak) and `VmRSS` from `/proc/self/status` at the end of the process.
//!
//! Each child prints one `serve-bench key=value…` line (what `scripts/bench-llama-cpp.sh` reads).

#[path = "../tests/common/mod.rs"]
mod common;

use std::process::Command;
use std::time::Instant;

use kvsched_engine::{Engine, EngineConfig, EngineStats, Message, Model, Sampler};

/// Tokens each request generates at most.
const MAX_NEW: usize = 32;
/// The prefill measurement's prompt length.
const PREFILL: usize = 128;
/// Positions a KV page holds.
const TOKENS_PER_BLOCK: u32 = 16;

const PROMPTS: [&str; 8] = [
    "Write a short story about a dragon who paints.",
    "Explain how a bicycle stays upright.",
    "What are the main causes of the seasons on Earth?",
    "Describe a walk through a forest in autumn.",
    "Give three tips for learning a new language.",
    "Why is the sky blue? Explain it to a child.",
    "Write a poem about the sea at night.",
    "How does a refrigerator keep food cold?",
];

fn main() {
    let Some(threads) = std::env::var("KVSCHED_BENCH_THREADS").ok() else {
        parent();
        return;
    };
    let threads: usize = threads.parse().expect("KVSCHED_BENCH_THREADS is a number");
    let Some(path) = common::model_path() else {
        return;
    };
    let in_force = kvsched_engine::init_threads(threads);
    let model = Model::load(&path).expect("the model loads");
    let reps: usize = std::env::var("KVSCHED_BENCH_REPS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(3)
        .max(1);
    child(&model, in_force, reps);
}

/// Runs the bench once per thread count, each in a process of its own, then the summary table.
fn parent() {
    let exe = std::env::current_exe().expect("the bench's own path");
    let mut rows = Vec::new();
    for threads in ["1", "2"] {
        let out = Command::new(&exe)
            .env("KVSCHED_BENCH_THREADS", threads)
            .env("CANDLE_NUM_THREADS", threads)
            .output()
            .expect("the bench runs itself");
        eprint!("{}", String::from_utf8_lossy(&out.stderr));
        assert!(
            out.status.success(),
            "the bench on {threads} threads failed"
        );
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        print!("{text}");
        rows.extend(text.lines().filter_map(Fields::parse));
    }
    if !rows.is_empty() {
        table(&rows);
    }
}

/// One child's `serve-bench` line, by key.
struct Fields(Vec<(String, String)>);

impl Fields {
    fn parse(line: &str) -> Option<Self> {
        let rest = line.strip_prefix("serve-bench ")?;
        let kv = rest
            .split_whitespace()
            .filter_map(|f| f.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Some(Self(kv))
    }

    fn get(&self, key: &str) -> &str {
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map_or("?", |(_, v)| v.as_str())
    }
}

fn table(rows: &[Fields]) {
    println!();
    println!(
        "| threads | serial tok/s | 8 batched tok/s | batched / serial | decode tok/s (1 stream) \
         | prefill-{PREFILL} tok/s | scheduler share serial / batched | batch prep µs persistent / rebuilt \
         | KV bytes/token | VmHWM / VmRSS MB |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for r in rows {
        let mb = |k| r.get(k).parse::<f64>().map_or(0.0, |kb| kb / 1024.0);
        println!(
            "| {} | {} | {} | {}x | {} | {} | {} % / {} % | {} / {} | {} | {:.0} / {:.0} |",
            r.get("threads"),
            r.get("serial_tok_s"),
            r.get("batched_tok_s"),
            r.get("batched_over_serial"),
            r.get("decode_tok_s"),
            r.get("prefill_tok_s"),
            r.get("sched_share_serial_pct"),
            r.get("sched_share_batched_pct"),
            r.get("prep_us_persistent"),
            r.get("prep_us_rebuilt"),
            r.get("kv_bytes_per_token"),
            mb("vm_hwm_kb"),
            mb("vm_rss_kb"),
        );
    }
}

/// What one run of the serving loop measured.
#[derive(Default, Clone, Copy)]
struct Run {
    tokens: u64,
    secs: f64,
    decode_tokens: u64,
    decode_secs: f64,
    stats: EngineStats,
}

impl Run {
    fn tok_s(&self) -> f64 {
        self.tokens as f64 / self.secs
    }

    fn decode_tok_s(&self) -> f64 {
        self.decode_tokens as f64 / self.decode_secs
    }

    fn sched_share_pct(&self) -> f64 {
        100.0 * self.stats.scheduler_ns as f64 / self.stats.step_ns.max(1) as f64
    }

    fn prep_us(&self) -> f64 {
        self.stats.prep_ns as f64 / 1e3 / self.stats.steps.max(1) as f64
    }
}

fn config(rebuild_batch: bool) -> EngineConfig {
    EngineConfig {
        tokens_per_block: TOKENS_PER_BLOCK,
        gpu_pages: 64,
        max_blocks: 16,
        rebuild_batch,
        ..EngineConfig::default()
    }
}

/// Steps `engine` until it holds no request; steps that ran no prompt chunk count as decode.
fn drain(engine: &mut Engine<'_>, run: &mut Run) {
    while !engine.is_empty() {
        let before = engine.stats();
        let t = Instant::now();
        engine.step().expect("a step");
        let dt = t.elapsed().as_secs_f64();
        let after = engine.stats();
        run.secs += dt;
        let tokens = after.tokens - before.tokens;
        run.tokens += tokens;
        if after.prefill_tokens == before.prefill_tokens {
            run.decode_tokens += tokens;
            run.decode_secs += dt;
        }
        assert!(after.steps < 100_000, "the serving loop does not finish");
    }
}

/// Serves `prompts`: all submitted at once, or each after the previous one finished.
fn serve(model: &Model, prompts: &[Vec<u32>], max_new: usize, serial: bool) -> Run {
    serve_with(model, prompts, max_new, serial, false)
}

/// [`serve`], the batch rebuilt every step or not.
fn serve_with(
    model: &Model,
    prompts: &[Vec<u32>],
    max_new: usize,
    serial: bool,
    rebuild_batch: bool,
) -> Run {
    let mut engine = Engine::new(model, config(rebuild_batch)).expect("the engine");
    let mut run = Run::default();
    for p in prompts {
        engine
            .submit(p, max_new, None, Sampler::greedy())
            .expect("submitted");
        if serial {
            drain(&mut engine, &mut run);
        }
    }
    drain(&mut engine, &mut run);
    run.stats = engine.stats();
    run
}

/// The median of `runs` by `key`.
fn median(runs: &[Run], key: fn(&Run) -> f64) -> f64 {
    let mut v: Vec<f64> = runs.iter().map(key).collect();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn child(model: &Model, threads: usize, reps: usize) {
    let tok = model.tokenizer();
    let prompts: Vec<Vec<u32>> = PROMPTS
        .iter()
        .map(|p| tok.encode_chat(&[Message::user(*p)], true).unwrap())
        .collect();
    let long: Vec<u32> = prompts.concat().into_iter().take(PREFILL).collect();
    serve(model, &prompts[..1], 4, true); // warm-up
    let mut serial = Vec::new();
    let mut batched = Vec::new();
    let mut prefill = Vec::new();
    let mut rebuilt = Vec::new();
    for _ in 0..reps {
        serial.push(serve(model, &prompts, MAX_NEW, true));
        batched.push(serve(model, &prompts, MAX_NEW, false));
        rebuilt.push(serve_with(model, &prompts, MAX_NEW, false, true));
        prefill.push(serve(model, std::slice::from_ref(&long), 1, true));
    }
    let (persistent, rebuild) = (
        median(&batched, Run::prep_us),
        median(&rebuilt, Run::prep_us),
    );
    let (s, b) = (median(&serial, Run::tok_s), median(&batched, Run::tok_s));
    let last = batched[batched.len() - 1].stats;
    let (hwm, rss) = (status_kb("VmHWM"), status_kb("VmRSS"));
    println!(
        "serve-bench threads={threads} requests={} max_new={MAX_NEW} tokens_serial={} \
         tokens_batched={} serial_tok_s={s:.1} batched_tok_s={b:.1} batched_over_serial={:.2} \
         decode_tok_s={:.1} prefill_tok_s={:.1} sched_share_serial_pct={:.4} \
         sched_share_batched_pct={:.4} sched_us_per_step={:.1} prep_us_persistent={persistent:.2} \
         prep_us_rebuilt={rebuild:.2} prep_rebuilt_over_persistent={:.2} steps_batched={} \
         largest_batch={} kv_bytes_per_token={} kv_pool_bytes={} vm_hwm_kb={hwm} vm_rss_kb={rss} reps={reps}",
        prompts.len(),
        serial[0].tokens,
        batched[0].tokens,
        b / s,
        median(&serial, Run::decode_tok_s),
        PREFILL as f64 / median(&prefill, |r| r.secs),
        median(&serial, Run::sched_share_pct),
        median(&batched, Run::sched_share_pct),
        last.scheduler_ns as f64 / 1e3 / last.steps.max(1) as f64,
        rebuild / persistent,
        last.steps,
        last.largest_batch,
        model.kv_layout(TOKENS_PER_BLOCK as usize).bytes_per_token(),
        model.kv_layout(TOKENS_PER_BLOCK as usize).page_bytes() * config(false).gpu_pages as usize,
    );
}

/// A `/proc/self/status` field in kB (0 where there is none).
fn status_kb(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}
