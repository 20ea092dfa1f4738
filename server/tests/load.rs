//! A bounded load test over loopback (issue 43): 4 × `max-num-seqs` requests at once (completions
//! and chat, whole and streamed) on a KV pool small enough that requests are preempted and
//! replayed. No request is refused while capacity remains, every response is well formed, and
//! `/metrics`, scraped after the run, adds up to what the run did: the finished requests and their
//! tokens, the phase histograms' counts, prefix-cache hits never above queries (replays counted in
//! both), no suspension counted where no page moved, the pool's size from the first scrape.

#[path = "support/http.rs"]
mod http;
#[path = "support/serve.rs"]
mod serve;

use std::net::SocketAddr;

use serde_json::{json, Value};

use http::{get, metric, post, Events};
use serve::{config, model, start, BASE};

const SLOTS: u32 = 4;
const REQUESTS: usize = 4 * SLOTS as usize;
const GPU_PAGES: u32 = 40;

/// Request `i`: completions or chat, whole or streamed, each with usage; a shared opening so the
/// prefix cache has something to find.
fn request(i: usize) -> (&'static str, Value) {
    let text = format!("Once upon a time, in a land far away, there lived story number {i}:");
    let stream = i % 2 == 1;
    let mut body = if i % 4 < 2 {
        json!({"model": BASE, "prompt": text})
    } else {
        json!({"model": BASE, "messages": [{"role": "user", "content": text}]})
    };
    body["max_tokens"] = json!(120 + 10 * i);
    body["temperature"] = json!(0);
    body["ignore_eos"] = json!(!i.is_multiple_of(3));
    if stream {
        body["stream"] = json!(true);
        body["stream_options"] = json!({"include_usage": true});
    }
    let path = if i % 4 < 2 {
        "/v1/completions"
    } else {
        "/v1/chat/completions"
    };
    (path, body)
}

/// Sends request `i` and checks its response's shape; returns its usage.
fn run_one(addr: SocketAddr, i: usize) -> Value {
    let (path, body) = request(i);
    let chat = path.contains("chat");
    let (object, prefix) = if chat {
        ("chat.completion", "chatcmpl-")
    } else {
        ("text_completion", "cmpl-")
    };
    if body["stream"] == json!(true) {
        let events = Events::open(addr, path, &body);
        assert_eq!(events.status, 200, "request {i}");
        let all = events.all();
        let usage = all.last().expect("events")["usage"].clone();
        for e in &all {
            assert!(
                e["id"].as_str().is_some_and(|id| id.starts_with(prefix)),
                "{e}"
            );
            let expected = if chat {
                "chat.completion.chunk"
            } else {
                object
            };
            assert_eq!(e["object"], expected, "{e}");
        }
        let (_, reason) = http::stream_text(&all);
        assert!(
            matches!(reason.as_deref(), Some("stop" | "length")),
            "{reason:?}"
        );
        usage
    } else {
        let r = post(addr, path, &body);
        assert_eq!(r.status, 200, "request {i}: {}", r.body);
        let v = r.json();
        assert_eq!(v["object"], object, "{v}");
        assert!(
            v["id"].as_str().is_some_and(|id| id.starts_with(prefix)),
            "{v}"
        );
        let reason = v["choices"][0]["finish_reason"].as_str();
        assert!(matches!(reason, Some("stop" | "length")), "{v}");
        v["usage"].clone()
    }
}

#[test]
fn four_times_the_slots_run_whole_and_the_metrics_add_up() {
    let Some(m) = model() else { return };
    let mut cfg = config();
    cfg.engine.scheduler.max_num_requests = SLOTS;
    cfg.max_queue = REQUESTS - SLOTS as usize;
    cfg.engine.gpu_pages = GPU_PAGES;
    cfg.engine.max_blocks = 24;
    let server = start(&m, &cfg);
    let addr = server.addr();
    let first = get(addr, "/metrics").body;
    let page = |text: &str, state: &str| {
        metric(
            text,
            "kvsched:kv_pages",
            &format!("tier=\"gpu\",state=\"{state}\""),
        )
    };
    assert_eq!(
        page(&first, "free"),
        f64::from(GPU_PAGES),
        "the pool's size before any request"
    );
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(REQUESTS));
    let threads: Vec<_> = (0..REQUESTS)
        .map(|i| {
            let b = std::sync::Arc::clone(&barrier);
            std::thread::spawn(move || {
                b.wait();
                run_one(addr, i)
            })
        })
        .collect();
    let usages: Vec<Value> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    let sum = |field: &str| {
        usages
            .iter()
            .map(|u| u[field].as_f64().unwrap())
            .sum::<f64>()
    };
    for u in &usages {
        assert_eq!(
            u["total_tokens"],
            u["prompt_tokens"].as_u64().unwrap() + u["completion_tokens"].as_u64().unwrap()
        );
    }
    let text = get(addr, "/metrics").body;
    let m = |name: &str| metric(&text, name, "");
    let n = REQUESTS as f64;
    let ended = |reason: &str| {
        metric(
            &text,
            "vllm:request_success_total",
            &format!("\"{reason}\""),
        )
    };
    assert_eq!((ended("stop") + ended("length"), ended("abort")), (n, 0.0));
    for reason in ["invalid", "overloaded", "shutting_down", "too_large"] {
        assert_eq!(
            metric(&text, "kvsched:requests_refused_total", reason),
            0.0,
            "{reason}"
        );
    }
    assert_eq!(m("vllm:generation_tokens_total"), sum("completion_tokens"));
    assert_eq!(m("vllm:prompt_tokens_total"), sum("prompt_tokens"));
    for h in [
        "e2e_request_latency",
        "time_to_first_token",
        "request_queue_time",
        "request_prefill_time",
        "request_decode_time",
        "request_inference_time",
    ] {
        assert_eq!(m(&format!("vllm:{h}_seconds_count")), n, "{h}");
    }
    assert_eq!(
        m("vllm:request_generation_tokens_sum"),
        sum("completion_tokens")
    );
    assert_eq!(m("vllm:request_prompt_tokens_count"), n);
    let (hits, queries) = (
        m("vllm:prefix_cache_hits_total"),
        m("vllm:prefix_cache_queries_total"),
    );
    assert!(
        hits > 0.0 && hits <= queries,
        "hits {hits}, queries {queries}"
    );
    assert!(
        queries >= sum("prompt_tokens"),
        "every prompt looked up at least once"
    );
    assert!(
        m("vllm:num_preemptions_total") > 0.0,
        "the pool is small enough to preempt:\n{text}"
    );
    assert_eq!(
        m("kvsched:suspensions_total"),
        0.0,
        "no host tier: no page moved"
    );
    assert_eq!(
        (
            m("vllm:num_requests_running"),
            m("vllm:num_requests_waiting")
        ),
        (0.0, 0.0)
    );
    assert_eq!(page(&text, "used"), 0.0);
    assert_eq!(
        page(&text, "free") + page(&text, "cached"),
        f64::from(GPU_PAGES)
    );
}

#[test]
fn without_a_prefix_cache_nothing_is_looked_up() {
    let Some(m) = model() else { return };
    let mut cfg = config();
    cfg.engine.prefix_cache = false;
    let server = start(&m, &cfg);
    let addr = server.addr();
    for _ in 0..2 {
        let r = post(
            addr,
            "/v1/completions",
            &json!({"model": BASE, "prompt": "The same prompt, twice", "max_tokens": 2}),
        );
        assert_eq!(r.status, 200, "{}", r.body);
    }
    let text = get(addr, "/metrics").body;
    assert_eq!(metric(&text, "vllm:prefix_cache_queries_total", ""), 0.0);
    assert_eq!(metric(&text, "vllm:prefix_cache_hits_total", ""), 0.0);
}
