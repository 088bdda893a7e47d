//! Publishing a comparison where people and CI look: COMPARE.md with its picture, the
//! newest copy at results/COMPARE.md, JUnit XML, and the GitHub job summary.

use std::io::Write;
use std::path::Path;

use crate::perf::{PerfFile, ShapeComparison, svg};
use crate::report::{ReportError, write_atomic};

/// The latency picture of a comparison, from the raw samples of both sides.
pub fn latency_svg(cmps: &[ShapeComparison], base: &PerfFile, cand: &PerfFile) -> String {
    let gather = |f: &PerfFile, shape: &str, variant: &str| -> Vec<f64> {
        f.measurements_of(shape, variant)
            .flat_map(|m| m.samples_us.iter().copied())
            .collect()
    };
    let data: Vec<(Vec<f64>, Vec<f64>, String)> = cmps
        .iter()
        .map(|c| {
            (
                gather(base, &c.shape, &c.baseline),
                gather(cand, &c.shape, &c.candidate),
                format!("{} {:+.1}%", c.verdict, c.speedup_pct),
            )
        })
        .collect();
    let panels: Vec<svg::Panel> = cmps
        .iter()
        .zip(&data)
        .map(|(c, (b, k, v))| svg::Panel {
            shape: &c.shape,
            base: b,
            cand: k,
            verdict: v,
        })
        .collect();
    let (bl, cl) = cmps
        .first()
        .map(|c| {
            (
                format!("baseline {}", c.baseline),
                format!("candidate {}", c.candidate),
            )
        })
        .unwrap_or_default();
    svg::render(&panels, &bl, &cl, &cand.clock)
}

/// Refreshes `<results>/COMPARE.md` with the newest comparison; `run_dir_name` is where the
/// run's own copy and its picture live, so the picture link keeps working from results/.
pub fn refresh_latest(
    results_root: &Path,
    markdown: &str,
    run_dir_name: &str,
) -> Result<(), ReportError> {
    let text = markdown.replace("](latency.svg)", &format!("]({run_dir_name}/latency.svg)"));
    let text = format!("{text}\n_Newest comparison, from `{run_dir_name}/COMPARE.md`._\n");
    write_atomic(&results_root.join("COMPARE.md"), text.as_bytes())
}

/// Appends `markdown` to the GitHub Actions job summary when running there.
pub fn append_step_summary(markdown: &str) {
    let Some(path) = std::env::var_os("GITHUB_STEP_SUMMARY") else {
        return;
    };
    let appended = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .and_then(|mut f| writeln!(f, "{markdown}"));
    if let Err(e) = appended {
        eprintln!(
            "warning: could not append to GITHUB_STEP_SUMMARY ({}): {e}",
            Path::new(&path).display()
        );
    }
}

pub fn write_junit(path: &Path, xml: &str) -> Result<(), ReportError> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|source| ReportError::Write {
            path: dir.to_path_buf(),
            source,
        })?;
    }
    write_atomic(path, xml.as_bytes())
}
