//! `kvsched serve` in process, over loopback HTTP: the endpoints, greedy outputs equal to the
//! engine's in process (alone and under concurrent streams), stop strings, an adapter selected by
//! `model`, a disconnect that frees the request's pages, overload answered with 429, and every
//! malformed request with its 400.

#[path = "support/http.rs"]
mod http;
#[path = "support/serve.rs"]
mod serve;

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use http::{get, metric, post, stream_text, Events};
use serve::{config, in_process, model, start, text_of, BASE};

fn completion(model: &str, prompt: &Value, max_tokens: usize, stream: bool) -> Value {
    json!({"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
           "stream": stream})
}

#[test]
fn models_health_and_metrics_answer() {
    let Some(m) = model() else { return };
    let (_, dir) = serve::peft_adapter(&m, 5);
    let mut cfg = config();
    cfg.adapters = vec![("tuned".into(), dir)];
    let server = start(&m, &cfg);
    let addr = server.addr();
    assert_eq!(get(addr, "/health").status, 200);
    let models = get(addr, "/v1/models").json();
    let ids: Vec<&str> = models["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, [BASE, "tuned"]);
    assert_eq!(models["data"][1]["parent"], BASE);
    let r = post(
        addr,
        "/v1/completions",
        &completion(BASE, &json!("Hello"), 4, false),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let metrics = get(addr, "/metrics");
    assert!(metrics
        .header("content-type")
        .unwrap()
        .starts_with("text/plain"));
    let text = metrics.body;
    for name in [
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:cpu_cache_usage_perc",
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
        "vllm:num_preemptions_total",
        "kvsched:suspensions_total",
        "kvsched:adapter_loads_total",
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:inter_token_latency_seconds_bucket",
        "vllm:e2e_request_latency_seconds_count",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
    ] {
        assert!(
            text.contains(&format!("{name}{{")),
            "{name} missing:\n{text}"
        );
    }
    assert_eq!(metric(&text, "vllm:generation_tokens_total", ""), 4.0);
    assert_eq!(
        metric(&text, "vllm:e2e_request_latency_seconds_count", ""),
        1.0
    );
    assert_eq!(metric(&text, "vllm:request_success_total", "length"), 1.0);
    assert_eq!(get(addr, "/nothing").status, 404);
}

#[test]
fn a_greedy_completion_equals_the_engine_in_process_streamed_or_not() {
    let Some(m) = model() else { return };
    let server = start(&m, &config());
    let prompt = m.tokenizer().encode("The capital of France is").unwrap();
    let want = in_process(&m, &prompt, 24, None);
    let want_text = text_of(&m, &want);
    let r = post(
        server.addr(),
        "/v1/completions",
        &completion(BASE, &json!(prompt), 24, false),
    )
    .json();
    assert_eq!(r["object"], "text_completion");
    assert_eq!(r["choices"][0]["text"], want_text.as_str());
    assert_eq!(r["usage"]["prompt_tokens"], prompt.len());
    assert_eq!(r["usage"]["completion_tokens"], want.len());
    let mut body = completion(BASE, &json!(prompt), 24, true);
    body["stream_options"] = json!({"include_usage": true});
    let events = Events::open(server.addr(), "/v1/completions", &body);
    assert!(events
        .headers
        .iter()
        .any(|(n, v)| n == "content-type" && v == "text/event-stream"));
    let events = events.all();
    let (text, reason) = stream_text(&events);
    assert_eq!(text, want_text);
    assert_eq!(reason.as_deref(), r["choices"][0]["finish_reason"].as_str());
    let usage = &events.last().unwrap()["usage"];
    assert_eq!(usage["completion_tokens"], want.len());
    assert!(events[..events.len() - 1]
        .iter()
        .all(|e| e["usage"].is_null()));
}

#[test]
fn chat_streamed_equals_chat_whole_and_the_template_is_applied() {
    let Some(m) = model() else { return };
    let server = start(&m, &config());
    let messages = json!([{"role": "user", "content": "Name three colours."}]);
    let body = json!({"model": BASE, "messages": messages, "max_tokens": 20, "temperature": 0});
    let whole = post(server.addr(), "/v1/chat/completions", &body).json();
    assert_eq!(whole["object"], "chat.completion");
    assert_eq!(whole["choices"][0]["message"]["role"], "assistant");
    let prompt = m
        .tokenizer()
        .encode_chat(
            &[kvsched_engine::Message::user("Name three colours.")],
            true,
        )
        .unwrap();
    assert_eq!(whole["usage"]["prompt_tokens"], prompt.len());
    let want = text_of(&m, &in_process(&m, &prompt, 20, None));
    assert_eq!(whole["choices"][0]["message"]["content"], want.as_str());
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let events = Events::open(server.addr(), "/v1/chat/completions", &streamed).all();
    assert_eq!(events[0]["choices"][0]["delta"]["role"], "assistant");
    assert!(events
        .iter()
        .all(|e| e["object"] == "chat.completion.chunk"));
    assert_eq!(stream_text(&events).0, want);
}

#[test]
fn a_stop_string_ends_the_text_before_it_streamed_or_not() {
    let Some(m) = model() else { return };
    let server = start(&m, &config());
    let prompt = m.tokenizer().encode("Count: one, two, three,").unwrap();
    let full = text_of(&m, &in_process(&m, &prompt, 24, None));
    // A stop string from the middle of the greedy text: the text ends right before it.
    let cut = full.char_indices().nth(full.chars().count() / 2).unwrap().0;
    let stop: String = full[cut..].chars().take(3).collect();
    let expected = &full[..full.find(&stop).unwrap()];
    let mut body = completion(BASE, &json!(prompt), 24, false);
    body["stop"] = json!([stop]);
    let r = post(server.addr(), "/v1/completions", &body).json();
    assert_eq!(
        r["choices"][0]["text"], expected,
        "stop {stop:?} in {full:?}"
    );
    assert_eq!(r["choices"][0]["finish_reason"], "stop");
    body["stream"] = json!(true);
    let (text, reason) = stream_text(&Events::open(server.addr(), "/v1/completions", &body).all());
    assert_eq!((text.as_str(), reason.as_deref()), (expected, Some("stop")));
}

#[test]
fn concurrent_streams_equal_their_solo_runs_token_for_token() {
    let Some(m) = model() else { return };
    let server = start(&m, &config());
    let addr = server.addr();
    let prompts = [
        "Write a haiku about the sea.",
        "What is 12 times 7?",
        "List the planets.",
        "Describe a cat in one sentence.",
        "Why is the sky blue?",
        "Say hello in French.",
    ];
    let body = |p: &str| {
        json!({"model": BASE, "messages": [{"role": "user", "content": p}], "max_tokens": 32,
               "temperature": 0, "stream": true, "ignore_eos": true})
    };
    let solo: Vec<String> = prompts
        .iter()
        .map(|p| stream_text(&Events::open(addr, "/v1/chat/completions", &body(p)).all()).0)
        .collect();
    let together: Vec<String> = std::thread::scope(|s| {
        let handles: Vec<_> = prompts
            .iter()
            .map(|p| {
                let b = body(p);
                s.spawn(move || {
                    stream_text(&Events::open(addr, "/v1/chat/completions", &b).all()).0
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(together, solo);
    let text = get(addr, "/metrics").body;
    assert_eq!(
        metric(&text, "vllm:generation_tokens_total", ""),
        2.0 * 6.0 * 32.0
    );
}

#[test]
fn an_adapter_is_selected_by_the_model_field() {
    let Some(m) = model() else { return };
    let (lora, dir) = serve::peft_adapter(&m, 11);
    let mut cfg = config();
    cfg.adapters = vec![("tuned".into(), dir)];
    let server = start(&m, &cfg);
    let prompt = m.tokenizer().encode("Once upon a time").unwrap();
    let tuned = text_of(&m, &in_process(&m, &prompt, 16, Some(&lora)));
    let base = text_of(&m, &in_process(&m, &prompt, 16, None));
    assert_ne!(tuned, base, "the adapter changes the greedy text");
    for (name, want) in [("tuned", &tuned), (BASE, &base)] {
        let r = post(
            server.addr(),
            "/v1/completions",
            &completion(name, &json!(prompt), 16, false),
        )
        .json();
        assert_eq!(r["choices"][0]["text"], want.as_str(), "{name}");
        assert_eq!(r["model"], name);
    }
    let text = get(server.addr(), "/metrics").body;
    assert!(metric(&text, "kvsched:adapter_loads_total", "") >= 1.0);
}

/// Polls `/metrics` until `done` holds for it, for at most `limit`.
fn wait_metrics(
    addr: std::net::SocketAddr,
    limit: Duration,
    done: impl Fn(&str) -> bool,
) -> String {
    let start = Instant::now();
    loop {
        let text = get(addr, "/metrics").body;
        if done(&text) || start.elapsed() > limit {
            return text;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_client_that_disconnects_mid_stream_frees_its_pages_and_its_lease() {
    let Some(m) = model() else { return };
    let (_, dir) = serve::peft_adapter(&m, 3);
    let mut cfg = config();
    cfg.adapters = vec![("tuned".into(), dir)];
    let server = start(&m, &cfg);
    let addr = server.addr();
    // 1,500 tokens would take the engine far longer than the wait below.
    let mut body = completion("tuned", &json!("Tell me a very long story."), 1500, true);
    body["ignore_eos"] = json!(true);
    let mut events = Events::open(addr, "/v1/completions", &body);
    for _ in 0..3 {
        events.next_data().expect("a first few chunks");
    }
    let busy = get(addr, "/metrics").body;
    assert_eq!(metric(&busy, "vllm:num_requests_running", ""), 1.0);
    assert!(metric(&busy, "kvsched:kv_pages", "state=\"used\"") > 0.0);
    drop(events);
    let text = wait_metrics(addr, Duration::from_secs(10), |t| {
        metric(t, "vllm:num_requests_running", "") == 0.0
    });
    assert_eq!(
        metric(&text, "vllm:num_requests_running", ""),
        0.0,
        "{text}"
    );
    assert_eq!(
        metric(&text, "kvsched:kv_pages", "tier=\"gpu\",state=\"used\""),
        0.0
    );
    assert_eq!(metric(&text, "kvsched:requests_cancelled_total", ""), 1.0);
    assert_eq!(metric(&text, "vllm:request_success_total", "abort"), 1.0);
    assert!(metric(&text, "vllm:generation_tokens_total", "") < 1500.0);
    // The adapter's lease came back: the same adapter serves the next request.
    let r = post(
        addr,
        "/v1/completions",
        &completion("tuned", &json!("Hi"), 2, false),
    );
    assert_eq!(r.status, 200, "{}", r.body);
}

#[test]
fn past_the_queue_depth_a_request_gets_429() {
    let Some(m) = model() else { return };
    let mut cfg = config();
    cfg.engine.scheduler.max_num_requests = 1;
    cfg.max_queue = 1;
    let server = start(&m, &cfg);
    let addr = server.addr();
    let mut long = completion(BASE, &json!("A long story:"), 1500, true);
    long["ignore_eos"] = json!(true);
    let mut running = Events::open(addr, "/v1/completions", &long);
    running.next_data().expect("the first request runs");
    let queued = Events::open(addr, "/v1/completions", &long);
    assert_eq!(queued.status, 200, "the second request waits in the queue");
    let r = post(
        addr,
        "/v1/completions",
        &completion(BASE, &json!("Hi"), 2, false),
    );
    assert_eq!(r.status, 429, "{}", r.body);
    let e = r.json();
    assert_eq!(e["error"]["type"], "rate_limit_error");
    assert_eq!(e["error"]["code"], "queue_full");
    let text = get(addr, "/metrics").body;
    assert_eq!(metric(&text, "vllm:num_requests_waiting", ""), 1.0);
    assert_eq!(
        metric(&text, "kvsched:requests_refused_total", "overloaded"),
        1.0
    );
}

#[test]
fn each_malformed_request_gets_a_400_naming_its_field() {
    let Some(m) = model() else { return };
    let mut cfg = config();
    cfg.engine.max_blocks = 4; // 64 positions
    let server = start(&m, &cfg);
    let long: String = "word ".repeat(80);
    let cases: Vec<(&str, String, u16, Option<&str>, &str)> = vec![
        (
            "/v1/completions",
            "{\"model\": ".into(),
            400,
            None,
            "invalid_json",
        ),
        (
            "/v1/completions",
            json!({"model": BASE}).to_string(),
            400,
            Some("prompt"),
            "missing_field",
        ),
        (
            "/v1/completions",
            json!({"model": BASE, "prompt": "x", "max_tokens": "3"}).to_string(),
            400,
            Some("max_tokens"),
            "invalid_type",
        ),
        (
            "/v1/completions",
            json!({"model": BASE, "prompt": "x", "max_tokens": 0}).to_string(),
            400,
            Some("max_tokens"),
            "invalid_value",
        ),
        (
            "/v1/completions",
            json!({"model": BASE, "prompt": long}).to_string(),
            400,
            Some("prompt"),
            "context_length_exceeded",
        ),
        (
            "/v1/completions",
            json!({"model": BASE, "prompt": "x", "max_tokens": 64}).to_string(),
            400,
            Some("max_tokens"),
            "context_length_exceeded",
        ),
        (
            "/v1/completions",
            json!({"model": BASE, "prompt": "x", "top_k": -5}).to_string(),
            400,
            Some("top_k"),
            "invalid_value",
        ),
        (
            "/v1/completions",
            json!({"model": BASE, "prompt": "x", "stop_token_ids": [99_999_999]}).to_string(),
            400,
            Some("stop_token_ids"),
            "invalid_value",
        ),
        (
            "/v1/completions",
            json!({"model": BASE, "prompt": "x", "response_format":
                   {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "foo"}}}})
            .to_string(),
            400,
            Some("response_format"),
            "invalid_value",
        ),
        (
            "/v1/completions",
            json!({"model": BASE, "prompt": "x", "use_beam_search": true, "stream": true}).to_string(),
            400,
            Some("stream"),
            "unsupported_value",
        ),
        (
            "/v1/completions",
            json!({"model": BASE, "prompt": [1, 99_999_999]}).to_string(),
            400,
            Some("prompt"),
            "invalid_value",
        ),
        (
            "/v1/completions",
            json!({"model": BASE, "prompt": ""}).to_string(),
            400,
            Some("prompt"),
            "invalid_value",
        ),
        (
            "/v1/chat/completions",
            json!({"model": BASE, "messages": "hi"}).to_string(),
            400,
            Some("messages"),
            "invalid_type",
        ),
        (
            "/v1/chat/completions",
            json!({"model": BASE, "messages": [{"role": "user"}]}).to_string(),
            400,
            Some("messages[0].content"),
            "invalid_type",
        ),
        (
            "/v1/completions",
            json!({"model": "nope", "prompt": "x"}).to_string(),
            404,
            Some("model"),
            "model_not_found",
        ),
    ];
    for (path, body, status, param, code) in &cases {
        let r = http::request(server.addr(), "POST", path, Some(body));
        assert_eq!(r.status, *status, "{body}: {}", r.body);
        let e = r.json();
        let err = e["error"].as_object().expect("an error object");
        let mut keys: Vec<&str> = err.keys().map(String::as_str).collect();
        keys.sort_unstable();
        assert_eq!(keys, ["code", "message", "param", "type"], "{body}");
        assert_eq!(
            (err["param"].as_str(), err["code"].as_str()),
            (*param, Some(*code)),
            "{body}"
        );
        assert!(!err["message"].as_str().unwrap().is_empty());
    }
    let text = get(server.addr(), "/metrics").body;
    assert_eq!(
        metric(&text, "kvsched:requests_refused_total", "invalid"),
        cases.len() as f64
    );
    assert_eq!(metric(&text, "vllm:num_requests_running", ""), 0.0);
}

#[test]
fn a_prompt_longer_than_the_step_budget_is_prefilled_in_chunks() {
    let Some(m) = model() else { return };
    let server = start(&m, &config());
    let prompt: Vec<u32> = m
        .tokenizer()
        .encode(&"The quick brown fox jumps over the lazy dog. ".repeat(120))
        .unwrap();
    assert!(prompt.len() > 1024, "{} tokens", prompt.len());
    let want = text_of(&m, &in_process(&m, &prompt, 4, None));
    let r = post(
        server.addr(),
        "/v1/completions",
        &completion(BASE, &json!(prompt), 4, false),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["choices"][0]["text"], want.as_str());
}
