//! `sdpa-runner calibrate RUN...`: summarizes measured errors of saved runs per shape and
//! variant, and proposes correctness thresholds as the largest measured value times a stated
//! margin. Gates are set from this table (and it goes into the README), never from a guess.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::cli::CalibrateArgs;
use crate::error::{AppError, Outcome};
use crate::schema::{CorrectnessFile, CorrectnessRecord};
use crate::usage::ConfigError;

/// The largest value of each metric over a group of records.
#[derive(Debug, Default, Clone, Copy)]
struct Worst {
    rows: usize,
    k_max: f64,
    k_mean: f64,
    k_bad: f64,
    e_max: f64,
    e_mean: f64,
    e_bad: f64,
    emu_max: f64,
    emu_mean: f64,
    /// Largest kernel/emulation ratio of max_abs_err.
    ratio_max: f64,
    ratio_mean: f64,
    /// Smallest percentage of output bits equal to the emulation's.
    min_bits_equal: f64,
}

impl Worst {
    fn add(&mut self, r: &CorrectnessRecord) {
        let ratio = |a: f64, b: f64| {
            if b > 0.0 {
                a / b
            } else if a > 0.0 {
                f64::INFINITY
            } else {
                0.0
            }
        };
        self.min_bits_equal = if self.rows == 0 {
            r.emulation_bits_equal_pct
        } else {
            self.min_bits_equal.min(r.emulation_bits_equal_pct)
        };
        self.rows += 1;
        self.k_max = self.k_max.max(r.kernel_ref.max_abs_err);
        self.k_mean = self.k_mean.max(r.kernel_ref.mean_abs_err);
        self.k_bad = self.k_bad.max(r.kernel_ref.pct_bad);
        self.e_max = self.e_max.max(r.end_to_end.max_abs_err);
        self.e_mean = self.e_mean.max(r.end_to_end.mean_abs_err);
        self.e_bad = self.e_bad.max(r.end_to_end.pct_bad);
        self.emu_max = self.emu_max.max(r.emulation_ref.max_abs_err);
        self.emu_mean = self.emu_mean.max(r.emulation_ref.mean_abs_err);
        self.ratio_max = self
            .ratio_max
            .max(ratio(r.kernel_ref.max_abs_err, r.emulation_ref.max_abs_err));
        self.ratio_mean = self.ratio_mean.max(ratio(
            r.kernel_ref.mean_abs_err,
            r.emulation_ref.mean_abs_err,
        ));
    }
}

pub fn calibrate(args: &CalibrateArgs) -> Result<Outcome, AppError> {
    let mut groups: BTreeMap<(String, String), Worst> = BTreeMap::new();
    let mut all = Worst::default();
    let mut backends = Vec::new();
    let mut degenerate = Vec::new();
    for run in &args.runs {
        let file = read_correctness(run)?;
        if !backends.contains(&file.backend) {
            backends.push(file.backend.clone());
        }
        for r in &file.results {
            if r.kernel_ref.nonfinite > 0 || r.kernel_ref.unwritten > 0 {
                degenerate.push(format!(
                    "{} seed {} {} in {}",
                    r.shape,
                    r.seed,
                    r.variant,
                    run.display()
                ));
                continue;
            }
            groups
                .entry((r.shape.clone(), r.variant.clone()))
                .or_default()
                .add(r);
            all.add(r);
        }
    }
    if !degenerate.is_empty() {
        eprintln!(
            "warning: {} row(s) left out: their outputs hold non-finite or unwritten elements, so \
             their errors say nothing about limits (first: {})",
            degenerate.len(),
            degenerate[0]
        );
    }
    if all.rows == 0 {
        return Err(ConfigError::Usage(
            "no row with a complete, finite output to calibrate from; fix the kernel first".into(),
        )
        .into());
    }
    crate::outln!(
        "measured on backend(s) {}; worst over seeds; errors against the f64 references",
        backends.join(", ")
    );
    crate::outln!(
        "| shape | variant | rows | kernel max | kernel mean | kernel %bad | e2e max | e2e mean | e2e %bad | emu max | emu mean | kernel/emu max | kernel/emu mean | % bits = emu |"
    );
    crate::outln!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    let line = |shape: &str, variant: &str, w: &Worst| {
        crate::outln!(
            "| {shape} | {variant} | {} | {:.2e} | {:.2e} | {:.3} | {:.2e} | {:.2e} | {:.3} | {:.2e} | {:.2e} | {:.2} | {:.2} | {:.3} |",
            w.rows,
            w.k_max,
            w.k_mean,
            w.k_bad,
            w.e_max,
            w.e_mean,
            w.e_bad,
            w.emu_max,
            w.emu_mean,
            w.ratio_max,
            w.ratio_mean,
            w.min_bits_equal
        )
    };
    for ((shape, variant), w) in &groups {
        line(shape, variant, w);
    }
    line("**all**", "", &all);
    let m = args.margin;
    crate::outln!("\nproposed thresholds (worst measured x margin {m}):");
    crate::outln!(
        "  correctness.kernel.max_abs_err      {:.3e}",
        all.k_max * m
    );
    crate::outln!(
        "  correctness.kernel.mean_abs_err     {:.3e}",
        all.k_mean * m
    );
    crate::outln!(
        "  correctness.end_to_end.max_abs_err  {:.3e}",
        all.e_max * m
    );
    crate::outln!(
        "  correctness.end_to_end.mean_abs_err {:.3e}",
        all.e_mean * m
    );
    crate::outln!("  correctness.end_to_end.pct_bad      {:.3}", all.e_bad * m);
    crate::outln!(
        "  relative gate factor 2 holds with margin {:.2} (max) and {:.2} (mean)",
        2.0 / all.ratio_max.max(f64::MIN_POSITIVE),
        2.0 / all.ratio_mean.max(f64::MIN_POSITIVE)
    );
    Ok(Outcome::Pass)
}

fn read_correctness(run: &Path) -> Result<CorrectnessFile, ConfigError> {
    let path: PathBuf = if run.is_dir() {
        run.join("correctness.json")
    } else {
        run.to_path_buf()
    };
    if path.extension().is_none_or(|e| e != "json") {
        return Err(ConfigError::Usage(format!(
            "{}: not a run directory or a correctness.json file",
            run.display()
        )));
    }
    crate::json::read_file(&path)
}
