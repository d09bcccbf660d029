"""The `flex` attention backend: `paged_attention` through torch's FlexAttention.

    python -m conformance pyagent_ref.attention_backends.flex --array torch

The paged cache is read in place: the whole cache, viewed as one sequence of
num_blocks * block_size slots, is the key/value sequence of one flex_attention call over
the batch's flattened query tokens, and the paging lives in the mask. For query token t
of request r at position p, slot s of physical block b = s // block_size is request r's
sequence position

    j = logical[r, b] * block_size + s % block_size,   logical[r, b] = the index of b in
                                                       block_table[r] (-1 if absent)

and is visible when logical[r, b] >= 0, j < seq_lens[r], and the reference's rules
hold for (p, j): j <= p when causal, j > p - sliding_window, `custom_masks[r][i, j]`.
ALiBi and soft-capping are a `score_mod` (added, then capped, after flex's scale, as in
the spec). The visibility becomes a `BlockMask`, whose blocks of slots no request reads
are skipped by the compiled kernel: a batch reads the blocks its tables list, never a
gathered copy. Padding query tokens see nothing and get zeros. The visibility (and
ALiBi's bias) is computed as a dense (tokens, slots) tensor that mask_mod indexes: cheap
to build eagerly, but it grows with the whole cache; a compiled GPU path would state
the rule itself as mask_mod instead.

Eagerly (CPU, and anywhere flex_attention is not compiled) torch materialises the
scores of every slot, which is correct and slow; compiled on a GPU it is a fused kernel
(the path to measure where a GPU is lent). Half-precision inputs are computed in
float32 on the CPU (the unfused path would keep their dtype), in their own dtype with
float32 accumulation on a GPU. numpy arrays are taken and returned (computed through
torch). An fp8 cache (`kv_cache_dtype`) is not read here: flex_attention computes q.k
from float keys, so such a call is the reference's (`ops.attention`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

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
    """`pyagent_ref.ops.attention.paged_attention`'s contract, computed by flex_attention
    over the paged cache in place (see the module docstring); an fp8 cache is the
    reference's."""
    if kv_cache_dtype != "auto":
        return reference.paged_attention(
            query, key_cache, value_cache, block_table, query_start_loc, seq_lens, scale,
            sliding_window, soft_cap, alibi_slopes, custom_masks, causal, kv_cache_dtype,
            k_scale, v_scale,
        )  # fmt: skip
    _check_batch(query, key_cache, block_table, query_start_loc, seq_lens, custom_masks, causal)
    _fp8.check(
        kv_cache_dtype, k_scale, v_scale, {"key_cache": key_cache, "value_cache": value_cache}
    )
    q, qsl, lens = (torch.as_tensor(x) for x in (query, query_start_loc, seq_lens))
    dev = q.device
    qsl, lens = qsl.to(dev, torch.int64), lens.to(dev, torch.int64)
    q_lens = qsl[1:] - qsl[:-1]
    # each real query token's request and position; padding tokens get request -1
    token_req = torch.full((q.shape[0],), -1, dtype=torch.int64, device=dev)
    token_req[: int(qsl[-1])] = torch.repeat_interleave(torch.arange(len(lens), device=dev), q_lens)
    r = token_req.clamp(min=0)
    token_pos = lens[r] - q_lens[r] + torch.arange(q.shape[0], device=dev) - qsl[r]
    allowed = None
    if custom_masks is not None and any(m is not None for m in custom_masks):
        allowed = torch.ones((q.shape[0], max(int(lens.max()), 1)), dtype=torch.bool, device=dev)
        for i, mask in enumerate(custom_masks):
            if mask is not None:
                allowed[int(qsl[i]) : int(qsl[i + 1]), : mask.shape[1]] = torch.as_tensor(mask)
    return _flex(
        query, key_cache, value_cache, block_table, lens, token_req, token_pos, scale,
        sliding_window, soft_cap, alibi_slopes, allowed, causal,
    )  # fmt: skip


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
    query token at position seq_lens[r] - 1; a request with seq_lens[r] == 0 gets zeros;
    an fp8 cache is the reference's."""
    if kv_cache_dtype != "auto":
        return reference.paged_decode_attention(
            query, key_cache, value_cache, block_table, seq_lens, scale,
            sliding_window, soft_cap, alibi_slopes, kv_cache_dtype, k_scale, v_scale,
        )  # fmt: skip
    _check_decode(query, key_cache, block_table, seq_lens)
    _fp8.check(
        kv_cache_dtype, k_scale, v_scale, {"key_cache": key_cache, "value_cache": value_cache}
    )
    lens = torch.as_tensor(seq_lens).to(torch.as_tensor(query).device, torch.int64)
    token_req = torch.where(lens > 0, torch.arange(len(lens), device=lens.device), -1)
    return _flex(
        query, key_cache, value_cache, block_table, lens, token_req, lens - 1, scale,
        sliding_window, soft_cap, alibi_slopes, None, True,
    )  # fmt: skip


def _flex(
    query: Any,
    key_cache: Any,
    value_cache: Any,
    block_table: Any,
    lens: torch.Tensor,
    token_req: torch.Tensor,
    token_pos: torch.Tensor,
    scale: float,
    sliding_window: int | None,
    soft_cap: float | None,
    alibi_slopes: Any,
    allowed: torch.Tensor | None,
    causal: bool,
) -> torch.Tensor:
    """One flex_attention call: the flattened query tokens (T, H, D) over every cache
    slot; token_req[t] = -1 for a padding token (zeros). Returns query's type."""
    q, key_cache, value_cache = (torch.as_tensor(x) for x in (query, key_cache, value_cache))
    table = torch.as_tensor(block_table).to(q.device)
    num_tokens, num_heads, d = q.shape
    num_blocks, block_size, num_kv_heads, _ = key_cache.shape
    dev, slots = q.device, num_blocks * block_size
    # logical[r, b]: where physical block b sits in request r's table (-1: not its)
    logical = torch.full((table.shape[0] + 1, num_blocks), -1, dtype=torch.int64, device=dev)
    for r in range(table.shape[0]):
        used = -(-int(lens[r]) // block_size)
        logical[r, table[r, :used].long()] = torch.arange(used, device=dev)
    token_req = torch.where(token_req < 0, table.shape[0], token_req)  # padding: row of -1s
    # j[t, s]: slot s's position in token t's sequence (-1: not in it), then visibility
    s = torch.arange(slots, device=dev)
    block = logical[token_req][:, s // block_size]
    j = torch.where(block >= 0, block * block_size + s % block_size, -1)
    p = token_pos[:, None]
    seq = torch.cat([lens, lens.new_zeros(1)])[token_req][:, None]
    visible = (j >= 0) & (j < seq)
    if causal:
        visible &= j <= p
    if sliding_window is not None:
        visible &= j > p - sliding_window
    if allowed is not None:
        visible &= torch.gather(allowed, 1, j.clamp(0, allowed.shape[1] - 1))
    bias = None
    if alibi_slopes is not None:
        slopes = torch.as_tensor(alibi_slopes).to(dev, torch.float64)
        bias = slopes[:, None, None] * (j - p)[None]  # (H, T, S)

    def mask_mod(b, h, q_idx, kv_idx):
        return visible[q_idx, kv_idx]

    # a captured Python float would reach flex's tracing as a SymFloat, which it refuses
    cap = None if soft_cap is None else torch.tensor(soft_cap, dtype=torch.float64, device=dev)

    def score_mod(score, b, h, q_idx, kv_idx):
        if bias is not None:
            score = score + bias[h, q_idx, kv_idx].to(score.dtype)
        if cap is not None:
            score = cap.to(score.dtype) * torch.tanh(score / cap.to(score.dtype))
        return score

    compute = q.dtype
    if dev.type == "cpu" and q.dtype not in (torch.float32, torch.float64):
        compute = torch.float32
    kv = [
        c.reshape(1, slots, num_kv_heads, d).transpose(1, 2).to(compute)
        for c in (key_cache, value_cache)
    ]
    block_mask = create_block_mask(mask_mod, 1, None, num_tokens, slots, device=dev)
    out = flex_attention(
        q.to(compute).transpose(0, 1)[None],
        *kv,
        score_mod=score_mod if bias is not None or cap is not None else None,
        block_mask=block_mask,
        scale=scale,
        enable_gqa=num_heads != num_kv_heads,
    )
    out = out[0].transpose(0, 1).to(q.dtype)
    return out.numpy() if isinstance(query, np.ndarray) else out


# as a conformance target: this module is its own `attention` namespace
import sys  # noqa: E402

from . import CONFORMANCE_MISSING  # noqa: E402, F401

attention = sys.modules[__name__]
