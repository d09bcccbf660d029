//! The filters HF transformers and vLLM have beside top-k / top-p / min-p, one row at a
//! time like `kernels`: typical-p, epsilon and eta cutoffs (float64 decisions on
//! log_softmax and the entropy), and the token masks of allowed ids, bad words and
//! no-repeat n-grams (exact: no arithmetic).
//!
//! The float64 filters compute q = x - max - ln(sum exp(x - max)) with `exp_f64` (1 ulp)
//! and numpy's pairwise sum, p = exp(q), H = -sum p * q: within a few ulp of the
//! reference, so only the decisions inside the specification's 1e-9 bands can differ.

use super::row_scan::{pairwise_sum, scan, RowStatus};
use crate::float::{exp_f64, Float};

/// exp(x) with exp(-inf) exactly 0 (`exp_f64` clamps its argument).
fn exp_or_zero(x: f64) -> f64 {
    if x == f64::NEG_INFINITY {
        0.0
    } else {
        exp_f64(x)
    }
}

/// q (log_softmax), p = exp(q) and the entropy H of a valid row whose max is `max`;
/// -inf entries get q = -inf and p = 0.
fn surprisal<T: Float>(row: &[T], max: T, q: &mut Vec<f64>, p: &mut Vec<f64>) -> f64 {
    let max = max.to_f64();
    q.clear();
    q.extend(row.iter().map(|&x| x.to_f64() - max));
    p.clear();
    p.extend(q.iter().map(|&d| exp_or_zero(d)));
    let log_sum = pairwise_sum(p).ln();
    for (qi, pi) in q.iter_mut().zip(p.iter_mut()) {
        *qi -= log_sum;
        *pi = exp_or_zero(*qi);
    }
    let terms: Vec<f64> = q
        .iter()
        .zip(p.iter())
        .map(|(&qi, &pi)| if pi > 0.0 { pi * qi } else { 0.0 })
        .collect();
    -pairwise_sum(&terms)
}

/// `apply_typical_p` for one row: keep the tokens whose distance |-q - H| to the
/// entropy is <= that of the token where the cumulative mass (in distance order,
/// ties by index) first reaches `mass`; `mass` >= 1 leaves the row unchanged.
pub fn typical_row<T: Float>(row: &[T], out: &mut [T], mass: f64) -> RowStatus {
    let (status, max) = scan(row);
    if status != RowStatus::Ok {
        return status;
    }
    if !(mass < 1.0) {
        out.copy_from_slice(row);
        return RowStatus::Ok;
    }
    let (mut q, mut p) = (Vec::new(), Vec::new());
    let entropy = surprisal(row, max, &mut q, &mut p);
    let d: Vec<f64> = q.iter().map(|&qi| (-qi - entropy).abs()).collect();
    let mut order: Vec<usize> = (0..row.len()).collect();
    order.sort_by(|&a, &b| d[a].total_cmp(&d[b]).then(a.cmp(&b)));
    let mut cum = 0.0;
    let mut last = order[row.len() - 1];
    for &i in &order {
        cum += p[i];
        if cum >= mass {
            last = i;
            break;
        }
    }
    let threshold = d[last];
    for ((o, &x), &di) in out.iter_mut().zip(row).zip(&d) {
        *o = if di <= threshold { x } else { T::NEG_INF };
    }
    RowStatus::Ok
}

/// The cutoff of `apply_epsilon_cutoff` (`Cutoff::Epsilon`) or `apply_eta_cutoff`.
#[derive(Clone, Copy)]
pub enum Cutoff {
    Epsilon(f64),
    Eta(f64),
}

/// `apply_epsilon_cutoff` / `apply_eta_cutoff` for one row: mask p < threshold except
/// the tokens tied for the max (threshold epsilon, or min(eta, sqrt(eta) * exp(-H))).
pub fn cutoff_row<T: Float>(row: &[T], out: &mut [T], cutoff: Cutoff) -> RowStatus {
    let (status, max) = scan(row);
    if status != RowStatus::Ok {
        return status;
    }
    let (Cutoff::Epsilon(v) | Cutoff::Eta(v)) = cutoff;
    if !(v > 0.0) {
        out.copy_from_slice(row);
        return RowStatus::Ok;
    }
    let (mut q, mut p) = (Vec::new(), Vec::new());
    let entropy = surprisal(row, max, &mut q, &mut p);
    let threshold = match cutoff {
        Cutoff::Epsilon(eps) => eps,
        Cutoff::Eta(eta) => eta.min(eta.sqrt() * (-entropy).exp()),
    };
    for ((o, &x), &pi) in out.iter_mut().zip(row).zip(&p) {
        *o = if pi < threshold && x != max {
            T::NEG_INF
        } else {
            x
        };
    }
    RowStatus::Ok
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
