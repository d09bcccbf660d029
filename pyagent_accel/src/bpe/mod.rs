//! `pyagent_accel.tokenize.bpe`: the byte-level BPE of `pyagent_ref.tokenize.bpe` in Rust,
//! with the same ids.
//!
//! The Python layer (`python/pyagent_accel/tokenize/bpe.py`) is a subclass of the
//! reference's `BytePairEncoding`: loading, validation, the special-token sets and every
//! error message stay the reference's; it hands the validated data to `BpeCore` once and
//! calls it to encode and decode.
//!
//! - `merge`: step 4, the byte-pair merge of one piece, O(n log n).
//! - `encoding`: steps 1 (added tokens), 3 (regex pre-tokenization) and 4 over a text,
//!   and decoding.
//! - `bindings`: the `_native` classes; a batch encodes its texts in parallel (rayon),
//!   the GIL released.

mod bindings;
pub mod encoding;
pub mod merge;
#[cfg(test)]
mod tests;

pub use bindings::register;
