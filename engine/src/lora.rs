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

use kvsched_gpu::{PageStore, Tier};

use crate::error::{EngineError, Result};
use crate::gguf::ModelConfig;
use crate::kv::{extend_f32, write_f32};
use crate::math::dot;

const MAGIC: &[u8; 4] = b"KVLR";
const VERSION: u32 = 1;
const HEADER: usize = 16;

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
            Self::Q | Self::O => (config.embedding, config.embedding),
            Self::K | Self::V => (config.embedding, config.kv_dim()),
        }
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
        if rank == 0 || rank > 1024 || !scale.is_finite() {
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
