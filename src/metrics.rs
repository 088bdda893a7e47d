//! Error metrics of one output against one f64 reference (docs/DESIGN.md "References and metrics").
//!
//! Outputs are poisoned with [`POISON`] before a backend writes them; an element still
//! holding that exact bit pattern is *unwritten*. Any other NaN or Inf is *nonfinite*.
//! The error statistics cover the written, finite elements of the checked rows
//! (src/rows.rs); the two counts cover every element,
//! and `max_err_over_bound` measures each element against its own bound from the error model
//! (src/reference/bound.rs).

use half::f16;
use serde::{Deserialize, Serialize};

use rayon::prelude::*;

use crate::rows::RowSet;
use crate::shapes::Shape;

/// A quiet NaN with a payload no arithmetic produces (CUDA's canonical f16 NaN is 0x7FFF).
pub const POISON: f16 = f16::from_bits(0x7E5A);

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorMetrics {
    pub max_abs_err: f64,
    pub mean_abs_err: f64,
    pub rmse: f64,
    /// max over the written, finite elements of |out − ref| / bound, the error model's bound
    /// of that element (src/reference/bound.rs): above 1, the output is not what a correct
    /// kernel can produce.
    pub max_err_over_bound: f64,
    pub nonfinite: usize,
    pub unwritten: usize,
    pub elements: usize,
    /// Where `max_err_over_bound` is, as `[b, h, s, d]`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub worst_at: Option<[usize; 4]>,
}

/// Measures `out` (the whole `[B, H, S, D]` output) against `reference` and its per-element
/// `bound`, both in the compact layout of `rows`: the errors cover the checked rows, the
/// unwritten and non-finite counts every element.
pub fn measure(
    out: &[f16],
    reference: &[f64],
    bound: &[f64],
    rows: &RowSet,
    shape: &Shape,
) -> ErrorMetrics {
    assert_eq!(out.len(), rows.total() * shape.d);
    assert!(reference.len() == rows.count() * shape.d && bound.len() == reference.len());
    let (unwritten, nonfinite) = poison_counts(out);
    ErrorMetrics {
        nonfinite,
        unwritten,
        elements: out.len(),
        ..errors(out, reference, bound, rows, shape, |full_row, _| full_row)
    }
}

/// As [`measure`], for an output of the checked rows only, in their compact layout (the
/// emulation's): the counts cover those rows.
pub fn measure_compact(
    out: &[f16],
    reference: &[f64],
    bound: &[f64],
    rows: &RowSet,
    shape: &Shape,
) -> ErrorMetrics {
    assert_eq!(out.len(), reference.len());
    let (unwritten, nonfinite) = poison_counts(out);
    ErrorMetrics {
        nonfinite,
        unwritten,
        elements: out.len(),
        ..errors(out, reference, bound, rows, shape, |_, compact_row| {
            compact_row
        })
    }
}

/// (unwritten, nonfinite) elements of `out`, counted in parallel.
fn poison_counts(out: &[f16]) -> (usize, usize) {
    out.par_chunks(1 << 16)
        .map(|chunk| {
            chunk.iter().fold((0, 0), |(u, n), o| {
                if o.to_bits() == POISON.to_bits() {
                    (u + 1, n)
                } else {
                    (u, n + usize::from(!o.is_finite()))
                }
            })
        })
        .reduce(|| (0, 0), |a, b| (a.0 + b.0, a.1 + b.1))
}

/// The error statistics over the checked rows; `out_row` maps (output row, compact row) to
/// the row of `out` that holds it.
fn errors(
    out: &[f16],
    reference: &[f64],
    bound: &[f64],
    rows: &RowSet,
    shape: &Shape,
    out_row: impl Fn(usize, usize) -> usize,
) -> ErrorMetrics {
    let d = shape.d;
    let (mut max, mut sum, mut sum_sq, mut worst_ratio) = (0.0f64, 0.0f64, 0.0f64, 0.0f64);
    let mut counted = 0usize;
    let mut worst = None;
    for (full_row, compact_row) in rows.each() {
        let o = &out[out_row(full_row, compact_row) * d..][..d];
        let r = &reference[compact_row * d..][..d];
        let b = &bound[compact_row * d..][..d];
        for (x, ((&o, &r), &b)) in o.iter().zip(r).zip(b).enumerate() {
            if !o.is_finite() {
                continue; // poison or NaN/Inf: counted apart
            }
            let err = (o.to_f64() - r).abs();
            max = max.max(err);
            let ratio = err / b;
            if ratio > worst_ratio || worst.is_none() {
                worst_ratio = worst_ratio.max(ratio);
                worst = Some(full_row * d + x);
            }
            sum += err;
            sum_sq += err * err;
            counted += 1;
        }
    }
    let n = counted.max(1) as f64;
    ErrorMetrics {
        max_abs_err: max,
        mean_abs_err: sum / n,
        rmse: (sum_sq / n).sqrt(),
        max_err_over_bound: worst_ratio,
        nonfinite: 0,
        unwritten: 0,
        elements: 0,
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
            dist: Default::default(),
        }
    }

    #[test]
    fn exact_output_has_zero_error() {
        let reference: Vec<f64> = (0..128).map(|i| i as f64 / 128.0).collect();
        let out: Vec<f16> = reference.iter().map(|&r| f16::from_f64(r)).collect();
        let m = measure(
            &out,
            &reference,
            &[1e-3; 128],
            &RowSet::all(&shape()),
            &shape(),
        );
        assert!(m.max_abs_err < 1e-3 && m.max_err_over_bound < 1.0);
        assert_eq!((m.unwritten, m.nonfinite), (0, 0));
    }

    #[test]
    fn poison_counts_as_unwritten_and_other_nan_as_nonfinite() {
        let reference = vec![0.5f64; 128];
        let mut out = vec![f16::from_f64(0.5); 128];
        out[3] = POISON;
        out[4] = POISON;
        out[5] = f16::NAN;
        out[6] = f16::INFINITY;
        let m = measure(
            &out,
            &reference,
            &[0.01; 128],
            &RowSet::all(&shape()),
            &shape(),
        );
        assert_eq!((m.unwritten, m.nonfinite), (2, 2));
        assert_eq!(
            (m.max_abs_err, m.max_err_over_bound),
            (0.0, 0.0),
            "errors cover written finite elements only"
        );
    }

    #[test]
    fn the_worst_element_is_the_one_furthest_beyond_its_own_bound() {
        let reference = vec![1.0f64; 128];
        let mut out = vec![f16::from_f64(1.0); 128];
        let mut bound = vec![0.01; 128];
        out[64 + 10] = f16::from_f64(1.5); // error 0.5, bound 1: ratio 0.5
        bound[64 + 10] = 1.0;
        out[7] = f16::from_f64(1.015625); // error 0.0156, bound 0.01: ratio 1.56
        let m = measure(&out, &reference, &bound, &RowSet::all(&shape()), &shape());
        assert_eq!(m.worst_at, Some([0, 0, 0, 7]));
        assert!((m.max_abs_err - 0.5).abs() < 1e-12);
        assert!((m.max_err_over_bound - 1.5625).abs() < 1e-9);
    }

    #[test]
    fn sampled_rows_bound_the_errors_but_every_element_is_counted_for_poison() {
        let sh = Shape::parse_inline("1x1x1000x64").unwrap().unwrap();
        let rows = RowSet::sampled(&sh, 0, &[32]);
        let unchecked = (0..1000).find(|r| !rows.rows(0).contains(r)).unwrap();
        let reference = vec![0.5f64; rows.count() * 64];
        let mut out = vec![f16::from_f64(0.5); 1000 * 64];
        out[unchecked * 64 + 3] = f16::from_f64(9.0); // a wrong value nobody compares
        out[unchecked * 64 + 4] = POISON;
        out[unchecked * 64 + 5] = f16::INFINITY;
        let m = measure(&out, &reference, &vec![0.01; reference.len()], &rows, &sh);
        assert_eq!((m.unwritten, m.nonfinite, m.elements), (1, 1, 64_000));
        assert_eq!(
            m.max_abs_err, 0.0,
            "the unchecked row's error is not measured"
        );
        out[999 * 64] = f16::from_f64(0.75); // the last row is always checked
        let m = measure(&out, &reference, &vec![0.01; reference.len()], &rows, &sh);
        assert_eq!(m.worst_at, Some([0, 0, 999, 0]));
        assert!((m.max_abs_err - 0.25).abs() < 1e-12);
    }
}
