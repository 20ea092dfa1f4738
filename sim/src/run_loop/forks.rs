//! Parallel sampling (`--samples N`, issue 44): once a request's prompt is computed, its other
//! samples are forked off it (`Scheduler::fork`): each starts on its full pages, shared, computes its
//! last block and decodes its own output. A fork the table has no room for waits for the next step;
//! the report counts the forks and the pages they shared (the pages saved against separate requests).

use kvsched_core::request::RequestSpec;
use kvsched_core::{Error, Phase};

use super::super::backend::SimKv;
use super::super::{Live, SimError};
use super::Sim;

impl<'s, K: SimKv<'s>> Sim<'s, '_, K> {
    /// Forks the samples due: those of requests whose prompt is computed and that are still
    /// active, in order; a full table leaves the rest for the next step.
    pub(super) fn fork_samples(&mut self) -> Result<(), SimError> {
        let due = std::mem::take(&mut self.forks_due);
        for (at, &(slot, first)) in due.iter().enumerate() {
            match self.fork_from(slot, first)? {
                None => {}
                Some(k) => {
                    self.forks_due.push((slot, k));
                    self.forks_due.extend_from_slice(&due[at + 1..]);
                    return Ok(());
                }
            }
        }
        Ok(())
    }

    /// Forks samples `first..` of the request in `slot`; `Some(k)` when sample `k` found the table
    /// full. A request gone (finished, or recompute-paused: its replay is not the prompt's end) has
    /// its forks dropped, counted as refused.
    fn fork_from(&mut self, slot: u16, first: u32) -> Result<Option<u32>, SimError> {
        let Some(lv) = self.live[slot as usize].as_ref() else {
            return Ok(None);
        };
        let (handle, arrival, prompt) = (lv.handle, lv.arrival, lv.prompt0);
        let output = lv.output;
        for k in first..self.o.samples {
            let id = arrival as u64 | u64::from(k) << 48;
            let mut spec = RequestSpec::new(id, Phase::ContextInit, prompt);
            spec.max_new_tokens = output;
            spec.lora = self
                .sched
                .get(handle)
                .map_err(SimError::Scheduler)?
                .spec()
                .lora;
            let h = match self.sched.fork(handle, spec) {
                Ok(h) => h,
                Err(Error::CapacityExhausted { .. }) => return Ok(Some(k)),
                Err(_) => {
                    self.r.fork_refused += 1;
                    continue;
                }
            };
            let shared = self
                .sched
                .get(h)
                .map_err(SimError::Scheduler)?
                .spec()
                .position;
            self.r.forks += 1;
            self.r.fork_pages_shared += u64::from(shared / self.o.tokens_per_block);
            self.waits.entered(h.index(), id, self.now_ms);
            self.live[h.index() as usize] = Some(Live {
                arrival,
                handle: h,
                prompt0: prompt,
                output,
                generated: 0,
                first_token_ms: None,
                last_token_ms: 0.0,
                first_chunk: false,
                replay: false,
                sample: k,
            });
        }
        Ok(None)
    }
}
