//! The HTTP contract around the generation endpoints (issue 43): every refusal in the OpenAI error
//! shape (a body too large 413, a wrong method 405, each counted), request ids that do not repeat
//! across servers (a random UUID, or the client's `X-Request-Id`, echoed), `GET /v1/models/{id}`,
//! `/tokenize` and `/detokenize`, the API key, and CORS for the allowed origins only.

#[path = "support/http.rs"]
mod http;
#[path = "support/serve.rs"]
mod serve;

use serde_json::json;

use http::{get, metric, post, request, request_with};
use serve::{config, model, start, BASE};

#[test]
fn a_body_too_large_and_a_wrong_method_are_refused_in_the_openai_shape() {
    let Some(m) = model() else { return };
    let mut cfg = config();
    cfg.max_body_bytes = 1000;
    let server = start(&m, &cfg);
    let addr = server.addr();
    let big = json!({"model": BASE, "prompt": "x".repeat(2000)});
    let r = post(addr, "/v1/completions", &big);
    assert_eq!(r.status, 413, "{}", r.body);
    assert_eq!(r.json()["error"]["code"], "request_too_large");
    assert_eq!(r.json()["error"]["type"], "invalid_request_error");
    let r = get(addr, "/v1/completions");
    assert_eq!(r.status, 405, "{}", r.body);
    assert_eq!(r.json()["error"]["code"], "method_not_allowed");
    assert!(
        r.header("allow").is_some_and(|a| a.contains("POST")),
        "{:?}",
        r.headers
    );
    let r = request(addr, "DELETE", "/v1/models", None);
    assert_eq!(r.status, 405);
    assert_eq!(r.json()["error"]["code"], "method_not_allowed");
    let r = get(addr, "/nothing");
    assert_eq!(
        (r.status, r.json()["error"]["code"].as_str()),
        (404, Some("not_found"))
    );
    let text = get(addr, "/metrics").body;
    assert_eq!(
        metric(&text, "kvsched:requests_refused_total", "too_large"),
        1.0
    );
}

#[test]
fn request_ids_are_uuids_or_the_clients_and_are_echoed() {
    let Some(m) = model() else { return };
    let server = start(&m, &config());
    let addr = server.addr();
    let body = json!({"model": BASE, "prompt": "Hi", "max_tokens": 1}).to_string();
    let ids: Vec<(String, String)> = (0..2)
        .map(|_| {
            let r = request(addr, "POST", "/v1/completions", Some(&body));
            assert_eq!(r.status, 200, "{}", r.body);
            let header = r.header("x-request-id").expect("an id").to_string();
            (header, r.json()["id"].as_str().unwrap().to_string())
        })
        .collect();
    for (header, id) in &ids {
        assert_eq!(header.len(), 36, "{header}");
        assert_eq!(id, &format!("cmpl-{header}"));
    }
    assert_ne!(ids[0], ids[1]);
    let r = request_with(
        addr,
        "POST",
        "/v1/completions",
        &[("X-Request-Id", "trace-7f3a")],
        Some(&body),
    );
    assert_eq!(r.header("x-request-id"), Some("trace-7f3a"));
    assert_eq!(r.json()["id"], "cmpl-trace-7f3a");
    let refused = request_with(addr, "GET", "/nothing", &[("X-Request-Id", "t-2")], None);
    assert_eq!(refused.header("x-request-id"), Some("t-2"));
}

#[test]
fn one_model_is_retrieved_by_its_id() {
    let Some(m) = model() else { return };
    let (_, dir) = serve::peft_adapter(&m, 9);
    let mut cfg = config();
    cfg.adapters = vec![("tuned".into(), dir)];
    let server = start(&m, &cfg);
    let addr = server.addr();
    let base = get(addr, &format!("/v1/models/{BASE}")).json();
    assert_eq!(
        (base["id"].as_str(), base["object"].as_str()),
        (Some(BASE), Some("model"))
    );
    assert!(base["parent"].is_null());
    let tuned = get(addr, "/v1/models/tuned").json();
    assert_eq!(tuned["parent"], BASE);
    let r = get(addr, "/v1/models/none");
    assert_eq!(r.status, 404);
    assert_eq!(r.json()["error"]["code"], "model_not_found");
}

#[test]
fn tokenize_and_detokenize_round_trip() {
    let Some(m) = model() else { return };
    let server = start(&m, &config());
    let addr = server.addr();
    let r = post(
        addr,
        "/tokenize",
        &json!({"model": BASE, "prompt": "Hello there"}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let t = r.json();
    let tokens = t["tokens"].as_array().unwrap().clone();
    assert_eq!(t["count"], tokens.len());
    assert_eq!(t["max_model_len"], 2048);
    assert_eq!(
        tokens,
        json!(m.tokenizer().encode("Hello there").unwrap())
            .as_array()
            .unwrap()
            .clone()
    );
    let back = post(addr, "/detokenize", &json!({"tokens": tokens})).json();
    assert_eq!(back["prompt"], "Hello there");
    let chat = post(
        addr,
        "/tokenize",
        &json!({"messages": [{"role": "user", "content": "Hi"}]}),
    )
    .json();
    let chat_tokens: Vec<u32> = serde_json::from_value(chat["tokens"].clone()).unwrap();
    let want = m
        .tokenizer()
        .encode_chat(&[kvsched_engine::Message::user("Hi")], true)
        .unwrap();
    assert_eq!(chat_tokens, want);
    let r = post(addr, "/tokenize", &json!({"model": "nope", "prompt": "x"}));
    assert_eq!(
        (r.status, r.json()["error"]["code"].as_str()),
        (404, Some("model_not_found"))
    );
    let r = post(addr, "/detokenize", &json!({"tokens": [99_999_999]}));
    assert_eq!(
        (r.status, r.json()["error"]["param"].as_str()),
        (400, Some("tokens"))
    );
}

#[test]
fn an_api_key_guards_every_route_but_the_probes() {
    let Some(m) = model() else { return };
    let mut cfg = config();
    cfg.guard.api_key = Some("sesame".into());
    let server = start(&m, &cfg);
    let addr = server.addr();
    let r = get(addr, "/v1/models");
    assert_eq!(r.status, 401, "{}", r.body);
    assert_eq!(r.json()["error"]["code"], "invalid_api_key");
    let wrong = request_with(
        addr,
        "GET",
        "/v1/models",
        &[("Authorization", "Bearer open")],
        None,
    );
    assert_eq!(wrong.status, 401);
    let right = request_with(
        addr,
        "GET",
        "/v1/models",
        &[("Authorization", "Bearer sesame")],
        None,
    );
    assert_eq!(right.status, 200, "{}", right.body);
    assert_eq!(get(addr, "/health").status, 200);
    assert_eq!(get(addr, "/metrics").status, 200);
}

/// A CORS preflight got an empty 405 (issue 43). With the origin allowed it gets 204 and the
/// headers a browser needs; with none allowed it is refused in the OpenAI shape, and no response
/// carries a CORS header.
#[test]
fn an_allowed_origin_gets_its_preflight_and_others_do_not() {
    let Some(m) = model() else { return };
    let preflight = [
        ("Origin", "http://app.example"),
        ("Access-Control-Request-Method", "POST"),
        (
            "Access-Control-Request-Headers",
            "content-type, authorization",
        ),
    ];
    let closed = start(&m, &config());
    let r = request_with(
        closed.addr(),
        "OPTIONS",
        "/v1/completions",
        &preflight,
        None,
    );
    assert_eq!(r.status, 405);
    assert_eq!(r.json()["error"]["code"], "method_not_allowed");
    let r = request_with(closed.addr(), "GET", "/v1/models", &preflight[..1], None);
    assert!(r.header("access-control-allow-origin").is_none());
    let mut cfg = config();
    cfg.guard.allowed_origins = vec!["http://app.example".into()];
    cfg.guard.api_key = Some("k".into());
    let open = start(&m, &cfg);
    let r = request_with(open.addr(), "OPTIONS", "/v1/completions", &preflight, None);
    assert_eq!(r.status, 204, "{}", r.body);
    assert_eq!(
        r.header("access-control-allow-origin"),
        Some("http://app.example")
    );
    assert!(r
        .header("access-control-allow-methods")
        .is_some_and(|m| m.contains("POST")));
    assert_eq!(
        r.header("access-control-allow-headers"),
        Some("content-type, authorization")
    );
    let auth = [preflight[0], ("Authorization", "Bearer k")];
    let r = request_with(open.addr(), "GET", "/v1/models", &auth, None);
    assert_eq!(
        (r.status, r.header("access-control-allow-origin")),
        (200, Some("http://app.example"))
    );
    let other = [("Origin", "http://evil.example"), preflight[1]];
    let r = request_with(open.addr(), "OPTIONS", "/v1/completions", &other, None);
    // Not a preflight then: a request without the key, refused.
    assert_eq!(r.status, 401, "an origin not allowed gets no preflight");
    assert!(r.header("access-control-allow-origin").is_none());
}

/// `POST /reset_prefix_cache`: the next identical prompt finds nothing cached.
#[test]
fn resetting_the_prefix_cache_empties_it() {
    let Some(m) = model() else { return };
    let server = start(&m, &config());
    let addr = server.addr();
    let body = json!({"model": BASE, "prompt": "A preamble long enough to fill two pages of sixteen tokens each, then some.",
                      "max_tokens": 1, "temperature": 0});
    let cached = || {
        post(addr, "/v1/completions", &body).json()["usage"]["prompt_tokens_details"]
            ["cached_tokens"]
            .clone()
    };
    assert_eq!(cached(), 0);
    assert_ne!(cached(), 0, "the prompt's pages are cached");
    let r = post(addr, "/reset_prefix_cache", &json!({}));
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(r.json()["dropped_blocks"].as_u64().unwrap() >= 1);
    assert_eq!(cached(), 0, "nothing is cached after the reset");
    let text = get(addr, "/metrics").body;
    assert_eq!(
        metric(&text, "kvsched:kv_pages", "tier=\"gpu\",state=\"used\""),
        0.0
    );
}

/// A client that shuts its sending side once the request is sent got an empty reply, and its
/// request was aborted (issue 43): the connection is kept half-closed until the response is out.
#[test]
fn a_client_that_half_closes_after_its_request_gets_the_response() {
    use std::io::{Read, Write};
    let Some(m) = model() else { return };
    let server = start(&m, &config());
    let body =
        json!({"model": BASE, "prompt": "Hello", "max_tokens": 3, "temperature": 0}).to_string();
    let mut s = std::net::TcpStream::connect(server.addr()).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(60)))
        .unwrap();
    let head = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).unwrap();
    s.write_all(body.as_bytes()).unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    let mut reply = String::new();
    s.read_to_string(&mut reply).unwrap();
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply:?}");
    assert!(reply.contains("\"finish_reason\":\"length\""), "{reply}");
    let text = get(server.addr(), "/metrics").body;
    assert_eq!(metric(&text, "vllm:request_success_total", "abort"), 0.0);
}
