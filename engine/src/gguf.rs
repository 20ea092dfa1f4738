//! Opening a GGUF file and checking it before any weight is read: the magic, the header and
//! metadata (through candle's parser), the architecture, the hyper-parameters, and every tensor's
//! presence, type, shape and byte range.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::{Content, Value};
use candle_core::quantized::GgmlDType;

use crate::error::{EngineError, Result};

/// A llama model's architecture and hyper-parameters, as the GGUF metadata states them.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    /// `general.architecture` (always `llama` here).
    pub architecture: String,
    /// `general.name`, when the file has one.
    pub name: Option<String>,
    /// Transformer blocks (`llama.block_count`).
    pub blocks: usize,
    /// Embedding width (`llama.embedding_length`).
    pub embedding: usize,
    /// Hidden width of the feed-forward network (`llama.feed_forward_length`).
    pub feed_forward: usize,
    /// Query heads (`llama.attention.head_count`).
    pub heads: usize,
    /// Key/value heads (`llama.attention.head_count_kv`; grouped-query attention when fewer).
    pub kv_heads: usize,
    /// Width of one head (`llama.attention.key_length`, else `embedding / heads`).
    pub head_dim: usize,
    /// Rotary embedding base (`llama.rope.freq_base`, default 10,000).
    pub rope_base: f32,
    /// RMS norm epsilon (`llama.attention.layer_norm_rms_epsilon`).
    pub rms_eps: f32,
    /// Longest context the model was trained for (`llama.context_length`).
    pub context_length: usize,
    /// Vocabulary size (rows of `token_embd.weight`).
    pub vocab: usize,
    /// Whether the output projection is the token embedding (no `output.weight` tensor).
    pub tied_embeddings: bool,
}

impl ModelConfig {
    /// Width of one token's keys (or values) in one layer: `kv_heads * head_dim`.
    pub fn kv_dim(&self) -> usize {
        self.kv_heads * self.head_dim
    }
}

/// Tensor types the loader reads (and re-quantizes to Q8_0).
const WEIGHT_TYPES: [GgmlDType; 10] = [
    GgmlDType::F32,
    GgmlDType::F16,
    GgmlDType::Q4_0,
    GgmlDType::Q4_1,
    GgmlDType::Q5_0,
    GgmlDType::Q5_1,
    GgmlDType::Q8_0,
    GgmlDType::Q4K,
    GgmlDType::Q5K,
    GgmlDType::Q6K,
];

/// An open GGUF file whose header, metadata and tensor table were read and checked.
pub(crate) struct Gguf {
    pub(crate) path: PathBuf,
    pub(crate) file: File,
    pub(crate) content: Content,
}

impl Gguf {
    /// Opens `path` and reads its header: `Io`, `NotGguf` or `Corrupt` on failure.
    pub(crate) fn open(path: &Path) -> Result<Self> {
        let io = |source| EngineError::Io {
            path: path.to_path_buf(),
            source,
        };
        let mut file = File::open(path).map_err(io)?;
        let mut magic = [0u8; 4];
        let mut got = 0;
        while got < 4 {
            match file.read(&mut magic[got..]).map_err(io)? {
                0 => break,
                n => got += n,
            }
        }
        if &magic[..got] != b"GGUF" {
            let found = if got == 0 {
                "the file is empty".to_string()
            } else {
                let hex: Vec<String> = magic[..got].iter().map(|b| format!("{b:02x}")).collect();
                format!("it starts with bytes {}, not \"GGUF\"", hex.join(" "))
            };
            return Err(EngineError::NotGguf {
                path: path.to_path_buf(),
                found,
            });
        }
        file.seek(SeekFrom::Start(0)).map_err(io)?;
        let content = Content::read(&mut file).map_err(|e| EngineError::Corrupt {
            path: path.to_path_buf(),
            reason: one_line(&e.to_string()),
        })?;
        Ok(Self {
            path: path.to_path_buf(),
            file,
            content,
        })
    }

    pub(crate) fn corrupt(&self, reason: impl Into<String>) -> EngineError {
        EngineError::Corrupt {
            path: self.path.clone(),
            reason: reason.into(),
        }
    }

    pub(crate) fn unsupported(&self, what: impl Into<String>) -> EngineError {
        EngineError::Unsupported {
            path: self.path.clone(),
            what: what.into(),
        }
    }

    pub(crate) fn value(&self, key: &str) -> Result<&Value> {
        self.content
            .metadata
            .get(key)
            .ok_or_else(|| self.corrupt(format!("metadata key {key} is missing")))
    }

    pub(crate) fn string(&self, key: &str) -> Result<&str> {
        match self.value(key)? {
            Value::String(s) => Ok(s),
            other => Err(self.corrupt(format!("metadata key {key} is {other:?}, not a string"))),
        }
    }

    pub(crate) fn usize(&self, key: &str) -> Result<usize> {
        let value = self.value(key)?;
        let n = match value {
            Value::U8(v) => Some(u64::from(*v)),
            Value::U16(v) => Some(u64::from(*v)),
            Value::U32(v) => Some(u64::from(*v)),
            Value::U64(v) => Some(*v),
            Value::I32(v) => u64::try_from(*v).ok(),
            Value::I64(v) => u64::try_from(*v).ok(),
            _ => None,
        };
        n.and_then(|n| usize::try_from(n).ok())
            .ok_or_else(|| self.corrupt(format!("metadata key {key} is {value:?}, not a count")))
    }

    pub(crate) fn f32(&self, key: &str) -> Result<f32> {
        match self.value(key)? {
            Value::F32(v) => Ok(*v),
            Value::F64(v) => Ok(*v as f32),
            other => Err(self.corrupt(format!("metadata key {key} is {other:?}, not a number"))),
        }
    }

    pub(crate) fn array(&self, key: &str) -> Result<&[Value]> {
        match self.value(key)? {
            Value::Array(values) => Ok(values),
            other => Err(self.corrupt(format!(
                "metadata key {key} is a {:?}, not an array",
                other.value_type()
            ))),
        }
    }

    /// The architecture and hyper-parameters, checked for a llama model this engine runs.
    pub(crate) fn config(&self) -> Result<ModelConfig> {
        let architecture = self.string("general.architecture")?.to_string();
        if architecture != "llama" {
            return Err(self.unsupported(format!(
                "architecture {architecture:?} (only \"llama\" is supported)"
            )));
        }
        let key = |name: &str| format!("llama.{name}");
        let blocks = self.usize(&key("block_count"))?;
        let embedding = self.usize(&key("embedding_length"))?;
        let heads = self.usize(&key("attention.head_count"))?;
        let kv_heads = match self.content.metadata.get(&key("attention.head_count_kv")) {
            Some(_) => self.usize(&key("attention.head_count_kv"))?,
            None => heads,
        };
        if heads == 0 || kv_heads == 0 || heads % kv_heads != 0 || embedding % heads != 0 {
            return Err(self.corrupt(format!(
                "{heads} heads, {kv_heads} KV heads and embedding {embedding} do not divide"
            )));
        }
        let head_dim = match self.content.metadata.get(&key("attention.key_length")) {
            Some(_) => self.usize(&key("attention.key_length"))?,
            None => embedding / heads,
        };
        if head_dim * heads != embedding || head_dim % 2 != 0 {
            return Err(self.unsupported(format!(
                "head dimension {head_dim} with {heads} heads and embedding {embedding}"
            )));
        }
        if let Some(Value::U32(rope)) = self.content.metadata.get(&key("rope.dimension_count")) {
            if *rope as usize != head_dim {
                return Err(self.unsupported(format!(
                    "partial rotary embedding ({rope} of {head_dim} dimensions)"
                )));
            }
        }
        if self
            .content
            .metadata
            .contains_key(&key("rope.scaling.type"))
        {
            return Err(self.unsupported("rope scaling"));
        }
        let rope_base = match self.content.metadata.get(&key("rope.freq_base")) {
            Some(_) => self.f32(&key("rope.freq_base"))?,
            None => 10_000.0,
        };
        let embd = self.tensor_info("token_embd.weight")?;
        let vocab = embd.shape.dims().first().copied().unwrap_or(0);
        let config = ModelConfig {
            architecture,
            name: self.string("general.name").ok().map(str::to_string),
            blocks,
            embedding,
            feed_forward: self.usize(&key("feed_forward_length"))?,
            heads,
            kv_heads,
            head_dim,
            rope_base,
            rms_eps: self.f32(&key("attention.layer_norm_rms_epsilon"))?,
            context_length: self.usize(&key("context_length"))?,
            vocab,
            tied_embeddings: !self.content.tensor_infos.contains_key("output.weight"),
        };
        if config.blocks == 0 || config.vocab == 0 || config.context_length == 0 {
            return Err(self.corrupt("zero blocks, vocabulary or context length"));
        }
        self.check_tensors(&config)?;
        Ok(config)
    }

    fn tensor_info(&self, name: &str) -> Result<&candle_core::quantized::gguf_file::TensorInfo> {
        self.content
            .tensor_infos
            .get(name)
            .ok_or_else(|| self.corrupt(format!("tensor {name} is missing")))
    }

    /// Every tensor the model reads: present, of a supported type, of the expected shape, and
    /// inside the file.
    fn check_tensors(&self, c: &ModelConfig) -> Result<()> {
        let (e, f, kv) = (c.embedding, c.feed_forward, c.kv_dim());
        let mut expected: Vec<(String, Vec<usize>)> = vec![
            ("token_embd.weight".into(), vec![c.vocab, e]),
            ("output_norm.weight".into(), vec![e]),
        ];
        if !c.tied_embeddings {
            expected.push(("output.weight".into(), vec![c.vocab, e]));
        }
        for b in 0..c.blocks {
            let t = |name: &str| format!("blk.{b}.{name}.weight");
            expected.extend([
                (t("attn_norm"), vec![e]),
                (t("attn_q"), vec![e, e]),
                (t("attn_k"), vec![kv, e]),
                (t("attn_v"), vec![kv, e]),
                (t("attn_output"), vec![e, e]),
                (t("ffn_norm"), vec![e]),
                (t("ffn_gate"), vec![f, e]),
                (t("ffn_up"), vec![f, e]),
                (t("ffn_down"), vec![e, f]),
            ]);
        }
        let file_len = self
            .file
            .metadata()
            .map_err(|source| EngineError::Io {
                path: self.path.clone(),
                source,
            })?
            .len();
        for (name, shape) in &expected {
            let info = self.tensor_info(name)?;
            if !WEIGHT_TYPES.contains(&info.ggml_dtype) {
                return Err(self.unsupported(format!(
                    "tensor {name} is quantized as {:?} (supported: {WEIGHT_TYPES:?})",
                    info.ggml_dtype
                )));
            }
            if info.shape.dims() != shape.as_slice() {
                return Err(self.corrupt(format!(
                    "tensor {name} has shape {:?}, the metadata implies {shape:?}",
                    info.shape.dims()
                )));
            }
            if shape.len() == 2 && shape[1] % 32 != 0 {
                return Err(self.unsupported(format!(
                    "tensor {name}: rows of {} do not split into Q8_0 blocks of 32",
                    shape[1]
                )));
            }
            let (elems, block) = (info.shape.elem_count(), info.ggml_dtype.block_size());
            if elems % block != 0 {
                return Err(self.corrupt(format!(
                    "tensor {name}: {elems} elements are not whole {:?} blocks",
                    info.ggml_dtype
                )));
            }
            let bytes = (elems / block * info.ggml_dtype.type_size()) as u64;
            let start = self.content.tensor_data_offset.saturating_add(info.offset);
            let end = start.saturating_add(bytes);
            if end > file_len {
                return Err(self.corrupt(format!(
                    "tensor {name} needs bytes {start}..{end}, the file has {file_len} bytes"
                )));
            }
        }
        Ok(())
    }
}

/// The first line of a message (candle's errors may carry a backtrace).
fn one_line(message: &str) -> String {
    message.lines().next().unwrap_or(message).trim().to_string()
}
