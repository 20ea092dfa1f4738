//! A request's fields, read one at a time: each reader names its field when it refuses.

use serde_json::{Map, Value};

use crate::error::ApiError;

/// A request's fields, read one at a time.
pub(super) struct Fields<'a>(pub(super) &'a Map<String, Value>);

impl Fields<'_> {
    /// The field, `None` when absent or null.
    pub(super) fn get(&self, name: &str) -> Option<&Value> {
        self.0.get(name).filter(|v| !v.is_null())
    }

    /// Refuses a field outside `allowed` (`at` names the object for the message).
    pub(super) fn only(&self, allowed: &[&str], at: &str) -> Result<(), ApiError> {
        match self.0.keys().find(|k| !allowed.contains(&k.as_str())) {
            Some(k) => Err(ApiError::invalid(
                &format!("{at}{k}"),
                "unknown_field",
                format!("Unrecognized request argument supplied: {at}{k}"),
            )),
            None => Ok(()),
        }
    }

    pub(super) fn required(&self, name: &str) -> Result<&Value, ApiError> {
        self.get(name).ok_or_else(|| {
            ApiError::invalid(
                name,
                "missing_field",
                format!("`{name}` is a required field."),
            )
        })
    }

    pub(super) fn string(&self, name: &str) -> Result<String, ApiError> {
        match self.required(name)? {
            Value::String(s) => Ok(s.clone()),
            _ => Err(wrong_type(name, "a string")),
        }
    }

    pub(super) fn bool(&self, name: &str) -> Result<Option<bool>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(_) => Err(wrong_type(name, "a boolean")),
        }
    }

    /// A token count of at least 1: an integer of any size (one past `usize` reads as `usize::MAX`,
    /// which the context-length check then refuses, as vLLM does), or a number with no fraction.
    pub(super) fn count(&self, name: &str) -> Result<Option<usize>, ApiError> {
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
    pub(super) fn number(
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

    pub(super) fn seed(&self) -> Result<Option<u64>, ApiError> {
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
    pub(super) fn unsupported_defaults(&self) -> Result<(), ApiError> {
        let defaults: &[AtDefault] = &[
            (
                "echo",
                |v| v == &Value::Bool(false),
                "no echo of the prompt",
            ),
            ("suffix", |v| v.as_str() == Some(""), "no suffix"),
            ("prompt_logprobs", |_| false, "no prompt log probabilities"),
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
        if self.get("parallel_tool_calls").is_some() {
            self.bool("parallel_tool_calls")?;
        }
        Ok(())
    }
}

/// A field accepted only at its default: its name, whether a value is the default, what the server
/// gives instead.
type AtDefault = (&'static str, fn(&Value) -> bool, &'static str);

pub(super) fn wrong_type(name: &str, what: &str) -> ApiError {
    ApiError::invalid(name, "invalid_type", format!("`{name}` must be {what}."))
}

impl Fields<'_> {
    /// An integer in `[low, high]`.
    pub(super) fn integer(&self, name: &str, low: i64, high: i64) -> Result<Option<i64>, ApiError> {
        let Some(v) = self.get(name) else {
            return Ok(None);
        };
        let n = v.as_i64().ok_or_else(|| wrong_type(name, "an integer"))?;
        if !(low..=high).contains(&n) {
            return Err(ApiError::invalid(
                name,
                "invalid_value",
                format!("`{name}` must be in [{low}, {high}], got {n}."),
            ));
        }
        Ok(Some(n))
    }

    /// A list of token ids.
    pub(super) fn token_ids(&self, name: &str) -> Result<Vec<u32>, ApiError> {
        let Some(v) = self.get(name) else {
            return Ok(Vec::new());
        };
        v.as_array()
            .and_then(|l| {
                l.iter()
                    .map(|t| t.as_u64().and_then(|t| u32::try_from(t).ok()))
                    .collect::<Option<Vec<u32>>>()
            })
            .ok_or_else(|| wrong_type(name, "a list of token ids"))
    }
}

/// A request body: a JSON object, else a 400 (`invalid_json`, `invalid_type`).
pub fn object(body: &[u8]) -> Result<Map<String, Value>, ApiError> {
    match serde_json::from_slice(body) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err(ApiError::invalid(
            "",
            "invalid_type",
            "The body must be a JSON object.",
        )),
        Err(e) => Err(ApiError::invalid(
            "",
            "invalid_json",
            format!("The body is not valid JSON: {e}"),
        )),
    }
}
