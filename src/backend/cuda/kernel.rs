//! The kernel source and the build of one variant: NVRTC compile, then the identity checks
//! that refuse a module which is not what was asked for (exit 4).

use std::path::{Path, PathBuf};

use super::identity::{
    CompanionIdentity, EntryIdentity, KernelConstants, PtxasReport, Toggle, VariantIdentity,
    ptx_code, ptx_has_cp_async,
};
use super::nvrtc::{self, Compiled};
use super::revision;
use super::variant::VariantSpec;
use crate::backend::BackendError;
use crate::kernels::{Abi, KernelSpec, Param, RowSum};
use crate::report::sha256_hex;
use crate::rows::{MAX_QUERY_TILE, MIN_QUERY_TILE};
use crate::schema::KernelRef;
use crate::shapes::Entry;

/// The entry point of one instantiation of a kernel whose entries are named `prefix`:
/// `<prefix>_d64`, `<prefix>_d128_causal`, ... (docs/DESIGN.md "Kernel ABI").
pub fn entry_for(prefix: &str, e: Entry) -> String {
    format!("{prefix}_{}", e.suffix())
}

/// The companion of entry `e` that runs query tiles of `rows` rows, in the entry's module:
/// `<entry>_m<rows>` (cuda/sdpa_fp8_stage_d_wgmma.cu `COMPANION_D<D>`).
pub fn companion_for(prefix: &str, e: Entry, rows: u32) -> String {
    format!("{}_m{rows}", entry_for(prefix, e))
}

/// The architecture a kernel is compiled for on a GPU of architecture `gpu_arch` (`sm_90`):
/// the GPU's own for `arch = "native"`, else the manifest's fixed target, which must be for
/// that GPU (`sm_90a` runs on `sm_90` only).
pub fn target_arch(spec: &KernelSpec, gpu_arch: &str) -> Result<String, BackendError> {
    if spec.arch == "native" {
        return Ok(gpu_arch.to_string());
    }
    if spec.arch.trim_end_matches('a') == gpu_arch.trim_end_matches('a') {
        return Ok(spec.arch.clone());
    }
    Err(BackendError::Config(format!(
        "kernel `{}` is built for {} (cuda/kernels.toml), which this GPU ({gpu_arch}) cannot \
         run; run it on a GPU of that architecture, or run another kernel (`sdpa-runner kernels`)",
        spec.name, spec.arch
    )))
}

/// Where a kernel comes from: a file, or a file at a git revision (`git:REV[:PATH]`, PATH
/// relative to the repository root, by default the chosen kernel's source under cuda/).
#[derive(Debug, Clone, PartialEq)]
pub enum KernelLocation {
    File(PathBuf),
    Git { rev: String, path: Option<String> },
}

impl KernelLocation {
    /// Parses `--base-kernel`: `git:REV`, `git:REV:PATH` or a file path.
    pub fn parse(text: &str) -> Result<Self, String> {
        let Some(rest) = text.strip_prefix("git:") else {
            if text.trim().is_empty() {
                return Err("name a kernel file or git:REV".into());
            }
            return Ok(KernelLocation::File(PathBuf::from(text)));
        };
        let (rev, path) = match rest.split_once(':') {
            Some((rev, path)) => (rev, Some(path.to_string())),
            None => (rest, None),
        };
        if rev.is_empty() || path.as_deref() == Some("") {
            return Err(format!(
                "`{text}`: write git:REV or git:REV:PATH, e.g. git:origin/main"
            ));
        }
        Ok(KernelLocation::Git {
            rev: rev.to_string(),
            path,
        })
    }
}

/// A kernel source, read once, with where its `#include "..."` lines resolve: folders on
/// disk, or headers held in memory (a git revision's).
#[derive(Debug, Clone)]
pub struct KernelSource {
    pub path: PathBuf,
    /// As reports name it: the file's path, or `git:REV (commit):PATH`.
    pub origin: String,
    pub text: String,
    /// Of the kernel file's text.
    pub sha256: String,
    pub include_dirs: Vec<PathBuf>,
    /// (include name, text) given to NVRTC in memory.
    pub headers: Vec<(String, String)>,
    /// Its manifest entry (cuda/kernels.toml): entries, target, launch ABI, the A/B switch and
    /// its proofs, tiles, numerics, and the instructions every module's PTX must hold.
    pub spec: KernelSpec,
}

impl KernelSource {
    /// Reads `path`, described by `spec`; its own folder and the project's cuda/ folder serve
    /// local includes.
    pub fn load(
        path: &Path,
        project_cuda_dir: &Path,
        spec: &KernelSpec,
    ) -> Result<Self, BackendError> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            BackendError::Config(format!(
                "cannot read the kernel source {}: {e}; pass --kernel FILE or run from the checkout",
                path.display()
            ))
        })?;
        let mut include_dirs = vec![];
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            include_dirs.push(dir.to_path_buf());
        }
        if !include_dirs.iter().any(|d| d == project_cuda_dir) {
            include_dirs.push(project_cuda_dir.to_path_buf());
        }
        Ok(KernelSource {
            path: path.to_path_buf(),
            origin: path.display().to_string(),
            sha256: sha256_hex(text.as_bytes()),
            text,
            include_dirs,
            headers: Vec::new(),
            spec: spec.clone(),
        })
    }

    /// Reads the kernel at `location`: a file (as [`KernelSource::load`]) or a file of the
    /// repository at `repo` as it is at a revision, with the headers of that revision only. A
    /// file is described by `spec` (a base kernel is the same kernel at another revision); a
    /// revision by the entry of `spec`'s name in that revision's own manifest, where it has
    /// one, since a change may move the kernel and its description together (its tiles, say),
    /// and else by `spec`.
    pub fn locate(
        location: &KernelLocation,
        repo: &Path,
        project_cuda_dir: &Path,
        spec: &KernelSpec,
    ) -> Result<Self, BackendError> {
        match location {
            KernelLocation::File(path) => Self::load(path, project_cuda_dir, spec),
            KernelLocation::Git { rev, path } => {
                let path = path
                    .clone()
                    .unwrap_or_else(|| format!("cuda/{}", spec.source));
                let files = revision::read(repo, rev, &path).map_err(BackendError::Config)?;
                let spec = spec_at_revision(repo, &files.commit, spec)?;
                Ok(KernelSource {
                    origin: format!("git:{rev} ({}):{path}", &files.commit[..12]),
                    path: PathBuf::from(path),
                    sha256: sha256_hex(files.text.as_bytes()),
                    text: files.text,
                    include_dirs: Vec::new(),
                    headers: files.headers,
                    spec,
                })
            }
        }
    }
}

/// How the manifest at `commit` describes the kernel named as `spec` is: its own entry of that
/// name, or `spec` where the commit has no manifest, no such entry or a manifest this runner
/// cannot read (an older schema; a warning says so): a revision from before either is
/// described as the kernel is today. The A/B switch stays `spec`'s: the base's variants are the
/// candidate's (`VariantSpec::of_base`), built and proven by today's define and constant.
fn spec_at_revision(
    repo: &Path,
    commit: &str,
    spec: &KernelSpec,
) -> Result<KernelSpec, BackendError> {
    let path = format!("cuda/{}", crate::kernels::MANIFEST_FILE);
    let Some(text) = revision::read_text(repo, commit, &path).map_err(BackendError::Config)? else {
        return Ok(spec.clone());
    };
    let short = &commit[..12.min(commit.len())];
    match crate::kernels::Manifest::parse(Path::new(&format!("{short}:{path}")), &text) {
        Ok(manifest) => Ok(manifest.get(&spec.name).map_or_else(
            || spec.clone(),
            |then| KernelSpec {
                variants: spec.variants.clone(),
                ..then.clone()
            },
        )),
        Err(e) => {
            static WARNED: std::sync::Once = std::sync::Once::new();
            WARNED.call_once(|| {
                eprintln!(
                    "warning: the base revision's manifest is not one this runner reads ({e}); \
                     the base kernel is described as `{}` is today",
                    spec.name
                )
            });
            Ok(spec.clone())
        }
    }
}

/// NVRTC must be loadable before anything is compiled (cudarc panics otherwise).
pub fn require_nvrtc() -> Result<String, BackendError> {
    if !nvrtc::is_available() {
        return Err(BackendError::Environment(
            "NVRTC (libnvrtc.so) could not be loaded: add the CUDA toolkit's library folder \
             (e.g. /usr/local/cuda/lib64) to LD_LIBRARY_PATH"
                .into(),
        ));
    }
    Ok(nvrtc::version().map_or_else(|| "unknown".into(), |(a, b)| format!("{a}.{b}")))
}

/// A compiled variant whose identity has been checked.
#[derive(Clone)]
pub struct BuiltVariant {
    pub spec: VariantSpec,
    /// The manifest entry of the kernel it was built from.
    pub kernel: KernelSpec,
    /// The module of [`Entry::BASE`].
    pub compiled: Compiled,
    /// The modules of the other entries the run's problems need.
    pub others: Vec<(Entry, Compiled)>,
    pub identity: VariantIdentity,
}

/// Compiles one variant for a GPU of architecture `gpu_arch` (for the kernel's target:
/// [`target_arch`]) and checks that the module is what was asked for: the published tiles
/// match the manifest's, which the emulation and the launch follow, and the A/B switch took
/// (its published constant, and its proof instruction where the manifest names one). The
/// variant's identity is its [`Entry::BASE`] module's; the modules of the other `entries`
/// (those the run's problems need) are compiled on threads of their own beside it, checked
/// the same way and recorded beside it (`VariantIdentity::entries`).
pub fn build_variant(
    src: &KernelSource,
    cuda_include: &Path,
    gpu_arch: &str,
    spec: &VariantSpec,
    entries: &[Entry],
) -> Result<BuiltVariant, BackendError> {
    let arch = target_arch(&src.spec, gpu_arch)?;
    let arch = arch.as_str();
    let others: Vec<Entry> = entries
        .iter()
        .copied()
        .filter(|e| *e != Entry::BASE)
        .collect();
    let (compiled, others) = std::thread::scope(|scope| {
        let jobs: Vec<_> = others
            .iter()
            .map(|&e| scope.spawn(move || compile_entry(src, cuda_include, arch, spec, e)))
            .collect();
        let base = compile_entry(src, cuda_include, arch, spec, Entry::BASE);
        let built: Vec<_> = jobs
            .into_iter()
            .map(|job| job.join().expect("an NVRTC compile thread panicked"))
            .collect();
        (base, built)
    });
    let compiled = compiled?;
    let others: Vec<(Entry, Compiled)> = entries
        .iter()
        .copied()
        .filter(|e| *e != Entry::BASE)
        .zip(others)
        .map(|(e, c)| c.map(|c| (e, c)))
        .collect::<Result<_, _>>()?;
    let refuse = |msg: String| {
        BackendError::Kernel(format!("variant {} of {}: {msg}", spec.name, src.origin))
    };
    let code = super::code::identity_of(
        src,
        &spec.define_strings(),
        &entry_options(src, cuda_include, arch, spec, Entry::BASE),
    );
    let switch = &src.spec.variants;
    let constants =
        KernelConstants::from_ptx(&compiled.ptx, &switch.proof_constant).map_err(refuse)?;
    if let Some(why) = tiles_mismatch(&constants, &src.spec) {
        return Err(refuse(why));
    }
    if let Some(why) = numerics_mismatch(&constants, &src.spec) {
        return Err(refuse(why));
    }
    if let Some(why) = narrow_not_run(&constants, &src.spec) {
        // Only slower, never wrong: every launch takes the entry's own tile (e.g. a base
        // from before the narrowing, described by today's entry).
        eprintln!(
            "warning: variant {} of {}: {why}; every launch takes its own query tile",
            spec.name, src.origin
        );
    }
    let mut companions = Vec::new();
    for (e, module) in
        std::iter::once((Entry::BASE, &compiled)).chain(others.iter().map(|(e, c)| (*e, c)))
    {
        let abi = src.spec.abi;
        if let Some(why) = abi_mismatch(&module.ptx, &entry_for(&src.spec.entry, e), abi) {
            return Err(refuse(why));
        }
        if let Some((rows, _)) = constants.companion(e) {
            let name = companion_for(&src.spec.entry, e, rows);
            if let Some(why) = companion_missing(&module.ptx, &name, e, rows) {
                return Err(refuse(why));
            }
            if let Some(why) = abi_mismatch(&module.ptx, &name, abi) {
                return Err(refuse(why));
            }
            companions.push(CompanionIdentity {
                entry: e,
                rows,
                ptxas: PtxasReport::parse(&module.log, &name),
                driver: None,
            });
        }
        if let Some(line) = forbidden_message(&module.log, &src.spec.ptxas_must_not_say) {
            return Err(refuse(format!(
                "ptxas said, compiling its {} module, what cuda/kernels.toml says it must not \
                 (the compiled code is not what the source says): {line}",
                e.suffix()
            )));
        }
        if let Some(missing) = missing_instruction(&module.ptx, &src.spec.ptx_must_hold) {
            return Err(refuse(format!(
                "its {} module's PTX holds no `{missing}`, which cuda/kernels.toml names as proof \
                 that the module is this kernel",
                e.suffix()
            )));
        }
    }
    let toggle = Toggle {
        define: &switch.define,
        value: &spec.defines[0].1,
        constant: &switch.proof_constant,
        instruction: switch.proof_instruction.as_deref(),
        candidate: spec.candidate,
    };
    let mut entry_ids = Vec::new();
    for (e, c) in &others {
        let theirs = KernelConstants::from_ptx(&c.ptx, &switch.proof_constant).map_err(refuse)?;
        if theirs != constants {
            return Err(refuse(format!(
                "its {} module publishes other constants than its {} module ({theirs:?} \
                 against {constants:?}): one variant must launch one geometry",
                e.suffix(),
                Entry::BASE.suffix()
            )));
        }
        toggle
            .check(&spec.name, &format!("its {} module", e.suffix()), &c.ptx)
            .map_err(BackendError::Kernel)?;
        entry_ids.push(EntryIdentity {
            entry: *e,
            ptx_sha256: sha256_hex(c.ptx.as_bytes()),
            ptxas: PtxasReport::parse(&c.log, &entry_for(&src.spec.entry, *e)),
            driver: None,
        });
    }
    let identity = VariantIdentity {
        name: spec.name.clone(),
        defines: spec.define_strings(),
        ptx_sha256: sha256_hex(compiled.ptx.as_bytes()),
        cubin_sha256: sha256_hex(&compiled.cubin),
        ptx_has_cp_async: ptx_has_cp_async(&compiled.ptx),
        constants,
        ptxas: PtxasReport::parse(&compiled.log, &entry_for(&src.spec.entry, Entry::BASE)),
        driver: None,
        entries: entry_ids,
        companions,
        kernel: KernelRef {
            role: spec.role,
            source: src.origin.clone(),
            sha256: src.sha256.clone(),
        },
        ptx_code_sha256: sha256_hex(ptx_code(&compiled.ptx).as_bytes()),
        code,
        machine_code: machine_code_of(
            std::iter::once((Entry::BASE, &compiled.cubin))
                .chain(others.iter().map(|(e, c)| (*e, &c.cubin))),
        ),
    };
    toggle
        .check(&spec.name, "its module", &compiled.ptx)
        .map_err(BackendError::Kernel)?;
    Ok(BuiltVariant {
        spec: spec.clone(),
        kernel: src.spec.clone(),
        compiled,
        others,
        identity,
    })
}

/// Every function of the modules, by its machine code; empty if any CUBIN cannot be read
/// (a comparison then says nothing of the code rather than something of part of it).
fn machine_code_of<'a>(
    modules: impl Iterator<Item = (Entry, &'a Vec<u8>)>,
) -> Vec<crate::schema::FunctionCode> {
    let mut out = Vec::new();
    for (entry, cubin) in modules {
        let Ok(module) = super::machine_code::parse(cubin) else {
            return Vec::new();
        };
        out.extend(super::machine_code::fingerprints(&module).into_iter().map(
            |(function, sha256)| crate::schema::FunctionCode {
                module: entry.suffix(),
                function,
                sha256,
            },
        ));
    }
    out
}

/// Why a module's published tiles are not the ones its manifest entry describes (which the
/// emulation, the sampled check and the launch follow), or are too small for the runner: the
/// keys per KV tile, and the query rows per CTA of each head dim.
fn tiles_mismatch(c: &KernelConstants, spec: &KernelSpec) -> Option<String> {
    let tiles = &spec.tiles;
    let d128 = Entry {
        d: 128,
        ..Entry::BASE
    };
    let want_d128 = tiles.block_m_d128.or(tiles.block_m);
    let block_m_differs = tiles
        .block_m
        .is_some_and(|m| m != c.block_m_of(Entry::BASE))
        || want_d128.is_some_and(|m| m != c.block_m_of(d128));
    if c.block_n != tiles.block_n || block_m_differs {
        let any = |m: Option<u32>| m.map_or_else(|| "(any)".to_string(), |m| m.to_string());
        return Some(format!(
            "the kernel publishes SDPA_BLOCK_M={} (D 128: {}) and SDPA_BLOCK_N={}, but \
             cuda/kernels.toml describes `{}` with block_m {} (D 128: {}) and block_n {}, which \
             the emulation and the launch follow; keep the manifest in step with the kernel",
            c.block_m_of(Entry::BASE),
            c.block_m_of(d128),
            c.block_n,
            spec.name,
            any(tiles.block_m),
            any(want_d128),
            tiles.block_n
        ));
    }
    let range = MIN_QUERY_TILE..=MAX_QUERY_TILE;
    [c.block_m_of(Entry::BASE), c.block_m_of(d128)]
        .into_iter()
        .find(|&m| !range.contains(&(m as usize)))
        .map(|m| {
            format!(
                "the kernel publishes query tiles of {m} rows (SDPA_BLOCK_M, SDPA_BLOCK_M_D128); \
                 the runner takes {MIN_QUERY_TILE} (one MMA tile) to {MAX_QUERY_TILE}, which its \
                 sampled check and host-memory estimate assume (src/rows.rs)"
            )
        })
}

/// Why the numerics a module publishes are not the ones its manifest entry describes, which
/// the emulation and the error model follow: its rescale threshold (SDPA_RESCALE_THRESHOLD, 0
/// where the module publishes none), and whether l is P·1 on the tensor cores
/// (SDPA_ROW_SUM_MMA, where published, against `numerics.row_sum = "mma"`). A build with
/// another `RESCALE_THRESHOLD` or `ROW_SUM_MMA` computes other bits than its emulation would;
/// it needs a manifest entry of its own (`--kernel FILE`).
fn numerics_mismatch(c: &KernelConstants, spec: &KernelSpec) -> Option<String> {
    const FIX: &str = "describe that build in a manifest of its own (--kernel FILE), or take a \
                       base from git (--base-kernel git:REV), which that revision's manifest \
                       describes";
    let want = spec.numerics.rescale_threshold;
    if c.rescale_threshold != want {
        return Some(format!(
            "the kernel publishes SDPA_RESCALE_THRESHOLD={}, but cuda/kernels.toml describes `{}` \
             with numerics.rescale_threshold {want}, which the emulation and the error model \
             follow; {FIX}",
            c.rescale_threshold, spec.name
        ));
    }
    let described = spec.numerics.row_sum == RowSum::Mma;
    c.row_sum_mma.filter(|&mma| mma != described).map(|mma| {
        // Where only the row sum differs from numerics a manifest may not pair with "mma",
        // no manifest can describe the build yet: say so rather than send the user to one.
        let fix = if mma && !spec.numerics.is_stage_c(spec.tiles.block_n) {
            "no manifest can describe that build yet: numerics.row_sum \"mma\" is accepted only \
             with Stage C's other numerics, as the FP8 error model sums l in f32 \
             (src/kernels.rs, src/reference/model.rs); build it without ROW_SUM_MMA"
        } else {
            FIX
        };
        format!(
            "the kernel publishes SDPA_ROW_SUM_MMA={}, but cuda/kernels.toml describes `{}` with \
             numerics.row_sum \"{}\", which the emulation and the error model follow; {fix}",
            u8::from(mma),
            spec.name,
            spec.numerics.row_sum.name()
        )
    })
}

/// Why a narrower query tile the manifest names is not one the module runs (it publishes no
/// such step, or the rows are no multiple of it below its own), or None: the launch then
/// takes the entry's own tile (launch.rs `plan_tiles`), which is only slower.
fn narrow_not_run(c: &KernelConstants, spec: &KernelSpec) -> Option<String> {
    let d128 = Entry {
        d: 128,
        ..Entry::BASE
    };
    [Entry::BASE, d128].into_iter().find_map(|entry| {
        let n = spec.tiles.narrow(entry.d)?;
        c.narrowed(entry, n.rows).is_none().then(|| {
            format!(
                "cuda/kernels.toml gives `{}` a narrower D {d} query tile of {} rows \
                 (tiles.narrow_d{d}), which the kernel does not run (it publishes \
                 SDPA_NARROW_ROWS_D{d} = {} and SDPA_COMPANION_ROWS_D{d} = {} beside its own \
                 {} rows)",
                spec.name,
                n.rows,
                c.narrow_step(entry),
                c.companion(entry).map_or(0, |(rows, _)| rows),
                c.block_m_of(entry),
                d = entry.d,
            )
        })
    })
}

/// Why a module that publishes a companion of `rows` rows for entry `e` is refused: it holds
/// no function `name` (the launch would find none for the tile the manifest names).
fn companion_missing(ptx: &str, name: &str, e: Entry, rows: u32) -> Option<String> {
    (!ptx.contains(&format!(".entry {name}("))).then(|| {
        format!(
            "it publishes a companion of {rows} query rows for its {} entry \
             (SDPA_COMPANION_ROWS_D{d}), but its module has no function `{name}`; define that \
             function in the module, or publish SDPA_COMPANION_ROWS_D{d} = 0",
            e.suffix(),
            d = e.d
        )
    })
}

/// The parameters PTX declares for entry point `name` (None where it has no such entry).
fn entry_params(ptx: &str, name: &str) -> Option<Vec<Param>> {
    let start = ptx.find(&format!(".entry {name}("))?;
    let list = &ptx[start..];
    let list = &list[list.find('(')? + 1..list.find(')')?];
    Some(
        list.split(',')
            .map(str::trim)
            .filter(|p| p.starts_with(".param"))
            .map(|p| {
                if p.contains(".b8") && p.ends_with("[128]") {
                    Param::Map
                } else {
                    Param::Scalar
                }
            })
            .collect(),
    )
}

/// Why entry point `name` of a module cannot be launched by the manifest's `abi`: its
/// parameters are not the first of those the launch passes (a parameter the launch does not
/// pass would be read from past the arguments the driver was given; arguments past the
/// function's last parameter are never read, so an older kernel that takes fewer, e.g. a
/// `--base-kernel` file of Stage C before its K/V maps, still runs).
fn abi_mismatch(ptx: &str, name: &str, abi: Abi) -> Option<String> {
    let Some(theirs) = entry_params(ptx, name) else {
        return Some(format!(
            "its module holds no function `{name}` to check against its abi"
        ));
    };
    let want = abi.params();
    (!want.starts_with(&theirs)).then(|| {
        let show = |ps: &[Param]| {
            let maps = ps.iter().filter(|p| **p == Param::Map).count();
            format!("{} parameters, {maps} of them tensor maps", ps.len())
        };
        format!(
            "its function `{name}` takes {} where cuda/kernels.toml's abi = \"{}\" passes {}, \
             whose first ones it must take; make the entry's parameters the abi's \
             (docs/DESIGN.md \"Kernel ABI\")",
            show(&theirs),
            abi.name(),
            show(&want)
        )
    })
}

/// The first line of a compile log that holds one of `codes` (e.g. `(C7514)`).
fn forbidden_message<'a>(log: &'a str, codes: &[String]) -> Option<&'a str> {
    log.lines()
        .find(|l| codes.iter().any(|c| l.contains(&format!("({c})"))))
        .map(str::trim)
}

/// The first of `instructions` that no instruction line of `ptx` holds (comments and
/// directives do not count).
fn missing_instruction<'a>(ptx: &str, instructions: &'a [String]) -> Option<&'a str> {
    let code = ptx_code(ptx);
    instructions
        .iter()
        .find(|i| {
            !code
                .lines()
                .any(|l| !l.trim_start().starts_with('.') && l.contains(i.as_str()))
        })
        .map(String::as_str)
}

/// The NVRTC options of the module of one variant that holds entry `e` alone.
fn entry_options(
    src: &KernelSource,
    cuda_include: &Path,
    arch: &str,
    spec: &VariantSpec,
    e: Entry,
) -> Vec<String> {
    let mut dirs: Vec<&Path> = vec![cuda_include];
    dirs.extend(src.include_dirs.iter().map(PathBuf::as_path));
    let mut defines = spec.defines.clone();
    defines.push(("SDPA_D".into(), e.d.to_string()));
    defines.push(("SDPA_CAUSAL".into(), u8::from(e.causal).to_string()));
    nvrtc::build_options(arch, &dirs, &defines)
}

/// Compiles the module of one variant that holds entry `e` alone (`SDPA_D`, `SDPA_CAUSAL`),
/// and checks that it has that entry.
fn compile_entry(
    src: &KernelSource,
    cuda_include: &Path,
    arch: &str,
    spec: &VariantSpec,
    e: Entry,
) -> Result<Compiled, BackendError> {
    let options = entry_options(src, cuda_include, arch, spec, e);
    let name = src
        .path
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or(&src.spec.source);
    let compiled = nvrtc::compile_with_headers(&src.text, name, &src.headers, &options).map_err(
        |failure| {
            BackendError::Kernel(format!(
                "variant {} ({}) of {} failed to compile: {failure}",
                spec.name,
                e.suffix(),
                src.origin
            ))
        },
    )?;
    let entry = entry_for(&src.spec.entry, e);
    if !compiled.ptx.contains(&format!(".entry {entry}(")) {
        let prefix = &src.spec.entry;
        return Err(BackendError::Kernel(format!(
            "variant {} of {}: its module for {} has no entry {entry}; kernel `{}` defines \
             `{prefix}_d64`, `{prefix}_d64_causal`, `{prefix}_d128` and `{prefix}_d128_causal` \
             (cuda/kernels.toml)",
            spec.name,
            src.origin,
            e.suffix(),
            src.spec.name
        )));
    }
    crate::trace::mark(|| format!("nvrtc {} {}: built", spec.name, e.suffix()));
    Ok(compiled)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_function_of_every_module_is_recorded_by_its_machine_code_or_none_is() {
        let a = include_bytes!("machine_code/testdata/machine_code_a.cubin").to_vec();
        let d = include_bytes!("machine_code/testdata/machine_code_d.cubin").to_vec();
        let d128 = Entry {
            d: 128,
            causal: false,
        };
        let code = machine_code_of([(Entry::BASE, &a), (d128, &d)].into_iter());
        let names: Vec<(&str, &str)> = code
            .iter()
            .map(|c| (c.module.as_str(), c.function.as_str()))
            .collect();
        assert_eq!(
            names,
            [
                ("d64", "changed_fn"),
                ("d64", "reloc_fn"),
                ("d64", "same_fn"),
                ("d128", "caller_fn"),
                ("d128", "helper"),
            ]
        );
        assert!(code.iter().all(|c| c.sha256.len() == 64));
        let garbage = vec![0u8; 64];
        assert!(
            machine_code_of([(Entry::BASE, &a), (d128, &garbage)].into_iter()).is_empty(),
            "a module that cannot be read makes the whole variant's code unknown"
        );
    }

    #[test]
    fn a_ptxas_message_the_manifest_forbids_is_found_by_its_code() {
        let log = "ptxas info    : Compiling entry function 'k' for 'sm_90a'\n\
                   ptxas info    : (C7514) Potential Performance Loss: wgmma.mma_async \
                   instructions are serialized\n";
        let codes = |c: &[&str]| c.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(
            forbidden_message(log, &codes(&["C7517", "C7514"]))
                .is_some_and(|l| l.starts_with("ptxas info    : (C7514)"))
        );
        assert_eq!(forbidden_message(log, &codes(&["C7517"])), None);
        assert_eq!(forbidden_message(log, &[]), None);
        // ptxas 13's words for an accumulator read early behind a conditional barrier.
        let divergent = "ptxas info    : (C7518) Potential Performance Loss: wgmma.mma_async \
                         instructions are serialized due to program dependence on \
                         compiler-inserted WG.DP in divergent path in the function 'k'\n";
        assert!(forbidden_message(divergent, &codes(&["C7514", "C7517", "C7518"])).is_some());
        assert_eq!(
            forbidden_message(divergent, &codes(&["C7514", "C7517"])),
            None
        );
        // ptxas 13's words where the accumulators leave too few registers for the pipeline
        // (Stage D's D 128 entry with ROW_SUM_MMA=1, NVRTC 13.0).
        let starved = "ptxas info    : (C7511) Potential Performance Loss: wgmma.mma_async \
                       instructions are serialized due to insufficient register resources for \
                       the wgmma pipeline in the function 'sdpa_fp8_stage_d_wgmma_d128'\n";
        assert!(forbidden_message(starved, &codes(&["C7511", "C7514"])).is_some());
        assert_eq!(
            forbidden_message(starved, &codes(&["C7514", "C7518"])),
            None
        );
    }

    #[test]
    fn tiles_that_differ_from_the_manifest_for_either_head_dim_are_named() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("cuda/kernels.toml");
        let manifest = crate::kernels::Manifest::load(&path).unwrap();
        let mut spec = manifest.get("stage-d").unwrap().clone();
        (spec.tiles.block_m, spec.tiles.block_m_d128) = (Some(128), None);
        spec.tiles.narrow_d64 = None;
        let c = |m64, m128| super::super::identity::per_head_dim_constants((m64, m128), (384, 384));
        // The project's entry: block_m 128 for both head dims.
        assert_eq!(tiles_mismatch(&c(128, 128), &spec), None);
        let why = tiles_mismatch(&c(192, 128), &spec).expect("D 64's 192 rows are not described");
        assert!(why.contains("SDPA_BLOCK_M=192 (D 128: 128)"), "{why}");
        assert!(tiles_mismatch(&c(128, 192), &spec).is_some(), "nor D 128's");
        // A manifest that says block_m 192 and block_m_d128 128 describes that kernel.
        spec.tiles.block_m = Some(192);
        spec.tiles.block_m_d128 = Some(128);
        assert_eq!(tiles_mismatch(&c(192, 128), &spec), None);
        assert!(tiles_mismatch(&c(128, 128), &spec).is_some());
        // Tiles under one MMA tile, or wider than the memory estimate assumes, are refused
        // whatever the manifest says.
        spec.tiles.block_m = None;
        spec.tiles.block_m_d128 = None;
        let why = tiles_mismatch(&c(128, 8), &spec).expect("8 rows");
        assert!(why.contains("query tiles of 8 rows"), "{why}");
        let why = tiles_mismatch(&c(320, 128), &spec).expect("320 rows");
        assert!(why.contains("query tiles of 320 rows"), "{why}");
        assert_eq!(tiles_mismatch(&c(256, 16), &spec), None);
    }

    #[test]
    fn a_rescale_threshold_other_than_the_manifests_is_refused_and_an_unpublished_one_is_zero() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("cuda/kernels.toml");
        let manifest = crate::kernels::Manifest::load(&path).unwrap();
        let stage_c = manifest.get("stage-c").unwrap();
        let stage_d = manifest.get("stage-d").unwrap();
        let mut c = super::super::identity::per_head_dim_constants((64, 64), (128, 128));
        // A module that publishes none (Stage D, a base from before change 32) runs the exact
        // maximum: right for Stage D, refused for today's Stage C.
        assert_eq!(c.rescale_threshold, 0);
        assert_eq!(numerics_mismatch(&c, stage_d), None);
        let why = numerics_mismatch(&c, stage_c).expect("Stage C's manifest says 8");
        assert!(
            why.contains("SDPA_RESCALE_THRESHOLD=0") && why.contains("rescale_threshold 8"),
            "{why}"
        );
        let published = KernelConstants::from_ptx(
            ".const .align 4 .u32 SDPA_BLOCK_M = 32;\n.const .align 4 .u32 SDPA_BLOCK_N = 64;\n\
             .const .align 4 .b32 SDPA_THREADS = 128;\n\
             .const .align 4 .u32 SDPA_SMEM_BYTES_D64 = 1;\n\
             .const .align 4 .u32 SDPA_SMEM_BYTES_D128 = 1;\n\
             .const .align 4 .u32 SDPA_USE_CP_ASYNC = 1;\n\
             .const .align 4 .b32 SDPA_RESCALE_THRESHOLD = 8;\n",
            "SDPA_USE_CP_ASYNC",
        )
        .unwrap();
        assert_eq!(published.rescale_threshold, 8);
        c.rescale_threshold = published.rescale_threshold;
        assert_eq!(numerics_mismatch(&c, stage_c), None);
        assert!(numerics_mismatch(&c, stage_d).is_some());
    }

    #[test]
    fn a_row_sum_on_the_tensor_cores_the_manifest_does_not_describe_is_refused() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("cuda/kernels.toml");
        let manifest = crate::kernels::Manifest::load(&path).unwrap();
        let stage_c = manifest.get("stage-c").unwrap();
        let stage_d = manifest.get("stage-d").unwrap();
        let ptx = |v: u32| {
            format!(
                ".const .align 4 .u32 SDPA_BLOCK_M = 192;\n.const .align 4 .u32 SDPA_BLOCK_N = 128;\n\
                 .const .align 4 .b32 SDPA_THREADS = 512;\n\
                 .const .align 4 .u32 SDPA_SMEM_BYTES_D64 = 1;\n\
                 .const .align 4 .u32 SDPA_SMEM_BYTES_D128 = 1;\n\
                 .const .align 4 .u32 SDPA_KV_STAGES = 2;\n\
                 .const .align 4 .b32 SDPA_ROW_SUM_MMA = {v};\n"
            )
        };
        let read = |v| KernelConstants::from_ptx(&ptx(v), "SDPA_KV_STAGES").unwrap();
        // Stage D's manifest sums l from the f32 P: a module that says so runs, one built with
        // ROW_SUM_MMA=1 is refused, naming both sides.
        assert_eq!(read(0).row_sum_mma, Some(false));
        assert_eq!(numerics_mismatch(&read(0), stage_d), None);
        let why = numerics_mismatch(&read(1), stage_d).expect("f32-p in the manifest");
        assert!(
            why.contains("SDPA_ROW_SUM_MMA=1")
                && why.contains("numerics.row_sum \"f32-p\"")
                && why.contains("no manifest can describe that build yet"),
            "{why}"
        );
        // Stage C's manifest says "mma": a module that publishes 0 is refused, one that
        // publishes nothing (Stage C's own) is not judged by it.
        let mut c = read(0);
        c.rescale_threshold = 8;
        assert!(
            numerics_mismatch(&c, stage_c)
                .is_some_and(|w| w.contains("\"mma\"") && w.contains("--kernel FILE"))
        );
        c.row_sum_mma = None;
        assert_eq!(numerics_mismatch(&c, stage_c), None);
        c.row_sum_mma = Some(true);
        assert_eq!(numerics_mismatch(&c, stage_c), None);
    }

    #[test]
    fn a_narrower_tile_the_kernel_does_not_run_is_named_not_refused() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("cuda/kernels.toml");
        let manifest = crate::kernels::Manifest::load(&path).unwrap();
        let spec = manifest.get("stage-d").unwrap().clone();
        assert_eq!(spec.tiles.narrow(64).map(|n| n.rows), Some(64));
        assert_eq!(spec.tiles.narrow(128).map(|n| n.rows), Some(128));
        // Today's module: D 64 narrows by 64 rows, D 128's companion runs 128.
        let wide = super::super::identity::stage_d_constants();
        let narrows = KernelConstants {
            narrow_rows: 64,
            ..wide
        };
        assert_eq!(narrow_not_run(&narrows, &spec), None);
        // A module without the companion (a base from before it) runs D 128's 128 rows no more.
        let no_companion = KernelConstants {
            companion_rows_d128: 0,
            ..narrows
        };
        let why = narrow_not_run(&no_companion, &spec).expect("no companion");
        assert!(
            why.contains("narrower D 128 query tile of 128 rows"),
            "{why}"
        );
        // A kernel that publishes no narrowing (a base from before it), or a step the rows are
        // no multiple of: named, and its build goes on (its tiles are the manifest's).
        assert_eq!(tiles_mismatch(&wide, &spec), None);
        let why = narrow_not_run(&wide, &spec).expect("no narrowing published");
        assert!(
            why.contains("narrower D 64 query tile of 64 rows") && why.contains("= 0"),
            "{why}"
        );
        let coarse = KernelConstants {
            narrow_rows: 128,
            ..wide
        };
        assert!(narrow_not_run(&coarse, &spec).is_some());
        // The same at D 128.
        let mut d128 = spec.clone();
        d128.tiles.narrow_d128 = Some(crate::kernels::NarrowTile {
            rows: 64,
            cta_time: 0.8,
        });
        let why = narrow_not_run(&narrows, &d128).expect("D 128 publishes no narrowing");
        assert!(why.contains("narrow_d128"), "{why}");
    }

    #[test]
    fn a_published_companion_the_module_does_not_define_is_refused_by_name() {
        let d128 = Entry {
            d: 128,
            causal: true,
        };
        let name = companion_for("k", d128, 128);
        assert_eq!(name, "k_d128_causal_m128");
        let ptx = ".visible .entry k_d128_causal(\n.param .u64 a\n)\n";
        let why = companion_missing(ptx, &name, d128, 128).unwrap();
        assert!(
            why.contains("`k_d128_causal_m128`") && why.contains("SDPA_COMPANION_ROWS_D128"),
            "{why}"
        );
        let both = format!("{ptx}.visible .entry k_d128_causal_m128(\n.param .u64 a\n)\n");
        assert_eq!(companion_missing(&both, &name, d128, 128), None);
    }

    /// An entry `k_d128` declaring `maps` tensor maps where `at_end` says (after 15 scalar
    /// parameters) or before 11, as NVRTC 13.0 writes them.
    fn entry_ptx(scalars: usize, maps: usize, at_end: bool) -> String {
        let scalar = (0..scalars).map(|i| format!("\t.param .u64 k_d128_param_{i}"));
        let map = (0..maps).map(|i| format!("\t.param .align 64 .b8 k_d128_map_{i}[128]"));
        let params: Vec<String> = if at_end {
            scalar.chain(map).collect()
        } else {
            map.chain(scalar).collect()
        };
        format!(
            ".visible .entry k_d128(\n{}\n)\n.maxntid 128, 1, 1\n{{\n\tret;\n}}\n",
            params.join(",\n")
        )
    }

    #[test]
    fn an_entry_whose_parameters_are_not_the_manifests_abi_is_refused() {
        let stage_c = entry_ptx(16, 0, true); // the maps' address after the workspace
        let stage_c_before = entry_ptx(15, 0, true);
        let stage_d = entry_ptx(11, 3, false);
        assert_eq!(
            abi_mismatch(&stage_c, "k_d128", Abi::PointersAndKvMaps),
            None
        );
        assert_eq!(abi_mismatch(&stage_c_before, "k_d128", Abi::Pointers), None);
        assert_eq!(abi_mismatch(&stage_d, "k_d128", Abi::TensorMaps), None);
        // Fewer parameters than arguments: the rest are never read (a base kernel from before
        // the maps, or from before the workspace).
        assert_eq!(
            abi_mismatch(&stage_c_before, "k_d128", Abi::PointersAndKvMaps),
            None
        );
        assert_eq!(
            abi_mismatch(&entry_ptx(14, 0, true), "k_d128", Abi::Pointers),
            None
        );
        // A kernel that takes K's and V's maps, described as taking pointers only: the launch
        // would pass 15 arguments where the function reads 16.
        let why = abi_mismatch(&stage_c, "k_d128", Abi::Pointers).unwrap();
        assert!(
            why.contains("`k_d128` takes 16 parameters, 0 of them tensor maps")
                && why.contains("abi = \"pointers\" passes 15 parameters, 0 of them"),
            "{why}"
        );
        for (ptx, abi) in [
            (&stage_d, Abi::PointersAndKvMaps),
            (&stage_c, Abi::TensorMaps),
            (&entry_ptx(15, 2, true), Abi::PointersAndKvMaps), // the maps by value
            (&entry_ptx(11, 3, true), Abi::TensorMaps),        // the maps after the scalars
        ] {
            assert!(abi_mismatch(ptx, "k_d128", abi).is_some(), "{abi:?}\n{ptx}");
        }
        // A function the module does not hold is refused, never passed.
        let why = abi_mismatch(&stage_c, "k_d64", Abi::Pointers).unwrap();
        assert!(why.contains("no function `k_d64`"), "{why}");
    }

    #[test]
    fn a_module_must_hold_every_instruction_the_manifest_names_outside_comments() {
        let ptx = ".visible .entry k()\n{\n\tmma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%f1}, {%r1};\n\t// cp.async\n}\n";
        let want = |list: &[&str]| list.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            missing_instruction(ptx, &want(&["mma.sync.aligned.m16n8k16"])),
            None
        );
        assert_eq!(
            missing_instruction(ptx, &want(&["mma.sync", "cp.async"])),
            Some("cp.async")
        );
        assert_eq!(missing_instruction(ptx, &want(&[".entry"])), Some(".entry"));
    }

    #[test]
    fn a_base_kernel_is_a_file_or_a_git_revision_with_an_optional_path() {
        assert_eq!(
            KernelLocation::parse("cuda/old.cu").unwrap(),
            KernelLocation::File("cuda/old.cu".into())
        );
        assert_eq!(
            KernelLocation::parse("git:origin/main").unwrap(),
            KernelLocation::Git {
                rev: "origin/main".into(),
                path: None
            }
        );
        assert_eq!(
            KernelLocation::parse("git:abc123:kernels/k.cu").unwrap(),
            KernelLocation::Git {
                rev: "abc123".into(),
                path: Some("kernels/k.cu".into())
            }
        );
        for bad in ["git:", "git::x.cu", "git:HEAD:", ""] {
            assert!(KernelLocation::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_base_revision_is_described_by_the_manifest_it_had() {
        let project = crate::kernels::project_spec("stage-d");
        assert_eq!(
            project.tiles.block_m,
            Some(192),
            "the project's entry this test edits"
        );
        let manifest = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("cuda/kernels.toml"),
        )
        .unwrap();
        let dir = revision::tests::empty_repo();
        let p = dir.path();
        std::fs::create_dir_all(p.join("cuda")).unwrap();
        let commit = |manifest: Option<&str>, message: &str| {
            std::fs::write(p.join("cuda/sdpa_fp8_stage_d_wgmma.cu"), message).unwrap();
            match manifest {
                Some(text) => std::fs::write(p.join("cuda/kernels.toml"), text).unwrap(),
                None => {
                    let _ = std::fs::remove_file(p.join("cuda/kernels.toml"));
                }
            }
            revision::tests::sh(p, &["add", "-A", "cuda"]);
            revision::tests::sh(p, &["commit", "-q", "-m", message]);
        };
        let at = |rev: &str| {
            let location = KernelLocation::Git {
                rev: rev.into(),
                path: None,
            };
            KernelSource::locate(&location, p, &p.join("cuda"), &project)
                .unwrap()
                .spec
        };
        // A revision whose stage-d had two consumers at D 64 too: its tiles are its own.
        let two = manifest
            .replacen("block_m = 192\nblock_m_d128 = 192", "block_m = 128", 1)
            .replacen("narrow_d128 = { rows = 128, cta_time = 0.76 }\n", "", 1)
            .lines()
            .filter(|l| !l.starts_with("mixed_d"))
            .map(|l| format!("{l}\n"))
            .collect::<String>();
        assert_ne!(two, manifest);
        commit(Some(&two), "// two consumers");
        let old = at("HEAD");
        assert_eq!(
            (old.tiles.block_m, old.tiles.block_m_d128),
            (Some(128), None)
        );
        assert_eq!(old.name, "stage-d");
        // Its A/B switch stays today's: the base's variants are built from the candidate's.
        let other_switch = two.replacen("define = \"KV_STAGES\"", "define = \"PIPELINE_DEPTH\"", 1);
        assert_ne!(other_switch, two);
        commit(Some(&other_switch), "// another switch");
        let then = at("HEAD");
        assert_eq!(then.variants, project.variants);
        assert_eq!(then.tiles.block_m, Some(128));
        // No manifest, one without the kernel, or one this runner cannot read (an older
        // schema): today's entry.
        commit(None, "// before the manifest");
        assert_eq!(at("HEAD"), project);
        let renamed = manifest.replacen("name = \"stage-d\"", "name = \"stage-d-0\"", 1);
        assert_ne!(renamed, manifest);
        commit(Some(&renamed), "// before the kernel had its name");
        assert_eq!(at("HEAD"), project);
        let older = manifest.replace("mma_k = 32\n", "");
        assert_ne!(older, manifest);
        commit(Some(&older), "// an older schema");
        assert_eq!(at("HEAD"), project);
        // The revisions before them still read as they were.
        assert_eq!(at("HEAD~4").tiles.block_m, Some(128));
    }

    /// Whether `word` is a macro of the host headers a CUDA translation unit may include before
    /// a kernel (`<climits>`, `<cstdint>`, `<cfloat>`, `<cmath>`, `<cstdio>`, `<cstdlib>`):
    /// the integer limits, every `FLT_`/`DBL_`/`LDBL_` name, the math constants and
    /// classifications, and a few more.
    fn is_host_header_macro(word: &str) -> bool {
        const NAMES: &[&str] = &[
            "CHAR_BIT",
            "NAN",
            "INFINITY",
            "HUGE_VAL",
            "HUGE_VALF",
            "EOF",
            "RAND_MAX",
            "FP_NAN",
            "FP_INFINITE",
            "FP_ZERO",
            "FP_NORMAL",
            "FP_SUBNORMAL",
            "M_E",
            "M_LOG2E",
            "M_LOG10E",
            "M_LN2",
            "M_LN10",
            "M_PI",
            "M_PI_2",
            "M_PI_4",
            "M_1_PI",
            "M_2_PI",
            "M_2_SQRTPI",
            "M_SQRT2",
            "M_SQRT1_2",
        ];
        const LIMITED: &[&str] = &[
            "CHAR", "SCHAR", "UCHAR", "SHRT", "USHRT", "INT", "UINT", "LONG", "ULONG", "LLONG",
            "ULLONG", "INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16", "UINT32", "UINT64",
            "SIZE", "PTRDIFF", "INTPTR", "UINTPTR", "INTMAX", "UINTMAX", "WCHAR",
        ];
        NAMES.contains(&word)
            || ["FLT_", "DBL_", "LDBL_"]
                .iter()
                .any(|p| word.starts_with(p))
            || word
                .strip_suffix("_MAX")
                .or_else(|| word.strip_suffix("_MIN"))
                .is_some_and(|t| LIMITED.contains(&t))
    }

    /// `src` without its `/* */` and `//` comments (newlines kept, so lines keep their numbers).
    fn without_comments(src: &str) -> String {
        let mut out = String::with_capacity(src.len());
        let mut rest = src;
        // Whichever comment opens first; a `/*` inside a `//` comment opens nothing.
        while let Some(at) = rest.find("//").into_iter().chain(rest.find("/*")).min() {
            out.push_str(&rest[..at]);
            let close = if rest[at..].starts_with("//") {
                "\n"
            } else {
                "*/"
            };
            let end = rest[at + 2..]
                .find(close)
                .map_or(rest.len(), |e| at + 2 + e + close.len());
            out.extend(rest[at..end].chars().filter(|&c| c == '\n'));
            rest = &rest[end..];
        }
        out.push_str(rest);
        out
    }

    #[test]
    fn host_header_macros_are_told_from_the_kernels_own_names() {
        for m in [
            "INT_MAX",
            "UINT32_MAX",
            "SIZE_MAX",
            "FLT_MAX",
            "DBL_EPSILON",
            "M_PI",
            "NAN",
        ] {
            assert!(is_host_header_macro(m), "{m}");
        }
        for k in [
            "INT_MAXIMA",
            "M_NONE",
            "SPLIT_KV_MAX",
            "KV_STAGES",
            "MAX",
            "INT",
            "M_",
        ] {
            assert!(!is_host_header_macro(k), "{k}");
        }
        let src = "a /* INT_MAX\n */ b // FLT_MAX\nc INT_MAX";
        assert_eq!(without_comments(src), "a \n b \nc INT_MAX");
        // A `/*` in a line comment opens no block: the next line is still code.
        assert_eq!(without_comments("x // see /* here\nINT_MAX"), "x \nINT_MAX");
    }

    /// The kernels in cuda/ also build under nvcc, where host headers come first (the probe
    /// scripts: scripts/stage_d/probe.cu includes `<cstdlib>`, `<algorithm>` and `<cmath>`
    /// before the Stage D source), and a name of theirs used in a kernel is their macro. Stage
    /// D's `INT_MAX` template parameter broke every probe build from change 29 to stop 55, while
    /// NVRTC, which the runner uses and which defines no such macro, built it.
    #[test]
    fn no_kernel_source_uses_a_name_the_host_headers_define_as_a_macro() {
        let cuda = Path::new(env!("CARGO_MANIFEST_DIR")).join("cuda");
        let mut found = Vec::new();
        let mut read = 0;
        for entry in std::fs::read_dir(&cuda).unwrap() {
            let path = entry.unwrap().path();
            if !matches!(
                path.extension().and_then(|e| e.to_str()),
                Some("cu" | "cuh")
            ) {
                continue;
            }
            let src = std::fs::read_to_string(&path).unwrap();
            for (n, line) in without_comments(&src).lines().enumerate() {
                let words = line.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'));
                for w in words.filter(|w| is_host_header_macro(w)) {
                    found.push(format!("{}:{}: {w}", path.display(), n + 1));
                }
            }
            read += 1;
        }
        assert!(read >= 2, "read the kernels in {}", cuda.display());
        assert!(
            found.is_empty(),
            "host header macros used as names:\n{}",
            found.join("\n")
        );
    }
}
