//! Statistics of timings: per-variant summaries, and the ratio of candidate to baseline time
//! with a confidence interval and a p-value, turned into a FASTER / SLOWER / SAME verdict.
//!
//! Two designs, one rule. *Paired* (one process, A/B interleaved in rounds): the per-round
//! ratio cand/base; its median, a bootstrap interval over rounds, and a two-sided sign test.
//! *Unpaired* (two saved runs): the ratio of the medians of per-round medians, a bootstrap
//! interval resampling each side, and a Mann-Whitney U test. A verdict other than SAME needs
//! the whole interval beyond the noise floor and p below 1 - confidence.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use statrs::distribution::{Binomial, ContinuousCDF, DiscreteCDF, Normal};
use statrs::statistics::{Data, Distribution, Max, Min, OrderStatistics};

/// Bootstrap resamples: enough for stable 95% percentile bounds, cheap at 20-100 rounds.
const BOOTSTRAP_RESAMPLES: usize = 4000;

/// p50, p90, mean, std, min, max of a set of samples (microseconds).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub n: usize,
    pub p50: f64,
    pub p90: f64,
    pub mean: f64,
    pub std: f64,
    pub min: f64,
    pub max: f64,
}

impl Summary {
    pub fn of(samples: &[f64]) -> Self {
        assert!(!samples.is_empty(), "a summary needs samples");
        let mut data = Data::new(samples.to_vec());
        Summary {
            n: samples.len(),
            p50: data.median(),
            p90: data.percentile(90),
            mean: data.mean().unwrap_or(f64::NAN),
            std: if samples.len() > 1 {
                data.std_dev().unwrap_or(0.0)
            } else {
                0.0
            },
            min: data.min(),
            max: data.max(),
        }
    }
}

pub fn median(xs: &[f64]) -> f64 {
    Data::new(xs.to_vec()).median()
}

/// Candidate time over baseline time: the estimate, its interval, and the test's p-value.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RatioEstimate {
    /// Median time ratio candidate / baseline (below 1: the candidate is faster).
    pub ratio: f64,
    pub ci_low: f64,
    pub ci_high: f64,
    pub confidence: f64,
    pub p_value: f64,
    /// "paired" or "unpaired".
    pub design: String,
    /// Rounds (paired) or round medians per side (unpaired) behind the estimate.
    pub n: usize,
}

impl RatioEstimate {
    /// Speedup of the candidate in percent: +10 means 10% more work per unit time.
    pub fn speedup_pct(&self) -> f64 {
        (1.0 / self.ratio - 1.0) * 100.0
    }

    /// The speedup interval in percent, low to high.
    pub fn speedup_ci_pct(&self) -> (f64, f64) {
        (
            (1.0 / self.ci_high - 1.0) * 100.0,
            (1.0 / self.ci_low - 1.0) * 100.0,
        )
    }
}

/// Paired design: `base[i]` and `cand[i]` were measured in the same round.
pub fn paired_ratio(base: &[f64], cand: &[f64], confidence: f64) -> RatioEstimate {
    assert_eq!(base.len(), cand.len());
    assert!(!base.is_empty());
    let ratios: Vec<f64> = cand.iter().zip(base).map(|(c, b)| c / b).collect();
    let mut rng = ChaCha8Rng::seed_from_u64(0x5eed);
    let mut boot: Vec<f64> = (0..BOOTSTRAP_RESAMPLES)
        .map(|_| median(&resample(&ratios, &mut rng)))
        .collect();
    let (ci_low, ci_high) = percentile_interval(&mut boot, confidence);
    RatioEstimate {
        ratio: median(&ratios),
        ci_low,
        ci_high,
        confidence,
        p_value: sign_test(&ratios),
        design: "paired".into(),
        n: ratios.len(),
    }
}

/// Unpaired design: two independent sets of per-round medians.
pub fn unpaired_ratio(base: &[f64], cand: &[f64], confidence: f64) -> RatioEstimate {
    assert!(!base.is_empty() && !cand.is_empty());
    let mut rng = ChaCha8Rng::seed_from_u64(0x5eed);
    let mut boot: Vec<f64> = (0..BOOTSTRAP_RESAMPLES)
        .map(|_| median(&resample(cand, &mut rng)) / median(&resample(base, &mut rng)))
        .collect();
    let (ci_low, ci_high) = percentile_interval(&mut boot, confidence);
    RatioEstimate {
        ratio: median(cand) / median(base),
        ci_low,
        ci_high,
        confidence,
        p_value: mann_whitney(base, cand),
        design: "unpaired".into(),
        n: base.len().min(cand.len()),
    }
}

fn resample(xs: &[f64], rng: &mut ChaCha8Rng) -> Vec<f64> {
    (0..xs.len())
        .map(|_| xs[rng.random_range(0..xs.len())])
        .collect()
}

fn percentile_interval(boot: &mut [f64], confidence: f64) -> (f64, f64) {
    boot.sort_by(f64::total_cmp);
    let alpha = 1.0 - confidence;
    let at = |q: f64| boot[((q * (boot.len() - 1) as f64).round() as usize).min(boot.len() - 1)];
    (at(alpha / 2.0), at(1.0 - alpha / 2.0))
}

/// Two-sided sign test of "the median ratio is 1"; ties (ratio exactly 1) are dropped.
pub fn sign_test(ratios: &[f64]) -> f64 {
    let below = ratios.iter().filter(|&&r| r < 1.0).count();
    let above = ratios.iter().filter(|&&r| r > 1.0).count();
    let n = below + above;
    if n == 0 {
        return 1.0;
    }
    let binom = Binomial::new(0.5, n as u64).expect("valid binomial");
    (2.0 * binom.cdf(below.min(above) as u64)).min(1.0)
}

/// Two-sided Mann-Whitney U test (normal approximation with tie correction).
pub fn mann_whitney(a: &[f64], b: &[f64]) -> f64 {
    let (n1, n2) = (a.len() as f64, b.len() as f64);
    let mut all: Vec<(f64, bool)> = a
        .iter()
        .map(|&x| (x, true))
        .chain(b.iter().map(|&x| (x, false)))
        .collect();
    all.sort_by(|x, y| x.0.total_cmp(&y.0));
    let n = all.len();
    let (mut rank_sum_a, mut tie_term) = (0.0, 0.0);
    let mut i = 0;
    while i < n {
        let mut j = i;
        while j + 1 < n && all[j + 1].0 == all[i].0 {
            j += 1;
        }
        let midrank = (i + j) as f64 / 2.0 + 1.0;
        let t = (j - i + 1) as f64;
        tie_term += t * t * t - t;
        rank_sum_a += all[i..=j].iter().filter(|e| e.1).count() as f64 * midrank;
        i = j + 1;
    }
    let u = rank_sum_a - n1 * (n1 + 1.0) / 2.0;
    let nf = n as f64;
    let var = n1 * n2 / 12.0 * ((nf + 1.0) - tie_term / (nf * (nf - 1.0)));
    if var <= 0.0 {
        return 1.0;
    }
    let z = (u - n1 * n2 / 2.0).abs() / var.sqrt();
    let normal = Normal::new(0.0, 1.0).expect("standard normal");
    (2.0 * (1.0 - normal.cdf(z))).min(1.0)
}

/// The answer to "is the candidate faster?".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum PerfVerdict {
    Faster,
    Slower,
    Same,
}

impl std::fmt::Display for PerfVerdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            PerfVerdict::Faster => "FASTER",
            PerfVerdict::Slower => "SLOWER",
            PerfVerdict::Same => "SAME",
        })
    }
}

/// FASTER or SLOWER only when the whole interval lies beyond the noise floor on that side and
/// the test rejects equality at 1 - confidence; otherwise SAME.
pub fn verdict(e: &RatioEstimate, noise_floor_pct: f64) -> PerfVerdict {
    let floor = noise_floor_pct / 100.0;
    let significant = e.p_value < 1.0 - e.confidence;
    if significant && e.ci_high < 1.0 - floor {
        PerfVerdict::Faster
    } else if significant && e.ci_low > 1.0 + floor {
        PerfVerdict::Slower
    } else {
        PerfVerdict::Same
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Times around `center` with deterministic multiplicative jitter of +-`spread`.
    fn noisy(center: f64, spread: f64, n: usize, seed: u64) -> Vec<f64> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        (0..n)
            .map(|_| center * (1.0 + rng.random_range(-spread..spread)))
            .collect()
    }

    #[test]
    fn summary_reports_percentiles_and_moments() {
        let xs: Vec<f64> = (1..=100).map(f64::from).collect();
        let s = Summary::of(&xs);
        assert_eq!((s.n, s.min, s.max), (100, 1.0, 100.0));
        assert!((s.p50 - 50.5).abs() < 1.0 && (s.p90 - 90.5).abs() < 1.0);
        assert!((s.mean - 50.5).abs() < 1e-9 && (s.std - 29.01).abs() < 0.01);
    }

    #[test]
    fn identical_timings_are_same() {
        let base = noisy(20.0, 0.02, 20, 1);
        let cand = noisy(20.0, 0.02, 20, 2);
        let e = paired_ratio(&base, &cand, 0.95);
        assert_eq!(verdict(&e, 1.0), PerfVerdict::Same, "{e:?}");
        let u = unpaired_ratio(&base, &cand, 0.95);
        assert_eq!(verdict(&u, 1.0), PerfVerdict::Same, "{u:?}");
    }

    #[test]
    fn a_clear_three_percent_slowdown_is_slower() {
        let base = noisy(20.0, 0.003, 20, 1);
        let cand: Vec<f64> = noisy(20.0, 0.003, 20, 2).iter().map(|x| x * 1.03).collect();
        let e = paired_ratio(&base, &cand, 0.95);
        assert_eq!(verdict(&e, 1.0), PerfVerdict::Slower, "{e:?}");
        assert!((e.speedup_pct() + 2.9).abs() < 0.5, "{}", e.speedup_pct());
        assert_eq!(
            verdict(&unpaired_ratio(&base, &cand, 0.95), 1.0),
            PerfVerdict::Slower
        );
    }

    #[test]
    fn a_twenty_percent_speedup_is_faster_with_an_interval_around_it() {
        let base = noisy(20.0, 0.01, 20, 3);
        let cand: Vec<f64> = noisy(20.0, 0.01, 20, 4).iter().map(|x| x / 1.2).collect();
        let e = paired_ratio(&base, &cand, 0.95);
        assert_eq!(verdict(&e, 1.0), PerfVerdict::Faster);
        let (lo, hi) = e.speedup_ci_pct();
        assert!(lo < 20.0 && 20.0 < hi && hi - lo < 5.0, "{lo} {hi}");
        assert!(e.p_value < 1e-5);
    }

    #[test]
    fn a_significant_difference_inside_the_noise_floor_is_same() {
        // 0.5% slower, very consistently: real, but below a 1% floor.
        let base = noisy(20.0, 0.0005, 30, 5);
        let cand: Vec<f64> = noisy(20.0, 0.0005, 30, 6)
            .iter()
            .map(|x| x * 1.005)
            .collect();
        let e = paired_ratio(&base, &cand, 0.95);
        assert!(e.p_value < 0.001);
        assert_eq!(verdict(&e, 1.0), PerfVerdict::Same);
        assert_eq!(verdict(&e, 0.2), PerfVerdict::Slower);
    }

    #[test]
    fn sign_test_and_mann_whitney_match_textbook_values() {
        // 10 of 10 below 1: p = 2 / 1024.
        assert!((sign_test(&[0.9; 10]) - 2.0 / 1024.0).abs() < 1e-12);
        assert_eq!(sign_test(&[1.0; 5]), 1.0);
        // Fully separated samples of 10 and 10: z = 3.78, p = 1.57e-4.
        let a: Vec<f64> = (0..10).map(f64::from).collect();
        let b: Vec<f64> = (10..20).map(f64::from).collect();
        assert!(
            (mann_whitney(&a, &b) - 1.57e-4).abs() < 1e-5,
            "{}",
            mann_whitney(&a, &b)
        );
        assert!(mann_whitney(&a, &a) > 0.99);
    }

    #[test]
    fn estimates_are_deterministic() {
        let base = noisy(20.0, 0.05, 20, 7);
        let cand = noisy(21.0, 0.05, 20, 8);
        assert_eq!(
            paired_ratio(&base, &cand, 0.95),
            paired_ratio(&base, &cand, 0.95)
        );
    }
}
