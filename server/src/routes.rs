//! The HTTP routes: `POST /v1/completions`, `POST /v1/chat/completions` (one JSON body, or
//! server-sent events ending with `data: [DONE]`), `GET /v1/models` and `/v1/models/{id}`,
//! `GET /health`, `GET /metrics`. Every response carries its request's `X-Request-Id`; every refusal
//! is in the OpenAI error shape (a wrong method 405, an unknown route 404, a body too large 413).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use axum::extract::{Path, Request, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Router};
use kvsched_engine::Model;
use serde_json::{json, Value};

use crate::api::Endpoint;
use crate::error::ApiError;
use crate::generate::respond;
use crate::metrics::Metrics;
use crate::request_id::{self, RequestId};
use crate::worker::Worker;
use crate::{guard, ops};

/// What the routes share.
#[derive(Debug)]
pub struct AppState {
    /// The model (its tokenizer encodes prompts and decodes tokens).
    pub model: Arc<Model>,
    /// The base model's name.
    pub base: String,
    /// The served adapters (given at start, loaded since).
    pub adapters: Arc<crate::adapters::Adapters>,
    /// `POST /v1/load_lora_adapter` and `/v1/unload_lora_adapter` are served (`--allow-runtime-lora`).
    pub runtime_lora: bool,
    /// Requests are scheduled by their `priority` (`--scheduling-policy priority`).
    pub priority_scheduling: bool,
    /// Service classes have shares (`--class-share`).
    pub service_classes: bool,
    /// The engine thread.
    pub worker: Worker,
    /// The metrics.
    pub metrics: Metrics,
    /// The longest request, prompt and completion together, in tokens.
    pub max_model_len: usize,
    /// The most bytes one token of the vocabulary stands for.
    pub longest_token: usize,
    /// The largest request body taken, bytes.
    pub max_body_bytes: usize,
    /// Structured output's compiler.
    pub guides: crate::guided::Guides,
    /// The API key and the allowed origins.
    pub guard: Arc<crate::guard::Guard>,
    /// Set once shutdown began: generation requests and `/health` answer 503.
    pub draining: AtomicBool,
    /// Request counter (fresh seeds).
    pub next: AtomicU64,
    /// When the server started, Unix seconds (`/v1/models`' `created`).
    pub created: u64,
}

impl AppState {
    /// The adapter a request's `model` names, held for the request (`None`: the base model).
    pub(crate) fn adapter_of(
        &self,
        model: &str,
    ) -> Result<Option<crate::adapters::Held>, ApiError> {
        if model == self.base {
            return Ok(None);
        }
        self.adapters
            .hold(model)
            .map(Some)
            .ok_or_else(|| ApiError::unknown_model(model))
    }

    /// `/v1/models`' entry for `id`, or `None` when no such model is served.
    fn model_entry(&self, id: &str) -> Option<Value> {
        let parent = if id == self.base {
            None
        } else {
            self.adapters.contains(id).then_some(())?;
            Some(self.base.as_str())
        };
        Some(
            json!({"id": id, "object": "model", "created": self.created, "owned_by": "kvsched",
                   "root": id, "parent": parent, "max_model_len": self.max_model_len}),
        )
    }
}

/// The router over `state`.
pub fn router(state: Arc<AppState>) -> Router {
    let mut routes = Router::new();
    if state.runtime_lora {
        routes = routes
            .route("/v1/load_lora_adapter", post(ops::load_lora_adapter))
            .route("/v1/unload_lora_adapter", post(ops::unload_lora_adapter));
    }
    routes
        .route("/health", get(health))
        .route("/v1/models", get(models))
        .route("/v1/models/{*id}", get(model))
        .route("/metrics", get(metrics))
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat))
        .route("/tokenize", post(ops::tokenize))
        .route("/detokenize", post(ops::detokenize))
        .route("/reset_prefix_cache", post(ops::reset_prefix_cache))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(axum::middleware::from_fn_with_state(
            Arc::clone(&state.guard),
            guard::check,
        ))
        .layer(axum::middleware::from_fn(request_id::tag))
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
    ApiError::not_found("No such route.")
}

async fn method_not_allowed(request: Request) -> ApiError {
    ApiError::method_not_allowed(request.method().as_str(), request.uri().path())
}

async fn models(State(s): State<Arc<AppState>>) -> Response {
    let mut data = vec![s.model_entry(&s.base)];
    data.extend(s.adapters.names().iter().map(|n| s.model_entry(n)));
    json_response(StatusCode::OK, &json!({"object": "list", "data": data}))
}

async fn model(State(s): State<Arc<AppState>>, Path(id): Path<String>) -> Response {
    match s.model_entry(&id) {
        Some(entry) => json_response(StatusCode::OK, &entry),
        None => ApiError::unknown_model(&id).into_response(),
    }
}

async fn metrics(State(s): State<Arc<AppState>>) -> Response {
    let (snapshot, queued) = s.worker.snapshot();
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

async fn completions(
    State(s): State<Arc<AppState>>,
    Extension(id): Extension<RequestId>,
    request: Request,
) -> Response {
    respond(s, Endpoint::Completions, id, request).await
}

async fn chat(
    State(s): State<Arc<AppState>>,
    Extension(id): Extension<RequestId>,
    request: Request,
) -> Response {
    respond(s, Endpoint::Chat, id, request).await
}
