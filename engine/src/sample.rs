//! Choosing the next token from a row of logits: greedy, or a seeded draw from the softmax at a
//! temperature, the same draw for the same seed and logits on every run.

use crate::math::argmax;

/// How a request picks its tokens. A sampler carries its own random state, so a request sampled
/// by the serving engine and the same request run alone with a clone of the same sampler draw the
/// same tokens from the same logits.
#[derive(Clone, Debug, PartialEq)]
pub struct Sampler {
    /// `None`: greedy.
    temperature: Option<f64>,
    state: u64,
    /// A stop token does not end the request (vLLM's `ignore_eos`): it runs to `max_new_tokens`.
    ignore_stop: bool,
}

impl Default for Sampler {
    fn default() -> Self {
        Self::greedy()
    }
}

impl Sampler {
    /// The token with the largest logit (the lowest id among equals).
    pub const fn greedy() -> Self {
        Self {
            temperature: None,
            state: 0,
            ignore_stop: false,
        }
    }

    /// A draw from `softmax(logits / temperature)` with a SplitMix64 stream seeded by `seed`. A
    /// temperature that is not a positive finite number is greedy.
    pub fn seeded(seed: u64, temperature: f32) -> Self {
        let t = f64::from(temperature);
        Self {
            temperature: (t.is_finite() && t > 0.0).then_some(t),
            state: seed,
            ignore_stop: false,
        }
    }

    /// This sampler, on a request that a stop token does not end: it generates exactly
    /// `max_new_tokens` tokens (what a benchmark or a trace replay asks for, as vLLM's
    /// `ignore_eos`).
    pub const fn ignoring_stop(mut self) -> Self {
        self.ignore_stop = true;
        self
    }

    /// Whether a stop token ends the request.
    pub const fn stops(&self) -> bool {
        !self.ignore_stop
    }

    /// Whether this sampler is greedy.
    pub const fn is_greedy(&self) -> bool {
        self.temperature.is_none()
    }

    /// The next token from `logits` (one vocabulary-wide row).
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        let Some(t) = self.temperature else {
            return argmax(logits);
        };
        let u = self.unit();
        let best = argmax(logits);
        let max = f64::from(logits[best as usize]);
        let weight = |l: f32| ((f64::from(l) - max) / t).exp();
        let total: f64 = logits.iter().map(|&l| weight(l)).sum();
        if !total.is_finite() || total <= 0.0 {
            return best;
        }
        let mut at = u * total;
        for (i, &l) in logits.iter().enumerate() {
            at -= weight(l);
            if at < 0.0 {
                return i as u32;
            }
        }
        best
    }

    /// Uniform in [0, 1): SplitMix64's next value, top 53 bits.
    fn unit(&mut self) -> f64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_takes_the_largest() {
        assert_eq!(Sampler::greedy().sample(&[0.0, 3.0, 1.0]), 1);
        assert_eq!(Sampler::seeded(1, 0.0).sample(&[0.0, 3.0, 1.0]), 1);
    }

    #[test]
    fn a_seed_repeats_its_draws_and_follows_the_weights() {
        let logits = [0.0f32, 1.0, 2.0, -50.0];
        let draws = |seed| {
            let mut s = Sampler::seeded(seed, 1.0);
            (0..400).map(|_| s.sample(&logits)).collect::<Vec<_>>()
        };
        assert_eq!(draws(7), draws(7));
        assert_ne!(draws(7), draws(8));
        let d = draws(7);
        let count = |t| d.iter().filter(|&&x| x == t).count();
        assert_eq!(count(3), 0, "a token of weight e^-50 is never drawn");
        assert!(count(2) > count(1) && count(1) > count(0), "{d:?}");
    }
}
