"""Pooling in Rust: drop-in replacements for `pyagent_ref.ops.pooling`.

Same functions, signatures, results and exceptions (classes, messages, check order) as
the reference, whose docstrings are the contract. Inputs are numpy arrays or torch CPU
tensors of float16, bfloat16, float32 or float64 (torch is optional and never imported
here); results come back in the input's library, in the compute dtype (float32, float64
for float64). Each op is one native call with the GIL released: a request's mean sums its
rows in row order, norms and dot products in vectorised partial sums, spans or rows in
parallel for large inputs. Sums run in another order than numpy's or torch's: results
agree with the reference within the specification's tolerance.

Differences from the reference:

- Only numpy arrays and torch CPU tensors: a tensor on another device raises TypeError
  (it is never copied silently), as does another array library.
- Non-contiguous arrays are copied to a contiguous one first (the reference reads any
  layout); `cosine_similarity` converts a and b to the compute dtype before the call.
- torch inputs that require grad are read through `detach()`; results carry no graph.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import _native
from . import _common as _c

__all__ = ["pool", "normalize", "classify", "cosine_similarity"]

POOLING_TYPES = ("last", "cls", "mean", "all")
ACTIVATIONS = ("softmax", "sigmoid", "none")


def _rows(x: Any, name: str) -> bool:
    """The reference's `_rows`: returns whether x is a torch tensor."""
    torch_in = _c.array_library(x, name)
    kind = _c.dtype_name(x)
    if kind not in _c.FLOAT_KINDS:
        raise TypeError(f"{name} must be a float array, got dtype {kind}")
    if x.ndim != 2:
        raise ValueError(f"{name} must have shape (rows, features), got shape {tuple(x.shape)}")
    return torch_in


def _contiguous(x: Any, name: str, torch_in: bool) -> np.ndarray:
    """The C-contiguous numpy array Rust reads for float array x (bfloat16 as int16 bits)."""
    return np.ascontiguousarray(_c.float_view(x, name, torch_in))


def _spans(query_start_loc: Any, num_tokens: int) -> np.ndarray:
    """The reference's `_spans` checks, in its order; query_start_loc as int64 numpy."""
    torch_in = _c.array_library(query_start_loc, "query_start_loc")
    kind = _c.dtype_name(query_start_loc)
    if "int" not in kind:
        raise TypeError(f"query_start_loc must be integers, got dtype {kind}")
    if query_start_loc.ndim != 1 or query_start_loc.shape[0] < 1:
        raise ValueError(
            f"query_start_loc must have shape (num_reqs + 1,), got {tuple(query_start_loc.shape)}"
        )
    if torch_in:
        _c.check_cpu(query_start_loc, "query_start_loc")
        query_start_loc = _c.tensor_to_numpy(query_start_loc)
    qsl = np.ascontiguousarray(query_start_loc, dtype=_c.I64)
    if qsl[0] < 0 or qsl[-1] > num_tokens:
        raise ValueError(
            f"query_start_loc must lie in [0, {num_tokens}] (the rows of hidden), "
            f"got {int(qsl[0])} .. {int(qsl[-1])}"
        )
    steps = np.flatnonzero(np.diff(qsl) <= 0)
    if steps.size:
        r = int(steps[0])
        raise ValueError(
            f"request {r} has no tokens to pool: query_start_loc[{r}] = {int(qsl[r])}, "
            f"query_start_loc[{r + 1}] = {int(qsl[r + 1])} (they must increase)"
        )
    return qsl


def pool(hidden: Any, query_start_loc: Any, pooling_type: str) -> Any:
    """Each request's hidden states reduced as `pooling_type` says.

    Contract: `pyagent_ref.ops.pooling.pool`.
    """
    torch_in = _rows(hidden, "hidden")
    if pooling_type not in POOLING_TYPES:
        raise ValueError(f"pooling_type must be one of {POOLING_TYPES}, got {pooling_type!r}")
    qsl = _spans(query_start_loc, hidden.shape[0])
    kind = POOLING_TYPES.index(pooling_type)
    out = _native.pool_rows(_contiguous(hidden, "hidden", torch_in), qsl, kind)
    return _c.wrap(out, torch_in)


def normalize(x: Any, dimensions: int | None = None) -> Any:
    """Each row scaled to unit L2 norm, after keeping its first `dimensions` features.

    Contract: `pyagent_ref.ops.pooling.normalize`.
    """
    torch_in = _rows(x, "x")
    features = x.shape[1]
    if dimensions is not None:
        if isinstance(dimensions, bool) or not isinstance(dimensions, int):
            raise TypeError(f"dimensions must be an int or None, got {dimensions!r}")
        if not 1 <= dimensions <= features:
            raise ValueError(
                f"dimensions must be in [1, {features}] (the embedding's size), got {dimensions}"
            )
    dims = features if dimensions is None else dimensions
    out = _native.normalize_rows(_contiguous(x, "x", torch_in), dims)
    return _c.wrap(out, torch_in)


def _all_finite(view: np.ndarray) -> np.ndarray:
    """Per row of a float view: whether every entry is finite (bfloat16 bits: an
    exponent that is not all ones)."""
    if view.dtype == _c.I16:
        return ((view & 0x7F80) != 0x7F80).all(axis=1)
    return np.isfinite(view).all(axis=1)


def classify(logits: Any, activation: str = "softmax") -> Any:
    """A classification head's scores as the model's outputs.

    Contract: `pyagent_ref.ops.pooling.classify`.
    """
    torch_in = _rows(logits, "logits")
    if logits.shape[1] == 0:
        raise ValueError(f"logits must have at least one label, got shape {tuple(logits.shape)}")
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
    view = _contiguous(logits, "logits", torch_in)
    finite = _all_finite(view)
    if not finite.all():
        raise ValueError(f"logits row {int(np.argmin(finite))} contains NaN or inf")
    out = _native.classify_rows(view, ACTIVATIONS.index(activation))
    return _c.wrap(out, torch_in)


def cosine_similarity(a: Any, b: Any) -> Any:
    """The cosine of the angle between a[i] and b[i], for every row i.

    Contract: `pyagent_ref.ops.pooling.cosine_similarity`.
    """
    torch_in = _rows(a, "a")
    torch_b = _rows(b, "b")
    if tuple(a.shape) != tuple(b.shape):
        raise ValueError(
            f"a and b must have the same shape, got {tuple(a.shape)} and {tuple(b.shape)}"
        )
    both64 = _c.dtype_name(a) == "float64" and _c.dtype_name(b) == "float64"
    compute = _c.F64 if both64 else _c.F32
    out = _native.cosine_rows(_as(a, compute, "a", torch_in), _as(b, compute, "b", torch_b))
    return _c.wrap(out, torch_in)


def _as(x: Any, dtype: np.dtype, name: str, torch_in: bool) -> np.ndarray:
    """Float array x in the compute dtype, C-contiguous numpy (the reference's astype)."""
    if torch_in:
        _c.check_cpu(x, name)
        return np.ascontiguousarray(x.detach().to(_c.torch_dtype(dtype)).numpy())
    return np.ascontiguousarray(np.asarray(x).astype(dtype))
