"""The `sdpa` attention backend: `paged_attention` through torch's
`scaled_dot_product_attention`, one request at a time.

    python -m conformance pyagent_ref.attention_backends.sdpa --array torch

For each request, the blocks of its table are gathered into a dense (seq_len, kv_heads,
head_size) key and value (SDPA takes dense tensors), and its query tokens at positions
seq_len - q_len .. seq_len - 1 attend with an additive mask: 0 where the spec makes key
position j visible (j <= p when causal, j > p - sliding_window, `custom_masks[r][i, j]`),
-inf elsewhere, plus ALiBi's slopes[h] * (j - p). GQA is SDPA's `enable_gqa`. A row
with nothing visible gets zeros (SDPA would give NaN). SDPA has no soft-capping: a call
with `soft_cap` is the reference's (`ops.attention`), which is what the conformance
suite then sees. This is the prefill backend where SDPA's fused kernels apply (a long
q_len per request); decode (`paged_decode_attention`) runs the same loop with one query
token per request. An fp8 cache (`kv_cache_dtype`) is dequantized block by block as
each request's blocks are gathered. Half-precision inputs are computed in float32 on the CPU; numpy
arrays are taken and returned (computed through torch).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from ..ops import _fp8
from ..ops import attention as reference
from ..ops.attention import _check_batch, _check_decode

__all__ = ["paged_attention", "paged_decode_attention"]


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
    """`pyagent_ref.ops.attention.paged_attention`'s contract through SDPA (see the
    module docstring)."""
    if soft_cap is not None:
        return reference.paged_attention(
            query, key_cache, value_cache, block_table, query_start_loc, seq_lens, scale,
            sliding_window, soft_cap, alibi_slopes, custom_masks, causal, kv_cache_dtype,
            k_scale, v_scale,
        )  # fmt: skip
    _, qsl, lens = _check_batch(
        query, key_cache, block_table, query_start_loc, seq_lens, custom_masks, causal
    )
    caches = {"key_cache": key_cache, "value_cache": value_cache}
    fp8 = _fp8.check(kv_cache_dtype, k_scale, v_scale, caches), k_scale, v_scale
    q, kc, vc, table = (torch.as_tensor(x) for x in (query, key_cache, value_cache, block_table))
    out = torch.zeros_like(q)
    for r, seq_len in enumerate(lens):
        if qsl[r + 1] > qsl[r]:
            mask = None if custom_masks is None else custom_masks[r]
            rows = slice(qsl[r], qsl[r + 1])
            out[rows] = _attend(
                q[rows],
                kc,
                vc,
                table[r],
                seq_len,
                scale,
                sliding_window,
                alibi_slopes,
                mask,
                causal,
                fp8,
            )
    return out.numpy() if isinstance(query, np.ndarray) else out


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
    """`pyagent_ref.ops.attention.paged_decode_attention`'s contract: request r's one
    query token at position seq_lens[r] - 1; seq_lens[r] == 0 gets zeros."""
    if soft_cap is not None:
        return reference.paged_decode_attention(
            query, key_cache, value_cache, block_table, seq_lens, scale,
            sliding_window, soft_cap, alibi_slopes, kv_cache_dtype, k_scale, v_scale,
        )  # fmt: skip
    _check_decode(query, key_cache, block_table, seq_lens)
    caches = {"key_cache": key_cache, "value_cache": value_cache}
    fp8 = _fp8.check(kv_cache_dtype, k_scale, v_scale, caches), k_scale, v_scale
    q, kc, vc, table = (torch.as_tensor(x) for x in (query, key_cache, value_cache, block_table))
    out = torch.zeros_like(q)
    for r, seq_len in enumerate(int(n) for n in seq_lens):
        if seq_len:
            out[r : r + 1] = _attend(
                q[r : r + 1], kc, vc, table[r], seq_len, scale, sliding_window, alibi_slopes,
                None, True, fp8,
            )  # fmt: skip
    return out.numpy() if isinstance(query, np.ndarray) else out


def _attend(
    q: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    blocks: torch.Tensor,
    seq_len: int,
    scale: float,
    sliding_window: int | None,
    alibi_slopes: Any,
    custom_mask: Any = None,
    causal: bool = True,
    fp8: tuple[Any, float, float] = (None, 1.0, 1.0),
) -> torch.Tensor:
    """One request's q_len query tokens (q_len, H, D), the last of its seq_len, over its
    blocks: SDPA with the spec's visibility as an additive mask. fp8: (format or None,
    k_scale, v_scale) of the caches."""
    q_len, num_heads, d = q.shape
    block_size, num_kv_heads = key_cache.shape[1], key_cache.shape[2]
    used = blocks[: -(-seq_len // block_size)].long()
    compute = q.dtype
    if q.device.type == "cpu" and q.dtype not in (torch.float32, torch.float64):
        compute = torch.float32
    fmt, k_scale, v_scale = fp8

    def dense(cache: torch.Tensor, kv_scale: float) -> torch.Tensor:  # (1, kv_heads, S, d)
        kv = cache[used].reshape(-1, num_kv_heads, d)[:seq_len].transpose(0, 1)[None]
        return kv.to(compute) if fmt is None else _fp8.decode(kv, fmt).to(compute) * kv_scale

    k, v = dense(key_cache, k_scale), dense(value_cache, v_scale)
    j = torch.arange(seq_len, device=q.device)
    p = seq_len - q_len + torch.arange(q_len, device=q.device)[:, None]
    visible = j <= p if causal else torch.ones((q_len, seq_len), dtype=torch.bool, device=q.device)
    if sliding_window is not None:
        visible = visible & (j > p - sliding_window)
    if custom_mask is not None:
        visible = visible & torch.as_tensor(custom_mask, device=q.device)
    bias = torch.zeros((q_len, seq_len), dtype=compute, device=q.device)
    bias = bias.masked_fill(~visible, float("-inf"))[None]
    if alibi_slopes is not None:
        slopes = torch.as_tensor(alibi_slopes).to(q.device, compute)
        bias = bias + slopes[:, None, None] * (j - p).to(compute)
    o = F.scaled_dot_product_attention(
        q.to(compute).transpose(0, 1)[None],
        k,
        v,
        attn_mask=bias[None],
        scale=scale,
        enable_gqa=num_heads != num_kv_heads,
    )[0].transpose(0, 1)
    seen = visible.any(dim=-1)[:, None, None]
    return torch.where(seen, o, 0.0).to(q.dtype)


# as a conformance target: this module is its own `attention` namespace
import sys  # noqa: E402

from . import CONFORMANCE_MISSING  # noqa: E402, F401

attention = sys.modules[__name__]
