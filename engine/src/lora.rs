//! LoRA adapters on the attention projections (q, k, v, o), in a byte format that lives in the
//! pages of an adapter store ([`kvsched_gpu::HostAdapterStore`]) and is read from there at each step.
//!
//! # Format (little-endian)
//!
//! ```text
//!   b"KVLR"  u32 version (1)  u32 rank  f32 scale          16-byte header
//!   then, for each block in order, for q, k, v, o in order:
//!     A: rank × in   f32, row-major      (in = embedding)
//!     B: out × rank  f32, row-major      (out = embedding for q and o, kv_heads * head_dim for k, v)
//! ```
//!
//! A projection `y = W x` becomes `y = W x + scale · B (A x)`. The weights of an adapter fill
//! whole pages; bytes past the end of the weights are ignored.
//!
//! Adapters trained with Hugging Face PEFT are read from their directory
//! ([`Lora::load_peft`]) and written to one ([`Lora::write_peft`]).

use std::collections::HashMap;
use std::fmt::Display;
use std::path::{Path, PathBuf};

use kvsched_gpu::{PageStore, Tier};
use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};
use serde_json::{json, Value};

use crate::error::{EngineError, Result};
use crate::gguf::ModelConfig;
use crate::kv::{extend_f32, write_f32};
use crate::math::dot;

const MAGIC: &[u8; 4] = b"KVLR";
const VERSION: u32 = 1;
const HEADER: usize = 16;
/// The largest rank an adapter may have (in either format).
const MAX_RANK: usize = 1024;

/// The four attention projections an adapter changes, in format order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Projection {
    /// Queries.
    Q = 0,
    /// Keys.
    K = 1,
    /// Values.
    V = 2,
    /// The attention output.
    O = 3,
}

impl Projection {
    /// The four, in format order.
    pub const ALL: [Self; 4] = [Self::Q, Self::K, Self::V, Self::O];

    /// (in, out) widths of this projection in `config`.
    pub fn dims(self, config: &ModelConfig) -> (usize, usize) {
        match self {
            Self::Q => (config.embedding, config.q_dim()),
            Self::O => (config.q_dim(), config.embedding),
            Self::K | Self::V => (config.embedding, config.kv_dim()),
        }
    }

    /// The module's name in a Hugging Face llama block, as PEFT's `target_modules` names it.
    const fn module(self) -> &'static str {
        match self {
            Self::Q => "q_proj",
            Self::K => "k_proj",
            Self::V => "v_proj",
            Self::O => "o_proj",
        }
    }

    /// Whether a GGUF llama file holds this projection's output rows in rope's interleaved order.
    const fn interleaved(self) -> bool {
        matches!(self, Self::Q | Self::K)
    }
}

/// One projection's low-rank pair.
#[derive(Clone, Debug, PartialEq)]
struct Pair {
    /// rank × in.
    a: Vec<f32>,
    /// out × rank.
    b: Vec<f32>,
}

/// A LoRA adapter for one model: rank-`r` pairs on q, k, v and o of every block.
#[derive(Clone, Debug, PartialEq)]
pub struct Lora {
    rank: usize,
    scale: f32,
    dims: [(usize, usize); 4],
    /// blocks × 4 pairs, in format order.
    pairs: Vec<Pair>,
}

/// SplitMix64: a small, seedable generator, so a seed names the same adapter everywhere.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [-1, 1).
    fn unit(&mut self) -> f32 {
        ((self.next() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
}

impl Lora {
    /// Bytes of a rank-`rank` adapter's weights for `config`.
    pub fn byte_len(config: &ModelConfig, rank: usize) -> usize {
        let per_block: usize = Projection::ALL
            .iter()
            .map(|p| {
                let (i, o) = p.dims(config);
                rank * (i + o)
            })
            .sum();
        HEADER + config.blocks * per_block * std::mem::size_of::<f32>()
    }

    /// A random adapter, the same for the same arguments on every machine: A uniform in
    /// `±sqrt(3 / in)` (unit gain), B uniform in `±strength`, scale `alpha / rank`.
    pub fn seeded(config: &ModelConfig, rank: usize, alpha: f32, strength: f32, seed: u64) -> Self {
        let mut rng = SplitMix(seed ^ 0x006B_7673_6368_6564_u64);
        let dims = Projection::ALL.map(|p| p.dims(config));
        let mut pairs = Vec::with_capacity(config.blocks * 4);
        for _ in 0..config.blocks {
            for &(i, o) in &dims {
                let bound = (3.0 / i as f32).sqrt();
                let a = (0..rank * i).map(|_| rng.unit() * bound).collect();
                let b = (0..o * rank).map(|_| rng.unit() * strength).collect();
                pairs.push(Pair { a, b });
            }
        }
        Self {
            rank,
            scale: alpha / rank as f32,
            dims,
            pairs,
        }
    }

    /// The rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The scale applied to `B A x` (`alpha / rank`).
    pub fn scale(&self) -> f32 {
        self.scale
    }

    /// The adapter in its byte format.
    pub fn to_bytes(&self) -> Vec<u8> {
        let floats: usize = self.pairs.iter().map(|p| p.a.len() + p.b.len()).sum();
        let mut out = vec![0u8; HEADER + floats * 4];
        out[..4].copy_from_slice(MAGIC);
        out[4..8].copy_from_slice(&VERSION.to_le_bytes());
        out[8..12].copy_from_slice(&(self.rank as u32).to_le_bytes());
        out[12..16].copy_from_slice(&self.scale.to_le_bytes());
        let mut at = HEADER;
        for pair in &self.pairs {
            for m in [&pair.a, &pair.b] {
                write_f32(&mut out[at..at + m.len() * 4], m);
                at += m.len() * 4;
            }
        }
        out
    }

    /// Parses an adapter for `config` from `bytes` (trailing bytes, such as a page's tail, are
    /// ignored): `Adapter` when the header is wrong or the bytes are too short.
    pub fn from_bytes(config: &ModelConfig, bytes: &[u8]) -> Result<Self> {
        let bad = |why: String| Err(EngineError::Adapter(why));
        if bytes.len() < HEADER || &bytes[..4] != MAGIC {
            return bad("the weights do not start with the KVLR header".into());
        }
        let word =
            |i: usize| u32::from_le_bytes([bytes[i], bytes[i + 1], bytes[i + 2], bytes[i + 3]]);
        if word(4) != VERSION {
            return bad(format!("format version {}, expected {VERSION}", word(4)));
        }
        let rank = word(8) as usize;
        let scale = f32::from_bits(word(12));
        if rank == 0 || rank > MAX_RANK || !scale.is_finite() {
            return bad(format!("rank {rank} with scale {scale}"));
        }
        let need = Self::byte_len(config, rank);
        if bytes.len() < need {
            return bad(format!(
                "a rank-{rank} adapter needs {need} bytes, {} given",
                bytes.len()
            ));
        }
        let dims = Projection::ALL.map(|p| p.dims(config));
        let mut pairs = Vec::with_capacity(config.blocks * 4);
        let mut at = HEADER;
        let mut take = |n: usize| {
            let mut m = Vec::with_capacity(n);
            extend_f32(&mut m, &bytes[at..at + n * 4]);
            at += n * 4;
            m
        };
        for _ in 0..config.blocks {
            for &(i, o) in &dims {
                let a = take(rank * i);
                let b = take(o * rank);
                pairs.push(Pair { a, b });
            }
        }
        Ok(Self {
            rank,
            scale,
            dims,
            pairs,
        })
    }

    /// Pages of `page_bytes` bytes that this adapter fills.
    pub fn pages(&self, page_bytes: usize) -> usize {
        let floats: usize = self.pairs.iter().map(|p| p.a.len() + p.b.len()).sum();
        (HEADER + floats * 4).div_ceil(page_bytes).max(1)
    }

    /// Writes the adapter into `pages` of `tier` (in order; the last page's tail zeroed).
    pub fn write_pages(&self, store: &mut dyn PageStore, tier: Tier, pages: &[u32]) -> Result<()> {
        let page_bytes = store.shape().page_bytes;
        let mut bytes = self.to_bytes();
        if pages.len() * page_bytes < bytes.len() {
            return Err(EngineError::Adapter(format!(
                "{} bytes of weights do not fit {} pages of {page_bytes} bytes",
                bytes.len(),
                pages.len()
            )));
        }
        bytes.resize(pages.len() * page_bytes, 0);
        for (chunk, &page) in bytes.chunks_exact(page_bytes).zip(pages) {
            store.write_page(tier, page, chunk)?;
        }
        Ok(())
    }

    /// Reads an adapter for `config` from `pages` of `tier` of `store`, in order.
    pub fn read_pages(
        config: &ModelConfig,
        store: &dyn PageStore,
        tier: Tier,
        pages: &[u32],
        buf: &mut Vec<u8>,
    ) -> Result<Self> {
        let page_bytes = store.shape().page_bytes;
        buf.resize(pages.len() * page_bytes, 0);
        for (chunk, &page) in buf.chunks_exact_mut(page_bytes).zip(pages) {
            store.read_page(tier, page, chunk)?;
        }
        Self::from_bytes(config, buf)
    }

    /// `y += scale · B (A x)` for block `block`'s projection `p`, in a fixed summation order.
    pub(crate) fn apply(&self, block: usize, p: Projection, x: &[f32], y: &mut [f32]) {
        let (i, o) = self.dims[p as usize];
        let pair = &self.pairs[block * 4 + p as usize];
        let mut t = [0f32; 64];
        let mut heap;
        let t: &mut [f32] = if self.rank <= t.len() {
            &mut t[..self.rank]
        } else {
            heap = vec![0f32; self.rank];
            &mut heap
        };
        for (r, tr) in t.iter_mut().enumerate() {
            *tr = dot(&pair.a[r * i..(r + 1) * i], x);
        }
        for (out, yo) in y.iter_mut().enumerate().take(o) {
            let row = &pair.b[out * self.rank..(out + 1) * self.rank];
            let mut acc = 0f32;
            for (b, tr) in row.iter().zip(t.iter()) {
                acc += b * tr;
            }
            *yo += self.scale * acc;
        }
    }
}

/// The adapter directory's configuration file.
const PEFT_CONFIG: &str = "adapter_config.json";
/// The adapter directory's weights file.
const PEFT_WEIGHTS: &str = "adapter_model.safetensors";
/// What PEFT's tensor names of a llama block start with (then `{block}.self_attn.{module}.`).
const PEFT_PREFIX: &str = "base_model.model.model.layers.";

/// Keys of `adapter_config.json` that, set, change what the adapter computes in a way this engine
/// does not apply, each with what it means.
const UNSUPPORTED: [(&str, &str); 14] = [
    (
        "use_dora",
        "DoRA (weight-decomposed) adapters are not supported",
    ),
    ("rank_pattern", "per-module ranks are not supported"),
    ("alpha_pattern", "per-module alphas are not supported"),
    (
        "fan_in_fan_out",
        "transposed (Conv1D) weights are not supported",
    ),
    (
        "layers_to_transform",
        "an adapter on some layers only is not supported",
    ),
    ("layer_replication", "layer replication is not supported"),
    ("exclude_modules", "excluded modules are not supported"),
    (
        "modules_to_save",
        "fully trained modules (modules_to_save) are not supported",
    ),
    ("lora_bias", "a bias on lora_B is not supported"),
    (
        "target_parameters",
        "adapters on parameters (target_parameters) are not supported",
    ),
    (
        "trainable_token_indices",
        "trained token embeddings are not supported",
    ),
    ("use_qalora", "QALoRA's pooled inputs are not supported"),
    (
        "alora_invocation_tokens",
        "activated LoRA (after invocation tokens) is not supported",
    ),
    (
        "arrow_config",
        "Arrow routing among adapters is not supported",
    ),
];

/// `file: why`, as an adapter error.
fn refuse(file: &Path, why: impl Display) -> EngineError {
    EngineError::Adapter(format!("{}: {why}", file.display()))
}

/// The whole of `file`.
fn read_file(file: &Path) -> Result<Vec<u8>> {
    std::fs::read(file).map_err(|e| refuse(file, format_args!("cannot read the file: {e}")))
}

/// Writes `bytes` to `file`.
fn write_file(file: &Path, bytes: &[u8]) -> Result<()> {
    std::fs::write(file, bytes)
        .map_err(|e| refuse(file, format_args!("cannot write the file: {e}")))
}

/// Whether a configuration value asks for something (not absent, `null`, `false` or empty).
fn is_set(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
        Value::Number(_) => true,
    }
}

/// A configuration value as JSON, cut to a readable length.
fn shown(v: &Value) -> String {
    let text = v.to_string();
    match text.char_indices().nth(80) {
        Some((at, _)) => format!("{}...", &text[..at]),
        None => text,
    }
}

/// What an `adapter_config.json` says, checked for what this engine applies.
#[derive(Debug)]
struct PeftConfig {
    rank: usize,
    scale: f32,
    /// Whether each projection, in format order, is in `target_modules`.
    targets: [bool; 4],
}

impl PeftConfig {
    /// Parses and checks `file`'s contents `bytes`.
    fn parse(file: &Path, bytes: &[u8]) -> Result<Self> {
        let json: Value = serde_json::from_slice(bytes)
            .map_err(|e| refuse(file, format_args!("not a JSON file: {e}")))?;
        let Value::Object(json) = json else {
            return Err(refuse(file, "not a JSON object"));
        };
        Self::refuse_unsupported(file, &json)?;
        let (rank, scale) = Self::rank_and_scale(file, &json)?;
        let targets = Self::targets(file, json.get("target_modules"))?;
        Ok(Self {
            rank,
            scale,
            targets,
        })
    }

    /// Refuses a PEFT type other than LoRA, and the LoRA variants this engine does not apply.
    fn refuse_unsupported(file: &Path, json: &serde_json::Map<String, Value>) -> Result<()> {
        if let Some(t) = json.get("peft_type").filter(|t| *t != "LORA") {
            return Err(refuse(
                file,
                format_args!("peft_type is {}, not \"LORA\"", shown(t)),
            ));
        }
        for (key, why) in UNSUPPORTED {
            if let Some(v) = json.get(key).filter(|v| is_set(v)) {
                return Err(refuse(file, format_args!("{key} is {}: {why}", shown(v))));
            }
        }
        if let Some(b) = json.get("bias").filter(|b| is_set(b) && *b != "none") {
            return Err(refuse(
                file,
                format_args!("bias is {}: trained biases are not supported", shown(b)),
            ));
        }
        Ok(())
    }

    /// `r`, and the scale `lora_alpha / r` (`lora_alpha / sqrt(r)` with rsLoRA).
    fn rank_and_scale(file: &Path, json: &serde_json::Map<String, Value>) -> Result<(usize, f32)> {
        let r = json.get("r").unwrap_or(&Value::Null);
        let rank = r
            .as_u64()
            .and_then(|r| usize::try_from(r).ok())
            .filter(|r| (1..=MAX_RANK).contains(r))
            .ok_or_else(|| {
                refuse(
                    file,
                    format_args!("r is {}, not a rank from 1 to {MAX_RANK}", shown(r)),
                )
            })?;
        let a = json.get("lora_alpha").unwrap_or(&Value::Null);
        let alpha = a.as_f64().filter(|a| a.is_finite()).ok_or_else(|| {
            refuse(
                file,
                format_args!("lora_alpha is {}, not a number", shown(a)),
            )
        })?;
        let rslora = match json.get("use_rslora") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(v) => return Err(refuse(file, format_args!("use_rslora is {}", shown(v)))),
        };
        let scale = if rslora {
            alpha / (rank as f64).sqrt()
        } else {
            alpha / rank as f64
        } as f32;
        if !scale.is_finite() {
            return Err(refuse(file, format_args!("lora_alpha {alpha} overflows")));
        }
        Ok((rank, scale))
    }

    /// The projections `target_modules` names; any other module is refused.
    fn targets(file: &Path, modules: Option<&Value>) -> Result<[bool; 4]> {
        let only = "this engine applies adapters to q_proj, k_proj, v_proj and o_proj only";
        let names: Vec<&str> = match modules {
            Some(Value::Array(items)) => items
                .iter()
                .map(Value::as_str)
                .collect::<Option<_>>()
                .ok_or_else(|| refuse(file, "target_modules holds a value that is not a name"))?,
            Some(Value::String(s)) if s == "all-linear" => {
                return Err(refuse(
                    file,
                    format_args!("target_modules is \"all-linear\", the MLP's too: {only}"),
                ))
            }
            Some(v @ Value::String(_)) => {
                return Err(refuse(
                    file,
                    format_args!(
                        "target_modules is the pattern {}: a list of module names is needed",
                        shown(v)
                    ),
                ))
            }
            None | Some(Value::Null) => return Err(refuse(file, "target_modules is missing")),
            Some(v) => {
                return Err(refuse(
                    file,
                    format_args!("target_modules is {}, not a list of names", shown(v)),
                ))
            }
        };
        let mut targets = [false; 4];
        let mut others = Vec::new();
        for name in names {
            let is = |p: &Projection| {
                name.strip_suffix(p.module())
                    .is_some_and(|rest| rest.is_empty() || rest.ends_with('.'))
            };
            match Projection::ALL.iter().find(|p| is(p)) {
                Some(&p) => targets[p as usize] = true,
                None if !others.contains(&name) => others.push(name),
                None => {}
            }
        }
        if !others.is_empty() {
            return Err(refuse(
                file,
                format_args!("target_modules names {}: {only}", others.join(", ")),
            ));
        }
        if targets == [false; 4] {
            return Err(refuse(file, "target_modules names no module"));
        }
        Ok(targets)
    }
}

/// PEFT's name of block `block`'s `lora_A` or `lora_B` (`m`) tensor of projection `p`.
fn tensor_name(block: usize, p: Projection, m: &str) -> String {
    format!("{PEFT_PREFIX}{block}.self_attn.{}.{m}.weight", p.module())
}

/// The block and projection a PEFT tensor name is for, when it is a `lora_A` or `lora_B` weight
/// of an attention projection of a llama block.
fn parse_tensor_name(name: &str) -> Option<(usize, Projection)> {
    let rest = name.strip_prefix(PEFT_PREFIX)?;
    let (block, rest) = rest.split_once('.')?;
    if block.is_empty() || !block.bytes().all(|c| c.is_ascii_digit()) {
        return None;
    }
    let block = block.parse().ok()?;
    let rest = rest.strip_prefix("self_attn.")?;
    let p = *Projection::ALL
        .iter()
        .find(|p| rest.starts_with(p.module()))?;
    let m = rest[p.module().len()..].strip_prefix('.')?;
    (m == "lora_A.weight" || m == "lora_B.weight").then_some((block, p))
}

/// The Hugging Face row of row `g` of a q or k projection's output in GGUF's llama order.
///
/// Hugging Face's rope rotates the pairs `(x[i], x[i + head_dim/2])` of each head; llama.cpp's
/// converter reorders each head's rows so that the pairs are adjacent, `(x[2i], x[2i+1])`, as
/// this engine's rope takes them: GGUF row `2i + s` of a head is its Hugging Face row
/// `s · head_dim/2 + i`.
fn hf_row(head_dim: usize, g: usize) -> usize {
    let (head, j) = (g / head_dim, g % head_dim);
    head * head_dim + (j % 2) * (head_dim / 2) + j / 2
}

/// The inverse of [`hf_row`]: the GGUF row of Hugging Face row `h`.
fn gguf_row(head_dim: usize, h: usize) -> usize {
    let (head, j, half) = (h / head_dim, h % head_dim, head_dim / 2);
    head * head_dim + 2 * (j % half) + j / half
}

/// The rows (`width` wide) of `m` reordered: row `r` of the result is row `from(r)` of `m`.
fn gather_rows(m: &[f32], width: usize, from: impl Fn(usize) -> usize) -> Vec<f32> {
    let rows = m.len() / width.max(1);
    let mut out = Vec::with_capacity(m.len());
    for r in 0..rows {
        out.extend_from_slice(&m[from(r) * width..(from(r) + 1) * width]);
    }
    out
}

/// Tensor `name` of `tensors`, checked to have `shape`, as f32 values (row-major).
fn read_matrix(
    file: &Path,
    tensors: &SafeTensors<'_>,
    name: &str,
    shape: [usize; 2],
) -> Result<Vec<f32>> {
    let view = tensors
        .tensor(name)
        .map_err(|_| refuse(file, format_args!("tensor {name} is missing")))?;
    if view.shape() != shape {
        return Err(refuse(
            file,
            format_args!(
                "tensor {name} has shape {:?}, the model and r = {} need {shape:?}",
                view.shape(),
                if name.ends_with("lora_A.weight") {
                    shape[0]
                } else {
                    shape[1]
                }
            ),
        ));
    }
    let data = view.data();
    let m: Vec<f32> = match view.dtype() {
        Dtype::F32 => data
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        Dtype::F16 => data
            .chunks_exact(2)
            .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        Dtype::BF16 => data
            .chunks_exact(2)
            .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        other => {
            return Err(refuse(
                file,
                format_args!("tensor {name} is {other:?}; F32, F16 or BF16 is needed"),
            ))
        }
    };
    if m.len() != shape[0] * shape[1] || m.iter().any(|x| !x.is_finite()) {
        return Err(refuse(
            file,
            format_args!("tensor {name} holds a value that is not a finite number"),
        ));
    }
    Ok(m)
}

/// The configuration and weights files of the adapter at `path` (its directory, or its
/// safetensors file beside the configuration).
fn peft_files(path: &Path) -> (PathBuf, PathBuf) {
    if path.is_dir() {
        (path.join(PEFT_CONFIG), path.join(PEFT_WEIGHTS))
    } else {
        let dir = path.parent().unwrap_or_else(|| Path::new("."));
        (dir.join(PEFT_CONFIG), path.to_path_buf())
    }
}

impl Lora {
    /// Reads a Hugging Face PEFT LoRA adapter for `config`: `path` is the adapter's directory
    /// (`adapter_config.json` and `adapter_model.safetensors`) or its safetensors file (the
    /// configuration then read from the same directory).
    ///
    /// The rank is `r` and the scale `lora_alpha / r` (`lora_alpha / sqrt(r)` when `use_rslora`
    /// is true, as PEFT's rsLoRA). `target_modules` may name `q_proj`, `k_proj`, `v_proj` and
    /// `o_proj` (alone or behind a dotted path, `self_attn.q_proj`); a projection it does not
    /// name gets zero weights. Tensors are PEFT's
    /// `base_model.model.model.layers.{i}.self_attn.{q,k,v,o}_proj.lora_{A,B}.weight`, A of shape
    /// `[r, in]` and B `[out, r]`, in F32, F16 or BF16.
    ///
    /// **Row order of q and k.** A GGUF llama file holds the rows of `q_proj` and `k_proj` as
    /// llama.cpp's converter permuted them, so that this engine's rope rotates adjacent pairs
    /// `(x[2i], x[2i+1])` of each head, where the Hugging Face model rotates `(x[i],
    /// x[i + head_dim/2])`. The engine does not undo it, so `lora_B` of q (per query head) and
    /// of k (per KV head) is permuted the same way here (as llama.cpp's `convert_lora_to_gguf.py`
    /// does): row `2i + s` of a head is the adapter's row `s · head_dim/2 + i`, and an adapter
    /// trained on the Hugging Face model changes the same outputs here. `lora_A`, and v and o,
    /// keep their order.
    ///
    /// Refused with an `Adapter` error naming the file and the reason: an unreadable file, a
    /// `peft_type` other than `LORA`, DoRA (`use_dora`), `rank_pattern` or `alpha_pattern`,
    /// `fan_in_fan_out`, `layers_to_transform`, `layer_replication`, `exclude_modules`,
    /// `modules_to_save`, `lora_bias`, `target_parameters`, `trainable_token_indices`,
    /// `use_qalora`, `alora_invocation_tokens`, `arrow_config`, a `bias` other than `none`, a target
    /// module other than the four (the MLP's `gate_proj`, ...), a rank outside 1..=1024, a
    /// targeted tensor that is missing, of another shape or type, or not finite, and a tensor in
    /// the file that is none of these (another module, a block past the model's).
    /// `base_model_name_or_path` is not checked.
    pub fn load_peft(config: &ModelConfig, path: &Path) -> Result<Self> {
        let (config_file, weights_file) = peft_files(path);
        if config.architecture != "llama" {
            // The q and k rows are permuted into llama's interleaved rope order below.
            return Err(refuse(
                path,
                format_args!(
                    "PEFT adapters are read for llama models, not {}",
                    config.architecture
                ),
            ));
        }
        let bytes = read_file(&weights_file)?;
        let peft = PeftConfig::parse(&config_file, &read_file(&config_file)?)?;
        let tensors = SafeTensors::deserialize(&bytes)
            .map_err(|e| refuse(&weights_file, format_args!("not a safetensors file: {e}")))?;
        let mut names = tensors.names();
        names.sort_unstable();
        for name in names {
            let why = match parse_tensor_name(name) {
                None => "it is not a lora_A or lora_B weight of q_proj, k_proj, v_proj or o_proj",
                Some((b, _)) if b >= config.blocks => "its block is past the model's last",
                Some((_, p)) if !peft.targets[p as usize] => "target_modules does not name it",
                Some(_) => continue,
            };
            return Err(refuse(&weights_file, format_args!("tensor {name}: {why}")));
        }
        let (rank, dims) = (peft.rank, Projection::ALL.map(|p| p.dims(config)));
        let mut pairs = Vec::with_capacity(config.blocks * 4);
        for block in 0..config.blocks {
            for p in Projection::ALL {
                let (i, o) = dims[p as usize];
                if !peft.targets[p as usize] {
                    pairs.push(Pair {
                        a: vec![0.0; rank * i],
                        b: vec![0.0; o * rank],
                    });
                    continue;
                }
                let matrix = |m: &str, shape| {
                    read_matrix(&weights_file, &tensors, &tensor_name(block, p, m), shape)
                };
                let a = matrix("lora_A", [rank, i])?;
                let mut b = matrix("lora_B", [o, rank])?;
                if p.interleaved() {
                    b = gather_rows(&b, rank, |g| hf_row(config.head_dim, g));
                }
                pairs.push(Pair { a, b });
            }
        }
        Ok(Self {
            rank,
            scale: peft.scale,
            dims,
            pairs,
        })
    }

    /// Writes this adapter for `config` as a Hugging Face PEFT adapter directory `dir` (created
    /// when missing): `adapter_config.json` (`peft_type` `LORA`, `r`, `lora_alpha` = scale · r,
    /// the four attention projections as `target_modules`, `bias` `none`, an empty
    /// `base_model_name_or_path`) and `adapter_model.safetensors` (F32, the rows of q's and k's
    /// `lora_B` back in Hugging Face's order, the inverse of [`Lora::load_peft`]'s permutation).
    /// [`Lora::load_peft`] reads back exactly this adapter.
    pub fn write_peft(&self, config: &ModelConfig, dir: &Path) -> Result<()> {
        let dims = Projection::ALL.map(|p| p.dims(config));
        if !self.scale.is_finite() {
            return Err(refuse(
                dir,
                format_args!("the scale {} is not finite", self.scale),
            ));
        }
        if dims != self.dims || self.pairs.len() != config.blocks * 4 {
            return Err(refuse(
                dir,
                "the adapter was made for a model of another shape",
            ));
        }
        std::fs::create_dir_all(dir)
            .map_err(|e| refuse(dir, format_args!("cannot create the directory: {e}")))?;
        let mut tensors: Vec<(String, [usize; 2], Vec<u8>)> = Vec::new();
        let le = |m: &[f32]| m.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        for (block, pairs) in self.pairs.chunks_exact(4).enumerate() {
            for (p, pair) in Projection::ALL.into_iter().zip(pairs) {
                let (i, o) = dims[p as usize];
                let b = if p.interleaved() {
                    le(&gather_rows(&pair.b, self.rank, |h| {
                        gguf_row(config.head_dim, h)
                    }))
                } else {
                    le(&pair.b)
                };
                tensors.push((tensor_name(block, p, "lora_A"), [self.rank, i], le(&pair.a)));
                tensors.push((tensor_name(block, p, "lora_B"), [o, self.rank], b));
            }
        }
        let weights = dir.join(PEFT_WEIGHTS);
        let mut views = Vec::with_capacity(tensors.len());
        for (name, shape, bytes) in &tensors {
            let view = TensorView::new(Dtype::F32, shape.to_vec(), bytes)
                .map_err(|e| refuse(&weights, format_args!("tensor {name}: {e}")))?;
            views.push((name.as_str(), view));
        }
        let metadata = HashMap::from([("format".to_string(), "pt".to_string())]);
        let bytes = safetensors::serialize(views, Some(metadata))
            .map_err(|e| refuse(&weights, format_args!("cannot serialize: {e}")))?;
        write_file(&weights, &bytes)?;
        let peft = json!({
            "peft_type": "LORA",
            "task_type": "CAUSAL_LM",
            "base_model_name_or_path": "",
            "r": self.rank,
            "lora_alpha": f64::from(self.scale) * self.rank as f64,
            "lora_dropout": 0.0,
            "target_modules": Projection::ALL.map(Projection::module),
            "bias": "none",
            "use_rslora": false,
            "use_dora": false,
            "fan_in_fan_out": false,
            "inference_mode": true,
        });
        let file = dir.join(PEFT_CONFIG);
        let text = serde_json::to_string_pretty(&peft)
            .map_err(|e| refuse(&file, format_args!("cannot serialize: {e}")))?;
        write_file(&file, text.as_bytes())
    }
}
