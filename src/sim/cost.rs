//! What one forward step costs the simulated engine: a cost model with one term per kind of work, its
//! presets, and the measured points the H200 preset was fitted to (`docs/COST.md`).
//!
//! A step's work ([`StepWork`]) is what the scheduler's output asks of the engine: prefill chunk tokens
//! and the attention pairs they form with the context before them (chunk × prior + chunk² / 2, causal),
//! decode requests and the cached tokens their attention reads, verified draft tokens, adapter pages
//! loaded and KV pages moved. The cost is linear in each.

use std::fmt;

/// The simulated engine's cost per unit of work, in microseconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CostModel {
    /// Fixed cost of one forward step (the weights read once, launch overhead).
    pub step_us: f64,
    /// Per prefill (context) token, and per verified draft token: the matrix products.
    pub prefill_us_per_token: f64,
    /// Per decode request in the batch.
    pub decode_us_per_request: f64,
    /// Per cached token a decode request's attention reads (its context length).
    pub decode_us_per_cached_token: f64,
    /// Per (query, key) pair of a prefill chunk's attention: chunk × prior context + chunk² / 2.
    pub attention_us_per_pair: f64,
    /// Per adapter page copied host → device.
    pub adapter_load_us_per_page: f64,
    /// Per KV page moved between GPU and host (suspend / resume).
    pub page_copy_us: f64,
}

impl CostModel {
    /// The simulator's first model: four constants, no attention terms (a decode step costs the same
    /// at any context length).
    pub const LEGACY: Self = Self {
        step_us: 6000.0,
        prefill_us_per_token: 30.0,
        decode_us_per_request: 40.0,
        decode_us_per_cached_token: 0.0,
        attention_us_per_pair: 0.0,
        adapter_load_us_per_page: 50.0,
        page_copy_us: 80.0,
    };

    /// Fitted to a Llama-3-8B-shaped model on one H200 (`data/measurements/h200/`, decode steps
    /// replayed from CUDA graphs as serving engines run them; `docs/COST.md` has every point). The page
    /// copy cost follows from the KV page's bytes ([`LLAMA3_8B_KV_BYTES_PER_TOKEN`] times
    /// `tokens_per_block`) over the bandwidth measured for scattered pages of that size.
    pub fn h200_llama3_8b(tokens_per_block: u32) -> Self {
        let page_bytes = LLAMA3_8B_KV_BYTES_PER_TOKEN * f64::from(tokens_per_block);
        Self {
            step_us: 4319.09,
            prefill_us_per_token: 19.0706,
            decode_us_per_request: 14.3841,
            decode_us_per_cached_token: 0.0292573,
            attention_us_per_pair: 0.00104226,
            adapter_load_us_per_page: Self::LEGACY.adapter_load_us_per_page,
            page_copy_us: page_bytes / h200_scattered_copy_bytes_per_us(page_bytes),
        }
    }

    /// Simulated microseconds of one step.
    pub fn step_us(&self, w: &StepWork) -> f64 {
        self.step_us
            + (w.prefill_tokens + w.verified_tokens) as f64 * self.prefill_us_per_token
            + w.decode_requests as f64 * self.decode_us_per_request
            + w.decode_cached_tokens as f64 * self.decode_us_per_cached_token
            + w.attention_pairs * self.attention_us_per_pair
            + w.adapter_pages as f64 * self.adapter_load_us_per_page
            + w.page_moves as f64 * self.page_copy_us
    }

    /// The coefficients, for a refusal: every one finite and not negative.
    pub fn check(&self) -> Result<(), String> {
        let terms = [
            ("--step-us", self.step_us),
            ("--prefill-us-per-token", self.prefill_us_per_token),
            ("--decode-us-per-request", self.decode_us_per_request),
            (
                "--decode-us-per-cached-token",
                self.decode_us_per_cached_token,
            ),
            ("--attention-us-per-pair", self.attention_us_per_pair),
            ("--adapter-load-us-per-page", self.adapter_load_us_per_page),
            ("--page-copy-us", self.page_copy_us),
        ];
        match terms.iter().find(|(_, v)| !v.is_finite() || *v < 0.0) {
            Some((flag, v)) => Err(format!(
                "{flag} {v}: a cost must be finite and not negative"
            )),
            None => Ok(()),
        }
    }
}

/// KV bytes per token of a Llama-3-8B-shaped model: K and V, 32 layers, 8 KV heads of 128, bf16.
pub const LLAMA3_8B_KV_BYTES_PER_TOKEN: f64 = 2.0 * 32.0 * 8.0 * 128.0 * 2.0;

/// An H200's memory as `nvidia-smi` reports it on the measured machine (143,771 MiB).
pub const H200_MEMORY_BYTES: f64 = 143_771.0 * 1024.0 * 1024.0;
/// Llama-3-8B's weights in bf16 (8.03 billion parameters).
pub const LLAMA3_8B_WEIGHT_BYTES: f64 = 8.03e9 * 2.0;
/// The share of device memory an engine lets the weights and the KV cache take (the rest is
/// activations, workspace and the CUDA context; vLLM's default `gpu_memory_utilization`).
pub const GPU_MEMORY_UTILIZATION: f64 = 0.9;

/// KV pages of `tokens_per_block` tokens that fit an H200 serving Llama-3-8B: the memory an engine
/// uses, less the weights, over the KV bytes of a page (28,519 pages of 32 tokens: 912,608 tokens).
pub fn h200_llama3_8b_kv_pages(tokens_per_block: u32) -> u32 {
    let kv = H200_MEMORY_BYTES * GPU_MEMORY_UTILIZATION - LLAMA3_8B_WEIGHT_BYTES;
    let page = LLAMA3_8B_KV_BYTES_PER_TOKEN * f64::from(tokens_per_block.max(1));
    (kv / page).floor().clamp(1.0, f64::from(u32::MAX)) as u32
}

/// Bytes per microsecond of scattered page moves on the H200 (per-page copies, kvsched-gpu at 40c6ca8,
/// `../shared/measurements/h200/page-copy-bandwidth.txt`; the mean of both directions), interpolated on
/// the page size's logarithm and held at the ends.
fn h200_scattered_copy_bytes_per_us(page_bytes: f64) -> f64 {
    // (page bytes, GB/s = bytes per ns = 1000 bytes per us)
    const POINTS: [(f64, f64); 4] = [
        (4096.0, 1.60),
        (65536.0, 17.65),
        (262144.0, 36.56),
        (2097152.0, 51.76),
    ];
    let x = page_bytes.max(1.0).ln();
    let gbps = match POINTS.iter().position(|&(b, _)| b.ln() >= x) {
        None => POINTS[POINTS.len() - 1].1,
        Some(0) => POINTS[0].1,
        Some(i) => {
            let ((b0, g0), (b1, g1)) = (POINTS[i - 1], POINTS[i]);
            g0 + (g1 - g0) * (x - b0.ln()) / (b1.ln() - b0.ln())
        }
    };
    gbps * 1000.0
}

/// GPU KV pages of the legacy engine, which names no device: the simulator's first default.
pub const LEGACY_KV_GPU_PAGES: u32 = 640;

/// A named set of coefficients (`--engine NAME`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    /// [`CostModel::LEGACY`].
    Legacy,
    /// [`CostModel::h200_llama3_8b`].
    H200Llama3_8b,
}

impl Engine {
    /// The simulator's default: the measured preset.
    pub const DEFAULT: Self = Self::H200Llama3_8b;

    /// Every engine's name, for help texts and errors.
    pub const NAMES: &'static str = "legacy|h200-llama3-8b";

    /// The engine called `name`.
    pub fn parse(name: &str) -> Result<Self, String> {
        match name {
            "legacy" => Ok(Self::Legacy),
            "h200-llama3-8b" => Ok(Self::H200Llama3_8b),
            other => Err(format!("unknown engine {other:?} (one of {})", Self::NAMES)),
        }
    }

    /// The GPU KV pages the engine's device holds for its model, when it says (`--kv-gpu-pages`
    /// overrides it).
    pub fn kv_gpu_pages(self, tokens_per_block: u32) -> Option<u32> {
        match self {
            Self::Legacy => None,
            Self::H200Llama3_8b => Some(h200_llama3_8b_kv_pages(tokens_per_block)),
        }
    }

    /// Its cost model for pages of `tokens_per_block` tokens.
    pub fn model(self, tokens_per_block: u32) -> CostModel {
        match self {
            Self::Legacy => CostModel::LEGACY,
            Self::H200Llama3_8b => CostModel::h200_llama3_8b(tokens_per_block),
        }
    }
}

impl Engine {
    /// The engine's name, marked when `model` is not its preset for pages of `tokens_per_block` tokens
    /// (a term was given on the command line), for reports.
    pub fn label(self, model: &CostModel, tokens_per_block: u32) -> String {
        if *model == self.model(tokens_per_block) {
            self.to_string()
        } else {
            format!("{self} (terms overridden)")
        }
    }
}

impl fmt::Display for Engine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Legacy => "legacy",
            Self::H200Llama3_8b => "h200-llama3-8b",
        })
    }
}

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
        m.check().map(|()| m)
    }
}

/// What one step asks of the engine.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StepWork {
    /// Prefill chunk tokens.
    pub prefill_tokens: u64,
    /// The chunks' attention pairs: Σ chunk × prior context + chunk² / 2 (and the verified drafts'
    /// tokens × context).
    pub attention_pairs: f64,
    /// Decode requests.
    pub decode_requests: u64,
    /// Σ context length of the decode requests.
    pub decode_cached_tokens: u64,
    /// Draft tokens verified in the step.
    pub verified_tokens: u64,
    /// Adapter pages loaded onto the device.
    pub adapter_pages: u64,
    /// KV pages moved between tiers.
    pub page_moves: u64,
}

impl StepWork {
    /// Adds a prefill chunk of `tokens` tokens after `prior` tokens of context.
    pub fn chunk(&mut self, tokens: u64, prior: u64) {
        let c = tokens as f64;
        self.prefill_tokens += tokens;
        self.attention_pairs += c * prior as f64 + c * c / 2.0;
    }

    /// Adds a decode request at `context` tokens with `drafts` draft tokens to verify.
    pub fn decode(&mut self, context: u64, drafts: u64) {
        self.decode_requests += 1;
        self.decode_cached_tokens += context;
        self.verified_tokens += drafts;
        self.attention_pairs += (drafts * context) as f64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_legacy_model_is_the_four_constants() {
        let mut w = StepWork::default();
        w.chunk(100, 1000);
        w.decode(5000, 0);
        w.page_moves = 2;
        // 6000 + 100 × 30 + 1 × 40 + 2 × 80: no attention term.
        assert_eq!(CostModel::LEGACY.step_us(&w), 9200.0);
    }

    #[test]
    fn decode_cost_grows_with_context_in_the_measured_model() {
        let m = CostModel::h200_llama3_8b(32);
        let step = |batch: u64, context: u64| {
            let mut w = StepWork::default();
            for _ in 0..batch {
                w.decode(context, 0);
            }
            m.step_us(&w) / 1000.0
        };
        // Measured (CUDA graphs): 11.76 ms and 68.88 ms.
        assert!((step(256, 512) - 11.76).abs() / 11.76 < 0.05);
        assert!((step(256, 8192) - 68.88).abs() / 68.88 < 0.05);
        // A 32-token page of an 8B model is 4 MiB: held at the 2 MiB figure, 51.76 GB/s.
        assert!((m.page_copy_us - 4194304.0 / 51760.0).abs() < 1e-9);
        let small = CostModel::h200_llama3_8b(1).page_copy_us;
        assert!(
            (small - 131072.0 / h200_scattered_copy_bytes_per_us(131072.0)).abs() < 1e-9,
            "{small}"
        );
    }

    #[test]
    fn engines_by_name_and_bad_coefficients() {
        assert_eq!(Engine::parse("legacy"), Ok(Engine::Legacy));
        assert_eq!(Engine::parse("h200-llama3-8b"), Ok(Engine::H200Llama3_8b));
        assert!(Engine::parse("h100")
            .unwrap_err()
            .contains("legacy|h200-llama3-8b"));
        let bad = CostModel {
            attention_us_per_pair: f64::NAN,
            ..CostModel::LEGACY
        };
        assert!(bad.check().unwrap_err().contains("--attention-us-per-pair"));
        assert!(CostModel::h200_llama3_8b(16).check().is_ok());
    }

    #[test]
    fn the_h200_preset_sizes_the_kv_pool_from_the_device_memory() {
        // (0.9 × 143,771 MiB − 16.06 GB) / 128 KiB per token = 912,623 tokens.
        assert_eq!(h200_llama3_8b_kv_pages(32), 28_519);
        assert_eq!(h200_llama3_8b_kv_pages(1), 912_623);
        assert_eq!(Engine::Legacy.kv_gpu_pages(32), None);
        assert_eq!(Engine::H200Llama3_8b.kv_gpu_pages(512), Some(1_782));
    }
}

/// The mixed-step measurements' chunk attention ran a masked kernel, slower than the causal flash
/// kernel of the prefill measurements (`data/measurements/README.md`): fitted extra cost per pair and
/// per step, used only to reproduce those points (`kvsched cost --masked`, `--points`).
pub const MASKED_US_PER_PAIR: f64 = 0.00153599;
/// See [`MASKED_US_PER_PAIR`].
pub const MASKED_STEP_US: f64 = 182.513;

/// One measured step (a line of `data/measurements/h200/*.jsonl`).
#[derive(Debug, Clone, Copy, PartialEq, serde::Deserialize)]
pub struct MeasuredStep {
    /// `decode`, `decode_graph`, `prefill` or `mixed`.
    #[serde(skip)]
    pub kind: MeasuredKind,
    /// Decode batch.
    #[serde(default, alias = "decode_batch")]
    pub batch: u64,
    /// Decode context.
    #[serde(default, alias = "decode_context")]
    pub context: u64,
    /// Prefill tokens (one sequence, or the mixed step's chunk).
    #[serde(default, alias = "chunk")]
    pub tokens: u64,
    /// The chunk's prior context.
    #[serde(default)]
    pub chunk_prior_context: u64,
    /// Median step time.
    pub ms_median: f64,
}

/// What a measured step ran.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum MeasuredKind {
    /// Eager decode.
    #[default]
    Decode,
    /// Decode replayed from a CUDA graph.
    DecodeGraph,
    /// One prefill sequence (causal flash attention).
    Prefill,
    /// A chunk with prior context plus decodes (masked attention kernel for the chunk).
    Mixed,
}

impl MeasuredStep {
    /// The step's work.
    pub fn work(&self) -> StepWork {
        let mut w = StepWork::default();
        if self.tokens > 0 {
            w.chunk(self.tokens, self.chunk_prior_context);
        }
        for _ in 0..self.batch {
            w.decode(self.context, 0);
        }
        w
    }

    /// Predicted milliseconds under `m` (the masked-kernel terms for a mixed step with a chunk).
    pub fn predicted_ms(&self, m: &CostModel) -> f64 {
        let w = self.work();
        let masked = self.kind == MeasuredKind::Mixed && self.tokens > 0;
        let extra = if masked {
            MASKED_STEP_US + w.attention_pairs * MASKED_US_PER_PAIR
        } else {
            0.0
        };
        (m.step_us(&w) + extra) / 1000.0
    }
}

/// Reads measured steps from JSON lines (lines without a `kind`, such as the header, are skipped).
pub fn read_points(text: &str, file: &str) -> Result<Vec<MeasuredStep>, String> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let v: serde_json::Value =
            serde_json::from_str(line).map_err(|e| format!("{file}:{}: {e}", n + 1))?;
        let kind = match v.get("kind").and_then(|k| k.as_str()) {
            None => continue,
            Some("decode") => MeasuredKind::Decode,
            Some("decode_graph") => MeasuredKind::DecodeGraph,
            Some("prefill") => MeasuredKind::Prefill,
            Some("mixed") => MeasuredKind::Mixed,
            Some(other) => return Err(format!("{file}:{}: kind: unknown {other:?}", n + 1)),
        };
        let mut step: MeasuredStep =
            serde_json::from_value(v).map_err(|e| format!("{file}:{}: {e}", n + 1))?;
        step.kind = kind;
        out.push(step);
    }
    Ok(out)
}

/// How well a model reproduces measured points: the relative errors, sorted.
#[derive(Debug, Clone, PartialEq)]
pub struct FitError {
    /// |predicted − measured| / measured, ascending.
    pub errors: Vec<f64>,
}

impl FitError {
    /// The errors of `m` on `points`.
    pub fn of(m: &CostModel, points: &[MeasuredStep]) -> Self {
        let mut errors: Vec<f64> = points
            .iter()
            .map(|p| (p.predicted_ms(m) - p.ms_median).abs() / p.ms_median)
            .collect();
        errors.sort_by(f64::total_cmp);
        Self { errors }
    }

    /// The median error (0 without points).
    pub fn median(&self) -> f64 {
        super::percentile(&self.errors, 0.5)
    }

    /// The largest error (0 without points).
    pub fn max(&self) -> f64 {
        self.errors.last().copied().unwrap_or(0.0)
    }
}

/// `kvsched cost`'s options.
#[derive(Debug, clap::Parser)]
#[command(
    name = "kvsched cost",
    about = "Predicts one forward step's time under a cost model (docs/COST.md)."
)]
struct CostArgs {
    /// Tokens per KV page (sets the page-copy cost).
    #[arg(long, value_name = "N", default_value_t = super::SimOptions::default().tokens_per_block, value_parser = clap::value_parser!(u32).range(1..))]
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
pub fn cli(args: &[String]) -> std::process::ExitCode {
    use std::process::ExitCode;
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
    let (tpb, json, masked) = (a.tokens_per_block, a.json, a.masked);
    let points = &a.points;
    let mut work = StepWork::default();
    for &(batch, context) in &a.decode {
        for _ in 0..batch {
            work.decode(context, 0);
        }
    }
    for &(tokens, prior) in &a.prefill {
        work.chunk(tokens, prior);
    }
    let model = a.cost.model(tpb)?;
    let engine = a.cost.engine.label(&model, tpb);
    if points.is_empty() {
        let extra = if masked && work.prefill_tokens > 0 {
            MASKED_STEP_US + work.attention_pairs * MASKED_US_PER_PAIR
        } else {
            0.0
        };
        let ms = (model.step_us(&work) + extra) / 1000.0;
        return Ok(if json {
            (serde_json::json!({ "step_ms": ms }).to_string(), true)
        } else {
            (format!("{ms:.3} ms ({engine})"), true)
        });
    }
    let mut all = Vec::new();
    for f in points {
        let text = std::fs::read_to_string(f).map_err(|e| format!("{f}: {e}"))?;
        all.extend(read_points(&text, f)?);
    }
    let fit = FitError::of(&model, &all);
    let ok = fit.median() <= 0.10 && fit.max() <= 0.25;
    if json {
        let rows: Vec<serde_json::Value> = all
            .iter()
            .map(|p| {
                serde_json::json!({
                    "kind": format!("{:?}", p.kind), "batch": p.batch, "context": p.context,
                    "tokens": p.tokens, "prior": p.chunk_prior_context,
                    "measured_ms": p.ms_median, "predicted_ms": p.predicted_ms(&model),
                })
            })
            .collect();
        let v = serde_json::json!({
            "engine": &engine, "points": rows,
            "median_error": fit.median(), "max_error": fit.max(),
        });
        return Ok((v.to_string(), ok));
    }
    let mut s = String::from(
        "| step | decode batch × context | chunk (prior) | measured ms | predicted ms | error |\n|---|---|---|---|---|---|\n",
    );
    for p in &all {
        let predicted = p.predicted_ms(&model);
        let kind = match p.kind {
            MeasuredKind::Decode => "decode (eager)",
            MeasuredKind::DecodeGraph => "decode (CUDA graph)",
            MeasuredKind::Prefill => "prefill",
            MeasuredKind::Mixed if p.tokens > 0 => "mixed (masked chunk)",
            MeasuredKind::Mixed => "mixed (decode only)",
        };
        s += &format!(
            "| {kind} | {} × {} | {} ({}) | {:.2} | {:.2} | {:+.1} % |\n",
            p.batch,
            p.context,
            p.tokens,
            p.chunk_prior_context,
            p.ms_median,
            predicted,
            100.0 * (predicted - p.ms_median) / p.ms_median
        );
    }
    s += &format!(
        "\n{} points, engine {engine}: median error {:.1} %, largest {:.1} % (targets 10 % and 25 %: {})",
        all.len(),
        100.0 * fit.median(),
        100.0 * fit.max(),
        if ok { "met" } else { "MISSED" }
    );
    Ok((s, ok))
}
