//! The engine's throughput on the test model (not run in CI): single-stream decode, 8 sequences
//! decoding in one batch, and a 128-token prefill, each on 1 and on 2 candle threads.
//!
//! ```text
//! scripts/fetch-model.sh && cargo bench -p kvsched-engine --bench engine
//! ```
//!
//! candle sizes its thread pool once per process, so the bench runs itself once per thread count
//! (`KVSCHED_BENCH_THREADS`; set it to run one count only). Throughput is in tokens (criterion's
//! "elem/s"): one per sequence per decode step, 128 per prefill.

#[path = "../tests/common/mod.rs"]
mod common;

use std::process::Command;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput};
use kvsched_engine::{Batch, BlockTableShape, HostKvStore, Message, Model, Sequence};

const CONTEXT: usize = 64;
const PREFILL: usize = 128;
const BATCH: usize = 8;

fn main() {
    let Some(threads) = std::env::var("KVSCHED_BENCH_THREADS").ok() else {
        // Once per thread count, each in a process of its own.
        let exe = std::env::current_exe().expect("the bench's own path");
        for threads in ["1", "2"] {
            let status = Command::new(&exe)
                .args(std::env::args_os().skip(1))
                .env("KVSCHED_BENCH_THREADS", threads)
                .env("CANDLE_NUM_THREADS", threads)
                .status()
                .expect("the bench runs itself");
            assert!(status.success(), "the bench on {threads} threads failed");
        }
        return;
    };
    let threads: usize = threads.parse().expect("KVSCHED_BENCH_THREADS is a number");
    let Some(path) = common::model_path() else {
        return;
    };
    let in_force = kvsched_engine::init_threads(threads);
    let model = Model::load(&path).expect("the model loads");
    let mut c = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_secs(2))
        .measurement_time(Duration::from_secs(6))
        .configure_from_args();
    bench(&mut c, &model, in_force);
    c.final_summary();
}

/// `CONTEXT` tokens of a chat prompt, repeated as needed.
fn context(model: &Model, len: usize) -> Vec<u32> {
    let prompt = model
        .tokenizer()
        .encode_chat(
            &[Message::user(
                "Write a long story about a dragon who paints.",
            )],
            true,
        )
        .unwrap();
    prompt.iter().cycle().take(len).copied().collect()
}

fn bench(c: &mut Criterion, model: &Model, threads: usize) {
    let layout = model.kv_layout(16);
    let per_seq = layout.pages_for(PREFILL.max(CONTEXT + 1));
    let mut kv = HostKvStore::new(
        layout.pool_shape((BATCH * per_seq) as u32, 0),
        BlockTableShape::new(BATCH as u32, per_seq as u32),
    )
    .unwrap();
    let tables: Vec<Vec<u32>> = (0..BATCH)
        .map(|i| ((i * per_seq) as u32..((i + 1) * per_seq) as u32).collect())
        .collect();
    let prompt = context(model, CONTEXT);
    for table in &tables {
        let mut batch = Batch::new();
        batch.push(Sequence {
            tokens: &prompt,
            start: 0,
            pages: table,
            local_pages: None,
            logits: false,
            adapter: None,
        });
        model.step(&batch, &mut kv, None).unwrap();
    }
    let mut group = c.benchmark_group(format!("engine/{threads}-thread"));
    let next = [prompt[0]];
    for n in [1, BATCH] {
        group.throughput(Throughput::Elements(n as u64));
        let name = if n == 1 {
            "decode-1-stream"
        } else {
            "decode-8-batched"
        };
        group.bench_function(BenchmarkId::new(name, format!("context-{CONTEXT}")), |b| {
            b.iter(|| {
                // Each sequence decodes position CONTEXT again: the same work every iteration.
                let mut batch = Batch::new();
                for table in &tables[..n] {
                    batch.push(Sequence {
                        tokens: &next,
                        start: CONTEXT,
                        pages: table,
                        local_pages: None,
                        logits: true,
                        adapter: None,
                    });
                }
                model.step(&batch, &mut kv, None).unwrap()
            });
        });
    }
    let long = context(model, PREFILL);
    group.throughput(Throughput::Elements(PREFILL as u64));
    group.bench_function(BenchmarkId::new("prefill", PREFILL), |b| {
        b.iter(|| {
            let mut batch = Batch::new();
            batch.push(Sequence {
                tokens: &long,
                start: 0,
                pages: &tables[0],
                local_pages: None,
                logits: true,
                adapter: None,
            });
            model.step(&batch, &mut kv, None).unwrap()
        });
    });
    group.finish();
}
