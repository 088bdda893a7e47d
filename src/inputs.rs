//! Seeded inputs: Q, K, V drawn from normal distributions with ChaCha8, identical on every
//! machine for the same (B, H, S, D, qk_std, seed), and a checksum that proves it.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, StandardNormal};
use sha2::{Digest, Sha256};

use crate::shapes::{Dist, Shape};

/// Bumped whenever the way inputs are drawn changes, so old checksums stop matching.
const INPUT_SCHEME: &str = "sdpa-runner inputs v1";

/// Q, K, V in `[B, H, S, D]` row-major f32.
#[derive(Debug, Clone)]
pub struct Inputs {
    pub q: Vec<f32>,
    pub k: Vec<f32>,
    pub v: Vec<f32>,
    /// sha256 over the little-endian bytes of Q, K and V, in that order.
    pub checksum: String,
}

/// Draws the inputs of one (shape, seed). The shape's name does not enter the seed, so an
/// inline `1x8x512x64` gets the same data as `mission`.
pub fn generate(shape: &Shape, seed: u64) -> Inputs {
    let n = shape.elements().expect("shape was validated");
    let mut rng = ChaCha8Rng::from_seed(rng_seed(shape, seed));
    let qk_std = shape.qk_std as f32;
    let mut draw = |scale: f32| -> Vec<f32> {
        (0..n)
            .map(|_| {
                let x: f32 = StandardNormal.sample(&mut rng);
                x * scale
            })
            .collect()
    };
    let mut q = draw(qk_std);
    let mut k = draw(qk_std);
    let mut v = draw(1.0);
    shape_inputs(shape, &mut rng, &mut q, &mut k, &mut v);
    let checksum = checksum(&[&q, &k, &v]);
    Inputs { q, k, v, checksum }
}

/// Applies the shape's [`Dist`] to the normal draws, per (b, h) slice.
fn shape_inputs(shape: &Shape, rng: &mut ChaCha8Rng, q: &mut [f32], k: &mut [f32], v: &mut [f32]) {
    let (s, d) = (shape.s, shape.d);
    let head_len = s * d;
    for bh in 0..shape.heads() {
        let r = bh * head_len..(bh + 1) * head_len;
        let (q, k, v) = (&mut q[r.clone()], &mut k[r.clone()], &mut v[r]);
        match shape.dist {
            Dist::Normal => {}
            Dist::Outliers => {
                for t in [&mut *q, &mut *k, &mut *v] {
                    for _ in 0..8 {
                        t[rng.random_range(0..head_len)] *= 30.0;
                    }
                }
            }
            Dist::ConstantRows => {
                for j in (4..s).step_by(4) {
                    k.copy_within(0..d, j * d);
                    let c = v[j * d];
                    v[j * d..(j + 1) * d].fill(c);
                }
            }
            Dist::Spike => {
                // Every query gets +u and one key becomes 3u: its score is about 3·|u|²/8 = 24
                // (|u|² = 64) above a typical one, so each row's softmax is nearly one-hot.
                let u: Vec<f32> = (0..d)
                    .map(|_| StandardNormal.sample(&mut *rng))
                    .collect::<Vec<f32>>()
                    .into_iter()
                    .map(|x| x * shape.qk_std as f32)
                    .collect();
                for row in q.chunks_mut(d) {
                    row.iter_mut().zip(&u).for_each(|(x, ui)| *x += ui);
                }
                let j = rng.random_range(0..s);
                k[j * d..(j + 1) * d]
                    .iter_mut()
                    .zip(&u)
                    .for_each(|(x, ui)| *x = 3.0 * ui);
            }
            Dist::HeadScale => {
                for t in [&mut *q, &mut *k, &mut *v] {
                    let f = 30f32.powf(rng.random_range(-1.0f32..=1.0));
                    t.iter_mut().for_each(|x| *x *= f);
                }
            }
        }
    }
}

fn rng_seed(shape: &Shape, seed: u64) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(INPUT_SCHEME.as_bytes());
    for dim in [shape.b, shape.h, shape.s, shape.d] {
        h.update((dim as u64).to_le_bytes());
    }
    h.update(shape.qk_std.to_bits().to_le_bytes());
    h.update(seed.to_le_bytes());
    // Normal draws keep the stream they always had (saved checksums stay valid).
    if !shape.dist.is_normal() {
        h.update(shape.dist.name().as_bytes());
    }
    h.finalize().into()
}

/// Hex sha256 over the little-endian bytes of each tensor in turn.
pub fn checksum(tensors: &[&[f32]]) -> String {
    let mut h = Sha256::new();
    for t in tensors {
        for x in t.iter() {
            h.update(x.to_le_bytes());
        }
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
        Shape {
            name: "t".into(),
            b: 1,
            h: 2,
            s,
            d: 64,
            qk_std: 1.0,
            purpose: String::new(),
            dist: Default::default(),
        }
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
        let sd = |x: &[f32]| {
            (x.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / x.len() as f64).sqrt()
        };
        assert!((sd(&a.q) - 3.0).abs() < 0.1 && (sd(&a.k) - 3.0).abs() < 0.1);
        assert!((sd(&a.v) - 1.0).abs() < 0.05);
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
    fn input_stream_is_pinned() {
        let a = generate(&shape(3), 0);
        assert_eq!(&a.checksum[..16], "ca59469647293c18");
    }
}
