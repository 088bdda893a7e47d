//! `sdpa-runner calibrate RUN...`: checks the error model against saved runs. For every gate
//! with a limit, the worst measured value over its limit (the bound of src/reference/bound.rs,
//! or the relative gate's 2 x emulation + 1 ulp), per shape and variant; a gate whose worst
//! row leaves less than the stated margin (value over limit above 1 / margin) is warned about.
//! Limits come from the model, never from this table: a warning means the model needs a look.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::cli::CalibrateArgs;
use crate::error::{AppError, Outcome};
use crate::schema::{CorrectnessFile, CorrectnessRecord};
use crate::usage::ConfigError;

/// The gates shown as columns, in order.
const COLUMNS: [&str; 5] = [
    "kernel.max_err_over_bound",
    "end_to_end.max_err_over_bound",
    "relative.max_abs_err",
    "relative.mean_abs_err",
    "emulation.scale",
];

/// The worst value over limit of each gate over a group of records.
#[derive(Debug, Default, Clone)]
struct Worst {
    rows: usize,
    used: BTreeMap<String, f64>,
    /// The emulation's own error over the kernel bound (the model checked on the CPU).
    emulation: f64,
    min_bits_equal: f64,
    /// The largest f16-ulp distance from the emulation (records that give it).
    max_ulps: Option<u32>,
    /// Records written before the distance was recorded.
    ulps_unrecorded: usize,
}

impl Worst {
    fn add(&mut self, r: &CorrectnessRecord) {
        self.min_bits_equal = if self.rows == 0 {
            r.emulation_bits_equal_pct
        } else {
            self.min_bits_equal.min(r.emulation_bits_equal_pct)
        };
        self.rows += 1;
        self.max_ulps = self.max_ulps.max(r.emulation_max_ulps);
        self.ulps_unrecorded += usize::from(r.emulation_max_ulps.is_none());
        for (gate, c) in &r.gates {
            if c.rule == "<=" && c.limit > 0.0 {
                let u = self.used.entry(gate.clone()).or_insert(0.0);
                *u = u.max(c.value / c.limit);
            }
        }
        self.emulation = self.emulation.max(r.emulation_ref.max_err_over_bound);
    }

    fn get(&self, gate: &str) -> f64 {
        self.used.get(gate).copied().unwrap_or(f64::NAN)
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
             their errors say nothing about the model (first: {})",
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
        "measured on backend(s) {}; worst over seeds of measured / limit (1 = at the limit)",
        backends.join(", ")
    );
    crate::outln!(
        "| shape | variant | rows | kernel err/bound | e2e err/bound | relative max | relative mean | scale | emulation err/bound | % bits = emu | max ulps from emu |"
    );
    crate::outln!("|---|---|---|---|---|---|---|---|---|---|---|");
    let line = |shape: &str, variant: &str, w: &Worst| {
        // "-": no record of the group has the gate (runs before it, outputs of one row).
        let cols: Vec<String> = COLUMNS
            .iter()
            .map(|g| match w.get(g) {
                x if x.is_nan() => "-".to_string(),
                x => format!("{x:.3}"),
            })
            .collect();
        let ulps = match (w.max_ulps, w.ulps_unrecorded) {
            (None, _) => "-".to_string(),
            (Some(u32::MAX), _) => "non-finite".to_string(),
            (Some(u), 0) => u.to_string(),
            (Some(u), n) => format!("{u} ({n} of {} rows unrecorded)", w.rows),
        };
        crate::outln!(
            "| {shape} | {variant} | {} | {} | {:.3} | {:.3} | {ulps} |",
            w.rows,
            cols.join(" | "),
            w.emulation,
            w.min_bits_equal
        );
    };
    for ((shape, variant), w) in &groups {
        line(shape, variant, w);
    }
    line("**all**", "", &all);
    let m = args.margin;
    crate::outln!("\nmargins (limit / worst measured; wanted at least {m}):");
    let mut short = 0;
    for (gate, used) in &all.used {
        let margin = 1.0 / used.max(f64::MIN_POSITIVE);
        let at = groups
            .iter()
            .find(|(_, w)| w.get(gate) == *used)
            .map(|((shape, variant), _)| format!(" (worst: {shape} {variant})"))
            .unwrap_or_default();
        let note = if margin < m {
            short += 1;
            "  <- less than the stated margin: check the error model"
        } else {
            ""
        };
        crate::outln!("  {gate:<32} {margin:>8.2}{at}{note}");
    }
    if short > 0 {
        eprintln!(
            "warning: {short} gate(s) with less than a margin of {m}: look at the worst row named \
             above. Where the bound is exact by construction (the end-to-end bound at S = 1, whose \
             output is V's rounding itself) this is expected; elsewhere the model \
             (src/reference/bound.rs; for emulation.scale, what the emulation leaves \
             unmodelled: src/scale_fit.rs) is too tight"
        );
    }
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
    crate::schema::read_versioned(&path)
}
