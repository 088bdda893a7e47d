//! Seeded inputs: Q, K, V drawn from normal distributions with ChaCha8, identical on every
//! machine for the same (B, H, S, D, qk_std, seed), and a checksum that proves it.

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, StandardNormal};
use sha2::{Digest, Sha256};

use crate::shapes::Shape;

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
    let q = draw(qk_std);
    let k = draw(qk_std);
    let v = draw(1.0);
    let checksum = checksum(&[&q, &k, &v]);
    Inputs { q, k, v, checksum }
}

fn rng_seed(shape: &Shape, seed: u64) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(INPUT_SCHEME.as_bytes());
    for dim in [shape.b, shape.h, shape.s, shape.d] {
        h.update((dim as u64).to_le_bytes());
    }
    h.update(shape.qk_std.to_bits().to_le_bytes());
    h.update(seed.to_le_bytes());
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
    fn input_stream_is_pinned() {
        let a = generate(&shape(3), 0);
        assert_eq!(&a.checksum[..16], "ca59469647293c18");
    }
}
