//! The engine's one error type.

use std::path::PathBuf;

use kvsched_gpu::MemError;

/// The limit a request exceeds ([`Refusal::TooLong`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    /// The model's context length (positions it was trained for).
    ModelContext,
    /// One request's page table: `max_blocks × tokens_per_block` positions of the engine's KV pool.
    RequestPages,
}

impl std::fmt::Display for Limit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::ModelContext => "the model's context length",
            Self::RequestPages => "one request's page table (max_blocks x tokens_per_block)",
        })
    }
}

/// What an engine on KV groups (a hybrid-attention model: full attention and sliding-window
/// layers) does not do yet ([`EngineError::Grouped`]). `EngineConfig::full_attention_only` serves
/// the model with every layer in one pool, where all of them work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Grouped {
    /// Speculative decoding (draft tokens and their rewind).
    Speculative,
    /// Disaggregated serving: a context-only request or a transferred one (a transfer holds one
    /// table's pages of every layer).
    Disaggregated,
}

impl std::fmt::Display for Grouped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Speculative => "speculative decoding",
            Self::Disaggregated => "disaggregated serving (context-only and transferred requests)",
        })
    }
}

/// Why the engine refused a request at submission (nothing was queued).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Refusal {
    /// The prompt has no tokens.
    #[error("the prompt is empty")]
    EmptyPrompt,
    /// `max_new_tokens` is 0: a request generates at least one token.
    #[error("max_new_tokens is 0: a request generates at least one token")]
    NoNewTokens,
    /// A prompt token is not in the model's vocabulary.
    #[error("prompt token {token} is outside the vocabulary of {vocab} tokens")]
    Token {
        /// The token.
        token: u32,
        /// The vocabulary size.
        vocab: usize,
    },
    /// The prompt and the tokens to generate do not fit a limit.
    #[error("{prompt} prompt tokens + {max_new} new tokens exceed {what} of {limit} tokens")]
    TooLong {
        /// Prompt tokens.
        prompt: usize,
        /// Tokens to generate at most.
        max_new: usize,
        /// The limit, in tokens.
        limit: usize,
        /// Which limit.
        what: Limit,
    },
    /// The request names an adapter that was never registered.
    #[error("unknown adapter {0} (register it with Engine::register_adapter first)")]
    UnknownAdapter(u64),
    /// A beam search's width is 0 or more than the requests the scheduler holds.
    #[error("a beam width of {width}: at least 1, at most the scheduler's {room} requests")]
    BeamWidth {
        /// The width asked for.
        width: usize,
        /// The scheduler's requests.
        room: usize,
    },
    /// Parallel sampling with no sample.
    #[error("no sample: a request draws at least one")]
    NoSamples,
    /// The scheduler refused it (a full request table, a duplicate id, ...).
    #[error("the scheduler refused it: {0}")]
    Scheduler(kvsched_core::Error),
}

/// What went wrong, as one line.
///
/// Errors about a model file name the file first (`path: what is wrong`), and are raised while the
/// file's header and tensor table are checked, before any weight is read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EngineError {
    /// The model file could not be opened or read.
    #[error("{}: cannot read the model file: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// The file does not start with the GGUF magic.
    #[error("{}: not a GGUF file ({found})", path.display())]
    NotGguf {
        /// The file.
        path: PathBuf,
        /// What the file starts with instead.
        found: String,
    },
    /// The file is a GGUF file but its header, metadata or tensor table is damaged or cut short.
    #[error("{}: corrupt or truncated GGUF: {reason}", path.display())]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is missing or inconsistent.
        reason: String,
    },
    /// The file is a well-formed GGUF file of a model or tensor type this engine does not run.
    #[error("{}: unsupported model: {what}", path.display())]
    Unsupported {
        /// The file.
        path: PathBuf,
        /// The architecture, quantization or hyper-parameter that is not supported.
        what: String,
    },
    /// The tokenizer metadata could not be turned into a tokenizer, or a text into tokens.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// The chat template could not be rendered.
    #[error("chat template: {0}")]
    Template(String),
    /// A batch the engine refuses (before computing anything): what is wrong with it.
    #[error("batch: {0}")]
    Batch(String),
    /// An adapter's weights are malformed or do not fit the model.
    #[error("adapter: {0}")]
    Adapter(String),
    /// A page store refused a read or a write.
    #[error("page store: {0}")]
    Memory(#[from] MemError),
    /// A request refused at submission, naming the limit it exceeds.
    #[error("request refused: {0}")]
    Refused(#[from] Refusal),
    /// Something an engine on KV groups does not do yet (nothing was queued or built).
    #[error(
        "not supported on KV groups (a model with sliding-window layers) yet: {0}; \
         EngineConfig::full_attention_only serves it with one pool"
    )]
    Grouped(Grouped),
    /// The serving engine's configuration is not usable.
    #[error("engine configuration: {0}")]
    Config(String),
    /// The scheduler failed a pass or refused a call (a deadlock, a stale output, ...).
    #[error("scheduler: {0}")]
    Scheduler(#[from] kvsched_core::Error),
    /// [`crate::Engine::run`] made no progress for this many steps.
    #[error("the serving loop stalled: {steps} steps without a model step")]
    Stalled {
        /// Consecutive steps without work.
        steps: u32,
    },
    /// The adapter cache refused a registration or the adapter plan.
    #[error("adapter cache: {0}")]
    AdapterCache(#[from] kvsched_core::PeftError),
    /// A tensor operation failed inside candle.
    #[error("candle: {0}")]
    Candle(#[from] candle_core::Error),
}

/// The engine's result type.
pub type Result<T, E = EngineError> = std::result::Result<T, E>;
