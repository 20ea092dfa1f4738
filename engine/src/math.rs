//! The hand-written kernels: each sums in one fixed order, whatever the batch, the chunk or where
//! the numbers came from, so a row's result depends on the row's inputs alone.

/// `Σ a[i] b[i]` in eight interleaved partial sums added pairwise at the end (a fixed order that
/// the compiler can vectorise without reassociating).
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [0f32; 8];
    let chunks = n / 8;
    for c in 0..chunks {
        let (x, y) = (&a[c * 8..c * 8 + 8], &b[c * 8..c * 8 + 8]);
        for l in 0..8 {
            acc[l] += x[l] * y[l];
        }
    }
    for i in chunks * 8..n {
        acc[i % 8] += a[i] * b[i];
    }
    let s4 = [
        acc[0] + acc[4],
        acc[1] + acc[5],
        acc[2] + acc[6],
        acc[3] + acc[7],
    ];
    (s4[0] + s4[2]) + (s4[1] + s4[3])
}

/// RMS norm of each `dim`-wide row of `x` times `weight`.
pub(crate) fn rms_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut Vec<f32>) {
    let dim = weight.len();
    out.clear();
    out.reserve(x.len());
    for row in x.chunks_exact(dim) {
        let mean = dot(row, row) / dim as f32;
        let inv = 1.0 / (mean + eps).sqrt();
        out.extend(row.iter().zip(weight).map(|(v, w)| v * inv * w));
    }
}

/// `silu(gate) * up` of rows `[gate | up]` (`2 * width` wide), element by element, packed into
/// the front of `rows` (`width` wide rows); returns that front.
pub(crate) fn swiglu(rows: &mut [f32], width: usize) -> &[f32] {
    let n = rows.len() / (2 * width);
    for r in 0..n {
        for i in 0..width {
            let (g, u) = (rows[r * 2 * width + i], rows[r * 2 * width + width + i]);
            rows[r * width + i] = g / (1.0 + (-g).exp()) * u;
        }
    }
    &rows[..n * width]
}

/// GeGLU: `gelu(gate) * up` of rows `[gate | up]` (`2 * width` wide), GELU in its tanh
/// approximation (`0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`, Gemma's
/// `gelu_pytorch_tanh`), element by element, packed into the front of `rows`; returns that front.
pub(crate) fn geglu(rows: &mut [f32], width: usize) -> &[f32] {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    let n = rows.len() / (2 * width);
    for r in 0..n {
        for i in 0..width {
            let (g, u) = (rows[r * 2 * width + i], rows[r * 2 * width + width + i]);
            let gelu = 0.5 * g * (1.0 + (SQRT_2_OVER_PI * (g + 0.044_715 * g * g * g)).tanh());
            rows[r * width + i] = gelu * u;
        }
    }
    &rows[..n * width]
}

/// Soft-capping: each logit `x` becomes `cap * tanh(x / cap)`.
pub(crate) fn soft_cap(logits: &mut [f32], cap: f32) {
    for x in logits {
        *x = cap * (*x / cap).tanh();
    }
}

/// Which elements of a head rope rotates together.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RopeStyle {
    /// Adjacent pairs `(x[2i], x[2i+1])`: GGUF's llama order (the converter permuted the rows).
    Interleaved,
    /// The halves `(x[i], x[i + head_dim/2])`: NeoX's and Hugging Face's order, Gemma's in GGUF.
    Halves,
}

/// Cosines and sines of the rotary embedding for every position of the context.
#[derive(Debug)]
pub(crate) struct Rope {
    half: usize,
    style: RopeStyle,
    cos: Vec<f32>,
    sin: Vec<f32>,
}

impl Rope {
    pub(crate) fn new(head_dim: usize, base: f32, positions: usize, style: RopeStyle) -> Self {
        let half = head_dim / 2;
        let theta: Vec<f32> = (0..half)
            .map(|i| 1.0 / base.powf((2 * i) as f32 / head_dim as f32))
            .collect();
        let mut cos = Vec::with_capacity(positions * half);
        let mut sin = Vec::with_capacity(positions * half);
        for p in 0..positions {
            for &t in &theta {
                let angle = p as f32 * t;
                cos.push(angle.cos());
                sin.push(angle.sin());
            }
        }
        Self {
            half,
            style,
            cos,
            sin,
        }
    }

    /// Rotates the pairs of each head of `x` (in the rope's [`RopeStyle`]) by position `pos`.
    pub(crate) fn apply(&self, x: &mut [f32], pos: usize) {
        let (cos, sin) = (
            &self.cos[pos * self.half..(pos + 1) * self.half],
            &self.sin[pos * self.half..(pos + 1) * self.half],
        );
        for head in x.chunks_exact_mut(2 * self.half) {
            match self.style {
                RopeStyle::Interleaved => {
                    for (i, pair) in head.chunks_exact_mut(2).enumerate() {
                        let (a, b) = (pair[0], pair[1]);
                        pair[0] = a * cos[i] - b * sin[i];
                        pair[1] = a * sin[i] + b * cos[i];
                    }
                }
                RopeStyle::Halves => {
                    let (lo, hi) = head.split_at_mut(self.half);
                    for (i, (a, b)) in lo.iter_mut().zip(hi.iter_mut()).enumerate() {
                        let (x1, x2) = (*a, *b);
                        *a = x1 * cos[i] - x2 * sin[i];
                        *b = x1 * sin[i] + x2 * cos[i];
                    }
                }
            }
        }
    }
}

/// The attention shape: query heads, KV heads, head width, and the factor on scores.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Heads {
    pub(crate) heads: usize,
    pub(crate) kv_heads: usize,
    pub(crate) head_dim: usize,
    pub(crate) scale: f32,
}

/// Keys and values of consecutive positions from `base` (`kv_heads * head_dim` values a position
/// each, position-major), and the positions `range` of them that a query attends to.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Past<'a> {
    pub(crate) k: &'a [f32],
    pub(crate) v: &'a [f32],
    pub(crate) base: usize,
    pub(crate) range: (usize, usize),
}

/// Causal attention of one query row over positions `past.range` (from `lo` up to, not
/// including, `hi`) into `out` (`heads * head_dim`). Scores, the softmax and the weighted sum of
/// values run over positions in order.
pub(crate) fn attend(h: Heads, q: &[f32], past: Past<'_>, scores: &mut Vec<f32>, out: &mut [f32]) {
    let (hd, kvd) = (h.head_dim, h.kv_heads * h.head_dim);
    let group = h.heads / h.kv_heads;
    let (k, v) = (past.k, past.v);
    let (lo, hi) = (past.range.0 - past.base, past.range.1 - past.base);
    for head in 0..h.heads {
        let g = head / group;
        let qh = &q[head * hd..(head + 1) * hd];
        scores.clear();
        let mut max = f32::NEG_INFINITY;
        for t in lo..hi {
            let s = dot(qh, &k[t * kvd + g * hd..t * kvd + (g + 1) * hd]) * h.scale;
            max = max.max(s);
            scores.push(s);
        }
        let mut sum = 0f32;
        for s in scores.iter_mut() {
            *s = (*s - max).exp();
            sum += *s;
        }
        let oh = &mut out[head * hd..(head + 1) * hd];
        oh.fill(0.0);
        for (t, &p) in (lo..hi).zip(scores.iter()) {
            let vt = &v[t * kvd + g * hd..t * kvd + (g + 1) * hd];
            for (o, x) in oh.iter_mut().zip(vt) {
                *o += p * x;
            }
        }
        let inv = 1.0 / sum;
        for o in oh.iter_mut() {
            *o *= inv;
        }
    }
}

/// The index of the largest logit (the first of equals); NaN never wins.
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0usize;
    for (i, &x) in logits.iter().enumerate() {
        if x > logits[best] || logits[best].is_nan() {
            best = i;
        }
    }
    best as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dot_matches_a_plain_sum_on_integers() {
        let a: Vec<f32> = (0..37).map(|i| i as f32).collect();
        let b: Vec<f32> = (0..37).map(|i| (i % 5) as f32).collect();
        let plain: f32 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
        assert_eq!(dot(&a, &b), plain);
    }

    #[test]
    fn argmax_takes_the_first_maximum() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, -1.0]), 1);
        assert_eq!(argmax(&[f32::NAN, 0.5, 0.25]), 1);
    }

    #[test]
    fn attention_over_one_position_is_its_value() {
        let h = Heads {
            heads: 2,
            kv_heads: 1,
            head_dim: 2,
            scale: 1.0 / 2f32.sqrt(),
        };
        let (q, k, v) = ([1.0, 2.0, 3.0, 4.0], [0.5, 0.5], [7.0, -7.0]);
        let mut out = [0.0; 4];
        let past = Past {
            k: &k,
            v: &v,
            base: 0,
            range: (0, 1),
        };
        attend(h, &q, past, &mut Vec::new(), &mut out);
        assert_eq!(out, [7.0, -7.0, 7.0, -7.0]);
    }

    #[test]
    fn a_window_sees_only_its_positions() {
        let h = Heads {
            heads: 1,
            kv_heads: 1,
            head_dim: 2,
            scale: 1.0,
        };
        // Positions 10..13; the query attends to 12 only: its value, whatever the others hold.
        let (k, v) = (
            [0.0, 0.0, f32::NAN, 1.0, 0.5, 0.5],
            [f32::NAN, 1.0, 2.0, 3.0, 4.0, 5.0],
        );
        let mut out = [0.0; 2];
        let past = Past {
            k: &k,
            v: &v,
            base: 10,
            range: (12, 13),
        };
        attend(h, &[1.0, 1.0], past, &mut Vec::new(), &mut out);
        assert_eq!(out, [4.0, 5.0]);
    }

    #[test]
    fn the_two_rope_styles_rotate_their_pairs() {
        let (il, hv) = (
            Rope::new(4, 10_000.0, 2, RopeStyle::Interleaved),
            Rope::new(4, 10_000.0, 2, RopeStyle::Halves),
        );
        let (c, s) = (1f32.cos(), 1f32.sin());
        let mut a = [1.0, 2.0, 0.0, 0.0];
        il.apply(&mut a, 1);
        assert_eq!(a[..2], [c - 2.0 * s, s + 2.0 * c]);
        let mut b = [1.0, 0.0, 2.0, 0.0];
        hv.apply(&mut b, 1);
        assert_eq!([b[0], b[2]], [c - 2.0 * s, s + 2.0 * c]);
    }
}
