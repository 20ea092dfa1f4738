//! The rules that change a row of logits before the draw, reading what the request has: the
//! penalties (vLLM's: repetition over the prompt and the output, frequency and presence over the
//! output), a logit bias, and no stop token before `min_tokens`. A request without rules draws from
//! the model's row as it is, uncopied.

use std::borrow::Cow;
use std::collections::HashMap;

use super::Sampler;

/// Penalties on tokens the request already has, as vLLM and the OpenAI API define them.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Penalties {
    /// Subtracted from a token's logit once if the output has it (OpenAI `presence_penalty`).
    pub presence: f32,
    /// Subtracted from a token's logit once per time the output has it (`frequency_penalty`).
    pub frequency: f32,
    /// A positive logit is divided by it, a negative one multiplied, for every token the prompt or
    /// the output has (vLLM's `repetition_penalty`; 1: none).
    pub repetition: f32,
}

impl Penalties {
    /// No penalty.
    pub const NONE: Self = Self {
        presence: 0.0,
        frequency: 0.0,
        repetition: 1.0,
    };

    fn is_none(&self) -> bool {
        *self == Self::NONE
    }
}

impl Default for Penalties {
    fn default() -> Self {
        Self::NONE
    }
}

/// A sampler's rules (see the module).
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Rules {
    pub(super) penalties: Penalties,
    pub(super) bias: Vec<(u32, f32)>,
    pub(super) min_tokens: usize,
    pub(super) stop_tokens: Vec<u32>,
}

impl Rules {
    pub(super) const NONE: Self = Self {
        penalties: Penalties::NONE,
        bias: Vec::new(),
        min_tokens: 0,
        stop_tokens: Vec::new(),
    };
}

impl Sampler {
    /// `logits` after the request's rules, given its `tokens` (prompt, then output from `prompt`
    /// on) and the model's stop tokens; the row itself when no rule applies.
    pub fn adjust<'a>(
        &self,
        logits: &'a [f32],
        tokens: &[u32],
        prompt: usize,
        model_stops: &[u32],
    ) -> Cow<'a, [f32]> {
        let r = &self.rules;
        let output = tokens.get(prompt..).unwrap_or(&[]);
        let early = output.len() < r.min_tokens;
        if r.penalties.is_none() && r.bias.is_empty() && !early {
            return Cow::Borrowed(logits);
        }
        let mut row = logits.to_vec();
        penalize(&mut row, &r.penalties, tokens, output);
        for &(t, b) in &r.bias {
            if let Some(l) = row.get_mut(t as usize) {
                *l += b;
            }
        }
        if early {
            let stops = model_stops.iter().filter(|_| self.stops());
            for &t in stops.chain(&r.stop_tokens) {
                if let Some(l) = row.get_mut(t as usize) {
                    *l = f32::NEG_INFINITY;
                }
            }
        }
        Cow::Owned(row)
    }
}

/// Applies `p` to `row`: repetition over every token of `tokens`, frequency and presence over
/// `output`'s counts.
fn penalize(row: &mut [f32], p: &Penalties, tokens: &[u32], output: &[u32]) {
    if p.is_none() {
        return;
    }
    if p.repetition != 1.0 {
        let mut seen = tokens.to_vec();
        seen.sort_unstable();
        seen.dedup();
        for &t in &seen {
            if let Some(l) = row.get_mut(t as usize) {
                *l = if *l > 0.0 {
                    *l / p.repetition
                } else {
                    *l * p.repetition
                };
            }
        }
    }
    if p.frequency != 0.0 || p.presence != 0.0 {
        let mut counts: HashMap<u32, u32> = HashMap::new();
        for &t in output {
            *counts.entry(t).or_default() += 1;
        }
        for (t, n) in counts {
            if let Some(l) = row.get_mut(t as usize) {
                *l -= p.frequency * n as f32 + p.presence;
            }
        }
    }
}

/// Zeroes every weight outside the `k` largest (equal weights by lower id first); 0 keeps all.
pub(super) fn keep_top_k(weights: &mut [f64], k: usize) {
    if k == 0 || k >= weights.len() {
        return;
    }
    let mut ranked: Vec<u32> = (0..weights.len() as u32).collect();
    ranked.select_nth_unstable_by(k - 1, |&a, &b| {
        weights[b as usize]
            .total_cmp(&weights[a as usize])
            .then(a.cmp(&b))
    });
    for &t in &ranked[k..] {
        weights[t as usize] = 0.0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn penalties_follow_vllm() {
        let s = Sampler::greedy().with_penalties(Penalties {
            presence: 0.5,
            frequency: 0.25,
            repetition: 2.0,
        });
        // Token 0 in the prompt only; token 1 twice in the output; token 2 nowhere.
        let row = s.adjust(&[1.0, -1.0, 3.0], &[0, 1, 1], 1, &[]);
        assert_eq!(&row[..], &[0.5, -2.0 - 0.5 - 0.5, 3.0]);
        let plain = [1.0f32, 2.0];
        assert!(matches!(
            Sampler::greedy().adjust(&plain, &[0], 0, &[1]),
            Cow::Borrowed(_)
        ));
    }

    #[test]
    fn no_stop_token_before_min_tokens_and_a_bias_moves_the_argmax() {
        let s = Sampler::greedy()
            .with_min_tokens(2)
            .with_stop_tokens(vec![2]);
        let row = s.adjust(&[0.0, 1.0, 5.0, 4.0], &[9, 3], 1, &[3]);
        assert_eq!(&row[..], &[0.0, 1.0, f32::NEG_INFINITY, f32::NEG_INFINITY]);
        assert_eq!(s.adjust(&[0.0, 1.0], &[9, 3, 3], 1, &[1])[1], 1.0);
        let biased = Sampler::greedy().with_logit_bias(vec![(0, 10.0)]);
        let mut g = biased.clone();
        assert_eq!(g.sample(&biased.adjust(&[0.0, 5.0], &[1], 1, &[])), 0);
    }

    #[test]
    fn top_k_keeps_the_k_largest_by_lower_id_on_ties() {
        let mut w = [0.5, 1.0, 0.5, 0.25];
        keep_top_k(&mut w, 2);
        assert_eq!(w, [0.5, 1.0, 0.0, 0.0]);
        let mut s = Sampler::seeded(3, 1.0).with_top_k(1);
        assert!((0..200).all(|_| s.sample(&[0.0, 2.0, 1.9]) == 1));
        let mut m = Sampler::seeded(3, 1.0).with_min_p(0.5);
        // exp(-1) < 0.5: token 0 is never drawn; exp(-0.1) > 0.5: token 2 is.
        let d: Vec<u32> = (0..300).map(|_| m.sample(&[1.0, 2.0, 1.9])).collect();
        assert!(!d.contains(&0) && d.contains(&2), "{d:?}");
    }
}
