//! The `_native` classes behind `pyagent_accel.structured`.
//!
//! The Python layer (`python/pyagent_accel/structured/`) flattens a reference `Grammar`
//! into tables and checks arguments as the reference does; these classes check again
//! what the Rust code relies on (table indices, id ranges, the bitmask's dtype, shape
//! and row), so no input reachable from Python panics. Masks are computed with the GIL
//! released.

use numpy::{PyArray2, PyUntypedArrayMethods};
use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use std::sync::Arc;

use super::automata::{self, Nfa, Node, Table};
use super::earley::{Parser, TooManyItems};
use super::matcher::Matcher;
use super::tables::{Dfa, Grammar};
use super::trie::Trie;
use crate::py_util::{detached, value_error, writable};

fn too_many_items(err: TooManyItems) -> PyErr {
    PyValueError::new_err(err.to_string())
}

/// Run `f` with the GIL held, a panic (a bug) turned into RuntimeError as `detached` does.
fn guarded<R>(f: impl FnOnce() -> R) -> PyResult<R> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).map_err(|_| {
        PyRuntimeError::new_err("internal error in pyagent_accel (a Rust panic); please report it")
    })
}

/// A terminal's DFA as Python hands it over: byte classes (256 bytes), transitions row
/// by row, accepting flags, start state.
type DfaTables = (Vec<u8>, Vec<i32>, Vec<bool>, i32);

/// A grammar as flat tables, shared (read-only) by every parser of it.
#[pyclass(frozen, module = "pyagent_accel._native")]
pub struct CompiledGrammarCore(Arc<Grammar>);

#[pymethods]
impl CompiledGrammarCore {
    /// `rules[r]`: rule r's alternatives, each a list of symbols (`s >= 0`: rule s;
    /// `s < 0`: terminal `-s - 1`); `terminals[t]`: (byte_class as 256 bytes, transitions
    /// row by row, accepting, start) of terminal t's DFA.
    #[new]
    fn new(rules: Vec<Vec<Vec<i64>>>, start: i64, terminals: Vec<DfaTables>) -> PyResult<Self> {
        let dfas = terminals
            .into_iter()
            .enumerate()
            .map(|(t, (byte_class, transitions, accepting, start))| {
                Dfa::new(&byte_class, transitions, accepting, start)
                    .map_err(|msg| value_error(format!("terminal {t}: {msg}")))
            })
            .collect::<PyResult<Vec<_>>>()?;
        Grammar::new(&rules, start, dfas)
            .map(|g| CompiledGrammarCore(Arc::new(g)))
            .map_err(|e| value_error(e.0))
    }

    /// Which rules derive the empty string.
    fn nullable(&self) -> Vec<bool> {
        self.0.nullable.clone()
    }
}

/// A byte-level Earley parser (`earley::Parser`).
#[pyclass(module = "pyagent_accel._native")]
pub struct EarleyCore(Parser);

#[pymethods]
impl EarleyCore {
    #[new]
    fn new(grammar: &CompiledGrammarCore) -> PyResult<Self> {
        guarded(|| Parser::new(grammar.0.clone()))?
            .map(EarleyCore)
            .map_err(too_many_items)
    }

    /// Read one byte (0..255): False, and no change, if no sentence continues this way.
    fn push(&mut self, byte: i64) -> PyResult<bool> {
        let byte = u8::try_from(byte)
            .map_err(|_| value_error(format!("byte must be in [0, 255], got {byte}")))?;
        guarded(|| self.0.push(byte))?.map_err(too_many_items)
    }

    /// Undo the last `n` pushed bytes.
    fn pop(&mut self, n: i64) -> PyResult<()> {
        let pushed = self.0.num_bytes();
        match usize::try_from(n) {
            Ok(n) if n <= pushed => {
                self.0.pop(n);
                Ok(())
            }
            _ => Err(value_error(format!(
                "n must be in [0, {pushed}] (bytes pushed), got {n}"
            ))),
        }
    }

    fn is_accepting(&self) -> bool {
        self.0.is_accepting()
    }

    fn num_bytes(&self) -> usize {
        self.0.num_bytes()
    }

    fn copy(&self) -> EarleyCore {
        EarleyCore(self.0.clone())
    }
}

/// A vocabulary's token trie, shared (read-only, with its mask cache) by every matcher.
#[pyclass(frozen, module = "pyagent_accel._native")]
pub struct TokenTrieCore(Arc<Trie>);

#[pymethods]
impl TokenTrieCore {
    /// `token_bytes[i]`: the bytes of token i, or None.
    #[new]
    fn new(py: Python<'_>, token_bytes: &Bound<'_, PyAny>) -> PyResult<Self> {
        let mut table = Vec::new();
        for (i, item) in token_bytes.try_iter()?.enumerate() {
            let item = item?;
            if item.is_none() {
                table.push(None);
            } else if let Ok(bytes) = item.cast::<PyBytes>() {
                table.push(Some(bytes.as_bytes().to_vec()));
            } else {
                return Err(PyTypeError::new_err(format!(
                    "token_bytes[{i}] must be bytes or None, got {}",
                    item.get_type().name()?
                )));
            }
        }
        if table.len() > u32::MAX as usize / 2 {
            return Err(value_error("token_bytes is too long"));
        }
        let trie = detached(py, || Trie::new(table))?.map_err(value_error)?;
        Ok(TokenTrieCore(Arc::new(trie)))
    }

    fn __len__(&self) -> usize {
        self.0.len()
    }

    #[getter]
    fn vocab_size(&self) -> usize {
        self.0.vocab_size()
    }

    /// The bytes from the root to `node`.
    fn prefix<'py>(&self, py: Python<'py>, node: usize) -> PyResult<Bound<'py, PyBytes>> {
        let node = self.check_node(node)?;
        Ok(PyBytes::new(py, &self.0.prefix(node)))
    }

    /// The children of `node`, in increasing byte order.
    fn children(&self, node: usize) -> PyResult<Vec<usize>> {
        Ok(self.0.children(self.check_node(node)?))
    }
}

impl TokenTrieCore {
    fn check_node(&self, node: usize) -> PyResult<usize> {
        match node < self.0.len() {
            true => Ok(node),
            false => Err(value_error(format!(
                "node must be in [0, {}), got {node}",
                self.0.len()
            ))),
        }
    }
}

/// One output's matcher (`matcher::Matcher`).
#[pyclass(module = "pyagent_accel._native")]
pub struct MatcherCore(Matcher);

impl MatcherCore {
    fn check_token(&self, token_id: i64) -> PyResult<u32> {
        let vocab = self.0.trie().vocab_size();
        match usize::try_from(token_id) {
            Ok(id) if id < vocab => Ok(id as u32),
            _ => Err(value_error(format!(
                "token_id must be in [0, {vocab}), got {token_id}"
            ))),
        }
    }
}

#[pymethods]
impl MatcherCore {
    /// A matcher that owns a copy of `parser`'s state.
    #[new]
    fn new(parser: &EarleyCore, trie: &TokenTrieCore, eos_token_ids: Vec<i64>) -> PyResult<Self> {
        let vocab = trie.0.vocab_size();
        let eos = eos_token_ids
            .iter()
            .map(|&id| match usize::try_from(id) {
                Ok(i) if i < vocab => Ok(i as u32),
                _ => Err(value_error(format!(
                    "eos_token_ids holds {id}, outside the vocab of {vocab}"
                ))),
            })
            .collect::<PyResult<Vec<_>>>()?;
        Ok(MatcherCore(Matcher::new(
            parser.0.clone(),
            trie.0.clone(),
            &eos,
        )))
    }

    fn accept_token(&mut self, token_id: i64) -> PyResult<bool> {
        let token = self.check_token(token_id)?;
        guarded(|| self.0.accept_token(token))?.map_err(too_many_items)
    }

    fn rollback(&mut self, num_tokens: i64) -> PyResult<()> {
        let accepted = self.0.num_accepted_tokens();
        match usize::try_from(num_tokens) {
            Ok(n) if n <= accepted => guarded(|| self.0.rollback(n)),
            _ => Err(value_error(format!(
                "num_tokens must be in [0, {accepted}] (tokens accepted), got {num_tokens}"
            ))),
        }
    }

    fn is_terminated(&self) -> bool {
        self.0.is_terminated()
    }

    fn num_accepted_tokens(&self) -> usize {
        self.0.num_accepted_tokens()
    }

    fn allowed_tokens(&mut self, py: Python<'_>) -> PyResult<Vec<u32>> {
        detached(py, || self.0.allowed_tokens())?.map_err(too_many_items)
    }

    /// Write row `index` of the int32 `bitmask` (batch, words >= ceil(vocab / 32)).
    fn fill_next_token_bitmask(
        &mut self,
        py: Python<'_>,
        bitmask: &Bound<'_, PyAny>,
        index: usize,
    ) -> PyResult<()> {
        let bitmask = bitmask
            .cast::<PyArray2<i32>>()
            .map_err(|_| PyTypeError::new_err("bitmask must be a 2-D int32 numpy array"))?;
        let (batch, width) = (bitmask.shape()[0], bitmask.shape()[1]);
        let need = self.0.trie().vocab_size().div_ceil(32);
        if width < need || index >= batch {
            return Err(value_error(format!(
                "bitmask of shape ({batch}, {width}) has no row {index} of {need} words"
            )));
        }
        let mut words = vec![0u32; width];
        detached(py, || self.0.fill_bitmask(&mut words))?.map_err(too_many_items)?;
        let mut bitmask = writable(bitmask, "bitmask")?;
        let mut view = bitmask.as_array_mut();
        for (out, &word) in view.row_mut(index).iter_mut().zip(&words) {
            *out = word as i32;
        }
        Ok(())
    }

    /// The trie nodes the last mask stepped a DFA at (a benchmark's measure of its work).
    fn last_mask_nodes(&self) -> usize {
        self.0.last_mask_nodes()
    }

    fn find_jump_forward_bytes<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let forced = detached(py, || self.0.jump_forward_bytes())?.map_err(too_many_items)?;
        Ok(PyBytes::new(py, &forced))
    }

    fn copy(&self) -> MatcherCore {
        MatcherCore(self.0.clone())
    }
}

/// A DFA as Python hands it over and gets it back: byte classes (256 bytes), transitions
/// row by row, accepting flags, start state (`DEAD` with no states: the empty language).
type TableTuple = (Vec<u8>, Vec<i32>, Vec<bool>, i32);

fn table_of(
    name: &str,
    (byte_class, transitions, accepting, start): TableTuple,
) -> PyResult<Table> {
    let byte_class: [u8; 256] = byte_class.try_into().map_err(|b: Vec<u8>| {
        value_error(format!(
            "{name}: byte_class has {} entries, not 256",
            b.len()
        ))
    })?;
    Table::new(byte_class, transitions, accepting, start)
        .map_err(|msg| value_error(format!("{name}: {msg}")))
}

fn tuple_of(table: Table) -> TableTuple {
    (
        table.byte_class.to_vec(),
        table.transitions,
        table.accepting,
        table.start,
    )
}

/// `determinize` (then `minimize` if `minimal`) of the NFA (start, accept, edges as
/// (lo, hi, target) per state, epsilons per state); ValueError for an index out of
/// range, or with the reference's message past `max_states`.
#[pyfunction]
#[allow(clippy::type_complexity)]
fn nfa_to_dfa(
    py: Python<'_>,
    start: u32,
    accept: u32,
    edges: Vec<Vec<(u8, u8, u32)>>,
    epsilons: Vec<Vec<u32>>,
    max_states: i64,
    minimal: bool,
) -> PyResult<TableTuple> {
    let n = edges.len();
    let bad_edge = edges
        .iter()
        .flatten()
        .any(|&(lo, hi, t)| lo > hi || t as usize >= n);
    let bad_epsilon = epsilons.iter().flatten().any(|&t| t as usize >= n);
    if epsilons.len() != n || start as usize >= n || accept as usize >= n || bad_edge || bad_epsilon
    {
        return Err(value_error(format!(
            "malformed NFA: {n} states, {} epsilon lists, start {start}, accept {accept}",
            epsilons.len()
        )));
    }
    let nfa = Nfa {
        start,
        accept,
        edges,
        epsilons,
    };
    let table = detached(py, || {
        automata::determinize(&nfa, max_states).map(|t| {
            if minimal {
                automata::minimize(&t)
            } else {
                t
            }
        })
    })?
    .map_err(value_error)?;
    Ok(tuple_of(table))
}

/// The minimal DFA of a regex tree (`Node::decode`'s encoding): Thompson's construction,
/// the subset construction and the minimisation; ValueError for a malformed encoding, or
/// with the reference's message past `max_nfa_states` or `max_states`.
#[pyfunction]
fn regex_tree_to_dfa(
    py: Python<'_>,
    tree: Vec<i64>,
    max_nfa_states: i64,
    max_states: i64,
) -> PyResult<TableTuple> {
    let node =
        Node::decode(&tree).map_err(|msg| value_error(format!("malformed regex tree: {msg}")))?;
    let table = detached(py, || {
        let nfa = automata::build_nfa(&node, max_nfa_states)?;
        automata::determinize(&nfa, max_states).map(|t| automata::minimize(&t))
    })?
    .map_err(value_error)?;
    Ok(tuple_of(table))
}

/// Hopcroft's minimisation of a DFA (ValueError for malformed tables).
#[pyfunction]
fn minimize_dfa(py: Python<'_>, dfa: TableTuple) -> PyResult<TableTuple> {
    let table = table_of("dfa", dfa)?;
    Ok(tuple_of(detached(py, || automata::minimize(&table))?))
}

/// The minimal DFA of `a`'s strings that `b` accepts (`subtract`: does not accept);
/// ValueError for malformed tables, or with the reference's message past `max_states`.
#[pyfunction]
fn product_dfa(
    py: Python<'_>,
    a: TableTuple,
    b: TableTuple,
    subtract: bool,
    max_states: i64,
) -> PyResult<TableTuple> {
    let (a, b) = (table_of("a", a)?, table_of("b", b)?);
    let table =
        detached(py, || automata::product(&a, &b, subtract, max_states))?.map_err(value_error)?;
    Ok(tuple_of(table))
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(nfa_to_dfa, m)?)?;
    m.add_function(wrap_pyfunction!(regex_tree_to_dfa, m)?)?;
    m.add_function(wrap_pyfunction!(minimize_dfa, m)?)?;
    m.add_function(wrap_pyfunction!(product_dfa, m)?)?;
    m.add_class::<CompiledGrammarCore>()?;
    m.add_class::<EarleyCore>()?;
    m.add_class::<TokenTrieCore>()?;
    m.add_class::<MatcherCore>()?;
    Ok(())
}
