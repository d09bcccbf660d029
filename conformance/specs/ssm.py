"""Properties of `ops.ssm` (see `pyagent_ref/ops/ssm.py` for the contract).

Inputs are flattened batches of 0-3 sequences of 0-9 tokens (empty sequences included)
with int32 or int64 `query_start_loc`, in float16, float32 or float64: convolutions of
1-5 channels and widths 1-4, with and without bias and silu; Mamba-1 scans of 1-4
channels and 1-3 state features; Mamba-2 scans of 1, 2, 4 or 6 heads (groups dividing
them) of
1-3 channels and 1-3 state features, chunk sizes 1-4 (so that sequences span several
chunks). A is drawn in [-2, 0], step sizes in [-3, 1] through softplus or in [0, 1]
without, every other value in [-2, 2]; carried states too.

Oracle: the recurrences of the docstrings step by step in float64. Tolerance: the error
of a float32 evaluation grows with the length of the recurrence behind a value, so an
output of the token at index j of its sequence (or a final state after j + 1 tokens)
may differ from the oracle by

    T * (8 + 4 (j + 1) + N) * M

where M is the same recurrence run on magnitudes (|x|, |B|, |C|, |state|, |D x| ...:
every decay is positive, so M bounds the sum of the terms' sizes), N the state size, T
= 4e-6 for float32 compute and 1e-14 for float64. A convolution's output may differ by
T * (8 + w) * (|bias| + sum of |weight| |input|), plus its own rounding to float16
(1e-3 relative); its new state holds inputs and is compared exactly.
"""

from __future__ import annotations

from typing import Any

import hypothesis.extra.numpy as hnp
import numpy as np
from hypothesis import strategies as st

import pyagent_ref.ops.ssm  # noqa: F401 - binds pyagent_ref.ops.ssm for the reference

from .. import checks, contract
from ..core import Case, Ctx, Spec
from ._common import (
    add_does_not_modify_inputs,
    add_matches_reference,
    add_rejects_invalid_input,
    assert_within,
    check_like_input,
    error_variants,
    reference_shapes,
)

OPS = contract.names("ssm")
TOL = {"float32": 4e-6, "float64": 1e-14}
DTYPES = (np.float16, np.float32, np.float64)

spec = Spec("ssm", OPS)

SHAPES = reference_shapes("ssm")


def compute_name(x: np.ndarray) -> str:
    return "float64" if x.dtype == np.float64 else "float32"


def call(ctx: Ctx, op: str, case: Case) -> Any:
    return ctx.call(op, *SHAPES[op].call_args(case))


# --- strategies -----------------------------------------------------------------------------


def values(draw: Any, dtype: Any, shape: tuple[int, ...], low: float, high: float) -> np.ndarray:
    width = {np.float16: 16, np.float32: 32, np.float64: 64}[np.dtype(dtype).type]
    elements = st.one_of(
        st.sampled_from((0.0, low, high, (low + high) / 2)),
        st.floats(low, high, width=width),
    )
    return draw(hnp.arrays(np.dtype(dtype), shape, elements=elements))


def batch_layout(draw: Any, max_len: int = 9) -> np.ndarray:
    lengths = draw(st.lists(st.integers(0, max_len), min_size=0, max_size=3))
    dtype = draw(st.sampled_from((np.int32, np.int64)))
    return np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]).astype(dtype)


@st.composite
def conv_cases(draw: Any) -> Case:
    dtype = draw(st.sampled_from(DTYPES))
    qsl = batch_layout(draw)
    tokens, seqs = int(qsl[-1]), len(qsl) - 1
    channels, width = draw(st.integers(1, 5)), draw(st.integers(1, 4))
    return Case(
        x=values(draw, dtype, (tokens, channels), -2, 2),
        weight=values(draw, dtype, (channels, width), -1.5, 1.5),
        bias=values(draw, dtype, (channels,), -1, 1) if draw(st.booleans()) else None,
        conv_state=values(draw, dtype, (seqs, channels, width - 1), -2, 2),
        query_start_loc=qsl,
        activation=draw(st.sampled_from((None, "silu"))),
    )


def step_inputs(draw: Any, dtype: Any, shape: tuple[int, ...]) -> tuple[np.ndarray, bool]:
    """(dt, dt_softplus): raw steps in [-3, 1] through softplus, or steps in [0, 1]."""
    softplus = draw(st.booleans())
    return values(draw, dtype, shape, -3 if softplus else 0, 1), softplus


@st.composite
def scan_cases(draw: Any) -> Case:
    dtype = draw(st.sampled_from(DTYPES))
    qsl = batch_layout(draw)
    tokens, seqs = int(qsl[-1]), len(qsl) - 1
    channels, n = draw(st.integers(1, 4)), draw(st.integers(1, 3))
    dt, softplus = step_inputs(draw, dtype, (tokens, channels))
    optional = draw(st.lists(st.booleans(), min_size=3, max_size=3))
    return Case(
        x=values(draw, dtype, (tokens, channels), -2, 2),
        dt=dt,
        A=values(draw, dtype, (channels, n), -2, 0),
        B=values(draw, dtype, (tokens, n), -2, 2),
        C=values(draw, dtype, (tokens, n), -2, 2),
        state=values(draw, draw(st.sampled_from((np.float32, dtype))), (seqs, channels, n), -2, 2),
        query_start_loc=qsl,
        D=values(draw, dtype, (channels,), -1, 1) if optional[0] else None,
        z=values(draw, dtype, (tokens, channels), -2, 2) if optional[1] else None,
        dt_bias=values(draw, dtype, (channels,), -1, 1) if optional[2] and softplus else None,
        dt_softplus=softplus,
        chunk_size=draw(st.sampled_from((None, 1, 2, 3, 4))),
    )


def head_layout(draw: Any) -> tuple[int, int, int, int]:
    """(heads, groups, P, N) with groups dividing heads."""
    heads = draw(st.sampled_from((1, 2, 4, 6)))  # 4 and 6: groups strictly between
    groups = draw(st.sampled_from([g for g in range(1, heads + 1) if heads % g == 0]))
    return heads, groups, draw(st.integers(1, 3)), draw(st.integers(1, 3))


@st.composite
def ssd_cases(draw: Any) -> Case:
    dtype = draw(st.sampled_from(DTYPES))
    qsl = batch_layout(draw)
    tokens, seqs = int(qsl[-1]), len(qsl) - 1
    heads, groups, p, n = head_layout(draw)
    dt, softplus = step_inputs(draw, dtype, (tokens, heads))
    optional = draw(st.lists(st.booleans(), min_size=2, max_size=2))
    return Case(
        x=values(draw, dtype, (tokens, heads, p), -2, 2),
        dt=dt,
        A=values(draw, dtype, (heads,), -2, 0),
        B=values(draw, dtype, (tokens, groups, n), -2, 2),
        C=values(draw, dtype, (tokens, groups, n), -2, 2),
        state=values(draw, draw(st.sampled_from((np.float32, dtype))), (seqs, heads, p, n), -2, 2),
        query_start_loc=qsl,
        chunk_size=draw(st.integers(1, 4)),
        D=values(draw, dtype, (heads,), -1, 1) if optional[0] else None,
        dt_bias=values(draw, dtype, (heads,), -1, 1) if optional[1] and softplus else None,
        dt_softplus=softplus,
    )


@st.composite
def update_cases(draw: Any) -> Case:
    dtype = draw(st.sampled_from(DTYPES))
    seqs = draw(st.integers(0, 4))
    heads, groups, p, n = head_layout(draw)
    dt, softplus = step_inputs(draw, dtype, (seqs, heads))
    optional = draw(st.lists(st.booleans(), min_size=2, max_size=2))
    return Case(
        state=values(draw, draw(st.sampled_from((np.float32, dtype))), (seqs, heads, p, n), -2, 2),
        x=values(draw, dtype, (seqs, heads, p), -2, 2),
        dt=dt,
        A=values(draw, dtype, (heads,), -2, 0),
        B=values(draw, dtype, (seqs, groups, n), -2, 2),
        C=values(draw, dtype, (seqs, groups, n), -2, 2),
        D=values(draw, dtype, (heads,), -1, 1) if optional[0] else None,
        dt_bias=values(draw, dtype, (heads,), -1, 1) if optional[1] and softplus else None,
        dt_softplus=softplus,
    )


# --- oracles --------------------------------------------------------------------------------


def _f64(v: Any) -> Any:
    return None if v is None else np.asarray(v, dtype=np.float64)


def sequences(qsl: np.ndarray) -> list[range]:
    return [range(int(a), int(b)) for a, b in zip(qsl[:-1], qsl[1:], strict=True)]


def conv_oracle(case: Case) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(out, new_state, magnitude of out's terms) in float64."""
    x, w = _f64(case.x), _f64(case.weight)
    bias = np.zeros(x.shape[1]) if case.bias is None else _f64(case.bias)
    k = w.shape[1] - 1
    out, mag, finals = np.zeros(x.shape), np.zeros(x.shape), []
    for s, rows in enumerate(sequences(case.query_start_loc)):
        xx = np.concatenate([_f64(case.conv_state[s]).T, x[rows.start : rows.stop]])
        for j, t in enumerate(rows):
            window = xx[j : j + k + 1]  # oldest first
            v = bias + np.sum(w.T * window, axis=0)
            out[t] = v / (1 + np.exp(-v)) if case.activation == "silu" else v
            mag[t] = np.abs(bias) + np.sum(np.abs(w.T * window), axis=0)
        finals.append(xx[len(xx) - k :].T if k else np.zeros((x.shape[1], 0)))
    state = np.stack(finals) if finals else np.zeros(case.conv_state.shape)
    return out, state, mag


def _steps(case: Case, rows: Any) -> np.ndarray:
    d = _f64(case.dt)[rows]
    if case.dt_bias is not None:
        d = d + _f64(case.dt_bias)
    return np.logaddexp(0.0, d) if case.dt_softplus else d


def scan_oracle(case: Case) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Mamba-1 step by step: (y, new_state, magnitude of y, of new_state), float64."""
    x, a, b, c = (_f64(v) for v in (case.x, case.A, case.B, case.C))
    y, y_mag, finals, f_mag = np.zeros(x.shape), np.zeros(x.shape), [], []
    for s, rows in enumerate(sequences(case.query_start_loc)):
        h = _f64(case.state[s])
        hm = np.abs(h)
        for t in rows:
            d = _steps(case, t)
            decay = np.exp(d[:, None] * a)
            h = decay * h + (d * x[t])[:, None] * b[t][None, :]
            hm = decay * hm + np.abs(d * x[t])[:, None] * np.abs(b[t])[None, :]
            y[t], y_mag[t] = h @ c[t], hm @ np.abs(c[t])
            if case.D is not None:
                y[t] += _f64(case.D) * x[t]
                y_mag[t] += np.abs(_f64(case.D) * x[t])
            if case.z is not None:
                z = _f64(case.z)[t]
                gate = z / (1 + np.exp(-z))
                y[t], y_mag[t] = y[t] * gate, y_mag[t] * (np.abs(gate) + 1)
        finals.append(h)
        f_mag.append(hm)
    shape = case.state.shape
    return y, _stack(finals, shape), y_mag, _stack(f_mag, shape)


def _stack(arrays: list[np.ndarray], shape: tuple[int, ...]) -> np.ndarray:
    return np.stack(arrays) if arrays else np.zeros(shape)


def ssd_oracle(case: Case) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Mamba-2 step by step: (y, new_state, magnitude of y, of new_state), float64."""
    x, a, b, c = (_f64(v) for v in (case.x, case.A, case.B, case.C))
    heads, groups = x.shape[1], b.shape[1]
    g = np.arange(heads) // (heads // groups)
    y, y_mag, finals, f_mag = np.zeros(x.shape), np.zeros(x.shape), [], []
    for s, rows in enumerate(sequences(case.query_start_loc)):
        h = _f64(case.state[s])
        hm = np.abs(h)
        for t in rows:
            d = _steps(case, t)  # (heads,)
            decay = np.exp(d * a)[:, None, None]
            h = decay * h + (d[:, None] * x[t])[:, :, None] * b[t][g][:, None, :]
            hm = decay * hm + np.abs(d[:, None] * x[t])[:, :, None] * np.abs(b[t][g])[:, None, :]
            y[t] = np.einsum("hpn,hn->hp", h, c[t][g])
            y_mag[t] = np.einsum("hpn,hn->hp", hm, np.abs(c[t][g]))
            if case.D is not None:
                y[t] += _f64(case.D)[:, None] * x[t]
                y_mag[t] += np.abs(_f64(case.D)[:, None] * x[t])
        finals.append(h)
        f_mag.append(hm)
    shape = case.state.shape
    return y, _stack(finals, shape), y_mag, _stack(f_mag, shape)


def update_as_ssd(case: Case) -> Case:
    """The `ssd_scan` case of one token per sequence that a state update is."""
    seqs = case.x.shape[0]
    return Case(
        x=case.x,
        dt=case.dt,
        A=case.A,
        B=case.B,
        C=case.C,
        state=case.state,
        query_start_loc=np.arange(seqs + 1, dtype=np.int64),
        chunk_size=1,
        D=case.D,
        dt_bias=case.dt_bias,
        dt_softplus=case.dt_softplus,
    )


def positions(qsl: np.ndarray) -> np.ndarray:
    """The index of each token within its sequence."""
    out = np.zeros(int(qsl[-1]), dtype=np.int64)
    for rows in sequences(qsl):
        out[rows.start : rows.stop] = np.arange(len(rows))
    return out


def scan_tol(case: Case, mag: np.ndarray, state_mag: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(tolerance of y, of new_state), see the module docstring."""
    t, n = TOL[compute_name(case.x)], case.B.shape[-1]
    j = positions(case.query_start_loc).reshape((-1,) + (1,) * (mag.ndim - 1))
    lengths = np.diff(case.query_start_loc.astype(np.int64))
    lengths = lengths.reshape((-1,) + (1,) * (state_mag.ndim - 1))
    return (
        t * (8 + 4 * (j + 1) + n) * mag + 1e-30,
        t * (8 + 4 * (lengths + 1) + n) * state_mag + 1e-30,
    )


def conv_tol(case: Case, want: np.ndarray, mag: np.ndarray) -> np.ndarray:
    tol = TOL[compute_name(case.x)] * (8 + case.weight.shape[1]) * mag
    if case.x.dtype == np.float16:
        tol = tol + 1e-3 * np.abs(want) + 6e-8
    return tol + 1e-30


def split_case(case: Case, cuts: list[int], token_arrays: tuple[str, ...]) -> tuple[Case, Case]:
    """The case cut in two calls: each sequence's first cuts[s] tokens, then the rest
    (whose state the caller fills in)."""
    rows = sequences(case.query_start_loc)
    first = [t for r, c in zip(rows, cuts, strict=True) for t in r[:c]]
    rest = [t for r, c in zip(rows, cuts, strict=True) for t in r[c:]]
    out = []
    rest_lengths = [len(r) - c for r, c in zip(rows, cuts, strict=True)]
    for take, lengths in ((first, cuts), (rest, rest_lengths)):
        fields = dict(vars(case))
        fields.pop("_fields")
        for name in token_arrays:
            if fields.get(name) is not None:
                fields[name] = fields[name][np.asarray(take, dtype=np.int64)]
        qsl = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])
        fields["query_start_loc"] = qsl.astype(case.query_start_loc.dtype)
        out.append(Case(**fields))
    return out[0], out[1]


def draw_cuts(draw: Any, case: Case) -> list[int]:
    return [draw(st.integers(0, len(r))) for r in sequences(case.query_start_loc)]


def merge(first: np.ndarray, rest: np.ndarray, case: Case, cuts: list[int]) -> np.ndarray:
    """Token rows of two split calls back in the order of the whole call."""
    out, i, k = [], 0, 0
    for r, c in zip(sequences(case.query_start_loc), cuts, strict=True):
        out += [first[i : i + c], rest[k : k + len(r) - c]]
        i, k = i + c, k + len(r) - c
    return np.concatenate(out) if out else first


# ============================================================================ causal_conv1d


def _conv_args(case: Case) -> tuple[Any, ...]:
    return SHAPES["causal_conv1d"].call_args(case)


@spec.prop("causal_conv1d", conv_cases(), name="returns_documented_types")
def conv_returns_documented_types(ctx: Ctx, case: Case) -> None:
    """(out, new_state): out in x's library, dtype and shape; new_state in conv_state's."""
    args = [ctx.convert(a) for a in _conv_args(case)]
    out = ctx.fn("causal_conv1d")(*args)
    assert isinstance(out, tuple) and len(out) == 2, f"returned {type(out).__name__}"
    check_like_input(out[0], args[0], "out")
    check_like_input(out[1], args[3], "new_state")


@spec.prop("causal_conv1d", conv_cases())
def matches_the_formula(ctx: Ctx, case: Case) -> None:
    """out[t, c] = act(bias[c] + sum_i weight[c, i] xx[j + i, c]) over the sequence's
    carried inputs and tokens, within T (8 + w) M of a float64 oracle."""
    out, _ = call(ctx, "causal_conv1d", case)
    want, _, mag = conv_oracle(case)
    assert_within(out, want, conv_tol(case, want, mag), "out")


@spec.prop("causal_conv1d", conv_cases())
def new_state_is_the_last_inputs(ctx: Ctx, case: Case) -> None:
    """new_state[s] holds exactly the last w - 1 inputs of the carried state followed by
    the sequence's tokens (the state itself for an empty sequence)."""
    _, state = call(ctx, "causal_conv1d", case)
    _, want, _ = conv_oracle(case)
    checks.assert_equal(state.astype(np.float64), want, what="new_state")


@st.composite
def conv_future_cases(draw: Any) -> Case:
    """A convolution case and the token to change (`changed`)."""
    case = draw(conv_cases())
    fields = {name: getattr(case, name) for name in case._fields}
    return Case(**fields, changed=draw(st.integers(0, max(0, case.x.shape[0] - 1))))


@spec.prop("causal_conv1d", conv_future_cases())
def is_causal(ctx: Ctx, case: Case) -> None:
    """Changing one token changes no output of an earlier token (nor of another
    sequence)."""
    if not case.x.shape[0]:
        return
    before, _ = call(ctx, "causal_conv1d", case)
    x = case.x.copy()
    x[case.changed] = x[case.changed] + 1
    args = (case.weight, case.bias, case.conv_state, case.query_start_loc, case.activation)
    after, _ = ctx.call("causal_conv1d", x, *args)
    seq = np.searchsorted(case.query_start_loc[1:], np.arange(x.shape[0]), side="right")
    untouched = (np.arange(x.shape[0]) < case.changed) | (seq != seq[case.changed])
    want, _, mag = conv_oracle(case)
    tol = conv_tol(case, want, mag)
    assert_within(after[untouched], before[untouched], 2 * tol[untouched], "out of earlier tokens")


@st.composite
def conv_split_cases(draw: Any) -> tuple[Case, list[int]]:
    case = draw(conv_cases())
    return case, draw_cuts(draw, case)


@spec.prop("causal_conv1d", conv_split_cases(), name="carries_the_state_across_calls")
def conv_carries_the_state_across_calls(ctx: Ctx, pair: tuple[Case, list[int]]) -> None:
    """Cutting each sequence in two calls, the second continuing from the first's
    new_state, gives the outputs and the new states of one call."""
    case, cuts = pair
    whole_out, whole_state = call(ctx, "causal_conv1d", case)
    first, rest = split_case(case, cuts, ("x",))
    out1, state1 = call(ctx, "causal_conv1d", first)
    rest.conv_state = state1.astype(case.conv_state.dtype)
    out2, state2 = call(ctx, "causal_conv1d", rest)
    want, _, mag = conv_oracle(case)
    tol = conv_tol(case, want, mag)
    assert_within(merge(out1, out2, case, cuts), whole_out, 2 * tol, "out of the two calls")
    checks.assert_equal(state2, whole_state, what="new_state of the second call")


def conv_errors(case: Case) -> list[tuple[str, tuple[Any, ...], type]]:
    x, w, b, s, q, act = _conv_args(case)
    other = np.float32 if x.dtype != np.float32 else np.float64
    past = q.copy()
    past[-1] += 1
    wide = np.zeros((*s.shape[:2], s.shape[2] + 1), x.dtype)
    extra = np.zeros((s.shape[0] + 1, *s.shape[1:]), x.dtype)
    return [
        ("integer x", (x.astype(np.int64), w, b, s, q, act), TypeError),
        ("weight of another dtype", (x, w.astype(other), b, s, q, act), TypeError),
        ("float query_start_loc", (x, w, b, s, q.astype(np.float32), act), TypeError),
        ("1-D x", (x.reshape(-1), w, b, s, q, act), ValueError),
        ("weight of another channel count", (x, w[:0], b, s, q, act), ValueError),
        ("a state one column too wide", (x, w, b, wide, q, act), ValueError),
        ("query_start_loc past the tokens", (x, w, b, s, past, act), ValueError),
        ("a state for one sequence too many", (x, w, b, extra, q, act), ValueError),
        ("activation 'relu'", (x, w, b, s, q, "relu"), ValueError),
    ]


add_does_not_modify_inputs(spec, SHAPES["causal_conv1d"], conv_cases())
add_rejects_invalid_input(spec, SHAPES["causal_conv1d"], error_variants(conv_cases(), conv_errors))


def _conv_compare(case: Case, got: Any, ref: Any) -> None:
    want, _, mag = conv_oracle(case)
    assert got[0].dtype == ref[0].dtype, f"dtype {got[0].dtype}, the reference's {ref[0].dtype}"
    assert_within(got[0], ref[0], 2 * conv_tol(case, want, mag), "out")
    checks.assert_equal(got[1], ref[1], what="new_state")


add_matches_reference(
    spec,
    SHAPES["causal_conv1d"],
    conv_cases(),
    _conv_compare,
    "The reference's out within 2 T (8 + w) M, its new_state exactly.",
)


# ============================================================================ selective_scan


def check_scan(ctx_out: Any, case: Case, oracle: Any, factor: float = 1.0) -> None:
    y, state = ctx_out
    want_y, want_state, mag, state_mag = oracle(case)
    tol_y, tol_state = scan_tol(case, mag, state_mag)
    assert_within(y, want_y, factor * tol_y, "y")
    assert_within(state, want_state, factor * tol_state, "new_state")


def check_scan_types(ctx: Ctx, op: str, case: Case) -> None:
    args = [ctx.convert(a) for a in SHAPES[op].call_args(case)]
    out = ctx.fn(op)(*args)
    assert isinstance(out, tuple) and len(out) == 2, f"returned {type(out).__name__}"
    x = args[SHAPES[op].args.index("x")]
    for what, got in zip(("y", "new_state"), out, strict=True):
        problem = checks.same_library(got, x)
        assert problem is None, f"{what} {problem}"
    y, state = call(ctx, op, case)
    checks.assert_shape_dtype(y, case.x.shape, compute_name(case.x), "y")
    checks.assert_shape_dtype(state, case.state.shape, compute_name(case.x), "new_state")


@spec.prop("selective_scan", scan_cases(), name="returns_documented_types")
def scan_returns_documented_types(ctx: Ctx, case: Case) -> None:
    """(y, new_state) of x's and state's shapes, float32 (float64 for float64 x), in x's
    library."""
    check_scan_types(ctx, "selective_scan", case)


@spec.prop("selective_scan", scan_cases())
def matches_the_recurrence(ctx: Ctx, case: Case) -> None:
    """y and new_state are the recurrence's, h = exp(delta A) h + delta x B, y = C . h
    (+ D x, times silu(z)), within T (8 + 4 (j + 1) + N) M of a float64 oracle."""
    check_scan(call(ctx, "selective_scan", case), case, scan_oracle)


@st.composite
def scan_chunk_pairs(draw: Any) -> tuple[Case, int]:
    return draw(scan_cases()), draw(st.integers(1, 5))


@spec.prop("selective_scan", scan_chunk_pairs())
def chunk_size_does_not_change_the_result(ctx: Ctx, pair: tuple[Case, int]) -> None:
    """Evaluated step by step (chunk_size None) or by chunks of any size, the results
    agree within twice the tolerance."""
    case, size = pair
    args = list(SHAPES["selective_scan"].call_args(case))
    stepwise = ctx.call("selective_scan", *args[:-1], None)
    chunked = ctx.call("selective_scan", *args[:-1], size)
    _, _, mag, state_mag = scan_oracle(case)
    tol_y, tol_state = scan_tol(case, mag, state_mag)
    assert_within(chunked[0], stepwise[0], 2 * tol_y, f"y by chunks of {size}")
    assert_within(chunked[1], stepwise[1], 2 * tol_state, f"new_state by chunks of {size}")


@st.composite
def scan_split_cases(draw: Any) -> tuple[Case, list[int]]:
    case = draw(scan_cases())
    return case, draw_cuts(draw, case)


def check_split(ctx: Ctx, op: str, pair: tuple[Case, list[int]], oracle: Any) -> None:
    case, cuts = pair
    whole = call(ctx, op, case)
    first, rest = split_case(case, cuts, ("x", "dt", "B", "C", "z"))
    y1, state1 = call(ctx, op, first)
    rest.state = state1
    y2, state2 = call(ctx, op, rest)
    _, _, mag, state_mag = oracle(case)
    tol_y, tol_state = scan_tol(case, mag, state_mag)
    assert_within(merge(y1, y2, case, cuts), whole[0], 2 * tol_y, "y of the two calls")
    assert_within(state2, whole[1], 2 * tol_state, "new_state of the second call")


@spec.prop("selective_scan", scan_split_cases(), name="carries_the_state_across_calls")
def scan_carries_the_state_across_calls(ctx: Ctx, pair: tuple[Case, list[int]]) -> None:
    """Cutting each sequence in two calls, the second starting from the first's
    new_state, gives the y and new_state of one call (as chunked prefill does)."""
    check_split(ctx, "selective_scan", pair, scan_oracle)


def _scan_variant(case: Case, **changes: Any) -> tuple[Any, ...]:
    return tuple(changes.get(a, getattr(case, a)) for a in SHAPES["selective_scan"].args)


def scan_errors(case: Case) -> list[tuple[str, tuple[Any, ...], type]]:
    v = lambda **c: _scan_variant(case, **c)  # noqa: E731
    x, n = case.x, case.A.shape[1]
    tokens, channels = x.shape
    return [
        ("integer x", v(x=x.astype(np.int64)), TypeError),
        ("A of another channel count", v(A=np.zeros((channels + 1, n), x.dtype)), ValueError),
        ("B of another state size", v(B=np.zeros((tokens, n + 1), x.dtype)), ValueError),
        ("dt one token too long", v(dt=np.zeros((tokens + 1, channels), x.dtype)), ValueError),
        ("a state of another size", v(state=np.zeros((1, channels, n + 1))), ValueError),
        ("z of another width", v(z=np.zeros((tokens, channels + 1), x.dtype)), ValueError),
        ("float query_start_loc", v(query_start_loc=case.query_start_loc * 1.0), TypeError),
        ("chunk_size 0", v(chunk_size=0), ValueError),
        ("a float chunk_size", v(chunk_size=2.0), TypeError),
    ]


add_does_not_modify_inputs(spec, SHAPES["selective_scan"], scan_cases())
add_rejects_invalid_input(spec, SHAPES["selective_scan"], error_variants(scan_cases(), scan_errors))


def _scan_compare(case: Case, got: Any, ref: Any) -> None:
    for g, r in zip(got, ref, strict=True):
        assert g.dtype == r.dtype, f"dtype {g.dtype}, the reference's {r.dtype}"
    check_scan(got, case, scan_oracle, factor=2.0)


add_matches_reference(
    spec,
    SHAPES["selective_scan"],
    scan_cases(),
    _scan_compare,
    "The reference's dtypes; y and new_state within twice the recurrence's tolerance.",
)


# ================================================================================= ssd_scan


@spec.prop("ssd_scan", ssd_cases(), name="returns_documented_types")
def ssd_returns_documented_types(ctx: Ctx, case: Case) -> None:
    """(y, new_state) of x's and state's shapes, float32 (float64 for float64 x), in x's
    library."""
    check_scan_types(ctx, "ssd_scan", case)


@spec.prop("ssd_scan", ssd_cases(), name="matches_the_recurrence")
def ssd_matches_the_recurrence(ctx: Ctx, case: Case) -> None:
    """y and new_state are the token-by-token recurrence's, H = exp(delta A) H + delta x
    B^T, y = H C (+ D x), head h reading group h // (heads / groups), within T (8 +
    4 (j + 1) + N) M of a float64 oracle, whatever the chunk size."""
    check_scan(call(ctx, "ssd_scan", case), case, ssd_oracle)


@st.composite
def ssd_split_cases(draw: Any) -> tuple[Case, list[int]]:
    case = draw(ssd_cases())
    return case, draw_cuts(draw, case)


@spec.prop("ssd_scan", ssd_split_cases(), name="carries_the_state_across_calls")
def ssd_carries_the_state_across_calls(ctx: Ctx, pair: tuple[Case, list[int]]) -> None:
    """Cutting each sequence in two calls, the second starting from the first's
    new_state, gives the y and new_state of one call (chunked prefill)."""
    check_split(ctx, "ssd_scan", pair, ssd_oracle)


def ssd_as_selective_scan(case: Case) -> Case | None:
    """The Mamba-1 case of an SSD case with one group: channel h * P + p of head h,
    A[h] for every state feature. None with several groups (Mamba-1 has one B)."""
    tokens, heads, p = case.x.shape
    if case.B.shape[1] != 1:
        return None
    per_channel = lambda v: None if v is None else np.repeat(v, p, axis=-1)  # noqa: E731
    return Case(
        x=case.x.reshape(tokens, heads * p),
        dt=per_channel(case.dt),
        A=np.repeat(case.A, p)[:, None].repeat(case.B.shape[2], axis=1),
        B=case.B[:, 0],
        C=case.C[:, 0],
        state=case.state.reshape(case.state.shape[0], heads * p, case.B.shape[2]),
        query_start_loc=case.query_start_loc,
        D=per_channel(case.D),
        z=None,
        dt_bias=per_channel(case.dt_bias),
        dt_softplus=case.dt_softplus,
        chunk_size=None,
    )


@spec.prop("ssd_scan", ssd_cases(), uses=("selective_scan",))
def is_selective_scan_with_one_decay_per_head(ctx: Ctx, case: Case) -> None:
    """With one group, SSD is Mamba-1's scan over heads x P channels whose A is the
    head's for every state feature: the two ops agree within twice the tolerance."""
    mamba1 = ssd_as_selective_scan(case)
    if mamba1 is None:
        return
    y, state = call(ctx, "ssd_scan", case)
    y1, state1 = call(ctx, "selective_scan", mamba1)
    _, _, mag, state_mag = ssd_oracle(case)
    tol_y, tol_state = scan_tol(case, mag, state_mag)
    assert_within(y, y1.reshape(y.shape), 2 * tol_y, "y against selective_scan's")
    assert_within(state, state1.reshape(state.shape), 2 * tol_state, "new_state")


def _ssd_variant(op: str, case: Case, **changes: Any) -> tuple[Any, ...]:
    return tuple(changes.get(a, getattr(case, a)) for a in SHAPES[op].args)


def head_errors(op: str, case: Case) -> list[tuple[str, tuple[Any, ...], type]]:
    """Errors the Mamba-2 ops share."""
    v = lambda **c: _ssd_variant(op, case, **c)  # noqa: E731
    x, n = case.x, case.B.shape[2]
    rows, heads, p = x.shape
    too_many = np.zeros((rows, heads + 1, n), x.dtype)  # groups that cannot divide heads
    return [
        ("integer x", v(x=x.astype(np.int64)), TypeError),
        ("A of another head count", v(A=np.zeros(heads + 1, x.dtype)), ValueError),
        ("groups not dividing the heads", v(B=too_many, C=too_many), ValueError),
        ("C of another state size", v(C=np.zeros((rows, case.B.shape[1], n + 1))), ValueError),
        ("dt one row too long", v(dt=np.zeros((rows + 1, heads), x.dtype)), ValueError),
        ("a state of another head_dim", v(state=np.zeros((1, heads, p + 1, n))), ValueError),
        ("integer D", v(D=np.zeros(heads, np.int32)), TypeError),
    ]


def ssd_errors(case: Case) -> list[tuple[str, tuple[Any, ...], type]]:
    v = lambda **c: _ssd_variant("ssd_scan", case, **c)  # noqa: E731
    return head_errors("ssd_scan", case) + [
        ("float query_start_loc", v(query_start_loc=case.query_start_loc * 1.0), TypeError),
        ("chunk_size 0", v(chunk_size=0), ValueError),
        ("a chunk_size of None", v(chunk_size=None), TypeError),
    ]


add_does_not_modify_inputs(spec, SHAPES["ssd_scan"], ssd_cases())
add_rejects_invalid_input(spec, SHAPES["ssd_scan"], error_variants(ssd_cases(), ssd_errors))


def _ssd_compare(case: Case, got: Any, ref: Any) -> None:
    for g, r in zip(got, ref, strict=True):
        assert g.dtype == r.dtype, f"dtype {g.dtype}, the reference's {r.dtype}"
    check_scan(got, case, ssd_oracle, factor=2.0)


add_matches_reference(
    spec,
    SHAPES["ssd_scan"],
    ssd_cases(),
    _ssd_compare,
    "The reference's dtypes; y and new_state within twice the recurrence's tolerance.",
)


# ================================================================= selective_state_update


def update_tol(case: Case) -> tuple[np.ndarray, np.ndarray]:
    ssd = update_as_ssd(case)
    _, _, mag, state_mag = ssd_oracle(ssd)
    return scan_tol(ssd, mag, state_mag)


@spec.prop("selective_state_update", update_cases(), name="returns_documented_types")
def update_returns_documented_types(ctx: Ctx, case: Case) -> None:
    """(y, new_state) of x's and state's shapes, float32 (float64 for float64 x), in x's
    library."""
    check_scan_types(ctx, "selective_state_update", case)


@spec.prop("selective_state_update", update_cases())
def is_one_step_of_the_recurrence(ctx: Ctx, case: Case) -> None:
    """new_state = exp(delta A) state + delta x B^T, y = new_state C (+ D x), within the
    tolerance of a recurrence of one step."""
    y, state = call(ctx, "selective_state_update", case)
    want_y, want_state, _, _ = ssd_oracle(update_as_ssd(case))
    tol_y, tol_state = update_tol(case)
    assert_within(y, want_y, tol_y, "y")
    assert_within(state, want_state, tol_state, "new_state")


@spec.prop("selective_state_update", update_cases(), uses=("ssd_scan",))
def equals_ssd_scan_of_one_token(ctx: Ctx, case: Case) -> None:
    """A batch of state updates is `ssd_scan` of one-token sequences: results agree
    within twice the tolerance."""
    y, state = call(ctx, "selective_state_update", case)
    y2, state2 = call(ctx, "ssd_scan", update_as_ssd(case))
    tol_y, tol_state = update_tol(case)
    assert_within(y, y2, 2 * tol_y, "y against ssd_scan's")
    assert_within(state, state2, 2 * tol_state, "new_state against ssd_scan's")


def update_errors(case: Case) -> list[tuple[str, tuple[Any, ...], type]]:
    return head_errors("selective_state_update", case)


add_does_not_modify_inputs(spec, SHAPES["selective_state_update"], update_cases())
add_rejects_invalid_input(
    spec, SHAPES["selective_state_update"], error_variants(update_cases(), update_errors)
)


def _update_compare(case: Case, got: Any, ref: Any) -> None:
    for g, r in zip(got, ref, strict=True):
        assert g.dtype == r.dtype, f"dtype {g.dtype}, the reference's {r.dtype}"
    tol_y, tol_state = update_tol(case)
    assert_within(got[0], ref[0], 2 * tol_y, "y")
    assert_within(got[1], ref[1], 2 * tol_state, "new_state")


add_matches_reference(
    spec,
    SHAPES["selective_state_update"],
    update_cases(),
    _update_compare,
    "The reference's dtypes; y and new_state within twice the tolerance of one step.",
)
