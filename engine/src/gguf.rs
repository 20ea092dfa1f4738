//! Opening a GGUF file and checking it before any weight is read: the magic, the header and
//! metadata (through candle's parser), the architecture, the hyper-parameters, and every tensor's
//! presence, type, shape and byte range.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::{Content, Value};
use candle_core::quantized::GgmlDType;

use crate::error::{EngineError, Result};

/// GGUF architectures of recurrent and hybrid recurrent models (llama.cpp's names): refused with
/// a message of their own.
const RECURRENT: &[&str] = &[
    "mamba",
    "mamba2",
    "jamba",
    "nemotron_h",
    "granitehybrid",
    "falcon-h1",
    "plamo2",
    "qwen3next",
    "rwkv6",
    "rwkv7",
    "lfm2",
];

/// A llama or Gemma 3 model's architecture and hyper-parameters, as the GGUF metadata states them.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    /// `general.architecture`: `llama` or `gemma3`.
    pub architecture: String,
    /// `general.name`, when the file has one.
    pub name: Option<String>,
    /// Transformer blocks (`{arch}.block_count`).
    pub blocks: usize,
    /// Embedding width (`{arch}.embedding_length`).
    pub embedding: usize,
    /// Hidden width of the feed-forward network (`{arch}.feed_forward_length`).
    pub feed_forward: usize,
    /// Query heads (`{arch}.attention.head_count`).
    pub heads: usize,
    /// Key/value heads (`{arch}.attention.head_count_kv`; grouped-query attention when fewer).
    pub kv_heads: usize,
    /// Width of one head (`{arch}.attention.key_length`, else `embedding / heads`).
    pub head_dim: usize,
    /// Rotary embedding base (`{arch}.rope.freq_base`, default 10,000; Gemma 3's global layers').
    pub rope_base: f32,
    /// RMS norm epsilon (`{arch}.attention.layer_norm_rms_epsilon`).
    pub rms_eps: f32,
    /// Longest context the model was trained for (`{arch}.context_length`).
    pub context_length: usize,
    /// Vocabulary size (rows of `token_embd.weight`).
    pub vocab: usize,
    /// Whether the output projection is the token embedding (no `output.weight` tensor).
    pub tied_embeddings: bool,
    /// Gemma 3's additions to the architecture; `None` for a llama model.
    pub gemma: Option<GemmaConfig>,
}

/// What a Gemma 3 model (`general.architecture` `gemma3`) adds to a llama's hyper-parameters.
///
/// Its blocks also norm each query and key head (RMS, before rope), norm the attention's and the
/// feed-forward network's outputs before adding them to the residual, run a GeGLU (tanh-approximated
/// GELU) feed-forward network, rotate the halves of each head (NeoX order, not llama's interleaved
/// pairs), and scale the token embeddings by `sqrt(embedding)`. The norm weights are used as the
/// file holds them: llama.cpp's converter already added Gemma's `1 +` to them.
#[derive(Clone, Debug, PartialEq)]
pub struct GemmaConfig {
    /// Keys a local (sliding-window) layer's query at position `p` attends to: positions
    /// `p - sliding_window + 1 ..= p` (`gemma3.attention.sliding_window`).
    pub sliding_window: usize,
    /// The global layers' period: layer `i` attends to every position when
    /// `(i + 1) % global_every == 0` (`gemma3.attention.sliding_window_pattern` when the file has
    /// it, else 6, as llama.cpp and Hugging Face's Gemma 3 have it); the others are local.
    pub global_every: usize,
    /// Rope base of the local layers (`gemma3.rope.freq_base_swa` when the file has it, else
    /// 10,000); the global layers use [`ModelConfig::rope_base`].
    pub local_rope_base: f32,
    /// The factor on attention scores: `1 / sqrt(gemma3.attention.query_pre_attn_scalar)` when the
    /// file has it, else llama.cpp's rule (`1 / sqrt(head_dim)`, `1 / sqrt(embedding / heads)` for
    /// the 62-block 27B).
    pub attention_scale: f32,
    /// Final logit soft-capping `c`: logits become `c * tanh(logit / c)`
    /// (`gemma3.final_logit_softcapping`; `None` when absent or 0).
    pub final_softcap: Option<f32>,
}

impl ModelConfig {
    /// Width of one token's keys (or values) in one layer: `kv_heads * head_dim`.
    pub fn kv_dim(&self) -> usize {
        self.kv_heads * self.head_dim
    }

    /// Width of one token's queries (and of the attention's output): `heads * head_dim`. The
    /// embedding width for llama; Gemma 3's may differ (4 × 256 queries on 640 for the 270M).
    pub fn q_dim(&self) -> usize {
        self.heads * self.head_dim
    }

    /// The sliding window of layer `layer`: `Some(w)` when its query at `p` attends only to
    /// positions `p - w + 1 ..= p`, `None` when it attends to all of `0..=p`.
    pub fn window(&self, layer: usize) -> Option<usize> {
        let g = self.gemma.as_ref()?;
        ((layer + 1) % g.global_every != 0).then_some(g.sliding_window)
    }

    /// The first position that layer `layer`'s query at `pos` attends to.
    pub fn window_start(&self, layer: usize, pos: usize) -> usize {
        self.window(layer)
            .map_or(0, |w| (pos + 1).saturating_sub(w))
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

    /// Whether the metadata has `key`.
    fn has(&self, key: &str) -> bool {
        self.content.metadata.contains_key(key)
    }

    /// The number `key`, or `default` when the file does not have it.
    fn f32_or(&self, key: &str, default: f32) -> Result<f32> {
        if self.has(key) {
            self.f32(key)
        } else {
            Ok(default)
        }
    }

    /// The architecture and hyper-parameters, checked for a llama or Gemma 3 model this engine
    /// runs.
    pub(crate) fn config(&self) -> Result<ModelConfig> {
        let architecture = self.string("general.architecture")?.to_string();
        if RECURRENT.contains(&architecture.as_str()) {
            return Err(self.unsupported(format!(
                "architecture {architecture:?}, a recurrent (state-space) model: this engine runs \
                 none (kvsched-core schedules their state slots, docs/HYBRID.md; supported here: \
                 \"llama\", \"gemma3\")"
            )));
        }
        if architecture != "llama" && architecture != "gemma3" {
            return Err(self.unsupported(format!(
                "architecture {architecture:?} (supported: \"llama\", \"gemma3\")"
            )));
        }
        let key = |name: &str| format!("{architecture}.{name}");
        let (blocks, embedding) = (
            self.usize(&key("block_count"))?,
            self.usize(&key("embedding_length"))?,
        );
        let (heads, kv_heads, head_dim) = self.heads(&architecture, embedding)?;
        if self.has(&key("rope.scaling.type")) {
            return Err(self.unsupported("rope scaling"));
        }
        let embd = self.tensor_info("token_embd.weight")?;
        let vocab = embd.shape.dims().first().copied().unwrap_or(0);
        let gemma = if architecture == "gemma3" {
            Some(self.gemma(blocks, embedding, heads, head_dim)?)
        } else {
            None
        };
        let config = ModelConfig {
            name: self.string("general.name").ok().map(str::to_string),
            blocks,
            embedding,
            feed_forward: self.usize(&key("feed_forward_length"))?,
            heads,
            kv_heads,
            head_dim,
            rope_base: self.f32_or(&key("rope.freq_base"), 10_000.0)?,
            rms_eps: self.f32(&key("attention.layer_norm_rms_epsilon"))?,
            context_length: self.usize(&key("context_length"))?,
            vocab,
            tied_embeddings: !self.content.tensor_infos.contains_key("output.weight"),
            gemma,
            architecture,
        };
        if config.blocks == 0 || config.vocab == 0 || config.context_length == 0 {
            return Err(self.corrupt("zero blocks, vocabulary or context length"));
        }
        self.check_tensors(&config)?;
        Ok(config)
    }

    /// Query heads, KV heads and the head width, checked: for llama the heads split the embedding;
    /// Gemma 3 states its head width (`key_length`, equal to `value_length`).
    fn heads(&self, arch: &str, embedding: usize) -> Result<(usize, usize, usize)> {
        let key = |name: &str| format!("{arch}.{name}");
        let heads = self.usize(&key("attention.head_count"))?;
        let kv_heads = if self.has(&key("attention.head_count_kv")) {
            self.usize(&key("attention.head_count_kv"))?
        } else {
            heads
        };
        if heads == 0 || kv_heads == 0 || heads % kv_heads != 0 {
            return Err(self.corrupt(format!(
                "{heads} heads and {kv_heads} KV heads do not divide"
            )));
        }
        let head_dim = if self.has(&key("attention.key_length")) {
            self.usize(&key("attention.key_length"))?
        } else if arch == "llama" && embedding % heads == 0 {
            embedding / heads
        } else {
            return Err(self.corrupt(format!(
                "{heads} heads do not divide embedding {embedding} and {} is missing",
                key("attention.key_length")
            )));
        };
        let value = if self.has(&key("attention.value_length")) {
            self.usize(&key("attention.value_length"))?
        } else {
            head_dim
        };
        let llama_split = arch != "llama" || head_dim * heads == embedding;
        if !llama_split || head_dim % 2 != 0 || head_dim == 0 || value != head_dim {
            return Err(self.unsupported(format!(
                "head dimension {head_dim} (values {value}) with {heads} heads and embedding \
                 {embedding}"
            )));
        }
        if let Some(Value::U32(rope)) = self.content.metadata.get(&key("rope.dimension_count")) {
            if *rope as usize != head_dim {
                return Err(self.unsupported(format!(
                    "partial rotary embedding ({rope} of {head_dim} dimensions)"
                )));
            }
        }
        Ok((heads, kv_heads, head_dim))
    }

    /// Gemma 3's sliding window, layer pattern, local rope base, attention scale and soft-cap.
    fn gemma(
        &self,
        blocks: usize,
        embedding: usize,
        heads: usize,
        head_dim: usize,
    ) -> Result<GemmaConfig> {
        let key = |name: &str| format!("gemma3.{name}");
        let sliding_window = self.usize(&key("attention.sliding_window"))?;
        let global_every = if self.has(&key("attention.sliding_window_pattern")) {
            self.usize(&key("attention.sliding_window_pattern"))?
        } else {
            6
        };
        if sliding_window == 0 || global_every == 0 {
            return Err(self.unsupported(format!(
                "sliding window {sliding_window} with a global layer every {global_every}"
            )));
        }
        if self.has(&key("attn_logit_softcapping")) {
            return Err(self.unsupported(format!(
                "{} (Gemma 2's attention soft-capping)",
                key("attn_logit_softcapping")
            )));
        }
        // llama.cpp's rule (llama-model.cpp, LLM_ARCH_GEMMA3): the 27B (62 blocks) scales by
        // embedding / heads, every other size by the head width.
        let pre_attn = if self.has(&key("attention.query_pre_attn_scalar")) {
            self.f32(&key("attention.query_pre_attn_scalar"))?
        } else if blocks == 62 {
            (embedding / heads) as f32
        } else {
            head_dim as f32
        };
        if pre_attn.partial_cmp(&0.0) != Some(std::cmp::Ordering::Greater) {
            return Err(self.corrupt(format!("query_pre_attn_scalar {pre_attn}")));
        }
        let softcap = self.f32_or(&key("final_logit_softcapping"), 0.0)?;
        Ok(GemmaConfig {
            sliding_window,
            global_every,
            local_rope_base: self.f32_or(&key("rope.freq_base_swa"), 10_000.0)?,
            attention_scale: 1.0 / pre_attn.sqrt(),
            final_softcap: (softcap != 0.0).then_some(softcap),
        })
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
        let expected = expected_tensors(c);
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

/// Every tensor the model `c` reads, with its shape (outputs, inputs).
fn expected_tensors(c: &ModelConfig) -> Vec<(String, Vec<usize>)> {
    let (e, f, kv, q) = (c.embedding, c.feed_forward, c.kv_dim(), c.q_dim());
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
            (t("attn_q"), vec![q, e]),
            (t("attn_k"), vec![kv, e]),
            (t("attn_v"), vec![kv, e]),
            (t("attn_output"), vec![e, q]),
            (t("ffn_norm"), vec![e]),
            (t("ffn_gate"), vec![f, e]),
            (t("ffn_up"), vec![f, e]),
            (t("ffn_down"), vec![e, f]),
        ]);
        if c.gemma.is_some() {
            expected.extend([
                (t("attn_q_norm"), vec![c.head_dim]),
                (t("attn_k_norm"), vec![c.head_dim]),
                (t("post_attention_norm"), vec![e]),
                (t("post_ffw_norm"), vec![e]),
            ]);
        }
    }
    expected
}
