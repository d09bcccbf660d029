//! Helpers shared by the Python bindings of every ops module: errors, reading numpy
//! arrays, and running a kernel without the GIL.

use numpy::{PyArray, PyArrayMethods, PyReadonlyArray, PyReadonlyArray1, PyReadwriteArray};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;

pub fn value_error(msg: impl Into<String>) -> PyErr {
    PyValueError::new_err(msg.into())
}

/// Run `f` without the GIL; a panic (a bug: inputs are validated first) becomes a
/// RuntimeError instead of unwinding into Python.
pub fn detached<R: Send, F: FnOnce() -> R + Send>(py: Python<'_>, f: F) -> PyResult<R> {
    py.detach(|| std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)))
        .map_err(|_| {
            PyRuntimeError::new_err(
                "internal error in pyagent_accel (a Rust panic); please report it",
            )
        })
}

/// A read-only borrow of an array; ValueError if Rust code is writing to it.
///
/// The bindings pick an array's dtype with `cast` (a type check) before borrowing it:
/// trying one extraction after the other would build an error message for each miss,
/// which costs microseconds, more than an op on a decode batch.
pub fn readonly<'py, T: numpy::Element, D: numpy::ndarray::Dimension>(
    array: &Bound<'py, PyArray<T, D>>,
    name: &str,
) -> PyResult<PyReadonlyArray<'py, T, D>> {
    array
        .try_readonly()
        .map_err(|_| value_error(format!("{name} is being written to elsewhere")))
}

/// A writable borrow of an array (written in place); ValueError if it is read-only or
/// already borrowed (e.g. passed twice to one call).
pub fn writable<'py, T: numpy::Element, D: numpy::ndarray::Dimension>(
    array: &Bound<'py, PyArray<T, D>>,
    name: &str,
) -> PyResult<PyReadwriteArray<'py, T, D>> {
    array.try_readwrite().map_err(|_| {
        value_error(format!(
            "{name} is read-only or used elsewhere in this call"
        ))
    })
}

/// The elements of a C-contiguous array; ValueError naming the argument otherwise.
pub fn slice<'a, T: numpy::Element, D: numpy::ndarray::Dimension>(
    array: &'a PyReadonlyArray<'_, T, D>,
    name: &str,
) -> PyResult<&'a [T]> {
    array
        .as_slice()
        .map_err(|_| value_error(format!("{name} must be a C-contiguous array")))
}

/// A per-row parameter: the elements of a 1-D array with one entry per row of the batch.
pub fn row_param<'a, T: numpy::Element>(
    array: &'a PyReadonlyArray1<'_, T>,
    batch: usize,
    name: &str,
) -> PyResult<&'a [T]> {
    let values = slice(array, name)?;
    if values.len() != batch {
        return Err(value_error(format!(
            "{name} must have shape ({batch},) to match the batch, got shape ({},)",
            values.len()
        )));
    }
    Ok(values)
}
