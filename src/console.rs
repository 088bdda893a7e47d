//! What the runner prints: one row per (shape, seed, variant), the variant-identity table,
//! and the summary. Formatting only; nothing here decides a verdict.

use crate::rows::RowSet;
use crate::schema::CorrectnessRecord;
use crate::schema::{GpuSlot, Measurement, ShapeComparison, VariantMeta};
use crate::shapes::Shape;
use crate::verdict::Verdict;

/// Writes `text` to stdout. A closed pipe (`| head`) stops the process as SIGPIPE would,
/// cleaning up first ([`crate::interrupt::broken_pipe`]); any other failure (a full disk
/// behind a redirect) is said once on stderr, and the run goes on without its printout.
pub fn emit(text: &str) {
    use std::io::Write;
    use std::sync::atomic::{AtomicBool, Ordering};
    static FAILED: AtomicBool = AtomicBool::new(false);
    if FAILED.load(Ordering::Relaxed) {
        return;
    }
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            crate::interrupt::broken_pipe();
        }
        FAILED.store(true, Ordering::Relaxed);
        let _ = writeln!(
            std::io::stderr(),
            "warning: cannot write to stdout ({e}); the run goes on and its files are written"
        );
    }
}

/// `println!` through [`emit`].
#[macro_export]
macro_rules! outln {
    () => {
        $crate::console::emit("\n")
    };
    ($($arg:tt)*) => {
        $crate::console::emit(&format!("{}\n", format_args!($($arg)*)))
    };
}

/// `print!` through [`emit`].
#[macro_export]
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::console::emit(&format!($($arg)*))
    };
}

/// Column widths of the shape and variant names, so rows line up.
#[derive(Debug, Clone, Copy)]
pub struct Widths {
    pub shape: usize,
    pub variant: usize,
}

impl Widths {
    pub fn of<'a>(
        shapes: impl Iterator<Item = &'a str>,
        variants: impl Iterator<Item = &'a str>,
    ) -> Self {
        Widths {
            shape: shapes.map(str::len).max().unwrap_or(0),
            variant: variants.map(str::len).max().unwrap_or(0).max(7),
        }
    }
}

/// The rows a sampled check holds to the references, e.g. `[ctx16k] seed=0 checking 18432 of
/// 262144 rows (7.0%), sampled: ...`.
pub fn rows_line(shape: &Shape, seed: u64, rows: &RowSet, w: &Widths) -> String {
    format!(
        "[{:<ws$}] seed={seed} checking {} of {} rows ({:.1}%), {}",
        shape.name,
        rows.count(),
        rows.total(),
        100.0 * rows.count() as f64 / rows.total().max(1) as f64,
        rows.rule(),
        ws = w.shape
    )
}

/// ` (GPU n)`, appended to a printed row when several workers share a run (`several`); empty
/// otherwise.
pub fn on_gpu(gpu: Option<&GpuSlot>, several: bool) -> String {
    match gpu {
        Some(g) if several => format!(" (GPU {})", g.index),
        _ => String::new(),
    }
}

/// One correctness row, e.g.
/// `[mission ] seed=0 cp1     max_err=1.2e-3 mean_err=1.1e-4 err/bound=0.21 e2e/bound=0.05 PASS`.
pub fn correctness_row(r: &CorrectnessRecord, w: &Widths) -> String {
    let k = &r.kernel_ref;
    let mut line = format!(
        "[{:<ws$}] seed={} {:<wv$} max_err={:.2e} mean_err={:.2e} err/bound={:.2} e2e/bound={:.2}",
        r.shape,
        r.seed,
        r.variant,
        k.max_abs_err,
        k.mean_abs_err,
        k.max_err_over_bound,
        r.end_to_end.max_err_over_bound,
        ws = w.shape,
        wv = w.variant
    );
    if k.unwritten > 0 {
        line.push_str(&format!(" unwritten={}", k.unwritten));
    }
    if k.nonfinite > 0 {
        line.push_str(&format!(" nonfinite={}", k.nonfinite));
    }
    if r.pass {
        line.push_str(" PASS");
    } else {
        let failed: Vec<String> = crate::verdict::failed(&r.gates)
            .map(|f| f.to_string())
            .collect();
        line.push_str(&format!(" FAIL ({})", failed.join("; ")));
    }
    line
}

/// `N/M PASS`, per variant when there are several.
pub fn summary(records: &[CorrectnessRecord]) -> String {
    let mut variants: Vec<&str> = Vec::new();
    for r in records {
        if !variants.contains(&r.variant.as_str()) {
            variants.push(&r.variant);
        }
    }
    let count = |v: Option<&str>| {
        let rows: Vec<_> = records
            .iter()
            .filter(|r| v.is_none_or(|v| r.variant == v))
            .collect();
        (rows.iter().filter(|r| r.pass).count(), rows.len())
    };
    let (pass, total) = count(None);
    let mut line = format!("{pass}/{total} PASS");
    if variants.len() > 1 {
        let parts: Vec<String> = variants
            .iter()
            .map(|v| {
                let (p, t) = count(Some(v));
                format!("{v} {p}/{t}")
            })
            .collect();
        line.push_str(&format!(" ({})", parts.join(", ")));
    }
    line
}

/// The timing table: one line per (shape, seed, variant), microseconds, and the rate at the
/// median over unmasked pairs ([`Measurement::tflops`]).
pub fn timing_table(measurements: &[Measurement], w: &Widths) -> String {
    let mut out = format!(
        "{:<ws$}  seed  {:<wv$}  {:>9} {:>9} {:>9} {:>8} {:>9} {:>9} {:>7}\n",
        "shape",
        "variant",
        "p50",
        "p90",
        "mean",
        "std",
        "min",
        "max",
        "TFLOP/s",
        ws = w.shape + 2,
        wv = w.variant
    );
    for m in measurements {
        let s = &m.summary;
        out.push_str(&format!(
            "{:<ws$}  {:>4}  {:<wv$}  {:>9.2} {:>9.2} {:>9.2} {:>8.2} {:>9.2} {:>9.2} {:>7.1}\n",
            format!("[{}]", m.shape),
            m.seed,
            m.variant,
            s.p50,
            s.p90,
            s.mean,
            s.std,
            s.min,
            s.max,
            m.tflops(),
            ws = w.shape + 2,
            wv = w.variant
        ));
    }
    out
}

/// One verdict line per shape, e.g.
/// `[mission ] cp1 vs cp0: speedup +3.10% [+2.80%, +3.40%] p=1.9e-6 FASTER`.
pub fn verdict_lines(cmps: &[ShapeComparison], w: &Widths) -> String {
    cmps.iter()
        .map(|c| {
            format!(
                "[{:<ws$}] {} vs {}: speedup {:+.2}% [{:+.2}%, {:+.2}%] p={:.1e} {} (noise floor ±{:.2}%, detects ±{:.2}%){}\n",
                c.shape,
                c.candidate,
                c.baseline,
                c.speedup_pct,
                c.speedup_ci_pct[0],
                c.speedup_ci_pct[1],
                c.estimate.p_value,
                c.verdict,
                c.noise_floor_pct,
                c.mde_pct(),
                match (c.same_machine_code, c.false_verdict()) {
                    (Some(true), true) => ", same machine code: a false verdict",
                    (Some(true), false) => ", same machine code",
                    _ => "",
                },
                ws = w.shape
            )
        })
        .collect()
}

/// The variant-identity and resource table printed before a GPU run.
pub fn identity_table(ids: &[VariantMeta], verdicts: &[(String, Verdict)]) -> String {
    let dw = ids
        .iter()
        .map(|id| id.defines.join(" ").len())
        .max()
        .unwrap_or(0)
        .max(7);
    let nw = ids.iter().map(|id| id.name.len()).max().unwrap_or(0).max(7);
    let mut out = format!(
        "{:<nw$}  {:<dw$}  cp.async  PTX sha256    regs  smem B  spill B  blocks/SM  resources\n",
        "variant", "defines"
    );
    for id in ids {
        let verdict = verdicts.iter().find(|(n, _)| *n == id.name).map(|(_, v)| v);
        let status = match verdict {
            Some(v) if v.pass() => "PASS".to_string(),
            Some(v) => format!("FAIL ({})", v.failures().join("; ")),
            None => "-".into(),
        };
        let opt = |x: Option<u32>| x.map_or("-".to_string(), |v| v.to_string());
        out.push_str(&format!(
            "{:<nw$}  {:<dw$}  {:<9} {:<13} {:<5} {:<7} {:<8} {:<10} {}\n",
            id.name,
            id.defines.join(" "),
            match id.ptx_has_cp_async {
                Some(true) => "yes",
                Some(false) => "no",
                None => "-",
            },
            id.ptx_sha256
                .as_deref()
                .map_or("-", |h| &h[..12.min(h.len())]),
            opt(id.registers),
            opt(id.smem_bytes),
            opt(id.spill_bytes),
            opt(id.blocks_per_sm),
            status
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::schema::fixtures::record;

    #[test]
    fn rows_say_pass_or_name_the_failed_gate() {
        let w = Widths {
            shape: 8,
            variant: 7,
        };
        let row = correctness_row(&record("cpu-emu", true), &w);
        assert!(
            row.starts_with("[mission ] seed=0 cpu-emu") && row.ends_with("PASS"),
            "{row}"
        );
        let fail = correctness_row(&record("cp1", false), &w);
        assert!(fail.contains("FAIL (kernel.max_abs_err"), "{fail}");
    }

    #[test]
    fn summary_counts_per_variant() {
        let rs = [
            record("cp0", true),
            record("cp1", false),
            record("cp0", true),
            record("cp1", true),
        ];
        assert_eq!(summary(&rs), "3/4 PASS (cp0 2/2, cp1 1/2)");
        assert_eq!(summary(&rs[..1]), "1/1 PASS");
    }

    #[test]
    fn a_verdict_line_says_when_both_sides_ran_the_same_machine_code() {
        let w = Widths {
            shape: 8,
            variant: 7,
        };
        let estimate = crate::stats::paired_ratio(&[1.0; 20], &[1.05; 20], 0.95);
        let mut c = ShapeComparison::new(
            "mission",
            vec![0],
            ("base-cp0", "cp0"),
            (&[1.0], &[1.05]),
            estimate,
            1.0,
        );
        let line = |c: &ShapeComparison| verdict_lines(std::slice::from_ref(c), &w);
        assert!(!line(&c).contains("machine code"), "{}", line(&c));
        c.same_machine_code = Some(true);
        assert!(
            line(&c).contains("SLOWER")
                && line(&c).ends_with("same machine code: a false verdict\n"),
            "{}",
            line(&c)
        );
        c.same_machine_code = Some(false);
        assert!(!line(&c).contains("machine code"), "{}", line(&c));
    }
}
