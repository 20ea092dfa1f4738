//! LoRA adapter popularity: which adapter each request uses, and how large each adapter is.
//!
//! No public multi-LoRA request trace exists, so adapters are drawn from the laws used by published
//! systems (see `traces/README.md` of the project's shared docs):
//!
//! | law (as parsed)  | P(adapter = k), k in `0..n`                | origin |
//! |------------------|--------------------------------------------|--------|
//! | `uniform`        | `1/n`                                      | — |
//! | `power:ALPHA`    | `((k+1)/n)^α − (k/n)^α`, i.e. `floor(n·X)` with `X = U^(1/α)` | S-LoRA `benchmarks/trace.py` (`numpy.random.power`); α ∈ {0.1, 0.3, 0.6, 0.8, 1, 2, 4, 6, 8}; α = 1 is uniform, α < 1 favours low ids |
//! | `zipf:S`         | `(k+1)^−s / Σ_j (j+1)^−s`                  | Zipf's law over ranks; s = 0 is uniform |
//!
//! Ranks come from a list assigned round-robin by adapter id (S-LoRA's S1–S4 settings, e.g.
//! `64,32,16,8`), and an adapter's size in cache pages follows [`pages_for_rank`].

use std::fmt;
use std::str::FromStr;

use rand::{Rng as _, SeedableRng};

use super::{Arrival, Rng};

/// The most adapters an [`AdapterSampler`] accepts (published setups use at most 2000).
pub const MAX_ADAPTERS: u32 = 1 << 20;

/// A named adapter popularity law; see the [module docs](self) for the formulas.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum PopularityLaw {
    /// Every adapter equally likely.
    Uniform,
    /// S-LoRA's power law: `P(id <= k) = ((k+1)/n)^alpha`.
    Power {
        /// Exponent (finite, > 0); 1 is uniform, smaller values skew toward low ids.
        alpha: f64,
    },
    /// Zipf's law: `P(k) ∝ 1/(k+1)^s`.
    Zipf {
        /// Exponent (finite, ≥ 0); 0 is uniform.
        s: f64,
    },
}

impl fmt::Display for PopularityLaw {
    /// Prints the form [`FromStr`] parses: `uniform`, `power:ALPHA`, `zipf:S`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Uniform => f.write_str("uniform"),
            Self::Power { alpha } => write!(f, "power:{alpha}"),
            Self::Zipf { s } => write!(f, "zipf:{s}"),
        }
    }
}

impl FromStr for PopularityLaw {
    type Err = PopularityError;

    /// Parses `uniform`, `power:ALPHA` (ALPHA finite and > 0) or `zipf:S` (S finite and ≥ 0).
    /// The law name is case-insensitive; spaces around the parts are ignored.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (name, param) = match s.split_once(':') {
            Some((n, p)) => (n.trim(), Some(p.trim())),
            None => (s.trim(), None),
        };
        let number = |law: &'static str, ok: fn(f64) -> bool| -> Result<f64, PopularityError> {
            let p = param.ok_or(PopularityError::MissingParameter { law })?;
            match p.parse::<f64>() {
                Ok(v) if v.is_finite() && ok(v) => Ok(v),
                _ => Err(PopularityError::BadParameter {
                    law,
                    value: p.to_owned(),
                }),
            }
        };
        match name.to_ascii_lowercase().as_str() {
            "uniform" => match param {
                None => Ok(Self::Uniform),
                Some(_) => Err(PopularityError::UnexpectedParameter { law: "uniform" }),
            },
            "power" => Ok(Self::Power {
                alpha: number("power", |a| a > 0.0)?,
            }),
            "zipf" => Ok(Self::Zipf {
                s: number("zipf", |s| s >= 0.0)?,
            }),
            _ => Err(PopularityError::UnknownLaw(s.to_owned())),
        }
    }
}

/// Why a popularity law, adapter count or rank list was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PopularityError {
    /// The law name is not `uniform`, `power` or `zipf` (the whole input is kept).
    #[error("unknown popularity law {0:?} (expected uniform, power:ALPHA or zipf:S)")]
    UnknownLaw(String),
    /// `power` and `zipf` need a parameter (`power:0.8`).
    #[error("popularity law {law} needs a parameter, e.g. {law}:1.0")]
    MissingParameter {
        /// The law.
        law: &'static str,
    },
    /// `uniform` takes no parameter.
    #[error("popularity law {law} takes no parameter")]
    UnexpectedParameter {
        /// The law.
        law: &'static str,
    },
    /// The parameter is not a number in the law's range.
    #[error("{law} law exponent must be a finite number {} 0, got {value:?}", if *law == "power" { ">" } else { ">=" })]
    BadParameter {
        /// The law.
        law: &'static str,
        /// The parameter as written.
        value: String,
    },
    /// The adapter count is 0 or above [`MAX_ADAPTERS`].
    #[error("adapter count must be in 1..={MAX_ADAPTERS}, got {0}")]
    AdapterCount(u32),
    /// The rank list is empty.
    #[error("rank list is empty (expected e.g. 8,16,32,64)")]
    NoRanks,
    /// A rank is not an integer ≥ 1 (the item as written).
    #[error("rank must be an integer >= 1, got {0:?}")]
    BadRank(String),
}

/// Draws adapter ids in `0..n` from a [`PopularityLaw`].
#[derive(Debug, Clone, PartialEq)]
pub struct AdapterSampler {
    law: PopularityLaw,
    n: u32,
    /// Zipf only: `cdf[k] = P(id <= k)`, with `cdf[n-1] = 1` exactly.
    cdf: Vec<f64>,
}

impl AdapterSampler {
    /// A sampler over `n` adapters.
    ///
    /// # Errors
    ///
    /// [`PopularityError::AdapterCount`] when `n` is 0 or above [`MAX_ADAPTERS`], and
    /// [`PopularityError::BadParameter`] for an exponent out of range (a law built directly rather
    /// than parsed).
    pub fn new(law: PopularityLaw, n: u32) -> Result<Self, PopularityError> {
        if n == 0 || n > MAX_ADAPTERS {
            return Err(PopularityError::AdapterCount(n));
        }
        let cdf = match law {
            PopularityLaw::Uniform => Vec::new(),
            PopularityLaw::Power { alpha } => {
                if !(alpha.is_finite() && alpha > 0.0) {
                    return Err(PopularityError::BadParameter {
                        law: "power",
                        value: alpha.to_string(),
                    });
                }
                Vec::new()
            }
            PopularityLaw::Zipf { s } => {
                if !(s.is_finite() && s >= 0.0) {
                    return Err(PopularityError::BadParameter {
                        law: "zipf",
                        value: s.to_string(),
                    });
                }
                let mut acc = 0.0;
                let mut cdf: Vec<f64> = (1..=n)
                    .map(|k| {
                        acc += f64::from(k).powf(-s);
                        acc
                    })
                    .collect();
                let total = acc;
                for c in &mut cdf {
                    *c /= total;
                }
                // Guard the inverse-CDF search against rounding: the last entry is exactly 1.
                if let Some(last) = cdf.last_mut() {
                    *last = 1.0;
                }
                cdf
            }
        };
        Ok(Self { law, n, cdf })
    }

    /// The law.
    #[must_use]
    pub const fn law(&self) -> PopularityLaw {
        self.law
    }

    /// The number of adapters.
    #[must_use]
    pub const fn adapters(&self) -> u32 {
        self.n
    }

    /// `P(id <= k)`; 1 for `k >= n - 1`.
    #[must_use]
    pub fn cdf(&self, k: u32) -> f64 {
        if k >= self.n - 1 {
            return 1.0;
        }
        let frac = f64::from(k + 1) / f64::from(self.n);
        match self.law {
            PopularityLaw::Uniform => frac,
            PopularityLaw::Power { alpha } => frac.powf(alpha),
            PopularityLaw::Zipf { .. } => self.cdf[k as usize],
        }
    }

    /// `P(id = k)`; 0 for `k >= n`.
    #[must_use]
    pub fn pmf(&self, k: u32) -> f64 {
        if k >= self.n {
            return 0.0;
        }
        let below = if k == 0 { 0.0 } else { self.cdf(k - 1) };
        self.cdf(k) - below
    }

    /// Draws one adapter id in `0..n`.
    pub fn sample(&self, rng: &mut Rng) -> u32 {
        let last = self.n - 1;
        match self.law {
            PopularityLaw::Uniform => rng.gen_range(0..self.n),
            PopularityLaw::Power { alpha } => {
                // floor(n · U^(1/α)); U < 1 so X < 1 mathematically, but X may round up to 1.0.
                let x = rng.gen::<f64>().powf(1.0 / alpha);
                ((f64::from(self.n) * x) as u32).min(last)
            }
            PopularityLaw::Zipf { .. } => {
                // Inverse CDF: the first k with cdf[k] > u; cdf[last] = 1 > u, so k is in 0..n.
                let u = rng.gen::<f64>();
                (self.cdf.partition_point(|&c| c <= u) as u32).min(last)
            }
        }
    }
}

/// Gives every arrival an adapter drawn from `sampler`, in arrival order, from a generator seeded
/// with `seed` (the same inputs give the same assignment).
pub fn assign_adapters(arrivals: &mut [Arrival], sampler: &AdapterSampler, seed: u64) {
    let mut rng = Rng::seed_from_u64(seed);
    for a in arrivals {
        a.adapter = Some(sampler.sample(&mut rng));
    }
}

/// LoRA ranks assigned round-robin by adapter id: adapter `k` has rank `ranks[k % ranks.len()]`
/// (S-LoRA's setting). Parsed from a comma-separated list such as `8,16,32,64`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdapterRanks(Vec<u32>);

impl AdapterRanks {
    /// A rank list.
    ///
    /// # Errors
    ///
    /// [`PopularityError::NoRanks`] for an empty list, [`PopularityError::BadRank`] for a rank of 0.
    pub fn new(ranks: Vec<u32>) -> Result<Self, PopularityError> {
        if ranks.is_empty() {
            return Err(PopularityError::NoRanks);
        }
        if ranks.contains(&0) {
            return Err(PopularityError::BadRank("0".to_owned()));
        }
        Ok(Self(ranks))
    }

    /// The rank of adapter `adapter`.
    #[must_use]
    pub fn rank_of(&self, adapter: u32) -> u32 {
        // `new` guarantees a non-empty list.
        self.0[adapter as usize % self.0.len()]
    }

    /// The list, in assignment order.
    #[must_use]
    pub fn as_slice(&self) -> &[u32] {
        &self.0
    }

    /// The largest rank in the list.
    #[must_use]
    pub fn max_rank(&self) -> u32 {
        self.0.iter().copied().max().unwrap_or(0)
    }
}

impl FromStr for AdapterRanks {
    type Err = PopularityError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.trim().is_empty() {
            return Err(PopularityError::NoRanks);
        }
        let ranks = s
            .split(',')
            .map(|item| match item.trim().parse::<u32>() {
                Ok(r) if r >= 1 => Ok(r),
                _ => Err(PopularityError::BadRank(item.trim().to_owned())),
            })
            .collect::<Result<Vec<u32>, _>>()?;
        Self::new(ranks)
    }
}

impl fmt::Display for AdapterRanks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, r) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{r}")?;
        }
        Ok(())
    }
}

/// Cache pages for an adapter of LoRA rank `rank`, when a rank-8 adapter takes `pages_per_rank8`.
///
/// Rule: pages grow linearly with rank and round up, `ceil(rank · pages_per_rank8 / 8)`.
/// A rank-r adapter stores, for every adapted layer and module, an `r × d_in` matrix A and a
/// `d_out × r` matrix B: `r · (d_in + d_out)` weights, linear in r. The reference PEFT cache
/// (TensorRT-LLM `PeftCacheManager`) packs those rank rows into fixed-size pages, so its page count
/// is linear in r up to rounding. Rank 8 is the reference point because it is the smallest rank in
/// S-LoRA's lists (S1 = `[8]`); rank 16 takes twice as many pages, rank 64 eight times, and a rank
/// that is not a multiple of 8 rounds up. Any rank ≥ 1 with `pages_per_rank8 ≥ 1` needs at least one
/// page; rank 0 (no adapter) needs none. Computed in `u64`, so it cannot overflow.
#[must_use]
pub const fn pages_for_rank(rank: u32, pages_per_rank8: u32) -> u64 {
    (rank as u64 * pages_per_rank8 as u64).div_ceil(8)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Draws `samples` ids and counts them per adapter.
    fn histogram(sampler: &AdapterSampler, samples: usize, seed: u64) -> Vec<u64> {
        let mut rng = Rng::seed_from_u64(seed);
        let mut counts = vec![0u64; sampler.adapters() as usize];
        for _ in 0..samples {
            counts[sampler.sample(&mut rng) as usize] += 1;
        }
        counts
    }

    /// Kolmogorov–Smirnov statistic sup_k |F_emp(k) − F(k)| over the support.
    fn ks_statistic(sampler: &AdapterSampler, counts: &[u64]) -> f64 {
        let total = counts.iter().sum::<u64>() as f64;
        let mut acc = 0u64;
        let mut d = 0.0f64;
        for (k, &c) in counts.iter().enumerate() {
            acc += c;
            d = d.max((acc as f64 / total - sampler.cdf(k as u32)).abs());
        }
        d
    }

    /// Pearson's chi-square statistic of the counts against the sampler's pmf.
    fn chi_square(sampler: &AdapterSampler, counts: &[u64]) -> f64 {
        let total = counts.iter().sum::<u64>() as f64;
        counts
            .iter()
            .enumerate()
            .map(|(k, &c)| {
                let expected = total * sampler.pmf(k as u32);
                assert!(
                    expected >= 5.0,
                    "bin {k} too small for chi-square: {expected}"
                );
                (c as f64 - expected).powi(2) / expected
            })
            .sum()
    }

    const SAMPLES: usize = 100_000;
    /// KS critical value at significance 0.001: sqrt(ln(2/0.001) / 2) / sqrt(N). Conservative for a
    /// discrete law.
    fn ks_critical() -> f64 {
        (2000f64.ln() / 2.0).sqrt() / (SAMPLES as f64).sqrt()
    }
    /// Chi-square critical values at significance 0.001.
    const CHI2_999_DF99: f64 = 148.230;
    const CHI2_999_DF19: f64 = 43.820;

    #[test]
    fn power_law_matches_its_cdf_by_kolmogorov_smirnov() {
        for alpha in [0.1, 0.3, 0.6, 0.8, 1.0, 2.0, 8.0] {
            let s = AdapterSampler::new(PopularityLaw::Power { alpha }, 100).unwrap();
            for k in [0u32, 9, 49, 98] {
                let want = (f64::from(k + 1) / 100.0).powf(alpha);
                assert!((s.cdf(k) - want).abs() < 1e-12);
            }
            let counts = histogram(&s, SAMPLES, 11);
            let d = ks_statistic(&s, &counts);
            assert!(
                d < ks_critical(),
                "alpha {alpha}: D = {d}, critical {}",
                ks_critical()
            );
        }
    }

    #[test]
    fn power_law_skews_toward_low_ids_when_alpha_is_small() {
        let s = AdapterSampler::new(PopularityLaw::Power { alpha: 0.1 }, 100).unwrap();
        let counts = histogram(&s, SAMPLES, 12);
        // P(id = 0) = 0.01^0.1 ≈ 0.631.
        let p0 = counts[0] as f64 / SAMPLES as f64;
        assert!((p0 - 0.01f64.powf(0.1)).abs() < 0.01, "{p0}");
    }

    #[test]
    fn zipf_law_fits_its_pmf_by_chi_square() {
        for s_exp in [0.5, 1.0, 1.5] {
            let s = AdapterSampler::new(PopularityLaw::Zipf { s: s_exp }, 100).unwrap();
            let sum: f64 = (0..100).map(|k| s.pmf(k)).sum();
            assert!((sum - 1.0).abs() < 1e-12);
            // pmf(0) / pmf(k) = (k+1)^s.
            assert!((s.pmf(0) / s.pmf(9) - 10f64.powf(s_exp)).abs() < 1e-9);
            let counts = histogram(&s, SAMPLES, 13);
            let x2 = chi_square(&s, &counts);
            assert!(
                x2 < CHI2_999_DF99,
                "s {s_exp}: chi-square {x2}, critical {CHI2_999_DF99}"
            );
        }
    }

    #[test]
    fn uniform_law_fits_by_chi_square_and_ks() {
        let s = AdapterSampler::new(PopularityLaw::Uniform, 20).unwrap();
        assert!((s.pmf(7) - 0.05).abs() < 1e-15);
        let counts = histogram(&s, SAMPLES, 14);
        let x2 = chi_square(&s, &counts);
        assert!(x2 < CHI2_999_DF19, "chi-square {x2}");
        assert!(ks_statistic(&s, &counts) < ks_critical());
        // Power with alpha 1 and zipf with s 0 are the uniform law too.
        for law in [
            PopularityLaw::Power { alpha: 1.0 },
            PopularityLaw::Zipf { s: 0.0 },
        ] {
            let other = AdapterSampler::new(law, 20).unwrap();
            assert!(
                (0..20).all(|k| (other.pmf(k) - 0.05).abs() < 1e-12),
                "{law}"
            );
            let x2 = chi_square(&other, &histogram(&other, SAMPLES, 15));
            assert!(x2 < CHI2_999_DF19, "{law}: chi-square {x2}");
        }
    }

    #[test]
    fn samples_stay_in_range_for_extreme_parameters() {
        for law in [
            PopularityLaw::Power { alpha: 1e-3 },
            PopularityLaw::Power { alpha: 1e6 },
            PopularityLaw::Zipf { s: 50.0 },
        ] {
            for n in [1, 2, 7] {
                let s = AdapterSampler::new(law, n).unwrap();
                let counts = histogram(&s, 10_000, 16);
                assert_eq!(counts.len(), n as usize);
                assert_eq!(s.cdf(n - 1), 1.0);
            }
        }
    }

    #[test]
    fn assignment_is_seeded_and_covers_every_arrival() {
        let mk = || -> Vec<Arrival> {
            (0..1000)
                .map(|i| Arrival {
                    at_ms: f64::from(i),
                    prompt_tokens: 1,
                    output_tokens: 1,
                    adapter: None,
                    prefix_blocks: vec![],
                })
                .collect()
        };
        let s = AdapterSampler::new("zipf:1.2".parse().unwrap(), 50).unwrap();
        let (mut a, mut b, mut c) = (mk(), mk(), mk());
        assign_adapters(&mut a, &s, 3);
        assign_adapters(&mut b, &s, 3);
        assign_adapters(&mut c, &s, 4);
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert!(a.iter().all(|r| r.adapter.is_some_and(|id| id < 50)));
    }

    #[test]
    fn laws_parse_and_print_round_trip() {
        for (text, law) in [
            ("uniform", PopularityLaw::Uniform),
            ("power:0.8", PopularityLaw::Power { alpha: 0.8 }),
            ("zipf:1.5", PopularityLaw::Zipf { s: 1.5 }),
            ("zipf:0", PopularityLaw::Zipf { s: 0.0 }),
        ] {
            assert_eq!(text.parse::<PopularityLaw>(), Ok(law));
            assert_eq!(law.to_string(), text);
        }
        assert_eq!(
            " Power : 2 ".parse::<PopularityLaw>(),
            Ok(PopularityLaw::Power { alpha: 2.0 })
        );
    }

    #[test]
    fn bad_laws_are_typed_errors() {
        let e = |s: &str| s.parse::<PopularityLaw>().unwrap_err();
        assert_eq!(
            e("pareto:1"),
            PopularityError::UnknownLaw("pareto:1".into())
        );
        assert_eq!(
            e("power"),
            PopularityError::MissingParameter { law: "power" }
        );
        assert_eq!(e("zipf"), PopularityError::MissingParameter { law: "zipf" });
        assert_eq!(
            e("uniform:3"),
            PopularityError::UnexpectedParameter { law: "uniform" }
        );
        assert_eq!(
            e("power:0"),
            PopularityError::BadParameter {
                law: "power",
                value: "0".into()
            }
        );
        assert_eq!(
            e("power:abc"),
            PopularityError::BadParameter {
                law: "power",
                value: "abc".into()
            }
        );
        assert_eq!(
            e("zipf:-1"),
            PopularityError::BadParameter {
                law: "zipf",
                value: "-1".into()
            }
        );
        assert_eq!(
            e("zipf:inf"),
            PopularityError::BadParameter {
                law: "zipf",
                value: "inf".into()
            }
        );
        assert!(e("power:NaN").to_string().contains("finite number > 0"));
        assert_eq!(
            AdapterSampler::new(PopularityLaw::Uniform, 0),
            Err(PopularityError::AdapterCount(0))
        );
        assert_eq!(
            AdapterSampler::new(PopularityLaw::Uniform, MAX_ADAPTERS + 1),
            Err(PopularityError::AdapterCount(MAX_ADAPTERS + 1))
        );
        assert!(matches!(
            AdapterSampler::new(PopularityLaw::Power { alpha: -1.0 }, 5),
            Err(PopularityError::BadParameter { law: "power", .. })
        ));
    }

    #[test]
    fn ranks_parse_round_robin_and_report_errors() {
        let r: AdapterRanks = "64, 32,16,8".parse().unwrap();
        assert_eq!(r.as_slice(), &[64, 32, 16, 8]);
        assert_eq!(
            (0..6).map(|k| r.rank_of(k)).collect::<Vec<_>>(),
            [64, 32, 16, 8, 64, 32]
        );
        assert_eq!(r.max_rank(), 64);
        assert_eq!(r.to_string(), "64,32,16,8");
        assert_eq!("".parse::<AdapterRanks>(), Err(PopularityError::NoRanks));
        assert_eq!(
            "8,,16".parse::<AdapterRanks>(),
            Err(PopularityError::BadRank(String::new()))
        );
        assert_eq!(
            "8,0".parse::<AdapterRanks>(),
            Err(PopularityError::BadRank("0".into()))
        );
        assert_eq!(
            "8,x".parse::<AdapterRanks>(),
            Err(PopularityError::BadRank("x".into()))
        );
        assert_eq!(AdapterRanks::new(vec![]), Err(PopularityError::NoRanks));
        assert_eq!(
            AdapterRanks::new(vec![8, 0]),
            Err(PopularityError::BadRank("0".into()))
        );
    }

    #[test]
    fn pages_grow_linearly_with_rank_and_round_up() {
        assert_eq!(pages_for_rank(8, 4), 4);
        assert_eq!(pages_for_rank(16, 4), 8);
        assert_eq!(pages_for_rank(64, 4), 32);
        assert_eq!(pages_for_rank(4, 4), 2);
        assert_eq!(pages_for_rank(1, 1), 1);
        assert_eq!(pages_for_rank(12, 1), 2);
        assert_eq!(pages_for_rank(0, 4), 0);
        assert_eq!(
            pages_for_rank(u32::MAX, u32::MAX),
            (u64::from(u32::MAX) * u64::from(u32::MAX)).div_ceil(8)
        );
    }
}
