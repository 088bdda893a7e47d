//! The kernel source and the build of one variant: NVRTC compile, then the identity checks
//! that refuse a module which is not what was asked for (exit 4).

use std::path::{Path, PathBuf};

use super::identity::{KernelConstants, PtxasReport, VariantIdentity, ptx_has_cp_async};
use super::nvrtc::{self, Compiled};
use super::variant::VariantSpec;
use crate::backend::BackendError;
use crate::emulation::KV_TILE;
use crate::report::sha256_hex;
use crate::shapes::HEAD_DIM;

/// The kernel file under cuda/ and its entry point (docs/DESIGN.md "Kernel ABI").
pub const KERNEL_FILE: &str = "sdpa_fp8_stage_c_mma.cu";
pub const ENTRY: &str = "sdpa_fp8_stage_c_mma";

/// A kernel source file, read once, with the folders its `#include "..."` lines resolve in.
#[derive(Debug, Clone)]
pub struct KernelSource {
    pub path: PathBuf,
    pub text: String,
    pub sha256: String,
    pub include_dirs: Vec<PathBuf>,
}

impl KernelSource {
    /// Reads `path`; its own folder and the project's cuda/ folder serve local includes.
    pub fn load(path: &Path, project_cuda_dir: &Path) -> Result<Self, BackendError> {
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
            sha256: sha256_hex(text.as_bytes()),
            text,
            include_dirs,
        })
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
pub struct BuiltVariant {
    pub spec: VariantSpec,
    pub compiled: Compiled,
    pub identity: VariantIdentity,
}

/// Compiles one variant for `arch` and checks that the module is what was asked for: the
/// published HEAD_DIM and BLOCK_N match the runner's, and the cp.async toggle took.
pub fn build_variant(
    src: &KernelSource,
    cuda_include: &Path,
    arch: &str,
    spec: &VariantSpec,
) -> Result<BuiltVariant, BackendError> {
    let mut dirs: Vec<&Path> = vec![cuda_include];
    dirs.extend(src.include_dirs.iter().map(PathBuf::as_path));
    let options = nvrtc::build_options(arch, &dirs, &spec.defines);
    let name = src
        .path
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or(KERNEL_FILE);
    let compiled = nvrtc::compile(&src.text, name, &options).map_err(|failure| {
        BackendError::Kernel(format!(
            "variant {} of {} failed to compile: {failure}",
            spec.name,
            src.path.display()
        ))
    })?;
    let refuse = |msg: String| {
        BackendError::Kernel(format!(
            "variant {} of {}: {msg}",
            spec.name,
            src.path.display()
        ))
    };
    let constants = KernelConstants::from_ptx(&compiled.ptx).map_err(refuse)?;
    if constants.head_dim as usize != HEAD_DIM || constants.block_n as usize != KV_TILE {
        return Err(refuse(format!(
            "the kernel publishes HEAD_DIM={} BLOCK_N={}, but the runner and its CPU emulation use \
             HEAD_DIM={HEAD_DIM} KV_TILE={KV_TILE}; keep src/emulation.rs in step with the kernel",
            constants.head_dim, constants.block_n
        )));
    }
    let identity = VariantIdentity {
        name: spec.name.clone(),
        defines: spec.define_strings(),
        ptx_sha256: sha256_hex(compiled.ptx.as_bytes()),
        cubin_sha256: sha256_hex(&compiled.cubin),
        ptx_has_cp_async: ptx_has_cp_async(&compiled.ptx),
        constants,
        ptxas: PtxasReport::parse(&compiled.log, ENTRY),
        driver: None,
    };
    identity
        .check_toggle(spec.use_cp_async)
        .map_err(BackendError::Kernel)?;
    Ok(BuiltVariant {
        spec: spec.clone(),
        compiled,
        identity,
    })
}
