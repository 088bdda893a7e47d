//! One (shape, seed) problem: the drawn inputs and their FP8 quantization, which the kernel,
//! the emulation and the kernel reference all read, so they see the same codes.

use crate::fp8::Fp8Tensor;
use crate::inputs::{self, Inputs};
use crate::shapes::Shape;

#[derive(Debug, Clone)]
pub struct Problem {
    pub shape: Shape,
    pub seed: u64,
    pub inputs: Inputs,
    pub q: Fp8Tensor,
    pub k: Fp8Tensor,
    pub v: Fp8Tensor,
    pub softmax_scale: f32,
}

impl Problem {
    pub fn new(shape: &Shape, seed: u64) -> Self {
        let inputs = inputs::generate(shape, seed);
        let head_len = shape.s * shape.d;
        Problem {
            shape: shape.clone(),
            seed,
            q: Fp8Tensor::quantize(&inputs.q, head_len),
            k: Fp8Tensor::quantize(&inputs.k, head_len),
            v: Fp8Tensor::quantize(&inputs.v, head_len),
            softmax_scale: shape.softmax_scale(),
            inputs,
        }
    }

    /// Elements of the output O.
    pub fn output_len(&self) -> usize {
        self.inputs.q.len()
    }
}
