//! What stands before the routes: the API key (`--api-key`: every route but `/health` and
//! `/metrics` wants `Authorization: Bearer KEY`, else 401 in the OpenAI shape) and CORS
//! (`--allowed-origins`: a browser page from one of them may call the server; its preflight gets 204
//! and its responses the `Access-Control-Allow-Origin` it needs; with none allowed, no CORS header,
//! and a preflight is a 405 like any other wrong method).

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::error::ApiError;

/// The guard's settings.
#[derive(Debug, Clone, Default)]
pub struct Guard {
    /// The key clients must send; `None`: no key.
    pub api_key: Option<String>,
    /// Origins a browser may call from (`*`: any); empty: none.
    pub allowed_origins: Vec<String>,
}

/// Routes open without the key (probes and scrapers).
const OPEN: [&str; 2] = ["/health", "/metrics"];

impl Guard {
    /// The `Access-Control-Allow-Origin` value for `headers`' origin, if it is allowed.
    fn allow_origin(&self, headers: &HeaderMap) -> Option<HeaderValue> {
        let origin = headers.get(header::ORIGIN)?;
        if self.allowed_origins.iter().any(|o| o == "*") {
            return Some(HeaderValue::from_static("*"));
        }
        let o = origin.to_str().ok()?;
        self.allowed_origins
            .iter()
            .any(|a| a == o)
            .then(|| origin.clone())
    }

    fn authorized(&self, request: &Request) -> bool {
        let Some(key) = &self.api_key else {
            return true;
        };
        if OPEN.contains(&request.uri().path()) {
            return true;
        }
        let sent = request
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        sent.is_some_and(|s| constant_time_eq(s.as_bytes(), key.as_bytes()))
    }
}

/// Middleware: CORS first (a preflight carries no key), then the key.
pub async fn check(State(guard): State<Arc<Guard>>, request: Request, next: Next) -> Response {
    let origin = guard.allow_origin(request.headers());
    let preflight = request.method() == Method::OPTIONS
        && request
            .headers()
            .contains_key(header::ACCESS_CONTROL_REQUEST_METHOD);
    if let (true, Some(origin)) = (preflight, origin.clone()) {
        return preflight_response(origin, request.headers());
    }
    let mut response = if guard.authorized(&request) {
        next.run(request).await
    } else {
        ApiError::unauthorized().into_response()
    };
    if let Some(origin) = origin {
        let h = response.headers_mut();
        h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
        h.insert(
            header::ACCESS_CONTROL_EXPOSE_HEADERS,
            HeaderValue::from_static("x-request-id, x-kvsched-ignored-fields, retry-after"),
        );
        h.insert(header::VARY, HeaderValue::from_static("origin"));
    }
    response
}

/// 204 with what the browser asked to send.
fn preflight_response(origin: HeaderValue, asked: &HeaderMap) -> Response {
    let headers = asked
        .get(header::ACCESS_CONTROL_REQUEST_HEADERS)
        .cloned()
        .unwrap_or_else(|| HeaderValue::from_static("authorization, content-type, x-request-id"));
    (
        StatusCode::NO_CONTENT,
        [
            (header::ACCESS_CONTROL_ALLOW_ORIGIN, origin),
            (
                header::ACCESS_CONTROL_ALLOW_METHODS,
                HeaderValue::from_static("GET, POST, OPTIONS"),
            ),
            (header::ACCESS_CONTROL_ALLOW_HEADERS, headers),
            (
                header::ACCESS_CONTROL_MAX_AGE,
                HeaderValue::from_static("600"),
            ),
            (header::VARY, HeaderValue::from_static("origin")),
        ],
    )
        .into_response()
}

/// Compares without stopping at the first difference (a key's prefix is not timed out of it).
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}
