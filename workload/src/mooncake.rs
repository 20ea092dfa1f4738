//! Reader for the Mooncake traces (`kvcache-ai/Mooncake`, `FAST25-release/traces/*.jsonl`;
//! Apache-2.0, Qin et al., FAST 2025).
//!
//! One JSON object per line:
//!
//! ```text
//! {"timestamp": 0, "input_length": 6758, "output_length": 500, "hash_ids": [0, 1, 2, 3]}
//! ```
//!
//! - `timestamp`: arrival time in **milliseconds** from the start of the trace (a non-negative number).
//! - `input_length`, `output_length`: prompt and output token counts (`u32`).
//! - `hash_ids`: remapped prefix-block hashes with [`BLOCK_TOKENS`] tokens a block; two requests whose
//!   lists start alike share that KV prefix. Kept as [`Arrival::prefix_blocks`].
//!
//! All four fields are required and no other is allowed (a misspelled field is named, with the
//! field it fails to give). Rows are first decoded into a typed struct; only when that fails is the
//! line decoded again field by field, to say which field is at fault.

use serde::{Deserialize, Deserializer};
use serde_json::Value;

use super::{
    clip, lines, Arrival, Builder, Ctx, TraceError, TraceErrorKind, TraceFormat, Workload,
};

/// Tokens per prefix block in the Mooncake traces (`hash_ids`).
pub const BLOCK_TOKENS: u32 = 512;

/// The required fields, in the order errors are looked for.
pub const FIELDS: [&str; 4] = ["timestamp", "input_length", "output_length", "hash_ids"];

/// The fast path: a well-formed row.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Row {
    timestamp: f64,
    input_length: u32,
    output_length: u32,
    hash_ids: Vec<u64>,
}

/// The diagnostic path: every field optional and untyped (`None` = absent; `Some(Null)` = `null`).
#[derive(Deserialize)]
struct LooseRow {
    #[serde(default, deserialize_with = "present")]
    timestamp: Option<Value>,
    #[serde(default, deserialize_with = "present")]
    input_length: Option<Value>,
    #[serde(default, deserialize_with = "present")]
    output_length: Option<Value>,
    #[serde(default, deserialize_with = "present")]
    hash_ids: Option<Value>,
    /// The fields the format does not have.
    #[serde(flatten)]
    unknown: std::collections::BTreeMap<String, Value>,
}

fn present<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Value>, D::Error> {
    Value::deserialize(d).map(Some)
}

/// Parses Mooncake JSON lines. See the [module docs](self).
pub(crate) fn parse(text: &str, ctx: Ctx<'_>) -> Result<Workload, TraceError> {
    let mut b = Builder::new();
    for (n, line) in lines(text) {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        // A JSON array would decode into the struct positionally; the format is objects only.
        if !line.starts_with('{') {
            return Err(match serde_json::from_str::<serde::de::IgnoredAny>(line) {
                Ok(_) => ctx.err(n, None, TraceErrorKind::NotAnObject),
                Err(e) => ctx.err(n, None, TraceErrorKind::Json(e.to_string())),
            });
        }
        let row: Row = serde_json::from_str(line).map_err(|e| diagnose(ctx, n, line, &e))?;
        if row.timestamp < 0.0 {
            return Err(ctx.err(
                n,
                Some(FIELDS[0]),
                TraceErrorKind::Negative(row.timestamp.to_string()),
            ));
        }
        b.push(Arrival {
            at_ms: row.timestamp,
            prompt_tokens: row.input_length,
            output_tokens: row.output_length,
            adapter: None,
            prefix_blocks: row.hash_ids,
        });
    }
    Ok(b.finish(ctx.source(TraceFormat::Mooncake), Some(BLOCK_TOKENS)))
}

/// Works out which field made the typed decode fail.
fn diagnose(ctx: Ctx<'_>, n: usize, line: &str, typed_err: &serde_json::Error) -> TraceError {
    let loose: LooseRow = match serde_json::from_str(line) {
        Ok(l) => l,
        Err(e) => return ctx.err(n, None, TraceErrorKind::Json(e.to_string())),
    };
    let fields = [
        &loose.timestamp,
        &loose.input_length,
        &loose.output_length,
        &loose.hash_ids,
    ];
    if let Some(unknown) = loose.unknown.keys().next() {
        let missing = FIELDS
            .into_iter()
            .zip(fields)
            .find_map(|(name, v)| v.is_none().then_some(name));
        let reason = TraceErrorKind::UnknownField {
            name: clip(unknown),
            missing,
        };
        return ctx.err(n, None, reason);
    }
    for (name, value) in FIELDS.into_iter().zip(fields) {
        let Some(v) = value else {
            return ctx.err(n, Some(name), TraceErrorKind::MissingField);
        };
        let problem = match name {
            "timestamp" => check_timestamp(v),
            "hash_ids" => check_hash_ids(v),
            _ => check_tokens(v),
        };
        if let Some(reason) = problem {
            return ctx.err(n, Some(name), reason);
        }
    }
    // Every field checks out on its own (e.g. a duplicated key): report serde_json's message.
    ctx.err(n, None, TraceErrorKind::Json(typed_err.to_string()))
}

fn wrong(expected: &'static str, v: &Value) -> TraceErrorKind {
    TraceErrorKind::WrongType {
        expected,
        found: clip(&v.to_string()),
    }
}

fn check_timestamp(v: &Value) -> Option<TraceErrorKind> {
    match v.as_f64() {
        None => Some(wrong("a number of milliseconds", v)),
        Some(t) if t < 0.0 => Some(TraceErrorKind::Negative(v.to_string())),
        Some(_) => None,
    }
}

fn check_tokens(v: &Value) -> Option<TraceErrorKind> {
    match v {
        Value::Number(num) if num.is_u64() => match num.as_u64() {
            Some(x) if u32::try_from(x).is_ok() => None,
            _ => Some(TraceErrorKind::OutOfRange {
                value: num.to_string(),
                max: u64::from(u32::MAX),
            }),
        },
        Value::Number(num) if num.is_i64() => Some(TraceErrorKind::Negative(num.to_string())),
        _ => Some(wrong("a non-negative integer token count", v)),
    }
}

fn check_hash_ids(v: &Value) -> Option<TraceErrorKind> {
    match v {
        Value::Array(items) => items
            .iter()
            .find(|x| x.as_u64().is_none())
            .map(|bad| wrong("an array of non-negative integers", bad)),
        _ => Some(wrong("an array of non-negative integers", v)),
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::{load, parse as parse_any};

    fn err_of(text: &str) -> TraceError {
        parse_any(text, Path::new("mc.jsonl"), Some(TraceFormat::Mooncake)).unwrap_err()
    }

    #[test]
    fn rows_keep_times_lengths_and_blocks() {
        let text = "{\"timestamp\": 27, \"input_length\": 600, \"output_length\": 5, \"hash_ids\": [0, 9]}\n\
                    \n\
                    {\"hash_ids\": [0], \"output_length\": 3, \"input_length\": 12, \"timestamp\": 3.5}\n";
        let w = parse_any(text, Path::new("mc.jsonl"), None).unwrap();
        assert_eq!(w.prefix_block_tokens, Some(512));
        assert_eq!(w.len(), 2);
        assert_eq!(
            w.arrivals[0],
            Arrival {
                at_ms: 3.5,
                prompt_tokens: 12,
                output_tokens: 3,
                adapter: None,
                prefix_blocks: vec![0]
            }
        );
        assert_eq!(
            (w.arrivals[1].at_ms, w.arrivals[1].prefix_blocks.as_slice()),
            (27.0, &[0u64, 9][..])
        );
    }

    #[test]
    fn an_unknown_field_is_refused_with_the_field_it_misspells() {
        let typo = "{\"timestamp\": 0, \"input_len\": 9, \"output_length\": 1, \"hash_ids\": [0]}";
        let e = err_of(typo);
        assert_eq!(e.line, Some(1));
        assert_eq!(
            e.reason,
            TraceErrorKind::UnknownField {
                name: "input_len".into(),
                missing: Some("input_length")
            }
        );
        let msg = e.to_string();
        assert!(
            msg.contains("\"input_len\"") && msg.contains("field input_length is missing"),
            "{msg}"
        );
        let extra = "{\"timestamp\": 0, \"input_length\": 9, \"output_length\": 1, \"hash_ids\": [0], \"x\": {\"y\": 1}}";
        let e = err_of(extra);
        assert_eq!(
            e.reason,
            TraceErrorKind::UnknownField {
                name: "x".into(),
                missing: None
            }
        );
        assert!(!e.to_string().contains("missing"), "{e}");
    }

    #[test]
    fn zero_length_rows_are_dropped_and_counted() {
        let text = "{\"timestamp\": 1, \"input_length\": 0, \"output_length\": 5, \"hash_ids\": []}\n\
                    {\"timestamp\": 2, \"input_length\": 7, \"output_length\": 5, \"hash_ids\": [1]}";
        let w = parse_any(text, Path::new("mc.jsonl"), None).unwrap();
        assert_eq!((w.len(), w.dropped_rows), (1, 1));
    }

    #[test]
    fn malformed_lines_name_line_and_field() {
        let ok =
            "{\"timestamp\": 0, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [0]}\n";
        let cases = [
            ("{\"timestamp\": 0, \"input_length\": 1, \"output_length\": 1}", "mc.jsonl:2: field hash_ids: missing field"),
            (
                "{\"timestamp\": 0, \"input_length\": \"abc\", \"output_length\": 1, \"hash_ids\": []}",
                "mc.jsonl:2: field input_length: expected a non-negative integer token count, found \"abc\"",
            ),
            (
                "{\"timestamp\": 0, \"input_length\": 1, \"output_length\": -4, \"hash_ids\": []}",
                "mc.jsonl:2: field output_length: negative (\"-4\")",
            ),
            (
                "{\"timestamp\": 0, \"input_length\": 5000000000, \"output_length\": 1, \"hash_ids\": []}",
                "mc.jsonl:2: field input_length: out of range (\"5000000000\"; at most 4294967295)",
            ),
            (
                "{\"timestamp\": null, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": []}",
                "mc.jsonl:2: field timestamp: expected a number of milliseconds, found null",
            ),
            (
                "{\"timestamp\": -1, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": []}",
                "mc.jsonl:2: field timestamp: negative (\"-1\")",
            ),
            (
                "{\"timestamp\": 1, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [1, \"b\"]}",
                "mc.jsonl:2: field hash_ids: expected an array of non-negative integers, found \"b\"",
            ),
            ("{\"timestamp\": 1, \"input_length\": 1,", "mc.jsonl:2: bad JSON: "),
            ("[0, 1, 1, [0]]", "mc.jsonl:2: not a JSON object"),
            ("timestamp=0", "mc.jsonl:2: bad JSON: "),
            (
                "{\"timestamp\": 0, \"timestamp\": 0, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": []}",
                "mc.jsonl:2: bad JSON: duplicate field",
            ),
        ];
        for (bad, want) in cases {
            let err = err_of(&format!("{ok}{bad}\n{ok}"));
            assert!(err.to_string().starts_with(want), "got {err}, want {want}");
            assert_eq!(err.line, Some(2));
        }
    }

    #[test]
    fn shipped_fixture_has_30_rows_with_consistent_blocks() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/data/mooncake_conversation_head30.jsonl");
        let w = load(path).unwrap();
        assert_eq!(w.len(), 30);
        assert_eq!(w.dropped_rows, 0);
        assert_eq!(w.prefix_block_tokens, Some(BLOCK_TOKENS));
        let first = &w.arrivals[0];
        assert_eq!(
            (first.at_ms, first.prompt_tokens, first.output_tokens),
            (0.0, 6758, 500)
        );
        assert_eq!(first.prefix_blocks, (0..14).collect::<Vec<u64>>());
        // The trace's documented invariant: (len - 1) * 512 < input_length <= len * 512.
        for a in &w.arrivals {
            let blocks = a.prefix_blocks.len() as u64;
            let len = u64::from(a.prompt_tokens);
            assert!((blocks - 1) * 512 < len && len <= blocks * 512, "{a:?}");
        }
    }
}
