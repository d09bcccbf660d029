"""Properties of `ops.lora` (see `pyagent_ref/ops/lora.py` for the contract).

Cases: 0-6 tokens, 0-4 slots, rank 0-4, in 1-10, one to three output slices of 1-5 rows
each, values in [-2, 2] with exact small values (0, 1, -1, 0.5), float16, float32 or
float64 inputs (float32 y and scaling beside float16 weights as an engine has them),
indices in [-1, num_loras) with -1 common. An `out` of each float dtype.

Tolerances: |got - want| <= T * M + tiny, M the float64 result with every operand
replaced by its magnitude (|A| |x| for the shrink, |s| |B| |y| for the expand), T = 2e-6
for float32 compute (1e-14 float64), tiny a few subnormals (2e-44, 1e-321). In place,
out[t] is (out[t] + delta) rounded once to out's dtype: the result may also differ by
that rounding (2^-11 |want| for float16, 2^-24 for float32, 2^-53 for float64, plus the
smallest subnormal).
"""

from __future__ import annotations

from typing import Any

import hypothesis.extra.numpy as hnp
import numpy as np
from hypothesis import strategies as st

import pyagent_ref.ops.lora  # noqa: F401 - binds pyagent_ref.ops.lora for the reference

from .. import checks, contract
from ..core import Case, Ctx, Spec, to_numpy
from ._common import (
    add_does_not_modify_inputs,
    add_matches_reference,
    add_rejects_invalid_input,
    assert_within,
    error_variants,
    reference_shapes,
)

OPS = contract.names("lora")
T = {"float32": 2e-6, "float64": 1e-14}
TINY = {"float32": 2e-44, "float64": 1e-321}  # products and sums among subnormals
ROUNDING = {"float16": (2.0**-11, 6e-8), "float32": (2.0**-24, 1.5e-45), "float64": (2.0**-53, 0)}
DTYPES = (np.float16, np.float32, np.float64)

spec = Spec("lora", OPS)

SHAPES = reference_shapes("lora")


def compute_name(dtype: Any) -> str:
    return "float64" if np.dtype(dtype) == np.float64 else "float32"


# --- strategies -----------------------------------------------------------------------------


def values(dtype: Any, bound: float = 2.0) -> Any:
    width = {np.float16: 16, np.float32: 32, np.float64: 64}[np.dtype(dtype).type]
    return st.one_of(st.sampled_from((0.0, 1.0, -1.0, 0.5)), st.floats(-bound, bound, width=width))


def index_arrays(tokens: int, num_loras: int) -> Any:
    return st.sampled_from((np.int32, np.int64)).flatmap(
        lambda dt: hnp.arrays(
            np.dtype(dt), (tokens,), elements=st.integers(-1, max(num_loras - 1, -1))
        )
    )


@st.composite
def shrink_cases(draw: Any) -> Case:
    dtype = np.dtype(draw(st.sampled_from(DTYPES)))
    tokens, num_loras = draw(st.integers(0, 6)), draw(st.integers(0, 4))
    rank, in_features = draw(st.integers(0, 6)), draw(st.integers(1, 10))
    return Case(
        x=draw(hnp.arrays(dtype, (tokens, in_features), elements=values(dtype))),
        lora_a=draw(hnp.arrays(dtype, (num_loras, rank, in_features), elements=values(dtype))),
        indices=draw(index_arrays(tokens, num_loras)),
    )


@st.composite
def expand_cases(draw: Any, with_out: bool | None = None) -> Case:
    y_dtype = np.dtype(draw(st.sampled_from((np.float32, np.float64))))
    b_dtype = np.dtype(draw(st.sampled_from((np.float16, y_dtype))))
    tokens, num_loras = draw(st.integers(0, 6)), draw(st.integers(0, 4))
    rank = draw(st.integers(0, 4))
    sizes = draw(st.lists(st.integers(1, 5), min_size=1, max_size=3))
    out_features = sum(sizes)
    slices = tuple(sizes) if len(sizes) > 1 or draw(st.booleans()) else None
    has_out = draw(st.booleans()) if with_out is None else with_out
    out = None
    if has_out:
        out_dtype = np.dtype(draw(st.sampled_from(DTYPES)))
        out = draw(hnp.arrays(out_dtype, (tokens, out_features), elements=values(out_dtype, 8.0)))
    return Case(
        y=draw(hnp.arrays(y_dtype, (tokens, len(sizes) * rank), elements=values(y_dtype))),
        lora_b=draw(hnp.arrays(b_dtype, (num_loras, out_features, rank), elements=values(b_dtype))),
        indices=draw(index_arrays(tokens, num_loras)),
        scaling=draw(
            hnp.arrays(y_dtype, (num_loras,), elements=st.sampled_from((1.0, 2.0, 0.5, 0.25, -1.5)))
        ),
        out=out,
        output_slices=slices,
    )


def call(ctx: Ctx, op: str, case: Case) -> Any:
    return ctx.call(op, *SHAPES[op].call_args(case))


# --- oracles --------------------------------------------------------------------------------


def shrink_oracle(case: Case) -> tuple[np.ndarray, np.ndarray]:
    """(y in float64, its magnitude M)."""
    x, a = case.x.astype(np.float64), case.lora_a.astype(np.float64)
    tokens, rank = x.shape[0], a.shape[1]
    want, mag = np.zeros((tokens, rank)), np.zeros((tokens, rank))
    for t, i in enumerate(case.indices.tolist()):
        if i >= 0:
            want[t], mag[t] = a[i] @ x[t], np.abs(a[i]) @ np.abs(x[t])
    return want, mag


def slice_sizes(case: Case) -> list[int]:
    return list(case.output_slices or (case.lora_b.shape[1],))


def expand_oracle(case: Case) -> tuple[np.ndarray, np.ndarray]:
    """(delta in float64, its magnitude M)."""
    y, b = case.y.astype(np.float64), case.lora_b.astype(np.float64)
    s = case.scaling.astype(np.float64)
    rank = b.shape[2]
    tokens, out_features = y.shape[0], b.shape[1]
    want, mag = np.zeros((tokens, out_features)), np.zeros((tokens, out_features))
    for t, i in enumerate(case.indices.tolist()):
        if i < 0:
            continue
        start = 0
        for n, size in enumerate(slice_sizes(case)):
            rows, cols = slice(start, start + size), slice(n * rank, (n + 1) * rank)
            want[t, rows] = s[i] * (b[i, rows] @ y[t, cols])
            mag[t, rows] = abs(s[i]) * (np.abs(b[i, rows]) @ np.abs(y[t, cols]))
            start += size
    return want, mag


def sum_tol(dtype_name: str, mag: np.ndarray) -> np.ndarray:
    return T[dtype_name] * mag + TINY[dtype_name]


def in_place_tol(case: Case, out: np.ndarray, want: np.ndarray, mag: np.ndarray) -> np.ndarray:
    """The sums' tolerance (M including |out|) and the rounding to out's dtype."""
    rel, tiny = ROUNDING[out.dtype.name]
    mag = mag + np.abs(out.astype(np.float64))
    return sum_tol(compute_name(case.y.dtype), mag) * (1 + rel) + rel * np.abs(want) + tiny


# =============================================================================== lora_shrink


@spec.prop("lora_shrink", shrink_cases(), name="returns_documented_types")
def shrink_returns_documented_types(ctx: Ctx, case: Case) -> None:
    """A new (tokens, rank) array in x's library, float32 (float64 for float64 x)."""
    x = ctx.convert(case.x)
    out = ctx.fn("lora_shrink")(x, ctx.convert(case.lora_a), ctx.convert(case.indices))
    problem = checks.same_library(out, x)
    assert problem is None, problem
    got = to_numpy(out)
    shape = (case.x.shape[0], case.lora_a.shape[1])
    checks.assert_shape_dtype(got, shape, compute_name(case.x.dtype), "y")


@spec.prop("lora_shrink", shrink_cases())
def projects_each_token_with_its_adapter(ctx: Ctx, case: Case) -> None:
    """y[t] = lora_a[indices[t]] @ x[t], within T * M of a float64 oracle."""
    got = call(ctx, "lora_shrink", case)
    want, mag = shrink_oracle(case)
    assert_within(got, want, sum_tol(compute_name(case.x.dtype), mag), "y")


@spec.prop("lora_shrink", shrink_cases())
def tokens_without_adapter_get_zeros(ctx: Ctx, case: Case) -> None:
    """Rows of tokens with index -1 are exactly 0, whatever their input (NaN included)."""
    none = case.indices == -1
    if not none.any():
        return
    x = case.x.copy()
    x[none] = np.nan
    got = ctx.call("lora_shrink", x, case.lora_a, case.indices)
    assert not np.isnan(got[none]).any() and np.all(got[none] == 0), (
        f"rows without an adapter: {got[none]}"
    )


@spec.prop("lora_shrink", shrink_cases(), name="unused_slots_are_not_read")
def shrink_unused_slots_are_not_read(ctx: Ctx, case: Case) -> None:
    """Slots no token uses do not enter the result: NaN there changes nothing."""
    used = set(case.indices.tolist())
    unused = [i for i in range(case.lora_a.shape[0]) if i not in used]
    if not unused:
        return
    want = call(ctx, "lora_shrink", case)
    a = case.lora_a.copy()
    a[unused] = np.nan
    got = ctx.call("lora_shrink", case.x, a, case.indices)
    checks.assert_equal(got, want, what="y with NaN in the unused slots")


def shrink_errors(case: Case) -> list[tuple[str, tuple[Any, ...], type]]:
    x, a, i = case.x, case.lora_a, case.indices
    other = np.float32 if x.dtype != np.float32 else np.float64
    errors = [
        ("integer x", (np.zeros(x.shape, np.int64), a, i), TypeError),
        ("lora_a of another dtype", (x, a.astype(other), i), TypeError),
        ("float indices", (x, a, i.astype(np.float32)), TypeError),
        ("1-D x", (x.reshape(-1), a, i), ValueError),
        ("lora_a of another in_features", (x, a[:, :, :-1], i), ValueError),
        ("one index more than tokens", (x, a, np.append(i, -1).astype(i.dtype)), ValueError),
    ]
    if len(i):
        past = i.copy()
        past[-1] = a.shape[0]
        below = i.copy()
        below[0] = -2
        errors.append(("an index past the slots", (x, a, past), ValueError))
        errors.append(("an index of -2", (x, a, below), ValueError))
    return errors


add_does_not_modify_inputs(spec, SHAPES["lora_shrink"], shrink_cases())
add_rejects_invalid_input(
    spec, SHAPES["lora_shrink"], error_variants(shrink_cases(), shrink_errors)
)


def _shrink_compare(case: Case, got: Any, ref: Any) -> None:
    assert got.dtype == ref.dtype, f"dtype {got.dtype}, the reference's {ref.dtype}"
    _, mag = shrink_oracle(case)
    assert_within(got, ref, 2 * sum_tol(compute_name(case.x.dtype), mag), "y")


add_matches_reference(
    spec,
    SHAPES["lora_shrink"],
    shrink_cases(),
    _shrink_compare,
    "The reference's result within 2 T * M.",
)


# =============================================================================== lora_expand


def expand(ctx: Ctx, case: Case, **changes: Any) -> tuple[Any, Any, np.ndarray | None]:
    """(the op's return value, the converted out it was given or None, out after the
    call as numpy): the implementation's call on a converted copy of out."""
    args = {name: getattr(case, name) for name in SHAPES["lora_expand"].args}
    args.update(changes)
    conv = {k: ctx.convert(v) for k, v in args.items()}
    ret = ctx.fn("lora_expand")(**conv)
    out = conv["out"]
    return ret, out, None if out is None else np.array(to_numpy(out))


@spec.prop("lora_expand", expand_cases(), name="returns_documented_types")
def expand_returns_documented_types(ctx: Ctx, case: Case) -> None:
    """Without out: a new (tokens, out_features) array in y's library, float32 (float64
    for float64 y). With out: out itself."""
    ret, out, _ = expand(ctx, case)
    if out is not None:
        assert ret is out, f"returned {type(ret).__name__}, not the out it was given"
        return
    problem = checks.same_library(ret, ctx.convert(case.y))
    assert problem is None, problem
    shape = (case.y.shape[0], case.lora_b.shape[1])
    checks.assert_shape_dtype(to_numpy(ret), shape, compute_name(case.y.dtype), "delta")


@spec.prop("lora_expand", expand_cases(with_out=False))
def projects_each_token_with_its_adapter_scaled(ctx: Ctx, case: Case) -> None:
    """delta[t, rows of slice s] = scaling[i] * lora_b[i, rows] @ y[t, slice s's rank
    columns], i = indices[t]; zero rows for -1; within T * M of a float64 oracle."""
    got = call(ctx, "lora_expand", case)
    want, mag = expand_oracle(case)
    assert_within(got, want, sum_tol(compute_name(case.y.dtype), mag), "delta")


@spec.prop("lora_expand", expand_cases(with_out=True))
def adds_in_place_to_the_rows_with_an_adapter(ctx: Ctx, case: Case) -> None:
    """out[t] becomes out[t] + delta[t] rounded once to out's dtype for tokens with an
    adapter; rows of tokens without one keep their bytes (NaN and -0.0 included)."""
    before = case.out.copy()
    none = case.indices == -1
    before[none] = np.where(np.arange(before.shape[1]) % 2, np.nan, -0.0)
    _, _, after = expand(ctx, case, out=before.copy())
    checks.assert_shape_dtype(after, before.shape, before.dtype, "out")
    checks.assert_equal(
        after[none].view(np.uint8), before[none].view(np.uint8), what="rows without an adapter"
    )
    delta, mag = expand_oracle(case)
    want = before.astype(np.float64) + delta
    mine = ~none
    tol = in_place_tol(case, before, want, mag)
    assert_within(after[mine], want[mine], tol[mine], "out rows with an adapter")


@spec.prop("lora_expand", expand_cases(), name="unused_slots_are_not_read")
def expand_unused_slots_are_not_read(ctx: Ctx, case: Case) -> None:
    """Slots no token uses do not enter the result: NaN in their B changes nothing."""
    used = set(case.indices.tolist())
    unused = [i for i in range(case.lora_b.shape[0]) if i not in used]
    if not unused:
        return
    _, _, want_out = expand(ctx, case)
    want = call(ctx, "lora_expand", Case(**{**vars_of(case), "out": None}))
    b = case.lora_b.copy()
    b[unused] = np.nan
    got = ctx.call("lora_expand", case.y, b, case.indices, case.scaling, None, case.output_slices)
    checks.assert_equal(got, want, what="delta with NaN in the unused slots' B")
    if case.out is not None:
        _, _, got_out = expand(ctx, case, lora_b=b)
        checks.assert_equal(got_out, want_out, what="out with NaN in the unused slots' B")


def vars_of(case: Case) -> dict[str, Any]:
    return {k: getattr(case, k) for k in case._fields}


@spec.prop("lora_expand", expand_cases(with_out=True))
def in_place_equals_adding_the_returned_delta(ctx: Ctx, case: Case) -> None:
    """Adding in place is out + the delta returned without out, rounded once: the two
    forms agree to out's rounding."""
    delta = call(ctx, "lora_expand", Case(**{**vars_of(case), "out": None}))
    _, _, after = expand(ctx, case)
    mine = case.indices >= 0
    want = case.out.astype(np.float64) + delta.astype(np.float64)
    rel, tiny = ROUNDING[case.out.dtype.name]
    tol = rel * np.abs(want) + tiny
    assert_within(after[mine], want[mine], tol[mine], "out against out + delta")


@spec.prop("lora_expand", expand_cases(with_out=False), uses=("lora_shrink",))
def shrink_then_expand_is_the_low_rank_update(ctx: Ctx, case: Case) -> None:
    """For a fused layer with A's stacked along the rank axis, expand(shrink(x)) gives
    each slice s its own scaling * B_s A_s x."""
    tokens, rank = case.y.shape[0], case.lora_b.shape[2]
    num_loras, num_slices = case.lora_b.shape[0], len(slice_sizes(case))
    rng = np.random.default_rng(tokens * 31 + rank)
    dtype = np.float32 if case.y.dtype == np.float32 else np.float64
    x = rng.uniform(-1, 1, (tokens, 3)).astype(dtype)
    a = rng.uniform(-1, 1, (num_loras, num_slices * rank, 3)).astype(dtype)
    y = ctx.call("lora_shrink", x, a, case.indices)
    got = ctx.call(
        "lora_expand", y, case.lora_b, case.indices, case.scaling, None, case.output_slices
    )
    b, s = case.lora_b.astype(np.float64), case.scaling.astype(np.float64)
    want = np.zeros(got.shape)
    mag = np.zeros(got.shape)
    for t, i in enumerate(case.indices.tolist()):
        start = 0
        for n, size in enumerate(slice_sizes(case)):
            if i >= 0:
                a_s = a[i, n * rank : (n + 1) * rank].astype(np.float64)
                rows = slice(start, start + size)
                want[t, rows] = s[i] * (b[i, rows] @ (a_s @ x[t]))
                mag[t, rows] = abs(s[i]) * (np.abs(b[i, rows]) @ (np.abs(a_s) @ np.abs(x[t])))
            start += size
    assert_within(got, want, 3 * sum_tol(compute_name(dtype), mag), "expand(shrink(x))")


def expand_errors(case: Case) -> list[tuple[str, tuple[Any, ...], type]]:
    shape = SHAPES["lora_expand"]

    def variant(**changes: Any) -> tuple[Any, ...]:
        return tuple(changes.get(a, getattr(case, a)) for a in shape.args)

    y, b, i, s = case.y, case.lora_b, case.indices, case.scaling
    tokens, out_features = y.shape[0], b.shape[1]
    errors = [
        ("integer y", variant(y=np.zeros(y.shape, np.int64)), TypeError),
        ("integer lora_b", variant(lora_b=np.zeros(b.shape, np.int32)), TypeError),
        ("integer scaling", variant(scaling=np.zeros(s.shape, np.int64)), TypeError),
        ("float indices", variant(indices=i.astype(np.float64)), TypeError),
        ("y one column wider", variant(y=np.zeros((tokens, y.shape[1] + 1), y.dtype)), ValueError),
        ("scaling one longer", variant(scaling=np.append(s, 1.0).astype(s.dtype)), ValueError),
        ("2-D lora_b", variant(lora_b=b.reshape(b.shape[0], b.shape[1] * b.shape[2])), ValueError),
        ("output_slices one too large", variant(output_slices=(out_features + 1,)), ValueError),
        ("output_slices with a 0", variant(output_slices=(0, out_features)), ValueError),
        ("output_slices of floats", variant(output_slices=(float(out_features),)), TypeError),
        (
            "out of another shape",
            variant(out=np.zeros((tokens, out_features + 1), np.float32)),
            ValueError,
        ),
        ("integer out", variant(out=np.zeros((tokens, out_features), np.int32)), TypeError),
    ]
    if len(i):
        past = i.copy()
        past[-1] = b.shape[0]
        errors.append(("an index past the slots", variant(indices=past), ValueError))
    if len(s):
        nan = s.copy()
        nan[0] = np.nan
        errors.append(("a NaN scaling", variant(scaling=nan), ValueError))
    return errors


add_does_not_modify_inputs(spec, SHAPES["lora_expand"], expand_cases(with_out=False))
add_rejects_invalid_input(
    spec, SHAPES["lora_expand"], error_variants(expand_cases(), expand_errors)
)


@spec.prop("lora_expand", expand_cases(with_out=True))
def in_place_leaves_the_other_inputs_alone(ctx: Ctx, case: Case) -> None:
    """With out, y, lora_b, indices and scaling are unchanged by the call."""
    conv = {k: ctx.convert(getattr(case, k)) for k in SHAPES["lora_expand"].args}
    ctx.fn("lora_expand")(**conv)
    for name in ("y", "lora_b", "indices", "scaling"):
        checks.assert_equal(to_numpy(conv[name]), getattr(case, name), what=f"{name} after")


def _expand_compare(ctx: Ctx, case: Case) -> None:
    """The reference's delta within 2 T * M; in place, its out within that plus out's
    rounding, and the same bytes in the rows without an adapter."""
    ref_out = None if case.out is None else case.out.copy()
    args = {**vars_of(case), "out": ref_out}
    ref = to_numpy(ctx.ref_fn("lora_expand")(**args))
    ret, _, after = expand(ctx, case)
    delta, mag = expand_oracle(case)
    if case.out is None:
        got = to_numpy(ret)
        assert got.dtype == ref.dtype, f"dtype {got.dtype}, the reference's {ref.dtype}"
        assert_within(got, ref, 2 * sum_tol(compute_name(case.y.dtype), mag), "delta")
        return
    none = case.indices == -1
    checks.assert_equal(after[none], ref[none], what="out rows without an adapter")
    want = case.out.astype(np.float64) + delta
    tol = 2 * in_place_tol(case, case.out, want, mag)
    assert_within(after[~none], ref[~none], tol[~none], "out")


spec.add(
    "lora_expand", _expand_compare, expand_cases(), differential=True, name="matches_reference"
)
