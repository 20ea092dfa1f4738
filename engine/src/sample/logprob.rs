//! Log probabilities as the OpenAI API reports them: a token's, under the model's own distribution
//! (its row of logits before any rule or filter, as vLLM's default), and the likeliest tokens'.

use super::Sampler;

/// A generated token's log probability, and the likeliest tokens' at its position.
#[derive(Clone, Debug, PartialEq)]
pub struct Logprob {
    /// The token.
    pub token: u32,
    /// Its natural log probability.
    pub logprob: f32,
    /// The likeliest tokens and theirs, most likely first (equal by lower id first).
    pub top: Vec<(u32, f32)>,
}

impl Sampler {
    /// `token`'s [`Logprob`] in `logits` when this sampler reports them.
    pub fn logprob(&self, logits: &[f32], token: u32) -> Option<Logprob> {
        let top = self.logprobs?;
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let total: f64 = logits.iter().map(|&l| f64::from(l - max).exp()).sum();
        let norm = f64::from(max) + total.ln();
        let lp = |t: u32| (f64::from(logits[t as usize]) - norm) as f32;
        let mut ids: Vec<u32> = (0..logits.len() as u32).collect();
        let by_logit = |a: &u32, b: &u32| {
            logits[*b as usize]
                .total_cmp(&logits[*a as usize])
                .then(a.cmp(b))
        };
        let k = top.min(ids.len());
        if k > 0 && k < ids.len() {
            ids.select_nth_unstable_by(k - 1, by_logit);
        }
        ids.truncate(k);
        ids.sort_unstable_by(by_logit);
        Some(Logprob {
            token,
            logprob: lp(token),
            top: ids.into_iter().map(|t| (t, lp(t))).collect(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logprobs_are_the_log_softmax_and_the_top_is_ranked() {
        let logits = [0.0f32, (2.0f32).ln(), (3.0f32).ln(), f32::NEG_INFINITY];
        let l = Sampler::greedy()
            .with_logprobs(2)
            .logprob(&logits, 1)
            .unwrap();
        assert!((l.logprob - (2.0f32 / 6.0).ln()).abs() < 1e-6, "{l:?}");
        assert_eq!(l.top.iter().map(|t| t.0).collect::<Vec<_>>(), [2, 1]);
        assert!((l.top[0].1 - 0.5f32.ln()).abs() < 1e-6);
        assert!(Sampler::greedy().logprob(&logits, 1).is_none());
        let none = Sampler::greedy()
            .with_logprobs(0)
            .logprob(&logits, 3)
            .unwrap();
        assert!(none.top.is_empty() && none.logprob == f32::NEG_INFINITY);
    }
}
