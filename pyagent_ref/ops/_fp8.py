"""The 8-bit float formats of an FP8 KV cache, as uint8 bit patterns.

A code is one byte: a sign bit, E exponent bits and M mantissa bits, with exponent
bias b. Exponent field e > 0 holds (-1)^s * (1 + f / 2^M) * 2^(e - b); e == 0 holds the
subnormals (-1)^s * (f / 2^M) * 2^(1 - b). The two formats (OCP FP8, torch's
float8_e4m3fn and float8_e5m2):

| format | E, M, b | largest finite | special codes |
|---|---|---|---|
| e4m3 (`fp8`, `fp8_e4m3`) | 4, 3, 7 | 448 | 0x7F, 0xFF NaN; no infinity |
| e5m2 (`fp8_e5m2`) | 5, 2, 15 | 57344 | e == 31: infinity (f == 0), else NaN |

`encode` is the saturating cast the cache writes: float32 -> nearest code, ties to the
even code (the one whose mantissa's last bit is 0), values beyond the largest finite
clamped to it (infinities included), NaN to the NaN code 0x7F with the input's sign
bit (0xFF). It equals torch's `clamp(x, -max, max).to(float8_*)` bit for bit.
`decode` is exact: every code is a float32.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np
from array_api_compat import array_namespace, device

from ._arrays import dtype_name


@dataclass(frozen=True)
class Fp8Format:
    name: str
    exponent_bits: int
    mantissa_bits: int
    has_inf: bool  # e5m2 keeps IEEE infinities; e4m3fn spends them on finite values

    @property
    def bias(self) -> int:
        return 2 ** (self.exponent_bits - 1) - 1

    @property
    def max_code(self) -> int:
        """The code of the largest finite value (codes 0..max_code ascend from +0)."""
        return 0x7B if self.has_inf else 0x7E

    @property
    def max(self) -> float:
        return float(values(self)[self.max_code])


E4M3 = Fp8Format("e4m3", 4, 3, has_inf=False)
E5M2 = Fp8Format("e5m2", 5, 2, has_inf=True)
# kv_cache_dtype -> format ("fp8" is e4m3, as in vLLM); "auto" keeps the model's dtype
KV_CACHE_FORMATS = {"fp8": E4M3, "fp8_e4m3": E4M3, "fp8_e5m2": E5M2}
KV_CACHE_DTYPES = ("auto", *KV_CACHE_FORMATS)


@cache
def values(fmt: Fp8Format) -> np.ndarray:
    """The float32 value of each of the 256 codes (NaN for the NaN codes)."""
    m, top = fmt.mantissa_bits, 2**fmt.exponent_bits - 1
    out = np.empty(256, dtype=np.float64)
    for code in range(256):
        sign = -1.0 if code & 0x80 else 1.0
        e, f = (code >> m) & top, code & (2**m - 1)
        if e == 0:
            v = f / 2**m * 2.0 ** (1 - fmt.bias)
        else:
            v = (1 + f / 2**m) * 2.0 ** (e - fmt.bias)
        if fmt.has_inf and e == top:
            v = np.inf if f == 0 else np.nan
        elif not fmt.has_inf and e == top and f == 2**m - 1:
            v = np.nan
        out[code] = sign * v
    return out.astype(np.float32)


@cache
def _table(xp: Any, fmt: Fp8Format, dev: Any) -> Any:
    # one copy per (library, format, device), made once: a CUDA graph may read it
    return xp.asarray(values(fmt), device=dev)


@cache
def _scalar(xp: Any, value: float, dev: Any) -> Any:
    # float32(value) on the device: a true division by it (torch divides by a host
    # scalar on CUDA as a product with its reciprocal); made once, so a graph may read it
    return xp.asarray(value, dtype=xp.float32, device=dev)


def encode(xp: Any, x: Any, scale: float, fmt: Fp8Format, dev: Any) -> Any:
    """uint8 codes of float32(x) / float32(scale), rounded and saturated (module doc)."""
    table = _table(xp, fmt, dev)
    finite = table[: fmt.max_code + 1]  # +0 .. max, ascending
    y = xp.astype(x, xp.float32) / _scalar(xp, float(scale), dev)
    a = xp.clip(xp.abs(y), 0.0, fmt.max)  # NaN stays NaN
    hi = xp.clip(xp.searchsorted(finite, xp.reshape(a, (-1,))), 0, fmt.max_code)
    lo = xp.clip(hi - 1, 0, None)
    a = xp.reshape(a, (-1,))
    mid = (xp.take(finite, lo) + xp.take(finite, hi)) / 2  # exact: few mantissa bits
    up = (a > mid) | ((a == mid) & (hi % 2 == 0))
    code = xp.reshape(xp.where(up, hi, lo), y.shape)
    code = xp.where(xp.isnan(y), 0x7F, code) + 0x80 * xp.astype(xp.signbit(y), code.dtype)
    return xp.astype(code, xp.uint8)


def decode(codes: Any, fmt: Fp8Format) -> Any:
    """The float32 values of uint8 `codes` (exact)."""
    xp, dev = array_namespace(codes), device(codes)
    flat = xp.take(_table(xp, fmt, dev), xp.astype(xp.reshape(codes, (-1,)), xp.int64))
    return xp.reshape(flat, codes.shape)


def check(kv_cache_dtype: Any, k_scale: Any, v_scale: Any, caches: dict[str, Any]):
    """The format kv_cache_dtype names (None for "auto"), after checking it, the scales
    (positive finite floats) and, for an fp8 format, that the caches are uint8."""
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise ValueError(f"kv_cache_dtype must be one of {KV_CACHE_DTYPES}, got {kv_cache_dtype!r}")
    for name, s in (("k_scale", k_scale), ("v_scale", v_scale)):
        if isinstance(s, bool) or not isinstance(s, (int, float, np.floating, np.integer)):
            raise TypeError(f"{name} must be a float, got {s!r}")
        if not 0 < float(s) < float("inf"):
            raise ValueError(f"{name} must be a positive finite float, got {s!r}")
    fmt = KV_CACHE_FORMATS.get(kv_cache_dtype)
    for name, cache_ in caches.items():
        if fmt is not None and dtype_name(cache_) != "uint8":
            raise TypeError(
                f"{name} must be uint8 (the {kv_cache_dtype} bit patterns) with "
                f"kv_cache_dtype={kv_cache_dtype!r}, got dtype {dtype_name(cache_)}"
            )
    return fmt
