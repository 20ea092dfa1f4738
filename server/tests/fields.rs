//! The request fields that touch sampling and the response fields that report it (issue 43), over
//! loopback HTTP on the test model: structured output (a regex, a choice, a JSON schema, any JSON
//! object), log probabilities in each endpoint's shape, a cache salt that keys the prefix cache and
//! the hit reported as `cached_tokens`, stop token ids with their `stop_reason`, the usage on every
//! chunk, and an unknown field ignored by name.

#[path = "support/http.rs"]
mod http;
#[path = "support/serve.rs"]
mod serve;

use serde_json::{json, Value};

use http::{post, Events};
use serve::{config, model, start, BASE};

fn chat(extra: &Value) -> Value {
    let mut body = json!({"model": BASE, "max_tokens": 40, "temperature": 0,
        "messages": [{"role": "user", "content": "Give me a phone number and a person."}]});
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

fn content(v: &Value) -> String {
    v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string()
}

#[test]
fn structured_output_holds_the_text_to_its_grammar() {
    let Some(m) = model() else { return };
    let server = start(&m, &config());
    let addr = server.addr();
    let r = post(
        addr,
        "/v1/chat/completions",
        &chat(&json!({"guided_regex": "[0-9]{3}-[0-9]{4}"})),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let text = content(&r.json());
    let b = text.as_bytes();
    assert!(
        b.len() == 8 && b[3] == b'-' && text.replace('-', "").bytes().all(|c| c.is_ascii_digit()),
        "{text:?}"
    );
    assert_eq!(r.json()["choices"][0]["finish_reason"], "stop");
    let r = post(
        addr,
        "/v1/chat/completions",
        &chat(&json!({"guided_choice": ["yes", "no", "maybe"]})),
    );
    assert!(
        ["yes", "no", "maybe"].contains(&content(&r.json()).as_str()),
        "{}",
        r.body
    );
    let schema = json!({"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer"}}, "required": ["name", "age"], "additionalProperties": false});
    let format =
        json!({"type": "json_schema", "json_schema": {"name": "person", "schema": schema}});
    let r = post(
        addr,
        "/v1/chat/completions",
        &chat(&json!({"response_format": format, "max_tokens": 60})),
    );
    let person: Value = serde_json::from_str(&content(&r.json())).expect("the text is JSON");
    let keys: Vec<&String> = person.as_object().expect("an object").keys().collect();
    assert_eq!(keys, ["name", "age"], "{person}");
    assert!(
        person["name"].is_string() && person["age"].is_i64(),
        "{person}"
    );
    let any = json!({"response_format": {"type": "json_object"}, "max_tokens": 60});
    let r = post(addr, "/v1/chat/completions", &chat(&any));
    let v: Value = serde_json::from_str(&content(&r.json())).expect("the text is JSON");
    assert!(v.is_object(), "{v}");
}

#[test]
fn logprobs_come_in_each_endpoints_shape() {
    let Some(m) = model() else { return };
    let server = start(&m, &config());
    let addr = server.addr();
    let r = post(
        addr,
        "/v1/completions",
        &json!({"model": BASE, "prompt": "The capital of France is",
        "max_tokens": 5, "temperature": 0, "logprobs": 2}),
    )
    .json();
    let lp = &r["choices"][0]["logprobs"];
    let tokens = lp["tokens"].as_array().unwrap();
    assert_eq!(tokens.len(), 5, "{lp}");
    let joined: String = tokens.iter().map(|t| t.as_str().unwrap()).collect();
    assert_eq!(joined, r["choices"][0]["text"].as_str().unwrap());
    assert_eq!(lp["text_offset"][0], 0);
    for (i, top) in lp["top_logprobs"].as_array().unwrap().iter().enumerate() {
        let top = top.as_object().unwrap();
        assert!(top.len() <= 2 && !top.is_empty(), "{top:?}");
        let best = top
            .values()
            .map(|v| v.as_f64().unwrap())
            .fold(f64::MIN, f64::max);
        assert_eq!(
            lp["token_logprobs"][i].as_f64().unwrap(),
            best,
            "greedy draws the likeliest"
        );
    }
    let r = post(
        addr,
        "/v1/chat/completions",
        &chat(&json!({"logprobs": true, "top_logprobs": 3,
        "max_tokens": 4})),
    )
    .json();
    let content = r["choices"][0]["logprobs"]["content"].as_array().unwrap();
    assert_eq!(content.len(), 4);
    for c in content {
        assert!(c["logprob"].as_f64().unwrap() <= 0.0);
        assert_eq!(c["top_logprobs"].as_array().unwrap().len(), 3);
        assert_eq!(
            c["bytes"].as_array().unwrap().len(),
            c["token"].as_str().unwrap().len()
        );
    }
}

#[test]
fn a_cache_salt_keys_the_prefix_cache_and_the_hit_is_reported() {
    let Some(m) = model() else { return };
    let server = start(&m, &config());
    let addr = server.addr();
    let long = "Here is a long shared preamble about many things. ".repeat(8);
    let ask = |salt: Option<&str>| {
        let mut body = json!({"model": BASE, "prompt": long, "max_tokens": 2, "temperature": 0});
        if let Some(s) = salt {
            body["cache_salt"] = json!(s);
        }
        let r = post(addr, "/v1/completions", &body).json();
        r["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap()
    };
    assert_eq!(ask(None), 0);
    assert!(ask(None) >= 16, "the same prompt again hits");
    assert_eq!(ask(Some("tenant-a")), 0, "another salt does not");
    assert!(ask(Some("tenant-a")) >= 16);
}

#[test]
fn stop_token_ids_stop_and_usage_can_come_on_every_chunk() {
    let Some(m) = model() else { return };
    let server = start(&m, &config());
    let addr = server.addr();
    let body = json!({"model": BASE, "prompt": "1, 2, 3, 4,", "max_tokens": 8, "temperature": 0,
        "ignore_eos": true, "logprobs": 0});
    let free = post(addr, "/v1/completions", &body).json();
    let third = free["choices"][0]["logprobs"]["tokens"][2]
        .as_str()
        .unwrap()
        .to_string();
    let id = m.tokenizer().encode_text(&third).unwrap()[0];
    let mut stopped = body.clone();
    stopped["stop_token_ids"] = json!([id]);
    let r = post(addr, "/v1/completions", &stopped).json();
    assert_eq!(r["choices"][0]["finish_reason"], "stop", "{r}");
    assert_eq!(r["choices"][0]["stop_reason"], id, "{r}");
    let mut streamed = body;
    streamed["stream"] = json!(true);
    streamed["stream_options"] = json!({"include_usage": true, "continuous_usage_stats": true});
    streamed["unheard_of"] = json!(1);
    let events = Events::open(addr, "/v1/completions", &streamed);
    assert_eq!(events.status, 200);
    let ignored = events
        .headers
        .iter()
        .find(|(n, _)| n == "x-kvsched-ignored-fields");
    assert_eq!(ignored.map(|(_, v)| v.as_str()), Some("unheard_of"));
    let all = events.all();
    let mut last = 0;
    for e in &all {
        let n = e["usage"]["completion_tokens"]
            .as_u64()
            .expect("usage on every chunk");
        assert!(n >= last, "{e}");
        last = n;
    }
    assert_eq!(last, 8);
}
