//! `GET /metrics`: the Prometheus text format, named after vLLM's metrics where one exists (the
//! `vllm:` prefix, the `model_name` label, vLLM's histogram buckets), so a dashboard built for vLLM
//! reads a kvsched server; what vLLM has no metric for is `kvsched:`.

use std::fmt::Write as _;
use std::sync::Mutex;
use std::time::Duration;

use crate::worker::{End, Snapshot};

/// vLLM's buckets for the time to first token, seconds.
const TTFT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];
/// vLLM's buckets for inter-token latency and time per output token, seconds.
const ITL_BUCKETS: &[f64] = &[
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
];
/// vLLM's buckets for end-to-end request latency, seconds.
const E2E_BUCKETS: &[f64] = &[
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
];

/// A cumulative histogram.
#[derive(Debug, Clone)]
struct Histogram {
    bounds: &'static [f64],
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Self {
        Self {
            bounds,
            counts: vec![0; bounds.len()],
            sum: 0.0,
            count: 0,
        }
    }

    fn observe(&mut self, secs: f64) {
        for (c, &b) in self.counts.iter_mut().zip(self.bounds) {
            if secs <= b {
                *c += 1;
            }
        }
        self.sum += secs;
        self.count += 1;
    }

    fn render(&self, out: &mut String, name: &str, help: &str, labels: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        for (&b, &c) in self.bounds.iter().zip(&self.counts) {
            let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{b}\"}} {c}");
        }
        let n = self.count;
        let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {n}");
        let _ = writeln!(out, "{name}_sum{{{labels}}} {}", self.sum);
        let _ = writeln!(out, "{name}_count{{{labels}}} {n}");
    }
}

/// What the handlers measured.
#[derive(Debug, Clone)]
struct Requests {
    ttft: Histogram,
    itl: Histogram,
    tpot: Histogram,
    e2e: Histogram,
    prompt_tokens: u64,
    generation_tokens: u64,
    /// Finished requests by reason: stop, length, abort.
    ended: [u64; 3],
    /// Requests refused, by [`Refusal`].
    refused: [u64; 4],
}

/// Why a request was refused, for `kvsched:requests_refused_total`.
#[derive(Debug, Clone, Copy)]
pub enum Refusal {
    /// A 400 or 404 (or a 500 before the engine took it).
    Invalid,
    /// A 429.
    Overloaded,
    /// A 503.
    ShuttingDown,
    /// A 413.
    TooLarge,
}

impl Refusal {
    /// The reason a refusal of `status` is counted under.
    pub fn of(status: axum::http::StatusCode) -> Self {
        match status.as_u16() {
            429 => Self::Overloaded,
            503 => Self::ShuttingDown,
            413 => Self::TooLarge,
            _ => Self::Invalid,
        }
    }
}

/// The server's metrics.
#[derive(Debug)]
pub struct Metrics {
    model: String,
    requests: Mutex<Requests>,
}

impl Metrics {
    /// Metrics labelled with `model` (the served model's name).
    pub fn new(model: &str) -> Self {
        Self {
            model: model.replace(['"', '\\', '\n'], "_"),
            requests: Mutex::new(Requests {
                ttft: Histogram::new(TTFT_BUCKETS),
                itl: Histogram::new(ITL_BUCKETS),
                tpot: Histogram::new(ITL_BUCKETS),
                e2e: Histogram::new(E2E_BUCKETS),
                prompt_tokens: 0,
                generation_tokens: 0,
                ended: [0; 3],
                refused: [0; 4],
            }),
        }
    }

    fn with(&self, f: impl FnOnce(&mut Requests)) {
        if let Ok(mut r) = self.requests.lock() {
            f(&mut r);
        }
    }

    /// A request's first token, `ttft` after it arrived.
    pub fn first_token(&self, ttft: Duration) {
        self.with(|r| r.ttft.observe(ttft.as_secs_f64()));
    }

    /// A later token, `gap` after the one before.
    pub fn next_token(&self, gap: Duration) {
        self.with(|r| r.itl.observe(gap.as_secs_f64()));
    }

    /// A request ended: its tokens, its latency, its time per output token (after the first).
    pub fn ended(
        &self,
        end: End,
        prompt: usize,
        generated: usize,
        e2e: Duration,
        tpot: Option<Duration>,
    ) {
        self.with(|r| {
            r.prompt_tokens += prompt as u64;
            r.generation_tokens += generated as u64;
            r.ended[end as usize] += 1;
            r.e2e.observe(e2e.as_secs_f64());
            if let Some(t) = tpot {
                r.tpot.observe(t.as_secs_f64());
            }
        });
    }

    /// A request refused before it reached the engine.
    pub fn refused(&self, why: Refusal) {
        self.with(|r| r.refused[why as usize] += 1);
    }

    /// The Prometheus text: the handlers' measures, then the engine's `snapshot` and `queued` jobs.
    pub fn render(&self, snapshot: &Snapshot, queued: usize) -> String {
        let labels = format!("model_name=\"{}\"", self.model);
        let mut out = String::with_capacity(8192);
        let Ok(r) = self.requests.lock().map(|r| r.clone()) else {
            return out;
        };
        render_engine(&mut out, &labels, snapshot, queued);
        let counter = |out: &mut String, name: &str, help: &str, extra: &str, v: u64| {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name}{{{labels}{extra}}} {v}"
            );
        };
        counter(
            &mut out,
            "vllm:prompt_tokens_total",
            "Prompt tokens processed.",
            "",
            r.prompt_tokens,
        );
        counter(
            &mut out,
            "vllm:generation_tokens_total",
            "Generation tokens processed.",
            "",
            r.generation_tokens,
        );
        let _ = writeln!(out, "# HELP vllm:request_success_total Finished requests by finish reason.\n# TYPE vllm:request_success_total counter");
        for (reason, n) in ["stop", "length", "abort"].iter().zip(r.ended) {
            let _ = writeln!(
                out,
                "vllm:request_success_total{{{labels},finished_reason=\"{reason}\"}} {n}"
            );
        }
        let _ = writeln!(out, "# HELP kvsched:requests_refused_total Requests refused before the engine, by reason.\n# TYPE kvsched:requests_refused_total counter");
        for (reason, n) in ["invalid", "overloaded", "shutting_down", "too_large"]
            .iter()
            .zip(r.refused)
        {
            let _ = writeln!(
                out,
                "kvsched:requests_refused_total{{{labels},reason=\"{reason}\"}} {n}"
            );
        }
        r.ttft.render(
            &mut out,
            "vllm:time_to_first_token_seconds",
            "Time to first token, seconds.",
            &labels,
        );
        r.itl.render(
            &mut out,
            "vllm:inter_token_latency_seconds",
            "Time between two streamed tokens, seconds.",
            &labels,
        );
        r.tpot.render(
            &mut out,
            "vllm:request_time_per_output_token_seconds",
            "A request's mean time per output token after its first, seconds.",
            &labels,
        );
        r.e2e.render(
            &mut out,
            "vllm:e2e_request_latency_seconds",
            "End-to-end request latency, seconds.",
            &labels,
        );
        out
    }
}

/// The engine's gauges and counters.
fn render_engine(out: &mut String, labels: &str, s: &Snapshot, queued: usize) {
    let l = &s.load;
    let ratio = |used: u32, all: u32| {
        if all == 0 {
            0.0
        } else {
            f64::from(used) / f64::from(all)
        }
    };
    let gauges: [(&str, &str, f64); 4] = [
        (
            "vllm:num_requests_running",
            "Requests whose KV is on the GPU tier.",
            l.running as f64,
        ),
        (
            "vllm:num_requests_waiting",
            "Requests waiting: queued, or held without GPU pages.",
            (l.waiting + queued) as f64,
        ),
        (
            "vllm:kv_cache_usage_perc",
            "Fraction of GPU-tier KV pages held by requests (1 = full).",
            ratio(l.gpu_used, l.gpu_pages),
        ),
        (
            "vllm:cpu_cache_usage_perc",
            "Fraction of host-tier KV pages held by requests (1 = full).",
            ratio(l.host_used, l.host_pages),
        ),
    ];
    for (name, help, v) in gauges {
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} gauge\n{name}{{{labels}}} {v}"
        );
    }
    let _ = writeln!(
        out,
        "# HELP kvsched:kv_pages KV pages by tier and state.\n# TYPE kvsched:kv_pages gauge"
    );
    let free_gpu = l.gpu_pages.saturating_sub(l.gpu_used + l.gpu_cached);
    for (tier, state, v) in [
        ("gpu", "used", l.gpu_used),
        ("gpu", "cached", l.gpu_cached),
        ("gpu", "free", free_gpu),
        ("host", "used", l.host_used),
        ("host", "free", l.host_pages.saturating_sub(l.host_used)),
    ] {
        let _ = writeln!(
            out,
            "kvsched:kv_pages{{{labels},tier=\"{tier}\",state=\"{state}\"}} {v}"
        );
    }
    let st = &s.stats;
    let counters: [(&str, &str, u64); 11] = [
        ("vllm:prefix_cache_queries_total", "Prompt tokens looked up in the prefix cache.", s.prompt_tokens),
        ("vllm:prefix_cache_hits_total", "Prompt tokens found in the prefix cache.", st.prefix_reused_tokens),
        ("vllm:num_preemptions_total", "Requests whose KV was dropped and their prefill replayed (recompute pauses and preemptions).", st.recomputes),
        ("kvsched:suspensions_total", "Requests suspended (KV offloaded to the host tier or held).", st.suspensions),
        ("kvsched:kv_pages_offloaded_total", "KV pages copied GPU to host.", st.pages_offloaded),
        ("kvsched:kv_pages_reloaded_total", "KV pages copied host to GPU.", st.pages_reloaded),
        ("kvsched:adapter_loads_total", "LoRA adapters uploaded to device pages.", st.adapter_loads),
        ("kvsched:adapter_evictions_total", "LoRA adapters evicted from the device.", st.adapter_evictions),
        ("kvsched:requests_cancelled_total", "Requests cancelled in the engine (client gone, stop string).", st.cancelled),
        ("kvsched:engine_steps_total", "Engine iterations that ran the model.", st.model_steps),
        ("kvsched:scheduler_nanoseconds_total", "Time in the scheduler's calls, nanoseconds.", st.scheduler_ns),
    ];
    for (name, help, v) in counters {
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} counter\n{name}{{{labels}}} {v}"
        );
    }
}
