//! Selection without sorting the row: the k-th largest logit (top-k, topk_logprobs)
//! and the probability threshold of top-p.

use std::cmp::Ordering;

use super::row_scan::LANES;
use crate::float::Float;

#[inline(always)]
fn descending<T: Float>(a: &T, b: &T) -> Ordering {
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
    let capacity = (4 * k).max(512);
    let select_on_copy = |buf: &mut Vec<T>| -> T {
        buf.clear();
        buf.extend_from_slice(row);
        *buf.select_nth_unstable_by(k - 1, descending).1
    };
    if capacity >= n / 2 {
        return select_on_copy(buf);
    }
    buf.clear();
    buf.reserve(capacity + LANES);
    let mut threshold = T::NEG_INF;
    let mut chunks = row.chunks_exact(LANES);
    for chunk in &mut chunks {
        let mut any = 0u8;
        for &x in chunk {
            any |= (x >= threshold) as u8;
        }
        if any != 0 {
            for &x in chunk {
                if x >= threshold {
                    buf.push(x);
                }
            }
            if buf.len() >= capacity {
                threshold = *buf.select_nth_unstable_by(k - 1, descending).1;
                buf.retain(|&x| x >= threshold);
                if buf.len() > capacity / 2 {
                    return select_on_copy(buf);
                }
            }
        }
    }
    for &x in chunks.remainder() {
        if x >= threshold {
            buf.push(x);
        }
    }
    *buf.select_nth_unstable_by(k - 1, descending).1
}

/// Buckets of the top-p histogram: 16 per binade, 64 binades below the max.
const TOP_P_BUCKETS: usize = 1024;

/// The probability threshold t of `apply_top_p` for probabilities `probs` (in any
/// order, largest `max_prob`): t = the m-th largest probability, m = the smallest count
/// whose descending cumulative sum reaches p; None when the whole row does not reach p
/// (keep all).
///
/// Instead of sorting: a histogram of the mass over the top bits of the f64 (monotone
/// for non-negative doubles: 16 buckets per binade, 64 binades below the max) finds
/// the bucket where the cumulative mass crosses p, and a quickselect on mass resolves
/// the exact element inside that bucket. `keys`, `hist` and `candidates` are scratch.
#[inline(always)]
pub fn top_p_threshold(
    probs: &[f64],
    max_prob: f64,
    p: f64,
    keys: &mut Vec<u16>,
    hist: &mut Vec<f64>,
    candidates: &mut Vec<f64>,
) -> Option<f64> {
    const NB: usize = TOP_P_BUCKETS;
    let max_key = max_prob.to_bits() >> 48;
    // bucket 0 holds the largest probabilities; everything 64 binades below the max
    // shares the last bucket
    keys.resize(probs.len(), 0);
    for (key, &v) in keys.iter_mut().zip(probs) {
        let bits = (v.to_bits() >> 48).min(max_key);
        *key = (max_key - bits).min(NB as u64 - 1) as u16;
    }
    // four interleaved histograms break the store-to-load dependency of runs of
    // entries falling into the same bucket
    hist.clear();
    hist.resize(4 * NB, 0.0);
    let mut key_chunks = keys.chunks_exact(4);
    let mut prob_chunks = probs.chunks_exact(4);
    for (k, v) in (&mut key_chunks).zip(&mut prob_chunks) {
        hist[k[0] as usize] += v[0];
        hist[NB + k[1] as usize] += v[1];
        hist[2 * NB + k[2] as usize] += v[2];
        hist[3 * NB + k[3] as usize] += v[3];
    }
    for (&k, &v) in key_chunks.remainder().iter().zip(prob_chunks.remainder()) {
        hist[k as usize] += v;
    }
    let mut acc = 0.0;
    for bucket in 0..NB {
        let mass =
            (hist[bucket] + hist[NB + bucket]) + (hist[2 * NB + bucket] + hist[3 * NB + bucket]);
        if acc + mass >= p {
            // the bucket's range of values: [lo, hi)
            let hi = f64::from_bits((max_key - bucket as u64 + 1) << 48);
            let lo = if bucket == NB - 1 {
                -1.0
            } else {
                f64::from_bits((max_key - bucket as u64) << 48)
            };
            candidates.clear();
            for chunk in probs.chunks(LANES) {
                let mut any = 0u8;
                for &v in chunk {
                    any |= ((v >= lo) & (v < hi)) as u8;
                }
                if any != 0 {
                    candidates.extend(chunk.iter().copied().filter(|&v| v >= lo && v < hi));
                }
            }
            match mass_select(candidates, acc, p) {
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
