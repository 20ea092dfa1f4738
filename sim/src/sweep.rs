//! `kvsched simulate --sweep PARAM=V1,V2,…`: the same run over a range of one parameter, with the
//! throughput–latency table and curve that capacity planning needs.
//!
//! A [`Sweep`] gives each of its points' options ([`Sweep::point`]); the caller loads the workload for
//! each (the rate parameter rescales the arrival times) and runs it.

use std::fmt::Write as _;

use kvsched_core::config::CapacityPolicy;

#[cfg(feature = "plot")]
use crate::plot::{Panel, Timeline};
use crate::{Report, SimOptions};

/// The parameter a sweep varies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SweepParam {
    /// Arrival-rate scale: 2 = arrivals twice as dense (arrival times halved).
    Rate,
    /// [`SimOptions::kv_gpu_pages`].
    KvGpuPages,
    /// [`AdapterOptions::count`](crate::AdapterOptions::count).
    Adapters,
    /// [`SimOptions::max_batch`].
    MaxBatch,
    /// [`SimOptions::policy`] (values `max_utilization`, `guaranteed_no_evict`).
    Policy,
    /// [`SimOptions::admission`] (values `fcfs`, `vtc`, `deadline`).
    Admission,
}

impl SweepParam {
    /// Every parameter, in the order the help lists them.
    pub const ALL: [Self; 6] = [
        Self::Rate,
        Self::KvGpuPages,
        Self::Adapters,
        Self::MaxBatch,
        Self::Policy,
        Self::Admission,
    ];

    /// Its name in `PARAM=V1,V2,…`.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Rate => "rate",
            Self::KvGpuPages => "kv-gpu-pages",
            Self::Adapters => "adapters",
            Self::MaxBatch => "max-batch",
            Self::Policy => "policy",
            Self::Admission => "admission",
        }
    }
}

/// A sweep specification [`Sweep::parse`] refused, or a value it cannot set.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SweepError {
    /// Not `PARAM=V1,V2,…` (quoted).
    #[error("expected PARAM=V1,V2,…, got {0:?}")]
    Syntax(String),
    /// A parameter that is none of [`SweepParam::ALL`] (quoted).
    #[error(
        "unknown parameter {0:?} (rate, kv-gpu-pages, adapters, max-batch, policy, admission)"
    )]
    UnknownParam(String),
    /// Fewer than two values.
    #[error("give at least two values")]
    TooFewValues,
    /// Numeric values that do not ascend.
    #[error("numeric values must ascend")]
    NotAscending,
    /// A value the parameter cannot take: the value, and what it must be.
    #[error("{value:?} is not {expected}")]
    BadValue {
        /// The value as given.
        value: String,
        /// What the parameter takes (`a page count`, …).
        expected: &'static str,
    },
}

/// A parsed `--sweep`.
#[derive(Debug, Clone, PartialEq)]
pub struct Sweep {
    /// What varies.
    pub param: SweepParam,
    /// Its values, as given.
    pub values: Vec<String>,
}

/// One point of a sweep: its options, and how it rescales the arrivals.
#[derive(Debug, Clone, PartialEq)]
pub struct Point {
    /// The run's options.
    pub opts: SimOptions,
    /// The arrival-rate scale of a rate sweep (arrival times are divided by it); `None` for the other
    /// parameters.
    pub rate: Option<f64>,
}

impl Sweep {
    /// Parses `PARAM=V1,V2,…`: a known parameter, at least two values, each valid for it, numeric
    /// values ascending.
    ///
    /// # Errors
    ///
    /// [`SweepError`] says which of these fails.
    pub fn parse(spec: &str) -> Result<Self, SweepError> {
        let (name, list) = spec
            .split_once('=')
            .ok_or_else(|| SweepError::Syntax(spec.to_owned()))?;
        let param = SweepParam::ALL
            .into_iter()
            .find(|p| p.name() == name)
            .ok_or_else(|| SweepError::UnknownParam(name.to_owned()))?;
        let values: Vec<String> = list.split(',').map(str::to_string).collect();
        if values.len() < 2 {
            return Err(SweepError::TooFewValues);
        }
        let sweep = Self { param, values };
        let mut last = f64::NEG_INFINITY;
        for (i, v) in sweep.values.iter().enumerate() {
            sweep.point(i, &SimOptions::default())?;
            if !matches!(param, SweepParam::Policy | SweepParam::Admission) {
                let x: f64 = v.parse().unwrap_or(f64::NAN);
                if x <= last {
                    return Err(SweepError::NotAscending);
                }
                last = x;
            }
        }
        Ok(sweep)
    }

    /// Point `i` over `base`: the options with value `i` set.
    ///
    /// # Errors
    ///
    /// [`SweepError::BadValue`] when the value does not suit the parameter.
    ///
    /// # Panics
    ///
    /// When `i` is not below the number of values.
    pub fn point(&self, i: usize, base: &SimOptions) -> Result<Point, SweepError> {
        let v = &self.values[i];
        let bad = |expected: &'static str| SweepError::BadValue {
            value: v.clone(),
            expected,
        };
        let count = || v.parse::<u32>().ok().filter(|&n| n > 0);
        let mut p = Point {
            opts: base.clone(),
            rate: None,
        };
        let o = &mut p.opts;
        match self.param {
            SweepParam::Rate => {
                let f: f64 = v.parse().map_err(|_| bad("a rate scale"))?;
                if !(f.is_finite() && f > 0.0) {
                    return Err(bad("a positive rate scale"));
                }
                p.rate = Some(f);
            }
            SweepParam::KvGpuPages => {
                o.kv_gpu_pages = count().ok_or_else(|| bad("a page count"))?;
            }
            SweepParam::Adapters => {
                o.adapters.count = v.parse().map_err(|_| bad("an adapter count"))?;
            }
            SweepParam::MaxBatch => o.max_batch = count().ok_or_else(|| bad("a batch size"))?,
            SweepParam::Policy => {
                o.policy = CapacityPolicy::from_name(v)
                    .ok_or_else(|| bad("max_utilization or guaranteed_no_evict"))?;
            }
            SweepParam::Admission => {
                o.admission =
                    crate::admission(v, o.slo_ttft_ms).map_err(|_| bad("fcfs, vtc or deadline"))?;
            }
        }
        Ok(p)
    }

    /// Point `i` in words, for messages: the parameter's label and the value.
    pub fn point_label(&self, i: usize) -> String {
        format!("{} {}", self.label(), self.values[i])
    }

    fn label(&self) -> &'static str {
        match self.param {
            SweepParam::Rate => "arrival-rate scale",
            SweepParam::KvGpuPages => "KV GPU pages",
            SweepParam::Adapters => "adapters",
            SweepParam::MaxBatch => "max batch",
            SweepParam::Policy => "policy (0: max_utilization, 1: guaranteed_no_evict)",
            SweepParam::Admission => "admission (the values' order)",
        }
    }

    /// The x value of point `i` (the index for the policy).
    #[cfg(feature = "plot")]
    fn x(&self, i: usize) -> f64 {
        match self.param {
            SweepParam::Policy | SweepParam::Admission => i as f64,
            _ => self.values[i].parse().unwrap_or(i as f64),
        }
    }

    /// The Markdown table of the sweep.
    pub fn table(&self, reports: &[Report]) -> String {
        let goodput = reports.first().is_some_and(super::report::Report::has_slo);
        let fair = self.param == SweepParam::Admission;
        let (class_head, class_cells) = crate::classes::sweep_columns(reports);
        let mut s = format!(
            "| {} | throughput tok/s | TTFT p50 / p99 ms | TPOT p50 / p99 ms |{}{}{} suspensions | overloaded |\n|---|---|---|---|{}{}{}---|---|\n",
            self.label(),
            if goodput { " goodput req/s (SLO met) |" } else { "" },
            if fair { " adapter TTFT p99 best / worst ms | Jain's index |" } else { "" },
            class_head,
            if goodput { "---|" } else { "" },
            if fair { "---|---|" } else { "" },
            if class_head.is_empty() { "" } else { "---|---|" },
        );
        for ((v, r), classes) in self.values.iter().zip(reports).zip(&class_cells) {
            let _ = write!(
                s,
                "| {v} | {:.0} | {:.1} / {:.1} | {:.2} / {:.2} |",
                r.throughput_tok_s, r.ttft_ms.p50, r.ttft_ms.p99, r.tpot_ms.p50, r.tpot_ms.p99
            );
            if goodput {
                let _ = write!(
                    s,
                    " {:.2} ({:.1} %) |",
                    r.goodput_rps,
                    100.0 * r.slo_attainment
                );
            }
            if fair {
                let p99 = r.per_adapter.iter().map(|a| a.ttft_ms.p99);
                let best = p99.clone().fold(f64::INFINITY, f64::min);
                let worst = p99.fold(0.0, f64::max);
                let _ = write!(s, " {best:.1} / {worst:.1} | {:.3} |", r.jain_fairness);
            }
            s.push_str(classes);
            let _ = writeln!(
                s,
                " {} | {} |",
                r.suspended,
                if r.overloaded { "yes" } else { "no" }
            );
        }
        let _ = writeln!(s, "\n{}", super::report::overloaded_means());
        s
    }

    /// The throughput–latency curve: throughput, TTFT and TPOT (and goodput; and per class with
    /// `--priority-mix`) against the parameter.
    #[cfg(feature = "plot")]
    pub fn plot(&self, reports: &[Report], source: &str) -> Timeline {
        let x: Vec<f64> = (0..reports.len()).map(|i| self.x(i)).collect();
        let col = |f: &dyn Fn(&Report) -> f64| reports.iter().map(f).collect::<Vec<f64>>();
        let mut tl = Timeline::new(format!("kvsched simulate --sweep: {}", self.label()), x)
            .subtitle(source.to_string())
            .x_label(self.label())
            .panel(
                Panel::new("throughput", "tok/s")
                    .series("generated tokens", col(&|r| r.throughput_tok_s)),
            )
            .panel(
                Panel::new("time to first token", "ms")
                    .series("p50", col(&|r| r.ttft_ms.p50))
                    .series("p99", col(&|r| r.ttft_ms.p99)),
            )
            .panel(
                Panel::new("time per output token", "ms")
                    .series("p50", col(&|r| r.tpot_ms.p50))
                    .series("p99", col(&|r| r.tpot_ms.p99)),
            );
        if reports.first().is_some_and(super::report::Report::has_slo) {
            tl =
                tl.panel(Panel::new("goodput", "req/s").series("SLO met", col(&|r| r.goodput_rps)));
        }
        for panel in crate::classes::sweep_panels(reports) {
            tl = tl.panel(panel);
        }
        tl
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sweeps_parse_and_refuse() {
        let s = Sweep::parse("rate=0.5,1,2").unwrap();
        assert_eq!(s.param, SweepParam::Rate);
        let base = SimOptions::default();
        let p = s.point(2, &base).unwrap();
        assert_eq!(
            (p.rate, p.opts),
            (Some(2.0), base.clone()),
            "twice the rate"
        );
        let p = Sweep::parse("policy=max_utilization,guaranteed_no_evict").unwrap();
        assert_eq!(p.point(1, &base).unwrap().rate, None);
        #[cfg(feature = "plot")]
        assert_eq!(p.x(1), 1.0);
        for (bad, says) in [
            ("rate", "PARAM=V1"),
            ("speed=1,2", "unknown parameter"),
            ("rate=1", "at least two"),
            ("rate=2,1", "ascend"),
            ("rate=0,1", "positive rate"),
            ("kv-gpu-pages=0,10", "page count"),
            ("policy=fcfs,max_utilization", "max_utilization or"),
        ] {
            let e = Sweep::parse(bad).unwrap_err().to_string();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }
}
