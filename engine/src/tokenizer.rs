//! The tokenizer, built from the GGUF metadata alone: a byte-level BPE over the file's vocabulary
//! and merges (digits split one by one, no prefix space; `tokenizer.ggml.model` `gpt2`), or a
//! SentencePiece BPE over its pieces and scores (`llama`, as Gemma's files have it), its control
//! tokens as special tokens, and the chat template the file carries.

use std::path::Path;

use candle_core::quantized::gguf_file::Value;
use serde::Serialize;
use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::models::bpe::BPE;
use tokenizers::normalizers::replace::Replace;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::AddedToken;

use crate::error::{EngineError, Result};
use crate::gguf::Gguf;

/// GGUF token type of a normal token (a piece of the text).
const NORMAL: i32 = 1;
/// GGUF token type of a control token (`<|im_start|>`, `<|endoftext|>`, ...).
const CONTROL: i32 = 3;
/// GGUF token type of an unknown token.
const UNKNOWN: i32 = 2;
/// GGUF token type of an unused token.
const UNUSED: i32 = 5;
/// GGUF token type of a user-defined token (Gemma's runs of newlines, spaces and tabs, ...):
/// always matched whole in the text, as llama.cpp does.
const USER_DEFINED: i32 = 4;

/// SentencePiece's spelling of a space.
const SPACE: &str = "\u{2581}";

/// Gemma's turn format (`engine/templates/gemma-turns.jinja`), for a Gemma file without a template
/// of its own, given by hand (`--chat-template`): a system message is put in front of the first user
/// turn, `assistant` is called `model`. Never applied unasked: a base model has no turn format.
pub const GEMMA_TURNS: &str = include_str!("../templates/gemma-turns.jinja");

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

/// A tokenizer built from a GGUF file's `tokenizer.ggml.*` metadata.
///
/// For `tokenizer.ggml.model` `gpt2` (SmolLM2), a byte-level BPE: text is split into digits one
/// by one and GPT-2's byte-level pieces (no space is added in front of the text). For `llama`
/// (Gemma's SentencePiece), a BPE over the pieces whose merges are the file's scores (every split
/// of a piece into two pieces, the higher-scored piece merged first, as SentencePiece and
/// llama.cpp merge), spaces spelt `▁`, characters outside the vocabulary as their UTF-8 bytes
/// (`<0xNN>`), no space added in front. Either way [`Tokenizer::decode`] of
/// [`Tokenizer::encode`] gives the text back exactly. The file's control tokens are special
/// tokens, and its user-defined tokens are matched whole in the text too.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    tokens: Vec<String>,
    /// Each token's GGUF type.
    types: Vec<i32>,
    /// Byte-level BPE ("gpt2"), else SentencePiece ("llama").
    byte_level: bool,
    special: Vec<u32>,
    eos: u32,
    bos: Option<u32>,
    add_bos: bool,
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
    /// The bytes each token stands for in the text, by id: a byte-level entry's bytes (`Ġ` is a
    /// space), a SentencePiece entry's (`▁` is a space, `<0xNN>` one byte), a user-defined entry's
    /// text; `None` for a token that is never text (control, unknown, unused). What a grammar
    /// engine matches a token against.
    pub fn token_bytes(&self) -> Vec<Option<Vec<u8>>> {
        let bytes = byte_level_bytes();
        self.tokens
            .iter()
            .zip(&self.types)
            .map(|(t, &ty)| match ty {
                CONTROL | UNKNOWN | UNUSED => None,
                USER_DEFINED => Some(t.as_bytes().to_vec()),
                _ if self.byte_level => t.chars().map(&bytes).collect(),
                _ => Some(sentencepiece_bytes(t)),
            })
            .collect()
    }
    /// Reads the tokenizer of the GGUF file at `path` (its metadata only, no weights).
    pub fn load(path: impl AsRef<Path>) -> Result<Self> {
        Self::from_gguf(&Gguf::open(path.as_ref())?)
    }

    pub(crate) fn from_gguf(g: &Gguf) -> Result<Self> {
        let model = g.string("tokenizer.ggml.model")?;
        if model != "gpt2" && model != "llama" {
            return Err(g.unsupported(format!(
                "tokenizer model {model:?} (supported: the byte-level BPE \"gpt2\", \
                 SentencePiece's \"llama\")"
            )));
        }
        let tokens = strings(g, "tokenizer.ggml.tokens")?;
        let types = token_types(g, tokens.len())?;
        let (eos, bos, add_bos) = Self::ids(g, &tokens)?;
        let special: Vec<u32> = (0..tokens.len() as u32)
            .filter(|&i| types[i as usize] == CONTROL)
            .collect();
        let inner = if model == "gpt2" {
            byte_level_bpe(g, &tokens, merges(g)?, &special)?
        } else {
            sentencepiece_bpe(g, &tokens, &types)?
        };
        let mut stop = vec![eos];
        for name in ["<|im_end|>", "<|endoftext|>", "<end_of_turn>"] {
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
            types,
            byte_level: model == "gpt2",
            special,
            eos,
            bos,
            add_bos,
            stop,
            chat_template,
        })
    }

    /// The EOS and BOS tokens and whether a BOS token starts every encoding.
    fn ids(g: &Gguf, tokens: &[String]) -> Result<(u32, Option<u32>, bool)> {
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
        if add_bos && bos.is_none() {
            return Err(g.corrupt(
                "tokenizer.ggml.add_bos_token is true and tokenizer.ggml.bos_token_id is missing",
            ));
        }
        Ok((eos, bos, add_bos))
    }

    /// The token ids of `text`, with the BOS token in front when the file says so
    /// ([`Tokenizer::adds_bos`]); special tokens written in the text are recognised whole.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let mut ids = self.encode_text(text)?;
        if let (true, Some(bos)) = (self.add_bos, self.bos) {
            ids.insert(0, bos);
        }
        Ok(ids)
    }

    /// Whether [`Tokenizer::encode`] puts the BOS token in front (`tokenizer.ggml.add_bos_token`).
    pub fn adds_bos(&self) -> bool {
        self.add_bos
    }

    /// The token ids of `text` alone, no BOS token added; special tokens written in the text are
    /// recognised whole.
    pub fn encode_text(&self, text: &str) -> Result<Vec<u32>> {
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

    /// Whether generation stops at `id`: the EOS token, `<|im_end|>`, `<|endoftext|>` or
    /// `<end_of_turn>`.
    pub fn is_stop(&self, id: u32) -> bool {
        self.stop.contains(&id)
    }

    /// The tokens [`Tokenizer::is_stop`] stops at.
    pub fn stop_tokens(&self) -> &[u32] {
        &self.stop
    }

    /// This tokenizer as Hugging Face's `tokenizer.json` (what the `tokenizers` library and the
    /// serving frameworks that load a model folder read): the same vocabulary, merges, splitting
    /// and special tokens, so a frontend that tokenizes with it sends this engine the ids
    /// [`Tokenizer::encode`] would give (the BOS token, when the file adds one, is not in it:
    /// [`Tokenizer::adds_bos`] says so, as `tokenizer_config.json`'s `add_bos_token`).
    pub fn to_hf_json(&self) -> Result<String> {
        self.inner.to_string(false).map_err(tok_err)
    }

    /// The chat template: the file's (`tokenizer.chat_template`), or the one given with
    /// [`Tokenizer::set_chat_template`]; `None`: chat is refused (a base model has no turn format).
    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }

    /// Renders chats through `template` (Jinja, as Hugging Face's `chat_template`) instead of the
    /// file's (e.g. [`GEMMA_TURNS`] for a Gemma file without one).
    pub fn set_chat_template(&mut self, template: impl Into<String>) {
        self.chat_template = Some(template.into());
    }

    /// `messages` rendered through the file's chat template (Jinja, as Hugging Face renders it:
    /// blocks trimmed), with the assistant's turn opened when `add_generation_prompt`.
    pub fn render_chat(&self, messages: &[Message], add_generation_prompt: bool) -> Result<String> {
        let template = self.chat_template.as_deref().ok_or_else(|| {
            EngineError::Template(
                "the model file has no chat template (no tokenizer.chat_template): give one \
                     (--chat-template FILE), or send the text as is"
                    .into(),
            )
        })?;
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

    /// The token ids of `messages` in the chat template; the BOS token in front when the file
    /// says so, once (a template that writes `bos_token` already has it).
    pub fn encode_chat(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
    ) -> Result<Vec<u32>> {
        let mut ids = self.encode_text(&self.render_chat(messages, add_generation_prompt)?)?;
        if let (true, Some(bos)) = (self.add_bos, self.bos) {
            if ids.first() != Some(&bos) {
                ids.insert(0, bos);
            }
        }
        Ok(ids)
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

/// The metadata array `tokenizer.ggml.scores`, one per token.
fn scores(g: &Gguf, tokens: usize) -> Result<Vec<f32>> {
    let key = "tokenizer.ggml.scores";
    let scores: Vec<f32> = g
        .array(key)?
        .iter()
        .map(|v| {
            v.to_f32()
                .map_err(|_| g.corrupt(format!("{key} holds a value that is not an f32")))
        })
        .collect::<Result<_>>()?;
    if scores.len() != tokens {
        return Err(g.corrupt(format!("{} scores for {tokens} tokens", scores.len())));
    }
    Ok(scores)
}

/// SentencePiece's BPE as merges: every split of a normal piece into two normal pieces, the
/// pieces in order of their score (highest first, ties by id), each piece's splits left to right.
fn sentencepiece_merges(
    tokens: &[String],
    types: &[i32],
    scores: &[f32],
    vocab: &ahash::AHashMap<String, u32>,
) -> Vec<(String, String)> {
    let normal = |t: &str| vocab.get(t).is_some_and(|&i| types[i as usize] == NORMAL);
    let mut order: Vec<usize> = (0..tokens.len())
        .filter(|&i| types[i] == NORMAL && tokens[i].chars().nth(1).is_some())
        .collect();
    order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
    let mut merges = Vec::with_capacity(2 * order.len());
    for i in order {
        let t = &tokens[i];
        for (at, _) in t.char_indices().skip(1) {
            let (a, b) = t.split_at(at);
            if normal(a) && normal(b) {
                merges.push((a.to_string(), b.to_string()));
            }
        }
    }
    merges
}

/// The SentencePiece BPE tokenizer of a `llama` tokenizer file: spaces as `▁` (none added in
/// front), merges by score, byte fallback, control tokens special and user-defined tokens matched
/// whole.
fn sentencepiece_bpe(g: &Gguf, tokens: &[String], types: &[i32]) -> Result<tokenizers::Tokenizer> {
    if !matches!(
        g.content.metadata.get("tokenizer.ggml.add_space_prefix"),
        Some(Value::Bool(false))
    ) {
        return Err(g.unsupported(
            "a SentencePiece tokenizer that adds a space in front (tokenizer.ggml.add_space_prefix \
             is not false)",
        ));
    }
    let scores = scores(g, tokens.len())?;
    let mut vocab = ahash::AHashMap::with_capacity(tokens.len());
    for (i, token) in tokens.iter().enumerate() {
        if vocab.insert(token.clone(), i as u32).is_some() {
            return Err(g.corrupt(format!("token {token:?} appears twice in the vocabulary")));
        }
    }
    if let Some(b) = (0..=255u8).find(|b| !vocab.contains_key(&format!("<0x{b:02X}>"))) {
        return Err(g.corrupt(format!("the byte-fallback token <0x{b:02X}> is missing")));
    }
    let merges = sentencepiece_merges(tokens, types, &scores, &vocab);
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .byte_fallback(true)
        .build()
        .map_err(|e| g.corrupt(format!("the SentencePiece pieces do not make a BPE: {e}")))?;
    let mut inner = tokenizers::Tokenizer::new(bpe);
    inner
        .with_normalizer(Some(Replace::new(" ", SPACE).map_err(tok_err)?))
        .map_err(tok_err)?;
    let decoders = vec![
        Replace::new(SPACE, " ").map_err(tok_err)?.into(),
        ByteFallback::new().into(),
        Fuse::new().into(),
    ];
    inner.with_decoder(Some(DecoderSequence::new(decoders)));
    let added = (0..tokens.len()).filter_map(|i| match types[i] {
        CONTROL => Some(AddedToken::from(tokens[i].clone(), true)),
        USER_DEFINED => Some(AddedToken::from(tokens[i].clone(), false).normalized(false)),
        _ => None,
    });
    let (control, user): (Vec<AddedToken>, Vec<AddedToken>) = added.partition(|t| t.special);
    inner.add_special_tokens(control).map_err(tok_err)?;
    inner.add_tokens(user).map_err(tok_err)?;
    Ok(inner)
}

/// Byte-level BPE's alphabet read back: the printable bytes stand for themselves, the other 68 for
/// U+0100 on in byte order (GPT-2's map).
fn byte_level_bytes() -> impl Fn(char) -> Option<u8> {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    let mut shifted = [0u8; 68];
    let mut n = 0;
    for b in 0..=255u8 {
        if !printable(b) {
            shifted[n] = b;
            n += 1;
        }
    }
    move |c: char| {
        let code = u32::from(c);
        match u8::try_from(code) {
            Ok(b) if printable(b) => Some(b),
            _ => code
                .checked_sub(256)
                .and_then(|i| shifted.get(i as usize).copied()),
        }
    }
}

/// A SentencePiece entry's bytes: `<0xNN>` is one byte, `▁` a space.
fn sentencepiece_bytes(t: &str) -> Vec<u8> {
    let hex = t
        .strip_prefix("<0x")
        .and_then(|h| h.strip_suffix('>'))
        .filter(|h| h.len() == 2)
        .and_then(|h| u8::from_str_radix(h, 16).ok());
    hex.map_or_else(|| t.replace(SPACE, " ").into_bytes(), |b| vec![b])
}
