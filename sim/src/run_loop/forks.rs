//! Parallel sampling (`--samples N`, issue 44): once a request's prompt is computed, its other
//! samples are forked off it (`Scheduler::fork`): each starts on its full pages, shared, computes its
//! last block and decodes its own output. A fork the table has no room for waits for the next step;
//! the report counts the forks and the pages they shared (the pages saved against separate requests).

use kvsched_core::request::RequestSpec;
use kvsched_core::scheduler::Handle;
use kvsched_core::{Error, Phase};

use super::super::backend::SimKv;
use super::super::{Live, SimError};
use super::Sim;

impl<'s, K: SimKv<'s>> Sim<'s, '_, K> {
    /// Forks the samples due: those of requests whose prompt is computed and that are still
    /// active, in order; a full table leaves the rest for the next step.
    pub(super) fn fork_samples(&mut self) -> Result<(), SimError> {
        let due = std::mem::take(&mut self.forks_due);
        for (at, &(handle, first)) in due.iter().enumerate() {
            match self.fork_from(handle, first)? {
                Wait::Done => {}
                Wait::Later(k) => self.forks_due.push((handle, k)),
                Wait::Full(k) => {
                    self.forks_due.push((handle, k));
                    self.forks_due.extend_from_slice(&due[at + 1..]);
                    return Ok(());
                }
            }
        }
        Ok(())
    }

    /// Forks samples `first..` of request `handle`: all of them, or from sample `k` on later (the
    /// table full, or the request not active now). A request gone has its samples counted as
    /// refused.
    fn fork_from(&mut self, handle: Handle, first: u32) -> Result<Wait, SimError> {
        let slot = usize::from(handle.index());
        let Some(lv) = self.live[slot].as_ref().filter(|l| l.handle == handle) else {
            self.r.fork_refused += u64::from(self.o.samples - first);
            return Ok(Wait::Done);
        };
        let (arrival, prompt) = (lv.arrival, lv.prompt0);
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
                Err(Error::CapacityExhausted { .. }) => return Ok(Wait::Full(k)),
                Err(_) => return Ok(Wait::Later(k)),
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
        Ok(Wait::Done)
    }
}

/// What is left of a request's forks after a try.
enum Wait {
    /// None.
    Done,
    /// From this sample on, after a later step (the request not active now).
    Later(u32),
    /// From this sample on: the table is full (no later request's forks are tried this step).
    Full(u32),
}
