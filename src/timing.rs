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

/// The longest a block of samples should last. A GPU at its power limit moves its clock slowly
/// and by much: an H100 on D 128 FP8 problems of 2.6 ms a launch swung by ±5% with a period of
/// about a second, so the two sides of a pair, up to three 65 ms blocks apart in a round, ran
/// at clocks up to 7% apart, and the order of the rounds, the same in every run, gave one A/A
/// pair a lean of −0.6% to −0.96% in five runs out of five (docs/PERF.md "Stage D, stop 63").
/// Blocks this short keep a round well inside one swing; launches of up to 0.8 ms keep
/// the default 20 rounds of 25.
pub const MAX_BLOCK_MS: f64 = 20.0;

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

    /// This plan for a problem whose launches take `launch_us` (as its warm-up measured them;
    /// None: unknown): more rounds, so that a block of `batch`-launch samples lasts at most
    /// [`MAX_BLOCK_MS`], but never fewer rounds than the plan's, and at least one sample a
    /// round. The samples stay the plan's.
    pub fn for_launch(&self, launch_us: Option<f64>) -> TimingPlan {
        let Some(sample_us) = launch_us
            .filter(|us| us.is_finite() && *us > 0.0)
            .map(|us| us * self.batch.max(1) as f64)
        else {
            return self.clone();
        };
        let per_block = ((MAX_BLOCK_MS * 1e3 / sample_us).floor() as usize).max(1);
        let rounds = self
            .iters
            .div_ceil(per_block)
            .min(self.iters)
            .max(self.rounds);
        TimingPlan {
            rounds,
            ..self.clone()
        }
    }

    /// "N rounds", or "N-M rounds (more on the problems whose blocks would outlast 20 ms)"
    /// where some measurement ran `most` > N, for reports.
    pub fn rounds_text(&self, most: usize) -> String {
        if most > self.rounds {
            format!(
                "{}-{most} rounds (more on the problems whose blocks would outlast {MAX_BLOCK_MS} ms)",
                self.rounds
            )
        } else {
            format!("{} rounds", self.rounds)
        }
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
    fn a_problem_of_long_launches_gets_rounds_whose_blocks_last_at_most_the_limit() {
        let p = plan(500, 20);
        // 2.6 ms a launch: 7 a block (18.2 ms), 72 rounds; the samples stay 500.
        let long = p.for_launch(Some(2600.0));
        assert_eq!((long.rounds, long.iters), (72, 500));
        let blocks: Vec<usize> = (0..long.rounds).map(|r| long.samples_in_round(r)).collect();
        assert_eq!(blocks.iter().sum::<usize>(), 500);
        assert!(
            blocks.iter().all(|&n| n as f64 * 2.6 <= MAX_BLOCK_MS),
            "{blocks:?}"
        );
        // Up to 0.8 ms a launch keeps the plan's 20 rounds of 25; never fewer rounds.
        for us in [1.0, 300.0, 800.0] {
            assert_eq!(p.for_launch(Some(us)).rounds, 20, "{us} us");
        }
        assert_eq!(p.for_launch(Some(801.0)).rounds, 21);
        // Batched samples count their launches; at least one sample a round.
        let batched = TimingPlan {
            batch: 20,
            ..p.clone()
        };
        assert_eq!(batched.for_launch(Some(100.0)).rounds, 50);
        assert_eq!(p.for_launch(Some(1e6)).rounds, 500);
        assert_eq!(p.rounds_text(20), "20 rounds");
        assert!(
            p.rounds_text(72)
                .starts_with("20-72 rounds (more on the problems")
        );
        // An unknown or unusable time keeps the plan.
        for unknown in [None, Some(0.0), Some(f64::NAN)] {
            assert_eq!(p.for_launch(unknown), p);
        }
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
