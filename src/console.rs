//! What the runner prints: one row per (shape, seed, variant), the variant-identity table,
//! and the summary. Formatting only; nothing here decides a verdict.

use crate::backend::cuda::identity::VariantIdentity;
use crate::report::CorrectnessRecord;
use crate::verdict::Verdict;

/// One correctness row, e.g.
/// `[mission ] seed=0 cp1     max_err=1.2e-3 mean_err=1.1e-4 %bad=0.000 e2e_max=3.1e-2 PASS`.
pub fn correctness_row(r: &CorrectnessRecord, name_width: usize) -> String {
    let k = &r.kernel_ref;
    let mut line = format!(
        "[{:<w$}] seed={} {:<7} max_err={:.2e} mean_err={:.2e} %bad={:.3} e2e_max={:.2e}",
        r.shape,
        r.seed,
        r.variant,
        k.max_abs_err,
        k.mean_abs_err,
        k.pct_bad,
        r.end_to_end.max_abs_err,
        w = name_width
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
        let failed: Vec<String> = r
            .gates
            .iter()
            .filter(|(_, c)| !c.pass)
            .map(|(n, c)| format!("{n} {:.3e} > {:.3e}", c.value, c.limit))
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

/// The variant-identity and resource table printed before a GPU run.
pub fn identity_table(ids: &[&VariantIdentity], verdicts: &[(String, Verdict)]) -> String {
    let mut out = String::from(
        "variant  defines                  cp.async  PTX sha256    regs  smem B  spill B  blocks/SM  resources\n",
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
            "{:<8} {:<24} {:<9} {:<13} {:<5} {:<7} {:<8} {:<10} {}\n",
            id.name,
            id.defines.join(" "),
            if id.ptx_has_cp_async { "yes" } else { "no" },
            &id.ptx_sha256[..12.min(id.ptx_sha256.len())],
            opt(id.registers()),
            id.smem_bytes(),
            opt(id.ptxas.spill_bytes()),
            opt(id.driver.as_ref().map(|d| d.max_blocks_per_sm)),
            status
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::ErrorMetrics;
    use crate::verdict::Check;

    fn record(variant: &str, pass: bool) -> CorrectnessRecord {
        let m = ErrorMetrics {
            max_abs_err: 1e-3,
            mean_abs_err: 1e-4,
            rmse: 1e-4,
            pct_bad: 0.0,
            nonfinite: 0,
            unwritten: 0,
            elements: 10,
            worst_at: None,
        };
        let mut gates = std::collections::BTreeMap::new();
        gates.insert(
            "kernel.max_abs_err".to_string(),
            if pass {
                Check::at_most(1e-3, 1e-2)
            } else {
                Check::at_most(1e-1, 1e-2)
            },
        );
        CorrectnessRecord {
            shape: "mission".into(),
            b: 1,
            h: 8,
            s: 512,
            d: 64,
            seed: 0,
            variant: variant.into(),
            backend: "cpu".into(),
            input_checksum: String::new(),
            output_checksum: String::new(),
            kernel_ref: m.clone(),
            end_to_end: m.clone(),
            emulation_ref: m,
            emulation_bits_equal_pct: 100.0,
            gates,
            pass,
        }
    }

    #[test]
    fn rows_say_pass_or_name_the_failed_gate() {
        assert!(
            correctness_row(&record("cpu-emu", true), 8).starts_with("[mission ] seed=0 cpu-emu")
        );
        assert!(correctness_row(&record("cpu-emu", true), 8).ends_with("PASS"));
        let fail = correctness_row(&record("cp1", false), 8);
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
}
