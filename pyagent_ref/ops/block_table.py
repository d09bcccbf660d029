"""Block tables and slot mappings: from a scheduled batch to addresses in the paged KV cache.

A step runs one flattened batch: the new tokens of every scheduled request, request r
owning tokens [query_start_loc[r], query_start_loc[r + 1]). Each token has a position
in its sequence, and its KV goes to one slot of the paged cache:

    slot = block_table[r, position // block_size] * block_size + position % block_size

(the KV tensors have block_size slots per block, block b holding slots
[b * block_size, (b + 1) * block_size)). Batches may be padded past the last request's
tokens (e.g. to a captured CUDA graph size); padding tokens get `PAD_SLOT_ID`, which the
cache write skips.
"""

from __future__ import annotations

from typing import Any

from array_api_compat import device

from ._arrays import dtype_name, namespace

__all__ = ["PAD_SLOT_ID", "compute_positions", "compute_slot_mapping", "compute_logits_indices"]

PAD_SLOT_ID = -1


def _int_array(x: Any, name: str, ndim: int) -> Any:
    xp = namespace(x, name)
    if dtype_name(x) not in ("int32", "int64"):
        raise TypeError(f"{name} must be int32 or int64, got dtype {dtype_name(x)}")
    if x.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dimension(s), got shape {tuple(x.shape)}")
    return xp


def _check_query_start_loc(xp: Any, qsl: Any) -> None:
    if qsl.shape[0] < 1 or int(qsl[0]) != 0:
        raise ValueError("query_start_loc must start with 0 (one entry per request, plus one)")
    wide = xp.astype(qsl, xp.int64)  # int32 differences could wrap
    steps = wide[1:] - wide[:-1]
    if bool(xp.any(steps < 0)):
        row = int(xp.argmax(xp.astype(steps < 0, xp.int8)))
        raise ValueError(
            f"query_start_loc must be non-decreasing, "
            f"got {int(wide[row])} then {int(wide[row + 1])}"
        )


def _request_of_token(xp: Any, qsl: Any, num_tokens: int) -> Any:
    """For each token index t < num_tokens, the request r with qsl[r] <= t < qsl[r + 1]."""
    t = xp.arange(num_tokens, dtype=xp.int64, device=device(qsl))
    return xp.searchsorted(xp.astype(qsl, xp.int64), t, side="right") - 1


def compute_positions(query_start_loc: Any, num_computed_tokens: Any, num_tokens: int) -> Any:
    """Sequence position of every token of the flattened batch.

    Token t of request r (qsl[r] <= t < qsl[r + 1]) is at position
    num_computed_tokens[r] + (t - qsl[r]): requests continue where their cached KV ends.
    Tokens t >= qsl[-1] are padding and get position 0.

    Args:
        query_start_loc: int32/int64, shape (num_reqs + 1,), starting at 0, non-decreasing.
        num_computed_tokens: int32/int64, shape (num_reqs,), each >= 0.
        num_tokens: int >= qsl[-1], the (possibly padded) batch length.
    Returns:
        int64 array of shape (num_tokens,), on the input's device.
    Raises:
        TypeError: non-integer arrays.
        ValueError: shapes disagree, a malformed query_start_loc, a negative
            num_computed_tokens, or num_tokens < qsl[-1].
    """
    xp = _int_array(query_start_loc, "query_start_loc", 1)
    _int_array(num_computed_tokens, "num_computed_tokens", 1)
    qsl = query_start_loc
    _check_query_start_loc(xp, qsl)
    if num_computed_tokens.shape[0] != qsl.shape[0] - 1:
        raise ValueError(
            f"num_computed_tokens must have shape ({qsl.shape[0] - 1},), "
            f"got {tuple(num_computed_tokens.shape)}"
        )
    if bool(xp.any(num_computed_tokens < 0)):
        raise ValueError(
            f"num_computed_tokens must be >= 0, got min {int(xp.min(num_computed_tokens))}"
        )
    total = int(qsl[-1])
    if isinstance(num_tokens, bool) or not isinstance(num_tokens, int) or num_tokens < total:
        raise ValueError(
            f"num_tokens must be an int >= query_start_loc[-1] = {total}, got {num_tokens!r}"
        )
    req = _request_of_token(xp, qsl, num_tokens)
    real = req < qsl.shape[0] - 1
    r = xp.where(real, req, 0)
    t = xp.arange(num_tokens, dtype=xp.int64, device=device(qsl))
    start = xp.take(xp.astype(qsl, xp.int64), r)
    pos = (
        xp.take(xp.astype(num_computed_tokens, xp.int64), r) + t - start if qsl.shape[0] > 1 else t
    )
    return xp.where(real, pos, 0)


def compute_slot_mapping(
    block_table: Any, query_start_loc: Any, positions: Any, block_size: int
) -> Any:
    """The KV cache slot of every token of the flattened batch.

    For token t of request r: slot = block_table[r, p // block_size] * block_size +
    p % block_size with p = positions[t]. Tokens t >= qsl[-1] (padding) get PAD_SLOT_ID.

    Args:
        block_table: int32/int64, shape (num_reqs, max_blocks_per_req); entries are block
            ids >= 0 (unused trailing entries are ignored).
        query_start_loc: int32/int64, shape (num_reqs + 1,), starting at 0, non-decreasing.
        positions: int32/int64, shape (num_tokens,), num_tokens >= qsl[-1], each >= 0.
        block_size: int >= 1.
    Returns:
        int64 array of shape (num_tokens,), on the input's device.
    Raises:
        TypeError: non-integer arrays or block_size.
        ValueError: shapes disagree, a malformed query_start_loc, a negative position,
            or a position past the request's block table (names the token and position).
    """
    xp = _int_array(block_table, "block_table", 2)
    _int_array(query_start_loc, "query_start_loc", 1)
    _int_array(positions, "positions", 1)
    if isinstance(block_size, bool) or not isinstance(block_size, int):
        raise TypeError(f"block_size must be an int, got {block_size!r}")
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    qsl = query_start_loc
    _check_query_start_loc(xp, qsl)
    num_reqs, max_blocks = block_table.shape
    if qsl.shape[0] != num_reqs + 1:
        raise ValueError(
            f"query_start_loc must have shape ({num_reqs + 1},) for {num_reqs} block table rows, "
            f"got {tuple(qsl.shape)}"
        )
    num_tokens = positions.shape[0]
    if num_tokens < int(qsl[-1]):
        raise ValueError(
            f"positions has {num_tokens} entries, fewer than the {int(qsl[-1])} tokens"
        )
    req = _request_of_token(xp, qsl, num_tokens)
    real = req < num_reqs
    pos = xp.astype(positions, xp.int64)
    if bool(xp.any(real & (pos < 0))):
        t = int(xp.argmax(xp.astype(real & (pos < 0), xp.int8)))
        raise ValueError(f"positions[{t}] must be >= 0, got {int(pos[t])}")
    col = pos // block_size
    beyond = real & (col >= max_blocks)
    if bool(xp.any(beyond)):
        t = int(xp.argmax(xp.astype(beyond, xp.int8)))
        raise ValueError(
            f"positions[{t}] = {int(pos[t])} needs block {int(col[t])}, "
            f"past the block table's {max_blocks} columns"
        )
    flat = xp.where(real, req, 0) * max_blocks + xp.where(real, col, 0)
    table = xp.reshape(xp.astype(block_table, xp.int64), (-1,))
    blocks = xp.take(table, flat) if num_reqs and max_blocks else flat  # else: all padding
    return xp.where(real, blocks * block_size + pos % block_size, PAD_SLOT_ID)


def compute_logits_indices(query_start_loc: Any) -> Any:
    """Index of each request's last scheduled token: the row whose logits are sampled.

    Args:
        query_start_loc: int32/int64, shape (num_reqs + 1,), starting at 0, strictly
            increasing (every scheduled request has at least one token).
    Returns:
        int64 array of shape (num_reqs,): qsl[1:] - 1.
    Raises:
        TypeError: a non-integer array. ValueError: a malformed query_start_loc or a
            request with no tokens.
    """
    xp = _int_array(query_start_loc, "query_start_loc", 1)
    _check_query_start_loc(xp, query_start_loc)
    qsl = xp.astype(query_start_loc, xp.int64)
    if bool(xp.any(qsl[1:] == qsl[:-1])):
        r = int(xp.argmax(xp.astype(qsl[1:] == qsl[:-1], xp.int8)))
        raise ValueError(f"request {r} has no scheduled tokens in query_start_loc")
    return qsl[1:] - 1
