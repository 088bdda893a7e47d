//! End-to-end tests of the kernel manifest (cuda/kernels.toml): `sdpa-runner kernels` and
//! `--kernel NAME|FILE`. None needs a GPU.

mod common;

use common::{cpu, output, run_dirs, runner};

#[test]
fn kernels_lists_every_kernel_with_its_variants_support_and_who_checks_it() {
    let (code, stdout, stderr) = output(runner().arg("kernels"));
    assert_eq!(code, 0, "{stdout}{stderr}");
    for want in [
        "stage-c (default)",
        "cp0 (USE_CP_ASYNC=0) vs cp1 (USE_CP_ASYNC=1)",
        "stage-d:",
        "st2 (KV_STAGES=2) vs st3 (KV_STAGES=3)",
        "built for sm_90a",
        "P in e4m3",
        "scripts/stage_d/probe.sh",
    ] {
        assert!(stdout.contains(want), "missing {want:?}:\n{stdout}");
    }
}

#[test]
fn the_default_kernel_by_name_runs_the_main_job() {
    let results = tempfile::tempdir().unwrap();
    let (code, stdout, stderr) = cpu(
        &[
            "--kernel", "stage-c", "--shapes", "small", "--seeds", "0", "--iters", "0",
        ],
        results.path(),
    );
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert_eq!(run_dirs(results.path()).len(), 1);
}

#[test]
fn a_kernel_the_runner_cannot_check_is_refused_with_exit_2_and_its_probe_named() {
    let results = tempfile::tempdir().unwrap();
    let (code, stdout, stderr) = cpu(
        &["--kernel", "stage-d", "--shapes", "small", "--seeds", "0"],
        results.path(),
    );
    assert_eq!(code, 2, "{stdout}{stderr}");
    assert!(
        stderr.contains("stage-d") && stderr.contains("scripts/stage_d/probe.sh"),
        "{stderr}"
    );
    assert!(run_dirs(results.path()).is_empty(), "nothing is written");
}

#[test]
fn an_unknown_kernel_name_is_refused_naming_the_known_ones() {
    let results = tempfile::tempdir().unwrap();
    let (code, _, stderr) = cpu(
        &["--kernel", "stage-q", "--shapes", "small", "--seeds", "0"],
        results.path(),
    );
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("stage-c, stage-d") && stderr.contains("sdpa-runner kernels"),
        "{stderr}"
    );
}
