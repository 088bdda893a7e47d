//! The binary on a GPU: variant selection through USE_CP_ASYNC, and compile errors and
//! kernel faults mapped to exit 4 with the NVRTC log or the CUDA error.

mod common;

use common::{entries, output, read_json, run_dirs, runner};

#[test]
#[ignore = "needs a CUDA GPU"]
fn use_cp_async_1_in_the_environment_runs_only_cp1() {
    let results = tempfile::tempdir().unwrap();
    let (code, stdout, stderr) = output(runner().env("USE_CP_ASYNC", "1").args([
        "--shapes",
        "mission",
        "--seeds",
        "0",
        "--results-dir",
        results.path().to_str().unwrap(),
    ]));
    assert_eq!(code, 0, "{stdout}{stderr}");
    let rows: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with('[') && l.contains("max_err="))
        .collect();
    assert_eq!(rows.len(), 1, "{stdout}");
    assert!(
        rows[0].contains(" cp1 ") && rows[0].ends_with("PASS"),
        "{stdout}"
    );
    let dir = &run_dirs(results.path())[0];
    let meta = read_json(&dir.join("build_meta.json"));
    let variants = meta["backend_details"]["variants"].as_array().unwrap();
    assert_eq!(variants.len(), 1);
    assert_eq!(variants[0]["identity"]["name"], "cp1");
    assert_eq!(variants[0]["identity"]["ptx_has_cp_async"], true);
    let c = read_json(&dir.join("correctness.json"));
    assert!(
        c["results"]
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r["variant"] == "cp1")
    );
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_kernel_that_does_not_compile_exits_4_with_the_nvrtc_log() {
    let dir = tempfile::tempdir().unwrap();
    let kernel = dir.path().join("broken.cu");
    std::fs::write(&kernel, "#error planted compile error\n").unwrap();
    let results = dir.path().join("results");
    let (code, _, stderr) = output(
        runner()
            .args(["--shapes", "small", "--seeds", "0", "--kernel"])
            .arg(&kernel)
            .arg("--results-dir")
            .arg(&results),
    );
    assert_eq!(code, 4, "{stderr}");
    assert!(
        stderr.contains("planted compile error") && stderr.contains("NVRTC log"),
        "{stderr}"
    );
    assert!(entries(&results).is_empty());
}

/// Same ABI, entries, published constants and identity instructions (cuda/kernels.toml's
/// `ptx_must_hold`, on a branch never taken) as the real kernel, but it stores to a wild
/// address.
const FAULTING_KERNEL: &str = r#"
extern "C" __constant__ int SDPA_BLOCK_M = 32;
extern "C" __constant__ int SDPA_BLOCK_M_D128 = 64;
extern "C" __constant__ int SDPA_BLOCK_N = 64;
extern "C" __constant__ int SDPA_KV_SPLIT = 1;
extern "C" __constant__ int SDPA_THREADS = 128;
extern "C" __constant__ int SDPA_SMEM_BYTES_D64 = 0;
extern "C" __constant__ int SDPA_SMEM_BYTES_D128 = 0;
extern "C" __constant__ int SDPA_USE_CP_ASYNC = 0;
extern "C" __constant__ int SDPA_RESCALE_THRESHOLD = 8; // the manifest's (change 32)
#define WILD(NAME) extern "C" __global__ void NAME(const unsigned char* q, \
        const unsigned char* k, const unsigned char* v, const float* qs, const float* ks, \
        const float* vs, unsigned short* out, int B, int H, int Hkv, int Sq, int Sk, \
        int causal, float scale, float* work, const void* kv_maps) { \
    int value = Sq; \
    if (Sq < 0) { /* never taken: the identity facts the manifest asks of Stage C's PTX */ \
        unsigned h; \
        asm volatile("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h) : "h"((unsigned short)Sq)); \
        float c0 = 0.f, c1 = 0.f, c2 = 0.f, c3 = 0.f; \
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, " \
                     "{%4,%4,%4,%4}, {%4,%4}, {%0,%1,%2,%3};" \
                     : "+f"(c0), "+f"(c1), "+f"(c2), "+f"(c3) : "r"(h)); \
        value = (int)(c0 + c1 + c2 + c3); \
    } \
    volatile int* wild = (volatile int*)(0x10ull + 4ull * threadIdx.x); \
    *wild = value; \
}
WILD(sdpa_fp8_stage_c_mma_d64)
WILD(sdpa_fp8_stage_c_mma_d64_causal)
WILD(sdpa_fp8_stage_c_mma_d128)
WILD(sdpa_fp8_stage_c_mma_d128_causal)
"#;

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_kernel_that_faults_exits_4_naming_the_error_variant_and_shape() {
    let dir = tempfile::tempdir().unwrap();
    let kernel = dir.path().join("faulting.cu");
    std::fs::write(&kernel, FAULTING_KERNEL).unwrap();
    let results = dir.path().join("results");
    let (code, _, stderr) = output(
        runner()
            .args([
                "--shapes",
                "small",
                "--seeds",
                "0",
                "--cp-async",
                "0",
                "--kernel",
            ])
            .arg(&kernel)
            .arg("--results-dir")
            .arg(&results),
    );
    assert_eq!(code, 4, "{stderr}");
    let lower = stderr.to_lowercase();
    assert!(
        lower.contains("illegal") && stderr.contains("cp0") && stderr.contains("small"),
        "{stderr}"
    );
    assert!(entries(&results).is_empty());
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_kernel_whose_toggle_did_not_take_exits_4() {
    // The faulting kernel publishes SDPA_USE_CP_ASYNC = 0 whatever it is compiled with, and
    // has no cp.async: asked for cp1, the runner must refuse it before any launch.
    let dir = tempfile::tempdir().unwrap();
    let kernel = dir.path().join("no_toggle.cu");
    std::fs::write(&kernel, FAULTING_KERNEL).unwrap();
    let (code, _, stderr) = output(
        runner()
            .args([
                "--shapes",
                "small",
                "--seeds",
                "0",
                "--cp-async",
                "1",
                "--kernel",
            ])
            .arg(&kernel),
    );
    assert_eq!(code, 4, "{stderr}");
    assert!(stderr.contains("the switch did not take"), "{stderr}");
}

#[test]
#[ignore = "needs a CUDA GPU (an H100 or H200: Stage D is sm_90a)"]
fn a_kernel_that_hangs_is_stopped_at_the_launch_limit_with_exit_4_and_nothing_written() {
    // MUTANT_WRONG_PARITY waits on an mbarrier phase that never completes: a deadlock.
    let results = tempfile::tempdir().unwrap();
    let started = std::time::Instant::now();
    let (code, stdout, stderr) = output(runner().env("SDPA_RUNNER_LAUNCH_LIMIT_S", "3").args([
        "--kernel",
        "stage-d",
        "--define",
        "MUTANT_WRONG_PARITY",
        "--shapes",
        "mission",
        "--seeds",
        "0",
        "--iters",
        "0",
        "--results-dir",
        results.path().to_str().unwrap(),
    ]));
    assert_eq!(code, 4, "{stdout}{stderr}");
    assert!(
        stderr.contains("did not finish") && stderr.contains("after 3.0 s"),
        "{stderr}"
    );
    assert!(started.elapsed() < std::time::Duration::from_secs(60));
    assert!(entries(results.path()).is_empty(), "nothing is written");
}

#[test]
#[ignore = "needs a CUDA GPU (an H100 or H200: Stage D is sm_90a)"]
fn stage_d_runs_the_main_job_through_tensor_maps_and_proves_its_pipeline_depth() {
    let results = tempfile::tempdir().unwrap();
    let (code, stdout, stderr) = output(runner().args([
        "--kernel",
        "stage-d",
        "--shapes",
        "small,1x4x77x128:sk=300:hkv=2:causal",
        "--seeds",
        "0",
        "--iters",
        "0",
        "--results-dir",
        results.path().to_str().unwrap(),
    ]));
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(stdout.contains("4/4 PASS (st2 2/2, st3 2/2)"), "{stdout}");
    let dir = &run_dirs(results.path())[0];
    let meta = read_json(&dir.join("build_meta.json"));
    let variants = meta["backend_details"]["variants"].as_array().unwrap();
    let switch: Vec<_> = variants
        .iter()
        .map(|v| v["identity"]["constants"]["switch"].as_u64().unwrap())
        .collect();
    assert_eq!(switch, [2, 3], "SDPA_KV_STAGES as each module publishes it");
}

/// The constant `key` each variant of a run published (build_meta.json's identity), in order.
fn published_constant(dir: &std::path::Path, key: &str) -> Vec<serde_json::Value> {
    let meta = read_json(&dir.join("build_meta.json"));
    meta["backend_details"]["variants"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["identity"]["constants"][key].clone())
        .collect()
}

/// Each shape's output checksums over the run's variants and seeds (correctness.json).
fn checksums_by_shape(dir: &std::path::Path) -> std::collections::BTreeMap<String, Vec<String>> {
    let correctness = read_json(&dir.join("correctness.json"));
    let mut checksums = std::collections::BTreeMap::<String, Vec<String>>::new();
    for r in correctness["results"].as_array().unwrap() {
        checksums
            .entry(r["shape"].as_str().unwrap().to_string())
            .or_default()
            .push(r["output_checksum"].as_str().unwrap().to_string());
    }
    checksums
}

#[test]
#[ignore = "needs a CUDA GPU (an H100 or H200: Stage D is sm_90a)"]
fn stage_d_causal_grid_of_the_heads_first_gives_the_bits_of_the_query_tiles_first() {
    // The default module publishes SDPA_CAUSAL_HEADS_FIRST (a causal grid of (B*H, query
    // tiles): cuda/sdpa_fp8_stage_d_wgmma.cu `cta_work`), the candidate built with
    // CAUSAL_HEADS_FIRST=0 publishes 0 and is launched (query tiles, B*H). Every causal problem
    // must pass with one output in both: several tiles a head at D 64 and D 128 (192-row CTAs,
    // 64-row narrowed ones, the D 128 companion's 128), GQA, S_q > S_k and S_q < S_k.
    let results = tempfile::tempdir().unwrap();
    let shapes = "2x3x700x64:causal,1x2x1000x64:causal,2x4x500x128:sk=800:hkv=2:causal,\
                  1x4x77x128:sk=300:hkv=2:causal,cfg-tall,2x2x600x128:sk=300:causal";
    let (code, stdout, stderr) = output(runner().args([
        "--kernel",
        "stage-d",
        "--cp-async",
        "0",
        "--candidate-define",
        "CAUSAL_HEADS_FIRST=0",
        "--shapes",
        shapes,
        "--seeds",
        "0",
        "--iters",
        "0",
        "--results-dir",
        results.path().to_str().unwrap(),
    ]));
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(stdout.contains("12/12 PASS"), "{stdout}");
    let dir = &run_dirs(results.path())[0];
    let published = published_constant(dir, "causal_heads_first");
    assert_eq!(
        published,
        [serde_json::json!(true), serde_json::json!(false)]
    );
    let checksums = checksums_by_shape(dir);
    assert_eq!(checksums.len(), 6, "{checksums:?}");
    for (shape, sums) in &checksums {
        assert!(sums.len() == 2 && sums[0] == sums[1], "{shape}: {sums:?}");
    }
}

#[test]
#[ignore = "needs a CUDA GPU (an H100 or H200: Stage D is sm_90a)"]
fn stage_d_mixed_grid_gives_the_bits_of_the_unmixed_one() {
    // The default module publishes SDPA_MIXED_UNIT_ROWS = 64: an unmasked problem whose last
    // wave of 192-row CTAs would leave SMs idle is launched on (B*H, T) with more, shorter
    // tiles at each head's end (cuda/sdpa_fp8_stage_d_wgmma.cu `cta_work`; src/backend/cuda/
    // waves.rs). The candidate, built with MIXED_TILES=0, publishes 0 and is launched
    // unmixed. Each problem must pass with one output in both: whole units (1x16x4096x64: 24
    // tiles, 16 of three units and 8 of two), a partial last unit (S_q 4000, and at D 128
    // 2000), and a problem the plan leaves unmixed (4x16x4096x64: its 10.67 waves gain nothing).
    let results = tempfile::tempdir().unwrap();
    let (code, stdout, stderr) = output(runner().args([
        "--kernel",
        "stage-d",
        "--cp-async",
        "0",
        "--candidate-define",
        "MIXED_TILES=0",
        "--shapes",
        "1x16x4096x64,1x16x4000x64,1x20x2000x128,4x16x4096x64",
        "--seeds",
        "0",
        "--iters",
        "20",
        "--rounds",
        "5",
        "--results-dir",
        results.path().to_str().unwrap(),
    ]));
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(stdout.contains("8/8 PASS"), "{stdout}");
    let dir = &run_dirs(results.path())[0];
    let published = published_constant(dir, "mixed_unit_rows");
    assert_eq!(published, [serde_json::json!(64), serde_json::json!(0)]);
    let perf = read_json(&dir.join("perf.json"));
    let mut grids = std::collections::BTreeMap::<(String, String), Vec<u64>>::new();
    for m in perf["measurements"].as_array().unwrap() {
        let grid = m["launch"]["grid"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n.as_u64().unwrap())
            .collect();
        let key = (m["shape"].as_str().unwrap(), m["variant"].as_str().unwrap());
        grids.insert((key.0.to_string(), key.1.to_string()), grid);
    }
    let grid =
        |shape: &str, variant: &str| grids[&(shape.to_string(), variant.to_string())].clone();
    // The mixed grids: 24 tiles a head of 4096 or 4000 rows (22 unmixed), 13 of 2000 (11).
    assert_eq!(grid("1x16x4096x64", "st2"), [16, 24, 1], "{grids:?}");
    assert_eq!(
        grid("1x16x4096x64", "st2+MIXED_TILES=0"),
        [22, 16, 1],
        "{grids:?}"
    );
    assert_eq!(grid("1x16x4000x64", "st2"), [16, 24, 1], "{grids:?}");
    assert_eq!(grid("1x20x2000x128", "st2"), [20, 13, 1], "{grids:?}");
    assert_eq!(
        grid("1x20x2000x128", "st2+MIXED_TILES=0"),
        [11, 20, 1],
        "{grids:?}"
    );
    for v in ["st2", "st2+MIXED_TILES=0"] {
        assert_eq!(grid("4x16x4096x64", v), [22, 64, 1], "{grids:?}");
    }
    let checksums = checksums_by_shape(dir);
    assert_eq!(checksums.len(), 4, "{checksums:?}");
    for (shape, sums) in &checksums {
        assert!(sums.len() == 2 && sums[0] == sums[1], "{shape}: {sums:?}");
    }
}

#[test]
#[ignore = "needs a CUDA GPU (an H100 or H200: Stage D is sm_90a)"]
fn stage_d_launch_follows_the_waves_and_the_mask_and_both_tiles_give_its_bits() {
    let results = tempfile::tempdir().unwrap();
    let (code, stdout, stderr) = output(runner().args([
        "--kernel",
        "stage-d",
        "--shapes",
        "mission,4x16x4096x64,1x4x77x128:sk=300:hkv=2:causal,4x16x4096x128,1x2x1000x64:causal",
        "--seeds",
        "0",
        "--iters",
        "20",
        "--rounds",
        "5",
        "--results-dir",
        results.path().to_str().unwrap(),
    ]));
    assert_eq!(code, 0, "{stdout}{stderr}");
    let dir = &run_dirs(results.path())[0];
    // On an H100 or H200 (132 SMs): mission's 24 CTAs of 192 rows would run one short wave,
    // its 64 CTAs of 64 rows end sooner; 4x16x4096x64's 1,408 CTAs of 192 rows end first. At
    // D 128 the narrower tile is the companion's 128 rows (384 threads): 77 rows are one tile
    // either way, and a 128-row CTA is the cheaper; 4x16x4096x128's 11 waves of 192-row CTAs
    // end before 16 of 128 (cuda/kernels.toml tiles.narrow_d128). A causal grid counts the
    // heads on x and the query tiles on y (SDPA_CAUSAL_HEADS_FIRST): 1x2x1000x64's 12 CTAs of
    // 192 rows would be one short wave, its 2 x 16 of 64 rows end sooner.
    let perf = read_json(&dir.join("perf.json"));
    for m in perf["measurements"].as_array().unwrap() {
        // The function too: the D 128 entry also runs 128 rows with 384 threads (one
        // warpgroup fewer) and gives the same bits, so only its name tells the companion.
        let want = match m["shape"].as_str().unwrap() {
            "mission" => (64, 256, [8, 8, 1], "sdpa_fp8_stage_d_wgmma_d64"),
            "4x16x4096x64" => (192, 512, [22, 64, 1], "sdpa_fp8_stage_d_wgmma_d64"),
            "4x16x4096x128" => (192, 512, [22, 64, 1], "sdpa_fp8_stage_d_wgmma_d128"),
            "1x2x1000x64:causal" => (64, 256, [2, 16, 1], "sdpa_fp8_stage_d_wgmma_d64_causal"),
            _ => (
                128,
                384,
                [4, 1, 1],
                "sdpa_fp8_stage_d_wgmma_d128_causal_m128",
            ),
        };
        let l = &m["launch"];
        let grid: Vec<u64> = l["grid"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n.as_u64().unwrap())
            .collect();
        assert_eq!(
            (
                l["query_rows"].as_u64().unwrap(),
                l["threads"].as_u64().unwrap(),
                grid,
                l["function"].as_str().unwrap()
            ),
            (want.0, want.1, want.2.to_vec(), want.3),
            "{m}"
        );
    }
    // Each variant recorded both D 128 companions' resources as the driver reports them: 384
    // threads at 168 registers (the entries: 512 at 128), no local memory.
    let meta = read_json(&dir.join("build_meta.json"));
    for v in meta["backend_details"]["variants"].as_array().unwrap() {
        let companions = v["identity"]["companions"].as_array().unwrap();
        assert_eq!(companions.len(), 2, "{v}");
        for c in companions {
            let d = &c["driver"];
            assert_eq!(
                (
                    c["rows"].as_u64(),
                    d["threads_per_block"].as_u64(),
                    d["registers_per_thread"].as_u64(),
                    d["local_bytes"].as_u64()
                ),
                (Some(128), Some(384), Some(168), Some(0)),
                "{c}"
            );
        }
    }
    // Each row also ran the tile not chosen, with the same bits: at D 128 the other function.
    let correctness = read_json(&dir.join("correctness.json"));
    let results = correctness["results"].as_array().unwrap();
    assert_eq!(results.len(), 10, "five shapes, two variants");
    for r in results {
        let gate = &r["gates"]["launch.geometries_differ"];
        assert_eq!(
            (gate["pass"].as_bool(), gate["value"].as_f64()),
            (Some(true), Some(0.0)),
            "{r}"
        );
    }
}

#[test]
#[ignore = "needs a CUDA GPU (an H100 or H200: Stage D is sm_90a)"]
fn stage_d_checked_with_device_yardsticks_gets_the_figures_and_verdicts_of_host_yardsticks() {
    // The configurations under Stage D's algorithm and model: the emulation's figures are the
    // same bits, the references' the same within f64 roundoff, every gate the same verdict.
    let run = |engine: &str| {
        let results = tempfile::tempdir().unwrap();
        let (code, stdout, stderr) = output(runner().args([
            "--kernel",
            "stage-d",
            "--shapes",
            "cfg-chunk,cfg-decode,cfg-tall,1x8x300x128:hkv=2:causal,2x4x16x128:sk=1000:hkv=4",
            "--seeds",
            "0",
            "--iters",
            "0",
            "--references",
            engine,
            "--emulation",
            engine,
            "--results-dir",
            results.path().to_str().unwrap(),
        ]));
        assert_eq!(code, 0, "{engine}: {stdout}{stderr}");
        let dir = &run_dirs(results.path())[0];
        read_json(&dir.join("correctness.json"))["results"]
            .as_array()
            .unwrap()
            .clone()
    };
    let (device, host) = (run("device"), run("host"));
    assert_eq!(device.len(), 10, "5 problems x 2 variants");
    assert_eq!(device.len(), host.len());
    for (d, h) in device.iter().zip(&host) {
        let what = format!("{} {}", d["shape"], d["variant"]);
        assert_eq!(
            (&d["references"], &d["emulation"]),
            (&"device".into(), &"device".into())
        );
        assert_eq!(
            (&h["references"], &h["emulation"]),
            (&"host".into(), &"host".into())
        );
        assert_eq!(d["output_checksum"], h["output_checksum"], "{what}");
        // The emulation's bits are the same: its distance from the kernel's output, in bits
        // equal and in ulps, is the same. Its error against the references (emulation_ref)
        // is the same where it is largest and in its counts; the figures themselves differ by
        // the references' f64 roundoff (and the mean's parallel sum order).
        assert_eq!(
            (&d["emulation_bits_equal_pct"], &d["emulation_max_ulps"]),
            (&h["emulation_bits_equal_pct"], &h["emulation_max_ulps"]),
            "{what}: the emulation's bits"
        );
        let exact = |r: &serde_json::Value| {
            let e = &r["emulation_ref"];
            ["worst_at", "elements", "nonfinite", "unwritten"].map(|k| e[k].clone())
        };
        assert_eq!(exact(d), exact(h), "{what}");
        for k in ["max_abs_err", "mean_abs_err", "rmse", "max_err_over_bound"] {
            let (a, b) = (
                d["emulation_ref"][k].as_f64().unwrap(),
                h["emulation_ref"][k].as_f64().unwrap(),
            );
            assert!((a - b).abs() <= 1e-9 * b.abs(), "{what}: {k} {a} vs {b}");
        }
        let verdicts = |r: &serde_json::Value| -> Vec<(String, bool)> {
            r["gates"]
                .as_object()
                .unwrap()
                .iter()
                .map(|(g, c)| (g.clone(), c["pass"].as_bool().unwrap()))
                .collect()
        };
        assert_eq!(verdicts(d), verdicts(h), "{what}");
        let ratio = |r: &serde_json::Value| r["kernel_ref"]["max_err_over_bound"].as_f64().unwrap();
        let (rd, rh) = (ratio(d), ratio(h));
        assert!(
            (rd - rh).abs() <= 1e-6 * rh.max(1e-3),
            "{what}: {rd} vs {rh}"
        );
    }
}
