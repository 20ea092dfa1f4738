//! `GET /metrics`: the Prometheus text format, named after vLLM's metrics where one exists (the
//! `vllm:` prefix, the `model_name` label, vLLM's histogram buckets), so a dashboard built for vLLM
//! reads a kvsched server; what vLLM has no metric for is `kvsched:`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;
use std::time::{Duration, Instant};

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

/// vLLM's buckets for the request phases (queue, prefill, decode, inference), seconds.
const PHASE_BUCKETS: &[f64] = &[
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
];

/// vLLM's token-count buckets: 1, 2, 5, 10, 20, 50, … up to `max`.
fn token_buckets(max: usize) -> Vec<f64> {
    let mut out = Vec::new();
    let mut scale = 1usize;
    'outer: loop {
        for m in [1, 2, 5] {
            let b = m * scale;
            if b > max.max(1) {
                break 'outer;
            }
            out.push(b as f64);
        }
        scale = scale.saturating_mul(10);
    }
    out
}

/// A cumulative histogram.
#[derive(Debug, Clone)]
struct Histogram {
    bounds: Vec<f64>,
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    fn new(bounds: &[f64]) -> Self {
        Self {
            bounds: bounds.to_vec(),
            counts: vec![0; bounds.len()],
            sum: 0.0,
            count: 0,
        }
    }

    fn observe(&mut self, x: f64) {
        for (c, &b) in self.counts.iter_mut().zip(&self.bounds) {
            if x <= b {
                *c += 1;
            }
        }
        self.sum += x;
        self.count += 1;
    }

    fn render(&self, out: &mut String, name: &str, help: &str, labels: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        self.render_series(out, name, labels);
    }

    /// Its series, without the family's header.
    fn render_series(&self, out: &mut String, name: &str, labels: &str) {
        for (&b, &c) in self.bounds.iter().zip(&self.counts) {
            let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{b}\"}} {c}");
        }
        let n = self.count;
        let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {n}");
        let _ = writeln!(out, "{name}_sum{{{labels}}} {}", self.sum);
        let _ = writeln!(out, "{name}_count{{{labels}}} {n}");
    }
}

/// The histograms, in the order they are written: name, help.
const HISTOGRAMS: [(&str, &str); 11] = [
    (
        "vllm:time_to_first_token_seconds",
        "Time to first token, seconds.",
    ),
    (
        "vllm:inter_token_latency_seconds",
        "Time between two streamed tokens, seconds.",
    ),
    (
        "vllm:request_time_per_output_token_seconds",
        "A request's mean time per output token after its first, seconds.",
    ),
    (
        "vllm:e2e_request_latency_seconds",
        "End-to-end request latency, seconds.",
    ),
    (
        "vllm:request_queue_time_seconds",
        "Time from arrival to the request's first scheduled step, seconds.",
    ),
    (
        "vllm:request_prefill_time_seconds",
        "Time from the first scheduled step to the first token, seconds.",
    ),
    (
        "vllm:request_decode_time_seconds",
        "Time from the first token to the last, seconds.",
    ),
    (
        "vllm:request_inference_time_seconds",
        "Time from the first scheduled step to the end, seconds.",
    ),
    (
        "vllm:request_prompt_tokens",
        "Prompt tokens of each finished request.",
    ),
    (
        "vllm:request_generation_tokens",
        "Generated tokens of each finished request.",
    ),
    (
        "vllm:request_params_max_tokens",
        "The max_tokens of each finished request.",
    ),
];

/// Indexes into [`HISTOGRAMS`].
const TTFT: usize = 0;
const ITL: usize = 1;
const TPOT: usize = 2;
const E2E: usize = 3;
const QUEUE: usize = 4;
const PREFILL: usize = 5;
const DECODE: usize = 6;
const INFERENCE: usize = 7;
const PROMPT: usize = 8;
const GENERATION: usize = 9;
const MAX_TOKENS: usize = 10;

/// The class a request's latencies are also counted under: its service class (`service_class`)
/// and its priority (vLLM's `priority`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct Class {
    /// Its service class, 0 to 3.
    pub service: u8,
    /// Its priority, -128 to 127.
    pub priority: i8,
}

/// The latency histograms counted per [`Class`], in the order they are written: name, help.
const BY_CLASS: [(&str, &str); 3] = [
    (
        "kvsched:class_time_to_first_token_seconds",
        "Time to first token by service class and priority, seconds.",
    ),
    (
        "kvsched:class_inter_token_latency_seconds",
        "Time between two streamed tokens by service class and priority, seconds.",
    ),
    (
        "kvsched:class_e2e_request_latency_seconds",
        "End-to-end request latency by service class and priority, seconds.",
    ),
];

/// A class's TTFT, ITL and end-to-end histograms ([`BY_CLASS`]).
fn class_histograms() -> [Histogram; 3] {
    [
        Histogram::new(TTFT_BUCKETS),
        Histogram::new(ITL_BUCKETS),
        Histogram::new(E2E_BUCKETS),
    ]
}

/// What the handlers measured.
#[derive(Debug, Clone)]
struct Requests {
    histograms: Vec<Histogram>,
    /// TTFT, ITL and end-to-end latency per class seen.
    by_class: BTreeMap<Class, [Histogram; 3]>,
    prompt_tokens: u64,
    generation_tokens: u64,
    /// Finished requests by reason: stop, length, abort.
    ended: [u64; 3],
    /// Requests refused, by [`Refusal`].
    refused: [u64; 4],
}

/// A request's life, as its handler saw it, once it ended.
#[derive(Debug, Clone, Copy)]
pub struct Finished {
    /// Why it ended.
    pub end: End,
    /// Prompt tokens.
    pub prompt: usize,
    /// Tokens generated.
    pub generated: usize,
    /// Tokens it could have generated at most.
    pub max_tokens: usize,
    /// When it arrived.
    pub arrived: Instant,
    /// The start of the engine step that first ran it, if one did.
    pub scheduled: Option<Instant>,
    /// Its first and last tokens, if it had any.
    pub first: Option<Instant>,
    /// Its last token.
    pub last: Option<Instant>,
    /// When it ended.
    pub ended: Instant,
    /// Its class.
    pub class: Class,
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
    /// Metrics labelled with `model` (the served model's name), token histograms up to
    /// `max_model_len`.
    pub fn new(model: &str, max_model_len: usize) -> Self {
        let tokens = token_buckets(max_model_len);
        let histograms = (0..HISTOGRAMS.len())
            .map(|i| match i {
                TTFT => Histogram::new(TTFT_BUCKETS),
                ITL | TPOT => Histogram::new(ITL_BUCKETS),
                E2E => Histogram::new(E2E_BUCKETS),
                PROMPT | GENERATION | MAX_TOKENS => Histogram::new(&tokens),
                _ => Histogram::new(PHASE_BUCKETS),
            })
            .collect();
        Self {
            model: model.replace(['"', '\\', '\n'], "_"),
            requests: Mutex::new(Requests {
                histograms,
                by_class: BTreeMap::new(),
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
    pub fn first_token(&self, ttft: Duration, class: Class) {
        self.with(|r| {
            r.histograms[TTFT].observe(ttft.as_secs_f64());
            r.class(class)[0].observe(ttft.as_secs_f64());
        });
    }

    /// A later token, `gap` after the one before.
    pub fn next_token(&self, gap: Duration, class: Class) {
        self.with(|r| {
            r.histograms[ITL].observe(gap.as_secs_f64());
            r.class(class)[1].observe(gap.as_secs_f64());
        });
    }

    /// A request ended: its tokens and the phases of its life.
    pub fn ended(&self, f: &Finished) {
        let secs = |a: Instant, b: Instant| b.saturating_duration_since(a).as_secs_f64();
        self.with(|r| {
            r.prompt_tokens += f.prompt as u64;
            r.generation_tokens += f.generated as u64;
            r.ended[f.end as usize] += 1;
            r.class(f.class)[2].observe(secs(f.arrived, f.ended));
            let h = &mut r.histograms;
            h[E2E].observe(secs(f.arrived, f.ended));
            h[PROMPT].observe(f.prompt as f64);
            h[GENERATION].observe(f.generated as f64);
            h[MAX_TOKENS].observe(f.max_tokens as f64);
            if let (Some(first), Some(last)) = (f.first, f.last) {
                if f.generated > 1 {
                    h[TPOT].observe(secs(first, last) / (f.generated - 1) as f64);
                }
                h[DECODE].observe(secs(first, last));
            }
            if let Some(scheduled) = f.scheduled {
                h[QUEUE].observe(secs(f.arrived, scheduled));
                h[INFERENCE].observe(secs(scheduled, f.ended));
                if let Some(first) = f.first {
                    h[PREFILL].observe(secs(scheduled, first));
                }
            }
        });
    }

    /// A request refused before it reached the engine.
    pub fn refused(&self, why: Refusal) {
        self.with(|r| r.refused[why as usize] += 1);
    }

    /// The Prometheus text: the engine's `snapshot` and `queued` jobs, then the handlers' measures.
    pub fn render(&self, snapshot: &Snapshot, queued: usize) -> String {
        let labels = format!("model_name=\"{}\"", self.model);
        let mut out = String::with_capacity(16384);
        let Ok(r) = self.requests.lock().map(|r| r.clone()) else {
            return out;
        };
        render_engine(&mut out, &labels, snapshot, queued);
        let counter = |out: &mut String, name: &str, help: &str, v: u64| {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name}{{{labels}}} {v}"
            );
        };
        counter(
            &mut out,
            "vllm:prompt_tokens_total",
            "Prompt tokens of the finished requests.",
            r.prompt_tokens,
        );
        counter(
            &mut out,
            "vllm:generation_tokens_total",
            "Tokens the finished requests generated.",
            r.generation_tokens,
        );
        let labelled =
            |out: &mut String, name: &str, help: &str, label: &str, values: &[(&str, u64)]| {
                let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
                for (v, n) in values {
                    let _ = writeln!(out, "{name}{{{labels},{label}=\"{v}\"}} {n}");
                }
            };
        let [stop, length, abort] = r.ended;
        labelled(
            &mut out,
            "vllm:request_success_total",
            "Finished requests by finish reason.",
            "finished_reason",
            &[("stop", stop), ("length", length), ("abort", abort)],
        );
        let [invalid, overloaded, shutting_down, too_large] = r.refused;
        labelled(
            &mut out,
            "kvsched:requests_refused_total",
            "Requests refused before the engine, by reason.",
            "reason",
            &[
                ("invalid", invalid),
                ("overloaded", overloaded),
                ("shutting_down", shutting_down),
                ("too_large", too_large),
            ],
        );
        for ((name, help), h) in HISTOGRAMS.iter().zip(&r.histograms) {
            h.render(&mut out, name, help, &labels);
        }
        render_classes(&mut out, &labels, &r.by_class);
        out
    }
}

impl Requests {
    /// `class`'s histograms, made at its first request.
    fn class(&mut self, class: Class) -> &mut [Histogram; 3] {
        self.by_class.entry(class).or_insert_with(class_histograms)
    }
}

/// The per-class histograms, each family's series labelled `service_class` and `priority`.
fn render_classes(out: &mut String, labels: &str, by_class: &BTreeMap<Class, [Histogram; 3]>) {
    for (i, (name, help)) in BY_CLASS.iter().enumerate() {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        for (c, h) in by_class {
            let labels = format!(
                "{labels},service_class=\"{}\",priority=\"{}\"",
                c.service, c.priority
            );
            h[i].render_series(out, name, &labels);
        }
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
    let counters: [(&str, &str, u64); 12] = [
        ("vllm:prefix_cache_queries_total", "Prompt tokens looked up in the prefix cache (each prefill, replays included).", st.prefix_queried_tokens),
        ("vllm:prefix_cache_hits_total", "Prompt tokens found in the prefix cache.", st.prefix_reused_tokens),
        ("vllm:num_preemptions_total", "Requests whose KV was dropped and their prefill replayed (recompute pauses and preemptions).", st.recomputes),
        ("kvsched:suspensions_total", "Requests suspended to the host tier (their pages moved off the GPU).", st.suspensions - st.held_suspensions),
        ("kvsched:suspensions_in_place_total", "Steps a request was suspended in place: not scheduled, its pages held on the GPU.", st.held_suspensions),
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
