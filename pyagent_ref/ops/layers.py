"""Per-token layer ops of decoder models: normalisations and MLP activations.

RMSNorm (Llama and most families), Gemma's RMSNorm with a (1 + weight) scale, LayerNorm
with a bias (GPT-2, GPT-NeoX); the gated activations silu(gate) * up (SwiGLU) and
gelu(gate) * up (GeGLU, Gemma) and the plain GELU (GPT-2, GPT-NeoX). All work on the last
axis of numpy arrays or torch tensors of any float dtype (float16/bfloat16 are computed in
float32 and rounded back once, as HF transformers does).
"""

from __future__ import annotations

import math
from typing import Any

from ._arrays import ANY_FLOAT_DTYPE_NAMES, dtype_name, erf, namespace

__all__ = ["rms_norm", "silu_and_mul", "gemma_rms_norm", "layer_norm", "gelu", "gelu_and_mul"]

GELU_APPROXIMATIONS = ("none", "tanh")


def _float_input(x: Any, name: str) -> Any:
    xp = namespace(x, name)
    if dtype_name(x) not in ANY_FLOAT_DTYPE_NAMES:
        raise TypeError(f"{name} must be a float array, got dtype {dtype_name(x)}")
    if x.ndim < 1:
        raise ValueError(f"{name} must have at least one axis, got a scalar")
    return xp


def _norm_input(x: Any, weight: Any, eps: float, residual: Any) -> tuple[Any, Any]:
    """The checks the normalisations share; returns (namespace, x + residual or x)."""
    xp = _float_input(x, "x")
    _float_input(weight, "weight")
    if tuple(weight.shape) != (x.shape[-1],):
        raise ValueError(f"weight must have shape ({x.shape[-1]},), got {tuple(weight.shape)}")
    if not eps > 0:
        raise ValueError(f"eps must be > 0, got {eps}")
    if residual is not None:
        if tuple(residual.shape) != tuple(x.shape):
            raise ValueError(
                f"residual must have shape {tuple(x.shape)}, got {tuple(residual.shape)}"
            )
        x = x + residual
    return xp, x


def _compute_dtype(xp: Any, x: Any) -> Any:
    return xp.float64 if dtype_name(x) == "float64" else xp.float32


def rms_norm(x: Any, weight: Any, eps: float, residual: Any = None) -> Any | tuple[Any, Any]:
    """Root-mean-square normalisation (Zhang and Sennrich 2019) with a learned scale.

    y = weight * (x / sqrt(mean(x**2, last axis) + eps)), where the normalisation is
    computed in float32 (float64 for float64 input), rounded to x's dtype, and then
    multiplied by `weight` in x's dtype (HF Llama's order). With `residual`, the input
    is first h = x + residual and the op returns (rms_norm(h), h): the fused form a
    decoder layer uses to carry the residual stream.

    Args:
        x: float array, shape (..., hidden).
        weight: float array, shape (hidden,).
        eps: float > 0.
        residual: optional array like x.
    Returns:
        An array like x, or (normalised, new residual).
    Raises:
        TypeError: non-float x or weight.
        ValueError: weight of the wrong shape, eps <= 0, residual of another shape.
    """
    xp, x = _norm_input(x, weight, eps, residual)
    compute = xp.float64 if dtype_name(x) == "float64" else xp.float32
    h = xp.astype(x, compute, copy=False)
    normed = h / xp.sqrt(xp.mean(h * h, axis=-1, keepdims=True) + eps)
    out = xp.astype(weight, x.dtype, copy=False) * xp.astype(normed, x.dtype, copy=False)
    return out if residual is None else (out, x)


def silu_and_mul(x: Any) -> Any:
    """The SwiGLU activation of a fused gate/up projection: silu(gate) * up.

    x holds [gate, up] concatenated on the last axis; silu(g) = g * sigmoid(g) =
    g / (1 + exp(-g)). Computed in float32 (float64 for float64 input), returned in
    x's dtype.

    Args:
        x: float array, shape (..., 2 * d).
    Returns:
        An array of shape (..., d), x's dtype.
    Raises:
        TypeError: a non-float x. ValueError: an odd last axis.
    """
    xp = _float_input(x, "x")
    if x.shape[-1] % 2:
        raise ValueError(f"x's last axis must be even (gate and up halves), got {x.shape[-1]}")
    d = x.shape[-1] // 2
    compute = xp.float64 if dtype_name(x) == "float64" else xp.float32
    gate, up = (
        xp.astype(x[..., :d], compute, copy=False),
        xp.astype(x[..., d:], compute, copy=False),
    )
    return xp.astype(gate / (1.0 + xp.exp(-gate)) * up, x.dtype, copy=False)


def gemma_rms_norm(x: Any, weight: Any, eps: float, residual: Any = None) -> Any | tuple[Any, Any]:
    """RMS normalisation with a (1 + weight) scale, Gemma's form (its weights are stored
    as offsets from 1).

    y = (x / sqrt(mean(x**2, last axis) + eps)) * (1 + weight), every step in float32
    (float64 for float64 input) and the product rounded once to x's dtype (HF Gemma's
    order, unlike `rms_norm`, which rounds before the weight). With `residual`, the input
    is h = x + residual (in x's dtype) and the op returns (gemma_rms_norm(h), h).

    Args:
        x: float array, shape (..., hidden).
        weight: float array, shape (hidden,).
        eps: float > 0.
        residual: optional array like x.
    Returns:
        An array like x, or (normalised, new residual).
    Raises:
        TypeError: non-float x or weight.
        ValueError: weight of the wrong shape, eps <= 0, residual of another shape.
    """
    xp, h = _norm_input(x, weight, eps, residual)
    compute = _compute_dtype(xp, h)
    hc = xp.astype(h, compute, copy=False)
    normed = hc / xp.sqrt(xp.mean(hc * hc, axis=-1, keepdims=True) + eps)
    out = xp.astype(normed * (1.0 + xp.astype(weight, compute, copy=False)), h.dtype, copy=False)
    return out if residual is None else (out, h)


def layer_norm(
    x: Any, weight: Any, bias: Any, eps: float, residual: Any = None
) -> Any | tuple[Any, Any]:
    """Layer normalisation (Ba et al. 2016) with a learned scale and bias.

    y = (x - mean) / sqrt(var + eps) * weight + bias over the last axis, var the biased
    variance mean((x - mean)**2); every step in float32 (float64 for float64 input), the
    result rounded once to x's dtype. With `residual`, the input is h = x + residual (in
    x's dtype) and the op returns (layer_norm(h), h).

    Args:
        x: float array, shape (..., hidden).
        weight: float array, shape (hidden,).
        bias: float array, shape (hidden,).
        eps: float > 0.
        residual: optional array like x.
    Returns:
        An array like x, or (normalised, new residual).
    Raises:
        TypeError: non-float x, weight or bias.
        ValueError: weight or bias of the wrong shape, eps <= 0, residual of another shape.
    """
    xp, h = _norm_input(x, weight, eps, residual)
    _float_input(bias, "bias")
    if tuple(bias.shape) != (x.shape[-1],):
        raise ValueError(f"bias must have shape ({x.shape[-1]},), got {tuple(bias.shape)}")
    compute = _compute_dtype(xp, h)
    hc = xp.astype(h, compute, copy=False)
    centred = hc - xp.mean(hc, axis=-1, keepdims=True)
    normed = centred / xp.sqrt(xp.mean(centred * centred, axis=-1, keepdims=True) + eps)
    scaled = normed * xp.astype(weight, compute, copy=False) + xp.astype(bias, compute, copy=False)
    out = xp.astype(scaled, h.dtype, copy=False)
    return out if residual is None else (out, h)


def _gelu(xp: Any, x: Any, approximate: str) -> Any:
    """GELU of a float32/float64 array (see `gelu`)."""
    if approximate == "tanh":
        inner = math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)
        return 0.5 * x * (1.0 + xp.tanh(inner))
    return 0.5 * x * (1.0 + erf(xp, x / math.sqrt(2.0)))


def _check_approximate(approximate: str) -> None:
    if approximate not in GELU_APPROXIMATIONS:
        raise ValueError(f"approximate must be one of {GELU_APPROXIMATIONS}, got {approximate!r}")


def gelu(x: Any, approximate: str = "none") -> Any:
    """The Gaussian error linear unit (Hendrycks and Gimpel 2016), elementwise.

    approximate="none": gelu(x) = x * Phi(x) = 0.5 * x * (1 + erf(x / sqrt(2))) (GPT-NeoX's
    "gelu"). approximate="tanh": 0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x**3)))
    (GPT-2's "gelu_new", HF's "gelu_pytorch_tanh"). Computed in float32 (float64 for
    float64 input), returned in x's dtype.

    Args:
        x: float array, any shape with at least one axis.
        approximate: "none" or "tanh".
    Returns:
        A new array like x.
    Raises:
        TypeError: a non-float x. ValueError: another approximation.
    """
    xp = _float_input(x, "x")
    _check_approximate(approximate)
    compute = _compute_dtype(xp, x)
    return xp.astype(_gelu(xp, xp.astype(x, compute, copy=False), approximate), x.dtype)


def gelu_and_mul(x: Any, approximate: str = "none") -> Any:
    """The GeGLU activation of a fused gate/up projection: gelu(gate) * up (Gemma).

    x holds [gate, up] concatenated on the last axis; gelu as in `gelu` with the same
    `approximate`. Computed in float32 (float64 for float64 input), returned in x's dtype.

    Args:
        x: float array, shape (..., 2 * d).
        approximate: "none" or "tanh".
    Returns:
        An array of shape (..., d), x's dtype.
    Raises:
        TypeError: a non-float x. ValueError: an odd last axis, another approximation.
    """
    xp = _float_input(x, "x")
    if x.shape[-1] % 2:
        raise ValueError(f"x's last axis must be even (gate and up halves), got {x.shape[-1]}")
    _check_approximate(approximate)
    d = x.shape[-1] // 2
    compute = _compute_dtype(xp, x)
    gate = xp.astype(x[..., :d], compute, copy=False)
    up = xp.astype(x[..., d:], compute, copy=False)
    return xp.astype(_gelu(xp, gate, approximate) * up, x.dtype, copy=False)
