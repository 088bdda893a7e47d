//! The quantizer gate: proves, exactly, that the host's FP8 codes are what the FP8 convention
//! (docs/DESIGN.md "FP8 convention") says the kernel's decoder expects. For every (b, h) slice
//! the scale must be `amax / 448` (1 for an all-zero slice), and every code must decode to an
//! E4M3 value nearest to `x / scale` (ties either way). The oracle is a sorted table of the
//! 253 finite E4M3 magnitudes searched for the nearest one, independent of the encoder.
//!
//! A host quantizer that does not match the decoder (the seed system's
//! `round((x/amax + 1) * 127.5)`, or encoding with `amax / 447` against a decoder using
//! `amax / 448`) fails `not_nearest`; one scale per tensor instead of per (b, h) fails
//! `scale_off`. No statistics, so no flakiness and no tolerance to loosen.

use serde::{Deserialize, Serialize};

use crate::fp8::{self, E4M3_MAX, Fp8Tensor};

/// What the audit of one tensor found.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Audit {
    /// Elements whose code is not a nearest E4M3 value to `x / scale`.
    pub not_nearest: usize,
    /// (b, h) slices whose scale is not `amax / 448`.
    pub scale_off: usize,
    /// (b, h) slices that are all zero (inputs are drawn, never zeros).
    pub zero_slices: usize,
}

impl Audit {
    pub fn add(self, o: Audit) -> Audit {
        Audit {
            not_nearest: self.not_nearest + o.not_nearest,
            scale_off: self.scale_off + o.scale_off,
            zero_slices: self.zero_slices + o.zero_slices,
        }
    }
}

/// Audits `t`, the quantization of `values`.
pub fn audit(values: &[f32], t: &Fp8Tensor) -> Audit {
    use rayon::prelude::*;
    let magnitudes = finite_magnitudes();
    values
        .par_chunks(t.head_len)
        .zip(t.codes.par_chunks(t.head_len))
        .zip(t.scales.par_iter())
        .map(|((slice, codes), &scale)| {
            let mut a = Audit::default();
            let amax = slice.iter().fold(0.0f32, |m, &x| m.max(x.abs()));
            if amax == 0.0 {
                a.zero_slices += 1;
            }
            let expected = if amax == 0.0 { 1.0 } else { amax / E4M3_MAX };
            if scale.to_bits() != expected.to_bits() {
                a.scale_off += 1;
            }
            for (&x, &c) in slice.iter().zip(codes) {
                let target = x / scale;
                let got = fp8::decode(c);
                if got.is_nan() || (got - target).abs() > nearest_distance(&magnitudes, target) {
                    a.not_nearest += 1;
                }
            }
            a
        })
        .reduce(Audit::default, Audit::add)
}

/// How one tensor's values landed in E4M3's range: not a gate (a distribution with
/// outliers pushes most values low on purpose), a fact to show beside the errors.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RangeUse {
    /// `|x / scale|` beyond 464, where rounding alone would not reach ±448: clipped.
    pub saturated: usize,
    /// Non-zero values whose code is zero.
    pub flushed_to_zero: usize,
    /// Codes among E4M3's subnormals (`|x / scale|` below 2^-6, not zero).
    pub subnormal: usize,
    /// Elements of the tensor.
    #[serde(default)]
    pub elements: usize,
}

impl RangeUse {
    fn add(self, o: RangeUse) -> RangeUse {
        RangeUse {
            saturated: self.saturated + o.saturated,
            flushed_to_zero: self.flushed_to_zero + o.flushed_to_zero,
            subnormal: self.subnormal + o.subnormal,
            elements: self.elements + o.elements,
        }
    }

    /// Worth showing: anything clipped, or at least 1% of the tensor below E4M3's normal
    /// range (normal draws flush a value or two of a large tensor: not news).
    pub fn notable(&self) -> bool {
        self.saturated > 0 || 100 * (self.flushed_to_zero + self.subnormal) >= self.elements.max(1)
    }
}

/// [`RangeUse`] of Q, K and V.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct InputRange {
    pub q: RangeUse,
    pub k: RangeUse,
    pub v: RangeUse,
}

impl InputRange {
    /// The range use of a problem's three tensors.
    pub fn of(p: &crate::problem::Problem) -> Self {
        InputRange {
            q: range_use(&p.inputs.q, &p.q),
            k: range_use(&p.inputs.k, &p.k),
            v: range_use(&p.inputs.v, &p.v),
        }
    }

    /// One line for the console, e.g. `V: 0 saturated, 385 flushed to zero, 5352 subnormal`;
    /// `None` unless a tensor is [`RangeUse::notable`].
    pub fn summary(&self) -> Option<String> {
        let parts: Vec<String> = [("Q", &self.q), ("K", &self.k), ("V", &self.v)]
            .into_iter()
            .filter(|(_, r)| r.notable())
            .map(|(n, r)| {
                format!(
                    "{n}: {} saturated, {} flushed to zero, {} subnormal",
                    r.saturated, r.flushed_to_zero, r.subnormal
                )
            })
            .collect();
        (!parts.is_empty()).then(|| parts.join("; "))
    }
}

/// Counts how `values`, quantized as `t`, used E4M3's range.
pub fn range_use(values: &[f32], t: &Fp8Tensor) -> RangeUse {
    use rayon::prelude::*;
    values
        .par_chunks(t.head_len)
        .zip(t.codes.par_chunks(t.head_len))
        .zip(t.scales.par_iter())
        .map(|((slice, codes), &scale)| {
            let mut r = RangeUse {
                elements: slice.len(),
                ..RangeUse::default()
            };
            for (&x, &c) in slice.iter().zip(codes) {
                let magnitude = c & 0x7F;
                if (x / scale).abs() > 464.0 {
                    r.saturated += 1;
                }
                if magnitude == 0 && x != 0.0 {
                    r.flushed_to_zero += 1;
                } else if magnitude != 0 && magnitude >> 3 == 0 {
                    r.subnormal += 1;
                }
            }
            r
        })
        .reduce(RangeUse::default, RangeUse::add)
}

/// The finite non-negative E4M3 values, ascending.
fn finite_magnitudes() -> Vec<f32> {
    let mut m: Vec<f32> = (0..=0x7Eu8).map(fp8::decode).collect();
    m.sort_by(f32::total_cmp);
    m
}

/// Distance from `t` to the nearest value of ±`magnitudes`.
fn nearest_distance(magnitudes: &[f32], t: f32) -> f32 {
    let a = t.abs();
    let i = magnitudes.partition_point(|&m| m < a);
    let above = magnitudes.get(i).map_or(f32::INFINITY, |&m| m - a);
    let below = i
        .checked_sub(1)
        .map_or(f32::INFINITY, |j| a - magnitudes[j]);
    above.min(below)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn range_use_counts_clipped_flushed_and_subnormal_values() {
        // scale 1: 500 clips (and 460 only rounds), 1e-4 flushes to zero, 2^-8 is subnormal.
        let values = [500.0f32, 460.0, 1e-4, 2f32.powi(-8), 1.0, 0.0];
        let t = Fp8Tensor {
            codes: values.iter().map(|&x| fp8::encode(x)).collect(),
            scales: vec![1.0],
            head_len: values.len(),
        };
        let r = range_use(&values, &t);
        assert_eq!(
            r,
            RangeUse {
                saturated: 1,
                flushed_to_zero: 1,
                subnormal: 1,
                elements: 6
            }
        );
        let few = RangeUse {
            flushed_to_zero: 1,
            elements: 1000,
            ..RangeUse::default()
        };
        assert!(
            !few.notable(),
            "one flushed value in a thousand is not news"
        );
        assert!(
            RangeUse {
                subnormal: 10,
                ..few
            }
            .notable()
        );
        let range = InputRange {
            k: r,
            ..Default::default()
        };
        assert_eq!(
            range.summary().unwrap(),
            "K: 1 saturated, 1 flushed to zero, 1 subnormal"
        );
        assert!(InputRange::default().summary().is_none());
    }

    fn values() -> Vec<f32> {
        // Two slices of 64 with different ranges, covering subnormals and ties.
        (0..128)
            .map(|i| {
                let x = ((i as f32) * 0.37).sin() * if i < 64 { 3.0 } else { 0.02 };
                if i == 5 { 0.0 } else { x }
            })
            .collect()
    }

    #[test]
    fn the_runners_own_quantization_passes() {
        let v = values();
        assert_eq!(audit(&v, &Fp8Tensor::quantize(&v, 64)), Audit::default());
    }

    #[test]
    fn encoding_with_amax_over_447_is_not_nearest_under_the_recorded_scale() {
        let v = values();
        let mut t = Fp8Tensor::quantize(&v, 64);
        for ((codes, slice), &scale) in t.codes.chunks_mut(64).zip(v.chunks(64)).zip(&t.scales) {
            for (c, &x) in codes.iter_mut().zip(slice) {
                *c = fp8::encode(x / (scale * 448.0 / 447.0));
            }
        }
        let a = audit(&v, &t);
        assert!(a.not_nearest > 0 && a.scale_off == 0, "{a:?}");
    }

    #[test]
    fn one_scale_per_tensor_is_a_scale_off_in_the_smaller_slice() {
        let v = values();
        let global = fp8::scale_for(&v);
        let t = Fp8Tensor {
            codes: v.iter().map(|&x| fp8::encode(x / global)).collect(),
            scales: vec![global; 2],
            head_len: 64,
        };
        let a = audit(&v, &t);
        assert_eq!((a.scale_off, a.not_nearest), (1, 0), "{a:?}");
    }

    #[test]
    fn an_all_zero_slice_is_counted() {
        let mut v = values();
        v[64..].fill(0.0);
        let a = audit(&v, &Fp8Tensor::quantize(&v, 64));
        assert_eq!(a.zero_slices, 1);
    }

    #[test]
    fn nearest_distance_handles_saturation_and_zero() {
        let m = finite_magnitudes();
        assert_eq!(m.len(), 127);
        assert_eq!(nearest_distance(&m, 500.0), 52.0);
        assert_eq!(nearest_distance(&m, -0.0), 0.0);
        assert_eq!(nearest_distance(&m, 1.0625), 0.0625);
    }
}
