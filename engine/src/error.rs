//! The engine's one error type.

use std::path::PathBuf;

use kvsched_gpu::MemError;

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
    /// A tensor operation failed inside candle.
    #[error("candle: {0}")]
    Candle(#[from] candle_core::Error),
}

/// The engine's result type.
pub type Result<T, E = EngineError> = std::result::Result<T, E>;
