"""Paged attention: writing new keys/values into the block cache and attending over it.

The KV cache of one layer is a pair of arrays of shape
(num_blocks, block_size, num_kv_heads, head_size); slot s is row s % block_size of
block s // block_size. A step's batch is flattened: request r owns query tokens
[query_start_loc[r], query_start_loc[r + 1]) — a prefill chunk or a single decode
token, mixed freely — and its sequence of seq_lens[r] tokens lives in the blocks listed
in block_table[r]. Its query tokens are the last ones of that sequence, so query token i
of request r sits at position seq_lens[r] - q_len_r + i.

`reshape_and_cache` runs before `paged_attention` in every layer, so a request attends
to the KV of its own new tokens, and to those of a request earlier in the same batch
that it shares blocks with.

Multi-head latent attention (MLA, DeepSeek-V2/V3) keeps one latent vector per token
instead of per-head keys and values: a cache of shape (num_blocks, block_size,
kv_lora_rank + rope_dim) that `concat_and_cache_mla` writes. With the key projection
folded into the queries, attention over it is multi-query attention with one KV head
whose values are the first kv_lora_rank features of its keys: `paged_attention` (or
`paged_decode_attention`) with `kv_cache[:, :, None, :]` as both caches, of which the
first kv_lora_rank output features are kept (see `pyagent_ref.model.deepseek`).

An FP8 KV cache (kv_cache_dtype "fp8" = "fp8_e4m3", or "fp8_e5m2") holds each value
as one byte: uint8 arrays of the format's bit patterns (`ops._fp8`), written as
x / k_scale (x / v_scale for values) by a saturating cast and read back as code value
times the scale, in the compute dtype (float32; float64 for float64 queries). The
scales are per layer (vLLM's k_scale and v_scale). The same memory holds 2x the blocks
of a float16 cache, 4x those of a float32 one.

`paged_decode_attention` is the special case of one query token per request written
with static shapes and no host reads of device values, so that a CUDA graph can capture
it (and `reshape_and_cache`) for a decode step; `paged_attention` groups requests on the
host and cannot be captured.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from array_api_compat import device

from . import _fp8
from ._arrays import can_read_values, dtype_name, namespace

__all__ = [
    "reshape_and_cache",
    "concat_and_cache_mla",
    "paged_attention",
    "paged_decode_attention",
]


def _check_cache(x: Any, name: str) -> None:
    if x.ndim != 4:
        raise ValueError(
            f"{name} must have shape (num_blocks, block_size, num_kv_heads, head_size), "
            f"got {tuple(x.shape)}"
        )


def _check_query(query: Any, key_cache: Any) -> Any:
    """The namespace of query, after checking its dtype and its heads against the cache."""
    xp = namespace(query, "query")
    _check_cache(key_cache, "key_cache")
    if "float" not in dtype_name(query):
        raise TypeError(f"query must be a float array, got dtype {dtype_name(query)}")
    _, num_heads, head_size = query.shape
    num_kv_heads, kv_head_size = key_cache.shape[2:]
    if kv_head_size != head_size or num_heads % num_kv_heads:
        raise ValueError(
            f"query heads ({num_heads} x {head_size}) must be a multiple of the cache's "
            f"KV heads ({num_kv_heads} x {kv_head_size})"
        )
    return xp


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
    """Write each token's key and value into its cache slot, in place.

    For token t with slot s = slot_mapping[t] >= 0: key_cache[s // B, s % B] = key[t]
    and value_cache[s // B, s % B] = value[t] (B = block_size), cast to the cache dtype.
    Tokens with s < 0 (padding) are skipped. With an fp8 kv_cache_dtype the caches are
    uint8 and the slot gets the code of float32(key[t]) / float32(k_scale) (value[t] /
    v_scale), rounded to the nearest value of the format (ties to the even code) and
    saturating: a value beyond the format's largest finite (448 for e4m3, 57344 for
    e5m2; infinities included) becomes that largest finite with its sign; NaN stays NaN
    (code 0x7F with the input's sign bit). This equals torch's
    clamp(x / scale, -max, max).to(torch.float8_e4m3fn or float8_e5m2) bit for bit.
    One of the two ops that mutate their arguments (with `concat_and_cache_mla`): the
    cache is the state the engine keeps on the device. While a CUDA graph is captured
    or torch.compile traces, it reads no value on the host (so the graph can
    hold it); the slot range is checked whenever it runs eagerly.

    Args:
        key: float array, shape (num_tokens, num_kv_heads, head_size).
        value: float array, shape (num_tokens, num_kv_heads, head_size).
        key_cache: float array (uint8 with an fp8 kv_cache_dtype), shape
            (num_blocks, B, num_kv_heads, head_size), C-contiguous (it is written
            through a reshaped view).
        value_cache: like key_cache.
        slot_mapping: integer array, shape (num_tokens,), each < num_blocks * B.
        kv_cache_dtype: "auto" (the caches' own float dtype), "fp8" or "fp8_e4m3"
            (e4m3), "fp8_e5m2": the caches hold uint8 bit patterns of that format.
        k_scale: positive finite float, the keys' scale (used with an fp8 cache only).
        v_scale: the same for the values.
    Raises:
        TypeError: non-integer slot_mapping; a scale that is not a float; an fp8
            kv_cache_dtype with caches that are not uint8.
        ValueError: shapes disagree, a non-contiguous cache, a slot out of range, an
            unknown kv_cache_dtype, a scale that is not positive and finite.
    """
    xp = namespace(key_cache, "key_cache")
    _check_cache(key_cache, "key_cache")
    caches = {"key_cache": key_cache, "value_cache": value_cache}
    fmt = _fp8.check(kv_cache_dtype, k_scale, v_scale, caches)
    if tuple(value_cache.shape) != tuple(key_cache.shape):
        raise ValueError(
            f"value_cache must have shape {tuple(key_cache.shape)}, got {tuple(value_cache.shape)}"
        )
    num_blocks, block_size, heads, head_size = key_cache.shape
    num_tokens = slot_mapping.shape[0]
    for name, x in (("key", key), ("value", value)):
        if tuple(x.shape[1:]) != (heads, head_size) or x.shape[0] != num_tokens:
            raise ValueError(
                f"{name} must have shape ({num_tokens}, {heads}, {head_size}), got {tuple(x.shape)}"
            )
    if fmt is not None:  # the sources become codes; the writes copy them
        dev = device(key_cache)
        key = _fp8.encode(xp, key, k_scale, fmt, dev)
        value = _fp8.encode(xp, value, v_scale, fmt, dev)
    writes = [(key_cache, "key_cache", key), (value_cache, "value_cache", value)]
    _write_slots(xp, slot_mapping, num_blocks * block_size, writes)


def concat_and_cache_mla(kv_c: Any, k_pe: Any, kv_cache: Any, slot_mapping: Any) -> None:
    """Write each token's MLA latent into its cache slot, in place: the compressed KV
    and the rotated shared key part, side by side.

    Multi-head latent attention (DeepSeek-V2/V3) caches one vector per token instead of
    per-head keys and values: kv_c, the normalised compression of the token's hidden
    state (kv_lora_rank features), and k_pe, the part of the key that RoPE rotates
    (qk_rope_head_dim features, shared by all heads). For token t with slot
    s = slot_mapping[t] >= 0: kv_cache[s // B, s % B, :r] = kv_c[t] and
    kv_cache[s // B, s % B, r:] = k_pe[t] (r = kv_lora_rank, B = block_size), cast to
    the cache dtype. Tokens with s < 0 (padding) are skipped. Like `reshape_and_cache`
    it mutates the cache, reads no value on the host while a CUDA graph is captured or
    torch.compile traces, and checks the slot range whenever it runs eagerly. The
    attention ops read this cache as one KV head: `kv_cache[:, :, None, :]`.

    Args:
        kv_c: float array, shape (num_tokens, kv_lora_rank).
        k_pe: float array, shape (num_tokens, rope_dim).
        kv_cache: float array, shape (num_blocks, B, kv_lora_rank + rope_dim),
            C-contiguous (it is written through a reshaped view).
        slot_mapping: integer array, shape (num_tokens,), each < num_blocks * B.
    Raises:
        TypeError: non-integer slot_mapping.
        ValueError: shapes disagree (the latent's width is not the cache's, or the
            token counts differ), a non-contiguous cache, a slot out of range.
    """
    xp = namespace(kv_cache, "kv_cache")
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
    latent = xp.concat([xp.astype(kv_c, kv_cache.dtype), xp.astype(k_pe, kv_cache.dtype)], axis=-1)
    _write_slots(xp, slot_mapping, num_blocks * block_size, [(kv_cache, "kv_cache", latent)])


def _write_slots(
    xp: Any, slot_mapping: Any, num_slots: int, writes: list[tuple[Any, str, Any]]
) -> None:
    """For each (cache, its name, source) of `writes`: the row of `cache` at slot
    slot_mapping[t] becomes source[t], cast to the cache dtype, for every token t with a
    slot >= 0. Checks the slot dtype, then the range (eagerly), then the caches'
    contiguity."""
    if "int" not in dtype_name(slot_mapping):
        raise TypeError(f"slot_mapping must be integers, got dtype {dtype_name(slot_mapping)}")
    eager = can_read_values(slot_mapping)
    if eager and bool(xp.any(slot_mapping >= num_slots)):
        raise ValueError(
            f"slot_mapping holds {int(xp.max(slot_mapping))}, past the {num_slots} slots"
        )
    writes = [(_flat_view(cache, name), x) for cache, name, x in writes]
    real = slot_mapping >= 0
    if eager:  # boolean indexing drops the padding tokens (it reads the mask on the host)
        slots = slot_mapping[real]
        for flat, x in writes:
            flat[slots] = xp.astype(x[real], flat.dtype)
        return
    num_tokens = slot_mapping.shape[0]
    if num_tokens == 0:
        return
    # Under a graph capture or torch.compile, shapes must not depend on values. Instead
    # every padding token rewrites the slot of the first real token with that token's
    # own row: duplicate writes of one value, in any order. With no real token at all,
    # each slot written gets its own old content back.
    dev = device(slot_mapping)
    first = xp.reshape(xp.argmax(xp.astype(real, xp.int8)), (1,))
    source = xp.where(real, xp.arange(num_tokens, device=dev), first)
    slots = xp.where(real, slot_mapping, xp.clip(xp.take(slot_mapping, first), 0, None))
    any_real = xp.any(real)
    for flat, x in writes:
        new = xp.astype(xp.take(x, source, axis=0), flat.dtype)
        flat[slots] = xp.where(any_real, new, xp.take(flat, slots, axis=0))


def _check_integers(**arrays: Any) -> None:
    for name, x in arrays.items():
        if "int" not in dtype_name(x):
            raise TypeError(f"{name} must be integers, got dtype {dtype_name(x)}")


def _check_masks(custom_masks: Sequence[Any | None], qsl: list[int], lens: list[int]) -> None:
    """Each request's mask is None or a boolean array (q_len_r, seq_lens[r])."""
    if len(custom_masks) != len(lens):
        raise ValueError(
            f"custom_masks must hold one entry per request ({len(lens)}), got {len(custom_masks)}"
        )
    for r, mask in enumerate(custom_masks):
        if mask is None:
            continue
        if dtype_name(mask) != "bool":
            raise TypeError(
                f"custom_masks[{r}] must be a boolean array, got dtype {dtype_name(mask)}"
            )
        want = (qsl[r + 1] - qsl[r], lens[r])
        if tuple(mask.shape) != want:
            raise ValueError(
                f"custom_masks[{r}] must have shape (q_len, seq_len) = {want}, "
                f"got {tuple(mask.shape)}"
            )


def _check_batch(
    query: Any,
    key_cache: Any,
    block_table: Any,
    query_start_loc: Any,
    seq_lens: Any,
    custom_masks: Sequence[Any | None] | None,
    causal: bool,
) -> tuple[Any, list[int], list[int]]:
    """`paged_attention`'s argument checks (its Raises), shared with the attention
    backends (`pyagent_ref.attention_backends`) that implement the same contract: the
    query's namespace, query_start_loc and seq_lens as host lists."""
    xp = _check_query(query, key_cache)
    _check_integers(block_table=block_table, query_start_loc=query_start_loc, seq_lens=seq_lens)
    block_size = key_cache.shape[1]
    qsl = [int(v) for v in query_start_loc]
    lens = [int(v) for v in seq_lens]
    if len(lens) != len(qsl) - 1 or block_table.shape[0] != len(lens):
        raise ValueError(
            f"query_start_loc ({len(qsl)}), seq_lens ({len(lens)}) and block_table rows "
            f"({block_table.shape[0]}) must describe the same requests"
        )
    if custom_masks is not None:
        _check_masks(custom_masks, qsl, lens)
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {causal!r}")
    for r, seq_len in enumerate(lens):
        q_len = qsl[r + 1] - qsl[r]
        if q_len and (seq_len < q_len or -(-seq_len // block_size) > block_table.shape[1]):
            raise ValueError(
                f"request {r}: seq_len {seq_len} must cover its {q_len} query tokens and fit "
                f"{block_table.shape[1]} blocks of {block_size}"
            )
    return xp, qsl, lens


def _check_decode(query: Any, key_cache: Any, block_table: Any, seq_lens: Any) -> Any:
    """`paged_decode_attention`'s argument checks (its Raises), shared with the attention
    backends: the query's namespace."""
    xp = _check_query(query, key_cache)
    _check_integers(block_table=block_table, seq_lens=seq_lens)
    num_reqs, block_size = query.shape[0], key_cache.shape[1]
    one_row_each = block_table.ndim == 2 and block_table.shape[0] == num_reqs
    if tuple(seq_lens.shape) != (num_reqs,) or not one_row_each:
        raise ValueError(
            f"seq_lens {tuple(seq_lens.shape)} and block_table {tuple(block_table.shape)} "
            f"must have one row per query token ({num_reqs})"
        )
    capacity = block_table.shape[1] * block_size
    if can_read_values(seq_lens):
        bad = (seq_lens < 0) | (seq_lens > capacity)
        if bool(xp.any(bad)):
            r = int(xp.argmax(xp.astype(bad, xp.int8)))
            raise ValueError(
                f"seq_lens[{r}] = {int(seq_lens[r])} must be in [0, {capacity}] "
                f"({block_table.shape[1]} blocks of {block_size})"
            )
    return xp


def _flat_view(cache: Any, name: str) -> Any:
    """`cache` (num_blocks, block_size, ...) as (num_blocks * block_size, ...), sharing
    its memory."""
    contiguous = (
        cache.is_contiguous() if hasattr(cache, "is_contiguous") else cache.flags.c_contiguous
    )
    if not contiguous:
        raise ValueError(f"{name} must be C-contiguous to be written in place")
    n, b, *rest = cache.shape
    return cache.reshape(n * b, *rest)


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

    For query token i of request r at position p (see the module docstring) and query
    head h, reading KV head g = h // (num_heads / num_kv_heads) (GQA; MQA when there is
    one KV head), over the keys at positions j of the same sequence:
        score_j = scale * (q . k_j)
        + alibi_slopes[h] * (j - p)            if alibi_slopes is given
        soft_cap * tanh(score_j / soft_cap)    if soft_cap is given (Gemma 2's capping)
    A key is visible when j <= p (with causal=False: when j < seq_lens[r], every
    position of the sequence, as an encoder attends), and j > p - sliding_window if a
    window is given, and `custom_masks[r][i, j]` is true if a mask is given for r
    (AND-ed: for tree attention, where the flattened drafts are in topological order).
    out = softmax over visible j of the scores, applied to v_j. Scores and softmax are
    computed in float32 (float64 for float64 inputs). Query tokens past
    query_start_loc[-1] (padding) get zeros. With an fp8 kv_cache_dtype, k_j and v_j are
    the values of the caches' codes (see `reshape_and_cache`) times k_scale and v_scale,
    in the compute dtype: the result is that of attention over those dequantized caches.

    Args:
        query: float array, shape (num_tokens, num_heads, head_size).
        key_cache: shape (num_blocks, block_size, num_kv_heads, head_size); uint8
            with an fp8 kv_cache_dtype.
        value_cache: like key_cache.
        block_table: integer array, shape (num_reqs, max_blocks_per_req).
        query_start_loc: integer array, shape (num_reqs + 1,), from 0, non-decreasing.
        seq_lens: integer array, shape (num_reqs,): each request's sequence length
            including its query tokens (so seq_lens[r] >= q_len_r).
        scale: the softmax scale, usually head_size ** -0.5.
        sliding_window: attend to at most this many most recent positions, or None.
        soft_cap: positive cap on the scores, or None.
        alibi_slopes: float array, shape (num_heads,), or None.
        custom_masks: per request, None or a boolean array (q_len_r, seq_lens[r]).
        causal: whether a query token sees only the keys up to its own position
            (decoders) or every key of its sequence (encoders: BERT).
        kv_cache_dtype: as in `reshape_and_cache`: "auto", or the fp8 format of the
            uint8 caches.
        k_scale: as in `reshape_and_cache`.
        v_scale: as in `reshape_and_cache`.
    Returns:
        An array like query.
    Raises:
        TypeError: non-float query, non-integer index arrays, a non-boolean custom mask,
            a causal that is not a bool; a scale that is not a float, caches that are
            not uint8 with an fp8 kv_cache_dtype.
        ValueError: shapes disagree, num_heads not a multiple of num_kv_heads, a
            sequence longer than its block table, seq_lens[r] < q_len_r, a custom
            mask not of shape (q_len_r, seq_lens[r]); an unknown kv_cache_dtype, a
            scale that is not positive and finite.
    """
    xp, qsl, lens = _check_batch(
        query, key_cache, block_table, query_start_loc, seq_lens, custom_masks, causal
    )
    caches = {"key_cache": key_cache, "value_cache": value_cache}
    fp8 = _fp8.check(kv_cache_dtype, k_scale, v_scale, caches), k_scale, v_scale
    block_size = key_cache.shape[1]
    compute = xp.float64 if dtype_name(query) == "float64" else xp.float32
    out = xp.zeros(query.shape, dtype=query.dtype, device=device(query))
    # Requests with the same number of query tokens (all the decodes, typically) are
    # attended together, padded to the longest sequence among them.
    by_q_len: dict[int, list[int]] = {}
    for r in range(len(lens)):
        if qsl[r + 1] > qsl[r]:
            by_q_len.setdefault(qsl[r + 1] - qsl[r], []).append(r)
    dev = device(query)
    for q_len, rows in by_q_len.items():
        tokens = [t for r in rows for t in range(qsl[r], qsl[r] + q_len)]
        index = xp.asarray(tokens, dtype=xp.int64, device=dev)
        table = xp.take(block_table, xp.asarray(rows, dtype=xp.int64, device=dev), axis=0)
        longest = max(lens[r] for r in rows)
        masks = None if custom_masks is None else [custom_masks[r] for r in rows]
        o = _attend(
            xp,
            xp.take(query, index, axis=0),
            key_cache,
            value_cache,
            table[:, : -(-longest // block_size)],
            xp.asarray([lens[r] for r in rows], dtype=xp.int64, device=dev),
            q_len,
            scale,
            compute,
            sliding_window,
            soft_cap,
            alibi_slopes,
            masks,
            causal,
            fp8,
        )
        out[index] = xp.astype(o, query.dtype, copy=False)
    return out


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
    """`paged_attention` for one query token per request, with static shapes.

    Request r's single query token sits at position seq_lens[r] - 1 and attends as in
    `paged_attention` (causal, GQA/MQA, window, soft cap, ALiBi). A request with
    seq_lens[r] == 0 is padding and gets zeros. Every block of every table row is
    gathered and positions >= seq_lens[r] are masked, so the work and every
    intermediate shape depend only on the argument shapes, and no device value is read
    on the host: a CUDA graph can capture the op. The cost grows with
    block_table.shape[1]; outside a graph, pass only the columns the longest sequence
    uses. Unused table entries must still be valid block ids. The seq_lens range is
    checked whenever the op runs eagerly (not while a graph is captured or
    torch.compile traces).

    Args:
        query: float array, shape (num_reqs, num_heads, head_size).
        key_cache: shape (num_blocks, block_size, num_kv_heads, head_size); uint8
            with an fp8 kv_cache_dtype.
        value_cache: like key_cache.
        block_table: integer array, shape (num_reqs, max_blocks_per_req).
        seq_lens: integer array, shape (num_reqs,), each in [0, max_blocks_per_req *
            block_size], counting the query token.
        scale: the softmax scale, as in `paged_attention`.
        sliding_window: as in `paged_attention`.
        soft_cap: as in `paged_attention`.
        alibi_slopes: as in `paged_attention`.
        kv_cache_dtype: as in `paged_attention` (an fp8 cache is read in place).
        k_scale: as in `paged_attention`.
        v_scale: as in `paged_attention`.
    Returns:
        An array like query.
    Raises:
        TypeError: non-float query, non-integer block_table or seq_lens; a scale that
            is not a float, caches that are not uint8 with an fp8 kv_cache_dtype.
        ValueError: shapes disagree, num_heads not a multiple of num_kv_heads, a
            seq_len outside [0, max_blocks_per_req * block_size]; an unknown
            kv_cache_dtype, a scale that is not positive and finite.
    """
    xp = _check_decode(query, key_cache, block_table, seq_lens)
    caches = {"key_cache": key_cache, "value_cache": value_cache}
    fp8 = _fp8.check(kv_cache_dtype, k_scale, v_scale, caches), k_scale, v_scale
    compute = xp.float64 if dtype_name(query) == "float64" else xp.float32
    o = _attend(
        xp,
        query,
        key_cache,
        value_cache,
        block_table,
        xp.astype(seq_lens, xp.int64),
        1,
        scale,
        compute,
        sliding_window,
        soft_cap,
        alibi_slopes,
        None,
        True,
        fp8,
    )
    return xp.astype(o, query.dtype, copy=False)


def _attend(
    xp: Any,
    query: Any,
    key_cache: Any,
    value_cache: Any,
    table: Any,
    seq: Any,
    q_len: int,
    scale: float,
    compute: Any,
    sliding_window: int | None,
    soft_cap: float | None,
    alibi_slopes: Any,
    custom_masks: list[Any] | None,
    causal: bool = True,
    fp8: tuple[Any, float, float] = (None, 1.0, 1.0),
) -> Any:
    """Attention of n requests of `q_len` query tokens each (see `paged_attention`).

    query: (n * q_len, num_heads, d); table: (n, W) block ids; seq: int64 (n,) on the
    query's device, each request's sequence length. Keys and values of all W blocks are
    gathered (S = W * block_size positions); positions past a request's sequence lie
    past all its query positions, so the causal mask hides them (without it, a mask of
    the sequence's length does). Reads no device value on the host. Returns
    (n * q_len, num_heads, d) in `compute`. fp8: (format or None, k_scale, v_scale);
    with a format, the gathered codes are dequantized: their values times the scale,
    in `compute`.
    """
    n, (_, num_heads, d) = table.shape[0], query.shape
    _, block_size, num_kv_heads, _ = key_cache.shape
    group, width = num_heads // num_kv_heads, table.shape[1]
    span = width * block_size
    dev = device(query)
    # the table's entries past each request's last block are replaced by block 0
    used = xp.reshape((seq + block_size - 1) // block_size, (n, 1))
    table = xp.where(xp.arange(width, device=dev)[None, :] < used, xp.astype(table, xp.int64), 0)

    fmt, k_scale, v_scale = fp8

    def gather(cache: Any, kv_scale: float) -> Any:  # (n, kv_heads, S, d)
        kv = xp.take(cache, xp.reshape(table, (-1,)), axis=0)
        kv = xp.reshape(kv, (n, span, num_kv_heads, d))
        if fmt is not None:
            kv = xp.astype(_fp8.decode(kv, fmt), compute) * kv_scale
        return xp.permute_dims(xp.astype(kv, compute, copy=False), (0, 2, 1, 3))

    k, v = gather(key_cache, k_scale), gather(value_cache, v_scale)
    # Per KV head, its `group` query heads attend together: stack them as rows.
    q = xp.reshape(xp.astype(query, compute, copy=False), (n, q_len, num_kv_heads, group, d))
    q = xp.reshape(xp.permute_dims(q, (0, 2, 3, 1, 4)), (n, num_kv_heads, group * q_len, d))
    scores = xp.matmul(q, xp.permute_dims(k, (0, 1, 3, 2))) * scale
    scores = xp.reshape(scores, (n, num_kv_heads, group, q_len, span))
    q_pos = xp.reshape(seq, (n, 1, 1, 1, 1)) - q_len
    q_pos = q_pos + xp.reshape(xp.arange(q_len, device=dev), (1, 1, 1, q_len, 1))
    k_pos = xp.reshape(xp.arange(span, device=dev), (1, 1, 1, 1, span))
    if alibi_slopes is not None:
        slopes = xp.reshape(xp.astype(alibi_slopes, compute), (1, num_kv_heads, group, 1, 1))
        scores = scores + slopes * xp.astype(k_pos - q_pos, compute)
    if soft_cap is not None:
        scores = soft_cap * xp.tanh(scores / soft_cap)
    visible = k_pos <= q_pos if causal else k_pos < xp.reshape(seq, (n, 1, 1, 1, 1))
    if sliding_window is not None:
        visible = visible & (k_pos > q_pos - sliding_window)
    if custom_masks is not None and any(m is not None for m in custom_masks):
        allowed = xp.ones((n, q_len, span), dtype=xp.bool, device=dev)
        for i, mask in enumerate(custom_masks):
            if mask is not None:
                allowed[i, :, : mask.shape[1]] = xp.asarray(mask, device=dev)
        visible = visible & xp.reshape(allowed, (n, 1, 1, q_len, span))
    scores = xp.where(visible, scores, -math.inf)
    # a row with nothing visible (a padding request) gets weights 0, not NaN
    top = xp.max(scores, axis=-1, keepdims=True)
    weights = xp.exp(scores - xp.where(top == -math.inf, 0.0, top))
    weights = weights / xp.clip(xp.sum(weights, axis=-1, keepdims=True), 1e-30, None)
    weights = xp.reshape(weights, (n, num_kv_heads, group * q_len, span))
    o = xp.reshape(xp.matmul(weights, v), (n, num_kv_heads, group, q_len, d))
    return xp.reshape(xp.permute_dims(o, (0, 3, 1, 2, 4)), (n * q_len, num_heads, d))
