//! Structured output: `response_format` (`json_object`, `json_schema`) and vLLM's `guided_json`,
//! `guided_regex`, `guided_choice`, compiled by llguidance (the grammar engine vLLM, SGLang and
//! TensorRT-LLM use) into a per-request constraint that masks, before each draw, every token that
//! cannot continue the text it must be.
//!
//! The token tables are built once per model, on the first request that asks (a few hundred
//! milliseconds for a 262k vocabulary), on the blocking thread that checks requests. JSON is asked
//! for compact (no free whitespace between tokens, as OpenAI's structured outputs), so a model
//! cannot run on in blank lines.

use std::sync::{Arc, OnceLock};

use kvsched_engine::{Guide, GuideError, Tokenizer};
use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{SimpleVob, TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};
use llguidance::{JsonCompileOptions, Matcher, ParserFactory};
use serde_json::{json, Value};

use crate::api::Format;
use crate::error::ApiError;

/// The model's vocabulary as llguidance reads it.
struct Vocabulary {
    trie: TokTrie,
}

impl TokenizerEnv for Vocabulary {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        self.trie.greedy_tokenize(s)
    }
}

/// Compiles structured-output requests for one model (its tables built on first use).
#[derive(Default)]
pub struct Guides {
    factory: OnceLock<Result<Arc<ParserFactory>, GuideError>>,
}

impl std::fmt::Debug for Guides {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Guides")
            .field("built", &self.factory.get().is_some())
            .finish()
    }
}

impl Guides {
    /// The constraint `format` asks for, over `tok`'s vocabulary; a grammar llguidance refuses
    /// (an invalid schema or regex) is a 400 naming `response_format`.
    pub fn guide(&self, tok: &Tokenizer, format: &Format) -> Result<Box<dyn Guide>, ApiError> {
        let factory = self
            .factory
            .get_or_init(|| factory(tok))
            .as_ref()
            .map_err(|e| ApiError::engine(format!("structured output is unavailable: {e}")))?;
        let invalid = |e: &dyn std::fmt::Display| {
            ApiError::invalid(
                "response_format",
                "invalid_value",
                format!("The output constraint does not compile: {e}"),
            )
        };
        let parser = factory
            .create_parser(grammar(format))
            .map_err(|e| invalid(&e))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(invalid(&e));
        }
        Ok(Box::new(Constraint { matcher }))
    }
}

/// The tables of `tok`'s vocabulary: each token's bytes (a control token gets a name no text
/// matches), the model's stop tokens as the ends a grammar may allow.
fn factory(tok: &Tokenizer) -> Result<Arc<ParserFactory>, GuideError> {
    let words: Vec<Vec<u8>> = tok
        .token_bytes()
        .into_iter()
        .enumerate()
        .map(|(id, b)| {
            b.unwrap_or_else(|| {
                let mut w = vec![TokTrie::SPECIAL_TOKEN_MARKER];
                w.extend_from_slice(tok.token(id as u32).unwrap_or_default().as_bytes());
                w
            })
        })
        .collect();
    let stops = tok.stop_tokens();
    let info = TokRxInfo::new(words.len() as u32, stops[0]);
    let trie = TokTrie::from(&info, &words).with_eos_tokens(stops);
    let env: TokEnv = Arc::new(Vocabulary { trie });
    let mut factory = ParserFactory::new_simple(&env).map_err(|e| GuideError(e.to_string()))?;
    factory.quiet();
    Ok(Arc::new(factory))
}

/// `format` as a grammar.
fn grammar(format: &Format) -> TopLevelGrammar {
    let compact = |mut schema: Value| {
        if schema.is_object() {
            let options = JsonCompileOptions {
                whitespace_flexible: false,
                ..JsonCompileOptions::default()
            };
            options.apply_to(&mut schema);
        }
        TopLevelGrammar::from_json_schema(schema)
    };
    match format {
        Format::JsonObject => compact(json!({"type": "object"})),
        Format::JsonSchema(schema) => compact(schema.clone()),
        Format::Regex(rx) => TopLevelGrammar::from_regex(rx),
        Format::Choice(choices) => {
            // A Lark string literal is a JSON string.
            let literals: Vec<String> = choices
                .iter()
                .map(|c| Value::from(c.as_str()).to_string())
                .collect();
            TopLevelGrammar::from_lark(format!("start: {}", literals.join(" | ")))
        }
    }
}

/// One request's constraint.
struct Constraint {
    matcher: Matcher,
}

impl Guide for Constraint {
    fn mask(&mut self, logits: &mut [f32]) -> Result<(), GuideError> {
        // Once the text is complete, only a stop token is allowed.
        let allowed = self
            .matcher
            .compute_mask_or_eos()
            .map_err(|e| GuideError(e.to_string()))?;
        apply(&allowed, logits);
        Ok(())
    }

    fn commit(&mut self, token: u32) -> Result<(), GuideError> {
        if self.matcher.is_stopped() {
            return Ok(());
        }
        self.matcher
            .consume_token(token)
            .map_err(|e| GuideError(e.to_string()))
    }
}

/// Sets every logit `allowed` does not hold to negative infinity (and any past the vocabulary):
/// a word of 32 tokens at a time.
fn apply(allowed: &SimpleVob, logits: &mut [f32]) {
    let n = allowed.len().min(logits.len());
    for (w, &bits) in allowed.as_slice().iter().enumerate() {
        let from = w * 32;
        if from >= n {
            break;
        }
        let word = &mut logits[from..(from + 32).min(n)];
        match bits {
            u32::MAX => {}
            0 => word.fill(f32::NEG_INFINITY),
            _ => {
                for (i, l) in word.iter_mut().enumerate() {
                    if bits >> i & 1 == 0 {
                        *l = f32::NEG_INFINITY;
                    }
                }
            }
        }
    }
    logits[n..].fill(f32::NEG_INFINITY);
}
