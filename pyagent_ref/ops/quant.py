"""Weight-only integer quantization: codes, scales, zero points, packing, and the matmul.

A linear layer's weight W, shape (out_features, in_features), is stored as small integer
codes q with a float scale s (and, asymmetric, an integer zero point z) per output row
and per group of `group_size` consecutive input columns (one group of every column:
per-channel). The weight the layer computes with is

    W[o, i] = (q[o, i] - z[o, g]) * s[o, g],    g = i // group_size,

with z = 0 for symmetric quantization. Codes are signed, q in [-2^(b-1), 2^(b-1)) for b
bits (int4: [-8, 7], int8: [-128, 127]), held one per int8 element; zero points are int8
in the same range. That is the reading of compressed-tensors' int-quantized and
pack-quantized checkpoints (vLLM's `compressed-tensors` method); GPTQ's and AWQ's unsigned
codes u with zero u_z are the same weight with q = u - 2^(b-1), z = u_z - 2^(b-1)
(`pyagent_ref.quant` converts them at load).

Packing (`pack_int32`): 32 / b codes per int32 word along the input axis, code j of a
word in bits [j*b, (j+1)*b), stored unsigned as q + 2^(b-1). In memory (little-endian) an
int8 word is four bytes, byte j holding code j plus 128; an int4 word is four bytes,
code 2k in the low nibble of byte k and code 2k + 1 in its high nibble:

    int32 word, bits 31 ............................................... 0
    int4:   [ q7+8 | q6+8 | q5+8 | q4+8 | q3+8 | q2+8 | q1+8 | q0+8 ]   8 x 4 bits
    int8:   [   q3+128    |    q2+128   |    q1+128   |    q0+128   ]   4 x 8 bits

`quantize` is round-to-nearest (RTN) quantization, `dequantize` the formula above,
`dequant_matmul` a linear layer on a packed weight: x @ W^T. The reference dequantizes and
multiplies; a fused kernel reads the packed codes directly (the accelerator never builds
the float weight).

FP8 weights (vLLM's `fp8` checkpoints, compressed-tensors' float-quantized ones) store one
8-bit float code per weight with a float32 scale per tensor or per output row:

    W[o, i] = fp8(q[o, i]) * s[o or 0],     s = amax / max     (amax over the tensor or row)

A code is a byte [ s | e e e e | m m m ] (e4m3: exponent bias 7, largest finite 448,
0x7F/0xFF NaN, no infinity) or [ s | e e e e e | m m ] (e5m2: bias 15, largest finite
57344, IEEE infinities); `ops._fp8` spells the values out. Codes are held as uint8 arrays
of those bit patterns (a torch float8_e4m3fn / float8_e5m2 tensor is the same bytes:
`.view(torch.uint8)`). `quantize_fp8` is the saturating cast rounding to nearest, ties to
even, `dequantize_fp8` the formula above, `dequant_matmul_fp8` the layer, with vLLM's
optional fp8 quantization of the activations (a static scale, or a dynamic one per tensor
or per token).
"""

from __future__ import annotations

from typing import Any

from array_api_compat import device

from . import _fp8
from ._arrays import ANY_FLOAT_DTYPE_NAMES, can_read_values, dtype_name, first_bad_row, namespace

__all__ = [
    "quantize",
    "dequantize",
    "pack_int32",
    "unpack_int32",
    "dequant_matmul",
    "quantize_fp8",
    "dequantize_fp8",
    "dequant_matmul_fp8",
]

BITS = (2, 4, 8)
"""The code widths: each divides 32 (codes per int32 word: 16, 8, 4)."""


# --- validation -----------------------------------------------------------------------------


def _array(x: Any, name: str, ndim: int, kinds: tuple[str, ...], what: str) -> Any:
    """The namespace of `x`, which must have `ndim` axes and a dtype in `kinds`."""
    xp = namespace(x, name)
    if dtype_name(x) not in kinds:
        raise TypeError(f"{name} must be {what}, got dtype {dtype_name(x)}")
    if x.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} axes, got shape {tuple(x.shape)}")
    return xp


def _float(x: Any, name: str, ndim: int) -> Any:
    return _array(x, name, ndim, ANY_FLOAT_DTYPE_NAMES, "a float array")


def _bits(bits: Any) -> int:
    if isinstance(bits, bool) or not isinstance(bits, int):
        raise TypeError(f"bits must be an int, got {type(bits).__name__}")
    if bits not in BITS:
        raise ValueError(f"bits must be one of {BITS}, got {bits}")
    return bits


def _groups(scales: Any, zeros: Any, rows: int, in_features: int) -> int:
    """Check scales (rows, groups), groups dividing in_features, and zeros None or int8 of
    the same shape; return the group size."""
    _float(scales, "scales", 2)
    groups = scales.shape[1]
    if scales.shape[0] != rows or groups == 0 or in_features % groups:
        raise ValueError(
            f"scales must have shape ({rows}, groups) with groups dividing in_features "
            f"{in_features}, got {tuple(scales.shape)}"
        )
    if zeros is not None:
        _array(zeros, "zeros", 2, ("int8",), "int8 (or None: symmetric)")
        if tuple(zeros.shape) != tuple(scales.shape):
            raise ValueError(
                f"zeros must have scales' shape {tuple(scales.shape)}, got {tuple(zeros.shape)}"
            )
    return in_features // groups


def _finite_rows(xp: Any, weight: Any) -> None:
    if can_read_values(weight) and weight.size:
        row = first_bad_row(xp, ~xp.all(xp.isfinite(weight), axis=1))
        if row is not None:
            raise ValueError(f"weight row {row} contains NaN or inf")


FP8_FORMATS = {"e4m3": _fp8.E4M3, "e5m2": _fp8.E5M2}
"""The fp8 weight formats by name (`ops._fp8`: torch's float8_e4m3fn and float8_e5m2)."""


def _fp8_format(fmt: Any) -> _fp8.Fp8Format:
    if not isinstance(fmt, str) or fmt not in FP8_FORMATS:
        raise ValueError(f"fmt must be one of {tuple(FP8_FORMATS)}, got {fmt!r}")
    return FP8_FORMATS[fmt]


def _fp8_scales(scales: Any, rows: int) -> None:
    """scales: a float array of shape (1, 1) (per tensor) or (rows, 1) (per channel)."""
    _float(scales, "scales", 2)
    if tuple(scales.shape) not in ((1, 1), (rows, 1)):
        raise ValueError(
            f"scales must have shape (1, 1) (per tensor) or ({rows}, 1) (per channel), "
            f"got {tuple(scales.shape)}"
        )


DYNAMIC_SCALES = ("dynamic", "dynamic_per_token")


def _input_scale(input_scale: Any) -> float | str | None:
    """None, "dynamic", "dynamic_per_token", or a positive finite float (an int is
    accepted as one)."""
    if input_scale is None or input_scale in DYNAMIC_SCALES:
        return input_scale
    if isinstance(input_scale, str):
        raise ValueError(
            f"input_scale must be None, one of {DYNAMIC_SCALES} or a float, got {input_scale!r}"
        )
    if isinstance(input_scale, bool) or not isinstance(input_scale, (int, float)):
        raise TypeError(
            f"input_scale must be None, a string or a float, got {type(input_scale).__name__}"
        )
    if not 0 < float(input_scale) < float("inf"):
        raise ValueError(f"input_scale must be a positive finite float, got {input_scale!r}")
    return float(input_scale)


def _compute_dtype(xp: Any, x: Any) -> Any:
    return xp.float64 if dtype_name(x) == "float64" else xp.float32


def _per_column(xp: Any, a: Any, group_size: int) -> Any:
    """(rows, groups) -> (rows, groups * group_size): each group's value on its columns."""
    rows, groups = a.shape
    spread = xp.broadcast_to(xp.reshape(a, (rows, groups, 1)), (rows, groups, group_size))
    return xp.reshape(spread, (rows, groups * group_size))


# --- the ops --------------------------------------------------------------------------------


def quantize(
    weight: Any, bits: int, group_size: int | None = None, symmetric: bool = True
) -> tuple[Any, Any, Any]:
    """Round-to-nearest quantization of a weight to signed b-bit codes per row and group.

    For each row o and group g (the columns [g * group_size, (g + 1) * group_size); one
    group of every column when group_size is None), computed in C = float32 (float64 for
    a float64 weight) from the weight converted once, with qmin = -2^(b-1), qmax =
    2^(b-1) - 1, lo = min(0, min of the group), hi = max(0, max of the group):

    - symmetric: s = max(-lo, hi) / ((qmax - qmin) / 2) (absmax / 7.5 for 4 bits, as
      GPTQ and compressed-tensors compute it), z = 0;
    - asymmetric: s = (hi - lo) / (qmax - qmin), z = clip(qmin - round(lo / s), qmin, qmax);
    - a group of zeros gets s = 1;

    then q = clip(round(w / s) + z, qmin, qmax), with round to nearest, ties to even,
    and every division a correctly rounded one in C. The range includes 0, so a zero
    weight is exact; `dequantize` is within s / 2 of the weight everywhere.

    Args:
        weight: float array (float16, bfloat16, float32 or float64), shape
            (out_features, in_features), every entry finite; out_features may be 0.
        bits: 2, 4 or 8.
        group_size: None (per channel), or an int >= 1 that divides in_features.
        symmetric: z = 0 (True) or a zero point per group (False).
    Returns:
        (codes, scales, zeros): int8 (out_features, in_features); C of shape
        (out_features, groups); int8 of that shape, or None when symmetric. New arrays
        in the weight's library and device.
    Raises:
        TypeError: a non-float weight, non-int bits or group_size, non-bool symmetric.
        ValueError: a weight that is not 2-D, has no column or holds NaN or inf (the
            message names the row), bits not in (2, 4, 8), a group_size < 1 or not
            dividing in_features (it names both).
    """
    xp = _float(weight, "weight", 2)
    bits = _bits(bits)
    out_features, in_features = weight.shape
    if in_features == 0:
        raise ValueError(f"weight must have in_features >= 1, got shape {tuple(weight.shape)}")
    if group_size is not None:
        if isinstance(group_size, bool) or not isinstance(group_size, int):
            raise TypeError(f"group_size must be an int or None, got {type(group_size).__name__}")
        if group_size < 1 or in_features % group_size:
            raise ValueError(
                f"group_size must be >= 1 and divide in_features {in_features}, got {group_size}"
            )
    if not isinstance(symmetric, bool):
        raise TypeError(f"symmetric must be a bool, got {type(symmetric).__name__}")
    _finite_rows(xp, weight)
    size = group_size or in_features
    groups = in_features // size
    compute = _compute_dtype(xp, weight)
    w = xp.reshape(xp.astype(weight, compute), (out_features, groups, size))
    zero = xp.zeros((), dtype=compute, device=device(weight))
    lo, hi = xp.minimum(xp.min(w, axis=2), zero), xp.maximum(xp.max(w, axis=2), zero)
    qmin, qmax = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    if symmetric:
        scales = xp.maximum(-lo, hi) / ((qmax - qmin) / 2)
    else:
        scales = (hi - lo) / (qmax - qmin)
    scales = xp.where(scales == 0, xp.ones_like(scales), scales)
    zeros = None
    offset = xp.zeros_like(scales)
    if not symmetric:
        offset = xp.clip(qmin - xp.round(lo / scales), qmin, qmax)
        zeros = xp.astype(offset, xp.int8)
    q = xp.round(w / xp.reshape(scales, (out_features, groups, 1)))
    q = xp.clip(q + xp.reshape(offset, (out_features, groups, 1)), qmin, qmax)
    codes = xp.astype(xp.reshape(q, (out_features, in_features)), xp.int8)
    return codes, scales, zeros


def dequantize(codes: Any, scales: Any, zeros: Any = None) -> Any:
    """The float weight of codes, scales and zero points: W = (q - z) * s per group.

    W[o, i] = (codes[o, i] - zeros[o, g]) * scales[o, g] with g = i // group_size and
    group_size = in_features // groups (z = 0 when zeros is None), computed in C =
    float32 (float64 for float64 scales): the integer difference is exact in C and the
    product is rounded once, so every conforming implementation gives the same bits.

    Args:
        codes: int8, shape (out_features, in_features).
        scales: float array (float16, bfloat16, float32 or float64), shape
            (out_features, groups), groups >= 1 dividing in_features.
        zeros: None (symmetric), or int8 of scales' shape.
    Returns:
        A new C array of shape (out_features, in_features) in codes' library and device.
    Raises:
        TypeError: codes or zeros not int8, non-float scales.
        ValueError: shapes that disagree (the message names the array), groups not
            dividing in_features.
    """
    xp = _array(codes, "codes", 2, ("int8",), "int8")
    out_features, in_features = codes.shape
    group_size = _groups(scales, zeros, out_features, in_features)
    compute = _compute_dtype(xp, scales)
    q = xp.astype(codes, compute)
    if zeros is not None:
        q = q - _per_column(xp, xp.astype(zeros, compute), group_size)
    return q * _per_column(xp, xp.astype(scales, compute), group_size)


def pack_int32(codes: Any, bits: int) -> Any:
    """Signed b-bit codes packed 32 / b to an int32 word along the last axis.

    Word w of row r holds codes[r, w * k + j] (k = 32 / b codes per word) in bits
    [j * b, (j + 1) * b), stored unsigned as the code plus 2^(b-1) (compressed-tensors'
    `pack_to_int32`, and the byte layout of the module docstring). A row whose length is
    not a multiple of k is padded to one: the padding fields are 0 bits.

    Args:
        codes: int8, shape (rows, n), each in [-2^(b-1), 2^(b-1)); rows and n may be 0.
        bits: 2, 4 or 8.
    Returns:
        A new int32 array of shape (rows, ceil(n / k)) in codes' library and device.
    Raises:
        TypeError: codes not int8, non-int bits.
        ValueError: codes not 2-D, bits not in (2, 4, 8), a code out of range (the
            message names its row and value).
    """
    xp = _array(codes, "codes", 2, ("int8",), "int8")
    bits = _bits(bits)
    rows, n = codes.shape
    per_word = 32 // bits
    half = 2 ** (bits - 1)
    wide = xp.astype(codes, xp.int32)  # (torch compares int8 with 128 as with -128)
    if can_read_values(codes) and codes.size:
        outside = (wide < -half) | (wide >= half)
        row = first_bad_row(xp, xp.any(outside, axis=1))
        if row is not None:
            value = int(wide[row, ...][outside[row, ...]][0])
            raise ValueError(
                f"codes row {row} holds {value}, outside the {bits}-bit range [{-half}, {half})"
            )
    words = -(-n // per_word)
    fields = wide + half
    padding = xp.zeros((rows, words * per_word - n), dtype=xp.int32, device=device(codes))
    fields = xp.reshape(xp.concat([fields, padding], axis=1), (rows, words, per_word))
    packed = xp.zeros((rows, words), dtype=xp.int32, device=device(codes))
    for j in range(per_word):
        packed = xp.bitwise_or(packed, xp.bitwise_left_shift(fields[:, :, j], j * bits))
    return packed


def unpack_int32(packed: Any, bits: int, size: int) -> Any:
    """The first `size` codes of each row of `pack_int32`'s words (its inverse).

    codes[r, i] = field i % k of word i // k (k = 32 / b), minus 2^(b-1).

    Args:
        packed: int32, shape (rows, words).
        bits: 2, 4 or 8.
        size: the codes per row, an int with ceil(size / k) == words.
    Returns:
        A new int8 array of shape (rows, size) in packed's library and device.
    Raises:
        TypeError: packed not int32, non-int bits or size.
        ValueError: packed not 2-D, bits not in (2, 4, 8), a size that does not fill
            exactly `words` words (the message names it).
    """
    xp = _array(packed, "packed", 2, ("int32",), "int32")
    bits = _bits(bits)
    if isinstance(size, bool) or not isinstance(size, int):
        raise TypeError(f"size must be an int, got {type(size).__name__}")
    rows, words = packed.shape
    per_word = 32 // bits
    if size < 0 or -(-size // per_word) != words:
        raise ValueError(f"size must fill packed's {words} words of {per_word} codes, got {size}")
    mask = 2**bits - 1
    fields = [
        xp.bitwise_and(xp.bitwise_right_shift(packed, j * bits), mask) for j in range(per_word)
    ]
    codes = xp.reshape(xp.stack(fields, axis=2), (rows, words * per_word))[:, :size]
    return xp.astype(codes - 2 ** (bits - 1), xp.int8)


def dequant_matmul(x: Any, packed: Any, scales: Any, zeros: Any, bits: int) -> Any:
    """A linear layer on a packed quantized weight: y = x @ W^T.

    W = dequantize(unpack_int32(packed, bits, in_features), scales, zeros) computed in C =
    float32 (float64 for a float64 x; scales converted to C first), then y[t, o] =
    sum_i x[t, i] * W[o, i] summed in C and rounded once to x's dtype. The sum may run in
    any order (a conforming result is within the tolerance its specification states).
    Bias is not included (add it to y).

    Args:
        x: float array (float16, bfloat16, float32 or float64), shape (tokens,
            in_features); tokens may be 0.
        packed: int32, shape (out_features, in_features * bits / 32): `pack_int32`'s words
            (in_features must be a multiple of 32 / bits).
        scales: float array, shape (out_features, groups), groups >= 1 dividing
            in_features.
        zeros: None (symmetric) or int8 of scales' shape.
        bits: 2, 4 or 8.
    Returns:
        A new array of x's dtype, shape (tokens, out_features), in x's library and device.
    Raises:
        TypeError: non-float x or scales, packed not int32, zeros not int8, non-int bits.
        ValueError: shapes that disagree (the message names the array), bits not in
            (2, 4, 8), in_features not a multiple of 32 / bits.
    """
    xp = _float(x, "x", 2)
    _array(packed, "packed", 2, ("int32",), "int32")
    bits = _bits(bits)
    in_features = x.shape[1]
    per_word = 32 // bits
    if in_features % per_word or packed.shape[1] != in_features // per_word:
        raise ValueError(
            f"packed must have shape (out_features, {in_features} / {per_word}) for x's "
            f"{in_features} features ({bits}-bit codes, a whole number of words), "
            f"got {tuple(packed.shape)}"
        )
    _groups(scales, zeros, packed.shape[0], in_features)
    compute = _compute_dtype(xp, x)
    codes = unpack_int32(packed, bits, in_features)
    weight = dequantize(codes, xp.astype(scales, compute), zeros)
    return xp.astype(xp.astype(x, compute) @ xp.matrix_transpose(weight), x.dtype)


# --- fp8 ------------------------------------------------------------------------------------


def _amax_scale(xp: Any, a: Any, fmt: _fp8.Fp8Format, axis: Any) -> Any:
    """float32 amax(|a|) / max per `axis` (keeping dims), 1 where the amax is 0."""
    amax = xp.max(xp.abs(a), axis=axis, keepdims=True)
    scales = amax / xp.asarray(fmt.max, dtype=xp.float32, device=device(a))
    return xp.where(scales == 0, xp.ones_like(scales), scales)


def quantize_fp8(weight: Any, fmt: str = "e4m3", per: str = "tensor") -> tuple[Any, Any]:
    """Quantize a weight to fp8 codes with a float32 scale per tensor or per output row.

    With w = float32(weight) (float64 weights rounded once to float32), amax = max |w| over
    the tensor (per "tensor") or over each row (per "channel"), and max the format's
    largest finite value (448 for e4m3, 57344 for e5m2):

        s = amax / max  (float32 division, correctly rounded; s = 1 where amax == 0)
        q = the code of w / s (float32 division), rounded to the nearest code, ties to the
            even code, saturating at +-max

    which is torch's `torch.clamp(w / s, -max, max).to(torch.float8_e4m3fn)` (or
    float8_e5m2) bit for bit: vLLM's and compressed-tensors' per-tensor and per-channel
    fp8 weights. A zero weight is exact; a nonzero one round-trips (`dequantize_fp8`)
    within a relative 2^-4 (e4m3) or 2^-3 (e5m2) plus half the smallest subnormal step
    times s (2^-10 s for e4m3, 2^-17 s for e5m2).

    Args:
        weight: float array (float16, bfloat16, float32 or float64), shape
            (out_features, in_features), every entry finite; out_features may be 0.
        fmt: "e4m3" or "e5m2".
        per: "tensor" (one scale) or "channel" (one per output row).
    Returns:
        (codes, scales): uint8 (out_features, in_features), the format's bit patterns;
        float32 of shape (1, 1) per tensor (1 for an empty weight) or (out_features, 1)
        per channel. New arrays in the weight's library and device.
    Raises:
        TypeError: a non-float weight.
        ValueError: a weight that is not 2-D, has no column, or holds NaN or inf (the
            message names the row); fmt or per not one of the names above.
    """
    xp = _float(weight, "weight", 2)
    fmt_ = _fp8_format(fmt)
    if per not in ("tensor", "channel"):
        raise ValueError(f"per must be 'tensor' or 'channel', got {per!r}")
    if weight.shape[1] == 0:
        raise ValueError(f"weight must have in_features >= 1, got shape {tuple(weight.shape)}")
    _finite_rows(xp, weight)
    w = xp.astype(weight, xp.float32)
    if per == "channel":
        scales = _amax_scale(xp, w, fmt_, axis=1)
    elif weight.shape[0] == 0:
        scales = xp.ones((1, 1), dtype=xp.float32, device=device(weight))
    else:
        scales = _amax_scale(xp, w, fmt_, axis=(0, 1))
    return _fp8.encode(xp, w / scales, 1.0, fmt_, device(weight)), scales


def dequantize_fp8(codes: Any, scales: Any, fmt: str = "e4m3") -> Any:
    """The float32 weight of fp8 codes and scales: W[o, i] = fp8(codes[o, i]) * s.

    fp8(q) is the code's value (exact in float32; NaN codes give NaN, e5m2's infinity
    codes infinity), s = scales[0, 0] (per tensor) or scales[o, 0] (per channel) converted
    to float32; the product is rounded once in float32.

    Args:
        codes: uint8, shape (out_features, in_features): the format's bit patterns.
        scales: float array, shape (1, 1) or (out_features, 1).
        fmt: "e4m3" or "e5m2".
    Returns:
        A new float32 array of codes' shape in codes' library and device.
    Raises:
        TypeError: codes not uint8, non-float scales.
        ValueError: codes not 2-D, scales of another shape, an unknown fmt.
    """
    xp = _array(codes, "codes", 2, ("uint8",), "uint8 (the fp8 bit patterns)")
    _fp8_scales(scales, codes.shape[0])
    fmt_ = _fp8_format(fmt)
    return _fp8.decode(codes, fmt_) * xp.astype(scales, xp.float32)


def dequant_matmul_fp8(
    x: Any, codes: Any, scales: Any, fmt: str = "e4m3", input_scale: Any = None
) -> Any:
    """A linear layer on an fp8 weight: y = x' @ W^T, optionally with fp8 activations.

    In C = float32 (float64 for a float64 x): W = dequantize_fp8(codes, scales, fmt)
    converted to C (exact), and x' the activations:

    - input_scale None (weight-only): x' = x converted to C;
    - input_scale a float s_x (vLLM's static activation scheme), "dynamic" (its dynamic
      per-tensor scheme: s_x = float32(amax |x| over all of x) / max) or
      "dynamic_per_token" (one s_x per row t of x: float32(amax |x[t]|) / max), each 1
      where that amax is 0: the activations quantized to the weight's format and back,
      x' = fp8(q_x) * s_x with q_x = the saturating nearest-even code of float32(x) / s_x
      (float32 division), the product in C.

    y[t, o] = sum_i x'[t, i] * W[o, i] summed in C in any order (within the tolerance the
    specification states) and rounded once to x's dtype. This is vLLM's w8a8 fp8 GEMM,
    (q_x @ q^T) * s_x * s, up to the order of the roundings. Bias is not included.

    Args:
        x: float array (float16, bfloat16, float32 or float64), shape (tokens,
            in_features); tokens may be 0; finite.
        codes: uint8, shape (out_features, in_features).
        scales: float array, shape (1, 1) or (out_features, 1).
        fmt: "e4m3" or "e5m2" (of the weight, and of the activations when quantized).
        input_scale: None, "dynamic", "dynamic_per_token", or a positive finite float.
    Returns:
        A new array of x's dtype, shape (tokens, out_features), in x's library and device.
    Raises:
        TypeError: non-float x or scales, codes not uint8, an input_scale of another type.
        ValueError: shapes that disagree (the message names the array), an unknown fmt,
            an input_scale that is not positive and finite or an unknown string.
    """
    xp = _float(x, "x", 2)
    _array(codes, "codes", 2, ("uint8",), "uint8 (the fp8 bit patterns)")
    if codes.shape[1] != x.shape[1]:
        raise ValueError(
            f"codes must have shape (out_features, {x.shape[1]}) for x's features, "
            f"got {tuple(codes.shape)}"
        )
    _fp8_scales(scales, codes.shape[0])
    fmt_ = _fp8_format(fmt)
    input_scale = _input_scale(input_scale)
    compute = _compute_dtype(xp, x)
    xc = xp.astype(x, compute)
    if input_scale is not None:
        x32 = xp.astype(x, xp.float32)
        empty = 0 in tuple(x.shape)
        if input_scale == "dynamic_per_token":
            s_x = xp.ones((x.shape[0], 1), dtype=xp.float32, device=device(x))
            if not empty:
                s_x = _amax_scale(xp, x32, fmt_, axis=1)
        elif input_scale == "dynamic":
            s_x = xp.ones((1, 1), dtype=xp.float32, device=device(x))
            if not empty:
                s_x = _amax_scale(xp, xp.reshape(x32, (1, -1)), fmt_, axis=1)
        else:
            s_x = xp.asarray([[input_scale]], dtype=xp.float32, device=device(x))
        q_x = _fp8.encode(xp, x32 / s_x, 1.0, fmt_, device(x))
        xc = xp.astype(_fp8.decode(q_x, fmt_), compute) * xp.astype(s_x, compute)
    weight = xp.astype(dequantize_fp8(codes, scales, fmt), compute)
    return xp.astype(xc @ xp.matrix_transpose(weight), x.dtype)
