//! Kernels of `pyagent_accel.ops.sampling` and their Python bindings.
//!
//! Every op works row by row (rows in parallel with rayon, the GIL released) and first
//! validates the row like `pyagent_ref.ops._arrays.check_logits`: NaN or +inf, or a row
//! that is entirely -inf, is an error, reported for the lowest such row (NaN/+inf rows
//! first, as the reference checks them first).
//!
//! Exactness (see the Python module docstring for the user-facing statement):
//! temperature, top-k, penalties, logit bias, topk_logprobs, philox and sample use the
//! same operations in the same dtype as the reference and give identical bits / tokens.
//! min-p, top-p and log_softmax go through exp/log, whose last bit differs between libm,
//! numpy and torch; the decisions of min-p and top-p can therefore differ only within
//! the 1e-9 relative band the specification allows, and log_softmax is within a few ulp.

use numpy::{
    PyArray1, PyArray2, PyArrayMethods, PyReadonlyArray1, PyReadonlyArray2, PyUntypedArrayMethods,
};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use rayon::prelude::*;
use std::cell::RefCell;
use std::cmp::Ordering;

use crate::float::{multiversion, Float};
use crate::philox;

// ---------------------------------------------------------------------------------
// Row validation

#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub enum RowStatus {
    #[default]
    Ok,
    NanOrInf,
    AllMasked,
}

/// The error the reference raises for a batch of row statuses, if any.
pub fn first_error(st: &[RowStatus]) -> Option<(usize, RowStatus)> {
    if let Some(i) = st.iter().position(|s| *s == RowStatus::NanOrInf) {
        return Some((i, RowStatus::NanOrInf));
    }
    st.iter()
        .position(|s| *s == RowStatus::AllMasked)
        .map(|i| (i, RowStatus::AllMasked))
}

const L: usize = 16;

/// Validate a row and return its maximum (one vectorised pass).
#[inline(always)]
pub fn scan<T: Float>(row: &[T]) -> (RowStatus, T) {
    let mut mx = [T::NEG_INF; L];
    let mut bad = [0u8; L];
    let mut chunks = row.chunks_exact(L);
    for c in &mut chunks {
        for l in 0..L {
            let x = c[l];
            bad[l] |= (!(x < T::INF)) as u8;
            mx[l] = if x > mx[l] { x } else { mx[l] };
        }
    }
    let mut m = T::NEG_INF;
    let mut b = 0u8;
    for &x in chunks.remainder() {
        b |= (!(x < T::INF)) as u8;
        if x > m {
            m = x;
        }
    }
    for l in 0..L {
        b |= bad[l];
        if mx[l] > m {
            m = mx[l];
        }
    }
    let st = if b != 0 {
        RowStatus::NanOrInf
    } else if m == T::NEG_INF {
        RowStatus::AllMasked
    } else {
        RowStatus::Ok
    };
    (st, m)
}

/// Index of the first entry equal to `mx` (numpy/torch argmax: lowest index on ties).
#[inline(always)]
fn first_index_of<T: Float>(row: &[T], mx: T) -> usize {
    let mut base = 0;
    for c in row.chunks(64) {
        let mut hit = false;
        for &x in c {
            hit |= x == mx;
        }
        if hit {
            return base + c.iter().position(|&x| x == mx).unwrap_or(0);
        }
        base += c.len();
    }
    0
}

// ---------------------------------------------------------------------------------
// Selection helpers

#[inline(always)]
fn desc<T: Float>(a: &T, b: &T) -> Ordering {
    b.total_cmp(a)
}

/// The k-th largest value of `row` (1 <= k <= len), in IEEE terms: every x with
/// x >= result is among the k largest or tied with the k-th.
///
/// Small k (the common case) streams the row once, keeping only values >= a running
/// threshold in a buffer of a few k entries that is compacted with a selection when
/// it fills; large k, or rows with many ties at the threshold, select on a full copy.
/// Never sorts the row.
#[inline(always)]
pub fn kth_largest<T: Float>(row: &[T], k: usize, buf: &mut Vec<T>) -> T {
    let n = row.len();
    debug_assert!(k >= 1 && k <= n);
    let cap = (4 * k).max(512);
    let full = |buf: &mut Vec<T>| -> T {
        buf.clear();
        buf.extend_from_slice(row);
        *buf.select_nth_unstable_by(k - 1, desc).1
    };
    if cap >= n / 2 {
        return full(buf);
    }
    buf.clear();
    buf.reserve(cap + L);
    let mut tau = T::NEG_INF;
    let mut chunks = row.chunks_exact(L);
    for c in &mut chunks {
        let mut any = 0u8;
        for &x in c {
            any |= (x >= tau) as u8;
        }
        if any != 0 {
            for &x in c {
                if x >= tau {
                    buf.push(x);
                }
            }
            if buf.len() >= cap {
                tau = *buf.select_nth_unstable_by(k - 1, desc).1;
                buf.retain(|&x| x >= tau);
                if buf.len() > cap / 2 {
                    return full(buf);
                }
            }
        }
    }
    for &x in chunks.remainder() {
        if x >= tau {
            buf.push(x);
        }
    }
    *buf.select_nth_unstable_by(k - 1, desc).1
}

/// numpy's pairwise summation (`pairwise_sum` in loops_utils.h.src), which is what
/// `np.sum(x, axis=-1)` computes for a contiguous row: blocks of up to 128 summed with
/// 8 accumulators, halves split at multiples of 8.
#[inline(always)]
pub fn pairwise_sum<T: Float>(a: &[T]) -> T {
    let n = a.len();
    if n < 8 {
        let mut res = T::NEG_ZERO;
        for &x in a {
            res = res + x;
        }
        res
    } else if n <= 128 {
        let mut r = [T::ZERO; 8];
        r.copy_from_slice(&a[..8]);
        let end = n - n % 8;
        let mut i = 8;
        while i < end {
            for j in 0..8 {
                r[j] = r[j] + a[i + j];
            }
            i += 8;
        }
        let mut res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        while i < n {
            res = res + a[i];
            i += 1;
        }
        res
    } else {
        let mut n2 = n / 2;
        n2 -= n2 % 8;
        pairwise_sum(&a[..n2]) + pairwise_sum(&a[n2..])
    }
}

// ---------------------------------------------------------------------------------
// Per-thread scratch (reused across calls so large buffers are not re-faulted)

#[derive(Default)]
pub struct Scratch {
    probs: Vec<f64>,
    cands: Vec<f64>,
    keys: Vec<u16>,
    hist: Vec<f64>,
    counts: Vec<u64>,
    sums: Vec<f64>,
    touched: Vec<usize>,
}

impl Scratch {
    fn dense(&mut self, vocab: usize) {
        // counts/sums are all zero between uses; only grow them.
        if self.counts.len() < vocab {
            self.counts.resize(vocab, 0);
            self.sums.resize(vocab, 0.0);
        }
    }
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

fn with_scratch<R>(f: impl FnOnce(&mut Scratch) -> R) -> R {
    SCRATCH.with(|s| match s.try_borrow_mut() {
        Ok(mut s) => f(&mut s),
        Err(_) => f(&mut Scratch::default()),
    })
}

// ---------------------------------------------------------------------------------
// Row kernels

#[inline(always)]
fn temperature_row_impl<T: Float>(row: &[T], out: &mut [T], t: T) -> RowStatus {
    let (st, _) = scan(row);
    if st != RowStatus::Ok {
        return st;
    }
    let t = if t == T::ZERO { T::ONE } else { t };
    for (o, &x) in out.iter_mut().zip(row) {
        *o = x / t;
    }
    RowStatus::Ok
}

multiversion! {
    pub fn temperature_row<T>(row: &[T], out: &mut [T], t: T) -> RowStatus = temperature_row_impl;
}

#[inline(always)]
fn top_k_row_impl<T: Float>(row: &[T], out: &mut [T], k: i64, buf: &mut Vec<T>) -> RowStatus {
    let (st, _) = scan(row);
    if st != RowStatus::Ok {
        return st;
    }
    let n = row.len();
    if k <= 0 || k as u64 >= n as u64 {
        out.copy_from_slice(row);
        return RowStatus::Ok;
    }
    let kth = kth_largest(row, k as usize, buf);
    for (o, &x) in out.iter_mut().zip(row) {
        *o = if x >= kth { x } else { T::NEG_INF };
    }
    RowStatus::Ok
}

multiversion! {
    pub fn top_k_row<T>(row: &[T], out: &mut [T], k: i64, buf: &mut Vec<T>) -> RowStatus = top_k_row_impl;
}

#[inline(always)]
fn min_p_row_impl<T: Float>(row: &[T], out: &mut [T], min_p: f64) -> RowStatus {
    let (st, mx) = scan(row);
    if st != RowStatus::Ok {
        return st;
    }
    // masked iff exp(x - max) < min_p (float64). exp is monotone, so away from
    // d0 = ln(min_p) the comparison is decided by d = x - max alone; only entries within
    // a band of 1e-12 (far wider than exp's and ln's rounding) evaluate exp itself.
    if !(min_p > 0.0) {
        out.copy_from_slice(row);
        return RowStatus::Ok;
    }
    let m = mx.to_f64();
    let d0 = min_p.ln();
    if d0 < -700.0 {
        // exp(d) near min_p would be (sub)normal-edge: decide every entry with exp.
        for (o, &x) in out.iter_mut().zip(row) {
            let d = x.to_f64() - m;
            *o = if d.exp() < min_p { T::NEG_INF } else { x };
        }
        return RowStatus::Ok;
    }
    let delta = 1e-12 * (1.0 + d0.abs());
    let (lo, hi) = (d0 - delta, d0 + delta);
    for (oc, xc) in out.chunks_mut(64).zip(row.chunks(64)) {
        let mut band = 0u8;
        for (o, &x) in oc.iter_mut().zip(xc) {
            let d = x.to_f64() - m;
            band |= ((d >= lo) & (d <= hi)) as u8;
            *o = if d < lo { T::NEG_INF } else { x };
        }
        if band != 0 {
            for (o, &x) in oc.iter_mut().zip(xc) {
                let d = x.to_f64() - m;
                if d >= lo && d <= hi {
                    *o = if d.exp() < min_p { T::NEG_INF } else { x };
                }
            }
        }
    }
    RowStatus::Ok
}

multiversion! {
    pub fn min_p_row<T>(row: &[T], out: &mut [T], min_p: f64) -> RowStatus = min_p_row_impl;
}

const NB: usize = 1024; // top-p histogram: 16 buckets per binade, 64 binades below max

/// The probability threshold t of `apply_top_p` for probabilities `probs` (in any
/// order): t = the m-th largest probability, m = the smallest count whose descending
/// cumulative sum reaches p; None when the whole row does not reach p (keep all).
///
/// Instead of sorting: a histogram of the mass over the top bits of the f64 (monotone
/// for non-negative doubles: 16 buckets per binade, 64 binades below the max) finds
/// the bucket where the cumulative mass crosses p, and a quickselect on mass resolves
/// the exact element inside that bucket.
#[inline(always)]
pub fn top_p_threshold(
    probs: &[f64],
    pmax: f64,
    p: f64,
    keys: &mut Vec<u16>,
    hist: &mut Vec<f64>,
    cands: &mut Vec<f64>,
) -> Option<f64> {
    let kmax = pmax.to_bits() >> 48;
    // bucket 0 holds the largest probabilities; everything 64 binades below the max
    // shares the last bucket
    keys.resize(probs.len(), 0);
    for (k, &v) in keys.iter_mut().zip(probs) {
        let key = (v.to_bits() >> 48).min(kmax);
        *k = (kmax - key).min(NB as u64 - 1) as u16;
    }
    // four interleaved histograms break the store-to-load dependency of runs of
    // entries falling into the same bucket
    hist.clear();
    hist.resize(4 * NB, 0.0);
    let mut kc = keys.chunks_exact(4);
    let mut pc = probs.chunks_exact(4);
    for (k, v) in (&mut kc).zip(&mut pc) {
        hist[k[0] as usize] += v[0];
        hist[NB + k[1] as usize] += v[1];
        hist[2 * NB + k[2] as usize] += v[2];
        hist[3 * NB + k[3] as usize] += v[3];
    }
    for (&k, &v) in kc.remainder().iter().zip(pc.remainder()) {
        hist[k as usize] += v;
    }
    let mut acc = 0.0;
    for b in 0..NB {
        let mass = (hist[b] + hist[NB + b]) + (hist[2 * NB + b] + hist[3 * NB + b]);
        if acc + mass >= p {
            // the bucket's range of values: [lo, hi)
            let hi = f64::from_bits((kmax - b as u64 + 1) << 48);
            let lo = if b == NB - 1 {
                -1.0
            } else {
                f64::from_bits((kmax - b as u64) << 48)
            };
            cands.clear();
            for c in probs.chunks(L) {
                let mut any = 0u8;
                for &v in c {
                    any |= ((v >= lo) & (v < hi)) as u8;
                }
                if any != 0 {
                    cands.extend(c.iter().copied().filter(|&v| v >= lo && v < hi));
                }
            }
            match mass_select(cands, acc, p) {
                Ok(t) => return Some(t),
                Err(a) => {
                    acc = a;
                    continue;
                }
            }
        }
        acc += mass;
    }
    None
}

/// Walk `v` in descending order adding to `acc` until the sum reaches p; the value at
/// which it does (Ok), or the final sum (Err). Quickselect on mass: expected O(len).
fn mass_select(v: &mut [f64], mut acc: f64, p: f64) -> Result<f64, f64> {
    let mut v = v;
    loop {
        let n = v.len();
        if n <= 32 {
            v.sort_unstable_by(|a, b| b.total_cmp(a));
            for &x in v.iter() {
                acc += x;
                if acc >= p {
                    return Ok(x);
                }
            }
            return Err(acc);
        }
        let (a, b, c) = (v[0], v[n / 2], v[n - 1]);
        let pivot = if (a >= b) == (b >= c) {
            b
        } else if (b >= a) == (a >= c) {
            a
        } else {
            c
        };
        // three-way partition: [> pivot][== pivot][< pivot]
        let (mut lt, mut i, mut gt) = (0, 0, n);
        while i < gt {
            let x = v[i];
            if x > pivot {
                v.swap(lt, i);
                lt += 1;
                i += 1;
            } else if x < pivot {
                gt -= 1;
                v.swap(i, gt);
            } else {
                i += 1;
            }
        }
        let mass_hi: f64 = v[..lt].iter().sum();
        if acc + mass_hi >= p {
            v = &mut v[..lt];
            continue;
        }
        let mass_eq: f64 = v[lt..gt].iter().sum();
        if acc + mass_hi + mass_eq >= p {
            return Ok(pivot);
        }
        acc += mass_hi + mass_eq;
        v = &mut v[gt..];
    }
}

#[inline(always)]
fn top_p_row_impl<T: Float>(row: &[T], out: &mut [T], p: f64, sc: &mut Scratch) -> RowStatus {
    let (st, mx) = scan(row);
    if st != RowStatus::Ok {
        return st;
    }
    if !(p < 1.0) {
        out.copy_from_slice(row);
        return RowStatus::Ok;
    }
    // probs = softmax in float64, as the reference: e = exp(x - max), e / sum(e)
    let m = mx.to_f64();
    let Scratch {
        probs,
        cands,
        keys,
        hist,
        ..
    } = sc;
    probs.resize(row.len(), 0.0);
    for (e, &x) in probs.iter_mut().zip(row) {
        *e = crate::float::exp_f64(x.to_f64() - m);
    }
    let s = pairwise_sum(probs);
    for v in probs.iter_mut() {
        *v /= s;
    }
    let pmax = 1.0 / s; // the max entry has e == 1 exactly
    match top_p_threshold(probs, pmax, p, keys, hist, cands) {
        None => out.copy_from_slice(row),
        Some(t) => {
            for ((o, &x), &q) in out.iter_mut().zip(row).zip(probs.iter()) {
                *o = if q >= t { x } else { T::NEG_INF };
            }
        }
    }
    RowStatus::Ok
}

multiversion! {
    pub fn top_p_row<T>(row: &[T], out: &mut [T], p: f64, sc: &mut Scratch) -> RowStatus = top_p_row_impl;
}

const PROMPT_BIT: u64 = 1 << 63;

#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn penalties_row_impl<T: Float>(
    row: &[T],
    out: &mut [T],
    prompt: &[i64],
    output: &[i64],
    r: T,
    f: T,
    q: T,
    sc: &mut Scratch,
) -> RowStatus {
    let (st, _) = scan(row);
    if st != RowStatus::Ok {
        return st;
    }
    let n = row.len();
    sc.dense(n);
    // Tokens that never appeared: x - f * 0 - q * 0, exactly as the reference computes
    // it (this turns -0.0 into +0.0 when f or q is negative).
    let (fz, qz) = (f * T::ZERO, q * T::ZERO);
    if fz.is_pos_zero() && qz.is_pos_zero() {
        out.copy_from_slice(row);
    } else {
        for (o, &x) in out.iter_mut().zip(row) {
            *o = (x - fz) - qz;
        }
    }
    // Per-row histogram of the output ids; bit 63 marks "seen in the prompt".
    let Scratch {
        counts, touched, ..
    } = sc;
    touched.clear();
    for &id in output {
        if id >= 0 && (id as u64) < n as u64 {
            let i = id as usize;
            if counts[i] == 0 {
                touched.push(i);
            }
            counts[i] += 1;
        }
    }
    for &id in prompt {
        if id >= 0 && (id as u64) < n as u64 {
            let i = id as usize;
            if counts[i] == 0 {
                touched.push(i);
            }
            counts[i] |= PROMPT_BIT;
        }
    }
    for &i in touched.iter() {
        let c = counts[i] & !PROMPT_BIT;
        counts[i] = 0;
        let x = row[i];
        let mut y = if x > T::ZERO { x / r } else { x * r };
        y = y - f * T::from_count(c);
        y = y - q * (if c > 0 { T::ONE } else { T::ZERO });
        out[i] = y;
    }
    touched.clear();
    RowStatus::Ok
}

multiversion! {
    #[allow(clippy::too_many_arguments)]
    pub fn penalties_row<T>(row: &[T], out: &mut [T], prompt: &[i64], output: &[i64], r: T, f: T, q: T, sc: &mut Scratch) -> RowStatus = penalties_row_impl;
}

#[inline(always)]
fn logit_bias_row_impl<T: Float>(
    row: &[T],
    out: &mut [T],
    ids: &[i64],
    bias: &[f64],
    sc: &mut Scratch,
) -> RowStatus {
    let (st, _) = scan(row);
    if st != RowStatus::Ok {
        return st;
    }
    let n = row.len();
    sc.dense(n);
    // float64(x) + 0.0 rounded back is x, except -0.0 -> +0.0: x + 0 in T gives the same.
    for (o, &x) in out.iter_mut().zip(row) {
        *o = x + T::ZERO;
    }
    // bincount with weights: per token, 0.0 + b_j1 + b_j2 + ... in the order of j.
    let Scratch {
        counts,
        sums,
        touched,
        ..
    } = sc;
    touched.clear();
    for (&id, &b) in ids.iter().zip(bias) {
        if id >= 0 && (id as u64) < n as u64 {
            let i = id as usize;
            if counts[i] == 0 {
                counts[i] = 1;
                touched.push(i);
            }
            sums[i] += b;
        }
    }
    for &i in touched.iter() {
        out[i] = T::from_f64(row[i].to_f64() + sums[i]);
        counts[i] = 0;
        sums[i] = 0.0;
    }
    touched.clear();
    RowStatus::Ok
}

multiversion! {
    pub fn logit_bias_row<T>(row: &[T], out: &mut [T], ids: &[i64], bias: &[f64], sc: &mut Scratch) -> RowStatus = logit_bias_row_impl;
}

#[inline(always)]
fn log_softmax_row_impl<T: Float>(row: &[T], out: &mut [T]) -> RowStatus {
    let (st, mx) = scan(row);
    if st != RowStatus::Ok {
        return st;
    }
    for (o, &x) in out.iter_mut().zip(row) {
        *o = (x - mx).exp_fast();
    }
    let lse = pairwise_sum(out).ln_();
    for (o, &x) in out.iter_mut().zip(row) {
        *o = (x - mx) - lse;
    }
    RowStatus::Ok
}

multiversion! {
    pub fn log_softmax_row<T>(row: &[T], out: &mut [T]) -> RowStatus = log_softmax_row_impl;
}

/// (values, ids, sampled logprob, rank) of one row of `topk_logprobs`.
#[inline(always)]
#[allow(clippy::type_complexity)]
fn topk_logprobs_row_impl<T: Float>(
    row: &[T],
    num: usize,
    sampled: i64,
    vals: &mut [T],
    ids: &mut [i64],
    buf: &mut Vec<T>,
) -> Result<(T, i64), RowStatus> {
    let (st, _) = scan(row);
    if st != RowStatus::Ok {
        return Err(st);
    }
    let chosen = row[sampled as usize];
    let mut above = [0u32; L];
    let mut chunks = row.chunks_exact(L);
    for c in &mut chunks {
        for l in 0..L {
            above[l] += (c[l] > chosen) as u32;
        }
    }
    let mut rank: i64 = 1 + chunks.remainder().iter().filter(|&&x| x > chosen).count() as i64;
    rank += above.iter().map(|&a| a as i64).sum::<i64>();
    if num > 0 {
        let kth = kth_largest(row, num, buf);
        let mut top: Vec<(T, usize)> = row
            .iter()
            .enumerate()
            .filter(|(_, &x)| x >= kth)
            .map(|(i, &x)| (x, i))
            .collect();
        // value descending (IEEE: -0.0 ties with 0.0), then lower token id
        let cmp = |a: &(T, usize), b: &(T, usize)| {
            b.0.partial_cmp(&a.0)
                .unwrap_or(Ordering::Equal)
                .then(a.1.cmp(&b.1))
        };
        if top.len() > num {
            top.select_nth_unstable_by(num - 1, cmp);
            top.truncate(num);
        }
        top.sort_unstable_by(cmp);
        for (j, &(x, i)) in top.iter().enumerate() {
            vals[j] = x;
            ids[j] = i as i64;
        }
    }
    Ok((chosen, rank))
}

multiversion! {
    pub fn topk_logprobs_row<T>(row: &[T], num: usize, sampled: i64, vals: &mut [T], ids: &mut [i64], buf: &mut Vec<T>) -> Result<(T, i64), RowStatus> = topk_logprobs_row_impl;
}

const LN2: f64 = std::f64::consts::LN_2;
const TWO_M52: f64 = 1.0 / 4_503_599_627_370_496.0;

/// One row of `sample`: the exponential race, argmax_i x_i - ln(-ln(u_i)) in float64,
/// lowest index on ties, with u from `philox`; or argmax x for a greedy row.
///
/// Exact without two logs per entry: score_i <= x_i - ln(1 - u_i) <= x_i - lb_i ln 2,
/// where lb_i <= log2(1 - u_i) is read off the bits of 1 - u_i (exponent plus
/// mantissa - 1: the chord of log2 on [1, 2) lies below it). An entry is scored exactly (with libm,
/// as the reference) only if that upper bound reaches the best exact score so far; the
/// bound is slackened by 1e-9 so that rounding can never exclude the true maximum.
/// With a running best this scores O(log vocab) entries per row.
#[inline(always)]
fn sample_row_impl<T: Float>(
    row: &[T],
    temperature: f64,
    seed: i64,
    pos: i64,
) -> Result<i64, RowStatus> {
    let (st, mx) = scan(row);
    if st != RowStatus::Ok {
        return Err(st);
    }
    if temperature == 0.0 {
        return Ok(first_index_of(row, mx) as i64);
    }
    let key = philox::seed_key(seed);
    let pos = pos as u64;
    const C: usize = 2 * philox::LANES;
    let mut m = [0u64; C];
    let mut xs = [0f64; C];
    let mut ub = [0f64; C];
    let mut best = f64::NEG_INFINITY;
    let mut best_i = usize::MAX;
    for (ci, chunk) in row.chunks(C).enumerate() {
        philox::mantissas(key, pos, (ci * philox::LANES) as u64, &mut m);
        if chunk.len() == C {
            for l in 0..C {
                xs[l] = chunk[l].to_f64();
            }
        } else {
            xs = [f64::NEG_INFINITY; C];
            for (l, &x) in chunk.iter().enumerate() {
                xs[l] = x.to_f64();
            }
        }
        let mut any = 0u8;
        for l in 0..C {
            let v = 1.0 - philox::uniform(m[l]); // exact
                                                 // bits(v) / 2**52 - 1023 = exponent + (mantissa - 1) <= log2(v); the i64 ->
                                                 // f64 rounding (< 2**-42 here) is far inside the 1e-9 slack
            let lb = (v.to_bits() as i64 as f64) * TWO_M52 - 1023.0;
            ub[l] = xs[l] - (lb * LN2 - 1e-9);
            any |= (ub[l] >= best) as u8;
        }
        if any != 0 {
            let base = ci * C;
            for l in 0..chunk.len() {
                if ub[l] >= best {
                    let u = philox::uniform(m[l]);
                    let s = xs[l] - (-(u.ln())).ln();
                    if s > best {
                        best = s;
                        best_i = base + l;
                    }
                }
            }
        }
    }
    if best_i == usize::MAX {
        // unreachable for a validated row (some entry is finite); stay total anyway
        best_i = first_index_of(row, mx);
    }
    Ok(best_i as i64)
}

multiversion! {
    pub fn sample_row<T>(row: &[T], temperature: f64, seed: i64, pos: i64) -> Result<i64, RowStatus> = sample_row_impl;
}

// ---------------------------------------------------------------------------------
// Python bindings

fn value_error(msg: impl Into<String>) -> PyErr {
    PyValueError::new_err(msg.into())
}

fn row_error(name: &str, row: usize, st: RowStatus) -> PyErr {
    match st {
        RowStatus::NanOrInf => value_error(format!("{name} row {row} contains NaN or +inf")),
        _ => value_error(format!("{name} row {row} is entirely -inf")),
    }
}

fn raise_rows(st: &[RowStatus], name: &str) -> PyResult<()> {
    match first_error(st) {
        Some((row, s)) => Err(row_error(name, row, s)),
        None => Ok(()),
    }
}

fn slice<'a, T: numpy::Element, D: numpy::ndarray::Dimension>(
    a: &'a numpy::PyReadonlyArray<'_, T, D>,
    name: &str,
) -> PyResult<&'a [T]> {
    a.as_slice()
        .map_err(|_| value_error(format!("{name} must be a C-contiguous array")))
}

/// (batch, vocab) of a logits array, rejecting an empty vocab axis.
fn dims2<T: numpy::Element>(x: &PyReadonlyArray2<'_, T>, name: &str) -> PyResult<(usize, usize)> {
    let s = x.shape();
    if s[1] == 0 {
        return Err(value_error(format!(
            "{name} must have a non-empty vocab axis, got shape ({}, {})",
            s[0], s[1]
        )));
    }
    Ok((s[0], s[1]))
}

fn param<'a, T: numpy::Element>(
    a: &'a PyReadonlyArray1<'_, T>,
    batch: usize,
    name: &str,
) -> PyResult<&'a [T]> {
    let s = slice(a, name)?;
    if s.len() != batch {
        return Err(value_error(format!(
            "{name} must have shape ({batch},) to match the batch, got shape ({},)",
            s.len()
        )));
    }
    Ok(s)
}

/// A fresh, uninitialised (batch, vocab) output array, allocated by numpy (which asks
/// for huge pages for big arrays); allocation failure is a Python MemoryError.
fn new_out<'py, T: Float>(
    py: Python<'py>,
    b: usize,
    v: usize,
) -> PyResult<Bound<'py, PyArray2<T>>> {
    use numpy::npyffi::{get_type_object, npy_intp, NpyTypes, PY_ARRAY_API};
    use numpy::PyArrayDescrMethods;
    let mut dims = [b as npy_intp, v as npy_intp];
    // SAFETY: the documented PyArray_NewFromDescr call (steals the descr reference);
    // a NULL result becomes the pending Python error. Every element is written before
    // the array reaches Python (rows failing validation make the call raise instead).
    unsafe {
        let ptr = PY_ARRAY_API.PyArray_NewFromDescr(
            py,
            get_type_object(py, NpyTypes::PyArray_Type),
            T::get_dtype(py).into_dtype_ptr(),
            2,
            dims.as_mut_ptr(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            0,
            std::ptr::null_mut(),
        );
        Ok(Bound::from_owned_ptr_or_err(py, ptr)?.cast_into_unchecked())
    }
}

/// Run `f` without the GIL; a panic (a bug: inputs are validated first) becomes a
/// RuntimeError instead of unwinding into Python.
pub fn detached<R: Send, F: FnOnce() -> R + Send>(py: Python<'_>, f: F) -> PyResult<R> {
    py.detach(|| std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)))
        .map_err(|_| {
            pyo3::exceptions::PyRuntimeError::new_err(
                "internal error in pyagent_accel (a Rust panic); please report it",
            )
        })
}

/// Small inputs (under ~0.1 ms of work) run on the calling thread: handing them to
/// the pool costs more than it saves, and much more on a busy machine.
fn sequential(batch: usize, vocab: usize) -> bool {
    batch <= 1 || batch.saturating_mul(vocab) < 1 << 18
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

/// `f(row index, row)` for every row, in parallel for large inputs.
fn par_rows<T: Float, R: Send, F>(rows: &[&[T]], v: usize, f: F) -> Vec<R>
where
    F: Fn(usize, &[T]) -> R + Sync + Send,
{
    if sequential(rows.len(), v) {
        rows.iter().enumerate().map(|(i, r)| f(i, r)).collect()
    } else {
        rows.par_iter().enumerate().map(|(i, r)| f(i, r)).collect()
    }
}

/// Run `f(row index, row, out row)` over all rows in parallel without the GIL.
fn map_rows<'py, T: Float, F>(
    py: Python<'py>,
    x: &PyReadonlyArray2<'py, T>,
    name: &str,
    f: F,
) -> PyResult<Bound<'py, PyArray2<T>>>
where
    F: Fn(usize, &[T], &mut [T]) -> RowStatus + Sync + Send,
{
    let (b, v) = dims2(x, name)?;
    let rows = row_slices(x, name)?;
    let out = new_out::<T>(py, b, v)?;
    {
        let mut w = out.readwrite();
        let os = w
            .as_slice_mut()
            .map_err(|_| value_error("internal: output not contiguous"))?;
        let st: Vec<RowStatus> = detached(py, || {
            if sequential(b, v) {
                os.chunks_mut(v)
                    .zip(rows.iter())
                    .enumerate()
                    .map(|(i, (o, r))| f(i, r, o))
                    .collect()
            } else {
                os.par_chunks_mut(v)
                    .zip(rows.par_iter())
                    .enumerate()
                    .map(|(i, (o, r))| f(i, r, o))
                    .collect()
            }
        })?;
        raise_rows(&st, name)?;
    }
    Ok(out)
}

/// logits as f32 or f64, dispatched to the generic implementation.
#[derive(FromPyObject)]
enum Logits<'py> {
    F32(PyReadonlyArray2<'py, f32>),
    F64(PyReadonlyArray2<'py, f64>),
}

fn not_float(name: &str) -> PyErr {
    PyTypeError::new_err(format!(
        "{name} must be a float32 or float64 numpy array of shape (batch, vocab)"
    ))
}

fn logits<'py>(x: &Bound<'py, PyAny>, name: &str) -> PyResult<Logits<'py>> {
    x.extract::<Logits<'py>>().map_err(|_| not_float(name))
}

macro_rules! dispatch {
    ($x:expr, $name:expr, |$a:ident : $T:ident| $body:expr) => {
        match logits($x, $name)? {
            Logits::F32($a) => {
                #[allow(dead_code)]
                type $T = f32;
                $body
            }
            Logits::F64($a) => {
                #[allow(dead_code)]
                type $T = f64;
                $body
            }
        }
    };
}

fn check_rows<T: Float>(py: Python<'_>, x: &PyReadonlyArray2<'_, T>, name: &str) -> PyResult<()> {
    let (_, v) = dims2(x, name)?;
    let rows = row_slices(x, name)?;
    let st: Vec<RowStatus> = detached(py, || par_rows(&rows, v, |_, r| scan_mv(r)))?;
    raise_rows(&st, name)
}

#[inline(always)]
fn scan_status<T: Float>(row: &[T]) -> RowStatus {
    scan(row).0
}

multiversion! {
    fn scan_mv<T>(row: &[T]) -> RowStatus = scan_status;
}

/// check_logits(x, name): the row checks of the reference's check_logits.
#[pyfunction]
fn check_logits(py: Python<'_>, x: &Bound<'_, PyAny>, name: &str) -> PyResult<()> {
    dispatch!(x, name, |a: T| check_rows::<T>(py, &a, name))
}

/// first_bad(values, kind, bound): index of the first entry failing `kind`, or -1.
#[pyfunction]
fn first_bad(values: &Bound<'_, PyAny>, kind: &str, bound: i64) -> PyResult<i64> {
    fn find<T: Copy>(s: &[T], bad: impl Fn(T) -> bool) -> i64 {
        s.iter().position(|&v| bad(v)).map_or(-1, |i| i as i64)
    }
    fn float_kind(kind: &str) -> PyResult<fn(f64) -> bool> {
        Ok(match kind {
            "finite_nonneg" => |t| !(t.is_finite() && t >= 0.0),
            "unit_open_closed" => |p| !(p > 0.0 && p <= 1.0),
            "unit_closed" => |p| !((0.0..=1.0).contains(&p)),
            "finite_pos" => |r| !(r.is_finite() && r > 0.0),
            "finite" => |f| !f.is_finite(),
            _ => return Err(value_error(format!("unknown check {kind:?}"))),
        })
    }
    if let Ok(a) = values.extract::<PyReadonlyArray1<'_, f64>>() {
        let bad = float_kind(kind)?;
        return Ok(find(slice(&a, "values")?, bad));
    }
    if let Ok(a) = values.extract::<PyReadonlyArray1<'_, f32>>() {
        let bad = float_kind(kind)?;
        return Ok(find(slice(&a, "values")?, |v: f32| bad(v as f64)));
    }
    if let Ok(a) = values.extract::<PyReadonlyArray1<'_, i64>>() {
        let s = slice(&a, "values")?;
        return match kind {
            "nonneg" => Ok(find(s, |v| v < 0)),
            "index" => Ok(find(s, |v| v < 0 || v >= bound)),
            _ => Err(value_error(format!("unknown check {kind:?}"))),
        };
    }
    Err(PyTypeError::new_err(
        "values must be a 1-D float32, float64 or int64 array",
    ))
}

#[pyfunction]
fn apply_temperature<'py>(
    py: Python<'py>,
    logits_: &Bound<'py, PyAny>,
    temperature: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    dispatch!(logits_, "logits", |x: T| {
        let t = temperature.extract::<PyReadonlyArray1<'py, T>>()?;
        let ts = param(&t, x.shape()[0], "temperature")?;
        Ok(map_rows(py, &x, "logits", |i, r, o| temperature_row(r, o, ts[i]))?.into_any())
    })
}

#[pyfunction]
fn apply_top_k<'py>(
    py: Python<'py>,
    logits_: &Bound<'py, PyAny>,
    k: PyReadonlyArray1<'py, i64>,
) -> PyResult<Bound<'py, PyAny>> {
    dispatch!(logits_, "logits", |x: T| {
        let ks = param(&k, x.shape()[0], "k")?;
        Ok(map_rows(py, &x, "logits", |i, r, o| {
            let mut buf = Vec::new();
            top_k_row(r, o, ks[i], &mut buf)
        })?
        .into_any())
    })
}

#[pyfunction]
fn apply_top_p<'py>(
    py: Python<'py>,
    logits_: &Bound<'py, PyAny>,
    p: PyReadonlyArray1<'py, f64>,
) -> PyResult<Bound<'py, PyAny>> {
    dispatch!(logits_, "logits", |x: T| {
        let ps = param(&p, x.shape()[0], "p")?;
        Ok(map_rows(py, &x, "logits", |i, r, o| {
            with_scratch(|sc| top_p_row(r, o, ps[i], sc))
        })?
        .into_any())
    })
}

#[pyfunction]
fn apply_min_p<'py>(
    py: Python<'py>,
    logits_: &Bound<'py, PyAny>,
    min_p: PyReadonlyArray1<'py, f64>,
) -> PyResult<Bound<'py, PyAny>> {
    dispatch!(logits_, "logits", |x: T| {
        let ms = param(&min_p, x.shape()[0], "min_p")?;
        Ok(map_rows(py, &x, "logits", |i, r, o| min_p_row(r, o, ms[i]))?.into_any())
    })
}

/// (batch, n) int64 ids as rows, checked against the vocab.
fn id_rows<'a>(
    a: &'a PyReadonlyArray2<'_, i64>,
    batch: usize,
    vocab: usize,
    name: &str,
) -> PyResult<(&'a [i64], usize)> {
    let s = a.shape();
    if s[0] != batch {
        return Err(value_error(format!(
            "{name} must have shape ({batch}, n), got shape ({}, {})",
            s[0], s[1]
        )));
    }
    let data = slice(a, name)?;
    if let Some(&mx) = data.iter().max() {
        if mx >= 0 && mx as u64 >= vocab as u64 {
            return Err(value_error(format!(
                "{name} holds token id {mx}, outside the vocab of {vocab}"
            )));
        }
    }
    Ok((data, s[1]))
}

fn row_of(data: &[i64], width: usize, i: usize) -> &[i64] {
    &data[i * width..(i + 1) * width]
}

#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn apply_penalties<'py>(
    py: Python<'py>,
    logits_: &Bound<'py, PyAny>,
    prompt_ids: PyReadonlyArray2<'py, i64>,
    output_ids: PyReadonlyArray2<'py, i64>,
    repetition_penalty: &Bound<'py, PyAny>,
    frequency_penalty: &Bound<'py, PyAny>,
    presence_penalty: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    dispatch!(logits_, "logits", |x: T| {
        let (b, v) = dims2(&x, "logits")?;
        let (pd, pw) = id_rows(&prompt_ids, b, v, "prompt_ids")?;
        let (od, ow) = id_rows(&output_ids, b, v, "output_ids")?;
        let r = repetition_penalty.extract::<PyReadonlyArray1<'py, T>>()?;
        let f = frequency_penalty.extract::<PyReadonlyArray1<'py, T>>()?;
        let q = presence_penalty.extract::<PyReadonlyArray1<'py, T>>()?;
        let (rs, fs, qs) = (
            param(&r, b, "repetition_penalty")?,
            param(&f, b, "frequency_penalty")?,
            param(&q, b, "presence_penalty")?,
        );
        Ok(map_rows(py, &x, "logits", |i, row, o| {
            with_scratch(|sc| {
                penalties_row(
                    row,
                    o,
                    row_of(pd, pw, i),
                    row_of(od, ow, i),
                    rs[i],
                    fs[i],
                    qs[i],
                    sc,
                )
            })
        })?
        .into_any())
    })
}

#[pyfunction]
fn apply_logit_bias<'py>(
    py: Python<'py>,
    logits_: &Bound<'py, PyAny>,
    token_ids: PyReadonlyArray2<'py, i64>,
    bias: PyReadonlyArray2<'py, f64>,
) -> PyResult<Bound<'py, PyAny>> {
    dispatch!(logits_, "logits", |x: T| {
        let (b, v) = dims2(&x, "logits")?;
        let (id, w) = id_rows(&token_ids, b, v, "token_ids")?;
        if bias.shape() != token_ids.shape() {
            return Err(value_error("bias must have the shape of token_ids"));
        }
        let bs = slice(&bias, "bias")?;
        Ok(map_rows(py, &x, "logits", |i, row, o| {
            with_scratch(|sc| logit_bias_row(row, o, row_of(id, w, i), &bs[i * w..(i + 1) * w], sc))
        })?
        .into_any())
    })
}

#[pyfunction]
fn log_softmax<'py>(py: Python<'py>, logits_: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    dispatch!(logits_, "logits", |x: T| {
        Ok(map_rows(py, &x, "logits", |_, r, o| log_softmax_row(r, o))?.into_any())
    })
}

type TopkOut<'py> = (
    Bound<'py, PyAny>,
    Bound<'py, PyArray2<i64>>,
    Bound<'py, PyAny>,
    Bound<'py, PyArray1<i64>>,
);

fn topk_logprobs_t<'py, T: Float>(
    py: Python<'py>,
    x: &PyReadonlyArray2<'py, T>,
    num: usize,
    sampled: &PyReadonlyArray1<'py, i64>,
) -> PyResult<TopkOut<'py>> {
    let (b, v) = dims2(x, "logprobs")?;
    if num > v {
        return Err(value_error(format!("num must be in [0, {v}], got {num}")));
    }
    let ss = param(sampled, b, "sampled")?;
    if let Some(i) = ss.iter().position(|&s| s < 0 || s as u64 >= v as u64) {
        return Err(value_error(format!(
            "sampled[{i}] must be a token id in [0, {v}), got {}",
            ss[i]
        )));
    }
    let rows = row_slices(x, "logprobs")?;
    type Row<T> = Result<(Vec<T>, Vec<i64>, T, i64), RowStatus>;
    let res: Vec<Row<T>> = detached(py, || {
        par_rows(&rows, v, |i, r| {
            let (mut vals, mut ids, mut buf) = (vec![T::ZERO; num], vec![0i64; num], Vec::new());
            topk_logprobs_row(r, num, ss[i], &mut vals, &mut ids, &mut buf)
                .map(|(c, k)| (vals, ids, c, k))
        })
    })?;
    let st: Vec<RowStatus> = res
        .iter()
        .map(|r| r.as_ref().err().copied().unwrap_or_default())
        .collect();
    raise_rows(&st, "logprobs")?;
    let (mut vals, mut ids) = (Vec::with_capacity(b * num), Vec::with_capacity(b * num));
    let (mut chosen, mut ranks) = (Vec::with_capacity(b), Vec::with_capacity(b));
    for (va, id, c, k) in res.into_iter().flatten() {
        vals.extend(va);
        ids.extend(id);
        chosen.push(c);
        ranks.push(k);
    }
    let shape = [b, num];
    let vals = PyArray1::from_vec(py, vals).reshape(shape)?;
    let ids = PyArray1::from_vec(py, ids).reshape(shape)?;
    Ok((
        vals.into_any(),
        ids,
        PyArray1::from_vec(py, chosen).into_any(),
        PyArray1::from_vec(py, ranks),
    ))
}

#[pyfunction]
fn topk_logprobs<'py>(
    py: Python<'py>,
    logprobs: &Bound<'py, PyAny>,
    num: usize,
    sampled: PyReadonlyArray1<'py, i64>,
) -> PyResult<TopkOut<'py>> {
    dispatch!(logprobs, "logprobs", |x: T| topk_logprobs_t::<T>(
        py, &x, num, &sampled
    ))
}

#[pyfunction]
fn sample<'py>(
    py: Python<'py>,
    logits_: &Bound<'py, PyAny>,
    temperature: PyReadonlyArray1<'py, f64>,
    seeds: PyReadonlyArray1<'py, i64>,
    positions: PyReadonlyArray1<'py, i64>,
) -> PyResult<Bound<'py, PyArray1<i64>>> {
    dispatch!(logits_, "logits", |x: T| {
        let (b, v) = dims2(&x, "logits")?;
        let ts = param(&temperature, b, "temperature")?;
        let ss = param(&seeds, b, "seeds")?;
        let ps = param(&positions, b, "positions")?;
        let rows = row_slices(&x, "logits")?;
        let res: Vec<Result<i64, RowStatus>> = detached(py, || {
            par_rows(&rows, v, |i, r| sample_row::<T>(r, ts[i], ss[i], ps[i]))
        })?;
        let st: Vec<RowStatus> = res.iter().map(|r| r.err().unwrap_or_default()).collect();
        raise_rows(&st, "logits")?;
        let tokens: Vec<i64> = res.into_iter().map(|r| r.unwrap_or(0)).collect();
        Ok(PyArray1::from_vec(py, tokens))
    })
}

#[pyfunction]
fn philox_uniform<'py>(
    py: Python<'py>,
    seeds: PyReadonlyArray1<'py, i64>,
    positions: PyReadonlyArray1<'py, i64>,
    num: usize,
) -> PyResult<Bound<'py, PyArray2<f64>>> {
    let ss = slice(&seeds, "seeds")?;
    let b = ss.len();
    let ps = param(&positions, b, "positions")?;
    let out = new_out::<f64>(py, b, num)?;
    if num > 0 {
        let mut w = out.readwrite();
        let os = w
            .as_slice_mut()
            .map_err(|_| value_error("internal: output not contiguous"))?;
        detached(py, || {
            if sequential(b, num) {
                os.chunks_mut(num)
                    .enumerate()
                    .for_each(|(i, o)| philox::fill_uniforms(ss[i], ps[i], o))
            } else {
                os.par_chunks_mut(num)
                    .enumerate()
                    .for_each(|(i, o)| philox::fill_uniforms(ss[i], ps[i], o))
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

/// philox4x32_10 on six equally long int64 arrays of 32-bit words.
#[pyfunction]
fn philox4x32_10<'py>(
    py: Python<'py>,
    words: [PyReadonlyArray1<'py, i64>; 6],
) -> PyResult<Words<'py>> {
    const NAMES: [&str; 6] = ["counter", "counter", "counter", "counter", "key", "key"];
    let n = words[0].len();
    let mut w32: Vec<Vec<u32>> = Vec::with_capacity(6);
    for (a, name) in words.iter().zip(NAMES) {
        let s = slice(a, name)?;
        if s.len() != n {
            return Err(value_error(
                "counter and key words must have the same shape",
            ));
        }
        if let Some(bad) = s.iter().find(|&&v| !(0..=u32::MAX as i64).contains(&v)) {
            return Err(value_error(format!(
                "{name} words must be in [0, 2**32), got {bad}"
            )));
        }
        w32.push(s.iter().map(|&v| v as u32).collect());
    }
    let mut out = [vec![0i64; n], vec![0i64; n], vec![0i64; n], vec![0i64; n]];
    detached(py, || {
        let [o0, o1, o2, o3] = &mut out;
        philox::philox_arrays(
            [&w32[0], &w32[1], &w32[2], &w32[3], &w32[4], &w32[5]],
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
    m.add_function(wrap_pyfunction!(check_logits, m)?)?;
    m.add_function(wrap_pyfunction!(first_bad, m)?)?;
    m.add_function(wrap_pyfunction!(apply_temperature, m)?)?;
    m.add_function(wrap_pyfunction!(apply_top_k, m)?)?;
    m.add_function(wrap_pyfunction!(apply_top_p, m)?)?;
    m.add_function(wrap_pyfunction!(apply_min_p, m)?)?;
    m.add_function(wrap_pyfunction!(apply_penalties, m)?)?;
    m.add_function(wrap_pyfunction!(apply_logit_bias, m)?)?;
    m.add_function(wrap_pyfunction!(log_softmax, m)?)?;
    m.add_function(wrap_pyfunction!(topk_logprobs, m)?)?;
    m.add_function(wrap_pyfunction!(sample, m)?)?;
    m.add_function(wrap_pyfunction!(philox_uniform, m)?)?;
    m.add_function(wrap_pyfunction!(philox4x32_10, m)?)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lcg(seed: &mut u64) -> f64 {
        *seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((*seed >> 11) as f64) / (1u64 << 53) as f64
    }

    fn normal_row(n: usize, scale: f64, seed: u64) -> Vec<f32> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                let (u1, u2) = (lcg(&mut s).max(1e-300), lcg(&mut s));
                (scale * (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()) as f32
            })
            .collect()
    }

    #[test]
    fn pairwise_sum_small_and_large() {
        let v: Vec<f64> = (0..1000).map(|i| i as f64).collect();
        assert_eq!(pairwise_sum(&v), 499500.0);
        assert_eq!(pairwise_sum::<f64>(&[]), -0.0);
        assert_eq!(pairwise_sum(&[1.0f32, 2.0, 3.0]), 6.0);
    }

    #[test]
    fn kth_largest_matches_sort() {
        for (n, k) in [
            (100, 1),
            (5000, 50),
            (5000, 1),
            (5000, 4999),
            (20000, 7),
            (20000, 600),
        ] {
            let row = normal_row(n, 3.0, n as u64 + k as u64);
            let mut sorted = row.clone();
            sorted.sort_by(|a, b| b.total_cmp(a));
            let mut buf = Vec::new();
            assert_eq!(kth_largest(&row, k, &mut buf), sorted[k - 1], "n={n} k={k}");
        }
        // many ties: falls back to the full selection
        let row: Vec<f32> = (0..10000).map(|i| (i % 3) as f32).collect();
        let mut buf = Vec::new();
        assert_eq!(kth_largest(&row, 10, &mut buf), 2.0);
        assert_eq!(kth_largest(&row, 4000, &mut buf), 1.0);
    }

    #[test]
    fn top_p_threshold_matches_sorted_cumsum() {
        for (n, scale, p) in [
            (1000, 1.0, 0.9),
            (30000, 3.0, 0.9),
            (30000, 5.0, 0.5),
            (100, 0.0, 0.3),
        ] {
            let row: Vec<f64> = normal_row(n, scale, 7).iter().map(|&x| x as f64).collect();
            let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = row.iter().map(|&x| (x - m).exp()).collect();
            let s: f64 = e.iter().sum();
            let probs: Vec<f64> = e.iter().map(|v| v / s).collect();
            let mut sorted = probs.clone();
            sorted.sort_by(|a, b| b.total_cmp(a));
            let mut acc = 0.0;
            let mut want = None;
            for &v in &sorted {
                acc += v;
                if acc >= p {
                    want = Some(v);
                    break;
                }
            }
            let (mut cands, mut keys, mut hist) = (Vec::new(), Vec::new(), Vec::new());
            let pmax = sorted[0];
            assert_eq!(
                top_p_threshold(&probs, pmax, p, &mut keys, &mut hist, &mut cands),
                want,
                "n={n}"
            );
        }
    }

    #[test]
    fn sample_matches_brute_force() {
        for seed in 0..20i64 {
            let row = normal_row(3000, 2.0, seed as u64);
            let mut u = vec![0.0; row.len()];
            philox::fill_uniforms(seed, 3, &mut u);
            let mut best = (f64::NEG_INFINITY, 0usize);
            for (i, (&x, &ui)) in row.iter().zip(&u).enumerate() {
                let s = x as f64 - (-(ui.ln())).ln();
                if s > best.0 {
                    best = (s, i);
                }
            }
            assert_eq!(sample_row(&row, 1.0, seed, 3), Ok(best.1 as i64));
        }
        assert_eq!(sample_row(&[1.0f32, 3.0, 3.0], 0.0, 0, 0), Ok(1));
        assert_eq!(
            sample_row(&[1.0f32, f32::NAN], 1.0, 0, 0),
            Err(RowStatus::NanOrInf)
        );
        assert_eq!(
            sample_row(&[f32::NEG_INFINITY; 3], 1.0, 0, 0),
            Err(RowStatus::AllMasked)
        );
    }

    #[test]
    fn scan_statuses() {
        assert_eq!(scan(&[1.0f64, f64::INFINITY]).0, RowStatus::NanOrInf);
        assert_eq!(scan(&[f64::NEG_INFINITY; 40]).0, RowStatus::AllMasked);
        assert_eq!(scan(&[-1.0f64, f64::NEG_INFINITY]), (RowStatus::Ok, -1.0));
        assert_eq!(
            first_error(&[RowStatus::Ok, RowStatus::AllMasked, RowStatus::NanOrInf]),
            Some((2, RowStatus::NanOrInf))
        );
    }
}
