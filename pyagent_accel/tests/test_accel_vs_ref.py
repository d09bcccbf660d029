"""Differential checks of pyagent_accel.ops against pyagent_ref.ops (numpy and torch CPU).

The conformance suite (`conformance/`) is the real specification check; these are the
accelerator's own regression tests: exact bits where the module docstring promises
them, and identical exception classes and messages for bad input.

    pytest pyagent_accel/tests   (pyagent_accel installed, pyagent_ref importable;
                                  the torch cases run when torch is installed)
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from pyagent_accel.ops import hashing as AH
from pyagent_accel.ops import sampling as A

from pyagent_ref.ops import hashing as RH
from pyagent_ref.ops import sampling as R

try:
    import torch
except ImportError:  # the numpy cases still run
    torch = None

LIBS = ["numpy", "torch"] if torch is not None else ["numpy"]
needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed")
DTYPES = [np.float32, np.float64]


def as_lib(x, lib):
    if lib == "torch" and isinstance(x, np.ndarray):
        return torch.from_numpy(x)
    return x


def to_np(x):
    if torch is not None and isinstance(x, torch.Tensor):
        return x.numpy()
    return np.asarray(x)


def same_bits(a, b):
    a, b = to_np(a), to_np(b)
    assert a.dtype == b.dtype, (a.dtype, b.dtype)
    assert a.shape == b.shape, (a.shape, b.shape)
    if a.dtype.kind == "f":
        ai = a.view(np.int32 if a.dtype == np.float32 else np.int64)
        bi = b.view(np.int32 if b.dtype == np.float32 else np.int64)
        bad = np.flatnonzero(ai != bi)
        first = bad[:5]
        assert bad.size == 0, (
            f"{bad.size} mismatches, first at {first}: {a.ravel()[first]} vs {b.ravel()[first]}"
        )
    else:
        np.testing.assert_array_equal(a, b)


def same_type(a, b):
    assert type(a) is type(b), (type(a), type(b))


def make_logits(rng, b, v, dtype, scale=3.0, masked=0.0, ties=False):
    x = rng.normal(0, scale, (b, v))
    if ties:
        x = np.round(x)
    if masked:
        m = rng.random((b, v)) < masked
        m[:, 0] = False
        x[m] = -np.inf
    return x.astype(dtype)


SHAPES = [(1, 1), (1, 7), (3, 33), (5, 1000), (2, 32000), (0, 5)]


@pytest.mark.parametrize("lib", LIBS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_elementwise_ops_bit_exact(lib, dtype, shape):
    rng = np.random.default_rng(hash((lib, str(dtype), shape)) % 2**32)
    b, v = shape
    for masked, ties in ((0.0, False), (0.3, True)):
        x = make_logits(rng, b, v, dtype, masked=masked, ties=ties)
        if v > 2:
            x[:, 1] = -0.0
            x[:, 2] = 0.0
        xl = as_lib(x, lib)
        t = rng.choice([0.0, 0.5, 1.3, 1e-3], size=b)
        same_bits(R.apply_temperature(xl, as_lib(t, lib)), A.apply_temperature(xl, as_lib(t, lib)))
        for k in (rng.integers(-2, v + 3, size=b), np.full(b, 1), np.full(b, v), np.full(b, 50)):
            same_bits(R.apply_top_k(xl, as_lib(k, lib)), A.apply_top_k(xl, as_lib(k, lib)))
        n_p, n_o = rng.integers(0, 40), rng.integers(0, 40)
        pid = rng.integers(-3, v, size=(b, n_p))
        oid = rng.integers(-3, v, size=(b, n_o))
        r = rng.choice([1.0, 1.2, 0.7], size=b)
        f = rng.choice([0.0, 0.5, -0.3], size=b)
        q = rng.choice([0.0, 0.25, -1.0], size=b)
        args = [as_lib(a, lib) for a in (pid, oid, r, f, q)]
        same_bits(R.apply_penalties(xl, *args), A.apply_penalties(xl, *args))
        ids = rng.integers(-2, v, size=(b, 6))
        bias = rng.normal(0, 2, size=(b, 6))
        bias[:, 0] = -0.0
        same_bits(
            R.apply_logit_bias(xl, as_lib(ids, lib), as_lib(bias, lib)),
            A.apply_logit_bias(xl, as_lib(ids, lib), as_lib(bias, lib)),
        )


@pytest.mark.parametrize("lib", LIBS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_threshold_filters(lib, dtype, shape):
    """top-p / min-p masks agree (spec: only decisions within 1e-9 of the threshold may differ)."""
    rng = np.random.default_rng(7 + hash((lib, shape)) % 1000)
    b, v = shape
    for scale, masked, ties in ((3.0, 0.0, False), (1.0, 0.2, False), (2.0, 0.0, True)):
        x = make_logits(rng, b, v, dtype, scale=scale, masked=masked, ties=ties)
        xl = as_lib(x, lib)
        for p in (
            rng.uniform(0.01, 1.0, size=b),
            np.full(b, 1.0),
            np.full(b, 0.9),
            np.full(b, 1e-9),
        ):
            ref, acc = (
                to_np(R.apply_top_p(xl, as_lib(p, lib))),
                to_np(A.apply_top_p(xl, as_lib(p, lib))),
            )
            assert_masks_close(x, ref, acc, "top_p")
        for mp in (rng.uniform(0, 1, size=b), np.zeros(b), np.ones(b), np.full(b, 0.05)):
            ref, acc = (
                to_np(R.apply_min_p(xl, as_lib(mp, lib))),
                to_np(A.apply_min_p(xl, as_lib(mp, lib))),
            )
            assert_masks_close(x, ref, acc, "min_p")


@pytest.mark.parametrize("lib", LIBS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_typical_epsilon_eta_filters(lib, dtype, shape):
    """typical-p / epsilon / eta masks agree (only decisions within 1e-9 may differ)."""
    rng = np.random.default_rng(11 + hash((lib, shape)) % 1000)
    b, v = shape
    for scale, masked, ties in ((3.0, 0.0, False), (1.0, 0.2, False), (2.0, 0.0, True)):
        x = make_logits(rng, b, v, dtype, scale=scale, masked=masked, ties=ties)
        xl = as_lib(x, lib)
        for mass in (rng.uniform(0.01, 1.0, size=b), np.full(b, 1.0), np.full(b, 0.2)):
            ref = to_np(R.apply_typical_p(xl, as_lib(mass, lib)))
            assert_masks_close(x, ref, to_np(A.apply_typical_p(xl, as_lib(mass, lib))), "typical")
        for cut in (rng.uniform(0, 0.2, size=b), np.zeros(b), np.full(b, 3e-4)):
            for name in ("apply_epsilon_cutoff", "apply_eta_cutoff"):
                ref = to_np(getattr(R, name)(xl, as_lib(cut, lib)))
                acc = to_np(getattr(A, name)(xl, as_lib(cut, lib)))
                assert_masks_close(x, ref, acc, name)


def right_padded(rng, b, width, alphabet):
    ids = np.full((b, width), -1, np.int64)
    for row in range(b):
        n = rng.integers(0, width + 1)
        ids[row, :n] = rng.integers(0, alphabet, size=n)
    return ids


@pytest.mark.parametrize("lib", LIBS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_token_masks_bit_exact(lib, dtype, shape):
    rng = np.random.default_rng(13 + hash((lib, shape)) % 1000)
    b, v = shape
    x = make_logits(rng, b, v, dtype, masked=0.2)
    xl = as_lib(x, lib)
    alphabet = min(v, 4)
    allowed = rng.integers(-1, v, size=(b, 5))
    allowed[: b // 2] = -1
    same_bits(
        R.apply_allowed_token_ids(xl, as_lib(allowed, lib)),
        A.apply_allowed_token_ids(xl, as_lib(allowed, lib)),
    )
    tokens = as_lib(right_padded(rng, b, 200, alphabet), lib)
    words = right_padded(rng, b * 6, 3, alphabet).reshape(b, 6, 3)
    same_bits(
        R.apply_bad_words(xl, tokens, as_lib(words, lib)),
        A.apply_bad_words(xl, tokens, as_lib(words, lib)),
    )
    n = as_lib(rng.integers(0, 5, size=b), lib)
    same_bits(R.apply_no_repeat_ngram(xl, tokens, n), A.apply_no_repeat_ngram(xl, tokens, n))


@pytest.mark.parametrize("lib", LIBS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_dry_bit_exact(lib, dtype, shape):
    """DRY: the same penalties to the bit, loops (long repeats), breakers, windows and
    penalties past the dtype (clamped) included."""
    rng = np.random.default_rng(17 + hash((lib, shape)) % 1000)
    b, v = shape
    x = make_logits(rng, b, v, dtype, masked=0.2)
    xl = as_lib(x, lib)
    alphabet = min(v, 4)
    tokens = right_padded(rng, b, 300, alphabet)
    tokens[: b // 2, :40] = np.tile(np.arange(4) % alphabet, 10)  # a loop
    breakers = as_lib(rng.integers(-1, alphabet, size=(b, 2)), lib)
    for multiplier, base in ((0.8, 1.75), (3.0, 2.0), (1e300, 1e30)):
        args = (
            as_lib(tokens, lib),
            as_lib(np.where(rng.random(b) < 0.2, 0.0, multiplier), lib),
            as_lib(np.full(b, base), lib),
            as_lib(rng.integers(1, 4, size=b), lib),
            as_lib(rng.integers(-1, 50, size=b), lib),
            breakers,
        )
        same_bits(R.apply_dry(xl, *args), A.apply_dry(xl, *args))


@pytest.mark.parametrize("lib", LIBS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_xtc_and_mirostat(lib, dtype, shape):
    """XTC and mirostat masks agree (only decisions within 1e-9 may differ); the mirostat
    update within a few ulp."""
    rng = np.random.default_rng(19 + hash((lib, shape)) % 1000)
    b, v = shape
    seeds = as_lib(rng.integers(-(2**63), 2**63 - 1, size=b), lib)
    positions = as_lib(rng.integers(0, 1000, size=b), lib)
    for scale, masked in ((3.0, 0.0), (1.0, 0.2), (0.3, 0.0)):
        x = make_logits(rng, b, v, dtype, scale=scale, masked=masked)
        xl = as_lib(x, lib)
        for threshold, probability in ((0.1, 1.0), (0.01, 0.5), (0.3, 0.0)):
            args = (as_lib(np.full(b, threshold), lib), as_lib(np.full(b, probability), lib))
            ref = to_np(R.apply_xtc(xl, *args, seeds, positions))
            assert_masks_close(x, ref, to_np(A.apply_xtc(xl, *args, seeds, positions)), "xtc")
        for mu in (np.full(b, np.inf), rng.uniform(-1, 12, size=b)):
            ref = to_np(R.apply_mirostat(xl, as_lib(mu, lib)))
            acc = to_np(A.apply_mirostat(xl, as_lib(mu, lib)))
            assert_masks_close(x, ref, acc, "mirostat")
            drawn = as_lib(np.argmax(ref, axis=1), lib)
            more = [as_lib(np.where(np.isfinite(mu), mu, 10.0), lib)]
            more += [as_lib(np.full(b, 5.0), lib), as_lib(np.full(b, 0.1), lib)]
            want = to_np(R.mirostat_update(as_lib(ref, lib), drawn, *more))
            got = to_np(A.mirostat_update(as_lib(ref, lib), drawn, *more))
            np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def assert_masks_close(x, ref, acc, what):
    # kept entries keep their bits; only the mask may differ, and only at the threshold
    diff = (ref == -np.inf) != (acc == -np.inf)
    assert not diff.any(), f"{what}: {int(diff.sum())} decisions differ at {np.argwhere(diff)[:5]}"
    same_bits(ref, acc)


@pytest.mark.parametrize("lib", LIBS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_log_softmax_close(lib, dtype):
    rng = np.random.default_rng(3)
    for shape in SHAPES:
        x = make_logits(rng, *shape, dtype, masked=0.1)
        ref = to_np(R.log_softmax(as_lib(x, lib)))
        acc = to_np(A.log_softmax(as_lib(x, lib)))
        assert ref.dtype == acc.dtype
        np.testing.assert_array_equal(np.isneginf(ref), np.isneginf(acc))
        fin = np.isfinite(ref)
        eps = np.finfo(dtype).eps
        tol = 2 * eps * np.maximum(1.0, np.abs(ref[fin]))
        assert np.all(np.abs(ref[fin] - acc[fin]) <= tol)


@pytest.mark.parametrize("lib", LIBS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_topk_logprobs_exact(lib, dtype):
    rng = np.random.default_rng(11)
    for b, v in SHAPES:
        x = make_logits(rng, b, v, dtype, ties=True, masked=0.2)
        if v > 3:
            x[:, 1], x[:, 3] = -0.0, 0.0
        s = rng.integers(0, v, size=b)
        for num in sorted({0, 1, min(5, v), v}):
            ref = R.topk_logprobs(as_lib(x, lib), num, as_lib(s, lib))
            acc = A.topk_logprobs(as_lib(x, lib), num, as_lib(s, lib))
            for r_, a_ in zip(ref, acc, strict=True):
                same_type(r_, a_)
                same_bits(r_, a_)


@pytest.mark.parametrize("lib", LIBS)
def test_philox_bit_exact(lib):
    rng = np.random.default_rng(5)
    seeds = np.array([0, 1, -1, 2**63 - 1, -(2**63), 12345678901234], dtype=np.int64)
    pos = np.array([0, 1, 2**32 + 5, 7, 2**40, 3], dtype=np.int64)
    for num in (0, 1, 2, 3, 31, 32, 33, 1001):
        same_bits(
            R.philox_uniform(as_lib(seeds, lib), as_lib(pos, lib), num),
            A.philox_uniform(as_lib(seeds, lib), as_lib(pos, lib), num),
        )
    useeds = np.array([0, 2**64 - 1, 2**63], dtype=np.uint64)
    same_bits(R.philox_uniform(useeds, [1, 2, 3], 9), A.philox_uniform(useeds, [1, 2, 3], 9))
    words = [as_lib(rng.integers(0, 2**32, size=17), lib) for _ in range(6)]
    for r_, a_ in zip(
        R._philox4x32_10(words[:4], words[4:]), A._philox4x32_10(words[:4], words[4:]), strict=True
    ):
        same_type(r_, a_)
        same_bits(r_, a_)


@pytest.mark.parametrize("lib", LIBS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_sample_same_tokens(lib, dtype):
    rng = np.random.default_rng(17)
    for b, v in [(1, 1), (4, 5), (16, 1000), (8, 32000)]:
        for scale, masked in ((3.0, 0.0), (0.5, 0.5), (10.0, 0.0)):
            x = make_logits(rng, b, v, dtype, scale=scale, masked=masked)
            t = rng.choice([0.0, 1.0, 0.7], size=b)
            seeds = rng.integers(-(2**63), 2**63 - 1, size=b)
            pos = rng.integers(0, 2**35, size=b)
            args = [as_lib(a, lib) for a in (x, t, seeds, pos)]
            ref, acc = R.sample(*args), A.sample(*args)
            same_type(ref, acc)
            same_bits(ref, acc)


def test_sample_uniform_logits_many_seeds():
    """Flat rows exercise the pruning bound hardest (every token is a contender)."""
    x = np.zeros((64, 4096), np.float32)
    seeds = np.arange(64) * 7919
    ref = R.sample(x, np.ones(64), seeds, np.arange(64))
    acc = A.sample(x, np.ones(64), seeds, np.arange(64))
    same_bits(ref, acc)


@needs_torch
def test_torch_outputs_are_tensors_and_inputs_untouched():
    x = torch.randn(3, 50)
    before = x.clone()
    out = A.apply_top_k(x, torch.tensor([3, 0, 5]))
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float32
    assert torch.equal(x, before)


# --- errors -----------------------------------------------------------------------------


def outcome(fn, *args):
    try:
        fn(*args)
    except Exception as e:  # noqa: BLE001
        return type(e), str(e)
    return None


def same_error(name, *args, mod=(R, A)):
    ref, acc = (outcome(getattr(m, name), *args) for m in mod)
    assert ref == acc, f"{name}: ref {ref} vs accel {acc}"


X = np.zeros((2, 4), np.float32)
XN = X.copy()
XN[1, 2] = np.nan
XI = X.copy()
XI[0, :] = -np.inf
XM = X.copy()
XM[1, 1] = -np.inf  # mirostat_update: the sampled token of row 1 is masked


@pytest.mark.parametrize(
    "name,args",
    [
        ("apply_temperature", ([[1.0]], [1.0])),
        ("apply_temperature", (X.astype(np.int32), [1.0, 1.0])),
        ("apply_temperature", (X.astype(np.float16), [1.0, 1.0])),
        ("apply_temperature", (X[0], [1.0])),
        ("apply_temperature", (np.zeros((2, 0), np.float32), [1.0, 1.0])),
        ("apply_temperature", (XN, [1.0, 1.0])),
        ("apply_temperature", (XI, [1.0, 1.0])),
        ("apply_temperature", (XN, [1.0])),
        ("apply_temperature", (XI, ["a", "b"])),
        ("apply_temperature", (X, [1.0])),
        ("apply_temperature", (X, 1.0)),
        ("apply_temperature", (X, [1.0, -1.0])),
        ("apply_temperature", (X, [1.0, np.inf])),
        ("apply_temperature", (X, [1.0, np.nan])),
        ("apply_temperature", (X, np.array([True, False]))),
        ("apply_temperature", (X, ["x", 1.0])),
        ("apply_temperature", (X, [None, 1.0])),
        ("apply_top_k", (X, [1.5, 2.0])),
        ("apply_top_k", (X, np.array([1.0, 2.0]))),
        ("apply_top_k", (X, [1, 2, 3])),
        ("apply_top_k", (XN, np.array([1.0, 2.0]))),
        ("apply_top_k", (X, [2**70, 1])),
        ("apply_top_p", (X, [0.0, 1.0])),
        ("apply_top_p", (X, [0.5, 1.5])),
        ("apply_top_p", (X, [0.5, np.nan])),
        ("apply_top_p", (XI, [0.5, 1.5])),
        ("apply_min_p", (X, [-0.1, 1.0])),
        ("apply_min_p", (X, [0.1, 1.0000001])),
        ("apply_min_p", (X, np.array(["a", "b"]))),
        ("apply_typical_p", (X, [0.0, 1.0])),
        ("apply_typical_p", (X, [0.5, np.nan])),
        ("apply_typical_p", (XI, [0.5, 1.0])),
        ("apply_epsilon_cutoff", (X, [0.1, 1.0])),
        ("apply_epsilon_cutoff", (X, [-0.1, 0.0])),
        ("apply_eta_cutoff", (X, [0.1, 1.5])),
        ("apply_eta_cutoff", (X, [0.1])),
        ("apply_allowed_token_ids", (X, [[1], [4]])),
        ("apply_allowed_token_ids", (X, np.array([[1.0], [2.0]]))),
        ("apply_allowed_token_ids", (X, [1, 2])),
        ("apply_bad_words", (X, [[1, -1, 2], [0, 0, 0]], np.zeros((2, 1, 1), np.int64))),
        ("apply_bad_words", (X, [[1], [2]], np.array([[[1, -1, 1]], [[0, 0, 0]]]))),
        ("apply_bad_words", (X, [[1], [2]], np.array([[[4]], [[0]]]))),
        ("apply_bad_words", (X, [[1], [2]], np.zeros((2, 1)))),
        ("apply_bad_words", (X, [[1], [2]], np.zeros((2, 1), np.int64))),
        ("apply_no_repeat_ngram", (X, [[1], [2]], [1, -2])),
        ("apply_no_repeat_ngram", (X, [[1], [2]], [1.0, 2.0])),
        ("apply_no_repeat_ngram", (X, [[-1], [2]], [1, 2, 3])),
        ("apply_no_repeat_ngram", (X, [[-1, 3], [2, 2]], [1, 2])),
        ("apply_dry", (X, [[1], [2]], [1.0, -1.0], [2.0, 2.0], [1, 1], [-1, -1], [[-1], [-1]])),
        ("apply_dry", (X, [[1], [2]], [1.0, 1.0], [2.0, 1.0], [1, 1], [-1, -1], [[-1], [-1]])),
        ("apply_dry", (X, [[1], [2]], [1.0, 1.0], [2.0, 2.0], [1, 0], [-1, -1], [[-1], [-1]])),
        ("apply_dry", (X, [[1], [2]], [1.0, 1.0], [2.0, 2.0], [1, 1], [-1, -2], [[-1], [-1]])),
        ("apply_dry", (X, [[1], [2]], [1.0, 1.0], [2.0, 2.0], [1.0, 1.0], [-1, -1], [[-1], [1]])),
        ("apply_dry", (X, [[1], [2]], [1.0, 1.0], [2.0, 2.0], [1, 1], [-1, -1], [[-1], [9]])),
        (
            "apply_dry",
            (X, [[-1, 1], [2, 2]], [1.0, 1.0], [2.0, 2.0], [1, 1], [-1, -1], [[-1], [1]]),
        ),
        ("apply_dry", (XN, [[1], [2]], [1.0, 1.0], [2.0, 2.0], [1, 0], [-1, -1], [[-1], [1]])),
        ("apply_xtc", (X, [0.1, 1.5], [1.0, 1.0], np.array([1, 2]), [0, 0])),
        ("apply_xtc", (X, [0.1, 0.1], [np.nan, 1.0], np.array([1, 2]), [0, 0])),
        ("apply_xtc", (X, [0.1, 0.1], [1.0, 1.0], np.array([1.0, 2.0]), [0, 0])),
        ("apply_xtc", (X, [0.1, 0.1], [1.0, 1.0], np.array([1, 2]), [0, -3])),
        ("apply_xtc", (XN, [0.1, 2.0], [1.0, 1.0], np.array([1, 2]), [0, 0])),
        ("apply_mirostat", (X, [1.0, np.nan])),
        ("apply_mirostat", (X, [1.0])),
        ("apply_mirostat", (XI, [1.0, 2.0])),
        ("mirostat_update", (X, [0, 4], [1.0, 1.0], [5.0, 5.0], [0.1, 0.1])),
        ("mirostat_update", (X, [0, 1], [1.0, np.inf], [5.0, 5.0], [0.1, 0.1])),
        ("mirostat_update", (X, [0, 1], [1.0, 1.0], [0.0, 5.0], [0.1, 0.1])),
        ("mirostat_update", (X, [0, 1], [1.0, 1.0], [5.0, 5.0], [0.1, 1.5])),
        ("mirostat_update", (X, [0.0, 1.0], [1.0, 1.0], [5.0, 5.0], [0.1, 0.1])),
        ("mirostat_update", (XM, [0, 1], [1.0, 1.0], [5.0, 5.0], [0.1, 0.1])),
        ("mirostat_update", (XN, [0, 1], [1.0, 1.0], [5.0, -5.0], [0.1, 0.1])),
        ("apply_penalties", (X, [[1]], [[1], [2]], [1, 1], [0, 0], [0, 0])),
        ("apply_penalties", (X, [[1], [4]], [[1], [2]], [1, 1], [0, 0], [0, 0])),
        ("apply_penalties", (X, np.array([[1.0], [2.0]]), [[1], [2]], [1, 1], [0, 0], [0, 0])),
        ("apply_penalties", (X, [[1], [2]], [[1], [2]], [1, 0], [0, 0], [0, 0])),
        ("apply_penalties", (X, [[1], [2]], [[1], [2]], [1, 1], [0, np.inf], [0, 0])),
        ("apply_penalties", (X, [[1], [2]], [[1], [2]], [1, 1], [0, 0], [np.nan, 0])),
        ("apply_penalties", (XN, [[1], [9]], [[1], [2]], [1, 1], [0, 0], [0, 0])),
        ("apply_penalties", (X, [[1], [2]], [[1], [2]], [1, 1], [0, 0], [0])),
        ("apply_logit_bias", (X, [[1], [2]], [[1.0], [np.inf]])),
        ("apply_logit_bias", (X, [[1], [2]], [[1.0, 2.0], [1.0, 2.0]])),
        ("apply_logit_bias", (X, [[1], [2]], np.array([["a"], ["b"]]))),
        ("apply_logit_bias", (X, [[1], [7]], [[1.0], [2.0]])),
        ("apply_logit_bias", (X, np.array([[1.0], [2.0]]), [[1.0], [2.0]])),
        ("log_softmax", (XN,)),
        ("log_softmax", (XI,)),
        ("log_softmax", (X[None],)),
        ("topk_logprobs", (X, 1.0, [0, 1])),
        ("topk_logprobs", (X, True, [0, 1])),
        ("topk_logprobs", (X, 5, [0, 1])),
        ("topk_logprobs", (X, -1, [0, 1])),
        ("topk_logprobs", (X, 2, [0, 4])),
        ("topk_logprobs", (X, 2, [-1, 0])),
        ("topk_logprobs", (X, 2, [0.5, 0])),
        ("topk_logprobs", (XN, 7, [0, 1])),
        ("philox_uniform", ([1, 2], [0, 0], 3)),
        ("philox_uniform", (np.array([1.0, 2.0]), [0, 0], 3)),
        ("philox_uniform", (np.array([[1, 2]]), [0, 0], 3)),
        ("philox_uniform", (np.array([1, 2]), [0, 0], 3.0)),
        ("philox_uniform", (np.array([1, 2]), [0, 0], -1)),
        ("philox_uniform", (np.array([1, 2]), [0, -5], 3)),
        ("philox_uniform", (np.array([1, 2]), [0], 3)),
        ("philox_uniform", (np.array([1, 2]), np.array([0.0, 1.0]), 3)),
        ("sample", (X, [1.0, 1.0], [1.0, 2.0], [0, 0])),
        ("sample", (X, [1.0, 1.0], np.array([1.0, 2.0]), [0, 0])),
        ("sample", (X, [1.0, -1.0], [1, 2], [0, 0])),
        ("sample", (X, [1.0, -1.0], [1, 2], [0])),
        ("sample", (X, [1.0, 1.0], [1, 2], [0, -1])),
        ("sample", (XI, [1.0, 1.0], [1, 2], [0, -1])),
        ("sample", (X, [1.0, 1.0], [1, 2], [0])),
    ],
)
def test_errors_match(name, args):
    same_error(name, *args)


@pytest.mark.parametrize("lib", LIBS)
def test_errors_match_torch(lib):
    x = as_lib(XN, lib)
    same_error("apply_top_k", x, as_lib(np.array([1, 2]), lib))
    same_error("apply_top_k", as_lib(X, lib), as_lib(np.array([1.0, 2.0]), lib))
    same_error("apply_top_p", as_lib(X, lib), as_lib(np.array([1.0, 2.0]), lib))
    same_error(
        "sample",
        as_lib(X, lib),
        [1, 1],
        as_lib(np.array([1, 2]), lib),
        as_lib(np.array([0, -3]), lib),
    )


@pytest.mark.parametrize("lib", LIBS)
def test_row_strided_views_are_read_in_place(lib):
    rng = np.random.default_rng(2)
    padded = rng.normal(0, 3, (9, 1040)).astype(np.float32)
    for view in (padded[:, :1000], padded[::2, 5:1005], padded[::-1, :1000]):
        x = as_lib(np.ascontiguousarray(view), lib)
        v = as_lib(view, lib) if lib == "numpy" or view.strides[0] > 0 else None
        if v is None:
            continue  # torch has no negative strides
        b = view.shape[0]
        same_bits(R.apply_top_k(x, np.full(b, 7)), A.apply_top_k(v, np.full(b, 7)))
        same_bits(R.apply_min_p(x, np.full(b, 0.1)), A.apply_min_p(v, np.full(b, 0.1)))
        same_bits(
            R.sample(x, np.ones(b), np.arange(b), np.arange(b)),
            A.sample(v, np.ones(b), np.arange(b), np.arange(b)),
        )
        for r_, a_ in zip(
            R.topk_logprobs(x, 3, np.zeros(b, np.int64)),
            A.topk_logprobs(v, 3, np.zeros(b, np.int64)),
            strict=True,
        ):
            same_bits(r_, a_)


@needs_torch
def test_strided_rows_and_cuda_are_rejected():
    x = np.zeros((4, 6), np.float32)[:, ::2]
    with pytest.raises(ValueError, match="contiguous rows"):
        A.apply_top_k(x, [1, 1, 1, 1])
    t = torch.zeros(6, 4).T
    with pytest.raises(ValueError, match="contiguous rows"):
        A.log_softmax(t)
    meta = torch.zeros(2, 3, device="meta")
    with pytest.raises(TypeError, match="CPU"):
        A.log_softmax(meta)


# --- hashing ----------------------------------------------------------------------------


@pytest.mark.parametrize("algorithm", ["sha256", "xxh3_128"])
def test_hash_blocks_bit_exact(algorithm):
    rng = np.random.default_rng(1)
    for n, bs in [(0, 16), (15, 16), (16, 16), (100, 16), (1000, 7), (257, 1)]:
        toks = rng.integers(0, 2**17, size=n).astype(np.uint64)
        if n:
            toks[0] = 2**64 - 1
        as_list = [int(t) for t in toks]
        nb = n // bs
        keys = [[("lora", i), ("mm", b"h" * (i % 3), i), ("salt", "s")][: i % 4] for i in range(nb)]
        small = toks[toks < 2**63].astype(np.int64)
        inputs = [as_list, tuple(as_list), toks, small, small.astype(np.int32)]
        if torch is not None:
            inputs.append(torch.from_numpy(small))
        for tokens in inputs:
            m = len(tokens) // bs
            for ek in (None, keys[:m] if m == nb else None):
                ref = RH.hash_blocks(tokens, bs, ek, algorithm)
                acc = AH.hash_blocks(tokens, bs, ek, algorithm)
                assert ref == acc
        parent = RH.hash_block(RH.root_hash(algorithm), [1, 2, 3], [("salt", "x")], algorithm)
        assert parent == AH.hash_block(
            AH.root_hash(algorithm), [1, 2, 3], [("salt", "x")], algorithm
        )
        assert RH.hash_blocks(as_list, bs, None, algorithm, parent) == AH.hash_blocks(
            as_list, bs, None, algorithm, bytearray(parent)
        )


def test_cbor_encode_matches():
    values = [
        0,
        23,
        24,
        255,
        256,
        65535,
        65536,
        2**32 - 1,
        2**32,
        2**64 - 1,
        -1,
        -24,
        -25,
        -(2**63),
        -(2**64),
        b"",
        b"abc",
        bytearray(b"xy"),
        "",
        "IETF",
        "\u00fc\u6c34\U00010151",
        [],
        (),
        [1, [2, 3], (4, "5", b"6")],
        list(range(30)),
    ]
    for v in values:
        assert RH.cbor_encode(v) == AH.cbor_encode(v), v
    for bad in [
        True,
        1.5,
        None,
        {1: 2},
        [1, False],
        2**64,
        -(2**64) - 1,
        [2**70],
        "\ud800",
        object(),
    ]:
        ref, acc = outcome(RH.cbor_encode, bad), outcome(AH.cbor_encode, bad)
        assert ref is not None and ref[0] is acc[0], (bad, ref, acc)
        if ref[0] is not UnicodeEncodeError:
            assert ref == acc, (bad, ref, acc)
    cyc: list = []
    cyc.append(cyc)
    with pytest.raises(RecursionError):
        AH.cbor_encode(cyc)


@pytest.mark.parametrize(
    "name,args",
    [
        ("hash_block", (b"x" * 32, [1], (), "md5")),
        ("hash_block", (b"x" * 31, [1])),
        ("hash_block", ("x" * 32, [1])),
        ("hash_block", (b"x" * 32, [1, True])),
        ("hash_block", (b"x" * 32, [1, 1.0])),
        ("hash_block", (b"x" * 32, [1, -1])),
        ("hash_block", (b"x" * 32, [1, 2**64])),
        ("hash_block", (b"x" * 32, np.array([1, -2]))),
        ("hash_block", (b"x" * 32, np.array([1.0]))),
        ("hash_block", (b"x" * 32, np.array([[1]]))),
        ("hash_block", (b"x" * 32, "abc")),
        ("hash_block", (b"x" * 32, 5)),
        ("hash_block", (b"x" * 32, [1], "lora")),
        ("hash_block", (b"x" * 32, [1], [("lora",)])),
        ("hash_block", (b"x" * 32, [1], [()])),
        ("hash_block", (b"x" * 32, [1], [("nope", 1)])),
        ("hash_block", (b"x" * 32, [1], [(["l"], 1)])),
        ("hash_block", (b"x" * 32, [1], [("lora", 1.0)])),
        ("hash_block", (b"x" * 32, [1], [("lora", True)])),
        ("hash_block", (b"x" * 32, [1], [("lora", 2**70)])),
        ("hash_block", (b"x" * 32, [1], [("mm", "h", -1)])),
        ("hash_block", (b"x" * 32, [1], [("mm", bytearray(b"h"), 1)])),
        ("hash_block", (b"x" * 32, [1], [("salt", 1)])),
        ("hash_block", (b"x" * 32, [1], [("salt", "a", "b")])),
        ("hash_blocks", ([1, 2, 3], 0)),
        ("hash_blocks", ([1, 2, 3], 1.0)),
        ("hash_blocks", ([1, 2, 3], True)),
        ("hash_blocks", ([1, 2, 3], 1, None, "md5")),
        ("hash_blocks", ([1, 2, 3], 1, None, "sha256", b"x")),
        ("hash_blocks", ([1, 2, 3], 1, [(), ()])),
        ("hash_blocks", ([1, 2, 3], 1, [(), (), [("x",)]])),
        ("hash_blocks", ([1, 2, 3], 1, [(), ("lora", 1), ()])),
        ("hash_blocks", ([1, "2", 3], 1, [(), ()])),
        ("hash_blocks", (iter([1, 2]), 1)),
        ("root_hash", ("md5",)),
        ("root_hash", (["sha256"],)),
    ],
)
def test_hash_errors_match(name, args):
    same_error(name, *args, mod=(RH, AH))


def test_hash_sequences_and_ranges():
    assert RH.hash_blocks(range(64), 16) == AH.hash_blocks(range(64), 16)
    big = 2**64 - 1
    assert RH.hash_block(RH.root_hash(), [big, 0]) == AH.hash_block(AH.root_hash(), [big, 0])
    assert math.isclose(len(AH.hash_blocks(list(range(100)), 10)), 10)
