"""pyagent_accel.ops.layers and .rope against pyagent_ref (numpy and torch CPU, all float dtypes).

Bits are compared where the contract fixes them: rms_norm against numpy (the same pairwise
sum), the residual sum, the features rope leaves alone, and every bfloat16 result against
torch; elsewhere the only differences come from the last bit of exp, sum order (torch)
or float32 cos/sin, so results must agree to a fraction of an ulp in nearly every entry.
Then the same exception (class and message) for each bad input, tensors on other
devices, strided views, and no panic escaping the native functions. The conformance
suite (`python -m conformance pyagent_accel layers rope`) is the specification check;
these are the accelerator's regression tests.
"""

from __future__ import annotations

import numpy as np
import pyagent_accel._native as N
import pytest
from pyagent_accel.ops import layers as AL
from pyagent_accel.ops import rope as AR

from pyagent_ref.ops import layers as RL
from pyagent_ref.ops import rope as RR

torch = pytest.importorskip("torch")

FLOATS = ["float16", "bfloat16", "float32", "float64"]
# (library, dtype) pairs the reference runs on: numpy has no bfloat16
CASES = [("numpy", d) for d in FLOATS if d != "bfloat16"] + [("torch", d) for d in FLOATS]


def make(rng, shape, lib, dtype, scale=1.0):
    a = (rng.standard_normal(shape) * scale).astype(np.float32)
    if lib == "numpy":
        return a.astype(dtype)
    return torch.from_numpy(a).to(getattr(torch, dtype))


def bits(x):
    """The bit patterns of a float array or tensor, as signed ints."""
    if isinstance(x, torch.Tensor):
        x = x.view(torch.int16) if x.dtype == torch.bfloat16 else x
        x = x.numpy()
    return x.view({2: np.int16, 4: np.int32, 8: np.int64}[x.itemsize]).astype(np.int64)


def same_bits(got, want):
    assert type(got) is type(want) and got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(bits(got), bits(want))


def nearly_same(got, want, max_ulps=1, max_fraction=1e-3):
    """Same type, dtype and shape; at most `max_fraction` of the entries differ from the
    reference's, each by at most `max_ulps` (ulps of the result's dtype, at the value)."""
    assert type(got) is type(want) and got.dtype == want.dtype and got.shape == want.shape
    g, w = bits(got), bits(want)
    differ = g != w
    assert differ.mean() <= max_fraction, f"{differ.mean():.2e} of the entries differ"
    as_f64 = (lambda t: t.double().numpy()) if isinstance(got, torch.Tensor) else np.float64
    got64, want64 = as_f64(got), as_f64(want)
    eps = float(
        torch.finfo(got.dtype).eps if isinstance(got, torch.Tensor) else np.finfo(got.dtype).eps
    )
    tiny = float(
        torch.finfo(got.dtype).tiny if isinstance(got, torch.Tensor) else np.finfo(got.dtype).tiny
    )
    assert np.all(np.abs(got64 - want64) <= max_ulps * eps * np.abs(want64) + tiny)


# --- rms_norm ---------------------------------------------------------------------------


@pytest.mark.parametrize("lib,dtype", CASES)
@pytest.mark.parametrize("shape", [(7, 96), (3, 4, 200), (33,), (2, 1280)])
def test_rms_norm_matches_the_reference(lib, dtype, shape):
    rng = np.random.default_rng(len(shape) * 1000 + shape[-1])
    x, res = make(rng, shape, lib, dtype, 3.0), make(rng, shape, lib, dtype)
    w = make(rng, shape[-1:], lib, dtype, 0.5)
    out, ref = AL.rms_norm(x, w, 1e-5), RL.rms_norm(x, w, 1e-5)
    (out_r, new_r), (ref_r, ref_new) = AL.rms_norm(x, w, 1e-5, res), RL.rms_norm(x, w, 1e-5, res)
    same_bits(new_r, ref_new)  # the residual sum is exact
    if lib == "numpy" or dtype == "bfloat16":  # numpy's pairwise sum; bf16 hides torch's order
        same_bits(out, ref)
        same_bits(out_r, ref_r)
    else:  # torch sums the squares in another order: a row's last bits may all differ
        nearly_same(out, ref, max_ulps=4, max_fraction=1.0)
        nearly_same(out_r, ref_r, max_ulps=4, max_fraction=1.0)


def test_rms_norm_weight_and_residual_of_other_dtypes_follow_the_reference():
    rng = np.random.default_rng(3)
    x = make(rng, (4, 64), "numpy", "float16")
    w64, res32 = make(rng, (64,), "numpy", "float64"), make(rng, (4, 64), "numpy", "float32")
    same_bits(AL.rms_norm(x, w64, 1e-6), RL.rms_norm(x, w64, 1e-6))
    got, want = AL.rms_norm(x, w64, 1e-6, res32), RL.rms_norm(x, w64, 1e-6, res32)
    same_bits(got[0], want[0])  # x + residual promotes to float32, as in the reference
    same_bits(got[1], want[1])
    xt = torch.from_numpy(x.astype(np.float32)).bfloat16()
    wt = torch.from_numpy(w64)
    same_bits(AL.rms_norm(xt, wt, 1e-6), RL.rms_norm(xt, wt, 1e-6))


# --- silu_and_mul -----------------------------------------------------------------------


@pytest.mark.parametrize("lib,dtype", CASES)
def test_silu_and_mul_matches_the_reference(lib, dtype):
    rng = np.random.default_rng(5)
    x = make(rng, (64, 2 * 300), lib, dtype, 3.0)
    x[0, :5] = 0  # silu(0) = 0 exactly
    out, ref = AL.silu_and_mul(x), RL.silu_and_mul(x)
    if dtype in ("float16", "bfloat16"):  # exp's last float32 bit rarely survives rounding
        nearly_same(out, ref, max_ulps=1, max_fraction=1e-3)
    else:  # exp is within 1 ulp in numpy, torch and here, each its own
        nearly_same(out, ref, max_ulps=8, max_fraction=0.5)
    zeros = out[0, :5].double().numpy() if lib == "torch" else np.float64(out[0, :5])
    assert (zeros == 0).all()


# --- gemma_rms_norm and layer_norm ---------------------------------------------------------


def norm_args(op, rng, shape, lib, dtype):
    """(x, residual, parameters) of one normalisation: weights around 0 for Gemma's
    (1 + weight) scale, around 1 with a bias for LayerNorm."""
    x, res = make(rng, shape, lib, dtype, 3.0), make(rng, shape, lib, dtype)
    if op == "gemma_rms_norm":
        return x, res, (make(rng, shape[-1:], lib, dtype, 0.3),)
    w, b = make(rng, shape[-1:], lib, dtype, 0.2) + 1, make(rng, shape[-1:], lib, dtype, 0.5)
    return x + 2, res, (w, b)  # an offset mean for LayerNorm to take out


@pytest.mark.parametrize("op", ["gemma_rms_norm", "layer_norm"])
@pytest.mark.parametrize("lib,dtype", CASES)
@pytest.mark.parametrize("shape", [(7, 96), (3, 4, 200), (33,), (2, 1280)])
def test_norms_match_the_reference(op, lib, dtype, shape):
    rng = np.random.default_rng(len(shape) * 1000 + shape[-1])
    x, res, params = norm_args(op, rng, shape, lib, dtype)
    accel, ref = getattr(AL, op), getattr(RL, op)
    out, want = accel(x, *params, 1e-5), ref(x, *params, 1e-5)
    (out_r, new_r), (want_r, want_new) = accel(x, *params, 1e-5, res), ref(x, *params, 1e-5, res)
    same_bits(new_r, want_new)  # the residual sum is exact
    for got, ref_out in ((out, want), (out_r, want_r)):
        if lib == "numpy":  # numpy's pairwise sums, the reference's order
            same_bits(got, ref_out)
        elif dtype in ("float16", "bfloat16"):  # torch's sums rarely show after the rounding
            nearly_same(got, ref_out, max_ulps=1, max_fraction=1e-2)
        else:  # torch sums in another order; LayerNorm's mean carries it as an absolute error
            eps = torch.finfo(got.dtype).eps
            torch.testing.assert_close(got, ref_out, rtol=8 * eps, atol=32 * eps)


def test_norm_parameters_of_other_dtypes_are_taken_in_the_compute_dtype():
    rng = np.random.default_rng(13)
    x = make(rng, (4, 64), "numpy", "float16")
    w64, b16 = make(rng, (64,), "numpy", "float64"), make(rng, (64,), "numpy", "float16")
    res32 = make(rng, (4, 64), "numpy", "float32")
    same_bits(AL.gemma_rms_norm(x, w64, 1e-6), RL.gemma_rms_norm(x, w64, 1e-6))
    same_bits(AL.layer_norm(x, w64, b16, 1e-6), RL.layer_norm(x, w64, b16, 1e-6))
    got, want = AL.layer_norm(x, w64, b16, 1e-6, res32), RL.layer_norm(x, w64, b16, 1e-6, res32)
    same_bits(got[0], want[0])  # x + residual promotes to float32, as in the reference
    same_bits(got[1], want[1])
    xt = torch.from_numpy(x.astype(np.float32)).bfloat16()
    wt = torch.from_numpy(w64)
    same_bits(AL.gemma_rms_norm(xt, wt, 1e-6), RL.gemma_rms_norm(xt, wt, 1e-6))


# --- gelu and gelu_and_mul ------------------------------------------------------------------


def close_to_gelu(got, want, x):
    """Within a few ulps of (|want| + |x| + 1): for x < 0, gelu's 1 + erf (or 1 + tanh)
    cancels, so the last bit of erf or tanh is large relative to the result."""
    to64 = (lambda t: t.double().numpy()) if isinstance(got, torch.Tensor) else np.float64
    assert type(got) is type(want) and got.dtype == want.dtype and got.shape == want.shape
    got64, want64, x64 = to64(got), to64(want), to64(x)
    if got64.shape != x64.shape:  # gelu_and_mul: the scale of gate * up
        d = x64.shape[-1] // 2
        x64 = (np.abs(x64[..., :d]) + 1) * (np.abs(x64[..., d:]) + 1)
    finfo = torch.finfo(got.dtype) if isinstance(got, torch.Tensor) else np.finfo(got.dtype)
    scale = np.abs(want64) + np.abs(x64) + 1
    assert np.all(np.abs(got64 - want64) <= 4 * float(finfo.eps) * scale)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("lib,dtype", CASES)
def test_gelu_and_gelu_and_mul_match_the_reference(lib, dtype, approximate):
    rng = np.random.default_rng(17)
    x = make(rng, (48, 2 * 160), lib, dtype, 3.0)
    x[0, :5] = 0  # gelu(0) = 0 exactly
    for op in ("gelu", "gelu_and_mul"):
        out, ref = getattr(AL, op)(x, approximate), getattr(RL, op)(x, approximate)
        close_to_gelu(out, ref, x)
        zeros = out[0, :5].double().numpy() if lib == "torch" else np.float64(out[0, :5])
        assert (zeros == 0).all()


def test_gelu_erf_is_python_math_erf_within_a_few_ulps():
    """Where 1 + erf does not cancel (x >= 0), the erf form is the reference's on numpy
    (`math.erf`, correctly rounded) within a few ulps; erf's sign and edges are right."""
    x = np.concatenate([np.linspace(0, 7, 20001), [1e-300, 40.0]])
    np.testing.assert_array_max_ulp(AL.gelu(x), RL.gelu(x), maxulp=8)
    close_to_gelu(AL.gelu(-x), RL.gelu(-x), -x)
    assert np.signbit(AL.gelu(np.array([-0.0]))[0])
    assert np.isnan(AL.gelu(np.array([np.nan]))[0])
    assert AL.gelu(np.array([-40.0]))[0] == 0.0


# --- rope -------------------------------------------------------------------------------


@pytest.mark.parametrize("lib,dtype", CASES)
@pytest.mark.parametrize("is_neox", [True, False])
def test_apply_rope_matches_the_reference(lib, dtype, is_neox):
    rng = np.random.default_rng(7)
    n, head = 40, 64
    positions = rng.integers(0, 30000, n)
    q, k = make(rng, (n, 4, head), lib, dtype), make(rng, (n, 2, head), lib, dtype)
    like = q if lib == "torch" else None
    inv_freq, _ = RR.rope_inv_freq(48, 500000.0, like=like)  # partial rotary: 16 pass through
    pos = torch.from_numpy(positions) if lib == "torch" else positions.astype(np.int32)
    got, want = (
        AR.apply_rope(pos, q, k, inv_freq, 1.0693, is_neox),
        RR.apply_rope(pos, q, k, inv_freq, 1.0693, is_neox),
    )
    for g, w, x in zip(got, want, (q, k), strict=True):
        same_bits(g[..., 48:], w[..., 48:])
        same_bits(g[..., 48:], x[..., 48:])
        if dtype == "bfloat16":
            same_bits(g, w)
        elif dtype == "float16":  # a cos/sin ulp shows only where a product rounds differently
            nearly_same(g, w, max_ulps=2**20, max_fraction=1e-3)
        # float32 cos/sin: ours correctly rounded, numpy's and torch's now and then not
        g64, w64, x64 = (t.double().numpy() if lib == "torch" else np.float64(t) for t in (g, w, x))
        pair_scale = np.abs(x64).max(axis=-1, keepdims=True)
        assert np.all(np.abs(g64 - w64) <= 4e-7 * pair_scale + 2 * np.abs(w64) * 2.0**-10)


@pytest.mark.parametrize(
    "scaling",
    [
        None,
        {"rope_type": "linear", "factor": 4.0},
        {"type": "dynamic", "factor": 2.0},
        {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
        {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096},
        {"rope_type": "yarn", "factor": 8.0, "mscale": 1.0, "mscale_all_dim": 0.5},
    ],
)
def test_rope_inv_freq_matches_the_reference(scaling):
    for d, theta in [(128, 1e6), (64, 10000.0), (6, 10.0)]:
        got, scale = AR.rope_inv_freq(d, theta, scaling, 4096, 20000)
        want, ref_scale = RR.rope_inv_freq(d, theta, scaling, 4096, 20000)
        assert type(got) is np.ndarray and got.dtype == np.float32 and got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-6)
        assert type(scale) is float and scale == ref_scale
    t, _ = AR.rope_inv_freq(8, 10000.0, scaling, like=torch.zeros(1, dtype=torch.int64))
    assert isinstance(t, torch.Tensor) and t.dtype == torch.float32
    assert AR.ROPE_TYPES == RR.ROPE_TYPES


# --- results' types and layouts -----------------------------------------------------------


def test_results_are_new_arrays_in_the_inputs_library_and_dtype():
    x = torch.randn(3, 8, requires_grad=True).bfloat16()
    out, new = AL.rms_norm(x, torch.ones(8, dtype=torch.bfloat16), 1e-6, x.detach())
    assert out.dtype == new.dtype == torch.bfloat16 and not out.requires_grad
    assert AL.silu_and_mul(x).dtype == torch.bfloat16
    q = torch.randn(2, 1, 4, dtype=torch.float16)
    rq, rk = AR.apply_rope(torch.tensor([0, 3]), q, q.double(), np.ones(2, np.float32))
    assert (rq.dtype, rk.dtype) == (torch.float16, torch.float64) and rq is not q


def test_strided_views_are_read_in_place():
    rng = np.random.default_rng(11)
    wide = rng.standard_normal((6, 40)).astype(np.float32)
    x, w = wide[::2, 5:21], np.ones(16, np.float32)  # strided rows, contiguous last axis
    same_bits(AL.rms_norm(x, w, 1e-6), RL.rms_norm(np.ascontiguousarray(x), w, 1e-6))
    same_bits(AL.silu_and_mul(x), AL.silu_and_mul(np.ascontiguousarray(x)))
    qkv = torch.from_numpy(rng.standard_normal((5, 3 * 8)).astype(np.float32)).bfloat16()
    q, k, _ = qkv.split([8, 8, 8], dim=-1)
    q, k = q.reshape(5, 2, 4), k.reshape(5, 2, 4)  # token stride 24: a view, not a copy
    inv, _ = RR.rope_inv_freq(4, 10000.0, like=q)
    pos = torch.arange(5)
    for g, w_ in zip(AR.apply_rope(pos, q, k, inv), RR.apply_rope(pos, q, k, inv), strict=True):
        same_bits(g, w_)


def test_a_strided_last_axis_is_rejected_by_name():
    x = np.zeros((4, 16), np.float32)[:, ::2]
    with pytest.raises(ValueError, match="x must have a contiguous last axis"):
        AL.silu_and_mul(x)
    q = torch.zeros(2, 1, 8)[..., ::2]
    with pytest.raises(ValueError, match="query must have a contiguous last axis"):
        AR.apply_rope(torch.tensor([0, 1]), q, torch.zeros(2, 1, 4), np.ones(2, np.float32))


def test_tensors_on_other_devices_are_rejected():
    meta = torch.zeros(2, 8, device="meta")
    cpu = torch.zeros(2, 8)
    with pytest.raises(TypeError, match="x is a torch tensor on device meta"):
        AL.rms_norm(meta, torch.ones(8), 1e-6)
    with pytest.raises(TypeError, match="weight is a torch tensor on device meta"):
        AL.rms_norm(cpu, torch.ones(8, device="meta"), 1e-6)
    with pytest.raises(TypeError, match="device meta"):
        AL.silu_and_mul(meta)
    with pytest.raises(TypeError, match="query is a torch tensor on device meta"):
        AR.apply_rope(torch.arange(2), meta.reshape(2, 1, 8), cpu.reshape(2, 1, 8), np.ones(4))
    with pytest.raises(TypeError, match="like is a torch tensor on device meta"):
        AR.rope_inv_freq(8, 10000.0, like=meta)


# --- errors -----------------------------------------------------------------------------


def outcome(fn, *args):
    try:
        return fn(*args)
    except Exception as exc:  # noqa: BLE001 - the class and message are compared
        return exc


def same_error(accel_fn, ref_fn, *args):
    r, a = outcome(ref_fn, *args), outcome(accel_fn, *args)
    assert isinstance(r, Exception), f"the reference accepted {args!r}"
    assert type(a) is type(r) and str(a) == str(r), (r, a)


@pytest.mark.parametrize("lib", ["numpy", "torch"])
def test_layer_errors_are_the_references(lib):
    conv = torch.from_numpy if lib == "torch" else (lambda a: a)
    x, w = conv(np.ones((3, 4), np.float32)), conv(np.ones(4, np.float32))
    for args in [
        ([1.0, 2.0], w, 1e-6),
        (conv(np.ones((3, 4), np.int64)), w, 1e-6),
        (x, conv(np.ones(4, np.int32)), 1e-6),
        (x, conv(np.ones(5, np.float32)), 1e-6),
        (x, conv(np.ones((1, 4), np.float32)), 1e-6),
        (x, w, 0.0),
        (x, w, -1.0),
        (x, w, float("nan")),
        (x, w, 1e-6, conv(np.ones((3, 5), np.float32))),
        (conv(np.array(1.0, np.float32)), w[:1], 1e-6),
    ]:
        same_error(AL.rms_norm, RL.rms_norm, *args)
    for bad in [conv(np.ones((2, 4), np.int32)), conv(np.ones((2, 3), np.float32)), x[0, 0]]:
        same_error(AL.silu_and_mul, RL.silu_and_mul, bad)
    same_error(AL.silu_and_mul, RL.silu_and_mul, "x")
    b = conv(np.zeros(4, np.float32))
    for args in [
        (x, conv(np.ones(5, np.float32)), b, 1e-6),
        (x, w, conv(np.ones(3, np.float32)), 1e-6),
        (x, w, conv(np.ones(4, np.int32)), 1e-6),
        (x, w, [0.0] * 4, 1e-6),
        (x, w, b, 0.0),
        (x, w, b, 1e-6, conv(np.ones((3, 5), np.float32))),
        (conv(np.ones((3, 4), np.int64)), w, b, 1e-6),
    ]:
        same_error(AL.layer_norm, RL.layer_norm, *args)
    for args in [(x, conv(np.ones(3, np.float32)), 1e-6), (x, w, -1.0), ([1.0], w, 1e-6)]:
        same_error(AL.gemma_rms_norm, RL.gemma_rms_norm, *args)
    for op in ("gelu", "gelu_and_mul"):
        for args in [(x, "erf"), (x, None), (conv(np.ones((2, 4), np.int32)),), (x[0, 0],)]:
            same_error(getattr(AL, op), getattr(RL, op), *args)
    same_error(AL.gelu_and_mul, RL.gelu_and_mul, conv(np.ones((2, 3), np.float32)), "tanh")


@pytest.mark.parametrize("lib", ["numpy", "torch"])
def test_rope_errors_are_the_references(lib):
    conv = torch.from_numpy if lib == "torch" else (lambda a: a)
    pos = conv(np.arange(3))
    q, k = conv(np.ones((3, 2, 8), np.float32)), conv(np.ones((3, 1, 8), np.float32))
    inv = np.ones(4, np.float32)
    for args in [
        (pos, [[1.0]], k, inv),
        (conv(np.arange(3.0)), q, k, inv),
        (pos, conv(np.ones((3, 2, 8), np.int64)), k, inv),
        (pos, q, conv(np.ones((3, 1, 8), np.int32)), inv),
        (pos, q[:, 0], k, inv),
        (conv(np.arange(4)), q, k, inv),
        (pos, q, conv(np.ones((3, 1, 10), np.float32)), inv),
        (pos, q, k, np.ones(5, np.float32)),
    ]:
        same_error(AR.apply_rope, RR.apply_rope, *args)
    for args in [
        (7, 10000.0),
        (0, 10000.0),
        (8, 10000.0, {"rope_type": "longrope-x"}),
        (8, 10000.0, {"rope_type": "linear"}),
        (8, 10000.0, {"type": "dynamic"}),
        (8, 10000.0, {"rope_type": "llama3", "factor": 8.0}),
        (8, 10000.0, None, 2048, None, [1.0]),
        (2, 10000.0, {"type": "dynamic", "factor": 2.0}),  # ZeroDivisionError, like the reference
    ]:
        same_error(AR.rope_inv_freq, RR.rope_inv_freq, *args)


def test_native_functions_raise_instead_of_panicking():
    """Inputs the Python layer would reject, passed straight to `_native`: every one is a
    Python exception (ValueError or TypeError), none a panic or a crash."""
    f32, f64 = np.ones((3, 4), np.float32), np.ones((3, 4), np.float64)
    w = np.ones(4, np.float32)
    bad_calls = [
        (N.rms_norm, (f32, np.ones(5, np.float32), 1e-6)),
        (N.rms_norm, (f32, np.ones((1, 4), np.float32), 1e-6)),
        (N.rms_norm, (f32, w, 1e-6, np.ones((3, 5), np.float32))),
        (N.rms_norm, (f32, np.ones(4, np.float64), 1e-6)),
        (N.rms_norm, (f32, w, 1e-6, f64)),
        (N.rms_norm, (np.array(1.0, np.float32), w[:1], 1e-6)),
        (N.rms_norm, (np.ones((3, 4), np.int64), w, 1e-6)),
        (N.rms_norm, (f32[:, ::2], w[:2], 1e-6)),
        (N.silu_and_mul, (np.ones((2, 3), np.float32),)),
        (N.silu_and_mul, ([1.0, 2.0],)),
        (N.apply_rope, (np.arange(2), np.ones((3, 1, 4)), np.ones((3, 1, 4)), w[:2], 1.0, True)),
        (N.apply_rope, (np.arange(3), np.ones((3, 1, 4)), np.ones((3, 1, 4)), w, 1.0, True)),
        (N.apply_rope, (np.arange(3), np.ones((3, 4)), np.ones((3, 1, 4)), w[:2], 1.0, True)),
        (N.apply_rope, (np.arange(3.0), np.ones((3, 1, 4)), np.ones((3, 1, 4)), w[:2], 1.0, True)),
        (N.gemma_rms_norm, (f32, np.ones(5, np.float32), 1e-6)),
        (N.gemma_rms_norm, (f32, np.ones(4, np.float16), 1e-6)),
        (N.gemma_rms_norm, (f32, w, 1e-6, f64)),
        (N.layer_norm, (f32, w, np.ones(3, np.float32), 1e-6)),
        (N.layer_norm, (f64, w, w, 1e-6)),
        (N.layer_norm, (f32[:, ::2], w[:2], w[:2], 1e-6)),
        (N.gelu, (f32, "erf")),
        (N.gelu, (np.array(1.0, np.float32), "none")),
        (N.gelu_and_mul, (np.ones((2, 3), np.float32), "tanh")),
        (N.gelu_and_mul, (np.ones((2, 4), np.int32), "tanh")),
        (N.rope_inv_freq, (7, 10000.0, "default", ())),
        (N.rope_inv_freq, (8, 10000.0, "llama3", (1.0,))),
        (N.rope_inv_freq, (8, 10000.0, "dynamic", ())),
    ]
    for fn, args in bad_calls:
        with pytest.raises((ValueError, TypeError)):
            fn(*args)
    # empty inputs are valid and give empty results
    assert N.rms_norm(np.ones((0, 4), np.float32), w, 1e-6).shape == (0, 4)
    assert N.silu_and_mul(np.ones((2, 0), np.float32)).shape == (2, 0)
    assert N.layer_norm(np.ones((0, 4), np.float32), w, w, 1e-6).shape == (0, 4)
    assert N.gelu_and_mul(np.ones((2, 0), np.float32), "none").shape == (2, 0)
    assert N.gelu(np.ones((0,), np.float32), "tanh").shape == (0,)
    q, k = N.apply_rope(np.arange(0), np.ones((0, 2, 4)), np.ones((0, 1, 4)), w[:2], 1.0, True)
    assert q.shape == (0, 2, 4) and k.shape == (0, 1, 4)
