//! The requests of `POST /v1/completions` and `POST /v1/chat/completions`, read field by field from
//! the JSON body so that every refusal names its field (`param`) in the OpenAI error shape.
//!
//! A field set to `null` is the same as a field left out, as in the OpenAI API. Fields the API (or
//! vLLM) defines that this server does not implement are accepted only at their default value
//! (`n: 1`, `echo: false`, ...); any other value is refused, never ignored. A field neither defines
//! (an SDK's `store`, `metadata`, ...) is accepted and ignored, as vLLM does, and named in the
//! request's [`Request::ignored`] (the server logs them and answers with a warning header).

mod fields;
mod prompt;
mod sampling;
#[cfg(test)]
mod tests;
mod tokenize;

use kvsched_engine::Message;

use crate::error::ApiError;
pub use fields::object;
use fields::Fields;
pub use sampling::{Format, Sampling};
pub use tokenize::{parse_detokenize, parse_tokenize, Tokenize};

/// Which endpoint a request came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// `POST /v1/completions`.
    Completions,
    /// `POST /v1/chat/completions`.
    Chat,
}

/// Fields both endpoints read.
const COMMON: &[&str] = &[
    "model",
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "stop",
    "stop_token_ids",
    "stream",
    "stream_options",
    "n",
    "logprobs",
    "logit_bias",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "min_tokens",
    "user",
    "ignore_eos",
    "cache_salt",
    "response_format",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "prompt_logprobs",
    "use_beam_search",
    "length_penalty",
    "best_of",
    "priority",
    "service_class",
];

impl Endpoint {
    /// The fields the endpoint reads besides [`COMMON`].
    const fn own_fields(self) -> &'static [&'static str] {
        match self {
            Self::Completions => &["prompt", "echo", "suffix"],
            Self::Chat => &[
                "messages",
                "max_completion_tokens",
                "top_logprobs",
                "tools",
                "tool_choice",
                "parallel_tool_calls",
            ],
        }
    }

    fn knows(self, field: &str) -> bool {
        COMMON.contains(&field) || self.own_fields().contains(&field)
    }
}

/// What the request asks to be generated from.
#[derive(Debug, Clone, PartialEq)]
pub enum Prompt {
    /// A text prompt (completions).
    Text(String),
    /// A prompt of token ids (completions).
    Tokens(Vec<u32>),
    /// Chat messages, rendered through the model's chat template.
    Chat(Vec<Message>),
}

/// A parsed generation request.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// The endpoint it came to.
    pub endpoint: Endpoint,
    /// The model (or adapter) name.
    pub model: String,
    /// Its prompt.
    pub prompt: Prompt,
    /// `max_tokens` (or `max_completion_tokens`), at least 1; `None`: the endpoint's default.
    pub max_tokens: Option<usize>,
    /// How tokens are drawn.
    pub sampling: Sampling,
    /// Stop strings (at most 4, none empty): the text ends before the first one generated.
    pub stop: Vec<String>,
    /// Server-sent events instead of one JSON body.
    pub stream: bool,
    /// `stream_options.include_usage`: a last chunk with the usage.
    pub include_usage: bool,
    /// `stream_options.continuous_usage_stats`: the usage so far on every chunk.
    pub continuous_usage: bool,
    /// Log probabilities with this many likeliest alternatives per token; `None`: none.
    pub logprobs: Option<usize>,
    /// `n`: the choices returned.
    pub n: usize,
    /// `best_of`: the samples drawn, of which the `n` with the highest cumulative log probability
    /// are returned (vLLM's, on both endpoints).
    pub best_of: usize,
    /// vLLM's `use_beam_search` (with `n` beams) and its `length_penalty`.
    pub beam_search: Option<f64>,
    /// `cache_salt`: the prefix cache is shared only among requests of the same salt.
    pub cache_salt: Option<String>,
    /// vLLM's `priority` (-128 to 127, the lower first; 0 by default): honoured under
    /// `--scheduling-policy priority`.
    pub priority: i64,
    /// `service_class` (kvsched's, 0 to 3; 0 by default): the class whose share
    /// (`--class-share`) the request is promised.
    pub service_class: u8,
    /// Structured output: what the text must be.
    pub format: Option<Format>,
    /// Fields neither the OpenAI API nor vLLM defines, ignored.
    pub ignored: Vec<String>,
}

/// The most alternatives a token's log probability comes with (the OpenAI API's limit).
pub const MAX_TOP_LOGPROBS: usize = 20;

/// Parses `body` as a request to `endpoint`.
pub fn parse(endpoint: Endpoint, body: &[u8]) -> Result<Request, ApiError> {
    let map = fields::object(body)?;
    let f = Fields(&map);
    let mut ignored: Vec<String> = map.keys().filter(|k| !endpoint.knows(k)).cloned().collect();
    ignored.sort_unstable();
    f.unsupported_defaults()?;
    let prompt = match endpoint {
        Endpoint::Completions => prompt::prompt(f.required("prompt")?)?,
        Endpoint::Chat => Prompt::Chat(prompt::messages(f.required("messages")?)?),
    };
    let stream = f.bool("stream")?.unwrap_or(false);
    let mut max_tokens = f.count("max_tokens")?;
    if endpoint == Endpoint::Chat {
        max_tokens = f.count("max_completion_tokens")?.or(max_tokens);
    }
    let (include_usage, continuous_usage) =
        sampling::stream_options(f.get("stream_options"), stream)?;
    let (n, best_of) = sampling::samples(&f, stream)?;
    let beam_search = sampling::beam_search(&f, stream)?;
    Ok(Request {
        endpoint,
        model: f.string("model")?,
        prompt,
        max_tokens,
        sampling: Sampling::read(&f, max_tokens)?,
        stop: sampling::stops(f.get("stop"))?,
        stream,
        include_usage,
        continuous_usage,
        logprobs: sampling::logprobs(&f, endpoint)?,
        n,
        best_of,
        beam_search,
        cache_salt: sampling::cache_salt(&f)?,
        priority: f.integer("priority", -128, 127)?.unwrap_or(0),
        service_class: f
            .integer(
                "service_class",
                0,
                kvsched_core::config::SERVICE_CLASSES as i64 - 1,
            )?
            .map_or(0, |c| c as u8),
        format: sampling::format(&f)?,
        ignored,
    })
}
