"""State-space layers in Rust: drop-in replacements for `pyagent_ref.ops.ssm`.

Same functions, signatures, results and exceptions (classes, messages, check order) as
the reference, whose docstrings are the contract. The scans run the recurrence token by
token, each (sequence, head) on its own thread when there is enough work: `ssd_scan`
takes and checks `chunk_size` but does not evaluate by chunks (the contract makes every
chunk size give the token-by-token result up to rounding; on a CPU the sequential
recurrence is the cheaper evaluation), nor does `selective_scan`.

Inputs are numpy arrays or torch CPU tensors of float16, bfloat16, float32 or float64
(torch is optional and never imported here). Each op is one native call with the GIL
released, on the inputs widened exactly to the compute dtype (float32, float64 for
float64 x): a convolution adds its taps oldest first onto the bias and is rounded once
to x's dtype, its new state moves inputs (exact); a state step follows the reference's
order of operations and sums the state features in order. Sums run in another order
than numpy's or torch's: results agree with the reference within the specification's
tolerance.

Differences from the reference:

- Only numpy arrays and torch CPU tensors: a tensor on another device raises TypeError
  (it is never copied silently), as does another array library.
- Inputs that are not float32 / float64 C-contiguous arrays are converted (copied) to
  the compute dtype first; torch inputs that require grad are read through `detach()`.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from .. import _native
from . import _common as _c

__all__ = ["causal_conv1d", "selective_scan", "ssd_scan", "selective_state_update"]

ACTIVATIONS = (None, "silu")


def _float_array(x: Any, name: str, shape: tuple[int | None, ...]) -> bool:
    """The reference's `_float_array`: a float array of `shape` (None: any length);
    returns whether it is a torch tensor."""
    torch_in = _c.array_library(x, name)
    kind = _c.dtype_name(x)
    if kind not in _c.FLOAT_KINDS:
        raise TypeError(f"{name} must be a float array, got dtype {kind}")
    if x.ndim != len(shape) or any(
        w is not None and w != n for w, n in zip(shape, x.shape, strict=True)
    ):
        want = ", ".join("*" if w is None else str(w) for w in shape)
        want = f"({want},)" if len(shape) == 1 else f"({want})"
        raise ValueError(f"{name} must have shape {want}, got {tuple(x.shape)}")
    return torch_in


def _optional(x: Any, name: str, shape: tuple[int | None, ...]) -> None:
    if x is not None:
        _float_array(x, name, shape)


def _compute(x: Any, name: str, dtype: np.dtype) -> np.ndarray:
    """x (or None: an empty array) flat, C-contiguous, in the compute dtype (numpy)."""
    if x is None:
        return np.zeros(0, dtype)
    if _c.is_torch(x):
        _c.check_cpu(x, name)
        t = x.detach().to(_c.torch_dtype(dtype)).contiguous()
        return _c.tensor_to_numpy(t).reshape(-1)
    return np.ascontiguousarray(np.asarray(x).astype(dtype, copy=False)).reshape(-1)


def _compute_dtype(x: Any) -> np.dtype:
    return _c.F64 if _c.dtype_name(x) == "float64" else _c.F32


def _query_start_loc(query_start_loc: Any, num_tokens: int, num_seqs: int) -> np.ndarray:
    """The reference's `_check_query_start_loc`; the values as int64 numpy."""
    torch_in = _c.array_library(query_start_loc, "query_start_loc")
    kind = _c.dtype_name(query_start_loc)
    if "int" not in kind:
        raise TypeError(f"query_start_loc must be integers, got dtype {kind}")
    if tuple(query_start_loc.shape) != (num_seqs + 1,):
        raise ValueError(
            f"query_start_loc must have shape ({num_seqs + 1},) (one more than the "
            f"sequences of the state), got {tuple(query_start_loc.shape)}"
        )
    if torch_in:
        _c.check_cpu(query_start_loc, "query_start_loc")
        query_start_loc = _c.tensor_to_numpy(query_start_loc)
    qsl = np.ascontiguousarray(query_start_loc, dtype=_c.I64)
    if qsl[0] != 0 or qsl[-1] != num_tokens or (np.diff(qsl) < 0).any():
        raise ValueError(
            f"query_start_loc must rise from 0 to the {num_tokens} tokens, got {qsl.tolist()}"
        )
    return qsl


def _back(out: np.ndarray, shape: tuple[int, ...], torch_in: bool, like: Any = None) -> Any:
    """A flat Rust result reshaped, in the input's library, cast to `like`'s dtype when
    given (the reference's final astype)."""
    out = out.reshape(shape)
    if torch_in:
        t = sys.modules["torch"].from_numpy(out)
        return t if like is None or t.dtype == like.dtype else t.to(like.dtype)
    return out if like is None or out.dtype == like.dtype else out.astype(like.dtype)


def causal_conv1d(
    x: Any,
    weight: Any,
    bias: Any,
    conv_state: Any,
    query_start_loc: Any,
    activation: str | None = None,
) -> tuple[Any, Any]:
    """Depthwise causal 1-D convolution of each sequence, continuing from its carried
    inputs.

    Contract: `pyagent_ref.ops.ssm.causal_conv1d`.
    """
    torch_in = _float_array(x, "x", (None, None))
    num_tokens, channels = x.shape
    _float_array(weight, "weight", (channels, None))
    width = weight.shape[1]
    if width < 1:
        raise ValueError(f"weight must have a width >= 1, got shape {tuple(weight.shape)}")
    _optional(bias, "bias", (channels,))
    _float_array(conv_state, "conv_state", (None, channels, width - 1))
    kind = _c.dtype_name(x)
    for name, a in (("weight", weight), ("bias", bias), ("conv_state", conv_state)):
        if a is not None and _c.dtype_name(a) != kind:
            raise TypeError(f"{name} must have x's dtype {kind}, got {_c.dtype_name(a)}")
    num_seqs = conv_state.shape[0]
    qsl = _query_start_loc(query_start_loc, num_tokens, num_seqs)
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
    dtype = _compute_dtype(x)
    out, state = _native.ssm_conv1d(
        _compute(x, "x", dtype),
        _compute(weight, "weight", dtype),
        _compute(bias, "bias", dtype),
        _compute(conv_state, "conv_state", dtype),
        qsl,
        channels,
        width,
        activation == "silu",
    )
    return (
        _back(out, (num_tokens, channels), torch_in, x),
        _back(state, tuple(conv_state.shape), torch_in, conv_state),
    )


def _check_chunk_size(chunk_size: Any, optional: bool) -> None:
    """The reference's chunk_size checks (None allowed when `optional`)."""
    if optional and chunk_size is None:
        return
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int):
        kind = "None or an int" if optional else "an int"
        raise TypeError(f"chunk_size must be {kind}, got {type(chunk_size).__name__}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")


def _scan_params(dt: Any, B: Any, C: Any, D: Any, dt_bias: Any, rows: int, heads: int) -> int:
    """The reference's `_check_scan_params`; returns the number of groups."""
    _float_array(dt, "dt", (rows, heads))
    _float_array(B, "B", (rows, None, None))
    groups = B.shape[1]
    _float_array(C, "C", tuple(B.shape))
    if groups < 1 or heads % groups:
        raise ValueError(f"B's groups ({groups}) must divide the {heads} heads")
    _optional(D, "D", (heads,))
    _optional(dt_bias, "dt_bias", (heads,))
    return groups


def selective_scan(
    x: Any,
    dt: Any,
    A: Any,
    B: Any,
    C: Any,
    state: Any,
    query_start_loc: Any,
    D: Any = None,
    z: Any = None,
    dt_bias: Any = None,
    dt_softplus: bool = False,
    chunk_size: int | None = None,
) -> tuple[Any, Any]:
    """Mamba-1's selective scan of each sequence, from its state.

    Contract: `pyagent_ref.ops.ssm.selective_scan`.
    """
    torch_in = _float_array(x, "x", (None, None))
    num_tokens, channels = x.shape
    _float_array(A, "A", (channels, None))
    n = A.shape[1]
    _float_array(dt, "dt", (num_tokens, channels))
    _float_array(B, "B", (num_tokens, n))
    _float_array(C, "C", (num_tokens, n))
    _float_array(state, "state", (None, channels, n))
    qsl = _query_start_loc(query_start_loc, num_tokens, state.shape[0])
    _optional(D, "D", (channels,))
    _optional(z, "z", (num_tokens, channels))
    _optional(dt_bias, "dt_bias", (channels,))
    _check_chunk_size(chunk_size, optional=True)
    dtype = _compute_dtype(x)
    arrays = ((x, "x"), (dt, "dt"), (A, "A"), (B, "B"), (C, "C"), (state, "state"))
    y, new = _native.ssm_selective_scan(
        *(_compute(a, name, dtype) for a, name in arrays),
        qsl,
        _compute(D, "D", dtype),
        _compute(z, "z", dtype),
        _compute(dt_bias, "dt_bias", dtype),
        bool(dt_softplus),
        channels,
        n,
    )
    return _back(y, (num_tokens, channels), torch_in), _back(new, tuple(state.shape), torch_in)


def ssd_scan(
    x: Any,
    dt: Any,
    A: Any,
    B: Any,
    C: Any,
    state: Any,
    query_start_loc: Any,
    chunk_size: int = 256,
    D: Any = None,
    dt_bias: Any = None,
    dt_softplus: bool = False,
) -> tuple[Any, Any]:
    """Mamba-2's selective scan (state space duality) of each sequence, from its state.

    Contract: `pyagent_ref.ops.ssm.ssd_scan`.
    """
    torch_in = _float_array(x, "x", (None, None, None))
    num_tokens, heads, p = x.shape
    _float_array(A, "A", (heads,))
    groups = _scan_params(dt, B, C, D, dt_bias, num_tokens, heads)
    n = B.shape[2]
    _float_array(state, "state", (None, heads, p, n))
    qsl = _query_start_loc(query_start_loc, num_tokens, state.shape[0])
    _check_chunk_size(chunk_size, optional=False)
    dtype = _compute_dtype(x)
    arrays = ((x, "x"), (dt, "dt"), (A, "A"), (B, "B"), (C, "C"), (state, "state"))
    y, new = _native.ssm_ssd_scan(
        *(_compute(a, name, dtype) for a, name in arrays),
        qsl,
        _compute(D, "D", dtype),
        _compute(dt_bias, "dt_bias", dtype),
        bool(dt_softplus),
        heads,
        p,
        groups,
        n,
    )
    return _back(y, (num_tokens, heads, p), torch_in), _back(new, tuple(state.shape), torch_in)


def selective_state_update(
    state: Any,
    x: Any,
    dt: Any,
    A: Any,
    B: Any,
    C: Any,
    D: Any = None,
    dt_bias: Any = None,
    dt_softplus: bool = False,
) -> tuple[Any, Any]:
    """One token of Mamba-2's recurrence for each of a batch of sequences.

    Contract: `pyagent_ref.ops.ssm.selective_state_update`.
    """
    torch_in = _float_array(x, "x", (None, None, None))
    num_seqs, heads, p = x.shape
    _float_array(A, "A", (heads,))
    groups = _scan_params(dt, B, C, D, dt_bias, num_seqs, heads)
    n = B.shape[2]
    _float_array(state, "state", (num_seqs, heads, p, n))
    dtype = _compute_dtype(x)
    arrays = (
        (state, "state"),
        (x, "x"),
        (dt, "dt"),
        (A, "A"),
        (B, "B"),
        (C, "C"),
        (D, "D"),
        (dt_bias, "dt_bias"),
    )
    y, new = _native.ssm_state_update(
        *(_compute(a, name, dtype) for a, name in arrays),
        bool(dt_softplus),
        num_seqs,
        heads,
        p,
        groups,
        n,
    )
    return _back(y, (num_seqs, heads, p), torch_in), _back(new, tuple(state.shape), torch_in)
