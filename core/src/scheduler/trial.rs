//! A first chunk's trial (beyond the reference, difference 15 in docs/conformance-format.md): where the
//! KV backend can tell what a first chunk would reuse and whether its resize would be refused, the pass
//! sizes the chunk from that answer and prepares the cache only for a chunk the backend will grant.
//! A refused one is refused as a refused resize is (context-side preemption where the policy has it),
//! with no KV call: nothing is matched, claimed, released or suspended, so a waiting request that
//! cannot be admitted costs what its trial costs, not a match of its whole prompt, every pass.
//!
//! The decisions are the reference's: the trial tells the reuse the preparation would find and the
//! refusal the resize would make. What differs is what a refused trial leaves behind: the blocks it
//! would have matched keep their place in the eviction order (the reference's preparation takes them
//! and its free gives them back as the youngest), and no suspension or prefix hit is counted for it.
//!
//! Not under GUARANTEED_NO_EVICT (its refusal closes admissions; the next requests cost nothing).

use crate::adapter::PeftBackend;
use crate::config::CapacityPolicy;
use crate::kv::{ContextPrep, KvBackend, KvCaps, PrefixReuse};
use crate::storage::Storage;

use super::pass::{Pass, Step};

/// A first chunk sized from the backend's answer, not yet prepared.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Trial {
    prep: ContextPrep,
    reused: u32,
}

impl<K: KvBackend, P: PeftBackend, const N: usize, const T: usize, S: Storage>
    Pass<'_, K, P, N, T, S>
{
    /// A first chunk's trial: the reuse the backend tells, the request's position moved to it as
    /// preparing would; `None` where there is no trial (the pass prepares). Every chunk of phase 2
    /// comes here before its preparation, so that the room is spent by each (`within_room`).
    pub(crate) fn trial(&mut self, slot: u16, first: bool) -> Option<Trial> {
        if self.cfg.policy == CapacityPolicy::GuaranteedNoEvict || self.within_room(slot) || !first
        {
            return None;
        }
        let (r, prep) = (self.kv_ref(slot), self.context_prep(slot, true));
        let reused = self.kv.prefix()?.trial_reuse(r, prep)?;
        let spec = self.table.entry(slot).spec();
        if spec.position != reused.min(spec.prompt) {
            self.table.edit(slot, |e| {
                let s = e.spec_mut();
                s.position = reused.min(s.prompt);
            });
        }
        Some(Trial { prep, reused })
    }

    /// The sized chunk grows the cache to `capacity`: a refusal the backend foretells is the refused
    /// resize's outcome, with no KV call; otherwise the cache is prepared (reusing what the trial
    /// told) for the resize that follows.
    pub(crate) fn settle_trial(&mut self, i: usize, t: Trial, capacity: u32) -> Result<(), Step> {
        let slot = self.table.slot(i);
        let r = self.kv_ref(slot);
        let refused = self
            .kv
            .caps()
            .prefix
            .and_then(|p| p.trial_refused(r, t.prep, t.reused, capacity));
        if let Some(short) = refused {
            let e = self.table.entry(slot);
            // No adapter, and no multimodal runs (a chunk aligned to them may shrink by a run when
            // the budget does: `refused_run.rs` bounds the shrink by the chunk unit).
            let s = e.spec();
            let plain = e.task().is_none() && s.lora.is_none() && s.mm_runs.is_empty();
            let step = self.pages_refused(i, true);
            // Nothing happened but the refusal: a refused run may hold it (`refused_run.rs`; the
            // phase tracks runs only where they apply).
            self.refused_clean = plain && step == Step::Skip;
            self.refused_short = short;
            return Err(step);
        }
        let prepared = self.kv.prepare_context(r, t.prep);
        assert!(
            prepared == Some(t.reused),
            "a first chunk's preparation reuses what its trial told"
        );
        Ok(())
    }

    /// The chunk of the request at `slot` is sure to be granted its pages without a trial: all of
    /// its prompt and drafts fit in the room left of the pages available when phase 2's first trial
    /// read them (`TrialMark::available`), which every chunk visited since spent by as many pages
    /// (a preparation takes at most a page a block, matched or new; a resume its held blocks). The
    /// pool's own trial would answer the same (`KvPool::trial_reuse`: granted whatever it reuses),
    /// so the pass prepares as usual, with no trial to pay for. Past the room (or with no mark) the
    /// room is spent, and every later first chunk has its trial.
    fn within_room(&mut self, slot: u16) -> bool {
        let (room, block) = match self.room {
            Some(r) => r,
            None => self
                .kv
                .caps()
                .prefix
                .and_then(PrefixReuse::trial_mark)
                .map_or((0, 1), |m| (m.available, m.block.max(1))),
        };
        let s = self.table.entry(slot).spec();
        let pages = (s.prompt.saturating_add(s.draft)).div_ceil(block);
        let fits = pages <= room;
        self.room = Some((if fits { room - pages } else { 0 }, block));
        fits
    }
}
