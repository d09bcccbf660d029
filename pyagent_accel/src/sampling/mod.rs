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
//!
//! - `row_scan`: one pass over a row: its status under the reference's row checks and
//!   its maximum, the argmax, numpy's pairwise sum.
//! - `select`: the k-th largest value and the top-p threshold, without sorting.
//! - `kernels`: one function per op, computing one row (`temperature_row`, ...).
//! - `filters`: typical-p, epsilon and eta cutoffs, XTC, mirostat, allowed ids, bad
//!   words, no-repeat n-grams (one function per op and row, like `kernels`).
//! - `dry`: the DRY repetition penalty (a Z-function pass over the row's context).
//! - `bindings`: the `_native` functions: arguments, rows in parallel, errors.

mod bindings;
pub mod dry;
pub mod filters;
pub mod kernels;
pub mod row_scan;
pub mod select;
#[cfg(test)]
mod tests;

pub(crate) use bindings::{dispatch, extract_logits, raise_rows, sequential, Logits};
pub use bindings::{register, Check};
