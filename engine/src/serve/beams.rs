//! Beam search on forks (issue 44), as vLLM runs it (`use_beam_search`): each step every beam
//! offers its `2 × width` likeliest next tokens (the model's log probabilities, before any
//! penalty); a candidate ending in a stop token is a finished sequence, the others are ranked by
//! score (cumulative log probability over the sequence's length, prompt included, to the power of
//! the length penalty) and the best `width` are the next step's beams; after `max_new_tokens` steps
//! (or when no beam is left) the finished sequences and the beams left are ranked the same way and
//! the best `width` returned.
//!
//! A beam is a request of the engine's. When every beam of a search ran in a step, the selection
//! follows at once: a beam none of whose candidates is kept is removed; its first kept candidate
//! continues it (the token appended, decoded next step); each other kept candidate is a child
//! forked off it ([`kvsched_core::scheduler::Scheduler::fork`]), holding its full pages by
//! reference and computing its last block and the new token. When some beam did not run (the pass
//! suspended it, or had no room), the beams that ran are parked: their candidates and tokens are
//! kept, their requests removed (their committed blocks stay in the prefix cache), so a waiting
//! beam holds no page and the pass can always make progress; a kept candidate of a parked beam is
//! then a request of its own, its sequence its prompt (so is a fork the scheduler refuses).

use std::collections::BTreeMap;

use super::{Engine, Finish, Live, Row};
use crate::error::{EngineError, Refusal, Result};
use crate::step::Logits;
use crate::Sampler;
use kvsched_core::{Phase, RequestSpec, TaskId};

/// A beam search's parameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BeamSearch {
    /// Beams kept each step, and sequences returned.
    pub width: usize,
    /// The score's length exponent (vLLM's `length_penalty`, default 1).
    pub length_penalty: f64,
    /// Stop tokens end no sequence.
    pub ignore_eos: bool,
    /// Every beam's priority under `Admission::Priority` (the lower, the sooner).
    pub priority: u8,
    /// Every beam's service class (`Config::shares`).
    pub class: u8,
}

/// One sequence a beam search returns.
#[derive(Debug, Clone, PartialEq)]
pub struct BeamSequence {
    /// The tokens generated (a stop token that ended it left out).
    pub tokens: Vec<u32>,
    /// Its tokens' cumulative log probability.
    pub cum_logprob: f64,
    /// A stop token ended it, or `max_new_tokens`.
    pub finish: Finish,
}

/// A finished beam search: its id ([`Engine::submit_beam_search`]'s) and its best sequences,
/// best first.
#[derive(Debug, Clone, PartialEq)]
pub struct BeamResult {
    /// The search's id.
    pub id: u64,
    /// Its prompt.
    pub prompt: Vec<u32>,
    /// At most `width` sequences, best first.
    pub sequences: Vec<BeamSequence>,
}

/// A beam: its request while it is one (none once parked), its tokens (prompt included), its
/// cumulative log probability and, after its step, its candidates (token, log probability),
/// likeliest first.
#[derive(Debug, Clone)]
struct Rec {
    id: Option<u64>,
    tokens: Vec<u32>,
    cum: f64,
    candidates: Option<Vec<(u32, f32)>>,
}

/// What marks a request as a beam: its search's id.
#[derive(Debug, Clone, Copy)]
pub(super) struct Beam {
    search: u64,
}

/// A search in progress.
#[derive(Debug)]
struct Search {
    params: BeamSearch,
    prompt: usize,
    max_new: usize,
    adapter: Option<u64>,
    salt: u64,
    steps: usize,
    /// Its beams, in rank order.
    beams: Vec<Rec>,
    /// Finished sequences: all tokens (prompt included), cumulative log probability.
    done: Vec<(Vec<u32>, f64)>,
}

/// The searches in progress and those finished, not yet taken.
#[derive(Debug, Default)]
pub(super) struct Book {
    searches: BTreeMap<u64, Search>,
    results: Vec<BeamResult>,
}

/// A candidate of a step: its beam's rank, the token, its sequence's cumulative log probability.
type Candidate = (usize, u32, f64);

/// vLLM's score of a sequence of `len` tokens (prompt included; a last stop token not counted).
fn score(cum: f64, len: usize, ends_in_stop: bool, length_penalty: f64) -> f64 {
    let len = len - usize::from(ends_in_stop);
    cum / (len as f64).powf(length_penalty)
}

impl Engine<'_> {
    /// Starts a beam search of `prompt` (up to `max_new_tokens` tokens, on `adapter`, cache salt
    /// `salt`); its [`BeamResult`] comes from [`Engine::take_beam_results`] once it ends. Refused as
    /// [`Engine::submit`], and for a width of 0 or more than the scheduler's requests.
    pub fn submit_beam_search(
        &mut self,
        prompt: &[u32],
        max_new_tokens: usize,
        adapter: Option<u64>,
        params: BeamSearch,
        salt: u64,
    ) -> Result<u64> {
        let room = self.cfg.scheduler.max_num_requests as usize;
        if params.width == 0 || params.width > room {
            return Err(Refusal::BeamWidth {
                width: params.width,
                room,
            }
            .into());
        }
        let sampler = Sampler::greedy().with_logprobs(2 * params.width);
        let options = super::SubmitOptions {
            cache_salt: salt,
            guide: None,
            priority: params.priority,
            class: params.class,
        };
        let id = self.submit_with(prompt, max_new_tokens, adapter, sampler, options)?;
        if let Some(live) = self.live_mut(id) {
            live.extras.beam = Some(Beam { search: id });
        }
        let first = Rec {
            id: Some(id),
            tokens: prompt.to_vec(),
            cum: 0.0,
            candidates: None,
        };
        let search = Search {
            params,
            prompt: prompt.len(),
            max_new: max_new_tokens,
            adapter,
            salt,
            steps: 0,
            beams: vec![first],
            done: Vec::new(),
        };
        self.beams.searches.insert(id, search);
        Ok(id)
    }

    /// Beams the searches in progress will have beyond their requests now (each search up to its
    /// width).
    pub(super) fn beams_to_come(&self) -> usize {
        let resident = |s: &Search| s.beams.iter().filter(|b| b.id.is_some()).count();
        self.beams
            .searches
            .values()
            .map(|s| s.params.width.saturating_sub(resident(s)))
            .sum()
    }

    /// A search is in progress (its beams may all be parked, none a request).
    pub(super) fn searching(&self) -> bool {
        !self.beams.searches.is_empty()
    }

    /// The beam searches that ended since the last call.
    pub fn take_beam_results(&mut self) -> Vec<BeamResult> {
        std::mem::take(&mut self.beams.results)
    }

    /// A beam's step (`take_tokens` for a beam's row): its candidates, its KV holding its last
    /// token.
    pub(super) fn beam_step(&mut self, i: usize, r: &Row, logits: &Logits) -> Result<()> {
        let live = self.live[usize::from(r.slot)]
            .as_mut()
            .ok_or_else(|| EngineError::Batch(format!("slot {} is empty", r.slot)))?;
        let row = logits
            .row(i, 0)
            .ok_or_else(|| EngineError::Batch(format!("request {}: no logits", live.id)))?;
        let lp = live
            .sampler
            .logprob(row, crate::math::argmax(row))
            .ok_or_else(|| EngineError::Batch("a beam reports log probabilities".into()))?;
        live.computed = r.start + r.len;
        let (id, search) = (live.id, live.extras.beam.map(|b| b.search));
        let rec = search
            .and_then(|s| self.beams.searches.get_mut(&s))
            .and_then(|s| s.beams.iter_mut().find(|b| b.id == Some(id)));
        if let Some(rec) = rec {
            rec.candidates = Some(lp.top);
        }
        Ok(())
    }

    /// After a step: every search whose beams all offered their candidates selects; the others
    /// park the beams that did.
    pub(super) fn select_beams(&mut self) -> Result<()> {
        let ids: Vec<u64> = self.beams.searches.keys().copied().collect();
        for id in ids {
            let Some(search) = self.beams.searches.remove(&id) else {
                continue;
            };
            let mut search = search;
            self.submit_parked(id, &mut search)?;
            if search.beams.iter().all(|b| b.candidates.is_some()) {
                self.select(id, search)?;
            } else {
                let search = self.park(search)?;
                self.beams.searches.insert(id, search);
            }
        }
        Ok(())
    }

    /// The beams of search `id` that are neither requests nor have candidates (kept candidates of
    /// parked beams the table had no room for) become requests while there is room.
    fn submit_parked(&mut self, id: u64, search: &mut Search) -> Result<()> {
        for k in 0..search.beams.len() {
            let b = &search.beams[k];
            if b.id.is_none() && b.candidates.is_none() {
                let tokens = b.tokens.clone();
                search.beams[k].id = self.new_beam(id, search, None, &tokens)?;
            }
        }
        Ok(())
    }

    /// The beams of `search` that offered their candidates leave the engine (their requests
    /// removed); their tokens and candidates stay with the search.
    fn park(&mut self, mut search: Search) -> Result<Search> {
        for rec in &mut search.beams {
            if rec.candidates.is_some() {
                if let Some(id) = rec.id.take() {
                    self.drop_beam(id)?;
                    self.stats.beams_parked += 1;
                }
            }
        }
        Ok(search)
    }

    /// One step of search `id`: the candidates ranked, the beams continued, forked or removed.
    fn select(&mut self, id: u64, mut search: Search) -> Result<()> {
        let tok = self.model.tokenizer();
        let mut kept = Vec::new();
        for (rank, b) in search.beams.iter().enumerate() {
            for &(t, lp) in b.candidates.iter().flatten() {
                let c = b.cum + f64::from(lp);
                if tok.is_stop(t) && !search.params.ignore_eos {
                    let mut done = b.tokens.clone();
                    done.push(t);
                    search.done.push((done, c));
                } else {
                    kept.push((rank, t, c));
                }
            }
        }
        // Every candidate's sequence has one token more than its beam's, all of one length: the
        // score orders them as their cumulative log probability does. Stable, as vLLM's sort.
        kept.sort_by(|a, b| b.2.total_cmp(&a.2));
        kept.truncate(search.params.width);
        search.steps += 1;
        if search.steps >= search.max_new {
            // The last step: its kept candidates are the search's last beams, with no request.
            let last: Vec<Rec> = kept
                .iter()
                .map(|&(rank, t, cum)| {
                    let mut tokens = search.beams[rank].tokens.clone();
                    tokens.push(t);
                    Rec {
                        id: None,
                        tokens,
                        cum,
                        candidates: None,
                    }
                })
                .collect();
            for r in search.beams.iter().filter_map(|b| b.id) {
                self.drop_beam(r)?;
            }
            search.beams = last;
            return self.finish_search(id, search);
        }
        search.beams = self.continue_beams(id, &search, &kept)?;
        if search.beams.is_empty() {
            self.finish_search(id, search)
        } else {
            self.beams.searches.insert(id, search);
            Ok(())
        }
    }

    /// The kept candidates as the next beams, in rank order: a beam none of whose candidates is
    /// kept removed; its first kept one continues it; its others forked off it, before it changes
    /// (a parked beam's: requests of their own).
    fn continue_beams(&mut self, id: u64, search: &Search, kept: &[Candidate]) -> Result<Vec<Rec>> {
        let mut first = vec![None; search.beams.len()];
        for (k, c) in kept.iter().enumerate() {
            first[c.0].get_or_insert(k);
        }
        for (rank, b) in search.beams.iter().enumerate() {
            if let (None, Some(r)) = (first[rank], b.id) {
                self.drop_beam(r)?;
            }
        }
        let mut next = Vec::with_capacity(kept.len());
        for &(rank, token, cum) in kept {
            let b = &search.beams[rank];
            let mut tokens = b.tokens.clone();
            tokens.push(token);
            let rec = Rec {
                id: None,
                tokens,
                cum,
                candidates: None,
            };
            next.push(rec);
        }
        for (k, &(rank, _, _)) in kept.iter().enumerate() {
            let parent = search.beams[rank].id;
            if first[rank] != Some(k) || parent.is_none() {
                next[k].id = self.new_beam(id, search, parent, &next[k].tokens)?;
            }
        }
        for (k, &(rank, token, _)) in kept.iter().enumerate() {
            if let (true, Some(r)) = (first[rank] == Some(k), search.beams[rank].id) {
                self.extend_beam(r, token)?;
                next[k].id = Some(r);
            }
        }
        Ok(next)
    }

    /// Beam `id` continues with `token`: decoded next step.
    fn extend_beam(&mut self, id: u64, token: u32) -> Result<()> {
        let live = self
            .live_mut(id)
            .ok_or(EngineError::Batch(format!("beam {id} is gone")))?;
        live.tokens.push(token);
        Ok(())
    }

    /// A new beam of search `search_id`, its sequence `tokens`: forked off beam `parent` (its full
    /// pages shared; `tokens` are its and one more), else a request of its own. Returns its id;
    /// `None` while the table has no room (it stays parked, tried again after the next step).
    fn new_beam(
        &mut self,
        search_id: u64,
        search: &Search,
        parent: Option<u64>,
        tokens: &[u32],
    ) -> Result<Option<u64>> {
        let id = self.next_id;
        self.next_id += 1;
        let left = search.max_new - search.steps;
        let mut spec = RequestSpec::new(id, Phase::ContextInit, tokens.len() as u32 - 1);
        spec.max_new_tokens = left as u32;
        spec.lora = search.adapter.map(TaskId);
        spec.priority = search.params.priority;
        spec.class = search.params.class;
        let sampler = Sampler::greedy().with_logprobs(2 * search.params.width);
        let how = (search.max_new, search.adapter, sampler);
        let handle = parent
            .and_then(|p| self.live_ref(p))
            .map(|p| (p.handle, p.keys.clone()));
        let forked = match handle {
            Some((h, keys)) => self.sched.fork(h, spec.clone()).ok().map(|c| (c, keys)),
            None => None,
        };
        if let Some((h, keys)) = forked {
            let shared = self.sched.get(h)?.spec().position as usize;
            self.sched.update(h, |s| s.prompt += 1)?;
            self.stats.forks += 1;
            self.stats.fork_shared_tokens += shared as u64;
            let mut live = Live::new(h, id, tokens.to_vec(), how);
            (live.computed, live.keys) = (shared, keys);
            self.live[usize::from(h.index())] = Some(live);
        } else {
            spec.prompt += 1;
            match self.enqueue_as(id, spec, tokens.to_vec(), how, search.salt) {
                Ok(_) => {}
                Err(EngineError::Refused(Refusal::Scheduler(
                    kvsched_core::Error::CapacityExhausted { .. },
                ))) => return Ok(None),
                Err(e) => return Err(e),
            }
        }
        let live = self
            .live_mut(id)
            .ok_or(EngineError::Batch(format!("beam {id} is gone")))?;
        live.prompt = search.prompt;
        live.extras.beam = Some(Beam { search: search_id });
        Ok(Some(id))
    }

    /// Removes beam `id` (its search dropped or parked it, or ended).
    fn drop_beam(&mut self, id: u64) -> Result<()> {
        let slot = self
            .live
            .iter()
            .position(|l| l.as_ref().is_some_and(|l| l.id == id));
        if let Some(live) = slot.and_then(|s| self.live[s].take()) {
            self.sched.remove(live.handle)?;
        }
        Ok(())
    }

    /// Cancels search `id` (every beam of it); `false` when there is none.
    pub(super) fn cancel_search(&mut self, id: u64) -> Result<bool> {
        let Some(search) = self.beams.searches.remove(&id) else {
            return Ok(false);
        };
        for r in search.beams.iter().filter_map(|b| b.id) {
            self.drop_beam(r)?;
        }
        self.stats.cancelled += 1;
        Ok(true)
    }

    /// The search's sequences ranked; its beams removed; its result kept for the caller.
    fn finish_search(&mut self, id: u64, mut search: Search) -> Result<()> {
        for b in std::mem::take(&mut search.beams) {
            if let Some(r) = b.id {
                self.drop_beam(r)?;
            }
            search.done.push((b.tokens, b.cum));
        }
        let tok = self.model.tokenizer();
        let (lp, eos) = (search.params.length_penalty, !search.params.ignore_eos);
        let ends = |t: &[u32]| t.last().is_some_and(|&x| tok.is_stop(x));
        let stops = |t: &[u32]| eos && ends(t);
        // vLLM's score leaves a last stop token out of the length, ignore_eos or not.
        let key = |(t, c): &(Vec<u32>, f64)| score(*c, t.len(), ends(t), lp);
        search.done.sort_by(|a, b| key(b).total_cmp(&key(a)));
        search.done.truncate(search.params.width);
        let mut prompt = Vec::new();
        let sequences = search
            .done
            .into_iter()
            .map(|(mut t, cum)| {
                let stop = stops(&t);
                if stop {
                    t.pop();
                }
                let tokens = t.split_off(search.prompt);
                prompt = t;
                let finish = if stop { Finish::Stop } else { Finish::Length };
                BeamSequence {
                    tokens,
                    cum_logprob: cum,
                    finish,
                }
            })
            .collect();
        self.stats.finished += 1;
        self.beams.results.push(BeamResult {
            id,
            prompt,
            sequences,
        });
        Ok(())
    }
}
