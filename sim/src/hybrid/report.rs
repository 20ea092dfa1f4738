//! The hybrid part of a run's report: the pools a run got and the state pool's counters.

use std::fmt::{self, Write as _};

use kvsched_core::state_pool::StateStats;

use super::{HybridLayout, HybridOptions, HybridSizing};

/// The hybrid part of a run's report.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct HybridReport {
    /// The model.
    pub model: &'static str,
    /// Its pools.
    pub sizing: HybridSizing,
    /// Bytes of a state slot.
    pub state_bytes: u64,
    /// Host state slots.
    pub state_host_slots: u32,
    /// Tokens between snapshot points.
    pub snapshot_interval: u32,
    /// Snapshots made ready.
    pub snapshots: u64,
    /// Prefix hits restored from a snapshot.
    pub snapshot_hits: u64,
    /// Ready snapshots evicted.
    pub snapshots_evicted: u64,
    /// States moved to the host tier.
    pub states_offloaded: u64,
    /// States moved back to the GPU.
    pub states_reloaded: u64,
}

impl HybridReport {
    pub(super) fn new(h: &HybridOptions, sizing: HybridSizing, host: u32, st: StateStats) -> Self {
        Self {
            model: h.model.name,
            sizing,
            state_bytes: h.model.state_bytes(),
            state_host_slots: host,
            snapshot_interval: h.snapshot_interval,
            snapshots: st.snapshots,
            snapshot_hits: st.hits,
            snapshots_evicted: st.evicted,
            states_offloaded: st.offloaded,
            states_reloaded: st.reloaded,
        }
    }

    /// The summary table's rows.
    pub fn rows(&self) -> String {
        let s = &self.sizing;
        let mut t = String::new();
        let mut row = |label: &str, value: fmt::Arguments<'_>| {
            let _ = writeln!(t, "  {label:<34} {value}");
        };
        row(
            "hybrid model / layout",
            format_args!("{} / {}", self.model, s.layout),
        );
        row(
            "budget (sized for context)",
            format_args!("{:.1} GB ({} tokens)", s.budget_bytes / 1e9, s.sized_for),
        );
        if s.layout == HybridLayout::FullAttention {
            row("full-attention GPU pages", format_args!("{}", s.pages));
            return t;
        }
        row(
            "attention pages / state slots",
            format_args!(
                "{} / {} GPU ({} for snapshots, {:.1} MB each) + {} host",
                s.pages,
                s.state_gpu_slots,
                s.snapshot_slots,
                self.state_bytes as f64 / 1e6,
                self.state_host_slots
            ),
        );
        row(
            "snapshots ready / hits / evicted",
            format_args!(
                "{} / {} / {} (every {} tokens)",
                self.snapshots, self.snapshot_hits, self.snapshots_evicted, self.snapshot_interval
            ),
        );
        row(
            "states offloaded / reloaded",
            format_args!("{} / {}", self.states_offloaded, self.states_reloaded),
        );
        t
    }
}
