//! The mechanism model: a small Mamba-2-style hybrid with seeded random weights. Not a language
//! model: it exists so that kvsched's state slots, snapshots and pages can be shown to carry a
//! recurrent model's computation exactly (every identity test compares tokens and logits bit for
//! bit against one request run alone).
//!
//! Layers are pre-norm residual blocks; layer `l` is attention when `(l + 1) % attention_every ==
//! 0`, else a Mamba-2-style mixer ([`super::mamba`]). Attention is causal multi-head attention with
//! no positional encoding (the recurrent layers carry order). Every product is a plain loop in a
//! fixed order, one row at a time, so a row's result does not depend on the batch it is in.

use super::mamba::{Mamba, MambaDims};

/// The mechanism model's shape and seed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HybridSpec {
    /// Token ids are below this.
    pub vocab: usize,
    /// Width of the residual stream.
    pub embedding: usize,
    /// Layers.
    pub layers: usize,
    /// Every this many layers, one is attention (the last of each group of this many).
    pub attention_every: usize,
    /// Attention heads (each `embedding / heads` wide; keys and values as wide as queries).
    pub heads: usize,
    /// The recurrent layers' dimensions.
    pub mamba: MambaDims,
    /// The weights' seed.
    pub seed: u64,
}

impl HybridSpec {
    /// A small hybrid: 64 tokens, width 32, 6 layers of which 2 attention (every third), 2
    /// attention heads, Mamba-2 mixers of 4 heads of 16 with a state of 8 and a convolution of 4.
    pub const SMALL: HybridSpec = HybridSpec {
        vocab: 64,
        embedding: 32,
        layers: 6,
        attention_every: 3,
        heads: 2,
        mamba: MambaDims {
            heads: 4,
            head_dim: 16,
            state: 8,
            conv: 4,
        },
        seed: 46,
    };

    /// `Err` naming what is wrong: no layer, no attention layer (a hybrid layout needs one),
    /// widths of 0, heads that do not divide the width, a convolution of less than 2.
    pub fn validate(&self) -> Result<(), &'static str> {
        if self.vocab == 0 || self.embedding == 0 || self.layers == 0 {
            return Err("a hybrid model needs tokens, a width and layers");
        }
        if self.attention_every == 0 || self.attention_every > self.layers {
            return Err(
                "a hybrid layout with no attention layer: attention_every must be 1..=layers",
            );
        }
        if self.heads == 0 || self.embedding % self.heads != 0 {
            return Err("attention heads must divide the width");
        }
        let m = self.mamba;
        if m.heads == 0 || m.head_dim == 0 || m.state == 0 || m.conv < 2 {
            return Err("a recurrent layer needs heads, a state and a convolution of at least 2");
        }
        Ok(())
    }

    /// Whether layer `l` is attention.
    pub const fn is_attention(&self, l: usize) -> bool {
        (l + 1) % self.attention_every == 0
    }

    /// Attention layers.
    pub const fn attention_layers(&self) -> usize {
        self.layers / self.attention_every
    }

    /// Recurrent layers.
    pub const fn recurrent_layers(&self) -> usize {
        self.layers - self.attention_layers()
    }

    /// Floats of one request's recurrent state (every recurrent layer's).
    pub const fn state_len(&self) -> usize {
        self.recurrent_layers() * self.mamba.state_len()
    }

    /// Floats of one position's keys and values over the attention layers.
    pub const fn kv_len(&self) -> usize {
        self.attention_layers() * 2 * self.embedding
    }
}

/// A deterministic generator of weights (xorshift64*).
pub(super) struct Seeded(u64);

impl Seeded {
    pub(super) fn new(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }

    /// `n` values uniform in `[-scale, scale)`.
    pub(super) fn values(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n)
            .map(|_| {
                self.0 ^= self.0 >> 12;
                self.0 ^= self.0 << 25;
                self.0 ^= self.0 >> 27;
                let u =
                    (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 40) as f32 / (1u64 << 24) as f32;
                (2.0 * u - 1.0) * scale
            })
            .collect()
    }

    /// An `out × inp` matrix scaled by `1 / sqrt(inp)`.
    pub(super) fn matrix(&mut self, out: usize, inp: usize) -> Matrix {
        Matrix {
            w: self.values(out * inp, 1.0 / (inp as f32).sqrt()),
            inp,
        }
    }
}

/// A row-major `out × inp` matrix.
pub(super) struct Matrix {
    w: Vec<f32>,
    inp: usize,
}

impl Matrix {
    /// `y = W x`, each output the engine's `dot` (a fixed order).
    pub(super) fn apply(&self, x: &[f32], y: &mut Vec<f32>) {
        y.clear();
        y.extend(
            self.w
                .chunks_exact(self.inp)
                .map(|row| crate::math::dot(row, x)),
        );
    }
}

/// One layer's weights.
pub(super) enum Mixer {
    /// Attention: q, k, v and o projections.
    Attention {
        qkv: [Matrix; 3],
        o: Matrix,
        /// Its index among the attention layers.
        index: usize,
    },
    /// A recurrent mixer and its index among the recurrent layers.
    Recurrent(Box<Mamba>, usize),
}

/// A layer: its norm and mixer.
pub(super) struct Layer {
    pub(super) norm: Vec<f32>,
    pub(super) mixer: Mixer,
}

/// The mechanism model: Mamba-2-style recurrent layers and attention layers, seeded random weights.
pub struct HybridModel {
    pub(super) spec: HybridSpec,
    pub(super) embed: Vec<f32>,
    pub(super) layers: Vec<Layer>,
    pub(super) norm: Vec<f32>,
    pub(super) head: Matrix,
}

impl std::fmt::Debug for HybridModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HybridModel")
            .field("spec", &self.spec)
            .finish_non_exhaustive()
    }
}

impl HybridModel {
    /// The model of `spec` with weights drawn from its seed (`Err`: [`HybridSpec::validate`]).
    pub fn new(spec: HybridSpec) -> crate::Result<Self> {
        spec.validate()
            .map_err(|m| crate::EngineError::Batch(m.to_string()))?;
        let (e, mut rng) = (spec.embedding, Seeded::new(spec.seed));
        let (mut att, mut rec) = (0, 0);
        let layers = (0..spec.layers)
            .map(|l| {
                let mixer = if spec.is_attention(l) {
                    att += 1;
                    Mixer::Attention {
                        qkv: [rng.matrix(e, e), rng.matrix(e, e), rng.matrix(e, e)],
                        o: rng.matrix(e, e),
                        index: att - 1,
                    }
                } else {
                    rec += 1;
                    Mixer::Recurrent(Box::new(Mamba::new(spec.mamba, e, &mut rng)), rec - 1)
                };
                let norm = rng.values(e, 0.25).iter().map(|v| 1.0 + v).collect();
                Layer { norm, mixer }
            })
            .collect();
        Ok(Self {
            embed: rng.values(spec.vocab * e, 1.0),
            norm: rng.values(e, 0.25).iter().map(|v| 1.0 + v).collect(),
            head: rng.matrix(spec.vocab, e),
            spec,
            layers,
        })
    }

    /// The shape.
    pub fn spec(&self) -> &HybridSpec {
        &self.spec
    }
}
