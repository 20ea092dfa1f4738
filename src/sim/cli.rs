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

/// Help text.
pub const HELP: &str = "usage: kvsched simulate [TRACE] [options]

Replays a request trace through the real scheduler on a simulated engine. Without TRACE it replays the
shipped slice of the Azure 2023 conversation trace (data/azure_conv_head.csv, 1500 requests), with
32 LoRA adapters assigned by a seeded power:0.8 popularity law (--adapters 0 turns LoRA off).

workload:
  TRACE                        Azure 2023 CSV, Mooncake JSONL or BurstGPT CSV (format sniffed)
  --format azure|mooncake|burstgpt   force the trace format
  --synthetic RATE[:CV[:SECONDS]]    gamma arrivals (cv 1 = Poisson), S-LoRA lengths, instead of a trace
  --limit N                    replay only the first N requests
  --time-scale F               multiply arrival times by F (F < 1 = heavier load)
KV cache:
  --kv-gpu-pages N (what the engine's GPU holds beside the weights: 28,519 pages of 32 tokens on
                               h200-llama3-8b; 640 on legacy)  --kv-host-pages N (4096, 0 = no host tier)
  --tokens-per-block N (32)
  --no-prefix-reuse            no prefix cache (compare). Reuse follows the trace's prefix blocks
                               (Mooncake hash_ids, 512 tokens: --tokens-per-block must divide or be a
                               multiple of 512); traces without them get multi-turn sessions over
                               per-adapter system prompts (16-token blocks, see workload::sessions)
adapters (multi-LoRA):
  --adapters N (32, 0 = no LoRA)  --popularity power:A|zipf:S|uniform (power:0.8)  --ranks 8,16,32,64
  --pages-per-rank8 N (2)  --adapter-device-pages N (64)  --adapter-host-pages N (1024)
speculative decoding:
  --spec-decode K:ACCEPT       K draft tokens a decode step, each accepted with probability ACCEPT after
                               the ones before it: a step keeps 1 + the accepted run; a joint draft pool
                               holds the draft model's KV; rejected drafts' slots are given back
  --draft-kv-pages N (as many as --kv-gpu-pages)
scheduler:
  --max-tokens N (8192)  --max-batch N (256)  --policy max_utilization|guaranteed_no_evict
  --chunking fcfs|force_chunk|equal_progress|none (fcfs)  --chunk-unit N (64)  --no-recompute-pause
  --deadlock-threshold N (1000)
cost model (simulated microseconds; docs/COST.md, `kvsched cost`):
  --engine h200-llama3-8b|legacy (h200-llama3-8b)  a preset: a fit to a Llama-3-8B-shaped model on
                               one H200 (decode attention grows with context), or the first model's four
                               constants
  each term below overrides the preset's, whatever the order:
  --step-us F  --prefill-us-per-token F  --decode-us-per-request F  --decode-us-per-cached-token F
  --attention-us-per-pair F  --adapter-load-us-per-page F  --page-copy-us F   (values: docs/COST.md)
service-level objectives (goodput: requests per second that meet both, DistServe's definition):
  --slo-ttft-ms F  --slo-tpot-ms F
sweep (capacity planning):
  --sweep PARAM=V1,V2,...      one run per value of rate (arrival-rate scale), kv-gpu-pages, adapters,
                               max-batch or policy: a throughput-latency table; --plot draws the curve,
                               --json writes the reports as an array
output:
  --json FILE  --plot FILE.svg  --check (verify invariants every iteration)  --no-progress  --seed N (1)";

fn value<'a>(args: &'a [String], i: &mut usize, flag: &str) -> Result<&'a str, String> {
    *i += 1;
    args.get(*i)
        .map(String::as_str)
        .ok_or_else(|| format!("{flag} needs a value"))
}

fn num<T: std::str::FromStr>(args: &[String], i: &mut usize, flag: &str) -> Result<T, String> {
    let v = value(args, i, flag)?;
    v.parse()
        .map_err(|_| format!("{flag}: {v:?} is not a valid number"))
}

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

/// Parses the arguments after `simulate`.
pub fn parse(args: &[String]) -> Result<Cli, String> {
    let mut c = Cli::default();
    let o = &mut c.opts;
    let mut engine = Engine::DEFAULT;
    let mut kv_gpu_pages: Option<u32> = None;
    let mut cost_terms: Vec<(&str, f64)> = Vec::new();
    let mut i = 0;
    while i < args.len() {
        let a = args[i].as_str();
        match a {
            "--format" => {
                let v = value(args, &mut i, a)?;
                c.format = Some(v.parse().map_err(|_| {
                    format!("--format: unknown format {v:?} (azure, mooncake, burstgpt)")
                })?);
            }
            "--synthetic" => {
                let v = value(args, &mut i, a)?;
                let parts: Vec<&str> = v.split(':').collect();
                let f = |k: usize, d: f64| -> Result<f64, String> {
                    parts.get(k).map_or(Ok(d), |p| {
                        p.parse()
                            .map_err(|_| format!("--synthetic: {p:?} is not a number"))
                    })
                };
                c.synthetic = Some((f(0, 0.0)?, f(1, 1.0)?, f(2, 300.0)?));
            }
            "--limit" => c.limit = Some(num(args, &mut i, a)?),
            "--time-scale" => c.time_scale = Some(num(args, &mut i, a)?),
            "--kv-gpu-pages" => kv_gpu_pages = Some(num(args, &mut i, a)?),
            "--kv-host-pages" => o.kv_host_pages = num(args, &mut i, a)?,
            "--tokens-per-block" => o.tokens_per_block = num(args, &mut i, a)?,
            "--adapters" => o.adapters.count = num(args, &mut i, a)?,
            "--popularity" => {
                let v = value(args, &mut i, a)?;
                o.adapters.law = v
                    .parse::<PopularityLaw>()
                    .map_err(|e| format!("--popularity: {e}"))?;
            }
            "--ranks" => {
                let v = value(args, &mut i, a)?;
                o.adapters.ranks = v
                    .parse::<AdapterRanks>()
                    .map_err(|e| format!("--ranks: {e}"))?;
            }
            "--pages-per-rank8" => o.adapters.pages_per_rank8 = num(args, &mut i, a)?,
            "--adapter-device-pages" => o.adapters.device_pages = num(args, &mut i, a)?,
            "--adapter-host-pages" => o.adapters.host_pages = num(args, &mut i, a)?,
            "--max-tokens" => o.max_tokens = num(args, &mut i, a)?,
            "--max-batch" => o.max_batch = num(args, &mut i, a)?,
            "--policy" => {
                o.policy = match value(args, &mut i, a)? {
                    "max_utilization" => CapacityPolicy::MaxUtilization,
                    "guaranteed_no_evict" => CapacityPolicy::GuaranteedNoEvict,
                    v => {
                        return Err(format!(
                            "--policy: unknown policy {v:?} (max_utilization, guaranteed_no_evict)"
                        ))
                    }
                }
            }
            "--chunking" => {
                let unit = o.chunking.map_or(64, |c| c.unit);
                let policy = match value(args, &mut i, a)? {
                    "none" => None,
                    "fcfs" => Some(ChunkPolicy::FirstComeFirstServed),
                    "force_chunk" => Some(ChunkPolicy::ForceChunk),
                    "equal_progress" => Some(ChunkPolicy::EqualProgress),
                    v => return Err(format!("--chunking: unknown policy {v:?} (fcfs, force_chunk, equal_progress, none)")),
                };
                o.chunking = policy.map(|policy| Chunking { policy, unit });
            }
            "--chunk-unit" => {
                let unit = num(args, &mut i, a)?;
                if let Some(c) = o.chunking.as_mut() {
                    c.unit = unit;
                }
            }
            "--no-recompute-pause" => o.recompute_pause = false,
            "--deadlock-threshold" => o.deadlock_threshold = num(args, &mut i, a)?,
            "--no-prefix-reuse" => o.prefix_reuse = false,
            "--spec-decode" => {
                let v = value(args, &mut i, a)?;
                let (k, p) = v.split_once(':').ok_or_else(|| {
                    format!("--spec-decode: expected K:ACCEPT (draft tokens per step, acceptance probability), got {v:?}")
                })?;
                o.spec_decode = Some(super::SpecDecode {
                    drafts: k.parse().map_err(|_| {
                        format!("--spec-decode: {k:?} is not a number of draft tokens")
                    })?,
                    accept: p
                        .parse()
                        .map_err(|_| format!("--spec-decode: {p:?} is not a probability"))?,
                });
            }
            "--draft-kv-pages" => o.draft_kv_pages = num(args, &mut i, a)?,
            "--engine" => engine = Engine::parse(value(args, &mut i, a)?)?,
            "--slo-ttft-ms" => o.slo_ttft_ms = Some(num(args, &mut i, a)?),
            "--slo-tpot-ms" => o.slo_tpot_ms = Some(num(args, &mut i, a)?),
            "--step-us"
            | "--prefill-us-per-token"
            | "--decode-us-per-request"
            | "--decode-us-per-cached-token"
            | "--attention-us-per-pair"
            | "--adapter-load-us-per-page"
            | "--page-copy-us" => cost_terms.push((a, num(args, &mut i, a)?)),
            "--json" => c.json = Some(PathBuf::from(value(args, &mut i, a)?)),
            "--sweep" => c.sweep = Some(super::sweep::Sweep::parse(value(args, &mut i, a)?)?),
            "--plot" => c.plot = Some(PathBuf::from(value(args, &mut i, a)?)),
            "--check" => o.check = true,
            "--no-progress" => o.progress = false,
            "--seed" => o.seed = num(args, &mut i, a)?,
            s if s.starts_with('-') => {
                return Err(format!(
                    "unknown option {s:?} (see kvsched simulate --help)"
                ))
            }
            s => {
                if c.trace.is_some() {
                    return Err(format!("one trace at a time ({s:?} is a second one)"));
                }
                c.trace = Some(PathBuf::from(s));
            }
        }
        i += 1;
    }
    o.cost = engine.model(o.tokens_per_block);
    // The engine's device fixes the KV pool unless the command line says otherwise.
    if let Some(pages) = kv_gpu_pages.or(engine.kv_gpu_pages(o.tokens_per_block)) {
        o.kv_gpu_pages = pages;
    }
    for (flag, v) in cost_terms {
        let term = match flag {
            "--step-us" => &mut o.cost.step_us,
            "--prefill-us-per-token" => &mut o.cost.prefill_us_per_token,
            "--decode-us-per-request" => &mut o.cost.decode_us_per_request,
            "--decode-us-per-cached-token" => &mut o.cost.decode_us_per_cached_token,
            "--attention-us-per-pair" => &mut o.cost.attention_us_per_pair,
            "--adapter-load-us-per-page" => &mut o.cost.adapter_load_us_per_page,
            _ => &mut o.cost.page_copy_us,
        };
        *term = v;
    }
    o.cost.check()?;
    for (flag, slo) in [
        ("--slo-ttft-ms", o.slo_ttft_ms),
        ("--slo-tpot-ms", o.slo_tpot_ms),
    ] {
        if slo.is_some_and(|v| !(v.is_finite() && v > 0.0)) {
            return Err(format!("{flag} must be a positive number of milliseconds"));
        }
    }
    o.engine = engine;
    if c.time_scale.is_some_and(|f| !(f.is_finite() && f > 0.0)) {
        return Err("--time-scale must be a positive number".into());
    }
    if c.trace.is_some() && c.synthetic.is_some() {
        return Err("give a trace or --synthetic, not both".into());
    }
    Ok(c)
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
    if args.iter().any(|a| a == "-h" || a == "--help") {
        println!("{HELP}");
        return ExitCode::SUCCESS;
    }
    let cli = match parse(args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("kvsched simulate: {e}");
            return ExitCode::from(2);
        }
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
