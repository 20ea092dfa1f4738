//! Dynamo's [`PreprocessedRequest`] as an engine request: its prompt checked against the model's
//! vocabulary and context, its output length clamped to the context left, its sampling options
//! as the engine's [`Sampler`]. A refusal is an `InvalidArgument` that names the field.

use std::sync::Arc;

use dynamo_backend_common::{BackendError, DynamoError, ErrorType, PreprocessedRequest};
use kvsched_engine::{Penalties, Sampler};

/// What the model allows a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Prompt and output tokens at most (the engine's pages within the model's context).
    pub max_model_len: usize,
    /// Token ids below this are in the vocabulary.
    pub vocab: usize,
}

/// A request ready for the engine thread.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// The prompt's token ids.
    pub prompt: Vec<u32>,
    /// Tokens to generate at most: the request's `max_tokens` within the context left, else all of it.
    pub max_new: usize,
    /// How each token is drawn.
    pub sampler: Sampler,
    /// The cache salt's key (0: none).
    pub cache_salt: u64,
}

/// An `InvalidArgument` error saying `message`.
pub fn invalid(message: impl Into<String>) -> DynamoError {
    DynamoError::builder()
        .error_type(ErrorType::Backend(BackendError::InvalidArgument))
        .message(message)
        .build()
}

/// Checks `r` against `limits` and plans it; `seed` makes an unseeded sampling request's draw. The
/// prompt is taken from `r`, not copied.
pub fn plan(mut r: PreprocessedRequest, limits: Limits, seed: u64) -> Result<Plan, DynamoError> {
    check_prompt(&r.token_ids, limits)?;
    unsupported(&r)?;
    let left = limits.max_model_len - r.token_ids.len();
    let max_new = match r.stop_conditions.max_tokens {
        Some(0) => return Err(invalid("max_tokens must be at least 1")),
        Some(n) => (n as usize).min(left),
        None => left,
    };
    let cache_salt = r
        .routing
        .as_ref()
        .and_then(|h| h.cache_namespace.as_deref())
        .map_or(0, kvsched_server::job::salt);
    Ok(Plan {
        sampler: sampler(&r, limits, seed)?,
        prompt: Arc::unwrap_or_clone(std::mem::take(&mut r.token_ids)),
        max_new,
        cache_salt,
    })
}

/// A prompt the engine can run: not empty, in the vocabulary, leaving room for one token.
fn check_prompt(prompt: &[u32], limits: Limits) -> Result<(), DynamoError> {
    if prompt.is_empty() {
        return Err(invalid("token_ids: the prompt is empty"));
    }
    if let Some(&t) = prompt.iter().find(|&&t| t as usize >= limits.vocab) {
        return Err(invalid(format!(
            "token_ids: token {t} is outside the vocabulary of {} tokens",
            limits.vocab
        )));
    }
    if prompt.len() >= limits.max_model_len {
        return Err(invalid(format!(
            "token_ids: the prompt's {} tokens leave no room in the model's {} (max_model_len)",
            prompt.len(),
            limits.max_model_len
        )));
    }
    Ok(())
}

/// Refuses what this worker does not serve (rather than serving it otherwise than asked).
fn unsupported(r: &PreprocessedRequest) -> Result<(), DynamoError> {
    let s = &r.sampling_options;
    if s.n.is_some_and(|n| n > 1) || s.best_of.is_some_and(|n| n > 1) {
        return Err(invalid(
            "n / best_of: one sample per request (send n requests; Dynamo's frontend fans out)",
        ));
    }
    if s.use_beam_search == Some(true) {
        return Err(invalid("use_beam_search: not served by this worker"));
    }
    if s.guided_decoding.is_some() {
        return Err(invalid("guided_decoding: not served by this worker"));
    }
    if r.routing.as_ref().is_some_and(|h| h.lora_name.is_some()) {
        return Err(invalid(
            "lora_name: this worker serves its base model only (adapters: kvsched serve)",
        ));
    }
    Ok(())
}

/// The engine's sampler for `r`: greedy at temperature 0 (or none), else a seeded draw with the
/// request's top-p, top-k and min-p; penalties, stop tokens and `ignore_eos` either way.
fn sampler(r: &PreprocessedRequest, limits: Limits, seed: u64) -> Result<Sampler, DynamoError> {
    let s = &r.sampling_options;
    let stop = &r.stop_conditions;
    let temperature = s.temperature.unwrap_or(0.0);
    if !(temperature.is_finite() && temperature >= 0.0) {
        return Err(invalid("temperature: must be a number at least 0"));
    }
    let mut sampler = if temperature == 0.0 {
        Sampler::greedy()
    } else {
        let seed = s.seed.map_or(seed, |v| v as u64);
        Sampler::seeded(seed, temperature)
            .with_top_p(s.top_p.unwrap_or(1.0))
            .with_top_k(s.top_k.map_or(0, |k| usize::try_from(k).unwrap_or(0)))
            .with_min_p(s.min_p.unwrap_or(0.0))
    };
    sampler = sampler.with_penalties(Penalties {
        presence: s.presence_penalty.unwrap_or(0.0),
        frequency: s.frequency_penalty.unwrap_or(0.0),
        repetition: s.repetition_penalty.unwrap_or(1.0),
    });
    let stops = stop_tokens(r);
    if let Some(&t) = stops.iter().find(|&&t| t as usize >= limits.vocab) {
        return Err(invalid(format!(
            "stop_token_ids: token {t} is outside the vocabulary"
        )));
    }
    sampler = sampler
        .with_stop_tokens(stops)
        .with_min_tokens(stop.min_tokens.unwrap_or(0) as usize);
    if stop.ignore_eos == Some(true) {
        sampler = sampler.ignoring_stop();
    }
    Ok(sampler)
}

/// Every token that ends the request beside the model's own: the request's stop tokens (hidden and
/// visible) and, unless it ignores EOS, the EOS tokens the frontend read from the model folder.
fn stop_tokens(r: &PreprocessedRequest) -> Vec<u32> {
    let s = &r.stop_conditions;
    let mut all: Vec<u32> = [
        &s.stop_token_ids,
        &s.stop_token_ids_hidden,
        &s.stop_token_ids_visible,
    ]
    .into_iter()
    .flatten()
    .flatten()
    .copied()
    .collect();
    if s.ignore_eos != Some(true) {
        all.extend(&r.eos_token_ids);
    }
    all.sort_unstable();
    all.dedup();
    all
}
