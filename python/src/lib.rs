//! The `kvsched._native` Python module (PyO3, abi3): the scheduler as Python objects, over the C ABI
//! crate's engine (`kvsched_capi::Engine`: one pool, one adapter cache, one scheduler). The pure-Python
//! package around it (`python/kvsched/`) adds the reference-shaped shim and the type stubs.
#![deny(missing_docs)]

mod errors;
mod kv_events;
mod output;
mod state;

use errors::{
    py_err, py_err_with, AdapterError, CapacityError, DeadlockError, DuplicateRequest,
    KvschedError, RequestTooLarge, StaleOutput, UnknownRequest,
};
use output::{entries, packed, Buffers, Delta, Entry, Output, PageMove};
use pyo3::prelude::*;

use kvsched_capi::{Engine, KvschedConfig, KvschedRequest, KvschedShare, KvschedStepCost};
use kvsched_core::error::Error;

/// The scheduler with its KV pool and adapter cache (capacities fixed at construction).
#[pyclass(unsendable, module = "kvsched")]
struct Scheduler {
    engine: Engine,
    /// The last `schedule_buffers` result, handed back again after an incremental pass.
    buffers: Option<Buffers>,
}

/// `shares=`: up to four `(requests, kv_tokens, adapter_pages)`, class 0 first.
fn shares_of(given: Vec<(u32, u32, u32)>) -> PyResult<[KvschedShare; 4]> {
    if given.len() > 4 {
        return Err(KvschedError::new_err(format!(
            "shares names {} service classes; there are 4",
            given.len()
        )));
    }
    let mut shares = [KvschedShare::default(); 4];
    for (s, (requests, kv_tokens, adapter_pages)) in shares.iter_mut().zip(given) {
        *s = KvschedShare {
            requests,
            kv_tokens,
            adapter_pages,
        };
    }
    Ok(shares)
}

/// `admission=`: its code in the configuration.
fn admission_of(admission: &str) -> PyResult<u8> {
    match admission {
        "fcfs" => Ok(0),
        "priority" => Ok(1),
        other => Err(KvschedError::new_err(format!(
            "unknown admission {other:?} (fcfs, priority)"
        ))),
    }
}

impl Scheduler {
    /// A refusal of this scheduler's engine as its Python exception, with the engine's message (which
    /// names `id`, the request the call named, when it is unknown).
    fn err(&self, e: Error, id: Option<u64>) -> PyErr {
        py_err_with(e, self.engine.message(&e, id))
    }
}

#[pymethods]
impl Scheduler {
    #[new]
    #[pyo3(signature = (*, tokens_per_block=32, gpu_pages=4096, host_pages=8192,
        max_blocks_per_request=256, max_requests=256, max_batch=256, max_num_tokens=8192,
        chunk_unit=512, recompute_pause=true, prefix_cache=true, adapter_device_pages=64,
        adapter_host_pages=1024, kv_events=0, admission="fcfs", itl_target_us=0, step_cost=None,
        shares=None, state_slot_bytes=0, state_gpu_slots=0, state_host_slots=0,
        state_snapshot_slots=0, state_snapshot_interval=0))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        tokens_per_block: u32,
        gpu_pages: u32,
        host_pages: u32,
        max_blocks_per_request: u32,
        max_requests: u32,
        max_batch: u32,
        max_num_tokens: u32,
        chunk_unit: u32,
        recompute_pause: bool,
        prefix_cache: bool,
        adapter_device_pages: u32,
        adapter_host_pages: u32,
        kv_events: u32,
        admission: &str,
        itl_target_us: u64,
        step_cost: Option<(u64, u64, u64, u64, u64)>,
        shares: Option<Vec<(u32, u32, u32)>>,
        state_slot_bytes: u64,
        state_gpu_slots: u32,
        state_host_slots: u32,
        state_snapshot_slots: u32,
        state_snapshot_interval: u32,
    ) -> PyResult<Self> {
        let admission = admission_of(admission)?;
        let (step_ps, prefill_token_ps, decode_request_ps, cached_token_ps, pair_ps) =
            step_cost.unwrap_or_default();
        let shares = shares_of(shares.unwrap_or_default())?;
        let c = KvschedConfig {
            tokens_per_block,
            gpu_pages,
            host_pages,
            max_blocks_per_request,
            max_requests,
            max_batch,
            max_num_tokens,
            chunk_unit,
            recompute_pause: u8::from(recompute_pause),
            prefix_cache: u8::from(prefix_cache),
            adapter_device_pages,
            adapter_host_pages,
            kv_events,
            admission,
            itl_target_us,
            step_cost: KvschedStepCost {
                step_ps,
                prefill_token_ps,
                decode_request_ps,
                cached_token_ps,
                pair_ps,
            },
            shares,
            state_slot_bytes,
            state_gpu_slots,
            state_host_slots,
            state_snapshot_slots,
            state_snapshot_interval,
        };
        Ok(Self {
            engine: Engine::new(&c).map_err(py_err)?,
            buffers: None,
        })
    }

    /// Registers a LoRA adapter of `pages` device pages under `task`.
    fn register_adapter(&mut self, task: u64, pages: u32) -> PyResult<()> {
        self.engine
            .register_adapter(task, pages)
            .map_err(|e| self.err(e, None))
    }

    /// Submits a request. `kind`: "plain", "context_only" (disaggregated: it sends its KV when its
    /// prompt is computed) or "disagg_generation" (its prompt's KV arrives by a transfer). `hashes`:
    /// its prompt's block hashes, one per full page (at most `prompt // tokens_per_block`; more are
    /// refused), for prefix reuse.
    #[pyo3(signature = (id, prompt, *, max_new_tokens=0, lora_task=None, beam=1, draft=0,
        kind="plain", hashes=None, cache_salt=0, priority=0, arrival=0, service_class=0))]
    // PyO3 hands the arguments over owned.
    #[allow(clippy::too_many_arguments, clippy::needless_pass_by_value)]
    fn submit(
        &mut self,
        id: u64,
        prompt: u32,
        max_new_tokens: u32,
        lora_task: Option<u64>,
        beam: u32,
        draft: u32,
        kind: &str,
        hashes: Option<Vec<u64>>,
        cache_salt: u64,
        priority: u8,
        arrival: u64,
        service_class: u8,
    ) -> PyResult<()> {
        let kind = match kind {
            "plain" => 0,
            "context_only" => 1,
            "disagg_generation" => 2,
            other => {
                return Err(pyo3::exceptions::PyValueError::new_err(format!(
                    "kind must be plain, context_only or disagg_generation, not {other:?}"
                )))
            }
        };
        let hashes = hashes.unwrap_or_default();
        let r = KvschedRequest {
            id,
            lora_task: lora_task.unwrap_or(0),
            prompt,
            max_new_tokens,
            beam,
            draft,
            cache_salt,
            arrival,
            has_lora: u8::from(lora_task.is_some()),
            kind,
            priority,
            service_class,
        };
        self.engine
            .submit(&r, &hashes)
            .map_err(|e| self.err(e, Some(id)))
    }

    /// Runs one scheduling pass; its lists are built as Python objects here, once.
    fn schedule(&mut self, py: Python<'_>) -> PyResult<Output> {
        self.engine.schedule().map_err(|e| self.err(e, None))?;
        let l = self.engine.lists();
        Ok(Output {
            context: entries(py, &l.context)?,
            generation: entries(py, &l.generation)?,
            paused: entries(py, &l.paused)?,
            recompute_paused: entries(py, &l.recompute_paused)?,
            disagg: entries(py, &l.disagg)?,
            resumed: entries(py, &l.resumed)?,
            pass_number: self.engine.pass(),
        })
    }

    /// Runs one scheduling pass; its lists as buffers ([`Buffers`]): one `bytes` object a list, the
    /// same objects again after an incremental pass.
    fn schedule_buffers(&mut self, py: Python<'_>) -> PyResult<Buffers> {
        let replayed = self.engine.replayed_passes();
        self.engine.schedule().map_err(|e| self.err(e, None))?;
        let pass = self.engine.pass();
        let b = match &self.buffers {
            // The last pass's lists, kept by an incremental pass.
            Some(last)
                if self.engine.replayed_passes() > replayed && last.pass_number + 1 == pass =>
            {
                last.again(py, pass)
            }
            _ => Buffers::of(py, &self.engine)?,
        };
        self.buffers = Some(b.again(py, pass));
        Ok(b)
    }

    /// What changed in the batch since the last call ([`Delta`]); refused (`StaleOutput`) before the
    /// first pass.
    fn take_delta(&mut self, py: Python<'_>) -> PyResult<Delta> {
        self.engine.take_delta().map_err(|e| self.err(e, None))?;
        let l = self.engine.lists();
        Ok(Delta {
            entered: packed(py, &l.entered)?,
            left: packed(py, &l.left)?,
            changed: packed(py, &l.changed)?,
            pass_number: self.engine.delta_pass(),
        })
    }

    /// Makes the last pass's adapters resident; returns the task ids to load onto the device.
    fn ensure_batch(&mut self) -> PyResult<Vec<u64>> {
        self.engine
            .ensure_batch()
            .map(<[u64]>::to_vec)
            .map_err(|e| self.err(e, None))
    }

    /// The page moves since the last call, in order: copy them before the step.
    fn take_moves(&mut self) -> Vec<PageMove> {
        self.engine
            .take_moves()
            .iter()
            .map(|m| PageMove {
                request: m.request,
                from_host: m.from_host != 0,
                src: m.src,
                dst: m.dst,
            })
            .collect()
    }

    /// The state moves since the last call, in order: run them after the page moves, before the step
    /// (none without a state group). Drain them, and the captures, every step.
    fn take_state_moves(&mut self) -> Vec<state::StateMove> {
        state::take_state_moves(&mut self.engine)
    }

    /// The snapshots to write during the step, logged since the last call (none without a state
    /// group).
    fn take_captures(&mut self) -> Vec<state::Capture> {
        state::take_captures(&mut self.engine)
    }

    /// Completes the last pass's step (contexts advance, recompute-paused requests reset).
    fn complete_step(&mut self) -> PyResult<()> {
        self.engine.complete_step().map_err(|e| self.err(e, None))
    }

    /// A request's page table (GPU page ids; a host page has bit 31 set).
    fn page_table(&self, id: u64) -> PyResult<Vec<u32>> {
        self.engine
            .page_table(id)
            .map(<[u32]>::to_vec)
            .map_err(|e| self.err(e, Some(id)))
    }

    /// Forks request `id` (a fresh id) off request `parent`, which has computed the first
    /// `prompt` tokens of its sequence (the child's prompt): the child starts on the parent's full
    /// pages before its last token, shared, and computes the rest. Returns the positions shared.
    #[pyo3(signature = (parent, id, prompt, *, max_new_tokens=0, lora_task=None))]
    fn fork(
        &mut self,
        parent: u64,
        id: u64,
        prompt: u32,
        max_new_tokens: u32,
        lora_task: Option<u64>,
    ) -> PyResult<u32> {
        let r = KvschedRequest {
            id,
            lora_task: lora_task.unwrap_or(0),
            prompt,
            max_new_tokens,
            beam: 1,
            draft: 0,
            cache_salt: 0,
            arrival: 0,
            has_lora: u8::from(lora_task.is_some()),
            kind: 0,
            priority: 0,
            service_class: 0,
        };
        self.engine
            .fork(parent, &r)
            .map_err(|e| self.err(e, Some(parent)))
    }

    /// Removes a finished or cancelled request.
    fn finish(&mut self, id: u64) -> PyResult<()> {
        self.engine.finish(id).map_err(|e| self.err(e, Some(id)))
    }

    /// Marks a request in flight (the pass skips it) or not.
    fn set_inflight(&mut self, id: u64, inflight: bool) -> PyResult<()> {
        self.engine
            .set_inflight(id, inflight)
            .map_err(|e| self.err(e, Some(id)))
    }

    /// Disaggregated, context side: the send of a context-only request's KV ended.
    #[pyo3(signature = (id, delivered=true))]
    fn end_send(&mut self, id: u64, delivered: bool) -> PyResult<()> {
        self.engine
            .end_send(id, delivered)
            .map_err(|e| self.err(e, Some(id)))
    }

    /// Disaggregated, generation side: the receive into the pages a pass prepared starts.
    fn start_receive(&mut self, id: u64) -> PyResult<()> {
        self.engine
            .start_receive(id)
            .map_err(|e| self.err(e, Some(id)))
    }

    /// Disaggregated, generation side: the receive of a request's prompt KV ended.
    #[pyo3(signature = (id, delivered=true))]
    fn end_receive(&mut self, id: u64, delivered: bool) -> PyResult<()> {
        self.engine
            .end_receive(id, delivered)
            .map_err(|e| self.err(e, Some(id)))
    }

    /// The KV events the prefix cache logged since the last call, in order (none unless built with
    /// `kv_events` > 0).
    fn take_kv_events(&mut self) -> Vec<kv_events::KvEvent> {
        self.engine
            .take_kv_events()
            .iter()
            .map(kv_events::KvEvent::of)
            .collect()
    }

    /// The root a live request's prompt keys chain from: `key[0] = chain(root, hashes[0])`, and the
    /// parent of its first block's stored event.
    fn prefix_root(&self, id: u64) -> PyResult<u64> {
        self.engine
            .prefix_root(id)
            .map_err(|e| self.err(e, Some(id)))
    }

    /// Free GPU KV pages.
    #[getter]
    fn gpu_free(&self) -> u32 {
        self.engine.gpu_free()
    }

    fn __len__(&self) -> usize {
        self.engine.len()
    }
}

/// The module.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Scheduler>()?;
    m.add_class::<Output>()?;
    m.add_class::<Buffers>()?;
    m.add_class::<Delta>()?;
    m.add_class::<Entry>()?;
    m.add_class::<PageMove>()?;
    m.add_class::<state::StateMove>()?;
    m.add_class::<state::Capture>()?;
    m.add_class::<kv_events::KvEvent>()?;
    m.add_function(wrap_pyfunction!(kv_events::chain, m)?)?;
    m.add_function(wrap_pyfunction!(kv_events::encode_kv_events, m)?)?;
    let py = m.py();
    m.add("KvschedError", py.get_type::<KvschedError>())?;
    m.add("CapacityError", py.get_type::<CapacityError>())?;
    m.add("RequestTooLarge", py.get_type::<RequestTooLarge>())?;
    m.add("UnknownRequest", py.get_type::<UnknownRequest>())?;
    m.add("DuplicateRequest", py.get_type::<DuplicateRequest>())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("AdapterError", py.get_type::<AdapterError>())?;
    m.add("DeadlockError", py.get_type::<DeadlockError>())?;
    m.add("StaleOutput", py.get_type::<StaleOutput>())?;
    Ok(())
}
