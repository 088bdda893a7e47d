//! FP8 E4M3 (OCP, as CUDA's `__nv_fp8_e4m3`): per-(batch, head) scales and the host codec.
//!
//! Encoding rounds to nearest even and saturates to ±448 (CUDA's `__NV_SATFINITE`); NaN
//! encodes as 0x7F. The conversion is the `float8` crate's, a port of `cuda_fp8.hpp`; the GPU
//! tests check it bit for bit against the device's own conversion.

use float8::F8E4M3;
use half::f16;

/// Largest finite E4M3 magnitude.
pub const E4M3_MAX: f32 = 448.0;

/// Encodes one value (round to nearest even, saturate to ±448).
pub fn encode(x: f32) -> u8 {
    F8E4M3::from_f32(x).to_bits()
}

/// Decodes one code exactly (every E4M3 value is an f16 and an f32). 0x7F and 0xFF are NaN.
pub fn decode(code: u8) -> f32 {
    F8E4M3::from_bits(code).to_f32()
}

/// Decodes one code to f16, as the kernel's `__nv_cvt_fp8_to_halfraw` does.
pub fn decode_f16(code: u8) -> f16 {
    F8E4M3::from_bits(code).to_f16()
}

/// Scale that maps a tensor slice's largest magnitude onto 448; 1.0 for an all-zero slice.
pub fn scale_for(values: &[f32]) -> f32 {
    let amax = values.iter().fold(0.0f32, |m, &x| m.max(x.abs()));
    if amax == 0.0 { 1.0 } else { amax / E4M3_MAX }
}

/// One tensor in FP8: a code per element and a scale per (batch, head).
#[derive(Debug, Clone)]
pub struct Fp8Tensor {
    pub codes: Vec<u8>,
    pub scales: Vec<f32>,
    /// Elements per (batch, head) slice (S * D).
    pub head_len: usize,
}

impl Fp8Tensor {
    /// Quantizes a `[B, H, S, D]` tensor with one scale per (b, h): code = E4M3(x / scale).
    pub fn quantize(values: &[f32], head_len: usize) -> Self {
        use rayon::prelude::*;
        assert!(head_len > 0 && values.len().is_multiple_of(head_len));
        let mut codes = vec![0u8; values.len()];
        let scales = codes
            .par_chunks_mut(head_len)
            .zip(values.par_chunks(head_len))
            .map(|(codes, slice)| {
                let scale = scale_for(slice);
                for (c, &x) in codes.iter_mut().zip(slice) {
                    *c = encode(x / scale);
                }
                scale
            })
            .collect();
        Fp8Tensor {
            codes,
            scales,
            head_len,
        }
    }

    /// The exact dequantized values, `decode(code) * scale`, in f64 (for the references).
    pub fn dequantize_f64(&self) -> Vec<f64> {
        let table = decode_table_f64();
        self.codes
            .chunks(self.head_len)
            .zip(&self.scales)
            .flat_map(|(slice, &scale)| {
                slice.iter().map(move |&c| table[c as usize] * scale as f64)
            })
            .collect()
    }
}

/// The 256 decoded values in f64, indexed by code.
pub fn decode_table_f64() -> [f64; 256] {
    std::array::from_fn(|c| decode(c as u8) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Decodes from the OCP E4M3 definition directly, independent of the `float8` crate.
    fn ocp_decode(code: u8) -> f32 {
        let sign = if code & 0x80 != 0 { -1.0 } else { 1.0 };
        let exp = ((code >> 3) & 0xF) as i32;
        let man = (code & 0x7) as f32;
        if exp == 0xF && code & 0x7 == 0x7 {
            return f32::NAN;
        }
        if exp == 0 {
            sign * man / 8.0 * 2f32.powi(-6)
        } else {
            sign * (1.0 + man / 8.0) * 2f32.powi(exp - 7)
        }
    }

    #[test]
    fn all_256_codes_decode_as_the_ocp_table_says() {
        for code in 0..=255u8 {
            let (ours, table) = (decode(code), ocp_decode(code));
            if table.is_nan() {
                assert!(ours.is_nan(), "{code:#04x}");
            } else {
                assert_eq!(ours.to_bits(), table.to_bits(), "{code:#04x}");
            }
            assert_eq!(
                decode_f16(code).to_f32().to_bits(),
                ours.to_bits(),
                "{code:#04x} via f16"
            );
        }
    }

    #[test]
    fn special_codes_are_nan_max_and_smallest_subnormal() {
        assert!(decode(0x7F).is_nan() && decode(0xFF).is_nan());
        assert_eq!(decode(0x7E), 448.0);
        assert_eq!(decode(0xFE), -448.0);
        assert_eq!(decode(0x01), 2f32.powi(-9));
        assert_eq!(decode(0x07), 7.0 * 2f32.powi(-9));
        assert_eq!(decode(0x08), 2f32.powi(-6));
        assert_eq!(decode(0x80).to_bits(), (-0.0f32).to_bits());
    }

    #[test]
    fn every_finite_code_round_trips() {
        for code in 0..=255u8 {
            if !decode(code).is_nan() {
                assert_eq!(encode(decode(code)), code, "{code:#04x}");
            }
        }
    }

    #[test]
    fn encode_rounds_ties_to_even() {
        // 1.0 = 0x38, 1.125 = 0x39, 1.25 = 0x3A: 1.0625 ties to 1.0, 1.1875 ties to 1.25.
        assert_eq!(encode(1.0625), 0x38);
        assert_eq!(encode(1.1875), 0x3A);
        assert_eq!(encode(-1.0625), 0xB8);
        // Just above a tie rounds up.
        assert_eq!(encode(f32::from_bits(1.0625f32.to_bits() + 1)), 0x39);
    }

    #[test]
    fn encode_handles_subnormals_and_underflow() {
        let min_sub = 2f32.powi(-9);
        assert_eq!(encode(min_sub), 0x01);
        assert_eq!(
            encode(min_sub / 2.0),
            0x00,
            "half the smallest subnormal ties to zero"
        );
        assert_eq!(encode(min_sub * 0.75), 0x01);
        assert_eq!(encode(min_sub * 1.5), 0x02, "1.5 ulp ties to even (2)");
        assert_eq!(encode(min_sub * 2.5), 0x02, "2.5 ulp ties to even (2)");
        assert_eq!(encode(1e-30), 0x00);
        assert_eq!(encode(-1e-30), 0x80);
        assert_eq!(encode(0.0), 0x00);
        assert_eq!(encode(-0.0), 0x80);
    }

    #[test]
    fn encode_saturates_to_448_and_maps_nan_to_0x7f() {
        assert_eq!(encode(448.0), 0x7E);
        assert_eq!(encode(463.9), 0x7E);
        assert_eq!(
            encode(464.0),
            0x7E,
            "the tie between 448 and 480 goes to 448"
        );
        assert_eq!(encode(1e6), 0x7E);
        assert_eq!(encode(f32::INFINITY), 0x7E);
        assert_eq!(encode(f32::NEG_INFINITY), 0xFE);
        assert_eq!(encode(f32::NAN) & 0x7F, 0x7F);
    }

    #[test]
    fn scales_map_amax_to_448_and_zero_slices_to_one() {
        assert_eq!(scale_for(&[0.0, -0.0]), 1.0);
        let s = scale_for(&[1.0, -3.5, 2.0]);
        assert_eq!(s, 3.5 / 448.0);
        let t = Fp8Tensor::quantize(&[1.0, -3.5, 0.0, 0.0], 2);
        assert_eq!(t.scales, vec![3.5 / 448.0, 1.0]);
        assert_eq!(t.codes[1], 0xFE, "amax lands on -448");
        assert_eq!(&t.codes[2..], &[0, 0]);
    }

    #[test]
    fn quantization_error_is_within_half_an_e4m3_ulp() {
        let values: Vec<f32> = (0..1000).map(|i| ((i as f32) * 0.37).sin() * 5.0).collect();
        let t = Fp8Tensor::quantize(&values, 1000);
        let deq = t.dequantize_f64();
        for (&x, &y) in values.iter().zip(&deq) {
            // 3 mantissa bits: relative half-ulp 1/16 for normals; subnormal step 2^-9 * scale.
            let bound = (x.abs() as f64 / 16.0).max(2f64.powi(-10) * t.scales[0] as f64) * 1.0001;
            assert!((x as f64 - y).abs() <= bound, "{x} -> {y}");
        }
    }
}
