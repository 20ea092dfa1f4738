//! Scenarios run without expectations: what each pass did, recorded for a differential test to compare
//! run against run ([`record`]). A generated scenario has no expected outputs; the scenario files keep
//! every check of [`crate::run_scenario`].
//!
//! A recorded pass is everything the runner can observe of it: its error, its lists (each context
//! chunk with its tokens and whether it ends the prompt, and the resumed list), every live request's
//! phase, position and ownership, the target pool's and the adapter cache's calls, the stall counter,
//! and, with an adapter cache, what ensure-batch did ([`PassRecord::trace`]); apart, the calls of the
//! pools beside the target (draft, cross, window groups: [`PassRecord::pools`]), which differ by
//! construction between backings.

use kvsched_core::kv::KvBackend;

use crate::error::ScenarioError;
use crate::scenario::{GroupIn, Scenario};
use crate::{grouped, run_with, Out, Run};

/// Which KV backend [`record`] runs the scenario on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backing {
    /// The plain set of pools (`KvSet`), or the file's own `kv.groups` when it has them.
    Plain,
    /// KV groups of one group: the target alone, as the full-attention leader of `PoolGroups`.
    OneGroup,
    /// The target leading one window group as long as a request, which never releases and never
    /// refuses (the grouped suite's backing, `kvsched conformance --grouped`).
    WholeWindow,
}

/// What one pass did, as [`record`] saw it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PassRecord {
    /// What every backing must agree on: the pass's error, lists, chunks, requests, target and
    /// adapter calls, stall counter and ensure-batch outcome; or, for a step the scheduler or the
    /// runner refused, `stopped: ` and why (the record ends there).
    pub trace: String,
    /// The calls of the other pools (draft, cross, window groups), in order.
    pub pools: String,
}

/// Runs `sc` on `backing`, with the incremental pass on or off, checking none of its expectations;
/// returns what each pass did. A refused step (an unknown id, a transfer end the scheduler refuses)
/// ends the record with a last pass saying why, so that two runs still compare.
///
/// # Errors
///
/// [`ScenarioError`]: the scenario is malformed (its configuration, pools or initial requests), or
/// asks for a backing it cannot have (KV groups of its own under [`Backing::OneGroup`] or
/// [`Backing::WholeWindow`], or what groups do not hold: [`grouped::left_out`]).
pub fn record(
    sc: &Scenario,
    backing: Backing,
    incremental: bool,
) -> Result<Vec<PassRecord>, ScenarioError> {
    let window;
    let groups: Option<&[GroupIn]> = match backing {
        Backing::Plain => sc.kv.groups.as_deref(),
        Backing::OneGroup => Some(&[]),
        Backing::WholeWindow => {
            window = [grouped::whole_request_window(sc)];
            Some(&window)
        }
    };
    if backing != Backing::Plain {
        if let Some(why) = grouped::left_out(sc) {
            return Err(ScenarioError::malformed(
                "kv",
                crate::Reason::NotWithGroups(why),
            ));
        }
    }
    let (lines, _) = run_with(sc, groups, incremental, true)?;
    Ok(lines
        .into_iter()
        .map(|line| match line.split_once('\n') {
            Some((trace, pools)) => PassRecord {
                trace: trace.to_owned(),
                pools: pools.to_owned(),
            },
            None => PassRecord {
                trace: line,
                pools: String::new(),
            },
        })
        .collect())
}

impl<K: KvBackend> Run<K> {
    /// [`Run::trace`] with what a record adds: each context chunk's end-of-prompt flag, the resumed
    /// list, every live request's ownership, what ensure-batch did (`ensured`: with an adapter cache,
    /// after a pass that succeeded), and (a line apart) the other pools' calls.
    pub(crate) fn record_line(
        &self,
        out: &Out,
        result: &Result<(), kvsched_core::Error>,
        ensured: Option<&Result<(), String>>,
    ) -> String {
        let s = &*self.sched;
        let last: Vec<bool> = out.context().iter().map(|c| c.last).collect();
        let owners: Vec<(u64, String)> = s
            .requests()
            .map(|(_, e)| (e.spec().id.0, format!("{:?}", e.ownership())))
            .collect();
        format!(
            "{}; last {last:?}; resumed {:?}; ownership {owners:?}; ensure_batch {ensured:?}\n{}",
            self.trace(out, result),
            crate::ids(s, out.resumed().iter()),
            self.kv.other_calls(),
        )
    }
}
