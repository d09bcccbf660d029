//! Kernels of `pyagent_accel.ops.pooling` (per-request pooling of hidden states, L2
//! normalisation, classification activations, cosine similarity) and their Python
//! bindings (contract: `pyagent_ref.ops.pooling`).
//!
//! Everything is computed in the compute type (f32, f64 for f64 input) from the storage
//! type widened exactly. A mean sums a span's rows in row order, one running sum per
//! feature (so one request's result never depends on the batch), then divides by the
//! count; norms and dot products run in `LANES` partial sums. Spans or rows run in
//! parallel when there is enough work (`PARALLEL_WORK`). Sums run in another order than
//! numpy's or torch's: results agree with the reference within the specification's
//! tolerance.

use numpy::{PyArray1, PyArrayMethods, PyReadonlyArray1, PyReadonlyArray2, PyUntypedArrayMethods};
use pyo3::prelude::*;
use rayon::prelude::*;

use crate::elem::{dtype_of, with_elem, Compute, Elem};
use crate::float::Float;
use crate::py_util::{detached, readonly, slice, value_error};

/// Width of the vectorised sums (one AVX-512 vector of f32).
const LANES: usize = 16;
/// Elements read below which a call stays on the calling thread.
const PARALLEL_WORK: usize = 1 << 16;

/// The reference's floors: a norm below NORM_EPS divides by it; each norm of a cosine is
/// at least COSINE_EPS.
const NORM_EPS: f64 = 1e-12;
const COSINE_EPS: f64 = 1e-8;

/// What `pool` does with a span.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Pooling {
    Last,
    Cls,
    Mean,
    All,
}

/// Pool rows of `width` compute values per request span `[starts[r], starts[r + 1])`
/// (validated: increasing, within the rows): one row per span (Last, Cls, Mean) or every
/// row of the spans (All), row-major.
pub fn pool<E: Elem>(hidden: &[E], width: usize, starts: &[usize], how: Pooling) -> Vec<E::C> {
    let spans: Vec<(usize, usize)> = starts.windows(2).map(|w| (w[0], w[1])).collect();
    let row = |i: usize| &hidden[i * width..(i + 1) * width];
    let widen = |i: usize, out: &mut [E::C]| E::C::widen(row(i), out);
    if how == Pooling::All {
        let total: usize = spans.iter().map(|(s, e)| e - s).sum();
        let mut out = vec![E::C::ZERO; total * width];
        let mut at = 0;
        for &(s, e) in &spans {
            for i in s..e {
                widen(i, &mut out[at * width..(at + 1) * width]);
                at += 1;
            }
        }
        return out;
    }
    let mut out = vec![E::C::ZERO; spans.len() * width];
    let one = |(&(s, e), dst): (&(usize, usize), &mut [E::C])| match how {
        Pooling::Last => widen(e - 1, dst),
        Pooling::Cls => widen(s, dst),
        _ => {
            let mut buf = vec![E::C::ZERO; width];
            for i in s..e {
                widen(i, &mut buf);
                for (d, &v) in dst.iter_mut().zip(&buf) {
                    *d = *d + v;
                }
            }
            let count = E::C::from_count((e - s) as u64);
            for d in dst.iter_mut() {
                *d = *d / count;
            }
        }
    };
    let rows = starts.last().copied().unwrap_or(0) - starts.first().copied().unwrap_or(0);
    if width > 0 && rows * width >= PARALLEL_WORK && how == Pooling::Mean {
        spans
            .par_iter()
            .zip(out.par_chunks_mut(width))
            .for_each(one);
    } else if width > 0 {
        spans.iter().zip(out.chunks_mut(width)).for_each(one);
    }
    out
}

/// sum of x[i] * y[i] in LANES partial sums, then the tail.
#[inline(always)]
fn dot<C: Compute>(x: &[C], y: &[C]) -> C {
    let n = x.len().min(y.len());
    let body = n - n % LANES;
    let mut acc = [C::ZERO; LANES];
    for c in (0..body).step_by(LANES) {
        let a: &[C; LANES] = x[c..c + LANES].try_into().unwrap();
        let b: &[C; LANES] = y[c..c + LANES].try_into().unwrap();
        for l in 0..LANES {
            acc[l] = acc[l] + a[l] * b[l];
        }
    }
    let mut sum = acc.iter().fold(C::ZERO, |s, &v| s + v);
    for i in body..n {
        sum = sum + x[i] * y[i];
    }
    sum
}

/// The square root of a non-negative value, correctly rounded (through f64: a double
/// rounding of sqrt from f64 to f32 is exact).
#[inline(always)]
fn sqrt<C: Compute>(x: C) -> C {
    C::from_f64(x.to_f64().sqrt())
}

/// The first `dims` values of each row (rows of `width`), each truncated row divided by
/// max(its L2 norm, 1e-12): rows of `dims`.
pub fn normalize<E: Elem>(x: &[E], width: usize, dims: usize) -> Vec<E::C> {
    let rows = x.len().checked_div(width).unwrap_or(0);
    let mut out = vec![E::C::ZERO; rows * dims];
    let floor = E::C::from_f64(NORM_EPS);
    let one = |(r, dst): (usize, &mut [E::C])| {
        E::C::widen(&x[r * width..r * width + dims], dst);
        let norm = sqrt(dot(dst, dst));
        let d = if norm > floor { norm } else { floor };
        for v in dst.iter_mut() {
            *v = *v / d;
        }
    };
    if dims == 0 {
        return out;
    }
    if x.len() >= PARALLEL_WORK {
        out.par_chunks_mut(dims).enumerate().for_each(one);
    } else {
        out.chunks_mut(dims).enumerate().for_each(one);
    }
    out
}

/// What `classify` applies.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Activation {
    Softmax,
    Sigmoid,
    Identity,
}

/// The activation of rows of `width` finite logits (checked by the caller).
pub fn classify<E: Elem>(logits: &[E], width: usize, how: Activation) -> Vec<E::C> {
    let mut out = vec![E::C::ZERO; logits.len()];
    E::C::widen(logits, &mut out);
    if width == 0 {
        return out;
    }
    let one = |row: &mut [E::C]| match how {
        Activation::Softmax => {
            let max = row
                .iter()
                .fold(E::C::NEG_INF, |m, &v| if v > m { v } else { m });
            let mut sum = E::C::ZERO;
            for v in row.iter_mut() {
                *v = (*v - max).exp_fast();
                sum = sum + *v;
            }
            for v in row.iter_mut() {
                *v = *v / sum;
            }
        }
        Activation::Sigmoid => {
            for v in row.iter_mut() {
                // 1 / (1 + e) at x >= 0, e / (1 + e) below, e = exp(-|x|): no overflow
                let x = *v;
                let e = (if x < E::C::ZERO { x } else { E::C::ZERO - x }).exp_fast();
                *v = if x >= E::C::ZERO {
                    E::C::ONE / (E::C::ONE + e)
                } else {
                    e / (E::C::ONE + e)
                };
            }
        }
        Activation::Identity => {}
    };
    if logits.len() >= PARALLEL_WORK {
        out.par_chunks_mut(width).for_each(one);
    } else {
        out.chunks_mut(width).for_each(one);
    }
    out
}

/// The cosine of row i of `a` and of `b` (`rows` rows of `width`, both in the compute
/// type C): a . b / (max(|a|, 1e-8) max(|b|, 1e-8)).
pub fn cosine<C: Compute>(a: &[C], b: &[C], rows: usize, width: usize) -> Vec<C> {
    let floor = C::from_f64(COSINE_EPS);
    let one = |r: usize| {
        if width == 0 {
            return C::ZERO;
        }
        let (x, y) = (
            &a[r * width..(r + 1) * width],
            &b[r * width..(r + 1) * width],
        );
        let (nx, ny) = (sqrt(dot(x, x)), sqrt(dot(y, y)));
        let (nx, ny) = (
            if nx > floor { nx } else { floor },
            if ny > floor { ny } else { floor },
        );
        dot(x, y) / (nx * ny)
    };
    if a.len() >= PARALLEL_WORK {
        (0..rows).into_par_iter().map(one).collect()
    } else {
        (0..rows).map(one).collect()
    }
}

// ---------------------------------------------------------------------------------
// Bindings

/// A read-only borrow of a 2-D C-contiguous array of `E` and its (rows, width).
fn matrix<'py, E: Elem>(
    x: &Bound<'py, PyAny>,
    name: &str,
) -> PyResult<(PyReadonlyArray2<'py, E>, usize, usize)> {
    let arr = x
        .cast::<numpy::PyArray2<E>>()
        .map_err(|_| value_error(format!("{name} must be a 2-D array")))?;
    let arr = readonly(arr, name)?;
    let (rows, width) = (arr.shape()[0], arr.shape()[1]);
    Ok((arr, rows, width))
}

/// A (rows, width) numpy array of the compute values.
fn array2<'py, C: Compute>(
    py: Python<'py>,
    v: Vec<C>,
    rows: usize,
    width: usize,
) -> PyResult<Bound<'py, PyAny>> {
    Ok(PyArray1::from_vec(py, v).reshape([rows, width])?.into_any())
}

/// pool(hidden, query_start_loc, kind)
/// --
///
/// `hidden` (num_tokens, hidden_size) C-contiguous of any float dtype (bfloat16 as int16
/// bits); `query_start_loc` int64, strictly increasing within the rows; kind 0 last, 1
/// cls, 2 mean, 3 all. A (num_reqs or rows, hidden_size) array in f32 (f64 for f64).
#[pyfunction]
fn pool_rows<'py>(
    py: Python<'py>,
    hidden: &Bound<'py, PyAny>,
    query_start_loc: PyReadonlyArray1<'py, i64>,
    kind: u8,
) -> PyResult<Bound<'py, PyAny>> {
    let how = match kind {
        0 => Pooling::Last,
        1 => Pooling::Cls,
        2 => Pooling::Mean,
        3 => Pooling::All,
        _ => return Err(value_error(format!("unknown pooling kind {kind}"))),
    };
    let qsl = slice(&query_start_loc, "query_start_loc")?;
    with_elem!(dtype_of(hidden, "hidden")?, E => {
        let (arr, rows, width) = matrix::<E>(hidden, "hidden")?;
        let mut starts = Vec::with_capacity(qsl.len());
        for (r, &q) in qsl.iter().enumerate() {
            let ok = q >= 0 && q as u64 <= rows as u64 && (r == 0 || q > qsl[r - 1]);
            if !ok {
                return Err(value_error(format!(
                    "query_start_loc must increase within [0, {rows}], got {qsl:?}"
                )));
            }
            starts.push(q as usize);
        }
        let data = slice(&arr, "hidden")?;
        let out = detached(py, || pool(data, width, &starts, how))?;
        let n = match how {
            // the spans are contiguous: every row from the first start to the last
            Pooling::All => starts.last().unwrap_or(&0) - starts.first().unwrap_or(&0),
            _ => starts.len().saturating_sub(1),
        };
        array2(py, out, n, width)
    })
}

/// normalize(x, dimensions)
/// --
///
/// `x` (rows, features) C-contiguous of any float dtype; dimensions in [1, features]
/// (checked by the wrapper). A (rows, dimensions) array in f32 (f64 for f64).
#[pyfunction]
fn normalize_rows<'py>(
    py: Python<'py>,
    x: &Bound<'py, PyAny>,
    dimensions: usize,
) -> PyResult<Bound<'py, PyAny>> {
    with_elem!(dtype_of(x, "x")?, E => {
        let (arr, rows, width) = matrix::<E>(x, "x")?;
        if dimensions > width || (dimensions == 0 && width > 0) {
            return Err(value_error(format!("dimensions must be in [1, {width}], got {dimensions}")));
        }
        let data = slice(&arr, "x")?;
        let out = detached(py, || normalize(data, width, dimensions))?;
        array2(py, out, rows, dimensions)
    })
}

/// classify(logits, kind)
/// --
///
/// `logits` (rows, labels) C-contiguous of any float dtype, finite (checked by the
/// wrapper); kind 0 softmax, 1 sigmoid, 2 none. An array like logits in f32 (f64 for f64).
#[pyfunction]
fn classify_rows<'py>(
    py: Python<'py>,
    logits: &Bound<'py, PyAny>,
    kind: u8,
) -> PyResult<Bound<'py, PyAny>> {
    let how = match kind {
        0 => Activation::Softmax,
        1 => Activation::Sigmoid,
        2 => Activation::Identity,
        _ => return Err(value_error(format!("unknown activation kind {kind}"))),
    };
    with_elem!(dtype_of(logits, "logits")?, E => {
        let (arr, rows, width) = matrix::<E>(logits, "logits")?;
        let data = slice(&arr, "logits")?;
        let out = detached(py, || classify(data, width, how))?;
        array2(py, out, rows, width)
    })
}

/// cosine_similarity(a, b)
/// --
///
/// `a`, `b` (rows, features) C-contiguous of one compute dtype (f32 or f64: the wrapper
/// converts them). A (rows,) array of that dtype.
#[pyfunction]
fn cosine_rows<'py>(
    py: Python<'py>,
    a: &Bound<'py, PyAny>,
    b: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    fn run<'py, C: Compute + Elem>(
        py: Python<'py>,
        a: &Bound<'py, PyAny>,
        b: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let (x, rows, width) = matrix::<C>(a, "a")?;
        let (y, rows_b, width_b) = matrix::<C>(b, "b")?;
        if (rows, width) != (rows_b, width_b) {
            return Err(value_error(format!(
                "a and b must have the same shape, got ({rows}, {width}) and ({rows_b}, {width_b})"
            )));
        }
        let (x, y) = (slice(&x, "a")?, slice(&y, "b")?);
        let out = detached(py, || cosine(x, y, rows, width))?;
        Ok(PyArray1::from_vec(py, out).into_any())
    }
    match (
        a.cast::<numpy::PyArray2<f64>>().is_ok(),
        b.cast::<numpy::PyArray2<f64>>().is_ok(),
    ) {
        (true, true) => run::<f64>(py, a, b),
        _ => run::<f32>(py, a, b),
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(pool_rows, m)?)?;
    m.add_function(wrap_pyfunction!(normalize_rows, m)?)?;
    m.add_function(wrap_pyfunction!(classify_rows, m)?)?;
    m.add_function(wrap_pyfunction!(cosine_rows, m)?)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pools_each_span_and_ignores_padding() {
        // three requests of 2, 1 and 3 rows of width 2, then a padding row
        let h: Vec<f32> = (0..14).map(|i| i as f32).collect();
        let starts = [0, 2, 3, 6];
        assert_eq!(
            pool(&h, 2, &starts, Pooling::Last),
            vec![2.0, 3.0, 4.0, 5.0, 10.0, 11.0]
        );
        assert_eq!(
            pool(&h, 2, &starts, Pooling::Cls),
            vec![0.0, 1.0, 4.0, 5.0, 6.0, 7.0]
        );
        assert_eq!(
            pool(&h, 2, &starts, Pooling::Mean),
            vec![1.0, 2.0, 4.0, 5.0, 8.0, 9.0]
        );
        assert_eq!(pool(&h, 2, &starts, Pooling::All), h[..12].to_vec());
    }

    #[test]
    fn normalizes_truncated_rows_and_keeps_zero_rows() {
        let x = [3.0f64, 4.0, 12.0, 0.0, 0.0, 5.0];
        assert_eq!(normalize(&x, 3, 2), vec![0.6, 0.8, 0.0, 0.0]);
        let full = normalize(&x, 3, 3);
        assert!((full[2] - 12.0 / 13.0).abs() < 1e-15 && full[5] == 1.0);
    }

    #[test]
    fn softmax_survives_large_logits_and_sigmoid_is_symmetric() {
        let p = classify(&[1000.0f32, 1000.0, -1000.0], 3, Activation::Softmax);
        assert_eq!(p, vec![0.5, 0.5, 0.0]);
        let s = classify(&[-30.0f64, 30.0], 2, Activation::Sigmoid);
        assert!((s[0] + s[1] - 1.0).abs() < 1e-15 && s[0] > 0.0);
    }

    #[test]
    fn cosine_of_parallel_and_zero_rows() {
        let a = [1.0f32, 2.0, 0.0, 0.0];
        let b = [-2.0f32, -4.0, 1.0, 1.0];
        let c = cosine(&a, &b, 2, 2);
        assert!((c[0] + 1.0).abs() < 1e-6 && c[1] == 0.0);
    }
}
