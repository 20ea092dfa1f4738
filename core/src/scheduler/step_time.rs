//! The step budget in time ([`crate::step_budget`], beyond the reference; issue 45): while decodes run,
//! phase 2 sizes each chunk so that the step's predicted time stays under the inter-token-latency
//! target.
//!
//! Phase 2 begins by charging the step's fixed cost and the decode steps phase 1 scheduled (each
//! reading its prompt's tokens: the scheduler does not know the tokens it generated). A chunk is then
//! capped at the longest whose cost fits what is left (`StepCost::fit`, after the tokens before it),
//! and charged once scheduled. The first chunk of a step keeps at least one chunk unit, so prefill
//! progresses when decodes alone use the target up. With no decode in the step, or no step budget,
//! nothing is capped: the token budget alone decides.

use crate::adapter::PeftBackend;
use crate::kv::KvBackend;
use crate::storage::Storage;

use super::pass::Pass;

impl<K: KvBackend, P: PeftBackend, const N: usize, const T: usize, S: Storage>
    Pass<'_, K, P, N, T, S>
{
    /// Before phase 2: with a step budget and decodes in the step, what is left of the target once the
    /// step's fixed cost and its decodes are charged.
    pub(crate) fn begin_step_time(&mut self) {
        let Some(b) = self.cfg.step_budget else {
            return;
        };
        let decodes = self.out.generation();
        if decodes.is_empty() {
            return;
        }
        let cached: u64 = decodes
            .iter()
            .map(|l| u64::from(self.table.entry(l.slot()).spec().prompt))
            .sum();
        let spent = b.cost.decodes_ps(decodes.len() as u64, cached);
        self.budget.start_time(b.target_ps().saturating_sub(spent));
    }

    /// A chunk of at most `chunk` tokens of the request at `slot`, capped by the time left (at least
    /// `unit` tokens for the step's first chunk).
    pub(crate) fn time_cap(&self, slot: u16, chunk: u32, unit: u32) -> u32 {
        let ((Some(left), charged), Some(b)) = (self.budget.time_left(), self.cfg.step_budget)
        else {
            return chunk;
        };
        let prior = self.table.entry(slot).spec().position;
        let fits = b.cost.fit(prior, left, chunk);
        if charged {
            fits
        } else {
            fits.max(unit.min(chunk))
        }
    }

    /// A chunk of `tokens` of the request at `slot` was scheduled: its time is charged.
    pub(crate) fn charge_time(&mut self, slot: u16, tokens: u32) {
        let (Some(b), (Some(_), _)) = (self.cfg.step_budget, self.budget.time_left()) else {
            return;
        };
        let prior = self.table.entry(slot).spec().position;
        self.budget.charge_time(b.cost.chunk_ps(tokens, prior));
    }
}
