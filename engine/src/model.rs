//! The model: weights loaded from a GGUF file (re-quantized to Q8_0), and the forward pass over
//! rows of tokens that both the paged step and the reference run.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{Device, Module, Tensor};

use crate::error::{EngineError, Result};
use crate::gguf::{Gguf, ModelConfig};
use crate::kv::KvLayout;
use crate::lora::{Lora, Projection};
use crate::math::{attend, rms_norm, swiglu, Heads, Rope};
use crate::tokenizer::Tokenizer;

/// A weight matrix of the model, for [`Model::linear`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Weight {
    /// `attn_q`.
    Q,
    /// `attn_k`.
    K,
    /// `attn_v`.
    V,
    /// `attn_output`.
    O,
    /// `ffn_gate`.
    Gate,
    /// `ffn_up`.
    Up,
    /// `ffn_down`.
    Down,
    /// The output projection (the token embedding when tied); the block is ignored.
    Output,
}

/// A Q8_0 matrix and its widths.
struct Linear {
    w: QMatMul,
    inp: usize,
}

impl Linear {
    fn forward(&self, x: &[f32]) -> Result<Vec<f32>> {
        let rows = x.len() / self.inp;
        let t = Tensor::from_slice(x, (rows, self.inp), &Device::Cpu)?;
        Ok(self.w.forward(&t)?.flatten_all()?.to_vec1()?)
    }
}

struct Block {
    attn_norm: Vec<f32>,
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    ffn_norm: Vec<f32>,
    gate: Linear,
    up: Linear,
    down: Linear,
}

/// A llama model loaded for the CPU: its configuration, tokenizer and Q8_0 weights.
pub struct Model {
    path: PathBuf,
    config: ModelConfig,
    tokenizer: Tokenizer,
    embed: Arc<QTensor>,
    blocks: Vec<Block>,
    output_norm: Vec<f32>,
    output: Linear,
    rope: Rope,
}

impl std::fmt::Debug for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Model")
            .field("path", &self.path)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// One sequence's rows in a forward pass: `len` tokens from row `row0`, at positions
/// `start..start + len`, with adapter `adapter` (an index into the pass's adapters).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Span {
    pub(crate) start: usize,
    pub(crate) row0: usize,
    pub(crate) len: usize,
    pub(crate) adapter: Option<usize>,
}

/// Where a forward pass finds the keys and values a span attends over.
pub(crate) trait Context {
    /// The keys and values of positions `0..start + len` of span `span` at `layer`, position-major,
    /// given the span's new rows (`new_k`, `new_v`: positions `start..start + len`).
    fn context(
        &mut self,
        span: usize,
        layer: usize,
        new_k: &[f32],
        new_v: &[f32],
    ) -> Result<(&[f32], &[f32])>;
}

/// The keys and values a forward pass computed: per layer, `rows * kv_dim` values.
pub(crate) struct StepKv {
    pub(crate) k: Vec<Vec<f32>>,
    pub(crate) v: Vec<Vec<f32>>,
}

fn load_err(g: &Gguf, name: &str, e: candle_core::Error) -> EngineError {
    let message = e.to_string();
    g.corrupt(format!(
        "tensor {name}: {}",
        message.lines().next().unwrap_or(&message)
    ))
}

impl Model {
    /// Loads the GGUF llama model at `path`: checks the whole file's header, metadata and tensor
    /// table first (a typed one-line error naming the file), then reads the weights, re-quantizing
    /// every matrix to Q8_0.
    pub fn load(path: impl AsRef<Path>) -> Result<Self> {
        let mut g = Gguf::open(path.as_ref())?;
        let config = g.config()?;
        let tokenizer = Tokenizer::from_gguf(&g)?;
        if tokenizer.vocab_size() != config.vocab {
            return Err(g.corrupt(format!(
                "the tokenizer has {} tokens, token_embd.weight {} rows",
                tokenizer.vocab_size(),
                config.vocab
            )));
        }
        let embed = Arc::new(Self::q8(&mut g, "token_embd.weight")?);
        let mut blocks = Vec::with_capacity(config.blocks);
        for b in 0..config.blocks {
            let name = |t: &str| format!("blk.{b}.{t}.weight");
            blocks.push(Block {
                attn_norm: Self::vector(&mut g, &name("attn_norm"))?,
                q: Self::linear_of(&mut g, &name("attn_q"))?,
                k: Self::linear_of(&mut g, &name("attn_k"))?,
                v: Self::linear_of(&mut g, &name("attn_v"))?,
                o: Self::linear_of(&mut g, &name("attn_output"))?,
                ffn_norm: Self::vector(&mut g, &name("ffn_norm"))?,
                gate: Self::linear_of(&mut g, &name("ffn_gate"))?,
                up: Self::linear_of(&mut g, &name("ffn_up"))?,
                down: Self::linear_of(&mut g, &name("ffn_down"))?,
            });
        }
        let output = if config.tied_embeddings {
            Linear {
                w: QMatMul::QTensor(embed.clone()),
                inp: config.embedding,
            }
        } else {
            Self::linear_of(&mut g, "output.weight")?
        };
        Ok(Self {
            output_norm: Self::vector(&mut g, "output_norm.weight")?,
            rope: Rope::new(config.head_dim, config.rope_base, config.context_length),
            path: g.path.clone(),
            config,
            tokenizer,
            embed,
            blocks,
            output,
        })
    }

    /// Reads tensor `name` as Q8_0 (re-quantizing any other type).
    fn q8(g: &mut Gguf, name: &str) -> Result<QTensor> {
        let t = g
            .content
            .tensor(&mut g.file, name, &Device::Cpu)
            .map_err(|e| load_err(g, name, e))?;
        if t.dtype() == GgmlDType::Q8_0 {
            return Ok(t);
        }
        let full = t.dequantize(&Device::Cpu)?;
        Ok(QTensor::quantize(&full, GgmlDType::Q8_0)?)
    }

    fn linear_of(g: &mut Gguf, name: &str) -> Result<Linear> {
        let t = Self::q8(g, name)?;
        let (_, inp) = t.shape().dims2()?;
        // The QTensor variant is built directly: `QMatMul::from_qtensor` would dequantize to f32
        // when CANDLE_DEQUANTIZE_ALL is set, and f32 matmuls are not batch-invariant.
        Ok(Linear {
            w: QMatMul::QTensor(Arc::new(t)),
            inp,
        })
    }

    fn vector(g: &mut Gguf, name: &str) -> Result<Vec<f32>> {
        let t = g
            .content
            .tensor(&mut g.file, name, &Device::Cpu)
            .map_err(|e| load_err(g, name, e))?;
        Ok(t.dequantize(&Device::Cpu)?.flatten_all()?.to_vec1()?)
    }

    /// The file the model was loaded from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The architecture and hyper-parameters.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// The tokenizer built from the file's metadata.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// The KV page layout for `tokens_per_block` positions a page.
    pub fn kv_layout(&self, tokens_per_block: usize) -> KvLayout {
        KvLayout::new(&self.config, tokens_per_block)
    }

    /// `x W^T` for one weight (rows of `x` are inputs, `x.len()` a multiple of the input width):
    /// the Q8_0 matmul the forward pass runs, exposed so that its batch invariance can be tested.
    pub fn linear(&self, block: usize, weight: Weight, x: &[f32]) -> Result<Vec<f32>> {
        let b = self
            .blocks
            .get(block)
            .ok_or_else(|| EngineError::Batch(format!("no block {block}")))?;
        let l = match weight {
            Weight::Q => &b.q,
            Weight::K => &b.k,
            Weight::V => &b.v,
            Weight::O => &b.o,
            Weight::Gate => &b.gate,
            Weight::Up => &b.up,
            Weight::Down => &b.down,
            Weight::Output => &self.output,
        };
        if x.is_empty() || x.len() % l.inp != 0 {
            return Err(EngineError::Batch(format!(
                "{} inputs are not rows of {}",
                x.len(),
                l.inp
            )));
        }
        l.forward(x)
    }

    pub(crate) fn heads(&self) -> Heads {
        Heads {
            heads: self.config.heads,
            kv_heads: self.config.kv_heads,
            head_dim: self.config.head_dim,
        }
    }

    /// The forward pass over `tokens` (the spans' rows, in order): embeddings, then per block the
    /// projections and MLP over all rows at once (candle's Q8_0 matmuls, row-invariant), rope at
    /// each row's position, LoRA per span and attention per row through `ctx`; returns the logits
    /// of `logit_rows` (`logit_rows.len() * vocab`) and the keys and values computed.
    pub(crate) fn forward(
        &self,
        tokens: &[u32],
        spans: &[Span],
        adapters: &[Lora],
        ctx: &mut dyn Context,
        logit_rows: &[usize],
    ) -> Result<(Vec<f32>, StepKv)> {
        let c = &self.config;
        let (e, kvd, rows) = (c.embedding, c.kv_dim(), tokens.len());
        let ids = Tensor::from_slice(tokens, rows, &Device::Cpu)?;
        let mut x: Vec<f32> = self.embed.embedding(&ids)?.flatten_all()?.to_vec1()?;
        let mut step = StepKv {
            k: Vec::with_capacity(c.blocks),
            v: Vec::with_capacity(c.blocks),
        };
        let (mut xn, mut scores) = (Vec::new(), Vec::new());
        let mut att = vec![0f32; rows * e];
        let heads = self.heads();
        for (l, b) in self.blocks.iter().enumerate() {
            rms_norm(&x, &b.attn_norm, c.rms_eps, &mut xn);
            let mut q = b.q.forward(&xn)?;
            let mut k = b.k.forward(&xn)?;
            let mut v = b.v.forward(&xn)?;
            for span in spans {
                if let Some(a) = span.adapter {
                    for r in span.row0..span.row0 + span.len {
                        let xr = &xn[r * e..(r + 1) * e];
                        adapters[a].apply(l, Projection::Q, xr, &mut q[r * e..(r + 1) * e]);
                        adapters[a].apply(l, Projection::K, xr, &mut k[r * kvd..(r + 1) * kvd]);
                        adapters[a].apply(l, Projection::V, xr, &mut v[r * kvd..(r + 1) * kvd]);
                    }
                }
                for i in 0..span.len {
                    let (r, pos) = (span.row0 + i, span.start + i);
                    self.rope.apply(&mut q[r * e..(r + 1) * e], pos);
                    self.rope.apply(&mut k[r * kvd..(r + 1) * kvd], pos);
                }
            }
            for (s, span) in spans.iter().enumerate() {
                let rows = span.row0..span.row0 + span.len;
                let (new_k, new_v) = (
                    &k[rows.start * kvd..rows.end * kvd],
                    &v[rows.start * kvd..rows.end * kvd],
                );
                let (kc, vc) = ctx.context(s, l, new_k, new_v)?;
                for i in 0..span.len {
                    let r = span.row0 + i;
                    let n = span.start + i + 1;
                    let out = &mut att[r * e..(r + 1) * e];
                    attend(heads, &q[r * e..(r + 1) * e], kc, vc, n, &mut scores, out);
                }
            }
            let mut o = b.o.forward(&att)?;
            for span in spans {
                if let Some(a) = span.adapter {
                    for r in span.row0..span.row0 + span.len {
                        let ar = &att[r * e..(r + 1) * e];
                        adapters[a].apply(l, Projection::O, ar, &mut o[r * e..(r + 1) * e]);
                    }
                }
            }
            for (xi, oi) in x.iter_mut().zip(&o) {
                *xi += oi;
            }
            rms_norm(&x, &b.ffn_norm, c.rms_eps, &mut xn);
            let mut gate = b.gate.forward(&xn)?;
            let up = b.up.forward(&xn)?;
            swiglu(&mut gate, &up);
            let down = b.down.forward(&gate)?;
            for (xi, di) in x.iter_mut().zip(&down) {
                *xi += di;
            }
            step.k.push(k);
            step.v.push(v);
        }
        if logit_rows.is_empty() {
            return Ok((Vec::new(), step));
        }
        let mut last = Vec::with_capacity(logit_rows.len() * e);
        for &r in logit_rows {
            last.extend_from_slice(&x[r * e..(r + 1) * e]);
        }
        rms_norm(&last, &self.output_norm, c.rms_eps, &mut xn);
        Ok((self.output.forward(&xn)?, step))
    }
}
