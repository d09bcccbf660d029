//! The `_native` functions behind `pyagent_accel.ops.sampling`.
//!
//! The Python wrappers have converted and checked every argument as the reference does
//! (see `python/pyagent_accel/ops/sampling.py`); the bindings check again only what a
//! kernel relies on (dtypes, lengths, contiguity: nothing reachable from Python
//! panics), run the row kernels without the GIL, rows in parallel for large batches,
//! and raise the reference's error for the first bad row.

use numpy::{
    PyArray1, PyArray2, PyArrayMethods, PyReadonlyArray1, PyReadonlyArray2, PyReadonlyArray3,
    PyUntypedArrayMethods,
};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use rayon::prelude::*;

use super::dry::{dry_row, Dry};
use super::filters::{
    allowed_row, bad_words_row, cutoff_row, mirostat_update_row, no_repeat_row, typical_row,
    xtc_row, Cutoff, Xtc,
};
use super::kernels::{
    log_softmax_row, logit_bias_row, min_p_row, penalties_row, sample_row, temperature_row,
    top_k_row, top_p_row, topk_logprobs_row, with_scratch,
};
use super::row_scan::{first_error, row_status, RowStatus};
use crate::float::Float;
use crate::philox;
use crate::py_util::{detached, readonly, row_param, slice, value_error};

// ---------------------------------------------------------------------------------
// Errors and array access

/// The reference's ValueError for row `row` of `name`.
fn row_error(name: &str, row: usize, status: RowStatus) -> PyErr {
    match status {
        RowStatus::NanOrInf => value_error(format!("{name} row {row} contains NaN or +inf")),
        _ => value_error(format!("{name} row {row} is entirely -inf")),
    }
}

pub(crate) fn raise_rows(statuses: &[RowStatus], name: &str) -> PyResult<()> {
    match first_error(statuses) {
        Some((row, status)) => Err(row_error(name, row, status)),
        None => Ok(()),
    }
}

/// (batch, vocab) of a logits array, rejecting an empty vocab axis.
fn dims<T: numpy::Element>(x: &PyReadonlyArray2<'_, T>, name: &str) -> PyResult<(usize, usize)> {
    let shape = x.shape();
    if shape[1] == 0 {
        return Err(value_error(format!(
            "{name} must have a non-empty vocab axis, got shape ({}, {})",
            shape[0], shape[1]
        )));
    }
    Ok((shape[0], shape[1]))
}

/// The rows of a (batch, vocab) array as slices, without copying: any row stride
/// (e.g. `logits[:, :vocab]` of a padded array) as long as each row is contiguous.
fn row_slices<'a, T: numpy::Element>(
    x: &'a PyReadonlyArray2<'_, T>,
    name: &str,
) -> PyResult<Vec<&'a [T]>> {
    use numpy::ndarray::Axis;
    (0..x.shape()[0])
        .map(|i| {
            x.as_array()
                .index_axis_move(Axis(0), i)
                .to_slice()
                .ok_or_else(|| {
                    value_error(format!(
                        "{name} must have contiguous rows (unit stride along the vocab axis)"
                    ))
                })
        })
        .collect()
}

/// (batch, width) int64 token ids as one slice and the width, checked against the vocab.
fn id_rows<'a>(
    ids: &'a PyReadonlyArray2<'_, i64>,
    batch: usize,
    vocab: usize,
    name: &str,
) -> PyResult<(&'a [i64], usize)> {
    let shape = ids.shape();
    if shape[0] != batch {
        return Err(value_error(format!(
            "{name} must have shape ({batch}, n), got shape ({}, {})",
            shape[0], shape[1]
        )));
    }
    let data = slice(ids, name)?;
    if let Some(&max) = data.iter().max() {
        if max >= 0 && max as u64 >= vocab as u64 {
            return Err(value_error(format!(
                "{name} holds token id {max}, outside the vocab of {vocab}"
            )));
        }
    }
    Ok((data, shape[1]))
}

/// Row `row` of a (batch, width) array stored as one slice.
fn row_of<T>(data: &[T], width: usize, row: usize) -> &[T] {
    &data[row * width..(row + 1) * width]
}

/// A fresh, uninitialised (batch, vocab) output array, allocated by numpy (which asks
/// for huge pages for big arrays); allocation failure is a Python MemoryError.
fn new_out<'py, T: Float>(
    py: Python<'py>,
    batch: usize,
    vocab: usize,
) -> PyResult<Bound<'py, PyArray2<T>>> {
    use numpy::npyffi::{get_type_object, npy_intp, NpyTypes, PY_ARRAY_API};
    use numpy::PyArrayDescrMethods;
    let mut shape = [batch as npy_intp, vocab as npy_intp];
    // SAFETY: the documented PyArray_NewFromDescr call (steals the descr reference);
    // a NULL result becomes the pending Python error. Every element is written before
    // the array reaches Python (rows failing validation make the call raise instead).
    unsafe {
        let ptr = PY_ARRAY_API.PyArray_NewFromDescr(
            py,
            get_type_object(py, NpyTypes::PyArray_Type),
            T::get_dtype(py).into_dtype_ptr(),
            2,
            shape.as_mut_ptr(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            0,
            std::ptr::null_mut(),
        );
        Ok(Bound::from_owned_ptr_or_err(py, ptr)?.cast_into_unchecked())
    }
}

// ---------------------------------------------------------------------------------
// Running rows

/// Small inputs (under ~0.1 ms of work) run on the calling thread: handing them to
/// the pool costs more than it saves, and much more on a busy machine.
pub(crate) fn sequential(batch: usize, vocab: usize) -> bool {
    batch <= 1 || batch.saturating_mul(vocab) < 1 << 18
}

/// `f(row index, row)` for every row, in parallel for large inputs.
fn par_rows<T: Float, R: Send, F>(rows: &[&[T]], vocab: usize, f: F) -> Vec<R>
where
    F: Fn(usize, &[T]) -> R + Sync + Send,
{
    if sequential(rows.len(), vocab) {
        rows.iter().enumerate().map(|(i, row)| f(i, row)).collect()
    } else {
        rows.par_iter()
            .enumerate()
            .map(|(i, row)| f(i, row))
            .collect()
    }
}

/// A new array like `x` filled by `f(row index, row, out row)` for every row, without
/// the GIL; the reference's error if a row fails its checks.
fn map_rows<'py, T: Float, F>(
    py: Python<'py>,
    x: &PyReadonlyArray2<'py, T>,
    name: &str,
    f: F,
) -> PyResult<Bound<'py, PyArray2<T>>>
where
    F: Fn(usize, &[T], &mut [T]) -> RowStatus + Sync + Send,
{
    let (batch, vocab) = dims(x, name)?;
    let rows = row_slices(x, name)?;
    let out = new_out::<T>(py, batch, vocab)?;
    {
        let mut writer = out.readwrite();
        let out_data = writer
            .as_slice_mut()
            .map_err(|_| value_error("internal: output not contiguous"))?;
        let statuses: Vec<RowStatus> = detached(py, || {
            if sequential(batch, vocab) {
                out_data
                    .chunks_mut(vocab)
                    .zip(rows.iter())
                    .enumerate()
                    .map(|(i, (o, row))| f(i, row, o))
                    .collect()
            } else {
                out_data
                    .par_chunks_mut(vocab)
                    .zip(rows.par_iter())
                    .enumerate()
                    .map(|(i, (o, row))| f(i, row, o))
                    .collect()
            }
        })?;
        raise_rows(&statuses, name)?;
    }
    Ok(out)
}

/// logits as f32 or f64, dispatched to the generic implementation.
pub(crate) enum Logits<'py> {
    F32(PyReadonlyArray2<'py, f32>),
    F64(PyReadonlyArray2<'py, f64>),
}

pub(crate) fn extract_logits<'py>(x: &Bound<'py, PyAny>, name: &str) -> PyResult<Logits<'py>> {
    if let Ok(array) = x.cast::<PyArray2<f32>>() {
        return readonly(array, name).map(Logits::F32);
    }
    if let Ok(array) = x.cast::<PyArray2<f64>>() {
        return readonly(array, name).map(Logits::F64);
    }
    Err(PyTypeError::new_err(format!(
        "{name} must be a float32 or float64 numpy array of shape (batch, vocab)"
    )))
}

/// Evaluate `$body` with `$array` the logits array and `$T` its element type.
macro_rules! dispatch {
    ($x:expr, $name:expr, |$array:ident : $T:ident| $body:expr) => {
        match extract_logits($x, $name)? {
            Logits::F32($array) => {
                #[allow(dead_code)]
                type $T = f32;
                $body
            }
            Logits::F64($array) => {
                #[allow(dead_code)]
                type $T = f64;
                $body
            }
        }
    };
}
pub(crate) use dispatch;

// ---------------------------------------------------------------------------------
// Checks

/// check_logits(x, name): the row checks of the reference's `check_logits` (NaN/+inf,
/// then all -inf), for the lowest bad row.
#[pyfunction]
fn check_logits(py: Python<'_>, x: &Bound<'_, PyAny>, name: &str) -> PyResult<()> {
    fn check<T: Float>(py: Python<'_>, x: &PyReadonlyArray2<'_, T>, name: &str) -> PyResult<()> {
        let (_, vocab) = dims(x, name)?;
        let rows = row_slices(x, name)?;
        let statuses = detached(py, || par_rows(&rows, vocab, |_, row| row_status(row)))?;
        raise_rows(&statuses, name)
    }
    dispatch!(x, name, |array: T| check::<T>(py, &array, name))
}

/// The value checks of the per-row parameters: which entries the reference rejects.
#[pyclass(
    eq,
    from_py_object,
    frozen,
    module = "pyagent_accel._native",
    rename_all = "SCREAMING_SNAKE_CASE"
)]
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Check {
    /// finite and >= 0 (temperature)
    FiniteNonneg,
    /// in (0, 1] (top-p)
    UnitOpenClosed,
    /// in [0, 1] (min-p)
    UnitClosed,
    /// in [0, 1) (epsilon and eta cutoffs)
    UnitClosedOpen,
    /// finite and > 0 (repetition penalty)
    FinitePos,
    /// finite (frequency and presence penalties, logit bias)
    Finite,
    /// an integer >= 0 (positions, token ids)
    Nonneg,
    /// an integer in [0, bound) (sampled token ids)
    Index,
    /// finite and > 1 (DRY's base)
    FiniteAboveOne,
    /// an integer >= 1 (DRY's allowed length)
    Positive,
    /// an integer >= -1 (DRY's penalty_last_n)
    AtLeastMinusOne,
    /// not NaN (mirostat's mu in the truncation, where +inf disables)
    NotNan,
}

/// What a `Check` rejects: `true` for a bad entry (NaN fails every float check).
enum Rejects {
    Float(fn(f64) -> bool),
    Int(fn(i64, i64) -> bool),
}

impl Check {
    fn rejects(self) -> Rejects {
        match self {
            Check::FiniteNonneg => Rejects::Float(|t| !(t.is_finite() && t >= 0.0)),
            Check::UnitOpenClosed => Rejects::Float(|p| !(p > 0.0 && p <= 1.0)),
            Check::UnitClosed => Rejects::Float(|p| !(0.0..=1.0).contains(&p)),
            Check::UnitClosedOpen => Rejects::Float(|p| !(0.0..1.0).contains(&p)),
            Check::FinitePos => Rejects::Float(|r| !(r.is_finite() && r > 0.0)),
            Check::Finite => Rejects::Float(|f| !f.is_finite()),
            Check::Nonneg => Rejects::Int(|v, _| v < 0),
            Check::Index => Rejects::Int(|v, bound| v < 0 || v >= bound),
            Check::FiniteAboveOne => Rejects::Float(|b| !(b.is_finite() && b > 1.0)),
            Check::Positive => Rejects::Int(|v, _| v < 1),
            Check::AtLeastMinusOne => Rejects::Int(|v, _| v < -1),
            Check::NotNan => Rejects::Float(|m| m.is_nan()),
        }
    }
}

/// first_bad(values, check, bound=0): index of the first entry of a 1-D array that
/// `check` rejects, or -1. Float checks read float32/float64 arrays, integer checks
/// int64 arrays; `bound` is the end of the `Check.INDEX` range.
#[pyfunction]
#[pyo3(signature = (values, check, bound = 0))]
fn first_bad(values: &Bound<'_, PyAny>, check: Check, bound: i64) -> PyResult<i64> {
    fn position<T: Copy>(values: &[T], rejects: impl Fn(T) -> bool) -> i64 {
        values
            .iter()
            .position(|&v| rejects(v))
            .map_or(-1, |i| i as i64)
    }
    let expected = match check.rejects() {
        Rejects::Float(rejects) => {
            if let Ok(array) = values.cast::<PyArray1<f64>>() {
                let array = readonly(array, "values")?;
                return Ok(position(slice(&array, "values")?, rejects));
            }
            if let Ok(array) = values.cast::<PyArray1<f32>>() {
                let array = readonly(array, "values")?;
                return Ok(position(slice(&array, "values")?, |v: f32| {
                    rejects(v as f64)
                }));
            }
            "float32 or float64"
        }
        Rejects::Int(rejects) => {
            if let Ok(array) = values.cast::<PyArray1<i64>>() {
                let array = readonly(array, "values")?;
                return Ok(position(slice(&array, "values")?, |v| rejects(v, bound)));
            }
            "int64"
        }
    };
    Err(PyTypeError::new_err(format!(
        "values must be a 1-D {expected} array for {check:?}"
    )))
}

// ---------------------------------------------------------------------------------
// The ops

/// Divide each row's logits by its temperature (0 leaves the row unchanged).
#[pyfunction]
fn apply_temperature<'py>(
    py: Python<'py>,
    logits: &Bound<'py, PyAny>,
    temperature: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    dispatch!(logits, "logits", |x: T| {
        let temperature = temperature.extract::<PyReadonlyArray1<'py, T>>()?;
        let temperatures = row_param(&temperature, x.shape()[0], "temperature")?;
        let out = map_rows(py, &x, "logits", |i, row, out| {
            temperature_row(row, out, temperatures[i])
        })?;
        Ok(out.into_any())
    })
}

/// Keep each row's k largest logits (and ties with the k-th), mask the rest.
#[pyfunction]
fn apply_top_k<'py>(
    py: Python<'py>,
    logits: &Bound<'py, PyAny>,
    k: PyReadonlyArray1<'py, i64>,
) -> PyResult<Bound<'py, PyAny>> {
    dispatch!(logits, "logits", |x: T| {
        let ks = row_param(&k, x.shape()[0], "k")?;
        let out = map_rows(py, &x, "logits", |i, row, out| {
            top_k_row(row, out, ks[i], &mut Vec::new())
        })?;
        Ok(out.into_any())
    })
}

/// Nucleus filter: keep the smallest set of most likely tokens whose mass reaches p.
#[pyfunction]
fn apply_top_p<'py>(
    py: Python<'py>,
    logits: &Bound<'py, PyAny>,
    p: PyReadonlyArray1<'py, f64>,
) -> PyResult<Bound<'py, PyAny>> {
    dispatch!(logits, "logits", |x: T| {
        let ps = row_param(&p, x.shape()[0], "p")?;
        let out = map_rows(py, &x, "logits", |i, row, out| {
            with_scratch(|scratch| top_p_row(row, out, ps[i], scratch))
        })?;
        Ok(out.into_any())
    })
}

/// Mask tokens that are much less likely than the most likely one.
#[pyfunction]
fn apply_min_p<'py>(
    py: Python<'py>,
    logits: &Bound<'py, PyAny>,
    min_p: PyReadonlyArray1<'py, f64>,
) -> PyResult<Bound<'py, PyAny>> {
    dispatch!(logits, "logits", |x: T| {
        let min_ps = row_param(&min_p, x.shape()[0], "min_p")?;
        let out = map_rows(py, &x, "logits", |i, row, out| {
            min_p_row(row, out, min_ps[i])
        })?;
        Ok(out.into_any())
    })
}

/// Penalise tokens that already appeared (repetition, frequency, presence).
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn apply_penalties<'py>(
    py: Python<'py>,
    logits: &Bound<'py, PyAny>,
    prompt_ids: PyReadonlyArray2<'py, i64>,
    output_ids: PyReadonlyArray2<'py, i64>,
    repetition_penalty: &Bound<'py, PyAny>,
    frequency_penalty: &Bound<'py, PyAny>,
    presence_penalty: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    dispatch!(logits, "logits", |x: T| {
        let (batch, vocab) = dims(&x, "logits")?;
        let (prompt, prompt_width) = id_rows(&prompt_ids, batch, vocab, "prompt_ids")?;
        let (output, output_width) = id_rows(&output_ids, batch, vocab, "output_ids")?;
        let repetition = repetition_penalty.extract::<PyReadonlyArray1<'py, T>>()?;
        let frequency = frequency_penalty.extract::<PyReadonlyArray1<'py, T>>()?;
        let presence = presence_penalty.extract::<PyReadonlyArray1<'py, T>>()?;
        let repetition = row_param(&repetition, batch, "repetition_penalty")?;
        let frequency = row_param(&frequency, batch, "frequency_penalty")?;
        let presence = row_param(&presence, batch, "presence_penalty")?;
        let out = map_rows(py, &x, "logits", |i, row, out| {
            with_scratch(|scratch| {
                penalties_row(
                    row,
                    out,
                    row_of(prompt, prompt_width, i),
                    row_of(output, output_width, i),
                    repetition[i],
                    frequency[i],
                    presence[i],
                    scratch,
                )
            })
        })?;
        Ok(out.into_any())
    })
}

/// Add per-row biases to chosen tokens (OpenAI's `logit_bias`).
#[pyfunction]
fn apply_logit_bias<'py>(
    py: Python<'py>,
    logits: &Bound<'py, PyAny>,
    token_ids: PyReadonlyArray2<'py, i64>,
    bias: PyReadonlyArray2<'py, f64>,
) -> PyResult<Bound<'py, PyAny>> {
    dispatch!(logits, "logits", |x: T| {
        let (batch, vocab) = dims(&x, "logits")?;
        let (ids, width) = id_rows(&token_ids, batch, vocab, "token_ids")?;
        if bias.shape() != token_ids.shape() {
            return Err(value_error("bias must have the shape of token_ids"));
        }
        let biases = slice(&bias, "bias")?;
        let out = map_rows(py, &x, "logits", |i, row, out| {
            with_scratch(|scratch| {
                logit_bias_row(
                    row,
                    out,
                    row_of(ids, width, i),
                    row_of(biases, width, i),
                    scratch,
                )
            })
        })?;
        Ok(out.into_any())
    })
}

/// Locally typical sampling: keep the tokens whose surprisal is closest to the entropy.
#[pyfunction]
fn apply_typical_p<'py>(
    py: Python<'py>,
    logits: &Bound<'py, PyAny>,
    typical_p: PyReadonlyArray1<'py, f64>,
) -> PyResult<Bound<'py, PyAny>> {
    dispatch!(logits, "logits", |x: T| {
        let masses = row_param(&typical_p, x.shape()[0], "typical_p")?;
        let out = map_rows(py, &x, "logits", |i, row, out| {
            typical_row(row, out, masses[i])
        })?;
        Ok(out.into_any())
    })
}

/// Epsilon sampling: mask tokens whose probability is below a fixed floor.
#[pyfunction]
fn apply_epsilon_cutoff<'py>(
    py: Python<'py>,
    logits: &Bound<'py, PyAny>,
    epsilon: PyReadonlyArray1<'py, f64>,
) -> PyResult<Bound<'py, PyAny>> {
    dispatch!(logits, "logits", |x: T| {
        let eps = row_param(&epsilon, x.shape()[0], "epsilon")?;
        let out = map_rows(py, &x, "logits", |i, row, out| {
            cutoff_row(row, out, Cutoff::Epsilon(eps[i]))
        })?;
        Ok(out.into_any())
    })
}

/// Eta sampling: a probability floor that falls as the row's entropy rises.
#[pyfunction]
fn apply_eta_cutoff<'py>(
    py: Python<'py>,
    logits: &Bound<'py, PyAny>,
    eta: PyReadonlyArray1<'py, f64>,
) -> PyResult<Bound<'py, PyAny>> {
    dispatch!(logits, "logits", |x: T| {
        let etas = row_param(&eta, x.shape()[0], "eta")?;
        let out = map_rows(py, &x, "logits", |i, row, out| {
            cutoff_row(row, out, Cutoff::Eta(etas[i]))
        })?;
        Ok(out.into_any())
    })
}

/// Restrict rows to a list of tokens (vLLM's `allowed_token_ids`).
#[pyfunction]
fn apply_allowed_token_ids<'py>(
    py: Python<'py>,
    logits: &Bound<'py, PyAny>,
    allowed: PyReadonlyArray2<'py, i64>,
) -> PyResult<Bound<'py, PyAny>> {
    dispatch!(logits, "logits", |x: T| {
        let (batch, vocab) = dims(&x, "logits")?;
        let (ids, width) = id_rows(&allowed, batch, vocab, "allowed")?;
        let out = map_rows(py, &x, "logits", |i, row, out| {
            allowed_row(row, out, row_of(ids, width, i))
        })?;
        Ok(out.into_any())
    })
}

/// Forbid the token that would complete a banned token sequence (vLLM's `bad_words`).
#[pyfunction]
fn apply_bad_words<'py>(
    py: Python<'py>,
    logits: &Bound<'py, PyAny>,
    token_ids: PyReadonlyArray2<'py, i64>,
    bad_words: PyReadonlyArray3<'py, i64>,
) -> PyResult<Bound<'py, PyAny>> {
    dispatch!(logits, "logits", |x: T| {
        let (batch, vocab) = dims(&x, "logits")?;
        let (tokens, width) = id_rows(&token_ids, batch, vocab, "token_ids")?;
        let shape = bad_words.shape();
        if shape[0] != batch {
            return Err(value_error(format!(
                "bad_words must have shape ({batch}, words, max_len), got shape ({}, {}, {})",
                shape[0], shape[1], shape[2]
            )));
        }
        let words = slice(&bad_words, "bad_words")?;
        if let Some(&max) = words.iter().max() {
            if max >= 0 && max as u64 >= vocab as u64 {
                return Err(value_error(format!(
                    "bad_words holds token id {max}, outside the vocab of {vocab}"
                )));
            }
        }
        let per_row = shape[1] * shape[2];
        let out = map_rows(py, &x, "logits", |i, row, out| {
            bad_words_row(
                row,
                out,
                row_of(tokens, width, i),
                row_of(words, per_row, i),
                shape[2],
            )
        })?;
        Ok(out.into_any())
    })
}

/// Forbid a token that would repeat an n-gram of the row (HF's `no_repeat_ngram_size`).
#[pyfunction]
fn apply_no_repeat_ngram<'py>(
    py: Python<'py>,
    logits: &Bound<'py, PyAny>,
    token_ids: PyReadonlyArray2<'py, i64>,
    n: PyReadonlyArray1<'py, i64>,
) -> PyResult<Bound<'py, PyAny>> {
    dispatch!(logits, "logits", |x: T| {
        let (batch, vocab) = dims(&x, "logits")?;
        let (tokens, width) = id_rows(&token_ids, batch, vocab, "token_ids")?;
        let sizes = row_param(&n, batch, "n")?;
        let out = map_rows(py, &x, "logits", |i, row, out| {
            no_repeat_row(row, out, row_of(tokens, width, i), sizes[i])
        })?;
        Ok(out.into_any())
    })
}

/// DRY: penalise the tokens that would extend a repeat of the row's context.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn apply_dry<'py>(
    py: Python<'py>,
    logits: &Bound<'py, PyAny>,
    token_ids: PyReadonlyArray2<'py, i64>,
    multiplier: PyReadonlyArray1<'py, f64>,
    base: PyReadonlyArray1<'py, f64>,
    allowed_length: PyReadonlyArray1<'py, i64>,
    penalty_last_n: PyReadonlyArray1<'py, i64>,
    sequence_breakers: PyReadonlyArray2<'py, i64>,
) -> PyResult<Bound<'py, PyAny>> {
    dispatch!(logits, "logits", |x: T| {
        let (batch, vocab) = dims(&x, "logits")?;
        let (tokens, width) = id_rows(&token_ids, batch, vocab, "token_ids")?;
        let (breakers, breakers_width) =
            id_rows(&sequence_breakers, batch, vocab, "sequence_breakers")?;
        let multiplier = row_param(&multiplier, batch, "multiplier")?;
        let base = row_param(&base, batch, "base")?;
        let allowed_length = row_param(&allowed_length, batch, "allowed_length")?;
        let penalty_last_n = row_param(&penalty_last_n, batch, "penalty_last_n")?;
        let out = map_rows(py, &x, "logits", |i, row, out| {
            let dry = Dry {
                multiplier: multiplier[i],
                base: base[i],
                allowed_length: allowed_length[i],
                penalty_last_n: penalty_last_n[i],
            };
            dry_row(
                row,
                out,
                row_of(tokens, width, i),
                row_of(breakers, breakers_width, i),
                dry,
            )
        })?;
        Ok(out.into_any())
    })
}

/// XTC: sometimes mask the likely tokens but the least of them.
#[pyfunction]
fn apply_xtc<'py>(
    py: Python<'py>,
    logits: &Bound<'py, PyAny>,
    threshold: PyReadonlyArray1<'py, f64>,
    probability: PyReadonlyArray1<'py, f64>,
    seeds: PyReadonlyArray1<'py, i64>,
    positions: PyReadonlyArray1<'py, i64>,
) -> PyResult<Bound<'py, PyAny>> {
    dispatch!(logits, "logits", |x: T| {
        let (batch, vocab) = dims(&x, "logits")?;
        let thresholds = row_param(&threshold, batch, "threshold")?;
        let probabilities = row_param(&probability, batch, "probability")?;
        let seeds = row_param(&seeds, batch, "seeds")?;
        let positions = row_param(&positions, batch, "positions")?;
        let out = map_rows(py, &x, "logits", |i, row, out| {
            let xtc = Xtc {
                threshold: thresholds[i],
                probability: probabilities[i],
                coin: philox::uniform_at(seeds[i], positions[i], vocab as u64 + 1),
            };
            xtc_row(row, out, xtc)
        })?;
        Ok(out.into_any())
    })
}

/// Mirostat v2's truncation: mask the tokens more surprising than mu bits.
#[pyfunction]
fn apply_mirostat<'py>(
    py: Python<'py>,
    logits: &Bound<'py, PyAny>,
    mu: PyReadonlyArray1<'py, f64>,
) -> PyResult<Bound<'py, PyAny>> {
    dispatch!(logits, "logits", |x: T| {
        let mus = row_param(&mu, x.shape()[0], "mu")?;
        let out = map_rows(py, &x, "logits", |i, row, out| {
            cutoff_row(row, out, Cutoff::Mirostat(mus[i]))
        })?;
        Ok(out.into_any())
    })
}

/// Mirostat v2's learning step: mu - eta * (-log2 p(sampled) - tau) per row.
#[pyfunction]
fn mirostat_update<'py>(
    py: Python<'py>,
    logits: &Bound<'py, PyAny>,
    sampled: PyReadonlyArray1<'py, i64>,
    mu: PyReadonlyArray1<'py, f64>,
    tau: PyReadonlyArray1<'py, f64>,
    eta: PyReadonlyArray1<'py, f64>,
) -> PyResult<Bound<'py, PyArray1<f64>>> {
    dispatch!(logits, "logits", |x: T| {
        let (batch, vocab) = dims(&x, "logits")?;
        let tokens = row_param(&sampled, batch, "sampled")?;
        if let Some(i) = tokens
            .iter()
            .position(|&t| t < 0 || t as u64 >= vocab as u64)
        {
            return Err(value_error(format!(
                "sampled[{i}] must be a token id in [0, {vocab}), got {}",
                tokens[i]
            )));
        }
        let mus = row_param(&mu, batch, "mu")?;
        let taus = row_param(&tau, batch, "tau")?;
        let etas = row_param(&eta, batch, "eta")?;
        let rows = row_slices(&x, "logits")?;
        let results: Vec<Result<f64, RowStatus>> = detached(py, || {
            par_rows(&rows, vocab, |i, row| {
                mirostat_update_row::<T>(row, tokens[i] as usize)
            })
        })?;
        let statuses: Vec<RowStatus> = results
            .iter()
            .map(|r| r.err().unwrap_or_default())
            .collect();
        raise_rows(&statuses, "logits")?;
        let mut out = Vec::with_capacity(batch);
        for (i, q) in results.into_iter().map(|r| r.unwrap_or(0.0)).enumerate() {
            if q == f64::NEG_INFINITY {
                return Err(value_error(format!(
                    "sampled[{i}] is token {}, masked (-inf) in logits row {i}: it cannot \
                     have been drawn",
                    tokens[i]
                )));
            }
            out.push(mus[i] - etas[i] * (-q / std::f64::consts::LN_2 - taus[i]));
        }
        Ok(PyArray1::from_vec(py, out))
    })
}

/// Log-probabilities: x - max(x) - log(sum(exp(x - max(x)))) per row, summed in
/// numpy's pairwise order (within 2 eps of the reference; see the module docstring).
#[pyfunction]
fn log_softmax<'py>(py: Python<'py>, logits: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    dispatch!(logits, "logits", |x: T| {
        let out = map_rows(py, &x, "logits", |_, row, out| log_softmax_row(row, out))?;
        Ok(out.into_any())
    })
}

type TopkLogprobs<'py> = (
    Bound<'py, PyAny>,
    Bound<'py, PyArray2<i64>>,
    Bound<'py, PyAny>,
    Bound<'py, PyArray1<i64>>,
);

fn topk_logprobs_typed<'py, T: Float>(
    py: Python<'py>,
    x: &PyReadonlyArray2<'py, T>,
    num: usize,
    sampled: &PyReadonlyArray1<'py, i64>,
) -> PyResult<TopkLogprobs<'py>> {
    let (batch, vocab) = dims(x, "logprobs")?;
    if num > vocab {
        return Err(value_error(format!(
            "num must be in [0, {vocab}], got {num}"
        )));
    }
    let sampled = row_param(sampled, batch, "sampled")?;
    if let Some(i) = sampled
        .iter()
        .position(|&s| s < 0 || s as u64 >= vocab as u64)
    {
        return Err(value_error(format!(
            "sampled[{i}] must be a token id in [0, {vocab}), got {}",
            sampled[i]
        )));
    }
    let rows = row_slices(x, "logprobs")?;
    type Row<T> = Result<(Vec<T>, Vec<i64>, T, i64), RowStatus>;
    let results: Vec<Row<T>> = detached(py, || {
        par_rows(&rows, vocab, |i, row| {
            let (mut values, mut ids) = (vec![T::ZERO; num], vec![0i64; num]);
            topk_logprobs_row(row, num, sampled[i], &mut values, &mut ids, &mut Vec::new())
                .map(|(chosen, rank)| (values, ids, chosen, rank))
        })
    })?;
    let statuses: Vec<RowStatus> = results
        .iter()
        .map(|r| r.as_ref().err().copied().unwrap_or_default())
        .collect();
    raise_rows(&statuses, "logprobs")?;
    let mut values = Vec::with_capacity(batch * num);
    let mut ids = Vec::with_capacity(batch * num);
    let mut chosen = Vec::with_capacity(batch);
    let mut ranks = Vec::with_capacity(batch);
    for (row_values, row_ids, row_chosen, rank) in results.into_iter().flatten() {
        values.extend(row_values);
        ids.extend(row_ids);
        chosen.push(row_chosen);
        ranks.push(rank);
    }
    let shape = [batch, num];
    let values = PyArray1::from_vec(py, values).reshape(shape)?;
    let ids = PyArray1::from_vec(py, ids).reshape(shape)?;
    Ok((
        values.into_any(),
        ids,
        PyArray1::from_vec(py, chosen).into_any(),
        PyArray1::from_vec(py, ranks),
    ))
}

/// The `num` most likely tokens of each row, and the sampled token's logprob and rank.
#[pyfunction]
fn topk_logprobs<'py>(
    py: Python<'py>,
    logprobs: &Bound<'py, PyAny>,
    num: usize,
    sampled: PyReadonlyArray1<'py, i64>,
) -> PyResult<TopkLogprobs<'py>> {
    dispatch!(logprobs, "logprobs", |x: T| topk_logprobs_typed::<T>(
        py, &x, num, &sampled
    ))
}

/// Draw one token per row: greedy where temperature is 0, else a seeded random draw.
/// Greedy rows draw no uniforms; random rows score exactly only the tokens that can
/// still win.
#[pyfunction]
fn sample<'py>(
    py: Python<'py>,
    logits: &Bound<'py, PyAny>,
    temperature: PyReadonlyArray1<'py, f64>,
    seeds: PyReadonlyArray1<'py, i64>,
    positions: PyReadonlyArray1<'py, i64>,
) -> PyResult<Bound<'py, PyArray1<i64>>> {
    dispatch!(logits, "logits", |x: T| {
        let (batch, vocab) = dims(&x, "logits")?;
        let temperatures = row_param(&temperature, batch, "temperature")?;
        let seeds = row_param(&seeds, batch, "seeds")?;
        let positions = row_param(&positions, batch, "positions")?;
        let rows = row_slices(&x, "logits")?;
        let results: Vec<Result<i64, RowStatus>> = detached(py, || {
            par_rows(&rows, vocab, |i, row| {
                sample_row::<T>(row, temperatures[i], seeds[i], positions[i])
            })
        })?;
        let statuses: Vec<RowStatus> = results
            .iter()
            .map(|r| r.err().unwrap_or_default())
            .collect();
        raise_rows(&statuses, "logits")?;
        let tokens: Vec<i64> = results.into_iter().map(|r| r.unwrap_or(0)).collect();
        Ok(PyArray1::from_vec(py, tokens))
    })
}

/// `num` uniform doubles in (0, 1) per row, a pure function of (seed, position, index).
#[pyfunction]
fn philox_uniform<'py>(
    py: Python<'py>,
    seeds: PyReadonlyArray1<'py, i64>,
    positions: PyReadonlyArray1<'py, i64>,
    num: usize,
) -> PyResult<Bound<'py, PyArray2<f64>>> {
    let seeds = slice(&seeds, "seeds")?;
    let batch = seeds.len();
    let positions = row_param(&positions, batch, "positions")?;
    let out = new_out::<f64>(py, batch, num)?;
    if num > 0 {
        let mut writer = out.readwrite();
        let out_data = writer
            .as_slice_mut()
            .map_err(|_| value_error("internal: output not contiguous"))?;
        let fill =
            |(i, row): (usize, &mut [f64])| philox::fill_uniforms(seeds[i], positions[i], row);
        detached(py, || {
            if sequential(batch, num) {
                out_data.chunks_mut(num).enumerate().for_each(fill)
            } else {
                out_data.par_chunks_mut(num).enumerate().for_each(fill)
            }
        })?;
    }
    Ok(out)
}

type Words<'py> = (
    Bound<'py, PyArray1<i64>>,
    Bound<'py, PyArray1<i64>>,
    Bound<'py, PyArray1<i64>>,
    Bound<'py, PyArray1<i64>>,
);

/// philox4x32_10 on six equally long int64 arrays of 32-bit words (counter, then key).
#[pyfunction]
fn philox4x32_10<'py>(
    py: Python<'py>,
    words: [PyReadonlyArray1<'py, i64>; 6],
) -> PyResult<Words<'py>> {
    const NAMES: [&str; 6] = ["counter", "counter", "counter", "counter", "key", "key"];
    let n = words[0].len();
    let mut words32: Vec<Vec<u32>> = Vec::with_capacity(6);
    for (array, name) in words.iter().zip(NAMES) {
        let values = slice(array, name)?;
        if values.len() != n {
            return Err(value_error(
                "counter and key words must have the same shape",
            ));
        }
        if let Some(bad) = values
            .iter()
            .find(|&&v| !(0..=u32::MAX as i64).contains(&v))
        {
            return Err(value_error(format!(
                "{name} words must be in [0, 2**32), got {bad}"
            )));
        }
        words32.push(values.iter().map(|&v| v as u32).collect());
    }
    let mut out = [vec![0i64; n], vec![0i64; n], vec![0i64; n], vec![0i64; n]];
    detached(py, || {
        let [o0, o1, o2, o3] = &mut out;
        philox::philox_arrays(
            [
                &words32[0],
                &words32[1],
                &words32[2],
                &words32[3],
                &words32[4],
                &words32[5],
            ],
            [o0, o1, o2, o3],
        )
    })?;
    let [o0, o1, o2, o3] = out;
    Ok((
        PyArray1::from_vec(py, o0),
        PyArray1::from_vec(py, o1),
        PyArray1::from_vec(py, o2),
        PyArray1::from_vec(py, o3),
    ))
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Check>()?;
    m.add_function(wrap_pyfunction!(check_logits, m)?)?;
    m.add_function(wrap_pyfunction!(first_bad, m)?)?;
    m.add_function(wrap_pyfunction!(apply_temperature, m)?)?;
    m.add_function(wrap_pyfunction!(apply_top_k, m)?)?;
    m.add_function(wrap_pyfunction!(apply_top_p, m)?)?;
    m.add_function(wrap_pyfunction!(apply_min_p, m)?)?;
    m.add_function(wrap_pyfunction!(apply_penalties, m)?)?;
    m.add_function(wrap_pyfunction!(apply_logit_bias, m)?)?;
    m.add_function(wrap_pyfunction!(apply_typical_p, m)?)?;
    m.add_function(wrap_pyfunction!(apply_epsilon_cutoff, m)?)?;
    m.add_function(wrap_pyfunction!(apply_eta_cutoff, m)?)?;
    m.add_function(wrap_pyfunction!(apply_allowed_token_ids, m)?)?;
    m.add_function(wrap_pyfunction!(apply_bad_words, m)?)?;
    m.add_function(wrap_pyfunction!(apply_no_repeat_ngram, m)?)?;
    m.add_function(wrap_pyfunction!(apply_dry, m)?)?;
    m.add_function(wrap_pyfunction!(apply_xtc, m)?)?;
    m.add_function(wrap_pyfunction!(apply_mirostat, m)?)?;
    m.add_function(wrap_pyfunction!(mirostat_update, m)?)?;
    m.add_function(wrap_pyfunction!(log_softmax, m)?)?;
    m.add_function(wrap_pyfunction!(topk_logprobs, m)?)?;
    m.add_function(wrap_pyfunction!(sample, m)?)?;
    m.add_function(wrap_pyfunction!(philox_uniform, m)?)?;
    m.add_function(wrap_pyfunction!(philox4x32_10, m)?)?;
    Ok(())
}
