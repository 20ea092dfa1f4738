//! Per-adapter service in a run: each adapter's TTFT distribution, and the service it received while
//! it had requests waiting for their first token (its backlog), for Jain's fairness index.
//!
//! Service is VTC's measure (Sheng et al., OSDI 2024): a prompt token processed counts 1, a token
//! generated counts 2. An adapter is *backlogged* from the arrival of a request until that request's
//! first token, while any of its requests is in that state; its *service rate* is the service its
//! requests received during its backlogged time, over that time. Jain's index over the backlogged
//! adapters' rates, `(Σx)² / (n·Σx²)`, is 1 when every backlogged adapter was served at the same rate
//! and `1/n` when one took everything.

use serde::Serialize;

use super::report::Quantiles;

/// Weight of a generated token against a prompt token (VTC's paper setting).
pub const OUTPUT_WEIGHT: f64 = 2.0;

/// One adapter's figures.
#[derive(Debug, Clone, Default, Serialize)]
pub struct AdapterService {
    /// Adapter id.
    pub adapter: u32,
    /// Requests that received their first token.
    pub requests: u64,
    /// Time to first token, ms.
    pub ttft_ms: Quantiles,
    /// Weighted tokens served per second of the adapter's backlog.
    pub service_rate: f64,
    #[serde(skip)]
    ttfts: Vec<f64>,
    #[serde(skip)]
    waiting: u32,
    #[serde(skip)]
    backlog_ms: f64,
    #[serde(skip)]
    service: f64,
}

/// Every adapter's accounts.
#[derive(Debug, Clone, Default)]
pub struct Fairness {
    adapters: Vec<AdapterService>,
}

impl Fairness {
    /// Accounts for `n` adapters.
    pub fn new(n: u32) -> Self {
        Self {
            adapters: (0..n)
                .map(|adapter| AdapterService {
                    adapter,
                    ..AdapterService::default()
                })
                .collect(),
        }
    }

    fn of(&mut self, adapter: Option<u32>) -> Option<&mut AdapterService> {
        self.adapters.get_mut(adapter? as usize)
    }

    /// A request of `adapter` arrived.
    pub fn arrived(&mut self, adapter: Option<u32>) {
        if let Some(a) = self.of(adapter) {
            a.waiting += 1;
        }
    }

    /// A request of `adapter` got its first token `ttft_ms` after its arrival.
    pub fn first_token(&mut self, adapter: Option<u32>, ttft_ms: f64) {
        if let Some(a) = self.of(adapter) {
            a.waiting = a.waiting.saturating_sub(1);
            a.ttfts.push(ttft_ms);
        }
    }

    /// `adapter`'s requests received `service` weighted tokens in the step that just ran.
    pub fn served(&mut self, adapter: Option<u32>, service: f64) {
        if let Some(a) = self.of(adapter) {
            if a.waiting > 0 {
                a.service += service;
            }
        }
    }

    /// A step of `ms` ran: every backlogged adapter waited through it.
    pub fn elapsed(&mut self, ms: f64) {
        for a in self.adapters.iter_mut().filter(|a| a.waiting > 0) {
            a.backlog_ms += ms;
        }
    }

    /// The per-adapter figures (adapters that served at least one request) and Jain's index over the
    /// backlogged ones' service rates (1 with fewer than two).
    pub fn finish(mut self) -> (Vec<AdapterService>, f64) {
        for a in &mut self.adapters {
            a.ttfts.sort_by(f64::total_cmp);
            a.ttft_ms = Quantiles::of(&a.ttfts);
            a.requests = a.ttfts.len() as u64;
            a.service_rate = if a.backlog_ms > 0.0 {
                a.service / (a.backlog_ms / 1000.0)
            } else {
                0.0
            };
        }
        let rates: Vec<f64> = self
            .adapters
            .iter()
            .filter(|a| a.backlog_ms > 0.0)
            .map(|a| a.service_rate)
            .collect();
        self.adapters.retain(|a| a.requests > 0);
        (self.adapters, jain(&rates))
    }
}

/// Jain's fairness index of `x`: `(Σx)² / (n·Σx²)`; 1 for fewer than two values or all zero.
pub fn jain(x: &[f64]) -> f64 {
    let (sum, squares) = x.iter().fold((0.0, 0.0), |(s, q), v| (s + v, q + v * v));
    if x.len() < 2 || squares == 0.0 {
        1.0
    } else {
        sum * sum / (x.len() as f64 * squares)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jain_is_one_when_equal_and_one_over_n_when_one_takes_all() {
        assert_eq!(jain(&[3.0, 3.0, 3.0]), 1.0);
        assert!((jain(&[1.0, 0.0, 0.0, 0.0]) - 0.25).abs() < 1e-12);
        assert_eq!(jain(&[5.0]), 1.0);
    }

    #[test]
    fn service_counts_only_while_backlogged() {
        let mut f = Fairness::new(2);
        f.arrived(Some(0));
        f.served(Some(0), 10.0);
        f.served(Some(1), 99.0); // adapter 1 has nothing waiting
        f.elapsed(500.0);
        f.first_token(Some(0), 500.0);
        f.served(Some(0), 7.0); // after its backlog
        f.elapsed(500.0);
        let (adapters, index) = f.finish();
        assert_eq!(adapters.len(), 1);
        assert_eq!(adapters[0].service_rate, 20.0);
        assert_eq!(adapters[0].ttft_ms.p50, 500.0);
        assert_eq!(index, 1.0);
    }
}
