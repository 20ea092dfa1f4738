//! `kvsched serve`: an OpenAI-compatible HTTP server over the kvsched-engine serving loop.
//!
//! ```text
//!   clients ──HTTP──▶ listen (hyper HTTP/1) ─▶ guard (key, CORS) ─▶ axum routes      engine thread
//!                     admit (a ticket, 429 past slots + queue) · the body within its size
//!                     parse · tokenize · check · compile a grammar (a blocking thread)
//!                        ──Job──▶ queue ───────────────────────────────────▶ Engine::submit_with
//!                     SSE / JSON ◀──Event (scheduled, tokens + logprobs, end)── Engine::step
//!                     a dropped handler closes its channel ────────────────▶ Engine::cancel
//!                     /reset_prefix_cache ──Control──────────────────────▶ between two steps
//! ```
//!
//! - [`api`]: the requests, read field by field (every refusal names its field);
//! - [`routes`]: the endpoints; `generate.rs` a generation's way in, `output.rs` and `choice.rs` its
//!   stream or body and latencies, `ops.rs` tokenize, detokenize and the prefix cache reset;
//! - [`worker`]: the engine thread, its admission (tickets) and its controls;
//! - [`guided`]: structured output through llguidance; [`guard`]: the API key and CORS;
//! - [`request_id`]: request ids; `listen.rs`: the accept loop;
//! - [`text`]: detokenizing as tokens arrive, stop strings;
//! - [`metrics`]: `/metrics` in the Prometheus text format, vLLM's names;
//! - [`error`]: the OpenAI error shape, and why the server did not start.
//!
//! Shutdown (SIGTERM or Ctrl-C for the command, [`Server::shutdown`] in process): new requests get
//! 503 while in-flight requests run on, until they are done or the deadline aborts them
//! (`finish_reason: "abort"`); then the listener closes and the process exits 0.

#![deny(missing_docs)]

pub mod adapters;
pub mod api;
mod choice;
mod cli;
pub mod error;
mod generate;
pub mod guard;
pub mod guided;
pub mod job;
pub mod kv_events;
mod listen;
pub mod metrics;
mod ops;
mod output;
pub mod request_id;
pub mod routes;
pub mod text;
pub mod worker;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use kvsched_engine::{ChunkPolicy, Chunking, EngineConfig, Lora, Model};

pub use cli::cli;
pub use error::StartError;
use routes::AppState;

/// How a server is set up.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// The base model's name in the API (`model` field, `/v1/models`).
    pub served_model_name: String,
    /// Adapters: the name a request's `model` selects each by, and its PEFT directory (or its
    /// `adapter_model.safetensors`).
    pub adapters: Vec<(String, PathBuf)>,
    /// Where to listen (port 0: any free port).
    pub addr: SocketAddr,
    /// Requests that may wait beyond the engine's `max_num_requests`; past both, 429.
    pub max_queue: usize,
    /// The largest request body taken, bytes; past it, 413.
    pub max_body_bytes: usize,
    /// The API key and the origins a browser may call from.
    pub guard: guard::Guard,
    /// Serve `POST /v1/load_lora_adapter` and `/v1/unload_lora_adapter` (vLLM's
    /// `VLLM_ALLOW_RUNTIME_LORA_UPDATING`): adapters loaded from a path on this machine at run time.
    pub runtime_lora: bool,
    /// How long in-flight requests may run on after shutdown begins.
    pub shutdown_timeout: Duration,
    /// The engine.
    pub engine: EngineConfig,
    /// Publish the prefix cache's KV events in vLLM's format ([`kv_events`]); `None`: off.
    pub kv_events: Option<kv_events::KvEventsConfig>,
}

impl Default for ServeConfig {
    /// `kvsched serve`'s defaults: 127.0.0.1:8000, a queue of 64, 30 s to drain, and
    /// [`ServeConfig::engine`]'s engine with 2,048-token requests on 512 pages of 16 positions.
    fn default() -> Self {
        Self {
            served_model_name: "model".into(),
            adapters: Vec::new(),
            addr: SocketAddr::from(([127, 0, 0, 1], 8000)),
            max_queue: 64,
            max_body_bytes: 16 << 20,
            guard: guard::Guard::default(),
            runtime_lora: false,
            shutdown_timeout: Duration::from_secs(30),
            engine: Self::engine(2048, 16, 512),
            kv_events: None,
        }
    }
}

impl ServeConfig {
    /// A serving engine for requests of up to `max_model_len` tokens on `gpu_pages` KV pages of
    /// `tokens_per_block` positions: the engine's chunked prefill (first come, first served, in
    /// chunks of whole pages) within a budget of 512 tokens a step, so a long prompt never stalls the decoding
    /// requests for long; 32 requests at once; a prefix cache; no host tier. A hybrid-attention
    /// model (Gemma 3) is served on the engine's KV groups, with the prefix cache too.
    pub fn engine(max_model_len: u32, tokens_per_block: u32, gpu_pages: u32) -> EngineConfig {
        let mut engine = EngineConfig {
            tokens_per_block,
            gpu_pages,
            max_blocks: max_model_len.div_ceil(tokens_per_block.max(1)),
            prefix_cache: true,
            ..EngineConfig::default()
        };
        engine.scheduler.max_num_tokens = Some(512);
        engine.scheduler.chunking = Some(Chunking {
            policy: ChunkPolicy::FirstComeFirstServed,
            unit: tokens_per_block,
        });
        engine
    }
}

/// A running server (in process): its address; stops on [`Server::shutdown`] or when dropped.
#[derive(Debug)]
pub struct Server {
    addr: SocketAddr,
    trigger: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<std::io::Result<()>>>,
}

impl Server {
    /// Starts serving `model` as `config` says, on a thread of its own; returns once it listens.
    pub fn start(model: Arc<Model>, config: &ServeConfig) -> Result<Self, StartError> {
        let state = state(model, config)?;
        let listen = |e| StartError::Listen(config.addr, e);
        let listener = std::net::TcpListener::bind(config.addr).map_err(listen)?;
        listener.set_nonblocking(true).map_err(listen)?;
        let addr = listener.local_addr().map_err(listen)?;
        let (trigger, stop) = tokio::sync::oneshot::channel::<()>();
        let deadline = config.shutdown_timeout;
        let thread = std::thread::Builder::new()
            .name("kvsched-http".into())
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()?;
                rt.block_on(async move {
                    let listener = tokio::net::TcpListener::from_std(listener)?;
                    serve(
                        listener,
                        state,
                        async { stop.await.unwrap_or(()) },
                        deadline,
                    )
                    .await
                })
            })
            .map_err(|e| StartError::Thread("server", e))?;
        Ok(Self {
            addr,
            trigger: Some(trigger),
            thread: Some(thread),
        })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Begins shutdown and waits until the server stopped.
    pub fn shutdown(mut self) -> std::io::Result<()> {
        self.stop()
    }

    fn stop(&mut self) -> std::io::Result<()> {
        if let Some(t) = self.trigger.take() {
            let _ = t.send(());
        }
        match self.thread.take().map(std::thread::JoinHandle::join) {
            Some(Ok(r)) => r,
            Some(Err(_)) => Err(std::io::Error::other("the server thread panicked")),
            None => Ok(()),
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}

/// The routes' state: the engine thread started, the adapters loaded and registered.
fn state(model: Arc<Model>, config: &ServeConfig) -> Result<Arc<AppState>, StartError> {
    let mut adapters = Vec::new();
    let mut names = Vec::new();
    for (i, (name, path)) in config.adapters.iter().enumerate() {
        if *name == config.served_model_name || names.iter().any(|(n, _)| n == name) {
            return Err(StartError::Adapter(format!(
                "adapter name {name:?} is used twice"
            )));
        }
        let lora = Lora::load_peft(model.config(), path).map_err(|e| {
            StartError::Adapter(format!("--adapter {name}={}: {e}", path.display()))
        })?;
        let id = i as u64 + 1;
        adapters.push((id, lora));
        names.push((name.clone(), id));
    }
    let mut engine = config.engine;
    let max_model_len = max_model_len(&model, &engine)?;
    let publisher = match &config.kv_events {
        Some(k) => {
            engine.kv_events = true;
            let served = names.iter().map(|(n, id)| (*id, n.clone())).collect();
            Some(kv_events::Publisher::start(
                k,
                served,
                engine.tokens_per_block,
            )?)
        }
        None => None,
    };
    let worker = worker::Worker::start(
        Arc::clone(&model),
        engine,
        adapters,
        config.max_queue,
        publisher,
    )?;
    Ok(Arc::new(AppState {
        longest_token: longest_token(&model),
        model,
        base: config.served_model_name.clone(),
        adapters: Arc::new(adapters::Adapters::new(names)),
        runtime_lora: config.runtime_lora,
        priority_scheduling: config.engine.scheduler.admission
            == kvsched_core::config::Admission::Priority,
        service_classes: config.engine.scheduler.shares.is_some(),
        worker,
        metrics: metrics::Metrics::new(&config.served_model_name, max_model_len),
        max_model_len,
        max_body_bytes: config.max_body_bytes,
        guides: guided::Guides::default(),
        guard: Arc::new(config.guard.clone()),
        draining: AtomicBool::new(false),
        next: AtomicU64::new(1),
        created: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
    }))
}

/// The longest request `engine` serves on `model` (prompt and output): its `max_blocks` pages of
/// positions, within the model's context; refused when the pages reach past the context.
pub fn max_model_len(model: &Model, engine: &EngineConfig) -> Result<usize, StartError> {
    let tpb = engine.tokens_per_block as usize;
    let context = model.config().context_length;
    let max_model_len = engine.max_blocks as usize * tpb;
    if max_model_len > context.div_ceil(tpb) * tpb {
        return Err(StartError::Flags(format!(
            "--max-model-len {max_model_len} is longer than the model's context of {context} tokens"
        )));
    }
    Ok(max_model_len.min(context))
}

/// The most bytes one token of `model`'s vocabulary is written with (its text form is at least as
/// long as the bytes it decodes to: a byte-level or SentencePiece piece, or a byte token `<0xNN>`).
fn longest_token(model: &Model) -> usize {
    let tok = model.tokenizer();
    (0..tok.vocab_size() as u32)
        .filter_map(|id| tok.token(id).map(str::len))
        .max()
        .unwrap_or(1)
        .max(1)
}

/// How long connections may stay open once the drain ended (aborted streams closing).
const GRACE: Duration = Duration::from_secs(5);

/// Serves on `listener` until `trigger`; then drains: 503 to new requests, in-flight ones run on
/// until `deadline`, then are aborted; returns once every connection closed (or a grace period
/// past the deadline) and the engine thread stopped.
async fn serve(
    listener: tokio::net::TcpListener,
    state: Arc<AppState>,
    trigger: impl std::future::Future<Output = ()> + Send + 'static,
    deadline: Duration,
) -> std::io::Result<()> {
    let drain_state = Arc::clone(&state);
    let graceful = async move {
        trigger.await;
        drain_state.draining.store(true, Ordering::SeqCst);
        // The listener stays open (new requests get 503) while the admitted requests run on.
        drain_state.worker.drain(deadline).await;
    };
    let app = routes::router(Arc::clone(&state));
    let grace = async { tokio::time::sleep(GRACE).await };
    let closed = listen::serve(listener, app, graceful, grace).await;
    if !closed {
        eprintln!("kvsched serve: connections still open past the deadline; stopping");
    }
    state.worker.abort();
    let worker_state = Arc::clone(&state);
    tokio::task::spawn_blocking(move || worker_state.worker.stop())
        .await
        .map_err(std::io::Error::other)?;
    Ok(())
}
