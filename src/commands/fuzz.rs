//! `sdpa-runner fuzz`: random problems checked with the same gates as a run, to prove that the
//! limits, derived from the error model, hold far outside the named shapes. Shapes are drawn
//! toward the kernel's edges (S of 1 to 17, tile boundaries ± 1, several KV tiles, up to
//! `--max-s`), with random B, H, qk_std and input distribution; every failure is recorded
//! with a one-line reproduction. Writes fuzz.json; exit 1 on any failure.

use std::time::Instant;

use clap::ValueEnum;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::{
    Project, as_workers, build_meta, open_workers, plan_workers, worker_count, workers_line,
};
use crate::backend::{Backend, BackendError, BackendKind};
use crate::cli::FuzzArgs;
use crate::emulation::Defect;
use crate::error::{AppError, Outcome};
use crate::gates::Gates;
use crate::report::{self, RunDir};
use crate::runner;
use crate::schema::{FuzzFile, FuzzRecord, GpuSlot, SCHEMA_VERSION};
use crate::shapes::{self, Dist, Shape};
use crate::usage::ConfigError;
use crate::verdict;

pub fn fuzz(args: &FuzzArgs) -> Result<Outcome, AppError> {
    let started_at = report::now_rfc3339();
    let project = Project::load(&args.setup.project)?;
    let mut draw = ChaCha8Rng::seed_from_u64(args.seed);
    let problems: Vec<(Shape, u64)> = (0..args.count)
        .map(|_| draw_problem(&mut draw, args.max_s))
        .collect();
    let biggest: Vec<Shape> = problems.iter().map(|(s, _)| s.clone()).collect();
    let check = args.setup.check().map_err(ConfigError::Usage)?;
    let gpus = plan_workers(&args.setup.devices, false, args.setup.backend)?;
    crate::rows::check_host_memory(&biggest, args.setup.check_rows, worker_count(&gpus), 1)?;
    let mut backends = open_workers(
        gpus,
        args.setup.backend,
        &args.setup.kernel,
        None,
        args.emulation_defect,
        &project,
        &crate::shapes::Entry::all(), // fuzz draws every kind of problem
    )?;
    let run_dir = RunDir::create(&args.setup.results_root(project.root.path()))?;
    crate::outln!("{}", backends[0].describe());
    if let Some(line) = workers_line(&backends) {
        crate::outln!("{line}");
    }
    crate::outln!(
        "fuzz: {} problems drawn with seed {}, S up to {}, variants {}",
        args.count,
        args.seed,
        args.max_s,
        backends[0].variants().join(", ")
    );
    let t0 = Instant::now();
    let gates = &project.gates.gates;
    let mut checked = 0;
    let records = crate::trace::work(|| {
        runner::shared(
            &mut as_workers(&mut backends),
            &problems,
            |(shape, _)| runner::predicted_cost(shape),
            |backend, (shape, seed), emit| {
                let record = check_problem(backend, shape, *seed, args, check, gates)?;
                emit(record.clone());
                Ok(record)
            },
            |_, record: FuzzRecord| {
                if !record.pass {
                    crate::outln!(
                        "FAIL [{}] seed={}: {}\n    reproduce: {}",
                        record.shape,
                        record.seed,
                        record.failures.join("; "),
                        record.reproduce.as_deref().unwrap_or_default()
                    );
                }
                checked += 1;
                if checked % 500 == 0 {
                    crate::outln!("  {checked} / {} checked", problems.len());
                }
            },
        )
    })?;
    let failures = records.iter().filter(|r| !r.pass).count();
    let file = FuzzFile {
        schema_version: SCHEMA_VERSION,
        backend: backends[0].name().to_string(),
        draw_seed: args.seed,
        count: records.len(),
        failures,
        seconds: t0.elapsed().as_secs_f64(),
        all_pass: failures == 0,
        problems: records,
    };
    run_dir.write_json(
        "build_meta.json",
        &build_meta(&project, &backends, started_at),
    )?;
    run_dir.write_json("fuzz.json", &file)?;
    let path = run_dir.commit()?;
    let worst = |f: fn(&FuzzRecord) -> f64| file.problems.iter().map(f).fold(0.0, f64::max);
    crate::outln!(
        "fuzz: {} problems, {} failed, {:.1} s; worst kernel err/bound {:.3}, worst e2e err/bound {:.3}",
        file.count,
        file.failures,
        file.seconds,
        worst(|r| r.kernel_err_over_bound),
        worst(|r| r.end_to_end_err_over_bound)
    );
    crate::outln!("results: {}", path.display());
    crate::trace::mark(|| "published".into());
    Ok(Outcome::from_pass(file.all_pass))
}

/// Checks one problem's every variant on one backend.
fn check_problem(
    backend: &mut dyn Backend,
    shape: &Shape,
    seed: u64,
    args: &FuzzArgs,
    check: runner::Check,
    gates: &Gates,
) -> Result<FuzzRecord, BackendError> {
    let rows = runner::check_all(
        backend,
        std::slice::from_ref(shape),
        &[seed],
        check,
        gates,
        |_| {},
    )?;
    let worst =
        |f: fn(&crate::schema::CorrectnessRecord) -> f64| rows.iter().map(f).fold(0.0, f64::max);
    let failures: Vec<String> = rows
        .iter()
        .flat_map(|r| {
            verdict::failed(&r.gates)
                .map(|f| format!("{}: {f}", r.variant))
                .collect::<Vec<_>>()
        })
        .collect();
    let pass = failures.is_empty();
    Ok(FuzzRecord {
        shape: shape.inline(),
        seed,
        pass,
        kernel_err_over_bound: worst(|r| r.kernel_ref.max_err_over_bound),
        end_to_end_err_over_bound: worst(|r| r.end_to_end.max_err_over_bound),
        references: engines(&rows, |r| &r.references),
        emulation: engines(&rows, |r| &r.emulation),
        reproduce: (!pass).then(|| reproduce(args, shape, seed, backend.gpu())),
        failures,
        gpu: backend.gpu(),
    })
}

/// Largest B·H_q·S_q·S_k a drawn problem may have (the plain draws' largest, 2x4x4096x4096).
const MAX_DRAWN_PAIRS: usize = 1 << 27;

/// One random problem: B in 1..=2; H_q / H_kv of 1, 2, 3, 4 or 8 with H_kv in 1..=2 (H_kv = 1
/// is MQA; a group of 3 gives odd head counts and pairs of query heads that straddle two K/V
/// heads or a batch, where Stage C's short queries do not pack: docs/PERF.md change 14); D 64 or 128; causal or not; S_q = S_k (60%), S_q ≠ S_k drawn apart (25%: S_q > S_k
/// too, whose first rows see no key under a causal mask) or decode (15%: S_q in 1..=16 against
/// a long S_k); each S toward the kernel's tile edges; qk_std mostly in [1/4, 4] (sometimes
/// near the allowed extremes), any distribution. At most [`MAX_DRAWN_PAIRS`] (row, key) pairs.
fn draw_problem(rng: &mut ChaCha8Rng, max_s: usize) -> (Shape, u64) {
    const EDGES: [usize; 18] = [
        31, 32, 33, 63, 64, 65, 127, 128, 129, 191, 192, 193, 255, 256, 257, 511, 512, 513,
    ];
    let draw_s = |rng: &mut ChaCha8Rng| {
        match rng.random_range(0..100) {
            0..40 => rng.random_range(1..=17),
            40..70 => EDGES[rng.random_range(0..EDGES.len())],
            70..93 => rng.random_range(18..=1024),
            93..98 => rng.random_range(1025..=2048),
            _ => rng.random_range(2049..=4096),
        }
        .clamp(1, max_s)
    };
    let (mut s, sk) = match rng.random_range(0..100) {
        0..60 => {
            let s = draw_s(rng);
            (s, s)
        }
        60..85 => (draw_s(rng), draw_s(rng)),
        _ => {
            let long = match rng.random_range(0..2) {
                0 => EDGES[rng.random_range(0..EDGES.len())],
                _ => rng.random_range(129..=8192),
            };
            (rng.random_range(1..=16usize).min(max_s), long.min(max_s))
        }
    };
    let qk_std = if rng.random_range(0..10) == 0 {
        10f64.powf(rng.random_range(-2.0..=1.3))
    } else {
        4f64.powf(rng.random_range(-1.0..=1.0))
    };
    let qk_std = (qk_std * 1000.0).round() / 1000.0;
    let group = [1, 2, 3, 4, 8][rng.random_range(0..5)];
    let mut hkv = rng.random_range(1..=2);
    let mut b = rng.random_range(1..=2);
    let d = shapes::HEAD_DIMS[rng.random_range(0..shapes::HEAD_DIMS.len())];
    let causal = rng.random_range(0..2) == 1;
    let dist = Dist::ALL[rng.random_range(0..Dist::ALL.len())];
    if b * hkv * group * s * sk > MAX_DRAWN_PAIRS {
        (b, hkv) = (1, 1);
    }
    while group * s * sk > MAX_DRAWN_PAIRS {
        s = s.div_ceil(2);
    }
    let mut shape = Shape {
        hkv,
        sk,
        causal,
        qk_std: qk_std.max(shapes::QK_STD_MIN),
        dist,
        ..Shape::new("", b, hkv * group, s, d)
    };
    shape.name = shape.inline();
    (shape, rng.random_range(0..1_000_000))
}

/// Where a yardstick of one problem's records (`engine` picks it) was computed: `host` or
/// `device`, or both joined by `+` if its variants' yardsticks (one per KV split) were
/// computed apart.
fn engines(
    records: &[crate::schema::CorrectnessRecord],
    engine: impl Fn(&crate::schema::CorrectnessRecord) -> &str,
) -> String {
    let engines: std::collections::BTreeSet<&str> = records.iter().map(engine).collect();
    engines.into_iter().collect::<Vec<_>>().join("+")
}

/// The command that checks this one problem again, on the GPU that failed it.
fn reproduce(args: &FuzzArgs, shape: &Shape, seed: u64, gpu: Option<GpuSlot>) -> String {
    let mut cmd = format!(
        "sdpa-runner --shapes {} --seeds {seed} --iters 0",
        shape.inline()
    );
    if let Some(gpu) = gpu.filter(|g| g.index != 0) {
        cmd.push_str(&format!(" --devices {}", gpu.index));
    }
    if args.setup.backend == BackendKind::Cpu {
        cmd.push_str(" --backend cpu");
    }
    if let Some(choice) = args
        .setup
        .kernel
        .cp_async
        .and_then(|c| c.to_possible_value())
    {
        cmd.push_str(&format!(" --cp-async {}", choice.get_name()));
    }
    if let Some(defect) = args.emulation_defect.to_possible_value()
        && args.emulation_defect != Defect::None
    {
        cmd.push_str(&format!(" --emulation-defect {}", defect.get_name()));
    }
    for (name, value) in &args.setup.kernel.defines {
        if value.is_empty() {
            cmd.push_str(&format!(" --define {name}"));
        } else {
            cmd.push_str(&format!(" --define {name}={value}"));
        }
    }
    cmd
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drawn_problems_are_valid_cover_the_edges_and_reparse_from_their_inline_name() {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let drawn: Vec<(Shape, u64)> = (0..2000).map(|_| draw_problem(&mut rng, 4096)).collect();
        for (shape, _) in &drawn {
            shape.validate().unwrap();
            let again = Shape::parse_inline(&shape.inline()).unwrap().unwrap();
            assert_eq!(&again, shape);
        }
        let has = |f: &dyn Fn(&Shape) -> bool| drawn.iter().any(|(s, _)| f(s));
        assert!(has(&|s| s.s == 1) && has(&|s| s.s == 65) && has(&|s| s.s > 1024));
        for edge in [1, 127, 128, 129] {
            assert!(
                has(&|s| s.sk == edge) && has(&|s| s.s == edge),
                "S = {edge}"
            );
        }
        for dist in Dist::ALL {
            assert!(has(&|s| s.dist == dist), "{dist:?}");
        }
        for d in shapes::HEAD_DIMS {
            assert!(has(&|s| s.d == d), "D = {d}");
        }
        for group in [1, 2, 3, 4, 8] {
            assert!(
                has(&|s| s.group() == group && s.hkv > 1),
                "H_q/H_kv = {group}"
            );
            assert!(
                has(&|s| s.group() == group && s.hkv == 1),
                "MQA, H_q = {group}"
            );
        }
        assert!(has(&|s| s.causal) && has(&|s| !s.causal));
        assert!(
            has(&|s| s.s <= 16 && s.sk >= 2048),
            "decode against a long S_k"
        );
        assert!(
            has(&|s| s.s <= 16 && s.group() == 3 && s.b == 2 && s.hkv == 1),
            "short queries whose head pairs straddle a batch"
        );
        assert!(
            has(&|s| s.causal && s.s > s.sk),
            "causal rows that see no key"
        );
        assert!(has(&|s| s.s < s.sk) && has(&|s| s.s == s.sk));
        assert!(
            drawn
                .iter()
                .all(|(s, _)| s.b * s.h * s.s * s.sk <= MAX_DRAWN_PAIRS)
        );
        let mut capped = ChaCha8Rng::seed_from_u64(1);
        assert!((0..500).all(|_| draw_problem(&mut capped, 100).0.s <= 100));
    }
}
