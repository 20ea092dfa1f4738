//! Hybrid recurrent models on the command line: `kvsched simulate`'s hybrid flags (`--hybrid-preset`
//! and its overrides), their errors in the flags' terms, and `kvsched hybrid-sweep`: the hybrid
//! against its full-attention twin over prompt lengths at equal GPU bytes
//! (`kvsched_sim::hybrid`).

use std::process::ExitCode;

use kvsched_sim::hybrid::sweep::{HybridSweep, HybridSweepError};
use kvsched_sim::hybrid::{HybridError, HybridLayout, HybridModel, HybridOptions, MODELS};

use crate::cost::CostFlags;

/// `kvsched simulate`'s hybrid flags.
#[derive(Debug, clap::Args)]
#[command(next_help_heading = "Hybrid recurrent model (docs/HYBRID.md)")]
pub struct HybridArgs {
    /// Run a hybrid recurrent model: --kv-gpu-pages becomes its memory budget in pages of the same
    /// model with every mixer layer full attention [default: the H200's], split into attention
    /// pages and state slots; the engine's step costs are scaled to the layout.
    #[arg(long, value_name = "nemotron-h-8b", value_parser = model)]
    hybrid_preset: Option<HybridModel>,
    /// hybrid, or the same model with every mixer layer full attention on the whole budget.
    #[arg(long, value_enum, default_value_t = LayoutArg::Hybrid, requires = "hybrid_preset")]
    hybrid_layout: LayoutArg,
    /// GPU state slots snapshots may hold (0: no prefix reuse on the hybrid).
    #[arg(
        long,
        value_name = "N",
        default_value_t = 64,
        requires = "hybrid_preset"
    )]
    state_snapshots: u32,
    /// Tokens between snapshot points (a multiple of --tokens-per-block).
    #[arg(
        long,
        value_name = "TOKENS",
        default_value_t = 512,
        requires = "hybrid_preset"
    )]
    snapshot_interval: u32,
    /// The request length the budget is split for [default: the workload's mean prompt + output].
    #[arg(long, value_name = "TOKENS", requires = "hybrid_preset",
          value_parser = clap::value_parser!(u32).range(1..))]
    hybrid_context: Option<u32>,
    /// GPU state slots, snapshots' included [default: as the split gives].
    #[arg(long, value_name = "N", requires = "hybrid_preset")]
    state_gpu_slots: Option<u32>,
}

/// `--hybrid-layout`'s value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum LayoutArg {
    /// Attention pages beside one state slot per request.
    Hybrid,
    /// Every mixer layer full attention.
    FullAttention,
}

impl HybridArgs {
    /// The simulator's hybrid options (`None`: no preset).
    pub fn options(&self) -> Option<HybridOptions> {
        let model = self.hybrid_preset?;
        Some(HybridOptions {
            layout: match self.hybrid_layout {
                LayoutArg::Hybrid => HybridLayout::Hybrid,
                LayoutArg::FullAttention => HybridLayout::FullAttention,
            },
            sized_for: self.hybrid_context,
            state_gpu_slots: self.state_gpu_slots,
            ..HybridOptions::new(model, self.state_snapshots, self.snapshot_interval)
        })
    }
}

fn model(v: &str) -> Result<HybridModel, String> {
    HybridModel::named(v).ok_or_else(|| {
        let names: Vec<_> = MODELS.iter().map(|m| m.name).collect();
        format!("unknown hybrid model {v:?} ({})", names.join(", "))
    })
}

/// A hybrid refusal in the command line's terms.
pub fn message(e: &HybridError) -> String {
    match e {
        HybridError::Unsupported(what) => {
            format!("--hybrid-preset does not support {what} yet: drop that option or --hybrid-preset")
        }
        HybridError::State {
            gpu_slots,
            snapshot_slots,
            interval,
            source,
        } => format!(
            "the state pool refused {gpu_slots} GPU slots with --state-snapshots {snapshot_slots} and --snapshot-interval {interval} ({source}): change --state-snapshots, --snapshot-interval or --state-gpu-slots"
        ),
        HybridError::Budget { .. } => format!("{e}: raise --kv-gpu-pages or lower --state-gpu-slots"),
    }
}

/// `kvsched hybrid-sweep`'s options; the defaults are [`HybridSweep::new`]'s.
#[derive(Debug, clap::Parser)]
#[command(
    name = "kvsched hybrid-sweep",
    about = "A hybrid recurrent model against the same model with every mixer layer full attention, over prompt lengths, at equal GPU bytes.",
    long_about = "A hybrid recurrent model against its full-attention twin over prompt lengths, at equal GPU \
        bytes. At each prompt length the H200's KV budget (0.9 of its memory less the weights) becomes one \
        pool of every mixer layer's KV (full), or attention pages beside one state slot per request, \
        split for that prompt and the output (hybrid). Two runs of the same workload on each: every request at once \
        (peak and mean running batch, throughput), and Poisson arrivals at --rate (goodput under \
        --slo-ttft-ms and --slo-tpot-ms). Step costs: the engine's, scaled to each layout's \
        attention (docs/HYBRID.md). Prints a Markdown table."
)]
struct SweepArgs {
    /// The model.
    #[arg(long, value_name = "nemotron-h-8b", default_value = "nemotron-h-8b", value_parser = model)]
    model: HybridModel,
    /// Prompt lengths, ascending.
    #[arg(long, value_name = "N,N,...", value_delimiter = ',',
          default_values_t = HybridSweep::new(MODELS[0]).prompts)]
    prompts: Vec<u32>,
    /// Requests per run.
    #[arg(long, value_name = "N", default_value_t = HybridSweep::new(MODELS[0]).requests,
          value_parser = clap::value_parser!(u32).range(1..))]
    requests: u32,
    /// Output tokens of every request.
    #[arg(long, value_name = "N", default_value_t = HybridSweep::new(MODELS[0]).output_tokens,
          value_parser = clap::value_parser!(u32).range(1..))]
    output_tokens: u32,
    /// Poisson arrivals per second of the goodput run.
    #[arg(long, value_name = "R", default_value_t = HybridSweep::new(MODELS[0]).rate,
          value_parser = positive)]
    rate: f64,
    /// Most requests in a batch.
    #[arg(long, value_name = "N", default_value_t = HybridSweep::new(MODELS[0]).base.max_batch)]
    max_batch: u32,
    /// Time-to-first-token objective of goodput.
    #[arg(long, value_name = "MS", default_value_t = 5000.0, value_parser = positive)]
    slo_ttft_ms: f64,
    /// Time-per-output-token objective of goodput.
    #[arg(long, value_name = "MS", default_value_t = 50.0, value_parser = positive)]
    slo_tpot_ms: f64,
    /// Seed of the arrivals.
    #[arg(long, value_name = "N", default_value_t = 1)]
    seed: u64,
    /// Keep the engine's step costs for both layouts (only the memory differs) instead of scaling
    /// them to each layout's attention and state.
    #[arg(long)]
    unscaled_costs: bool,
    #[command(flatten)]
    cost: CostFlags,
}

fn positive(v: &str) -> Result<f64, String> {
    v.parse::<f64>()
        .ok()
        .filter(|f| f.is_finite() && *f > 0.0)
        .ok_or_else(|| format!("{v:?} is not a positive number"))
}

/// The sweep the command line asks for.
fn sweep(a: &SweepArgs) -> Result<HybridSweep, String> {
    if a.prompts.windows(2).any(|w| w[0] >= w[1]) {
        return Err("--prompts must ascend".into());
    }
    let mut s = HybridSweep::new(a.model);
    s.prompts.clone_from(&a.prompts);
    s.requests = a.requests;
    s.output_tokens = a.output_tokens;
    s.rate = a.rate;
    s.base.max_batch = a.max_batch;
    let tpb = s.base.tokens_per_block;
    s.base.cost = a.cost.model(tpb)?;
    s.base.engine = a.cost.engine;
    s.base.slo_ttft_ms = Some(a.slo_ttft_ms);
    s.base.slo_tpot_ms = Some(a.slo_tpot_ms);
    s.base.seed = a.seed;
    s.scale_costs = !a.unscaled_costs;
    Ok(s)
}

/// A sweep error in the command line's terms.
fn sweep_message(e: &HybridSweepError) -> String {
    match e {
        HybridSweepError::Run {
            prompt,
            layout,
            source,
        } => format!(
            "prompt {prompt}, {layout}: {}",
            crate::simulate::sim_message(source)
        ),
        other => other.to_string(),
    }
}

/// Runs `kvsched hybrid-sweep`.
pub fn cli(args: &[String]) -> ExitCode {
    let a: SweepArgs = match crate::args::parse("kvsched hybrid-sweep", args) {
        Ok(a) => a,
        Err(e) => return crate::args::exit(&e),
    };
    let s = match sweep(&a) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("kvsched hybrid-sweep: {e}");
            return ExitCode::from(2);
        }
    };
    match s.run() {
        Ok(rows) => {
            let m = &s.model;
            println!(
                "kvsched hybrid-sweep: {} ({} layers: {} attention, {} Mamba-2; {} KV bytes a token, full-attention twin {}; state {:.1} MB), {:.1} GB of KV on an H200, engine {}{}; {} requests of {} output tokens, batch up to {}, paced at {} /s, SLO {} ms TTFT / {} ms TPOT\n",
                m.name,
                m.layers,
                m.attention_layers,
                m.mamba_layers,
                m.attention_bytes_per_token(),
                m.full_bytes_per_token(),
                m.state_bytes() as f64 / 1e6,
                m.h200_kv_budget_bytes() / 1e9,
                s.base.engine.label(&s.base.cost, s.base.tokens_per_block),
                if s.scale_costs {
                    " scaled to each layout"
                } else {
                    " unscaled (the same for both layouts)"
                },
                s.requests,
                s.output_tokens,
                s.base.max_batch,
                s.rate,
                a.slo_ttft_ms,
                a.slo_tpot_ms,
            );
            print!("{}", kvsched_sim::hybrid::sweep::table(&rows));
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("kvsched hybrid-sweep: {}", sweep_message(&e));
            ExitCode::FAILURE
        }
    }
}
