//! Kernels of `pyagent_accel.ops.attention` and their Python bindings: writing keys and
//! values into a paged KV cache, and causal attention over it (contract:
//! `pyagent_ref.ops.attention`).
//!
//! - `elem`: the element types (f32, f64, f16, bf16) and the compute types (f32, f64).
//! - `kernels`: the cache write and the attention kernel, on validated input.
//! - `bindings`: the `_native` functions: arguments, validation, the GIL released.

mod bindings;
pub mod elem;
pub mod kernels;
#[cfg(test)]
mod tests;

pub use bindings::register;
