//! The storage dtypes of the float ops (`layers`, `rope`, `attention`): f32, f64, f16
//! and bf16, their compute types, and how the bindings read arrays of them from numpy.
//!
//! Like the reference, f64 is computed in f64 and the other dtypes in f32 (`Elem::C`);
//! half types are rounded back to their own type (round to nearest even) wherever the
//! reference stores an intermediate in the input dtype: `E::round(v)` is that rounding,
//! kept in the compute type. The f16 and bf16 conversions are branch-free bit
//! manipulations (so loops over them vectorise), exact for every value: the `half`
//! crate's scalar conversions are the oracle of the tests. NaN payloads are not
//! preserved bit for bit (numpy and torch differ there themselves).
//!
//! numpy has no bfloat16: a bf16 array travels as its bits in an int16 array (the
//! Python side passes `tensor.view(torch.int16).numpy()`, zero-copy), whose elements
//! are `Bf16` here.

use std::any::TypeId;

use half::f16;
use numpy::ndarray::ArrayViewD;
use numpy::{
    PyArrayDescr, PyArrayDyn, PyReadonlyArrayDyn, PyReadwriteArrayDyn, PyUntypedArray,
    PyUntypedArrayMethods,
};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;

use crate::float::Float;
use crate::py_util::{readonly, value_error, writable};

/// A bfloat16 value as its bits (the high half of an f32), which numpy holds in an
/// int16 array.
#[repr(transparent)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Bf16(pub u16);

// SAFETY: `Bf16` is `repr(transparent)` over u16: numpy's int16 layout, and every bit
// pattern is a value of both.
unsafe impl numpy::Element for Bf16 {
    const IS_COPY: bool = true;

    fn get_dtype(py: Python<'_>) -> Bound<'_, PyArrayDescr> {
        i16::get_dtype(py)
    }

    fn clone_ref(&self, _py: Python<'_>) -> Self {
        *self
    }
}

/// A storage dtype: the numpy element of its arrays, and how its values load into the
/// compute type and store back.
pub trait Elem: numpy::Element + Copy + Send + Sync + 'static {
    /// The reference's compute type: f64 for f64, f32 for the others.
    type C: Compute;
    /// The dtype's name, for error messages.
    const NAME: &'static str;

    /// This value as an f32: exact, but an f64 is rounded (to nearest even).
    fn to_f32(self) -> f32;
    /// This value as an f64: exact. The default goes through f32, which holds every value
    /// of the other dtypes; f64 overrides it.
    #[inline(always)]
    fn to_f64(self) -> f64 {
        self.to_f32() as f64
    }
    /// `v` rounded to this type (to nearest, ties to even).
    fn store(v: Self::C) -> Self;

    /// This value in the compute type (exact).
    #[inline(always)]
    fn load(self) -> Self::C {
        Self::C::from_elem(self)
    }
    /// `v` rounded to this type and loaded back: an intermediate stored in the input dtype.
    #[inline(always)]
    fn round(v: Self::C) -> Self::C {
        Self::store(v).load()
    }
    /// This value converted to `D` (numpy's and torch's `astype`): itself (bit for bit)
    /// when D is this type, else loaded into D's compute type and rounded to D; f64
    /// reaches a half type through f32, as in torch.
    #[inline(always)]
    fn cast<D: Elem>(self) -> D {
        if TypeId::of::<Self>() == TypeId::of::<D>() {
            // SAFETY: Self and D are the same type (checked just above).
            unsafe { std::mem::transmute_copy(&self) }
        } else {
            D::store(D::C::from_elem(self))
        }
    }
}

/// A compute type: f32 or f64.
pub trait Compute: Float {
    /// `x` in this type: exact, but an f64 is rounded to f32 (to nearest even).
    fn from_elem<E: Elem>(x: E) -> Self;

    /// `dst[i] = from_elem(src[i])` for `src` and `dst` of one length: a copy when E is
    /// this type, else a loop the compiler vectorises.
    #[inline(always)]
    fn widen<E: Elem>(src: &[E], dst: &mut [Self]) {
        if TypeId::of::<E>() == TypeId::of::<Self>() {
            // SAFETY: E and Self are the same type (checked just above).
            dst.copy_from_slice(unsafe {
                std::slice::from_raw_parts(src.as_ptr().cast(), src.len())
            });
        } else {
            for (d, &s) in dst.iter_mut().zip(src) {
                *d = Self::from_elem(s);
            }
        }
    }
}

impl Compute for f32 {
    #[inline(always)]
    fn from_elem<E: Elem>(x: E) -> f32 {
        x.to_f32()
    }
}

impl Compute for f64 {
    #[inline(always)]
    fn from_elem<E: Elem>(x: E) -> f64 {
        x.to_f64()
    }
}

impl Elem for f32 {
    type C = f32;
    const NAME: &'static str = "float32";
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
    #[inline(always)]
    fn store(v: f32) -> f32 {
        v
    }
}

impl Elem for f64 {
    type C = f64;
    const NAME: &'static str = "float64";
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self as f32
    }
    #[inline(always)]
    fn to_f64(self) -> f64 {
        self
    }
    #[inline(always)]
    fn store(v: f64) -> f64 {
        v
    }
}

impl Elem for f16 {
    type C = f32;
    const NAME: &'static str = "float16";
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f16_bits_to_f32(self.to_bits())
    }
    #[inline(always)]
    fn store(v: f32) -> f16 {
        f16::from_bits(f32_to_f16_bits(v))
    }
}

impl Elem for Bf16 {
    type C = f32;
    const NAME: &'static str = "bfloat16";
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f32::from_bits((self.0 as u32) << 16)
    }
    #[inline(always)]
    fn store(v: f32) -> Bf16 {
        Bf16(f32_to_bf16_bits(v))
    }
}

/// f16 bits to f32 (exact): normal numbers rebias the exponent, subnormals are
/// normalised by an exact float subtraction, inf/NaN keep an all-ones exponent.
#[inline(always)]
pub fn f16_bits_to_f32(h: u16) -> f32 {
    const EXP: u32 = 0x7c00 << 13; // the f16 exponent field, shifted into f32 position
    let magnitude = ((h as u32) & 0x7fff) << 13;
    let exp = magnitude & EXP;
    let rebiased = magnitude + ((127 - 15) << 23);
    let inf_nan = rebiased + ((128 - 16) << 23);
    let subnormal = (f32::from_bits(rebiased + (1 << 23)) - f32::from_bits(113 << 23)).to_bits();
    let bits = if exp == EXP {
        inf_nan
    } else if exp == 0 {
        subnormal
    } else {
        rebiased
    };
    f32::from_bits(bits | (((h as u32) & 0x8000) << 16))
}

/// f32 to f16 bits, rounded to nearest even: overflow to inf, subnormals rounded by
/// adding 0.5 (whose ulp is the f16 subnormal step), NaN stays NaN (quiet).
#[inline(always)]
pub fn f32_to_f16_bits(v: f32) -> u16 {
    let bits = v.to_bits();
    let sign = bits & 0x8000_0000;
    let a = bits ^ sign;
    let half = 0.5f32;
    let subnormal = (f32::from_bits(a) + half)
        .to_bits()
        .wrapping_sub(half.to_bits());
    let odd = (a >> 13) & 1;
    let normal = a.wrapping_sub(112 << 23).wrapping_add(0xfff + odd) >> 13;
    let nan = 0x7e00 | ((a >> 13) & 0x3ff);
    let out = if a > 0x7f80_0000 {
        nan
    } else if a >= (127 + 16) << 23 {
        0x7c00 // overflow (and inf)
    } else if a < 113 << 23 {
        subnormal
    } else {
        normal
    };
    (out | (sign >> 16)) as u16
}

/// f32 to bf16 bits, rounded to nearest even (torch's `round_to_nearest_even`, NaN as
/// its 0x7fc0).
#[inline(always)]
pub fn f32_to_bf16_bits(v: f32) -> u16 {
    let bits = v.to_bits();
    let rounded = (bits.wrapping_add(0x7fff + ((bits >> 16) & 1)) >> 16) as u16;
    if v.is_nan() {
        0x7fc0
    } else {
        rounded
    }
}

// ---------------------------------------------------------------------------------
// Reading arrays in the bindings

/// The dtype of a float array passed by the Python wrappers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dtype {
    F32,
    F64,
    F16,
    /// bfloat16 bits in an int16 array
    Bf16,
}

/// The dtype of `x` (a type check per candidate, no error built on a miss); TypeError
/// naming `name` for anything else.
pub fn dtype_of(x: &Bound<'_, PyAny>, name: &str) -> PyResult<Dtype> {
    if x.cast::<PyArrayDyn<f32>>().is_ok() {
        Ok(Dtype::F32)
    } else if x.cast::<PyArrayDyn<Bf16>>().is_ok() {
        Ok(Dtype::Bf16)
    } else if x.cast::<PyArrayDyn<f64>>().is_ok() {
        Ok(Dtype::F64)
    } else if x.cast::<PyArrayDyn<f16>>().is_ok() {
        Ok(Dtype::F16)
    } else {
        let dtype = match x.cast::<PyUntypedArray>() {
            Ok(a) => a.dtype().to_string(),
            Err(_) => x.get_type().name()?.to_string(),
        };
        Err(PyTypeError::new_err(format!(
            "{name} must be a float16, bfloat16 (as int16 bits), float32 or float64 numpy \
             array, got {dtype}"
        )))
    }
}

/// `$body` with the type `$E` bound to the storage type of `$dtype` (a `Dtype`): how a
/// binding runs a function generic over `Elem` for the dtype of an array (`dtype_of`).
macro_rules! with_elem {
    ($dtype:expr, $E:ident => $body:expr) => {
        match $dtype {
            $crate::elem::Dtype::F32 => {
                type $E = f32;
                $body
            }
            $crate::elem::Dtype::F64 => {
                type $E = f64;
                $body
            }
            $crate::elem::Dtype::F16 => {
                type $E = half::f16;
                $body
            }
            $crate::elem::Dtype::Bf16 => {
                type $E = $crate::elem::Bf16;
                $body
            }
        }
    };
}
pub(crate) use with_elem;

/// `x` as an array of `E` (TypeError if it holds another dtype), aligned (numpy's flag:
/// ValueError otherwise, as Rust reads whole elements).
fn typed<'a, 'py, E: Elem>(
    x: &'a Bound<'py, PyAny>,
    name: &str,
) -> PyResult<&'a Bound<'py, PyArrayDyn<E>>> {
    let array = x.cast::<PyArrayDyn<E>>().map_err(|_| {
        PyTypeError::new_err(format!(
            "{name} must be a {} array like the others",
            E::NAME
        ))
    })?;
    if !array.is_aligned() {
        return Err(value_error(format!(
            "{name} is not aligned in memory; pass a copy (np.array(x)) instead"
        )));
    }
    Ok(array)
}

/// A read-only borrow of `x`, an aligned array of `E` (see `typed`).
pub fn float_array<'py, E: Elem>(
    x: &Bound<'py, PyAny>,
    name: &str,
) -> PyResult<PyReadonlyArrayDyn<'py, E>> {
    readonly(typed::<E>(x, name)?, name)
}

/// A writable borrow of `x`, an aligned array of `E` (see `typed`), written in place.
pub fn float_array_mut<'py, E: Elem>(
    x: &Bound<'py, PyAny>,
    name: &str,
) -> PyResult<PyReadwriteArrayDyn<'py, E>> {
    writable(typed::<E>(x, name)?, name)
}

/// The lanes of `x`'s last axis as slices, in C order: leading axes may have any strides
/// (views are read in place), the last axis must be contiguous.
pub fn rows<'a, E: Elem>(x: &'a PyReadonlyArrayDyn<'_, E>, name: &str) -> PyResult<Vec<&'a [E]>> {
    fn push<'a, E: Elem>(view: ArrayViewD<'a, E>, out: &mut Vec<&'a [E]>) -> bool {
        if view.ndim() > 1 {
            return view.into_outer_iter().all(|sub| push(sub, out));
        }
        view.to_slice().map(|row| out.push(row)).is_some()
    }
    if x.ndim() == 0 {
        return Err(value_error(format!(
            "{name} must have at least one axis, got a scalar"
        )));
    }
    let width = x.shape()[x.ndim() - 1];
    let mut out = Vec::with_capacity(x.len() / width.max(1));
    if !push(x.as_array(), &mut out) {
        return Err(value_error(format!(
            "{name} must have a contiguous last axis (unit stride), got strides {:?} (bytes) \
             for shape {:?}; pyagent_accel does not copy it silently (pass \
             np.ascontiguousarray({name}) or {name}.contiguous())",
            x.strides(),
            x.shape()
        )));
    }
    Ok(out)
}

/// A new C-contiguous array of `shape` whose elements the caller writes before it
/// reaches Python (uninitialised memory: no cost for zeroing a big output).
///
/// # Safety
/// Every element must be written before the array is returned to Python.
pub unsafe fn new_array<'py, E: Elem>(
    py: Python<'py>,
    shape: &[usize],
) -> Bound<'py, PyArrayDyn<E>> {
    PyArrayDyn::<E>::new(py, shape, false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::bf16;

    #[test]
    fn f16_to_f32_is_exact_for_every_value() {
        for h in 0..=u16::MAX {
            let (got, want) = (f16_bits_to_f32(h), f16::from_bits(h).to_f32());
            assert!(
                got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
                "{h:#x}"
            );
        }
    }

    #[test]
    fn f32_to_f16_rounds_to_nearest_even() {
        // every f16 and the f32 values around each of them and around their midpoints
        for h in 0..=u16::MAX {
            let v = f16::from_bits(h).to_f32();
            let next = f16::from_bits(h.wrapping_add(1)).to_f32();
            let mid = ((v as f64 + next as f64) / 2.0) as f32;
            for x in [
                v,
                mid,
                f32::from_bits(mid.to_bits().wrapping_add(1)),
                f32::from_bits(mid.to_bits().wrapping_sub(1)),
            ] {
                let (got, want) = (f32_to_f16_bits(x), f16::from_f32(x));
                if want.is_nan() {
                    assert!(f16::from_bits(got).is_nan(), "{x:e}");
                } else {
                    assert_eq!(got, want.to_bits(), "{x:e} ({:#x})", x.to_bits());
                }
            }
        }
        // a sweep of f32 bit patterns
        let mut bits = 0u32;
        while bits < u32::MAX - 9973 {
            let x = f32::from_bits(bits);
            if !x.is_nan() {
                assert_eq!(f32_to_f16_bits(x), f16::from_f32(x).to_bits(), "{x:e}");
            }
            bits += 9973;
        }
    }

    #[test]
    fn f32_to_bf16_rounds_to_nearest_even() {
        let mut bits = 0u32;
        while bits < u32::MAX - 997 {
            let x = f32::from_bits(bits);
            let got = f32_to_bf16_bits(x);
            if x.is_nan() {
                assert_eq!(got, 0x7fc0);
            } else {
                assert_eq!(got, bf16::from_f32(x).to_bits(), "{x:e}");
            }
            bits += 997;
        }
        for x in [
            0.0f32,
            -0.0,
            1.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            3.0e38,
            -1e-40,
        ] {
            assert_eq!(f32_to_bf16_bits(x), bf16::from_f32(x).to_bits(), "{x:e}");
        }
    }

    #[test]
    fn round_keeps_values_of_the_type() {
        assert_eq!(<Bf16 as Elem>::round(1.0 + 1.0 / 256.0), 1.0); // a tie: to even
        assert_eq!(<Bf16 as Elem>::round(1.0 + 3.0 / 256.0), 1.0 + 4.0 / 256.0);
        assert_eq!(<f16 as Elem>::round(1.0 + 1.0 / 2048.0), 1.0);
        assert_eq!(<f16 as Elem>::round(65520.0), f32::INFINITY);
        assert_eq!(<f32 as Elem>::round(0.1), 0.1);
    }

    #[test]
    fn cast_rounds_once_from_the_compute_type() {
        // 1 + 2**-8 + 2**-23: above the bf16 tie between 1 and 1 + 2**-7 by its last bit
        let above_tie = 1.0f32 + 1.0 / 256.0 + f32::EPSILON;
        assert_eq!(above_tie.cast::<Bf16>().to_f32(), 1.0 + 1.0 / 128.0);
        assert_eq!(Bf16::store(1.0 / 3.0).cast::<f64>(), 0.333_984_375);
        // f64 reaches f16 through f32 (torch's conversion)
        assert_eq!((1.0f64 / 3.0).cast::<f16>(), f16::from_f32(1.0 / 3.0));
        assert_eq!(1e300f64.cast::<f32>(), f32::INFINITY);
    }
}
