//! The scheduler: the request table, its public API, and the scheduling pass — one file per rule of
//! spec §1:
//!
//! | file | what |
//! |---|---|
//! | `table.rs` | the table: typed ownership, hot records, arrival order, id index; `hot.rs`: the hot record |
//! | `pass.rs` | the [`PassStats`] and the `Pass` value: per-pass state, the algorithm in a few lines |
//! | `generation.rs` | phase 1: the decode step (fast case first), §1.4–§1.5 |
//! | `victims.rs` | the generation ladder: eviction, recompute pause, self-eviction; §1.15 predicates |
//! | `context.rs` | phase 2: deferred contexts and encoders, ownership on admission, roll-back |
//! | `chunking.rs` | preparing, sizing and resizing a context chunk, §1.7 |
//! | `preempt.rs` | context-side preemption, §1.8 |
//! | `deadlock.rs` | deadlock detection and the remedies before a stall counts, §1.12 |
//! | `plan.rs` | the adapter plan: PEFT page budget and distinct adapters |
//! | `sort.rs` | the LoRA sort, §1.13 |
//! | `admission.rs` | the admission order beyond the reference, and the drain |
//! | `checks.rs` | what submission and `update` refuse: sizes, multimodal runs, a LoRA request beside its adapter |
//! | `connector.rs` | the KV connector at the pass boundary: failed or timed-out loads recompute |
//!
//! Every resource change goes through a type-state transition of [`crate::request`], so the PEFT
//! lifecycle of DESIGN.md §3 holds by construction.
//!
//! The engine's loop: [`Scheduler::schedule`] fills an output; [`Scheduler::ensure_batch`] makes its
//! adapters resident; [`Scheduler::take_moves`] hands the page moves to the copy engine (and settles
//! the resumed requests, whose pages those moves bring up); the step runs;
//! [`Scheduler::complete_step`] advances what it processed; finished requests are
//! [`removed`](Scheduler::remove).
//!
//! Invariants between calls (checked by [`Scheduler::check`] and the property tests): the table's
//! (`table.rs`); per task, live leases = the adapter cache's device refcount; no suspended or
//! recompute-paused request holds a lease or active KV.

mod admission;
mod build;
mod checks;
mod chunking;
mod connector;
mod context;
mod cross;
mod deadlock;
mod generation;
mod hot;
mod multimodal;
mod pass;
mod plan;
mod preempt;
mod prefix;
mod sort;
mod table;
mod transfer;
mod victims;

#[cfg(test)]
mod tests;

pub use pass::PassStats;
pub use table::{Entry, Handle};
pub use transfer::{TransferEnd, TransferStats};

use crate::adapter::{PeftBackend, TaskRef};
use crate::config::Config;
use crate::error::{Error, PeftError};
use crate::ids::RequestId;
use crate::kv::{AdapterPaging, CrossPool, DraftPairing, KvBackend, KvCaps, KvRef, PrefixReuse};
use crate::lease::AdapterDesk;
use crate::output::SchedulerOutput;
use crate::phase::Phase;
use crate::request::{MovesTaken, Ownership, RequestSpec};
use crate::storage::{FixedList, Inline, Storage};

use pass::{Pass, Scratch};
use table::{Held, Table};

impl<K: KvBackend, const N: usize, const T: usize, S: Storage>
    Scheduler<K, crate::AdapterPool<T>, N, T, S>
{
    /// Registers an adapter with the adapter cache (see [`crate::AdapterPool::register`]).
    pub fn register_adapter(
        &mut self,
        id: crate::ids::TaskId,
        pages: u32,
    ) -> Result<TaskRef, PeftError> {
        self.desk.backend_mut().register(id, pages)
    }

    /// Replaces an adapter's weights under the same task id (see [`crate::AdapterPool::reload`]): requests
    /// submitted from now on get a new prefix identity, so the KV cached under the old weights is never
    /// reused. Refused ([`PeftError::TaskBusy`], nothing changes) while any live request uses the task —
    /// waiting ones included, whose prefix identity names the old weights.
    pub fn reload_adapter(
        &mut self,
        id: crate::ids::TaskId,
        pages: u32,
    ) -> Result<TaskRef, PeftError> {
        let in_use = (0..self.table.len())
            .any(|i| self.table.entry(self.table.slot(i)).spec().lora == Some(id));
        if in_use {
            return Err(PeftError::TaskBusy(id));
        }
        let task = self.desk.backend_mut().reload(id, pages)?;
        // Unified paging: the old weights' device copy leaves the KV pool.
        if let Some(a) = self.kv.adapters() {
            a.drop_adapter(task.slot);
        }
        Ok(task)
    }
}

/// How a request starts when it is adopted with resources a backend already holds (restoring state, or
/// scripted scenarios).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Adopt {
    /// Owns nothing.
    Waiting,
    /// Its cache is active: it takes a lease on its adapter.
    Active,
    /// Its cache is suspended: it is registered as paused on its adapter.
    Suspended,
}

/// The scheduler: a request table of `N` slots over a KV backend `K` and an adapter backend `P` with `T`
/// task slots, its fixed-capacity arrays where `S` keeps them (`build.rs`: [`Inline`], the default, or
/// `Boxed`; see the crate docs for where a scheduler may live).
pub struct Scheduler<K, P, const N: usize, const T: usize, S: Storage = Inline> {
    cfg: Config,
    kv: K,
    desk: AdapterDesk<P, T, S>,
    table: Table<N, S>,
    scratch: Scratch<N, T, S>,
    /// Consecutive stalled passes (the only state a pass leaves for the next, spec §1.1).
    stall: u32,
    /// Passes run; the output of the last one carries this number.
    passes: u64,
    /// The last pass whose step was completed.
    completed: u64,
    last: PassStats,
    /// The VTC counters (kept under [`crate::config::Admission::Vtc`] only).
    clients: admission::Clients<N, S>,
    /// Consecutive passes each slot's request was refused its adapter (fair admission's drain).
    adapter_waits: S::Array<u16, N>,
    /// Transfers ended so far (`transfer.rs`; the in-flight counts are left 0 here).
    transfer_ends: TransferStats,
}

impl<K, P, const N: usize, const T: usize, S: Storage> Drop for Scheduler<K, P, N, T, S> {
    /// Tearing the scheduler down takes its backends with it: every request's resources go too.
    fn drop(&mut self) {
        self.table.abandon_all();
    }
}

impl<K: KvBackend, P: PeftBackend, const N: usize, const T: usize, S: Storage>
    Scheduler<K, P, N, T, S>
{
    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.cfg
    }
    /// The KV backend, read-only (statistics, block tables, invariant checks).
    pub fn kv(&self) -> &K {
        &self.kv
    }
    /// The adapter desk, read-only (leases, pinned pages, and the adapter backend through it).
    pub fn adapters(&self) -> &AdapterDesk<P, T, S> {
        &self.desk
    }
    /// What the last pass did beyond its output lists.
    pub fn last_pass(&self) -> PassStats {
        self.last
    }
    /// Consecutive stalled passes.
    pub fn stall_count(&self) -> u32 {
        self.stall
    }
    /// Live requests.
    pub fn len(&self) -> usize {
        self.table.len()
    }
    /// No live requests.
    pub fn is_empty(&self) -> bool {
        self.table.len() == 0
    }
    /// Requests in arrival order.
    pub fn requests(&self) -> impl Iterator<Item = (Handle, Entry<'_>)> + '_ {
        self.table.iter()
    }
    /// One request.
    pub fn get(&self, h: Handle) -> Result<Entry<'_>, Error> {
        self.table.get(h).ok_or(Error::StaleHandle)
    }
    /// The live handle of a table slot.
    pub fn handle_of(&self, slot: u16) -> Option<Handle> {
        self.table.handle_at(slot)
    }
    /// Finds a request by id (O(1): the table keeps an id index).
    pub fn find(&self, id: RequestId) -> Option<Handle> {
        self.table.handle_at(self.table.find(id)?)
    }

    /// A fingerprint of the scheduler's own state: the request table (entries, hot records, arrival
    /// order, id index), the counters and the adapter desk. The backends are left out: fingerprint those
    /// with [`crate::KvPool::fingerprint`] and the adapter cache's `PartialEq`. Equal before and after a
    /// refused call = the call changed nothing.
    pub fn fingerprint(&self) -> u64 {
        use core::hash::{Hash, Hasher};
        let mut h = crate::fingerprint::Fingerprint::new();
        self.table.hash_state(&mut h);
        self.stall.hash(&mut h);
        self.passes.hash(&mut h);
        self.completed.hash(&mut h);
        self.desk.hash_state(&mut h);
        self.clients.hash_state(&mut h);
        self.adapter_waits.hash(&mut h);
        h.finish()
    }

    /// The table's invariants and the ownership agreements with the backends: every request on the GPU
    /// has an active cache, no suspended or recompute-paused one does, and per task the desk's leases
    /// equal the requests holding one.
    pub fn check(&self) -> bool {
        let mut leases = [0u32; T];
        let agree = self.table.iter().all(|(h, e)| {
            let r = KvRef {
                slot: h.index(),
                id: e.spec().id,
            };
            let o = e.ownership();
            if let (true, Some(t)) = (o.on_gpu(), e.task()) {
                if let Some(n) = leases.get_mut(t.slot as usize) {
                    *n += 1;
                }
            }
            match o {
                Ownership::Active | Ownership::Resumed => self.kv.cache(r).is_active(),
                // A sending request's pages stay active, pinned for the transfer manager; its
                // phase says so.
                Ownership::Sending => {
                    self.kv.cache(r).is_active()
                        && e.spec().phase == Phase::DisaggContextTransInProgress
                }
                Ownership::Paused => !self.kv.cache(r).is_active(),
                Ownership::Waiting | Ownership::Recompute => !self.kv.cache(r).is_active(),
            }
        });
        // Unified paging: between passes an adapter's pins are its leases.
        let adapters = self.kv.caps().adapters;
        let pinned = |s: usize| {
            adapters
                .and_then(|a| a.adapter_pins(s as u16))
                .is_none_or(|n| n == leases[s])
        };
        agree
            && self.table.check()
            && (0..T).all(|s| self.desk.leases(s as u16) == leases[s] && pinned(s))
    }

    /// An encoder request the encoder window would admit, and no cross pool for it (spec §1.6 step 7,
    /// checked before the pass does anything).
    fn encoder_without_cross_pool(&self) -> bool {
        self.cfg.window == crate::config::Window::Encoder
            && self.kv.caps().cross.is_none()
            && self.table.order().iter().any(|&s| {
                let e = self.table.entry(s);
                e.spec().phase == Phase::EncoderInit && !e.sits_out()
            })
    }

    /// Submits a new request (it owns nothing until the pass admits it). Refuses, changing nothing: a
    /// duplicate id, an unknown LoRA task, a request larger than the KV pool, a full table.
    pub fn submit(&mut self, spec: RequestSpec) -> Result<Handle, Error> {
        self.submit_with_prefix(spec, 0, &[])
    }

    /// Submits a new request with its prompt's block hashes — one per full block of `tokens_per_block`
    /// tokens, in order, computed by the engine over the tokens (the core stores no tokens) — and a cache
    /// salt. With a prefix cache in the KV backend, its first chunk reuses the cached blocks of its
    /// prompt, and its computed blocks are cached for others, only among requests of the same adapter
    /// identity (task and weights version, or the base model) and salt. Refuses as [`Self::submit`].
    pub fn submit_with_prefix(
        &mut self,
        spec: RequestSpec,
        salt: u64,
        hashes: &[u64],
    ) -> Result<Handle, Error> {
        let h = self.adopt(spec, Adopt::Waiting)?;
        let e = self.table.entry(h.index());
        let r = KvRef {
            slot: h.index(),
            id: e.spec().id,
        };
        let root = self.prefix_root(e.task(), e.spec().lora, salt);
        if let Some(p) = self.kv.prefix() {
            p.set_prefix(r, root, hashes);
        }
        Ok(h)
    }

    /// A request's prefix root: its adapter identity (the task and the version of its weights, a LoRA id
    /// without an adapter cache, or the base model) chained with its cache salt. KV computed under one
    /// root is never matched under another.
    fn prefix_root(
        &self,
        task: Option<TaskRef>,
        lora: Option<crate::ids::TaskId>,
        salt: u64,
    ) -> u64 {
        use crate::kv::chain;
        let identity = match (task, lora) {
            (Some(t), _) => {
                let version = self.desk.backend().cache_identity(t);
                chain(chain(1, t.id.0), version)
            }
            (None, Some(id)) => chain(2, id.0),
            (None, None) => 3,
        };
        chain(identity, salt)
    }

    /// Submits a request that already has a cache in the KV backend (restoring state; scripted tests):
    /// `Active` takes a lease on its adapter, `Suspended` registers it as paused on its adapter. Refused,
    /// changing nothing, when the backend's cache does not match `how` or the adapter cache refuses.
    pub fn adopt(&mut self, spec: RequestSpec, how: Adopt) -> Result<Handle, Error> {
        let task = self.check_spec(&spec)?;
        let r = |h: Handle| KvRef {
            slot: h.index(),
            id: spec.id,
        };
        let h = self.table.insert(spec.clone(), task)?;
        let kv_ok = match how {
            Adopt::Waiting => true,
            Adopt::Active => self.kv.cache(r(h)).is_active(),
            Adopt::Suspended => self.kv.cache(r(h)) == crate::kv::CacheState::Inactive,
        };
        if !kv_ok {
            self.table.cancel_insert(h);
            return Err(Error::Invalid(match how {
                Adopt::Active => "adopted as active but the KV backend has no active cache",
                _ => "adopted as suspended but the KV backend has no suspended cache",
            }));
        }
        let (kv, desk) = (&mut self.kv, &mut self.desk);
        let adopted = self.table.transition(h.index(), |held| {
            let Held::Waiting(w) = held else {
                panic!("a new entry is waiting");
            };
            match how {
                Adopt::Waiting => (w.into(), Ok(())),
                Adopt::Active => match w.admit(kv, desk) {
                    Ok(a) => (a.into(), Ok(())),
                    Err(x) => (x.request.into(), Err(x.error)),
                },
                Adopt::Suspended => match w.task() {
                    None => (w.adopt_suspended(None).into(), Ok(())),
                    Some(t) => match desk.acquire(kv, spec.id, t, None) {
                        Ok(lease) => {
                            let paused = desk.release(kv, spec.id, lease, true);
                            (w.adopt_suspended(paused).into(), Ok(()))
                        }
                        Err((_, e)) => (w.into(), Err(Error::Peft(e))),
                    },
                },
            }
        });
        if let Err(e) = adopted {
            // The handle never left this call: the table is exactly as it was.
            self.table.cancel_insert(h);
            return Err(e);
        }
        if self.vtc() {
            self.clients.join(h.index(), &spec);
        }
        self.adapter_waits[h.index() as usize] = 0;
        if how == Adopt::Waiting {
            // A new request's slot forgets the block hashes a previous occupant left for its replay.
            let root = self.prefix_root(task, spec.lora, 0);
            if let Some(p) = self.kv.prefix() {
                p.set_prefix(r(h), root, &[]);
            }
        }
        Ok(h)
    }

    /// Marks a request in flight (it is skipped and uses no budget while marked).
    pub fn set_inflight(&mut self, h: Handle, inflight: bool) -> Result<(), Error> {
        self.table.get(h).ok_or(Error::StaleHandle)?;
        self.table.set_inflight(h.index(), inflight);
        Ok(())
    }

    /// Marks a KV connector load into the request's pages pending (or finished). While it is pending
    /// the request is never a victim: not evicted, not recompute-paused or preempted, not
    /// self-evicted; and the pass that schedules nothing is not a stall (spec §1.12, §1.15).
    pub fn set_pending_load(&mut self, h: Handle, pending: bool) -> Result<(), Error> {
        self.table.get(h).ok_or(Error::StaleHandle)?;
        self.table.set_pending_load(h.index(), pending);
        Ok(())
    }

    /// Changes a request's per-step data (phase, position, beam, drafts, …). Its id, LoRA task and
    /// tenant cannot change; an inconsistent result (position past the prompt, beam 0, a step or a request too large,
    /// as at submission) is refused and nothing changes.
    pub fn update(&mut self, h: Handle, f: impl FnOnce(&mut RequestSpec)) -> Result<(), Error> {
        let e = self.table.get(h).ok_or(Error::StaleHandle)?;
        if e.ownership() == Ownership::Sending {
            return Err(Error::Invalid(
                "a sending request cannot change until its send ends (end_send)",
            ));
        }
        let mut s = e.spec().clone();
        f(&mut s);
        s.id = e.spec().id;
        s.lora = e.spec().lora;
        s.tenant = e.spec().tenant;
        if s.position > s.prompt {
            return Err(Error::Invalid("position is beyond the prompt"));
        }
        self.check_sizes(&s)?;
        self.table.edit(h.index(), |r| *r.spec_mut() = s);
        Ok(())
    }

    /// Removes a finished or cancelled request: everything it owns is released (a lease with
    /// pause = false, a paused registration dropped, its KV freed).
    pub fn remove(&mut self, h: Handle) -> Result<RequestSpec, Error> {
        let (held, spec) = self.table.remove(h).ok_or(Error::StaleHandle)?;
        held.finish(&mut self.kv, &mut self.desk);
        if self.vtc() {
            self.clients.leave(h.index());
        }
        Ok(spec)
    }

    /// VTC keeps counters.
    fn vtc(&self) -> bool {
        matches!(self.cfg.admission, crate::config::Admission::Vtc { .. })
    }

    /// VTC: the completed step's service, charged to its clients (context tokens at the input weight,
    /// generated tokens — beam and drafts — at the output weight).
    fn charge_service(&mut self, out: &SchedulerOutput<N, S>, input: u32, output: u32) {
        for c in out.context() {
            let l = c.listed;
            if self.table.is_live(l.slot(), l.handle().generation()) {
                let service = u64::from(c.tokens) * u64::from(input);
                self.clients.charge(l.slot(), service);
            }
        }
        for l in out.generation() {
            if self.table.is_live(l.slot(), l.handle().generation()) {
                let s = self.table.entry(l.slot()).spec();
                let service = u64::from(s.beam + s.draft) * u64::from(output);
                self.clients.charge(l.slot(), service);
            }
        }
    }

    /// Runs one scheduling pass into `out` (spec §1.2; the algorithm is `pass.rs`).
    pub fn schedule(&mut self, out: &mut SchedulerOutput<N, S>) -> Result<(), Error> {
        if self.encoder_without_cross_pool() {
            return Err(Error::CrossPoolRequired);
        }
        self.passes += 1;
        self.sync_loads();
        let Scratch {
            marks,
            pending,
            plan,
            listed,
            chunks,
            contributed,
            client_sums,
            pending_slots,
        } = &mut self.scratch;
        let parts = pass::Parts {
            marks,
            contributed,
            pending,
            plan,
            clients: &self.clients,
            client_sums,
            adapter_waits: &mut self.adapter_waits,
            failed_loads: pending_slots,
        };
        let pass = Pass::begin(
            &self.cfg,
            &mut self.kv,
            &mut self.desk,
            &mut self.table,
            parts,
            out,
        );
        let (stats, verdict) = pass.run((listed, chunks), &mut self.stall);
        out.set_pass(self.passes);
        self.last = stats;
        verdict
    }

    /// Makes the scheduled batch's adapters resident on the device; `out.adapter_loads()` lists the
    /// copies. With the pass's adapter page budget this never fails for a batch the pass produced.
    ///
    /// With unified paging every batch adapter is resident already (its leases pin it in the KV
    /// pool); the loads are the adapters the pool placed since the engine last looked.
    pub fn ensure_batch(&mut self, out: &mut SchedulerOutput<N, S>) -> Result<(), PeftError> {
        let (plan, loads) = out.plan_and_loads();
        loads.clear();
        self.desk.ensure_batch(plan, &mut |t| {
            let pushed = loads.push(t);
            assert!(pushed.is_ok(), "a load per planned adapter");
        })?;
        let desk = &self.desk;
        if let Some(a) = self.kv.adapters() {
            a.take_adapter_placements(&mut |slot| {
                // A placed adapter is pinned by a lease (of one of the `T` task slots): at most one
                // per live request.
                if usize::from(slot) < T {
                    let pushed = loads.push(desk.task_ref(slot));
                    assert!(pushed.is_ok(), "a load per pinned adapter");
                }
            });
        }
        Ok(())
    }

    /// Hands the page moves logged since the last call to the copy engine (in order; the log is then
    /// empty), and settles every resumed request: its pages come up with these moves, ordered before its
    /// step, so it is an ordinary active request from now on (arrow 5 of [`crate::request`]).
    pub fn take_moves(&mut self) -> &[crate::kv::PageMove] {
        if self.table.resumed() > 0 {
            self.settle_resumed(&MovesTaken::mint());
        }
        self.kv.take_moves()
    }

    fn settle_resumed(&mut self, moves: &MovesTaken) {
        let slots = &mut self.scratch.pending_slots;
        self.table.take_resumed_slots(slots);
        for &slot in slots.iter() {
            // A vacant slot's hot record is the default one (waiting): only live resumed ones settle.
            if self.table.hot(slot).ownership() != Ownership::Resumed as u8 {
                continue;
            }
            self.table.transition(slot, |held| match held {
                Held::Resumed(r) => (r.settle(moves).into(), ()),
                other => (other, ()),
            });
        }
        assert_eq!(self.table.resumed(), 0, "every resumed request settled");
    }

    /// The page moves of one pool of the requests' caches (a [`crate::kv_set::KvSet`]'s draft and cross
    /// pools beside the target) since the last call, in order; the engine copies them with
    /// [`Scheduler::take_moves`]'s before the step. The target's are [`Scheduler::take_moves`] itself.
    pub fn take_pool_moves(&mut self, pool: crate::kv::Pool) -> &[crate::kv::PageMove] {
        match pool {
            crate::kv::Pool::Target => self.take_moves(),
            crate::kv::Pool::Draft => match self.kv.draft() {
                Some(d) => d.take_draft_moves(),
                None => &[],
            },
            crate::kv::Pool::Cross => match self.kv.cross() {
                Some(x) => x.take_cross_moves(),
                None => &[],
            },
        }
    }

    /// Speculative decoding: the engine verified the request's last step and rejected `tokens` of its
    /// draft tokens; its caches (target and a joint draft pool) give their slots back. Under
    /// GUARANTEED_NO_EVICT the slots stay (the admission reserved the request's whole life). Refused
    /// ([`Error::StaleHandle`], nothing changes) for a handle that names no live request.
    pub fn rewind(&mut self, h: Handle, tokens: u32) -> Result<(), Error> {
        let e = self.table.get(h).ok_or(Error::StaleHandle)?;
        if self.cfg.policy == crate::config::CapacityPolicy::GuaranteedNoEvict {
            return Ok(());
        }
        let r = KvRef {
            slot: h.index(),
            id: e.spec().id,
        };
        self.kv.rewind(r, tokens);
        Ok(())
    }

    /// Adapters evicted from the device since the last call (their device pages are free for reuse), in
    /// order: with the loads `ensure_batch` reports, the adapter plan a device binding applies.
    ///
    /// With unified paging they come from the KV pool: an evicted adapter's pages hold KV now.
    pub fn take_adapter_evictions(&mut self, mut evicted: impl FnMut(TaskRef)) {
        self.desk.backend_mut().take_device_evictions(&mut evicted);
        let desk = &self.desk;
        if let Some(a) = self.kv.adapters() {
            a.take_adapter_evictions(&mut |slot| {
                if usize::from(slot) < T {
                    evicted(desk.task_ref(slot));
                }
            });
        }
    }

    /// Adapters whose host copy changed since the last call (loaded into host pages when a request
    /// acquired its lease, evicted from them for room, or dropped by a reload), each once with what
    /// the binding must do: free its host pages, write its weights, or both. Take them after the pass
    /// and before the adapter plan's device loads, which read the host copies.
    pub fn take_adapter_host_changes(
        &mut self,
        mut changed: impl FnMut(TaskRef, crate::adapter::HostChange),
    ) {
        self.desk.backend_mut().take_host_changes(&mut changed);
    }

    /// Completes the step the last pass scheduled, as an engine does once it ran: a context chunk
    /// advances the position (a fully processed prompt moves to `GENERATION_IN_PROGRESS`, or, for a
    /// context-only request of disaggregated serving, starts sending its KV: `transfer.rs`); a
    /// recompute-paused request is reset to a first-chunk `CONTEXT_INIT` that replays its prefill; a
    /// generation step of a request whose transfer completed makes it `GENERATION_IN_PROGRESS`.
    ///
    /// Refused ([`Error::StaleOutput`], nothing changes) for an output that is not the last pass's, or
    /// whose step was completed already. An entry whose request was removed after the pass is skipped.
    pub fn complete_step(&mut self, out: &SchedulerOutput<N, S>) -> Result<(), Error> {
        if out.pass() != self.passes || self.completed == self.passes {
            return Err(Error::StaleOutput);
        }
        self.completed = self.passes;
        if let crate::config::Admission::Vtc {
            input_weight,
            output_weight,
        } = self.cfg.admission
        {
            self.charge_service(out, input_weight, output_weight);
        }
        for c in out.context() {
            let l = c.listed;
            if !self.table.is_live(l.slot(), l.handle().generation()) {
                continue;
            }
            let (id, position, send) = self.table.edit(l.slot(), |e| {
                let s = e.spec_mut();
                s.position = s.position.saturating_add(c.tokens).min(s.prompt);
                let done = s.position >= s.prompt;
                let send = done && s.context_only;
                if done && !send {
                    s.phase = Phase::GenerationInProgress;
                }
                (s.id, s.position, send)
            });
            // The chunk's blocks are computed: they may join the prefix cache.
            let r = KvRef { slot: l.slot(), id };
            if let Some(p) = self.kv.prefix() {
                p.commit(r, position);
            }
            if send {
                self.start_send(l.slot());
            }
        }
        for l in out.generation() {
            let live = self.table.is_live(l.slot(), l.handle().generation());
            if live
                && self.table.entry(l.slot()).spec().phase == Phase::DisaggGenerationTransComplete
            {
                self.table.edit(l.slot(), |e| {
                    e.spec_mut().phase = Phase::GenerationInProgress;
                });
            }
        }
        for l in out.recompute_paused() {
            if !self.table.is_live(l.slot(), l.handle().generation()) {
                continue;
            }
            self.table.edit(l.slot(), |e| {
                let s = e.spec_mut();
                s.phase = Phase::ContextInit;
                s.position = 0;
            });
        }
        Ok(())
    }
}
