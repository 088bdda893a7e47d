//! `sdpa-runner baseline record RUN` and `baseline compare RUN`: committed baselines, one
//! folder per GPU model under results/baselines/, as trend data. The PR gate needs none (it
//! times the base kernel in the same run, `run --base-kernel --gate`); a missing baseline is
//! a notice, never a failure.

use std::path::{Path, PathBuf};

use super::Project;
use crate::cli::{BaselineAction, BaselineArgs, CompareArgs};
use crate::error::{AppError, Outcome};
use crate::outln;
use crate::perf::compare::SavedRun;
use crate::report::ReportError;
use crate::usage::ConfigError;

/// The files of a run a baseline keeps.
const FILES: [&str; 5] = [
    "perf.json",
    "correctness.json",
    "build_meta.json",
    "COMPARE.md",
    "latency.svg",
];

pub fn baseline(args: &BaselineArgs) -> Result<Outcome, AppError> {
    match &args.action {
        BaselineAction::Record { run, dir, project } => {
            let project = Project::load(project)?;
            record(run, &baselines_dir(dir.as_deref(), &project))
        }
        BaselineAction::Compare {
            run,
            dir,
            out,
            project,
        } => {
            let loaded = Project::load(project)?;
            let root = baselines_dir(dir.as_deref(), &loaded);
            compare(run, &root, out.clone(), project)
        }
    }
}

fn baselines_dir(dir: Option<&Path>, project: &Project) -> PathBuf {
    dir.map(Path::to_path_buf)
        .unwrap_or_else(|| project.root.path().join("results/baselines"))
}

/// The folder of a GPU model: its name with every run of characters other than letters,
/// digits, `.` and `_` turned into one `-` (`NVIDIA H100 80GB HBM3` -> `NVIDIA-H100-80GB-HBM3`).
pub(super) fn model_dir(device_name: &str) -> String {
    let mut out = String::new();
    for c in device_name.chars() {
        if c.is_ascii_alphanumeric() || c == '.' || c == '_' {
            out.push(c);
        } else if !out.is_empty() && !out.ends_with('-') {
            out.push('-');
        }
    }
    out.trim_end_matches('-').to_string()
}

/// Copies a passing, timed run into `<root>/<GPU model>/`, replacing what was there in one
/// step (a stopped process leaves the old baseline or the new one, never a mix).
fn record(run: &Path, root: &Path) -> Result<Outcome, AppError> {
    let saved = SavedRun::load(run)?;
    let run_dir = saved
        .perf_path
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default();
    match &saved.correctness {
        None => {
            return Err(ConfigError::Usage(format!(
                "{}: no correctness.json; a baseline must be a whole run (pass its directory)",
                run.display()
            ))
            .into());
        }
        Some(c) if !c.all_pass => {
            return Err(ConfigError::Usage(format!(
                "{}: the run failed its gates (all_pass: false); a baseline must be a passing run",
                run.display()
            ))
            .into());
        }
        Some(_) => {}
    }
    let model = model_dir(&saved.perf.device_name);
    if model.is_empty() || model.starts_with('.') {
        return Err(ConfigError::Usage(format!(
            "{}: the device name `{}` gives no folder name; the run's perf.json is damaged",
            run.display(),
            saved.perf.device_name
        ))
        .into());
    }
    let target = root.join(model);
    let write = |path: &Path, source| ReportError::Write {
        path: path.to_path_buf(),
        source,
    };
    std::fs::create_dir_all(root).map_err(|e| ReportError::Unwritable {
        path: root.to_path_buf(),
        source: e,
    })?;
    let staging = root.join(crate::interrupt::staging_name("baseline"));
    crate::interrupt::register(&staging);
    let staged = (|| -> Result<(), ReportError> {
        std::fs::create_dir(&staging).map_err(|e| write(&staging, e))?;
        for name in FILES {
            let from = run_dir.join(name);
            if from.is_file() {
                std::fs::copy(&from, staging.join(name)).map_err(|e| write(&staging, e))?;
            }
        }
        Ok(())
    })();
    if let Err(e) = staged {
        let _ = std::fs::remove_dir_all(&staging);
        crate::interrupt::unregister(&staging);
        return Err(e.into());
    }
    // Registered before the swap: a signal during or after it removes the replaced folder, so
    // none is left beside the baselines to be committed by accident.
    let old = root.join(crate::interrupt::staging_name("replaced-baseline"));
    crate::interrupt::register(&old);
    let swapped = crate::interrupt::commit(&staging, || -> std::io::Result<()> {
        if target.exists() {
            std::fs::rename(&target, &old)?;
        }
        std::fs::rename(&staging, &target)
    });
    if let Err(e) = swapped {
        if old.exists() && !target.exists() {
            let _ = std::fs::rename(&old, &target);
        }
        let _ = std::fs::remove_dir_all(&staging);
        crate::interrupt::unregister(&old);
        return Err(write(&target, e).into());
    }
    let _ = std::fs::remove_dir_all(&old);
    crate::interrupt::unregister(&old);
    outln!(
        "recorded {} as the baseline of {}: {}",
        run_dir.display(),
        saved.perf.device_name,
        target.display()
    );
    Ok(Outcome::Pass)
}

/// Compares a run with the baseline of its GPU model, if one is committed (never a gate).
fn compare(
    run: &Path,
    root: &Path,
    out: Option<PathBuf>,
    project: &crate::cli::ProjectArgs,
) -> Result<Outcome, AppError> {
    let saved = SavedRun::load(run)?;
    let target = root.join(model_dir(&saved.perf.device_name));
    if !target.join("perf.json").is_file() {
        let msg = format!(
            "no committed baseline for {} ({}): nothing to compare, which is fine; the PR gate \
             is `run --base-kernel --gate`. To keep trend data for this GPU model, record a \
             passing run of main with `sdpa-runner baseline record RUN` and commit it",
            saved.perf.device_name,
            target.display()
        );
        outln!("notice: {msg}");
        if std::env::var_os("GITHUB_ACTIONS").is_some() {
            outln!("::notice title=sdpa-runner baseline::{msg}");
        }
        return Ok(Outcome::Pass);
    }
    super::compare::compare(&CompareArgs {
        base: target,
        cand: run.to_path_buf(),
        out,
        gate: false,
        allow_mismatch: false,
        base_variant: None,
        cand_variant: None,
        floors: None,
        ci: Default::default(),
        project: project.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gpu_model_names_its_folder_with_dashes_for_odd_characters() {
        assert_eq!(model_dir("NVIDIA H200"), "NVIDIA-H200");
        assert_eq!(model_dir("NVIDIA H100 80GB HBM3"), "NVIDIA-H100-80GB-HBM3");
        assert_eq!(model_dir(" A/B:C "), "A-B-C");
        assert_eq!(
            model_dir("CPU AMD EPYC (2 threads)"),
            "CPU-AMD-EPYC-2-threads"
        );
    }
}
