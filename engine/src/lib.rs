//! A CPU engine for kvsched: a GGUF llama or Gemma 3 model run through candle, whose attention
//! reads the KV cache from the pages of kvsched-gpu's host store.
//!
//! - [`Model::load`] checks a GGUF file (architecture, hyper-parameters, every tensor's type,
//!   shape and extent; a one-line [`EngineError`] naming the file) and loads it, re-quantizing its
//!   matrices to Q8_0: candle's Q8_0 matmuls give every row the same bits whatever the batch.
//!   Gemma 3 ([`GemmaConfig`]) adds per-head q/k norms, post-norms, GeGLU, and sliding-window
//!   attention on five layers of six.
//! - [`Tokenizer`] is built from the file's metadata: byte-level BPE (digits one by one, no prefix
//!   space) or SentencePiece's BPE (merges by score, byte fallback), control tokens special, the
//!   chat template rendered ([`Tokenizer::encode_chat`]).
//! - [`Model::step`] runs a packed [`Batch`] of prefill chunks and decode tokens of several
//!   sequences. Attention is a hand-written loop per row over its sequence's pages ([`KvLayout`])
//!   in position order, so a sequence's logits are bit-identical however it was chunked, batched
//!   or placed in pages; a sliding-window layer reads no page wholly before its window, and may
//!   have a page table of its own ([`Sequence::local_pages`]). LoRA adapters ([`Lora`]) are read
//!   from an adapter store's pages.
//! - [`Reference`] runs one request alone, whole prompt, contiguous cache: what identity tests
//!   compare the paged step against.
//!
//! ```no_run
//! use kvsched_engine::{Batch, HostKvStore, BlockTableShape, Message, Model, Sequence};
//!
//! kvsched_engine::init_threads(2);
//! let model = Model::load("SmolLM2-135M-Instruct.Q4_1.gguf")?;
//! let prompt = model
//!     .tokenizer()
//!     .encode_chat(&[Message::user("What is the capital of France?")], true)?;
//! let layout = model.kv_layout(16);
//! let mut kv = HostKvStore::new(layout.pool_shape(64, 0), BlockTableShape::new(1, 64))?;
//! let pages: Vec<u32> = (0..layout.pages_for(prompt.len() + 1) as u32).collect();
//! let mut batch = Batch::new();
//! batch.push(Sequence {
//!     tokens: &prompt,
//!     start: 0,
//!     pages: &pages,
//!     local_pages: None,
//!     logits: true,
//!     adapter: None,
//! });
//! let logits = model.step(&batch, &mut kv, None)?;
//! let next = logits.argmax(0).unwrap();
//! println!("{}", model.tokenizer().decode(&[next])?);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![deny(missing_docs)]

mod conversation;
mod draft;
mod error;
mod gguf;
mod hybrid;
mod kv;
mod lora;
mod math;
mod model;
mod reference;
mod sample;
mod serve;
mod step;
mod tokenizer;

pub use conversation::Conversation;
pub use draft::{accepted, PromptLookup};
pub use error::{EngineError, Grouped, Limit, Refusal, Result};
pub use gguf::{GemmaConfig, ModelConfig};
pub use hybrid::{
    HybridCompletion, HybridConfig, HybridEngine, HybridModel, HybridSpec, HybridStats, MambaDims,
    HYBRID_REQUESTS,
};
pub use kv::KvLayout;
pub use lora::{Lora, Projection};
pub use math::argmax;
pub use model::{Model, Weight};
pub use reference::Reference;
pub use sample::{Logprob, Penalties, Sampler};
pub use serve::{
    block_hashes, events::KvBlockEvent, BeamResult, BeamSearch, BeamSequence, Completion, Engine,
    EngineConfig, EngineLoad, EngineStats, Finish, Guide, GuideError, KvExtent, KvTransfer, Sample,
    SubmitOptions, DEFAULT_REQUESTS, MAX_ADAPTERS, MAX_REQUESTS, STALL_STEPS,
};
pub use step::{Batch, GroupedKv, Logits, Sequence};
pub use tokenizer::{Message, Tokenizer, GEMMA_TURNS};

/// The scheduler's configuration types and a request's lifecycle state, re-exported from
/// kvsched-core.
pub use kvsched_core::request::Ownership;
pub use kvsched_core::{CapacityPolicy, ChunkPolicy, Chunking, Config as SchedulerConfig};

/// The stores the engine reads and writes, re-exported from kvsched-gpu.
pub use kvsched_gpu::{BlockTableShape, HostAdapterStore, HostKvStore, PageStore, PoolShape, Tier};

/// Sets the number of threads candle's CPU kernels use and returns the number in force.
///
/// candle sizes its thread pool (whose workers busy-wait between kernels) once per process, from
/// `CANDLE_NUM_THREADS`, at its first kernel. The first call of this function sets that variable
/// (unless it is set already) and starts the pool; later calls only report the count. Call it at
/// the start of `main`, before other threads run: it changes the process environment.
pub fn init_threads(threads: usize) -> usize {
    static INIT: std::sync::Once = std::sync::Once::new();
    INIT.call_once(|| {
        if threads > 0 && std::env::var_os("CANDLE_NUM_THREADS").is_none() {
            std::env::set_var("CANDLE_NUM_THREADS", threads.to_string());
        }
    });
    candle_core::utils::barrier_pool().n_workers() + 1
}
