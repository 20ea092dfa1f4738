//! Speculative decoding in the serving loop: prompt-lookup drafts proposed before the pass (the
//! scheduler budgets and allocates a step of 1 + drafts tokens for them), then the step's tokens
//! taken from its logits, the drafts verified against the model's greedy tokens and the rejected
//! positions rewound in the KV pool.

use super::{Engine, Finish, Row};
use crate::error::{EngineError, Result};
use crate::step::Logits;

impl Engine<'_> {
    /// Before the pass: each decoding greedy request's drafts for this step, within what it may
    /// still generate and what one request's page table holds, set as its `RequestSpec::draft`.
    /// Every other request has none.
    pub(super) fn propose_drafts(&mut self) -> Result<()> {
        let Some(lookup) = self.cfg.speculative else {
            return Ok(());
        };
        let table = self.cfg.max_blocks as usize * self.cfg.tokens_per_block as usize;
        for live in self.live.iter_mut().flatten() {
            let decoding =
                !live.context_only && live.computed > 0 && live.computed + 1 == live.tokens.len();
            let spec = self.sched.get(live.handle)?.spec();
            let (now, whole) = (
                spec.draft,
                spec.prompt as usize + spec.max_new_tokens as usize,
            );
            live.draft = if decoding && live.sampler.is_greedy() && live.extras.beam.is_none() {
                // The last token generated is the one the draft follows: it needs no room.
                let room = (live.max_new - live.generated()).saturating_sub(1);
                lookup.propose(&live.tokens, room.min(table.saturating_sub(whole)))
            } else {
                Vec::new()
            };
            let n = live.draft.len() as u32;
            if n != now {
                self.sched.update(live.handle, |s| s.draft = n)?;
            }
        }
        Ok(())
    }

    /// The tokens of row `i` (a context chunk's last row, or a generation step of 1 + drafts rows):
    /// one token sampled from each row's logits while the drafts agree with them — the draft after
    /// row `j` is kept when the token sampled there equals it — so a step yields the kept drafts
    /// and one more. The request's KV keeps the positions of its last token and of the kept
    /// drafts; the rejected drafts' positions are rewound. Returns how the request finished, if
    /// it did (a stop token, or `max_new_tokens`).
    pub(super) fn take_tokens(
        &mut self,
        i: usize,
        r: &Row,
        logits: &Logits,
    ) -> Result<Option<Finish>> {
        let live = self.live[usize::from(r.slot)]
            .as_mut()
            .ok_or_else(|| EngineError::Batch(format!("slot {} is empty", r.slot)))?;
        let draft = if r.context {
            Vec::new()
        } else {
            std::mem::take(&mut live.draft)
        };
        if logits.count(i) != draft.len() + 1 || draft.len() + 1 > r.len {
            return Err(EngineError::Batch(format!(
                "request {}: {} logit rows for {} drafts",
                live.id,
                logits.count(i),
                draft.len()
            )));
        }
        let (mut kept, mut finish) = (0, None);
        let tokenizer = self.model.tokenizer();
        for j in 0..=draft.len() {
            let Some(row) = logits.row(i, j) else { break };
            let Some(token) = live.draw(row, tokenizer.stop_tokens()) else {
                finish = Some(Finish::Stop);
                break;
            };
            live.tokens.push(token);
            if self.cfg.keep_logits {
                live.logits.push(row.to_vec());
            }
            self.stats.tokens += 1;
            if live.sampler.ends_at(token, |t| tokenizer.is_stop(t)) {
                finish = Some(Finish::Stop);
            } else if live.generated() >= live.max_new {
                finish = Some(Finish::Length);
            }
            if finish.is_some() || draft.get(j) != Some(&token) {
                break;
            }
            kept += 1;
        }
        live.computed = r.start + r.len - draft.len() + kept;
        let rejected = draft.len() - kept;
        self.stats.drafts_proposed += draft.len() as u64;
        self.stats.drafts_accepted += kept as u64;
        self.stats.drafts_rejected += rejected as u64;
        if finish.is_none() && rejected > 0 {
            self.sched.rewind(live.handle, rejected as u32)?;
        }
        Ok(finish)
    }
}
