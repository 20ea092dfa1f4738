//! Hybrid recurrent models in the simulator: a Mamba-2 hybrid's attention KV in one full-attention
//! group beside its recurrent-state slots (`kvsched_core::kv_groups::Hybrid` over a
//! `kvsched_core::state_pool::StatePool`), its geometry ([`HybridModel`], Nemotron-H 8B's preset), how
//! a GPU memory budget becomes attention pages and state slots ([`HybridModel::size`]), the step
//! costs derived for it ([`HybridModel::cost`]), and the hybrid-against-full-attention sweep over
//! context lengths ([`sweep`], `kvsched hybrid-sweep`).
//!
//! A run with [`SimOptions::hybrid`] reads `kv_gpu_pages` as its **memory budget**: that many pages of
//! the same model with every mixer layer full attention ([`HybridModel::full_bytes_per_token`]), so
//! that the hybrid and its full-attention twin are compared at equal GPU bytes. Under
//! [`HybridLayout::Hybrid`] the budget is split into state slots and attention pages; under
//! [`HybridLayout::FullAttention`] the run is an ordinary one on those pages (the twin). Either way the
//! step costs are the options' engine scaled to the layout's attention. Features the hybrid backend
//! does not support are refused before the run ([`HybridError::Unsupported`]): speculative decoding,
//! a KV connector, disaggregation, several replicas, KV groups (sliding windows), unified adapter
//! paging and samples (the core's hybrid backend cannot fork).

use std::fmt;

use kvsched_core::kv_groups::{Attention, Group, Hybrid, KvGroups};
use kvsched_core::page_pool::KvPool;
use kvsched_core::scheduler::Scheduler;
use kvsched_core::state_pool::{StateConfig, StateStats};
use kvsched_workload::Workload;

use crate::cost::{
    h200_scattered_copy_bytes_per_us, CostModel, GPU_MEMORY_UTILIZATION, H200_MEMORY_BYTES,
    LLAMA3_8B_KV_BYTES_PER_TOKEN,
};
use crate::{OptionsError, Out, Report, SimError, SimOptions, MAX_LIVE};

mod report;
pub mod sweep;

pub use report::HybridReport;

/// A hybrid recurrent model's layers and the bytes its caches take.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct HybridModel {
    /// Its name (`--hybrid-preset`).
    pub name: &'static str,
    /// Layers, of every kind (attention, Mamba-2, MLP).
    pub layers: u32,
    /// Self-attention layers (a KV cache each).
    pub attention_layers: u32,
    /// Mamba-2 layers (a recurrent state each).
    pub mamba_layers: u32,
    /// KV heads of an attention layer.
    pub kv_heads: u32,
    /// Dimension of an attention head.
    pub head_dim: u32,
    /// Bytes of one K or V value (2: bf16).
    pub value_bytes: u32,
    /// Heads of a Mamba-2 layer.
    pub mamba_heads: u32,
    /// Dimension of a Mamba-2 head.
    pub mamba_head_dim: u32,
    /// SSM state dimension (`d_state`).
    pub ssm_state: u32,
    /// Groups of the B and C projections (`n_groups`).
    pub mamba_groups: u32,
    /// Convolution kernel (`d_conv`): the state keeps `d_conv - 1` inputs.
    pub conv_kernel: u32,
    /// Bytes of one state value (conv window and SSM state).
    pub state_value_bytes: u32,
    /// Longest context the model takes.
    pub max_context: u32,
    /// Bytes of the weights the device holds.
    pub weight_bytes: f64,
}

/// Nemotron-H 8B: 52 layers (`hybrid_override_pattern`
/// `M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-`: 24 Mamba-2, 4 self-attention, 24 MLP),
/// hidden 4096; attention GQA with 8 KV heads of 128; Mamba-2 with 128 heads of 64 (`d_inner` 8192),
/// `d_state` 128, 8 groups, `d_conv` 4 (NVIDIA's Megatron-Bridge model page and the `NemotronHConfig`
/// defaults, which describe this model). Assumed: bf16 states (vLLM's default `mamba_ssm_cache_dtype`
/// follows the model's dtype; float32 SSM states would nearly double the slot), 8.0 billion
/// parameters in bf16, 128K context (Nemotron-H-8B-Reasoning-128K; the base model was trained at 8K).
pub const NEMOTRON_H_8B: HybridModel = HybridModel {
    name: "nemotron-h-8b",
    layers: 52,
    attention_layers: 4,
    mamba_layers: 24,
    kv_heads: 8,
    head_dim: 128,
    value_bytes: 2,
    mamba_heads: 128,
    mamba_head_dim: 64,
    ssm_state: 128,
    mamba_groups: 8,
    conv_kernel: 4,
    state_value_bytes: 2,
    max_context: 131_072,
    weight_bytes: 8.0e9 * 2.0,
};

/// The presets, by name.
pub const MODELS: [HybridModel; 1] = [NEMOTRON_H_8B];

/// How a run holds the model's caches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum HybridLayout {
    /// Attention pages for the attention layers beside one state slot per request.
    #[default]
    Hybrid,
    /// The twin: every mixer layer (attention and Mamba-2) full attention, one pool.
    FullAttention,
}

impl fmt::Display for HybridLayout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Hybrid => "hybrid",
            Self::FullAttention => "full-attention",
        })
    }
}

/// A run on a hybrid model ([`SimOptions::hybrid`]); `kv_gpu_pages` is the memory budget in pages of
/// the full-attention twin ([the module docs](self)).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HybridOptions {
    /// The model.
    pub model: HybridModel,
    /// Hybrid, or its full-attention twin.
    pub layout: HybridLayout,
    /// GPU state slots snapshots may hold (0: no prefix reuse on a hybrid, vLLM's mode "none").
    pub snapshot_slots: u32,
    /// Tokens between snapshot points: a whole number of attention pages.
    pub snapshot_interval: u32,
    /// The context the budget is split for (`None`: the workload's mean prompt and output).
    pub sized_for: Option<u32>,
    /// GPU state slots, snapshots included (`None`: as the split gives).
    pub state_gpu_slots: Option<u32>,
    /// Scale the engine's step costs to the layout ([`HybridModel::cost`]); `false` keeps them as
    /// they are for both layouts, so that only the memory differs.
    pub scale_costs: bool,
}

impl HybridOptions {
    /// `model` as a hybrid with `snapshot_slots` snapshots every `snapshot_interval` tokens, sized for
    /// the workload.
    pub fn new(model: HybridModel, snapshot_slots: u32, snapshot_interval: u32) -> Self {
        Self {
            model,
            layout: HybridLayout::Hybrid,
            snapshot_slots,
            snapshot_interval,
            sized_for: None,
            state_gpu_slots: None,
            scale_costs: true,
        }
    }
}

/// What a layout gets from a budget.
#[derive(Debug, Clone, Copy, PartialEq, Default, serde::Serialize)]
pub struct HybridSizing {
    /// The layout.
    pub layout: HybridLayout,
    /// The budget, bytes.
    pub budget_bytes: f64,
    /// The context it was split for.
    pub sized_for: u32,
    /// GPU pages: the attention layers' (hybrid) or every mixer layer's (full attention).
    pub pages: u32,
    /// GPU state slots, snapshots included (0: full attention).
    pub state_gpu_slots: u32,
    /// Of which snapshots may hold at most.
    pub snapshot_slots: u32,
    /// Requests of `sized_for` tokens that fit at once.
    pub fits: u32,
}

impl HybridModel {
    /// The preset called `name`.
    pub fn named(name: &str) -> Option<Self> {
        MODELS.into_iter().find(|m| m.name == name)
    }

    /// KV bytes of one token in one attention layer: K and V.
    pub fn layer_bytes_per_token(&self) -> u64 {
        2 * u64::from(self.kv_heads) * u64::from(self.head_dim) * u64::from(self.value_bytes)
    }

    /// KV bytes of one token in the attention layers.
    pub fn attention_bytes_per_token(&self) -> u64 {
        u64::from(self.attention_layers) * self.layer_bytes_per_token()
    }

    /// KV bytes of one token in the twin, every mixer layer (attention and Mamba-2) full attention of
    /// the attention layers' shape; MLP layers hold no cache.
    pub fn full_bytes_per_token(&self) -> u64 {
        u64::from(self.attention_layers + self.mamba_layers) * self.layer_bytes_per_token()
    }

    /// Channels of a Mamba-2 layer's convolution: x, B and C (`d_inner + 2 n_groups d_state`).
    pub fn conv_channels(&self) -> u64 {
        let d_inner = u64::from(self.mamba_heads) * u64::from(self.mamba_head_dim);
        d_inner + 2 * u64::from(self.mamba_groups) * u64::from(self.ssm_state)
    }

    /// Bytes of one request's recurrent state: every Mamba-2 layer's convolution window
    /// (`(d_conv - 1) x conv channels`) and SSM state (`heads x head_dim x d_state`).
    pub fn state_bytes(&self) -> u64 {
        let conv = u64::from(self.conv_kernel.saturating_sub(1)) * self.conv_channels();
        let ssm = u64::from(self.mamba_heads)
            * u64::from(self.mamba_head_dim)
            * u64::from(self.ssm_state);
        u64::from(self.mamba_layers) * (conv + ssm) * u64::from(self.state_value_bytes)
    }

    /// The KV budget of an H200 serving the model: the memory an engine uses
    /// ([`GPU_MEMORY_UTILIZATION`] of [`H200_MEMORY_BYTES`]) less the weights.
    pub fn h200_kv_budget_bytes(&self) -> f64 {
        (H200_MEMORY_BYTES * GPU_MEMORY_UTILIZATION - self.weight_bytes).max(0.0)
    }

    /// That budget as pages of the full-attention twin (the `kv_gpu_pages` of a run on the preset).
    pub fn h200_full_pages(&self, tokens_per_block: u32) -> u32 {
        let page = self.full_bytes_per_token() * u64::from(tokens_per_block.max(1));
        pages_of(self.h200_kv_budget_bytes() / page as f64)
    }

    /// What `layout` gets from `budget` bytes, split for requests of `context` tokens in pages of
    /// `tokens_per_block`, with at most `live` requests running (the batch limit) and
    /// `snapshot_slots` snapshot slots.
    ///
    /// Full attention: one pool of pages. Hybrid: the snapshots' slots first; then `n`, the requests
    /// of `context` tokens the rest holds when each takes its attention pages and one state slot;
    /// `min(n, live)` live slots beside the snapshots' (at least one; `state_gpu_slots` overrides the
    /// sum), and the bytes left become attention pages.
    pub fn size(
        &self,
        layout: HybridLayout,
        budget: f64,
        tokens_per_block: u32,
        context: u32,
        live: u32,
        snapshots: (u32, Option<u32>),
    ) -> HybridSizing {
        let tpb = u64::from(tokens_per_block.max(1));
        let need = u64::from(context).div_ceil(tpb).max(1);
        let mut s = HybridSizing {
            layout,
            budget_bytes: budget,
            sized_for: context,
            pages: 0,
            state_gpu_slots: 0,
            snapshot_slots: 0,
            fits: 0,
        };
        if layout == HybridLayout::FullAttention {
            s.pages = pages_of(budget / (self.full_bytes_per_token() * tpb) as f64);
            s.fits = (u64::from(s.pages) / need) as u32;
            return s;
        }
        let (slot, page) = (
            self.state_bytes() as f64,
            (self.attention_bytes_per_token() * tpb) as f64,
        );
        let (snapshot_slots, gpu_override) = snapshots;
        let rest = (budget - f64::from(snapshot_slots) * slot).max(0.0);
        let n = pages_of(rest / (need as f64 * page + slot));
        s.state_gpu_slots =
            gpu_override.unwrap_or_else(|| n.min(live).max(1).saturating_add(snapshot_slots));
        s.snapshot_slots = snapshot_slots;
        s.pages = pages_of((budget - f64::from(s.state_gpu_slots) * slot).max(0.0) / page);
        let live_slots = s.state_gpu_slots.saturating_sub(snapshot_slots);
        s.fits = ((u64::from(s.pages) / need) as u32).min(live_slots);
        s
    }

    /// The options' step costs `base` (fitted to a Llama-3-8B-shaped model: 32 attention layers of 8
    /// KV heads of 128) scaled to `layout`: a decode's cached-token reads and a chunk's attention
    /// pairs by the layout's KV bytes per token over Llama-3-8B's (both have 32 query heads of 128,
    /// so the attention FLOPs scale alike); a hybrid's decode also reads and writes its state, at the
    /// bandwidth the cached-token term implies; a page copy at the layout's page bytes over the
    /// H200's scattered-copy bandwidth for pages of that size. The weights' step and the per-token
    /// matrix products are kept (both models have about 8 billion parameters). Derived, not measured.
    pub fn cost(&self, base: &CostModel, layout: HybridLayout, tokens_per_block: u32) -> CostModel {
        let bytes = match layout {
            HybridLayout::Hybrid => self.attention_bytes_per_token(),
            HybridLayout::FullAttention => self.full_bytes_per_token(),
        } as f64;
        let r = bytes / LLAMA3_8B_KV_BYTES_PER_TOKEN;
        let tpb = f64::from(tokens_per_block.max(1));
        let (llama_page, page) = (LLAMA3_8B_KV_BYTES_PER_TOKEN * tpb, bytes * tpb);
        let bw = |b: f64| h200_scattered_copy_bytes_per_us(b);
        let state_us = match layout {
            HybridLayout::Hybrid => {
                let us_per_byte = base.decode_us_per_cached_token / LLAMA3_8B_KV_BYTES_PER_TOKEN;
                2.0 * self.state_bytes() as f64 * us_per_byte
            }
            HybridLayout::FullAttention => 0.0,
        };
        CostModel {
            decode_us_per_cached_token: base.decode_us_per_cached_token * r,
            attention_us_per_pair: base.attention_us_per_pair * r,
            decode_us_per_request: base.decode_us_per_request + state_us,
            page_copy_us: base.page_copy_us * (page / llama_page) * (bw(llama_page) / bw(page)),
            ..*base
        }
    }

    /// Page copies a state move costs: the state's bytes over an attention page's.
    pub fn state_move_pages(&self, tokens_per_block: u32) -> u64 {
        let page = self.attention_bytes_per_token() * u64::from(tokens_per_block.max(1));
        self.state_bytes().div_ceil(page.max(1))
    }
}

/// `x` pages, floored and clamped to a page index.
fn pages_of(x: f64) -> u32 {
    x.floor().clamp(0.0, f64::from(u32::MAX)) as u32
}

/// A hybrid run's options that cannot work ([`OptionsError::Hybrid`]).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum HybridError {
    /// A feature the hybrid backend does not support (the option that turns it on).
    #[error("a hybrid model does not support {0} yet")]
    Unsupported(&'static str),
    /// The core's state pool refused its settings (`Error::Invalid` at construction).
    #[error("the state pool refused {gpu_slots} GPU slots, {snapshot_slots} snapshot slots, a snapshot interval of {interval} tokens: {source}")]
    State {
        /// GPU state slots.
        gpu_slots: u32,
        /// Snapshot slots.
        snapshot_slots: u32,
        /// Snapshot interval.
        interval: u32,
        /// The core's refusal.
        source: kvsched_core::Error,
    },
    /// The budget holds no attention page beside the state slots.
    #[error("a budget of {budget_gb:.1} GB holds no attention page beside {gpu_slots} state slots of {slot_mb:.1} MB")]
    Budget {
        /// The budget, GB.
        budget_gb: f64,
        /// GPU state slots.
        gpu_slots: u32,
        /// A slot, MB.
        slot_mb: f64,
    },
}

/// The options and pools of a hybrid run of `w`: the budget split, the costs scaled; under
/// [`HybridLayout::FullAttention`] an ordinary run (`hybrid` cleared).
pub(crate) fn resolve(
    o: &SimOptions,
    h: &HybridOptions,
    w: &Workload,
) -> Result<(SimOptions, HybridSizing), OptionsError> {
    check(o)?;
    let m = &h.model;
    let tpb = o.tokens_per_block.max(1);
    let budget = f64::from(o.kv_gpu_pages) * (m.full_bytes_per_token() * u64::from(tpb)) as f64;
    let n = w.arrivals.len().max(1) as u64;
    let total: u64 = w
        .arrivals
        .iter()
        .map(|a| u64::from(a.prompt_tokens) + u64::from(a.output_tokens))
        .sum();
    let context = h.sized_for.unwrap_or((total / n).max(1) as u32);
    // Live slots beside the snapshots' within the simulator's request slots.
    let live = o
        .max_batch
        .min((MAX_LIVE as u32).saturating_sub(h.snapshot_slots))
        .max(1);
    let snapshots = (h.snapshot_slots, h.state_gpu_slots);
    let sizing = m.size(h.layout, budget, tpb, context, live, snapshots);
    let mut r = o.clone();
    r.kv_gpu_pages = sizing.pages;
    if h.scale_costs {
        r.cost = m.cost(&o.cost, h.layout, tpb);
    }
    if h.layout == HybridLayout::FullAttention {
        r.hybrid = None;
        return Ok((r, sizing));
    }
    if sizing.pages == 0 {
        return Err(OptionsError::Hybrid(HybridError::Budget {
            budget_gb: budget / 1e9,
            gpu_slots: sizing.state_gpu_slots,
            slot_mb: m.state_bytes() as f64 / 1e6,
        }));
    }
    // The host tier's bytes (in the twin's pages) as attention pages.
    let host =
        u64::from(o.kv_host_pages) * m.full_bytes_per_token() / m.attention_bytes_per_token();
    r.kv_host_pages = host.min(u64::from(u32::MAX)) as u32;
    Ok((r, sizing))
}

/// The features a hybrid run does not support, by the option that turns each on.
fn check(o: &SimOptions) -> Result<(), OptionsError> {
    let unsupported = [
        (o.spec_decode.is_some(), "speculative decoding"),
        (o.remote_store.is_some(), "a KV connector (a remote store)"),
        (o.disagg.is_some(), "disaggregation"),
        (o.replicas > 1, "several replicas"),
        (o.kv_groups.is_some(), "KV groups (sliding windows)"),
        (o.adapters.unified, "unified adapter paging"),
        (o.samples > 1, "samples (forks)"),
    ];
    match unsupported.iter().find(|(on, _)| *on) {
        Some(&(_, what)) => Err(OptionsError::Hybrid(HybridError::Unsupported(what))),
        None => Ok(()),
    }
}

/// Runs `w` on a hybrid model ([`SimOptions::hybrid`]): resolves its pools, then one engine on the
/// hybrid backend, or the ordinary one for the full-attention twin.
pub(crate) fn run(o: &SimOptions, h: &HybridOptions, mut w: Workload) -> Result<Report, SimError> {
    let (r, sizing) = resolve(o, h, &w)?;
    let mut report = if h.layout == HybridLayout::FullAttention {
        let mut report = crate::run_once(&r, w)?;
        report.hybrid = Some(HybridReport::new(h, sizing, 0, StateStats::default()));
        report
    } else {
        crate::check_options(&r, &w)?;
        crate::prepare(&r, &mut w)?;
        engine(&r, h, sizing, &w)?
    };
    let engine = o.engine.label(&o.cost, o.tokens_per_block);
    report.engine = if h.scale_costs {
        format!("{engine}, scaled to {} {}", h.model.name, h.layout)
    } else {
        engine
    };
    Ok(report)
}

/// One engine on the hybrid backend: the options' pool as the attention group, beside the state
/// pool of `sizing`'s slots (the host tier holds the rest of the simulator's request slots).
fn engine(
    o: &SimOptions,
    h: &HybridOptions,
    sizing: HybridSizing,
    w: &Workload,
) -> Result<Report, SimError> {
    let (kv_cfg, adapter_pages) = crate::check_options(o, w)?;
    let opt = |e: kvsched_core::Error| SimError::Options(OptionsError::Setup(e));
    let pool = if o.prefix_reuse {
        KvPool::owned_with_prefix_cache(kv_cfg)
    } else {
        KvPool::owned(kv_cfg)
    };
    let attention = KvGroups::new([Group {
        attention: Attention::Full,
        pool: pool.map_err(opt)?,
    }])
    .map_err(opt)?;
    let host = (MAX_LIVE as u32).saturating_sub(sizing.state_gpu_slots);
    let cfg = StateConfig {
        slot_bytes: h.model.state_bytes(),
        gpu_slots: sizing.state_gpu_slots,
        host_slots: host,
        snapshot_slots: sizing.snapshot_slots,
        snapshot_interval: h.snapshot_interval,
    };
    let kv = Hybrid::new(attention, cfg).map_err(|source| {
        SimError::Options(OptionsError::Hybrid(HybridError::State {
            gpu_slots: cfg.gpu_slots,
            snapshot_slots: cfg.snapshot_slots,
            interval: cfg.snapshot_interval,
            source,
        }))
    })?;
    let peft = crate::adapter_pool(o, &adapter_pages, kv_cfg.gpu_pages)?;
    let sched_cfg = crate::sched_config(o, crate::disagg::Role::Mixed);
    let sched: Box<crate::Sched<'_, crate::backend::HybridKv<'_>>> =
        Box::new(Scheduler::boxed(sched_cfg, kv, peft).map_err(opt)?);
    let out = Box::new(Out::new_in().map_err(opt)?);
    let mut sim = crate::run_loop::Sim::new(o, w, sched, out, kv_cfg);
    while sim.step()? {}
    let stats = sim.backend().state().stats();
    let mut report = sim.report();
    report.hybrid = Some(HybridReport::new(h, sizing, host, stats));
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nemotron_h_8b_s_caches() {
        let m = NEMOTRON_H_8B;
        assert_eq!(m.layer_bytes_per_token(), 4096);
        assert_eq!(m.attention_bytes_per_token(), 16_384);
        assert_eq!(m.full_bytes_per_token(), 114_688);
        assert_eq!(m.conv_channels(), 10_240);
        // 24 x (3 x 10,240 + 128 x 64 x 128) x 2 bytes.
        assert_eq!(m.state_bytes(), 51_806_208);
        assert_eq!(m.state_move_pages(32), 99);
    }

    #[test]
    fn the_split_spends_the_budget_and_fits_more_requests_than_the_twin() {
        let m = NEMOTRON_H_8B;
        let budget = m.h200_kv_budget_bytes();
        let full = m.size(
            HybridLayout::FullAttention,
            budget,
            32,
            65_536,
            1024,
            (0, None),
        );
        let hybrid = m.size(HybridLayout::Hybrid, budget, 32, 65_536, 1024, (8, None));
        let used = f64::from(hybrid.pages) * 16_384.0 * 32.0
            + f64::from(hybrid.state_gpu_slots) * m.state_bytes() as f64;
        assert!(used <= budget && budget - used < 16_384.0 * 32.0);
        assert!(hybrid.fits > 5 * full.fits, "{hybrid:?} {full:?}");
        // The batch limit bounds the live slots at short contexts.
        let short = m.size(HybridLayout::Hybrid, budget, 32, 1024, 256, (8, None));
        assert_eq!(short.state_gpu_slots, 256 + 8);
        assert_eq!(short.fits, 256);
    }

    #[test]
    fn the_twin_pays_seven_times_the_hybrid_s_attention() {
        let base = CostModel::h200_llama3_8b(32);
        let h = NEMOTRON_H_8B.cost(&base, HybridLayout::Hybrid, 32);
        let f = NEMOTRON_H_8B.cost(&base, HybridLayout::FullAttention, 32);
        let ratio = f.decode_us_per_cached_token / h.decode_us_per_cached_token;
        assert!((ratio - 7.0).abs() < 1e-9);
        assert!(h.decode_us_per_request > base.decode_us_per_request);
        assert_eq!(f.step_us, base.step_us);
        assert!(h.page_copy_us < f.page_copy_us && f.page_copy_us < base.page_copy_us);
    }
}
