//! The scheduler's public API for requests: submission (with a prompt's block hashes), adoption of a
//! request whose cache a backend already holds ([`Adopt`]), the in-flight and pending-load marks,
//! per-step updates, and removal.

use crate::adapter::{PeftBackend, TaskRef};
use crate::error::Error;
use crate::kv::{KvBackend, KvCaps, KvRef, PrefixReuse};
use crate::request::{Ownership, RequestSpec};
use crate::storage::Storage;

use super::table::AnyRequest;
use super::{Handle, Scheduler};

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

impl<K: KvBackend, P: PeftBackend, const N: usize, const T: usize, S: Storage>
    Scheduler<K, P, N, T, S>
{
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
    pub(super) fn prefix_root(
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
    // The spec is given away, as to `submit`: the table keeps its copy.
    #[allow(clippy::needless_pass_by_value)]
    pub fn adopt(&mut self, spec: RequestSpec, how: Adopt) -> Result<Handle, Error> {
        if how == Adopt::Waiting && !self.by_priority() {
            self.arrived();
        } else {
            self.changed();
        }
        let task = self.check_spec(&spec)?;
        let r = |h: Handle| KvRef {
            slot: h.index(),
            id: spec.id,
        };
        let h = self.enter(&spec, task)?;
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
            let AnyRequest::Waiting(w) = held else {
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
        let e = self.table.get(h).ok_or(Error::StaleHandle)?;
        if e.inflight() != inflight {
            self.changed();
        }
        self.table.set_inflight(h.index(), inflight);
        Ok(())
    }

    /// Marks a KV connector load into the request's pages pending (or finished). While it is pending
    /// the request is never a victim: not evicted, not recompute-paused or preempted, not
    /// self-evicted; and the pass that schedules nothing is not a stall (spec §1.12, §1.15).
    pub fn set_pending_load(&mut self, h: Handle, pending: bool) -> Result<(), Error> {
        let e = self.table.get(h).ok_or(Error::StaleHandle)?;
        if e.pending_load() != pending {
            self.changed();
        }
        self.table.set_pending_load(h.index(), pending);
        Ok(())
    }

    /// Changes a request's per-step data (phase, position, beam, drafts, …). Its id, LoRA task and
    /// tenant cannot change, nor its service class once it owns anything (a new request's may: nothing
    /// of it is charged to a class yet); an inconsistent result (position past the prompt, beam 0, a step or a request too large,
    /// beside its adapter too with unified paging, as at submission) is refused and nothing changes.
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
        let new = e.ownership() == Ownership::Waiting && e.spec().position == 0;
        if !new {
            s.class = e.spec().class;
        }
        if s.position > s.prompt {
            return Err(Error::Invalid("position is beyond the prompt"));
        }
        self.check_sizes(&s)?;
        if let Some(t) = e.task() {
            // Unified paging: grown drafts or output must still fit beside its adapter, as at
            // submission (else it could never be admitted whole).
            self.check_beside_adapter(&s, t)?;
        }
        let old = self.table.entry(h.index()).spec();
        let reorder = self.by_priority() && s.priority != old.priority;
        if s.class != old.class && self.blocked.class.is_some_and(|b| b.slot == h.index()) {
            // Its claim was its old class's.
            self.blocked.class = None;
        }
        if s != *old {
            self.changed();
        }
        self.table.edit(h.index(), |r| *r.spec_mut() = s);
        if reorder {
            self.table.reorder(h.index());
        }
        Ok(())
    }

    /// Removes a finished or cancelled request: everything it owns is released (a lease with
    /// pause = false, a paused registration dropped, its KV freed). Refused, changing nothing, for a
    /// request marked in flight ([`Self::set_inflight`]) that owns KV on the GPU: the step in flight may
    /// still read its pages, which the next pass could hand to another request. Clear the mark once the
    /// step completes, then remove it.
    pub fn remove(&mut self, h: Handle) -> Result<RequestSpec, Error> {
        let e = self.table.get(h).ok_or(Error::StaleHandle)?;
        if e.inflight() && e.ownership().on_gpu() {
            return Err(Error::Invalid(
                "a request in flight cannot be removed: its step may still read its pages (clear its in-flight mark once the step completes, then remove it)",
            ));
        }
        self.discard(h)
    }

    /// Takes a live request out of the table and gives up everything it owns (`remove`, and a send's
    /// end, whose KV has left with the transfer).
    pub(crate) fn discard(&mut self, h: Handle) -> Result<RequestSpec, Error> {
        let e = self.table.get(h).ok_or(Error::StaleHandle)?;
        let r = KvRef {
            slot: h.index(),
            id: e.spec().id,
        };
        if self.kv.cache(r).exists() {
            // Not a member of the refused run (a member has no cache): what it frees, the run's
            // shortfalls account for (`refused_run.rs`).
            self.steady = false;
        } else {
            self.changed();
        }
        let (held, spec) = self.table.remove(h).ok_or(Error::StaleHandle)?;
        held.finish(&mut self.kv, &mut self.desk);
        if self.vtc() {
            self.clients.leave(h.index());
        }
        Ok(spec)
    }
}
