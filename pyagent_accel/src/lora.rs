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

/// The tokens of each slot, in token order (tokens without a slot in none).
fn group_by_slot(slots: &[i64], num_loras: usize) -> Vec<Vec<usize>> {
    let mut groups = vec![Vec::new(); num_loras];
    for (t, &slot) in slots.iter().enumerate() {
        if slot >= 0 {
            groups[slot as usize].push(t);
        }
    }
    groups
}

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

/// The dots of one row `a` (storage type) with four vectors `x` (compute type, as long
/// as `a`): LANES partial sums each, the row read once for the four.
#[inline(always)]
fn dot4<E: Elem>(a: &[E], x: [&[E::C]; 4]) -> [E::C; 4] {
    let n = a.len();
    let body = n - n % LANES;
    let mut acc = [[E::C::ZERO; LANES]; 4];
    for c in (0..body).step_by(LANES) {
        let w: &[E; LANES] = a[c..c + LANES].try_into().unwrap();
        let mut wide = [E::C::ZERO; LANES];
        for l in 0..LANES {
            wide[l] = w[l].load();
        }
        for (v, sums) in x.iter().zip(acc.iter_mut()) {
            let v: &[E::C; LANES] = v[c..c + LANES].try_into().unwrap();
            for l in 0..LANES {
                sums[l] = sums[l] + wide[l] * v[l];
            }
        }
    }
    let mut out = [E::C::ZERO; 4];
    for (j, (v, sums)) in x.iter().zip(acc).enumerate() {
        let mut sum = fold(sums);
        for i in body..n {
            sum = sum + a[i].load() * v[i];
        }
        out[j] = sum;
    }
    out
}

/// The tokens of one slot through its A (`a`: rank rows of `width`): `y[j * rank + r] =
/// a[r] . x[j]` for the widened inputs `x` (one row of `width` per token), each row of A
/// read once for four tokens.
#[inline(always)]
fn shrink_slot_impl<E: Elem>(a: &[E], x: &[E::C], width: usize, y: &mut [E::C]) {
    let n = x.len() / width.max(1);
    let rank = a.len() / width.max(1);
    let token = |j: usize| &x[j * width..(j + 1) * width];
    for r in 0..rank {
        let row = &a[r * width..(r + 1) * width];
        let mut j = 0;
        while j < n {
            // four tokens at a time; past the last, the last one again (discarded)
            let pick = |i: usize| token((j + i).min(n - 1));
            let sums = dot4(row, [pick(0), pick(1), pick(2), pick(3)]);
            for (i, &sum) in sums.iter().enumerate().take(n - j) {
                y[(j + i) * rank + r] = sum;
            }
            j += 4;
        }
    }
}

multiversion! {
    fn shrink_slot<E: Elem>(a: &[E], x: &[E::C], width: usize, y: &mut [E::C]) -> ()
        = shrink_slot_impl;
}

/// The whole shrink on slices: x (tokens, in), lora_a (num_loras, rank, in), slots in
/// [-1, num_loras) per token; y (tokens, rank) is written, zeros for slot -1. The tokens
/// are grouped by slot (SGMV's segments), each slot's A read once per group; slots in
/// parallel for large batches.
pub fn shrink_slices<E: Elem>(x: &[E], lora_a: &[E], slots: &[i64], rank: usize, y: &mut [E::C]) {
    let tokens = slots.len();
    let width = x.len() / tokens.max(1);
    y.fill(E::C::ZERO);
    if rank == 0 || tokens == 0 {
        return;
    }
    let per_slot = rank * width;
    let groups = group_by_slot(slots, lora_a.len() / per_slot.max(1));
    let run = |(slot, members): (usize, &Vec<usize>)| -> Vec<E::C> {
        let mut xs = vec![E::C::ZERO; members.len() * width];
        for (j, &t) in members.iter().enumerate() {
            E::C::widen(
                &x[t * width..(t + 1) * width],
                &mut xs[j * width..(j + 1) * width],
            );
        }
        let mut out = vec![E::C::ZERO; members.len() * rank];
        if !members.is_empty() {
            let a = &lora_a[slot * per_slot..(slot + 1) * per_slot];
            shrink_slot(a, &xs, width, &mut out);
        }
        out
    };
    let results: Vec<Vec<E::C>> = if tokens * per_slot >= PARALLEL {
        groups.par_iter().enumerate().map(run).collect()
    } else {
        groups.iter().enumerate().map(run).collect()
    };
    for (members, result) in groups.iter().zip(&results) {
        for (j, &t) in members.iter().enumerate() {
            y[t * rank..(t + 1) * rank].copy_from_slice(&result[j * rank..(j + 1) * rank]);
        }
    }
}

/// How `lora_expand` lays out one slot: the output slices' sizes, the rank, and whether
/// B is stored rank-major ((rank, out) per slot: the transposed view an engine keeps, read
/// in place) or as the contract states it ((out, rank) per slot: transposed first).
#[derive(Clone, Copy)]
pub struct Slices<'a> {
    pub sizes: &'a [usize],
    pub rank: usize,
    pub rank_major: bool,
}

/// The tokens of one slot through its B: `delta[j]` = scaling * B y[tokens[j]] over the
/// output rows (each slice reading its rank columns of y), from `bt`, B as (rank, out)
/// in the compute type: for each rank column k, its row of bt is added, times y's entry,
/// to every token's delta (contiguous multiply-adds, bt's row read once for the group).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn expand_slot_impl<E: Elem>(
    bt: &[E],
    y: &[E::C],
    width: usize,
    tokens: &[usize],
    scaling: E::C,
    layout: Slices<'_>,
    delta: &mut [E::C],
) {
    let rank = layout.rank;
    let out = bt.len() / rank.max(1);
    let mut start = 0;
    let mut wide = vec![E::C::ZERO; out];
    for (s, &size) in layout.sizes.iter().enumerate() {
        for k in 0..rank {
            let col = &bt[k * out + start..k * out + start + size];
            E::C::widen(col, &mut wide[..size]);
            for (j, &t) in tokens.iter().enumerate() {
                let vk = y[t * width + s * rank + k];
                let d = &mut delta[j * out + start..j * out + start + size];
                for (dst, &w) in d.iter_mut().zip(&wide[..size]) {
                    *dst = *dst + w * vk;
                }
            }
        }
        start += size;
    }
    for dst in delta.iter_mut() {
        *dst = *dst * scaling;
    }
}

multiversion! {
    #[allow(clippy::too_many_arguments)]
    fn expand_slot<E: Elem>(
        bt: &[E],
        y: &[E::C],
        width: usize,
        tokens: &[usize],
        scaling: E::C,
        layout: Slices<'_>,
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
/// rank), or (num_loras, rank, out) when `layout.rank_major`, scaling (num_loras,), slots
/// per token. Into `out` (tokens, out_features) of any type O: with `add`, out + delta
/// rounded to O for the tokens with a slot (the other rows untouched); without, delta
/// itself (O is the compute type, zeros for -1). The tokens are grouped by slot (in
/// token order), the slots in parallel for large batches.
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
    if !add {
        out.fill(O::store(O::C::ZERO));
    }
    if out_features == 0 || layout.rank == 0 || tokens == 0 {
        return;
    }
    let width = y.len() / tokens;
    let groups = group_by_slot(slots, scaling.len());
    let per_slot = out_features * layout.rank;
    let run = |(slot, members): (usize, &Vec<usize>)| -> Vec<E::C> {
        let mut delta = vec![E::C::ZERO; members.len() * out_features];
        if members.is_empty() {
            return delta;
        }
        let b = &lora_b[slot * per_slot..(slot + 1) * per_slot];
        if layout.rank_major {
            expand_slot(b, y, width, members, scaling[slot], layout, &mut delta);
        } else {
            let mut bt = Vec::with_capacity(per_slot);
            for k in 0..layout.rank {
                bt.extend((0..out_features).map(|o| b[o * layout.rank + k]));
            }
            expand_slot(&bt, y, width, members, scaling[slot], layout, &mut delta);
        }
        delta
    };
    let deltas: Vec<Vec<E::C>> = if tokens * per_slot >= PARALLEL {
        groups.par_iter().enumerate().map(run).collect()
    } else {
        groups.iter().enumerate().map(run).collect()
    };
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

/// lora_expand(y, lora_b, indices, scaling, out, output_slices, rank_major)
/// --
///
/// C-contiguous arrays: `y` (tokens, num_slices * rank) and `scaling` (num_loras,) in
/// lora_b's compute type, `lora_b` (num_loras, out_features, rank) of any float dtype
/// ((num_loras, rank, out_features) with `rank_major`),
/// `indices` int64 (tokens,) in [-1, num_loras), `out` None or (tokens, out_features)
/// of any float dtype (written in place), `output_slices` the sizes summing to
/// out_features. Returns out, or the delta in the compute type.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn lora_expand<'py>(
    py: Python<'py>,
    y: &Bound<'py, PyAny>,
    lora_b: &Bound<'py, PyAny>,
    indices: PyReadonlyArray1<'py, i64>,
    scaling: &Bound<'py, PyAny>,
    out: Option<&Bound<'py, PyAny>>,
    output_slices: Vec<usize>,
    rank_major: bool,
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
        let (mut bs, ys) = (ba.shape().to_vec(), ya.shape().to_vec());
        if rank_major && bs.len() == 3 {
            bs.swap(1, 2); // (num_loras, out, rank) from here on
        }
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
        let layout = Slices { sizes: &output_slices, rank: bs[2], rank_major };
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
            rank_major: false,
        };
        let mut out = [10.0f32; 9];
        expand_slices::<f64, f32>(&y, &b, &scaling, &slots, layout, true, &mut out);
        assert_eq!(out[3..6], [10.0, 10.0, 10.0]); // no adapter: untouched
        let want0 = 10.0 + 0.5 * b[3] * y[0]; // token 0, slot 1, row 0 reads slice 0
        let want2 = 10.0 + 0.5 * b[5] * y[1]; // row 2 is in slice 1
        assert!((out[0] as f64 - want0).abs() < 1e-4 && (out[2] as f64 - want2).abs() < 1e-4);
        // rank 1: the rank-major layout is the same memory
        let mut again = [10.0f32; 9];
        let rank_major = Slices {
            rank_major: true,
            ..layout
        };
        expand_slices::<f64, f32>(&y, &b, &scaling, &slots, rank_major, true, &mut again);
        assert_eq!(again, out);
    }

    #[test]
    fn rank_major_b_is_read_as_its_transpose() {
        // one slot, rank 2, 3 output rows; two tokens
        let b: Vec<f32> = (0..6).map(|i| i as f32 - 2.5).collect(); // (out 3, rank 2)
        let bt: Vec<f32> = (0..2)
            .flat_map(|k| (0..3).map(move |o| (o * 2 + k) as f32 - 2.5))
            .collect();
        let y = [1.0f32, -2.0, 0.5, 3.0];
        let (slots, scaling) = ([0i64, 0], [1.5f32]);
        let layout = Slices {
            sizes: &[3],
            rank: 2,
            rank_major: false,
        };
        let (mut row_major, mut rank_major) = ([0.0f32; 6], [0.0f32; 6]);
        expand_slices::<f32, f32>(&y, &b, &scaling, &slots, layout, false, &mut row_major);
        let transposed = Slices {
            rank_major: true,
            ..layout
        };
        expand_slices::<f32, f32>(
            &y,
            &bt,
            &scaling,
            &slots,
            transposed,
            false,
            &mut rank_major,
        );
        assert_eq!(row_major, rank_major);
        assert_eq!(row_major[0], 1.5 * (b[0] * y[0] + b[1] * y[1]));
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
