//! Finds the CUDA headers NVRTC needs (`mma.h`, `cuda_fp8.h`, `cuda_pipeline_primitives.h`).
//!
//! Searched in order: `SDPA_CUDA_INCLUDE` (the include folder itself), `CUDA_HOME/include`,
//! `CUDA_PATH/include`, `/usr/local/cuda/include`, then `../include` beside `nvcc` on `PATH`.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// The header whose presence marks a usable include folder.
const MARKER: &str = "mma.h";

/// One place looked at, and why.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    pub origin: String,
    pub dir: PathBuf,
}

/// Every place searched, when none had the headers.
#[derive(Debug, Clone)]
pub struct NotFound {
    pub searched: Vec<Candidate>,
}

impl std::fmt::Display for NotFound {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "CUDA headers not found: no {MARKER} in any of")?;
        for c in &self.searched {
            writeln!(f, "  {} ({})", c.dir.display(), c.origin)?;
        }
        write!(
            f,
            "set CUDA_HOME to the CUDA toolkit (or SDPA_CUDA_INCLUDE to its include folder)"
        )
    }
}

/// The candidate folders, in search order, from an environment lookup (injectable for tests).
pub fn candidates(env: &dyn Fn(&str) -> Option<OsString>) -> Vec<Candidate> {
    let mut out = Vec::new();
    if let Some(dir) = env("SDPA_CUDA_INCLUDE") {
        out.push(Candidate {
            origin: "SDPA_CUDA_INCLUDE".into(),
            dir: PathBuf::from(dir),
        });
    }
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Some(root) = env(var) {
            out.push(Candidate {
                origin: format!("{var}/include"),
                dir: PathBuf::from(root).join("include"),
            });
        }
    }
    out.push(Candidate {
        origin: "default location".into(),
        dir: PathBuf::from("/usr/local/cuda/include"),
    });
    if let Some(path) = env("PATH") {
        for bin in std::env::split_paths(&path) {
            if bin.join("nvcc").is_file() {
                out.push(Candidate {
                    origin: format!("beside nvcc in {}", bin.display()),
                    dir: bin.join("../include"),
                });
                break;
            }
        }
    }
    out
}

/// The first candidate that holds the headers.
pub fn find(env: &dyn Fn(&str) -> Option<OsString>) -> Result<PathBuf, NotFound> {
    let searched = candidates(env);
    searched
        .iter()
        .find(|c| has_headers(&c.dir))
        .map(|c| c.dir.clone())
        .ok_or(NotFound { searched })
}

/// Looks in the real process environment.
pub fn find_in_environment() -> Result<PathBuf, NotFound> {
    find(&|name| std::env::var_os(name))
}

fn has_headers(dir: &Path) -> bool {
    dir.join(MARKER).is_file()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn toolkit(root: &Path) -> PathBuf {
        let include = root.join("include");
        std::fs::create_dir_all(&include).unwrap();
        std::fs::write(include.join(MARKER), "").unwrap();
        std::fs::create_dir_all(root.join("bin")).unwrap();
        std::fs::write(root.join("bin/nvcc"), "").unwrap();
        include
    }

    fn env_of(vars: HashMap<&'static str, OsString>) -> impl Fn(&str) -> Option<OsString> {
        move |name| vars.get(name).cloned()
    }

    #[test]
    fn sdpa_cuda_include_wins_over_cuda_home() {
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        let a_inc = toolkit(a.path());
        toolkit(b.path());
        let env = env_of(HashMap::from([
            ("SDPA_CUDA_INCLUDE", a_inc.clone().into_os_string()),
            ("CUDA_HOME", b.path().as_os_str().to_owned()),
        ]));
        assert_eq!(find(&env).unwrap(), a_inc);
    }

    #[test]
    fn cuda_home_then_cuda_path_are_used() {
        let a = tempfile::tempdir().unwrap();
        let inc = toolkit(a.path());
        let env = env_of(HashMap::from([
            ("CUDA_HOME", OsString::from("/nonexistent/cuda")),
            ("CUDA_PATH", a.path().as_os_str().to_owned()),
        ]));
        assert_eq!(find(&env).unwrap(), inc);
    }

    #[test]
    fn nvcc_on_path_is_the_last_resort() {
        let a = tempfile::tempdir().unwrap();
        toolkit(a.path());
        let env = env_of(HashMap::from([(
            "PATH",
            a.path().join("bin").into_os_string(),
        )]));
        let cands = candidates(&env);
        assert_eq!(cands.last().unwrap().dir, a.path().join("bin/../include"));
        if !Path::new("/usr/local/cuda/include/mma.h").exists() {
            assert_eq!(find(&env).unwrap(), a.path().join("bin/../include"));
        }
    }

    #[test]
    fn the_error_names_every_place_searched_and_the_fix() {
        let env = env_of(HashMap::from([
            ("SDPA_CUDA_INCLUDE", OsString::from("/nope/include")),
            ("CUDA_HOME", OsString::from("/nope/home")),
        ]));
        let err = NotFound {
            searched: candidates(&env),
        }
        .to_string();
        for needle in [
            "/nope/include",
            "/nope/home/include",
            "/usr/local/cuda/include",
            "CUDA_HOME",
        ] {
            assert!(err.contains(needle), "{needle} missing from: {err}");
        }
    }
}
