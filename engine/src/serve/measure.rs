//! The engine's KV side at long context, full-only against grouped, without the model: the
//! scheduler, pools and per-group stores [`backend::build`] makes for Gemma 3 270M's geometry,
//! driven through the calls [`Engine::step`](super::Engine::step) makes around the model step
//! (`schedule`, `ensure_batch`, each group's moves into its store, each group's block tables,
//! `complete_step`). A Gemma prefill of 32k tokens is far too slow on a CPU for a test; the pages
//! the KV side holds do not depend on the tokens. `engine/tests/gemma3_lifecycle.rs` measures the
//! same on the real engine at 1k and 4k (`pages_and_bytes_on_the_real_engine`, ignored: slow).

use kvsched_core::request::RequestSpec;
use kvsched_core::{ChunkPolicy, Chunking, Phase};
use kvsched_gpu::PageStore;

use super::backend::{self, Output};
use super::EngineConfig;
use crate::error::Result;
use crate::gguf::{GemmaConfig, ModelConfig};

const TPB: usize = 16;
const WINDOW: usize = 512;
/// Decode steps after the prompt: a context of `n` tokens is a prompt of `n - DECODE` and
/// `DECODE` generated tokens (32,768 is Gemma 3 270M's context length).
const DECODE: usize = 8;

/// Gemma 3 270M's configuration as its GGUF states it (`engine/tests/gemma3.rs` checks these).
fn gemma3_270m() -> ModelConfig {
    ModelConfig {
        architecture: "gemma3".into(),
        name: None,
        blocks: 18,
        embedding: 640,
        feed_forward: 2048,
        heads: 4,
        kv_heads: 1,
        head_dim: 256,
        rope_base: 1_000_000.0,
        rms_eps: 1e-6,
        context_length: 32_768,
        vocab: 262_144,
        tied_embeddings: true,
        gemma: Some(GemmaConfig {
            sliding_window: WINDOW,
            global_every: 6,
            local_rope_base: 10_000.0,
            attention_scale: 0.0625,
            final_softcap: None,
        }),
    }
}

/// What one request held at the end of its run, per group, and the window group's peak.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Held {
    pages: [usize; 2],
    window_peak: usize,
    bytes: usize,
}

/// One request of `context` tokens (prompt in chunks of 512, then `DECODE` decode steps) through
/// the engine's KV side; full-only or grouped.
fn run(context: usize, grouped: bool) -> Result<Held> {
    let model = gemma3_270m();
    let blocks = context.div_ceil(TPB) as u32;
    let mut cfg = EngineConfig {
        tokens_per_block: TPB as u32,
        gpu_pages: blocks,
        host_pages: 0,
        max_blocks: blocks,
        full_attention_only: !grouped,
        window_gpu_pages: Some(((2 * WINDOW) / TPB + 2) as u32),
        ..EngineConfig::default()
    };
    cfg.scheduler.max_num_tokens = Some(512);
    cfg.scheduler.chunking = Some(Chunking {
        policy: ChunkPolicy::FirstComeFirstServed,
        unit: TPB as u32,
    });
    let (mut sched, mut stores) = backend::build(&model, &cfg)?;
    let mut out = Output::new_in()?;
    let mut spec = RequestSpec::new(1, Phase::ContextInit, (context - DECODE) as u32);
    spec.max_new_tokens = DECODE as u32;
    let h = sched.submit_with_prefix(spec, 0, &[])?;
    let held = |sched: &backend::Sched, g: usize| {
        sched.pool(g).map_or(0, |p| {
            let table = p.table(h.index());
            table.iter().filter(|&&e| e != super::NO_PAGE).count()
        })
    };
    let (mut decoded, mut window_peak) = (0, 0);
    for _ in 0..2 * context {
        if decoded == DECODE {
            break;
        }
        sched.schedule(&mut out)?;
        sched.ensure_batch(&mut out)?;
        backend::apply_moves(&mut sched, &mut stores)?;
        backend::stage_tables(&sched, &out, &mut stores)?;
        decoded += out.generation().len();
        sched.complete_step(&out)?;
        window_peak = window_peak.max(held(&sched, 1));
    }
    assert_eq!(decoded, DECODE, "{context} tokens: the request decodes");
    let pages = [held(&sched, 0), held(&sched, 1)];
    let bytes = (0..stores.len())
        .map(|g| pages[g] * stores[g].kv.shape().page_bytes)
        .sum();
    Ok(Held {
        pages,
        window_peak,
        bytes,
    })
}

/// The table of docs/KV-GROUPS.md ("Measured"): pages one request holds and their KV bytes.
#[test]
fn pages_and_bytes_at_long_context_full_only_against_grouped() {
    let mib = |b: usize| b as f64 / (1024.0 * 1024.0);
    println!(
        "| context | full-only pages | grouped: full + window pages (window peak) \
         | KV MiB full-only / grouped | saved |"
    );
    for context in [1024, 4096, 16_384, 32_768] {
        let full = run(context, false).unwrap();
        let grouped = run(context, true).unwrap();
        let blocks = context / TPB;
        assert_eq!(full.pages, [blocks, 0], "{context}: one page a block");
        assert_eq!(
            grouped.pages[0], blocks,
            "{context}: group 0 holds every block"
        );
        assert!(
            grouped.pages[1] <= WINDOW / TPB + 1,
            "{context}: {grouped:?}"
        );
        assert!(
            grouped.window_peak <= (2 * WINDOW) / TPB + 2,
            "{context}: {grouped:?}"
        );
        assert!(grouped.bytes < full.bytes);
        println!(
            "| {context} | {} | {} + {} ({}) | {:.1} / {:.1} | {:.1}x |",
            full.pages[0],
            grouped.pages[0],
            grouped.pages[1],
            grouped.window_peak,
            mib(full.bytes),
            mib(grouped.bytes),
            full.bytes as f64 / grouped.bytes as f64
        );
    }
}
