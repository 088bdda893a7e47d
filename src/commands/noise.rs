//! `sdpa-runner noise`: measures this GPU model's unpaired noise floors (src/floors.rs). It
//! times one variant on each shape in `--processes` separate child runs of this binary (each
//! a process of its own, as two CI runs are), takes each process's median per shape, and
//! records the floor those medians imply in the floors file under the GPU model's name, the
//! other models' entries kept. The file is written atomically, once, at the end.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;

use super::Project;
use crate::backend::BackendKind;
use crate::backend::cuda::variant::CpAsyncChoice;
use crate::cli::NoiseArgs;
use crate::error::{AppError, Outcome};
use crate::floors::{FloorFile, GpuFloors, ShapeFloor};
use crate::outln;
use crate::perf::compare::SavedRun;
use crate::usage::ConfigError;

pub fn noise(args: &NoiseArgs) -> Result<Outcome, AppError> {
    let project = Project::load(&args.project)?;
    let shapes = project.catalog.select(&args.shapes)?;
    let path = args
        .floors
        .clone()
        .unwrap_or_else(|| project.root.path().join(crate::floors::DEFAULT_FILE));
    let mut file = FloorFile::load(&path)?.unwrap_or(FloorFile {
        version: 1,
        gpus: BTreeMap::new(),
    });
    crate::publish::check_writable(&path)?;
    let variant = match args.cp_async {
        CpAsyncChoice::Off => "0",
        CpAsyncChoice::On => "1",
        CpAsyncChoice::Both => {
            return Err(
                ConfigError::Usage("noise times one variant: --cp-async 0 or 1".into()).into(),
            );
        }
    };
    let exe = std::env::current_exe()
        .map_err(|e| ConfigError::Usage(format!("cannot find this program's path: {e}")))?;
    let work = std::env::temp_dir().join(format!("sdpa-noise-{}", std::process::id()));
    crate::interrupt::register(&work);
    let names: Vec<String> = shapes.iter().map(|s| s.name.clone()).collect();
    let mut medians: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    let (mut gpu, mut variant_name, mut kernel) = (String::new(), String::new(), String::new());
    for i in 0..args.processes {
        let results = work.join(format!("p{i}"));
        let mut cmd = Command::new(&exe);
        cmd.args([
            "--shapes",
            &names.join(","),
            "--seeds",
            "0",
            "--cp-async",
            variant,
        ])
        .arg("--backend")
        .arg(match args.backend {
            BackendKind::Cuda => "cuda",
            BackendKind::Cpu => "cpu",
        })
        .arg("--root")
        .arg(project.root.path())
        .arg("--results-dir")
        .arg(&results)
        .env_remove("USE_CP_ASYNC");
        let out = crate::interrupt::output_of_child(&mut cmd)
            .map_err(|e| ConfigError::Usage(format!("cannot start {}: {e}", exe.display())))?;
        let code = out.status.code().unwrap_or(-1);
        if code != 0 {
            let _ = std::fs::remove_dir_all(&work);
            crate::interrupt::unregister(&work);
            return Err(ConfigError::Usage(format!(
                "process {} of {} ended with exit {code}, not a pass; a noise floor needs \
                 passing runs: {}",
                i + 1,
                args.processes,
                String::from_utf8_lossy(&out.stderr).trim()
            ))
            .into());
        }
        let run: PathBuf = std::fs::read_dir(&results)
            .ok()
            .and_then(|mut d| d.find_map(|e| e.ok().map(|e| e.path())))
            .ok_or_else(|| ConfigError::Usage(format!("process {} wrote no run", i + 1)))?;
        let saved = SavedRun::load(&run)?;
        gpu = saved.perf.device_name.clone();
        let v = saved.perf.variants.first().cloned();
        variant_name = v.as_ref().map_or_else(String::new, |v| v.name.clone());
        kernel = v
            .and_then(|v| v.kernel)
            .map_or_else(|| "emulation".into(), |k| k.sha256);
        for m in &saved.perf.measurements {
            medians
                .entry(m.shape.clone())
                .or_default()
                .push(m.summary.p50);
        }
        outln!("process {}/{} done", i + 1, args.processes);
    }
    let _ = std::fs::remove_dir_all(&work);
    crate::interrupt::unregister(&work);

    let floors: BTreeMap<String, ShapeFloor> = medians
        .iter()
        .filter_map(|(shape, p50s)| ShapeFloor::from_medians(p50s).map(|f| (shape.clone(), f)))
        .collect();
    outln!(
        "noise floors on {gpu} ({} processes of {variant_name}):",
        args.processes
    );
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
    file.gpus.insert(
        gpu.clone(),
        GpuFloors {
            measured_at: crate::report::now_rfc3339(),
            processes: args.processes as usize,
            variant: variant_name,
            kernel_sha256: kernel,
            shapes: floors,
        },
    );
    let mut text = serde_json::to_string_pretty(&file).expect("floors serialize");
    text.push('\n');
    crate::report::write_atomic(&path, text.as_bytes())?;
    outln!("floors: {} (entry {gpu})", path.display());
    Ok(Outcome::Pass)
}
