//! One (shape, seed) problem: the drawn inputs and their FP8 quantization, which the kernel,
//! the emulation and the kernel reference all read, so they see the same codes.

use crate::fp8::Fp8Tensor;
use crate::inputs::{self, Inputs};
use crate::shapes::Shape;

#[derive(Debug, Clone)]
pub struct Problem {
    /// Unique per construction (clones share it): names this problem's inputs and codes for
    /// [`crate::emulation::clean`]'s memo.
    pub(crate) id: u64,
    pub shape: Shape,
    pub seed: u64,
    pub inputs: Inputs,
    pub q: Fp8Tensor,
    pub k: Fp8Tensor,
    pub v: Fp8Tensor,
    pub softmax_scale: f32,
}

/// Planted host-side defects for `sdpa-runner selftest` (hidden `--host-defect`): each is a
/// mistake a real harness made, and each must fail a correctness gate.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum HostDefect {
    #[default]
    None,
    /// The seed system's quantizer: code = round((x / amax + 1) · 127.5), read by an E4M3
    /// decoder with scale amax / 448.
    SeedQuantizer,
    /// Codes encoded with scale amax / 447 while the kernel decodes with amax / 448.
    Scale447,
    /// One scale per tensor instead of one per (batch, head).
    PerTensorScale,
    /// Inputs drawn from seed 0 whatever the seed.
    SameInputsEverySeed,
    /// V all zeros.
    ZeroV,
}

impl Problem {
    pub fn new(shape: &Shape, seed: u64) -> Self {
        Self::with_host_defect(shape, seed, HostDefect::None)
    }

    /// The problem as a harness with `defect` would build it.
    pub fn with_host_defect(shape: &Shape, seed: u64, defect: HostDefect) -> Self {
        let draw_seed = if defect == HostDefect::SameInputsEverySeed {
            0
        } else {
            seed
        };
        let mut inputs = inputs::generate(shape, draw_seed);
        let (q_len, kv_len) = (shape.s * shape.d, shape.sk * shape.d);
        if defect == HostDefect::ZeroV {
            inputs.v.fill(0.0);
            inputs.checksum =
                inputs::checksum(&[(&inputs.q, q_len), (&inputs.k, kv_len), (&inputs.v, kv_len)]);
        }
        // One scale per (batch, head) slice: Q per query head, K and V per K/V head.
        let quantize = |x: &[f32], head_len: usize| match defect {
            HostDefect::SeedQuantizer => {
                let mut t = Fp8Tensor::quantize(x, head_len);
                for (codes, slice) in t.codes.chunks_mut(head_len).zip(x.chunks(head_len)) {
                    let amax = slice
                        .iter()
                        .fold(0f32, |m, v| m.max(v.abs()))
                        .max(f32::MIN_POSITIVE);
                    for (c, &v) in codes.iter_mut().zip(slice) {
                        *c = ((v / amax + 1.0) * 127.5).round() as u8;
                    }
                }
                t
            }
            HostDefect::Scale447 => {
                let mut t = Fp8Tensor::quantize(x, head_len);
                for ((codes, slice), &scale) in t
                    .codes
                    .chunks_mut(head_len)
                    .zip(x.chunks(head_len))
                    .zip(&t.scales)
                {
                    for (c, &v) in codes.iter_mut().zip(slice) {
                        *c = crate::fp8::encode(v / (scale * 448.0 / 447.0));
                    }
                }
                t
            }
            HostDefect::PerTensorScale => {
                let scale = crate::fp8::scale_for(x);
                Fp8Tensor {
                    codes: x.iter().map(|&v| crate::fp8::encode(v / scale)).collect(),
                    scales: vec![scale; x.len() / head_len],
                    head_len,
                }
            }
            _ => Fp8Tensor::quantize(x, head_len),
        };
        static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        Problem {
            id: NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            shape: shape.clone(),
            seed,
            q: quantize(&inputs.q, q_len),
            k: quantize(&inputs.k, kv_len),
            v: quantize(&inputs.v, kv_len),
            softmax_scale: shape.softmax_scale(),
            inputs,
        }
    }

    /// Elements of the output O.
    pub fn output_len(&self) -> usize {
        self.inputs.q.len()
    }
}
