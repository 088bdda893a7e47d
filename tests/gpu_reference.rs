//! The f64 references computed on the GPU (cuda/reference_f64.cu) against the host's, which
//! the textbook-attention tests pin: on every shape kind and input distribution, for sampled
//! rows and in several head groups, and through a whole check. The two engines sum in other
//! orders, so they differ by f64 roundoff; "equal" here means within a millionth of the
//! error model's own allowance (docs/DESIGN.md "References on the GPU").

mod common;

use sdpa_runner::backend::Backend;
use sdpa_runner::backend::cuda::CudaBackend;
use sdpa_runner::backend::cuda::kernel::KernelSource;
use sdpa_runner::backend::cuda::variant::VariantSpec;
use sdpa_runner::gates::GateFile;
use sdpa_runner::problem::Problem;
use sdpa_runner::reference::{Engine, References};
use sdpa_runner::rows::{CheckRows, RowSet};
use sdpa_runner::runner::{self, Check};
use sdpa_runner::shapes::{Dist, Shape, ShapeCatalog};

/// The largest disagreement the engines may show, as a fraction of the kernel bound (the
/// gate's allowance): f64 roundoff of sums of up to 10^5 terms is below 1e-10 of it.
const AGREE: f64 = 1e-6;

fn backend() -> CudaBackend {
    let root = common::project_root();
    let source = KernelSource::load(
        &root.join("cuda/sdpa_fp8_stage_c_mma.cu"),
        &root.join("cuda"),
    )
    .unwrap();
    CudaBackend::new(source, &[VariantSpec::new(false, &[])]).unwrap()
}

fn shape(b: usize, h: usize, s: usize, qk_std: f64, dist: Dist) -> Shape {
    Shape {
        name: format!("{b}x{h}x{s} {} qk_std {qk_std}", dist.name()),
        b,
        h,
        s,
        d: 64,
        qk_std,
        purpose: String::new(),
        dist,
    }
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
    let sums = b.reference_sums(p, rows).unwrap().expect("a GPU backend");
    References::from_sums(p, b.kv_split(), rows, sums)
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn the_device_references_equal_the_hosts_on_every_shape_kind_and_distribution() {
    let catalog = ShapeCatalog::load(&common::project_root().join("shapes/default.json")).unwrap();
    let mut shapes = catalog.select("all").unwrap();
    for (i, dist) in Dist::ALL.into_iter().enumerate() {
        let qk_std = [1.0, 20.0][i % 2];
        for s in [1, 17, 31, 32, 33, 63, 65, 129, 1000] {
            shapes.push(shape(1, 3, s, qk_std, dist));
        }
    }
    let mut b = backend();
    let mut worst = (0.0, String::new());
    for sh in &shapes {
        for seed in [0, 1] {
            let p = Problem::new(sh, seed);
            let rows = RowSet::all(sh);
            let host = References::compute(&p, b.kv_split(), &rows);
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
fn sampled_rows_in_head_groups_of_any_size_give_the_same_device_references() {
    let sh = shape(2, 3, 3000, 1.0, Dist::Normal);
    let p = Problem::new(&sh, 7);
    let rows = RowSet::sampled(&sh, 7, &[64, 128]);
    assert!(!rows.is_all());
    let mut b = backend();
    let one_group = b.reference_sums_grouped(&p, &rows, u64::MAX).unwrap();
    // One byte: every head is a group of its own.
    let per_head = b.reference_sums_grouped(&p, &rows, 1).unwrap();
    assert_eq!(one_group.o_k, per_head.o_k);
    assert_eq!(one_group.a, per_head.a);
    assert_eq!(one_group.o_e, per_head.o_e);
    assert_eq!(one_group.totals, per_head.totals);
    let device = References::from_sums(&p, b.kv_split(), &rows, per_head);
    let host = References::compute(&p, b.kv_split(), &rows);
    let d = disagreement(&device, &host);
    assert!(d < AGREE, "{d:e} of the bound");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_check_with_device_references_gives_the_verdicts_of_one_with_host_references() {
    let catalog = ShapeCatalog::load(&common::project_root().join("shapes/default.json")).unwrap();
    let shapes = catalog.select("all").unwrap();
    let gates = GateFile::load(&common::project_root().join("gates/default.json"))
        .unwrap()
        .gates;
    let mut b = backend();
    let mut check = |references| {
        let check = Check {
            rows: CheckRows::All,
            references,
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
