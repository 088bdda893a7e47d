//! The promise "errors exit before anything is written, nothing half-written is ever left,
//! whatever happens": interrupts, a closed pipe, unwritable outputs, absurd numbers, stale
//! staging folders of killed processes. CPU backend; no GPU needed.

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::refused_with_env as refused;
use common::{entries, output, run_dirs, runner};

/// A CPU run long enough to be interrupted: `long` for many seeds, correctness only.
fn long_cpu_run(results: &Path) -> std::process::Command {
    let mut cmd = runner();
    cmd.args([
        "--backend",
        "cpu",
        "--shapes",
        "long",
        "--seeds",
        "0-999",
        "--iters",
        "0",
        "--results-dir",
    ])
    .arg(results);
    cmd
}

fn wait_for_staging(results: &Path) {
    let started = Instant::now();
    while !run_dirs(results).iter().any(|d| {
        d.file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with(".partial-"))
    }) {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no staging folder appeared"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[cfg(unix)]
#[test]
fn sigint_and_sigterm_remove_the_staged_run_and_exit_128_plus_the_signal() {
    for (signal, code) in [(libc::SIGINT, 130), (libc::SIGTERM, 143)] {
        let results = tempfile::tempdir().unwrap();
        let child = long_cpu_run(results.path())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        wait_for_staging(results.path());
        std::thread::sleep(Duration::from_millis(200));
        // SAFETY: sending a signal to our own child process.
        assert_eq!(unsafe { libc::kill(child.id() as i32, signal) }, 0);
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "signal {signal}: {stderr}");
        assert!(stderr.contains("removed the unfinished run"), "{stderr}");
        assert!(
            entries(results.path()).is_empty(),
            "signal {signal} left {:?}",
            run_dirs(results.path())
        );
    }
}

#[test]
fn a_closed_stdout_pipe_stops_the_run_and_leaves_nothing_behind() {
    let results = tempfile::tempdir().unwrap();
    let mut child = runner()
        .args([
            "--backend",
            "cpu",
            "--shapes",
            "small",
            "--seeds",
            "0-999",
            "--iters",
            "0",
            "--results-dir",
        ])
        .arg(results.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Read the first line, as `| head -1` would, then hang up.
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    assert!(first.contains("cpu"), "{first}");
    let out = child.wait_with_output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(141),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        entries(results.path()).is_empty(),
        "{:?}",
        run_dirs(results.path())
    );
}

#[test]
fn a_staging_folder_left_by_a_killed_process_is_swept_by_the_next_run() {
    let results = tempfile::tempdir().unwrap();
    // pid 2147483632 does not exist: its owner was killed outright (SIGKILL, a power cut).
    // Staging folders carry the host, as `interrupt::host_tag` writes it.
    let host: String = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .unwrap_or_default()
        .trim()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    let host = if host.is_empty() {
        "host".to_string()
    } else {
        host
    };
    let stale = results.path().join(format!(
        ".partial-20260101T000000Z-abcdef-{host}-2147483632"
    ));
    std::fs::create_dir(&stale).unwrap();
    std::fs::write(stale.join("correctness.json"), "{\"half").unwrap();
    let (code, stdout, stderr) = output(
        runner()
            .args([
                "--backend",
                "cpu",
                "--shapes",
                "small",
                "--seeds",
                "0",
                "--iters",
                "0",
            ])
            .arg("--results-dir")
            .arg(results.path()),
    );
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(stderr.contains("no longer exists"), "{stderr}");
    let left = run_dirs(results.path());
    assert_eq!(left.len(), 1, "{left:?}");
    assert!(!stale.exists());
}

#[test]
fn stdout_on_a_full_disk_is_a_warning_and_the_run_still_lands() {
    let Ok(full) = std::fs::OpenOptions::new().write(true).open("/dev/full") else {
        return; // not a Linux machine
    };
    let results = tempfile::tempdir().unwrap();
    let out = runner()
        .args([
            "--backend",
            "cpu",
            "--shapes",
            "small",
            "--seeds",
            "0",
            "--iters",
            "0",
        ])
        .arg("--results-dir")
        .arg(results.path())
        .stdout(full)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("cannot write to stdout"), "{stderr}");
    assert_eq!(run_dirs(results.path()).len(), 1);
}

#[cfg(unix)]
#[test]
fn a_results_dir_whose_name_is_not_utf8_works() {
    use std::os::unix::ffi::OsStrExt;
    let root = tempfile::tempdir().unwrap();
    let results = root.path().join(std::ffi::OsStr::from_bytes(b"r\xff\xfe"));
    let (code, stdout, stderr) = output(
        runner()
            .args([
                "--backend",
                "cpu",
                "--shapes",
                "small",
                "--seeds",
                "0",
                "--iters",
                "0",
            ])
            .arg("--results-dir")
            .arg(&results),
    );
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert_eq!(run_dirs(&results).len(), 1);
}

#[test]
fn timing_counts_beyond_their_range_exit_2_naming_the_range() {
    let cpu = ["--backend", "cpu", "--shapes", "small", "--seeds", "0"];
    for (flag, value, range) in [
        ("--iters", "4294967296", "0 to 1000000"),
        ("--warmup", "18446744073709551615", "0 to 100000"),
        ("--batch", "4294967296", "1 to 10000"),
        ("--batch", "0", "1 to 10000"),
        ("--rounds", "99999999", "1 to 10000"),
    ] {
        let args: Vec<&str> = cpu.iter().copied().chain([flag, value]).collect();
        refused(&args, &[], 2, &[flag, range]);
    }
    refused(
        &["stress", "--backend", "cpu", "--repeats", "4294967295"],
        &[],
        2,
        &["--repeats"],
    );
}

#[test]
fn an_input_spread_that_overflows_f32_is_a_configuration_error() {
    let dir = tempfile::tempdir().unwrap();
    let shapes = dir.path().join("shapes.json");
    std::fs::write(
        &shapes,
        r#"{"version":1,"shapes":[
            {"name":"small","B":1,"H":1,"S":32,"D":64},
            {"name":"mission","B":1,"H":8,"S":512,"D":64},
            {"name":"huge","B":1,"H":1,"S":32,"D":64,"qk_std":1e300}]}"#,
    )
    .unwrap();
    refused(
        &[
            "--backend",
            "cpu",
            "--shapes",
            "huge",
            "--shapes-file",
            shapes.to_str().unwrap(),
        ],
        &[],
        2,
        &["qk_std", "out of range", "100"],
    );
}

#[test]
fn a_gates_file_naming_an_unknown_shape_exits_2() {
    let dir = tempfile::tempdir().unwrap();
    let gates = dir.path().join("gates.json");
    let shipped =
        std::fs::read_to_string(common::project_root().join("gates/default.json")).unwrap();
    std::fs::write(
        &gates,
        shipped.replace(
            "\"target_shapes\": [\"mission\"]",
            "\"target_shapes\": [\"nosuchshape\"]",
        ),
    )
    .unwrap();
    refused(
        &[
            "--backend",
            "cpu",
            "--shapes",
            "small",
            "--gates",
            gates.to_str().unwrap(),
        ],
        &[],
        2,
        &["performance.target_shapes", "nosuchshape"],
    );
}

#[test]
fn the_cpu_backend_refuses_a_bad_or_conflicting_variant_choice_as_cuda_does() {
    let cpu = ["--backend", "cpu", "--shapes", "small", "--seeds", "0"];
    refused(&cpu, &[("USE_CP_ASYNC", "7")], 2, &["USE_CP_ASYNC"]);
    let conflict: Vec<&str> = cpu.iter().copied().chain(["--cp-async", "0"]).collect();
    refused(
        &conflict,
        &[("USE_CP_ASYNC", "1")],
        2,
        &["USE_CP_ASYNC", "--cp-async"],
    );
}

#[test]
fn require_speedup_without_two_timed_variants_is_refused_up_front() {
    refused(
        &[
            "--backend",
            "cpu",
            "--shapes",
            "small",
            "--seeds",
            "0",
            "--require-speedup",
        ],
        &[],
        2,
        &["--require-speedup", "two"],
    );
}

#[test]
fn an_unwritable_junit_path_exits_2_before_the_run() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("plain-file");
    std::fs::write(&file, "x").unwrap();
    let junit = file.join("junit.xml");
    refused(
        &[
            "--backend",
            "cpu",
            "--shapes",
            "small",
            "--seeds",
            "0",
            "--junit",
            junit.to_str().unwrap(),
        ],
        &[],
        2,
        &["junit.xml"],
    );
    refused(
        &[
            "--backend",
            "cpu",
            "--shapes",
            "small",
            "--seeds",
            "0",
            "--junit",
            dir.path().to_str().unwrap(),
        ],
        &[],
        2,
        &["is a directory"],
    );
}

#[test]
fn calibrate_refuses_a_margin_outside_1_to_10() {
    for m in ["0", "-1", "NaN", "inf", "0.5", "11"] {
        let (code, _, stderr) =
            output(runner().args(["calibrate", "results", &format!("--margin={m}")]));
        assert_eq!(code, 2, "--margin {m}: {stderr}");
        assert!(stderr.contains("1 to 10"), "--margin {m}: {stderr}");
    }
}

#[test]
fn commands_without_a_cpu_backend_do_not_advise_one() {
    // `build` and `selftest` need NVRTC or a GPU; whatever is missing, `--backend cpu` is
    // no advice for them (they do not take it).
    for args in [
        vec!["build"],
        vec!["selftest", "--only", "MUTANT_NO_RESCALE"],
    ] {
        let dir = tempfile::tempdir().unwrap();
        let (code, stdout, stderr) = output(
            runner()
                .args(&args)
                .arg("--root")
                .arg(common::project_root())
                .env("CUDA_VISIBLE_DEVICES", "")
                .env("CUDA_HOME", dir.path())
                .env("SDPA_CUDA_INCLUDE", dir.path()),
        );
        if code == 0 {
            continue; // a machine with everything `build` needs
        }
        assert!(
            !stderr.contains("--backend cpu") && !stdout.contains("--backend cpu"),
            "{args:?}: {stderr}"
        );
    }
}

/// `calibrate RUN`'s `| **all** |` row (it must exit 0).
fn calibrate_all_row(run: &Path) -> String {
    let (code, stdout, stderr) = output(runner().arg("calibrate").arg(run));
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(stdout.contains("max ulps from emu"), "{stdout}");
    stdout
        .lines()
        .find(|l| l.starts_with("| **all**"))
        .unwrap_or_else(|| panic!("{stdout}"))
        .to_string()
}

#[test]
fn calibrate_shows_the_largest_ulp_distance_from_the_emulation_zero_for_a_clean_run() {
    let ulps = |defect: &str| {
        let results = tempfile::tempdir().unwrap();
        let args = ["--shapes", "1x1x70x64", "--seeds", "0", "--iters", "0"];
        let (code, _, stderr) = common::cpu(
            &[&args[..], &["--emulation-defect", defect]].concat(),
            results.path(),
        );
        let want = if defect == "none" { 0 } else { 1 };
        assert_eq!(code, want, "{defect}: {stderr}");
        let row = calibrate_all_row(&run_dirs(results.path())[0]);
        let last = row.trim_end_matches(" |").rsplit("| ").next().unwrap();
        last.parse::<u32>().unwrap_or_else(|_| panic!("{row}"))
    };
    assert_eq!(ulps("none"), 0);
    let broken = ulps("skip-last-kv-tile");
    assert!(broken > 16, "{broken}");
}

#[test]
fn calibrate_says_how_many_rows_lack_the_ulp_distance_instead_of_showing_theirs_as_zero() {
    let results = tempfile::tempdir().unwrap();
    let args = ["--shapes", "small", "--seeds", "0,1", "--iters", "0"];
    let (code, _, stderr) = common::cpu(&args, results.path());
    assert_eq!(code, 0, "{stderr}");
    let run = &run_dirs(results.path())[0];
    // One record as written before the field existed.
    let path = run.join("correctness.json");
    let mut v = common::read_json(&path);
    let removed = v["results"][0]
        .as_object_mut()
        .unwrap()
        .remove("emulation_max_ulps");
    assert_eq!(removed, Some(serde_json::json!(0)));
    std::fs::write(&path, serde_json::to_string(&v).unwrap()).unwrap();
    let all = calibrate_all_row(run);
    assert!(all.ends_with("| 0 (1 of 2 rows unrecorded) |"), "{all}");
}

#[test]
fn calibrate_refuses_a_run_with_no_finite_complete_output() {
    let results = tempfile::tempdir().unwrap();
    let (code, _, _) = output(
        runner()
            .args([
                "--backend",
                "cpu",
                "--shapes",
                "small",
                "--seeds",
                "0,1",
                "--iters",
                "0",
            ])
            .args(["--emulation-defect", "leave-row-unwritten", "--results-dir"])
            .arg(results.path()),
    );
    assert_eq!(code, 1);
    let run = &run_dirs(results.path())[0];
    let (code, stdout, stderr) = output(runner().arg("calibrate").arg(run));
    assert_eq!(code, 2, "{stdout}{stderr}");
    assert!(
        stderr.contains("2 row(s) left out") && stderr.contains("no row"),
        "{stderr}"
    );
    assert!(!stdout.contains("proposed thresholds"), "{stdout}");
}
