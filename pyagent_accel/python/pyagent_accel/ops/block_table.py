"""Block tables and slot mappings in Rust: drop-in replacements for `pyagent_ref.ops.block_table`.

Same functions, signatures, results (int64 arrays, `PAD_SLOT_ID` for padding tokens) and
exceptions as the reference, whose docstrings are the contract:

    slot = block_table[r, p // block_size] * block_size + p % block_size

for token t of request r at position p; tokens t >= query_start_loc[-1] are padding.
Inputs are int32 or int64 numpy arrays or torch CPU tensors, in any layout (strided
views are read in place; tensors through zero-copy numpy views); the result is in the
library of the first array argument. One native call per op, with the GIL released
while it checks the values and fills the result.

Differences from the reference: a torch tensor on another device raises TypeError (the
reference computes on that device). Where the reference fails on inputs outside the
contract, the accelerator answers as the contract says: a batch whose block table has
no columns and only padding tokens gets PAD_SLOT_ID (the reference raises IndexError),
and query_start_loc steps are compared without overflow (the reference subtracts in
the input dtype, so an int32 step past 2**31 can pass its non-decreasing check).
"""

from __future__ import annotations

from typing import Any

import numpy as _np

from .. import _native
from . import _common as _c

__all__ = ["PAD_SLOT_ID", "compute_positions", "compute_slot_mapping", "compute_logits_indices"]

PAD_SLOT_ID = -1

_INT_DTYPES = (_np.dtype(_np.int64), _np.dtype(_np.int32))


def _int_array(x: Any, name: str, ndim: int) -> tuple[_np.ndarray, bool]:
    """`_int_array` of the reference: (numpy view of x, x was a torch tensor).

    Same checks, order and messages; the dtype test compares dtypes rather than their
    names (`str(dtype)` costs microseconds, as much as the op on a decode batch).
    """
    if isinstance(x, _np.ndarray):
        torch_in = False
        ok = x.dtype in _INT_DTYPES  # equality: '>i8' is out, np.longlong is in, like the names
    elif _c.is_torch(x):
        if not x.is_cpu:
            _c.check_cpu(x, name)
        torch_in = True
        torch = _c.torch_module()
        ok = x.dtype is torch.int64 or x.dtype is torch.int32
    elif isinstance(x, _np.generic):
        x, torch_in = _np.asarray(x), False
        ok = x.dtype in _INT_DTYPES
    else:
        raise TypeError(f"{name} must be a numpy array or a torch tensor, got {type(x).__name__}")
    if not ok:
        raise TypeError(f"{name} must be int32 or int64, got dtype {_c.dtype_name(x)}")
    if x.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dimension(s), got shape {tuple(x.shape)}")
    if torch_in:
        try:
            x = x.numpy()  # zero-copy view of the tensor's memory
        except RuntimeError:  # a negative-bit view: resolve it (a copy, as torch must)
            x = _c.tensor_to_numpy(x)
    if not x.flags.aligned:  # e.g. a field of a packed record array: Rust reads aligned ints
        x = _np.array(x, copy=True)
    return x, torch_in


def compute_positions(query_start_loc: Any, num_computed_tokens: Any, num_tokens: int) -> Any:
    """Sequence position of every token of the flattened batch (int64, shape (num_tokens,)).

    Contract: `pyagent_ref.ops.block_table.compute_positions`.
    """
    qsl, torch_in = _int_array(query_start_loc, "query_start_loc", 1)
    nct, _ = _int_array(num_computed_tokens, "num_computed_tokens", 1)
    return _c.wrap(_native.compute_positions(qsl, nct, num_tokens), torch_in)


def compute_slot_mapping(
    block_table: Any, query_start_loc: Any, positions: Any, block_size: int
) -> Any:
    """The KV cache slot of every token of the flattened batch; padding gets PAD_SLOT_ID.

    Contract: `pyagent_ref.ops.block_table.compute_slot_mapping`.
    """
    table, torch_in = _int_array(block_table, "block_table", 2)
    qsl, _ = _int_array(query_start_loc, "query_start_loc", 1)
    pos, _ = _int_array(positions, "positions", 1)
    if isinstance(block_size, bool) or not isinstance(block_size, int):
        raise TypeError(f"block_size must be an int, got {block_size!r}")
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    return _c.wrap(_native.compute_slot_mapping(table, qsl, pos, block_size), torch_in)


def compute_logits_indices(query_start_loc: Any) -> Any:
    """Index of each request's last scheduled token (int64, shape (num_reqs,)).

    Contract: `pyagent_ref.ops.block_table.compute_logits_indices`.
    """
    qsl, torch_in = _int_array(query_start_loc, "query_start_loc", 1)
    return _c.wrap(_native.compute_logits_indices(qsl), torch_in)
