//! The mechanism model's forward pass over one sequence's new tokens, through a [`Memory`] that
//! holds its keys and values and its recurrent state: the paged stores of a [`super::HybridEngine`]
//! or the contiguous ones of a solo run ([`HybridModel::reference`]).

use super::mechanism::{HybridModel, Matrix, Mixer};
use crate::math::argmax;

/// The mechanism model's norm epsilon.
const EPS: f32 = 1e-6;

/// `x` RMS-normed by `w` into `out` (the engine's norm, one row).
fn rms_norm(x: &[f32], w: &[f32], out: &mut Vec<f32>) {
    crate::math::rms_norm(x, w, EPS, out);
}

/// Where a sequence's keys, values and recurrent state are.
pub(super) trait Memory {
    /// Stores the keys and values of position `pos` for attention layer `a`.
    fn put_kv(&mut self, a: usize, pos: usize, k: &[f32], v: &[f32]);
    /// The keys and values of position `pos` for attention layer `a`.
    fn kv(&self, a: usize, pos: usize) -> (&[f32], &[f32]);
    /// The live state of recurrent layer `r`.
    fn state(&mut self, r: usize) -> &mut [f32];
    /// Recurrent layer `r` has scanned the sequence's first `scanned` tokens (a snapshot point may
    /// want its state now).
    fn scanned(&mut self, r: usize, scanned: usize);
}

impl HybridModel {
    /// Runs `tokens` at positions `start..` through every layer; the logits of the last one when
    /// `logits`. A sequence starting at 0 starts from a zero state.
    pub(super) fn run(
        &self,
        mem: &mut dyn Memory,
        tokens: &[u32],
        start: usize,
        logits: bool,
    ) -> Option<Vec<f32>> {
        let e = self.spec.embedding;
        let mut xs: Vec<Vec<f32>> = tokens
            .iter()
            .map(|&t| self.embed[t as usize * e..(t as usize + 1) * e].to_vec())
            .collect();
        if start == 0 {
            for r in 0..self.spec.recurrent_layers() {
                mem.state(r).fill(0.0);
            }
        }
        let (mut xn, mut out) = (Vec::new(), Vec::new());
        for layer in &self.layers {
            for (i, x) in xs.iter_mut().enumerate() {
                let pos = start + i;
                rms_norm(x, &layer.norm, &mut xn);
                match &layer.mixer {
                    Mixer::Attention { qkv, o, index } => {
                        self.attend(mem, (qkv, o), *index, pos, &xn, &mut out);
                    }
                    Mixer::Recurrent(m, r) => {
                        m.step(&xn, mem.state(*r), &mut out);
                        mem.scanned(*r, pos + 1);
                    }
                }
                for (xi, oi) in x.iter_mut().zip(&out) {
                    *xi += oi;
                }
            }
        }
        let last = xs.last().filter(|_| logits)?;
        rms_norm(last, &self.norm, &mut xn);
        let mut l = Vec::new();
        self.head.apply(&xn, &mut l);
        Some(l)
    }

    /// Attention layer `a` for the row at `pos`: its keys and values stored, then each head's
    /// softmax over positions `0..=pos` in order.
    fn attend(
        &self,
        mem: &mut dyn Memory,
        (qkv, o): (&[Matrix; 3], &Matrix),
        a: usize,
        pos: usize,
        xn: &[f32],
        out: &mut Vec<f32>,
    ) {
        let (e, heads) = (self.spec.embedding, self.spec.heads);
        let hd = e / heads;
        let (mut q, mut k, mut v) = (Vec::new(), Vec::new(), Vec::new());
        qkv[0].apply(xn, &mut q);
        qkv[1].apply(xn, &mut k);
        qkv[2].apply(xn, &mut v);
        mem.put_kv(a, pos, &k, &v);
        let scale = 1.0 / (hd as f32).sqrt();
        let mut att = vec![0.0f32; e];
        let mut scores = Vec::with_capacity(pos + 1);
        for h in 0..heads {
            let qh = &q[h * hd..(h + 1) * hd];
            scores.clear();
            for p in 0..=pos {
                let kh = &mem.kv(a, p).0[h * hd..(h + 1) * hd];
                scores.push(crate::math::dot(qh, kh) * scale);
            }
            let max = scores.iter().fold(f32::NEG_INFINITY, |m, &s| m.max(s));
            let mut sum = 0.0f32;
            for s in &mut scores {
                *s = (*s - max).exp();
                sum += *s;
            }
            for (p, w) in scores.iter().enumerate() {
                let vh = &mem.kv(a, p).1[h * hd..(h + 1) * hd];
                for (acc, x) in att[h * hd..(h + 1) * hd].iter_mut().zip(vh) {
                    *acc += w / sum * x;
                }
            }
        }
        o.apply(&att, out);
    }

    /// One request alone: the whole prompt in one step on contiguous memory, then `new` greedy
    /// tokens one at a time. Returns the generated tokens and each one's logits.
    pub fn reference(&self, prompt: &[u32], new: usize) -> (Vec<u32>, Vec<Vec<f32>>) {
        let mut mem = Contiguous::new(self);
        let (mut tokens, mut all) = (Vec::new(), Vec::new());
        let mut logits = self.run(&mut mem, prompt, 0, true);
        for i in 0..new {
            let l = logits.take().expect("logits asked");
            let t = argmax(&l);
            tokens.push(t);
            all.push(l);
            if i + 1 < new {
                logits = self.run(&mut mem, &[t], prompt.len() + i, true);
            }
        }
        (tokens, all)
    }
}

/// A solo run's memory: keys and values per attention layer by position, one state.
struct Contiguous {
    kv: Vec<Vec<(Vec<f32>, Vec<f32>)>>,
    state: Vec<Vec<f32>>,
}

impl Contiguous {
    fn new(m: &HybridModel) -> Self {
        let s = m.spec;
        Self {
            kv: vec![Vec::new(); s.attention_layers()],
            state: vec![vec![0.0; s.mamba.state_len()]; s.recurrent_layers()],
        }
    }
}

impl Memory for Contiguous {
    fn put_kv(&mut self, a: usize, pos: usize, k: &[f32], v: &[f32]) {
        assert_eq!(self.kv[a].len(), pos, "positions in order");
        self.kv[a].push((k.to_vec(), v.to_vec()));
    }
    fn kv(&self, a: usize, pos: usize) -> (&[f32], &[f32]) {
        let (k, v) = &self.kv[a][pos];
        (k, v)
    }
    fn state(&mut self, r: usize) -> &mut [f32] {
        &mut self.state[r]
    }
    fn scanned(&mut self, _: usize, _: usize) {}
}
