//! Error metrics of one output against one f64 reference (docs/DESIGN.md "References and metrics").
//!
//! Outputs are poisoned with [`POISON`] before a backend writes them; an element still
//! holding that exact bit pattern is *unwritten*. Any other NaN or Inf is *nonfinite*.
//! The error statistics cover the written, finite elements; the two counts cover the rest,
//! and `pct_bad` counts every element that is out of tolerance, unwritten or nonfinite.

use half::f16;
use serde::{Deserialize, Serialize};

use crate::shapes::Shape;

/// A quiet NaN with a payload no arithmetic produces (CUDA's canonical f16 NaN is 0x7FFF).
pub const POISON: f16 = f16::from_bits(0x7E5A);

/// `|out - ref| > atol + rtol * |ref|` marks an element bad.
#[derive(Debug, Clone, Copy)]
pub struct BadRule {
    pub atol: f64,
    pub rtol: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorMetrics {
    pub max_abs_err: f64,
    pub mean_abs_err: f64,
    pub rmse: f64,
    pub pct_bad: f64,
    pub nonfinite: usize,
    pub unwritten: usize,
    pub elements: usize,
    /// Where the largest finite error is, as `[b, h, s, d]`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub worst_at: Option<[usize; 4]>,
}

/// Measures `out` against `reference` (same `[B, H, S, D]` layout).
pub fn measure(out: &[f16], reference: &[f64], rule: BadRule, shape: &Shape) -> ErrorMetrics {
    assert_eq!(out.len(), reference.len());
    let (mut max, mut sum, mut sum_sq) = (0.0f64, 0.0f64, 0.0f64);
    let (mut counted, mut bad, mut nonfinite, mut unwritten) = (0usize, 0usize, 0usize, 0usize);
    let mut worst = None;
    for (i, (&o, &r)) in out.iter().zip(reference).enumerate() {
        if o.to_bits() == POISON.to_bits() {
            unwritten += 1;
            bad += 1;
            continue;
        }
        if !o.is_finite() {
            nonfinite += 1;
            bad += 1;
            continue;
        }
        let err = (o.to_f64() - r).abs();
        if err > max || worst.is_none() {
            max = max.max(err);
            worst = Some(i);
        }
        sum += err;
        sum_sq += err * err;
        counted += 1;
        if err > rule.atol + rule.rtol * r.abs() {
            bad += 1;
        }
    }
    let n = counted.max(1) as f64;
    ErrorMetrics {
        max_abs_err: max,
        mean_abs_err: sum / n,
        rmse: (sum_sq / n).sqrt(),
        pct_bad: 100.0 * bad as f64 / out.len().max(1) as f64,
        nonfinite,
        unwritten,
        elements: out.len(),
        worst_at: worst.map(|i| unflatten(i, shape)),
    }
}

pub fn unflatten(i: usize, shape: &Shape) -> [usize; 4] {
    let d = i % shape.d;
    let s = (i / shape.d) % shape.s;
    let h = (i / (shape.d * shape.s)) % shape.h;
    let b = i / (shape.d * shape.s * shape.h);
    [b, h, s, d]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape() -> Shape {
        Shape {
            name: "t".into(),
            b: 1,
            h: 2,
            s: 1,
            d: 64,
            qk_std: 1.0,
            purpose: String::new(),
        }
    }

    const RULE: BadRule = BadRule {
        atol: 0.01,
        rtol: 0.0,
    };

    #[test]
    fn exact_output_has_zero_error() {
        let reference: Vec<f64> = (0..128).map(|i| i as f64 / 128.0).collect();
        let out: Vec<f16> = reference.iter().map(|&r| f16::from_f64(r)).collect();
        let m = measure(&out, &reference, RULE, &shape());
        assert!(m.max_abs_err < 1e-3 && m.pct_bad == 0.0 && m.unwritten == 0 && m.nonfinite == 0);
    }

    #[test]
    fn poison_counts_as_unwritten_and_other_nan_as_nonfinite() {
        let reference = vec![0.5f64; 128];
        let mut out = vec![f16::from_f64(0.5); 128];
        out[3] = POISON;
        out[4] = POISON;
        out[5] = f16::NAN;
        out[6] = f16::INFINITY;
        let m = measure(&out, &reference, RULE, &shape());
        assert_eq!((m.unwritten, m.nonfinite), (2, 2));
        assert_eq!(m.pct_bad, 100.0 * 4.0 / 128.0);
        assert_eq!(
            m.max_abs_err, 0.0,
            "errors cover written finite elements only"
        );
    }

    #[test]
    fn worst_element_is_located_and_bad_rule_uses_atol_and_rtol() {
        let reference = vec![1.0f64; 128];
        let mut out = vec![f16::from_f64(1.0); 128];
        out[64 + 10] = f16::from_f64(1.5);
        out[7] = f16::from_f64(1.015625);
        let m = measure(
            &out,
            &reference,
            BadRule {
                atol: 0.01,
                rtol: 0.01,
            },
            &shape(),
        );
        assert_eq!(m.worst_at, Some([0, 1, 0, 10]));
        assert!((m.max_abs_err - 0.5).abs() < 1e-12);
        assert_eq!(
            m.pct_bad,
            100.0 / 128.0,
            "0.0156 < 0.01 + 0.01: only the 0.5 error is bad"
        );
    }
}
