//! Parallel sampling (issue 44): several samples of one prompt (OpenAI's `n`), the prompt computed
//! once. The first sample is an ordinary request; the others wait on it and, once its prompt is
//! computed, are forked off it ([`kvsched_core::scheduler::Scheduler::fork`]): each child holds the
//! prompt's full pages by reference, computes its last block (and so its own first token's logits)
//! and from then on is a request of its own. Where the scheduler cannot fork (no prefix cache, KV
//! groups), each sample is submitted as a request of its own; where it has no room yet, the fork is
//! tried again after the next step.

use super::{Engine, Live};
use crate::error::{EngineError, Refusal, Result};
use crate::{Guide, Sampler};
use kvsched_core::{Error, Phase, RequestSpec, TaskId};

/// One sample of a request: how it draws its tokens, and its output constraint.
pub struct Sample {
    /// Its sampler (OpenAI's seeds: the request's seed plus the sample's index, as vLLM derives
    /// them, is the caller's to set).
    pub sampler: Sampler,
    /// Its own guide (a guide holds the state of one output).
    pub guide: Option<Box<dyn Guide>>,
}

impl std::fmt::Debug for Sample {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sample")
            .field("sampler", &self.sampler)
            .field("guide", &self.guide.is_some())
            .finish()
    }
}

/// A sample waiting for its first sample's prompt: its reserved id and how it draws.
#[derive(Debug)]
pub(super) struct Pending {
    id: u64,
    sample: Sample,
}

/// A sample whose first sample left (finished) or could not share its pages while the scheduler's
/// table was full: it waits for room as a request of its own, its prompt and length its first's.
#[derive(Debug)]
pub(super) struct Detached {
    pending: Pending,
    tokens: Vec<u32>,
    max_new: usize,
    adapter: Option<u64>,
    salt: u64,
    /// Its first sample's priority and service class.
    rank: (u8, u8),
}

/// The samples waiting for room, detached from their first sample.
#[derive(Debug, Default)]
pub(super) struct Waiting(Vec<Detached>);

impl Waiting {
    /// None waits.
    pub(super) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl Engine<'_> {
    /// Parallel sampling: one request per sample of `prompt` (each up to `max_new_tokens` tokens,
    /// on `adapter`, with cache salt `salt`), the prompt computed once where the scheduler can fork
    /// (a prefix cache on one pool). Returns their ids, in sample order; each finishes with a
    /// [`super::Completion`] of its own. Cancelling the first before its samples are forked leaves
    /// them to run alone (cancel each by its id). Refused as [`Engine::submit`] (and for no sample),
    /// nothing queued.
    pub fn submit_samples(
        &mut self,
        prompt: &[u32],
        max_new_tokens: usize,
        adapter: Option<u64>,
        samples: Vec<Sample>,
        salt: u64,
    ) -> Result<Vec<u64>> {
        let mut samples = samples.into_iter();
        let first = samples.next().ok_or(Refusal::NoSamples)?;
        let options = super::SubmitOptions {
            cache_salt: salt,
            guide: first.guide,
            priority: 0,
            class: 0,
        };
        let id = self.submit_with(prompt, max_new_tokens, adapter, first.sampler, options)?;
        let mut ids = vec![id];
        if !self.forks() {
            for s in samples {
                let options = super::SubmitOptions {
                    cache_salt: salt,
                    guide: s.guide,
                    priority: 0,
                    class: 0,
                };
                match self.submit_with(prompt, max_new_tokens, adapter, s.sampler, options) {
                    Ok(id) => ids.push(id),
                    Err(e) => {
                        for &id in &ids {
                            self.cancel(id)?;
                        }
                        return Err(e);
                    }
                }
            }
            return Ok(ids);
        }
        let pending: Vec<Pending> = samples
            .map(|sample| {
                let id = self.next_id;
                self.next_id += 1;
                ids.push(id);
                Pending { id, sample }
            })
            .collect();
        if let Some(live) = self.live_mut(id) {
            live.extras.pending = pending;
        }
        Ok(ids)
    }

    /// Samples waiting for their first sample's prompt or for room, and beams a search will have
    /// beyond its requests now (not yet requests of the scheduler's: each takes a place when it is
    /// forked or submitted).
    pub fn waiting_samples(&self) -> usize {
        let pending: usize = self
            .live
            .iter()
            .flatten()
            .map(|l| l.extras.pending.len())
            .sum();
        pending + self.detached.0.len() + self.beams_to_come()
    }

    /// The scheduler forks: a prefix cache (its reference counts share the pages) on one pool.
    fn forks(&self) -> bool {
        self.cfg.prefix_cache && matches!(self.sched, super::backend::Sched::Full(_))
    }

    /// Forks the waiting samples of every request whose prompt is computed (after a step); the
    /// detached ones are submitted while there is room.
    pub(super) fn fork_samples(&mut self) -> Result<()> {
        for d in std::mem::take(&mut self.detached.0) {
            if let Some(d) = self.submit_alone(d)? {
                self.detached.0.push(d);
            }
        }
        for slot in 0..self.live.len() {
            self.fork_samples_of(slot)?;
        }
        Ok(())
    }

    /// A detached sample as a request of its own; `Some` back while the table is full.
    fn submit_alone(&mut self, d: Detached) -> Result<Option<Detached>> {
        let mut spec = RequestSpec::new(d.pending.id, Phase::ContextInit, d.tokens.len() as u32);
        spec.max_new_tokens = d.max_new as u32;
        spec.lora = d.adapter.map(TaskId);
        (spec.priority, spec.class) = d.rank;
        let how = (d.max_new, d.adapter, d.pending.sample.sampler.clone());
        match self.enqueue_as(d.pending.id, spec, d.tokens.clone(), how, d.salt) {
            Ok(id) => {
                if let Some(live) = self.live_mut(id) {
                    (live.extras.guide, live.extras.salt) = (d.pending.sample.guide, d.salt);
                }
                Ok(None)
            }
            Err(EngineError::Refused(Refusal::Scheduler(Error::CapacityExhausted { .. }))) => {
                Ok(Some(d))
            }
            Err(e) => Err(e),
        }
    }

    /// The priority and service class of the request behind `h`: its samples take them.
    fn rank_of(&self, h: kvsched_core::Handle) -> (u8, u8) {
        self.sched
            .get(h)
            .map_or((0, 0), |e| (e.spec().priority, e.spec().class))
    }

    /// The samples still waiting on the request in `slot`, detached (it is leaving).
    pub(super) fn detach_samples_of(&mut self, slot: usize) {
        let handle = self.live[slot].as_ref().map(|p| p.handle);
        let rank = handle.map_or((0, 0), |h| self.rank_of(h));
        let Some(parent) = self.live[slot].as_mut() else {
            return;
        };
        let tokens = parent.tokens[..parent.prompt].to_vec();
        let (max_new, adapter, salt) = (parent.max_new, parent.adapter, parent.extras.salt);
        for pending in std::mem::take(&mut parent.extras.pending) {
            let tokens = tokens.clone();
            let d = Detached {
                pending,
                tokens,
                max_new,
                adapter,
                salt,
                rank,
            };
            self.detached.0.push(d);
        }
    }

    /// Forks the waiting samples of the request in `slot`, if its prompt is computed: each a child
    /// on its pages, or, where the scheduler cannot share them, a request of its own; one the table
    /// has no room for waits for the next step.
    pub(super) fn fork_samples_of(&mut self, slot: usize) -> Result<()> {
        let Some(parent) = self.live[slot].as_mut() else {
            return Ok(());
        };
        if parent.extras.pending.is_empty() || parent.computed < parent.prompt {
            return Ok(());
        }
        let waiting = std::mem::take(&mut parent.extras.pending);
        let mut left = Vec::new();
        for p in waiting {
            if let Some(p) = self.fork_one(slot, p)? {
                left.push(p);
            }
        }
        if let Some(parent) = self.live[slot].as_mut() {
            parent.extras.pending = left;
        }
        Ok(())
    }

    /// One waiting sample forked off the request in `slot` (else submitted alone, or detached
    /// while the table is full); `Some` back when the table is full for the fork.
    fn fork_one(&mut self, slot: usize, p: Pending) -> Result<Option<Pending>> {
        let Some(parent) = self.live[slot].as_ref() else {
            return Ok(None);
        };
        let (handle, prompt) = (parent.handle, parent.prompt);
        let tokens = parent.tokens[..prompt].to_vec();
        let (max_new, adapter) = (parent.max_new, parent.adapter);
        let (salt, cached, keys) = (
            parent.extras.salt,
            parent.extras.cached,
            parent.keys.clone(),
        );
        let rank = self.rank_of(handle);
        let mut spec = RequestSpec::new(p.id, Phase::ContextInit, prompt as u32);
        spec.max_new_tokens = max_new as u32;
        spec.lora = adapter.map(TaskId);
        (spec.priority, spec.class) = rank;
        let h = match self.sched.fork(handle, spec) {
            Ok(h) => h,
            Err(Error::CapacityExhausted { .. }) => return Ok(Some(p)),
            Err(_) => {
                let d = Detached {
                    pending: p,
                    tokens,
                    max_new,
                    adapter,
                    salt,
                    rank,
                };
                if let Some(d) = self.submit_alone(d)? {
                    self.detached.0.push(d);
                }
                return Ok(None);
            }
        };
        let Sample { sampler, guide } = p.sample;
        let shared = self.sched.get(h)?.spec().position as usize;
        self.stats.forks += 1;
        self.stats.fork_shared_tokens += shared as u64;
        let mut live = Live::new(h, p.id, tokens, (max_new, adapter, sampler));
        live.computed = shared;
        live.keys = keys;
        (live.extras.guide, live.extras.salt, live.extras.cached) = (guide, salt, cached);
        self.live[usize::from(h.index())] = Some(live);
        Ok(None)
    }

    /// A waiting sample named by its id: it never started; cancelling it drops it.
    pub(super) fn cancel_waiting(&mut self, id: u64) -> bool {
        for live in self.live.iter_mut().flatten() {
            if let Some(i) = live.extras.pending.iter().position(|p| p.id == id) {
                live.extras.pending.remove(i);
                return true;
            }
        }
        let before = self.detached.0.len();
        self.detached.0.retain(|d| d.pending.id != id);
        self.detached.0.len() < before
    }
}
