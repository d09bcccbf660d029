//! The element types of attention's float arrays and the two compute types.
//!
//! Queries, keys, values and caches are float32, float64, float16 or bfloat16
//! (`Elem`); scores and softmax run in float32, or float64 for float64 queries
//! (`Compute`), as in the reference. numpy has no bfloat16 dtype, so bfloat16 arrays
//! cross into Rust as their uint16 bits (`Bf16`).

use half::f16;
use half::slice::HalfFloatSliceExt;

use crate::float::Float;

/// bfloat16 as numpy holds it without a bfloat16 dtype: the uint16 bit pattern
/// (the Python wrappers pass `tensor.view(torch.int16).numpy().view(np.uint16)`).
#[repr(transparent)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Bf16(pub u16);

// SAFETY: `Bf16` is `repr(transparent)` over u16, so it has numpy's uint16 layout.
unsafe impl numpy::Element for Bf16 {
    const IS_COPY: bool = true;

    fn get_dtype(py: pyo3::Python<'_>) -> pyo3::Bound<'_, numpy::PyArrayDescr> {
        u16::get_dtype(py)
    }

    fn clone_ref(&self, _py: pyo3::Python<'_>) -> Self {
        *self
    }
}

/// An array element: converted exactly to f32/f64, and rounded from them to nearest
/// even (numpy's and torch's `astype`).
pub trait Elem: numpy::Element + Copy + Default + Send + Sync + 'static {
    /// The type scores are computed in when this is the query's type.
    type Compute: Compute;

    fn to_f32(self) -> f32;
    fn to_f64(self) -> f64;
    fn from_f32(v: f32) -> Self;
    fn from_f64(v: f64) -> Self;

    /// `dst[i] = src[i]` widened to f32 (vectorised where the type allows).
    #[inline(always)]
    fn widen_f32(src: &[Self], dst: &mut [f32]) {
        for (d, s) in dst.iter_mut().zip(src) {
            *d = s.to_f32();
        }
    }

    /// `dst[i] = src[i]` widened to f64.
    #[inline(always)]
    fn widen_f64(src: &[Self], dst: &mut [f64]) {
        for (d, s) in dst.iter_mut().zip(src) {
            *d = s.to_f64();
        }
    }
}

impl Elem for f32 {
    type Compute = f32;

    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
    #[inline(always)]
    fn to_f64(self) -> f64 {
        self as f64
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        v
    }
    #[inline(always)]
    fn from_f64(v: f64) -> Self {
        v as f32
    }
    #[inline(always)]
    fn widen_f32(src: &[Self], dst: &mut [f32]) {
        dst.copy_from_slice(src);
    }
}

impl Elem for f64 {
    type Compute = f64;

    #[inline(always)]
    fn to_f32(self) -> f32 {
        self as f32
    }
    #[inline(always)]
    fn to_f64(self) -> f64 {
        self
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        v as f64
    }
    #[inline(always)]
    fn from_f64(v: f64) -> Self {
        v
    }
    #[inline(always)]
    fn widen_f64(src: &[Self], dst: &mut [f64]) {
        dst.copy_from_slice(src);
    }
}

impl Elem for f16 {
    type Compute = f32;

    #[inline(always)]
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    #[inline(always)]
    fn to_f64(self) -> f64 {
        f16::to_f64(self)
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        f16::from_f32(v)
    }
    #[inline(always)]
    fn from_f64(v: f64) -> Self {
        f16::from_f64(v)
    }
    /// F16C conversion, detected at run time by the `half` crate.
    #[inline(always)]
    fn widen_f32(src: &[Self], dst: &mut [f32]) {
        src.convert_to_f32_slice(dst);
    }
    #[inline(always)]
    fn widen_f64(src: &[Self], dst: &mut [f64]) {
        src.convert_to_f64_slice(dst);
    }
}

impl Elem for Bf16 {
    type Compute = f32;

    /// The high half of an f32: a shift, which vectorises.
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f32::from_bits((self.0 as u32) << 16)
    }
    #[inline(always)]
    fn to_f64(self) -> f64 {
        self.to_f32() as f64
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        Bf16(half::bf16::from_f32(v).to_bits())
    }
    #[inline(always)]
    fn from_f64(v: f64) -> Self {
        Bf16(half::bf16::from_f64(v).to_bits())
    }
}

/// The type scores, softmax and the weighted sum are computed in: f32 or f64.
pub trait Compute: Float {
    /// `dst[i] = src[i]` in this type (exact: every `Elem` widens exactly to f32/f64
    /// except f64 to f32, which rounds like the reference's `astype`).
    fn widen<E: Elem>(src: &[E], dst: &mut [Self]);
    fn from_elem<E: Elem>(x: E) -> Self;
    fn to_elem<E: Elem>(self) -> E;
    fn tanh_(self) -> Self;
}

impl Compute for f32 {
    #[inline(always)]
    fn widen<E: Elem>(src: &[E], dst: &mut [f32]) {
        E::widen_f32(src, dst);
    }
    #[inline(always)]
    fn from_elem<E: Elem>(x: E) -> Self {
        x.to_f32()
    }
    #[inline(always)]
    fn to_elem<E: Elem>(self) -> E {
        E::from_f32(self)
    }
    #[inline(always)]
    fn tanh_(self) -> Self {
        self.tanh()
    }
}

impl Compute for f64 {
    #[inline(always)]
    fn widen<E: Elem>(src: &[E], dst: &mut [f64]) {
        E::widen_f64(src, dst);
    }
    #[inline(always)]
    fn from_elem<E: Elem>(x: E) -> Self {
        x.to_f64()
    }
    #[inline(always)]
    fn to_elem<E: Elem>(self) -> E {
        E::from_f64(self)
    }
    #[inline(always)]
    fn tanh_(self) -> Self {
        self.tanh()
    }
}
