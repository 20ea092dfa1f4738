//! A waiting first chunk's own refusal, remembered (issue 41): where the refused run cannot skip a
//! member whole (the run was forgotten, broken by a request admitted or suspended among its members,
//! or never formed because the queue's last request was admitted), each waiting first chunk that its
//! trial refused keeps what that trial read: the pages it was short of, the pages available and the
//! budget left then, and the prefix cache's version. The next pass reaching it skips it, without a
//! trial, while that refusal certainly stands: by the refused run's rule (`refused_run.rs`), applied to
//! the one request with its own mark instead of the run's.
//!
//! A [`RefusalMark`] is the request's (its slot's version) and the refused run's epoch (every
//! `Scheduler::changed` forgets the run and, with it, every mark). The request's chain is unmoved when
//! the version is the mark's or the stamps of its frontiers did not move (`trial_unmoved`: the pool's
//! memo of the request is the very trial that refused it, as a skip makes no trial). A skip is a
//! clean refusal for the run being recorded, short of what it is now short of at least.

use crate::adapter::PeftBackend;
use crate::kv::{KvBackend, KvCaps, PrefixReuse};
use crate::request::Ownership;
use crate::storage::Storage;

use super::pass::Pass;

/// What a waiting first chunk's clean trial refusal read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct RefusalMark {
    /// The prefix cache's version then.
    version: u64,
    /// Pages it was short of (0: no mark).
    short: u32,
    /// Pages available, and the budget left, then.
    available: u32,
    budget: u32,
    /// The refused run's epoch, and the request's slot version.
    epoch: u32,
    request: u32,
}

impl RefusalMark {
    /// No refusal remembered.
    pub(crate) const NONE: RefusalMark = RefusalMark {
        version: 0,
        short: 0,
        available: 0,
        budget: 0,
        epoch: 0,
        request: 0,
    };
}

impl<K: KvBackend, P: PeftBackend, const N: usize, const T: usize, S: Storage>
    Pass<'_, K, P, N, T, S>
{
    /// The request at `slot` was just refused cleanly by its trial, short of `short` pages.
    pub(crate) fn remember_refusal(&mut self, slot: u16, short: u32) {
        let Some(mark) = self.kv.caps().prefix.and_then(PrefixReuse::trial_mark) else {
            return;
        };
        self.refusals[usize::from(slot)] = RefusalMark {
            version: mark.version,
            short,
            available: mark.available,
            budget: self.budget.remaining().unwrap_or(u32::MAX),
            epoch: self.run.epoch(),
            request: self.table.version_at(slot),
        };
    }

    /// The request at `slot` would be refused again by its trial, exactly: what it is now short of
    /// at least (`None`: visit it).
    #[inline(always)]
    pub(crate) fn remembered_refusal(&self, slot: u16) -> Option<u32> {
        if self.refusals[usize::from(slot)].short == 0 {
            return None;
        }
        self.refusal_stands(slot)
    }

    #[inline(never)]
    fn refusal_stands(&self, slot: u16) -> Option<u32> {
        let m = self.refusals[usize::from(slot)];
        let fresh = m.epoch == self.run.epoch()
            && m.request == self.table.version_at(slot)
            && self.table.hot(slot).ownership() == Ownership::Waiting as u8;
        if !fresh || !self.chunk_budget_left() {
            return None;
        }
        let now = self.kv.caps().prefix?.trial_mark()?;
        let budget = self.budget.remaining().unwrap_or(u32::MAX);
        let grown = i64::from(now.available) - i64::from(m.available);
        let shrunk = m.budget.saturating_sub(budget);
        let same = now.version == m.version;
        self.still_short(slot, m.short, grown, shrunk, now.block, same)
    }

    /// Phase 2's first check of a first chunk passes: a chunk budget is left.
    fn chunk_budget_left(&self) -> bool {
        self.cfg
            .chunking
            .is_none_or(|c| self.budget.has_chunk_budget(c.policy, c.unit))
    }
}
