//! Kernels of `pyagent_accel.ops.moe` (mixture-of-experts routing and the experts'
//! MLPs) and their Python bindings (contract: `pyagent_ref.ops.moe`).
//!
//! Routing works row by row (one token's router logits), rows in parallel for large
//! batches: scores in the compute type (f32, f64 for f64 logits), then a stable
//! selection of the best k (descending, ties to the lower index), as the reference's
//! stable argsort. The choice of `route_topk_softmax` is made on the logits themselves,
//! so it is exact; grouped routing chooses on computed scores, whose exp may differ from
//! numpy's in the last bit (within the specification's tolerance).
//!
//! `fused_moe` follows the reference's plan: the (token, slot) pairs sorted by expert
//! (a stable counting sort), each expert's pairs cut into blocks of `TOKEN_BLOCK`
//! tokens, and the blocks run in parallel: each weight row is read once per block and
//! dotted with every token of the block (`LANES`-wide partial sums, vectorised and
//! compiled for AVX-512/AVX2/baseline), silu(gate) * up, then the down projection,
//! times the routing weight. A final pass sums each token's slots in slot order and
//! rounds once to the storage type. Sums run in another order than BLAS's, so results
//! differ from the reference in the last bits (within the specification's tolerance).

use numpy::{PyArray1, PyArrayMethods, PyReadonlyArray2, PyUntypedArrayMethods};
use pyo3::prelude::*;
use rayon::prelude::*;

use crate::elem::{dtype_of, float_array, new_array, with_elem, Compute, Elem};
use crate::float::{multiversion, Float};
use crate::py_util::{detached, readonly, slice, value_error};

/// Width of the vectorised dot products (one AVX-512 vector of f32).
const LANES: usize = 16;
/// Tokens that share each read of an expert's weight row.
const TOKEN_BLOCK: usize = 8;
/// Router elements (tokens x experts) below which routing stays on the calling thread.
const ROUTE_PARALLEL: usize = 1 << 15;
/// Multiply-adds below which `fused_moe` stays on the calling thread.
const MOE_PARALLEL: usize = 1 << 16;

// ---------------------------------------------------------------------------------
// Routing

/// The indices of the k largest `scores`, largest first, ties by the lower index (a
/// stable descending sort, -0.0 equal to 0.0; NaN never occurs: inputs are checked).
fn top_k<C: Float>(scores: &[C], k: usize, out: &mut Vec<usize>) {
    out.clear();
    out.extend(0..scores.len());
    let better = |a: &usize, b: &usize| {
        scores[*b]
            .partial_cmp(&scores[*a])
            .unwrap_or(std::cmp::Ordering::Equal)
            .then(a.cmp(b))
    };
    if k < scores.len() {
        out.select_nth_unstable_by(k, better);
        out.truncate(k);
    }
    out.sort_unstable_by(better);
}

/// softmax of `x` into `out` in the compute type (the reference's max-shifted form).
fn softmax<C: Float>(x: &[C], out: &mut [C]) {
    let max = x
        .iter()
        .copied()
        .fold(C::NEG_INF, |m, v| if v > m { v } else { m });
    let mut sum = C::ZERO;
    for (o, &v) in out.iter_mut().zip(x) {
        *o = (v - max).exp_fast();
        sum = sum + *o;
    }
    for o in out.iter_mut() {
        *o = *o / sum;
    }
}

/// sigmoid without overflow: 1 / (1 + e) for x >= 0, e / (1 + e) below, e = exp(-|x|).
#[inline(always)]
fn sigmoid<C: Float>(x: C) -> C {
    let neg_abs = if x < C::ZERO { x } else { C::ZERO - x };
    let e = neg_abs.exp_fast();
    if x >= C::ZERO {
        C::ONE / (C::ONE + e)
    } else {
        e / (C::ONE + e)
    }
}

/// How `route_grouped_topk` scores and groups the experts of a row.
#[derive(Clone, Copy)]
pub struct Grouping<'a, C> {
    pub k: usize,
    pub num_groups: usize,
    pub topk_groups: usize,
    pub bias: Option<&'a [C]>,
    pub sigmoid: bool,
    pub scale: C,
    pub renormalize: bool,
    pub group_max: bool,
}

/// One row of `route_topk_softmax`: ids by the logits, weights by the softmax.
fn topk_softmax_row<C: Float>(
    x: &[C],
    k: usize,
    renormalize: bool,
    scratch: &mut (Vec<C>, Vec<usize>),
    weights: &mut [C],
    ids: &mut [i64],
) {
    let (probs, order) = scratch;
    probs.resize(x.len(), C::ZERO);
    softmax(x, probs);
    top_k(x, k, order);
    let mut sum = C::ZERO;
    for (j, &e) in order.iter().enumerate() {
        ids[j] = e as i64;
        weights[j] = probs[e];
        sum = sum + probs[e];
    }
    if renormalize {
        for w in weights.iter_mut() {
            *w = *w / sum;
        }
    }
}

/// One row of `route_grouped_topk` (the reference's steps 1-6).
fn grouped_row<C: Float>(
    x: &[C],
    g: &Grouping<'_, C>,
    scratch: &mut (Vec<C>, Vec<usize>),
    weights: &mut [C],
    ids: &mut [i64],
) {
    let experts = x.len();
    let size = experts / g.num_groups;
    let (buf, order) = scratch;
    buf.resize(3 * experts, C::ZERO);
    let (scores, rest) = buf.split_at_mut(experts);
    let (biased, candidates) = rest.split_at_mut(experts);
    if g.sigmoid {
        for (s, &v) in scores.iter_mut().zip(x) {
            *s = sigmoid(v);
        }
    } else {
        softmax(x, scores);
    }
    match g.bias {
        Some(bias) => {
            for ((b, &s), &c) in biased.iter_mut().zip(scores.iter()).zip(bias) {
                *b = s + c;
            }
        }
        None => biased.copy_from_slice(scores),
    }
    let group_scores: Vec<C> = biased
        .chunks(size)
        .map(|group| {
            let (mut first, mut second) = (C::NEG_INF, C::NEG_INF);
            for &v in group {
                if v > first {
                    second = first;
                    first = v;
                } else if v > second {
                    second = v;
                }
            }
            if g.group_max || size == 1 {
                first
            } else {
                first + second
            }
        })
        .collect();
    top_k(&group_scores, g.topk_groups, order);
    candidates.fill(C::NEG_INF);
    for &group in order.iter() {
        let range = group * size..(group + 1) * size;
        candidates[range.clone()].copy_from_slice(&biased[range]);
    }
    top_k(candidates, g.k, order);
    let mut sum = C::ZERO;
    for (j, &e) in order.iter().enumerate() {
        ids[j] = e as i64;
        weights[j] = scores[e];
        sum = sum + scores[e];
    }
    let denominator = sum + C::from_f64(1e-20);
    for w in weights.iter_mut() {
        if g.renormalize {
            *w = *w / denominator;
        }
        *w = *w * g.scale;
    }
}

/// Route every row of `x` (rows of `experts` in the compute type) with `row`, in
/// parallel for big batches; returns (weights, ids) of `k` per row.
fn route_rows<C: Float, F>(x: &[C], experts: usize, k: usize, row: F) -> (Vec<C>, Vec<i64>)
where
    F: Fn(&[C], &mut (Vec<C>, Vec<usize>), &mut [C], &mut [i64]) + Sync,
{
    let tokens = x.len() / experts.max(1);
    let mut weights = vec![C::ZERO; tokens * k];
    let mut ids = vec![0i64; tokens * k];
    let min_len = (ROUTE_PARALLEL / experts.max(1)).max(1);
    if k > 0 && tokens > 0 {
        x.par_chunks(experts)
            .zip(weights.par_chunks_mut(k).zip(ids.par_chunks_mut(k)))
            .with_min_len(min_len)
            .for_each_init(
                || (Vec::new(), Vec::new()),
                |scratch, (xr, (w, i))| row(xr, scratch, w, i),
            );
    }
    (weights, ids)
}

/// A read-only borrow of the 2-D logits of `E`.
fn logits_2d<'py, E: Elem>(logits: &Bound<'py, PyAny>) -> PyResult<PyReadonlyArray2<'py, E>> {
    let arr = logits
        .cast::<numpy::PyArray2<E>>()
        .map_err(|_| value_error("logits must be a 2-D array"))?;
    readonly(arr, "logits")
}

/// The logits in the compute type, row-major (half types widened exactly).
fn widen_rows<E: Elem>(x: &PyReadonlyArray2<'_, E>, name: &str) -> PyResult<Vec<E::C>> {
    let data = slice(x, name)?;
    let mut out = vec![E::C::ZERO; data.len()];
    E::C::widen(data, &mut out);
    Ok(out)
}

/// route_topk_softmax(logits, k, renormalize)
/// --
///
/// `logits` (tokens, experts) C-contiguous of any float dtype (bfloat16 as int16 bits),
/// finite (checked by the wrapper): (weights in f32 / f64 for f64, ids int64), (tokens, k).
#[pyfunction]
fn route_topk_softmax<'py>(
    py: Python<'py>,
    logits: &Bound<'py, PyAny>,
    k: usize,
    renormalize: bool,
) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyAny>)> {
    with_elem!(dtype_of(logits, "logits")?, E => {
        let arr = logits_2d::<E>(logits)?;
        let (tokens, experts) = (arr.shape()[0], arr.shape()[1]);
        if !(1..=experts).contains(&k) {
            return Err(value_error(format!("k must be in [1, {experts}], got {k}")));
        }
        let x = widen_rows::<E>(&arr, "logits")?;
        let (w, ids) = detached(py, || {
            route_rows(&x, experts, k, |xr, scratch, w, i| {
                topk_softmax_row(xr, k, renormalize, scratch, w, i)
            })
        })?;
        finish(py, w, ids, tokens, k)
    })
}

/// (weights, ids) as (tokens, k) numpy arrays.
fn finish<'py, C: Compute>(
    py: Python<'py>,
    w: Vec<C>,
    ids: Vec<i64>,
    tokens: usize,
    k: usize,
) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyAny>)> {
    Ok((
        PyArray1::from_vec(py, w).reshape([tokens, k])?.into_any(),
        PyArray1::from_vec(py, ids).reshape([tokens, k])?.into_any(),
    ))
}

/// route_grouped_topk(logits, k, num_groups, topk_groups, correction_bias, sigmoid, routed_scaling_factor, renormalize, group_max)
/// --
///
/// `logits` as for `route_topk_softmax`; `correction_bias` None or (experts,) in the
/// compute type (f32, f64 for f64 logits); the other arguments checked by the wrapper.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn route_grouped_topk<'py>(
    py: Python<'py>,
    logits: &Bound<'py, PyAny>,
    k: usize,
    num_groups: usize,
    topk_groups: usize,
    correction_bias: Option<&Bound<'py, PyAny>>,
    sigmoid: bool,
    routed_scaling_factor: f64,
    renormalize: bool,
    group_max: bool,
) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyAny>)> {
    with_elem!(dtype_of(logits, "logits")?, E => {
        let arr = logits_2d::<E>(logits)?;
        let (tokens, experts) = (arr.shape()[0], arr.shape()[1]);
        if num_groups == 0
            || experts % num_groups != 0
            || !(1..=num_groups).contains(&topk_groups)
            || !(1..=topk_groups * (experts / num_groups)).contains(&k)
        {
            return Err(value_error(format!(
                "invalid grouping: {experts} experts, num_groups {num_groups}, topk_groups \
                 {topk_groups}, k {k}"
            )));
        }
        let bias = match correction_bias {
            Some(b) => {
                let b = b
                    .cast::<numpy::PyArray1<<E as Elem>::C>>()
                    .map_err(|_| value_error("correction_bias must be a 1-D array of the compute type"))?;
                let b = readonly(b, "correction_bias")?;
                let v = slice(&b, "correction_bias")?.to_vec();
                if v.len() != experts {
                    return Err(value_error(format!(
                        "correction_bias must have shape ({experts},), got ({},)",
                        v.len()
                    )));
                }
                Some(v)
            }
            None => None,
        };
        let x = widen_rows::<E>(&arr, "logits")?;
        let grouping = Grouping {
            k,
            num_groups,
            topk_groups,
            bias: bias.as_deref(),
            sigmoid,
            scale: <E as Elem>::C::from_f64(routed_scaling_factor),
            renormalize,
            group_max,
        };
        let (w, ids) = detached(py, || {
            route_rows(&x, experts, k, |xr, scratch, w, i| grouped_row(xr, &grouping, scratch, w, i))
        })?;
        finish(py, w, ids, tokens, k)
    })
}

// ---------------------------------------------------------------------------------
// The experts

/// a . b in LANES partial sums (the tail beyond a multiple of LANES added last).
#[inline(always)]
fn dot<C: Compute>(a: &[C], b: &[C]) -> C {
    let n = a.len().min(b.len());
    let body = n - n % LANES;
    let mut acc = [C::ZERO; LANES];
    for c in (0..body).step_by(LANES) {
        let x: &[C; LANES] = a[c..c + LANES].try_into().unwrap();
        let y: &[C; LANES] = b[c..c + LANES].try_into().unwrap();
        for l in 0..LANES {
            acc[l] = acc[l] + x[l] * y[l];
        }
    }
    let mut sum = acc.iter().fold(C::ZERO, |s, &v| s + v);
    for i in body..n {
        sum = sum + a[i] * b[i];
    }
    sum
}

/// `out[t * rows.len() / width + r] = dot(inputs[t], row r)` for each weight row `r` of
/// `weights` (rows of `width` storage elements, widened into `row` when E is not C) and
/// each of the `inputs` (rows of `width` compute elements).
#[inline(always)]
fn project<E: Elem>(
    weights: &[E],
    width: usize,
    inputs: &[E::C],
    row: &mut [E::C],
    out: &mut [E::C],
) {
    let n_rows = weights.len() / width;
    let n_in = inputs.len() / width;
    for (r, w) in weights.chunks_exact(width).enumerate() {
        E::C::widen(w, row);
        for t in 0..n_in {
            out[t * n_rows + r] = dot(&inputs[t * width..(t + 1) * width], row);
        }
    }
}

/// One block of tokens routed to one expert: `out[p] = weight[p] * down(silu(gate(x_p))
/// * up(x_p))` for the block's inputs `x` (n rows of hidden), into rows of hidden.
#[inline(always)]
fn expert_block_impl<E: Elem>(
    w_gate_up: &[E],
    w_down: &[E],
    x: &[E::C],
    weights: &[E::C],
    hidden: usize,
    inter: usize,
    out: &mut [E::C],
) {
    let n = weights.len();
    let mut row = vec![E::C::ZERO; hidden.max(inter)];
    let mut gate_up = vec![E::C::ZERO; n * 2 * inter];
    project(w_gate_up, hidden, x, &mut row[..hidden], &mut gate_up);
    let mut act = vec![E::C::ZERO; n * inter];
    for t in 0..n {
        let gu = &gate_up[t * 2 * inter..(t + 1) * 2 * inter];
        for i in 0..inter {
            let g = gu[i];
            act[t * inter + i] = g / (E::C::ONE + (E::C::ZERO - g).exp_fast()) * gu[inter + i];
        }
    }
    project(w_down, inter, &act, &mut row[..inter], out);
    for (o, &w) in out.chunks_exact_mut(hidden).zip(weights) {
        for v in o.iter_mut() {
            *v = *v * w;
        }
    }
}

multiversion! {
    fn expert_block<E: Elem>(
        w_gate_up: &[E],
        w_down: &[E],
        x: &[E::C],
        weights: &[E::C],
        hidden: usize,
        inter: usize,
        out: &mut [E::C],
    ) -> () = expert_block_impl;
}

/// The whole op on slices: hidden (tokens, h), w_gate_up (experts, 2 inter, h), w_down
/// (experts, h, inter), topk weights and ids (tokens, k), ids in [0, experts).
#[allow(clippy::too_many_arguments)]
pub fn fused_moe_slices<E: Elem>(
    hidden: &[E],
    w_gate_up: &[E],
    w_down: &[E],
    topk_weights: &[E::C],
    topk_ids: &[i64],
    hidden_size: usize,
    inter: usize,
    experts: usize,
    out: &mut [E],
) {
    let pairs = topk_ids.len();
    let tokens = out.len() / hidden_size.max(1);
    let k = pairs / tokens.max(1);
    // 1. a stable counting sort of the pairs by expert
    let mut starts = vec![0usize; experts + 1];
    for &e in topk_ids {
        starts[e as usize + 1] += 1;
    }
    for e in 0..experts {
        starts[e + 1] += starts[e];
    }
    let mut next = starts.clone();
    let mut order = vec![0usize; pairs];
    let mut position = vec![0usize; pairs];
    for (p, &e) in topk_ids.iter().enumerate() {
        order[next[e as usize]] = p;
        position[p] = next[e as usize];
        next[e as usize] += 1;
    }
    // 2. blocks of up to TOKEN_BLOCK pairs of one expert, each with its output rows
    let mut per_pair = vec![E::C::ZERO; pairs * hidden_size];
    let mut blocks = Vec::new();
    let mut rest: &mut [E::C] = &mut per_pair;
    for e in 0..experts {
        let mut lo = starts[e];
        while lo < starts[e + 1] {
            let hi = (lo + TOKEN_BLOCK).min(starts[e + 1]);
            let (head, tail) = std::mem::take(&mut rest).split_at_mut((hi - lo) * hidden_size);
            blocks.push((e, lo..hi, head));
            rest = tail;
            lo = hi;
        }
    }
    let run = |(e, range, dst): (usize, std::ops::Range<usize>, &mut [E::C])| {
        let mut x = vec![E::C::ZERO; range.len() * hidden_size];
        let mut w = Vec::with_capacity(range.len());
        for (i, &p) in order[range].iter().enumerate() {
            let token = &hidden[(p / k) * hidden_size..(p / k + 1) * hidden_size];
            E::C::widen(token, &mut x[i * hidden_size..(i + 1) * hidden_size]);
            w.push(topk_weights[p]);
        }
        let gu = 2 * inter * hidden_size;
        let d = hidden_size * inter;
        expert_block(
            &w_gate_up[e * gu..(e + 1) * gu],
            &w_down[e * d..(e + 1) * d],
            &x,
            &w,
            hidden_size,
            inter,
            dst,
        );
    };
    let work = pairs * 3 * inter * hidden_size;
    if work >= MOE_PARALLEL {
        blocks.into_par_iter().for_each(run);
    } else {
        blocks.into_iter().for_each(run);
    }
    // 3. each token's slots summed in slot order, rounded once
    let combine = |(t, o): (usize, &mut [E])| {
        for (c, v) in o.iter_mut().enumerate() {
            let mut sum = E::C::ZERO;
            for j in 0..k {
                sum = sum + per_pair[position[t * k + j] * hidden_size + c];
            }
            *v = E::store(sum);
        }
    };
    if work >= MOE_PARALLEL {
        out.par_chunks_mut(hidden_size)
            .enumerate()
            .for_each(combine);
    } else {
        out.chunks_mut(hidden_size).enumerate().for_each(combine);
    }
}

/// fused_moe(hidden, w_gate_up, w_down, topk_weights, topk_ids)
/// --
///
/// C-contiguous arrays: `hidden` (tokens, h) of any float dtype (bfloat16 as int16
/// bits), the weights of its dtype, `topk_weights` (tokens, k) in the compute type,
/// `topk_ids` int64 (tokens, k) in [0, experts): the result (tokens, h) in hidden's dtype.
#[pyfunction]
fn fused_moe<'py>(
    py: Python<'py>,
    hidden: &Bound<'py, PyAny>,
    w_gate_up: &Bound<'py, PyAny>,
    w_down: &Bound<'py, PyAny>,
    topk_weights: &Bound<'py, PyAny>,
    topk_ids: PyReadonlyArray2<'py, i64>,
) -> PyResult<Bound<'py, PyAny>> {
    with_elem!(dtype_of(hidden, "hidden")?, E => {
        let h = float_array::<E>(hidden, "hidden")?;
        let wgu = float_array::<E>(w_gate_up, "w_gate_up")?;
        let wd = float_array::<E>(w_down, "w_down")?;
        let tw = topk_weights
            .cast::<numpy::PyArray2<<E as Elem>::C>>()
            .map_err(|_| value_error("topk_weights must be a 2-D array of the compute type"))?;
        let tw = readonly(tw, "topk_weights")?;
        let (hs, gs, ds) = (h.shape().to_vec(), wgu.shape().to_vec(), wd.shape().to_vec());
        let (ids_shape, w_shape) = (topk_ids.shape().to_vec(), tw.shape().to_vec());
        let ok = hs.len() == 2
            && gs.len() == 3
            && ds.len() == 3
            && gs[1] % 2 == 0
            && gs[2] == hs[1]
            && ds == [gs[0], hs[1], gs[1] / 2]
            && ids_shape.len() == 2
            && ids_shape[0] == hs[0]
            && w_shape == ids_shape;
        if !ok {
            return Err(value_error(format!(
                "fused_moe shapes disagree: hidden {hs:?}, w_gate_up {gs:?}, w_down {ds:?}, \
                 topk_weights {w_shape:?}, topk_ids {ids_shape:?}"
            )));
        }
        let (tokens, hidden_size, experts, inter) = (hs[0], hs[1], gs[0], gs[1] / 2);
        let ids = slice(&topk_ids, "topk_ids")?;
        if let Some(&bad) = ids.iter().find(|&&e| e < 0 || e as usize >= experts) {
            return Err(value_error(format!("topk_ids holds expert {bad}, outside [0, {experts})")));
        }
        let (hd, gd, dd, wv) = (
            slice(&h, "hidden")?,
            slice(&wgu, "w_gate_up")?,
            slice(&wd, "w_down")?,
            slice(&tw, "topk_weights")?,
        );
        // SAFETY: every element is written below (zeros when there is nothing to sum).
        let out = unsafe { new_array::<E>(py, &[tokens, hidden_size]) };
        {
            let mut out_w = out.readwrite();
            let od = out_w.as_slice_mut()?;
            if ids.is_empty() || hidden_size == 0 {
                od.fill(E::store(<E as Elem>::C::ZERO));
            } else {
                detached(py, || fused_moe_slices(hd, gd, dd, wv, ids, hidden_size, inter, experts, od))?;
            }
        }
        Ok(out.into_any())
    })
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(route_topk_softmax, m)?)?;
    m.add_function(wrap_pyfunction!(route_grouped_topk, m)?)?;
    m.add_function(wrap_pyfunction!(fused_moe, m)?)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_k_is_a_stable_descending_selection() {
        let mut out = Vec::new();
        top_k(&[1.0f32, 3.0, 3.0, 0.0, 3.0], 2, &mut out);
        assert_eq!(out, [1, 2]);
        top_k(&[-0.0f64, 0.0, 1.0], 3, &mut out);
        assert_eq!(out, [2, 0, 1]);
    }

    #[test]
    fn grouped_routing_keeps_the_best_groups() {
        // groups {0, 1} and {2, 3}: the second has the best single expert, the first the
        // best pair, so top2_sum keeps the first group and max the second
        let x = [2.0f64, 2.0, 2.5, -8.0];
        let mut scratch = (Vec::new(), Vec::new());
        let (mut w, mut ids) = ([0.0; 1], [0i64; 1]);
        let mut g = Grouping {
            k: 1,
            num_groups: 2,
            topk_groups: 1,
            bias: None,
            sigmoid: true,
            scale: 1.0,
            renormalize: false,
            group_max: false,
        };
        grouped_row(&x, &g, &mut scratch, &mut w, &mut ids);
        assert_eq!(ids, [0]);
        assert!((w[0] - 1.0 / (1.0 + (-2.0f64).exp())).abs() < 1e-15);
        g.group_max = true;
        grouped_row(&x, &g, &mut scratch, &mut w, &mut ids);
        assert_eq!(ids, [2]);
    }

    #[test]
    fn fused_moe_matches_the_formula() {
        let (tokens, h, inter, experts, k) = (3, 5, 4, 3, 2);
        let f = |i: usize| ((i as f64) * 0.37).sin();
        let hidden: Vec<f64> = (0..tokens * h).map(f).collect();
        let wgu: Vec<f64> = (0..experts * 2 * inter * h).map(|i| f(i + 7)).collect();
        let wd: Vec<f64> = (0..experts * h * inter).map(|i| f(i + 3)).collect();
        let ids = [0i64, 2, 2, 2, 1, 0];
        let weights = [0.5, 0.25, 1.0, -0.5, 0.75, 0.125];
        let mut out = vec![0.0f64; tokens * h];
        fused_moe_slices(
            &hidden, &wgu, &wd, &weights, &ids, h, inter, experts, &mut out,
        );
        for t in 0..tokens {
            for c in 0..h {
                let mut want = 0.0;
                for j in 0..k {
                    let e = ids[t * k + j] as usize;
                    let proj = |r: usize| -> f64 {
                        (0..h)
                            .map(|i| wgu[(e * 2 * inter + r) * h + i] * hidden[t * h + i])
                            .sum()
                    };
                    let act: f64 = (0..inter)
                        .map(|i| {
                            let g = proj(i);
                            g / (1.0 + (-g).exp()) * proj(inter + i) * wd[(e * h + c) * inter + i]
                        })
                        .sum();
                    want += weights[t * k + j] * act;
                }
                assert!((out[t * h + c] - want).abs() < 1e-12, "{t} {c}");
            }
        }
    }
}
