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
use crate::math::{attend, geglu, rms_norm, soft_cap, swiglu, Heads, Past, Rope, RopeStyle};
use crate::tokenizer::Tokenizer;

/// A weight matrix of the model as the forward pass multiplies by it, for [`Model::linear`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Weight {
    /// `attn_q`, `attn_k` and `attn_v` stacked (outputs: queries, then keys, then values).
    Qkv,
    /// `attn_output`.
    O,
    /// `ffn_gate` and `ffn_up` stacked (outputs: gate, then up).
    GateUp,
    /// `ffn_down`.
    Down,
    /// The output projection (the token embedding when tied); the block is ignored.
    Output,
}

/// A Q8_0 matrix: `inp` inputs, stored `padded` wide (zero columns after `inp`).
struct Linear {
    w: QMatMul,
    inp: usize,
    padded: usize,
}

/// Whether candle runs Q8_0 matmuls through its repacked VNNI tiles on this CPU (when the input
/// width is a multiple of 256): several times faster than its vec-dot path, and batch-invariant
/// as well.
fn repacked_q8_0() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        (is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512vnni"))
            || (is_x86_feature_detected!("avxvnni") && is_x86_feature_detected!("avx2"))
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// candle's repacked kernels take input widths in blocks of this many.
const REPACK_K: usize = 256;

impl Linear {
    /// `t` (out × in) as a Q8_0 matrix; its input width padded with zero columns to a multiple of
    /// 256 where that gets candle's repacked kernels.
    fn new(t: QTensor) -> Result<Self> {
        let (out, inp) = t.shape().dims2()?;
        let padded = if repacked_q8_0() {
            inp.next_multiple_of(REPACK_K)
        } else {
            inp
        };
        let t = if padded == inp && t.dtype() == GgmlDType::Q8_0 {
            t
        } else {
            let full = t.dequantize(&Device::Cpu)?;
            let full = if padded == inp {
                full
            } else {
                full.pad_with_zeros(1, 0, padded - inp)?
            };
            QTensor::quantize(&full, GgmlDType::Q8_0)?
        };
        debug_assert_eq!(t.shape().dims2()?, (out, padded));
        // The QTensor variant is built directly: `QMatMul::from_qtensor` would dequantize to f32
        // when CANDLE_DEQUANTIZE_ALL is set, and f32 matmuls are not batch-invariant.
        Ok(Self {
            w: QMatMul::QTensor(Arc::new(t)),
            inp,
            padded,
        })
    }

    fn forward(&self, x: &[f32]) -> Result<Vec<f32>> {
        let rows = x.len() / self.inp;
        let t = if self.padded == self.inp {
            Tensor::from_slice(x, (rows, self.inp), &Device::Cpu)?
        } else {
            let mut wide = vec![0f32; rows * self.padded];
            for (w, r) in wide
                .chunks_exact_mut(self.padded)
                .zip(x.chunks_exact(self.inp))
            {
                w[..self.inp].copy_from_slice(r);
            }
            Tensor::from_vec(wide, (rows, self.padded), &Device::Cpu)?
        };
        Ok(self.w.forward(&t)?.flatten_all()?.to_vec1()?)
    }
}

struct Block {
    attn_norm: Vec<f32>,
    qkv: Linear,
    o: Linear,
    ffn_norm: Vec<f32>,
    gate_up: Linear,
    down: Linear,
    gemma: Option<GemmaNorms>,
}

/// A Gemma 3 block's further norms: per query and key head (before rope), and on the attention's
/// and the feed-forward network's outputs (before the residual).
struct GemmaNorms {
    q: Vec<f32>,
    k: Vec<f32>,
    post_attention: Vec<f32>,
    post_ffw: Vec<f32>,
}

/// A llama or Gemma 3 model loaded for the CPU: its configuration, tokenizer and Q8_0 weights.
pub struct Model {
    path: PathBuf,
    config: ModelConfig,
    tokenizer: Tokenizer,
    embed: Arc<QTensor>,
    blocks: Vec<Block>,
    output_norm: Vec<f32>,
    output: Linear,
    rope: Rope,
    /// The local (sliding-window) layers' rope, when its base differs (Gemma 3).
    local_rope: Option<Rope>,
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
    /// The keys and values of span `span` at `layer`, position-major, from a position `base` at
    /// or before `from` up to `start + len`, given the span's new rows (`new_k`, `new_v`:
    /// positions `start..start + len`); returns `(base, keys, values)`. Positions before `from`
    /// are attended to by no row of the span (a sliding window), so need not be read.
    fn context(
        &mut self,
        span: usize,
        layer: usize,
        from: usize,
        new_k: &[f32],
        new_v: &[f32],
    ) -> Result<(usize, &[f32], &[f32])>;
}

/// The keys and values a forward pass computed: per layer, `rows * kv_dim` values.
pub(crate) struct StepKv {
    pub(crate) k: Vec<Vec<f32>>,
    pub(crate) v: Vec<Vec<f32>>,
}

fn load_err(g: &Gguf, name: &str, e: &candle_core::Error) -> EngineError {
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
            blocks.push(Self::block(&mut g, b, config.gemma.is_some())?);
        }
        let output = if config.tied_embeddings {
            Linear::new(Self::q8(&mut g, "token_embd.weight")?)?
        } else {
            Self::linear_of(&mut g, "output.weight")?
        };
        let (hd, n) = (config.head_dim, config.context_length);
        let (rope, local_rope) = match &config.gemma {
            None => (
                Rope::new(hd, config.rope_base, n, RopeStyle::Interleaved),
                None,
            ),
            Some(gm) => (
                Rope::new(hd, config.rope_base, n, RopeStyle::Halves),
                Some(Rope::new(hd, gm.local_rope_base, n, RopeStyle::Halves)),
            ),
        };
        Ok(Self {
            output_norm: Self::vector(&mut g, "output_norm.weight")?,
            rope,
            local_rope,
            path: g.path.clone(),
            config,
            tokenizer,
            embed,
            blocks,
            output,
        })
    }

    /// Block `b`'s weights, with Gemma 3's further norms when `gemma`.
    fn block(g: &mut Gguf, b: usize, gemma: bool) -> Result<Block> {
        let name = |t: &str| format!("blk.{b}.{t}.weight");
        let norms = if gemma {
            Some(GemmaNorms {
                q: Self::vector(g, &name("attn_q_norm"))?,
                k: Self::vector(g, &name("attn_k_norm"))?,
                post_attention: Self::vector(g, &name("post_attention_norm"))?,
                post_ffw: Self::vector(g, &name("post_ffw_norm"))?,
            })
        } else {
            None
        };
        Ok(Block {
            attn_norm: Self::vector(g, &name("attn_norm"))?,
            qkv: Self::stacked(g, &[name("attn_q"), name("attn_k"), name("attn_v")])?,
            o: Self::linear_of(g, &name("attn_output"))?,
            ffn_norm: Self::vector(g, &name("ffn_norm"))?,
            gate_up: Self::stacked(g, &[name("ffn_gate"), name("ffn_up")])?,
            down: Self::linear_of(g, &name("ffn_down"))?,
            gemma: norms,
        })
    }

    /// Reads tensor `name` as Q8_0 (re-quantizing any other type).
    fn q8(g: &mut Gguf, name: &str) -> Result<QTensor> {
        let t = g
            .content
            .tensor(&mut g.file, name, &Device::Cpu)
            .map_err(|e| load_err(g, name, &e))?;
        if t.dtype() == GgmlDType::Q8_0 {
            return Ok(t);
        }
        let full = t.dequantize(&Device::Cpu)?;
        Ok(QTensor::quantize(&full, GgmlDType::Q8_0)?)
    }

    fn linear_of(g: &mut Gguf, name: &str) -> Result<Linear> {
        Linear::new(Self::q8(g, name)?)
    }

    /// Matrices with the same inputs stacked into one (their outputs one after the other), so
    /// that the activations are quantized once and one kernel runs. Q8_0 quantizes each row on
    /// its own, so stacking changes no weight.
    fn stacked(g: &mut Gguf, names: &[String]) -> Result<Linear> {
        let mut parts = Vec::with_capacity(names.len());
        for name in names {
            let t = g
                .content
                .tensor(&mut g.file, name, &Device::Cpu)
                .map_err(|e| load_err(g, name, &e))?;
            let t = if t.dtype() == GgmlDType::Q8_0 {
                t
            } else {
                QTensor::quantize(&t.dequantize(&Device::Cpu)?, GgmlDType::Q8_0)?
            };
            parts.push(t.dequantize(&Device::Cpu)?);
        }
        let full = Tensor::cat(&parts, 0)?;
        Linear::new(QTensor::quantize(&full, GgmlDType::Q8_0)?)
    }

    fn vector(g: &mut Gguf, name: &str) -> Result<Vec<f32>> {
        let t = g
            .content
            .tensor(&mut g.file, name, &Device::Cpu)
            .map_err(|e| load_err(g, name, &e))?;
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

    /// Renders chats through `template` instead of the file's chat template
    /// ([`Tokenizer::set_chat_template`]).
    pub fn set_chat_template(&mut self, template: impl Into<String>) {
        self.tokenizer.set_chat_template(template);
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
            Weight::Qkv => &b.qkv,
            Weight::O => &b.o,
            Weight::GateUp => &b.gate_up,
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
        let c = &self.config;
        Heads {
            heads: c.heads,
            kv_heads: c.kv_heads,
            head_dim: c.head_dim,
            scale: c
                .gemma
                .as_ref()
                .map_or_else(|| 1.0 / (c.head_dim as f32).sqrt(), |g| g.attention_scale),
        }
    }

    /// Block `l`'s LoRA deltas on the q, k and v rows of each span with an adapter (its input rows
    /// `xn`).
    fn adapt(
        &self,
        l: usize,
        spans: &[Span],
        adapters: &[Lora],
        xn: &[f32],
        (q, k, v): (&mut [f32], &mut [f32], &mut [f32]),
    ) {
        let (e, qd, kvd) = (
            self.config.embedding,
            self.config.q_dim(),
            self.config.kv_dim(),
        );
        for span in spans {
            if let Some(a) = span.adapter {
                for r in span.row0..span.row0 + span.len {
                    let xr = &xn[r * e..(r + 1) * e];
                    adapters[a].apply(l, Projection::Q, xr, &mut q[r * qd..(r + 1) * qd]);
                    adapters[a].apply(l, Projection::K, xr, &mut k[r * kvd..(r + 1) * kvd]);
                    adapters[a].apply(l, Projection::V, xr, &mut v[r * kvd..(r + 1) * kvd]);
                }
            }
        }
    }

    /// Rope at each row's position on q and k of block `l` (the local rope on a local layer).
    fn rotate(&self, l: usize, spans: &[Span], q: &mut [f32], k: &mut [f32]) {
        let (qd, kvd) = (self.config.q_dim(), self.config.kv_dim());
        let rope = match (&self.local_rope, self.config.window(l)) {
            (Some(local), Some(_)) => local,
            _ => &self.rope,
        };
        for span in spans {
            for i in 0..span.len {
                let (r, pos) = (span.row0 + i, span.start + i);
                rope.apply(&mut q[r * qd..(r + 1) * qd], pos);
                rope.apply(&mut k[r * kvd..(r + 1) * kvd], pos);
            }
        }
    }

    /// Block `l`'s attention, from its input rows `xn` to its output projection (LoRA included):
    /// q, k and v, Gemma's per-head norms, rope, and each row's attention over its sequence's
    /// positions in its window through `ctx`. The new keys and values are pushed onto `step`.
    fn attention(
        &self,
        l: usize,
        (spans, adapters): (&[Span], &[Lora]),
        xn: &[f32],
        ctx: &mut dyn Context,
        step: &mut StepKv,
    ) -> Result<Vec<f32>> {
        let c = &self.config;
        let (qd, kvd, b) = (c.q_dim(), c.kv_dim(), &self.blocks[l]);
        let qkv = b.qkv.forward(xn)?;
        let (mut q, mut k, mut v) = split3(&qkv, qd, kvd);
        self.adapt(l, spans, adapters, xn, (&mut q, &mut k, &mut v));
        if let Some(g) = &b.gemma {
            let mut normed = Vec::new();
            rms_norm(&q, &g.q, c.rms_eps, &mut normed);
            q.copy_from_slice(&normed);
            rms_norm(&k, &g.k, c.rms_eps, &mut normed);
            k.copy_from_slice(&normed);
        }
        self.rotate(l, spans, &mut q, &mut k);
        let (heads, mut scores) = (self.heads(), Vec::new());
        let mut att = vec![0f32; xn.len() / c.embedding * qd];
        for (s, span) in spans.iter().enumerate() {
            let rows = span.row0 * kvd..(span.row0 + span.len) * kvd;
            let from = c.window_start(l, span.start);
            let (base, kc, vc) = ctx.context(s, l, from, &k[rows.clone()], &v[rows])?;
            for i in 0..span.len {
                let (r, pos) = (span.row0 + i, span.start + i);
                let past = Past {
                    k: kc,
                    v: vc,
                    base,
                    range: (c.window_start(l, pos), pos + 1),
                };
                attend(
                    heads,
                    &q[r * qd..(r + 1) * qd],
                    past,
                    &mut scores,
                    &mut att[r * qd..(r + 1) * qd],
                );
            }
        }
        let mut o = b.o.forward(&att)?;
        for span in spans {
            if let Some(a) = span.adapter {
                for r in span.row0..span.row0 + span.len {
                    let (ar, e) = (&att[r * qd..(r + 1) * qd], c.embedding);
                    adapters[a].apply(l, Projection::O, ar, &mut o[r * e..(r + 1) * e]);
                }
            }
        }
        step.k.push(k);
        step.v.push(v);
        Ok(o)
    }

    /// Block `l`'s feed-forward network on its input rows `xn`: SwiGLU (llama) or GeGLU (Gemma).
    fn feed_forward(&self, l: usize, xn: &[f32]) -> Result<Vec<f32>> {
        let (b, f) = (&self.blocks[l], self.config.feed_forward);
        let mut gate_up = b.gate_up.forward(xn)?;
        let hidden = if b.gemma.is_some() {
            geglu(&mut gate_up, f)
        } else {
            swiglu(&mut gate_up, f)
        };
        b.down.forward(hidden)
    }

    /// `x += out`, `out` RMS-normed by `post` first when given (Gemma's post-norms).
    fn residual(&self, x: &mut [f32], out: &[f32], post: Option<&[f32]>, buf: &mut Vec<f32>) {
        let out = match post {
            Some(w) => {
                rms_norm(out, w, self.config.rms_eps, buf);
                buf.as_slice()
            }
            None => out,
        };
        for (xi, oi) in x.iter_mut().zip(out) {
            *xi += oi;
        }
    }

    /// The forward pass over `tokens` (the spans' rows, in order): embeddings (scaled by
    /// `sqrt(embedding)` for Gemma), then per block the projections and MLP over all rows at once
    /// (candle's Q8_0 matmuls, row-invariant), rope at each row's position, LoRA per span and
    /// attention per row through `ctx`; returns the logits of `logit_rows` (`logit_rows.len() *
    /// vocab`, soft-capped when the model says so) and the keys and values computed.
    pub(crate) fn forward(
        &self,
        tokens: &[u32],
        spans: &[Span],
        adapters: &[Lora],
        ctx: &mut dyn Context,
        logit_rows: &[usize],
    ) -> Result<(Vec<f32>, StepKv)> {
        let c = &self.config;
        let (e, rows) = (c.embedding, tokens.len());
        let ids = Tensor::from_slice(tokens, rows, &Device::Cpu)?;
        let mut x: Vec<f32> = self.embed.embedding(&ids)?.flatten_all()?.to_vec1()?;
        if c.gemma.is_some() {
            let scale = (e as f32).sqrt();
            for xi in &mut x {
                *xi *= scale;
            }
        }
        let mut step = StepKv {
            k: Vec::with_capacity(c.blocks),
            v: Vec::with_capacity(c.blocks),
        };
        let (mut xn, mut buf) = (Vec::new(), Vec::new());
        for (l, b) in self.blocks.iter().enumerate() {
            let post = b.gemma.as_ref();
            rms_norm(&x, &b.attn_norm, c.rms_eps, &mut xn);
            let o = self.attention(l, (spans, adapters), &xn, ctx, &mut step)?;
            let post_attention = post.map(|g| g.post_attention.as_slice());
            self.residual(&mut x, &o, post_attention, &mut buf);
            rms_norm(&x, &b.ffn_norm, c.rms_eps, &mut xn);
            let down = self.feed_forward(l, &xn)?;
            self.residual(&mut x, &down, post.map(|g| g.post_ffw.as_slice()), &mut buf);
        }
        if logit_rows.is_empty() {
            return Ok((Vec::new(), step));
        }
        let mut last = Vec::with_capacity(logit_rows.len() * e);
        for &r in logit_rows {
            last.extend_from_slice(&x[r * e..(r + 1) * e]);
        }
        rms_norm(&last, &self.output_norm, c.rms_eps, &mut xn);
        let mut logits = self.output.forward(&xn)?;
        if let Some(cap) = c.gemma.as_ref().and_then(|g| g.final_softcap) {
            soft_cap(&mut logits, cap);
        }
        Ok((logits, step))
    }
}

/// Rows of `[q | k | v]` (`e + 2 kvd` wide) split into rows of q (`e` wide), of k and of v.
fn split3(qkv: &[f32], e: usize, kvd: usize) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let rows = qkv.len() / (e + 2 * kvd);
    let (mut q, mut k, mut v) = (
        Vec::with_capacity(rows * e),
        Vec::with_capacity(rows * kvd),
        Vec::with_capacity(rows * kvd),
    );
    for row in qkv.chunks_exact(e + 2 * kvd) {
        q.extend_from_slice(&row[..e]);
        k.extend_from_slice(&row[e..e + kvd]);
        v.extend_from_slice(&row[e + kvd..]);
    }
    (q, k, v)
}
