//! `kvsched simulate --sweep PARAM=V1,V2,…`: the same run over a range of one parameter, with the
//! throughput–latency table and curve that capacity planning needs.

use std::fmt::Write as _;

use kvsched_core::config::CapacityPolicy;

use super::cli::{workload, Cli};
use super::{run, Report};
use crate::plot::{Panel, Timeline};

/// The parameter a sweep varies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SweepParam {
    /// Arrival-rate scale: 2 = arrivals twice as dense (`--time-scale 0.5`).
    Rate,
    /// `--kv-gpu-pages`.
    KvGpuPages,
    /// `--adapters`.
    Adapters,
    /// `--max-batch`.
    MaxBatch,
    /// `--policy` (values `max_utilization`, `guaranteed_no_evict`).
    Policy,
    /// `--admission` (values `fcfs`, `vtc`, `deadline`).
    Admission,
}

/// A parsed `--sweep`.
#[derive(Debug, Clone, PartialEq)]
pub struct Sweep {
    /// What varies.
    pub param: SweepParam,
    /// Its values, as given.
    pub values: Vec<String>,
}

impl Sweep {
    /// Parses `PARAM=V1,V2,…`: a known parameter, at least two values, each valid for it, numeric
    /// values ascending.
    pub fn parse(spec: &str) -> Result<Self, String> {
        let (name, list) = spec
            .split_once('=')
            .ok_or(format!("--sweep: expected PARAM=V1,V2,…, got {spec:?}"))?;
        let param = match name {
            "rate" => SweepParam::Rate,
            "kv-gpu-pages" => SweepParam::KvGpuPages,
            "adapters" => SweepParam::Adapters,
            "max-batch" => SweepParam::MaxBatch,
            "policy" => SweepParam::Policy,
            "admission" => SweepParam::Admission,
            other => {
                return Err(format!(
                    "--sweep: unknown parameter {other:?} (rate, kv-gpu-pages, adapters, max-batch, policy, admission)"
                ))
            }
        };
        let values: Vec<String> = list.split(',').map(str::to_string).collect();
        if values.len() < 2 {
            return Err("--sweep: give at least two values".into());
        }
        let sweep = Self { param, values };
        let mut last = f64::NEG_INFINITY;
        for (i, v) in sweep.values.iter().enumerate() {
            let mut probe = Cli::default();
            sweep.apply(&mut probe, i)?;
            if !matches!(param, SweepParam::Policy | SweepParam::Admission) {
                let x: f64 = v.parse().unwrap_or(f64::NAN);
                if x <= last {
                    return Err("--sweep: numeric values must ascend".into());
                }
                last = x;
            }
        }
        Ok(sweep)
    }

    /// Sets value `i` on a run's command line.
    fn apply(&self, c: &mut Cli, i: usize) -> Result<(), String> {
        let v = &self.values[i];
        let bad = |what: &str| format!("--sweep: {v:?} is not {what}");
        let count = || v.parse::<u32>().ok().filter(|&n| n > 0);
        match self.param {
            SweepParam::Rate => {
                let f: f64 = v.parse().map_err(|_| bad("a rate scale"))?;
                if !(f.is_finite() && f > 0.0) {
                    return Err(bad("a positive rate scale"));
                }
                c.time_scale = Some(c.time_scale.unwrap_or(1.0) / f);
            }
            SweepParam::KvGpuPages => {
                c.opts.kv_gpu_pages = count().ok_or_else(|| bad("a page count"))?;
            }
            SweepParam::Adapters => {
                c.opts.adapters.count = v.parse().map_err(|_| bad("an adapter count"))?;
            }
            SweepParam::MaxBatch => {
                c.opts.max_batch = count().ok_or_else(|| bad("a batch size"))?;
            }
            SweepParam::Policy => {
                c.opts.policy = CapacityPolicy::from_name(v)
                    .ok_or_else(|| bad("max_utilization or guaranteed_no_evict"))?;
            }
            SweepParam::Admission => {
                c.opts.admission = super::admission(v, c.opts.slo_ttft_ms)
                    .map_err(|_| bad("fcfs, vtc or deadline"))?;
            }
        }
        Ok(())
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
    fn x(&self, i: usize) -> f64 {
        match self.param {
            SweepParam::Policy | SweepParam::Admission => i as f64,
            _ => self.values[i].parse().unwrap_or(i as f64),
        }
    }

    /// Runs every point of the sweep on `base`'s workload and options.
    pub fn run(&self, base: &Cli) -> Result<Vec<Report>, String> {
        let mut reports = Vec::with_capacity(self.values.len());
        for i in 0..self.values.len() {
            let mut c = base.clone();
            self.apply(&mut c, i)?;
            c.opts.progress = false;
            let w = workload(&c)?;
            let r = run(&c.opts, w).map_err(|e| format!("{}: {e}", self.point(i)))?;
            reports.push(r);
        }
        Ok(reports)
    }

    fn point(&self, i: usize) -> String {
        format!("{} {}", self.label(), self.values[i])
    }

    /// The Markdown table of the sweep.
    pub fn table(&self, reports: &[Report]) -> String {
        let goodput = reports.first().is_some_and(|r| r.has_slo());
        let fair = self.param == SweepParam::Admission;
        let mut s = format!(
            "| {} | throughput tok/s | TTFT p50 / p99 ms | TPOT p50 / p99 ms |{}{} suspensions | overloaded |\n|---|---|---|---|{}{}---|---|\n",
            self.label(),
            if goodput { " goodput req/s (SLO met) |" } else { "" },
            if fair { " adapter TTFT p99 best / worst ms | Jain's index |" } else { "" },
            if goodput { "---|" } else { "" },
            if fair { "---|---|" } else { "" },
        );
        for (v, r) in self.values.iter().zip(reports) {
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
            let _ = writeln!(
                s,
                " {} | {} |",
                r.suspended,
                if r.overloaded { "yes" } else { "no" }
            );
        }
        s
    }

    /// The throughput–latency curve: throughput, TTFT and TPOT (and goodput) against the parameter.
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
        if reports.first().is_some_and(|r| r.has_slo()) {
            tl =
                tl.panel(Panel::new("goodput", "req/s").series("SLO met", col(&|r| r.goodput_rps)));
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
        let mut c = Cli::default();
        s.apply(&mut c, 2).unwrap();
        assert_eq!(c.time_scale, Some(0.5), "twice the rate: half the time");
        let p = Sweep::parse("policy=max_utilization,guaranteed_no_evict").unwrap();
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
            let e = Sweep::parse(bad).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }
}
