"""Applying a token bitmask in Rust: a drop-in replacement for `pyagent_ref.ops.structured`.

Same function, signature, result (bit for bit: the op only copies or masks) and
exceptions (classes, messages, check order) as the reference, whose docstring is the
contract. `logits` is a numpy array or a torch CPU tensor of float16, bfloat16, float32
or float64 (torch is optional and never imported here), `bitmask` an int32 numpy array
or torch CPU tensor; the result comes back in the logits' library and dtype, a tensor
as a zero-copy view of the Rust-filled buffer. One native call, rows in parallel with
the GIL released for large batches.

Differences from the reference:

- Only numpy arrays and torch CPU tensors: a tensor on another device raises TypeError
  (it is never copied silently), as does another array library.
- torch inputs that require grad are read through `detach()`; the result carries no graph.
"""

from __future__ import annotations

from typing import Any

from .. import _native
from . import _common as _c

__all__ = ["apply_token_bitmask"]


def _bitmask_view(bitmask: Any, batch: int) -> Any:
    """The reference's `_arrays.check_token_bitmask`; returns the int32 numpy array Rust
    reads (zero-copy, in its layout)."""
    torch_in = _c.bitmask_library(bitmask)
    if bitmask.shape[0] != batch:
        raise ValueError(
            f"bitmask must have {batch} rows (one per logits row), got shape {tuple(bitmask.shape)}"
        )
    if not torch_in:
        return bitmask
    _c.check_cpu(bitmask, "bitmask")
    return _c.tensor_to_numpy(bitmask)


def apply_token_bitmask(logits: Any, bitmask: Any) -> Any:
    """The logits with every token the bitmask does not allow set to -inf.

    Contract: `pyagent_ref.ops.structured.apply_token_bitmask`.
    """
    torch_in = _c.array_library(logits, "logits")
    kind = _c.dtype_name(logits)
    if kind not in _c.FLOAT_KINDS:
        raise TypeError(f"logits must be a float array, got dtype {kind}")
    if logits.ndim != 2:
        raise ValueError(f"logits must have shape (batch, vocab), got shape {tuple(logits.shape)}")
    words = _bitmask_view(bitmask, logits.shape[0])
    x = _c.float_view(logits, "logits", torch_in)
    return _c.wrap_float(_native.apply_token_bitmask(x, words), logits, torch_in)
