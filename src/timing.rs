//! The timing plan (warm-up, samples, rounds, batching, cold L2) and the A/B schedule that
//! interleaves variants in rounds, the order shuffled per round, so drift and throttling hit
//! every variant alike. [`crate::runner`] carries it out on a backend, whose clock it is;
//! [`crate::stats`] judges the numbers.

use rand::SeedableRng;
use rand::seq::SliceRandom;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::usage::ConfigError;

/// Fewest rounds whose per-round ratios support an interval and a test.
pub const MIN_ROUNDS: usize = 5;

/// `--l2`: whether inputs may stay in L2 between launches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum L2Mode {
    /// Back-to-back launches; inputs stay cached (steady state).
    Warm,
    /// A buffer larger than L2 is overwritten before each sample, outside the timed region.
    Flush,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TimingPlan {
    /// Untimed launches per variant before the first round.
    pub warmup: usize,
    /// Timed samples per variant (0: correctness only).
    pub iters: usize,
    /// Rounds the samples are split into; each round times every variant once, in shuffled order.
    pub rounds: usize,
    /// Launches per sample between two events (1: per-launch timing; more removes launch overhead).
    pub batch: usize,
    pub l2: L2Mode,
}

impl TimingPlan {
    pub fn enabled(&self) -> bool {
        self.iters > 0
    }

    /// Refuses a plan the statistics cannot use.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if !self.enabled() {
            return Ok(());
        }
        if self.rounds < MIN_ROUNDS {
            return Err(ConfigError::Usage(format!(
                "--rounds {} is below what the statistics need: at least {MIN_ROUNDS}",
                self.rounds
            )));
        }
        if self.iters < self.rounds {
            return Err(ConfigError::Usage(format!(
                "--iters {} is below what the statistics need: at least one sample per round \
                 (--rounds {}); use --iters 0 for a correctness-only run",
                self.iters, self.rounds
            )));
        }
        if self.batch == 0 {
            return Err(ConfigError::Usage("--batch must be at least 1".into()));
        }
        Ok(())
    }

    /// Samples in `round`: the iterations spread evenly, the first rounds taking the remainder.
    pub fn samples_in_round(&self, round: usize) -> usize {
        self.iters / self.rounds + usize::from(round < self.iters % self.rounds)
    }

    /// The variant order of `round`: a shuffle seeded by the round, so runs repeat.
    pub fn order(&self, round: usize, variants: usize) -> Vec<usize> {
        let mut order: Vec<usize> = (0..variants).collect();
        order.shuffle(&mut ChaCha8Rng::seed_from_u64(round as u64));
        order
    }
}

/// One block of samples of one variant (one round), as the backend measured it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TimedBlock {
    /// Microseconds per launch.
    pub samples: Vec<f64>,
    /// The mean SM clock over the block, MHz, where the backend can tell.
    pub sm_mhz: Option<f64>,
    /// Attempts discarded because the hold expired before the host released it.
    pub retries: u32,
    /// Every attempt's hold expired; the last one is kept (its first samples may include
    /// the host's launch latency).
    pub hold_expired: bool,
}

impl TimedBlock {
    /// A block from a clock that needs no hold and reports no SM clock (the CPU).
    pub fn plain(samples: Vec<f64>) -> Self {
        TimedBlock {
            samples,
            ..TimedBlock::default()
        }
    }
}

/// The blocks of one variant, round by round.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct VariantTiming {
    pub rounds: Vec<TimedBlock>,
}

impl VariantTiming {
    pub fn samples(&self) -> Vec<f64> {
        self.rounds.iter().flat_map(|b| b.samples.clone()).collect()
    }

    pub fn round_medians(&self) -> Vec<f64> {
        self.rounds
            .iter()
            .map(|b| crate::stats::median(&b.samples))
            .collect()
    }

    pub fn round_sm_mhz(&self) -> Vec<Option<f64>> {
        self.rounds.iter().map(|b| b.sm_mhz).collect()
    }

    pub fn hold_retries(&self) -> u32 {
        self.rounds.iter().map(|b| b.retries).sum()
    }

    pub fn hold_expired_blocks(&self) -> u32 {
        self.rounds.iter().filter(|b| b.hold_expired).count() as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(iters: usize, rounds: usize) -> TimingPlan {
        TimingPlan {
            warmup: 2,
            iters,
            rounds,
            batch: 1,
            l2: L2Mode::Warm,
        }
    }

    #[test]
    fn samples_are_spread_over_rounds_and_add_up() {
        let p = plan(503, 20);
        let total: usize = (0..20).map(|r| p.samples_in_round(r)).sum();
        assert_eq!(total, 503);
        assert_eq!((p.samples_in_round(0), p.samples_in_round(19)), (26, 25));
    }

    #[test]
    fn round_orders_are_shuffled_repeatably_and_cover_both_orders() {
        let p = plan(500, 20);
        let orders: Vec<Vec<usize>> = (0..20).map(|r| p.order(r, 2)).collect();
        assert_eq!(orders, (0..20).map(|r| p.order(r, 2)).collect::<Vec<_>>());
        let baseline_first = orders.iter().filter(|o| o[0] == 0).count();
        assert!((4..=16).contains(&baseline_first), "{baseline_first} of 20");
    }

    #[test]
    fn too_few_iterations_or_rounds_are_refused() {
        assert!(plan(0, 20).validate().is_ok(), "0 means correctness only");
        assert!(plan(500, 20).validate().is_ok());
        let err = plan(10, 20).validate().unwrap_err().to_string();
        assert!(
            err.contains("--iters 10") && err.contains("--iters 0"),
            "{err}"
        );
        assert!(plan(500, 3).validate().is_err());
    }
}
