//! Several choices per request (issue 44): `n` samples of one prompt, forked in the engine so the
//! prompt is computed once; `best_of` returning the samples with the highest cumulative log
//! probability; vLLM's beam search (`use_beam_search`, `n` beams) returning the engine's beams; and
//! the refusals: more samples than the engine runs at once, what beam search does not take.

#[path = "support/http.rs"]
mod http;
#[path = "support/serve.rs"]
mod serve;

use serde_json::{json, Value};

use http::{get, metric, post};
use serve::{config, model, start, BASE};

const PROMPT: &str = "Once upon a time, in a small village by the sea,";

fn completion(extra: &Value) -> Value {
    let mut body = json!({"model": BASE, "prompt": PROMPT, "max_tokens": 12, "temperature": 0.9});
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

/// Sample `seed` alone: its text, its tokens' cumulative log probability, its tokens.
fn alone(addr: std::net::SocketAddr, seed: u64) -> (String, f64, u64) {
    let r = post(
        addr,
        "/v1/completions",
        &completion(&json!({"seed": seed, "logprobs": 0})),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let c = &r.json()["choices"][0];
    let lps = c["logprobs"]["token_logprobs"].as_array().unwrap();
    let score = lps.iter().map(|l| l.as_f64().unwrap()).sum();
    let tokens = r.json()["usage"]["completion_tokens"].as_u64().unwrap();
    (c["text"].as_str().unwrap().to_string(), score, tokens)
}

#[test]
fn best_of_returns_the_likeliest_samples_and_n_counts_the_prompt_once() {
    let Some(m) = model() else { return };
    let server = start(&m, &config());
    let addr = server.addr();
    let singles: Vec<(String, f64, u64)> = (0..4).map(|i| alone(addr, 40 + i)).collect();
    let r = post(
        addr,
        "/v1/completions",
        &completion(&json!({"seed": 40, "n": 2, "best_of": 4})),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let body = r.json();
    let choices = body["choices"].as_array().unwrap();
    let mut ranked = singles.clone();
    ranked.sort_by(|a, b| b.1.total_cmp(&a.1));
    for (i, c) in choices.iter().enumerate() {
        assert_eq!(c["index"], i);
        assert_eq!(
            c["text"].as_str().unwrap(),
            ranked[i].0,
            "choice {i}: the {i}th likeliest"
        );
        assert!(c["logprobs"].is_null(), "not asked for");
    }
    assert_eq!(choices.len(), 2);
    let one = post(addr, "/v1/completions", &completion(&json!({"seed": 40})));
    let usage = &body["usage"];
    assert_eq!(usage["prompt_tokens"], one.json()["usage"]["prompt_tokens"]);
    let generated: u64 = ranked[..2].iter().map(|s| s.2).sum();
    assert_eq!(
        usage["completion_tokens"], generated,
        "the returned choices' tokens"
    );
    // Each sample is a request of the engine's, as vLLM counts its children: 4 alone, 4, 1.
    let text = get(addr, "/metrics").body;
    let ended = |r: &str| metric(&text, "vllm:request_success_total", &format!("\"{r}\""));
    assert_eq!(ended("stop") + ended("length"), 9.0);
}

#[test]
fn samples_beyond_the_engine_and_beam_search_are_refused() {
    let Some(m) = model() else { return };
    let mut cfg = config();
    cfg.engine.scheduler.max_num_requests = 4;
    let server = start(&m, &cfg);
    let addr = server.addr();
    for (extra, param) in [
        (json!({"n": 5}), "n"),
        (json!({"n": 2, "best_of": 5}), "best_of"),
        (json!({"use_beam_search": true, "n": 5}), "n"),
        (json!({"use_beam_search": true, "stream": true}), "stream"),
        (json!({"use_beam_search": true, "logprobs": 1}), "logprobs"),
        (json!({"length_penalty": 0.5}), "length_penalty"),
        (json!({"n": 1, "best_of": 2, "stream": true}), "best_of"),
    ] {
        let r = post(addr, "/v1/completions", &completion(&extra));
        assert_eq!(r.status, 400, "{extra}: {}", r.body);
        assert_eq!(r.json()["error"]["param"], param, "{extra}");
    }
    let r = post(
        addr,
        "/v1/completions",
        &completion(&json!({"n": 4, "seed": 1})),
    );
    assert_eq!(
        r.status, 200,
        "as many samples as the engine runs: {}",
        r.body
    );
    assert_eq!(r.json()["choices"].as_array().unwrap().len(), 4);
}

#[test]
fn beam_search_returns_the_engines_beams() {
    use kvsched_engine::{BeamSearch, Engine};
    let Some(m) = model() else { return };
    let server = start(&m, &config());
    let body = json!({"model": BASE, "prompt": PROMPT, "max_tokens": 8, "n": 3,
                      "use_beam_search": true, "length_penalty": 0.8});
    let r = post(server.addr(), "/v1/completions", &body);
    assert_eq!(r.status, 200, "{}", r.body);
    let got = r.json();
    let mut engine = Engine::new(&m, config().engine).unwrap();
    let prompt = m.tokenizer().encode(PROMPT).unwrap();
    let params = BeamSearch {
        width: 3,
        length_penalty: 0.8,
        ignore_eos: false,
        priority: 0,
        class: 0,
    };
    let id = engine
        .submit_beam_search(&prompt, 8, None, params, 0)
        .unwrap();
    let mut results = Vec::new();
    while results.is_empty() {
        engine.step().unwrap();
        results = engine.take_beam_results();
    }
    assert_eq!(results[0].id, id);
    let want: Vec<String> = results[0]
        .sequences
        .iter()
        .map(|s| m.tokenizer().decode(&s.tokens).unwrap())
        .collect();
    let texts: Vec<&str> = got["choices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["text"].as_str().unwrap())
        .collect();
    assert_eq!(texts, want, "the beams, best first");
    assert!(engine.stats().forks > 0);
    let tokens: usize = results[0].sequences.iter().map(|s| s.tokens.len()).sum();
    assert_eq!(got["usage"]["completion_tokens"], tokens);
    assert_eq!(got["usage"]["prompt_tokens"], prompt.len());
}
