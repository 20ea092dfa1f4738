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
        // The `top` likeliest, most likely first (equal logits by lower id): one pass, a short list.
        let mut ids: Vec<u32> = Vec::with_capacity(top + 1);
        let before = |a: u32, b: u32| logits[a as usize] > logits[b as usize];
        for t in 0..logits.len() as u32 {
            if ids.len() == top && ids.last().is_none_or(|&l| !before(t, l)) {
                continue;
            }
            let at = ids.partition_point(|&x| !before(t, x));
            ids.insert(at, t);
            ids.truncate(top);
        }
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
