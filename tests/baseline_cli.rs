//! `sdpa-runner baseline record|compare` end to end on CPU-backend runs: a baseline per device
//! model, replaced whole; a missing one is a notice and exit 0; failing runs are refused.

mod common;

use std::path::{Path, PathBuf};

use common::{entries, output, run_dirs, runner};

fn cpu_run(results: &Path, extra: &[&str]) -> PathBuf {
    let args = [
        &[
            "--shapes", "small", "--seeds", "0", "--iters", "10", "--rounds", "5",
        ][..],
        extra,
    ];
    common::cpu_run_dir(results, &args.concat(), true)
}

fn baseline(args: &[&std::ffi::OsStr]) -> (i32, String, String) {
    output(runner().arg("baseline").args(args))
}

#[test]
fn without_a_baseline_for_the_device_compare_is_a_notice_and_exit_0() {
    let dir = tempfile::tempdir().unwrap();
    let run = cpu_run(&dir.path().join("results"), &[]);
    let empty = dir.path().join("baselines");
    let (code, stdout, stderr) = baseline(&[
        "compare".as_ref(),
        run.as_os_str(),
        "--dir".as_ref(),
        empty.as_os_str(),
    ]);
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(
        stdout.contains("notice: no committed baseline for") && stdout.contains("baseline record"),
        "{stdout}"
    );
    assert!(!empty.exists(), "a notice writes nothing");
}

#[test]
fn a_recorded_baseline_is_compared_and_a_second_record_replaces_it_whole() {
    let dir = tempfile::tempdir().unwrap();
    let results = dir.path().join("results");
    let first = cpu_run(&results, &[]);
    let second = cpu_run(&results, &[]);
    let store = dir.path().join("baselines");
    for run in [&first, &second] {
        let (code, stdout, stderr) = baseline(&[
            "record".as_ref(),
            run.as_os_str(),
            "--dir".as_ref(),
            store.as_os_str(),
        ]);
        assert_eq!(code, 0, "{stdout}{stderr}");
    }
    let models: Vec<PathBuf> = run_dirs(&store);
    assert_eq!(
        models.len(),
        1,
        "one folder per device model, no leftovers: {models:?}"
    );
    let kept = &models[0];
    let name = kept.file_name().unwrap().to_string_lossy().into_owned();
    assert!(
        name.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-._".contains(c)),
        "{name}"
    );
    let bytes = |dir: &Path| std::fs::read(dir.join("perf.json")).unwrap();
    assert_ne!(
        bytes(&first),
        bytes(&second),
        "two runs, two sets of timings"
    );
    assert_eq!(
        bytes(kept),
        bytes(&second),
        "the second record replaced the first"
    );
    assert!(
        !std::fs::read_dir(&store).unwrap().any(|e| e
            .unwrap()
            .file_name()
            .to_string_lossy()
            .starts_with('.')),
        "no staging or replaced folder left"
    );
    let out = dir.path().join("C.md");
    let (code, stdout, stderr) = baseline(&[
        "compare".as_ref(),
        first.as_os_str(),
        "--dir".as_ref(),
        store.as_os_str(),
        "--out".as_ref(),
        out.as_os_str(),
    ]);
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(stdout.contains("unpaired") && out.is_file(), "{stdout}");
}

#[test]
fn a_failing_run_is_refused_as_a_baseline() {
    let dir = tempfile::tempdir().unwrap();
    let run = cpu_run(
        &dir.path().join("results"),
        &["--emulation-defect", "skip-last-kv-tile"],
    );
    let store = dir.path().join("baselines");
    let (code, _, stderr) = baseline(&[
        "record".as_ref(),
        run.as_os_str(),
        "--dir".as_ref(),
        store.as_os_str(),
    ]);
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("all_pass: false") && stderr.contains("passing run"),
        "{stderr}"
    );
    assert!(entries(&store).is_empty());
}
