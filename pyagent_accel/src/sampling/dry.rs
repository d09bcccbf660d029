//! DRY ("Don't Repeat Yourself"), the kernel of `apply_dry` for one row: bit-exact with
//! the reference (the same float64 subtraction and one rounding; the penalty's power is
//! libm's `pow`, as Python's `**` on floats).
//!
//! With t = the row's context (its last `penalty_last_n` tokens when that is > 0) and
//! L = len(t): the Z-function of t reversed gives, for every i < L - 1 at once, the
//! longest common suffix of t[..= i] and t; capped at the tokens after the last
//! sequence breaker, it is the repeat that token t[i + 1] would extend. Each token keeps
//! its longest repeat; those of at least `allowed_length` tokens (breakers excepted)
//! lose multiplier * base ^ (n - allowed_length).

use super::row_scan::{scan, RowStatus};
use crate::float::Float;
use crate::ngram::reversed_z_function;

/// The settings of one row of `apply_dry` (checked by the wrapper: multiplier finite
/// >= 0, base finite > 1, allowed_length >= 1, penalty_last_n >= -1).
#[derive(Clone, Copy)]
pub struct Dry {
    pub multiplier: f64,
    pub base: f64,
    pub allowed_length: i64,
    pub penalty_last_n: i64,
}

/// (token, longest repeat it would extend) for the tokens whose repeat reaches
/// `allowed` tokens, breakers excluded; one entry per token.
pub fn dry_repeats(tokens: &[i64], breakers: &[i64], allowed: usize) -> Vec<(i64, usize)> {
    let size = tokens.len();
    let is_breaker = |t: i64| breakers.binary_search(&t).is_ok();
    // the tokens after the last breaker: a repeat never reaches back past one
    let tail = tokens
        .iter()
        .rev()
        .position(|&t| is_breaker(t))
        .unwrap_or(size);
    if tail < allowed {
        return Vec::new();
    }
    let z = reversed_z_function(tokens);
    let mut found: Vec<(i64, usize)> = (1..size)
        .map(|k| (tokens[size - k], z[k].min(tail)))
        .filter(|&(token, repeat)| repeat >= allowed && !is_breaker(token))
        .collect();
    // longest first within each token, then keep the first entry of each token
    found.sort_unstable_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
    found.dedup_by_key(|entry| entry.0);
    found
}

/// `apply_dry` for one row: `tokens` the row's padded ids, `breakers` its padded
/// breaker ids (any order; entries < 0 are padding).
pub fn dry_row<T: Float>(
    row: &[T],
    out: &mut [T],
    tokens: &[i64],
    breakers: &[i64],
    dry: Dry,
) -> RowStatus {
    let (status, _) = scan(row);
    if status != RowStatus::Ok {
        return status;
    }
    out.copy_from_slice(row);
    if dry.multiplier == 0.0 || dry.penalty_last_n == 0 {
        return RowStatus::Ok;
    }
    let size = tokens.iter().position(|&t| t < 0).unwrap_or(tokens.len());
    let mut context = &tokens[..size];
    if dry.penalty_last_n > 0 {
        let window = usize::try_from(dry.penalty_last_n).unwrap_or(usize::MAX);
        context = &context[size.saturating_sub(window)..];
    }
    let mut stops: Vec<i64> = breakers.iter().copied().filter(|&t| t >= 0).collect();
    stops.sort_unstable();
    let allowed = usize::try_from(dry.allowed_length).unwrap_or(usize::MAX);
    for (token, repeat) in dry_repeats(context, &stops, allowed) {
        let index = token as usize;
        let x = row[index];
        if x == T::NEG_INF {
            continue;
        }
        let exponent = (repeat - allowed) as f64;
        let penalty = dry.multiplier * dry.base.powf(exponent);
        let value = T::from_f64(x.to_f64() - penalty);
        out[index] = if value < T::MIN { T::MIN } else { value };
    }
    RowStatus::Ok
}
