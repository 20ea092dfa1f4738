//! Synthetic workloads: renewal-process arrivals with independent prompt and output lengths.
//!
//! Arrivals follow S-LoRA's generator (`S-LoRA/S-LoRA` `benchmarks/trace.py`): gaps between requests
//! are Gamma distributed with shape `1/cv²` and scale `cv²/rate`, so the mean gap is `1/rate` and its
//! coefficient of variation is `cv` (cv = 1 is a Poisson process, larger cv is burstier). The first
//! request arrives one gap after 0. S-LoRA's lengths are uniform integers in `[8, 512)`; Punica's
//! prompts are log-normal. [`SyntheticSpec::slora`] builds S-LoRA's setting.
//!
//! Everything is drawn from [`Rng`] seeded with [`SyntheticSpec::seed`]; arrival gaps, prompt lengths
//! and output lengths use three independent streams, so changing a length law leaves the arrival
//! times unchanged.

use std::fmt;

use rand::SeedableRng;
use rand_distr::{Distribution, Exp, Gamma, LogNormal, Uniform};

use super::{Arrival, Rng, Source, Workload};

/// The most requests [`generate`] makes; larger horizons are refused rather than exhausting memory.
pub const MAX_REQUESTS: usize = 10_000_000;

/// How request arrival times are drawn.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ArrivalProcess {
    /// Exponential gaps with mean `1 / rate_per_s`.
    Poisson {
        /// Mean arrival rate in requests per second (> 0).
        rate_per_s: f64,
    },
    /// Gamma gaps with shape `1/cv²` and scale `cv²/rate_per_s` (S-LoRA).
    Gamma {
        /// Mean arrival rate in requests per second (> 0).
        rate_per_s: f64,
        /// Coefficient of variation of the gaps (> 0; 1 is Poisson).
        cv: f64,
    },
}

impl ArrivalProcess {
    /// The mean arrival rate in requests per second.
    #[must_use]
    pub const fn rate_per_s(self) -> f64 {
        match self {
            Self::Poisson { rate_per_s } | Self::Gamma { rate_per_s, .. } => rate_per_s,
        }
    }
}

/// When to stop generating.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Horizon {
    /// Exactly this many requests (S-LoRA uses `floor(rate · duration)`).
    Requests(usize),
    /// Every request arriving at or before this many seconds.
    Seconds(f64),
}

/// A distribution of token counts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum LengthDist {
    /// Uniform integers in `[lo, hi)` (numpy `randint` semantics, as S-LoRA).
    Uniform {
        /// Smallest value (≥ 1).
        lo: u32,
        /// One past the largest value (> `lo`).
        hi: u32,
    },
    /// `round(exp(mu + sigma · N(0, 1)))`, clamped to `[min, max]`. The median is `exp(mu)`.
    LogNormal {
        /// Mean of the underlying normal (the log of the median).
        mu: f64,
        /// Standard deviation of the underlying normal (≥ 0).
        sigma: f64,
        /// Smallest value returned (≥ 1).
        min: u32,
        /// Largest value returned (≥ `min`).
        max: u32,
    },
}

impl LengthDist {
    /// A log-normal length law given by its median instead of `mu`.
    #[must_use]
    pub fn lognormal_median(median: f64, sigma: f64, min: u32, max: u32) -> Self {
        Self::LogNormal {
            mu: median.ln(),
            sigma,
            min,
            max,
        }
    }

    /// Checks the law and builds its sampler.
    fn sampler(self, which: &'static str) -> Result<LengthSampler, SyntheticError> {
        let bad = |why| Err(SyntheticError::BadLengths { which, why });
        match self {
            Self::Uniform { lo: 0, .. } => bad("uniform lower bound must be at least 1"),
            Self::Uniform { lo, hi } if hi <= lo => {
                bad("uniform upper bound must exceed the lower bound")
            }
            Self::Uniform { lo, hi } => Ok(LengthSampler::Uniform(Uniform::new(lo, hi))),
            Self::LogNormal { mu, .. } if !mu.is_finite() => bad("log-normal mu must be finite"),
            Self::LogNormal { min, max, .. } if min == 0 || max < min => {
                bad("log-normal clamp must satisfy 1 <= min <= max")
            }
            Self::LogNormal {
                mu,
                sigma,
                min,
                max,
            } => match LogNormal::new(mu, sigma) {
                Ok(law) if sigma.is_finite() => Ok(LengthSampler::LogNormal { law, min, max }),
                _ => bad("log-normal sigma must be finite and non-negative"),
            },
        }
    }
}

/// The law of the gaps between arrivals.
enum Gaps {
    Exp(Exp<f64>),
    Gamma(Gamma<f64>),
}

/// A checked [`LengthDist`], ready to draw.
enum LengthSampler {
    Uniform(Uniform<u32>),
    LogNormal {
        law: LogNormal<f64>,
        min: u32,
        max: u32,
    },
}

impl LengthSampler {
    fn sample(&self, rng: &mut Rng) -> u32 {
        match self {
            Self::Uniform(law) => law.sample(rng),
            Self::LogNormal { law, min, max } => {
                // Clamp in f64 first: `as u32` saturates, and NaN cannot occur for finite mu/sigma.
                let x = law.sample(rng).round();
                x.clamp(f64::from(*min), f64::from(*max)) as u32
            }
        }
    }
}

impl fmt::Display for LengthDist {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::Uniform { lo, hi } => write!(f, "uniform [{lo}, {hi})"),
            Self::LogNormal {
                mu,
                sigma,
                min,
                max,
            } => {
                write!(
                    f,
                    "lognormal (median {:.1}, sigma {sigma}) clamped to [{min}, {max}]",
                    mu.exp()
                )
            }
        }
    }
}

/// Everything [`generate`] needs; also kept in the workload's [`Source`].
#[derive(Debug, Clone, PartialEq)]
pub struct SyntheticSpec {
    /// Arrival process.
    pub arrivals: ArrivalProcess,
    /// When to stop.
    pub horizon: Horizon,
    /// Prompt length law.
    pub prompt: LengthDist,
    /// Output length law.
    pub output: LengthDist,
    /// Seed for all draws.
    pub seed: u64,
}

impl SyntheticSpec {
    /// S-LoRA's synthetic setting: gamma arrivals at `rate_per_s` with coefficient of variation `cv`,
    /// `floor(rate · duration_s)` requests, prompt and output lengths uniform in `[8, 512)`.
    #[must_use]
    pub fn slora(rate_per_s: f64, cv: f64, duration_s: f64, seed: u64) -> Self {
        let n = (rate_per_s * duration_s).floor();
        // `as usize` saturates (and maps NaN to 0); `generate` refuses counts above MAX_REQUESTS.
        let requests = if n.is_finite() && n > 0.0 {
            n as usize
        } else {
            0
        };
        Self {
            arrivals: ArrivalProcess::Gamma { rate_per_s, cv },
            horizon: Horizon::Requests(requests),
            prompt: LengthDist::Uniform { lo: 8, hi: 512 },
            output: LengthDist::Uniform { lo: 8, hi: 512 },
            seed,
        }
    }
}

impl fmt::Display for SyntheticSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.arrivals {
            ArrivalProcess::Poisson { rate_per_s } => {
                write!(f, "poisson arrivals ({rate_per_s} req/s)")?;
            }
            ArrivalProcess::Gamma { rate_per_s, cv } => {
                write!(f, "gamma arrivals ({rate_per_s} req/s, cv {cv})")?;
            }
        }
        match self.horizon {
            Horizon::Requests(n) => write!(f, ", {n} requests")?,
            Horizon::Seconds(s) => write!(f, ", {s} s")?,
        }
        write!(
            f,
            ", prompt {}, output {}, seed {}",
            self.prompt, self.output, self.seed
        )
    }
}

/// A [`SyntheticSpec`] that cannot be generated.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum SyntheticError {
    /// The rate is not finite and positive.
    #[error("arrival rate must be finite and positive, got {0}")]
    BadRate(f64),
    /// The coefficient of variation is not finite and positive.
    #[error("coefficient of variation must be finite and positive, got {0}")]
    BadCv(f64),
    /// The duration is not finite and positive.
    #[error("duration must be finite and positive, got {0} s")]
    BadDuration(f64),
    /// More than [`MAX_REQUESTS`] requests would be generated.
    #[error("the horizon asks for more than {MAX_REQUESTS} requests")]
    TooManyRequests,
    /// A length law is invalid.
    #[error("{which} lengths: {why}")]
    BadLengths {
        /// `"prompt"` or `"output"`.
        which: &'static str,
        /// What is wrong.
        why: &'static str,
    },
}

/// Generates the workload described by `spec`. The same spec always gives the same workload.
///
/// # Errors
///
/// A [`SyntheticError`] for a non-positive or non-finite rate, cv or duration, an invalid length law,
/// or a horizon beyond [`MAX_REQUESTS`].
pub fn generate(spec: &SyntheticSpec) -> Result<Workload, SyntheticError> {
    generate_capped(spec, MAX_REQUESTS)
}

/// [`generate`] with the request limit as a parameter (tests use a small one).
fn generate_capped(spec: &SyntheticSpec, cap: usize) -> Result<Workload, SyntheticError> {
    let rate = spec.arrivals.rate_per_s();
    if !(rate.is_finite() && rate > 0.0) {
        return Err(SyntheticError::BadRate(rate));
    }
    let gaps_law = match spec.arrivals {
        ArrivalProcess::Poisson { .. } => {
            Gaps::Exp(Exp::new(rate).map_err(|_| SyntheticError::BadRate(rate))?)
        }
        ArrivalProcess::Gamma { cv, .. } => {
            // Shape 1/cv² and scale cv²/rate: mean 1/rate, coefficient of variation cv.
            let (shape, scale) = (1.0 / (cv * cv), cv * cv / rate);
            match Gamma::new(shape, scale) {
                Ok(g) if cv.is_finite() && cv > 0.0 && shape.is_finite() && scale > 0.0 => {
                    Gaps::Gamma(g)
                }
                _ => return Err(SyntheticError::BadCv(cv)),
            }
        }
    };
    let prompt_law = spec.prompt.sampler("prompt")?;
    let output_law = spec.output.sampler("output")?;
    let (count, until_s) = match spec.horizon {
        Horizon::Requests(n) if n > cap => return Err(SyntheticError::TooManyRequests),
        Horizon::Requests(n) => (n, f64::INFINITY),
        Horizon::Seconds(d) if !(d.is_finite() && d > 0.0) => {
            return Err(SyntheticError::BadDuration(d))
        }
        Horizon::Seconds(d) => (cap.saturating_add(1), d),
    };

    // Three non-overlapping streams of one generator (each jump skips 2^128 draws).
    let mut gaps = Rng::seed_from_u64(spec.seed);
    let mut prompts = gaps.clone();
    prompts.jump();
    let mut outputs = prompts.clone();
    outputs.jump();
    let mut arrivals = Vec::with_capacity(count.min(1 << 20));
    let mut t = 0.0f64;
    while arrivals.len() < count {
        t += match &gaps_law {
            Gaps::Exp(law) => law.sample(&mut gaps),
            Gaps::Gamma(law) => law.sample(&mut gaps),
        };
        if t > until_s {
            break;
        }
        if arrivals.len() == cap {
            return Err(SyntheticError::TooManyRequests);
        }
        arrivals.push(Arrival {
            at_ms: t * 1000.0,
            prompt_tokens: prompt_law.sample(&mut prompts),
            output_tokens: output_law.sample(&mut outputs),
            adapter: None,
            prefix_blocks: Vec::new(),
        });
    }
    Ok(Workload::new(arrivals, Source::Synthetic(spec.clone())))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gaps_s(w: &Workload) -> Vec<f64> {
        let mut prev = 0.0;
        w.arrivals
            .iter()
            .map(|a| {
                let g = (a.at_ms - prev) / 1000.0;
                prev = a.at_ms;
                g
            })
            .collect()
    }

    fn mean_cv(xs: &[f64]) -> (f64, f64) {
        let n = xs.len() as f64;
        let mean = xs.iter().sum::<f64>() / n;
        let var = xs.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / (n - 1.0);
        (mean, var.sqrt() / mean)
    }

    fn spec(arrivals: ArrivalProcess, n: usize) -> SyntheticSpec {
        SyntheticSpec {
            arrivals,
            horizon: Horizon::Requests(n),
            prompt: LengthDist::Uniform { lo: 8, hi: 512 },
            output: LengthDist::Uniform { lo: 8, hi: 512 },
            seed: 42,
        }
    }

    #[test]
    fn poisson_gaps_have_mean_one_over_rate_and_cv_one() {
        let w = generate(&spec(ArrivalProcess::Poisson { rate_per_s: 5.0 }, 200_000)).unwrap();
        assert_eq!(w.len(), 200_000);
        let (mean, cv) = mean_cv(&gaps_s(&w));
        assert!((mean - 0.2).abs() / 0.2 < 0.01, "mean gap {mean}");
        assert!((cv - 1.0).abs() < 0.02, "cv {cv}");
    }

    #[test]
    fn gamma_gaps_have_mean_one_over_rate_and_the_requested_cv() {
        for (cv_want, tol) in [(0.5, 0.02), (1.0, 0.02), (2.0, 0.04), (4.0, 0.05)] {
            let w = generate(&spec(
                ArrivalProcess::Gamma {
                    rate_per_s: 2.0,
                    cv: cv_want,
                },
                200_000,
            ))
            .unwrap();
            let (mean, cv) = mean_cv(&gaps_s(&w));
            assert!(
                (mean - 0.5).abs() / 0.5 < 0.02,
                "cv {cv_want}: mean gap {mean}"
            );
            assert!(
                (cv - cv_want).abs() / cv_want < tol,
                "cv {cv_want}: got {cv}"
            );
            assert!(w.arrivals.windows(2).all(|p| p[0].at_ms <= p[1].at_ms));
        }
    }

    #[test]
    fn uniform_lengths_stay_in_half_open_range() {
        let w = generate(&spec(ArrivalProcess::Poisson { rate_per_s: 1.0 }, 50_000)).unwrap();
        let p: Vec<u32> = w.arrivals.iter().map(|a| a.prompt_tokens).collect();
        assert!(p.iter().all(|&x| (8..512).contains(&x)));
        assert_eq!(p.iter().min(), Some(&8));
        assert_eq!(p.iter().max(), Some(&511));
        let mean = p.iter().map(|&x| f64::from(x)).sum::<f64>() / p.len() as f64;
        assert!((mean - 259.5).abs() < 3.0, "{mean}");
    }

    #[test]
    fn lognormal_lengths_have_the_requested_median_and_clamp() {
        let mut s = spec(ArrivalProcess::Poisson { rate_per_s: 1.0 }, 50_001);
        s.prompt = LengthDist::lognormal_median(18.0, 0.8, 1, 100);
        let w = generate(&s).unwrap();
        let mut p: Vec<u32> = w.arrivals.iter().map(|a| a.prompt_tokens).collect();
        p.sort_unstable();
        assert!(
            (17..=19).contains(&p[p.len() / 2]),
            "median {}",
            p[p.len() / 2]
        );
        assert!(p[0] >= 1 && *p.last().unwrap() <= 100);
        assert_eq!(*p.last().unwrap(), 100, "the upper clamp is reached");
    }

    #[test]
    fn same_seed_same_workload_and_lengths_do_not_move_arrivals() {
        let a = generate(&SyntheticSpec::slora(4.0, 2.0, 300.0, 7)).unwrap();
        let b = generate(&SyntheticSpec::slora(4.0, 2.0, 300.0, 7)).unwrap();
        assert_eq!(a, b);
        assert_eq!(a.len(), 1200);
        let mut s = SyntheticSpec::slora(4.0, 2.0, 300.0, 7);
        s.prompt = LengthDist::Uniform { lo: 1, hi: 3 };
        let c = generate(&s).unwrap();
        assert!(a
            .arrivals
            .iter()
            .zip(&c.arrivals)
            .all(|(x, y)| x.at_ms == y.at_ms && x.output_tokens == y.output_tokens));
        let d = generate(&SyntheticSpec::slora(4.0, 2.0, 300.0, 8)).unwrap();
        assert_ne!(a.arrivals, d.arrivals);
    }

    #[test]
    fn seconds_horizon_stops_at_the_duration() {
        let mut s = spec(ArrivalProcess::Poisson { rate_per_s: 10.0 }, 0);
        s.horizon = Horizon::Seconds(100.0);
        let w = generate(&s).unwrap();
        assert!(w.arrivals.iter().all(|a| a.at_ms <= 100_000.0));
        assert!((900..1100).contains(&w.len()), "{}", w.len());
        assert!(w
            .source
            .to_string()
            .starts_with("synthetic: poisson arrivals (10 req/s), 100 s, prompt uniform [8, 512)"));
    }

    #[test]
    fn invalid_specs_are_refused() {
        let p = |r| ArrivalProcess::Poisson { rate_per_s: r };
        assert_eq!(
            generate(&spec(p(0.0), 1)),
            Err(SyntheticError::BadRate(0.0))
        );
        assert!(matches!(
            generate(&spec(p(f64::NAN), 1)),
            Err(SyntheticError::BadRate(_))
        ));
        let g = ArrivalProcess::Gamma {
            rate_per_s: 1.0,
            cv: -1.0,
        };
        assert_eq!(generate(&spec(g, 1)), Err(SyntheticError::BadCv(-1.0)));
        let g = ArrivalProcess::Gamma {
            rate_per_s: 1.0,
            cv: 1e-200,
        };
        assert_eq!(generate(&spec(g, 1)), Err(SyntheticError::BadCv(1e-200)));
        let mut s = spec(p(1.0), 1);
        s.output = LengthDist::Uniform { lo: 5, hi: 5 };
        assert!(matches!(
            generate(&s),
            Err(SyntheticError::BadLengths {
                which: "output",
                ..
            })
        ));
        s.output = LengthDist::Uniform { lo: 0, hi: 5 };
        assert!(matches!(
            generate(&s),
            Err(SyntheticError::BadLengths {
                which: "output",
                ..
            })
        ));
        s.output = LengthDist::LogNormal {
            mu: 1.0,
            sigma: f64::INFINITY,
            min: 1,
            max: 2,
        };
        assert!(matches!(
            generate(&s),
            Err(SyntheticError::BadLengths { .. })
        ));
        s.output = LengthDist::LogNormal {
            mu: 1.0,
            sigma: 1.0,
            min: 3,
            max: 2,
        };
        assert!(matches!(
            generate(&s),
            Err(SyntheticError::BadLengths { .. })
        ));
        let mut s = spec(p(1.0), MAX_REQUESTS + 1);
        assert_eq!(generate(&s), Err(SyntheticError::TooManyRequests));
        s.horizon = Horizon::Seconds(f64::INFINITY);
        assert!(matches!(generate(&s), Err(SyntheticError::BadDuration(_))));
        s.horizon = Horizon::Seconds(1e9);
        s.arrivals = p(1e3);
        assert_eq!(
            generate_capped(&s, 1000),
            Err(SyntheticError::TooManyRequests)
        );
        s.horizon = Horizon::Seconds(0.5);
        assert!(generate_capped(&s, 1000).is_ok());
        assert_eq!(generate(&spec(p(1.0), 0)).map(|w| w.len()), Ok(0));
    }
}
