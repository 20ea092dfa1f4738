//! A Mamba-2-style recurrent mixer, one token at a time: an input projection to a gate `z`, the
//! convolved channels `x | B | C` and a step size per head; a short causal convolution over the
//! channels (its window is part of the state); the selective scan `s ← exp(Δ·A)·s + Δ·x·Bᵀ`,
//! `y = s·C + D·x` per head; the gate `y · silu(z)`; an output projection.
//!
//! A request's state for one layer is its convolution window (`conv − 1` inputs of every channel)
//! then its SSM state (`heads × head_dim × state`): [`MambaDims::state_len`] floats.

use super::mechanism::{Matrix, Seeded};

/// A recurrent layer's dimensions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MambaDims {
    /// SSM heads.
    pub heads: usize,
    /// Channels a head.
    pub head_dim: usize,
    /// The SSM state's width (`B` and `C`).
    pub state: usize,
    /// The causal convolution's width.
    pub conv: usize,
}

impl MambaDims {
    /// Inner width: `heads × head_dim`.
    pub const fn inner(&self) -> usize {
        self.heads * self.head_dim
    }

    /// Channels the convolution sees: `x`, `B` and `C`.
    pub const fn channels(&self) -> usize {
        self.inner() + 2 * self.state
    }

    /// Floats of one request's state in one layer.
    pub const fn state_len(&self) -> usize {
        (self.conv - 1) * self.channels() + self.inner() * self.state
    }
}

/// One recurrent layer's weights.
pub(super) struct Mamba {
    dims: MambaDims,
    /// `z | xBC | dt` from the normed input.
    input: Matrix,
    /// Per channel, `conv` taps (oldest first), and a bias.
    conv: Vec<f32>,
    conv_bias: Vec<f32>,
    dt_bias: Vec<f32>,
    /// `A = −exp(a_log)` per head.
    a: Vec<f32>,
    d: Vec<f32>,
    output: Matrix,
}

fn silu(v: f32) -> f32 {
    v / (1.0 + (-v).exp())
}

fn softplus(v: f32) -> f32 {
    if v > 20.0 {
        v
    } else {
        v.exp().ln_1p()
    }
}

impl Mamba {
    pub(super) fn new(dims: MambaDims, embedding: usize, rng: &mut Seeded) -> Self {
        let (inner, ch) = (dims.inner(), dims.channels());
        Self {
            input: rng.matrix(inner + ch + dims.heads, embedding),
            conv: rng.values(ch * dims.conv, 0.5),
            conv_bias: rng.values(ch, 0.1),
            dt_bias: rng.values(dims.heads, 1.0),
            a: rng
                .values(dims.heads, 1.0)
                .iter()
                .map(|v| -v.exp())
                .collect(),
            d: rng.values(dims.heads, 1.0),
            output: rng.matrix(embedding, inner),
            dims,
        }
    }

    /// One token: `xn` (the normed input) through the mixer, its `state` advanced by the token;
    /// the output (embedding wide) into `out`.
    pub(super) fn step(&self, xn: &[f32], state: &mut [f32], out: &mut Vec<f32>) {
        let m = self.dims;
        let (inner, ch) = (m.inner(), m.channels());
        let mut proj = Vec::new();
        self.input.apply(xn, &mut proj);
        let (z, rest) = proj.split_at(inner);
        let (xbc, dt) = rest.split_at(ch);
        let (window, ssm) = state.split_at_mut((m.conv - 1) * ch);
        let conv = self.convolve(xbc, window);
        let (x, bc) = conv.split_at(inner);
        let (b, c) = bc.split_at(m.state);
        let mut y = vec![0.0f32; inner];
        for (h, &step) in dt.iter().enumerate() {
            let delta = softplus(step + self.dt_bias[h]);
            let decay = (delta * self.a[h]).exp();
            for i in h * m.head_dim..(h + 1) * m.head_dim {
                let s = &mut ssm[i * m.state..(i + 1) * m.state];
                let mut acc = 0.0f32;
                for ((sn, bn), cn) in s.iter_mut().zip(b).zip(c) {
                    *sn = decay * *sn + delta * x[i] * bn;
                    acc += *sn * cn;
                }
                y[i] = (acc + self.d[h] * x[i]) * silu(z[i]);
            }
        }
        self.output.apply(&y, out);
    }

    /// The causal convolution of the channels `xbc` over the `window` of earlier inputs (oldest
    /// first), which then shifts in `xbc`; SiLU after.
    fn convolve(&self, xbc: &[f32], window: &mut [f32]) -> Vec<f32> {
        let (k, ch) = (self.dims.conv, self.dims.channels());
        let mut out = Vec::with_capacity(ch);
        for (c, &now) in xbc.iter().enumerate() {
            let taps = &self.conv[c * k..(c + 1) * k];
            let mut acc = self.conv_bias[c];
            for j in 0..k - 1 {
                acc += taps[j] * window[j * ch + c];
            }
            acc += taps[k - 1] * now;
            out.push(silu(acc));
        }
        window.copy_within(ch.., 0);
        window[(k - 2) * ch..].copy_from_slice(xbc);
        out
    }
}
