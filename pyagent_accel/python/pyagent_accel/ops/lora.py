"""Batched LoRA in Rust: drop-in replacements for `pyagent_ref.ops.lora`.

Same functions, signatures, results and exceptions (classes, messages, check order) as
the reference, whose docstrings are the contract. Inputs are numpy arrays or torch CPU
tensors of float16, bfloat16, float32 or float64 (torch is optional and never imported
here); results come back in the input's library. Each op is one native call with the
GIL released, one matrix-vector product per token with its slot's matrices (BGMV),
tokens in parallel for large batches.

Exactness: dot products are summed in another order than BLAS's: results agree with the
reference within the specification's tolerance. The in-place add of `lora_expand`
rounds once, as the reference does.

Differences from the reference:

- Only numpy arrays and torch CPU tensors: a tensor on another device raises TypeError
  (it is never copied silently), as does another array library.
- Non-contiguous inputs are copied to a contiguous array first, but for a `lora_b`
  stored rank-major (the transposed view of a C-contiguous (num_loras, rank,
  out_features) array, as `lora.layers.LoRALinear` keeps it), which is read in place;
  a non-contiguous `out` is updated through a contiguous copy written back (the
  reference reads and writes any layout).
- y, scaling (and lora_b when its compute type is not y's) are converted to the compute
  dtype before the call; slots are read in place.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .. import _native
from . import _common as _c

__all__ = ["lora_shrink", "lora_expand"]


def _float_array(x: Any, name: str, ndim: int) -> bool:
    """The reference's `_float_array`: returns whether x is a torch tensor."""
    torch_in = _c.array_library(x, name)
    kind = _c.dtype_name(x)
    if kind not in _c.FLOAT_KINDS:
        raise TypeError(f"{name} must be a float array, got dtype {kind}")
    if x.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} axes, got shape {tuple(x.shape)}")
    return torch_in


def _indices(indices: Any, tokens: int, num_loras: int) -> np.ndarray:
    """The reference's `_check_indices`; the indices as a contiguous int64 array."""
    torch_in = _c.array_library(indices, "indices")
    kind = _c.dtype_name(indices)
    if kind not in ("int32", "int64"):
        raise TypeError(f"indices must be int32 or int64, got dtype {kind}")
    if tuple(indices.shape) != (tokens,):
        raise ValueError(
            f"indices must have shape ({tokens},), one per token, got {tuple(indices.shape)}"
        )
    if torch_in:
        _c.check_cpu(indices, "indices")
        indices = _c.tensor_to_numpy(indices)
    idx = np.ascontiguousarray(indices, dtype=np.int64)
    if tokens:
        bad = (idx < -1) | (idx >= num_loras)
        if bad.any():
            t = int(np.argmax(bad))
            raise ValueError(
                f"indices[{t}] is {int(idx[t])}, outside [-1, {num_loras}) "
                f"(-1: no adapter, else a slot of the {num_loras})"
            )
    return idx


def _compute(x: Any) -> np.dtype:
    return _c.F64 if _c.dtype_name(x) == "float64" else _c.F32


def _contiguous(x: Any, name: str, torch_in: bool) -> np.ndarray:
    """The C-contiguous numpy array Rust reads for float array x (bfloat16 as int16 bits)."""
    return np.ascontiguousarray(_c.float_view(x, name, torch_in))


def _as_compute(x: Any, dtype: np.dtype, name: str, torch_in: bool) -> np.ndarray:
    """Float array x converted to a compute dtype (the reference's `xp.astype`)."""
    if torch_in:
        _c.check_cpu(x, name)
        return np.ascontiguousarray(x.detach().to(_c.torch_dtype(dtype)).numpy())
    return np.ascontiguousarray(np.asarray(x).astype(dtype))


def lora_shrink(x: Any, lora_a: Any, indices: Any) -> Any:
    """Each token's input projected down by the A matrix of its adapter.

    Contract: `pyagent_ref.ops.lora.lora_shrink`.
    """
    torch_in = _float_array(x, "x", 2)
    a_torch = _float_array(lora_a, "lora_a", 3)
    if _c.dtype_name(lora_a) != _c.dtype_name(x):
        raise TypeError(
            f"lora_a must have x's dtype {_c.dtype_name(x)}, got {_c.dtype_name(lora_a)}"
        )
    tokens, in_features = x.shape
    num_loras = lora_a.shape[0]
    if lora_a.shape[2] != in_features:
        raise ValueError(
            f"lora_a must have shape (num_loras, rank, {in_features}), got {tuple(lora_a.shape)}"
        )
    idx = _indices(indices, tokens, num_loras)
    out = _native.lora_shrink(
        _contiguous(x, "x", torch_in), _contiguous(lora_a, "lora_a", a_torch), idx
    )
    return _c.wrap(out, torch_in)


def _rank_major(view: np.ndarray) -> np.ndarray | None:
    """The C-contiguous (num_loras, rank, out) array whose transposed view `view` (of
    shape (num_loras, out, rank)) is, or None for another layout."""
    swapped = view.transpose(0, 2, 1)
    if swapped.flags.c_contiguous and swapped.flags.aligned and view.shape[2] > 1:
        return swapped
    return None


def _slices(output_slices: Sequence[int] | None, out_features: int) -> list[int]:
    if output_slices is None:
        return [out_features]
    sizes = list(output_slices)
    if not sizes or any(isinstance(s, bool) or not isinstance(s, int) for s in sizes):
        raise TypeError(f"output_slices must be a non-empty sequence of ints, got {output_slices}")
    if any(s < 1 for s in sizes) or sum(sizes) != out_features:
        raise ValueError(
            f"output_slices must be ints >= 1 summing to lora_b's {out_features} output "
            f"features, got {tuple(sizes)}"
        )
    return sizes


def lora_expand(
    y: Any,
    lora_b: Any,
    indices: Any,
    scaling: Any,
    out: Any = None,
    output_slices: Sequence[int] | None = None,
) -> Any:
    """Each token's rank-space vector projected up by its adapter's B, scaled, and added
    to the base layer's output in place (or returned).

    Contract: `pyagent_ref.ops.lora.lora_expand`.
    """
    torch_in = _float_array(y, "y", 2)
    b_torch = _float_array(lora_b, "lora_b", 3)
    s_torch = _float_array(scaling, "scaling", 1)
    num_loras, out_features, rank = lora_b.shape
    sizes = _slices(output_slices, out_features)
    tokens = y.shape[0]
    if y.shape[1] != len(sizes) * rank:
        raise ValueError(
            f"y must have shape ({tokens}, {len(sizes) * rank}): {len(sizes)} slice(s) of "
            f"lora_b's rank {rank}, got {tuple(y.shape)}"
        )
    if tuple(scaling.shape) != (num_loras,):
        raise ValueError(
            f"scaling must have shape ({num_loras},), one per slot, got {tuple(scaling.shape)}"
        )
    out_torch = False
    if out is not None:
        out_torch = _float_array(out, "out", 2)
        if tuple(out.shape) != (tokens, out_features):
            raise ValueError(
                f"out must have shape ({tokens}, {out_features}), got {tuple(out.shape)}"
            )
    idx = _indices(indices, tokens, num_loras)
    compute = _compute(y)
    scale = _as_compute(scaling, compute, "scaling", s_torch)
    if not np.isfinite(scale).all():
        raise ValueError("scaling contains NaN or inf")
    v = _as_compute(y, compute, "y", torch_in)
    rank_major = None
    if _compute(lora_b) == compute:
        b = _c.float_view(lora_b, "lora_b", b_torch)
        rank_major = _rank_major(b)
        b = np.ascontiguousarray(b) if rank_major is None else rank_major
    else:  # a lora_b whose compute type is not y's: converted (the reference's astype)
        b = _as_compute(lora_b, compute, "lora_b", b_torch)
    flag = rank_major is not None
    if out is None:
        return _c.wrap(_native.lora_expand(v, b, idx, scale, None, sizes, flag), torch_in)
    view = _c.float_view(out, "out", out_torch)
    if view.flags.c_contiguous and view.flags.aligned and view.flags.writeable:
        _native.lora_expand(v, b, idx, scale, view, sizes, flag)
    else:  # through a contiguous copy, written back
        tmp = np.ascontiguousarray(view)
        _native.lora_expand(v, b, idx, scale, tmp, sizes, flag)
        view[...] = tmp
    return out
