//! The HTTP routes: `POST /v1/completions`, `POST /v1/chat/completions` (one JSON body, or
//! server-sent events ending with `data: [DONE]`), `GET /v1/models`, `GET /health`, `GET /metrics`.

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use kvsched_engine::{Model, Sampler};
use serde_json::{json, Value};
use tokio::sync::mpsc::UnboundedReceiver;

use crate::api::{self, Endpoint, Prompt, Request};
use crate::error::ApiError;
use crate::metrics::{Metrics, Refusal};
use crate::text::TextStream;
use crate::worker::{End, Event, Job, Refused, Worker};

/// Tokens a completion generates when its request does not say (the OpenAI API's default).
const COMPLETION_DEFAULT_TOKENS: usize = 16;

/// What the routes share.
#[derive(Debug)]
pub struct AppState {
    /// The model (its tokenizer encodes prompts and decodes tokens).
    pub model: Arc<Model>,
    /// The base model's name.
    pub base: String,
    /// Adapter names and their engine ids, in `--adapter` order.
    pub adapters: Vec<(String, u64)>,
    /// The engine thread.
    pub worker: Worker,
    /// The metrics.
    pub metrics: Metrics,
    /// The longest request, prompt and completion together, in tokens.
    pub max_model_len: usize,
    /// Set once shutdown began: generation requests and `/health` answer 503.
    pub draining: AtomicBool,
    /// Request counter (ids, fresh seeds).
    pub next: AtomicU64,
    /// When the server started, Unix seconds (`/v1/models`' `created`).
    pub created: u64,
}

impl AppState {
    fn adapter_of(&self, model: &str) -> Result<Option<u64>, ApiError> {
        if model == self.base {
            return Ok(None);
        }
        self.adapters
            .iter()
            .find(|(name, _)| name == model)
            .map(|&(_, id)| Some(id))
            .ok_or_else(|| ApiError::unknown_model(model))
    }

    /// A request's prompt tokens.
    fn tokens(&self, prompt: &Prompt) -> Result<Vec<u32>, ApiError> {
        let tok = self.model.tokenizer();
        let (tokens, param) = match prompt {
            Prompt::Text(t) => (tok.encode(t), "prompt"),
            Prompt::Tokens(t) => (Ok(t.clone()), "prompt"),
            Prompt::Chat(m) => (tok.encode_chat(m, true), "messages"),
        };
        let tokens =
            tokens.map_err(|e| ApiError::invalid(param, "invalid_value", e.to_string()))?;
        let vocab = tok.vocab_size();
        if let Some(t) = tokens.iter().find(|&&t| t as usize >= vocab) {
            return Err(ApiError::invalid(
                param,
                "invalid_value",
                format!("Token id {t} is outside the vocabulary of {vocab}."),
            ));
        }
        if tokens.is_empty() {
            return Err(ApiError::invalid(
                param,
                "invalid_value",
                "The prompt is empty.",
            ));
        }
        Ok(tokens)
    }

    /// The tokens to generate: the request's `max_tokens`, or the endpoint's default, within
    /// the longest request.
    fn max_new(&self, r: &Request, prompt: usize) -> Result<usize, ApiError> {
        let limit = self.max_model_len;
        let param = match r.endpoint {
            Endpoint::Completions => "prompt",
            Endpoint::Chat => "messages",
        };
        if prompt >= limit {
            return Err(ApiError::invalid(
                param,
                "context_length_exceeded",
                format!("This model's maximum context length is {limit} tokens; the prompt has {prompt}, leaving no room for a completion."),
            ));
        }
        let room = limit - prompt;
        match r.max_tokens {
            Some(n) if n > room => Err(ApiError::invalid(
                "max_tokens",
                "context_length_exceeded",
                format!("This model's maximum context length is {limit} tokens; you requested {} ({prompt} in the prompt, {n} in the completion).", prompt.saturating_add(n)),
            )),
            Some(n) => Ok(n),
            None if r.endpoint == Endpoint::Completions => Ok(COMPLETION_DEFAULT_TOKENS.min(room)),
            None => Ok(room),
        }
    }

    fn sampler(r: &Request, n: u64) -> Sampler {
        let sampler = if r.temperature == 0.0 {
            Sampler::greedy()
        } else {
            let seed = r.seed.unwrap_or_else(|| fresh_seed(n));
            Sampler::seeded(seed, r.temperature).with_top_p(r.top_p)
        };
        if r.ignore_eos {
            sampler.ignoring_stop()
        } else {
            sampler
        }
    }
}

/// A seed no earlier request had: the clock mixed with the request counter.
fn fresh_seed(n: u64) -> u64 {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    nanos ^ n.wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// The router over `state`.
pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/v1/models", get(models))
        .route("/metrics", get(metrics))
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat))
        .fallback(not_found)
        .with_state(state)
}

/// A JSON response.
pub fn json_response(status: StatusCode, body: &Value) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

async fn health(State(s): State<Arc<AppState>>) -> StatusCode {
    if s.draining.load(Ordering::SeqCst) {
        StatusCode::SERVICE_UNAVAILABLE
    } else {
        StatusCode::OK
    }
}

async fn not_found() -> ApiError {
    ApiError {
        status: StatusCode::NOT_FOUND,
        message: "No such route.".into(),
        kind: "invalid_request_error",
        param: None,
        code: "not_found",
    }
}

async fn models(State(s): State<Arc<AppState>>) -> Response {
    let entry = |id: &str, parent: Option<&str>| {
        json!({"id": id, "object": "model", "created": s.created, "owned_by": "kvsched",
               "root": id, "parent": parent, "max_model_len": s.max_model_len})
    };
    let mut data = vec![entry(&s.base, None)];
    data.extend(s.adapters.iter().map(|(n, _)| entry(n, Some(&s.base))));
    json_response(StatusCode::OK, &json!({"object": "list", "data": data}))
}

async fn metrics(State(s): State<Arc<AppState>>) -> Response {
    let snapshot = s
        .worker
        .shared
        .snapshot
        .lock()
        .map(|g| *g)
        .unwrap_or_default();
    let queued = s.worker.shared.queued.load(Ordering::SeqCst);
    (
        StatusCode::OK,
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        s.metrics.render(&snapshot, queued),
    )
        .into_response()
}

async fn completions(State(s): State<Arc<AppState>>, body: Bytes) -> Response {
    respond(&s, Endpoint::Completions, &body).await
}

async fn chat(State(s): State<Arc<AppState>>, body: Bytes) -> Response {
    respond(&s, Endpoint::Chat, &body).await
}

async fn respond(s: &Arc<AppState>, endpoint: Endpoint, body: &[u8]) -> Response {
    match generate(s, endpoint, body).await {
        Ok(r) => r,
        Err(e) => {
            let why = match e.status {
                StatusCode::TOO_MANY_REQUESTS => Refusal::Overloaded,
                StatusCode::SERVICE_UNAVAILABLE => Refusal::ShuttingDown,
                _ => Refusal::Invalid,
            };
            s.metrics.refused(why);
            e.into_response()
        }
    }
}

/// Reads, checks and queues a generation request; answers with its stream or its whole body.
async fn generate(
    s: &Arc<AppState>,
    endpoint: Endpoint,
    body: &[u8],
) -> Result<Response, ApiError> {
    if s.draining.load(Ordering::SeqCst) {
        return Err(ApiError::shutting_down());
    }
    let arrived = Instant::now();
    let r = api::parse(endpoint, body)?;
    let adapter = s.adapter_of(&r.model)?;
    let prompt = s.tokens(&r.prompt)?;
    let max_new = s.max_new(&r, prompt.len())?;
    let n = s.next.fetch_add(1, Ordering::SeqCst);
    let (events, rx) = tokio::sync::mpsc::unbounded_channel();
    let prompt_len = prompt.len();
    let job = Job {
        prompt,
        max_new,
        adapter,
        sampler: AppState::sampler(&r, n),
        events,
    };
    s.worker.submit(job).map_err(|e| match e {
        Refused::Full(depth) => ApiError::overloaded(depth),
        Refused::Gone => ApiError::shutting_down(),
    })?;
    let gen = Generation {
        state: Arc::clone(s),
        rx,
        text: TextStream::new(r.stop.clone()),
        arrived,
        last: None,
        first: None,
        prompt: prompt_len,
        generated: 0,
        ended: false,
    };
    let meta = Meta {
        id: format!(
            "{}-{n:x}",
            if endpoint == Endpoint::Chat {
                "chatcmpl"
            } else {
                "cmpl"
            }
        ),
        created: unix_now(),
        model: r.model.clone(),
        endpoint,
        include_usage: r.include_usage,
    };
    if r.stream {
        Ok(stream(gen, meta))
    } else {
        whole(gen, &meta).await
    }
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A request in flight, as its handler sees it: the engine's events turned into text, and its
/// latencies recorded. Dropped before its end (the client went away), it closes its channel, so the
/// engine cancels the request, and counts as aborted.
struct Generation {
    state: Arc<AppState>,
    rx: UnboundedReceiver<Event>,
    text: TextStream,
    arrived: Instant,
    last: Option<Instant>,
    first: Option<Instant>,
    prompt: usize,
    generated: usize,
    ended: bool,
}

/// Text released by [`Generation::next`], and the request's end once it came.
struct Out {
    text: String,
    end: Option<End>,
}

impl Generation {
    /// Waits for the next text or the end; `Err` with the engine's message if it failed the request.
    async fn next(&mut self) -> Result<Out, String> {
        let state = Arc::clone(&self.state);
        let tok = state.model.tokenizer();
        loop {
            let (tokens, end) = match self.rx.recv().await {
                Some(Event::Tokens(t)) => (t, None),
                Some(Event::Done(end)) => (Vec::new(), Some(end)),
                Some(Event::Failed(why)) => {
                    self.ended = true;
                    return Err(why);
                }
                None => return Err("the engine dropped the request".into()),
            };
            if !tokens.is_empty() {
                self.timed(tokens.len());
            }
            let piece = self
                .text
                .push(tok, &tokens, end.is_some())
                .map_err(|e| e.to_string())?;
            let end = if piece.stopped {
                self.rx.close();
                Some(End::Stop)
            } else {
                end
            };
            if let Some(end) = end {
                self.finish(end);
            }
            if !piece.text.is_empty() || end.is_some() {
                return Ok(Out {
                    text: piece.text,
                    end,
                });
            }
        }
    }

    fn timed(&mut self, tokens: usize) {
        let now = Instant::now();
        match self.last {
            None => {
                self.state.metrics.first_token(now - self.arrived);
                self.first = Some(now);
            }
            Some(last) => self.state.metrics.next_token(now - last),
        }
        self.last = Some(now);
        self.generated += tokens;
    }

    fn finish(&mut self, end: End) {
        self.ended = true;
        let tpot = match (self.first, self.last) {
            (Some(f), Some(l)) if self.generated > 1 => {
                Some((l - f) / u32::try_from(self.generated - 1).unwrap_or(u32::MAX))
            }
            _ => None,
        };
        let e2e = self.arrived.elapsed();
        self.state
            .metrics
            .ended(end, self.prompt, self.generated, e2e, tpot);
    }

    fn usage(&self) -> Value {
        json!({"prompt_tokens": self.prompt, "completion_tokens": self.generated,
               "total_tokens": self.prompt + self.generated})
    }
}

impl Drop for Generation {
    fn drop(&mut self) {
        if !self.ended {
            self.finish(End::Abort);
        }
    }
}

/// What every response of one request repeats.
struct Meta {
    id: String,
    created: u64,
    model: String,
    endpoint: Endpoint,
    include_usage: bool,
}

impl Meta {
    /// One choice's JSON: the whole text (`whole`) or a chunk's.
    fn choice(&self, text: &str, end: Option<End>, whole: bool) -> Value {
        let reason = end.map(End::reason);
        match (self.endpoint, whole) {
            (Endpoint::Completions, _) => {
                json!({"index": 0, "text": text, "logprobs": null, "finish_reason": reason})
            }
            (Endpoint::Chat, true) => json!({"index": 0, "logprobs": null, "finish_reason": reason,
                "message": {"role": "assistant", "content": text}}),
            (Endpoint::Chat, false) => {
                let delta = if end.is_some() && text.is_empty() {
                    json!({})
                } else {
                    json!({"content": text})
                };
                json!({"index": 0, "delta": delta, "logprobs": null, "finish_reason": reason})
            }
        }
    }

    fn object(&self, chunk: bool) -> &'static str {
        match (self.endpoint, chunk) {
            (Endpoint::Completions, _) => "text_completion",
            (Endpoint::Chat, false) => "chat.completion",
            (Endpoint::Chat, true) => "chat.completion.chunk",
        }
    }

    fn body(&self, choices: &Value, usage: Option<Value>, chunk: bool) -> Value {
        let mut v = json!({"id": self.id, "object": self.object(chunk), "created": self.created,
                           "model": self.model, "choices": choices});
        if !chunk || self.include_usage {
            v["usage"] = usage.unwrap_or(Value::Null);
        }
        v
    }
}

/// The whole completion in one body.
async fn whole(mut gen: Generation, meta: &Meta) -> Result<Response, ApiError> {
    let mut text = String::new();
    loop {
        let out = gen.next().await.map_err(ApiError::engine)?;
        text.push_str(&out.text);
        if let Some(end) = out.end {
            let body = meta.body(
                &json!([meta.choice(&text, Some(end), true)]),
                Some(gen.usage()),
                false,
            );
            return Ok(json_response(StatusCode::OK, &body));
        }
    }
}

/// Where a stream stands.
enum Phase {
    Head,
    Body,
    Over,
}

fn sse(v: &Value) -> String {
    format!("data: {v}\n\n")
}

/// The completion as server-sent events: (chat: a first chunk with the role), a chunk per piece of
/// text, a last chunk with the finish reason, the usage chunk when asked, then `data: [DONE]`.
fn stream(gen: Generation, meta: Meta) -> Response {
    let events = futures_util::stream::unfold(
        (gen, meta, Phase::Head),
        |(mut gen, meta, phase)| async move {
            let mut out = String::new();
            let next = match phase {
                Phase::Over => return None,
                Phase::Head if meta.endpoint == Endpoint::Chat => {
                    let delta = json!([{"index": 0, "delta": {"role": "assistant", "content": ""},
                                    "logprobs": null, "finish_reason": null}]);
                    out.push_str(&sse(&meta.body(&delta, None, true)));
                    Phase::Body
                }
                Phase::Head | Phase::Body => match gen.next().await {
                    Ok(piece) => {
                        if !piece.text.is_empty() {
                            out.push_str(&sse(&meta.body(
                                &json!([meta.choice(&piece.text, None, false)]),
                                None,
                                true,
                            )));
                        }
                        match piece.end {
                            Some(end) => {
                                out.push_str(&sse(&meta.body(
                                    &json!([meta.choice("", Some(end), false)]),
                                    None,
                                    true,
                                )));
                                if meta.include_usage {
                                    out.push_str(&sse(&meta.body(
                                        &json!([]),
                                        Some(gen.usage()),
                                        true,
                                    )));
                                }
                                out.push_str("data: [DONE]\n\n");
                                Phase::Over
                            }
                            None => Phase::Body,
                        }
                    }
                    Err(why) => {
                        out.push_str(&sse(&ApiError::engine(why).body()));
                        out.push_str("data: [DONE]\n\n");
                        Phase::Over
                    }
                },
            };
            Some((Ok::<_, Infallible>(Bytes::from(out)), (gen, meta, next)))
        },
    );
    (
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        Body::from_stream(events),
    )
        .into_response()
}
