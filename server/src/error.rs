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

    /// 429: the queue is full.
    pub fn overloaded(depth: usize) -> Self {
        Self {
            status: StatusCode::TOO_MANY_REQUESTS,
            message: format!(
                "The server is overloaded: {depth} requests are already waiting; retry later."
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

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        crate::routes::json_response(self.status, &self.body())
    }
}
