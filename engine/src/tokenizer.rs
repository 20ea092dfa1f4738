//! The tokenizer, built from the GGUF metadata alone: a byte-level BPE over the file's vocabulary
//! and merges (digits split one by one, no prefix space), its control tokens as special tokens,
//! and the chat template the file carries.

use std::path::Path;

use candle_core::quantized::gguf_file::Value;
use serde::Serialize;
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::BPE;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::AddedToken;

use crate::error::{EngineError, Result};
use crate::gguf::Gguf;

/// GGUF token type of a control token (`<|im_start|>`, `<|endoftext|>`, ...).
const CONTROL: i32 = 3;

/// One chat message: a role (`system`, `user`, `assistant`) and its text.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Message {
    /// Who speaks.
    pub role: String,
    /// What is said.
    pub content: String,
}

impl Message {
    /// A message of `role` saying `content`.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
        }
    }

    /// A user message.
    pub fn user(content: impl Into<String>) -> Self {
        Self::new("user", content)
    }

    /// A system message.
    pub fn system(content: impl Into<String>) -> Self {
        Self::new("system", content)
    }
}

/// A byte-level BPE tokenizer built from a GGUF file's `tokenizer.ggml.*` metadata.
///
/// Text is split into digits one by one and GPT-2's byte-level pieces (no space is added in front
/// of the text), so [`Tokenizer::decode`] of [`Tokenizer::encode`] gives the text back exactly. The
/// file's control tokens are special tokens: they are matched whole in the text and never split.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    tokens: Vec<String>,
    special: Vec<u32>,
    eos: u32,
    bos: Option<u32>,
    stop: Vec<u32>,
    chat_template: Option<String>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab", &self.tokens.len())
            .field("special", &self.special.len())
            .field("eos", &self.eos)
            .finish_non_exhaustive()
    }
}

fn tok_err(e: impl std::fmt::Display) -> EngineError {
    EngineError::Tokenizer(e.to_string())
}

impl Tokenizer {
    /// Reads the tokenizer of the GGUF file at `path` (its metadata only, no weights).
    pub fn load(path: impl AsRef<Path>) -> Result<Self> {
        Self::from_gguf(&Gguf::open(path.as_ref())?)
    }

    pub(crate) fn from_gguf(g: &Gguf) -> Result<Self> {
        let model = g.string("tokenizer.ggml.model")?;
        if model != "gpt2" {
            return Err(g.unsupported(format!(
                "tokenizer model {model:?} (only the byte-level BPE \"gpt2\" is supported)"
            )));
        }
        let tokens = strings(g, "tokenizer.ggml.tokens")?;
        let merges = merges(g)?;
        let types = token_types(g, tokens.len())?;
        let id = |key: &str| -> Result<Option<u32>> {
            if !g.content.metadata.contains_key(key) {
                return Ok(None);
            }
            let id = g.usize(key)?;
            if id >= tokens.len() {
                return Err(g.corrupt(format!("{key} {id} is outside the vocabulary")));
            }
            Ok(Some(id as u32))
        };
        let eos = id("tokenizer.ggml.eos_token_id")?
            .ok_or_else(|| g.corrupt("metadata key tokenizer.ggml.eos_token_id is missing"))?;
        let bos = id("tokenizer.ggml.bos_token_id")?;
        let add_bos = matches!(
            g.content.metadata.get("tokenizer.ggml.add_bos_token"),
            Some(Value::Bool(true))
        );
        if add_bos {
            return Err(g.unsupported("tokenizer.ggml.add_bos_token is true"));
        }
        let special: Vec<u32> = (0..tokens.len() as u32)
            .filter(|&i| types[i as usize] == CONTROL)
            .collect();
        let inner = byte_level_bpe(g, &tokens, merges, &special)?;
        let mut stop = vec![eos];
        for name in ["<|im_end|>", "<|endoftext|>"] {
            if let Some(&i) = special.iter().find(|&&i| tokens[i as usize] == name) {
                if !stop.contains(&i) {
                    stop.push(i);
                }
            }
        }
        let chat_template = match g.content.metadata.get("tokenizer.chat_template") {
            Some(Value::String(s)) => Some(s.clone()),
            _ => None,
        };
        Ok(Self {
            inner,
            tokens,
            special,
            eos,
            bos,
            stop,
            chat_template,
        })
    }

    /// The token ids of `text`; special tokens written in the text are recognised whole.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let encoding = self.inner.encode_fast(text, false).map_err(tok_err)?;
        Ok(encoding.get_ids().to_vec())
    }

    /// The text of `ids`, special tokens included (so that `decode(encode(t)) == t`).
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        if let Some(&bad) = ids.iter().find(|&&id| id as usize >= self.tokens.len()) {
            return Err(EngineError::Tokenizer(format!(
                "token id {bad} is outside the vocabulary of {}",
                self.tokens.len()
            )));
        }
        self.inner.decode(ids, false).map_err(tok_err)
    }

    /// The vocabulary entry of `id` (in its byte-level spelling, e.g. `Ġsystem`).
    pub fn token(&self, id: u32) -> Option<&str> {
        self.tokens.get(id as usize).map(String::as_str)
    }

    /// The id of the vocabulary entry `token`.
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// Vocabulary size.
    pub fn vocab_size(&self) -> usize {
        self.tokens.len()
    }

    /// The control tokens (special tokens), by id.
    pub fn special_tokens(&self) -> &[u32] {
        &self.special
    }

    /// The end-of-sequence token (`tokenizer.ggml.eos_token_id`).
    pub fn eos(&self) -> u32 {
        self.eos
    }

    /// The beginning-of-sequence token, when the file names one.
    pub fn bos(&self) -> Option<u32> {
        self.bos
    }

    /// Whether generation stops at `id`: the EOS token, `<|im_end|>` or `<|endoftext|>`.
    pub fn is_stop(&self, id: u32) -> bool {
        self.stop.contains(&id)
    }

    /// The chat template from the metadata (`tokenizer.chat_template`), if any.
    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }

    /// `messages` rendered through the file's chat template (Jinja, as Hugging Face renders it:
    /// blocks trimmed), with the assistant's turn opened when `add_generation_prompt`.
    pub fn render_chat(&self, messages: &[Message], add_generation_prompt: bool) -> Result<String> {
        let template = self
            .chat_template
            .as_deref()
            .ok_or_else(|| EngineError::Template("the model file has no chat template".into()))?;
        let mut env = minijinja::Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.add_function("raise_exception", |message: String| -> Result<String, _> {
            Err(minijinja::Error::new(
                minijinja::ErrorKind::InvalidOperation,
                message,
            ))
        });
        let name = |id: Option<u32>| id.and_then(|i| self.token(i)).unwrap_or("").to_string();
        let ctx = minijinja::context! {
            messages => messages,
            add_generation_prompt => add_generation_prompt,
            bos_token => name(self.bos),
            eos_token => name(Some(self.eos)),
        };
        env.render_str(template, ctx)
            .map_err(|e| EngineError::Template(e.to_string()))
    }

    /// The token ids of `messages` in the chat template.
    pub fn encode_chat(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
    ) -> Result<Vec<u32>> {
        self.encode(&self.render_chat(messages, add_generation_prompt)?)
    }
}

/// The metadata array `key`, every value a string.
fn strings(g: &Gguf, key: &str) -> Result<Vec<String>> {
    g.array(key)?
        .iter()
        .map(|v| match v {
            Value::String(s) => Ok(s.clone()),
            _ => Err(g.corrupt(format!("{key} holds a value that is not a string"))),
        })
        .collect()
}

/// The BPE merges: pairs of tokens, each written `a b`.
fn merges(g: &Gguf) -> Result<Vec<(String, String)>> {
    strings(g, "tokenizer.ggml.merges")?
        .into_iter()
        .map(|s| {
            s.split_once(' ')
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .ok_or_else(|| g.corrupt(format!("merge {s:?} is not two tokens")))
        })
        .collect()
}

/// Each token's type (all normal when the file says nothing), one per token.
fn token_types(g: &Gguf, tokens: usize) -> Result<Vec<i32>> {
    let types: Vec<i32> = match g.content.metadata.get("tokenizer.ggml.token_type") {
        Some(Value::Array(values)) => values
            .iter()
            .map(|v| {
                v.to_i32()
                    .map_err(|_| g.corrupt("a token type is not an i32"))
            })
            .collect::<Result<_>>()?,
        _ => vec![1; tokens],
    };
    if types.len() != tokens {
        return Err(g.corrupt(format!("{} token types for {tokens} tokens", types.len())));
    }
    Ok(types)
}

/// The byte-level BPE over `tokens` and `merges`: digits one by one, no prefix space, the
/// `special` (control) tokens recognised whole.
fn byte_level_bpe(
    g: &Gguf,
    tokens: &[String],
    merges: Vec<(String, String)>,
    special: &[u32],
) -> Result<tokenizers::Tokenizer> {
    let mut vocab = ahash::AHashMap::with_capacity(tokens.len());
    for (i, token) in tokens.iter().enumerate() {
        if vocab.insert(token.clone(), i as u32).is_some() {
            return Err(g.corrupt(format!("token {token:?} appears twice in the vocabulary")));
        }
    }
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .build()
        .map_err(|e| g.corrupt(format!("the BPE merges do not fit the vocabulary: {e}")))?;
    let mut inner = tokenizers::Tokenizer::new(bpe);
    let pre: Vec<PreTokenizerWrapper> = vec![
        Digits::new(true).into(),
        ByteLevel::new(false, true, true).into(),
    ];
    inner.with_pre_tokenizer(Some(Sequence::new(pre)));
    inner.with_decoder(Some(ByteLevelDecoder::default()));
    inner
        .add_special_tokens(
            special
                .iter()
                .map(|&i| AddedToken::from(tokens[i as usize].clone(), true)),
        )
        .map_err(tok_err)?;
    Ok(inner)
}
