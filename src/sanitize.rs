//! The sanitizer stage of a run (`--sanitize`, docs/DESIGN.md "Sanitizers in the gate"):
//! compute-sanitizer's memcheck, racecheck, synccheck and initcheck over each variant of the
//! kernel under test, on a few small problems that reach every edge, each in a child run of
//! this binary (correctness only: timing never runs under a sanitizer). Every tool that finds
//! something, times out, or does not run to the end fails the gate, named with its tool, its
//! variant, the problem and the sanitizer's first report; none of them ever passes quietly.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// The tools, in the order they run.
pub const TOOLS: [&str; 4] = ["memcheck", "racecheck", "synccheck", "initcheck"];

/// Small problems that reach every edge: S 1, 77 and 129 (partial query and KV tiles), GQA
/// and MQA with S_q != S_k under a causal mask (rows that see no key), D 128, and a short GQA
/// query at D 128 (Stage C packs its heads and runs its deeper pipeline, whose 4-stage ring
/// its 5 steps of keys wrap).
pub const SHAPES: &str = "1x2x1x64,1x2x77x64,1x2x129x64,1x4x129x128:hkv=2:causal,2x4x77x64:sk=129:hkv=1:causal,2x8x3x128:sk=600:hkv=2";

/// The child's exit code when the sanitizer found something.
const FINDINGS_EXIT: i32 = 86;

/// The oldest compute-sanitizer that knows sm_90 (CUDA 12.0's, 2022.4).
const MIN_VERSION: (u32, u32) = (2022, 4);

/// How one tool went on one variant.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SanitizerResult {
    pub tool: String,
    pub variant: String,
    /// `clean`, `findings`, or `failed` (timed out, crashed, or the run under it did not end
    /// with a verdict).
    pub outcome: String,
    /// The sanitizer's summary line, or why the tool failed.
    pub summary: String,
    /// The first report, a few lines.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_report: Option<String>,
    /// The problem whose check ran into the first report, as the run printed it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub problem: Option<String>,
    pub seconds: f64,
}

impl SanitizerResult {
    pub fn clean(&self) -> bool {
        self.outcome == "clean"
    }
}

/// A usable compute-sanitizer.
#[derive(Debug, Clone)]
pub struct Sanitizer {
    pub path: PathBuf,
    pub version: String,
}

/// Finds compute-sanitizer (`$COMPUTE_SANITIZER`, then PATH, then /usr/local/cuda/bin) and
/// checks its version; the error names the fix.
pub fn locate() -> Result<Sanitizer, String> {
    locate_among(&candidates())
}

/// Where compute-sanitizer is looked for, in order.
fn candidates() -> Vec<PathBuf> {
    std::env::var_os("COMPUTE_SANITIZER")
        .map(PathBuf::from)
        .into_iter()
        .chain(
            std::env::var_os("PATH")
                .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
                .unwrap_or_default()
                .into_iter()
                .map(|d| d.join("compute-sanitizer")),
        )
        .chain([PathBuf::from("/usr/local/cuda/bin/compute-sanitizer")])
        .collect()
}

/// The first of `candidates` that exists, with its version checked.
fn locate_among(candidates: &[PathBuf]) -> Result<Sanitizer, String> {
    let path = candidates.iter().find(|p| p.is_file()).cloned().ok_or(
        "--sanitize needs compute-sanitizer (CUDA toolkit), found neither $COMPUTE_SANITIZER, \
         nor on PATH, nor in /usr/local/cuda/bin: install the toolkit or point \
         COMPUTE_SANITIZER at it, or drop --sanitize",
    )?;
    let out = Command::new(&path)
        .arg("--version")
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run {} --version: {e}", path.display()))?;
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    let version = parse_version(&text).ok_or_else(|| {
        format!(
            "{} --version printed no `Version YYYY.N`: is it compute-sanitizer? ({})",
            path.display(),
            text.trim().lines().next().unwrap_or("no output")
        )
    })?;
    if version < MIN_VERSION {
        return Err(format!(
            "{} is version {}.{}, older than {}.{} (CUDA 12.0), the first that knows Hopper; \
             install a newer CUDA toolkit",
            path.display(),
            version.0,
            version.1,
            MIN_VERSION.0,
            MIN_VERSION.1
        ));
    }
    Ok(Sanitizer {
        path,
        version: format!("{}.{}", version.0, version.1),
    })
}

fn parse_version(text: &str) -> Option<(u32, u32)> {
    let at = text.find("Version ")? + "Version ".len();
    let mut parts = text[at..].split(|c: char| !c.is_ascii_digit());
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next().and_then(|m| m.parse().ok()).unwrap_or(0);
    Some((major, minor))
}

/// Runs `tool` over `runner_args` (a correctness-only run of this binary, `exe`), with a time
/// limit; `variant` names it in the result. Output goes to files under `work`.
pub fn run_tool(
    sanitizer: &Sanitizer,
    tool: &str,
    variant: &str,
    exe: &Path,
    runner_args: &[String],
    work: &Path,
    limit: Duration,
) -> SanitizerResult {
    let started = Instant::now();
    let failed = |summary: String| SanitizerResult {
        tool: tool.into(),
        variant: variant.into(),
        outcome: "failed".into(),
        summary,
        first_report: None,
        problem: None,
        seconds: started.elapsed().as_secs_f64(),
    };
    let log = work.join(format!("{tool}-{variant}.log"));
    let Ok(file) = std::fs::File::create(&log) else {
        return failed(format!("cannot write its log {}", log.display()));
    };
    let Ok(file2) = file.try_clone() else {
        return failed(format!("cannot write its log {}", log.display()));
    };
    let mut cmd = Command::new(&sanitizer.path);
    cmd.args([
        "--tool",
        tool,
        "--error-exitcode",
        &FINDINGS_EXIT.to_string(),
    ]);
    if tool == "memcheck" {
        // An overrun into the next allocation is invisible without padding.
        cmd.args(["--padding", "256"]);
    }
    cmd.arg(exe)
        .args(runner_args)
        .env_remove("USE_CP_ASYNC")
        .stdin(Stdio::null())
        .stdout(file)
        .stderr(file2);
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => return failed(format!("cannot start {}: {e}", sanitizer.path.display())),
    };
    crate::interrupt::register_child(child.id());
    use wait_timeout::ChildExt;
    let status = child.wait_timeout(limit);
    let status = match status {
        Ok(Some(s)) => Some(s),
        Ok(None) | Err(_) => {
            let _ = child.kill();
            let _ = child.wait();
            None
        }
    };
    crate::interrupt::unregister_child(child.id());
    let mut text = String::new();
    let _ = std::fs::File::open(&log).and_then(|mut f| f.read_to_string(&mut text));
    let Some(status) = status else {
        return failed(format!(
            "timed out after {} s and was stopped (log: {})",
            limit.as_secs(),
            log.display()
        ));
    };
    let mut r = interpret(tool, variant, status.code(), &text);
    r.seconds = started.elapsed().as_secs_f64();
    if !r.clean() {
        r.summary = format!("{} (log: {})", r.summary, log.display());
    }
    r
}

/// What a sanitizer's exit code and output say.
fn interpret(tool: &str, variant: &str, code: Option<i32>, text: &str) -> SanitizerResult {
    let summary = text
        .lines()
        .rev()
        .find(|l| l.contains("ERROR SUMMARY") || l.contains("RACECHECK SUMMARY"))
        .map(|l| l.trim_start_matches("========= ").trim().to_string());
    let (outcome, summary) = match (code, summary) {
        (Some(0), Some(s)) => ("clean", s),
        (Some(FINDINGS_EXIT), Some(s)) => ("findings", s),
        (Some(FINDINGS_EXIT), None) => ("findings", "findings reported".to_string()),
        (Some(0), None) => (
            "failed",
            "ended without a sanitizer summary: did it run the program?".to_string(),
        ),
        (Some(c), _) => (
            "failed",
            format!("the run under it ended with exit {c}, not a verdict"),
        ),
        (None, _) => ("failed", "crashed (killed by a signal)".to_string()),
    };
    let report_at = text.lines().position(|l| {
        let l = l.trim_start_matches("========= ").trim();
        // Not a summary line: racecheck's clean summary says "0 hazards displayed".
        !l.contains("SUMMARY")
            && (l.starts_with("Invalid")
                || l.starts_with("Race")
                || l.contains("hazard")
                || l.starts_with("Barrier")
                || l.starts_with("Uninitialized")
                || l.starts_with("Program hit")
                || l.starts_with("Error:")
                || l.contains("error detected"))
    });
    let lines: Vec<&str> = text.lines().collect();
    let first_report = report_at.map(|i| {
        lines[i..lines.len().min(i + 3)]
            .iter()
            .map(|l| l.trim_start_matches("========= ").trim())
            .collect::<Vec<_>>()
            .join(" | ")
    });
    // The run prints a problem's record after its launches: the first record after the
    // report names the problem it came from.
    // Under memcheck a stray access faults the launch, and the run's error names the problem
    // (`error: variant cp0 on shape NAME (...) seed 0 ...`).
    let problem = report_at.and_then(|i| {
        lines[i..].iter().find_map(|l| {
            if l.starts_with('[') && l.contains("seed=") {
                l.split(']')
                    .next()
                    .map(|p| p.trim_start_matches('[').trim().to_string())
            } else {
                let rest = l.split_once(" on shape ")?.1;
                Some(rest.split([' ', '(']).next()?.to_string())
            }
        })
    });
    let outcome = if outcome == "clean" && first_report.is_some() {
        "findings"
    } else {
        outcome
    };
    SanitizerResult {
        tool: tool.into(),
        variant: variant.into(),
        outcome: outcome.into(),
        summary,
        first_report,
        problem,
        seconds: 0.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clean_run_findings_and_a_run_without_a_verdict_are_told_apart() {
        let clean = "[small] seed=0 cp0 PASS\n========= ERROR SUMMARY: 0 errors\n";
        assert_eq!(
            interpret("memcheck", "cp0", Some(0), clean).outcome,
            "clean"
        );
        // racecheck's own words for a clean run (compute-sanitizer 2025.3 on an H100).
        let race_clean =
            "========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)\n";
        let r = interpret("racecheck", "cp0", Some(0), race_clean);
        assert_eq!((r.outcome.as_str(), r.first_report), ("clean", None));
        let found = "========= COMPUTE-SANITIZER\n========= Invalid __global__ read of size 4 bytes\n\
                     =========     at sdpa_fp8_stage_c_mma_d64+0x1a0\n=========     by thread (3,0,0)\n\
                     [1x2x77x64] seed=0 cp1 PASS\n========= ERROR SUMMARY: 1 error\n";
        let r = interpret("memcheck", "cp1", Some(FINDINGS_EXIT), found);
        assert_eq!(r.outcome, "findings");
        assert_eq!(r.problem.as_deref(), Some("1x2x77x64"));
        assert!(
            r.first_report
                .unwrap()
                .starts_with("Invalid __global__ read of size 4 bytes | at sdpa")
        );
        assert_eq!(r.summary, "ERROR SUMMARY: 1 error");
        // memcheck on an H100: the stray read faults the launch, the run names the problem.
        let faulted = "========= Invalid __global__ read of size 4 bytes\n\
                       =========     at void sdpa_body<(int)64, (bool)0>(...)+0x7c0 in q.cu:491\n\
                       ========= Program hit CUDA_ERROR_LAUNCH_FAILED (error 719)\n\
                       error: variant cp0 on shape 1x2x1x64 (1x2x1x64) seed 0 on GPU 0 failed\n\
                       ========= ERROR SUMMARY: 5 errors\n";
        let r = interpret("memcheck", "cp0", Some(FINDINGS_EXIT), faulted);
        assert_eq!(
            (r.outcome.as_str(), r.problem.as_deref()),
            ("findings", Some("1x2x1x64"))
        );
        let no_verdict = interpret("racecheck", "cp0", Some(4), "error: kernel fault");
        assert_eq!(no_verdict.outcome, "failed");
        assert!(no_verdict.summary.contains("exit 4"));
        assert_eq!(interpret("synccheck", "cp0", None, "").outcome, "failed");
        // A zero exit with no summary did not run the program: never clean.
        assert_eq!(
            interpret("initcheck", "cp0", Some(0), "hello").outcome,
            "failed"
        );
    }

    #[test]
    fn versions_are_read_from_the_banner() {
        let banner = "NVIDIA (R) Compute Sanitizer\nCopyright (c) 2020-2025\nVersion 2025.2.0.0 (build 123)\n";
        assert_eq!(parse_version(banner), Some((2025, 2)));
        assert_eq!(parse_version("nothing"), None);
    }

    /// A fake compute-sanitizer running `body` (crate::testing::fake_executable).
    #[cfg(unix)]
    fn fake(dir: &Path, body: &str) -> Sanitizer {
        let path = dir.join("compute-sanitizer");
        crate::testing::fake_executable(&path, body);
        Sanitizer {
            path,
            version: "test".into(),
        }
    }

    #[cfg(unix)]
    #[test]
    fn a_missing_or_too_old_sanitizer_is_refused_naming_the_fix() {
        let dir = tempfile::tempdir().unwrap();
        let err = locate_among(&[dir.path().join("nope")]).unwrap_err();
        assert!(
            err.contains("COMPUTE_SANITIZER") && err.contains("drop --sanitize"),
            "{err}"
        );
        let old = fake(
            dir.path(),
            "echo 'NVIDIA (R) Compute Sanitizer'; echo 'Version 2021.3.1'",
        );
        let err = locate_among(std::slice::from_ref(&old.path)).unwrap_err();
        assert!(
            err.contains("2021.3") && err.contains("older than 2022.4"),
            "{err}"
        );
        let other = fake(dir.path(), "echo 'hello'");
        let err = locate_among(std::slice::from_ref(&other.path)).unwrap_err();
        assert!(err.contains("is it compute-sanitizer"), "{err}");
        let good = fake(dir.path(), "echo 'Version 2025.2.0.0 (build 1)'");
        assert_eq!(
            locate_among(std::slice::from_ref(&good.path))
                .unwrap()
                .version,
            "2025.2"
        );
    }

    #[cfg(unix)]
    #[test]
    fn a_sanitizer_that_hangs_is_stopped_at_its_limit_and_fails_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let s = fake(dir.path(), "sleep 30");
        let t0 = Instant::now();
        let r = run_tool(
            &s,
            "racecheck",
            "cp1",
            Path::new("x"),
            &[],
            dir.path(),
            Duration::from_millis(300),
        );
        assert!(t0.elapsed() < Duration::from_secs(10));
        assert_eq!(
            (r.outcome.as_str(), r.tool.as_str(), r.variant.as_str()),
            ("failed", "racecheck", "cp1")
        );
        assert!(r.summary.contains("timed out"), "{}", r.summary);
    }

    #[cfg(unix)]
    #[test]
    fn a_sanitizer_that_crashes_or_finds_something_fails_and_a_clean_one_passes() {
        let dir = tempfile::tempdir().unwrap();
        let run = |body: &str| {
            let s = fake(dir.path(), body);
            run_tool(
                &s,
                "memcheck",
                "cp0",
                Path::new("x"),
                &[],
                dir.path(),
                Duration::from_secs(10),
            )
        };
        assert_eq!(run("kill -SEGV $$").outcome, "failed");
        let found = run(
            "echo '========= Invalid __global__ read of size 1 bytes'; echo '[small] seed=0 cp0 PASS'; echo '========= ERROR SUMMARY: 1 error'; exit 86",
        );
        assert_eq!(
            (found.outcome.as_str(), found.problem.as_deref()),
            ("findings", Some("small"))
        );
        assert!(run("echo '========= ERROR SUMMARY: 0 errors'; exit 0").clean());
    }
}
