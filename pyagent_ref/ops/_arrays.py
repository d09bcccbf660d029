"""Argument checking and the two non-standard array primitives the ops need.

Every op takes its array namespace from its inputs (numpy, torch on any device), so
the helpers here are written once against the array API standard. The one thing the
standard lacks, a scatter-add, is isolated in `bincount_rows`.
"""

from __future__ import annotations

from typing import Any

from array_api_compat import array_namespace, device, is_torch_array, is_torch_namespace

FLOAT_DTYPE_NAMES = ("float32", "float64")
ANY_FLOAT_DTYPE_NAMES = ("float16", "bfloat16", "float32", "float64")
"""The float dtypes of ops that only move or mask values (layers, structured)."""


def dtype_name(x: Any) -> str:
    """'float32', 'int64', ... for a numpy array or torch tensor."""
    return str(x.dtype).removeprefix("torch.")


def namespace(x: Any, name: str) -> Any:
    """The array namespace of `x`, or TypeError naming the parameter."""
    try:
        return array_namespace(x)
    except TypeError:
        raise TypeError(
            f"{name} must be a numpy array or a torch tensor, got {type(x).__name__}"
        ) from None


def check_logits(x: Any, name: str = "logits", allow_all_masked: bool = False) -> Any:
    """Validate a (batch, vocab) float32/float64 array of logits; return its namespace.

    Entries may be finite or -inf. NaN and +inf raise ValueError, as does a row that is
    entirely -inf (unless `allow_all_masked`), because no distribution is defined on it.
    """
    xp = namespace(x, name)
    if dtype_name(x) not in FLOAT_DTYPE_NAMES:
        raise TypeError(f"{name} must be float32 or float64, got dtype {dtype_name(x)}")
    if x.ndim != 2:
        raise ValueError(f"{name} must have shape (batch, vocab), got shape {tuple(x.shape)}")
    if x.shape[1] == 0:
        raise ValueError(f"{name} must have a non-empty vocab axis, got shape {tuple(x.shape)}")
    bad = xp.isnan(x) | (x == float("inf"))
    if bool(xp.any(bad)):
        row = int(xp.argmax(xp.astype(xp.any(bad, axis=1), xp.int8)))
        raise ValueError(f"{name} row {row} contains NaN or +inf")
    if not allow_all_masked:
        dead = xp.all(x == float("-inf"), axis=1)
        if bool(xp.any(dead)):
            row = int(xp.argmax(xp.astype(dead, xp.int8)))
            raise ValueError(f"{name} row {row} is entirely -inf")
    return xp


def check_token_bitmask(bitmask: Any, batch: int | None = None, name: str = "bitmask") -> Any:
    """Validate a token bitmask in the shared layout; return its namespace.

    The layout (llguidance, xgrammar, vLLM): int32 of shape (batch, words), bit j (least
    significant first) of word w standing for token 32 * w + j. `batch`, if given, is the
    number of rows the caller needs.
    """
    xp = namespace(bitmask, name)
    if dtype_name(bitmask) != "int32":
        raise TypeError(
            f"{name} must be int32 (32 tokens per word), got dtype {dtype_name(bitmask)}"
        )
    if bitmask.ndim != 2:
        raise ValueError(f"{name} must have shape (batch, words), got shape {tuple(bitmask.shape)}")
    if batch is not None and bitmask.shape[0] != batch:
        raise ValueError(
            f"{name} must have {batch} rows (one per logits row), got shape {tuple(bitmask.shape)}"
        )
    return xp


def row_param(like: Any, value: Any, name: str, dtype: Any) -> Any:
    """Per-row parameter `value` as a (batch,) array of `dtype` on the device of `like`.

    Accepts any array-like of numbers (numpy array, torch tensor, Python sequence).
    A scalar is not broadcast: a wrong batch size is an error, not a guess.
    """
    xp = array_namespace(like)
    kind = dtype_name(value) if hasattr(value, "dtype") else None
    if kind is not None and not ("float" in kind or "int" in kind):
        raise TypeError(f"{name} must hold numbers, got dtype {kind}")
    if kind is not None and "float" in kind and not xp.isdtype(dtype, "real floating"):
        raise TypeError(f"{name} must hold integers, got dtype {kind}")
    try:
        arr = xp.asarray(value, dtype=dtype, device=device(like))
    except (TypeError, ValueError, OverflowError, RuntimeError) as exc:
        raise TypeError(f"{name} must be array-like of numbers, got {value!r}") from exc
    if arr.ndim != 1 or arr.shape[0] != like.shape[0]:
        raise ValueError(
            f"{name} must have shape ({like.shape[0]},) to match the batch, "
            f"got shape {tuple(arr.shape)}"
        )
    return arr


def can_read_values(x: Any) -> bool:
    """Whether an op may read the values of `x` on the host to validate them.

    False while torch.compile traces the op (a read would break its graph), for a
    tensor on an accelerator while a CUDA graph is being captured on the current stream
    (a read synchronises, which a capture forbids), and for a tensor on torch's "meta"
    device, which has shapes but no values. Ops skip their value checks (ranges, not
    shapes or dtypes) then; the same inputs are checked whenever the op runs eagerly on
    real values.
    """
    if not is_torch_array(x):
        return True
    import torch

    kind = x.device.type
    if kind == "meta" or torch.compiler.is_compiling():
        return False
    return kind == "cpu" or not torch.cuda.is_current_stream_capturing()


def first_bad_row(xp: Any, bad: Any) -> int | None:
    """Index of the first True in the boolean vector `bad`, or None."""
    if not bool(xp.any(bad)):
        return None
    return int(xp.argmax(xp.astype(bad, xp.int8)))


def bincount_rows(xp: Any, ids: Any, vocab: int, weights: Any = None) -> Any:
    """Per-row histogram: out[b, v] = sum of weights[b, j] over j with ids[b, j] == v.

    `ids` is int64 (batch, n); entries < 0 are padding and are ignored. With
    `weights=None` each occurrence counts 1 and the result is int64; otherwise the
    result has the dtype of `weights`. This is a scatter-add, which the array API
    standard does not have, so it calls the library's own `bincount`.
    """
    batch = ids.shape[0]
    valid = ids >= 0
    row = xp.reshape(xp.arange(batch, dtype=xp.int64, device=device(ids)), (batch, 1))
    flat = xp.reshape(xp.where(valid, row * vocab + ids, batch * vocab), (-1,))
    if weights is not None:
        w = xp.reshape(xp.where(valid, weights, xp.zeros_like(weights)), (-1,))
    size = batch * vocab + 1  # one spare bin collects the padding
    if is_torch_namespace(xp):
        import torch

        out = torch.bincount(flat, weights=None if weights is None else w, minlength=size)
        if weights is not None:
            out = out.to(weights.dtype)
    else:
        import numpy as np

        out = np.bincount(np.asarray(flat), weights=None if weights is None else w, minlength=size)
        out = out.astype(np.int64 if weights is None else weights.dtype, copy=False)
    return xp.reshape(out[: batch * vocab], (batch, vocab))


def erf(xp: Any, x: Any) -> Any:
    """The error function, elementwise, in x's dtype. The array API standard lacks it:
    torch has its own; numpy arrays go through `math.erf` (correctly rounded in float64)
    one element at a time, which is slow but exact."""
    if is_torch_namespace(xp):
        import torch

        return torch.erf(x)
    import math

    import numpy as np

    return np.vectorize(math.erf, otypes=[np.float64])(x).astype(x.dtype, copy=False)
