//! The `_native` functions behind `pyagent_accel.ops.attention`.
//!
//! The Python wrappers (`python/pyagent_accel/ops/attention.py`) have made the
//! reference's checks, in its order and with its messages, and converted the index
//! arrays to C-contiguous int64. The bindings pick the element types, check again
//! everything the kernels rely on (ValueError naming the argument: nothing reachable
//! from Python panics or reads out of bounds) and run the kernels without the GIL.
//! Float arrays are float32, float64, float16, or bfloat16 passed as uint16 bits.

use half::f16;
use numpy::ndarray::{Array3, Dimension, Ix3, Ix4};
use numpy::{
    IntoPyArray, PyArray, PyArrayMethods, PyReadonlyArray, PyReadonlyArray1, PyReadonlyArray2,
    PyReadwriteArray, PyUntypedArrayMethods,
};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;

use super::elem::{Bf16, Compute, Elem};
use super::kernels::{attention, check_batch, write_slots, Cache, Queries, Request, Scoring};
use crate::py_util::{detached, readonly, slice, value_error};

/// A float array of one of the four element types.
enum Floats<'py, D: Dimension> {
    F32(PyReadonlyArray<'py, f32, D>),
    F64(PyReadonlyArray<'py, f64, D>),
    F16(PyReadonlyArray<'py, f16, D>),
    Bf16(PyReadonlyArray<'py, Bf16, D>),
}

/// A writable float array (a cache written in place).
enum FloatsMut<'py, D: Dimension> {
    F32(PyReadwriteArray<'py, f32, D>),
    F64(PyReadwriteArray<'py, f64, D>),
    F16(PyReadwriteArray<'py, f16, D>),
    Bf16(PyReadwriteArray<'py, Bf16, D>),
}

/// `$body` with `$a` bound to the typed array of whichever variant `$x` holds.
macro_rules! with_floats {
    ($x:expr, $enum:ident, $a:ident => $body:expr) => {
        match $x {
            $enum::F32($a) => $body,
            $enum::F64($a) => $body,
            $enum::F16($a) => $body,
            $enum::Bf16($a) => $body,
        }
    };
}

fn not_float(name: &str, ndim: usize) -> PyErr {
    PyTypeError::new_err(format!(
        "{name} must be a float32, float64, float16 or bfloat16 (as uint16) numpy array \
         with {ndim} dimensions"
    ))
}

fn floats<'py, D: Dimension>(x: &Bound<'py, PyAny>, name: &str) -> PyResult<Floats<'py, D>> {
    if let Ok(a) = x.cast::<PyArray<f32, D>>() {
        return readonly(a, name).map(Floats::F32);
    }
    if let Ok(a) = x.cast::<PyArray<f64, D>>() {
        return readonly(a, name).map(Floats::F64);
    }
    if let Ok(a) = x.cast::<PyArray<f16, D>>() {
        return readonly(a, name).map(Floats::F16);
    }
    if let Ok(a) = x.cast::<PyArray<Bf16, D>>() {
        return readonly(a, name).map(Floats::Bf16);
    }
    Err(not_float(name, D::NDIM.unwrap_or(0)))
}

fn writable<'py, T: numpy::Element, D: Dimension>(
    a: &Bound<'py, PyArray<T, D>>,
    name: &str,
) -> PyResult<PyReadwriteArray<'py, T, D>> {
    a.try_readwrite().map_err(|_| {
        value_error(format!(
            "{name} is read-only or used elsewhere in this call"
        ))
    })
}

fn floats_mut<'py, D: Dimension>(x: &Bound<'py, PyAny>, name: &str) -> PyResult<FloatsMut<'py, D>> {
    if let Ok(a) = x.cast::<PyArray<f32, D>>() {
        return writable(a, name).map(FloatsMut::F32);
    }
    if let Ok(a) = x.cast::<PyArray<f64, D>>() {
        return writable(a, name).map(FloatsMut::F64);
    }
    if let Ok(a) = x.cast::<PyArray<f16, D>>() {
        return writable(a, name).map(FloatsMut::F16);
    }
    if let Ok(a) = x.cast::<PyArray<Bf16, D>>() {
        return writable(a, name).map(FloatsMut::Bf16);
    }
    Err(not_float(name, D::NDIM.unwrap_or(0)))
}

/// The value cache, which must have the key cache's element type.
fn like_keys<'py, E: Elem>(x: &Bound<'py, PyAny>) -> PyResult<PyReadonlyArray<'py, E, Ix4>> {
    let a = x
        .cast::<PyArray<E, Ix4>>()
        .map_err(|_| PyTypeError::new_err("value_cache must have key_cache's dtype and shape"))?;
    readonly(a, "value_cache")
}

// ---------------------------------------------------------------------------------
// reshape_and_cache

/// reshape_and_cache(key, value, key_cache, value_cache, slot_mapping) -> None
///
/// slot_mapping: int64 (num_tokens,). Writes key[t] / value[t] into slot
/// slot_mapping[t] >= 0 of the caches, cast to their dtype.
#[pyfunction]
fn reshape_and_cache(
    py: Python<'_>,
    key: &Bound<'_, PyAny>,
    value: &Bound<'_, PyAny>,
    key_cache: &Bound<'_, PyAny>,
    value_cache: &Bound<'_, PyAny>,
    slot_mapping: PyReadonlyArray1<'_, i64>,
) -> PyResult<()> {
    let slots = slice(&slot_mapping, "slot_mapping")?;
    let shape: Vec<usize> = key_cache
        .getattr("shape")?
        .extract::<Vec<usize>>()
        .map_err(|_| not_float("key_cache", 4))?;
    let num_slots = shape.iter().take(2).product::<usize>();
    write_cache(py, key, key_cache, slots, num_slots, "key", "key_cache")?;
    write_cache(
        py,
        value,
        value_cache,
        slots,
        num_slots,
        "value",
        "value_cache",
    )
}

/// One of the two writes of `reshape_and_cache`, after checking the shapes and slots.
fn write_cache(
    py: Python<'_>,
    src: &Bound<'_, PyAny>,
    cache: &Bound<'_, PyAny>,
    slots: &[i64],
    num_slots: usize,
    src_name: &str,
    cache_name: &str,
) -> PyResult<()> {
    let src = floats::<Ix3>(src, src_name)?;
    let mut cache = floats_mut::<Ix4>(cache, cache_name)?;
    let src_shape = with_floats!(&src, Floats, a => a.shape().to_vec());
    let cache_shape = with_floats!(&cache, FloatsMut, a => a.shape().to_vec());
    if cache_shape[..2].iter().product::<usize>() != num_slots
        || src_shape[1..] != cache_shape[2..]
        || src_shape[0] != slots.len()
    {
        return Err(value_error(format!(
            "{src_name} {src_shape:?}, {cache_name} {cache_shape:?} and slot_mapping ({},) \
             must agree",
            slots.len()
        )));
    }
    if let Some(&s) = slots.iter().find(|&&s| s >= num_slots as i64) {
        return Err(value_error(format!(
            "slot_mapping holds {s}, past the {num_slots} slots"
        )));
    }
    with_floats!(src, Floats, s => {
        let view = s.as_array();
        with_floats!(&mut cache, FloatsMut, c => {
            let dst = c.as_slice_mut().map_err(|_| {
                value_error(format!("{cache_name} must be C-contiguous to be written in place"))
            })?;
            detached(py, || write_slots(view, dst, slots))
        })
    })
}

// ---------------------------------------------------------------------------------
// paged_attention and paged_decode_attention

/// The arguments both attention ops share, after the query and the caches.
struct Batch<'a> {
    table: &'a [i64],
    table_width: usize,
    /// (first_token, q_len, seq_len) per request
    requests: Vec<(usize, usize, usize)>,
    masks: Vec<Option<&'a [bool]>>,
    scale: f64,
    sliding_window: Option<i64>,
    soft_cap: Option<f64>,
    alibi: Option<&'a [f64]>,
}

fn table_of<'a>(
    block_table: &'a PyReadonlyArray2<'_, i64>,
    num_reqs: usize,
) -> PyResult<(&'a [i64], usize)> {
    let shape = block_table.shape();
    if shape[0] != num_reqs {
        return Err(value_error(format!(
            "block_table must have one row per request ({num_reqs}), got {}",
            shape[0]
        )));
    }
    Ok((slice(block_table, "block_table")?, shape[1]))
}

fn count(x: i64, name: &str) -> PyResult<usize> {
    usize::try_from(x).map_err(|_| value_error(format!("{name} must be >= 0, got {x}")))
}

/// paged_attention(...) -> array like query (see the reference's contract).
///
/// block_table (num_reqs, W), query_start_loc (num_reqs + 1,) and seq_lens (num_reqs,)
/// are int64; alibi_slopes float64 (num_heads,); custom_masks a list of None or C-order
/// boolean (q_len_r, seq_lens[r]) arrays.
#[pyfunction]
#[pyo3(signature = (
    query, key_cache, value_cache, block_table, query_start_loc, seq_lens, scale,
    sliding_window=None, soft_cap=None, alibi_slopes=None, custom_masks=None
))]
#[allow(clippy::too_many_arguments)]
fn paged_attention<'py>(
    py: Python<'py>,
    query: &Bound<'py, PyAny>,
    key_cache: &Bound<'py, PyAny>,
    value_cache: &Bound<'py, PyAny>,
    block_table: PyReadonlyArray2<'py, i64>,
    query_start_loc: PyReadonlyArray1<'py, i64>,
    seq_lens: PyReadonlyArray1<'py, i64>,
    scale: f64,
    sliding_window: Option<i64>,
    soft_cap: Option<f64>,
    alibi_slopes: Option<PyReadonlyArray1<'py, f64>>,
    custom_masks: Option<Vec<Option<PyReadonlyArray2<'py, bool>>>>,
) -> PyResult<Bound<'py, PyAny>> {
    let qsl = slice(&query_start_loc, "query_start_loc")?;
    let lens = slice(&seq_lens, "seq_lens")?;
    if qsl.len() != lens.len() + 1 {
        return Err(value_error(format!(
            "query_start_loc ({}) must have one entry more than seq_lens ({})",
            qsl.len(),
            lens.len()
        )));
    }
    let (table, table_width) = table_of(&block_table, lens.len())?;
    let mut requests = Vec::with_capacity(lens.len());
    for (r, &seq_len) in lens.iter().enumerate() {
        let (start, end) = (
            count(qsl[r], "query_start_loc")?,
            count(qsl[r + 1], "query_start_loc")?,
        );
        if end < start {
            return Err(value_error(format!(
                "query_start_loc must be non-decreasing, got {start} then {end}"
            )));
        }
        requests.push((start, end - start, count(seq_len, "seq_lens")?));
    }
    let masks = match &custom_masks {
        None => vec![None; lens.len()],
        Some(masks) if masks.len() == lens.len() => masks
            .iter()
            .enumerate()
            .map(|(r, m)| {
                m.as_ref()
                    .map(|m| slice(m, &format!("custom_masks[{r}]")))
                    .transpose()
            })
            .collect::<PyResult<_>>()?,
        Some(masks) => {
            return Err(value_error(format!(
                "custom_masks must hold one entry per request ({}), got {}",
                lens.len(),
                masks.len()
            )))
        }
    };
    let alibi = alibi_slopes
        .as_ref()
        .map(|a| slice(a, "alibi_slopes"))
        .transpose()?;
    let batch = Batch {
        table,
        table_width,
        requests,
        masks,
        scale,
        sliding_window,
        soft_cap,
        alibi,
    };
    attend(py, query, key_cache, value_cache, &batch)
}

/// paged_decode_attention(...) -> array like query: one query token per request,
/// requests with seq_len 0 get zeros. Index arrays as for `paged_attention`.
#[pyfunction]
#[pyo3(signature = (
    query, key_cache, value_cache, block_table, seq_lens, scale,
    sliding_window=None, soft_cap=None, alibi_slopes=None
))]
#[allow(clippy::too_many_arguments)]
fn paged_decode_attention<'py>(
    py: Python<'py>,
    query: &Bound<'py, PyAny>,
    key_cache: &Bound<'py, PyAny>,
    value_cache: &Bound<'py, PyAny>,
    block_table: PyReadonlyArray2<'py, i64>,
    seq_lens: PyReadonlyArray1<'py, i64>,
    scale: f64,
    sliding_window: Option<i64>,
    soft_cap: Option<f64>,
    alibi_slopes: Option<PyReadonlyArray1<'py, f64>>,
) -> PyResult<Bound<'py, PyAny>> {
    let lens = slice(&seq_lens, "seq_lens")?;
    let (table, table_width) = table_of(&block_table, lens.len())?;
    let requests = lens
        .iter()
        .enumerate()
        .map(|(r, &s)| Ok((r, usize::from(s != 0), count(s, "seq_lens")?)))
        .collect::<PyResult<_>>()?;
    let alibi = alibi_slopes
        .as_ref()
        .map(|a| slice(a, "alibi_slopes"))
        .transpose()?;
    let batch = Batch {
        table,
        table_width,
        requests,
        masks: vec![None; lens.len()],
        scale,
        sliding_window,
        soft_cap,
        alibi,
    };
    let query_rows = query.getattr("shape")?.get_item(0)?.extract::<usize>()?;
    if query_rows != lens.len() {
        return Err(value_error(format!(
            "query must have one row per request ({}), got {query_rows}",
            lens.len()
        )));
    }
    attend(py, query, key_cache, value_cache, &batch)
}

/// Picks the query's and the caches' element types and runs `attend_typed`.
fn attend<'py>(
    py: Python<'py>,
    query: &Bound<'py, PyAny>,
    key_cache: &Bound<'py, PyAny>,
    value_cache: &Bound<'py, PyAny>,
    batch: &Batch<'_>,
) -> PyResult<Bound<'py, PyAny>> {
    let query = floats::<Ix3>(query, "query")?;
    let keys = floats::<Ix4>(key_cache, "key_cache")?;
    with_floats!(query, Floats, q => with_floats!(keys, Floats, k => {
        let v = like_keys(value_cache)?;
        attend_typed(py, q, k, v, batch)
    }))
}

fn attend_typed<'py, Q: Elem, E: Elem>(
    py: Python<'py>,
    query: PyReadonlyArray<'py, Q, Ix3>,
    key_cache: PyReadonlyArray<'py, E, Ix4>,
    value_cache: PyReadonlyArray<'py, E, Ix4>,
    batch: &Batch<'_>,
) -> PyResult<Bound<'py, PyAny>> {
    let (num_tokens, num_heads, head_size) = query.as_array().dim();
    let [num_blocks, block_size, num_kv_heads, kv_head_size] = key_cache.shape() else {
        unreachable!("a 4-D array")
    };
    if kv_head_size != &head_size || value_cache.shape() != key_cache.shape() {
        return Err(value_error(format!(
            "query {:?}, key_cache {:?} and value_cache {:?} must have one head_size",
            query.shape(),
            key_cache.shape(),
            value_cache.shape()
        )));
    }
    let cache = Cache {
        keys: slice(&key_cache, "key_cache")?,
        values: slice(&value_cache, "value_cache")?,
        num_blocks: *num_blocks,
        block_size: *block_size,
        num_kv_heads: *num_kv_heads,
        head_size,
    };
    let w = batch.table_width;
    let requests: Vec<Request<'_>> = batch
        .requests
        .iter()
        .zip(&batch.masks)
        .enumerate()
        .map(|(r, (&(first_token, q_len, seq_len), &mask))| Request {
            first_token,
            q_len,
            seq_len,
            blocks: &batch.table[r * w..(r + 1) * w],
            mask,
        })
        .collect();
    let c = <Q::Compute as crate::float::Float>::from_f64;
    let scoring = Scoring {
        scale: c(batch.scale),
        window: batch.sliding_window,
        soft_cap: batch.soft_cap.map(c),
        alibi: batch.alibi.map(|a| a.iter().map(|&x| c(x)).collect()),
    };
    let view = query.as_array();
    let out = detached(py, || -> Result<Vec<Q>, String> {
        let data: Vec<Q::Compute> = view.iter().map(|&x| Q::Compute::from_elem(x)).collect();
        let queries = Queries {
            data: &data,
            num_tokens,
            num_heads,
        };
        check_batch(&cache, &queries, &requests, &scoring)?;
        let out = attention(&cache, &queries, &requests, &scoring);
        Ok(out.into_iter().map(|x| x.to_elem::<Q>()).collect())
    })?
    .map_err(value_error)?;
    let out = Array3::from_shape_vec((num_tokens, num_heads, head_size), out)
        .map_err(|e| value_error(e.to_string()))?;
    Ok(out.into_pyarray(py).into_any())
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(reshape_and_cache, m)?)?;
    m.add_function(wrap_pyfunction!(paged_attention, m)?)?;
    m.add_function(wrap_pyfunction!(paged_decode_attention, m)?)?;
    Ok(())
}
