//! A kernel read from a git revision, for `--base-kernel git:REV[:PATH]`: the kernel file and
//! every header under its folder, as they are at REV, PATH relative to the project root (also
//! when the project is a folder of a larger repository). Nothing is written to disk; the
//! headers go to NVRTC in memory by their names relative to the kernel's folder, so the base
//! kernel never picks up the working tree's headers. A header that includes another by a
//! path relative to its own subfolder is not found (NVRTC matches the names as given).

use std::path::Path;
use std::process::Command;

/// The kernel file and its headers at one commit.
#[derive(Debug, Clone, PartialEq)]
pub struct RevisionFiles {
    /// The full commit id REV resolved to.
    pub commit: String,
    pub text: String,
    /// (include name relative to the kernel's folder, text), sorted by name.
    pub headers: Vec<(String, String)>,
}

/// File endings read as headers.
const HEADER_ENDINGS: [&str; 5] = [".cuh", ".h", ".hpp", ".hxx", ".inc"];

/// Reads `path` (relative to the repository root) and the headers under its folder at `rev`.
/// The message of an error names the cause and the fix.
pub fn read(repo: &Path, rev: &str, path: &str) -> Result<RevisionFiles, String> {
    let commit = git(
        repo,
        &[
            "rev-parse",
            "--verify",
            "--quiet",
            &format!("{rev}^{{commit}}"),
        ],
    )
    .map_err(|e| {
        format!(
            "`{rev}` is not a commit of the repository at {} ({e}); fetch it first (in \
                 GitHub Actions: actions/checkout with fetch-depth: 0) or name another revision",
            repo.display()
        )
    })?
    .trim()
    .to_string();
    // `./` makes the path relative to `repo` (the project), also inside a larger repository;
    // `cat-file blob` refuses a folder instead of printing its listing.
    let path = path.trim_start_matches("./");
    let blob = |file: &str| git(repo, &["cat-file", "blob", &format!("{commit}:./{file}")]);
    let text = blob(path).map_err(|e| {
        format!(
            "the kernel `{path}` is not a file at {rev} ({}): {e}; name the file with \
             git:{rev}:PATH",
            &commit[..12.min(commit.len())]
        )
    })?;
    let dir = Path::new(path)
        .parent()
        .map(|d| d.to_string_lossy().into_owned())
        .unwrap_or_default();
    // NUL-separated: names are given as they are, never quoted.
    let listing = git(
        repo,
        &[
            "ls-tree",
            "-r",
            "-z",
            "--name-only",
            &commit,
            "--",
            if dir.is_empty() { "." } else { &dir },
        ],
    )?;
    let mut headers = Vec::new();
    for file in listing
        .split('\0')
        .filter(|f| HEADER_ENDINGS.iter().any(|e| f.ends_with(e)))
    {
        let name = if dir.is_empty() {
            file
        } else {
            file.strip_prefix(&format!("{dir}/")).unwrap_or(file)
        };
        let body = blob(file).map_err(|e| format!("the header {file} at {rev}: {e}"))?;
        headers.push((name.to_string(), body));
    }
    headers.sort();
    Ok(RevisionFiles {
        commit,
        text,
        headers,
    })
}

/// The text of `path` (relative to the repository root) at commit `commit`, or None where the
/// commit has no such file.
pub fn read_text(repo: &Path, commit: &str, path: &str) -> Result<Option<String>, String> {
    let path = path.trim_start_matches("./");
    let spec = format!("{commit}:./{path}");
    if git(repo, &["cat-file", "-e", &spec]).is_err() {
        return Ok(None);
    }
    git(repo, &["cat-file", "blob", &spec]).map(Some)
}

/// Runs `git -C repo ARGS` and returns its standard output.
fn git(repo: &Path, args: &[&str]) -> Result<String, String> {
    let out = Command::new("git")
        .arg("-C")
        .arg(repo)
        .args(args)
        .output()
        .map_err(|e| format!("git could not be run: {e}; install git"))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr).trim().to_string();
        return Err(if err.is_empty() {
            format!("git {} failed", args.join(" "))
        } else {
            err
        });
    }
    String::from_utf8(out.stdout).map_err(|_| format!("git {} gave non-UTF-8 text", args.join(" ")))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Runs `git -C dir ARGS` and asserts it succeeded.
    pub(crate) fn sh(dir: &Path, args: &[&str]) {
        let ok = Command::new("git")
            .arg("-C")
            .arg(dir)
            .args(args)
            .output()
            .unwrap()
            .status
            .success();
        assert!(ok, "git {args:?}");
    }

    /// An empty repository that commits without the user's git configuration.
    pub(crate) fn empty_repo() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path();
        sh(p, &["init", "-q"]);
        sh(p, &["config", "user.email", "t@t"]);
        sh(p, &["config", "user.name", "t"]);
        sh(p, &["config", "commit.gpgsign", "false"]);
        dir
    }

    /// A repository with two commits of cuda/k.cu and its header.
    fn repo() -> tempfile::TempDir {
        let dir = empty_repo();
        let p = dir.path();
        std::fs::create_dir_all(p.join("cuda/sub")).unwrap();
        std::fs::write(p.join("cuda/k.cu"), "#include \"h.cuh\"\n// v1\n").unwrap();
        std::fs::write(p.join("cuda/h.cuh"), "// header v1\n").unwrap();
        std::fs::write(p.join("cuda/sub/deep.h"), "// deep\n").unwrap();
        std::fs::write(p.join("cuda/notes.txt"), "not a header").unwrap();
        sh(p, &["add", "."]);
        sh(p, &["commit", "-q", "-m", "one"]);
        std::fs::write(p.join("cuda/k.cu"), "#include \"h.cuh\"\n// v2\n").unwrap();
        std::fs::write(p.join("cuda/h.cuh"), "// header v2\n").unwrap();
        sh(p, &["commit", "-q", "-am", "two"]);
        dir
    }

    #[test]
    fn a_revision_gives_the_kernel_and_its_headers_as_they_were_then() {
        let dir = repo();
        let old = read(dir.path(), "HEAD~1", "cuda/k.cu").unwrap();
        assert!(old.text.contains("// v1"), "{}", old.text);
        assert_eq!(
            old.headers,
            vec![
                ("h.cuh".to_string(), "// header v1\n".to_string()),
                ("sub/deep.h".to_string(), "// deep\n".to_string()),
            ]
        );
        assert_eq!(old.commit.len(), 40);
        let new = read(dir.path(), "HEAD", "cuda/k.cu").unwrap();
        assert!(new.text.contains("// v2") && new.headers[0].1.contains("v2"));
        assert_ne!(old.commit, new.commit);
    }

    #[test]
    fn an_unknown_revision_or_file_is_refused_with_the_fix() {
        let dir = repo();
        let err = read(dir.path(), "no-such-branch", "cuda/k.cu").unwrap_err();
        assert!(
            err.contains("`no-such-branch` is not a commit") && err.contains("fetch-depth: 0"),
            "{err}"
        );
        let err = read(dir.path(), "HEAD", "cuda/missing.cu").unwrap_err();
        assert!(
            err.contains("`cuda/missing.cu` is not a file at HEAD")
                && err.contains("git:HEAD:PATH"),
            "{err}"
        );
    }

    #[test]
    fn a_project_in_a_folder_of_a_larger_repository_reads_paths_from_its_own_root() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path();
        sh(p, &["init", "-q"]);
        sh(p, &["config", "user.email", "t@t"]);
        sh(p, &["config", "user.name", "t"]);
        std::fs::create_dir_all(p.join("proj/cuda")).unwrap();
        std::fs::write(p.join("proj/cuda/k.cu"), "// kernel\n").unwrap();
        std::fs::write(p.join("proj/cuda/é.cuh"), "// accented\n").unwrap();
        sh(p, &["add", "."]);
        sh(p, &["commit", "-q", "-m", "one"]);
        let files = read(&p.join("proj"), "HEAD", "cuda/k.cu").unwrap();
        assert_eq!(files.text, "// kernel\n");
        assert_eq!(
            files.headers,
            vec![("é.cuh".to_string(), "// accented\n".to_string())],
            "a name git would quote is read as it is"
        );
        assert!(read(&p.join("proj"), "HEAD", "./cuda/k.cu").is_ok());
        let err = read(&p.join("proj"), "HEAD", "cuda").unwrap_err();
        assert!(
            err.contains("is not a file"),
            "a folder is not a kernel: {err}"
        );
    }

    #[test]
    fn a_folder_that_is_not_a_repository_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let err = read(dir.path(), "HEAD", "cuda/k.cu").unwrap_err();
        assert!(err.contains("is not a commit of the repository"), "{err}");
    }
}
