//! A generation's output: the engine's events turned into text (stop strings applied), its latencies
//! recorded, and written out as one JSON body or as server-sent events.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Instant;

use axum::body::{Body, Bytes};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use tokio::sync::mpsc::UnboundedReceiver;

use crate::api::Endpoint;
use crate::error::ApiError;
use crate::metrics::Finished;
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
    scheduled: Option<Instant>,
    last: Option<Instant>,
    first: Option<Instant>,
    prompt: usize,
    max_new: usize,
    generated: usize,
    ended: bool,
}

/// Text released by [`Generation::next`], and the request's end once it came.
struct Out {
    text: String,
    end: Option<End>,
}

impl Generation {
    /// A request of `prompt` tokens (`max_new` to generate at most) that arrived at `arrived`, its
    /// events on `rx`, its text ended by any of `stop`.
    pub(crate) fn new(
        state: Arc<AppState>,
        rx: UnboundedReceiver<Event>,
        stop: Vec<String>,
        (prompt, max_new): (usize, usize),
        arrived: Instant,
    ) -> Self {
        Self {
            state,
            rx,
            text: TextStream::new(stop),
            arrived,
            scheduled: None,
            last: None,
            first: None,
            prompt,
            max_new,
            generated: 0,
            ended: false,
        }
    }

    /// Waits for the next text or the end; `Err` with the engine's message if it failed the request.
    async fn next(&mut self) -> Result<Out, String> {
        let state = Arc::clone(&self.state);
        let tok = state.model.tokenizer();
        loop {
            let (tokens, end) = match self.rx.recv().await {
                Some(Event::Scheduled(at)) => {
                    self.scheduled = Some(at);
                    continue;
                }
                Some(Event::Tokens(t)) => (t, None),
                Some(Event::Done(end)) => (Vec::new(), Some(end)),
                Some(Event::Failed(why)) => {
                    self.ended = true;
                    return Err(why);
                }
                None => return Err("the engine dropped the request".into()),
            };
            if !tokens.is_empty() {
                self.timed(tokens.len());
            }
            let piece = self
                .text
                .push(tok, &tokens, end.is_some())
                .map_err(|e| e.to_string())?;
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
                    end,
                });
            }
        }
    }

    fn timed(&mut self, tokens: usize) {
        let now = Instant::now();
        match self.last {
            None => {
                self.state.metrics.first_token(now - self.arrived);
                self.first = Some(now);
            }
            Some(last) => self.state.metrics.next_token(now - last),
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
        });
    }

    fn usage(&self) -> Value {
        json!({"prompt_tokens": self.prompt, "completion_tokens": self.generated,
               "total_tokens": self.prompt + self.generated})
    }
}

impl Drop for Generation {
    fn drop(&mut self) {
        if !self.ended {
            self.finish(End::Abort);
        }
    }
}

/// What every response of one request repeats.
pub(crate) struct Meta {
    pub(crate) id: String,
    pub(crate) created: u64,
    pub(crate) model: String,
    pub(crate) endpoint: Endpoint,
    pub(crate) include_usage: bool,
}

impl Meta {
    /// One choice's JSON: the whole text (`whole`) or a chunk's.
    fn choice(&self, text: &str, end: Option<End>, whole: bool) -> Value {
        let reason = end.map(End::reason);
        match (self.endpoint, whole) {
            (Endpoint::Completions, _) => {
                json!({"index": 0, "text": text, "logprobs": null, "finish_reason": reason})
            }
            (Endpoint::Chat, true) => json!({"index": 0, "logprobs": null, "finish_reason": reason,
                "message": {"role": "assistant", "content": text}}),
            (Endpoint::Chat, false) => {
                let delta = if end.is_some() && text.is_empty() {
                    json!({})
                } else {
                    json!({"content": text})
                };
                json!({"index": 0, "delta": delta, "logprobs": null, "finish_reason": reason})
            }
        }
    }

    fn object(&self, chunk: bool) -> &'static str {
        match (self.endpoint, chunk) {
            (Endpoint::Completions, _) => "text_completion",
            (Endpoint::Chat, false) => "chat.completion",
            (Endpoint::Chat, true) => "chat.completion.chunk",
        }
    }

    fn body(&self, choices: &Value, usage: Option<Value>, chunk: bool) -> Value {
        let mut v = json!({"id": self.id, "object": self.object(chunk), "created": self.created,
                           "model": self.model, "choices": choices});
        if !chunk || self.include_usage {
            v["usage"] = usage.unwrap_or(Value::Null);
        }
        v
    }
}

/// The whole completion in one body.
pub(crate) async fn whole(mut gen: Generation, meta: &Meta) -> Result<Response, ApiError> {
    let mut text = String::new();
    loop {
        let out = gen.next().await.map_err(ApiError::engine)?;
        text.push_str(&out.text);
        if let Some(end) = out.end {
            let body = meta.body(
                &json!([meta.choice(&text, Some(end), true)]),
                Some(gen.usage()),
                false,
            );
            return Ok(json_response(StatusCode::OK, &body));
        }
    }
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

/// The completion as server-sent events: (chat: a first chunk with the role), a chunk per piece of
/// text, a last chunk with the finish reason, the usage chunk when asked, then `data: [DONE]`.
pub(crate) fn stream(gen: Generation, meta: Meta) -> Response {
    let events = futures_util::stream::unfold(
        (gen, meta, Phase::Head),
        |(mut gen, meta, phase)| async move {
            let mut out = String::new();
            let next = match phase {
                Phase::Over => return None,
                Phase::Head if meta.endpoint == Endpoint::Chat => {
                    let delta = json!([{"index": 0, "delta": {"role": "assistant", "content": ""},
                                    "logprobs": null, "finish_reason": null}]);
                    out.push_str(&sse(&meta.body(&delta, None, true)));
                    Phase::Body
                }
                Phase::Head | Phase::Body => match gen.next().await {
                    Ok(piece) => {
                        if !piece.text.is_empty() {
                            out.push_str(&sse(&meta.body(
                                &json!([meta.choice(&piece.text, None, false)]),
                                None,
                                true,
                            )));
                        }
                        match piece.end {
                            Some(end) => {
                                out.push_str(&sse(&meta.body(
                                    &json!([meta.choice("", Some(end), false)]),
                                    None,
                                    true,
                                )));
                                if meta.include_usage {
                                    out.push_str(&sse(&meta.body(
                                        &json!([]),
                                        Some(gen.usage()),
                                        true,
                                    )));
                                }
                                out.push_str("data: [DONE]\n\n");
                                Phase::Over
                            }
                            None => Phase::Body,
                        }
                    }
                    Err(why) => {
                        out.push_str(&sse(&ApiError::engine(why).body()));
                        out.push_str("data: [DONE]\n\n");
                        Phase::Over
                    }
                },
            };
            Some((Ok::<_, Infallible>(Bytes::from(out)), (gen, meta, next)))
        },
    );
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
