//! One big request does not stall the streams (issue 43): a prompt is parsed, tokenized and checked
//! off the thread that writes every stream, and a text too long for the model is refused by its
//! length before the tokenizer sees it. Before, four ~2 MB prompts (each refused anyway) raised a
//! running stream's worst token gap from 26 ms to 1,011 ms. Its own test binary: no other test's
//! engine shares the cores while it measures.

#[path = "support/http.rs"]
mod http;
#[path = "support/serve.rs"]
mod serve;

use std::time::{Duration, Instant};

use serde_json::json;

use http::{post, Events};
use serve::{config, model, start, BASE};

/// The most a running stream's worst gap between two events may reach while the big requests
/// are refused (a step of the test model on this machine takes a few tens of milliseconds).
const WORST_GAP: Duration = Duration::from_millis(300);

#[test]
fn four_two_megabyte_prompts_do_not_stall_a_running_stream() {
    let Some(m) = model() else { return };
    let server = start(&m, &config());
    let addr = server.addr();
    let body = json!({"model": BASE, "prompt": "A long story:", "max_tokens": 400, "temperature": 0,
                      "ignore_eos": true, "stream": true});
    let mut stream = Events::open(addr, "/v1/completions", &body);
    assert_eq!(stream.status, 200);
    stream.next_data().expect("the stream runs");
    let big = std::thread::spawn(move || {
        let prompt = "lorem ipsum ".repeat(165_000); // 1.98 MB
        (0..4)
            .map(|_| {
                let started = Instant::now();
                let r = post(
                    addr,
                    "/v1/completions",
                    &json!({"model": BASE, "prompt": prompt}),
                );
                (
                    r.status,
                    r.json()["error"]["code"].clone(),
                    started.elapsed(),
                )
            })
            .collect::<Vec<_>>()
    });
    let mut worst = Duration::ZERO;
    let mut last = Instant::now();
    while !big.is_finished() {
        let data = stream
            .next_data()
            .expect("the stream outlives the big requests");
        assert_ne!(
            data, "[DONE]",
            "the stream ended before the big requests did"
        );
        worst = worst.max(last.elapsed());
        last = Instant::now();
    }
    for (status, code, took) in big.join().unwrap() {
        assert_eq!(
            (status, code.as_str()),
            (400, Some("context_length_exceeded"))
        );
        assert!(took < Duration::from_secs(2), "a refusal took {took:?}");
    }
    assert!(
        worst < WORST_GAP,
        "the stream's worst gap was {worst:?} while the big requests were refused"
    );
}
