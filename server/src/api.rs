//! The requests of `POST /v1/completions` and `POST /v1/chat/completions`, read field by field from
//! the JSON body so that every refusal names its field (`param`) in the OpenAI error shape.
//!
//! A field set to `null` is the same as a field left out, as in the OpenAI API. Fields the API
//! defines that this server does not implement are accepted only at their default value (`n: 1`,
//! `presence_penalty: 0`, ...); any other value is refused, never ignored. A field the API does not
//! define is refused (`unknown_field`), except vLLM's `ignore_eos`, which benchmark tools send.

use kvsched_engine::Message;
use serde_json::{Map, Value};

use crate::error::ApiError;

/// Which endpoint a request came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// `POST /v1/completions`.
    Completions,
    /// `POST /v1/chat/completions`.
    Chat,
}

impl Endpoint {
    /// The fields the endpoint accepts.
    const fn fields(self) -> &'static [&'static str] {
        match self {
            Self::Completions => &[
                "model",
                "prompt",
                "max_tokens",
                "temperature",
                "top_p",
                "seed",
                "stop",
                "stream",
                "stream_options",
                "n",
                "best_of",
                "echo",
                "suffix",
                "logprobs",
                "logit_bias",
                "presence_penalty",
                "frequency_penalty",
                "user",
                "ignore_eos",
            ],
            Self::Chat => &[
                "model",
                "messages",
                "max_tokens",
                "max_completion_tokens",
                "temperature",
                "top_p",
                "seed",
                "stop",
                "stream",
                "stream_options",
                "n",
                "logprobs",
                "top_logprobs",
                "logit_bias",
                "presence_penalty",
                "frequency_penalty",
                "response_format",
                "tools",
                "tool_choice",
                "parallel_tool_calls",
                "user",
                "ignore_eos",
            ],
        }
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
    /// Sampling temperature in [0, 2]; 0 is greedy. The API's default is 1.
    pub temperature: f32,
    /// Nucleus mass in (0, 1].
    pub top_p: f32,
    /// The sampler's seed (`None`: a fresh one).
    pub seed: Option<u64>,
    /// Stop strings (at most 4, none empty): the text ends before the first one generated.
    pub stop: Vec<String>,
    /// Server-sent events instead of one JSON body.
    pub stream: bool,
    /// `stream_options.include_usage`: a last chunk with the usage.
    pub include_usage: bool,
    /// vLLM's `ignore_eos`: the model's stop token does not end the request.
    pub ignore_eos: bool,
}

/// Parses `body` as a request to `endpoint`.
pub fn parse(endpoint: Endpoint, body: &[u8]) -> Result<Request, ApiError> {
    let value: Value = serde_json::from_slice(body).map_err(|e| {
        ApiError::invalid(
            "",
            "invalid_json",
            format!("The body is not valid JSON: {e}"),
        )
    })?;
    let Value::Object(map) = value else {
        return Err(ApiError::invalid(
            "",
            "invalid_type",
            "The body must be a JSON object.",
        ));
    };
    let f = Fields(&map);
    f.only(endpoint.fields(), "")?;
    f.unsupported_defaults(endpoint)?;
    let prompt = match endpoint {
        Endpoint::Completions => prompt(f.required("prompt")?)?,
        Endpoint::Chat => Prompt::Chat(messages(f.required("messages")?)?),
    };
    let stream = f.bool("stream")?.unwrap_or(false);
    let mut max_tokens = f.count("max_tokens")?;
    if endpoint == Endpoint::Chat {
        max_tokens = f.count("max_completion_tokens")?.or(max_tokens);
    }
    Ok(Request {
        endpoint,
        model: f.string("model")?,
        prompt,
        max_tokens,
        temperature: f.number("temperature", 0.0, 2.0, true)?.unwrap_or(1.0),
        top_p: f.number("top_p", 0.0, 1.0, false)?.unwrap_or(1.0),
        seed: f.seed()?,
        stop: stops(f.get("stop"))?,
        include_usage: stream_options(f.get("stream_options"), stream)?,
        stream,
        ignore_eos: f.bool("ignore_eos")?.unwrap_or(false),
    })
}

/// A request's fields, read one at a time.
struct Fields<'a>(&'a Map<String, Value>);

impl Fields<'_> {
    /// The field, `None` when absent or null.
    fn get(&self, name: &str) -> Option<&Value> {
        self.0.get(name).filter(|v| !v.is_null())
    }

    /// Refuses a field outside `allowed` (`at` names the object for the message).
    fn only(&self, allowed: &[&str], at: &str) -> Result<(), ApiError> {
        match self.0.keys().find(|k| !allowed.contains(&k.as_str())) {
            Some(k) => Err(ApiError::invalid(
                &format!("{at}{k}"),
                "unknown_field",
                format!("Unrecognized request argument supplied: {at}{k}"),
            )),
            None => Ok(()),
        }
    }

    fn required(&self, name: &str) -> Result<&Value, ApiError> {
        self.get(name).ok_or_else(|| {
            ApiError::invalid(
                name,
                "missing_field",
                format!("`{name}` is a required field."),
            )
        })
    }

    fn string(&self, name: &str) -> Result<String, ApiError> {
        match self.required(name)? {
            Value::String(s) => Ok(s.clone()),
            _ => Err(wrong_type(name, "a string")),
        }
    }

    fn bool(&self, name: &str) -> Result<Option<bool>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(_) => Err(wrong_type(name, "a boolean")),
        }
    }

    /// A token count of at least 1: an integer of any size (one past `usize` reads as `usize::MAX`,
    /// which the context-length check then refuses, as vLLM does), or a number with no fraction.
    fn count(&self, name: &str) -> Result<Option<usize>, ApiError> {
        let Some(v) = self.get(name) else {
            return Ok(None);
        };
        let integral = v.as_f64().filter(|x| x.fract() == 0.0);
        // No loss: a JSON integer past `i64` and `u64` is read as an integral `f64`, which the
        // saturating cast keeps on its side of 1.
        #[allow(clippy::cast_possible_truncation)]
        let n = (v.as_i64().map(i128::from))
            .or_else(|| v.as_u64().map(i128::from))
            .or_else(|| integral.map(|x| x as i128));
        match n {
            Some(n) if n >= 1 => Ok(Some(usize::try_from(n).unwrap_or(usize::MAX))),
            Some(n) => Err(ApiError::invalid(
                name,
                "invalid_value",
                format!("`{name}` must be at least 1, got {n}."),
            )),
            None => Err(wrong_type(name, "an integer")),
        }
    }

    /// A number in `[low, high]` (`low` itself excluded unless `low_included`).
    fn number(
        &self,
        name: &str,
        low: f64,
        high: f64,
        low_included: bool,
    ) -> Result<Option<f32>, ApiError> {
        let Some(v) = self.get(name) else {
            return Ok(None);
        };
        let x = v.as_f64().ok_or_else(|| wrong_type(name, "a number"))?;
        let above = if low_included { x >= low } else { x > low };
        if !(above && x <= high) {
            let open = if low_included { '[' } else { '(' };
            return Err(ApiError::invalid(
                name,
                "invalid_value",
                format!("`{name}` must be in {open}{low}, {high}], got {x}."),
            ));
        }
        Ok(Some(x as f32))
    }

    fn seed(&self) -> Result<Option<u64>, ApiError> {
        match self.get("seed") {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .or_else(|| v.as_i64().map(|n| n as u64))
                .map(Some)
                .ok_or_else(|| wrong_type("seed", "an integer")),
        }
    }

    /// Fields of the API this server implements only at their default value.
    fn unsupported_defaults(&self, endpoint: Endpoint) -> Result<(), ApiError> {
        let defaults: &[AtDefault] = &[
            ("n", |v| v.as_i64() == Some(1), "one choice per request"),
            (
                "best_of",
                |v| v.as_i64() == Some(1),
                "one candidate per request",
            ),
            (
                "echo",
                |v| v == &Value::Bool(false),
                "no echo of the prompt",
            ),
            ("suffix", |v| v.as_str() == Some(""), "no suffix"),
            (
                "logprobs",
                |v| v == &Value::Bool(false),
                "no log probabilities",
            ),
            (
                "top_logprobs",
                |v| v.as_i64() == Some(0),
                "no log probabilities",
            ),
            (
                "logit_bias",
                |v| v.as_object().is_some_and(Map::is_empty),
                "no logit bias",
            ),
            (
                "presence_penalty",
                |v| v.as_f64() == Some(0.0),
                "no penalties",
            ),
            (
                "frequency_penalty",
                |v| v.as_f64() == Some(0.0),
                "no penalties",
            ),
            (
                "response_format",
                |v| v.get("type").and_then(Value::as_str) == Some("text"),
                "text responses only",
            ),
            (
                "tools",
                |v| v.as_array().is_some_and(Vec::is_empty),
                "no tool calls",
            ),
            (
                "tool_choice",
                |v| v.as_str() == Some("none"),
                "no tool calls",
            ),
        ];
        for &(name, is_default, what) in defaults {
            match self.get(name) {
                Some(v) if !is_default(v) => {
                    return Err(ApiError::invalid(
                        name,
                        "unsupported_value",
                        format!("`{name}` = {v} is not supported: this server gives {what}."),
                    ))
                }
                _ => {}
            }
        }
        if let Some(v) = self.get("user") {
            if !v.is_string() {
                return Err(wrong_type("user", "a string"));
            }
        }
        if endpoint == Endpoint::Chat && self.get("parallel_tool_calls").is_some() {
            self.bool("parallel_tool_calls")?;
        }
        Ok(())
    }
}

/// A field accepted only at its default: its name, whether a value is the default, what the server
/// gives instead.
type AtDefault = (&'static str, fn(&Value) -> bool, &'static str);

fn wrong_type(name: &str, what: &str) -> ApiError {
    ApiError::invalid(name, "invalid_type", format!("`{name}` must be {what}."))
}

/// A completions prompt: a string, a list of one string, a list of token ids, or a list of one
/// list of token ids.
fn prompt(v: &Value) -> Result<Prompt, ApiError> {
    let many = || {
        ApiError::invalid(
            "prompt",
            "unsupported_value",
            "`prompt` holds several prompts: this server takes one prompt per request.",
        )
    };
    match v {
        Value::String(s) => Ok(Prompt::Text(s.clone())),
        Value::Array(items) if items.len() == 1 && !items[0].is_number() => prompt(&items[0]),
        Value::Array(items) if items.iter().all(Value::is_number) => items
            .iter()
            .map(|t| t.as_u64().and_then(|t| u32::try_from(t).ok()))
            .collect::<Option<Vec<u32>>>()
            .map(Prompt::Tokens)
            .ok_or_else(|| wrong_type("prompt", "a string or a list of token ids")),
        Value::Array(items) if items.iter().all(|i| i.is_string() || i.is_array()) => Err(many()),
        _ => Err(wrong_type("prompt", "a string or a list of token ids")),
    }
}

/// Chat messages: a non-empty list of `{role, content}` objects; `content` is a string or a list of
/// `{"type": "text", "text": ...}` parts.
fn messages(v: &Value) -> Result<Vec<Message>, ApiError> {
    let list = v
        .as_array()
        .filter(|l| !l.is_empty())
        .ok_or_else(|| wrong_type("messages", "a non-empty list of messages"))?;
    list.iter()
        .enumerate()
        .map(|(i, m)| message(m, &format!("messages[{i}]")))
        .collect()
}

fn message(v: &Value, at: &str) -> Result<Message, ApiError> {
    let map = v
        .as_object()
        .ok_or_else(|| wrong_type(at, "an object with `role` and `content`"))?;
    let f = Fields(map);
    f.only(&["role", "content", "name"], &format!("{at}."))?;
    let role = match f.get("role").and_then(Value::as_str) {
        Some(r @ ("system" | "user" | "assistant")) => r.to_string(),
        Some("developer") => "system".to_string(),
        Some(r) => {
            return Err(ApiError::invalid(
                &format!("{at}.role"),
                "invalid_value",
                format!("Role {r:?} is not supported (system, developer, user, assistant)."),
            ))
        }
        None => return Err(wrong_type(&format!("{at}.role"), "a string")),
    };
    let content = match f.get("content") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => text_parts(parts, &format!("{at}.content"))?,
        None if role == "assistant" => String::new(),
        _ => {
            return Err(wrong_type(
                &format!("{at}.content"),
                "a string or a list of text parts",
            ))
        }
    };
    Ok(Message::new(role, content))
}

fn text_parts(parts: &[Value], at: &str) -> Result<String, ApiError> {
    let mut text = String::new();
    for (i, p) in parts.iter().enumerate() {
        match (p.get("type").and_then(Value::as_str), p.get("text")) {
            (Some("text"), Some(Value::String(s))) => text.push_str(s),
            _ => {
                return Err(ApiError::invalid(
                    &format!("{at}[{i}]"),
                    "unsupported_value",
                    "Only text content parts ({\"type\": \"text\", \"text\": ...}) are supported.",
                ))
            }
        }
    }
    Ok(text)
}

/// `stop`: a string or a list of at most 4 non-empty strings.
fn stops(v: Option<&Value>) -> Result<Vec<String>, ApiError> {
    let list: Vec<&Value> = match v {
        None => return Ok(Vec::new()),
        Some(Value::Array(items)) => items.iter().collect(),
        Some(one) => vec![one],
    };
    if list.len() > 4 {
        return Err(ApiError::invalid(
            "stop",
            "invalid_value",
            format!("`stop` holds at most 4 sequences, got {}.", list.len()),
        ));
    }
    list.into_iter()
        .map(|s| match s.as_str() {
            Some(s) if !s.is_empty() => Ok(s.to_string()),
            Some(_) => Err(ApiError::invalid(
                "stop",
                "invalid_value",
                "A stop sequence must not be empty.",
            )),
            None => Err(wrong_type("stop", "a string or a list of strings")),
        })
        .collect()
}

/// `stream_options` (only with `stream: true`): `include_usage`.
fn stream_options(v: Option<&Value>, stream: bool) -> Result<bool, ApiError> {
    let Some(v) = v else {
        return Ok(false);
    };
    if !stream {
        return Err(ApiError::invalid(
            "stream_options",
            "invalid_value",
            "`stream_options` is only allowed when `stream` is true.",
        ));
    }
    let map = v
        .as_object()
        .ok_or_else(|| wrong_type("stream_options", "an object"))?;
    let f = Fields(map);
    f.only(
        &["include_usage", "continuous_usage_stats"],
        "stream_options.",
    )?;
    f.bool("continuous_usage_stats")?;
    Ok(f.bool("include_usage")?.unwrap_or(false))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(endpoint: Endpoint, body: &str) -> ApiError {
        parse(endpoint, body.as_bytes()).expect_err(body)
    }

    #[test]
    fn a_completion_request_reads_every_field() {
        let r = parse(
            Endpoint::Completions,
            br#"{"model":"m","prompt":"hi","max_tokens":5,"temperature":0,"top_p":0.5,
                 "seed":-1,"stop":["a","b"],"stream":true,"stream_options":{"include_usage":true},
                 "n":1,"logprobs":null,"ignore_eos":true}"#,
        )
        .unwrap();
        assert_eq!(r.prompt, Prompt::Text("hi".into()));
        assert_eq!((r.max_tokens, r.temperature, r.top_p), (Some(5), 0.0, 0.5));
        assert_eq!(r.seed, Some(u64::MAX));
        assert_eq!(r.stop, ["a", "b"]);
        assert!(r.stream && r.include_usage && r.ignore_eos);
    }

    #[test]
    fn chat_content_parts_and_token_prompts_are_read() {
        let r = parse(
            Endpoint::Chat,
            br#"{"model":"m","messages":[{"role":"developer","content":"be brief"},
                 {"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}],
                 "max_completion_tokens":3}"#,
        )
        .unwrap();
        assert_eq!(
            r.prompt,
            Prompt::Chat(vec![Message::system("be brief"), Message::user("ab")])
        );
        assert_eq!(r.max_tokens, Some(3));
        let t = parse(
            Endpoint::Completions,
            br#"{"model":"m","prompt":[[1,2,3]]}"#,
        )
        .unwrap();
        assert_eq!(t.prompt, Prompt::Tokens(vec![1, 2, 3]));
    }

    /// An integer too large for `i64` was refused as "not an integer" (issue 43); it is a count, and a
    /// number with no fraction is one too.
    #[test]
    fn a_count_of_any_size_is_a_count() {
        let max_tokens = |v: &str| {
            let body = format!(r#"{{"model":"m","prompt":"x","max_tokens":{v}}}"#);
            parse(Endpoint::Completions, body.as_bytes()).map(|r| r.max_tokens)
        };
        assert_eq!(max_tokens("100000000000000000000"), Ok(Some(usize::MAX)));
        assert_eq!(max_tokens("18446744073709551615"), Ok(Some(usize::MAX)));
        assert_eq!(max_tokens("5.0"), Ok(Some(5)));
        let code = |v: &str| max_tokens(v).expect_err(v).code;
        assert_eq!(code("-100000000000000000000"), "invalid_value");
        assert_eq!(code("5.5"), "invalid_type");
    }

    #[test]
    fn each_bad_field_is_named() {
        let cases: &[(Endpoint, &str, Option<&str>, &str)] = &[
            (Endpoint::Completions, "{", None, "invalid_json"),
            (Endpoint::Completions, "[1]", None, "invalid_type"),
            (
                Endpoint::Completions,
                r#"{"model":"m"}"#,
                Some("prompt"),
                "missing_field",
            ),
            (
                Endpoint::Completions,
                r#"{"prompt":"x"}"#,
                Some("model"),
                "missing_field",
            ),
            (
                Endpoint::Completions,
                r#"{"model":"m","prompt":"x","max_tokens":0}"#,
                Some("max_tokens"),
                "invalid_value",
            ),
            (
                Endpoint::Completions,
                r#"{"model":"m","prompt":"x","max_tokens":"5"}"#,
                Some("max_tokens"),
                "invalid_type",
            ),
            (
                Endpoint::Completions,
                r#"{"model":"m","prompt":"x","temperature":3}"#,
                Some("temperature"),
                "invalid_value",
            ),
            (
                Endpoint::Completions,
                r#"{"model":"m","prompt":"x","top_p":0}"#,
                Some("top_p"),
                "invalid_value",
            ),
            (
                Endpoint::Completions,
                r#"{"model":"m","prompt":"x","n":2}"#,
                Some("n"),
                "unsupported_value",
            ),
            (
                Endpoint::Completions,
                r#"{"model":"m","prompt":"x","foo":1}"#,
                Some("foo"),
                "unknown_field",
            ),
            (
                Endpoint::Completions,
                r#"{"model":"m","prompt":["a","b"]}"#,
                Some("prompt"),
                "unsupported_value",
            ),
            (
                Endpoint::Completions,
                r#"{"model":"m","prompt":7}"#,
                Some("prompt"),
                "invalid_type",
            ),
            (
                Endpoint::Completions,
                r#"{"model":"m","prompt":"x","stop":["a","b","c","d","e"]}"#,
                Some("stop"),
                "invalid_value",
            ),
            (
                Endpoint::Completions,
                r#"{"model":"m","prompt":"x","stream_options":{"include_usage":true}}"#,
                Some("stream_options"),
                "invalid_value",
            ),
            (
                Endpoint::Completions,
                r#"{"model":"m","prompt":"x","stream":true,"stream_options":{"x":1}}"#,
                Some("stream_options.x"),
                "unknown_field",
            ),
            (
                Endpoint::Chat,
                r#"{"model":"m","messages":[]}"#,
                Some("messages"),
                "invalid_type",
            ),
            (
                Endpoint::Chat,
                r#"{"model":"m","messages":[{"role":"tool","content":"x"}]}"#,
                Some("messages[0].role"),
                "invalid_value",
            ),
            (
                Endpoint::Chat,
                r#"{"model":"m","messages":[{"role":"user","content":"x","extra":1}]}"#,
                Some("messages[0].extra"),
                "unknown_field",
            ),
            (
                Endpoint::Chat,
                r#"{"model":"m","messages":[{"role":"user","content":"x"}],"prompt":"x"}"#,
                Some("prompt"),
                "unknown_field",
            ),
            (
                Endpoint::Chat,
                r#"{"model":"m","messages":[{"role":"user","content":"x"}],"tools":[{}]}"#,
                Some("tools"),
                "unsupported_value",
            ),
        ];
        for &(endpoint, body, param, code) in cases {
            let e = refused(endpoint, body);
            assert_eq!((e.param.as_deref(), e.code), (param, code), "{body}: {e:?}");
            assert_eq!(e.status, 400);
        }
    }
}
