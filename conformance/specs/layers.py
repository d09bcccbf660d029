"""Properties of `ops.layers` (see `pyagent_ref/ops/layers.py` for the contract).

Inputs are float32 or float64 arrays of 1-3 axes (leading axes 1-4, hidden 1-32), values
in [-8, 8] with exact zeros and ties, eps from 1e-6 to 0.5, with and without a residual.
The oracle recomputes each formula in float64. Tolerance (both the oracle and the
differential check): |got - want| <= TOL[dtype] * (|want| + scale), TOL = 2e-6 for float32
and 1e-12 for float64, `scale` the magnitude of the operands (|weight| for rms_norm,
|silu(gate)| * |up| + 1 for silu_and_mul): the spec computes in float32 and then rounds,
so only a few ulps of reordered reductions are allowed. Norms add GRID[dtype], two steps of
the dtype's subnormal grid: a result below the smallest normal is rounded to that grid,
where a relative tolerance is smaller than one step (a weight of 1e-45 in float32).
"""

from __future__ import annotations

from typing import Any

import hypothesis.extra.numpy as hnp
import numpy as np
from hypothesis import strategies as st

import pyagent_ref.ops.layers  # noqa: F401 - binds pyagent_ref.ops.layers for the reference

from .. import checks, contract
from ..core import Case, Ctx, Spec
from ._common import (
    FLOAT_DTYPES,
    add_does_not_modify_inputs,
    add_matches_reference,
    add_rejects_invalid_input,
    assert_within,
    check_like_input,
    error_variants,
    reference_shapes,
)

OPS = contract.names("layers")
TOL = {"float32": 2e-6, "float64": 1e-12}

spec = Spec("layers", OPS)

SHAPES = reference_shapes("layers")


def tol(dtype: Any) -> float:
    return TOL[np.dtype(dtype).name]


def grid(dtype: Any) -> float:
    """Two steps of the dtype's subnormal grid (the absolute floor of a rounded result)."""
    return 2 * float(np.finfo(dtype).smallest_subnormal)


# --- strategies -----------------------------------------------------------------------------


def values(dtype: Any, bound: float = 8.0) -> Any:
    width = 32 if np.dtype(dtype) == np.float32 else 64
    return st.one_of(
        st.sampled_from((0.0, 1.0, -1.0, 0.5, -2.0)), st.floats(-bound, bound, width=width)
    )


@st.composite
def float_arrays(draw: Any, dtype: Any, last: int) -> np.ndarray:
    lead = draw(st.lists(st.integers(1, 4), min_size=0, max_size=2))
    return draw(hnp.arrays(np.dtype(dtype), (*lead, last), elements=values(dtype)))


@st.composite
def rms_cases(draw: Any, residual: bool | None = None, unit_weight: bool = False) -> Case:
    dtype = draw(st.sampled_from(FLOAT_DTYPES))
    hidden = draw(st.integers(1, 32))
    x = draw(float_arrays(dtype, hidden))
    if unit_weight:
        weight = np.ones(hidden, dtype)
    else:
        weight = draw(hnp.arrays(np.dtype(dtype), (hidden,), elements=values(dtype, 4.0)))
    with_res = draw(st.booleans()) if residual is None else residual
    res = draw(hnp.arrays(np.dtype(dtype), x.shape, elements=values(dtype))) if with_res else None
    eps = draw(st.sampled_from((1e-6, 1e-5, 1e-3, 0.5)))
    return Case(x=x, weight=weight, eps=eps, residual=res)


@st.composite
def silu_cases(draw: Any) -> Case:
    dtype = draw(st.sampled_from(FLOAT_DTYPES))
    d = draw(st.integers(1, 16))
    return Case(x=draw(float_arrays(dtype, 2 * d)))


def call(ctx: Ctx, op: str, case: Case) -> Any:
    return ctx.call(op, *SHAPES[op].call_args(case))


# --- oracles --------------------------------------------------------------------------------


def rms_oracle(case: Case) -> tuple[np.ndarray, np.ndarray]:
    """(normalised before the weight, h) in float64, h = x (+ residual) in x's dtype."""
    h = case.x if case.residual is None else case.x + case.residual
    h64 = h.astype(np.float64)
    return h64 / np.sqrt(np.mean(h64 * h64, axis=-1, keepdims=True) + case.eps), h


def silu_oracle(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(silu(gate) * up in float64, its operands' magnitude)."""
    d = x.shape[-1] // 2
    g, u = x[..., :d].astype(np.float64), x[..., d:].astype(np.float64)
    s = g / (1.0 + np.exp(-g))
    return s * u, np.abs(s) * np.abs(u)


# ================================================================================== rms_norm


@spec.prop("rms_norm", rms_cases())
def matches_the_formula(ctx: Ctx, case: Case) -> None:
    """y = weight * x / sqrt(mean(x**2, last axis) + eps) (x + residual with a residual),
    within TOL[dtype] * (|y| + |weight|) + GRID[dtype] of a float64 oracle."""
    out = call(ctx, "rms_norm", case)
    if case.residual is not None:
        out = out[0]
    normed, _ = rms_oracle(case)
    w = case.weight.astype(np.float64)
    want = w * normed
    t = tol(case.x.dtype)
    scale = np.abs(want) + np.abs(w) * (1 + np.abs(normed))
    assert_within(out, want, t * scale + grid(case.x.dtype), "rms_norm")


@spec.prop("rms_norm", rms_cases(unit_weight=True))
def unit_rms_before_the_weight(ctx: Ctx, case: Case) -> None:
    """With weight = 1, each row's mean square is ms / (ms + eps) (ms the input row's mean
    square): unit RMS up to eps, exact zeros for an all-zero row."""
    out = call(ctx, "rms_norm", case)
    if case.residual is not None:
        out = out[0]
    _, h = rms_oracle(case)
    ms = np.mean(h.astype(np.float64) ** 2, axis=-1)
    got = np.mean(out.astype(np.float64) ** 2, axis=-1)
    assert_within(got, ms / (ms + case.eps), 8 * tol(case.x.dtype), "mean square of a row")


@spec.prop("rms_norm", rms_cases(residual=True))
def residual_is_fused(ctx: Ctx, case: Case) -> None:
    """With a residual: returns (rms_norm(x + residual), x + residual); the new residual is
    exactly the sum in x's dtype."""
    out = call(ctx, "rms_norm", case)
    assert isinstance(out, tuple) and len(out) == 2, f"returned {type(out).__name__}"
    h = case.x + case.residual
    checks.assert_equal(out[1], h, what="new residual")
    alone = ctx.call("rms_norm", h, case.weight, case.eps)
    scale = np.abs(alone) + np.abs(case.weight)
    assert_within(out[0], alone, tol(h.dtype) * scale + grid(h.dtype), "normed")


@spec.prop("rms_norm", rms_cases(), name="returns_documented_types")
def rms_returns_documented_types(ctx: Ctx, case: Case) -> None:
    """An array like x (library, device, dtype, shape), or a pair of them with a residual."""
    args = [ctx.convert(a) for a in SHAPES["rms_norm"].call_args(case)]
    out = ctx.fn("rms_norm")(*args)
    if case.residual is None:
        check_like_input(out, args[0])
    else:
        assert isinstance(out, tuple) and len(out) == 2, f"returned {type(out).__name__}"
        check_like_input(out[0], args[0], "normalised")
        check_like_input(out[1], args[0], "new residual")


def rms_errors(case: Case) -> list[tuple[str, tuple[Any, ...], type]]:
    x, w, eps, res = case.x, case.weight, case.eps, case.residual
    return [
        ("integer x", (np.zeros(x.shape, np.int64), w, eps, res), TypeError),
        ("integer weight", (x, np.ones(w.shape, np.int32), eps, res), TypeError),
        ("weight one longer", (x, np.append(w, w[:1]), eps, res), ValueError),
        ("2-D weight", (x, w[None, :], eps, res), ValueError),
        ("eps == 0", (x, w, 0.0, res), ValueError),
        ("eps < 0", (x, w, -1e-6, res), ValueError),
        ("residual of another shape", (x, w, eps, np.zeros((*x.shape, 1), x.dtype)), ValueError),
        ("a scalar x", (np.array(1.0, x.dtype), w[:1], eps, None), ValueError),
    ]


def _rms_compare(case: Case, got: Any, ref: Any) -> None:
    got = got if isinstance(got, tuple) else (got,)
    ref = ref if isinstance(ref, tuple) else (ref,)
    assert len(got) == len(ref), f"{len(got)} results, the reference returns {len(ref)}"
    t = tol(case.x.dtype)
    for i, (g, r) in enumerate(zip(got, ref, strict=True)):
        assert g.dtype == r.dtype, f"dtype {g.dtype}, the reference's {r.dtype}"
        assert_within(g, r, t * (np.abs(r) + np.abs(case.weight)), f"result {i}")


add_does_not_modify_inputs(spec, SHAPES["rms_norm"], rms_cases())
add_rejects_invalid_input(spec, SHAPES["rms_norm"], error_variants(rms_cases(), rms_errors))
add_matches_reference(
    spec,
    SHAPES["rms_norm"],
    rms_cases(),
    _rms_compare,
    "The reference's result within TOL[dtype] * (|ref| + |weight|).",
)


# ============================================================================== silu_and_mul


@spec.prop("silu_and_mul", silu_cases())
def halves_the_last_axis(ctx: Ctx, case: Case) -> None:
    """The result has shape (..., d) for x of shape (..., 2 * d), in x's dtype."""
    out = call(ctx, "silu_and_mul", case)
    x = case.x
    checks.assert_shape_dtype(out, (*x.shape[:-1], x.shape[-1] // 2), x.dtype)


@spec.prop("silu_and_mul", silu_cases(), name="matches_the_formula")
def silu_matches_the_formula(ctx: Ctx, case: Case) -> None:
    """out = gate / (1 + exp(-gate)) * up (gate the first half of the last axis), within
    TOL[dtype] * (|out| + |silu(gate)| * |up| + 1) of a float64 oracle."""
    out = call(ctx, "silu_and_mul", case)
    want, mag = silu_oracle(case.x)
    assert_within(out, want, tol(case.x.dtype) * (np.abs(want) + mag + 1), "silu_and_mul")


@spec.prop("silu_and_mul", silu_cases())
def zero_gate_or_up_gives_zero(ctx: Ctx, case: Case) -> None:
    """silu(0) == 0, so a zero gate or a zero up gives exactly 0 (and no other entry)."""
    out = call(ctx, "silu_and_mul", case)
    d = case.x.shape[-1] // 2
    zero = (case.x[..., :d] == 0) | (case.x[..., d:] == 0)
    assert np.all(out[zero] == 0), f"nonzero result where gate or up is 0: {out[zero]}"


@spec.prop("silu_and_mul", silu_cases(), name="returns_documented_types")
def silu_returns_documented_types(ctx: Ctx, case: Case) -> None:
    """A new array in x's library, device and dtype."""
    x = ctx.convert(case.x)
    out = ctx.fn("silu_and_mul")(x)
    problem = checks.same_library(out, x)
    assert problem is None, problem
    assert checks.dtype_name(out) == checks.dtype_name(x), f"dtype {checks.dtype_name(out)}"


def silu_errors(case: Case) -> list[tuple[str, tuple[Any, ...], type]]:
    x = case.x
    return [
        ("integer x", (np.zeros(x.shape, np.int32),), TypeError),
        ("an odd last axis", (x[..., :-1],), ValueError),
        ("a scalar x", (np.array(1.0, x.dtype),), ValueError),
    ]


def _silu_compare(case: Case, got: Any, ref: Any) -> None:
    assert got.dtype == ref.dtype, f"dtype {got.dtype}, the reference's {ref.dtype}"
    _, mag = silu_oracle(case.x)
    assert_within(got, ref, tol(case.x.dtype) * (np.abs(ref) + mag + 1), "silu_and_mul")


add_does_not_modify_inputs(spec, SHAPES["silu_and_mul"], silu_cases())
add_rejects_invalid_input(spec, SHAPES["silu_and_mul"], error_variants(silu_cases(), silu_errors))
add_matches_reference(
    spec,
    SHAPES["silu_and_mul"],
    silu_cases(),
    _silu_compare,
    "The reference's result within TOL[dtype] * (|ref| + |silu(gate)| * |up| + 1).",
)


# ========================================================= gemma_rms_norm and layer_norm


@st.composite
def layer_norm_cases(draw: Any, residual: bool | None = None) -> Case:
    case = draw(rms_cases(residual))
    bias = draw(hnp.arrays(case.x.dtype, case.weight.shape, elements=values(case.x.dtype, 4.0)))
    return Case(x=case.x, weight=case.weight, bias=bias, eps=case.eps, residual=case.residual)


def gemma_want(case: Case) -> tuple[np.ndarray, np.ndarray]:
    """(the float64 oracle, its tolerance scale |y| + |1 + weight| * (1 + |normed|))."""
    normed, _ = rms_oracle(case)
    scale = 1.0 + case.weight.astype(np.float64)
    want = normed * scale
    return want, np.abs(want) + np.abs(scale) * (1 + np.abs(normed))


def layer_norm_want(case: Case) -> tuple[np.ndarray, np.ndarray]:
    """(the float64 oracle, its tolerance scale). The mean is subtracted in the compute
    dtype, so a row's max |h| / sqrt(var + eps) bounds how far its rounding carries."""
    h = (case.x if case.residual is None else case.x + case.residual).astype(np.float64)
    centred = h - h.mean(axis=-1, keepdims=True)
    std = np.sqrt(np.mean(centred**2, axis=-1, keepdims=True) + case.eps)
    w, b = case.weight.astype(np.float64), case.bias.astype(np.float64)
    want = centred / std * w + b
    spread = np.max(np.abs(h), axis=-1, keepdims=True) / std
    return want, 8 * (np.abs(want) + np.abs(b) + np.abs(w) * (1 + spread))


NORMS = {
    "gemma_rms_norm": (rms_cases, gemma_want),
    "layer_norm": (layer_norm_cases, layer_norm_want),
}


def fields(case: Case) -> dict[str, Any]:
    return {name: getattr(case, name) for name in case._fields}


def _add_norm_properties(op: str) -> None:
    cases, want_of = NORMS[op]

    def matches_the_formula(ctx: Ctx, case: Case) -> None:
        out = call(ctx, op, case)
        if case.residual is not None:
            out = out[0]
        want, scale = want_of(case)
        assert_within(out, want, tol(case.x.dtype) * scale + grid(case.x.dtype), op)

    def residual_is_fused(ctx: Ctx, case: Case) -> None:
        """With a residual: returns (op(x + residual), x + residual); the new residual is
        exactly the sum in x's dtype."""
        out = call(ctx, op, case)
        assert isinstance(out, tuple) and len(out) == 2, f"returned {type(out).__name__}"
        checks.assert_equal(out[1], case.x + case.residual, what="new residual")

    def returns_documented_types(ctx: Ctx, case: Case) -> None:
        """An array like x (library, device, dtype, shape), or a pair of them with a residual."""
        args = [ctx.convert(a) for a in SHAPES[op].call_args(case)]
        out = ctx.fn(op)(*args)
        for i, result in enumerate(out if case.residual is not None else (out,)):
            check_like_input(result, args[0], f"result {i}")

    def errors(case: Case) -> list[tuple[str, tuple[Any, ...], type]]:
        bad = [
            ("integer x", {"x": np.zeros(case.x.shape, np.int64)}, TypeError),
            ("integer weight", {"weight": np.ones(case.weight.shape, np.int32)}, TypeError),
            ("weight one longer", {"weight": np.append(case.weight, 1)}, ValueError),
            ("eps == 0", {"eps": 0.0}, ValueError),
            ("residual of another shape", {"residual": case.x[..., :0]}, ValueError),
        ]
        if op == "layer_norm":
            bad.append(("bias one shorter", {"bias": case.bias[:-1]}, ValueError))
        return [
            (why, SHAPES[op].call_args(Case(**(fields(case) | edit))), e) for why, edit, e in bad
        ]

    def compare(case: Case, got: Any, ref: Any) -> None:
        got, ref = (got, ref) if isinstance(ref, tuple) else ((got,), (ref,))
        assert len(got) == len(ref), f"{len(got)} results, the reference returns {len(ref)}"
        _, scale = want_of(case)
        for i, (g, r) in enumerate(zip(got, ref, strict=True)):
            assert g.dtype == r.dtype, f"dtype {g.dtype}, the reference's {r.dtype}"
            assert_within(g, r, tol(case.x.dtype) * scale, f"result {i}")

    matches_the_formula.__doc__ = (
        "The contract's formula within TOL[dtype] * the oracle's scale (see `gemma_want`, "
        "`layer_norm_want`) of a float64 oracle, with and without a residual."
    )
    spec.add(op, matches_the_formula, cases())
    spec.add(op, residual_is_fused, cases(residual=True))
    spec.add(op, returns_documented_types, cases())
    add_does_not_modify_inputs(spec, SHAPES[op], cases())
    add_rejects_invalid_input(spec, SHAPES[op], error_variants(cases(), errors))
    add_matches_reference(
        spec, SHAPES[op], cases(), compare, "The reference's result within the formula's tolerance."
    )


for _op in NORMS:
    _add_norm_properties(_op)


# ==================================================================== gelu and gelu_and_mul


@st.composite
def gelu_cases(draw: Any, gated: bool = False) -> Case:
    case = (
        draw(silu_cases())
        if gated
        else Case(
            x=draw(float_arrays(draw(st.sampled_from(FLOAT_DTYPES)), draw(st.integers(1, 16))))
        )
    )
    return Case(x=case.x, approximate=draw(st.sampled_from(("none", "tanh"))))


def gelu64(x: np.ndarray, approximate: str) -> np.ndarray:
    import math

    x = x.astype(np.float64)
    if approximate == "tanh":
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    return 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))


def gelu_want(case: Case, gated: bool) -> tuple[np.ndarray, np.ndarray]:
    """(the float64 oracle, its tolerance scale (|y| + (|gate| + 1) * (|up| + 1)))."""
    if not gated:
        return gelu64(case.x, case.approximate), np.abs(case.x.astype(np.float64)) + 1
    d = case.x.shape[-1] // 2
    g, u = case.x[..., :d].astype(np.float64), case.x[..., d:].astype(np.float64)
    want = gelu64(g, case.approximate) * u
    return want, np.abs(want) + (np.abs(g) + 1) * (np.abs(u) + 1)


def _add_gelu_properties(op: str, gated: bool) -> None:
    def matches_the_formula(ctx: Ctx, case: Case) -> None:
        out = call(ctx, op, case)
        want, scale = gelu_want(case, gated)
        assert_within(out, want, 4 * tol(case.x.dtype) * scale, op)

    def returns_documented_types(ctx: Ctx, case: Case) -> None:
        x = ctx.convert(case.x)
        out = ctx.fn(op)(x, case.approximate)
        problem = checks.same_library(out, x)
        assert problem is None, problem
        shape = (*x.shape[:-1], x.shape[-1] // 2) if gated else tuple(x.shape)
        assert tuple(out.shape) == shape, f"shape {tuple(out.shape)}, expected {shape}"
        assert checks.dtype_name(out) == checks.dtype_name(x), f"dtype {checks.dtype_name(out)}"

    def errors(case: Case) -> list[tuple[str, tuple[Any, ...], type]]:
        x, a = case.x, case.approximate
        bad = [
            ("integer x", (np.zeros(x.shape, np.int32), a), TypeError),
            ("approximate='erf'", (x, "erf"), ValueError),
            ("a scalar x", (np.array(1.0, x.dtype), a), ValueError),
        ]
        return bad + ([("an odd last axis", (x[..., :-1], a), ValueError)] if gated else [])

    def compare(case: Case, got: Any, ref: Any) -> None:
        assert got.dtype == ref.dtype, f"dtype {got.dtype}, the reference's {ref.dtype}"
        _, scale = gelu_want(case, gated)
        assert_within(got, ref, 4 * tol(case.x.dtype) * scale, op)

    matches_the_formula.__doc__ = (
        "gelu (erf or tanh form, gelu(gate) * up when gated) within 4 * TOL[dtype] * "
        "(|y| + (|gate| + 1) * (|up| + 1)) of a float64 oracle."
    )
    returns_documented_types.__doc__ = (
        "A new array in x's library and dtype, of the documented shape."
    )
    spec.add(op, matches_the_formula, gelu_cases(gated))
    spec.add(op, returns_documented_types, gelu_cases(gated))
    add_does_not_modify_inputs(spec, SHAPES[op], gelu_cases(gated))
    add_rejects_invalid_input(spec, SHAPES[op], error_variants(gelu_cases(gated), errors))
    add_matches_reference(
        spec,
        SHAPES[op],
        gelu_cases(gated),
        compare,
        "The reference's result within the formula's tolerance.",
    )


_add_gelu_properties("gelu", gated=False)
_add_gelu_properties("gelu_and_mul", gated=True)
