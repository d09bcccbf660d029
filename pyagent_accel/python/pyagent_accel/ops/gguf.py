"""llama.cpp's block formats in Rust: drop-in replacements for `pyagent_ref.ops.gguf`.

Same functions, signatures, results and exceptions (classes, messages, check order) as
the reference, whose docstrings are the contract. Inputs are numpy arrays or torch CPU
tensors; results come back in the input's library. Each op is one native call with the
GIL released.

`quantize` and `dequantize` give the reference's bytes and weights bit for bit (the same
float32 steps in the same order; blocks in parallel). `gguf_matmul` is fused: each output
row's blocks are decoded one at a time into a buffer of at most 256 weights and dotted
with every token, the float weight matrix never built; rows in parallel for large layers.
Its sums run in another order than BLAS's: results agree with the reference within the
specification's tolerance. x of float16 or bfloat16 is converted to float32 first and the
result rounded back to x's dtype, as the reference computes.

Differences from the reference:

- Only numpy arrays and torch CPU tensors: a tensor on another device raises TypeError
  (it is never copied silently), as does another array library.
- Non-contiguous inputs are copied to a contiguous array first.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from .. import _native
from . import _common as _c

__all__ = ["quantize", "dequantize", "gguf_matmul"]

BLOCKS = {"Q8_0": (32, 34), "Q4_0": (32, 18), "Q4_K": (256, 144), "Q6_K": (256, 210)}
FORMATS = tuple(BLOCKS)


def _fmt(fmt: Any) -> str:
    if not isinstance(fmt, str):
        raise TypeError(f"fmt must be a str, got {type(fmt).__name__}")
    if fmt not in BLOCKS:
        raise ValueError(f"fmt must be one of {FORMATS}, got {fmt!r}")
    return fmt


def _raw(raw: Any, fmt: str) -> tuple[bool, int]:
    """The reference's `_raw`: (raw is a tensor, blocks per row)."""
    torch_in = _c.array_library(raw, "raw")
    if _c.dtype_name(raw) != "uint8":
        raise TypeError(f"raw must be uint8, got dtype {_c.dtype_name(raw)}")
    type_size = BLOCKS[fmt][1]
    if raw.ndim != 2 or raw.shape[1] == 0 or raw.shape[1] % type_size:
        raise ValueError(
            f"raw must have shape (rows, blocks * {type_size}) for {fmt} "
            f"({type_size} bytes a block, blocks >= 1), got {tuple(raw.shape)}"
        )
    return torch_in, raw.shape[1] // type_size


def _bytes(raw: Any, torch_in: bool) -> np.ndarray:
    if torch_in:
        _c.check_cpu(raw, "raw")
        raw = _c.tensor_to_numpy(raw)
    return np.ascontiguousarray(raw)


def _as(x: Any, kind: str, name: str, torch_in: bool) -> np.ndarray:
    """Float array x converted to `kind` (float32 / float64) as a contiguous numpy array."""
    if torch_in:
        _c.check_cpu(x, name)
    return np.ascontiguousarray(_c.float_view(_c.float_as(x, kind), name, torch_in))


def quantize(weight: Any, fmt: str) -> Any:
    """A weight in a GGUF block format: llama.cpp's reference quantizer, row by row.

    Contract: `pyagent_ref.ops.gguf.quantize`.
    """
    torch_in = _c.array_library(weight, "weight")
    fmt = _fmt(fmt)
    if _c.dtype_name(weight) not in _c.FLOAT_KINDS:
        raise TypeError(f"weight must be a float array, got dtype {_c.dtype_name(weight)}")
    block_size = BLOCKS[fmt][0]
    if weight.ndim != 2 or weight.shape[1] == 0 or weight.shape[1] % block_size:
        raise ValueError(
            f"weight must have shape (out_features, in_features) with in_features a positive "
            f"multiple of {fmt}'s block size {block_size}, got {tuple(weight.shape)}"
        )
    w = _as(weight, "float32", "weight", torch_in)
    if w.size:
        finite = np.isfinite(w).all(axis=1)
        if not finite.all():
            raise ValueError(f"weight row {int(np.argmin(finite))} contains NaN or inf")
    return _c.wrap(_native.gguf_quantize(w, fmt), torch_in)


def dequantize(raw: Any, fmt: str) -> Any:
    """The float32 weight of a GGUF tensor's blocks.

    Contract: `pyagent_ref.ops.gguf.dequantize`.
    """
    fmt = _fmt(fmt)
    torch_in, _ = _raw(raw, fmt)
    return _c.wrap(_native.gguf_dequantize(_bytes(raw, torch_in), fmt), torch_in)


def gguf_matmul(x: Any, raw: Any, fmt: str) -> Any:
    """A linear layer on a GGUF tensor: y = x @ W^T with W = dequantize(raw, fmt).

    Contract: `pyagent_ref.ops.gguf.gguf_matmul`.
    """
    torch_in = _c.array_library(x, "x")
    fmt = _fmt(fmt)
    kind = _c.dtype_name(x)
    if kind not in _c.FLOAT_KINDS:
        raise TypeError(f"x must be a float array, got dtype {kind}")
    if x.ndim != 2:
        raise ValueError(f"x must have 2 axes, got shape {tuple(x.shape)}")
    raw_torch, blocks = _raw(raw, fmt)
    if blocks * BLOCKS[fmt][0] != x.shape[1]:
        raise ValueError(
            f"raw's {blocks} {fmt} blocks a row hold {blocks * BLOCKS[fmt][0]} weights, "
            f"x has in_features {x.shape[1]}"
        )
    compute = "float64" if kind == "float64" else "float32"
    y = _native.gguf_matmul(_as(x, compute, "x", torch_in), _bytes(raw, raw_torch), fmt)
    if torch_in:
        return sys.modules["torch"].from_numpy(y).to(x.dtype)
    return y if kind == compute else _c.float_as(y, kind)
