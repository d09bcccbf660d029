//! Kernel of `pyagent_accel.ops.structured` (applying a token bitmask) and its Python
//! binding (contract: `pyagent_ref.ops.structured`).
//!
//! The bitmask is the layout llguidance, xgrammar and vLLM share: int32 words, bit j
//! (least significant first) of word w standing for token 32 * w + j. A row of the
//! result is the logits row with every token whose bit is clear, and every token past
//! the mask's 32 * words, replaced by -inf. Nothing is computed on the values, so every
//! dtype is handled alike and the result is the reference's bit for bit. Masks are
//! mostly whole words of 0 (nothing allowed) or -1 (everything): those are a fill and a
//! copy; the other words are decided bit by bit.

use numpy::ndarray::ArrayView1;
use numpy::{PyArray2, PyArrayMethods, PyUntypedArrayMethods};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use rayon::prelude::*;

use crate::elem::{dtype_of, float_array, new_array, with_elem, Elem};
use crate::float::Float;
use crate::py_util::{detached, readonly, value_error};

/// Rows go to the thread pool in pieces of at least this many logits (a copy of some
/// 20 us): a decode batch of one row runs on the calling thread.
const PIECE: usize = 1 << 18;

/// `-inf` in the storage type `E`.
fn neg_inf<E: Elem>() -> E {
    E::store(E::C::NEG_INF)
}

/// One row: `out[i] = logits[i]` where bit `i % 32` of `words[i / 32]` is set, `-inf`
/// elsewhere and for every `i >= 32 * words.len()`. `logits` and `out` have one length.
pub fn mask_row<E: Elem>(logits: &[E], words: &[i32], out: &mut [E]) {
    let masked = neg_inf::<E>();
    let covered = logits.len().min(32 * words.len()); // the tokens the mask describes
    let (head, beyond) = out.split_at_mut(covered);
    for ((out, logits), &word) in head.chunks_mut(32).zip(logits.chunks(32)).zip(words) {
        match word {
            0 => out.fill(masked),
            -1 => out.copy_from_slice(logits),
            _ => {
                for (j, (o, &x)) in out.iter_mut().zip(logits).enumerate() {
                    *o = if (word >> j) & 1 == 1 { x } else { masked };
                }
            }
        }
    }
    beyond.fill(masked);
}

/// `view`'s elements as a slice: itself when contiguous, else a copy into `buffer`.
fn contiguous<'a, T: Copy>(view: &'a ArrayView1<'_, T>, buffer: &'a mut Vec<T>) -> &'a [T] {
    match view.as_slice() {
        Some(slice) => slice,
        None => {
            buffer.clear();
            buffer.extend(view.iter().copied());
            buffer
        }
    }
}

// ---------------------------------------------------------------------------------
// Python binding. The wrapper in `python/pyagent_accel/ops/structured.py` has made the
// reference's checks; this one checks again what the kernel relies on (dtypes, shapes),
// so that no input reachable from Python panics.

/// apply_token_bitmask(logits, bitmask)
/// --
///
/// `logits` of any float dtype (bfloat16 as int16 bits), shape (batch, vocab), and an
/// int32 `bitmask` of shape (batch, words), both of any strides: a new C-contiguous
/// array of the logits with the tokens the mask does not allow set to -inf.
#[pyfunction]
fn apply_token_bitmask<'py>(
    py: Python<'py>,
    logits: &Bound<'py, PyAny>,
    bitmask: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    with_elem!(dtype_of(logits, "logits")?, E => apply_typed::<E>(py, logits, bitmask))
}

fn apply_typed<'py, E: Elem>(
    py: Python<'py>,
    logits: &Bound<'py, PyAny>,
    bitmask: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    let logits = float_array::<E>(logits, "logits")?;
    let bitmask = bitmask
        .cast::<PyArray2<i32>>()
        .map_err(|_| PyTypeError::new_err("bitmask must be a 2-D int32 numpy array"))?;
    if !bitmask.is_aligned() {
        return Err(value_error(
            "bitmask is not aligned in memory; pass a copy (np.array(bitmask)) instead",
        ));
    }
    let bitmask = readonly(bitmask, "bitmask")?;
    let (x, mask) = (logits.as_array(), bitmask.as_array());
    let x = x
        .into_dimensionality::<numpy::ndarray::Ix2>()
        .map_err(|_| value_error("logits must have shape (batch, vocab)"))?;
    let (batch, vocab) = x.dim();
    if mask.nrows() != batch {
        return Err(value_error(format!(
            "bitmask must have {batch} rows (one per logits row), got shape {:?}",
            bitmask.shape()
        )));
    }
    let rows: Vec<_> = x.outer_iter().zip(mask.outer_iter()).collect();
    // SAFETY: every row of the output is written below before it reaches Python.
    let out = unsafe { new_array::<E>(py, &[batch, vocab]) };
    {
        let mut out_w = out.readwrite();
        let out_data = out_w.as_slice_mut()?;
        if vocab > 0 {
            detached(py, || {
                out_data
                    .par_chunks_mut(vocab)
                    .zip(rows.par_iter())
                    .with_min_len((PIECE / vocab).max(1))
                    .for_each_init(
                        || (Vec::new(), Vec::new()),
                        |(logits_buf, words_buf), (out, (logits, words))| {
                            let logits = contiguous(logits, logits_buf);
                            let words = contiguous(words, words_buf);
                            mask_row(logits, words, out)
                        },
                    )
            })?;
        }
    }
    Ok(out.into_any())
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(apply_token_bitmask, m)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::f16;

    /// The specification, bit by bit.
    fn oracle(logits: &[f32], words: &[i32]) -> Vec<f32> {
        (0..logits.len())
            .map(|i| {
                let allowed = i / 32 < words.len() && (words[i / 32] as u32 >> (i % 32)) & 1 == 1;
                if allowed {
                    logits[i]
                } else {
                    f32::NEG_INFINITY
                }
            })
            .collect()
    }

    #[test]
    fn matches_the_bit_by_bit_rule() {
        let words = [0, -1, i32::MIN, 1, 0x5555_5555, -2];
        for vocab in [0, 1, 31, 32, 33, 64, 100, 191, 192, 250] {
            let logits: Vec<f32> = (0..vocab).map(|i| i as f32 - 7.5).collect();
            for width in 0..=words.len() {
                let mut out = vec![0.0f32; vocab];
                mask_row(&logits, &words[..width], &mut out);
                assert_eq!(
                    out,
                    oracle(&logits, &words[..width]),
                    "vocab {vocab} width {width}"
                );
            }
        }
    }

    #[test]
    fn keeps_nan_and_inf_where_allowed() {
        let logits = [f32::NAN, f32::INFINITY, f32::NAN, 1.0];
        let mut out = [0.0f32; 4];
        mask_row(&logits, &[0b0011], &mut out);
        assert!(out[0].is_nan() && out[1] == f32::INFINITY);
        assert_eq!(&out[2..], &[f32::NEG_INFINITY; 2]);
    }

    #[test]
    fn masks_half_types_with_their_own_negative_infinity() {
        let logits = [f16::from_f32(2.0); 3];
        let mut out = [f16::ZERO; 3];
        mask_row(&logits, &[0b010], &mut out);
        assert_eq!(
            out,
            [f16::NEG_INFINITY, f16::from_f32(2.0), f16::NEG_INFINITY]
        );
        assert_eq!(neg_inf::<crate::elem::Bf16>().0, 0xff80);
    }
}
