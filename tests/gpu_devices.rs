//! `--devices` on a GPU machine: however many workers share the problems, the result files
//! hold the same rows in the same order as GPU 0 alone; only each row's GPU differs. On a
//! machine of one GPU, `--devices 0,0` (two workers on GPU 0, untimed) takes the place of a
//! second GPU; scripts/prove_devices.sh measures the throughput.

mod common;

use common::{entries, output, read_json, run_dirs, runner};
use serde_json::Value;

/// Runs the runner with `args` into a fresh folder; returns the exit code, stdout and the
/// one file `file` of its run directory.
fn run(args: &[&str], file: &str) -> (i32, String, Value) {
    let results = tempfile::tempdir().unwrap();
    let (code, stdout, stderr) =
        output(runner().args(args).arg("--results-dir").arg(results.path()));
    assert!(
        code == 0 || code == 1,
        "{args:?}: exit {code}\n{stdout}{stderr}"
    );
    let dir = &run_dirs(results.path())[0];
    (code, stdout, read_json(&dir.join(file)))
}

/// The rows of `key`, each without its GPU; every row must name one (index and UUID).
fn rows_without_gpu(file: &Value, key: &str) -> (Vec<Value>, Vec<u64>) {
    let mut gpus = Vec::new();
    let rows = file[key]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            let mut r = r.clone();
            let gpu = r
                .as_object_mut()
                .unwrap()
                .remove("gpu")
                .expect("every row names its GPU");
            assert!(gpu["uuid"].as_str().unwrap().starts_with("GPU-"), "{gpu}");
            gpus.push(gpu["index"].as_u64().unwrap());
            r
        })
        .collect();
    (rows, gpus)
}

/// The multi-worker choice this machine allows without timing: every GPU, or GPU 0 twice.
fn several() -> &'static str {
    let (_, stdout, _) = output(std::process::Command::new("nvidia-smi").arg("-L"));
    if stdout.lines().filter(|l| l.starts_with("GPU ")).count() > 1 {
        "all"
    } else {
        "0,0"
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn several_workers_give_gpu_0s_correctness_rows_in_the_same_order() {
    let args = ["--shapes", "all", "--seeds", "0,1", "--iters", "0"];
    let (code, _, alone) = run(&args, "correctness.json");
    let devices = several();
    let (code_n, stdout, shared) = run(
        &[&args[..], &["--devices", devices]].concat(),
        "correctness.json",
    );
    assert_eq!((code, code_n), (0, 0));
    let (a, gpus_a) = rows_without_gpu(&alone, "results");
    let (b, gpus_b) = rows_without_gpu(&shared, "results");
    assert_eq!(a, b);
    assert!(gpus_a.iter().all(|&g| g == 0));
    assert!(stdout.contains("workers: "), "{stdout}");
    if devices == "all" {
        assert!(
            gpus_b.iter().any(|&g| g != 0),
            "a second GPU took work: {gpus_b:?}"
        );
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn several_workers_give_gpu_0s_fuzz_and_stress_rows() {
    let devices = several();
    for (args, file, key) in [
        (
            &["fuzz", "--count", "60", "--max-s", "700"][..],
            "fuzz.json",
            "problems",
        ),
        (
            &[
                "stress",
                "--shapes",
                "small,mission,partial77",
                "--seeds",
                "0,1",
                "--repeats",
                "20",
            ],
            "stress.json",
            "results",
        ),
    ] {
        let (code, _, alone) = run(args, file);
        let (code_n, _, shared) = run(&[args, &["--devices", devices]].concat(), file);
        assert_eq!((code, code_n), (0, 0), "{args:?}");
        assert_eq!(
            rows_without_gpu(&alone, key).0,
            rows_without_gpu(&shared, key).0,
            "{args:?}"
        );
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_gpu_listed_twice_is_refused_when_timed_and_a_missing_gpu_exits_2() {
    for (devices, needle) in [("0,0", "--iters 0"), ("0,99", "no GPU 99")] {
        let results = tempfile::tempdir().unwrap();
        let (code, _, stderr) = output(
            runner()
                .args(["--shapes", "small", "--seeds", "0", "--devices", devices])
                .arg("--results-dir")
                .arg(results.path()),
        );
        assert_eq!(code, 2, "{devices}: {stderr}");
        assert!(stderr.contains(needle), "{devices}: {stderr}");
        assert!(entries(results.path()).is_empty());
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_timed_run_on_every_gpu_keeps_each_problems_timings_on_the_gpu_that_checked_it() {
    let results = tempfile::tempdir().unwrap();
    let (code, stdout, stderr) = output(
        runner()
            .args(["--shapes", "small,mission,partial300", "--seeds", "0-3"])
            .args(["--iters", "60", "--devices", "all", "--results-dir"])
            .arg(results.path()),
    );
    assert_eq!(code, 0, "{stdout}{stderr}");
    let dir = &run_dirs(results.path())[0];
    let perf = read_json(&dir.join("perf.json"));
    let correctness = read_json(&dir.join("correctness.json"));
    let gpus = perf["gpus"].as_array().unwrap();
    assert!(!gpus.is_empty());
    for m in perf["measurements"].as_array().unwrap() {
        assert!(gpus.contains(&m["gpu"]), "{}", m["gpu"]);
        let checked = correctness["results"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["shape"] == m["shape"] && r["seed"] == m["seed"])
            .unwrap();
        assert_eq!(
            checked["gpu"], m["gpu"],
            "{} seed {}",
            m["shape"], m["seed"]
        );
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn selftest_shares_its_checks_among_workers_and_records_each_mutants_gpu() {
    let results = tempfile::tempdir().unwrap();
    let (code, stdout, stderr) = output(
        runner()
            .args([
                "selftest",
                "--only",
                "MUTANT_K_SCALE_TWICE,MUTANT_NO_RESCALE",
            ])
            .args(["--repeats", "20", "--devices", several(), "--results-dir"])
            .arg(results.path()),
    );
    assert_eq!(code, 0, "{stdout}{stderr}");
    let dir = &run_dirs(results.path())[0];
    let selftest = read_json(&dir.join("selftest.json"));
    let mutants = selftest["mutants"].as_array().unwrap();
    let names: Vec<&str> = mutants
        .iter()
        .map(|m| m["define"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["MUTANT_K_SCALE_TWICE", "MUTANT_NO_RESCALE"],
        "in the order asked"
    );
    for m in mutants {
        assert!(m["caught_by"].is_string(), "{m}");
        assert!(
            m["gpu"]["uuid"].as_str().unwrap().starts_with("GPU-"),
            "{m}"
        );
    }
    assert_eq!(selftest["clean_kernel_pass"], true);
}
