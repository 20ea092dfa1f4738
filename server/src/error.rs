//! Errors in the OpenAI shape: `{"error": {"message", "type", "param", "code"}}` with an HTTP status.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

/// A refused or failed request, as the OpenAI API words it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// The HTTP status.
    pub status: StatusCode,
    /// What went wrong, for a person.
    pub message: String,
    /// The OpenAI error type (`invalid_request_error`, `rate_limit_error`, ...).
    pub kind: &'static str,
    /// The request field at fault, if one is.
    pub param: Option<String>,
    /// A stable machine-readable code.
    pub code: &'static str,
}

impl ApiError {
    /// 400: field `param` of the request is wrong (`code` says how).
    pub fn invalid(param: &str, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param: (!param.is_empty()).then(|| param.to_string()),
            code,
        }
    }

    /// 404: no model of that name is served.
    pub fn unknown_model(name: &str) -> Self {
        Self {
            status: StatusCode::NOT_FOUND,
            message: format!("The model `{name}` does not exist."),
            kind: "invalid_request_error",
            param: Some("model".into()),
            code: "model_not_found",
        }
    }

    /// 401: no API key, or the wrong one.
    pub fn unauthorized() -> Self {
        Self {
            status: StatusCode::UNAUTHORIZED,
            message: "Incorrect API key provided: send `Authorization: Bearer KEY`.".into(),
            kind: "invalid_request_error",
            param: None,
            code: "invalid_api_key",
        }
    }

    /// 404: no such route.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::NOT_FOUND,
            message: message.into(),
            kind: "invalid_request_error",
            param: None,
            code: "not_found",
        }
    }

    /// 405: the route takes another method.
    pub fn method_not_allowed(method: &str, path: &str) -> Self {
        Self {
            status: StatusCode::METHOD_NOT_ALLOWED,
            message: format!("{path} does not take {method}."),
            kind: "invalid_request_error",
            param: None,
            code: "method_not_allowed",
        }
    }

    /// 409: an adapter with requests on it cannot be unloaded.
    pub fn adapter_busy(name: &str, requests: usize) -> Self {
        Self {
            status: StatusCode::CONFLICT,
            message: format!(
                "The LoRA adapter '{name}' has {requests} requests running or waiting on it; unload it once they end."
            ),
            kind: "invalid_request_error",
            param: Some("lora_name".into()),
            code: "adapter_busy",
        }
    }

    /// 413: the body is longer than `limit` bytes.
    pub fn too_large(limit: usize) -> Self {
        Self {
            status: StatusCode::PAYLOAD_TOO_LARGE,
            message: format!("The request body is larger than {limit} bytes."),
            kind: "invalid_request_error",
            param: None,
            code: "request_too_large",
        }
    }

    /// 429: every engine slot (`slots`) and queue place (`depth`) is taken.
    pub fn overloaded(slots: usize, depth: usize) -> Self {
        Self {
            status: StatusCode::TOO_MANY_REQUESTS,
            message: format!(
                "The server is overloaded: {slots} requests are running and {depth} waiting; retry later."
            ),
            kind: "rate_limit_error",
            param: None,
            code: "queue_full",
        }
    }

    /// 503: the server is shutting down.
    pub fn shutting_down() -> Self {
        Self {
            status: StatusCode::SERVICE_UNAVAILABLE,
            message: "The server is shutting down.".into(),
            kind: "server_error",
            param: None,
            code: "shutting_down",
        }
    }

    /// 500: the engine failed the request.
    pub fn engine(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            message: message.into(),
            kind: "server_error",
            param: None,
            code: "engine_error",
        }
    }

    /// The error's JSON body.
    pub fn body(&self) -> Value {
        json!({"error": {
            "message": self.message,
            "type": self.kind,
            "param": self.param,
            "code": self.code,
        }})
    }
}

/// How long a refused client should wait before it retries, seconds (`Retry-After` on 429 and 503).
const RETRY_AFTER_SECONDS: &str = "1";

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = crate::routes::json_response(self.status, &self.body());
        if matches!(
            self.status,
            StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE
        ) {
            r.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from_static(RETRY_AFTER_SECONDS),
            );
        }
        r
    }
}

/// Why the server did not start (`kvsched serve` exits 2 for each).
#[derive(Debug)]
pub enum StartError {
    /// The flags contradict each other or the model.
    Flags(String),
    /// An adapter did not load, or its name is taken.
    Adapter(String),
    /// The engine refused its configuration or an adapter.
    Engine(String),
    /// A KV event socket did not bind.
    KvEvents(String),
    /// The address does not listen.
    Listen(std::net::SocketAddr, std::io::Error),
    /// A thread did not start.
    Thread(&'static str, std::io::Error),
}

impl std::fmt::Display for StartError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Flags(why) | Self::Adapter(why) | Self::KvEvents(why) => f.write_str(why),
            Self::Engine(why) => write!(f, "the engine refused its configuration: {why}"),
            Self::Listen(addr, e) => write!(f, "cannot listen on {addr}: {e}"),
            Self::Thread(name, e) => write!(f, "cannot start the {name} thread: {e}"),
        }
    }
}

impl std::error::Error for StartError {}
