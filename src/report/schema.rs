//! The result files' schemas (DESIGN.md "Output files"). Every file has a `schema_version`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::metrics::ErrorMetrics;
use crate::verdict::{Check, Verdict};

pub const SCHEMA_VERSION: u32 = 1;

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
    pub gates: BTreeMap<String, Check>,
    pub pass: bool,
}
