//! Scenarios on a hybrid recurrent model (`kv.state`): the runner's scripted pools, grouped as for
//! `kv.groups` (the target alone, or leading its window groups), become the attention groups of the
//! core's own [`Hybrid`] beside a [`StatePool`](kvsched_core::state_pool::StatePool), so the state
//! rules under test are the ones engines get (docs/HYBRID.md). After every pass the runner drains the
//! state moves and captures, as an engine must, and checks them and the placements against
//! `expect.state` (`hybrid/observe.rs`).
//!
//! A state is taken only through the scheduler's calls (a first chunk's `prepare_context`, a
//! `prepare_disagg_gen_init`), so every request of such a scenario starts without a cache: a started
//! request would hold a cache without a state, which no run of the backend can leave.

use std::collections::{BTreeMap, BTreeSet};

use kvsched_core::config::Config;
use kvsched_core::kv_groups::Hybrid;
use kvsched_core::state_pool::StateConfig;
use kvsched_core::Phase;
use serde::Deserialize;

use crate::error::{Reason, ScenarioError};
use crate::scenario::{GroupIn, Scenario};
use crate::scripted::ScriptedKv;
use crate::{pools, Run};

pub(crate) mod observe;

pub(crate) use observe::{check, merge, trace, Observe};

/// Requests a scenario with a state group may add (the state pool's rows).
pub const MAX_STATE_REQUESTS: usize = 64;

/// The backend of a scenario with `kv.state`: `G` attention groups (the target leading `G - 1`
/// window groups) beside the state group.
pub type HybridBackend<const G: usize> = Hybrid<ScriptedKv, G, MAX_STATE_REQUESTS>;

/// `kv.state`: the recurrent-state group ([`StateConfig`]).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StateIn {
    /// State slots on the GPU (live states, held suspended ones, snapshots).
    pub gpu_slots: u32,
    /// State slots on the host tier.
    #[serde(default)]
    pub host_slots: u32,
    /// Most GPU slots snapshots hold (0: none).
    #[serde(default)]
    pub snapshot_slots: u32,
    /// Tokens between snapshot points (absent: `config.tokens_per_block`).
    pub snapshot_interval: Option<u32>,
    /// Bytes of one state (absent: 1; the pool only refuses 0).
    pub slot_bytes: Option<u64>,
    /// The keys of a request's prompt blocks, by id: block `k`'s key at index `k` (absent: every
    /// block's key is the request's `first_new_block`).
    #[serde(default)]
    pub keys: BTreeMap<String, Vec<u64>>,
}

/// `expect.state`: what the state group did in the pass and holds after it.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StateExpect {
    /// The state moves the pass logged, exact and in order.
    pub moves: Option<Vec<MoveIn>>,
    /// The snapshots the pass set aside (its captures), exact and in order.
    pub captures: Option<Vec<CaptureIn>>,
    /// Where requests' states are, by id: `"gpu"`, `"host"`, `"held"` or `"none"`, optionally with
    /// the slot (`"host 0"`).
    pub placement: Option<BTreeMap<String, String>>,
    /// Free GPU state slots.
    pub gpu_free: Option<u32>,
    /// Snapshots held, pending and ready.
    pub snapshots: Option<u32>,
    /// The ready snapshots under the keys the scenario names, key → position, exact.
    pub ready: Option<BTreeMap<String, u32>>,
    /// The pool's counters since construction (those given).
    pub stats: Option<StatsIn>,
}

/// `expect.state.moves[]`: one state move (the fields given are checked).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MoveIn {
    /// Whose state.
    pub id: u64,
    /// What it does.
    pub op: OpIn,
    /// The source slot.
    pub src: Option<u32>,
    /// The destination slot.
    pub dst: Option<u32>,
    /// A restore's snapshot point (where the snapshot it copies was taken).
    pub position: Option<u32>,
}

/// A state move's operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OpIn {
    /// A suspension: from a GPU slot to a host slot.
    ToHost,
    /// A resumption: from a host slot to a GPU slot.
    ToGpu,
    /// A prefix hit: a snapshot copied into the request's live slot.
    Restore,
}

/// `expect.state.captures[]`: one snapshot set aside.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CaptureIn {
    /// Whose state.
    pub id: u64,
    /// The snapshot point.
    pub position: u32,
    /// The GPU slot (absent: not checked).
    pub slot: Option<u32>,
}

/// `expect.state.stats`: the counters given are checked.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StatsIn {
    /// Snapshots made ready.
    pub snapshots: Option<u64>,
    /// Hits restored from a snapshot.
    pub hits: Option<u64>,
    /// Ready snapshots evicted.
    pub evicted: Option<u64>,
    /// States moved to the host tier.
    pub offloaded: Option<u64>,
    /// States moved back to the GPU.
    pub reloaded: Option<u64>,
}

/// What a scripted pool beside a state group answers for the groups: its request slots (what
/// [`Hybrid::new`] holds against the state slots) and its requests' block keys.
#[derive(Debug, Clone)]
pub struct PoolKeys {
    /// Request slots (without a state group: unbounded).
    pub(crate) slots: u32,
    blocks: BTreeMap<u64, Vec<u64>>,
}

impl Default for PoolKeys {
    fn default() -> Self {
        Self {
            slots: u32::MAX,
            blocks: BTreeMap::new(),
        }
    }
}

impl PoolKeys {
    /// Block `k`'s key of request `id`: from its list when the scenario gives one (none past it),
    /// else `otherwise`.
    pub(crate) fn block_key(&self, id: u64, k: u32, otherwise: Option<u64>) -> Option<u64> {
        match self.blocks.get(&id) {
            Some(keys) => keys.get(k as usize).copied(),
            None => otherwise,
        }
    }
}

impl ScriptedKv {
    /// Its request slots (the group geometry's and the limits').
    pub(crate) fn request_slots(&self) -> u32 {
        self.with(|st| st.hybrid.slots)
    }

    /// Sets its request slots.
    pub(crate) fn set_request_slots(&self, slots: u32) {
        self.with(|st| st.hybrid.slots = slots);
    }

    /// Lists the keys of request `id`'s prompt blocks.
    fn set_block_keys(&self, id: u64, keys: Vec<u64>) {
        self.with(|st| st.hybrid.blocks.insert(id, keys));
    }
}

/// What a scenario with a state group cannot hold, refused with the field that asks for it: a
/// request that starts with a cache, or more requests than the state pool's rows.
fn check_requests(sc: &Scenario) -> Result<(), ScenarioError> {
    if !sc.kv.inactive.is_empty() {
        return Err(ScenarioError::malformed(
            "kv.inactive",
            Reason::NotWithState("a request that starts with a cache"),
        ));
    }
    let no_cache: BTreeSet<u64> = sc.kv.no_cache.iter().copied().collect();
    let initial = sc
        .requests
        .iter()
        .enumerate()
        .map(|(i, r)| (format!("requests[{i}]"), r));
    let added = sc.passes.iter().flatten().enumerate().flat_map(|(k, p)| {
        p.add
            .iter()
            .enumerate()
            .map(move |(j, r)| (format!("passes[{k}].add[{j}]"), r))
    });
    let mut n = 0;
    for (field, r) in initial.chain(added) {
        n += 1;
        let phase = r.state.map_or(Phase::GenerationInProgress, |s| s.0);
        let fresh = matches!(phase, Phase::EncoderInit | Phase::DisaggGenerationInit)
            || (phase == Phase::ContextInit && r.position.unwrap_or(0) == 0);
        if !fresh && !no_cache.contains(&r.id) {
            return Err(ScenarioError::malformed(
                field,
                Reason::NotWithState(
                    "a request that starts with a cache (list it in kv.no_cache, or start it as a \
                     first chunk: a state is taken only by the scheduler's calls)",
                ),
            ));
        }
    }
    if n > MAX_STATE_REQUESTS {
        return Err(ScenarioError::malformed(
            "requests",
            Reason::TooMany {
                what: "requests beside a state group",
                max: MAX_STATE_REQUESTS,
            },
        ));
    }
    Ok(())
}

/// Lists `kv.state.keys` in the `target` pool; returns every key the scenario names (those and the
/// requests' `first_new_block`).
fn set_keys(sc: &Scenario, st: &StateIn, target: &ScriptedKv) -> Result<Vec<u64>, ScenarioError> {
    let mut known = BTreeSet::new();
    for (id, keys) in &st.keys {
        let id = id.parse().map_err(|_| {
            ScenarioError::malformed(
                "kv.state.keys",
                Reason::Key {
                    key: id.clone(),
                    what: "a request id",
                },
            )
        })?;
        known.extend(keys.iter().copied());
        target.set_block_keys(id, keys.clone());
    }
    let named = crate::all_requests(sc).filter_map(|r| r.first_new_block.as_ref()?.as_u64());
    known.extend(named);
    Ok(known.into_iter().collect())
}

/// A scenario's state group, ready to be built.
struct Setup<'a> {
    sc: &'a Scenario,
    cfg: Config,
    state: StateConfig,
    known: Vec<u64>,
    tokens_per_block: u32,
}

/// Runs a scenario with `kv.state` (its `kv.groups` its attention groups beside the target), with
/// the incremental pass on or off; `record`: the expectations unchecked ([`crate::record`]).
pub(crate) fn run(
    sc: &Scenario,
    st: &StateIn,
    cfg: Config,
    incremental: bool,
    record: bool,
) -> Result<(Vec<String>, u64), ScenarioError> {
    check_requests(sc)?;
    let target = crate::target_pool(&sc.kv)?;
    let requests = crate::all_requests(sc).count().max(1);
    target.set_request_slots(u32::try_from(requests).unwrap_or(u32::MAX));
    let known = set_keys(sc, st, &target)?;
    let tokens_per_block = sc.config.tokens_per_block.unwrap_or(64);
    let setup = Setup {
        sc,
        cfg,
        state: StateConfig {
            slot_bytes: st.slot_bytes.unwrap_or(1),
            gpu_slots: st.gpu_slots,
            host_slots: st.host_slots,
            snapshot_slots: st.snapshot_slots,
            snapshot_interval: st.snapshot_interval.unwrap_or(tokens_per_block),
        },
        known,
        tokens_per_block,
    };
    let windows = sc.kv.groups.as_deref().unwrap_or(&[]);
    match windows.len() {
        0 => run_on::<1>(setup, target, windows, incremental, record),
        1 => run_on::<2>(setup, target, windows, incremental, record),
        2 => run_on::<3>(setup, target, windows, incremental, record),
        _ => Err(ScenarioError::malformed(
            "kv.groups",
            Reason::TooMany {
                what: "window groups",
                max: crate::grouped::MAX_WINDOWS,
            },
        )),
    }
}

/// [`run`] on `G` attention groups.
fn run_on<const G: usize>(
    setup: Setup<'_>,
    target: ScriptedKv,
    windows: &[GroupIn],
    incremental: bool,
    record: bool,
) -> Result<(Vec<String>, u64), ScenarioError> {
    let sc = setup.sc;
    let (ctl, groups) =
        pools::Pools::grouped::<G>(&sc.kv, target, windows, setup.tokens_per_block)?;
    let backend: HybridBackend<G> = match Hybrid::new(groups, setup.state) {
        Ok(b) => b,
        // A refusal the scenario expects (the first pass's `expect.error`) is its outcome.
        Err(e) => {
            return match crate::expected_error(sc) {
                Some(want) if e.to_string().contains(want) => {
                    Ok((vec!["refused kv.state".into()], 0))
                }
                _ => Err(ScenarioError::malformed("kv.state", Reason::Refused(e))),
            }
        }
    };
    let mut run = Run::new(sc, setup.cfg, ctl, backend)?;
    let known = setup.known;
    run.state = Some(Box::new(move |s| observe::observe(s, &known)));
    crate::run_on(sc, run, incremental, record)
}
