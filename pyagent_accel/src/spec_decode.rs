//! Kernels of `pyagent_accel.ops.spec_decode` (verifying draft tokens) and their Python
//! bindings (contract: `pyagent_ref.ops.spec_decode`, whose module docstring gives the
//! flattened layout and the uniforms). Proposing drafts by prompt lookup is `ngram`.
//!
//! A batch is verified request by request (requests in parallel for large batches, the
//! GIL released). Request b owns the k_b + 1 target rows starting at flat row
//! start_b + b and the k_b drafts (and q rows) starting at start_b; it emits its
//! leading accepted drafts, then one token of its own, into its row of the result.
//!
//! Exactness: `verify_greedy`, greedy requests and the bonus token (a race over the
//! logits, `sampling::kernels::sample_row`) give the reference's tokens exactly. The
//! acceptance test u * q(x) < p(x) and the race over the residual max(p - q, 0) go
//! through p = softmax(row) in float64, whose exp differs from numpy's and torch's in
//! the last bit: only decisions within the contract's 1e-9 relative band may differ.

use std::borrow::Cow;

use numpy::ndarray::Axis;
use numpy::{
    PyArray1, PyArray2, PyArrayMethods, PyReadonlyArray1, PyReadonlyArray2, PyUntypedArrayMethods,
};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use rayon::prelude::*;

use crate::float::{exp_f64, multiversion, Float};
use crate::philox;
use crate::py_util::{detached, readonly, slice, value_error};
use crate::sampling::kernels::{exponential_race, log2_chord, sample_row, RACE_CHUNK};
use crate::sampling::row_scan::{first_index_of, pairwise_sum, scan_row, RowStatus};
use crate::sampling::{dispatch, extract_logits, raise_rows, sequential, Logits};

/// How a request chooses its tokens.
#[derive(Clone, Copy, Debug)]
pub enum Mode {
    /// Accept drafts while they are the target's argmax (temperature 0).
    Greedy,
    /// Rejection sampling on the uniforms of (seed, position + i) for target row i.
    Random { seed: i64, position: i64 },
}

/// One request of the batch: its k + 1 target rows, its k drafts (each in [0, vocab))
/// and, unless the drafts are deterministic, the k distributions q they were drawn from.
pub struct Request<'a, T, Q> {
    pub rows: &'a [&'a [T]],
    pub drafts: &'a [i64],
    pub probs: Option<&'a [&'a [Q]]>,
    pub mode: Mode,
}

#[inline(always)]
fn softmax_terms_impl<T: Float>(row: &[T], max: T, e: &mut [f64]) -> f64 {
    let max = max.to_f64();
    for (e, &x) in e.iter_mut().zip(row) {
        *e = exp_f64(x.to_f64() - max);
    }
    pairwise_sum(e)
}

multiversion! {
    /// e[j] = exp(row[j] - max) in float64 (`e` as long as `row`); returns their sum in
    /// numpy's pairwise order, so that p = e / sum is the reference's softmax.
    pub fn softmax_terms<T>(row: &[T], max: T, e: &mut [f64]) -> f64 = softmax_terms_impl;
}

#[inline(always)]
fn residual_race_impl<Q: Float>(
    e: &mut [f64],
    sum: f64,
    q: Option<&[Q]>,
    draft: usize,
    seed: i64,
    position: i64,
) -> Option<usize> {
    // r = max(p - q, 0), p = e / sum, into `e`; q = None is one-hot(draft)
    let mut positive = 0u8;
    match q {
        Some(q) => {
            for (r, &qj) in e.iter_mut().zip(q) {
                *r = (*r / sum - qj.to_f64()).max(0.0);
                positive |= (*r > 0.0) as u8;
            }
        }
        None => {
            for r in e.iter_mut() {
                *r /= sum;
                positive |= (*r > 0.0) as u8;
            }
            e[draft] = (e[draft] - 1.0).max(0.0);
        }
    }
    if positive == 0 {
        return None;
    }
    let r: &[f64] = e;
    // ln r <= (log2_chord(r) + 0.0861) ln 2: the chord is at most 0.0861 below log2
    let bounds = |base: usize, out: &mut [f64; RACE_CHUNK]| {
        for (o, &rj) in out.iter_mut().zip(&r[base..]) {
            let bound = (log2_chord(rj) + 0.0861) * std::f64::consts::LN_2;
            *o = if rj > 0.0 { bound } else { f64::NEG_INFINITY };
        }
    };
    let log_r = |j: usize| {
        if r[j] > 0.0 {
            r[j].ln()
        } else {
            f64::NEG_INFINITY
        }
    };
    exponential_race(seed, position, r.len(), bounds, log_r)
}

multiversion! {
    /// The token drawn after a rejected draft: the exponential race over the residual
    /// r = max(e / sum - q, 0) (q = one-hot(draft) when None) on the uniforms of
    /// (seed, position), log r computed with libm; None when r is all zero. `e` (the
    /// softmax terms of `softmax_terms`) is overwritten with r.
    pub fn residual_race<Q>(e: &mut [f64], sum: f64, q: Option<&[Q]>, draft: usize, seed: i64, position: i64) -> Option<usize> = residual_race_impl;
}

/// Verify one request (module docstring of the reference):
///
/// - every target row is checked first (`statuses[i]` for row i, as
///   `check_logits`); if one fails, nothing is written;
/// - Greedy: drafts are accepted while draft_i == argmax(row i) (the lowest index on
///   ties); the token after them is the argmax of the first row not accepted;
/// - Random: with p_i = softmax(row i) and q_i = probs[i] (one-hot(draft_i) when None),
///   draft x = draft_i is accepted iff u * q_i[x] < p_i[x] for u uniform `vocab` of
///   (seed, position + i); the first rejected draft is replaced by the race over
///   max(p_i - q_i, 0) (`residual_race`), or over the logits if that is all zero; with
///   every draft accepted, the bonus token is the race over the logits of row k, which
///   is `sample`'s draw at position + k.
///
/// Writes the a + 1 emitted tokens to out[..a + 1] and leaves the rest of `out` (at
/// least k + 1 long) as it is. `scratch` holds the softmax terms of a row.
pub fn verify<T: Float, Q: Float>(
    request: &Request<'_, T, Q>,
    statuses: &mut [RowStatus],
    out: &mut [i64],
    scratch: &mut Vec<f64>,
) {
    let rows = request.rows;
    let mut maxes = Vec::with_capacity(rows.len());
    for (status, row) in statuses.iter_mut().zip(rows) {
        let (row_status, max) = scan_row(row);
        *status = row_status;
        maxes.push(max);
    }
    if statuses.iter().any(|s| *s != RowStatus::Ok) {
        return;
    }
    let k = request.drafts.len();
    for (i, (row, &max)) in rows.iter().zip(&maxes).enumerate() {
        let draft = request.drafts.get(i).map(|&x| x as usize);
        let (accepted, own) = match request.mode {
            Mode::Greedy => {
                let target = first_index_of(row, max);
                (draft == Some(target), target as i64)
            }
            Mode::Random { seed, position } => {
                let at = position + i as i64;
                // the race over the logits: the bonus token, or a fallback after a rejection
                let from_logits = || sample_row(row, 1.0, seed, at).unwrap_or(0);
                let Some(x) = draft else {
                    out[i] = from_logits();
                    return;
                };
                scratch.resize(row.len(), 0.0);
                let sum = softmax_terms(row, max, scratch);
                let q = request.probs.map(|probs| probs[i]);
                let qx = q.map_or(1.0, |q| q[x].to_f64());
                let u = philox::uniform_at(seed, at, row.len() as u64);
                if u * qx < scratch[x] / sum {
                    (true, x as i64)
                } else {
                    let drawn = residual_race(scratch, sum, q, x, seed, at);
                    (false, drawn.map_or_else(from_logits, |y| y as i64))
                }
            }
        };
        out[i] = own;
        if !accepted || i == k {
            return;
        }
    }
}

/// One request's draft tree (the reference's tree layout): node 0 is the root, node
/// i + 1 is draft i, whose parent is node parents[i] (in [0, i]); rows[v] is node v's
/// target row.
pub struct TreeRequest<'a, T> {
    pub rows: &'a [&'a [T]],
    pub drafts: &'a [i64],
    pub parents: &'a [i64],
    pub mode: Mode,
}

/// Verify one draft tree (contract: `verify_tree_greedy` and `rejection_sample_tree`):
///
/// - every target row is checked first, as in `verify`; if one fails, nothing is written;
/// - from the root, at node v and depth d: Greedy emits t = argmax(row v) and moves to
///   the first child holding t; Random tries v's children in node order, child j (token
///   x) accepted iff u * max(m, 0) < r[x] for u uniform `vocab + j` of (seed,
///   position + d), where r = softmax(row v) with the rejected tokens zeroed and m = 1
///   minus their mass; all rejected, it emits the race over r (`residual_race`), or over
///   the logits when r is all zero or v has no children (the bonus token), and stops.
///
/// Writes the emitted tokens to out[..depth + 1]. `scratch` holds the softmax terms.
pub fn verify_tree<T: Float>(
    request: &TreeRequest<'_, T>,
    statuses: &mut [RowStatus],
    out: &mut [i64],
    scratch: &mut Vec<f64>,
) {
    let rows = request.rows;
    let mut maxes = Vec::with_capacity(rows.len());
    for (status, row) in statuses.iter_mut().zip(rows) {
        let (row_status, max) = scan_row(row);
        *status = row_status;
        maxes.push(max);
    }
    if statuses.iter().any(|s| *s != RowStatus::Ok) {
        return;
    }
    let mut children = vec![Vec::new(); rows.len()];
    for (i, &parent) in request.parents.iter().enumerate() {
        children[parent as usize].push(i + 1);
    }
    let token = |node: usize| request.drafts[node - 1] as usize;
    let (mut node, mut depth) = (0usize, 0usize);
    loop {
        let (row, max) = (rows[node], maxes[node]);
        let next = match request.mode {
            Mode::Greedy => {
                let target = first_index_of(row, max);
                out[depth] = target as i64;
                children[node].iter().copied().find(|&c| token(c) == target)
            }
            Mode::Random { seed, position } => {
                let at = position + depth as i64;
                let from_logits = || sample_row(row, 1.0, seed, at).unwrap_or(0);
                if children[node].is_empty() {
                    out[depth] = from_logits();
                    return;
                }
                scratch.resize(row.len(), 0.0);
                let sum = softmax_terms(row, max, scratch);
                // r = scratch / sum, the rejected tokens zeroed in `scratch`; m its mass
                let mut mass = 1.0f64;
                let mut accepted = None;
                for (j, &child) in children[node].iter().enumerate() {
                    let x = token(child);
                    let r_x = scratch[x] / sum;
                    let u = philox::uniform_at(seed, at, (row.len() + j) as u64);
                    if u * mass.max(0.0) < r_x {
                        accepted = Some(child);
                        break;
                    }
                    mass -= r_x;
                    scratch[x] = 0.0;
                }
                match accepted {
                    Some(child) => out[depth] = token(child) as i64,
                    None => {
                        // every child rejected and zeroed: one-hot q of any of them adds nothing
                        let last = token(*children[node].last().unwrap_or(&0));
                        let drawn = residual_race::<f64>(scratch, sum, None, last, seed, at);
                        out[depth] = drawn.map_or_else(from_logits, |y| y as i64);
                    }
                }
                accepted
            }
        };
        match next {
            Some(child) => (node, depth) = (child, depth + 1),
            None => return,
        }
    }
}

/// The ancestor-or-self mask of one tree (`tree_attention_mask`), row-major
/// (k + 1) x (k + 1): row i + 1 is row parents[i] with column i + 1 set.
pub fn ancestor_mask(parents: &[i64]) -> Vec<bool> {
    let n = parents.len() + 1;
    let mut mask = vec![false; n * n];
    mask[0] = true;
    for (i, &parent) in parents.iter().enumerate() {
        let (done, rest) = mask.split_at_mut((i + 1) * n);
        let from = parent as usize * n;
        rest[..n].copy_from_slice(&done[from..from + n]);
        rest[i + 1] = true;
    }
    mask
}

// ---------------------------------------------------------------------------------
// Python bindings. The wrappers in `python/pyagent_accel/ops/spec_decode.py` have made
// the reference's checks, in its order and with its messages; these check again what
// the kernels rely on (shapes, counts, ids in the vocab), so that no input reachable
// from Python panics, and raise the reference's error for a bad target row.

/// The rows of a 2-D array as slices: borrowed where a row is contiguous (any row
/// stride: padded rows), copied where it is not (every other column, column-major).
fn rows_of<'a, T: Float>(
    array: &'a PyReadonlyArray2<'_, T>,
    name: &str,
) -> PyResult<Vec<Cow<'a, [T]>>> {
    if !array.is_aligned() {
        return Err(value_error(format!(
            "{name} is not aligned in memory; pass a copy (np.array(x)) instead"
        )));
    }
    let view = array.as_array();
    Ok((0..view.nrows())
        .map(|i| {
            let row = view.index_axis_move(Axis(0), i);
            match row.to_slice() {
                Some(slice) => Cow::Borrowed(slice),
                None => Cow::Owned(row.to_vec()),
            }
        })
        .collect())
}

/// The flattened layout, checked: per request its number of drafts and its first draft.
struct Layout {
    counts: Vec<usize>,
    starts: Vec<usize>,
    /// 1 + max k: the width of the result.
    width: usize,
}

fn layout(counts: &[i64], drafts: &[i64], rows: usize, vocab: usize) -> PyResult<Layout> {
    if let Some(&k) = counts.iter().find(|&&k| k < 0) {
        return Err(value_error(format!(
            "num_draft_tokens must be >= 0, got {k}"
        )));
    }
    let counts: Vec<usize> = counts.iter().map(|&k| k as usize).collect();
    let mut starts = Vec::with_capacity(counts.len());
    let mut total = 0usize;
    for &k in &counts {
        starts.push(total);
        total = total.saturating_add(k);
    }
    if drafts.len() != total || rows != total.saturating_add(counts.len()) {
        return Err(value_error(format!(
            "the layout needs {total} draft ids and {} target rows, got {} and {rows}",
            total.saturating_add(counts.len()),
            drafts.len()
        )));
    }
    if let Some(&x) = drafts.iter().find(|&&x| x < 0 || x as u64 >= vocab as u64) {
        return Err(value_error(format!(
            "draft ids must be in [0, {vocab}), got {x}"
        )));
    }
    let width = 1 + counts.iter().copied().max().unwrap_or(0);
    Ok(Layout {
        counts,
        starts,
        width,
    })
}

/// Run `run(b, out, statuses, scratch)` for every request b, where request b owns the
/// next `row_counts[b]` target rows (`statuses` are theirs) and writes its tokens into
/// `out`, its row of a new (batch, width) int64 array padded with -1; requests run in
/// parallel for large batches, the GIL released. The reference's ValueError for the
/// first bad target row.
fn run_requests<'py, F>(
    py: Python<'py>,
    row_counts: &[usize],
    vocab: usize,
    width: usize,
    run: F,
) -> PyResult<Bound<'py, PyArray2<i64>>>
where
    F: Fn(usize, &mut [i64], &mut [RowStatus], &mut Vec<f64>) + Sync,
{
    let batch = row_counts.len();
    let total_rows: usize = row_counts.iter().sum();
    let mut out = vec![-1i64; batch * width];
    let mut statuses = vec![RowStatus::Ok; total_rows];
    detached(py, || {
        // each request's rows of `statuses`, in order
        let mut rest = statuses.as_mut_slice();
        let mut status_parts = Vec::with_capacity(batch);
        for &n in row_counts {
            let (part, tail) = rest.split_at_mut(n);
            status_parts.push(part);
            rest = tail;
        }
        if sequential(batch, total_rows / batch.max(1) * vocab) {
            let mut scratch = Vec::new();
            for (b, (out, statuses)) in out.chunks_mut(width).zip(&mut status_parts).enumerate() {
                run(b, out, statuses, &mut scratch);
            }
        } else {
            out.par_chunks_mut(width)
                .zip(status_parts.par_iter_mut())
                .enumerate()
                .for_each_init(Vec::new, |scratch, (b, (out, statuses))| {
                    run(b, out, statuses, scratch)
                });
        }
    })?;
    raise_rows(&statuses, "target_logits")?;
    PyArray1::from_vec(py, out).reshape([batch, width])
}

/// Verify every request of the layout (`mode(b)` says how request b is verified) into
/// a new (batch, width) int64 array padded with -1.
fn verify_batch<'py, T: Float, Q: Float>(
    py: Python<'py>,
    logits: &PyReadonlyArray2<'py, T>,
    drafts: &[i64],
    probs: Option<&PyReadonlyArray2<'py, Q>>,
    layout: &Layout,
    mode: impl Fn(usize) -> Mode + Sync,
) -> PyResult<Bound<'py, PyArray2<i64>>> {
    let vocab = logits.as_array().ncols();
    let row_data = rows_of(logits, "target_logits")?;
    let rows: Vec<&[T]> = row_data.iter().map(|r| r.as_ref()).collect();
    let prob_data = probs.map(|q| rows_of(q, "draft_probs")).transpose()?;
    let prob_rows: Option<Vec<&[Q]>> = prob_data
        .as_ref()
        .map(|data| data.iter().map(|r| r.as_ref()).collect());
    if let Some(prob_rows) = &prob_rows {
        if prob_rows.len() != drafts.len() || prob_rows.iter().any(|r| r.len() != vocab) {
            return Err(value_error("draft_probs must have shape (drafts, vocab)"));
        }
    }
    let row_counts: Vec<usize> = layout.counts.iter().map(|&k| k + 1).collect();
    run_requests(
        py,
        &row_counts,
        vocab,
        layout.width,
        |b, out, statuses, e| {
            let (k, start) = (layout.counts[b], layout.starts[b]);
            let request = Request {
                rows: &rows[start + b..start + b + k + 1],
                drafts: &drafts[start..start + k],
                probs: prob_rows.as_ref().map(|p| &p[start..start + k]),
                mode: mode(b),
            };
            verify(&request, statuses, out, e);
        },
    )
}

/// The tree layout on top of the flat one: `parents` as long as the drafts, draft i of
/// each request with a parent in [0, i]; the width becomes 1 + the largest depth.
fn tree_layout(
    counts: &[i64],
    drafts: &[i64],
    parents: &[i64],
    rows: usize,
    vocab: usize,
) -> PyResult<Layout> {
    let mut layout = layout(counts, drafts, rows, vocab)?;
    if parents.len() != drafts.len() {
        return Err(value_error(format!(
            "draft_parents must have shape ({},), got ({},)",
            drafts.len(),
            parents.len()
        )));
    }
    let mut deepest = 0;
    for (&k, &start) in layout.counts.iter().zip(&layout.starts) {
        let mut depth = vec![0usize; k + 1];
        for (i, &parent) in parents[start..start + k].iter().enumerate() {
            if parent < 0 || parent as u64 > i as u64 {
                return Err(value_error(format!(
                    "draft_parents[{}] must be in [0, {i}], got {parent}",
                    start + i
                )));
            }
            depth[i + 1] = depth[parent as usize] + 1;
            deepest = deepest.max(depth[i + 1]);
        }
    }
    layout.width = 1 + deepest;
    Ok(layout)
}

/// Verify every tree of the layout (`mode(b)` says how request b is verified).
fn verify_tree_batch<'py, T: Float>(
    py: Python<'py>,
    logits: &PyReadonlyArray2<'py, T>,
    drafts: &[i64],
    parents: &[i64],
    layout: &Layout,
    mode: impl Fn(usize) -> Mode + Sync,
) -> PyResult<Bound<'py, PyArray2<i64>>> {
    let vocab = logits.as_array().ncols();
    let row_data = rows_of(logits, "target_logits")?;
    let rows: Vec<&[T]> = row_data.iter().map(|r| r.as_ref()).collect();
    let row_counts: Vec<usize> = layout.counts.iter().map(|&k| k + 1).collect();
    run_requests(
        py,
        &row_counts,
        vocab,
        layout.width,
        |b, out, statuses, e| {
            let (k, start) = (layout.counts[b], layout.starts[b]);
            let request = TreeRequest {
                rows: &rows[start + b..start + b + k + 1],
                drafts: &drafts[start..start + k],
                parents: &parents[start..start + k],
                mode: mode(b),
            };
            verify_tree(&request, statuses, out, e);
        },
    )
}

/// verify_greedy(target_logits, draft_token_ids, num_draft_tokens)
/// --
///
/// Greedy verification: accept drafts while they are the target's argmax. float32 or
/// float64 `target_logits` (N + batch, vocab) of any strides, int64 `draft_token_ids`
/// (N,) and `num_draft_tokens` (batch,): a new int64 array (batch, 1 + max k) of each
/// request's tokens, then -1.
#[pyfunction]
fn verify_greedy<'py>(
    py: Python<'py>,
    target_logits: &Bound<'py, PyAny>,
    draft_token_ids: PyReadonlyArray1<'py, i64>,
    num_draft_tokens: PyReadonlyArray1<'py, i64>,
) -> PyResult<Bound<'py, PyArray2<i64>>> {
    let drafts = slice(&draft_token_ids, "draft_token_ids")?;
    let counts = slice(&num_draft_tokens, "num_draft_tokens")?;
    dispatch!(target_logits, "target_logits", |x: T| {
        let (rows, vocab) = x.as_array().dim();
        let layout = layout(counts, drafts, rows, vocab)?;
        verify_batch::<T, T>(py, &x, drafts, None, &layout, |_| Mode::Greedy)
    })
}

/// The per-request arguments of `rejection_sample` after the layout.
struct Scalars<'a> {
    temperature: &'a [f64],
    seeds: &'a [i64],
    positions: &'a [i64],
}

impl Scalars<'_> {
    /// Request b's mode; the positions were checked to leave room for its k + 1 tokens.
    fn mode(&self, b: usize) -> Mode {
        if self.temperature[b] == 0.0 {
            Mode::Greedy
        } else {
            Mode::Random {
                seed: self.seeds[b],
                position: self.positions[b],
            }
        }
    }

    fn check(&self, layout: &Layout) -> PyResult<()> {
        let batch = layout.counts.len();
        for (name, len) in [
            ("temperature", self.temperature.len()),
            ("seeds", self.seeds.len()),
            ("positions", self.positions.len()),
        ] {
            if len != batch {
                return Err(value_error(format!(
                    "{name} must have shape ({batch},), got ({len},)"
                )));
            }
        }
        for (&position, &k) in self.positions.iter().zip(&layout.counts) {
            if position < 0 || (position as u64).saturating_add(k as u64) > i64::MAX as u64 {
                return Err(value_error(format!(
                    "positions must be in [0, 2**63 - 1 - k], got {position}"
                )));
            }
        }
        Ok(())
    }
}

/// `rejection_sample` for target logits of `T` and draft probabilities of `Q`.
fn rejection_typed<'py, T: Float, Q: Float>(
    py: Python<'py>,
    x: &PyReadonlyArray2<'py, T>,
    drafts: &[i64],
    counts: &[i64],
    probs: Option<&PyReadonlyArray2<'py, Q>>,
    scalars: &Scalars<'_>,
) -> PyResult<Bound<'py, PyArray2<i64>>> {
    let (rows, vocab) = x.as_array().dim();
    let layout = layout(counts, drafts, rows, vocab)?;
    scalars.check(&layout)?;
    verify_batch(py, x, drafts, probs, &layout, |b| scalars.mode(b))
}

/// rejection_sample(target_logits, draft_token_ids, num_draft_tokens, draft_probs,
/// temperature, seeds, positions)
/// --
///
/// Verify drafts so that the emitted tokens are distributed exactly as the target's:
/// `verify_greedy`'s arguments, `draft_probs` None or float32/float64 (N, vocab) of
/// any strides, float64 `temperature` and int64 `seeds` and `positions` (batch,).
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn rejection_sample<'py>(
    py: Python<'py>,
    target_logits: &Bound<'py, PyAny>,
    draft_token_ids: PyReadonlyArray1<'py, i64>,
    num_draft_tokens: PyReadonlyArray1<'py, i64>,
    draft_probs: Option<&Bound<'py, PyAny>>,
    temperature: PyReadonlyArray1<'py, f64>,
    seeds: PyReadonlyArray1<'py, i64>,
    positions: PyReadonlyArray1<'py, i64>,
) -> PyResult<Bound<'py, PyArray2<i64>>> {
    let drafts = slice(&draft_token_ids, "draft_token_ids")?;
    let counts = slice(&num_draft_tokens, "num_draft_tokens")?;
    let scalars = Scalars {
        temperature: slice(&temperature, "temperature")?,
        seeds: slice(&seeds, "seeds")?,
        positions: slice(&positions, "positions")?,
    };
    let probs = match draft_probs {
        None => None,
        Some(q) => Some(extract_probs(q)?),
    };
    dispatch!(target_logits, "target_logits", |x: T| match &probs {
        None => rejection_typed::<T, f64>(py, &x, drafts, counts, None, &scalars),
        Some(Probs::F32(q)) => rejection_typed(py, &x, drafts, counts, Some(q), &scalars),
        Some(Probs::F64(q)) => rejection_typed(py, &x, drafts, counts, Some(q), &scalars),
    })
}

/// verify_tree_greedy(target_logits, draft_token_ids, num_draft_tokens, draft_parents)
/// --
///
/// Greedy verification of a draft tree: `verify_greedy`'s arguments and int64
/// `draft_parents` (N,); a new int64 array (batch, 1 + max depth) of each request's
/// tokens, then -1.
#[pyfunction]
fn verify_tree_greedy<'py>(
    py: Python<'py>,
    target_logits: &Bound<'py, PyAny>,
    draft_token_ids: PyReadonlyArray1<'py, i64>,
    num_draft_tokens: PyReadonlyArray1<'py, i64>,
    draft_parents: PyReadonlyArray1<'py, i64>,
) -> PyResult<Bound<'py, PyArray2<i64>>> {
    let drafts = slice(&draft_token_ids, "draft_token_ids")?;
    let counts = slice(&num_draft_tokens, "num_draft_tokens")?;
    let parents = slice(&draft_parents, "draft_parents")?;
    dispatch!(target_logits, "target_logits", |x: T| {
        let (rows, vocab) = x.as_array().dim();
        let layout = tree_layout(counts, drafts, parents, rows, vocab)?;
        verify_tree_batch::<T>(py, &x, drafts, parents, &layout, |_| Mode::Greedy)
    })
}

/// rejection_sample_tree(target_logits, draft_token_ids, num_draft_tokens,
/// draft_parents, temperature, seeds, positions)
/// --
///
/// Verify a tree of deterministic drafts so that the emitted tokens are distributed
/// exactly as the target's: `verify_tree_greedy`'s arguments, float64 `temperature`
/// and int64 `seeds` and `positions` (batch,).
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn rejection_sample_tree<'py>(
    py: Python<'py>,
    target_logits: &Bound<'py, PyAny>,
    draft_token_ids: PyReadonlyArray1<'py, i64>,
    num_draft_tokens: PyReadonlyArray1<'py, i64>,
    draft_parents: PyReadonlyArray1<'py, i64>,
    temperature: PyReadonlyArray1<'py, f64>,
    seeds: PyReadonlyArray1<'py, i64>,
    positions: PyReadonlyArray1<'py, i64>,
) -> PyResult<Bound<'py, PyArray2<i64>>> {
    let drafts = slice(&draft_token_ids, "draft_token_ids")?;
    let counts = slice(&num_draft_tokens, "num_draft_tokens")?;
    let parents = slice(&draft_parents, "draft_parents")?;
    let scalars = Scalars {
        temperature: slice(&temperature, "temperature")?,
        seeds: slice(&seeds, "seeds")?,
        positions: slice(&positions, "positions")?,
    };
    dispatch!(target_logits, "target_logits", |x: T| {
        let (rows, vocab) = x.as_array().dim();
        let layout = tree_layout(counts, drafts, parents, rows, vocab)?;
        scalars.check(&layout)?;
        verify_tree_batch::<T>(py, &x, drafts, parents, &layout, |b| scalars.mode(b))
    })
}

/// tree_attention_mask(draft_parents)
/// --
///
/// Which nodes of a draft tree each node attends to: int64 `draft_parents` (k,), each
/// in [0, i]; a new bool array (k + 1, k + 1), True where node j is node i or one of
/// its ancestors.
#[pyfunction]
fn tree_attention_mask<'py>(
    py: Python<'py>,
    draft_parents: PyReadonlyArray1<'py, i64>,
) -> PyResult<Bound<'py, PyArray2<bool>>> {
    let parents = slice(&draft_parents, "draft_parents")?;
    if let Some((i, &parent)) = parents
        .iter()
        .enumerate()
        .find(|&(i, &parent)| parent < 0 || parent as u64 > i as u64)
    {
        return Err(value_error(format!(
            "draft_parents[{i}] must be in [0, {i}], got {parent}"
        )));
    }
    let n = parents.len() + 1;
    PyArray1::from_vec(py, ancestor_mask(parents)).reshape([n, n])
}

/// draft_probs as f32 or f64.
enum Probs<'py> {
    F32(PyReadonlyArray2<'py, f32>),
    F64(PyReadonlyArray2<'py, f64>),
}

fn extract_probs<'py>(q: &Bound<'py, PyAny>) -> PyResult<Probs<'py>> {
    if let Ok(array) = q.cast::<PyArray2<f32>>() {
        return readonly(array, "draft_probs").map(Probs::F32);
    }
    if let Ok(array) = q.cast::<PyArray2<f64>>() {
        return readonly(array, "draft_probs").map(Probs::F64);
    }
    Err(PyTypeError::new_err(
        "draft_probs must be None or a float32 or float64 numpy array of shape (drafts, vocab)",
    ))
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(verify_greedy, m)?)?;
    m.add_function(wrap_pyfunction!(rejection_sample, m)?)?;
    m.add_function(wrap_pyfunction!(tree_attention_mask, m)?)?;
    m.add_function(wrap_pyfunction!(verify_tree_greedy, m)?)?;
    m.add_function(wrap_pyfunction!(rejection_sample_tree, m)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A row of `vocab` logits from an LCG, a few of them -inf (never the first).
    fn row(vocab: usize, seed: u64) -> Vec<f64> {
        let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..vocab)
            .map(|j| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let v = ((s >> 11) as f64) / (1u64 << 53) as f64;
                if j > 0 && v < 0.05 {
                    f64::NEG_INFINITY
                } else {
                    6.0 * v - 3.0
                }
            })
            .collect()
    }

    fn run<Q: Float>(
        rows: &[Vec<f64>],
        drafts: &[i64],
        probs: Option<&[&[Q]]>,
        mode: Mode,
    ) -> Vec<i64> {
        let rows: Vec<&[f64]> = rows.iter().map(|r| r.as_slice()).collect();
        let request = Request {
            rows: &rows,
            drafts,
            probs,
            mode,
        };
        let mut statuses = vec![RowStatus::Ok; rows.len()];
        let mut out = vec![-1; rows.len()];
        verify(&request, &mut statuses, &mut out, &mut Vec::new());
        out
    }

    fn argmax(row: &[f64]) -> i64 {
        let max = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        row.iter().position(|&x| x == max).unwrap() as i64
    }

    #[test]
    fn greedy_accepts_the_argmax_chain() {
        let rows: Vec<Vec<f64>> = (0..4).map(|i| row(50, i)).collect();
        let t: Vec<i64> = rows.iter().map(|r| argmax(r)).collect();
        let all = run::<f64>(&rows, &t[..3], None, Mode::Greedy);
        assert_eq!(all, t);
        let second_wrong = [t[0], (t[1] + 1) % 50, t[2]];
        assert_eq!(
            run::<f64>(&rows, &second_wrong, None, Mode::Greedy),
            [t[0], t[1], -1, -1]
        );
    }

    #[test]
    fn without_drafts_it_is_sample() {
        for seed in 0..20 {
            let rows = vec![row(300, seed)];
            let mode = Mode::Random {
                seed: seed as i64 - 7,
                position: 1 << 33,
            };
            let want = sample_row(&rows[0], 1.0, seed as i64 - 7, 1 << 33).unwrap();
            assert_eq!(run::<f64>(&rows, &[], None, mode), [want]);
        }
    }

    /// The residual race scoring every token exactly, in float64 as the contract states.
    fn brute_residual(row: &[f64], q: &[f64], seed: i64, position: i64) -> Option<usize> {
        let max = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = row.iter().map(|&x| (x - max).exp()).collect();
        let sum: f64 = e.iter().sum();
        let mut u = vec![0.0; row.len()];
        philox::fill_uniforms(seed, position, &mut u);
        let scores = e.iter().zip(q).zip(&u).map(|((&e, &q), &u)| {
            let r = (e / sum - q).max(0.0);
            if r > 0.0 {
                r.ln() - (-(u.ln())).ln()
            } else {
                f64::NEG_INFINITY
            }
        });
        let (mut best, mut winner) = (f64::NEG_INFINITY, None);
        for (j, s) in scores.enumerate() {
            if s > best {
                (best, winner) = (s, Some(j));
            }
        }
        winner
    }

    #[test]
    fn residual_race_scores_like_brute_force() {
        for seed in 0..40u64 {
            let logits = row(257, seed);
            // q: the target softmax sharpened, so that r = max(p - q, 0) has zeros
            let q: Vec<f64> = {
                let w: Vec<f64> = logits.iter().map(|&x| (2.0 * x).exp()).collect();
                let s: f64 = w.iter().sum();
                w.iter().map(|v| v / s).collect()
            };
            let max = logits.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let mut e = vec![0.0; logits.len()];
            let sum = softmax_terms(&logits, max, &mut e);
            let got = residual_race(&mut e, sum, Some(&q[..]), 0, seed as i64, 11);
            assert_eq!(
                got,
                brute_residual(&logits, &q, seed as i64, 11),
                "seed {seed}"
            );
        }
    }

    #[test]
    fn no_q_is_one_hot_q() {
        for seed in 0..30u64 {
            let rows: Vec<Vec<f64>> = (0..3).map(|i| row(20, 3 * seed + i)).collect();
            let drafts = [(seed % 20) as i64, argmax(&rows[1]), 3];
            let one_hot: Vec<Vec<f64>> = drafts
                .iter()
                .map(|&x| (0..20).map(|j| (j == x) as u8 as f64).collect())
                .collect();
            let q: Vec<&[f64]> = one_hot.iter().map(|r| r.as_slice()).collect();
            let rows = [rows.clone(), vec![row(20, 1000 + seed)]].concat();
            let mode = Mode::Random {
                seed: seed as i64,
                position: 5,
            };
            assert_eq!(
                run(&rows, &drafts, Some(&q), mode),
                run::<f64>(&rows, &drafts, None, mode)
            );
        }
    }

    fn run_tree(rows: &[Vec<f64>], drafts: &[i64], parents: &[i64], mode: Mode) -> Vec<i64> {
        let rows: Vec<&[f64]> = rows.iter().map(|r| r.as_slice()).collect();
        let request = TreeRequest {
            rows: &rows,
            drafts,
            parents,
            mode,
        };
        let mut statuses = vec![RowStatus::Ok; rows.len()];
        let mut out = vec![-1; rows.len()];
        verify_tree(&request, &mut statuses, &mut out, &mut Vec::new());
        out
    }

    #[test]
    fn a_chain_tree_is_the_linear_case() {
        for seed in 0..40u64 {
            let rows: Vec<Vec<f64>> = (0..4).map(|i| row(6, 4 * seed + i)).collect();
            let drafts = [argmax(&rows[0]), (seed % 6) as i64, argmax(&rows[2])];
            let modes = [
                Mode::Greedy,
                Mode::Random {
                    seed: seed as i64,
                    position: 9,
                },
            ];
            for mode in modes {
                assert_eq!(
                    run_tree(&rows, &drafts, &[0, 1, 2], mode),
                    run::<f64>(&rows, &drafts, None, mode),
                    "seed {seed}, {mode:?}"
                );
            }
        }
    }

    #[test]
    fn greedy_takes_the_first_matching_sibling() {
        // root with children 1 and 2 holding the same token; node 2's child would be wrong
        let rows: Vec<Vec<f64>> = (0..4).map(|i| row(8, 70 + i)).collect();
        let t = argmax(&rows[0]);
        let out = run_tree(&rows, &[t, t, argmax(&rows[2])], &[0, 0, 2], Mode::Greedy);
        assert_eq!(out, [t, argmax(&rows[1]), -1, -1]);
    }

    #[test]
    fn the_mask_holds_ancestors_and_self() {
        let mask = ancestor_mask(&[0, 0, 1, 2]);
        let rows: Vec<Vec<u8>> = mask
            .chunks(5)
            .map(|r| r.iter().map(|&b| b as u8).collect())
            .collect();
        assert_eq!(
            rows,
            [
                [1, 0, 0, 0, 0],
                [1, 1, 0, 0, 0],
                [1, 0, 1, 0, 0],
                [1, 1, 0, 1, 0],
                [1, 0, 1, 0, 1]
            ]
        );
    }

    #[test]
    fn a_bad_row_writes_nothing() {
        let mut rows: Vec<Vec<f64>> = (0..3).map(|i| row(10, i)).collect();
        rows[2] = vec![f64::NEG_INFINITY; 10];
        let refs: Vec<&[f64]> = rows.iter().map(|r| r.as_slice()).collect();
        let request = Request::<f64, f64> {
            rows: &refs,
            drafts: &[1, 2],
            probs: None,
            mode: Mode::Greedy,
        };
        let mut statuses = vec![RowStatus::Ok; 3];
        let mut out = vec![-1; 3];
        verify(&request, &mut statuses, &mut out, &mut Vec::new());
        assert_eq!(
            statuses,
            [RowStatus::Ok, RowStatus::Ok, RowStatus::AllMasked]
        );
        assert_eq!(out, [-1; 3]);
    }
}
