//! The KV backend's capabilities: what only some backends do, one trait each, named by the associated
//! types of [`KvBackend`] and reached through the accessors of [`KvCaps`] (see [`KvBackend`]'s docs for
//! how a backend states them).
//!
//! | trait | marker | what | who has it |
//! |---|---|---|---|
//! | [`DraftPairing`] | [`DraftCap`] | a draft pool beside the target: the §1.11 admission preview, its page moves | [`crate::kv_set::KvSet`] with a draft pool |
//! | [`CrossPool`] | [`CrossCap`] | the encoder output's pool (§1.7 step 6) | `KvSet` with a cross pool |
//! | [`Transfers`] | [`TransfersCap`] | a KV connector's loads and the transfer manager's sends (§1.12) | [`crate::KvPool`] with a connector |
//! | [`PrefixReuse`] | [`PrefixCap`] | a prefix cache: block hashes, commits, the §1.10 and §2 probes | `KvPool` with a prefix cache |
//! | [`AdapterPaging`] | [`AdaptersCap`] | adapters' device copies in the KV pages (beyond the reference) | `KvPool` with unified paging |
//!
//! A capability type is reached from its backend through a witness, [`Reach`], keyed by the
//! capability's marker: the type a backend names answers, for that backend, whether the capability is
//! there (and hands it out). [`Absent`] answers `None` for every backend.
//!
//! [`PairedPool`] is not reached through an accessor: it is what a [`crate::kv_set::KvSet`] requires of
//! the pools it pairs (a bound on its type parameters), so a pool that cannot be a mirror cannot be
//! written into a set.
//!
//! Every operation here keeps the contract of [`KvBackend`]: all or nothing.
//!
//! [`Absent`] is the "none" of every capability: an uninhabited type, so a backend that names it has
//! an accessor that can only answer `None`, and the code behind it is dead at compile time.
//!
//! [`KvCaps`]: super::KvCaps

use super::{ContextPrep, KvBackend, KvRef, LoadChange, PageMove};
use crate::ids::{RequestId, TaskSlot};

/// Speculative decoding with a draft pool beside the target (spec §1.5 step 3, §1.7, §1.11). The pairing
/// itself acts through the core operations (a set's generation step grows both pools); what the pass
/// needs beyond them is here.
pub trait DraftPairing {
    /// Side-effect free (spec §1.11 `_pending_ctx_certainly_blocked`): admitting this pending context
    /// request is certainly refused — an unpaired draft pool whose mirror cannot be resumed now, beside
    /// an active target cache.
    fn admission_certainly_blocked(&self, r: KvRef) -> bool;
    /// The draft pool's page moves since the last call, in order (the target's are
    /// [`KvBackend::take_moves`]); the log is then empty.
    fn take_draft_moves(&mut self) -> &[PageMove];
}

/// The cross (encoder-output) KV pool of encoder-decoder models (spec §1.6, §1.7 step 6).
pub trait CrossPool {
    /// Creates (a first chunk only) or resumes the request's cross cache; `false` when refused.
    fn prepare_cross(&mut self, r: KvRef, first_chunk: bool) -> bool;
    /// Grows the request's cross cache to `tokens` (its encoder output plus extra tokens).
    fn resize_cross(&mut self, r: KvRef, tokens: u32) -> bool;
    /// Suspends the request's cross cache.
    fn suspend_cross(&mut self, r: KvRef);
    /// Most encoder-output tokens one request's cross cache can ever hold (admission refuses more).
    fn max_cross_tokens(&self) -> u64;
    /// The cross pool's page moves since the last call, in order; the log is then empty.
    fn take_cross_moves(&mut self) -> &[PageMove];
}

/// A KV connector and the async transfer manager (spec §1.12): KV that arrives in or leaves the pool
/// outside the pass. Attached, the deadlock error names the GPU-only remedies (a connector requires a
/// GPU-only cache, spec §2).
pub trait Transfers {
    /// Hands `f` each request slot whose connector load ended or failed since the last call (the
    /// scheduler calls it before every pass and recompute-pauses a request whose load failed or timed
    /// out). Also where a backend polls its connector and counts the passes a load is unconfirmed.
    fn take_load_changes(&mut self, f: &mut dyn FnMut(u16, LoadChange));
    /// The async transfer manager has sends in flight (disaggregated serving: a context worker's KV on
    /// its way to a generation worker). Their pages come free when they finish, so a pass that schedules
    /// nothing meanwhile is not a stall.
    fn sends_in_flight(&self) -> bool;
}

/// What a refused trial read of a backend ([`PrefixReuse::trial_mark`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TrialMark {
    /// Changes whenever any prompt chain's match could.
    pub version: u64,
    /// GPU pages available.
    pub available: u32,
    /// Tokens a page holds (a chunk `t` tokens shorter needs at most `t / block + 1` fewer pages).
    pub block: u32,
}

/// A prefix cache: committed blocks a first chunk can reuse (DESIGN.md §9, spec §1.10, §2).
pub trait PrefixReuse {
    /// The prompt's block hashes (one per full block, in order, computed by the engine) and the
    /// request's prefix root (its adapter identity and cache salt), set before the request has a cache.
    fn set_prefix(&mut self, r: KvRef, root: u64, hashes: &[u64]);
    /// The request's prompt KV is computed up to `computed` tokens: its full blocks may join the prefix
    /// cache.
    fn commit(&mut self, r: KvRef, computed: u32);
    /// Side-effect free: the tokens [`PrefixReuse::fork`] would share now (`None`, the default:
    /// it would refuse).
    fn can_fork(&self, parent: KvRef, child: KvRef, tokens: u32) -> Option<u32> {
        let _ = (parent, child, tokens);
        None
    }
    /// A fork (beyond the reference): request `child`, which has no cache, takes by reference the
    /// full blocks of `parent` (active on the GPU) before the last of its first `tokens` tokens,
    /// which the caller vouches are the child's first `tokens` (a child computes at least its last
    /// token, and its partial last block). Returns the tokens shared, a whole number of blocks;
    /// `None` (the default), changing nothing: the backend cannot fork these requests.
    fn fork(&mut self, parent: KvRef, child: KvRef, tokens: u32) -> Option<u32> {
        let _ = (parent, child, tokens);
        None
    }
    /// Block reuse is on for every block (the reference's ALL_REUSABLE policy): the pass may defer a
    /// first chunk behind another request that contributes its first new block (spec §1.10).
    fn all_blocks_reusable(&self) -> bool;
    /// Side-effect free: the key of the first block the request would newly contribute (spec §1.10,
    /// §2 `probe_first_new_block_key`).
    fn probe_first_new_block(&self, r: KvRef, prep: ContextPrep) -> Option<u64>;
    /// Side-effect free: the prefix tokens a first chunk would reuse, backed off by the lookahead and
    /// capped by the reuse limit (spec §2 `probe_context_reuse`); `None` when the backend cannot tell.
    fn probe_context_reuse(&self, r: KvRef, prep: ContextPrep) -> Option<u32>;
    /// A first chunk's trial (beyond the reference, difference 15): the tokens
    /// [`KvBackend::prepare_context`] would reuse for it now, told without preparing it (no block
    /// acquired, claimed or released; a backend may refresh what it remembers of the prompt's chain).
    /// `None` (the default): the backend cannot tell, and the pass prepares as usual.
    fn trial_reuse(&mut self, r: KvRef, prep: ContextPrep) -> Option<u32> {
        let _ = (r, prep);
        None
    }
    /// Side-effect free, right after [`PrefixReuse::trial_reuse`] answered `reused`: whether preparing
    /// the first chunk and then [`KvBackend::resize_context`] to `capacity` would be refused. `None`
    /// when it would be granted (and by default); `Some(short)` when refused: at least `short` pages
    /// more than are available would be needed (`u32::MAX`: no number would do; 0: refused for a
    /// reason pages do not cure).
    fn trial_refused(
        &self,
        r: KvRef,
        prep: ContextPrep,
        reused: u32,
        capacity: u32,
    ) -> Option<u32> {
        let _ = (r, prep, reused, capacity);
        None
    }
    /// What a refused trial's verdict reads of the backend beyond the request: a trial refused under
    /// a mark stays refused while the version is the mark's (or the request's chain is unmoved,
    /// [`PrefixReuse::trial_unmoved`]) and the pages available do not grow by its shortfall. `None`
    /// (the default): no marks, and the pass visits every request.
    fn trial_mark(&self) -> Option<TrialMark> {
        None
    }
    /// Side-effect free: the request's last trial, made under a mark whose version has since
    /// changed, would read what it read then (no block its verdict stands on was indexed, dropped,
    /// first referenced or last released): a refused run stands for it as if the version had not
    /// moved. `false` (the default): the pass visits it.
    fn trial_unmoved(&self, r: KvRef) -> bool {
        let _ = r;
        false
    }
    /// The KV events the prefix cache logged since the last call, in order ([`crate::kv_events`];
    /// the default, and a cache without a log: none).
    fn take_kv_events(&mut self) -> &[crate::kv_events::KvEvent] {
        &[]
    }
    /// Drops every idle cached block (one no request holds), host tier first, as vLLM's
    /// `reset_prefix_cache`: their pages are free, each drop logged as a removal; blocks a request
    /// holds stay. Returns the blocks dropped (the default: none).
    fn drop_idle_blocks(&mut self) -> u32 {
        0
    }
}

/// Unified paging (beyond the reference): the pool also holds the adapters' device copies. A lease pins
/// its adapter here, and the adapter cache keeps only the host tier. Without it adapters have a device
/// cache of their own and no pin is made.
pub trait AdapterPaging {
    /// Most tokens one request can hold beside its adapter's `pages` pages.
    fn max_tokens_beside_adapter(&self, pages: u32) -> u64;
    /// Side-effect free: [`AdapterPaging::pin_adapter`] would succeed now.
    fn can_pin_adapter(&self, task: TaskSlot, pages: u32) -> bool;
    /// Pins adapter slot `task`, placing its `pages` pages first when it is not resident (taken like
    /// KV pages, evicting idle cached blocks and idle adapters; `who` names demotion copies).
    /// All-or-nothing; `false` when the pages cannot be had.
    fn pin_adapter(&mut self, who: RequestId, task: TaskSlot, pages: u32) -> bool;
    /// Returns one pin of adapter slot `task`; with the last one it becomes evictable.
    fn unpin_adapter(&mut self, task: TaskSlot);
    /// Drops an unpinned adapter's device copy (its weights were replaced).
    fn drop_adapter(&mut self, task: TaskSlot);
    /// The pins on adapter slot `task` (`None` for a slot the backend keeps no adapter state for).
    fn adapter_pins(&self, task: TaskSlot) -> Option<u32>;
    /// Hands `f` the adapter slots placed since the last call (their weights must be copied).
    fn take_adapter_placements(&mut self, f: &mut dyn FnMut(TaskSlot));
    /// Hands `f` the adapter slots whose copy was evicted since the last call.
    fn take_adapter_evictions(&mut self, f: &mut dyn FnMut(TaskSlot));
}

/// What a [`crate::kv_set::KvSet`] calls on the pools it pairs, beyond the core operations: a draft
/// pool's mirror admission and its resume preview (spec §2, the draft manager), and a joint pair's
/// context revert (§1.7). A bound on the set's pools, not a capability behind an accessor: a pool that
/// lacks it cannot be paired at all.
pub trait PairedPool: KvBackend {
    /// Undoes this pass's `resize_context` growth and suspends the cache; `false` when the cache had to
    /// be dropped instead (spec §2 `revert_allocate_context`).
    fn revert_allocate_context(&mut self, r: KvRef) -> bool;
    /// An unpaired draft pool: creates the request's mirror cache if missing and resumes it (spec §2
    /// `admit_mirror`); `false` when there is no slot or the resume is refused.
    fn admit_mirror(&mut self, r: KvRef) -> bool;
    /// Side-effect free: the request's cache exists, is suspended, and resuming it would be refused now
    /// (the mirror's preview of spec §1.11, `mirror_admission_certainly_blocked`).
    fn resume_blocked(&self, r: KvRef) -> bool;
}

/// The witness that capability type `Self` is reached from backend `K` (capability marker `C`: one of
/// [`DraftCap`], [`CrossCap`], [`TransfersCap`], [`PrefixCap`], [`AdaptersCap`]). Every associated
/// capability type of [`KvBackend`] is bound by it, so a backend that names a capability (often `Self`)
/// also says, here, when it has it; [`Absent`] implements it for every backend, answering `None`.
///
/// The two answers agree: `reach` is `Some` exactly when `reach_mut` is (a backend's accessors and its
/// read-only [`super::Caps`] both come from this one impl, through the blanket [`super::KvCaps`]).
pub trait Reach<K: ?Sized, C> {
    /// The capability of `k`, read-only, when `k` has it.
    fn reach(k: &K) -> Option<&Self>;
    /// The capability of `k`, when `k` has it.
    fn reach_mut(k: &mut K) -> Option<&mut Self>;
}

/// The marker of [`DraftPairing`] in [`Reach`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DraftCap {}
/// The marker of [`CrossPool`] in [`Reach`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CrossCap {}
/// The marker of [`Transfers`] in [`Reach`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TransfersCap {}
/// The marker of [`PrefixReuse`] in [`Reach`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PrefixCap {}
/// The marker of [`AdapterPaging`] in [`Reach`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AdaptersCap {}

/// No such capability: an uninhabited type (no value exists), named by a backend for every capability
/// it lacks. Its accessor can only answer `None`; its operations cannot be called.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Absent {}

/// No backend has [`Absent`].
impl<K: ?Sized, C> Reach<K, C> for Absent {
    #[inline(always)]
    fn reach(_: &K) -> Option<&Self> {
        None
    }
    #[inline(always)]
    fn reach_mut(_: &mut K) -> Option<&mut Self> {
        None
    }
}

impl DraftPairing for Absent {
    fn admission_certainly_blocked(&self, _: KvRef) -> bool {
        match *self {}
    }
    fn take_draft_moves(&mut self) -> &[PageMove] {
        match *self {}
    }
}

impl CrossPool for Absent {
    fn prepare_cross(&mut self, _: KvRef, _: bool) -> bool {
        match *self {}
    }
    fn resize_cross(&mut self, _: KvRef, _: u32) -> bool {
        match *self {}
    }
    fn suspend_cross(&mut self, _: KvRef) {
        match *self {}
    }
    fn max_cross_tokens(&self) -> u64 {
        match *self {}
    }
    fn take_cross_moves(&mut self) -> &[PageMove] {
        match *self {}
    }
}

impl Transfers for Absent {
    fn take_load_changes(&mut self, _: &mut dyn FnMut(u16, LoadChange)) {
        match *self {}
    }
    fn sends_in_flight(&self) -> bool {
        match *self {}
    }
}

impl PrefixReuse for Absent {
    fn set_prefix(&mut self, _: KvRef, _: u64, _: &[u64]) {
        match *self {}
    }
    fn commit(&mut self, _: KvRef, _: u32) {
        match *self {}
    }
    fn all_blocks_reusable(&self) -> bool {
        match *self {}
    }
    fn probe_first_new_block(&self, _: KvRef, _: ContextPrep) -> Option<u64> {
        match *self {}
    }
    fn probe_context_reuse(&self, _: KvRef, _: ContextPrep) -> Option<u32> {
        match *self {}
    }
}

impl AdapterPaging for Absent {
    fn max_tokens_beside_adapter(&self, _: u32) -> u64 {
        match *self {}
    }
    fn can_pin_adapter(&self, _: TaskSlot, _: u32) -> bool {
        match *self {}
    }
    fn pin_adapter(&mut self, _: RequestId, _: TaskSlot, _: u32) -> bool {
        match *self {}
    }
    fn unpin_adapter(&mut self, _: TaskSlot) {
        match *self {}
    }
    fn drop_adapter(&mut self, _: TaskSlot) {
        match *self {}
    }
    fn adapter_pins(&self, _: TaskSlot) -> Option<u32> {
        match *self {}
    }
    fn take_adapter_placements(&mut self, _: &mut dyn FnMut(TaskSlot)) {
        match *self {}
    }
    fn take_adapter_evictions(&mut self, _: &mut dyn FnMut(TaskSlot)) {
        match *self {}
    }
}
