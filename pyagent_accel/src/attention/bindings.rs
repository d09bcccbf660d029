//! The `_native` functions behind `pyagent_accel.ops.attention`.
//!
//! The Python wrappers (`python/pyagent_accel/ops/attention.py`) have made the
//! reference's checks, in its order and with its messages, and converted the index
//! arrays to C-contiguous int64. The bindings pick the element types, check again
//! everything the kernels rely on (ValueError naming the argument: nothing reachable
//! from Python panics or reads out of bounds) and run the kernels without the GIL.
//! Float arrays are read with `crate::elem` (bfloat16 as int16 bits).

use numpy::ndarray::{Array3, Ix2, Ix3};
use numpy::{
    IntoPyArray, PyArrayDyn, PyReadonlyArray1, PyReadonlyArray2, PyReadonlyArrayDyn,
    PyUntypedArrayMethods,
};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;

use super::kernels::{
    attention, check_batch, write_slot_columns, write_slots, Cache, Queries, Request, Scoring,
};
use crate::elem::{dtype_of, float_array, float_array_mut, with_elem, Elem};
use crate::float::Float;
use crate::py_util::{detached, slice, value_error};

/// The `shape` of array `name`, which must have N axes (ValueError otherwise).
fn dims<const N: usize>(shape: &[usize], name: &str) -> PyResult<[usize; N]> {
    shape
        .try_into()
        .map_err(|_| value_error(format!("{name} must have {N} axes, got shape {shape:?}")))
}

/// `$body` with `$E` bound to a cache's storage type: the fp8 format `$format` names
/// ("e4m3", "e5m2": a uint8 cache of its codes), or with None the float dtype of the
/// array `$cache` (`with_elem`).
macro_rules! with_cache_elem {
    ($format:expr, $cache:expr, $name:expr, $E:ident => $body:expr) => {
        match $format {
            None => with_elem!(dtype_of($cache, $name)?, $E => $body),
            Some("e4m3") => {
                type $E = super::fp8::E4m3;
                $body
            }
            Some("e5m2") => {
                type $E = super::fp8::E5m2;
                $body
            }
            Some(other) => Err(value_error(format!(
                "kv_format must be None, 'e4m3' or 'e5m2', got {other:?}"
            ))),
        }
    };
}

/// The value cache, which must have the key cache's dtype.
fn like_keys<'py, E: Elem>(x: &Bound<'py, PyAny>) -> PyResult<PyReadonlyArrayDyn<'py, E>> {
    if x.cast::<PyArrayDyn<E>>().is_err() {
        return Err(PyTypeError::new_err(
            "value_cache must have key_cache's dtype and shape",
        ));
    }
    float_array::<E>(x, "value_cache")
}

// ---------------------------------------------------------------------------------
// reshape_and_cache

/// reshape_and_cache(key, value, key_cache, value_cache, slot_mapping, kv_format=None)
/// -> None
///
/// slot_mapping: int64 (num_tokens,). Writes key[t] / value[t] into slot
/// slot_mapping[t] >= 0 of the caches, cast to their dtype; with kv_format ("e4m3",
/// "e5m2") the caches are uint8 and get the codes of key[t] / value[t] (already divided
/// by the scales).
#[pyfunction]
#[pyo3(signature = (key, value, key_cache, value_cache, slot_mapping, kv_format=None))]
fn reshape_and_cache(
    py: Python<'_>,
    key: &Bound<'_, PyAny>,
    value: &Bound<'_, PyAny>,
    key_cache: &Bound<'_, PyAny>,
    value_cache: &Bound<'_, PyAny>,
    slot_mapping: PyReadonlyArray1<'_, i64>,
    kv_format: Option<&str>,
) -> PyResult<()> {
    let slots = slice(&slot_mapping, "slot_mapping")?;
    // key_cache's slots bound both writes (a float array: TypeError otherwise)
    if kv_format.is_none() {
        dtype_of(key_cache, "key_cache")?;
    }
    let shape: Vec<usize> = key_cache.getattr("shape")?.extract()?;
    let num_slots = shape.iter().take(2).product::<usize>();
    // one write: `write_typed` for the dtypes of src and cache
    let write = |src: &Bound<'_, PyAny>, cache: &Bound<'_, PyAny>, src_name, cache_name| {
        with_elem!(dtype_of(src, src_name)?, S => with_cache_elem!(kv_format, cache, cache_name, D => {
            write_typed::<S, D>(py, src, cache, slots, num_slots, src_name, cache_name)
        }))
    };
    write(key, key_cache, "key", "key_cache")?;
    write(value, value_cache, "value", "value_cache")
}

/// One of the two writes of `reshape_and_cache`, after checking the shapes and slots.
fn write_typed<S: Elem, D: Elem>(
    py: Python<'_>,
    src: &Bound<'_, PyAny>,
    cache: &Bound<'_, PyAny>,
    slots: &[i64],
    num_slots: usize,
    src_name: &str,
    cache_name: &str,
) -> PyResult<()> {
    let src = float_array::<S>(src, src_name)?;
    let mut cache = float_array_mut::<D>(cache, cache_name)?;
    let src_shape: [usize; 3] = dims(src.shape(), src_name)?;
    let cache_shape: [usize; 4] = dims(cache.shape(), cache_name)?;
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
    let view = src
        .as_array()
        .into_dimensionality::<Ix3>()
        .map_err(|e| value_error(e.to_string()))?;
    let dst = cache.as_slice_mut().map_err(|_| {
        value_error(format!(
            "{cache_name} must be C-contiguous to be written in place"
        ))
    })?;
    detached(py, || write_slots(view, dst, slots))
}

// ---------------------------------------------------------------------------------
// concat_and_cache_mla

/// concat_and_cache_mla(kv_c, k_pe, kv_cache, slot_mapping) -> None
///
/// kv_c: (num_tokens, rank), k_pe: (num_tokens, rope), kv_cache: C-contiguous
/// (num_blocks, block_size, rank + rope), slot_mapping: int64 (num_tokens,). Writes
/// [kv_c[t], k_pe[t]] into slot slot_mapping[t] >= 0, cast to the cache's dtype.
#[pyfunction]
fn concat_and_cache_mla(
    py: Python<'_>,
    kv_c: &Bound<'_, PyAny>,
    k_pe: &Bound<'_, PyAny>,
    kv_cache: &Bound<'_, PyAny>,
    slot_mapping: PyReadonlyArray1<'_, i64>,
) -> PyResult<()> {
    let slots = slice(&slot_mapping, "slot_mapping")?;
    dtype_of(kv_cache, "kv_cache")?;
    let shape: Vec<usize> = kv_cache.getattr("shape")?.extract()?;
    let [num_blocks, block_size, row_len] = dims(&shape, "kv_cache")?;
    let width = |x: &Bound<'_, PyAny>, name| -> PyResult<usize> {
        let shape: Vec<usize> = x.getattr("shape")?.extract()?;
        let [tokens, width] = dims(&shape, name)?;
        if tokens != slots.len() {
            return Err(value_error(format!(
                "{name} must have one row per slot ({}), got {tokens}",
                slots.len()
            )));
        }
        Ok(width)
    };
    let rank = width(kv_c, "kv_c")?;
    if rank + width(k_pe, "k_pe")? != row_len {
        return Err(value_error(format!(
            "kv_c and k_pe must fill the cache's rows of {row_len}"
        )));
    }
    let num_slots = num_blocks * block_size;
    if let Some(&s) = slots.iter().find(|&&s| s >= num_slots as i64) {
        return Err(value_error(format!(
            "slot_mapping holds {s}, past the {num_slots} slots"
        )));
    }
    // one part: `write_part` for the dtypes of the part and the cache
    let write = |src: &Bound<'_, PyAny>, name, offset| {
        with_elem!(dtype_of(src, name)?, S => with_elem!(dtype_of(kv_cache, "kv_cache")?, D => {
            write_part::<S, D>(py, src, kv_cache, name, row_len, offset, slots)
        }))
    };
    write(kv_c, "kv_c", 0)?;
    write(k_pe, "k_pe", rank)
}

/// One of the two writes of `concat_and_cache_mla` (columns offset.. of each slot's
/// row), after the shapes and slots are checked.
fn write_part<S: Elem, D: Elem>(
    py: Python<'_>,
    src: &Bound<'_, PyAny>,
    cache: &Bound<'_, PyAny>,
    name: &str,
    row_len: usize,
    offset: usize,
    slots: &[i64],
) -> PyResult<()> {
    let src = float_array::<S>(src, name)?;
    let mut cache = float_array_mut::<D>(cache, "kv_cache")?;
    let view = src
        .as_array()
        .into_dimensionality::<Ix2>()
        .map_err(|e| value_error(e.to_string()))?;
    let dst = cache.as_slice_mut().map_err(|_| {
        value_error("kv_cache must be C-contiguous to be written in place".to_string())
    })?;
    detached(py, || write_slot_columns(view, dst, row_len, offset, slots))
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
    causal: bool,
    /// an fp8 cache's format, and the scales its codes are read with
    kv_format: Option<&'a str>,
    k_scale: f64,
    v_scale: f64,
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
/// boolean (q_len_r, seq_lens[r]) arrays; kv_format None, or "e4m3" / "e5m2" for
/// uint8 caches of fp8 codes read as their values times k_scale / v_scale.
#[pyfunction]
#[pyo3(signature = (
    query, key_cache, value_cache, block_table, query_start_loc, seq_lens, scale,
    sliding_window=None, soft_cap=None, alibi_slopes=None, custom_masks=None, causal=true,
    kv_format=None, k_scale=1.0, v_scale=1.0
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
    causal: bool,
    kv_format: Option<&str>,
    k_scale: f64,
    v_scale: f64,
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
        causal,
        kv_format,
        k_scale,
        v_scale,
    };
    attend(py, query, key_cache, value_cache, &batch)
}

/// paged_decode_attention(...) -> array like query: one query token per request,
/// requests with seq_len 0 get zeros. Index arrays and the fp8 arguments as for
/// `paged_attention`.
#[pyfunction]
#[pyo3(signature = (
    query, key_cache, value_cache, block_table, seq_lens, scale,
    sliding_window=None, soft_cap=None, alibi_slopes=None, kv_format=None, k_scale=1.0,
    v_scale=1.0
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
    kv_format: Option<&str>,
    k_scale: f64,
    v_scale: f64,
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
        causal: true,
        kv_format,
        k_scale,
        v_scale,
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

/// `attend_typed` for the dtypes of the query and the caches (an fp8 cache's codes
/// read in place: its k_scale folds into the softmax scale, its v_scale into the
/// output, both in the compute type).
fn attend<'py>(
    py: Python<'py>,
    query: &Bound<'py, PyAny>,
    key_cache: &Bound<'py, PyAny>,
    value_cache: &Bound<'py, PyAny>,
    batch: &Batch<'_>,
) -> PyResult<Bound<'py, PyAny>> {
    with_elem!(dtype_of(query, "query")?, Q => with_cache_elem!(batch.kv_format, key_cache, "key_cache", E => {
        attend_typed::<Q, E>(py, query, key_cache, value_cache, batch)
    }))
}

fn attend_typed<'py, Q: Elem, E: Elem>(
    py: Python<'py>,
    query: &Bound<'py, PyAny>,
    key_cache: &Bound<'py, PyAny>,
    value_cache: &Bound<'py, PyAny>,
    batch: &Batch<'_>,
) -> PyResult<Bound<'py, PyAny>> {
    let query = float_array::<Q>(query, "query")?;
    let key_cache = float_array::<E>(key_cache, "key_cache")?;
    let value_cache = like_keys::<E>(value_cache)?;
    let [num_tokens, num_heads, head_size] = dims(query.shape(), "query")?;
    let [num_blocks, block_size, num_kv_heads, kv_head_size] =
        dims(key_cache.shape(), "key_cache")?;
    if kv_head_size != head_size || value_cache.shape() != key_cache.shape() {
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
        num_blocks,
        block_size,
        num_kv_heads,
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
    let c = Q::C::from_f64;
    let scoring = Scoring {
        scale: c(batch.scale * batch.k_scale),
        window: batch.sliding_window,
        soft_cap: batch.soft_cap.map(c),
        alibi: batch.alibi.map(|a| a.iter().map(|&x| c(x)).collect()),
        causal: batch.causal,
    };
    // a 3-D view: iterating it is much faster than iterating a dynamic-dimension one
    let view = query
        .as_array()
        .into_dimensionality::<Ix3>()
        .map_err(|e| value_error(e.to_string()))?;
    let out = detached(py, || -> Result<Vec<Q>, String> {
        let data: Vec<Q::C> = view.iter().map(|&x| x.load()).collect();
        let queries = Queries {
            data: &data,
            num_tokens,
            num_heads,
        };
        check_batch(&cache, &queries, &requests, &scoring)?;
        let out = attention(&cache, &queries, &requests, &scoring);
        let v_scale = c(batch.v_scale);
        Ok(out.into_iter().map(|o| Q::store(o * v_scale)).collect())
    })?
    .map_err(value_error)?;
    let out = Array3::from_shape_vec((num_tokens, num_heads, head_size), out)
        .map_err(|e| value_error(e.to_string()))?;
    Ok(out.into_pyarray(py).into_any())
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(reshape_and_cache, m)?)?;
    m.add_function(wrap_pyfunction!(concat_and_cache_mla, m)?)?;
    m.add_function(wrap_pyfunction!(paged_attention, m)?)?;
    m.add_function(wrap_pyfunction!(paged_decode_attention, m)?)?;
    Ok(())
}
