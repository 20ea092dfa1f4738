//! `kvsched cost`, and the cost-model flags it shares with `kvsched simulate` ([`CostFlags`]).

use std::fmt::Write as _;
use std::process::ExitCode;

use kvsched_sim::cost::{
    read_points, BadCost, CostModel, CostTerm, Engine, FitError, MeasuredKind, MeasuredStep,
    StepWork, MASKED_STEP_US, MASKED_US_PER_PAIR,
};
use kvsched_sim::SimOptions;

/// The cost model on a command line (`kvsched simulate`, `kvsched cost`): a preset, and any term that
/// overrides the preset's.
#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = "Cost model (simulated microseconds)")]
pub struct CostFlags {
    /// The cost model's preset: a fit to a Llama-3-8B-shaped model on one H200 (decode attention grows
    /// with context), or the first model's four constants. Each term below overrides the preset's
    /// (values: docs/COST.md).
    #[arg(long, value_name = Engine::NAMES, default_value_t = Engine::DEFAULT, value_parser = Engine::parse)]
    pub engine: Engine,
    /// Fixed cost of one step.
    #[arg(long, value_name = "F")]
    pub step_us: Option<f64>,
    /// Per prefill token (and verified draft token).
    #[arg(long, value_name = "F")]
    pub prefill_us_per_token: Option<f64>,
    /// Per decode request.
    #[arg(long, value_name = "F")]
    pub decode_us_per_request: Option<f64>,
    /// Per cached token a decode step reads.
    #[arg(long, value_name = "F")]
    pub decode_us_per_cached_token: Option<f64>,
    /// Per (query, key) pair of a chunk's attention.
    #[arg(long, value_name = "F")]
    pub attention_us_per_pair: Option<f64>,
    /// Per adapter page loaded.
    #[arg(long, value_name = "F")]
    pub adapter_load_us_per_page: Option<f64>,
    /// Per KV page moved between tiers.
    #[arg(long, value_name = "F")]
    pub page_copy_us: Option<f64>,
}

impl CostFlags {
    /// The preset's model for pages of `tokens_per_block` tokens, with the terms given in place of its
    /// own; refused when a term is not finite or negative.
    pub fn model(&self, tokens_per_block: u32) -> Result<CostModel, String> {
        let preset = self.engine.model(tokens_per_block);
        let m = CostModel {
            step_us: self.step_us.unwrap_or(preset.step_us),
            prefill_us_per_token: self
                .prefill_us_per_token
                .unwrap_or(preset.prefill_us_per_token),
            decode_us_per_request: self
                .decode_us_per_request
                .unwrap_or(preset.decode_us_per_request),
            decode_us_per_cached_token: self
                .decode_us_per_cached_token
                .unwrap_or(preset.decode_us_per_cached_token),
            attention_us_per_pair: self
                .attention_us_per_pair
                .unwrap_or(preset.attention_us_per_pair),
            adapter_load_us_per_page: self
                .adapter_load_us_per_page
                .unwrap_or(preset.adapter_load_us_per_page),
            page_copy_us: self.page_copy_us.unwrap_or(preset.page_copy_us),
        };
        m.check().map_err(|e| bad_cost_message(&e))?;
        Ok(m)
    }
}

/// A refused coefficient by the flag that gave it: `--step-us inf: a cost must be finite and not negative`.
fn bad_cost_message(e: &BadCost) -> String {
    let flag = format!("--{}", e.term.name().replace('_', "-"));
    format!("{flag} {}: a cost must be finite and not negative", e.value)
}

/// `kvsched cost`'s options.
#[derive(Debug, clap::Parser)]
#[command(
    name = "kvsched cost",
    about = "Predicts one forward step's time under a cost model (docs/COST.md)."
)]
struct CostArgs {
    /// Tokens per KV page (sets the page-copy cost).
    #[arg(long, value_name = "N", default_value_t = SimOptions::default().tokens_per_block, value_parser = clap::value_parser!(u32).range(1..))]
    tokens_per_block: u32,
    /// BATCH decode requests at CONTEXT tokens each (repeatable).
    #[arg(long, value_name = "BATCH:CONTEXT", value_parser = decode_arg)]
    decode: Vec<(u64, u64)>,
    /// A prefill chunk of TOKENS after PRIOR tokens of context (repeatable).
    #[arg(long, value_name = "TOKENS[:PRIOR]", value_parser = prefill_arg)]
    prefill: Vec<(u64, u64)>,
    /// The chunks' attention on the masked kernel of the mixed measurements.
    #[arg(long)]
    masked: bool,
    /// Instead: every measured step of the JSON-lines FILEs, its prediction and error; fails when the
    /// median error is over 10 % or one is over 25 %.
    #[arg(long, value_name = "FILE", num_args = 1..)]
    points: Vec<String>,
    /// Instead: fits the floor, prefill-token, decode-request, cached-token and attention-pair terms
    /// to the measured steps of the JSON-lines FILEs (least squares on relative error, each term at
    /// least zero; the other terms are the preset's), prints them as the flags that set them, and
    /// every point against the fit; fails as --points does.
    #[arg(long, value_name = "FILE", num_args = 1.., conflicts_with = "points")]
    fit: Vec<String>,
    /// One JSON object: {"step_ms": …} (with --points: the points and errors).
    #[arg(long)]
    json: bool,
    // Last: the flattened group's heading holds for what follows it.
    #[command(flatten)]
    cost: CostFlags,
}

fn decode_arg(v: &str) -> Result<(u64, u64), String> {
    let (b, c) = v
        .split_once(':')
        .ok_or(format!("expected BATCH:CONTEXT, got {v:?}"))?;
    let n = |x: &str| x.parse().map_err(|_| format!("{x:?} is not a number"));
    Ok((n(b)?, n(c)?))
}

fn prefill_arg(v: &str) -> Result<(u64, u64), String> {
    let (t, p) = v.split_once(':').unwrap_or((v, "0"));
    let n = |x: &str| {
        x.parse()
            .map_err(|_| format!("{x:?} is not a number of tokens"))
    };
    Ok((n(t)?, n(p)?))
}

/// `kvsched cost`.
pub fn cli(args: &[String]) -> ExitCode {
    let a: CostArgs = match crate::args::parse("kvsched cost", args) {
        Ok(a) => a,
        Err(e) => return crate::args::exit(&e),
    };
    match cost_command(&a) {
        Ok((text, ok)) => {
            println!("{text}");
            if ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("kvsched cost: {e}");
            ExitCode::from(2)
        }
    }
}

fn cost_command(a: &CostArgs) -> Result<(String, bool), String> {
    let tpb = a.tokens_per_block;
    let mut work = StepWork::default();
    for &(batch, context) in &a.decode {
        for _ in 0..batch {
            work.decode(context, 0);
        }
    }
    for &(tokens, prior) in &a.prefill {
        work.chunk(tokens, prior);
    }
    let mut model = a.cost.model(tpb)?;
    let mut engine = a.cost.engine.label(&model, tpb);
    if a.points.is_empty() && a.fit.is_empty() {
        return Ok((step(&model, &work, &engine, a), true));
    }
    let all = read_all(if a.fit.is_empty() { &a.points } else { &a.fit })?;
    let mut flags = String::new();
    if !a.fit.is_empty() {
        model = kvsched_sim::fit::fit(&all, &model).map_err(|e| format!("--fit: {e}"))?;
        flags = fitted_flags(&model);
        engine = format!("fitted to {} (`{flags}`)", a.fit.join(" "));
    }
    let fit = FitError::of(&model, &all);
    let ok = fit.median() <= 0.10 && fit.max() <= 0.25;
    let text = if a.json {
        points_json(&model, &all, &fit, &engine)
    } else if flags.is_empty() {
        points_table(&model, &all, &fit, &engine, ok)
    } else {
        format!(
            "{flags}\n\n{}",
            points_table(&model, &all, &fit, &engine, ok)
        )
    };
    Ok((text, ok))
}

/// The measured steps of every file.
fn read_all(files: &[String]) -> Result<Vec<MeasuredStep>, String> {
    let mut all = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(f).map_err(|e| format!("{f}: {e}"))?;
        all.extend(read_points(&text, f).map_err(|e| e.to_string())?);
    }
    Ok(all)
}

/// The flags that set a fitted model's five fitted terms (the first five of [`CostTerm::ALL`]).
fn fitted_flags(m: &CostModel) -> String {
    let flags: Vec<String> = CostTerm::ALL[..5]
        .iter()
        .map(|&t| format!("--{} {:.6}", t.name().replace('_', "-"), m.term(t)))
        .collect();
    flags.join(" ")
}

/// One step's predicted time: `12.345 ms (engine)`, or `{"step_ms": …}`.
fn step(model: &CostModel, work: &StepWork, engine: &str, a: &CostArgs) -> String {
    let extra = if a.masked && work.prefill_tokens > 0 {
        MASKED_STEP_US + work.attention_pairs * MASKED_US_PER_PAIR
    } else {
        0.0
    };
    let ms = (model.step_us(work) + extra) / 1000.0;
    if a.json {
        serde_json::json!({ "step_ms": ms }).to_string()
    } else {
        format!("{ms:.3} ms ({engine})")
    }
}

/// The measured points, their predictions and the errors, as one JSON object.
fn points_json(model: &CostModel, all: &[MeasuredStep], fit: &FitError, engine: &str) -> String {
    let rows: Vec<serde_json::Value> = all
        .iter()
        .map(|p| {
            serde_json::json!({
                "kind": format!("{:?}", p.kind), "batch": p.batch, "context": p.context,
                "tokens": p.tokens, "prior": p.chunk_prior_context,
                "measured_ms": p.ms_median, "predicted_ms": p.predicted_ms(model),
            })
        })
        .collect();
    let v = serde_json::json!({
        "engine": engine, "points": rows,
        "median_error": fit.median(), "max_error": fit.max(),
    });
    v.to_string()
}

/// The measured points, their predictions and the errors, as a Markdown table and a verdict.
fn points_table(
    model: &CostModel,
    all: &[MeasuredStep],
    fit: &FitError,
    engine: &str,
    ok: bool,
) -> String {
    let mut s = String::from(
        "| step | decode batch × context | chunk (prior) | measured ms | predicted ms | error |\n|---|---|---|---|---|---|\n",
    );
    for p in all {
        let predicted = p.predicted_ms(model);
        let kind = match p.kind {
            MeasuredKind::Decode => "decode (eager)",
            MeasuredKind::DecodeGraph => "decode (CUDA graph)",
            MeasuredKind::Prefill => "prefill",
            MeasuredKind::Mixed if p.tokens > 0 => "mixed (masked chunk)",
            MeasuredKind::Mixed => "mixed (decode only)",
            MeasuredKind::Step => "step",
        };
        let _ = writeln!(
            s,
            "| {kind} | {} × {} | {} ({}) | {:.2} | {:.2} | {:+.1} % |",
            p.batch,
            p.context,
            p.tokens,
            p.chunk_prior_context,
            p.ms_median,
            predicted,
            100.0 * (predicted - p.ms_median) / p.ms_median
        );
    }
    let _ = write!(
        s,
        "\n{} points, engine {engine}: median error {:.1} %, largest {:.1} % (targets 10 % and 25 %: {})",
        all.len(),
        100.0 * fit.median(),
        100.0 * fit.max(),
        if ok { "met" } else { "MISSED" }
    );
    s
}
