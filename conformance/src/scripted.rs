//! Scripted, recording KV and adapter managers for the conformance runner (mechanism only; the lifecycle
//! policy stays in `kvsched-core`).
//!
//! The scheduler owns its backends and hands out only read-only views, so each scripted manager is a
//! handle to shared state: the runner keeps a clone (the remote control) to script caches and reuse
//! between passes and to read the recorded calls, while the scheduler drives the other.

use std::cell::{Ref, RefCell};
use std::collections::{BTreeMap, BTreeSet};
use std::rc::Rc;

use kvsched_core::adapter::{AdapterHold, PeftBackend, TaskRef};
use kvsched_core::error::PeftError;
use kvsched_core::ids::{RequestId, TaskId, TaskSlot};
use kvsched_core::kv::{
    Absent, CacheState, ContextPrep, KvBackend, KvLimits, KvRef, LoadChange, PageMove, PairedPool,
    PrefixCap, PrefixReuse, Reach, Transfers, TransfersCap,
};
use kvsched_core::kv_groups::{GroupGeometry, GroupPool};

use crate::scenario::{Outcomes, PerId};

/// A recorded KV call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum KvCall {
    /// `prepare_context`.
    PrepareContext,
    /// `resize_context`.
    ResizeContext,
    /// `try_allocate_generation`.
    TryAllocateGeneration,
    /// `revert_allocate_generation`.
    RevertAllocateGeneration,
    /// `suspend`.
    Suspend,
    /// `free_resources`.
    FreeResources,
    /// `preempt`.
    Preempt,
    /// `prepare_disagg_gen_init`.
    PrepareDisaggGenInit,
    /// `probe_first_new_block_key`.
    ProbeFirstNewBlock,
    /// `probe_context_reuse`.
    ProbeContextReuse,
    /// `revert_allocate_context`.
    RevertAllocateContext,
    /// `admit_mirror` (an unpaired draft pool).
    AdmitMirror,
    /// The mirror's side-effect-free resume preview (`mirror_admission_certainly_blocked`).
    ResumeBlocked,
    /// `release_window` (a sliding-window group's pool; its argument is `keep_from`).
    ReleaseWindow,
}

impl KvCall {
    /// Parses a method name of the format.
    pub fn from_name(n: &str) -> Option<Self> {
        Some(match n {
            "prepare_context" => Self::PrepareContext,
            "resize_context" => Self::ResizeContext,
            "try_allocate_generation" => Self::TryAllocateGeneration,
            "revert_allocate_generation" => Self::RevertAllocateGeneration,
            "suspend" => Self::Suspend,
            "free_resources" => Self::FreeResources,
            "preempt" => Self::Preempt,
            "prepare_disagg_gen_init" => Self::PrepareDisaggGenInit,
            "probe_first_new_block_key" => Self::ProbeFirstNewBlock,
            "probe_context_reuse" => Self::ProbeContextReuse,
            "revert_allocate_context" => Self::RevertAllocateContext,
            "admit_mirror" => Self::AdmitMirror,
            "resume_blocked" => Self::ResumeBlocked,
            "release_window" => Self::ReleaseWindow,
            _ => return None,
        })
    }
}

/// A script with its call counters.
#[derive(Debug, Clone)]
struct Script {
    outcomes: Outcomes,
    calls: usize,
    per_id: BTreeMap<u64, usize>,
}

impl Script {
    fn new(outcomes: Outcomes) -> Self {
        Self {
            outcomes,
            calls: 0,
            per_id: BTreeMap::new(),
        }
    }

    /// Counts the call and returns its outcome.
    fn next(&mut self, id: u64, released: &BTreeSet<u64>) -> bool {
        self.calls += 1;
        let n = self.per_id.entry(id).or_insert(0);
        *n += 1;
        let nth = *n;
        match &self.outcomes {
            Outcomes::Always(b) => *b,
            Outcomes::Calls(list, then) => list.get(self.calls - 1).copied().unwrap_or(*then),
            Outcomes::ById {
                ids,
                after_released,
                otherwise,
            } => {
                if let Some(per) = ids.get(&id) {
                    match per {
                        PerId::Fixed(b) => *b,
                        PerId::Seq(v) => v.get(nth - 1).or(v.last()).copied().unwrap_or(true),
                    }
                } else if let Some(need) = after_released.get(&id) {
                    need.iter().all(|x| released.contains(x))
                } else {
                    *otherwise
                }
            }
        }
    }
}

/// The scripted KV manager of the format: a handle to shared state (clones share it).
#[derive(Debug, Clone)]
pub struct ScriptedKv {
    state: Rc<RefCell<KvState>>,
}

/// The state behind a [`ScriptedKv`].
#[derive(Debug)]
pub struct KvState {
    tier_below_gpu: bool,
    can_evict: bool,
    /// A KV connector is attached.
    connector: bool,
    /// The async transfer manager has sends in flight.
    sends: bool,
    /// Cache per id: `true` = active.
    caches: BTreeMap<u64, bool>,
    released: BTreeSet<u64>,
    /// Reusable tokens a first chunk's successive claims find (past the list: its last value); a claim
    /// returns the smaller of that and its limit.
    reuse: BTreeMap<u64, Vec<u32>>,
    claims: BTreeMap<u64, usize>,
    /// What `probe_context_reuse` answers (absent: no probe).
    probe: BTreeMap<u64, u32>,
    /// Ids whose suspended cache the resume preview reports blocked.
    blocked: BTreeSet<u64>,
    /// Block reuse on with every block reusable (the prefix-aware skip may probe).
    all_reusable: bool,
    first_new_block: BTreeMap<u64, u64>,
    prepare: Script,
    resize: Script,
    allocate: Script,
    disagg: Script,
    admit: Script,
    /// Calls in order: method, id, and the argument some record (a claim's limit, a resize's capacity,
    /// a window release's `keep_from`).
    calls: Vec<(KvCall, u64, Option<u32>)>,
    /// The calls KV groups made as their compensation (`GroupPool::compensating`), kept apart.
    undone: Vec<(KvCall, u64, Option<u32>)>,
    compensating: bool,
    /// Page size (what KV groups read: a window is a whole number of pages).
    tokens_per_block: u32,
    /// Capacity and last growth per id, from the resizes and allocations that succeeded.
    capacity: BTreeMap<u64, Grown>,
    /// Beside a recurrent-state group (`kv.state`): request slots and block keys.
    pub(crate) hybrid: crate::hybrid::PoolKeys,
}

/// A request's capacity in a scripted pool and its last growth (0 once reverted).
#[derive(Debug, Clone, Copy, Default)]
struct Grown {
    capacity: u32,
    last: u32,
}

/// The four scripts.
pub struct Scripts {
    /// `prepare_context`.
    pub prepare: Outcomes,
    /// `resize_context`.
    pub resize: Outcomes,
    /// `try_allocate_generation`.
    pub allocate: Outcomes,
    /// `prepare_disagg_gen_init`.
    pub disagg: Outcomes,
    /// `admit_mirror` (an unpaired draft pool).
    pub admit: Outcomes,
}

impl ScriptedKv {
    /// A manager with the given tiers and scripts.
    pub fn new(tier_below_gpu: bool, can_evict: bool, scripts: Scripts) -> Self {
        let state = KvState {
            tier_below_gpu,
            can_evict,
            connector: false,
            sends: false,
            caches: BTreeMap::new(),
            released: BTreeSet::new(),
            reuse: BTreeMap::new(),
            claims: BTreeMap::new(),
            probe: BTreeMap::new(),
            blocked: BTreeSet::new(),
            all_reusable: false,
            first_new_block: BTreeMap::new(),
            prepare: Script::new(scripts.prepare),
            resize: Script::new(scripts.resize),
            allocate: Script::new(scripts.allocate),
            disagg: Script::new(scripts.disagg),
            admit: Script::new(scripts.admit),
            calls: Vec::new(),
            undone: Vec::new(),
            compensating: false,
            tokens_per_block: 64,
            capacity: BTreeMap::new(),
            hybrid: crate::hybrid::PoolKeys::default(),
        };
        Self {
            state: Rc::new(RefCell::new(state)),
        }
    }

    /// Attaches a KV connector (or not) and sets the transfer manager's sends in flight.
    pub fn set_transfers(&self, connector: bool, sends_in_flight: bool) {
        let mut st = self.state.borrow_mut();
        st.connector = connector;
        st.sends = sends_in_flight;
    }

    /// Sets a request's initial cache (`Some(active)`) and its reusable prefix.
    pub fn set_cache(&self, id: u64, cache: Option<bool>, reuse: u32) {
        let mut st = self.state.borrow_mut();
        match cache {
            Some(a) => {
                st.caches.insert(id, a);
            }
            None => {
                st.caches.remove(&id);
            }
        }
        st.reuse.insert(id, vec![reuse]);
    }

    /// Sets a request's initial cache (`Some(active)`), keeping its reusable prefix.
    pub fn set_cache_only(&self, id: u64, cache: Option<bool>) {
        let mut st = self.state.borrow_mut();
        match cache {
            Some(a) => st.caches.insert(id, a),
            None => st.caches.remove(&id),
        };
    }

    /// Changes a request's reusable prefix.
    pub fn set_reuse(&self, id: u64, reuse: u32) {
        self.set_claims(id, vec![reuse]);
    }

    /// What a request's successive first-chunk claims find.
    pub fn set_claims(&self, id: u64, claims: Vec<u32>) {
        let mut st = self.state.borrow_mut();
        st.reuse.insert(id, claims);
        st.claims.remove(&id);
    }

    /// What `probe_context_reuse` answers for a request.
    pub fn set_probe(&self, id: u64, tokens: u32) {
        self.state.borrow_mut().probe.insert(id, tokens);
    }

    /// Whether the resume preview reports a request's suspended cache blocked (and `admit_mirror`
    /// refuses it).
    pub fn set_blocked(&self, id: u64, blocked: bool) {
        let mut st = self.state.borrow_mut();
        if blocked {
            st.blocked.insert(id);
        } else {
            st.blocked.remove(&id);
        }
    }

    /// Block reuse is on for every block (the reference's ALL_REUSABLE policy).
    pub fn set_all_reusable(&self, on: bool) {
        self.state.borrow_mut().all_reusable = on;
    }

    /// Sets the key a probe of the request's first new block answers (`None`: no key).
    pub fn set_first_new_block(&self, id: u64, key: Option<u64>) {
        let mut st = self.state.borrow_mut();
        match key {
            Some(k) => st.first_new_block.insert(id, k),
            None => st.first_new_block.remove(&id),
        };
    }

    /// The page size KV groups see (default 64).
    pub fn set_tokens_per_block(&self, tokens: u32) {
        self.state.borrow_mut().tokens_per_block = tokens;
    }

    /// A request's capacity (its cache exists from an earlier pass: it holds `tokens`).
    pub fn set_capacity(&self, id: u64, tokens: u32) {
        let g = Grown {
            capacity: tokens,
            last: 0,
        };
        self.state.borrow_mut().capacity.insert(id, g);
    }

    /// The calls recorded so far, in order, with their recorded argument.
    pub fn calls(&self) -> Ref<'_, [(KvCall, u64, Option<u32>)]> {
        Ref::map(self.state.borrow(), |s| s.calls.as_slice())
    }

    /// The calls KV groups made in this pool as their compensation, in order (`undo.` in `calls`).
    pub fn undone(&self) -> Ref<'_, [(KvCall, u64, Option<u32>)]> {
        Ref::map(self.state.borrow(), |s| s.undone.as_slice())
    }

    /// Forgets the recorded calls.
    pub fn clear_calls(&self) {
        let mut st = self.state.borrow_mut();
        st.calls.clear();
        st.undone.clear();
    }
}

impl KvState {
    fn activate(&mut self, id: u64) {
        self.caches.insert(id, true);
        self.released.remove(&id);
    }

    /// Records a call for request `r` (with the argument some calls record); returns its id.
    fn record(&mut self, call: KvCall, r: KvRef, arg: Option<u32>) -> u64 {
        let list = if self.compensating {
            &mut self.undone
        } else {
            &mut self.calls
        };
        list.push((call, r.id.0, arg));
        r.id.0
    }

    /// A request's cache is gone (freed, or preempted): its pages are released.
    fn drop_cache(&mut self, id: u64) {
        self.capacity.remove(&id);
        if self.caches.remove(&id).is_some() {
            self.released.insert(id);
        }
    }

    /// A request's suspended cache cannot resume now (an unpaired draft pool's blocked mirror).
    fn is_blocked(&self, id: u64) -> bool {
        self.blocked.contains(&id) && self.caches.get(&id) == Some(&false)
    }

    /// A growth that succeeded: to `capacity` (a resize, never shrinking) or by `by` tokens.
    fn grow(&mut self, id: u64, capacity: Option<u32>, by: u32) {
        let g = self.capacity.entry(id).or_default();
        let to = capacity.map_or(g.capacity.saturating_add(by), |c| c.max(g.capacity));
        g.last = to - g.capacity;
        g.capacity = to;
    }

    /// The last growth undone (nothing after a revert) or `tokens` given back (a rewind).
    fn shrink(&mut self, id: u64, tokens: Option<u32>) {
        if let Some(g) = self.capacity.get_mut(&id) {
            g.capacity = g.capacity.saturating_sub(tokens.unwrap_or(g.last));
            g.last = 0;
        }
    }
}

impl ScriptedKv {
    /// Runs `f` on the shared state.
    pub(crate) fn with<R>(&self, f: impl FnOnce(&mut KvState) -> R) -> R {
        f(&mut self.state.borrow_mut())
    }
}

impl ScriptedKv {
    /// A KV connector is attached (the scenario's `kv.connector`).
    pub fn connector_attached(&self) -> bool {
        self.with(|st| st.connector)
    }
}

/// The format's KV manager: no draft or cross pool of its own (the runner pairs scripted pools in a
/// [`kvsched_core::kv_set::KvSet`]), no adapter pages; its reuse probes always answer (a scenario
/// scripts them), and its transfers are there while a connector is attached or sends are in flight.
impl KvBackend for ScriptedKv {
    type Draft = Absent;
    type Cross = Absent;
    type Transfers = Self;
    type Prefix = Self;
    type Adapters = Absent;

    fn limits(&self) -> KvLimits {
        self.with(|st| KvLimits {
            tier_below_gpu: st.tier_below_gpu,
            can_evict: st.can_evict,
            max_tokens_per_request: u64::MAX,
            slots: st.hybrid.slots,
            sliding_windows: false,
            reserves: false,
        })
    }
    fn cache(&self, r: KvRef) -> CacheState {
        self.with(|st| match st.caches.get(&r.id.0) {
            None => CacheState::NoCache,
            Some(false) => CacheState::Inactive,
            Some(true) => CacheState::Active,
        })
    }
    fn prepare_context(&mut self, r: KvRef, prep: ContextPrep) -> Option<u32> {
        self.with(|st| {
            let limit = (prep.reuse_limit != ContextPrep::NO_LIMIT).then_some(prep.reuse_limit);
            let id = st.record(KvCall::PrepareContext, r, limit);
            if !st.prepare.next(id, &st.released) {
                return None;
            }
            st.activate(id);
            if !prep.first_chunk {
                return Some(0);
            }
            let k = st.claims.entry(id).or_insert(0);
            let found = st.reuse.get(&id).and_then(|v| v.get(*k).or(v.last()));
            *k += 1;
            let reused = found.copied().unwrap_or(0).min(prep.reuse_limit);
            // The reused blocks are the cache's first tokens (a cache with none holds nothing).
            let g = st.capacity.entry(id).or_default();
            g.capacity = g.capacity.max(reused);
            Some(reused)
        })
    }
    fn prepare_disagg_gen_init(&mut self, r: KvRef, capacity: u32) -> bool {
        self.with(|st| {
            let id = st.record(KvCall::PrepareDisaggGenInit, r, None);
            let ok = st.disagg.next(id, &st.released);
            if ok {
                st.activate(id);
                st.grow(id, Some(capacity), 0);
            }
            ok
        })
    }
    fn resize_context(&mut self, r: KvRef, capacity: u32, first_chunk: bool) -> bool {
        self.with(|st| {
            let id = st.record(KvCall::ResizeContext, r, Some(capacity));
            let ok = st.resize.next(id, &st.released);
            if ok {
                st.grow(id, Some(capacity), 0);
            } else if first_chunk && st.caches.contains_key(&id) {
                st.caches.insert(id, false);
            }
            ok
        })
    }
    fn try_allocate_generation(&mut self, r: KvRef, grow: u32) -> bool {
        self.with(|st| {
            let id = st.record(KvCall::TryAllocateGeneration, r, None);
            // The script counts every call, with a cache or without.
            let ok = st.allocate.next(id, &st.released) && st.caches.contains_key(&id);
            if ok {
                st.activate(id);
                st.grow(id, None, grow);
            }
            ok
        })
    }
    fn revert_allocate_generation(&mut self, r: KvRef) {
        self.with(|st| {
            let id = st.record(KvCall::RevertAllocateGeneration, r, None);
            st.shrink(id, None);
        });
    }
    /// Not recorded (the format has no `rewind`); the capacity KV groups read gives the tokens back.
    fn rewind(&mut self, r: KvRef, tokens: u32) {
        self.with(|st| st.shrink(r.id.0, Some(tokens)));
    }
    fn suspend(&mut self, r: KvRef) {
        self.with(|st| {
            let id = st.record(KvCall::Suspend, r, None);
            if let Some(a) = st.caches.get_mut(&id) {
                *a = false;
                if st.can_evict {
                    st.released.insert(id);
                }
            }
        });
    }
    fn free(&mut self, r: KvRef) {
        self.with(|st| {
            let id = st.record(KvCall::FreeResources, r, None);
            st.drop_cache(id);
        });
    }
    fn preempt(&mut self, r: KvRef) {
        self.with(|st| {
            let id = st.record(KvCall::Preempt, r, None);
            st.drop_cache(id);
        });
    }
    /// The format has no pages: nothing moves.
    fn take_moves(&mut self) -> &[PageMove] {
        &[]
    }
}

/// Transfers while the script has a connector or sends.
impl Reach<ScriptedKv, TransfersCap> for ScriptedKv {
    fn reach(k: &Self) -> Option<&Self> {
        k.with(|st| st.connector || st.sends).then_some(k)
    }
    fn reach_mut(k: &mut Self) -> Option<&mut Self> {
        let on = k.with(|st| st.connector || st.sends);
        on.then_some(k)
    }
}

/// A prefix cache always (the script's reuse).
impl Reach<ScriptedKv, PrefixCap> for ScriptedKv {
    fn reach(k: &Self) -> Option<&Self> {
        Some(k)
    }
    fn reach_mut(k: &mut Self) -> Option<&mut Self> {
        Some(k)
    }
}

/// Mirror admission (its own script, refused for a blocked mirror), the resume preview, and the
/// context revert of a joint pair.
impl PairedPool for ScriptedKv {
    fn revert_allocate_context(&mut self, r: KvRef) -> bool {
        self.with(|st| {
            let id = st.record(KvCall::RevertAllocateContext, r, None);
            if let Some(a) = st.caches.get_mut(&id) {
                *a = false;
            }
            true
        })
    }
    fn admit_mirror(&mut self, r: KvRef) -> bool {
        self.with(|st| {
            let id = st.record(KvCall::AdmitMirror, r, None);
            // A blocked mirror is refused whatever its script says (the script still counts the call).
            let ok = st.admit.next(id, &st.released) && !st.is_blocked(id);
            if ok {
                st.activate(id);
            }
            ok
        })
    }
    fn resume_blocked(&self, r: KvRef) -> bool {
        self.with(|st| {
            let id = st.record(KvCall::ResumeBlocked, r, None);
            st.is_blocked(id)
        })
    }
}

/// A scenario's connector has no loads to report; its transfer manager's sends are scripted.
impl Transfers for ScriptedKv {
    fn take_load_changes(&mut self, _f: &mut dyn FnMut(u16, LoadChange)) {}
    fn sends_in_flight(&self) -> bool {
        self.with(|st| st.sends)
    }
}

/// The reuse a scenario scripts: the policy (`kv.reuse_policy`, `kv.block_reuse`), the probes'
/// answers; hashes and commits are not modelled.
impl PrefixReuse for ScriptedKv {
    fn set_prefix(&mut self, _r: KvRef, _root: u64, _hashes: &[u64]) {}
    fn commit(&mut self, _r: KvRef, _computed: u32) {}
    fn all_blocks_reusable(&self) -> bool {
        self.with(|st| st.all_reusable)
    }
    fn probe_first_new_block(&self, r: KvRef, _prep: ContextPrep) -> Option<u64> {
        self.with(|st| {
            let id = st.record(KvCall::ProbeFirstNewBlock, r, None);
            st.first_new_block.get(&id).copied()
        })
    }
    fn probe_context_reuse(&self, r: KvRef, prep: ContextPrep) -> Option<u32> {
        self.with(|st| {
            let id = st.record(KvCall::ProbeContextReuse, r, None);
            st.probe.get(&id).map(|&p| p.min(prep.reuse_limit))
        })
    }
}

/// A scripted pool as one of KV groups' (`kv.groups`): its geometry is the format's page size with
/// requests of any length; a prefix cache always (empty: the format commits nothing); plain unless a
/// connector or sends are scripted; a window's release is recorded with its `keep_from` (the pool has
/// no pages to give up); the capacity is what its resizes and allocations grew. Every block's key is
/// the request's `first_new_block` (a scenario scripts one key a request), unless `kv.state.keys` lists
/// its blocks' keys (beside a state group, which also sets the request slots). The hit the groups agree
/// and the resume preview are not recorded: they are the groups' own reads, not the scheduler's calls.
impl GroupPool for ScriptedKv {
    fn geometry(&self) -> GroupGeometry {
        let (tpb, slots) = self.with(|st| (st.tokens_per_block, st.hybrid.slots));
        GroupGeometry {
            slots,
            tokens_per_block: tpb,
            max_blocks: u32::MAX / tpb.max(1),
        }
    }
    fn has_prefix_cache(&self) -> bool {
        true
    }
    fn prefix_holds_blocks(&self) -> bool {
        false
    }
    /// The format's reuse is scripted, window or not.
    fn set_window(&mut self, blocks: u32) -> bool {
        blocks > 0
    }
    fn plain(&self) -> bool {
        self.with(|st| !st.connector && !st.sends)
    }
    fn release_window(&mut self, r: KvRef, keep_from: u32) {
        self.with(|st| st.record(KvCall::ReleaseWindow, r, Some(keep_from)));
    }
    fn compensating(&mut self, on: bool) {
        self.with(|st| st.compensating = on);
    }
    fn capacity(&self, r: KvRef) -> u32 {
        self.with(|st| st.capacity.get(&r.id.0).map_or(0, |g| g.capacity))
    }
    fn last_grow(&self, r: KvRef) -> u32 {
        self.with(|st| st.capacity.get(&r.id.0).map_or(0, |g| g.last))
    }
    fn block_key(&self, r: KvRef, k: u32) -> Option<u64> {
        let id = r.id.0;
        self.with(|st| (st.hybrid).block_key(id, k, st.first_new_block.get(&id).copied()))
    }
    fn reuse_hit(&self, r: KvRef, prep: ContextPrep) -> Option<u32> {
        self.with(|st| st.probe.get(&r.id.0).map(|&p| p.min(prep.reuse_limit)))
    }
    fn resume_blocked(&self, r: KvRef) -> bool {
        self.with(|st| st.is_blocked(r.id.0))
    }
    fn check(&self) -> bool {
        true
    }
}

/// A recorded adapter call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeftCall {
    /// `determine_num_pages(request)`.
    DetermineNumPages(u64),
    /// `add_request_peft(request, load_to_device)`.
    AddRequest(u64, bool),
    /// `mark_request_done(request, pause)`.
    MarkRequestDone(u64, bool),
}

impl PeftCall {
    /// The methods a scenario's `expect.calls` may name.
    pub const METHODS: [&'static str; 3] = [
        "determine_num_pages",
        "add_request_peft",
        "mark_request_done",
    ];

    /// The call as `expect.calls.METHOD` lists it (an id, or `[id, flag]`) when it is a call of
    /// `method`.
    pub fn recorded(self, method: &str) -> Option<serde_json::Value> {
        match (method, self) {
            ("determine_num_pages", Self::DetermineNumPages(id)) => Some(id.into()),
            ("add_request_peft", Self::AddRequest(id, flag))
            | ("mark_request_done", Self::MarkRequestDone(id, flag)) => {
                Some(serde_json::json!([id, flag]))
            }
            _ => None,
        }
    }
}

#[derive(Debug, Clone)]
struct ScriptedTask {
    id: TaskId,
    pages: u32,
    active: u32,
    paused: u32,
    on_device: bool,
    last_use: u64,
}

/// The scripted adapter cache of the format: device pages with least-recently-used eviction of tasks no
/// request is active on; the host side never fills. `enabled = false` is "no PEFT manager". A handle to
/// shared state (clones share it).
#[derive(Debug, Clone)]
pub struct ScriptedPeft {
    state: Rc<RefCell<PeftState>>,
}

/// The state behind a [`ScriptedPeft`].
#[derive(Debug)]
pub struct PeftState {
    enabled: bool,
    max_device_pages: u32,
    tasks: Vec<ScriptedTask>,
    clock: u64,
    calls: Vec<PeftCall>,
}

impl ScriptedPeft {
    fn of(state: PeftState) -> Self {
        Self {
            state: Rc::new(RefCell::new(state)),
        }
    }

    /// No adapter cache at all.
    pub fn disabled() -> Self {
        Self::of(PeftState {
            enabled: false,
            max_device_pages: u32::MAX,
            tasks: Vec::new(),
            clock: 0,
            calls: Vec::new(),
        })
    }

    /// A cache with `max_device_pages` and the listed tasks' page counts.
    pub fn new(max_device_pages: u32, tasks: &[(u64, u32)]) -> Self {
        let tasks = tasks
            .iter()
            .map(|&(id, pages)| ScriptedTask {
                id: TaskId(id),
                pages,
                active: 0,
                paused: 0,
                on_device: false,
                last_use: 0,
            })
            .collect();
        Self::of(PeftState {
            enabled: true,
            max_device_pages,
            tasks,
            clock: 0,
            calls: Vec::new(),
        })
    }

    /// Marks the tasks that hold leases at the start as resident on the device.
    pub fn load_leased(&self) {
        for t in &mut self.state.borrow_mut().tasks {
            if t.active > 0 {
                t.on_device = true;
            }
        }
    }

    /// Device refcount (requests active on the task) by task id.
    pub fn active(&self, task: u64) -> u32 {
        self.state
            .borrow()
            .tasks
            .iter()
            .find(|t| t.id.0 == task)
            .map_or(0, |t| t.active)
    }

    /// The calls recorded so far, in order.
    pub fn calls(&self) -> Ref<'_, [PeftCall]> {
        Ref::map(self.state.borrow(), |s| s.calls.as_slice())
    }

    /// Forgets the recorded calls.
    pub fn clear_calls(&self) {
        self.state.borrow_mut().calls.clear();
    }
}

impl PeftState {
    fn used(&self) -> u32 {
        self.tasks
            .iter()
            .filter(|t| t.on_device)
            .map(|t| t.pages)
            .sum()
    }
}

impl ScriptedPeft {
    /// Runs `f` on the shared state.
    fn with<R>(&self, f: impl FnOnce(&mut PeftState) -> R) -> R {
        f(&mut self.state.borrow_mut())
    }
}

impl PeftBackend for ScriptedPeft {
    fn max_device_pages(&self) -> u32 {
        self.with(|st| st.max_device_pages)
    }
    fn lookup(&self, task: TaskId) -> Option<TaskRef> {
        self.with(|st| {
            if !st.enabled {
                return None;
            }
            st.tasks.iter().position(|t| t.id == task).map(|i| TaskRef {
                id: task,
                slot: TaskSlot(i as u16),
            })
        })
    }
    fn determine_num_pages(&mut self, req: RequestId, task: TaskRef) -> u32 {
        self.with(|st| {
            st.calls.push(PeftCall::DetermineNumPages(req.0));
            st.tasks.get(task.slot.index()).map_or(0, |t| t.pages)
        })
    }
    fn add_request(
        &mut self,
        req: RequestId,
        task: TaskRef,
        from_pause: bool,
    ) -> Result<(), PeftError> {
        self.with(|st| {
            st.calls.push(PeftCall::AddRequest(req.0, true));
            st.clock += 1;
            let t = st
                .tasks
                .get_mut(task.slot.index())
                .ok_or(PeftError::UnknownTask(task.id))?;
            t.active += 1;
            if from_pause {
                t.paused = t.paused.saturating_sub(1);
            }
            t.last_use = st.clock;
            Ok(())
        })
    }
    fn mark_request_done(&mut self, req: RequestId, task: TaskRef, pause: bool, held: AdapterHold) {
        self.with(|st| {
            st.calls.push(PeftCall::MarkRequestDone(req.0, pause));
            st.clock += 1;
            if let Some(t) = st.tasks.get_mut(task.slot.index()) {
                match held {
                    AdapterHold::Lease => t.active = t.active.saturating_sub(1),
                    AdapterHold::Paused => t.paused = t.paused.saturating_sub(1),
                }
                if pause {
                    t.paused += 1;
                }
                t.last_use = st.clock;
            }
        });
    }
    fn ensure_batch(
        &mut self,
        tasks: &[TaskRef],
        load: &mut dyn FnMut(TaskRef),
    ) -> Result<(), PeftError> {
        self.with(|st| {
            let in_batch = |i: usize| tasks.iter().any(|t| t.slot.index() == i);
            let need: u32 = st
                .tasks
                .iter()
                .enumerate()
                .filter(|(i, t)| in_batch(*i) && !t.on_device)
                .map(|(_, t)| t.pages)
                .sum();
            let free = st.max_device_pages.saturating_sub(st.used());
            if need > free {
                let evictable: u32 = st
                    .tasks
                    .iter()
                    .enumerate()
                    .filter(|(i, t)| t.on_device && t.active == 0 && !in_batch(*i))
                    .map(|(_, t)| t.pages)
                    .sum();
                if free + evictable < need {
                    let task = tasks
                        .iter()
                        .find(|t| !st.tasks[t.slot.index()].on_device)
                        .map_or(TaskId(0), |t| t.id);
                    return Err(PeftError::DeviceCacheFull {
                        task,
                        needed: need,
                        obtainable: free + evictable,
                    });
                }
                let mut freed = free;
                while freed < need {
                    let victim = st
                        .tasks
                        .iter()
                        .enumerate()
                        .filter(|(i, t)| t.on_device && t.active == 0 && !in_batch(*i))
                        .min_by_key(|(_, t)| t.last_use)
                        .map(|(i, _)| i);
                    let Some(v) = victim else { break };
                    st.tasks[v].on_device = false;
                    freed += st.tasks[v].pages;
                }
            }
            for t in tasks {
                let e = &mut st.tasks[t.slot.index()];
                if !e.on_device {
                    e.on_device = true;
                    load(*t);
                }
            }
            Ok(())
        })
    }
}
