"""Mixture-of-experts routing and experts in Rust: drop-in replacements for
`pyagent_ref.ops.moe`.

Same functions, signatures, results and exceptions (classes, messages, check order) as
the reference, whose docstrings are the contract. Inputs are numpy arrays or torch CPU
tensors of float16, bfloat16, float32 or float64 (torch is optional and never imported
here); results come back in the input's library. Each op is one native call with the
GIL released, rows (routing) or blocks of tokens per expert (`fused_moe`) in parallel.

Exactness: `route_topk_softmax` picks the reference's experts exactly (the choice is on
the logits); its weights and `route_grouped_topk`'s scores use an exp accurate to one
ulp, so weights differ from the reference's in the last bits and grouped choices can
differ only between scores within that distance. `fused_moe` sums its dot products in
another order than BLAS: results agree within the specification's tolerance.

Differences from the reference:

- Only numpy arrays and torch CPU tensors: a tensor on another device raises TypeError
  (it is never copied silently), as does another array library.
- Non-contiguous logits, hidden states and weights are copied to a contiguous array
  first (the reference reads any layout).
- torch inputs that require grad are read through `detach()`; results carry no graph.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import _native
from . import _common as _c

__all__ = ["route_topk_softmax", "route_grouped_topk", "fused_moe"]

SCORING_FUNCS = ("softmax", "sigmoid")
GROUP_SCORES = ("top2_sum", "max")
ACTIVATIONS = ("silu",)


def _float_array(x: Any, name: str, ndim: int) -> bool:
    """The reference's `_float_array`: returns whether x is a torch tensor."""
    torch_in = _c.array_library(x, name)
    kind = _c.dtype_name(x)
    if kind not in _c.FLOAT_KINDS:
        raise TypeError(f"{name} must be a float array, got dtype {kind}")
    if x.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} axes, got shape {tuple(x.shape)}")
    return torch_in


def _compute(x: Any) -> np.dtype:
    return _c.F64 if _c.dtype_name(x) == "float64" else _c.F32


def _contiguous(x: Any, name: str, torch_in: bool) -> np.ndarray:
    """The C-contiguous numpy array Rust reads for float array x (bfloat16 as int16 bits)."""
    if torch_in:
        _c.check_cpu(x, name)
        x = x.contiguous()
    return np.ascontiguousarray(_c.float_view(x, name, torch_in))


def _as_compute(x: Any, dtype: np.dtype, name: str, torch_in: bool) -> np.ndarray:
    """Float array x converted to the compute dtype (the reference's `xp.astype`)."""
    if torch_in:
        _c.check_cpu(x, name)
        x = x.detach()
        return np.ascontiguousarray(x.to(_c.torch_dtype(dtype)).numpy())
    return np.ascontiguousarray(np.asarray(x).astype(dtype))


def _all_finite(x: Any, torch_in: bool) -> np.ndarray:
    """Per row of 2-D x: whether every entry is finite, read on numpy's zero-copy view (a
    torch reduction would wake torch's thread pool, which costs more than routing)."""
    view = _c.float_view(x, "logits", torch_in)
    if view.dtype == _c.I16:  # bfloat16 bits: inf and NaN have an all-ones exponent
        return ((view & 0x7F80) != 0x7F80).all(axis=1)
    return np.isfinite(view).all(axis=1)


def _check_router_logits(logits: Any, k: Any) -> bool:
    torch_in = _float_array(logits, "logits", 2)
    experts = logits.shape[1]
    if experts == 0:
        raise ValueError(f"logits must have at least one expert, got shape {tuple(logits.shape)}")
    if isinstance(k, bool) or not isinstance(k, int):
        raise TypeError(f"k must be an int, got {type(k).__name__}")
    if not 1 <= k <= experts:
        raise ValueError(f"k must be in [1, {experts}] (the number of experts), got {k}")
    finite = _all_finite(logits, torch_in)
    if not finite.all():
        raise ValueError(f"logits row {int(np.argmin(finite))} contains NaN or inf")
    return torch_in


def route_topk_softmax(logits: Any, k: int, renormalize: bool) -> tuple[Any, Any]:
    """The k experts with the largest router logits, weighted by their softmax probability.

    Contract: `pyagent_ref.ops.moe.route_topk_softmax`.
    """
    torch_in = _check_router_logits(logits, k)
    out = _native.route_topk_softmax(_contiguous(logits, "logits", torch_in), k, bool(renormalize))
    return _c.wrap(out, torch_in)


def route_grouped_topk(
    logits: Any,
    k: int,
    num_groups: int,
    topk_groups: int,
    correction_bias: Any = None,
    scoring: str = "sigmoid",
    routed_scaling_factor: float = 1.0,
    renormalize: bool = True,
    group_score: str = "top2_sum",
) -> tuple[Any, Any]:
    """Group-limited top-k routing: the best groups, then the best experts inside them.

    Contract: `pyagent_ref.ops.moe.route_grouped_topk`.
    """
    torch_in = _check_router_logits(logits, k)
    experts = logits.shape[1]
    for name, value in (("num_groups", num_groups), ("topk_groups", topk_groups)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if num_groups < 1 or experts % num_groups:
        raise ValueError(
            f"num_groups must be >= 1 and divide the {experts} experts, got {num_groups}"
        )
    if not 1 <= topk_groups <= num_groups:
        raise ValueError(f"topk_groups must be in [1, {num_groups}], got {topk_groups}")
    size = experts // num_groups
    if k > topk_groups * size:
        raise ValueError(
            f"k must be at most topk_groups * group size = {topk_groups * size}, got {k}"
        )
    if scoring not in SCORING_FUNCS:
        raise ValueError(f"scoring must be one of {SCORING_FUNCS}, got {scoring!r}")
    if group_score not in GROUP_SCORES:
        raise ValueError(f"group_score must be one of {GROUP_SCORES}, got {group_score!r}")
    if not abs(float(routed_scaling_factor)) < float("inf"):
        raise ValueError(f"routed_scaling_factor must be finite, got {routed_scaling_factor}")
    compute = _compute(logits)
    bias = None
    if correction_bias is not None:
        bias_torch = _float_array(correction_bias, "correction_bias", 1)
        if tuple(correction_bias.shape) != (experts,):
            raise ValueError(
                f"correction_bias must have shape ({experts},), got {tuple(correction_bias.shape)}"
            )
        bias = _as_compute(correction_bias, compute, "correction_bias", bias_torch)
        if not np.isfinite(bias).all():
            raise ValueError("correction_bias contains NaN or inf")
    out = _native.route_grouped_topk(
        _contiguous(logits, "logits", torch_in),
        k,
        num_groups,
        topk_groups,
        bias,
        scoring == "sigmoid",
        float(routed_scaling_factor),
        bool(renormalize),
        group_score == "max",
    )
    return _c.wrap(out, torch_in)


def fused_moe(
    hidden: Any,
    w_gate_up: Any,
    w_down: Any,
    topk_weights: Any,
    topk_ids: Any,
    activation: str = "silu",
) -> Any:
    """The experts' gated MLPs on the tokens routed to them, weighted and summed per token.

    Contract: `pyagent_ref.ops.moe.fused_moe`.
    """
    torch_in = _float_array(hidden, "hidden", 2)
    gu_torch = _float_array(w_gate_up, "w_gate_up", 3)
    down_torch = _float_array(w_down, "w_down", 3)
    weights_torch = _float_array(topk_weights, "topk_weights", 2)
    for name, w in (("w_gate_up", w_gate_up), ("w_down", w_down)):
        if _c.dtype_name(w) != _c.dtype_name(hidden):
            raise TypeError(
                f"{name} must have hidden's dtype {_c.dtype_name(hidden)}, got {_c.dtype_name(w)}"
            )
    ids_torch = _c.array_library(topk_ids, "topk_ids")
    if _c.dtype_name(topk_ids) not in ("int32", "int64"):
        raise TypeError(f"topk_ids must be int32 or int64, got dtype {_c.dtype_name(topk_ids)}")
    tokens, hidden_size = hidden.shape
    experts, two_inter = w_gate_up.shape[0], w_gate_up.shape[1]
    if two_inter % 2 or w_gate_up.shape[2] != hidden_size:
        raise ValueError(
            f"w_gate_up must have shape (experts, 2 * inter, {hidden_size}), "
            f"got {tuple(w_gate_up.shape)}"
        )
    inter = two_inter // 2
    if tuple(w_down.shape) != (experts, hidden_size, inter):
        raise ValueError(
            f"w_down must have shape ({experts}, {hidden_size}, {inter}), got {tuple(w_down.shape)}"
        )
    if topk_ids.ndim != 2 or topk_ids.shape[0] != tokens:
        raise ValueError(f"topk_ids must have shape ({tokens}, k), got {tuple(topk_ids.shape)}")
    k = topk_ids.shape[1]
    if tuple(topk_weights.shape) != (tokens, k):
        raise ValueError(
            f"topk_weights must have topk_ids' shape {(tokens, k)}, got {tuple(topk_weights.shape)}"
        )
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
    if ids_torch:
        _c.check_cpu(topk_ids, "topk_ids")
    ids = np.ascontiguousarray(np.asarray(topk_ids), dtype=np.int64)
    if tokens * k:
        bad = ((ids < 0) | (ids >= experts)).any(axis=1)
        if bad.any():
            row = int(np.argmax(bad))
            wrong = [int(e) for e in ids[row] if not 0 <= int(e) < experts]
            raise ValueError(f"topk_ids row {row} holds expert {wrong[0]}, outside [0, {experts})")
    out = _native.fused_moe(
        _contiguous(hidden, "hidden", torch_in),
        _contiguous(w_gate_up, "w_gate_up", gu_torch),
        _contiguous(w_down, "w_down", down_torch),
        _as_compute(topk_weights, _compute(hidden), "topk_weights", weights_torch),
        ids,
    )
    return _c.wrap_float(out, hidden, torch_in)
