//! Kernels of `pyagent_accel.ops.lora` (batched LoRA: each token's low-rank update from
//! its own adapter slot) and their Python bindings (contract: `pyagent_ref.ops.lora`).
//!
//! `lora_shrink` works token by token (BGMV: one matrix-vector product per token with
//! its slot's A), four rows of A at a time in `LANES`-wide partial sums, tokens in
//! parallel for large batches. `lora_expand` groups the tokens by slot (SGMV's
//! segments): each slot's B is transposed once into the compute type, then every token
//! of the slot adds rank columns along its output row, slots in parallel for large
//! batches. A token without an adapter (slot -1) reads nothing. Computed in the compute
//! type (f32, f64 for f64), the storage type widened on the fly, compiled for
//! AVX-512/AVX2/baseline; sums run in another order than BLAS's, so results differ from
//! the reference's in the last bits (within the specification's tolerance).
//!
//! `lora_expand` adds in place: each row of a token with an adapter becomes
//! out + delta, summed in f64 when out or the compute type is f64 (else f32) and
//! rounded once to out's type; the rows of the other tokens are not written.

use std::any::TypeId;

use numpy::{PyArrayMethods, PyReadonlyArray1, PyUntypedArrayMethods};
use pyo3::prelude::*;
use rayon::prelude::*;

use crate::elem::{dtype_of, float_array, float_array_mut, new_array, with_elem, Compute, Elem};
use crate::float::{multiversion, Float};
use crate::py_util::{detached, readonly, slice, value_error};

/// Width of the vectorised dot products (one AVX-512 vector of f32).
const LANES: usize = 16;
/// Multiply-adds below which an op stays on the calling thread (some 100 us of work:
/// handing less to the thread pool costs more than it saves, so decode batches stay).
const PARALLEL: usize = 1 << 20;

/// The sum of LANES partial sums, pairwise (a tree the compiler vectorises).
#[inline(always)]
fn fold<C: Compute>(mut acc: [C; LANES]) -> C {
    let mut width = LANES / 2;
    while width > 0 {
        for l in 0..width {
            acc[l] = acc[l] + acc[l + width];
        }
        width /= 2;
    }
    acc[0]
}

/// The dots of four rows of `a` (storage type, each `x.len()` long) with `x` (compute
/// type): LANES partial sums per row, x read once for the four.
#[inline(always)]
fn dot4<E: Elem>(a: [&[E]; 4], x: &[E::C]) -> [E::C; 4] {
    let n = x.len();
    let body = n - n % LANES;
    let mut acc = [[E::C::ZERO; LANES]; 4];
    for c in (0..body).step_by(LANES) {
        let v: &[E::C; LANES] = x[c..c + LANES].try_into().unwrap();
        for (row, sums) in a.iter().zip(acc.iter_mut()) {
            let w: &[E; LANES] = row[c..c + LANES].try_into().unwrap();
            for l in 0..LANES {
                sums[l] = sums[l] + w[l].load() * v[l];
            }
        }
    }
    let mut out = [E::C::ZERO; 4];
    for (r, (row, sums)) in a.iter().zip(acc).enumerate() {
        let mut sum = fold(sums);
        for i in body..n {
            sum = sum + row[i].load() * x[i];
        }
        out[r] = sum;
    }
    out
}

/// One token of `lora_shrink`: y[r] = a[r] . x over the rows r of its slot's A (`a`:
/// rank rows of `x.len()`), x widened into `scratch`; rows four at a time.
#[inline(always)]
fn shrink_token_impl<E: Elem>(a: &[E], x: &[E], scratch: &mut [E::C], y: &mut [E::C]) {
    let width = x.len();
    E::C::widen(x, scratch);
    let row = |r: usize| &a[r * width..(r + 1) * width];
    let rank = y.len();
    let mut r = 0;
    while r + 4 <= rank {
        let sums = dot4([row(r), row(r + 1), row(r + 2), row(r + 3)], scratch);
        y[r..r + 4].copy_from_slice(&sums);
        r += 4;
    }
    while r < rank {
        // the last rows, with a row repeated (its sums discarded)
        y[r] = dot4([row(r), row(r), row(r), row(r)], scratch)[0];
        r += 1;
    }
}

multiversion! {
    fn shrink_token<E: Elem>(a: &[E], x: &[E], scratch: &mut [E::C], y: &mut [E::C]) -> ()
        = shrink_token_impl;
}

/// The whole shrink on slices: x (tokens, in), lora_a (num_loras, rank, in), slots in
/// [-1, num_loras) per token; y (tokens, rank) is written, zeros for slot -1.
pub fn shrink_slices<E: Elem>(x: &[E], lora_a: &[E], slots: &[i64], rank: usize, y: &mut [E::C]) {
    let tokens = slots.len();
    let width = x.len() / tokens.max(1);
    if rank == 0 {
        return;
    }
    let run = |(t, row): (usize, &mut [E::C])| {
        let slot = slots[t];
        if slot < 0 {
            row.fill(E::C::ZERO);
            return;
        }
        let per_slot = rank * width;
        let a = &lora_a[slot as usize * per_slot..(slot as usize + 1) * per_slot];
        let mut scratch = vec![E::C::ZERO; width];
        shrink_token(a, &x[t * width..(t + 1) * width], &mut scratch, row);
    };
    if tokens * rank * width >= PARALLEL {
        y.par_chunks_mut(rank).enumerate().for_each(run);
    } else {
        y.chunks_mut(rank).enumerate().for_each(run);
    }
}

/// How `lora_expand` lays out one slot: the output slices' sizes and the rank.
#[derive(Clone, Copy)]
pub struct Slices<'a> {
    pub sizes: &'a [usize],
    pub rank: usize,
}

/// The tokens of one slot: their deltas, `delta[j]` = scaling * B y[tokens[j]] over the
/// output rows (each slice reading its rank columns of y). B (out, rank) is first
/// transposed into `bt` (rank, out) in the compute type, so that each token's delta is
/// `rank` contiguous multiply-adds along the output rows per slice.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn expand_slot_impl<E: Elem>(
    b: &[E],
    y: &[E::C],
    width: usize,
    tokens: &[usize],
    scaling: E::C,
    layout: Slices<'_>,
    bt: &mut [E::C],
    delta: &mut [E::C],
) {
    let (rank, out) = (layout.rank, bt.len() / layout.rank.max(1));
    for o in 0..out {
        for k in 0..rank {
            bt[k * out + o] = b[o * rank + k].load();
        }
    }
    for (j, &t) in tokens.iter().enumerate() {
        let d = &mut delta[j * out..(j + 1) * out];
        d.fill(E::C::ZERO);
        let v = &y[t * width..(t + 1) * width];
        let mut start = 0;
        for (s, &size) in layout.sizes.iter().enumerate() {
            let rows = start..start + size;
            for k in 0..rank {
                let vk = v[s * rank + k];
                let col = &bt[k * out + rows.start..k * out + rows.end];
                for (dst, &w) in d[rows.clone()].iter_mut().zip(col) {
                    *dst = *dst + w * vk;
                }
            }
            start += size;
        }
        for dst in d.iter_mut() {
            *dst = *dst * scaling;
        }
    }
}

multiversion! {
    #[allow(clippy::too_many_arguments)]
    fn expand_slot<E: Elem>(
        b: &[E],
        y: &[E::C],
        width: usize,
        tokens: &[usize],
        scaling: E::C,
        layout: Slices<'_>,
        bt: &mut [E::C],
        delta: &mut [E::C],
    ) -> () = expand_slot_impl;
}

/// `out + delta` rounded once to O: summed in f64 when O or C is f64, else in f32.
#[inline(always)]
fn add_rounded<O: Elem, C: Compute>(out: O, delta: C) -> O {
    if TypeId::of::<O>() == TypeId::of::<f64>() || TypeId::of::<C>() == TypeId::of::<f64>() {
        (out.to_f64() + delta.to_f64()).cast::<O>()
    } else {
        O::store(O::C::from_f64(
            (out.to_f32() + delta.to_f64() as f32) as f64,
        ))
    }
}

/// The whole expand on slices: y (tokens, num_slices * rank), lora_b (num_loras, out,
/// rank), scaling (num_loras,), slots per token. Into `out` (tokens, out_features) of
/// any type O: with `add`, out + delta rounded to O for the tokens with a slot (the
/// other rows untouched); without, delta itself (O is the compute type, zeros for -1).
/// The tokens are grouped by slot (in token order), the slots in parallel for large
/// batches.
#[allow(clippy::too_many_arguments)]
pub fn expand_slices<E: Elem, O: Elem>(
    y: &[E::C],
    lora_b: &[E],
    scaling: &[E::C],
    slots: &[i64],
    layout: Slices<'_>,
    add: bool,
    out: &mut [O],
) {
    let tokens = slots.len();
    let out_features: usize = layout.sizes.iter().sum();
    if out_features == 0 {
        return;
    }
    let width = y.len() / tokens.max(1);
    let num_loras = scaling.len();
    let mut groups: Vec<Vec<usize>> = vec![Vec::new(); num_loras];
    for (t, &slot) in slots.iter().enumerate() {
        if slot >= 0 {
            groups[slot as usize].push(t);
        }
    }
    let per_slot = out_features * layout.rank;
    let run = |(slot, members): (usize, &Vec<usize>)| -> Vec<E::C> {
        let mut delta = vec![E::C::ZERO; members.len() * out_features];
        if members.is_empty() || layout.rank == 0 {
            return delta;
        }
        let mut bt = vec![E::C::ZERO; per_slot];
        let b = &lora_b[slot * per_slot..(slot + 1) * per_slot];
        expand_slot(
            b,
            y,
            width,
            members,
            scaling[slot],
            layout,
            &mut bt,
            &mut delta,
        );
        delta
    };
    let work = tokens * per_slot + num_loras * per_slot;
    let deltas: Vec<Vec<E::C>> = if work >= PARALLEL {
        groups.par_iter().enumerate().map(run).collect()
    } else {
        groups.iter().enumerate().map(run).collect()
    };
    if !add {
        out.fill(O::store(O::C::ZERO));
    }
    for (members, delta) in groups.iter().zip(&deltas) {
        for (j, &t) in members.iter().enumerate() {
            let row = &mut out[t * out_features..(t + 1) * out_features];
            let d = &delta[j * out_features..(j + 1) * out_features];
            for (o, &v) in row.iter_mut().zip(d) {
                *o = if add {
                    add_rounded(*o, v)
                } else {
                    O::store(O::C::from_f64(v.to_f64()))
                };
            }
        }
    }
}

/// lora_shrink(x, lora_a, indices)
/// --
///
/// C-contiguous arrays: `x` (tokens, in) of any float dtype (bfloat16 as int16 bits),
/// `lora_a` (num_loras, rank, in) of its dtype, `indices` int64 (tokens,) in
/// [-1, num_loras): y (tokens, rank) in the compute type.
#[pyfunction]
fn lora_shrink<'py>(
    py: Python<'py>,
    x: &Bound<'py, PyAny>,
    lora_a: &Bound<'py, PyAny>,
    indices: PyReadonlyArray1<'py, i64>,
) -> PyResult<Bound<'py, PyAny>> {
    with_elem!(dtype_of(x, "x")?, E => {
        let xa = float_array::<E>(x, "x")?;
        let aa = float_array::<E>(lora_a, "lora_a")?;
        let (xs, as_) = (xa.shape().to_vec(), aa.shape().to_vec());
        let slots = slice(&indices, "indices")?;
        if xs.len() != 2 || as_.len() != 3 || as_[2] != xs[1] || slots.len() != xs[0] {
            return Err(value_error(format!(
                "lora_shrink shapes disagree: x {xs:?}, lora_a {as_:?}, indices ({},)",
                slots.len()
            )));
        }
        let (num_loras, rank) = (as_[0] as i64, as_[1]);
        if let Some(&bad) = slots.iter().find(|&&i| i < -1 || i >= num_loras) {
            return Err(value_error(format!("indices holds {bad}, outside [-1, {num_loras})")));
        }
        let (xd, ad) = (slice(&xa, "x")?, slice(&aa, "lora_a")?);
        // SAFETY: every element is written below.
        let out = unsafe { new_array::<<E as Elem>::C>(py, &[xs[0], rank]) };
        {
            let mut w = out.readwrite();
            let yd = w.as_slice_mut()?;
            detached(py, || shrink_slices(xd, ad, slots, rank, yd))?;
        }
        Ok(out.into_any())
    })
}

/// lora_expand(y, lora_b, indices, scaling, out, output_slices)
/// --
///
/// C-contiguous arrays: `y` (tokens, num_slices * rank) and `scaling` (num_loras,) in
/// lora_b's compute type, `lora_b` (num_loras, out_features, rank) of any float dtype,
/// `indices` int64 (tokens,) in [-1, num_loras), `out` None or (tokens, out_features)
/// of any float dtype (written in place), `output_slices` the sizes summing to
/// out_features. Returns out, or the delta in the compute type.
#[pyfunction]
fn lora_expand<'py>(
    py: Python<'py>,
    y: &Bound<'py, PyAny>,
    lora_b: &Bound<'py, PyAny>,
    indices: PyReadonlyArray1<'py, i64>,
    scaling: &Bound<'py, PyAny>,
    out: Option<&Bound<'py, PyAny>>,
    output_slices: Vec<usize>,
) -> PyResult<Bound<'py, PyAny>> {
    with_elem!(dtype_of(lora_b, "lora_b")?, E => {
        let ba = float_array::<E>(lora_b, "lora_b")?;
        let ya = y
            .cast::<numpy::PyArray2<<E as Elem>::C>>()
            .map_err(|_| value_error("y must be a 2-D array of lora_b's compute type"))?;
        let ya = readonly(ya, "y")?;
        let sa = scaling
            .cast::<numpy::PyArray1<<E as Elem>::C>>()
            .map_err(|_| value_error("scaling must be a 1-D array of lora_b's compute type"))?;
        let sa = readonly(sa, "scaling")?;
        let (bs, ys) = (ba.shape().to_vec(), ya.shape().to_vec());
        let slots = slice(&indices, "indices")?;
        let ok = bs.len() == 3
            && output_slices.iter().sum::<usize>() == bs[1]
            && ys[1] == output_slices.len() * bs[2]
            && slots.len() == ys[0]
            && sa.len() == bs[0];
        if !ok {
            return Err(value_error(format!(
                "lora_expand shapes disagree: y {ys:?}, lora_b {bs:?}, indices ({},), \
                 scaling ({},), output_slices {output_slices:?}",
                slots.len(),
                sa.len()
            )));
        }
        let num_loras = bs[0] as i64;
        if let Some(&bad) = slots.iter().find(|&&i| i < -1 || i >= num_loras) {
            return Err(value_error(format!("indices holds {bad}, outside [-1, {num_loras})")));
        }
        let (yd, bd, sd) = (slice(&ya, "y")?, slice(&ba, "lora_b")?, slice(&sa, "scaling")?);
        let layout = Slices { sizes: &output_slices, rank: bs[2] };
        match out {
            None => {
                // SAFETY: every element is written below (zeros for the tokens without a slot).
                let delta = unsafe { new_array::<<E as Elem>::C>(py, &[ys[0], bs[1]]) };
                {
                    let mut w = delta.readwrite();
                    let dd = w.as_slice_mut()?;
                    if bs[1] > 0 {
                        detached(py, || expand_slices::<E, <E as Elem>::C>(yd, bd, sd, slots, layout, false, dd))?;
                    }
                }
                Ok(delta.into_any())
            }
            Some(target) => {
                with_elem!(dtype_of(target, "out")?, O => {
                    let mut oa = float_array_mut::<O>(target, "out")?;
                    if oa.shape() != [ys[0], bs[1]] {
                        return Err(value_error(format!(
                            "out must have shape ({}, {}), got {:?}", ys[0], bs[1], oa.shape()
                        )));
                    }
                    let od = oa.as_slice_mut().map_err(|_| value_error("out must be C-contiguous"))?;
                    detached(py, || expand_slices::<E, O>(yd, bd, sd, slots, layout, true, od))?;
                });
                Ok(target.clone())
            }
        }
    })
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(lora_shrink, m)?)?;
    m.add_function(wrap_pyfunction!(lora_expand, m)?)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shrink_and_expand_follow_each_tokens_slot() {
        // 3 tokens: slot 1, none, slot 0; in 3, rank 2, two slots
        let x = [1.0f64, 2.0, 3.0, 9.0, 9.0, 9.0, -1.0, 0.5, 2.0];
        let a: Vec<f64> = (0..12).map(|i| i as f64 * 0.25 - 1.0).collect();
        let slots = [1i64, -1, 0];
        let mut y = [7.0f64; 6];
        shrink_slices(&x, &a, &slots, 2, &mut y);
        for (t, &s) in slots.iter().enumerate() {
            for r in 0..2 {
                let want: f64 = if s < 0 {
                    0.0
                } else {
                    (0..3)
                        .map(|k| a[(s as usize * 2 + r) * 3 + k] * x[t * 3 + k])
                        .sum()
                };
                assert!((y[t * 2 + r] - want).abs() < 1e-12, "{t} {r}");
            }
        }
        // expand into two output slices of 1 and 2 rows: y has 2 slices of rank 1
        let b: Vec<f64> = (0..6).map(|i| 1.0 + i as f64).collect(); // (2 slots, 3 rows, rank 1)
        let scaling = [2.0f64, 0.5];
        let layout = Slices {
            sizes: &[1, 2],
            rank: 1,
        };
        let mut out = [10.0f32; 9];
        expand_slices::<f64, f32>(&y, &b, &scaling, &slots, layout, true, &mut out);
        assert_eq!(out[3..6], [10.0, 10.0, 10.0]); // no adapter: untouched
        let want0 = 10.0 + 0.5 * b[3] * y[0]; // token 0, slot 1, row 0 reads slice 0
        let want2 = 10.0 + 0.5 * b[5] * y[1]; // row 2 is in slice 1
        assert!((out[0] as f64 - want0).abs() < 1e-4 && (out[2] as f64 - want2).abs() < 1e-4);
    }

    #[test]
    fn adding_rounds_once_to_the_output_type() {
        use half::f16;
        // f16 1 + 2**-11 is a tie between 1 and 1 + 2**-10: to even (1), once
        assert_eq!(
            add_rounded(f16::from_f32(1.0), 2f32.powi(-11)).to_f32(),
            1.0
        );
        assert_eq!(add_rounded(1.0f64, 1e-300f64), 1.0);
        assert_eq!(add_rounded(1e-300f64, 1e-300f32), 1e-300 + 1e-300f32 as f64);
    }
}
