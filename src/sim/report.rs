//! The simulation report: a summary table, a JSON document and a timeline plot.

use std::fmt::Write as _;

use super::Samples;
use crate::plot::{Panel, Timeline};

/// What a simulation measured.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// Where the requests came from.
    pub source: String,
    /// Requests in the workload.
    pub requests_total: usize,
    /// Requests that finished.
    pub requests_completed: u64,
    /// Output tokens generated (all requests).
    pub tokens_generated: u64,
    /// Output tokens the trace asked of the completed requests.
    pub completed_output_tokens: u64,
    /// Prefill tokens processed (replays included).
    pub prefill_tokens: u64,
    /// Simulated seconds.
    pub sim_seconds: f64,
    /// Wall seconds of the whole run.
    pub wall_seconds: f64,
    /// Generated tokens per simulated second.
    pub throughput_tok_s: f64,
    /// Time to first token (p50, p99), simulated ms.
    pub ttft_ms: (f64, f64),
    /// Time per output token after the first (p50, p99), simulated ms.
    pub tpot_ms: (f64, f64),
    /// Ordinary suspensions (victims + self-evictions).
    pub suspended: u64,
    /// Self-evictions.
    pub self_evicted: u64,
    /// Recompute pauses and preemptions (destructive).
    pub recompute_paused: u64,
    /// Context-side preemptions.
    pub preempted: u64,
    /// Suspended requests whose KV came back.
    pub resumed: u64,
    /// KV pages moved GPU → host.
    pub pages_offloaded: u64,
    /// KV pages moved host → GPU.
    pub pages_reloaded: u64,
    /// Adapter copies to the device.
    pub adapter_loads: u64,
    /// Adapter evictions from the device.
    pub adapter_evictions: u64,
    /// Adapters in the run.
    pub adapters: u32,
    /// Mean GPU KV utilization, %.
    pub kv_gpu_util_mean_pct: f64,
    /// Peak GPU KV utilization, %.
    pub peak_kv_gpu_pct: f64,
    /// Peak host KV utilization, %.
    pub peak_kv_host_pct: f64,
    /// Mean device adapter-cache utilization, %.
    pub adapter_util_mean_pct: f64,
    /// Scheduler wall time per iteration (p50, p99), ns: the pass plus ensure-batch, measured for real.
    pub sched_ns_per_iter: (f64, f64),
    /// Scheduling iterations.
    pub iterations: u64,
    /// Decode steps run (one per request per step).
    pub decode_steps: u64,
    /// Draft tokens accepted over those steps (speculative decoding).
    pub accepted_drafts: u64,
    /// Draft tokens per step (0: no speculative decoding).
    pub spec_drafts: u32,
    /// The cost model's preset (`--engine`).
    pub engine: String,
    /// Simulated seconds from the first arrival to the last.
    pub arrival_span_seconds: f64,
    /// The service-level objectives (TTFT, TPOT in ms) when any was given.
    pub slo: Option<(Option<f64>, Option<f64>)>,
    /// Completed requests that met every objective given (all of them without objectives).
    pub slo_met: u64,
    /// Prefix reuse was on.
    pub prefix_reuse: bool,
    /// Prompt tokens of the requests' first admissions (the trace's prompts).
    pub admitted_prompt_tokens: u64,
    /// Of those, the tokens found cached.
    pub admitted_reused_tokens: u64,
    /// `admitted_reused_tokens / admitted_prompt_tokens`: comparable to a trace's reuse ceiling.
    pub prefix_hit_rate: f64,
    /// Prompt tokens found cached by every first chunk, replays after a recompute pause included: the
    /// prefill the cache saved.
    pub prefill_tokens_saved: u64,
    /// Cached blocks dropped from the cache to make room.
    pub cached_blocks_evicted: u64,
    /// Cached blocks demoted from the GPU to the host tier.
    pub cached_blocks_demoted: u64,
    /// Cached blocks found on the host tier and reloaded (one page copy each).
    pub host_cache_hits: u64,
    /// Invariant violations seen by `--check` (0 expected).
    pub invariant_violations: u64,
    /// Timeline samples.
    pub samples: Samples,
}

impl Report {
    pub(super) fn new(total: usize) -> Self {
        Self {
            requests_total: total,
            ..Self::default()
        }
    }

    /// Whether arrivals outran the engine: the median request waited over 10 s for its first token, or
    /// the run ended well after the last arrival (a minute, or a fifth of the trace's span, later).
    pub fn overloaded(&self) -> bool {
        let tail = self.sim_seconds - self.arrival_span_seconds;
        self.ttft_ms.0 > 10_000.0 || tail > (0.2 * self.arrival_span_seconds).max(60.0)
    }

    /// Requests per simulated second that met both objectives (DistServe's goodput).
    pub fn goodput_rps(&self) -> f64 {
        if self.sim_seconds > 0.0 {
            self.slo_met as f64 / self.sim_seconds
        } else {
            0.0
        }
    }

    /// The share of completed requests that met both objectives.
    pub fn slo_attainment(&self) -> f64 {
        if self.requests_completed > 0 {
            self.slo_met as f64 / self.requests_completed as f64
        } else {
            0.0
        }
    }

    /// Draft tokens accepted per decode step, on average (speculative decoding; 0 without it).
    pub fn accepted_tokens_per_step(&self) -> f64 {
        if self.decode_steps == 0 {
            0.0
        } else {
            self.accepted_drafts as f64 / self.decode_steps as f64
        }
    }

    /// The summary table.
    pub fn table(&self, checked: bool) -> String {
        let mut s = String::new();
        let row = |s: &mut String, k: &str, v: String| {
            let _ = writeln!(s, "  {k:<34} {v}");
        };
        let _ = writeln!(s, "kvsched simulate: {}", self.source);
        if !self.engine.is_empty() && self.engine != "legacy" {
            row(&mut s, "cost model (--engine)", self.engine.clone());
        }
        row(
            &mut s,
            "requests completed",
            format!("{} of {}", self.requests_completed, self.requests_total),
        );
        row(
            &mut s,
            "tokens generated",
            self.tokens_generated.to_string(),
        );
        row(
            &mut s,
            "prefill tokens (incl. replays)",
            self.prefill_tokens.to_string(),
        );
        row(
            &mut s,
            "simulated time",
            format!("{:.1} s", self.sim_seconds),
        );
        row(
            &mut s,
            "throughput",
            format!("{:.0} tok/s", self.throughput_tok_s),
        );
        row(
            &mut s,
            "TTFT p50 / p99",
            format!("{:.1} / {:.1} ms", self.ttft_ms.0, self.ttft_ms.1),
        );
        row(
            &mut s,
            "TPOT p50 / p99",
            format!("{:.2} / {:.2} ms", self.tpot_ms.0, self.tpot_ms.1),
        );
        if let Some((ttft, tpot)) = self.slo {
            let show = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v}"));
            row(
                &mut s,
                "goodput (SLO met: TTFT, TPOT ms)",
                format!(
                    "{:.2} req/s ({:.1} % of requests; {}, {})",
                    self.goodput_rps(),
                    100.0 * self.slo_attainment(),
                    show(ttft),
                    show(tpot)
                ),
            );
        }
        row(
            &mut s,
            "suspensions (self-evictions)",
            format!("{} ({})", self.suspended, self.self_evicted),
        );
        row(
            &mut s,
            "recompute pauses (preemptions)",
            format!("{} ({})", self.recompute_paused, self.preempted),
        );
        row(&mut s, "resumes", self.resumed.to_string());
        if self.spec_drafts > 0 {
            row(
                &mut s,
                "accepted drafts per step",
                format!(
                    "{:.2} of {} ({} steps)",
                    self.accepted_tokens_per_step(),
                    self.spec_drafts,
                    self.decode_steps
                ),
            );
        }
        if self.prefix_reuse {
            row(
                &mut s,
                "prefix hit rate (reused tokens)",
                format!(
                    "{:.3} ({} of {} prompt tokens)",
                    self.prefix_hit_rate, self.admitted_reused_tokens, self.admitted_prompt_tokens
                ),
            );
            row(
                &mut s,
                "prefill saved (incl. replays)",
                self.prefill_tokens_saved.to_string(),
            );
            row(
                &mut s,
                "cached blocks evicted / demoted",
                format!(
                    "{} / {}",
                    self.cached_blocks_evicted, self.cached_blocks_demoted
                ),
            );
            row(
                &mut s,
                "host cache hits (blocks reloaded)",
                self.host_cache_hits.to_string(),
            );
        } else {
            row(&mut s, "prefix reuse", "off".into());
        }
        row(
            &mut s,
            "KV pages offloaded / reloaded",
            format!("{} / {}", self.pages_offloaded, self.pages_reloaded),
        );
        if self.adapters > 0 {
            row(&mut s, "adapters", self.adapters.to_string());
            row(
                &mut s,
                "adapter loads / evictions",
                format!("{} / {}", self.adapter_loads, self.adapter_evictions),
            );
            row(
                &mut s,
                "adapter cache utilization (mean)",
                format!("{:.1} %", self.adapter_util_mean_pct),
            );
        }
        row(
            &mut s,
            "KV GPU utilization mean / peak",
            format!(
                "{:.1} % / {:.1} %",
                self.kv_gpu_util_mean_pct, self.peak_kv_gpu_pct
            ),
        );
        row(
            &mut s,
            "KV host utilization peak",
            format!("{:.1} %", self.peak_kv_host_pct),
        );
        row(
            &mut s,
            "scheduler per iteration p50 / p99",
            format!(
                "{:.2} / {:.2} us",
                self.sched_ns_per_iter.0 / 1000.0,
                self.sched_ns_per_iter.1 / 1000.0
            ),
        );
        row(&mut s, "iterations", self.iterations.to_string());
        if checked {
            row(
                &mut s,
                "invariant violations (--check)",
                self.invariant_violations.to_string(),
            );
        }
        row(&mut s, "wall time", format!("{:.2} s", self.wall_seconds));
        if self.overloaded() {
            let _ = writeln!(
                s,
                "overloaded: arrivals outran the engine (the last request arrived at {:.0} s, the run \
                 ended at {:.0} s, the median request waited {:.1} s for its first token): spread the \
                 arrivals with --time-scale above {:.1}, or serve the trace on more engines",
                self.arrival_span_seconds,
                self.sim_seconds,
                self.ttft_ms.0 / 1000.0,
                (self.sim_seconds / self.arrival_span_seconds.max(1.0)).max(1.1)
            );
        }
        s
    }

    /// The JSON document.
    pub fn json(&self) -> serde_json::Value {
        let doc = JsonReport {
            source: &self.source,
            requests_total: self.requests_total,
            requests_completed: self.requests_completed,
            tokens_generated: self.tokens_generated,
            completed_output_tokens: self.completed_output_tokens,
            prefill_tokens: self.prefill_tokens,
            sim_seconds: self.sim_seconds,
            throughput_tok_s: self.throughput_tok_s,
            ttft_ms: self.ttft_ms.into(),
            tpot_ms: self.tpot_ms.into(),
            suspended: self.suspended,
            self_evicted: self.self_evicted,
            recompute_paused: self.recompute_paused,
            preempted: self.preempted,
            resumed: self.resumed,
            pages_offloaded: self.pages_offloaded,
            pages_reloaded: self.pages_reloaded,
            adapter_loads: self.adapter_loads,
            adapter_evictions: self.adapter_evictions,
            kv_gpu_util_mean_pct: self.kv_gpu_util_mean_pct,
            kv_gpu_util_peak_pct: self.peak_kv_gpu_pct,
            kv_host_util_peak_pct: self.peak_kv_host_pct,
            adapter_util_mean_pct: self.adapter_util_mean_pct,
            sched_ns_per_iter: self.sched_ns_per_iter.into(),
            iterations: self.iterations,
            decode_steps: self.decode_steps,
            spec_drafts: self.spec_drafts,
            slo_ttft_ms: self.slo.and_then(|s| s.0),
            slo_tpot_ms: self.slo.and_then(|s| s.1),
            goodput_rps: self.goodput_rps(),
            slo_attainment: self.slo_attainment(),
            engine: &self.engine,
            overloaded: self.overloaded(),
            arrival_span_seconds: self.arrival_span_seconds,
            accepted_tokens_per_step: self.accepted_tokens_per_step(),
            prefix_reuse: self.prefix_reuse,
            prefix_hit_rate: self.prefix_hit_rate,
            prefill_tokens_saved: self.prefill_tokens_saved,
            admitted_prompt_tokens: self.admitted_prompt_tokens,
            admitted_reused_tokens: self.admitted_reused_tokens,
            cached_blocks_evicted: self.cached_blocks_evicted,
            cached_blocks_demoted: self.cached_blocks_demoted,
            host_cache_hits: self.host_cache_hits,
            invariant_violations: self.invariant_violations,
        };
        serde_json::to_value(doc).expect("the report serializes")
    }

    /// The timeline plot.
    pub fn timeline(&self) -> Timeline {
        let s = &self.samples;
        let mut t = Timeline::new("kvsched simulate", s.t.clone())
            .subtitle(format!(
                "{} — {} requests",
                self.source, self.requests_total
            ))
            .panel(
                Panel::new("requests", "requests")
                    .series("queue", s.queue.clone())
                    .series("running batch", s.batch.clone()),
            )
            .panel(
                Panel::new("KV cache utilization", "%")
                    .range(0.0, 100.0)
                    .series("GPU tier", s.kv_gpu.clone())
                    .series("host tier", s.kv_host.clone()),
            );
        if self.prefix_reuse {
            t = t.panel(
                Panel::new("prefix cache occupancy", "% of the tier's pages")
                    .range(0.0, 100.0)
                    .series("GPU tier", s.cached_gpu.clone())
                    .series("host tier", s.cached_host.clone()),
            );
        }
        if self.adapters > 0 {
            t = t.panel(
                Panel::new("adapter residency", "adapters on device")
                    .series("adapters", s.adapters.clone()),
            );
        }
        t
    }
}

/// p50 and p99 of a distribution.
#[derive(serde::Serialize)]
struct Quantiles {
    p50: f64,
    p99: f64,
}

impl From<(f64, f64)> for Quantiles {
    fn from((p50, p99): (f64, f64)) -> Self {
        Self { p50, p99 }
    }
}

/// The JSON document's fields (`--json`): one per report figure, nested quantiles.
#[derive(serde::Serialize)]
struct JsonReport<'a> {
    source: &'a str,
    requests_total: usize,
    requests_completed: u64,
    tokens_generated: u64,
    completed_output_tokens: u64,
    prefill_tokens: u64,
    sim_seconds: f64,
    throughput_tok_s: f64,
    ttft_ms: Quantiles,
    tpot_ms: Quantiles,
    suspended: u64,
    self_evicted: u64,
    recompute_paused: u64,
    preempted: u64,
    resumed: u64,
    pages_offloaded: u64,
    pages_reloaded: u64,
    adapter_loads: u64,
    adapter_evictions: u64,
    kv_gpu_util_mean_pct: f64,
    kv_gpu_util_peak_pct: f64,
    kv_host_util_peak_pct: f64,
    adapter_util_mean_pct: f64,
    sched_ns_per_iter: Quantiles,
    iterations: u64,
    decode_steps: u64,
    spec_drafts: u32,
    slo_ttft_ms: Option<f64>,
    slo_tpot_ms: Option<f64>,
    goodput_rps: f64,
    slo_attainment: f64,
    engine: &'a str,
    overloaded: bool,
    arrival_span_seconds: f64,
    accepted_tokens_per_step: f64,
    prefix_reuse: bool,
    prefix_hit_rate: f64,
    prefill_tokens_saved: u64,
    admitted_prompt_tokens: u64,
    admitted_reused_tokens: u64,
    cached_blocks_evicted: u64,
    cached_blocks_demoted: u64,
    host_cache_hits: u64,
    invariant_violations: u64,
}
