//! Fitting a cost model to measured steps (`kvsched cost --fit`): the five terms a forward step's
//! time is linear in (floor, prefill token, decode request, cached token, attention pair), by least
//! squares on relative error, each term kept at zero or above.
//!
//! Each measured step gives one row: its work ([`MeasuredStep::work`]) divided by its measured time,
//! against a target of one, so that a 2 ms decode weighs as much as a 400 ms prefill. A term whose
//! least-squares value is negative (the points cannot tell it apart from the others, or it is not
//! there) is held at zero and the others refitted, as an active-set method does. Eager decode steps
//! ([`MeasuredKind::Decode`]) are reported, not fitted (serving engines replay decode from graphs);
//! a mixed step's masked-kernel extra ([`MeasuredStep::masked_us`]) is taken off its time first.
//! The terms a step measurement cannot see (adapter page loads, KV page copies) are the `base`
//! model's.

use crate::cost::{CostModel, MeasuredKind, MeasuredStep};

/// The fitted terms, in [`CostModel`] order: floor, prefill token, decode request, cached token,
/// attention pair.
const TERMS: usize = 5;

/// Why a fit could not be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FitFailure {
    /// Fewer usable points than terms.
    #[error("{points} fittable points for {TERMS} terms (eager decode steps are not fitted)")]
    TooFewPoints {
        /// The points that could be fitted.
        points: usize,
    },
    /// A point's measured time is not a positive, finite number of milliseconds.
    #[error("point {index}: a measured time of {ms} ms")]
    BadTime {
        /// The point's index in the list given.
        index: usize,
        /// Its `ms_median`, formatted.
        ms: String,
    },
}

/// The cost model that fits `points` best, with `base`'s adapter-load and page-copy terms.
///
/// # Errors
///
/// [`FitFailure`]: too few fittable points, or a point whose time is not positive and finite.
pub fn fit(points: &[MeasuredStep], base: &CostModel) -> Result<CostModel, FitFailure> {
    let mut rows = Vec::with_capacity(points.len());
    for (index, p) in points.iter().enumerate() {
        if !(p.ms_median.is_finite() && p.ms_median > 0.0) {
            let ms = p.ms_median.to_string();
            return Err(FitFailure::BadTime { index, ms });
        }
        if p.kind == MeasuredKind::Decode {
            continue;
        }
        let us = p.ms_median * 1000.0 - p.masked_us();
        let x = features(p);
        rows.push((x, us));
    }
    if rows.len() < TERMS {
        let points = rows.len();
        return Err(FitFailure::TooFewPoints { points });
    }
    let w = nonnegative_least_squares(&rows);
    Ok(CostModel {
        step_us: w[0],
        prefill_us_per_token: w[1],
        decode_us_per_request: w[2],
        decode_us_per_cached_token: w[3],
        attention_us_per_pair: w[4],
        ..*base
    })
}

/// A step's work in the fitted terms' order.
fn features(p: &MeasuredStep) -> [f64; TERMS] {
    let w = p.work();
    [
        1.0,
        (w.prefill_tokens + w.verified_tokens) as f64,
        w.decode_requests as f64,
        w.decode_cached_tokens as f64,
        w.attention_pairs,
    ]
}

/// Minimizes Σ ((x·w − y) / y)² over w ≥ 0: least squares on the free terms, and the most negative
/// one held at zero until none is.
fn nonnegative_least_squares(rows: &[([f64; TERMS], f64)]) -> [f64; TERMS] {
    let mut free = [true; TERMS];
    loop {
        let w = least_squares(rows, &free);
        let worst = (0..TERMS)
            .filter(|&i| free[i] && w[i] < 0.0)
            .min_by(|&a, &b| w[a].total_cmp(&w[b]));
        match worst {
            Some(i) => free[i] = false,
            None => return w,
        }
    }
}

/// Least squares on relative error over the `free` terms (the others are zero): the normal
/// equations, solved by Gauss-Jordan elimination with partial pivoting. A term the points cannot
/// determine (a zero pivot) stays zero.
fn least_squares(rows: &[([f64; TERMS], f64)], free: &[bool; TERMS]) -> [f64; TERMS] {
    let idx: Vec<usize> = (0..TERMS).filter(|&i| free[i]).collect();
    let n = idx.len();
    let mut m = vec![vec![0.0; n + 1]; n];
    for (x, y) in rows {
        let scaled: Vec<f64> = idx.iter().map(|&i| x[i] / y).collect();
        for (r, &a) in scaled.iter().enumerate() {
            for (c, &b) in scaled.iter().enumerate() {
                m[r][c] += a * b;
            }
            m[r][n] += a;
        }
    }
    for col in 0..n {
        let pivot = (col..n)
            .max_by(|&a, &b| m[a][col].abs().total_cmp(&m[b][col].abs()))
            .unwrap_or(col);
        m.swap(col, pivot);
        if m[col][col].abs() < 1e-300 {
            continue;
        }
        let pivot_row = m[col].clone();
        for (_, row) in m.iter_mut().enumerate().filter(|(r, _)| *r != col) {
            let f = row[col] / pivot_row[col];
            for (x, p) in row[col..].iter_mut().zip(&pivot_row[col..]) {
                *x -= f * p;
            }
        }
    }
    let mut w = [0.0; TERMS];
    for (r, &i) in idx.iter().enumerate() {
        if m[r][r].abs() >= 1e-300 {
            w[i] = m[r][n] / m[r][r];
        }
    }
    w
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cost::FitError;

    fn point(
        kind: MeasuredKind,
        batch: u64,
        context: u64,
        tokens: u64,
        prior: u64,
    ) -> MeasuredStep {
        MeasuredStep {
            kind,
            batch,
            context,
            tokens,
            chunk_prior_context: prior,
            ms_median: 0.0,
        }
    }

    /// Steps of every shape, timed by `m` (exactly).
    fn timed_by(m: &CostModel) -> Vec<MeasuredStep> {
        let mut pts = Vec::new();
        for t in [16, 64, 256] {
            pts.push(point(MeasuredKind::Prefill, 0, 0, t, 0));
        }
        for (b, c) in [(1, 32), (4, 128), (8, 512), (2, 1024)] {
            pts.push(point(MeasuredKind::DecodeGraph, b, c, 0, 0));
        }
        pts.push(point(MeasuredKind::Step, 4, 128, 32, 64));
        for p in &mut pts {
            p.ms_median = p.predicted_ms(m);
        }
        pts
    }

    #[test]
    fn a_fit_recovers_the_terms_that_timed_the_points() {
        let truth = CostModel {
            step_us: 900.0,
            prefill_us_per_token: 3.0,
            decode_us_per_request: 40.0,
            decode_us_per_cached_token: 0.5,
            attention_us_per_pair: 0.01,
            ..CostModel::LEGACY
        };
        let got = fit(&timed_by(&truth), &CostModel::LEGACY).unwrap();
        let close = |a: f64, b: f64| (a - b).abs() <= 1e-6 * b.abs().max(1.0);
        assert!(close(got.step_us, truth.step_us), "{got:?}");
        assert!(close(got.prefill_us_per_token, 3.0), "{got:?}");
        assert!(close(got.decode_us_per_request, 40.0), "{got:?}");
        assert!(close(got.decode_us_per_cached_token, 0.5), "{got:?}");
        assert!(close(got.attention_us_per_pair, 0.01), "{got:?}");
        assert_eq!(got.page_copy_us, CostModel::LEGACY.page_copy_us);
    }

    #[test]
    fn a_term_the_points_contradict_is_held_at_zero() {
        // Timed with no per-request decode cost, and a little noise pushing that term negative.
        let truth = CostModel {
            decode_us_per_request: 0.0,
            ..CostModel::h200_llama3_8b(32)
        };
        let mut pts = timed_by(&truth);
        for (i, p) in pts.iter_mut().enumerate() {
            p.ms_median *= if i % 2 == 0 { 1.01 } else { 0.99 };
        }
        let got = fit(&pts, &truth).unwrap();
        for term in [
            got.step_us,
            got.prefill_us_per_token,
            got.decode_us_per_cached_token,
        ] {
            assert!(term >= 0.0, "{got:?}");
        }
        // Unconstrained, the per-request term comes out negative (about −12 µs) on these points.
        assert_eq!(got.decode_us_per_request, 0.0, "{got:?}");
        assert!(FitError::of(&got, &pts).max() < 0.05, "{got:?}");
    }

    #[test]
    fn too_few_points_or_a_bad_time_are_refused() {
        let pts = timed_by(&CostModel::LEGACY);
        assert_eq!(
            fit(&pts[..3], &CostModel::LEGACY),
            Err(FitFailure::TooFewPoints { points: 3 })
        );
        let mut bad = pts.clone();
        bad[2].ms_median = f64::NAN;
        assert!(matches!(
            fit(&bad, &CostModel::LEGACY),
            Err(FitFailure::BadTime { index: 2, .. })
        ));
    }

    #[test]
    fn the_h200_points_fit_as_the_preset_does() {
        let text = [
            include_str!("../../data/measurements/h200/llama3-8b-decode-graphs.jsonl"),
            include_str!("../../data/measurements/h200/llama3-8b-steps.jsonl"),
            include_str!("../../data/measurements/h200/llama3-8b-mixed-steps.jsonl"),
        ];
        let mut pts = Vec::new();
        for t in text {
            pts.extend(crate::cost::read_points(t, "h200").unwrap());
        }
        let preset = CostModel::h200_llama3_8b(32);
        let got = fit(&pts, &preset).unwrap();
        let fitted: Vec<_> = pts
            .iter()
            .filter(|p| p.kind != MeasuredKind::Decode)
            .copied()
            .collect();
        let (ours, theirs) = (FitError::of(&got, &fitted), FitError::of(&preset, &fitted));
        assert!(ours.median() <= theirs.median() * 1.05 + 1e-3, "{got:?}");
        let near = |a: f64, b: f64| (a - b).abs() / b < 0.05;
        assert!(near(got.step_us, preset.step_us), "{got:?}");
        assert!(
            near(got.prefill_us_per_token, preset.prefill_us_per_token),
            "{got:?}"
        );
        assert!(
            near(got.decode_us_per_request, preset.decode_us_per_request),
            "{got:?}"
        );
        assert!(
            near(
                got.decode_us_per_cached_token,
                preset.decode_us_per_cached_token
            ),
            "{got:?}"
        );
    }
}
