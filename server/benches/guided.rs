//! Structured output's cost per step: the llguidance mask computed and applied to one row of
//! logits, on the test model's vocabulary (SmolLM2, 49,152 tokens) and Gemma 3's (262,144) when
//! fetched, for a JSON schema, any JSON object, a regex and a choice. Each iteration generates a
//! constrained output with pseudo-random logits (the likeliest allowed token drawn, then committed);
//! the time reported is per step, the mask only (drawing and committing left out).
//!
//! ```text
//! scripts/fetch-model.sh && scripts/fetch-gemma3.sh
//! cargo bench -p kvsched-server --bench guided
//! ```

#[path = "../../engine/tests/common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use kvsched_engine::{argmax, Tokenizer};
use kvsched_server::api::Format;
use kvsched_server::guided::Guides;
use serde_json::json;

/// Steps one output takes at most.
const STEPS: usize = 48;

/// A row of logits for step `step`: SplitMix64 noise, the same on every run.
fn logits(vocab: usize, step: usize) -> Vec<f32> {
    let mut s = 0x9E37_79B9_7F4A_7C15u64.wrapping_mul(step as u64 + 1);
    (0..vocab)
        .map(|_| {
            s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = s;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            ((z >> 40) as f32) / (1u64 << 24) as f32 * 8.0
        })
        .collect()
}

fn formats() -> [(&'static str, Format); 4] {
    let person = json!({"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 24}, "age": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3}},
        "required": ["name", "age", "tags"], "additionalProperties": false});
    [
        ("json_schema", Format::JsonSchema(person)),
        ("json_object", Format::JsonObject),
        ("regex", Format::Regex("[0-9]{3}-[0-9]{4}".into())),
        (
            "choice",
            Format::Choice(vec!["yes".into(), "no".into(), "maybe".into()]),
        ),
    ]
}

/// The mask's time over one constrained output, and its steps.
fn one_output(
    guides: &Guides,
    tok: &Tokenizer,
    format: &Format,
    rows: &[Vec<f32>],
) -> (Duration, usize) {
    let mut guide = guides.guide(tok, format).expect("the format compiles");
    let mut spent = Duration::ZERO;
    for (step, row) in rows.iter().enumerate() {
        let mut row = row.clone();
        let start = Instant::now();
        guide.mask(&mut row).expect("a mask");
        spent += start.elapsed();
        let token = argmax(&row);
        if tok.is_stop(token) {
            return (spent, step + 1);
        }
        guide.commit(token).expect("an allowed token");
    }
    (spent, rows.len())
}

fn bench(c: &mut Criterion) {
    let models = [
        ("smollm2", common::model_path()),
        ("gemma3", common::gemma3_path()),
    ];
    for (name, path) in models {
        let Some(path) = path else { continue };
        let tok = Tokenizer::load(&path).expect("the tokenizer loads");
        let guides = Guides::default();
        let rows: Vec<Vec<f32>> = (0..STEPS).map(|s| logits(tok.vocab_size(), s)).collect();
        let mut group = c.benchmark_group(format!("guided_mask/{name}"));
        for (kind, format) in formats() {
            group.bench_function(kind, |b| {
                b.iter_custom(|iters| {
                    let mut total = Duration::ZERO;
                    for _ in 0..iters {
                        let (spent, steps) = one_output(&guides, &tok, &format, &rows);
                        total += spent / u32::try_from(steps).unwrap();
                    }
                    total
                });
            });
        }
        group.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
