//! The bodies of vLLM's `POST /tokenize` (`prompt`, or chat `messages` with
//! `add_generation_prompt`) and `POST /detokenize` (`tokens`).

use serde_json::Value;

use super::fields::{object, wrong_type, Fields};
use super::{prompt, Prompt};
use crate::error::ApiError;

/// What `/tokenize` is asked.
#[derive(Debug, Clone, PartialEq)]
pub struct Tokenize {
    /// The model named, if one is.
    pub model: Option<String>,
    /// The text, or the chat messages.
    pub prompt: Prompt,
    /// Chat: end with the assistant's turn opened (default true).
    pub add_generation_prompt: bool,
}

fn model(f: &Fields<'_>) -> Result<Option<String>, ApiError> {
    match f.get("model") {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(wrong_type("model", "a string")),
    }
}

/// Parses a `/tokenize` body.
pub fn parse_tokenize(body: &[u8]) -> Result<Tokenize, ApiError> {
    let map = object(body)?;
    let f = Fields(&map);
    f.only(
        &[
            "model",
            "prompt",
            "messages",
            "add_generation_prompt",
            "add_special_tokens",
        ],
        "",
    )?;
    let prompt = match (f.get("prompt"), f.get("messages")) {
        (Some(p), None) => prompt::prompt(p)?,
        (None, Some(m)) => Prompt::Chat(prompt::messages(m)?),
        _ => {
            return Err(ApiError::invalid(
                "prompt",
                "missing_field",
                "Give `prompt` or `messages` (one of them).",
            ))
        }
    };
    if f.bool("add_special_tokens")? == Some(false) {
        return Err(ApiError::invalid(
            "add_special_tokens",
            "unsupported_value",
            "`add_special_tokens: false` is not supported: the model's tokens are always added.",
        ));
    }
    Ok(Tokenize {
        model: model(&f)?,
        prompt,
        add_generation_prompt: f.bool("add_generation_prompt")?.unwrap_or(true),
    })
}

/// Parses a `/detokenize` body: the model named, if one is, and the tokens.
pub fn parse_detokenize(body: &[u8]) -> Result<(Option<String>, Vec<u32>), ApiError> {
    let map = object(body)?;
    let f = Fields(&map);
    f.only(&["model", "tokens"], "")?;
    f.required("tokens")?;
    Ok((model(&f)?, f.token_ids("tokens")?))
}
