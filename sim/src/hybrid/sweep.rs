//! The hybrid-against-full-attention sweep over prompt lengths (`kvsched hybrid-sweep`): at each
//! prompt length, the H200's KV budget split for the hybrid ([`HybridModel::size`], for the prompt
//! and the output) and spent whole on its full-attention twin, then two runs of the same
//! fixed-length workload on each: every request at once (how many run together), and Poisson
//! arrivals (goodput).

use std::fmt::Write as _;

use kvsched_workload::synthetic::{
    generate, ArrivalProcess, Horizon, LengthDist, SyntheticError, SyntheticSpec,
};
use kvsched_workload::Workload;

use super::{HybridLayout, HybridModel, HybridOptions, HybridSizing};
use crate::{Report, SimError, SimOptions, MAX_LIVE};

/// The sweep ([the module docs](self)).
#[derive(Debug, Clone, PartialEq)]
pub struct HybridSweep {
    /// The model.
    pub model: HybridModel,
    /// The prompt lengths.
    pub prompts: Vec<u32>,
    /// Requests per run.
    pub requests: u32,
    /// Output tokens of every request.
    pub output_tokens: u32,
    /// Poisson arrivals of the goodput run, per second.
    pub rate: f64,
    /// Scale the engine's step costs to each layout ([`HybridModel::cost`]; `false`: the engine's
    /// for both, only the memory differs).
    pub scale_costs: bool,
    /// The runs' options but the pools and the costs (the engine, page size, batch, objectives,
    /// seed); `kv_gpu_pages` is the budget in the twin's pages.
    pub base: SimOptions,
}

impl HybridSweep {
    /// The sweep's defaults for `model`: prompts of 1K to 64K tokens, 1,024 requests of 1,024 output
    /// tokens, 0.25 per second, objectives of 5 s to the first token and 50 ms per output token; the H200's KV
    /// budget; the default engine (h200-llama3-8b's fit, scaled to each layout); 32-token pages, a
    /// batch of up to the simulator's 1,024 live requests (memory, not the batch limit, bounds them),
    /// no host tier (a victim is recompute-paused), no adapters, no prefix reuse.
    pub fn new(model: HybridModel) -> Self {
        let tokens_per_block = 32;
        Self {
            model,
            prompts: vec![1024, 4096, 16_384, 65_536],
            requests: 1024,
            output_tokens: 1024,
            rate: 0.25,
            scale_costs: true,
            base: SimOptions {
                kv_gpu_pages: model.h200_full_pages(tokens_per_block),
                tokens_per_block,
                max_batch: MAX_LIVE as u32,
                ..crate::groups::layout_sweep_base()
            },
        }
    }

    /// Runs every prompt length under both layouts.
    ///
    /// # Errors
    ///
    /// [`HybridSweepError`]: a length the model does not allow, a workload that cannot be generated,
    /// or the run that failed.
    pub fn run(&self) -> Result<Vec<HybridRow>, HybridSweepError> {
        self.prompts
            .iter()
            .map(|&prompt| {
                Ok(HybridRow {
                    prompt,
                    full: self.point(prompt, HybridLayout::FullAttention)?,
                    hybrid: self.point(prompt, HybridLayout::Hybrid)?,
                })
            })
            .collect()
    }

    /// The options of a run of `layout` at `prompt`: the budget split for the prompt and the output,
    /// no snapshots.
    pub fn options(&self, layout: HybridLayout, prompt: u32) -> SimOptions {
        let mut o = self.base.clone();
        o.hybrid = Some(HybridOptions {
            layout,
            sized_for: Some(prompt.saturating_add(self.output_tokens)),
            scale_costs: self.scale_costs,
            ..HybridOptions::new(self.model, 0, o.tokens_per_block)
        });
        o
    }

    fn point(&self, prompt: u32, layout: HybridLayout) -> Result<HybridPoint, HybridSweepError> {
        let context = u64::from(prompt) + u64::from(self.output_tokens);
        if prompt == 0 || context > u64::from(self.model.max_context) {
            return Err(HybridSweepError::Prompt {
                prompt,
                output: self.output_tokens,
                max: self.model.max_context,
            });
        }
        let o = self.options(layout, prompt);
        let fail = |source| HybridSweepError::Run {
            prompt,
            layout,
            source,
        };
        let mut burst = self.workload(prompt)?;
        for a in &mut burst.arrivals {
            a.at_ms = 0.0;
        }
        let burst = crate::run(&o, burst).map_err(fail)?;
        let paced = crate::run(&o, self.workload(prompt)?).map_err(fail)?;
        let batch = &burst.samples.batch;
        Ok(HybridPoint {
            sizing: paced.hybrid.as_ref().map(|h| h.sizing),
            peak_batch: batch.iter().copied().fold(0.0, f64::max) as u32,
            mean_batch: batch.iter().sum::<f64>() / batch.len().max(1) as f64,
            burst_throughput_tok_s: burst.throughput_tok_s,
            burst_recompute_pauses: burst.recompute_paused,
            report: paced,
        })
    }

    /// `requests` requests of a `prompt`-token prompt and `output_tokens` generated, arriving at
    /// `rate` (Poisson, the options' seed).
    fn workload(&self, prompt: u32) -> Result<Workload, HybridSweepError> {
        let fixed = |n: u32| LengthDist::Uniform { lo: n, hi: n + 1 };
        let spec = SyntheticSpec {
            arrivals: ArrivalProcess::Poisson {
                rate_per_s: self.rate,
            },
            horizon: Horizon::Requests(self.requests as usize),
            prompt: fixed(prompt),
            output: fixed(self.output_tokens),
            seed: self.base.seed,
        };
        Ok(generate(&spec)?)
    }
}

/// One prompt length of a [`HybridSweep`].
#[derive(Debug, Clone)]
pub struct HybridRow {
    /// Prompt tokens of every request.
    pub prompt: u32,
    /// The twin, every mixer layer full attention.
    pub full: HybridPoint,
    /// The hybrid.
    pub hybrid: HybridPoint,
}

/// One layout at one prompt length.
#[derive(Debug, Clone)]
pub struct HybridPoint {
    /// Its pools.
    pub sizing: Option<HybridSizing>,
    /// The largest running batch (chunks and decodes of one step) with every request arriving at
    /// once.
    pub peak_batch: u32,
    /// The mean running batch of that run's (sampled) steps.
    pub mean_batch: f64,
    /// Generated tokens per second of that run.
    pub burst_throughput_tok_s: f64,
    /// Requests that run recompute-paused (their prompt replayed later) to make room.
    pub burst_recompute_pauses: u64,
    /// The run with arrivals at the sweep's rate (goodput, latencies).
    pub report: Report,
}

/// Why a [`HybridSweep`] stopped.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum HybridSweepError {
    /// An empty prompt, or one that with the output is longer than the model takes.
    #[error("prompt {prompt}: at least 1 token, and with the {output} output tokens at most the model's {max}")]
    Prompt {
        /// The prompt.
        prompt: u32,
        /// Output tokens per request.
        output: u32,
        /// The model's longest context.
        max: u32,
    },
    /// The workload could not be generated.
    #[error("the workload: {0}")]
    Workload(#[from] SyntheticError),
    /// A run failed.
    #[error("prompt {prompt}, {layout}: {source}")]
    Run {
        /// The prompt.
        prompt: u32,
        /// The layout.
        layout: HybridLayout,
        /// Why.
        source: SimError,
    },
}

/// The sweep's Markdown table: per prompt length, each layout's pools, the requests that fit, the burst's
/// peak and mean running batch, recompute pauses and throughput, and the paced run's goodput and
/// tail latencies.
pub fn table(rows: &[HybridRow]) -> String {
    let mut s = String::from(
        "| prompt | GPU pages full / hybrid (+ state slots) | fit full / hybrid | peak running full / hybrid | mean running full / hybrid | recompute pauses full / hybrid | burst tok/s full / hybrid | goodput req/s full / hybrid (SLO met) | TTFT p99 s full / hybrid | TPOT p99 ms full / hybrid |\n|---|---|---|---|---|---|---|---|---|---|\n",
    );
    let goodput = |p: &HybridPoint| {
        let r = &p.report;
        format!("{:.2} ({:.0} %)", r.goodput_rps, 100.0 * r.slo_attainment)
    };
    for r in rows {
        let (f, h) = (&r.full, &r.hybrid);
        let (fs, hs) = (f.sizing.unwrap_or_default(), h.sizing.unwrap_or_default());
        let _ = writeln!(
            s,
            "| {} | {} / {} + {} | {} / {} | {} / {} | {:.0} / {:.0} | {} / {} | {:.0} / {:.0} | {} / {} | {:.1} / {:.1} | {:.0} / {:.0} |",
            r.prompt,
            fs.pages,
            hs.pages,
            hs.state_gpu_slots,
            fs.fits,
            hs.fits,
            f.peak_batch,
            h.peak_batch,
            f.mean_batch,
            h.mean_batch,
            f.burst_recompute_pauses,
            h.burst_recompute_pauses,
            f.burst_throughput_tok_s,
            h.burst_throughput_tok_s,
            goodput(f),
            goodput(h),
            f.report.ttft_ms.p99 / 1000.0,
            h.report.ttft_ms.p99 / 1000.0,
            f.report.tpot_ms.p99,
            h.report.tpot_ms.p99,
        );
    }
    s
}
