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

/// `POST /v1/load_lora_adapter` (`lora_name`, `lora_path`: a PEFT directory or its safetensors file):
/// the adapter is read on a blocking thread, registered between two engine steps, then served.
pub(crate) async fn load_lora_adapter(
    State(s): State<Arc<AppState>>,
    request: Request,
) -> Response {
    match load(&s, request).await {
        Ok(name) => text(format!(
            "Success: LoRA adapter '{name}' added successfully."
        )),
        Err(e) => e.into_response(),
    }
}

async fn load(s: &Arc<AppState>, request: Request) -> Result<String, ApiError> {
    let body = read_body(request, s.max_body_bytes).await?;
    let (name, path) = lora_fields(&body, true)?;
    let path = path.unwrap_or_default();
    if name == s.base {
        return Err(ApiError::invalid(
            "lora_name",
            "invalid_value",
            "That is the base model's name.",
        ));
    }
    let id = s.adapters.reserve(&name)?;
    let model = Arc::clone(&s.model);
    let lora = tokio::task::spawn_blocking(move || {
        kvsched_engine::Lora::load_peft(model.config(), &path).map_err(|e| {
            ApiError::invalid(
                "lora_path",
                "invalid_value",
                format!("{}: {e}", path.display()),
            )
        })
    })
    .await
    .map_err(|e| ApiError::engine(e.to_string()))??;
    let (reply, done) = tokio::sync::oneshot::channel();
    s.worker
        .control(Control::LoadAdapter {
            id,
            name: name.clone(),
            lora: Box::new(lora),
            reply,
        })
        .map_err(|_| ApiError::shutting_down())?;
    done.await
        .map_err(|_| ApiError::shutting_down())?
        .map_err(|e| ApiError::invalid("lora_path", "invalid_value", e.to_string()))?;
    s.adapters.add(&name, id)?;
    Ok(name)
}

/// `POST /v1/unload_lora_adapter` (`lora_name`): refused (409) while any request, running or
/// waiting, is on it; else no longer served, and its engine slot retired.
pub(crate) async fn unload_lora_adapter(
    State(s): State<Arc<AppState>>,
    request: Request,
) -> Response {
    let unload = async {
        let body = read_body(request, s.max_body_bytes).await?;
        let (name, _) = lora_fields(&body, false)?;
        let id = s.adapters.remove_idle(&name)?;
        let (reply, done) = tokio::sync::oneshot::channel();
        s.worker
            .control(Control::UnloadAdapter(id, reply))
            .map_err(|_| ApiError::shutting_down())?;
        done.await
            .map_err(|_| ApiError::shutting_down())?
            .map_err(|e| ApiError::engine(e.to_string()))?;
        Ok::<_, ApiError>(name)
    };
    match unload.await {
        Ok(name) => text(format!(
            "Success: LoRA adapter '{name}' removed successfully."
        )),
        Err(e) => e.into_response(),
    }
}

/// `lora_name` (and `lora_path` when `with_path`) from a body.
fn lora_fields(
    body: &[u8],
    with_path: bool,
) -> Result<(String, Option<std::path::PathBuf>), ApiError> {
    let v = api::object(body)?;
    let field = |name: &str| {
        v.get(name)
            .and_then(serde_json::Value::as_str)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .ok_or_else(|| {
                ApiError::invalid(
                    name,
                    "missing_field",
                    format!("`{name}` is a required string."),
                )
            })
    };
    let path = if with_path {
        Some(field("lora_path")?.into())
    } else {
        None
    };
    Ok((field("lora_name")?, path))
}

/// A 200 with a line of text (vLLM's answer to the adapter endpoints).
fn text(line: String) -> Response {
    (StatusCode::OK, line).into_response()
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
        match model {
            Some(m) if m != self.base && !self.adapters.contains(m) => {
                Err(ApiError::unknown_model(m))
            }
            _ => Ok(()),
        }
    }
}
