//! The serving loop: kvsched-core's [`Scheduler`] over a real two-tier [`KvPool`] (optional prefix
//! cache) and a LoRA [`AdapterPool`], driving the model's paged step through kvsched-gpu's stores
//! and bindings, the same path a CUDA store takes.
//!
//! Every [`Engine::step`]:
//!
//! 1. `schedule` and `ensure_batch` (the pass and the adapter plan);
//! 2. the KV move log ([`KvPages::apply_moves`]: suspended requests' pages offloaded to the host
//!    tier of the [`HostKvStore`](kvsched_gpu::HostKvStore), resumed ones' reloaded; each KV
//!    group's log into its own store), then the adapters' host copies
//!    ([`AdapterSlots::apply_host_changes`]: weights written into the adapter store's host pages)
//!    and the adapter plan ([`AdapterSlots::apply_plan`]: evictions, uploads into device pages),
//!    and the block tables ([`KvPages::stage_tables`]);
//! 3. a [`Batch`] from the output: a context chunk runs tokens `position..position + tokens` of its
//!    request (after a prefix match the position is past the reused tokens), a generation step its
//!    last token, each over its GPU page list from the pool's table and, with an adapter, the device
//!    pages the adapter plan gave it;
//! 4. [`Model::step`], `complete_step`, then sampling: a prompt's last chunk and every generation
//!    step yield a token; a request finishes on a stop token or after `max_new_tokens` and is
//!    removed;
//! 5. a request the pass recompute-paused or preempted replays its prefill from its prompt and the
//!    tokens it generated so far: its scheduler prompt becomes that many tokens.
//!
//! With [`EngineConfig::poison`] every free KV page (both tiers) and every free adapter page is
//! filled with NaN after each step, so a step that reads a page it does not own shows up as a wrong
//! token.
//!
//! # KV groups
//!
//! A hybrid-attention model (one whose configuration has sliding-window layers, e.g. Gemma 3) is
//! served on kvsched-core's `KvGroups` unless [`EngineConfig::full_attention_only`]: group 0 holds
//! the global layers' KV, group 1 the sliding-window layers', each in a
//! [`HostKvStore`](kvsched_gpu::HostKvStore) of its own whose pages hold only that group's layers.
//! The window group gives up a request's pages wholly before its window (their table entries
//! become [`crate::Sequence::RELEASED`]), so a decoding request holds about
//! `window / tokens_per_block + 1` pages there. Each group's page moves are applied to its own
//! store, each group's block tables staged from its own pool. With the prefix cache, a hit is the
//! longest prefix whose blocks the full group holds and whose last window the window group holds
//! (kvsched-core's window rule). Not on groups yet (refused with [`EngineError::Grouped`]):
//! disaggregated transfers and speculative drafts.

use std::collections::HashMap;

use kvsched_core::adapter::{HostChange, TaskRef};
use kvsched_core::ids::TaskSlot;
use kvsched_core::kv::{chain, Tier};
use kvsched_core::output::Listed;
use kvsched_core::page_pool::{page_of, HOST, NO_PAGE};
use kvsched_core::request::{Ownership, RequestSpec};
use kvsched_core::{ChunkPolicy, Chunking, Config, Phase};
use kvsched_core::{SchedulerOutput, TaskId};
use kvsched_gpu::{AdapterSlots, HostAdapterStore, PageStore};
use kvsched_gpu::{MemError, PoolShape};

use crate::draft::PromptLookup;
use crate::error::{EngineError, Grouped, Limit, Refusal, Result};
use crate::lora::Lora;
use crate::model::Model;
use crate::sample::Sampler;
use backend::{GroupStore, Output, Sched};
pub use control::EngineLoad;
pub use disagg::KvTransfer;
pub use report::{Completion, EngineStats, Finish, KvExtent};
pub use run::STALL_STEPS;

/// The most requests an engine can hold at once (its scheduler's table, allocated once on the
/// heap); `EngineConfig::scheduler.max_num_requests` chooses how many it does, up to this.
pub const MAX_REQUESTS: usize = 256;
/// Requests an engine holds at once by default (vLLM's CPU default, and this engine's before the
/// table grew).
pub const DEFAULT_REQUESTS: u32 = 32;
/// Adapters the engine can register (its adapter cache's task slots).
pub const MAX_ADAPTERS: usize = 8;

/// How an [`Engine`] is built.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EngineConfig {
    /// The scheduler's configuration (token budget, chunking, capacity policy, ...). Its
    /// `max_num_requests` is capped at [`MAX_REQUESTS`].
    pub scheduler: Config,
    /// Positions a KV page holds.
    pub tokens_per_block: u32,
    /// GPU-tier KV pages (the ones attention reads).
    pub gpu_pages: u32,
    /// Host-tier KV pages (the suspend tier); 0: no host tier (recompute and preemption instead).
    pub host_pages: u32,
    /// Pages one request's table holds at most (with `tokens_per_block`, the longest request).
    pub max_blocks: u32,
    /// A prefix cache in the KV pool: prompts sharing full leading blocks reuse them.
    pub prefix_cache: bool,
    /// Bytes of an adapter page.
    pub adapter_page_bytes: usize,
    /// Device adapter pages (the adapter cache's device tier).
    pub adapter_device_pages: u32,
    /// Host adapter pages (the adapter cache's host budget).
    pub adapter_host_pages: u32,
    /// Fill every free KV and adapter page with NaN after each step (for tests).
    pub poison: bool,
    /// Keep the logits each sampled token was drawn from in its [`Completion`] (for tests).
    pub keep_logits: bool,
    /// Speculative decoding with prompt-lookup drafts for greedy requests: each step a decoding
    /// request proposes draft tokens from its own tokens ([`PromptLookup::propose`]), submitted as
    /// its `RequestSpec::draft`; the model verifies them in one row of 1 + drafts tokens, the
    /// longest prefix matching its greedy tokens is kept with the token after it, and the rejected
    /// positions are rewound in the KV pool ([`kvsched_core::Scheduler::rewind`]). `None`: no
    /// drafts. Full attention only (refused on KV groups).
    pub speculative: Option<PromptLookup>,
    /// Serve a hybrid-attention model (sliding-window layers) with every layer's KV in one pool,
    /// as full attention, instead of on KV groups (the module docs): what a model without
    /// sliding-window layers always gets. For comparisons, and for what groups do not do yet.
    pub full_attention_only: bool,
    /// GPU-tier pages of the sliding-window group (KV group 1) of a grouped engine; `None`:
    /// `gpu_pages`. A page of it holds the sliding-window layers' KV only.
    pub window_gpu_pages: Option<u32>,
    /// Host-tier pages of the sliding-window group; `None`: `host_pages`.
    pub window_host_pages: Option<u32>,
    /// Log the prefix cache's KV events ([`Engine::take_kv_events`]: what a KV-aware router learns
    /// the cache holds); needs `prefix_cache`. Off by default.
    pub kv_events: bool,
    /// Rebuild the step's rows and page tables from the output's full lists every step, instead of
    /// keeping them from step to step and applying the scheduler's batch delta (`serve/batch.rs`):
    /// the peer [`EngineStats::prep_ns`] is measured against. Off by default.
    pub rebuild_batch: bool,
}

impl Default for EngineConfig {
    /// 256 GPU pages of 16 positions, requests of up to 2,048 tokens, prompts prefilled in chunks of
    /// a page (first come, first served) within the scheduler's 1,024-token step budget: the
    /// scheduler's own default takes whole prompts only, up to 1,024 tokens, so a longer prompt would
    /// never be scheduled.
    fn default() -> Self {
        Self {
            scheduler: Config {
                max_num_requests: DEFAULT_REQUESTS,
                max_context_length: None,
                chunking: Some(Chunking {
                    policy: ChunkPolicy::FirstComeFirstServed,
                    unit: 16,
                }),
                ..Config::DEFAULT
            },
            tokens_per_block: 16,
            gpu_pages: 256,
            host_pages: 0,
            max_blocks: 128,
            prefix_cache: false,
            adapter_page_bytes: 256 * 1024,
            adapter_device_pages: 32,
            adapter_host_pages: 64,
            poison: false,
            keep_logits: false,
            speculative: None,
            full_attention_only: false,
            window_gpu_pages: None,
            window_host_pages: None,
            kv_events: false,
            rebuild_batch: false,
        }
    }
}

/// One sequence of the step's batch.
#[derive(Debug, Clone, Copy)]
struct Row {
    slot: u16,
    start: usize,
    len: usize,
    logits: bool,
    task: Option<TaskSlot>,
    /// A context chunk (else a generation step).
    context: bool,
}

/// Pages that may hold data since they were last filled with NaN, per tier.
#[derive(Debug, Default)]
struct Dirty {
    gpu: Vec<bool>,
    host: Vec<bool>,
}

impl Dirty {
    fn new(shape: PoolShape) -> Self {
        Self {
            gpu: vec![true; shape.gpu_pages as usize],
            host: vec![true; shape.host_pages as usize],
        }
    }

    fn tier(&mut self, tier: Tier) -> &mut Vec<bool> {
        match tier {
            Tier::Gpu => &mut self.gpu,
            Tier::Host => &mut self.host,
        }
    }
}

/// The serving engine: a model, kvsched's scheduler and the stores its pages live in.
pub struct Engine<'m> {
    model: &'m Model,
    cfg: EngineConfig,
    sched: Sched,
    out: Output,
    /// One per KV group (one for a full-only engine), in group order.
    kv: Vec<GroupStore>,
    adapters: HostAdapterStore,
    slots: AdapterSlots,
    /// Adapter weights (the KVLR format) by task slot.
    weights: Vec<Vec<u8>>,
    tasks: HashMap<u64, TaskRef>,
    live: Vec<Option<Live>>,
    next_id: u64,
    stats: EngineStats,
    adapter_dirty: Dirty,
    host_changes: Vec<(TaskRef, HostChange)>,
    evicted: Vec<TaskRef>,
    /// The KV events' blocks and the events not yet taken (`events.rs`).
    events: events::Book,
    /// The step's rows and their page tables, kept from step to step (`batch.rs`).
    batch: batch::Persistent,
    delta: batch::Delta,
    /// The beam searches in progress and the finished ones' results (`beams.rs`).
    beams: beams::Book,
    /// Samples waiting for room, detached from their first sample (`samples.rs`).
    detached: samples::Waiting,
}

impl std::fmt::Debug for Engine<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("config", &self.cfg)
            .field("requests", &self.sched.len())
            .field("kv_groups", &self.sched.groups())
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

mod backend;
mod batch;
mod beams;
mod control;
mod disagg;
pub(crate) mod events;
mod live;
#[cfg(test)]
mod measure;
mod options;
mod report;
mod run;
mod samples;
use live::Live;

pub use beams::{BeamResult, BeamSearch, BeamSequence};
pub use options::{Guide, GuideError, SubmitOptions};
pub use samples::Sample;
mod spec;

impl<'m> Engine<'m> {
    /// An engine serving `model` with `config`: its KV store is layer-major
    /// ([`crate::KvLayout::pool_shape`]), one page of `tokens_per_block` positions for every layer;
    /// for a hybrid-attention model (unless [`EngineConfig::full_attention_only`]), one store per KV
    /// group, a page of each holding its group's layers (the module docs). Refused (`Config`,
    /// `Scheduler`, `Memory`) for a geometry the pools, the scheduler or the stores refuse, and
    /// ([`EngineError::Grouped`]) for what KV groups do not do yet: speculative drafts.
    pub fn new(model: &'m Model, config: EngineConfig) -> Result<Self> {
        let mut cfg = config;
        cfg.scheduler.max_num_requests = cfg.scheduler.max_num_requests.min(MAX_REQUESTS as u32);
        check_config(model, &cfg)?;
        check_grouped(model, &cfg)?;
        let (sched, kv) = backend::build(model.config(), &cfg)?;
        let adapter_shape = PoolShape::new(
            cfg.adapter_page_bytes,
            cfg.adapter_device_pages,
            cfg.adapter_host_pages,
        );
        let adapters = HostAdapterStore::new(adapter_shape)?;
        Ok(Self {
            model,
            cfg,
            sched,
            out: SchedulerOutput::new_in()?,
            kv,
            adapters,
            slots: AdapterSlots::new(adapter_shape)?,
            weights: Vec::new(),
            tasks: HashMap::new(),
            live: (0..MAX_REQUESTS).map(|_| None).collect(),
            next_id: 1,
            stats: EngineStats::default(),
            adapter_dirty: Dirty::new(adapter_shape),
            host_changes: Vec::with_capacity(MAX_ADAPTERS),
            evicted: Vec::with_capacity(MAX_ADAPTERS),
            events: events::Book::default(),
            batch: batch::Persistent::new(),
            delta: batch::Delta::new_in()?,
            beams: beams::Book::default(),
            detached: samples::Waiting::default(),
        })
    }

    /// The configuration in force.
    pub fn config(&self) -> &EngineConfig {
        &self.cfg
    }

    /// The model.
    pub fn model(&self) -> &'m Model {
        self.model
    }

    /// What the engine did so far. On KV groups, suspensions are group 0's (every group suspends
    /// a request together) and the pages offloaded and reloaded are summed over the groups.
    pub fn stats(&self) -> EngineStats {
        let mut s = self.stats;
        let leader = self.sched.leader().stats();
        s.suspensions = leader.suspends;
        s.held_suspensions = leader.held_suspends;
        s.pages_offloaded = 0;
        s.pages_reloaded = 0;
        for g in 0..self.sched.groups() {
            if let Some(kv) = self.sched.pool(g).map(kvsched_core::KvPool::stats) {
                s.pages_offloaded += kv.pages_offloaded;
                s.pages_reloaded += kv.pages_reloaded;
            }
        }
        s
    }

    /// Where request `id`'s KV stands: positions computed and page-table entries; `None` once it
    /// finished, or for an unknown id.
    pub fn kv_extent(&self, id: u64) -> Option<KvExtent> {
        let live = self.live.iter().flatten().find(|l| l.id == id)?;
        Some(KvExtent {
            computed: live.computed,
            pages: self.sched.leader().table(live.handle.index()).len(),
        })
    }

    /// KV groups the engine's pages are in: 2 for a hybrid-attention model on groups (0 full
    /// attention, 1 the sliding window), else 1.
    pub fn kv_groups(&self) -> usize {
        self.sched.groups()
    }

    /// Pages request `id` holds in KV group `group` (either tier; the window group's released
    /// entries not counted); `None` once it finished, for an unknown id or group.
    pub fn pages_held(&self, id: u64, group: usize) -> Option<usize> {
        let live = self.live.iter().flatten().find(|l| l.id == id)?;
        let table = self.sched.pool(group)?.table(live.handle.index());
        Some(table.iter().filter(|&&e| e != NO_PAGE).count())
    }

    /// Bytes of one page of KV group `group` (its layers' keys and values of `tokens_per_block`
    /// positions); `None` for an unknown group.
    pub fn kv_page_bytes(&self, group: usize) -> Option<usize> {
        self.kv.get(group).map(|g| g.kv.shape().page_bytes)
    }

    /// Requests submitted and not finished.
    pub fn len(&self) -> usize {
        self.sched.len()
    }

    /// Whether no request is waiting or running.
    pub fn is_empty(&self) -> bool {
        self.sched.is_empty() && self.detached.is_empty() && !self.searching()
    }

    /// Tokens request `id` has generated so far (`None` once it finished, or for an unknown id).
    pub fn generated(&self, id: u64) -> Option<usize> {
        self.live
            .iter()
            .flatten()
            .find(|l| l.id == id)
            .map(Live::generated)
    }

    /// Where request `id` stands in the scheduler's lifecycle (waiting, active, suspended on the
    /// host tier, waiting to replay its prefill, ...); `None` once it finished, or for an unknown id.
    pub fn ownership(&self, id: u64) -> Option<Ownership> {
        let live = self.live.iter().flatten().find(|l| l.id == id)?;
        self.sched.get(live.handle).ok().map(|e| e.ownership())
    }

    /// Registers adapter `id` with weights `lora`: the adapter cache learns its page count; its
    /// weights are written into the adapter store's pages when the cache loads it. Refused
    /// (`AdapterCache`, `Memory`) for a duplicate id, a full task table, an adapter larger than the
    /// cache's device or host pages.
    pub fn register_adapter(&mut self, id: u64, lora: &Lora) -> Result<()> {
        let bytes = lora.to_bytes();
        let pages = self.slots.pages_for(bytes.len());
        let task = self.sched.register_adapter(TaskId(id), pages)?;
        self.slots.register_task(task, pages)?;
        let slot = usize::from(task.slot);
        if self.weights.len() <= slot {
            self.weights.resize_with(slot + 1, Vec::new);
        }
        self.weights[slot] = bytes;
        self.tasks.insert(id, task);
        Ok(())
    }

    /// Queues a request: `prompt` tokens, then up to `max_new_tokens` generated ones picked by
    /// `sampler`, on adapter `adapter` (registered with [`Engine::register_adapter`]) or the base
    /// model. Its prompt's block hashes (one per full page of tokens) let it reuse the prefix cache.
    /// Returns the request's id (its [`Completion::id`]).
    ///
    /// Refused ([`EngineError::Refused`], nothing queued): an empty prompt, no new tokens, a token
    /// outside the vocabulary, a request longer than the model's context or than one request's page
    /// table, an unknown adapter, a request the scheduler refuses (a full table).
    pub fn submit(
        &mut self,
        prompt: &[u32],
        max_new_tokens: usize,
        adapter: Option<u64>,
        sampler: Sampler,
    ) -> Result<u64> {
        self.check_request(prompt, max_new_tokens, adapter)?;
        let mut spec = RequestSpec::new(self.next_id, Phase::ContextInit, prompt.len() as u32);
        spec.max_new_tokens = max_new_tokens as u32;
        spec.lora = adapter.map(TaskId);
        self.enqueue(
            spec,
            prompt.to_vec(),
            (max_new_tokens, adapter, sampler),
            None,
        )
    }

    fn check_request(&self, prompt: &[u32], max_new: usize, adapter: Option<u64>) -> Result<()> {
        let c = self.model.config();
        if prompt.is_empty() {
            return Err(Refusal::EmptyPrompt.into());
        }
        if max_new == 0 {
            return Err(Refusal::NoNewTokens.into());
        }
        if let Some(&token) = prompt.iter().find(|&&t| t as usize >= c.vocab) {
            let vocab = c.vocab;
            return Err(Refusal::Token { token, vocab }.into());
        }
        let pages = self.cfg.max_blocks as usize * self.cfg.tokens_per_block as usize;
        for (limit, what) in [
            (c.context_length, Limit::ModelContext),
            (pages, Limit::RequestPages),
        ] {
            if prompt.len() + max_new > limit {
                let prompt = prompt.len();
                return Err(Refusal::TooLong {
                    prompt,
                    max_new,
                    limit,
                    what,
                }
                .into());
            }
        }
        match adapter {
            Some(id) if !self.tasks.contains_key(&id) => Err(Refusal::UnknownAdapter(id).into()),
            _ => Ok(()),
        }
    }
}

/// Whether `cfg` serves `model` on KV groups: it has sliding-window layers and full attention is
/// not forced.
fn grouped(c: &crate::gguf::ModelConfig, cfg: &EngineConfig) -> bool {
    !cfg.full_attention_only && (0..c.blocks).any(|l| c.window(l).is_some())
}

/// What a grouped engine does not do yet ([`Grouped`]).
fn check_grouped(model: &Model, cfg: &EngineConfig) -> Result<()> {
    if !grouped(model.config(), cfg) {
        return Ok(());
    }
    if cfg.speculative.is_some() {
        return Err(EngineError::Grouped(Grouped::Speculative));
    }
    Ok(())
}

/// The engine's configuration checks (before anything is allocated).
fn check_config(model: &Model, cfg: &EngineConfig) -> Result<()> {
    let bad = |why: String| Err(EngineError::Config(why));
    if cfg.tokens_per_block == 0 || cfg.max_blocks == 0 {
        return bad("tokens_per_block and max_blocks must be at least 1".into());
    }
    if cfg.scheduler.max_num_requests == 0 {
        return bad("max_num_requests must be at least 1".into());
    }
    if cfg.speculative.is_some_and(|l| !l.is_valid()) {
        return bad("prompt lookup needs 1 <= min_ngram <= max_ngram and max_draft >= 1".into());
    }
    if cfg.adapter_page_bytes == 0 {
        return bad("adapter pages must hold at least one byte".into());
    }
    let positions = cfg.tokens_per_block as usize * cfg.max_blocks as usize;
    if positions
        > model
            .config()
            .context_length
            .next_multiple_of(cfg.tokens_per_block as usize)
    {
        return bad(format!(
            "one request's {positions} positions exceed the model's context of {}",
            model.config().context_length
        ));
    }
    Ok(())
}

/// The block hashes of a prompt: one per full block of `tpb` tokens, each over that block's token
/// ids alone (the KV pool chains them from the request's root, as its keys are chained).
pub fn block_hashes(tokens: &[u32], tpb: usize) -> Vec<u64> {
    tokens
        .chunks_exact(tpb.max(1))
        .map(|block| {
            block
                .iter()
                .fold(0x6b76_7363_6865_645f, |h, &t| chain(h, u64::from(t)))
        })
        .collect()
}

/// GPU page ids of a scheduled request's table: every entry on the GPU tier.
pub(crate) fn gpu_pages(table: &[u32], slot: u16) -> Result<Vec<u32>> {
    let mut pages = Vec::with_capacity(table.len());
    gpu_pages_into(table, slot, false, &mut pages)?;
    Ok(pages)
}

/// [`gpu_pages`] into `pages` (cleared first); of a sliding-window group's table (`window`), its
/// released leading entries stay [`crate::Sequence::RELEASED`] (the step never reads them).
fn gpu_pages_into(table: &[u32], slot: u16, window: bool, pages: &mut Vec<u32>) -> Result<()> {
    pages.clear();
    let released = if window {
        table.iter().take_while(|&&e| e == NO_PAGE).count()
    } else {
        0
    };
    pages.resize(released, crate::Sequence::RELEASED);
    for &e in &table[released..] {
        pages.push(match page_of(e) {
            _ if e == NO_PAGE => {
                return Err(EngineError::Batch(format!(
                    "scheduled request in slot {slot} has a released entry in its table"
                )))
            }
            (Tier::Gpu, p) => p,
            (Tier::Host, p) => {
                return Err(EngineError::Batch(format!(
                    "scheduled request in slot {slot} has host page {p} in its table"
                )))
            }
        });
    }
    Ok(())
}

/// A table entry naming `page` of `tier`.
const fn entry_of(tier: Tier, page: u32) -> u32 {
    match tier {
        Tier::Gpu => page,
        Tier::Host => page | HOST,
    }
}

/// The slot's listed entry still names the request the engine holds there.
fn listed_live(live: &[Option<Live>], l: Listed) -> Result<&Live> {
    live[usize::from(l.slot())]
        .as_ref()
        .filter(|r| r.handle == l.handle())
        .ok_or_else(|| {
            EngineError::Batch(format!(
                "slot {} is scheduled but holds no request",
                l.slot()
            ))
        })
}

fn weight_error(slot: TaskSlot) -> MemError {
    MemError::AdapterPlan {
        slot,
        reason: "no weights registered for the task slot",
    }
}
