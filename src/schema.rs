//! Every result file's schema in one place: build_meta.json, correctness.json, perf.json,
//! stress.json and selftest.json (docs/DESIGN.md "Result files"). Each file carries a
//! `schema_version`; readers refuse versions they do not know ([`check_version`]).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::clocks::ClockReading;
use crate::metrics::ErrorMetrics;
use crate::stats::{PerfVerdict, RatioEstimate, Summary};
use crate::timing::TimingPlan;
use crate::verdict::{Check, Verdict};

pub const SCHEMA_VERSION: u32 = 2;

/// Refuses a file written under a schema this runner does not read: `Err` holds the message.
pub fn check_version(found: u32) -> Result<(), String> {
    if found == SCHEMA_VERSION {
        Ok(())
    } else {
        Err(format!(
            "schema_version {found} is not supported; this runner reads {SCHEMA_VERSION}"
        ))
    }
}

/// A result file: it says which schema it was written under.
pub trait Versioned {
    fn schema_version(&self) -> u32;
}

macro_rules! versioned {
    ($($t:ty),*) => {$(
        impl Versioned for $t {
            fn schema_version(&self) -> u32 {
                self.schema_version
            }
        }
    )*};
}
versioned!(
    BuildMeta,
    CorrectnessFile,
    PerfFile,
    StressFile,
    SelftestFile,
    FuzzFile
);

/// build_meta.json: what ran, built from what, where.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BuildMeta {
    pub schema_version: u32,
    pub tool: ToolInfo,
    pub git: GitInfo,
    pub backend: String,
    pub host: HostInfo,
    pub command_line: Vec<String>,
    pub started_at: String,
    pub project_root: String,
    pub shapes_file: FileRef,
    pub gates_file: FileRef,
    /// Backend-specific identity: for `cuda`, the device, the NVRTC options and each
    /// variant's PTX hash and resources; for `cpu`, the emulation's parameters.
    pub backend_details: serde_json::Value,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ToolInfo {
    pub name: String,
    pub version: String,
}

/// The commit the binary was built from, and whether the tree had uncommitted changes.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct GitInfo {
    pub sha: String,
    pub dirty: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HostInfo {
    pub hostname: String,
    pub os: String,
    pub arch: String,
    pub logical_cpus: usize,
}

/// A file the run read, identified by content.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FileRef {
    pub path: String,
    pub sha256: String,
}

/// correctness.json
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CorrectnessFile {
    pub schema_version: u32,
    pub all_pass: bool,
    pub backend: String,
    /// Resource gates per variant (GPU runs only).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub resources: BTreeMap<String, Verdict>,
    pub results: Vec<CorrectnessRecord>,
    /// The sanitizer stage (`--sanitize`): one result per tool and variant.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sanitizers: Vec<crate::sanitize::SanitizerResult>,
}

impl CorrectnessFile {
    /// (passing, total) rows of `variant`.
    pub fn passing(&self, variant: &str) -> (usize, usize) {
        let rows: Vec<_> = self
            .results
            .iter()
            .filter(|r| r.variant == variant)
            .collect();
        (rows.iter().filter(|r| r.pass).count(), rows.len())
    }
}

/// One (shape, seed, variant).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CorrectnessRecord {
    pub shape: String,
    #[serde(rename = "B")]
    pub b: usize,
    #[serde(rename = "H")]
    pub h: usize,
    #[serde(rename = "S")]
    pub s: usize,
    #[serde(rename = "D")]
    pub d: usize,
    /// K/V heads (absent in files of older runners: H).
    #[serde(rename = "Hkv", default, skip_serializing_if = "Option::is_none")]
    pub hkv: Option<usize>,
    /// Keys per head (absent in files of older runners: S).
    #[serde(rename = "Sk", default, skip_serializing_if = "Option::is_none")]
    pub sk: Option<usize>,
    /// Bottom-right causal mask.
    #[serde(default)]
    pub causal: bool,
    pub seed: u64,
    pub variant: String,
    pub backend: String,
    pub input_checksum: String,
    /// sha256 of the output's f16 bits: equal checksums mean bit-identical outputs.
    pub output_checksum: String,
    pub kernel_ref: ErrorMetrics,
    pub end_to_end: ErrorMetrics,
    /// The CPU emulation against the kernel reference: the yardstick of the relative gate.
    pub emulation_ref: ErrorMetrics,
    /// Percent of output elements bit-identical to the CPU emulation's (a diagnostic).
    pub emulation_bits_equal_pct: f64,
    /// The largest distance of a checked element from the emulation's, in f16 ulps (steps of
    /// the f16 lattice between the two values; a non-finite element against a finite one is
    /// `u32::MAX`). A diagnostic, not yet a gate: where the emulation reproduces a kernel's
    /// algorithm, it measures how far a correct kernel strays from it. Absent in records
    /// written before it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub emulation_max_ulps: Option<u32>,
    /// The output's least-squares slope on the emulation's, the statistic of the
    /// `emulation.scale` gate (src/scale_fit.rs); absent where the gate is (effectively fewer
    /// than two rows of output, a non-finite element) and in records written before it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub emulation_scale: Option<crate::scale_fit::ScaleFit>,
    pub gates: BTreeMap<String, Check>,
    pub pass: bool,
    /// Query rows (all heads together) whose every element was held to the references; every
    /// output element was checked for unwritten and nonfinite values (src/rows.rs).
    #[serde(default)]
    pub rows_checked: usize,
    /// The rule that chose them: `all`, or the sampled rule in words.
    #[serde(default)]
    pub row_rule: String,
    /// Where the f64 references were computed: `host` or `device` (`--references`).
    #[serde(default = "host")]
    pub references: String,
    /// Where the emulation was computed: `host` or `device` (`--emulation`; the same bits).
    #[serde(default = "host")]
    pub emulation: String,
    /// How Q, K and V used E4M3's range: values clipped, flushed to zero, subnormal (absent
    /// in older files).
    #[serde(default)]
    pub input_range: crate::quantizer::InputRange,
    /// The GPU model (or CPU) it ran on, where a file holds rows of several (`merge`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
    /// The GPU it ran on (`--devices`); absent for the CPU backend.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<GpuSlot>,
}

/// One GPU of a host: its CUDA ordinal and its UUID (as `nvidia-smi -L` writes it), which
/// stays the same whatever CUDA_VISIBLE_DEVICES renumbers.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct GpuSlot {
    pub index: usize,
    pub uuid: String,
}

fn host() -> String {
    "host".into()
}

/// perf.json
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PerfFile {
    pub schema_version: u32,
    pub backend: String,
    /// What the samples measure, e.g. "GPU time per launch from CUDA events".
    pub clock: String,
    /// The GPU model (or the CPU, for the cpu backend); compare refuses different ones.
    pub device_name: String,
    pub device: serde_json::Value,
    pub git: GitInfo,
    pub started_at: String,
    pub plan: TimingPlan,
    pub clocks_before: ClockReading,
    pub clocks_after: ClockReading,
    pub variants: Vec<VariantMeta>,
    pub measurements: Vec<Measurement>,
    /// In-run A/B verdicts per shape (the second variant against the first), if two ran.
    pub comparisons: Vec<ShapeComparison>,
    /// The GPUs the measurements were taken on, one worker each (`--devices`); each
    /// measurement names its own. Empty for the CPU backend and for files of older runners.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpus: Vec<GpuSlot>,
    /// Set when another implementation was timed (scripts/peer_torch_sdpa.py): what it is,
    /// e.g. `{"library": "torch 2.11", "precision": "fp16"}`. Its inputs are its own draws.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer: Option<serde_json::Value>,
}

/// A variant as reports show it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct VariantMeta {
    pub name: String,
    pub defines: Vec<String>,
    pub ptx_sha256: Option<String>,
    /// Whether the PTX holds cp.async instructions (None where nothing was compiled).
    #[serde(default)]
    pub ptx_has_cp_async: Option<bool>,
    pub registers: Option<u32>,
    pub smem_bytes: Option<u32>,
    pub spill_bytes: Option<u32>,
    pub blocks_per_sm: Option<u32>,
    /// The kernel source it was built from (GPU runs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel: Option<KernelRef>,
    /// Of the PTX without line information and comments: equal when two builds' code is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ptx_code_sha256: Option<String>,
    /// What it compiled, by content: source texts, defines, options (GPU runs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<CodeIdentity>,
    /// Each function of its modules, by the machine code it runs (GPU runs; empty in files
    /// of older runners and where a CUBIN could not be read).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub machine_code: Vec<FunctionCode>,
}

/// One function of a compiled module, by its machine code: a hash of its instructions,
/// relocations, attributes, the functions it calls and its module's globals
/// (src/backend/cuda/machine_code/ `fingerprints`). Two functions of the same hash run the
/// same code.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FunctionCode {
    /// The module's entry (`d64`, `d128_causal`, ...).
    pub module: String,
    pub function: String,
    pub sha256: String,
}

impl VariantMeta {
    /// Whether it was built from the base kernel of a `--base-kernel` run.
    pub fn is_base(&self) -> bool {
        self.kernel
            .as_ref()
            .is_some_and(|k| k.role == KernelRole::Base)
    }
}

/// What a build compiled, by content (src/backend/cuda/code.rs).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CodeIdentity {
    /// Of everything below: equal means the same code.
    pub sha256: String,
    /// (file name, sha256 of its text): the kernel file first, then each local header it
    /// includes, in the order first reached.
    pub files: Vec<(String, String)>,
    /// `NAME=VALUE`, sorted.
    pub defines: Vec<String>,
    /// NVRTC options other than defines and include folders.
    pub options: Vec<String>,
}

impl CodeIdentity {
    /// What differs from `base`, in words: each file whose text differs, each define or
    /// option only one side has. Empty when the code is the same.
    pub fn differences(&self, base: &CodeIdentity) -> Vec<String> {
        let mut out = Vec::new();
        for (i, (name, sha)) in self.files.iter().enumerate() {
            let theirs = if i == 0 {
                base.files.first()
            } else {
                base.files.iter().find(|(n, _)| n == name)
            };
            match theirs {
                Some((_, s)) if s == sha => {}
                Some(_) => out.push(format!("source: {name} differs")),
                None => out.push(format!("source: {name} is included only here")),
            }
        }
        for (name, _) in base.files.iter().skip(1) {
            if !self.files.iter().skip(1).any(|(n, _)| n == name) {
                out.push(format!("source: {name} is included only by the base"));
            }
        }
        let only = |a: &[String], b: &[String]| -> Vec<String> {
            a.iter().filter(|x| !b.contains(x)).cloned().collect()
        };
        for d in only(&self.defines, &base.defines) {
            out.push(format!("define {d} only here"));
        }
        for d in only(&base.defines, &self.defines) {
            out.push(format!("define {d} only in the base"));
        }
        for o in only(&self.options, &base.options) {
            out.push(format!("option {o} only here"));
        }
        for o in only(&base.options, &self.options) {
            out.push(format!("option {o} only in the base"));
        }
        out
    }
}

/// Prefixes the name of a variant built from `--base-kernel`: `base-cp0` is `cp0` of the base.
pub const BASE_PREFIX: &str = "base-";

/// Which kernel a variant was built from: the one under test, or the base it is judged
/// against (`--base-kernel`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KernelRole {
    #[default]
    Candidate,
    Base,
}

/// A kernel source as a run read it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KernelRef {
    pub role: KernelRole,
    /// A file path, or `git:REV (commit):PATH`.
    pub source: String,
    /// Of the kernel file's text.
    pub sha256: String,
}

/// The problem description of a record, `BxHxSxD[:sk=N][:hkv=N][:causal]`
/// ([`crate::shapes::Shape::dims`]): what compare, merge and the PR gate key rows by beside
/// the shape's name.
pub fn problem_dims(
    b: usize,
    h: usize,
    s: usize,
    d: usize,
    hkv: Option<usize>,
    sk: Option<usize>,
    causal: bool,
) -> String {
    let mut shape = crate::shapes::Shape::new("", b, h, s, d);
    shape.hkv = hkv.unwrap_or(h);
    shape.sk = sk.unwrap_or(s);
    shape.causal = causal;
    shape.dims()
}

impl Measurement {
    /// The problem this row measured ([`problem_dims`]).
    pub fn dims(&self) -> String {
        problem_dims(
            self.b,
            self.h,
            self.s,
            self.d,
            self.hkv,
            self.sk,
            self.causal,
        )
    }

    /// TFLOP/s at its median: 4·D FLOPs per unmasked (query, key) pair
    /// ([`crate::shapes::Shape::unmasked_pairs`]), so causal rates compare with peers'.
    pub fn tflops(&self) -> f64 {
        let mut shape = crate::shapes::Shape::new("", self.b, self.h, self.s, self.d);
        shape.hkv = self.hkv.unwrap_or(self.h);
        shape.sk = self.sk.unwrap_or(self.s);
        shape.causal = self.causal;
        let flop = 4.0 * self.d as f64 * shape.unmasked_pairs() as f64;
        flop / (self.summary.p50 * 1e-6) / 1e12
    }
}

/// The timings of one (shape, seed, variant).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Measurement {
    pub shape: String,
    #[serde(rename = "B")]
    pub b: usize,
    #[serde(rename = "H")]
    pub h: usize,
    #[serde(rename = "S")]
    pub s: usize,
    #[serde(rename = "D")]
    pub d: usize,
    /// K/V heads (absent in files of older runners: H).
    #[serde(rename = "Hkv", default, skip_serializing_if = "Option::is_none")]
    pub hkv: Option<usize>,
    /// Keys per head (absent in files of older runners: S).
    #[serde(rename = "Sk", default, skip_serializing_if = "Option::is_none")]
    pub sk: Option<usize>,
    /// Bottom-right causal mask.
    #[serde(default)]
    pub causal: bool,
    pub seed: u64,
    pub input_checksum: String,
    pub variant: String,
    /// Over all samples, microseconds.
    pub summary: Summary,
    pub round_medians_us: Vec<f64>,
    pub samples_us: Vec<f64>,
    /// The mean SM clock over each round's block, MHz; None where the backend cannot tell
    /// (docs/DESIGN.md "Timing and comparison": rounds measured while the clock sagged are
    /// left out of the paired verdicts).
    #[serde(default)]
    pub round_sm_mhz: Vec<Option<f64>>,
    /// Blocks measured again because their hold expired before the host released it.
    #[serde(default)]
    pub hold_retries: u32,
    /// Blocks kept although the hold expired in every attempt.
    #[serde(default)]
    pub hold_expired_blocks: u32,
    /// The GPU it ran on (`--devices`); absent for the CPU backend.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<GpuSlot>,
    /// The launch it timed, where the backend launches kernels (absent for the CPU backend
    /// and in files of older runners): a kernel may run a problem in more than one geometry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub launch: Option<LaunchRecord>,
}

/// One kernel launch's geometry: query rows and threads of a CTA, the grid (query tiles, B·H,
/// KV split; (B·H, query tiles, KV split) for a causal launch of a module that publishes
/// `SDPA_CAUSAL_HEADS_FIRST`, since stop 56; (B·H, T, 1) for a mixed launch of T query tiles a
/// head, some a unit short, since stop 57), and the function that ran (an entry, or its
/// companion: docs/DESIGN.md "Kernel ABI"; absent in records written before stop 48).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LaunchRecord {
    pub query_rows: u32,
    pub threads: u32,
    pub grid: [u32; 3],
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub function: Option<String>,
}

/// The verdict on one shape: candidate against baseline, pooled over seeds.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ShapeComparison {
    pub shape: String,
    pub seeds: Vec<u64>,
    pub baseline: String,
    pub candidate: String,
    pub baseline_summary: Summary,
    pub candidate_summary: Summary,
    pub estimate: RatioEstimate,
    pub speedup_pct: f64,
    pub speedup_ci_pct: [f64; 2],
    /// The noise floor the verdict used, percent, and where it came from in words (in-run
    /// floors: src/floors.rs `choose_paired`); empty in files written before it was recorded.
    pub noise_floor_pct: f64,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub noise_floor_source: String,
    pub verdict: PerfVerdict,
    /// What is compared: two variants of the kernel under test, or a variant of it against
    /// the same variant of the base kernel.
    #[serde(default)]
    pub pair: PairKind,
    /// Rounds whose baseline block ran while the SM clock sagged (left out of the verdict
    /// unless too few would remain), and how many there were.
    #[serde(default)]
    pub rounds_dropped_for_clock: usize,
    #[serde(default)]
    pub rounds_total: usize,
    /// Whether both sides ran the same machine code in the same launches on the same inputs
    /// for every seed (src/perf/same_code.rs): an A/A by construction, where a verdict other
    /// than SAME is noise beyond the floor. None where a side's code or launches were not
    /// recorded (the CPU backend, files of older runners).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub same_machine_code: Option<bool>,
}

impl ShapeComparison {
    /// A verdict other than SAME on a comparison of the same machine code: noise beyond the
    /// floor, by construction.
    pub fn false_verdict(&self) -> bool {
        self.same_machine_code == Some(true) && self.verdict != crate::stats::PerfVerdict::Same
    }
}

/// The two kinds of in-run comparison.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PairKind {
    /// cp1 against cp0 of the kernel under test (or a `--candidate-define` A/B): the
    /// question the run answers; a regression is reported, not a failure.
    #[default]
    Variants,
    /// A variant of the kernel under test against the same variant of `--base-kernel`:
    /// the PR gate (`run --gate`).
    BaseKernel,
}

impl ShapeComparison {
    /// The smallest difference this comparison could have called FASTER or SLOWER: the noise
    /// floor plus the interval's wider half (in time-ratio percent). A verdict needs the whole
    /// interval beyond the floor, so a true difference below this reads SAME. Power, stated.
    pub fn mde_pct(&self) -> f64 {
        let e = &self.estimate;
        let half = (e.ratio - e.ci_low).max(e.ci_high - e.ratio).max(0.0);
        self.noise_floor_pct + 100.0 * half
    }

    pub fn new(
        shape: &str,
        seeds: Vec<u64>,
        (baseline, candidate): (&str, &str),
        (base_samples, cand_samples): (&[f64], &[f64]),
        estimate: RatioEstimate,
        noise_floor_pct: f64,
    ) -> Self {
        let (lo, hi) = estimate.speedup_ci_pct();
        ShapeComparison {
            shape: shape.to_string(),
            seeds,
            baseline: baseline.to_string(),
            candidate: candidate.to_string(),
            baseline_summary: Summary::of(base_samples),
            candidate_summary: Summary::of(cand_samples),
            speedup_pct: estimate.speedup_pct(),
            speedup_ci_pct: [lo, hi],
            noise_floor_pct,
            noise_floor_source: String::new(),
            verdict: crate::stats::verdict(&estimate, noise_floor_pct),
            estimate,
            pair: PairKind::Variants,
            rounds_dropped_for_clock: 0,
            rounds_total: 0,
            same_machine_code: None,
        }
    }
}

impl PerfFile {
    /// The plan's rounds as reports say them, with the most any measurement ran
    /// ([`crate::timing::TimingPlan::rounds_text`]).
    pub fn rounds_text(&self) -> String {
        let most = self
            .measurements
            .iter()
            .map(|m| m.round_medians_us.len())
            .max();
        self.plan.rounds_text(most.unwrap_or(0))
    }

    /// Shapes in first-seen order.
    pub fn shapes(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for m in &self.measurements {
            if !out.contains(&m.shape) {
                out.push(m.shape.clone());
            }
        }
        out
    }

    pub fn variant_names(&self) -> Vec<String> {
        self.variants.iter().map(|v| v.name.clone()).collect()
    }

    pub fn measurements_of<'a>(
        &'a self,
        shape: &'a str,
        variant: &'a str,
    ) -> impl Iterator<Item = &'a Measurement> + 'a {
        self.measurements
            .iter()
            .filter(move |m| m.shape == shape && m.variant == variant)
    }
}

/// `--mode`: how each repeat launches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum StressMode {
    /// One launch per repeat.
    Serial,
    /// Two launches per repeat, at once on two streams, into two outputs.
    TwoStreams,
}

/// Where a repeat first differed from the first output.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Divergence {
    pub repeat: usize,
    /// `[b, h, s, d]` of the first differing element.
    pub at: [usize; 4],
    pub expected_bits: u16,
    pub got_bits: u16,
}

/// The stress result of one (shape, seed, variant, mode).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StressRecord {
    pub shape: String,
    pub seed: u64,
    pub variant: String,
    pub mode: StressMode,
    pub repeats: usize,
    pub launches: usize,
    /// Repeats whose output differed from the first in at least one bit.
    pub divergent_repeats: usize,
    pub first_divergence: Option<Divergence>,
    /// Gates of the first output and of every divergent one.
    pub failed_gates: Vec<String>,
    pub pass: bool,
    /// Where the f64 references were computed: `host` or `device` (`--references`).
    #[serde(default = "host")]
    pub references: String,
    /// Where the emulation was computed: `host` or `device` (`--emulation`; the same bits).
    #[serde(default = "host")]
    pub emulation: String,
    /// The GPU it ran on (`--devices`); absent for the CPU backend.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<GpuSlot>,
}

/// stress.json
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StressFile {
    pub schema_version: u32,
    pub backend: String,
    pub all_pass: bool,
    pub results: Vec<StressRecord>,
}

/// fuzz.json: every random problem a `fuzz` run checked, and how each came out.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FuzzFile {
    pub schema_version: u32,
    pub backend: String,
    pub draw_seed: u64,
    pub count: usize,
    pub failures: usize,
    pub seconds: f64,
    pub all_pass: bool,
    pub problems: Vec<FuzzRecord>,
}

/// One random problem: its inline shape and seed, the worst of its variants, and a one-line
/// reproduction when it failed.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FuzzRecord {
    pub shape: String,
    pub seed: u64,
    pub pass: bool,
    #[serde(with = "crate::json::f64_or_inf")]
    pub kernel_err_over_bound: f64,
    #[serde(with = "crate::json::f64_or_inf")]
    pub end_to_end_err_over_bound: f64,
    /// Where the f64 references were computed: `host` or `device` (`--references`).
    #[serde(default = "host")]
    pub references: String,
    /// Where the emulation was computed: `host` or `device` (`--emulation`; the same bits).
    #[serde(default = "host")]
    pub emulation: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failures: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reproduce: Option<String>,
    /// The GPU it ran on (`--devices`); absent for the CPU backend.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<GpuSlot>,
}

/// selftest.json
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SelftestFile {
    pub schema_version: u32,
    pub ptx_identity: Vec<PtxIdentity>,
    pub clean_kernel_pass: bool,
    pub mutants: Vec<MutantResult>,
    /// Planted host-side defects (quantizer, inputs), each run as `--host-defect NAME`.
    #[serde(default)]
    pub host_defects: Vec<MutantResult>,
    pub score: String,
    pub all_pass: bool,
}

/// The clean build's PTX with the mutant code present and stripped.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PtxIdentity {
    pub variant: String,
    pub shipped_ptx_sha256: String,
    pub stripped_ptx_sha256: String,
    pub identical: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MutantResult {
    pub define: String,
    pub breaks: String,
    pub variants: String,
    pub shapes: String,
    /// The check that caught it, or None if it survived.
    pub caught_by: Option<String>,
    /// The figure that caught it (or why it survived).
    pub figure: String,
    /// The GPU its checks ran on, with `selftest --devices`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<GpuSlot>,
}

/// A result file of a schema this runner reads; any other `schema_version` is refused.
pub fn read_versioned<T: serde::de::DeserializeOwned + Versioned>(
    path: &std::path::Path,
) -> Result<T, crate::usage::ConfigError> {
    let value: T = crate::json::read_file(path)?;
    check_version(value.schema_version())
        .map_err(|why| crate::usage::ConfigError::invalid_key(path, "schema_version", why))?;
    Ok(value)
}

#[cfg(test)]
pub(crate) mod fixtures {
    //! Result records for tests of what reads them.
    use super::CorrectnessRecord;
    use crate::metrics::ErrorMetrics;
    use crate::verdict::Check;

    /// A mission, seed 0 row of `variant` whose one check passes or fails.
    pub fn record(variant: &str, pass: bool) -> CorrectnessRecord {
        let m = ErrorMetrics {
            max_abs_err: 1e-3,
            mean_abs_err: 1e-4,
            rmse: 1e-4,
            max_err_over_bound: 0.2,
            nonfinite: 0,
            unwritten: 0,
            elements: 10,
            worst_at: None,
        };
        let mut gates = std::collections::BTreeMap::new();
        gates.insert(
            "kernel.max_abs_err".to_string(),
            if pass {
                Check::at_most(1e-3, 1e-2)
            } else {
                Check::at_most(1e-1, 1e-2)
            },
        );
        CorrectnessRecord {
            shape: "mission".into(),
            b: 1,
            h: 8,
            s: 512,
            d: 64,
            hkv: None,
            sk: None,
            causal: false,
            seed: 0,
            variant: variant.into(),
            backend: "cpu".into(),
            input_checksum: String::new(),
            output_checksum: String::new(),
            kernel_ref: m.clone(),
            end_to_end: m.clone(),
            emulation_ref: m,
            emulation_bits_equal_pct: 100.0,
            emulation_max_ulps: Some(0),
            emulation_scale: None,
            gates,
            pass,
            rows_checked: 1,
            row_rule: "all".into(),
            references: "host".into(),
            emulation: "host".into(),
            input_range: Default::default(),
            device: None,
            gpu: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_detectable_difference_is_the_floor_plus_the_wider_half_of_the_interval() {
        let estimate = crate::stats::RatioEstimate {
            ratio: 1.0,
            ci_low: 0.99,
            ci_high: 1.02,
            confidence: 0.95,
            p_value: 0.5,
            design: "paired".into(),
            n: 20,
        };
        let c = ShapeComparison::new("s", vec![0], ("a", "b"), (&[1.0], &[1.0]), estimate, 1.0);
        assert!((c.mde_pct() - 3.0).abs() < 1e-9, "{}", c.mde_pct());
    }
}
