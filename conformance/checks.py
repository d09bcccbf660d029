"""Assertion helpers with the suite's stated tolerances.

Discrete outputs are compared exactly: masks (which entries are -inf), token ids, ranks,
hashes, bytes and Philox uniforms. Floating-point values that the specification lets an
implementation compute in another order are compared with

    |actual - expected| <= RTOL[dtype] * (|expected| + scale) + tiny

where RTOL is 1e-6 for float32 and 1e-12 for float64 and `scale` is the magnitude of the
operands that entered the computation (e.g. |x| + sum |bias| for a logit bias), so that
cancellation does not demand more than the operands' precision.

Threshold decisions specified in float64 (top-p's cumulative mass, min-p's ratio) may
differ between implementations only where the boundary quantity is within BAND (1e-9)
relative of the threshold, as the docstrings allow; the checkers compute that quantity.
"""

from __future__ import annotations

from typing import Any

import numpy as np

RTOL = {"float32": 1e-6, "float64": 1e-12}
BAND = 1e-9
NEG_INF = float("-inf")


def rtol(dtype: Any) -> float:
    return RTOL[np.dtype(dtype).name]


def at(mask: np.ndarray) -> str:
    """'[row, col]' of the first True entry of a boolean array."""
    idx = tuple(int(i) for i in np.argwhere(mask)[0])
    return "[" + ", ".join(map(str, idx)) + "]"


def masked(x: np.ndarray) -> np.ndarray:
    return np.isneginf(x)


def assert_shape_dtype(x: Any, shape: tuple[int, ...], dtype: Any, what: str = "result") -> None:
    assert isinstance(x, np.ndarray), f"{what} is {type(x).__name__}, not an array"
    assert x.shape == tuple(shape), f"{what} has shape {x.shape}, expected {tuple(shape)}"
    assert x.dtype == np.dtype(dtype), f"{what} has dtype {x.dtype}, expected {np.dtype(dtype)}"


def assert_masks_equal(
    actual: np.ndarray, expected: np.ndarray, allowed: np.ndarray | None = None, what: str = "mask"
) -> None:
    """Same -inf positions, except where `allowed` (boundary tokens) is True."""
    diff = masked(actual) != masked(expected)
    if allowed is not None:
        diff &= ~allowed
    if diff.any():
        i = tuple(np.argwhere(diff)[0])
        got = "masked" if masked(actual)[i] else f"kept ({actual[i]!r})"
        want = "masked" if masked(expected)[i] else f"kept ({expected[i]!r})"
        raise AssertionError(f"{what} differs at {list(map(int, i))}: got {got}, expected {want}")


def assert_close(
    actual: np.ndarray, expected: np.ndarray, dtype: Any, scale: Any = 0.0, what: str = "value"
) -> None:
    """Finite entries agree within RTOL[dtype] * (|expected| + scale); -inf entries match."""
    assert_masks_equal(actual, expected, what=f"{what} -inf position")
    both = ~masked(actual) & ~masked(expected)
    a = actual.astype(np.float64)
    e = expected.astype(np.float64)
    scale = np.broadcast_to(np.asarray(scale, dtype=np.float64), e.shape)
    tol = rtol(dtype) * (np.abs(e) + scale) + np.finfo(np.dtype(dtype)).tiny
    with np.errstate(invalid="ignore"):
        bad = both & ~(np.abs(a - e) <= tol)
    if bad.any():
        i = tuple(np.argwhere(bad)[0])
        raise AssertionError(
            f"{what} at {list(map(int, i))}: got {actual[i]!r}, expected {expected[i]!r} "
            f"(tolerance {tol[i]:.3g})"
        )


def assert_equal(actual: Any, expected: Any, what: str = "result") -> None:
    """Exact equality of arrays (shape, values; -inf == -inf) or plain values."""
    if isinstance(expected, np.ndarray):
        assert isinstance(actual, np.ndarray), f"{what} is {type(actual).__name__}, not an array"
        assert actual.shape == expected.shape, (
            f"{what} has shape {actual.shape}, expected {expected.shape}"
        )
        same = (
            (actual == expected) | (np.isnan(actual) & np.isnan(expected))
            if actual.dtype.kind == "f"
            else (actual == expected)
        )
        if not np.all(same):
            i = tuple(np.argwhere(~same)[0])
            raise AssertionError(
                f"{what} at {list(map(int, i))}: got {actual[i]!r}, expected {expected[i]!r}"
            )
    else:
        assert actual == expected, f"{what}: got {actual!r}, expected {expected!r}"


def exactly_the_reference(case: Any, got: Any, ref: Any) -> None:
    """A `matches_reference` comparison: the reference's dtype and values, exactly."""
    assert got.dtype == ref.dtype, f"dtype {got.dtype}, the reference's {ref.dtype}"
    assert_equal(got, ref)


def assert_only_masks(out: np.ndarray, logits: np.ndarray) -> None:
    """A filter's output: every entry is either the input logit, unchanged, or -inf."""
    assert out.shape == logits.shape, f"shape {out.shape}, expected {logits.shape}"
    changed = ~masked(out) & (out != logits)
    if changed.any():
        i = tuple(np.argwhere(changed)[0])
        raise AssertionError(
            f"kept value changed at {list(map(int, i))}: {logits[i]!r} became {out[i]!r}"
        )


def same_library(result: Any, like: Any) -> str | None:
    """None if `result` is an array of the library (and device) of `like`, else why not."""
    from .core import library_of

    want, got = library_of(like), library_of(result)
    if want != got:
        return f"returned a {got}, expected a {want} array like the input"
    if got == "torch" and result.device != like.device:
        return f"returned a tensor on {result.device}, input on {like.device}"
    return None


def dtype_name(x: Any) -> str:
    return str(x.dtype).removeprefix("torch.")
