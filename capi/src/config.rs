//! An engine's configuration and its defaults, and the core's configurations made from it.

use kvsched_core::config::{Admission, ChunkPolicy, Chunking, Config};
use kvsched_core::error::Error;
use kvsched_core::state_pool::StateConfig;
use kvsched_core::{StepBudget, StepCost};

/// An engine's configuration: start from [`kvsched_config_default`] and change what differs. Every
/// capacity is fixed once the engine is built.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvschedConfig {
    /// Tokens per KV page.
    pub tokens_per_block: u32,
    /// GPU KV pages.
    pub gpu_pages: u32,
    /// Host KV pages (0: no host tier).
    pub host_pages: u32,
    /// Longest page table of one request, in pages.
    pub max_blocks_per_request: u32,
    /// Requests the engine holds at once (1 to [`crate::KVSCHED_MAX_REQUESTS`]).
    pub max_requests: u32,
    /// Requests per batch.
    pub max_batch: u32,
    /// Tokens per batch (0: unlimited).
    pub max_num_tokens: u32,
    /// Chunked prefill unit in tokens (0: whole prompts).
    pub chunk_unit: u32,
    /// Destructive recompute pause and context-side preemption allowed (0 or 1).
    pub recompute_pause: u8,
    /// A prefix cache: requests submitted with block hashes reuse cached blocks (0 or 1).
    pub prefix_cache: u8,
    /// Adapter cache device pages.
    pub adapter_device_pages: u32,
    /// Adapter cache host pages.
    pub adapter_host_pages: u32,
    /// KV events the log holds between two `kvsched_take_kv_events` (0: no log; needs the prefix
    /// cache). More become one clear event.
    pub kv_events: u32,
    /// The order of admissions: 0 first come first served, 1 by priority
    /// ([`crate::KvschedRequest::priority`], the lower first; a request refused room makes a running
    /// one of strictly lower priority yield).
    pub admission: u8,
    /// A step budget in time: while decodes run, chunks are sized so that a step's predicted time
    /// stays under this many microseconds (0: none; needs `chunk_unit`).
    pub itl_target_us: u64,
    /// The engine's step cost model for `itl_target_us`.
    pub step_cost: KvschedStepCost,
    /// Service classes' shares, class 0 first ([`crate::KvschedRequest::service_class`]): a class
    /// within its share takes batch slots, KV and adapter pages back from a class above its own;
    /// unused, a share is lent. All zero: no classes.
    pub shares: [KvschedShare; 4],
    /// A hybrid recurrent model's state group (Mamba-2 or gated-DeltaNet layers beside attention,
    /// docs/HYBRID.md): bytes of one request's recurrent state, every recurrent layer's.
    pub state_slot_bytes: u64,
    /// State slots on the GPU: live states (one a scheduled request), held suspended ones and
    /// snapshots. 0: no state group, an attention-only model (the other `state_*` fields must then
    /// be 0 too).
    pub state_gpu_slots: u32,
    /// State slots on the host tier (suspended requests' states). `state_gpu_slots +
    /// state_host_slots` must be at least `max_requests`.
    pub state_host_slots: u32,
    /// Most GPU state slots snapshots (prefix reuse) hold, fewer than `state_gpu_slots` (0: no
    /// snapshot, no prefix hit).
    pub state_snapshot_slots: u32,
    /// Tokens between snapshot points: a whole number of pages (of `tokens_per_block` tokens).
    pub state_snapshot_interval: u32,
}

/// What one service class is promised (docs/ADMISSION.md, "Service classes").
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct KvschedShare {
    /// Batch slots.
    pub requests: u32,
    /// KV tokens: the prompt tokens the class's requests on the GPU computed.
    pub kv_tokens: u32,
    /// Adapter pages of the class's requests' distinct adapters.
    pub adapter_pages: u32,
}

/// An engine's step cost model, in picoseconds per unit of work (`kvsched cost --fit` fits one).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct KvschedStepCost {
    /// Fixed cost of a step.
    pub step_ps: u64,
    /// Per prefill token.
    pub prefill_token_ps: u64,
    /// Per decode request.
    pub decode_request_ps: u64,
    /// Per cached token a decode reads.
    pub cached_token_ps: u64,
    /// Per attention pair of a chunk (tokens × prior context + tokens² / 2).
    pub pair_ps: u64,
}

/// The defaults: 32-token pages, 4,096 GPU and 8,192 host pages, 256 pages a request, 256 requests,
/// batches of 256 requests and 8,192 tokens, 512-token chunks, recompute pause on, a prefix cache, and
/// an adapter cache of 64 device and 1,024 host pages; no KV event log; first come first served, no
/// step budget in time, no service classes; no state group (an attention-only model).
#[no_mangle]
pub extern "C" fn kvsched_config_default() -> KvschedConfig {
    KvschedConfig {
        tokens_per_block: 32,
        gpu_pages: 4096,
        host_pages: 8192,
        max_blocks_per_request: 256,
        max_requests: 256,
        max_batch: 256,
        max_num_tokens: 8192,
        chunk_unit: 512,
        recompute_pause: 1,
        prefix_cache: 1,
        adapter_device_pages: 64,
        adapter_host_pages: 1024,
        kv_events: 0,
        admission: 0,
        itl_target_us: 0,
        step_cost: KvschedStepCost {
            step_ps: 0,
            prefill_token_ps: 0,
            decode_request_ps: 0,
            cached_token_ps: 0,
            pair_ps: 0,
        },
        shares: [KvschedShare {
            requests: 0,
            kv_tokens: 0,
            adapter_pages: 0,
        }; 4],
        state_slot_bytes: 0,
        state_gpu_slots: 0,
        state_host_slots: 0,
        state_snapshot_slots: 0,
        state_snapshot_interval: 0,
    }
}

/// The core's shares of `shares` (`None`: all zero, no classes).
pub(crate) fn shares_of(
    shares: &[KvschedShare; 4],
) -> Option<[kvsched_core::config::Share; kvsched_core::config::SERVICE_CLASSES]> {
    let none = KvschedShare::default();
    shares.iter().any(|s| *s != none).then(|| {
        shares.map(|s| kvsched_core::config::Share {
            requests: s.requests,
            kv_tokens: s.kv_tokens,
            adapter_pages: s.adapter_pages,
        })
    })
}

/// The scheduler's configuration of `c` (validated by the core when the scheduler is built).
pub(crate) fn scheduler_config(c: &KvschedConfig) -> Result<Config, Error> {
    Ok(Config {
        max_num_requests: c.max_batch,
        max_num_tokens: (c.max_num_tokens > 0).then_some(c.max_num_tokens),
        max_context_length: (c.max_num_tokens > 0).then_some(c.max_num_tokens),
        chunking: (c.chunk_unit > 0).then_some(Chunking {
            policy: ChunkPolicy::FirstComeFirstServed,
            unit: c.chunk_unit,
        }),
        recompute_pause: c.recompute_pause != 0,
        admission: match c.admission {
            0 => Admission::Fcfs,
            1 => Admission::Priority,
            _ => return Err(Error::Invalid("admission must be 0 (fcfs) or 1 (priority)")),
        },
        step_budget: (c.itl_target_us > 0).then_some(StepBudget {
            itl_us: c.itl_target_us,
            cost: StepCost {
                step_ps: c.step_cost.step_ps,
                prefill_token_ps: c.step_cost.prefill_token_ps,
                decode_request_ps: c.step_cost.decode_request_ps,
                cached_token_ps: c.step_cost.cached_token_ps,
                pair_ps: c.step_cost.pair_ps,
            },
        }),
        shares: shares_of(&c.shares),
        ..Config::default()
    })
}

/// The state group of `c`: `None` without one (`state_gpu_slots` 0). The core validates the rest
/// (`Hybrid::new`); here only what its messages would name in its own terms: a state field set
/// without GPU slots, more slots a tier than the engine's rows.
pub(crate) fn state_of(c: &KvschedConfig) -> Result<Option<StateConfig>, Error> {
    if c.state_gpu_slots == 0 {
        let rest = [
            c.state_host_slots,
            c.state_snapshot_slots,
            c.state_snapshot_interval,
        ];
        if c.state_slot_bytes != 0 || rest.iter().any(|&x| x != 0) {
            return Err(Error::Invalid(
                "state settings given with state_gpu_slots = 0 (no state group): set \
                 state_gpu_slots, or leave every state_* field 0",
            ));
        }
        return Ok(None);
    }
    if c.state_gpu_slots > crate::KVSCHED_MAX_REQUESTS
        || c.state_host_slots > crate::KVSCHED_MAX_REQUESTS
    {
        return Err(Error::Invalid(
            "state_gpu_slots and state_host_slots must be at most 1024 (KVSCHED_MAX_REQUESTS)",
        ));
    }
    Ok(Some(StateConfig {
        slot_bytes: c.state_slot_bytes,
        gpu_slots: c.state_gpu_slots,
        host_slots: c.state_host_slots,
        snapshot_slots: c.state_snapshot_slots,
        snapshot_interval: c.state_snapshot_interval,
    }))
}
