//! Seeded inputs: Q, K, V drawn from normal distributions with ChaCha8, identical on every
//! machine for the same (B, H, S, D, qk_std, seed), and a checksum that proves it.
//!
//! Each (b, h) slice has its own stream, seeded from the problem and its index, so slices are
//! drawn (and hashed) in parallel and any one can be drawn again alone.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, StandardNormal};
use rayon::prelude::*;
use sha2::{Digest, Sha256};

use crate::shapes::{Dist, Shape};

/// Bumped whenever the way inputs are drawn changes, so old checksums stop matching.
/// v2: one stream per (b, h) slice (v1 drew the whole tensors from one stream).
const INPUT_SCHEME: &str = "sdpa-runner inputs v2";

/// Q in `[B, H_q, S_q, D]`, K and V in `[B, H_kv, S_k, D]`, row-major f32.
#[derive(Debug, Clone)]
pub struct Inputs {
    pub q: Vec<f32>,
    pub k: Vec<f32>,
    pub v: Vec<f32>,
    /// [`checksum`] of Q, K and V.
    pub checksum: String,
}

/// Draws the inputs of one (shape, seed). The shape's name does not enter the seed, so an
/// inline `1x8x512x64` gets the same data as `mission`, and the mask neither: a causal
/// problem reads the same inputs as its unmasked twin.
///
/// Each K/V group (one K/V head and the H_q / H_kv query heads that read it) draws from its
/// own stream: its query heads' Q in order, then K, then V, then the distribution's changes.
/// With H_kv = H_q and S_k = S_q that is the v2 scheme's stream of one (b, h) slice, so plain
/// problems keep their inputs and checksums.
pub fn generate(shape: &Shape, seed: u64) -> Inputs {
    let n = shape.elements().expect("shape was validated");
    let nkv = shape.kv_elements().expect("shape was validated");
    let (q_len, kv_len, g) = (shape.s * shape.d, shape.sk * shape.d, shape.group());
    let problem_seed = problem_seed(shape, seed);
    let (mut q, mut k, mut v) = (vec![0f32; n], vec![0f32; nkv], vec![0f32; nkv]);
    q.par_chunks_mut(q_len * g)
        .zip(k.par_chunks_mut(kv_len))
        .zip(v.par_chunks_mut(kv_len))
        .enumerate()
        .for_each(|(group, ((q, k), v))| {
            let mut rng = ChaCha8Rng::from_seed(head_seed(&problem_seed, group));
            let qk_std = shape.qk_std as f32;
            for (t, scale) in [(&mut *q, qk_std), (&mut *k, qk_std), (&mut *v, 1.0)] {
                for x in t.iter_mut() {
                    let z: f32 = StandardNormal.sample(&mut rng);
                    *x = z * scale;
                }
            }
            shape_group(shape, &mut rng, q, k, v);
            if shape.rotate {
                // Q and K only, as FlashAttention-3 does: the scores, and so the output, stay.
                q.chunks_mut(shape.d)
                    .chain(k.chunks_mut(shape.d))
                    .for_each(hadamard);
            }
        });
    let checksum = checksum(&[(&q, q_len), (&k, kv_len), (&v, kv_len)]);
    Inputs { q, k, v, checksum }
}

/// Applies the shape's [`Dist`] to the normal draws of one K/V group: `q` holds its query
/// heads one after the other.
fn shape_group(shape: &Shape, rng: &mut ChaCha8Rng, q: &mut [f32], k: &mut [f32], v: &mut [f32]) {
    let (sk, d) = (shape.sk, shape.d);
    let q_len = shape.s * d;
    match shape.dist {
        Dist::Normal => {}
        Dist::Outliers => {
            for t in q.chunks_mut(q_len).chain([&mut *k, &mut *v]) {
                let len = t.len();
                for _ in 0..8 {
                    t[rng.random_range(0..len)] *= 30.0;
                }
            }
        }
        Dist::ConstantRows => {
            for j in (4..sk).step_by(4) {
                k.copy_within(0..d, j * d);
                let c = v[j * d];
                v[j * d..(j + 1) * d].fill(c);
            }
        }
        Dist::Spike => {
            // Every query gets +u and one key becomes 3u: its score is about 3·|u|²/8 = 24
            // (|u|² = 64) above a typical one, so each row's softmax is nearly one-hot.
            let u = shared_query_direction(shape, rng, q);
            let j = rng.random_range(0..sk);
            k[j * d..(j + 1) * d]
                .iter_mut()
                .zip(&u)
                .for_each(|(x, ui)| *x = 3.0 * ui);
        }
        Dist::HeadScale => {
            for t in q.chunks_mut(q_len).chain([&mut *k, &mut *v]) {
                let f = 30f32.powf(rng.random_range(-1.0f32..=1.0));
                t.iter_mut().for_each(|x| *x *= f);
            }
        }
        Dist::Sink | Dist::PEdge => {
            let u = shared_query_direction(shape, rng, q);
            // Key 0's score above a typical one: softmax_scale · c · |u|², |u|² ≈ D · qk².
            let c = match shape.dist {
                Dist::PEdge => {
                    let u2: f32 = u.iter().map(|x| x * x).sum();
                    64f32.ln() / (shape.softmax_scale() * u2.max(f32::MIN_POSITIVE))
                }
                _ => 0.5,
            };
            k[..d].iter_mut().zip(&u).for_each(|(x, ui)| *x = c * ui);
        }
        Dist::Negative => {
            // Even query rows +u (every score negative), odd ones −u (every score positive).
            let u = shared_query_direction(shape, rng, q);
            for row in q.chunks_mut(d).skip(1).step_by(2) {
                row.iter_mut().zip(&u).for_each(|(x, ui)| *x -= 2.0 * ui);
            }
            for row in k.chunks_mut(d) {
                row.iter_mut().zip(&u).for_each(|(x, ui)| *x -= 2.0 * ui);
            }
        }
        Dist::HugeV => {
            // Four distinct rows (all of them when S_k <= 4), each scaled once: a row scaled
            // twice would reach 10^6, past f16's largest value, which no f16 output can hold.
            for j in rand::seq::index::sample(rng, sk, sk.min(4)) {
                v[j * d..(j + 1) * d].iter_mut().for_each(|x| *x *= 1000.0);
            }
        }
        Dist::Flat => q.iter_mut().for_each(|x| *x *= 1e-3),
        Dist::FlatPositiveV => {
            q.iter_mut().for_each(|x| *x *= 1e-3);
            v.iter_mut().for_each(|x| *x = x.abs() + 0.5);
        }
        Dist::Fa3Outliers => {
            // N(0, 100) has variance 100: standard deviation 10.
            for x in q.iter_mut().chain(k.iter_mut()).chain(v.iter_mut()) {
                if rng.random::<f32>() < 0.001 {
                    let z: f32 = StandardNormal.sample(&mut *rng);
                    *x += 10.0 * z;
                }
            }
        }
    }
}

/// `x ← x·H` for the normalized Hadamard matrix H of order `x.len()` (a power of two; Sylvester's
/// order, H = Hᵀ = H⁻¹), summed in f64, scaled by 1/√n and rounded to f32: the rotation of
/// [`Shape::rotate`], which spreads an outlier of one element over the whole row.
fn hadamard(x: &mut [f32]) {
    let n = x.len();
    assert!(
        n.is_power_of_two(),
        "the Hadamard rotation needs D a power of two"
    );
    let mut y: Vec<f64> = x.iter().map(|&v| v as f64).collect();
    let mut h = 1;
    while h < n {
        for block in y.chunks_mut(2 * h) {
            let (a, b) = block.split_at_mut(h);
            for (u, w) in a.iter_mut().zip(b) {
                (*u, *w) = (*u + *w, *u - *w);
            }
        }
        h *= 2;
    }
    let norm = (n as f64).sqrt().recip();
    for (out, v) in x.iter_mut().zip(&y) {
        *out = (v * norm) as f32;
    }
}

/// Draws a direction u (D normal draws times qk_std), adds it to every query row of `q` and
/// returns it: the distributions that give one key a score far above the rest build on it.
fn shared_query_direction(shape: &Shape, rng: &mut ChaCha8Rng, q: &mut [f32]) -> Vec<f32> {
    let u: Vec<f32> = (0..shape.d)
        .map(|_| {
            let z: f32 = StandardNormal.sample(&mut *rng);
            z * shape.qk_std as f32
        })
        .collect();
    for row in q.chunks_mut(shape.d) {
        row.iter_mut().zip(&u).for_each(|(x, ui)| *x += ui);
    }
    u
}

/// The seed of the whole problem: the scheme, the dimensions, qk_std, the seed and (for
/// other than normal draws) the distribution.
fn problem_seed(shape: &Shape, seed: u64) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(INPUT_SCHEME.as_bytes());
    for dim in [shape.b, shape.h, shape.s, shape.d] {
        h.update((dim as u64).to_le_bytes());
    }
    // Only where they differ from plain attention, so plain problems keep their streams.
    if shape.hkv != shape.h {
        h.update(b"hkv");
        h.update((shape.hkv as u64).to_le_bytes());
    }
    if shape.sk != shape.s {
        h.update(b"sk");
        h.update((shape.sk as u64).to_le_bytes());
    }
    h.update(shape.qk_std.to_bits().to_le_bytes());
    h.update(seed.to_le_bytes());
    if !shape.dist.is_normal() {
        h.update(shape.dist.name().as_bytes());
    }
    h.finalize().into()
}

/// The seed of K/V group `bh`'s stream (of slice `bh` when there is one query head per group).
fn head_seed(problem: &[u8; 32], bh: usize) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(problem);
    h.update((bh as u64).to_le_bytes());
    h.finalize().into()
}

/// Hex sha256 over the sha256 of each head slice of each tensor in turn (slice hashes over
/// the little-endian bytes), computed in parallel; each tensor comes with its slice length.
pub fn checksum(tensors: &[(&[f32], usize)]) -> String {
    let digests: Vec<[u8; 32]> = tensors
        .iter()
        .flat_map(|(t, head_len)| t.chunks((*head_len).max(1)))
        .collect::<Vec<_>>()
        .into_par_iter()
        .map(|slice| {
            let mut h = Sha256::new();
            let mut buf = Vec::with_capacity(4 * 4096);
            for block in slice.chunks(4096) {
                buf.clear();
                buf.extend(block.iter().flat_map(|x| x.to_le_bytes()));
                h.update(&buf);
            }
            h.finalize().into()
        })
        .collect();
    let mut h = Sha256::new();
    for d in &digests {
        h.update(d);
    }
    hex(&h.finalize())
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(s: usize) -> Shape {
        Shape::new("t", 1, 2, s, 64)
    }

    /// The root mean square of `x`: its spread about zero.
    fn rms(x: &[f32]) -> f64 {
        (x.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / x.len() as f64).sqrt()
    }

    #[test]
    fn same_shape_and_seed_give_identical_inputs() {
        let a = generate(&shape(17), 3);
        let b = generate(&shape(17), 3);
        assert_eq!(a.q, b.q);
        assert_eq!(a.checksum, b.checksum);
    }

    #[test]
    fn different_seeds_and_tensors_differ_and_are_never_zero() {
        let a = generate(&shape(17), 0);
        let b = generate(&shape(17), 1);
        assert_ne!(a.checksum, b.checksum);
        assert_ne!(a.q, a.k);
        assert!(a.q.iter().all(|x| x.is_finite()));
        assert!(a.v.iter().filter(|x| **x == 0.0).count() < 2);
    }

    #[test]
    fn draws_are_standard_normal() {
        let a = generate(&shape(512), 0);
        let n = a.v.len() as f64;
        let mean = a.v.iter().map(|&x| x as f64).sum::<f64>() / n;
        let var = a.v.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / n;
        assert!(
            mean.abs() < 0.05 && (var - 1.0).abs() < 0.05,
            "mean {mean} var {var}"
        );
    }

    #[test]
    fn qk_std_scales_q_and_k_but_not_v() {
        let mut wide = shape(512);
        wide.qk_std = 3.0;
        let a = generate(&wide, 0);
        assert!((rms(&a.q) - 3.0).abs() < 0.1 && (rms(&a.k) - 3.0).abs() < 0.1);
        assert!((rms(&a.v) - 1.0).abs() < 0.05);
    }

    #[test]
    fn negative_draws_make_even_rows_scores_all_negative_and_odd_rows_all_positive() {
        // Stage D's integer row maximum falls back to minima only where a thread's scores of a
        // row are all negative: this distribution must make them so in the even rows, and not
        // in the odd ones, so that in a warp some threads fall back and some do not.
        for d in [64, 128] {
            let mut sh = Shape::new("t", 1, 4, 300, d);
            sh.hkv = 2;
            sh.dist = Dist::Negative;
            for seed in 0..3 {
                let a = generate(&sh, seed);
                let (g, rows) = (sh.group(), sh.s);
                for h in 0..sh.h {
                    let kh = h / g;
                    for i in 0..rows {
                        let q = &a.q[(h * rows + i) * d..][..d];
                        for j in 0..sh.sk {
                            let k = &a.k[(kh * sh.sk + j) * d..][..d];
                            let score: f32 = q.iter().zip(k).map(|(x, y)| x * y).sum();
                            // Rows counted through the K/V head's query heads.
                            let sign = if ((h % g) * rows + i) % 2 == 0 {
                                -1.0
                            } else {
                                1.0
                            };
                            assert!(
                                sign * score > 0.0,
                                "D {d} seed {seed} head {h} ({i}, {j}): {score}"
                            );
                        }
                    }
                }
            }
        }
    }

    /// Pins the input stream: if a dependency upgrade changes the draws, every saved
    /// checksum would silently stop matching, so this must fail loudly instead.
    #[test]
    fn every_distribution_draws_finite_distinct_inputs_and_changes_the_normal_draws() {
        let normal = generate(&shape(200), 4);
        for dist in Dist::ALL.into_iter().skip(1) {
            let mut sh = shape(200);
            sh.dist = dist;
            let a = generate(&sh, 4);
            assert!(
                a.q.iter().chain(&a.k).chain(&a.v).all(|x| x.is_finite()),
                "{dist:?}"
            );
            assert_ne!(a.checksum, normal.checksum, "{dist:?}");
            assert_ne!(a.checksum, generate(&sh, 5).checksum, "{dist:?}");
        }
    }

    #[test]
    fn a_rotated_problem_is_its_q_and_k_times_the_normalized_hadamard_matrix_and_its_v() {
        for (text, d) in [
            ("1x2x5x64:sk=200:hkv=1:dist=fa3_outliers", 64),
            ("1x4x3x128:sk=100:hkv=2:dist=fa3_outliers", 128),
        ] {
            let plain = Shape::parse_inline(text).unwrap().unwrap();
            let rotated = Shape {
                rotate: true,
                ..plain.clone()
            };
            let (a, r) = (generate(&plain, 3), generate(&rotated, 3));
            assert_ne!(a.checksum, r.checksum);
            // H[i][j] = (−1)^popcount(i & j) / √D, applied to each row by hand (f64, within
            // one f32 rounding of the kernel's own order of sums).
            let h =
                |i: usize, j: usize| (-1f64).powi((i & j).count_ones() as i32) / (d as f64).sqrt();
            for (x, y) in [(&a.q, &r.q), (&a.k, &r.k)] {
                for (row, rot) in x.chunks(d).zip(y.chunks(d)) {
                    for (j, &got) in rot.iter().enumerate() {
                        let want: f64 = (0..d).map(|i| row[i] as f64 * h(i, j)).sum();
                        let tol = f32::EPSILON as f64 * want.abs().max(1e-30);
                        assert!((got as f64 - want).abs() <= tol, "{text} element {j}");
                    }
                }
            }
            assert_eq!(a.v, r.v, "V is not rotated: the output stays O");
            // Scores are kept: q·k of the rotated rows is q·k of the drawn ones.
            let dot = |p: &[f32], q: &[f32]| -> f64 {
                p.iter().zip(q).map(|(&x, &y)| x as f64 * y as f64).sum()
            };
            let (s0, s1) = (dot(&a.q[..d], &a.k[..d]), dot(&r.q[..d], &r.k[..d]));
            assert!((s0 - s1).abs() < 1e-5 * (1.0 + s0.abs()), "{s0} {s1}");
            // The largest element shrinks: each outlier of K is spread over its row.
            let peak = |t: &[f32]| t.iter().fold(0f32, |m, x| m.max(x.abs()));
            assert!(peak(&r.k) < peak(&a.k), "{} {}", peak(&r.k), peak(&a.k));
        }
    }

    #[test]
    fn fa3_outliers_add_a_wide_normal_to_about_one_element_in_a_thousand() {
        let mut sh = shape(2048);
        sh.dist = Dist::Fa3Outliers;
        let a = generate(&sh, 1);
        let all: Vec<f32> = a.q.iter().chain(&a.k).chain(&a.v).copied().collect();
        // |N(0,1)| > 6 has probability 2e-9; |N(0,1) + N(0,100)| > 6 about 0.55: expect
        // 0.001 · 0.55 of the elements, within a few standard deviations.
        let wide = all.iter().filter(|x| x.abs() > 6.0).count() as f64 / all.len() as f64;
        assert!((0.0004..0.0007).contains(&wide), "{wide}");
        assert!(all.iter().any(|x| x.abs() > 20.0));
    }

    #[test]
    fn flat_positive_v_makes_every_value_positive_and_the_scores_near_equal() {
        // An O summed over every key in FP22 steps stagnates only where P·V's products share a
        // sign and the weights are alike: a negative value, or a spread of scores, would hide it.
        let mut sh = shape(1024);
        sh.dist = Dist::FlatPositiveV;
        let a = generate(&sh, 3);
        let mean = |x: &[f32]| x.iter().map(|&v| v as f64).sum::<f64>() / x.len() as f64;
        assert!(a.v.iter().all(|&x| x >= 0.5), "every value at least 1/2");
        // E|N(0, 1)| = √(2/π) ≈ 0.798.
        assert!(
            (mean(&a.v) - 1.298).abs() < 0.02,
            "mean |N(0, 1)| + 1/2: {}",
            mean(&a.v)
        );
        assert!(
            (rms(&a.q) - 1e-3).abs() < 5e-5,
            "Q times 10^-3: {}",
            rms(&a.q)
        );
        assert!((rms(&a.k) - 1.0).abs() < 0.05, "K as drawn: {}", rms(&a.k));
    }

    #[test]
    fn huge_v_scales_four_distinct_rows_once_each_even_with_few_keys() {
        for (sk, rows) in [(2, 2), (4, 4), (300, 4)] {
            let mut sh = Shape { sk, ..shape(3) };
            sh.dist = Dist::HugeV;
            let a = generate(&sh, 2);
            let huge =
                a.v.chunks(64)
                    .filter(|r| r.iter().any(|x| x.abs() > 50.0))
                    .count();
            assert_eq!(huge, rows * 2, "S_k {sk}: {rows} rows in each of 2 heads");
            assert!(a.v.iter().all(|x| x.abs() < 1e4), "no row scaled twice");
        }
    }

    #[test]
    fn each_slice_draws_from_its_own_stream_whatever_the_thread_count() {
        let sh = Shape {
            b: 2,
            h: 3,
            hkv: 3,
            ..shape(100)
        };
        let parallel = generate(&sh, 9);
        let one_thread = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap()
            .install(|| generate(&sh, 9));
        assert_eq!(parallel.q, one_thread.q);
        assert_eq!(parallel.checksum, one_thread.checksum);
        let head_len = 100 * 64;
        assert_ne!(parallel.v[..head_len], parallel.v[head_len..2 * head_len]);
        // The checksum covers every slice: one changed value changes it.
        let mut v = parallel.v.clone();
        v[5 * head_len + 7] += 1.0;
        assert_ne!(
            checksum(&[
                (&parallel.q, head_len),
                (&parallel.k, head_len),
                (&v, head_len)
            ]),
            parallel.checksum
        );
    }

    #[test]
    fn input_stream_is_pinned() {
        let a = generate(&shape(3), 0);
        assert_eq!(&a.checksum[..16], "1581dae3a17367c6");
    }
}
