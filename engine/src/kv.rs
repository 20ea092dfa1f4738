//! How the KV cache lies in a [`HostKvStore`]'s pages, and the two ways the engine touches them:
//! gathering a sequence's past keys and values from its page table, and writing a step's new
//! keys and values into the pages at their positions.
//!
//! # Layout
//!
//! A page holds `tokens_per_block` consecutive positions of one sequence, for every layer. The
//! store is layer-major ([`PoolShape::with_layers`] with one piece per transformer block): page
//! `p`'s piece for layer `l` holds the keys of its positions, then their values, each position's
//! `kv_heads * head_dim` values as little-endian `f32`:
//!
//! ```text
//!   piece (layer l of page p) = [ K slot 0 | K slot 1 | … | K slot T-1 | V slot 0 | … | V slot T-1 ]
//!   slot j of page table entry i = position i * T + j
//! ```

use kvsched_gpu::{HostKvStore, PageStore, PoolShape, Tier};

use crate::error::{EngineError, Result};
use crate::gguf::ModelConfig;

/// The shape of a model's KV pages: layers, KV width and positions per page.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvLayout {
    /// Transformer blocks (one piece of every page each).
    pub layers: usize,
    /// `kv_heads * head_dim`: the values one position keeps per layer for K (and as many for V).
    pub kv_dim: usize,
    /// Positions one page holds.
    pub tokens_per_block: usize,
}

const F32: usize = std::mem::size_of::<f32>();

impl KvLayout {
    /// The layout of `config`'s KV cache with `tokens_per_block` positions a page.
    pub fn new(config: &ModelConfig, tokens_per_block: usize) -> Self {
        Self {
            layers: config.blocks,
            kv_dim: config.kv_dim(),
            tokens_per_block,
        }
    }

    /// Bytes of one position's K (or V) in one layer.
    pub const fn slot_bytes(&self) -> usize {
        self.kv_dim * F32
    }

    /// Bytes of one layer's piece of a page (K and V of every slot).
    pub const fn piece_bytes(&self) -> usize {
        2 * self.tokens_per_block * self.slot_bytes()
    }

    /// Bytes of one page (all layers).
    pub const fn page_bytes(&self) -> usize {
        self.layers * self.piece_bytes()
    }

    /// KV bytes one position occupies (all layers, K and V).
    pub const fn bytes_per_token(&self) -> usize {
        2 * self.layers * self.slot_bytes()
    }

    /// Pages that `positions` positions need.
    pub const fn pages_for(&self, positions: usize) -> usize {
        positions.div_ceil(self.tokens_per_block)
    }

    /// The layout of one KV group's pages: `layers` of `config`'s layers a page (a hybrid model's
    /// global layers, or its sliding-window ones, on KV groups), `tokens_per_block` positions.
    pub fn of_group(config: &ModelConfig, tokens_per_block: usize, layers: usize) -> Self {
        Self {
            layers,
            kv_dim: config.kv_dim(),
            tokens_per_block,
        }
    }

    /// The layer-major pool shape for `gpu_pages` GPU pages and `host_pages` host pages.
    pub fn pool_shape(&self, gpu_pages: u32, host_pages: u32) -> PoolShape {
        PoolShape::new(self.page_bytes(), gpu_pages, host_pages).with_layers(self.layers as u32)
    }

    /// The layout a store of `shape` has for `config`, or why it does not fit the model.
    pub fn of_shape(config: &ModelConfig, shape: PoolShape) -> Result<Self> {
        Self::of_group_shape(config, shape, config.blocks)
    }

    /// The layout a store of `shape` has for a group of `layers` of `config`'s layers, or why it
    /// does not fit.
    pub(crate) fn of_group_shape(
        config: &ModelConfig,
        shape: PoolShape,
        layers: usize,
    ) -> Result<Self> {
        let refuse = |why: String| Err(EngineError::Batch(format!("KV store: {why}")));
        if shape.layers as usize != layers {
            return refuse(format!(
                "{} layers a page, the group has {layers}",
                shape.layers
            ));
        }
        let per_slot = 2 * config.kv_dim() * F32;
        let piece = shape.piece_bytes();
        if piece == 0 || piece % per_slot != 0 || shape.page_bytes != piece * shape.layers as usize
        {
            return refuse(format!(
                "pieces of {piece} bytes are not whole positions of {per_slot} bytes"
            ));
        }
        Ok(Self::of_group(config, piece / per_slot, layers))
    }
}

/// Little-endian bytes to `f32`s, appended to `out`.
pub(crate) fn extend_f32(out: &mut Vec<f32>, bytes: &[u8]) {
    out.extend(
        bytes
            .chunks_exact(F32)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
    );
}

/// `f32`s to little-endian bytes, written over `out` (same length in bytes).
pub(crate) fn write_f32(out: &mut [u8], values: &[f32]) {
    for (b, v) in out.chunks_exact_mut(F32).zip(values) {
        b.copy_from_slice(&v.to_le_bytes());
    }
}

/// Appends to `k` and `v` the keys and values of `layer` at positions `first * tokens_per_block`
/// up to `positions`, read from the GPU tier of `store` through `table` (page ids, in position
/// order; its entries before `first` are not looked at), in position order.
pub(crate) fn gather(
    store: &HostKvStore,
    layout: &KvLayout,
    table: &[u32],
    layer: usize,
    (first, positions): (usize, usize),
    k: &mut Vec<f32>,
    v: &mut Vec<f32>,
) -> Result<()> {
    let memory = store.tier_memory(Tier::Gpu);
    let shape = store.shape();
    let (tpb, slot) = (layout.tokens_per_block, layout.slot_bytes());
    let used = layout.pages_for(positions);
    for (i, &page) in table.iter().enumerate().take(used).skip(first) {
        let piece = shape
            .page_pieces(Tier::Gpu, page)?
            .nth(layer)
            .ok_or_else(|| EngineError::Batch(format!("page {page} has no layer {layer}")))?;
        let slots = (positions - i * tpb).min(tpb);
        let bytes = &memory[piece];
        extend_f32(k, &bytes[..slots * slot]);
        extend_f32(v, &bytes[tpb * slot..tpb * slot + slots * slot]);
    }
    Ok(())
}

/// Writes the keys and values of `layers` at positions `start..start + rows` into the pages of
/// `table`: each `(layer, piece)` is a model layer (`k[layer]` and `v[layer]` hold `rows * kv_dim`
/// values each, from row `row0`) and the piece of the page that holds it. One read-modify-write of
/// each page touched (the other pieces are left as they are).
#[allow(clippy::too_many_arguments)]
pub(crate) fn scatter(
    store: &mut HostKvStore,
    layout: &KvLayout,
    table: &[u32],
    layers: &[(usize, usize)],
    (start, rows, row0): (usize, usize, usize),
    k: &[Vec<f32>],
    v: &[Vec<f32>],
    page: &mut Vec<u8>,
) -> Result<()> {
    let (tpb, slot, piece, kvd) = (
        layout.tokens_per_block,
        layout.slot_bytes(),
        layout.piece_bytes(),
        layout.kv_dim,
    );
    page.resize(layout.page_bytes(), 0);
    let end = start + rows;
    let mut pos = start;
    while pos < end {
        let index = pos / tpb;
        let id = table[index];
        let upto = end.min((index + 1) * tpb);
        store.read_page(Tier::Gpu, id, page)?;
        for p in pos..upto {
            let (j, row) = (p - index * tpb, row0 + p - start);
            for &(layer, at) in layers {
                let base = at * piece;
                let kb = base + j * slot;
                let vb = base + (tpb + j) * slot;
                write_f32(
                    &mut page[kb..kb + slot],
                    &k[layer][row * kvd..(row + 1) * kvd],
                );
                write_f32(
                    &mut page[vb..vb + slot],
                    &v[layer][row * kvd..(row + 1) * kvd],
                );
            }
        }
        store.write_page(Tier::Gpu, id, page)?;
        pos = upto;
    }
    Ok(())
}
