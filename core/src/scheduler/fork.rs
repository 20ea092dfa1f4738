//! Forks (beyond the reference): a child request that starts with its parent's KV, for parallel
//! sampling (n > 1) and beam search (issue 44). The reference has no fork: it changes no scenario.

use crate::adapter::PeftBackend;
use crate::error::Error;
use crate::kv::{KvBackend, KvCaps, KvRef, PrefixReuse};
use crate::phase::Phase;
use crate::request::{Ownership, RequestSpec};
use crate::storage::Storage;

use super::table::AnyRequest;
use super::{Handle, Scheduler};

/// Why a fork is refused before the KV backend is asked.
const NOT_A_CHILD: &str = "a fork's child is a new CONTEXT_INIT request at position 0 with its parent's adapter and tenant, and at most the tokens its parent has computed";

impl<K: KvBackend, P: PeftBackend, const N: usize, const T: usize, S: Storage>
    Scheduler<K, P, N, T, S>
{
    /// Forks a child off `parent`, an [`Active`](crate::request::Active) request whose first
    /// `spec.prompt` tokens (its prompt and what it generated, as the engine counts them) are the
    /// child's prompt and are computed. The child (`spec`: a fresh id, `CONTEXT_INIT` at position 0,
    /// the parent's adapter and tenant) starts active, holding by reference the parent's full blocks
    /// before its last token, at the position they cover: its first chunk computes the rest (at
    /// least its last token, whose logits it samples from). From then on it is a request of its
    /// own: scheduled, suspended, resumed, recompute-paused, preempted and removed alone, its pages
    /// shared until one side gives them up; a LoRA child holds its own lease. It has the parent's
    /// block hashes and root, so what it computes of the parent's prompt is cached as the parent's.
    ///
    /// Refused, changing nothing: a stale handle; a parent not active on the GPU, or neither a
    /// context nor a decode (a transfer's, a context-only request's); a child not as above; a duplicate id, a full table, a child too large (as [`Self::submit`]); a KV backend
    /// that cannot fork them (no prefix cache, whose reference counts share the pages; a draft,
    /// cross or sliding-window pool; a KV connector; less than a block to share); the adapter cache
    /// refusing the child's lease.
    // The spec is given away, as to `submit`: the table keeps its copy.
    #[allow(clippy::needless_pass_by_value)]
    pub fn fork(&mut self, parent: Handle, spec: RequestSpec) -> Result<Handle, Error> {
        let from = self.fork_parent(parent, &spec)?;
        self.changed();
        let task = self.check_spec(&spec)?;
        let h = self.enter(&spec, task)?;
        let child = KvRef {
            slot: h.index(),
            id: spec.id,
        };
        let can = self
            .kv
            .caps()
            .prefix
            .and_then(|k| k.can_fork(from, child, spec.prompt));
        let Some(shared) = can else {
            self.table.cancel_insert(h);
            return Err(Error::Invalid(
                "the KV backend cannot fork these requests (a fork needs a prefix cache, no draft, cross, sliding-window or recurrent-state pool, no KV connector, and a full block to share)",
            ));
        };
        let share = |kv: &mut K| {
            let forked = kv.prefix().and_then(|k| k.fork(from, child, spec.prompt));
            forked == Some(shared)
        };
        let (kv, desk) = (&mut self.kv, &mut self.desk);
        let admitted = self.table.transition(h.index(), |held| {
            let AnyRequest::Waiting(w) = held else {
                panic!("a new entry is waiting");
            };
            match w.admit_fork(kv, desk, share) {
                Ok(a) => (a.into(), Ok(())),
                Err(x) => (x.request.into(), Err(x.error)),
            }
        });
        if let Err(e) = admitted {
            // The lease refused before any page was shared: the table is as it was.
            self.table.cancel_insert(h);
            return Err(e);
        }
        self.table
            .edit(h.index(), |r| r.spec_mut().position = shared);
        if self.vtc() {
            self.clients.join(h.index(), &spec);
        }
        self.adapter_waits[h.index() as usize] = 0;
        Ok(h)
    }

    /// `parent`'s KV reference, where `spec` is a child it can have (`fork`'s first refusals).
    fn fork_parent(&self, parent: Handle, spec: &RequestSpec) -> Result<KvRef, Error> {
        let p = self.table.get(parent).ok_or(Error::StaleHandle)?;
        if p.ownership() != Ownership::Active {
            return Err(Error::Invalid(
                "a fork's parent is active on the GPU (not waiting, suspended, resumed or sending)",
            ));
        }
        let ps = p.spec();
        // What the parent has computed: a context's position; a decode's prompt and output.
        let computed = match ps.phase {
            Phase::ContextInit if !ps.context_only => ps.position,
            p if p.is_generation() && !ps.context_only => u32::MAX,
            _ => 0,
        };
        if spec.phase != Phase::ContextInit
            || spec.position != 0
            || spec.context_only
            || spec.lora != ps.lora
            || spec.tenant != ps.tenant
            || spec.prompt > computed
        {
            return Err(Error::Invalid(NOT_A_CHILD));
        }
        Ok(KvRef {
            slot: parent.index(),
            id: ps.id,
        })
    }
}
