"""Properties of `ops.rope` (see `pyagent_ref/ops/rope.py` for the contract).

`rope_inv_freq` is drawn over every rope type (rotary_dim 2-64, theta from 10 to 1e6,
factors 1-8, llama3 and yarn parameters of published configs); `apply_rope` over 0-6
tokens, 1-4 query and key heads, head_size 2-16 with partial rotary dims, positions
0-4096 (int32/int64), float32 and float64, both layouts, scale 1 or a yarn mscale.

Tolerances. inv_freq is float32 by contract: it must be within 5 float32 ulps
(rtol 5 * 2**-23 ~ 6e-7: 4 ulp of a device powf, 0.5 of theta rounded to float32, 0.5 of the
reciprocal; derived at INV_FREQ_RTOL) of the float64 formula evaluated on the float32
exponents, and within 2e-6 relative of the reference. The angle p * inv_freq is float32 and
cos/sin are float32 computations even for float64 input, so rotated values are compared with
|got - want| <= 2e-6 * scale * (|a| + |b|) * (1 + |angle| * 1e-1) + TOL[dtype] * |want|
(a, b the pair's inputs), TOL = 2e-6 for float32 and 1e-12 for float64.
"""

from __future__ import annotations

import math
from typing import Any

import hypothesis.extra.numpy as hnp
import numpy as np
from hypothesis import strategies as st

import pyagent_ref.ops.rope  # noqa: F401 - binds pyagent_ref.ops.rope for the reference
from pyagent_ref.ops.rope import rope_inv_freq as _ref_inv_freq

from .. import checks, contract
from ..core import Case, Ctx, Spec
from ._common import (
    FLOAT_DTYPES,
    add_does_not_modify_inputs,
    add_matches_reference,
    add_rejects_invalid_input,
    assert_within,
    check_like_input,
    error_variants,
    reference_shapes,
)

OPS = contract.names("rope")
TOL = {"float32": 2e-6, "float64": 1e-12}
ANGLE_TOL = 2e-6

spec = Spec("rope", OPS)

SHAPES = reference_shapes("rope")

# --- strategies -----------------------------------------------------------------------------

thetas = st.sampled_from((10.0, 1000.0, 10000.0, 500000.0, 1e6))


@st.composite
def scalings(draw: Any) -> dict | None:
    kind = draw(st.sampled_from(("none", "default", "linear", "dynamic", "llama3", "yarn")))
    factor = draw(st.sampled_from((1.0, 2.0, 4.0, 8.0)))
    key = draw(st.sampled_from(("rope_type", "type")))
    if kind == "none":
        return None
    if kind == "default":
        return {key: "default"}
    if kind in ("linear", "dynamic"):
        return {key: kind, "factor": factor}
    if kind == "llama3":
        return {
            "rope_type": "llama3",
            "factor": factor,
            "low_freq_factor": 1.0,
            "high_freq_factor": draw(st.sampled_from((2.0, 4.0))),
            "original_max_position_embeddings": draw(st.sampled_from((256, 8192))),
        }
    out: dict = {"rope_type": "yarn", "factor": factor}
    if draw(st.booleans()):
        out["original_max_position_embeddings"] = draw(st.sampled_from((256, 4096)))
    if draw(st.booleans()):
        out["beta_fast"], out["beta_slow"] = 32, 1
    if draw(st.booleans()):
        out["attention_factor"] = 1.25
    return out


def _kind(scaling: dict | None) -> str:
    sc = scaling or {}
    return sc.get("rope_type", sc.get("type", "default"))


@st.composite
def inv_freq_cases(draw: Any, scaling: Any = None) -> Case:
    """A valid call. "dynamic" needs rotary_dim >= 4: its exponent d / (d - 2) is undefined
    at d = 2 (the reference raises ZeroDivisionError, which the contract does not name)."""
    sc = draw(scaling if scaling is not None else scalings())
    return Case(
        rotary_dim=2 * draw(st.integers(2 if _kind(sc) == "dynamic" else 1, 32)),
        theta=draw(thetas),
        rope_scaling=sc,
        max_position_embeddings=draw(st.sampled_from((128, 2048, 8192))),
        seq_len=draw(st.one_of(st.none(), st.integers(1, 20000))),
        like=np.empty(0, np.float32),
    )


@st.composite
def rope_cases(
    draw: Any, max_pos: int = 4096, scale: float | None = None, zero: bool = False
) -> Case:
    dtype = np.dtype(draw(st.sampled_from(FLOAT_DTYPES)))
    n = draw(st.integers(0, 6))
    head = 2 * draw(st.integers(1, 8))
    rot = 2 * draw(st.integers(1, head // 2))
    width = 32 if dtype == np.float32 else 64
    elements = st.one_of(st.sampled_from((0.0, 1.0, -1.0)), st.floats(-4, 4, width=width))
    pos_dtype = draw(st.sampled_from((np.int32, np.int64)))
    positions = (
        np.zeros(n, pos_dtype)
        if zero
        else draw(hnp.arrays(np.dtype(pos_dtype), (n,), elements=st.integers(0, max_pos)))
    )
    inv_freq, _ = _ref_inv_freq(rot, draw(thetas))
    return Case(
        positions=positions,
        query=draw(hnp.arrays(dtype, (n, draw(st.integers(1, 4)), head), elements=elements)),
        key=draw(hnp.arrays(dtype, (n, draw(st.integers(1, 4)), head), elements=elements)),
        inv_freq=np.asarray(inv_freq, np.float32),
        scale=draw(st.sampled_from((1.0, 1.0693))) if scale is None else scale,
        is_neox=draw(st.booleans()),
    )


def call(ctx: Ctx, op: str, case: Case) -> Any:
    return ctx.call(op, *SHAPES[op].call_args(case))


# --- oracle ---------------------------------------------------------------------------------


def pair_index(half: int, is_neox: bool) -> tuple[np.ndarray, np.ndarray]:
    i = np.arange(half)
    return (i, i + half) if is_neox else (2 * i, 2 * i + 1)


def rotate_oracle(case: Case, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(x rotated in float64 with float32 angles, the tolerance of each entry)."""
    half = case.inv_freq.shape[0]
    angle = (case.positions.astype(np.float32)[:, None] * case.inv_freq[None, :]).astype(
        np.float64
    )  # (n, half), the product rounded to float32 as the contract says
    c = (np.cos(angle) * case.scale)[:, None, :]
    s = (np.sin(angle) * case.scale)[:, None, :]
    ia, ib = pair_index(half, case.is_neox)
    x64 = x.astype(np.float64)
    a, b = x64[..., ia], x64[..., ib]
    out = x64.copy()
    out[..., ia], out[..., ib] = a * c - b * s, b * c + a * s
    mag = np.zeros_like(x64)
    pair = (
        ANGLE_TOL
        * max(case.scale, 1.0)
        * (np.abs(a) + np.abs(b))
        * (1 + 0.1 * np.abs(angle)[:, None, :])
    )
    mag[..., ia], mag[..., ib] = pair, pair
    # the result is stored in x's dtype: near zero it cannot be closer than its spacing there
    floor = np.finfo(x.dtype).smallest_subnormal
    return out, mag + TOL[x.dtype.name] * np.abs(out) + floor


# ============================================================================= rope_inv_freq


# The error of 1 / theta ** e computed in float32 (e the float32 exponents, as the oracle
# uses them), relative to the float64 formula, with u = 2**-23 (float32 eps, the largest
# relative size of one ulp):
#   theta rounded to float32 for the power (|e| < 1):   < 0.5 u  (theta * (1 + u/2)) ** e
#   the power, POW_ULPS ulp of its result:               POW_ULPS u
#   the reciprocal, correctly rounded:                    0.5 u    (1 / p(1 + d) ~ (1 - d) / p)
# so |inv - want| <= (POW_ULPS + 1) u |want| to first order (the products of these terms
# are ~1e-13 relative). POW_ULPS = 4: CUDA documents powf within 4 ulp over its full range
# (CUDA C++ Programming Guide, "Mathematical Functions", single precision); glibc's powf is
# within 1 ulp. Measured on CUDA: 1.44e-10 at inv ~ 2.52e-4, i.e. 4.8 u.
POW_ULPS = 4
INV_FREQ_RTOL = (POW_ULPS + 1) * float(np.finfo(np.float32).eps)


def _base_inv_freq(d: int, theta: float) -> np.ndarray:
    exponents = (np.arange(0, d, 2).astype(np.float32) / np.float32(d)).astype(np.float64)
    return 1.0 / theta**exponents


@spec.prop("rope_inv_freq", inv_freq_cases(st.sampled_from((None, {"rope_type": "default"}))))
def default_is_theta_power(ctx: Ctx, case: Case) -> None:
    """Without scaling: inv_freq[i] = theta ** (-2i / d), float32 of shape (d / 2,), scale 1."""
    inv, scale = call(ctx, "rope_inv_freq", case)
    checks.assert_shape_dtype(inv, (case.rotary_dim // 2,), np.float32, "inv_freq")
    want = _base_inv_freq(case.rotary_dim, case.theta)
    assert_within(inv, want, INV_FREQ_RTOL * want, "inv_freq")
    assert scale == 1.0, f"scale {scale!r}, expected 1"


@spec.prop("rope_inv_freq", st.tuples(inv_freq_cases(), st.sampled_from((2.0, 4.0))))
def linear_divides_by_factor(ctx: Ctx, pair: Any) -> None:
    """linear: inv_freq = default inv_freq / factor."""
    case, factor = pair
    inv, scale = ctx.call(
        "rope_inv_freq", case.rotary_dim, case.theta, {"rope_type": "linear", "factor": factor}
    )
    want = _base_inv_freq(case.rotary_dim, case.theta) / factor
    assert_within(inv, want, 1e-6 * want, "linear inv_freq")
    assert scale == 1.0, f"scale {scale!r}, expected 1"


@spec.prop("rope_inv_freq", inv_freq_cases())
def dynamic_unchanged_within_max_positions(ctx: Ctx, case: Case) -> None:
    """dynamic: while seq_len <= max_position_embeddings (or None) inv_freq is the default's."""
    m = case.max_position_embeddings
    seq = None if case.seq_len is None else min(case.seq_len, m)
    d = max(case.rotary_dim, 4)  # d / (d - 2) is undefined at d = 2
    dyn, _ = ctx.call("rope_inv_freq", d, case.theta, {"type": "dynamic", "factor": 4.0}, m, seq)
    base, _ = ctx.call("rope_inv_freq", d, case.theta)
    assert_within(dyn, base, 1e-6 * np.abs(base), "dynamic inv_freq within M")


@spec.prop("rope_inv_freq", inv_freq_cases())
def scale_is_one_except_yarn(ctx: Ctx, case: Case) -> None:
    """The cos/sin scale is 1 for every type but yarn; yarn without attention_factor or
    mscale gives 0.1 ln(factor) + 1 (1 for factor <= 1), with attention_factor that value."""
    _, scale = call(ctx, "rope_inv_freq", case)
    sc = case.rope_scaling or {}
    if _kind(sc) != "yarn":
        want = 1.0
    elif "attention_factor" in sc:
        want = sc["attention_factor"]
    else:
        f = sc["factor"]
        want = 1.0 if f <= 1 else 0.1 * math.log(f) + 1.0
    assert abs(float(scale) - want) <= 1e-12, f"scale {scale!r}, expected {want!r}"


@spec.prop("rope_inv_freq", inv_freq_cases(scalings()))
def llama3_keeps_high_and_divides_low_frequencies(ctx: Ctx, case: Case) -> None:
    """llama3: frequencies with wavelength below original_max / high_freq_factor are kept,
    those above original_max / low_freq_factor divided by factor, the rest in between."""
    sc = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 512,
    }
    inv, _ = ctx.call("rope_inv_freq", case.rotary_dim, case.theta, sc)
    base = _base_inv_freq(case.rotary_dim, case.theta)
    wavelen = 2 * math.pi / base
    high, low = wavelen < 512 / 4.0 * 0.999, wavelen > 512 / 1.0 * 1.001
    assert_within(inv[high], base[high], 1e-6 * base[high], "high-frequency inv_freq")
    assert_within(inv[low], base[low] / 8, 1e-6 * base[low], "low-frequency inv_freq")
    mid = ~high & ~low
    assert np.all((inv[mid] <= base[mid] * 1.000001) & (inv[mid] >= base[mid] / 8 * 0.999999)), (
        "a medium frequency outside [inv_freq / factor, inv_freq]"
    )


@spec.prop("rope_inv_freq", inv_freq_cases(), name="returns_documented_types")
def inv_freq_returns_documented_types(ctx: Ctx, case: Case) -> None:
    """(float32 array of shape (rotary_dim // 2,) in like's library and device, a float)."""
    like = ctx.convert(case.like)
    inv, scale = ctx.fn("rope_inv_freq")(*SHAPES["rope_inv_freq"].call_args(case)[:-1], like)
    problem = checks.same_library(inv, like)
    assert problem is None, problem
    assert checks.dtype_name(inv) == "float32", f"dtype {checks.dtype_name(inv)}"
    assert tuple(inv.shape) == (case.rotary_dim // 2,), f"shape {tuple(inv.shape)}"
    assert isinstance(scale, float), f"scale is {type(scale).__name__}"


def inv_freq_errors(case: Case) -> list[tuple[str, tuple[Any, ...], type]]:
    args = SHAPES["rope_inv_freq"].call_args(case)

    def with_(i: int, v: Any) -> tuple[Any, ...]:
        return tuple(v if j == i else a for j, a in enumerate(args))

    return [
        ("an odd rotary_dim", with_(0, case.rotary_dim + 1), ValueError),
        ("rotary_dim 0", with_(0, 0), ValueError),
        ("an unknown rope_type", with_(2, {"rope_type": "longrope-x"}), ValueError),
        ("linear without factor", with_(2, {"rope_type": "linear"}), ValueError),
        ("dynamic without factor", with_(2, {"type": "dynamic"}), ValueError),
        (
            "llama3 without low_freq_factor",
            with_(2, {"rope_type": "llama3", "factor": 8.0}),
            ValueError,
        ),
    ]


def _inv_freq_compare(case: Case, got: Any, ref: Any) -> None:
    assert got[0].dtype == np.float32, f"dtype {got[0].dtype}"
    assert_within(got[0], ref[0], 2e-6 * np.abs(ref[0]), "inv_freq")
    assert abs(float(got[1]) - float(ref[1])) <= 1e-12 * abs(float(ref[1])), (
        f"scale {got[1]!r}, the reference's {ref[1]!r}"
    )


add_rejects_invalid_input(
    spec, SHAPES["rope_inv_freq"], error_variants(inv_freq_cases(), inv_freq_errors)
)
add_matches_reference(
    spec,
    SHAPES["rope_inv_freq"],
    inv_freq_cases(),
    _inv_freq_compare,
    "The reference's inv_freq within 2e-6 relative, and its scale.",
)


# ================================================================================ apply_rope


@spec.prop("apply_rope", rope_cases())
def matches_the_rotation(ctx: Ctx, case: Case) -> None:
    """Each pair (a, b) becomes (a c - b s, b c + a s), c, s = cos, sin(p * inv_freq[i])
    * scale (NeoX: a = x[i], b = x[i + d/2]; GPT-J: x[2i], x[2i+1]); features past d
    are unchanged, exactly."""
    q, k = call(ctx, "apply_rope", case)
    d = 2 * case.inv_freq.shape[0]
    for name, x, got in (("query", case.query, q), ("key", case.key, k)):
        want, t = rotate_oracle(case, x)
        assert_within(got, want, t, f"rotated {name}")
        checks.assert_equal(got[..., d:], x[..., d:], what=f"{name} past the rotary dim")


@spec.prop("apply_rope", rope_cases(scale=1.0))
def rotation_preserves_pair_norms(ctx: Ctx, case: Case) -> None:
    """With scale 1, every rotated pair keeps its Euclidean norm."""
    q, k = call(ctx, "apply_rope", case)
    ia, ib = pair_index(case.inv_freq.shape[0], case.is_neox)
    for name, x, got in (("query", case.query, q), ("key", case.key, k)):
        x64, g64 = x.astype(np.float64), got.astype(np.float64)
        before = np.hypot(x64[..., ia], x64[..., ib])
        after = np.hypot(g64[..., ia], g64[..., ib])
        assert_within(after, before, 4 * ANGLE_TOL * before + 1e-30, f"{name} pair norm")


@spec.prop("apply_rope", rope_cases(zero=True, scale=1.0))
def position_zero_is_identity(ctx: Ctx, case: Case) -> None:
    """At position 0 (cos 1, sin 0) with scale 1, query and key come back unchanged."""
    q, k = call(ctx, "apply_rope", case)
    checks.assert_equal(q, case.query, what="query at position 0")
    checks.assert_equal(k, case.key, what="key at position 0")


@spec.prop("apply_rope", st.tuples(rope_cases(max_pos=64, scale=1.0), st.integers(1, 64)))
def scores_depend_on_relative_position(ctx: Ctx, pair: Any) -> None:
    """q(p) . k(p') is unchanged when both positions shift by the same amount: RoPE scores
    depend only on p - p' (query token t against key token t' of the same head)."""
    case, shift = pair
    n = case.positions.shape[0]
    if n == 0:
        return
    q0, k0 = call(ctx, "apply_rope", case)
    q1, k1 = ctx.call(
        "apply_rope",
        case.positions + shift,
        case.query,
        case.key,
        case.inv_freq,
        case.scale,
        case.is_neox,
    )
    heads = min(case.query.shape[1], case.key.shape[1])
    s0 = np.einsum("thd,uhd->tuh", q0[:, :heads].astype(np.float64), k0[:, :heads])
    s1 = np.einsum("thd,uhd->tuh", q1[:, :heads].astype(np.float64), k1[:, :heads])
    qn = np.linalg.norm(case.query[:, :heads].astype(np.float64), axis=-1)
    kn = np.linalg.norm(case.key[:, :heads].astype(np.float64), axis=-1)
    bound = 1e-4 * qn[:, None, :] * kn[None, :, :] + 1e-30
    assert_within(s1, s0, bound, f"q . k after shifting both positions by {shift}")


@spec.prop("apply_rope", rope_cases())
def gptj_is_neox_on_interleaved_features(ctx: Ctx, case: Case) -> None:
    """GPT-J's pairing is NeoX's after interleaving the rotary features: permuting
    [0, 2, 4, ..., 1, 3, 5, ...] into NeoX order, rotating, and permuting back."""
    d = 2 * case.inv_freq.shape[0]
    head = case.query.shape[-1]
    perm = np.concatenate([np.arange(0, d, 2), np.arange(1, d, 2), np.arange(d, head)])
    inv = np.argsort(perm)
    args = (case.positions, case.query, case.key, case.inv_freq, case.scale)
    gq, gk = ctx.call("apply_rope", *args, False)
    nq, nk = ctx.call(
        "apply_rope",
        case.positions,
        np.ascontiguousarray(case.query[..., perm]),
        np.ascontiguousarray(case.key[..., perm]),
        case.inv_freq,
        case.scale,
        True,
    )
    for name, g, x, nx in (("query", gq, case.query, nq), ("key", gk, case.key, nk)):
        t = TOL[x.dtype.name] * (np.abs(g) + np.abs(x))
        assert_within(nx[..., inv], g, t, f"{name}: NeoX on permuted features vs GPT-J")


@spec.prop("apply_rope", rope_cases(), name="returns_documented_types")
def rope_returns_documented_types(ctx: Ctx, case: Case) -> None:
    """(query, key): new arrays like the inputs (library, device, dtype, shape)."""
    args = [ctx.convert(a) for a in SHAPES["apply_rope"].call_args(case)]
    out = ctx.fn("apply_rope")(*args)
    assert isinstance(out, tuple) and len(out) == 2, f"returned {type(out).__name__}"
    check_like_input(out[0], args[1], "query")
    check_like_input(out[1], args[2], "key")
    assert out[0] is not args[1] and out[1] is not args[2], "returned an input object"


def rope_errors(case: Case) -> list[tuple[str, tuple[Any, ...], type]]:
    pos, q, k, inv = case.positions, case.query, case.key, case.inv_freq
    rest = (case.scale, case.is_neox)
    head = q.shape[-1]
    long_inv = np.ones(head // 2 + 1, np.float32)
    return [
        ("float positions", (pos.astype(np.float64), q, k, inv, *rest), TypeError),
        ("integer query", (pos, np.zeros(q.shape, np.int64), k, inv, *rest), TypeError),
        ("integer key", (pos, q, np.zeros(k.shape, np.int32), inv, *rest), TypeError),
        ("2-D query", (pos, q[:, 0], k, inv, *rest), ValueError),
        (
            "one position more than tokens",
            (np.append(pos, 0).astype(pos.dtype), q, k, inv, *rest),
            ValueError,
        ),
        (
            "key with another head_size",
            (pos, q, np.zeros((*k.shape[:2], head + 2), k.dtype), inv, *rest),
            ValueError,
        ),
        ("inv_freq longer than head_size / 2", (pos, q, k, long_inv, *rest), ValueError),
    ]


def _rope_compare(case: Case, got: Any, ref: Any) -> None:
    assert isinstance(got, tuple) and len(got) == 2, f"returned {type(got).__name__}"
    for name, g, r, x in (("query", got[0], ref[0], case.query), ("key", got[1], ref[1], case.key)):
        assert g.dtype == r.dtype, f"{name} dtype {g.dtype}, the reference's {r.dtype}"
        _, t = rotate_oracle(case, x)
        assert_within(g, r, t, name)


add_does_not_modify_inputs(spec, SHAPES["apply_rope"], rope_cases())
add_rejects_invalid_input(spec, SHAPES["apply_rope"], error_variants(rope_cases(), rope_errors))
add_matches_reference(
    spec,
    SHAPES["apply_rope"],
    rope_cases(),
    _rope_compare,
    "The reference's rotated query and key within the rotation tolerance.",
)


# =============================================================================== apply_mrope


@st.composite
def mrope_cases(draw: Any, equal_rows: bool = False) -> Case:
    """A valid call: `rope_cases` with 1-4 position rows and sections (some empty)
    summing to d / 2."""
    base = draw(rope_cases(max_pos=1024))
    half = base.inv_freq.shape[0]
    rows = draw(st.integers(1, 4))
    cuts = sorted(draw(st.lists(st.integers(0, half), min_size=rows - 1, max_size=rows - 1)))
    sections = tuple(b - a for a, b in zip([0, *cuts], [*cuts, half], strict=True))
    n = base.positions.shape[0]
    if equal_rows:
        positions = np.broadcast_to(base.positions, (rows, n)).copy()
    else:
        positions = draw(hnp.arrays(base.positions.dtype, (rows, n), elements=st.integers(0, 1024)))
    return Case(
        positions=positions,
        query=base.query,
        key=base.key,
        inv_freq=base.inv_freq,
        mrope_section=sections,
        scale=base.scale,
        is_neox=base.is_neox,
    )


def _section_rows(sections: tuple[int, ...]) -> np.ndarray:
    return np.repeat(np.arange(len(sections)), sections)


def mrope_oracle(case: Case, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`rotate_oracle` with pair i turned by its section's row: the rotation of each
    pair is that of apply_rope at that pair's position."""
    rows = _section_rows(case.mrope_section)
    out, tol = x.astype(np.float64).copy(), np.zeros(x.shape)
    half = case.inv_freq.shape[0]
    ia, ib = pair_index(half, case.is_neox)
    for r in range(len(case.mrope_section)):
        pairs = rows == r
        if not pairs.any():
            continue
        plain = Case(
            positions=case.positions[r],
            inv_freq=case.inv_freq,
            scale=case.scale,
            is_neox=case.is_neox,
        )
        want, t = rotate_oracle(plain, x)
        for idx in (ia[pairs], ib[pairs]):
            out[..., idx], tol[..., idx] = want[..., idx], t[..., idx]
    d = 2 * half
    out[..., d:] = x[..., d:]
    tol[..., d:] = 0
    return out, tol


@spec.prop("apply_mrope", mrope_cases())
def each_section_turns_by_its_row(ctx: Ctx, case: Case) -> None:
    """Pair i of section r is rotated as apply_rope rotates it at position
    positions[r, t]; features past d are unchanged, exactly."""
    q, k = call(ctx, "apply_mrope", case)
    d = 2 * case.inv_freq.shape[0]
    for name, x, got in (("query", case.query, q), ("key", case.key, k)):
        want, t = mrope_oracle(case, x)
        assert_within(got, want, t, f"rotated {name}")
        checks.assert_equal(got[..., d:], x[..., d:], what=f"{name} past the rotary dim")


@spec.prop("apply_mrope", mrope_cases(equal_rows=True), uses=("apply_rope",))
def equal_rows_are_apply_rope(ctx: Ctx, case: Case) -> None:
    """With every row equal, apply_mrope is apply_rope at that row, exactly (whatever
    the sections)."""
    q, k = call(ctx, "apply_mrope", case)
    rq, rk = ctx.call(
        "apply_rope",
        case.positions[0],
        case.query,
        case.key,
        case.inv_freq,
        case.scale,
        case.is_neox,
    )
    checks.assert_equal(q, rq, what="query against apply_rope")
    checks.assert_equal(k, rk, what="key against apply_rope")


@spec.prop("apply_mrope", mrope_cases(), name="returns_documented_types")
def mrope_returns_documented_types(ctx: Ctx, case: Case) -> None:
    """(query, key): new arrays like the inputs (library, device, dtype, shape)."""
    args = [ctx.convert(a) for a in SHAPES["apply_mrope"].call_args(case)]
    out = ctx.fn("apply_mrope")(*args)
    assert isinstance(out, tuple) and len(out) == 2, f"returned {type(out).__name__}"
    check_like_input(out[0], args[1], "query")
    check_like_input(out[1], args[2], "key")


def mrope_errors(case: Case) -> list[tuple[str, tuple[Any, ...], type]]:
    pos, q, k, inv, sec = case.positions, case.query, case.key, case.inv_freq, case.mrope_section
    rest = (case.scale, case.is_neox)
    more = (*sec[:-1], sec[-1] + 1)
    return [
        ("sections summing past d / 2", (pos, q, k, inv, more, *rest), ValueError),
        ("a negative section", (pos, q, k, inv, (*sec, -1, 1), *rest), ValueError),
        ("no sections", (pos, q, k, inv, (), *rest), ValueError),
        ("float positions", (pos.astype(np.float64), q, k, inv, sec, *rest), TypeError),
        ("a position row too few", (pos[:-1], q, k, inv, sec, *rest), ValueError),
        ("1-D positions", (pos[0], q, k, inv, sec, *rest), ValueError),
        ("integer query", (pos, np.zeros(q.shape, np.int64), k, inv, sec, *rest), TypeError),
        (
            "one token more than positions",
            (pos, np.concatenate([q, np.zeros((1, *q.shape[1:]), q.dtype)]), k, inv, sec, *rest),
            ValueError,
        ),
    ]


def _mrope_compare(case: Case, got: Any, ref: Any) -> None:
    assert isinstance(got, tuple) and len(got) == 2, f"returned {type(got).__name__}"
    for name, g, r, x in (("query", got[0], ref[0], case.query), ("key", got[1], ref[1], case.key)):
        assert g.dtype == r.dtype, f"{name} dtype {g.dtype}, the reference's {r.dtype}"
        _, t = mrope_oracle(case, x)
        assert_within(g, r, t, name)


add_does_not_modify_inputs(spec, SHAPES["apply_mrope"], mrope_cases())
add_rejects_invalid_input(spec, SHAPES["apply_mrope"], error_variants(mrope_cases(), mrope_errors))
add_matches_reference(
    spec,
    SHAPES["apply_mrope"],
    mrope_cases(),
    _mrope_compare,
    "The reference's rotated query and key within the rotation tolerance.",
)


# ================================================================================= constants


def rope_types_constant(ctx: Ctx) -> None:
    """ROPE_TYPES lists the supported rope types: default, linear, dynamic, llama3, yarn."""
    value = ctx.fn("ROPE_TYPES")
    assert tuple(value) == ("default", "linear", "dynamic", "llama3", "yarn"), f"got {value!r}"


spec.add("ROPE_TYPES", rope_types_constant, name="equals_specified_value")
