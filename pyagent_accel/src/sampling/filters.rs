//! The filters HF transformers, vLLM and llama.cpp have beside top-k / top-p / min-p,
//! one row at a time like `kernels`: typical-p, epsilon and eta cutoffs, XTC and
//! mirostat's truncation and update (float64 decisions on log_softmax and the entropy),
//! and the token masks of allowed ids, bad words and no-repeat n-grams (exact: no
//! arithmetic).
//!
//! The float64 filters compute e = exp(x - max) with `exp_f64` (1 ulp), S = sum e
//! (numpy's pairwise order), p = e / S and H = ln S - sum(e * (x - max)) / S, the
//! reference's p = exp(q) and -sum p * q within a few ulp: only the decisions inside
//! the specification's 1e-9 bands can differ.

use std::cell::RefCell;

use super::row_scan::{pairwise_sum, scan, RowStatus};
use crate::float::{exp_f64, multiversion, Float};

/// Per-thread buffers of the float64 filters: exp(x - max), distances, and (distance
/// bits, e) pairs sorted by distance.
#[derive(Default)]
struct Buffers {
    e: Vec<f64>,
    d: Vec<f64>,
    by_distance: Vec<(u64, f64)>,
}

thread_local! {
    static BUFFERS: RefCell<Buffers> = RefCell::default();
}

/// This thread's buffers, taken out of the thread-local (the kernels' loops must not run
/// inside a closure, which would not get their `multiversion!` target features).
fn take_buffers() -> Buffers {
    BUFFERS.with(|cell| std::mem::take(&mut *cell.borrow_mut()))
}

fn give_back(buffers: Buffers) {
    BUFFERS.with(|cell| *cell.borrow_mut() = buffers);
}

/// Of a valid row whose max is `max`: e = exp(x - max) (0 for -inf entries) written to
/// `e`, its sum S, and the entropy H = ln S - sum(e * (x - max)) / S (the docstring's
/// -sum p * q with p = e / S and q = x - max - ln S), computed only if `entropy`.
#[inline(always)]
fn softmax_stats<T: Float>(row: &[T], max: T, e: &mut Vec<f64>, entropy: bool) -> (f64, f64) {
    let max = max.to_f64();
    e.resize(row.len(), 0.0);
    for (ei, &x) in e.iter_mut().zip(row) {
        *ei = exp_f64(x.to_f64() - max);
    }
    let sum = pairwise_sum(e);
    if !entropy {
        return (sum, 0.0);
    }
    let weighted = row
        .iter()
        .zip(e.iter())
        .map(|(&x, &ei)| {
            if ei > 0.0 {
                ei * (x.to_f64() - max)
            } else {
                0.0
            }
        })
        .fold(0.0, |acc, v| acc + v);
    (sum, sum.ln() - weighted / sum)
}

#[inline(always)]
fn typical_row_impl<T: Float>(row: &[T], out: &mut [T], mass: f64) -> RowStatus {
    let (status, max) = scan(row);
    if status != RowStatus::Ok {
        return status;
    }
    if !(mass < 1.0) {
        out.copy_from_slice(row);
        return RowStatus::Ok;
    }
    let mut buffers = take_buffers();
    {
        let Buffers { e, d, by_distance } = &mut buffers;
        let (sum, entropy) = softmax_stats(row, max, e, true);
        // d = |-q - H| with q = x - max - ln S; +inf for -inf entries
        let offset = sum.ln() - entropy;
        let max = max.to_f64();
        d.resize(row.len(), 0.0);
        for (di, &x) in d.iter_mut().zip(row) {
            *di = (offset - (x.to_f64() - max)).abs();
        }
        // d >= 0, so its bits order like its values; the threshold below does not
        // depend on the order of equal distances (they are kept or masked together)
        by_distance.clear();
        by_distance.extend(d.iter().zip(e.iter()).map(|(&di, &ei)| (di.to_bits(), ei)));
        by_distance.sort_unstable_by_key(|&(bits, _)| bits);
        let mut cum = 0.0;
        let mut last = by_distance[row.len() - 1].0;
        for &(bits, ei) in by_distance.iter() {
            cum += ei / sum;
            if cum >= mass {
                last = bits;
                break;
            }
        }
        let threshold = f64::from_bits(last);
        for ((o, &x), &di) in out.iter_mut().zip(row).zip(d.iter()) {
            *o = if di <= threshold { x } else { T::NEG_INF };
        }
    }
    give_back(buffers);
    RowStatus::Ok
}

multiversion! {
    /// `apply_typical_p` for one row: keep the tokens whose distance |-q - H| to the
    /// entropy is <= that of the token where the cumulative mass (in distance order)
    /// first reaches `mass`; `mass` >= 1 leaves the row unchanged.
    pub fn typical_row<T>(row: &[T], out: &mut [T], mass: f64) -> RowStatus = typical_row_impl;
}

/// The cutoff of `apply_epsilon_cutoff` (`Cutoff::Epsilon`), `apply_eta_cutoff` or
/// `apply_mirostat` (threshold 2 ^ -mu).
#[derive(Clone, Copy)]
pub enum Cutoff {
    Epsilon(f64),
    Eta(f64),
    Mirostat(f64),
}

#[inline(always)]
fn cutoff_row_impl<T: Float>(row: &[T], out: &mut [T], cutoff: Cutoff) -> RowStatus {
    let (status, max) = scan(row);
    if status != RowStatus::Ok {
        return status;
    }
    let disabled = match cutoff {
        Cutoff::Epsilon(v) | Cutoff::Eta(v) => !(v > 0.0),
        Cutoff::Mirostat(mu) => mu == f64::INFINITY,
    };
    if disabled {
        out.copy_from_slice(row);
        return RowStatus::Ok;
    }
    let mut buffers = take_buffers();
    {
        let e = &mut buffers.e;
        let (sum, entropy) = softmax_stats(row, max, e, matches!(cutoff, Cutoff::Eta(_)));
        let threshold = match cutoff {
            Cutoff::Epsilon(eps) => eps,
            Cutoff::Eta(eta) => eta.min(eta.sqrt() * (-entropy).exp()),
            Cutoff::Mirostat(mu) => (-mu).exp2(),
        };
        // p < threshold as e < threshold * S (the same decision but within rounding)
        let bound = threshold * sum;
        for ((o, &x), &ei) in out.iter_mut().zip(row).zip(e.iter()) {
            *o = if ei < bound && x != max {
                T::NEG_INF
            } else {
                x
            };
        }
    }
    give_back(buffers);
    RowStatus::Ok
}

multiversion! {
    /// `apply_epsilon_cutoff` / `apply_eta_cutoff` / `apply_mirostat` for one row: mask
    /// p < threshold except the tokens tied for the max (threshold epsilon,
    /// min(eta, sqrt(eta) * exp(-H)) or 2 ^ -mu).
    pub fn cutoff_row<T>(row: &[T], out: &mut [T], cutoff: Cutoff) -> RowStatus = cutoff_row_impl;
}

/// The settings of one row of `apply_xtc` (checked by the wrapper: threshold and
/// probability in [0, 1]) and its coin, entry vocab + 1 of its Philox stream.
#[derive(Clone, Copy)]
pub struct Xtc {
    pub threshold: f64,
    pub probability: f64,
    pub coin: f64,
}

#[inline(always)]
fn xtc_row_impl<T: Float>(row: &[T], out: &mut [T], xtc: Xtc) -> RowStatus {
    let (status, max) = scan(row);
    if status != RowStatus::Ok {
        return status;
    }
    out.copy_from_slice(row);
    if !(xtc.coin < xtc.probability) {
        return RowStatus::Ok;
    }
    let mut buffers = take_buffers();
    {
        let e = &mut buffers.e;
        let (sum, _) = softmax_stats(row, max, e, false);
        // candidates: finite tokens with p = e / S >= threshold; the least likely stays
        let (mut count, mut least) = (0usize, T::INF);
        for (&x, &ei) in row.iter().zip(e.iter()) {
            if x != T::NEG_INF && ei / sum >= xtc.threshold {
                count += 1;
                least = if x < least { x } else { least };
            }
        }
        if count >= 2 {
            for ((o, &x), &ei) in out.iter_mut().zip(row).zip(e.iter()) {
                if x != T::NEG_INF && ei / sum >= xtc.threshold && x > least {
                    *o = T::NEG_INF;
                }
            }
        }
    }
    give_back(buffers);
    RowStatus::Ok
}

multiversion! {
    /// `apply_xtc` for one row: when the coin is below the probability and two or more
    /// tokens have p >= threshold, mask those of them above the least likely one.
    pub fn xtc_row<T>(row: &[T], out: &mut [T], xtc: Xtc) -> RowStatus = xtc_row_impl;
}

#[inline(always)]
fn mirostat_update_row_impl<T: Float>(row: &[T], token: usize) -> Result<f64, RowStatus> {
    let (status, max) = scan(row);
    if status != RowStatus::Ok {
        return Err(status);
    }
    let mut buffers = take_buffers();
    let (sum, _) = softmax_stats(row, max, &mut buffers.e, false);
    give_back(buffers);
    // q = (x - max) - ln S, the reference's log_softmax in float64
    Ok((row[token].to_f64() - max.to_f64()) - sum.ln())
}

multiversion! {
    /// The log-probability (float64 log_softmax) of `token` in a valid row, for
    /// `mirostat_update`; -inf for a masked token.
    pub fn mirostat_update_row<T>(row: &[T], token: usize) -> Result<f64, RowStatus>
        = mirostat_update_row_impl;
}

/// The leading entries >= 0 of a right-padded id row (the wrapper has checked that no
/// id follows padding).
fn leading(ids: &[i64]) -> &[i64] {
    &ids[..ids.iter().position(|&t| t < 0).unwrap_or(ids.len())]
}

/// A copy of `row` with the tokens `banned` yields set to -inf (ids are < vocab: the
/// wrapper checked them).
fn mask_ids<T: Float>(row: &[T], out: &mut [T], banned: impl Iterator<Item = i64>) -> RowStatus {
    let (status, _) = scan(row);
    if status != RowStatus::Ok {
        return status;
    }
    out.copy_from_slice(row);
    for t in banned {
        out[t as usize] = T::NEG_INF;
    }
    RowStatus::Ok
}

/// `apply_allowed_token_ids` for one row: a row without ids is unchanged, else only the
/// listed tokens keep their logits.
pub fn allowed_row<T: Float>(row: &[T], out: &mut [T], allowed: &[i64]) -> RowStatus {
    let (status, _) = scan(row);
    if status != RowStatus::Ok {
        return status;
    }
    if allowed.iter().all(|&t| t < 0) {
        out.copy_from_slice(row);
        return RowStatus::Ok;
    }
    out.fill(T::NEG_INF);
    for &t in allowed.iter().filter(|&&t| t >= 0) {
        out[t as usize] = row[t as usize];
    }
    RowStatus::Ok
}

/// `apply_bad_words` for one row: `words` holds the row's sequences, `width` ids each;
/// a sequence's last token is masked when `tokens` end with the rest of it.
pub fn bad_words_row<T: Float>(
    row: &[T],
    out: &mut [T],
    tokens: &[i64],
    words: &[i64],
    width: usize,
) -> RowStatus {
    let tokens = leading(tokens);
    let banned = words.chunks(width.max(1)).filter_map(|word| {
        let (&last, prefix) = leading(word).split_last()?;
        tokens.ends_with(prefix).then_some(last)
    });
    mask_ids(row, out, banned)
}

/// `apply_no_repeat_ngram` for one row: with the row's last n - 1 tokens as the prefix,
/// mask the token that follows each earlier occurrence of it (n == 0 disables).
pub fn no_repeat_row<T: Float>(row: &[T], out: &mut [T], tokens: &[i64], n: i64) -> RowStatus {
    let tokens = leading(tokens);
    let n = usize::try_from(n).unwrap_or(0);
    let banned: Vec<i64> = if n == 0 || tokens.len() < n {
        Vec::new()
    } else {
        let tail = &tokens[tokens.len() + 1 - n..];
        tokens
            .windows(n)
            .filter(|w| &w[..n - 1] == tail)
            .map(|w| w[n - 1])
            .collect()
    };
    mask_ids(row, out, banned.into_iter())
}
