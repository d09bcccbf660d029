"""Properties of `ops.sampling` (see `pyagent_ref/ops/sampling.py` for the contract).

For each op: input strategies, invariants, a differential check against the reference,
the error cases, "does not modify its inputs" and "returns an array like its input".
`sample` and `philox_uniform` also get known-answer and goodness-of-fit tests.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from hypothesis import strategies as st

from .. import checks, contract, oracles
from ..core import Case, Ctx, Spec
from ._common import (
    FLOAT_DTYPES,
    NEG_INF,
    ErrorCase,
    ErrorCases,
    add_accepts_strided_input,
    add_does_not_modify_inputs,
    add_matches_reference,
    add_rejects_invalid_input,
    batches,
    check_like_input,
    error_variants,
    hnp,
    logits_arrays,
    logits_errors,
    reference_shapes,
    row_magnitude,
    row_values,
    token_id_arrays,
)

OPS = contract.names("sampling")

spec = Spec("sampling", OPS)

#: Factors that put a threshold on a boundary quantity or 1e-8 relative beside it.
NEAR = (1.0, 1.0 + 1e-8, 1.0 - 1e-8)

SHAPES = reference_shapes("sampling")


def call(ctx: Ctx, op: str, case: Case) -> Any:
    """The implementation's result for `case`, as numpy."""
    return ctx.call(op, *SHAPES[op].call_args(case))


def finite_max(row: np.ndarray) -> float:
    return float(np.max(row[np.isfinite(row)]))


def add_common(
    op: str,
    cases: Any,
    errors: Any,
    compare: Any,
    compare_doc: str,
    typical: Any = None,
    boundary: Any = None,
) -> None:
    """The generic properties of a logits op. The differential check draws from `cases`
    (every edge value); the structural ones (inputs untouched, result like the input) from
    `typical` (default `cases`), so that an edge value some implementation rejects does not
    hide whether it gets the structure right: the edge values have their own properties."""
    shape = SHAPES[op]
    typical = cases if typical is None else typical
    add_does_not_modify_inputs(spec, shape, typical)
    add_rejects_invalid_input(spec, shape, errors)
    add_matches_reference(spec, shape, cases, compare, compare_doc)
    add_returns_like_logits(op, typical)
    rule = {
        "apply_top_p": "top_p_rule",
        "apply_min_p": "min_p_rule",
        "apply_typical_p": "typical_rule",
        "apply_epsilon_cutoff": "epsilon_rule",
        "apply_eta_cutoff": "eta_rule",
        "apply_mirostat": "mirostat_rule",
    }.get(op)
    if boundary is None and rule is not None:
        boundary = _boundary(rule)
    add_accepts_strided_input(spec, shape, typical, boundary)


def _boundary(rule: str) -> Any:
    """The (batch, vocab) band mask of `rule` (top_p_rule, min_p_rule, ...) for (logits, p)."""

    def boundary(args: tuple[Any, ...]) -> np.ndarray:
        fn = globals()[rule]
        return np.array([fn(row, float(v))[1] for row, v in zip(args[0], args[1], strict=True)])

    return boundary


def add_returns_like_logits(op: str, cases: Any) -> None:
    def returns_array_like_input(ctx: Ctx, case: Case) -> None:
        """The result is a new array of the logits' library, device, dtype and shape."""
        args = [ctx.convert(a) for a in SHAPES[op].call_args(case)]
        out = ctx.fn(op)(*args)
        check_like_input(out, args[0])
        assert out is not args[0], "returned the input object itself, not a new array"

    spec.add(op, returns_array_like_input, cases)


# =========================================================================== apply_temperature


@st.composite
def temperature_cases(draw: Any, greedy: bool = True) -> Case:
    """greedy=False: every temperature > 0 (no greedy row)."""
    x = draw(logits_arrays())
    values = st.one_of(st.sampled_from((1.0, 0.5, 2.0, 1e-3, 100.0)), st.floats(0.05, 5.0))
    if greedy:
        values = st.one_of(st.just(0.0), values)
    if draw(st.booleans()):
        t = draw(row_values(x.shape[0], st.integers(0 if greedy else 1, 3), (np.int64,)))
    else:
        t = draw(row_values(x.shape[0], values, FLOAT_DTYPES))
    return Case(logits=x, temperature=t)


def divided(case: Case) -> np.ndarray:
    """logits / temperature in the logits' dtype, rows with temperature 0 left alone."""
    t = case.temperature.astype(case.logits.dtype)
    t = np.where(t == 0, np.ones_like(t), t)
    return case.logits / t[:, None]


@spec.prop("apply_temperature", temperature_cases(greedy=False))
def divides_by_temperature(ctx: Ctx, case: Case) -> None:
    """Rows with temperature > 0 become logits / temperature (float tolerance), -inf stays -inf."""
    out = call(ctx, "apply_temperature", case)
    checks.assert_close(out, divided(case), case.logits.dtype)


@spec.prop("apply_temperature", temperature_cases())
def zero_temperature_rows_unchanged(ctx: Ctx, case: Case) -> None:
    """A row with temperature 0 (greedy) is returned exactly unchanged."""
    out = call(ctx, "apply_temperature", case)
    cold = case.temperature == 0
    checks.assert_equal(out[cold], case.logits[cold], what="greedy row")


@spec.prop("apply_temperature", temperature_cases(greedy=False))
def preserves_token_order(ctx: Ctx, case: Case) -> None:
    """Dividing by a positive number never swaps two tokens: x[i] < x[j] implies out[i] <=
    out[j]."""
    out = call(ctx, "apply_temperature", case)
    for b in range(out.shape[0]):
        order = np.argsort(case.logits[b], kind="stable")
        steps = np.diff(out[b][order])
        assert not np.any(steps < 0), f"row {b}: order of tokens changed"


def _temperature_compare(case: Case, got: np.ndarray, ref: np.ndarray) -> None:
    checks.assert_close(got, ref, case.logits.dtype)


add_common(
    "apply_temperature",
    temperature_cases(),
    logits_errors(
        temperature_cases(),
        SHAPES["apply_temperature"],
        {
            "temperature": [
                ("a negative temperature", -0.5, ValueError),
                ("a NaN temperature", math.nan, ValueError),
                ("an infinite temperature", math.inf, ValueError),
                ("a boolean temperature", lambda c: np.ones(c.logits.shape[0], bool), TypeError),
            ]
        },
    ),
    _temperature_compare,
    "Same -inf entries as the reference, finite values within the float tolerance.",
    typical=temperature_cases(greedy=False),
)


# ================================================================================= apply_top_k


@st.composite
def top_k_cases(draw: Any, ks: str = "any") -> Case:
    """ks: 'any' k in [-2, vocab + 2]; 'positive' k >= 1; 'disabled' k <= 0 or k >= vocab."""
    x = draw(logits_arrays())
    v = x.shape[1]
    values = {
        "any": st.integers(-2, v + 2),
        "positive": st.integers(1, v + 2),
        "disabled": st.one_of(st.integers(-2, 0), st.integers(v, v + 2)),
    }[ks]
    k = draw(row_values(x.shape[0], values, (np.int64, np.int32)))
    return Case(logits=x, k=k)


def effective_k(k: int, vocab: int) -> int:
    return vocab if k <= 0 or k >= vocab else k


@spec.prop("apply_top_k", top_k_cases("positive"))
def keeps_exactly_the_tokens_at_or_above_kth(ctx: Ctx, case: Case) -> None:
    """A token is kept iff its logit is >= the k-th largest logit of its row (ties at the k-th all
    kept)."""
    out = call(ctx, "apply_top_k", case)
    for b, row in enumerate(case.logits):
        kth = np.sort(row)[::-1][effective_k(int(case.k[b]), row.size) - 1]
        keep = row >= kth
        wrong = np.isneginf(out[b]) != (~keep | np.isneginf(row))
        assert not wrong.any(), (
            f"row {b} token {int(np.argmax(wrong))}: logit {row[np.argmax(wrong)]!r}, "
            f"k-th largest {kth!r}, got "
            f"{'masked' if np.isneginf(out[b][np.argmax(wrong)]) else 'kept'}"
        )


@spec.prop("apply_top_k", top_k_cases("positive"))
def keeps_at_least_k_finite_tokens(ctx: Ctx, case: Case) -> None:
    """Each row keeps at least min(k, number of finite logits) finite tokens (k disabled =
    vocab)."""
    out = call(ctx, "apply_top_k", case)
    for b, row in enumerate(case.logits):
        want = min(effective_k(int(case.k[b]), row.size), int(np.isfinite(row).sum()))
        got = int(np.isfinite(out[b]).sum())
        assert got >= want, f"row {b}: kept {got} finite tokens, k={int(case.k[b])} needs {want}"


@spec.prop("apply_top_k", top_k_cases("disabled"))
def disabled_when_k_out_of_range(ctx: Ctx, case: Case) -> None:
    """Rows with k <= 0 or k >= vocab are returned unchanged."""
    out = call(ctx, "apply_top_k", case)
    off = (case.k <= 0) | (case.k >= case.logits.shape[1])
    checks.assert_equal(out[off], case.logits[off], what="row with top-k disabled")


@spec.prop("apply_top_k", top_k_cases("positive"), name="only_masks")
def top_k_only_masks(ctx: Ctx, case: Case) -> None:
    """Every entry is either the input logit, unchanged, or -inf."""
    checks.assert_only_masks(call(ctx, "apply_top_k", case), case.logits)


def _exact_compare(case: Case, got: Any, ref: Any) -> None:
    checks.assert_equal(got, ref)


add_common(
    "apply_top_k",
    top_k_cases(),
    logits_errors(
        top_k_cases(),
        SHAPES["apply_top_k"],
        {"k": [("a float k", lambda c: c.k.astype(np.float64), TypeError)]},
    ),
    _exact_compare,
    "Exactly the reference's result (no arithmetic is involved).",
    typical=top_k_cases("positive"),
)


# ================================================================================= apply_top_p


@st.composite
def top_p_cases(draw: Any) -> Case:
    x = draw(logits_arrays())
    b = x.shape[0]
    plain = st.one_of(
        st.sampled_from((1.0, 0.5, 0.9, 0.999, 1e-6)),
        st.floats(1e-6, 1.0, exclude_min=False),
    )
    p = draw(row_values(b, plain, FLOAT_DTYPES))
    # Sometimes put p on a cumulative mass (where the tie rule decides) or 1e-8 relative
    # beside it (outside the 1e-9 band: only float64 arithmetic decides these right).
    for row in range(b):
        if draw(st.booleans()):
            ordered = np.sort(oracles.probs64(x[row]))[::-1]
            j = draw(st.integers(0, x.shape[1] - 1))
            mass = float(np.cumsum(ordered)[j]) * draw(st.sampled_from(NEAR))
            if 0 < mass <= 1:
                p = p.astype(np.float64)
                p[row] = mass
    return Case(logits=x, p=p)


def top_p_rule(row: np.ndarray, p: float) -> tuple[np.ndarray, np.ndarray]:
    """(keep, uncertain) per token of one row, by the docstring's rule.

    keep[i]  <=>  S(i) < p, where S(i) is the mass of the tokens more likely than i
    (tokens tied with i excluded); the spec's "m-th largest probability" threshold
    amounts to exactly this. uncertain[i] when S(i) is within BAND (relative) of p; -inf
    tokens are masked either way. S(i) is bracketed by [lo, hi]: lo counts only tokens
    clearly more likely (ratio > 1 + 1e-12), hi also near-ties whose float64 probability
    could round either way, so an implementation's own rounding cannot be blamed on it.
    """
    probs = oracles.probs64(row)
    e = np.exp(row.astype(np.float64) - finite_max(row))
    keep = np.ones(row.size, bool)
    uncertain = np.isneginf(row)
    if p == 1:
        return keep, uncertain
    for i in np.flatnonzero(np.isfinite(row)):
        lo = math.fsum(probs[e > e[i] * (1 + 1e-12)].tolist())
        hi = math.fsum(probs[(e > e[i] * (1 - 1e-12)) & (row != row[i])].tolist())
        keep[i] = lo < p
        surely_kept = hi < p * (1 - checks.BAND)
        surely_masked = lo >= p * (1 + checks.BAND)
        uncertain[i] |= not (surely_kept or surely_masked)
    return keep, uncertain


@spec.prop("apply_top_p", top_p_cases())
def keeps_most_likely_token(ctx: Ctx, case: Case) -> None:
    """Every token tied for the row's largest logit is kept."""
    out = call(ctx, "apply_top_p", case)
    for b, row in enumerate(case.logits):
        top = row == finite_max(row)
        assert not np.isneginf(out[b][top]).any(), f"row {b}: a most likely token was masked"


@spec.prop("apply_top_p", top_p_cases())
def kept_set_is_upper_set(ctx: Ctx, case: Case) -> None:
    """No masked token is more likely than a kept one (the kept set is a top set)."""
    out = call(ctx, "apply_top_p", case)
    for b, row in enumerate(case.logits):
        kept = np.isfinite(out[b])
        dropped = np.isfinite(row) & ~kept
        if kept.any() and dropped.any():
            lo, hi = row[kept].min(), row[dropped].max()
            assert lo >= hi, f"row {b}: masked a token with logit {hi!r} but kept one with {lo!r}"


@spec.prop("apply_top_p", top_p_cases())
def keeps_tied_tokens_together(ctx: Ctx, case: Case) -> None:
    """Tokens with equal logits get the same decision (ties at the boundary are all kept)."""
    out = call(ctx, "apply_top_p", case)
    for b, row in enumerate(case.logits):
        for value in np.unique(row[np.isfinite(row)]):
            group = np.isfinite(out[b][row == value])
            assert group.all() or not group.any(), (
                f"row {b}: tokens tied at logit {value!r} split "
                f"({int(group.sum())} of {group.size} kept)"
            )


@spec.prop("apply_top_p", top_p_cases())
def kept_mass_reaches_p(ctx: Ctx, case: Case) -> None:
    """The kept tokens' probability mass (float64 softmax) is >= p (within the 1e-9 band)."""
    out = call(ctx, "apply_top_p", case)
    for b, row in enumerate(case.logits):
        mass = math.fsum(oracles.probs64(row)[np.isfinite(out[b])].tolist())
        p = float(case.p[b])
        assert mass >= p * (1 - checks.BAND), f"row {b}: kept mass {mass!r} < p = {p!r}"


@spec.prop("apply_top_p", top_p_cases())
def kept_set_is_minimal(ctx: Ctx, case: Case) -> None:
    """Dropping the least likely kept tokens (with their ties) would leave a mass below p."""
    out = call(ctx, "apply_top_p", case)
    for b, row in enumerate(case.logits):
        p = float(case.p[b])
        kept = np.isfinite(out[b])
        if p == 1 or not kept.any():
            continue
        least = row[kept].min()
        # Tokens whose float64 probability clearly exceeds the least kept one's (logits a
        # hair apart can have equal probabilities, which the spec treats as a tie).
        e = np.exp(row.astype(np.float64) - finite_max(row))
        e_least = math.exp(float(least) - finite_max(row))
        above = math.fsum(oracles.probs64(row)[e > e_least * (1 + 1e-12)].tolist())
        assert above < p * (1 + checks.BAND), (
            f"row {b}: the tokens above logit {least!r} already have mass {above!r} >= p = {p!r}"
        )


@spec.prop("apply_top_p", top_p_cases())
def p_one_keeps_every_token(ctx: Ctx, case: Case) -> None:
    """Rows with p == 1 are returned unchanged."""
    out = call(ctx, "apply_top_p", case)
    one = case.p == 1
    checks.assert_equal(out[one], case.logits[one], what="row with p == 1")


@spec.prop("apply_top_p", top_p_cases(), name="only_masks")
def top_p_only_masks(ctx: Ctx, case: Case) -> None:
    """Every entry is either the input logit, unchanged, or -inf."""
    checks.assert_only_masks(call(ctx, "apply_top_p", case), case.logits)


def _top_p_compare(case: Case, got: np.ndarray, ref: np.ndarray) -> None:
    allowed = np.zeros(got.shape, bool)
    for b, row in enumerate(case.logits):
        allowed[b] = top_p_rule(row, float(case.p[b]))[1]
    checks.assert_masks_equal(got, ref, allowed, what="top-p decision")
    checks.assert_only_masks(got, case.logits)


add_common(
    "apply_top_p",
    top_p_cases(),
    logits_errors(
        top_p_cases(),
        SHAPES["apply_top_p"],
        {
            "p": [
                ("p == 0", 0.0, ValueError),
                ("p > 1", 1.5, ValueError),
                ("a negative p", -0.1, ValueError),
                ("a NaN p", math.nan, ValueError),
            ]
        },
    ),
    _top_p_compare,
    "Same mask as the reference except tokens whose cumulative mass is within 1e-9 of p; "
    "kept values exact.",
)


@st.composite
def top_p_near_cases(draw: Any) -> Case:
    """Every row's p 1e-8 (relative) beside the mass above one of its tokens."""
    x = draw(logits_arrays())
    p = np.ones(x.shape[0])  # rows without a token below the max: disabled
    for b, row in enumerate(x):
        below_max = np.flatnonzero(np.isfinite(row) & (row < finite_max(row)))
        if below_max.size:
            i = draw(st.sampled_from(below_max.tolist()))
            above = math.fsum(oracles.probs64(row)[row > row[i]].tolist())
            p[b] = min(1.0, above * draw(st.sampled_from(NEAR[1:])))
    return Case(logits=x, p=p)


def _check_top_p_rule(ctx: Ctx, case: Case) -> None:
    out = call(ctx, "apply_top_p", case)
    for b, row in enumerate(case.logits):
        keep, uncertain = top_p_rule(row, float(case.p[b]))
        wrong = (np.isfinite(out[b]) != keep) & ~uncertain
        assert not wrong.any(), (
            f"row {b} token {int(np.argmax(wrong))}: "
            f"expected {'kept' if keep[np.argmax(wrong)] else 'masked'}"
        )


@spec.prop("apply_top_p", top_p_cases())
def follows_cumulative_mass_rule(ctx: Ctx, case: Case) -> None:
    """Token i is kept iff the mass of the tokens more likely than i is < p (outside the 1e-9
    band)."""
    _check_top_p_rule(ctx, case)


@spec.prop("apply_top_p", top_p_near_cases())
def decides_near_p_in_float64(ctx: Ctx, case: Case) -> None:
    """With p 1e-8 (relative) beside a cumulative mass, tokens are decided as exact float64 sums
    decide."""
    _check_top_p_rule(ctx, case)


# ================================================================================= apply_min_p


@st.composite
def min_p_cases(draw: Any) -> Case:
    x = draw(logits_arrays())
    plain = st.one_of(st.sampled_from((0.0, 1.0, 0.1, 0.5)), st.floats(0.0, 1.0))
    m = draw(row_values(x.shape[0], plain, FLOAT_DTYPES))
    for row in range(x.shape[0]):
        if draw(st.booleans()):  # min_p on a token's ratio, or 1e-8 relative beside it
            j = draw(st.integers(0, x.shape[1] - 1))
            ratio = math.exp(float(x[row, j]) - finite_max(x[row])) * draw(st.sampled_from(NEAR))
            if np.isfinite(x[row, j]) and ratio <= 1:
                m = m.astype(np.float64)
                m[row] = ratio
    return Case(logits=x, min_p=m)


def min_p_rule(row: np.ndarray, min_p: float) -> tuple[np.ndarray, np.ndarray]:
    """(masked, uncertain): masked iff exp(x - max) < min_p; uncertain within the band."""
    ratio = np.exp(row.astype(np.float64) - finite_max(row))
    return ratio < min_p, (np.abs(ratio - min_p) <= checks.BAND * min_p) | np.isneginf(row)


@spec.prop("apply_min_p", min_p_cases())
def never_masks_most_likely_token(ctx: Ctx, case: Case) -> None:
    """Tokens tied for the row's largest logit are never masked."""
    out = call(ctx, "apply_min_p", case)
    for b, row in enumerate(case.logits):
        assert not np.isneginf(out[b][row == finite_max(row)]).any(), f"row {b}: masked the argmax"


@st.composite
def min_p_near_cases(draw: Any) -> Case:
    """Every row's min_p 1e-8 (relative) beside one of its tokens' ratios."""
    x = draw(logits_arrays())
    m = np.zeros(x.shape[0])  # rows without a token below the max: disabled
    for b, row in enumerate(x):
        below_max = np.flatnonzero(np.isfinite(row) & (row < finite_max(row)))
        if below_max.size:
            j = draw(st.sampled_from(below_max.tolist()))
            ratio = math.exp(float(row[j]) - finite_max(row))
            m[b] = min(1.0, ratio * draw(st.sampled_from(NEAR[1:])))
    return Case(logits=x, min_p=m)


def _check_min_p_rule(ctx: Ctx, case: Case) -> None:
    out = call(ctx, "apply_min_p", case)
    for b, row in enumerate(case.logits):
        mask, uncertain = min_p_rule(row, float(case.min_p[b]))
        wrong = (np.isneginf(out[b]) != mask) & ~uncertain
        assert not wrong.any(), (
            f"row {b} token {int(np.argmax(wrong))}: ratio "
            f"{math.exp(float(row[np.argmax(wrong)]) - finite_max(row))!r} "
            f"vs min_p {float(case.min_p[b])!r}, "
            f"expected {'masked' if mask[np.argmax(wrong)] else 'kept'}"
        )


@spec.prop("apply_min_p", min_p_cases())
def masks_exactly_below_threshold(ctx: Ctx, case: Case) -> None:
    """A token is masked iff exp(logit - max) < min_p (float64; 1e-9 band at the threshold)."""
    _check_min_p_rule(ctx, case)


@spec.prop("apply_min_p", min_p_near_cases())
def decides_near_threshold_in_float64(ctx: Ctx, case: Case) -> None:
    """With min_p 1e-8 (relative) beside a token's ratio, it is decided as float64 arithmetic
    decides."""
    _check_min_p_rule(ctx, case)


@spec.prop("apply_min_p", min_p_cases())
def min_p_zero_changes_nothing(ctx: Ctx, case: Case) -> None:
    """Rows with min_p == 0 are returned unchanged."""
    out = call(ctx, "apply_min_p", case)
    off = case.min_p == 0
    checks.assert_equal(out[off], case.logits[off], what="row with min_p == 0")


@spec.prop("apply_min_p", min_p_cases())
def min_p_one_keeps_only_the_max(ctx: Ctx, case: Case) -> None:
    """With min_p == 1 the tokens tied for the max survive and clearly smaller ones are masked."""
    out = call(ctx, "apply_min_p", case)
    for b in np.flatnonzero(case.min_p == 1):
        row = case.logits[b]
        ratio = np.exp(row.astype(np.float64) - finite_max(row))
        assert np.isfinite(out[b][row == finite_max(row)]).all(), f"row {b}: masked a max token"
        small = ratio < 1 - checks.BAND
        assert np.isneginf(out[b][small]).all(), f"row {b}: kept a token below the max"


@spec.prop("apply_min_p", min_p_cases(), name="only_masks")
def min_p_only_masks(ctx: Ctx, case: Case) -> None:
    """Every entry is either the input logit, unchanged, or -inf."""
    checks.assert_only_masks(call(ctx, "apply_min_p", case), case.logits)


def _min_p_compare(case: Case, got: np.ndarray, ref: np.ndarray) -> None:
    allowed = np.zeros(got.shape, bool)
    for b, row in enumerate(case.logits):
        allowed[b] = min_p_rule(row, float(case.min_p[b]))[1]
    checks.assert_masks_equal(got, ref, allowed, what="min-p decision")
    checks.assert_only_masks(got, case.logits)


add_common(
    "apply_min_p",
    min_p_cases(),
    logits_errors(
        min_p_cases(),
        SHAPES["apply_min_p"],
        {
            "min_p": [
                ("a negative min_p", -0.1, ValueError),
                ("min_p > 1", 1.5, ValueError),
                ("a NaN min_p", math.nan, ValueError),
            ]
        },
    ),
    _min_p_compare,
    "Same mask as the reference except tokens whose ratio is within 1e-9 of min_p; "
    "kept values exact.",
)


# ============================================================================= apply_penalties


@st.composite
def penalty_cases(draw: Any, kind: str = "all") -> Case:
    """kind: 'all', 'repetition' (f = q = 0), 'additive' (r = 1) or 'disabled'."""
    x = draw(logits_arrays())
    b, v = x.shape
    dt = draw(st.sampled_from(FLOAT_DTYPES))
    r = st.one_of(st.sampled_from((1.0, 1.2, 0.8, 2.0)), st.floats(0.1, 3.0))
    fq = st.one_of(st.sampled_from((0.0, 0.5, -0.5, 1.0)), st.floats(-2.0, 2.0))
    ones, zeros = np.ones(b, dt), np.zeros(b, dt)
    return Case(
        logits=x,
        prompt_ids=draw(token_id_arrays(b, v)),
        output_ids=draw(token_id_arrays(b, v)),
        repetition_penalty=ones
        if kind in ("additive", "disabled")
        else draw(row_values(b, r, (dt,))),
        frequency_penalty=zeros
        if kind in ("repetition", "disabled")
        else draw(row_values(b, fq, (dt,))),
        presence_penalty=zeros
        if kind in ("repetition", "disabled")
        else draw(row_values(b, fq, (dt,))),
    )


def counts_and_seen(case: Case) -> tuple[np.ndarray, np.ndarray]:
    """(c, seen) per (row, token), counted independently of the reference."""
    b, v = case.logits.shape
    counts = np.zeros((b, v), np.int64)
    seen = np.zeros((b, v), bool)
    for row in range(b):
        for t in case.output_ids[row]:
            if t >= 0:
                counts[row, t] += 1
                seen[row, t] = True
        for t in case.prompt_ids[row]:
            if t >= 0:
                seen[row, t] = True
    return counts, seen


def penalised(case: Case) -> tuple[np.ndarray, np.ndarray]:
    """(expected, scale): the docstring's three steps in the logits' dtype."""
    x = case.logits
    dt = x.dtype
    c, seen = counts_and_seen(case)
    r = case.repetition_penalty.astype(dt)[:, None]
    f = case.frequency_penalty.astype(dt)[:, None]
    q = case.presence_penalty.astype(dt)[:, None]
    with np.errstate(invalid="ignore", over="ignore"):
        y = np.where(seen, np.where(x > 0, x / r, x * r), x)
        y = y - f * c.astype(dt)
        y = y - q * (c > 0).astype(dt)
        scale = (
            np.abs(np.where(np.isfinite(x), x, 0)) * np.maximum(r, 1) + np.abs(f) * c + np.abs(q)
        )
    return y, scale


def _penalty_formula(ctx: Ctx, case: Case) -> None:
    expected, scale = penalised(case)
    checks.assert_close(call(ctx, "apply_penalties", case), expected, case.logits.dtype, scale)


@spec.prop("apply_penalties", penalty_cases("disabled"))
def noop_when_disabled(ctx: Ctx, case: Case) -> None:
    """repetition 1, frequency 0 and presence 0 leave every row exactly unchanged."""
    checks.assert_equal(call(ctx, "apply_penalties", case), case.logits)


@spec.prop("apply_penalties", penalty_cases())
def unseen_tokens_unchanged(ctx: Ctx, case: Case) -> None:
    """Tokens in neither prompt_ids nor output_ids keep their exact logit."""
    out = call(ctx, "apply_penalties", case)
    _, seen = counts_and_seen(case)
    checks.assert_equal(out[~seen], case.logits[~seen], what="unseen token")


@spec.prop("apply_penalties", penalty_cases("repetition"))
def repetition_penalty_formula(ctx: Ctx, case: Case) -> None:
    """Seen tokens: x / r if x > 0 else x * r (prompt and output both count)."""
    _penalty_formula(ctx, case)


@spec.prop("apply_penalties", penalty_cases("additive"))
def frequency_and_presence_formula(ctx: Ctx, case: Case) -> None:
    """x - f * count_in_output - q * (count_in_output > 0); prompt tokens are not counted."""
    _penalty_formula(ctx, case)


@spec.prop("apply_penalties", penalty_cases())
def penalties_are_applied_in_order(ctx: Ctx, case: Case) -> None:
    """All three together: repetition first, then frequency, then presence (float tolerance)."""
    _penalty_formula(ctx, case)


@spec.prop("apply_penalties", penalty_cases())
def padding_and_id_order_do_not_matter(ctx: Ctx, case: Case) -> None:
    """Extra padding columns (ids < 0) and a permutation of the ids leave the result unchanged."""
    out = call(ctx, "apply_penalties", case)
    b = case.logits.shape[0]
    pad = np.full((b, 2), -1, case.prompt_ids.dtype)
    other = Case(
        logits=case.logits,
        prompt_ids=np.concatenate([pad, case.prompt_ids[:, ::-1]], axis=1),
        output_ids=np.concatenate([case.output_ids[:, ::-1], pad[:, :1]], axis=1),
        repetition_penalty=case.repetition_penalty,
        frequency_penalty=case.frequency_penalty,
        presence_penalty=case.presence_penalty,
    )
    checks.assert_equal(
        call(ctx, "apply_penalties", other), out, what="with padding and reversed ids"
    )


def _penalty_compare(case: Case, got: np.ndarray, ref: np.ndarray) -> None:
    checks.assert_close(got, ref, case.logits.dtype, penalised(case)[1])


def _ids_with(case: Case, field: str, value: int) -> np.ndarray:
    ids = getattr(case, field)
    ids = np.concatenate([ids, np.full((ids.shape[0], 1), -1, ids.dtype)], axis=1)
    ids[0, -1] = value
    return ids


add_common(
    "apply_penalties",
    penalty_cases(),
    logits_errors(
        penalty_cases(),
        SHAPES["apply_penalties"],
        {
            "repetition_penalty": [
                ("repetition_penalty 0", 0.0, ValueError),
                ("a negative repetition_penalty", -1.0, ValueError),
                ("an infinite repetition_penalty", math.inf, ValueError),
            ],
            "frequency_penalty": [("a NaN frequency_penalty", math.nan, ValueError)],
            "presence_penalty": [("an infinite presence_penalty", -math.inf, ValueError)],
            "prompt_ids": [
                ("float prompt_ids", lambda c: c.prompt_ids.astype(np.float64), TypeError),
                (
                    "a prompt id == vocab",
                    lambda c: _ids_with(c, "prompt_ids", c.logits.shape[1]),
                    ValueError,
                ),
                ("1-D prompt_ids", lambda c: c.prompt_ids.reshape(-1), ValueError),
            ],
            "output_ids": [
                (
                    "an output id > vocab",
                    lambda c: _ids_with(c, "output_ids", c.logits.shape[1] + 5),
                    ValueError,
                ),
                (
                    "output_ids for batch + 1 rows",
                    lambda c: np.zeros((c.logits.shape[0] + 1, 1), np.int64),
                    ValueError,
                ),
            ],
        },
    ),
    _penalty_compare,
    "Same -inf entries as the reference, finite values within the float tolerance.",
)


# ============================================================================ apply_logit_bias


@st.composite
def logit_bias_cases(draw: Any, min_len: int = 0) -> Case:
    x = draw(logits_arrays())
    b, v = x.shape
    ids = draw(token_id_arrays(b, v, min_len=min_len))
    bias_values = st.one_of(
        st.sampled_from((1.0, -1.0, 100.0, -100.0, 0.5)), st.floats(-10.0, 10.0)
    )
    bias = draw(
        st.sampled_from(FLOAT_DTYPES).flatmap(
            lambda dt: hnp.arrays(np.dtype(dt), ids.shape, elements=bias_values)
        )
    )
    return Case(logits=x, token_ids=ids, bias=bias)


def biased(case: Case) -> tuple[np.ndarray, np.ndarray]:
    """(expected, scale): float64 logits + fsum of the row's biases per token, rounded once."""
    b, v = case.logits.shape
    expected = case.logits.astype(np.float64).copy()
    scale = np.abs(np.where(np.isfinite(expected), expected, 0))
    for row in range(b):
        for t in range(v):
            terms = [
                float(case.bias[row, j])
                for j in range(case.token_ids.shape[1])
                if case.token_ids[row, j] == t
            ]
            if terms:
                expected[row, t] = math.fsum([expected[row, t], *terms])
                scale[row, t] += math.fsum(abs(w) for w in terms)
    return expected.astype(case.logits.dtype), scale


@spec.prop("apply_logit_bias", logit_bias_cases())
def adds_bias_in_float64(ctx: Ctx, case: Case) -> None:
    """Each listed token gets the sum of its biases added in float64, rounded once (float
    tolerance)."""
    expected, scale = biased(case)
    checks.assert_close(call(ctx, "apply_logit_bias", case), expected, case.logits.dtype, scale)


@spec.prop("apply_logit_bias", logit_bias_cases())
def unlisted_tokens_unchanged(ctx: Ctx, case: Case) -> None:
    """Tokens not listed in a row's token_ids (and padding, ids < 0) keep their exact logit."""
    out = call(ctx, "apply_logit_bias", case)
    listed = np.zeros(case.logits.shape, bool)
    for row, ids in enumerate(case.token_ids):
        listed[row, ids[ids >= 0]] = True
    checks.assert_equal(out[~listed], case.logits[~listed], what="unlisted token")


@st.composite
def duplicate_bias_cases(draw: Any) -> Case:
    x = draw(logits_arrays(neg_inf=False))
    b, v = x.shape
    token = draw(st.integers(0, v - 1))
    first, second = (
        draw(st.sampled_from((0.25, 1.5, -3.0))),
        draw(st.sampled_from((0.5, 2.0, -0.75))),
    )
    ids = np.full((b, 2), token, np.int64)
    bias = np.tile(np.array([first, second], np.float64), (b, 1))
    return Case(logits=x, token_ids=ids, bias=bias)


@spec.prop("apply_logit_bias", duplicate_bias_cases())
def duplicate_ids_add_up(ctx: Ctx, case: Case) -> None:
    """A token listed twice in a row gets both biases (dyadic biases, so the sum is exact)."""
    expected, scale = biased(case)
    checks.assert_close(call(ctx, "apply_logit_bias", case), expected, case.logits.dtype, scale)


def _bias_compare(case: Case, got: np.ndarray, ref: np.ndarray) -> None:
    checks.assert_close(got, ref, case.logits.dtype, biased(case)[1])


def _bias_with(case: Case, value: float) -> np.ndarray:
    bias = case.bias.astype(np.float64)
    bias[0, 0] = value
    return bias


def _first_id(case: Case, value: Any) -> np.ndarray:
    ids = case.token_ids.copy()
    ids[0, 0] = value
    return ids


add_common(
    "apply_logit_bias",
    logit_bias_cases(),
    logits_errors(
        logit_bias_cases(min_len=1),
        SHAPES["apply_logit_bias"],
        {
            "token_ids": [
                ("float token_ids", lambda c: c.token_ids.astype(np.float64), TypeError),
                ("a token id == vocab", lambda c: _first_id(c, c.logits.shape[1]), ValueError),
            ],
            "bias": [
                ("a NaN bias", lambda c: _bias_with(c, math.nan), ValueError),
                ("an infinite bias", lambda c: _bias_with(c, math.inf), ValueError),
                (
                    "bias of another shape",
                    lambda c: np.zeros((c.logits.shape[0], c.token_ids.shape[1] + 1)),
                    ValueError,
                ),
                ("a boolean bias", lambda c: np.zeros(c.token_ids.shape, bool), TypeError),
            ],
        },
    ),
    _bias_compare,
    "Same -inf entries as the reference, finite values within the float tolerance.",
)


# ================================================================================ log_softmax


def log_softmax_cases() -> Any:
    return logits_arrays().map(lambda x: Case(logits=x))


def row_scale(x: np.ndarray) -> np.ndarray:
    """Per-row magnitude of log_softmax's operands: max |finite logit| + log(vocab) + 1."""
    finite = np.where(np.isfinite(x), np.abs(x), 0).astype(np.float64)
    return (finite.max(axis=1) + math.log(x.shape[1]) + 1)[:, None]


@spec.prop("log_softmax", log_softmax_cases())
def rows_logsumexp_to_zero(ctx: Ctx, case: Case) -> None:
    """Each output row is normalised: logsumexp(out[b]) == 0 within the float tolerance."""
    out = call(ctx, "log_softmax", case)
    scale = row_scale(case.logits)
    for b in range(out.shape[0]):
        lse = oracles.logsumexp64(out[b])
        tol = 4 * checks.rtol(case.logits.dtype) * float(scale[b, 0])
        assert abs(lse) <= tol, f"row {b}: logsumexp = {lse!r} (tolerance {tol:.3g})"


@spec.prop("log_softmax", log_softmax_cases())
def matches_log_of_softmax(ctx: Ctx, case: Case) -> None:
    """out = x - logsumexp(x), computed exactly by the oracle (float tolerance); -inf stays -inf."""
    out = call(ctx, "log_softmax", case)
    expected = np.stack([row.astype(np.float64) - oracles.logsumexp64(row) for row in case.logits])
    checks.assert_close(
        out, expected.astype(case.logits.dtype), case.logits.dtype, 4 * row_scale(case.logits)
    )


@spec.prop("log_softmax", log_softmax_cases())
def log_probabilities_are_not_positive(ctx: Ctx, case: Case) -> None:
    """Every output is <= 0 (no token has probability above 1)."""
    out = call(ctx, "log_softmax", case)
    assert not (out > 0).any(), (
        f"positive log-probability {out[out > 0][0]!r} at {checks.at(out > 0)}"
    )


@spec.prop("log_softmax", log_softmax_cases(), name="preserves_token_order")
def log_softmax_preserves_token_order(ctx: Ctx, case: Case) -> None:
    """x[i] < x[j] implies out[i] <= out[j]; equal logits give equal outputs."""
    out = call(ctx, "log_softmax", case)
    for b in range(out.shape[0]):
        order = np.argsort(case.logits[b], kind="stable")
        assert not np.any(np.diff(out[b][order]) < 0), f"row {b}: order of tokens changed"
        for value in np.unique(case.logits[b]):
            group = out[b][case.logits[b] == value]
            assert np.all(group == group[0]), (
                f"row {b}: tied logits {value!r} got different outputs"
            )


def _log_softmax_compare(case: Case, got: np.ndarray, ref: np.ndarray) -> None:
    checks.assert_close(got, ref, case.logits.dtype, 4 * row_scale(case.logits))


add_common(
    "log_softmax",
    log_softmax_cases(),
    logits_errors(log_softmax_cases(), SHAPES["log_softmax"], {}),
    _log_softmax_compare,
    "Same -inf entries as the reference, finite values within the float tolerance.",
)


# ============================================================================== topk_logprobs


@st.composite
def topk_logprobs_cases(draw: Any) -> Case:
    x = draw(logits_arrays())
    b, v = x.shape
    num = draw(st.integers(0, v))
    sampled = draw(row_values(b, st.integers(0, v - 1), (np.int64, np.int32)))
    return Case(logprobs=x, num=num, sampled=sampled)


@spec.prop("topk_logprobs", topk_logprobs_cases())
def top_entries_in_order(ctx: Ctx, case: Case) -> None:
    """ids are the num most likely tokens by (logprob descending, token id ascending); values
    gathered."""
    values, ids, _, _ = call(ctx, "topk_logprobs", case)
    for b, row in enumerate(case.logprobs):
        want = sorted(range(row.size), key=lambda i: (-float(row[i]), i))[: case.num]
        checks.assert_equal(np.asarray(ids[b]).tolist(), want, what=f"row {b} ids")
        checks.assert_equal(values[b], row[want], what=f"row {b} values")


@spec.prop("topk_logprobs", topk_logprobs_cases())
def sampled_logprob_and_rank(ctx: Ctx, case: Case) -> None:
    """sampled_logprob = logprobs[sampled]; rank = 1 + number of strictly larger logprobs."""
    _, _, chosen, rank = call(ctx, "topk_logprobs", case)
    for b, row in enumerate(case.logprobs):
        s = int(case.sampled[b])
        checks.assert_equal(chosen[b], row[s], what=f"row {b} sampled_logprob")
        checks.assert_equal(int(rank[b]), 1 + int(np.sum(row > row[s])), what=f"row {b} rank")


@spec.prop("topk_logprobs", topk_logprobs_cases(), name="returns_documented_types")
def topk_logprobs_returns_documented_types(ctx: Ctx, case: Case) -> None:
    """values like logprobs (batch, num); ids int64 (batch, num); sampled_logprob (batch,); rank
    int64 (batch,)."""
    lp = ctx.convert(case.logprobs)
    result = ctx.fn("topk_logprobs")(lp, case.num, ctx.convert(case.sampled))
    assert isinstance(result, tuple) and len(result) == 4, (
        f"expected a 4-tuple, got {type(result).__name__}"
    )
    b = case.logprobs.shape[0]
    dt = checks.dtype_name(lp)
    for what, x, shape, dtype in (
        ("values", result[0], (b, case.num), dt),
        ("ids", result[1], (b, case.num), "int64"),
        ("sampled_logprob", result[2], (b,), dt),
        ("sampled_rank", result[3], (b,), "int64"),
    ):
        problem = checks.same_library(x, lp)
        assert problem is None, f"{what} {problem}"
        assert checks.dtype_name(x) == dtype, (
            f"{what} has dtype {checks.dtype_name(x)}, expected {dtype}"
        )
        assert tuple(x.shape) == shape, f"{what} has shape {tuple(x.shape)}, expected {shape}"


def _tuple_compare(case: Case, got: Any, ref: Any) -> None:
    for name, g, r in zip(
        ("values", "ids", "sampled_logprob", "sampled_rank"), got, ref, strict=True
    ):
        checks.assert_equal(g, r, what=name)


def _topk_errors() -> Any:
    def variants(c: Case) -> list[tuple[str, tuple[Any, ...], type]]:
        v = c.logprobs.shape[1]
        bad_s = c.sampled.astype(np.int64).copy()
        neg = bad_s.copy()
        bad_s[0], neg[0] = v, -1
        nan = c.logprobs.copy()
        nan[0, 0] = np.nan
        options = [
            ("integer logprobs", (c.logprobs.astype(np.int64), c.num, c.sampled), TypeError),
            ("1-D logprobs", (c.logprobs[0], c.num, c.sampled), ValueError),
            ("a NaN logprob", (nan, c.num, c.sampled), ValueError),
            ("num == vocab + 1", (c.logprobs, v + 1, c.sampled), ValueError),
            ("num == -1", (c.logprobs, -1, c.sampled), ValueError),
            ("a float num", (c.logprobs, float(c.num), c.sampled), TypeError),
            ("num == True", (c.logprobs, True, c.sampled), TypeError),
            ("sampled == vocab", (c.logprobs, c.num, bad_s), ValueError),
            ("sampled == -1", (c.logprobs, c.num, neg), ValueError),
            ("float sampled", (c.logprobs, c.num, c.sampled.astype(np.float64)), TypeError),
            (
                "sampled of length batch + 1",
                (c.logprobs, c.num, np.zeros(c.logprobs.shape[0] + 1, np.int64)),
                ValueError,
            ),
        ]
        return options

    return error_variants(topk_logprobs_cases(), variants)


add_does_not_modify_inputs(spec, SHAPES["topk_logprobs"], topk_logprobs_cases())
add_accepts_strided_input(spec, SHAPES["topk_logprobs"], topk_logprobs_cases())
add_rejects_invalid_input(spec, SHAPES["topk_logprobs"], _topk_errors())
add_matches_reference(
    spec,
    SHAPES["topk_logprobs"],
    topk_logprobs_cases(),
    _tuple_compare,
    "All four outputs exactly equal to the reference's.",
)


# ============================================================================= philox_uniform

INT64 = (-(1 << 63), (1 << 63) - 1)
seed_values = st.one_of(
    st.sampled_from((0, 1, -1, 42, 1 << 32, (1 << 32) - 1, INT64[0], INT64[1])),
    st.integers(*INT64),
)
position_values = st.one_of(
    st.sampled_from((0, 1, 2, (1 << 32) - 1, 1 << 32, INT64[1])),
    st.integers(0, 1 << 20),
    st.integers(0, INT64[1]),
)


@st.composite
def seed_arrays(draw: Any, n: int) -> np.ndarray:
    """(n,) seeds, int64 or (as the same bit patterns) uint64."""
    seeds = np.array(draw(st.lists(seed_values, min_size=n, max_size=n)), dtype=np.int64)
    return seeds.view(np.uint64) if draw(st.booleans()) else seeds


@st.composite
def philox_cases(draw: Any) -> Case:
    b = draw(batches)
    pos = np.array(draw(st.lists(position_values, min_size=b, max_size=b)), dtype=np.int64)
    return Case(seeds=draw(seed_arrays(b)), positions=pos, num=draw(st.integers(0, 70)))


def as_int64(seeds: np.ndarray) -> np.ndarray:
    return seeds.view(np.int64) if seeds.dtype == np.uint64 else seeds.astype(np.int64)


@spec.prop("philox_uniform", philox_cases())
def uniforms_in_open_unit_interval(ctx: Ctx, case: Case) -> None:
    """float64 values of shape (batch, num), every one strictly between 0 and 1."""
    u = call(ctx, "philox_uniform", case)
    checks.assert_shape_dtype(u, (case.seeds.shape[0], case.num), np.float64)
    assert np.all((u > 0) & (u < 1)), f"value {u[~((u > 0) & (u < 1))][0]!r} outside (0, 1)"


@spec.prop("philox_uniform", philox_cases())
def matches_independent_philox(ctx: Ctx, case: Case) -> None:
    """Bit for bit the uniforms of an independent Philox-4x32-10 written from the docstring."""
    u = call(ctx, "philox_uniform", case)
    checks.assert_equal(u, oracles.philox_uniform(as_int64(case.seeds), case.positions, case.num))


def philox_known_answers(ctx: Ctx) -> None:
    """Seed 0, position 0 gives the uniforms of the Random123 known answer 6627e8d5 e169c58d
    bc57ac4c 9b00dbd8."""
    words = oracles.PHILOX_KAT[0][2]
    expected = [
        math.ldexp(2 * (((hi << 32) | lo) >> 12) + 1, -53)
        for lo, hi in ((words[0], words[1]), (words[2], words[3]))
    ]
    u = ctx.call("philox_uniform", np.zeros(1, np.int64), np.zeros(1, np.int64), 2)
    checks.assert_equal(u, np.array([expected]))
    # The same words are what the docstring's Philox produces (a check of the suite itself).
    assert oracles.philox4x32_10((0, 0, 0, 0), (0, 0)) == words


spec.add("philox_uniform", philox_known_answers)


@st.composite
def regrouped(draw: Any, base: Any) -> tuple[Case, Case, np.ndarray]:
    """(case, bigger case with case's rows permuted among extra rows, where each row went)."""
    case = draw(base)
    extra = draw(base)
    fields = {}
    b, e = case.seeds.shape[0], extra.seeds.shape[0] if draw(st.booleans()) else 0
    perm = np.array(draw(st.permutations(range(b + e))), dtype=np.int64)
    for name in case._fields:
        value = getattr(case, name)
        if isinstance(value, np.ndarray) and value.ndim >= 1 and value.shape[0] == b:
            other = getattr(extra, name)[:e]
            if value.ndim == 2:
                other = other[:, : value.shape[1]]
                if other.shape[1] < value.shape[1]:
                    pad = np.zeros((e, value.shape[1] - other.shape[1]), value.dtype)
                    other = np.concatenate([other, pad], axis=1)
            both = np.concatenate([value, other.astype(value.dtype)])
            fields[name] = both[perm]
        else:
            fields[name] = value
    for value in fields.values():  # extra rows cut to the vocab may be all -inf
        if isinstance(value, np.ndarray) and value.ndim == 2 and value.dtype.kind == "f":
            value[np.all(np.isneginf(value), axis=1), 0] = 0.0
    where = np.argsort(perm)[:b]  # row i of case is row where[i] of the bigger case
    return case, Case(**fields), where


@spec.prop("philox_uniform", regrouped(philox_cases()))
def independent_of_batch_composition(ctx: Ctx, triple: Any) -> None:
    """A row's uniforms are the same alone or among other rows, in any order."""
    case, bigger, where = triple
    alone = call(ctx, "philox_uniform", case)
    together = call(ctx, "philox_uniform", bigger)
    checks.assert_equal(together[where], alone, what="row in a regrouped batch")


@spec.prop("philox_uniform", st.tuples(philox_cases(), st.integers(0, 70)))
def longer_streams_extend_shorter_ones(ctx: Ctx, pair: Any) -> None:
    """philox_uniform(num=m) is the first m columns of philox_uniform(num=n), m <= n."""
    case, m = pair
    full = call(ctx, "philox_uniform", case)
    short = ctx.call("philox_uniform", case.seeds, case.positions, min(m, case.num))
    checks.assert_equal(short, full[:, : min(m, case.num)])


@spec.prop("philox_uniform", philox_cases())
def uint64_seeds_are_int64_bit_patterns(ctx: Ctx, case: Case) -> None:
    """A uint64 seed gives the same stream as the int64 with the same 64 bits."""
    signed = as_int64(case.seeds)
    a = ctx.call("philox_uniform", signed, case.positions, case.num)
    b = ctx.call("philox_uniform", signed.view(np.uint64), case.positions, case.num)
    checks.assert_equal(b, a, what="uniforms for the uint64 seeds")


def uniforms_pass_goodness_of_fit(ctx: Ctx) -> None:
    """20000 uniforms over fixed seeds pass Kolmogorov-Smirnov and a 64-bin chi-square (p >
    1e-4)."""
    from scipy import stats

    n = 2000
    seeds = (np.arange(n, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)).view(np.int64)
    positions = np.arange(n, dtype=np.int64) % 7
    u = ctx.call("philox_uniform", seeds, positions, 10).reshape(-1)
    ks = stats.kstest(u, "uniform").pvalue
    assert ks > 1e-4, f"Kolmogorov-Smirnov p-value {ks:.3g} <= 1e-4"
    counts = np.bincount((u * 64).astype(np.int64), minlength=64)
    chi = stats.chisquare(counts).pvalue
    assert chi > 1e-4, f"chi-square p-value {chi:.3g} <= 1e-4"
    # Neighbouring columns must not be correlated (the two halves of one Philox block).
    r = np.corrcoef(u.reshape(n, 10)[:, 0], u.reshape(n, 10)[:, 1])[0, 1]
    assert abs(r) < 0.1, f"correlation {r:.3f} between columns 0 and 1"


spec.add("philox_uniform", uniforms_pass_goodness_of_fit)


def _philox_errors() -> Any:
    def variants(c: Case) -> list[tuple[str, tuple[Any, ...], type]]:
        s, p, n = c.seeds, c.positions, c.num
        neg = p.copy()
        neg[0] = -1
        options = [
            ("float seeds", (s.astype(np.float64), p, n), TypeError),
            ("seeds of shape (batch, 1)", (s[:, None], p, n), ValueError),
            ("a negative position", (s, neg, n), ValueError),
            (
                "positions of length batch + 1",
                (s, np.zeros(s.shape[0] + 1, np.int64), n),
                ValueError,
            ),
            ("float positions", (s, p.astype(np.float64), n), TypeError),
            ("num == -1", (s, p, -1), ValueError),
            ("a float num", (s, p, float(n)), TypeError),
            ("num == True", (s, p, True), TypeError),
        ]
        return options

    return error_variants(philox_cases(), variants)


add_does_not_modify_inputs(spec, SHAPES["philox_uniform"], philox_cases())
add_rejects_invalid_input(spec, SHAPES["philox_uniform"], _philox_errors())
add_matches_reference(
    spec,
    SHAPES["philox_uniform"],
    philox_cases(),
    _exact_compare,
    "Bit for bit the reference's uniforms.",
)


@spec.prop("philox_uniform", philox_cases(), name="returns_documented_types")
def philox_returns_seeds_library(ctx: Ctx, case: Case) -> None:
    """The result is a float64 array of the seeds' library and device."""
    seeds = ctx.convert(case.seeds)
    u = ctx.fn("philox_uniform")(seeds, ctx.convert(case.positions), case.num)
    problem = checks.same_library(u, seeds)
    assert problem is None, problem
    assert checks.dtype_name(u) == "float64", f"dtype {checks.dtype_name(u)}"


# ===================================================================================== sample


@st.composite
def sample_cases(draw: Any, greedy: str = "some") -> Case:
    """greedy: 'some' (a mix), 'none' (all temperatures > 0) or 'all'."""
    x = draw(logits_arrays())
    b = x.shape[0]
    hot = st.one_of(st.sampled_from((1.0, 0.5, 2.0)), st.floats(0.01, 10.0))
    temps = {"none": hot, "all": st.just(0.0), "some": st.one_of(st.just(0.0), hot)}[greedy]
    t = draw(row_values(b, temps, FLOAT_DTYPES))
    pos = np.array(draw(st.lists(position_values, min_size=b, max_size=b)), dtype=np.int64)
    return Case(logits=x, temperature=t, seeds=draw(seed_arrays(b)), positions=pos)


def first_argmax(row: np.ndarray) -> int:
    return int(np.flatnonzero(row == np.max(row))[0])


@spec.prop("sample", sample_cases())
def greedy_rows_take_first_argmax(ctx: Ctx, case: Case) -> None:
    """temperature 0 gives argmax(logits[b]), the lowest index among ties."""
    tokens = call(ctx, "sample", case)
    for b in np.flatnonzero(case.temperature == 0):
        want = first_argmax(case.logits[b])
        assert int(tokens[b]) == want, f"row {b}: greedy token {int(tokens[b])}, expected {want}"


@spec.prop("sample", sample_cases())
def never_draws_masked_token(ctx: Ctx, case: Case) -> None:
    """The drawn token is a valid id whose logit is not -inf."""
    tokens = call(ctx, "sample", case)
    for b, t in enumerate(np.asarray(tokens).tolist()):
        assert 0 <= t < case.logits.shape[1], f"row {b}: token {t} outside the vocab"
        assert np.isfinite(case.logits[b, t]), f"row {b}: drew masked token {t}"


@spec.prop("sample", regrouped(sample_cases()))
def batch_invariant(ctx: Ctx, triple: Any) -> None:
    """A row's token is unchanged when other rows are added, removed or permuted."""
    case, bigger, where = triple
    checks.assert_equal(
        call(ctx, "sample", bigger)[where],
        call(ctx, "sample", case),
        what="token in a regrouped batch",
    )


@spec.prop("sample", st.tuples(sample_cases("none"), st.floats(0.01, 10.0)))
def temperature_only_selects_greedy_rows(ctx: Ctx, pair: Any) -> None:
    """For rows with temperature > 0 the value does not matter (logits are already scaled)."""
    case, other = pair
    a = call(ctx, "sample", case)
    b = ctx.call(
        "sample", case.logits, np.full_like(case.temperature, other), case.seeds, case.positions
    )
    checks.assert_equal(b, a, what="tokens with another positive temperature")


@spec.prop("sample", sample_cases("none"))
def draws_by_exponential_race(ctx: Ctx, case: Case) -> None:
    """token = argmax(logits - log(-log(u))) with u from an independent Philox (ties within 1e-12
    excused)."""
    tokens = call(ctx, "sample", case)
    u = oracles.philox_uniform(as_int64(case.seeds), case.positions, case.logits.shape[1])
    for b, t in enumerate(np.asarray(tokens).tolist()):
        scores = oracles.race_scores(case.logits[b], u[b])
        best = int(np.argmax(scores))
        if t != best:
            gap = abs(scores[best] - scores[t]) if 0 <= t < scores.size else math.inf
            assert gap <= 1e-12 * max(1.0, abs(scores[best])), (
                f"row {b}: token {t} (score {scores[t] if 0 <= t < scores.size else None!r}), "
                f"the race is won by {best} (score {scores[best]!r})"
            )


# Fixed rows for the goodness-of-fit test: a flat, a skewed, a masked and a peaked
# distribution, plus a 16-token random row.
GOF_ROWS = (
    [0.0, 0.0, 0.0, 0.0],
    [2.0, 1.0, 0.0, -1.0, -3.0],
    [1.0, NEG_INF, 0.5, NEG_INF, 0.0, 3.0],
    [4.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0],
    np.round(np.random.default_rng(0).normal(0, 1.5, 16), 3).tolist(),
)
GOF_DRAWS = 4000
GOF_P = 1e-4


def goodness_of_fit(sampler: Any, row: list[float], dtype: Any, vary: str) -> float:
    """chi-square p-value of GOF_DRAWS tokens from `sampler` against softmax(row).

    `sampler(logits, temperature, seeds, positions) -> tokens` gets one batch of
    GOF_DRAWS copies of `row`, with fixed seeds varying (vary="seeds") or one seed and
    varying positions (vary="positions"). Cells expected below 5 are merged. Fixed inputs:
    the p-value is a deterministic function of the sampler, so the test cannot flake.
    """
    from scipy import stats

    n = GOF_DRAWS
    logits = np.tile(np.array(row, dtype=dtype), (n, 1))
    idx = np.arange(n, dtype=np.int64)
    if vary == "seeds":
        seeds, positions = idx * 7919 + 17, idx % 5
    else:
        seeds, positions = np.full(n, 20240607, np.int64), idx
    tokens = np.asarray(sampler(logits, np.ones(n, dtype), seeds, positions)).astype(np.int64)
    probs = oracles.probs64(np.array(row, dtype=np.float64))
    if np.any(probs[tokens] == 0):
        return 0.0
    observed = np.bincount(tokens, minlength=len(row)).astype(np.float64)
    expected = probs * n
    keep = expected >= 5
    obs = np.append(observed[keep], observed[~keep].sum())
    exp = np.append(expected[keep], expected[~keep].sum())
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    if obs.size < 2:
        return 1.0 if observed[keep].sum() == n else 0.0
    return float(stats.chisquare(obs, exp).pvalue)


def draws_follow_softmax(ctx: Ctx) -> None:
    """Over fixed seeds (and over positions of one seed), tokens fit softmax(logits): chi-square p >
    1e-4."""
    for dtype in FLOAT_DTYPES:
        for row in GOF_ROWS:
            for vary in ("seeds", "positions"):
                pvalue = goodness_of_fit(lambda *a: ctx.call("sample", *a), row, dtype, vary)
                assert pvalue > GOF_P, (
                    f"{np.dtype(dtype).name} row {row} varying {vary}: "
                    f"chi-square p-value {pvalue:.3g} <= {GOF_P}"
                )


spec.add("sample", draws_follow_softmax)


def _sample_errors() -> Any:
    def variants(c: Case) -> list[tuple[str, tuple[Any, ...], type]]:
        x, t, s, p = c.logits, c.temperature, c.seeds, c.positions
        neg_t, neg_p = t.astype(np.float64), p.copy()
        neg_t[0], neg_p[0] = -1.0, -1
        nan = x.copy()
        nan[0, 0] = np.nan
        dead = x.copy()
        dead[0] = NEG_INF
        options = [
            ("integer logits", (x.astype(np.int64), t, s, p), TypeError),
            ("a NaN logit", (nan, t, s, p), ValueError),
            ("a row entirely -inf", (dead, t, s, p), ValueError),
            ("a negative temperature", (x, neg_t, s, p), ValueError),
            ("float seeds", (x, t, s.astype(np.float64), p), TypeError),
            (
                "seeds of length batch + 1",
                (x, t, np.zeros(x.shape[0] + 1, np.int64), p),
                ValueError,
            ),
            ("a negative position", (x, t, s, neg_p), ValueError),
            (
                "positions of length batch + 1",
                (x, t, s, np.zeros(x.shape[0] + 1, np.int64)),
                ValueError,
            ),
        ]
        return options

    return error_variants(sample_cases(), variants)


add_does_not_modify_inputs(spec, SHAPES["sample"], sample_cases())
add_accepts_strided_input(spec, SHAPES["sample"], sample_cases())
add_rejects_invalid_input(spec, SHAPES["sample"], _sample_errors())
add_matches_reference(
    spec, SHAPES["sample"], sample_cases(), _exact_compare, "Exactly the reference's tokens."
)


@spec.prop("sample", sample_cases(), name="returns_documented_types")
def sample_returns_int64_tokens(ctx: Ctx, case: Case) -> None:
    """int64 token ids of shape (batch,), in the logits' library and device."""
    logits = ctx.convert(case.logits)
    tokens = ctx.fn("sample")(
        logits, *(ctx.convert(a) for a in (case.temperature, case.seeds, case.positions))
    )
    problem = checks.same_library(tokens, logits)
    assert problem is None, problem
    assert checks.dtype_name(tokens) == "int64", f"dtype {checks.dtype_name(tokens)}"
    assert tuple(tokens.shape) == (case.logits.shape[0],), f"shape {tuple(tokens.shape)}"


# ====================================================== typical_p, epsilon and eta cutoffs


def _rows_alone(ctx: Ctx, op: str, case: Case) -> tuple[np.ndarray, list[np.ndarray]]:
    """The op's result for the whole batch, and for each row given alone."""
    names = SHAPES[op].args
    whole = call(ctx, op, case)
    alone = []
    for b in range(case.logits.shape[0]):
        one = Case(**{n: getattr(case, n)[b : b + 1] for n in names})
        alone.append(call(ctx, op, one)[0])
    return whole, alone


def add_rows_are_independent(op: str, cases: Any, boundary: Any = None, masks: bool = True) -> None:
    """masks: the op only masks (else it changes values, and each row must come out the
    same alone, bit for bit)."""

    def rows_are_independent(ctx: Ctx, case: Case) -> None:
        """Each row's result is the one it gets alone in a batch of one (batch-invariance);
        for the float64 filters, decisions inside the 1e-9 band are excused."""
        whole, alone = _rows_alone(ctx, op, case)
        for b, row in enumerate(alone):
            if not masks:
                checks.assert_equal(whole[b], row, what=f"row {b}")
                continue
            excused = None if boundary is None else boundary(case.logits[b], case, b)
            checks.assert_masks_equal(whole[b : b + 1], row[None], excused, what=f"row {b}")
            checks.assert_only_masks(whole[b : b + 1], case.logits[b : b + 1])

    spec.add(op, rows_are_independent, cases)


def typical_rule(row: np.ndarray, mass: float) -> tuple[np.ndarray, np.ndarray]:
    """(keep, uncertain) per token of one row, by the docstring's rule.

    keep[i] <=> S(i) < mass, S(i) = the mass of the tokens with d strictly smaller than
    d[i] (d = |-q - H|); tokens with equal logits are ties, never before one another.
    uncertain[i] when S(i) is within BAND (relative) of the mass, or when a token whose d
    is within 1e-9 * (1 + |H| + |q| + |q_i|) of d[i] could tip it (the documented band);
    -inf tokens are masked either way.
    """
    q, p, h = oracles.surprisal64(row)
    finite = np.isfinite(row)
    keep = np.ones(row.size, bool)
    uncertain = ~finite
    if mass == 1:
        return keep, uncertain
    d = np.where(finite, np.abs(-q - h), np.inf)
    for i in np.flatnonzero(finite):
        other = finite & (row != row[i])
        near = other & (np.abs(d - d[i]) <= 1e-9 * (1 + abs(h) + np.abs(q) + abs(q[i])))
        before = other & (d < d[i])
        exact = math.fsum(p[before].tolist())
        lo = math.fsum(p[before & ~near].tolist())
        hi = math.fsum(p[before | near].tolist())
        keep[i] = exact < mass
        surely_kept = hi < mass * (1 - checks.BAND)
        surely_masked = lo >= mass * (1 + checks.BAND)
        uncertain[i] |= not (surely_kept or surely_masked)
    return keep, uncertain


def _cutoff_rule(row: np.ndarray, threshold: float) -> tuple[np.ndarray, np.ndarray]:
    """(masked, uncertain): masked iff p < threshold and not tied for the max."""
    _, p, _ = oracles.surprisal64(row)
    top = row == finite_max(row)
    mask = (p < threshold) & ~top
    return mask, (~top & (np.abs(p - threshold) <= checks.BAND * threshold)) | np.isneginf(row)


def eta_threshold(row: np.ndarray, eta: float) -> float:
    return min(eta, math.sqrt(eta) * math.exp(-oracles.surprisal64(row)[2]))


def epsilon_rule(row: np.ndarray, epsilon: float) -> tuple[np.ndarray, np.ndarray]:
    return _cutoff_rule(row, epsilon)


def eta_rule(row: np.ndarray, eta: float) -> tuple[np.ndarray, np.ndarray]:
    return _cutoff_rule(row, eta_threshold(row, eta))


@st.composite
def typical_cases(draw: Any) -> Case:
    x = draw(logits_arrays())
    plain = st.one_of(st.sampled_from((1.0, 0.5, 0.9, 0.2, 1e-6)), st.floats(1e-6, 1.0))
    m = draw(row_values(x.shape[0], plain, FLOAT_DTYPES)).astype(np.float64)
    for b, row in enumerate(x):
        if draw(st.booleans()):  # typical_p on a cumulative mass in d order, or beside it
            q, p, h = oracles.surprisal64(row)
            order = np.argsort(np.where(np.isfinite(row), np.abs(-q - h), np.inf), kind="stable")
            j = draw(st.integers(0, row.size - 1))
            mass = float(np.cumsum(p[order])[j]) * draw(st.sampled_from(NEAR))
            if 0 < mass <= 1:
                m[b] = mass
    return Case(logits=x, typical_p=m)


@st.composite
def cutoff_cases(draw: Any, name: str) -> Case:
    """epsilon or eta per row; sometimes one whose threshold is a token's p (or beside it),
    for eta through either branch of min(eta, sqrt(eta) * exp(-H))."""
    x = draw(logits_arrays())
    plain = st.one_of(st.sampled_from((0.0, 0.01, 0.1, 0.5, 0.999)), st.floats(0.0, 0.999))
    v = draw(row_values(x.shape[0], plain, FLOAT_DTYPES)).astype(np.float64)
    for b, row in enumerate(x):
        if draw(st.booleans()):
            _, p, h = oracles.surprisal64(row)
            target = float(p[draw(st.integers(0, row.size - 1))]) * draw(st.sampled_from(NEAR))
            if name == "eta" and target > math.exp(-2 * h):
                target = (target * math.exp(h)) ** 2  # sqrt(eta) * exp(-H) == p
            if 0 < target < 1:
                v[b] = target
    return Case(logits=x, **{name: v})


def _check_rule(ctx: Ctx, op: str, case: Case, rule: Any, param: str, keeps: bool) -> None:
    out = call(ctx, op, case)
    for b, row in enumerate(case.logits):
        decided, uncertain = rule(row, float(getattr(case, param)[b]))
        expect_kept = decided if keeps else ~decided
        wrong = (np.isfinite(out[b]) != expect_kept) & ~uncertain
        assert not wrong.any(), (
            f"row {b} token {int(np.argmax(wrong))} ({param} {float(getattr(case, param)[b])!r}): "
            f"expected {'kept' if expect_kept[np.argmax(wrong)] else 'masked'}"
        )


def _band(rule: Any, param: str) -> Any:
    return lambda row, case, b: rule(row, float(getattr(case, param)[b]))[1][None]


def _rule_compare(rule: Any, param: str) -> Any:
    def compare(case: Case, got: np.ndarray, ref: np.ndarray) -> None:
        allowed = np.array(
            [rule(row, float(getattr(case, param)[b]))[1] for b, row in enumerate(case.logits)]
        ).reshape(got.shape)
        checks.assert_masks_equal(got, ref, allowed, what=f"{param} decision")
        checks.assert_only_masks(got, case.logits)

    return compare


@spec.prop("apply_typical_p", typical_cases())
def keeps_the_smallest_typical_set(ctx: Ctx, case: Case) -> None:
    """Token i is kept iff the mass of the tokens nearer the entropy (smaller |-log p - H|)
    is < typical_p (outside the 1e-9 bands)."""
    _check_rule(ctx, "apply_typical_p", case, typical_rule, "typical_p", keeps=True)


@spec.prop("apply_typical_p", typical_cases())
def keeps_a_nearest_token(ctx: Ctx, case: Case) -> None:
    """Every row keeps at least one token, among them one of those nearest the entropy."""
    out = call(ctx, "apply_typical_p", case)
    for b, row in enumerate(case.logits):
        q, _, h = oracles.surprisal64(row)
        d = np.where(np.isfinite(row), np.abs(-q - h), np.inf)
        nearest = d <= d.min() * (1 + 1e-9) + 1e-12
        assert np.isfinite(out[b][nearest]).any(), f"row {b}: masked every nearest token"


@spec.prop("apply_typical_p", typical_cases(), name="keeps_tied_tokens_together")
def typical_keeps_ties_together(ctx: Ctx, case: Case) -> None:
    """Tokens with equal logits get the same decision."""
    out = call(ctx, "apply_typical_p", case)
    for b, row in enumerate(case.logits):
        for value in np.unique(row[np.isfinite(row)]):
            group = np.isfinite(out[b][row == value])
            assert group.all() or not group.any(), f"row {b}: tokens tied at {value!r} split"


@st.composite
def typical_one_cases(draw: Any) -> Case:
    """typical_cases with typical_p == 1 on a first row of probabilities exactly 1/2, 1/2
    and 0 (two equal logits, one a thousand below, the rest -inf): a rule applied at mass 1
    reaches the mass before the last token and would drop it, whatever the draws."""
    case = draw(typical_cases())
    x, m = case.logits.copy(), case.typical_p.copy()
    if x.shape[0] and x.shape[1] >= 3:
        x[0] = -np.inf
        x[0, :3] = (0.0, 0.0, -1000.0)
        m[0] = 1.0
    return Case(logits=x, typical_p=m)


@spec.prop("apply_typical_p", typical_one_cases())
def typical_p_one_changes_nothing(ctx: Ctx, case: Case) -> None:
    """Rows with typical_p == 1 are returned unchanged."""
    out = call(ctx, "apply_typical_p", case)
    one = case.typical_p == 1
    checks.assert_equal(out[one], case.logits[one], what="row with typical_p == 1")


for _op, _cases, _rule, _param in (
    ("apply_typical_p", typical_cases(), typical_rule, "typical_p"),
    ("apply_epsilon_cutoff", cutoff_cases("epsilon"), epsilon_rule, "epsilon"),
    ("apply_eta_cutoff", cutoff_cases("eta"), eta_rule, "eta"),
):
    add_rows_are_independent(_op, _cases, _band(_rule, _param))


@spec.prop("apply_epsilon_cutoff", cutoff_cases("epsilon"))
def masks_below_epsilon(ctx: Ctx, case: Case) -> None:
    """A token is masked iff p < epsilon (float64, strict; 1e-9 band) and it is not tied for
    the max."""
    _check_rule(ctx, "apply_epsilon_cutoff", case, epsilon_rule, "epsilon", keeps=False)


_UNIFORM_ROWS = st.integers(2, 40).map(
    lambda v: Case(logits=np.zeros((1, v), np.float32), eta=np.array([math.nextafter(1.0, 0.0)]))
)


@spec.prop("apply_eta_cutoff", _UNIFORM_ROWS)
def keeps_a_uniform_row_whatever_eta(ctx: Ctx, case: Case) -> None:
    """A row of equal logits is tied for the max: every token is kept, even with eta just
    below 1, where float64 rounding of the entropy can put the floor above p = 1 / vocab."""
    out = call(ctx, "apply_eta_cutoff", case)
    checks.assert_equal(out, case.logits, what="uniform row")


@spec.prop("apply_eta_cutoff", cutoff_cases("eta"))
def masks_below_entropy_scaled_eta(ctx: Ctx, case: Case) -> None:
    """A token is masked iff p < min(eta, sqrt(eta) * exp(-H)) (float64, strict; 1e-9 band)
    and it is not tied for the max."""
    _check_rule(ctx, "apply_eta_cutoff", case, eta_rule, "eta", keeps=False)


for _op, _name in (("apply_epsilon_cutoff", "epsilon"), ("apply_eta_cutoff", "eta")):

    def _keeps_max(ctx: Ctx, case: Case, op: str = _op) -> None:
        """Tokens tied for the row's largest logit are never masked."""
        out = call(ctx, op, case)
        for b, row in enumerate(case.logits):
            assert np.isfinite(out[b][row == finite_max(row)]).all(), f"row {b}: masked a max"

    def _zero_disables(ctx: Ctx, case: Case, op: str = _op, name: str = _name) -> None:
        """Rows whose cutoff is 0 are returned unchanged."""
        out = call(ctx, op, case)
        off = getattr(case, name) == 0
        checks.assert_equal(out[off], case.logits[off], what=f"row with {name} == 0")

    spec.add(_op, _keeps_max, cutoff_cases(_name), name="never_masks_most_likely_token")
    spec.add(_op, _zero_disables, cutoff_cases(_name), name=f"{_name}_zero_changes_nothing")

add_common(
    "apply_typical_p",
    typical_cases(),
    logits_errors(
        typical_cases(),
        SHAPES["apply_typical_p"],
        {
            "typical_p": [
                ("typical_p == 0", 0.0, ValueError),
                ("typical_p > 1", 1.5, ValueError),
                ("a NaN typical_p", math.nan, ValueError),
            ]
        },
    ),
    _rule_compare(typical_rule, "typical_p"),
    "Same mask as the reference except tokens inside the documented 1e-9 bands; kept values exact.",
)
for _op, _name in (("apply_epsilon_cutoff", "epsilon"), ("apply_eta_cutoff", "eta")):
    add_common(
        _op,
        cutoff_cases(_name),
        logits_errors(
            cutoff_cases(_name),
            SHAPES[_op],
            {
                _name: [
                    (f"a negative {_name}", -0.1, ValueError),
                    (f"{_name} == 1", 1.0, ValueError),
                    (f"a NaN {_name}", math.nan, ValueError),
                ]
            },
        ),
        _rule_compare(globals()[f"{_name}_rule"], _name),
        f"Same mask as the reference except tokens whose p is within 1e-9 of the {_name} "
        "threshold; kept values exact.",
    )


# ============================================= allowed_token_ids, bad_words, no-repeat n-grams


def _sequences(batch: int, alphabet: int, max_len: int, width: int | None = None) -> Any:
    """(batch, width) ids right-padded with -1 or -2, tokens from [0, alphabet): small
    alphabets make repeated n-grams and matching prefixes common."""

    @st.composite
    def build(draw: Any) -> np.ndarray:
        w = draw(st.integers(0, max_len)) if width is None else width
        dtype = draw(st.sampled_from((np.int64, np.int32)))
        out = np.full((batch, w), draw(st.sampled_from((-1, -2))), dtype)
        for b in range(batch):
            n = draw(st.integers(0, w))
            out[b, :n] = draw(st.lists(st.integers(0, alphabet - 1), min_size=n, max_size=n))
        return out

    return build()


def _listed(ids: np.ndarray) -> list[int]:
    """A right-padded row as a list (its leading entries >= 0)."""
    out = []
    for t in ids.tolist():
        if t < 0:
            break
        out.append(int(t))
    return out


def _masked_where(logits: np.ndarray, banned: np.ndarray) -> np.ndarray:
    return np.where(banned, np.array(NEG_INF, logits.dtype), logits)


@st.composite
def allowed_cases(draw: Any) -> Case:
    x = draw(logits_arrays())
    b, v = x.shape
    ids = draw(token_id_arrays(b, v))
    if ids.shape[1] and draw(st.booleans()):
        ids[draw(st.integers(0, b - 1))] = -1  # a row that allows everything
    return Case(logits=x, allowed=ids)


def allowed_expected(case: Case) -> np.ndarray:
    banned = np.zeros(case.logits.shape, bool)
    for b, ids in enumerate(case.allowed):
        listed = {int(t) for t in ids if t >= 0}
        if listed:
            banned[b] = [t not in listed for t in range(case.logits.shape[1])]
    return _masked_where(case.logits, banned)


@st.composite
def bad_words_cases(draw: Any) -> Case:
    x = draw(logits_arrays())
    b, v = x.shape
    alphabet = min(v, 3)
    tokens = draw(_sequences(b, alphabet, 6))
    words_n, longest = draw(st.integers(0, 3)), draw(st.integers(0, 4))
    words = np.full((b, words_n, longest), -1, np.int64)
    for row in range(b):
        seq = _listed(tokens[row])
        for w in range(words_n):
            length = draw(st.integers(0, longest))
            word = draw(st.lists(st.integers(0, v - 1), min_size=length, max_size=length))
            if length > 1 and draw(st.booleans()) and len(seq) >= length - 1:
                # a prefix taken from the end of the tokens (it matches) or from elsewhere
                start = draw(st.sampled_from((len(seq) - length + 1, 0)))
                word[:-1] = seq[start : start + length - 1]
            words[row, w, :length] = word
    return Case(
        logits=x,
        token_ids=tokens,
        bad_words=words.astype(draw(st.sampled_from((np.int64, np.int32)))),
    )


def bad_words_expected(case: Case) -> np.ndarray:
    banned = np.zeros(case.logits.shape, bool)
    for b in range(case.logits.shape[0]):
        words = [_listed(w) for w in case.bad_words[b]]
        for t in oracles.bad_word_bans(_listed(case.token_ids[b]), words):
            banned[b, t] = True
    return _masked_where(case.logits, banned)


@st.composite
def no_repeat_cases(draw: Any) -> Case:
    x = draw(logits_arrays())
    b, v = x.shape
    tokens = draw(_sequences(b, min(v, 3), 10))
    n = np.array(draw(st.lists(st.integers(0, 4), min_size=b, max_size=b)))
    return Case(logits=x, token_ids=tokens, n=n.astype(draw(st.sampled_from((np.int64, np.int32)))))


def no_repeat_expected(case: Case) -> np.ndarray:
    banned = np.zeros(case.logits.shape, bool)
    for b in range(case.logits.shape[0]):
        for t in oracles.ngram_bans(_listed(case.token_ids[b]), int(case.n[b])):
            banned[b, t] = True
    return _masked_where(case.logits, banned)


@spec.prop("apply_allowed_token_ids", allowed_cases())
def masks_every_unlisted_token(ctx: Ctx, case: Case) -> None:
    """Rows with ids keep exactly the listed tokens' logits; rows of padding are unchanged."""
    checks.assert_equal(call(ctx, "apply_allowed_token_ids", case), allowed_expected(case))


@spec.prop("apply_allowed_token_ids", allowed_cases())
def id_order_and_padding_do_not_matter(ctx: Ctx, case: Case) -> None:
    """Reversed ids with padding columns around them give the same result."""
    pad = np.full((case.allowed.shape[0], 1), -1, case.allowed.dtype)
    other = Case(logits=case.logits, allowed=np.concatenate([pad, case.allowed[:, ::-1], pad], 1))
    checks.assert_equal(
        call(ctx, "apply_allowed_token_ids", other),
        call(ctx, "apply_allowed_token_ids", case),
        what="with padding and reversed ids",
    )


@spec.prop("apply_bad_words", bad_words_cases())
def bans_the_last_token_after_a_matching_prefix(ctx: Ctx, case: Case) -> None:
    """A sequence's last token is masked iff the row's tokens end with the rest of it (a
    one-token sequence always); nothing else changes."""
    checks.assert_equal(call(ctx, "apply_bad_words", case), bad_words_expected(case))


@spec.prop("apply_bad_words", bad_words_cases())
def extra_padding_does_not_matter(ctx: Ctx, case: Case) -> None:
    """Padding appended to the tokens, to each sequence and as empty sequences changes
    nothing."""
    b = case.logits.shape[0]
    tokens = np.concatenate([case.token_ids, np.full((b, 2), -1, case.token_ids.dtype)], 1)
    words = np.pad(case.bad_words, ((0, 0), (0, 1), (0, 2)), constant_values=-1)
    other = Case(logits=case.logits, token_ids=tokens, bad_words=words)
    checks.assert_equal(
        call(ctx, "apply_bad_words", other), call(ctx, "apply_bad_words", case), what="padded"
    )


@spec.prop("apply_no_repeat_ngram", no_repeat_cases())
def bans_the_completions_of_seen_ngrams(ctx: Ctx, case: Case) -> None:
    """Token v is masked iff the row's last n - 1 tokens followed by v form an n-gram that
    occurs in the row (n == 1: every seen token; n == 0 or fewer than n tokens: none)."""
    checks.assert_equal(call(ctx, "apply_no_repeat_ngram", case), no_repeat_expected(case))


@spec.prop("apply_no_repeat_ngram", no_repeat_cases())
def n_zero_changes_nothing(ctx: Ctx, case: Case) -> None:
    """Rows with n == 0 are returned unchanged."""
    out = call(ctx, "apply_no_repeat_ngram", case)
    off = case.n == 0
    checks.assert_equal(out[off], case.logits[off], what="row with n == 0")


def _after_padding(ids: np.ndarray) -> np.ndarray:
    """`ids` with two more columns, row 0 ending in padding followed by a token id."""
    extra = np.full((ids.shape[0], 2), -1, ids.dtype)
    extra[0, 1] = 0
    return np.concatenate([ids, extra], axis=-1)


def _with_id(ids: np.ndarray, value: int) -> np.ndarray:
    """`ids` with `value` added: in front of every row of a 2-D array, as a new one-token
    sequence of row 0 of a 3-D one."""
    if ids.ndim == 3:
        out = np.pad(ids, ((0, 0), (0, 1), (0, int(ids.shape[2] == 0))), constant_values=-1)
        out[0, -1, 0] = value
        return out
    return np.concatenate([np.full((ids.shape[0], 1), value, ids.dtype), ids], axis=1)


def _mask_errors(op: str, cases: Any, ids: str, extra: dict) -> Any:
    def id_errors(name: str) -> list[tuple[str, Any, type]]:
        return [
            (f"float {name}", lambda c: getattr(c, name).astype(np.float64), TypeError),
            (
                f"{name} holding an id == vocab",
                lambda c: _with_id(getattr(c, name), c.logits.shape[1]),
                ValueError,
            ),
            (
                f"{name} for batch + 1 rows",
                lambda c: np.zeros((c.logits.shape[0] + 1, *getattr(c, name).shape[1:]), np.int64),
                ValueError,
            ),
            (f"1-D {name}", lambda c: getattr(c, name).reshape(-1), ValueError),
        ]

    bad = {name: id_errors(name) for name in (ids, "token_ids") if name in SHAPES[op].args}
    for name, more in extra.items():
        bad[name] = bad.get(name, []) + more
    return logits_errors(cases, SHAPES[op], bad)


def _word_after_padding(words: np.ndarray) -> np.ndarray:
    """`words` with one more sequence in row 0: padding, then a token id."""
    out = np.pad(words, ((0, 0), (0, 1), (0, max(0, 2 - words.shape[2]))), constant_values=-1)
    out[0, -1, 1] = 0
    return out


_AFTER_PADDING = [("a token id after padding", lambda c: _after_padding(c.token_ids), ValueError)]

for _op, _cases, _ids, _extra in (
    ("apply_allowed_token_ids", allowed_cases(), "allowed", {}),
    (
        "apply_bad_words",
        bad_words_cases(),
        "bad_words",
        {
            "token_ids": _AFTER_PADDING,
            "bad_words": [
                (
                    "a sequence with a token id after padding",
                    lambda c: _word_after_padding(c.bad_words),
                    ValueError,
                )
            ],
        },
    ),
    (
        "apply_no_repeat_ngram",
        no_repeat_cases(),
        "token_ids",
        {
            "token_ids": _AFTER_PADDING,
            "n": [
                ("a negative n", -1, ValueError),
                ("a float n", lambda c: c.n.astype(np.float64), TypeError),
            ],
        },
    ),
):
    add_rows_are_independent(_op, _cases)
    add_common(
        _op,
        _cases,
        _mask_errors(_op, _cases, _ids, _extra),
        lambda case, got, ref: checks.assert_equal(got, ref),
        "Exactly the reference's result (no arithmetic is involved).",
    )


# ================================================================ DRY, XTC and mirostat v2


@st.composite
def dry_cases(draw: Any, enabled: bool = False) -> Case:
    """A small alphabet (repeats are common), breakers from it, settings around their edges;
    often a multiplier or base so large that the penalty overflows the dtype.
    enabled: every row has multiplier > 0 and penalty_last_n != 0."""
    x = draw(logits_arrays())
    b, v = x.shape
    alphabet = min(v, 3)
    tokens = draw(_sequences(b, alphabet, 14, width=draw(st.integers(0, 14))))
    for row in range(b):  # often a loop: a short pattern repeated (long repeats)
        size = len(_listed(tokens[row]))
        if size and draw(st.booleans()):
            pattern = draw(st.lists(st.integers(0, alphabet - 1), min_size=1, max_size=3))
            tokens[row, :size] = (pattern * size)[:size]
    breakers = draw(_sequences(b, alphabet, 2))
    huge = (0.5, 1.0, 3.0, 1e300)  # 1e300: past float32 always, past float64 with the base
    multipliers = st.sampled_from(huge if enabled else (0.0, *huge))
    mult = draw(row_values(b, multipliers, (np.float64,)))
    base = draw(row_values(b, st.sampled_from((1.5, 1.75, 2.0, 1e30)), FLOAT_DTYPES))
    allowed = np.array(draw(st.lists(st.integers(1, 4), min_size=b, max_size=b)))
    windows = st.one_of(st.just(-1), st.integers(1, 10)) if enabled else st.integers(-1, 10)
    last_n = np.array(draw(st.lists(windows, min_size=b, max_size=b)))
    ints = draw(st.sampled_from((np.int64, np.int32)))
    return Case(
        logits=x,
        token_ids=tokens,
        multiplier=mult,
        base=base.astype(np.float64),
        allowed_length=allowed.astype(ints),
        penalty_last_n=last_n.astype(ints),
        sequence_breakers=breakers,
    )


@st.composite
def dry_overflow_cases(draw: Any) -> Case:
    """dry_cases whose first row surely overflows: tokens 0 1 0 1 0 1 0 1 (a repeat that
    token 0 would extend by 7), no breakers, the whole window, allowed_length 1,
    multiplier 1e300 and base 1e30, finite logits."""
    case = draw(dry_cases(enabled=True))
    if case.logits.shape[1] < 2:
        return case
    tokens = np.full((case.token_ids.shape[0], max(8, case.token_ids.shape[1])), -1)
    tokens[:, : case.token_ids.shape[1]] = case.token_ids
    tokens[0] = -1
    tokens[0, :8] = [0, 1] * 4
    breakers = case.sequence_breakers.copy()
    breakers[0] = -1
    x = case.logits.copy()
    x[0] = np.where(np.isfinite(x[0]), x[0], 0)
    for field, value in (("multiplier", 1e300), ("base", 1e30), ("allowed_length", 1)):
        getattr(case, field)[0] = value
    case.penalty_last_n[0] = -1
    return Case(
        logits=x,
        token_ids=tokens.astype(case.token_ids.dtype),
        multiplier=case.multiplier,
        base=case.base,
        allowed_length=case.allowed_length,
        penalty_last_n=case.penalty_last_n,
        sequence_breakers=breakers,
    )


@spec.prop("apply_dry", dry_overflow_cases())
def a_penalty_past_the_dtype_is_clamped_not_masked(ctx: Ctx, case: Case) -> None:
    """A penalty that overflows the logits' dtype (here 1e300 * 1e30^6 on the first row)
    is clamped: every finite logit stays finite."""
    out = np.asarray(call(ctx, "apply_dry", case))
    assert np.isfinite(out[0]).all(), f"row 0 became {out[0]!r}"


def dry_expected(case: Case) -> np.ndarray:
    """The docstring's rule with a brute-force repeat search (`oracles.dry_repeats`)."""
    x = case.logits
    out = x.astype(np.float64).copy()
    for b in range(x.shape[0]):
        mult, last = float(case.multiplier[b]), int(case.penalty_last_n[b])
        if mult == 0 or last == 0:
            continue
        context = _listed(case.token_ids[b])
        if last > 0:
            context = context[-last:]
        floor = int(case.allowed_length[b])
        stops = set(_listed(np.sort(case.sequence_breakers[b])[::-1]))
        for token, n in oracles.dry_repeats(context, stops).items():
            if n >= floor:
                with np.errstate(over="ignore"):
                    penalty = mult * float(np.power(float(case.base[b]), n - floor))
                out[b, token] -= penalty
    with np.errstate(over="ignore"):
        rounded = out.astype(x.dtype)
    lowest = np.finfo(x.dtype).min
    return np.where(np.isfinite(x) & (rounded < lowest), lowest, rounded)


def _dry_compare(case: Case, got: np.ndarray, ref: np.ndarray) -> None:
    checks.assert_close(got, ref, case.logits.dtype, what="DRY logit")


@spec.prop("apply_dry", dry_cases())
def penalises_tokens_that_extend_repeats(ctx: Ctx, case: Case) -> None:
    """A token v that would extend a repeat of n >= allowed_length tokens (the context's last n,
    none a breaker, followed by v, occur earlier; v not a breaker; the last penalty_last_n tokens
    only) loses multiplier * base ** (n - allowed_length), in float64 rounded once, clamped at
    the lowest finite value; nothing else changes."""
    _dry_compare(case, call(ctx, "apply_dry", case), dry_expected(case))


@spec.prop("apply_dry", dry_cases())
def only_lowers_and_never_masks(ctx: Ctx, case: Case) -> None:
    """Finite logits stay finite and never rise; -inf logits stay -inf."""
    out = call(ctx, "apply_dry", case)
    x = case.logits
    checks.assert_masks_equal(out, x, what="DRY -inf positions")
    live = np.isfinite(x)
    assert np.all(out[live] <= x[live]), "DRY raised a logit"


@spec.prop("apply_dry", dry_cases())
def disabled_rows_unchanged(ctx: Ctx, case: Case) -> None:
    """Rows with multiplier == 0 or penalty_last_n == 0 are returned unchanged."""
    out = call(ctx, "apply_dry", case)
    off = (case.multiplier == 0) | (case.penalty_last_n == 0)
    checks.assert_equal(out[off], case.logits[off], what="row with DRY off")


@spec.prop("apply_dry", dry_cases(enabled=True))
def breaker_tokens_are_never_penalised(ctx: Ctx, case: Case) -> None:
    """A sequence breaker keeps its logit, whatever repeats it would extend."""
    out = call(ctx, "apply_dry", case)
    for b, ids in enumerate(case.sequence_breakers):
        listed = [t for t in _listed(np.sort(ids)[::-1])]
        checks.assert_equal(out[b, listed], case.logits[b, listed], what=f"row {b} breakers")


_DRY_WORKED = (
    # breaker 1 ends repeats and is never penalised: "2 3" followed by 1 occurred, yet 1 is
    # spared; "3" followed by 0 occurred, the longer "2 1 3" crosses the breaker and does not
    # count (0 loses base ** (1 - 1), not base ** (3 - 1))
    Case(
        logits=np.zeros((2, 4), np.float32),
        token_ids=np.array([[2, 3, 1, 2, 3, -1, -1], [2, 1, 3, 0, 2, 1, 3]]),
        multiplier=np.array([1.0, 1.0]),
        base=np.array([2.0, 2.0]),
        allowed_length=np.array([1, 1]),
        penalty_last_n=np.array([-1, -1]),
        sequence_breakers=np.array([[1], [1]]),
    ),
)


@spec.prop("apply_dry", st.sampled_from(_DRY_WORKED))
def worked_examples_around_breakers(ctx: Ctx, case: Case) -> None:
    """Hand-made rows where a breaker would extend a repeat and where a repeat would
    cross a breaker: the result is the docstring's rule."""
    _dry_compare(case, call(ctx, "apply_dry", case), dry_expected(case))


_dry_errors = _mask_errors(
    "apply_dry",
    dry_cases(),
    "sequence_breakers",
    {
        "token_ids": _AFTER_PADDING,
        "multiplier": [
            ("a negative multiplier", -1.0, ValueError),
            ("a NaN multiplier", math.nan, ValueError),
            ("an infinite multiplier", math.inf, ValueError),
        ],
        "base": [
            ("base == 1", 1.0, ValueError),
            ("a NaN base", math.nan, ValueError),
        ],
        "allowed_length": [
            ("allowed_length == 0", 0, ValueError),
            ("a float allowed_length", lambda c: c.allowed_length.astype(np.float64), TypeError),
        ],
        "penalty_last_n": [
            ("penalty_last_n == -2", -2, ValueError),
            ("a float penalty_last_n", lambda c: c.penalty_last_n.astype(np.float64), TypeError),
        ],
    },
)
add_rows_are_independent("apply_dry", dry_cases(), masks=False)
add_common(
    "apply_dry",
    dry_cases(),
    _dry_errors,
    _dry_compare,
    "Same -inf entries as the reference, values within the float tolerance (libm's pow).",
)


def xtc_coins(case: Case) -> np.ndarray:
    """Each row's coin: entry vocab + 1 of its Philox stream (an independent Philox)."""
    vocab = case.logits.shape[1]
    return oracles.philox_uniform(as_int64(case.seeds), case.positions, vocab + 2)[:, vocab + 1]


@st.composite
def xtc_cases(draw: Any, probability: str = "any") -> Case:
    """threshold: plain values, or a token's p (or 1e-8 beside it); probability: 'any', 'one',
    or 'coin' (the row's coin, or the next double on either side of it)."""
    x = draw(logits_arrays())
    b, v = x.shape
    plain = st.sampled_from((0.0, 0.05, 0.1, 0.2, 0.3, 0.6))
    t = draw(row_values(b, plain, FLOAT_DTYPES)).astype(np.float64)
    for row in range(b):
        if draw(st.booleans()):
            _, p, _ = oracles.surprisal64(x[row])
            target = float(p[draw(st.integers(0, v - 1))]) * draw(st.sampled_from(NEAR))
            if 0 <= target <= 1:
                t[row] = target
    pos = np.array(draw(st.lists(position_values, min_size=b, max_size=b)), dtype=np.int64)
    case = Case(logits=x, threshold=t, probability=None, seeds=draw(seed_arrays(b)), positions=pos)
    if probability == "one":
        prob = np.ones(b)
    elif probability == "coin":
        coins = xtc_coins(case)
        side = np.array(draw(st.lists(st.sampled_from((-1, 0, 1)), min_size=b, max_size=b)))
        prob = np.where(side == 0, coins, np.nextafter(coins, np.where(side > 0, 2.0, -1.0)))
    else:
        values = st.one_of(st.sampled_from((0.0, 0.5, 1.0)), st.floats(0.0, 1.0))
        prob = draw(row_values(b, values, FLOAT_DTYPES)).astype(np.float64)
    return Case(logits=x, threshold=t, probability=prob, seeds=case.seeds, positions=case.positions)


def xtc_rule(case: Case, b: int) -> tuple[np.ndarray, np.ndarray]:
    """(masked, uncertain) for row b: when the coin is below the probability and two or more
    finite tokens have p >= threshold, those of them above the least likely are masked;
    uncertain: a p within the 1e-9 band of the threshold decides a candidate (then the row's
    decisions may all move), and -inf tokens."""
    row, cut = case.logits[b], float(case.threshold[b])
    _, p, _ = oracles.surprisal64(row)
    finite = np.isfinite(row)
    candidate = finite & (p >= cut)
    near = finite & (np.abs(p - cut) <= checks.BAND * cut)
    fires = xtc_coins(case)[b] < case.probability[b] and candidate.sum() >= 2
    masked = np.zeros(row.size, bool)
    if fires:
        masked = candidate & (row > row[candidate].min())
    uncertain = ~finite | (np.full(row.size, near.any()))
    return masked, uncertain


def _check_xtc(ctx: Ctx, case: Case) -> None:
    out = call(ctx, "apply_xtc", case)
    checks.assert_only_masks(out, case.logits)
    for b in range(case.logits.shape[0]):
        masked, uncertain = xtc_rule(case, b)
        wrong = (np.isneginf(out[b]) & np.isfinite(case.logits[b]) != masked) & ~uncertain
        assert not wrong.any(), (
            f"row {b} token {int(np.argmax(wrong))}: expected "
            f"{'masked' if masked[np.argmax(wrong)] else 'kept'} (threshold "
            f"{float(case.threshold[b])!r}, probability {float(case.probability[b])!r}, coin "
            f"{float(xtc_coins(case)[b])!r})"
        )


@spec.prop("apply_xtc", xtc_cases())
def removes_the_top_choices_but_the_least(ctx: Ctx, case: Case) -> None:
    """When the row's coin u < probability and two or more tokens have p >= threshold, every one
    of them above the least likely is masked (ties with it kept); else nothing changes."""
    _check_xtc(ctx, case)


@spec.prop("apply_xtc", xtc_cases("coin"))
def coin_is_philox_entry_vocab_plus_one(ctx: Ctx, case: Case) -> None:
    """The coin is philox_uniform(seed, position, vocab + 2)[vocab + 1]: a probability equal to
    it, or the next double below, does not fire; the next double above does."""
    _check_xtc(ctx, case)


@spec.prop("apply_xtc", xtc_cases("one"))
def probability_one_keeps_one_candidate(ctx: Ctx, case: Case) -> None:
    """With probability 1, a row where two or more tokens pass the threshold keeps exactly the
    least likely of them (and its ties) and every token below the threshold."""
    _check_xtc(ctx, case)


@spec.prop("apply_xtc", xtc_cases())
def probability_zero_changes_nothing(ctx: Ctx, case: Case) -> None:
    """Rows with probability == 0 are returned unchanged."""
    out = call(ctx, "apply_xtc", case)
    off = case.probability == 0
    checks.assert_equal(out[off], case.logits[off], what="row with probability 0")


def _xtc_band(row: np.ndarray, case: Case, b: int) -> np.ndarray:
    return xtc_rule(case, b)[1][None]


def _xtc_compare(case: Case, got: np.ndarray, ref: np.ndarray) -> None:
    allowed = np.array([xtc_rule(case, b)[1] for b in range(case.logits.shape[0])])
    checks.assert_masks_equal(got, ref, allowed.reshape(got.shape), what="XTC decision")
    checks.assert_only_masks(got, case.logits)


add_rows_are_independent("apply_xtc", xtc_cases(), _xtc_band)
add_common(
    "apply_xtc",
    xtc_cases(),
    logits_errors(
        xtc_cases(),
        SHAPES["apply_xtc"],
        {
            "threshold": [
                ("a negative threshold", -0.1, ValueError),
                ("threshold > 1", 1.5, ValueError),
                ("a NaN threshold", math.nan, ValueError),
            ],
            "probability": [
                ("a negative probability", -0.1, ValueError),
                ("probability > 1", 1.5, ValueError),
                ("a NaN probability", math.nan, ValueError),
            ],
            "seeds": [("float seeds", lambda c: c.seeds.astype(np.float64), TypeError)],
            "positions": [("a negative position", -1, ValueError)],
        },
    ),
    _xtc_compare,
    "Same mask as the reference except rows with a p inside the 1e-9 band of the threshold; "
    "kept values exact.",
    boundary=lambda args: np.array(
        [
            xtc_rule(Case(**dict(zip(SHAPES["apply_xtc"].args, args, strict=True))), b)[1]
            for b in range(args[0].shape[0])
        ]
    ),
)


@st.composite
def mirostat_cases(draw: Any) -> Case:
    """mu: plain values (+inf disables, negative keeps only the max), or a token's surprise in
    bits (or 1e-8 beside it)."""
    x = draw(logits_arrays())
    plain = st.one_of(
        st.sampled_from((math.inf, -1.0, 0.0, 1.0, 3.0, 5.0, 10.0)), st.floats(-2.0, 20.0)
    )
    mu = draw(row_values(x.shape[0], plain, FLOAT_DTYPES)).astype(np.float64)
    for b, row in enumerate(x):
        if draw(st.booleans()):
            q, _, _ = oracles.surprisal64(row)
            s = -float(q[draw(st.integers(0, row.size - 1))]) / math.log(2)
            if math.isfinite(s):
                mu[b] = s * draw(st.sampled_from(NEAR))
    return Case(logits=x, mu=mu)


def mirostat_rule(row: np.ndarray, mu: float) -> tuple[np.ndarray, np.ndarray]:
    """(masked, uncertain): masked iff the surprise -log2 p > mu and not tied for the max."""
    return _cutoff_rule(row, 2.0**-mu)


@spec.prop("apply_mirostat", mirostat_cases())
def masks_tokens_more_surprising_than_mu(ctx: Ctx, case: Case) -> None:
    """A token is masked iff -log2 p > mu (float64, strict; 1e-9 band on p against 2 ** -mu) and
    it is not tied for the max."""
    _check_rule(ctx, "apply_mirostat", case, mirostat_rule, "mu", keeps=False)


@spec.prop("apply_mirostat", mirostat_cases(), name="never_masks_most_likely_token")
def mirostat_keeps_max(ctx: Ctx, case: Case) -> None:
    """Tokens tied for the row's largest logit are never masked, whatever mu."""
    out = call(ctx, "apply_mirostat", case)
    for b, row in enumerate(case.logits):
        assert np.isfinite(out[b][row == finite_max(row)]).all(), f"row {b}: masked a max"


@spec.prop("apply_mirostat", mirostat_cases())
def infinite_mu_changes_nothing(ctx: Ctx, case: Case) -> None:
    """Rows with mu == +inf are returned unchanged."""
    out = call(ctx, "apply_mirostat", case)
    off = case.mu == math.inf
    checks.assert_equal(out[off], case.logits[off], what="row with mu == +inf")


add_rows_are_independent("apply_mirostat", mirostat_cases(), _band(mirostat_rule, "mu"))
add_common(
    "apply_mirostat",
    mirostat_cases(),
    logits_errors(
        mirostat_cases(),
        SHAPES["apply_mirostat"],
        {
            "mu": [
                ("a NaN mu", math.nan, ValueError),
                ("a boolean mu", lambda c: np.ones(c.logits.shape[0], bool), TypeError),
            ]
        },
    ),
    _rule_compare(mirostat_rule, "mu"),
    "Same mask as the reference except tokens whose p is within 1e-9 of 2 ** -mu; kept values "
    "exact.",
)


@st.composite
def mirostat_update_cases(draw: Any) -> Case:
    """A finite token per row, mu around 2 * tau, tau and eta across their ranges."""
    x = draw(logits_arrays())
    b = x.shape[0]
    sampled = np.array(
        [draw(st.sampled_from(np.flatnonzero(np.isfinite(row)).tolist())) for row in x]
    )
    tau = draw(row_values(b, st.sampled_from((0.5, 3.0, 5.0, 8.0)), FLOAT_DTYPES))
    eta = draw(row_values(b, st.sampled_from((0.05, 0.1, 0.5, 1.0)), FLOAT_DTYPES))
    mu = draw(row_values(b, st.floats(-5.0, 20.0), FLOAT_DTYPES))
    return Case(
        logits=x,
        sampled=sampled.astype(draw(st.sampled_from((np.int64, np.int32)))),
        mu=mu.astype(np.float64),
        tau=tau.astype(np.float64),
        eta=eta.astype(np.float64),
    )


def mirostat_updated(case: Case) -> np.ndarray:
    """mu - eta * (-log2 p(sampled) - tau) per row, from an independent log_softmax."""
    out = []
    for b, row in enumerate(case.logits):
        q, _, _ = oracles.surprisal64(row)
        surprise = -float(q[int(case.sampled[b])]) / math.log(2)
        out.append(float(case.mu[b]) - float(case.eta[b]) * (surprise - float(case.tau[b])))
    return np.array(out)


def _update_compare(case: Case, got: Any, ref: Any) -> None:
    scale = row_magnitude(case.logits, (case.logits.shape[0],)) + np.abs(case.mu) + case.tau
    checks.assert_close(np.asarray(got), np.asarray(ref), np.float64, scale * 1e3)


@spec.prop("mirostat_update", mirostat_update_cases())
def moves_mu_by_the_surprise_error(ctx: Ctx, case: Case) -> None:
    """The result is mu - eta * (-log2 softmax(logits)[sampled] - tau), in float64 (within a few
    ulp of the operands' scale)."""
    _update_compare(case, call(ctx, "mirostat_update", case), mirostat_updated(case))


@spec.prop("mirostat_update", mirostat_update_cases())
def returns_float64_per_row(ctx: Ctx, case: Case) -> None:
    """The result is a float64 array of shape (batch,) in the logits' library."""
    args = [ctx.convert(a) for a in SHAPES["mirostat_update"].call_args(case)]
    out = ctx.fn("mirostat_update")(*args)
    problem = checks.same_library(out, args[0])
    assert problem is None, f"result {problem}"
    assert checks.dtype_name(out) == "float64", f"result has dtype {checks.dtype_name(out)}"
    assert tuple(out.shape) == (case.logits.shape[0],), f"result has shape {tuple(out.shape)}"


def _masked_pick(case: Case) -> np.ndarray:
    """A logits copy where row 0's sampled token is -inf (another entry made finite)."""
    x = case.logits.copy()
    token = int(case.sampled[0])
    if np.isfinite(x[0]).sum() == 1:
        x[0, (token + 1) % x.shape[1]] = 0.0
    x[0, token] = NEG_INF
    return x


def _with_masked_pick(cases: ErrorCases) -> ErrorCases:
    """The error cases, and one more: row 0's sampled token is -inf in its row."""
    args = (_masked_pick(cases.base), *_UPDATE.call_args(cases.base)[1:])
    masked = ErrorCase(ValueError, "a sampled token that is -inf in its row", args)
    return ErrorCases(cases.base, [*cases, masked])


_UPDATE = SHAPES["mirostat_update"]
add_does_not_modify_inputs(spec, _UPDATE, mirostat_update_cases())
add_rejects_invalid_input(
    spec,
    _UPDATE,
    logits_errors(
        mirostat_update_cases(),
        _UPDATE,
        {
            "sampled": [
                (
                    "a sampled id == vocab",
                    lambda c: np.full_like(c.sampled, c.logits.shape[1]),
                    ValueError,
                ),
                ("a negative sampled id", -1, ValueError),
                ("float sampled ids", lambda c: c.sampled.astype(np.float64), TypeError),
            ],
            "mu": [("an infinite mu", math.inf, ValueError), ("a NaN mu", math.nan, ValueError)],
            "tau": [("tau == 0", 0.0, ValueError), ("a NaN tau", math.nan, ValueError)],
            "eta": [("eta == 0", 0.0, ValueError), ("eta > 1", 1.5, ValueError)],
        },
    ).map(_with_masked_pick),
)
add_matches_reference(
    spec,
    _UPDATE,
    mirostat_update_cases(),
    _update_compare,
    "Within a few ulp of the reference's float64 (exp and log differ in the last bit).",
)
add_accepts_strided_input(spec, _UPDATE, mirostat_update_cases())
