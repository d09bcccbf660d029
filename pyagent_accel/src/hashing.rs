//! Kernels of `pyagent_accel.ops.hashing`: deterministic CBOR (RFC 8949 4.2.1, the
//! subset of `pyagent_ref.ops.hashing`) and chained prefix-cache block hashes.
//!
//! hash_i = H(cbor([hash_{i-1}, [t_0, ..., t_{B-1}], [key, ...]])), H = SHA-256 or
//! XXH3-128 (big-endian digest). The bytes are identical to the reference's, so the
//! hashes are too.

use numpy::{PyArray1, PyReadonlyArray1};
use pyo3::exceptions::{PyRecursionError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyByteArray, PyBytes, PyInt, PyList, PyString, PyTuple};
use sha2::{Digest, Sha256};

use crate::py_util::{detached, slice};

pub const ROOT_LABEL: &str = "pyagent.prefix-cache.v1";

/// Append a CBOR head: major type in the top 3 bits, argument n in the shortest form.
#[inline(always)]
pub fn head(out: &mut Vec<u8>, major: u8, n: u64) {
    let m = major << 5;
    if n < 24 {
        out.push(m | n as u8);
    } else if n <= u8::MAX as u64 {
        out.extend_from_slice(&[m | 24, n as u8]);
    } else if n <= u16::MAX as u64 {
        out.push(m | 25);
        out.extend_from_slice(&(n as u16).to_be_bytes());
    } else if n <= u32::MAX as u64 {
        out.push(m | 26);
        out.extend_from_slice(&(n as u32).to_be_bytes());
    } else {
        out.push(m | 27);
        out.extend_from_slice(&n.to_be_bytes());
    }
}

/// A CBOR value of the subset (used by the tests and for the root label).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Value {
    Uint(u64),
    /// -1 - n
    Nint(u64),
    Bytes(Vec<u8>),
    Text(String),
    Array(Vec<Value>),
}

impl Value {
    pub fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Value::Uint(n) => head(out, 0, *n),
            Value::Nint(n) => head(out, 1, *n),
            Value::Bytes(b) => {
                head(out, 2, b.len() as u64);
                out.extend_from_slice(b);
            }
            Value::Text(s) => {
                head(out, 3, s.len() as u64);
                out.extend_from_slice(s.as_bytes());
            }
            Value::Array(v) => {
                head(out, 4, v.len() as u64);
                for x in v {
                    x.encode(out);
                }
            }
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Algorithm {
    Sha256,
    Xxh3_128,
}

impl Algorithm {
    fn from_code(code: u8) -> PyResult<Self> {
        match code {
            0 => Ok(Algorithm::Sha256),
            1 => Ok(Algorithm::Xxh3_128),
            _ => Err(PyValueError::new_err(format!(
                "unknown algorithm code {code}"
            ))),
        }
    }

    pub fn size(self) -> usize {
        match self {
            Algorithm::Sha256 => 32,
            Algorithm::Xxh3_128 => 16,
        }
    }

    /// The digest of `data` into `out` (len `size()`).
    #[inline(always)]
    pub fn digest(self, data: &[u8], out: &mut [u8]) {
        match self {
            Algorithm::Sha256 => out.copy_from_slice(&Sha256::digest(data)),
            // xxhash's digest(): the 128-bit value big-endian
            Algorithm::Xxh3_128 => {
                out.copy_from_slice(&xxhash_rust::xxh3::xxh3_128(data).to_be_bytes())
            }
        }
    }
}

pub fn root_digest(alg: Algorithm) -> Vec<u8> {
    let mut enc = Vec::new();
    Value::Text(ROOT_LABEL.to_owned()).encode(&mut enc);
    let mut out = vec![0u8; alg.size()];
    alg.digest(&enc, &mut out);
    out
}

/// Append the CBOR of one block, [parent, tokens, keys] (keys already encoded).
#[inline(always)]
pub fn encode_block(out: &mut Vec<u8>, parent: &[u8], tokens: &[u64], keys: &[u8]) {
    out.clear();
    out.push(0x83);
    head(out, 2, parent.len() as u64);
    out.extend_from_slice(parent);
    head(out, 4, tokens.len() as u64);
    for &t in tokens {
        head(out, 0, t);
    }
    out.extend_from_slice(keys);
}

/// The chained hashes of the blocks of `tokens`; `keys(i)` is block i's encoded keys.
pub fn chain<'k>(
    alg: Algorithm,
    parent: &[u8],
    tokens: &[u64],
    block_size: usize,
    keys: impl Fn(usize) -> &'k [u8],
) -> Vec<u8> {
    let size = alg.size();
    let n = tokens.len() / block_size;
    let mut out = vec![0u8; n * size];
    let mut buf = Vec::with_capacity(8 + size + 9 * block_size + 64);
    let mut prev = parent.to_vec();
    for (i, (block, dst)) in tokens
        .chunks_exact(block_size)
        .zip(out.chunks_exact_mut(size))
        .enumerate()
    {
        encode_block(&mut buf, &prev, block, keys(i));
        alg.digest(&buf, dst);
        prev.clear();
        prev.extend_from_slice(dst);
    }
    out
}

// ---------------------------------------------------------------------------------
// Python objects -> CBOR

struct RecursionGuard;

impl RecursionGuard {
    fn enter(py: Python<'_>) -> PyResult<Self> {
        // SAFETY: called with the GIL held (we hold a Python token in every caller).
        let rc = unsafe { pyo3::ffi::Py_EnterRecursiveCall(c" while encoding CBOR".as_ptr()) };
        if rc != 0 {
            return Err(PyErr::fetch(py));
        }
        Ok(RecursionGuard)
    }
}

impl Drop for RecursionGuard {
    fn drop(&mut self) {
        // SAFETY: paired with a successful Py_EnterRecursiveCall on this thread.
        unsafe { pyo3::ffi::Py_LeaveRecursiveCall() }
    }
}

const MAX_DEPTH: usize = 10_000;

fn encode_int(out: &mut Vec<u8>, v: &Bound<'_, PyAny>) -> PyResult<()> {
    if let Ok(n) = v.extract::<u64>() {
        head(out, 0, n);
        return Ok(());
    }
    if let Ok(n) = v.extract::<i64>() {
        // negative (non-negative ints that fit were taken above)
        head(out, 1, (-1 - n) as u64);
        return Ok(());
    }
    // |v| >= 2**63: the argument is v or -1 - v
    let zero = 0i64.into_pyobject(v.py())?;
    let arg = if v.lt(&zero)? {
        (-1i64).into_pyobject(v.py())?.sub(v)?
    } else {
        v.clone()
    };
    match arg.extract::<u64>() {
        Ok(n) => {
            head(out, 1, n);
            Ok(())
        }
        Err(_) => Err(PyValueError::new_err(format!(
            "integer {} does not fit in 64 bits",
            arg.str()?
        ))),
    }
}

/// The reference's `cbor_encode`, appending to `out`.
pub fn encode_py(out: &mut Vec<u8>, v: &Bound<'_, PyAny>, depth: usize) -> PyResult<()> {
    if v.is_instance_of::<PyBool>() {
        return Err(PyTypeError::new_err(format!(
            "cannot encode {}: bool is not part of the encoding",
            v.repr()?
        )));
    }
    if v.is_instance_of::<PyInt>() {
        return encode_int(out, v);
    }
    if let Ok(b) = v.cast::<PyBytes>() {
        let b = b.as_bytes();
        head(out, 2, b.len() as u64);
        out.extend_from_slice(b);
        return Ok(());
    }
    if let Ok(b) = v.cast::<PyByteArray>() {
        let b = b.to_vec();
        head(out, 2, b.len() as u64);
        out.extend_from_slice(&b);
        return Ok(());
    }
    if let Ok(s) = v.cast::<PyString>() {
        let s = s.to_str()?;
        head(out, 3, s.len() as u64);
        out.extend_from_slice(s.as_bytes());
        return Ok(());
    }
    let is_seq = v.is_instance_of::<PyList>() || v.is_instance_of::<PyTuple>();
    if is_seq {
        if depth >= MAX_DEPTH {
            return Err(PyRecursionError::new_err(
                "maximum recursion depth exceeded while encoding CBOR",
            ));
        }
        let _guard = RecursionGuard::enter(v.py())?;
        if let Ok(l) = v.cast::<PyList>() {
            head(out, 4, l.len() as u64);
            // by index: a list mutated by an element's __repr__ cannot invalidate us
            let mut i = 0;
            while i < l.len() {
                encode_py(out, &l.get_item(i)?, depth + 1)?;
                i += 1;
            }
        } else {
            let t = v.cast::<PyTuple>()?;
            head(out, 4, t.len() as u64);
            for item in t.iter() {
                encode_py(out, &item, depth + 1)?;
            }
        }
        return Ok(());
    }
    Err(PyTypeError::new_err(format!(
        "cannot encode a value of type {}",
        v.get_type().name()?
    )))
}

const TAGS: [(&str, usize); 3] = [("lora", 2), ("mm", 3), ("salt", 2)];

fn is_int(v: &Bound<'_, PyAny>) -> bool {
    v.is_instance_of::<PyInt>() && !v.is_instance_of::<PyBool>()
}

/// The reference's `_check_extra_keys(keys, name)` followed by the CBOR of the checked
/// list (an array of arrays), appended to `out`.
pub fn encode_keys(out: &mut Vec<u8>, keys: &Bound<'_, PyAny>, name: &str) -> PyResult<()> {
    let items: Vec<Bound<'_, PyAny>> = if let Ok(l) = keys.cast::<PyList>() {
        l.iter().collect()
    } else if let Ok(t) = keys.cast::<PyTuple>() {
        t.iter().collect()
    } else {
        return Err(PyTypeError::new_err(format!(
            "{name} must be a sequence of tagged tuples, got {}",
            keys.repr()?
        )));
    };
    let start = out.len();
    head(out, 4, items.len() as u64);
    for key in &items {
        let fields: Vec<Bound<'_, PyAny>> = if let Ok(l) = key.cast::<PyList>() {
            l.iter().collect()
        } else if let Ok(t) = key.cast::<PyTuple>() {
            t.iter().collect()
        } else {
            Vec::new()
        };
        let is_seq = key.is_instance_of::<PyList>() || key.is_instance_of::<PyTuple>();
        let untagged = || -> PyResult<PyErr> {
            Ok(PyValueError::new_err(format!(
                "{name} entries must be tuples tagged ['lora', 'mm', 'salt'], got {}",
                key.repr()?
            )))
        };
        if !is_seq || fields.is_empty() {
            out.truncate(start);
            return Err(untagged()?);
        }
        let tag_obj = &fields[0];
        let tag = match tag_obj.cast::<PyString>() {
            Ok(s) => {
                let s = s.to_str()?;
                TAGS.iter().find(|(t, _)| *t == s).copied()
            }
            Err(_) => {
                // `key[0] in EXTRA_KEY_ARITY` hashes it: unhashable -> TypeError
                tag_obj.hash()?;
                None
            }
        };
        let Some((tag, arity)) = tag else {
            out.truncate(start);
            return Err(untagged()?);
        };
        if fields.len() != arity {
            out.truncate(start);
            return Err(PyValueError::new_err(format!(
                "{name}: a {} key has {arity} fields, got {}",
                tag_obj.repr()?,
                key.repr()?
            )));
        }
        let ok = match tag {
            "lora" => fields[1].is_instance_of::<PyString>() || is_int(&fields[1]),
            "mm" => {
                (fields[1].is_instance_of::<PyString>() || fields[1].is_instance_of::<PyBytes>())
                    && is_int(&fields[2])
                    && fields[2].ge(0)?
            }
            _ => fields[1].is_instance_of::<PyString>(),
        };
        if !ok {
            out.truncate(start);
            return Err(PyValueError::new_err(format!(
                "{name}: malformed {} key {}",
                tag_obj.repr()?,
                key.repr()?
            )));
        }
    }
    // all keys valid: encode them (only a lora id beyond 64 bits can still fail)
    for key in &items {
        let fields: Vec<Bound<'_, PyAny>> = match key.cast::<PyList>() {
            Ok(l) => l.iter().collect(),
            Err(_) => key.cast::<PyTuple>()?.iter().collect(),
        };
        head(out, 4, fields.len() as u64);
        for f in &fields {
            if let Err(e) = encode_py(out, f, 1) {
                out.truncate(start);
                return Err(e);
            }
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------
// Python bindings

/// tokens_from_seq(seq, name): a list/tuple of ints as a uint64 array, with the
/// reference's per-element TypeError / ValueError.
#[pyfunction]
fn tokens_from_seq<'py>(
    py: Python<'py>,
    seq: &Bound<'py, PyAny>,
    name: &str,
) -> PyResult<Bound<'py, PyArray1<u64>>> {
    let check = |i: usize, t: &Bound<'py, PyAny>| -> PyResult<u64> {
        if t.is_instance_of::<PyBool>() || !t.is_instance_of::<PyInt>() {
            return Err(PyTypeError::new_err(format!(
                "{name}[{i}] must be an int, got {}",
                t.repr()?
            )));
        }
        t.extract::<u64>().map_err(|_| match t.str() {
            Ok(s) => PyValueError::new_err(format!("{name}[{i}] must be in [0, 2**64), got {s}")),
            Err(e) => e,
        })
    };
    let mut out = Vec::new();
    if let Ok(l) = seq.cast::<PyList>() {
        out.reserve(l.len());
        let mut i = 0;
        while i < l.len() {
            out.push(check(i, &l.get_item(i)?)?);
            i += 1;
        }
    } else if let Ok(t) = seq.cast::<PyTuple>() {
        out.reserve(t.len());
        for (i, item) in t.iter().enumerate() {
            out.push(check(i, &item)?);
        }
    } else {
        return Err(PyTypeError::new_err(format!(
            "{name} must be a list or tuple"
        )));
    }
    Ok(PyArray1::from_vec(py, out))
}

#[pyfunction]
fn cbor_encode<'py>(py: Python<'py>, value: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyBytes>> {
    let mut out = Vec::new();
    encode_py(&mut out, value, 0)?;
    Ok(PyBytes::new(py, &out))
}

#[pyfunction]
fn root_hash(py: Python<'_>, algorithm: u8) -> PyResult<Bound<'_, PyBytes>> {
    let alg = Algorithm::from_code(algorithm)?;
    Ok(PyBytes::new(py, &root_digest(alg)))
}

fn check_parent(parent: &[u8], alg: Algorithm) -> PyResult<()> {
    if parent.len() != alg.size() {
        return Err(PyValueError::new_err(format!(
            "parent must be {} bytes, got {} bytes",
            alg.size(),
            parent.len()
        )));
    }
    Ok(())
}

#[pyfunction]
fn hash_block<'py>(
    py: Python<'py>,
    parent: &[u8],
    tokens: PyReadonlyArray1<'py, u64>,
    extra_keys: &Bound<'py, PyAny>,
    algorithm: u8,
) -> PyResult<Bound<'py, PyBytes>> {
    let alg = Algorithm::from_code(algorithm)?;
    check_parent(parent, alg)?;
    let toks = slice(&tokens, "token_ids")?;
    let mut keys = Vec::new();
    encode_keys(&mut keys, extra_keys, "extra_keys")?;
    let mut buf = Vec::with_capacity(16 + parent.len() + 9 * toks.len() + keys.len());
    encode_block(&mut buf, parent, toks, &keys);
    let mut out = vec![0u8; alg.size()];
    if buf.len() > 1 << 16 {
        detached(py, || alg.digest(&buf, &mut out))?;
    } else {
        alg.digest(&buf, &mut out);
    }
    Ok(PyBytes::new(py, &out))
}

/// hash_blocks(tokens, block_size, extra_keys, algorithm, parent): extra_keys is None
/// or a list/tuple with one key sequence per full block (length checked by the caller).
#[pyfunction]
fn hash_blocks<'py>(
    py: Python<'py>,
    tokens: PyReadonlyArray1<'py, u64>,
    block_size: usize,
    extra_keys: Option<&Bound<'py, PyAny>>,
    algorithm: u8,
    parent: &[u8],
) -> PyResult<Bound<'py, PyList>> {
    let alg = Algorithm::from_code(algorithm)?;
    check_parent(parent, alg)?;
    if block_size == 0 {
        return Err(PyValueError::new_err("block_size must be >= 1, got 0"));
    }
    let toks = slice(&tokens, "token_ids")?;
    let n = toks.len() / block_size;
    // Encode every block's keys first, in block order, so the first malformed key
    // raises as it would in the reference's loop.
    let mut kbuf: Vec<u8> = Vec::new();
    let mut offs: Vec<usize> = Vec::with_capacity(n + 1);
    offs.push(0);
    match extra_keys {
        None => {}
        Some(ek) => {
            let per_block: Vec<Bound<'py, PyAny>> = if let Ok(l) = ek.cast::<PyList>() {
                l.iter().collect()
            } else {
                ek.cast::<PyTuple>()
                    .map_err(|_| PyTypeError::new_err("extra_keys must be a list or tuple"))?
                    .iter()
                    .collect()
            };
            if per_block.len() != n {
                return Err(PyValueError::new_err(format!(
                    "extra_keys must have one entry per full block ({n}), got {}",
                    per_block.len()
                )));
            }
            for keys in &per_block {
                encode_keys(&mut kbuf, keys, "extra_keys")?;
                offs.push(kbuf.len());
            }
        }
    }
    let none_keys = [0x80u8];
    let has_keys = extra_keys.is_some();
    let digests = detached(py, || {
        if !has_keys {
            chain(alg, parent, toks, block_size, |_| &none_keys[..])
        } else {
            chain(alg, parent, toks, block_size, |i| {
                &kbuf[offs[i]..offs[i + 1]]
            })
        }
    })?;
    let size = alg.size();
    let items: Vec<Bound<'py, PyBytes>> = digests
        .chunks_exact(size)
        .map(|d| PyBytes::new(py, d))
        .collect();
    PyList::new(py, items)
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(tokens_from_seq, m)?)?;
    m.add_function(wrap_pyfunction!(cbor_encode, m)?)?;
    m.add_function(wrap_pyfunction!(root_hash, m)?)?;
    m.add_function(wrap_pyfunction!(hash_block, m)?)?;
    m.add_function(wrap_pyfunction!(hash_blocks, m)?)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    fn enc(v: Value) -> String {
        let mut out = Vec::new();
        v.encode(&mut out);
        hex(&out)
    }

    #[test]
    fn rfc8949_appendix_a() {
        use Value::*;
        let ints: [(u64, &str); 11] = [
            (0, "00"),
            (1, "01"),
            (10, "0a"),
            (23, "17"),
            (24, "1818"),
            (25, "1819"),
            (100, "1864"),
            (1000, "1903e8"),
            (1_000_000, "1a000f4240"),
            (1_000_000_000_000, "1b000000e8d4a51000"),
            (18_446_744_073_709_551_615, "1bffffffffffffffff"),
        ];
        for (n, want) in ints {
            assert_eq!(enc(Uint(n)), want, "{n}");
        }
        // -18446744073709551616, -1, -10, -100, -1000
        assert_eq!(enc(Nint(u64::MAX)), "3bffffffffffffffff");
        assert_eq!(enc(Nint(0)), "20");
        assert_eq!(enc(Nint(9)), "29");
        assert_eq!(enc(Nint(99)), "3863");
        assert_eq!(enc(Nint(999)), "3903e7");
        assert_eq!(enc(Bytes(vec![])), "40");
        assert_eq!(enc(Bytes(vec![1, 2, 3, 4])), "4401020304");
        assert_eq!(enc(Text("".into())), "60");
        assert_eq!(enc(Text("a".into())), "6161");
        assert_eq!(enc(Text("IETF".into())), "6449455446");
        assert_eq!(enc(Text("\"\\".into())), "62225c");
        assert_eq!(enc(Text("\u{00fc}".into())), "62c3bc");
        assert_eq!(enc(Text("\u{6c34}".into())), "63e6b0b4");
        assert_eq!(enc(Text("\u{10151}".into())), "64f0908591");
        assert_eq!(enc(Array(vec![])), "80");
        assert_eq!(enc(Array(vec![Uint(1), Uint(2), Uint(3)])), "83010203");
        assert_eq!(
            enc(Array(vec![
                Uint(1),
                Array(vec![Uint(2), Uint(3)]),
                Array(vec![Uint(4), Uint(5)])
            ])),
            "8301820203820405"
        );
        assert_eq!(
            enc(Array((1..=25).map(Uint).collect())),
            "98190102030405060708090a0b0c0d0e0f101112131415161718181819"
        );
    }

    #[test]
    fn root_hashes_match_reference() {
        // pyagent_ref.ops.hashing.root_hash("sha256") / ("xxh3_128")
        assert_eq!(
            hex(&root_digest(Algorithm::Sha256)),
            "c813061e0f9e329d3eca0c882aec0cd365d221ae00ee7c90d9350e962601dc44"
        );
        assert_eq!(
            hex(&root_digest(Algorithm::Xxh3_128)),
            "6122996dd50c4f84c78fd6b44a1abd7b"
        );
    }

    #[test]
    fn chain_matches_reference() {
        // pyagent_ref.ops.hashing.hash_blocks(list(range(40)), 16)[1]
        let tokens: Vec<u64> = (0..40).collect();
        let root = root_digest(Algorithm::Sha256);
        let out = chain(Algorithm::Sha256, &root, &tokens, 16, |_| &[0x80][..]);
        assert_eq!(out.len(), 64);
        assert_eq!(
            hex(&out[32..]),
            "c1007531be6e07bddc6b8247e8a1e82bcd530e8fe675a5c2791aa0d4f9b8b550"
        );
    }

    #[test]
    fn xxh3_digest_is_big_endian() {
        // xxhash.xxh3_128(b"abc").digest()
        let mut out = [0u8; 16];
        Algorithm::Xxh3_128.digest(b"abc", &mut out);
        assert_eq!(hex(&out), "06b05ab6733a618578af5f94892f3950");
    }
}
