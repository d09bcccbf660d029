//! Prompt lookup, the kernel of `pyagent_accel.ops.spec_decode.propose_ngram` (contract:
//! `pyagent_ref.ops.spec_decode.propose_ngram`).
//!
//! With s = the tokens (n of them), an n-gram of length L matches at j if
//! s[j .. j + L] == s[n - L .. n] and j + L < n. The proposal follows the match of the
//! largest L in [lookup_min, lookup_max], the latest (largest j) among those.
//!
//! On the reversed sequence r (r[i] = s[n - 1 - i]) a match of length >= L ending at
//! e = j + L - 1 is a common prefix of length >= L of r and r[i..], i = n - 1 - e, which
//! the Z-function of r measures. One pass of Gusfield's Z-algorithm over i = 1, 2, ...
//! visits the end positions from the newest to the oldest, so the first i whose
//! min(z[i], lookup_max) is the largest seen is the latest match of that length, and
//! the pass stops at the first match of length lookup_max (nothing can beat it).
//! Linear time in n; the pass reads s where it stands, without a reversed copy.

use numpy::{PyArray1, PyReadonlyArray1};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyInt, PyList};

use crate::py_util::{detached, readonly, slice, value_error};

/// Above this many tokens the scan runs with the GIL released (below it, releasing and
/// taking the GIL back costs about as much as the scan).
const DETACH_ABOVE: usize = 4096;

/// Where the proposal starts: j + L for the match prompt lookup chooses (module
/// docstring), or None when no n-gram of length in [lookup_min, lookup_max] matches.
/// Needs 1 <= lookup_min <= lookup_max.
pub fn proposal_start(s: &[i64], lookup_min: usize, lookup_max: usize) -> Option<usize> {
    assert!(
        1 <= lookup_min && lookup_min <= lookup_max,
        "bad lookup settings"
    );
    let n = s.len();
    if n <= lookup_min {
        return None; // a match of length L needs at least L + 1 tokens
    }
    let r = |i: usize| s[n - 1 - i];
    // [left, right) is the rightmost window of r known to equal its prefix r[.. right -
    // left]. Inside it the pass reads z[i - left], at i - left < right - left = z[left];
    // every z computed before the pass stops is < lookup_max (a longer one stops it),
    // so only z[.. lookup_max] is ever read, and only those are kept.
    let mut z = vec![0usize; n.min(lookup_max)];
    let (mut left, mut right) = (0usize, 0usize);
    let (mut best_length, mut best_start) = (0usize, None);
    for i in 1..n {
        let mut zi = if i < right {
            (right - i).min(z[i - left])
        } else {
            0
        };
        while i + zi < n && r(zi) == r(i + zi) {
            zi += 1;
        }
        if i + zi > right {
            (left, right) = (i, i + zi);
        }
        if let Some(slot) = z.get_mut(i) {
            *slot = zi;
        }
        let length = zi.min(lookup_max);
        if length >= lookup_min && length > best_length {
            // the match ends at e = n - 1 - i: the proposal starts at e + 1 = n - i
            (best_length, best_start) = (length, Some(n - i));
            if length == lookup_max {
                break;
            }
        }
    }
    best_start
}

/// The Z-function of `s` reversed, read where `s` stands: z[i] = the length of the
/// longest common suffix of s[.. n - i] and s (z[0] = n). Gusfield's algorithm, linear
/// in n: [left, right) is the rightmost window of the reversed sequence known to equal
/// its prefix, inside which z[i] starts from z[i - left]. (`proposal_start` runs the
/// same pass, stopping early and keeping only the entries it reads again.)
pub fn reversed_z_function(s: &[i64]) -> Vec<usize> {
    let n = s.len();
    let r = |i: usize| s[n - 1 - i];
    let mut z = vec![0usize; n];
    if n > 0 {
        z[0] = n;
    }
    let (mut left, mut right) = (0usize, 0usize);
    for i in 1..n {
        let mut zi = if i < right {
            (right - i).min(z[i - left])
        } else {
            0
        };
        while i + zi < n && r(zi) == r(i + zi) {
            zi += 1;
        }
        if i + zi > right {
            (left, right) = (i, i + zi);
        }
        z[i] = zi;
    }
    z
}

/// The proposal as a range of `s`: [start, min(start + num, n)), empty when nothing
/// matches. Needs num >= 1 and 1 <= lookup_min <= lookup_max.
pub fn proposal(s: &[i64], num: usize, lookup_min: usize, lookup_max: usize) -> (usize, usize) {
    match proposal_start(s, lookup_min, lookup_max) {
        Some(start) => (start, start.saturating_add(num).min(s.len())),
        None => (0, 0),
    }
}

// ---------------------------------------------------------------------------------
// Python binding. The wrapper in `python/pyagent_accel/ops/spec_decode.py` has checked
// the settings (in the reference's order, with its messages) and turned the token ids
// into a list or an int64 array; this reads a list's items with the reference's check.

/// The items of a list of Python ints as int64 codes that are equal exactly when the
/// ints are: the ints themselves or, when one does not fit in int64, a numbering of
/// the distinct values (prompt lookup only compares tokens). TypeError, as the
/// reference words it, for the first item that is not an int (or is a bool).
fn list_codes(list: &Bound<'_, PyList>) -> PyResult<Vec<i64>> {
    let mut codes = Vec::with_capacity(list.len());
    let mut all_fit = true;
    for (i, item) in list.iter().enumerate() {
        // an exact int is the common case, and the cheapest test
        let int = item.is_exact_instance_of::<PyInt>()
            || (item.is_instance_of::<PyInt>() && !item.is_instance_of::<PyBool>());
        if !int {
            return Err(PyTypeError::new_err(format!(
                "token_ids[{i}] must be an int, got {}",
                item.repr()?
            )));
        }
        codes.push(item.extract::<i64>().unwrap_or_else(|_| {
            all_fit = false;
            0
        }));
    }
    if !all_fit {
        let numbers = PyDict::new(list.py());
        for (code, item) in codes.iter_mut().zip(list.iter()) {
            *code = match numbers.get_item(&item)? {
                Some(number) => number.extract()?,
                None => {
                    let number = numbers.len() as i64;
                    numbers.set_item(&item, number)?;
                    number
                }
            };
        }
    }
    Ok(codes)
}

/// `proposal` with the GIL released for a long sequence.
fn scan(py: Python<'_>, s: &[i64], num: usize, min: usize, max: usize) -> PyResult<(usize, usize)> {
    if s.len() > DETACH_ABOVE {
        detached(py, || proposal(s, num, min, max))
    } else {
        Ok(proposal(s, num, min, max))
    }
}

/// ngram_proposal(token_ids, num_speculative_tokens, prompt_lookup_min, prompt_lookup_max)
/// --
///
/// The range [start, stop) of `token_ids` that prompt lookup proposes ((0, 0) for none):
/// `token_ids` a list of ints or a C-contiguous int64 array (n,), the settings ints with
/// num_speculative_tokens >= 1 and 1 <= prompt_lookup_min <= prompt_lookup_max.
#[pyfunction]
fn ngram_proposal(
    py: Python<'_>,
    token_ids: &Bound<'_, PyAny>,
    num_speculative_tokens: usize,
    prompt_lookup_min: usize,
    prompt_lookup_max: usize,
) -> PyResult<(usize, usize)> {
    let (num, min, max) = (num_speculative_tokens, prompt_lookup_min, prompt_lookup_max);
    if num < 1 || min < 1 || min > max {
        return Err(value_error(format!(
            "need num_speculative_tokens >= 1 and 1 <= prompt_lookup_min <= prompt_lookup_max, \
             got {num}, {min}, {max}"
        )));
    }
    if let Ok(list) = token_ids.cast::<PyList>() {
        let codes = list_codes(list)?;
        return scan(py, &codes, num, min, max);
    }
    if let Ok(array) = token_ids.cast::<PyArray1<i64>>() {
        let tokens: PyReadonlyArray1<'_, i64> = readonly(array, "token_ids")?;
        return scan(py, slice(&tokens, "token_ids")?, num, min, max);
    }
    Err(PyTypeError::new_err(
        "token_ids must be a list of ints or a 1-D int64 numpy array",
    ))
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(ngram_proposal, m)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The contract read literally: the longest L first, then the latest j.
    fn brute_force(s: &[i64], num: usize, min: usize, max: usize) -> (usize, usize) {
        let n = s.len();
        for length in (min..=max).rev() {
            for j in (0..n.saturating_sub(length)).rev() {
                if s[j..j + length] == s[n - length..] {
                    let start = j + length;
                    return (start, (start + num).min(n));
                }
            }
        }
        (0, 0)
    }

    /// Sequences over a few tokens from an LCG, so that repeats and overlaps are common.
    fn sequence(len: usize, alphabet: u64, seed: u64) -> Vec<i64> {
        let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..len)
            .map(|_| {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((state >> 33) % alphabet) as i64
            })
            .collect()
    }

    #[test]
    fn matches_the_brute_force_contract() {
        for seed in 0..3000u64 {
            let s = sequence((seed % 41) as usize, 2 + seed % 3, seed);
            let min = 1 + (seed % 4) as usize;
            let max = min + (seed / 4 % 5) as usize;
            let num = 1 + (seed / 20 % 6) as usize;
            assert_eq!(
                proposal(&s, num, min, max),
                brute_force(&s, num, min, max),
                "{s:?} num {num} min {min} max {max}"
            );
        }
    }

    #[test]
    fn longest_then_latest() {
        // [1, 2] occurs at 0 (then 7) and at 3 (then 8); the unigram [2] also at 6
        let s = [1, 2, 7, 1, 2, 8, 2, 9, 1, 2];
        assert_eq!(proposal(&s, 2, 1, 3), (5, 7));
        assert_eq!(proposal(&s, 2, 1, 1), (7, 9));
        assert_eq!(proposal(&[5, 5, 5], 4, 1, 2), (2, 3)); // overlapping [5, 5] at 0
        assert_eq!(proposal(&[1, 2, 3], 4, 1, 3), (0, 0));
        assert_eq!(proposal(&[], 4, 1, 3), (0, 0));
    }

    #[test]
    fn huge_settings_are_fine() {
        let s = sequence(500, 2, 7);
        let want = brute_force(&s, 500, 1, 500);
        assert_eq!(proposal(&s, usize::MAX, 1, usize::MAX), want);
        assert_eq!(proposal(&s, 3, usize::MAX, usize::MAX), (0, 0));
    }
}
