"""Batched LoRA: every token's low-rank update from its own adapter, in one pass.

A LoRA adapter (Hu et al. 2021) adapts a linear layer y = W x by a low-rank term
s * B (A x), with A of shape (rank, in), B of shape (out, rank) and a scaling s. To serve
many adapters at once, an engine keeps the adapters of each adapted layer stacked in
slots (lora_a: (num_loras, rank, in), lora_b: (num_loras, out, rank), a scaling per
slot) and gives every token of the flattened batch the slot of its request's adapter,
or -1 for a request without one. Two ops apply them to the whole batch:

- `lora_shrink`: y[t] = lora_a[i_t] @ x[t], the projection down to the rank;
- `lora_expand`: out[t] += scaling[i_t] * lora_b[i_t] @ y[t], the projection back up,
  scaled, added in place to the base layer's output (or returned).

Punica (Chen et al. 2023) named the two shapes of kernels that compute them: SGMV
(segmented gather matrix-vector: the tokens of one adapter form a segment, one GEMM per
segment; for prefill) and BGMV (batched gather matrix-vector: one matrix-vector product
per token, each with its own adapter; for decode). vLLM calls them `lora_shrink` and
`lora_expand`. Both compute what the contracts below state; the reference loops over
the slots, each slot's product kept only on its own tokens (`xp.where`), which reads no
index on the host, so a CUDA graph or torch.compile can hold it.

Fused projections. A layer that fuses several projections (q, k and v in one qkv_proj;
gate and up) adapts each with its own A and B. Their A's stack along the rank axis
(lora_a of shape (num_loras, num_slices * rank, in)), so one shrink serves them all;
`lora_expand` takes `output_slices`, the sizes of the slices along its output axis:
the rows of slice s read y's columns [s * rank, (s + 1) * rank). That is vLLM's
multi-slice expand, with the slices' B's stacked along the output axis.

Adapters of a smaller rank sit in a slot zero-padded to the slots' rank: the padding
adds exact zeros. Sums run in float32 (float64 for float64 inputs).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from array_api_compat import device

from ._arrays import ANY_FLOAT_DTYPE_NAMES, can_read_values, dtype_name, namespace

__all__ = ["lora_shrink", "lora_expand"]


# --- validation -----------------------------------------------------------------------------


def _float_array(x: Any, name: str, ndim: int) -> Any:
    """The namespace of float array `x` with `ndim` axes; TypeError/ValueError naming it."""
    xp = namespace(x, name)
    if dtype_name(x) not in ANY_FLOAT_DTYPE_NAMES:
        raise TypeError(f"{name} must be a float array, got dtype {dtype_name(x)}")
    if x.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} axes, got shape {tuple(x.shape)}")
    return xp


def _check_indices(xp: Any, indices: Any, tokens: int, num_loras: int) -> None:
    """int32/int64 (tokens,), each in [-1, num_loras) (values checked when readable)."""
    namespace(indices, "indices")
    if dtype_name(indices) not in ("int32", "int64"):
        raise TypeError(f"indices must be int32 or int64, got dtype {dtype_name(indices)}")
    if tuple(indices.shape) != (tokens,):
        raise ValueError(
            f"indices must have shape ({tokens},), one per token, got {tuple(indices.shape)}"
        )
    if tokens and can_read_values(indices):
        bad = (indices < -1) | (indices >= num_loras)
        if bool(xp.any(bad)):
            t = int(xp.argmax(xp.astype(bad, xp.int8)))
            raise ValueError(
                f"indices[{t}] is {int(indices[t])}, outside [-1, {num_loras}) "
                f"(-1: no adapter, else a slot of the {num_loras})"
            )


def _compute_dtype(xp: Any, x: Any) -> Any:
    return xp.float64 if dtype_name(x) == "float64" else xp.float32


def _slices(output_slices: Sequence[int] | None, out_features: int) -> list[int]:
    """The slice sizes along the output axis (one slice of everything by default)."""
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


# --- the ops --------------------------------------------------------------------------------


def lora_shrink(x: Any, lora_a: Any, indices: Any) -> Any:
    """Each token's input projected down by the A matrix of its adapter.

    For each token t with slot i = indices[t]: y[t] = lora_a[i] @ x[t] if i >= 0, and
    y[t] = 0 if i == -1 (a request without an adapter). Computed in float32 (float64
    for float64 x) from the inputs converted once. Slots no token uses are not read: a
    NaN there never reaches the result. For a fused projection, lora_a holds its slices'
    A's stacked along the rank axis (see the module docstring).

    Args:
        x: float array (float16, bfloat16, float32 or float64), shape (tokens,
            in_features); tokens may be 0.
        lora_a: x's dtype, shape (num_loras, rank, in_features); num_loras and rank may
            be 0.
        indices: int32 or int64, shape (tokens,), each in [-1, num_loras).
    Returns:
        A new float32 (float64 for float64 x) array of shape (tokens, rank) in x's
        library and device.
    Raises:
        TypeError: non-float x or lora_a, lora_a of another dtype than x, non-integer
            indices.
        ValueError: shapes that disagree (the message names the array), an index
            outside [-1, num_loras) (it names the token and the index).
    """
    xp = _float_array(x, "x", 2)
    _float_array(lora_a, "lora_a", 3)
    if dtype_name(lora_a) != dtype_name(x):
        raise TypeError(f"lora_a must have x's dtype {dtype_name(x)}, got {dtype_name(lora_a)}")
    tokens, in_features = x.shape
    num_loras, rank = lora_a.shape[0], lora_a.shape[1]
    if lora_a.shape[2] != in_features:
        raise ValueError(
            f"lora_a must have shape (num_loras, rank, {in_features}), got {tuple(lora_a.shape)}"
        )
    _check_indices(xp, indices, tokens, num_loras)
    compute = _compute_dtype(xp, x)
    h = xp.astype(x, compute)
    y = xp.zeros((tokens, rank), dtype=compute, device=device(x))
    for slot in range(num_loras):
        mine = xp.reshape(indices == slot, (tokens, 1))
        a = xp.astype(lora_a[slot, ...], compute)
        y = xp.where(mine, h @ xp.matrix_transpose(a), y)
    return y


def lora_expand(
    y: Any,
    lora_b: Any,
    indices: Any,
    scaling: Any,
    out: Any = None,
    output_slices: Sequence[int] | None = None,
) -> Any:
    """Each token's rank-space vector projected up by the B matrix of its adapter, scaled,
    and added to the base layer's output in place (or returned).

    For each token t with slot i = indices[t] >= 0 and each output row o in slice s
    (the slices of `output_slices`, in order along the output axis; one slice of every
    row by default), with rank = lora_b.shape[2]:
        delta[t, o] = scaling[i] * (lora_b[i, o, :] @ y[t, s * rank : (s + 1) * rank])
    and delta[t] = 0 for i == -1. Computed in float32 (float64 for float64 y) from the
    inputs converted once; the scaling multiplies the dot product. Slots no token uses
    are not read.

    With `out`, the op adds in place: out[t] becomes out[t] + delta[t], added in float64
    if out or y is float64 (else in float32) and rounded once to out's dtype, for every
    token with an adapter; the rows of tokens without one keep their bytes. It then
    returns `out` itself. Without `out` it returns delta.

    Args:
        y: float array, shape (tokens, num_slices * rank) (what `lora_shrink` returns).
        lora_b: float array, shape (num_loras, out_features, rank).
        indices: int32 or int64, shape (tokens,), each in [-1, num_loras).
        scaling: float array, shape (num_loras,), every entry finite: each slot's
            adapter scaling (alpha / rank; alpha / sqrt(rank) for rsLoRA).
        out: None, or a float array of shape (tokens, out_features) in y's library and
            device, updated in place.
        output_slices: None (one slice), or the sizes of the slices along the output
            axis: ints >= 1 summing to out_features; num_slices is their count.
    Returns:
        `out` after the update, or a new float32 (float64 for float64 y) array of shape
        (tokens, out_features) in y's library and device.
    Raises:
        TypeError: non-float y, lora_b, scaling or out; non-integer indices;
            output_slices that are not ints.
        ValueError: shapes that disagree (the message names the array), output_slices
            that do not sum to out_features, an index outside [-1, num_loras) (it names
            the token), a NaN or infinite scaling.
    """
    xp = _float_array(y, "y", 2)
    _float_array(lora_b, "lora_b", 3)
    _float_array(scaling, "scaling", 1)
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
    if out is not None:
        _float_array(out, "out", 2)
        if tuple(out.shape) != (tokens, out_features):
            raise ValueError(
                f"out must have shape ({tokens}, {out_features}), got {tuple(out.shape)}"
            )
    _check_indices(xp, indices, tokens, num_loras)
    if can_read_values(scaling) and not bool(xp.all(xp.isfinite(scaling))):
        raise ValueError("scaling contains NaN or inf")
    compute = _compute_dtype(xp, y)
    v = xp.astype(y, compute)
    scale = xp.astype(scaling, compute)
    starts = [sum(sizes[:s]) for s in range(len(sizes))]
    delta = xp.zeros((tokens, out_features), dtype=compute, device=device(y))
    for slot in range(num_loras):
        b = xp.astype(lora_b[slot, ...], compute)
        parts = [
            v[:, s * rank : (s + 1) * rank] @ xp.matrix_transpose(b[start : start + size, :])
            for s, (start, size) in enumerate(zip(starts, sizes, strict=True))
        ]
        product = (parts[0] if len(parts) == 1 else xp.concat(parts, axis=1)) * scale[slot]
        delta = xp.where(xp.reshape(indices == slot, (tokens, 1)), product, delta)
    if out is None:
        return delta
    mine = xp.reshape(indices >= 0, (tokens, 1))
    wide = xp.float64 if dtype_name(out) == "float64" else compute
    total = xp.astype(out, wide) + xp.astype(delta, wide)
    out[...] = xp.where(mine, xp.astype(total, out.dtype), out)
    return out
