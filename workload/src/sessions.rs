//! A multi-turn conversation generator: prefix blocks for traces that carry none (Azure, BurstGPT,
//! synthetic), so the prefix cache has something real to find.
//!
//! The trace fixes each request's arrival, prompt and output length; the generator only decides what the
//! prompt *is*, as [`Arrival::prefix_blocks`] of [`BLOCK_TOKENS`] tokens each:
//!
//! 1. **System prompts per adapter.** Every adapter (and the base model) has a system prompt of 256, 512,
//!    768 or 1024 tokens (a seeded draw per adapter). Every prompt starts with it, as far as it reaches.
//! 2. **Sessions.** An arrival continues an open session of its adapter with probability
//!    [`FOLLOW_UP`]: the most recent one whose last turn (prompt + output) is shorter than this prompt,
//!    which then holds that history — system prompt, earlier turns, earlier answers — followed by the
//!    new user message. Otherwise it opens a new session. A session stays open for its adapter's next
//!    [`OPEN_SESSIONS`] sessions.
//!
//! Block ids: a block inside the system prompt is named by (adapter, index); any other block by
//! (session, index). Two prompts therefore share exactly their common system prompt and, within one
//! session, their common history. Only blocks that lie wholly inside a prompt are listed. An earlier
//! turn's *answer* appears in the next prompt under the session's ids, but a cache of prompt blocks never
//! committed it, so reuse stops at the previous prompt's end: what an engine that caches prompts only
//! would find.

use rand::{Rng as _, RngCore, SeedableRng};

use super::{Arrival, Rng, Workload};

/// Tokens per generated prefix block (divides every power-of-two page size from 16 tokens up).
pub const BLOCK_TOKENS: u32 = 16;
/// Probability that an arrival continues an open session of its adapter (when one fits).
pub const FOLLOW_UP: f64 = 0.5;
/// Open sessions kept per adapter (the most recent ones).
pub const OPEN_SESSIONS: usize = 64;

#[derive(Debug, Clone, Copy)]
struct Session {
    id: u64,
    /// The last turn's prompt + output: the history a follow-up's prompt holds.
    context: u64,
}

fn id(kind: u64, owner: u64, index: u64, seed: u64) -> u64 {
    // The first output of a generator seeded with the key: a well-mixed 64-bit hash of it.
    let hash = |key: u64| Rng::seed_from_u64(key).next_u64();
    hash(hash(seed ^ kind.rotate_left(61) ^ owner.wrapping_mul(0x9e37_79b9_7f4a_7c15)) ^ index)
}

/// The system prompt length of an adapter (`None`: the base model), a seeded draw of 256 to 1024 tokens.
pub fn system_prompt_tokens(adapter: Option<u32>, seed: u64) -> u32 {
    let key = adapter.map_or(0, |a| u64::from(a) + 1);
    256 * (1 + (id(3, key, 0, seed) % 4) as u32)
}

/// Gives every arrival its prefix blocks (see the [module docs](self)) and sets the workload's block
/// size to [`BLOCK_TOKENS`]. Deterministic for a seed; run after adapters are assigned.
pub fn assign_sessions(w: &mut Workload, seed: u64) {
    let mut rng = Rng::seed_from_u64(seed ^ 0x5e55_1045);
    let mut open: std::collections::HashMap<Option<u32>, Vec<Session>> =
        std::collections::HashMap::default();
    let mut next_session = 0u64;
    for a in &mut w.arrivals {
        let sessions = open.entry(a.adapter).or_default();
        let prompt = u64::from(a.prompt_tokens);
        let follow = rng.gen::<f64>() < FOLLOW_UP;
        let at = follow
            .then(|| sessions.iter().rposition(|s| s.context < prompt))
            .flatten();
        let session = if let Some(i) = at {
            sessions.remove(i)
        } else {
            next_session += 1;
            Session {
                id: next_session,
                context: 0,
            }
        };
        a.prefix_blocks = blocks(a, session.id, seed);
        sessions.push(Session {
            context: prompt + u64::from(a.output_tokens),
            ..session
        });
        if sessions.len() > OPEN_SESSIONS {
            sessions.remove(0);
        }
    }
    w.prefix_block_tokens = Some(BLOCK_TOKENS);
}

/// The ids of the blocks wholly inside `a`'s prompt, in session `session`.
fn blocks(a: &Arrival, session: u64, seed: u64) -> Vec<u64> {
    let system = system_prompt_tokens(a.adapter, seed) / BLOCK_TOKENS;
    let key = a.adapter.map_or(0, |x| u64::from(x) + 1);
    (0..a.prompt_tokens / BLOCK_TOKENS)
        .map(|k| {
            if k < system {
                id(1, key, u64::from(k), seed)
            } else {
                id(2, session, u64::from(k), seed)
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Source, TraceFormat};

    fn source() -> Source {
        Source::Trace {
            path: "test".into(),
            format: TraceFormat::Azure2023,
        }
    }

    fn arrival(at_ms: f64, prompt: u32, output: u32, adapter: Option<u32>) -> Arrival {
        Arrival {
            at_ms,
            prompt_tokens: prompt,
            output_tokens: output,
            adapter,
            prefix_blocks: Vec::new(),
        }
    }

    fn common(a: &[u64], b: &[u64]) -> usize {
        a.iter().zip(b).take_while(|(x, y)| x == y).count()
    }

    #[test]
    fn prompts_share_their_adapters_system_prompt_and_their_sessions_history() {
        let arrivals = (0..400)
            .map(|i| arrival(i as f64, 200 + (i % 7) * 300, 50, Some(i % 3)))
            .collect();
        let mut w = Workload::new(arrivals, source());
        assign_sessions(&mut w, 7);
        assert_eq!(w.prefix_block_tokens, Some(BLOCK_TOKENS));
        let mut follow_ups = 0;
        for (i, a) in w.arrivals.iter().enumerate() {
            assert_eq!(a.prefix_blocks.len() as u32, a.prompt_tokens / BLOCK_TOKENS);
            let system = (system_prompt_tokens(a.adapter, 7) / BLOCK_TOKENS) as usize;
            for b in &w.arrivals[..i] {
                let shared = common(&a.prefix_blocks, &b.prefix_blocks);
                if b.adapter != a.adapter {
                    assert_eq!(shared, 0, "adapters never share");
                    continue;
                }
                let short = a.prefix_blocks.len().min(b.prefix_blocks.len());
                assert!(shared >= system.min(short), "the system prompt is shared");
                if shared > system {
                    // The earlier prompt is part of this one's history.
                    assert!(
                        u64::from(b.prompt_tokens + b.output_tokens) < u64::from(a.prompt_tokens)
                    );
                    follow_ups += 1;
                }
            }
        }
        assert!(follow_ups > 50, "{follow_ups} follow-ups");
    }

    #[test]
    fn the_same_seed_gives_the_same_conversations() {
        let make = |seed| {
            let arrivals = (0..50).map(|i| arrival(i as f64, 900, 20, None)).collect();
            let mut w = Workload::new(arrivals, source());
            assign_sessions(&mut w, seed);
            w
        };
        assert_eq!(make(3), make(3));
        assert_ne!(make(3), make(4));
    }
}
