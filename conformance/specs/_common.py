"""Strategies and generic properties shared by the spec modules.

Every strategy yields numpy inputs (the canonical form); `Ctx` converts them to the array
library under test. Shapes stay small (batch 1-6, vocab 1-64) and values are drawn to hit
the edges: exact ties, -inf entries, rows with a single finite entry.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import hypothesis.extra.numpy as hnp
import numpy as np
from hypothesis import strategies as st

from .. import checks, contract
from ..core import Case, Ctx, Spec, SuiteError, library_of, to_numpy

NEG_INF = float("-inf")
FLOAT_DTYPES = (np.float32, np.float64)
TIES = (0.0, 1.0, -1.0, 2.0, 0.5, -2.5, 3.0, 10.0)

batches = st.integers(1, 6)
vocabs = st.integers(1, 64)


@st.composite
def logits_arrays(
    draw: Any,
    batch: int | None = None,
    vocab: int | None = None,
    dtype: Any = None,
    neg_inf: bool = True,
    bound: float = 40.0,
) -> np.ndarray:
    """(batch, vocab) float32/float64 logits: ties, -inf, never a row that is all -inf."""
    dtype = np.dtype(dtype or draw(st.sampled_from(FLOAT_DTYPES)))
    b = batch if batch is not None else draw(batches)
    v = vocab if vocab is not None else draw(vocabs)
    width = 32 if dtype == np.float32 else 64
    options = [st.sampled_from(TIES), st.floats(-bound, bound, width=width)]
    if neg_inf:
        options.append(st.just(NEG_INF))
    x = draw(hnp.arrays(dtype, (b, v), elements=st.one_of(options)))
    for row in np.flatnonzero(np.all(np.isneginf(x), axis=1)):
        x[row, draw(st.integers(0, v - 1))] = draw(st.sampled_from(TIES))
    return x


def row_values(n: int, elements: Any, dtypes: tuple[Any, ...]) -> Any:
    """A (n,) array of `elements` in one of `dtypes`."""
    return st.sampled_from(dtypes).flatmap(
        lambda dt: hnp.arrays(np.dtype(dt), (n,), elements=elements)
    )


def token_id_arrays(batch: int, vocab: int, max_len: int = 8, min_len: int = 0) -> Any:
    """(batch, n) integer ids in [-2, vocab), negative entries being padding."""
    return st.tuples(st.integers(min_len, max_len), st.sampled_from((np.int64, np.int32))).flatmap(
        lambda nd: hnp.arrays(
            np.dtype(nd[1]),
            (batch, nd[0]),
            elements=st.one_of(st.integers(0, vocab - 1), st.sampled_from((-1, -2))),
        )
    )


# --- generic properties ---------------------------------------------------------------------


@dataclass(frozen=True)
class ErrorCase:
    """An input with exactly one thing wrong, and the exception class the spec names."""

    expect: type[Exception]
    why: str
    args: tuple[Any, ...]

    def __repr__(self) -> str:
        from ..core import fmt

        return (
            f"{self.why} -> {self.expect.__name__}; args=({', '.join(fmt(a) for a in self.args)})"
        )


class ErrorCases(list):
    """Every error variant built from one valid input (all are checked on each example)."""

    def __init__(self, base: Any, cases: list[ErrorCase]):
        super().__init__(cases)
        self.base = base

    def __repr__(self) -> str:
        return f"{len(self)} variants of the valid input ({self.base!r})"


def error_variants(valid: Any, variants: Any) -> Any:
    """Strategy of ErrorCases: a valid case from `valid`, broken by each of
    `variants(case) -> [(why, args, exception), ...]`."""
    return valid.map(
        lambda case: ErrorCases(case, [ErrorCase(e, w, a) for w, a, e in variants(case)])
    )


@dataclass(frozen=True)
class OpShape:
    """How to call an op from a Case: the Case fields, in argument order."""

    op: str
    args: tuple[str, ...]

    def call_args(self, case: Case) -> tuple[Any, ...]:
        return tuple(getattr(case, a) for a in self.args)


def reference_shapes(module: str) -> dict[str, OpShape]:
    """One OpShape per function of the reference module, its args the function's parameters
    (so a Case names its fields like the parameters they feed)."""
    return {op: OpShape(op, contract.parameters(module, op)) for op in contract.functions(module)}


def add_does_not_modify_inputs(spec: Spec, shape: OpShape, cases: Any) -> None:
    def does_not_modify_inputs(ctx: Ctx, case: Case) -> None:
        """The op leaves every array argument unchanged (it returns new arrays)."""
        args = [ctx.convert(a) for a in shape.call_args(case)]
        before = [
            np.array(to_numpy(a), copy=True) if library_of(a) in ("numpy", "torch") else None
            for a in args
        ]
        ctx.fn(shape.op)(*args)
        for name, a, b in zip(shape.args, args, before, strict=True):
            if b is not None:
                checks.assert_equal(to_numpy(a), b, what=f"argument {name} after the call")

    spec.add(shape.op, does_not_modify_inputs, cases)


def row_magnitude(x: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """max |finite x| + log(vocab) + 1 per row of `x`, broadcast to `shape` (batch first):
    the scale of the operands of a row-wise softmax-like computation."""
    finite = np.where(np.isfinite(x), np.abs(x), 0).astype(np.float64)
    row = finite.max(axis=1) + np.log(x.shape[1]) + 1
    return np.broadcast_to(row.reshape((-1,) + (1,) * (len(shape) - 1)), shape)


def add_accepts_strided_input(
    spec: Spec,
    shape: OpShape,
    cases: Any,
    boundary: Callable[[tuple[Any, ...]], np.ndarray] | None = None,
) -> None:
    """`boundary(args)`, if given, marks the entries whose keep/mask decision sits within the
    spec's float band of a threshold: there a layout may change the summation order and the
    decision (either answer conforms; `only_masks` checks the values)."""

    def accepts_strided_input(ctx: Ctx, case: Case) -> None:
        """A non-contiguous main array (padded rows, every other column, column-major) gives
        the result of a contiguous copy: the spec does not restrict the memory layout."""
        args = shape.call_args(case)
        want = ctx.call(shape.op, *args)
        for layout in ctx.LAYOUTS:
            view = ctx.strided(args[0], layout)
            assert np.array_equal(to_numpy(view), args[0], equal_nan=True), "suite: bad view"
            got = to_numpy(ctx.fn(shape.op)(view, *(ctx.convert(a) for a in args[1:])))
            pairs = zip(got, want, strict=True) if isinstance(want, tuple) else [(got, want)]
            for g, w in pairs:
                what = f"result for {layout} {shape.args[0]}"
                if boundary is not None and g.shape == w.shape:
                    g = np.where(boundary(args), w, g)
                if w.dtype.kind == "f":  # sums may run in another order: float tolerance
                    checks.assert_close(g, w, w.dtype, row_magnitude(args[0], w.shape), what)
                else:
                    checks.assert_equal(g, w, what=what)

    spec.add(shape.op, accepts_strided_input, cases)


def add_rejects_invalid_input(spec: Spec, shape: OpShape, error_cases: Any) -> None:
    def rejects_invalid_input(ctx: Ctx, cases: ErrorCases) -> None:
        """Each invalid input raises the exception class the docstring names (as the reference
        does)."""
        for case in cases:
            ref_exc = ctx.ref_raises(shape.op, *case.args)
            if not isinstance(ref_exc, case.expect):
                raise SuiteError(
                    f"the reference raises {type(ref_exc).__name__ if ref_exc else 'nothing'} "
                    f"for {case.why}, the suite expects {case.expect.__name__}"
                )
            exc = ctx.raises(shape.op, *case.args)
            assert exc is not None, f"{case!r}: nothing raised"
            assert isinstance(exc, case.expect), f"{case!r}: raised {type(exc).__name__}({exc})"

    spec.add(shape.op, rejects_invalid_input, error_cases)


def add_matches_reference(
    spec: Spec,
    shape: OpShape,
    cases: Any,
    compare: Callable[[Case, Any, Any], None],
    doc: str,
) -> None:
    def matches_reference(ctx: Ctx, case: Case) -> None:
        args = shape.call_args(case)
        compare(case, ctx.call(shape.op, *args), ctx.ref(shape.op, *args))

    matches_reference.__doc__ = doc
    spec.add(shape.op, matches_reference, cases, differential=True)


def add_exact_op_properties(
    spec: Spec, shape: OpShape, cases: Any, errors: Callable[[Case], Any], what: str
) -> None:
    """The three generic properties of an op whose result is exact (codes, bytes, words):
    inputs untouched, each of `errors(case)`'s variants raising its documented class
    (`error_variants`), and the reference's `what` exactly (dtype and values)."""
    add_does_not_modify_inputs(spec, shape, cases)
    add_rejects_invalid_input(spec, shape, error_variants(cases, errors))
    doc = f"The reference's {what}, exactly."
    add_matches_reference(spec, shape, cases, checks.exactly_the_reference, doc)


# --- error cases for ops taking (batch, vocab) logits ------------------------------------------


def logits_errors(
    valid: Any, shape: OpShape, params: dict[str, list[tuple[str, Any, type]]]
) -> Any:
    """ErrorCases for a logits op: a valid case with one thing broken.

    Broken logits (integer dtype, 1-D, empty vocab, NaN, +inf, an all -inf row), a per-row
    parameter of the wrong length, and the op-specific bad values in `params`:
    {field: [(why, value placed in row 0 or a function of the case, exception), ...]}.
    """

    def logits_variants(case: Case) -> list[tuple[str, Any, type]]:
        x = case.logits
        nan = x.copy()
        nan[0, 0] = np.nan
        pinf = x.copy()
        pinf[-1, -1] = np.inf
        dead = x.copy()
        dead[0, :] = NEG_INF
        return [
            ("integer logits", np.zeros(x.shape, np.int64), TypeError),
            ("logits of shape (vocab,)", x[0], ValueError),
            ("logits with an empty vocab axis", x[:, :0], ValueError),
            ("a NaN logit", nan, ValueError),
            ("a +inf logit", pinf, ValueError),
            ("a row entirely -inf", dead, ValueError),
        ]

    def variants(case: Case) -> list[tuple[str, tuple[Any, ...], type]]:
        options: list[tuple[str, str, Any, type]] = [
            ("logits", why, value, exc) for why, value, exc in logits_variants(case)
        ]
        for name in shape.args:
            value = getattr(case, name)
            if name != "logits" and isinstance(value, np.ndarray) and value.ndim == 1:
                longer = np.concatenate([value, value[:1]])
                options.append((name, f"{name} of length batch + 1", longer, ValueError))
                options.append((name, f"{name} of shape (batch, 1)", value[:, None], ValueError))
        for name, bad in params.items():
            for why, value, exc in bad:
                if callable(value):
                    options.append((name, why, value(case), exc))
                else:
                    arr = np.array(getattr(case, name), copy=True)
                    if arr.dtype.kind in "iu" and isinstance(value, float):
                        arr = arr.astype(np.float64)
                    arr[0] = value
                    options.append((name, why, arr, exc))
        return [
            (why, tuple(value if a == name else getattr(case, a) for a in shape.args), exc)
            for name, why, value, exc in options
        ]

    return error_variants(valid, variants)


def check_like_input(result: Any, like: Any, what: str = "result") -> None:
    """`result` has the library, device, dtype and shape of `like`."""
    problem = checks.same_library(result, like)
    assert problem is None, f"{what} {problem}"
    assert checks.dtype_name(result) == checks.dtype_name(like), (
        f"{what} has dtype {checks.dtype_name(result)}, input {checks.dtype_name(like)}"
    )
    assert tuple(result.shape) == tuple(like.shape), (
        f"{what} has shape {tuple(result.shape)}, input {tuple(like.shape)}"
    )


def assert_within(got: Any, want: Any, tol: Any, what: str = "value") -> None:
    """|got - want| <= tol element-wise (tol broadcast), same shape; NaN never passes."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, f"{what} has shape {got.shape}, expected {want.shape}"
    tol = np.broadcast_to(np.asarray(tol, dtype=np.float64), want.shape)
    err = np.abs(got.astype(np.float64) - want.astype(np.float64))
    bad = ~(err <= tol)
    if bad.any():
        i = tuple(int(v) for v in np.argwhere(bad)[0])
        raise AssertionError(
            f"{what} at {list(i)}: got {got[i]!r}, expected {want[i]!r} "
            f"(error {err[i]:.3g}, tolerance {tol[i]:.3g})"
        )
