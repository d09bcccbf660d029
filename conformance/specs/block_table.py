"""Properties of `ops.block_table` (see `pyagent_ref/ops/block_table.py` for the contract).

A batch is drawn the way a scheduler builds one: 0-6 requests with 0-8 new tokens each
(1-8 for the logits indices, where every request samples), a few padding tokens, block
size 1-16, a block table of 1-8 columns of random block ids, int32 and int64 arrays
mixed freely. Positions are consecutive from the request's computed tokens or arbitrary
inside its table; padding tokens carry any position, negative or far past the table,
since the ops must ignore them. The invariants re-derive the slot formula
`block_table[r, p // block_size] * block_size + p % block_size` piece by piece; the
differential check is exact.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import strategies as st

from .. import checks, contract
from ..core import Case, Ctx, Spec, to_numpy
from ._common import (
    add_does_not_modify_inputs,
    add_matches_reference,
    add_rejects_invalid_input,
    error_variants,
    hnp,
    reference_shapes,
)

OPS = contract.names("block_table")
PAD_SLOT_ID = -1

spec = Spec("block_table", OPS)

SHAPES = reference_shapes("block_table")

# --- strategies -----------------------------------------------------------------------------

INT_DTYPES = (np.int32, np.int64)
int_dtypes = st.sampled_from(INT_DTYPES)
I32_MAX = 2**31 - 1


def top(dtype: Any) -> int:
    """The largest value drawn for an array of `dtype` (int64 stays far from overflow)."""
    return I32_MAX if np.dtype(dtype) == np.int32 else 2**40


def values(dtype: Any, small: int) -> Any:
    """Mostly small non-negative ints, sometimes up to the dtype's range."""
    return st.one_of(st.integers(0, small), st.integers(0, top(dtype)), st.just(top(dtype)))


@st.composite
def query_lengths(draw: Any, min_len: int = 0, max_len: int = 8) -> list[int]:
    """New tokens of each of 0-6 scheduled requests."""
    n = draw(st.integers(0, 6))
    return draw(st.lists(st.integers(min_len, max_len), min_size=n, max_size=n))


def qsl_of(lengths: list[int], dtype: Any) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]).astype(dtype)


def padding_positions(dtype: Any, n: int, capacity: int) -> Any:
    """Positions of padding tokens: anything the dtype holds (the ops must ignore them)."""
    info = np.iinfo(dtype)
    return st.lists(
        st.one_of(
            st.integers(-3, 2 * capacity),
            st.sampled_from((0, -1, int(info.min), int(info.max))),
        ),
        min_size=n,
        max_size=n,
    )


@st.composite
def positions_cases(draw: Any) -> Case:
    lengths = draw(query_lengths())
    dtype = draw(int_dtypes)
    nct = draw(st.lists(values(dtype, 4096), min_size=len(lengths), max_size=len(lengths)))
    total = sum(lengths)
    return Case(
        query_start_loc=qsl_of(lengths, draw(int_dtypes)),
        num_computed_tokens=np.array(nct, dtype=dtype),
        num_tokens=total + draw(st.integers(0, 4)),
    )


@st.composite
def slot_cases(draw: Any, distinct: bool = False, min_tokens: int = 0) -> Case:
    """A valid batch. distinct=True: every block id of the table differs and each request's
    positions are consecutive (so no two tokens may share a slot)."""
    lengths = draw(query_lengths())
    if sum(lengths) < min_tokens:
        lengths = [*lengths, min_tokens]
    block_size = draw(st.integers(1, 16))
    max_blocks = draw(st.integers(1, 8))
    capacity = max_blocks * block_size
    table_dtype, pos_dtype = draw(int_dtypes), draw(int_dtypes)
    table = draw(
        hnp.arrays(
            np.dtype(table_dtype),
            (len(lengths), max_blocks),
            elements=values(table_dtype, 1000),
            unique=distinct,
        )
    )
    if distinct:  # consecutive positions must fit the table
        lengths = [min(n, capacity) for n in lengths]
    positions: list[int] = []
    for n in lengths:
        if distinct or (n <= capacity and draw(st.booleans())):
            start = draw(st.integers(0, capacity - n))  # a chunk of consecutive positions
            positions += range(start, start + n)
        else:
            positions += draw(st.lists(st.integers(0, capacity - 1), min_size=n, max_size=n))
    pad = draw(st.integers(0, 4))
    positions += draw(padding_positions(pos_dtype, pad, capacity))
    return Case(
        block_table=table,
        query_start_loc=qsl_of(lengths, draw(int_dtypes)),
        positions=np.array(positions, dtype=pos_dtype),
        block_size=block_size,
    )


@st.composite
def logits_cases(draw: Any) -> Case:
    """Every request has 1-8 tokens (each samples one token)."""
    return Case(query_start_loc=qsl_of(draw(query_lengths(min_len=1)), draw(int_dtypes)))


def call(ctx: Ctx, op: str, case: Case) -> np.ndarray:
    """The implementation's result for `case`, as numpy."""
    return ctx.call(op, *SHAPES[op].call_args(case))


def requests(case: Case) -> list[tuple[int, int, int]]:
    """(request, first token, end token) of each request of the case."""
    q = [int(v) for v in case.query_start_loc]
    return [(r, q[r], q[r + 1]) for r in range(len(q) - 1)]


def assert_int64(out: np.ndarray, n: int, what: str = "result") -> None:
    checks.assert_shape_dtype(out, (n,), np.int64, what)


def add_int_dtypes_alike(op: str, cases: Any) -> None:
    def int32_and_int64_alike(ctx: Ctx, case: Case) -> None:
        """The same values as int32 or as int64 arrays (every combination) give the same int64
        result."""
        args = SHAPES[op].call_args(case)
        arrays = [i for i, a in enumerate(args) if isinstance(a, np.ndarray)]
        if not all(np.array_equal(args[i], args[i].astype(np.int32)) for i in arrays):
            return  # a value needs 64 bits: only the int64 form exists
        results = []
        for mask in range(2 ** len(arrays)):
            form = list(args)
            for bit, i in enumerate(arrays):
                form[i] = args[i].astype(np.int32 if mask >> bit & 1 else np.int64)
            results.append((mask, ctx.call(op, *form)))
        names = [SHAPES[op].args[i] for i in arrays]
        for mask, out in results[1:]:
            as32 = [name for bit, name in enumerate(names) if mask >> bit & 1]
            what = f"result with {', '.join(as32)} as int32"
            assert out.dtype == np.int64, f"{what} has dtype {out.dtype}"
            checks.assert_equal(out, results[0][1], what=what)

    spec.add(op, int32_and_int64_alike, cases)


def add_accepts_strided_inputs(op: str, cases: Any) -> None:
    def accepts_strided_input(ctx: Ctx, case: Case) -> None:
        """Every array argument as a non-contiguous view (padded rows, every other element,
        column-major) gives the result of contiguous copies: the spec does not restrict the
        memory layout."""
        args = SHAPES[op].call_args(case)
        want = ctx.call(op, *args)
        for layout in ctx.LAYOUTS:
            views = [ctx.strided(a, layout) if isinstance(a, np.ndarray) else a for a in args]
            got = to_numpy(ctx.fn(op)(*views))
            checks.assert_equal(got, want, what=f"result for {layout} inputs")

    spec.add(op, accepts_strided_input, cases)


def add_common(op: str, cases: Any, errors: Any, doc: str) -> None:
    shape = SHAPES[op]
    add_does_not_modify_inputs(spec, shape, cases)
    add_rejects_invalid_input(spec, shape, errors)
    add_matches_reference(spec, shape, cases, checks.exactly_the_reference, doc)
    add_int_dtypes_alike(op, cases)
    add_accepts_strided_inputs(op, cases)


def _replace(case: Case, op: str, **changes: Any) -> tuple[Any, ...]:
    args = {name: getattr(case, name) for name in SHAPES[op].args}
    args.update(changes)
    return tuple(args.values())


def _decreasing(qsl: np.ndarray) -> np.ndarray | None:
    """query_start_loc with one decrease (same length), or None when it has one entry."""
    if qsl.shape[0] < 2:
        return None
    bad = qsl.copy()
    if bad.shape[0] >= 3:
        bad[1] = bad[2] + 1
    else:
        bad[1] = -1
    return bad


def qsl_errors(qsl: np.ndarray) -> list[tuple[str, dict[str, Any], type]]:
    """Malformed query_start_loc variants shared by the three ops."""
    out: list[tuple[str, dict[str, Any], type]] = [
        ("float query_start_loc", {"query_start_loc": qsl.astype(np.float64)}, TypeError),
        ("int16 query_start_loc", {"query_start_loc": qsl.astype(np.int16)}, TypeError),
        ("query_start_loc given as a list", {"query_start_loc": qsl.tolist()}, TypeError),
        ("2-D query_start_loc", {"query_start_loc": qsl[None, :]}, ValueError),
        ("empty query_start_loc", {"query_start_loc": qsl[:0]}, ValueError),
        ("query_start_loc not starting at 0", {"query_start_loc": qsl + 1}, ValueError),
    ]
    dec = _decreasing(qsl)
    if dec is not None:
        out.append(("a decreasing query_start_loc", {"query_start_loc": dec}, ValueError))
    return out


# ========================================================================== compute_positions


@spec.prop("compute_positions", positions_cases())
def continue_from_computed_tokens(ctx: Ctx, case: Case) -> None:
    """Token t of request r is at position num_computed_tokens[r] + t - query_start_loc[r]."""
    out = call(ctx, "compute_positions", case)
    assert_int64(out, case.num_tokens)
    for r, start, end in requests(case):
        want = int(case.num_computed_tokens[r]) + np.arange(end - start, dtype=np.int64)
        checks.assert_equal(out[start:end], want, what=f"positions of request {r}")


@spec.prop("compute_positions", positions_cases())
def padding_positions_are_zero(ctx: Ctx, case: Case) -> None:
    """Tokens at or past query_start_loc[-1] (padding) are at position 0."""
    out = call(ctx, "compute_positions", case)
    total = int(case.query_start_loc[-1])
    checks.assert_equal(out[total:], np.zeros(case.num_tokens - total, np.int64), "padding")


@spec.prop("compute_positions", positions_cases(), name="returns_documented_types")
def positions_returns_documented_types(ctx: Ctx, case: Case) -> None:
    """int64 positions of shape (num_tokens,), in query_start_loc's library and device."""
    args = [ctx.convert(a) for a in SHAPES["compute_positions"].call_args(case)]
    out = ctx.fn("compute_positions")(*args)
    problem = checks.same_library(out, args[0])
    assert problem is None, problem
    assert checks.dtype_name(out) == "int64", f"dtype {checks.dtype_name(out)}"
    assert tuple(out.shape) == (case.num_tokens,), f"shape {tuple(out.shape)}"


def positions_errors(case: Case) -> list[tuple[str, tuple[Any, ...], type]]:
    qsl, nct, n = case.query_start_loc, case.num_computed_tokens, case.num_tokens
    total = int(qsl[-1])
    options = qsl_errors(qsl) + [
        ("float num_computed_tokens", {"num_computed_tokens": nct.astype(np.float64)}, TypeError),
        ("2-D num_computed_tokens", {"num_computed_tokens": nct[:, None]}, ValueError),
        (
            "num_computed_tokens of length num_reqs + 1",
            {"num_computed_tokens": np.append(nct, nct[:1] if nct.size else 0).astype(nct.dtype)},
            ValueError,
        ),
        # The reference raises ValueError for any num_tokens that is not an int >= qsl[-1]
        # (a float, a bool, a numpy integer): the docstring's "num_tokens: int >= qsl[-1]".
        ("num_tokens given as a float", {"num_tokens": float(n)}, ValueError),
        ("num_tokens given as True", {"num_tokens": True}, ValueError),
        ("num_tokens given as a numpy int", {"num_tokens": np.int64(n)}, ValueError),
        ("num_tokens == -1", {"num_tokens": -1}, ValueError),
    ]
    if total >= 1:
        options.append(("num_tokens < query_start_loc[-1]", {"num_tokens": total - 1}, ValueError))
    if nct.size:
        neg = nct.copy()
        neg[-1] = -1
        options.append(("a negative num_computed_tokens", {"num_computed_tokens": neg}, ValueError))
    out = []
    for why, change, exc in options:
        args = _replace(case, "compute_positions", **change)
        out.append((why, args, exc))
    return out


add_common(
    "compute_positions",
    positions_cases(),
    error_variants(positions_cases(), positions_errors),
    "Exactly the reference's positions (int64).",
)


# ======================================================================= compute_slot_mapping


@spec.prop("compute_slot_mapping", slot_cases())
def slot_is_in_the_tables_block(ctx: Ctx, case: Case) -> None:
    """For token t of request r at position p: slot // block_size == block_table[r, p //
    block_size], the block holding p."""
    out = call(ctx, "compute_slot_mapping", case)
    assert_int64(out, case.positions.shape[0])
    bs = case.block_size
    for r, start, end in requests(case):
        for t in range(start, end):
            p = int(case.positions[t])
            want = int(case.block_table[r, p // bs])
            assert int(out[t]) // bs == want, (
                f"token {t} (request {r}, position {p}): slot {int(out[t])} is in block "
                f"{int(out[t]) // bs}, the table says block {want}"
            )


@spec.prop("compute_slot_mapping", slot_cases())
def offset_is_position_mod_block_size(ctx: Ctx, case: Case) -> None:
    """slot % block_size == position % block_size: a block's slots follow the positions in it."""
    out = call(ctx, "compute_slot_mapping", case)
    total, bs = int(case.query_start_loc[-1]), case.block_size
    for t in range(total):
        p = int(case.positions[t])
        assert int(out[t]) % bs == p % bs, (
            f"token {t} at position {p}: slot {int(out[t])} is at offset {int(out[t]) % bs} "
            f"of its block, expected {p % bs} (block_size {bs})"
        )


@spec.prop("compute_slot_mapping", slot_cases())
def padding_gets_pad_slot_id(ctx: Ctx, case: Case) -> None:
    """Tokens at or past query_start_loc[-1] get PAD_SLOT_ID (-1), whatever their position."""
    out = call(ctx, "compute_slot_mapping", case)
    total = int(case.query_start_loc[-1])
    pad = out[total:]
    checks.assert_equal(pad, np.full(pad.shape, PAD_SLOT_ID, np.int64), what="padding slots")


@spec.prop("compute_slot_mapping", slot_cases(distinct=True))
def distinct_blocks_give_distinct_slots(ctx: Ctx, case: Case) -> None:
    """With distinct block ids in the table and distinct positions per request, no two tokens
    share a slot (no KV entry is written twice)."""
    out = call(ctx, "compute_slot_mapping", case)
    real = out[: int(case.query_start_loc[-1])]
    seen: dict[int, int] = {}
    for t, s in enumerate(real.tolist()):
        assert s not in seen, f"tokens {seen[s]} and {t} both get slot {s}"
        seen[s] = t


@spec.prop("compute_slot_mapping", st.tuples(slot_cases(), st.data()))
def ignores_unused_table_entries(ctx: Ctx, pair: Any) -> None:
    """Block-table entries that no token's position reaches (and rows of requests without
    tokens) can hold anything: changing them leaves every slot unchanged."""
    case, data = pair
    table = case.block_table
    used = np.zeros(table.shape, bool)
    for r, start, end in requests(case):
        for t in range(start, end):
            used[r, int(case.positions[t]) // case.block_size] = True
    if used.all():
        return
    fill = data.draw(st.integers(0, top(table.dtype)), label="new entry")
    other = np.where(used, table, np.asarray(fill, table.dtype))
    want = call(ctx, "compute_slot_mapping", case)
    got = ctx.call(
        "compute_slot_mapping", other, case.query_start_loc, case.positions, case.block_size
    )
    checks.assert_equal(got, want, what="slots after changing unused table entries")


@spec.prop("compute_slot_mapping", slot_cases(), name="returns_documented_types")
def slots_returns_documented_types(ctx: Ctx, case: Case) -> None:
    """int64 slots of shape (num_tokens,), in block_table's library and device."""
    args = [ctx.convert(a) for a in SHAPES["compute_slot_mapping"].call_args(case)]
    out = ctx.fn("compute_slot_mapping")(*args)
    problem = checks.same_library(out, args[0])
    assert problem is None, problem
    assert checks.dtype_name(out) == "int64", f"dtype {checks.dtype_name(out)}"
    assert tuple(out.shape) == (case.positions.shape[0],), f"shape {tuple(out.shape)}"


@spec.prop("compute_slot_mapping", st.tuples(slot_cases(min_tokens=1), st.data()))
def errors_name_the_token(ctx: Ctx, pair: Any) -> None:
    """A negative position, or one past the request's block table, raises ValueError naming the
    token (positions[t]) and the position."""
    case, data = pair
    total = int(case.query_start_loc[-1])
    t = data.draw(st.integers(0, total - 1), label="bad token")
    capacity = case.block_table.shape[1] * case.block_size
    info = np.iinfo(case.positions.dtype)
    bad = data.draw(
        st.one_of(st.integers(int(info.min), -1), st.integers(capacity, int(info.max))),
        label="bad position",
    )
    positions = case.positions.copy()
    positions[t] = bad
    exc = ctx.raises(
        "compute_slot_mapping", case.block_table, case.query_start_loc, positions, case.block_size
    )
    assert isinstance(exc, ValueError), f"positions[{t}] = {bad}: raised {exc!r}, not ValueError"
    assert f"positions[{t}]" in str(exc) and str(bad) in str(exc), (
        f"the message does not name positions[{t}] and {bad}: {exc}"
    )


def slot_errors(case: Case) -> list[tuple[str, tuple[Any, ...], type]]:
    table, qsl, pos, bs = case.block_table, case.query_start_loc, case.positions, case.block_size
    total = int(qsl[-1])
    options = qsl_errors(qsl) + [
        ("float block_table", {"block_table": table.astype(np.float64)}, TypeError),
        ("bool block_table", {"block_table": table > 0}, TypeError),
        ("block_table given as a list", {"block_table": table.tolist()}, TypeError),
        ("1-D block_table", {"block_table": table.reshape(-1)}, ValueError),
        ("float positions", {"positions": pos.astype(np.float64)}, TypeError),
        ("int16 positions", {"positions": pos.astype(np.int16)}, TypeError),
        ("2-D positions", {"positions": pos[:, None]}, ValueError),
        ("block_size 0", {"block_size": 0}, ValueError),
        ("a negative block_size", {"block_size": -bs}, ValueError),
        ("a float block_size", {"block_size": float(bs)}, TypeError),
        ("block_size True", {"block_size": True}, TypeError),
        ("a numpy int block_size", {"block_size": np.int64(bs)}, TypeError),
        (
            "query_start_loc with one entry more than the table's rows",
            {"query_start_loc": np.append(qsl, qsl[-1]).astype(qsl.dtype)},
            ValueError,
        ),
    ]
    if table.shape[0]:
        options.append(("one block table row too few", {"block_table": table[:-1]}, ValueError))
    if total >= 1:
        neg, past = pos.copy(), pos.copy()
        neg[total - 1] = -1
        past[0] = table.shape[1] * bs
        options += [
            ("fewer positions than tokens", {"positions": pos[: total - 1]}, ValueError),
            ("a negative position", {"positions": neg}, ValueError),
            ("a position past the block table", {"positions": past}, ValueError),
        ]
    return [(why, _replace(case, "compute_slot_mapping", **c), e) for why, c, e in options]


add_common(
    "compute_slot_mapping",
    slot_cases(),
    error_variants(slot_cases(), slot_errors),
    "Exactly the reference's slots (int64, PAD_SLOT_ID for padding).",
)


# ===================================================================== compute_logits_indices


@spec.prop("compute_logits_indices", logits_cases())
def last_token_of_each_request(ctx: Ctx, case: Case) -> None:
    """Entry r is query_start_loc[r + 1] - 1, the last token of request r."""
    out = call(ctx, "compute_logits_indices", case)
    reqs = requests(case)
    assert_int64(out, len(reqs))
    for r, start, end in reqs:
        assert int(out[r]) == end - 1, (
            f"request {r} owns tokens [{start}, {end}), its logits index is {int(out[r])}"
        )


@spec.prop(
    "compute_logits_indices",
    st.tuples(logits_cases(), st.lists(st.integers(0, 4096), min_size=6, max_size=6)),
    uses=("compute_positions",),
)
def indexes_the_last_position(ctx: Ctx, pair: Any) -> None:
    """The indexed token is at the request's last position: positions[index[r]] ==
    num_computed_tokens[r] + new tokens of r - 1 (with compute_positions)."""
    case, computed = pair
    reqs = requests(case)
    nct = np.array(computed[: len(reqs)], dtype=np.int64)
    total = int(case.query_start_loc[-1])
    positions = ctx.call("compute_positions", case.query_start_loc, nct, total)
    out = call(ctx, "compute_logits_indices", case)
    for r, start, end in reqs:
        got = int(positions[int(out[r])])
        assert got == int(nct[r]) + end - start - 1, (
            f"request {r}: index {int(out[r])} is at position {got}, its last position is "
            f"{int(nct[r]) + end - start - 1}"
        )


@spec.prop("compute_logits_indices", logits_cases(), name="returns_documented_types")
def logits_indices_returns_documented_types(ctx: Ctx, case: Case) -> None:
    """int64 indices of shape (num_reqs,), in query_start_loc's library and device."""
    qsl = ctx.convert(case.query_start_loc)
    out = ctx.fn("compute_logits_indices")(qsl)
    problem = checks.same_library(out, qsl)
    assert problem is None, problem
    assert checks.dtype_name(out) == "int64", f"dtype {checks.dtype_name(out)}"
    assert tuple(out.shape) == (case.query_start_loc.shape[0] - 1,), f"shape {tuple(out.shape)}"
    assert out is not qsl, "returned the input object itself"


def logits_errors(case: Case) -> list[tuple[str, tuple[Any, ...], type]]:
    qsl = case.query_start_loc
    options = qsl_errors(qsl)
    options.append(
        (
            "a request with no tokens",
            {"query_start_loc": np.insert(qsl, 1, 0).astype(qsl.dtype)},
            ValueError,
        )
    )
    if qsl.shape[0] >= 2:
        options.append(
            (
                "a last request with no tokens",
                {"query_start_loc": np.append(qsl, qsl[-1]).astype(qsl.dtype)},
                ValueError,
            )
        )
    return [(why, _replace(case, "compute_logits_indices", **c), e) for why, c, e in options]


add_common(
    "compute_logits_indices",
    logits_cases(),
    error_variants(logits_cases(), logits_errors),
    "Exactly the reference's indices (int64).",
)


# ================================================================================= constants


def pad_slot_id_constant(ctx: Ctx) -> None:
    """PAD_SLOT_ID is -1, the slot the cache write skips."""
    value = ctx.fn("PAD_SLOT_ID")
    assert value == PAD_SLOT_ID and isinstance(value, int), f"got {value!r}"


spec.add("PAD_SLOT_ID", pad_slot_id_constant, name="equals_specified_value")
