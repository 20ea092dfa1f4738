//! Per-pass token, request and time budgets (one fresh instance per pass). The adapter page budget lives
//! in [`crate::lease::AdapterDesk`]; the step budget in time is sized in `scheduler/step_time.rs`.

use crate::config::{ChunkPolicy, Config};

/// Token and request budget of one pass.
#[derive(Debug, Clone, Copy)]
pub struct Budget {
    limit: Option<u32>,
    /// The token limit, `u64::MAX` when unlimited (so `fits` needs no branch on the option).
    cap: u64,
    used: u64,
    requests: u32,
    max_requests: u32,
    /// Picoseconds left of a step budget in time (`None`: no cap), and whether a chunk was charged.
    time_left: Option<u64>,
    timed: bool,
}

impl Budget {
    /// A fresh budget.
    pub fn new(cfg: &Config) -> Self {
        Self {
            limit: cfg.max_num_tokens,
            cap: cfg.max_num_tokens.map_or(u64::MAX, u64::from),
            used: 0,
            requests: 0,
            max_requests: cfg.max_num_requests,
            time_left: None,
            timed: false,
        }
    }
    /// The step's time left once its decodes are charged: chunks are capped from now on.
    pub(crate) fn start_time(&mut self, left_ps: u64) {
        self.time_left = Some(left_ps);
    }
    /// Picoseconds left of the step's time (`None`: no cap), and whether a chunk was charged.
    pub(crate) fn time_left(&self) -> (Option<u64>, bool) {
        (self.time_left, self.timed)
    }
    /// A chunk predicted to take `ps` picoseconds was scheduled.
    pub(crate) fn charge_time(&mut self, ps: u64) {
        self.time_left = self.time_left.map(|l| l.saturating_sub(ps));
        self.timed = true;
    }
    /// `n` more tokens fit.
    #[inline]
    pub fn fits(&self, n: u32) -> bool {
        // No overflow: `used` is a sum of u32 token counts, one per scheduled request (at most 2^16
        // of them), far below u64::MAX - u32::MAX.
        self.used + u64::from(n) <= self.cap
    }
    /// Tokens left (`None` = unlimited).
    #[inline]
    pub fn remaining(&self) -> Option<u32> {
        self.limit
            .map(|l| u32::try_from(u64::from(l).saturating_sub(self.used)).unwrap_or(l))
    }
    /// The request limit is reached.
    #[inline]
    pub fn requests_full(&self) -> bool {
        self.requests >= self.max_requests
    }
    /// Commits a scheduled request.
    #[inline]
    pub fn commit(&mut self, tokens: u32) {
        self.used += u64::from(tokens);
        self.requests += 1;
    }
    /// The raw counters, for a loop that keeps them in registers: (tokens used, token cap — `u64::MAX`
    /// when unlimited — requests committed, request limit).
    #[inline]
    pub(crate) fn raw(&self) -> (u64, u64, u32, u32) {
        (self.used, self.cap, self.requests, self.max_requests)
    }
    /// Stores the counters such a loop advanced (only ever forward).
    #[inline]
    pub(crate) fn set_raw(&mut self, used: u64, requests: u32) {
        debug_assert!(used >= self.used && requests >= self.requests);
        self.used = used;
        self.requests = requests;
    }
    /// Tokens used.
    pub fn used(&self) -> u64 {
        self.used
    }
    /// Requests committed.
    pub fn requests(&self) -> u32 {
        self.requests
    }
    /// A chunked context can get a chunk (spec §1.6 step 2).
    #[inline]
    pub fn has_chunk_budget(&self, policy: ChunkPolicy, unit: u32) -> bool {
        match self.remaining() {
            None => true,
            Some(r) => r > 0 && (policy == ChunkPolicy::ForceChunk || r >= unit),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_requests_and_chunk_budget() {
        let cfg = Config {
            max_num_tokens: Some(10),
            max_num_requests: 2,
            ..Config::default()
        };
        let mut b = Budget::new(&cfg);
        assert!(b.fits(10) && !b.fits(11));
        b.commit(7);
        assert_eq!(b.remaining(), Some(3));
        assert!(
            !b.has_chunk_budget(ChunkPolicy::FirstComeFirstServed, 4),
            "less than a unit left"
        );
        assert!(
            b.has_chunk_budget(ChunkPolicy::ForceChunk, 4),
            "FORCE_CHUNK takes any remainder"
        );
        assert!(!b.requests_full());
        b.commit(5); // unchecked last-chunk drafts may overdraw
        assert_eq!(b.remaining(), Some(0));
        assert!(b.requests_full());
        assert!(!b.has_chunk_budget(ChunkPolicy::ForceChunk, 4));
        let unlimited = Budget::new(&Config {
            max_num_tokens: None,
            ..Config::default()
        });
        assert!(unlimited.fits(u32::MAX) && unlimited.remaining().is_none());
    }
}
