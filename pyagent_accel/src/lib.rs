//! `pyagent_accel._native`: Rust kernels behind `pyagent_accel.ops`.
//!
//! The Python package (`python/pyagent_accel/ops/*.py`) checks arguments exactly like
//! `pyagent_ref.ops` and calls the functions registered here, which check again only
//! what the kernels rely on (nothing reachable from Python panics) and do the numeric
//! work with the GIL released. `py_util` holds what the bindings of all modules share.

// Kernels index lanes explicitly (`for l in 0..LANES`) so the compiler vectorises
// them, and spell NaN-aware tests as `!(x < y)` on purpose (true for NaN).
#![allow(clippy::needless_range_loop, clippy::neg_cmp_op_on_partial_ord)]

use pyo3::prelude::*;

pub mod attention;
pub mod block_table;
pub mod bpe;
pub mod elem;
pub mod float;
pub mod gguf;
pub mod grammar;
pub mod hashing;
pub mod layers;
pub mod lora;
pub mod moe;
pub mod ngram;
pub mod philox;
pub mod pooling;
pub mod py_util;
pub mod quant;
pub mod rope;
pub mod sampling;
pub mod spec_decode;
pub mod ssm;
pub mod structured;

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    sampling::register(m)?;
    hashing::register(m)?;
    block_table::register(m)?;
    bpe::register(m)?;
    layers::register(m)?;
    moe::register(m)?;
    lora::register(m)?;
    pooling::register(m)?;
    quant::register(m)?;
    gguf::register(m)?;
    rope::register(m)?;
    attention::register(m)?;
    structured::register(m)?;
    grammar::register(m)?;
    spec_decode::register(m)?;
    ssm::register(m)?;
    ngram::register(m)?;
    m.add("SIMD", format!("{:?}", float::simd_level()).to_lowercase())?;
    Ok(())
}
