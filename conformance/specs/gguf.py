"""Properties of `ops.gguf` (see `pyagent_ref/ops/gguf.py` for the contract).

Cases: each of Q8_0, Q4_0, Q4_K, Q6_K; 0-3 rows of 1-2 blocks. Raw tensors are random
bytes with every fp16 scale field replaced by a finite value (random finite halves, exact
small powers of two, zero; in [-1, 1] for the matmul, with float16 x scaled by 2^-8,
so that its float16 result stays finite). Weights for `quantize` are float16, float32 or
float64 blocks of normal, uniform, one-signed, constant, outlier and all-zero values,
scaled by 2^-8..2^6.

Exact properties: `dequantize` is the docstring's byte formulas bit for bit (an oracle
that reads each weight's fields by its index, written apart from the reference); Q8_0 and
Q4_0 quantization follows its formula bit for bit and is idempotent (quantizing the
dequantized weight gives the same weight). Bounds: every quantized weight is within E * A
of the weight, A the largest |w| of its block, E = 0.0045 (Q8_0: half a step of A / 127
plus the fp16 rounding of d), 0.1265 (Q4_0: A / 8, the clipped code of -m, plus fp16),
0.15 (Q4_K) and 0.04 (Q6_K) (half a four- / six-bit step of the sub-block range plus the
six- / eight-bit rounding of the sub-block scales, with room). The K-quant searches
(make_qkx2_quants, make_qx_quants) are not idempotent: a dequantized weight may be
requantized to a slightly different one. `gguf_matmul` sums in any order: within T * M of
a float64 oracle, M = |x| @ |W|^T, T = 2e-6 (float32 compute; 1e-14 float64), plus the
rounding to x's dtype.
"""

from __future__ import annotations

from typing import Any

import hypothesis.extra.numpy as hnp
import numpy as np
from hypothesis import strategies as st

import pyagent_ref.ops.gguf  # noqa: F401 - binds pyagent_ref.ops.gguf for the reference
from pyagent_ref.ops.gguf import BLOCKS, FORMATS

from .. import checks, contract
from ..core import Case, Ctx, Spec, to_numpy
from ._common import (
    add_does_not_modify_inputs,
    add_exact_op_properties,
    add_matches_reference,
    add_rejects_invalid_input,
    assert_within,
    error_variants,
    reference_shapes,
)

OPS = contract.names("gguf")
ERROR = {"Q8_0": 0.0045, "Q4_0": 0.1265, "Q4_K": 0.15, "Q6_K": 0.04}
T = {"float32": 2e-6, "float64": 1e-14}
ROUNDING = {"float16": (2.0**-11, 3e-8), "float32": (2.0**-24, 1e-45), "float64": (2.0**-53, 0)}
HALF_FIELDS = {"Q8_0": (0,), "Q4_0": (0,), "Q4_K": (0, 2), "Q6_K": (208,)}
"""Byte offsets of each block's fp16 fields."""

spec = Spec("gguf", OPS)
SHAPES = reference_shapes("gguf")


# --- strategies -----------------------------------------------------------------------------


@st.composite
def raw_tensors(draw: Any, fmt: str | None = None, small: bool = False) -> tuple[str, np.ndarray]:
    """(fmt, uint8 (rows, blocks * type_size)) of random bytes with finite fp16 fields
    (`small`: in [-1, 1], so that a matmul's result stays finite in float16)."""
    fmt = fmt or draw(st.sampled_from(FORMATS))
    type_size = BLOCKS[fmt][1]
    rows, blocks = draw(st.integers(0, 3)), draw(st.integers(1, 2))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, (rows * blocks, type_size), dtype=np.uint8)
    exact = st.sampled_from((0.0, 1.0, -1.0, 2.0**-14, 2.0**-24, 0.5, 65504.0, 2.0**-10))
    halves = st.one_of(exact, st.floats(-1, 1, width=16), st.floats(width=16, allow_nan=False))
    if small:
        halves = st.one_of(
            st.sampled_from((0.0, 1.0, -1.0, 2.0**-14, 2.0**-24, 0.5)), st.floats(-1, 1, width=16)
        )
    for block in range(rows * blocks):
        for offset in HALF_FIELDS[fmt]:
            value = draw(halves) if block < 2 else float(rng.uniform(-1, 1))
            if not np.isfinite(value):
                value = 1.0
            raw[block, offset : offset + 2] = np.array([value], np.float16).view(np.uint8)
    return fmt, raw.reshape(rows, blocks * type_size)


@st.composite
def dequantize_cases(draw: Any) -> Case:
    fmt, raw = draw(raw_tensors())
    return Case(raw=raw, fmt=fmt)


@st.composite
def weights(draw: Any, fmt: str) -> np.ndarray:
    """(rows, blocks * block_size) weights in one of several shapes of block."""
    block_size = BLOCKS[fmt][0]
    rows, blocks = draw(st.integers(0, 3)), draw(st.integers(1, 2))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    shape = (rows, blocks * block_size)
    kind = draw(st.sampled_from(("normal", "uniform", "positive", "constant", "outliers", "grid")))
    if kind == "normal":
        w = rng.standard_normal(shape)
    elif kind == "uniform":
        w = rng.uniform(-1, 1, shape)
    elif kind == "positive":
        w = rng.uniform(0, 1, shape) * draw(st.sampled_from((1, -1)))
    elif kind == "constant":
        w = np.full(shape, draw(st.sampled_from((1.0, -3.0, 0.0))))
    elif kind == "outliers":
        w = rng.standard_normal(shape) * np.where(rng.uniform(size=shape) < 0.03, 50, 1)
    else:
        w = rng.choice([0.0, 0.5, -1.0, 1.0, 4.0], shape)
    if rows and draw(st.booleans()):  # a block of zeros
        w[draw(st.integers(0, rows - 1)), :block_size] = 0
    dtype = draw(st.sampled_from((np.float16, np.float32, np.float64)))
    return (w * 2.0 ** draw(st.integers(-8, 6))).astype(dtype)


@st.composite
def quantize_cases(draw: Any, formats: tuple[str, ...] = FORMATS) -> Case:
    fmt = draw(st.sampled_from(formats))
    return Case(weight=draw(weights(fmt)), fmt=fmt)


@st.composite
def matmul_cases(draw: Any) -> Case:
    fmt, raw = draw(raw_tensors(small=True))
    dtype = np.dtype(draw(st.sampled_from((np.float16, np.float32, np.float64))))
    columns = raw.shape[1] // BLOCKS[fmt][1] * BLOCKS[fmt][0]
    x_values = st.one_of(st.sampled_from((0.0, 1.0, -1.0)), st.floats(-2, 2, width=16))
    x = draw(hnp.arrays(dtype, (draw(st.integers(0, 3)), columns), elements=x_values))
    if dtype == np.float16:  # |W| reaches 4096 (Q6_K): keep 256-term sums finite in float16
        x = x * np.float16(2.0**-8)
    return Case(x=x, raw=raw, fmt=fmt)


def call(ctx: Ctx, op: str, case: Case) -> Any:
    return ctx.call(op, *SHAPES[op].call_args(case))


# --- oracles --------------------------------------------------------------------------------


def _half(block: np.ndarray, offset: int) -> np.float32:
    return np.float32(block[offset : offset + 2].copy().view(np.float16)[0])


def weight_oracle(block: np.ndarray, fmt: str, k: int) -> np.float32:
    """Weight k of one block, read field by field as the module docstring draws it."""
    f32 = np.float32
    if fmt == "Q8_0":
        return _half(block, 0) * f32(np.int8(block[2 + k].view(np.int8)))
    if fmt == "Q4_0":
        byte = int(block[2 + k % 16])
        return _half(block, 0) * f32((byte >> (4 * (k // 16)) & 15) - 8)
    if fmt == "Q4_K":
        s, scales = k // 32, [int(b) for b in block[4:16]]
        if s < 4:
            sc, m = scales[s] & 63, scales[s + 4] & 63
        else:
            sc = (scales[s + 4] & 15) | (scales[s - 4] >> 6) << 4
            m = (scales[s + 4] >> 4) | (scales[s] >> 6) << 4
        c, rest = divmod(k, 64)
        q = int(block[16 + 32 * c + rest % 32]) >> (4 * (rest // 32)) & 15
        return (_half(block, 0) * f32(sc)) * f32(q) - _half(block, 2) * f32(m)
    h, e = divmod(k, 128)
    t, lane = divmod(e, 32)
    low = int(block[64 * h + lane + 32 * (t % 2)]) >> (4 * (t // 2)) & 15
    high = int(block[128 + 32 * h + lane]) >> (2 * t) & 3
    sc = f32(np.int8(block[192 + k // 16].view(np.int8)))
    return (_half(block, 208) * sc) * f32((low | high << 4) - 32)


def dequantize_oracle(raw: np.ndarray, fmt: str) -> np.ndarray:
    block_size, type_size = BLOCKS[fmt]
    rows, blocks = raw.shape[0], raw.shape[1] // type_size
    out = np.zeros((rows, blocks * block_size), np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        for r in range(rows):
            for b in range(blocks):
                block = raw[r, b * type_size : (b + 1) * type_size]
                for k in range(block_size):
                    out[r, b * block_size + k] = weight_oracle(block, fmt, k)
    return out


def q8_q4_oracle(weight: np.ndarray, fmt: str) -> np.ndarray:
    """Q8_0 / Q4_0 bytes by the formula, one block at a time in float32 scalars."""
    f32 = np.float32
    w = weight.astype(f32)
    block_size, type_size = BLOCKS[fmt]
    rows, blocks = w.shape[0], w.shape[1] // block_size
    out = np.zeros((rows, blocks, type_size), np.uint8)
    for r in range(rows):
        for b in range(blocks):
            x = w[r, b * block_size : (b + 1) * block_size]
            if fmt == "Q8_0":
                d = f32(np.max(np.abs(x)) / f32(127))
                inv = f32(0) if d == 0 else f32(f32(1) / d)
                v = x * inv
                q = np.trunc(v) + np.where(np.abs(v - np.trunc(v)) >= 0.5, np.sign(v), 0)
                codes = q.astype(np.int8).view(np.uint8)
            else:
                m = x[int(np.argmax(np.abs(x)))]
                d = f32(m / f32(-8))
                inv = f32(0) if d == 0 else f32(f32(1) / d)
                q = np.minimum(np.floor(x * inv + f32(8.5)), 15).astype(np.uint8)
                codes = q[:16] | (q[16:] << 4)
            out[r, b] = np.concatenate([np.array([d], np.float16).view(np.uint8), codes])
    return out.reshape(rows, blocks * type_size)


def block_absmax(weight: np.ndarray, fmt: str) -> np.ndarray:
    """A per weight: the largest |w| of its block (in float32, as quantized)."""
    block_size = BLOCKS[fmt][0]
    w = np.abs(weight.astype(np.float32).astype(np.float64))
    rows, columns = w.shape
    top = w.reshape(rows, columns // block_size, block_size).max(axis=2, initial=0)
    return np.repeat(top, block_size, axis=1)


# ================================================================================== quantize


@spec.prop("quantize", quantize_cases(), name="returns_documented_types")
def quantize_returns_documented_types(ctx: Ctx, case: Case) -> None:
    """A new uint8 (rows, blocks * type_size) array in the weight's library."""
    weight = ctx.convert(case.weight)
    out = ctx.fn("quantize")(weight, case.fmt)
    problem = checks.same_library(out, weight)
    assert problem is None, problem
    block_size, type_size = BLOCKS[case.fmt]
    rows, columns = case.weight.shape
    shape = (rows, columns // block_size * type_size)
    checks.assert_shape_dtype(to_numpy(out), shape, np.uint8, "raw")


@spec.prop("quantize", quantize_cases(("Q8_0", "Q4_0")))
def follows_the_q8_0_q4_0_formula(ctx: Ctx, case: Case) -> None:
    """Q8_0: d = max|w| / 127, codes roundf(w / d); Q4_0: d = m / -8 for the first entry of
    largest magnitude, codes min(15, floor(w / d + 8.5)); fp16 d; bit for bit."""
    checks.assert_equal(call(ctx, "quantize", case), q8_q4_oracle(case.weight, case.fmt))


@spec.prop("quantize", quantize_cases(), uses=("dequantize",))
def dequantizes_within_the_format_error(ctx: Ctx, case: Case) -> None:
    """Every dequantized weight is within E * A of the weight (E per format, module
    docstring; A the block's largest |w|), and a block of zeros stays exactly zero."""
    raw = ctx.call_raw("quantize", case.weight, case.fmt)
    back = to_numpy(ctx.fn("dequantize")(raw, case.fmt)).astype(np.float64)
    w = case.weight.astype(np.float32).astype(np.float64)
    top = block_absmax(case.weight, case.fmt)
    assert_within(back, w, ERROR[case.fmt] * top + 1e-30, "dequantized weight")
    zero = top == 0
    checks.assert_equal(back[zero], np.zeros(int(zero.sum())), what="a block of zeros")


@spec.prop("quantize", quantize_cases(("Q8_0", "Q4_0")), uses=("dequantize",))
def requantizing_is_idempotent(ctx: Ctx, case: Case) -> None:
    """Q8_0 and Q4_0: dequantize(quantize(W')) == W' for W' = dequantize(quantize(W))."""
    once = to_numpy(ctx.fn("dequantize")(ctx.call_raw("quantize", case.weight, case.fmt), case.fmt))
    again = ctx.call("dequantize", ctx.call_raw("quantize", once, case.fmt), case.fmt)
    checks.assert_equal(again, once, what="the requantized weight")


def quantize_errors(case: Case) -> list[tuple[str, tuple[Any, ...], type]]:
    w, fmt = case.weight, case.fmt
    errors = [
        ("integer weight", (w.astype(np.int32), fmt), TypeError),
        ("1-D weight", (w.reshape(-1), fmt), ValueError),
        ("an unknown format", (w, "Q5_K"), ValueError),
        ("a format given as an int", (w, 8), TypeError),
        ("a column short of a block", (w[:, 1:], fmt), ValueError),
        ("no column", (w[:, :0], fmt), ValueError),
    ]
    if w.shape[0]:
        nan = w.copy()
        nan[-1, 0] = np.nan
        errors.append(("a NaN weight", (nan, fmt), ValueError))
    return errors


add_exact_op_properties(spec, SHAPES["quantize"], quantize_cases(), quantize_errors, "bytes")


# ================================================================================ dequantize


@spec.prop("dequantize", dequantize_cases())
def reads_each_weight_from_its_fields(ctx: Ctx, case: Case) -> None:
    """Weight k of a block is the docstring's formula on its own fields (scale, sub-block
    scale and min, code nibbles / high bits), float32 bit for bit (NaN where the oracle
    has NaN)."""
    got = call(ctx, "dequantize", case)
    want = dequantize_oracle(case.raw, case.fmt)
    checks.assert_shape_dtype(got, want.shape, np.float32, "weight")
    checks.assert_equal(got, want, what="weight")


def dequantize_errors(case: Case) -> list[tuple[str, tuple[Any, ...], type]]:
    raw, fmt = case.raw, case.fmt
    return [
        ("int8 raw", (raw.view(np.int8), fmt), TypeError),
        ("1-D raw", (raw.reshape(-1), fmt), ValueError),
        ("a byte short of a block", (raw[:, 1:], fmt), ValueError),
        ("an unknown format", (raw, "F16"), ValueError),
        ("a format given as bytes", (raw, fmt.encode()), TypeError),
    ]


add_exact_op_properties(spec, SHAPES["dequantize"], dequantize_cases(), dequantize_errors, "weight")


# =============================================================================== gguf_matmul


def matmul_oracle(case: Case) -> tuple[np.ndarray, np.ndarray]:
    w = dequantize_oracle(case.raw, case.fmt).astype(np.float64)
    x = case.x.astype(np.float64)
    return x @ w.T, np.abs(x) @ np.abs(w).T


def matmul_tol(case: Case, want: np.ndarray, mag: np.ndarray) -> np.ndarray:
    rel, tiny = ROUNDING[case.x.dtype.name]
    compute = "float64" if case.x.dtype == np.float64 else "float32"
    return T[compute] * mag * (1 + rel) + rel * np.abs(want) + tiny


@spec.prop("gguf_matmul", matmul_cases(), name="returns_documented_types")
def matmul_returns_documented_types(ctx: Ctx, case: Case) -> None:
    """A new (tokens, out_features) array of x's dtype in x's library."""
    x = ctx.convert(case.x)
    out = ctx.fn("gguf_matmul")(x, ctx.convert(case.raw), case.fmt)
    problem = checks.same_library(out, x)
    assert problem is None, problem
    shape = (case.x.shape[0], case.raw.shape[0])
    checks.assert_shape_dtype(to_numpy(out), shape, case.x.dtype, "y")


@spec.prop("gguf_matmul", matmul_cases())
def is_x_times_the_dequantized_weight(ctx: Ctx, case: Case) -> None:
    """y = x @ W^T for W the blocks' weights, within T * M of a float64 oracle plus the
    rounding to x's dtype."""
    got = call(ctx, "gguf_matmul", case)
    want, mag = matmul_oracle(case)
    assert_within(got, want, matmul_tol(case, want, mag), "y")


@spec.prop("gguf_matmul", matmul_cases(), uses=("dequantize",))
def equals_dequantize_then_matmul(ctx: Ctx, case: Case) -> None:
    """The fused op is the implementation's own dequantize followed by a matmul, within the
    same tolerance."""
    w = ctx.call("dequantize", case.raw, case.fmt).astype(np.float64)
    want = case.x.astype(np.float64) @ w.T
    _, mag = matmul_oracle(case)
    assert_within(call(ctx, "gguf_matmul", case), want, matmul_tol(case, want, mag), "y")


def matmul_errors(case: Case) -> list[tuple[str, tuple[Any, ...], type]]:
    x, raw, fmt = case.x, case.raw, case.fmt
    other = "Q8_0" if fmt != "Q8_0" else "Q4_K"
    return [
        ("integer x", (x.astype(np.int32), raw, fmt), TypeError),
        ("int8 raw", (x, raw.view(np.int8), fmt), TypeError),
        ("1-D x", (x.reshape(-1), raw, fmt), ValueError),
        (
            "x one column wider",
            (np.zeros((x.shape[0], x.shape[1] + 1), x.dtype), raw, fmt),
            ValueError,
        ),
        ("another format's blocks", (x, raw, other), ValueError),
        ("an unknown format", (x, raw, "IQ2_XS"), ValueError),
    ]


add_does_not_modify_inputs(spec, SHAPES["gguf_matmul"], matmul_cases())
add_rejects_invalid_input(
    spec, SHAPES["gguf_matmul"], error_variants(matmul_cases(), matmul_errors)
)


def _matmul_compare(case: Case, got: Any, ref: Any) -> None:
    assert got.dtype == ref.dtype, f"dtype {got.dtype}, the reference's {ref.dtype}"
    want, mag = matmul_oracle(case)
    assert_within(got, ref, 2 * matmul_tol(case, want, mag), "y")


add_matches_reference(
    spec,
    SHAPES["gguf_matmul"],
    matmul_cases(),
    _matmul_compare,
    "The reference's y within twice the tolerance.",
)
