//! Context admission's sizing (spec §1.7): prepare the cache (a first chunk's reused prefix moves the
//! position), size the chunk — the whole remaining prompt, or a chunk by policy (first come first
//! served, FORCE_CHUNK snapshot points, EQUAL_PROGRESS plans) rounded to the chunk unit — and resize the
//! cache for it, with context-side preemption when pages are short.
//!
//! Invariants: the budget is charged the pre-reuse length when prefix-aware scheduling is off (but a
//! FORCE_CHUNK chunk its post-reuse length, as upstream's FORCE_CHUNK branch) and the post-reuse
//! length when on, while the KV resize always uses the post-reuse length; only the last chunk
//! adds drafts (without a budget check, as upstream); a chunk is never 0 tokens; under
//! GUARANTEED_NO_EVICT the resize reserves prompt + output + drafts (by capacity, or in pages where
//! the backend [`reserves`](crate::kv::KvLimits::reserves) itself).

use crate::adapter::PeftBackend;
use crate::config::{CapacityPolicy, ChunkPolicy};
use crate::kv::{ContextPrep, KvBackend, KvRef, Reservation};
use crate::storage::Storage;

use super::pass::{Pass, Step};

/// A first chunk's trial foretells its resize exactly (`trial.rs`).
const TRIAL_EXACT: &str = "a first chunk's trial granted what its resize refused";

/// A sized chunk: what admitting it charges and schedules.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SizedChunk {
    /// Tokens charged to the budget.
    pub(crate) charged: u32,
    /// Prompt tokens the chunk processes.
    pub(crate) chunk: u32,
    /// The chunk ends the prompt.
    pub(crate) last: bool,
}

impl<K: KvBackend, P: PeftBackend, const N: usize, const T: usize, S: Storage>
    Pass<'_, K, P, N, T, S>
{
    /// What the KV backend learns of a context request.
    pub(crate) fn context_prep(&self, slot: u16, first: bool) -> ContextPrep {
        let s = self.table.entry(slot).spec();
        ContextPrep {
            first_chunk: first,
            prompt: s.prompt,
            position: s.position,
            lookahead: s.draft,
            reuse_limit: ContextPrep::NO_LIMIT,
        }
    }

    pub(crate) fn kv_ref(&self, slot: u16) -> KvRef {
        KvRef {
            slot,
            id: self.table.entry(slot).spec().id,
        }
    }

    /// Prepares the cache; a first chunk's cursor moves to its reused prefix (spec §2
    /// `prepare_context`: set to the reused depth, so a first chunk with a stale cursor and no match is
    /// rewound to 0).
    fn prepare(&mut self, slot: u16, first: bool) -> bool {
        let r = self.kv_ref(slot);
        let prep = self.context_prep(slot, first);
        match self.kv.prepare_context(r, prep) {
            None => false,
            Some(reused) => {
                if first {
                    self.table.edit(slot, |e| {
                        let s = e.spec_mut();
                        s.position = reused.min(s.prompt);
                    });
                }
                true
            }
        }
    }

    /// What a GUARANTEED_NO_EVICT chunk growing to `capacity` reserves: the whole request (prompt,
    /// output, drafts), and the most any later step of it computes (a later chunk, within the token
    /// budget and the context limit, or a decode step with its drafts).
    pub(crate) fn reservation(&self, slot: u16, capacity: u32) -> Reservation {
        let s = self.table.entry(slot).spec();
        let left = s.prompt.saturating_sub(capacity);
        let later = if left == 0 {
            0
        } else {
            let budget = self.cfg.max_num_tokens.unwrap_or(u32::MAX);
            let context = self.cfg.max_context_length.unwrap_or(u32::MAX);
            left.min(budget).min(context).saturating_add(s.draft)
        };
        Reservation {
            tokens: capacity.max(s.prompt + s.max_new_tokens + s.draft),
            step: later.max(s.draft + 1),
        }
    }

    /// Grows the cache of the request at index `i` to `capacity` (under GUARANTEED_NO_EVICT with the
    /// whole request reserved); a refusal tries context-side preemption (STOP when it freed pages for
    /// this request next pass, else SKIP).
    fn resize(&mut self, i: usize, first: bool, capacity: u32) -> Result<(), Step> {
        let slot = self.table.slot(i);
        let r = self.kv_ref(slot);
        let granted = if self.cfg.policy == CapacityPolicy::GuaranteedNoEvict {
            let reservation = self.reservation(slot, capacity);
            self.kv.resize_reserving(r, capacity, reservation, first)
        } else {
            self.kv.resize_context(r, capacity, first).then_some(0)
        };
        if let Some(headroom) = granted {
            // What the cache holds beyond this chunk stays reserved for the decode steps (under-
            // stating it is safe: a step then merely asks for tokens the cache already has room for).
            self.table.set_headroom(slot, headroom);
            return Ok(());
        }
        Err(self.pages_refused(i, first))
    }

    /// The pages of the context request at index `i` cannot be had: GUARANTEED_NO_EVICT closes
    /// admissions after a first chunk (SKIP); otherwise context-side preemption (STOP when it freed
    /// pages for this request next pass, else SKIP).
    pub(crate) fn pages_refused(&mut self, i: usize, first: bool) -> Step {
        if self.cfg.policy == CapacityPolicy::GuaranteedNoEvict {
            // C++ GUARANTEED_NO_EVICT (spec §7): a block shortage ends the admission of new requests, so
            // later (smaller) ones cannot overtake one that waits for its whole reservation. Contexts
            // already admitted hold their reservation and keep going.
            if first {
                self.admissions_closed = true;
            }
            return Step::Skip;
        }
        if self.preempt_for_pages(i) {
            Step::Stop
        } else {
            // Under priority a lower one yields next pass, and a service class may claim (not when a
            // preemption freed pages already).
            self.note_blocked(self.table.slot(i), super::priority::Need::Pages);
            Step::Skip
        }
    }

    /// Non-chunked admission (§1.7 `_full`).
    pub(crate) fn context_whole(&mut self, i: usize, first: bool) -> Result<SizedChunk, Step> {
        let slot = self.table.slot(i);
        let s = self.table.entry(slot).spec();
        let (prompt, pos0, draft) = (s.prompt, s.position, s.draft);
        let pre = prompt - pos0 + draft;
        if !self.cfg.prefix_aware && !self.budget.fits(pre) {
            return Err(Step::Stop);
        }
        let trial = self.trial(slot, first);
        if trial.is_none() && !self.prepare(slot, first) {
            return Err(Step::Stop);
        }
        let pos = self.table.entry(slot).spec().position;
        let post = prompt - pos + draft;
        if self.cfg.prefix_aware && !self.budget.fits(post) {
            return Err(Step::Stop);
        }
        if let Some(t) = trial {
            self.settle_trial(i, t, pos + post)?;
        }
        // Without chunking `max_context_length` is at least the budget (`Config::validate`,
        // deliberate difference 16), so a whole prompt the budget holds is within it.
        debug_assert!(!self.cfg.context_limit_below_budget());
        let resized = self.resize(i, first, pos + post);
        debug_assert!(trial.is_none() || resized.is_ok(), "{TRIAL_EXACT}");
        resized?;
        Ok(SizedChunk {
            charged: if self.cfg.prefix_aware { post } else { pre },
            chunk: prompt - pos,
            last: true,
        })
    }

    /// Chunked admission (§1.7 `_chunked`).
    pub(crate) fn context_chunked(
        &mut self,
        i: usize,
        first: bool,
        planned: u32,
    ) -> Result<SizedChunk, Step> {
        let slot = self.table.slot(i);
        let Some(ch) = self.cfg.chunking else {
            return Err(Step::Skip);
        };
        if !self.budget.has_chunk_budget(ch.policy, ch.unit) {
            return Err(Step::Skip);
        }
        let pos0 = self.table.entry(slot).spec().position;
        let trial = self.trial(slot, first);
        if trial.is_none() && !self.prepare(slot, first) {
            return Err(Step::Skip);
        }
        let s = self.table.entry(slot).spec();
        let (prompt, pos, draft) = (s.prompt, s.position, s.draft);
        let post_remaining = prompt - pos;
        // Only first come first served sizes by the pre-reuse length with prefix-aware scheduling
        // off; FORCE_CHUNK sizes (and charges) the post-reuse remainder either way, as upstream.
        let remaining = if self.cfg.prefix_aware || ch.policy == ChunkPolicy::ForceChunk {
            post_remaining
        } else {
            prompt - pos0
        };
        let chunk = self.chunk_size(slot, remaining, planned);
        if chunk == 0 {
            return Err(Step::Skip);
        }
        let ctx_chunk = chunk.min(post_remaining);
        let last = pos + ctx_chunk >= prompt;
        let extra = if last { draft } else { 0 };
        if let Some(t) = trial {
            self.settle_trial(i, t, pos + ctx_chunk + extra)?;
        }
        let resized = self.resize(i, first, pos + ctx_chunk + extra);
        debug_assert!(trial.is_none() || resized.is_ok(), "{TRIAL_EXACT}");
        resized?;
        Ok(SizedChunk {
            charged: chunk + extra,
            chunk: ctx_chunk,
            last,
        })
    }

    /// The chunk a policy gives a request with `remaining` prompt tokens (§1.7 `_chunked` step 3).
    fn chunk_size(&self, slot: u16, remaining: u32, planned: u32) -> u32 {
        let Some(ch) = self.cfg.chunking else {
            return remaining;
        };
        let s = self.table.entry(slot).spec();
        let (prompt, pos) = (s.prompt, s.position);
        let next_snapshot = s
            .snapshots
            .iter()
            .copied()
            .find(|&p| p > pos)
            .map(|p| p.min(prompt));
        let mut chunk = match ch.policy {
            ChunkPolicy::ForceChunk => next_snapshot.map_or(remaining, |p| p - pos),
            ChunkPolicy::EqualProgress => planned.min(remaining),
            ChunkPolicy::FirstComeFirstServed => self
                .budget
                .remaining()
                .map_or(remaining, |b| b.min(remaining)),
        };
        if let Some(m) = self.cfg.max_context_length {
            chunk = chunk.min(m);
        }
        if let Some(b) = self.budget.remaining() {
            chunk = chunk.min(b);
        }
        chunk = self.time_cap(slot, chunk, ch.unit);
        if chunk < remaining {
            let end = pos + chunk;
            let on_boundary = end == prompt || s.snapshots.contains(&end);
            if ch.policy != ChunkPolicy::ForceChunk || !on_boundary {
                chunk = chunk / ch.unit * ch.unit;
            }
        }
        if chunk == 0 || s.mm_runs.is_empty() {
            return chunk;
        }
        self.align_to_mm_runs(slot, chunk, remaining, ch.unit)
    }
}
