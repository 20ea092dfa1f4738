//! Choosing the next token from a row of logits: greedy, or a seeded draw from the softmax at a
//! temperature (optionally cut to its top-k, to the tokens of at least min-p of the likeliest's
//! probability, and to its nucleus, top-p), the same draw for the same seed and logits on every run.
//! Before the draw, [`Sampler::adjust`] applies the request's rules that read what it generated:
//! penalties, a logit bias, and no stop token before `min_tokens`. [`Sampler::logprob`] reports a
//! token's log probability under the model's own distribution.

mod adjust;
mod logprob;

pub use adjust::Penalties;
pub use logprob::Logprob;

use crate::math::argmax;

/// How a request picks its tokens. A sampler carries its own random state, so a request sampled
/// by the serving engine and the same request run alone with a clone of the same sampler draw the
/// same tokens from the same logits.
#[derive(Clone, Debug, PartialEq)]
pub struct Sampler {
    /// `None`: greedy.
    temperature: Option<f64>,
    /// The nucleus's probability mass, in (0, 1); 1: no filtering.
    top_p: f64,
    /// The likeliest tokens kept; 0: every token.
    top_k: usize,
    /// Tokens less likely than this fraction of the likeliest are dropped; 0: none.
    min_p: f64,
    state: u64,
    /// A stop token does not end the request (vLLM's `ignore_eos`): it runs to `max_new_tokens`.
    ignore_stop: bool,
    /// The rules [`Sampler::adjust`] applies.
    rules: adjust::Rules,
    /// Report each token's log probability and this many likeliest alternatives.
    logprobs: Option<usize>,
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
            top_p: 1.0,
            top_k: 0,
            min_p: 0.0,
            state: 0,
            ignore_stop: false,
            rules: adjust::Rules::NONE,
            logprobs: None,
        }
    }

    /// A draw from `softmax(logits / temperature)` with a SplitMix64 stream seeded by `seed`. A
    /// temperature that is not a positive finite number is greedy.
    pub fn seeded(seed: u64, temperature: f32) -> Self {
        let t = f64::from(temperature);
        Self {
            temperature: (t.is_finite() && t > 0.0).then_some(t),
            state: seed,
            ..Self::greedy()
        }
    }

    /// This sampler, on a request that a stop token does not end: it generates exactly
    /// `max_new_tokens` tokens (what a benchmark or a trace replay asks for, as vLLM's
    /// `ignore_eos`).
    pub const fn ignoring_stop(mut self) -> Self {
        self.ignore_stop = true;
        self
    }

    /// This sampler, drawing from the nucleus of the distribution only (top-p): the fewest
    /// highest-probability tokens (equal probabilities by lower id first) whose probabilities,
    /// at the sampler's temperature, add up to at least `p`, drawn in proportion to their
    /// probabilities with the same seeded stream (one draw per token, as without top-p).
    ///
    /// `p` is in (0, 1]; 1 keeps every token, and a `p` outside (0, 1] (or NaN) is taken as 1:
    /// no filtering. A greedy sampler stays greedy.
    pub fn with_top_p(mut self, p: f32) -> Self {
        let p = f64::from(p);
        self.top_p = if p > 0.0 && p < 1.0 { p } else { 1.0 };
        self
    }

    /// This sampler, drawing among the `k` likeliest tokens only (equal logits by lower id first);
    /// 0 keeps every token. A greedy sampler stays greedy.
    pub const fn with_top_k(mut self, k: usize) -> Self {
        self.top_k = k;
        self
    }

    /// This sampler, dropping the tokens whose probability is below `p` times the likeliest's;
    /// `p` in [0, 1] (0, or a value outside, keeps every token). A greedy sampler stays greedy.
    pub fn with_min_p(mut self, p: f32) -> Self {
        let p = f64::from(p);
        self.min_p = if p > 0.0 && p <= 1.0 { p } else { 0.0 };
        self
    }

    /// This sampler, with `penalties` on the tokens the request already has.
    pub fn with_penalties(mut self, penalties: Penalties) -> Self {
        self.rules.penalties = penalties;
        self
    }

    /// This sampler, adding `bias` (token, amount) to the logits before the draw.
    pub fn with_logit_bias(mut self, bias: Vec<(u32, f32)>) -> Self {
        self.rules.bias = bias;
        self
    }

    /// This sampler, never drawing a stop token before the request has `n` tokens.
    pub fn with_min_tokens(mut self, n: usize) -> Self {
        self.rules.min_tokens = n;
        self
    }

    /// This sampler, ending the request at any of `tokens` too (even with [`Self::ignoring_stop`]).
    pub fn with_stop_tokens(mut self, tokens: Vec<u32>) -> Self {
        self.rules.stop_tokens = tokens;
        self
    }

    /// This sampler, reporting each token's log probability and the `top` likeliest tokens'.
    pub fn with_logprobs(mut self, top: usize) -> Self {
        self.logprobs = Some(top);
        self
    }

    /// How many alternatives each token's log probability comes with; `None`: not reported.
    pub const fn logprobs(&self) -> Option<usize> {
        self.logprobs
    }

    /// Whether a stop token ends the request.
    pub const fn stops(&self) -> bool {
        !self.ignore_stop
    }

    /// Whether `token` ends the request: one of the model's stop tokens (unless ignored) or of the
    /// request's own.
    pub fn ends_at(&self, token: u32, model_stop: impl Fn(u32) -> bool) -> bool {
        (self.stops() && model_stop(token)) || self.rules.stop_tokens.contains(&token)
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
        if self.top_p < 1.0 || self.top_k > 0 || self.min_p > 0.0 {
            let mut weights: Vec<f64> = logits.iter().map(|&l| weight(l)).collect();
            adjust::keep_top_k(&mut weights, self.top_k);
            // The likeliest token's weight is 1.
            weights
                .iter_mut()
                .filter(|w| **w < self.min_p)
                .for_each(|w| *w = 0.0);
            return nucleus_draw(&weights, self.top_p, u).unwrap_or(best);
        }
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

/// A draw at `u` (in [0, 1)) among the nucleus of `weights` (unnormalised probabilities) of mass
/// `p`: the tokens ranked by weight, then by lower id, up to the first whose cumulative weight
/// reaches `p` of the total. The draw walks the nucleus in id order, as the unfiltered draw walks
/// every token. `None` when the weights do not add up to a positive finite total (or rounding
/// leaves the walk past the last token): the caller takes the argmax.
fn nucleus_draw(weights: &[f64], p: f64, u: f64) -> Option<u32> {
    let total: f64 = weights.iter().sum();
    if !total.is_finite() || total <= 0.0 {
        return None;
    }
    let mut ranked: Vec<u32> = (0..weights.len() as u32).collect();
    ranked.sort_unstable_by(|&a, &b| {
        weights[b as usize]
            .total_cmp(&weights[a as usize])
            .then(a.cmp(&b))
    });
    let (mut mass, mut last) = (0.0, ranked.len().saturating_sub(1));
    for (rank, &t) in ranked.iter().enumerate() {
        mass += weights[t as usize];
        if mass >= p * total {
            last = rank;
            break;
        }
    }
    let mut kept = vec![false; weights.len()];
    for &t in &ranked[..=last] {
        kept[t as usize] = true;
    }
    let kept_total: f64 = weights
        .iter()
        .zip(&kept)
        .filter(|(_, &k)| k)
        .map(|(w, _)| w)
        .sum();
    let mut at = u * kept_total;
    for (i, (&w, &k)) in weights.iter().zip(&kept).enumerate() {
        if k {
            at -= w;
            if at < 0.0 {
                return Some(i as u32);
            }
        }
    }
    None
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

    fn draws(sampler: &Sampler, logits: &[f32], n: usize) -> Vec<u32> {
        let mut s = sampler.clone();
        (0..n).map(|_| s.sample(logits)).collect()
    }

    #[test]
    fn a_small_top_p_only_draws_the_argmax() {
        let logits = [0.0f32, 1.0, 2.0, 1.5, -3.0];
        for seed in 0..5 {
            let d = draws(&Sampler::seeded(seed, 1.0).with_top_p(0.05), &logits, 300);
            assert!(d.iter().all(|&t| t == 2), "seed {seed}: {d:?}");
        }
        // Equal probabilities: the lower id first.
        let tied = [2.0f32, 0.0, 2.0, 1.0];
        let d = draws(&Sampler::seeded(3, 1.0).with_top_p(0.2), &tied, 300);
        assert!(d.iter().all(|&t| t == 0), "{d:?}");
        // Without top-p both tied tokens are drawn: the filter did the work.
        let d = draws(&Sampler::seeded(3, 1.0), &tied, 300);
        assert!(d.contains(&0) && d.contains(&2), "{d:?}");
    }

    #[test]
    fn top_p_of_one_or_outside_draws_as_unfiltered() {
        let logits = [0.3f32, -1.0, 2.0, 1.5, 0.0, 1.9];
        for seed in [0, 1, 7, 99] {
            let plain = draws(&Sampler::seeded(seed, 0.8), &logits, 200);
            for p in [1.0, 0.0, -0.5, 1.5, f32::NAN] {
                let s = Sampler::seeded(seed, 0.8).with_top_p(p);
                assert_eq!(s, Sampler::seeded(seed, 0.8), "p = {p}");
                assert_eq!(draws(&s, &logits, 200), plain, "seed {seed}, p = {p}");
            }
            // A nucleus that holds every token walks them as the unfiltered draw does.
            let all = Sampler::seeded(seed, 0.8).with_top_p(0.999_999_9);
            assert_eq!(
                draws(&all, &logits, 200),
                plain,
                "seed {seed}, p just under 1"
            );
        }
        assert_eq!(Sampler::greedy().with_top_p(0.5).sample(&logits), 2);
        assert!(Sampler::greedy().with_top_p(0.5).is_greedy());
    }

    #[test]
    fn a_mid_top_p_draws_inside_the_nucleus_only() {
        // Probabilities at temperature 1: 0.032, 0.087, 0.237, 0.644. The nucleus of 0.8 is {3, 2}
        // (0.644 < 0.8 <= 0.881); of 0.9 it is {3, 2, 1}.
        let logits = [0.0f32, 1.0, 2.0, 3.0];
        let nucleus = Sampler::seeded(11, 1.0).with_top_p(0.8);
        let d = draws(&nucleus, &logits, 1000);
        assert_eq!(
            d,
            draws(&nucleus, &logits, 1000),
            "the same seed draws the same"
        );
        let count = |d: &[u32], t| d.iter().filter(|&&x| x == t).count();
        assert_eq!(count(&d, 0) + count(&d, 1), 0, "outside the nucleus: {d:?}");
        assert!(count(&d, 3) > count(&d, 2) && count(&d, 2) > 150, "{d:?}");
        let wider = draws(&Sampler::seeded(11, 1.0).with_top_p(0.9), &logits, 1000);
        assert_eq!(count(&wider, 0), 0);
        assert!(count(&wider, 1) > 30, "{wider:?}");
        let plain = draws(&Sampler::seeded(11, 1.0), &logits, 1000);
        assert!(count(&plain, 0) > 0 && count(&plain, 1) > 0);
        // Permuting the vocabulary permutes the nucleus: the ranking is by probability, not id.
        let reversed = [3.0f32, 2.0, 1.0, 0.0];
        let r = draws(&Sampler::seeded(11, 1.0).with_top_p(0.8), &reversed, 1000);
        assert!(r.iter().all(|&t| t == 0 || t == 1), "{r:?}");
    }
}
