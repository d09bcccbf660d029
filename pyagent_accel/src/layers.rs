//! Kernels of `pyagent_accel.ops.layers` (RMS norm, Gemma's RMS norm, layer norm, SwiGLU,
//! GELU, GeGLU) and their Python bindings (contract: `pyagent_ref.ops.layers`).
//!
//! Every op works row by row on the last axis, rows in parallel for large inputs, with
//! the reference's operations in the reference's order and dtypes, so the results are
//! its bits but for a few library functions: the means are numpy's pairwise sums (torch
//! sums in another order, a last-bit difference in float32), silu's `exp` is accurate to
//! one ulp like numpy's and torch's, which differ from each other too, and GELU's `tanh`
//! and `erf` are this module's, vectorisable (see `tanh_in`, `erf_in`). Half types
//! compute in float32 and round back where the reference stores in its dtype (see
//! `elem`).

use std::f64::consts::{FRAC_2_SQRT_PI, PI, SQRT_2};

use numpy::{PyArrayMethods, PyReadonlyArrayDyn, PyUntypedArrayMethods};
use pyo3::prelude::*;
use rayon::prelude::*;

use crate::elem::{dtype_of, float_array, new_array, rows, with_elem, Compute, Elem};
use crate::float::{multiversion, Float};
use crate::py_util::{detached, value_error};
use crate::sampling::row_scan::pairwise_sum;

/// Rows go to the thread pool in pieces of at least this many input elements (some
/// 40 us of work; silu's exp costs more per element): handing over less work costs
/// more than it saves, so decode batches run on the calling thread.
const RMS_NORM_PIECE: usize = 1 << 17;
const SILU_PIECE: usize = 1 << 16;
/// GELU's erf or tanh costs more per element than silu's exp.
const GELU_PIECE: usize = 1 << 14;

/// The fewest rows per piece for rows of `width` elements.
fn min_rows(piece: usize, width: usize) -> usize {
    (piece / width.max(1)).max(1)
}

/// `x`, or with a residual `round(x + residual)` written to the new residual's row: the
/// normalisations' input h, in the storage type.
#[inline(always)]
fn residual_sum<'a, E: Elem>(x: &'a [E], residual: Option<(&[E], &'a mut [E])>) -> &'a [E] {
    match residual {
        Some((r, new)) => {
            for ((n, &a), &b) in new.iter_mut().zip(x).zip(r) {
                *n = E::store(a.load() + b.load());
            }
            new
        }
        None => x,
    }
}

/// numpy's mean of a row: its pairwise sum divided by the length (in f64 and rounded,
/// which is the division in the row's type: 53 bits round an f32 quotient exactly).
#[inline(always)]
fn mean<C: Compute>(values: &[C]) -> C {
    C::from_f64(pairwise_sum(values).to_f64() / values.len() as f64)
}

/// sqrt(mean_square + eps) in the compute type (the sqrt exact-rounded via f64).
#[inline(always)]
fn root<C: Compute>(mean_square: C, eps: C) -> C {
    C::from_f64((mean_square + eps).to_f64().sqrt())
}

/// sqrt(mean(h * h) + eps) of a row in the compute type; `squares` is scratch of the
/// row's length.
#[inline(always)]
fn root_mean_square<E: Elem>(h: &[E], eps: E::C, squares: &mut [E::C]) -> E::C {
    for (s, &v) in squares.iter_mut().zip(h) {
        let v = v.load();
        *s = v * v;
    }
    root(mean(&squares[..h.len()]), eps)
}

/// One row of `rms_norm`: `out = weight * round(h / sqrt(mean(h * h) + eps))` in the
/// storage type, h as `residual_sum` makes it. `scratch` holds at least a row.
#[inline(always)]
fn rms_norm_row_impl<E: Elem>(
    x: &[E],
    residual: Option<(&[E], &mut [E])>,
    weight: &[E],
    eps: E::C,
    scratch: &mut [E::C],
    out: &mut [E],
) {
    let h = residual_sum(x, residual);
    let rms = root_mean_square(h, eps, scratch);
    for ((o, &v), &w) in out.iter_mut().zip(h).zip(weight) {
        *o = E::store(w.load() * E::round(v.load() / rms));
    }
}

multiversion! {
    fn rms_norm_row<E: Elem>(
        x: &[E],
        residual: Option<(&[E], &mut [E])>,
        weight: &[E],
        eps: E::C,
        scratch: &mut [E::C],
        out: &mut [E],
    ) -> () = rms_norm_row_impl;
}

/// One row of `gemma_rms_norm`: `out = round(h / sqrt(mean(h * h) + eps) * (1 + weight))`,
/// all in the compute type (the weight already in it) and rounded once.
#[inline(always)]
fn gemma_rms_norm_row_impl<E: Elem>(
    x: &[E],
    residual: Option<(&[E], &mut [E])>,
    weight: &[E::C],
    eps: E::C,
    scratch: &mut [E::C],
    out: &mut [E],
) {
    let h = residual_sum(x, residual);
    let rms = root_mean_square(h, eps, scratch);
    for ((o, &v), &w) in out.iter_mut().zip(h).zip(weight) {
        *o = E::store(v.load() / rms * (E::C::ONE + w));
    }
}

multiversion! {
    fn gemma_rms_norm_row<E: Elem>(
        x: &[E],
        residual: Option<(&[E], &mut [E])>,
        weight: &[E::C],
        eps: E::C,
        scratch: &mut [E::C],
        out: &mut [E],
    ) -> () = gemma_rms_norm_row_impl;
}

/// One row of `layer_norm`: with c = h - mean(h) and the biased variance mean(c * c),
/// `out = round(c / sqrt(var + eps) * weight + bias)`, all in the compute type (weight
/// and bias already in it). `scratch` holds at least two rows: c and its squares.
#[inline(always)]
fn layer_norm_row_impl<E: Elem>(
    x: &[E],
    residual: Option<(&[E], &mut [E])>,
    weight: &[E::C],
    bias: &[E::C],
    eps: E::C,
    scratch: &mut [E::C],
    out: &mut [E],
) {
    let h = residual_sum(x, residual);
    let (centred, rest) = scratch.split_at_mut(h.len());
    let squares = &mut rest[..h.len()];
    E::C::widen(h, centred);
    let mu = mean(centred);
    for (c, s) in centred.iter_mut().zip(squares.iter_mut()) {
        *c = *c - mu;
        *s = *c * *c;
    }
    let std = root(mean(squares), eps);
    for (((o, &c), &w), &b) in out.iter_mut().zip(centred.iter()).zip(weight).zip(bias) {
        *o = E::store(c / std * w + b);
    }
}

multiversion! {
    fn layer_norm_row<E: Elem>(
        x: &[E],
        residual: Option<(&[E], &mut [E])>,
        weight: &[E::C],
        bias: &[E::C],
        eps: E::C,
        scratch: &mut [E::C],
        out: &mut [E],
    ) -> () = layer_norm_row_impl;
}

/// One row of `silu_and_mul`: `out[j] = gate / (1 + exp(-gate)) * up` for the halves
/// `gate, up` of `x`, computed in the compute type and rounded once.
#[inline(always)]
fn silu_and_mul_row_impl<E: Elem>(x: &[E], out: &mut [E]) {
    let (gate, up) = x.split_at(out.len());
    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        let g = g.load();
        *o = E::store(g / (E::C::ONE + (E::C::ZERO - g).exp_fast()) * u.load());
    }
}

multiversion! {
    fn silu_and_mul_row<E: Elem>(x: &[E], out: &mut [E]) -> () = silu_and_mul_row_impl;
}

// --- GELU ------------------------------------------------------------------------------

/// The two forms of GELU, the reference's `approximate` argument.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Gelu {
    /// "none": 0.5 * x * (1 + erf(x / sqrt(2))).
    Erf,
    /// "tanh": 0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x**3))).
    Tanh,
}

impl Gelu {
    fn parse(approximate: &str) -> PyResult<Gelu> {
        match approximate {
            "none" => Ok(Gelu::Erf),
            "tanh" => Ok(Gelu::Tanh),
            _ => Err(value_error(format!(
                "approximate must be one of ('none', 'tanh'), got '{approximate}'"
            ))),
        }
    }
}

/// Terms of erf's Maclaurin series, used for |x| < 2 (within 6 ulps there).
const ERF_SERIES_TERMS: usize = 32;

/// The coefficients of erf's Maclaurin series in x: erf(x) = x * sum_k c[k] * x**(2k),
/// c[k] = 2 / sqrt(pi) * (-1)**k / (k! * (2k + 1)).
const ERF_SERIES: [f64; ERF_SERIES_TERMS] = {
    let mut c = [0.0; ERF_SERIES_TERMS];
    let mut signed_reciprocal_factorial = 1.0; // (-1)**k / k!
    let mut k = 0;
    while k < ERF_SERIES_TERMS {
        c[k] = FRAC_2_SQRT_PI * signed_reciprocal_factorial / (2 * k + 1) as f64;
        k += 1;
        signed_reciprocal_factorial = -signed_reciprocal_factorial / k as f64;
    }
    c
};

/// Levels of the continued fraction of erfc, used for 2 <= |x| < 6 (erf within 2 ulps).
const ERFC_FRACTION_LEVELS: usize = 40;

/// erfc(a) for a >= 2 by its continued fraction, evaluated from the bottom:
/// erfc(a) = exp(-a**2) / sqrt(pi) / (a + (1/2) / (a + 1 / (a + (3/2) / (a + ...)))).
#[inline(always)]
fn erfc_fraction(a: f64) -> f64 {
    let mut tail = a;
    for k in (1..=ERFC_FRACTION_LEVELS).rev() {
        tail = a + (k as f64 * 0.5) / tail;
    }
    (-a * a).exp() * (FRAC_2_SQRT_PI * 0.5) / tail
}

/// The error function in f64, within a few ulps (Rust's std has none; the reference's
/// numpy path uses Python's `math.erf`, torch its own). The Maclaurin series below 2
/// (its alternating terms cancel at most a decimal digit there), 1 - erfc by the
/// continued fraction from 2 on, and +-1 from 6 on, where erfc(6) ~ 2e-17 no longer
/// shows in f64. Odd: erf(-x) = -erf(x); NaN stays NaN.
pub fn erf(x: f64) -> f64 {
    let a = x.abs();
    let magnitude = if a < 2.0 {
        let a2 = a * a;
        a * ERF_SERIES.iter().rev().fold(0.0, |sum, &c| sum * a2 + c)
    } else if a < 6.0 {
        1.0 - erfc_fraction(a)
    } else if a.is_nan() {
        return x;
    } else {
        1.0
    };
    magnitude.copysign(x)
}

/// Where `erf_f32`'s fit ends: erf(u) rounds to 1 in f32 from about 3.92 on.
const ERF_F32_MAX: f64 = 3.95;
const ERF_F32_T_MIN: f64 = 1.0 / (1.0 + ERF_F32_MAX / 2.0);

/// erfc(u) * exp(u**2) for 0 <= u <= `ERF_F32_MAX` as a polynomial in s, where
/// t = 1 / (1 + u / 2) is mapped from [ERF_F32_T_MIN, 1] onto [-1, 1]: a Chebyshev
/// interpolation fitted with Python's `math.erfc` by `tools/fit_erf.py` (which prints
/// these), lowest degree first.
const ERFCX_POLYNOMIAL: [f64; 13] = [
    0.4293080167111964,
    0.40928912106283716,
    0.1415138360203218,
    0.022200234078387414,
    -0.001593034076024125,
    -0.0008408560657336137,
    9.888132156542598e-05,
    3.3303416378864184e-05,
    -9.620421946175116e-06,
    -4.7642730254683684e-07,
    7.003942706004024e-07,
    -8.05678352496055e-08,
    -2.5448914617614667e-08,
];

/// erf(u) for an f32 computation, evaluated in f64 within 3e-12 (absolute) of the
/// exact value, far below an f32 ulp of 1 + erf(u), which is what GELU adds it to; no
/// branches or divisions but one, so GELU's loops vectorise. 1 - exp(-u**2) *
/// erfcx(u) from the fit above, |u| clamped to its end (where erf is 1 in f32, and
/// where a NaN goes too: GELU's factor x carries the NaN), odd in u.
#[inline(always)]
fn erf_f32(u: f64) -> f64 {
    let a = u.abs();
    let a = if a < ERF_F32_MAX { a } else { ERF_F32_MAX };
    let t = 1.0 / (1.0 + a * 0.5);
    let s = (t - ERF_F32_T_MIN) * (2.0 / (1.0 - ERF_F32_T_MIN)) - 1.0;
    let erfcx = ERFCX_POLYNOMIAL
        .iter()
        .rev()
        .fold(0.0, |sum, &c| sum * s + c);
    (1.0 - (-a * a).exp_fast() * erfcx).copysign(u)
}

/// erf in the compute type: the f64 series and fraction of `erf`, a few ulps, for
/// f64; `erf_f32` for f32 (the reference's numpy path takes Python's `math.erf` in
/// float64 and rounds to float32, torch its own float32 erf).
#[inline(always)]
fn erf_in<C: Compute>(u: C) -> C {
    if std::mem::size_of::<C>() == 4 {
        C::from_f64(erf_f32(u.to_f64()))
    } else {
        C::from_f64(erf(u.to_f64()))
    }
}

/// tanh(y) = (1 - e) / (1 + e) with e = exp(-2|y|), the sign of y, through the
/// vectorisable `exp_fast` instead of libm's scalar tanh: within a few ulps of 1 (1 - e
/// cancels for small |y|), which is what GELU adds it to.
#[inline(always)]
fn tanh_in<C: Compute>(y: C) -> C {
    let negative = y < C::ZERO;
    let a = if negative { C::ZERO - y } else { y };
    let e = (C::ZERO - (a + a)).exp_fast();
    let t = (C::ONE - e) / (C::ONE + e);
    if negative {
        C::ZERO - t
    } else {
        t
    }
}

/// gelu(x) in the erf form in the compute type, with the reference's operations in its
/// order and its constants rounded to the compute type (a Python float meeting a
/// float32 array).
#[inline(always)]
fn gelu_erf<C: Compute>(x: C) -> C {
    C::from_f64(0.5) * x * (C::ONE + erf_in(x / C::from_f64(SQRT_2)))
}

/// gelu(x) in the tanh form, in the compute type, as `gelu_erf`.
#[inline(always)]
fn gelu_tanh<C: Compute>(x: C) -> C {
    let cubic = C::from_f64(0.044715) * x * x * x;
    let inner = C::from_f64((2.0 / PI).sqrt()) * (x + cubic);
    C::from_f64(0.5) * x * (C::ONE + tanh_in(inner))
}

/// One row of `gelu`, elementwise, computed in the compute type and rounded once (one
/// loop per form, so that each vectorises).
#[inline(always)]
fn gelu_row_impl<E: Elem>(x: &[E], form: Gelu, out: &mut [E]) {
    let pairs = out.iter_mut().zip(x);
    match form {
        Gelu::Erf => pairs.for_each(|(o, &v)| *o = E::store(gelu_erf(v.load()))),
        Gelu::Tanh => pairs.for_each(|(o, &v)| *o = E::store(gelu_tanh(v.load()))),
    }
}

multiversion! {
    fn gelu_row<E: Elem>(x: &[E], form: Gelu, out: &mut [E]) -> () = gelu_row_impl;
}

/// One row of `gelu_and_mul`: `out[j] = gelu(gate) * up` for the halves `gate, up` of
/// `x`, computed in the compute type and rounded once.
#[inline(always)]
fn gelu_and_mul_row_impl<E: Elem>(x: &[E], form: Gelu, out: &mut [E]) {
    let (gate, up) = x.split_at(out.len());
    let triples = out.iter_mut().zip(gate).zip(up);
    match form {
        Gelu::Erf => triples.for_each(|((o, &g), &u)| *o = E::store(gelu_erf(g.load()) * u.load())),
        Gelu::Tanh => {
            triples.for_each(|((o, &g), &u)| *o = E::store(gelu_tanh(g.load()) * u.load()))
        }
    }
}

multiversion! {
    fn gelu_and_mul_row<E: Elem>(x: &[E], form: Gelu, out: &mut [E]) -> () = gelu_and_mul_row_impl;
}

// ---------------------------------------------------------------------------------
// Python bindings. The wrappers in `python/pyagent_accel/ops/layers.py` have made the
// reference's checks; these check again what the kernels rely on (dtypes, shapes,
// layout), so that no input reachable from Python panics.

/// The elements of a per-feature parameter (weight, bias) of a row of `hidden`, which
/// must have shape (hidden,).
fn feature_param<'a, W: Elem>(
    param: &'a PyReadonlyArrayDyn<'_, W>,
    name: &str,
    hidden: usize,
) -> PyResult<&'a [W]> {
    match rows::<W>(param, name)?.as_slice() {
        [p] if param.ndim() == 1 && p.len() == hidden => Ok(p),
        _ => {
            let got = param.shape();
            Err(value_error(format!(
                "{name} must have shape ({hidden},), got {got:?}"
            )))
        }
    }
}

/// The length of x's last axis.
fn last_axis<E: Elem>(x: &PyReadonlyArrayDyn<'_, E>) -> usize {
    x.shape().last().copied().unwrap_or(0)
}

/// The driver of the normalisations: `row(x_row, residual rows, scratch, out_row)` on
/// every row of x, rows in parallel (pieces of at least `RMS_NORM_PIECE` elements) with
/// the GIL released. With a residual (x's shape and dtype), `row` gets its row and the
/// new residual's row to fill, and the binding returns (normalised, new residual).
/// `scratch` is two rows' worth of the compute type, per thread.
fn normalise<'py, E: Elem>(
    py: Python<'py>,
    x: &PyReadonlyArrayDyn<'py, E>,
    residual: Option<&Bound<'py, PyAny>>,
    row: impl Fn(&[E], Option<(&[E], &mut [E])>, &mut [E::C], &mut [E]) + Sync,
) -> PyResult<Bound<'py, PyAny>> {
    let x_rows = rows::<E>(x, "x")?;
    let shape = x.shape().to_vec();
    let hidden = last_axis(x);
    let residual = residual
        .map(|r| float_array::<E>(r, "residual"))
        .transpose()?;
    let res_rows = match &residual {
        Some(r) if r.shape() != shape.as_slice() => {
            let got = r.shape();
            return Err(value_error(format!(
                "residual must have shape {shape:?}, got {got:?}"
            )));
        }
        Some(r) => Some(rows::<E>(r, "residual")?),
        None => None,
    };
    // SAFETY: every row of both outputs is written below before they reach Python.
    let out = unsafe { new_array::<E>(py, &shape) };
    let new_res = res_rows
        .as_ref()
        .map(|_| unsafe { new_array::<E>(py, &shape) });
    {
        let mut out_w = out.readwrite();
        let out_data = out_w.as_slice_mut()?;
        let mut res_w = new_res.as_ref().map(|a| a.readwrite());
        let res_data = match res_w.as_mut() {
            Some(a) => Some(a.as_slice_mut()?),
            None => None,
        };
        if hidden > 0 && !x_rows.is_empty() {
            detached(py, || {
                let init = || vec![E::C::ZERO; 2 * hidden];
                let chunks = out_data.par_chunks_mut(hidden).zip(x_rows.par_iter());
                match (res_rows.as_ref(), res_data) {
                    (Some(res_rows), Some(res_data)) => chunks
                        .zip(res_rows.par_iter().zip(res_data.par_chunks_mut(hidden)))
                        .with_min_len(min_rows(RMS_NORM_PIECE, hidden))
                        .for_each_init(init, |scratch, ((o, x), (r, n))| {
                            row(x, Some((r, n)), scratch, o)
                        }),
                    _ => chunks
                        .with_min_len(min_rows(RMS_NORM_PIECE, hidden))
                        .for_each_init(init, |scratch, (o, x)| row(x, None, scratch, o)),
                }
            })?;
        }
    }
    Ok(match new_res {
        Some(r) => (out, r).into_pyobject(py)?.into_any(),
        None => out.into_any(),
    })
}

/// rms_norm(x, weight, eps, residual=None)
/// --
///
/// `x` of any float dtype (bfloat16 as int16 bits) and shape (..., hidden), `weight`
/// (hidden,) and `residual` (x's shape) of x's dtype: the normalised rows, and with a
/// residual the pair (normalised, x + residual).
#[pyfunction]
#[pyo3(signature = (x, weight, eps, residual=None))]
fn rms_norm<'py>(
    py: Python<'py>,
    x: &Bound<'py, PyAny>,
    weight: &Bound<'py, PyAny>,
    eps: f64,
    residual: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    with_elem!(dtype_of(x, "x")?, E => rms_norm_typed::<E>(py, x, weight, eps, residual))
}

fn rms_norm_typed<'py, E: Elem>(
    py: Python<'py>,
    x: &Bound<'py, PyAny>,
    weight: &Bound<'py, PyAny>,
    eps: f64,
    residual: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    let x = float_array::<E>(x, "x")?;
    let weight = float_array::<E>(weight, "weight")?;
    let w = feature_param(&weight, "weight", last_axis(&x))?;
    let eps = E::C::from_f64(eps);
    normalise(py, &x, residual, |x, res, scratch, out| {
        rms_norm_row(x, res, w, eps, scratch, out)
    })
}

/// gemma_rms_norm(x, weight, eps, residual=None)
/// --
///
/// `x` of any float dtype (bfloat16 as int16 bits) and shape (..., hidden), `residual`
/// of x's shape and dtype, `weight` (hidden,) of x's compute dtype (float64 for float64,
/// else float32): the normalised rows scaled by (1 + weight), and with a residual the
/// pair (normalised, x + residual).
#[pyfunction]
#[pyo3(signature = (x, weight, eps, residual=None))]
fn gemma_rms_norm<'py>(
    py: Python<'py>,
    x: &Bound<'py, PyAny>,
    weight: &Bound<'py, PyAny>,
    eps: f64,
    residual: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    with_elem!(dtype_of(x, "x")?, E => gemma_rms_norm_typed::<E>(py, x, weight, eps, residual))
}

fn gemma_rms_norm_typed<'py, E: Elem>(
    py: Python<'py>,
    x: &Bound<'py, PyAny>,
    weight: &Bound<'py, PyAny>,
    eps: f64,
    residual: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>>
where
    E::C: Elem,
{
    let x = float_array::<E>(x, "x")?;
    let weight = float_array::<E::C>(weight, "weight")?;
    let w = feature_param(&weight, "weight", last_axis(&x))?;
    let eps = E::C::from_f64(eps);
    normalise(py, &x, residual, |x, res, scratch, out| {
        gemma_rms_norm_row(x, res, w, eps, scratch, out)
    })
}

/// layer_norm(x, weight, bias, eps, residual=None)
/// --
///
/// `x` of any float dtype (bfloat16 as int16 bits) and shape (..., hidden), `residual`
/// of x's shape and dtype, `weight` and `bias` (hidden,) of x's compute dtype (float64
/// for float64, else float32): the normalised rows, and with a residual the pair
/// (normalised, x + residual).
#[pyfunction]
#[pyo3(signature = (x, weight, bias, eps, residual=None))]
fn layer_norm<'py>(
    py: Python<'py>,
    x: &Bound<'py, PyAny>,
    weight: &Bound<'py, PyAny>,
    bias: &Bound<'py, PyAny>,
    eps: f64,
    residual: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    with_elem!(dtype_of(x, "x")?, E => layer_norm_typed::<E>(py, x, weight, bias, eps, residual))
}

fn layer_norm_typed<'py, E: Elem>(
    py: Python<'py>,
    x: &Bound<'py, PyAny>,
    weight: &Bound<'py, PyAny>,
    bias: &Bound<'py, PyAny>,
    eps: f64,
    residual: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>>
where
    E::C: Elem,
{
    let x = float_array::<E>(x, "x")?;
    let hidden = last_axis(&x);
    let weight = float_array::<E::C>(weight, "weight")?;
    let w = feature_param(&weight, "weight", hidden)?;
    let bias = float_array::<E::C>(bias, "bias")?;
    let b = feature_param(&bias, "bias", hidden)?;
    let eps = E::C::from_f64(eps);
    normalise(py, &x, residual, |x, res, scratch, out| {
        layer_norm_row(x, res, w, b, eps, scratch, out)
    })
}

/// The driver of the activations: `row(x_row, out_row)` on every row of x, the output
/// of shape (..., width) for x of shape (..., `ratio` * width), rows in parallel
/// (pieces of at least `piece` input elements) with the GIL released.
fn activate<'py, E: Elem>(
    py: Python<'py>,
    x: &Bound<'py, PyAny>,
    ratio: usize,
    piece: usize,
    row: impl Fn(&[E], &mut [E]) + Sync,
) -> PyResult<Bound<'py, PyAny>> {
    let x = float_array::<E>(x, "x")?;
    let x_rows = rows::<E>(&x, "x")?;
    let mut shape = x.shape().to_vec();
    let width = last_axis(&x);
    if width % ratio != 0 {
        return Err(value_error(format!(
            "x's last axis must be even (gate and up halves), got {width}"
        )));
    }
    let d = width / ratio;
    *shape.last_mut().unwrap_or(&mut 0) = d;
    // SAFETY: every row of the output is written below before it reaches Python.
    let out = unsafe { new_array::<E>(py, &shape) };
    {
        let mut out_w = out.readwrite();
        let out_data = out_w.as_slice_mut()?;
        if d > 0 && !x_rows.is_empty() {
            detached(py, || {
                out_data
                    .par_chunks_mut(d)
                    .zip(x_rows.par_iter())
                    .with_min_len(min_rows(piece, width))
                    .for_each(|(o, x)| row(x, o))
            })?;
        }
    }
    Ok(out.into_any())
}

/// silu_and_mul(x)
/// --
///
/// `x` of any float dtype (bfloat16 as int16 bits) and shape (..., 2 * d): silu(gate)
/// * up, shape (..., d).
#[pyfunction]
fn silu_and_mul<'py>(py: Python<'py>, x: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    with_elem!(dtype_of(x, "x")?, E => activate::<E>(py, x, 2, SILU_PIECE, silu_and_mul_row))
}

/// gelu(x, approximate)
/// --
///
/// `x` of any float dtype (bfloat16 as int16 bits), at least one axis; `approximate`
/// "none" (erf) or "tanh": gelu of every element, x's shape.
#[pyfunction]
fn gelu<'py>(
    py: Python<'py>,
    x: &Bound<'py, PyAny>,
    approximate: &str,
) -> PyResult<Bound<'py, PyAny>> {
    let form = Gelu::parse(approximate)?;
    with_elem!(dtype_of(x, "x")?, E => activate::<E>(py, x, 1, GELU_PIECE, |x, o| gelu_row(x, form, o)))
}

/// gelu_and_mul(x, approximate)
/// --
///
/// `x` of any float dtype (bfloat16 as int16 bits) and shape (..., 2 * d); `approximate`
/// "none" (erf) or "tanh": gelu(gate) * up, shape (..., d).
#[pyfunction]
fn gelu_and_mul<'py>(
    py: Python<'py>,
    x: &Bound<'py, PyAny>,
    approximate: &str,
) -> PyResult<Bound<'py, PyAny>> {
    let form = Gelu::parse(approximate)?;
    with_elem!(dtype_of(x, "x")?, E => activate::<E>(py, x, 2, GELU_PIECE, |x, o| gelu_and_mul_row(x, form, o)))
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(rms_norm, m)?)?;
    m.add_function(wrap_pyfunction!(gemma_rms_norm, m)?)?;
    m.add_function(wrap_pyfunction!(layer_norm, m)?)?;
    m.add_function(wrap_pyfunction!(silu_and_mul, m)?)?;
    m.add_function(wrap_pyfunction!(gelu, m)?)?;
    m.add_function(wrap_pyfunction!(gelu_and_mul, m)?)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::elem::Bf16;
    use half::{bf16, f16};

    /// `v` rounded to bfloat16 by the `half` crate (the oracle).
    fn b(v: f32) -> Bf16 {
        Bf16(bf16::from_f32(v).to_bits())
    }

    /// rms_norm of one row through the kernel.
    fn rms<E: Elem>(x: &[E], residual: Option<&[E]>, weight: &[E], eps: f64) -> (Vec<E>, Vec<E>) {
        let mut out = x.to_vec();
        let mut new = x.to_vec();
        let mut squares = vec![E::C::ZERO; x.len()];
        let res = residual.map(|r| (r, new.as_mut_slice()));
        rms_norm_row(x, res, weight, E::C::from_f64(eps), &mut squares, &mut out);
        (out, new)
    }

    #[test]
    fn rms_norm_matches_the_formula_in_f64() {
        let x: Vec<f64> = (0..37).map(|i| (i as f64 * 0.37).sin() * 3.0).collect();
        let w: Vec<f64> = (0..37).map(|i| 0.5 + i as f64 / 37.0).collect();
        let (out, _) = rms(&x, None, &w, 1e-6);
        let ms = x.iter().map(|v| v * v).sum::<f64>() / 37.0;
        for j in 0..37 {
            let want = w[j] * (x[j] / (ms + 1e-6).sqrt());
            assert!((out[j] - want).abs() <= 1e-14 * (1.0 + want.abs()), "{j}");
        }
    }

    #[test]
    fn rms_norm_of_zeros_is_zero_and_residual_is_the_rounded_sum() {
        let (out, _) = rms(&[0.0f32; 8], None, &[1.0f32; 8], 1e-5);
        assert!(out.iter().all(|&v| v == 0.0));
        let x = [b(1.0), b(-2.5)];
        let r = [b(1.0 / 512.0), b(0.5)];
        let w = [b(1.0); 2];
        let (_, new) = rms(&x, Some(&r), &w, 1e-5);
        assert_eq!(new, [b(1.0), b(-2.0)]); // 1 + 2**-9 ties to 1
    }

    #[test]
    fn half_types_round_the_normalised_value_before_the_weight() {
        // f16: h / rms rounded to f16, times the weight in f16
        let x = [f16::from_f32(1.0), f16::from_f32(2.0), f16::from_f32(3.0)];
        let w = [f16::from_f32(0.1); 3];
        let (out, _) = rms(&x, None, &w, 1e-6);
        let rms_f32 = (((1.0f32 + 4.0 + 9.0) as f64 / 3.0) as f32 + 1e-6f32).sqrt();
        for j in 0..3 {
            let normed = f16::from_f32(x[j].to_f32() / rms_f32);
            assert_eq!(out[j], f16::from_f32(w[j].to_f32() * normed.to_f32()));
        }
    }

    #[test]
    fn silu_and_mul_matches_the_formula() {
        let x: Vec<f64> = vec![-30.0, -1.0, 0.0, 0.5, 20.0, 2.0, -3.0, 4.0, 1.5, -0.25];
        let mut out = vec![0.0; 5];
        silu_and_mul_row(&x, &mut out);
        for j in 0..5 {
            let g = x[j];
            let want = g / (1.0 + (-g).exp()) * x[5 + j];
            assert!((out[j] - want).abs() <= 1e-15 * (1.0 + want.abs()), "{j}");
        }
        let xf: Vec<f32> = vec![-100.0, 100.0, 1.0, 1.0];
        let mut outf = vec![0.0f32; 2];
        silu_and_mul_row(&xf, &mut outf);
        assert_eq!(outf, [-0.0, 100.0]);
    }

    /// Within `ulps` units in the last place of `want` (f64).
    fn close(got: f64, want: f64, ulps: f64) -> bool {
        (got - want).abs() <= ulps * f64::EPSILON * want.abs().max(f64::MIN_POSITIVE)
    }

    #[test]
    fn erf_matches_python_math_erf() {
        // math.erf's values (correctly rounded) on both sides of each method's range
        let cases = [
            (0.1, 0.1124629160182849),
            (0.5, 0.5204998778130465),
            (1.0, 0.8427007929497149),
            (1.5, 0.9661051464753108),
            (1.999, 0.9953015566513705),
            (2.0, 0.9953222650189527),
            (2.5, 0.999593047982555),
            (3.0, 0.9999779095030014),
            (5.9, 0.9999999999999999),
            (6.0, 1.0),
            (1e-300, 1.1283791670955126e-300),
        ];
        for (x, want) in cases {
            assert!(
                close(erf(x), want, 8.0),
                "erf({x}) = {}, want {want}",
                erf(x)
            );
            assert_eq!(erf(-x), -erf(x), "odd at {x}");
        }
        assert_eq!(erf(f64::INFINITY), 1.0);
        assert_eq!(erf(f64::NEG_INFINITY), -1.0);
        assert!(erf(f64::NAN).is_nan());
        assert_eq!(erf(-0.0).to_bits(), (-0.0f64).to_bits());
    }

    /// gemma_rms_norm of one row through the kernel.
    fn gemma<E: Elem>(x: &[E], weight: &[E::C], eps: f64) -> Vec<E> {
        let mut out = x.to_vec();
        let mut scratch = vec![E::C::ZERO; 2 * x.len()];
        gemma_rms_norm_row(x, None, weight, E::C::from_f64(eps), &mut scratch, &mut out);
        out
    }

    #[test]
    fn gemma_rms_norm_scales_by_one_plus_weight() {
        let x: Vec<f64> = (0..19).map(|i| (i as f64 * 0.71).cos() * 2.0).collect();
        let w: Vec<f64> = (0..19).map(|i| i as f64 / 19.0 - 0.5).collect();
        let out = gemma(&x, &w, 1e-6);
        let ms = x.iter().map(|v| v * v).sum::<f64>() / 19.0;
        for j in 0..19 {
            let want = x[j] / (ms + 1e-6).sqrt() * (1.0 + w[j]);
            assert!((out[j] - want).abs() <= 1e-14 * (1.0 + want.abs()), "{j}");
        }
        // a zero weight is the plain normalisation, not zero
        assert!(gemma(&[3.0f32, 4.0], &[0.0; 2], 1e-9)
            .iter()
            .all(|&v| v != 0.0));
    }

    #[test]
    fn gemma_rms_norm_rounds_once() {
        let x = [b(1.0), b(2.0), b(3.0)];
        let w = [0.1f32, -0.3, 2.0];
        let out = gemma(&x, &w, 1e-6);
        let rms = (((1.0f32 + 4.0 + 9.0) as f64 / 3.0) as f32 + 1e-6f32).sqrt();
        for j in 0..3 {
            assert_eq!(out[j], b(x[j].to_f32() / rms * (1.0 + w[j])), "{j}");
        }
    }

    /// layer_norm of one row through the kernel, with and without a residual.
    fn layer<E: Elem>(
        x: &[E],
        residual: Option<&[E]>,
        weight: &[E::C],
        bias: &[E::C],
        eps: f64,
    ) -> (Vec<E>, Vec<E>) {
        let (mut out, mut new) = (x.to_vec(), x.to_vec());
        let mut scratch = vec![E::C::ZERO; 2 * x.len()];
        let res = residual.map(|r| (r, new.as_mut_slice()));
        let eps = E::C::from_f64(eps);
        layer_norm_row(x, res, weight, bias, eps, &mut scratch, &mut out);
        (out, new)
    }

    #[test]
    fn layer_norm_matches_the_formula_in_f64() {
        let x: Vec<f64> = (0..23)
            .map(|i| (i as f64 * 0.53).sin() * 4.0 + 1.5)
            .collect();
        let r: Vec<f64> = (0..23).map(|i| i as f64 * 0.01).collect();
        let w: Vec<f64> = (0..23).map(|i| 0.5 + i as f64 / 23.0).collect();
        let bias: Vec<f64> = (0..23).map(|i| 0.25 - i as f64 / 46.0).collect();
        let (out, new) = layer(&x, Some(&r), &w, &bias, 1e-5);
        let h: Vec<f64> = x.iter().zip(&r).map(|(a, b)| a + b).collect();
        assert_eq!(new, h);
        let mean = h.iter().sum::<f64>() / 23.0;
        let var = h.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / 23.0; // biased
        for j in 0..23 {
            let want = (h[j] - mean) / (var + 1e-5).sqrt() * w[j] + bias[j];
            assert!((out[j] - want).abs() <= 1e-14 * (1.0 + want.abs()), "{j}");
        }
    }

    #[test]
    fn layer_norm_of_a_constant_row_is_the_bias() {
        let (out, _) = layer(
            &[f16::from_f32(7.0); 4],
            None,
            &[3.0f32; 4],
            &[0.5, -1.0, 0.0, 2.0],
            1e-5,
        );
        let want: Vec<f16> = [0.5f32, -1.0, 0.0, 2.0]
            .iter()
            .map(|&v| f16::from_f32(v))
            .collect();
        assert_eq!(out, want);
    }

    #[test]
    fn gelu_matches_both_forms_in_f64() {
        let x: Vec<f64> = vec![-7.0, -2.5, -1.0, -0.0, 0.0, 0.3, 1.0, 2.0, 3.5, 10.0];
        for (form, f) in [
            (
                Gelu::Erf,
                (|v: f64| 0.5 * v * (1.0 + erf(v / SQRT_2))) as fn(f64) -> f64,
            ),
            (Gelu::Tanh, |v: f64| {
                0.5 * v * (1.0 + ((2.0 / PI).sqrt() * (v + 0.044715 * v * v * v)).tanh())
            }),
        ] {
            let mut out = vec![1.0; x.len()];
            gelu_row(&x, form, &mut out);
            for (j, &v) in x.iter().enumerate() {
                let tol = 4.0 * f64::EPSILON * (f(v).abs() + v.abs() + 1.0);
                assert!((out[j] - f(v)).abs() <= tol, "{form:?} at {v}: {}", out[j]);
            }
            assert_eq!(out[9], 10.0, "{form:?}: gelu(10) rounds to 10");
        }
        // the two forms differ, by about 1e-4 near 1
        let (mut erf_form, mut tanh_form) = ([0.0], [0.0]);
        gelu_row(&[1.0f32], Gelu::Erf, &mut erf_form);
        gelu_row(&[1.0f32], Gelu::Tanh, &mut tanh_form);
        assert!((erf_form[0] - 0.841_344_7f32).abs() < 1e-6, "{erf_form:?}");
        assert!((tanh_form[0] - 0.841_192f32).abs() < 1e-6, "{tanh_form:?}");
    }

    #[test]
    fn erf_f32_is_within_its_fit_of_erf() {
        for i in 0..=80_000 {
            let u = (i as f64 - 40_000.0) / 8_000.0; // -5 to 5
            if u.abs() <= ERF_F32_MAX {
                assert!((erf_f32(u) - erf(u)).abs() <= 4e-12, "{u}");
            } else {
                assert_eq!(erf_f32(u) as f32, erf(u) as f32, "{u}"); // +-1 in f32
            }
        }
        assert_eq!(erf_f32(100.0) as f32, 1.0);
        assert!(erf_f32(-0.0) <= 0.0 && erf_f32(-0.0) > -4e-12); // odd, within the fit
    }

    #[test]
    fn tanh_through_exp_is_libms_within_a_few_ulps_of_one() {
        for i in 0..=20_000 {
            let y = (i as f64 - 10_000.0) / 1_000.0; // -10 to 10
            let (got, want) = (tanh_in(y), y.tanh());
            assert!((got - want).abs() <= 4.0 * f64::EPSILON, "{y}"); // ulps of 1
        }
        assert_eq!(tanh_in(f32::INFINITY), 1.0);
        assert_eq!(tanh_in(-200.0f32), -1.0);
        assert!(tanh_in(f64::NAN).is_nan());
    }

    #[test]
    fn gelu_and_mul_gates_with_the_first_half() {
        let x = [1.0f64, -2.0, 0.0, 3.0, 0.5, 4.0];
        let mut out = [0.0; 3];
        gelu_and_mul_row(&x, Gelu::Tanh, &mut out);
        for j in 0..3 {
            assert_eq!(out[j], gelu_tanh(x[j]) * x[3 + j], "{j}");
        }
        assert_eq!(out[2], 0.0);
        assert!(Gelu::parse("erf").is_err());
    }
}
