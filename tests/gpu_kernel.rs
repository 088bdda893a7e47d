//! The kernel on the GPU: both variants correct on the shapes that break kernels first,
//! bit-identical to each other, repeatable, and provably the variants they claim to be.

mod common;

use sdpa_runner::backend::Backend;
use sdpa_runner::backend::cuda::CudaBackend;
use sdpa_runner::backend::cuda::kernel::KernelSource;
use sdpa_runner::backend::cuda::variant::VariantSpec;
use sdpa_runner::emulation;
use sdpa_runner::gates::Gates;
use sdpa_runner::problem::Problem;
use sdpa_runner::reference::Engine;
use sdpa_runner::rows::{CheckRows, RowSet};
use sdpa_runner::runner::{self, Check};
use sdpa_runner::shapes::ShapeCatalog;

fn backend() -> CudaBackend {
    stage_c_backend(&[VariantSpec::new(false, &[]), VariantSpec::new(true, &[])])
}

/// Stage C's builds of `specs`, every entry of each.
fn stage_c_backend(specs: &[VariantSpec]) -> CudaBackend {
    let root = common::project_root();
    let source = KernelSource::load(
        &root.join("cuda/sdpa_fp8_stage_c_mma.cu"),
        &root.join("cuda"),
        &common::kernel_spec("stage-c"),
    )
    .unwrap();
    CudaBackend::with_every_entry(source, specs).unwrap()
}

fn gates() -> Gates {
    common::default_gates()
}

/// `rows`, with the references and the emulation on the GPU (the run's default there for
/// large problems).
fn on_device(rows: CheckRows) -> Check {
    Check {
        rows,
        references: Engine::Device,
        emulation: Engine::Device,
    }
}

fn catalog() -> ShapeCatalog {
    common::catalog()
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn both_variants_pass_every_gate_on_small_mission_partial_tile_and_single_key() {
    let shapes = catalog().select("small,mission,partial77,single").unwrap();
    let mut b = backend();
    let records = runner::check_all(
        &mut b,
        &shapes,
        &[0, 1],
        on_device(CheckRows::All),
        &gates(),
        |_| {},
    )
    .unwrap();
    assert_eq!(records.len(), 4 * 2 * 2);
    for r in &records {
        let failed: Vec<_> = r.gates.iter().filter(|(_, c)| !c.pass).collect();
        assert!(
            r.pass,
            "{} seed {} {}: {failed:?}",
            r.shape, r.seed, r.variant
        );
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn both_variants_pass_and_agree_bit_for_bit_on_gqa_decode_causal_and_d128_problems() {
    // The self-test's configuration problems, a FlashAttention pair at D 128 (causal, S_q <
    // S_k), MQA decode, and causal S_q > S_k (rows that see no key); yardsticks on the host
    // (the GPU's give the same verdicts: tests/gpu_emulation.rs, tests/gpu_reference.rs).
    let shapes = catalog()
        .select("cfg-chunk,cfg-decode,cfg-tall,1x2x113x128:sk=203:causal,2x8x1x64:sk=300:hkv=1,1x4x300x128:sk=77:hkv=2:causal")
        .unwrap();
    assert_both_variants_pass_with_the_same_bits(&mut backend(), &shapes, "cp0 and cp1");
}

/// Checks `shapes` (seeds 0 and 1, every row, yardsticks on the host) with `b`'s two variants:
/// every record passes every gate, and the two outputs of each (shape, seed) have one checksum.
fn assert_both_variants_pass_with_the_same_bits(
    b: &mut CudaBackend,
    shapes: &[sdpa_runner::shapes::Shape],
    which: &str,
) {
    let host = Check {
        rows: CheckRows::All,
        references: Engine::Host,
        emulation: Engine::Host,
    };
    let records = runner::check_all(b, shapes, &[0, 1], host, &gates(), |_| {}).unwrap();
    assert_eq!(records.len(), shapes.len() * 2 * 2);
    for r in &records {
        assert!(
            r.pass,
            "{} seed {} {}: {:?}",
            r.shape, r.seed, r.variant, r.gates
        );
    }
    for pair in records.chunks(2) {
        assert_eq!(
            pair[0].output_checksum, pair[1].output_checksum,
            "{} seed {}: {which} outputs differ",
            pair[0].shape, pair[0].seed
        );
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn query_heads_packed_into_one_cta_give_the_bits_of_one_cta_per_head() {
    // Short GQA/MQA queries (S_q <= 16) run the query heads of a K/V head in one CTA
    // (cuda/sdpa_fp8_stage_c_mma.cu `pack_of`): 4 heads, two a row warp, with S_q <= 8, else 2;
    // NO_HEAD_PACKING runs a CTA per head. Every output bit must be the same.
    // Split KV counts the packs as its working CTAs, so packing may change a problem's split
    // (docs/DESIGN.md "Kernel ABI"): both builds leave it off, and the packing alone is compared.
    let no_split = [("NO_SPLIT_KV".to_string(), String::new())];
    let packed = VariantSpec::new(true, &[]).with_candidate_defines(&no_split);
    let unpacked = packed.with_candidate_defines(&[("NO_HEAD_PACKING".into(), String::new())]);
    assert_two_builds_give_the_same_bits_on_short_queries(
        packed,
        unpacked,
        "packed and unpacked",
        false,
    );
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_causal_grid_of_the_heads_first_gives_the_bits_of_the_query_tiles_first() {
    // The default build publishes SDPA_CAUSAL_HEADS_FIRST: a causal launch's grid is (B*H,
    // query tiles) and the kernel reads its head from x, its tile from y (cta_head, cta_tile);
    // CAUSAL_HEADS_FIRST=0 publishes 0, and the host launches (query tiles, B*H) as before.
    // Both must pass with the same bits: prefill at both head dims with several tiles a head,
    // GQA, S_q > S_k, short queries packed a CTA, and split KV (a causal grid of one tile and
    // gridDim.z CTAs, whose merge checks that the grid holds one query tile).
    let first = VariantSpec::new(true, &[]);
    let tiles_first = first.with_candidate_defines(&[("CAUSAL_HEADS_FIRST".into(), "0".into())]);
    let mut b = stage_c_backend(&[first, tiles_first]);
    let published: Vec<bool> = b
        .identities()
        .iter()
        .map(|i| i.constants.causal_heads_first)
        .collect();
    assert_eq!(published, [true, false]);
    let shapes = catalog()
        .select("2x3x300x64:causal,1x4x200x128:sk=260:hkv=2:causal,cfg-tall,1x12x8x128:sk=100:hkv=2:causal,2x8x16x128:sk=500:hkv=4:causal,1x2x16x128:sk=5000:hkv=1:causal")
        .unwrap();
    assert_both_variants_pass_with_the_same_bits(&mut b, &shapes, "heads-first and tiles-first");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn the_deeper_pipeline_of_short_queries_gives_the_bits_of_the_shallow_one() {
    // Short GQA/MQA queries at D 128 launch with more shared memory and run SHORT_Q_STAGES
    // cp.async stages (`deep_pipeline`); SHORT_Q_STAGES=2 (the entries' own depth) turns it
    // off. SHORT_Q_EXPECT_DEEP makes the deep build trap where such a query reaches the
    // shallow body, so the bits compared are the deep body's (a host that stopped giving the
    // launch its shared memory fails here, not silently).
    let deep = VariantSpec::new(true, &[])
        .with_candidate_defines(&[("SHORT_Q_EXPECT_DEEP".into(), String::new())]);
    let shallow = VariantSpec::new(true, &[])
        .with_candidate_defines(&[("SHORT_Q_STAGES".into(), "2".into())]);
    assert_two_builds_give_the_same_bits_on_short_queries(deep, shallow, "deep and shallow", true);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn keys_split_across_ctas_give_the_emulations_bits_and_pass_every_gate() {
    // Short D 128 queries with few CTAs deal their KV steps to gridDim.z CTAs, the last of
    // which merges every chain (cuda/sdpa_fp8_stage_c_mma.cu `split_kv_end`); the emulation
    // sums them as kv_split x CTAs chains. (shape, chains): two MQA packs of S_k 5000 at one
    // CTA per 128-key step (40 x 2), causal GQA with packs of 4, MHA at S_q 16 (a CTA per head), a
    // partial last step, cfg-pack's odd groups; and two where each CTA runs many steps, strided
    // C apart through its own stage ring (long-decode: 32 CTAs a pack, 8 steps each; MQA at
    // S_k 131072: 64 CTAs, 16 steps each).
    let cases = [
        ("long-decode", 64),
        ("1x8x1x128:sk=131072:hkv=1", 128),
        ("1x8x1x128:sk=5000:hkv=1", 80),
        ("2x8x3x128:sk=3000:hkv=2:causal", 48),
        ("1x4x16x128:sk=2000:hkv=4", 32),
        ("2x4x5x128:sk=777:hkv=1:causal", 14),
        ("cfg-pack", 4),
    ];
    let names: Vec<&str> = cases.iter().map(|(n, _)| *n).collect();
    let shapes = catalog().select(&names.join(",")).unwrap();
    let mut b = backend();
    for (shape, (name, chains)) in shapes.iter().zip(cases) {
        assert_eq!(
            b.algorithm_of(1, shape).kv_split,
            chains,
            "{name}: the host's split"
        );
    }
    assert_both_variants_pass_with_the_same_bits(&mut b, &shapes, "cp0 and cp1");
    // The emulation of the host's split reproduces the output's bits (all but where CUDA's
    // exp2f, within 2 ulps, is not the correctly rounded 2^x the emulation takes, in a rescale
    // or a chain's weight); the emulation of any other chain count reproduces fewer: the
    // output was summed in exactly the chains the host says. (Chains past the row's tiles
    // add empty ones, which change no bit: the others are fewer.)
    for (shape, (name, chains)) in shapes.iter().zip(cases) {
        let p = Problem::new(shape, 3);
        b.load(&p).unwrap();
        let out = b.launch_poisoned(1).unwrap();
        let alg = b.algorithm_of(1, shape);
        let rows = RowSet::all(shape);
        let equal = |kv_split: usize| {
            let emulated = emulation::clean(&p, alg.with_split(kv_split), &rows);
            let same = out
                .iter()
                .zip(&emulated)
                .filter(|(a, e)| a.to_bits() == e.to_bits());
            100.0 * same.count() as f64 / out.len() as f64
        };
        let right = equal(chains);
        let others = [2, chains / 2, chains - 2].map(|c| (c, equal(c)));
        eprintln!("{name}: {right:.2}% of the bits with {chains} chains; others {others:?}");
        assert!(right >= 95.0, "{name}: {right:.2}% with {chains} chains");
        for (c, pct) in others.into_iter().filter(|&(c, _)| c != chains) {
            assert!(
                pct < right,
                "{name}: {c} chains give {pct:.2}%, the host's {chains} {right:.2}%"
            );
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn builds_of_different_splits_sharing_one_problems_workspace_each_write_every_row() {
    // A base kernel and the candidate launch on one problem's buffers, workspace included
    // (src/backend/cuda/launch.rs); where their splits differ, the one's parked states lie
    // where the other's arrival counters would be, unless the counters sit where every
    // split's do. Each must write every row and pass.
    let ours = VariantSpec::new(true, &[]);
    let fewer = ours.with_candidate_defines(&[
        ("SPLIT_KV_CTAS".into(), "64".into()),
        ("SPLIT_KV_CTAS_8".into(), "64".into()),
    ]);
    let mut b = stage_c_backend(&[ours, fewer]);
    let shapes = catalog()
        .select("1x32x1x128:sk=4096:hkv=8,2x8x3x128:sk=3000:hkv=2:causal")
        .unwrap();
    for shape in &shapes {
        let (a, c) = (b.algorithm_of(0, shape), b.algorithm_of(1, shape));
        assert!(
            a.kv_split > c.kv_split && c.kv_split > 2,
            "{}: {a:?} {c:?}",
            shape.name
        );
    }
    let host = Check {
        rows: CheckRows::All,
        references: Engine::Host,
        emulation: Engine::Host,
    };
    for r in runner::check_all(&mut b, &shapes, &[0, 1], host, &gates(), |_| {}).unwrap() {
        assert!(
            r.pass,
            "{} seed {} {}: {:?}",
            r.shape, r.seed, r.variant, r.gates
        );
    }
}

/// Two cp1 builds on the short-query problems: D 128 and causal D 64 (the entries that pack),
/// decode, S_q 8 (the head pairs' edge), 9, 16-query speculative decode and S_q 17 (past
/// short), MQA, groups of 3, 5 and 6 (packs of 4 and of 2 across K/V heads do not pack, others
/// fall back to 2 or 1), packs across a batch boundary, an odd head count, causal rows that
/// see no key (S_q > S_k), and a decode whose 8 steps wrap the 4-stage ring twice; both must
/// pass and give the same bits. `needs_deep`: `a` traps where a short query runs shallow, so
/// on a GPU that cannot run the deeper body the test says it is skipped.
fn assert_two_builds_give_the_same_bits_on_short_queries(
    a: VariantSpec,
    b: VariantSpec,
    which: &str,
    needs_deep: bool,
) {
    let mut backend = stage_c_backend(&[a, b]);
    if needs_deep && backend.identities()[0].constants.smem_bytes_d128_short == 0 {
        // A GPU whose blocks may not have the deeper body's shared memory (sm_86, sm_89: 99
        // KB) runs every short query shallow, and the first build's hook would trap.
        eprintln!("skipped: this GPU cannot give a block the deeper pipeline's shared memory");
        return;
    }
    let shapes = catalog()
        .select("4x8x1x128:sk=300:hkv=2,2x8x16x128:sk=500:hkv=4:causal,2x8x3x64:sk=200:hkv=1:causal,3x3x5x128:sk=129:hkv=1,1x6x16x128:sk=64:hkv=2,1x6x7x128:sk=90:hkv=3,cfg-pack,1x12x8x128:sk=100:hkv=2:causal,3x4x2x64:sk=77:hkv=1:causal,1x8x9x128:sk=150:hkv=1,2x8x1x128:sk=1000:hkv=2,1x8x17x128:sk=300:hkv=2,2x8x8x128:sk=5:hkv=2:causal,2x8x6x64:sk=4:hkv=2:causal")
        .unwrap();
    assert_both_variants_pass_with_the_same_bits(&mut backend, &shapes, which);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn cp_async_does_not_change_a_single_output_bit() {
    let shapes = catalog()
        .select("small,mission,partial300,batched,wide")
        .unwrap();
    let mut b = backend();
    let records = runner::check_all(
        &mut b,
        &shapes,
        &[0],
        on_device(CheckRows::All),
        &gates(),
        |_| {},
    )
    .unwrap();
    for pair in records.chunks(2) {
        assert_eq!(
            (pair[0].variant.as_str(), pair[1].variant.as_str()),
            ("cp0", "cp1")
        );
        assert_eq!(
            pair[0].output_checksum, pair[1].output_checksum,
            "{}: cp0 and cp1 outputs differ; the variants must share numerics",
            pair[0].shape
        );
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn repeated_launches_on_the_same_inputs_are_bit_identical() {
    let shape = catalog().get("mission").unwrap().clone();
    let mut b = backend();
    b.load(&Problem::new(&shape, 0)).unwrap();
    for variant in 0..2 {
        let first = b.launch_poisoned(variant).unwrap();
        for _ in 0..20 {
            let again = b.launch_poisoned(variant).unwrap();
            let diff = first
                .iter()
                .zip(&again)
                .position(|(a, b)| a.to_bits() != b.to_bits());
            assert_eq!(
                diff, None,
                "variant {variant}: first difference at element {diff:?}"
            );
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn variant_identity_proves_which_variant_is_which() {
    let b = backend();
    let ids = b.identities();
    assert_eq!(ids.len(), 2);
    let (cp0, cp1) = (&ids[0], &ids[1]);
    assert_eq!((cp0.name.as_str(), cp1.name.as_str()), ("cp0", "cp1"));
    assert!(!cp0.ptx_has_cp_async && cp1.ptx_has_cp_async);
    assert_eq!((cp0.constants.switch, cp1.constants.switch), (0, 1));
    assert_eq!(cp0.defines, ["USE_CP_ASYNC=0"]);
    assert_eq!(cp1.defines, ["USE_CP_ASYNC=1"]);
    assert_ne!(cp0.ptx_sha256, cp1.ptx_sha256);
    assert!(
        cp1.constants.smem_bytes > cp0.constants.smem_bytes,
        "cp1 adds the staging buffers"
    );
    let g = gates();
    for id in ids {
        let d = id.driver.as_ref().expect("driver resources on a GPU");
        assert!(d.registers_per_thread > 0 && d.max_blocks_per_sm > 0);
        assert_eq!(d.dynamic_smem_bytes, id.constants.smem_bytes);
        // Every other entry was built from a module of its own, with its own resources.
        let others: Vec<String> = id.entries.iter().map(|e| e.entry.suffix()).collect();
        assert_eq!(others, ["d64_causal", "d128", "d128_causal"]);
        for e in &id.entries {
            let r = e.driver.as_ref().expect("each entry's driver resources");
            let smem = if e.entry.d == 128 {
                id.constants.smem_bytes_d128
            } else {
                id.constants.smem_bytes
            };
            assert_eq!(r.dynamic_smem_bytes, smem);
            assert_ne!(e.ptx_sha256, id.ptx_sha256);
        }
        assert!(id.constants.smem_bytes_d128 > id.constants.smem_bytes);
        // Each D 128 module also holds its 32-row companion: the 16-row-warp code, a function
        // of its own with fewer registers than its entry's 32-row warps (178-226 against
        // 246-255 with NVRTC 13.0 since change 31, docs/PERF.md), spill-free.
        let companions: Vec<(String, u32)> = id
            .companions
            .iter()
            .map(|c| (c.entry.suffix(), c.rows))
            .collect();
        assert_eq!(
            companions,
            [("d128".into(), 32), ("d128_causal".into(), 32)]
        );
        for c in &id.companions {
            let r = c
                .driver
                .as_ref()
                .expect("each companion's driver resources");
            let entry = id
                .entries
                .iter()
                .find(|e| e.entry == c.entry)
                .and_then(|e| e.driver.as_ref())
                .expect("the companion's entry");
            assert!(
                r.registers_per_thread < entry.registers_per_thread && r.local_bytes == 0,
                "{c:?} against {entry:?}"
            );
        }
        let v = id.resource_verdict(&g);
        assert!(v.pass(), "{}: {:?}", id.name, v.failures());
        assert_eq!(
            v.checks.len(),
            24,
            "registers, smem, spills and occupancy are all checked, per entry and companion"
        );
    }
    let details = b.details();
    assert!(
        details["device"]["name"]
            .as_str()
            .unwrap()
            .contains("NVIDIA")
    );
    assert!(
        details["variants"][1]["nvrtc_options"]
            .as_array()
            .unwrap()
            .iter()
            .any(|o| o == "-DUSE_CP_ASYNC=1")
    );
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_long_context_passes_a_sampled_check_that_states_its_rows() {
    let shapes = catalog().select("ctx16k").unwrap();
    let mut b = backend();
    let records = runner::check_all(
        &mut b,
        &shapes,
        &[0],
        on_device(CheckRows::Auto),
        &gates(),
        |_| {},
    )
    .unwrap();
    for r in &records {
        assert!(r.pass, "{}: {:?}", r.variant, r.gates);
        assert!(r.row_rule.starts_with("sampled"), "{}", r.row_rule);
        // 16 heads: 512 tile edges x 2 sides + both end tiles + 64 random rows, about 1150 each.
        assert!(
            (16 * 1088..16 * 1300).contains(&r.rows_checked),
            "{}",
            r.rows_checked
        );
        assert_eq!(r.kernel_ref.elements, 16 * 16384 * 64);
    }
}
