//! The simulation report: a summary table, a JSON document and a timeline plot.

use std::fmt::Write as _;

use super::fairness::AdapterService;
use super::Samples;
#[cfg(feature = "plot")]
use crate::plot::{Panel, Timeline};

/// What a simulation measured. Serialized (serde) as the `--json` document, without the wall time
/// (so that a seed's document is reproducible) and the timeline samples.
#[derive(Debug, Clone, Default, serde::Serialize)]
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
    #[serde(skip)]
    pub wall_seconds: f64,
    /// Generated tokens per simulated second.
    pub throughput_tok_s: f64,
    /// Time to first token, simulated ms.
    pub ttft_ms: Quantiles,
    /// Time per output token after the first, simulated ms.
    pub tpot_ms: Quantiles,
    /// Ordinary suspensions (victims + self-evictions).
    pub suspended: u64,
    /// Self-evictions.
    pub self_evicted: u64,
    /// Recompute pauses and preemptions (destructive).
    pub recompute_paused: u64,
    /// Context-side preemptions.
    pub preempted: u64,
    /// Running requests that yielded to a higher priority or to a service class within its share.
    pub yielded: u64,
    /// Suspended requests whose KV came back.
    pub resumed: u64,
    /// Samples forked off their request (`--samples`): children sharing its full pages.
    pub forks: u64,
    /// Full pages the forked samples shared instead of computing and holding their own.
    pub fork_pages_shared: u64,
    /// Forked samples that finished (beside `requests_completed`, which counts requests).
    pub samples_completed: u64,
    /// Samples never forked: their request ended first.
    pub fork_refused: u64,
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
    pub kv_gpu_util_peak_pct: f64,
    /// Peak host KV utilization by requests (their suspended pages), %.
    pub kv_host_util_peak_pct: f64,
    /// Peak share of the host tier holding prefix-cache blocks (demoted, idle), %.
    pub kv_host_cached_peak_pct: f64,
    /// Mean device adapter-cache utilization, %.
    pub adapter_util_mean_pct: f64,
    /// Scheduler wall time per iteration, ns: the pass plus ensure-batch, measured for real.
    pub sched_ns_per_iter: Quantiles,
    /// Scheduling iterations.
    pub iterations: u64,
    /// Decode steps run (one per request per step).
    pub decode_steps: u64,
    /// Draft tokens accepted over those steps (speculative decoding).
    pub accepted_drafts: u64,
    /// Draft tokens accepted per decode step, on average (0 without speculative decoding).
    pub accepted_tokens_per_step: f64,
    /// Draft tokens per step (0: no speculative decoding).
    pub spec_drafts: u32,
    /// The cost model's preset (`--engine`).
    pub engine: String,
    /// Simulated seconds from the first arrival to the last.
    pub arrival_span_seconds: f64,
    /// Whether arrivals outran the engine: the median request waited over 10 s for its first token, or
    /// the run ended well after the last arrival (a minute, or a fifth of the trace's span, later).
    pub overloaded: bool,
    /// The time-to-first-token objective, ms.
    pub slo_ttft_ms: Option<f64>,
    /// The time-per-output-token objective, ms.
    pub slo_tpot_ms: Option<f64>,
    /// Completed requests that met every objective given (all of them without objectives).
    pub slo_met: u64,
    /// Requests per simulated second that met both objectives (DistServe's goodput).
    pub goodput_rps: f64,
    /// The share of completed requests that met both objectives.
    pub slo_attainment: f64,
    /// Prefix reuse was on.
    pub prefix_reuse: bool,
    /// A hybrid model's pools and state counters (`hybrid.rs`); null without one.
    pub hybrid: Option<crate::hybrid::HybridReport>,
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
    /// Invariant violations seen by `--check` (0 expected); null in the JSON of a run without it.
    pub invariant_violations: u64,
    /// The run was checked (`--check`): its invariant violations were counted.
    #[serde(skip)]
    pub checked: bool,
    /// Remote store loads that failed (`--store-faults`; each request recomputes those tokens).
    pub store_loads_failed: u64,
    /// Remote store loads the pool abandoned after its timeout (`--store-faults`' stalls; each request
    /// recomputes those tokens).
    pub store_loads_timed_out: u64,
    /// Remote store saves the pool abandoned after its timeout (`--store-faults`' lost
    /// acknowledgements; their pages were pinned until then).
    pub store_saves_timed_out: u64,
    /// Disaggregated transfers that failed (`--link-faults`; each prompt recomputed on its decode
    /// engine).
    pub transfers_failed: u64,
    /// Disaggregated transfers that stalled and were given up after the timeout (`--link-faults`; each
    /// prompt recomputed on its decode engine).
    pub transfers_timed_out: u64,
    /// Exact audits `--check` ran (every `--check-every` iterations and at the end of the run).
    pub exact_audits: u64,
    /// Passes that were incremental: the last pass's steady decode batch kept, only its KV calls made
    /// again (`core/src/scheduler/incremental.rs`).
    pub incremental_passes: u64,
    /// Under `--check`: the passes compared with a twin run whose every pass is a full one (every
    /// output equal, the scheduler's state every `--check-every` passes, and the pools' at the end).
    /// `None` without `--check`.
    pub differential_passes: Option<u64>,
    /// A digest of every pass (the differential check's; not serialized).
    #[serde(skip)]
    pub digests: Vec<u64>,
    /// The admission policy (`--admission`).
    pub admission: String,
    /// Where the adapters' device copies live (`--adapter-paging`): `split` or `unified`.
    pub adapter_paging: String,
    /// Each adapter's TTFT and service rate while backlogged (`sim::fairness`).
    pub per_adapter: Vec<AdapterService>,
    /// With `--priority-mix`: the high class's figures, then the low class's (`sim::classes`).
    pub per_class: Option<[crate::classes::ClassSummary; 2]>,
    /// Jain's fairness index over the backlogged adapters' service rates.
    pub jain_fairness: f64,
    /// The router's route with several replicas (`--route`); empty for one engine.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub route: String,
    /// One row per replica (`--replicas`); empty for one engine.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub replicas: Vec<ReplicaRow>,
    /// The store the replicas share (`--remote-store`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub remote: Option<RemoteFigures>,
    /// One engine's part in a disaggregated cluster (`prefill`, `decode`); empty otherwise.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub role: String,
    /// Prefill/decode disaggregation (`--disagg`): the transfers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disagg: Option<super::disagg::DisaggFigures>,
    /// The longest any request waited in the scheduler while others progressed (`starvation.rs`).
    pub starvation: super::starvation::Starvation,
    /// The distributions behind the quantiles (a cluster's are its replicas' together).
    #[serde(skip)]
    pub raw: RawSamples,
    /// Timeline samples.
    #[serde(skip)]
    pub samples: Samples,
}

/// A KV tier's pages split three ways, in % of the tier: held by requests (their pages, cached
/// blocks they use included), cached (prefix-cache blocks no request holds, evictable) and free.
#[cfg(feature = "plot")]
fn pool_panel(tier: &str, held: &[f64], cached: &[f64], free: &[f64]) -> Panel {
    Panel::new(format!("{tier} KV pool"), "% of the tier's pages")
        .range(0.0, 100.0)
        .series("held by requests", held.to_vec())
        .series("prefix cache", cached.to_vec())
        .series("free", free.to_vec())
}

/// [`Report::overloaded`]: the median time to first token above this, ms.
pub const OVERLOAD_TTFT_P50_MS: f64 = 10_000.0;
/// [`Report::overloaded`]: the run ending more than this share of the arrival span after the last
/// arrival (and more than [`OVERLOAD_TAIL_S`]).
pub const OVERLOAD_TAIL_SHARE: f64 = 0.2;
/// [`Report::overloaded`]: the least tail after the last arrival that counts, s.
pub const OVERLOAD_TAIL_S: f64 = 60.0;

/// What "overloaded" means in the reports, in one line (the sweep table's note).
pub fn overloaded_means() -> String {
    format!(
        "overloaded: yes when the arrivals outran the engine: the median request waited over {:.0} s for its \
         first token, or the run ended over {:.0} s (or {:.0} % of the arrival span, if longer) after \
         the last arrival",
        OVERLOAD_TTFT_P50_MS / 1000.0,
        OVERLOAD_TAIL_S,
        100.0 * OVERLOAD_TAIL_SHARE
    )
}

impl Report {
    /// A report of `w` under `o`, before the run: what the options and the workload say.
    pub(super) fn new(o: &super::SimOptions, w: &kvsched_workload::Workload) -> Self {
        Self {
            source: w.source.to_string(),
            requests_total: w.arrivals.len(),
            engine: o.engine.label(&o.cost, o.tokens_per_block),
            slo_ttft_ms: o.slo_ttft_ms,
            slo_tpot_ms: o.slo_tpot_ms,
            checked: o.check,
            prefix_reuse: o.prefix_reuse,
            spec_drafts: o.spec_decode.map_or(0, |s| s.drafts),
            admission: o.admission.name().into(),
            adapter_paging: if o.adapters.unified {
                "unified"
            } else {
                "split"
            }
            .into(),
            adapters: o.adapters.count,
            ..Self::default()
        }
    }

    /// Fills the figures derived from the others (after the run's counters are final).
    pub(super) fn derive(&mut self) {
        let per = |n: u64, d: f64| if d > 0.0 { n as f64 / d } else { 0.0 };
        let prompt = self.admitted_prompt_tokens as f64;
        self.prefix_hit_rate = per(self.admitted_reused_tokens, prompt);
        let tail = self.sim_seconds - self.arrival_span_seconds;
        self.overloaded = self.ttft_ms.p50 > OVERLOAD_TTFT_P50_MS
            || tail > (OVERLOAD_TAIL_SHARE * self.arrival_span_seconds).max(OVERLOAD_TAIL_S);
        self.goodput_rps = per(self.slo_met, self.sim_seconds);
        self.slo_attainment = per(self.slo_met, self.requests_completed as f64);
        self.accepted_tokens_per_step = per(self.accepted_drafts, self.decode_steps as f64);
        self.throughput_tok_s = per(self.tokens_generated, self.sim_seconds);
    }

    /// Whether any service-level objective was given.
    pub fn has_slo(&self) -> bool {
        self.slo_ttft_ms.is_some() || self.slo_tpot_ms.is_some()
    }

    /// The summary table: one row per figure (the ones that apply), the replicas' rows, and a note when
    /// the run was overloaded.
    pub fn table(&self, checked: bool) -> String {
        let mut t = Rows(format!("kvsched simulate: {}\n", self.source));
        self.cluster_rows(&mut t);
        self.service_rows(&mut t);
        self.lifecycle_rows(&mut t);
        self.prefix_rows(&mut t);
        if let Some(h) = &self.hybrid {
            t.0.push_str(&h.rows());
        }
        self.adapter_rows(&mut t);
        self.engine_rows(&mut t, checked);
        self.replica_rows(&mut t);
        self.overload_note(&mut t);
        t.0
    }

    /// The engine, the replicas, the remote store and the disaggregation.
    fn cluster_rows(&self, t: &mut Rows) {
        if !self.engine.is_empty() {
            t.row("cost model (--engine)", &self.engine);
        }
        if !self.replicas.is_empty() {
            t.row(
                "replicas (--route)",
                format_args!("{} ({})", self.replicas.len(), self.route),
            );
        }
        if let Some(r) = self.remote {
            t.row(
                "remote store hit rate (blocks)",
                format_args!(
                    "{:.3} ({} loaded, {:.1} GB; {} saved, {} evicted)",
                    r.hit_rate, r.blocks_loaded, r.transfer_gb, r.blocks_saved, r.blocks_evicted
                ),
            );
        }
        if let Some(d) = self.disagg {
            t.row(
                "disaggregation (--disagg)",
                format_args!(
                    "{} prefill -> {} decode engines: {} prompts' KV moved ({:.1} GB), handoff p50 / p99 {:.1} / {:.1} ms",
                    d.prefill_engines,
                    d.decode_engines,
                    d.transfers,
                    d.transfer_gb,
                    d.handoff_ms.p50,
                    d.handoff_ms.p99
                ),
            );
        }
        self.fault_rows(t);
    }

    /// What `--store-faults` and `--link-faults` cost: the timeouts and the recomputes.
    fn fault_rows(&self, t: &mut Rows) {
        let store = [
            self.store_loads_failed,
            self.store_loads_timed_out,
            self.store_saves_timed_out,
        ];
        if store.iter().any(|&n| n > 0) {
            t.row(
                "store faults (--store-faults)",
                format_args!(
                    "{} loads failed, {} timed out (each a recompute); {} saves timed out",
                    store[0], store[1], store[2]
                ),
            );
        }
        if self.transfers_failed + self.transfers_timed_out > 0 {
            t.row(
                "link faults (--link-faults)",
                format_args!(
                    "{} transfers failed, {} timed out (each prompt recomputed on its decode engine)",
                    self.transfers_failed, self.transfers_timed_out
                ),
            );
        }
    }

    /// Requests, tokens, time, throughput, latency and goodput.
    fn service_rows(&self, t: &mut Rows) {
        let (done, total) = (self.requests_completed, self.requests_total);
        t.row("requests completed", format_args!("{done} of {total}"));
        t.row("tokens generated", self.tokens_generated);
        t.row("prefill tokens (incl. replays)", self.prefill_tokens);
        t.row("simulated time", format_args!("{:.1} s", self.sim_seconds));
        t.row(
            "throughput",
            format_args!("{:.0} tok/s", self.throughput_tok_s),
        );
        let (ttft, tpot) = (self.ttft_ms, self.tpot_ms);
        t.row(
            "TTFT p50 / p99",
            format_args!("{:.1} / {:.1} ms", ttft.p50, ttft.p99),
        );
        t.row(
            "TPOT p50 / p99",
            format_args!("{:.2} / {:.2} ms", tpot.p50, tpot.p99),
        );
        if self.has_slo() {
            let show = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v}"));
            let (ttft, tpot) = (show(self.slo_ttft_ms), show(self.slo_tpot_ms));
            let (rps, met) = (self.goodput_rps, 100.0 * self.slo_attainment);
            t.row(
                "goodput (SLO met: TTFT, TPOT ms)",
                format_args!("{rps:.2} req/s ({met:.1} % of requests; {ttft}, {tpot})"),
            );
        }
        for (label, value) in self.per_class.iter().flat_map(crate::classes::rows) {
            t.row(&label, value);
        }
    }

    /// Suspensions, recompute pauses, resumes and accepted drafts.
    fn lifecycle_rows(&self, t: &mut Rows) {
        let (suspended, self_evicted) = (self.suspended, self.self_evicted);
        t.row(
            "suspensions (self-evictions)",
            format_args!("{suspended} ({self_evicted})"),
        );
        let (paused, preempted) = (self.recompute_paused, self.preempted);
        t.row(
            "recompute pauses (preemptions)",
            format_args!("{paused} ({preempted})"),
        );
        t.row(
            "yields (priority, service classes)",
            format_args!("{}", self.yielded),
        );
        t.row("resumes", self.resumed);
        t.row("longest wait while others ran", self.starvation_text());
        if self.spec_drafts > 0 {
            let (per, k, steps) = (
                self.accepted_tokens_per_step,
                self.spec_drafts,
                self.decode_steps,
            );
            t.row(
                "accepted drafts per step",
                format_args!("{per:.2} of {k} ({steps} steps)"),
            );
        }
    }

    /// The starvation figure in words: passes (and ms) and the request, or how many never ran again.
    pub fn starvation_text(&self) -> String {
        let s = self.starvation;
        let who = s
            .request
            .map_or(String::new(), |r| format!(", request {r}"));
        let tail = if s.finite() {
            String::new()
        } else {
            format!("; {} still waiting at the end", s.unfinished)
        };
        let overtaken = s.overtaken_request.map_or("never overtaken".into(), |r| {
            format!("overtaken {} passes (request {r})", s.overtaken)
        });
        format!(
            "{} passes ({:.1} ms{who}); {overtaken}{tail}",
            s.passes, s.ms
        )
    }

    /// The prefix cache's reuse, and the KV pages moved between tiers.
    fn prefix_rows(&self, t: &mut Rows) {
        if self.prefix_reuse {
            let (rate, hit, all) = (
                self.prefix_hit_rate,
                self.admitted_reused_tokens,
                self.admitted_prompt_tokens,
            );
            t.row(
                "prefix hit rate (reused tokens)",
                format_args!("{rate:.3} ({hit} of {all} prompt tokens)"),
            );
            t.row("prefill saved (incl. replays)", self.prefill_tokens_saved);
            let (evicted, demoted) = (self.cached_blocks_evicted, self.cached_blocks_demoted);
            t.row(
                "cached blocks evicted / demoted",
                format_args!("{evicted} / {demoted}"),
            );
            t.row("host cache hits (blocks reloaded)", self.host_cache_hits);
        } else {
            t.row("prefix reuse", "off");
        }
        let (offloaded, reloaded) = (self.pages_offloaded, self.pages_reloaded);
        t.row(
            "KV pages offloaded / reloaded",
            format_args!("{offloaded} / {reloaded}"),
        );
        if self.forks > 0 {
            let (forks, shared) = (self.forks, self.fork_pages_shared);
            t.row(
                "samples forked / pages shared",
                format_args!("{forks} / {shared}"),
            );
        }
    }

    /// The adapter cache, the admission policy and the fairness between adapters.
    fn adapter_rows(&self, t: &mut Rows) {
        if self.adapters == 0 {
            return;
        }
        t.row("adapters", self.adapters);
        let (loads, evictions) = (self.adapter_loads, self.adapter_evictions);
        t.row(
            "adapter loads / evictions",
            format_args!("{loads} / {evictions}"),
        );
        t.row(
            "adapter cache utilization (mean)",
            format_args!("{:.1} %", self.adapter_util_mean_pct),
        );
        if self.adapter_paging == "unified" {
            t.row("adapter paging", "unified (adapters in the KV pool)");
        }
        if self.admission != "fcfs" {
            t.row("admission", &self.admission);
        }
        let p99 = |a: &&AdapterService| a.ttft_ms.p99;
        let best = self
            .per_adapter
            .iter()
            .min_by(|a, b| p99(a).total_cmp(&p99(b)));
        let worst = self
            .per_adapter
            .iter()
            .max_by(|a, b| p99(a).total_cmp(&p99(b)));
        if let (Some(b), Some(w)) = (best, worst) {
            let (bp, wp) = (b.ttft_ms.p99, w.ttft_ms.p99);
            let (ba, wa) = (b.adapter, w.adapter);
            t.row(
                "TTFT p99 best / worst adapter",
                format_args!("{bp:.1} ms ({ba}) / {wp:.1} ms ({wa})"),
            );
            t.row(
                "Jain's index (backlogged service)",
                format_args!("{:.3}", self.jain_fairness),
            );
        }
    }

    /// KV utilisation, the scheduler's own time, iterations, invariant checks and wall time.
    fn engine_rows(&self, t: &mut Rows, checked: bool) {
        let (mean, peak) = (self.kv_gpu_util_mean_pct, self.kv_gpu_util_peak_pct);
        t.row(
            "KV GPU utilization mean / peak",
            format_args!("{mean:.1} % / {peak:.1} %"),
        );
        t.row(
            "KV host peak: requests / cache",
            format_args!(
                "{:.1} % / {:.1} %",
                self.kv_host_util_peak_pct, self.kv_host_cached_peak_pct
            ),
        );
        let us = |ns: f64| ns / 1000.0;
        let sched = self.sched_ns_per_iter;
        t.row(
            "scheduler per iteration p50 / p99",
            format_args!("{:.2} / {:.2} us", us(sched.p50), us(sched.p99)),
        );
        t.row("iterations", self.iterations);
        if checked {
            t.row("invariant violations (--check)", self.invariant_violations);
            t.row("exact audits (--check)", self.exact_audits);
            if let Some(n) = self.differential_passes {
                t.row(
                    "differential (--check)",
                    format_args!(
                        "{n} passes as the full pass's, {} incremental",
                        self.incremental_passes
                    ),
                );
            }
        }
        t.row("wall time", format_args!("{:.2} s", self.wall_seconds));
    }

    /// One line per replica of a cluster.
    fn replica_rows(&self, t: &mut Rows) {
        if self.replicas.is_empty() {
            return;
        }
        t.line(format_args!(
            "  replica  role     requests  throughput tok/s  TTFT p50 / p99 ms   prefix hit rate  KV GPU peak"
        ));
        for r in &self.replicas {
            let role = if r.role.is_empty() { "mixed" } else { &r.role };
            t.line(format_args!(
                "  {:>7}  {:<7}  {:>8}  {:>16.0}  {:>8.1} / {:<8.1}  {:>15.3}  {:>9.1} %",
                r.replica,
                role,
                r.requests,
                r.throughput_tok_s,
                r.ttft_ms.p50,
                r.ttft_ms.p99,
                r.prefix_hit_rate,
                r.kv_gpu_util_peak_pct
            ));
        }
    }

    /// What to do when the arrivals outran the engine.
    fn overload_note(&self, t: &mut Rows) {
        if !self.overloaded {
            return;
        }
        t.line(format_args!(
            "overloaded: arrivals outran the engine (the last request arrived at {:.0} s, the run \
             ended at {:.0} s, the median request waited {:.1} s for its first token): spread the \
             arrivals with --time-scale above {:.1}, or serve the trace on more engines",
            self.arrival_span_seconds,
            self.sim_seconds,
            self.ttft_ms.p50 / 1000.0,
            (self.sim_seconds / self.arrival_span_seconds.max(1.0)).max(1.1)
        ));
    }

    /// The JSON document (`--json`): every figure, keys sorted; `invariant_violations` is null unless
    /// the run was checked.
    pub fn json(&self) -> serde_json::Value {
        let mut v = serde_json::to_value(self).expect("the report serializes");
        if !self.checked {
            v["invariant_violations"] = serde_json::Value::Null;
        }
        v
    }

    /// The timeline plot.
    #[cfg(feature = "plot")]
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
            .panel(pool_panel("GPU", &s.kv_gpu, &s.idle_gpu, &s.free_gpu));
        let host = [&s.kv_host, &s.idle_host, &s.free_host];
        if host.iter().any(|v| v.iter().any(|&x| x > 0.0)) {
            t = t.panel(pool_panel("host", &s.kv_host, &s.idle_host, &s.free_host));
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

/// The summary table being written: a label column and a value column.
struct Rows(String);

impl Rows {
    /// A `label  value` row.
    fn row(&mut self, label: &str, value: impl std::fmt::Display) {
        let _ = writeln!(self.0, "  {label:<34} {value}");
    }

    /// A line as it is.
    fn line(&mut self, line: std::fmt::Arguments<'_>) {
        let _ = writeln!(self.0, "{line}");
    }
}

/// One replica's figures in a cluster report.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct ReplicaRow {
    /// Its index.
    pub replica: u32,
    /// Its part with `--disagg` (`prefill`, `decode`); empty otherwise.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub role: String,
    /// Requests the router sent it.
    pub requests: usize,
    /// Its throughput.
    pub throughput_tok_s: f64,
    /// Its requests' time to first token.
    pub ttft_ms: Quantiles,
    /// Its prefix hit rate.
    pub prefix_hit_rate: f64,
    /// Its KV GPU pool's peak utilization.
    pub kv_gpu_util_peak_pct: f64,
}

/// What the replicas' shared store did.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct RemoteFigures {
    /// Blocks the engines loaded from it.
    pub blocks_loaded: u64,
    /// Blocks saved to it.
    pub blocks_saved: u64,
    /// Blocks it evicted for room.
    pub blocks_evicted: u64,
    /// Prompt tokens loaded from it, over the admitted prompt tokens.
    pub hit_rate: f64,
    /// Bytes read from it, GB.
    pub transfer_gb: f64,
}

/// The sorted samples behind a report's quantiles.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RawSamples {
    /// Times to first token, ms.
    pub ttft: Vec<f64>,
    /// Times per output token, ms.
    pub tpot: Vec<f64>,
    /// Scheduler ns per iteration.
    pub sched_ns: Vec<f64>,
    /// Disaggregation, decode side: from a prompt's end on its prefill engine to its KV in place here,
    /// ms, one per transfer.
    pub handoff_ms: Vec<f64>,
    /// Disaggregation, decode side: the prompt tokens whose KV was received.
    pub transfer_tokens: u64,
}

/// p50 and p99 of a distribution.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct Quantiles {
    /// The median.
    pub p50: f64,
    /// The 99th percentile.
    pub p99: f64,
}

impl Quantiles {
    /// The quantiles of sorted samples (0 for none).
    pub fn of(sorted: &[f64]) -> Self {
        Self {
            p50: super::percentile(sorted, 0.5),
            p99: super::percentile(sorted, 0.99),
        }
    }
}
