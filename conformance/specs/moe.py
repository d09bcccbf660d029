"""Properties of `ops.moe` (see `pyagent_ref/ops/moe.py` for the contract).

Routers are drawn over 0-6 tokens and 1-16 experts (float16, float32, float64 logits in
[-8, 8] with exact ties from a small set of values), every k, every divisor of the
experts as num_groups, with and without a correction bias, both scorings and group
scores, renormalised or not, scaling factors 1 and 2.5. `fused_moe` over 0-5 tokens,
1-6 experts, hidden 1-12, inter 1-8, k 0-3 (repeated experts included), weights in
[-2, 2] in float16, float32 or float64.

Choices. `route_topk_softmax` chooses on the logits, so its ids are exact. Grouped
routing chooses on computed scores: its ids must be a valid choice under a float64
oracle within the score tolerance (every chosen group's score at least the kept
groups' bound, every chosen expert's biased score at least every unchosen candidate's,
in descending order), and exactly the oracle's ids whenever the scores of different
inputs are further apart than the tolerance (so ties between equal inputs go to the
lower id).

Tolerances. Router weights: |got - want| <= TOL[compute] * |want| * (4 + spread + log2
experts), spread the row's logit range (softmax error grows with |x - max|); TOL =
4e-7 * 8 for float32, 1e-15 * 8 for float64. fused_moe: |got - want| <= T * M, M the
float64 result with every operand replaced by its magnitude (|w| |W_down| (|g| + G)
(|u| + U), G and U the magnitudes of the gate and up dot products), T = 2e-5 for float32
compute (1e-13 float64); a float16 result may also differ by its rounding (1e-3 |want|).
"""

from __future__ import annotations

import math
from typing import Any

import hypothesis.extra.numpy as hnp
import numpy as np
from hypothesis import strategies as st

import pyagent_ref.ops.moe  # noqa: F401 - binds pyagent_ref.ops.moe for the reference

from .. import checks, contract
from ..core import Case, Ctx, Spec
from ._common import (
    add_does_not_modify_inputs,
    add_matches_reference,
    add_rejects_invalid_input,
    assert_within,
    error_variants,
    reference_shapes,
)

OPS = contract.names("moe")
ROUTER_TOL = {"float32": 8 * 4e-7, "float64": 8 * 1e-15}
MOE_TOL = {"float32": 2e-5, "float64": 1e-13}
LOGIT_DTYPES = (np.float16, np.float32, np.float64)
TIE_VALUES = (-2.0, -1.0, 0.0, 0.5, 1.0, 2.0, 3.0)

spec = Spec("moe", OPS)

SHAPES = reference_shapes("moe")


def compute_name(dtype: Any) -> str:
    return "float64" if np.dtype(dtype) == np.float64 else "float32"


# --- strategies -----------------------------------------------------------------------------


def floats(dtype: Any, bound: float, ties: tuple[float, ...] = TIE_VALUES) -> Any:
    width = {np.float16: 16, np.float32: 32, np.float64: 64}[np.dtype(dtype).type]
    return st.one_of(st.sampled_from(ties), st.floats(-bound, bound, width=width))


@st.composite
def router_logits(draw: Any, experts: int | None = None, tie_heavy: bool = False) -> np.ndarray:
    dtype = draw(st.sampled_from(LOGIT_DTYPES))
    e = experts if experts is not None else draw(st.integers(1, 16))
    tokens = draw(st.integers(0, 6))
    elements = st.sampled_from(TIE_VALUES) if tie_heavy else floats(dtype, 8.0)
    return draw(hnp.arrays(np.dtype(dtype), (tokens, e), elements=elements))


@st.composite
def topk_cases(draw: Any) -> Case:
    logits = draw(router_logits())
    return Case(
        logits=logits,
        k=draw(st.integers(1, logits.shape[1])),
        renormalize=draw(st.booleans()),
    )


@st.composite
def grouped_cases(draw: Any, tie_heavy: bool = False, scoring: str | None = None) -> Case:
    experts = draw(st.integers(1, 16))
    logits = draw(router_logits(experts, tie_heavy))
    num_groups = draw(st.sampled_from([g for g in range(1, experts + 1) if experts % g == 0]))
    topk_groups = draw(st.integers(1, num_groups))
    k = draw(st.integers(1, topk_groups * (experts // num_groups)))
    bias = None
    if draw(st.booleans()):
        ties = (0.0, 0.25, -0.25, 0.5)
        elements = st.sampled_from(ties) if tie_heavy else floats(np.float32, 1.0, ties)
        bias = draw(hnp.arrays(np.float32, (experts,), elements=elements))
    return Case(
        logits=logits,
        k=k,
        num_groups=num_groups,
        topk_groups=topk_groups,
        correction_bias=bias,
        scoring=scoring or draw(st.sampled_from(("sigmoid", "softmax"))),
        routed_scaling_factor=draw(st.sampled_from((1.0, 2.5))),
        renormalize=draw(st.booleans()),
        group_score=draw(st.sampled_from(("top2_sum", "max"))),
    )


@st.composite
def moe_cases(draw: Any, max_k: int = 3) -> Case:
    dtype = np.dtype(draw(st.sampled_from(LOGIT_DTYPES)))
    tokens, hidden = draw(st.integers(0, 5)), draw(st.integers(1, 12))
    experts, inter, k = (
        draw(st.integers(1, 6)),
        draw(st.integers(1, 8)),
        draw(st.integers(0, max_k)),
    )
    el = floats(dtype, 2.0, (0.0, 1.0, -1.0, 0.5))
    weight_dtype = np.dtype(draw(st.sampled_from((np.float32, dtype))))
    return Case(
        hidden=draw(hnp.arrays(dtype, (tokens, hidden), elements=el)),
        w_gate_up=draw(hnp.arrays(dtype, (experts, 2 * inter, hidden), elements=el)),
        w_down=draw(hnp.arrays(dtype, (experts, hidden, inter), elements=el)),
        topk_weights=draw(
            hnp.arrays(weight_dtype, (tokens, k), elements=floats(weight_dtype, 1.0, (0.0, 1.0)))
        ),
        topk_ids=draw(
            hnp.arrays(
                np.dtype(draw(st.sampled_from((np.int32, np.int64)))),
                (tokens, k),
                elements=st.integers(0, experts - 1),
            )
        ),
        activation="silu",
    )


def call(ctx: Ctx, op: str, case: Case) -> Any:
    return ctx.call(op, *SHAPES[op].call_args(case))


# --- oracles --------------------------------------------------------------------------------


def _softmax64(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def _router_tol(case: Case, want: np.ndarray) -> np.ndarray:
    x = case.logits.astype(np.float64)
    spread = (x.max(axis=1, keepdims=True) - x.min(axis=1, keepdims=True)) if x.size else 0
    t = ROUTER_TOL[compute_name(case.logits.dtype)]
    return t * np.abs(want) * (4 + spread + math.log2(x.shape[1] + 1)) + 1e-30


def topk_oracle(case: Case) -> tuple[np.ndarray, np.ndarray]:
    """(weights in float64, ids): stable descending sort of the logits as given."""
    ids = np.argsort(-case.logits, axis=1, kind="stable")[:, : case.k]
    p = _softmax64(case.logits.astype(np.float64))
    w = np.take_along_axis(p, ids, axis=1)
    if case.renormalize:
        w = w / w.sum(axis=1, keepdims=True)
    return w, ids


def grouped_scores(case: Case) -> tuple[np.ndarray, np.ndarray]:
    """(scores, biased scores) in float64."""
    x = case.logits.astype(np.float64)
    s = 1 / (1 + np.exp(-x)) if case.scoring == "sigmoid" else _softmax64(x)
    b = s if case.correction_bias is None else s + case.correction_bias.astype(np.float64)
    return s, b


def group_scores(case: Case, biased: np.ndarray) -> np.ndarray:
    g = biased.reshape(biased.shape[0], case.num_groups, biased.shape[1] // case.num_groups)
    if case.group_score == "max":
        return g.max(axis=2)
    return -np.sort(-g, axis=2)[:, :, :2].sum(axis=2)


def grouped_oracle(case: Case) -> tuple[np.ndarray, np.ndarray]:
    """(weights, ids) in float64 by the contract's steps, ties by the lower index."""
    s, b = grouped_scores(case)
    size = b.shape[1] // case.num_groups
    kept = np.argsort(-group_scores(case, b), axis=1, kind="stable")[:, : case.topk_groups]
    in_kept = (np.arange(b.shape[1])[None, :, None] // size == kept[:, None, :]).any(axis=2)
    ids = np.argsort(-np.where(in_kept, b, -np.inf), axis=1, kind="stable")[:, : case.k]
    w = np.take_along_axis(s, ids, axis=1)
    if case.renormalize:
        w = w / (w.sum(axis=1, keepdims=True) + 1e-20)
    return w * case.routed_scaling_factor, ids.reshape(b.shape[0], case.k)


def moe_oracle(case: Case) -> tuple[np.ndarray, np.ndarray]:
    """(the result in float64, the magnitude M of the tolerance)."""
    h = case.hidden.astype(np.float64)
    wgu, wd = case.w_gate_up.astype(np.float64), case.w_down.astype(np.float64)
    tokens, k = case.topk_ids.shape
    inter = wgu.shape[1] // 2
    out, mag = np.zeros(h.shape), np.zeros(h.shape)
    for t in range(tokens):
        for j in range(k):
            e, w = int(case.topk_ids[t, j]), float(case.topk_weights[t, j])
            gu, gu_mag = wgu[e] @ h[t], np.abs(wgu[e]) @ np.abs(h[t])
            g, u = gu[:inter], gu[inter:]
            act = g / (1 + np.exp(-g)) * u
            out[t] += w * (wd[e] @ act)
            act_mag = (np.abs(g) + gu_mag[:inter] + 1e-30) * (np.abs(u) + gu_mag[inter:] + 1e-30)
            mag[t] += abs(w) * (np.abs(wd[e]) @ act_mag)
    return out, mag


def moe_tol(case: Case, want: np.ndarray, mag: np.ndarray) -> np.ndarray:
    tol = MOE_TOL[compute_name(case.hidden.dtype)] * mag
    if case.hidden.dtype == np.float16:
        tol = tol + 1e-3 * np.abs(want) + 6e-8  # the result's own rounding to float16
    return tol


# ======================================================================== route_topk_softmax


@spec.prop("route_topk_softmax", topk_cases(), name="returns_documented_types")
def topk_returns_documented_types(ctx: Ctx, case: Case) -> None:
    """(float32 weights, float64 for float64 logits; int64 ids), both (tokens, k), in the
    logits' library."""
    logits = ctx.convert(case.logits)
    out = ctx.fn("route_topk_softmax")(logits, case.k, case.renormalize)
    assert isinstance(out, tuple) and len(out) == 2, f"returned {type(out).__name__}"
    for what, got in zip(("topk_weights", "topk_ids"), out, strict=True):
        problem = checks.same_library(got, logits)
        assert problem is None, f"{what} {problem}"
    w, ids = ctx.call("route_topk_softmax", case.logits, case.k, case.renormalize)
    shape = (case.logits.shape[0], case.k)
    checks.assert_shape_dtype(w, shape, compute_name(case.logits.dtype), "topk_weights")
    checks.assert_shape_dtype(ids, shape, np.int64, "topk_ids")


@spec.prop("route_topk_softmax", topk_cases())
def picks_the_largest_logits_lowest_id_first(ctx: Ctx, case: Case) -> None:
    """ids[t] are the k largest logits of row t, largest first, equal logits by the lower
    expert id: exactly a stable descending sort of the logits."""
    _, ids = call(ctx, "route_topk_softmax", case)
    checks.assert_equal(ids, topk_oracle(case)[1], what="topk_ids")


@spec.prop("route_topk_softmax", topk_cases())
def weights_are_the_softmax_probabilities(ctx: Ctx, case: Case) -> None:
    """weights[t, j] = softmax(logits[t])[ids[t, j]], divided by the chosen ones' sum with
    renormalize, within the router tolerance of a float64 oracle."""
    w, _ = call(ctx, "route_topk_softmax", case)
    want, _ = topk_oracle(case)
    assert_within(w, want, _router_tol(case, want), "topk_weights")


@spec.prop("route_topk_softmax", topk_cases())
def renormalized_weights_sum_to_one(ctx: Ctx, case: Case) -> None:
    """With renormalize each row's weights sum to 1; without, to at most 1 (all of them
    when k = experts)."""
    w, _ = call(ctx, "route_topk_softmax", case)
    total = w.astype(np.float64).sum(axis=1)
    t = 16 * ROUTER_TOL[compute_name(case.logits.dtype)]
    if case.renormalize or case.k == case.logits.shape[1]:
        assert_within(total, np.ones_like(total), t, "sum of a row's weights")
    else:
        assert np.all(total <= 1 + t), f"a row's weights sum past 1: {total}"


def topk_errors(case: Case) -> list[tuple[str, tuple[Any, ...], type]]:
    x, k, r = case.logits, case.k, case.renormalize
    nan = x.copy()
    if nan.size:
        nan[0, 0] = np.nan
    errors = [
        ("integer logits", (np.zeros(x.shape, np.int64), k, r), TypeError),
        ("1-D logits", (x.reshape(-1), k, r), ValueError),
        ("no experts", (x[:, :0], 1, r), ValueError),
        ("k = 0", (x, 0, r), ValueError),
        ("k past the experts", (x, x.shape[1] + 1, r), ValueError),
        ("a float k", (x, float(k), r), TypeError),
    ]
    if x.size:
        errors.append(("a NaN logit", (nan, k, r), ValueError))
    return errors


add_does_not_modify_inputs(spec, SHAPES["route_topk_softmax"], topk_cases())
add_rejects_invalid_input(
    spec, SHAPES["route_topk_softmax"], error_variants(topk_cases(), topk_errors)
)


def _topk_compare(case: Case, got: Any, ref: Any) -> None:
    assert got[0].dtype == ref[0].dtype, f"dtype {got[0].dtype}, the reference's {ref[0].dtype}"
    checks.assert_equal(got[1], ref[1], what="topk_ids")
    assert_within(got[0], ref[0], _router_tol(case, ref[0]), "topk_weights")


add_matches_reference(
    spec,
    SHAPES["route_topk_softmax"],
    topk_cases(),
    _topk_compare,
    "The reference's ids exactly, its weights within the router tolerance.",
)


# ======================================================================== route_grouped_topk


def _score_tol(case: Case) -> float:
    return 64 * ROUTER_TOL[compute_name(case.logits.dtype)]


@spec.prop("route_grouped_topk", grouped_cases(), name="returns_documented_types")
def grouped_returns_documented_types(ctx: Ctx, case: Case) -> None:
    """(float32 weights, float64 for float64 logits; int64 ids), both (tokens, k), in the
    logits' library."""
    args = [ctx.convert(a) for a in SHAPES["route_grouped_topk"].call_args(case)]
    out = ctx.fn("route_grouped_topk")(*args)
    assert isinstance(out, tuple) and len(out) == 2, f"returned {type(out).__name__}"
    for what, got in zip(("topk_weights", "topk_ids"), out, strict=True):
        problem = checks.same_library(got, args[0])
        assert problem is None, f"{what} {problem}"
    w, ids = call(ctx, "route_grouped_topk", case)
    shape = (case.logits.shape[0], case.k)
    checks.assert_shape_dtype(w, shape, compute_name(case.logits.dtype), "topk_weights")
    checks.assert_shape_dtype(ids, shape, np.int64, "topk_ids")


@spec.prop("route_grouped_topk", grouped_cases())
def picks_the_best_groups_then_the_best_experts(ctx: Ctx, case: Case) -> None:
    """The ids of a row are distinct, lie in groups whose score is within the tolerance of
    the topk_groups-th best group score, have biased scores at least every other expert of
    the kept groups' (within the tolerance), and come largest biased score first."""
    _, ids = call(ctx, "route_grouped_topk", case)
    _, b = grouped_scores(case)
    gs = group_scores(case, b)
    size = b.shape[1] // case.num_groups
    t = _score_tol(case)
    for row in range(ids.shape[0]):
        chosen = ids[row]
        assert len(set(chosen.tolist())) == case.k, f"row {row}: repeated ids {chosen}"
        bound = np.sort(gs[row])[::-1][case.topk_groups - 1]
        groups = set((chosen // size).tolist())
        assert len(groups) <= case.topk_groups, f"row {row}: ids {chosen} span > topk_groups"
        for g in groups:
            assert gs[row, g] >= bound - t, f"row {row}: group {g} is not among the best"
        # every expert of the groups used is a candidate; the chosen ones are the best
        candidates = np.isin(np.arange(b.shape[1]) // size, list(groups))
        rest = b[row][candidates & ~np.isin(np.arange(b.shape[1]), chosen)]
        if rest.size:
            assert b[row, chosen].min() >= rest.max() - t, (
                f"row {row}: ids {chosen} skip a better expert of their groups"
            )
        assert np.all(np.diff(b[row, chosen]) <= t), f"row {row}: ids {chosen} out of order"


def _separated(values: np.ndarray, keys: list[Any], tol: float) -> bool:
    """Whether values with different keys (the inputs they come from) differ by > tol."""
    order = np.argsort(values, kind="stable")
    v = values[order]
    k = [keys[i] for i in order]
    return all(k[i] == k[i + 1] or v[i + 1] - v[i] > tol for i in range(len(v) - 1))


@spec.prop("route_grouped_topk", grouped_cases(tie_heavy=True))
def exact_choice_when_scores_are_apart(ctx: Ctx, case: Case) -> None:
    """Where the scores of different inputs are more than the tolerance apart, the ids are
    exactly the oracle's: equal inputs tie exactly, and ties go to the lower group index
    and the lower expert id."""
    _, ids = call(ctx, "route_grouped_topk", case)
    _, b = grouped_scores(case)
    want_ids = grouped_oracle(case)[1]
    size = b.shape[1] // case.num_groups
    bias = case.correction_bias if case.correction_bias is not None else np.zeros(b.shape[1])
    t = _score_tol(case)
    gs = group_scores(case, b)
    for row in range(ids.shape[0]):
        # equal (logit, bias) inputs give equal scores in any implementation
        inputs = [(float(x), float(c)) for x, c in zip(case.logits[row], bias, strict=True)]
        group_keys = [
            tuple(sorted(inputs[g * size : (g + 1) * size])) for g in range(case.num_groups)
        ]
        if not (_separated(b[row], inputs, t) and _separated(gs[row], group_keys, t)):
            continue
        checks.assert_equal(ids[row], want_ids[row], what=f"topk_ids row {row}")


@st.composite
def two_strong_against_one_best(draw: Any) -> Case:
    """Sigmoid scores of groups of size 2-4 where one group has the single best expert
    and another group two nearly as good ones (its top-2 sum is larger)."""
    size, groups = draw(st.integers(2, 4)), draw(st.integers(2, 4))
    a, d = draw(st.floats(-2, 2)), draw(st.floats(0.01, 0.5))
    logits = np.full((1, size * groups), -8.0, np.float32)
    strong, best = draw(st.permutations(range(groups)).map(lambda p: p[:2]))
    logits[0, strong * size : strong * size + 2] = a
    logits[0, best * size] = a + d
    return Case(logits=logits, strong=strong, best=best, size=size, groups=groups)


@spec.prop("route_grouped_topk", two_strong_against_one_best())
def top2_sum_prefers_two_strong_experts(ctx: Ctx, case: Case) -> None:
    """With group_score "top2_sum" a group with two strong experts beats a group with the
    single best expert; with "max" the best expert's group wins."""
    for group_score, group in (("top2_sum", case.strong), ("max", case.best)):
        _, ids = ctx.call(
            "route_grouped_topk",
            case.logits,
            1,
            case.groups,
            1,
            None,
            "sigmoid",
            1.0,
            True,
            group_score,
        )
        assert int(ids[0, 0]) // case.size == group, (
            f"{group_score}: chose expert {int(ids[0, 0])}, expected one of group {group}"
        )


@spec.prop("route_grouped_topk", grouped_cases())
def weights_are_unbiased_scores(ctx: Ctx, case: Case) -> None:
    """weights = the chosen experts' unbiased scores, renormalised (sum + 1e-20) if asked,
    times routed_scaling_factor, within the router tolerance."""
    w, ids = call(ctx, "route_grouped_topk", case)
    s, _ = grouped_scores(case)
    want = np.take_along_axis(s, ids.astype(np.int64), axis=1)
    if case.renormalize:
        want = want / (want.sum(axis=1, keepdims=True) + 1e-20)
    want = want * case.routed_scaling_factor
    assert_within(w, want, _router_tol(case, want), "topk_weights")


def grouped_errors(case: Case) -> list[tuple[str, tuple[Any, ...], type]]:
    shape = SHAPES["route_grouped_topk"]

    def variant(**changes: Any) -> tuple[Any, ...]:
        return tuple(changes.get(a, getattr(case, a)) for a in shape.args)

    experts = case.logits.shape[1]
    size = experts // case.num_groups
    return [
        ("integer logits", variant(logits=np.zeros(case.logits.shape, np.int32)), TypeError),
        ("k past the kept groups", variant(k=case.topk_groups * size + 1), ValueError),
        ("num_groups not dividing", variant(num_groups=experts + 1), ValueError),
        ("topk_groups = 0", variant(topk_groups=0), ValueError),
        ("topk_groups past num_groups", variant(topk_groups=case.num_groups + 1), ValueError),
        ("a float num_groups", variant(num_groups=float(case.num_groups)), TypeError),
        ("bias one longer", variant(correction_bias=np.zeros(experts + 1, np.float32)), ValueError),
        ("integer bias", variant(correction_bias=np.zeros(experts, np.int64)), TypeError),
        ("a NaN bias", variant(correction_bias=np.full(experts, np.nan, np.float32)), ValueError),
        ("scoring 'tanh'", variant(scoring="tanh"), ValueError),
        ("group_score 'mean'", variant(group_score="mean"), ValueError),
        ("an infinite scaling factor", variant(routed_scaling_factor=float("inf")), ValueError),
    ]


add_does_not_modify_inputs(spec, SHAPES["route_grouped_topk"], grouped_cases())
add_rejects_invalid_input(
    spec, SHAPES["route_grouped_topk"], error_variants(grouped_cases(), grouped_errors)
)


def _grouped_compare(case: Case, got: Any, ref: Any) -> None:
    assert got[0].dtype == ref[0].dtype, f"dtype {got[0].dtype}, the reference's {ref[0].dtype}"
    checks.assert_shape_dtype(got[1], ref[1].shape, ref[1].dtype, "topk_ids")
    # ids may differ only at near-ties (checked by the other properties); weights of
    # the ids an implementation chose are compared with the oracle's there
    same = np.all(got[1] == ref[1], axis=1)
    assert_within(got[0][same], ref[0][same], _router_tol(case, ref[0])[same], "topk_weights")


add_matches_reference(
    spec,
    SHAPES["route_grouped_topk"],
    grouped_cases(),
    _grouped_compare,
    "The reference's weights within the router tolerance on the rows where the ids agree.",
)


# ================================================================================= fused_moe


@spec.prop("fused_moe", moe_cases(), name="returns_documented_types")
def moe_returns_documented_types(ctx: Ctx, case: Case) -> None:
    """A new (tokens, hidden_size) array in hidden's library and dtype."""
    hidden = ctx.convert(case.hidden)
    args = [hidden, *(ctx.convert(a) for a in SHAPES["fused_moe"].call_args(case)[1:])]
    out = ctx.fn("fused_moe")(*args)
    problem = checks.same_library(out, hidden)
    assert problem is None, problem
    got = call(ctx, "fused_moe", case)
    checks.assert_shape_dtype(got, case.hidden.shape, case.hidden.dtype)


@spec.prop("fused_moe", moe_cases())
def matches_the_formula(ctx: Ctx, case: Case) -> None:
    """out[t] = sum_j w[t, j] * w_down[e] @ (silu(gate) * up), e = ids[t, j], gate and
    up the halves of w_gate_up[e] @ hidden[t], within T * M of a float64 oracle."""
    got = call(ctx, "fused_moe", case)
    want, mag = moe_oracle(case)
    assert_within(got, want, moe_tol(case, want, mag), "fused_moe")


@spec.prop("fused_moe", moe_cases())
def experts_nobody_uses_are_not_read(ctx: Ctx, case: Case) -> None:
    """Experts no token is routed to do not enter the result: NaN weights there change
    nothing."""
    used = set(case.topk_ids.reshape(-1).tolist())
    unused = [e for e in range(case.w_gate_up.shape[0]) if e not in used]
    if not unused:
        return
    want = call(ctx, "fused_moe", case)
    wgu, wd = case.w_gate_up.copy(), case.w_down.copy()
    wgu[unused], wd[unused] = np.nan, np.nan
    got = ctx.call("fused_moe", case.hidden, wgu, wd, case.topk_weights, case.topk_ids)
    assert not np.isnan(got).any(), "an unused expert's NaN reached the result"
    _, mag = moe_oracle(case)
    assert_within(got, want, moe_tol(case, want, mag), "fused_moe with NaN in unused experts")


@spec.prop("fused_moe", moe_cases(max_k=3))
def slots_add_up(ctx: Ctx, case: Case) -> None:
    """The result is the sum of the one-slot results: a token's slots are independent and
    each is weighted by its own weight."""
    k = case.topk_ids.shape[1]
    if k < 2:
        return
    whole = call(ctx, "fused_moe", case)
    parts = sum(
        ctx.call(
            "fused_moe",
            case.hidden,
            case.w_gate_up,
            case.w_down,
            case.topk_weights[:, j : j + 1].copy(),
            case.topk_ids[:, j : j + 1].copy(),
        ).astype(np.float64)
        for j in range(k)
    )
    want, mag = moe_oracle(case)
    tol = 2 * moe_tol(case, want, mag)
    assert_within(whole, parts, tol, "fused_moe against the sum of its slots")


def moe_errors(case: Case) -> list[tuple[str, tuple[Any, ...], type]]:
    h, wgu, wd, w, ids = case.hidden, case.w_gate_up, case.w_down, case.topk_weights, case.topk_ids
    other = np.float32 if h.dtype != np.float32 else np.float64
    errors = [
        ("integer hidden", (np.zeros(h.shape, np.int64), wgu, wd, w, ids), TypeError),
        ("w_gate_up of another dtype", (h, wgu.astype(other), wd, w, ids), TypeError),
        ("float topk_ids", (h, wgu, wd, w, ids.astype(np.float32)), TypeError),
        ("an odd gate/up axis", (h, wgu[:, 1:], wd, w, ids), ValueError),
        ("w_down of another inter", (h, wgu, wd[:, :, :0], w, ids), ValueError),
        ("1-D hidden", (h.reshape(-1), wgu, wd, w, ids), ValueError),
        ("activation 'gelu'", (h, wgu, wd, w, ids, "gelu"), ValueError),
    ]
    if ids.size:
        bad = ids.copy()
        bad[-1, -1] = wgu.shape[0]
        errors.append(("an expert id past the experts", (h, wgu, wd, w, bad), ValueError))
        errors.append(("topk_weights of another k", (h, wgu, wd, w[:, 1:], ids), ValueError))
    return errors


add_does_not_modify_inputs(spec, SHAPES["fused_moe"], moe_cases())
add_rejects_invalid_input(spec, SHAPES["fused_moe"], error_variants(moe_cases(), moe_errors))


def _moe_compare(case: Case, got: Any, ref: Any) -> None:
    assert got.dtype == ref.dtype, f"dtype {got.dtype}, the reference's {ref.dtype}"
    want, mag = moe_oracle(case)
    assert_within(got, ref, 2 * moe_tol(case, want, mag), "fused_moe")


add_matches_reference(
    spec,
    SHAPES["fused_moe"],
    moe_cases(),
    _moe_compare,
    "The reference's result within 2 T * M.",
)
