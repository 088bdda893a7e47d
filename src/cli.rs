//! The command line (clap). Parsing only; src/commands/ does the work.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::backend::BackendKind;
use crate::backend::cuda::kernel::KernelLocation;
use crate::backend::cuda::variant::{CpAsyncChoice, parse_define};
use crate::devices::DeviceChoice;
use crate::emulation::Defect;
use crate::problem::HostDefect;
use crate::reference::Engine as YardstickEngine;
use crate::rows::CheckRows;
use crate::schema::StressMode;
use crate::timing::L2Mode;
use crate::usage::parse_seeds;

const EXAMPLES: &str = "\
Examples:
  sdpa-runner --shapes small,mission --seeds 0,1,2     check both kernel variants on the GPU
  sdpa-runner --backend cpu --shapes small,mission     the same pipeline on the CPU emulation
  USE_CP_ASYNC=1 sdpa-runner --shapes mission --seeds 0
                                                       only the cp.async variant (old workflow)
  sdpa-runner --shapes 2x4x300x64,long --seeds 0-4     inline BxHxSxD shapes and seed ranges
  sdpa-runner shapes                                   list the named shapes
  sdpa-runner build --arch sm_90                       compile both variants without a GPU
  sdpa-runner bench                                    time the f64 reference (and numpy's)
  sdpa-runner calibrate results/<run>...               measured errors -> proposed gates
  sdpa-runner compare results/<base> results/<cand> --gate
                                                       diff two saved runs; exit 1 on a regression
  sdpa-runner --cp-async 1 --candidate-define SDPA_DELAY_CYCLES=1000 --shapes mission
                                                       A/B a define against the same variant without it
  sdpa-runner --base-kernel git:origin/main --gate     the PR gate: this kernel against the base
                                                       branch's, both in one interleaved run
  sdpa-runner merge results/<h100 run> results/<h200 run>
                                                       shards of a CI matrix made one run
  sdpa-runner stress --shapes all --repeats 1000       race detection: bit-identical relaunches
  sdpa-runner selftest                                 every planted MUTANT_* bug must be caught
  sdpa-runner export --shapes llm --seeds 0 problems/  the problems as .npy files for any framework
  sdpa-runner check problems/ --outputs out/ --precision fp16
                                                       grade another implementation's outputs

Exit codes: 0 all gates passed, 1 a gate failed, 2 usage or configuration error,
3 environment error (no GPU, driver, NVRTC or headers), 4 kernel compile error, fault or hang.";

/// Tells whether a change to an FP8 attention kernel (cuda/kernels.toml) is still correct.
#[derive(Parser, Debug)]
#[command(
    name = "sdpa-runner",
    version,
    after_help = EXAMPLES,
    args_conflicts_with_subcommands = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    /// Without a subcommand, `run` is meant.
    #[command(flatten)]
    pub run: RunArgs,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Check the kernel's variants on shapes x seeds against the references (the default).
    Run(RunArgs),
    /// List the named shapes of the shapes file.
    Shapes(ShapesArgs),
    /// Compile the kernel's variants with NVRTC and print their identity; needs no GPU.
    Build(BuildArgs),
    /// Time the f64 CPU reference on shapes, beside numpy's time when python3 and numpy exist.
    Bench(BenchArgs),
    /// Summarize measured errors of saved runs and propose correctness thresholds.
    Calibrate(CalibrateArgs),
    /// Compare the timings of two saved runs (run directories or perf.json files).
    Compare(CompareArgs),
    /// Committed baselines per GPU model (trend data, not the PR gate): record a run, or
    /// compare a run with its GPU model's baseline.
    Baseline(BaselineArgs),
    /// Merge run directories (the shards of a CI job matrix) into one run and one verdict.
    Merge(MergeArgs),
    /// Relaunch each variant many times and demand bit-identical outputs (race detection).
    Stress(StressArgs),
    /// Prove the checks catch planted bugs: every MUTANT_* kernel must be caught.
    Selftest(SelftestArgs),
    /// Check random problems (shapes at tile edges, input distributions) with the same gates.
    Fuzz(FuzzArgs),
    /// How small a mistake the gates catch: planted perturbations of a correct output.
    Sensitivity(SensitivityArgs),
    /// Write problems (f32 inputs, FP8 codes and scales) as NumPy files for other
    /// implementations to run
    Export(ExportArgs),
    /// Grade other implementations' outputs of an exported folder against the f64 references
    Check(CheckArgs),
    /// List the kernels of cuda/kernels.toml: source, variants, supported problems, tiles and
    /// the facts that prove a build is that kernel
    Kernels(KernelsArgs),
    /// Measure this GPU model's noise floors: time one variant in separate processes and
    /// record how far they drift apart, per shape, for `compare`
    Noise(NoiseArgs),
}

/// A comma-separated seed list (`0,1,2`, `0-4`).
#[derive(Debug, Clone)]
pub struct SeedList(pub Vec<u64>);

fn seed_list(text: &str) -> Result<SeedList, String> {
    parse_seeds(text).map(SeedList)
}

/// One seed: a non-negative integer.
fn one_seed(text: &str) -> Result<u64, String> {
    let t = text.trim();
    if t.starts_with('-') {
        return Err(format!(
            "`{t}` is negative; a seed is a non-negative integer, e.g. 0 or 7"
        ));
    }
    t.parse()
        .map_err(|_| format!("`{t}` is not a seed; a seed is a non-negative integer, e.g. 0 or 7"))
}

/// A whole number in `lo..=hi`, or a message that names the allowed range.
fn count(text: &str, lo: usize, hi: usize) -> Result<usize, String> {
    let n: usize = text
        .trim()
        .parse()
        .map_err(|_| format!("`{text}` is not a whole number; allowed: {lo} to {hi}"))?;
    if !(lo..=hi).contains(&n) {
        return Err(format!("{n} is out of range; allowed: {lo} to {hi}"));
    }
    Ok(n)
}

fn warmup_count(t: &str) -> Result<usize, String> {
    count(t, 0, 100_000)
}
fn iters_count(t: &str) -> Result<usize, String> {
    count(t, 0, 1_000_000)
}
fn rounds_count(t: &str) -> Result<usize, String> {
    count(t, 1, 10_000)
}
fn batch_count(t: &str) -> Result<usize, String> {
    count(t, 1, 10_000)
}

/// `calibrate --margin`: at least 1 (a limit below the worst measured value fails correct
/// kernels) and at most 10 (beyond that a limit stops meaning anything).
fn margin(text: &str) -> Result<f64, String> {
    let m: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("`{text}` is not a number; allowed: 1 to 10"))?;
    if !(1.0..=10.0).contains(&m) {
        return Err(format!("{m} is out of range; allowed: 1 to 10"));
    }
    Ok(m)
}

/// Where the project's files are.
#[derive(Args, Debug, Clone, Default)]
pub struct ProjectArgs {
    /// The sdpa-runner checkout [default: found from the current directory or the executable]
    #[arg(long, value_name = "DIR")]
    pub root: Option<PathBuf>,
    /// Shapes file [default: <root>/shapes/default.json]
    #[arg(long, value_name = "FILE")]
    pub shapes_file: Option<PathBuf>,
    /// Gates file [default: <root>/gates/default.json]
    #[arg(long, value_name = "FILE")]
    pub gates: Option<PathBuf>,
}

/// What runs and where its results go (shared by `run` and `stress`).
#[derive(Args, Debug, Clone)]
pub struct SetupArgs {
    /// cuda runs the kernel on the GPU; cpu runs the emulation of its algorithm
    #[arg(long, value_enum, default_value = "cuda")]
    pub backend: BackendKind,
    /// Where run directories go [default: <root>/results]
    #[arg(long, value_name = "DIR")]
    pub results_dir: Option<PathBuf>,
    /// Rows held to the references: auto checks every row up to 2^28 score elements
    /// (B·H·S²) and a stated sample per head above (edges of every query tile, both end
    /// tiles, 64 seeded random rows); every element is always checked for unwritten and
    /// nonfinite values
    #[arg(
        long,
        value_enum,
        default_value = "auto",
        value_name = "auto|all|sampled"
    )]
    pub check_rows: CheckRows,
    /// Where the f64 references are computed: auto on the host's cores up to 2^22 checked
    /// (row, key) pairs and on the GPU above (with --backend cuda); both give the same figures
    /// (docs/DESIGN.md "References on the GPU")
    #[arg(
        long,
        value_enum,
        default_value = "auto",
        value_name = "auto|host|device"
    )]
    pub references: YardstickEngine,
    /// Where the emulation (the relative gate's yardstick) is computed, by the same rule: auto
    /// on the host up to 2^22 checked (row, key) pairs and on the GPU above; both give the
    /// same bits (docs/DESIGN.md "The emulation on the GPU")
    #[arg(
        long,
        value_enum,
        default_value = "auto",
        value_name = "auto|host|device"
    )]
    pub emulation: YardstickEngine,
    /// GPUs to run on, one worker each: all, or CUDA ordinals such as 0,1. Problems are shared
    /// costliest first (B·H·S²); a (shape, seed) runs whole on one GPU, its timings and A/B
    /// pairs too, and every record names its GPU. The GPUs must be of one model; a GPU listed
    /// twice (two workers) is allowed only without timing
    #[arg(
        long,
        value_name = "all|0,1,...",
        value_parser = DeviceChoice::parse,
        default_value = "0"
    )]
    pub devices: DeviceChoice,
    #[command(flatten)]
    pub project: ProjectArgs,
    #[command(flatten)]
    pub kernel: KernelArgs,
}

impl SetupArgs {
    /// How each problem is held to the references; `--references device` and `--emulation
    /// device` need a GPU.
    pub fn check(&self) -> Result<crate::runner::Check, String> {
        for (engine, flag, what) in [
            (self.references, "--references", "the references"),
            (self.emulation, "--emulation", "the emulation"),
        ] {
            if engine == YardstickEngine::Device && self.backend == BackendKind::Cpu {
                return Err(format!(
                    "{flag} device computes {what} on the GPU; it needs --backend cuda (use \
                     {flag} host or auto with --backend cpu)"
                ));
            }
        }
        Ok(crate::runner::Check {
            rows: self.check_rows,
            references: self.references,
            emulation: self.emulation,
        })
    }

    /// The folder run directories go into.
    pub fn results_root(&self, project_root: &std::path::Path) -> PathBuf {
        self.results_dir
            .clone()
            .unwrap_or_else(|| project_root.join("results"))
    }
}

/// Which kernel, and which of its variants.
#[derive(Args, Debug, Clone, Default)]
pub struct KernelArgs {
    /// Variants: 0 (the kernel's baseline: stage-c's cp0, synchronous loads; stage-d's st2),
    /// 1 (its candidate: cp1, the cp.async pipeline; st3) or both [default: both, or, for
    /// stage-c, the USE_CP_ASYNC environment variable]
    #[arg(long, value_enum, value_name = "0|1|both")]
    pub cp_async: Option<CpAsyncChoice>,
    /// Extra define for every variant, passed to NVRTC and recorded (repeatable)
    #[arg(long = "define", value_name = "NAME[=VALUE]", value_parser = parse_define)]
    pub defines: Vec<(String, String)>,
    /// A kernel of cuda/kernels.toml (`sdpa-runner kernels`) or a kernel source file, described
    /// by the manifest's kernel of the same file name [default: the manifest's default, stage-c]
    #[arg(long, value_name = "NAME|FILE")]
    pub kernel: Option<PathBuf>,
    /// A/B a define: runs the one selected variant (with --cp-async 0 or 1) as baseline and the
    /// same variant plus this define as candidate (repeatable)
    #[arg(long = "candidate-define", value_name = "NAME[=VALUE]", value_parser = parse_define)]
    pub candidate_defines: Vec<(String, String)>,
}

/// How to time (docs/DESIGN.md "Timing and comparison").
#[derive(Args, Debug, Clone)]
pub struct TimingArgs {
    /// Untimed launches per variant before timing [default: 100 on cuda, 1 on cpu]
    #[arg(long, value_name = "N", value_parser = warmup_count)]
    pub warmup: Option<usize>,
    /// Timed samples per variant; 0 checks correctness only [default: 500 on cuda, 20 on cpu]
    #[arg(long, value_name = "N", value_parser = iters_count)]
    pub iters: Option<usize>,
    /// Rounds the samples are split into; variants alternate in shuffled order each round (a
    /// problem whose blocks would outlast 20 ms at its warm-up's time a launch runs more)
    #[arg(long, value_name = "N", default_value_t = 20, value_parser = rounds_count)]
    pub rounds: usize,
    /// Launches per sample between two events (1 times each launch; more strips launch overhead)
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = batch_count)]
    pub batch: usize,
    /// warm: inputs stay in L2; flush: overwrite a buffer larger than L2 before each sample
    #[arg(long, value_enum, default_value = "warm")]
    pub l2: L2Mode,
}

/// What to publish for CI.
#[derive(Args, Debug, Clone, Default)]
pub struct CiArgs {
    /// Write JUnit XML here: a test case per correctness, resource and performance verdict
    #[arg(long, value_name = "FILE")]
    pub junit: Option<PathBuf>,
}

#[derive(Args, Debug, Clone)]
pub struct RunArgs {
    /// Shapes: names from the shapes file, inline BxHxSxD, or `all`, comma-separated
    #[arg(long, default_value = "small,mission")]
    pub shapes: String,
    /// Seeds: comma-separated integers or ranges, e.g. 0,1,2 or 0-4
    #[arg(long, default_value = "0,1,2", value_parser = seed_list, allow_hyphen_values = true)]
    pub seeds: SeedList,
    #[command(flatten)]
    pub setup: SetupArgs,
    #[command(flatten)]
    pub timing: TimingArgs,
    #[command(flatten)]
    pub ci: CiArgs,
    /// Exit 1 unless every target shape of the gates file is FASTER by at least min_speedup_pct
    #[arg(long)]
    pub require_speedup: bool,
    /// Judge the kernel against a base kernel in the same run: a file, or a git revision
    /// (git:origin/main, git:REV:PATH); every variant is built from both, checked, and timed
    /// interleaved against its twin of the base (base-cp0 vs cp0, base-cp1 vs cp1)
    #[arg(long, value_name = "FILE|git:REV[:PATH]", value_parser = KernelLocation::parse)]
    pub base_kernel: Option<KernelLocation>,
    /// Before timing, run compute-sanitizer's memcheck, racecheck, synccheck and initcheck over
    /// each variant of the kernel under test on small problems that reach every edge (S 1,
    /// 77, 129; causal, GQA, MQA, D 128); any finding, time-out or crash fails the run
    #[arg(long)]
    pub sanitize: bool,
    /// Noise floors measured per GPU model (`sdpa-runner noise --paired`) [default:
    /// <root>/gates/noise_floors.json]: each in-run verdict uses its shape's floor measured
    /// on this GPU model, else the gates file's constant, and says which
    #[arg(long, value_name = "FILE")]
    pub floors: Option<PathBuf>,
    /// Seconds each sanitizer tool may take per variant
    #[arg(long, value_name = "SECS", default_value_t = 600, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub sanitize_timeout: u64,
    /// With --base-kernel, the PR gate: exit 1 if the kernel is SLOWER than the base beyond
    /// max_regression_pct on any shape (or its timing was unsteady)
    #[arg(long)]
    pub gate: bool,
    /// Test hook: plant a defect in the cpu backend to prove the gates catch it
    #[arg(long, value_enum, default_value = "none", hide = true)]
    pub emulation_defect: Defect,
    /// Test hook: plant a host-side defect (quantizer, inputs) to prove the gates catch it
    #[arg(long, value_enum, default_value = "none", hide = true)]
    pub host_defect: HostDefect,
}

#[derive(Args, Debug, Clone)]
pub struct ShapesArgs {
    #[command(flatten)]
    pub project: ProjectArgs,
}

#[derive(Args, Debug, Clone)]
pub struct KernelsArgs {
    #[command(flatten)]
    pub project: ProjectArgs,
}

#[derive(Args, Debug, Clone)]
pub struct BuildArgs {
    /// NVRTC target architecture
    #[arg(long, default_value = "sm_90")]
    pub arch: String,
    #[command(flatten)]
    pub kernel: KernelArgs,
    /// Also build a base kernel (a file, or a git revision: git:origin/main, git:REV:PATH) and
    /// compare each variant's machine code with its twin's, module by module and function by
    /// function: which kernels a change moved
    #[arg(long, value_name = "FILE|git:REV[:PATH]", value_parser = KernelLocation::parse)]
    pub base_kernel: Option<KernelLocation>,
    /// With --base-kernel: exit 1 unless every function's machine code is the base's (a change
    /// that must not move the code: a refactor, comments)
    #[arg(long, requires = "base_kernel")]
    pub require_same_code: bool,
    #[command(flatten)]
    pub project: ProjectArgs,
}

#[derive(Args, Debug, Clone)]
pub struct BenchArgs {
    /// Shapes to time
    #[arg(long, default_value = "mission,long")]
    pub shapes: String,
    /// Timed repetitions per shape (the median is reported)
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub repeats: u32,
    /// Skip the numpy comparison
    #[arg(long)]
    pub no_numpy: bool,
    #[command(flatten)]
    pub project: ProjectArgs,
}

#[derive(Args, Debug, Clone)]
pub struct CalibrateArgs {
    /// Run directories (or correctness.json files) to summarize
    #[arg(required = true, value_name = "RUN")]
    pub runs: Vec<PathBuf>,
    /// Margin each gate should keep: warn when a worst measured value exceeds limit / margin
    #[arg(long, default_value_t = 2.0, value_parser = margin)]
    pub margin: f64,
}

#[derive(Args, Debug, Clone)]
pub struct CompareArgs {
    /// Baseline run: a run directory or its perf.json
    #[arg(value_name = "BASE")]
    pub base: PathBuf,
    /// Candidate run: a run directory or its perf.json
    #[arg(value_name = "CAND")]
    pub cand: PathBuf,
    /// Where COMPARE.md goes [default: <root>/results/COMPARE.md]; the picture goes beside it
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
    /// Exit 1 if the candidate failed correctness or is SLOWER beyond max_regression_pct
    #[arg(long)]
    pub gate: bool,
    /// Compare even when the GPUs or the inputs differ (the report says so)
    #[arg(long)]
    pub allow_mismatch: bool,
    /// Variant of BASE to compare [default: its only variant, or the last one both runs share]
    #[arg(long, value_name = "NAME")]
    pub base_variant: Option<String>,
    /// Variant of CAND to compare
    #[arg(long, value_name = "NAME")]
    pub cand_variant: Option<String>,
    /// Noise floors measured per GPU model (`sdpa-runner noise`) [default:
    /// <root>/gates/noise_floors.json]; a GPU model or shape it lacks gets a conservative
    /// default, and COMPARE.md says which floor each shape used
    #[arg(long, value_name = "FILE")]
    pub floors: Option<PathBuf>,
    #[command(flatten)]
    pub ci: CiArgs,
    #[command(flatten)]
    pub project: ProjectArgs,
}

#[derive(Args, Debug, Clone)]
pub struct MergeArgs {
    /// Run directories: shards of one kernel build (other shapes, seeds or GPU models)
    #[arg(required = true, value_name = "RUN")]
    pub runs: Vec<PathBuf>,
    /// Where the merged run directory goes [default: <root>/results]
    #[arg(long, value_name = "DIR")]
    pub results_dir: Option<PathBuf>,
    /// Noise floors measured per GPU model [default: <root>/gates/noise_floors.json]: each
    /// GPU model's in-run verdicts use its measured in-run floors, as a run does
    #[arg(long, value_name = "FILE")]
    pub floors: Option<PathBuf>,
    #[command(flatten)]
    pub project: ProjectArgs,
}

#[derive(Args, Debug, Clone)]
pub struct BaselineArgs {
    #[command(subcommand)]
    pub action: BaselineAction,
}

#[derive(Subcommand, Debug, Clone)]
pub enum BaselineAction {
    /// Record a passing, timed run as the baseline of its GPU model: <DIR>/<GPU model>/
    Record {
        /// The run directory
        #[arg(value_name = "RUN")]
        run: PathBuf,
        /// Where baselines are kept [default: <root>/results/baselines]
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
        #[command(flatten)]
        project: ProjectArgs,
    },
    /// Compare a run with the baseline of its GPU model; without one, a notice and exit 0
    Compare {
        /// The run directory
        #[arg(value_name = "RUN")]
        run: PathBuf,
        /// Where baselines are kept [default: <root>/results/baselines]
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
        /// Where COMPARE.md goes [default: <root>/results/COMPARE.md]
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
        #[command(flatten)]
        project: ProjectArgs,
    },
}

#[derive(Args, Debug, Clone)]
pub struct StressArgs {
    /// Shapes: names, inline BxHxSxD, or `all`
    #[arg(long, default_value = "all")]
    pub shapes: String,
    #[arg(long, default_value = "0", value_parser = seed_list, allow_hyphen_values = true)]
    pub seeds: SeedList,
    /// Repeats per (shape, seed, variant, mode); the first is the reference
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(2..=1_000_000))]
    pub repeats: u32,
    /// serial: one launch per repeat; two-streams: two concurrent launches per repeat
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "serial,two-streams"
    )]
    pub modes: Vec<StressMode>,
    #[command(flatten)]
    pub setup: SetupArgs,
}

#[derive(Args, Debug, Clone)]
pub struct SensitivityArgs {
    /// Shapes: names, inline BxHxSxD[:qk=F][:dist=NAME], or `all`
    #[arg(long, default_value = "small,mission")]
    pub shapes: String,
    /// Seeds: the table shows, per shape, the largest smallest-caught size over them
    #[arg(long, default_value = "0,1,2", value_parser = seed_list, allow_hyphen_values = true)]
    pub seeds: SeedList,
    /// A kernel of cuda/kernels.toml or a kernel source file: whose algorithm stands in for a
    /// correct output, and whose error model judges it [default: the manifest's default,
    /// stage-c]
    #[arg(long, value_name = "NAME|FILE")]
    pub kernel: Option<PathBuf>,
    #[command(flatten)]
    pub project: ProjectArgs,
}

#[derive(Args, Debug, Clone)]
pub struct FuzzArgs {
    /// Random problems to check
    #[arg(long, default_value = "200", value_parser = fuzz_count)]
    pub count: usize,
    /// Seed of the draw of problems (the same seed draws the same problems)
    #[arg(long, default_value = "0", value_parser = one_seed, allow_hyphen_values = true)]
    pub seed: u64,
    /// Largest sequence length drawn
    #[arg(long, default_value = "4096", value_parser = fuzz_max_s)]
    pub max_s: usize,
    #[command(flatten)]
    pub setup: SetupArgs,
    /// Test hook: plant a defect in the cpu backend to prove fuzz catches and reproduces it
    #[arg(long, value_enum, default_value = "none", hide = true)]
    pub emulation_defect: Defect,
}

fn fuzz_count(t: &str) -> Result<usize, String> {
    count(t, 1, 1_000_000)
}
fn fuzz_max_s(t: &str) -> Result<usize, String> {
    count(t, 1, 65_536)
}

#[derive(Args, Debug, Clone)]
pub struct SelftestArgs {
    /// Stress repeats per variant and mode for mutants that pass the correctness gates
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u32).range(2..=100_000))]
    pub repeats: u32,
    /// Only these mutants (comma-separated MUTANT_* names) [default: all of the kernel's but the
    /// opt-in ones, such as stage-c's MUTANT_I32_HEAD_OFFSET, whose shape needs about 64 GiB of
    /// host memory]
    #[arg(long, value_delimiter = ',', value_name = "MUTANT_NAME")]
    pub only: Vec<String>,
    /// Where run directories go [default: <root>/results]
    #[arg(long, value_name = "DIR")]
    pub results_dir: Option<PathBuf>,
    /// A kernel of cuda/kernels.toml or a kernel source file, whose manifest entry lists its
    /// planted bugs [default: the manifest's default, stage-c]
    #[arg(long, value_name = "NAME|FILE")]
    pub kernel: Option<PathBuf>,
    /// GPUs to run the mutants' checks on, one worker each: all, or CUDA ordinals such as
    /// 0,1 (nothing is timed, so a GPU may be listed twice); each check runs whole on one GPU
    #[arg(
        long,
        value_name = "all|0,1,...",
        value_parser = DeviceChoice::parse,
        default_value = "0"
    )]
    pub devices: DeviceChoice,
    #[command(flatten)]
    pub project: ProjectArgs,
}

#[derive(Args, Debug, Clone)]
pub struct NoiseArgs {
    /// Shapes to measure [default: small,mission,long; with --paired mission,large,llama-prefill]
    #[arg(long)]
    pub shapes: Option<String>,
    /// Separate processes (at least 3; each times every shape once)
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(3..=1000))]
    pub processes: u32,
    /// The variant timed between processes [default: 0]
    #[arg(long, value_enum, value_name = "0|1")]
    pub cp_async: Option<CpAsyncChoice>,
    /// Measure the in-run (paired) floors instead: each process runs the PR gate with the
    /// kernel as its own base (`--base-kernel`, seeds 0,1,2), and every comparison against
    /// the base is an A/A; at least 10 comparisons per shape (5 processes)
    #[arg(long)]
    pub paired: bool,
    /// With --paired: the kernel to measure (a kernel of cuda/kernels.toml or a source file), its
    /// floors kept under its source's file name, which its runs then use [default: the
    /// manifest's default, whose floors are the file's `paired` section]
    #[arg(long, value_name = "NAME|FILE", requires = "paired")]
    pub kernel: Option<PathBuf>,
    /// cuda times the kernel; cpu the emulation (for trying the command without a GPU)
    #[arg(long, value_enum, default_value = "cuda")]
    pub backend: BackendKind,
    /// The floors file to update (the shapes measured replace this GPU model's floors of them;
    /// every other floor is kept) [default: <root>/gates/noise_floors.json]
    #[arg(long, value_name = "FILE")]
    pub floors: Option<PathBuf>,
    #[command(flatten)]
    pub project: ProjectArgs,
}

#[derive(Args, Debug, Clone)]
pub struct ExportArgs {
    /// The folder to write: DIR/manifest.json and DIR/<problem id>/*.npy
    #[arg(value_name = "DIR")]
    pub dir: PathBuf,
    /// Shapes: names, inline BxHxSxD[:sk=N][:hkv=N][:causal][:qk=F][:dist=NAME][:rotate], or a set
    #[arg(long, default_value = "small")]
    pub shapes: String,
    #[arg(long, default_value = "0", value_parser = seed_list, allow_hyphen_values = true)]
    pub seeds: SeedList,
    /// Replace DIR if it holds an earlier export, and nothing else (a manifest of this format
    /// and its problems' folders)
    #[arg(long)]
    pub force: bool,
    #[command(flatten)]
    pub project: ProjectArgs,
}

#[derive(Args, Debug, Clone)]
pub struct CheckArgs {
    /// A folder written by `sdpa-runner export`
    #[arg(value_name = "DIR")]
    pub dir: PathBuf,
    /// An implementation's outputs: OUT/<problem id>.npy, [B, Hq, Sq, D], and optionally
    /// OUT/implementation.json (name, precision, e4m3 output scales, timings); repeat the
    /// flag to grade several implementations side by side
    #[arg(long = "outputs", value_name = "OUT", required_unless_present = "ours")]
    pub outputs: Vec<PathBuf>,
    /// What the implementation read and computed in: fp8 the codes and scales, the others
    /// the f32 originals cast to that type (required unless implementation.json says it)
    #[arg(long, value_enum)]
    pub precision: Option<crate::reference::Precision>,
    /// uint16 outputs hold bf16
    #[arg(long)]
    pub u16_is_bf16: bool,
    /// Hold every FP8 implementation (--ours too) to FP8 tensor-core (FP22) sums of at most
    /// KEYS keys of P·V before each is added to O in f32, as a kernel that promotes each KV
    /// tile does (Stage D: 128): an O summed over every key, which stagnates on long rows of
    /// one sign (dist=flat_positive_v), then fails once its shortfall passes the bound (about
    /// 14% of O there, mostly P's e4m3 rounding) [default: every key of the row, tiles
    /// unknown]
    #[arg(long, value_name = "KEYS", value_parser = clap::value_parser!(u32).range(1..))]
    pub fp8_chain: Option<u32>,
    /// Where the run directory goes [default: <root>/results]
    #[arg(long, value_name = "DIR")]
    pub results_dir: Option<PathBuf>,
    /// Rows held to the references (as a run's --check-rows)
    #[arg(long, value_enum, default_value = "auto")]
    pub check_rows: CheckRows,
    /// Also run sdpa-runner's own kernel on every problem (each variant the kernel flags
    /// select, on this backend) and grade it beside the others: it reads fp8 and writes f16;
    /// its p50 comes from 50 timed launches
    #[arg(long, value_enum, value_name = "cuda|cpu")]
    pub ours: Option<BackendKind>,
    #[command(flatten)]
    pub kernel: KernelArgs,
    #[command(flatten)]
    pub project: ProjectArgs,
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn bare_flags_mean_run() {
        let cli = Cli::try_parse_from([
            "sdpa-runner",
            "--shapes",
            "small",
            "--seeds",
            "0-2",
            "--backend",
            "cpu",
        ])
        .unwrap();
        assert!(cli.command.is_none());
        assert_eq!(cli.run.seeds.0, vec![0, 1, 2]);
        assert_eq!(cli.run.setup.backend, BackendKind::Cpu);
    }

    #[test]
    fn malformed_seeds_are_a_usage_error() {
        let err = Cli::try_parse_from(["sdpa-runner", "--seeds", "0,a"]).unwrap_err();
        assert_eq!(err.exit_code(), 2);
        assert!(err.to_string().contains("`a`"), "{err}");
    }
}
