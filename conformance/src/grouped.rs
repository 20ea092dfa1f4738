//! Scenarios on KV groups: the checks of a file's `kv.groups`, and the grouped suite, which runs
//! every scenario file that a grouped backend can hold with its target wrapped as the leader of one
//! window group as long as a request (which never releases and never refuses), and holds every pass
//! to what the plain run did.

use std::path::{Path, PathBuf};

use kvsched_core::config::CapacityPolicy;
use kvsched_core::kv::KvBackend;
use serde_json::Value;

use crate::error::{CollectError, Reason, ScenarioError};
use crate::scenario::{GroupIn, Scenario};
use crate::{collect, parse, run_with, Out, Run};

/// Window groups a scenario may list.
pub const MAX_WINDOWS: usize = 2;

/// A grouped backend takes no sends in flight in any pass (the groups have no transfer manager).
pub(crate) fn check_passes(sc: &Scenario) -> Result<(), ScenarioError> {
    for (k, p) in sc.passes.iter().flatten().enumerate() {
        if p.sends_in_flight == Some(true) {
            return Err(ScenarioError::malformed(
                format!("passes[{k}].sends_in_flight"),
                Reason::NotWithGroups("a transfer manager's sends"),
            ));
        }
    }
    Ok(())
}

impl<K: KvBackend> Run<K> {
    /// What pass `out` did, as the grouped suite compares it: its error, its lists and chunks, every
    /// live request's phase and position, the calls the target pool and the adapter cache recorded,
    /// and the stall counter.
    pub(crate) fn trace(&self, out: &Out, result: &Result<(), kvsched_core::Error>) -> String {
        let s = &*self.sched;
        let context: Vec<(u64, u32)> = out
            .context()
            .iter()
            .map(|c| (crate::id_of(s, c.listed), c.tokens))
            .collect();
        let requests: Vec<(u64, &str, u32)> = s
            .requests()
            .map(|(_, e)| (e.spec().id.0, e.spec().phase.name(), e.spec().position))
            .collect();
        format!(
            "error {:?}; generation {:?}; context {context:?}; encoder {:?}; paused {:?}; \
             recompute_paused {:?}; disagg {:?}; requests {requests:?}; kv {:?}; peft {:?}; stall {}",
            result.as_ref().err().map(ToString::to_string),
            crate::ids(s, out.generation().iter()),
            crate::ids(s, out.encoder().iter()),
            crate::ids(s, out.paused().iter()),
            crate::ids(s, out.recompute_paused().iter()),
            crate::ids(s, out.disagg().iter()),
            &*self.kv.target.calls(),
            &*self.peft.calls(),
            s.stall_count(),
        )
    }
}

/// Why a scenario is left out of the grouped suite: what it needs that KV groups do not hold.
pub fn left_out(sc: &Scenario) -> Option<&'static str> {
    let kv = &sc.kv;
    let encoder = |r: &crate::scenario::RequestIn| {
        r.state
            .is_some_and(|s| s.0 == kvsched_core::Phase::EncoderInit)
            || r.encoder_len.is_some_and(|n| n > 0)
    };
    if kv.state.is_some() {
        Some("a recurrent-state group (the plain suite runs it on its own groups)")
    } else if kv.groups.is_some() {
        Some("KV groups of its own (the plain suite runs it on them)")
    } else if kv.draft.is_some() {
        Some("a draft pool (groups pair with none)")
    } else if kv.connector == Some(true)
        || kv.sends_in_flight == Some(true)
        || sc
            .passes
            .iter()
            .flatten()
            .any(|p| p.sends_in_flight == Some(true))
    {
        Some("a KV connector or sends in flight (groups have no transfers)")
    } else if !matches!(kv.cross, None | Some(Value::Bool(false)))
        || crate::all_requests(sc).any(encoder)
    {
        Some("a cross pool or encoder requests (groups have no cross pool)")
    } else if sc
        .config
        .policy
        .is_some_and(|p| p.0 == CapacityPolicy::GuaranteedNoEvict)
    {
        Some("GUARANTEED_NO_EVICT (refused over sliding windows)")
    } else {
        None
    }
}

/// The grouped suite's one window group: as long as a request of the scripted pools (so every
/// release keeps everything), accepting everything, reusing and probing as the target does.
pub(crate) fn whole_request_window(sc: &Scenario) -> GroupIn {
    let tpb = sc.config.tokens_per_block.unwrap_or(64).max(1);
    GroupIn {
        window: u32::MAX / tpb * tpb,
        ..GroupIn::default()
    }
}

/// The outcome of the grouped suite.
#[derive(Debug, Default)]
pub struct GroupedReport {
    /// Scenarios run on groups that did exactly what they did without.
    pub same: usize,
    /// Scenarios run on groups that did not (or did not pass without groups).
    pub failed: usize,
    /// Scenarios left out: the scenario's name and why.
    pub left_out: Vec<(String, &'static str)>,
    /// One line per scenario run: `ok NAME` or `FAIL NAME: reason`.
    pub lines: Vec<String>,
}

impl GroupedReport {
    /// The closing line, with the left-out scenarios counted by reason.
    pub fn summary(&self) -> String {
        let mut reasons: Vec<(&str, usize)> = Vec::new();
        for (_, why) in &self.left_out {
            match reasons.iter_mut().find(|(w, _)| w == why) {
                Some((_, n)) => *n += 1,
                None => reasons.push((why, 1)),
            }
        }
        let why: Vec<String> = reasons.iter().map(|(w, n)| format!("{n}: {w}")).collect();
        format!(
            "grouped: {} as without groups, {} failed, {} left out ({})",
            self.same,
            self.failed,
            self.left_out.len(),
            why.join("; ")
        )
    }
}

/// Runs every scenario file under `paths` without groups and on groups (those [`left_out`] names
/// are counted, not run), comparing every pass.
///
/// # Errors
///
/// [`CollectError`] when a path names no scenarios; a scenario that differs is a `FAIL` line.
pub fn run_paths_grouped(paths: &[PathBuf]) -> Result<GroupedReport, CollectError> {
    let mut report = GroupedReport::default();
    for f in collect(paths)? {
        let name = f
            .file_stem()
            .map_or_else(String::new, |s| s.to_string_lossy().into_owned());
        match run_file_grouped(&f) {
            Ok(Some(why)) => report.left_out.push((name, why)),
            Ok(None) => {
                report.same += 1;
                report.lines.push(format!("ok {name}"));
            }
            Err(why) => {
                report.failed += 1;
                report.lines.push(format!("FAIL {name}: {why}"));
            }
        }
    }
    Ok(report)
}

/// One file without groups and on groups: `Ok(Some(why))` left out, `Ok(None)` the same passes.
fn run_file_grouped(path: &Path) -> Result<Option<&'static str>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
    let sc = parse(&text).map_err(|(field, message)| format!("{field:?}: {message}"))?;
    if let Some(why) = left_out(&sc) {
        return Ok(Some(why));
    }
    let window = [whole_request_window(&sc)];
    // The plain pools with full passes only, the groups with the incremental pass: a difference of
    // either kind shows.
    let run = |groups: Option<&[GroupIn]>, incremental: bool| {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            run_with(&sc, groups, incremental, false)
        }))
        .map_err(|_| "panicked".to_owned())?
        .map(|(trace, _)| trace)
        .map_err(|e| e.to_string())
    };
    let plain = run(None, false).map_err(|e| format!("without groups: {e}"))?;
    let grouped = run(Some(&window), true).map_err(|e| format!("on groups: {e}"))?;
    if let Some(k) = (0..plain.len().max(grouped.len())).find(|&k| plain.get(k) != grouped.get(k)) {
        return Err(format!(
            "pass {}: without groups {:?}, on groups {:?}",
            k + 1,
            plain.get(k),
            grouped.get(k)
        ));
    }
    Ok(None)
}
