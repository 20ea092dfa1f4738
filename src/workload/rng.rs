//! A small, seedable pseudo-random number generator and the few distributions the workload
//! generators need.
//!
//! The generator is xoshiro256\*\* (Blackman and Vigna, 2018), seeded by running splitmix64 over a
//! 64-bit seed, the seeding procedure its authors recommend. It is fast, has a 2^256 − 1 period and
//! passes BigCrush; it is **not** cryptographically secure, which a workload generator does not need.
//!
//! The same seed gives the same stream on every platform: every draw is built from integer operations
//! and IEEE-754 arithmetic only (`ln`, `sqrt`, `cos` and `powf` are the only transcendental calls).

/// One step of splitmix64: advances `state` and returns the next output.
///
/// Used to expand a 64-bit seed into the 256-bit xoshiro state, so that nearby seeds (0, 1, 2, …) give
/// unrelated streams.
#[must_use]
pub fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// xoshiro256\*\* pseudo-random number generator with uniform, exponential, normal, log-normal and
/// gamma draws.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rng {
    s: [u64; 4],
}

impl Rng {
    /// Creates a generator from a 64-bit seed (expanded with splitmix64; any seed, including 0, is fine).
    #[must_use]
    pub fn new(seed: u64) -> Self {
        let mut sm = seed;
        let s = [
            splitmix64(&mut sm),
            splitmix64(&mut sm),
            splitmix64(&mut sm),
            splitmix64(&mut sm),
        ];
        // splitmix64 is a bijection of its counter, so four consecutive outputs are never all zero.
        debug_assert!(s.iter().any(|&w| w != 0));
        Self { s }
    }

    /// Returns the next 64 uniformly distributed bits.
    pub fn next_u64(&mut self) -> u64 {
        let result = self.s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = self.s[1] << 17;
        self.s[2] ^= self.s[0];
        self.s[3] ^= self.s[1];
        self.s[1] ^= self.s[2];
        self.s[0] ^= self.s[3];
        self.s[2] ^= t;
        self.s[3] = self.s[3].rotate_left(45);
        result
    }

    /// Uniform `f64` in `[0, 1)`, with 53 random bits (every representable multiple of 2^-53).
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform `f64` in `(0, 1]`: never 0, so its logarithm is always finite.
    pub fn uniform_open0(&mut self) -> f64 {
        ((self.next_u64() >> 11) + 1) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform integer in `[0, n)`, without modulo bias (Lemire's multiply-and-reject method).
    /// Returns 0 when `n` is 0.
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            return 0;
        }
        let mut m = u128::from(self.next_u64()) * u128::from(n);
        if (m as u64) < n {
            // Reject the few low products that would over-represent some residues.
            let threshold = n.wrapping_neg() % n;
            while (m as u64) < threshold {
                m = u128::from(self.next_u64()) * u128::from(n);
            }
        }
        (m >> 64) as u64
    }

    /// Exponential draw with the given rate (mean `1 / rate`), by inversion. `rate` must be positive.
    pub fn exponential(&mut self, rate: f64) -> f64 {
        debug_assert!(rate > 0.0);
        -self.uniform_open0().ln() / rate
    }

    /// Standard normal draw (mean 0, variance 1) by the Box–Muller transform.
    ///
    /// Each call consumes two uniforms and returns one of the pair; the sibling is not cached, which
    /// keeps the generator's state a plain word array (and clones exact).
    pub fn normal(&mut self) -> f64 {
        let u1 = self.uniform_open0();
        let u2 = self.uniform();
        (-2.0 * u1.ln()).sqrt() * (core::f64::consts::TAU * u2).cos()
    }

    /// Log-normal draw: `exp(mu + sigma · N(0, 1))`.
    pub fn lognormal(&mut self, mu: f64, sigma: f64) -> f64 {
        (mu + sigma * self.normal()).exp()
    }

    /// Gamma draw with the given `shape` (k > 0) and `scale` (θ > 0): mean kθ, variance kθ².
    ///
    /// Marsaglia and Tsang (2000), "A simple method for generating gamma variables". For shape < 1 it
    /// draws Gamma(shape + 1) and multiplies by U^(1/shape), as the paper describes.
    pub fn gamma(&mut self, shape: f64, scale: f64) -> f64 {
        debug_assert!(shape > 0.0 && scale > 0.0);
        if shape < 1.0 {
            let boost = self.uniform_open0().powf(1.0 / shape);
            return self.gamma(shape + 1.0, scale) * boost;
        }
        let d = shape - 1.0 / 3.0;
        let c = 1.0 / (9.0 * d).sqrt();
        loop {
            let (x, v) = loop {
                let x = self.normal();
                let v = 1.0 + c * x;
                if v > 0.0 {
                    break (x, v * v * v);
                }
            };
            let u = self.uniform_open0();
            let x2 = x * x;
            // Cheap squeeze first, then the exact log test.
            if u < 1.0 - 0.0331 * x2 * x2 || u.ln() < 0.5 * x2 + d * (1.0 - v + v.ln()) {
                return d * v * scale;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mean_var(xs: &[f64]) -> (f64, f64) {
        let n = xs.len() as f64;
        let mean = xs.iter().sum::<f64>() / n;
        let var = xs.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / (n - 1.0);
        (mean, var)
    }

    #[test]
    fn xoshiro_matches_reference_vector() {
        // Reference: xoshiro256** from the authors' C code, state {1, 2, 3, 4}.
        let mut r = Rng { s: [1, 2, 3, 4] };
        let got: Vec<u64> = (0..6).map(|_| r.next_u64()).collect();
        assert_eq!(
            got,
            [
                11520,
                0,
                1509978240,
                1215971899390074240,
                1216172134540287360,
                607988272756665600
            ]
        );
    }

    #[test]
    fn splitmix_matches_reference_vector() {
        // Reference: splitmix64 seeded with 1234567.
        let mut s = 1_234_567u64;
        let got: Vec<u64> = (0..3).map(|_| splitmix64(&mut s)).collect();
        assert_eq!(
            got,
            [
                6457827717110365317,
                3203168211198807973,
                9817491932198370423
            ]
        );
    }

    #[test]
    fn same_seed_same_stream_different_seed_different_stream() {
        let a: Vec<u64> = {
            let mut r = Rng::new(7);
            (0..8).map(|_| r.next_u64()).collect()
        };
        let b: Vec<u64> = {
            let mut r = Rng::new(7);
            (0..8).map(|_| r.next_u64()).collect()
        };
        let c: Vec<u64> = {
            let mut r = Rng::new(8);
            (0..8).map(|_| r.next_u64()).collect()
        };
        assert_eq!(a, b);
        assert_ne!(a, c);
    }

    #[test]
    fn uniform_in_range_with_right_moments() {
        let mut r = Rng::new(1);
        let xs: Vec<f64> = (0..200_000).map(|_| r.uniform()).collect();
        assert!(xs.iter().all(|&x| (0.0..1.0).contains(&x)));
        let (m, v) = mean_var(&xs);
        assert!((m - 0.5).abs() < 0.005, "mean {m}");
        assert!((v - 1.0 / 12.0).abs() < 0.002, "var {v}");
        let mut r = Rng::new(2);
        assert!((0..100_000).all(|_| {
            let x = r.uniform_open0();
            x > 0.0 && x <= 1.0
        }));
    }

    #[test]
    fn below_is_in_range_and_unbiased() {
        let mut r = Rng::new(3);
        let mut counts = [0u32; 7];
        for _ in 0..70_000 {
            counts[r.below(7) as usize] += 1;
        }
        for c in counts {
            assert!((9_500..10_500).contains(&c), "{counts:?}");
        }
        assert_eq!(r.below(0), 0);
        assert_eq!(r.below(1), 0);
    }

    #[test]
    fn exponential_normal_lognormal_moments() {
        let mut r = Rng::new(4);
        let e: Vec<f64> = (0..200_000).map(|_| r.exponential(4.0)).collect();
        let (m, v) = mean_var(&e);
        assert!((m - 0.25).abs() < 0.005, "exp mean {m}");
        assert!((v - 0.0625).abs() < 0.003, "exp var {v}");
        let n: Vec<f64> = (0..200_000).map(|_| r.normal()).collect();
        let (m, v) = mean_var(&n);
        assert!(m.abs() < 0.01, "normal mean {m}");
        assert!((v - 1.0).abs() < 0.02, "normal var {v}");
        let l: Vec<f64> = (0..200_000).map(|_| r.lognormal(1.0, 0.5)).collect();
        let (m, _) = mean_var(&l);
        let want = (1.0f64 + 0.125).exp();
        assert!(
            (m - want).abs() / want < 0.01,
            "lognormal mean {m} want {want}"
        );
    }

    #[test]
    fn gamma_moments_for_small_and_large_shape() {
        for &(shape, scale) in &[
            (0.04, 25.0),
            (0.25, 2.0),
            (1.0, 1.0),
            (3.5, 0.5),
            (40.0, 0.1),
        ] {
            let mut r = Rng::new(5);
            let g: Vec<f64> = (0..200_000).map(|_| r.gamma(shape, scale)).collect();
            assert!(g.iter().all(|&x| x >= 0.0 && x.is_finite()));
            let (m, v) = mean_var(&g);
            let (want_m, want_v) = (shape * scale, shape * scale * scale);
            assert!(
                (m - want_m).abs() / want_m < 0.03,
                "shape {shape}: mean {m} want {want_m}"
            );
            assert!(
                (v - want_v).abs() / want_v < 0.12,
                "shape {shape}: var {v} want {want_v}"
            );
        }
    }
}
