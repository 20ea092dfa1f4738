//! What a request is: its id, its adapter task's id, and the data the pass reads (`RequestSpec`).

use crate::ids::{RequestId, TaskId};
use crate::phase::Phase;

/// Most FORCE_CHUNK snapshot points one request carries.
pub const MAX_SNAPSHOTS: usize = 8;

/// Most bidirectional multimodal runs one request carries.
pub const MAX_MM_RUNS: usize = 8;

/// What a request is: the data the pass reads. Phase and position change every step.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RequestSpec {
    /// Id.
    pub id: RequestId,
    /// LoRA task, if any.
    pub lora: Option<TaskId>,
    /// Current phase.
    pub phase: Phase,
    /// Prompt length in tokens.
    pub prompt: u32,
    /// Context tokens already processed (in the KV cache).
    pub position: u32,
    /// Beam width this iteration.
    pub beam: u32,
    /// Speculative draft tokens this iteration.
    pub draft: u32,
    /// Output tokens to reserve at admission (GUARANTEED_NO_EVICT) and to check against the pool.
    pub max_new_tokens: u32,
    /// Encoder output length (encoder requests); 0 = use `prompt`.
    pub encoder_len: u32,
    /// FORCE_CHUNK snapshot points (absolute token positions, ascending).
    pub snapshots: heapless::Vec<u32, MAX_SNAPSHOTS>,
    /// A generation request that carries multimodal data (its replay inputs are gone: not a recompute
    /// candidate).
    pub multimodal: bool,
    /// The decoder skips cross-attention projection: no cross cache is touched for its chunks.
    pub skip_cross: bool,
    /// A decoder context waiting on an encoder-output-ready event that has not fired: invisible to the
    /// pass (spec §1.2 step 1).
    pub encoder_pending: bool,
    /// Bidirectional multimodal runs `[start, end)` of prompt positions (ascending, disjoint): a chunk
    /// never ends strictly inside one (spec §1.9). Empty: no multimodal data.
    pub mm_runs: heapless::Vec<(u32, u32), MAX_MM_RUNS>,
    /// The tenant served fairly under [`crate::config::Admission::Vtc`]; `None`: the request's LoRA task
    /// (or the base model) is its client. Fixed at submission.
    pub tenant: Option<u32>,
    /// Priority class under [`crate::config::Admission::Deadline`] (below
    /// [`crate::config::PRIORITY_CLASSES`]): its TTFT deadline is `arrival + ttft[priority]`. Under
    /// [`crate::config::Admission::Priority`], any value: the lower, the sooner (vLLM's `priority`).
    pub priority: u8,
    /// Service class (below [`crate::config::SERVICE_CLASSES`]): what [`crate::Config::shares`]
    /// promises it. `update` may change it while the request is new (it owns nothing), not after.
    pub class: u8,
    /// Arrival time on the engine's clock, in the unit of the deadline configuration (e.g. µs).
    pub arrival: u64,
    /// Disaggregated serving: a context-only request (upstream `LLMREQUEST_TYPE_CONTEXT_ONLY`). It is
    /// scheduled as an ordinary `CONTEXT_INIT` request; when its prompt is computed it sends its KV to a
    /// generation engine instead of decoding (`DISAGG_CONTEXT_TRANS_IN_PROGRESS`, see
    /// [`crate::scheduler::Scheduler::end_send`]).
    pub context_only: bool,
}

impl RequestSpec {
    /// A request in `phase` with a `prompt`-token prompt and defaults elsewhere (position 0, beam 1).
    pub fn new(id: u64, phase: Phase, prompt: u32) -> Self {
        Self {
            id: RequestId(id),
            lora: None,
            phase,
            prompt,
            position: 0,
            beam: 1,
            draft: 0,
            max_new_tokens: 0,
            encoder_len: 0,
            snapshots: heapless::Vec::new(),
            multimodal: false,
            skip_cross: false,
            encoder_pending: false,
            mm_runs: heapless::Vec::new(),
            tenant: None,
            priority: 0,
            class: 0,
            arrival: 0,
            context_only: false,
        }
    }

    /// A decoding request whose prompt is fully processed.
    pub fn generation(id: u64, prompt: u32) -> Self {
        let mut s = Self::new(id, Phase::GenerationInProgress, prompt);
        s.position = prompt;
        s
    }

    /// A context-only request of disaggregated serving (see [`RequestSpec::context_only`]).
    pub fn context_only(id: u64, prompt: u32) -> Self {
        let mut s = Self::new(id, Phase::ContextInit, prompt);
        s.context_only = true;
        s
    }

    /// With a LoRA task.
    pub fn with_lora(mut self, task: u64) -> Self {
        self.lora = Some(TaskId(task));
        self
    }

    /// Invisible to the pass while its encoder output is not ready (spec §1.2 step 1).
    pub fn waits_on_encoder(&self) -> bool {
        self.encoder_pending && self.phase == Phase::ContextInit
    }

    /// Started (spec §1.15): a context-init phase past its first chunk, or a generation phase.
    pub fn started(&self) -> bool {
        (self.phase.is_context_init() && self.position > 0) || self.phase.is_generation()
    }
}
