//! COMPARE.md of `sdpa-runner check`: per problem, every implementation's grade side by side.
//! Formats what src/grade.rs decided.

use std::fmt::Write;
use std::path::Path;

use crate::gates::CorrectnessGates;
use crate::grade::{CheckedProblem, Grade};

/// `fp8_chain`: `check --fp8-chain`, the FP22 sums FP8 implementations were held to.
pub fn markdown(
    dir: &Path,
    problems: &[CheckedProblem],
    gates: &CorrectnessGates,
    fp8_chain: Option<usize>,
) -> String {
    let mut t = String::new();
    let _ = writeln!(t, "# Implementations graded on {}\n", dir.display());
    let _ = writeln!(
        t,
        "Each output is held to the f64 reference on the inputs as it read them (kernel) and \
         on the original f32 inputs (end to end), element by element against the error model \
         of its precision and output format (docs/DESIGN.md \"Grading other \
         implementations\"); PASS needs the kernel and end-to-end max error over bound at most {} and {}, and no NaN or Inf. \
         RMSE is against the end-to-end reference. Worst row: `[b, h, s]` of the largest error \
         over its bound.\n",
        gates.kernel.max_err_over_bound, gates.end_to_end.max_err_over_bound
    );
    if let Some(c) = fp8_chain {
        let _ = writeln!(
            t,
            "FP8 implementations are held to FP8 tensor-core (FP22) sums of at most {c} keys of \
             P·V, each added to O in f32 (`--fp8-chain {c}`); without it, to a sum over every \
             key of the row.\n"
        );
    }
    for c in problems {
        let p = &c.problem;
        let _ = writeln!(
            t,
            "## {} ({}: B {} Hq {} Hkv {} Sq {} Sk {} D {}{}, {}, seed {})\n",
            p.id,
            p.shape,
            p.b,
            p.hq,
            p.hkv,
            p.sq,
            p.sk,
            p.d,
            if p.causal { ", causal" } else { "" },
            p.distribution.name(),
            p.seed
        );
        let _ = writeln!(t, "Rows checked: {} ({}).\n", c.rows_checked, c.row_rule);
        let _ = writeln!(
            t,
            "| implementation | read | output | verdict | err/bound kernel | err/bound end to end | RMSE | max abs err | worst row | p50 µs |"
        );
        let _ = writeln!(t, "|---|---|---|---|---|---|---|---|---|---|");
        for g in &c.grades {
            let _ = writeln!(t, "{}", row(g));
        }
        for g in c.grades.iter().filter(|g| g.zeros_would_pass) {
            let _ = writeln!(
                t,
                "\n- **{}**: NOT DISCRIMINATING: an all-zero output would pass the same gates here \
                 (the {} model's bound is wider than the output on this problem); its PASS says little",
                cell(&g.implementation),
                g.precision.name()
            );
        }
        let faults: Vec<&Grade> = c.grades.iter().filter(|g| !g.pass).collect();
        if !faults.is_empty() {
            t.push('\n');
            for g in faults {
                let _ = writeln!(
                    t,
                    "- **{}**: {}",
                    cell(&g.implementation),
                    cell(&g.failures.join("; "))
                );
            }
        }
        t.push('\n');
    }
    t
}

/// Text from outside (an implementation's name or note) made one Markdown table cell: `\` and
/// `|` escaped, line breaks and other control characters made spaces.
fn cell(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect::<String>()
        .replace('\\', "\\\\")
        .replace('|', "\\|")
}

fn row(g: &Grade) -> String {
    let metric = |m: &Option<crate::metrics::ErrorMetrics>,
                  f: fn(&crate::metrics::ErrorMetrics) -> String| {
        m.as_ref().map_or("-".to_string(), f)
    };
    format!(
        "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
        cell(&g.implementation),
        g.precision.name(),
        g.output.as_deref().unwrap_or("-"),
        match (g.pass, g.zeros_would_pass) {
            (false, _) => "**FAIL**",
            (true, true) => "PASS (zeros would too)",
            (true, false) => "PASS",
        },
        metric(&g.kernel, |m| format!("{:.3}", m.max_err_over_bound)),
        metric(&g.end_to_end, |m| format!("{:.3}", m.max_err_over_bound)),
        metric(&g.end_to_end, |m| format!("{:.2e}", m.rmse)),
        metric(&g.end_to_end, |m| format!("{:.2e}", m.max_abs_err)),
        g.worst_row
            .map_or("-".to_string(), |[b, h, s]| format!("[{b}, {h}, {s}]")),
        g.p50_us.map_or("-".to_string(), |t| format!("{t:.1}")),
    )
}

#[cfg(test)]
mod tests {
    use super::cell;

    #[test]
    fn outside_text_stays_inside_its_table_cell() {
        assert_eq!(
            cell("torch|flash\n## injected"),
            "torch\\|flash ## injected"
        );
        assert_eq!(cell("cudnn-fp8 (9.19)"), "cudnn-fp8 (9.19)");
        assert_eq!(cell("a\\|b"), "a\\\\\\|b");
    }
}
