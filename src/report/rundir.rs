//! Run directories: `results/<UTC timestamp>-<id>/`, new for every run, never overwritten.
//!
//! Files are written into a hidden staging folder (each through a temporary name and a
//! rename), and the folder is renamed into place only when the run finishes. A run that
//! stops early leaves nothing behind: dropping an uncommitted [`RunDir`] removes it, a signal
//! removes it through [`crate::interrupt`], and the staging folder of a killed process (its
//! name ends in the owner's pid) is swept by the next run in the same folder.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::Serialize;

/// Failures to create or write result files; they exit with code 2 (fix the results path).
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error("cannot use results directory {path}: {source}; pass a writable --results-dir DIR")]
    Unwritable {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot write {path}: {source}; choose a file in a writable folder")]
    Output {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

pub struct RunDir {
    staging: PathBuf,
    target: PathBuf,
    committed: bool,
}

impl RunDir {
    /// Creates the staging folder of a new run under `results_root` (created if missing).
    pub fn create(results_root: &Path) -> Result<Self, ReportError> {
        let unwritable = |source| ReportError::Unwritable {
            path: results_root.to_path_buf(),
            source,
        };
        std::fs::create_dir_all(results_root).map_err(unwritable)?;
        for stale in crate::interrupt::sweep_stale(results_root) {
            eprintln!(
                "note: removed {}, the unfinished run of a process that no longer exists",
                stale.display()
            );
        }
        let stamp = humantime::format_rfc3339_seconds(std::time::SystemTime::now())
            .to_string()
            .replace(['-', ':'], "");
        for _ in 0..16 {
            let id: u32 = rand::random();
            let name = format!("{stamp}-{:06x}", id & 0xFF_FFFF);
            let target = results_root.join(&name);
            let staging = results_root.join(crate::interrupt::staging_name(&name));
            if target.exists() {
                continue;
            }
            match std::fs::create_dir(&staging) {
                Ok(()) => {
                    crate::interrupt::register(&staging);
                    return Ok(RunDir {
                        staging,
                        target,
                        committed: false,
                    });
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(unwritable(e)),
            }
        }
        Err(unwritable(std::io::Error::other(
            "no free run name after 16 tries",
        )))
    }

    /// A staging folder beside `target` (created with its parents), committed by renaming it
    /// to `target`: `export`'s folder, which may replace an existing one (checked by the
    /// caller). Signals and drops remove it as they remove a run's.
    pub fn for_target(target: &Path) -> Result<Self, ReportError> {
        let unwritable = |source| ReportError::Output {
            path: target.to_path_buf(),
            source,
        };
        let parent = target
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        std::fs::create_dir_all(parent).map_err(unwritable)?;
        let name = target
            .file_name()
            .map(|n| n.to_string_lossy().to_string())
            .unwrap_or_else(|| "export".into());
        // What a killed export left beside its target (its staging or replaced folder).
        for stale in crate::interrupt::sweep_stale_beside(parent, &name) {
            eprintln!(
                "note: removed {}, left by a process that no longer exists",
                stale.display()
            );
        }
        let staging = parent.join(crate::interrupt::staging_name(&name));
        let _ = std::fs::remove_dir_all(&staging);
        std::fs::create_dir(&staging).map_err(unwritable)?;
        crate::interrupt::register(&staging);
        Ok(RunDir {
            staging,
            target: target.to_path_buf(),
            committed: false,
        })
    }

    /// Creates `results_root` if missing, or says why it cannot be used (before any work).
    /// Creates nothing: the folder, or the nearest folder above it that exists, must take
    /// new entries (the run creates what is missing when it starts writing).
    pub fn check_root(results_root: &Path) -> Result<(), ReportError> {
        probe_nearest_dir(results_root).map_err(|source| ReportError::Unwritable {
            path: results_root.to_path_buf(),
            source,
        })
    }

    /// Where files go before the commit.
    pub fn staging(&self) -> &Path {
        &self.staging
    }

    pub fn write_json<T: Serialize>(&self, name: &str, value: &T) -> Result<(), ReportError> {
        let mut text = serde_json::to_string_pretty(value).expect("result types serialize");
        text.push('\n');
        write_atomic(&self.staging.join(name), text.as_bytes())
    }

    pub fn write_text(&self, name: &str, text: &str) -> Result<(), ReportError> {
        write_atomic(&self.staging.join(name), text.as_bytes())
    }

    /// Moves the finished run into place and returns its path.
    pub fn commit(mut self) -> Result<PathBuf, ReportError> {
        // A folder already at the target ([`RunDir::for_target`]) is moved aside first and
        // removed after: the target never holds a mix of old and new files.
        let aside = self.target.exists().then(|| {
            let name = self
                .target
                .file_name()
                .unwrap_or_default()
                .to_string_lossy();
            self.target
                .with_file_name(crate::interrupt::replaced_name(&name))
        });
        crate::interrupt::commit(&self.staging, || {
            if let Some(aside) = &aside {
                std::fs::rename(&self.target, aside)?;
            }
            let moved = std::fs::rename(&self.staging, &self.target);
            if moved.is_err()
                && let Some(aside) = &aside
            {
                let _ = std::fs::rename(aside, &self.target);
            }
            moved
        })
        .map_err(|source| ReportError::Write {
            path: self.target.clone(),
            source,
        })?;
        self.committed = true;
        if let Some(aside) = aside {
            let _ = std::fs::remove_dir_all(&aside);
        }
        Ok(self.target.clone())
    }
}

impl Drop for RunDir {
    fn drop(&mut self) {
        if !self.committed {
            let _ = std::fs::remove_dir_all(&self.staging);
            crate::interrupt::unregister(&self.staging);
        }
    }
}

/// Writes `bytes` to a temporary sibling of `path`, syncs it, and renames it over `path`.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), ReportError> {
    let err = |source| ReportError::Write {
        path: path.to_path_buf(),
        source,
    };
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("out");
    let tmp = path.with_file_name(format!(".{name}.tmp-{}", std::process::id()));
    // A signal before the rename removes the temporary file (interrupt.rs).
    crate::interrupt::register(&tmp);
    let result = (|| {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)?;
        }
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        crate::interrupt::commit(&tmp, || std::fs::rename(&tmp, path))
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    crate::interrupt::unregister(&tmp);
    result.map_err(err)
}

/// Checks, creating nothing that stays, that `dir` (or the nearest existing folder above it)
/// is a folder that takes a new file.
pub fn probe_nearest_dir(dir: &Path) -> std::io::Result<()> {
    let mut at = dir;
    while !at.exists() {
        match at.parent() {
            Some(p) if !p.as_os_str().is_empty() => at = p,
            _ => {
                at = Path::new(".");
                break;
            }
        }
    }
    if !at.is_dir() {
        return Err(std::io::Error::other(format!(
            "{} is not a folder",
            at.display()
        )));
    }
    let probe = at.join(format!(".sdpa-runner-probe-{}", std::process::id()));
    std::fs::File::create(&probe)?;
    let _ = std::fs::remove_file(&probe);
    Ok(())
}

/// The run directory one finished run left in a results folder that held nothing before: its
/// only subfolder, staging folders aside (an error naming the count where it has none or
/// several). Not its first entry: `read_dir`'s order is the file system's, and a run that
/// compared variants also writes the latest `COMPARE.md` beside the run directory.
pub fn only_run_dir(results_root: &Path) -> Result<PathBuf, String> {
    let staging = |p: &Path| {
        p.file_name().is_some_and(|n| {
            n.to_string_lossy()
                .starts_with(crate::interrupt::STAGING_PREFIX)
        })
    };
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(results_root)
        .map_err(|e| format!("cannot read {}: {e}", results_root.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_dir() && !staging(p))
        .collect();
    match dirs.len() {
        1 => Ok(dirs.remove(0)),
        n => Err(format!(
            "{} holds {n} run directories, not one",
            results_root.display()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_only_run_dir_is_the_subfolder_whatever_files_lie_beside_it() {
        let root = tempfile::tempdir().unwrap();
        let err = only_run_dir(root.path()).unwrap_err();
        assert!(err.contains("0 run directories"), "nothing yet: {err}");
        // A comparing run's COMPARE.md beside its directory, and other files: a reader that
        // took read_dir's first entry would almost surely take a file.
        for name in ["COMPARE.md", "a", "b", "c", "d", "e", "f", "g", "h", "i"] {
            std::fs::write(root.path().join(name), "x").unwrap();
        }
        let run = RunDir::create(root.path()).unwrap().commit().unwrap();
        // A staging folder (a run still writing, or one that was killed) is not a run.
        std::fs::create_dir(root.path().join(crate::interrupt::staging_name("x"))).unwrap();
        assert_eq!(only_run_dir(root.path()), Ok(run));
        std::fs::create_dir(root.path().join("other")).unwrap();
        let err = only_run_dir(root.path()).unwrap_err();
        assert!(
            err.contains("2 run directories"),
            "which of two is unknown: {err}"
        );
    }

    #[test]
    fn a_committed_run_appears_with_its_files_and_no_staging_left() {
        let root = tempfile::tempdir().unwrap();
        let run = RunDir::create(root.path()).unwrap();
        run.write_json("a.json", &serde_json::json!({"x": 1}))
            .unwrap();
        let path = run.commit().unwrap();
        assert!(path.join("a.json").is_file());
        let names: Vec<_> = std::fs::read_dir(root.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 1, "{names:?}");
    }

    #[test]
    fn a_dropped_run_leaves_nothing_behind() {
        let root = tempfile::tempdir().unwrap();
        {
            let run = RunDir::create(root.path()).unwrap();
            run.write_text("half.json", "{").unwrap();
        }
        assert_eq!(std::fs::read_dir(root.path()).unwrap().count(), 0);
    }

    #[test]
    fn two_runs_get_two_directories() {
        let root = tempfile::tempdir().unwrap();
        let a = RunDir::create(root.path()).unwrap().commit().unwrap();
        let b = RunDir::create(root.path()).unwrap().commit().unwrap();
        assert_ne!(a, b);
    }

    #[test]
    fn an_unwritable_results_root_is_refused_with_a_fix() {
        let root = tempfile::tempdir().unwrap();
        let file = root.path().join("plain-file");
        std::fs::write(&file, "x").unwrap();
        let err = RunDir::create(&file.join("sub")).err().unwrap().to_string();
        assert!(err.contains("--results-dir"), "{err}");
    }
}
