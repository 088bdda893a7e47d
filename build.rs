//! Records the git commit and dirty flag of the tree the binary is built from, so results
//! name the code that produced them even where the binary runs without a checkout.

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn main() {
    let sha = git(&["rev-parse", "HEAD"]).unwrap_or_else(|| "unknown".into());
    let dirty = git(&["status", "--porcelain", "--untracked-files=no"])
        .map(|s| !s.is_empty())
        .unwrap_or(false);
    println!("cargo:rustc-env=SDPA_GIT_SHA={sha}");
    println!("cargo:rustc-env=SDPA_GIT_DIRTY={dirty}");
    // Tracked sources too: editing a file changes the dirty flag without touching .git.
    for path in [
        ".git/HEAD",
        ".git/index",
        ".git/refs/heads",
        "src",
        "cuda",
        "Cargo.toml",
    ] {
        if std::path::Path::new(path).exists() {
            println!("cargo:rerun-if-changed={path}");
        }
    }
    println!("cargo:rerun-if-changed=build.rs");
}
