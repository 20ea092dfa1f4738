//! KV events for Python engines that publish them to a KV-aware router: the log's events as objects,
//! the block keys (`chain`), and vLLM 0.33's wire format (`encode_kv_events`, byte-identical to
//! msgspec's encoding of vLLM's own structs), its events given as dicts with vLLM's field names.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

use kvsched_capi::{KvschedKvEvent, KVSCHED_KV_CLEARED, KVSCHED_KV_STORED};
use kvsched_core::kv::Tier;
use kvsched_core::kv_events::vllm::{encode_batch, VllmEvent};

/// One event of the engine's KV event log.
#[pyclass(frozen, get_all, module = "kvsched")]
pub(crate) struct KvEvent {
    /// "stored", "removed" or "cleared" (vLLM's BlockStored, BlockRemoved, AllBlocksCleared).
    kind: &'static str,
    /// "gpu" or "host" (vLLM's medium "GPU", "CPU").
    tier: &'static str,
    /// The block's key (0 for a clear).
    key: u64,
    /// Its parent's key, the request's root for a prompt's first block (stored events; else 0).
    parent: u64,
}

#[pymethods]
impl KvEvent {
    fn __repr__(&self) -> String {
        format!(
            "KvEvent(kind={:?}, tier={:?}, key={}, parent={})",
            self.kind, self.tier, self.key, self.parent
        )
    }
}

impl KvEvent {
    pub(crate) fn of(e: &KvschedKvEvent) -> Self {
        Self {
            kind: match e.kind {
                KVSCHED_KV_STORED => "stored",
                KVSCHED_KV_CLEARED => "cleared",
                _ => "removed",
            },
            tier: if e.host != 0 { "host" } else { "gpu" },
            key: e.key,
            parent: e.parent,
        }
    }
}

/// A block's key: its parent's key (or the request's root) chained with its hash, as the pool keys it.
#[pyfunction]
pub(crate) fn chain(parent: u64, hash: u64) -> u64 {
    kvsched_capi::kvsched_chain(parent, hash)
}

/// One event read from its dict, owning its lists.
struct Owned {
    kind: u8,
    block_hashes: Vec<u64>,
    token_ids: Vec<u32>,
    parent: Option<u64>,
    block_size: u32,
    lora_id: Option<u64>,
    tier: Tier,
    lora_name: Option<String>,
}

impl Owned {
    /// What the event takes at most on the wire, bytes.
    fn bound(&self) -> usize {
        let name = self.lora_name.as_ref().map_or(0, String::len);
        160 + 9 * self.block_hashes.len() + 5 * self.token_ids.len() + name
    }

    fn wire(&self) -> VllmEvent<'_> {
        match self.kind {
            0 => VllmEvent::Stored {
                block_hashes: &self.block_hashes,
                parent: self.parent,
                token_ids: &self.token_ids,
                block_size: self.block_size,
                lora_id: self.lora_id,
                tier: self.tier,
                lora_name: self.lora_name.as_deref(),
            },
            1 => VllmEvent::Removed {
                block_hashes: &self.block_hashes,
                tier: self.tier,
            },
            _ => VllmEvent::Cleared,
        }
    }
}

fn field<'py, T: FromPyObject<'py>>(d: &Bound<'py, PyDict>, key: &str) -> PyResult<Option<T>> {
    match d.get_item(key)? {
        Some(v) if !v.is_none() => v
            .extract()
            .map(Some)
            .map_err(|e| PyValueError::new_err(format!("{key}: {e}"))),
        _ => Ok(None),
    }
}

fn required<'py, T: FromPyObject<'py>>(d: &Bound<'py, PyDict>, key: &str) -> PyResult<T> {
    field(d, key)?.ok_or_else(|| PyValueError::new_err(format!("{key} is required")))
}

fn read(d: &Bound<'_, PyDict>) -> PyResult<Owned> {
    let kind = match required::<String>(d, "type")?.as_str() {
        "BlockStored" => 0,
        "BlockRemoved" => 1,
        "AllBlocksCleared" => 2,
        other => {
            return Err(PyValueError::new_err(format!(
                "type must be BlockStored, BlockRemoved or AllBlocksCleared, not {other:?}"
            )))
        }
    };
    let tier = match field::<String>(d, "medium")?.as_deref() {
        None | Some("GPU") => Tier::Gpu,
        Some("CPU") => Tier::Host,
        Some(other) => {
            return Err(PyValueError::new_err(format!(
                "medium must be GPU or CPU, not {other:?}"
            )))
        }
    };
    let mut e = Owned {
        kind,
        block_hashes: Vec::new(),
        token_ids: Vec::new(),
        parent: None,
        block_size: 0,
        lora_id: None,
        tier,
        lora_name: None,
    };
    if kind < 2 {
        e.block_hashes = required(d, "block_hashes")?;
    }
    if kind == 0 {
        e.token_ids = required(d, "token_ids")?;
        e.block_size = required(d, "block_size")?;
        e.parent = field(d, "parent_block_hash")?;
        e.lora_id = field(d, "lora_id")?;
        e.lora_name = field(d, "lora_name")?;
        if e.block_hashes.len().checked_mul(e.block_size as usize) != Some(e.token_ids.len()) {
            return Err(PyValueError::new_err(
                "a BlockStored event's token_ids must hold block_size tokens for each block hash",
            ));
        }
    }
    Ok(e)
}

/// The batch `[ts, events, data_parallel_rank]` in vLLM 0.33's format, for a ZMQ PUB socket's
/// payload frame. Each event is a dict with vLLM's field names: `type` ("BlockStored",
/// "BlockRemoved", "AllBlocksCleared"), `block_hashes`, `parent_block_hash`, `token_ids`,
/// `block_size`, `lora_id`, `medium` ("GPU" or "CPU"), `lora_name`. A bad event raises ValueError.
#[pyfunction]
#[pyo3(signature = (events, ts, data_parallel_rank=0))]
// PyO3 hands the arguments over owned.
#[allow(clippy::needless_pass_by_value)]
pub(crate) fn encode_kv_events<'py>(
    py: Python<'py>,
    events: Vec<Bound<'py, PyDict>>,
    ts: f64,
    data_parallel_rank: u32,
) -> PyResult<Bound<'py, PyBytes>> {
    let owned = events.iter().map(read).collect::<PyResult<Vec<_>>>()?;
    let mut buf = vec![0u8; 32 + owned.iter().map(Owned::bound).sum::<usize>()];
    let n = encode_batch(
        &mut buf,
        ts,
        owned.iter().map(Owned::wire),
        data_parallel_rank,
    )
    .map_err(|_| PyValueError::new_err("the batch outgrew its bound (a bug)"))?;
    Ok(PyBytes::new(py, &buf[..n]))
}
