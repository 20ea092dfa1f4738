//! Request ids: the client's `X-Request-Id` when it sends a usable one, else a random UUID (v4);
//! echoed on every response, and the id a completion carries (`cmpl-…`, `chatcmpl-…`), so ids do
//! not repeat across restarts or replicas.

use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};

use axum::extract::Request;
use axum::http::HeaderValue;
use axum::middleware::Next;
use axum::response::Response;

/// The header that carries a request's id, both ways.
pub const HEADER: &str = "x-request-id";

/// The longest client id taken as is.
const MAX_LEN: usize = 128;

/// A request's id (in the request's extensions once [`tag`] ran).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestId(pub String);

/// Middleware: gives the request its id and echoes it on the response.
pub async fn tag(mut request: Request, next: Next) -> Response {
    let id = request
        .headers()
        .get(HEADER)
        .and_then(|v| v.to_str().ok())
        .filter(|v| usable(v))
        .map_or_else(uuid_v4, str::to_string);
    request.extensions_mut().insert(RequestId(id.clone()));
    let mut response = next.run(request).await;
    if let Ok(v) = HeaderValue::from_str(&id) {
        response.headers_mut().insert(HEADER, v);
    }
    response
}

/// A client id is used when it is 1 to 128 visible ASCII characters.
fn usable(id: &str) -> bool {
    !id.is_empty() && id.len() <= MAX_LEN && id.bytes().all(|b| b.is_ascii_graphic())
}

/// A random UUID, version 4: 122 bits from the standard library's randomly keyed hasher (its keys
/// come from the operating system's random source, once per process) over a counter.
pub fn uuid_v4() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    static KEYS: std::sync::OnceLock<std::collections::hash_map::RandomState> =
        std::sync::OnceLock::new();
    let keys = KEYS.get_or_init(std::collections::hash_map::RandomState::new);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let half = |salt: u64| {
        let mut h = keys.build_hasher();
        h.write_u64(n);
        h.write_u64(salt);
        h.finish()
    };
    let (hi, lo) = (half(0x6b76_7363_6865_6431), half(0x7265_7175_6573_7432));
    let hi = (hi & !0xF000) | 0x4000; // version 4
    let lo = (lo & !(0b11 << 62)) | (0b10 << 62); // variant 1
    format!(
        "{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        hi >> 32,
        (hi >> 16) & 0xFFFF,
        hi & 0xFFFF,
        lo >> 48,
        lo & 0xFFFF_FFFF_FFFF
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_uuid_is_version_4_and_does_not_repeat() {
        let ids: std::collections::HashSet<String> = (0..1000).map(|_| uuid_v4()).collect();
        assert_eq!(ids.len(), 1000);
        for id in ids.iter().take(20) {
            let b = id.as_bytes();
            assert_eq!(id.len(), 36, "{id}");
            assert_eq!(
                (b[8], b[13], b[18], b[23]),
                (b'-', b'-', b'-', b'-'),
                "{id}"
            );
            assert_eq!(b[14], b'4', "{id}");
            assert!(matches!(b[19], b'8' | b'9' | b'a' | b'b'), "{id}");
        }
    }

    #[test]
    fn only_a_short_visible_client_id_is_used() {
        assert!(usable("trace-42"));
        assert!(!usable(""));
        assert!(!usable("has space"));
        assert!(!usable(&"x".repeat(MAX_LEN + 1)));
    }
}
