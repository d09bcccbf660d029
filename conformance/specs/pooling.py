"""Properties of `ops.pooling` (see `pyagent_ref/ops/pooling.py` for the contract).

Batches of 0-5 requests of 1-6 rows each, 0-2 padding rows after them, hidden sizes
1-12, values in [-4, 4] with exact ties (a coarse grid) or spread, in float16, float32
or float64. Rows to normalise and logits are drawn the same way (logits up to +-120, so
a softmax without the max subtracted overflows in float32), with zero rows among them;
Matryoshka dimensions anywhere in [1, features].

Tolerances: "last", "cls" and "all" copy rows (exact after the cast to the compute
dtype). A mean, a norm or a dot product is a sum of n terms: |got - want| <= T * (n + 2)
* (the sum of the terms' magnitudes) / divisor, T = 2 ** -23 for float32 compute and
2 ** -52 for float64, against a float64 oracle. Softmax and sigmoid entries: T * 8 *
(1 + max |x| of the row) relative, plus 2 ** -120 (2 ** -1000) for subnormal results.
"""

from __future__ import annotations

from typing import Any

import hypothesis.extra.numpy as hnp
import numpy as np
from hypothesis import strategies as st

import pyagent_ref.ops.pooling  # noqa: F401 - binds pyagent_ref.ops.pooling for the reference

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

OPS = contract.names("pooling")
DTYPES = (np.float16, np.float32, np.float64)
EPS = {"float32": 2.0**-23, "float64": 2.0**-52}
TINY = {"float32": 2.0**-120, "float64": 2.0**-1000}  # subnormal results lose precision
GRID = (-2.0, -1.0, -0.5, 0.0, 0.5, 1.0, 2.0)

spec = Spec("pooling", OPS)
SHAPES = reference_shapes("pooling")


def compute_name(*arrays: np.ndarray) -> str:
    return "float64" if all(a.dtype == np.float64 for a in arrays) else "float32"


# --- strategies -----------------------------------------------------------------------------


def values(draw: Any, dtype: Any, shape: tuple[int, ...], bound: float = 4.0) -> np.ndarray:
    width = {np.float16: 16, np.float32: 32, np.float64: 64}[np.dtype(dtype).type]
    if draw(st.booleans(), label="on a grid"):
        elements = st.sampled_from(GRID)
    else:
        elements = st.one_of(st.sampled_from(GRID), st.floats(-bound, bound, width=width))
    return draw(hnp.arrays(np.dtype(dtype), shape, elements=elements))


@st.composite
def pool_cases(draw: Any, pooling_type: str | None = None) -> Case:
    lens = draw(st.lists(st.integers(1, 6), min_size=0, max_size=5))
    pad = draw(st.integers(0, 2))
    size = draw(st.integers(1, 12))
    dtype = draw(st.sampled_from(DTYPES))
    qsl = np.concatenate([[0], np.cumsum(lens)]).astype(draw(st.sampled_from((np.int32, np.int64))))
    return Case(
        hidden=values(draw, dtype, (int(qsl[-1]) + pad, size)),
        query_start_loc=qsl,
        pooling_type=pooling_type or draw(st.sampled_from(("last", "cls", "mean", "all"))),
    )


@st.composite
def rows_cases(draw: Any, bound: float = 4.0, min_features: int = 1) -> np.ndarray:
    rows, features = draw(st.integers(0, 5)), draw(st.integers(min_features, 12))
    x = values(draw, draw(st.sampled_from(DTYPES)), (rows, features), bound)
    if rows and draw(st.booleans()):
        x[draw(st.integers(0, rows - 1))] = 0  # a zero row
    return x


@st.composite
def normalize_cases(draw: Any) -> Case:
    x = draw(rows_cases())
    dims = draw(st.one_of(st.none(), st.integers(1, x.shape[1])))
    return Case(x=x, dimensions=dims)


@st.composite
def classify_cases(draw: Any, activation: str | None = None) -> Case:
    logits = draw(rows_cases(bound=120.0))
    return Case(
        logits=logits,
        activation=activation or draw(st.sampled_from(("softmax", "sigmoid", "none"))),
    )


@st.composite
def cosine_cases(draw: Any) -> Case:
    a = draw(rows_cases())
    b = values(draw, draw(st.sampled_from(DTYPES)), a.shape)
    if a.shape[0] and draw(st.booleans()):
        b[0] = a[0] * draw(st.sampled_from((2.0, -0.5)))  # parallel rows: cosine +-1
    return Case(a=a, b=b)


def call(ctx: Ctx, op: str, case: Case, **changes: Any) -> np.ndarray:
    args = {name: getattr(case, name) for name in SHAPES[op].args} | changes
    return ctx.call(op, *args.values())


def spans(case: Case) -> list[tuple[int, int]]:
    q = [int(v) for v in case.query_start_loc]
    return list(zip(q[:-1], q[1:], strict=True))


# --- oracles --------------------------------------------------------------------------------


def pool_oracle(case: Case) -> tuple[np.ndarray, np.ndarray]:
    """(the pooled rows in float64, their tolerance)."""
    h = case.hidden.astype(np.float64)
    t = EPS[compute_name(case.hidden)]
    size = h.shape[1]
    if case.pooling_type == "all":
        rows = [h[s:e] for s, e in spans(case)]
        out = np.concatenate(rows) if rows else np.zeros((0, size))
        return out, np.zeros(out.shape)
    out, tol = np.zeros((len(spans(case)), size)), np.zeros((len(spans(case)), size))
    for r, (s, e) in enumerate(spans(case)):
        if case.pooling_type == "mean":
            out[r] = h[s:e].mean(axis=0)
            tol[r] = t * (e - s + 2) * np.abs(h[s:e]).sum(axis=0) / (e - s)
        else:
            out[r] = h[e - 1] if case.pooling_type == "last" else h[s]
    return out, tol


def normalize_oracle(case: Case) -> tuple[np.ndarray, np.ndarray]:
    x = case.x.astype(np.float64)[:, : case.dimensions]
    norms = np.sqrt((x * x).sum(axis=1, keepdims=True))
    t = EPS[compute_name(case.x)]
    tol = t * (x.shape[1] + 4) * np.ones(x.shape)
    return x / np.maximum(norms, 1e-12), tol


def classify_oracle(case: Case) -> tuple[np.ndarray, np.ndarray]:
    x = case.logits.astype(np.float64)
    t = EPS[compute_name(case.logits)]
    scale = 8 * (1 + (np.abs(x).max(axis=1, keepdims=True) if x.size else 0))
    if case.activation == "softmax":
        e = np.exp(x - x.max(axis=1, keepdims=True)) if x.size else x
        want = e / e.sum(axis=1, keepdims=True) if x.size else x
        return want, t * scale * want + t * 4
    if case.activation == "sigmoid":
        want = 1 / (1 + np.exp(-x))
        return want, t * scale * want + TINY[compute_name(case.logits)]
    return x, np.zeros(x.shape)


def cosine_oracle(case: Case) -> tuple[np.ndarray, np.ndarray]:
    a, b = case.a.astype(np.float64), case.b.astype(np.float64)
    na = np.maximum(np.sqrt((a * a).sum(axis=1)), 1e-8)
    nb = np.maximum(np.sqrt((b * b).sum(axis=1)), 1e-8)
    want = (a * b).sum(axis=1) / (na * nb)
    t = EPS[compute_name(case.a, case.b)]
    bound = (np.abs(a) * np.abs(b)).sum(axis=1) / (na * nb)
    return want, t * (a.shape[1] + 6) * (bound + 1)


# ====================================================================================== pool


@spec.prop("pool", pool_cases(), name="returns_documented_types")
def pool_returns_documented_types(ctx: Ctx, case: Case) -> None:
    """A new array in hidden's library: float32 (float64 for float64 hidden), shape
    (num_reqs, hidden_size), or (rows of the spans, hidden_size) for "all"."""
    hidden = ctx.convert(case.hidden)
    out = ctx.fn("pool")(hidden, ctx.convert(case.query_start_loc), case.pooling_type)
    problem = checks.same_library(out, hidden)
    assert problem is None, f"result {problem}"
    got = call(ctx, "pool", case)
    want, _ = pool_oracle(case)
    checks.assert_shape_dtype(got, want.shape, compute_name(case.hidden), "pooled")


@spec.prop("pool", pool_cases())
def equals_the_reduction_of_each_span(ctx: Ctx, case: Case) -> None:
    """ "last" and "cls" give the span's last and first row, "all" its rows, exactly (after
    the cast); "mean" the average of the span's rows within the float tolerance."""
    got = call(ctx, "pool", case)
    want, tol = pool_oracle(case)
    assert_within(got, want, tol, f"{case.pooling_type} pooling")


@spec.prop("pool", pool_cases())
def batch_invariant(ctx: Ctx, case: Case) -> None:
    """A request's result is bit-identical whether it is pooled alone (its rows only) or in
    the batch: it reads only its own span, never the padding or its neighbours."""
    got = call(ctx, "pool", case)
    at = 0
    for s, e in spans(case):
        alone = call(
            ctx,
            "pool",
            case,
            hidden=case.hidden[s:e].copy(),
            query_start_loc=np.array([0, e - s], case.query_start_loc.dtype),
        )
        n = alone.shape[0]
        checks.assert_equal(got[at : at + n], alone, what=f"span [{s}, {e}) pooled in the batch")
        at += n


@spec.prop("pool", pool_cases(pooling_type="mean"))
def mean_of_equal_rows_is_the_row(ctx: Ctx, case: Case) -> None:
    """The mean of a span whose rows are all equal is that row, exactly when the row's
    entries are on a coarse grid (every partial sum is exact)."""
    hidden = case.hidden.copy()
    grid = np.resize(np.array(GRID, hidden.dtype), hidden.shape[1])
    for s, e in spans(case):
        hidden[s:e] = grid
    got = call(ctx, "pool", case, hidden=hidden)
    want = np.broadcast_to(grid.astype(np.float64), got.shape)
    checks.assert_equal(got.astype(np.float64), want, what="mean of equal rows")


def pool_errors(case: Case) -> list[tuple[str, tuple[Any, ...], type]]:
    h, qsl = case.hidden, case.query_start_loc
    empty = np.concatenate([qsl[:1], qsl]).astype(qsl.dtype)  # request 0 gets no row
    past = qsl.copy()
    past[-1] = h.shape[0] + 1
    options = [
        ("integer hidden", {"hidden": np.zeros(h.shape, np.int64)}, TypeError),
        ("1-D hidden", {"hidden": h[:, 0]}, ValueError),
        ("float query_start_loc", {"query_start_loc": qsl.astype(np.float64)}, TypeError),
        ("2-D query_start_loc", {"query_start_loc": qsl[None, :]}, ValueError),
        ("a request without rows", {"query_start_loc": empty}, ValueError),
        ("query_start_loc past the rows", {"query_start_loc": past}, ValueError),
        ("unknown pooling_type", {"pooling_type": "max"}, ValueError),
    ]
    out = []
    for why, change, exc in options:
        args = {name: getattr(case, name) for name in SHAPES["pool"].args} | change
        out.append((why, tuple(args.values()), exc))
    return out


def _compare_pool(case: Case, got: Any, ref: Any) -> None:
    assert got.dtype == ref.dtype, f"dtype {got.dtype}, the reference's {ref.dtype}"
    _, tol = pool_oracle(case)
    assert_within(got, ref, 2 * tol, "pooled")


add_does_not_modify_inputs(spec, SHAPES["pool"], pool_cases())
add_rejects_invalid_input(
    spec,
    SHAPES["pool"],
    error_variants(pool_cases().filter(lambda c: c.query_start_loc.shape[0] > 1), pool_errors),
)
add_matches_reference(
    spec,
    SHAPES["pool"],
    pool_cases(),
    _compare_pool,
    "The reference's rows: exact for last, cls and all, within the tolerance for mean.",
)


# ================================================================================= normalize


@spec.prop("normalize", normalize_cases())
def rows_have_unit_norm_and_keep_their_direction(ctx: Ctx, case: Case) -> None:
    """Each row is the (truncated) input row divided by max(its norm, 1e-12): unit norm
    (zero rows stay zero), the input's direction, within the tolerance of the float64
    oracle; shape (rows, dimensions or features) in the compute dtype."""
    got = call(ctx, "normalize", case)
    want, tol = normalize_oracle(case)
    checks.assert_shape_dtype(got, want.shape, compute_name(case.x), "normalized")
    assert_within(got, want, tol, "normalized rows")


@spec.prop("normalize", normalize_cases().filter(lambda c: c.dimensions is not None))
def matryoshka_truncates_before_normalizing(ctx: Ctx, case: Case) -> None:
    """normalize(x, d) equals normalize(x[:, :d]) bit for bit: the prefix is renormalised,
    not cut from the normalised row."""
    got = call(ctx, "normalize", case)
    want = call(
        ctx,
        "normalize",
        case,
        x=np.ascontiguousarray(case.x[:, : case.dimensions]),
        dimensions=None,
    )
    checks.assert_equal(got, want, what="normalize(x, d) against normalize(x[:, :d])")


def normalize_errors(case: Case) -> list[tuple[str, tuple[Any, ...], type]]:
    x = case.x
    return [
        ("integer x", (np.zeros(x.shape, np.int64), None), TypeError),
        ("1-D x", (x[0], None) if x.shape[0] else (np.zeros(3, x.dtype), None), ValueError),
        ("dimensions 0", (x, 0), ValueError),
        ("dimensions past the features", (x, x.shape[1] + 1), ValueError),
        ("float dimensions", (x, 1.0), TypeError),
        ("bool dimensions", (x, True), TypeError),
    ]


def _compare_normalize(case: Case, got: Any, ref: Any) -> None:
    assert got.dtype == ref.dtype, f"dtype {got.dtype}, the reference's {ref.dtype}"
    _, tol = normalize_oracle(case)
    assert_within(got, ref, 2 * tol, "normalized rows")


add_does_not_modify_inputs(spec, SHAPES["normalize"], normalize_cases())
add_rejects_invalid_input(
    spec, SHAPES["normalize"], error_variants(normalize_cases(), normalize_errors)
)
add_matches_reference(
    spec,
    SHAPES["normalize"],
    normalize_cases(),
    _compare_normalize,
    "The reference's rows within twice the oracle's tolerance.",
)


# ================================================================================== classify


@spec.prop("classify", classify_cases())
def equals_softmax_sigmoid_or_identity(ctx: Ctx, case: Case) -> None:
    """softmax over each row, sigmoid of each entry, or the scores themselves ("none"),
    as a float64 oracle gives them, even for logits far beyond exp's float32 range; shape
    of logits, compute dtype."""
    got = call(ctx, "classify", case)
    want, tol = classify_oracle(case)
    checks.assert_shape_dtype(got, want.shape, compute_name(case.logits), "probabilities")
    assert_within(got, want, tol, f"{case.activation} of the logits")


@spec.prop("classify", classify_cases(activation="softmax"))
def softmax_is_shift_invariant(ctx: Ctx, case: Case) -> None:
    """Adding a constant to a row (exactly representable: a power of two on integer
    logits) does not change its softmax beyond the tolerance; rows sum to 1."""
    logits = np.round(case.logits.astype(np.float64)).astype(case.logits.dtype)
    got = call(ctx, "classify", case, logits=logits)
    shifted = call(ctx, "classify", case, logits=(logits + 16).astype(logits.dtype))
    want, tol = classify_oracle(Case(logits=logits, activation="softmax"))
    assert_within(shifted, got, 2 * tol, "softmax of the shifted row")
    if got.size:
        assert_within(got.sum(axis=1), np.ones(got.shape[0]), 64 * EPS["float32"], "row sums")


def classify_errors(case: Case) -> list[tuple[str, tuple[Any, ...], type]]:
    x = case.logits
    out = [
        ("integer logits", (np.zeros(x.shape, np.int64), case.activation), TypeError),
        ("logits without labels", (x[:, :0], case.activation), ValueError),
        ("unknown activation", (x, "relu"), ValueError),
    ]
    if x.size:
        nan = x.copy()
        nan[-1, 0] = np.nan
        inf = x.copy()
        inf[0, -1] = np.inf
        out += [("a NaN logit", (nan, case.activation), ValueError)]
        out += [("an infinite logit", (inf, case.activation), ValueError)]
    return out


def _compare_classify(case: Case, got: Any, ref: Any) -> None:
    assert got.dtype == ref.dtype, f"dtype {got.dtype}, the reference's {ref.dtype}"
    _, tol = classify_oracle(case)
    assert_within(got, ref, 2 * tol, "probabilities")


add_does_not_modify_inputs(spec, SHAPES["classify"], classify_cases())
add_rejects_invalid_input(
    spec, SHAPES["classify"], error_variants(classify_cases(), classify_errors)
)
add_matches_reference(
    spec,
    SHAPES["classify"],
    classify_cases(),
    _compare_classify,
    "The reference's probabilities within twice the oracle's tolerance.",
)


# ========================================================================= cosine_similarity


@spec.prop("cosine_similarity", cosine_cases())
def equals_the_cosine_of_each_row_pair(ctx: Ctx, case: Case) -> None:
    """cos[i] = a[i] . b[i] / (max(|a[i]|, 1e-8) max(|b[i]|, 1e-8)) within the tolerance
    (0 for a zero row, +-1 for parallel rows); shape (rows,), compute dtype."""
    got = call(ctx, "cosine_similarity", case)
    want, tol = cosine_oracle(case)
    checks.assert_shape_dtype(got, want.shape, compute_name(case.a, case.b), "cosines")
    assert_within(got, want, tol, "cosine")


@spec.prop("cosine_similarity", cosine_cases())
def symmetric_and_scale_invariant(ctx: Ctx, case: Case) -> None:
    """cos(a, b) = cos(b, a), and scaling a row of a by 4 (exact) leaves its cosine
    unchanged within the tolerance."""
    got = call(ctx, "cosine_similarity", case)
    swapped = call(ctx, "cosine_similarity", case, a=case.b, b=case.a)
    _, tol = cosine_oracle(case)
    assert_within(swapped, got, 2 * tol, "cos(b, a) against cos(a, b)")
    scaled = call(ctx, "cosine_similarity", case, a=(case.a * 4).astype(case.a.dtype))
    assert_within(scaled, got, 2 * tol, "cos(4a, b) against cos(a, b)")


def cosine_errors(case: Case) -> list[tuple[str, tuple[Any, ...], type]]:
    a, b = case.a, case.b
    return [
        ("integer a", (np.zeros(a.shape, np.int64), b), TypeError),
        ("integer b", (a, np.zeros(b.shape, np.int64)), TypeError),
        ("1-D a", (np.zeros(a.shape[1], a.dtype), b), ValueError),
        ("b one feature wider", (a, np.zeros((a.shape[0], a.shape[1] + 1), b.dtype)), ValueError),
        ("b one row longer", (a, np.zeros((a.shape[0] + 1, a.shape[1]), b.dtype)), ValueError),
    ]


def _compare_cosine(case: Case, got: Any, ref: Any) -> None:
    assert got.dtype == ref.dtype, f"dtype {got.dtype}, the reference's {ref.dtype}"
    _, tol = cosine_oracle(case)
    assert_within(got, ref, 2 * tol, "cosine")


add_does_not_modify_inputs(spec, SHAPES["cosine_similarity"], cosine_cases())
add_rejects_invalid_input(
    spec, SHAPES["cosine_similarity"], error_variants(cosine_cases(), cosine_errors)
)
add_matches_reference(
    spec,
    SHAPES["cosine_similarity"],
    cosine_cases(),
    _compare_cosine,
    "The reference's cosines within twice the oracle's tolerance.",
)
