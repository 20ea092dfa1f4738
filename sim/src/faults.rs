//! Faults of the remote store and of the disaggregation link (`--store-faults`, `--link-faults`),
//! drawn at given rates from a seeded generator, so that a report shows what a flaky store or link
//! costs and `--check` shows the scheduler stays sound through them.
//!
//! The store's: a load that fails (its pages hold nothing usable: the request recomputes those
//! tokens), a load that stalls (never confirmed: the pool abandons it after its timeout, and the
//! request recomputes), a save never acknowledged (its pages stay pinned until the pool's timeout
//! abandons it). The link's: a transfer that fails (both ends told at its end; the decode engine
//! replays the prompt itself), or stalls (never ends: both ends cancel it after `timeout_ms`, and the
//! decode engine replays the prompt). The core's rules for each are the connector's (spec §1.12,
//! `core/src/connector.rs`) and the transfer manager's (`core/src/scheduler/transfer.rs`).

use kvsched_workload::Rng;
use rand::{Rng as _, SeedableRng};

/// A faults specification [`StoreFaults::from_str`](std::str::FromStr::from_str) or
/// [`LinkFaults::from_str`](std::str::FromStr::from_str) refused (quoted, with what was expected).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("expected {expected} (rates from 0 to 1 that sum to at most 1), got {got:?}")]
pub struct BadFaults {
    /// The syntax.
    pub expected: &'static str,
    /// The text refused.
    pub got: String,
}

/// `--store-faults LOAD_FAIL[:LOAD_STALL[:SAVE_LOST]]`: the rates of a remote store's faults.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct StoreFaults {
    /// A load fails.
    pub load_fail: f64,
    /// A load is never confirmed (the pool's timeout abandons it).
    pub load_stall: f64,
    /// A save is never acknowledged (the pool's timeout abandons it).
    pub save_lost: f64,
}

/// `--link-faults FAIL[:STALL[:TIMEOUT_MS]]`: the rates of a disaggregation link's faults.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LinkFaults {
    /// A transfer fails (told at its end).
    pub fail: f64,
    /// A transfer never ends (cancelled after `timeout_ms`).
    pub stall: f64,
    /// When the engines give a transfer up, ms after it started (default 500).
    pub timeout_ms: f64,
}

/// Parses up to `n` rates separated by `:` (missing ones 0), each in [0, 1]; `rest` gets what follows.
fn rates<'v, const N: usize>(
    v: &'v str,
    n: usize,
    expected: &'static str,
) -> Result<([f64; N], Option<&'v str>), BadFaults> {
    let bad = || BadFaults {
        expected,
        got: v.to_owned(),
    };
    let mut out = [0.0; N];
    let mut it = v.split(':');
    for (k, slot) in out.iter_mut().enumerate().take(n) {
        match it.next() {
            Some(x) => {
                *slot = x
                    .parse::<f64>()
                    .ok()
                    .filter(|r| (0.0..=1.0).contains(r))
                    .ok_or_else(bad)?;
            }
            None if k > 0 => break,
            None => return Err(bad()),
        }
    }
    let rest = it.next();
    if it.next().is_some() {
        return Err(bad());
    }
    Ok((out, rest))
}

impl std::str::FromStr for StoreFaults {
    type Err = BadFaults;

    fn from_str(v: &str) -> Result<Self, BadFaults> {
        const SYNTAX: &str = "LOAD_FAIL[:LOAD_STALL[:SAVE_LOST]]";
        let ([load_fail, load_stall, save_lost], rest) = rates::<3>(v, 3, SYNTAX)?;
        if rest.is_some() || load_fail + load_stall > 1.0 {
            return Err(BadFaults {
                expected: SYNTAX,
                got: v.to_owned(),
            });
        }
        Ok(Self {
            load_fail,
            load_stall,
            save_lost,
        })
    }
}

impl std::str::FromStr for LinkFaults {
    type Err = BadFaults;

    fn from_str(v: &str) -> Result<Self, BadFaults> {
        const SYNTAX: &str = "FAIL[:STALL[:TIMEOUT_MS]]";
        let bad = || BadFaults {
            expected: SYNTAX,
            got: v.to_owned(),
        };
        let ([fail, stall], rest) = rates::<2>(v, 2, SYNTAX)?;
        let timeout_ms = super::cluster::positive_or(rest, 500.0).ok_or_else(bad)?;
        if fail + stall > 1.0 {
            return Err(bad());
        }
        Ok(Self {
            fail,
            stall,
            timeout_ms,
        })
    }
}

/// How one load, save or transfer goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// As it should.
    Done,
    /// It fails, and says so.
    Failed,
    /// It never ends (a load never confirmed, a save never acknowledged, a transfer hung).
    Stalled,
}

/// A seeded draw of outcomes at a failure rate and a stall rate.
#[derive(Debug, Clone)]
pub(crate) struct Draw {
    fail: f64,
    stall: f64,
    rng: Rng,
}

impl Default for Draw {
    /// No faults.
    fn default() -> Self {
        Self::new(0.0, 0.0, 0)
    }
}

impl Draw {
    /// Outcomes failing at `fail` and stalling at `stall`, from `seed`.
    pub(crate) fn new(fail: f64, stall: f64, seed: u64) -> Self {
        Self {
            fail,
            stall,
            rng: Rng::seed_from_u64(seed),
        }
    }

    /// The next outcome (no draw is made when both rates are 0: a run without faults is unchanged).
    pub(crate) fn next(&mut self) -> Outcome {
        if self.fail + self.stall == 0.0 {
            return Outcome::Done;
        }
        let u: f64 = self.rng.gen();
        if u < self.fail {
            Outcome::Failed
        } else if u < self.fail + self.stall {
            Outcome::Stalled
        } else {
            Outcome::Done
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specifications_parse_and_bad_ones_are_refused() {
        let s: StoreFaults = "0.1:0.05:0.2".parse().unwrap();
        assert_eq!((s.load_fail, s.load_stall, s.save_lost), (0.1, 0.05, 0.2));
        let s: StoreFaults = "0.3".parse().unwrap();
        assert_eq!((s.load_fail, s.load_stall, s.save_lost), (0.3, 0.0, 0.0));
        let l: LinkFaults = "0.1:0.1".parse().unwrap();
        assert_eq!((l.fail, l.stall, l.timeout_ms), (0.1, 0.1, 500.0));
        let l: LinkFaults = "0:0.5:40".parse().unwrap();
        assert_eq!(l.timeout_ms, 40.0);
        for bad in [
            "",
            "x",
            "1.5",
            "-0.1",
            "0.6:0.6",
            "0.1:0.1:0.1:0.1",
            "0.1::0.1",
        ] {
            assert!(bad.parse::<StoreFaults>().is_err(), "{bad:?}");
        }
        for bad in ["", "2", "0.1:0.1:0", "0.1:0.1:x", "0.7:0.7", "0.1:0.1:5:5"] {
            assert!(bad.parse::<LinkFaults>().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn outcomes_follow_their_rates() {
        let mut d = Draw::new(0.2, 0.1, 7);
        let mut n = [0u32; 3];
        for _ in 0..100_000 {
            n[d.next() as usize] += 1;
        }
        assert!(
            (19_000..21_000).contains(&n[Outcome::Failed as usize]),
            "{n:?}"
        );
        assert!(
            (9_000..11_000).contains(&n[Outcome::Stalled as usize]),
            "{n:?}"
        );
        let mut none = Draw::new(0.0, 0.0, 7);
        assert!((0..1000).all(|_| none.next() == Outcome::Done));
    }
}
