"""The normalisations (RMS norm, Gemma's RMS norm, layer norm) and activations (SwiGLU,
GELU, GeGLU) in Rust: drop-in replacements for `pyagent_ref.ops.layers`.

Same functions, signatures, results and exceptions (classes, messages, check order) as
the reference, whose docstrings are the contract. Inputs are numpy arrays or torch CPU
tensors of float16, bfloat16, float32 or float64 (torch is optional and never imported
here); results come back in the input's library and dtype, tensors as zero-copy views
of the Rust-filled buffers. Each op is one native call, rows in parallel with the GIL
released.

Exactness: the reference's operations in its order and dtypes (half types in float32,
rounded where the reference rounds), so results are its bits except for the last bit of
a few library functions, within the specification's tolerance: the norms sum in numpy's
pairwise order (torch's own sum differs from numpy's there), `silu_and_mul` uses an exp
accurate to 1 ulp (numpy's and torch's differ from each other as well), the GELUs a
tanh through that exp and an erf of their own: a few ulps in float64 (the reference
takes `math.erf` on numpy, `torch.erf` on torch), within 3e-12 of erf for a float32
computation, far below an ulp of the 1 + erf it feeds. Rounded to float16/bfloat16
these rarely show; the residual sums of the norms are exact.

Differences from the reference:

- Only numpy arrays and torch CPU tensors: a tensor on another device raises TypeError
  (it is never copied silently), as does another array library.
- Strided views are read in place as long as the last axis is contiguous; an array
  whose last axis is strided raises ValueError naming it (the reference copies).
- torch inputs that require grad are read through `detach()`; results carry no graph.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import _native
from . import _common as _c

__all__ = ["rms_norm", "silu_and_mul", "gemma_rms_norm", "layer_norm", "gelu", "gelu_and_mul"]

GELU_APPROXIMATIONS = ("none", "tanh")


def _float_input(x: Any, name: str) -> bool:
    """The reference's `_float_input`: returns whether x is a torch tensor."""
    torch_in = _c.array_library(x, name)
    kind = _c.dtype_name(x)
    if kind not in _c.FLOAT_KINDS:
        raise TypeError(f"{name} must be a float array, got dtype {kind}")
    if x.ndim < 1:
        raise ValueError(f"{name} must have at least one axis, got a scalar")
    return torch_in


def _norm_input(x: Any, weight: Any, eps: float, residual: Any) -> bool | None:
    """The reference's `_norm_input`, the checks the normalisations share: whether x is
    a torch tensor, or None when the residual is of another library or dtype (the caller
    then adds it as the reference does, with its type promotion, and goes unfused)."""
    torch_in = _float_input(x, "x")
    _float_input(weight, "weight")
    if weight.shape != (x.shape[-1],):  # tuples (torch.Size is one)
        raise ValueError(f"weight must have shape ({x.shape[-1]},), got {tuple(weight.shape)}")
    if not eps > 0:
        raise ValueError(f"eps must be > 0, got {eps}")
    if residual is not None:
        if residual.shape != x.shape:
            raise ValueError(
                f"residual must have shape {tuple(x.shape)}, got {tuple(residual.shape)}"
            )
        if type(residual) is not type(x) or residual.dtype != x.dtype:
            return None
    return torch_in


def _compute_param(p: Any, name: str, x: Any) -> np.ndarray:
    """A weight or bias as Rust reads it: in x's compute dtype (float64 for float64 x,
    else float32), as the reference's `xp.astype(p, compute)`."""
    p = _c.float_as(p, "float64" if _c.dtype_name(x) == "float64" else "float32")
    return _c.float_view(p, name, _c.is_torch(p))


def _norm_result(out: Any, x: Any, torch_in: bool, with_residual: bool) -> Any:
    if not with_residual:
        return _c.wrap_float(out, x, torch_in)
    return _c.wrap_float(out[0], x, torch_in), _c.wrap_float(out[1], x, torch_in)


def rms_norm(x: Any, weight: Any, eps: float, residual: Any = None) -> Any | tuple[Any, Any]:
    """Root-mean-square normalisation with a learned scale, optionally fused with the
    residual add (returns (normalised, x + residual) then).

    Contract: `pyagent_ref.ops.layers.rms_norm`.
    """
    torch_in = _norm_input(x, weight, eps, residual)
    if torch_in is None:
        h = x + residual
        return rms_norm(h, weight, eps), h
    res = None if residual is None else _c.float_view(residual, "residual", torch_in)
    w = _c.float_as(weight, _c.dtype_name(x))  # the reference's weight in x's dtype
    w = _c.float_view(w, "weight", _c.is_torch(w))
    out = _native.rms_norm(_c.float_view(x, "x", torch_in), w, float(eps), res)
    return _norm_result(out, x, torch_in, res is not None)


def silu_and_mul(x: Any) -> Any:
    """silu(gate) * up for x = [gate, up] on the last axis.

    Contract: `pyagent_ref.ops.layers.silu_and_mul`.
    """
    torch_in = _float_input(x, "x")
    if x.shape[-1] % 2:
        raise ValueError(f"x's last axis must be even (gate and up halves), got {x.shape[-1]}")
    return _c.wrap_float(_native.silu_and_mul(_c.float_view(x, "x", torch_in)), x, torch_in)


def gemma_rms_norm(x: Any, weight: Any, eps: float, residual: Any = None) -> Any | tuple[Any, Any]:
    """RMS normalisation scaled by (1 + weight), rounded once; optionally fused with the
    residual add (returns (normalised, x + residual) then).

    Contract: `pyagent_ref.ops.layers.gemma_rms_norm`.
    """
    torch_in = _norm_input(x, weight, eps, residual)
    if torch_in is None:
        h = x + residual
        return gemma_rms_norm(h, weight, eps), h
    res = None if residual is None else _c.float_view(residual, "residual", torch_in)
    w = _compute_param(weight, "weight", x)
    out = _native.gemma_rms_norm(_c.float_view(x, "x", torch_in), w, float(eps), res)
    return _norm_result(out, x, torch_in, res is not None)


def layer_norm(
    x: Any, weight: Any, bias: Any, eps: float, residual: Any = None
) -> Any | tuple[Any, Any]:
    """Layer normalisation with a learned scale and bias, rounded once; optionally fused
    with the residual add (returns (normalised, x + residual) then).

    Contract: `pyagent_ref.ops.layers.layer_norm`.
    """
    torch_in = _norm_input(x, weight, eps, residual)
    _float_input(bias, "bias")
    if bias.shape != (x.shape[-1],):
        raise ValueError(f"bias must have shape ({x.shape[-1]},), got {tuple(bias.shape)}")
    if torch_in is None:
        h = x + residual
        return layer_norm(h, weight, bias, eps), h
    res = None if residual is None else _c.float_view(residual, "residual", torch_in)
    w, b = _compute_param(weight, "weight", x), _compute_param(bias, "bias", x)
    out = _native.layer_norm(_c.float_view(x, "x", torch_in), w, b, float(eps), res)
    return _norm_result(out, x, torch_in, res is not None)


def _check_approximate(approximate: str) -> None:
    if approximate not in GELU_APPROXIMATIONS:
        raise ValueError(f"approximate must be one of {GELU_APPROXIMATIONS}, got {approximate!r}")


def gelu(x: Any, approximate: str = "none") -> Any:
    """GELU elementwise, the erf form ("none") or the tanh approximation ("tanh").

    Contract: `pyagent_ref.ops.layers.gelu`.
    """
    torch_in = _float_input(x, "x")
    _check_approximate(approximate)
    return _c.wrap_float(_native.gelu(_c.float_view(x, "x", torch_in), approximate), x, torch_in)


def gelu_and_mul(x: Any, approximate: str = "none") -> Any:
    """gelu(gate) * up for x = [gate, up] on the last axis.

    Contract: `pyagent_ref.ops.layers.gelu_and_mul`.
    """
    torch_in = _float_input(x, "x")
    if x.shape[-1] % 2:
        raise ValueError(f"x's last axis must be even (gate and up halves), got {x.shape[-1]}")
    _check_approximate(approximate)
    view = _c.float_view(x, "x", torch_in)
    return _c.wrap_float(_native.gelu_and_mul(view, approximate), x, torch_in)
