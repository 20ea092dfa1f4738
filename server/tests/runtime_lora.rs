//! Adapters loaded and unloaded while the server runs (`--allow-runtime-lora`; issue 43): a loaded
//! adapter is listed and serves its own tokens; an unload with a request on it is refused (409),
//! never pulled from under it; an unloaded adapter is a 404; more adapters than the engine's slots
//! come and go over the server's life; without the flag the endpoints are not there.

#[path = "support/http.rs"]
mod http;
#[path = "support/serve.rs"]
mod serve;

use serde_json::{json, Value};

use http::{get, post, Events};
use serve::{config, model, start, BASE};

fn completion(model: &str) -> Value {
    json!({"model": model, "prompt": "The three primary colours are", "max_tokens": 8,
           "temperature": 0})
}

fn text(r: &http::Response) -> String {
    r.json()["choices"][0]["text"].as_str().unwrap().to_string()
}

#[test]
fn adapters_come_and_go_while_the_server_runs() {
    let Some(m) = model() else { return };
    let mut cfg = config();
    cfg.runtime_lora = true;
    let server = start(&m, &cfg);
    let addr = server.addr();
    let base = text(&post(addr, "/v1/completions", &completion(BASE)));
    for i in 0..kvsched_engine::MAX_ADAPTERS + 2 {
        let (lora, dir) = serve::peft_adapter(&m, 40 + i as u64);
        let name = format!("tuned-{i}");
        let body = json!({"lora_name": name, "lora_path": dir});
        let r = post(addr, "/v1/load_lora_adapter", &body);
        assert_eq!(r.status, 200, "{}", r.body);
        assert_eq!(
            post(addr, "/v1/load_lora_adapter", &body).status,
            400,
            "loaded twice"
        );
        let ids: Vec<String> = get(addr, "/v1/models").json()["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d["id"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(ids, [BASE.to_string(), name.clone()]);
        let tuned = text(&post(addr, "/v1/completions", &completion(&name)));
        let prompt = m
            .tokenizer()
            .encode("The three primary colours are")
            .unwrap();
        let want = serve::text_of(&m, &serve::in_process(&m, &prompt, 8, Some(&lora)));
        assert_eq!(
            tuned, want,
            "adapter {i}: its own weights, not its slot's last"
        );
        assert_ne!(tuned, base, "adapter {i} changes the text");
        // A request on it: the unload waits for nobody, it is refused.
        let mut long = completion(&name);
        long["max_tokens"] = json!(1000);
        long["ignore_eos"] = json!(true);
        long["stream"] = json!(true);
        let mut running = Events::open(addr, "/v1/completions", &long);
        running.next_data().expect("the request runs");
        let unload = json!({"lora_name": name});
        let r = post(addr, "/v1/unload_lora_adapter", &unload);
        assert_eq!(r.status, 409, "{}", r.body);
        assert_eq!(r.json()["error"]["code"], "adapter_busy");
        drop(running);
        let mut status = 409;
        for _ in 0..200 {
            status = post(addr, "/v1/unload_lora_adapter", &unload).status;
            if status != 409 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(25));
        }
        assert_eq!(status, 200, "unloaded once the request ended");
        assert_eq!(
            post(addr, "/v1/completions", &completion(&name)).status,
            404
        );
    }
    assert_eq!(
        base,
        text(&post(addr, "/v1/completions", &completion(BASE)))
    );
}

#[test]
fn without_the_flag_there_is_no_runtime_loading() {
    let Some(m) = model() else { return };
    let server = start(&m, &config());
    let r = post(
        server.addr(),
        "/v1/load_lora_adapter",
        &json!({"lora_name": "x", "lora_path": "/tmp"}),
    );
    assert_eq!(r.status, 404);
}
