//! The batch delta (`crate::delta`): what changed in the batch since the engine last asked.

use crate::adapter::PeftBackend;
use crate::delta::{self, BatchDelta, Seen, CONTEXT, ENCODER, GENERATION, NOW};
use crate::error::Error;
use crate::kv::KvBackend;
use crate::output::SchedulerOutput;
use crate::storage::{FixedList, Storage};

use super::Scheduler;

impl<K: KvBackend, P: PeftBackend, const N: usize, const T: usize, S: Storage>
    Scheduler<K, P, N, T, S>
{
    /// Fills `delta` with what changed in the batch (the context, generation and encoder lists)
    /// between the previous call and the last pass's output `out` ([`crate::delta`]): the requests
    /// that entered, those that left, those whose entry changed. O(the two batches); O(1) when every
    /// pass since the previous call was incremental. Refused ([`Error::StaleOutput`], nothing changes)
    /// for an output that is not the last pass's.
    pub fn take_delta(
        &mut self,
        out: &SchedulerOutput<N, S>,
        delta: &mut BatchDelta<N, S>,
    ) -> Result<(), Error> {
        if out.pass() == 0 || out.pass() != self.passes {
            return Err(Error::StaleOutput);
        }
        delta.clear();
        delta.pass = out.pass();
        let kept = self.delta_pass != 0 && self.delta_pass >= self.last_full;
        self.delta_pass = self.passes;
        if kept {
            return Ok(());
        }
        let seen = &mut *self.seen;
        let now = out.context().iter().map(|c| (c.listed, CONTEXT));
        let now = now
            .chain(out.generation().iter().map(|&l| (l, GENERATION)))
            .chain(out.encoder().iter().map(|&l| (l, ENCODER)));
        for (l, list) in now.clone() {
            let s = &mut seen[usize::from(l.slot())];
            if s.list == 0 || s.version != l.version() {
                delta::push(&mut delta.entered, l);
            } else if s.list != list || list == CONTEXT {
                delta::push(&mut delta.changed, l);
            }
            *s = Seen {
                version: l.version(),
                list: list | NOW,
            };
        }
        for &l in self.shown.iter() {
            let s = &mut seen[usize::from(l.slot())];
            if s.list & NOW == 0 || s.version != l.version() {
                delta::push(&mut delta.left, l);
            }
            if s.list & NOW == 0 {
                *s = Seen::NOWHERE;
            }
        }
        self.shown.clear();
        for (l, _) in now {
            seen[usize::from(l.slot())].list &= !NOW;
            assert!(self.shown.push(l).is_ok(), "one batch entry per slot");
        }
        Ok(())
    }
}
