//! kvsched's engine as an NVIDIA Dynamo worker: `dynamo-backend-common`'s [`LLMEngine`] over the
//! server's engine thread ([`kvsched_server::worker::Worker`]), behind Dynamo's frontend (OpenAI
//! HTTP, tokenization, chat template, stop strings) and its KV-aware router.
//!
//! ```text
//!   frontend ──token ids──▶ Dynamo's Worker (discovery, request plane, cancellation, drain)
//!                              │ generate(PreprocessedRequest, ctx)
//!                              ▼
//!                           KvschedEngine ── request::plan (limits, sampler) ──Job──▶ engine thread
//!                              ▲  token chunks, finish reason, usage ◀──Event──────────┘
//!                              │  ctx stopped: the receiver dropped ─▶ Engine::cancel
//!   KV router ◀──ZMQ, vLLM's format (kv_events::Publisher)──────────── each step's KV events
//! ```
//!
//! - [`engine`]: the [`LLMEngine`]: start, generate, cleanup (drains first), KV event sources;
//! - [`request`]: Dynamo's preprocessed request as an engine request, checked against the model's
//!   limits (every refusal names its field);
//! - [`model_dir`]: the model folder the frontend reads (tokenizer, chat template, config), written
//!   from the GGUF file;
//! - [`args`]: the `kvsched-dynamo` command's options.
//!
//! [`LLMEngine`]: dynamo_backend_common::LLMEngine

#![deny(missing_docs)]

pub mod args;
pub mod engine;
pub mod model_dir;
pub mod request;

pub use engine::{KvschedEngine, Setup};
