//! Finds the project's data folders (shapes/, gates/, cuda/) at run time.
//!
//! The binary is carried to GPU machines where the checkout lives at another absolute path,
//! so nothing is located from a compile-time path: an explicit `--root`, then `SDPA_RUNNER_ROOT`,
//! then the current directory and its parents, then the executable's folder and its parents.

use std::path::{Path, PathBuf};

use crate::usage::ConfigError;

/// The marker file that identifies a project root.
const MARKER: &str = "shapes/default.json";

/// The project folders the runner reads.
#[derive(Debug, Clone)]
pub struct ProjectRoot {
    root: PathBuf,
}

impl ProjectRoot {
    pub fn locate(explicit: Option<&Path>) -> Result<Self, ConfigError> {
        if let Some(dir) = explicit {
            return Self::at(dir).ok_or_else(|| {
                ConfigError::Usage(format!(
                    "--root {}: no {MARKER} there; point --root at the sdpa-runner checkout",
                    dir.display()
                ))
            });
        }
        if let Some(dir) = std::env::var_os("SDPA_RUNNER_ROOT") {
            let dir = PathBuf::from(dir);
            return Self::at(&dir).ok_or_else(|| {
                ConfigError::Usage(format!(
                    "SDPA_RUNNER_ROOT={}: no {MARKER} there; unset it or point it at the checkout",
                    dir.display()
                ))
            });
        }
        let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("."));
        let exe_dir = std::env::current_exe()
            .ok()
            .and_then(|p| p.parent().map(Path::to_path_buf));
        let starts = std::iter::once(cwd.clone()).chain(exe_dir);
        for start in starts {
            if let Some(found) = start.ancestors().find_map(Self::at) {
                return Ok(found);
            }
        }
        Err(ConfigError::Usage(format!(
            "cannot find the project files ({MARKER}, gates/, cuda/) from {} or the executable's \
             folder; run from the sdpa-runner checkout or pass --root DIR",
            cwd.display()
        )))
    }

    fn at(dir: &Path) -> Option<Self> {
        dir.join(MARKER).is_file().then(|| ProjectRoot {
            root: dir.to_path_buf(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.root
    }
    pub fn default_shapes(&self) -> PathBuf {
        self.root.join(MARKER)
    }
    pub fn default_gates(&self) -> PathBuf {
        self.root.join("gates/default.json")
    }
    pub fn cuda_dir(&self) -> PathBuf {
        self.root.join("cuda")
    }
    pub fn scripts_dir(&self) -> PathBuf {
        self.root.join("scripts")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_explicit_root_without_the_marker_is_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let err = ProjectRoot::locate(Some(dir.path()))
            .unwrap_err()
            .to_string();
        assert!(err.contains("--root") && err.contains(MARKER), "{err}");
    }

    #[test]
    fn an_explicit_root_with_the_marker_is_used() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("shapes")).unwrap();
        std::fs::write(dir.path().join(MARKER), "{}").unwrap();
        let root = ProjectRoot::locate(Some(dir.path())).unwrap();
        assert_eq!(root.default_gates(), dir.path().join("gates/default.json"));
    }
}
