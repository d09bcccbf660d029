//! The `_native` classes behind `pyagent_accel.tokenize.bpe`.
//!
//! `BytePairEncoding` (Python) has validated everything with the reference's checks
//! before it builds a `BpeCore`; the only errors left here are a pattern that
//! fancy-regex cannot compile or that exceeds its backtracking limit on a text.

use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use rayon::prelude::*;
use rustc_hash::FxHashMap;

use super::encoding::{AddedTokenSplitter as Splitter, Encoding, RegexError};
use crate::py_util::detached;

fn regex_error(err: RegexError) -> PyErr {
    PyRuntimeError::new_err(err.0)
}

/// The added tokens one `encode` call matches and the special tokens it must not meet
/// (see `encoding::AddedTokenSplitter`).
#[pyclass(frozen, module = "pyagent_accel._native")]
pub struct AddedTokenSplitter(Splitter);

#[pymethods]
impl AddedTokenSplitter {
    /// `passes`: for each pass, (text, id) of the tokens it cuts out; `disallowed`: the
    /// special tokens that `meets_disallowed` looks for.
    #[new]
    fn new(passes: Vec<Vec<(String, u32)>>, disallowed: Vec<String>) -> PyResult<Self> {
        Splitter::new(passes, disallowed)
            .map(AddedTokenSplitter)
            .map_err(PyValueError::new_err)
    }

    /// Whether a disallowed special token occurs anywhere in `text`.
    fn meets_disallowed(&self, py: Python<'_>, text: &str) -> PyResult<bool> {
        detached(py, || self.0.meets_disallowed(text))
    }
}

/// Steps 1, 3 and 4 of a `BytePairEncoding`, and decoding.
#[pyclass(frozen, module = "pyagent_accel._native")]
pub struct BpeCore(Encoding);

#[pymethods]
impl BpeCore {
    /// `vocab`: token bytes -> id; `merges`: (left, right, rank); `decoded`: (id, bytes
    /// `decode` writes) for every id.
    #[new]
    fn new(
        vocab: FxHashMap<Vec<u8>, u32>,
        merges: Vec<(Vec<u8>, Vec<u8>, u32)>,
        patterns: Vec<String>,
        add_prefix_space: bool,
        ignore_merges: bool,
        decoded: Vec<(u32, Vec<u8>)>,
    ) -> PyResult<Self> {
        Encoding::new(
            vocab,
            merges,
            &patterns,
            add_prefix_space,
            ignore_merges,
            decoded,
        )
        .map(BpeCore)
        .map_err(PyValueError::new_err)
    }

    /// The ids of `text`, cut at the added tokens of `splitter`.
    fn encode(
        &self,
        py: Python<'_>,
        text: &str,
        splitter: &AddedTokenSplitter,
    ) -> PyResult<Vec<u32>> {
        detached(py, || self.0.encode(text, &splitter.0))?.map_err(regex_error)
    }

    /// `encode` of each text, the texts in parallel.
    fn encode_batch(
        &self,
        py: Python<'_>,
        texts: Vec<String>,
        splitter: &AddedTokenSplitter,
    ) -> PyResult<Vec<Vec<u32>>> {
        detached(py, || {
            texts
                .par_iter()
                .map(|text| self.0.encode(text, &splitter.0))
                .collect::<Result<Vec<_>, _>>()
        })?
        .map_err(regex_error)
    }

    /// The text of `ids`, or None if an id is of no token.
    fn decode(&self, py: Python<'_>, ids: Vec<u32>) -> PyResult<Option<String>> {
        detached(py, || self.0.decode(&ids))
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<AddedTokenSplitter>()?;
    m.add_class::<BpeCore>()?;
    Ok(())
}
