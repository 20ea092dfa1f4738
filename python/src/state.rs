//! A hybrid recurrent model's state group from Python (issue 46): the state moves to run before the
//! step and the snapshots to write during it, as objects. Each scheduled request's live GPU state
//! slot is its `Entry.state_slot`. docs/HYBRID.md has the rules.

use pyo3::prelude::*;

use kvsched_capi::{Engine, KvschedStateMove, KVSCHED_STATE_TO_GPU, KVSCHED_STATE_TO_HOST};

/// One state copy to run before the step (after the page moves), in log order.
#[pyclass(frozen, get_all, module = "kvsched")]
pub(crate) struct StateMove {
    /// Whose state.
    request: u64,
    /// "to_host" (a suspension: GPU slot `src` to host slot `dst`), "to_gpu" (a resumption: host
    /// slot `src` to GPU slot `dst`) or "restore" (a prefix hit: GPU snapshot slot `src` into the
    /// request's live GPU slot `dst`; the snapshot stays).
    op: &'static str,
    /// Source state slot.
    src: u32,
    /// Destination state slot.
    dst: u32,
}

#[pymethods]
impl StateMove {
    fn __repr__(&self) -> String {
        format!(
            "StateMove(request={}, op={:?}, src={}, dst={})",
            self.request, self.op, self.src, self.dst
        )
    }
}

impl StateMove {
    fn of(m: &KvschedStateMove) -> Self {
        Self {
            request: m.request,
            op: match m.op {
                KVSCHED_STATE_TO_HOST => "to_host",
                KVSCHED_STATE_TO_GPU => "to_gpu",
                _ => "restore",
            },
            src: m.src,
            dst: m.dst,
        }
    }
}

/// A snapshot to write during the step: once request `request`'s scan has passed `position`
/// tokens, copy its state into GPU state slot `slot` (skipped if no chunk of it covers `position`).
#[pyclass(frozen, get_all, module = "kvsched")]
pub(crate) struct Capture {
    /// Whose state.
    request: u64,
    /// The tokens scanned when the state is copied (a snapshot point).
    position: u32,
    /// The GPU state slot the copy goes to.
    slot: u32,
}

#[pymethods]
impl Capture {
    fn __repr__(&self) -> String {
        format!(
            "Capture(request={}, position={}, slot={})",
            self.request, self.position, self.slot
        )
    }
}

/// The engine's state moves since the last call, as objects.
pub(crate) fn take_state_moves(engine: &mut Engine) -> Vec<StateMove> {
    engine
        .take_state_moves()
        .iter()
        .map(StateMove::of)
        .collect()
}

/// The engine's captures since the last call, as objects.
pub(crate) fn take_captures(engine: &mut Engine) -> Vec<Capture> {
    engine
        .take_captures()
        .iter()
        .map(|c| Capture {
            request: c.request,
            position: c.position,
            slot: c.slot,
        })
        .collect()
}
