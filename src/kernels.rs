//! The kernel manifest, `cuda/kernels.toml`: every kernel the runner knows, described once
//! (docs/DESIGN.md "Kernel manifest"). Read strictly: an unknown key, a duplicate name, an
//! entry that is not a C identifier or a problem class the runner cannot check is an error
//! naming the key (exit 2). Commands pick a kernel with `--kernel NAME|FILE` ([`Manifest::choose`]).

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::shapes::Shape;
use crate::usage::ConfigError;

/// The manifest's file name under cuda/.
pub const MANIFEST_FILE: &str = "kernels.toml";
/// Head dimensions the runner's references, emulation and error model implement.
const CHECKABLE_HEAD_DIMS: [usize; 2] = [64, 128];

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// The kernel a command runs without `--kernel`.
    pub default: String,
    #[serde(rename = "kernel")]
    pub kernels: Vec<KernelSpec>,
    #[serde(skip)]
    pub path: PathBuf,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KernelSpec {
    pub name: String,
    pub description: String,
    /// File name under cuda/.
    pub source: String,
    /// Entry-point prefix: the module of (D, causal) holds `<entry>_d<D>[_causal]`.
    pub entry: String,
    /// `native` (the GPU's own architecture) or a fixed target such as `sm_90a`.
    pub arch: String,
    pub abi: Abi,
    pub runner: Runner,
    /// How to check a `runner = "probe"` kernel today.
    #[serde(default)]
    pub probe: Option<String>,
    pub ptx_must_hold: Vec<String>,
    /// ptxas messages (e.g. `C7514`) no module's compile may print: what the compiler did to
    /// the source that the source does not say (a wgmma pipeline serialized, a wait injected).
    #[serde(default)]
    pub ptxas_must_not_say: Vec<String>,
    pub variants: VariantSwitch,
    pub supports: Supports,
    pub tiles: Tiles,
    pub numerics: Numerics,
    /// Resource limits of every entry of this kernel, where they differ from the gates file's
    /// (which were set for the default kernel).
    #[serde(default)]
    pub resources: Option<crate::gates::ResourceGates>,
    /// Its planted bugs (`MUTANT_*` blocks of its source), each of which `selftest` must catch.
    #[serde(default)]
    pub mutants: Vec<crate::mutants::Mutant>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Abi {
    /// Q, K, V as device pointers.
    Pointers,
    /// Q, K, V as 3-D TMA descriptors built on the host.
    TensorMaps,
    /// Q, K, V as device pointers, and after the workspace the address of K's and V's tensor
    /// maps in device memory (Stage C, whose D 128 bodies load K and V by TMA).
    PointersAndKvMaps,
}

impl Abi {
    /// The manifest's spelling.
    pub fn name(self) -> &'static str {
        match self {
            Abi::Pointers => "pointers",
            Abi::TensorMaps => "tensor-maps",
            Abi::PointersAndKvMaps => "pointers-and-kv-maps",
        }
    }

    /// The parameters of every entry point, in order: what the launch passes (a map by value
    /// is 128 bytes, 64-byte aligned; every other parameter a scalar or a pointer).
    pub fn params(self) -> Vec<Param> {
        let scalars = std::iter::repeat_n(Param::Scalar, 11); // scales, out, sizes, causal, scale
        let pointers = std::iter::repeat_n(Param::Scalar, 3).chain(scalars.clone());
        match self {
            Abi::TensorMaps => std::iter::repeat_n(Param::Map, 3).chain(scalars).collect(),
            Abi::Pointers => pointers.chain([Param::Scalar]).collect(), // the workspace
            // The workspace, then the maps' address.
            Abi::PointersAndKvMaps => pointers.chain([Param::Scalar; 2]).collect(),
        }
    }
}

/// One parameter of an entry point, as the PTX declares it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Param {
    /// A scalar or a pointer.
    Scalar,
    /// A tensor map passed by value: `.param .align 64 .b8 NAME[128]`.
    Map,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Runner {
    /// The runner builds, checks and times it.
    Checked,
    /// Checked by its probe script only: the runner's emulation and error model do not
    /// model its numerics yet, so the runner refuses it rather than misjudge it.
    Probe,
}

/// The A/B of one build-time switch.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VariantSwitch {
    pub define: String,
    pub baseline: VariantValue,
    pub candidate: VariantValue,
    /// An instruction the candidate's PTX holds and the baseline's does not.
    #[serde(default)]
    pub proof_instruction: Option<String>,
    /// A `__constant__ int` the module publishes, equal to the define's value.
    pub proof_constant: String,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VariantValue {
    pub name: String,
    pub value: String,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Supports {
    pub head_dims: Vec<usize>,
    pub causal: bool,
    /// H_kv < H_q.
    pub gqa: bool,
    /// S_q != S_k.
    pub sq_ne_sk: bool,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tiles {
    /// Query rows per CTA; absent when a define chooses it (the module publishes SDPA_BLOCK_M).
    #[serde(default)]
    pub block_m: Option<u32>,
    /// The D = 128 entry's query rows per CTA where they differ from `block_m` (the module
    /// publishes SDPA_BLOCK_M_D128): a kernel whose tiles follow the head dim.
    #[serde(default)]
    pub block_m_d128: Option<u32>,
    /// Keys per KV tile (SDPA_BLOCK_N).
    pub block_n: u32,
    /// Chains a row's KV tiles are dealt to in the default build (the cpu backend's; a GPU run
    /// follows the module's published SDPA_KV_SPLIT).
    #[serde(default = "one")]
    pub kv_split: usize,
    /// A narrower query tile the D = 64 (D = 128) entry also runs, where the module publishes
    /// SDPA_NARROW_ROWS_D64 (_D128): the launch takes it where its CTAs end sooner
    /// (src/backend/cuda/launch.rs `QueryTile::choose`).
    #[serde(default)]
    pub narrow_d64: Option<NarrowTile>,
    #[serde(default)]
    pub narrow_d128: Option<NarrowTile>,
    /// The shorter query tile an unmasked launch of the D = 64 (D = 128) entry's own tile may
    /// run beside it, one unit of the module's SDPA_MIXED_UNIT_ROWS short, and its CTA's time
    /// (src/backend/cuda/launch.rs `mixed_plan`).
    #[serde(default)]
    pub mixed_d64: Option<NarrowTile>,
    #[serde(default)]
    pub mixed_d128: Option<NarrowTile>,
}

impl Tiles {
    /// The narrower query tile of head dim `d`, if the manifest names one.
    pub fn narrow(&self, d: usize) -> Option<&NarrowTile> {
        match d {
            64 => self.narrow_d64.as_ref(),
            128 => self.narrow_d128.as_ref(),
            _ => None,
        }
    }

    /// The shorter tile of a mixed launch of head dim `d`, if the manifest names one.
    pub fn mixed(&self, d: usize) -> Option<&NarrowTile> {
        match d {
            64 => self.mixed_d64.as_ref(),
            128 => self.mixed_d128.as_ref(),
            _ => None,
        }
    }
}

/// A narrower query tile: its rows and a CTA's time relative to one of the entry's own tiles
/// (each CTA on an SM of its own or sharing it as the driver's occupancy allows), measured.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NarrowTile {
    pub rows: u32,
    pub cta_time: f64,
}

/// A query tile the runner takes: whole MMA tiles, within src/rows.rs's memory bound.
fn query_tile(m: u32) -> bool {
    let m = m as usize;
    (crate::rows::MIN_QUERY_TILE..=crate::rows::MAX_QUERY_TILE).contains(&m) && m.is_multiple_of(16)
}

fn one() -> usize {
    1
}

/// What the emulation and the error model follow (docs/DESIGN.md "Kernel manifest").
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Numerics {
    /// The format P is rounded to before P·V.
    pub p_precision: PPrecision,
    /// Depth of one tensor-core step of Q·Kᵀ and P·V (16: mma m16n8k16; 32: wgmma k32 at FP8).
    pub mma_k: usize,
    /// Whether the row sum l adds the rounded P or the f32 P before rounding, and where.
    pub row_sum: RowSum,
    /// How a tile's P·V reaches O.
    pub pv: PvAccumulation,
    /// What the tensor cores keep of a product's running sum between `mma_k`-deep steps.
    pub accumulator: Accumulator,
    /// How the softmax scale meets the scores (default `scaled`).
    #[serde(default)]
    pub score: ScoreScale,
    /// How far (log2 units) a tile's maximum must pass the running maximum m before m moves
    /// to it and O and l are rescaled (default 0: the exact running maximum). Above 0 a weight
    /// exp2(s − m) may reach 2^threshold (FlashAttention-4's conditional rescale; Stage C's 8,
    /// change 32). The kernel publishes its own as SDPA_RESCALE_THRESHOLD (0 where absent).
    #[serde(default)]
    pub rescale_threshold: u32,
}

/// The largest `rescale_threshold` the error model admits: weights below 2^9 stay well inside
/// f16's range, and the f16 rounding of P is proven on [0, 2^9) (src/emulation/mod.rs).
pub const MAX_RESCALE_THRESHOLD: u32 = 8;

/// Stage C's numerics (since change 32) and keys per tile: the only ones Stage C's
/// step-for-step error model bounds (src/reference/bound.rs), and what
/// `emulation::Algorithm::STAGE_C` is built from.
pub const STAGE_C_NUMERICS: Numerics = Numerics {
    p_precision: PPrecision::F16,
    mma_k: 16,
    row_sum: RowSum::Mma,
    pv: PvAccumulation::Running,
    accumulator: Accumulator::F32,
    score: ScoreScale::Fused,
    rescale_threshold: 8,
};
pub const STAGE_C_BLOCK_N: u32 = 64;

impl Numerics {
    /// Whether these numerics, with tiles of `block_n` keys, are Stage C's, whatever their
    /// rescale threshold (Stage C's step model bounds each up to [`MAX_RESCALE_THRESHOLD`]: a
    /// lagging maximum only makes the weights larger, src/reference/bound.rs).
    pub fn is_stage_c(&self, block_n: u32) -> bool {
        let with_stage_c_threshold = Numerics {
            rescale_threshold: STAGE_C_NUMERICS.rescale_threshold,
            ..self.clone()
        };
        block_n == STAGE_C_BLOCK_N && with_stage_c_threshold == STAGE_C_NUMERICS
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Deserialize, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ScoreScale {
    /// s = acc · scale rounded to f32, the row maximum over s, p = exp2(s − m).
    #[default]
    Scaled,
    /// The row maximum over the unscaled acc, m = max(m_old, max · scale), p = exp2(fma(acc,
    /// scale, −m)): one rounding fewer a score and one instruction fewer an element.
    Fused,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Accumulator {
    /// f32, rounded to nearest (mma.sync with f16 operands).
    F32,
    /// 13 fraction bits, truncated, after each step (Hopper's FP8 tensor cores: about 14 bits
    /// kept, DeepSeek-V3 §3.3.2; SageAttention2's "FP22").
    Fp22,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum PPrecision {
    F16,
    E4m3,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum RowSum {
    /// l sums P as rounded to `p_precision` (the weights P·V used), each of the four lanes of
    /// a row's quad its own share in f32, the shares added at the end.
    RoundedP,
    /// l sums the f32 P before rounding (FlashAttention-3's FP8 path), as `RoundedP` does.
    F32P,
    /// l is P·1 on the tensor cores: the rounded P against a column of ones, in the steps,
    /// precision and accumulation (`pv`, `accumulator`) of P·V, as one more column of O.
    Mma,
}

impl RowSum {
    /// The manifest's spelling.
    pub fn name(self) -> &'static str {
        match self {
            RowSum::RoundedP => "rounded-p",
            RowSum::F32P => "f32-p",
            RowSum::Mma => "mma",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum PvAccumulation {
    /// O = O · alpha, then each k-step's P·V added to O in f32.
    Running,
    /// A tile's P·V summed in an accumulator of its own, then O = fma(O, alpha, Ô) in f32.
    PerTile,
}

/// What `--kernel` named: a manifest kernel, with the file that holds its source.
#[derive(Debug, Clone, PartialEq)]
pub struct Chosen {
    pub spec: KernelSpec,
    pub path: PathBuf,
}

impl Manifest {
    /// Reads and validates `cuda/kernels.toml` (or another file).
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = crate::json::read_text(path)?;
        Self::parse(path, &text)
    }

    pub fn parse(path: &Path, text: &str) -> Result<Self, ConfigError> {
        let mut m: Manifest = toml::from_str(text).map_err(|e| {
            let message = e.message().to_string();
            let key = e.span().and_then(|s| text.get(s)).map_or_else(
                || "?".to_string(),
                |t| t.lines().next().unwrap_or("").to_string(),
            );
            ConfigError::invalid_key(path, key, message)
        })?;
        m.path = path.to_path_buf();
        m.validate()?;
        Ok(m)
    }

    fn validate(&self) -> Result<(), ConfigError> {
        let bad = |key: String, msg: String| Err(ConfigError::invalid_key(&self.path, key, msg));
        if self.kernels.is_empty() {
            return bad("kernel".into(), "the manifest names no kernel".into());
        }
        for (i, k) in self.kernels.iter().enumerate() {
            let at = |field: &str| format!("kernel[{i}] ({}).{field}", k.name);
            if let Some(problem) = k.problem() {
                let (field, msg) = problem;
                return bad(at(field), msg);
            }
            if self.kernels[..i].iter().any(|o| o.name == k.name) {
                return bad(at("name"), format!("`{}` is named twice", k.name));
            }
            if self.kernels[..i].iter().any(|o| o.source == k.source) {
                return bad(at("source"), format!("`{}` is described twice", k.source));
            }
        }
        if self.get(&self.default).is_none() {
            return bad(
                "default".into(),
                format!(
                    "`{}` is not a kernel of the manifest ({})",
                    self.default,
                    self.names()
                ),
            );
        }
        if self.get(&self.default).map(|k| k.runner) != Some(Runner::Checked) {
            return bad(
                "default".into(),
                "the default kernel must be runner = \"checked\"".into(),
            );
        }
        Ok(())
    }

    pub fn get(&self, name: &str) -> Option<&KernelSpec> {
        self.kernels.iter().find(|k| k.name == name)
    }

    pub fn names(&self) -> String {
        self.kernels
            .iter()
            .map(|k| k.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Resolves `--kernel`: absent, the default kernel; a manifest name, that kernel; anything
    /// else, a file, described by the kernel whose source has its file name (else the
    /// default's: a copy of a kernel under another name is that kernel changed).
    pub fn choose(&self, arg: Option<&Path>, cuda_dir: &Path) -> Result<Chosen, ConfigError> {
        let by_name = |name: &str| self.get(name);
        let spec = match arg {
            None => by_name(&self.default).expect("validated"),
            Some(p) => match p.to_str().and_then(by_name) {
                Some(spec) => spec,
                None => {
                    let file = p.file_name().and_then(|f| f.to_str()).unwrap_or("");
                    if !p.exists() {
                        return Err(ConfigError::Usage(format!(
                            "--kernel `{}` is neither a kernel of {} ({}) nor an existing file; \
                             `sdpa-runner kernels` lists them",
                            p.display(),
                            self.path.display(),
                            self.names()
                        )));
                    }
                    if p.is_dir() {
                        return Err(ConfigError::Usage(format!(
                            "--kernel `{}` is a folder, not a kernel source file; name the .cu \
                             file",
                            p.display()
                        )));
                    }
                    if !p.is_file() {
                        return Err(ConfigError::Usage(format!(
                            "--kernel `{}` is not a regular file (a pipe or a device; the kernel \
                             is read more than once); save it as a file",
                            p.display()
                        )));
                    }
                    // A link is described by the file it points to where its own name is none.
                    let target = p.canonicalize().ok();
                    let target_file = target
                        .as_deref()
                        .and_then(|t| t.file_name())
                        .and_then(|f| f.to_str())
                        .unwrap_or("");
                    let named = |f: &str| self.kernels.iter().find(|k| k.source == f);
                    let spec = match named(file).or_else(|| named(target_file)) {
                        Some(spec) => spec,
                        None => {
                            let assumed = by_name(&self.default).expect("validated");
                            warn_once(&format!(
                                "warning: --kernel `{}`: its file name is no kernel source of {} \
                                 ({}), so it is described as the default kernel, {}; name the file \
                                 after the kernel it is a version of",
                                p.display(),
                                self.path.display(),
                                self.sources(),
                                assumed.name
                            ));
                            assumed
                        }
                    };
                    return Ok(Chosen {
                        spec: spec.clone(),
                        path: p.to_path_buf(),
                    });
                }
            },
        };
        Ok(Chosen {
            spec: spec.clone(),
            path: cuda_dir.join(&spec.source),
        })
    }

    /// The source file names of the kernels, for messages.
    fn sources(&self) -> String {
        let names: Vec<&str> = self.kernels.iter().map(|k| k.source.as_str()).collect();
        names.join(", ")
    }

    /// The kernels that run `shape`, for messages.
    pub fn supporting(&self, shape: &Shape) -> Vec<&str> {
        self.kernels
            .iter()
            .filter(|k| k.unsupported(shape).is_none())
            .map(|k| k.name.as_str())
            .collect()
    }
}

impl KernelSpec {
    /// The gates its variants are held to: the gates file's, with this kernel's own resource
    /// limits for every entry where the manifest states them (`[resources]`).
    pub fn resource_gates(&self, gates: &crate::gates::Gates) -> crate::gates::Gates {
        match &self.resources {
            Some(limits) => gates.with_resources_of_every_entry(limits),
            None => gates.clone(),
        }
    }

    /// Why `shape` is outside what this kernel runs, if it is.
    pub fn unsupported(&self, shape: &Shape) -> Option<String> {
        let s = &self.supports;
        if !s.head_dims.contains(&shape.d) {
            return Some(format!("D = {} (it runs D in {:?})", shape.d, s.head_dims));
        }
        if shape.causal && !s.causal {
            return Some("the causal mask".into());
        }
        if shape.hkv != shape.h && !s.gqa {
            return Some(format!(
                "H_kv = {} < H_q = {} (GQA/MQA)",
                shape.hkv, shape.h
            ));
        }
        if shape.sk != shape.s && !s.sq_ne_sk {
            return Some(format!("S_q = {} != S_k = {}", shape.s, shape.sk));
        }
        None
    }

    /// Refuses a `runner = "probe"` kernel: the runner would misjudge it.
    pub fn require_checked(&self) -> Result<(), ConfigError> {
        match self.runner {
            Runner::Checked => Ok(()),
            Runner::Probe => Err(ConfigError::Usage(format!(
                "kernel `{}` is not checked by the runner yet: its numerics (P rounded to {}, \
                 {}-key tiles) are not modelled by the emulation and the error model, so every \
                 gate would misjudge it. Check it with `{}` on a GPU machine, or run another \
                 kernel (`sdpa-runner kernels`)",
                self.name,
                match self.numerics.p_precision {
                    PPrecision::F16 => "f16",
                    PPrecision::E4m3 => "e4m3",
                },
                self.tiles.block_n,
                self.probe.as_deref().unwrap_or("its probe")
            ))),
        }
    }

    /// The first field that breaks a rule, and the rule.
    fn problem(&self) -> Option<(&'static str, String)> {
        let ident = |s: &str| {
            !s.is_empty()
                && !s.starts_with(|c: char| c.is_ascii_digit())
                && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        };
        let plain_cu = !self.source.contains(['/', '\\']) && self.source.ends_with(".cu");
        let arch_ok = self.arch == "native"
            || self.arch.strip_prefix("sm_").is_some_and(|r| {
                let digits = r.strip_suffix('a').unwrap_or(r);
                !digits.is_empty() && digits.chars().all(|c| c.is_ascii_digit())
            });
        let v = &self.variants;
        // A tile of each head dim below the manifest's own where it names one (else the
        // module's, checked when it loads: backend/cuda/kernel.rs `narrow_not_run`, a warning,
        // the launch then takes its own; launch.rs `mixed_tile`, a launch that does not match
        // mixes nothing), with a CTA time in (0, 1].
        let below_own = |tiles: [(usize, &Option<NarrowTile>); 2]| {
            tiles.into_iter().all(|(d, tile)| {
                tile.is_none_or(|n| {
                    let own = if d == 128 {
                        self.tiles.block_m_d128.or(self.tiles.block_m)
                    } else {
                        self.tiles.block_m
                    };
                    query_tile(n.rows)
                        && own.is_none_or(|m| n.rows < m)
                        && n.cta_time > 0.0
                        && n.cta_time <= 1.0
                })
            })
        };
        let checks: [(bool, &'static str, String); 21] = [
            (
                !self.name.is_empty()
                    && self
                        .name
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '-'),
                "name",
                "a name is letters, digits and '-'".into(),
            ),
            (
                !self.name.ends_with(".cu"),
                "name",
                "a name must not look like a file".into(),
            ),
            (
                plain_cu,
                "source",
                "a .cu file name under cuda/, without folders".into(),
            ),
            (ident(&self.entry), "entry", "a C identifier".into()),
            (
                arch_ok,
                "arch",
                "\"native\" or sm_<digits>[a], e.g. sm_90a".into(),
            ),
            (
                ident(&v.define) && ident(&v.proof_constant),
                "variants",
                "define and proof_constant are C identifiers".into(),
            ),
            (
                v.baseline.name != v.candidate.name && v.baseline.value != v.candidate.value,
                "variants",
                "baseline and candidate differ in name and value".into(),
            ),
            (
                !self.supports.head_dims.is_empty()
                    && self
                        .supports
                        .head_dims
                        .iter()
                        .all(|d| CHECKABLE_HEAD_DIMS.contains(d)),
                "supports.head_dims",
                format!(
                    "a non-empty subset of {CHECKABLE_HEAD_DIMS:?}, the head dims the runner's references implement"
                ),
            ),
            (
                [64, 128].contains(&self.tiles.block_n),
                "tiles.block_n",
                "64 or 128 (the sampled rows cover the edges of 64-key tiles, src/rows.rs)".into(),
            ),
            (
                v.baseline.value.parse::<u32>().is_ok() && v.candidate.value.parse::<u32>().is_ok(),
                "variants",
                "the switch's values are non-negative integers (its published constant must equal them)".into(),
            ),
            (
                (1..=8).contains(&self.tiles.kv_split),
                "tiles.kv_split",
                "1 to 8".into(),
            ),
            (
                [16, 32].contains(&self.numerics.mma_k)
                    && (self.tiles.block_n as usize).is_multiple_of(self.numerics.mma_k),
                "numerics.mma_k",
                "16 or 32, dividing tiles.block_n".into(),
            ),
            (
                self.numerics.row_sum != RowSum::Mma || self.numerics.is_stage_c(self.tiles.block_n),
                "numerics.row_sum",
                "\"mma\" only with Stage C's other numerics (block_n 64, mma_k 16, p_precision \
                 f16, pv running, accumulator f32, score fused): only Stage C's own error model \
                 (src/reference/bound.rs) bounds l summed on the tensor cores; the FP8 \
                 implementation model that bounds any other kernel assumes l summed in f32"
                    .into(),
            ),
            (
                self.numerics.rescale_threshold == 0
                    || (self.numerics.is_stage_c(self.tiles.block_n)
                        && self.numerics.rescale_threshold <= MAX_RESCALE_THRESHOLD),
                "numerics.rescale_threshold",
                format!(
                    "0, or up to {MAX_RESCALE_THRESHOLD} with Stage C's other numerics: only Stage \
                     C's own error model (src/reference/bound.rs) bounds weights above 1 (up to \
                     2^threshold); the FP8 implementation model assumes the exact running maximum"
                ),
            ),
            (
                self.tiles.block_m.is_none_or(query_tile),
                "tiles.block_m",
                "a multiple of 16 (one MMA tile) up to 256".into(),
            ),
            (
                self.tiles
                    .block_m_d128
                    .is_none_or(|m| query_tile(m) && self.tiles.block_m.is_some()),
                "tiles.block_m_d128",
                "a multiple of 16 (one MMA tile) up to 256, beside a block_m".into(),
            ),
            (
                below_own([(64, &self.tiles.narrow_d64), (128, &self.tiles.narrow_d128)]),
                "tiles.narrow_d64 / tiles.narrow_d128",
                "rows: a multiple of 16 below the head dim's block_m (where given); cta_time: \
                 in (0, 1], a narrower CTA's time relative to a CTA of its entry's own rows"
                    .into(),
            ),
            (
                below_own([(64, &self.tiles.mixed_d64), (128, &self.tiles.mixed_d128)]),
                "tiles.mixed_d64 / tiles.mixed_d128",
                "rows: a multiple of 16 below the head dim's block_m (where given); cta_time: \
                 in (0, 1], a shorter CTA's time relative to a CTA of its entry's own rows"
                    .into(),
            ),
            (
                !self.ptx_must_hold.is_empty()
                    && self.ptx_must_hold.iter().all(|s| !s.trim().is_empty()),
                "ptx_must_hold",
                "at least one instruction that proves the module is this kernel".into(),
            ),
            (
                (self.runner == Runner::Probe) == self.probe.is_some(),
                "probe",
                "a runner = \"probe\" kernel names its probe command, and only such a kernel"
                    .into(),
            ),
            (
                self.mutants.iter().flat_map(|m| &m.hooks).all(|h| {
                    !h.is_empty()
                        && !h.starts_with("MUTANT_")
                        && h.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '=')
                }),
                "mutants.hooks",
                "test-hook defines such as TMA_ISSUE_LATE (NAME or NAME=VALUE), never a MUTANT_* \
                 (the self-test strips those blocks from the clean build)"
                    .into(),
            ),
        ];
        checks
            .into_iter()
            .find(|(ok, _, _)| !ok)
            .map(|(_, field, msg)| (field, msg))
    }
}

/// Prints `message` on stderr the first time only (the kernel is chosen several times per
/// command).
fn warn_once(message: &str) {
    static WARNED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if !WARNED.swap(true, std::sync::atomic::Ordering::Relaxed) {
        eprintln!("{message}");
    }
}

/// A kernel of the project's own manifest (cuda/kernels.toml), for tests.
#[cfg(test)]
pub(crate) fn project_spec(name: &str) -> KernelSpec {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("cuda")
        .join(MANIFEST_FILE);
    Manifest::load(&path).unwrap().get(name).unwrap().clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn project_manifest() -> Manifest {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("cuda")
            .join(MANIFEST_FILE);
        Manifest::load(&path).unwrap()
    }

    #[test]
    fn a_row_sums_name_is_the_manifests_own_spelling() {
        // Messages quote `name()` back at the manifest's author: it must be what serde reads.
        for r in [RowSum::RoundedP, RowSum::F32P, RowSum::Mma] {
            assert_eq!(
                serde_json::to_string(&r).unwrap(),
                format!("\"{}\"", r.name())
            );
        }
    }

    #[test]
    fn each_abi_lists_the_parameters_its_entries_take_in_order() {
        use Param::{Map, Scalar};
        let pointers = Abi::Pointers.params();
        assert_eq!(pointers, vec![Scalar; 15]);
        let mut with_maps = pointers.clone();
        with_maps.push(Scalar); // the maps' address
        assert_eq!(Abi::PointersAndKvMaps.params(), with_maps);
        let mut maps_first = vec![Map; 3];
        maps_first.extend([Scalar; 11]);
        assert_eq!(Abi::TensorMaps.params(), maps_first);
        for abi in [Abi::Pointers, Abi::TensorMaps, Abi::PointersAndKvMaps] {
            let spelled: Abi = toml::Value::String(abi.name().into()).try_into().unwrap();
            assert_eq!(spelled, abi);
        }
    }

    #[test]
    fn the_project_manifest_describes_stage_c_as_default_and_stage_d_beside_it() {
        let m = project_manifest();
        assert_eq!(m.default, "stage-c");
        let c = m.get("stage-c").unwrap();
        assert_eq!((c.runner, c.abi), (Runner::Checked, Abi::PointersAndKvMaps));
        assert_eq!(c.variants.define, "USE_CP_ASYNC");
        // Stage C's entry describes the algorithm the emulation's vectorized path, the GPU
        // emulation and Stage C's own error model implement (src/emulation/mod.rs).
        assert_eq!(
            crate::emulation::Algorithm::of(c),
            crate::emulation::Algorithm::STAGE_C
        );
        assert_eq!(
            crate::backend::cuda::variant::VariantSpec::new(true, &[]),
            crate::backend::cuda::variant::VariantSpec::of_switch(&c.variants, true, &[]),
            "the GPU tests' shorthand is the manifest's stage-c switch"
        );
        let d = m.get("stage-d").unwrap();
        assert_eq!(
            (d.runner, d.abi, d.arch.as_str()),
            (Runner::Checked, Abi::TensorMaps, "sm_90a")
        );
        assert_eq!(
            (d.numerics.p_precision, d.numerics.row_sum, d.numerics.pv),
            (PPrecision::E4m3, RowSum::F32P, PvAccumulation::PerTile)
        );
        // Both fuse the scale into the exponent (Stage D change 20, Stage C change 31); Stage
        // C sums l on the tensor cores (change 31), Stage D from the f32 P.
        assert_eq!(
            (d.numerics.score, c.numerics.score),
            (ScoreScale::Fused, ScoreScale::Fused)
        );
        assert_eq!(c.numerics.row_sum, RowSum::Mma);
        assert!(c.numerics.is_stage_c(c.tiles.block_n) && !d.numerics.is_stage_c(d.tiles.block_n));
        assert!(d.resources.is_some() && c.resources.is_none());
        // Each way ptxas says it repaired a wgmma pipeline: an accumulator read early shows as
        // C7514/C7517 without turns after P·V's issue and as C7518 with them (change 21), and
        // too few registers for the pipeline as C7511 (ROW_SUM_MMA=1's D 128 entry, stop 64).
        for code in ["C7511", "C7514", "C7517", "C7518"] {
            assert!(d.ptxas_must_not_say.iter().any(|c| c == code), "{code}");
        }
        // Stage D says how it sums l (its ROW_SUM_MMA switch), so that a build the manifest
        // does not describe is refused (backend/cuda/kernel.rs `numerics_mismatch`): a source
        // that stopped publishing it would be judged by nothing.
        let stage_d = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("cuda")
                .join(&d.source),
        )
        .unwrap();
        assert!(stage_d.contains("__constant__ int SDPA_ROW_SUM_MMA = ROW_SUM_MMA;"));
        let cuda = Path::new(env!("CARGO_MANIFEST_DIR")).join("cuda");
        for k in &m.kernels {
            let text = std::fs::read_to_string(cuda.join(&k.source)).unwrap();
            for suffix in ["d64", "d64_causal", "d128", "d128_causal"] {
                assert!(
                    text.contains(&format!("{}_{suffix}", k.entry)),
                    "{} {suffix}",
                    k.name
                );
            }
            assert!(text.contains(&k.variants.define), "{}", k.name);
            assert!(text.contains(&k.variants.proof_constant), "{}", k.name);
        }
    }

    #[test]
    fn kernel_resolves_names_and_existing_files_and_refuses_a_missing_file_or_a_folder() {
        let m = project_manifest();
        let cuda = Path::new("/x/cuda");
        let none = m.choose(None, cuda).unwrap();
        assert_eq!(
            (none.spec.name.as_str(), none.path.as_path()),
            ("stage-c", Path::new("/x/cuda/sdpa_fp8_stage_c_mma.cu"))
        );
        let d = m.choose(Some(Path::new("stage-d")), cuda).unwrap();
        assert_eq!(d.path, Path::new("/x/cuda/sdpa_fp8_stage_d_wgmma.cu"));
        // A file is described by the kernel of the same file name, else by the default.
        let dir = tempfile::tempdir().unwrap();
        let (copy_path, mine) = (
            dir.path().join("sdpa_fp8_stage_d_wgmma.cu"),
            dir.path().join("mine.cu"),
        );
        std::fs::write(&copy_path, "").unwrap();
        std::fs::write(&mine, "").unwrap();
        let copy = m.choose(Some(&copy_path), cuda).unwrap();
        assert_eq!(copy.spec.name, "stage-d");
        let other = m.choose(Some(&mine), cuda).unwrap();
        assert_eq!(
            (other.spec.name.as_str(), other.path.as_path()),
            ("stage-c", mine.as_path())
        );
        // A path that names no file, or a folder, is refused: never the default in its place.
        let gone = dir.path().join("sdpa_fp8_stage_d_wgmma_v2.cu");
        let err = m.choose(Some(&gone), cuda).unwrap_err().to_string();
        assert!(err.contains("nor an existing file"), "{err}");
        let err = m.choose(Some(dir.path()), cuda).unwrap_err().to_string();
        assert!(err.contains("a folder, not a kernel source file"), "{err}");
        #[cfg(unix)]
        {
            // A link of another name is described by its target's name; a device is refused.
            let link = dir.path().join("link.cu");
            std::os::unix::fs::symlink(&copy_path, &link).unwrap();
            assert_eq!(m.choose(Some(&link), cuda).unwrap().spec.name, "stage-d");
            let err = m
                .choose(Some(Path::new("/dev/null")), cuda)
                .unwrap_err()
                .to_string();
            assert!(err.contains("not a regular file"), "{err}");
        }
        let err = m
            .choose(Some(Path::new("stage-x")), cuda)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("stage-c, stage-d") && err.contains("sdpa-runner kernels"),
            "{err}"
        );
    }

    #[test]
    fn a_probe_only_kernel_is_refused_by_the_runner_with_its_probe_named() {
        let m = project_manifest();
        assert!(m.get("stage-c").unwrap().require_checked().is_ok());
        assert!(m.get("stage-d").unwrap().require_checked().is_ok());
        let probe_only = KernelSpec {
            runner: Runner::Probe,
            probe: Some("scripts/stage_d/probe.sh check".into()),
            ..m.get("stage-d").unwrap().clone()
        };
        assert_eq!(probe_only.problem(), None, "a valid entry");
        let err = probe_only.require_checked().unwrap_err().to_string();
        assert!(
            err.contains("stage-d")
                && err.contains("e4m3")
                && err.contains("scripts/stage_d/probe.sh"),
            "{err}"
        );
    }

    #[test]
    fn an_unsupported_problem_names_the_rule_and_the_kernels_that_run_it() {
        let m = project_manifest();
        let mut shape = Shape::new("x", 1, 2, 64, 64);
        assert!(m.get("stage-c").unwrap().unsupported(&shape).is_none());
        let mut narrow = m.get("stage-c").unwrap().clone();
        narrow.supports = Supports {
            head_dims: vec![64],
            causal: false,
            gqa: false,
            sq_ne_sk: false,
        };
        shape.d = 128;
        assert!(narrow.unsupported(&shape).unwrap().contains("D = 128"));
        shape.d = 64;
        shape.causal = true;
        assert!(narrow.unsupported(&shape).unwrap().contains("causal"));
        shape.causal = false;
        shape.hkv = 1;
        assert!(narrow.unsupported(&shape).unwrap().contains("GQA"));
        shape.hkv = 2;
        shape.sk = 65;
        assert!(
            narrow
                .unsupported(&shape)
                .unwrap()
                .contains("S_q = 64 != S_k = 65")
        );
        assert_eq!(m.supporting(&shape), vec!["stage-c", "stage-d"]);
    }

    fn edited(from: &str, to: &str) -> String {
        let text = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("cuda")
                .join(MANIFEST_FILE),
        )
        .unwrap();
        assert!(text.contains(from), "{from}");
        text.replacen(from, to, 1)
    }

    #[test]
    fn a_narrow_tile_is_held_below_the_manifests_block_m_only_where_it_names_one() {
        // Stage C names no block_m (its module publishes its tiles, which follow the build's
        // grid): its 32-row D 128 companion tile is left to the module's check at load.
        let m = Manifest::parse(Path::new("k.toml"), &edited("", "")).unwrap();
        let stage_c = m.kernels.iter().find(|k| k.name == "stage-c").unwrap();
        assert_eq!(stage_c.tiles.block_m, None);
        assert_eq!(stage_c.tiles.narrow(128).map(|n| n.rows), Some(32));
        // Where the manifest names the tile, a narrower one must lie below it.
        let pinned = edited(
            "narrow_d128 = { rows = 32, cta_time = 0.64 }",
            "block_m = 32\nblock_m_d128 = 32\nnarrow_d128 = { rows = 32, cta_time = 0.64 }",
        );
        let err = Manifest::parse(Path::new("k.toml"), &pinned)
            .unwrap_err()
            .to_string();
        assert!(err.contains("tiles.narrow_d128"), "{err}");
    }

    #[test]
    fn a_stage_c_manifest_without_a_rescale_threshold_is_stage_c_at_the_exact_maximum() {
        // A base from before change 32 (`--base-kernel git:REV`) has no rescale_threshold: it
        // must load as Stage C, with the exact running maximum, and any threshold up to 8 too.
        for (line, threshold) in [
            ("", 0),
            ("rescale_threshold = 4\n", 4),
            ("rescale_threshold = 8\n", 8),
        ] {
            let m = Manifest::parse(
                Path::new("k.toml"),
                &edited("rescale_threshold = 8\n", line),
            )
            .unwrap();
            let c = m.get("stage-c").unwrap();
            assert_eq!(c.numerics.rescale_threshold, threshold);
            assert!(c.numerics.is_stage_c(c.tiles.block_n));
            let alg = crate::emulation::Algorithm::of(c);
            assert!(alg.is_stage_c() && alg.rescale_threshold == threshold);
        }
    }

    #[test]
    fn a_broken_manifest_is_refused_naming_the_key() {
        let cases = [
            ("default = \"stage-c\"", "default = \"stage-z\"", "default"),
            (
                "runner = \"checked\"\n",
                "runner = \"probe\"\nprobe = \"x.sh\"\n",
                "the default kernel must be runner = \"checked\"",
            ),
            (
                "entry = \"sdpa_fp8_stage_c_mma\"",
                "entry = \"sdpa-fp8\"",
                "entry",
            ),
            ("name = \"stage-d\"", "name = \"stage-c\"", "named twice"),
            (
                "source = \"sdpa_fp8_stage_d_wgmma.cu\"",
                "source = \"../x.cu\"",
                "source",
            ),
            ("arch = \"sm_90a\"", "arch = \"hopper\"", "arch"),
            (
                "head_dims = [64, 128]",
                "head_dims = [64, 256]",
                "head_dims",
            ),
            (
                "candidate = { name = \"cp1\", value = \"1\" }",
                "candidate = { name = \"cp0\", value = \"1\" }",
                "variants",
            ),
            ("block_n = 64", "block_n = 65", "block_n"),
            ("block_m = 192", "block_m = 512", "tiles.block_m"),
            ("block_m = 192\n", "", "tiles.block_m_d128"),
            (
                "block_m_d128 = 192",
                "block_m_d128 = 24",
                "tiles.block_m_d128",
            ),
            (
                "narrow_d128 = { rows = 128, cta_time = 0.76 }",
                "narrow_d128 = { rows = 192, cta_time = 0.76 }",
                "tiles.narrow_d64 / tiles.narrow_d128",
            ),
            (
                "narrow_d64 = { rows = 64, cta_time = 0.8 }",
                "narrow_d64 = { rows = 192, cta_time = 0.8 }",
                "tiles.narrow_d64",
            ),
            (
                "narrow_d64 = { rows = 64, cta_time = 0.8 }",
                "narrow_d64 = { rows = 64, cta_time = 1.5 }",
                "tiles.narrow_d64",
            ),
            (
                "narrow_d64 = { rows = 64, cta_time = 0.8 }",
                "narrow_d64 = { rows = 64 }",
                "cta_time",
            ),
            (
                "mixed_d64 = { rows = 128, cta_time = 0.88 }",
                "mixed_d64 = { rows = 192, cta_time = 0.88 }",
                "tiles.mixed_d64",
            ),
            (
                "mixed_d128 = { rows = 128, cta_time = 0.89 }",
                "mixed_d128 = { rows = 128, cta_time = 0 }",
                "tiles.mixed_d64 / tiles.mixed_d128",
            ),
            ("p_precision = \"f16\"", "p_precision = \"bf16\"", "bf16"),
            (
                "runner = \"checked\"",
                "runner = \"checked\"\nspeed = 1",
                "speed",
            ),
            ("runner = \"checked\"\n", "runner = \"probe\"\n", "probe"),
            ("mma_k = 16", "mma_k = 24", "mma_k"),
            ("row_sum = \"mma\"", "row_sum = \"p\"", "f32-p"),
            // l on the tensor cores beside Stage D's FP8 numerics: no model bounds it.
            (
                "row_sum = \"f32-p\"",
                "row_sum = \"mma\"",
                "only Stage C's own error model",
            ),
            ("score = \"fused\"", "score = \"fma\"", "scaled"),
            // Above the largest threshold the model admits, and beside Stage D's numerics.
            (
                "rescale_threshold = 8",
                "rescale_threshold = 9",
                "numerics.rescale_threshold",
            ),
            (
                "score = \"fused\"\n\n# One CTA",
                "score = \"fused\"\nrescale_threshold = 8\n\n# One CTA",
                "numerics.rescale_threshold",
            ),
            ("kv_split = 2", "kv_split = 0", "kv_split"),
            (
                "hooks = [\"TMA_ISSUE_LATE\"]",
                "hooks = [\"MUTANT_TMA_PARITY_FLIPPED\"]",
                "mutants.hooks",
            ),
            (
                "shapes = \"mission,partial300,cfg-chunk\"",
                "shape = \"mission\"",
                "shape",
            ),
        ];
        for (from, to, says) in cases {
            let err = Manifest::parse(Path::new("k.toml"), &edited(from, to))
                .unwrap_err()
                .to_string();
            assert!(err.contains("k.toml") && err.contains(says), "{to}: {err}");
        }
    }
}
