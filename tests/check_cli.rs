//! `export` and `check` end to end, without a GPU: problems exported, outputs computed by an
//! attention written here (textbook f64 on the exported f32 files, sharing no code with the
//! runner's references), and graded.

mod common;

use std::path::{Path, PathBuf};

use common::{entries, output, read_json, run_dirs, runner};

/// The problems: `small` and a causal GQA problem with S_q != S_k and rows that see no key.
const SHAPES: &str = "small,1x4x40x64:sk=30:hkv=2:causal";

fn export(dir: &Path) {
    export_shapes(dir, SHAPES);
}

/// `export --shapes SHAPES --seeds 0 DIR`, which must succeed.
fn export_shapes(dir: &Path, shapes: &str) {
    let (code, out, err) = output(
        runner()
            .args(["export", "--shapes", shapes, "--seeds", "0"])
            .arg(dir),
    );
    assert_eq!(code, 0, "{out}{err}");
}

/// A `.npy` file's type string, shape and data bytes (the header is numpy's dict; data
/// follows it).
fn read_npy(path: &Path) -> (String, Vec<usize>, Vec<u8>) {
    let bytes = std::fs::read(path).unwrap();
    assert_eq!(&bytes[..6], b"\x93NUMPY");
    let len = u16::from_le_bytes([bytes[8], bytes[9]]) as usize;
    let header = std::str::from_utf8(&bytes[10..10 + len]).unwrap();
    let descr = header.split("'descr': '").nth(1).unwrap();
    let descr = descr[..descr.find('\'').unwrap()].to_string();
    let shape_text = header.split("'shape': (").nth(1).unwrap();
    let shape = shape_text[..shape_text.find(')').unwrap()]
        .split(',')
        .filter(|t| !t.trim().is_empty())
        .map(|t| t.trim().parse().unwrap())
        .collect();
    (descr, shape, bytes[10 + len..].to_vec())
}

fn read_f32(path: &Path) -> (Vec<usize>, Vec<f32>) {
    let (descr, shape, data) = read_npy(path);
    assert_eq!(descr, "<f4", "{}", path.display());
    let data = data
        .chunks(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    (shape, data)
}

fn write_npy(path: &Path, descr: &str, shape: &[usize], data: &[u8]) {
    let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    let mut header = format!(
        "{{'descr': '{descr}', 'fortran_order': False, 'shape': ({}), }}",
        dims.join(", ")
    );
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
    bytes.extend_from_slice(&(header.len() as u16).to_le_bytes());
    bytes.extend_from_slice(header.as_bytes());
    bytes.extend_from_slice(data);
    std::fs::write(path, bytes).unwrap();
}

fn write_f32(path: &Path, shape: &[usize], data: &[f32]) {
    let bytes: Vec<u8> = data.iter().flat_map(|x| x.to_le_bytes()).collect();
    write_npy(path, "<f4", shape, &bytes);
}

/// An OCP e4m3 code's value, decoded here from its bits (sign, 4 exponent bits of bias 7,
/// 3 mantissa bits; exponent 0 is subnormal; S.1111.111 is NaN), sharing no code with the
/// runner's codec.
fn e4m3(code: u8) -> f64 {
    let sign = if code & 0x80 != 0 { -1.0 } else { 1.0 };
    let (e, m) = (i32::from((code >> 3) & 0xf), f64::from(code & 7));
    match (e, code & 7) {
        (15, 7) => f64::NAN,
        (0, _) => sign * m / 8.0 * 2f64.powi(-6),
        _ => sign * (1.0 + m / 8.0) * 2f64.powi(e - 7),
    }
}

/// What an implementation read: the f32 originals, them rounded to f16, or the e4m3 codes
/// times their per-(b, head) scales; and what it wrote: f32, or f16.
#[derive(Clone, Copy, PartialEq)]
enum Read {
    F32,
    F16,
    Fp8,
}

/// One input tensor of a problem as `read` sees it, in f64.
fn input(dir: &Path, p: &serde_json::Value, name: &str, read: Read) -> Vec<f64> {
    let file = |n: &str| dir.join(p["files"][n].as_str().unwrap());
    match read {
        Read::F32 => read_f32(&file(name))
            .1
            .iter()
            .map(|&x| f64::from(x))
            .collect(),
        Read::F16 => read_f32(&file(name))
            .1
            .iter()
            .map(|&x| half::f16::from_f32(x).to_f64())
            .collect(),
        Read::Fp8 => {
            let (descr, shape, codes) = read_npy(&file(&format!("{name}_fp8")));
            assert_eq!(descr, "|u1");
            let (_, scales) = read_f32(&file(&format!("{name}_scale")));
            let per_head = shape[2] * shape[3];
            codes
                .iter()
                .enumerate()
                .map(|(i, &c)| e4m3(c) * f64::from(scales[i / per_head]))
                .collect()
        }
    }
}

/// Textbook attention of every exported problem, in f64 on the f32 originals, written as
/// f32 to `out/<id>.npy`; `scale_row` multiplies one row `(id, h, s)` by 1.05.
fn attention_outputs(dir: &Path, out: &Path, scale_row: Option<(&str, usize, usize)>) {
    attention_outputs_as(
        dir,
        out,
        scale_row.map(|(id, h, s)| (id, h, s, 1.05)),
        Read::F32,
    );
}

/// As [`attention_outputs`], on the inputs as `read` reads them, one row `(id, h, s, factor)`
/// scaled; written as f16 when it read f16, else as f32.
fn attention_outputs_as(
    dir: &Path,
    out: &Path,
    scale_row: Option<(&str, usize, usize, f64)>,
    read: Read,
) {
    std::fs::create_dir_all(out).unwrap();
    let manifest = read_json(&dir.join("manifest.json"));
    for p in manifest["problems"].as_array().unwrap() {
        let id = p["id"].as_str().unwrap();
        let n = |k: &str| p[k].as_u64().unwrap() as usize;
        let (b, hq, hkv, sq, sk, d) = (n("B"), n("Hq"), n("Hkv"), n("Sq"), n("Sk"), n("D"));
        let causal = p["causal"].as_bool().unwrap();
        let scale = p["softmax_scale"].as_f64().unwrap();
        let (q, k, v) = (
            input(dir, p, "q", read),
            input(dir, p, "k", read),
            input(dir, p, "v", read),
        );
        assert_eq!(q.len(), b * hq * sq * d);
        assert_eq!(k.len(), b * hkv * sk * d);
        let mut o = vec![0f64; q.len()];
        for bi in 0..b {
            for h in 0..hq {
                let kvh = bi * hkv + h / (hq / hkv);
                for i in 0..sq {
                    let seen = if causal {
                        (i + sk + 1).saturating_sub(sq).min(sk)
                    } else {
                        sk
                    };
                    let qrow = &q[((bi * hq + h) * sq + i) * d..][..d];
                    let scores: Vec<f64> = (0..seen)
                        .map(|j| {
                            let krow = &k[(kvh * sk + j) * d..][..d];
                            scale * qrow.iter().zip(krow).map(|(a, b)| a * b).sum::<f64>()
                        })
                        .collect();
                    let m = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                    let w: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
                    let l: f64 = w.iter().sum();
                    let factor = match scale_row {
                        Some((sid, sh, ss, f)) if sid == id && sh == h && ss == i => f,
                        _ => 1.0,
                    };
                    for x in 0..d {
                        let acc: f64 = (0..seen).map(|j| w[j] * v[(kvh * sk + j) * d + x]).sum();
                        o[((bi * hq + h) * sq + i) * d + x] =
                            if seen == 0 { 0.0 } else { acc / l * factor };
                    }
                }
            }
        }
        let path = out.join(format!("{id}.npy"));
        let shape = [b, hq, sq, d];
        if read == Read::F16 {
            let bytes: Vec<u8> = o
                .iter()
                .flat_map(|&x| half::f16::from_f64(x).to_le_bytes())
                .collect();
            write_npy(&path, "<f2", &shape, &bytes);
        } else {
            write_f32(
                &path,
                &shape,
                &o.iter().map(|&x| x as f32).collect::<Vec<_>>(),
            );
        }
    }
}

fn check(dir: &Path, outs: &[&Path], extra: &[&str], results: &Path) -> (i32, String, String) {
    let mut cmd = runner();
    cmd.arg("check").arg(dir);
    for o in outs {
        cmd.arg("--outputs").arg(o);
    }
    cmd.args(extra).arg("--results-dir").arg(results);
    output(&mut cmd)
}

struct Setup {
    _tmp: tempfile::TempDir,
    dir: PathBuf,
    results: PathBuf,
    root: PathBuf,
}

fn setup() -> Setup {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().to_path_buf();
    let dir = root.join("problems");
    export(&dir);
    Setup {
        dir,
        results: root.join("results"),
        root,
        _tmp: tmp,
    }
}

#[test]
fn export_writes_a_manifest_with_every_problem_and_its_files() {
    let s = setup();
    let m = read_json(&s.dir.join("manifest.json"));
    assert_eq!(m["format"], "sdpa-runner export v1");
    let problems = m["problems"].as_array().unwrap();
    assert_eq!(problems.len(), 2);
    let gqa = &problems[1];
    assert_eq!(gqa["id"], "1x4x40x64_sk_30_hkv_2_causal-seed0");
    for (key, value) in [("Hq", 4), ("Hkv", 2), ("Sq", 40), ("Sk", 30), ("D", 64)] {
        assert_eq!(gqa[key], value, "{key}");
    }
    assert_eq!(gqa["causal"], true);
    assert_eq!(gqa["distribution"], "normal");
    for name in [
        "q", "k", "v", "q_fp8", "k_fp8", "v_fp8", "q_scale", "k_scale", "v_scale",
    ] {
        let rel = gqa["files"][name].as_str().unwrap();
        assert!(s.dir.join(rel).is_file(), "{name}: {rel}");
    }
    let (shape, scales) = read_f32(&s.dir.join(gqa["files"]["k_scale"].as_str().unwrap()));
    assert_eq!(shape, [1, 2]);
    assert!(scales.iter().all(|&x| x > 0.0));
}

#[test]
fn independent_fp32_outputs_pass_and_one_row_scaled_by_1_05_fails_naming_problem_and_row() {
    let s = setup();
    let good = s.root.join("good");
    attention_outputs(&s.dir, &good, None);
    let (code, out, err) = check(&s.dir, &[&good], &["--precision", "fp32"], &s.results);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(out.matches("PASS").count(), 3, "{out}");
    let run = &run_dirs(&s.results)[0];
    let record = read_json(&run.join("correctness.json"));
    assert_eq!(record["pass"], true);
    assert!(
        std::fs::read_to_string(run.join("COMPARE.md"))
            .unwrap()
            .contains("| good | fp32 | f32 | PASS")
    );

    let bad = s.root.join("bad");
    let id = "1x4x40x64_sk_30_hkv_2_causal-seed0";
    attention_outputs(&s.dir, &bad, Some((id, 3, 27)));
    let (code, out, err) = check(&s.dir, &[&bad], &["--precision", "fp32"], &s.results);
    assert_eq!(code, 1, "{out}{err}");
    let fail = out.lines().find(|l| l.contains("FAIL")).unwrap();
    assert!(fail.contains(id), "{out}");
    assert!(out.contains("at row [b 0, h 3, s 27]"), "{out}");
    assert!(
        out.lines().filter(|l| l.contains("PASS")).count() == 1,
        "{out}"
    );
}

#[test]
fn a_missing_output_file_fails_naming_it_and_the_others_are_still_graded() {
    let s = setup();
    let out_dir = s.root.join("partial");
    attention_outputs(&s.dir, &out_dir, None);
    std::fs::remove_file(out_dir.join("small-seed0.npy")).unwrap();
    let (code, out, err) = check(&s.dir, &[&out_dir], &["--precision", "fp32"], &s.results);
    assert_eq!(code, 1, "{out}{err}");
    assert!(out.contains("small-seed0.npy: missing"), "{out}");
    assert!(
        out.contains("PASS  1x4x40x64_sk_30_hkv_2_causal-seed0"),
        "{out}"
    );
}

#[test]
fn a_misshaped_or_nan_output_is_a_fail_naming_the_file_not_a_crash() {
    let s = setup();
    let o = s.root.join("odd");
    attention_outputs(&s.dir, &o, None);
    write_f32(&o.join("small-seed0.npy"), &[1, 1, 64, 32], &[0.5; 2048]);
    let id = "1x4x40x64_sk_30_hkv_2_causal-seed0";
    let path = o.join(format!("{id}.npy"));
    let (shape, mut data) = read_f32(&path);
    data[700] = f32::NAN;
    write_f32(&path, &shape, &data);
    let (code, out, err) = check(&s.dir, &[&o], &["--precision", "fp32"], &s.results);
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        out.contains("small-seed0.npy: shape [1, 1, 64, 32], expected"),
        "{out}"
    );
    assert!(
        out.contains(&format!("{id}.npy holds 1 NaN or Inf values")),
        "{out}"
    );
}

#[test]
fn bad_check_requests_exit_2_naming_the_fix_and_write_nothing() {
    let s = setup();
    let o = s.root.join("o");
    attention_outputs(&s.dir, &o, None);
    let empty = s.root.join("empty");
    std::fs::create_dir(&empty).unwrap();
    let cases: Vec<(Vec<PathBuf>, PathBuf, Vec<&str>, &str)> = vec![
        (
            vec![o.clone()],
            s.dir.clone(),
            vec![],
            "--precision fp8|fp16|bf16|fp32",
        ),
        (
            vec![o.clone()],
            empty.clone(),
            vec!["--precision", "fp32"],
            "no manifest.json",
        ),
        (
            vec![s.root.join("nope")],
            s.dir.clone(),
            vec!["--precision", "fp32"],
            "not a folder",
        ),
    ];
    for (outs, dir, extra, needle) in cases {
        let outs: Vec<&Path> = outs.iter().map(|p| p.as_path()).collect();
        let (code, out, err) = check(&dir, &outs, &extra, &s.results);
        assert_eq!(code, 2, "{needle}: {out}{err}");
        assert!(err.contains(needle), "{needle}: {err}");
    }
    // A manifest whose inputs are not what its seed draws.
    let manifest = s.dir.join("manifest.json");
    let text = std::fs::read_to_string(&manifest).unwrap();
    let mut m: serde_json::Value = serde_json::from_str(&text).unwrap();
    m["problems"][0]["checksum"] = "00".into();
    std::fs::write(&manifest, m.to_string()).unwrap();
    let (code, _, err) = check(&s.dir, &[&o], &["--precision", "fp32"], &s.results);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("export it again"), "{err}");
    // precision in implementation.json that contradicts the flag.
    std::fs::write(&manifest, text).unwrap();
    std::fs::write(o.join("implementation.json"), r#"{"precision": "fp16"}"#).unwrap();
    let (code, _, err) = check(&s.dir, &[&o], &["--precision", "fp32"], &s.results);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("drop one"), "{err}");
    assert!(entries(&s.results).is_empty());
}

#[test]
fn export_refuses_a_non_empty_folder_unless_forced_and_then_replaces_an_export_whole() {
    let s = setup();
    let before = std::fs::read(s.dir.join("manifest.json")).unwrap();
    std::fs::write(s.dir.join("stray.txt"), "x").unwrap();
    let (code, _, err) = output(
        runner()
            .args(["export", "--shapes", "mission", "--seeds", "1"])
            .arg(&s.dir),
    );
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--force"), "{err}");
    assert_eq!(std::fs::read(s.dir.join("manifest.json")).unwrap(), before);
    let force = || {
        output(
            runner()
                .args(["export", "--shapes", "mission", "--seeds", "1", "--force"])
                .arg(&s.dir),
        )
    };
    // A file the export did not write is someone's: --force refuses rather than delete it.
    let (code, _, err) = force();
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("`stray.txt`"), "{err}");
    assert!(s.dir.join("stray.txt").is_file());
    std::fs::remove_file(s.dir.join("stray.txt")).unwrap();
    let (code, out, err) = force();
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(
        read_json(&s.dir.join("manifest.json"))["problems"][0]["id"],
        "mission-seed1"
    );
    let left: Vec<_> = std::fs::read_dir(&s.root)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .filter(|n| n.starts_with('.'))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn ours_on_the_cpu_backend_is_graded_beside_the_others_with_its_median_time() {
    let s = setup();
    let o = s.root.join("o");
    attention_outputs(&s.dir, &o, None);
    let (code, out, err) = check(
        &s.dir,
        &[&o],
        &["--precision", "fp32", "--ours", "cpu"],
        &s.results,
    );
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(out.matches("PASS").count(), 5, "{out}");
    let run = &run_dirs(&s.results)[0];
    let record = read_json(&run.join("correctness.json"));
    let grades = record["problems"][1]["grades"].as_array().unwrap();
    assert_eq!(grades[0]["implementation"], "sdpa-runner cpu-emu");
    assert_eq!(grades[0]["precision"], "fp8");
    assert_eq!(grades[0]["output"], "f16");
    assert!(grades[0]["p50_us"].as_f64().unwrap() > 0.0);
}

#[test]
fn a_rotated_problem_is_exported_saying_so_and_graded_after_check_draws_it_again() {
    let tmp = tempfile::tempdir().unwrap();
    let (dir, plain) = (tmp.path().join("p"), tmp.path().join("plain"));
    export_shapes(&dir, "1x2x40x64:hkv=1:causal:dist=fa3_outliers:rotate");
    export_shapes(&plain, "1x2x40x64:hkv=1:causal:dist=fa3_outliers");
    assert_eq!(
        read_json(&dir.join("manifest.json"))["problems"][0]["rotate"],
        true
    );
    // The first problem's f32 tensor `name` as exported into `d`.
    let tensor = |d: &Path, name: &str| {
        let file = &read_json(&d.join("manifest.json"))["problems"][0]["files"][name];
        read_f32(&d.join(file.as_str().unwrap())).1
    };
    assert_ne!(tensor(&dir, "q"), tensor(&plain, "q"), "Q is rotated");
    assert_ne!(tensor(&dir, "k"), tensor(&plain, "k"), "K is rotated");
    assert_eq!(tensor(&dir, "v"), tensor(&plain, "v"), "V is not rotated");
    // check draws the problem again (rotation included: else the checksum differs, exit 2)
    // and grades a textbook attention of the exported tensors.
    let o = tmp.path().join("o");
    attention_outputs(&dir, &o, None);
    let (code, out, err) = check(&dir, &[&o], &["--precision", "fp32"], &tmp.path().join("r"));
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("PASS"), "{out}");
}

#[test]
fn zeros_fail_a_long_fp8_decode_row_and_a_grade_that_zeros_would_also_pass_is_flagged() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("p");
    export_shapes(&dir, "1x2x1x128:sk=8192,1x2x1x128:sk=8192:qk=3,small");
    let zeros = tmp.path().join("zeros");
    std::fs::create_dir(&zeros).unwrap();
    for id in ["1x2x1x128_sk_8192-seed0", "1x2x1x128_sk_8192_qk_3-seed0"] {
        write_f32(
            &zeros.join(format!("{id}.npy")),
            &[1, 2, 1, 128],
            &[0.0; 256],
        );
    }
    write_f32(
        &zeros.join("small-seed0.npy"),
        &[1, 1, 32, 64],
        &[0.0; 2048],
    );
    let results = tmp.path().join("r");
    let (code, out, _) = check(&dir, &[&zeros], &["--precision", "fp8"], &results);
    assert_eq!(code, 1, "{out}");
    let lines: Vec<&str> = out.lines().collect();
    let line = |id: &str| lines.iter().position(|l| l.contains(id)).unwrap();
    // At FP8 the worst case of P's rounding over 8192 keys is wider than the output; its
    // statistical bound (V's signs are fair coins) is not: zeros fail.
    let decode = line("1x2x1x128_sk_8192-seed0");
    assert!(lines[decode].contains("FAIL"), "{out}");
    assert!(!lines[decode + 1].contains("NOT DISCRIMINATING"), "{out}");
    // With qk_std 3 the scores' Cauchy-Schwarz bound is vacuous: zeros pass, and it says so.
    let wide = line("1x2x1x128_sk_8192_qk_3-seed0");
    assert!(lines[wide].contains("PASS"), "{out}");
    assert!(lines[wide + 1].contains("NOT DISCRIMINATING"), "{out}");
    // At fp32 the bound is tight: zeros fail everywhere.
    let (code, out, _) = check(&dir, &[&zeros], &["--precision", "fp32"], &results);
    assert_eq!(code, 1, "{out}");
    assert!(!out.contains("NOT DISCRIMINATING"), "{out}");
}

#[test]
fn an_fp8_output_short_by_a_stagnated_sum_passes_over_every_key_and_fails_held_to_128_key_chains() {
    // One row of 8192 keys of near-equal weight and V > 0: an FP8 implementation that sums O
    // in the tensor cores' FP22 accumulator over every key comes out short there (cuDNN's FP8
    // SDPA by 8% at 4096 keys, 18% at 8192, 35% at 16384: docs/ACCURACY.md). Without
    // --fp8-chain the model admits such a sum, and zeros pass too. Held to 128-key chains the
    // bound is about 14% of O (P's e4m3 rounding, mostly): 18% and 30% short fail, 8% short
    // and the exact output pass.
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("p");
    export_shapes(&dir, "1x1x1x64:sk=8192:dist=flat_positive_v");
    let id = read_json(&dir.join("manifest.json"))["problems"][0]["id"]
        .as_str()
        .unwrap()
        .to_string();
    let results = tmp.path().join("r");
    let fp8 = ["--precision", "fp8"];
    let chained = ["--precision", "fp8", "--fp8-chain", "128"];
    // Runs `check` on outputs `factor` times the exact ones; its exit code, console and record.
    let graded = |factor: f64, args: &[&str]| {
        let out_dir = tmp.path().join(format!("out-{factor}"));
        if !out_dir.exists() {
            let row = (factor != 1.0).then_some((id.as_str(), 0, 0, factor));
            attention_outputs_as(&dir, &out_dir, row, Read::Fp8);
        }
        let before = run_dirs(&results);
        let (code, out, err) = check(&dir, &[&out_dir], args, &results);
        let new: Vec<PathBuf> = run_dirs(&results)
            .into_iter()
            .filter(|d| !before.contains(d))
            .collect();
        assert_eq!(new.len(), 1, "{out}{err}");
        let record = read_json(&new[0].join("correctness.json"));
        let compare = std::fs::read_to_string(new[0].join("COMPARE.md")).unwrap();
        (code, format!("{out}{err}"), record, compare)
    };
    for factor in [0.82, 0.7] {
        let (code, out, record, _) = graded(factor, &fp8);
        assert_eq!(code, 0, "{factor}: {out}");
        assert!(out.contains("NOT DISCRIMINATING"), "{factor}: {out}");
        assert!(record.get("fp8_chain").is_none(), "{record}");
        let (code, out, record, compare) = graded(factor, &chained);
        assert_eq!(code, 1, "{factor}: {out}");
        assert!(
            out.lines().any(|l| l.contains(&id) && l.contains("FAIL")),
            "{out}"
        );
        // The assumption is part of the record.
        assert_eq!(record["fp8_chain"], 128);
        assert!(compare.contains("`--fp8-chain 128`"), "{compare}");
    }
    for factor in [1.0, 0.92] {
        let (code, out, _, _) = graded(factor, &chained);
        assert_eq!(code, 0, "{factor}: {out}");
        assert!(!out.contains("NOT DISCRIMINATING"), "{factor}: {out}");
    }
    // A chain of no key, or one where nothing graded read fp8, is refused and writes nothing.
    let exact = tmp.path().join("out-1");
    let before = entries(&results);
    for args in [
        &["--precision", "fp8", "--fp8-chain", "0"][..],
        &["--precision", "fp16", "--fp8-chain", "128"][..],
    ] {
        let (code, out, err) = check(&dir, &[&exact], args, &results);
        assert_eq!(code, 2, "{args:?}: {out}{err}");
        assert!(err.contains("--fp8-chain"), "{args:?}: {err}");
    }
    assert_eq!(entries(&results), before);
}

#[test]
fn export_force_replaces_an_earlier_export_but_never_an_unrelated_folder_or_someones_file() {
    let tmp = tempfile::tempdir().unwrap();
    let other = tmp.path().join("thesis");
    std::fs::create_dir(&other).unwrap();
    std::fs::write(other.join("thesis.tex"), "x").unwrap();
    let (code, _, err) = output(
        runner()
            .args(["export", "--shapes", "small", "--force"])
            .arg(&other),
    );
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("replaces an earlier export only"), "{err}");
    assert!(other.join("thesis.tex").is_file());
    // A manifest.json of something else is not an export's.
    std::fs::write(other.join("manifest.json"), r#"{"manifest_version": 3}"#).unwrap();
    let (code, _, err) = output(
        runner()
            .args(["export", "--shapes", "small", "--force"])
            .arg(&other),
    );
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("does not say `sdpa-runner export v1`"),
        "{err}"
    );
    assert!(other.join("thesis.tex").is_file());
    // An export with someone's file beside it: refused, naming the file, which stays.
    let ex = tmp.path().join("ex");
    export(&ex);
    std::fs::write(ex.join("notes.txt"), "mine").unwrap();
    let (code, _, err) = output(
        runner()
            .args(["export", "--shapes", "small", "--force"])
            .arg(&ex),
    );
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("`notes.txt` in it is not part of the export"),
        "{err}"
    );
    assert_eq!(
        std::fs::read_to_string(ex.join("notes.txt")).unwrap(),
        "mine"
    );
    // Inside a problem's folder too (outputs written beside its inputs).
    std::fs::remove_file(ex.join("notes.txt")).unwrap();
    let inner = ex.join("small-seed0").join("o.npy");
    std::fs::write(&inner, "mine").unwrap();
    let force = || {
        output(
            runner()
                .args(["export", "--shapes", "small", "--force"])
                .arg(&ex),
        )
    };
    let (code, _, err) = force();
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("small-seed0/o.npy` in it is not part of the export"),
        "{err}"
    );
    assert!(inner.is_file());
    std::fs::remove_file(&inner).unwrap();
    let (code, _, err) = force();
    assert_eq!(code, 0, "an export and nothing else is replaced: {err}");
}

#[test]
fn export_force_into_the_folder_it_runs_in_is_refused_up_front_and_keeps_the_export() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("ex");
    export(&dir);
    let before = std::fs::read(dir.join("manifest.json")).unwrap();
    for target in [".", ".."] {
        let cwd = if target == "." {
            dir.clone()
        } else {
            dir.join("small-seed0")
        };
        let (code, out, err) = output(runner().current_dir(&cwd).args([
            "export", "--shapes", "mission", "--seeds", "1", "--force", target,
        ]));
        assert_eq!(code, 2, "{target}: {out}{err}");
        assert!(
            err.contains("which an export cannot replace") && err.contains("outside it"),
            "{err}"
        );
    }
    // The same folder by an absolute path from inside it, and by `DIR/.` from outside it.
    let (code, _, err) = output(
        runner()
            .current_dir(&dir)
            .args(["export", "--shapes", "mission", "--seeds", "1", "--force"])
            .arg(&dir),
    );
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("the current folder or holds it"), "{err}");
    let (code, _, err) = output(
        runner()
            .current_dir(tmp.path())
            .args(["export", "--shapes", "mission", "--seeds", "1", "--force"])
            .arg(dir.join(".")),
    );
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("name the folder itself"), "{err}");
    assert_eq!(std::fs::read(dir.join("manifest.json")).unwrap(), before);
}

#[test]
fn fp8_and_fp16_outputs_computed_from_what_each_read_pass_and_a_row_scaled_beyond_the_model_fails()
{
    let s = setup();
    let id = "1x4x40x64_sk_30_hkv_2_causal-seed0";
    // fp8: the e4m3 codes decoded here and times their scales, attention in f64, f32 out.
    // fp16: the originals rounded to f16, attention in f64, f16 out. An fp8 implementation
    // may round P to e4m3 (unit roundoff 2^-4, docs/DESIGN.md "Grading other
    // implementations"), so 5% on a row is within what a correct one may do: its planted
    // error is 25%.
    for (read, precision, factor) in [(Read::Fp8, "fp8", 1.25), (Read::F16, "fp16", 1.05)] {
        let good = s.root.join(format!("good-{precision}"));
        attention_outputs_as(&s.dir, &good, None, read);
        let (code, out, err) = check(&s.dir, &[&good], &["--precision", precision], &s.results);
        assert_eq!(code, 0, "{precision}: {out}{err}");
        assert_eq!(out.matches("PASS").count(), 3, "{precision}: {out}");
        let bad = s.root.join(format!("bad-{precision}"));
        attention_outputs_as(&s.dir, &bad, Some((id, 1, 39, factor)), read);
        let (code, out, err) = check(&s.dir, &[&bad], &["--precision", precision], &s.results);
        assert_eq!(code, 1, "{precision}: {out}{err}");
        let fail = out.lines().find(|l| l.contains("FAIL")).unwrap();
        assert!(fail.contains(id), "{precision}: {out}");
        assert!(
            out.contains("at row [b 0, h 1, s 39]"),
            "{precision}: {out}"
        );
    }
}

#[test]
fn an_exported_input_file_changed_after_export_is_refused_naming_it_and_nothing_is_written() {
    let s = setup();
    let o = s.root.join("o");
    attention_outputs(&s.dir, &o, None);
    let q_fp8 = s.dir.join("small-seed0/q_fp8.npy");
    let mut bytes = std::fs::read(&q_fp8).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x08;
    std::fs::write(&q_fp8, &bytes).unwrap();
    let (code, out, err) = check(&s.dir, &[&o], &["--precision", "fp32"], &s.results);
    assert_eq!(code, 2, "{out}{err}");
    assert!(
        err.contains("q_fp8.npy is not what export wrote")
            && err.contains("export the problems again"),
        "{err}"
    );
    assert!(entries(&s.results).is_empty(), "nothing written");
}

#[test]
fn problems_too_large_for_host_memory_are_refused_before_any_work_by_export_and_check() {
    let s = setup();
    // About 13 PB of f32 inputs: larger than any host.
    let huge = "1024x64x65536x128";
    let target = s.root.join("huge");
    let (code, out, err) = output(
        runner()
            .args(["export", "--shapes", huge, "--seeds", "0"])
            .arg(&target),
    );
    assert_eq!(code, 2, "{out}{err}");
    assert!(err.contains("host memory") && err.contains(huge), "{err}");
    assert!(!target.exists());

    let mut m = read_json(&s.dir.join("manifest.json"));
    let p = &mut m["problems"][0];
    for (key, value) in [
        ("B", 1024),
        ("Hq", 64),
        ("Hkv", 64),
        ("Sq", 65536),
        ("Sk", 65536),
    ] {
        p[key] = value.into();
    }
    p["D"] = 128.into();
    p["softmax_scale"] = (1.0 / 128f64.sqrt() as f32).into();
    std::fs::write(s.dir.join("manifest.json"), m.to_string()).unwrap();
    let o = s.root.join("o");
    std::fs::create_dir_all(&o).unwrap();
    let (code, out, err) = check(&s.dir, &[&o], &["--precision", "fp32"], &s.results);
    assert_eq!(code, 2, "{out}{err}");
    assert!(err.contains("host memory"), "{err}");
    assert!(entries(&s.results).is_empty(), "nothing written");
}

/// Runs `cmd` to its end or for at most `secs` seconds (then kills it): exit code and stderr,
/// None for a run that had to be killed.
#[cfg(unix)]
fn within(mut cmd: std::process::Command, secs: u64) -> Option<(i32, String)> {
    use std::io::Read;
    let mut child = cmd
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let started = std::time::Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut err = String::new();
            child
                .stderr
                .take()
                .unwrap()
                .read_to_string(&mut err)
                .unwrap();
            return Some((status.code().unwrap_or(-1), err));
        }
        if started.elapsed().as_secs() >= secs {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

#[cfg(unix)]
#[test]
fn a_pipe_where_check_looks_for_the_manifest_or_the_implementations_notes_is_refused_not_waited_on()
{
    let s = setup();
    let out = s.root.join("out");
    attention_outputs(&s.dir, &out, None);
    let mkfifo = |path: &Path| {
        let _ = std::fs::remove_file(path);
        std::process::Command::new("mkfifo")
            .arg(path)
            .status()
            .is_ok_and(|st| st.success())
    };
    // check must refuse at once the pipe named `found`, never wait on it.
    let refused_naming = |found: &str| {
        let mut cmd = runner();
        cmd.arg("check")
            .arg(&s.dir)
            .arg("--outputs")
            .arg(&out)
            .arg("--results-dir")
            .arg(&s.results);
        let (code, err) = within(cmd, 30).expect("check waited on a pipe");
        assert_eq!(code, 2, "{err}");
        assert!(
            err.contains(found) && err.contains("not a regular file"),
            "{err}"
        );
    };
    // The implementation's notes, found by name in OUT.
    if !mkfifo(&out.join("implementation.json")) {
        return; // no mkfifo on this machine
    }
    refused_naming("implementation.json");
    // The export's manifest, found by name in DIR.
    std::fs::remove_file(out.join("implementation.json")).unwrap();
    assert!(mkfifo(&s.dir.join("manifest.json")));
    refused_naming("manifest.json");
}
