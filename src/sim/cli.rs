//! `kvsched simulate`: option parsing and the run.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use kvsched_core::config::{CapacityPolicy, ChunkPolicy, Chunking};

use super::cost::Engine;
use super::{run, SimOptions};
use crate::workload::popularity::{AdapterRanks, PopularityLaw};
use crate::workload::synthetic::{generate, SyntheticSpec};
use crate::workload::{self, TraceFormat, Workload};

/// The trace the default run replays (a CC-BY-4.0 slice of the Azure 2023 conversation trace; see
/// data/README.md).
pub const DEFAULT_TRACE: &str = include_str!("../../data/azure_conv_head.csv");
/// Its name in reports.
pub const DEFAULT_TRACE_NAME: &str = "data/azure_conv_head.csv";

/// Parsed command line.
#[derive(Debug, Default, Clone)]
pub struct Cli {
    /// Options.
    pub opts: SimOptions,
    /// Trace path.
    pub trace: Option<PathBuf>,
    /// Forced format.
    pub format: Option<TraceFormat>,
    /// Synthetic spec (rate, cv, seconds).
    pub synthetic: Option<(f64, f64, f64)>,
    /// Request limit.
    pub limit: Option<usize>,
    /// Arrival-time scale.
    pub time_scale: Option<f64>,
    /// JSON output.
    pub json: Option<PathBuf>,
    /// SVG output.
    pub plot: Option<PathBuf>,
    /// `--sweep PARAM=V1,V2,…`.
    pub sweep: Option<super::sweep::Sweep>,
}

/// `kvsched simulate`'s options (clap derives the parser and the help from this one definition; the
/// defaults are `SimOptions::default()`'s).
#[derive(Debug, clap::Parser)]
#[command(
    name = "kvsched simulate",
    allow_negative_numbers = true,
    about = "Replays a request trace through the real scheduler on a simulated engine.",
    long_about = "Replays a request trace through the real scheduler on a simulated engine. Without TRACE it \
        replays the shipped slice of the Azure 2023 conversation trace (data/azure_conv_head.csv, 1500 \
        requests), with 32 LoRA adapters assigned by a seeded power:0.8 popularity law (--adapters 0 \
        turns LoRA off), on the h200-llama3-8b engine (docs/COST.md)."
)]
struct SimArgs {
    /// Azure 2023 CSV, Mooncake JSONL or BurstGPT CSV (format sniffed).
    #[arg(help_heading = "Workload")]
    trace: Option<PathBuf>,
    /// Force the trace format.
    #[arg(long, help_heading = "Workload", value_name = "azure|mooncake|burstgpt",
          value_parser = |v: &str| v.parse::<TraceFormat>().map_err(|_| format!("unknown format {v:?} (azure, mooncake, burstgpt)")))]
    format: Option<TraceFormat>,
    /// Gamma arrivals (cv 1 = Poisson) with S-LoRA lengths, instead of a trace.
    #[arg(long, help_heading = "Workload", value_name = "RATE[:CV[:SECONDS]]", value_parser = synthetic)]
    synthetic: Option<(f64, f64, f64)>,
    /// Replay only the first N requests.
    #[arg(long, help_heading = "Workload", value_name = "N")]
    limit: Option<usize>,
    /// Multiply arrival times by F (F < 1 = heavier load).
    #[arg(long, help_heading = "Workload", value_name = "F")]
    time_scale: Option<f64>,
    /// GPU KV pages [default: what the engine's GPU holds beside the weights: 28,519 pages of 32 tokens
    /// on h200-llama3-8b, 640 on legacy].
    #[arg(long, help_heading = "KV cache", value_name = "N")]
    kv_gpu_pages: Option<u32>,
    /// Host KV pages (0 = no host tier).
    #[arg(long, help_heading = "KV cache", value_name = "N", default_value_t = SimOptions::default().kv_host_pages)]
    kv_host_pages: u32,
    /// Tokens per KV page.
    #[arg(long, help_heading = "KV cache", value_name = "N", default_value_t = SimOptions::default().tokens_per_block)]
    tokens_per_block: u32,
    /// No prefix cache. Reuse follows the trace's prefix blocks (Mooncake hash_ids, 512 tokens:
    /// --tokens-per-block must divide or be a multiple of 512); traces without them get multi-turn
    /// sessions over per-adapter system prompts (16-token blocks, see workload::sessions).
    #[arg(long, help_heading = "KV cache")]
    no_prefix_reuse: bool,
    /// LoRA adapters (0 = no LoRA).
    #[arg(long, help_heading = "Adapters (multi-LoRA)", value_name = "N", default_value_t = SimOptions::default().adapters.count)]
    adapters: u32,
    /// Adapter popularity law.
    #[arg(long, help_heading = "Adapters (multi-LoRA)", value_name = "power:A|zipf:S|uniform", default_value = "power:0.8",
          value_parser = |v: &str| v.parse::<PopularityLaw>().map_err(|e| e.to_string()))]
    popularity: PopularityLaw,
    /// Adapter ranks, assigned in turn.
    #[arg(long, help_heading = "Adapters (multi-LoRA)", value_name = "R,R,...", default_value = "8,16,32,64",
          value_parser = |v: &str| v.parse::<AdapterRanks>().map_err(|e| e.to_string()))]
    ranks: AdapterRanks,
    /// Adapter pages per rank 8.
    #[arg(long, help_heading = "Adapters (multi-LoRA)", value_name = "N", default_value_t = SimOptions::default().adapters.pages_per_rank8)]
    pages_per_rank8: u32,
    /// Device pages of the adapter cache.
    #[arg(long, help_heading = "Adapters (multi-LoRA)", value_name = "N", default_value_t = SimOptions::default().adapters.device_pages)]
    adapter_device_pages: u32,
    /// Host pages of the adapter cache.
    #[arg(long, help_heading = "Adapters (multi-LoRA)", value_name = "N", default_value_t = SimOptions::default().adapters.host_pages)]
    adapter_host_pages: u32,
    /// split: the adapters' device pages are a cache of their own (the reference); unified: they join
    /// the KV pool, one page space for KV and adapters with one eviction order (S-LoRA).
    #[arg(
        long,
        help_heading = "Adapters (multi-LoRA)",
        value_enum,
        default_value = "split"
    )]
    adapter_paging: AdapterPaging,
    /// K draft tokens a decode step, each accepted with probability ACCEPT after the ones before it: a
    /// step keeps 1 + the accepted run; a joint draft pool holds the draft model's KV; rejected drafts'
    /// slots are given back.
    #[arg(long, help_heading = "Speculative decoding", value_name = "K:ACCEPT", value_parser = spec_decode)]
    spec_decode: Option<super::SpecDecode>,
    /// GPU pages of the joint draft pool [default: as many as the target's].
    #[arg(long, help_heading = "Speculative decoding", value_name = "N")]
    draft_kv_pages: Option<u32>,
    /// Token budget per pass.
    #[arg(long, help_heading = "Scheduler", value_name = "N", default_value_t = SimOptions::default().max_tokens)]
    max_tokens: u32,
    /// Most requests in a batch.
    #[arg(long, help_heading = "Scheduler", value_name = "N", default_value_t = SimOptions::default().max_batch)]
    max_batch: u32,
    /// Capacity policy.
    #[arg(long, help_heading = "Scheduler", value_name = "max_utilization|guaranteed_no_evict", default_value = "max_utilization", value_parser = policy)]
    policy: CapacityPolicy,
    /// Admission order of waiting requests (beyond the reference): fcfs, vtc (virtual token
    /// counters per adapter) or deadline (an adapter's class is its id mod 4; class c's TTFT
    /// deadline is 2^c times --slo-ttft-ms, else 500 ms).
    #[arg(
        long,
        help_heading = "Scheduler",
        value_name = "fcfs|vtc|deadline",
        default_value = "fcfs"
    )]
    admission: String,
    /// Engines behind the router, each with its own scheduler and pools.
    #[arg(long, help_heading = "Cluster", value_name = "N", default_value_t = SimOptions::default().replicas,
          value_parser = clap::value_parser!(u32).range(1..=1024))]
    replicas: u32,
    /// How the router spreads requests: in turn, or by their first prefix block.
    #[arg(
        long,
        help_heading = "Cluster",
        value_enum,
        default_value = "round_robin"
    )]
    route: super::cluster::Route,
    /// A KV store the replicas share, PAGES blocks (a remote read: LATENCY_US µs plus the pages over
    /// GBPS GB/s; defaults 50 and 25), as every engine's KV connector; needs prefix reuse.
    #[arg(long, help_heading = "Cluster", value_name = "PAGES[:LATENCY_US[:GBPS]]",
          value_parser = |v: &str| v.parse::<super::cluster::RemoteStoreOptions>())]
    remote_store: Option<super::cluster::RemoteStoreOptions>,
    /// Prefill/decode disaggregation: P prefill engines hand each computed prompt's KV to one of D
    /// decode engines (a transfer: LATENCY_US µs plus the KV over GBPS GB/s; defaults 50 and 50).
    /// Replaces --replicas; --route spreads the arrivals over the prefill engines.
    #[arg(long, help_heading = "Cluster", value_name = "P:D[:LATENCY_US[:GBPS]]",
          conflicts_with = "replicas",
          value_parser = |v: &str| v.parse::<super::disagg::DisaggOptions>())]
    disagg: Option<super::disagg::DisaggOptions>,
    /// Under vtc or deadline: passes a request may be refused its adapter before admissions drain
    /// for it (no new leases until it loads; 0 = never).
    #[arg(long, help_heading = "Scheduler", value_name = "N", default_value_t = SimOptions::default().drain_after)]
    drain_after: u32,
    /// Chunked prefill.
    #[arg(long, help_heading = "Scheduler", value_name = "fcfs|force_chunk|equal_progress|none", default_value = "fcfs", value_parser = chunking)]
    chunking: ChunkingChoice,
    /// Chunk unit in tokens.
    #[arg(
        long,
        help_heading = "Scheduler",
        value_name = "N",
        default_value_t = 64
    )]
    chunk_unit: u32,
    /// No destructive recompute pause.
    #[arg(long, help_heading = "Scheduler")]
    no_recompute_pause: bool,
    /// Stalled passes before the deadlock error.
    #[arg(long, help_heading = "Scheduler", value_name = "N", default_value_t = SimOptions::default().deadlock_threshold)]
    deadlock_threshold: u32,
    /// The cost model's preset: a fit to a Llama-3-8B-shaped model on one H200 (decode attention grows
    /// with context), or the first model's four constants. Each term below overrides the preset's
    /// (values: docs/COST.md).
    #[arg(long, help_heading = "Cost model (simulated microseconds)", value_name = "h200-llama3-8b|legacy", default_value = "h200-llama3-8b", value_parser = Engine::parse)]
    engine: Engine,
    /// Fixed cost of one step.
    #[arg(
        long,
        help_heading = "Cost model (simulated microseconds)",
        value_name = "F"
    )]
    step_us: Option<f64>,
    /// Per prefill token (and verified draft token).
    #[arg(
        long,
        help_heading = "Cost model (simulated microseconds)",
        value_name = "F"
    )]
    prefill_us_per_token: Option<f64>,
    /// Per decode request.
    #[arg(
        long,
        help_heading = "Cost model (simulated microseconds)",
        value_name = "F"
    )]
    decode_us_per_request: Option<f64>,
    /// Per cached token a decode step reads.
    #[arg(
        long,
        help_heading = "Cost model (simulated microseconds)",
        value_name = "F"
    )]
    decode_us_per_cached_token: Option<f64>,
    /// Per (query, key) pair of a chunk's attention.
    #[arg(
        long,
        help_heading = "Cost model (simulated microseconds)",
        value_name = "F"
    )]
    attention_us_per_pair: Option<f64>,
    /// Per adapter page loaded.
    #[arg(
        long,
        help_heading = "Cost model (simulated microseconds)",
        value_name = "F"
    )]
    adapter_load_us_per_page: Option<f64>,
    /// Per KV page moved between tiers.
    #[arg(
        long,
        help_heading = "Cost model (simulated microseconds)",
        value_name = "F"
    )]
    page_copy_us: Option<f64>,
    /// Time-to-first-token objective for goodput (requests per second that meet both objectives,
    /// DistServe's definition).
    #[arg(long, help_heading = "Service-level objectives", value_name = "MS")]
    slo_ttft_ms: Option<f64>,
    /// Time-per-output-token objective for goodput.
    #[arg(long, help_heading = "Service-level objectives", value_name = "MS")]
    slo_tpot_ms: Option<f64>,
    /// One run per value of rate (arrival-rate scale), kv-gpu-pages, adapters, max-batch or policy: a
    /// throughput-latency table; --plot draws the curve, --json writes the reports as an array.
    #[arg(long, help_heading = "Sweep (capacity planning)", value_name = "PARAM=V1,V2,...", value_parser = super::sweep::Sweep::parse)]
    sweep: Option<super::sweep::Sweep>,
    /// Write the report as JSON.
    #[arg(long, help_heading = "Output", value_name = "FILE")]
    json: Option<PathBuf>,
    /// Draw the timeline as SVG.
    #[arg(long, help_heading = "Output", value_name = "FILE.svg")]
    plot: Option<PathBuf>,
    /// Verify the invariants every iteration.
    #[arg(long, help_heading = "Output")]
    check: bool,
    /// No progress bar.
    #[arg(long, help_heading = "Output")]
    no_progress: bool,
    /// Seed of the adapter assignment, sessions and draft acceptance.
    #[arg(long, help_heading = "Output", value_name = "N", default_value_t = SimOptions::default().seed)]
    seed: u64,
}

/// `--adapter-paging`'s value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum AdapterPaging {
    /// Two fixed pools, KV and adapters (the reference).
    Split,
    /// One page space for KV and adapters.
    Unified,
}

/// `--chunking`'s value: a policy, or none.
#[derive(Debug, Clone, Copy)]
struct ChunkingChoice(Option<ChunkPolicy>);

fn chunking(v: &str) -> Result<ChunkingChoice, String> {
    Ok(ChunkingChoice(match v {
        "none" => None,
        "fcfs" => Some(ChunkPolicy::FirstComeFirstServed),
        "force_chunk" => Some(ChunkPolicy::ForceChunk),
        "equal_progress" => Some(ChunkPolicy::EqualProgress),
        _ => {
            return Err(format!(
                "unknown policy {v:?} (fcfs, force_chunk, equal_progress, none)"
            ))
        }
    }))
}

/// The capacity policy `--policy NAME` (and a policy sweep) names.
pub(super) fn policy(v: &str) -> Result<CapacityPolicy, String> {
    match v {
        "max_utilization" => Ok(CapacityPolicy::MaxUtilization),
        "guaranteed_no_evict" => Ok(CapacityPolicy::GuaranteedNoEvict),
        _ => Err(format!(
            "unknown policy {v:?} (max_utilization, guaranteed_no_evict)"
        )),
    }
}

fn synthetic(v: &str) -> Result<(f64, f64, f64), String> {
    let parts: Vec<&str> = v.split(':').collect();
    let f = |k: usize, d: f64| -> Result<f64, String> {
        parts.get(k).map_or(Ok(d), |p| {
            p.parse().map_err(|_| format!("{p:?} is not a number"))
        })
    };
    Ok((f(0, 0.0)?, f(1, 1.0)?, f(2, 300.0)?))
}

fn spec_decode(v: &str) -> Result<super::SpecDecode, String> {
    let (k, p) = v.split_once(':').ok_or_else(|| {
        format!("expected K:ACCEPT (draft tokens per step, acceptance probability), got {v:?}")
    })?;
    Ok(super::SpecDecode {
        drafts: k
            .parse()
            .map_err(|_| format!("{k:?} is not a number of draft tokens"))?,
        accept: p
            .parse()
            .map_err(|_| format!("{p:?} is not a probability"))?,
    })
}

/// Parses the arguments after `simulate`. `Err` carries clap's error: usage mistakes (exit 2), and the
/// help text (exit 0).
pub fn parse(args: &[String]) -> Result<Cli, clap::Error> {
    let a: SimArgs = crate::args::parse("kvsched simulate", args)?;
    let invalid = |m: String| clap::Error::raw(clap::error::ErrorKind::ValueValidation, m + "\n");
    let mut o = SimOptions {
        kv_host_pages: a.kv_host_pages,
        tokens_per_block: a.tokens_per_block,
        max_tokens: a.max_tokens,
        max_batch: a.max_batch,
        policy: a.policy,
        chunking: a.chunking.0.map(|policy| Chunking {
            policy,
            unit: a.chunk_unit,
        }),
        recompute_pause: !a.no_recompute_pause,
        prefix_reuse: !a.no_prefix_reuse,
        spec_decode: a.spec_decode,
        draft_kv_pages: a.draft_kv_pages.unwrap_or(0),
        deadlock_threshold: a.deadlock_threshold,
        slo_ttft_ms: a.slo_ttft_ms,
        slo_tpot_ms: a.slo_tpot_ms,
        seed: a.seed,
        check: a.check,
        progress: !a.no_progress,
        engine: a.engine,
        cost: a.engine.model(a.tokens_per_block),
        admission: super::admission(&a.admission, a.slo_ttft_ms).map_err(invalid)?,
        drain_after: a.drain_after,
        ..SimOptions::default()
    };
    o.adapters.count = a.adapters;
    o.adapters.law = a.popularity;
    o.adapters.ranks = a.ranks;
    o.adapters.pages_per_rank8 = a.pages_per_rank8;
    o.adapters.device_pages = a.adapter_device_pages;
    o.adapters.host_pages = a.adapter_host_pages;
    o.adapters.unified = a.adapter_paging == AdapterPaging::Unified;
    o.replicas = a.replicas;
    o.route = a.route;
    o.remote_store = a.remote_store;
    o.disagg = a.disagg;
    // The engine's device fixes the KV pool unless the command line says otherwise.
    if let Some(pages) = a.kv_gpu_pages.or(a.engine.kv_gpu_pages(a.tokens_per_block)) {
        o.kv_gpu_pages = pages;
    }
    // A term given on the command line overrides the preset's, whatever the order.
    let terms = [
        (a.step_us, &mut o.cost.step_us),
        (a.prefill_us_per_token, &mut o.cost.prefill_us_per_token),
        (a.decode_us_per_request, &mut o.cost.decode_us_per_request),
        (
            a.decode_us_per_cached_token,
            &mut o.cost.decode_us_per_cached_token,
        ),
        (a.attention_us_per_pair, &mut o.cost.attention_us_per_pair),
        (
            a.adapter_load_us_per_page,
            &mut o.cost.adapter_load_us_per_page,
        ),
        (a.page_copy_us, &mut o.cost.page_copy_us),
    ];
    for (given, term) in terms {
        if let Some(v) = given {
            *term = v;
        }
    }
    o.cost.check().map_err(invalid)?;
    for (flag, slo) in [
        ("--slo-ttft-ms", o.slo_ttft_ms),
        ("--slo-tpot-ms", o.slo_tpot_ms),
    ] {
        if slo.is_some_and(|v| !(v.is_finite() && v > 0.0)) {
            return Err(invalid(format!(
                "{flag} must be a positive number of milliseconds"
            )));
        }
    }
    if a.time_scale.is_some_and(|f| !(f.is_finite() && f > 0.0)) {
        return Err(invalid("--time-scale must be a positive number".into()));
    }
    if a.trace.is_some() && a.synthetic.is_some() {
        return Err(invalid("give a trace or --synthetic, not both".into()));
    }
    Ok(Cli {
        opts: o,
        trace: a.trace,
        format: a.format,
        synthetic: a.synthetic,
        limit: a.limit,
        time_scale: a.time_scale,
        json: a.json,
        plot: a.plot,
        sweep: a.sweep,
    })
}

/// Loads the workload the command line names.
pub fn workload(c: &Cli) -> Result<Workload, String> {
    let mut w = if let Some((rate, cv, secs)) = c.synthetic {
        generate(&SyntheticSpec::slora(rate, cv, secs, c.opts.seed))
            .map_err(|e| format!("--synthetic: {e}"))?
    } else if let Some(p) = &c.trace {
        match c.format {
            Some(f) => workload::load_as(p, f),
            None => workload::load(p),
        }
        .map_err(|e| e.to_string())?
    } else {
        workload::parse(DEFAULT_TRACE, Path::new(DEFAULT_TRACE_NAME), c.format)
            .map_err(|e| e.to_string())?
    };
    if let Some(n) = c.limit {
        w.arrivals.truncate(n);
    }
    if let Some(f) = c.time_scale {
        w.scale_time(f);
    }
    if w.arrivals.is_empty() {
        return Err("the workload has no requests".into());
    }
    Ok(w)
}

/// Runs `kvsched simulate`.
pub fn main(args: &[String]) -> ExitCode {
    let cli = match parse(args) {
        Ok(c) => c,
        Err(e) => return crate::args::exit(&e),
    };
    if let Some(sweep) = &cli.sweep {
        return main_sweep(&cli, sweep);
    }
    let w = match workload(&cli) {
        Ok(w) => w,
        Err(e) => {
            eprintln!("kvsched simulate: {e}");
            return ExitCode::from(2);
        }
    };
    let report = match run(&cli.opts, w) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("kvsched simulate: {e}");
            return ExitCode::FAILURE;
        }
    };
    print!("{}", report.table(cli.opts.check));
    if let Some(p) = &cli.json {
        let text = serde_json::to_string_pretty(&report.json()).unwrap_or_default();
        if let Err(e) = crate::stats::write_atomic(p, (text + "\n").as_bytes()) {
            eprintln!("kvsched simulate: --json {}: {e}", p.display());
            return ExitCode::FAILURE;
        }
    }
    if let Some(p) = &cli.plot {
        if let Err(e) = crate::plot::write_svg_atomic(p, &report.timeline()) {
            eprintln!("kvsched simulate: --plot {}: {e}", p.display());
            return ExitCode::FAILURE;
        }
    }
    if cli.opts.check && report.invariant_violations > 0 {
        eprintln!(
            "kvsched simulate: {} invariant violations",
            report.invariant_violations
        );
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

/// `kvsched simulate --sweep`: one run per value, a table, and the curve and reports when asked.
fn main_sweep(cli: &Cli, sweep: &super::sweep::Sweep) -> ExitCode {
    let reports = match sweep.run(cli) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("kvsched simulate: {e}");
            return ExitCode::FAILURE;
        }
    };
    let source = reports.first().map_or("", |r| r.source.as_str());
    println!("kvsched simulate --sweep: {source}\n");
    print!("{}", sweep.table(&reports));
    if let Some(p) = &cli.json {
        let all: Vec<serde_json::Value> = reports.iter().map(|r| r.json()).collect();
        let text = serde_json::to_string_pretty(&all).unwrap_or_default();
        if let Err(e) = crate::stats::write_atomic(p, (text + "\n").as_bytes()) {
            eprintln!("kvsched simulate: --json {}: {e}", p.display());
            return ExitCode::FAILURE;
        }
    }
    if let Some(p) = &cli.plot {
        if let Err(e) = crate::plot::write_svg_atomic(p, &sweep.plot(&reports, source)) {
            eprintln!("kvsched simulate: --plot {}: {e}", p.display());
            return ExitCode::FAILURE;
        }
    }
    let violations: u64 = reports.iter().map(|r| r.invariant_violations).sum();
    if cli.opts.check && violations > 0 {
        eprintln!("kvsched simulate: {violations} invariant violations");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
