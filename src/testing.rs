//! Helpers for the crate's own tests and its integration tests (tests/), kept in one place:
//! not part of the runner's interface.

/// An executable shell script at `path` running `body`. A child process writes it: a file the
/// test process held open for writing could leak into another test thread's fork (until that
/// child's exec) and make running it fail with "Text file busy" (ETXTBSY), as it once did in CI.
#[cfg(unix)]
pub fn fake_executable(path: &std::path::Path, body: &str) {
    use std::io::Write;
    let mut sh = std::process::Command::new("sh")
        .args(["-c", "cat > \"$1\" && chmod 755 \"$1\"", "sh"])
        .arg(path)
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let script = format!("#!/bin/sh\n{body}\n");
    sh.stdin
        .take()
        .unwrap()
        .write_all(script.as_bytes())
        .unwrap();
    assert!(sh.wait().unwrap().success());
}
