//! `sdpa-runner check DIR --outputs OUT...`: grades other implementations' outputs of an
//! exported folder with the runner's references, metrics and bound gates (src/grade.rs). The
//! same spine as a run: everything the user gave is checked first (nothing is written on a
//! refusal), then each problem is drawn again (its checksum must match the manifest's, and
//! each of its files must hold what export wrote: else exit 2, nothing written), graded, and
//! the run directory (correctness.json, COMPARE.md) committed at the end.

use std::path::{Path, PathBuf};

use super::Project;
use crate::backend::BackendError;
use crate::cli::CheckArgs;
use crate::error::{AppError, Outcome};
use crate::exchange::{self, ImplementationFile};
use crate::grade::{CheckFile, CheckedProblem, Grade, ImplementationRecord, ProblemTruth};
use crate::outln;
use crate::problem::Problem;
use crate::reference::Precision;
use crate::report::RunDir;
use crate::rows::RowSet;
use crate::usage::ConfigError;

/// One implementation under grading.
pub struct Graded {
    pub name: String,
    pub precision: Precision,
    pub out: PathBuf,
    pub file: ImplementationFile,
    pub u16_is_bf16: bool,
}

pub fn check(args: &CheckArgs) -> Result<Outcome, AppError> {
    let project = Project::load(&args.project)?;
    let gates = &project.gates.gates.correctness;
    let manifest = exchange::load_manifest(&args.dir)?;
    let graded = implementations(args)?;
    let fp8_chain = args.fp8_chain.map(|c| c as usize);
    if fp8_chain.is_some()
        && args.ours.is_none()
        && graded.iter().all(|g| g.precision != Precision::Fp8)
    {
        return Err(ConfigError::Usage(
            "--fp8-chain holds FP8 implementations, and none is graded here: drop it, or grade \
             an implementation that read fp8 (--precision fp8, or --ours)"
                .into(),
        )
        .into());
    }
    if let Some(c) = fp8_chain {
        outln!(
            "FP8 implementations (ours too, with --ours) held to FP22 sums of at most {c} keys \
             (--fp8-chain)"
        );
    }
    // One problem held at a time, its references as a run's under --check-rows.
    let shapes = manifest
        .problems
        .iter()
        .map(|p| p.to_shape().map_err(ConfigError::Usage))
        .collect::<Result<Vec<_>, _>>()?;
    crate::rows::check_host_memory(&shapes, args.check_rows, 1, 1)?;
    let results = args
        .results_dir
        .clone()
        .unwrap_or_else(|| project.root.path().join("results"));
    RunDir::check_root(&results)?;
    let mut precisions: Vec<Precision> = graded.iter().map(|g| g.precision).collect();
    let mut ours = match args.ours {
        Some(kind) => {
            let entries = crate::shapes::Entry::of(&shapes);
            precisions.push(Precision::Fp8);
            Some(
                super::open_backend(
                    kind,
                    &args.kernel,
                    None,
                    crate::emulation::Defect::None,
                    &project,
                    &entries,
                )
                .map_err(ours_advice)?,
            )
        }
        None => None,
    };

    let mut checked = Vec::new();
    for (exported, shape) in manifest.problems.iter().zip(&shapes) {
        let p = Problem::new(shape, exported.seed);
        if p.inputs.checksum != exported.checksum {
            return Err(ConfigError::Usage(format!(
                "problem {}: its inputs drawn again have checksum {}, the manifest says {}: {} was \
                 exported by another version of sdpa-runner or edited; export it again",
                exported.id,
                p.inputs.checksum,
                exported.checksum,
                args.dir.display()
            ))
            .into());
        }
        exchange::verify_files(&args.dir, exported, &p)
            .map_err(|why| ConfigError::Usage(format!("{why}; export the problems again")))?;
        let rows = RowSet::choose(args.check_rows, shape, exported.seed, &[64, 128]);
        let truth = ProblemTruth::new(&p, &rows, &precisions).with_fp8_chain(fp8_chain);
        if let Some(lost) = crate::quantizer::InputRange::of(&p).summary() {
            outln!("  {}: inputs in E4M3: {lost}", exported.id);
        }
        let mut grades = Vec::new();
        if let Some(backend) = ours.as_deref_mut() {
            for grade in run_ours(backend, &p, &truth, gates)? {
                print_grade(&exported.id, &grade);
                grades.push(grade);
            }
        }
        for g in &graded {
            let facts = g.file.problems.get(&exported.id);
            let output = exchange::read_output(
                &g.out,
                &exported.id,
                exported.output_shape(),
                facts,
                g.u16_is_bf16,
            );
            let file = g.out.join(format!("{}.npy", exported.id));
            let mut grade = truth.grade(
                &g.name,
                g.precision,
                output,
                file.display().to_string(),
                gates,
            );
            grade.p50_us = facts.and_then(|f| f.p50_us);
            print_grade(&exported.id, &grade);
            grades.push(grade);
        }
        checked.push(CheckedProblem {
            problem: exported.clone(),
            rows_checked: rows.count(),
            input_range: crate::quantizer::InputRange::of(&p),
            row_rule: rows.rule().to_string(),
            grades,
        });
    }

    let pass = checked.iter().all(|c| c.grades.iter().all(|g| g.pass));
    let run = RunDir::create(&results)?;
    let record = CheckFile {
        format: crate::grade::CHECK_FORMAT,
        tool: crate::report::tool_info(),
        git: crate::report::git_info(),
        created: crate::report::now_rfc3339(),
        export_dir: args.dir.display().to_string(),
        fp8_chain,
        implementations: ours_records(ours.as_deref())
            .into_iter()
            .chain(graded.iter().map(|g| ImplementationRecord {
                name: g.name.clone(),
                precision: g.precision,
                outputs: g.out.display().to_string(),
                about: g.file.about.clone(),
            }))
            .collect(),
        problems: &checked,
        pass,
    };
    run.write_json("correctness.json", &record)?;
    run.write_text(
        "COMPARE.md",
        &crate::render::grades::markdown(&args.dir, &checked, gates, fp8_chain),
    )?;
    let dir = run.commit()?;
    let (fails, total) = checked
        .iter()
        .flat_map(|c| &c.grades)
        .fold((0, 0), |(f, t), g| (f + usize::from(!g.pass), t + 1));
    outln!("results: {}", dir.display());
    if pass {
        outln!("check: PASS ({total} grades)");
    } else {
        outln!("check: FAIL ({fails} of {total} grades failed)");
    }
    Ok(Outcome::from_pass(pass))
}

/// Launches: untimed ones before timing, and timed ones (one sample each) for the median.
const OURS_WARMUP: usize = 10;
const OURS_TIMED: usize = 50;

/// A GPU that cannot be opened for `--ours cuda`: the advice the run commands give names their
/// `--backend cpu`; here the flag is `--ours cpu`.
fn ours_advice(e: AppError) -> AppError {
    match e {
        AppError::Backend(BackendError::Environment(why)) => {
            AppError::Backend(BackendError::Environment(why.replace(
                super::CPU_BACKEND_ADVICE,
                "`--ours cpu` grades the CPU emulation of the kernel instead, with no GPU.",
            )))
        }
        other => other,
    }
}

/// sdpa-runner's own kernel on problem `p`: each variant launched into a poisoned output and
/// graded (fp8 in, f16 out) as the others are, with its median time.
fn run_ours(
    backend: &mut dyn crate::backend::Backend,
    p: &Problem,
    truth: &ProblemTruth,
    gates: &crate::gates::CorrectnessGates,
) -> Result<Vec<Grade>, AppError> {
    backend.load(p)?;
    let plan = crate::timing::TimingPlan {
        warmup: OURS_WARMUP,
        iters: OURS_TIMED,
        rounds: 1,
        batch: 1,
        l2: crate::timing::L2Mode::Warm,
    };
    let mut grades = Vec::new();
    for (v, variant) in backend.variants().to_vec().iter().enumerate() {
        let out = backend.launch_poisoned(v)?;
        let output = crate::exchange::Output {
            values: out.iter().map(|x| x.to_f64()).collect(),
            format: crate::reference::OutputFormat::F16,
            path: PathBuf::from(variant),
        };
        let name = format!("sdpa-runner {variant}");
        let mut grade = truth.grade(
            &name,
            Precision::Fp8,
            Ok(output),
            format!("({variant})"),
            gates,
        );
        // Where the kernel runs the problem in another geometry, it owes the same bits there.
        let others = backend.other_geometries(v)?;
        if !others.is_empty() {
            let check = crate::runner::geometries_differ(&out, &others);
            if !check.pass {
                let failed = crate::verdict::Failed {
                    gate: crate::runner::GEOMETRY_GATE,
                    check: &check,
                };
                grade.failures.push(failed.to_string());
                grade.pass = false;
            }
            grade.verdict.add(crate::runner::GEOMETRY_GATE, check);
        }
        backend.warm_up(v, plan.warmup)?;
        let block = backend.time_samples(v, plan.iters, &plan)?;
        grade.p50_us = Some(crate::stats::median(&block.samples));
        grades.push(grade);
    }
    Ok(grades)
}

/// The records of `--ours`' variants.
fn ours_records(ours: Option<&dyn crate::backend::Backend>) -> Vec<ImplementationRecord> {
    let Some(backend) = ours else {
        return Vec::new();
    };
    backend
        .variants()
        .iter()
        .map(|v| ImplementationRecord {
            name: format!("sdpa-runner {v}"),
            precision: Precision::Fp8,
            outputs: format!("{} ({v})", backend.describe()),
            about: Default::default(),
        })
        .collect()
}

/// The implementations of `--outputs`, each with its name and precision, or the reason the
/// flags and files do not say them.
fn implementations(args: &CheckArgs) -> Result<Vec<Graded>, ConfigError> {
    let mut graded: Vec<Graded> = Vec::new();
    for out in &args.outputs {
        if !out.is_dir() {
            return Err(ConfigError::Usage(format!(
                "--outputs {}: not a folder; pass the folder that holds <problem id>.npy",
                out.display()
            )));
        }
        let file = ImplementationFile::load(out)?;
        let precision = match (args.precision, file.precision) {
            (Some(flag), Some(said)) if flag != said => {
                return Err(ConfigError::Usage(format!(
                    "--precision {} but {} says \"precision\": \"{}\"; drop one",
                    flag.name(),
                    out.join(exchange::IMPLEMENTATION_FILE).display(),
                    said.name()
                )));
            }
            (Some(p), _) | (None, Some(p)) => p,
            (None, None) => {
                return Err(ConfigError::Usage(format!(
                    "say what the implementation behind {} read: --precision fp8|fp16|bf16|fp32, \
                     or \"precision\" in its implementation.json",
                    out.display()
                )));
            }
        };
        let base = file.name.clone().unwrap_or_else(|| folder_name(out));
        let mut name = base.clone();
        for n in 2.. {
            if !graded.iter().any(|g| g.name == name) {
                break;
            }
            name = format!("{base}#{n}");
        }
        let u16_is_bf16 = args.u16_is_bf16 || file.u16.is_some();
        graded.push(Graded {
            name,
            precision,
            out: out.clone(),
            file,
            u16_is_bf16,
        });
    }
    Ok(graded)
}

fn folder_name(out: &Path) -> String {
    std::fs::canonicalize(out)
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().to_string()))
        .unwrap_or_else(|| out.display().to_string())
}

fn print_grade(id: &str, g: &Grade) {
    let verdict = if g.pass { "PASS" } else { "FAIL" };
    let ratio = |m: &Option<crate::metrics::ErrorMetrics>| {
        m.as_ref()
            .map_or("-".to_string(), |m| format!("{:.3}", m.max_err_over_bound))
    };
    let rmse = g
        .end_to_end
        .as_ref()
        .map_or("-".to_string(), |m| format!("{:.2e}", m.rmse));
    outln!(
        "  {verdict}  {id:<40} {:<20} err/bound {} (end to end {}), rmse {rmse}",
        g.implementation,
        ratio(&g.kernel),
        ratio(&g.end_to_end)
    );
    if g.zeros_would_pass {
        outln!(
            "        NOT DISCRIMINATING: an all-zero output would pass too (the {} model's bound is \
             wider than the output on this problem)",
            g.precision.name()
        );
    }
    if !g.pass {
        let at = g
            .worst_row
            .map(|[b, h, s]| format!(" at row [b {b}, h {h}, s {s}]"))
            .unwrap_or_default();
        for f in &g.failures {
            outln!("        {f}{at}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gpu_that_cannot_be_opened_for_ours_advises_ours_cpu_not_backend_cpu() {
        let opened = AppError::Backend(BackendError::Environment(format!(
            "no usable GPU: no driver\n{}",
            super::super::CPU_BACKEND_ADVICE
        )));
        let said = ours_advice(opened);
        assert_eq!(said.exit_code(), crate::error::EXIT_ENVIRONMENT);
        let said = said.to_string();
        assert!(
            said.contains("no usable GPU: no driver") && said.contains("`--ours cpu`"),
            "{said}"
        );
        assert!(!said.contains("--backend"), "{said}");
        // Other errors pass through untouched.
        let usage = AppError::Config(ConfigError::Usage("bad".into()));
        assert_eq!(ours_advice(usage).to_string(), "bad");
    }

    #[test]
    fn ours_fails_its_grade_when_another_launch_geometry_changes_a_bit() {
        let shape = crate::shapes::Shape::parse_inline("1x2x77x64")
            .unwrap()
            .unwrap();
        let p = Problem::new(&shape, 0);
        let rows = RowSet::choose(crate::rows::CheckRows::All, &shape, 0, &[64, 128]);
        let truth = ProblemTruth::new(&p, &rows, &[Precision::Fp8]);
        let gates = crate::gates::GateFile::load(
            &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("gates/default.json"),
        )
        .unwrap()
        .gates
        .correctness;
        for flip in [false, true] {
            // A second launch geometry whose output differs in element 5's lowest bit, or not.
            let mut b = crate::backend::fake::FakeDevice::new(false);
            b.other_geometry_flips = Some(if flip { vec![5] } else { vec![] });
            let grades = run_ours(&mut b, &p, &truth, &gates).unwrap();
            let g = &grades[0];
            let gate = &g.verdict.checks[crate::runner::GEOMETRY_GATE];
            assert_eq!((g.pass, gate.pass), (!flip, !flip), "{:?}", g.failures);
            assert_eq!(
                g.failures
                    .iter()
                    .any(|f| f.starts_with("launch.geometries_differ 1")),
                flip,
                "{:?}",
                g.failures
            );
        }
    }
}
