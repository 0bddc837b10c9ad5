//! Run lengths: a lognormal truncated at the maximum, fitted to a mean, a median and a
//! maximum (`docs/design/gen.md` gives the derivation). The normal distribution's
//! functions are computed here from a complementary error function with relative
//! error below 1.2e-7 everywhere (the Chebyshev-fitted form in Numerical Recipes,
//! section 6.2), which is ample for a fit checked to 1e-6.

use serde::Serialize;

use crate::error::GenError;
use crate::rng::Xoshiro256;

/// The statistics a run-length distribution reproduces, in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct RunStats {
    pub mean: f64,
    pub median: f64,
    pub max: f64,
}

/// ln(erfc(x)) for x >= 0, without underflow for large x.
fn ln_erfc_nonneg(x: f64) -> f64 {
    let t = 1.0 / (1.0 + 0.5 * x);
    let poly = -1.265_512_23
        + t * (1.000_023_68
            + t * (0.374_091_96
                + t * (0.096_784_18
                    + t * (-0.186_288_06
                        + t * (0.278_868_07
                            + t * (-1.135_203_98
                                + t * (1.488_515_87 + t * (-0.822_152_23 + t * 0.170_872_77))))))));
    t.ln() - x * x + poly
}

/// ln Φ(z), the log of the standard normal distribution function.
fn ln_phi(z: f64) -> f64 {
    let x = -z / std::f64::consts::SQRT_2;
    if x >= 0.0 {
        ln_erfc_nonneg(x) - std::f64::consts::LN_2
    } else {
        // erfc(x) = 2 - erfc(-x) for x < 0.
        (1.0 - 0.5 * ln_erfc_nonneg(-x).exp()).ln()
    }
}

/// A lognormal with parameters `mu`, `sigma` (of ln L), conditioned on L <= `max`.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct TruncatedLogNormal {
    pub mu: f64,
    pub sigma: f64,
    pub max: f64,
}

impl TruncatedLogNormal {
    fn z(&self, x: f64) -> f64 {
        (x.ln() - self.mu) / self.sigma
    }

    /// P(L <= x).
    pub fn cdf(&self, x: f64) -> f64 {
        if x >= self.max {
            return 1.0;
        }
        if x <= 0.0 {
            return 0.0;
        }
        (ln_phi(self.z(x)) - ln_phi(self.z(self.max))).exp()
    }

    /// E[L; L > a] for 0 < a <= max: exp(mu + sigma²/2) (Φ(z_max - σ) - Φ(z_a - σ)) / Φ(z_max).
    fn partial_mean_above(&self, a: f64) -> f64 {
        let zc = self.z(self.max);
        let s = self.sigma;
        let lo = ln_phi(self.z(a) - s);
        let hi = ln_phi(zc - s);
        let diff = hi.exp() - lo.exp();
        (self.mu + s * s / 2.0 - ln_phi(zc)).exp() * diff.max(0.0)
    }

    /// E[L], computed in logarithms so that no factor overflows.
    pub fn mean(&self) -> f64 {
        let s = self.sigma;
        let zc = self.z(self.max);
        (self.mu + s * s / 2.0 + ln_phi(zc - s) - ln_phi(zc)).exp()
    }

    /// The median: exp(mu + sigma Φ⁻¹(Φ(z_max)/2)), Φ⁻¹ found by bisection.
    pub fn median(&self) -> f64 {
        let (mut lo, mut hi) = (self.mu - 40.0 * self.sigma, self.max.ln());
        for _ in 0..200 {
            let mid = 0.5 * (lo + hi);
            if self.cdf(mid.exp()) < 0.5 {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        (0.5 * (lo + hi)).exp()
    }

    /// E[ceil(L / block) * block]: the mean after rounding up to whole blocks, which is
    /// block * sum over k >= 0 of P(L > k block). The first `EXACT` terms are summed;
    /// the rest is the integral of P(L > x) (a closed form) with the Euler-Maclaurin
    /// half-term, exact to far below a byte because P(L > x) is smooth there.
    pub fn rounded_mean(&self, block: f64) -> f64 {
        const EXACT: u32 = 1024;
        let mut sum = 0.0;
        for k in 0..EXACT {
            let x = f64::from(k) * block;
            if x >= self.max {
                return block * sum;
            }
            sum += 1.0 - self.cdf(x);
        }
        let a = f64::from(EXACT) * block;
        if a >= self.max {
            return block * sum;
        }
        let survival = 1.0 - self.cdf(a);
        let tail = self.partial_mean_above(a) - a * survival;
        block * (sum + 0.5 * survival) + tail
    }

    /// One run length in bytes (continuous, at most `max`): exp(mu + sigma Z), drawn
    /// again in the rare case it exceeds `max` (probability 2e-9 and 5e-8 for the
    /// paper's R and U statistics).
    pub fn sample(&self, rng: &mut Xoshiro256) -> f64 {
        loop {
            let x = (self.mu + self.sigma * rng.next_normal()).exp();
            if x <= self.max {
                return x;
            }
        }
    }

    /// The truncated lognormal whose mean, median and maximum are `stats`. For a given
    /// sigma, mu follows from the median (bisection: the median rises with mu); sigma
    /// is then searched for the mean.
    pub fn fit(what: &'static str, stats: RunStats) -> Result<Self, GenError> {
        let err = |reason: String| GenError::RunLengths { what, reason };
        let RunStats { mean, median, max } = stats;
        if !(median > 0.0 && median < mean && mean < max && max.is_finite()) {
            return Err(err(format!(
                "need 0 < median < mean < max (median {median}, mean {mean}, max {max})"
            )));
        }
        let with_sigma = |sigma: f64| {
            // The median is exp(mu) when nothing is truncated; truncation lowers it, so
            // mu lies between ln(median) and ln(max).
            let (mut lo, mut hi) = (median.ln(), max.ln());
            for _ in 0..200 {
                let mu = 0.5 * (lo + hi);
                let d = TruncatedLogNormal { mu, sigma, max };
                let z_median = (median.ln() - mu) / sigma;
                // cdf(median) = Φ(z_median) / Φ(z_max) falls as mu rises.
                if ln_phi(z_median) - ln_phi(d.z(max)) > -std::f64::consts::LN_2 {
                    lo = mu;
                } else {
                    hi = mu;
                }
            }
            TruncatedLogNormal {
                mu: 0.5 * (lo + hi),
                sigma,
                max,
            }
        };
        // The mean rises from the median (sigma near 0) but, with the maximum fixed,
        // not without end: it peaks and falls again as the mass spreads below the
        // median. The first grid step at which it reaches the target brackets the
        // smallest sigma that fits, and bisection finds it there.
        let step = 0.05;
        let Some(k) = (1..=240).find(|&k| with_sigma(f64::from(k) * step).mean() >= mean) else {
            return Err(err(format!(
                "a mean of {mean} bytes is out of reach with a median of {median} and a \
                 maximum of {max}: raise the maximum or the median, or lower the mean"
            )));
        };
        let (mut lo, mut hi) = (f64::from(k - 1).max(0.002) * step, f64::from(k) * step);
        for _ in 0..100 {
            let mid = 0.5 * (lo + hi);
            if with_sigma(mid).mean() < mean {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        let fit = with_sigma(0.5 * (lo + hi));
        let (got_mean, got_median) = (fit.mean(), fit.median());
        if (got_mean / mean - 1.0).abs() > 1e-6 || (got_median / median - 1.0).abs() > 1e-6 {
            return Err(err(format!(
                "no truncated lognormal fits (best: mean {got_mean:.0}, median {got_median:.0})"
            )));
        }
        Ok(fit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KIB: f64 = 1024.0;
    const MIB: f64 = 1024.0 * 1024.0;

    fn phi(z: f64) -> f64 {
        ln_phi(z).exp()
    }

    #[test]
    fn phi_matches_known_values() {
        // Φ at 0, 1, 2, -3 and -8 (tables; the last checks the far tail in logs).
        for (z, p) in [
            (0.0, 0.5),
            (1.0, 0.841_344_746_068_543),
            (2.0, 0.977_249_868_051_821),
            (-3.0, 0.001_349_898_031_630_095),
            (-8.0, 6.220_960_574_271_785e-16),
        ] {
            assert!(
                (phi(z) / p - 1.0).abs() < 2e-7,
                "Φ({z}) = {} not {p}",
                phi(z)
            );
        }
    }

    #[test]
    fn fit_reproduces_the_paper_statistics() {
        for stats in [
            RunStats {
                mean: 143.0 * KIB,
                median: 16.0 * KIB,
                max: 3498.0 * MIB,
            },
            RunStats {
                mean: 337.0 * KIB,
                median: 19.0 * KIB,
                max: 6582.0 * MIB,
            },
        ] {
            let d = TruncatedLogNormal::fit("test", stats).unwrap();
            assert!((d.mean() / stats.mean - 1.0).abs() < 1e-6);
            assert!((d.median() / stats.median - 1.0).abs() < 1e-6);
            assert_eq!(d.max, stats.max);
        }
    }

    #[test]
    fn rounded_mean_equals_a_direct_sum() {
        let d = TruncatedLogNormal::fit(
            "test",
            RunStats {
                mean: 40.0 * KIB,
                median: 9.0 * KIB,
                max: 64.0 * MIB,
            },
        )
        .unwrap();
        let block = 4096.0;
        let direct: f64 = (0..(64 * 256))
            .map(|k| 1.0 - d.cdf(f64::from(k) * block))
            .sum::<f64>()
            * block;
        assert!((d.rounded_mean(block) / direct - 1.0).abs() < 1e-6);
        assert!(d.rounded_mean(block) > d.mean());
    }

    #[test]
    fn impossible_statistics_are_refused() {
        let bad = |mean, median, max| {
            TruncatedLogNormal::fit("test", RunStats { mean, median, max }).is_err()
        };
        assert!(bad(10.0, 20.0, 100.0), "mean below median");
        assert!(bad(10.0, 5.0, 8.0), "max below mean");
        assert!(
            bad(90.0, 1.0, 100.0),
            "mean too close to max for a lognormal"
        );
    }

    #[test]
    fn samples_never_exceed_the_maximum() {
        let d = TruncatedLogNormal::fit(
            "test",
            RunStats {
                mean: 30.0,
                median: 5.0,
                max: 400.0,
            },
        )
        .unwrap();
        let mut rng = Xoshiro256::new(1);
        assert!((0..100_000).all(|_| d.sample(&mut rng) <= 400.0));
    }
}
