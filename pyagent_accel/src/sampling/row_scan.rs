//! One pass over a row of logits: the reference's row validation fused with the row's
//! maximum, the first index of a value (argmax), and numpy's pairwise sum.

use crate::float::{multiversion, Float};

/// Lanes of the vectorised row loops (16 f32 fill one AVX-512 register).
pub const LANES: usize = 16;

/// What the row checks of `pyagent_ref.ops._arrays.check_logits` say about one row.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub enum RowStatus {
    #[default]
    Ok,
    /// Some entry is NaN or +inf.
    NanOrInf,
    /// Every entry is -inf.
    AllMasked,
}

/// The error the reference raises for a batch of row statuses, if any: the lowest
/// NaN/+inf row, else the lowest all -inf row (the reference checks NaN/+inf first).
pub fn first_error(statuses: &[RowStatus]) -> Option<(usize, RowStatus)> {
    if let Some(row) = statuses.iter().position(|s| *s == RowStatus::NanOrInf) {
        return Some((row, RowStatus::NanOrInf));
    }
    statuses
        .iter()
        .position(|s| *s == RowStatus::AllMasked)
        .map(|row| (row, RowStatus::AllMasked))
}

/// Validate a row and return its maximum (one vectorised pass).
#[inline(always)]
pub fn scan<T: Float>(row: &[T]) -> (RowStatus, T) {
    let mut lane_max = [T::NEG_INF; LANES];
    let mut lane_bad = [0u8; LANES];
    let mut chunks = row.chunks_exact(LANES);
    for chunk in &mut chunks {
        for l in 0..LANES {
            let x = chunk[l];
            lane_bad[l] |= (!(x < T::INF)) as u8;
            lane_max[l] = if x > lane_max[l] { x } else { lane_max[l] };
        }
    }
    let mut max = T::NEG_INF;
    let mut bad = 0u8;
    for &x in chunks.remainder() {
        bad |= (!(x < T::INF)) as u8;
        if x > max {
            max = x;
        }
    }
    for l in 0..LANES {
        bad |= lane_bad[l];
        if lane_max[l] > max {
            max = lane_max[l];
        }
    }
    let status = if bad != 0 {
        RowStatus::NanOrInf
    } else if max == T::NEG_INF {
        RowStatus::AllMasked
    } else {
        RowStatus::Ok
    };
    (status, max)
}

#[inline(always)]
fn row_status_impl<T: Float>(row: &[T]) -> RowStatus {
    scan(row).0
}

multiversion! {
    /// The status of a row alone (the row checks without an op).
    pub fn row_status<T>(row: &[T]) -> RowStatus = row_status_impl;
}

#[inline(always)]
fn scan_row_impl<T: Float>(row: &[T]) -> (RowStatus, T) {
    scan(row)
}

multiversion! {
    /// `scan` on its own: a row's status and maximum.
    pub fn scan_row<T>(row: &[T]) -> (RowStatus, T) = scan_row_impl;
}

/// Index of the first entry equal to `value` (numpy/torch argmax of the max: lowest
/// index on ties); 0 if there is none.
#[inline(always)]
pub fn first_index_of<T: Float>(row: &[T], value: T) -> usize {
    let mut base = 0;
    for chunk in row.chunks(64) {
        let mut hit = false;
        for &x in chunk {
            hit |= x == value;
        }
        if hit {
            return base + chunk.iter().position(|&x| x == value).unwrap_or(0);
        }
        base += chunk.len();
    }
    0
}

/// numpy's pairwise summation (`pairwise_sum` in loops_utils.h.src), which is what
/// `np.sum(x, axis=-1)` computes for a contiguous row: blocks of up to 128 summed with
/// 8 accumulators, halves split at multiples of 8.
#[inline(always)]
fn pairwise_sum_impl<T: Float>(a: &[T]) -> T {
    let n = a.len();
    if n <= 128 {
        return block_sum(a);
    }
    let half = n / 2 - (n / 2) % 8;
    let (left, right) = a.split_at(half);
    if right.len() <= 128 {
        return block_sum(left) + block_sum(right); // the last level, inline
    }
    // the recursion goes through the dispatcher: each level runs the AVX2/AVX-512 build
    pairwise_sum(left) + pairwise_sum(right)
}

multiversion! {
    /// numpy's pairwise sum of a row (see `pairwise_sum_impl`).
    pub fn pairwise_sum<T>(a: &[T]) -> T = pairwise_sum_impl;
}

/// numpy's sum of at most 128 values: in order below 8, else 8 accumulators combined
/// as a tree, then the remainder in order.
#[inline(always)]
fn block_sum<T: Float>(a: &[T]) -> T {
    let n = a.len();
    if n < 8 {
        let mut sum = T::NEG_ZERO;
        for &x in a {
            sum = sum + x;
        }
        return sum;
    }
    let mut acc = [T::ZERO; 8];
    acc.copy_from_slice(&a[..8]);
    let end = n - n % 8;
    for chunk in a[8..end].chunks_exact(8) {
        for j in 0..8 {
            acc[j] = acc[j] + chunk[j];
        }
    }
    // Opaque to the optimiser: else it lays the accumulators out for the tree below
    // and shuffles them on every step of the loop (several times slower).
    let acc = std::hint::black_box(acc);
    let mut sum = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    for &x in &a[end..] {
        sum = sum + x;
    }
    sum
}
