"""Rotary position embeddings in Rust: drop-in replacements for `pyagent_ref.ops.rope`.

Same names (`ROPE_TYPES` included), signatures, exceptions (classes, messages, check
order) and results as the reference, whose docstrings are the contract. `apply_rope`
takes numpy arrays or torch CPU tensors; query and key may be float16, bfloat16,
float32 or float64 (each its own), and come back as new arrays of their dtypes in the
input's library (tensors as zero-copy views of the Rust-filled buffers). One native
call rotates both, tokens in parallel with the GIL released.

Exactness: `apply_rope` makes the reference's operations in its order and dtypes (the
angle and cos/sin in float32, every product and sum of the rotation in the input dtype),
with cos/sin evaluated in float64 and rounded: the correctly rounded float32 value
nearly always, where numpy's and torch's float32 cos/sin are off by an ulp now and then
(they differ from each other too). `rope_inv_freq` resolves `rope_scaling` exactly as
the reference does (same errors, the same float `scale`) and evaluates the frequencies
in float64, rounded to float32: within a few float32 ulps of the reference's float32
arithmetic, as the specification allows.

Differences from the reference:

- Only numpy arrays and torch CPU tensors: a tensor on another device (including
  `like`) raises TypeError (never copied silently), as does another array library.
- query and key are read in place with any strides on their token and head axes
  (e.g. `qkv[:, :q_size].reshape(n, heads, head_size)`), but their last axis must be
  contiguous, else ValueError naming the argument (the reference copies).
- The angle is float32 as the contract says, also for an `inv_freq` of another float
  dtype (converted to float32; the reference follows its dtype); positions must be 1-D
  (ValueError; the reference fails with its library's broadcasting error).
- `apply_mrope` is the same kernel with each section's own position (one native call;
  the positions are copied token-major, int64).
"""

from __future__ import annotations

from typing import Any

import numpy as _np

from .. import _native
from . import _common as _c

__all__ = ["ROPE_TYPES", "rope_inv_freq", "apply_rope", "apply_mrope"]

ROPE_TYPES = ("default", "linear", "dynamic", "llama3", "yarn")

_POSITION_DTYPES = (_np.dtype(_np.int64), _np.dtype(_np.int32))


def _require(scaling: dict, key: str, rope_type: str) -> Any:
    if key not in scaling:
        raise ValueError(f"rope_scaling of type {rope_type!r} needs {key!r}, got {scaling}")
    return scaling[key]


def rope_inv_freq(
    rotary_dim: int,
    theta: float,
    rope_scaling: dict | None = None,
    max_position_embeddings: int = 2048,
    seq_len: int | None = None,
    like: Any = None,
) -> tuple[Any, float]:
    """Inverse frequencies (float32, shape (rotary_dim // 2,)) and the cos/sin scale.

    Contract: `pyagent_ref.ops.rope.rope_inv_freq`.
    """
    if rotary_dim < 2 or rotary_dim % 2:
        raise ValueError(f"rotary_dim must be even and >= 2, got {rotary_dim}")
    scaling = dict(rope_scaling or {})
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type not in ROPE_TYPES:
        raise ValueError(f"rope_type must be one of {ROPE_TYPES}, got {rope_type!r}")
    torch_out = like is not None and _c.array_library(like, "like")
    if torch_out and not like.is_cpu:
        _c.check_cpu(like, "like")
    d = rotary_dim
    kind, params, attention_factor = rope_type, (), None
    if rope_type == "dynamic":
        factor = float(_require(scaling, "factor", rope_type))
        length = max(seq_len or max_position_embeddings, max_position_embeddings)
        theta = theta * ((factor * length / max_position_embeddings) - (factor - 1)) ** (
            d / (d - 2)
        )
        kind = "default"
    elif rope_type == "linear":
        params = (float(_require(scaling, "factor", rope_type)),)
    elif rope_type == "llama3":
        keys = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
        params = tuple(float(_require(scaling, key, rope_type)) for key in keys)
    elif rope_type == "yarn":
        params, attention_factor = _yarn(scaling, max_position_embeddings)
    inv_freq, scale = _native.rope_inv_freq(d, float(theta), kind, params, attention_factor)
    return (_c.torch_module().from_numpy(inv_freq) if torch_out else inv_freq), scale


def _yarn(scaling: dict, max_pos: int) -> tuple[tuple, float | None]:
    """yarn's parameters for Rust (`Yarn::new`, which computes its ramp and scale), with
    the reference's defaults: a missing or zero entry takes the default."""
    original = scaling.get("original_max_position_embeddings") or max_pos
    factor = scaling.get("factor") or max_pos / original
    attention = scaling.get("attention_factor")
    params = (
        float(factor),
        float(original),
        float(scaling.get("beta_fast") or 32),
        float(scaling.get("beta_slow") or 1),
        1.0 if scaling.get("truncate", True) else 0.0,
        float(scaling.get("mscale") or 0.0),
        float(scaling.get("mscale_all_dim") or 0.0),
    )
    return params, None if attention is None else float(attention)


def apply_rope(
    positions: Any,
    query: Any,
    key: Any,
    inv_freq: Any,
    scale: float = 1.0,
    is_neox: bool = True,
) -> tuple[Any, Any]:
    """Rotate the first 2 * len(inv_freq) features of every query and key head.

    Contract: `pyagent_ref.ops.rope.apply_rope`.
    """
    torch_in = _c.array_library(query, "query")
    if "int" not in _c.dtype_name(positions):
        raise TypeError(f"positions must be integers, got dtype {_c.dtype_name(positions)}")
    _check_query_key(query, key, positions.shape[0], inv_freq.shape[0])
    q, k = _native.apply_rope(
        _positions(positions),
        _c.float_view(query, "query", torch_in),
        _c.float_view(key, "key", _c.is_torch(key)),
        _inv_freq(inv_freq),
        float(scale),
        bool(is_neox),
    )
    return _c.wrap_float(q, query, torch_in), _c.wrap_float(k, key, torch_in)


def apply_mrope(
    positions: Any,
    query: Any,
    key: Any,
    inv_freq: Any,
    mrope_section: Any,
    scale: float = 1.0,
    is_neox: bool = True,
) -> tuple[Any, Any]:
    """Multimodal RoPE: `apply_rope` where each pair takes the position of its section.

    Contract: `pyagent_ref.ops.rope.apply_mrope`.
    """
    torch_in = _c.array_library(query, "query")
    sections = [int(n) for n in mrope_section]
    half = inv_freq.shape[0]
    if not sections or min(sections) < 0 or sum(sections) != half:
        raise ValueError(
            f"mrope_section must be ints >= 0 summing to len(inv_freq) = {half}, got {sections}"
        )
    if "int" not in _c.dtype_name(positions):
        raise TypeError(f"positions must be integers, got dtype {_c.dtype_name(positions)}")
    if positions.ndim != 2 or positions.shape[0] != len(sections):
        raise ValueError(
            f"positions must have shape ({len(sections)}, num_tokens) for mrope_section "
            f"{sections}, got {tuple(positions.shape)}"
        )
    _check_query_key(query, key, positions.shape[1], half)
    if _c.is_torch(positions):
        _c.check_cpu(positions, "positions")
        positions = positions.numpy()
    q, k = _native.apply_mrope(
        _np.ascontiguousarray(positions, dtype=_np.int64),
        _c.float_view(query, "query", torch_in),
        _c.float_view(key, "key", _c.is_torch(key)),
        _inv_freq(inv_freq),
        sections,
        float(scale),
        bool(is_neox),
    )
    return _c.wrap_float(q, query, torch_in), _c.wrap_float(k, key, torch_in)


def _check_query_key(query: Any, key: Any, tokens: int, half: int) -> None:
    """The reference's checks of query and key: float arrays of shape (tokens, heads,
    head_size), one head_size, 2 * half <= head_size."""
    for name, x in (("query", query), ("key", key)):
        if "float" not in _c.dtype_name(x):
            raise TypeError(f"{name} must be a float array, got dtype {_c.dtype_name(x)}")
        if x.ndim != 3 or x.shape[0] != tokens:
            raise ValueError(
                f"{name} must have shape ({tokens}, heads, head_size), got {tuple(x.shape)}"
            )
    if 2 * half > query.shape[-1] or key.shape[-1] != query.shape[-1]:
        raise ValueError(
            f"rotary dim {2 * half} must fit head_size {query.shape[-1]} "
            f"of query and key {key.shape[-1]}"
        )


def _positions(positions: Any) -> _np.ndarray:
    """Integer positions as a 1-D int32 or int64 numpy array (zero-copy when they are)."""
    if _c.is_torch(positions):
        _c.check_cpu(positions, "positions")
        positions = positions.numpy()
    elif not isinstance(positions, _np.ndarray):
        positions = _np.asarray(positions)
    if positions.ndim != 1:
        raise ValueError(f"positions must have shape (num_tokens,), got {positions.shape}")
    if positions.dtype not in _POSITION_DTYPES:
        positions = positions.astype(_np.int64)
    return positions


def _inv_freq(inv_freq: Any) -> _np.ndarray:
    """inv_freq as a 1-D float32 numpy array (zero-copy when it is one)."""
    if _c.is_torch(inv_freq):
        _c.check_cpu(inv_freq, "inv_freq")
        if inv_freq.dtype is not _c.torch_module().float32:
            inv_freq = inv_freq.float()
        inv_freq = _c.tensor_to_numpy(inv_freq)
    elif not isinstance(inv_freq, _np.ndarray):
        inv_freq = _np.asarray(inv_freq)
    if inv_freq.ndim != 1:
        raise ValueError(f"inv_freq must have shape (d / 2,), got {inv_freq.shape}")
    return inv_freq.astype(_np.float32, copy=False)
