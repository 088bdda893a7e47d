//! Result files on disk: the run directory, atomic writes, and the facts recorded with every
//! run (git, tool, host, file hashes). The files' schemas are in [`crate::schema`].

mod rundir;

use std::path::Path;

use sha2::{Digest, Sha256};

use crate::schema::{FileRef, GitInfo, HostInfo, ToolInfo};
pub use rundir::{ReportError, RunDir, only_run_dir, probe_nearest_dir, write_atomic};

/// The commit this binary was built from (captured by build.rs).
pub fn git_info() -> GitInfo {
    GitInfo {
        sha: env!("SDPA_GIT_SHA").to_string(),
        dirty: env!("SDPA_GIT_DIRTY") == "true",
    }
}

pub fn tool_info() -> ToolInfo {
    ToolInfo {
        name: env!("CARGO_PKG_NAME").to_string(),
        version: env!("CARGO_PKG_VERSION").to_string(),
    }
}

pub fn host_info() -> HostInfo {
    let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "unknown".into());
    HostInfo {
        hostname,
        os: std::env::consts::OS.to_string(),
        arch: std::env::consts::ARCH.to_string(),
        logical_cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
    }
}

/// Identifies a file by content; `sha256` is "unreadable" if it cannot be read.
pub fn file_ref(path: &Path) -> FileRef {
    FileRef {
        path: path.display().to_string(),
        sha256: std::fs::read(path).map_or_else(|_| "unreadable".into(), |b| sha256_hex(&b)),
    }
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    crate::inputs::hex(&Sha256::digest(bytes))
}

/// sha256 of f16 values' bits, little-endian.
pub fn f16_checksum(values: &[half::f16]) -> String {
    let mut h = Sha256::new();
    let mut buf = Vec::with_capacity(2 * 8192);
    for block in values.chunks(8192) {
        buf.clear();
        buf.extend(block.iter().flat_map(|v| v.to_bits().to_le_bytes()));
        h.update(&buf);
    }
    crate::inputs::hex(&h.finalize())
}

pub fn now_rfc3339() -> String {
    humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string()
}
