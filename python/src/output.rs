//! A pass's output as Python objects: its lists of entries (`Output`), or each list as one `bytes`
//! object of packed entries (`Buffers`, `Delta`), and the page moves.

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};

use kvsched_capi::{Engine, KvschedEntry, KVSCHED_NO_STATE_SLOT};

/// One request of an output list.
#[pyclass(frozen, get_all, module = "kvsched")]
#[derive(Clone)]
pub(crate) struct Entry {
    /// The request's id.
    pub(crate) id: u64,
    /// Its adapter's task id, or None.
    pub(crate) lora_task: Option<u64>,
    /// Context list: the chunk's prompt tokens (0 elsewhere).
    pub(crate) tokens: u32,
    /// Context list: the chunk ends the prompt.
    pub(crate) last: bool,
    /// Its slot (its page-table row).
    pub(crate) slot: u16,
    /// A hybrid engine's scheduled request: its live GPU state slot; None without one (and always
    /// without a state group).
    pub(crate) state_slot: Option<u32>,
}

#[pymethods]
impl Entry {
    fn __repr__(&self) -> String {
        let lora = self.lora_task.map_or("None".into(), |t| t.to_string());
        let last = if self.last { "True" } else { "False" };
        let state = self
            .state_slot
            .map_or(String::new(), |g| format!(", state_slot={g}"));
        format!(
            "Entry(id={}, lora_task={lora}, tokens={}, last={last}, slot={}{state})",
            self.id, self.tokens, self.slot
        )
    }
}

/// One output list as a Python list of entries, built once (the attribute returns the same list).
pub(crate) fn entries(py: Python<'_>, list: &[KvschedEntry]) -> PyResult<Py<PyList>> {
    let entries = list.iter().map(|e| Entry {
        id: e.id,
        lora_task: (e.has_lora != 0).then_some(e.lora_task),
        tokens: e.tokens,
        last: e.last != 0,
        slot: e.slot,
        state_slot: (e.state_slot != KVSCHED_NO_STATE_SLOT).then_some(e.state_slot),
    });
    Ok(PyList::new(py, entries)?.unbind())
}

/// A pass's output: the lists of entries, as Python lists.
#[pyclass(frozen, get_all, module = "kvsched")]
pub(crate) struct Output {
    /// Context chunks to run.
    pub(crate) context: Py<PyList>,
    /// Decode steps to run.
    pub(crate) generation: Py<PyList>,
    /// Suspended this pass (KV moved to the host tier or held).
    pub(crate) paused: Py<PyList>,
    /// Recompute-paused this pass: KV freed, the prefill replays.
    pub(crate) recompute_paused: Py<PyList>,
    /// Disaggregated generation requests whose pages are ready.
    pub(crate) disagg: Py<PyList>,
    /// Scheduled requests whose KV came back from the host tier (copy the moves first).
    pub(crate) resumed: Py<PyList>,
    /// The pass's number.
    pub(crate) pass_number: u64,
}

/// Up to this many ids of a list in `Output`'s repr; the rest are counted.
const REPR_IDS: usize = 8;

/// A list of entries as its ids, `[1, 2, 3]`, or `[1, 2, …, 8, +5 more]` past [`REPR_IDS`].
fn ids_repr(list: &Bound<'_, PyList>) -> String {
    let ids: Vec<String> = list
        .iter()
        .take(REPR_IDS)
        .map(|e| {
            e.extract::<PyRef<'_, Entry>>()
                .map_or_else(|_| "?".into(), |e| e.id.to_string())
        })
        .collect();
    let more = list.len().saturating_sub(REPR_IDS);
    if more == 0 {
        format!("[{}]", ids.join(", "))
    } else {
        format!("[{}, +{more} more]", ids.join(", "))
    }
}

#[pymethods]
impl Output {
    /// The pass number and each list's request ids.
    fn __repr__(&self, py: Python<'_>) -> String {
        let lists = [
            ("context", &self.context),
            ("generation", &self.generation),
            ("paused", &self.paused),
            ("recompute_paused", &self.recompute_paused),
            ("disagg", &self.disagg),
            ("resumed", &self.resumed),
        ]
        .map(|(name, l)| format!("{name}={}", ids_repr(l.bind(py))));
        format!(
            "Output(pass_number={}, {})",
            self.pass_number,
            lists.join(", ")
        )
    }
}

/// Bytes of one packed entry ([`KvschedEntry`], little-endian: id u64, lora_task u64, tokens u32,
/// slot u16, has_lora u8, last u8; `kvsched.ENTRY_FORMAT`). A hybrid engine's state slot is not
/// packed: the format is what it was, and `Entry` objects carry it.
const ENTRY_BYTES: usize = 24;

/// One list as one `bytes` object of packed entries (a buffer: `memoryview`, `numpy.frombuffer` read
/// it without an object per request).
pub(crate) fn packed(py: Python<'_>, list: &[KvschedEntry]) -> PyResult<Py<PyBytes>> {
    let bytes = PyBytes::new_with(py, list.len() * ENTRY_BYTES, |buf| {
        for (e, b) in list.iter().zip(buf.chunks_exact_mut(ENTRY_BYTES)) {
            b[0..8].copy_from_slice(&e.id.to_le_bytes());
            b[8..16].copy_from_slice(&e.lora_task.to_le_bytes());
            b[16..20].copy_from_slice(&e.tokens.to_le_bytes());
            b[20..22].copy_from_slice(&e.slot.to_le_bytes());
            b[22] = e.has_lora;
            b[23] = e.last;
        }
        Ok(())
    })?;
    Ok(bytes.unbind())
}

/// A pass's output as buffers: each list one `bytes` object of packed entries
/// (`kvsched.ENTRY_FORMAT`, 24 bytes each; `kvsched.ids(buf)` reads the ids). After an incremental pass
/// these are the same objects as the last pass's: nothing is copied.
#[pyclass(frozen, get_all, module = "kvsched")]
pub(crate) struct Buffers {
    /// Context chunks to run.
    pub(crate) context: Py<PyBytes>,
    /// Decode steps to run.
    pub(crate) generation: Py<PyBytes>,
    /// Suspended this pass.
    pub(crate) paused: Py<PyBytes>,
    /// Recompute-paused this pass.
    pub(crate) recompute_paused: Py<PyBytes>,
    /// Disaggregated generation requests whose pages are ready.
    pub(crate) disagg: Py<PyBytes>,
    /// Scheduled requests whose KV came back from the host tier.
    pub(crate) resumed: Py<PyBytes>,
    /// The pass's number.
    pub(crate) pass_number: u64,
}

impl Buffers {
    pub(crate) fn of(py: Python<'_>, engine: &Engine) -> PyResult<Self> {
        let l = engine.lists();
        Ok(Self {
            context: packed(py, &l.context)?,
            generation: packed(py, &l.generation)?,
            paused: packed(py, &l.paused)?,
            recompute_paused: packed(py, &l.recompute_paused)?,
            disagg: packed(py, &l.disagg)?,
            resumed: packed(py, &l.resumed)?,
            pass_number: engine.pass(),
        })
    }

    /// The same lists for pass `pass` (an incremental pass kept them).
    pub(crate) fn again(&self, py: Python<'_>, pass: u64) -> Self {
        Self {
            context: self.context.clone_ref(py),
            generation: self.generation.clone_ref(py),
            paused: self.paused.clone_ref(py),
            recompute_paused: self.recompute_paused.clone_ref(py),
            disagg: self.disagg.clone_ref(py),
            resumed: self.resumed.clone_ref(py),
            pass_number: pass,
        }
    }
}

/// What changed in the batch since the last `take_delta` (see the C header's `KvschedDelta`), each
/// list one `bytes` object of packed entries.
#[pyclass(frozen, get_all, module = "kvsched")]
pub(crate) struct Delta {
    /// In the batch now, not at the last call.
    pub(crate) entered: Py<PyBytes>,
    /// In the batch at the last call, not now (as they were then).
    pub(crate) left: Py<PyBytes>,
    /// In both, but not as the next decode step (a chunk, or another list).
    pub(crate) changed: Py<PyBytes>,
    /// The pass the delta leads to.
    pub(crate) pass_number: u64,
}

/// One page copy between the tiers.
#[pyclass(frozen, get_all, module = "kvsched")]
pub(crate) struct PageMove {
    /// Whose page.
    pub(crate) request: u64,
    /// True: host to GPU; false: GPU to host.
    pub(crate) from_host: bool,
    /// Source page in its tier.
    pub(crate) src: u32,
    /// Destination page in the other tier.
    pub(crate) dst: u32,
}
