//! The server's own cost (not run in CI): the same requests, one client at a time, through HTTP
//! streaming and driven in process on an engine of the same configuration, interleaved (in process,
//! HTTP, in process, HTTP, ...) so that drift hits both alike.
//!
//! ```text
//! scripts/fetch-model.sh && cargo bench -p kvsched-server --bench overhead
//! ```
//!
//! - TTFT: in process, from `Engine::submit` to the step that yields the first token; through HTTP,
//!   from writing the request to reading the first chunk with text (parsing, tokenizing, the queue,
//!   the engine thread, detokenizing, SSE and loopback included).
//! - TPOT: (last token − first token) / (tokens − 1), per request; the figure is the median.
//!
//! - The server's own cost: the median of the paired differences (request i through HTTP minus
//!   request i in process: the same prompt, each engine's prefix cache in the same state).
//!
//! `KVSCHED_BENCH_REPS` (default 24) requests of each kind; candle on 1 thread.
//! `KVSCHED_BENCH_IDLE_MS` (default 0): a pause before each request, as between sparse arrivals.

#[path = "../tests/support/http.rs"]
mod http;
#[path = "../tests/support/serve.rs"]
mod serve;

use std::time::{Duration, Instant};

use kvsched_engine::{Engine, Sampler};
use serde_json::json;

/// Tokens each request generates (the stop token ignored).
const MAX_NEW: usize = 64;

const PROMPTS: [&str; 4] = [
    "Write a short story about a dragon who paints.",
    "Explain how a bicycle stays upright.",
    "What are the main causes of the seasons on Earth?",
    "Describe a walk through a forest in autumn.",
];

/// One request's latencies.
#[derive(Debug, Clone, Copy)]
struct Timing {
    ttft: Duration,
    tpot: Duration,
}

fn tpot(first: Instant, last: Instant, tokens: usize) -> Duration {
    (last - first) / u32::try_from(tokens.saturating_sub(1).max(1)).unwrap()
}

fn in_process(engine: &mut Engine<'_>, prompt: &[u32]) -> Timing {
    let start = Instant::now();
    let id = engine
        .submit(prompt, MAX_NEW, None, Sampler::greedy().ignoring_stop())
        .unwrap();
    let (mut first, mut last, mut seen) = (None, start, 0);
    loop {
        let done = engine.step().unwrap();
        let now = Instant::now();
        let n = done.iter().find(|c| c.id == id).map_or_else(
            || engine.tokens(id).map_or(0, <[u32]>::len),
            |c| c.tokens.len(),
        );
        if n > seen {
            first.get_or_insert(now);
            last = now;
            seen = n;
        }
        if !done.is_empty() {
            let first = first.unwrap();
            return Timing {
                ttft: first - start,
                tpot: tpot(first, last, seen),
            };
        }
    }
}

fn through_http(addr: std::net::SocketAddr, prompt: &[u32]) -> Timing {
    let body = json!({"model": serve::BASE, "prompt": prompt, "max_tokens": MAX_NEW,
                      "temperature": 0, "ignore_eos": true, "stream": true});
    let start = Instant::now();
    let mut events = http::Events::open(addr, "/v1/completions", &body);
    let (mut first, mut last, mut chunks) = (None, start, 0);
    while let Some(data) = events.next_data() {
        if data == "[DONE]" {
            break;
        }
        let v: serde_json::Value = serde_json::from_str(&data).unwrap();
        if v["choices"][0]["text"]
            .as_str()
            .is_some_and(|t| !t.is_empty())
        {
            let now = Instant::now();
            first.get_or_insert(now);
            last = now;
            chunks += 1;
        }
    }
    let first = first.expect("text was streamed");
    Timing {
        ttft: first - start,
        tpot: tpot(first, last, chunks),
    }
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() {
    let Some(model) = serve::model() else { return };
    let reps: usize = std::env::var("KVSCHED_BENCH_REPS")
        .ok()
        .map_or(24, |r| r.parse().expect("KVSCHED_BENCH_REPS is a number"));
    let cfg = serve::config();
    let server = serve::start(&model, &cfg);
    let mut engine = Engine::new(&model, cfg.engine).unwrap();
    // Chat prompts through the template, so that the first token is text (a raw prompt to this
    // instruct model often starts with its end-of-turn token, which has no text to stream); the
    // same token ids go to both paths.
    let prompts: Vec<Vec<u32>> = PROMPTS
        .iter()
        .map(|p| {
            let chat = [kvsched_engine::Message::user(*p)];
            model.tokenizer().encode_chat(&chat, true).unwrap()
        })
        .collect();
    // One of each first, not measured: caches, the allocator, the connection path.
    in_process(&mut engine, &prompts[0]);
    through_http(server.addr(), &prompts[0]);
    let idle = Duration::from_millis(
        std::env::var("KVSCHED_BENCH_IDLE_MS")
            .ok()
            .map_or(0, |v| v.parse().expect("KVSCHED_BENCH_IDLE_MS is a number")),
    );
    let (mut local, mut remote) = (Vec::new(), Vec::new());
    for i in 0..reps {
        let p = &prompts[i % prompts.len()];
        std::thread::sleep(idle);
        local.push(in_process(&mut engine, p));
        std::thread::sleep(idle);
        remote.push(through_http(server.addr(), p));
    }
    let ttft = |v: &[Timing]| median(v.iter().map(|t| t.ttft).collect());
    let tpot = |v: &[Timing]| median(v.iter().map(|t| t.tpot).collect());
    let paired = |f: fn(&Timing) -> f64| {
        let mut d: Vec<f64> = local
            .iter()
            .zip(&remote)
            .map(|(l, r)| f(r) - f(l))
            .collect();
        d.sort_by(f64::total_cmp);
        d[d.len() / 2]
    };
    let ttft_added = paired(|t| ms(t.ttft));
    let tpot_added = paired(|t| ms(t.tpot));
    println!("| path | TTFT ms (median) | TPOT ms (median) |");
    println!("|---|---|---|");
    println!(
        "| engine in process | {:.2} | {:.2} |",
        ms(ttft(&local)),
        ms(tpot(&local))
    );
    println!(
        "| HTTP streaming | {:.2} | {:.2} |",
        ms(ttft(&remote)),
        ms(tpot(&remote))
    );
    println!(
        "server adds {ttft_added:.2} ms to TTFT and {:+.1} % to TPOT (medians of the paired differences; {reps} requests of {MAX_NEW} tokens each way, one client)",
        tpot_added / ms(tpot(&local)) * 100.0
    );
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}
