//! KV groups in the simulator: a hybrid-attention model's KV in a full-attention group and a
//! sliding-window group (`kvsched_core::kv_groups::KvGroups`, one pool each), its layer pattern
//! ([`LayerPattern`], Gemma 3's presets), how the device's KV budget is split into the groups' pools
//! ([`LayerPattern::size`]), and the full-only-against-grouped sweep over context lengths
//! ([`GroupsSweep`], `kvsched groups-sweep`).
//!
//! A run on groups ([`SimOptions::kv_groups`]) is one engine: the KV pool of the options
//! (`kv_gpu_pages`, `kv_host_pages`) is the full-attention group, the window group has pages of its
//! own; with prefix reuse every group's pool has a prefix cache (a hit by the window rule:
//! `docs/KV-GROUPS.md`). Features the groups do not support yet are refused before the run
//! ([`OptionsError::GroupsUnsupported`]): GUARANTEED_NO_EVICT (the core refuses it over sliding
//! windows), speculative decoding's draft pool, a KV connector (`remote_store`), disaggregation, several
//! replicas, unified adapter paging (the groups hold no adapter pages).

use std::fmt::{self, Write as _};

use kvsched_core::config::CapacityPolicy;
use kvsched_core::kv_groups::{Attention, Group, KvGroups};
use kvsched_core::page_pool::{KvPool, KvPoolConfig};
use kvsched_core::scheduler::Scheduler;
use kvsched_workload::synthetic::{
    generate, ArrivalProcess, Horizon, LengthDist, SyntheticError, SyntheticSpec,
};
use kvsched_workload::Workload;

use crate::cost::{GPU_MEMORY_UTILIZATION, H200_MEMORY_BYTES};
use crate::{OptionsError, Out, Report, SimError, SimOptions};

/// The sliding-window group of a run on KV groups ([`SimOptions::kv_groups`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvGroupsOptions {
    /// Positions a window layer's query reads (a multiple of `tokens_per_block`).
    pub window: u32,
    /// GPU pages of the window group.
    pub window_gpu_pages: u32,
    /// Host pages of the window group (0: no host tier).
    pub window_host_pages: u32,
}

/// A feature KV groups do not support yet ([`OptionsError::GroupsUnsupported`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupsUnsupported {
    /// `spec_decode`: a draft pool.
    SpecDecode,
    /// `remote_store`: a KV connector.
    Connector,
    /// `disagg`.
    Disaggregation,
    /// `replicas` above 1.
    Replicas,
    /// `adapters.unified`: adapter pages in the KV pool.
    UnifiedAdapters,
}

impl fmt::Display for GroupsUnsupported {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::SpecDecode => "speculative decoding (a draft pool)",
            Self::Connector => "a KV connector (a remote store)",
            Self::Disaggregation => "disaggregation",
            Self::Replicas => "several replicas",
            Self::UnifiedAdapters => "unified adapter paging",
        })
    }
}

/// The groups' options against the others and the workload's longest request (`longest` tokens,
/// page tables of `max_blocks`): the page tables' length on groups (at least the window's).
pub(crate) fn check(
    o: &SimOptions,
    g: &KvGroupsOptions,
    longest: u64,
    max_blocks: u32,
) -> Result<u32, OptionsError> {
    let unsupported = [
        (o.spec_decode.is_some(), GroupsUnsupported::SpecDecode),
        (o.remote_store.is_some(), GroupsUnsupported::Connector),
        (o.disagg.is_some(), GroupsUnsupported::Disaggregation),
        (o.replicas > 1, GroupsUnsupported::Replicas),
        (o.adapters.unified, GroupsUnsupported::UnifiedAdapters),
    ];
    if let Some(&(_, f)) = unsupported.iter().find(|(on, _)| *on) {
        return Err(OptionsError::GroupsUnsupported(f));
    }
    let tpb = o.tokens_per_block;
    if g.window == 0 || g.window % tpb != 0 {
        return Err(OptionsError::GroupWindow {
            window: g.window,
            tokens_per_block: tpb,
        });
    }
    // The core wants a window no longer than a request: the tables hold at least the window.
    let max_blocks = max_blocks.max(g.window / tpb);
    // A chunk of C tokens from p keeps the blocks of [p + 1 - W, p + C).
    let chunk = o.chunking.map_or(longest, |_| u64::from(o.max_tokens));
    let span = (u64::from(g.window) + chunk).div_ceil(u64::from(tpb)) + 1;
    let needed = span.min(longest.div_ceil(u64::from(tpb))) as u32;
    if g.window_gpu_pages < needed.max(1) {
        return Err(OptionsError::WindowPoolTooSmall {
            pages: g.window_gpu_pages,
            needed: needed.max(1),
        });
    }
    Ok(max_blocks)
}

/// One engine on KV groups replaying `w`: the options' pool as the full-attention group, `g`'s as
/// the window group, each with a prefix cache when the options reuse prefixes.
pub(crate) fn engine(
    o: &SimOptions,
    g: &KvGroupsOptions,
    w: &Workload,
) -> Result<Report, SimError> {
    let (kv_cfg, adapter_pages) = crate::check_options(o, w)?;
    let opt = |e: kvsched_core::Error| SimError::Options(OptionsError::Setup(e));
    let window_cfg = KvPoolConfig {
        gpu_pages: g.window_gpu_pages,
        host_pages: g.window_host_pages,
        ..kv_cfg
    };
    let pool = |cfg| {
        if o.prefix_reuse {
            KvPool::owned_with_prefix_cache(cfg)
        } else {
            KvPool::owned(cfg)
        }
    };
    let kv = KvGroups::new([
        Group {
            attention: Attention::Full,
            pool: pool(kv_cfg).map_err(opt)?,
        },
        Group {
            attention: Attention::Sliding { window: g.window },
            pool: pool(window_cfg).map_err(opt)?,
        },
    ])
    .map_err(opt)?;
    let peft = crate::adapter_pool(o, &adapter_pages, kv_cfg.gpu_pages)?;
    let cfg = crate::sched_config(o, crate::disagg::Role::Mixed);
    let sched: Box<crate::Sched<'_, crate::backend::Groups<'_>>> =
        Box::new(Scheduler::boxed(cfg, kv, peft).map_err(opt)?);
    let out = Box::new(Out::new_in().map_err(opt)?);
    let mut sim = crate::run_loop::Sim::new(o, w, sched, out, kv_cfg);
    while sim.step()? {}
    Ok(sim.report())
}

/// A hybrid-attention model's layers and weights: which layers attend to everything, which to a
/// window, and what one token's KV takes in each.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LayerPattern {
    /// Its name (`--model`).
    pub name: &'static str,
    /// Decoder layers.
    pub layers: u32,
    /// Of which full-attention (global) layers; the others attend to the window.
    pub full_layers: u32,
    /// KV heads per layer.
    pub kv_heads: u32,
    /// Dimension of a head.
    pub head_dim: u32,
    /// Bytes of one K or V value (2: bf16).
    pub value_bytes: u32,
    /// Positions a window layer's query reads.
    pub window: u32,
    /// Longest context the model takes.
    pub max_context: u32,
    /// Bytes of the weights the device holds.
    pub weight_bytes: f64,
}

/// Gemma 3 27B: 62 layers, every sixth global (`sliding_window_pattern` 6: 10 global, 52 local),
/// 16 KV heads of 128, a 1,024-token window, 128K context, bf16; 27.4 billion parameters with the
/// vision encoder (the published `config.json` of `google/gemma-3-27b-it` and the Gemma 3 technical
/// report).
pub const GEMMA3_27B: LayerPattern = LayerPattern {
    name: "gemma3-27b",
    layers: 62,
    full_layers: 10,
    kv_heads: 16,
    head_dim: 128,
    value_bytes: 2,
    window: 1024,
    max_context: 131_072,
    weight_bytes: 27.4e9 * 2.0,
};

/// Gemma 3 12B: 48 layers, every sixth global (8 global, 40 local), 8 KV heads of 256, a 1,024-token
/// window, 128K context, bf16; 12.2 billion parameters with the vision encoder (`google/gemma-3-12b-it`'s
/// `config.json`, the Gemma 3 technical report).
pub const GEMMA3_12B: LayerPattern = LayerPattern {
    name: "gemma3-12b",
    layers: 48,
    full_layers: 8,
    kv_heads: 8,
    head_dim: 256,
    value_bytes: 2,
    window: 1024,
    max_context: 131_072,
    weight_bytes: 12.2e9 * 2.0,
};

/// The presets, by name.
pub const PATTERNS: [LayerPattern; 2] = [GEMMA3_27B, GEMMA3_12B];

/// How a run holds the model's KV.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// Every layer's KV in one pool, as if every layer were global.
    FullOnly,
    /// A full-attention group and a sliding-window group, one pool each.
    Grouped,
}

impl fmt::Display for Layout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::FullOnly => "full-only",
            Self::Grouped => "grouped",
        })
    }
}

/// The pools a layout gets from the device's KV budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sizing {
    /// The layout.
    pub layout: Layout,
    /// GPU pages of the one pool (full-only) or of the full-attention group.
    pub full_pages: u32,
    /// GPU pages of the window group (0 full-only).
    pub window_pages: u32,
    /// Requests of the sized-for context that fit at once, each decoding (its window group's pages
    /// released down to `window / tokens_per_block + 1`).
    pub fits: u32,
}

impl LayerPattern {
    /// The preset called `name`.
    pub fn named(name: &str) -> Option<Self> {
        PATTERNS.into_iter().find(|p| p.name == name)
    }

    /// KV bytes of one token in one layer: K and V.
    pub fn layer_bytes_per_token(&self) -> u64 {
        2 * u64::from(self.kv_heads) * u64::from(self.head_dim) * u64::from(self.value_bytes)
    }

    /// KV bytes of one token in the full-attention layers.
    pub fn full_bytes_per_token(&self) -> u64 {
        u64::from(self.full_layers) * self.layer_bytes_per_token()
    }

    /// KV bytes of one token in the window layers.
    pub fn window_bytes_per_token(&self) -> u64 {
        u64::from(self.layers - self.full_layers) * self.layer_bytes_per_token()
    }

    /// The KV budget of an H200 serving the model: the memory an engine uses
    /// ([`GPU_MEMORY_UTILIZATION`] of [`H200_MEMORY_BYTES`]) less the weights.
    pub fn h200_kv_budget_bytes(&self) -> f64 {
        (H200_MEMORY_BYTES * GPU_MEMORY_UTILIZATION - self.weight_bytes).max(0.0)
    }

    /// The pools `layout` gets from `budget` bytes, sized for requests of `context` tokens in pages
    /// of `tokens_per_block` (a divisor of the window), prefilled in chunks of at most `step_tokens`
    /// together in a step.
    ///
    /// Full-only: one pool of pages holding every layer's KV. Grouped, beyond the window: the window
    /// group first gets the pages of one step's chunks (`step_tokens / tokens_per_block`: a prefilling
    /// request holds its window and its chunk there), then the rest of the budget is split between the
    /// groups in proportion to what one decoding request of `context` tokens holds in each (its
    /// `context / tokens_per_block` pages in the full group, `window / tokens_per_block + 1` in the
    /// window group, at each group's bytes per page), so both pools run out at the same number of
    /// requests. TensorRT-LLM's variable-window manager shares its memory between window sizes the
    /// same way (`calculateWindowSizeToShare`: each window's layers × cache bytes per token × window,
    /// full attention's window being the engine's longest request); here the longest request is
    /// `context`. Within the window both groups get the full-only pool's pages.
    pub fn size(
        &self,
        layout: Layout,
        budget: f64,
        tokens_per_block: u32,
        context: u32,
        step_tokens: u32,
    ) -> Sizing {
        let tpb = u64::from(tokens_per_block.max(1));
        let need_full = u64::from(context).div_ceil(tpb).max(1);
        let need_window = need_full.min(u64::from(self.window) / tpb + 1);
        let all_page = (self.full_bytes_per_token() + self.window_bytes_per_token()) * tpb;
        let pages = |x: f64| x.floor().clamp(0.0, f64::from(u32::MAX)) as u32;
        if layout == Layout::FullOnly || need_window == need_full {
            let full_pages = pages(budget / all_page as f64);
            return Sizing {
                layout,
                full_pages,
                window_pages: if layout == Layout::Grouped {
                    full_pages
                } else {
                    0
                },
                fits: (u64::from(full_pages) / need_full) as u32,
            };
        }
        let chunks = u64::from(step_tokens).div_ceil(tpb);
        let window_page = self.window_bytes_per_token() * tpb;
        let rest = (budget - (chunks * window_page) as f64).max(0.0);
        let per_request = need_full * self.full_bytes_per_token() * tpb + need_window * window_page;
        let n = rest / per_request as f64;
        let (full_pages, window_pages) = (
            pages(n * need_full as f64),
            pages(n * need_window as f64 + chunks as f64),
        );
        let windows = u64::from(window_pages).saturating_sub(chunks) / need_window;
        Sizing {
            layout,
            full_pages,
            window_pages,
            fits: (u64::from(full_pages) / need_full).min(windows) as u32,
        }
    }
}

/// The full-only-against-grouped sweep over context lengths (`kvsched groups-sweep`): at each
/// context, each layout's pools ([`LayerPattern::size`] of the H200's KV budget), then two runs of
/// the same fixed workload on them: every request at once (the running batch's peak: how many run
/// together; and the throughput), and arrivals at `rate` (goodput under the options' objectives).
#[derive(Debug, Clone, PartialEq)]
pub struct GroupsSweep {
    /// The model.
    pub pattern: LayerPattern,
    /// The context lengths: a request's prompt and output together.
    pub contexts: Vec<u32>,
    /// Requests per run.
    pub requests: u32,
    /// Output tokens of every request (its prompt is the rest of the context).
    pub output_tokens: u32,
    /// Poisson arrivals of the goodput run, per second.
    pub rate: f64,
    /// The runs' options but the pools (the cost model, page size, budgets, objectives, seed).
    pub base: SimOptions,
}

/// What a sweep of two layouts runs on (this one's and the hybrid sweep's): no host tier (a victim
/// is recompute-paused), no adapters, no prefix reuse, MAX_UTILIZATION, objectives of 5 s to the
/// first token and 50 ms per output token, no progress bar.
pub(crate) fn layout_sweep_base() -> SimOptions {
    SimOptions {
        kv_host_pages: 0,
        prefix_reuse: false,
        adapters: crate::AdapterOptions {
            count: 0,
            ..SimOptions::default().adapters
        },
        policy: CapacityPolicy::MaxUtilization,
        slo_ttft_ms: Some(5000.0),
        slo_tpot_ms: Some(50.0),
        progress: false,
        ..SimOptions::default()
    }
}

impl GroupsSweep {
    /// The sweep's defaults for `pattern`: contexts 1K to 64K, 128 requests of 256 output tokens, 0.5
    /// per second, objectives of 5 s to the first token and 50 ms per output token; the default
    /// options' engine (h200-llama3-8b's measured step costs, the same for both layouts), 32-token
    /// pages, no host tier (a victim is recompute-paused), no adapters, no prefix reuse.
    pub fn new(pattern: LayerPattern) -> Self {
        Self {
            pattern,
            contexts: vec![1024, 4096, 16_384, 32_768, 65_536],
            requests: 128,
            output_tokens: 256,
            rate: 0.5,
            base: layout_sweep_base(),
        }
    }

    /// Runs every context under both layouts.
    ///
    /// # Errors
    ///
    /// [`GroupsSweepError`]: a context the model or the output does not allow, a workload that
    /// cannot be generated, or the run that failed.
    pub fn run(&self) -> Result<Vec<GroupsRow>, GroupsSweepError> {
        self.contexts
            .iter()
            .map(|&context| {
                Ok(GroupsRow {
                    context,
                    full_only: self.point(context, Layout::FullOnly)?,
                    grouped: self.point(context, Layout::Grouped)?,
                })
            })
            .collect()
    }

    /// The options of a run of `layout` at `context`.
    pub fn options(&self, layout: Layout, context: u32) -> (SimOptions, Sizing) {
        let budget = self.pattern.h200_kv_budget_bytes();
        let tpb = self.base.tokens_per_block;
        let sizing = self
            .pattern
            .size(layout, budget, tpb, context, self.base.max_tokens);
        let mut o = self.base.clone();
        o.kv_gpu_pages = sizing.full_pages;
        o.kv_groups = (layout == Layout::Grouped).then_some(KvGroupsOptions {
            window: self.pattern.window,
            window_gpu_pages: sizing.window_pages,
            window_host_pages: 0,
        });
        (o, sizing)
    }

    fn point(&self, context: u32, layout: Layout) -> Result<GroupsPoint, GroupsSweepError> {
        if context <= self.output_tokens || context > self.pattern.max_context {
            return Err(GroupsSweepError::Context {
                context,
                output: self.output_tokens,
                max: self.pattern.max_context,
            });
        }
        let (o, sizing) = self.options(layout, context);
        let fail = |source| GroupsSweepError::Run {
            context,
            layout,
            source,
        };
        let mut burst = self.workload(context)?;
        for a in &mut burst.arrivals {
            a.at_ms = 0.0;
        }
        let burst = crate::run(&o, burst).map_err(fail)?;
        let paced = crate::run(&o, self.workload(context)?).map_err(fail)?;
        Ok(GroupsPoint {
            sizing,
            peak_batch: burst.samples.batch.iter().copied().fold(0.0, f64::max) as u32,
            burst_throughput_tok_s: burst.throughput_tok_s,
            burst_recompute_pauses: burst.recompute_paused,
            report: paced,
        })
    }

    /// `requests` requests of `context` tokens, `output_tokens` of them generated, arriving at
    /// `rate` (Poisson, the options' seed).
    fn workload(&self, context: u32) -> Result<Workload, GroupsSweepError> {
        let fixed = |n: u32| LengthDist::Uniform { lo: n, hi: n + 1 };
        let spec = SyntheticSpec {
            arrivals: ArrivalProcess::Poisson {
                rate_per_s: self.rate,
            },
            horizon: Horizon::Requests(self.requests as usize),
            prompt: fixed(context - self.output_tokens),
            output: fixed(self.output_tokens),
            seed: self.base.seed,
        };
        Ok(generate(&spec)?)
    }
}

/// One context of a [`GroupsSweep`].
#[derive(Debug, Clone)]
pub struct GroupsRow {
    /// Prompt and output tokens of every request.
    pub context: u32,
    /// Every layer's KV in one pool.
    pub full_only: GroupsPoint,
    /// A full-attention group and a window group.
    pub grouped: GroupsPoint,
}

/// One layout at one context.
#[derive(Debug, Clone)]
pub struct GroupsPoint {
    /// Its pools.
    pub sizing: Sizing,
    /// The largest running batch (chunks and decodes of one step) with every request arriving at
    /// once.
    pub peak_batch: u32,
    /// Generated tokens per second of that run.
    pub burst_throughput_tok_s: f64,
    /// Requests that run recompute-paused (their prompt replayed later) to make room.
    pub burst_recompute_pauses: u64,
    /// The run with arrivals at the sweep's rate (goodput, latencies).
    pub report: Report,
}

/// Why a [`GroupsSweep`] stopped.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum GroupsSweepError {
    /// A context no longer than the output, or longer than the model takes.
    #[error("context {context}: it must exceed the {output} output tokens and be at most the model's {max}")]
    Context {
        /// The context.
        context: u32,
        /// Output tokens per request.
        output: u32,
        /// The model's longest context.
        max: u32,
    },
    /// The workload could not be generated.
    #[error("the workload: {0}")]
    Workload(#[from] SyntheticError),
    /// A run failed.
    #[error("context {context}, {layout}: {source}")]
    Run {
        /// The context.
        context: u32,
        /// The layout.
        layout: Layout,
        /// Why.
        source: SimError,
    },
}

/// The sweep's Markdown table: per context, each layout's pools, the requests that fit, the burst's
/// peak batch, recompute pauses and throughput, and the paced run's goodput.
pub fn table(rows: &[GroupsRow]) -> String {
    let mut s = String::from(
        "| context | GPU pages full-only / grouped (full + window) | requests that fit full-only / grouped | peak running batch full-only / grouped | recompute pauses full-only / grouped | burst throughput tok/s full-only / grouped | goodput req/s full-only / grouped (SLO met) |\n|---|---|---|---|---|---|---|\n",
    );
    for r in rows {
        let (f, g) = (&r.full_only, &r.grouped);
        let goodput = |p: &GroupsPoint| {
            format!(
                "{:.2} ({:.0} %)",
                p.report.goodput_rps,
                100.0 * p.report.slo_attainment
            )
        };
        let _ = writeln!(
            s,
            "| {} | {} / {} + {} | {} / {} | {} / {} | {} / {} | {:.0} / {:.0} | {} / {} |",
            r.context,
            f.sizing.full_pages,
            g.sizing.full_pages,
            g.sizing.window_pages,
            f.sizing.fits,
            g.sizing.fits,
            f.peak_batch,
            g.peak_batch,
            f.burst_recompute_pauses,
            g.burst_recompute_pauses,
            f.burst_throughput_tok_s,
            g.burst_throughput_tok_s,
            goodput(f),
            goodput(g),
        );
    }
    s
}
