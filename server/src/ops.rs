//! vLLM's operational endpoints: `POST /tokenize` and `POST /detokenize` (on a blocking thread: a
//! long prompt takes a while), and `POST /reset_prefix_cache` (between two engine steps).

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::api::{self, Prompt};
use crate::error::ApiError;
use crate::generate::read_body;
use crate::routes::{json_response, AppState};
use crate::worker::Control;

/// `POST /tokenize`: `{count, max_model_len, tokens}`.
pub(crate) async fn tokenize(State(s): State<Arc<AppState>>, request: Request) -> Response {
    let body = match read_body(request, s.max_body_bytes).await {
        Ok(b) => b,
        Err(e) => return e.into_response(),
    };
    let state = Arc::clone(&s);
    blocking(move || {
        let t = api::parse_tokenize(&body)?;
        state.known(t.model.as_deref())?;
        let tok = state.model.tokenizer();
        let tokens = match &t.prompt {
            Prompt::Text(text) => tok.encode(text),
            Prompt::Tokens(ids) => Ok(ids.clone()),
            Prompt::Chat(m) => tok.encode_chat(m, t.add_generation_prompt),
        }
        .map_err(|e| ApiError::invalid("prompt", "invalid_value", e.to_string()))?;
        Ok(
            json!({"count": tokens.len(), "max_model_len": state.max_model_len,
                  "tokens": tokens, "token_strs": null}),
        )
    })
    .await
}

/// `POST /detokenize`: `{prompt}`, the text of the tokens (special tokens included).
pub(crate) async fn detokenize(State(s): State<Arc<AppState>>, request: Request) -> Response {
    let body = match read_body(request, s.max_body_bytes).await {
        Ok(b) => b,
        Err(e) => return e.into_response(),
    };
    let state = Arc::clone(&s);
    blocking(move || {
        let (model, tokens) = api::parse_detokenize(&body)?;
        state.known(model.as_deref())?;
        let text = state
            .model
            .tokenizer()
            .decode(&tokens)
            .map_err(|e| ApiError::invalid("tokens", "invalid_value", e.to_string()))?;
        Ok(json!({"prompt": text}))
    })
    .await
}

/// `POST /reset_prefix_cache`: every idle cached block dropped (blocks live requests hold stay);
/// `{dropped_blocks}`.
pub(crate) async fn reset_prefix_cache(State(s): State<Arc<AppState>>) -> Response {
    let (reply, dropped) = tokio::sync::oneshot::channel();
    if s.worker.control(Control::ResetPrefixCache(reply)).is_err() {
        return ApiError::shutting_down().into_response();
    }
    match dropped.await {
        Ok(n) => json_response(StatusCode::OK, &json!({"dropped_blocks": n})),
        Err(_) => ApiError::shutting_down().into_response(),
    }
}

/// Runs `f` on a blocking thread; its JSON with 200, or its error.
async fn blocking(
    f: impl FnOnce() -> Result<serde_json::Value, ApiError> + Send + 'static,
) -> Response {
    match tokio::task::spawn_blocking(f).await {
        Ok(Ok(v)) => json_response(StatusCode::OK, &v),
        Ok(Err(e)) => e.into_response(),
        Err(e) => ApiError::engine(e.to_string()).into_response(),
    }
}

impl AppState {
    /// Refuses a model name no model or adapter has.
    fn known(&self, model: Option<&str>) -> Result<(), ApiError> {
        model.map_or(Ok(()), |m| self.adapter_of(m).map(|_| ()))
    }
}
