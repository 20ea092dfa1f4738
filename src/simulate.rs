//! `kvsched simulate`: option parsing, the run (or the sweep's runs), and the simulator's errors in
//! terms of the flags.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::ArgAction;
use kvsched_core::config::{Admission, CapacityPolicy, ChunkPolicy, Chunking};
use kvsched_sim::cluster::{RemoteStoreOptions, Route};
use kvsched_sim::disagg::DisaggOptions;
use kvsched_sim::faults::{LinkFaults, StoreFaults};
use kvsched_sim::groups::{GroupsUnsupported, KvGroupsOptions};
use kvsched_sim::sweep::Sweep;
use kvsched_sim::{run, OptionsError, Report, SimError, SimOptions, SpecDecode};
use kvsched_workload::popularity::{AdapterRanks, PopularityLaw};
use kvsched_workload::synthetic::{generate, SyntheticSpec};
use kvsched_workload::{self as workload, TraceFormat, Workload};

use crate::args::one_of;
use crate::cost::CostFlags;

/// The trace the default run replays (a CC-BY-4.0 slice of the Azure 2023 conversation trace; see
/// data/README.md).
pub const DEFAULT_TRACE: &str = include_str!("../data/azure_conv_head.csv");
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
    pub sweep: Option<Sweep>,
    /// Options given that do nothing in this configuration: one line each, for stderr.
    pub warnings: Vec<String>,
}

/// The defaults of every option: `SimOptions::default()`'s, written once.
fn d() -> SimOptions {
    SimOptions::default()
}

/// `kvsched simulate`'s options: clap derives the parser and the help from these groups, one heading
/// each; the defaults are [`d`]'s.
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
    #[command(flatten)]
    workload: WorkloadArgs,
    #[command(flatten)]
    kv: KvArgs,
    #[command(flatten)]
    hybrid: crate::hybrid::HybridArgs,
    #[command(flatten)]
    adapters: AdapterArgs,
    #[command(flatten)]
    spec: SpecArgs,
    #[command(flatten)]
    sched: SchedulerArgs,
    #[command(flatten)]
    cluster: ClusterArgs,
    #[command(flatten)]
    cost: CostFlags,
    #[command(flatten)]
    slo: SloArgs,
    #[command(flatten)]
    output: OutputArgs,
}

#[derive(Debug, clap::Args)]
#[command(next_help_heading = "Workload")]
struct WorkloadArgs {
    /// Azure 2023 CSV, Mooncake JSONL or BurstGPT CSV (format sniffed).
    trace: Option<PathBuf>,
    /// Force the trace format.
    #[arg(long, value_name = "azure|mooncake|burstgpt", value_parser = |v: &str| v.parse::<TraceFormat>())]
    format: Option<TraceFormat>,
    /// Gamma arrivals (cv 1 = Poisson) with S-LoRA lengths, instead of a trace.
    #[arg(long, value_name = "RATE[:CV[:SECONDS]]", value_parser = synthetic)]
    synthetic: Option<(f64, f64, f64)>,
    /// Replay only the first N requests.
    #[arg(long, value_name = "N")]
    limit: Option<usize>,
    /// Multiply arrival times by F (F < 1 = heavier load).
    #[arg(long, value_name = "F", value_parser = positive)]
    time_scale: Option<f64>,
}

#[derive(Debug, clap::Args)]
#[command(next_help_heading = "KV cache")]
struct KvArgs {
    /// GPU KV pages [default: what the engine's GPU holds beside the weights: 28,519 pages of 32 tokens
    /// on h200-llama3-8b, 640 on legacy].
    #[arg(long, value_name = "N")]
    kv_gpu_pages: Option<u32>,
    /// Host KV pages (0 = no host tier).
    #[arg(long, value_name = "N", default_value_t = d().kv_host_pages)]
    kv_host_pages: u32,
    /// Tokens per KV page.
    #[arg(long, value_name = "N", default_value_t = d().tokens_per_block)]
    tokens_per_block: u32,
    /// No prefix cache. Reuse follows the trace's prefix blocks (Mooncake hash_ids, 512 tokens:
    /// --tokens-per-block must divide or be a multiple of 512); traces without them get multi-turn
    /// sessions over per-adapter system prompts (16-token blocks, see workload::sessions).
    #[arg(long = "no-prefix-reuse", action = ArgAction::SetFalse)]
    prefix_reuse: bool,
    /// Samples of each request (OpenAI's n): once a request's prompt is computed, its other N - 1
    /// samples are forked off it, sharing its full pages (needs the prefix cache); the report counts
    /// the forks and the pages they shared.
    #[arg(long, value_name = "N", default_value_t = d().samples)]
    samples: u32,
    /// Two priority classes: this share (0 to 1) of the requests is of high priority (0), the rest
    /// low (1); the report gives each class's TTFT, TPOT and goodput. With --admission priority a
    /// high one makes a running low one yield; with fcfs the classes are only reported.
    #[arg(long, value_name = "SHARE")]
    priority_mix: Option<f64>,
    /// The thrash guard: while a request recomputed twice or more waits to replay, no younger new
    /// request or replay is admitted (docs/ADMISSION.md).
    #[arg(long)]
    thrash_guard: bool,
    /// The high class's reserved share (with --priority-mix; service classes, docs/ADMISSION.md):
    /// batch slots, KV tokens and adapter pages its requests take back from the low class's when
    /// they wait, lent while unused.
    #[arg(long, value_name = "requests=N,kv_tokens=N,adapter_pages=N", value_parser = class_share)]
    class_share: Option<kvsched_core::config::Share>,
    /// KV groups (a hybrid-attention model): the KV pool is the full-attention group, beside a
    /// sliding-window group of WINDOW tokens (a multiple of --tokens-per-block) with PAGES GPU pages
    /// and HOST_PAGES host pages (default 0); docs/KV-GROUPS.md.
    #[arg(long, value_name = "WINDOW:PAGES[:HOST_PAGES]", value_parser = kv_groups)]
    kv_groups: Option<KvGroupsOptions>,
}

#[derive(Debug, clap::Args)]
#[command(next_help_heading = "Adapters (multi-LoRA)")]
struct AdapterArgs {
    /// LoRA adapters (0 = no LoRA).
    #[arg(long, value_name = "N", default_value_t = d().adapters.count)]
    adapters: u32,
    /// Adapter popularity law.
    #[arg(long, value_name = "power:A|zipf:S|uniform", default_value_t = d().adapters.law,
          value_parser = |v: &str| v.parse::<PopularityLaw>())]
    popularity: PopularityLaw,
    /// Adapter ranks, assigned in turn.
    #[arg(long, value_name = "R,R,...", default_value_t = d().adapters.ranks,
          value_parser = |v: &str| v.parse::<AdapterRanks>())]
    ranks: AdapterRanks,
    /// Adapter pages per rank 8.
    #[arg(long, value_name = "N", default_value_t = d().adapters.pages_per_rank8)]
    pages_per_rank8: u32,
    /// Device pages of the adapter cache.
    #[arg(long, value_name = "N", default_value_t = d().adapters.device_pages)]
    adapter_device_pages: u32,
    /// Host pages of the adapter cache.
    #[arg(long, value_name = "N", default_value_t = d().adapters.host_pages)]
    adapter_host_pages: u32,
    /// split: the adapters' device pages are a cache of their own (the reference); unified: they join
    /// the KV pool, one page space for KV and adapters with one eviction order (S-LoRA).
    #[arg(long, value_enum, default_value_t = AdapterPaging::of(d().adapters.unified))]
    adapter_paging: AdapterPaging,
}

#[derive(Debug, clap::Args)]
#[command(next_help_heading = "Speculative decoding")]
struct SpecArgs {
    /// K draft tokens a decode step, each accepted with probability ACCEPT after the ones before it: a
    /// step keeps 1 + the accepted run; a joint draft pool holds the draft model's KV; rejected drafts'
    /// slots are given back.
    #[arg(long, value_name = "K:ACCEPT", value_parser = spec_decode)]
    spec_decode: Option<SpecDecode>,
    /// GPU pages of the joint draft pool (0 = as many as the target's).
    #[arg(long, value_name = "N", default_value_t = d().draft_kv_pages)]
    draft_kv_pages: u32,
}

#[derive(Debug, clap::Args)]
#[command(next_help_heading = "Scheduler")]
struct SchedulerArgs {
    /// Token budget per pass.
    #[arg(long, value_name = "N", default_value_t = d().max_tokens)]
    max_tokens: u32,
    /// Most requests in a batch.
    #[arg(long, value_name = "N", default_value_t = d().max_batch)]
    max_batch: u32,
    /// Capacity policy.
    #[arg(long, value_name = "max_utilization|guaranteed_no_evict", default_value = d().policy.name(),
          value_parser = one_of(CapacityPolicy::ALL, CapacityPolicy::name))]
    policy: CapacityPolicy,
    /// Admission order of waiting requests (beyond the reference): fcfs, vtc (virtual token
    /// counters per adapter) or deadline (an adapter's class is its id mod 4; class c's TTFT
    /// deadline is 2^c times --slo-ttft-ms, else 500 ms).
    #[arg(long, value_name = "fcfs|vtc|deadline|priority", default_value = d().admission.name())]
    admission: String,
    /// Under vtc or deadline: passes a request may be refused its adapter before admissions drain
    /// for it (no new leases until it loads; 0 = never).
    #[arg(long, value_name = "N", default_value_t = d().drain_after)]
    drain_after: u32,
    /// Chunked prefill.
    #[arg(long, value_name = "fcfs|force_chunk|equal_progress|none",
          default_value = d().chunking.map_or("none", |c| c.policy.name()), value_parser = chunking)]
    chunking: ChunkingChoice,
    /// Chunk unit in tokens.
    #[arg(long, value_name = "N", default_value_t = d().chunking.map_or(64, |c| c.unit))]
    chunk_unit: u32,
    /// No destructive recompute pause.
    #[arg(long = "no-recompute-pause", action = ArgAction::SetFalse)]
    recompute_pause: bool,
    /// Stalled passes before the deadlock error.
    #[arg(long, value_name = "N", default_value_t = d().deadlock_threshold)]
    deadlock_threshold: u32,
}

#[derive(Debug, clap::Args)]
#[command(next_help_heading = "Cluster")]
struct ClusterArgs {
    /// Engines behind the router, each with its own scheduler and pools.
    #[arg(long, value_name = "N", default_value_t = d().replicas,
          value_parser = clap::value_parser!(u32).range(1..=1024))]
    replicas: u32,
    /// How the router spreads requests: in turn, or by their first prefix block.
    #[arg(long, value_enum, default_value_t = RouteArg::of(d().route))]
    route: RouteArg,
    /// `--route kv`: the weight of the prefill blocks against the decode blocks in the router's cost
    /// (Dynamo's `--kv-overlap-score-weight`; higher favours cache hits, 0 balances load only).
    #[arg(long, value_name = "W", default_value_t = d().kv_overlap_weight, value_parser = non_negative)]
    kv_overlap_weight: f64,
    /// A KV store the replicas share, PAGES blocks (a remote read: LATENCY_US µs plus the pages over
    /// GBPS GB/s; defaults 50 and 25), as every engine's KV connector; needs prefix reuse.
    #[arg(long, value_name = "PAGES[:LATENCY_US[:GBPS]]",
          value_parser = |v: &str| v.parse::<RemoteStoreOptions>().map_err(|e| format!("--remote-store: {e}")))]
    remote_store: Option<RemoteStoreOptions>,
    /// Prefill/decode disaggregation: P prefill engines hand each computed prompt's KV to one of D
    /// decode engines (a transfer: LATENCY_US µs plus the KV over GBPS GB/s; defaults 50 and 50).
    /// Replaces --replicas; --route spreads the arrivals over the prefill engines.
    #[arg(long, value_name = "P:D[:LATENCY_US[:GBPS]]", conflicts_with = "replicas",
          value_parser = |v: &str| v.parse::<DisaggOptions>().map_err(|e| format!("--disagg: {e}")))]
    disagg: Option<DisaggOptions>,
    /// The remote store's faults, at the given rates (seeded by --seed): a load that fails, one never
    /// confirmed (the pool abandons it after its timeout), a save never acknowledged (its pages pinned
    /// until the timeout); the report counts them and the recomputes they cause.
    #[arg(long, value_name = "LOAD_FAIL[:LOAD_STALL[:SAVE_LOST]]", requires = "remote_store",
          value_parser = |v: &str| v.parse::<StoreFaults>().map_err(|e| format!("--store-faults: {e}")))]
    store_faults: Option<StoreFaults>,
    /// The disaggregation link's faults, at the given rates (seeded by --seed): a transfer that fails,
    /// or one that stalls and is given up TIMEOUT_MS after it started (default 500); each prompt is
    /// recomputed on its decode engine.
    #[arg(long, value_name = "FAIL[:STALL[:TIMEOUT_MS]]", requires = "disagg",
          value_parser = |v: &str| v.parse::<LinkFaults>().map_err(|e| format!("--link-faults: {e}")))]
    link_faults: Option<LinkFaults>,
}

#[derive(Debug, clap::Args)]
#[command(next_help_heading = "Goodput and sweeps (capacity planning)")]
struct SloArgs {
    /// Time-to-first-token objective for goodput (requests per second that meet both objectives,
    /// DistServe's definition).
    #[arg(long, value_name = "MS", value_parser = positive)]
    slo_ttft_ms: Option<f64>,
    /// Time-per-output-token objective for goodput.
    #[arg(long, value_name = "MS", value_parser = positive)]
    slo_tpot_ms: Option<f64>,
    /// One run per value of rate (arrival-rate scale), kv-gpu-pages, adapters, max-batch, policy or
    /// admission: a throughput-latency table; --plot draws the curve, --json writes the reports as an
    /// array.
    #[arg(long, value_name = "PARAM=V1,V2,...",
          value_parser = |v: &str| Sweep::parse(v).map_err(|e| format!("--sweep: {e}")))]
    sweep: Option<Sweep>,
}

#[derive(Debug, clap::Args)]
#[command(next_help_heading = "Output")]
struct OutputArgs {
    /// Write the report as JSON.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Draw the timeline as SVG.
    #[arg(long, value_name = "FILE.svg")]
    plot: Option<PathBuf>,
    /// Verify the invariants: after every iteration what it touched (the rows it listed, the pools'
    /// counters, the leases, the output), and the exact audit of every page every --check-every
    /// iterations and at the end of the run; `--check=full` runs the exact audit after every
    /// iteration (O(pages) each). Either also runs the simulation a second time with every pass a
    /// full one (--full-passes) and fails unless every pass did the same in both.
    #[arg(long, value_enum, value_name = "MODE", num_args = 0..=1, require_equals = true,
        default_missing_value = "spot")]
    check: Option<CheckMode>,
    /// Iterations between two exact audits under --check.
    #[arg(long, value_name = "K", requires = "check",
        default_value_t = kvsched_sim::check::DEFAULT_AUDIT_EVERY,
        value_parser = clap::value_parser!(u64).range(1..))]
    check_every: u64,
    /// Every pass a full one: the incremental pass (which keeps a steady decode batch and makes only
    /// its KV calls again) off.
    #[arg(long)]
    full_passes: bool,
    /// No progress bar.
    #[arg(long = "no-progress", action = ArgAction::SetFalse)]
    progress: bool,
    /// Seed of the adapter assignment, sessions and draft acceptance.
    #[arg(long, value_name = "N", default_value_t = d().seed)]
    seed: u64,
}

/// What `--check` runs after every iteration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum CheckMode {
    /// The spot checks of what the iteration touched; the exact audit every --check-every iterations.
    Spot,
    /// The exact audit after every iteration.
    Full,
}

/// `--adapter-paging`'s value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum AdapterPaging {
    /// Two fixed pools, KV and adapters (the reference).
    Split,
    /// One page space for KV and adapters.
    Unified,
}

impl AdapterPaging {
    fn of(unified: bool) -> Self {
        if unified {
            Self::Unified
        } else {
            Self::Split
        }
    }
}

/// `--route`'s value: the simulator's [`Route`], spelled as the command line spells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum RouteArg {
    /// In turn.
    #[value(name = "round_robin")]
    RoundRobin,
    /// To the replica with the fewest requests outstanding when it arrives.
    #[value(name = "least_loaded")]
    LeastLoaded,
    /// By the request's first prefix block (requests without one: in turn).
    #[value(name = "prefix_affinity")]
    PrefixAffinity,
    /// By the cost a KV-aware router fed by the replicas' KV events gives it (Dynamo's: overlap
    /// weight 1.0 × prefill blocks + decode blocks).
    #[value(name = "kv")]
    Kv,
}

impl RouteArg {
    fn of(route: Route) -> Self {
        match route {
            Route::RoundRobin => Self::RoundRobin,
            Route::LeastLoaded => Self::LeastLoaded,
            Route::PrefixAffinity => Self::PrefixAffinity,
            Route::Kv => Self::Kv,
        }
    }

    fn route(self) -> Route {
        match self {
            Self::RoundRobin => Route::RoundRobin,
            Self::LeastLoaded => Route::LeastLoaded,
            Self::PrefixAffinity => Route::PrefixAffinity,
            Self::Kv => Route::Kv,
        }
    }
}

/// `--chunking`'s value: a policy, or none.
#[derive(Debug, Clone, Copy)]
struct ChunkingChoice(Option<ChunkPolicy>);

fn chunking(v: &str) -> Result<ChunkingChoice, String> {
    match v {
        "none" => Ok(ChunkingChoice(None)),
        v => one_of(ChunkPolicy::ALL, ChunkPolicy::name)(v).map(|p| ChunkingChoice(Some(p))),
    }
}

fn positive(v: &str) -> Result<f64, String> {
    v.parse::<f64>()
        .ok()
        .filter(|f| f.is_finite() && *f > 0.0)
        .ok_or_else(|| format!("{v:?} is not a positive number"))
}

fn non_negative(v: &str) -> Result<f64, String> {
    v.parse::<f64>()
        .ok()
        .filter(|f| f.is_finite() && *f >= 0.0)
        .ok_or_else(|| format!("{v:?} is not a number at least 0"))
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

fn kv_groups(v: &str) -> Result<KvGroupsOptions, String> {
    let parts: Vec<&str> = v.split(':').collect();
    let n = |k: usize| -> Result<u32, String> {
        parts.get(k).map_or(Ok(0), |p| {
            p.parse().map_err(|_| format!("{p:?} is not a number"))
        })
    };
    if !(2..=3).contains(&parts.len()) {
        return Err(format!(
            "expected WINDOW:PAGES[:HOST_PAGES] (the sliding window's tokens, its group's GPU and host pages), got {v:?}"
        ));
    }
    Ok(KvGroupsOptions {
        window: n(0)?,
        window_gpu_pages: n(1)?,
        window_host_pages: n(2)?,
    })
}

/// `requests=N,kv_tokens=N,adapter_pages=N` (each optional, absent 0).
fn class_share(v: &str) -> Result<kvsched_core::config::Share, String> {
    v.parse().map_err(|e: &str| format!("{e}, got {v:?}"))
}

fn spec_decode(v: &str) -> Result<SpecDecode, String> {
    let (k, p) = v.split_once(':').ok_or_else(|| {
        format!("expected K:ACCEPT (draft tokens per step, acceptance probability), got {v:?}")
    })?;
    Ok(SpecDecode {
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
    use clap::{CommandFactory as _, FromArgMatches as _};
    let m = SimArgs::command().try_get_matches_from(
        std::iter::once("kvsched simulate".to_string()).chain(args.iter().cloned()),
    )?;
    let a = SimArgs::from_arg_matches(&m)?;
    let invalid = |m: String| clap::Error::raw(clap::error::ErrorKind::ValueValidation, m + "\n");
    if a.workload.trace.is_some() && a.workload.synthetic.is_some() {
        return Err(invalid("give a trace or --synthetic, not both".into()));
    }
    let opts = options(&a).map_err(invalid)?;
    plot_fits(a.output.plot.as_deref(), &opts, a.slo.sweep.is_some()).map_err(invalid)?;
    let warnings = idle_options(&m, &opts);
    let (w, out) = (a.workload, a.output);
    Ok(Cli {
        opts,
        trace: w.trace,
        format: w.format,
        synthetic: w.synthetic,
        limit: w.limit,
        time_scale: w.time_scale,
        json: out.json,
        plot: out.plot,
        sweep: a.slo.sweep,
        warnings,
    })
}

/// The options given on the command line that do nothing under `o`, each with why.
fn idle_options(m: &clap::ArgMatches, o: &SimOptions) -> Vec<String> {
    let given = |id: &str| m.value_source(id) == Some(clap::parser::ValueSource::CommandLine);
    let engines = o.disagg.map_or(o.replicas, |d| d.prefill);
    let mut w = Vec::new();
    if given("route") && engines <= 1 {
        w.push("--route does nothing: there is one engine to route to (add --replicas N or --disagg P:D with P above 1)".to_string());
    }
    if given("remote_store") && o.replicas <= 1 && o.disagg.is_none() {
        w.push("--remote-store has one replica: no other engine shares the store, so it serves only what this engine's own cache evicted (add --replicas N)".to_string());
    }
    if given("drain_after") && o.admission == Admission::Fcfs {
        w.push(
            "--drain-after does nothing under --admission fcfs: it applies to vtc and deadline"
                .to_string(),
        );
    }
    w
}

/// `--plot`'s file: an `.svg`, and a timeline the run draws (one engine's; a sweep draws its curve).
fn plot_fits(plot: Option<&Path>, o: &SimOptions, sweep: bool) -> Result<(), String> {
    let Some(p) = plot else { return Ok(()) };
    if !p.extension().is_some_and(|e| e.eq_ignore_ascii_case("svg")) {
        return Err(format!(
            "--plot {}: the plot is SVG; name a file ending in .svg",
            p.display()
        ));
    }
    let cluster = o.replicas > 1 || o.disagg.is_some() || o.remote_store.is_some();
    if cluster && !sweep {
        return Err(
            "--plot draws one engine's timeline; it cannot draw a cluster (--replicas above 1, --disagg or --remote-store): drop --plot or those options"
                .into(),
        );
    }
    Ok(())
}

/// The simulator's options from the parsed flags; a refusal's message names the flag.
fn options(a: &SimArgs) -> Result<SimOptions, String> {
    let (kv, ad, s, out) = (&a.kv, &a.adapters, &a.sched, &a.output);
    let tpb = kv.tokens_per_block;
    if kv.priority_mix.is_some_and(|m| !(0.0..=1.0).contains(&m)) {
        return Err("--priority-mix is the high class's share of the requests, 0 to 1".into());
    }
    if kv.class_share.is_some() && kv.priority_mix.is_none() {
        return Err("--class-share is the high class's share: it needs --priority-mix".into());
    }
    let hybrid = a.hybrid.options();
    Ok(SimOptions {
        // The engine's device (or a hybrid preset's) fixes the KV pool unless the command line says
        // otherwise.
        kv_gpu_pages: kv
            .kv_gpu_pages
            .or(hybrid.map(|h| h.model.h200_full_pages(tpb)))
            .or(a.cost.engine.kv_gpu_pages(tpb))
            .unwrap_or(kvsched_sim::cost::LEGACY_KV_GPU_PAGES),
        kv_host_pages: kv.kv_host_pages,
        tokens_per_block: tpb,
        prefix_reuse: kv.prefix_reuse,
        samples: kv.samples,
        priority_mix: kv.priority_mix,
        thrash_guard: kv.thrash_guard,
        class_share: kv.class_share,
        adapters: kvsched_sim::AdapterOptions {
            count: ad.adapters,
            law: ad.popularity,
            ranks: ad.ranks.clone(),
            pages_per_rank8: ad.pages_per_rank8,
            device_pages: ad.adapter_device_pages,
            host_pages: ad.adapter_host_pages,
            unified: ad.adapter_paging == AdapterPaging::Unified,
        },
        spec_decode: a.spec.spec_decode,
        draft_kv_pages: a.spec.draft_kv_pages,
        max_tokens: s.max_tokens,
        max_batch: s.max_batch,
        policy: s.policy,
        admission: kvsched_sim::admission(&s.admission, a.slo.slo_ttft_ms)
            .map_err(|e| e.to_string())?,
        drain_after: s.drain_after,
        chunking: s.chunking.0.map(|policy| Chunking {
            policy,
            unit: s.chunk_unit,
        }),
        recompute_pause: s.recompute_pause,
        deadlock_threshold: s.deadlock_threshold,
        replicas: a.cluster.replicas,
        route: a.cluster.route.route(),
        kv_overlap_weight: a.cluster.kv_overlap_weight,
        remote_store: a.cluster.remote_store,
        disagg: a.cluster.disagg,
        store_faults: a.cluster.store_faults,
        link_faults: a.cluster.link_faults,
        kv_groups: kv.kv_groups,
        hybrid,
        cost: a.cost.model(tpb)?,
        engine: a.cost.engine,
        slo_ttft_ms: a.slo.slo_ttft_ms,
        slo_tpot_ms: a.slo.slo_tpot_ms,
        seed: out.seed,
        check: out.check.is_some(),
        check_every: if out.check == Some(CheckMode::Full) {
            1
        } else {
            out.check_every
        },
        full_passes: out.full_passes,
        progress: out.progress,
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
    if w.arrivals.is_empty() {
        return Err(no_requests(&w));
    }
    if let Some(n) = c.limit {
        w.arrivals.truncate(n);
    }
    if w.arrivals.is_empty() {
        return Err(format!(
            "--limit 0: {} has no requests left to replay",
            w.source
        ));
    }
    if let Some(f) = c.time_scale {
        w.scale_time(f);
    }
    Ok(w)
}

/// Why a workload read whole has no requests: which file, and what it held.
fn no_requests(w: &Workload) -> String {
    match w.dropped_rows {
        _ if matches!(w.source, workload::Source::Synthetic(_)) => format!(
            "--synthetic: no requests to replay: {} (raise RATE or SECONDS)",
            w.source
        ),
        0 => format!("{}: no requests to replay: the trace has no rows", w.source),
        n => format!(
            "{}: no requests to replay: every row ({n}) has a prompt or an output of 0 tokens, and such rows are dropped",
            w.source
        ),
    }
}

/// Runs every point of `sweep` on `base`'s workload and options (no progress bars); a failure's exit
/// status and message.
fn run_sweep(sweep: &Sweep, base: &Cli) -> Result<Vec<Report>, (ExitCode, String)> {
    let mut reports = Vec::with_capacity(sweep.values.len());
    for i in 0..sweep.values.len() {
        let point = sweep
            .point(i, &base.opts)
            .map_err(|e| (ExitCode::from(2), format!("--sweep: {e}")))?;
        let mut c = base.clone();
        c.opts = point.opts;
        c.opts.progress = false;
        if let Some(rate) = point.rate {
            c.time_scale = Some(c.time_scale.unwrap_or(1.0) / rate);
        }
        let w = workload(&c).map_err(|e| (ExitCode::from(2), e))?;
        let r = run(&c.opts, w).map_err(|e| {
            let m = format!("{}: {}", sweep.point_label(i), sim_message(&e));
            (sim_exit(&e), m)
        })?;
        reports.push(r);
    }
    Ok(reports)
}

/// The exit status of a simulator error: 2 for options refused before the run (a usage mistake, as
/// clap's are), 1 for a run that failed.
pub fn sim_exit(e: &SimError) -> ExitCode {
    match e {
        SimError::Options(_) => ExitCode::from(2),
        SimError::Replica { source, .. } => sim_exit(source),
        _ => ExitCode::FAILURE,
    }
}

/// A simulator error in the command line's terms: an option check names the flags to change.
pub fn sim_message(e: &SimError) -> String {
    match e {
        SimError::Options(o) => format!("options do not fit: {}", options_message(o)),
        SimError::Replica { replica, source } => {
            format!("replica {replica}: {}", sim_message(source))
        }
        other => other.to_string(),
    }
}

/// What to change, by flag, for an option check that failed.
fn options_message(e: &OptionsError) -> String {
    use kvsched_sim::{MAX_ADAPTERS, MAX_LIVE};
    match e {
        OptionsError::NoKvPool => "--tokens-per-block and --kv-gpu-pages must be at least 1".into(),
        OptionsError::NoBudget => "--max-batch and --max-tokens must be at least 1".into(),
        OptionsError::ChunkUnit { max_tokens, .. } => {
            format!("--chunk-unit must be between 1 and --max-tokens ({max_tokens})")
        }
        OptionsError::PromptOverBudget { prompt, max_tokens } => format!(
            "without chunking a {prompt}-token prompt never fits the {max_tokens}-token budget: raise --max-tokens or enable --chunking"
        ),
        OptionsError::PrefixBlocks { tokens_per_block, block } => format!(
            "--tokens-per-block {tokens_per_block} does not nest with the workload's {block}-token prefix blocks: use a divisor or a multiple of {block}, or --no-prefix-reuse"
        ),
        OptionsError::SpecDecode { drafts, accept } => format!(
            "--spec-decode {drafts}:{accept}: draft tokens between 1 and 64, acceptance between 0 and 1"
        ),
        OptionsError::OverDraftPool { longest, draft_pages } => format!(
            "a request of {longest} tokens (prompt + output + drafts) is longer than the whole draft pool ({draft_pages} pages): raise --draft-kv-pages"
        ),
        OptionsError::OverPool { longest, pages, tokens_per_block, pool_tokens } => format!(
            "a request of {longest} tokens (prompt + output) is longer than the whole KV pool ({pages} pages x {tokens_per_block} tokens = {pool_tokens}): raise --kv-gpu-pages or --tokens-per-block"
        ),
        OptionsError::PageTables { mib, max_blocks } => format!(
            "page tables would take {mib} MiB ({MAX_LIVE} requests x {max_blocks} pages): raise --tokens-per-block"
        ),
        OptionsError::TooManyAdapters => format!("--adapters is at most {MAX_ADAPTERS}"),
        OptionsError::AdapterTooLarge { id, rank, pages, device_pages, host_pages } => format!(
            "adapter {id} (rank {rank}) needs {pages} pages but the adapter cache has {device_pages} device and {host_pages} host pages: raise --adapter-device-pages/--adapter-host-pages or lower --pages-per-rank8"
        ),
        OptionsError::UnifiedNoRoom { longest, largest, total } => format!(
            "a request of {longest} tokens does not fit beside the largest adapter ({largest} pages) in the unified pool of {total} pages: raise --kv-gpu-pages or --adapter-device-pages"
        ),
        OptionsError::UnifiedTooLarge => {
            "the unified pool has too many pages: lower --kv-gpu-pages or --adapter-device-pages".into()
        }
        OptionsError::NoDecodeEngine => "--disagg needs a decode engine".into(),
        OptionsError::FaultsWithout { faults, needs } => format!("{faults} needs {needs}"),
        OptionsError::GroupsUnsupported(f) => {
            let flag = match f {
                GroupsUnsupported::SpecDecode => "--spec-decode",
                GroupsUnsupported::Connector => "--remote-store",
                GroupsUnsupported::Disaggregation => "--disagg",
                GroupsUnsupported::Replicas => "--replicas",
                GroupsUnsupported::UnifiedAdapters => "--adapter-paging unified",
            };
            format!("--kv-groups does not support {f} yet: drop {flag} or --kv-groups")
        }
        OptionsError::GroupWindow { window, tokens_per_block } => format!(
            "--kv-groups: a window of {window} tokens must be a positive multiple of --tokens-per-block ({tokens_per_block})"
        ),
        OptionsError::WindowPoolTooSmall { pages, needed } => format!(
            "--kv-groups: the window group's {pages} GPU pages cannot hold one request's window and chunk ({needed} pages): raise PAGES or lower --max-tokens"
        ),
        OptionsError::Hybrid(h) => crate::hybrid::message(h),
        other => other.to_string(),
    }
}

/// Runs `kvsched simulate`.
pub fn main(args: &[String]) -> ExitCode {
    let cli = match parse(args) {
        Ok(c) => c,
        Err(e) => return crate::args::exit(&e),
    };
    for w in &cli.warnings {
        eprintln!("kvsched simulate: warning: {w}");
    }
    if let Err(e) = outputs_writable(&cli) {
        eprintln!("kvsched simulate: {e}");
        return ExitCode::from(2);
    }
    match simulate(&cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err((code, e)) => {
            eprintln!("kvsched simulate: {e}");
            code
        }
    }
}

/// Every output file can be written where it is named, checked before the run: its folder exists,
/// and the path is not a folder. The message names the flag and the path.
fn outputs_writable(cli: &Cli) -> Result<(), String> {
    let outputs = [("--json", &cli.json), ("--plot", &cli.plot)];
    for (flag, p) in outputs.iter().filter_map(|(f, p)| Some((f, p.as_ref()?))) {
        let dir = match p.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        let why = if p.is_dir() || p.file_name().is_none() {
            "is a folder, not a file"
        } else if !dir.is_dir() {
            "its folder does not exist"
        } else {
            continue;
        };
        return Err(format!("{flag} {}: {why}", p.display()));
    }
    Ok(())
}

/// One run (its table, report and timeline) or a sweep (its table, its reports as an array and its
/// curve); the exit status and the message of a failure.
fn simulate(cli: &Cli) -> Result<(), (ExitCode, String)> {
    let fail = |e: String| (ExitCode::FAILURE, e);
    let reports = if let Some(sweep) = &cli.sweep {
        run_sweep(sweep, cli)?
    } else {
        let w = workload(cli).map_err(|e| (ExitCode::from(2), e))?;
        vec![run(&cli.opts, w).map_err(|e| (sim_exit(&e), sim_message(&e)))?]
    };
    let (json, timeline) = if let Some(sweep) = &cli.sweep {
        let source = reports.first().map_or("", |r| r.source.as_str());
        print!(
            "kvsched simulate --sweep: {source}\n\n{}",
            sweep.table(&reports)
        );
        let all: serde_json::Value = reports.iter().map(Report::json).collect();
        (all, sweep.plot(&reports, source))
    } else {
        print!("{}", reports[0].table(cli.opts.check));
        (reports[0].json(), reports[0].timeline())
    };
    if let Some(p) = &cli.json {
        let text = serde_json::to_string_pretty(&json).unwrap_or_default() + "\n";
        kvsched_sim::stats::write_atomic(p, text.as_bytes()).map_err(|e| {
            let why = kvsched_sim::stats::io_reason(&e);
            fail(format!("--json {}: {why}", p.display()))
        })?;
    }
    if let Some(p) = &cli.plot {
        kvsched_sim::plot::write_svg_atomic(p, &timeline).map_err(|e| {
            let why = match e {
                kvsched_sim::plot::PlotError::Io { message, .. } => message,
                other => other.to_string(),
            };
            fail(format!("--plot {}: {why}", p.display()))
        })?;
    }
    let violations: u64 = reports.iter().map(|r| r.invariant_violations).sum();
    if cli.opts.check && violations > 0 {
        return Err(fail(format!("{violations} invariant violations")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(args: &[&str]) -> SimOptions {
        let args: Vec<String> = args.iter().map(std::string::ToString::to_string).collect();
        parse(&args).expect("parses").opts
    }

    #[test]
    fn the_command_lines_defaults_are_the_options_defaults() {
        assert_eq!(opts(&[]), SimOptions::default());
    }

    #[test]
    fn the_engine_sizes_the_pool_unless_the_command_line_does() {
        assert_eq!(opts(&[]).kv_gpu_pages, 28_519);
        assert_eq!(opts(&["--tokens-per-block", "16"]).kv_gpu_pages, 57_038);
        assert_eq!(opts(&["--engine", "legacy"]).kv_gpu_pages, 640);
        assert_eq!(
            opts(&["--engine", "legacy", "--kv-gpu-pages", "9"]).kv_gpu_pages,
            9
        );
        let legacy = opts(&["--engine", "legacy", "--step-us", "7"]).cost;
        assert_eq!(legacy.step_us, 7.0);
        assert_eq!(
            legacy.page_copy_us,
            kvsched_sim::CostModel::LEGACY.page_copy_us
        );
    }
}
