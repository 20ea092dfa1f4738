//! The KV backends the simulated engine runs on: the target pool with its optional draft pool
//! (`KvSet`, every run but the grouped and hybrid ones), a hybrid-attention model's KV groups
//! (`KvGroups`: a full-attention group and a sliding-window group, `groups.rs`), or a hybrid
//! recurrent model's attention group beside its state slots (`Hybrid`, `hybrid.rs`).
//!
//! The run loop is generic over [`SimKv`], the little it reads from a backend besides the
//! scheduler's calls: the pool its figures come from, how full the fullest pool is, the pools' audits
//! and the page moves of the pools other than the leader's (and a hybrid's state moves and captures). Each backend's loop is compiled apart, so
//! the `KvSet` one is the code it was.

use kvsched_core::kv::{KvBackend, Pool};
use kvsched_core::kv_groups::{Hybrid, KvGroups};
use kvsched_core::kv_set::KvSet;
use kvsched_core::page_pool::KvPool;
use kvsched_core::state_pool::StateOp;
use kvsched_core::storage::Owned;

use super::{Sched, SimOptions, MAX_LIVE};

/// A pool owning its buffers.
pub(crate) type OwnedPool<'a> = KvPool<'a, Owned>;
/// The simulator's first backend: the target pool and an optional draft pool.
pub(crate) type Target<'a> = KvSet<OwnedPool<'a>>;
/// A full-attention group and a sliding-window group.
pub(crate) type Groups<'a> = KvGroups<'a, Owned, 2>;
/// A full-attention group beside the recurrent-state slots of every live request.
pub(crate) type HybridKv<'a> = Hybrid<OwnedPool<'a>, 1, MAX_LIVE>;

/// What the run loop reads from a KV backend besides the scheduler's calls.
pub(crate) trait SimKv<'a>: KvBackend + Sized {
    /// The pool the report's pool figures read (utilization, cached blocks, connector, prefix
    /// cache, unified adapters): the target pool, or the full-attention group's.
    fn lead(&self) -> &OwnedPool<'a>;

    /// The GPU utilization the report records, given the lead pool's (`lead_pct`, %): the fullest
    /// pool's.
    fn fullest_gpu_pct(&self, lead_pct: f64) -> f64 {
        lead_pct
    }

    /// How many of the pools' exact audits fail (`scratch`: the audit's count per page, grown to the
    /// largest pool once and reused).
    fn audit_failures(&self, scratch: &mut Vec<u32>) -> u64;

    /// How many of the pools' spot checks fail (`check.rs`): each pool's counters, and the rows of
    /// `touched` (slot, and whether only its tail changed: a decode step).
    fn spot_failures<I: Iterator<Item = (u16, bool)> + Clone>(&self, touched: I) -> u64;

    /// Drains the page moves of the pools other than the lead's (and whatever else the backend logs
    /// for the engine every step); returns how many page copies they cost, under `o`.
    fn other_moves(s: &mut Sched<'a, Self>, o: &SimOptions) -> u64;
}

impl<'a> SimKv<'a> for Target<'a> {
    fn lead(&self) -> &OwnedPool<'a> {
        self.target()
    }

    fn audit_failures(&self, scratch: &mut Vec<u32>) -> u64 {
        let pools = std::iter::once(self.target()).chain(self.draft_pool().map(|(_, d)| d));
        pools.map(|p| audit(p, scratch)).sum()
    }

    fn spot_failures<I: Iterator<Item = (u16, bool)> + Clone>(&self, touched: I) -> u64 {
        let pools = std::iter::once(self.target()).chain(self.draft_pool().map(|(_, d)| d));
        pools.map(|p| spot(p, touched.clone())).sum()
    }

    fn other_moves(s: &mut Sched<'a, Self>, _: &SimOptions) -> u64 {
        // The draft pool has no host tier: its log holds the reloads of claimed prefix blocks only.
        s.take_pool_moves(Pool::Draft).len() as u64
    }
}

impl<'a> SimKv<'a> for Groups<'a> {
    fn lead(&self) -> &OwnedPool<'a> {
        &self.groups()[0].pool
    }

    fn fullest_gpu_pct(&self, lead_pct: f64) -> f64 {
        self.groups()[1..]
            .iter()
            .map(|g| used_gpu_pct(&g.pool))
            .fold(lead_pct, f64::max)
    }

    fn audit_failures(&self, scratch: &mut Vec<u32>) -> u64 {
        let audits = self.groups().iter().map(|g| audit(&g.pool, scratch));
        audits.sum::<u64>() + u64::from(!self.check())
    }

    fn spot_failures<I: Iterator<Item = (u16, bool)> + Clone>(&self, touched: I) -> u64 {
        self.groups()
            .iter()
            .map(|g| spot(&g.pool, touched.clone()))
            .sum()
    }

    fn other_moves(s: &mut Sched<'a, Self>, _: &SimOptions) -> u64 {
        s.take_group_moves(1).len() as u64
    }
}

impl<'a> SimKv<'a> for HybridKv<'a> {
    fn lead(&self) -> &OwnedPool<'a> {
        &self.attention().groups()[0].pool
    }

    fn audit_failures(&self, scratch: &mut Vec<u32>) -> u64 {
        audit(self.lead(), scratch) + u64::from(!self.check())
    }

    fn spot_failures<I: Iterator<Item = (u16, bool)> + Clone>(&self, touched: I) -> u64 {
        spot(self.lead(), touched) + u64::from(!self.state().check())
    }

    /// The state moves (run before the step) and the captures (written during it), both drained
    /// every step or a resumption is refused for want of log room. A move between the tiers costs
    /// the state's bytes in page copies; a restore or a capture is a copy within the GPU, not
    /// priced.
    fn other_moves(s: &mut Sched<'a, Self>, o: &SimOptions) -> u64 {
        let tiers = s
            .take_state_moves()
            .iter()
            .filter(|m| matches!(m.op, StateOp::Move(_)))
            .count() as u64;
        let _ = s.take_captures();
        let pages = o.hybrid.map_or(0, |h| {
            h.model
                .state_move_pages(s.kv().lead().config().tokens_per_block)
        });
        tiers * pages
    }
}

/// The GPU pages a pool's requests hold (cached blocks nobody holds are the cache's), % of its GPU
/// pages.
pub(crate) fn used_gpu_pct(p: &OwnedPool<'_>) -> f64 {
    let gpu = p.config().gpu_pages;
    let used = gpu - p.gpu_free() - p.idle_pages(kvsched_core::kv::Tier::Gpu);
    if gpu > 0 {
        100.0 * f64::from(used) / f64::from(gpu)
    } else {
        0.0
    }
}

/// 1 when `pool`'s exact audit fails; `scratch` grows to its page count (once: later audits reuse it).
fn audit(pool: &OwnedPool<'_>, scratch: &mut Vec<u32>) -> u64 {
    scratch.resize(pool.config().page_info_len(), 0);
    u64::from(!pool.audit(scratch))
}

/// A decode step's touched tail: the last blocks of its row (the one it may have grown into, and the
/// one before).
const TAIL_BLOCKS: u32 = 2;

/// `pool`'s spot checks: its counters (O(1)), and each touched row (a decode step's tail only).
fn spot(pool: &OwnedPool<'_>, touched: impl Iterator<Item = (u16, bool)>) -> u64 {
    let rows = touched.filter(|&(slot, tail)| {
        let from = if tail {
            pool.seq(slot).blocks.saturating_sub(TAIL_BLOCKS)
        } else {
            0
        };
        !pool.check_row(slot, from)
    });
    rows.count() as u64 + u64::from(!pool.check_counts())
}
