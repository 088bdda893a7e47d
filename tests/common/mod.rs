//! Helpers shared by the integration tests. The binary and the project files are located at
//! run time, so the test executables also work when carried to the GPU machine.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Command;

/// The sdpa-runner binary: `SDPA_RUNNER_BIN` if set (GPU machine), else cargo's build.
pub fn runner_bin() -> PathBuf {
    std::env::var_os("SDPA_RUNNER_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_sdpa-runner")))
}

/// A command for the runner, run from the project root and without USE_CP_ASYNC.
pub fn runner() -> Command {
    let mut cmd = Command::new(runner_bin());
    cmd.current_dir(project_root()).env_remove("USE_CP_ASYNC");
    cmd
}

/// The checkout: the current directory (cargo test and the GPU machine both start there).
pub fn project_root() -> PathBuf {
    sdpa_runner::paths::ProjectRoot::locate(None)
        .expect("run the tests from the checkout")
        .path()
        .to_path_buf()
}

/// Runs the runner on the cpu backend with `args`, writing under `results`.
pub fn cpu(args: &[&str], results: &std::path::Path) -> (i32, String, String) {
    output(
        runner()
            .args(["--backend", "cpu"])
            .args(args)
            .arg("--results-dir")
            .arg(results),
    )
}

/// Runs `cmd` and returns (exit code, stdout, stderr).
pub fn output(cmd: &mut Command) -> (i32, String, String) {
    let out = cmd.output().expect("runner starts");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Everything under `results`, files included (for the checks that nothing was written).
pub fn entries(results: &std::path::Path) -> Vec<PathBuf> {
    match std::fs::read_dir(results) {
        Ok(entries) => entries.map(|e| e.unwrap().path()).collect(),
        Err(_) => Vec::new(),
    }
}

/// The run directories under `results` (not the files beside them, such as the COMPARE.md a
/// gate run writes there: read_dir's order is the file system's, so the first entry may be one).
pub fn run_dirs(results: &std::path::Path) -> Vec<PathBuf> {
    entries(results)
        .into_iter()
        .filter(|p| p.is_dir())
        .collect()
}

pub fn read_json(path: &std::path::Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// Runs the cpu backend with `args` into `results` and returns the new run directory; the
/// run must exit 0 (or 1 where `may_fail`).
pub fn cpu_run_dir(results: &std::path::Path, args: &[&str], may_fail: bool) -> PathBuf {
    let before = run_dirs(results);
    let (code, out, err) = cpu(args, results);
    assert!(code == 0 || (may_fail && code == 1), "{args:?}: {out}{err}");
    run_dirs(results)
        .into_iter()
        .find(|d| !before.contains(d))
        .expect("the run wrote a directory")
}

/// Runs a bad command line (with `env` set); asserts exit `code`, a message on stderr holding
/// every needle, and no run directory left behind.
pub fn refused_with_env(args: &[&str], env: &[(&str, &str)], code: i32, needles: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let results = dir.path().join("r");
    let mut cmd = runner();
    cmd.args(args).arg("--results-dir").arg(&results);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let (got, stdout, stderr) = output(&mut cmd);
    assert_eq!(got, code, "{args:?}: {stdout}{stderr}");
    for needle in needles {
        assert!(
            stderr.contains(needle),
            "{args:?}: `{needle}` not in: {stderr}"
        );
    }
    assert!(
        run_dirs(&results).is_empty(),
        "{args:?} left {:?}",
        run_dirs(&results)
    );
}

/// A kernel of the project's manifest (cuda/kernels.toml).
pub fn kernel_spec(name: &str) -> sdpa_runner::kernels::KernelSpec {
    sdpa_runner::kernels::Manifest::load(&project_root().join("cuda/kernels.toml"))
        .unwrap()
        .get(name)
        .unwrap()
        .clone()
}

/// The cuda backend on GPU 0 with the project's kernel built as `specs`.
pub fn gpu_backend(
    specs: &[sdpa_runner::backend::cuda::variant::VariantSpec],
) -> sdpa_runner::backend::cuda::CudaBackend {
    let root = project_root();
    let source = sdpa_runner::backend::cuda::kernel::KernelSource::load(
        &root.join("cuda/sdpa_fp8_stage_c_mma.cu"),
        &root.join("cuda"),
        &kernel_spec("stage-c"),
    )
    .unwrap();
    sdpa_runner::backend::cuda::CudaBackend::new(source, specs).unwrap()
}

/// The project's gates (gates/default.json).
pub fn default_gates() -> sdpa_runner::gates::Gates {
    sdpa_runner::gates::GateFile::load(&project_root().join("gates/default.json"))
        .unwrap()
        .gates
}

/// The project's shapes (shapes/default.json).
pub fn catalog() -> sdpa_runner::shapes::ShapeCatalog {
    sdpa_runner::shapes::ShapeCatalog::load(&project_root().join("shapes/default.json")).unwrap()
}

/// A shape named by its dimensions, distribution and qk_std.
pub fn shape(
    b: usize,
    h: usize,
    s: usize,
    qk_std: f64,
    dist: sdpa_runner::shapes::Dist,
) -> sdpa_runner::shapes::Shape {
    sdpa_runner::shapes::Shape {
        name: format!("{b}x{h}x{s} {} qk_std {qk_std}", dist.name()),
        b,
        h,
        s,
        d: 64,
        qk_std,
        purpose: String::new(),
        dist,
        hkv: h,
        sk: s,
        causal: false,
        rotate: false,
    }
}

/// Two batches of 4 query heads over 2 K/V heads each, causal at D 128, with the rows a run
/// samples (not all): the problem on which head groups of the runner's GPU kernels start
/// inside a K/V head's group and cross batches (tests/gpu_emulation.rs, tests/gpu_reference.rs).
pub fn gqa_causal_sampled() -> (
    sdpa_runner::shapes::Shape,
    sdpa_runner::problem::Problem,
    sdpa_runner::rows::RowSet,
) {
    let sh = sdpa_runner::shapes::Shape::parse_inline("2x4x3000x128:hkv=2:causal:qk=3")
        .unwrap()
        .unwrap();
    let p = sdpa_runner::problem::Problem::new(&sh, 11);
    let rows = sdpa_runner::rows::RowSet::sampled(&sh, 11, &[64, 128]);
    assert!(!rows.is_all());
    (sh, p, rows)
}

/// The memory of the largest three neighbouring heads of `heads`, `bytes(bh)` each: a budget
/// that groups them three at a time.
pub fn three_heads(heads: usize, bytes: impl Fn(usize) -> u64) -> u64 {
    (0..heads - 2)
        .map(|bh| bytes(bh) + bytes(bh + 1) + bytes(bh + 2))
        .max()
        .unwrap()
}
