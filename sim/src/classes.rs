//! Two priority classes (`--priority-mix SHARE`, issue 45): a share of the requests is of high
//! priority (0), the rest low (1), each request's class drawn from its arrival index alone, so a
//! first-come-first-served run and a priority run of one workload serve the same classes. Per class:
//! TTFT and TPOT quantiles and goodput (both objectives met, per simulated second).

use crate::report::Quantiles;

/// Whether arrival `i` is of the high class, for a high share `share` (0 to 1): a fixed hash of the
/// index against the share.
pub fn is_high(i: usize, share: f64) -> bool {
    let h = (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40;
    (h as f64) < share * (1u64 << 24) as f64
}

/// One class's figures.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct ClassSummary {
    /// Requests of the class that finished.
    pub completed: u64,
    /// Time to first token, ms.
    pub ttft_ms: Quantiles,
    /// Time per output token, ms.
    pub tpot_ms: Quantiles,
    /// Requests of the class that met both objectives, per simulated second.
    pub goodput_rps: f64,
}

/// What a run collects per class (index 0: high, 1: low).
#[derive(Debug, Default)]
pub(crate) struct Classes {
    ttft: [Vec<f64>; 2],
    tpot: [Vec<f64>; 2],
    met: [u64; 2],
    completed: [u64; 2],
}

impl Classes {
    /// A request of `class` had its first token after `ttft` ms.
    pub(crate) fn first_token(&mut self, class: usize, ttft: f64) {
        self.ttft[class].push(ttft);
    }

    /// A request of `class` finished: its TPOT (`None`: one token), whether it met the objectives.
    pub(crate) fn finished(&mut self, class: usize, tpot: Option<f64>, met: bool) {
        self.completed[class] += 1;
        self.met[class] += u64::from(met);
        self.tpot[class].extend(tpot);
    }

    /// The two classes' figures over `seconds` of simulated time.
    pub(crate) fn finish(mut self, seconds: f64) -> [ClassSummary; 2] {
        core::array::from_fn(|c| {
            self.ttft[c].sort_by(f64::total_cmp);
            self.tpot[c].sort_by(f64::total_cmp);
            ClassSummary {
                completed: self.completed[c],
                ttft_ms: Quantiles::of(&self.ttft[c]),
                tpot_ms: Quantiles::of(&self.tpot[c]),
                goodput_rps: if seconds > 0.0 {
                    self.met[c] as f64 / seconds
                } else {
                    0.0
                },
            }
        })
    }
}

/// The report's rows for the two classes: (label, value).
pub fn rows(classes: &[ClassSummary; 2]) -> Vec<(String, String)> {
    ["high", "low"]
        .iter()
        .zip(classes)
        .map(|(name, c)| {
            let value = format!(
                "{} done; TTFT p50 / p99 {:.1} / {:.1} ms; TPOT p99 {:.2} ms; goodput {:.2} req/s",
                c.completed, c.ttft_ms.p50, c.ttft_ms.p99, c.tpot_ms.p99, c.goodput_rps
            );
            (format!("class {name} priority"), value)
        })
        .collect()
}

/// The two classes' figures of each report of a sweep (`None` without `--priority-mix`).
fn per_class(reports: &[crate::Report]) -> Option<Vec<[ClassSummary; 2]>> {
    reports.iter().map(|r| r.per_class).collect()
}

/// A sweep's table columns per class: the header cells, and each report's cells (TTFT p99 and
/// goodput, high / low). Empty without classes.
pub fn sweep_columns(reports: &[crate::Report]) -> (String, Vec<String>) {
    let Some(all) = per_class(reports) else {
        return (String::new(), vec![String::new(); reports.len()]);
    };
    let head = " high / low TTFT p99 ms | high / low goodput req/s |".to_string();
    let cells = all
        .iter()
        .map(|[h, l]| {
            format!(
                " {:.1} / {:.1} | {:.2} / {:.2} |",
                h.ttft_ms.p99, l.ttft_ms.p99, h.goodput_rps, l.goodput_rps
            )
        })
        .collect();
    (head, cells)
}

/// A sweep plot's panels per class: TTFT p99, TPOT p99 and goodput, high and low. None without
/// classes.
#[cfg(feature = "plot")]
pub fn sweep_panels(reports: &[crate::Report]) -> Vec<crate::plot::Panel> {
    use crate::plot::Panel;
    let Some(all) = per_class(reports) else {
        return Vec::new();
    };
    let col = |c: usize, f: &dyn Fn(&ClassSummary) -> f64| all.iter().map(|r| f(&r[c])).collect();
    let panel = |title: &str, unit: &str, f: &dyn Fn(&ClassSummary) -> f64| {
        Panel::new(title, unit)
            .series("high class", col(0, f))
            .series("low class", col(1, f))
    };
    vec![
        panel("TTFT p99 by class", "ms", &|c| c.ttft_ms.p99),
        panel("TPOT p99 by class", "ms", &|c| c.tpot_ms.p99),
        panel("goodput by class", "req/s", &|c| c.goodput_rps),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_high_share_is_close_to_the_share_asked() {
        let high = (0..10_000).filter(|&i| is_high(i, 0.2)).count();
        assert!((1_850..=2_150).contains(&high), "{high}");
        assert_eq!((0..1_000).filter(|&i| is_high(i, 0.0)).count(), 0);
        assert_eq!((0..1_000).filter(|&i| is_high(i, 1.0)).count(), 1_000);
    }
}
