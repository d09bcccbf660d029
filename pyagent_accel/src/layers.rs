//! Kernels of `pyagent_accel.ops.layers` (RMS norm, SwiGLU) and their Python bindings
//! (contract: `pyagent_ref.ops.layers`).
//!
//! Both ops work row by row on the last axis, rows in parallel for large inputs, with
//! the reference's operations in the reference's order and dtypes, so the results are
//! its bits but for two library functions: the mean square is numpy's pairwise sum
//! (torch sums in another order, a last-bit difference in float32), and silu's `exp`
//! is accurate to one ulp like numpy's and torch's, which differ from each other too.
//! Half types compute in float32 and round back where the reference stores in its
//! dtype (see `elem`).

use numpy::{PyArrayMethods, PyUntypedArrayMethods};
use pyo3::prelude::*;
use rayon::prelude::*;

use crate::elem::{dtype_of, float_array, new_array, rows, with_elem, Elem};
use crate::float::{multiversion, Float};
use crate::py_util::{detached, value_error};
use crate::sampling::row_scan::pairwise_sum;

/// Rows go to the thread pool in pieces of at least this many input elements (some
/// 40 us of work; silu's exp costs more per element): handing over less work costs
/// more than it saves, so decode batches run on the calling thread.
const RMS_NORM_PIECE: usize = 1 << 17;
const SILU_PIECE: usize = 1 << 16;

/// The fewest rows per piece for rows of `width` elements.
fn min_rows(piece: usize, width: usize) -> usize {
    (piece / width.max(1)).max(1)
}

/// One row of `rms_norm`: `out = weight * round(h / sqrt(mean(h * h) + eps))` in the
/// storage type, where h is `x`, or `round(x + residual)` (also written to `new_residual`
/// when `residual` is given). The mean is numpy's: a pairwise sum of the squares
/// (`squares` is scratch of the row's length), divided in f64 and rounded.
#[inline(always)]
fn rms_norm_row_impl<E: Elem>(
    x: &[E],
    residual: Option<(&[E], &mut [E])>,
    weight: &[E],
    eps: E::C,
    squares: &mut [E::C],
    out: &mut [E],
) {
    let h: &[E] = match residual {
        Some((r, new)) => {
            for ((n, &a), &b) in new.iter_mut().zip(x).zip(r) {
                *n = E::store(a.load() + b.load());
            }
            new
        }
        None => x,
    };
    for (s, &v) in squares.iter_mut().zip(h) {
        let v = v.load();
        *s = v * v;
    }
    let mean = E::C::from_f64(pairwise_sum(squares).to_f64() / h.len() as f64);
    let rms = E::C::from_f64((mean + eps).to_f64().sqrt()); // sqrt is exact-rounded via f64
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
        squares: &mut [E::C],
        out: &mut [E],
    ) -> () = rms_norm_row_impl;
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

// ---------------------------------------------------------------------------------
// Python bindings. The wrappers in `python/pyagent_accel/ops/layers.py` have made the
// reference's checks; these check again what the kernels rely on (dtypes, shapes,
// layout), so that no input reachable from Python panics.

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
    let residual = residual
        .map(|r| float_array::<E>(r, "residual"))
        .transpose()?;
    let x_rows = rows::<E>(&x, "x")?;
    let shape = x.shape().to_vec();
    let hidden = *shape.last().unwrap_or(&0);
    let w = match rows::<E>(&weight, "weight")?.as_slice() {
        [w] if weight.ndim() == 1 && w.len() == hidden => *w,
        _ => {
            let got = weight.shape();
            return Err(value_error(format!(
                "weight must have shape ({hidden},), got {got:?}"
            )));
        }
    };
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
    let eps = E::C::from_f64(eps);
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
                let init = || vec![E::C::ZERO; hidden];
                let chunks = out_data.par_chunks_mut(hidden).zip(x_rows.par_iter());
                match (res_rows.as_ref(), res_data) {
                    (Some(res_rows), Some(res_data)) => chunks
                        .zip(res_rows.par_iter().zip(res_data.par_chunks_mut(hidden)))
                        .with_min_len(min_rows(RMS_NORM_PIECE, hidden))
                        .for_each_init(init, |squares, ((o, x), (r, n))| {
                            rms_norm_row(x, Some((r, n)), w, eps, squares, o)
                        }),
                    _ => chunks
                        .with_min_len(min_rows(RMS_NORM_PIECE, hidden))
                        .for_each_init(init, |squares, (o, x)| {
                            rms_norm_row(x, None, w, eps, squares, o)
                        }),
                }
            })?;
        }
    }
    Ok(match new_res {
        Some(r) => (out, r).into_pyobject(py)?.into_any(),
        None => out.into_any(),
    })
}

/// silu_and_mul(x)
/// --
///
/// `x` of any float dtype (bfloat16 as int16 bits) and shape (..., 2 * d): silu(gate)
/// * up, shape (..., d).
#[pyfunction]
fn silu_and_mul<'py>(py: Python<'py>, x: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    with_elem!(dtype_of(x, "x")?, E => silu_and_mul_typed::<E>(py, x))
}

fn silu_and_mul_typed<'py, E: Elem>(
    py: Python<'py>,
    x: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    let x = float_array::<E>(x, "x")?;
    let x_rows = rows::<E>(&x, "x")?;
    let mut shape = x.shape().to_vec();
    let width = shape.last().copied().unwrap_or(0);
    if width % 2 != 0 {
        return Err(value_error(format!(
            "x's last axis must be even (gate and up halves), got {width}"
        )));
    }
    let d = width / 2;
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
                    .with_min_len(min_rows(SILU_PIECE, width))
                    .for_each(|(o, x)| silu_and_mul_row(x, o))
            })?;
        }
    }
    Ok(out.into_any())
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(rms_norm, m)?)?;
    m.add_function(wrap_pyfunction!(silu_and_mul, m)?)?;
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
}
