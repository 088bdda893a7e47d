//! End-to-end tests of the binary on the CPU backend and of its refusals of bad input.
//! None needs a GPU; they run in CI.

mod common;

use common::{cpu, entries, output, read_json, run_dirs, runner};

#[test]
fn cpu_backend_main_job_passes_writes_files_and_prints_the_path_last() {
    let results = tempfile::tempdir().unwrap();
    let (code, stdout, stderr) = cpu(
        &["--shapes", "small,mission", "--seeds", "0,1,2"],
        results.path(),
    );
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(
        stdout.contains("cpu") && stdout.contains("no GPU was used"),
        "{stdout}"
    );
    let rows: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with('[') && l.contains("max_err="))
        .collect();
    assert_eq!(rows.len(), 6, "{stdout}");
    assert!(
        rows.iter()
            .all(|r| r.contains("cpu-emu") && r.ends_with("PASS")),
        "{stdout}"
    );
    assert!(stdout.contains("6/6 PASS"));

    assert!(
        stdout.contains("timing: CPU wall time"),
        "the CPU backend labels its timings: {stdout}"
    );
    let dirs = run_dirs(results.path());
    assert_eq!(dirs.len(), 1);
    let last = stdout.lines().last().unwrap();
    assert_eq!(last, format!("results: {}", dirs[0].display()));

    let meta = read_json(&dirs[0].join("build_meta.json"));
    assert_eq!(meta["schema_version"], 2);
    assert_eq!(meta["backend"], "cpu");
    assert!(meta["git"]["sha"].is_string() && meta["git"]["dirty"].is_boolean());
    assert!(meta["host"]["hostname"].is_string());
    assert!(meta["command_line"].as_array().unwrap().len() > 3);

    let perf = read_json(&dirs[0].join("perf.json"));
    assert_eq!(perf["schema_version"], 2);
    assert_eq!(perf["measurements"].as_array().unwrap().len(), 6);
    assert_eq!(
        perf["measurements"][0]["samples_us"]
            .as_array()
            .unwrap()
            .len(),
        20
    );
    assert!(perf["clock"].as_str().unwrap().contains("CPU"));

    let c = read_json(&dirs[0].join("correctness.json"));
    assert_eq!(c["schema_version"], 2);
    assert_eq!(c["all_pass"], true);
    let results = c["results"].as_array().unwrap();
    assert_eq!(results.len(), 6);
    let first = &results[0];
    for key in [
        "shape",
        "B",
        "H",
        "S",
        "D",
        "seed",
        "variant",
        "backend",
        "input_checksum",
        "pass",
        "gates",
    ] {
        assert!(!first[key].is_null(), "missing {key}");
    }
    for key in [
        "max_abs_err",
        "mean_abs_err",
        "rmse",
        "max_err_over_bound",
        "nonfinite",
        "unwritten",
    ] {
        assert!(first["kernel_ref"][key].is_number(), "kernel_ref.{key}");
        assert!(first["end_to_end"][key].is_number(), "end_to_end.{key}");
    }
    assert_eq!(
        (first["shape"].as_str(), first["S"].as_u64()),
        (Some("small"), Some(32))
    );
    assert_eq!(first["backend"], "cpu");
}

#[test]
fn two_runs_give_identical_checksums_and_metrics() {
    let results = tempfile::tempdir().unwrap();
    for _ in 0..2 {
        let (code, out, err) = cpu(&["--shapes", "partial77", "--seeds", "0,1"], results.path());
        assert_eq!(code, 0, "{out}{err}");
    }
    let dirs = run_dirs(results.path());
    assert_eq!(dirs.len(), 2, "each run writes a new directory");
    let strip = |v: serde_json::Value| v["results"].clone();
    // Timings differ run to run; correctness, inputs and outputs must not.
    assert_eq!(
        strip(read_json(&dirs[0].join("correctness.json"))),
        strip(read_json(&dirs[1].join("correctness.json")))
    );
}

#[test]
fn a_planted_skip_of_the_last_kv_tile_fails_the_gates_with_exit_1() {
    let results = tempfile::tempdir().unwrap();
    let (code, stdout, _) = cpu(
        &[
            "--shapes",
            "partial300",
            "--seeds",
            "0",
            "--emulation-defect",
            "skip-last-kv-tile",
        ],
        results.path(),
    );
    assert_eq!(code, 1, "{stdout}");
    assert!(
        stdout.contains("FAIL (") && stdout.contains("kernel.max_err_over_bound"),
        "{stdout}"
    );
    let dirs = run_dirs(results.path());
    assert_eq!(dirs.len(), 1, "a failing run still writes its results");
    assert_eq!(
        read_json(&dirs[0].join("correctness.json"))["all_pass"],
        false
    );
}

#[test]
fn a_stage_d_v_scale_off_by_a_fifth_of_a_percent_fails_only_the_scale_gate_with_exit_1() {
    // Stage D's bounds sit above e4m3's rounding of P (a few percent); the slope on its own
    // emulation sees 0.2%.
    let results = tempfile::tempdir().unwrap();
    let (code, stdout, stderr) = cpu(
        &[
            "--kernel",
            "stage-d",
            "--shapes",
            "1x2x100x64:sk=300",
            "--seeds",
            "0",
            "--iters",
            "0",
            "--emulation-defect",
            "v-scale-off",
        ],
        results.path(),
    );
    assert_eq!(code, 1, "{stdout}{stderr}");
    let file = read_json(&run_dirs(results.path())[0].join("correctness.json"));
    for r in file["results"].as_array().unwrap() {
        let failed: Vec<&str> = r["gates"]
            .as_object()
            .unwrap()
            .iter()
            .filter(|(_, c)| c["pass"] == false)
            .map(|(g, _)| g.as_str())
            .collect();
        assert_eq!(failed, ["emulation.scale"], "{r}");
    }
    assert!(stdout.contains("emulation.scale"), "{stdout}");
}

#[test]
fn a_hadamard_rotation_passes_every_gate_and_cuts_the_fp8_error_of_fa3_outliers() {
    let results = tempfile::tempdir().unwrap();
    let (code, stdout, stderr) = cpu(
        &[
            "--shapes",
            "1x4x512x128:dist=fa3_outliers,1x4x512x128:dist=fa3_outliers:rotate",
            "--seeds",
            "0",
            "--iters",
            "0",
        ],
        results.path(),
    );
    assert_eq!(code, 0, "{stdout}{stderr}");
    let file = read_json(&run_dirs(results.path())[0].join("correctness.json"));
    let rmse = |shape: &str| {
        let r = file["results"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["shape"] == shape)
            .unwrap();
        r["end_to_end"]["rmse"].as_f64().unwrap()
    };
    let (plain, rotated) = (
        rmse("1x4x512x128:dist=fa3_outliers"),
        rmse("1x4x512x128:dist=fa3_outliers:rotate"),
    );
    // Measured 1.44e-2 and 9.5e-3: the outliers' quantization error spread over D.
    assert!(rotated < 0.75 * plain, "{rotated} {plain}");
}

#[test]
fn a_planted_unwritten_row_is_counted_and_fails_with_exit_1() {
    let results = tempfile::tempdir().unwrap();
    let (code, stdout, _) = cpu(
        &[
            "--shapes",
            "small",
            "--seeds",
            "0",
            "--emulation-defect",
            "leave-row-unwritten",
        ],
        results.path(),
    );
    assert_eq!(code, 1, "{stdout}");
    assert!(stdout.contains("unwritten=64"), "{stdout}");
}

#[test]
fn a_sampled_check_states_its_rows_on_the_console_and_in_correctness_json() {
    let results = tempfile::tempdir().unwrap();
    let args = [
        "--shapes",
        "1x2x1000x64",
        "--seeds",
        "0",
        "--iters",
        "0",
        "--check-rows",
        "sampled",
    ];
    let (code, stdout, stderr) = cpu(&args, results.path());
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(
        stdout.contains("checking ")
            && stdout.contains(" of 2000 rows")
            && stdout.contains("sampled:"),
        "{stdout}"
    );
    let run = run_dirs(results.path()).pop().unwrap();
    let rows = &read_json(&run.join("correctness.json"))["results"][0];
    let checked = rows["rows_checked"].as_u64().unwrap();
    assert!(checked > 128 && checked < 1000, "{rows}");
    assert!(rows["row_rule"].as_str().unwrap().starts_with("sampled"));
    assert_eq!(rows["references"], "host", "the cpu backend has no device");
    assert_eq!(rows["kernel_ref"]["elements"], 2 * 1000 * 64);
    // The planted unwritten row (the last of the last head, always in the sample) fails too;
    // a row outside the sample is covered by runner's unit tests.
    let with_defect = [&args[..], &["--emulation-defect", "leave-row-unwritten"]].concat();
    let (code, stdout, _) = cpu(&with_defect, results.path());
    assert_eq!(code, 1, "{stdout}");
    assert!(stdout.contains("unwritten=64"), "{stdout}");
}

#[test]
fn shapes_lists_the_named_shapes() {
    let (code, stdout, _) = output(runner().arg("shapes"));
    assert_eq!(code, 0);
    for name in [
        "small",
        "mission",
        "long",
        "single",
        "partial77",
        "batched",
        "wide",
    ] {
        assert!(stdout.contains(name), "{name} missing: {stdout}");
    }
    for name in ["ctx16k", "ctx64k", "index64"] {
        let line = stdout
            .lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_default();
        assert!(line.contains("not in `all`"), "{name}: {stdout}");
    }
}

#[test]
fn help_shows_examples_and_exit_codes() {
    let (code, stdout, _) = output(runner().arg("--help"));
    assert_eq!(code, 0);
    assert!(
        stdout.contains("Examples:")
            && stdout.contains("--backend cpu")
            && stdout.contains("Exit codes")
    );
}

#[test]
fn the_default_backend_without_a_gpu_exits_3_and_points_at_the_cpu_backend() {
    // Without a driver (CI) or with its GPUs hidden (the GPU machine): no usable GPU either way.
    let results = tempfile::tempdir().unwrap();
    let (code, _, stderr) = output(runner().env("CUDA_VISIBLE_DEVICES", "").args([
        "--shapes",
        "small",
        "--results-dir",
        results.path().to_str().unwrap(),
    ]));
    assert_eq!(code, 3, "{stderr}");
    assert!(
        stderr.contains("no usable GPU") && stderr.contains("--backend cpu"),
        "{stderr}"
    );
    assert!(
        entries(results.path()).is_empty(),
        "no results directory for a run that never started"
    );
}

/// Runs a bad command line; asserts exit `code`, a message containing every needle, and no
/// run directory left behind.
fn refused(args: &[&str], code: i32, needles: &[&str]) {
    common::refused_with_env(args, &[], code, needles)
}

#[test]
fn an_unknown_shape_exits_2_listing_the_known_ones() {
    refused(
        &["--backend", "cpu", "--shapes", "small,nosuch"],
        2,
        &["nosuch", "mission", "partial77"],
    );
}

#[test]
fn malformed_seeds_exit_2() {
    refused(&["--backend", "cpu", "--seeds", "0,x"], 2, &["`x`"]);
    refused(&["--backend", "cpu", "--seeds", "3-1"], 2, &["backwards"]);
}

#[test]
fn a_negative_seed_exits_2_saying_seeds_are_non_negative_integers() {
    for command in [&[][..], &["stress"]] {
        for seeds in ["-1", "0,-3"] {
            let mut args = command.to_vec();
            args.extend(["--backend", "cpu", "--seeds", seeds]);
            refused(&args, 2, &["negative", "non-negative integers"]);
        }
    }
    refused(
        &["fuzz", "--backend", "cpu", "--seed", "-1"],
        2,
        &["negative", "non-negative integer"],
    );
}

#[test]
fn device_references_or_emulation_on_the_cpu_backend_exit_2_naming_the_fix() {
    for command in [&[][..], &["stress"], &["fuzz", "--count", "1"]] {
        for flag in ["--references", "--emulation"] {
            let mut args = command.to_vec();
            args.extend(["--backend", "cpu", flag, "device"]);
            let fix = format!("{flag} host or auto");
            refused(
                &args,
                2,
                &[&format!("{flag} device"), "--backend cuda", &fix],
            );
        }
    }
}

#[test]
fn devices_on_the_cpu_backend_exit_2_naming_the_fix() {
    for command in [&[][..], &["stress"], &["fuzz", "--count", "1"]] {
        let mut args = command.to_vec();
        args.extend(["--backend", "cpu", "--devices", "0,1"]);
        refused(&args, 2, &["--devices", "--backend cuda"]);
    }
}

#[test]
fn malformed_devices_exit_2_naming_the_forms() {
    for bad in ["gpu1", "0-1", ""] {
        refused(
            &["--backend", "cpu", "--devices", bad],
            2,
            &["--devices all", "0,1"],
        );
    }
}

#[test]
fn devices_without_a_gpu_exit_3_for_every_command_that_takes_them() {
    for command in [
        &[][..],
        &["stress"],
        &["fuzz", "--count", "1"],
        &["selftest"],
    ] {
        let results = tempfile::tempdir().unwrap();
        let mut args = command.to_vec();
        args.extend(["--devices", "all", "--results-dir"]);
        let (code, _, stderr) = output(
            runner()
                .env("CUDA_VISIBLE_DEVICES", "")
                .args(&args)
                .arg(results.path()),
        );
        assert_eq!(code, 3, "{command:?}: {stderr}");
        assert!(
            stderr.contains("--devices all: no usable GPU"),
            "{command:?}: {stderr}"
        );
        // Only the commands that take --backend point at it, and only without --devices.
        let advice = stderr.contains("--backend cpu");
        assert_eq!(advice, command != ["selftest"], "{command:?}: {stderr}");
        assert!(!advice || stderr.contains("Without --devices"), "{stderr}");
        assert!(entries(results.path()).is_empty(), "{command:?}");
    }
}

#[test]
fn zero_sequence_length_exits_2() {
    refused(&["--backend", "cpu", "--shapes", "1x1x0x64"], 2, &["S=0"]);
}

#[test]
fn head_dim_other_than_64_or_128_exits_2() {
    refused(
        &["--backend", "cpu", "--shapes", "1x1x64x256"],
        2,
        &["D=256", "64 and 128"],
    );
}

#[test]
fn gqa_decode_and_causal_problems_run_the_whole_pipeline_on_the_cpu_backend() {
    let results = tempfile::tempdir().unwrap();
    let (code, stdout, stderr) = output(
        runner()
            .args(["--backend", "cpu", "--seeds", "0", "--iters", "0", "--shapes"])
            .arg("1x4x77x128:hkv=2:causal,2x8x1x64:sk=300:hkv=1,1x2x113x64:sk=203:causal,1x2x70x64:sk=20:causal")
            .arg("--results-dir")
            .arg(results.path()),
    );
    assert_eq!(code, 0, "{stdout}{stderr}");
    let file = read_json(&run_dirs(results.path())[0].join("correctness.json"));
    let rows = file["results"].as_array().unwrap();
    assert_eq!(rows.len(), 4);
    let first = &rows[0];
    assert_eq!(
        (
            first["H"].as_u64(),
            first["Hkv"].as_u64(),
            first["D"].as_u64()
        ),
        (Some(4), Some(2), Some(128))
    );
    assert_eq!(first["causal"], true);
    assert_eq!(rows[1]["Sk"].as_u64(), Some(300));
    assert!(rows.iter().all(|r| r["pass"] == true));
}

#[test]
fn bench_refuses_a_masked_or_gqa_problem_naming_it() {
    let (code, _, stderr) =
        output(runner().args(["bench", "--shapes", "small,1x4x64x64:hkv=2:causal"]));
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("plain attention") && stderr.contains("1x4x64x64:hkv=2:causal"),
        "{stderr}"
    );
}

#[test]
fn bad_problem_descriptions_exit_2_naming_the_rule() {
    for (spec, words) in [
        ("1x6x64x64:hkv=4", &["multiple of Hkv"][..]),
        ("1x4x64x64:sk=0", &["Sk=0"][..]),
        ("1x4x64x96", &["D=96", "64 and 128"][..]),
    ] {
        refused(&["--backend", "cpu", "--shapes", spec], 2, words);
    }
}

#[test]
fn a_shape_too_large_for_memory_exits_2_with_the_size_it_needs() {
    refused(
        &["--backend", "cpu", "--shapes", "1024x64x65536x64"],
        2,
        &["GiB", "1024x64x65536x64"],
    );
}

#[test]
fn gates_files_that_are_missing_malformed_or_have_unknown_keys_exit_2_naming_file_and_key() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.json");
    refused(
        &["--backend", "cpu", "--gates", missing.to_str().unwrap()],
        2,
        &["missing.json"],
    );

    let malformed = dir.path().join("malformed.json");
    std::fs::write(&malformed, "{ \"version\": 2,").unwrap();
    refused(
        &["--backend", "cpu", "--gates", malformed.to_str().unwrap()],
        2,
        &["malformed.json", "malformed JSON"],
    );

    let good = std::fs::read_to_string(common::project_root().join("gates/default.json")).unwrap();
    let unknown = dir.path().join("unknown.json");
    std::fs::write(
        &unknown,
        good.replacen("\"version\": 2,", "\"version\": 2, \"colour\": 3,", 1),
    )
    .unwrap();
    refused(
        &["--backend", "cpu", "--gates", unknown.to_str().unwrap()],
        2,
        &["unknown.json", "colour"],
    );

    let negative = dir.path().join("negative.json");
    std::fs::write(
        &negative,
        good.replacen("\"factor\": 2.0", "\"factor\": -2.0", 1),
    )
    .unwrap();
    refused(
        &["--backend", "cpu", "--gates", negative.to_str().unwrap()],
        2,
        &["correctness.relative.factor"],
    );
}

#[test]
fn shapes_files_that_are_malformed_or_have_unknown_keys_exit_2_naming_file_and_key() {
    let dir = tempfile::tempdir().unwrap();
    let unknown = dir.path().join("shapes.json");
    std::fs::write(
        &unknown,
        r#"{"version":1,"shapes":[{"name":"a","B":1,"H":1,"S":8,"D":64,"color":1}]}"#,
    )
    .unwrap();
    refused(
        &[
            "--backend",
            "cpu",
            "--shapes",
            "a",
            "--shapes-file",
            unknown.to_str().unwrap(),
        ],
        2,
        &["shapes.json", "color"],
    );
    let missing = dir.path().join("nope.json");
    refused(
        &[
            "--backend",
            "cpu",
            "--shapes-file",
            missing.to_str().unwrap(),
        ],
        2,
        &["nope.json"],
    );
}

#[test]
fn an_unwritable_results_directory_exits_2() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("not-a-dir");
    std::fs::write(&file, "x").unwrap();
    let (code, _, stderr) = output(runner().args([
        "--backend",
        "cpu",
        "--shapes",
        "small",
        "--results-dir",
        file.join("sub").to_str().unwrap(),
    ]));
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("--results-dir"), "{stderr}");
}

#[test]
fn too_few_timing_iterations_exit_2() {
    refused(
        &["--backend", "cpu", "--shapes", "small", "--iters", "5"],
        2,
        &["--iters 5", "--iters 0"],
    );
}

#[test]
fn a_correctness_only_run_writes_no_perf_json() {
    let results = tempfile::tempdir().unwrap();
    let (code, out, err) = cpu(
        &["--shapes", "small", "--seeds", "0", "--iters", "0"],
        results.path(),
    );
    assert_eq!(code, 0, "{out}{err}");
    let dir = &run_dirs(results.path())[0];
    assert!(dir.join("correctness.json").is_file() && !dir.join("perf.json").exists());
}

#[test]
fn a_malformed_use_cp_async_variable_exits_2_before_any_gpu_work() {
    let results = tempfile::tempdir().unwrap();
    let (code, _, stderr) = output(runner().env("USE_CP_ASYNC", "yes").args([
        "--shapes",
        "small",
        "--results-dir",
        results.path().to_str().unwrap(),
    ]));
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("USE_CP_ASYNC=`yes`"), "{stderr}");
}

#[test]
fn correct_kernels_pass_on_the_small_shapes_the_old_fixed_gates_failed() {
    // Issue 11: with limits from a table of worst cases, 4 of these 20 correct rows failed
    // (end_to_end.pct_bad); the error model's bounds hold on every one.
    let results = tempfile::tempdir().unwrap();
    let (code, stdout, stderr) = output(
        runner()
            .args([
                "--backend",
                "cpu",
                "--shapes",
                "1x1x4x64,1x1x2x64,1x2x17x64:qk=3:dist=outliers",
            ])
            .args(["--seeds", "0-19", "--iters", "0"])
            .arg("--results-dir")
            .arg(results.path()),
    );
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(stdout.contains("60/60 PASS"), "{stdout}");
}

#[test]
fn fuzz_checks_random_problems_records_each_and_passes_a_correct_kernel() {
    let fuzz = |results: &std::path::Path| {
        output(
            runner()
                .args(["fuzz", "--backend", "cpu", "--count", "60", "--seed", "3"])
                .args(["--max-s", "300", "--results-dir"])
                .arg(results),
        )
    };
    let results = tempfile::tempdir().unwrap();
    let (code, stdout, stderr) = fuzz(results.path());
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(stdout.contains("fuzz: 60 problems, 0 failed"), "{stdout}");
    let file = read_json(&run_dirs(results.path())[0].join("fuzz.json"));
    assert_eq!(file["schema_version"], 2);
    let problems = file["problems"].as_array().unwrap();
    assert_eq!(problems.len(), 60);
    for p in problems {
        let shape = p["shape"].as_str().unwrap();
        let d = shape.split(':').next().unwrap().rsplit('x').next().unwrap();
        assert!(d == "64" || d == "128", "{shape}");
        assert!(p["kernel_err_over_bound"].as_f64().unwrap() <= 1.0);
        assert_eq!(p["references"], "host", "the cpu backend has no device");
    }
    // The same seed draws the same problems.
    let again = tempfile::tempdir().unwrap();
    fuzz(again.path());
    let drawn = |f: &serde_json::Value| {
        f["problems"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| (p["shape"].clone(), p["seed"].clone()))
            .collect::<Vec<_>>()
    };
    let file2 = read_json(&run_dirs(again.path())[0].join("fuzz.json"));
    assert_eq!(drawn(&file), drawn(&file2));
}

#[test]
fn fuzz_fails_a_broken_kernel_and_its_reproduction_fails_the_same_way() {
    let results = tempfile::tempdir().unwrap();
    let (code, stdout, stderr) = output(
        runner()
            .args([
                "fuzz",
                "--backend",
                "cpu",
                "--count",
                "30",
                "--seed",
                "5",
                "--max-s",
                "200",
            ])
            .args(["--emulation-defect", "skip-last-kv-tile", "--results-dir"])
            .arg(results.path()),
    );
    assert_eq!(code, 1, "{stdout}{stderr}");
    let file = read_json(&run_dirs(results.path())[0].join("fuzz.json"));
    assert!(file["failures"].as_u64().unwrap() > 0 && file["all_pass"] == false);
    let repro = file["problems"]
        .as_array()
        .unwrap()
        .iter()
        .find_map(|p| p["reproduce"].as_str())
        .expect("a failed problem carries its reproduction")
        .to_string();
    let words: Vec<&str> = repro.split_whitespace().collect();
    assert_eq!(words[0], "sdpa-runner", "{repro}");
    let again = tempfile::tempdir().unwrap();
    let (code, stdout, stderr) = output(
        runner()
            .args(&words[1..])
            .arg("--results-dir")
            .arg(again.path()),
    );
    assert_eq!(code, 1, "{repro}: {stdout}{stderr}");
    assert!(stdout.contains("FAIL ("), "{stdout}");
}

#[test]
fn the_pr_gate_flags_are_refused_where_they_cannot_work() {
    refused(
        &["--backend", "cpu", "--base-kernel", "git:HEAD"],
        2,
        &["--base-kernel compares two GPU kernels", "--backend cuda"],
    );
    refused(
        &["--backend", "cpu", "--gate"],
        2,
        &["--gate", "needs --base-kernel"],
    );
    refused(
        &["--base-kernel", "git:HEAD", "--gate", "--iters", "0"],
        2,
        &["--gate", "timing (--iters above 0)"],
    );
    refused(&["--base-kernel", "git:"], 2, &["git:REV or git:REV:PATH"]);
}

#[test]
fn sanitize_is_offered_refused_on_the_cpu_backend_and_a_too_old_sanitizer_exits_3() {
    let (code, help, _) = common::output(runner().arg("--help"));
    assert_eq!(code, 0);
    assert!(
        help.contains("--sanitize") && help.contains("--sanitize-timeout"),
        "{help}"
    );
    refused(
        &["--backend", "cpu", "--sanitize"],
        2,
        &["--sanitize", "--backend cuda"],
    );
    refused(&["--sanitize-timeout", "0"], 2, &["--sanitize-timeout"]);
    #[cfg(unix)]
    {
        let dir = tempfile::tempdir().unwrap();
        let fake = dir.path().join("compute-sanitizer");
        sdpa_runner::testing::fake_executable(&fake, "echo 'Version 2020.1.0'");
        common::refused_with_env(
            &["--sanitize", "--shapes", "small"],
            &[("COMPUTE_SANITIZER", fake.to_str().unwrap())],
            3,
            &["2020.1", "older than 2022.4"],
        );
    }
}
