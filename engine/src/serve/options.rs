//! What a request may carry beyond its prompt, length, adapter and sampler: a cache salt (its KV is
//! shared only with requests of the same salt, as vLLM's `cache_salt`) and a [`Guide`] (structured
//! output: a constraint that masks the tokens it does not allow before each draw). And what the
//! engine reports back beyond the tokens: their log probabilities and the prompt positions found in
//! the prefix cache.

use super::{Engine, Live, RequestSpec};
use crate::error::Result;
use crate::sample::Logprob;
use crate::Sampler;
use kvsched_core::{Phase, TaskId};

/// A constraint on what a request may generate (structured output), asked before each draw and
/// told each token drawn. Built on any thread; the engine's thread owns it once submitted.
pub trait Guide: Send {
    /// Sets the logit of every token the constraint does not allow next to negative infinity.
    /// `Err`: the constraint failed; the request ends (`Finish::Stop`).
    fn mask(&mut self, logits: &mut [f32]) -> std::result::Result<(), GuideError>;
    /// Records the token drawn (one the mask allowed).
    fn commit(&mut self, token: u32) -> std::result::Result<(), GuideError>;
}

/// Why a [`Guide`] failed: its grammar engine's message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuideError(pub String);

impl std::fmt::Display for GuideError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the output constraint failed: {}", self.0)
    }
}

impl std::error::Error for GuideError {}

/// What a request carries besides its prompt, length, adapter and sampler.
#[derive(Default)]
pub struct SubmitOptions {
    /// Its KV is reused from and offered to the prefix cache only among requests of the same salt
    /// (0: the shared one).
    pub cache_salt: u64,
    /// Its output constraint.
    pub guide: Option<Box<dyn Guide>>,
    /// Its priority under `Admission::Priority` (the lower, the sooner; 0 by default).
    pub priority: u8,
    /// Its service class (`Config::shares`; 0 by default).
    pub class: u8,
}

impl std::fmt::Debug for SubmitOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SubmitOptions")
            .field("cache_salt", &self.cache_salt)
            .field("guide", &self.guide.is_some())
            .field("priority", &self.priority)
            .field("class", &self.class)
            .finish()
    }
}

/// Per-request state the options bring.
#[derive(Default)]
pub(super) struct Extras {
    pub(super) guide: Option<Box<dyn Guide>>,
    /// Each generated token's log probability (when its sampler reports them).
    pub(super) logprobs: Vec<Logprob>,
    /// Prompt positions its first chunk found in the prefix cache.
    pub(super) cached: usize,
    /// Its cache salt.
    pub(super) salt: u64,
    /// Its other samples, forked off it once its prompt is computed (`samples.rs`).
    pub(super) pending: Vec<super::samples::Pending>,
    /// Its part in a beam search (`beams.rs`).
    pub(super) beam: Option<super::beams::Beam>,
}

impl std::fmt::Debug for Extras {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Extras")
            .field("guide", &self.guide.is_some())
            .field("logprobs", &self.logprobs.len())
            .field("cached", &self.cached)
            .field("salt", &self.salt)
            .field("pending", &self.pending.len())
            .field("beam", &self.beam)
            .finish()
    }
}

impl Engine<'_> {
    /// [`Engine::submit`] with `options`: a cache salt, a guide.
    pub fn submit_with(
        &mut self,
        prompt: &[u32],
        max_new_tokens: usize,
        adapter: Option<u64>,
        sampler: Sampler,
        options: SubmitOptions,
    ) -> Result<u64> {
        self.check_request(prompt, max_new_tokens, adapter)?;
        let mut spec = RequestSpec::new(self.next_id, Phase::ContextInit, prompt.len() as u32);
        spec.max_new_tokens = max_new_tokens as u32;
        spec.lora = adapter.map(TaskId);
        spec.priority = options.priority;
        spec.class = options.class;
        let id = self.enqueue_salted(
            spec,
            prompt.to_vec(),
            (max_new_tokens, adapter, sampler),
            options.cache_salt,
        )?;
        if let Some(live) = self.live_mut(id) {
            live.extras.guide = options.guide;
            live.extras.salt = options.cache_salt;
        }
        Ok(id)
    }

    /// Sets request `id`'s priority (under `Admission::Priority`, the lower the sooner; the
    /// scheduler moves it among the others); the samples and beams forked off it later take it.
    /// `false` for an unknown or finished id.
    pub fn set_priority(&mut self, id: u64, priority: u8) -> Result<bool> {
        let Some(h) = self.live_ref(id).map(|l| l.handle) else {
            return Ok(false);
        };
        self.sched.update(h, |s| s.priority = priority)?;
        Ok(true)
    }

    /// Sets request `id`'s service class (`Config::shares`) while it waits new (the scheduler keeps
    /// a running request's); the samples and beams forked off it later take it. `false` for an
    /// unknown or finished id; refused for a class past the last.
    pub fn set_service_class(&mut self, id: u64, class: u8) -> Result<bool> {
        let Some(h) = self.live_ref(id).map(|l| l.handle) else {
            return Ok(false);
        };
        self.sched.update(h, |s| s.class = class)?;
        Ok(true)
    }

    /// The log probabilities of the tokens request `id` generated so far (with a sampler that
    /// reports them); `None` once it finished, or for an unknown id.
    pub fn logprobs(&self, id: u64) -> Option<&[Logprob]> {
        self.live_ref(id).map(|l| &l.extras.logprobs[..])
    }

    /// Prompt positions request `id`'s first chunk found in the prefix cache (0 before it ran).
    pub fn cached_tokens(&self, id: u64) -> Option<usize> {
        self.live_ref(id).map(|l| l.extras.cached)
    }

    pub(super) fn live_ref(&self, id: u64) -> Option<&Live> {
        self.live.iter().flatten().find(|l| l.id == id)
    }

    pub(super) fn live_mut(&mut self, id: u64) -> Option<&mut Live> {
        self.live.iter_mut().flatten().find(|l| l.id == id)
    }
}

impl Live {
    /// The next token from `row`: the sampler's rules, then the guide's mask, then the draw; the
    /// token's log probability kept, the guide told. `None`: the guide failed (the request ends).
    pub(super) fn draw(&mut self, row: &[f32], model_stops: &[u32]) -> Option<u32> {
        let mut adjusted = self
            .sampler
            .adjust(row, &self.tokens, self.prompt, model_stops);
        if let Some(g) = self.extras.guide.as_mut() {
            g.mask(adjusted.to_mut()).ok()?;
        }
        let token = self.sampler.sample(&adjusted);
        if let Some(lp) = self.sampler.logprob(row, token) {
            self.extras.logprobs.push(lp);
        }
        if let Some(g) = self.extras.guide.as_mut() {
            g.commit(token).ok()?;
        }
        Some(token)
    }
}
