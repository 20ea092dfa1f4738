//! The KV backend: the mechanism the scheduling pass calls to give requests KV pages, and the page-move
//! vocabulary ([`Tier`], [`PageMove`]) shared with the device binding (kvsched-gpu).
//!
//! The contract mirrors the scheduler-facing API of the reference KV manager (spec §2), split in two:
//! [`KvBackend`], what every pool does (prepare, grow, suspend, free, preempt, page moves, and the views
//! the pass needs), and the capabilities of [`caps`], what only some backends do (a draft pool, a cross
//! pool, a KV connector, a prefix cache, unified adapter paging), each a trait named by an associated
//! type that every backend names and reached through [`KvCaps`], blanket-implemented for every backend.
//! Backends only provide mechanism; lifecycle policy (which
//! request may be resumed, when a lease is returned) lives in [`crate::request`] and the pass, so a
//! scripted fake backend cannot break it. Every call is keyed by a [`KvRef`]: the request's dense table
//! slot (for O(1) indexing) and its id (for recording fakes).
//!
//! Invariant every backend keeps (the pass relies on it): every operation is all-or-nothing. A
//! `false`/`None` result changes nothing, except where stated (a failed first-chunk `resize_context`
//! leaves the cache inactive, as upstream; a joint draft pair's refused context growth, spec §1.7, is
//! [`crate::kv_set`]'s).

pub mod caps;

pub use caps::{
    Absent, AdapterPaging, AdaptersCap, CrossCap, CrossPool, DraftCap, DraftPairing, PairedPool,
    PrefixCap, PrefixReuse, Reach, Transfers, TransfersCap, TrialMark,
};

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

/// Whether a request has a cache, and where ([`KvBackend::cache`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum CacheState {
    /// No cache at all.
    #[default]
    NoCache,
    /// A cache that is not active on the GPU: suspended (its pages in a lower tier, or HELD), or, in a
    /// set of pools, a draft or cross cache left beside a target that has none.
    Inactive,
    /// The cache exists and is active on the GPU (spec §2 `is_request_active`).
    Active,
}

impl CacheState {
    /// The request has a cache (active or not).
    #[inline]
    pub const fn exists(self) -> bool {
        !matches!(self, Self::NoCache)
    }

    /// The cache is active on the GPU.
    #[inline]
    pub const fn is_active(self) -> bool {
        matches!(self, Self::Active)
    }
}

/// The backend's tiers and per-request limits ([`KvBackend::limits`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KvLimits {
    /// A cache tier lies below the GPU (spec §2 `has_cache_tier_below_gpu`: suspension can move pages
    /// down). When false, context-side preemption is allowed (§1.8).
    pub tier_below_gpu: bool,
    /// Suspension really releases GPU pages (a lower tier absorbs them; spec §2 `can_evict`).
    pub can_evict: bool,
    /// Most tokens one request can ever hold (admission refuses larger requests).
    pub max_tokens_per_request: u64,
    /// Requests the backend keeps caches for: every [`KvRef::slot`] it is asked about is below it
    /// (`u32::MAX`: as many as the scheduler's table). The scheduler refuses a submission past it.
    pub slots: u32,
    /// A sliding-window group gives up the pages before a request's window by the capacity the
    /// request grows from ([`crate::kv_groups::KvGroups`]), which must then be the tokens computed:
    /// GUARANTEED_NO_EVICT, whose reservation by capacity runs it ahead of them, needs
    /// [`KvLimits::reserves`] (the scheduler refuses it otherwise).
    pub sliding_windows: bool,
    /// The backend keeps GUARANTEED_NO_EVICT reservations itself, in pages
    /// ([`KvBackend::resize_reserving`] returns no headroom): a request's capacity stays the tokens it
    /// computed, and every decode step asks for its tokens.
    pub reserves: bool,
}

/// What a GUARANTEED_NO_EVICT admission reserves for a request ([`KvBackend::resize_reserving`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Reservation {
    /// Tokens the request holds when it completes: prompt, output and drafts.
    pub tokens: u32,
    /// Most tokens one later step of it computes (a later chunk, or a decode step with its drafts):
    /// what a sliding window holds beyond its window at once, once this chunk is done.
    pub step: u32,
}

/// The KV manager operations every backend has — what the scheduling pass calls on every pool (spec
/// §2) — and the capability types that only some backends have.
///
/// Twelve operations and views: [`limits`](KvBackend::limits) and [`cache`](KvBackend::cache);
/// [`prepare_context`](KvBackend::prepare_context) and
/// [`prepare_disagg_gen_init`](KvBackend::prepare_disagg_gen_init) (admission; resuming is their side
/// effect); [`resize_context`](KvBackend::resize_context) (and its GUARANTEED_NO_EVICT form
/// [`resize_reserving`](KvBackend::resize_reserving), which has a default),
/// [`try_allocate_generation`](KvBackend::try_allocate_generation),
/// [`revert_allocate_generation`](KvBackend::revert_allocate_generation) and
/// [`rewind`](KvBackend::rewind) (growth and its undoing); [`suspend`](KvBackend::suspend),
/// [`free`](KvBackend::free) and [`preempt`](KvBackend::preempt); [`take_moves`](KvBackend::take_moves).
/// Then five associated capability types (not methods); their accessors are [`KvCaps`]'s.
///
/// # The contract
///
/// Every operation is all-or-nothing. A `false`/`None` result changes nothing, except where stated (a
/// failed first-chunk [`KvBackend::resize_context`] leaves the cache inactive, as upstream). The same
/// holds for every capability's operations ([`caps`]).
///
/// # Capabilities
///
/// What only some backends do is a capability: a trait of its own, named by an associated type that
/// every implementation must write, for every capability, and reached through an accessor of
/// [`KvCaps`] (blanket-implemented for every backend: no backend writes, overrides or forgets one):
///
/// | capability | type | witness | accessor | what |
/// |---|---|---|---|---|
/// | [`DraftPairing`] | [`KvBackend::Draft`] | `Reach<Self, DraftCap>` | [`KvCaps::draft`] | a draft pool paired with the target (speculative decoding) |
/// | [`CrossPool`] | [`KvBackend::Cross`] | `Reach<Self, CrossCap>` | [`KvCaps::cross`] | the encoder output's pool (encoder-decoder models) |
/// | [`Transfers`] | [`KvBackend::Transfers`] | `Reach<Self, TransfersCap>` | [`KvCaps::transfers`] | a KV connector and the async transfer manager |
/// | [`PrefixReuse`] | [`KvBackend::Prefix`] | `Reach<Self, PrefixCap>` | [`KvCaps::prefix`] | a prefix cache: block hashes, commits, reuse probes |
/// | [`AdapterPaging`] | [`KvBackend::Adapters`] | `Reach<Self, AdaptersCap>` | [`KvCaps::adapters`] | adapters' device copies in the KV pages (unified paging) |
///
/// Each associated type is bound by its capability trait and by the witness [`Reach`], keyed by the
/// capability's marker: the named type says when the backend has it. A backend without a capability
/// names [`Absent`] (an uninhabited type that reaches `None` from every backend, so the pass's code for
/// the capability compiles away); one with it names the type that implements it (often `Self`) and
/// implements the witness for itself, answering `Some` — always, or while the capability is configured
/// (a pool with a prefix cache, a set with a draft pool). The associated types have no defaults, so a
/// backend that implements a capability cannot forget to say so, and one that says so must implement
/// every operation of it and its witness: there is no silent default. The pass reaches a capability
/// only through its accessor (`if let Some(x) = kv.cross() { … }`), or, for a side-effect-free probe
/// from a `&self` caller, through [`KvCaps::caps`]: statically dispatched, no `dyn` on the hot path.
/// The accessors and `caps` both come from the one witness impl, so they agree by construction.
///
/// A pool that is to be paired in a [`crate::kv_set::KvSet`] (target or draft) also implements
/// [`PairedPool`], the pairing operations the set calls on its members (mirror admission, the resume
/// preview, the context revert).
pub trait KvBackend {
    /// The draft pool pairing ([`Absent`]: none).
    type Draft: DraftPairing + Reach<Self, DraftCap>;
    /// The cross (encoder-output) pool ([`Absent`]: none).
    type Cross: CrossPool + Reach<Self, CrossCap>;
    /// The KV connector and transfer manager ([`Absent`]: none).
    type Transfers: Transfers + Reach<Self, TransfersCap>;
    /// The prefix cache ([`Absent`]: none).
    type Prefix: PrefixReuse + Reach<Self, PrefixCap>;
    /// Unified adapter paging ([`Absent`]: adapters have a device cache of their own).
    type Adapters: AdapterPaging + Reach<Self, AdaptersCap>;

    /// The tiers and per-request limits.
    fn limits(&self) -> KvLimits;
    /// Whether the request has a cache, and whether it is active (spec §2 `is_request_active`,
    /// `has_active_cache`).
    fn cache(&self, r: KvRef) -> CacheState;

    /// First chunk: create (or resume) the cache and return the number of reusable prefix tokens found;
    /// later chunks: resume the existing cache and return `Some(0)` (spec §2 `prepare_context_cache`).
    /// `None`: refused (no slot, resume refused, no cache for a later chunk).
    fn prepare_context(&mut self, r: KvRef, prep: ContextPrep) -> Option<u32>;
    /// Disaggregated generation: prepares the cache for a transferred prompt of `capacity` tokens
    /// (spec §2 `prepare_disagg_gen_init`).
    fn prepare_disagg_gen_init(&mut self, r: KvRef, capacity: u32) -> bool;
    /// Grows an active cache to hold `capacity` tokens (never shrinks; spec §2 `resize_context`). A
    /// refused first chunk leaves its cache inactive (the one exception to all-or-nothing).
    fn resize_context(&mut self, r: KvRef, capacity: u32, first_chunk: bool) -> bool;
    /// GUARANTEED_NO_EVICT's [`KvBackend::resize_context`]: grows the cache to `capacity` with what
    /// the request needs until it completes reserved; returns the tokens the cache holds beyond
    /// `capacity` (decode steps within them ask for no growth), `None` when refused (as
    /// `resize_context` is). By default the reservation is capacity: the cache grows to
    /// `reservation.tokens` (at least `capacity`). A backend whose limits say it
    /// [`reserves`](KvLimits::reserves) keeps the reservation in pages and returns 0.
    fn resize_reserving(
        &mut self,
        r: KvRef,
        capacity: u32,
        reservation: Reservation,
        first_chunk: bool,
    ) -> Option<u32> {
        reserve_by_capacity(self, r, capacity, reservation, first_chunk)
    }
    /// Resumes the cache if suspended, then grows it by `grow` tokens (one decode step plus drafts;
    /// spec §2 `try_allocate_generation`).
    fn try_allocate_generation(&mut self, r: KvRef, grow: u32) -> bool;
    /// Undoes the last successful `try_allocate_generation` growth (spec §2
    /// `revert_allocate_generation`).
    fn revert_allocate_generation(&mut self, r: KvRef);
    /// Speculative decoding: the last step's `tokens` rejected draft tokens leave the cache (its
    /// capacity shrinks by them, whole pages beyond it are released). An inactive or absent cache is
    /// left alone; a backend that does not track capacity ignores it.
    fn rewind(&mut self, r: KvRef, tokens: u32);

    /// Suspends an active cache (pages move to a lower tier when there is room; else they stay held;
    /// spec §2 `suspend_request`). Resuming is a side effect of `prepare_context`,
    /// `try_allocate_generation`, `prepare_disagg_gen_init` (and a mirror's admission).
    fn suspend(&mut self, r: KvRef);
    /// Drops the cache entirely (spec §2 `free_resources`).
    fn free(&mut self, r: KvRef);
    /// Gives the cache's pages up (context-side preemption, spec §2 `preempt_request`).
    fn preempt(&mut self, r: KvRef);

    /// The page moves logged since the last call, in order; the log is then empty. A backend without
    /// a lower tier (or without memory behind it) logs nothing. (A set's draft and cross pools log
    /// theirs apart: [`DraftPairing::take_draft_moves`], [`CrossPool::take_cross_moves`].)
    fn take_moves(&mut self) -> &[PageMove];
}

/// The capability accessors of every [`KvBackend`], from its witnesses ([`Reach`]):
/// blanket-implemented, so no backend can leave one out or make one disagree with another. Each is
/// statically dispatched and inlined: for [`Absent`] it is a constant `None`.
pub trait KvCaps: KvBackend {
    /// The draft pool pairing, when there is one.
    #[inline(always)]
    fn draft(&mut self) -> Option<&mut Self::Draft> {
        <Self::Draft as Reach<Self, DraftCap>>::reach_mut(self)
    }
    /// The cross pool, when there is one (without one an encoder request cannot run: spec §1.6 step 7).
    #[inline(always)]
    fn cross(&mut self) -> Option<&mut Self::Cross> {
        <Self::Cross as Reach<Self, CrossCap>>::reach_mut(self)
    }
    /// The KV connector and transfer manager, when attached (spec §1.12).
    #[inline(always)]
    fn transfers(&mut self) -> Option<&mut Self::Transfers> {
        <Self::Transfers as Reach<Self, TransfersCap>>::reach_mut(self)
    }
    /// The prefix cache, when there is one (spec §1.10, §2 `probe_context_reuse`).
    #[inline(always)]
    fn prefix(&mut self) -> Option<&mut Self::Prefix> {
        <Self::Prefix as Reach<Self, PrefixCap>>::reach_mut(self)
    }
    /// Unified adapter paging, when on.
    #[inline(always)]
    fn adapters(&mut self) -> Option<&mut Self::Adapters> {
        <Self::Adapters as Reach<Self, AdaptersCap>>::reach_mut(self)
    }
    /// Every capability read-only, for the side-effect-free probes of a `&self` caller (the
    /// scheduler's invariant check, a set asking its pools): each field comes from the same witness as
    /// its accessor above.
    #[inline(always)]
    fn caps(&self) -> Caps<'_, Self> {
        Caps {
            draft: <Self::Draft as Reach<Self, DraftCap>>::reach(self),
            cross: <Self::Cross as Reach<Self, CrossCap>>::reach(self),
            transfers: <Self::Transfers as Reach<Self, TransfersCap>>::reach(self),
            prefix: <Self::Prefix as Reach<Self, PrefixCap>>::reach(self),
            adapters: <Self::Adapters as Reach<Self, AdaptersCap>>::reach(self),
        }
    }
}

impl<K: KvBackend + ?Sized> KvCaps for K {}

/// A backend's capabilities, read-only ([`KvCaps::caps`]).
pub struct Caps<'a, K: KvBackend + ?Sized> {
    /// [`KvCaps::draft`].
    pub draft: Option<&'a K::Draft>,
    /// [`KvCaps::cross`].
    pub cross: Option<&'a K::Cross>,
    /// [`KvCaps::transfers`].
    pub transfers: Option<&'a K::Transfers>,
    /// [`KvCaps::prefix`].
    pub prefix: Option<&'a K::Prefix>,
    /// [`KvCaps::adapters`].
    pub adapters: Option<&'a K::Adapters>,
}

impl<K: KvBackend + ?Sized> Caps<'_, K> {
    /// No capability at all (a plain pool).
    pub const NONE: Self = Self {
        draft: None,
        cross: None,
        transfers: None,
        prefix: None,
        adapters: None,
    };
}

/// What became of a request's connector load ([`Transfers::take_load_changes`]).
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

/// The reservation by capacity ([`KvBackend::resize_reserving`]'s default): the cache grows to
/// `reservation.tokens` (at least `capacity`); returns the tokens it holds beyond `capacity`.
pub fn reserve_by_capacity<K: KvBackend + ?Sized>(
    kv: &mut K,
    r: KvRef,
    capacity: u32,
    reservation: Reservation,
    first_chunk: bool,
) -> Option<u32> {
    let total = capacity.max(reservation.tokens);
    kv.resize_context(r, total, first_chunk)
        .then_some(total - capacity)
}

/// A block's key: its parent's key (or the request's root) chained with its own hash.
pub const fn chain(parent: u64, hash: u64) -> u64 {
    // splitmix64 finaliser over the pair: every bit of both inputs reaches every bit of the key.
    let mut z = parent ^ hash.rotate_left(29) ^ 0x9e37_79b9_7f4a_7c15;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}
