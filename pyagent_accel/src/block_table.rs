//! Kernels of `pyagent_accel.ops.block_table`: positions, slot mapping and logits
//! indices of a flattened, padded batch (contract: `pyagent_ref.ops.block_table`).
//!
//! Request r owns tokens `qsl[r]..qsl[r + 1]`; a token at position p goes to
//!
//! ```text
//! slot = block_table[r, p / block_size] * block_size + p % block_size
//! ```
//!
//! and tokens at or past `qsl[num_reqs]` are padding (PAD_SLOT_ID). The checks run in
//! the reference's order with its messages, so the same bad input raises the same
//! ValueError. Inputs are int32 or int64 arrays of any layout (read through strided
//! views, never copied); arithmetic is int64 and wraps like numpy's.

use numpy::ndarray::{ArrayView1, ArrayView2};
use numpy::{PyArray1, PyArray2, PyReadonlyArray1, PyReadonlyArray2};
use pyo3::exceptions::{PyMemoryError, PyOverflowError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyInt};

use crate::py_util::{detached, readonly};

/// The slot of padding tokens (the cache write skips it).
pub const PAD_SLOT_ID: i64 = -1;

/// int32 or int64 array elements, read as int64.
pub trait Int: numpy::Element + Copy + Into<i64> + Send + Sync {}
impl Int for i32 {}
impl Int for i64 {}

/// Division by the block size: a shift and a mask for powers of two (the usual
/// sizes), a hardware division otherwise. Only non-negative positions are divided.
#[derive(Clone, Copy, Debug)]
pub struct BlockSize {
    size: u64,
    shift: Option<u32>,
}

impl BlockSize {
    /// `size` >= 1 (validated by the caller).
    pub fn new(size: i64) -> Self {
        let size = size.max(1) as u64;
        let shift = size.is_power_of_two().then(|| size.trailing_zeros());
        BlockSize { size, shift }
    }

    /// (p / size, p % size) for p >= 0.
    #[inline(always)]
    pub fn div_rem(self, p: u64) -> (u64, u64) {
        match self.shift {
            Some(s) => (p >> s, p & (self.size - 1)),
            None => (p / self.size, p % self.size),
        }
    }
}

/// slot = block * block_size + offset, wrapping on overflow like numpy's int64.
#[inline(always)]
pub fn slot(block: i64, block_size: i64, offset: i64) -> i64 {
    block.wrapping_mul(block_size).wrapping_add(offset)
}

/// Why a call fails. Messages are the reference's; variants that need the caller's
/// Python objects (a repr) or another exception class are formatted by the binding.
#[derive(Debug, PartialEq, Eq)]
pub enum Fail {
    Value(String),
    /// num_tokens is not an int >= query_start_loc[-1] (the total).
    NumTokens {
        total: i64,
    },
    /// block_size does not fit in int64 (numpy raises OverflowError there too).
    BlockSizeOverflow,
    /// The output cannot be allocated (`true`: its byte size overflows).
    Memory(bool),
}

fn value(msg: String) -> Fail {
    Fail::Value(msg)
}

/// query_start_loc starts with 0 and never decreases (one entry per request, plus one).
pub fn check_query_start_loc(qsl: &[i64]) -> Result<(), Fail> {
    if qsl.first() != Some(&0) {
        return Err(value(
            "query_start_loc must start with 0 (one entry per request, plus one)".into(),
        ));
    }
    match qsl.windows(2).find(|w| w[1] < w[0]) {
        Some(w) => Err(value(format!(
            "query_start_loc must be non-decreasing, got {} then {}",
            w[0], w[1]
        ))),
        None => Ok(()),
    }
}

/// A vector of `n` copies of `fill`; allocation failure is an error, not an abort.
pub fn filled(n: usize, fill: i64) -> Result<Vec<i64>, Fail> {
    let mut out = Vec::new();
    out.try_reserve_exact(n)
        .map_err(|_| Fail::Memory(n.checked_mul(8).is_none_or(|b| b > isize::MAX as usize)))?;
    out.resize(n, fill);
    Ok(out)
}

/// Positions of the tokens of a validated batch: token t of request r gets
/// `nct(r) + t - qsl[r]`; padding tokens (`t >= qsl[-1]`) keep the 0 of `out`.
pub fn fill_positions(qsl: &[i64], nct: impl Fn(usize) -> i64, out: &mut [i64]) {
    for r in 0..qsl.len().saturating_sub(1) {
        let (start, end) = (qsl[r] as usize, qsl[r + 1] as usize);
        let base = nct(r);
        for (i, o) in out[start..end].iter_mut().enumerate() {
            *o = base.wrapping_add(i as i64);
        }
    }
}

/// Slots of the tokens of a validated batch (`out` prefilled with PAD_SLOT_ID).
///
/// `table(r, c)` reads block_table[r, c] (c < max_blocks). Errors as the reference
/// raises them: the first token with a negative position, else the first whose
/// position needs a block past the table.
pub fn fill_slots(
    qsl: &[i64],
    table: impl Fn(usize, usize) -> i64,
    max_blocks: usize,
    position: impl Fn(usize) -> i64,
    block_size: i64,
    out: &mut [i64],
) -> Result<(), Fail> {
    let div = BlockSize::new(block_size);
    let mut beyond: Option<(usize, i64, u64)> = None;
    for r in 0..qsl.len().saturating_sub(1) {
        let (start, end) = (qsl[r] as usize, qsl[r + 1] as usize);
        for t in start..end {
            let p = position(t);
            if p < 0 {
                return Err(value(format!("positions[{t}] must be >= 0, got {p}")));
            }
            let (col, off) = div.div_rem(p as u64);
            if col >= max_blocks as u64 {
                beyond.get_or_insert((t, p, col));
                continue;
            }
            out[t] = slot(table(r, col as usize), block_size, off as i64);
        }
    }
    match beyond {
        Some((t, p, col)) => Err(value(format!(
            "positions[{t}] = {p} needs block {col}, past the block table's {max_blocks} columns"
        ))),
        None => Ok(()),
    }
}

/// Index of each request's last token: qsl[r + 1] - 1 (every request has a token).
pub fn fill_logits_indices(qsl: &[i64], out: &mut [i64]) -> Result<(), Fail> {
    for (r, o) in out.iter_mut().enumerate() {
        if qsl[r + 1] == qsl[r] {
            return Err(value(format!(
                "request {r} has no scheduled tokens in query_start_loc"
            )));
        }
        *o = qsl[r + 1] - 1;
    }
    Ok(())
}

/// The first of tokens 0..n whose position is negative, as the reference's error.
fn first_negative(n: usize, position: impl Fn(usize) -> i64) -> Result<(), Fail> {
    match (0..n).find(|&t| position(t) < 0) {
        Some(t) => Err(value(format!(
            "positions[{t}] must be >= 0, got {}",
            position(t)
        ))),
        None => Ok(()),
    }
}

// ---------------------------------------------------------------------------------
// Python bindings. The wrappers in `python/pyagent_accel/ops/block_table.py` have
// checked the array types, dtypes and dimensions (and block_size's type and sign), so
// the bindings only pick the dtype, by type checks (see `py_util::readonly`).

enum Int1<'py> {
    I64(PyReadonlyArray1<'py, i64>),
    I32(PyReadonlyArray1<'py, i32>),
}

enum Int2<'py> {
    I64(PyReadonlyArray2<'py, i64>),
    I32(PyReadonlyArray2<'py, i32>),
}

fn not_int(name: &str, ndim: usize) -> PyErr {
    PyTypeError::new_err(format!(
        "{name} must be an int32 or int64 numpy array with {ndim} dimension(s)"
    ))
}

/// A 1-D int32/int64 array, picked by a type check (no exception for the other dtype).
fn int1<'py>(x: &Bound<'py, PyAny>, name: &str) -> PyResult<Int1<'py>> {
    if let Ok(a) = x.cast::<PyArray1<i64>>() {
        return readonly(a, name).map(Int1::I64);
    }
    if let Ok(a) = x.cast::<PyArray1<i32>>() {
        return readonly(a, name).map(Int1::I32);
    }
    Err(not_int(name, 1))
}

fn int2<'py>(x: &Bound<'py, PyAny>, name: &str) -> PyResult<Int2<'py>> {
    if let Ok(a) = x.cast::<PyArray2<i64>>() {
        return readonly(a, name).map(Int2::I64);
    }
    if let Ok(a) = x.cast::<PyArray2<i32>>() {
        return readonly(a, name).map(Int2::I32);
    }
    Err(not_int(name, 2))
}

/// A 1-D int32/int64 array as an int64 view.
#[derive(Clone, Copy)]
enum View1<'a> {
    I64(ArrayView1<'a, i64>),
    I32(ArrayView1<'a, i32>),
}

impl<'py> Int1<'py> {
    fn view(&self) -> View1<'_> {
        match self {
            Int1::I64(a) => View1::I64(a.as_array()),
            Int1::I32(a) => View1::I32(a.as_array()),
        }
    }
}

impl View1<'_> {
    fn len(&self) -> usize {
        match self {
            View1::I64(a) => a.len(),
            View1::I32(a) => a.len(),
        }
    }

    fn to_vec(self) -> Vec<i64> {
        match self {
            View1::I64(a) => a.iter().copied().collect(),
            View1::I32(a) => a.iter().map(|&x| x as i64).collect(),
        }
    }

    fn min(self) -> Option<i64> {
        match self {
            View1::I64(a) => a.iter().copied().min(),
            View1::I32(a) => a.iter().map(|&x| x as i64).min(),
        }
    }
}

fn at<'a, T: Int>(a: &'a ArrayView1<'_, T>) -> impl Fn(usize) -> i64 + 'a {
    move |i| a[i].into()
}

fn at2<'a, T: Int>(a: &'a ArrayView2<'_, T>) -> impl Fn(usize, usize) -> i64 + 'a {
    move |r, c| a[[r, c]].into()
}

fn raise(fail: Fail, num_tokens: Option<&Bound<'_, PyAny>>) -> PyErr {
    match fail {
        Fail::Value(msg) => PyValueError::new_err(msg),
        Fail::NumTokens { total } => {
            let repr = num_tokens
                .and_then(|x| x.repr().ok())
                .map_or_else(|| "?".to_string(), |r| r.to_string());
            PyValueError::new_err(format!(
                "num_tokens must be an int >= query_start_loc[-1] = {total}, got {repr}"
            ))
        }
        Fail::BlockSizeOverflow => {
            PyOverflowError::new_err("Python int too large to convert to C long")
        }
        Fail::Memory(true) => PyValueError::new_err("Maximum allowed size exceeded"),
        Fail::Memory(false) => PyMemoryError::new_err("cannot allocate the int64 result"),
    }
}

/// num_tokens as the reference reads it: Ok(n) for an int (not a bool) that fits in
/// int64, Err(true) for a larger int, Err(false) for anything else or a smaller int.
fn num_tokens_arg(x: &Bound<'_, PyAny>) -> Result<i64, bool> {
    if x.is_instance_of::<PyBool>() || !x.is_instance_of::<PyInt>() {
        return Err(false);
    }
    x.extract::<i64>().map_err(|_| {
        x.gt(0i64).unwrap_or(false) // a huge positive int passes the `>= total` test
    })
}

/// compute_positions(query_start_loc, num_computed_tokens, num_tokens) -> int64 (num_tokens,)
#[pyfunction]
fn compute_positions<'py>(
    py: Python<'py>,
    query_start_loc: &Bound<'py, PyAny>,
    num_computed_tokens: &Bound<'py, PyAny>,
    num_tokens: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyArray1<i64>>> {
    let query_start_loc = int1(query_start_loc, "query_start_loc")?;
    let num_computed_tokens = int1(num_computed_tokens, "num_computed_tokens")?;
    let nt = num_tokens_arg(num_tokens);
    let (qv, nv) = (query_start_loc.view(), num_computed_tokens.view());
    let res = detached(py, || -> Result<Vec<i64>, Fail> {
        let qsl = qv.to_vec();
        check_query_start_loc(&qsl)?;
        let num_reqs = qsl.len() - 1;
        if nv.len() != num_reqs {
            return Err(value(format!(
                "num_computed_tokens must have shape ({num_reqs},), got ({},)",
                nv.len()
            )));
        }
        if let Some(m) = nv.min().filter(|&m| m < 0) {
            return Err(value(format!(
                "num_computed_tokens must be >= 0, got min {m}"
            )));
        }
        let total = qsl[num_reqs];
        let n = match nt {
            Ok(n) if n >= total => n as usize,
            Err(true) => return Err(Fail::Memory(true)),
            _ => return Err(Fail::NumTokens { total }),
        };
        let mut out = filled(n, 0)?;
        match nv {
            View1::I64(a) => fill_positions(&qsl, at(&a), &mut out),
            View1::I32(a) => fill_positions(&qsl, at(&a), &mut out),
        }
        Ok(out)
    })?;
    res.map(|v| PyArray1::from_vec(py, v))
        .map_err(|f| raise(f, Some(num_tokens)))
}

/// compute_slot_mapping(block_table, query_start_loc, positions, block_size) -> int64 (num_tokens,)
#[pyfunction]
fn compute_slot_mapping<'py>(
    py: Python<'py>,
    block_table: &Bound<'py, PyAny>,
    query_start_loc: &Bound<'py, PyAny>,
    positions: &Bound<'py, PyAny>,
    block_size: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyArray1<i64>>> {
    let block_table = int2(block_table, "block_table")?;
    let query_start_loc = int1(query_start_loc, "query_start_loc")?;
    let positions = int1(positions, "positions")?;
    let bs = block_size.extract::<i64>().ok().filter(|&b| b >= 1);
    let (qv, pv) = (query_start_loc.view(), positions.view());
    let res = match &block_table {
        Int2::I64(t) => slot_mapping(py, t.as_array(), qv, pv, bs),
        Int2::I32(t) => slot_mapping(py, t.as_array(), qv, pv, bs),
    }?;
    res.map(|v| PyArray1::from_vec(py, v))
        .map_err(|f| raise(f, None))
}

fn slot_mapping<T: Int>(
    py: Python<'_>,
    table: ArrayView2<'_, T>,
    qv: View1<'_>,
    pv: View1<'_>,
    bs: Option<i64>,
) -> PyResult<Result<Vec<i64>, Fail>> {
    detached(py, || -> Result<Vec<i64>, Fail> {
        let (num_reqs, max_blocks) = table.dim();
        let qsl = qv.to_vec();
        check_query_start_loc(&qsl)?;
        if qsl.len() != num_reqs + 1 {
            return Err(value(format!(
                "query_start_loc must have shape ({},) for {num_reqs} block table rows, got ({},)",
                num_reqs + 1,
                qsl.len()
            )));
        }
        let total = qsl[num_reqs];
        let n = pv.len();
        if (n as i64) < total {
            return Err(value(format!(
                "positions has {n} entries, fewer than the {total} tokens"
            )));
        }
        let Some(block_size) = bs else {
            match pv {
                View1::I64(a) => first_negative(total as usize, at(&a))?,
                View1::I32(a) => first_negative(total as usize, at(&a))?,
            }
            return Err(Fail::BlockSizeOverflow);
        };
        let mut out = filled(n, PAD_SLOT_ID)?;
        match pv {
            View1::I64(a) => {
                fill_slots(&qsl, at2(&table), max_blocks, at(&a), block_size, &mut out)?
            }
            View1::I32(a) => {
                fill_slots(&qsl, at2(&table), max_blocks, at(&a), block_size, &mut out)?
            }
        }
        Ok(out)
    })
}

/// compute_logits_indices(query_start_loc) -> int64 (num_reqs,)
#[pyfunction]
fn compute_logits_indices<'py>(
    py: Python<'py>,
    query_start_loc: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyArray1<i64>>> {
    let query_start_loc = int1(query_start_loc, "query_start_loc")?;
    let qv = query_start_loc.view();
    let res = detached(py, || -> Result<Vec<i64>, Fail> {
        let qsl = qv.to_vec();
        check_query_start_loc(&qsl)?;
        let mut out = filled(qsl.len() - 1, 0)?;
        fill_logits_indices(&qsl, &mut out)?;
        Ok(out)
    })?;
    res.map(|v| PyArray1::from_vec(py, v))
        .map_err(|f| raise(f, None))
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(compute_positions, m)?)?;
    m.add_function(wrap_pyfunction!(compute_slot_mapping, m)?)?;
    m.add_function(wrap_pyfunction!(compute_logits_indices, m)?)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reference formula, written out with checked arithmetic.
    fn naive_slot(row: &[i64], p: i64, bs: i64) -> i64 {
        row[(p / bs) as usize] * bs + p % bs
    }

    fn slots(table: &[Vec<i64>], qsl: &[i64], pos: &[i64], bs: i64) -> Result<Vec<i64>, Fail> {
        check_query_start_loc(qsl)?;
        let max_blocks = table.first().map_or(0, |r| r.len());
        let mut out = filled(pos.len(), PAD_SLOT_ID)?;
        fill_slots(
            qsl,
            |r, c| table[r][c],
            max_blocks,
            |t| pos[t],
            bs,
            &mut out,
        )?;
        Ok(out)
    }

    #[test]
    fn block_size_division_matches_operators() {
        for bs in 1..=40i64 {
            let d = BlockSize::new(bs);
            for p in (0..200u64).chain([u64::MAX >> 1, (1 << 40) + 7]) {
                assert_eq!(
                    d.div_rem(p),
                    (p / bs as u64, p % bs as u64),
                    "p={p} bs={bs}"
                );
            }
        }
    }

    #[test]
    fn slot_formula_example_of_the_tests() {
        // tests/ops/test_block_table.py: three requests, block_size 4, two padding tokens
        let table = vec![vec![3, 7, 0], vec![5, 0, 0], vec![9, 2, 4]];
        let got = slots(&table, &[0, 3, 4, 6], &[2, 3, 4, 9, 0, 1, 0, 0], 4).unwrap();
        assert_eq!(got, vec![14, 15, 28, 1, 36, 37, -1, -1]);
    }

    #[test]
    fn slot_formula_for_every_position_and_block_size() {
        let row: Vec<i64> = (0..12).map(|i| (i * 37 + 5) % 101).collect();
        for bs in 1..=16i64 {
            let table = vec![row.clone()];
            let n = row.len() as i64 * bs;
            let pos: Vec<i64> = (0..n).rev().collect();
            let got = slots(&table, &[0, n], &pos, bs).unwrap();
            for (t, &p) in pos.iter().enumerate() {
                let s = got[t];
                assert_eq!(s, naive_slot(&row, p, bs));
                assert_eq!(
                    s.div_euclid(bs),
                    row[(p / bs) as usize],
                    "block of slot {s}"
                );
                assert_eq!(s % bs, p % bs, "offset of slot {s}");
            }
        }
    }

    #[test]
    fn slot_wraps_like_numpy_int64() {
        assert_eq!(slot(i64::MAX, 2, 1), i64::MAX.wrapping_mul(2) + 1);
        assert_eq!(slot(-5, 4, 3), -17);
    }

    #[test]
    fn padding_gets_pad_slot_and_padding_positions_are_ignored() {
        let table = vec![vec![1, 2]];
        let got = slots(&table, &[0, 2], &[0, 5, -7, 1 << 40], 4).unwrap();
        assert_eq!(got, vec![4, 9, PAD_SLOT_ID, PAD_SLOT_ID]);
        let empty: Vec<Vec<i64>> = vec![];
        assert_eq!(slots(&empty, &[0], &[3, 3], 16).unwrap(), vec![-1, -1]);
        // rows without columns: nothing to look up when every token is padding
        let bare = vec![vec![], vec![]];
        assert_eq!(slots(&bare, &[0, 0, 0], &[0], 4).unwrap(), vec![-1]);
    }

    #[test]
    fn slot_errors_name_the_token_like_the_reference() {
        let table = vec![vec![1, 2, 3]];
        assert_eq!(
            slots(&table, &[0, 1], &[12], 4),
            Err(Fail::Value(
                "positions[0] = 12 needs block 3, past the block table's 3 columns".into()
            ))
        );
        // a negative position wins over an earlier position past the table
        assert_eq!(
            slots(&table, &[0, 3], &[99, 0, -2], 4),
            Err(Fail::Value("positions[2] must be >= 0, got -2".into()))
        );
        assert_eq!(
            slots(&table, &[1, 2], &[0, 0], 4),
            Err(Fail::Value(
                "query_start_loc must start with 0 (one entry per request, plus one)".into()
            ))
        );
        assert_eq!(
            check_query_start_loc(&[0, 3, 2]),
            Err(Fail::Value(
                "query_start_loc must be non-decreasing, got 3 then 2".into()
            ))
        );
        assert!(check_query_start_loc(&[]).is_err());
    }

    #[test]
    fn positions_continue_after_computed_tokens() {
        let nct = [2i64, 9, 0];
        let mut out = filled(8, 0).unwrap();
        fill_positions(&[0, 3, 4, 6], |r| nct[r], &mut out);
        assert_eq!(out, vec![2, 3, 4, 9, 0, 1, 0, 0]);
        let mut wrap = filled(2, 0).unwrap();
        fill_positions(&[0, 2], |_| i64::MAX, &mut wrap);
        assert_eq!(wrap, vec![i64::MAX, i64::MIN]);
    }

    #[test]
    fn logits_indices_are_last_tokens() {
        let mut out = filled(3, 0).unwrap();
        fill_logits_indices(&[0, 3, 4, 6], &mut out).unwrap();
        assert_eq!(out, vec![2, 3, 5]);
        let mut out = filled(2, 0).unwrap();
        assert_eq!(
            fill_logits_indices(&[0, 2, 2], &mut out),
            Err(Fail::Value(
                "request 1 has no scheduled tokens in query_start_loc".into()
            ))
        );
    }

    #[test]
    fn huge_outputs_are_errors_not_aborts() {
        assert_eq!(filled(usize::MAX, 0), Err(Fail::Memory(true)));
    }
}
