//! The engine's KV side: kvsched-core's scheduler over one [`KvPool`] (every layer in one page
//! table: full attention) or over [`KvGroups`] (a hybrid-attention model: group 0 holds the global
//! layers' KV, group 1 the sliding-window layers'), and one [`HostKvStore`] per group, each sized
//! for its own layers.
//!
//! The two schedulers are different types; [`Sched`] holds either and forwards the calls the engine
//! makes, so that the serving loop is written once. Everything a group needs of its own — its store,
//! its move binding, its poison flags — is a [`GroupStore`], indexed by the group.
//!
//! Prefix reuse on groups is kvsched-core's window rule: a hit is the longest prefix whose blocks the
//! full group holds and whose last window the window group holds (every pool has a cache, built in
//! [`group_pools`]); the block hashes and root go to both through the scheduler's `PrefixReuse`
//! capability ([`Scheduler::submit_with_prefix`]), as for one pool.

use kvsched_core::adapter::{HostChange, TaskRef};
use kvsched_core::kv::PageMove;
use kvsched_core::kv_groups::{Attention, Group, KvGroups};
use kvsched_core::output::SchedulerOutput;
use kvsched_core::request::RequestSpec;
use kvsched_core::scheduler::{Entry, Handle, PassStats, Scheduler, TransferEnd};
use kvsched_core::storage::{Boxed, Owned};
use kvsched_core::{AdapterPool, Config, KvPool, KvPoolConfig, PeftError, TaskId};
use kvsched_gpu::{BlockTableShape, HostKvStore, KvPages};

use super::{Dirty, EngineConfig, MAX_ADAPTERS, MAX_REQUESTS};
use crate::error::{EngineError, Result};
use crate::gguf::ModelConfig;
use crate::kv::KvLayout;

/// One group's pages (or the only pool's).
pub(super) type Pool = KvPool<'static, Owned>;
/// A hybrid model's two groups: full attention, then the sliding window.
pub(super) type Groups = KvGroups<'static, Owned, 2>;
type Peft = AdapterPool<MAX_ADAPTERS>;
type FullSched = Scheduler<Pool, Peft, MAX_REQUESTS, MAX_ADAPTERS, Boxed>;
type GroupSched = Scheduler<Groups, Peft, MAX_REQUESTS, MAX_ADAPTERS, Boxed>;
pub(super) type Output = SchedulerOutput<MAX_REQUESTS, Boxed>;

/// The scheduler, over one pool or over KV groups.
#[allow(clippy::large_enum_variant)]
pub(super) enum Sched {
    /// Every layer's KV in one pool.
    Full(FullSched),
    /// Group 0 the global layers', group 1 the sliding-window layers'.
    Grouped(GroupSched),
}

/// `$body` with `$s` bound to whichever scheduler `$sched` holds.
macro_rules! on {
    ($sched:expr, $s:ident => $body:expr) => {
        match $sched {
            Sched::Full($s) => $body,
            Sched::Grouped($s) => $body,
        }
    };
}

impl Sched {
    pub(super) fn schedule(&mut self, out: &mut Output) -> Result<(), kvsched_core::Error> {
        on!(self, s => s.schedule(out))
    }

    pub(super) fn ensure_batch(&mut self, out: &mut Output) -> Result<(), PeftError> {
        on!(self, s => s.ensure_batch(out))
    }

    pub(super) fn complete_step(&mut self, out: &Output) -> Result<(), kvsched_core::Error> {
        on!(self, s => s.complete_step(out))
    }

    pub(super) fn take_delta(
        &mut self,
        out: &Output,
        delta: &mut super::batch::Delta,
    ) -> Result<(), kvsched_core::Error> {
        on!(self, s => s.take_delta(out, delta))
    }

    pub(super) fn last_pass(&self) -> PassStats {
        on!(self, s => s.last_pass())
    }

    pub(super) fn get(&self, h: Handle) -> Result<Entry<'_>, kvsched_core::Error> {
        on!(self, s => s.get(h))
    }

    pub(super) fn update(
        &mut self,
        h: Handle,
        f: impl FnOnce(&mut RequestSpec),
    ) -> Result<(), kvsched_core::Error> {
        on!(self, s => s.update(h, f))
    }

    pub(super) fn remove(&mut self, h: Handle) -> Result<RequestSpec, kvsched_core::Error> {
        on!(self, s => s.remove(h))
    }

    pub(super) fn retire_adapter(&mut self, id: TaskId) -> Result<TaskRef, PeftError> {
        on!(self, s => s.retire_adapter(id))
    }

    pub(super) fn reset_prefix_cache(&mut self) -> u32 {
        on!(self, s => s.reset_prefix_cache())
    }

    pub(super) fn rewind(&mut self, h: Handle, tokens: u32) -> Result<(), kvsched_core::Error> {
        on!(self, s => s.rewind(h, tokens))
    }

    /// A child on `parent`'s full blocks (KV groups refuse: their pools have no fork yet).
    pub(super) fn fork(
        &mut self,
        parent: Handle,
        spec: RequestSpec,
    ) -> Result<Handle, kvsched_core::Error> {
        on!(self, s => s.fork(parent, spec))
    }

    /// Submits with the prompt's block hashes: the `PrefixReuse` capability of either backend
    /// takes them (none today for groups).
    pub(super) fn submit_with_prefix(
        &mut self,
        spec: RequestSpec,
        salt: u64,
        hashes: &[u64],
    ) -> Result<Handle, kvsched_core::Error> {
        on!(self, s => s.submit_with_prefix(spec, salt, hashes))
    }

    pub(super) fn register_adapter(
        &mut self,
        id: TaskId,
        pages: u32,
    ) -> Result<TaskRef, PeftError> {
        on!(self, s => s.register_adapter(id, pages))
    }

    pub(super) fn take_adapter_host_changes(&mut self, f: impl FnMut(TaskRef, HostChange)) {
        on!(self, s => s.take_adapter_host_changes(f));
    }

    pub(super) fn take_adapter_evictions(&mut self, f: impl FnMut(TaskRef)) {
        on!(self, s => s.take_adapter_evictions(f));
    }

    pub(super) fn adapters(&self) -> &Peft {
        on!(self, s => s.adapters().backend())
    }

    pub(super) fn len(&self) -> usize {
        on!(self, s => s.len())
    }

    pub(super) fn is_empty(&self) -> bool {
        on!(self, s => s.is_empty())
    }

    pub(super) fn start_receive(&mut self, h: Handle) -> Result<(), kvsched_core::Error> {
        on!(self, s => s.start_receive(h))
    }

    pub(super) fn end_receive(
        &mut self,
        h: Handle,
        how: TransferEnd,
    ) -> Result<(), kvsched_core::Error> {
        on!(self, s => s.end_receive(h, how))
    }

    pub(super) fn end_send(
        &mut self,
        h: Handle,
        how: TransferEnd,
    ) -> Result<RequestSpec, kvsched_core::Error> {
        on!(self, s => s.end_send(h, how))
    }

    /// The leader's KV events since the last call (none without a log).
    pub(super) fn take_kv_events(&mut self) -> Vec<kvsched_core::kv_events::KvEvent> {
        on!(self, s => s.take_kv_events().to_vec())
    }

    /// KV groups: 1 for one pool, 2 for a hybrid model's.
    pub(super) fn groups(&self) -> usize {
        match self {
            Self::Full(_) => 1,
            Self::Grouped(_) => 2,
        }
    }

    /// Whether the KV is in groups (a hybrid model).
    pub(super) fn grouped(&self) -> bool {
        matches!(self, Self::Grouped(_))
    }

    /// Group `g`'s pool (the only pool as group 0); `None` past the groups.
    pub(super) fn pool(&self, g: usize) -> Option<&Pool> {
        match self {
            Self::Full(s) => (g == 0).then(|| s.kv()),
            Self::Grouped(s) => s.kv().groups().get(g).map(|group| &group.pool),
        }
    }

    /// The leader's pool: the only one, or group 0 (full attention).
    pub(super) fn leader(&self) -> &Pool {
        match self {
            Self::Full(s) => s.kv(),
            Self::Grouped(s) => &s.kv().groups()[0].pool,
        }
    }

    /// The page moves group `g` logged since the last call (group 0's first: taking them settles
    /// the requests the pass resumed).
    pub(super) fn take_moves(&mut self, g: usize) -> &[PageMove] {
        match self {
            Self::Full(s) if g == 0 => s.take_moves(),
            Self::Full(_) => &[],
            Self::Grouped(s) => s.take_group_moves(g),
        }
    }
}

/// What one KV group has of its own: the store its pages live in, the binding that applies its
/// page moves and stages its block tables, and which of its pages may hold data since poisoned.
#[derive(Debug)]
pub(super) struct GroupStore {
    pub(super) kv: HostKvStore,
    pub(super) pages: KvPages,
    pub(super) dirty: Dirty,
}

/// The layers of each group, in layer order: every layer for a full-only engine; the global
/// layers, then the sliding-window layers, for a grouped one.
pub(super) fn group_layers(c: &ModelConfig, grouped: bool) -> Vec<Vec<usize>> {
    if !grouped {
        return vec![(0..c.blocks).collect()];
    }
    let (global, local) = (0..c.blocks).partition(|&l| c.window(l).is_none());
    vec![global, local]
}

/// The pool configurations of the groups: group 0 with the engine's page counts, group 1 with
/// the window group's.
fn pool_configs(cfg: &EngineConfig, groups: usize) -> Vec<KvPoolConfig> {
    (0..groups)
        .map(|g| KvPoolConfig {
            tokens_per_block: cfg.tokens_per_block,
            gpu_pages: if g == 0 {
                cfg.gpu_pages
            } else {
                cfg.window_gpu_pages.unwrap_or(cfg.gpu_pages)
            },
            host_pages: if g == 0 {
                cfg.host_pages
            } else {
                cfg.window_host_pages.unwrap_or(cfg.host_pages)
            },
            slots: MAX_REQUESTS as u32,
            max_blocks: cfg.max_blocks,
        })
        .collect()
}

/// The groups' pools, each with a prefix cache when `cfg.prefix_cache` (KV groups take one in every
/// pool or in none).
fn group_pools(cfg: &EngineConfig) -> Result<[Pool; 2]> {
    let [full, window] = <[KvPoolConfig; 2]>::try_from(pool_configs(cfg, 2))
        .map_err(|_| EngineError::Config("two KV groups".into()))?;
    let pool = |c| {
        if cfg.prefix_cache {
            KvPool::owned_with_prefix_cache(c)
        } else {
            KvPool::owned(c)
        }
    };
    Ok([leader_events(cfg, pool(full)?)?, pool(window)?])
}

/// The leader's pool with a KV event log when `cfg.kv_events` (room for any one step's events:
/// each page at most a move and a drop), as it is otherwise.
fn leader_events(cfg: &EngineConfig, pool: Pool) -> Result<Pool> {
    if !cfg.kv_events {
        return Ok(pool);
    }
    if !cfg.prefix_cache {
        return Err(EngineError::Config(
            "KV events need the prefix cache".into(),
        ));
    }
    let room = 4 * pool.config().page_info_len() + 64;
    Ok(pool.with_kv_events(room)?)
}

/// The scheduler and one store per group for a model of configuration `model` under `cfg`
/// (checked by `check_config`).
pub(super) fn build(model: &ModelConfig, cfg: &EngineConfig) -> Result<(Sched, Vec<GroupStore>)> {
    let peft = AdapterPool::new(cfg.adapter_device_pages, cfg.adapter_host_pages)?;
    let grouped = super::grouped(model, cfg);
    let scheduler: Config = cfg.scheduler;
    let sched = if grouped {
        let window = (0..model.blocks)
            .find_map(|l| model.window(l))
            .ok_or_else(|| EngineError::Config("no sliding-window layer".into()))?;
        let window = u32::try_from(window)
            .map_err(|_| EngineError::Config(format!("a window of {window} positions")))?;
        let [full, local] = group_pools(cfg)?;
        let groups = KvGroups::new([
            Group {
                attention: Attention::Full,
                pool: full,
            },
            Group {
                attention: Attention::Sliding { window },
                pool: local,
            },
        ])
        .map_err(|e| EngineError::Config(format!("KV groups: {e}")))?;
        Sched::Grouped(Scheduler::boxed(scheduler, groups, peft)?)
    } else {
        let [pool_cfg] = <[KvPoolConfig; 1]>::try_from(pool_configs(cfg, 1))
            .map_err(|_| EngineError::Config("one KV pool".into()))?;
        let pool = if cfg.prefix_cache {
            KvPool::owned_with_prefix_cache(pool_cfg)?
        } else {
            KvPool::owned(pool_cfg)?
        };
        let pool = leader_events(cfg, pool)?;
        Sched::Full(Scheduler::boxed(scheduler, pool, peft)?)
    };
    let tables = BlockTableShape::new(MAX_REQUESTS as u32, cfg.max_blocks);
    let stores = group_layers(model, grouped)
        .iter()
        .zip(pool_configs(cfg, sched.groups()))
        .map(|(layers, p)| {
            let layout = KvLayout::of_group(model, cfg.tokens_per_block as usize, layers.len());
            let shape = layout.pool_shape(p.gpu_pages, p.host_pages);
            Ok(GroupStore {
                kv: HostKvStore::new(shape, tables)?,
                pages: KvPages::new(),
                dirty: Dirty::new(shape),
            })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok((sched, stores))
}

/// Each KV group's move log into its host store (offloads, reloads): group 0's first, whose taking
/// settles the requests the pass resumed. Returns the nanoseconds spent taking the logs.
pub(super) fn apply_moves(sched: &mut Sched, stores: &mut [GroupStore]) -> Result<u64> {
    let mut taking_ns = 0;
    for (g, group) in stores.iter_mut().enumerate() {
        let taking = std::time::Instant::now();
        let moves = sched.take_moves(g);
        taking_ns += u64::try_from(taking.elapsed().as_nanos()).unwrap_or(u64::MAX);
        let moved = group.pages.apply_moves(moves, &mut group.kv)?;
        moved.event.wait()?;
        for m in group.pages.last_log() {
            group.dirty.tier(m.from.other())[m.dst as usize] = true;
        }
    }
    Ok(taking_ns)
}

/// Each KV group's block tables of the scheduled requests, from its own pool (a window group's
/// released entries staged as the pad).
pub(super) fn stage_tables(sched: &Sched, out: &Output, stores: &mut [GroupStore]) -> Result<()> {
    for (g, group) in stores.iter_mut().enumerate() {
        let Some(pool) = sched.pool(g) else {
            continue;
        };
        let staged = group.pages.stage_tables(pool, out, &mut group.kv)?;
        staged.event.wait()?;
    }
    Ok(())
}
