"""Mixture of experts: routing each token to k experts, and running the experts' MLPs.

A sparse MoE layer (Shazeer et al. 2017; Mixtral, Qwen-MoE, DeepSeek) replaces the
dense MLP by E expert MLPs and a router, a linear map from the hidden state to one
logit per expert. Each token runs through only the k experts the router picks, and the
layer's output is the weighted sum of their outputs. Routing and the experts are two
ops, as inference engines keep them:

- `route_topk_softmax`: softmax over the router logits, the k largest, optionally
  renormalised to sum to 1 (Mixtral, Qwen2-MoE, Qwen3-MoE, DeepSeek-V2 "greedy").
- `route_grouped_topk`: the experts form groups; pick the best groups first, then the
  best experts inside them (DeepSeek-V2 "group_limited_greedy", DeepSeek-V3's sigmoid
  scores with a load-balancing correction bias). One group and no bias is plain top-k
  of sigmoid (or softmax) scores.
- `fused_moe`: given each token's (weights, expert ids), every expert's gated MLP
  down(silu(gate(h)) * up(h)) on the tokens routed to it, and the weighted sum. The
  reference sorts the (token, slot) pairs by expert and runs one matmul per expert on
  its tokens, the shape of every fused kernel.

Both routers return (topk_weights, topk_ids), float and int64 of shape (tokens, k):
`ids[t]` in descending order of the score the choice is made on, ties broken by the
lower expert id (lower group index for groups), so every conforming implementation
picks the same experts. Computation is in float32 (float64 for float64 input), as HF
transformers computes router probabilities.
"""

from __future__ import annotations

from typing import Any

from array_api_compat import device

from ._arrays import ANY_FLOAT_DTYPE_NAMES, can_read_values, dtype_name, namespace

__all__ = ["route_topk_softmax", "route_grouped_topk", "fused_moe"]

SCORING_FUNCS = ("softmax", "sigmoid")
GROUP_SCORES = ("top2_sum", "max")
ACTIVATIONS = ("silu",)


# --- validation -----------------------------------------------------------------------------


def _float_array(x: Any, name: str, ndim: int) -> Any:
    """The namespace of float array `x` with `ndim` axes; TypeError/ValueError naming it."""
    xp = namespace(x, name)
    if dtype_name(x) not in ANY_FLOAT_DTYPE_NAMES:
        raise TypeError(f"{name} must be a float array, got dtype {dtype_name(x)}")
    if x.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} axes, got shape {tuple(x.shape)}")
    return xp


def _compute_dtype(xp: Any, x: Any) -> Any:
    return xp.float64 if dtype_name(x) == "float64" else xp.float32


def _check_router_logits(logits: Any, k: Any) -> Any:
    """Checks shared by both routers: (tokens, experts) finite float logits and an int k
    in [1, experts]. Returns the namespace."""
    xp = _float_array(logits, "logits", 2)
    experts = logits.shape[1]
    if experts == 0:
        raise ValueError(f"logits must have at least one expert, got shape {tuple(logits.shape)}")
    if isinstance(k, bool) or not isinstance(k, int):
        raise TypeError(f"k must be an int, got {type(k).__name__}")
    if not 1 <= k <= experts:
        raise ValueError(f"k must be in [1, {experts}] (the number of experts), got {k}")
    if can_read_values(logits) and not bool(xp.all(xp.isfinite(logits))):
        row = int(xp.argmax(xp.astype(xp.any(~xp.isfinite(logits), axis=1), xp.int8)))
        raise ValueError(f"logits row {row} contains NaN or inf")
    return xp


def _top_ids(xp: Any, scores: Any, k: int) -> Any:
    """int64 (tokens, k): the k largest scores of each row, largest first, ties by the
    lower index (a stable descending sort)."""
    order = xp.argsort(scores, axis=1, descending=True, stable=True)
    return xp.astype(order[:, :k], xp.int64)


# --- routing --------------------------------------------------------------------------------


def route_topk_softmax(logits: Any, k: int, renormalize: bool) -> tuple[Any, Any]:
    """The k experts with the largest router logits, weighted by their softmax probability.

    For each token t (row): ids[t] are the k experts with the largest logits[t], largest
    first, ties broken by the lower expert id. The choice is made on the logits (softmax
    is monotone, and the logits are the exact input). weights[t, j] = p[ids[t, j]] with
    p = softmax(logits[t]) over all experts; with `renormalize`, divided by the sum of
    the k chosen p (the weights then sum to 1: a softmax over the chosen logits).
    Computed in float32 (float64 for float64 logits).

    Args:
        logits: float array (float16, bfloat16, float32 or float64), shape
            (tokens, experts), experts >= 1, every entry finite; tokens may be 0.
        k: int in [1, experts].
        renormalize: whether the chosen weights are scaled to sum to 1.
    Returns:
        (topk_weights, topk_ids): float32 (float64 for float64 logits) and int64 arrays
        of shape (tokens, k) in logits' library and device.
    Raises:
        TypeError: non-float logits, a k that is not an int.
        ValueError: logits not 2-D or without experts, k outside [1, experts], a NaN or
            infinite logit (the message names the row).
    """
    xp = _check_router_logits(logits, k)
    x = xp.astype(logits, _compute_dtype(xp, logits))
    ids = _top_ids(xp, x, k)
    shifted = xp.exp(x - xp.max(x, axis=1, keepdims=True))
    probs = shifted / xp.sum(shifted, axis=1, keepdims=True)
    weights = xp.take_along_axis(probs, ids, axis=1)
    if renormalize:
        weights = weights / xp.sum(weights, axis=1, keepdims=True)
    return weights, ids


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
    """Group-limited top-k routing (DeepSeek-V2 and V3): the best groups, then the best
    experts inside them.

    For each token (row), in float32 (float64 for float64 logits):
      1. scores s = sigmoid(logits) or softmax(logits) over the row (`scoring`).
      2. biased scores b = s + correction_bias (b = s without a bias). The bias only
         steers the choice (DeepSeek-V3's load balancing); it never enters the weights.
      3. The experts form `num_groups` groups of g = experts / num_groups consecutive
         ids. A group's score is the sum of its largest min(2, g) biased scores
         ("top2_sum", DeepSeek-V3) or its largest biased score ("max", DeepSeek-V2).
      4. The `topk_groups` groups with the largest group scores are kept (ties: the
         lower group index).
      5. ids = the k experts of the kept groups with the largest biased scores, largest
         first, ties broken by the lower expert id.
      6. weights = s[ids] (unbiased); with `renormalize`, divided by (their sum + 1e-20);
         then multiplied by `routed_scaling_factor`.
    With num_groups = topk_groups = 1 this is top-k of the (biased) scores; with a bias
    and sigmoid scoring, DeepSeek-V3's router.

    Args:
        logits: float array (float16, bfloat16, float32 or float64), shape
            (tokens, experts), every entry finite; tokens may be 0.
        k: int in [1, topk_groups * g].
        num_groups: int >= 1 dividing the number of experts.
        topk_groups: int in [1, num_groups].
        correction_bias: None, or a finite float array of shape (experts,).
        scoring: "sigmoid" or "softmax".
        routed_scaling_factor: finite float, applied to the final weights.
        renormalize: whether the chosen weights are scaled to sum to 1 before scaling.
        group_score: "top2_sum" or "max".
    Returns:
        (topk_weights, topk_ids): float32 (float64 for float64 logits) and int64 arrays
        of shape (tokens, k) in logits' library and device.
    Raises:
        TypeError: non-float logits or bias, a k / num_groups / topk_groups that is not
            an int.
        ValueError: a NaN or infinite logit or bias entry, num_groups not dividing the
            experts, topk_groups or k out of range, a bias of the wrong shape, an unknown
            scoring or group_score, a non-finite routed_scaling_factor.
    """
    xp = _check_router_logits(logits, k)
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
    if correction_bias is not None:
        _float_array(correction_bias, "correction_bias", 1)
        if tuple(correction_bias.shape) != (experts,):
            raise ValueError(
                f"correction_bias must have shape ({experts},), got {tuple(correction_bias.shape)}"
            )
        if can_read_values(correction_bias) and not bool(xp.all(xp.isfinite(correction_bias))):
            raise ValueError("correction_bias contains NaN or inf")
    compute = _compute_dtype(xp, logits)
    x = xp.astype(logits, compute)
    if scoring == "sigmoid":
        tail = xp.exp(-xp.abs(x))  # never overflows: sigmoid(x) = 1 / (1 + exp(-x))
        scores = xp.where(x >= 0, 1.0 / (1.0 + tail), tail / (1.0 + tail))
    else:
        shifted = xp.exp(x - xp.max(x, axis=1, keepdims=True))
        scores = shifted / xp.sum(shifted, axis=1, keepdims=True)
    biased = scores if correction_bias is None else scores + xp.astype(correction_bias, compute)
    tokens = logits.shape[0]
    grouped = xp.reshape(biased, (tokens, num_groups, size))
    if group_score == "max":
        per_group = xp.max(grouped, axis=2)
    else:
        ranked = xp.sort(grouped, axis=2, descending=True)
        per_group = xp.sum(ranked[:, :, : min(2, size)], axis=2)
    kept = _top_ids(xp, per_group, topk_groups)  # (tokens, topk_groups)
    group_of = xp.arange(experts, device=device(logits)) // size
    in_kept = xp.any(group_of[None, :, None] == kept[:, None, :], axis=2)  # (tokens, experts)
    candidates = xp.where(in_kept, biased, -float("inf"))
    ids = _top_ids(xp, candidates, k)
    weights = xp.take_along_axis(scores, ids, axis=1)
    if renormalize:
        weights = weights / (xp.sum(weights, axis=1, keepdims=True) + 1e-20)
    return weights * routed_scaling_factor, ids


# --- the experts ----------------------------------------------------------------------------


def fused_moe(
    hidden: Any,
    w_gate_up: Any,
    w_down: Any,
    topk_weights: Any,
    topk_ids: Any,
    activation: str = "silu",
) -> Any:
    """The experts' gated MLPs on the tokens routed to them, weighted and summed per token.

    For each token t with slots j = 0..k-1 and expert e = topk_ids[t, j]:
        out[t] = sum over j of topk_weights[t, j] * down_e(silu(gate_e(h)) * up_e(h))
    where h = hidden[t], gate_e(h) = w_gate_up[e, :inter] @ h, up_e(h) =
    w_gate_up[e, inter:] @ h, down_e(a) = w_down[e] @ a, and silu(x) = x / (1 + exp(-x)).
    Everything is computed in float32 (float64 for float64 hidden) from the inputs
    converted once; the sum over j runs in slot order and the result is rounded once to
    hidden's dtype. A token routed twice to one expert gets both contributions; k = 0
    or no tokens give zeros.

    The reference computes it the way fused kernels do: the (token, slot) pairs sorted
    by expert (stably, so by token within an expert), one matmul per expert over its
    tokens, then each pair's output put back in place, weighted and summed over slots.

    Args:
        hidden: float array (float16, bfloat16, float32 or float64), shape
            (tokens, hidden_size).
        w_gate_up: hidden's dtype, shape (experts, 2 * inter, hidden_size): the gate
            projection's rows, then the up projection's (HF's `gate_proj` / Mixtral's
            `w1`, then `up_proj` / `w3`).
        w_down: hidden's dtype, shape (experts, hidden_size, inter).
        topk_weights: float array of any float dtype, shape (tokens, k).
        topk_ids: int32 or int64, shape (tokens, k), each in [0, experts).
        activation: "silu" (the only one so far).
    Returns:
        A new array of shape (tokens, hidden_size) in hidden's library, device and dtype.
    Raises:
        TypeError: non-float hidden, weights or topk_weights; weights of another dtype
            than hidden; non-integer topk_ids.
        ValueError: shapes that disagree (the message names the array), an expert id
            outside [0, experts) (it names the row and the id), an unknown activation.
    """
    xp = _float_array(hidden, "hidden", 2)
    _float_array(w_gate_up, "w_gate_up", 3)
    _float_array(w_down, "w_down", 3)
    _float_array(topk_weights, "topk_weights", 2)
    for name, w in (("w_gate_up", w_gate_up), ("w_down", w_down)):
        if dtype_name(w) != dtype_name(hidden):
            raise TypeError(
                f"{name} must have hidden's dtype {dtype_name(hidden)}, got {dtype_name(w)}"
            )
    namespace(topk_ids, "topk_ids")
    if dtype_name(topk_ids) not in ("int32", "int64"):
        raise TypeError(f"topk_ids must be int32 or int64, got dtype {dtype_name(topk_ids)}")
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
    if can_read_values(topk_ids) and tokens * k:
        bad = xp.any((topk_ids < 0) | (topk_ids >= experts), axis=1)
        if bool(xp.any(bad)):
            row = int(xp.argmax(xp.astype(bad, xp.int8)))
            wrong = [int(e) for e in topk_ids[row, ...] if not 0 <= int(e) < experts]
            raise ValueError(f"topk_ids row {row} holds expert {wrong[0]}, outside [0, {experts})")
    compute = _compute_dtype(xp, hidden)
    h = xp.astype(hidden, compute)
    if tokens * k == 0:
        return xp.zeros((tokens, hidden_size), dtype=hidden.dtype, device=device(hidden))
    # 1. sort the (token, slot) pairs by expert: pair p is token p // k, slot p % k
    flat_ids = xp.reshape(xp.astype(topk_ids, xp.int64), (-1,))
    order = xp.argsort(flat_ids, stable=True)
    starts = xp.searchsorted(
        xp.take(flat_ids, order), xp.arange(experts + 1, device=device(hidden))
    )
    bounds = [int(b) for b in starts]
    # 2. one matmul per expert over its tokens (rows of `outputs` in sorted order)
    outputs = []
    for e in range(experts):
        pairs = order[bounds[e] : bounds[e + 1]]
        if pairs.shape[0] == 0:
            continue
        x = xp.take(h, pairs // k, axis=0)
        gate_up = x @ xp.matrix_transpose(xp.astype(w_gate_up[e, ...], compute))
        gate, up = gate_up[:, :inter], gate_up[:, inter:]
        act = gate / (1.0 + xp.exp(-gate)) * up
        outputs.append(act @ xp.matrix_transpose(xp.astype(w_down[e, ...], compute)))
    # 3. back to (token, slot) order, weighted, summed over the slots in order
    per_pair = xp.take(xp.concat(outputs, axis=0), xp.argsort(order), axis=0)
    per_pair = xp.reshape(per_pair, (tokens, k, hidden_size))
    weights = xp.astype(topk_weights, compute)
    out = per_pair[:, 0, :] * weights[:, 0:1]
    for j in range(1, k):
        out = out + per_pair[:, j, :] * weights[:, j : j + 1]
    return xp.astype(out, hidden.dtype)
