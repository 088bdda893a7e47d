//! The f64 references computed on the GPU (cuda/reference_f64.cu) against the host's, which
//! the textbook-attention tests pin: on every shape kind and input distribution, on the
//! configurations (D 128, causal, GQA/MQA, S_q != S_k) under both error models' readings (the
//! spread sums included), for sampled rows in several head groups and launch sizes, sum by
//! sum, and through whole checks of a correct kernel and of planted bugs. The two engines sum in other
//! orders, so they differ by f64 roundoff; "equal" here means within a millionth of the
//! error model's own allowance (docs/DESIGN.md "References on the GPU").

mod common;

use sdpa_runner::backend::Backend;
use sdpa_runner::backend::cuda::CudaBackend;
use sdpa_runner::backend::cuda::groups;
use sdpa_runner::backend::cuda::reference::{self, BLOCKS_PER_LAUNCH};
use sdpa_runner::backend::cuda::variant::VariantSpec;
use sdpa_runner::emulation::Algorithm;
use sdpa_runner::problem::Problem;
use sdpa_runner::reference::{Engine, Model, Reading, References, RowSums};
use sdpa_runner::rows::{CheckRows, RowSet};
use sdpa_runner::runner::{self, Check};
use sdpa_runner::shapes::{Dist, Shape};

/// The largest disagreement the engines may show, as a fraction of the kernel bound (the
/// gate's allowance): f64 roundoff of sums of up to 10^5 terms is below 1e-10 of it.
const AGREE: f64 = 1e-6;

fn backend() -> CudaBackend {
    backend_of(&[VariantSpec::new(false, &[])])
}

fn backend_of(specs: &[VariantSpec]) -> CudaBackend {
    common::gpu_backend(specs)
}

/// The largest |device − host| of the four vectors, each over the host's kernel bound (the
/// references) or over the host's bound itself (the bounds). Where the host's end-to-end bound
/// is infinite (scores so far apart that the model bounds nothing) the device's must be too;
/// any other nonfinite value panics.
fn disagreement(device: &References, host: &References) -> f64 {
    // (device, host, scale, whether the host's value may be infinite)
    let pairs = [
        (&device.kernel, &host.kernel, &host.kernel_bound, false),
        (
            &device.end_to_end,
            &host.end_to_end,
            &host.kernel_bound,
            false,
        ),
        (
            &device.kernel_bound,
            &host.kernel_bound,
            &host.kernel_bound,
            false,
        ),
        (
            &device.end_to_end_bound,
            &host.end_to_end_bound,
            &host.end_to_end_bound,
            true,
        ),
    ];
    let mut worst = 0.0f64;
    for (dev, host, scale, may_be_infinite) in pairs {
        assert_eq!(dev.len(), host.len());
        for ((d, h), s) in dev.iter().zip(host.iter()).zip(scale.iter()) {
            if d == h {
                continue; // the same value (a row that sees no key has zeros throughout)
            }
            if may_be_infinite && h.is_infinite() {
                assert_eq!(d, h, "an infinite end-to-end bound");
                continue;
            }
            assert!(
                d.is_finite() && s.is_finite() && *s > 0.0,
                "device {d}, host {h}, bound {s}"
            );
            worst = worst.max((d - h).abs() / s);
        }
    }
    worst
}

fn device_references(b: &mut CudaBackend, p: &Problem, rows: &RowSet) -> References {
    let reading = Model::of(b.algorithm()).reading();
    let sums = b
        .reference_sums(p, reading, rows)
        .unwrap()
        .computed()
        .unwrap();
    References::from_sums(p, b.algorithm(), rows, sums)
}

/// The device's sums in groups of at most `group_bytes`, `blocks` row blocks per launch.
fn grouped(
    b: &mut CudaBackend,
    p: &Problem,
    rows: &RowSet,
    group_bytes: u64,
    blocks: usize,
) -> RowSums {
    b.reference_sums_grouped(p, Reading::STAGE_C, rows, group_bytes, blocks)
        .unwrap()
        .computed()
        .unwrap()
}

fn assert_same_bits(a: &RowSums, b: &RowSums, what: &str) {
    assert!(
        a.o_k == b.o_k && a.a == b.a && a.o_e == b.o_e,
        "{what}: sums"
    );
    assert!(a.totals == b.totals, "{what}: totals");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn the_device_references_equal_the_hosts_on_every_shape_kind_and_distribution() {
    let catalog = common::catalog();
    let mut shapes = catalog.select("all").unwrap();
    for (i, dist) in Dist::ALL.into_iter().enumerate() {
        let qk_std = [1.0, 20.0][i % 2];
        for s in [1, 17, 31, 32, 33, 63, 65, 129, 1000] {
            shapes.push(common::shape(1, 3, s, qk_std, dist));
        }
    }
    let mut b = backend();
    let mut worst = (0.0, String::new());
    for sh in &shapes {
        for seed in [0, 1] {
            let p = Problem::new(sh, seed);
            let rows = RowSet::all(sh);
            let host = References::compute(&p, b.algorithm(), &rows);
            let device = device_references(&mut b, &p, &rows);
            let d = disagreement(&device, &host);
            assert!(d < AGREE, "{} seed {seed}: {d:e} of the bound", sh.name);
            if d > worst.0 {
                worst = (d, format!("{} seed {seed}", sh.name));
            }
        }
    }
    println!(
        "{} shapes x 2 seeds: worst disagreement {:.2e} of the kernel bound ({})",
        shapes.len(),
        worst.0,
        worst.1
    );
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn the_device_references_equal_the_hosts_on_the_configurations_under_both_models() {
    // Stage C's model reads no spread and counts weights below f16's smallest normal; the
    // implementation model (Stage D's) counts them below e4m3's and sums the spread.
    let mut shapes = common::catalog()
        .select("cfg-chunk,cfg-decode,cfg-tall")
        .unwrap();
    // Each with a distribution of its own, named (a position in Dist::ALL would move with
    // every distribution added).
    for (text, dist) in [
        ("1x4x77x128:hkv=2:causal", Dist::Normal),
        ("2x8x1x64:sk=300:hkv=1", Dist::Spike),
        ("1x2x113x64:sk=203:causal:qk=3", Dist::Sink),
        ("1x2x239x128:sk=1", Dist::PEdge),
        ("1x4x129x128:hkv=1:causal:qk=20", Dist::ConstantRows),
        ("2x4x16x128:sk=1000:hkv=2:causal", Dist::Fa3Outliers),
        ("1x4x300x128:hkv=2", Dist::Negative),
        ("1x2x64x64:sk=2000:hkv=1", Dist::FlatPositiveV),
    ] {
        shapes.push(Shape {
            dist,
            ..Shape::parse_inline(text).unwrap().unwrap()
        });
    }
    let stage_d = Algorithm::of(&common::kernel_spec("stage-d"));
    let mut b = backend();
    let close = |d: f64, h: f64| (d - h).abs() <= 1e-9 * h.abs().max(1e-300);
    let (mut worst, mut spread_elements) = (0.0f64, 0);
    for sh in &shapes {
        let p = Problem::new(sh, 1);
        let rows = RowSet::all(sh);
        for alg in [Algorithm::STAGE_C, stage_d] {
            let model = Model::of(alg);
            let reading = model.reading();
            let host_sums = RowSums::read(&p, &rows, reading);
            let device_sums = b
                .reference_sums(&p, reading, &rows)
                .unwrap()
                .computed()
                .unwrap();
            let what = format!("{} ({}) under {}", sh.name, sh.dims(), alg.describe());
            assert_eq!(device_sums.spread.len(), host_sums.spread.len(), "{what}");
            for (dv, hv) in device_sums.spread.iter().zip(&host_sums.spread) {
                assert!(
                    close(dv.pp, hv.pp) && close(dv.rr, hv.rr),
                    "{what}: {dv:?} vs {hv:?}"
                );
            }
            spread_elements += host_sums.spread.len();
            for (dt, ht) in device_sums.totals.iter().zip(&host_sums.totals) {
                assert_eq!(dt.subnormal_weights, ht.subnormal_weights, "{what}");
            }
            let device = References::finish(&p, &model, &rows, device_sums);
            let host = References::finish(&p, &model, &rows, host_sums);
            let d = disagreement(&device, &host);
            assert!(d < AGREE, "{what}: {d:e} of the bound");
            worst = worst.max(d);
        }
    }
    assert!(
        spread_elements > 0,
        "the implementation model's spread was compared"
    );
    println!(
        "{} configurations x 2 models: worst disagreement {worst:.2e} of the kernel bound",
        shapes.len()
    );
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gqa_causal_sampled_rows_in_head_groups_that_split_a_kv_head_give_the_hosts_references() {
    // As the emulation's test: groups of one and of three query heads start inside a K/V
    // head's group and cross batches; the rows are sampled, so each row's visible keys come
    // from the gathered layout. Both models' readings, the spread included.
    let (sh, p, rows) = common::gqa_causal_sampled();
    let stage_d = Algorithm::of(&common::kernel_spec("stage-d"));
    let mut b = backend();
    for alg in [Algorithm::STAGE_C, stage_d] {
        let model = Model::of(alg);
        let reading = model.reading();
        let head =
            |bh: usize| reference::head_bytes(sh.sk, sh.d, rows.rows(bh).len(), reading.spread);
        let three_heads = common::three_heads(8, head);
        assert_eq!(
            groups::head_groups(8, three_heads, head),
            [0..3, 3..6, 6..8]
        );
        let host = References::finish(&p, &model, &rows, RowSums::read(&p, &rows, reading));
        for (budget, blocks) in [(1, BLOCKS_PER_LAUNCH), (three_heads, 1)] {
            let sums = b
                .reference_sums_grouped(&p, reading, &rows, budget, blocks)
                .unwrap()
                .computed()
                .unwrap();
            let device = References::finish(&p, &model, &rows, sums);
            let d = disagreement(&device, &host);
            assert!(
                d < AGREE,
                "{} in groups of {budget} bytes: {d:e}",
                alg.describe()
            );
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn sampled_rows_in_head_groups_of_any_size_give_the_same_device_references() {
    let sh = common::shape(2, 3, 3000, 1.0, Dist::Normal);
    let p = Problem::new(&sh, 7);
    let rows = RowSet::sampled(&sh, 7, &[64, 128]);
    assert!(!rows.is_all());
    let mut b = backend();
    let (sk, d) = (sh.sk, sh.d);
    let head =
        |bh: usize| reference::head_bytes(sk, d, rows.offset(bh + 1) - rows.offset(bh), false);
    let one_group = grouped(&mut b, &p, &rows, u64::MAX, BLOCKS_PER_LAUNCH);
    assert_eq!(groups::head_groups(rows.heads(), u64::MAX, head).len(), 1);
    // One byte: every head is a group of its own.
    let per_head = grouped(&mut b, &p, &rows, 1, BLOCKS_PER_LAUNCH);
    assert_same_bits(&one_group, &per_head, "one head per group");
    // The largest two neighbouring heads: the six heads go in three groups of two.
    let two_heads = (0..rows.heads() - 1)
        .map(|bh| head(bh) + head(bh + 1))
        .max()
        .unwrap();
    let groups = groups::head_groups(rows.heads(), two_heads, head);
    assert_eq!(groups, [0..2, 2..4, 4..6]);
    let pairs = grouped(&mut b, &p, &rows, two_heads, BLOCKS_PER_LAUNCH);
    assert_same_bits(&one_group, &pairs, "two heads per group");
    // One row block per launch: the chunked launch path, one launch per block.
    let single_blocks = grouped(&mut b, &p, &rows, u64::MAX, 1);
    assert_same_bits(&one_group, &single_blocks, "one row block per launch");
    let device = References::from_sums(&p, b.algorithm(), &rows, per_head);
    let host = References::compute(&p, b.algorithm(), &rows);
    let d = disagreement(&device, &host);
    assert!(d < AGREE, "{d:e} of the bound");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn the_device_sums_equal_the_hosts_sum_by_sum_with_the_same_subnormal_counts() {
    // qk_std 3 and 20 at S = 1000 put many weights below f16's smallest normal, in counts
    // that vary by row (a unit test in src/reference pins the host's count), so the exact
    // comparison of the counts cannot pass on zeros.
    let mut b = backend();
    let close = |d: f64, h: f64| (d - h).abs() <= 1e-12 * h.abs();
    let mut subnormal_rows = 0;
    for (qk_std, dist) in [
        (3.0, Dist::Normal),
        (20.0, Dist::Normal),
        (20.0, Dist::Outliers),
    ] {
        let sh = common::shape(1, 3, 1000, qk_std, dist);
        let p = Problem::new(&sh, 5);
        let rows = RowSet::all(&sh);
        let host = RowSums::on_host(&p, &rows);
        let device = grouped(&mut b, &p, &rows, u64::MAX, BLOCKS_PER_LAUNCH);
        assert_eq!(device.totals.len(), host.totals.len());
        for (i, (d, h)) in device.totals.iter().zip(&host.totals).enumerate() {
            assert_eq!(
                d.subnormal_weights, h.subnormal_weights,
                "{} row {i}",
                sh.name
            );
            assert!(
                close(d.score_shift, h.score_shift) && close(d.l_k, h.l_k) && close(d.l_e, h.l_e),
                "{} row {i}: device {d:?}, host {h:?}",
                sh.name
            );
            subnormal_rows += usize::from(h.subnormal_weights > 0);
        }
    }
    assert!(subnormal_rows > 0, "no row has a subnormal weight");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn planted_bugs_fail_the_same_gates_with_device_references_as_with_host_references() {
    let catalog = common::catalog();
    let shapes = catalog.select("small,partial77,mission").unwrap();
    let gates = common::default_gates();
    let clean = VariantSpec::new(false, &[]);
    let mutants: Vec<VariantSpec> = ["MUTANT_K_SCALE_TWICE", "MUTANT_SKIP_LAST_KV_TILE"]
        .into_iter()
        .map(|m| clean.with_candidate_defines(&[(m.into(), String::new())]))
        .collect();
    let mut b = backend_of(&mutants);
    let mut check = |references| {
        let check = Check {
            rows: CheckRows::All,
            references,
            emulation: Engine::Host,
        };
        runner::check_all(&mut b, &shapes, &[0, 1], check, &gates, |_| {}).unwrap()
    };
    let (device, host) = (check(Engine::Device), check(Engine::Host));
    assert!(device.iter().all(|r| r.references == "device"));
    assert!(host.iter().all(|r| r.references == "host"));
    assert_eq!(device.len(), host.len());
    for (d, h) in device.iter().zip(&host) {
        let what = format!("{} seed {} {}", d.shape, d.seed, d.variant);
        assert_eq!(
            (&d.shape, d.seed, &d.variant),
            (&h.shape, h.seed, &h.variant)
        );
        assert_eq!(d.output_checksum, h.output_checksum, "{what}");
        let (failed_d, failed_h): (Vec<_>, Vec<_>) = (
            d.gates
                .iter()
                .filter(|(_, c)| !c.pass)
                .map(|(g, _)| g)
                .collect(),
            h.gates
                .iter()
                .filter(|(_, c)| !c.pass)
                .map(|(g, _)| g)
                .collect(),
        );
        assert!(!failed_h.is_empty(), "{what}: the planted bug passed");
        assert_eq!(failed_d, failed_h, "{what}");
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_check_with_device_references_gives_the_verdicts_of_one_with_host_references() {
    let catalog = common::catalog();
    let shapes = catalog.select("all").unwrap();
    let gates = common::default_gates();
    let mut b = backend();
    let mut check = |references| {
        let check = Check {
            rows: CheckRows::All,
            references,
            emulation: Engine::Host,
        };
        runner::check_all(&mut b, &shapes, &[0, 1, 2], check, &gates, |_| {}).unwrap()
    };
    let (device, host) = (check(Engine::Device), check(Engine::Host));
    assert_eq!(device.len(), host.len());
    for (d, h) in device.iter().zip(&host) {
        assert_eq!(
            (d.references.as_str(), h.references.as_str()),
            ("device", "host")
        );
        assert_eq!(d.output_checksum, h.output_checksum);
        assert!(d.pass && h.pass, "{} {}: {:?}", d.shape, d.variant, d.gates);
        let same_verdicts = d
            .gates
            .iter()
            .zip(&h.gates)
            .all(|((dk, dc), (hk, hc))| dk == hk && dc.pass == hc.pass);
        assert!(
            same_verdicts && d.gates.len() == h.gates.len(),
            "{}",
            d.shape
        );
        let (rd, rh) = (
            d.kernel_ref.max_err_over_bound,
            h.kernel_ref.max_err_over_bound,
        );
        assert!(
            (rd - rh).abs() <= AGREE * rh.max(1e-3),
            "{}: {rd} vs {rh}",
            d.shape
        );
    }
}
