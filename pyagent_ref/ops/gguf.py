"""llama.cpp's block formats (GGUF tensor types Q8_0, Q4_0, Q4_K, Q6_K): bytes, weights, matmul.

A quantized GGUF tensor of shape (out_features, in_features) is stored row by row, each
row a run of blocks of `block_size` consecutive weights, each block `type_size` bytes
(`BLOCKS`); here a tensor is a uint8 array of shape (out_features, blocks * type_size).
fp16 fields are IEEE half precision, little-endian; `d`, `dmin` are block scales, codes
unsigned unless said. The weight of element k of a block:

    Q8_0  32 weights, 34 bytes            w = d * q           q int8
      [ d fp16 | q0 q1 ... q31 (int8) ]
       0     2                       34

    Q4_0  32 weights, 18 bytes            w = d * (q - 8)     q in [0, 15]
      [ d fp16 | byte j = q_j (low nibble) | q_(j+16) << 4, j = 0..15 ]
       0     2                                                      18

    Q4_K  256 weights in 8 sub-blocks of 32, 144 bytes
                                          w = (d * sc_s) * q - dmin * m_s,  s = k // 32
      [ d fp16 | dmin fp16 | scales 12 bytes | qs 128 bytes ]
       0     2           4                 16             144
      scales: six-bit sc_s, m_s for s = 0..7:
        s < 4:  sc_s = B[s] & 63,  m_s = B[s + 4] & 63
        s >= 4: sc_s = (B[s + 4] & 15) | (B[s - 4] >> 6) << 4
                m_s  = (B[s + 4] >> 4) | (B[s] >> 6) << 4
      qs: 64 weights per 32 bytes; byte 32c + l holds weight 64c + l in its low nibble
        and weight 64c + 32 + l in its high nibble (c = 0..3, l = 0..31).

    Q6_K  256 weights in 16 sub-blocks of 16, 210 bytes
                                          w = (d * sc_s) * (q - 32),  s = k // 16
      [ ql 128 bytes | qh 64 bytes | sc int8 x 16 | d fp16 ]
       0           128          192            208      210
      six-bit q = low 4 bits from ql, high 2 bits from qh; per half h = 0, 1 (weights
        128h + e, e = 0..127), with l = e % 32 and t = e // 32:
        low  = ql[64h + l + 32 (t % 2)] >> 4 (t // 2)   & 15
        high = qh[32h + l] >> 2t                        & 3

`quantize` is llama.cpp's reference quantizer (`quantize_row_*_ref`, no importance
matrix), `dequantize` the formulas above, `gguf_matmul` a linear layer on the bytes. The
reference dequantizes and multiplies; a fused kernel reads the blocks directly.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from array_api_compat import device

from ._arrays import ANY_FLOAT_DTYPE_NAMES, can_read_values, dtype_name, first_bad_row, namespace

__all__ = ["quantize", "dequantize", "gguf_matmul"]

BLOCKS = {"Q8_0": (32, 34), "Q4_0": (32, 18), "Q4_K": (256, 144), "Q6_K": (256, 210)}
"""{format: (block_size weights, type_size bytes)}, as in GGUF's `GGML_QUANT_SIZES`."""
FORMATS = tuple(BLOCKS)

F32 = np.float32


# --- validation -----------------------------------------------------------------------------


def _fmt(fmt: Any) -> str:
    if not isinstance(fmt, str):
        raise TypeError(f"fmt must be a str, got {type(fmt).__name__}")
    if fmt not in BLOCKS:
        raise ValueError(f"fmt must be one of {FORMATS}, got {fmt!r}")
    return fmt


def _raw(raw: Any, fmt: str) -> tuple[Any, int]:
    """raw's namespace and the blocks per row: uint8, 2-D, a whole number >= 1 of blocks."""
    xp = namespace(raw, "raw")
    if dtype_name(raw) != "uint8":
        raise TypeError(f"raw must be uint8, got dtype {dtype_name(raw)}")
    type_size = BLOCKS[fmt][1]
    if raw.ndim != 2 or raw.shape[1] == 0 or raw.shape[1] % type_size:
        raise ValueError(
            f"raw must have shape (rows, blocks * {type_size}) for {fmt} "
            f"({type_size} bytes a block, blocks >= 1), got {tuple(raw.shape)}"
        )
    return xp, raw.shape[1] // type_size


# --- bytes <-> numbers ----------------------------------------------------------------------


def _half(xp: Any, lo: Any, hi: Any) -> Any:
    """float32 values of fp16 fields given as int32 low and high bytes, decoded exactly."""
    h = xp.bitwise_or(lo, xp.bitwise_left_shift(hi, 8))
    exponent = xp.bitwise_and(xp.bitwise_right_shift(h, 10), 31)
    mantissa = xp.bitwise_and(h, 1023)
    normal = exponent > 0
    significand = xp.where(normal, mantissa + 1024, mantissa)
    power = xp.bitwise_left_shift(xp.ones_like(h), xp.where(normal, exponent, 1) - 1)
    value = xp.astype(significand, xp.float32) * (xp.astype(power, xp.float32) * 2.0**-24)
    special = xp.where(mantissa == 0, xp.asarray(float("inf")), xp.asarray(float("nan")))
    value = xp.where(exponent == 31, xp.astype(special, xp.float32), value)
    return xp.where(xp.bitwise_right_shift(h, 15) == 1, -value, value)


def _half_bytes(xp: Any, value: Any) -> Any:
    """(..., 2) uint8: the fp16 bytes of float32 `value` rounded to nearest, ties to even."""
    half = xp.reshape(xp.astype(value, xp.float16), (*value.shape, 1))
    return xp.reshape(half.view(xp.uint8), (*value.shape, 2))  # little-endian


def _nibbles(xp: Any, b: Any) -> tuple[Any, Any]:
    return xp.bitwise_and(b, 15), xp.bitwise_right_shift(b, 4)


def _k4_scales(xp: Any, b: Any) -> tuple[Any, Any]:
    """Q4_K's (sc, m), each (..., 8), from its 12 scale bytes b (..., 12)."""
    lo, hi, both = b[..., 0:4], b[..., 4:8], b[..., 8:12]
    top = xp.bitwise_left_shift(xp.bitwise_right_shift(lo, 6), 4)
    sc = xp.concat([xp.bitwise_and(lo, 63), xp.bitwise_or(xp.bitwise_and(both, 15), top)], axis=-1)
    top = xp.bitwise_left_shift(xp.bitwise_right_shift(hi, 6), 4)
    m = xp.concat(
        [xp.bitwise_and(hi, 63), xp.bitwise_or(xp.bitwise_right_shift(both, 4), top)], axis=-1
    )
    return sc, m


def _decode(xp: Any, b: Any, fmt: str) -> Any:
    """(n, block_size) float32 weights of n blocks of int32 bytes b (n, type_size)."""
    n, f32 = b.shape[0], xp.float32
    if fmt == "Q8_0":
        q = b[:, 2:] - xp.where(b[:, 2:] >= 128, 256, 0)
        return _half(xp, b[:, 0:1], b[:, 1:2]) * xp.astype(q, f32)
    if fmt == "Q4_0":
        q = xp.concat(_nibbles(xp, b[:, 2:]), axis=1) - 8
        return _half(xp, b[:, 0:1], b[:, 1:2]) * xp.astype(q, f32)
    if fmt == "Q4_K":
        sc, m = _k4_scales(xp, b[:, 4:16])
        scale = _half(xp, b[:, 0:1], b[:, 1:2]) * xp.astype(sc, f32)
        shift = _half(xp, b[:, 2:3], b[:, 3:4]) * xp.astype(m, f32)
        low, high = _nibbles(xp, xp.reshape(b[:, 16:], (n, 4, 1, 32)))
        q = xp.astype(xp.reshape(xp.concat([low, high], axis=2), (n, 8, 32)), f32)
        return xp.reshape(scale[:, :, None] * q - shift[:, :, None], (n, 256))
    low, high = _nibbles(xp, xp.reshape(b[:, :128], (n, 2, 2, 32)))  # Q6_K: [h, t % 2, l]
    low = xp.concat([low, high], axis=2)  # [h, t, l] for t = 0..3
    qh = xp.reshape(b[:, 128:192], (n, 2, 1, 32))
    shifts = xp.reshape(xp.asarray([0, 2, 4, 6], dtype=xp.int32, device=device(b)), (1, 1, 4, 1))
    high = xp.bitwise_and(xp.bitwise_right_shift(qh, shifts), 3)
    q = xp.bitwise_or(low, xp.bitwise_left_shift(high, 4)) - 32
    sc = b[:, 192:208] - xp.where(b[:, 192:208] >= 128, 256, 0)
    scale = _half(xp, b[:, 208:209], b[:, 209:210]) * xp.astype(sc, f32)
    q = xp.astype(xp.reshape(q, (n, 16, 16)), f32)
    return xp.reshape(scale[:, :, None] * q, (n, 256))


# --- llama.cpp's reference quantizers, vectorised over blocks, float32 step by step ---------


def _round_half_away(xp: Any, v: Any) -> Any:
    """C's roundf: to nearest, ties away from zero (exact: v - trunc(v) is exact)."""
    t = xp.trunc(v)
    return t + xp.where(xp.abs(v - t) >= 0.5, xp.sign(v), xp.zeros_like(v))


def _first_absmax(xp: Any, x: Any) -> Any:
    """Per row, the entry of largest magnitude, the first of ties (llama.cpp's strict >)."""
    index = xp.argmax(xp.abs(x), axis=1)
    columns = xp.arange(x.shape[1], device=device(x))
    return xp.sum(xp.where(columns[None, :] == index[:, None], x, xp.zeros_like(x)), axis=1)


def _div(xp: Any, a: Any, b: Any) -> Any:
    """a / b correctly rounded, a or b a Python float: torch computes `2.0 / t` as
    `t.reciprocal() * 2.0` (two roundings), so the scalar becomes an array first."""
    if isinstance(a, float):
        a = xp.full_like(b, a)
    if isinstance(b, float):
        b = xp.full_like(a, b)
    return a / b


def _safe(xp: Any, ok: Any, v: Any) -> Any:
    return xp.where(ok, v, xp.ones_like(v))


def _qkx2(xp: Any, x: Any, w: Any) -> tuple[Any, Any, Any]:
    """llama.cpp's make_qkx2_quants(32, 15, x, w, rmin=-1, rdelta=0.1, nstep=20) per row of x:
    (scale, the_min, codes in [0, 15]) minimising sum w (scale * q - the_min - x)^2 over a
    grid of 21 candidate inverse scales, each refined by weighted least squares."""
    n = x.shape[1]
    lo, hi, sum_w, sum_x = x[:, 0], x[:, 0], w[:, 0], w[:, 0] * x[:, 0]
    for i in range(1, n):
        lo, hi = xp.minimum(lo, x[:, i]), xp.maximum(hi, x[:, i])
        sum_w, sum_x = sum_w + w[:, i], sum_x + w[:, i] * x[:, i]
    lo = xp.where(lo > 0, xp.zeros_like(lo), lo)
    ok = hi != lo
    span = _safe(xp, ok, hi - lo)
    iscale = _div(xp, float(F32(15)), span)
    scale = _div(xp, 1.0, iscale)
    codes = xp.clip(xp.round(iscale[:, None] * (x - lo[:, None])), 0, 15)
    best = xp.zeros_like(lo)
    for i in range(n):
        diff = scale * codes[:, i] + lo - x[:, i]
        best = best + w[:, i] * (diff * diff)
    for step in range(21):
        numerator = F32(F32(-1) + F32(0.1) * F32(step)) + F32(15)
        trial = xp.clip(
            xp.round(_div(xp, float(numerator), span)[:, None] * (x - lo[:, None])), 0, 15
        )
        sum_l = sum_l2 = sum_xl = xp.zeros_like(lo)
        for i in range(n):
            wl = w[:, i] * trial[:, i]
            sum_l, sum_l2, sum_xl = sum_l + wl, sum_l2 + wl * trial[:, i], sum_xl + wl * x[:, i]
        det = sum_w * sum_l2 - sum_l * sum_l
        solved = det > 0
        det = _safe(xp, solved, det)
        this_scale = (sum_w * sum_xl - sum_x * sum_l) / det
        this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det
        positive = this_min > 0
        this_scale = xp.where(positive, sum_xl / _safe(xp, sum_l2 > 0, sum_l2), this_scale)
        this_min = xp.where(positive, xp.zeros_like(this_min), this_min)
        error = xp.zeros_like(lo)
        for i in range(n):
            diff = this_scale * trial[:, i] + this_min - x[:, i]
            error = error + w[:, i] * (diff * diff)
        better = solved & (error < best) & ok
        codes = xp.where(better[:, None], trial, codes)
        best = xp.where(better, error, best)
        scale, lo = xp.where(better, this_scale, scale), xp.where(better, this_min, lo)
    zero = xp.zeros_like(lo)
    return xp.where(ok, scale, zero), -lo, xp.where(ok[:, None], codes, xp.zeros_like(codes))


def _qx(xp: Any, x: Any) -> tuple[Any, Any]:
    """llama.cpp's make_qx_quants(16, 32, x, rmse_type=1) per row of x: (scale, codes q + 32
    in [0, 63]) maximising (sum w x q)^2 / sum w q^2, w = x^2, over 19 inverse scales."""
    n = x.shape[1]
    top = _first_absmax(xp, x)
    ok = xp.abs(top) >= float(F32(1e-15))
    top = _safe(xp, ok, top)

    def sums(q: Any) -> tuple[Any, Any]:
        sum_lx = sum_l2 = xp.zeros_like(top)
        for i in range(n):
            wi = x[:, i] * x[:, i]
            sum_lx, sum_l2 = sum_lx + wi * x[:, i] * q[:, i], sum_l2 + wi * q[:, i] * q[:, i]
        return sum_lx, sum_l2

    codes = xp.clip(xp.round(_div(xp, -32.0, top)[:, None] * x), -32, 31)
    sum_lx, sum_l2 = sums(codes)
    scale = xp.where(sum_l2 > 0, sum_lx / _safe(xp, sum_l2 > 0, sum_l2), xp.zeros_like(top))
    best = scale * sum_lx
    for step in (*range(-9, 0), *range(1, 10)):
        numerator = -(F32(32) + F32(0.1) * F32(step))
        trial = xp.clip(xp.round(_div(xp, float(numerator), top)[:, None] * x), -32, 31)
        sum_lx, sum_l2 = sums(trial)
        better = (sum_l2 > 0) & (sum_lx * sum_lx > best * sum_l2)
        codes = xp.where(better[:, None], trial, codes)
        scale = xp.where(better, sum_lx / _safe(xp, sum_l2 > 0, sum_l2), scale)
        best = xp.where(better, scale * sum_lx, best)
    zero = xp.zeros_like(top)
    return xp.where(ok, scale, zero), xp.where(ok[:, None], codes + 32, xp.zeros_like(codes))


def _u8(xp: Any, v: Any) -> Any:
    return xp.astype(v, xp.uint8)


def _encode(xp: Any, x: Any, fmt: str) -> Any:
    """(n, type_size) uint8 blocks of float32 weights x (n, block_size)."""
    if fmt == "Q8_0":
        d = _div(xp, xp.max(xp.abs(x), axis=1), 127.0)
        inverse = xp.where(d == 0, xp.zeros_like(d), _div(xp, 1.0, _safe(xp, d != 0, d)))
        q = xp.astype(_round_half_away(xp, x * inverse[:, None]), xp.int16)
        q = _u8(xp, xp.where(q < 0, q + 256, q))
        return xp.concat([_half_bytes(xp, d), q], axis=1)
    if fmt == "Q4_0":
        d = _div(xp, _first_absmax(xp, x), -8.0)
        inverse = xp.where(d == 0, xp.zeros_like(d), _div(xp, 1.0, _safe(xp, d != 0, d)))
        q = xp.clip(xp.floor(x * inverse[:, None] + 8.5), 0, 15)
        packed = xp.bitwise_or(_u8(xp, q[:, :16]), xp.bitwise_left_shift(_u8(xp, q[:, 16:]), 4))
        return xp.concat([_half_bytes(xp, d), packed], axis=1)
    if fmt == "Q4_K":
        return _encode_q4_k(xp, x)
    return _encode_q6_k(xp, x)


def _encode_q4_k(xp: Any, x: Any) -> Any:
    n = x.shape[0]
    sub = xp.reshape(x, (n * 8, 32))
    sum_x2 = xp.zeros_like(sub[:, 0])
    for i in range(32):
        sum_x2 = sum_x2 + sub[:, i] * sub[:, i]
    weights = xp.sqrt(_div(xp, sum_x2, 32.0))[:, None] + xp.abs(sub)
    scales, mins, codes = _qkx2(xp, sub, weights)
    scales, mins = xp.reshape(scales, (n, 8)), xp.reshape(mins, (n, 8))
    zero = xp.zeros((n,), dtype=xp.float32, device=device(x))
    max_scale, max_min = xp.max(scales, axis=1), xp.max(mins, axis=1)
    max_scale = xp.where(max_scale > 0, max_scale, zero)  # +0, never -0, as C's loop
    max_min = xp.where(max_min > 0, max_min, zero)
    inv_scale = xp.where(max_scale > 0, _div(xp, 63.0, _safe(xp, max_scale > 0, max_scale)), zero)
    inv_min = xp.where(max_min > 0, _div(xp, 63.0, _safe(xp, max_min > 0, max_min)), zero)
    sc = xp.astype(xp.clip(xp.round(inv_scale[:, None] * scales), 0, 63), xp.int32)
    m = xp.astype(xp.clip(xp.round(inv_min[:, None] * mins), 0, 63), xp.int32)
    d_bytes, dmin_bytes = (
        _half_bytes(xp, _div(xp, max_scale, 63.0)),
        _half_bytes(xp, _div(xp, max_min, 63.0)),
    )
    b = xp.astype(xp.concat([d_bytes, dmin_bytes], axis=1), xp.int32)
    d = _half(xp, b[:, 0:1], b[:, 1:2]) * xp.astype(sc, xp.float32)
    shift = _half(xp, b[:, 2:3], b[:, 3:4]) * xp.astype(m, xp.float32)
    sub = xp.reshape(sub, (n, 8, 32))
    again = xp.clip(xp.round((sub + shift[:, :, None]) / _safe(xp, d != 0, d)[:, :, None]), 0, 15)
    codes = xp.where((d != 0)[:, :, None], again, xp.reshape(codes, (n, 8, 32)))
    codes = xp.reshape(_u8(xp, codes), (n, 4, 2, 32))
    qs = xp.reshape(
        xp.bitwise_or(codes[:, :, 0], xp.bitwise_left_shift(codes[:, :, 1], 4)), (n, 128)
    )

    def six(v: Any, s: int) -> Any:
        return xp.bitwise_left_shift(xp.bitwise_right_shift(v[:, s + 4 : s + 5], 4), 6)

    sc_bytes = [xp.bitwise_or(sc[:, s : s + 1], six(sc, s)) for s in range(4)]
    m_bytes = [xp.bitwise_or(m[:, s : s + 1], six(m, s)) for s in range(4)]
    low = [
        xp.bitwise_or(
            xp.bitwise_and(sc[:, s : s + 1], 15),
            xp.bitwise_left_shift(xp.bitwise_and(m[:, s : s + 1], 15), 4),
        )
        for s in range(4, 8)
    ]
    scale_bytes = _u8(xp, xp.concat([*sc_bytes, *m_bytes, *low], axis=1))
    return xp.concat([d_bytes, dmin_bytes, scale_bytes, qs], axis=1)


def _encode_q6_k(xp: Any, x: Any) -> Any:
    n = x.shape[0]
    scales, codes = _qx(xp, xp.reshape(x, (n * 16, 16)))
    scales = xp.reshape(scales, (n, 16))
    top = _first_absmax(xp, scales)
    ok = xp.abs(top) >= float(F32(1e-15))
    iscale = _div(xp, -128.0, _safe(xp, ok, top))
    d_bytes = _half_bytes(xp, _div(xp, 1.0, iscale))
    sc = xp.astype(xp.minimum(xp.round(iscale[:, None] * scales), xp.asarray(127.0)), xp.int32)
    b = xp.astype(d_bytes, xp.int32)
    d = _half(xp, b[:, 0:1], b[:, 1:2]) * xp.astype(sc, xp.float32)
    sub = xp.reshape(x, (n, 16, 16))
    again = xp.clip(xp.round(sub / _safe(xp, d != 0, d)[:, :, None]), -32, 31) + 32
    codes = xp.where((d != 0)[:, :, None], again, xp.reshape(codes, (n, 16, 16)))
    q = xp.reshape(_u8(xp, codes), (n, 2, 4, 32))  # [h, t, l]
    low, high = xp.bitwise_and(q, 15), xp.bitwise_right_shift(q, 4)
    ql = xp.bitwise_or(low[:, :, 0:2], xp.bitwise_left_shift(low[:, :, 2:4], 4))
    qh = high[:, :, 0]
    for t in range(1, 4):
        qh = xp.bitwise_or(qh, xp.bitwise_left_shift(high[:, :, t], 2 * t))
    sc_bytes = _u8(xp, xp.where(sc < 0, sc + 256, sc))
    block = xp.concat(
        [xp.reshape(ql, (n, 128)), xp.reshape(qh, (n, 64)), sc_bytes, d_bytes], axis=1
    )
    return xp.where(ok[:, None], block, xp.zeros_like(block))


# --- the ops --------------------------------------------------------------------------------


def quantize(weight: Any, fmt: str) -> Any:
    """A weight in a GGUF block format: llama.cpp's reference quantizer, row by row.

    The weight is converted to float32 once (llama.cpp quantizes float32 rows); each block
    of `block_size` consecutive weights of a row becomes `type_size` bytes laid out as in
    the module docstring, every step a float32 operation in llama.cpp's order, fp16 fields
    rounded to nearest (ties to even), round() ties to even unless said:

    - Q8_0: d = max|w| / 127, q = w * (1 / d) rounded half away from zero (C's roundf);
      d = 0 gives q = 0.
    - Q4_0: d = m / -8 for m the entry of largest magnitude (the first of ties), q =
      min(15, floor(w * (1 / d) + 8.5)); d = 0 gives q = 8.
    - Q4_K: per sub-block of 32, a scale and a min from make_qkx2_quants (weights
      sqrt(mean w^2) + |w|, 21 candidate scales (15 + (-1 + 0.1 i)) / (max - min) with
      min = min(0, min w), each refined by weighted least squares, the least weighted
      squared error kept); d = max scale / 63, dmin = max min / 63 (0 when not positive),
      six-bit sc = round(63 / max scale * scale) and m likewise (clipped to [0, 63]); then
      q = clip(round((w + dmin16 * m) / (d16 * sc)), 0, 15) with the stored fp16 d16, dmin16.
    - Q6_K: per sub-block of 16, a scale from make_qx_quants (rmse_type 1: 19 candidate
      inverse scales -(32 + 0.1 i) / a, i = -9..9, a the entry of largest magnitude, the one
      maximising (sum w x q)^2 / sum w q^2 with w = x^2 kept); a block whose largest |scale|
      is below 1e-15 is all zero bytes; else d = fp16(1 / (-128 / s)) for s that scale
      (signed), sc = min(127, round(-128 / s * scale)), q = clip(round(w / (d16 * sc)), -32,
      31) + 32.

    Args:
        weight: float array (float16, bfloat16, float32 or float64), shape (out_features,
            in_features), in_features a multiple >= 1 of the format's block_size, every
            entry finite; out_features may be 0.
        fmt: "Q8_0", "Q4_0", "Q4_K" or "Q6_K".
    Returns:
        A new uint8 array of shape (out_features, in_features / block_size * type_size) in
        the weight's library and device.
    Raises:
        TypeError: a non-float weight, a non-str fmt.
        ValueError: an unknown fmt (the message names it), a weight that is not 2-D, whose
            in_features is not a positive multiple of block_size, or that holds NaN or inf
            (the message names the row).
    """
    xp = namespace(weight, "weight")
    fmt = _fmt(fmt)
    if dtype_name(weight) not in ANY_FLOAT_DTYPE_NAMES:
        raise TypeError(f"weight must be a float array, got dtype {dtype_name(weight)}")
    block_size, type_size = BLOCKS[fmt]
    if weight.ndim != 2 or weight.shape[1] == 0 or weight.shape[1] % block_size:
        raise ValueError(
            f"weight must have shape (out_features, in_features) with in_features a positive "
            f"multiple of {fmt}'s block size {block_size}, got {tuple(weight.shape)}"
        )
    if can_read_values(weight) and weight.size:
        row = first_bad_row(xp, ~xp.all(xp.isfinite(weight), axis=1))
        if row is not None:
            raise ValueError(f"weight row {row} contains NaN or inf")
    rows, columns = weight.shape
    blocks = xp.reshape(xp.astype(weight, xp.float32), (rows * columns // block_size, block_size))
    return xp.reshape(_encode(xp, blocks, fmt), (rows, columns // block_size * type_size))


def dequantize(raw: Any, fmt: str) -> Any:
    """The float32 weight of a GGUF tensor's blocks: the module docstring's formulas.

    Each product is one float32 operation on exact operands (fp16 fields decoded exactly,
    six- and eight-bit integers exact), in the order written: Q8_0 d * q, Q4_0 d * (q - 8),
    Q4_K (d * sc) * q - dmin * m, Q6_K (d * sc) * (q - 32); so every conforming
    implementation gives the same bits. A non-finite fp16 field gives non-finite weights.

    Args:
        raw: uint8, shape (out_features, blocks * type_size), blocks >= 1; out_features
            may be 0.
        fmt: "Q8_0", "Q4_0", "Q4_K" or "Q6_K".
    Returns:
        A new float32 array of shape (out_features, blocks * block_size) in raw's library
        and device.
    Raises:
        TypeError: raw not uint8, a non-str fmt.
        ValueError: an unknown fmt (named), raw not 2-D or not a whole number >= 1 of the
            format's blocks per row.
    """
    fmt = _fmt(fmt)
    xp, blocks = _raw(raw, fmt)
    block_size, type_size = BLOCKS[fmt]
    rows = raw.shape[0]
    b = xp.reshape(xp.astype(raw, xp.int32), (rows * blocks, type_size))
    return xp.reshape(_decode(xp, b, fmt), (rows, blocks * block_size))


def gguf_matmul(x: Any, raw: Any, fmt: str) -> Any:
    """A linear layer on a GGUF tensor: y = x @ W^T with W = dequantize(raw, fmt).

    W is computed in float32 and converted to C = float32 (float64 for a float64 x), then
    y[t, o] = sum_i x[t, i] * W[o, i] summed in C in any order and rounded once to x's
    dtype. Bias is not included.

    Args:
        x: float array (float16, bfloat16, float32 or float64), shape (tokens,
            in_features); tokens may be 0.
        raw: uint8, shape (out_features, in_features / block_size * type_size).
        fmt: "Q8_0", "Q4_0", "Q4_K" or "Q6_K".
    Returns:
        A new array of x's dtype, shape (tokens, out_features), in x's library and device.
    Raises:
        TypeError: a non-float x, raw not uint8, a non-str fmt.
        ValueError: an unknown fmt (named), x not 2-D, raw not 2-D or whose blocks do not
            hold x's in_features weights per row (the message names both).
    """
    xp = namespace(x, "x")
    fmt = _fmt(fmt)
    if dtype_name(x) not in ANY_FLOAT_DTYPE_NAMES:
        raise TypeError(f"x must be a float array, got dtype {dtype_name(x)}")
    if x.ndim != 2:
        raise ValueError(f"x must have 2 axes, got shape {tuple(x.shape)}")
    _, blocks = _raw(raw, fmt)
    if blocks * BLOCKS[fmt][0] != x.shape[1]:
        raise ValueError(
            f"raw's {blocks} {fmt} blocks a row hold {blocks * BLOCKS[fmt][0]} weights, "
            f"x has in_features {x.shape[1]}"
        )
    compute = xp.float64 if dtype_name(x) == "float64" else xp.float32
    weight = xp.astype(dequantize(raw, fmt), compute)
    return xp.astype(xp.astype(x, compute) @ xp.matrix_transpose(weight), x.dtype)
