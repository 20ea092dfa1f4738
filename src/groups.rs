//! `kvsched groups-sweep`: a hybrid-attention model's KV as one pool (full-only) against KV groups
//! (a full-attention group and a sliding-window group), over context lengths: the requests that fit,
//! the peak running batch, throughput and goodput (`kvsched_sim::groups`).

use std::process::ExitCode;

use kvsched_sim::groups::{GroupsSweep, GroupsSweepError, LayerPattern, PATTERNS};

use crate::cost::CostFlags;

/// `kvsched groups-sweep`'s options; the defaults are [`GroupsSweep::new`]'s.
#[derive(Debug, clap::Parser)]
#[command(
    name = "kvsched groups-sweep",
    about = "Full-only against grouped KV (a full-attention and a sliding-window group) over context lengths.",
    long_about = "Full-only against grouped KV over context lengths. At each context the H200's KV budget \
        (0.9 of its memory less the model's weights) becomes one pool of every layer's KV (full-only), \
        or a full-attention group and a sliding-window group split in proportion to what one request of \
        that context holds in each (grouped). Two runs of the same workload on each: every request at \
        once (the peak running batch, throughput), and Poisson arrivals at --rate (goodput under \
        --slo-ttft-ms and --slo-tpot-ms). Prints a Markdown table."
)]
struct GroupsArgs {
    /// The model's layer pattern.
    #[arg(long, value_name = "gemma3-27b|gemma3-12b", default_value = "gemma3-27b",
          value_parser = pattern)]
    model: LayerPattern,
    /// Context lengths (prompt + output), ascending.
    #[arg(long, value_name = "N,N,...", value_delimiter = ',',
          default_values_t = GroupsSweep::new(PATTERNS[0]).contexts)]
    contexts: Vec<u32>,
    /// Requests per run.
    #[arg(long, value_name = "N", default_value_t = GroupsSweep::new(PATTERNS[0]).requests,
          value_parser = clap::value_parser!(u32).range(1..))]
    requests: u32,
    /// Output tokens of every request.
    #[arg(long, value_name = "N", default_value_t = GroupsSweep::new(PATTERNS[0]).output_tokens,
          value_parser = clap::value_parser!(u32).range(1..))]
    output_tokens: u32,
    /// Poisson arrivals per second of the goodput run.
    #[arg(long, value_name = "R", default_value_t = GroupsSweep::new(PATTERNS[0]).rate,
          value_parser = positive)]
    rate: f64,
    /// Time-to-first-token objective of goodput.
    #[arg(long, value_name = "MS", default_value_t = 5000.0, value_parser = positive)]
    slo_ttft_ms: f64,
    /// Time-per-output-token objective of goodput.
    #[arg(long, value_name = "MS", default_value_t = 50.0, value_parser = positive)]
    slo_tpot_ms: f64,
    /// Tokens per KV page (a divisor of the window).
    #[arg(long, value_name = "N", default_value_t = GroupsSweep::new(PATTERNS[0]).base.tokens_per_block)]
    tokens_per_block: u32,
    /// Seed of the arrivals.
    #[arg(long, value_name = "N", default_value_t = 1)]
    seed: u64,
    #[command(flatten)]
    cost: CostFlags,
}

fn pattern(v: &str) -> Result<LayerPattern, String> {
    LayerPattern::named(v).ok_or_else(|| {
        let names: Vec<_> = PATTERNS.iter().map(|p| p.name).collect();
        format!("unknown model {v:?} ({})", names.join(", "))
    })
}

fn positive(v: &str) -> Result<f64, String> {
    v.parse::<f64>()
        .ok()
        .filter(|f| f.is_finite() && *f > 0.0)
        .ok_or_else(|| format!("{v:?} is not a positive number"))
}

/// The sweep the command line asks for.
fn sweep(a: &GroupsArgs) -> Result<GroupsSweep, String> {
    if a.contexts.windows(2).any(|w| w[0] >= w[1]) {
        return Err("--contexts must ascend".into());
    }
    let mut s = GroupsSweep::new(a.model);
    s.contexts.clone_from(&a.contexts);
    s.requests = a.requests;
    s.output_tokens = a.output_tokens;
    s.rate = a.rate;
    s.base.tokens_per_block = a.tokens_per_block;
    s.base.cost = a.cost.model(a.tokens_per_block)?;
    s.base.engine = a.cost.engine;
    s.base.slo_ttft_ms = Some(a.slo_ttft_ms);
    s.base.slo_tpot_ms = Some(a.slo_tpot_ms);
    s.base.seed = a.seed;
    Ok(s)
}

/// A sweep error in the command line's terms.
fn message(e: &GroupsSweepError) -> String {
    match e {
        GroupsSweepError::Run {
            context,
            layout,
            source,
        } => format!(
            "context {context}, {layout}: {}",
            crate::simulate::sim_message(source)
        ),
        other => other.to_string(),
    }
}

/// Runs `kvsched groups-sweep`.
pub fn cli(args: &[String]) -> ExitCode {
    let a: GroupsArgs = match crate::args::parse("kvsched groups-sweep", args) {
        Ok(a) => a,
        Err(e) => return crate::args::exit(&e),
    };
    let s = match sweep(&a) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("kvsched groups-sweep: {e}");
            return ExitCode::from(2);
        }
    };
    match s.run() {
        Ok(rows) => {
            let p = &s.pattern;
            println!(
                "kvsched groups-sweep: {} ({} layers, {} global, window {}), {:.1} GB of KV on an H200, engine {}; {} requests of {} output tokens, paced at {} /s, SLO {} ms TTFT / {} ms TPOT\n",
                p.name,
                p.layers,
                p.full_layers,
                p.window,
                p.h200_kv_budget_bytes() / 1e9,
                s.base.engine.label(&s.base.cost, s.base.tokens_per_block),
                s.requests,
                s.output_tokens,
                s.rate,
                a.slo_ttft_ms,
                a.slo_tpot_ms,
            );
            print!("{}", kvsched_sim::groups::table(&rows));
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("kvsched groups-sweep: {}", message(&e));
            ExitCode::FAILURE
        }
    }
}
