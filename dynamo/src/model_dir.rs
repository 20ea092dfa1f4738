//! The model folder Dynamo's frontend reads (its tokenizer, chat template, stop tokens and context
//! length), written from the GGUF file's metadata alone: `tokenizer.json` (the engine's own
//! tokenizer, serialized), `tokenizer_config.json` (chat template, BOS and EOS), `config.json` and
//! `generation_config.json` (EOS ids, context). No weights: the worker reads those from the GGUF.

use std::path::Path;

use kvsched_engine::Tokenizer;
use serde_json::{json, Value};

/// Why the folder could not be written.
#[derive(Debug)]
pub enum ModelDirError {
    /// The GGUF's tokenizer could not be read or serialized.
    Tokenizer(String),
    /// A file could not be written.
    Io(std::path::PathBuf, std::io::Error),
}

impl std::fmt::Display for ModelDirError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Tokenizer(e) => write!(f, "the model's tokenizer: {e}"),
            Self::Io(p, e) => write!(f, "writing {}: {e}", p.display()),
        }
    }
}

impl std::error::Error for ModelDirError {}

/// Writes the folder `dir` (made when missing) for the GGUF file `gguf`, whose requests the
/// worker serves up to `context` tokens. Files already there are replaced, each at once.
pub fn write(dir: &Path, gguf: &Path, context: usize) -> Result<(), ModelDirError> {
    let tok = Tokenizer::load(gguf).map_err(|e| ModelDirError::Tokenizer(e.to_string()))?;
    let hf = tok
        .to_hf_json()
        .map_err(|e| ModelDirError::Tokenizer(e.to_string()))?;
    std::fs::create_dir_all(dir).map_err(|e| ModelDirError::Io(dir.into(), e))?;
    let files = [
        ("tokenizer.json", hf),
        (
            "tokenizer_config.json",
            tokenizer_config(&tok, context).to_string(),
        ),
        ("config.json", config(&tok, context).to_string()),
        (
            "generation_config.json",
            generation_config(&tok).to_string(),
        ),
    ];
    for (name, text) in files {
        // Written aside, then renamed into place: a frontend reading the folder while a second
        // worker rewrites it never sees half a file.
        let aside = dir.join(format!(".{name}.{}", std::process::id()));
        std::fs::write(&aside, text).map_err(|e| ModelDirError::Io(aside.clone(), e))?;
        let path = dir.join(name);
        std::fs::rename(&aside, &path).map_err(|e| ModelDirError::Io(path, e))?;
    }
    Ok(())
}

/// A token's text, or null.
fn text(tok: &Tokenizer, id: Option<u32>) -> Value {
    id.and_then(|i| tok.token(i))
        .map_or(Value::Null, |t| json!(t))
}

fn tokenizer_config(tok: &Tokenizer, context: usize) -> Value {
    json!({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "chat_template": tok.chat_template(),
        "bos_token": text(tok, tok.bos()),
        "eos_token": text(tok, Some(tok.eos())),
        "add_bos_token": tok.adds_bos(),
        "add_eos_token": false,
        "model_max_length": context,
    })
}

fn config(tok: &Tokenizer, context: usize) -> Value {
    json!({
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "bos_token_id": tok.bos(),
        "eos_token_id": tok.eos(),
        "max_position_embeddings": context,
        "vocab_size": tok.vocab_size(),
    })
}

/// Every token the engine stops at: the file's EOS first, then the chat turn ends.
fn generation_config(tok: &Tokenizer) -> Value {
    json!({
        "bos_token_id": tok.bos(),
        "eos_token_id": tok.stop_tokens(),
    })
}
