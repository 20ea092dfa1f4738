//! A step budget in time (issue 45, beyond the reference): [`StepBudget`] sizes context chunks so that a
//! step's predicted time stays under an inter-token-latency target while decodes run.
//!
//! A token budget is not a latency budget: a step's time depends on its chunk, its batch and the
//! contexts its attention reads. [`StepCost`] is the engine's cost model as a table of coefficients
//! (what `kvsched cost --fit` fits, `sim/src/cost.rs`), in picoseconds so that it is exact in integers
//! and the pass calls it without allocation or floating point:
//!
//! ```text
//! step = step_ps + decodes × decode_request_ps + their cached tokens × cached_token_ps
//!      + Σ chunks (tokens × prefill_token_ps + (tokens × prior + tokens² / 2) × pair_ps)
//! ```
//!
//! The pass ([`crate::scheduler`], `chunking.rs`) charges the step's fixed cost and its decode steps
//! once phase 1 is done (a decode's cached tokens counted as its prompt: the scheduler does not know
//! the tokens it generated), then caps each chunk at the longest whose predicted cost fits what is
//! left, rounded down to the chunk unit. With no decode in the step the token budget alone decides
//! (nobody waits for a token). The first chunk of a step is never capped below one chunk unit, so
//! prefill progresses even when decodes alone use the target up. The token budget stays the hard
//! ceiling.

/// An engine's step cost model, in picoseconds per unit of work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct StepCost {
    /// Fixed cost of a step.
    pub step_ps: u64,
    /// Per prefill (context) token.
    pub prefill_token_ps: u64,
    /// Per decode request in the batch.
    pub decode_request_ps: u64,
    /// Per cached token a decode request's attention reads.
    pub cached_token_ps: u64,
    /// Per (query, key) pair of a chunk's attention: tokens × prior context + tokens² / 2.
    pub pair_ps: u64,
}

impl StepCost {
    /// Predicted picoseconds of a step's fixed cost and its `decodes` decode steps reading `cached`
    /// tokens in all (saturating).
    pub const fn decodes_ps(&self, decodes: u64, cached: u64) -> u64 {
        let d = decodes.saturating_mul(self.decode_request_ps);
        let c = cached.saturating_mul(self.cached_token_ps);
        self.step_ps.saturating_add(d).saturating_add(c)
    }

    /// Predicted picoseconds of a chunk of `tokens` after `prior` tokens of context (saturating).
    pub const fn chunk_ps(&self, tokens: u32, prior: u32) -> u64 {
        let t = tokens as u64;
        let pairs = t.saturating_mul(prior as u64).saturating_add(t * t / 2);
        let attention = pairs.saturating_mul(self.pair_ps);
        t.saturating_mul(self.prefill_token_ps)
            .saturating_add(attention)
    }

    /// The longest chunk of at most `max` tokens after `prior` whose cost fits `left` picoseconds
    /// (a chunk's cost grows with its length: a binary search, at most 33 steps).
    pub fn fit(&self, prior: u32, left: u64, max: u32) -> u32 {
        let (mut lo, mut hi) = (0u32, max);
        while lo < hi {
            let mid = lo + (hi - lo).div_ceil(2);
            if self.chunk_ps(mid, prior) <= left {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        lo
    }
}

/// An inter-token-latency target and the cost model that predicts a step's time
/// ([`crate::Config::step_budget`]; needs chunked prefill).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct StepBudget {
    /// The target for a step with decodes in it, in microseconds.
    pub itl_us: u64,
    /// The engine's cost model.
    pub cost: StepCost,
}

impl StepBudget {
    /// The target in picoseconds.
    pub const fn target_ps(&self) -> u64 {
        self.itl_us.saturating_mul(1_000_000)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const COST: StepCost = StepCost {
        step_ps: 1_000_000,
        prefill_token_ps: 10_000,
        decode_request_ps: 5_000,
        cached_token_ps: 10,
        pair_ps: 100,
    };

    #[test]
    fn the_fitted_chunk_is_the_longest_that_fits() {
        for prior in [0, 100, 5_000] {
            for left in [0, 9_999, 10_000, 1_000_000, 50_000_000] {
                let c = COST.fit(prior, left, 4_096);
                assert!(COST.chunk_ps(c, prior) <= left);
                assert!(
                    c == 4_096 || COST.chunk_ps(c + 1, prior) > left,
                    "{prior} {left} {c}"
                );
            }
        }
        assert_eq!(COST.fit(0, u64::MAX, 7), 7, "capped at the most asked");
        assert_eq!(COST.decodes_ps(2, 100), 1_000_000 + 10_000 + 1_000);
    }
}
