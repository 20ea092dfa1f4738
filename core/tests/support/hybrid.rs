//! Hybrid recurrent backends for the tests: attention groups of 16-token pages with prefix caches,
//! beside a state pool.

use kvsched_core::kv::KvRef;
use kvsched_core::kv_groups::{Attention, Group, Hybrid, KvGroups};
use kvsched_core::page_pool::{KvPool, KvPoolConfig};
use kvsched_core::state_pool::StateConfig;
use kvsched_core::storage::Owned;
use kvsched_core::{Error, RequestId};

/// Tokens per page.
pub const TPB: u32 = 16;
/// Request slots (and the state pool's rows).
pub const SLOTS: usize = 8;

/// One full-attention group beside the state.
pub type Hy = Hybrid<KvPool<'static, Owned>, 1, SLOTS>;
/// A full group and a 64-token window group beside the state.
pub type Hy2 = Hybrid<KvPool<'static, Owned>, 2, SLOTS>;

fn pool(gpu_pages: u32, host_pages: u32) -> KvPool<'static, Owned> {
    let cfg = KvPoolConfig {
        tokens_per_block: TPB,
        gpu_pages,
        host_pages,
        slots: SLOTS as u32,
        max_blocks: 32,
    };
    KvPool::owned_with_prefix_cache(cfg).expect("a valid pool")
}

/// A state configuration of 1 KiB slots.
pub fn state(gpu: u32, host: u32, snapshots: u32, interval: u32) -> StateConfig {
    StateConfig {
        slot_bytes: 1024,
        gpu_slots: gpu,
        host_slots: host,
        snapshot_slots: snapshots,
        snapshot_interval: interval,
    }
}

/// One full-attention group of `gpu_pages` (and `host_pages`) beside a state pool of `cfg`, whose
/// request slots must all fit a state: the state's host slots are raised to cover them.
pub fn try_hybrid(gpu_pages: u32, host_pages: u32, cfg: StateConfig) -> Result<Hy, Error> {
    let groups = KvGroups::new([Group {
        attention: Attention::Full,
        pool: pool(gpu_pages, host_pages),
    }])?;
    Hybrid::new(groups, cfg)
}

/// [`try_hybrid`], with the state's host tier covering the slots the GPU tier does not.
pub fn hybrid(gpu_pages: u32, host_pages: u32, cfg: StateConfig) -> Hy {
    try_hybrid(gpu_pages, host_pages, covered(cfg)).expect("a valid hybrid backend")
}

/// A full group and a 64-token window group, each of `gpu_pages`, beside a state pool.
pub fn windowed(gpu_pages: u32, window_pages: u32, cfg: StateConfig) -> Hy2 {
    let groups = KvGroups::new([
        Group {
            attention: Attention::Full,
            pool: pool(gpu_pages, 0),
        },
        Group {
            attention: Attention::Sliding { window: 64 },
            pool: pool(window_pages, 0),
        },
    ])
    .expect("valid groups");
    Hybrid::new(groups, covered(cfg)).expect("a valid hybrid backend")
}

/// `cfg` with host slots enough that every request slot can hold a state.
fn covered(cfg: StateConfig) -> StateConfig {
    let need = (SLOTS as u32).saturating_sub(cfg.gpu_slots);
    StateConfig {
        host_slots: cfg.host_slots.max(need),
        ..cfg
    }
}

/// The ref of `slot`: request id `slot + 10`.
pub fn r(slot: u16) -> KvRef {
    KvRef {
        slot,
        id: RequestId(u64::from(slot) + 10),
    }
}

/// `n` block hashes: the first `shared` of family `family`, the rest the request's own (`own`).
pub fn hashes(family: u64, shared: u32, own: u64, n: u32) -> Vec<u64> {
    (0..u64::from(n))
        .map(|k| {
            if k < u64::from(shared) {
                family * 1000 + k
            } else {
                (own + 1) * 100_000 + family * 1000 + k
            }
        })
        .collect()
}
