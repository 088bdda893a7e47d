//! `sdpa-runner merge` end to end on CPU-backend runs: shards merged equal the single run's
//! rows and verdicts; what cannot be one run is refused with exit 2 and nothing written.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use common::{entries, output, read_json, run_dirs, runner};
use serde_json::Value;

fn cpu_run(results: &Path, args: &[&str]) -> PathBuf {
    common::cpu_run_dir(results, args, false)
}

fn merge(runs: &[&Path], results: &Path) -> (i32, String, String) {
    output(
        runner()
            .arg("merge")
            .args(runs)
            .arg("--results-dir")
            .arg(results),
    )
}

/// The rows of a correctness.json by (shape, seed, variant), without the device tag.
fn rows(run: &Path) -> BTreeMap<(String, u64, String), Value> {
    let c = read_json(&run.join("correctness.json"));
    c["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            let mut r = r.clone();
            r.as_object_mut().unwrap().remove("device");
            (
                (
                    r["shape"].as_str().unwrap().to_string(),
                    r["seed"].as_u64().unwrap(),
                    r["variant"].as_str().unwrap().to_string(),
                ),
                r,
            )
        })
        .collect()
}

fn copy_run(run: &Path, to: &Path, edit: impl Fn(&str, &mut Value)) -> PathBuf {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(run).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_str().unwrap().to_string();
        if name.ends_with(".json") {
            let mut v = read_json(&path);
            edit(&name, &mut v);
            std::fs::write(to.join(&name), serde_json::to_string(&v).unwrap()).unwrap();
        }
    }
    to.to_path_buf()
}

#[test]
fn shards_merge_into_the_single_runs_rows_and_verdicts() {
    let dir = tempfile::tempdir().unwrap();
    let timing = ["--iters", "10", "--rounds", "5", "--seeds", "0,1"];
    let single = cpu_run(
        &dir.path().join("single"),
        &[&["--shapes", "small,mission"][..], &timing].concat(),
    );
    let shards = dir.path().join("shards");
    let a = cpu_run(&shards, &[&["--shapes", "small"][..], &timing].concat());
    let b = cpu_run(&shards, &[&["--shapes", "mission"][..], &timing].concat());
    let out = dir.path().join("merged");
    let (code, stdout, stderr) = merge(&[&a, &b], &out);
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(stdout.contains("merged 2 runs (4 rows)"), "{stdout}");
    let merged = &run_dirs(&out)[0];
    assert_eq!(
        rows(merged),
        rows(&single),
        "the same rows, checksums, metrics and verdicts"
    );
    let c = read_json(&merged.join("correctness.json"));
    assert_eq!(
        c["all_pass"],
        read_json(&single.join("correctness.json"))["all_pass"]
    );
    let keys = |run: &Path| -> Vec<(String, u64, String, usize)> {
        let mut k: Vec<_> = read_json(&run.join("perf.json"))["measurements"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| {
                (
                    m["shape"].as_str().unwrap().to_string(),
                    m["seed"].as_u64().unwrap(),
                    m["input_checksum"].as_str().unwrap().to_string(),
                    m["samples_us"].as_array().unwrap().len(),
                )
            })
            .collect();
        k.sort();
        k.into_iter()
            .map(|(s, seed, _, n)| (s, seed, String::new(), n))
            .collect()
    };
    assert_eq!(keys(merged), keys(&single), "every measurement, once");
    let meta = read_json(&merged.join("build_meta.json"));
    assert_eq!(
        meta["backend_details"]["merged_from"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
}

#[test]
fn shards_of_two_device_models_keep_a_perf_file_each_and_tag_their_rows() {
    let dir = tempfile::tempdir().unwrap();
    let shards = dir.path().join("shards");
    let a = cpu_run(
        &shards,
        &[
            "--shapes", "small", "--seeds", "0", "--iters", "10", "--rounds", "5",
        ],
    );
    let b = copy_run(&a, &dir.path().join("other"), |name, v| {
        if name == "perf.json" {
            v["device_name"] = "Other GPU 80GB".into();
        }
    });
    let out = dir.path().join("merged");
    let (code, stdout, stderr) = merge(&[&a, &b], &out);
    assert_eq!(code, 0, "{stdout}{stderr}");
    let merged = &run_dirs(&out)[0];
    assert!(merged.join("perf-Other-GPU-80GB.json").is_file());
    assert!(
        !merged.join("perf.json").exists(),
        "no perf file mixes two models"
    );
    let devices: Vec<String> = read_json(&merged.join("correctness.json"))["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["device"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(devices.len(), 2);
    assert!(
        devices.contains(&"Other GPU 80GB".to_string()),
        "{devices:?}"
    );
}

#[test]
fn what_cannot_be_one_run_is_refused_with_exit_2_and_nothing_written() {
    let dir = tempfile::tempdir().unwrap();
    let shards = dir.path().join("shards");
    let a = cpu_run(
        &shards,
        &["--shapes", "small", "--seeds", "0", "--iters", "0"],
    );
    let b = cpu_run(
        &shards,
        &["--shapes", "mission", "--seeds", "0", "--iters", "0"],
    );
    let timed = cpu_run(
        &shards,
        &[
            "--shapes", "mission", "--seeds", "1", "--iters", "10", "--rounds", "5",
        ],
    );
    let other_kernel = copy_run(&b, &dir.path().join("kernel"), |name, v| {
        if name == "build_meta.json" {
            v["backend_details"]["kv_split"] = 9.into();
        }
    });
    let other_inputs_of_a = copy_run(&a, &dir.path().join("inputs-a"), |name, v| {
        if name == "correctness.json" {
            v["results"][0]["input_checksum"] = "0000".into();
        }
    });
    let out = dir.path().join("merged");
    for (runs, needle) in [
        (vec![&a, &a], "the same row twice"),
        (vec![&a, &other_inputs_of_a], "has different inputs"),
        (vec![&a, &other_kernel], "runs of different kernels"),
        (vec![&a, &timed], "merge timed runs with timed runs"),
        (vec![&a], "at least two run directories"),
    ] {
        let paths: Vec<&Path> = runs.iter().map(|p| p.as_path()).collect();
        let (code, stdout, stderr) = merge(&paths, &out);
        assert_eq!(code, 2, "{needle}: {stdout}{stderr}");
        assert!(stderr.contains(needle), "`{needle}` not in {stderr}");
        assert!(entries(&out).is_empty(), "{needle}: nothing written");
    }
}
