//! End-to-end tests of `sdpa-runner build`: its machine-code comparison with a base kernel
//! (`--base-kernel`, `--require-same-code`). Those that compile need NVRTC and the CUDA headers
//! (LD_LIBRARY_PATH, CUDA_HOME or SDPA_CUDA_INCLUDE), not a GPU: run them with
//! `cargo test --test build_cli -- --include-ignored` where NVRTC is.

mod common;

use common::{output, project_root, runner};

/// A copy of Stage D's source in a folder of its own, with `edit` applied to its text.
fn stage_d_copy(edit: impl Fn(String) -> String) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let text =
        std::fs::read_to_string(project_root().join("cuda/sdpa_fp8_stage_d_wgmma.cu")).unwrap();
    let edited = edit(text.clone());
    assert_ne!(edited, text, "the edit must change the source");
    std::fs::write(dir.path().join("sdpa_fp8_stage_d_wgmma.cu"), edited).unwrap();
    dir
}

/// The machine-code table's rows (`--cp-async 0`: variant st2).
fn function_rows(stdout: &str) -> Vec<&str> {
    stdout
        .lines()
        .filter(|l| l.starts_with("st2 ") && l.contains(" sdpa_fp8_stage_d_wgmma_"))
        .collect()
}

fn build_against(base: &std::path::Path, extra: &[&str]) -> (i32, String, String) {
    output(
        runner()
            .args([
                "build",
                "--kernel",
                "stage-d",
                "--cp-async",
                "0",
                "--base-kernel",
            ])
            .arg(base)
            .args(extra),
    )
}

#[test]
fn require_same_code_without_a_base_kernel_is_a_usage_error() {
    let (code, stdout, stderr) = output(runner().args(["build", "--require-same-code"]));
    assert_eq!(code, 2, "{stdout}{stderr}");
    assert!(stderr.contains("--base-kernel"), "{stderr}");
}

#[test]
#[ignore = "needs NVRTC and the CUDA headers (no GPU)"]
fn a_base_kernel_that_differs_only_in_comments_has_the_same_machine_code_everywhere() {
    let dir = stage_d_copy(|t| t + "\n// a comment the base kernel has and ours has not\n");
    let (code, stdout, stderr) = build_against(
        &dir.path().join("sdpa_fp8_stage_d_wgmma.cu"),
        &["--require-same-code"],
    );
    assert_eq!(code, 0, "{stdout}{stderr}");
    let rows = function_rows(&stdout);
    assert!(rows.len() >= 4, "a row per entry at least:\n{stdout}");
    assert!(rows.iter().all(|r| r.ends_with("  same")), "{stdout}");
    assert!(
        stdout.contains(&format!(
            "machine code: all {} functions are the base's",
            rows.len()
        )),
        "{stdout}"
    );
}

#[test]
#[ignore = "needs NVRTC and the CUDA headers (no GPU)"]
fn a_base_kernel_whose_epilogue_differs_names_every_function_and_fails_require_same_code() {
    // STAGED_O's default flipped in the base: every function's epilogue (docs/PERF.md "Stage D,
    // change 38"), and only that, differs.
    let dir = stage_d_copy(|t| t.replace("#define STAGED_O 1\n", "#define STAGED_O 0\n"));
    let (code, stdout, stderr) = build_against(
        &dir.path().join("sdpa_fp8_stage_d_wgmma.cu"),
        &["--require-same-code"],
    );
    assert_eq!(code, 1, "{stdout}{stderr}");
    let rows = function_rows(&stdout);
    assert!(rows.len() >= 4, "a row per entry at least:\n{stdout}");
    assert!(
        rows.iter().all(|r| r.contains("DIFFERS: instructions")),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!(
            "machine code: {n} of {n} functions differ from the base's",
            n = rows.len()
        )),
        "{stdout}"
    );
    for function in [
        "sdpa_fp8_stage_d_wgmma_d128 ",
        "sdpa_fp8_stage_d_wgmma_d128_m128 ",
    ] {
        let row = stdout
            .lines()
            .find(|l| l.contains(function))
            .unwrap_or_else(|| panic!("no row for {function}:\n{stdout}"));
        assert!(row.contains("DIFFERS: instructions"), "{row}");
    }
    assert!(
        stdout.contains("GATE FAILED: --require-same-code"),
        "{stdout}"
    );
    // Without the flag the comparison informs and the build passes.
    let (code, stdout, stderr) = build_against(&dir.path().join("sdpa_fp8_stage_d_wgmma.cu"), &[]);
    assert_eq!(code, 0, "{stdout}{stderr}");
}
