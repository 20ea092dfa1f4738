//! A request's prompt: a completions prompt (text or token ids), or chat messages.

use kvsched_engine::Message;
use serde_json::Value;

use super::fields::{wrong_type, Fields};
use super::Prompt;
use crate::error::ApiError;

/// A completions prompt: a string, a list of one string, a list of token ids, or a list of one
/// list of token ids.
pub(super) fn prompt(v: &Value) -> Result<Prompt, ApiError> {
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
pub(super) fn messages(v: &Value) -> Result<Vec<Message>, ApiError> {
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
    f.only(
        &[
            "role",
            "content",
            "name",
            "tool_call_id",
            "tool_calls",
            "refusal",
        ],
        &format!("{at}."),
    )?;
    if f.get("tool_calls")
        .is_some_and(|c| !c.as_array().is_some_and(Vec::is_empty))
    {
        return Err(ApiError::invalid(
            &format!("{at}.tool_calls"),
            "unsupported_value",
            "Tool calls are not supported: this server gives no tool calls.",
        ));
    }
    let role = match f.get("role").and_then(Value::as_str) {
        Some(r @ ("system" | "user" | "assistant" | "tool")) => r.to_string(),
        Some("developer") => "system".to_string(),
        Some(r) => {
            return Err(ApiError::invalid(
                &format!("{at}.role"),
                "invalid_value",
                format!("Role {r:?} is not supported (system, developer, user, assistant, tool)."),
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
