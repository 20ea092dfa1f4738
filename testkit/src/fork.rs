//! The model's forks (issue 44; `Scheduler::fork`): a live request forked into a child that holds its
//! full blocks by reference and computes its last block. Where the model says a fork can be made
//! (a prefix cache on a plain pool, the parent active with its pages on the GPU; the table may be
//! full)
//! it must be made; a refusal changes nothing; the child is then a request like any other, and every
//! check after every operation (the pools' audits count each shared page's references) holds.

use kvsched_core::error::Error;
use kvsched_core::page_pool::{SeqState, HOST};
use kvsched_core::phase::Phase;
use kvsched_core::request::{Ownership, RequestSpec};

use crate::{fingerprint, pick, Fingerprint, Harness, Live, Violation};

impl Harness<'_> {
    /// Forks the live request `p` picks into a child of at most `out_len` output tokens.
    pub(crate) fn fork(&mut self, p: u8, out_len: u8) -> Result<(), Violation> {
        let Some(i) = pick(&self.live, p) else {
            return Ok(());
        };
        let parent = self.live[i].handle;
        let e = self.sched.get(parent).map_err(|e| format!("get: {e}"))?;
        let (ps, own) = (e.spec().clone(), e.ownership());
        let prompt = match ps.phase {
            Phase::ContextInit => ps.position,
            _ => ps.prompt,
        };
        let mut spec = RequestSpec::new(self.next_id, Phase::ContextInit, prompt.max(1));
        (spec.lora, spec.tenant, spec.priority) = (ps.lora, ps.tenant, ps.priority);
        spec.arrival = self.next_id * 10;
        spec.max_new_tokens = u32::from(out_len).clamp(1, ps.max_new_tokens.max(1));
        let expected = self.forkable(parent.index(), &ps, own, spec.prompt);
        let before = fingerprint(&self.sched);
        match self.sched.fork(parent, spec.clone()) {
            Ok(h) => {
                let at = self
                    .sched
                    .get(h)
                    .map_err(|e| format!("get: {e}"))?
                    .spec()
                    .position;
                let tpb = self.setup.tokens_per_block;
                if !expected || at == 0 || at % tpb != 0 || at >= spec.prompt {
                    return Err(
                        format!("fork of {} made (expected: {expected}) at {at}", ps.id.0).into(),
                    );
                }
                self.next_id += 1;
                self.stats.forked += 1;
                self.forks.insert(spec.id.0, ps.id.0);
                self.join(Live {
                    handle: h,
                    id: spec.id.0,
                    prompt: spec.prompt,
                    out_len: spec.max_new_tokens,
                    produced: 0,
                    steps: 0,
                    phase: Phase::ContextInit,
                    position: at,
                    inflight: false,
                    loading: false,
                    context_only: false,
                    step_start: at,
                    frontier: at,
                    priority: spec.priority,
                });
                Ok(())
            }
            Err(e) => {
                // The adapter cache may make room before it refuses a lease (an admission's refusal
                // does the same); the KV never changes.
                // The KV pools' state must not move in any case (their fault schedules may: a
                // lease's refused pin counts down one).
                let (peft, after) = (matches!(e, Error::Peft(_)), fingerprint(&self.sched));
                if pools_of(&after) != pools_of(&before) || (!peft && after != before) {
                    return Err(format!("a refused fork ({e}) changed the state").into());
                }
                match e {
                    Error::Peft(_) => {}
                    Error::CapacityExhausted {
                        what: "request table",
                        ..
                    } => {}
                    Error::Invalid(_) if !expected => {}
                    _ => return Err(format!("fork of {} refused: {e}", ps.id.0).into()),
                }
                self.stats.fork_refused += 1;
                Ok(())
            }
        }
    }

    /// The model's view: a fork of the request at `slot` into a child of `prompt` tokens can be made.
    fn forkable(&self, slot: u16, ps: &RequestSpec, own: Ownership, prompt: u32) -> bool {
        let s = &self.setup;
        let pool = self.sched.kv().target().inner.leader();
        let seq = pool.seq(slot);
        let blocks = (prompt.saturating_sub(1) / s.tokens_per_block).min(seq.blocks) as usize;
        let computed = match ps.phase {
            Phase::ContextInit => true,
            p => p.is_generation(),
        };
        s.prefix
            && s.draft.is_none()
            && !s.cross
            && !s.connector
            && s.windows.is_empty()
            && s.state.is_none()
            && own == Ownership::Active
            && computed
            && !ps.context_only
            && seq.state == SeqState::Active
            && prompt <= seq.capacity
            && blocks > 0
            && pool.table(slot)[..blocks].iter().all(|&e| e & HOST == 0)
    }
}

/// The KV pools' part of a fingerprint, their fault schedules left out.
fn pools_of(f: &Fingerprint) -> Vec<&Vec<u64>> {
    f.1.iter().map(|(groups, _)| groups).collect()
}
