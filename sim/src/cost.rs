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
            decode_us_per_cached_token: 0.029_257_3,
            attention_us_per_pair: 0.001_042_26,
            adapter_load_us_per_page: Self::LEGACY.adapter_load_us_per_page,
            page_copy_us: page_bytes / h200_scattered_copy_bytes_per_us(page_bytes),
        }
    }

    /// Fitted to this project's CPU engine (`kvsched-engine`: SmolLM2-135M-Instruct in Q8_0, one
    /// candle thread, the 2-core CI machine kind) by `kvsched cost --fit` on
    /// `data/measurements/cpu/smollm2-135m-steps.jsonl` (measured by `engine/benches/simcheck.rs`). A
    /// KV page copy is the measured 6.85 µs a token (a 16-token page of 720 KiB in 109.6 µs, host
    /// memory to host memory); adapter loads keep the legacy 50 µs a page (not measured).
    pub fn cpu_smollm2_135m(tokens_per_block: u32) -> Self {
        Self {
            step_us: 14_608.75,
            prefill_us_per_token: 1_849.81,
            decode_us_per_request: 2_494.52,
            decode_us_per_cached_token: 11.2993,
            attention_us_per_pair: 5.547_41,
            adapter_load_us_per_page: Self::LEGACY.adapter_load_us_per_page,
            page_copy_us: 109.6 / 16.0 * f64::from(tokens_per_block),
        }
    }

    /// The model as the scheduler's step budget in time reads it (`kvsched_core::StepCost`, in
    /// picoseconds; adapter loads and page copies are not a chunk's).
    pub fn step_cost(&self) -> kvsched_core::StepCost {
        let ps = |us: f64| (us * 1e6).round() as u64;
        kvsched_core::StepCost {
            step_ps: ps(self.step_us),
            prefill_token_ps: ps(self.prefill_us_per_token),
            decode_request_ps: ps(self.decode_us_per_request),
            cached_token_ps: ps(self.decode_us_per_cached_token),
            pair_ps: ps(self.attention_us_per_pair),
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

    /// The coefficient of `term`.
    pub fn term(&self, term: CostTerm) -> f64 {
        match term {
            CostTerm::StepUs => self.step_us,
            CostTerm::PrefillUsPerToken => self.prefill_us_per_token,
            CostTerm::DecodeUsPerRequest => self.decode_us_per_request,
            CostTerm::DecodeUsPerCachedToken => self.decode_us_per_cached_token,
            CostTerm::AttentionUsPerPair => self.attention_us_per_pair,
            CostTerm::AdapterLoadUsPerPage => self.adapter_load_us_per_page,
            CostTerm::PageCopyUs => self.page_copy_us,
        }
    }

    /// The coefficients, for a refusal: every one finite and not negative.
    ///
    /// # Errors
    ///
    /// [`BadCost`] names the first term that is not.
    pub fn check(&self) -> Result<(), BadCost> {
        match CostTerm::ALL
            .into_iter()
            .map(|term| (term, self.term(term)))
            .find(|(_, v)| !v.is_finite() || *v < 0.0)
        {
            Some((term, value)) => Err(BadCost { term, value }),
            None => Ok(()),
        }
    }
}

/// One coefficient of a [`CostModel`], by its field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CostTerm {
    /// [`CostModel::step_us`].
    StepUs,
    /// [`CostModel::prefill_us_per_token`].
    PrefillUsPerToken,
    /// [`CostModel::decode_us_per_request`].
    DecodeUsPerRequest,
    /// [`CostModel::decode_us_per_cached_token`].
    DecodeUsPerCachedToken,
    /// [`CostModel::attention_us_per_pair`].
    AttentionUsPerPair,
    /// [`CostModel::adapter_load_us_per_page`].
    AdapterLoadUsPerPage,
    /// [`CostModel::page_copy_us`].
    PageCopyUs,
}

impl CostTerm {
    /// Every term, in the model's order.
    pub const ALL: [Self; 7] = [
        Self::StepUs,
        Self::PrefillUsPerToken,
        Self::DecodeUsPerRequest,
        Self::DecodeUsPerCachedToken,
        Self::AttentionUsPerPair,
        Self::AdapterLoadUsPerPage,
        Self::PageCopyUs,
    ];

    /// The field's name (`step_us`, …).
    pub const fn name(self) -> &'static str {
        match self {
            Self::StepUs => "step_us",
            Self::PrefillUsPerToken => "prefill_us_per_token",
            Self::DecodeUsPerRequest => "decode_us_per_request",
            Self::DecodeUsPerCachedToken => "decode_us_per_cached_token",
            Self::AttentionUsPerPair => "attention_us_per_pair",
            Self::AdapterLoadUsPerPage => "adapter_load_us_per_page",
            Self::PageCopyUs => "page_copy_us",
        }
    }
}

impl fmt::Display for CostTerm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A coefficient that is not finite or is negative ([`CostModel::check`]).
#[derive(Debug, Clone, Copy, PartialEq, thiserror::Error)]
#[error("{term} {value}: a cost must be finite and not negative")]
pub struct BadCost {
    /// The term.
    pub term: CostTerm,
    /// Its value.
    pub value: f64,
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
/// `data/measurements/h200/page-copy-bandwidth.txt`; the mean of both directions), interpolated on
/// the page size's logarithm and held at the ends.
pub(crate) fn h200_scattered_copy_bytes_per_us(page_bytes: f64) -> f64 {
    // (page bytes, GB/s = bytes per ns = 1000 bytes per us)
    const POINTS: [(f64, f64); 4] = [
        (4096.0, 1.60),
        (65536.0, 17.65),
        (262_144.0, 36.56),
        (2_097_152.0, 51.76),
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
    /// [`CostModel::cpu_smollm2_135m`].
    CpuSmollm2_135m,
}

impl Engine {
    /// The simulator's default: the measured preset.
    pub const DEFAULT: Self = Self::H200Llama3_8b;

    /// Every engine's name, for help texts and errors.
    pub const NAMES: &'static str = "legacy|h200-llama3-8b|cpu-smollm2-135m";

    /// The engine called `name`.
    ///
    /// # Errors
    ///
    /// [`UnknownEngine`] for a name that is none of [`NAMES`](Self::NAMES).
    pub fn parse(name: &str) -> Result<Self, UnknownEngine> {
        match name {
            "legacy" => Ok(Self::Legacy),
            "h200-llama3-8b" => Ok(Self::H200Llama3_8b),
            "cpu-smollm2-135m" => Ok(Self::CpuSmollm2_135m),
            other => Err(UnknownEngine(other.to_owned())),
        }
    }

    /// The GPU KV pages the engine's device holds for its model, when it says (`--kv-gpu-pages`
    /// overrides it).
    pub fn kv_gpu_pages(self, tokens_per_block: u32) -> Option<u32> {
        match self {
            Self::Legacy | Self::CpuSmollm2_135m => None,
            Self::H200Llama3_8b => Some(h200_llama3_8b_kv_pages(tokens_per_block)),
        }
    }

    /// Its cost model for pages of `tokens_per_block` tokens.
    pub fn model(self, tokens_per_block: u32) -> CostModel {
        match self {
            Self::Legacy => CostModel::LEGACY,
            Self::H200Llama3_8b => CostModel::h200_llama3_8b(tokens_per_block),
            Self::CpuSmollm2_135m => CostModel::cpu_smollm2_135m(tokens_per_block),
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

/// An engine name [`Engine::parse`] does not know (quoted).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown engine {0:?} (one of {names})", names = Engine::NAMES)]
pub struct UnknownEngine(pub String);

impl std::str::FromStr for Engine {
    type Err = UnknownEngine;

    fn from_str(name: &str) -> Result<Self, UnknownEngine> {
        Self::parse(name)
    }
}

impl fmt::Display for Engine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Legacy => "legacy",
            Self::H200Llama3_8b => "h200-llama3-8b",
            Self::CpuSmollm2_135m => "cpu-smollm2-135m",
        })
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
        assert!((m.page_copy_us - 4_194_304.0 / 51_760.0).abs() < 1e-9);
        let small = CostModel::h200_llama3_8b(1).page_copy_us;
        assert!(
            (small - 131_072.0 / h200_scattered_copy_bytes_per_us(131_072.0)).abs() < 1e-9,
            "{small}"
        );
    }

    #[test]
    fn engines_by_name_and_bad_coefficients() {
        assert_eq!(Engine::parse("legacy"), Ok(Engine::Legacy));
        assert_eq!(Engine::parse("h200-llama3-8b"), Ok(Engine::H200Llama3_8b));
        assert!(Engine::parse("h100")
            .unwrap_err()
            .to_string()
            .contains("legacy|h200-llama3-8b"));
        let bad = CostModel {
            attention_us_per_pair: f64::NAN,
            ..CostModel::LEGACY
        };
        let err = bad.check().unwrap_err();
        assert_eq!(err.term, CostTerm::AttentionUsPerPair);
        assert!(
            err.to_string().starts_with("attention_us_per_pair NaN"),
            "{err}"
        );
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
pub const MASKED_US_PER_PAIR: f64 = 0.001_535_99;
/// See [`MASKED_US_PER_PAIR`].
pub const MASKED_STEP_US: f64 = 182.513;

/// One measured step (a line of `data/measurements/*/*.jsonl`).
#[derive(Debug, Clone, Copy, PartialEq, serde::Deserialize)]
pub struct MeasuredStep {
    /// `decode`, `decode_graph`, `prefill`, `mixed` or `step`.
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
    /// Any step (chunks and decodes together) on the engine's one attention kernel: what the CPU
    /// engine (`kvsched-engine`) measures.
    Step,
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
        (m.step_us(&self.work()) + self.masked_us()) / 1000.0
    }

    /// The masked chunk-attention kernel's extra microseconds: a mixed step with a chunk pays them.
    pub fn masked_us(&self) -> f64 {
        if self.kind == MeasuredKind::Mixed && self.tokens > 0 {
            MASKED_STEP_US + self.work().attention_pairs * MASKED_US_PER_PAIR
        } else {
            0.0
        }
    }
}

/// Reads measured steps from JSON lines (lines without a `kind`, such as the header, are skipped).
///
/// # Errors
///
/// [`PointsError`]: the file (as `file` names it), the 1-based line and what is wrong there.
pub fn read_points(text: &str, file: &str) -> Result<Vec<MeasuredStep>, PointsError> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let err = |reason| PointsError {
            file: file.to_owned(),
            line: n + 1,
            reason,
        };
        let json = |e: serde_json::Error| err(PointsErrorKind::Json(e.to_string()));
        let v: serde_json::Value = serde_json::from_str(line).map_err(json)?;
        let kind = match v.get("kind").and_then(|k| k.as_str()) {
            None => continue,
            Some("decode") => MeasuredKind::Decode,
            Some("decode_graph") => MeasuredKind::DecodeGraph,
            Some("prefill") => MeasuredKind::Prefill,
            Some("mixed") => MeasuredKind::Mixed,
            Some("step") => MeasuredKind::Step,
            Some(other) => return Err(err(PointsErrorKind::UnknownKind(other.to_owned()))),
        };
        let mut step: MeasuredStep = serde_json::from_value(v).map_err(json)?;
        step.kind = kind;
        out.push(step);
    }
    Ok(out)
}

/// A line of measured steps [`read_points`] could not read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}:{line}: {reason}")]
pub struct PointsError {
    /// The file, as the caller named it.
    pub file: String,
    /// The 1-based line.
    pub line: usize,
    /// What is wrong.
    pub reason: PointsErrorKind,
}

/// Why a line of measured steps is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PointsErrorKind {
    /// Not JSON, or a field of the wrong type (serde_json's message).
    #[error("{0}")]
    Json(String),
    /// A `kind` that is none of `decode`, `decode_graph`, `prefill`, `mixed`, `step` (quoted).
    #[error("kind: unknown {0:?}")]
    UnknownKind(String),
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
