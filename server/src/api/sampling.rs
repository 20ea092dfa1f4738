//! How a request's tokens are drawn and what they must form: the sampling fields (temperature,
//! top-p, top-k, min-p, penalties, logit bias, min_tokens, stop token ids, seed), log
//! probabilities, the cache salt, and structured output (`response_format`, vLLM's `guided_*`).

use serde_json::Value;

use super::fields::{wrong_type, Fields};
use super::{Endpoint, MAX_TOP_LOGPROBS};
use crate::error::ApiError;

/// The sampling fields of a request.
#[derive(Debug, Clone, PartialEq)]
pub struct Sampling {
    /// Temperature in [0, 2]; 0 is greedy. The API's default is 1.
    pub temperature: f32,
    /// Nucleus mass in (0, 1].
    pub top_p: f32,
    /// The likeliest tokens kept; 0: all (vLLM's -1 reads as 0).
    pub top_k: usize,
    /// In [0, 1]: tokens below this fraction of the likeliest's probability are dropped.
    pub min_p: f32,
    /// The sampler's seed (`None`: a fresh one).
    pub seed: Option<u64>,
    /// `presence_penalty`, `frequency_penalty` in [-2, 2]; `repetition_penalty` in (0, 2].
    pub penalties: [f32; 3],
    /// `logit_bias`: token id and bias in [-100, 100].
    pub logit_bias: Vec<(u32, f32)>,
    /// No stop before this many tokens.
    pub min_tokens: usize,
    /// Tokens that end the request besides the model's stop tokens.
    pub stop_token_ids: Vec<u32>,
    /// vLLM's `ignore_eos`: the model's stop token does not end the request.
    pub ignore_eos: bool,
}

impl Sampling {
    /// Reads the sampling fields; `max_tokens` bounds `min_tokens`.
    pub(super) fn read(f: &Fields<'_>, max_tokens: Option<usize>) -> Result<Self, ApiError> {
        let top_k = f
            .integer("top_k", -1, i64::from(u32::MAX))?
            .unwrap_or(0)
            .max(0);
        let min_tokens = f
            .integer("min_tokens", 0, i64::from(u32::MAX))?
            .unwrap_or(0);
        let min_tokens = usize::try_from(min_tokens).unwrap_or(usize::MAX);
        if max_tokens.is_some_and(|m| min_tokens > m) {
            return Err(ApiError::invalid(
                "min_tokens",
                "invalid_value",
                "`min_tokens` must not exceed `max_tokens`.",
            ));
        }
        Ok(Self {
            temperature: f.number("temperature", 0.0, 2.0, true)?.unwrap_or(1.0),
            top_p: f.number("top_p", 0.0, 1.0, false)?.unwrap_or(1.0),
            top_k: usize::try_from(top_k).unwrap_or(0),
            min_p: f.number("min_p", 0.0, 1.0, true)?.unwrap_or(0.0),
            seed: f.seed()?,
            penalties: [
                f.number("presence_penalty", -2.0, 2.0, true)?
                    .unwrap_or(0.0),
                f.number("frequency_penalty", -2.0, 2.0, true)?
                    .unwrap_or(0.0),
                f.number("repetition_penalty", 0.0, 2.0, false)?
                    .unwrap_or(1.0),
            ],
            logit_bias: logit_bias(f.get("logit_bias"))?,
            min_tokens,
            stop_token_ids: f.token_ids("stop_token_ids")?,
            ignore_eos: f.bool("ignore_eos")?.unwrap_or(false),
        })
    }
}

/// `logit_bias`: an object from token ids (as strings) to biases in [-100, 100].
fn logit_bias(v: Option<&Value>) -> Result<Vec<(u32, f32)>, ApiError> {
    let Some(v) = v else {
        return Ok(Vec::new());
    };
    let map = v
        .as_object()
        .ok_or_else(|| wrong_type("logit_bias", "an object of token ids to numbers"))?;
    map.iter()
        .map(|(k, b)| {
            let token = k.parse::<u32>().ok();
            let bias = b.as_f64().filter(|b| (-100.0..=100.0).contains(b));
            match (token, bias) {
                (Some(t), Some(b)) => Ok((t, b as f32)),
                _ => Err(ApiError::invalid(
                    "logit_bias",
                    "invalid_value",
                    format!(
                        "`logit_bias` maps token ids to numbers in [-100, 100]; got {k:?}: {b}."
                    ),
                )),
            }
        })
        .collect()
}

/// Log probabilities: completions' `logprobs` (the number of alternatives), chat's `logprobs`
/// (a boolean) with `top_logprobs`.
pub(super) fn logprobs(f: &Fields<'_>, endpoint: Endpoint) -> Result<Option<usize>, ApiError> {
    let most = MAX_TOP_LOGPROBS as i64;
    match endpoint {
        Endpoint::Completions => Ok(f
            .integer("logprobs", 0, most)?
            .map(|n| usize::try_from(n).unwrap_or(0))),
        Endpoint::Chat => {
            let top = f.integer("top_logprobs", 0, most)?;
            match (f.bool("logprobs")?.unwrap_or(false), top) {
                (true, top) => Ok(Some(top.map_or(0, |n| usize::try_from(n).unwrap_or(0)))),
                (false, Some(n)) if n > 0 => Err(ApiError::invalid(
                    "top_logprobs",
                    "invalid_value",
                    "`top_logprobs` needs `logprobs: true`.",
                )),
                (false, _) => Ok(None),
            }
        }
    }
}

/// `cache_salt`: a non-empty string.
pub(super) fn cache_salt(f: &Fields<'_>) -> Result<Option<String>, ApiError> {
    match f.get("cache_salt") {
        None => Ok(None),
        Some(Value::String(s)) if !s.is_empty() => Ok(Some(s.clone())),
        Some(_) => Err(wrong_type("cache_salt", "a non-empty string")),
    }
}

/// What structured output asks the text to be.
#[derive(Debug, Clone, PartialEq)]
pub enum Format {
    /// Any JSON object (`response_format: {"type": "json_object"}`).
    JsonObject,
    /// JSON valid against a schema (`json_schema`, `guided_json`).
    JsonSchema(Value),
    /// Text matching a regular expression, whole (`guided_regex`).
    Regex(String),
    /// Exactly one of these strings (`guided_choice`).
    Choice(Vec<String>),
}

/// Structured output: `response_format`, or one of vLLM's `guided_json`, `guided_regex`,
/// `guided_choice`; at most one.
pub(super) fn format(f: &Fields<'_>) -> Result<Option<Format>, ApiError> {
    let mut found = Vec::new();
    if let Some(v) = f.get("response_format") {
        if let Some(fmt) = response_format(v)? {
            found.push(("response_format", fmt));
        }
    }
    if let Some(v) = f.get("guided_json") {
        let schema = match v {
            Value::String(s) => serde_json::from_str(s).map_err(|e| {
                ApiError::invalid(
                    "guided_json",
                    "invalid_value",
                    format!("`guided_json` is not JSON: {e}"),
                )
            })?,
            Value::Object(_) => v.clone(),
            _ => {
                return Err(wrong_type(
                    "guided_json",
                    "a JSON schema (an object or its text)",
                ))
            }
        };
        found.push(("guided_json", Format::JsonSchema(schema)));
    }
    if let Some(v) = f.get("guided_regex") {
        let rx = v
            .as_str()
            .ok_or_else(|| wrong_type("guided_regex", "a string"))?;
        found.push(("guided_regex", Format::Regex(rx.to_string())));
    }
    if let Some(v) = f.get("guided_choice") {
        let list: Option<Vec<String>> = v
            .as_array()
            .filter(|l| !l.is_empty())
            .and_then(|l| l.iter().map(|c| c.as_str().map(str::to_string)).collect());
        let list =
            list.ok_or_else(|| wrong_type("guided_choice", "a non-empty list of strings"))?;
        found.push(("guided_choice", Format::Choice(list)));
    }
    if found.len() > 1 {
        return Err(ApiError::invalid(
            found[1].0,
            "invalid_value",
            format!(
                "`{}` and `{}` both constrain the output; give one.",
                found[0].0, found[1].0
            ),
        ));
    }
    Ok(found.pop().map(|(_, fmt)| fmt))
}

/// `response_format`: `{"type": "text"}`, `{"type": "json_object"}`, or `{"type": "json_schema",
/// "json_schema": {"name", "schema", "strict", "description"}}`.
fn response_format(v: &Value) -> Result<Option<Format>, ApiError> {
    let param = "response_format";
    match v.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(Format::JsonObject)),
        Some("json_schema") => {
            let schema = v
                .get("json_schema")
                .and_then(|s| s.get("schema"))
                .filter(|s| s.is_object())
                .ok_or_else(|| {
                    wrong_type("response_format.json_schema.schema", "a JSON schema object")
                })?;
            Ok(Some(Format::JsonSchema(schema.clone())))
        }
        _ => Err(ApiError::invalid(
            param,
            "invalid_value",
            "`response_format.type` must be \"text\", \"json_object\" or \"json_schema\".",
        )),
    }
}

/// `stop`: a string or a list of at most 4 non-empty strings.
pub(super) fn stops(v: Option<&Value>) -> Result<Vec<String>, ApiError> {
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

/// `stream_options` (only with `stream: true`): `include_usage`, `continuous_usage_stats`.
pub(super) fn stream_options(v: Option<&Value>, stream: bool) -> Result<(bool, bool), ApiError> {
    let Some(v) = v else {
        return Ok((false, false));
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
    Ok((
        f.bool("include_usage")?.unwrap_or(false),
        f.bool("continuous_usage_stats")?.unwrap_or(false),
    ))
}

/// `n` and `best_of` (each at least 1; `best_of` at least `n`, and equal to it when streaming, as
/// vLLM asks: a stream cannot take back the choices it sent).
pub(super) fn samples(f: &Fields<'_>, stream: bool) -> Result<(usize, usize), ApiError> {
    let n = f.count("n")?.unwrap_or(1);
    let best_of = f.count("best_of")?.unwrap_or(n);
    if best_of < n {
        return Err(ApiError::invalid(
            "best_of",
            "invalid_value",
            format!("`best_of` ({best_of}) must be at least `n` ({n})."),
        ));
    }
    if stream && best_of != n {
        return Err(ApiError::invalid(
            "best_of",
            "unsupported_value",
            "`best_of` must equal `n` when streaming.",
        ));
    }
    Ok((n, best_of))
}

/// vLLM's `use_beam_search` (`n` beams) and `length_penalty` (default 1; a non-default value without
/// beam search is refused, as it would change nothing): the length penalty when on. Whole responses
/// only, without an output constraint, log probabilities or `best_of`, as vLLM's beam search.
pub(super) fn beam_search(f: &Fields<'_>, stream: bool) -> Result<Option<f64>, ApiError> {
    let on = f.bool("use_beam_search")?.unwrap_or(false);
    let penalty = f.number("length_penalty", -10.0, 10.0, true)?;
    if !on {
        if penalty.is_some_and(|p| p != 1.0) {
            return Err(ApiError::invalid(
                "length_penalty",
                "unsupported_value",
                "`length_penalty` applies to beam search only (`use_beam_search`).",
            ));
        }
        return Ok(None);
    }
    let excluded = [
        ("stream", stream),
        ("best_of", f.get("best_of").is_some()),
        (
            "logprobs",
            f.get("logprobs")
                .is_some_and(|v| !v.is_null() && v != &serde_json::Value::Bool(false)),
        ),
        ("response_format", f.get("response_format").is_some()),
        ("guided_json", f.get("guided_json").is_some()),
        ("guided_regex", f.get("guided_regex").is_some()),
        ("guided_choice", f.get("guided_choice").is_some()),
    ];
    if let Some((name, _)) = excluded.iter().find(|(_, set)| *set) {
        return Err(ApiError::invalid(
            name,
            "unsupported_value",
            format!("`{name}` is not supported with beam search."),
        ));
    }
    Ok(Some(f64::from(penalty.unwrap_or(1.0))))
}
