//! COMPARE.md: what was compared, on what, how; per shape the timings side by side with the
//! speedup, its interval, the p-value and the verdict; correctness; and the outcome that
//! [`crate::analysis`] decided. Formatting only.

use std::fmt::Write;

use crate::analysis::{Decision, TargetStatus};
use crate::gates::PerformanceGates;
use crate::schema::{BASE_PREFIX, PerfFile, ShapeComparison, VariantMeta};

/// One side of a comparison.
pub struct Side<'a> {
    /// Where it came from: "this run" or a run directory.
    pub run: String,
    pub perf: &'a PerfFile,
    pub variant: &'a VariantMeta,
    /// (passing, total) correctness rows, if known.
    pub correctness: Option<(usize, usize)>,
}

pub struct CompareDoc<'a> {
    /// "paired: ..." or "unpaired: ...".
    pub design: &'a str,
    pub base: Side<'a>,
    pub cand: Side<'a>,
    /// Further variants of the same run, shown beside them (the base kernel's, with
    /// `--base-kernel`).
    pub others: Vec<Side<'a>>,
    pub comparisons: &'a [ShapeComparison],
    pub gates: &'a PerformanceGates,
    pub decision: &'a Decision,
    /// Whether the decision's failures set the exit code (`compare --gate`, a run).
    pub gate_enforced: bool,
    pub warnings: &'a [String],
    /// Where each noise floor came from, one line each (`compare`'s measured floors).
    pub notes: &'a [String],
    /// Relative link to the latency picture, if one was written.
    pub svg: Option<&'a str>,
}

pub fn render(doc: &CompareDoc) -> String {
    let mut s = String::new();
    let (b, c) = (&doc.base, &doc.cand);
    let sides: Vec<&Side> = [b, c].into_iter().chain(&doc.others).collect();
    let against_base = sides.iter().any(|side| side.variant.is_base());
    let _ = if against_base {
        writeln!(s, "# COMPARE: the kernel under test vs the base kernel\n")
    } else {
        writeln!(
            s,
            "# COMPARE: {} (candidate) vs {} (baseline)\n",
            c.variant.name, b.variant.name
        )
    };
    for w in doc.warnings {
        let _ = writeln!(s, "> **WARNING:** {w}\n");
    }
    header(&mut s, doc);
    for n in doc.notes {
        let _ = writeln!(s, "- {n}");
    }
    if !doc.notes.is_empty() {
        s.push('\n');
    }
    if against_base {
        kernels(&mut s, &sides);
    } else if let Some(line) = same_code_line(b.variant, c.variant) {
        let _ = writeln!(s, "{line}\n");
    }
    variants(&mut s, &sides);
    timings(&mut s, doc);
    let _ = writeln!(s, "\n## Correctness\n");
    for side in &sides {
        let role = if side.variant.is_base() {
            "base kernel"
        } else if std::ptr::eq(*side, b) && !against_base {
            "baseline"
        } else {
            "candidate"
        };
        let status = match side.correctness {
            Some((p, t)) => format!("{p}/{t} PASS{}", if p == t { "" } else { " — FAILURES" }),
            None => "not recorded with this run".into(),
        };
        let _ = writeln!(s, "- {role} {}: {status}", side.variant.name);
    }
    verdicts(&mut s, doc);
    s
}

/// The two kernel sources, and whether each variant's code is the same in both.
fn kernels(s: &mut String, sides: &[&Side]) {
    let _ = writeln!(s, "\n## Kernels\n");
    let _ = writeln!(s, "| role | source | sha256 |\n|---|---|---|");
    let mut seen = Vec::new();
    for side in sides {
        if let Some(k) = &side.variant.kernel
            && !seen.contains(&k)
        {
            seen.push(k);
            let role = if side.variant.is_base() {
                "base"
            } else {
                "under test"
            };
            let _ = writeln!(
                s,
                "| {role} | `{}` | `{}` |",
                k.source,
                &k.sha256[..12.min(k.sha256.len())]
            );
        }
    }
    let metas: Vec<VariantMeta> = sides.iter().map(|side| side.variant.clone()).collect();
    let twins = code_against_base(&metas);
    if !twins.is_empty() && twins.iter().all(|(_, d)| d.is_empty()) {
        let _ = writeln!(
            s,
            "\n**SAME CODE: the kernel under test compiles to the same code as the base kernel** \
             (the same source texts, defines and options, every variant, wherever the files \
             lie): this change does not touch the kernel, and a verdict other than SAME against \
             the base would be noise."
        );
    } else {
        for (name, differences) in twins {
            let _ = writeln!(
                s,
                "\n- `{name}`: {}",
                if differences.is_empty() {
                    "same code as the base".to_string()
                } else {
                    format!("the code differs from the base: {}", differences.join("; "))
                }
            );
        }
    }
}

/// For each variant of the kernel under test with a twin from the base kernel: what differs
/// between the two, in words (empty: the same code), by content (source texts, defines,
/// options: src/backend/cuda/code.rs) where both runs recorded it, else by the PTX without
/// line information; unknown counts as differing.
pub fn code_against_base(variants: &[VariantMeta]) -> Vec<(String, Vec<String>)> {
    variants
        .iter()
        .filter(|v| !v.is_base())
        .filter_map(|v| {
            let twin = variants
                .iter()
                .find(|b| b.is_base() && b.name == format!("{BASE_PREFIX}{}", v.name))?;
            let differences = match (&v.code, &twin.code) {
                (Some(ours), Some(base)) if ours.sha256 == base.sha256 => Vec::new(),
                (Some(ours), Some(base)) => {
                    let named = ours.differences(base);
                    if named.is_empty() {
                        vec!["the code identity differs".to_string()]
                    } else {
                        named
                    }
                }
                _ if v.ptx_code_sha256.is_some() && v.ptx_code_sha256 == twin.ptx_code_sha256 => {
                    Vec::new()
                }
                _ => vec!["the PTX differs (no code identity recorded)".to_string()],
            };
            Some((v.name.clone(), differences))
        })
        .collect()
}

/// `compare` of two saved runs: whether the two variants are the same code by content
/// (both runs recorded it), and what differs if not.
fn same_code_line(base: &VariantMeta, cand: &VariantMeta) -> Option<String> {
    let (b, c) = (base.code.as_ref()?, cand.code.as_ref()?);
    Some(if b.sha256 == c.sha256 {
        "**SAME CODE**: both runs compiled the same source texts, defines and options, wherever \
         their files lay; a verdict other than SAME is noise."
            .to_string()
    } else {
        let named = c.differences(b);
        format!(
            "The code differs: {}.",
            if named.is_empty() {
                "the code identity".to_string()
            } else {
                named.join("; ")
            }
        )
    })
}

fn header(s: &mut String, doc: &CompareDoc) {
    let (b, c) = (doc.base.perf, doc.cand.perf);
    let d = &b.device;
    let same_run = doc.base.run == doc.cand.run;
    let _ = writeln!(s, "| | |\n|---|---|");
    let _ = writeln!(
        s,
        "| device | {}{} |",
        b.device_name,
        d["compute_capability"]
            .as_str()
            .map_or(String::new(), |cc| format!(
                " (compute {cc}, {} SMs)",
                d["sm_count"]
            ))
    );
    if let Some(drv) = d["driver_cuda_version"].as_str() {
        let _ = writeln!(
            s,
            "| driver CUDA / NVRTC | {drv} / {} |",
            d["nvrtc_version"].as_str().unwrap_or("?")
        );
    }
    let git = |f: &PerfFile| {
        format!(
            "{}{}",
            &f.git.sha[..f.git.sha.len().min(12)],
            if f.git.dirty { " (dirty)" } else { "" }
        )
    };
    let _ = if same_run {
        writeln!(s, "| git | {} |", git(b))
    } else {
        writeln!(s, "| git | baseline {}, candidate {} |", git(b), git(c))
    };
    let _ = if same_run {
        writeln!(s, "| date | {} |", b.started_at)
    } else {
        writeln!(
            s,
            "| date | baseline {}, candidate {} |",
            b.started_at, c.started_at
        )
    };
    let p = &c.plan;
    let _ = writeln!(
        s,
        "| timing | {} warm-up, {} samples in {}, {} launch{} per sample, L2 {}; {} |",
        p.warmup,
        p.iters,
        c.rounds_text(),
        p.batch,
        if p.batch == 1 { "" } else { "es" },
        serde_json::to_value(p.l2)
            .ok()
            .and_then(|v| v.as_str().map(String::from))
            .unwrap_or_default(),
        c.clock
    );
    let _ = writeln!(
        s,
        "| clocks | before {}; after {} |",
        b.clocks_before.brief(),
        c.clocks_after.brief()
    );
    let _ = writeln!(s, "| design | {} |", doc.design);
    if !same_run {
        let _ = writeln!(
            s,
            "| runs | baseline {}, candidate {} |",
            doc.base.run, doc.cand.run
        );
    }
}

fn variants(s: &mut String, sides: &[&Side]) {
    let opt = |x: Option<u32>| x.map_or("-".to_string(), |v| v.to_string());
    let _ = writeln!(s, "\n## Variants\n");
    let row = |label: &str, cell: &dyn Fn(&VariantMeta) -> String| {
        let cells: Vec<String> = sides.iter().map(|side| cell(side.variant)).collect();
        format!("| {label} | {} |\n", cells.join(" | "))
    };
    let heads: Vec<String> = sides
        .iter()
        .enumerate()
        .map(|(i, side)| {
            let role = match (side.variant.is_base(), i) {
                (true, _) => "base kernel",
                (false, 0) if sides.len() == 2 => "baseline",
                _ => "candidate",
            };
            format!("{role} `{}`", side.variant.name)
        })
        .collect();
    let _ = writeln!(
        s,
        "| | {} |\n|---|{}",
        heads.join(" | "),
        "---|".repeat(sides.len())
    );
    s.push_str(&row("defines", &|v| v.defines.join(" ")));
    let hash = |h: &Option<String>| {
        h.as_deref()
            .map_or("-".to_string(), |h| format!("`{}`", &h[..12.min(h.len())]))
    };
    s.push_str(&row("PTX sha256", &|v| hash(&v.ptx_sha256)));
    if sides
        .iter()
        .any(|side| side.variant.ptx_code_sha256.is_some())
    {
        s.push_str(&row("code sha256 (no line info)", &|v| {
            hash(&v.ptx_code_sha256)
        }));
    }
    if sides.iter().any(|side| side.variant.code.is_some()) {
        s.push_str(&row("code identity (sources, defines, options)", &|v| {
            hash(&v.code.as_ref().map(|c| c.sha256.clone()))
        }));
    }
    type Field = fn(&VariantMeta) -> Option<u32>;
    let rows: [(&str, Field); 4] = [
        ("registers / thread", |v| v.registers),
        ("shared memory, bytes", |v| v.smem_bytes),
        ("spills, bytes", |v| v.spill_bytes),
        ("blocks / SM", |v| v.blocks_per_sm),
    ];
    for (label, field) in rows {
        s.push_str(&row(label, &|v| opt(field(v))));
    }
}

fn timings(s: &mut String, doc: &CompareDoc) {
    let conf = doc
        .comparisons
        .first()
        .map_or(95.0, |c| c.estimate.confidence * 100.0);
    let mut pairs: Vec<(&str, &str)> = Vec::new();
    for c in doc.comparisons {
        if !pairs.contains(&(&c.candidate, &c.baseline)) {
            pairs.push((&c.candidate, &c.baseline));
        }
    }
    let show_pair = pairs.len() > 1;
    let show_rounds = doc.comparisons.iter().any(|c| c.rounds_total > 0);
    let show_code = doc
        .comparisons
        .iter()
        .any(|c| c.same_machine_code.is_some());
    let _ = writeln!(s, "\n## Timing, µs per launch\n");
    let mut head = String::from("| shape |");
    if show_pair {
        head.push_str(" candidate vs baseline |");
    }
    head.push_str(" seeds |");
    if show_rounds {
        head.push_str(" rounds |");
    }
    if show_code {
        head.push_str(" code |");
    }
    head.push_str(&format!(
        " p50 base | p50 cand | p90 base | p90 cand | mean base | mean cand | speedup | {conf:.0}% CI | p | floor | detects | verdict |"
    ));
    let columns = head.matches('|').count() - 1;
    let _ = writeln!(s, "{head}\n|{}", "---|".repeat(columns));
    for c in doc.comparisons {
        let (bs, cs) = (&c.baseline_summary, &c.candidate_summary);
        let mut row = format!("| {} |", c.shape);
        if show_pair {
            row.push_str(&format!(" {} vs {} |", c.candidate, c.baseline));
        }
        row.push_str(&format!(" {} |", c.seeds.len()));
        if show_rounds {
            row.push_str(&format!(" {}/{} |", c.estimate.n, c.rounds_total));
        }
        if show_code {
            row.push_str(match c.same_machine_code {
                Some(true) => " same |",
                Some(false) => " differs |",
                None => " ? |",
            });
        }
        let _ = writeln!(
            s,
            "{row} {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:+.2}% | [{:+.2}%, {:+.2}%] | {:.1e} | ±{:.2}% | ±{:.2}% | **{}**{} |",
            bs.p50,
            cs.p50,
            bs.p90,
            cs.p90,
            bs.mean,
            cs.mean,
            c.speedup_pct,
            c.speedup_ci_pct[0],
            c.speedup_ci_pct[1],
            c.estimate.p_value,
            c.noise_floor_pct,
            c.mde_pct(),
            c.verdict,
            if c.false_verdict() {
                " (same code: noise)"
            } else {
                ""
            }
        );
    }
    if show_code {
        let same: Vec<&ShapeComparison> = doc
            .comparisons
            .iter()
            .filter(|c| c.same_machine_code == Some(true))
            .collect();
        let false_verdicts = same.iter().filter(|c| c.false_verdict()).count();
        let widest = same
            .iter()
            .map(|c| c.speedup_pct.abs())
            .fold(0.0f64, f64::max);
        let _ = writeln!(
            s,
            "\nCode: `same` where both sides launched the same machine code (every function \
             hashed: instructions, relocations, registers, attributes, callees, the module's \
             globals) in the same launches on the same inputs, seed by seed: an A/A by \
             construction, whatever else the change moved. {} of {} comparisons are such \
             controls{}; a verdict other than SAME on one is noise beyond its floor, which \
             neither fails the gate nor meets a target. `differs`: the change reached the \
             code or the launch; `?`: not recorded.",
            same.len(),
            doc.comparisons.len(),
            if same.is_empty() {
                String::new()
            } else {
                format!(" (largest |speedup| {widest:.2}%; {false_verdicts} read other than SAME)")
            }
        );
    }
    if show_rounds {
        let dropped: usize = doc
            .comparisons
            .iter()
            .filter(|c| !crate::perf::unsteady(c))
            .map(|c| c.rounds_dropped_for_clock)
            .sum();
        let _ = writeln!(
            s,
            "\nRounds: those used of those measured. A round is left out when its baseline's \
             block ran with its SM clock more than {:.1}% below the shape's median block clock \
             ({dropped} left out in all); when fewer than half would remain, all are used and \
             the verdict is flagged as unsteady.",
            doc.gates.clock_sag_pct
        );
    }
    let _ = writeln!(
        s,
        "\nSpeedup = baseline time / candidate time − 1 (median of {} ratios); a verdict other than SAME \
         needs the whole interval beyond the shape's noise floor and p < {:.2}.",
        if doc.design.starts_with("paired") {
            "per-round"
        } else {
            "round-median"
        },
        1.0 - doc.gates.confidence
    );
    if let Some(svg) = doc.svg {
        let _ = writeln!(s, "\n![latency distributions per shape]({svg})");
    }
}

fn verdicts(s: &mut String, doc: &CompareDoc) {
    let g = doc.gates;
    let _ = writeln!(s, "\n## Verdict\n");
    for (shape, status) in &doc.decision.targets {
        let text = match status {
            TargetStatus::Met => "**MET**".to_string(),
            TargetStatus::NotMet(why) => format!("**NOT MET**: {why}"),
            TargetStatus::NotMeasured => "not measured in this run".to_string(),
        };
        let _ = writeln!(
            s,
            "- target `{shape}` (needs ≥ {:+.1}% and FASTER): {text}",
            g.min_speedup_pct
        );
    }
    let regs = &doc.decision.regressions;
    if regs.is_empty() {
        let _ = writeln!(s, "- regressions beyond {:.1}%: none", g.max_regression_pct);
    } else {
        for r in regs {
            let _ = writeln!(s, "- **REGRESSION**: {r}");
        }
    }
    let failures = &doc.decision.failures;
    let _ = match (doc.gate_enforced, failures.is_empty()) {
        (_, true) => writeln!(s, "- gate: **PASS**"),
        (true, false) => writeln!(s, "- gate: **FAIL**"),
        (false, false) => writeln!(s, "- gate (not enforced: run `compare --gate`): would FAIL"),
    };
    for f in failures {
        let _ = writeln!(s, "  - {f}");
    }
    for n in &doc.decision.notices {
        let _ = writeln!(s, "- notice: {n}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::perf::fixtures::perf_file;
    use crate::perf::paired_comparisons;

    #[test]
    fn the_report_has_header_variants_timings_correctness_and_verdicts() {
        let file = perf_file(
            "NVIDIA H200",
            &["small", "mission"],
            &[0, 1],
            &[("cp0", 1.0), ("cp1", 0.85)],
        );
        let cmps = paired_comparisons(
            &file,
            &crate::perf::fixtures::gates(),
            &crate::perf::fixtures::constant_floor,
        );
        let gates = PerformanceGates {
            max_regression_pct: 3.0,
            ..crate::perf::fixtures::gates()
        };
        let doc = CompareDoc {
            design: "paired: A/B interleaved in one run",
            base: Side {
                run: "this run".into(),
                perf: &file,
                variant: &file.variants[0],
                correctness: Some((4, 4)),
            },
            cand: Side {
                run: "this run".into(),
                perf: &file,
                variant: &file.variants[1],
                correctness: Some((3, 4)),
            },
            comparisons: &cmps,
            gates: &gates,
            decision: &crate::analysis::Decision {
                targets: crate::analysis::targets(&cmps, &gates),
                regressions: crate::analysis::regressions(&cmps, &gates),
                failures: vec![],
                notices: vec![],
            },
            gate_enforced: true,
            others: vec![],
            warnings: &["compared despite a mismatch".into()],
            notes: &[],
            svg: Some("latency.svg"),
        };
        let md = render(&doc);
        for needle in [
            "# COMPARE: cp1 (candidate) vs cp0 (baseline)",
            "**WARNING:** compared despite",
            "| device | NVIDIA H200",
            "| mission | 2 |",
            "**FASTER**",
            "95% CI",
            "![latency distributions per shape](latency.svg)",
            "candidate cp1: 3/4 PASS — FAILURES",
            "target `mission` (needs ≥ +10.0% and FASTER): **MET**",
            "regressions beyond 3.0%: none",
            "gate: **PASS**",
        ] {
            assert!(md.contains(needle), "missing `{needle}` in:\n{md}");
        }
    }

    /// COMPARE.md of one run's paired `cmps`: variant 0 against variant 1, and `others` more
    /// variants beside them (2, 3, ...).
    fn render_paired(
        file: &crate::schema::PerfFile,
        cmps: &[ShapeComparison],
        gates: &PerformanceGates,
        others: usize,
    ) -> String {
        let side = |i: usize| Side {
            run: "this run".into(),
            perf: file,
            variant: &file.variants[i],
            correctness: Some((1, 1)),
        };
        render(&CompareDoc {
            design: "paired",
            base: side(0),
            cand: side(1),
            others: (2..2 + others).map(side).collect(),
            comparisons: cmps,
            gates,
            decision: &crate::analysis::Decision::default(),
            gate_enforced: true,
            warnings: &[],
            notes: &[],
            svg: None,
        })
    }

    #[test]
    fn a_comparison_of_the_same_machine_code_is_marked_and_its_verdict_called_noise() {
        let mut file = perf_file(
            "NVIDIA H100 80GB HBM3",
            &["mission", "small"],
            &[0],
            &[("base-cp0", 1.0), ("cp0", 1.05)],
        );
        for m in &mut file.measurements {
            m.launch = Some(crate::perf::fixtures::launch(&format!("f_{}", m.shape), 8));
        }
        for v in &mut file.variants {
            // small's function moved, mission's did not.
            v.machine_code = ["mission", "small"]
                .iter()
                .map(|shape| {
                    let sha = if *shape == "small" { &v.name } else { "same" };
                    crate::perf::fixtures::code(&format!("f_{shape}"), sha)
                })
                .collect();
        }
        let gates = crate::perf::fixtures::gates();
        let cmps = paired_comparisons(&file, &gates, &crate::perf::fixtures::constant_floor);
        let md = render_paired(&file, &cmps, &gates, 0);
        let row = |shape: &str| {
            md.lines()
                .find(|l| l.starts_with(&format!("| {shape} |")))
                .unwrap_or_else(|| panic!("no row of {shape} in:\n{md}"))
                .to_string()
        };
        assert!(
            row("mission").contains("| same |")
                && row("mission").ends_with("**SLOWER** (same code: noise) |"),
            "{md}"
        );
        assert!(
            row("small").contains("| differs |") && row("small").ends_with("**SLOWER** |"),
            "{md}"
        );
        assert!(
            md.contains("1 of 2 comparisons are such controls")
                && md.contains("1 read other than SAME"),
            "{md}"
        );
    }

    #[test]
    fn a_base_kernel_report_names_both_kernels_every_pair_and_says_when_the_code_is_the_same() {
        use crate::schema::{KernelRef, KernelRole};
        let mut file = perf_file(
            "NVIDIA H100 80GB HBM3",
            &["mission"],
            &[0],
            &[
                ("cp0", 1.0),
                ("cp1", 1.1),
                ("base-cp0", 1.0),
                ("base-cp1", 1.1),
            ],
        );
        for v in &mut file.variants {
            let base = v.name.starts_with("base-");
            v.kernel = Some(KernelRef {
                role: if base {
                    KernelRole::Base
                } else {
                    KernelRole::Candidate
                },
                source: if base {
                    "git:main (0123456789ab):cuda/k.cu"
                } else {
                    "cuda/k.cu"
                }
                .into(),
                sha256: if base { "aaaa" } else { "bbbb" }.into(),
            });
            v.ptx_code_sha256 = Some(format!("code-{}", v.name.trim_start_matches("base-")));
        }
        let gates = crate::perf::fixtures::gates();
        let cmps = paired_comparisons(&file, &gates, &crate::perf::fixtures::constant_floor);
        let render_with = |file: &crate::schema::PerfFile| render_paired(file, &cmps, &gates, 2);
        let md = render_with(&file);
        for needle in [
            "# COMPARE: the kernel under test vs the base kernel",
            "| base | `git:main (0123456789ab):cuda/k.cu` |",
            "| under test | `cuda/k.cu` |",
            "**SAME CODE: the kernel under test compiles to the same code as the base kernel**",
            "base kernel `base-cp1`",
            "| mission | cp0 vs base-cp0 | 1 | 20/20 |",
            "| mission | cp1 vs cp0 |",
            "- base kernel base-cp0: 1/1 PASS",
        ] {
            assert!(md.contains(needle), "missing `{needle}` in:\n{md}");
        }
        file.variants[1].ptx_code_sha256 = Some("changed".into());
        let md = render_with(&file);
        assert!(
            md.contains("- `cp1`: the code differs from the base")
                && md.contains("- `cp0`: same code as the base")
                && !md.contains("compiles to the same code as the base kernel"),
            "{md}"
        );
        // Recorded code identities decide over the PTX, and name what differs.
        for v in &mut file.variants {
            let cp = v.name.trim_start_matches("base-").to_string();
            v.code = Some(crate::schema::CodeIdentity {
                sha256: format!("same-{cp}"),
                files: vec![("k.cu".into(), "s".into())],
                defines: vec![format!("USE_CP_ASYNC={}", &cp[2..])],
                options: vec!["-lineinfo".into()],
            });
        }
        let md = render_with(&file);
        assert!(
            md.contains("**SAME CODE"),
            "the PTX differs, the code does not: {md}"
        );
        let cand = file.variants[1].code.as_mut().unwrap();
        cand.sha256 = "other".into();
        cand.defines.push("X=1".into());
        let md = render_with(&file);
        assert!(
            md.contains("- `cp1`: the code differs from the base: define X=1 only here"),
            "{md}"
        );
    }
}
