//! The emulation computed on the GPU (cuda/emulation_f32.cu) against the host's
//! (src/emulation/), which the emulation's own tests pin: the same f16 bits on every element,
//! on every shape kind and input distribution, for every KV split from 1 to 4, on the
//! configurations (D 128, causal, GQA/MQA, S_q != S_k, rows that see no key) under every
//! algorithm the manifest describes (Stage C's and Stage D's), for sampled rows in head groups
//! and launches of any size, at long contexts, and through whole checks of a correct kernel
//! and of planted bugs, whose records are then identical (docs/DESIGN.md "The emulation on the
//! GPU").

mod common;

use half::f16;
use sdpa_runner::backend::Backend;
use sdpa_runner::backend::cuda::CudaBackend;
use sdpa_runner::backend::cuda::emulation as cuda_emulation;
use sdpa_runner::backend::cuda::groups;
use sdpa_runner::backend::cuda::reference::BLOCKS_PER_LAUNCH;
use sdpa_runner::backend::cuda::variant::VariantSpec;
use sdpa_runner::emulation::{self, Algorithm};
use sdpa_runner::problem::{HostDefect, Problem};
use sdpa_runner::reference::Engine;
use sdpa_runner::rows::{CheckRows, RowSet};
use sdpa_runner::runner::{self, Check};
use sdpa_runner::shapes::{Dist, Shape};

fn backend_of(specs: &[VariantSpec]) -> CudaBackend {
    common::gpu_backend(specs)
}

fn backend() -> CudaBackend {
    backend_of(&[VariantSpec::new(false, &[])])
}

fn on_device(b: &mut CudaBackend, p: &Problem, alg: Algorithm, rows: &RowSet) -> Vec<f16> {
    b.emulation_on_device(p, alg, rows)
        .unwrap()
        .computed()
        .unwrap()
}

/// Stage D's algorithm as cuda/kernels.toml describes it: 128-key tiles, k32 steps in FP22, P
/// in e4m3, l from the f32 P, Ô per tile.
fn stage_d() -> Algorithm {
    Algorithm::of(&common::kernel_spec("stage-d"))
}

/// Panics at the first element whose bits differ, naming it.
fn assert_same_bits(device: &[f16], host: &[f16], rows: &RowSet, what: &str) {
    assert_eq!(device.len(), host.len(), "{what}: lengths");
    let d = host.len() / rows.count().max(1);
    if let Some(i) = device
        .iter()
        .zip(host)
        .position(|(a, b)| a.to_bits() != b.to_bits())
    {
        let differing = device
            .iter()
            .zip(host)
            .filter(|(a, b)| a.to_bits() != b.to_bits())
            .count();
        let (full_row, _) = rows.each().nth(i / d).unwrap();
        panic!(
            "{what}: {differing} of {} elements differ; first at checked row {} (row {full_row} \
             of the output), column {}: device {:?} ({:#06x}), host {:?} ({:#06x})",
            host.len(),
            i / d,
            i % d,
            device[i],
            device[i].to_bits(),
            host[i],
            host[i].to_bits()
        );
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn the_device_emulation_gives_the_hosts_bits_on_every_shape_distribution_and_split() {
    let mut shapes = common::catalog().select("all").unwrap();
    for (i, dist) in Dist::ALL.into_iter().enumerate() {
        let qk_std = [1.0, 20.0, 0.05][i % 3];
        for s in [1, 17, 31, 32, 33, 63, 64, 65, 129, 200, 1000] {
            shapes.push(common::shape(2, 3, s, qk_std, dist));
        }
    }
    let mut b = backend();
    let mut elements = 0;
    for sh in &shapes {
        for seed in [0, 1] {
            let p = Problem::new(sh, seed);
            let rows = RowSet::all(sh);
            for split in 1..=4 {
                let alg = Algorithm::STAGE_C.with_split(split);
                let host = emulation::clean(&p, alg, &rows);
                let device = on_device(&mut b, &p, alg, &rows);
                let what = format!("{} seed {seed} split {split}", sh.name);
                assert_same_bits(&device, &host, &rows, &what);
                elements += host.len();
            }
        }
    }
    println!(
        "{} shapes x 2 seeds x splits 1-4: {elements} elements, every one the same bits",
        shapes.len()
    );
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn inputs_of_the_planted_host_defects_give_the_same_bits_nan_outputs_included() {
    // The seed system's quantizer writes E4M3 NaN codes: NaN outputs, written as one NaN.
    let mut b = backend();
    let mut nans = 0;
    for defect in [
        HostDefect::SeedQuantizer,
        HostDefect::Scale447,
        HostDefect::PerTensorScale,
        HostDefect::ZeroV,
    ] {
        for sh in common::catalog()
            .select("small,partial77,mission,wide")
            .unwrap()
        {
            let p = Problem::with_host_defect(&sh, 0, defect);
            let rows = RowSet::all(&sh);
            for alg in [Algorithm::STAGE_C, stage_d()] {
                let host = emulation::clean(&p, alg, &rows);
                let device = on_device(&mut b, &p, alg, &rows);
                let what = format!("{defect:?} on {} ({})", sh.name, alg.describe());
                assert_same_bits(&device, &host, &rows, &what);
                nans += host.iter().filter(|x| x.is_nan()).count();
            }
        }
    }
    assert!(nans > 0, "the witness: some outputs are NaN");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn sampled_rows_in_head_groups_of_any_size_give_the_same_device_emulation() {
    let sh = common::shape(2, 3, 3000, 1.0, Dist::Normal);
    let p = Problem::new(&sh, 7);
    let rows = RowSet::sampled(&sh, 7, &[64, 128]);
    assert!(!rows.is_all());
    let mut b = backend();
    let host = emulation::clean(&p, Algorithm::STAGE_C, &rows);
    // The largest two neighbouring heads: the six heads go in three groups of two.
    let head = |bh: usize| cuda_emulation::head_bytes(3000, 64, rows.rows(bh).len(), 2);
    let two_heads = (0..5).map(|bh| head(bh) + head(bh + 1)).max().unwrap();
    assert_eq!(groups::head_groups(6, two_heads, head), [0..2, 2..4, 4..6]);
    // Whole, one head per group (one byte), two heads per group, one row block per launch.
    for (budget, blocks) in [
        (u64::MAX, BLOCKS_PER_LAUNCH),
        (1, BLOCKS_PER_LAUNCH),
        (two_heads, BLOCKS_PER_LAUNCH),
        (u64::MAX, 1),
    ] {
        let device = b
            .emulation_grouped(&p, Algorithm::STAGE_C, &rows, budget, blocks)
            .unwrap()
            .computed()
            .unwrap();
        let what = format!("groups of {budget} bytes, {blocks} blocks per launch");
        assert_same_bits(&device, &host, &rows, &what);
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn the_device_emulation_gives_the_hosts_bits_on_the_configurations_under_every_algorithm() {
    // D 128, causal (bottom-right, and S_q > S_k with rows that see no key), GQA and MQA,
    // decode and chunked prefill, tile edges, on every distribution; Stage C's algorithm with
    // splits 1-3 and Stage D's with 1 and 2.
    let mut shapes = common::catalog()
        .select("cfg-chunk,cfg-decode,cfg-tall")
        .unwrap();
    let inline = [
        "1x4x77x128:hkv=2:causal",
        "2x8x1x64:sk=300:hkv=1",
        "1x2x113x64:sk=203:causal",
        "1x2x239x128:sk=1",
        "1x4x129x128:hkv=1:causal:qk=3",
        "1x2x300x64:sk=100:causal",
        "2x4x16x128:sk=1000:hkv=2:causal",
        "1x2x128x128:sk=256",
    ];
    for (i, text) in inline.iter().enumerate() {
        shapes.push(Shape::parse_inline(text).unwrap().unwrap());
        let dist = Dist::ALL[i % Dist::ALL.len()];
        shapes.push(Shape {
            dist,
            qk_std: [1.0, 20.0, 0.05][i % 3],
            ..Shape::parse_inline(text).unwrap().unwrap()
        });
    }
    let mut algorithms: Vec<Algorithm> =
        (1..=3).map(|k| Algorithm::STAGE_C.with_split(k)).collect();
    algorithms.extend([stage_d(), stage_d().with_split(2)]);
    let mut b = backend();
    let (mut elements, mut zero_rows) = (0, 0);
    for sh in &shapes {
        let p = Problem::new(sh, 3);
        let rows = RowSet::all(sh);
        for &alg in &algorithms {
            let host = emulation::clean(&p, alg, &rows);
            let device = on_device(&mut b, &p, alg, &rows);
            let what = format!("{} ({}) under {}", sh.name, sh.dims(), alg.describe());
            assert_same_bits(&device, &host, &rows, &what);
            elements += host.len();
            zero_rows += host
                .chunks(sh.d)
                .filter(|r| r.iter().all(|x| x.to_bits() == 0))
                .count();
        }
    }
    assert!(
        zero_rows > 0,
        "the witness: some rows see no key and are zeros"
    );
    println!(
        "{} configurations x {} algorithms: {elements} elements, every one the same bits",
        shapes.len(),
        algorithms.len()
    );
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gqa_causal_sampled_rows_in_head_groups_that_split_a_kv_head_give_the_hosts_bits() {
    // Two batches of 4 query heads over 2 K/V heads each: groups of one and of three query
    // heads start inside a K/V head's group and cross batches, so every block's K/V head is
    // taken relative to its group's first.
    let (sh, p, rows) = common::gqa_causal_sampled();
    let head = |bh: usize| cuda_emulation::head_bytes(sh.sk, sh.d, rows.rows(bh).len(), 2);
    let three_heads = common::three_heads(8, head);
    assert_eq!(
        groups::head_groups(8, three_heads, head),
        [0..3, 3..6, 6..8]
    );
    let mut b = backend();
    for alg in [Algorithm::STAGE_C.with_split(2), stage_d()] {
        let host = emulation::clean(&p, alg, &rows);
        for (budget, blocks) in [
            (1, BLOCKS_PER_LAUNCH),
            (three_heads, 1),
            (u64::MAX, BLOCKS_PER_LAUNCH),
        ] {
            let device = b
                .emulation_grouped(&p, alg, &rows, budget, blocks)
                .unwrap()
                .computed()
                .unwrap();
            let what = format!(
                "{} in groups of {budget} bytes, {blocks} blocks",
                alg.describe()
            );
            assert_same_bits(&device, &host, &rows, &what);
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn long_contexts_give_the_same_bits_on_their_sampled_rows() {
    // A D 64 long context under Stage C's algorithm, a causal GQA prefill at D 128 under both
    // algorithms, and a D 128 long context under Stage D's, on the rows a run checks.
    let catalog = common::catalog();
    let cases = [
        ("ctx16k", Algorithm::STAGE_C.with_split(2)),
        ("llama-prefill", Algorithm::STAGE_C.with_split(2)),
        ("llama-prefill", stage_d()),
        ("ctx16k-d128", stage_d()),
    ];
    let mut b = backend();
    for (name, alg) in cases {
        let sh = catalog.select(name).unwrap().remove(0);
        let p = Problem::new(&sh, 0);
        let rows = RowSet::choose(CheckRows::Auto, &sh, 0, &[64, 128]);
        assert!(!rows.is_all());
        // The first call compiles the module: time the second.
        on_device(&mut b, &p, alg, &rows);
        let t = std::time::Instant::now();
        let device = on_device(&mut b, &p, alg, &rows);
        let on_gpu = t.elapsed();
        let t = std::time::Instant::now();
        let host = emulation::clean(&p, alg, &rows);
        let on_host = t.elapsed();
        let what = format!("{name} sampled rows under {}", alg.describe());
        assert_same_bits(&device, &host, &rows, &what);
        println!(
            "{what}: {} rows: device {on_gpu:.2?}, host {on_host:.2?}",
            rows.count()
        );
    }
}

/// Records with the emulation's engine taken out, as JSON.
fn without_engine<T: serde::Serialize>(records: &[T]) -> Vec<serde_json::Value> {
    records
        .iter()
        .map(|r| {
            let mut v = serde_json::to_value(r).unwrap();
            v.as_object_mut().unwrap().remove("emulation");
            v
        })
        .collect()
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn checks_with_the_device_emulation_give_the_records_of_checks_with_the_hosts() {
    // A correct kernel on every default shape, and two planted bugs on three: every record,
    // every figure and gate included, is the same whichever computed the emulation.
    let gates = common::default_gates();
    let clean = VariantSpec::new(false, &[]);
    let mutants: Vec<VariantSpec> = ["MUTANT_K_SCALE_TWICE", "MUTANT_SKIP_LAST_KV_TILE"]
        .into_iter()
        .map(|m| clean.with_candidate_defines(&[(m.into(), String::new())]))
        .collect();
    for (mut b, shapes, planted) in [
        (backend(), common::catalog().select("all").unwrap(), false),
        (
            backend_of(&mutants),
            common::catalog().select("small,partial77,mission").unwrap(),
            true,
        ),
    ] {
        let mut check = |emulation| {
            let check = Check {
                rows: CheckRows::All,
                references: Engine::Host,
                emulation,
            };
            runner::check_all(&mut b, &shapes, &[0, 1], check, &gates, |_| {}).unwrap()
        };
        let (device, host) = (check(Engine::Device), check(Engine::Host));
        assert!(device.iter().all(|r| r.emulation == "device"));
        assert!(host.iter().all(|r| r.emulation == "host"));
        assert!(host.iter().all(|r| r.pass != planted), "the verdicts");
        assert_eq!(without_engine(&device), without_engine(&host));
    }
}
