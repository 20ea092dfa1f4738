//! What the runner sees of a state group after a pass ([`Seen`]): the moves and captures it drains
//! (as an engine must, every step), every live request's placement and its agreement with the
//! request's cache, the free slots, the snapshots and the counters; its trace, and its check against
//! `expect.state`.

use std::collections::BTreeMap;

use kvsched_core::kv::{CacheState, KvBackend, KvRef, Tier};
use kvsched_core::state_pool::{Capture, Placement, StateOp, StateStats};

use super::{HybridBackend, MoveIn, OpIn, StateExpect};
use crate::error::{Reason, ScenarioError};
use crate::{key_id, Sched};

/// How a run observes its state group after each pass (`None`: it has none).
pub(crate) type Observe<K> = Box<dyn Fn(&mut Sched<K>) -> Seen>;

/// One state move as the runner saw it: whose, what, from and to which slot, and for a restore the
/// snapshot's point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SeenMove {
    id: u64,
    op: OpIn,
    src: u32,
    dst: u32,
    position: Option<u32>,
}

/// The state group after a pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Seen {
    moves: Vec<SeenMove>,
    captures: Vec<Capture>,
    /// Every live request's id and placement.
    rows: Vec<(u64, Placement)>,
    gpu_free: u32,
    snapshots: u32,
    /// Ready snapshots under the keys the scenario names: key → position.
    ready: BTreeMap<u64, u32>,
    stats: StateStats,
    /// Live requests whose state disagrees with their cache.
    disagree: Vec<String>,
}

/// An operation as the format spells it.
fn op_name(op: OpIn) -> &'static str {
    match op {
        OpIn::ToHost => "to_host",
        OpIn::ToGpu => "to_gpu",
        OpIn::Restore => "restore",
    }
}

/// A placement as the format spells it (`"host 0"`).
fn show_place(p: Placement) -> String {
    match p {
        Placement::None => "none".to_owned(),
        Placement::Gpu(g) => format!("gpu {g}"),
        Placement::Host(h) => format!("host {h}"),
        Placement::Held(g) => format!("held {g}"),
    }
}

fn op_of(op: StateOp) -> OpIn {
    match op {
        StateOp::Move(Tier::Gpu) => OpIn::ToHost,
        StateOp::Move(Tier::Host) => OpIn::ToGpu,
        StateOp::Restore => OpIn::Restore,
    }
}

/// Drains the state group's logs and reads it (`known`: the keys the scenario names).
pub(crate) fn observe<const G: usize>(s: &mut Sched<HybridBackend<G>>, known: &[u64]) -> Seen {
    let moves: Vec<_> = s.take_state_moves().to_vec();
    let captures = s.take_captures().to_vec();
    let kv = s.kv();
    let pool = kv.state();
    let moves = moves
        .iter()
        .map(|m| {
            let op = op_of(m.op);
            SeenMove {
                id: m.request.0,
                op,
                src: m.src,
                dst: m.dst,
                position: (op == OpIn::Restore)
                    .then(|| pool.snapshot_position(m.src))
                    .flatten(),
            }
        })
        .collect();
    let mut rows = Vec::new();
    let mut disagree = Vec::new();
    for (h, e) in s.requests() {
        let id = e.spec().id;
        let place = pool.placement(h.index());
        let cache = kv.cache(KvRef {
            slot: h.index(),
            id,
        });
        let agree = match place {
            Placement::None => !cache.exists(),
            Placement::Gpu(_) => cache.is_active(),
            Placement::Host(_) | Placement::Held(_) => cache == CacheState::Inactive,
        };
        if !agree {
            let place = show_place(place);
            disagree.push(format!(
                "request {} has its state at {place:?} and a cache {cache:?}",
                id.0
            ));
        }
        rows.push((id.0, place));
    }
    let ready = known
        .iter()
        .filter_map(|&k| Some((k, pool.snapshot_position(pool.find(k)?)?)))
        .collect();
    Seen {
        moves,
        captures,
        rows,
        gpu_free: pool.gpu_free(),
        snapshots: pool.snapshots(),
        ready,
        stats: pool.stats(),
        disagree,
    }
}

/// A move as the format writes it: `id op src→dst`, a restore with `@position`.
fn show_move(m: &SeenMove) -> String {
    let at = m.position.map_or(String::new(), |p| format!(" @{p}"));
    format!("{} {} {}→{}{at}", m.id, op_name(m.op), m.src, m.dst)
}

/// An expected move, `?` for what it leaves unchecked.
fn show_want(m: &MoveIn) -> String {
    let n = |v: Option<u32>| v.map_or("?".to_owned(), |v| v.to_string());
    let at = m.position.map_or(String::new(), |p| format!(" @{p}"));
    format!("{} {} {}→{}{at}", m.id, op_name(m.op), n(m.src), n(m.dst))
}

/// The state part of a pass's trace line (empty without a state group): what the differential
/// check compares between the incremental and the full run.
pub(crate) fn trace(seen: Option<&Seen>) -> String {
    let Some(s) = seen else {
        return String::new();
    };
    let moves: Vec<String> = s.moves.iter().map(show_move).collect();
    format!(
        "; state moves {moves:?} captures {:?} rows {:?} gpu_free {} snapshots {} ready {:?} \
         stats {:?}",
        s.captures, s.rows, s.gpu_free, s.snapshots, s.ready, s.stats
    )
}

/// A pass's checks (`result`) with the state group's differences (`extra`) added.
pub(crate) fn merge(
    result: Result<(), ScenarioError>,
    extra: Vec<String>,
    pass: Option<usize>,
) -> Result<(), ScenarioError> {
    match result {
        Ok(()) if extra.is_empty() => Ok(()),
        Ok(()) => Err(ScenarioError::Mismatch { pass, diffs: extra }),
        Err(ScenarioError::Mismatch { pass, mut diffs }) => {
            diffs.extend(extra);
            Err(ScenarioError::Mismatch { pass, diffs })
        }
        Err(e) => Err(e),
    }
}

/// The state group against `expect.state` (at `field`, `expect` or `passes[k].expect`), and the
/// agreement of every live request's state with its cache, which always holds.
pub(crate) fn check(
    want: Option<&StateExpect>,
    seen: Option<&Seen>,
    field: &str,
) -> Result<Vec<String>, ScenarioError> {
    let mut diffs: Vec<String> = seen
        .iter()
        .flat_map(|s| s.disagree.iter().map(|d| format!("state: {d}")))
        .collect();
    let Some(want) = want else {
        return Ok(diffs);
    };
    let field = format!("{field}.state");
    let Some(seen) = seen else {
        return Err(ScenarioError::malformed(field, Reason::NeedsState));
    };
    check_moves(want, seen, &mut diffs);
    check_captures(want, seen, &mut diffs);
    check_placement(want, seen, &field, &mut diffs)?;
    check_counts(want, seen, &field, &mut diffs)?;
    Ok(diffs)
}

fn check_moves(want: &StateExpect, seen: &Seen, diffs: &mut Vec<String>) {
    let Some(w) = &want.moves else { return };
    let same = w.len() == seen.moves.len()
        && w.iter().zip(&seen.moves).all(|(w, g)| {
            let at = |v: Option<u32>, got: Option<u32>| v.is_none() || v == got;
            w.id == g.id
                && w.op == g.op
                && at(w.src, Some(g.src))
                && at(w.dst, Some(g.dst))
                && at(w.position, g.position)
        });
    if !same {
        let w: Vec<String> = w.iter().map(show_want).collect();
        let g: Vec<String> = seen.moves.iter().map(show_move).collect();
        diffs.push(format!("state.moves: expected {w:?}, got {g:?}"));
    }
}

fn check_captures(want: &StateExpect, seen: &Seen, diffs: &mut Vec<String>) {
    let Some(w) = &want.captures else { return };
    let same = w.len() == seen.captures.len()
        && w.iter().zip(&seen.captures).all(|(w, g)| {
            w.id == g.request.0 && w.position == g.position && w.slot.is_none_or(|s| s == g.slot)
        });
    if !same {
        let show = |id: u64, p: u32, s: Option<u32>| {
            format!(
                "{id} @{p} slot {}",
                s.map_or("?".to_owned(), |s| s.to_string())
            )
        };
        let w: Vec<String> = w.iter().map(|c| show(c.id, c.position, c.slot)).collect();
        let g: Vec<String> = seen
            .captures
            .iter()
            .map(|c| show(c.request.0, c.position, Some(c.slot)))
            .collect();
        diffs.push(format!("state.captures: expected {w:?}, got {g:?}"));
    }
}

/// `"gpu"`, `"host"`, `"held"` or `"none"`, optionally with a slot: whether `place` matches.
fn placement_matches(field: &str, want: &str, place: Placement) -> Result<bool, ScenarioError> {
    let bad = || {
        ScenarioError::malformed(
            field,
            Reason::Expected("\"gpu\", \"host\", \"held\" or \"none\", optionally with a slot"),
        )
    };
    let mut words = want.split_whitespace();
    let tier = words.next().ok_or_else(bad)?;
    let slot = match words.next() {
        None => None,
        Some(n) => Some(n.parse::<u32>().map_err(|_| bad())?),
    };
    if words.next().is_some() || (tier == "none" && slot.is_some()) {
        return Err(bad());
    }
    let (got, at) = match place {
        Placement::None => ("none", None),
        Placement::Gpu(g) => ("gpu", Some(g)),
        Placement::Host(h) => ("host", Some(h)),
        Placement::Held(g) => ("held", Some(g)),
    };
    if !["none", "gpu", "host", "held"].contains(&tier) {
        return Err(bad());
    }
    Ok(tier == got && (slot.is_none() || slot == at))
}

fn check_placement(
    want: &StateExpect,
    seen: &Seen,
    field: &str,
    diffs: &mut Vec<String>,
) -> Result<(), ScenarioError> {
    for (id, w) in want.placement.iter().flatten() {
        let f = format!("{field}.placement");
        let n = key_id(&f, id, "an id")?;
        let place = seen
            .rows
            .iter()
            .find(|(i, _)| *i == n)
            .map_or(Placement::None, |(_, p)| *p);
        if !placement_matches(&format!("{f}.{id}"), w, place)? {
            let got = show_place(place);
            diffs.push(format!("state.placement.{id}: expected {w:?}, got {got:?}"));
        }
    }
    Ok(())
}

fn check_counts(
    want: &StateExpect,
    seen: &Seen,
    field: &str,
    diffs: &mut Vec<String>,
) -> Result<(), ScenarioError> {
    let mut count = |name: &str, w: Option<u64>, got: u64| {
        if let Some(w) = w {
            if w != got {
                diffs.push(format!("state.{name}: expected {w}, got {got}"));
            }
        }
    };
    count(
        "gpu_free",
        want.gpu_free.map(u64::from),
        seen.gpu_free.into(),
    );
    count(
        "snapshots",
        want.snapshots.map(u64::from),
        seen.snapshots.into(),
    );
    let st = want.stats.clone().unwrap_or_default();
    let got = seen.stats;
    count("stats.snapshots", st.snapshots, got.snapshots);
    count("stats.hits", st.hits, got.hits);
    count("stats.evicted", st.evicted, got.evicted);
    count("stats.offloaded", st.offloaded, got.offloaded);
    count("stats.reloaded", st.reloaded, got.reloaded);
    if let Some(w) = &want.ready {
        let mut ready = BTreeMap::new();
        for (k, &p) in w {
            ready.insert(key_id(&format!("{field}.ready"), k, "a block key")?, p);
        }
        if ready != seen.ready {
            diffs.push(format!(
                "state.ready: expected {ready:?}, got {:?}",
                seen.ready
            ));
        }
    }
    Ok(())
}
