//! A generation request's way in: refused at once when shutting down or full (before its body is
//! read), its body read within the size limit, then parsed, tokenized and checked on a blocking
//! thread (never on the thread that serves every stream), queued, and answered.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::Request;
use axum::http::header;
use axum::http::HeaderValue;
use axum::response::{IntoResponse, Response};
use kvsched_engine::{BeamSearch, Guide, Penalties, Sample, Sampler};

use crate::api::{self, Endpoint, Prompt};
use crate::choice::Meta;
use crate::error::ApiError;
use crate::metrics::{Class, Refusal};
use crate::output::{beams, stream, whole, Generation};
use crate::request_id::RequestId;
use crate::routes::AppState;
use crate::worker::{Job, Mode, Refused};

/// Tokens a completion generates when its request does not say (the OpenAI API's default).
const COMPLETION_DEFAULT_TOKENS: usize = 16;

/// vLLM's `priority` (-128 to 127) as the scheduler's (0 to 255, the lower first).
fn priority_of(p: i64) -> u8 {
    u8::try_from(p + 128).unwrap_or(u8::MAX)
}

/// A request read and checked: ready for the engine.
struct Checked {
    request: api::Request,
    adapter: Option<crate::adapters::Held>,
    prompt: Vec<u32>,
    max_new: usize,
    /// Its structured-output constraint, compiled: one per sample.
    guides: Vec<Option<Box<dyn Guide>>>,
}

/// Answers a generation request to `endpoint`; a refusal is counted by its reason.
pub(crate) async fn respond(
    s: Arc<AppState>,
    endpoint: Endpoint,
    id: RequestId,
    request: Request,
) -> Response {
    match generate(&s, endpoint, id, request).await {
        Ok(r) => r,
        Err(e) => {
            s.metrics.refused(Refusal::of(e.status));
            e.into_response()
        }
    }
}

async fn generate(
    s: &Arc<AppState>,
    endpoint: Endpoint,
    id: RequestId,
    request: Request,
) -> Result<Response, ApiError> {
    if s.draining.load(Ordering::SeqCst) {
        return Err(ApiError::shutting_down());
    }
    let arrived = Instant::now();
    let body = read_body(request, s.max_body_bytes).await?;
    let ticket = s.worker.admit().map_err(refused)?;
    let state = Arc::clone(s);
    let checked = tokio::task::spawn_blocking(move || state.check(endpoint, &body))
        .await
        .map_err(|e| ApiError::engine(format!("checking the request failed: {e}")))??;
    let n = s.next.fetch_add(1, Ordering::SeqCst);
    let r = checked.request;
    let prompt = checked.prompt.len();
    // A sample takes a place of its own: the first was taken before the body was read.
    let mut tickets = vec![ticket];
    for _ in 1..r.best_of {
        tickets.push(s.worker.admit().map_err(refused)?);
    }
    let mut samples = Vec::with_capacity(r.best_of);
    let mut receivers = Vec::with_capacity(r.best_of);
    for (i, (guide, ticket)) in checked.guides.into_iter().zip(tickets).enumerate() {
        let (events, rx) = tokio::sync::mpsc::unbounded_channel();
        let sampler = sampler(&r, n, i);
        samples.push((Sample { sampler, guide }, events, ticket));
        receivers.push(rx);
    }
    s.worker
        .submit(Job {
            prompt: checked.prompt,
            max_new: checked.max_new,
            adapter: checked.adapter.as_ref().map(|h| h.id),
            hold: checked.adapter,
            cache_salt: r.cache_salt.as_deref().map_or(0, crate::job::salt),
            priority: priority_of(r.priority),
            class: r.service_class,
            samples,
            mode: match r.beam_search {
                Some(length_penalty) => Mode::Beams(BeamSearch {
                    width: r.n,
                    length_penalty,
                    ignore_eos: r.sampling.ignore_eos,
                    priority: priority_of(r.priority),
                    class: r.service_class,
                }),
                None => Mode::Samples,
            },
        })
        .map_err(refused)?;
    let stops = (r.stop.clone(), r.sampling.stop_token_ids.clone());
    // A beam search answers on its first channel only.
    let channels = if r.beam_search.is_some() {
        1
    } else {
        r.best_of
    };
    let gens: Vec<Generation> = receivers
        .into_iter()
        .take(channels)
        .map(|rx| {
            let stops = stops.clone();
            let class = Class {
                service: r.service_class,
                priority: r.priority as i8,
            };
            let limits = (prompt, checked.max_new);
            Generation::new(Arc::clone(s), rx, stops, limits, (arrived, class))
        })
        .collect();
    let kind = match endpoint {
        Endpoint::Chat => "chatcmpl",
        Endpoint::Completions => "cmpl",
    };
    let meta = Meta {
        id: format!("{kind}-{}", id.0),
        created: unix_now(),
        model: r.model.clone(),
        endpoint,
        include_usage: r.include_usage,
        continuous_usage: r.continuous_usage,
        logprobs: r.logprobs.is_some(),
    };
    let mut response = if r.beam_search.is_some() {
        let gen = gens
            .into_iter()
            .next()
            .ok_or_else(|| ApiError::engine("no sample"))?;
        beams(gen, &meta).await?
    } else if r.stream {
        stream(gens, meta)
    } else {
        whole(gens, &meta, r.n).await?
    };
    if !r.ignored.is_empty() {
        let names = r.ignored.join(", ");
        eprintln!("kvsched serve: request {}: ignored fields: {names}", id.0);
        if let Ok(v) = HeaderValue::from_str(&names) {
            response.headers_mut().insert(IGNORED_HEADER, v);
        }
    }
    Ok(response)
}

/// The response header that names the request's ignored fields.
pub const IGNORED_HEADER: &str = "x-kvsched-ignored-fields";

fn refused(e: Refused) -> ApiError {
    match e {
        Refused::Full(slots, depth) => ApiError::overloaded(slots, depth),
        Refused::Gone => ApiError::shutting_down(),
    }
}

/// The body, refused (413) past `limit` bytes: by its declared length before a byte is read, or
/// as it arrives.
pub(crate) async fn read_body(request: Request, limit: usize) -> Result<Bytes, ApiError> {
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(ApiError::too_large(limit));
    }
    axum::body::to_bytes(request.into_body(), limit)
        .await
        .map_err(|_| ApiError::too_large(limit))
}

impl AppState {
    /// Parses, tokenizes and checks a body (on a blocking thread: a long prompt takes a while).
    fn check(&self, endpoint: Endpoint, body: &[u8]) -> Result<Checked, ApiError> {
        let request = api::parse(endpoint, body)?;
        let adapter = self.adapter_of(&request.model)?;
        let prompt = self.tokens(&request.prompt)?;
        let max_new = self.max_new(&request, prompt.len())?;
        self.in_vocabulary(&request.sampling)?;
        self.within_slots(&request)?;
        self.priority_allowed(&request)?;
        self.class_allowed(&request)?;
        let guides = (0..request.best_of)
            .map(|_| match &request.format {
                Some(f) => self.guides.guide(self.model.tokenizer(), f).map(Some),
                None => Ok(None),
            })
            .collect::<Result<_, _>>()?;
        Ok(Checked {
            request,
            adapter,
            prompt,
            max_new,
            guides,
        })
    }

    /// Refuses a priority other than 0 unless the server schedules by priority (as vLLM does).
    fn priority_allowed(&self, r: &api::Request) -> Result<(), ApiError> {
        if r.priority != 0 && !self.priority_scheduling {
            return Err(ApiError::invalid(
                "priority",
                "invalid_value",
                format!(
                    "Got priority {} but priority scheduling is not enabled (--scheduling-policy priority).",
                    r.priority
                ),
            ));
        }
        Ok(())
    }

    /// Refuses a service class other than 0 unless the server has shares (`--class-share`): a class
    /// nothing is promised to would be a silent no-op.
    fn class_allowed(&self, r: &api::Request) -> Result<(), ApiError> {
        if r.service_class != 0 && !self.service_classes {
            return Err(ApiError::invalid(
                "service_class",
                "invalid_value",
                format!(
                    "Got service_class {} but no class has a share (--class-share).",
                    r.service_class
                ),
            ));
        }
        Ok(())
    }

    /// Refuses more samples than the engine runs at once (they could never all be admitted).
    fn within_slots(&self, r: &api::Request) -> Result<(), ApiError> {
        let slots = self.worker.slots();
        if r.best_of > slots {
            let param = if r.best_of > r.n { "best_of" } else { "n" };
            return Err(ApiError::invalid(
                param,
                "invalid_value",
                format!("`{param}` = {} is more than the {slots} requests this server runs at once (--max-num-seqs).", r.best_of),
            ));
        }
        Ok(())
    }

    /// Refuses a token id outside the vocabulary in `stop_token_ids` or `logit_bias`.
    fn in_vocabulary(&self, s: &api::Sampling) -> Result<(), ApiError> {
        let vocab = self.model.tokenizer().vocab_size();
        let biased = s.logit_bias.iter().map(|&(t, _)| ("logit_bias", t));
        let stops = s.stop_token_ids.iter().map(|&t| ("stop_token_ids", t));
        match stops.chain(biased).find(|&(_, t)| t as usize >= vocab) {
            Some((param, t)) => Err(ApiError::invalid(
                param,
                "invalid_value",
                format!("Token id {t} is outside the vocabulary of {vocab}."),
            )),
            None => Ok(()),
        }
    }

    /// A request's prompt tokens. A text too long to fit whatever it tokenizes to is refused by
    /// its length before the tokenizer runs.
    fn tokens(&self, prompt: &Prompt) -> Result<Vec<u32>, ApiError> {
        let tok = self.model.tokenizer();
        let (bytes, param) = match prompt {
            Prompt::Text(t) => (t.len(), "prompt"),
            Prompt::Tokens(_) => (0, "prompt"),
            Prompt::Chat(m) => (m.iter().map(|m| m.content.len()).sum(), "messages"),
        };
        if bytes > self.longest_text() {
            return Err(too_long(param, self.max_model_len, None));
        }
        if matches!(prompt, Prompt::Chat(_)) && tok.chat_template().is_none() {
            return Err(ApiError::invalid(
                "messages",
                "no_chat_template",
                "This model has no chat template (its file has no tokenizer.chat_template), so chat is \
                 refused: start the server with --chat-template FILE, or send the text to /v1/completions.",
            ));
        }
        let tokens = match prompt {
            Prompt::Text(t) => tok.encode(t),
            Prompt::Tokens(t) => Ok(t.clone()),
            Prompt::Chat(m) => tok.encode_chat(m, true),
        };
        let tokens =
            tokens.map_err(|e| ApiError::invalid(param, "invalid_value", e.to_string()))?;
        let vocab = tok.vocab_size();
        if let Some(t) = tokens.iter().find(|&&t| t as usize >= vocab) {
            return Err(ApiError::invalid(
                param,
                "invalid_value",
                format!("Token id {t} is outside the vocabulary of {vocab}."),
            ));
        }
        if tokens.is_empty() {
            return Err(ApiError::invalid(
                param,
                "invalid_value",
                "The prompt is empty.",
            ));
        }
        Ok(tokens)
    }

    /// The most bytes of text that could tokenize to fewer than `max_model_len` tokens: each token
    /// stands for at most `longest_token` bytes; four times that, for normalizers that shorten.
    fn longest_text(&self) -> usize {
        self.max_model_len
            .saturating_mul(self.longest_token)
            .saturating_mul(4)
    }

    /// The tokens to generate: the request's `max_tokens`, or the endpoint's default, within
    /// the longest request.
    fn max_new(&self, r: &api::Request, prompt: usize) -> Result<usize, ApiError> {
        let limit = self.max_model_len;
        let param = match r.endpoint {
            Endpoint::Completions => "prompt",
            Endpoint::Chat => "messages",
        };
        if prompt >= limit {
            return Err(too_long(param, limit, Some(prompt)));
        }
        let room = limit - prompt;
        match r.max_tokens {
            Some(n) if n > room => Err(ApiError::invalid(
                "max_tokens",
                "context_length_exceeded",
                format!("This model's maximum context length is {limit} tokens; you requested {} ({prompt} in the prompt, {n} in the completion).", prompt.saturating_add(n)),
            )),
            Some(n) => Ok(n),
            None if r.endpoint == Endpoint::Completions => Ok(COMPLETION_DEFAULT_TOKENS.min(room)),
            None => Ok(room),
        }
    }
}

/// A prompt of `tokens` (unknown: too long to tokenize) that leaves no room within `limit`.
fn too_long(param: &str, limit: usize, tokens: Option<usize>) -> ApiError {
    let has = tokens.map_or_else(|| format!("more than {limit}"), |n| n.to_string());
    ApiError::invalid(
        param,
        "context_length_exceeded",
        format!("This model's maximum context length is {limit} tokens; the prompt has {has}, leaving no room for a completion."),
    )
}

/// Sample `i`'s sampler (of request `n`): with a seed, vLLM's child seed, the seed plus `i`. Its
/// log probabilities are kept when asked for, or to rank the samples (`best_of` > `n`).
fn sampler(r: &api::Request, n: u64, i: usize) -> Sampler {
    let s = &r.sampling;
    let mut sampler = if s.temperature == 0.0 {
        Sampler::greedy()
    } else {
        let seed = s.seed.map_or_else(
            || crate::job::fresh_seed(n.wrapping_mul(1 << 16).wrapping_add(i as u64)),
            |seed| seed.wrapping_add(i as u64),
        );
        Sampler::seeded(seed, s.temperature)
            .with_top_p(s.top_p)
            .with_top_k(s.top_k)
            .with_min_p(s.min_p)
    };
    let [presence, frequency, repetition] = s.penalties;
    sampler = sampler
        .with_penalties(Penalties {
            presence,
            frequency,
            repetition,
        })
        .with_logit_bias(s.logit_bias.clone())
        .with_min_tokens(s.min_tokens)
        .with_stop_tokens(s.stop_token_ids.clone());
    if let Some(top) = r.logprobs {
        sampler = sampler.with_logprobs(top);
    } else if r.best_of > r.n {
        sampler = sampler.with_logprobs(0);
    }
    if s.ignore_eos {
        sampler = sampler.ignoring_stop();
    }
    sampler
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
