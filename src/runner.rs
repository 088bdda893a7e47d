//! The pipeline, one way through: shape + seed -> inputs -> FP8 quantization -> backend run ->
//! metrics against the two references and the emulation -> gates -> one record per
//! (shape, seed, variant); then, with the inputs still loaded, the timing of every variant.

use half::f16;

use crate::backend::{Backend, BackendError, OnDevice};
use crate::emulation::{self, Algorithm};
use crate::gates::Gates;
use crate::metrics::{self, ErrorMetrics};
use crate::problem::{HostDefect, Problem};
use crate::quantizer::{self, Audit};
use crate::reference::{Engine, Model, References};
use crate::report::f16_checksum;
use crate::rows::{CheckRows, RowSet};
use crate::scale_fit;
use crate::schema::CorrectnessRecord;
use crate::schema::Measurement;
use crate::shapes::Shape;
use crate::stats::Summary;
use crate::timing::{self, TimingPlan, VariantTiming};
use crate::verdict::{self, ProblemFacts};

/// What the kernel is held against for one problem, shared by all variants: the references
/// and the clean emulation of the checked rows (`rows`, src/rows.rs), in their compact layout.
pub struct Yardsticks {
    pub rows: RowSet,
    pub refs: References,
    /// Where `refs` were computed: `host` or `device`.
    pub engine: &'static str,
    /// The clean emulation's output of the checked rows and its error against the kernel
    /// reference.
    pub emulation_out: Vec<f16>,
    pub emulation: ErrorMetrics,
    /// Where `emulation_out` was computed: `host` or `device` (the same bits either way).
    pub emulation_engine: &'static str,
    pub facts: ProblemFacts,
    /// How the inputs used E4M3's range (recorded, not a gate).
    pub input_range: quantizer::InputRange,
}

/// A problem's yardsticks, one per algorithm its variants sum in (variants of a base kernel,
/// or builds that split a short query's keys across other CTAs, sum in other chains), each
/// computed when a variant first needs it.
#[derive(Default)]
pub struct YardsticksByAlgorithm(Vec<(Algorithm, Yardsticks)>);

impl YardsticksByAlgorithm {
    /// The yardsticks of `alg` on `p` and `rows`, computed now if no variant needed them yet
    /// (and whether they were).
    pub fn get(
        &mut self,
        backend: &mut dyn Backend,
        check: &Check,
        p: &Problem,
        alg: Algorithm,
        rows: &RowSet,
    ) -> Result<(&Yardsticks, bool), BackendError> {
        let (i, new) = match self.0.iter().position(|(a, _)| *a == alg) {
            Some(i) => (i, false),
            None => {
                let y = Yardsticks::with_backend(backend, check, p, alg, rows.clone())?;
                self.0.push((alg, y));
                (self.0.len() - 1, true)
            }
        };
        Ok((&self.0[i].1, new))
    }
}

impl Yardsticks {
    /// With the references and the emulation computed on the host; `alg`: the kernel's
    /// ([`Backend::algorithm`]), so the emulation sums as it does and the model bounds it.
    pub fn compute(p: &Problem, alg: Algorithm, rows: RowSet) -> Self {
        let refs = References::compute(p, alg, &rows);
        let emulation_out = emulation::clean(p, alg, &rows);
        Self::assemble(p, rows, (refs, "host"), (emulation_out, "host"))
    }

    /// With the references and the emulation each where `check` says
    /// ([`Engine::wants_device`]); what stays on the host is computed (a task of the current
    /// rayon pool) while the device computes the rest. `device` on a backend without a device
    /// is refused (exit 2) before any work; where the device cannot compute one
    /// ([`OnDevice::Unavailable`]: out of memory, the runner's kernel did not build) `auto`
    /// computes it on the host (and records `host`), `device` stops (exit 3). The GPU's
    /// emulation follows the kernel's algorithm and its references the model's reading (its
    /// small weight, its spread), for any manifest kernel; a reading the device cannot serve
    /// (other than FP8 codes) is unavailable in the same way.
    pub fn with_backend(
        backend: &mut dyn Backend,
        check: &Check,
        p: &Problem,
        alg: Algorithm,
        rows: RowSet,
    ) -> Result<Self, BackendError> {
        for (engine, flag) in [
            (check.references, "--references"),
            (check.emulation, "--emulation"),
        ] {
            if engine == Engine::Device && !backend.has_device() {
                return Err(BackendError::Config(format!(
                    "{flag} device: the {} backend has no device; use {flag} host or auto",
                    backend.name()
                )));
            }
        }
        let device = backend.has_device();
        let reading = Model::of(alg).reading();
        let refs_on_device = device && check.references.wants_device(&rows, &p.shape);
        // The GPU emulation follows any algorithm the manifest can describe (one module per
        // head dim and algorithm, cuda/emulation_f32.cu).
        let emulation_on_device = device && check.emulation.wants_device(&rows, &p.shape);
        // The host computes what stays on the host while the device computes the rest; after
        // a fault of the reference kernel the context is unusable, so nothing more is launched.
        // The host's share is a task of this thread's rayon pool (the worker's own, with
        // several workers: src/shard.rs); the device's share stays on this thread, which holds
        // the GPU's context.
        let mut host = None;
        let (sums, emulated) = rayon::in_place_scope(|scope| {
            scope.spawn(|_| {
                let refs = (!refs_on_device).then(|| References::compute(p, alg, &rows));
                let emulation = (!emulation_on_device).then(|| emulation::clean(p, alg, &rows));
                host = Some((refs, emulation));
            });
            let sums = refs_on_device.then(|| backend.reference_sums(p, reading, &rows));
            let emulated = (emulation_on_device && !matches!(sums, Some(Err(_))))
                .then(|| backend.emulation_on_device(p, alg, &rows));
            (sums, emulated)
        });
        let (host_refs, host_emulation) = host.expect("the scope ran the host's task");
        let refs = match (sums.transpose()?, host_refs) {
            (Some(sums), _) => settle(
                sums.map(|sums| References::from_sums(p, alg, &rows, sums)),
                check.references,
                "--references",
                "the references",
                || References::compute(p, alg, &rows),
            )?,
            (None, Some(refs)) => (refs, "host"),
            (None, None) => unreachable!("the references are computed on the device or the host"),
        };
        let emulation_out = match (emulated.transpose()?, host_emulation) {
            (Some(out), _) => settle(out, check.emulation, "--emulation", "the emulation", || {
                emulation::clean(p, alg, &rows)
            })?,
            (None, Some(out)) => (out, "host"),
            (None, None) => unreachable!("the emulation runs on the device or on the host"),
        };
        Ok(Self::assemble(p, rows, refs, emulation_out))
    }

    /// Every row checked: the yardsticks of the calibrated full check.
    pub fn full(p: &Problem, alg: Algorithm) -> Self {
        Self::compute(p, alg, RowSet::all(&p.shape))
    }

    fn assemble(
        p: &Problem,
        rows: RowSet,
        (refs, engine): (References, &'static str),
        (emulation_out, emulation_engine): (Vec<f16>, &'static str),
    ) -> Self {
        let emulation = metrics::measure_compact(
            &emulation_out,
            &refs.kernel,
            &refs.kernel_bound,
            &rows,
            &p.shape,
        );
        let quantizer = [
            (&p.inputs.q, &p.q),
            (&p.inputs.k, &p.k),
            (&p.inputs.v, &p.v),
        ]
        .into_iter()
        .map(|(x, t)| quantizer::audit(x, t))
        .fold(Audit::default(), Audit::add);
        let input_range = quantizer::InputRange::of(p);
        let n = refs.kernel.len().max(1) as f64;
        let facts = ProblemFacts {
            quantizer,
            out_abs_max: refs.kernel.iter().fold(0.0, |m, x| m.max(x.abs())),
            out_abs_mean: refs.kernel.iter().map(|x| x.abs()).sum::<f64>() / n,
        };
        Yardsticks {
            rows,
            refs,
            engine,
            emulation_out,
            emulation,
            emulation_engine,
            facts,
            input_range,
        }
    }
}

/// A yardstick the device was asked for: `got`, or under `auto` what `on_host` computes
/// (with a warning: the host may take far longer than the GPU would have), or under `device`
/// the reason it is unavailable (exit 3).
fn settle<T>(
    got: OnDevice<T>,
    engine: Engine,
    flag: &str,
    what: &str,
    on_host: impl FnOnce() -> T,
) -> Result<(T, &'static str), BackendError> {
    match (got, engine) {
        (OnDevice::Computed(x), _) => Ok((x, "device")),
        (OnDevice::Unavailable(why), Engine::Device) => Err(BackendError::Environment(format!(
            "{flag} device: {why}; {flag} host computes {what} on the host"
        ))),
        (OnDevice::Unavailable(why), _) => {
            eprintln!("warning: {why}; computing {what} on the host");
            Ok((on_host(), "host"))
        }
    }
}

/// Percent of the checked elements whose f16 bits equal the emulation's (`emulation` in the
/// compact layout of `rows`): 100 means the emulation reproduces the kernel exactly. A
/// diagnostic, not a gate (a legitimate change of accumulation order lowers it).
fn bits_equal_pct(out: &[f16], emulation: &[f16], rows: &RowSet, d: usize) -> f64 {
    let same: usize = rows
        .each()
        .map(|(full, compact)| {
            out[full * d..][..d]
                .iter()
                .zip(&emulation[compact * d..][..d])
                .filter(|(a, b)| a.to_bits() == b.to_bits())
                .count()
        })
        .sum();
    100.0 * same as f64 / emulation.len().max(1) as f64
}

/// The largest distance, in steps of the f16 lattice, of a checked element of `out` from the
/// emulation's (`emulation` in the compact layout of `rows`): 0 where the emulation reproduces
/// the kernel exactly; a NaN or infinity against a finite value is `u32::MAX`.
fn max_ulps(out: &[f16], emulation: &[f16], rows: &RowSet, d: usize) -> u32 {
    rows.each()
        .flat_map(|(full, compact)| {
            out[full * d..][..d]
                .iter()
                .zip(&emulation[compact * d..][..d])
        })
        .map(|(&a, &b)| f16_ulp_distance(a, b))
        .max()
        .unwrap_or(0)
}

/// Steps of the f16 lattice between `a` and `b` (+0 and −0 are the same point): the
/// difference of their positions in the ordered f16 values; `u32::MAX` if either is not
/// finite and they differ in bits.
fn f16_ulp_distance(a: f16, b: f16) -> u32 {
    if a.to_bits() == b.to_bits() {
        return 0;
    }
    if !a.is_finite() || !b.is_finite() {
        return u32::MAX;
    }
    // Magnitude bits order the non-negative values; negatives mirror them below zero.
    let ordered = |x: f16| {
        let bits = x.to_bits() as i32;
        if bits & 0x8000 != 0 {
            -(bits & 0x7fff)
        } else {
            bits
        }
    };
    (ordered(a) - ordered(b)).unsigned_abs()
}

/// Judges one backend output and builds its record.
pub fn judge_output(
    backend: &str,
    variant: &str,
    p: &Problem,
    y: &Yardsticks,
    out: &[f16],
    gates: &Gates,
) -> CorrectnessRecord {
    let measure = |reference: &[f64], bound: &[f64]| {
        metrics::measure(out, reference, bound, &y.rows, &p.shape)
    };
    let kernel_ref = measure(&y.refs.kernel, &y.refs.kernel_bound);
    let end_to_end = measure(&y.refs.end_to_end, &y.refs.end_to_end_bound);
    let scale = scale_fit::fit(out, &y.emulation_out, &y.rows, p.shape.d);
    let v = verdict::judge(
        &kernel_ref,
        &end_to_end,
        &y.emulation,
        scale.as_ref(),
        &y.facts,
        &gates.correctness,
    );
    let Shape {
        name,
        b,
        h,
        s,
        d,
        hkv,
        sk,
        causal,
        ..
    } = p.shape.clone();
    CorrectnessRecord {
        shape: name,
        b,
        h,
        s,
        d,
        hkv: Some(hkv),
        sk: Some(sk),
        causal,
        seed: p.seed,
        variant: variant.to_string(),
        backend: backend.to_string(),
        input_checksum: p.inputs.checksum.clone(),
        output_checksum: f16_checksum(out),
        kernel_ref,
        end_to_end,
        emulation_ref: y.emulation.clone(),
        emulation_bits_equal_pct: bits_equal_pct(out, &y.emulation_out, &y.rows, d),
        emulation_max_ulps: Some(max_ulps(out, &y.emulation_out, &y.rows, d)),
        emulation_scale: scale,
        rows_checked: y.rows.count(),
        row_rule: y.rows.rule().to_string(),
        references: y.engine.to_string(),
        emulation: y.emulation_engine.to_string(),
        input_range: y.input_range,
        pass: v.pass(),
        gates: v.checks,
        device: None,
        gpu: None,
    }
}

/// Hooks for showing progress; every method does nothing by default. With several workers
/// (`--devices`) the calls of different problems interleave; each call's record or
/// measurements name their GPU.
pub trait Progress {
    fn record(&mut self, _record: &CorrectnessRecord) {}
    fn rows_chosen(&mut self, _shape: &Shape, _seed: u64, _rows: &RowSet) {}
    fn timing_started(&mut self, _shape: &Shape, _seed: u64, _rounds: usize) {}
    fn timing_round(&mut self) {}
    fn timing_done(&mut self, _measurements: &[Measurement]) {}
}

/// What a worker reports while it runs one problem; the calling thread hands each to the
/// [`Progress`] (src/shard.rs).
enum Event {
    Rows(Shape, u64, RowSet),
    Record(Box<CorrectnessRecord>),
    TimingStarted(Shape, u64, usize),
    TimingRound,
    TimingDone(Vec<Measurement>),
}

impl Event {
    fn show(self, progress: &mut dyn Progress) {
        match self {
            Event::Rows(shape, seed, rows) => progress.rows_chosen(&shape, seed, &rows),
            Event::Record(r) => progress.record(&r),
            Event::TimingStarted(shape, seed, rounds) => {
                progress.timing_started(&shape, seed, rounds)
            }
            Event::TimingRound => progress.timing_round(),
            Event::TimingDone(m) => progress.timing_done(&m),
        }
    }
}

/// What a run produced.
pub struct RunOutput {
    pub records: Vec<CorrectnessRecord>,
    /// Empty when the plan does no timing.
    pub measurements: Vec<Measurement>,
}

/// What a run covers: the problems and how much of each output is held to the references.
pub struct Work<'a> {
    pub shapes: &'a [Shape],
    pub seeds: &'a [u64],
    pub host_defect: HostDefect,
    pub check: Check,
}

impl Work<'_> {
    /// Every (shape, seed), shapes first, in the order given: the order of the result files.
    pub fn problems(&self) -> Vec<(&Shape, u64)> {
        self.shapes
            .iter()
            .flat_map(|shape| self.seeds.iter().map(move |&seed| (shape, seed)))
            .collect()
    }
}

/// How each problem is held to the references: which rows, and where the references and the
/// emulation are computed.
#[derive(Debug, Clone, Copy, Default)]
pub struct Check {
    pub rows: CheckRows,
    pub references: Engine,
    pub emulation: Engine,
}

/// The query-tile sizes the backend's variants launch with, any entry (the sampled rule checks
/// the edges of each).
pub fn query_tiles(backend: &dyn Backend) -> Vec<usize> {
    (0..backend.variants().len())
        .flat_map(|i| backend.query_tiles_of(i))
        .collect()
}

/// The predicted cost of a problem, for sharing problems among workers: its unmasked score
/// elements (B·H·S_q·S_k without a mask), which the kernel, the references and the emulation
/// each grow with.
pub fn predicted_cost(shape: &Shape) -> u128 {
    shape.unmasked_pairs()
}

/// Runs `work(backend, item, emit)` for every item, sharing the items among the backends,
/// one worker thread each (src/shard.rs): the costliest first, each item whole on one
/// backend, the results in the items' order. `cost` predicts each item's cost.
pub fn shared<T, R, P>(
    backends: &mut [&mut dyn Backend],
    items: &[T],
    cost: impl Fn(&T) -> u128,
    work: impl Fn(&mut dyn Backend, &T, &dyn Fn(P)) -> Result<R, BackendError> + Sync,
    on_report: impl FnMut(usize, P),
) -> Result<Vec<R>, BackendError>
where
    T: Sync,
    R: Send,
    P: Send,
{
    let costs: Vec<u128> = items.iter().map(cost).collect();
    crate::shard::run(
        backends,
        items,
        &costs,
        |backend, item, emit| {
            backend.attach_thread()?;
            work(&mut **backend, item, emit)
        },
        on_report,
    )
}

/// For every (shape, seed): checks every variant, then, while the inputs are loaded, times
/// them all in interleaved rounds. With several backends (one per GPU) the problems are
/// shared among them ([`shared`]): a problem's checks, timings and A/B pairs all run on one.
pub fn run_all(
    backends: &mut [&mut dyn Backend],
    work: &Work,
    gates: &Gates,
    plan: &TimingPlan,
    progress: &mut dyn Progress,
) -> Result<RunOutput, BackendError> {
    let problems = work.problems();
    let done = shared(
        backends,
        &problems,
        |(shape, _)| predicted_cost(shape),
        |backend, &(shape, seed), emit| run_problem(backend, shape, seed, work, gates, plan, emit),
        |_, event: Event| event.show(progress),
    )?;
    let mut out = RunOutput {
        records: Vec::new(),
        measurements: Vec::new(),
    };
    for (records, measurements) in done {
        out.records.extend(records);
        out.measurements.extend(measurements);
    }
    Ok(out)
}

/// The gate that a variant whose entry runs more than one launch geometry (query tile) gives
/// the same bits at each (`others`, each at another) as at the one it chose (`output`): every
/// row is computed by the same steps whichever CTA holds it (docs/DESIGN.md "Kernel ABI"), so
/// any element that differs, written or not, is a bug of one geometry.
fn add_geometry_check(record: &mut CorrectnessRecord, output: &[f16], others: &[Vec<f16>]) {
    let check = geometries_differ(output, others);
    record.pass &= check.pass;
    record.gates.insert(GEOMETRY_GATE.into(), check);
}

/// The gate's name in every record.
pub const GEOMETRY_GATE: &str = "launch.geometries_differ";

/// The geometry gate on `output` against `others`: the most elements whose bits differ from
/// it in any one of them (a length that differs counts its missing elements), at most 0.
pub fn geometries_differ(output: &[f16], others: &[Vec<f16>]) -> verdict::Check {
    let differ = others
        .iter()
        .map(|o| {
            let bits = o
                .iter()
                .zip(output)
                .filter(|(a, b)| a.to_bits() != b.to_bits())
                .count();
            bits + o.len().abs_diff(output.len())
        })
        .max()
        .unwrap_or(0);
    verdict::Check::at_most(differ as f64, 0.0)
}

/// One (shape, seed) on one backend: every variant checked, then timed.
fn run_problem(
    backend: &mut dyn Backend,
    shape: &Shape,
    seed: u64,
    work: &Work,
    gates: &Gates,
    plan: &TimingPlan,
    emit: &dyn Fn(Event),
) -> Result<(Vec<CorrectnessRecord>, Vec<Measurement>), BackendError> {
    let gpu = backend.gpu().map_or(0, |g| g.index);
    let mark =
        |what: &str| crate::trace::mark(|| format!("gpu {gpu}: {}/{seed} {what}", shape.name));
    mark("begins");
    let tiles = query_tiles(backend);
    let p = Problem::with_host_defect(shape, seed, work.host_defect);
    mark("inputs");
    let rows = RowSet::choose(work.check.rows, shape, seed, &tiles);
    emit(Event::Rows(shape.clone(), seed, rows.clone()));
    let mut yardsticks = YardsticksByAlgorithm::default();
    backend.load(&p)?;
    mark("loaded");
    let variants = backend.variants().to_vec();
    let mut records = Vec::with_capacity(variants.len());
    for (i, variant) in variants.iter().enumerate() {
        // Launch first: a fault ends the run before the O(S²) host work.
        let output = backend.launch_poisoned(i)?;
        mark("launched");
        let alg = backend.algorithm_of(i, shape);
        let (y, new) = yardsticks.get(backend, &work.check, &p, alg, &rows)?;
        if new {
            mark("yardsticks");
        }
        let mut record = judge_output(backend.name(), variant, &p, y, &output, gates);
        let others = backend.other_geometries(i)?;
        if !others.is_empty() {
            mark("other geometries");
            add_geometry_check(&mut record, &output, &others);
        }
        record.gpu = backend.gpu();
        mark("judged");
        emit(Event::Record(Box::new(record.clone())));
        records.push(record);
    }
    let mut measured = Vec::new();
    if plan.enabled() {
        let plan = warm_up(backend, plan)?;
        emit(Event::TimingStarted(shape.clone(), seed, plan.rounds));
        let timings = measure(backend, &plan, |_| emit(Event::TimingRound))?;
        measured = variants
            .iter()
            .zip(timings)
            .enumerate()
            .map(|(i, (variant, t))| Measurement {
                gpu: backend.gpu(),
                launch: backend.timed_launch(i),
                ..measurement(&p, variant, t)
            })
            .collect();
        emit(Event::TimingDone(measured.clone()));
    }
    Ok((records, measured))
}

/// Warms every variant of the backend's loaded problem up, and returns the plan for it: the
/// run's, with more rounds where its blocks would outlast [`timing::MAX_BLOCK_MS`] at the
/// warm-up's time a launch ([`TimingPlan::for_launch`]: the host's time of all the variants'
/// warm-ups over their launches, with L2 warm; no warm-up, no estimate: the run's plan).
fn warm_up(backend: &mut dyn Backend, plan: &TimingPlan) -> Result<TimingPlan, BackendError> {
    let n = backend.variants().len();
    let started = std::time::Instant::now();
    for v in 0..n {
        backend.warm_up(v, plan.warmup)?;
    }
    let launches = n * plan.warmup;
    let launch_us = (launches > 0).then(|| started.elapsed().as_secs_f64() * 1e6 / launches as f64);
    Ok(plan.for_launch(launch_us))
}

/// Runs the plan's rounds on the backend's loaded problem (warmed up: [`warm_up`]).
fn measure(
    backend: &mut dyn Backend,
    plan: &TimingPlan,
    mut on_round: impl FnMut(usize),
) -> Result<Vec<VariantTiming>, BackendError> {
    let n = backend.variants().len();
    let mut timings = vec![VariantTiming::default(); n];
    for round in 0..plan.rounds {
        for v in plan.order(round, n) {
            let block = backend.time_samples(v, plan.samples_in_round(round), plan)?;
            timings[v].rounds.push(block);
        }
        on_round(round);
    }
    Ok(timings)
}

fn measurement(p: &Problem, variant: &str, t: timing::VariantTiming) -> Measurement {
    let samples = t.samples();
    Measurement {
        shape: p.shape.name.clone(),
        b: p.shape.b,
        h: p.shape.h,
        s: p.shape.s,
        d: p.shape.d,
        hkv: Some(p.shape.hkv),
        sk: Some(p.shape.sk),
        causal: p.shape.causal,
        seed: p.seed,
        input_checksum: p.inputs.checksum.clone(),
        variant: variant.to_string(),
        summary: Summary::of(&samples),
        round_medians_us: t.round_medians(),
        samples_us: samples,
        round_sm_mhz: t.round_sm_mhz(),
        hold_retries: t.hold_retries(),
        hold_expired_blocks: t.hold_expired_blocks(),
        gpu: None,
        launch: None,
    }
}

/// Checks every (shape, seed, variant) without timing, calling `on_record` as records are made.
pub fn check_all(
    backend: &mut dyn Backend,
    shapes: &[Shape],
    seeds: &[u64],
    check: Check,
    gates: &Gates,
    on_record: impl FnMut(&CorrectnessRecord),
) -> Result<Vec<CorrectnessRecord>, BackendError> {
    struct Rows<F>(F);
    impl<F: FnMut(&CorrectnessRecord)> Progress for Rows<F> {
        fn record(&mut self, r: &CorrectnessRecord) {
            (self.0)(r)
        }
    }
    let plan = TimingPlan {
        warmup: 0,
        iters: 0,
        rounds: 0,
        batch: 1,
        l2: timing::L2Mode::Warm,
    };
    let work = Work {
        shapes,
        seeds,
        host_defect: HostDefect::None,
        check,
    };
    Ok(run_all(&mut [backend], &work, gates, &plan, &mut Rows(on_record))?.records)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::CpuBackend;
    use crate::backend::fake::FakeDevice;
    use crate::emulation::Defect;
    use crate::gates::GateFile;

    fn gates() -> Gates {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("gates/default.json");
        GateFile::load(&path).unwrap().gates
    }

    fn shape(s: usize) -> Shape {
        Shape {
            name: format!("s{s}"),
            b: 2,
            h: 2,
            s,
            d: 64,
            qk_std: 1.0,
            purpose: String::new(),
            dist: Default::default(),
            rotate: false,
            hkv: 2,
            sk: s,
            causal: false,
        }
    }

    fn run(defect: Defect, shapes: &[Shape]) -> Vec<CorrectnessRecord> {
        let mut backend = CpuBackend::new(defect);
        check_all(
            &mut backend,
            shapes,
            &[0, 1],
            Check::default(),
            &gates(),
            |_| {},
        )
        .unwrap()
    }

    #[test]
    fn the_predicted_cost_counts_unmasked_pairs_so_decode_is_cheap_and_causal_half() {
        let sh = |t: &str| Shape::parse_inline(t).unwrap().unwrap();
        assert_eq!(
            predicted_cost(&sh("16x32x1x128:sk=8192:hkv=8")),
            16 * 32 * 8192
        );
        assert_eq!(predicted_cost(&sh("1x8x512x64")), 8 * 512 * 512);
        assert_eq!(predicted_cost(&sh("1x8x512x64:causal")), 8 * 512 * 513 / 2);
    }

    #[test]
    fn the_clean_emulation_passes_every_gate_on_awkward_shapes() {
        let records = run(Defect::None, &[shape(1), shape(77), shape(130)]);
        assert_eq!(records.len(), 6);
        for r in &records {
            assert!(r.pass, "{} seed {}: {:?}", r.shape, r.seed, r.gates);
        }
    }

    #[test]
    fn a_skipped_last_kv_tile_is_caught_by_the_error_gates() {
        let records = run(Defect::SkipLastKvTile, &[shape(130)]);
        for r in &records {
            assert!(!r.pass);
            assert!(
                !r.gates["kernel.max_err_over_bound"].pass && !r.gates["relative.max_abs_err"].pass
            );
        }
    }

    #[test]
    fn a_v_scale_off_by_a_fifth_of_a_percent_fails_the_scale_gate_which_measures_it() {
        let records = run(Defect::VScaleOff, &[shape(77), shape(130)]);
        for r in &records {
            let s = &r.gates["emulation.scale"];
            assert!(!s.pass, "{} seed {}: {s:?}", r.shape, r.seed);
            assert!((s.value - 2f64.powi(-9)).abs() < 1e-4, "{s:?}");
        }
        // The clean emulation's slope is 1 exactly, and the record keeps the fit.
        for r in run(Defect::None, &[shape(77)]) {
            assert_eq!(r.gates["emulation.scale"].value, 0.0);
            let fit = r.emulation_scale.expect("the fit is recorded");
            assert_eq!((fit.slope, fit.std_err), (1.0, 0.0));
            assert_eq!(fit.rows, r.rows_checked);
        }
    }

    #[test]
    fn an_unwritten_row_is_caught_by_the_unwritten_count() {
        let records = run(Defect::LeaveRowUnwritten, &[shape(40)]);
        for r in &records {
            assert_eq!(r.kernel_ref.unwritten, 64);
            assert!(!r.gates["unwritten"].pass && !r.pass);
        }
    }

    fn run_rows(defect: Defect, shapes: &[Shape], check_rows: CheckRows) -> Vec<CorrectnessRecord> {
        let mut backend = CpuBackend::new(defect);
        let check = Check {
            rows: check_rows,
            ..Check::default()
        };
        check_all(&mut backend, shapes, &[0], check, &gates(), |_| {}).unwrap()
    }

    #[test]
    fn references_fall_back_to_the_host_without_a_device_unless_the_device_is_demanded() {
        let mut backend = CpuBackend::new(Defect::None);
        // 2 x 2 x 1100 rows of 1100 keys: above auto's 2^22 pairs, so auto asks the device.
        let p = Problem::new(&shape(1100), 0);
        let rows = || RowSet::all(&p.shape);
        assert!(Engine::Auto.wants_device(&rows(), &p.shape));
        assert!(!backend.has_device());
        let y = Yardsticks::with_backend(
            &mut backend,
            &on(Auto, Auto),
            &p,
            Algorithm::STAGE_C,
            rows(),
        )
        .unwrap();
        assert_eq!((y.engine, y.emulation_engine), ("host", "host"));
        for (check, flag) in [
            (on(Device, Auto), "--references host"),
            (on(Auto, Device), "--emulation host"),
        ] {
            let refused =
                Yardsticks::with_backend(&mut backend, &check, &p, Algorithm::STAGE_C, rows());
            assert!(
                matches!(&refused, Err(BackendError::Config(why)) if why.contains(flag)),
                "{:?}",
                refused.err()
            );
        }
    }

    #[test]
    fn references_on_a_backend_without_a_device_are_refused_before_any_work() {
        // Rows of a larger shape: the emulation (or the host references) would panic on them,
        // so only a refusal that comes first returns.
        let p = Problem::new(&shape(20), 0);
        let foreign = RowSet::all(&shape(4000));
        let emulated =
            std::panic::catch_unwind(|| emulation::clean(&p, Algorithm::STAGE_C, &foreign));
        assert!(
            emulated.is_err(),
            "the witness: the emulation cannot run these rows"
        );
        let mut backend = CpuBackend::new(Defect::None);
        for check in [on(Device, Host), on(Host, Device)] {
            let refused = Yardsticks::with_backend(
                &mut backend,
                &check,
                &p,
                Algorithm::STAGE_C,
                foreign.clone(),
            );
            assert!(matches!(refused, Err(BackendError::Config(_))));
        }
    }

    use Engine::{Auto, Device, Host};

    fn all(p: &Problem) -> RowSet {
        RowSet::all(&p.shape)
    }

    /// Where the references and the emulation are asked for, every row checked.
    fn on(references: Engine, emulation: Engine) -> Check {
        Check {
            rows: CheckRows::All,
            references,
            emulation,
        }
    }

    #[test]
    fn a_problem_whose_launches_are_long_is_timed_in_more_rounds_of_short_blocks() {
        let plan = TimingPlan {
            warmup: 2,
            iters: 40,
            rounds: 5,
            batch: 1,
            l2: crate::timing::L2Mode::Warm,
        };
        let mut device = FakeDevice::new(false);
        device.load(&Problem::new(&shape(16), 0)).unwrap();
        // Quick launches keep the plan's rounds: 20 of 2 samples would change only for launches
        // of more than 10 ms (the fake's take microseconds; the margin keeps this test free of
        // the machine's load: a plan of 5 rounds of 8, which changes past 2.5 ms, failed once in
        // a full parallel test run).
        let fine = TimingPlan { rounds: 20, ..plan };
        assert_eq!(warm_up(&mut device, &fine).unwrap(), fine);
        // 4 ms a launch: 5 a block (20 ms), at least 8 rounds; the samples stay 40.
        device.warm_up_launch = std::time::Duration::from_millis(4);
        let long = warm_up(&mut device, &plan).unwrap();
        assert!(long.rounds >= 8 && long.iters == 40, "{long:?}");
        let timings = measure(&mut device, &long, |_| {}).unwrap();
        for t in &timings {
            assert_eq!(t.rounds.len(), long.rounds);
            assert_eq!(t.samples().len(), 40);
            assert!(t.rounds.iter().all(|b| b.samples.len() <= 5));
        }
        // And a whole run records them, each measurement with its rounds' medians; without a
        // warm-up there is no estimate, and the plan's rounds.
        let work = Work {
            shapes: &[shape(16)],
            seeds: &[0],
            host_defect: HostDefect::None,
            check: Check::default(),
        };
        let out = run_all(&mut [&mut device], &work, &gates(), &plan, &mut NoProgress).unwrap();
        for m in &out.measurements {
            assert!(m.round_medians_us.len() >= 8, "{:?}", m.round_medians_us);
            assert_eq!(m.samples_us.len(), 40);
        }
        let cold = TimingPlan { warmup: 0, ..plan };
        let out = run_all(&mut [&mut device], &work, &gates(), &cold, &mut NoProgress).unwrap();
        assert!(
            out.measurements
                .iter()
                .all(|m| m.round_medians_us.len() == 5)
        );
    }

    #[test]
    fn device_sums_are_finished_as_the_hosts_and_recorded_as_device() {
        let p = Problem::new(&shape(100), 0);
        let rows = RowSet::all(&p.shape);
        let mut device = FakeDevice::new(false);
        let y = Yardsticks::with_backend(
            &mut device,
            &on(Device, Host),
            &p,
            Algorithm::STAGE_C,
            rows.clone(),
        )
        .unwrap();
        let host = Yardsticks::compute(&p, Algorithm::STAGE_C, rows.clone());
        assert_eq!((y.engine, device.requests), ("device", 1));
        assert_eq!((y.emulation_engine, device.emulation_requests), ("host", 0));
        assert_eq!(y.refs.kernel, host.refs.kernel);
        assert_eq!(y.refs.end_to_end_bound, host.refs.end_to_end_bound);
        assert_eq!(y.emulation_out, host.emulation_out);
        // Below 2^22 pairs auto keeps the host, and host never asks the device.
        for engine in [Auto, Host] {
            let y = Yardsticks::with_backend(
                &mut device,
                &on(engine, engine),
                &p,
                Algorithm::STAGE_C,
                rows.clone(),
            )
            .unwrap();
            assert_eq!((y.engine, device.requests), ("host", 1));
            assert_eq!((y.emulation_engine, device.emulation_requests), ("host", 0));
        }
    }

    #[test]
    fn the_emulation_goes_to_the_device_by_the_references_rule_and_is_recorded_as_device() {
        let mut device = FakeDevice::new(false);
        let small = Problem::new(&shape(100), 0);
        let y = Yardsticks::with_backend(
            &mut device,
            &on(Host, Device),
            &small,
            Algorithm::STAGE_C,
            all(&small),
        )
        .unwrap();
        assert_eq!((y.engine, device.requests), ("host", 0));
        assert_eq!(
            (y.emulation_engine, device.emulation_requests),
            ("device", 1)
        );
        assert_eq!(
            y.emulation_out,
            emulation::clean(&small, Algorithm::STAGE_C, &all(&small))
        );
        // Above 2^22 checked pairs auto asks the device for both.
        let big = Problem::new(&shape(1100), 0);
        let y = Yardsticks::with_backend(
            &mut device,
            &on(Auto, Auto),
            &big,
            Algorithm::STAGE_C,
            all(&big),
        )
        .unwrap();
        assert_eq!((y.engine, y.emulation_engine), ("device", "device"));
        assert_eq!((device.requests, device.emulation_requests), (1, 2));
        let record = judge_output("fake", "v", &big, &y, &y.emulation_out, &gates());
        assert_eq!(
            (record.references.as_str(), record.emulation.as_str()),
            ("device", "device")
        );
    }

    #[test]
    fn after_a_reference_kernel_fault_nothing_more_is_launched_and_the_run_stops_with_exit_3() {
        let p = Problem::new(&shape(100), 0);
        let mut device = FakeDevice {
            reference_faults: true,
            ..FakeDevice::new(false)
        };
        let stopped = Yardsticks::with_backend(
            &mut device,
            &on(Device, Device),
            &p,
            Algorithm::STAGE_C,
            all(&p),
        );
        assert!(matches!(stopped, Err(BackendError::Environment(_))));
        assert_eq!((device.requests, device.emulation_requests), (1, 0));
    }

    #[test]
    fn a_device_out_of_memory_falls_back_to_the_host_under_auto_and_stops_device_with_exit_3() {
        let p = Problem::new(&shape(1100), 0);
        let rows = || RowSet::all(&p.shape);
        let mut device = FakeDevice::new(true);
        let y =
            Yardsticks::with_backend(&mut device, &on(Auto, Auto), &p, Algorithm::STAGE_C, rows())
                .unwrap();
        assert_eq!((y.engine, device.requests), ("host", 1));
        assert_eq!((y.emulation_engine, device.emulation_requests), ("host", 1));
        assert_eq!(
            y.emulation_out,
            emulation::clean(&p, Algorithm::STAGE_C, &rows())
        );
        for (check, flag) in [
            (on(Device, Host), "--references host"),
            (on(Host, Device), "--emulation host"),
        ] {
            let stopped =
                Yardsticks::with_backend(&mut device, &check, &p, Algorithm::STAGE_C, rows());
            assert!(
                matches!(&stopped, Err(BackendError::Environment(why))
                    if why.contains("out of GPU memory") && why.contains(flag)),
                "{:?}",
                stopped.err()
            );
            let code = crate::error::AppError::from(stopped.err().unwrap()).exit_code();
            assert_eq!(code, crate::error::EXIT_ENVIRONMENT);
        }
    }

    #[test]
    fn a_sampled_check_passes_the_clean_emulation_and_records_its_rows_and_rule() {
        let records = run_rows(Defect::None, &[shape(1000)], CheckRows::Sampled);
        let rows = RowSet::sampled(&shape(1000), 0, &[crate::emulation::ROW_CHUNK]);
        for r in &records {
            assert!(
                r.pass,
                "{:?}",
                crate::verdict::failed(&r.gates)
                    .map(|f| f.to_string())
                    .collect::<Vec<_>>()
            );
            assert_eq!(r.rows_checked, rows.count());
            assert!(r.rows_checked < 4 * 1000 / 2 && r.row_rule.starts_with("sampled"));
            assert_eq!(
                r.kernel_ref.elements,
                4 * 1000 * 64,
                "every element counted"
            );
        }
        let full = run_rows(Defect::None, &[shape(1000)], CheckRows::Auto);
        assert_eq!(
            (full[0].rows_checked, full[0].row_rule.as_str()),
            (4000, "all")
        );
    }

    #[test]
    fn a_sampled_check_catches_a_skipped_kv_tile_and_an_unwritten_row() {
        for defect in [Defect::SkipLastKvTile, Defect::LeaveRowUnwritten] {
            let records = run_rows(defect, &[shape(1000)], CheckRows::Sampled);
            assert!(records.iter().all(|r| !r.pass), "{defect:?}");
        }
    }

    #[test]
    fn a_sampled_check_catches_a_wrong_row_at_a_tile_edge_but_not_one_it_skips() {
        let sh = shape(1000);
        let p = Problem::new(&sh, 0);
        let rows = RowSet::sampled(&sh, 0, &[32]);
        let y = Yardsticks::compute(&p, Algorithm::STAGE_C, rows.clone());
        let whole = crate::emulation::clean(&p, Algorithm::STAGE_C, &RowSet::all(&sh));
        let judge_with_row_scaled = |bh: usize, row: usize| {
            let mut out = whole.clone();
            for x in &mut out[(bh * 1000 + row) * 64..][..64] {
                *x = f16::from_f64(x.to_f64() * 1.05);
            }
            judge_output("cpu", "t", &p, &y, &out, &gates())
        };
        assert!(judge_output("cpu", "t", &p, &y, &whole, &gates()).pass);
        assert!(
            !judge_with_row_scaled(3, 32 * 7).pass,
            "row 224 opens a tile"
        );
        assert!(
            !judge_with_row_scaled(3, 32 * 7 - 1).pass,
            "row 223 closes one"
        );
        let skipped = (0..1000).find(|r| !rows.rows(3).contains(r)).unwrap();
        assert!(
            judge_with_row_scaled(3, skipped).pass,
            "the stated trade: a row outside the sample is not compared"
        );
        // ...but every element is checked for poison and non-finite values.
        for bad in [crate::metrics::POISON, f16::INFINITY] {
            let mut out = whole.clone();
            out[(3 * 1000 + skipped) * 64 + 5] = bad;
            let r = judge_output("cpu", "t", &p, &y, &out, &gates());
            assert!(!r.pass && (!r.gates["unwritten"].pass || !r.gates["nonfinite"].pass));
        }
    }

    #[test]
    fn bits_equal_counts_the_share_of_identical_f16_bit_patterns() {
        let a: Vec<f16> = (0..8).map(|i| f16::from_f32(i as f32 * 0.25)).collect();
        // One row of `d` values, every row checked.
        let pct = |x: &[f16], y: &[f16], d| {
            let mut sh = shape(1);
            (sh.b, sh.h) = (1, 1);
            bits_equal_pct(x, y, &RowSet::all(&sh), d)
        };
        assert_eq!(pct(&a, &a, 8), 100.0);
        let mut b = a.clone();
        b[3] = f16::from_bits(b[3].to_bits() ^ 1); // one last-bit difference
        assert_eq!(pct(&a, &b, 8), 87.5);
        // +0 and -0 are equal numbers but different bits.
        let (z, nz) = ([f16::from_f32(0.0)], [f16::from_f32(-0.0)]);
        assert_eq!(pct(&z, &nz, 1), 0.0);
    }

    #[test]
    fn a_defect_lowers_the_share_of_bits_equal_to_the_emulation() {
        let broken = run(Defect::LeaveRowUnwritten, &[shape(70)]);
        assert!(broken.iter().all(|r| r.emulation_bits_equal_pct < 100.0));
    }

    #[test]
    fn ulp_distance_counts_f16_lattice_steps_across_zero_and_saturates_on_non_finite() {
        let h = f16::from_f32;
        let next = |x: f16, k: u16| f16::from_bits(x.to_bits() + k);
        assert_eq!(f16_ulp_distance(h(1.0), h(1.0)), 0);
        assert_eq!(f16_ulp_distance(h(1.0), next(h(1.0), 3)), 3);
        assert_eq!(f16_ulp_distance(next(h(1.0), 3), h(1.0)), 3);
        // +0 and -0 are one point; the smallest subnormals on either side are 2 steps apart.
        assert_eq!(f16_ulp_distance(h(0.0), h(-0.0)), 0);
        let tiny = f16::from_bits(1);
        assert_eq!(f16_ulp_distance(tiny, -tiny), 2);
        // 1 to 2: the 1024 steps of one binade.
        assert_eq!(f16_ulp_distance(h(1.0), h(2.0)), 1024);
        assert_eq!(f16_ulp_distance(h(1.0), f16::NAN), u32::MAX);
        assert_eq!(f16_ulp_distance(f16::INFINITY, h(65504.0)), u32::MAX);
    }

    #[test]
    fn ulp_distance_compares_each_checked_rows_full_output_with_its_compact_emulation_row() {
        // 2 heads of 1024 rows, sampled: checked rows are a subset, at compact positions that
        // differ from their full ones.
        let mut sh = shape(1024);
        (sh.b, sh.h, sh.hkv, sh.d) = (1, 2, 2, 4);
        let rows = RowSet::sampled(&sh, 0, &[64]);
        assert!(!rows.is_all());
        let d = sh.d;
        let full: Vec<f16> = (0..sh.heads() * sh.s * d)
            .map(|i| f16::from_f32(1.0 + (i % 97) as f32 / 64.0))
            .collect();
        let mut emulation = vec![f16::ZERO; rows.count() * d];
        for (f, c) in rows.each() {
            emulation[c * d..][..d].copy_from_slice(&full[f * d..][..d]);
        }
        assert_eq!(max_ulps(&full, &emulation, &rows, d), 0);
        // 5 steps off in the last checked row, whose full and compact indices differ.
        let (f, c) = rows.each().last().unwrap();
        assert_ne!(f, c);
        emulation[c * d + 1] = f16::from_bits(emulation[c * d + 1].to_bits() + 5);
        assert_eq!(max_ulps(&full, &emulation, &rows, d), 5);
        // A row not checked is not compared.
        let unchecked = (0..sh.heads() * sh.s)
            .find(|r| rows.each().all(|(f, _)| f != *r))
            .unwrap();
        let mut out = full.clone();
        out[unchecked * d] = f16::NAN;
        assert_eq!(max_ulps(&out, &emulation, &rows, d), 5);
    }

    #[test]
    fn the_record_gives_the_largest_ulp_distance_from_the_emulation_zero_for_the_emulation_itself()
    {
        let clean = run(Defect::None, &[shape(70)]);
        assert!(clean.iter().all(|r| r.emulation_max_ulps == Some(0)));
        let broken = run(Defect::SkipLastKvTile, &[shape(70)]);
        assert!(
            broken
                .iter()
                .all(|r| r.emulation_max_ulps.is_some_and(|u| u > 16)),
            "{:?}",
            broken
                .iter()
                .map(|r| r.emulation_max_ulps)
                .collect::<Vec<_>>()
        );
        let unwritten = run(Defect::LeaveRowUnwritten, &[shape(70)]);
        assert!(
            unwritten
                .iter()
                .all(|r| r.emulation_max_ulps == Some(u32::MAX))
        );
    }

    #[test]
    fn timing_measures_every_variant_per_shape_and_seed() {
        let plan = TimingPlan {
            warmup: 1,
            iters: 5,
            rounds: 5,
            batch: 1,
            l2: timing::L2Mode::Warm,
        };
        let mut backend = CpuBackend::new(Defect::None);
        let work = Work {
            shapes: &[shape(20)],
            seeds: &[0, 1],
            host_defect: HostDefect::None,
            check: Check::default(),
        };
        let out = run_all(&mut [&mut backend], &work, &gates(), &plan, &mut NoProgress).unwrap();
        assert_eq!(out.measurements.len(), 2);
        let m = &out.measurements[1];
        assert_eq!(
            (
                m.seed,
                m.variant.as_str(),
                m.samples_us.len(),
                m.round_medians_us.len()
            ),
            (1, "cpu-emu", 5, 5)
        );
        assert!(m.summary.p50 > 0.0 && m.input_checksum == out.records[1].input_checksum);
        assert_eq!(m.launch, None, "the CPU backend launches no kernel");
    }

    #[test]
    fn a_measurement_names_the_launch_it_timed() {
        let plan = TimingPlan {
            warmup: 0,
            iters: 2,
            rounds: 1,
            batch: 1,
            l2: timing::L2Mode::Warm,
        };
        let mut fake = FakeDevice::new(false);
        let launch = crate::schema::LaunchRecord {
            query_rows: 64,
            threads: 256,
            grid: [2, 4, 1],
            function: Some("k_d64_m64".into()),
        };
        fake.timed_launch = Some(launch.clone());
        let work = Work {
            shapes: &[shape(77)],
            seeds: &[0],
            host_defect: HostDefect::None,
            check: Check::default(),
        };
        let out = run_all(&mut [&mut fake], &work, &gates(), &plan, &mut NoProgress).unwrap();
        assert_eq!(out.measurements[0].launch, Some(launch));
        let json = serde_json::to_value(&out.measurements[0]).unwrap();
        assert_eq!(json["launch"]["query_rows"], 64, "{json}");
        assert_eq!(json["launch"]["function"], "k_d64_m64", "{json}");
        // A record from before the function was recorded still reads.
        let old: crate::schema::LaunchRecord =
            serde_json::from_str(r#"{"query_rows":64,"threads":256,"grid":[2,4,1]}"#).unwrap();
        assert_eq!(old.function, None);
    }

    struct NoProgress;
    impl Progress for NoProgress {}

    /// Records and measurements with the worker's GPU and the timings' values taken out: what
    /// must not depend on how many workers ran.
    fn without_gpus_and_times(out: &RunOutput) -> (serde_json::Value, Vec<(String, u64, String)>) {
        let mut records = serde_json::to_value(&out.records).unwrap();
        for r in records.as_array_mut().unwrap() {
            r.as_object_mut().unwrap().remove("gpu");
        }
        let timed = out
            .measurements
            .iter()
            .map(|m| (m.shape.clone(), m.seed, m.variant.clone()))
            .collect();
        (records, timed)
    }

    #[test]
    fn a_run_shared_among_workers_gives_one_workers_records_in_the_same_order() {
        let plan = TimingPlan {
            warmup: 0,
            iters: 2,
            rounds: 2,
            batch: 1,
            l2: timing::L2Mode::Warm,
        };
        let shapes = [shape(17), shape(300), shape(64), shape(129)];
        let work = Work {
            shapes: &shapes,
            seeds: &[0, 1, 2],
            host_defect: HostDefect::None,
            check: Check::default(),
        };
        let run = |workers: &mut [FakeDevice]| {
            let mut workers: Vec<&mut dyn Backend> =
                workers.iter_mut().map(|w| w as &mut dyn Backend).collect();
            run_all(&mut workers, &work, &gates(), &plan, &mut NoProgress).unwrap()
        };
        let one = run(&mut [FakeDevice::gpu(0)]);
        let three = run(&mut [FakeDevice::gpu(0), FakeDevice::gpu(1), FakeDevice::gpu(2)]);
        assert_eq!(without_gpus_and_times(&one), without_gpus_and_times(&three));
        // ...in the order of the work, shapes first, not the queue's (costliest first).
        let mut order: Vec<(String, u64)> = three
            .records
            .iter()
            .map(|r| (r.shape.clone(), r.seed))
            .collect();
        order.dedup();
        let expected: Vec<(String, u64)> = work
            .problems()
            .iter()
            .map(|(sh, seed)| (sh.name.clone(), *seed))
            .collect();
        assert_eq!(order, expected);
        let gpus: std::collections::BTreeSet<usize> = three
            .records
            .iter()
            .map(|r| r.gpu.as_ref().unwrap().index)
            .collect();
        assert!(gpus.len() > 1, "the work was shared: {gpus:?}");
        // A (shape, seed)'s correctness and timings stay on one GPU.
        for m in &three.measurements {
            let r = three
                .records
                .iter()
                .find(|r| (&r.shape, r.seed) == (&m.shape, m.seed))
                .unwrap();
            assert_eq!(r.gpu, m.gpu, "{} seed {}", m.shape, m.seed);
        }
    }

    #[test]
    fn records_carry_checksums_that_repeat_across_runs() {
        let a = run(Defect::None, &[shape(33)]);
        let b = run(Defect::None, &[shape(33)]);
        assert_eq!(a[0].input_checksum, b[0].input_checksum);
        assert_eq!(a[0].output_checksum, b[0].output_checksum);
        assert_ne!(
            a[0].input_checksum, a[1].input_checksum,
            "seeds 0 and 1 differ"
        );
    }
    #[test]
    fn the_sampled_rule_gets_every_query_tile_of_every_variant() {
        // A variant whose D 64 and D 128 entries launch 192- and 128-row tiles: the sampled
        // check covers the edges of both (the fake has one variant, the CPU backend's).
        let mut fake = FakeDevice::new(false);
        assert_eq!(fake.variants().len(), 1);
        assert_eq!(query_tiles(&fake), fake.cpu.query_tiles_of(0));
        fake.tiles = vec![vec![192, 128]];
        assert_eq!(query_tiles(&fake), vec![192, 128]);
    }

    #[test]
    fn a_launch_geometry_that_changes_one_bit_fails_the_row() {
        let run = |flips: Option<Vec<usize>>| {
            let mut fake = FakeDevice::new(false);
            fake.other_geometry_flips = flips;
            let shapes = [shape(77)];
            check_all(&mut fake, &shapes, &[0], Check::default(), &gates(), |_| {}).unwrap()
        };
        // No other geometry: no such gate.
        let r = run(None);
        assert!(r[0].pass && !r[0].gates.contains_key("launch.geometries_differ"));
        // The same bits: the gate passes.
        let r = run(Some(vec![]));
        assert!(r[0].pass && r[0].gates["launch.geometries_differ"].pass);
        // One element's lowest bit, in a row the sampled check may never read: it fails.
        let r = run(Some(vec![2 * 2 * 77 * 64 - 1]));
        let g = &r[0].gates["launch.geometries_differ"];
        assert!(!r[0].pass && !g.pass && g.value == 1.0, "{g:?}");
    }
}
