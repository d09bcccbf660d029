"""Paged attention in Rust: drop-in replacements for `pyagent_ref.ops.attention`.

Same functions, signatures, results and exceptions as the reference, whose docstrings
are the contract: `reshape_and_cache` writes new keys and values into the paged cache
in place (`concat_and_cache_mla` an MLA latent), `paged_attention` attends a ragged
batch (prefill chunks and decodes mixed) over it, `paged_decode_attention` one query
token per request.

Inputs are numpy arrays or torch CPU tensors. Queries, keys, values and caches are
float32, float64, float16 or bfloat16 (half types are computed in float32, stored in
their own type); torch tensors, bfloat16 included, reach Rust as zero-copy numpy views,
and results come back in the query's library without a copy. The attention kernel
reads the cache in place, never gathering a dense copy of K/V: per (request, KV head)
the query heads that share the KV head walk the request's blocks together, with an
online softmax in float32 (float64 for float64 queries), requests x KV heads (x runs of
32 query tokens of a prefill chunk) in parallel with the GIL released. Results agree
with the reference within the specification's float tolerance (the summation order
differs).

FP8 caches (kv_cache_dtype "fp8", "fp8_e4m3", "fp8_e5m2": uint8 arrays of codes) are
read in place too, each code decoded in the kernel; the keys' scale folds into the
softmax scale and the values' into the output, in the compute type (the reference
multiplies the dequantized values: equal within the float tolerance). A write divides
the keys and values by their scales in float32 here, as the reference does, and Rust
rounds them to the format (bit for bit the reference's codes).

The wrappers make the reference's checks in its order, with its exception classes and
messages; Rust checks again what its kernels rely on. Differences from the reference:
- a torch tensor on another device (CUDA, meta) raises TypeError;
- the caches must be C-contiguous for the attention ops too (ValueError naming the
  cache: they are read in place, never copied), and the two caches of one call must
  share a dtype (TypeError);
- keys, values and queries must be float arrays (TypeError; the reference casts any
  dtype);
- where the reference fails with an incidental error of its array library, a clear
  ValueError names the argument: a used block_table entry that is not a block of the
  cache, a decreasing query_start_loc, query_start_loc past the query tokens, and
  alibi_slopes not of num_heads entries.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as _np

from .. import _native
from . import _common as _c

__all__ = [
    "reshape_and_cache",
    "concat_and_cache_mla",
    "paged_attention",
    "paged_decode_attention",
]

_I64 = _np.dtype(_np.int64)
_KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2")
_FORMATS = {"fp8": "e4m3", "fp8_e4m3": "e4m3", "fp8_e5m2": "e5m2"}


# --- the reference's checks ----------------------------------------------------------


def _library(x: Any, name: str) -> bool:
    """`namespace` of the reference for the libraries accel supports (True for torch),
    then TypeError for a tensor off the CPU."""
    torch_in = _c.array_library(x, name)
    if torch_in:
        _c.check_cpu(x, name)
    return torch_in


def _check_cache(x: Any, name: str) -> None:
    if x.ndim != 4:
        raise ValueError(
            f"{name} must have shape (num_blocks, block_size, num_kv_heads, head_size), "
            f"got {tuple(x.shape)}"
        )


def _check_query(query: Any, key_cache: Any) -> bool:
    """The reference's `_check_query`; returns whether query is a torch tensor."""
    torch_in = _library(query, "query")
    _check_cache(key_cache, "key_cache")
    kind = _c.dtype_name(query)
    if "float" not in kind:
        raise TypeError(f"query must be a float array, got dtype {kind}")
    _, num_heads, head_size = query.shape
    num_kv_heads, kv_head_size = key_cache.shape[2:]
    if kv_head_size != head_size or num_heads % num_kv_heads:
        raise ValueError(
            f"query heads ({num_heads} x {head_size}) must be a multiple of the cache's "
            f"KV heads ({num_kv_heads} x {kv_head_size})"
        )
    return torch_in


def _check_masks(custom_masks: Sequence[Any | None], qsl: list[int], lens: list[int]) -> None:
    if len(custom_masks) != len(lens):
        raise ValueError(
            f"custom_masks must hold one entry per request ({len(lens)}), got {len(custom_masks)}"
        )
    for r, mask in enumerate(custom_masks):
        if mask is None:
            continue
        if _c.dtype_name(mask) != "bool":
            raise TypeError(
                f"custom_masks[{r}] must be a boolean array, got dtype {_c.dtype_name(mask)}"
            )
        want = (qsl[r + 1] - qsl[r], lens[r])
        if tuple(mask.shape) != want:
            raise ValueError(
                f"custom_masks[{r}] must have shape (q_len, seq_len) = {want}, "
                f"got {tuple(mask.shape)}"
            )


def _check_fp8(kv_cache_dtype: Any, k_scale: Any, v_scale: Any, *caches: Any) -> str | None:
    """The reference's fp8 checks; the format's name for Rust (None for "auto")."""
    if kv_cache_dtype not in _KV_CACHE_DTYPES:
        raise ValueError(
            f"kv_cache_dtype must be one of {_KV_CACHE_DTYPES}, got {kv_cache_dtype!r}"
        )
    for name, s in (("k_scale", k_scale), ("v_scale", v_scale)):
        if isinstance(s, bool) or not isinstance(s, (int, float, _np.floating, _np.integer)):
            raise TypeError(f"{name} must be a float, got {s!r}")
        if not 0 < float(s) < math.inf:
            raise ValueError(f"{name} must be a positive finite float, got {s!r}")
    fmt = _FORMATS.get(kv_cache_dtype)
    for name, cache in zip(("key_cache", "value_cache"), caches, strict=True):
        if fmt is not None and _c.dtype_name(cache) != "uint8":
            raise TypeError(
                f"{name} must be uint8 (the {kv_cache_dtype} bit patterns) with "
                f"kv_cache_dtype={kv_cache_dtype!r}, got dtype {_c.dtype_name(cache)}"
            )
    return fmt


# --- conversions for Rust ----------------------------------------------------------


def _check_integers(**arrays: Any) -> None:
    for name, x in arrays.items():
        if "int" not in _c.dtype_name(x):
            raise TypeError(f"{name} must be integers, got dtype {_c.dtype_name(x)}")


def _ints(x: Any, name: str) -> list[int]:
    """`[int(v) for v in x]` as the reference reads query_start_loc and seq_lens."""
    if _c.is_torch(x):
        _c.check_cpu(x, name)
    if getattr(x, "ndim", None) == 1 and "int" in _c.dtype_name(x):
        return x.tolist()  # the same ints, without a Python loop
    return [int(v) for v in x]


def _index(x: Any, name: str) -> _np.ndarray:
    """A small index array as C-contiguous int64 numpy (converted, like the reference's
    `astype(int64)`)."""
    if _c.is_torch(x):
        _c.check_cpu(x, name)
        x = _c.tensor_to_numpy(x)
    return _np.ascontiguousarray(x, dtype=_I64)


def _float_view(x: Any, name: str) -> _np.ndarray:
    """`_c.float_view` of a float array of any layout; TypeError for another library, a
    tensor off the CPU or a dtype that is not a float (the reference would cast it)."""
    torch_in = _library(x, name)
    kind = _c.dtype_name(x)
    if kind not in _c.FLOAT_KINDS:
        raise TypeError(f"{name} must be float32, float64, float16 or bfloat16, got dtype {kind}")
    return _c.float_view(x, name, torch_in)


def _cache(
    x: Any,
    name: str,
    why: str = "to be read in place (pyagent_accel never copies it)",
    fp8: str | None = None,
) -> _np.ndarray:
    """A cache as a numpy view of the caller's memory (uint8 codes with an fp8 format);
    ValueError if not C-contiguous (`why`: the reference's words for the write)."""
    if fp8 is not None:
        _library(x, name)
        arr = _c.tensor_to_numpy(x) if _c.is_torch(x) else x
    else:
        arr = _float_view(x, name)
    if not (arr.flags.c_contiguous and arr.flags.aligned):
        raise ValueError(f"{name} must be C-contiguous {why}")
    return arr


def _floats(x: Any, name: str) -> _np.ndarray:
    """Keys, values or queries: any layout (Rust reads strided views)."""
    arr = _float_view(x, name)
    return arr if arr.flags.aligned else _np.array(arr, copy=True)


def _window(sliding_window: Any) -> int | None:
    """The window as Rust takes it: an int64 count of positions, None for no limit.

    The reference compares integer positions with `j > p - sliding_window`, so a
    fractional window acts as its ceiling, +inf as no window, and NaN or -inf hides
    every key.
    """
    if sliding_window is None:
        return None
    if not isinstance(sliding_window, (int, float, _np.integer, _np.floating)):
        raise TypeError(f"sliding_window must be an int or None, got {sliding_window!r}")
    w = float(sliding_window) if isinstance(sliding_window, (float, _np.floating)) else None
    if w is not None:
        if math.isnan(w) or w == -math.inf:
            return 0
        if w == math.inf:
            return None
        sliding_window = math.ceil(w)
    return None if sliding_window > 2**62 else max(int(sliding_window), -(2**62))


def _slopes(alibi_slopes: Any, num_heads: int) -> _np.ndarray | None:
    if alibi_slopes is None:
        return None
    if _c.is_torch(alibi_slopes):
        _c.check_cpu(alibi_slopes, "alibi_slopes")
        alibi_slopes = alibi_slopes.detach().to(_c.torch_module().float64).numpy()
    slopes = _np.ascontiguousarray(alibi_slopes, dtype=_np.float64).reshape(-1)
    if slopes.shape[0] != num_heads:
        raise ValueError(
            f"alibi_slopes must have shape ({num_heads},), got {tuple(_np.shape(alibi_slopes))}"
        )
    return slopes


def _mask(mask: Any, r: int) -> _np.ndarray | None:
    if mask is None:
        return None
    if _c.is_torch(mask):
        _c.check_cpu(mask, f"custom_masks[{r}]")
        mask = mask.detach().numpy()
    return _np.ascontiguousarray(mask, dtype=bool)


# --- the ops ----------------------------------------------------------------------


def _scaled(x: Any, scale: float, name: str) -> _np.ndarray:
    """float32(x) / float32(scale): what an fp8 write rounds (the reference's division)."""
    if _c.is_torch(x):
        _c.check_cpu(x, name)
        x = x.detach().to(_c.torch_module().float32).numpy()
    if "float" not in _c.dtype_name(x):
        raise TypeError(f"{name} must be float32, float64, float16 or bfloat16")
    return _np.asarray(x, dtype=_np.float32) / _np.float32(scale)


def reshape_and_cache(
    key: Any,
    value: Any,
    key_cache: Any,
    value_cache: Any,
    slot_mapping: Any,
    kv_cache_dtype: str = "auto",
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> None:
    """Write each token's key and value into its cache slot, in place (padding slots,
    < 0, are skipped; an fp8 cache gets their codes).

    Contract: `pyagent_ref.ops.attention.reshape_and_cache`.
    """
    _library(key_cache, "key_cache")
    _check_cache(key_cache, "key_cache")
    fmt = _check_fp8(kv_cache_dtype, k_scale, v_scale, key_cache, value_cache)
    if value_cache.shape != key_cache.shape:  # tuples (torch.Size is one)
        raise ValueError(
            f"value_cache must have shape {tuple(key_cache.shape)}, got {tuple(value_cache.shape)}"
        )
    num_blocks, block_size, heads, head_size = key_cache.shape
    num_tokens = slot_mapping.shape[0]
    for name, x in (("key", key), ("value", value)):
        if x.shape[1:] != (heads, head_size) or x.shape[0] != num_tokens:
            raise ValueError(
                f"{name} must have shape ({num_tokens}, {heads}, {head_size}), got {tuple(x.shape)}"
            )
    if "int" not in _c.dtype_name(slot_mapping):
        raise TypeError(f"slot_mapping must be integers, got dtype {_c.dtype_name(slot_mapping)}")
    slots = _index(slot_mapping, "slot_mapping").reshape(-1)
    if slots.size and int(slots.max()) >= num_blocks * block_size:
        raise ValueError(
            f"slot_mapping holds {int(slots.max())}, past the {num_blocks * block_size} slots"
        )
    written = "to be written in place"
    kc = _cache(key_cache, "key_cache", written, fmt)
    vc = _cache(value_cache, "value_cache", written, fmt)
    if fmt is None:
        _native.reshape_and_cache(_floats(key, "key"), _floats(value, "value"), kc, vc, slots)
        return
    k, v = _scaled(key, k_scale, "key"), _scaled(value, v_scale, "value")
    _native.reshape_and_cache(k, v, kc, vc, slots, fmt)


def concat_and_cache_mla(kv_c: Any, k_pe: Any, kv_cache: Any, slot_mapping: Any) -> None:
    """Write each token's MLA latent [kv_c, k_pe] into its cache slot, in place (padding
    slots, < 0, are skipped).

    Contract: `pyagent_ref.ops.attention.concat_and_cache_mla`.
    """
    _library(kv_cache, "kv_cache")
    if kv_cache.ndim != 3:
        raise ValueError(
            f"kv_cache must have shape (num_blocks, block_size, kv_lora_rank + rope_dim), "
            f"got {tuple(kv_cache.shape)}"
        )
    num_blocks, block_size, width = kv_cache.shape
    num_tokens = slot_mapping.shape[0]
    for name, x in (("kv_c", kv_c), ("k_pe", k_pe)):
        if x.ndim != 2 or x.shape[0] != num_tokens:
            raise ValueError(
                f"{name} must have shape ({num_tokens}, features), got {tuple(x.shape)}"
            )
    if kv_c.shape[1] + k_pe.shape[1] != width:
        raise ValueError(
            f"kv_c ({kv_c.shape[1]}) and k_pe ({k_pe.shape[1]}) features must add up to "
            f"the cache's {width}"
        )
    if "int" not in _c.dtype_name(slot_mapping):
        raise TypeError(f"slot_mapping must be integers, got dtype {_c.dtype_name(slot_mapping)}")
    slots = _index(slot_mapping, "slot_mapping").reshape(-1)
    if slots.size and int(slots.max()) >= num_blocks * block_size:
        raise ValueError(
            f"slot_mapping holds {int(slots.max())}, past the {num_blocks * block_size} slots"
        )
    cache = _cache(kv_cache, "kv_cache", "to be written in place")
    _native.concat_and_cache_mla(_floats(kv_c, "kv_c"), _floats(k_pe, "k_pe"), cache, slots)


def paged_attention(
    query: Any,
    key_cache: Any,
    value_cache: Any,
    block_table: Any,
    query_start_loc: Any,
    seq_lens: Any,
    scale: float,
    sliding_window: int | None = None,
    soft_cap: float | None = None,
    alibi_slopes: Any = None,
    custom_masks: Sequence[Any | None] | None = None,
    causal: bool = True,
    kv_cache_dtype: str = "auto",
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> Any:
    """Multi-head attention of a flattened batch over the paged KV cache, causal or not.

    Contract: `pyagent_ref.ops.attention.paged_attention`.
    """
    torch_in = _check_query(query, key_cache)
    _check_integers(block_table=block_table, query_start_loc=query_start_loc, seq_lens=seq_lens)
    block_size = key_cache.shape[1]
    qsl = _ints(query_start_loc, "query_start_loc")
    lens = _ints(seq_lens, "seq_lens")
    if len(lens) != len(qsl) - 1 or block_table.shape[0] != len(lens):
        raise ValueError(
            f"query_start_loc ({len(qsl)}), seq_lens ({len(lens)}) and block_table rows "
            f"({block_table.shape[0]}) must describe the same requests"
        )
    if custom_masks is not None:
        _check_masks(custom_masks, qsl, lens)
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {causal!r}")
    fmt = _check_fp8(kv_cache_dtype, k_scale, v_scale, key_cache, value_cache)
    attended = decreasing = False
    for r, seq_len in enumerate(lens):
        q_len = qsl[r + 1] - qsl[r]
        if q_len == 0:
            continue
        if seq_len < q_len or -(-seq_len // block_size) > block_table.shape[1]:
            raise ValueError(
                f"request {r}: seq_len {seq_len} must cover its {q_len} query tokens and fit "
                f"{block_table.shape[1]} blocks of {block_size}"
            )
        attended, decreasing = True, decreasing or q_len < 0
    if decreasing:
        step = next(r for r in range(len(lens)) if qsl[r + 1] < qsl[r])
        raise ValueError(
            f"query_start_loc must be non-decreasing, got {qsl[step]} then {qsl[step + 1]}"
        )
    if attended and (min(qsl) < 0 or max(qsl) > query.shape[0]):
        raise ValueError(
            f"query_start_loc must lie in [0, {query.shape[0]}] (the query tokens), "
            f"got {min(qsl) if min(qsl) < 0 else max(qsl)}"
        )
    slopes = _slopes(alibi_slopes, query.shape[1]) if attended else None
    masks = None if custom_masks is None else [_mask(m, r) for r, m in enumerate(custom_masks)]
    out = _native.paged_attention(
        _floats(query, "query"),
        _cache(key_cache, "key_cache", fp8=fmt),
        _cache(value_cache, "value_cache", fp8=fmt),
        _index(block_table, "block_table"),
        _np.array(qsl, dtype=_I64),
        _np.array(lens, dtype=_I64),
        float(scale),
        _window(sliding_window),
        None if soft_cap is None else float(soft_cap),
        slopes,
        masks,
        causal,
        fmt,
        float(k_scale),
        float(v_scale),
    )
    return _c.wrap_float(out, query, torch_in)


def paged_decode_attention(
    query: Any,
    key_cache: Any,
    value_cache: Any,
    block_table: Any,
    seq_lens: Any,
    scale: float,
    sliding_window: int | None = None,
    soft_cap: float | None = None,
    alibi_slopes: Any = None,
    kv_cache_dtype: str = "auto",
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> Any:
    """`paged_attention` for one query token per request (seq_lens[r] == 0: zeros).

    Contract: `pyagent_ref.ops.attention.paged_decode_attention`.
    """
    torch_in = _check_query(query, key_cache)
    _check_integers(block_table=block_table, seq_lens=seq_lens)
    num_reqs, block_size = query.shape[0], key_cache.shape[1]
    one_row_each = block_table.ndim == 2 and block_table.shape[0] == num_reqs
    if seq_lens.shape != (num_reqs,) or not one_row_each:
        raise ValueError(
            f"seq_lens {tuple(seq_lens.shape)} and block_table {tuple(block_table.shape)} "
            f"must have one row per query token ({num_reqs})"
        )
    capacity = block_table.shape[1] * block_size
    lens = _index(seq_lens, "seq_lens")
    if num_reqs and (lens.min() < 0 or lens.max() > capacity):
        r = int(_np.flatnonzero((lens < 0) | (lens > capacity))[0])
        raise ValueError(
            f"seq_lens[{r}] = {int(lens[r])} must be in [0, {capacity}] "
            f"({block_table.shape[1]} blocks of {block_size})"
        )
    fmt = _check_fp8(kv_cache_dtype, k_scale, v_scale, key_cache, value_cache)
    out = _native.paged_decode_attention(
        _floats(query, "query"),
        _cache(key_cache, "key_cache", fp8=fmt),
        _cache(value_cache, "value_cache", fp8=fmt),
        _index(block_table, "block_table"),
        lens,
        float(scale),
        _window(sliding_window),
        None if soft_cap is None else float(soft_cap),
        _slopes(alibi_slopes, query.shape[1]),
        fmt,
        float(k_scale),
        float(v_scale),
    )
    return _c.wrap_float(out, query, torch_in)
