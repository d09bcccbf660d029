"""Rotary position embeddings (RoPE) and their context-extension variants.

RoPE (Su et al. 2021) rotates each pair of query/key features by an angle proportional
to the token's position: pair i turns by position * inv_freq[i], with
inv_freq[i] = theta ** (-2i / d) for a rotary dimension d. Attention scores then depend
only on relative positions. Context-extension schemes change inv_freq (and may scale
cos/sin); `rope_inv_freq` implements the variants named in HF `config.json`
`rope_scaling` with HF transformers' formulas, `apply_rope` applies them.

Layouts: NeoX (Llama, HF's `rotate_half`) pairs feature j with j + d/2; GPT-J pairs
feature 2j with 2j + 1.

M-RoPE (Qwen2-VL's multimodal rotary, `apply_mrope`) gives each token several position
rows (temporal, height, width) and splits the d/2 frequencies into consecutive sections,
one per row: pair i turns by the position of its section's row.
"""

from __future__ import annotations

import math
from typing import Any

from array_api_compat import device

from ._arrays import dtype_name, namespace

__all__ = ["ROPE_TYPES", "rope_inv_freq", "apply_rope", "apply_mrope"]

ROPE_TYPES = ("default", "linear", "dynamic", "llama3", "yarn")


def _require(scaling: dict, key: str, rope_type: str) -> Any:
    if key not in scaling:
        raise ValueError(f"rope_scaling of type {rope_type!r} needs {key!r}, got {scaling}")
    return scaling[key]


def rope_inv_freq(
    rotary_dim: int,
    theta: float,
    rope_scaling: dict | None = None,
    max_position_embeddings: int = 2048,
    seq_len: int | None = None,
    like: Any = None,
) -> tuple[Any, float]:
    """Inverse frequencies (float32, shape (rotary_dim // 2,)) and the cos/sin scale.

    With base[i] = theta ** (2i / d) for d = rotary_dim:
      default:  inv_freq = 1 / base.
      linear:   inv_freq = 1 / (factor * base)  (positions interpolated by `factor`).
      dynamic:  NTK-aware: theta' = theta * (factor * L / M - (factor - 1)) ** (d / (d - 2))
                with M = max_position_embeddings and L = max(seq_len, M): unchanged
                until the sequence outgrows M.
      llama3:   wavelengths 2 pi / inv_freq above original_max / low_freq_factor are
                divided by factor, below original_max / high_freq_factor kept, and
                linearly blended in between by s = (original_max / wavelen - low) /
                (high - low).
      yarn:     per-dimension blend of interpolation (1 / (factor * base)) and
                extrapolation (1 / base) with a linear ramp between the dimensions that
                turn beta_fast and beta_slow times over original_max positions
                (floor/ceil-truncated), and cos/sin scaled by mscale = 0.1 ln(factor) + 1
                (or attention_factor, or the mscale/mscale_all_dim ratio).
    The scale is 1 for every variant but yarn.

    Args:
        rotary_dim: even int >= 2.
        theta: the RoPE base, > 0.
        rope_scaling: HF's `rope_scaling` dict with "rope_type" (or "type"), or None.
        max_position_embeddings: the model's M.
        seq_len: the current sequence length, used by "dynamic" only.
        like: an array whose library and device the result uses (default: numpy).
    Raises:
        ValueError: an odd rotary_dim, an unknown rope type, a missing parameter.
    """
    if rotary_dim < 2 or rotary_dim % 2:
        raise ValueError(f"rotary_dim must be even and >= 2, got {rotary_dim}")
    scaling = dict(rope_scaling or {})
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type not in ROPE_TYPES:
        raise ValueError(f"rope_type must be one of {ROPE_TYPES}, got {rope_type!r}")
    if like is None:
        import numpy as np

        like = np.empty(0)
    xp = namespace(like, "like")
    d = rotary_dim
    exponents = xp.astype(xp.arange(0, d, 2, device=device(like)), xp.float32) / d
    scale = 1.0
    if rope_type == "dynamic":
        factor = float(_require(scaling, "factor", rope_type))
        length = max(seq_len or max_position_embeddings, max_position_embeddings)
        theta = theta * ((factor * length / max_position_embeddings) - (factor - 1)) ** (
            d / (d - 2)
        )
    inv_freq = 1.0 / (theta**exponents)
    if rope_type == "linear":
        inv_freq = inv_freq / float(_require(scaling, "factor", rope_type))
    elif rope_type == "llama3":
        factor = float(_require(scaling, "factor", rope_type))
        low = float(_require(scaling, "low_freq_factor", rope_type))
        high = float(_require(scaling, "high_freq_factor", rope_type))
        original = float(_require(scaling, "original_max_position_embeddings", rope_type))
        wavelen = 2 * math.pi / inv_freq
        scaled = xp.where(wavelen > original / low, inv_freq / factor, inv_freq)
        smooth = (original / wavelen - low) / (high - low)
        blended = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= original / high) & (wavelen <= original / low)
        inv_freq = xp.where(medium, blended, scaled)
    elif rope_type == "yarn":
        inv_freq, scale = _yarn(xp, scaling, d, theta, exponents, max_position_embeddings)
    return xp.astype(inv_freq, xp.float32), scale


def _yarn(
    xp: Any, scaling: dict, d: int, theta: float, exponents: Any, max_pos: int
) -> tuple[Any, float]:
    original = scaling.get("original_max_position_embeddings") or max_pos
    factor = scaling.get("factor") or max_pos / original

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention = scaling.get("attention_factor")
    if attention is None:
        m, m_all = scaling.get("mscale"), scaling.get("mscale_all_dim")
        attention = mscale(factor, m) / mscale(factor, m_all) if m and m_all else mscale(factor)
    beta_fast, beta_slow = scaling.get("beta_fast") or 32, scaling.get("beta_slow") or 1

    def correction_dim(rotations: float) -> float:
        return d * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, d - 1)
    if low == high:
        high += 0.001  # avoid dividing by zero in the ramp
    half = xp.astype(xp.arange(d // 2, device=device(exponents)), xp.float32)
    ramp = xp.clip((half - low) / (high - low), 0.0, 1.0)
    base = theta**exponents
    extrapolate = 1 - ramp
    inv_freq = (1.0 / (factor * base)) * (1 - extrapolate) + (1.0 / base) * extrapolate
    return inv_freq, float(attention)


def apply_rope(
    positions: Any,
    query: Any,
    key: Any,
    inv_freq: Any,
    scale: float = 1.0,
    is_neox: bool = True,
) -> tuple[Any, Any]:
    """Rotate the first 2 * len(inv_freq) features of every query and key head.

    For token t at position p and pair i: angle = p * inv_freq[i] (float32),
    c = cos(angle) * scale, s = sin(angle) * scale, rounded to the input dtype, and the
    pair (a, b) becomes (a * c - b * s, b * c + a * s) in the input dtype. NeoX layout:
    a = x[i], b = x[i + d/2]; GPT-J layout: a = x[2i], b = x[2i + 1]. Features past d
    (partial rotary) pass through unchanged.

    Args:
        positions: integer array, shape (num_tokens,), each >= 0.
        query: float array, shape (num_tokens, num_heads, head_size).
        key: float array, shape (num_tokens, num_kv_heads, head_size).
        inv_freq: float32 array, shape (d / 2,) with d <= head_size (`rope_inv_freq`).
        scale: cos/sin multiplier (yarn's mscale; 1 otherwise).
        is_neox: the NeoX (True) or GPT-J (False) pairing.
    Returns:
        (query, key) rotated, new arrays of the inputs' dtypes.
    Raises:
        TypeError: non-integer positions or non-float query/key.
        ValueError: shapes that disagree, or d larger than head_size.
    """
    xp = namespace(query, "query")
    if "int" not in dtype_name(positions):
        raise TypeError(f"positions must be integers, got dtype {dtype_name(positions)}")
    _check_rope_shapes(positions, query, key, inv_freq.shape[0])
    half = inv_freq.shape[0]
    angle = xp.reshape(xp.astype(positions, xp.float32), (-1, 1)) * xp.reshape(inv_freq, (1, -1))
    cos = xp.reshape(xp.cos(angle) * scale, (-1, 1, half))
    sin = xp.reshape(xp.sin(angle) * scale, (-1, 1, half))
    return _rotate(xp, query, cos, sin, is_neox), _rotate(xp, key, cos, sin, is_neox)


def _check_rope_shapes(positions: Any, query: Any, key: Any, half: int) -> None:
    """TypeError/ValueError for query/key that are not float arrays of shape
    (len(positions), heads, head_size) with 2 * half <= head_size."""
    for name, x in (("query", query), ("key", key)):
        if "float" not in dtype_name(x):
            raise TypeError(f"{name} must be a float array, got dtype {dtype_name(x)}")
        if x.ndim != 3 or x.shape[0] != positions.shape[0]:
            raise ValueError(
                f"{name} must have shape ({positions.shape[0]}, heads, head_size), "
                f"got {tuple(x.shape)}"
            )
    if 2 * half > query.shape[-1] or key.shape[-1] != query.shape[-1]:
        raise ValueError(
            f"rotary dim {2 * half} must fit head_size {query.shape[-1]} "
            f"of query and key {key.shape[-1]}"
        )


def apply_mrope(
    positions: Any,
    query: Any,
    key: Any,
    inv_freq: Any,
    mrope_section: Any,
    scale: float = 1.0,
    is_neox: bool = True,
) -> tuple[Any, Any]:
    """Multimodal RoPE: `apply_rope` where each pair takes the position of its section.

    positions has one row per section (Qwen2-VL: temporal, height, width). The d/2
    pairs are cut into consecutive sections of mrope_section[0], mrope_section[1], ...
    pairs; pair i of section r turns by angle = positions[r, t] * inv_freq[i] (float32).
    Everything else is `apply_rope`: c = cos * scale, s = sin * scale rounded to the input
    dtype, (a, b) -> (a c - b s, b c + a s), NeoX or GPT-J pairing, features past d
    unchanged. With all rows equal this is `apply_rope` on that row. Qwen2-VL's decoder
    uses 3 rows and sections such as (16, 24, 24) for d/2 = 64; its vision tower's 2-D
    rotary is 2 rows (patch row, patch column), sections (d/4, d/4) and inv_freq the
    d/4 frequencies twice.

    Args:
        positions: integer array, shape (len(mrope_section), num_tokens), each >= 0.
        query: float array, shape (num_tokens, num_heads, head_size).
        key: float array, shape (num_tokens, num_kv_heads, head_size).
        inv_freq: float32 array, shape (d / 2,) with d <= head_size.
        mrope_section: sequence of ints >= 0 summing to d / 2.
        scale: cos/sin multiplier.
        is_neox: the NeoX (True) or GPT-J (False) pairing.
    Returns:
        (query, key) rotated, new arrays of the inputs' dtypes.
    Raises:
        TypeError: non-integer positions or non-float query/key.
        ValueError: sections that are negative or do not sum to d / 2, a positions row
            count other than the number of sections, shapes that disagree, d larger
            than head_size.
    """
    xp = namespace(query, "query")
    sections = [int(n) for n in mrope_section]
    half = inv_freq.shape[0]
    if not sections or min(sections) < 0 or sum(sections) != half:
        raise ValueError(
            f"mrope_section must be ints >= 0 summing to len(inv_freq) = {half}, got {sections}"
        )
    if "int" not in dtype_name(positions):
        raise TypeError(f"positions must be integers, got dtype {dtype_name(positions)}")
    if positions.ndim != 2 or positions.shape[0] != len(sections):
        raise ValueError(
            f"positions must have shape ({len(sections)}, num_tokens) for mrope_section "
            f"{sections}, got {tuple(positions.shape)}"
        )
    _check_rope_shapes(positions[0], query, key, half)
    rows = [r for r, n in enumerate(sections) for _ in range(n)]  # the row of each pair
    pair_positions = xp.take(positions, xp.asarray(rows, device=device(positions)), axis=0)
    angle = xp.permute_dims(xp.astype(pair_positions, xp.float32), (1, 0)) * xp.reshape(
        inv_freq, (1, -1)
    )
    cos = xp.reshape(xp.cos(angle) * scale, (-1, 1, half))
    sin = xp.reshape(xp.sin(angle) * scale, (-1, 1, half))
    return _rotate(xp, query, cos, sin, is_neox), _rotate(xp, key, cos, sin, is_neox)


def _rotate(xp: Any, x: Any, cos: Any, sin: Any, is_neox: bool) -> Any:
    half = cos.shape[-1]
    c, s = xp.astype(cos, x.dtype, copy=False), xp.astype(sin, x.dtype, copy=False)
    rot, rest = x[..., : 2 * half], x[..., 2 * half :]
    if is_neox:
        a, b = rot[..., :half], rot[..., half:]
        out = xp.concat([a * c - b * s, b * c + a * s], axis=-1)
    else:
        a, b = rot[..., 0::2], rot[..., 1::2]
        pairs = xp.stack([a * c - b * s, b * c + a * s], axis=-1)
        out = xp.reshape(pairs, rot.shape)
    return xp.concat([out, rest], axis=-1)
