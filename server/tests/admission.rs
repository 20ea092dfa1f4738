//! Admission matches capacity (issue 43): a request is refused (429, with `Retry-After`) only when
//! every engine slot and every queue place is taken, whether or not the engine is between steps.
//! Before, the queue was drained only between engine steps: 90 simultaneous requests on 32 + 64
//! places got 25 refusals, `--max-queue 0` refused requests while the engine held 2 of 32, and
//! 2 slots + 2 queue places took 3 of 10.

#[path = "support/http.rs"]
mod http;
#[path = "support/serve.rs"]
mod serve;

use std::time::Duration;

use serde_json::{json, Value};

use http::{get, metric, post, Events};
use serve::{config, model, start, BASE};

/// A request that runs for long (1,500 tokens, its stop token ignored), streamed.
fn long() -> Value {
    json!({"model": BASE, "prompt": "A long story:", "max_tokens": 1500, "temperature": 0,
           "ignore_eos": true, "stream": true})
}

/// Opens `n` long streams from `n` threads at once; returns them (each with its status).
fn at_once(addr: std::net::SocketAddr, n: usize) -> Vec<Events> {
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(n));
    let threads: Vec<_> = (0..n)
        .map(|_| {
            let b = std::sync::Arc::clone(&barrier);
            std::thread::spawn(move || {
                b.wait();
                Events::open(addr, "/v1/completions", &long())
            })
        })
        .collect();
    threads.into_iter().map(|t| t.join().unwrap()).collect()
}

fn statuses(streams: &[Events]) -> Vec<u16> {
    let mut s: Vec<u16> = streams.iter().map(|e| e.status).collect();
    s.sort_unstable();
    s
}

#[test]
fn four_times_the_slots_at_once_are_all_taken_and_one_more_gets_429_with_retry_after() {
    let Some(m) = model() else { return };
    let mut cfg = config();
    cfg.engine.scheduler.max_num_requests = 4;
    cfg.max_queue = 12;
    let server = start(&m, &cfg);
    let addr = server.addr();
    let streams = at_once(addr, 16);
    assert_eq!(statuses(&streams), [200; 16], "no refusal below capacity");
    let r = post(addr, "/v1/completions", &long());
    assert_eq!(r.status, 429, "{}", r.body);
    assert_eq!(r.header("retry-after"), Some("1"));
    assert_eq!(r.json()["error"]["code"], "queue_full");
    let text = get(addr, "/metrics").body;
    assert_eq!(
        metric(&text, "kvsched:requests_refused_total", "overloaded"),
        1.0
    );
    drop(streams);
    // The places come back as the cancelled requests leave; then a request is taken again.
    let mut status = 429;
    for _ in 0..200 {
        status = post(
            addr,
            "/v1/completions",
            &json!({"model": BASE, "prompt": "Hi", "max_tokens": 1}),
        )
        .status;
        if status == 200 {
            break;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    assert_eq!(status, 200);
}

#[test]
fn two_slots_and_two_queue_places_take_four_of_ten() {
    let Some(m) = model() else { return };
    let mut cfg = config();
    cfg.engine.scheduler.max_num_requests = 2;
    cfg.max_queue = 2;
    let server = start(&m, &cfg);
    let streams = at_once(server.addr(), 10);
    assert_eq!(
        statuses(&streams),
        [200, 200, 200, 200, 429, 429, 429, 429, 429, 429]
    );
    for s in streams.iter().filter(|s| s.status == 429) {
        assert!(s
            .headers
            .iter()
            .any(|(n, v)| n == "retry-after" && v == "1"));
    }
}

#[test]
fn with_no_queue_every_free_slot_takes_a_request() {
    let Some(m) = model() else { return };
    let mut cfg = config();
    cfg.engine.scheduler.max_num_requests = 8;
    cfg.max_queue = 0;
    let server = start(&m, &cfg);
    let addr = server.addr();
    let mut streams = Vec::new();
    for _ in 0..8 {
        streams.push(Events::open(addr, "/v1/completions", &long()));
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(statuses(&streams), [200; 8]);
    assert_eq!(post(addr, "/v1/completions", &long()).status, 429);
}

/// `--max-num-seqs` was capped at 32 (issue 43): the engine's table is chosen at start-up now, up
/// to 256. Forty requests run at once, none waiting.
#[test]
fn more_than_32_requests_run_at_once() {
    let Some(m) = model() else { return };
    let mut cfg = config();
    cfg.engine.scheduler.max_num_requests = 40;
    cfg.max_queue = 0;
    let server = start(&m, &cfg);
    let addr = server.addr();
    let mut streams = at_once(addr, 40);
    assert_eq!(statuses(&streams), [200; 40]);
    for s in &mut streams {
        let first = s.next_data().expect("every request streams");
        assert!(first.contains("\"choices\""), "{first}");
    }
    let text = get(addr, "/metrics").body;
    assert_eq!(
        metric(&text, "vllm:num_requests_running", ""),
        40.0,
        "{text}"
    );
    assert_eq!(post(addr, "/v1/completions", &long()).status, 429);
}
