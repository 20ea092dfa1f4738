//! The hybrid engine's memory: attention KV pages and recurrent-state slots, each on a GPU tier and a
//! host tier (host memory both, on this CPU engine), moved as the scheduler's logs say, and a
//! sequence's view of them for the forward pass ([`SeqView`]).

use kvsched_core::kv::{PageMove, Tier};
use kvsched_core::state_pool::{Capture, StateMove, StateOp};

use super::forward::Memory;
use super::mechanism::HybridSpec;

/// One tier's floats in fixed-size units (pages or slots).
#[derive(Debug)]
pub(super) struct Units {
    pub(super) data: Vec<f32>,
    pub(super) len: usize,
}

impl Units {
    fn new(count: u32, len: usize) -> Self {
        Self {
            data: vec![0.0; count as usize * len],
            len,
        }
    }

    pub(super) fn unit(&self, i: u32) -> &[f32] {
        &self.data[i as usize * self.len..(i as usize + 1) * self.len]
    }

    pub(super) fn unit_mut(&mut self, i: u32) -> &mut [f32] {
        &mut self.data[i as usize * self.len..(i as usize + 1) * self.len]
    }

    pub(super) fn count(&self) -> usize {
        self.data.len() / self.len
    }
}

/// Copies unit `src` of `from` to unit `dst` of `to`.
fn copy(from: &Units, src: u32, to: &mut Units, dst: u32) {
    to.unit_mut(dst).copy_from_slice(from.unit(src));
}

/// KV pages and state slots of both tiers.
#[derive(Debug)]
pub(super) struct Stores {
    pub(super) pages: [Units; 2],
    pub(super) states: [Units; 2],
    tokens_per_block: usize,
    kv_len: usize,
    width: usize,
    layer_state: usize,
}

fn tier(t: Tier) -> usize {
    match t {
        Tier::Gpu => 0,
        Tier::Host => 1,
    }
}

impl Stores {
    pub(super) fn new(spec: &HybridSpec, tpb: u32, pages: [u32; 2], slots: [u32; 2]) -> Self {
        let page = tpb as usize * spec.kv_len();
        Self {
            pages: pages.map(|n| Units::new(n, page)),
            states: slots.map(|n| Units::new(n, spec.state_len())),
            tokens_per_block: tpb as usize,
            kv_len: spec.kv_len(),
            width: spec.embedding,
            layer_state: spec.mamba.state_len(),
        }
    }

    /// Runs page moves in order.
    pub(super) fn move_pages(&mut self, moves: &[PageMove]) {
        for m in moves {
            let (f, t) = (tier(m.from), tier(m.from.other()));
            let [a, b] = &mut self.pages;
            let (from, to) = if f == 0 { (&*a, b) } else { (&*b, a) };
            debug_assert_ne!(f, t);
            copy(from, m.src, to, m.dst);
        }
    }

    /// Runs state moves in order.
    pub(super) fn move_states(&mut self, moves: &[StateMove]) {
        for m in moves {
            let [gpu, host] = &mut self.states;
            match m.op {
                StateOp::Move(Tier::Gpu) => copy(gpu, m.src, host, m.dst),
                StateOp::Move(Tier::Host) => copy(host, m.src, gpu, m.dst),
                StateOp::Restore => {
                    let src = gpu.unit(m.src).to_vec();
                    gpu.unit_mut(m.dst).copy_from_slice(&src);
                }
            }
        }
    }

    /// The view of one sequence: its GPU pages in block order, its live GPU state slot, and the
    /// captures the step writes for it.
    pub(super) fn view<'s>(
        &'s mut self,
        pages: &'s [u32],
        slot: u32,
        captures: &'s [Capture],
    ) -> SeqView<'s> {
        SeqView {
            stores: self,
            pages,
            slot,
            captures,
        }
    }
}

/// One sequence's memory during a step ([`Memory`]).
pub(super) struct SeqView<'s> {
    stores: &'s mut Stores,
    pages: &'s [u32],
    slot: u32,
    captures: &'s [Capture],
}

impl SeqView<'_> {
    /// Where the keys of position `pos` in attention layer `a` start in the GPU pages.
    fn at(&self, a: usize, pos: usize) -> usize {
        let s = &self.stores;
        let page = self.pages[pos / s.tokens_per_block] as usize;
        (page * s.tokens_per_block + pos % s.tokens_per_block) * s.kv_len + a * 2 * s.width
    }
}

impl Memory for SeqView<'_> {
    fn put_kv(&mut self, a: usize, pos: usize, k: &[f32], v: &[f32]) {
        let (at, e) = (self.at(a, pos), self.stores.width);
        let data = &mut self.stores.pages[0].data;
        data[at..at + e].copy_from_slice(k);
        data[at + e..at + 2 * e].copy_from_slice(v);
    }

    fn kv(&self, a: usize, pos: usize) -> (&[f32], &[f32]) {
        let (at, e) = (self.at(a, pos), self.stores.width);
        let data = &self.stores.pages[0].data;
        (&data[at..at + e], &data[at + e..at + 2 * e])
    }

    fn state(&mut self, r: usize) -> &mut [f32] {
        let n = self.stores.layer_state;
        &mut self.stores.states[0].unit_mut(self.slot)[r * n..(r + 1) * n]
    }

    /// Copies layer `r`'s state into every capture at `scanned` tokens.
    fn scanned(&mut self, r: usize, scanned: usize) {
        let n = self.stores.layer_state;
        for c in self
            .captures
            .iter()
            .filter(|c| c.position as usize == scanned)
        {
            let gpu = &mut self.stores.states[0];
            let layer = gpu.unit(self.slot)[r * n..(r + 1) * n].to_vec();
            gpu.unit_mut(c.slot)[r * n..(r + 1) * n].copy_from_slice(&layer);
        }
    }
}
