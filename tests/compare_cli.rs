//! `sdpa-runner compare` end to end on CPU-backend runs: the report, the `--gate` exit codes,
//! JUnit and the GitHub summary, and the refusals of runs that cannot be compared. Runs whose
//! timings must differ are made by editing a real run's perf.json (timings are the input here).

mod common;

use std::path::{Path, PathBuf};

use common::{output, read_json, runner};
use serde_json::Value;

/// A real CPU-backend run of `small` with seeds 0 and 1, timed.
fn cpu_run(results: &Path, extra: &[&str]) -> PathBuf {
    let args = [&["--shapes", "small", "--seeds", "0,1"][..], extra];
    common::cpu_run_dir(results, &args.concat(), false)
}

/// Copies a run directory, letting `edit` change its perf.json and correctness.json.
fn edited_copy(run: &Path, to: &Path, edit: impl Fn(&mut Value, &mut Value)) -> PathBuf {
    std::fs::create_dir_all(to).unwrap();
    let (mut perf, mut corr) = (
        read_json(&run.join("perf.json")),
        read_json(&run.join("correctness.json")),
    );
    edit(&mut perf, &mut corr);
    std::fs::write(to.join("perf.json"), serde_json::to_string(&perf).unwrap()).unwrap();
    std::fs::write(
        to.join("correctness.json"),
        serde_json::to_string(&corr).unwrap(),
    )
    .unwrap();
    to.to_path_buf()
}

/// Replaces every timing of a perf.json by a steady pattern around `100 * factor` µs (+-0.4%),
/// so verdicts on edited copies do not depend on how noisy the CPU was.
fn steady_timings(perf: &mut Value, factor: f64) {
    for m in perf["measurements"].as_array_mut().unwrap() {
        for key in ["round_medians_us", "samples_us"] {
            for (i, x) in m[key].as_array_mut().unwrap().iter_mut().enumerate() {
                *x = (100.0 * factor * (1.0 + 0.002 * ((i * 7 % 5) as f64 - 2.0))).into();
            }
        }
    }
}

fn compare(base: &Path, cand: &Path, out: &Path, extra: &[&str]) -> (i32, String, String) {
    output(
        runner()
            .arg("compare")
            .arg(base)
            .arg(cand)
            .arg("--out")
            .arg(out)
            .args(extra),
    )
}

#[test]
fn two_cpu_runs_compare_into_a_report_with_a_picture() {
    let dir = tempfile::tempdir().unwrap();
    let results = dir.path().join("results");
    let (a, b) = (cpu_run(&results, &[]), cpu_run(&results, &[]));
    let out = dir.path().join("COMPARE.md");
    let (code, stdout, stderr) = compare(&a, &b, &out, &[]);
    assert_eq!(code, 0, "{stdout}{stderr}");
    let md = std::fs::read_to_string(&out).unwrap();
    assert!(
        md.contains("# COMPARE: cpu-emu (candidate) vs cpu-emu (baseline)"),
        "{md}"
    );
    assert!(
        md.contains("unpaired") && md.contains("| small | 2 |"),
        "{md}"
    );
    assert!(md.contains("baseline cpu-emu: 2/2 PASS"), "{md}");
    assert!(dir.path().join("COMPARE-latency.svg").is_file());
    assert!(
        stdout.contains("[small] cpu-emu vs cpu-emu: speedup"),
        "{stdout}"
    );
}

#[test]
fn the_gate_passes_a_copy_and_refuses_a_slowdown_and_a_correctness_failure() {
    let dir = tempfile::tempdir().unwrap();
    let run = cpu_run(&dir.path().join("results"), &[]);
    let base = edited_copy(&run, &dir.path().join("base"), |p, _| {
        steady_timings(p, 1.0)
    });
    let out = dir.path().join("C.md");

    let same = edited_copy(&base, &dir.path().join("same"), |_, _| {});
    let (code, stdout, _) = compare(&base, &same, &out, &["--gate"]);
    assert_eq!(
        code, 0,
        "identical timings and passing correctness: {stdout}"
    );

    let slow = edited_copy(&base, &dir.path().join("slow"), |p, _| {
        steady_timings(p, 1.2)
    });
    let (code, stdout, _) = compare(&base, &slow, &out, &["--gate"]);
    assert_eq!(code, 1, "{stdout}");
    assert!(
        stdout
            .contains("GATE FAILED: performance gate, small: cpu-emu vs cpu-emu: SLOWER by 20.0%"),
        "{stdout}"
    );
    let (code, _, _) = compare(&base, &slow, &out, &[]);
    assert_eq!(
        code, 0,
        "without --gate a regression is reported, not an error"
    );

    let slightly = edited_copy(&base, &dir.path().join("slightly"), |p, _| {
        steady_timings(p, 1.02)
    });
    let (code, stdout, _) = compare(&base, &slightly, &out, &["--gate"]);
    assert_eq!(code, 0, "2% is within max_regression_pct 3%: {stdout}");

    let broken = edited_copy(&base, &dir.path().join("broken"), |_, c| {
        c["results"][0]["pass"] = false.into();
        c["all_pass"] = false.into();
    });
    let (code, stdout, _) = compare(&base, &broken, &out, &["--gate"]);
    assert_eq!(code, 1);
    assert!(
        stdout.contains("GATE FAILED: correctness gate, small seed=0 cpu-emu: marked FAIL"),
        "{stdout}"
    );
}

#[test]
fn junit_and_the_github_summary_carry_the_verdicts() {
    let dir = tempfile::tempdir().unwrap();
    let run = cpu_run(&dir.path().join("results"), &[]);
    let base = edited_copy(&run, &dir.path().join("base"), |p, _| {
        steady_timings(p, 1.0)
    });
    let slow = edited_copy(&base, &dir.path().join("slow"), |p, _| {
        steady_timings(p, 1.2)
    });
    let junit = dir.path().join("ci/junit.xml");
    let summary = dir.path().join("summary.md");
    std::fs::write(&summary, "earlier step\n").unwrap();
    let (code, _, _) = output(
        runner()
            .arg("compare")
            .arg(&base)
            .arg(&slow)
            .arg("--out")
            .arg(dir.path().join("C.md"))
            .arg("--junit")
            .arg(&junit)
            .arg("--gate")
            .env("GITHUB_STEP_SUMMARY", &summary),
    );
    assert_eq!(code, 1);
    let xml = std::fs::read_to_string(&junit).unwrap();
    assert!(
        xml.contains(r#"<testsuite name="correctness" tests="2""#),
        "{xml}"
    );
    assert!(
        xml.contains(
            r#"<testsuite name="performance" tests="1" skipped="0" errors="0" failures="1""#
        ),
        "{xml}"
    );
    let s = std::fs::read_to_string(&summary).unwrap();
    assert!(
        s.starts_with("earlier step\n") && s.contains("**SLOWER**"),
        "appended, not overwritten: {s}"
    );
}

#[test]
fn the_main_run_writes_junit_with_a_case_per_correctness_row() {
    let dir = tempfile::tempdir().unwrap();
    let junit = dir.path().join("junit.xml");
    cpu_run(
        &dir.path().join("results"),
        &["--junit", junit.to_str().unwrap()],
    );
    let xml = std::fs::read_to_string(&junit).unwrap();
    assert!(
        xml.contains("small seed=1 cpu-emu") && xml.contains(r#"failures="0""#),
        "{xml}"
    );
}

/// Asserts a refused compare: exit 2, every needle in stderr, and no report written.
fn refused(base: &Path, cand: &Path, extra: &[&str], needles: &[&str]) {
    let out = base.parent().unwrap().join("refused-COMPARE.md");
    let (code, stdout, stderr) = compare(base, cand, &out, extra);
    assert_eq!(code, 2, "{stdout}{stderr}");
    for n in needles {
        assert!(stderr.contains(n), "`{n}` not in: {stderr}");
    }
    assert!(!out.exists(), "nothing is written for a refused comparison");
}

#[test]
fn runs_that_cannot_be_compared_exit_2_and_write_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let base = cpu_run(&dir.path().join("results"), &[]);

    let other_gpu = edited_copy(&base, &dir.path().join("gpu"), |p, _| {
        p["device_name"] = "NVIDIA H100".into()
    });
    refused(&base, &other_gpu, &[], &["NVIDIA H100", "--allow-mismatch"]);
    let out = dir.path().join("override.md");
    let (code, _, _) = compare(&base, &other_gpu, &out, &["--allow-mismatch"]);
    assert_eq!(code, 0);
    assert!(
        std::fs::read_to_string(&out)
            .unwrap()
            .contains("**WARNING:** compared despite a mismatch")
    );

    let other_inputs = edited_copy(&base, &dir.path().join("inputs"), |p, _| {
        p["measurements"][0]["input_checksum"] = "0000".into()
    });
    refused(
        &base,
        &other_inputs,
        &[],
        &["inputs of small seed 0 differ"],
    );

    let fewer_seeds = edited_copy(&base, &dir.path().join("seeds"), |p, _| {
        p["measurements"].as_array_mut().unwrap().pop();
    });
    refused(
        &base,
        &fewer_seeds,
        &["--allow-mismatch"],
        &["different shapes or seeds", "small/1"],
    );

    let correctness_only = cpu_run(&dir.path().join("results2"), &["--iters", "0"]);
    refused(
        &base,
        &correctness_only,
        &[],
        &["no perf.json", "correctness-only run"],
    );

    let malformed = dir.path().join("malformed");
    std::fs::create_dir_all(&malformed).unwrap();
    std::fs::write(malformed.join("perf.json"), "{\"schema_version\": 1,").unwrap();
    refused(&base, &malformed, &[], &["perf.json", "malformed JSON"]);

    let missing = dir.path().join("nowhere");
    refused(&base, &missing, &[], &["nowhere", "no perf.json"]);
}

#[test]
fn a_committed_baseline_loads_and_the_gate_refuses_a_planted_slowdown_of_it() {
    let root = common::project_root();
    let baselines: Vec<PathBuf> = std::fs::read_dir(root.join("results/baselines"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("perf.json").is_file())
        .collect();
    assert!(!baselines.is_empty(), "a committed baseline exists");
    let dir = tempfile::tempdir().unwrap();
    for (i, b) in baselines.iter().enumerate() {
        // The same measurements 5% slower: beyond the 3% allowed and every noise floor.
        let slower = edited_copy(b, &dir.path().join(format!("slow{i}")), |perf, _| {
            for m in perf["measurements"].as_array_mut().unwrap() {
                for key in ["round_medians_us", "samples_us"] {
                    for x in m[key].as_array_mut().unwrap() {
                        *x = (x.as_f64().unwrap() * 1.05).into();
                    }
                }
            }
        });
        let (code, stdout, stderr) = compare(b, &slower, &dir.path().join("C.md"), &["--gate"]);
        assert_eq!(code, 1, "{}: {stdout}{stderr}", b.display());
        assert!(
            stdout.contains("[mission] cp1 vs cp1: speedup -4.7") && stdout.contains("SLOWER"),
            "{stdout}"
        );
        assert!(
            stdout.contains("GATE FAILED: performance gate, mission"),
            "{stdout}"
        );
        let copy = edited_copy(b, &dir.path().join(format!("same{i}")), |_, _| {});
        let (code, stdout, stderr) = compare(b, &copy, &dir.path().join("C.md"), &["--gate"]);
        assert_eq!(code, 0, "{}: {stdout}{stderr}", b.display());
    }
}

/// The holes of `compare --gate` found by editing run files: each must be closed.
#[test]
fn a_candidate_whose_resources_failed_does_not_pass_the_gate() {
    let dir = tempfile::tempdir().unwrap();
    let base = cpu_run(&dir.path().join("results"), &[]);
    // Rows all pass, but a variant's resource gate failed (48 spill bytes): all_pass false.
    let spilled = edited_copy(&base, &dir.path().join("spill"), |_, c| {
        c["all_pass"] = false.into();
        c["resources"] = serde_json::json!({"cpu-emu": {"checks": {"resources.spill_bytes":
            {"value": 48.0, "limit": 0.0, "rule": "<=", "pass": false}}}});
    });
    let (code, stdout, stderr) = compare(&base, &spilled, &dir.path().join("C.md"), &["--gate"]);
    assert_eq!(code, 1, "{stdout}{stderr}");
    assert!(
        stdout.contains("GATE FAILED: resources gate, cpu-emu: resources.spill_bytes 48 > 0"),
        "{stdout}"
    );
    // all_pass false with no named cause still fails.
    let unexplained = edited_copy(&base, &dir.path().join("allpass"), |_, c| {
        c["all_pass"] = false.into();
    });
    let (code, stdout, _) = compare(&base, &unexplained, &dir.path().join("C.md"), &["--gate"]);
    assert_eq!(code, 1, "{stdout}");
    assert!(stdout.contains("all_pass: false"), "{stdout}");
}

#[test]
fn impossible_timings_and_unknown_schema_versions_are_refused_with_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let base = cpu_run(&dir.path().join("results"), &[]);
    let negative = edited_copy(&base, &dir.path().join("neg"), |p, _| {
        steady_timings(p, -1.0)
    });
    refused(
        &base,
        &negative,
        &[],
        &["perf.json", "finite number above 0"],
    );
    let zero = edited_copy(&base, &dir.path().join("zero"), |p, _| {
        steady_timings(p, 0.0)
    });
    refused(&base, &zero, &[], &["finite number above 0"]);
    let empty = edited_copy(&base, &dir.path().join("empty"), |p, _| {
        p["measurements"][0]["samples_us"] = serde_json::json!([]);
    });
    refused(&base, &empty, &[], &["no samples"]);
    let future = edited_copy(&base, &dir.path().join("future"), |_, c| {
        c["schema_version"] = 999.into();
    });
    refused(
        &base,
        &future,
        &[],
        &["correctness.json", "schema_version 999"],
    );
}

#[test]
fn unwritable_outputs_of_compare_exit_2_and_write_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let base = cpu_run(&dir.path().join("results"), &[]);
    let cand = edited_copy(&base, &dir.path().join("cand"), |_, _| {});
    let file = dir.path().join("plain-file");
    std::fs::write(&file, "x").unwrap();
    let out = dir.path().join("out/COMPARE.md");
    let (code, _, stderr) = compare(
        &base,
        &cand,
        &out,
        &["--junit", file.join("j.xml").to_str().unwrap()],
    );
    assert_eq!(code, 2, "{stderr}");
    assert!(!out.exists() && !dir.path().join("out/COMPARE-latency.svg").exists());
    // --out naming a directory.
    let out_dir = dir.path().join("a-dir");
    std::fs::create_dir(&out_dir).unwrap();
    let (code, _, stderr) = compare(&base, &cand, &out_dir, &[]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("is a directory"), "{stderr}");
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        4,
        "nothing new beside the inputs (not even the folder of --out)"
    );
}

#[test]
fn compare_junit_fails_exactly_when_the_gate_does() {
    let dir = tempfile::tempdir().unwrap();
    let base = cpu_run(&dir.path().join("results"), &[]);
    let junit = dir.path().join("j.xml");
    let junit_arg = junit.to_str().unwrap();
    let failures = |xml: &str| -> u32 {
        xml.split("<testsuite ")
            .skip(1)
            .map(|s| {
                let f = s.split("failures=\"").nth(1).unwrap();
                f[..f.find('"').unwrap()].parse::<u32>().unwrap()
            })
            .sum()
    };
    // Resources failed (a failure about a variant) and a perf.json with no correctness.json
    // beside it (a failure about the candidate run, which has no case of its own).
    let spilled = edited_copy(&base, &dir.path().join("spill"), |_, c| {
        c["all_pass"] = false.into();
        c["resources"] = serde_json::json!({"cpu-emu": {"checks": {"resources.spill_bytes":
            {"value": 48.0, "limit": 0.0, "rule": "<=", "pass": false}}}});
    });
    let alone = dir.path().join("alone");
    std::fs::create_dir(&alone).unwrap();
    std::fs::copy(base.join("perf.json"), alone.join("perf.json")).unwrap();
    for cand in [&spilled, &alone] {
        let (code, stdout, _) = compare(
            &base,
            cand,
            &dir.path().join("C.md"),
            &["--gate", "--junit", junit_arg],
        );
        assert_eq!(code, 1, "{stdout}");
        let xml = std::fs::read_to_string(&junit).unwrap();
        assert!(failures(&xml) >= 1, "{}: {xml}", cand.display());
        // Without --gate nothing fails, and JUnit agrees.
        let (code, _, _) = compare(
            &base,
            cand,
            &dir.path().join("C.md"),
            &["--junit", junit_arg],
        );
        assert_eq!(code, 0);
        let xml = std::fs::read_to_string(&junit).unwrap();
        assert_eq!(failures(&xml), 0, "{xml}");
    }
}

/// `compare BASE CAND --floors FILE` (and `--out` in `dir`).
fn compare_with_floors(
    dir: &Path,
    base: &Path,
    cand: &Path,
    floors: &Path,
) -> (i32, String, String) {
    output(
        runner()
            .arg("compare")
            .arg(base)
            .arg(cand)
            .arg("--floors")
            .arg(floors)
            .arg("--out")
            .arg(dir.join("COMPARE.md")),
    )
}

#[test]
fn compare_uses_the_floor_measured_by_noise_on_that_device_and_says_where_it_came_from() {
    let dir = tempfile::tempdir().unwrap();
    let floors = dir.path().join("floors.json");
    let (code, out, err) = output(
        runner()
            .args([
                "noise",
                "--backend",
                "cpu",
                "--processes",
                "3",
                "--shapes",
                "small",
            ])
            .arg("--floors")
            .arg(&floors),
    );
    assert_eq!(code, 0, "{out}{err}");
    let file = read_json(&floors);
    let (device, entry) = file["gpus"].as_object().unwrap().iter().next().unwrap();
    let floor = entry["shapes"]["small"]["floor_pct"].as_f64().unwrap();
    assert!(floor > 0.0 && entry["processes"] == 3, "{entry}");
    let results = dir.path().join("r");
    let (a, b) = (cpu_run(&results, &[]), cpu_run(&results, &[]));
    let (code, out, err) = compare_with_floors(dir.path(), &a, &b, &floors);
    assert_eq!(code, 0, "{out}{err}");
    let expected = format!("noise floor of small: ±{floor:.2}% (measured on {device}: 3 processes");
    assert!(out.contains(&expected), "`{expected}` not in {out}");
    let md = std::fs::read_to_string(dir.path().join("COMPARE.md")).unwrap();
    assert!(md.contains(&expected), "{md}");

    // Another GPU model's floors only: the conservative default, said so.
    let mut other = file.clone();
    let entry = other["gpus"]
        .as_object_mut()
        .unwrap()
        .remove(device)
        .unwrap();
    other["gpus"]["NVIDIA H999"] = entry;
    std::fs::write(&floors, other.to_string()).unwrap();
    let (code, out, _) = compare_with_floors(dir.path(), &a, &b, &floors);
    assert_eq!(code, 0);
    assert!(
        out.contains(&format!("no floors measured on {device}"))
            && out.contains("conservative default"),
        "{out}"
    );
    // A missing file says so; a malformed one is refused naming the key (exit 2).
    let (_, out, _) = compare_with_floors(dir.path(), &a, &b, &dir.path().join("none.json"));
    assert!(out.contains("no floors file at"), "{out}");
    std::fs::write(
        &floors,
        r#"{"version": 1, "gpus": {"G": {"processes": 3}}}"#,
    )
    .unwrap();
    let (code, _, err) = compare_with_floors(dir.path(), &a, &b, &floors);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("floors.json") && err.contains("gpus.G"),
        "{err}"
    );
}

#[test]
fn noise_paired_needs_a_gpu_kernel_and_enough_runs_and_touches_no_file_when_refused() {
    let dir = tempfile::tempdir().unwrap();
    let floors = dir.path().join("floors.json");
    std::fs::write(&floors, "{\"version\": 1, \"gpus\": {}}").unwrap();
    for (extra, needle) in [
        (&["--backend", "cpu"][..], "use --backend cuda"),
        (&["--processes", "4"][..], "use --processes 5 or more"),
        (&["--cp-async", "1"][..], "drop --cp-async"),
    ] {
        let (code, out, err) = output(
            runner()
                .args(["noise", "--paired", "--shapes", "small"])
                .args(extra)
                .arg("--floors")
                .arg(&floors),
        );
        assert_eq!(code, 2, "{extra:?}: {out}{err}");
        assert!(err.contains(needle), "{extra:?}: {err}");
        assert_eq!(
            std::fs::read_to_string(&floors).unwrap(),
            "{\"version\": 1, \"gpus\": {}}"
        );
    }
    // No usable GPU (hidden here, absent in CI): the children's exit 3 is this command's.
    let (code, out, err) = output(
        runner()
            .env("CUDA_VISIBLE_DEVICES", "")
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
    assert_eq!(code, 3, "{out}{err}");
    assert!(err.contains("no usable GPU"), "{err}");
    assert_eq!(
        std::fs::read_to_string(&floors).unwrap(),
        "{\"version\": 1, \"gpus\": {}}"
    );
    // --kernel names the kernel of an in-run measurement only, and must be one.
    for (args, needle) in [
        (&["noise", "--kernel", "stage-d"][..], "--paired"),
        (
            &[
                "noise",
                "--paired",
                "--processes",
                "5",
                "--kernel",
                "stage-x",
            ][..],
            "stage-x",
        ),
    ] {
        let (code, out, err) = output(runner().args(args).arg("--floors").arg(&floors));
        assert_eq!(code, 2, "{args:?}: {out}{err}");
        assert!(err.contains(needle), "{args:?}: {err}");
    }
    assert_eq!(
        std::fs::read_to_string(&floors).unwrap(),
        "{\"version\": 1, \"gpus\": {}}"
    );
}

#[test]
fn a_timed_run_refuses_a_malformed_floors_file_naming_the_key_and_a_correctness_only_run_ignores_it()
 {
    let dir = tempfile::tempdir().unwrap();
    let floors = dir.path().join("floors.json");
    std::fs::write(
        &floors,
        r#"{"version": 1, "gpus": {}, "paired": {"G": {"measured_at": "x", "runs": 5, "seeds": [0], "kernel_sha256": "k", "shapes": {"mission": {"floor_pct": 0.01, "rms_pct": 0, "rms_upper_pct": 0, "max_abs_pct": 0, "speedups_pct": []}}}}}"#,
    )
    .unwrap();
    let results = dir.path().join("r");
    let floors_arg = floors.to_str().unwrap();
    let (code, out, err) = common::cpu(
        &["--shapes", "small", "--seeds", "0", "--floors", floors_arg],
        &results,
    );
    assert_eq!(code, 2, "{out}{err}");
    assert!(
        err.contains("floors.json") && err.contains("paired.G.shapes.mission.floor_pct"),
        "{err}"
    );
    assert!(!results.exists() || common::entries(&results).is_empty());
    let (code, out, err) = common::cpu(
        &[
            "--shapes", "small", "--seeds", "0", "--iters", "0", "--floors", floors_arg,
        ],
        &results,
    );
    assert_eq!(code, 0, "{out}{err}");
}
