//! The emulation's `exp2`: one f32 function computed the same way, bit for bit, on the host
//! (here) and on the GPU (`exp2_portable` in cuda/emulation_f32.cu), so that the two
//! emulations agree exactly. The platform's `exp2f` could not be used: libm's differ between
//! platforms and versions, and CUDA's `exp2f` is another function again.
//!
//! In f64, with IEEE operations only (each rounded once, nothing fused or reordered):
//! x is clamped to [-200, 200] (NaN stays NaN; 2^-200 and 2^200 become 0 and inf as f32),
//! k = x rounded to the nearest integer (ties to even, by adding and subtracting 1.5·2^52),
//! r = x - k (exact, |r| <= 1/2), 2^r by its Taylor series in r·ln 2 to degree 12 (truncation
//! below 2e-16 relative) by Horner's rule, times 2^k (exact), rounded once to f32. The f64
//! result is within a few f64 ulps of 2^x, so the f32 is the correctly rounded 2^x except
//! where 2^x lies within about 1e-15 relative of a rounding boundary, which no f32 in
//! [-160, 9) does (docs/DESIGN.md "The emulation on the GPU"); either way both sides give the
//! same bits. Branch-free: the emulation's loops
//! vectorize with it.

/// ln(2)^n / n! for n = 0..=12, each the f64 nearest the exact value (given by its bits).
const C: [u64; 13] = [
    0x3ff0_0000_0000_0000,
    0x3fe6_2e42_fefa_39ef,
    0x3fce_bfbd_ff82_c58f,
    0x3fac_6b08_d704_a0c0,
    0x3f83_b2ab_6fba_4e77,
    0x3f55_d87f_e78a_6731,
    0x3f24_3091_2f86_c787,
    0x3eef_fcbf_c588_b0c7,
    0x3eb6_2c02_23a5_c824,
    0x3e7b_5253_d395_e7c4,
    0x3e3e_4cf5_158b_8eca,
    0x3dfe_8cac_7351_bb25,
    0x3dbc_3bd6_50fc_2986,
];
/// Adding then subtracting 1.5 * 2^52 rounds to the nearest integer, which then sits in the
/// low bits of the sum.
const ROUND: f64 = 6_755_399_441_055_744.0;
const LIMIT: f64 = 200.0;

/// 2^x, the same bits as the GPU emulation's `exp2_portable`.
#[inline(always)]
pub fn exp2(x: f32) -> f32 {
    let xd = (x as f64).clamp(-LIMIT, LIMIT);
    let t = xd + ROUND;
    let k = t - ROUND;
    let r = xd - k;
    let mut p = f64::from_bits(C[12]);
    for &c in C[..12].iter().rev() {
        p = p * r + f64::from_bits(c);
    }
    let k_int = (t.to_bits() as i64).wrapping_sub(ROUND.to_bits() as i64);
    let scale = f64::from_bits((k_int.wrapping_add(1023) as u64) << 52);
    (p * scale) as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Distance in f32 ulps (of the larger magnitude's binade), for finite values.
    fn ulps(a: f32, b: f32) -> i64 {
        (a.to_bits() as i64 - b.to_bits() as i64).abs()
    }

    #[test]
    fn the_coefficients_are_ln2_powers_over_factorials() {
        let ln2 = std::f64::consts::LN_2;
        let mut term = 1.0f64;
        for (n, &bits) in C.iter().enumerate() {
            if n > 0 {
                term *= ln2 / n as f64;
            }
            let c = f64::from_bits(bits);
            assert!(
                (c - term).abs() <= 4.0 * f64::EPSILON * term,
                "c_{n} = {c}, want {term}"
            );
        }
    }

    #[test]
    fn exp2_is_correctly_rounded_over_the_softmax_range() {
        // Every f32 from -160 to 9 in steps of about 2^-16 relative, against f64's exp2 (libm,
        // within 1 f64 ulp) rounded to f32. The softmax's arguments are s - m: at most 0 with
        // the exact running maximum, up to the rescale threshold (8, and a rounding residual)
        // where the maximum lags (kernels::MAX_RESCALE_THRESHOLD).
        let (mut n, mut off) = (0u64, 0u64);
        let mut check = |x: f32| {
            let want = (x as f64).exp2() as f32;
            let got = exp2(x);
            assert!(ulps(got, want) <= 1, "2^{x}: {got:e} vs {want:e}");
            off += u64::from(got != want);
            n += 1;
        };
        let mut x = -160.0f32;
        while x < 0.0 {
            check(x);
            x = f32::from_bits(x.to_bits() - 128);
        }
        let top = crate::kernels::MAX_RESCALE_THRESHOLD as f32 + 1.0;
        let mut x = 0.0f32;
        while x < top {
            check(x);
            x = f32::from_bits(x.to_bits() + 128);
        }
        assert!(n > 2_000_000, "{n} points");
        assert_eq!(off, 0, "{off} of {n} not correctly rounded");
    }

    #[test]
    fn exp2_handles_the_edges_of_its_range() {
        assert_eq!(exp2(f32::NEG_INFINITY).to_bits(), 0);
        assert_eq!(exp2(-150.0), 0.0);
        assert_eq!(exp2(-149.0), f32::from_bits(1), "the smallest subnormal");
        assert_eq!(exp2(-126.0), f32::MIN_POSITIVE);
        assert_eq!(exp2(0.0), 1.0);
        assert_eq!(exp2(-0.0), 1.0);
        assert_eq!(exp2(-1.0), 0.5);
        assert_eq!(exp2(0.5), std::f32::consts::SQRT_2);
        assert_eq!(exp2(127.0), 2f32.powi(127));
        assert_eq!(exp2(128.0), f32::INFINITY);
        assert_eq!(exp2(f32::INFINITY), f32::INFINITY);
        assert!(exp2(f32::NAN).is_nan());
        for k in -149..=127 {
            assert_eq!(exp2(k as f32), (k as f64).exp2() as f32, "2^{k}");
        }
    }
}
