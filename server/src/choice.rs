//! What a response's JSON repeats and how a choice is written: the text (whole or a chunk's), the
//! finish and stop reasons, the log probabilities in each endpoint's shape, the usage.

use kvsched_engine::{Logprob, Tokenizer};
use serde_json::{json, Map, Value};

use crate::api::Endpoint;
use crate::worker::End;

/// What every response of one request repeats.
pub(crate) struct Meta {
    pub(crate) id: String,
    pub(crate) created: u64,
    pub(crate) model: String,
    pub(crate) endpoint: Endpoint,
    /// A last chunk with the usage (`stream_options.include_usage`).
    pub(crate) include_usage: bool,
    /// The usage so far on every chunk (`stream_options.continuous_usage_stats`).
    pub(crate) continuous_usage: bool,
    /// Log probabilities were asked for.
    pub(crate) logprobs: bool,
}

/// One choice's content: its index, its text, the log probabilities of its tokens, its end.
pub(crate) struct Part<'a> {
    pub(crate) index: usize,
    pub(crate) text: &'a str,
    pub(crate) logprobs: &'a [Logprob],
    pub(crate) end: Option<End>,
    /// What stopped it: the stop string or stop token id (vLLM's `stop_reason`); null otherwise.
    pub(crate) stop_reason: &'a Value,
}

impl Meta {
    /// One choice's JSON: the whole text (`whole`) or a chunk's. `offset`: the characters of text
    /// before this part (completions' `text_offset`).
    pub(crate) fn choice(
        &self,
        tok: &Tokenizer,
        p: &Part<'_>,
        whole: bool,
        offset: usize,
    ) -> Value {
        let reason = p.end.map(End::reason);
        let logprobs = if self.logprobs {
            self.logprobs_json(tok, p.logprobs, offset)
        } else {
            Value::Null
        };
        let mut c = match (self.endpoint, whole) {
            (Endpoint::Completions, _) => json!({"index": p.index, "text": p.text}),
            (Endpoint::Chat, true) => {
                json!({"index": p.index, "message": {"role": "assistant", "content": p.text}})
            }
            (Endpoint::Chat, false) => {
                let delta = if p.end.is_some() && p.text.is_empty() {
                    json!({})
                } else {
                    json!({"content": p.text})
                };
                json!({"index": p.index, "delta": delta})
            }
        };
        c["logprobs"] = logprobs;
        c["finish_reason"] = json!(reason);
        if p.end.is_some() {
            c["stop_reason"] = p.stop_reason.clone();
        }
        c
    }

    /// Log probabilities in the endpoint's shape: completions' `tokens`, `token_logprobs`,
    /// `top_logprobs`, `text_offset`; chat's `content` list of `token`, `logprob`, `bytes`,
    /// `top_logprobs`.
    fn logprobs_json(&self, tok: &Tokenizer, lps: &[Logprob], offset: usize) -> Value {
        let text = |t: u32| tok.decode(&[t]).unwrap_or_default();
        match self.endpoint {
            Endpoint::Completions => {
                let mut at = offset;
                let mut tokens = Vec::new();
                let mut offsets = Vec::new();
                let mut tops = Vec::new();
                for lp in lps {
                    let s = text(lp.token);
                    offsets.push(at);
                    at += s.chars().count();
                    tokens.push(s);
                    let top: Map<String, Value> =
                        lp.top.iter().map(|&(t, l)| (text(t), json!(l))).collect();
                    tops.push(Value::Object(top));
                }
                let values: Vec<f32> = lps.iter().map(|l| l.logprob).collect();
                json!({"tokens": tokens, "token_logprobs": values, "top_logprobs": tops,
                       "text_offset": offsets})
            }
            Endpoint::Chat => {
                let entry = |t: u32, l: f32| {
                    let s = text(t);
                    json!({"token": s, "logprob": l, "bytes": s.as_bytes()})
                };
                let content: Vec<Value> = lps
                    .iter()
                    .map(|lp| {
                        let mut e = entry(lp.token, lp.logprob);
                        e["top_logprobs"] = lp.top.iter().map(|&(t, l)| entry(t, l)).collect();
                        e
                    })
                    .collect();
                json!({"content": content})
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

    /// A response body (`chunk`: one event of a stream) with its `choices` and `usage`.
    pub(crate) fn body(&self, choices: &Value, usage: Option<Value>, chunk: bool) -> Value {
        let mut v = json!({"id": self.id, "object": self.object(chunk), "created": self.created,
                           "model": self.model, "choices": choices});
        if !chunk || self.include_usage || self.continuous_usage {
            v["usage"] = usage.unwrap_or(Value::Null);
        }
        v
    }
}

/// The usage of `prompt` tokens, `cached` of them found in the prefix cache, and `generated`.
pub(crate) fn usage(prompt: usize, cached: usize, generated: usize) -> Value {
    json!({"prompt_tokens": prompt, "completion_tokens": generated,
           "total_tokens": prompt + generated,
           "prompt_tokens_details": {"cached_tokens": cached}})
}
