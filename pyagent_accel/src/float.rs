//! The float element types the ops accept (f32 and f64), a branch-free `exp` that the
//! compiler can vectorise, and the runtime SIMD dispatch used by the hot kernels.
//!
//! Nothing here reorders floating-point operations: Rust never contracts `a * b + c`
//! into an FMA and never reassociates sums, so every kernel gives the same bits whether
//! it runs in the baseline, AVX2 or AVX-512 build (the dispatch only changes speed).

use std::cmp::Ordering;
use std::fmt::Debug;
use std::ops::{Add, Div, Mul, Sub};

/// f32 or f64: the logits dtypes of the reference.
pub trait Float:
    Copy
    + Send
    + Sync
    + PartialOrd
    + PartialEq
    + Debug
    + Default
    + Add<Output = Self>
    + Sub<Output = Self>
    + Mul<Output = Self>
    + Div<Output = Self>
    + numpy::Element
    + 'static
{
    const INF: Self;
    const NEG_INF: Self;
    const ZERO: Self;
    const NEG_ZERO: Self;
    const ONE: Self;
    /// The lowest finite value.
    const MIN: Self;

    fn to_f64(self) -> f64;
    /// Round a double to this type (round to nearest even, like numpy's astype).
    fn from_f64(v: f64) -> Self;
    /// `count as T` (numpy's int64 -> float cast: round to nearest even).
    fn from_count(c: u64) -> Self;
    fn total_cmp(&self, other: &Self) -> Ordering;
    fn is_pos_zero(self) -> bool;
    /// exp in this type, vectorisable: `exp_f64` for f64, `exp_f32` for f32.
    fn exp_fast(self) -> Self;
    /// Natural log in this type (libm; f32: computed in f64 and rounded once).
    fn ln_(self) -> Self;
    /// tanh in this type (libm).
    fn tanh_(self) -> Self;
}

impl Float for f32 {
    const INF: Self = f32::INFINITY;
    const NEG_INF: Self = f32::NEG_INFINITY;
    const ZERO: Self = 0.0;
    const NEG_ZERO: Self = -0.0;
    const ONE: Self = 1.0;
    const MIN: Self = f32::MIN;

    #[inline(always)]
    fn to_f64(self) -> f64 {
        self as f64
    }
    #[inline(always)]
    fn from_f64(v: f64) -> Self {
        v as f32
    }
    #[inline(always)]
    fn from_count(c: u64) -> Self {
        c as f32
    }
    #[inline(always)]
    fn total_cmp(&self, other: &Self) -> Ordering {
        f32::total_cmp(self, other)
    }
    #[inline(always)]
    fn is_pos_zero(self) -> bool {
        self.to_bits() == 0
    }
    #[inline(always)]
    fn exp_fast(self) -> Self {
        exp_f32(self)
    }
    #[inline(always)]
    fn ln_(self) -> Self {
        (self as f64).ln() as f32
    }
    #[inline(always)]
    fn tanh_(self) -> Self {
        self.tanh()
    }
}

impl Float for f64 {
    const INF: Self = f64::INFINITY;
    const NEG_INF: Self = f64::NEG_INFINITY;
    const ZERO: Self = 0.0;
    const NEG_ZERO: Self = -0.0;
    const ONE: Self = 1.0;
    const MIN: Self = f64::MIN;

    #[inline(always)]
    fn to_f64(self) -> f64 {
        self
    }
    #[inline(always)]
    fn from_f64(v: f64) -> Self {
        v
    }
    #[inline(always)]
    fn from_count(c: u64) -> Self {
        c as f64
    }
    #[inline(always)]
    fn total_cmp(&self, other: &Self) -> Ordering {
        f64::total_cmp(self, other)
    }
    #[inline(always)]
    fn is_pos_zero(self) -> bool {
        self.to_bits() == 0
    }
    #[inline(always)]
    fn exp_fast(self) -> Self {
        exp_f64(self)
    }
    #[inline(always)]
    fn ln_(self) -> Self {
        self.ln()
    }
    #[inline(always)]
    fn tanh_(self) -> Self {
        self.tanh()
    }
}

const ROUND_MAGIC: f64 = 6755399441055744.0; // 1.5 * 2**52
const LOG2E: f64 = std::f64::consts::LOG2_E;
// Cody-Waite split of ln 2 (fdlibm): LN2_HI has its 32 low bits zero, so n * LN2_HI is
// exact for |n| < 2**20.
const LN2_HI: f64 = f64::from_bits(0x3FE6_2E42_FEE0_0000);
const LN2_LO: f64 = f64::from_bits(0x3DEA_39EF_3579_3C76);

/// exp(x) without branches or table lookups, so loops over it vectorise.
///
/// Cody-Waite reduction x = n ln2 + r, |r| <= ln2/2, then the Taylor polynomial of
/// degree 13 (truncation error < 2**-57 relative) and an exact scaling by 2**n done as
/// two multiplications so that subnormal results are rounded once. Accurate to about
/// one ulp, like libm and like numpy's and torch's vectorised exp (which already differ
/// from each other and from libm in the last bit). exp(-inf) = 0, exp(+inf) = +inf;
/// NaN is not expected (the ops reject it before computing).
#[inline(always)]
pub fn exp_f64(x: f64) -> f64 {
    let xc = x.clamp(-746.0, 710.0);
    let t = xc * LOG2E + ROUND_MAGIC;
    let n_f = t - ROUND_MAGIC;
    let n = (t.to_bits() as i64).wrapping_sub(ROUND_MAGIC.to_bits() as i64);
    let r = (xc - n_f * LN2_HI) - n_f * LN2_LO;
    // Horner on the Taylor series 1 + r + r^2/2! + ... + r^13/13!
    let mut p = 1.0 / 6_227_020_800.0;
    p = p * r + 1.0 / 479_001_600.0;
    p = p * r + 1.0 / 39_916_800.0;
    p = p * r + 1.0 / 3_628_800.0;
    p = p * r + 1.0 / 362_880.0;
    p = p * r + 1.0 / 40_320.0;
    p = p * r + 1.0 / 5_040.0;
    p = p * r + 1.0 / 720.0;
    p = p * r + 1.0 / 120.0;
    p = p * r + 1.0 / 24.0;
    p = p * r + 1.0 / 6.0;
    p = p * r + 0.5;
    let e = 1.0 + (r + (r * r) * p);
    // 2**n as two in-range powers of two: n in [-1077, 1024] -> halves in range.
    let n1 = n >> 1;
    let n2 = n - n1;
    let s1 = f64::from_bits(((n1 + 1023) as u64) << 52);
    let s2 = f64::from_bits(((n2 + 1023) as u64) << 52);
    let y = (e * s1) * s2;
    if x < -745.2 {
        0.0
    } else if x > 709.8 {
        f64::INFINITY
    } else {
        y
    }
}

const ROUND_MAGIC_F32: f32 = 12_582_912.0; // 1.5 * 2**23
const LN2_HI_F32: f32 = f32::from_bits(0x3F31_8000); // 0.693359375: n * LN2_HI_F32 exact
const LN2_LO_F32: f32 = -2.121_944_4e-4;

/// exp(x) in float32 arithmetic (16 lanes per AVX-512 vector), the same scheme as
/// `exp_f64` with the degree-7 Taylor polynomial (truncation < 2**-27): within one ulp
/// of the correctly rounded result, like numpy's and torch's vectorised expf.
#[inline(always)]
pub fn exp_f32(x: f32) -> f32 {
    let xc = x.clamp(-104.0, 89.0);
    let t = xc * std::f32::consts::LOG2_E + ROUND_MAGIC_F32;
    let n_f = t - ROUND_MAGIC_F32;
    let n = (t.to_bits() as i32).wrapping_sub(ROUND_MAGIC_F32.to_bits() as i32);
    let r = (xc - n_f * LN2_HI_F32) - n_f * LN2_LO_F32;
    let mut p = 1.0 / 5_040.0;
    p = p * r + 1.0 / 720.0;
    p = p * r + 1.0 / 120.0;
    p = p * r + 1.0 / 24.0;
    p = p * r + 1.0 / 6.0;
    p = p * r + 0.5;
    let e = 1.0 + (r + (r * r) * p);
    // n in [-150, 128]: halves in range of normal exponents
    let n1 = n >> 1;
    let n2 = n - n1;
    let s1 = f32::from_bits(((n1 + 127) as u32) << 23);
    let s2 = f32::from_bits(((n2 + 127) as u32) << 23);
    let y = (e * s1) * s2;
    if x < -103.98 {
        0.0
    } else if x > 88.73 {
        f32::INFINITY
    } else {
        y
    }
}

/// Which vector instruction set the kernels run with (detected once).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub enum Simd {
    Baseline = 0,
    Avx2 = 1,
    Avx512 = 2,
}

#[cfg(target_arch = "x86_64")]
fn detect() -> Simd {
    // PYAGENT_ACCEL_SIMD=baseline|avx2 caps the level (used by the tests to check that
    // every build of a kernel gives the same bits).
    let cap = match std::env::var("PYAGENT_ACCEL_SIMD").as_deref() {
        Ok("baseline") => Simd::Baseline,
        Ok("avx2") => Simd::Avx2,
        _ => Simd::Avx512,
    };
    let found = if is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vl")
        && is_x86_feature_detected!("avx512dq")
        && is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
    {
        Simd::Avx512
    } else if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
        Simd::Avx2
    } else {
        Simd::Baseline
    };
    found.min(cap)
}

#[cfg(not(target_arch = "x86_64"))]
fn detect() -> Simd {
    Simd::Baseline
}

pub fn simd_level() -> Simd {
    use std::sync::OnceLock;
    static LEVEL: OnceLock<Simd> = OnceLock::new();
    *LEVEL.get_or_init(detect)
}

/// Define `$name`, a copy of the `#[inline(always)]` function `$imp` compiled three
/// times (baseline x86-64, AVX2, AVX-512) and picked at run time. A generic function's
/// type parameters name their bounds (`fn f<E: Elem, C: Compute>`), but for the short
/// form `fn f<T>`, bounded by `Float`.
macro_rules! multiversion {
    ($(#[$m:meta])* $vis:vis fn $name:ident<$T:ident>($($a:ident : $t:ty),* $(,)?) -> $r:ty = $imp:ident;) => {
        $crate::float::multiversion! {
            $(#[$m])* $vis fn $name<$T: $crate::float::Float>($($a: $t),*) -> $r = $imp;
        }
    };
    ($(#[$m:meta])* $vis:vis fn $name:ident<$($T:ident: $B:path),+>($($a:ident : $t:ty),* $(,)?) -> $r:ty = $imp:ident;) => {
        $(#[$m])*
        $vis fn $name<$($T: $B),+>($($a: $t),*) -> $r {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,bmi1,bmi2,lzcnt,popcnt")]
                unsafe fn v4<$($T: $B),+>($($a: $t),*) -> $r {
                    $imp::<$($T),+>($($a),*)
                }
                #[target_feature(enable = "avx2,fma,bmi1,bmi2,lzcnt,popcnt")]
                unsafe fn v3<$($T: $B),+>($($a: $t),*) -> $r {
                    $imp::<$($T),+>($($a),*)
                }
                match $crate::float::simd_level() {
                    // SAFETY: the level is only reported when the CPU has the features.
                    $crate::float::Simd::Avx512 => return unsafe { v4::<$($T),+>($($a),*) },
                    $crate::float::Simd::Avx2 => return unsafe { v3::<$($T),+>($($a),*) },
                    $crate::float::Simd::Baseline => {}
                }
            }
            $imp::<$($T),+>($($a),*)
        }
    };
    ($(#[$m:meta])* $vis:vis fn $name:ident($($a:ident : $t:ty),* $(,)?) -> $r:ty = $imp:ident;) => {
        $(#[$m])*
        $vis fn $name($($a: $t),*) -> $r {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,bmi1,bmi2,lzcnt,popcnt")]
                unsafe fn v4($($a: $t),*) -> $r {
                    $imp($($a),*)
                }
                #[target_feature(enable = "avx2,fma,bmi1,bmi2,lzcnt,popcnt")]
                unsafe fn v3($($a: $t),*) -> $r {
                    $imp($($a),*)
                }
                match $crate::float::simd_level() {
                    // SAFETY: the level is only reported when the CPU has the features.
                    $crate::float::Simd::Avx512 => return unsafe { v4($($a),*) },
                    $crate::float::Simd::Avx2 => return unsafe { v3($($a),*) },
                    $crate::float::Simd::Baseline => {}
                }
            }
            $imp($($a),*)
        }
    };
}
pub(crate) use multiversion;

#[cfg(test)]
mod tests {
    use super::*;

    fn ulps(a: f64, b: f64) -> u64 {
        (a.to_bits() as i64 - b.to_bits() as i64).unsigned_abs()
    }

    #[test]
    fn exp_matches_libm_within_one_ulp() {
        let mut worst = 0;
        let mut x = -745.0f64;
        while x < 709.0 {
            for dx in [0.0, 1e-9, 0.123_456_789, 0.5, 0.69] {
                let v = x + dx;
                let (a, b) = (exp_f64(v), v.exp());
                if b > f64::MIN_POSITIVE {
                    worst = worst.max(ulps(a, b));
                }
            }
            x += 0.0137;
        }
        assert!(worst <= 1, "worst ulp error {worst}");
        // small arguments, where relative accuracy near 1 matters
        let mut v = -1e-3;
        while v < 1e-3 {
            assert!(ulps(exp_f64(v), v.exp()) <= 1);
            v += 1.37e-7;
        }
    }

    #[test]
    fn exp_f32_within_one_ulp() {
        let mut worst = 0u32;
        let mut x = -103.0f32;
        while x < 88.5 {
            let want = (x as f64).exp() as f32; // correctly rounded but for double rounding
            if want > f32::MIN_POSITIVE {
                let got = exp_f32(x);
                worst =
                    worst.max((got.to_bits() as i64 - want.to_bits() as i64).unsigned_abs() as u32);
            }
            x += 0.000_731;
        }
        assert!(worst <= 1, "worst ulp error {worst}");
        assert_eq!(exp_f32(0.0), 1.0);
        assert_eq!(exp_f32(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_f32(f32::INFINITY), f32::INFINITY);
        assert!(exp_f32(-100.0) > 0.0 && exp_f32(-100.0) < 1e-43);
    }

    #[test]
    fn exp_edges() {
        assert_eq!(exp_f64(0.0), 1.0);
        assert_eq!(exp_f64(-0.0), 1.0);
        assert_eq!(exp_f64(f64::NEG_INFINITY), 0.0);
        assert_eq!(exp_f64(-800.0), 0.0);
        assert_eq!(exp_f64(f64::INFINITY), f64::INFINITY);
        assert_eq!(exp_f64(710.0), f64::INFINITY);
        // subnormal range: within one subnormal step of libm
        for v in [-708.5, -720.0, -740.0, -745.0] {
            assert!(ulps(exp_f64(v), v.exp()) <= 1, "{v}");
        }
    }
}
