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
    #[serde(with = "crate::json::f64_or_inf")]
    pub max_abs_err: f64,
    #[serde(with = "crate::json::f64_or_inf")]
    pub mean_abs_err: f64,
    #[serde(with = "crate::json::f64_or_inf")]
    pub rmse: f64,
    /// max over the written, finite elements of |out − ref| / bound, the error model's bound
    /// of that element (src/reference/bound.rs): above 1, the output is not what a correct
    /// kernel can produce; infinite where the bound is 0 (a row that sees no key must be
    /// exactly zero) and the output is not.
    #[serde(with = "crate::json::f64_or_inf")]
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

/// As [`measure`], for an output of another implementation (`check`), read as f64: nothing
/// was poisoned, so `unwritten` is 0 and every NaN or Inf is `nonfinite`.
pub fn measure_values(
    out: &[f64],
    reference: &[f64],
    bound: &[f64],
    rows: &RowSet,
    shape: &Shape,
) -> ErrorMetrics {
    assert_eq!(out.len(), rows.total() * shape.d);
    assert!(reference.len() == rows.count() * shape.d && bound.len() == reference.len());
    let nonfinite = out.par_iter().filter(|x| !x.is_finite()).count();
    ErrorMetrics {
        nonfinite,
        unwritten: 0,
        elements: out.len(),
        ..errors(out, reference, bound, rows, shape, |full_row, _| full_row)
    }
}

/// An output element: f16 from the kernels, f64 from outputs read back.
trait Element: Copy + Sync {
    fn finite(self) -> bool;
    fn value(self) -> f64;
}

impl Element for f16 {
    fn finite(self) -> bool {
        self.is_finite()
    }
    fn value(self) -> f64 {
        self.to_f64()
    }
}

impl Element for f64 {
    fn finite(self) -> bool {
        self.is_finite()
    }
    fn value(self) -> f64 {
        self
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
/// the row of `out` that holds it. Rows are taken [`ROWS_PER_PART`] at a time in parallel and
/// the parts combined in row order, so the figures do not depend on the number of threads.
fn errors<T: Element>(
    out: &[T],
    reference: &[f64],
    bound: &[f64],
    rows: &RowSet,
    shape: &Shape,
    out_row: impl Fn(usize, usize) -> usize + Sync,
) -> ErrorMetrics {
    let d = shape.d;
    let each: Vec<(usize, usize)> = rows.each().collect();
    let parts: Vec<Part> = each
        .par_chunks(ROWS_PER_PART)
        .map(|chunk| {
            let mut part = Part::default();
            for &(full_row, compact_row) in chunk {
                let o = &out[out_row(full_row, compact_row) * d..][..d];
                let r = &reference[compact_row * d..][..d];
                let b = &bound[compact_row * d..][..d];
                for (x, ((&o, &r), &b)) in o.iter().zip(r).zip(b).enumerate() {
                    // Poison and NaN/Inf are counted apart.
                    if o.finite() {
                        part.add((o.value() - r).abs(), b, full_row * d + x);
                    }
                }
            }
            part
        })
        .collect();
    let all = parts.into_iter().fold(Part::default(), Part::then);
    let n = all.counted.max(1) as f64;
    ErrorMetrics {
        max_abs_err: all.max,
        mean_abs_err: all.sum / n,
        rmse: (all.sum_sq / n).sqrt(),
        max_err_over_bound: all.worst_ratio,
        nonfinite: 0,
        unwritten: 0,
        elements: 0,
        worst_at: all.worst.map(|i| unflatten(i, shape)),
    }
}

/// Output rows per parallel part of [`errors`] (not a numerical parameter: it only fixes the
/// order in which the parts' sums are added).
const ROWS_PER_PART: usize = 256;

/// The error statistics of a run of consecutive elements.
#[derive(Default)]
struct Part {
    max: f64,
    sum: f64,
    sum_sq: f64,
    worst_ratio: f64,
    /// The first element of the largest ratio (the first element while none is above 0).
    worst: Option<usize>,
    counted: usize,
}

impl Part {
    fn add(&mut self, err: f64, bound: f64, at: usize) {
        self.max = self.max.max(err);
        // An exact answer is 0 whatever its bound (a row that sees no key has bound 0); a NaN
        // reference or bound (an input a cast overflowed) must not read as a pass.
        let ratio = match err / bound {
            _ if err == 0.0 => 0.0,
            r if r.is_nan() => f64::INFINITY,
            r => r,
        };
        if ratio > self.worst_ratio || self.worst.is_none() {
            self.worst_ratio = self.worst_ratio.max(ratio);
            self.worst = Some(at);
        }
        self.sum += err;
        self.sum_sq += err * err;
        self.counted += 1;
    }

    /// This part followed by `next`: what adding `next`'s elements one by one would give,
    /// but for the order of the sums' additions.
    fn then(self, next: Part) -> Part {
        let next_wins =
            next.worst.is_some() && (self.worst.is_none() || next.worst_ratio > self.worst_ratio);
        let (worst_ratio, worst) = if next_wins {
            (next.worst_ratio, next.worst)
        } else {
            (self.worst_ratio, self.worst)
        };
        Part {
            max: self.max.max(next.max),
            sum: self.sum + next.sum,
            sum_sq: self.sum_sq + next.sum_sq,
            worst_ratio,
            worst,
            counted: self.counted + next.counted,
        }
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
            rotate: false,
            hkv: 2,
            sk: 1,
            causal: false,
        }
    }

    #[test]
    fn a_nan_reference_or_bound_is_an_infinite_ratio_never_a_pass() {
        let sh = shape();
        let rows = RowSet::all(&sh);
        let out = vec![0.5f64; 2 * 64];
        let mut reference = vec![0.5f64; 2 * 64];
        let mut bound = vec![1e-3f64; 2 * 64];
        assert_eq!(
            measure_values(&out, &reference, &bound, &rows, &sh).max_err_over_bound,
            0.0
        );
        reference[3] = f64::NAN;
        let m = measure_values(&out, &reference, &bound, &rows, &sh);
        assert_eq!(m.max_err_over_bound, f64::INFINITY);
        assert_eq!(m.worst_at, Some([0, 0, 0, 3]));
        reference[3] = 0.5;
        bound[70] = f64::NAN;
        let mut off = out.clone();
        off[70] = 0.6;
        assert_eq!(
            measure_values(&off, &reference, &bound, &rows, &sh).max_err_over_bound,
            f64::INFINITY
        );
        // An exact element passes whatever its bound.
        assert_eq!(
            measure_values(&out, &reference, &bound, &rows, &sh).max_err_over_bound,
            0.0
        );
    }

    #[test]
    fn errors_in_parallel_parts_are_the_serial_scan_and_the_first_worst_element_wins() {
        // 3 heads x 700 rows (parts of 256 rows end inside heads), every row checked; the
        // largest ratio occurs twice, in part 1 and in part 5: the first is the worst.
        let sh = Shape {
            h: 3,
            s: 700,
            hkv: 3,
            sk: 700,
            ..shape()
        };
        let n = 3 * 700 * 64;
        let mut reference: Vec<f64> = (0..n).map(|i| ((i * 7919) % 1000) as f64 / 1e3).collect();
        let mut out: Vec<f16> = reference
            .iter()
            .enumerate()
            .map(|(i, &r)| f16::from_f64(r + ((i * 104_729) % 97) as f64 * 1e-5))
            .collect();
        let bound = vec![1e-2; n];
        let (first, second) = (300 * 64 + 5, 1300 * 64 + 9);
        for at in [first, second] {
            reference[at] = 0.5;
            out[at] = f16::from_f64(0.75);
        }
        out[77] = f16::NAN; // skipped
        let rows = RowSet::all(&sh);
        let got = measure(&out, &reference, &bound, &rows, &sh);
        // The serial scan, element by element.
        let (mut max, mut sum, mut worst, mut worst_ratio, mut counted) =
            (0f64, 0f64, None, 0f64, 0);
        for (i, (o, r)) in out.iter().zip(&reference).enumerate() {
            if o.is_finite() {
                let err = (o.to_f64() - r).abs();
                max = max.max(err);
                if err / 1e-2 > worst_ratio || worst.is_none() {
                    worst_ratio = worst_ratio.max(err / 1e-2);
                    worst = Some(i);
                }
                sum += err;
                counted += 1;
            }
        }
        assert_eq!(worst, Some(first));
        assert_eq!(got.worst_at, Some(unflatten(first, &sh)));
        assert_eq!(
            (got.max_abs_err, got.max_err_over_bound),
            (max, worst_ratio)
        );
        assert_eq!(got.nonfinite, 1);
        let mean = sum / counted as f64;
        assert!(
            (got.mean_abs_err - mean).abs() <= 1e-12 * mean,
            "{} vs {mean}",
            got.mean_abs_err
        );
        // And the same bits from one thread as from many.
        let one = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap();
        let serial = one.install(|| measure(&out, &reference, &bound, &rows, &sh));
        assert_eq!(
            (serial.mean_abs_err.to_bits(), serial.rmse.to_bits()),
            (got.mean_abs_err.to_bits(), got.rmse.to_bits())
        );
    }

    #[test]
    fn a_row_bound_to_zero_passes_only_when_exactly_zero_and_its_record_survives_json() {
        // shape(): 1x2x1x64, two rows; the second sees no key: reference 0, bound 0.
        let reference: Vec<f64> = (0..128).map(|i| if i < 64 { 0.5 } else { 0.0 }).collect();
        let bound: Vec<f64> = (0..128).map(|i| if i < 64 { 1e-3 } else { 0.0 }).collect();
        let mut out: Vec<f16> = reference.iter().map(|&r| f16::from_f64(r)).collect();
        out[64] = f16::NEG_ZERO; // -0 is zero
        let m = measure(&out, &reference, &bound, &RowSet::all(&shape()), &shape());
        assert_eq!(m.max_err_over_bound, 0.0);
        out[100] = f16::from_f64(1e-7); // the smallest subnormal is not zero
        let m = measure(&out, &reference, &bound, &RowSet::all(&shape()), &shape());
        assert_eq!(m.max_err_over_bound, f64::INFINITY);
        assert_eq!(m.worst_at, Some([0, 1, 0, 36]));
        let again: ErrorMetrics =
            serde_json::from_str(&serde_json::to_string(&m).unwrap()).unwrap();
        assert_eq!(
            (again.max_err_over_bound, again.worst_at),
            (f64::INFINITY, m.worst_at)
        );
        assert!((again.max_abs_err - m.max_abs_err).abs() < 1e-20);
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
