"""Properties of `ops.quant` (see `pyagent_ref/ops/quant.py` for the contract).

Cases: 0-5 rows, 2, 4 or 8 bits, in_features a multiple of the codes per int32 word
(1-3 words) for the packed ops and 1-24 columns for `quantize`, groups that divide the
columns (one group: per channel), symmetric and asymmetric; weights in [-4, 4] with exact
small values and whole zero groups, float16, float32 or float64; scales drawn from exact
powers of two and floats in [2^-10, 2] (float16, float32 or float64); codes and zero points
anywhere in the b-bit range.

Exact properties: codes, scales and zero points follow the RTN formula bit for bit (every
step is a correctly rounded operation in the compute type), `dequantize` is (q - z) * s
rounded once, packing is the documented bit layout. `dequant_matmul` sums in any order:
|got - want| <= T * M + the rounding to x's dtype, want and M = |x| @ |W|^T in float64,
T = 2e-6 (float32 compute, 1e-14 float64).

FP8 (`quantize_fp8`, `dequantize_fp8`, `dequant_matmul_fp8`): weights of 0-5 rows and 1-12
columns (the matmul's up to 40, so that a kernel's blocks of 16 codes and their tails are
drawn, with x's <= 2 past 12 columns) with whole zero rows, exact small values and, in a
third of the cases, an amax of exactly the format's max (scale 1) and values on the
midpoints between codes (ties);
codes anywhere in 0-255 but the NaN and infinity codes (the matmul's of magnitude <= 16, x's
<= 64, so that float16 sums stay finite); per-tensor and per-channel
float32 scales. The oracle of the codes is torch's own cast, torch.clamp(float32(w) / s,
-max, max).to(torch.float8_e4m3fn / float8_e5m2), and of the values torch's view of the
codes: codes and scales are exact, dequantized weights exact in float32, and the round
trip within the format's relative rounding bound (2^-4 e4m3, 2^-3 e5m2) plus half a
subnormal step times s. `dequant_matmul_fp8` draws input_scale None, "dynamic",
"dynamic_per_token" or a float in [2^-6, 1], and x's first token 2^10 below the others
when there are more; its activations are checked through the same oracle, its sum
within the tolerance of `dequant_matmul`.
"""

from __future__ import annotations

from typing import Any

import hypothesis.extra.numpy as hnp
import numpy as np
import torch
from hypothesis import strategies as st

import pyagent_ref.ops.quant  # noqa: F401 - binds pyagent_ref.ops.quant for the reference

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

OPS = contract.names("quant")
T = {"float32": 2e-6, "float64": 1e-14}
# the rounding of the result to x's dtype: (relative, absolute: half the smallest subnormal)
ROUNDING = {"float16": (2.0**-11, 3e-8), "float32": (2.0**-24, 1e-45), "float64": (2.0**-53, 0)}
FLOATS = (np.float16, np.float32, np.float64)
BITS = (2, 4, 8)

spec = Spec("quant", OPS)

SHAPES = reference_shapes("quant")


def compute(dtype: Any) -> Any:
    return np.float64 if np.dtype(dtype) == np.float64 else np.float32


def code_range(bits: int) -> tuple[int, int]:
    return -(2 ** (bits - 1)), 2 ** (bits - 1) - 1


def spread(a: np.ndarray, columns: int) -> np.ndarray:
    """(rows, groups) -> (rows, columns): each group's entry on its columns."""
    return np.repeat(a, columns // max(a.shape[1], 1), axis=1)


# --- strategies -----------------------------------------------------------------------------


def divisor(n: int) -> Any:
    return st.sampled_from([d for d in range(1, n + 1) if n % d == 0])


@st.composite
def quantize_cases(draw: Any) -> Case:
    dtype = np.dtype(draw(st.sampled_from(FLOATS)))
    rows, columns = draw(st.integers(0, 5)), draw(st.integers(1, 24))
    width = {2: 16, 4: 32, 8: 64}[dtype.itemsize]
    small = st.sampled_from((0.0, 1.0, -1.0, 0.5, -4.0, 3.75))
    weight = draw(
        hnp.arrays(dtype, (rows, columns), elements=st.one_of(small, st.floats(-4, 4, width=width)))
    )
    group_size = draw(st.one_of(st.none(), divisor(columns)))
    if rows and draw(st.booleans()):  # a whole group of zeros
        size = group_size or columns
        weight[draw(st.integers(0, rows - 1)), :size] = 0
    return Case(
        weight=weight,
        bits=draw(st.sampled_from(BITS)),
        group_size=group_size,
        symmetric=draw(st.booleans()),
    )


def scale_arrays(shape: tuple[int, int]) -> Any:
    exact = st.sampled_from((1.0, 0.5, 0.25, 2.0**-7, 2.0))
    return st.sampled_from(FLOATS).flatmap(
        lambda dt: hnp.arrays(
            np.dtype(dt),
            shape,
            elements=st.one_of(exact, st.floats(2.0**-10, 2.0, width=np.dtype(dt).itemsize * 8)),
        )
    )


def codes(bits: int, shape: tuple[int, ...]) -> Any:
    lo, hi = code_range(bits)
    return hnp.arrays(np.int8, shape, elements=st.integers(lo, hi))


@st.composite
def quantized_weights(draw: Any, packable: bool) -> dict[str, Any]:
    """bits, codes (rows, columns), scales, zeros: columns a whole number of words when
    `packable`."""
    bits = draw(st.sampled_from(BITS))
    rows = draw(st.integers(0, 5))
    per_word = 32 // bits
    columns = per_word * draw(st.integers(1, 3)) if packable else draw(st.integers(1, 24))
    groups = columns // draw(divisor(columns))
    scales = draw(scale_arrays((rows, groups)))
    zeros = draw(st.one_of(st.none(), codes(bits, (rows, groups))))
    return dict(bits=bits, codes=draw(codes(bits, (rows, columns))), scales=scales, zeros=zeros)


@st.composite
def dequantize_cases(draw: Any) -> Case:
    q = draw(quantized_weights(packable=False))
    return Case(codes=q["codes"], scales=q["scales"], zeros=q["zeros"])


@st.composite
def pack_cases(draw: Any) -> Case:
    bits = draw(st.sampled_from(BITS))
    shape = (draw(st.integers(0, 4)), draw(st.integers(0, 40)))
    return Case(codes=draw(codes(bits, shape)), bits=bits)


@st.composite
def unpack_cases(draw: Any) -> Case:
    bits = draw(st.sampled_from(BITS))
    per_word = 32 // bits
    rows, words = draw(st.integers(0, 4)), draw(st.integers(0, 4))
    size = draw(st.integers(max(words * per_word - per_word + 1, 0), words * per_word))
    word = st.one_of(
        st.sampled_from((0, -1, -(2**31), 2**31 - 1, 0x77777777, -0x77777778)),
        st.integers(-(2**31), 2**31 - 1),
    )
    packed = draw(hnp.arrays(np.int32, (rows, words), elements=word))
    return Case(packed=packed, bits=bits, size=size)


@st.composite
def matmul_cases(draw: Any) -> Case:
    q = draw(quantized_weights(packable=True))
    dtype = np.dtype(draw(st.sampled_from(FLOATS)))
    tokens = draw(st.integers(0, 4))
    width = dtype.itemsize * 8
    x_values = st.one_of(st.sampled_from((0.0, 1.0, -1.0, 0.5)), st.floats(-2, 2, width=width))
    x = draw(hnp.arrays(dtype, (tokens, q["codes"].shape[1]), elements=x_values))
    packed = pyagent_ref.ops.quant.pack_int32(q["codes"], q["bits"])
    return Case(x=x, packed=packed, scales=q["scales"], zeros=q["zeros"], bits=q["bits"])


def call(ctx: Ctx, op: str, case: Case) -> Any:
    return ctx.call(op, *SHAPES[op].call_args(case))


# --- oracles --------------------------------------------------------------------------------


def rtn_oracle(case: Case) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """The contract's formula, step by step in numpy in the compute type."""
    c = compute(case.weight.dtype)
    rows, columns = case.weight.shape
    size = case.group_size or columns
    w = case.weight.astype(c).reshape(rows, columns // size, size)
    lo = np.minimum(w.min(axis=2, initial=0), c(0))
    hi = np.maximum(w.max(axis=2, initial=0), c(0))
    qmin, qmax = code_range(case.bits)
    if case.symmetric:
        s = np.maximum(-lo, hi) / c((qmax - qmin) / 2)
    else:
        s = (hi - lo) / c(qmax - qmin)
    s = np.where(s == 0, c(1), s).astype(c)
    z = np.zeros_like(s) if case.symmetric else np.clip(qmin - np.round(lo / s), qmin, qmax)
    q = np.clip(np.round(w / s[:, :, None]) + z[:, :, None], qmin, qmax)
    zeros = None if case.symmetric else z.astype(np.int8)
    return q.reshape(rows, columns).astype(np.int8), s, zeros


def dequantize_oracle(codes: np.ndarray, scales: np.ndarray, zeros: Any, c: Any) -> np.ndarray:
    q = codes.astype(c)
    if zeros is not None:
        q = q - spread(zeros, codes.shape[1]).astype(c)
    return q * spread(scales.astype(c), codes.shape[1])


def pack_oracle(codes: np.ndarray, bits: int) -> np.ndarray:
    """Each word built bit by bit in Python integers."""
    per_word = 32 // bits
    rows, n = codes.shape
    words = -(-n // per_word)
    out = np.zeros((rows, words), np.int64)
    for r in range(rows):
        for w in range(words):
            value = 0
            for j in range(per_word):
                i = w * per_word + j
                if i < n:
                    value |= (int(codes[r, i]) + 2 ** (bits - 1)) << (j * bits)
            out[r, w] = value - 2**32 if value >= 2**31 else value
    return out.astype(np.int32)


def unpack_oracle(packed: np.ndarray, bits: int, size: int) -> np.ndarray:
    per_word = 32 // bits
    rows = packed.shape[0]
    out = np.zeros((rows, size), np.int8)
    for r in range(rows):
        for i in range(size):
            word = int(packed[r, i // per_word]) & 0xFFFFFFFF
            out[r, i] = ((word >> ((i % per_word) * bits)) & (2**bits - 1)) - 2 ** (bits - 1)
    return out


def matmul_oracle(case: Case) -> tuple[np.ndarray, np.ndarray]:
    """(y in float64, M = |x| @ |W|^T) with W dequantized in the compute type."""
    c = compute(case.x.dtype)
    columns = case.x.shape[1]
    codes = unpack_oracle(case.packed, case.bits, columns)
    w = dequantize_oracle(codes, case.scales.astype(c), case.zeros, c).astype(np.float64)
    x = case.x.astype(np.float64)
    return x @ w.T, np.abs(x) @ np.abs(w).T


def matmul_tol(case: Case, want: np.ndarray, mag: np.ndarray) -> np.ndarray:
    rel, tiny = ROUNDING[case.x.dtype.name]
    return T[np.dtype(compute(case.x.dtype)).name] * mag * (1 + rel) + rel * np.abs(want) + tiny


# ================================================================================== quantize


@spec.prop("quantize", quantize_cases(), name="returns_documented_types")
def quantize_returns_documented_types(ctx: Ctx, case: Case) -> None:
    """(codes int8 like the weight, scales of the compute dtype (rows, groups), zeros int8
    of that shape or None when symmetric), in the weight's library."""
    weight = ctx.convert(case.weight)
    result = ctx.fn("quantize")(weight, case.bits, case.group_size, case.symmetric)
    assert isinstance(result, tuple) and len(result) == 3, f"returned {type(result).__name__}"
    for part in result:
        if part is not None:
            problem = checks.same_library(part, weight)
            assert problem is None, problem
    codes, scales, zeros = to_numpy(result)
    rows, columns = case.weight.shape
    groups = columns // (case.group_size or columns)
    checks.assert_shape_dtype(codes, case.weight.shape, np.int8, "codes")
    checks.assert_shape_dtype(scales, (rows, groups), compute(case.weight.dtype), "scales")
    if case.symmetric:
        assert zeros is None, f"symmetric quantization returned zeros {zeros!r}"
    else:
        checks.assert_shape_dtype(zeros, (rows, groups), np.int8, "zeros")


@spec.prop("quantize", quantize_cases())
def follows_the_rtn_formula(ctx: Ctx, case: Case) -> None:
    """Scales, zero points and codes are the contract's formula bit for bit: absmax / 7.5
    (symmetric) or range / 15 (asymmetric) for 4 bits, ties rounded to even, codes clipped
    to the b-bit range."""
    codes, scales, zeros = call(ctx, "quantize", case)
    want_codes, want_scales, want_zeros = rtn_oracle(case)
    checks.assert_equal(scales, want_scales, what="scales")
    if want_zeros is not None:
        checks.assert_equal(zeros, want_zeros, what="zeros")
    checks.assert_equal(codes, want_codes, what="codes")


@spec.prop("quantize", quantize_cases())
def dequantizes_within_half_a_scale(ctx: Ctx, case: Case) -> None:
    """Every weight is within s / 2 of (q - z) * s (plus the compute type's rounding; a
    subnormal s is off by up to half the smallest subnormal, times |q - z| <= 2^b), and a
    weight of 0 is exactly 0 after the round trip."""
    codes, scales, zeros = call(ctx, "quantize", case)
    columns = case.weight.shape[1]
    s = spread(scales.astype(np.float64), columns)
    z = 0 if zeros is None else spread(zeros, columns).astype(np.float64)
    back = (codes.astype(np.float64) - z) * s
    w = case.weight.astype(np.float64)
    info = np.finfo(compute(case.weight.dtype))
    eps, tiny = info.eps, 2**case.bits * float(info.smallest_subnormal)
    tol = s / 2 * (1 + 4 * eps) + 4 * eps * np.abs(w) + tiny
    assert_within(back, w, tol, "dequantized weight")
    zero = case.weight == 0
    checks.assert_equal(back[zero], np.zeros(int(zero.sum())), what="dequantized zero weights")


def quantize_errors(case: Case) -> list[tuple[str, tuple[Any, ...], type]]:
    w, bits, size, sym = case.weight, case.bits, case.group_size, case.symmetric
    columns = w.shape[1]
    errors = [
        ("integer weight", (w.astype(np.int32), bits, size, sym), TypeError),
        ("1-D weight", (w.reshape(-1), bits, size, sym), ValueError),
        ("3 bits", (w, 3, size, sym), ValueError),
        ("float bits", (w, float(bits), size, sym), TypeError),
        ("group_size 0", (w, bits, 0, sym), ValueError),
        ("a float group_size", (w, bits, float(columns), sym), TypeError),
        ("symmetric as an int", (w, bits, size, int(sym)), TypeError),
        ("no column", (w[:, :0], bits, None, sym), ValueError),
    ]
    if columns > 1:
        errors.append(("group_size one past the columns", (w, bits, columns + 1, sym), ValueError))
    if w.shape[0]:
        nan, inf = w.copy(), w.copy()
        nan[-1, 0], inf[0, -1] = np.nan, -np.inf
        errors += [("a NaN weight", (nan, bits, size, sym), ValueError)]
        errors += [("an infinite weight", (inf, bits, size, sym), ValueError)]
    return errors


add_does_not_modify_inputs(spec, SHAPES["quantize"], quantize_cases())
add_rejects_invalid_input(
    spec, SHAPES["quantize"], error_variants(quantize_cases(), quantize_errors)
)


def _quantize_compare(case: Case, got: Any, ref: Any) -> None:
    for name, g, r in zip(("codes", "scales", "zeros"), got, ref, strict=True):
        if r is None:
            assert g is None, f"{name} is {g!r}, the reference's None"
        else:
            checks.assert_equal(g, r, what=name)


add_matches_reference(
    spec,
    SHAPES["quantize"],
    quantize_cases(),
    _quantize_compare,
    "The reference's results, exactly.",
)


# ================================================================================ dequantize


@spec.prop("dequantize", dequantize_cases())
def is_the_scaled_difference_rounded_once(ctx: Ctx, case: Case) -> None:
    """W = (q - z) * s in the scales' compute type (float32, float64 for float64 scales),
    bit for bit, with the group of column i being i // group_size; a new array."""
    got = call(ctx, "dequantize", case)
    c = compute(case.scales.dtype)
    want = dequantize_oracle(case.codes, case.scales, case.zeros, c)
    checks.assert_shape_dtype(got, case.codes.shape, c, "weight")
    checks.assert_equal(got, want, what="weight")


def dequantize_errors(case: Case) -> list[tuple[str, tuple[Any, ...], type]]:
    q, s, z = case.codes, case.scales, case.zeros
    rows, groups = s.shape
    zeros = np.zeros(s.shape, np.int8)
    return [
        ("int32 codes", (q.astype(np.int32), s, z), TypeError),
        ("integer scales", (q, s.astype(np.int32), z), TypeError),
        ("int32 zeros", (q, s, zeros.astype(np.int32)), TypeError),
        ("1-D codes", (q.reshape(-1), s, z), ValueError),
        ("scales with one row more", (q, np.zeros((rows + 1, groups), s.dtype), z), ValueError),
        ("scales with no group", (q, np.zeros((rows, 0), s.dtype), None), ValueError),
        ("groups not dividing the columns", (q, np.ones((rows, q.shape[1] + 1)), None), ValueError),
        ("zeros of another shape", (q, s, np.zeros((rows, groups + 1), np.int8)), ValueError),
    ]


add_exact_op_properties(spec, SHAPES["dequantize"], dequantize_cases(), dequantize_errors, "weight")


# ============================================================================ pack / unpack


@spec.prop("pack_int32", pack_cases())
def lays_codes_out_as_documented(ctx: Ctx, case: Case) -> None:
    """Code j of each word in bits [j * b, (j + 1) * b), stored as the code plus 2^(b-1),
    zero bits past the last code: the words built bit by bit, as int32."""
    got = call(ctx, "pack_int32", case)
    want = pack_oracle(case.codes, case.bits)
    checks.assert_shape_dtype(got, want.shape, np.int32, "packed")
    checks.assert_equal(got, want, what="packed")


@spec.prop("pack_int32", pack_cases(), uses=("unpack_int32",))
def unpack_inverts_pack(ctx: Ctx, case: Case) -> None:
    """unpack_int32(pack_int32(q, b), b, n) == q."""
    packed = ctx.call_raw("pack_int32", case.codes, case.bits)
    got = to_numpy(ctx.fn("unpack_int32")(packed, case.bits, case.codes.shape[1]))
    checks.assert_shape_dtype(got, case.codes.shape, np.int8, "codes")
    checks.assert_equal(got, case.codes, what="codes after the round trip")


def pack_errors(case: Case) -> list[tuple[str, tuple[Any, ...], type]]:
    q, bits = case.codes, case.bits
    errors = [
        ("int16 codes", (q.astype(np.int16), bits), TypeError),
        ("1-D codes", (q.reshape(-1), bits), ValueError),
        ("3 bits", (q, 3), ValueError),
        ("bits as a string", (q, str(bits)), TypeError),
    ]
    if q.size and bits < 8:
        high, low = q.copy(), q.copy()
        high[-1, -1] = 2 ** (bits - 1)
        low[0, 0] = -(2 ** (bits - 1)) - 1
        errors += [("a code one past the range", (high, bits), ValueError)]
        errors += [("a code one below the range", (low, bits), ValueError)]
    return errors


add_exact_op_properties(spec, SHAPES["pack_int32"], pack_cases(), pack_errors, "words")


@spec.prop("unpack_int32", unpack_cases())
def reads_each_field_minus_the_offset(ctx: Ctx, case: Case) -> None:
    """codes[r, i] = field i % k of word i // k minus 2^(b-1), read bit by bit: the first
    `size` codes of each row, int8."""
    got = call(ctx, "unpack_int32", case)
    want = unpack_oracle(case.packed, case.bits, case.size)
    checks.assert_shape_dtype(got, want.shape, np.int8, "codes")
    checks.assert_equal(got, want, what="codes")


def unpack_errors(case: Case) -> list[tuple[str, tuple[Any, ...], type]]:
    p, bits, size = case.packed, case.bits, case.size
    per_word = 32 // bits
    return [
        ("uint32 words", (p.view(np.uint32), bits, size), TypeError),
        ("1-D packed", (p.reshape(-1), bits, size), ValueError),
        ("5 bits", (p, 5, size), ValueError),
        ("a float size", (p, bits, float(size)), TypeError),
        ("a size one word too many", (p, bits, size + per_word), ValueError),
        ("a negative size", (p, bits, -1), ValueError),
    ]


add_exact_op_properties(spec, SHAPES["unpack_int32"], unpack_cases(), unpack_errors, "codes")


# ============================================================================ dequant_matmul


@spec.prop("dequant_matmul", matmul_cases(), name="returns_documented_types")
def matmul_returns_documented_types(ctx: Ctx, case: Case) -> None:
    """A new (tokens, out_features) array of x's dtype in x's library."""
    x = ctx.convert(case.x)
    args = [ctx.convert(a) for a in SHAPES["dequant_matmul"].call_args(case)[1:]]
    out = ctx.fn("dequant_matmul")(x, *args)
    problem = checks.same_library(out, x)
    assert problem is None, problem
    shape = (case.x.shape[0], case.packed.shape[0])
    checks.assert_shape_dtype(to_numpy(out), shape, case.x.dtype, "y")


@spec.prop("dequant_matmul", matmul_cases())
def is_x_times_the_dequantized_weight(ctx: Ctx, case: Case) -> None:
    """y = x @ W^T for W the unpacked codes' (q - z) * s, within T * M of a float64 oracle
    plus the rounding to x's dtype."""
    got = call(ctx, "dequant_matmul", case)
    want, mag = matmul_oracle(case)
    assert_within(got, want, matmul_tol(case, want, mag), "y")


@spec.prop("dequant_matmul", matmul_cases(), uses=("dequantize", "unpack_int32"))
def equals_dequantize_then_matmul(ctx: Ctx, case: Case) -> None:
    """The fused op is the composition of the implementation's own unpack_int32 and
    dequantize with a matmul (scales in x's compute type), within the same tolerance."""
    c = compute(case.x.dtype)
    columns = case.x.shape[1]
    codes = ctx.call("unpack_int32", case.packed, case.bits, columns)
    w = ctx.call("dequantize", codes, case.scales.astype(c), case.zeros).astype(np.float64)
    want = case.x.astype(np.float64) @ w.T
    got = call(ctx, "dequant_matmul", case)
    _, mag = matmul_oracle(case)
    assert_within(got, want, matmul_tol(case, want, mag), "y")


def matmul_errors(case: Case) -> list[tuple[str, tuple[Any, ...], type]]:
    x, p, s, z, bits = case.x, case.packed, case.scales, case.zeros, case.bits
    rows, groups = s.shape
    other_bits = 8 if bits != 8 else 4
    return [
        ("integer x", (x.astype(np.int32), p, s, z, bits), TypeError),
        ("int64 packed", (x, p.astype(np.int64), s, z, bits), TypeError),
        ("integer scales", (x, p, s.astype(np.int16), z, bits), TypeError),
        ("int32 zeros", (x, p, s, np.zeros(s.shape, np.int32), bits), TypeError),
        ("1-D x", (x.reshape(-1), p, s, z, bits), ValueError),
        (
            "x one column wider",
            (np.zeros((x.shape[0], x.shape[1] + 1), x.dtype), p, s, z, bits),
            ValueError,
        ),
        ("bits that disagree with packed", (x, p, s, z, other_bits), ValueError),
        ("6 bits", (x, p, s, z, 6), ValueError),
        (
            "scales with one row more",
            (x, p, np.ones((rows + 1, groups), s.dtype), z, bits),
            ValueError,
        ),
        (
            "zeros with one group more",
            (x, p, s, np.zeros((rows, groups + 1), np.int8), bits),
            ValueError,
        ),
    ]


add_does_not_modify_inputs(spec, SHAPES["dequant_matmul"], matmul_cases())
add_rejects_invalid_input(
    spec, SHAPES["dequant_matmul"], error_variants(matmul_cases(), matmul_errors)
)


def _matmul_compare(case: Case, got: Any, ref: Any) -> None:
    assert got.dtype == ref.dtype, f"dtype {got.dtype}, the reference's {ref.dtype}"
    want, mag = matmul_oracle(case)
    assert_within(got, ref, 2 * matmul_tol(case, want, mag), "y")


add_matches_reference(
    spec,
    SHAPES["dequant_matmul"],
    matmul_cases(),
    _matmul_compare,
    "The reference's y within twice the tolerance.",
)


# ===================================================================================== fp8

FP8 = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
# half the mantissa step (relative) and half the smallest subnormal step, per format
FP8_BOUND = {"e4m3": (2.0**-4, 2.0**-10), "e5m2": (2.0**-3, 2.0**-17)}
# the codes of the finite values 0 .. max (the rest of 0..127 are NaN or infinities)
FP8_FINITE = {"e4m3": 0x7E, "e5m2": 0x7B}
# the codes of 16: the matmul's weights stay below it, so float16 sums stay finite
FP8_SIXTEEN = {"e4m3": 0x58, "e5m2": 0x4C}


def fp8_max(fmt: str) -> float:
    return float(torch.finfo(FP8[fmt]).max)


def fp8_cast(y: np.ndarray, fmt: str) -> np.ndarray:
    """torch's saturating cast of float32 y to the format, as uint8 codes."""
    top = fp8_max(fmt)
    t = torch.clamp(torch.from_numpy(np.ascontiguousarray(y, np.float32)), -top, top)
    return t.to(FP8[fmt]).view(torch.uint8).numpy()


def fp8_values(codes: np.ndarray, fmt: str) -> np.ndarray:
    """float32 values of uint8 codes, by torch's view of them."""
    return torch.from_numpy(np.ascontiguousarray(codes)).view(FP8[fmt]).float().numpy()


def fp8_scale(a: np.ndarray, fmt: str, axis: Any) -> np.ndarray:
    """float32 amax / max over `axis` (kept), 1 where the amax is 0."""
    amax = np.abs(a.astype(np.float32)).max(axis=axis, keepdims=True)
    s = (amax / np.float32(fp8_max(fmt))).astype(np.float32)
    return np.where(s == 0, np.float32(1), s)


@st.composite
def fp8_quantize_cases(draw: Any) -> Case:
    fmt = draw(st.sampled_from(tuple(FP8)))
    dtype = np.dtype(draw(st.sampled_from(FLOATS)))
    rows, columns = draw(st.integers(0, 5)), draw(st.integers(1, 12))
    width = {2: 16, 4: 32, 8: 64}[dtype.itemsize]
    top = fp8_max(fmt)
    if draw(st.integers(0, 2)) == 0:  # scale 1: values on codes and on their midpoints
        grid = [0.0, 1.0, 8.5, 9.5, 2.0**-7, 3 * 2.0**-10, 0.3125, 11.0, 13.0]
        elements = st.sampled_from(grid + [-v for v in grid])
        weight = draw(hnp.arrays(dtype, (rows, columns), elements=elements))
        if rows:
            weight[draw(st.integers(0, rows - 1)), draw(st.integers(0, columns - 1))] = top
    else:
        bound = draw(st.sampled_from((1.0, 2.0**-10, 96.0)))
        small = st.sampled_from((0.0, 1.0, -1.0, 0.5, -0.0625))
        elements = st.one_of(small, st.floats(-bound, bound, width=width))
        weight = draw(hnp.arrays(dtype, (rows, columns), elements=elements))
    if rows and draw(st.booleans()):  # a whole row of zeros
        weight[draw(st.integers(0, rows - 1)), :] = 0
    return Case(weight=weight, fmt=fmt, per=draw(st.sampled_from(("tensor", "channel"))))


def fp8_codes(fmt: str, shape: tuple[int, int], largest: int | None = None) -> Any:
    """uint8 codes of finite values of the format (of magnitudes up to code `largest`)."""
    finite = FP8_FINITE[fmt] if largest is None else largest
    code = st.integers(0, finite).flatmap(lambda c: st.sampled_from((c, c | 0x80)))
    return hnp.arrays(np.uint8, shape, elements=code)


def fp8_scales(rows: int) -> Any:
    shape = st.sampled_from(((1, 1), (rows, 1)))
    value = st.one_of(st.sampled_from((1.0, 0.5, 2.0**-9)), st.floats(2.0**-12, 4.0, width=32))
    return shape.flatmap(lambda sh: hnp.arrays(np.float32, sh, elements=value))


@st.composite
def fp8_dequantize_cases(draw: Any) -> Case:
    fmt = draw(st.sampled_from(tuple(FP8)))
    rows, columns = draw(st.integers(0, 5)), draw(st.integers(1, 12))
    return Case(codes=draw(fp8_codes(fmt, (rows, columns))), scales=draw(fp8_scales(rows)), fmt=fmt)


@st.composite
def fp8_matmul_cases(draw: Any, dynamic_tokens: bool = False) -> Case:
    """Cases of dequant_matmul_fp8; with `dynamic_tokens`, 2-4 tokens (x with a nonzero
    entry) and a dynamic input_scale only."""
    fmt = draw(st.sampled_from(tuple(FP8)))
    rows = draw(st.integers(1 if dynamic_tokens else 0, 5))
    columns = draw(st.integers(1, 12) | st.integers(13, 40))  # a kernel's 16-code blocks
    dtype = np.dtype(draw(st.sampled_from(FLOATS)))
    tokens = draw(st.integers(2, 4) if dynamic_tokens else st.integers(0, 4))
    width = dtype.itemsize * 8
    bound = 2.0 if columns > 12 else draw(st.sampled_from((2.0, 64.0)))
    x_values = st.one_of(
        st.sampled_from((0.0, 1.0, -1.0, 0.5)), st.floats(-bound, bound, width=width)
    )
    x = draw(hnp.arrays(dtype, (tokens, columns), elements=x_values))
    if tokens >= 2:  # a token 2^10 below the others: per-token and per-tensor scales differ
        x[0] *= dtype.type(2.0**-10)
    dynamic = st.sampled_from(("dynamic", "dynamic_per_token"))
    if dynamic_tokens:
        x[-1, -1] = dtype.type(draw(st.sampled_from((3.0, -40.0))))
        input_scale = draw(dynamic)
    else:
        input_scale = draw(st.one_of(st.none(), dynamic, st.floats(2.0**-6, 1.0, width=32)))
    return Case(
        x=x,
        codes=draw(fp8_codes(fmt, (rows, columns), FP8_SIXTEEN[fmt])),
        scales=draw(fp8_scales(rows)),
        fmt=fmt,
        input_scale=input_scale,
    )


def fp8_matmul_oracle(case: Case) -> tuple[np.ndarray, np.ndarray]:
    """(y in float64, M = |x'| @ |W|^T): W and the activations x' through torch's oracle."""
    c = compute(case.x.dtype)
    w = (fp8_values(case.codes, case.fmt) * case.scales.astype(np.float32)).astype(np.float64)
    x = case.x.astype(np.float64)
    if case.input_scale is not None:
        x32 = case.x.astype(np.float32)
        tokens = x32.shape[0]
        if not x32.size:
            s_x = np.ones((tokens, 1), np.float32)
        elif case.input_scale == "dynamic":
            s_x = np.repeat(fp8_scale(x32.reshape(1, -1), case.fmt, axis=1), tokens, axis=0)
        elif case.input_scale == "dynamic_per_token":
            s_x = fp8_scale(x32, case.fmt, axis=1)
        else:
            s_x = np.full((tokens, 1), case.input_scale, np.float32)
        q = fp8_values(fp8_cast(x32 / s_x, case.fmt), case.fmt)
        x = (q.astype(c) * s_x.astype(c)).astype(np.float64)
    return x @ w.T, np.abs(x) @ np.abs(w).T


@spec.prop("quantize_fp8", fp8_quantize_cases(), name="returns_documented_types")
def fp8_quantize_returns_documented_types(ctx: Ctx, case: Case) -> None:
    """(codes uint8 like the weight, scales float32 (1, 1) per tensor or (rows, 1) per
    channel), in the weight's library."""
    weight = ctx.convert(case.weight)
    result = ctx.fn("quantize_fp8")(weight, case.fmt, case.per)
    assert isinstance(result, tuple) and len(result) == 2, f"returned {type(result).__name__}"
    for part in result:
        problem = checks.same_library(part, weight)
        assert problem is None, problem
    codes, scales = to_numpy(result)
    rows = case.weight.shape[0] if case.per == "channel" else 1
    checks.assert_shape_dtype(codes, case.weight.shape, np.uint8, "codes")
    checks.assert_shape_dtype(scales, (rows, 1), np.float32, "scales")


@spec.prop("quantize_fp8", fp8_quantize_cases())
def scale_is_amax_over_max_and_codes_are_torchs_cast(ctx: Ctx, case: Case) -> None:
    """s = float32 amax / max (448 e4m3, 57344 e5m2; 1 for a zero tensor or row) and the
    codes are torch's clamp(float32(w) / s, -max, max).to(float8) bit for bit (nearest,
    ties to even, saturating)."""
    codes, scales = call(ctx, "quantize_fp8", case)
    w = case.weight.astype(np.float32)
    if case.per == "channel":
        want = fp8_scale(w, case.fmt, axis=1)
    else:
        want = fp8_scale(w, case.fmt, axis=(0, 1)) if w.size else np.ones((1, 1), np.float32)
    checks.assert_equal(scales, want, what="scales")
    checks.assert_equal(codes, fp8_cast(w / want, case.fmt), what="codes")


@spec.prop("quantize_fp8", fp8_quantize_cases(), uses=("dequantize_fp8",))
def fp8_round_trips_within_the_format_bound(ctx: Ctx, case: Case) -> None:
    """dequantize_fp8 of the codes is within a relative 2^-4 (e4m3) or 2^-3 (e5m2) of the
    weight, plus half a subnormal step times s; a zero weight comes back exactly 0."""
    codes, scales = call(ctx, "quantize_fp8", case)
    back = ctx.call("dequantize_fp8", codes, scales, case.fmt).astype(np.float64)
    w = case.weight.astype(np.float32).astype(np.float64)
    rel, sub = FP8_BOUND[case.fmt]
    s = scales.astype(np.float64)
    tol = rel * np.abs(w) * (1 + 2.0**-20) + sub * s * (1 + 2.0**-20) + 2.0**-22 * np.abs(w)
    assert_within(back, w, tol, "dequantized weight")
    zero = w == 0
    checks.assert_equal(back[zero], np.zeros(int(zero.sum())), what="dequantized zero weights")


def fp8_quantize_errors(case: Case) -> list[tuple[str, tuple[Any, ...], type]]:
    w, fmt, per = case.weight, case.fmt, case.per
    errors = [
        ("integer weight", (w.astype(np.int32), fmt, per), TypeError),
        ("1-D weight", (w.reshape(-1), fmt, per), ValueError),
        ("no column", (w[:, :0], fmt, per), ValueError),
        ("fmt 'e3m4'", (w, "e3m4", per), ValueError),
        ("fmt as torch's dtype name", (w, "float8_e4m3fn", per), ValueError),
        ("per 'group'", (w, fmt, "group"), ValueError),
    ]
    if w.shape[0]:
        nan, inf = w.copy(), w.copy()
        nan[-1, 0], inf[0, -1] = np.nan, np.inf
        errors += [("a NaN weight", (nan, fmt, per), ValueError)]
        errors += [("an infinite weight", (inf, fmt, per), ValueError)]
    return errors


add_does_not_modify_inputs(spec, SHAPES["quantize_fp8"], fp8_quantize_cases())
add_rejects_invalid_input(
    spec, SHAPES["quantize_fp8"], error_variants(fp8_quantize_cases(), fp8_quantize_errors)
)


def _fp8_quantize_compare(case: Case, got: Any, ref: Any) -> None:
    for name, g, r in zip(("codes", "scales"), got, ref, strict=True):
        assert g.dtype == r.dtype, f"{name} dtype {g.dtype}, the reference's {r.dtype}"
        checks.assert_equal(g, r, what=name)


add_matches_reference(
    spec,
    SHAPES["quantize_fp8"],
    fp8_quantize_cases(),
    _fp8_quantize_compare,
    "The reference's codes and scales, exactly.",
)


@spec.prop("dequantize_fp8", fp8_dequantize_cases())
def is_the_codes_value_times_the_scale(ctx: Ctx, case: Case) -> None:
    """W = fp8(q) * s in float32 bit for bit, fp8(q) by torch's view of the codes, s the
    tensor's or the row's scale; a new float32 array."""
    got = call(ctx, "dequantize_fp8", case)
    want = fp8_values(case.codes, case.fmt) * case.scales.astype(np.float32)
    checks.assert_shape_dtype(got, case.codes.shape, np.float32, "weight")
    checks.assert_equal(got, want, what="weight")


def fp8_dequantize_errors(case: Case) -> list[tuple[str, tuple[Any, ...], type]]:
    q, s, fmt = case.codes, case.scales, case.fmt
    rows = q.shape[0]
    return [
        ("int8 codes", (q.view(np.int8), s, fmt), TypeError),
        ("integer scales", (q, s.astype(np.int32), fmt), TypeError),
        ("1-D codes", (q.reshape(-1), s, fmt), ValueError),
        ("scales of one row more", (q, np.ones((rows + 2, 1), np.float32), fmt), ValueError),
        ("scales of two columns", (q, np.ones((rows, 2), np.float32), fmt), ValueError),
        ("1-D scales", (q, np.ones(1, np.float32), fmt), ValueError),
        ("fmt 'fp8'", (q, s, "fp8"), ValueError),
    ]


add_exact_op_properties(
    spec, SHAPES["dequantize_fp8"], fp8_dequantize_cases(), fp8_dequantize_errors, "weight"
)


@spec.prop("dequant_matmul_fp8", fp8_matmul_cases(), name="returns_documented_types")
def fp8_matmul_returns_documented_types(ctx: Ctx, case: Case) -> None:
    """A new (tokens, out_features) array of x's dtype in x's library."""
    x = ctx.convert(case.x)
    out = ctx.fn("dequant_matmul_fp8")(
        x, ctx.convert(case.codes), ctx.convert(case.scales), case.fmt, case.input_scale
    )
    problem = checks.same_library(out, x)
    assert problem is None, problem
    shape = (case.x.shape[0], case.codes.shape[0])
    checks.assert_shape_dtype(to_numpy(out), shape, case.x.dtype, "y")


@spec.prop("dequant_matmul_fp8", fp8_matmul_cases())
def is_the_fp8_activations_times_the_fp8_weight(ctx: Ctx, case: Case) -> None:
    """y = x' @ W^T for W the codes' values times the scales and x' the activations (x
    itself, or with an input_scale its saturating fp8 cast and back with s_x = the given
    float or float32 amax |x| / max over x or over the token's row), within T * M of a
    float64 oracle plus the rounding to x's dtype."""
    got = call(ctx, "dequant_matmul_fp8", case)
    want, mag = fp8_matmul_oracle(case)
    assert_within(got, want, matmul_tol(case, want, mag), "y")


@spec.prop("dequant_matmul_fp8", fp8_matmul_cases(dynamic_tokens=True))
def dynamic_scales_cover_the_tensor_or_each_token(ctx: Ctx, case: Case) -> None:
    """With 2-4 tokens, the first 2^10 below the others, "dynamic" takes one amax over all
    of x and "dynamic_per_token" one per token (the oracle of the property above)."""
    got = call(ctx, "dequant_matmul_fp8", case)
    want, mag = fp8_matmul_oracle(case)
    assert_within(got, want, matmul_tol(case, want, mag), "y")


@spec.prop("dequant_matmul_fp8", fp8_matmul_cases(), uses=("dequantize_fp8",))
def weight_only_equals_dequantize_then_matmul(ctx: Ctx, case: Case) -> None:
    """With input_scale None the layer is the implementation's own dequantize_fp8 and a
    matmul in x's compute type, within the same tolerance."""
    case = Case(**{**{k: getattr(case, k) for k in case._fields}, "input_scale": None})
    w = ctx.call("dequantize_fp8", case.codes, case.scales, case.fmt).astype(np.float64)
    want = case.x.astype(np.float64) @ w.T
    got = call(ctx, "dequant_matmul_fp8", case)
    _, mag = fp8_matmul_oracle(case)
    assert_within(got, want, matmul_tol(case, want, mag), "y")


def fp8_matmul_errors(case: Case) -> list[tuple[str, tuple[Any, ...], type]]:
    x, q, s, fmt, si = case.x, case.codes, case.scales, case.fmt, case.input_scale
    rows = q.shape[0]
    return [
        ("integer x", (x.astype(np.int32), q, s, fmt, si), TypeError),
        ("int8 codes", (x, q.view(np.int8), s, fmt, si), TypeError),
        ("integer scales", (x, q, s.astype(np.int16), fmt, si), TypeError),
        ("1-D x", (x.reshape(-1), q, s, fmt, si), ValueError),
        (
            "x one column wider",
            (np.zeros((x.shape[0], x.shape[1] + 1), x.dtype), q, s, fmt, si),
            ValueError,
        ),
        ("scales of two columns", (x, q, np.ones((rows, 2), np.float32), fmt, si), ValueError),
        ("fmt 'e4m3fn'", (x, q, s, "e4m3fn", si), ValueError),
        ("input_scale 0", (x, q, s, fmt, 0.0), ValueError),
        ("input_scale inf", (x, q, s, fmt, float("inf")), ValueError),
        ("input_scale 'static'", (x, q, s, fmt, "static"), ValueError),
        ("input_scale as a list", (x, q, s, fmt, [1.0]), TypeError),
        ("input_scale True", (x, q, s, fmt, True), TypeError),
    ]


add_does_not_modify_inputs(spec, SHAPES["dequant_matmul_fp8"], fp8_matmul_cases())
add_rejects_invalid_input(
    spec, SHAPES["dequant_matmul_fp8"], error_variants(fp8_matmul_cases(), fp8_matmul_errors)
)


def _fp8_matmul_compare(case: Case, got: Any, ref: Any) -> None:
    assert got.dtype == ref.dtype, f"dtype {got.dtype}, the reference's {ref.dtype}"
    want, mag = fp8_matmul_oracle(case)
    assert_within(got, ref, 2 * matmul_tol(case, want, mag), "y")


add_matches_reference(
    spec,
    SHAPES["dequant_matmul_fp8"],
    fp8_matmul_cases(),
    _fp8_matmul_compare,
    "The reference's y within twice the tolerance.",
)
