//! [`KvschedEngine`]: Dynamo's [`LLMEngine`] over kvsched's engine thread.
//!
//! `start` loads the GGUF model and starts the engine thread ([`Worker`]), with the KV events
//! publisher when asked; `generate` plans the request ([`crate::request::plan`]), takes a place
//! (refused past the engine's requests and its queue: `WorkerOverloaded`), queues it and streams
//! its tokens back as they come, one chunk per engine step, ending in one terminal chunk (stop,
//! length or cancelled) with its usage. A stopped or killed context drops the request's channel:
//! the engine thread cancels it at its next step (its pages freed). `cleanup` drains: the requests
//! admitted run on until done or the drain timeout, then are aborted; then the thread stops.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use dynamo_backend_common::{
    usage, AsyncEngineContext, BackendError, DynamoError, EngineConfig, ErrorType, GenerateContext,
    KvEventSource, LLMEngine, LLMEngineOutput, LLMEngineOutputExt, LlmRegistration,
    MetricsBindings, MetricsCtx,
};
use futures::stream::BoxStream;
use kvsched_engine::{EngineConfig as Engine, Model, Sample};
use kvsched_server::kv_events::{KvEventsConfig, Publisher};
use kvsched_server::metrics::Metrics;
use kvsched_server::worker::{End, Event, Job, Mode, Refused, Worker};
use tokio::sync::mpsc::UnboundedReceiver;

use crate::request::{self, Limits};

/// How a worker is set up.
#[derive(Debug, Clone)]
pub struct Setup {
    /// The GGUF model file.
    pub model: PathBuf,
    /// The model's name in the API.
    pub served_model_name: String,
    /// The engine (kvsched serve's by default: [`kvsched_server::ServeConfig::engine`]).
    pub engine: Engine,
    /// Requests that may wait beyond the engine's `max_num_requests`.
    pub max_queue: usize,
    /// Publish KV events (vLLM's format on ZMQ) for Dynamo's KV router; `None`: off.
    pub kv_events: Option<KvEventsConfig>,
    /// How long `cleanup` lets admitted requests run on before it aborts them.
    pub drain_timeout: Duration,
}

/// The engine thread, once started.
struct Running {
    worker: Worker,
    limits: Limits,
    /// `kvsched serve`'s Prometheus text of the engine's counters (vLLM's names).
    metrics: Metrics,
}

impl Running {
    /// The engine's counters and load, as `kvsched serve`'s `/metrics` has them.
    fn render(&self) -> String {
        let (snapshot, queued) = self.worker.snapshot();
        self.metrics.render(&snapshot, queued)
    }
}

/// kvsched's engine as a Dynamo [`LLMEngine`].
pub struct KvschedEngine {
    setup: Setup,
    running: Mutex<Option<Arc<Running>>>,
    /// Requests seen: an unseeded sampling request's seed.
    next: AtomicU64,
}

impl KvschedEngine {
    /// An engine that `start` sets up as `setup` says.
    pub fn new(setup: Setup) -> Self {
        Self {
            setup,
            running: Mutex::new(None),
            next: AtomicU64::new(1),
        }
    }

    /// Requests admitted and not ended (queued or in the engine); 0 when not running.
    pub fn admitted(&self) -> usize {
        self.current()
            .map_or(0, |r| r.worker.shared.admitted.load(Ordering::SeqCst))
    }

    fn current(&self) -> Option<Arc<Running>> {
        self.running.lock().ok().and_then(|r| r.clone())
    }

    fn registration(&self, limits: Limits) -> EngineConfig {
        let e = &self.setup.engine;
        EngineConfig {
            model: self.setup.served_model_name.clone(),
            served_model_name: Some(self.setup.served_model_name.clone()),
            llm: Some(LlmRegistration {
                context_length: Some(limits.max_model_len as u32),
                kv_cache_block_size: Some(e.tokens_per_block),
                total_kv_blocks: Some(u64::from(e.gpu_pages)),
                max_num_seqs: Some(u64::from(e.scheduler.max_num_requests)),
                max_num_batched_tokens: e.scheduler.max_num_tokens.map(u64::from),
                ..LlmRegistration::default()
            }),
            ..EngineConfig::default()
        }
    }
}

/// An error of type `kind` saying `message`.
fn error(kind: ErrorType, message: impl Into<String>) -> DynamoError {
    DynamoError::builder()
        .error_type(kind)
        .message(message)
        .build()
}

fn shut_down(message: impl Into<String>) -> DynamoError {
    error(ErrorType::Backend(BackendError::EngineShutdown), message)
}

fn refused(e: Refused) -> DynamoError {
    match e {
        Refused::Full(slots, depth) => error(
            ErrorType::WorkerOverloaded,
            format!("the worker is full: {slots} requests running and {depth} waiting"),
        ),
        Refused::Gone => shut_down("the engine thread has stopped"),
    }
}

/// Loads the model and starts the engine thread (blocking: the weights are read).
fn launch(setup: &Setup) -> Result<Running, DynamoError> {
    let model = Model::load(&setup.model)
        .map_err(|e| shut_down(format!("{}: {e}", setup.model.display())))?;
    let model = Arc::new(model);
    let max_model_len = kvsched_server::max_model_len(&model, &setup.engine)
        .map_err(|e| request::invalid(e.to_string()))?;
    let mut engine = setup.engine;
    let publisher = match &setup.kv_events {
        Some(k) => {
            engine.kv_events = true;
            let p = Publisher::start(k, HashMap::new(), engine.tokens_per_block)
                .map_err(|e| shut_down(e.to_string()))?;
            Some(p)
        }
        None => None,
    };
    let limits = Limits {
        max_model_len,
        vocab: model.tokenizer().vocab_size(),
    };
    let worker = Worker::start(model, engine, Vec::new(), setup.max_queue, publisher)
        .map_err(|e| shut_down(e.to_string()))?;
    let metrics = Metrics::new(&setup.served_model_name, max_model_len);
    Ok(Running {
        worker,
        limits,
        metrics,
    })
}

#[async_trait]
impl LLMEngine for KvschedEngine {
    async fn start(&self, _worker_id: u64) -> Result<EngineConfig, DynamoError> {
        if let Some(r) = self.current() {
            return Ok(self.registration(r.limits));
        }
        let setup = self.setup.clone();
        let running = tokio::task::spawn_blocking(move || launch(&setup))
            .await
            .map_err(|e| shut_down(format!("starting the engine failed: {e}")))??;
        let limits = running.limits;
        *self.running.lock().map_err(|_| shut_down("poisoned"))? = Some(Arc::new(running));
        Ok(self.registration(limits))
    }

    async fn generate(
        &self,
        r: dynamo_backend_common::PreprocessedRequest,
        ctx: GenerateContext,
    ) -> Result<BoxStream<'static, Result<LLMEngineOutput, DynamoError>>, DynamoError> {
        let running = self
            .current()
            .ok_or_else(|| shut_down("the engine is not running"))?;
        let n = self.next.fetch_add(1, Ordering::SeqCst);
        let plan = request::plan(r, running.limits, kvsched_server::job::fresh_seed(n))?;
        let ticket = running.worker.admit().map_err(refused)?;
        let (events, rx) = tokio::sync::mpsc::unbounded_channel();
        let prompt = plan.prompt.len() as u32;
        let sample = Sample {
            sampler: plan.sampler,
            guide: None,
        };
        running
            .worker
            .submit(Job {
                prompt: plan.prompt,
                max_new: plan.max_new,
                adapter: None,
                hold: None,
                cache_salt: plan.cache_salt,
                priority: 128,
                class: 0,
                samples: vec![(sample, events, ticket)],
                mode: Mode::Samples,
            })
            .map_err(refused)?;
        Ok(respond(rx, ctx.inner_arc(), prompt))
    }

    async fn is_quiescent(&self) -> Result<Option<bool>, DynamoError> {
        Ok(Some(self.admitted() == 0))
    }

    async fn cleanup(&self) -> Result<(), DynamoError> {
        let taken = self.running.lock().ok().and_then(|mut r| r.take());
        let Some(running) = taken else {
            return Ok(());
        };
        running.worker.drain(self.setup.drain_timeout).await;
        tokio::task::spawn_blocking(move || running.worker.stop())
            .await
            .map_err(|e| shut_down(format!("stopping the engine thread failed: {e}")))
    }

    /// The engine's counters (prefix cache hits and queries, requests, pages, preemptions) in the
    /// worker's `/metrics` (Dynamo's system port), under vLLM's names.
    async fn setup_metrics(&self, ctx: MetricsCtx<'_>) -> Result<MetricsBindings, DynamoError> {
        if let Some(running) = self.current() {
            let running = Arc::downgrade(&running);
            ctx.metrics.add_expfmt_callback(Arc::new(move || {
                Ok::<_, anyhow::Error>(running.upgrade().map(|r| r.render()).unwrap_or_default())
            }));
        }
        Ok(MetricsBindings::default())
    }

    async fn kv_event_sources(&self) -> Result<Vec<KvEventSource>, DynamoError> {
        Ok(self
            .setup
            .kv_events
            .iter()
            .map(|k| KvEventSource::Zmq {
                endpoint: k.endpoint.clone(),
                topic: k.topic.clone(),
                dp_rank: 0,
                image_token_id: None,
            })
            .collect())
    }
}

/// What one engine event means for the stream.
enum Step {
    /// Tokens to send.
    Chunk(Vec<u32>),
    /// The end: the terminal chunk (its usage set by the caller).
    End(fn() -> LLMEngineOutput),
    /// A failure (terminal).
    Fail(DynamoError),
    /// Nothing to send.
    Skip,
}

/// Waits for the request's next event, or for its context to stop (which ends it as cancelled).
async fn next(rx: &mut UnboundedReceiver<Event>, ctx: &Arc<dyn AsyncEngineContext>) -> Step {
    if ctx.is_stopped() || ctx.is_killed() {
        return Step::End(LLMEngineOutput::cancelled);
    }
    let event = tokio::select! {
        biased;
        () = ctx.stopped() => return Step::End(LLMEngineOutput::cancelled),
        () = ctx.killed() => return Step::End(LLMEngineOutput::cancelled),
        e = rx.recv() => e,
    };
    match event {
        Some(Event::Tokens(t, _)) => Step::Chunk(t),
        Some(Event::Done(End::Stop)) => Step::End(LLMEngineOutput::stop),
        Some(Event::Done(End::Length)) => Step::End(LLMEngineOutput::length),
        Some(Event::Done(End::Abort)) => {
            Step::Fail(shut_down("the worker shut down before the request ended"))
        }
        Some(Event::Failed(why)) => {
            Step::Fail(error(ErrorType::Backend(BackendError::Unknown), why))
        }
        Some(Event::Scheduled(..) | Event::Beams(_)) => Step::Skip,
        None => Step::Fail(error(
            ErrorType::Backend(BackendError::StreamIncomplete),
            "the engine thread dropped the request",
        )),
    }
}

/// The request's chunks: its tokens as each step makes them, then one terminal chunk with its
/// usage. Dropping the stream (or the context stopping) drops `rx`: the engine cancels it.
fn respond(
    mut rx: UnboundedReceiver<Event>,
    ctx: Arc<dyn AsyncEngineContext>,
    prompt: u32,
) -> BoxStream<'static, Result<LLMEngineOutput, DynamoError>> {
    Box::pin(async_stream::stream! {
        let mut generated = 0u32;
        loop {
            match next(&mut rx, &ctx).await {
                Step::Chunk(tokens) => {
                    generated += tokens.len() as u32;
                    yield Ok(LLMEngineOutput::default().with_tokens(tokens));
                }
                Step::End(end) => {
                    rx.close();
                    yield Ok(end().with_usage(usage(prompt, generated)));
                    break;
                }
                Step::Fail(e) => {
                    yield Err(e);
                    break;
                }
                Step::Skip => {}
            }
        }
    })
}
