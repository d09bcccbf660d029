//! Kernels of `pyagent_accel.ops.attention` and their Python bindings: writing keys and
//! values into a paged KV cache, and causal attention over it (contract:
//! `pyagent_ref.ops.attention`).
//!
//! Its float arrays are of the storage dtypes of `crate::elem`.
//!
//! - `kernels`: the cache write and the attention kernel, on validated input.
//! - `bindings`: the `_native` functions: arguments, validation, the GIL released.

mod bindings;
pub mod kernels;
#[cfg(test)]
mod tests;

pub use bindings::register;
