//! `sdpa-runner selftest`: proves the harness catches real bugs. Each planted `MUTANT_*` kernel
//! goes down a ladder of checks, each a run of this same binary in a child process (a fault
//! poisons a CUDA context for good, so every mutant gets a fresh one): the correctness and
//! resource gates (including the unwritten count), then stress determinism, then
//! compute-sanitizer. A mutant that passes every rung survives. The clean kernel must pass
//! all of them, and its PTX must be identical with the mutant blocks stripped from the source.

use clap::ValueEnum;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::Project;
use crate::backend::BackendError;
use crate::backend::cuda::headers;
use crate::backend::cuda::kernel::{self, KernelSource};
use crate::backend::cuda::variant::VariantSpec;
use crate::cli::SelftestArgs;
use crate::console;
use crate::error::{AppError, EXIT_ENVIRONMENT, EXIT_GATE_FAILED, EXIT_KERNEL, EXIT_PASS, Outcome};
use crate::mutants::{self, Mutant};
use crate::problem::HostDefect;
use crate::report::RunDir;
use crate::schema::{
    CorrectnessFile, GpuSlot, MutantResult, PtxIdentity, SCHEMA_VERSION, SelftestFile,
};
use crate::shapes::Entry;
use crate::usage::ConfigError;

pub fn selftest(args: &SelftestArgs) -> Result<Outcome, AppError> {
    let project = Project::load(&args.project)?;
    let kernel = project.kernel(&crate::cli::KernelArgs {
        kernel: args.kernel.clone(),
        ..Default::default()
    })?;
    let chosen = choose(&kernel.spec.mutants, &kernel.spec.name, &args.only)?;
    // Checked as a run's are; nothing is timed, so a GPU may be listed twice.
    let gpus = super::chosen_gpus(&args.devices, false)?;
    let source = KernelSource::load(&kernel.path, &project.root.cuda_dir(), &kernel.spec)?;

    let identity = ptx_identity(&source)?;
    for i in &identity {
        crate::outln!(
            "clean {} PTX with mutant code {} / stripped {}: {}",
            i.variant,
            &i.shipped_ptx_sha256[..12],
            &i.stripped_ptx_sha256[..12],
            if i.identical {
                "identical"
            } else {
                "DIFFERENT"
            }
        );
    }

    let results_root = args
        .results_dir
        .clone()
        .unwrap_or_else(|| project.root.path().join("results"));
    let run_dir = RunDir::create(&results_root)?;
    let child = Child {
        exe: std::env::current_exe()
            .map_err(|e| ConfigError::Usage(format!("cannot find this executable: {e}")))?,
        root: project.root.path().to_path_buf(),
        kernel: args.kernel.clone(),
        work: run_dir.staging().join("runs"),
        gpu: None,
    };
    let mut workers: Vec<Child> = match gpus {
        None => vec![child],
        Some(gpus) => gpus
            .into_iter()
            .map(|g| Child {
                gpu: Some(GpuSlot {
                    index: g.ordinal,
                    uuid: g.uuid,
                }),
                ..child.clone()
            })
            .collect(),
    };
    let repeats = args.repeats.to_string();
    let all_shapes = union_of_shapes(&chosen);

    // Every check is a child run of its own; with --devices they are shared among the GPUs,
    // one worker each, and the results kept in this order.
    let mut checks = vec![Check::CleanRun, Check::CleanStress];
    checks.extend(chosen.iter().map(Check::Mutant));
    if args.only.is_empty() {
        checks.extend(
            HostDefect::value_variants()
                .iter()
                .skip(1)
                .map(|d| Check::Host(*d)),
        );
    }
    let costs = vec![1; checks.len()];
    let done = crate::shard::run(
        &mut workers,
        &checks,
        &costs,
        |child, check, emit| {
            let done = check.run(child, &all_shapes, &repeats)?;
            let gpu = console::on_gpu(child.gpu.as_ref(), child.gpu.is_some());
            emit(match (&done, check) {
                (Done::Clean(run), Check::CleanStress) => format!(
                    "clean kernel on {all_shapes}: stress x{repeats} {}{gpu}",
                    verdict_word(run.code)
                ),
                (Done::Clean(run), _) => format!(
                    "clean kernel on {all_shapes}: gates {}{gpu}",
                    verdict_word(run.code)
                ),
                (Done::Result(r), _) => format!(
                    "{:<30} {:<22} {}{gpu}",
                    r.define,
                    r.caught_by.as_deref().unwrap_or("SURVIVED"),
                    r.figure
                ),
            });
            Ok::<_, AppError>(done)
        },
        |_, line| crate::outln!("{line}"),
    )?;
    let mut done = done.into_iter();
    let (Some(Done::Clean(clean_run)), Some(Done::Clean(clean_stress))) =
        (done.next(), done.next())
    else {
        unreachable!("the clean checks come first")
    };
    let clean_pass = clean_run.code == EXIT_PASS as i32 && clean_stress.code == EXIT_PASS as i32;
    let (mut results, mut host_results) = (Vec::new(), Vec::new());
    for (check, done) in checks[2..].iter().zip(done) {
        let Done::Result(r) = done else {
            unreachable!("a mutant or host defect gives a result")
        };
        match check {
            Check::Host(_) => host_results.push(r),
            _ => results.push(r),
        }
    }
    let all_results = || results.iter().chain(&host_results);
    let caught = all_results().filter(|r| r.caught_by.is_some()).count();
    let score = format!("{caught}/{}", all_results().count());
    let all_pass =
        clean_pass && caught == all_results().count() && identity.iter().all(|i| i.identical);
    crate::outln!("\n{}", table(&results));
    if !host_results.is_empty() {
        crate::outln!("{}", table(&host_results));
    }
    crate::outln!(
        "mutation score {score} ({:.0}%); clean kernel {}; clean PTX {}",
        100.0 * caught as f64 / all_results().count().max(1) as f64,
        if clean_pass { "PASS" } else { "FAIL" },
        if identity.iter().all(|i| i.identical) {
            "identical without mutant code"
        } else {
            "DIFFERS without mutant code"
        }
    );
    let file = SelftestFile {
        schema_version: SCHEMA_VERSION,
        ptx_identity: identity,
        clean_kernel_pass: clean_pass,
        mutants: results,
        host_defects: host_results,
        score,
        all_pass,
    };
    run_dir.write_json("selftest.json", &file)?;
    let path = run_dir.commit()?;
    crate::outln!("results: {}", path.display());
    Ok(Outcome::from_pass(all_pass))
}

/// Runs mission (two seeds, so a seed that never reaches the generator shows) with a planted
/// host defect; it must exit 1, and the first failed gate it names is what caught it.
fn check_host_defect(child: &Child, defect: HostDefect) -> Result<MutantResult, AppError> {
    let name = defect
        .to_possible_value()
        .map(|v| v.get_name().to_string())
        .unwrap_or_default();
    let run = child.run(
        &format!("host-{name}"),
        &[],
        &[
            "--shapes",
            "mission",
            "--seeds",
            "0,1",
            "--iters",
            "0",
            "--host-defect",
            &name,
        ],
    )?;
    let failed_gate = run.stdout.lines().find_map(|l| {
        l.split_once(" FAIL (")
            .map(|(_, why)| {
                why.trim_end_matches(')')
                    .split(';')
                    .next()
                    .unwrap_or("")
                    .to_string()
            })
            .or_else(|| l.strip_prefix("GATE FAILED: ").map(str::to_string))
    });
    let caught = run.code == EXIT_GATE_FAILED as i32 && failed_gate.is_some();
    Ok(MutantResult {
        gpu: child.gpu.clone(),
        define: format!("host: {name}"),
        breaks: host_defect_breaks(defect).into(),
        variants: "all".into(),
        shapes: "mission".into(),
        caught_by: caught.then(|| {
            let gate = failed_gate.as_deref().unwrap_or_default();
            gate.split_whitespace()
                .find(|w| w.contains('.') || *w == "nonfinite" || *w == "unwritten")
                .unwrap_or("correctness gate")
                .trim_end_matches(':')
                .to_string()
        }),
        figure: match (caught, failed_gate) {
            (true, Some(g)) => g,
            _ => format!("exit {}: not caught", run.code),
        },
    })
}

fn host_defect_breaks(d: HostDefect) -> &'static str {
    match d {
        HostDefect::None => "nothing",
        HostDefect::SeedQuantizer => "the seed system's quantizer against an E4M3 decoder",
        HostDefect::Scale447 => "encodes with amax/447, decoded with amax/448",
        HostDefect::PerTensorScale => "one scale per tensor instead of per (b, h)",
        HostDefect::SameInputsEverySeed => "draws seed 0's inputs for every seed",
        HostDefect::ZeroV => "V all zeros",
    }
}

/// The mutants of kernel `kernel` (its manifest entry's `all`) a self-test runs: every one
/// that is not opt-in, or those `--only` names, each once (a child's results folder is named
/// after its mutant, so a name given twice would make two runs share one).
fn choose(all: &[Mutant], kernel: &str, only: &[String]) -> Result<Vec<Mutant>, ConfigError> {
    if only.is_empty() {
        return Ok(all.iter().filter(|m| !m.opt_in).cloned().collect());
    }
    let mut seen = std::collections::BTreeSet::new();
    only.iter()
        .filter(|name| seen.insert(name.as_str()))
        .map(|name| {
            all.iter()
                .find(|m| m.define == *name)
                .cloned()
                .ok_or_else(|| {
                    let known: Vec<&str> = all.iter().map(|m| m.define.as_str()).collect();
                    ConfigError::Usage(format!(
                        "--only {name}: the mutants of kernel `{kernel}` are {}",
                        known.join(", ")
                    ))
                })
        })
        .collect()
}

fn union_of_shapes(chosen: &[Mutant]) -> String {
    let mut shapes: Vec<&str> = Vec::new();
    for s in chosen.iter().flat_map(|m| m.shapes.split(',')) {
        if !shapes.contains(&s) {
            shapes.push(s);
        }
    }
    shapes.join(",")
}

/// Compiles both clean variants from the shipped source and from the source with every
/// mutant block stripped, and compares the PTX.
fn ptx_identity(source: &KernelSource) -> Result<Vec<PtxIdentity>, AppError> {
    kernel::require_nvrtc()?;
    let include =
        headers::find_in_environment().map_err(|e| BackendError::Environment(e.to_string()))?;
    let stripped_text = mutants::strip(&source.text).map_err(|e| {
        BackendError::Kernel(format!(
            "cannot strip the mutant blocks of {}: {e}",
            source.path.display()
        ))
    })?;
    let stripped = KernelSource {
        text: stripped_text,
        ..source.clone()
    };
    [false, true]
        .iter()
        .map(|&on| {
            let spec = VariantSpec::of_switch(&source.spec.variants, on, &[]);
            // Every entry's module, hashed together.
            let hash = |src: &KernelSource| -> Result<String, AppError> {
                let id =
                    kernel::build_variant(src, &include, "sm_90", &spec, &Entry::all())?.identity;
                let others: Vec<&str> = id.entries.iter().map(|e| e.ptx_sha256.as_str()).collect();
                Ok(format!("{}+{}", id.ptx_sha256, others.join("+")))
            };
            let (a, b) = (hash(source)?, hash(&stripped)?);
            Ok(PtxIdentity {
                variant: spec.name,
                identical: a == b,
                shipped_ptx_sha256: a,
                stripped_ptx_sha256: b,
            })
        })
        .collect()
}

/// One check of the self-test, run as a child process.
enum Check<'a> {
    CleanRun,
    CleanStress,
    Mutant(&'a Mutant),
    Host(HostDefect),
}

enum Done {
    Clean(ChildRun),
    Result(MutantResult),
}

impl Check<'_> {
    fn run(&self, child: &Child, all_shapes: &str, repeats: &str) -> Result<Done, AppError> {
        Ok(match self {
            Check::CleanRun => Done::Clean(child.run(
                "clean",
                &[],
                &["--shapes", all_shapes, "--seeds", "0", "--iters", "0"],
            )?),
            Check::CleanStress => Done::Clean(child.run(
                "clean-stress",
                &["stress"],
                &["--shapes", all_shapes, "--seeds", "0", "--repeats", repeats],
            )?),
            Check::Mutant(m) => Done::Result(check_mutant(child, m, repeats)?),
            Check::Host(defect) => Done::Result(check_host_defect(child, *defect)?),
        })
    }
}

/// Runs this binary as a child process, each run in its own results folder.
#[derive(Clone)]
struct Child {
    exe: PathBuf,
    root: PathBuf,
    kernel: Option<PathBuf>,
    work: PathBuf,
    /// The GPU its runs use (`--devices`); None: the child's default, GPU 0.
    gpu: Option<GpuSlot>,
}

struct ChildRun {
    code: i32,
    stderr: String,
    stdout: String,
    /// The run directory the child wrote, if any.
    dir: Option<PathBuf>,
}

impl Child {
    /// `sdpa-runner [subcommand] ARGS --root R --results-dir W/<label> [--kernel K]`, optionally
    /// under compute-sanitizer.
    fn command(&self, label: &str, subcommand: &[&str], args: &[&str]) -> (Command, PathBuf) {
        let results = self.work.join(label);
        let mut cmd = Command::new(&self.exe);
        cmd.args(subcommand)
            .args(args)
            .arg("--root")
            .arg(&self.root)
            .arg("--results-dir")
            .arg(&results);
        if let Some(k) = &self.kernel {
            cmd.arg("--kernel").arg(k);
        }
        if let Some(gpu) = &self.gpu {
            cmd.arg("--devices").arg(gpu.index.to_string());
        }
        cmd.env_remove("USE_CP_ASYNC");
        (cmd, results)
    }

    fn run(&self, label: &str, subcommand: &[&str], args: &[&str]) -> Result<ChildRun, AppError> {
        let (mut cmd, results) = self.command(label, subcommand, args);
        finish(&mut cmd, &results)
    }

    /// The same run under compute-sanitizer; None when compute-sanitizer is not installed.
    fn sanitized(
        &self,
        label: &str,
        tool: &str,
        args: &[&str],
    ) -> Result<Option<ChildRun>, AppError> {
        let (inner, results) = self.command(label, &[], args);
        let mut cmd = Command::new("compute-sanitizer");
        cmd.args(["--tool", tool, "--error-exitcode", "9"]);
        if tool == "memcheck" {
            // An overrun into the next allocation is invisible without padding.
            cmd.args(["--padding", "256"]);
        }
        cmd.arg(inner.get_program()).args(inner.get_args());
        cmd.env_remove("USE_CP_ASYNC");
        match crate::interrupt::output_of_child(&mut cmd) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => {
                Err(ConfigError::Usage(format!("cannot start compute-sanitizer: {e}")).into())
            }
            Ok(out) => collect(out, &results).map(Some),
        }
    }
}

fn finish(cmd: &mut Command, results: &Path) -> Result<ChildRun, AppError> {
    let out = crate::interrupt::output_of_child(cmd)
        .map_err(|e| ConfigError::Usage(format!("cannot start {:?}: {e}", cmd.get_program())))?;
    collect(out, results)
}

/// A finished child: its exit code, output and run directory; exit 3 becomes an error.
fn collect(out: std::process::Output, results: &Path) -> Result<ChildRun, AppError> {
    let run = ChildRun {
        // A child ended by a signal reads as shells report it: 128 + the signal's number.
        code: out
            .status
            .code()
            .or_else(|| {
                out.status
                    .signal()
                    .map(|s| crate::interrupt::exit_code_for(s) as i32)
            })
            .unwrap_or(-1),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        dir: crate::report::only_run_dir(results).ok(),
    };
    if run.code == EXIT_ENVIRONMENT as i32 {
        // The child is a run, which advises `--backend cpu`; the self-test does not take it.
        let why = run.stderr.replace(super::CPU_BACKEND_ADVICE, "");
        let why = why.trim().trim_start_matches("error: ");
        return Err(BackendError::Environment(why.to_string()).into());
    }
    Ok(run)
}

fn verdict_word(code: i32) -> &'static str {
    if code == EXIT_PASS as i32 {
        "PASS"
    } else {
        "FAIL"
    }
}

/// The ladder: gates, then stress, then the sanitizers; the first rung that fails catches it.
fn check_mutant(child: &Child, m: &Mutant, repeats: &str) -> Result<MutantResult, AppError> {
    let cp = if m.candidate_only { "1" } else { "both" };
    let shapes = m.shapes.as_str();
    let first_shape = shapes.split(',').next().unwrap_or(shapes);
    let label = m.define.to_lowercase();
    let mut hooks: Vec<&str> = Vec::new();
    for h in &m.hooks {
        hooks.extend(["--define", h.as_str()]);
    }
    // The hooks alone (the clean kernel built with them) must pass, or a catch below could be
    // theirs.
    if !hooks.is_empty() {
        let mut clean = vec![
            "--shapes",
            shapes,
            "--iters",
            "0",
            "--seeds",
            "0",
            "--cp-async",
            cp,
        ];
        clean.extend(&hooks);
        let run = child.run(&format!("{label}-hooks-clean"), &[], &clean)?;
        if run.code != EXIT_PASS as i32 {
            return Err(ConfigError::Usage(format!(
                "{}: the clean kernel with its hooks ({}) ended with exit {} instead of PASS, so \
                 they cannot judge it: {}",
                m.define,
                m.hooks.join(", "),
                run.code,
                run.stderr.trim()
            ))
            .into());
        }
    }
    let hooks_note = if m.hooks.is_empty() {
        String::new()
    } else {
        format!(
            " (built with {}; the clean kernel with it: PASS)",
            m.hooks.join(", ")
        )
    };
    let mut base = vec!["--seeds", "0", "--cp-async", cp, "--define", &m.define];
    base.extend(&hooks);
    let result = |caught_by: Option<&str>, figure: String| MutantResult {
        gpu: child.gpu.clone(),
        define: m.define.clone(),
        breaks: m.breaks.clone(),
        variants: if m.candidate_only {
            "the candidate".into()
        } else {
            "both".into()
        },
        shapes: m.shapes.clone(),
        caught_by: caught_by.map(String::from),
        figure: format!("{figure}{hooks_note}"),
    };

    let mut gates_args = vec!["--shapes", shapes, "--iters", "0"];
    gates_args.extend(&base);
    let run = child.run(&label, &[], &gates_args)?;
    if run.code == EXIT_KERNEL as i32 {
        let line = run
            .stderr
            .lines()
            .find(|l| l.contains("failed"))
            .unwrap_or(run.stderr.trim());
        return Ok(result(Some("kernel fault (exit 4)"), line.to_string()));
    }
    if run.code == EXIT_GATE_FAILED as i32 {
        let (by, figure) = gate_figure(run.dir.as_deref())?;
        return Ok(result(Some(by), figure));
    }
    expect_pass(&run, &m.define)?;

    let mut stress_args = vec!["--shapes", shapes, "--repeats", repeats];
    stress_args.extend(&base);
    let stress = child.run(&format!("{label}-stress"), &["stress"], &stress_args)?;
    if stress.code == EXIT_GATE_FAILED as i32 {
        return Ok(result(
            Some("stress determinism"),
            stress_figure(stress.dir.as_deref())?,
        ));
    }
    expect_pass(&stress, &m.define)?;

    let mut san_args = vec!["--shapes", first_shape, "--iters", "0"];
    san_args.extend(&base);
    for tool in ["memcheck", "racecheck"] {
        match child.sanitized(&format!("{label}-{tool}"), tool, &san_args)? {
            None => {
                return Ok(result(
                    None,
                    "compute-sanitizer is not on PATH; it alone could catch this".into(),
                ));
            }
            Some(run) if run.code == 9 => {
                let all = format!("{}{}", run.stdout, run.stderr);
                let summary = all
                    .lines()
                    .find(|l| l.contains("ERROR SUMMARY") || l.contains("RACECHECK SUMMARY"))
                    .unwrap_or("findings reported")
                    .trim_start_matches("========= ")
                    .to_string();
                return Ok(result(
                    Some(if tool == "memcheck" {
                        "sanitizer memcheck"
                    } else {
                        "sanitizer racecheck"
                    }),
                    summary,
                ));
            }
            Some(_) => {}
        }
    }
    Ok(result(
        None,
        format!("passed gates, stress x{repeats} and memcheck/racecheck"),
    ))
}

fn expect_pass(run: &ChildRun, define: &str) -> Result<(), AppError> {
    if run.code == EXIT_PASS as i32 {
        return Ok(());
    }
    Err(ConfigError::Usage(format!(
        "{define}: a check run ended with exit {} instead of a verdict: {}",
        run.code,
        run.stderr.trim()
    ))
    .into())
}

/// Which gate failed, and by how much. A wrong output is named before a resource gate: a
/// mutant can change register use by chance, but a wrong answer is the catch that matters.
fn gate_figure(dir: Option<&Path>) -> Result<(&'static str, String), AppError> {
    let path = dir.map(|d| d.join("correctness.json")).unwrap_or_default();
    let file: CorrectnessFile = crate::json::read_file(&path)?;
    let Some(r) = file.results.iter().find(|r| !r.pass) else {
        let (variant, v) = file
            .resources
            .iter()
            .find(|(_, v)| !v.pass())
            .expect("a failing run has a failing row or resource gate");
        return Ok((
            "resource gate",
            format!("{variant}: {}", v.failures().join("; ")),
        ));
    };
    let place = format!("{} seed {} {}", r.shape, r.seed, r.variant);
    if r.kernel_ref.unwritten > 0 {
        return Ok((
            "unwritten count",
            format!("{} unwritten elements ({place})", r.kernel_ref.unwritten),
        ));
    }
    // The most telling gate first: the kernel's own error, then relative, then end to end.
    let rank = |g: &str| {
        [
            "nonfinite",
            "kernel.",
            "relative.",
            "emulation.",
            "end_to_end.",
        ]
        .iter()
        .position(|p| g.starts_with(p))
        .unwrap_or(usize::MAX)
    };
    let failed = crate::verdict::failed(&r.gates)
        .min_by_key(|f| rank(f.gate))
        .expect("a failing row has a failing gate");
    Ok(("correctness gate", format!("{failed} ({place})")))
}

fn stress_figure(dir: Option<&Path>) -> Result<String, AppError> {
    let path = dir.map(|d| d.join("stress.json")).unwrap_or_default();
    let file: crate::schema::StressFile = crate::json::read_file(&path)?;
    let r = file
        .results
        .iter()
        .find(|r| !r.pass)
        .expect("a failing stress run has a failing row");
    Ok(format!(
        "{}/{} repeats diverged ({} seed {} {} {:?})",
        r.divergent_repeats, r.repeats, r.shape, r.seed, r.variant, r.mode
    ))
}

fn table(results: &[MutantResult]) -> String {
    let mut s = String::from(
        "| mutant | breaks | variants | shapes | caught by | figure |\n|---|---|---|---|---|---|\n",
    );
    for r in results {
        s.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} |\n",
            r.define,
            r.breaks,
            r.variants,
            r.shapes,
            r.caught_by.as_deref().unwrap_or("**SURVIVED**"),
            r.figure
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_mutant_names_are_refused_with_the_kernels_list() {
        let c = crate::kernels::project_spec("stage-c");
        let err = choose(&c.mutants, "stage-c", &["MUTANT_NOPE".into()])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("MUTANT_NOPE")
                && err.contains("MUTANT_WRONG_STAGE")
                && err.contains("stage-c"),
            "{err}"
        );
        let default = choose(&c.mutants, "stage-c", &[]).unwrap();
        assert!(default.iter().all(|m| !m.opt_in));
        assert_eq!(
            default.len(),
            c.mutants.iter().filter(|m| !m.opt_in).count()
        );
        let named = choose(&c.mutants, "stage-c", &["MUTANT_I32_HEAD_OFFSET".into()]).unwrap();
        assert_eq!(
            (named.len(), named[0].shapes.as_str()),
            (1, "index64"),
            "opt-in when named"
        );
        let twice = ["MUTANT_WRONG_STAGE".into(), "MUTANT_WRONG_STAGE".into()];
        assert_eq!(
            choose(&c.mutants, "stage-c", &twice).unwrap().len(),
            1,
            "named twice: once"
        );
        // Each kernel has its own: Stage C's are not Stage D's.
        let d = crate::kernels::project_spec("stage-d");
        assert!(choose(&d.mutants, "stage-d", &["MUTANT_WRONG_STAGE".into()]).is_err());
        assert!(choose(&d.mutants, "stage-d", &["MUTANT_SKIP_RESCALE".into()]).is_ok());
    }

    #[test]
    fn the_shapes_of_all_mutants_are_listed_once() {
        for name in ["stage-c", "stage-d"] {
            let mutants = crate::kernels::project_spec(name).mutants;
            let all = union_of_shapes(&mutants);
            let names: Vec<&str> = all.split(',').collect();
            let unique: std::collections::BTreeSet<&str> = names.iter().copied().collect();
            assert_eq!(names.len(), unique.len(), "{all}");
            let wanted: std::collections::BTreeSet<&str> =
                mutants.iter().flat_map(|m| m.shapes.split(',')).collect();
            assert_eq!(unique, wanted, "every mutant's shapes, each once");
        }
    }
}
