//! The scale of a kernel's output against its own emulation: a least-squares slope and its
//! row-clustered standard error, the statistic of the `emulation.scale` gate
//! (docs/DESIGN.md "The scale gate").
//!
//! The emulation follows the kernel's arithmetic (src/emulation/), so a correct kernel differs
//! from it only where an exp2 or a sum in another order lands a value on the other side of a
//! rounding step (f16 O; for Stage D also an e4m3 weight of P). Those differences are mostly
//! as often up as down: they move the slope of `kernel ≈ a · emulation` by an amount whose
//! spread the residuals measure, plus a small systematic part (the kernel's exp2 against the
//! emulation's; measured up to 1e-5 on an H100) that the gate's allowance covers. A mistake
//! that scales the output (V's scale or the final normalization off by x) moves `a` by x on
//! every row at once; one that sharpens or flattens the weights (a softmax or K scale) moves it
//! by part of x. The slope is fitted over every checked element; rows are the clusters of the
//! standard error, because one flipped weight moves a whole row (its key's V row, scaled).

use half::f16;
use serde::{Deserialize, Serialize};
use statrs::distribution::{ContinuousCDF, Normal, StudentsT};

use crate::rows::RowSet;

/// `kernel ≈ slope · emulation` over the checked elements; every record keeps it
/// (`emulation_scale` in correctness.json).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ScaleFit {
    pub slope: f64,
    /// Row-clustered (sandwich) standard error of `slope`, with the small-sample factor
    /// G / (G − 1).
    pub std_err: f64,
    /// Rows that enter the fit (rows whose emulation is not all zero).
    pub rows: usize,
    /// Degrees of freedom of the t quantile: min(G, G*) − 1, where G* = (Σ_g E_g)² / Σ_g E_g²
    /// is the effective number of rows (E_g a row's Σ e²). Where a few rows hold most of the
    /// output's energy, the clustered error rests on those few, and the quantile widens.
    pub dof: f64,
}

/// Degrees of freedom above which Student's t is the normal distribution to four digits
/// (statrs's t quantile does not return for about 1.4e7 and more).
const NORMAL_DOF: f64 = 1e5;

/// The fit of `out` (full layout, `d` per row) on `emulation` (the compact layout of `rows`);
/// `None` when the rows with a non-zero emulation are effectively fewer than two (no spread to
/// measure) or an element is not finite (the nonfinite and unwritten gates fail the output; a
/// non-finite emulation fails its own metrics).
pub fn fit(out: &[f16], emulation: &[f16], rows: &RowSet, d: usize) -> Option<ScaleFit> {
    // Per row with a non-zero emulation: (Σ k·e, Σ e²). A row's score at the fitted slope,
    // Σ_d e·(k − slope·e), is then ke − slope·ee: one pass over the data.
    let mut per_row = Vec::with_capacity(rows.count());
    for (full, compact) in rows.each() {
        let (mut ke, mut ee) = (0.0, 0.0);
        for (&k, &e) in out[full * d..][..d]
            .iter()
            .zip(&emulation[compact * d..][..d])
        {
            let (k, e) = (f64::from(k), f64::from(e));
            if !k.is_finite() || !e.is_finite() {
                return None;
            }
            ke += k * e;
            ee += e * e;
        }
        if ee > 0.0 {
            per_row.push((ke, ee));
        }
    }
    let ke: f64 = per_row.iter().map(|r| r.0).sum();
    let ee: f64 = per_row.iter().map(|r| r.1).sum();
    let ee_sq: f64 = per_row.iter().map(|r| r.1 * r.1).sum();
    let g = per_row.len() as f64;
    let dof = g.min(ee * ee / ee_sq) - 1.0;
    if per_row.len() < 2 || dof.is_nan() || dof < 1.0 {
        return None;
    }
    let slope = ke / ee;
    // Σ over rows of their squared scores, the meat of the sandwich.
    let meat: f64 = per_row
        .iter()
        .map(|(ke, ee)| (ke - slope * ee).powi(2))
        .sum();
    let std_err = (meat * g / (g - 1.0)).sqrt() / ee;
    Some(ScaleFit {
        slope,
        std_err,
        rows: per_row.len(),
        dof,
    })
}

impl ScaleFit {
    /// The most `|slope − 1|` a correct kernel shows: `allowance` (what the emulation may
    /// leave unmodelled, systematic) plus the two-sided `p` quantile of Student's t with
    /// [`ScaleFit::dof`] degrees of freedom times the standard error (what chance moves).
    /// `p` is at least 1e-6 (the gates file's rule), so the quantile is finite.
    pub fn limit(&self, allowance: f64, p: f64) -> f64 {
        let quantile = 1.0 - p / 2.0;
        let t = if self.dof > NORMAL_DOF {
            Normal::new(0.0, 1.0)
                .expect("unit normal")
                .inverse_cdf(quantile)
        } else {
            StudentsT::new(0.0, 1.0, self.dof)
                .expect("at least one degree of freedom")
                .inverse_cdf(quantile)
        };
        assert!(t.is_finite(), "t quantile at p = {p} is not finite");
        allowance + t * self.std_err
    }

    /// The gate's value: how far the slope is from 1.
    pub fn deviation(&self) -> f64 {
        (self.slope - 1.0).abs()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shapes::Shape;

    fn shape(rows: usize, d: usize) -> Shape {
        Shape::new("t", 1, 1, rows, d)
    }

    /// A smooth, sign-changing emulation output of `rows` rows of `d`.
    fn emulation(rows: usize, d: usize) -> Vec<f16> {
        (0..rows * d)
            .map(|i| f16::from_f64(((i as f64) * 0.37).sin() * 0.5))
            .collect()
    }

    #[test]
    fn the_emulation_itself_fits_with_slope_one_and_no_spread() {
        let e = emulation(16, 64);
        let rows = RowSet::all(&shape(16, 64));
        let f = fit(&e, &e, &rows, 64).unwrap();
        assert_eq!(f.slope, 1.0);
        assert_eq!(f.std_err, 0.0);
        assert_eq!(f.rows, 16);
    }

    #[test]
    fn an_output_scaled_by_a_fifth_of_a_percent_fits_that_slope_and_exceeds_the_limit() {
        let e = emulation(16, 64);
        let k: Vec<f16> = e
            .iter()
            .map(|x| f16::from_f64(f64::from(*x) * 1.002))
            .collect();
        let rows = RowSet::all(&shape(16, 64));
        let f = fit(&k, &e, &rows, 64).unwrap();
        assert!((f.slope - 1.002).abs() < 2e-4, "{f:?}");
        assert!(f.deviation() > f.limit(2f64.powi(-10), 1e-6), "{f:?}");
    }

    #[test]
    fn zero_mean_rounding_flips_widen_the_limit_but_leave_the_slope_within_chance() {
        let e = emulation(64, 64);
        // One element per row moved a few f16 steps up or down, the sign from a hash of the
        // row (not alternating: the moves do not cancel exactly).
        let mut k = e.clone();
        for r in 0..64 {
            let i = r * 64 + (r * 7) % 64;
            let step = if (r * 2_654_435_761usize) >> 7 & 1 == 0 {
                4.0
            } else {
                -4.0
            };
            k[i] = f16::from_f64(f64::from(k[i]) + step * 2f64.powi(-11));
        }
        let rows = RowSet::all(&shape(64, 64));
        let f = fit(&k, &e, &rows, 64).unwrap();
        assert!(f.deviation() > 0.0 && f.std_err > 0.0, "{f:?}");
        // Chance alone (no allowance) covers what the flips moved.
        assert!(f.deviation() <= f.limit(0.0, 1e-6), "{f:?}");
    }

    #[test]
    fn the_standard_error_is_the_row_clustered_sandwich_by_hand() {
        // Two rows of two: e = (1, 0 | 0, 1), k = (1.1, 0 | 0, 0.95).
        let e = [1.0, 0.0, 0.0, 1.0].map(f16::from_f64);
        let k = [1.1, 0.0, 0.0, 0.95].map(f16::from_f64);
        let rows = RowSet::all(&shape(2, 2));
        let f = fit(&k, &e, &rows, 2).unwrap();
        let (k0, k1) = (f64::from(k[0]), f64::from(k[3]));
        let slope = (k0 + k1) / 2.0;
        // Scores e·(k − a e) per row: k0 − a and k1 − a; meat × G/(G − 1) = 2, over (Σe²)² = 4.
        let se = (((k0 - slope).powi(2) + (k1 - slope).powi(2)) * 2.0).sqrt() / 2.0;
        assert!((f.slope - slope).abs() < 1e-15, "{f:?}");
        assert!((f.std_err - se).abs() < 1e-15, "{f:?} against {se}");
        assert_eq!((f.rows, f.dof), (2, 1.0));
    }

    #[test]
    fn one_row_holding_almost_all_the_energy_leaves_no_spread_to_measure() {
        // Eight rows, one thirty times larger: the effective row count is about one.
        let mut e = emulation(8, 64);
        for x in &mut e[..64] {
            *x = f16::from_f64(f64::from(*x) * 30.0);
        }
        let mut k = e.clone();
        for x in &mut k[..64] {
            *x = f16::from_f64(f64::from(*x) * 1.002);
        }
        let rows = RowSet::all(&shape(8, 64));
        assert_eq!(fit(&k, &e, &rows, 64), None);
        // Equal rows: eight effective rows, a fit.
        let e = emulation(8, 64);
        let f = fit(&e, &e, &rows, 64).unwrap();
        assert!((f.dof - 7.0).abs() < 0.5, "{f:?}");
    }

    #[test]
    fn fewer_than_two_rows_with_output_or_a_non_finite_element_give_no_fit() {
        let rows = RowSet::all(&shape(2, 4));
        let e = [0.5, 0.25, -0.5, 0.125, 0.0, 0.0, 0.0, 0.0].map(f16::from_f64);
        assert_eq!(fit(&e, &e, &rows, 4), None);
        let mut k = emulation(2, 4);
        let e2 = k.clone();
        k[3] = f16::NAN;
        assert_eq!(fit(&k, &e2, &rows, 4), None);
    }

    #[test]
    fn the_limit_grows_with_fewer_rows_and_stays_finite_for_any_number_of_them() {
        let at = |rows: usize| ScaleFit {
            slope: 1.0,
            std_err: 1e-4,
            rows,
            dof: rows as f64 - 1.0,
        };
        assert!(at(4).limit(0.0, 1e-6) > at(400).limit(0.0, 1e-6));
        // Many rows: close to the normal quantile (4.89 at p = 1e-6), and past the t
        // distribution's range the normal itself (a 2^25-row output returns at once).
        let many = at(100_000).limit(0.0, 1e-6) / 1e-4;
        assert!((many - 4.89).abs() < 0.02, "{many}");
        let huge = at(1 << 25).limit(0.0, 1e-6) / 1e-4;
        assert!((huge - 4.8916).abs() < 1e-3, "{huge}");
        assert!((at(100_001).limit(0.0, 1e-6) / 1e-4 - many).abs() < 1e-3);
    }
}
