//! The ops of `pyagent_ref.ops.sampling`, one row at a time: `<op>_row` computes row b
//! of the op (reading `row`, writing `out` where the op returns an array like the
//! logits) after validating the row with `scan`. A row that fails the reference's row
//! checks returns its `RowStatus` and writes nothing.
//!
//! Each kernel is compiled for baseline x86-64, AVX2 and AVX-512 (`multiversion!`) and
//! gives the same bits in every build.

use std::cell::RefCell;
use std::cmp::Ordering;

use super::row_scan::{first_index_of, pairwise_sum, scan, RowStatus, LANES};
use super::select::{kth_largest, top_p_threshold};
use crate::float::{exp_f64, multiversion, Float};
use crate::philox;

/// Buffers the kernels reuse between rows and calls (one set per thread), so large
/// vocabularies are not re-faulted on every call.
#[derive(Default)]
pub struct Scratch {
    probs: Vec<f64>,
    candidates: Vec<f64>,
    keys: Vec<u16>,
    hist: Vec<f64>,
    /// Per-token counts of `apply_penalties` (all zero between uses).
    counts: Vec<u64>,
    /// Per-token bias sums of `apply_logit_bias` (all zero between uses).
    sums: Vec<f64>,
    /// The tokens whose `counts` / `sums` entry a row made non-zero.
    touched: Vec<usize>,
}

impl Scratch {
    /// Make `counts` and `sums` cover a vocabulary of `vocab` tokens.
    fn dense(&mut self, vocab: usize) {
        if self.counts.len() < vocab {
            self.counts.resize(vocab, 0);
            self.sums.resize(vocab, 0.0);
        }
    }
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// `f` with this thread's scratch (a fresh one if it is already borrowed).
pub fn with_scratch<R>(f: impl FnOnce(&mut Scratch) -> R) -> R {
    SCRATCH.with(|cell| match cell.try_borrow_mut() {
        Ok(mut scratch) => f(&mut scratch),
        Err(_) => f(&mut Scratch::default()),
    })
}

#[inline(always)]
fn temperature_row_impl<T: Float>(row: &[T], out: &mut [T], temperature: T) -> RowStatus {
    let (status, _) = scan(row);
    if status != RowStatus::Ok {
        return status;
    }
    let t = if temperature == T::ZERO {
        T::ONE
    } else {
        temperature
    };
    for (o, &x) in out.iter_mut().zip(row) {
        *o = x / t;
    }
    RowStatus::Ok
}

multiversion! {
    /// `apply_temperature`: x / t, a row with t == 0 unchanged.
    pub fn temperature_row<T>(row: &[T], out: &mut [T], temperature: T) -> RowStatus = temperature_row_impl;
}

#[inline(always)]
fn top_k_row_impl<T: Float>(row: &[T], out: &mut [T], k: i64, buf: &mut Vec<T>) -> RowStatus {
    let (status, _) = scan(row);
    if status != RowStatus::Ok {
        return status;
    }
    if k <= 0 || k as u64 >= row.len() as u64 {
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
    /// `apply_top_k`: keep x >= the k-th largest (`buf` is scratch).
    pub fn top_k_row<T>(row: &[T], out: &mut [T], k: i64, buf: &mut Vec<T>) -> RowStatus = top_k_row_impl;
}

#[inline(always)]
fn min_p_row_impl<T: Float>(row: &[T], out: &mut [T], min_p: f64) -> RowStatus {
    let (status, max) = scan(row);
    if status != RowStatus::Ok {
        return status;
    }
    // masked iff exp(x - max) < min_p (float64). exp is monotone, so away from
    // ln(min_p) the comparison is decided by d = x - max alone; only entries within a
    // band of 1e-12 (far wider than exp's and ln's rounding) evaluate exp itself.
    if !(min_p > 0.0) {
        out.copy_from_slice(row);
        return RowStatus::Ok;
    }
    let max = max.to_f64();
    let log_min_p = min_p.ln();
    if log_min_p < -700.0 {
        // exp(d) near min_p would be (sub)normal-edge: decide every entry with exp.
        for (o, &x) in out.iter_mut().zip(row) {
            *o = if (x.to_f64() - max).exp() < min_p {
                T::NEG_INF
            } else {
                x
            };
        }
        return RowStatus::Ok;
    }
    let delta = 1e-12 * (1.0 + log_min_p.abs());
    let (lo, hi) = (log_min_p - delta, log_min_p + delta);
    for (out_chunk, chunk) in out.chunks_mut(64).zip(row.chunks(64)) {
        let mut in_band = 0u8;
        for (o, &x) in out_chunk.iter_mut().zip(chunk) {
            let d = x.to_f64() - max;
            in_band |= ((d >= lo) & (d <= hi)) as u8;
            *o = if d < lo { T::NEG_INF } else { x };
        }
        if in_band != 0 {
            for (o, &x) in out_chunk.iter_mut().zip(chunk) {
                let d = x.to_f64() - max;
                if d >= lo && d <= hi {
                    *o = if d.exp() < min_p { T::NEG_INF } else { x };
                }
            }
        }
    }
    RowStatus::Ok
}

multiversion! {
    /// `apply_min_p`: mask x where exp(x - max) < min_p.
    pub fn min_p_row<T>(row: &[T], out: &mut [T], min_p: f64) -> RowStatus = min_p_row_impl;
}

#[inline(always)]
fn top_p_row_impl<T: Float>(row: &[T], out: &mut [T], p: f64, scratch: &mut Scratch) -> RowStatus {
    let (status, max) = scan(row);
    if status != RowStatus::Ok {
        return status;
    }
    if !(p < 1.0) {
        out.copy_from_slice(row);
        return RowStatus::Ok;
    }
    // probs = softmax in float64, as the reference: e = exp(x - max), e / sum(e)
    let max = max.to_f64();
    let Scratch {
        probs,
        candidates,
        keys,
        hist,
        ..
    } = scratch;
    probs.resize(row.len(), 0.0);
    for (e, &x) in probs.iter_mut().zip(row) {
        *e = exp_f64(x.to_f64() - max);
    }
    let sum = pairwise_sum(probs);
    for v in probs.iter_mut() {
        *v /= sum;
    }
    let max_prob = 1.0 / sum; // the max entry has e == 1 exactly
    match top_p_threshold(probs, max_prob, p, keys, hist, candidates) {
        None => out.copy_from_slice(row),
        Some(threshold) => {
            for ((o, &x), &prob) in out.iter_mut().zip(row).zip(probs.iter()) {
                *o = if prob >= threshold { x } else { T::NEG_INF };
            }
        }
    }
    RowStatus::Ok
}

multiversion! {
    /// `apply_top_p`: keep the tokens whose probability reaches the top-p threshold.
    pub fn top_p_row<T>(row: &[T], out: &mut [T], p: f64, scratch: &mut Scratch) -> RowStatus = top_p_row_impl;
}

/// Marks a `Scratch::counts` entry as "seen in the prompt" (the low bits count the
/// occurrences in the output).
const PROMPT_BIT: u64 = 1 << 63;

#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn penalties_row_impl<T: Float>(
    row: &[T],
    out: &mut [T],
    prompt_ids: &[i64],
    output_ids: &[i64],
    repetition: T,
    frequency: T,
    presence: T,
    scratch: &mut Scratch,
) -> RowStatus {
    let (status, _) = scan(row);
    if status != RowStatus::Ok {
        return status;
    }
    let vocab = row.len();
    scratch.dense(vocab);
    // Tokens that never appeared: x - f * 0 - q * 0, exactly as the reference computes
    // it (this turns -0.0 into +0.0 when f or q is negative).
    let (frequency_zero, presence_zero) = (frequency * T::ZERO, presence * T::ZERO);
    if frequency_zero.is_pos_zero() && presence_zero.is_pos_zero() {
        out.copy_from_slice(row);
    } else {
        for (o, &x) in out.iter_mut().zip(row) {
            *o = (x - frequency_zero) - presence_zero;
        }
    }
    // Per-row histogram of the output ids; PROMPT_BIT marks "seen in the prompt".
    let Scratch {
        counts, touched, ..
    } = scratch;
    touched.clear();
    for &id in output_ids {
        if id >= 0 && (id as u64) < vocab as u64 {
            let token = id as usize;
            if counts[token] == 0 {
                touched.push(token);
            }
            counts[token] += 1;
        }
    }
    for &id in prompt_ids {
        if id >= 0 && (id as u64) < vocab as u64 {
            let token = id as usize;
            if counts[token] == 0 {
                touched.push(token);
            }
            counts[token] |= PROMPT_BIT;
        }
    }
    for &token in touched.iter() {
        let count = counts[token] & !PROMPT_BIT;
        counts[token] = 0;
        let x = row[token];
        let mut y = if x > T::ZERO {
            x / repetition
        } else {
            x * repetition
        };
        y = y - frequency * T::from_count(count);
        y = y - presence * (if count > 0 { T::ONE } else { T::ZERO });
        out[token] = y;
    }
    touched.clear();
    RowStatus::Ok
}

multiversion! {
    /// `apply_penalties`: repetition, then frequency, then presence penalty.
    #[allow(clippy::too_many_arguments)]
    pub fn penalties_row<T>(row: &[T], out: &mut [T], prompt_ids: &[i64], output_ids: &[i64], repetition: T, frequency: T, presence: T, scratch: &mut Scratch) -> RowStatus = penalties_row_impl;
}

#[inline(always)]
fn logit_bias_row_impl<T: Float>(
    row: &[T],
    out: &mut [T],
    token_ids: &[i64],
    bias: &[f64],
    scratch: &mut Scratch,
) -> RowStatus {
    let (status, _) = scan(row);
    if status != RowStatus::Ok {
        return status;
    }
    let vocab = row.len();
    scratch.dense(vocab);
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
    } = scratch;
    touched.clear();
    for (&id, &b) in token_ids.iter().zip(bias) {
        if id >= 0 && (id as u64) < vocab as u64 {
            let token = id as usize;
            if counts[token] == 0 {
                counts[token] = 1;
                touched.push(token);
            }
            sums[token] += b;
        }
    }
    for &token in touched.iter() {
        out[token] = T::from_f64(row[token].to_f64() + sums[token]);
        counts[token] = 0;
        sums[token] = 0.0;
    }
    touched.clear();
    RowStatus::Ok
}

multiversion! {
    /// `apply_logit_bias`: add each listed token's biases, in float64, rounded once.
    pub fn logit_bias_row<T>(row: &[T], out: &mut [T], token_ids: &[i64], bias: &[f64], scratch: &mut Scratch) -> RowStatus = logit_bias_row_impl;
}

#[inline(always)]
fn log_softmax_row_impl<T: Float>(row: &[T], out: &mut [T]) -> RowStatus {
    let (status, max) = scan(row);
    if status != RowStatus::Ok {
        return status;
    }
    for (o, &x) in out.iter_mut().zip(row) {
        *o = (x - max).exp_fast();
    }
    let log_sum = pairwise_sum(out).ln_();
    for (o, &x) in out.iter_mut().zip(row) {
        *o = (x - max) - log_sum;
    }
    RowStatus::Ok
}

multiversion! {
    /// `log_softmax`: x - max - ln(sum(exp(x - max))), summed in numpy's order.
    pub fn log_softmax_row<T>(row: &[T], out: &mut [T]) -> RowStatus = log_softmax_row_impl;
}

#[inline(always)]
fn topk_logprobs_row_impl<T: Float>(
    row: &[T],
    num: usize,
    sampled: i64,
    values: &mut [T],
    ids: &mut [i64],
    buf: &mut Vec<T>,
) -> Result<(T, i64), RowStatus> {
    let (status, _) = scan(row);
    if status != RowStatus::Ok {
        return Err(status);
    }
    let chosen = row[sampled as usize];
    let mut lane_above = [0u32; LANES];
    let mut chunks = row.chunks_exact(LANES);
    for chunk in &mut chunks {
        for l in 0..LANES {
            lane_above[l] += (chunk[l] > chosen) as u32;
        }
    }
    let mut rank: i64 = 1 + chunks.remainder().iter().filter(|&&x| x > chosen).count() as i64;
    rank += lane_above.iter().map(|&a| a as i64).sum::<i64>();
    if num > 0 {
        let kth = kth_largest(row, num, buf);
        let mut top: Vec<(T, usize)> = row
            .iter()
            .enumerate()
            .filter(|(_, &x)| x >= kth)
            .map(|(i, &x)| (x, i))
            .collect();
        // value descending (IEEE: -0.0 ties with 0.0), then lower token id
        let order = |a: &(T, usize), b: &(T, usize)| {
            b.0.partial_cmp(&a.0)
                .unwrap_or(Ordering::Equal)
                .then(a.1.cmp(&b.1))
        };
        if top.len() > num {
            top.select_nth_unstable_by(num - 1, order);
            top.truncate(num);
        }
        top.sort_unstable_by(order);
        for (j, &(x, i)) in top.iter().enumerate() {
            values[j] = x;
            ids[j] = i as i64;
        }
    }
    Ok((chosen, rank))
}

multiversion! {
    /// `topk_logprobs`: fills the row's `num` top (values, ids); returns the sampled
    /// token's (logprob, rank). `sampled` must be in [0, len) (checked by the caller).
    pub fn topk_logprobs_row<T>(row: &[T], num: usize, sampled: i64, values: &mut [T], ids: &mut [i64], buf: &mut Vec<T>) -> Result<(T, i64), RowStatus> = topk_logprobs_row_impl;
}

const LN2: f64 = std::f64::consts::LN_2;
const TWO_M52: f64 = 1.0 / 4_503_599_627_370_496.0;

/// Uniforms per step of `exponential_race` (one vectorised philox call).
pub const RACE_CHUNK: usize = 2 * philox::LANES;

/// A lower bound of log2(v) for v > 0, read off its bits: exponent + (mantissa - 1),
/// the chord of log2 on [1, 2), which lies below it (and above log2(v) - 0.0861). For
/// a subnormal v it is above log2(v). The i64 -> f64 rounding (< 2**-42) is far inside
/// the race's 1e-9 slack.
#[inline(always)]
pub fn log2_chord(v: f64) -> f64 {
    (v.to_bits() as i64 as f64) * TWO_M52 - 1023.0
}

/// The exponential race over the uniforms u_j of the stream (seed, position) of
/// `philox`: the j in [0, len) maximising `log_weight(j) - ln(-ln u_j)` in float64, the
/// lowest j on ties; None when every weight is zero (log weight -inf). With log weights
/// the logits this is `sample`'s draw; with any weights w it draws j with probability
/// w_j / sum(w).
///
/// `bounds(base, out)` writes an upper bound of log_weight(base + l) into out[l] for
/// every l < min(RACE_CHUNK, len - base) (-inf for a zero weight; the rest of `out` is
/// -inf already). Exact without two logs per entry: score_j <= log_weight(j) - ln(1 -
/// u_j) <= bound_j - log2_chord(1 - u_j) ln 2, so an entry is scored exactly (with
/// libm, as the reference) only if that bound, slackened by 1e-9 so that rounding can
/// never exclude the true maximum, reaches the best exact score so far. With a running
/// best this scores O(log len) entries.
#[inline(always)]
pub fn exponential_race(
    seed: i64,
    position: i64,
    len: usize,
    mut bounds: impl FnMut(usize, &mut [f64; RACE_CHUNK]),
    log_weight: impl Fn(usize) -> f64,
) -> Option<usize> {
    let key = philox::seed_key(seed);
    let position = position as u64;
    let mut mantissas = [0u64; RACE_CHUNK];
    let mut upper = [0f64; RACE_CHUNK];
    let mut best = f64::NEG_INFINITY;
    let mut winner = None;
    for base in (0..len).step_by(RACE_CHUNK) {
        let n = RACE_CHUNK.min(len - base);
        philox::mantissas(key, position, (base / 2) as u64, &mut mantissas);
        if n < RACE_CHUNK {
            upper = [f64::NEG_INFINITY; RACE_CHUNK];
        }
        bounds(base, &mut upper);
        let mut any = 0u8;
        for l in 0..RACE_CHUNK {
            let v = 1.0 - philox::uniform(mantissas[l]); // exact
            upper[l] -= log2_chord(v) * LN2 - 1e-9;
            any |= (upper[l] >= best) as u8;
        }
        if any != 0 {
            for l in 0..n {
                if upper[l] >= best {
                    let u = philox::uniform(mantissas[l]);
                    let score = log_weight(base + l) - (-(u.ln())).ln();
                    if score > best {
                        best = score;
                        winner = Some(base + l);
                    }
                }
            }
        }
    }
    winner
}

/// One row of `sample`: the exponential race over the logits (argmax_i x_i -
/// ln(-ln(u_i)) in float64, lowest index on ties, u from `philox`); or argmax x for a
/// greedy row.
#[inline(always)]
fn sample_row_impl<T: Float>(
    row: &[T],
    temperature: f64,
    seed: i64,
    position: i64,
) -> Result<i64, RowStatus> {
    let (status, max) = scan(row);
    if status != RowStatus::Ok {
        return Err(status);
    }
    if temperature == 0.0 {
        return Ok(first_index_of(row, max) as i64);
    }
    let logits = |base: usize, out: &mut [f64; RACE_CHUNK]| {
        for (o, &x) in out.iter_mut().zip(&row[base..]) {
            *o = x.to_f64();
        }
    };
    let winner = exponential_race(seed, position, row.len(), logits, |j| row[j].to_f64());
    // None is unreachable for a validated row (some entry is finite); stay total anyway
    Ok(winner.unwrap_or_else(|| first_index_of(row, max)) as i64)
}

multiversion! {
    /// `sample`: the row's token.
    pub fn sample_row<T>(row: &[T], temperature: f64, seed: i64, position: i64) -> Result<i64, RowStatus> = sample_row_impl;
}
