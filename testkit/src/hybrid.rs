//! A [`Setup`](crate::Setup) on a hybrid recurrent model's backend: the target pool (and any
//! sliding-window groups) beside a state pool ([`Hybrid`]). The harness then also checks the state
//! pool's invariants, that a request's state is live exactly while its cache is active and
//! suspended while it is inactive ([`Hybrid::check`]), that snapshots stay within their bound, and
//! that a refused operation leaves the state pool's fingerprint unchanged; it drains the state moves
//! and captures with the page moves, before every step.

use kvsched_core::kv::PageMove;
use kvsched_core::kv_groups::{GroupPool, Hybrid, PoolGroups};
use kvsched_core::page_pool::KvPool;
use kvsched_core::state_pool::StateConfig;
use kvsched_core::storage::Owned;

use crate::{Violation, N};

/// The state group of a [`Setup`](crate::Setup).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StateSetup {
    /// GPU state slots (at least 1).
    pub gpu_slots: u32,
    /// Host state slots (raised so that the two tiers hold a state per request slot).
    pub host_slots: u32,
    /// Most GPU slots snapshots hold (below `gpu_slots`).
    pub snapshot_slots: u32,
    /// Blocks between snapshot points (at least 1).
    pub interval_blocks: u32,
}

impl StateSetup {
    /// The state pool's configuration for pages of `tokens_per_block` tokens: slots clamped to
    /// what a state pool takes (a GPU slot for a live request, both tiers covering the `N` slots).
    pub fn config(self, tokens_per_block: u32) -> StateConfig {
        let gpu = self.gpu_slots.clamp(1, N as u32);
        StateConfig {
            slot_bytes: 4096,
            gpu_slots: gpu,
            host_slots: self.host_slots.clamp(N as u32 - gpu, N as u32),
            snapshot_slots: self.snapshot_slots.min(gpu - 1),
            snapshot_interval: self.interval_blocks.max(1) * tokens_per_block,
        }
    }
}

/// A hybrid backend of `G` attention groups of the harness's pools.
pub type Hy<'a, const G: usize> = Hybrid<KvPool<'a, Owned>, G, N>;

/// The page moves of group 0, every other group's, the state moves and the captures drained first
/// (the engine runs them all before the step; the harness follows none).
pub(crate) fn leader_moves<P: GroupPool, const G: usize>(k: &mut Hybrid<P, G, N>) -> &[PageMove] {
    for g in 1..G {
        let _ = k.take_group_moves(g);
    }
    let _ = k.take_state_moves();
    let _ = k.take_captures();
    kvsched_core::kv::KvBackend::take_moves(k)
}

/// The state pool's checks ([the module docs](self)).
pub(crate) fn check<P: GroupPool, const G: usize>(k: &Hybrid<P, G, N>) -> Result<(), Violation> {
    if !k.check() {
        return Err(format!(
            "the state pool disagrees with the attention groups or with itself: {:?}",
            (0..N as u16)
                .map(|s| k.state().placement(s))
                .collect::<Vec<_>>()
        )
        .into());
    }
    let cfg = k.state().config();
    if k.state().snapshots() > cfg.snapshot_slots {
        return Err(format!(
            "{} snapshots past their bound of {}",
            k.state().snapshots(),
            cfg.snapshot_slots
        )
        .into());
    }
    Ok(())
}

/// The groups of a hybrid backend, built from its attention groups.
pub(crate) fn build<const G: usize>(
    groups: PoolGroups<KvPool<'_, Owned>, G>,
    state: StateConfig,
) -> Result<Box<Hy<'_, G>>, kvsched_core::Error> {
    Ok(Box::new(Hybrid::new(groups, state)?))
}

impl crate::Setup {
    /// This configuration on a hybrid recurrent model's backend: its KV groups (at most one window
    /// group is kept) beside a state group; what groups do not take is dropped
    /// ([`Setup::with_groups`](crate::Setup::with_groups)).
    pub fn with_state(self, state: StateSetup) -> Self {
        let mut windows = self.windows.clone();
        windows.truncate(1);
        let mut s = self.with_groups(windows);
        s.state = Some(state);
        s
    }
}
