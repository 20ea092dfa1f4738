//! Multimodal chunk alignment (spec §1.9): a chunk never ends strictly inside a bidirectional multimodal
//! run (both positions around its end multimodal), since the run's tokens attend to each other in both
//! directions and must be computed in one chunk.
//!
//! In absolute prompt positions, for a chunk `[pos, pos + chunk)` whose end falls inside the run
//! `[a, b)`: snap up to `b` rounded up to the chunk unit (clamped to the prompt) when that fits the token
//! budget, `max_context_length` and the remaining context; else snap down to `a` floored to the unit, and
//! when that is at or before the chunk's start, the chunk is deferred (0). A run longer than
//! `max_context_length` could never be held by one chunk: such a request is refused at submission
//! (`Scheduler::submit`), where upstream raises mid-pass.

use crate::adapter::PeftBackend;
use crate::kv::KvBackend;
use crate::storage::Storage;

use super::pass::Pass;

impl<K: KvBackend, P: PeftBackend, const N: usize, const T: usize, S: Storage>
    Pass<'_, K, P, N, T, S>
{
    /// `chunk` tokens from the request's position, aligned to its multimodal runs (0: defer).
    pub(crate) fn align_to_mm_runs(&self, slot: u16, chunk: u32, remaining: u32, unit: u32) -> u32 {
        let s = self.table.entry(slot).spec();
        let (pos, end) = (s.position, s.position + chunk);
        let Some(&(a, b)) = s.mm_runs.iter().find(|&&(a, b)| a < end && end < b) else {
            return chunk;
        };
        let up = b.div_ceil(unit).saturating_mul(unit).min(s.prompt) - pos;
        let fits = self.budget.remaining().is_none_or(|r| up <= r)
            && self.cfg.max_context_length.is_none_or(|m| up <= m)
            && up <= remaining;
        if fits && up > chunk {
            return up;
        }
        let down = a / unit * unit;
        down.saturating_sub(pos)
    }
}
