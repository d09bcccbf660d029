//! Kernels of `pyagent_accel.ops.attention` and their Python bindings: writing keys and
//! values into a paged KV cache, and causal attention over it (contract:
//! `pyagent_ref.ops.attention`).
//!
//! Its float arrays are of the storage dtypes of `crate::elem`.
//!
//! - `kernels`: the cache write and the attention kernel, on validated input.
//! - `fp8`: the FP8 KV cache formats (e4m3, e5m2) as storage dtypes over uint8.
//! - `bindings`: the `_native` functions: arguments, validation, the GIL released.

mod bindings;
pub mod fp8;
pub mod kernels;
#[cfg(test)]
mod tests;

pub use bindings::register;
