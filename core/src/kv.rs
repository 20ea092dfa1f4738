//! The KV backend: the mechanism the scheduling pass calls to give requests KV pages, and the page-move
//! vocabulary ([`Tier`], [`PageMove`]) shared with the device binding (kvsched-gpu).
//!
//! The trait mirrors the scheduler-facing API of the reference KV manager (spec §2). Backends only
//! provide mechanism; lifecycle policy (which request may be resumed, when a lease is returned) lives in
//! [`crate::request`] and the pass, so a scripted fake backend cannot break it. Every call is keyed by a
//! [`KvRef`]: the request's dense table slot (for O(1) indexing) and its id (for recording fakes).
//!
//! Invariant every backend keeps (the pass relies on it): every operation is all-or-nothing. A
//! `false`/`None` result changes nothing, except where stated (a failed first-chunk `resize_context`
//! leaves the cache inactive, as upstream).

use crate::ids::RequestId;

/// Names a request's KV cache: its dense slot in the scheduler's table and its id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct KvRef {
    /// Dense table slot, `< N` of the scheduler.
    pub slot: u16,
    /// The request id.
    pub id: RequestId,
}

/// What `prepare_context` needs to know about a context request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ContextPrep {
    /// The pass sees this request as a first chunk (position 0 at the start of the pass).
    pub first_chunk: bool,
    /// Prompt length.
    pub prompt: u32,
    /// Tokens already in the cache.
    pub position: u32,
    /// Draft tokens the request looks ahead: a first chunk's reuse stops this many tokens earlier.
    pub lookahead: u32,
    /// Most tokens a first chunk may claim as reused ([`ContextPrep::NO_LIMIT`]: no limit): the pools
    /// of a joint draft pair agree on a common depth (spec §1.7 `_prepare_context_pair`).
    pub reuse_limit: u32,
}

impl ContextPrep {
    /// No reuse limit.
    pub const NO_LIMIT: u32 = u32::MAX;

    /// A first chunk of a `prompt`-token prompt: nothing cached yet, no drafts, no reuse limit.
    pub const fn first(prompt: u32) -> Self {
        Self {
            first_chunk: true,
            prompt,
            position: 0,
            lookahead: 0,
            reuse_limit: Self::NO_LIMIT,
        }
    }

    /// The same preparation with a reuse limit.
    pub const fn limited(self, reuse_limit: u32) -> Self {
        Self {
            reuse_limit,
            ..self
        }
    }
}

/// A memory tier.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Tier {
    /// GPU memory.
    #[default]
    Gpu,
    /// Host (CPU) memory.
    Host,
}

impl core::fmt::Display for Tier {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            Self::Gpu => "GPU",
            Self::Host => "host",
        })
    }
}

impl Tier {
    /// The other tier (where a page moved from this one lands).
    pub const fn other(self) -> Tier {
        match self {
            Tier::Gpu => Tier::Host,
            Tier::Host => Tier::Gpu,
        }
    }
}

/// One page copy the copy engine must perform.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct PageMove {
    /// Whose page.
    pub request: RequestId,
    /// Source tier (the destination is the other tier).
    pub from: Tier,
    /// Source page index in its tier.
    pub src: u32,
    /// Destination page index in the other tier.
    pub dst: u32,
}

/// The KV manager operations the scheduling pass uses.
///
/// Contract: every operation is all-or-nothing. A `false`/`None` result changes nothing, except where
/// stated (a failed first-chunk `resize_context` leaves the cache inactive, as upstream).
pub trait KvBackend {
    /// A cache tier lies below the GPU (suspension can move pages down). When false, context-side
    /// preemption is allowed.
    fn tier_below_gpu(&self) -> bool;
    /// Suspension really releases GPU pages (a lower tier absorbs them).
    fn can_evict(&self) -> bool;
    /// The request has a cache (active or suspended).
    fn has_cache(&self, r: KvRef) -> bool;
    /// The request's cache exists and is active on the GPU.
    fn is_active(&self, r: KvRef) -> bool;
    /// First chunk: create (or resume) the cache and return the number of reusable prefix tokens found;
    /// later chunks: resume the existing cache and return `Some(0)`. `None`: refused (no slot, resume
    /// refused, no cache for a later chunk).
    fn prepare_context(&mut self, r: KvRef, prep: ContextPrep) -> Option<u32>;
    /// Grows the cache to hold `capacity` tokens (never shrinks).
    fn resize_context(&mut self, r: KvRef, capacity: u32, first_chunk: bool) -> bool;
    /// Resumes the cache if suspended, then grows it by `grow` tokens (one decode step plus drafts).
    fn try_allocate_generation(&mut self, r: KvRef, grow: u32) -> bool;
    /// Undoes the last successful `try_allocate_generation` growth.
    fn revert_allocate_generation(&mut self, r: KvRef);
    /// Suspends an active cache (pages move to a lower tier when there is room; else they stay held).
    fn suspend(&mut self, r: KvRef);
    /// Drops the cache entirely.
    fn free(&mut self, r: KvRef);
    /// Gives the cache's pages up (context-side preemption).
    fn preempt(&mut self, r: KvRef);
    /// Disaggregated generation: prepares the cache for a transferred prompt of `capacity` tokens.
    fn prepare_disagg_gen_init(&mut self, r: KvRef, capacity: u32) -> bool;
    /// Most tokens one request can ever hold (admission refuses larger requests).
    fn max_tokens_per_request(&self) -> u64;
    /// The prompt's block hashes (one per full block, in order, computed by the engine) and the request's
    /// prefix root (its adapter identity and cache salt), set before the request has a cache. A backend
    /// without a prefix cache ignores them.
    fn set_prefix(&mut self, r: KvRef, root: u64, hashes: &[u64]) {
        let _ = (r, root, hashes);
    }
    /// The request's prompt KV is computed up to `computed` tokens: its full blocks may join the prefix
    /// cache.
    fn commit(&mut self, r: KvRef, computed: u32) {
        let _ = (r, computed);
    }
    /// Block reuse is on for every block (the reference's ALL_REUSABLE policy): the pass may defer a first
    /// chunk behind another request that contributes its first new block (spec §1.10).
    fn prefix_skip(&self) -> bool {
        false
    }
    /// Side-effect free: the key of the first block the request would newly contribute (spec §1.10).
    fn probe_first_new_block(&self, r: KvRef, prep: ContextPrep) -> Option<u64> {
        let _ = (r, prep);
        None
    }
    /// The page moves logged since the last call, in order; the log is then empty. A backend without
    /// a lower tier (or without memory behind it) logs nothing.
    fn take_moves(&mut self) -> &[PageMove] {
        &[]
    }
    /// [`KvBackend::take_moves`] of one pool of a request's caches (a [`crate::kv_set::KvSet`] holds a
    /// draft and a cross pool beside the target; a single pool is the target).
    fn take_pool_moves(&mut self, pool: Pool) -> &[PageMove] {
        match pool {
            Pool::Target => self.take_moves(),
            Pool::Draft | Pool::Cross => &[],
        }
    }
    /// Side-effect free: the prefix tokens a first chunk would reuse, backed off by the lookahead and
    /// capped by the reuse limit (spec §2 `probe_context_reuse`); `None` when the backend cannot tell.
    fn probe_context_reuse(&self, r: KvRef, prep: ContextPrep) -> Option<u32> {
        let _ = (r, prep);
        None
    }
    /// Undoes this pass's `resize_context` growth and suspends the cache; `false` when the cache had to
    /// be dropped instead (spec §2 `revert_allocate_context`).
    fn revert_allocate_context(&mut self, r: KvRef) -> bool {
        self.suspend(r);
        true
    }
    /// An unpaired draft pool: creates the request's mirror cache if missing and resumes it (spec §2
    /// `admit_mirror`); `false` when there is no slot or the resume is refused.
    fn admit_mirror(&mut self, r: KvRef) -> bool {
        let _ = r;
        true
    }
    /// Side-effect free: the request's cache exists, is suspended, and resuming it would be refused now
    /// (the preview of spec §1.11).
    fn resume_blocked(&self, r: KvRef) -> bool {
        let _ = r;
        false
    }
    /// Side-effect free (spec §1.11): admitting this pending context request is certainly refused — an
    /// unpaired draft pool whose mirror cannot be resumed now, beside an active target cache.
    fn admission_certainly_blocked(&self, r: KvRef) -> bool {
        let _ = r;
        false
    }
    /// A cross (encoder-output) KV pool exists (encoder-decoder models).
    fn has_cross_pool(&self) -> bool {
        false
    }
    /// Creates (a first chunk only) or resumes the request's cross cache; `false` when refused.
    fn prepare_cross(&mut self, r: KvRef, first_chunk: bool) -> bool {
        let _ = (r, first_chunk);
        false
    }
    /// Grows the request's cross cache to `tokens` (its encoder output plus extra tokens).
    fn resize_cross(&mut self, r: KvRef, tokens: u32) -> bool {
        let _ = (r, tokens);
        false
    }
    /// Suspends the request's cross cache.
    fn suspend_cross(&mut self, r: KvRef) {
        let _ = r;
    }
    /// Speculative decoding: the last step's `tokens` rejected draft tokens leave the cache (its
    /// capacity shrinks by them, whole pages beyond it are released). An inactive or absent cache is
    /// left alone.
    fn rewind(&mut self, r: KvRef, tokens: u32) {
        let _ = (r, tokens);
    }
    /// Most encoder-output tokens one request's cross cache can ever hold (no cross pool: no limit
    /// here, the pass stops such a request instead).
    fn max_cross_tokens_per_request(&self) -> u64 {
        u64::MAX
    }

    // --- The KV connector and the async transfer manager (spec §1.12). ---

    /// A KV connector is attached: the deadlock error names the GPU-only remedies.
    fn has_connector(&self) -> bool {
        false
    }
    /// Hands `f` each request slot whose connector load ended or failed since the last call (the
    /// scheduler calls it before every pass and recompute-pauses a request whose load failed or timed
    /// out). Also where a backend polls its connector and counts the passes a load is unconfirmed.
    fn take_load_changes(&mut self, f: &mut dyn FnMut(u16, LoadChange)) {
        let _ = f;
    }
    /// The async transfer manager has sends in flight (disaggregated serving: a context worker's KV on
    /// its way to a generation worker). Their pages come free when they finish, so a pass that schedules
    /// nothing meanwhile is not a stall.
    fn sends_in_flight(&self) -> bool {
        false
    }

    // --- Unified paging (beyond the reference): adapters' device copies in the KV pages. ---

    /// The pool also holds the adapters' device copies (unified paging): a lease pins its adapter
    /// here, and the adapter cache keeps only the host tier. False (the default): adapters have a
    /// device cache of their own, and the pin calls below do nothing.
    fn pages_adapters(&self) -> bool {
        false
    }
    /// Most tokens one request can hold beside its adapter's `pages` pages (unified paging; else
    /// [`KvBackend::max_tokens_per_request`]).
    fn max_tokens_beside_adapter(&self, pages: u32) -> u64 {
        let _ = pages;
        self.max_tokens_per_request()
    }
    /// Side-effect free: [`KvBackend::pin_adapter`] would succeed now.
    fn can_pin_adapter(&self, task: u16, pages: u32) -> bool {
        let _ = (task, pages);
        true
    }
    /// Pins adapter slot `task`, placing its `pages` pages first when it is not resident (taken like
    /// KV pages, evicting idle cached blocks and idle adapters; `who` names demotion copies).
    /// All-or-nothing; `false` when the pages cannot be had.
    fn pin_adapter(&mut self, who: RequestId, task: u16, pages: u32) -> bool {
        let _ = (who, task, pages);
        true
    }
    /// Returns one pin of adapter slot `task`; with the last one it becomes evictable.
    fn unpin_adapter(&mut self, task: u16) {
        let _ = task;
    }
    /// Drops an unpinned adapter's device copy (its weights were replaced).
    fn drop_adapter(&mut self, task: u16) {
        let _ = task;
    }
    /// The pins on adapter slot `task` (`None` without unified paging).
    fn adapter_pins(&self, task: u16) -> Option<u32> {
        let _ = task;
        None
    }
    /// Hands `f` the adapter slots placed since the last call (their weights must be copied).
    fn take_adapter_placements(&mut self, f: &mut dyn FnMut(u16)) {
        let _ = f;
    }
    /// Hands `f` the adapter slots whose copy was evicted since the last call.
    fn take_adapter_evictions(&mut self, f: &mut dyn FnMut(u16)) {
        let _ = f;
    }
}

/// What became of a request's connector load ([`KvBackend::take_load_changes`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LoadChange {
    /// The load ended: its blocks are in the pages.
    Ended,
    /// The load failed or timed out: the pages hold nothing usable, the request must recompute.
    Failed,
}

/// One pool of a request's caches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Pool {
    /// The target model's KV.
    Target,
    /// The draft model's KV (speculative decoding).
    Draft,
    /// The encoder output's KV (encoder-decoder models).
    Cross,
}

/// A block's key: its parent's key (or the request's root) chained with its own hash.
pub const fn chain(parent: u64, hash: u64) -> u64 {
    // splitmix64 finaliser over the pair: every bit of both inputs reaches every bit of the key.
    let mut z = parent ^ hash.rotate_left(29) ^ 0x9e37_79b9_7f4a_7c15;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}
