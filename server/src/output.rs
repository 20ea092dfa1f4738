//! A generation's output: the engine's events turned into text (stop strings applied), its latencies
//! recorded, and written out as one JSON body or as server-sent events.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Instant;

use axum::body::{Body, Bytes};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use kvsched_engine::Logprob;
use serde_json::{json, Value};
use tokio::sync::mpsc::UnboundedReceiver;

use crate::api::Endpoint;
use crate::choice::{usage, Meta, Part};
use crate::error::ApiError;
use crate::metrics::{Class, Finished};
use crate::routes::{json_response, AppState};
use crate::text::TextStream;
use crate::worker::{End, Event};

/// A request in flight, as its handler sees it: the engine's events turned into text, and its
/// latencies recorded. Dropped before its end (the client went away), it closes its channel, so the
/// engine cancels the request, and counts as aborted.
pub(crate) struct Generation {
    state: Arc<AppState>,
    rx: UnboundedReceiver<Event>,
    text: TextStream,
    arrived: Instant,
    /// Its class in the per-class metrics.
    class: Class,
    scheduled: Option<Instant>,
    last: Option<Instant>,
    first: Option<Instant>,
    prompt: usize,
    max_new: usize,
    cached: usize,
    generated: usize,
    /// The request's own stop tokens (for `stop_reason`).
    stop_tokens: Vec<u32>,
    last_token: Option<u32>,
    /// Log probabilities of tokens whose text was not released yet.
    logprobs: Vec<Logprob>,
    ended: bool,
}

/// Text released by [`Generation::next`], its tokens' log probabilities, and the request's end
/// once it came.
pub(crate) struct Out {
    text: String,
    logprobs: Vec<Logprob>,
    end: Option<End>,
}

impl Generation {
    /// A request of `prompt` tokens (`max_new` to generate at most) of `class` that arrived at `arrived`, its
    /// events on `rx`, its text ended by any of `stop`, its own stop tokens `stop_tokens`.
    pub(crate) fn new(
        state: Arc<AppState>,
        rx: UnboundedReceiver<Event>,
        (stop, stop_tokens): (Vec<String>, Vec<u32>),
        (prompt, max_new): (usize, usize),
        (arrived, class): (Instant, Class),
    ) -> Self {
        Self {
            state,
            rx,
            text: TextStream::new(stop),
            arrived,
            class,
            scheduled: None,
            last: None,
            first: None,
            prompt,
            max_new,
            cached: 0,
            generated: 0,
            stop_tokens,
            last_token: None,
            logprobs: Vec::new(),
            ended: false,
        }
    }

    /// Waits for the next text or the end; `Err` with the engine's message if it failed the request.
    async fn next(&mut self) -> Result<Out, ApiError> {
        let state = Arc::clone(&self.state);
        let tok = state.model.tokenizer();
        loop {
            let (tokens, end) = match self.rx.recv().await {
                Some(Event::Scheduled(at, cached)) => {
                    (self.scheduled, self.cached) = (Some(at), cached);
                    continue;
                }
                Some(Event::Tokens(t, lps)) => {
                    self.logprobs.extend(lps);
                    (t, None)
                }
                Some(Event::Done(end)) => (Vec::new(), Some(end)),
                // Sent to beam searches only (`beams`).
                Some(Event::Beams(_)) => continue,
                Some(Event::Failed(why)) => {
                    self.ended = true;
                    return Err(ApiError::engine(why));
                }
                None => return Err(ApiError::engine("the engine dropped the request")),
            };
            if !tokens.is_empty() {
                self.timed(tokens.len());
                self.last_token = tokens.last().copied();
            }
            let piece = self
                .text
                .push(tok, &tokens, end.is_some())
                .map_err(|e| ApiError::engine(e.to_string()))?;
            let end = if piece.stopped {
                self.rx.close();
                Some(End::Stop)
            } else {
                end
            };
            if let Some(end) = end {
                self.finish(end);
            }
            if !piece.text.is_empty() || end.is_some() {
                return Ok(Out {
                    text: piece.text,
                    logprobs: std::mem::take(&mut self.logprobs),
                    end,
                });
            }
        }
    }

    fn timed(&mut self, tokens: usize) {
        let now = Instant::now();
        match self.last {
            None => {
                self.state
                    .metrics
                    .first_token(now - self.arrived, self.class);
                self.first = Some(now);
            }
            Some(last) => self.state.metrics.next_token(now - last, self.class),
        }
        self.last = Some(now);
        self.generated += tokens;
    }

    fn finish(&mut self, end: End) {
        self.ended = true;
        self.state.metrics.ended(&Finished {
            end,
            prompt: self.prompt,
            generated: self.generated,
            max_tokens: self.max_new,
            arrived: self.arrived,
            scheduled: self.scheduled,
            first: self.first,
            last: self.last,
            ended: Instant::now(),
            class: self.class,
        });
    }

    /// The usage of its prompt (counted once for all of a request's samples) with `generated`
    /// tokens.
    fn usage_with(&self, generated: usize) -> Value {
        usage(self.prompt, self.cached, generated)
    }

    /// What stopped the request: the stop string, or one of its own stop tokens; null for the
    /// model's stop token or a length.
    fn stop_reason(&self) -> Value {
        if let Some(s) = self.text.stop_hit() {
            return json!(s);
        }
        match self.last_token {
            Some(t) if self.stop_tokens.contains(&t) => json!(t),
            _ => Value::Null,
        }
    }
}

impl Drop for Generation {
    fn drop(&mut self) {
        if !self.ended {
            self.finish(End::Abort);
        }
    }
}

/// One sample's whole output: its text, its tokens' log probabilities, its end and stop reason.
struct Whole {
    text: String,
    logprobs: Vec<Logprob>,
    end: End,
    reason: Value,
    generated: usize,
}

impl Whole {
    /// Its cumulative log probability (the ranking of `best_of`).
    fn score(&self) -> f64 {
        self.logprobs.iter().map(|l| f64::from(l.logprob)).sum()
    }
}

/// A sample's output to its end.
async fn to_end(gen: &mut Generation) -> Result<Whole, ApiError> {
    let (mut text, mut logprobs) = (String::new(), Vec::new());
    loop {
        let out = gen.next().await?;
        text.push_str(&out.text);
        logprobs.extend(out.logprobs);
        if let Some(end) = out.end {
            let reason = gen.stop_reason();
            let generated = gen.generated;
            return Ok(Whole {
                text,
                logprobs,
                end,
                reason,
                generated,
            });
        }
    }
}

/// The whole completion in one body: every sample's output, the `n` with the highest cumulative
/// log probability when more were drawn (`best_of`), best first, as choices `0..n`; the prompt
/// counted once in the usage.
pub(crate) async fn whole(
    mut gens: Vec<Generation>,
    meta: &Meta,
    n: usize,
) -> Result<Response, ApiError> {
    let mut outs = Vec::with_capacity(gens.len());
    for gen in &mut gens {
        outs.push(to_end(gen).await?);
    }
    if outs.len() > n {
        outs.sort_by(|a, b| b.score().total_cmp(&a.score()));
        outs.truncate(n);
    }
    let first = gens.first().ok_or_else(|| ApiError::engine("no sample"))?;
    let tok = first.state.model.tokenizer();
    let choices: Vec<Value> = outs
        .iter()
        .enumerate()
        .map(|(index, o)| {
            let part = Part {
                index,
                text: &o.text,
                logprobs: &o.logprobs,
                end: Some(o.end),
                stop_reason: &o.reason,
            };
            meta.choice(tok, &part, true, 0)
        })
        .collect();
    let generated = outs.iter().map(|o| o.generated).sum();
    let body = meta.body(&json!(choices), Some(first.usage_with(generated)), false);
    Ok(json_response(StatusCode::OK, &body))
}

/// A beam search's whole response: its sequences, best first, as choices `0..n`; the prompt
/// counted once in the usage.
pub(crate) async fn beams(mut gen: Generation, meta: &Meta) -> Result<Response, ApiError> {
    let sequences = loop {
        match gen.rx.recv().await {
            Some(Event::Beams(s)) => break s,
            Some(Event::Scheduled(at, cached)) => (gen.scheduled, gen.cached) = (Some(at), cached),
            // Aborted (the server's shutdown passed its deadline) before the search ended.
            Some(Event::Done(End::Abort)) => {
                gen.finish(End::Abort);
                return Err(ApiError::shutting_down());
            }
            Some(Event::Tokens(..) | Event::Done(_)) => {}
            Some(Event::Failed(why)) => {
                gen.ended = true;
                return Err(ApiError::engine(why));
            }
            None => return Err(ApiError::engine("the engine dropped the request")),
        }
    };
    let tok = gen.state.model.tokenizer();
    let none = Value::Null;
    let mut choices = Vec::with_capacity(sequences.len());
    for (index, s) in sequences.iter().enumerate() {
        let text = tok
            .decode(&s.tokens)
            .map_err(|e| ApiError::engine(e.to_string()))?;
        let end = match s.finish {
            kvsched_engine::Finish::Stop => End::Stop,
            kvsched_engine::Finish::Length => End::Length,
        };
        let part = Part {
            index,
            text: &text,
            logprobs: &[],
            end: Some(end),
            stop_reason: &none,
        };
        choices.push(meta.choice(tok, &part, true, 0));
    }
    let generated = sequences.iter().map(|s| s.tokens.len()).sum();
    gen.timed(generated);
    gen.finish(End::Stop);
    let body = meta.body(&json!(choices), Some(gen.usage_with(generated)), false);
    Ok(json_response(StatusCode::OK, &body))
}

/// Where a stream stands.
enum Phase {
    Head,
    Body,
    Over,
}

fn sse(v: &Value) -> String {
    format!("data: {v}\n\n")
}

/// A stream's state between events: each choice's generation, the characters it sent so far
/// (`text_offset`), whether it ended.
struct Streaming {
    gens: Vec<Generation>,
    meta: Meta,
    phase: Phase,
    sent: Vec<usize>,
    ended: Vec<bool>,
}

impl Streaming {
    /// The usage so far: the prompt once, every choice's tokens.
    fn usage(&self) -> Value {
        let generated = self.gens.iter().map(|g| g.generated).sum();
        self.gens[0].usage_with(generated)
    }

    /// The usage on a chunk: the usage so far with `continuous_usage_stats`, else none.
    fn running(&self) -> Option<Value> {
        self.meta.continuous_usage.then(|| self.usage())
    }

    /// The events of one piece of choice `index`'s output (and the stream's end after the last
    /// choice's).
    fn events(&mut self, index: usize, out: &Out) -> String {
        let mut s = String::new();
        let tok = self.gens[index].state.model.tokenizer();
        let none = Value::Null;
        if !out.text.is_empty() || (!out.logprobs.is_empty() && out.end.is_none()) {
            let part = Part {
                index,
                text: &out.text,
                logprobs: &out.logprobs,
                end: None,
                stop_reason: &none,
            };
            let c = self.meta.choice(tok, &part, false, self.sent[index]);
            s.push_str(&sse(&self.meta.body(&json!([c]), self.running(), true)));
            self.sent[index] += out.text.chars().count();
        }
        let Some(end) = out.end else { return s };
        self.ended[index] = true;
        let reason = self.gens[index].stop_reason();
        let part = Part {
            index,
            text: "",
            logprobs: &[],
            end: Some(end),
            stop_reason: &reason,
        };
        let c = self.meta.choice(tok, &part, false, self.sent[index]);
        s.push_str(&sse(&self.meta.body(&json!([c]), self.running(), true)));
        if self.ended.iter().all(|&e| e) {
            if self.meta.include_usage {
                s.push_str(&sse(&self.meta.body(&json!([]), Some(self.usage()), true)));
            }
            s.push_str("data: [DONE]\n\n");
            self.phase = Phase::Over;
        }
        s
    }

    /// The next piece of any choice still running: `(choice, its output)`.
    async fn next(&mut self) -> (usize, Result<Out, ApiError>) {
        let running = self
            .gens
            .iter_mut()
            .enumerate()
            .filter(|(i, _)| !self.ended[*i])
            .map(|(i, g)| Box::pin(async move { (i, g.next().await) }));
        // Each `next` awaits only its channel (cancel-safe): the others wait for a later call.
        futures_util::future::select_all(running).await.0
    }

    async fn advance(&mut self) -> Option<String> {
        match self.phase {
            Phase::Over => None,
            Phase::Head if self.meta.endpoint == Endpoint::Chat => {
                self.phase = Phase::Body;
                let head: String = (0..self.gens.len())
                    .map(|index| {
                        let delta = json!([{"index": index, "delta": {"role": "assistant", "content": ""},
                                            "logprobs": null, "finish_reason": null}]);
                        sse(&self.meta.body(&delta, self.running(), true))
                    })
                    .collect();
                Some(head)
            }
            Phase::Head | Phase::Body => {
                self.phase = Phase::Body;
                match self.next().await {
                    (index, Ok(out)) => Some(self.events(index, &out)),
                    (_, Err(e)) => {
                        self.phase = Phase::Over;
                        Some(format!("{}data: [DONE]\n\n", sse(&e.body())))
                    }
                }
            }
        }
    }
}

/// The completion as server-sent events: (chat: a first chunk with the role, a chunk per choice), a
/// chunk per piece of text of any choice, a last chunk per choice with its finish reason, then (once
/// every choice ended) the usage chunk when asked, and `data: [DONE]`.
pub(crate) fn stream(gens: Vec<Generation>, meta: Meta) -> Response {
    let n = gens.len();
    let state = Streaming {
        gens,
        meta,
        phase: Phase::Head,
        sent: vec![0; n],
        ended: vec![false; n],
    };
    let events = futures_util::stream::unfold(state, |mut s| async move {
        let out = s.advance().await?;
        Some((Ok::<_, Infallible>(Bytes::from(out)), s))
    });
    (
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        Body::from_stream(events),
    )
        .into_response()
}
