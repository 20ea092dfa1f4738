//! What the engine reports: why a request ended ([`Finish`]), a finished request
//! ([`Completion`]), its counters ([`EngineStats`]) and where a request's KV stands ([`KvExtent`]).

/// Why a request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    /// It sampled a stop token (the last token of its completion), or its guide ended it.
    Stop,
    /// It generated `max_new_tokens` tokens.
    Length,
}

/// A finished request.
#[derive(Debug, Clone, PartialEq)]
pub struct Completion {
    /// The id [`Engine::submit`](crate::Engine::submit) returned.
    pub id: u64,
    /// Its prompt.
    pub prompt: Vec<u32>,
    /// The tokens it generated (a stop token included).
    pub tokens: Vec<u32>,
    /// Why it ended.
    pub finish: Finish,
    /// The logits each token was drawn from (with [`EngineConfig::keep_logits`](crate::EngineConfig::keep_logits); else empty).
    pub logits: Vec<Vec<f32>>,
    /// Each token's log probability (with a sampler that reports them; else empty).
    pub logprobs: Vec<crate::sample::Logprob>,
    /// Prompt positions its first chunk found in the prefix cache.
    pub cached_tokens: usize,
}

/// What an engine did so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EngineStats {
    /// Steps ([`Engine::step`](crate::Engine::step) calls).
    pub steps: u64,
    /// Steps that ran the model.
    pub model_steps: u64,
    /// Requests finished.
    pub finished: u64,
    /// Requests cancelled before they finished ([`Engine::cancel`](crate::Engine::cancel)).
    pub cancelled: u64,
    /// Tokens generated (sampled).
    pub tokens: u64,
    /// Context chunks run (a prompt prefilled in several chunks counts each).
    pub context_chunks: u64,
    /// Most sequences one model step ran.
    pub largest_batch: u64,
    /// Prompt (and replay) positions computed by context chunks.
    pub prefill_tokens: u64,
    /// Suspensions (the KV pool's: pages offloaded to the host tier, or held; a chunked context
    /// the pass did not schedule counts too).
    pub suspensions: u64,
    /// Of those, the ones that moved nothing: the request's pages stayed held on the GPU (no host
    /// tier, or no room there), as for a request merely not scheduled this step.
    pub held_suspensions: u64,
    /// Of those, the pass's evictions under KV pressure (victims and self-evictions).
    pub evictions: u64,
    /// Requests recompute-paused or preempted (their KV dropped, their prefill replayed).
    pub recomputes: u64,
    /// Of those, context-side preemptions.
    pub preemptions: u64,
    /// Prompt positions a first chunk found in the prefix cache instead of computing them.
    pub prefix_reused_tokens: u64,
    /// Positions first chunks looked up in the prefix cache (a prompt, or a replay's context, once
    /// each time it is prefilled; none without a prefix cache): never fewer than the reused ones.
    pub prefix_queried_tokens: u64,
    /// KV pages copied GPU → host.
    pub pages_offloaded: u64,
    /// KV pages copied host → GPU.
    pub pages_reloaded: u64,
    /// Adapters uploaded into device pages.
    pub adapter_loads: u64,
    /// Adapters evicted from the device.
    pub adapter_evictions: u64,
    /// Draft tokens verified by the model (speculative decoding).
    pub drafts_proposed: u64,
    /// Of those, the ones its greedy tokens confirmed (kept).
    pub drafts_accepted: u64,
    /// Of those, the ones rejected (their KV positions rewound).
    pub drafts_rejected: u64,
    /// Context-only requests whose KV send ended (disaggregated serving, prefill side).
    pub kv_sent: u64,
    /// Transferred requests whose KV was received into this engine's pages (decode side).
    pub kv_received: u64,
    /// Samples forked off their first sample (`Engine::submit_samples`) and beams off their beam
    /// (`Engine::submit_beam_search`), sharing its pages.
    pub forks: u64,
    /// Prompt positions the forked samples (and beams) found in their parents' pages.
    pub fork_shared_tokens: u64,
    /// Beams parked: removed after their step to wait, holding no page, for a sibling the pass
    /// did not run (`Engine::submit_beam_search`).
    pub beams_parked: u64,
    /// Nanoseconds in the scheduler's calls of a step (`schedule`, `ensure_batch`, `take_moves`,
    /// `complete_step`), summed over all steps.
    pub scheduler_ns: u64,
    /// Nanoseconds in [`Model::step`](crate::Model::step), summed over all steps.
    pub model_ns: u64,
    /// Nanoseconds preparing the step's batch (its rows and page tables: the batch delta applied, or
    /// with [`EngineConfig::rebuild_batch`](crate::EngineConfig::rebuild_batch) the whole batch rebuilt), summed over all steps.
    pub prep_ns: u64,
    /// Nanoseconds in [`Engine::step`](crate::Engine::step) as a whole, summed over all steps.
    pub step_ns: u64,
}

/// Where a request's KV stands ([`Engine::kv_extent`](crate::Engine::kv_extent)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvExtent {
    /// Positions its KV holds (computed by the model or reused from the prefix cache).
    pub computed: usize,
    /// Entries of its page table in the KV pool (either tier); on KV groups, in group 0's (full
    /// attention).
    pub pages: usize,
}
