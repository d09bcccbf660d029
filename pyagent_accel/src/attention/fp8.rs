//! The 8-bit float formats of an FP8 KV cache (contract: `pyagent_ref.ops._fp8`): a
//! code is a sign bit, E exponent bits and M mantissa bits with bias b; e4m3 (E4 M3 b7,
//! largest finite 448, codes 0x7F/0xFF NaN, no infinity) and e5m2 (E5 M2 b15, largest
//! finite 57344, IEEE infinities and NaNs: the high byte of an f16).
//!
//! Decoding is exact. Encoding rounds an f32 to the nearest code, ties to the even code,
//! saturating: magnitudes past the largest finite (infinities included) give it, NaN
//! gives 0x7F with the input's sign bit. This is torch's
//! `clamp(x, -max, max).to(float8_*)` bit for bit (the tests check every code and
//! random floats against a nearest-value search; the Python tests against torch).
//!
//! `E4m3` and `E5m2` are storage dtypes (`crate::elem::Elem`) over numpy's uint8, so
//! the attention kernels read a cache of them in place and `write_slots` encodes into
//! one; the scales are the bindings' (the keys' folded into the softmax scale, the
//! values' into the output).

use numpy::PyArrayDescr;
use pyo3::prelude::*;

use crate::elem::Elem;

/// An fp8 format: mantissa bits, exponent bias, the code of the largest finite.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Format {
    pub mantissa_bits: u32,
    pub bias: i32,
    pub max_code: u8,
}

pub const E4M3: Format = Format {
    mantissa_bits: 3,
    bias: 7,
    max_code: 0x7E,
};
pub const E5M2: Format = Format {
    mantissa_bits: 2,
    bias: 15,
    max_code: 0x7B,
};

/// The f32 value of `code` in `fmt` (exact; NaN for its NaN codes, infinities for
/// e5m2's).
#[inline(always)]
pub fn decode(code: u8, fmt: Format) -> f32 {
    let m = fmt.mantissa_bits;
    let exp_bits = 7 - m;
    let top = (1u32 << exp_bits) - 1;
    let (e, f) = ((code as u32 >> m) & top, code as u32 & ((1 << m) - 1));
    let magnitude = if fmt.max_code == 0x7E && e == top && f == (1 << m) - 1 {
        f32::NAN
    } else if fmt.max_code == 0x7B && e == top {
        if f == 0 {
            f32::INFINITY
        } else {
            f32::NAN
        }
    } else if e == 0 {
        // f / 2^m * 2^(1 - bias): an integer times a power of two, exact in f32
        f as f32 * pow2(1 - fmt.bias - m as i32)
    } else {
        // rebias the exponent, widen the mantissa: an f32 bit pattern
        f32::from_bits((((e as i32 - fmt.bias + 127) as u32) << 23) | (f << (23 - m)))
    };
    if code & 0x80 != 0 {
        -magnitude
    } else {
        magnitude
    }
}

/// 2^k as an f32, for the exponents of the formats' subnormals (-16 ..= 0).
#[inline(always)]
fn pow2(k: i32) -> f32 {
    f32::from_bits(((k + 127) as u32) << 23)
}

/// The code of `x` in `fmt`: nearest, ties to even, saturating (module doc).
#[inline(always)]
pub fn encode(x: f32, fmt: Format) -> u8 {
    let sign = if x.is_sign_negative() { 0x80 } else { 0 };
    if x.is_nan() {
        return 0x7F | sign;
    }
    let m = fmt.mantissa_bits;
    let max = decode(fmt.max_code, fmt);
    let a = x.abs().min(max);
    let smallest_normal = pow2(1 - fmt.bias);
    let code = if a < smallest_normal {
        // subnormal steps of 2^(1 - bias - m): scale by a power of two (exact) and round
        // to the nearest integer, ties to even; 2^m is the smallest normal's code
        (a * pow2(fmt.bias - 1 + m as i32)).round_ties_even() as u32
    } else {
        // an f32 normal: keep m mantissa bits, rounding the dropped ones to nearest even;
        // a carry into the exponent is the next code
        let bits = a.to_bits();
        let e = (bits >> 23) as i32 - 127 + fmt.bias;
        let mant = bits & 0x7F_FFFF;
        let drop = 23 - m;
        let mut code = ((e as u32) << m) | (mant >> drop);
        let rest = mant & ((1 << drop) - 1);
        let half = 1 << (drop - 1);
        if rest > half || (rest == half && code & 1 == 1) {
            code += 1;
        }
        code
    };
    code.min(fmt.max_code as u32) as u8 | sign
}

macro_rules! fp8_elem {
    ($name:ident, $fmt:expr, $dtype:literal) => {
        #[doc = concat!("A ", $dtype, " code, which numpy holds in a uint8 array.")]
        #[repr(transparent)]
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
        pub struct $name(pub u8);

        // SAFETY: `repr(transparent)` over u8, numpy's uint8 layout; every bit pattern
        // is a code.
        unsafe impl numpy::Element for $name {
            const IS_COPY: bool = true;

            fn get_dtype(py: Python<'_>) -> Bound<'_, PyArrayDescr> {
                u8::get_dtype(py)
            }

            fn clone_ref(&self, _py: Python<'_>) -> Self {
                *self
            }
        }

        impl Elem for $name {
            type C = f32;
            const NAME: &'static str = $dtype;
            #[inline(always)]
            fn to_f32(self) -> f32 {
                decode(self.0, $fmt)
            }
            #[inline(always)]
            fn store(v: f32) -> Self {
                $name(encode(v, $fmt))
            }
        }
    };
}

fp8_elem!(E4m3, E4M3, "fp8_e4m3 (uint8)");
fp8_elem!(E5m2, E5M2, "fp8_e5m2 (uint8)");

#[cfg(test)]
mod tests {
    use super::*;
    use half::f16;

    /// The nearest code to `x` by search over every finite code, ties to the even code.
    fn nearest(x: f32, fmt: Format) -> u8 {
        let sign = if x.is_sign_negative() { 0x80 } else { 0 };
        if x.is_nan() {
            return 0x7F | sign;
        }
        let a = x.abs() as f64;
        let mut best = 0u8;
        for code in 0..=fmt.max_code {
            let (d, db) = (
                (decode(code, fmt) as f64 - a).abs(),
                (decode(best, fmt) as f64 - a).abs(),
            );
            if d < db || (d == db && code % 2 == 0) {
                best = code;
            }
        }
        best | sign
    }

    #[test]
    fn decodes_every_code() {
        for code in 0..=255u8 {
            // e5m2 is the high byte of an f16
            let want = f16::from_bits((code as u16) << 8).to_f32();
            let got = decode(code, E5M2);
            assert!(got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()));
            // e4m3 by its definition
            let (s, e, f) = (code >> 7, (code >> 3) & 15, code & 7);
            let v = if e == 15 && f == 7 {
                f64::NAN
            } else if e == 0 {
                f as f64 / 8.0 * 2f64.powi(-6)
            } else {
                (1.0 + f as f64 / 8.0) * 2f64.powi(e as i32 - 7)
            };
            let want = if s == 1 { -v } else { v } as f32;
            let got = decode(code, E4M3);
            assert!(got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()));
        }
        assert_eq!(decode(E4M3.max_code, E4M3), 448.0);
        assert_eq!(decode(E5M2.max_code, E5M2), 57344.0);
    }

    #[test]
    fn every_code_encodes_to_itself_and_midpoints_round_to_even() {
        for fmt in [E4M3, E5M2] {
            for code in 0..=255u8 {
                let v = decode(code, fmt);
                if v.is_finite() {
                    assert_eq!(encode(v, fmt), code, "{fmt:?} {code:#x}");
                }
            }
            for code in 0..fmt.max_code {
                let (lo, hi) = (decode(code, fmt), decode(code + 1, fmt));
                let mid = (lo + hi) / 2.0; // exact: few mantissa bits
                let even = if code % 2 == 0 { code } else { code + 1 };
                assert_eq!(
                    encode(mid, fmt),
                    even,
                    "{fmt:?} between {code:#x} and the next"
                );
                assert_eq!(encode(-mid, fmt), even | 0x80);
            }
        }
    }

    #[test]
    fn saturates_and_keeps_nan() {
        for fmt in [E4M3, E5M2] {
            let max = decode(fmt.max_code, fmt);
            for x in [max * 1.01, 1e30, f32::INFINITY, f32::MAX] {
                assert_eq!(encode(x, fmt), fmt.max_code);
                assert_eq!(encode(-x, fmt), fmt.max_code | 0x80);
            }
            assert_eq!(encode(f32::NAN, fmt), 0x7F);
            assert_eq!(encode(-f32::NAN, fmt), 0xFF);
            assert_eq!(encode(-0.0, fmt), 0x80);
            assert_eq!(encode(1e-45, fmt), 0);
        }
    }

    #[test]
    fn random_floats_round_to_the_nearest_code() {
        let mut state = 0x2545_f491_4f6c_dd1du64; // xorshift: values over every exponent
        for _ in 0..200_000 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let bits = state as u32;
            // exponents near the formats' range: 2^-30 .. 2^20
            let exp = 97 + (bits >> 24) % 51;
            let x = f32::from_bits((bits & 0x807F_FFFF) | (exp << 23));
            for fmt in [E4M3, E5M2] {
                assert_eq!(encode(x, fmt), nearest(x, fmt), "{x:e} {fmt:?}");
            }
        }
    }
}
