//! Publishing what was decided: the run directory's files, staged and committed atomically
//! from a [`RunAnalysis`] alone, and the outputs outside it (JUnit XML, the newest COMPARE.md
//! at `<results>/COMPARE.md`, the GitHub job summary).
//!
//! Outputs outside the run directory are checked writable before a run starts
//! ([`Extras::check`]) and written after the commit; a failure there is a warning and never
//! changes the verdict or the exit code of the run.

use std::io::Write;
use std::path::{Path, PathBuf};

use crate::analysis::RunAnalysis;
use crate::render::svg;
use crate::report::{ReportError, RunDir, write_atomic};
use crate::schema::{BuildMeta, PerfFile, ShapeComparison};

/// The latency picture of a comparison, from the raw samples of both sides.
pub fn latency_svg(cmps: &[ShapeComparison], base: &PerfFile, cand: &PerfFile) -> String {
    let gather = |f: &PerfFile, shape: &str, variant: &str| -> Vec<f64> {
        f.measurements_of(shape, variant)
            .flat_map(|m| m.samples_us.iter().copied())
            .collect()
    };
    let one_pair = cmps.iter().all(|c| {
        cmps.first()
            .is_some_and(|f| (f.baseline == c.baseline) && (f.candidate == c.candidate))
    });
    let data: Vec<(Vec<f64>, Vec<f64>, String, String)> = cmps
        .iter()
        .map(|c| {
            (
                gather(base, &c.shape, &c.baseline),
                gather(cand, &c.shape, &c.candidate),
                format!("{} {:+.1}%", c.verdict, c.speedup_pct),
                if one_pair {
                    c.shape.clone()
                } else {
                    format!("{} {} vs {}", c.shape, c.candidate, c.baseline)
                },
            )
        })
        .collect();
    let panels: Vec<svg::Panel> = data
        .iter()
        .map(|(b, k, v, label)| svg::Panel {
            shape: label,
            base: b,
            cand: k,
            verdict: v,
        })
        .collect();
    let (bl, cl) = match cmps.first() {
        Some(c) if one_pair => (
            format!("baseline {}", c.baseline),
            format!("candidate {}", c.candidate),
        ),
        Some(_) => ("baseline".to_string(), "candidate".to_string()),
        None => Default::default(),
    };
    svg::render(&panels, &bl, &cl, &cand.clock)
}

/// A COMPARE.md and its picture, rendered from a decision.
pub struct CompareReport {
    pub markdown: String,
    pub svg: String,
}

/// Writes a run's files into its staging folder and commits it; returns the run's path.
pub fn commit_run(
    run_dir: RunDir,
    meta: &BuildMeta,
    analysis: &RunAnalysis,
    report: Option<&CompareReport>,
) -> Result<PathBuf, ReportError> {
    run_dir.write_json("build_meta.json", meta)?;
    run_dir.write_json("correctness.json", &analysis.correctness)?;
    if let Some(perf) = &analysis.perf {
        run_dir.write_json("perf.json", perf)?;
    }
    if let Some(r) = report {
        run_dir.write_text("latency.svg", &r.svg)?;
        run_dir.write_text("COMPARE.md", &r.markdown)?;
    }
    run_dir.commit()
}

/// Outputs outside a run directory.
#[derive(Debug, Default)]
pub struct Extras {
    pub junit: Option<PathBuf>,
    /// `<results>/COMPARE.md`, refreshed with the newest comparison.
    pub latest_compare: Option<PathBuf>,
}

impl Extras {
    /// Refuses (exit 2) an output that cannot be written, before any work is done.
    pub fn check(&self) -> Result<(), ReportError> {
        let summary = std::env::var_os("GITHUB_STEP_SUMMARY").map(PathBuf::from);
        for path in self
            .junit
            .iter()
            .chain(&self.latest_compare)
            .chain(&summary)
        {
            check_writable(path)?;
        }
        Ok(())
    }

    /// Writes the outputs of a finished run; returns the warnings of those that failed.
    pub fn write(
        &self,
        junit: impl FnOnce() -> String,
        compare: Option<(&str, &str)>,
    ) -> Vec<String> {
        let mut warnings = Vec::new();
        if let Some(path) = &self.junit
            && let Err(e) = write_atomic(path, junit().as_bytes())
        {
            warnings.push(format!("JUnit not written: {e}"));
        }
        if let (Some(path), Some((markdown, run_name))) = (&self.latest_compare, compare) {
            let text = markdown.replace("](latency.svg)", &format!("]({run_name}/latency.svg)"));
            let text = format!("{text}\n_Newest comparison, from `{run_name}/COMPARE.md`._\n");
            if let Err(e) = write_atomic(path, text.as_bytes()) {
                warnings.push(format!("{} not refreshed: {e}", path.display()));
            }
        }
        if let Some(markdown) = compare.map(|(m, _)| m)
            && let Err(e) = append_step_summary(markdown)
        {
            warnings.push(e);
        }
        warnings
    }
}

/// A file path that can be written: not a folder, and its folder (or the nearest existing one
/// above it, created at write time) takes a new file. Creates nothing.
pub fn check_writable(path: &Path) -> Result<(), ReportError> {
    let unwritable = |source| ReportError::Output {
        path: path.to_path_buf(),
        source,
    };
    if path.is_dir() {
        return Err(unwritable(std::io::Error::other(
            "it is a directory; name a file",
        )));
    }
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    crate::report::probe_nearest_dir(&dir).map_err(unwritable)
}

/// Appends `markdown` to the GitHub Actions job summary when running there.
fn append_step_summary(markdown: &str) -> Result<(), String> {
    let Some(path) = std::env::var_os("GITHUB_STEP_SUMMARY") else {
        return Ok(());
    };
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .and_then(|mut f| writeln!(f, "{markdown}"))
        .map_err(|e| {
            format!(
                "could not append to GITHUB_STEP_SUMMARY ({}): {e}",
                Path::new(&path).display()
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_or_an_unwritable_folder_is_refused_before_any_work() {
        let dir = tempfile::tempdir().unwrap();
        let err = check_writable(dir.path()).unwrap_err().to_string();
        assert!(err.contains("is a directory"), "{err}");
        let file = dir.path().join("plain");
        std::fs::write(&file, "x").unwrap();
        assert!(check_writable(&file.join("sub/junit.xml")).is_err());
        let ok = dir.path().join("new/sub/junit.xml");
        check_writable(&ok).unwrap();
        assert!(
            !dir.path().join("new").exists(),
            "the check creates nothing (the folders come at write time)"
        );
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn a_failed_extra_output_is_a_warning_not_an_error() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("plain"), "x").unwrap();
        let extras = Extras {
            junit: Some(dir.path().join("plain/junit.xml")),
            latest_compare: Some(dir.path().join("COMPARE.md")),
        };
        let warnings = extras.write(|| "<xml/>".into(), Some(("# md ](latency.svg)", "run1")));
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(warnings[0].contains("JUnit"), "{warnings:?}");
        let latest = std::fs::read_to_string(dir.path().join("COMPARE.md")).unwrap();
        assert!(latest.contains("](run1/latency.svg)"), "{latest}");
    }
}
