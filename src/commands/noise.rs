//! `sdpa-runner noise`: measures this GPU model's noise floors (src/floors.rs) in separate
//! child runs of this binary, and records them in the floors file under the GPU model's name:
//! the shapes measured replace theirs, every other shape and entry is kept (a kept shape with
//! the origin it was measured at). The file is written atomically, once, at the end.
//!
//! - Between processes (the default): one variant timed on each shape in `--processes` child
//!   runs (each a process of its own, as two CI runs are); each process's median per shape.
//! - In-run (`--paired`, GPU only): `--processes` child runs of the PR gate whose base kernel
//!   is the kernel under test, three seeds each; every comparison against the base (cp0 and
//!   cp1) is an A/A of one run.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::Project;
use crate::backend::BackendKind;
use crate::backend::cuda::variant::CpAsyncChoice;
use crate::cli::NoiseArgs;
use crate::error::{AppError, Outcome};
use crate::floors::{FloorFile, GpuFloors, PairedFloors, PairedShapeFloor, ShapeFloor};
use crate::outln;
use crate::perf::compare::SavedRun;
use crate::schema::{PairKind, PerfFile};
use crate::usage::ConfigError;

/// The shapes measured by default: between processes, those `compare` judges most; in-run, the
/// PR gate's target and the shapes its power was proven on (scripts/prove_power.sh). A
/// partial `--shapes` keeps the floors of the others.
const PROCESS_SHAPES: &str = "small,mission,long";
const PAIRED_SHAPES: &str = "mission,large,llama-prefill";

/// The seeds of each in-run A/A child: the PR gate's default.
const PAIRED_SEEDS: [u64; 3] = [0, 1, 2];

pub fn noise(args: &NoiseArgs) -> Result<Outcome, AppError> {
    let project = Project::load(&args.project)?;
    let shapes = project
        .catalog
        .select(args.shapes.as_deref().unwrap_or(if args.paired {
            PAIRED_SHAPES
        } else {
            PROCESS_SHAPES
        }))?;
    let path = args
        .floors
        .clone()
        .unwrap_or_else(|| project.root.path().join(crate::floors::DEFAULT_FILE));
    let mut file = FloorFile::load(&path)?.unwrap_or(FloorFile {
        version: 1,
        ..FloorFile::default()
    });
    crate::publish::check_writable(&path)?;
    let names: Vec<String> = shapes.iter().map(|s| s.name.clone()).collect();
    let backend = match args.backend {
        BackendKind::Cuda => "cuda",
        BackendKind::Cpu => "cpu",
    };
    let mut child: Vec<String> = vec![
        "--shapes".into(),
        names.join(","),
        "--backend".into(),
        backend.into(),
    ];
    let gpu = if args.paired {
        if args.cp_async.is_some() {
            return Err(ConfigError::Usage(
                "noise --paired times both variants against their base twins; drop --cp-async"
                    .into(),
            )
            .into());
        }
        if args.backend == BackendKind::Cpu {
            return Err(ConfigError::Usage(
                "noise --paired times two arms of one GPU kernel in each run (the PR gate \
                 against itself); the cpu backend has one variant: use --backend cuda"
                    .into(),
            )
            .into());
        }
        if (args.processes as usize) * 2 < crate::floors::PAIRED_MIN_COMPARISONS {
            return Err(ConfigError::Usage(format!(
                "noise --paired needs at least {} A/A comparisons per shape, two per run: \
                 use --processes {} or more",
                crate::floors::PAIRED_MIN_COMPARISONS,
                crate::floors::PAIRED_MIN_COMPARISONS.div_ceil(2)
            ))
            .into());
        }
        let seeds: Vec<String> = PAIRED_SEEDS.iter().map(u64::to_string).collect();
        let chosen = crate::cli::KernelArgs {
            kernel: args.kernel.clone(),
            ..crate::cli::KernelArgs::default()
        };
        let kernel = project.kernel_path(&chosen)?;
        let default = project.kernel_path(&crate::cli::KernelArgs::default())?;
        let key = paired_key(&kernel, &default);
        if let Some(k) = &args.kernel {
            child.extend(["--kernel".into(), k.display().to_string()]);
        }
        child.extend([
            "--seeds".into(),
            seeds.join(","),
            "--base-kernel".into(),
            kernel.display().to_string(),
        ]);
        let runs = child_runs(args, &project, &child)?;
        record_paired(&mut file, &runs, args.processes as usize, key)?
    } else {
        let variant = match args.cp_async {
            Some(CpAsyncChoice::Off) | None => "0",
            Some(CpAsyncChoice::On) => "1",
            Some(CpAsyncChoice::Both) => {
                return Err(ConfigError::Usage(
                    "noise times one variant: --cp-async 0 or 1".into(),
                )
                .into());
            }
        };
        child.extend([
            "--seeds".into(),
            "0".into(),
            "--cp-async".into(),
            variant.into(),
        ]);
        let runs = child_runs(args, &project, &child)?;
        record_processes(&mut file, &runs, args.processes as usize)
    };
    let mut text = serde_json::to_string_pretty(&file).expect("floors serialize");
    text.push('\n');
    crate::report::write_atomic(&path, text.as_bytes())?;
    outln!("floors: {} (entry {gpu})", path.display());
    Ok(Outcome::Pass)
}

/// Runs `--processes` children of this binary with `child` arguments, each into a folder of
/// its own under a temporary work folder (removed at the end, or on a signal), and loads each
/// one's run. A child that does not pass ends the measurement, naming its exit and stderr.
fn child_runs(
    args: &NoiseArgs,
    project: &Project,
    child: &[String],
) -> Result<Vec<SavedRun>, AppError> {
    let exe = std::env::current_exe()
        .map_err(|e| ConfigError::Usage(format!("cannot find this program's path: {e}")))?;
    let work = std::env::temp_dir().join(format!("sdpa-noise-{}", std::process::id()));
    crate::interrupt::register(&work);
    let result = (|| {
        let mut runs = Vec::new();
        for i in 0..args.processes {
            let run = child_run(&exe, project, child, &work.join(format!("p{i}")));
            runs.push(run.map_err(|(code, why)| -> AppError {
                let why = format!(
                    "process {} of {}: {why}; a noise floor needs passing runs",
                    i + 1,
                    args.processes
                );
                // A child that found no usable GPU (exit 3) is the environment's fault, and
                // this command says so with the same code.
                if code == Some(i32::from(crate::error::EXIT_ENVIRONMENT)) {
                    crate::backend::BackendError::Environment(why).into()
                } else {
                    ConfigError::Usage(why).into()
                }
            })?);
            outln!("process {}/{} done", i + 1, args.processes);
        }
        Ok(runs)
    })();
    let _ = std::fs::remove_dir_all(&work);
    crate::interrupt::unregister(&work);
    result
}

/// One child run, loaded; on failure its exit code (if it ran) and why.
fn child_run(
    exe: &Path,
    project: &Project,
    child: &[String],
    results: &Path,
) -> Result<SavedRun, (Option<i32>, String)> {
    let mut cmd = Command::new(exe);
    cmd.args(child)
        .arg("--root")
        .arg(project.root.path())
        .arg("--results-dir")
        .arg(results)
        .env_remove("USE_CP_ASYNC");
    let out = crate::interrupt::output_of_child(&mut cmd)
        .map_err(|e| (None, format!("cannot start {}: {e}", exe.display())))?;
    let code = out.status.code().unwrap_or(-1);
    if code != 0 {
        return Err((
            Some(code),
            format!(
                "ended with exit {code}, not a pass: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        ));
    }
    let run: PathBuf = crate::report::only_run_dir(results).map_err(|why| (None, why))?;
    SavedRun::load(&run).map_err(|e| (None, e.to_string()))
}

/// The kernel a run timed: its first variant's source sha256 ("emulation" on the cpu).
fn kernel_of(run: &SavedRun) -> String {
    run.perf
        .variants
        .first()
        .and_then(|v| v.kernel.clone())
        .map_or_else(|| "emulation".into(), |k| k.sha256)
}

/// Records the floors between processes; returns the GPU model.
fn record_processes(file: &mut FloorFile, runs: &[SavedRun], processes: usize) -> String {
    let mut medians: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for run in runs {
        for m in &run.perf.measurements {
            medians
                .entry(m.shape.clone())
                .or_default()
                .push(m.summary.p50);
        }
    }
    let last = runs.last().expect("at least 3 processes");
    let gpu = last.perf.device_name.clone();
    let variant = last
        .perf
        .variants
        .first()
        .map_or_else(String::new, |v| v.name.clone());
    let floors: BTreeMap<String, ShapeFloor> = medians
        .iter()
        .filter_map(|(shape, p50s)| ShapeFloor::from_medians(p50s).map(|f| (shape.clone(), f)))
        .collect();
    outln!("noise floors on {gpu} ({processes} processes of {variant}):");
    outln!("shape            median µs   sd %   sd upper %   max pair %   floor %");
    for (shape, f) in &floors {
        let mut sorted = f.p50_us.clone();
        sorted.sort_by(f64::total_cmp);
        outln!(
            "{shape:<16} {:>9.2} {:>6.2} {:>12.2} {:>12.2} {:>9.2}",
            sorted[sorted.len() / 2],
            f.sd_pct,
            f.sd_upper_pct,
            f.max_pair_pct,
            f.floor_pct
        );
    }
    let entry = GpuFloors {
        measured_at: crate::report::now_rfc3339(),
        processes,
        variant,
        kernel_sha256: kernel_of(last),
        shapes: floors,
    };
    let (entry, kept) = match file.gpus.remove(&gpu) {
        Some(old) => old.merged(entry),
        None => (entry, Vec::new()),
    };
    file.gpus.insert(gpu.clone(), entry);
    say_kept(&kept);
    gpu
}

/// Names the shapes a partial measurement kept from earlier ones.
fn say_kept(kept: &[String]) {
    if !kept.is_empty() {
        outln!(
            "kept from earlier measurements (each with its own origin): {}",
            kept.join(", ")
        );
    }
}

/// Records the in-run floors from every A/A comparison of every run, under the default
/// kernel's section or, with `kernel` (a source file name), that kernel's; returns the GPU
/// model.
fn record_paired(
    file: &mut FloorFile,
    runs: &[SavedRun],
    processes: usize,
    kernel: Option<String>,
) -> Result<String, ConfigError> {
    let speedups = a_a_speedups(runs.iter().map(|r| &r.perf))?;
    let last = runs.last().expect("at least 3 processes");
    let gpu = last.perf.device_name.clone();
    let floors: BTreeMap<String, PairedShapeFloor> = speedups
        .iter()
        .filter_map(|(shape, s)| {
            PairedShapeFloor::from_speedups(s, processes).map(|f| (shape.clone(), f))
        })
        .collect();
    outln!("in-run noise floors on {gpu} ({processes} runs, A/A against the base kernel):");
    let w = speedups.keys().map(String::len).max().unwrap_or(0).max(16);
    outln!(
        "{:<w$} comparisons   rms %   rms upper %   max |A/A| %   floor %",
        "shape"
    );
    for (shape, f) in &floors {
        outln!(
            "{shape:<w$} {:>11} {:>7.3} {:>13.3} {:>13.3} {:>9.3}",
            f.speedups_pct.len(),
            f.rms_pct,
            f.rms_upper_pct,
            f.max_abs_pct,
            f.floor_pct
        );
    }
    for (shape, s) in speedups.iter().filter(|(s, _)| !floors.contains_key(*s)) {
        outln!(
            "{shape:<w$} {} comparisons: fewer than {} (use more --processes), not recorded",
            s.len(),
            crate::floors::PAIRED_MIN_COMPARISONS
        );
    }
    if floors.is_empty() {
        return Err(ConfigError::Usage(format!(
            "no shape had {} A/A comparisons against the base kernel; nothing recorded",
            crate::floors::PAIRED_MIN_COMPARISONS
        )));
    }
    let entry = PairedFloors {
        measured_at: crate::report::now_rfc3339(),
        runs: processes,
        seeds: PAIRED_SEEDS.to_vec(),
        kernel_sha256: kernel_of(last),
        shapes: floors,
    };
    say_kept(&insert_paired(file, &gpu, entry, kernel));
    Ok(gpu)
}

/// Where `noise --paired` keeps the floors of `kernel`: None (the file's `paired` section) for
/// the default kernel, however its path is spelled; another kernel's source file name
/// (`paired_kernels`), the key its runs look up (`floors::kernel_file_name`).
fn paired_key(kernel: &Path, default: &Path) -> Option<String> {
    let name = |p: &Path| crate::floors::kernel_file_name(&p.display().to_string());
    let own = name(kernel)?;
    (Some(&own) != name(default).as_ref()).then_some(own)
}

/// Puts `entry` over `gpu`'s entry of the section `kernel` names ([`paired_key`]), keeping the
/// shapes it did not measure ([`PairedFloors::merged`]); returns their names.
fn insert_paired(
    file: &mut FloorFile,
    gpu: &str,
    entry: PairedFloors,
    kernel: Option<String>,
) -> Vec<String> {
    let section = match kernel {
        None => &mut file.paired,
        Some(k) => file.paired_kernels.entry(k).or_default(),
    };
    let (entry, kept) = match section.remove(gpu) {
        Some(old) => old.merged(entry),
        None => (entry, Vec::new()),
    };
    section.insert(gpu.to_string(), entry);
    kept
}

/// Per shape, the speedup of every comparison against the base kernel in `runs`, run by run
/// (each an A/A when the base is the kernel under test); comparisons of variants are not. A
/// comparison whose two sides ran other machine code (src/perf/same_code.rs) is no A/A, and
/// its run is refused rather than measured as noise.
fn a_a_speedups<'a>(
    runs: impl Iterator<Item = &'a PerfFile>,
) -> Result<BTreeMap<String, Vec<f64>>, ConfigError> {
    let mut speedups: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for perf in runs {
        for c in perf
            .comparisons
            .iter()
            .filter(|c| c.pair == PairKind::BaseKernel)
        {
            if c.same_machine_code == Some(false) {
                return Err(ConfigError::Usage(format!(
                    "{}: {} and {} ran other machine code or launches, so their comparison is \
                     no A/A and cannot measure noise; the base built from the same source must \
                     build the same code (is NVRTC or a header changing between the builds?)",
                    c.shape, c.candidate, c.baseline
                )));
            }
            speedups
                .entry(c.shape.clone())
                .or_default()
                .push(c.speedup_pct);
        }
    }
    Ok(speedups)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::perf::fixtures;

    #[test]
    fn only_comparisons_against_the_base_kernel_count_as_a_a_shape_by_shape() {
        let mut one = fixtures::perf_file(
            "GPU",
            &["mission", "large"],
            &[0],
            &[
                ("cp0", 1.0),
                ("cp1", 0.9),
                ("base-cp0", 1.0),
                ("base-cp1", 0.9),
            ],
        );
        fixtures::mark_base(&mut one);
        one.comparisons =
            crate::perf::paired_comparisons(&one, &fixtures::gates(), &fixtures::constant_floor);
        // cp1 vs cp0 (variants, about +11%) and two A/A per shape.
        assert_eq!(one.comparisons.len(), 6);
        let got = a_a_speedups([&one, &one].into_iter()).unwrap();
        assert_eq!(got.keys().collect::<Vec<_>>(), ["large", "mission"]);
        for s in got.values() {
            assert_eq!(s.len(), 4);
            assert!(s.iter().all(|x| x.abs() < 1.0), "{s:?}");
        }
    }

    #[test]
    fn a_comparison_of_other_machine_code_is_no_a_a_and_is_refused() {
        let mut one = fixtures::perf_file(
            "GPU",
            &["mission"],
            &[0],
            &[("cp0", 1.0), ("base-cp0", 1.0)],
        );
        fixtures::mark_base(&mut one);
        one.comparisons =
            crate::perf::paired_comparisons(&one, &fixtures::gates(), &fixtures::constant_floor);
        assert!(
            a_a_speedups([&one].into_iter()).is_ok(),
            "unknown code: measured"
        );
        let base = one
            .comparisons
            .iter_mut()
            .find(|c| c.pair == PairKind::BaseKernel)
            .unwrap();
        base.same_machine_code = Some(false);
        let err = a_a_speedups([&one].into_iter()).unwrap_err().to_string();
        assert!(
            err.contains("mission: cp0 and base-cp0 ran other machine code"),
            "{err}"
        );
    }

    #[test]
    fn the_default_kernel_however_spelled_keeps_its_floors_in_paired_and_another_under_its_file() {
        let default = Path::new("/work/main/cuda/sdpa_fp8_stage_c_mma.cu");
        for same in [
            "cuda/sdpa_fp8_stage_c_mma.cu",
            "./cuda/sdpa_fp8_stage_c_mma.cu",
            "/work/main/cuda/sdpa_fp8_stage_c_mma.cu",
        ] {
            assert_eq!(paired_key(Path::new(same), default), None, "{same}");
        }
        assert_eq!(
            paired_key(
                Path::new("/work/main/cuda/sdpa_fp8_stage_d_wgmma.cu"),
                default
            )
            .as_deref(),
            Some("sdpa_fp8_stage_d_wgmma.cu")
        );
        let entry = |runs: usize| PairedFloors {
            measured_at: "t".into(),
            runs,
            seeds: vec![0],
            kernel_sha256: "k".into(),
            shapes: BTreeMap::new(),
        };
        let mut file = FloorFile::default();
        insert_paired(&mut file, "G", entry(5), None);
        insert_paired(&mut file, "G", entry(6), Some("d.cu".into()));
        assert_eq!(file.paired["G"].runs, 5);
        assert_eq!(file.paired_kernels["d.cu"]["G"].runs, 6);
    }

    #[test]
    fn a_measurement_between_processes_of_some_shapes_keeps_the_gpus_other_shapes() {
        let runs = |shape: &str| -> Vec<SavedRun> {
            (0..3)
                .map(|i| SavedRun {
                    perf_path: PathBuf::from(format!("p{i}/perf.json")),
                    perf: fixtures::perf_file("GPU", &[shape], &[0], &[("cp0", 1.0 + i as f64)]),
                    correctness: None,
                })
                .collect()
        };
        let mut file = FloorFile::default();
        record_processes(&mut file, &runs("small"), 3);
        let first = file.gpus["GPU"].measured_at.clone();
        record_processes(&mut file, &runs("long"), 3);
        let g = &file.gpus["GPU"];
        assert_eq!(g.shapes.keys().collect::<Vec<_>>(), ["long", "small"]);
        assert_eq!(g.origin_of(&g.shapes["small"]).measured_at, first);
        assert!(g.shapes["long"].origin.is_none() && g.shapes["small"].origin.is_some());
    }

    #[test]
    fn a_measurement_of_some_shapes_keeps_the_sections_other_shapes() {
        let entry = |at: &str, shapes: &[&str]| PairedFloors {
            measured_at: at.into(),
            runs: 5,
            seeds: vec![0, 1, 2],
            kernel_sha256: "k".into(),
            shapes: shapes
                .iter()
                .map(|s| {
                    let f = PairedShapeFloor::from_speedups(&[0.1; 10], 5).unwrap();
                    (s.to_string(), f)
                })
                .collect(),
        };
        for kernel in [None, Some("d.cu".to_string())] {
            let mut file = FloorFile::default();
            assert!(
                insert_paired(&mut file, "G", entry("t1", &["a", "b"]), kernel.clone()).is_empty()
            );
            let kept = insert_paired(&mut file, "G", entry("t2", &["b", "c"]), kernel.clone());
            assert_eq!(kept, ["a"]);
            let section = match &kernel {
                None => &file.paired,
                Some(k) => &file.paired_kernels[k],
            };
            let g = &section["G"];
            assert_eq!(g.shapes.keys().collect::<Vec<_>>(), ["a", "b", "c"]);
            assert_eq!(g.origin_of(&g.shapes["a"]).measured_at, "t1");
            assert_eq!(g.origin_of(&g.shapes["b"]).measured_at, "t2");
            // The other section and GPU model are untouched.
            assert!(file.paired_kernels.len() + file.paired.len() == 1);
        }
    }
}
