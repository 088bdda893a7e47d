//! The PR gate on a GPU (`run --base-kernel SRC --gate`): both kernels built, checked and timed
//! in one run, paired per variant; and the timer's host-released hold and SM clock stamps.
//! The 20-run proofs of the verdicts are scripts/prove_pr_gate.sh.

mod common;

use std::path::{Path, PathBuf};

use common::{output, project_root, read_json, run_dirs, runner};

const KERNEL: &str = "cuda/sdpa_fp8_stage_c_mma.cu";

/// The runner's kernel with `line` prepended, written into `dir`.
fn kernel_with(dir: &Path, name: &str, line: &str) -> PathBuf {
    let text = std::fs::read_to_string(project_root().join(KERNEL)).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, format!("{line}\n{text}")).unwrap();
    path
}

/// `--shapes SHAPES --seeds 0 --base-kernel KERNEL --gate` with `extra`, into `results`.
fn gate(shapes: &str, results: &Path, extra: &[&std::ffi::OsStr]) -> (i32, String, String) {
    output(
        runner()
            .args([
                "--shapes",
                shapes,
                "--seeds",
                "0",
                "--base-kernel",
                KERNEL,
                "--gate",
            ])
            .args(extra)
            .arg("--results-dir")
            .arg(results),
    )
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn the_kernel_against_itself_builds_four_variants_of_the_same_code_and_passes() {
    let dir = tempfile::tempdir().unwrap();
    let (code, stdout, stderr) = gate("small,mission", dir.path(), &[]);
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(
        stdout.contains("cp0 vs base-cp0: SAME CODE")
            && stdout.contains("cp1 vs base-cp1: SAME CODE"),
        "{stdout}"
    );
    let run = &run_dirs(dir.path())[0];
    let perf = read_json(&run.join("perf.json"));
    let names: Vec<&str> = perf["variants"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["cp0", "cp1", "base-cp0", "base-cp1"]);
    let base_pairs: Vec<(String, String, String)> = perf["comparisons"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["pair"] == "base_kernel")
        .map(|c| {
            (
                c["shape"].as_str().unwrap().to_string(),
                c["baseline"].as_str().unwrap().to_string(),
                c["candidate"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(base_pairs.len(), 4, "{base_pairs:?}");
    assert!(
        base_pairs
            .iter()
            .any(|(s, b, c)| s == "mission" && b == "base-cp1" && c == "cp1")
    );
    // Each problem ran the same machine code as its base twin; cp1's is not cp0's.
    for c in perf["comparisons"].as_array().unwrap() {
        let want = c["pair"] == "base_kernel";
        assert_eq!(c["same_machine_code"], want, "{c}");
    }
    let correctness = read_json(&run.join("correctness.json"));
    assert_eq!(correctness["results"].as_array().unwrap().len(), 8);
    let md = std::fs::read_to_string(run.join("COMPARE.md")).unwrap();
    assert!(
        md.contains("the kernel under test vs the base kernel")
            && md.contains("SAME CODE: the kernel under test compiles to the same code")
            && md.contains("4 of 6 comparisons are such controls"),
        "{md}"
    );
    // Every block was released by the host (no expired hold kept) and has an SM clock.
    for m in perf["measurements"].as_array().unwrap() {
        assert_eq!(m["hold_expired_blocks"], 0, "{m}");
        let clocks = m["round_sm_mhz"].as_array().unwrap();
        assert_eq!(clocks.len(), 20);
        for c in clocks {
            let mhz = c.as_f64().expect("an SM clock for every block");
            assert!((300.0..4000.0).contains(&mhz), "{mhz} MHz");
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_change_to_one_function_leaves_the_problems_of_the_others_as_same_code_controls() {
    // Stage D's base without DIRECT_FEW (change 39): only the unmasked D 128 companion's code
    // differs, which cfg-pack runs; small runs D 64's entry, whose code is the same.
    let text =
        std::fs::read_to_string(project_root().join("cuda/sdpa_fp8_stage_d_wgmma.cu")).unwrap();
    let line = "constexpr bool DIRECT_FEW = D == 128 && !CAUSAL && !T::PV_HALVES;";
    assert!(text.contains(line), "the kernel's DIRECT_FEW line moved");
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("without_direct_few.cu");
    std::fs::write(
        &base,
        text.replace(line, "constexpr bool DIRECT_FEW = false;"),
    )
    .unwrap();
    let results = dir.path().join("results");
    let (code, stdout, stderr) = output(
        runner()
            .args([
                "--kernel",
                "stage-d",
                "--shapes",
                "small,cfg-pack",
                "--seeds",
                "0",
            ])
            .arg("--base-kernel")
            .arg(&base)
            .arg("--results-dir")
            .arg(&results),
    );
    assert_eq!(code, 0, "{stdout}{stderr}");
    let run = &run_dirs(&results)[0];
    let perf = read_json(&run.join("perf.json"));
    let mut same: Vec<(String, String, bool)> = perf["comparisons"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["pair"] == "base_kernel")
        .map(|c| {
            (
                c["shape"].as_str().unwrap().to_string(),
                c["candidate"].as_str().unwrap().to_string(),
                c["same_machine_code"].as_bool().expect("recorded"),
            )
        })
        .collect();
    same.sort();
    let want: Vec<(String, String, bool)> = [
        ("cfg-pack", "st2", false),
        ("cfg-pack", "st3", false),
        ("small", "st2", true),
        ("small", "st3", true),
    ]
    .iter()
    .map(|(s, v, b)| (s.to_string(), v.to_string(), *b))
    .collect();
    assert_eq!(same, want, "{stdout}");
    let md = std::fs::read_to_string(run.join("COMPARE.md")).unwrap();
    assert!(md.contains("2 of 6 comparisons are such controls"), "{md}");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_byte_identical_copy_at_another_path_is_the_same_code_and_passes_the_gate() {
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("elsewhere/copy_of_kernel.cu");
    std::fs::create_dir_all(copy.parent().unwrap()).unwrap();
    std::fs::copy(project_root().join(KERNEL), &copy).unwrap();
    let results = dir.path().join("results");
    let (code, stdout, stderr) = gate(
        "small,mission",
        &results,
        &["--kernel".as_ref(), copy.as_os_str()],
    );
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(
        stdout.contains("cp0 vs base-cp0: SAME CODE")
            && stdout.contains("cp1 vs base-cp1: SAME CODE")
            && !stdout.contains("first source difference"),
        "{stdout}"
    );
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_candidate_made_much_slower_fails_the_gate_with_exit_1() {
    let dir = tempfile::tempdir().unwrap();
    let slow = kernel_with(dir.path(), "slow.cu", "#define SDPA_DELAY_CYCLES 40000");
    let results = dir.path().join("results");
    let (code, stdout, stderr) = gate(
        "mission",
        &results,
        &["--kernel".as_ref(), slow.as_os_str()],
    );
    assert_eq!(code, 1, "{stdout}{stderr}");
    assert!(
        stdout.contains("GATE FAILED: performance gate, mission: cp0 vs base-cp0: SLOWER by"),
        "{stdout}"
    );
    assert!(
        stdout.contains("cp0 vs base-cp0: the code differs: source: slow.cu differs")
            && stdout.contains(
                "first source difference: slow.cu line 1: base `// sdpa_fp8_stage_c_mma.cu",
            )
            && stdout.contains("-> `#define SDPA_DELAY_CYCLES 40000`"),
        "{stdout}"
    );
    let run = &run_dirs(&results)[0];
    let correctness = read_json(&run.join("correctness.json"));
    assert_eq!(correctness["all_pass"], true, "slow, but correct");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_mutant_candidate_fails_the_gate_naming_its_check_while_the_base_passes() {
    let dir = tempfile::tempdir().unwrap();
    let mutant = kernel_with(dir.path(), "mutant.cu", "#define MUTANT_NO_RESCALE 1");
    let results = dir.path().join("results");
    let (code, stdout, stderr) = gate(
        "mission",
        &results,
        &["--kernel".as_ref(), mutant.as_os_str()],
    );
    assert_eq!(code, 1, "{stdout}{stderr}");
    let rows: Vec<&str> = stdout.lines().filter(|l| l.contains("max_err=")).collect();
    assert_eq!(rows.len(), 4, "cp0, cp1 and their base twins: {stdout}");
    assert!(
        rows.iter()
            .filter(|l| l.contains(" cp0 ") || l.contains(" cp1 "))
            .all(|l| l.contains("FAIL") && l.contains("kernel.max_err_over_bound")),
        "{stdout}"
    );
    assert!(
        rows.iter()
            .filter(|l| l.contains("base-"))
            .all(|l| l.ends_with("PASS")),
        "{stdout}"
    );
    let correctness = read_json(&run_dirs(&results)[0].join("correctness.json"));
    assert_eq!(correctness["all_pass"], false);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_kernel_reading_one_q_row_past_s_passes_result_checks_but_fails_the_gate_under_sanitize() {
    let dir = tempfile::tempdir().unwrap();
    let mutant = kernel_with(dir.path(), "q_past.cu", "#define MUTANT_Q_READ_PAST_END 1");
    let kernel = ["--kernel".as_ref(), mutant.as_os_str()];
    let (code, stdout, stderr) = gate("small", &dir.path().join("plain"), &kernel);
    assert_eq!(
        code, 0,
        "the output is right, so result checks pass: {stdout}{stderr}"
    );
    let sanitized: Vec<&std::ffi::OsStr> = kernel
        .iter()
        .copied()
        .chain([
            "--sanitize".as_ref(),
            "--sanitize-timeout".as_ref(),
            "300".as_ref(),
        ])
        .collect();
    let (code, stdout, stderr) = gate("small", &dir.path().join("sanitized"), &sanitized);
    assert_eq!(code, 1, "{stdout}{stderr}");
    assert!(
        stdout.contains("GATE FAILED: sanitizer gate, memcheck on cp0, 1x2x1x64: findings")
            && stdout.contains("GATE FAILED: sanitizer gate, memcheck on cp1, 1x2x1x64: findings")
            && stdout.contains("Invalid __global__ read"),
        "{stdout}"
    );
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn the_clean_kernel_is_clean_under_every_sanitizer_and_passes_the_gate() {
    let dir = tempfile::tempdir().unwrap();
    let (code, stdout, stderr) = gate(
        "small",
        dir.path(),
        &[
            "--sanitize".as_ref(),
            "--sanitize-timeout".as_ref(),
            "300".as_ref(),
        ],
    );
    assert_eq!(code, 0, "{stdout}{stderr}");
    for tool in ["memcheck", "racecheck", "synccheck", "initcheck"] {
        for variant in ["cp0", "cp1"] {
            let line = format!("sanitizer {tool:<9} {variant:<6} CLEAN");
            assert!(stdout.contains(&line), "no `{line}` in {stdout}");
        }
    }
    let run = &run_dirs(dir.path())[0];
    let correctness = read_json(&run.join("correctness.json"));
    assert_eq!(correctness["sanitizers"].as_array().unwrap().len(), 8);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn noise_paired_records_this_gpus_in_run_floor_and_the_gate_judges_with_it_saying_so() {
    let dir = tempfile::tempdir().unwrap();
    let floors = dir.path().join("floors.json");
    let (code, out, err) = output(
        runner()
            .args([
                "noise",
                "--paired",
                "--processes",
                "5",
                "--shapes",
                "mission",
            ])
            .arg("--floors")
            .arg(&floors),
    );
    assert_eq!(code, 0, "{out}{err}");
    let file = read_json(&floors);
    let (gpu, entry) = file["paired"].as_object().unwrap().iter().next().unwrap();
    let mission = &entry["shapes"]["mission"];
    // Five runs, cp0 and cp1 each against its base twin: ten A/A comparisons.
    assert_eq!(
        mission["speedups_pct"].as_array().unwrap().len(),
        10,
        "{entry}"
    );
    let floor = mission["floor_pct"].as_f64().unwrap();
    assert!(floor >= 0.2, "{entry}");

    let (code, out, err) = gate(
        "mission",
        &dir.path().join("r"),
        &["--floors".as_ref(), floors.as_os_str()],
    );
    assert_eq!(code, 0, "{out}{err}");
    let expected = format!(
        "noise floor of mission: ±{floor:.2}% (measured on {gpu}: 10 in-run A/A comparisons in 5 runs"
    );
    assert!(out.contains(&expected), "`{expected}` not in {out}");
    let run = &run_dirs(&dir.path().join("r"))[0];
    let perf = read_json(&run.join("perf.json"));
    for c in perf["comparisons"].as_array().unwrap() {
        assert_eq!(c["noise_floor_pct"].as_f64().unwrap(), floor, "{c}");
    }
}
