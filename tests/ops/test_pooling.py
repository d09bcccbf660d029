"""ops.pooling on hand-computed cases, against torch's and sentence-transformers' own
functions, and the accelerator against the reference in every dtype (the conformance
suite covers the drawn cases)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

# three requests of 2, 1 and 3 rows, then a padding row
HIDDEN = np.arange(14, dtype=np.float32).reshape(7, 2)
QSL = np.array([0, 2, 3, 6])


@pytest.mark.parametrize(
    ("pooling_type", "want"),
    [
        ("last", [[2, 3], [4, 5], [10, 11]]),
        ("cls", [[0, 1], [4, 5], [6, 7]]),
        ("mean", [[1, 2], [4, 5], [8, 9]]),
        ("all", np.arange(12).reshape(6, 2)),
    ],
)
def test_pool_by_hand(ops, lib, pooling_type, want):
    out = ops.pooling.pool(lib(HIDDEN), lib(QSL, "int64"), pooling_type)
    assert lib.np(out).dtype == np.float32
    np.testing.assert_array_equal(lib.np(out), np.array(want, np.float32))


def test_pool_of_no_requests_and_errors_name_the_request(ops):
    assert ops.pooling.pool(HIDDEN, np.array([0]), "mean").shape == (0, 2)
    with pytest.raises(ValueError, match="request 1 has no tokens"):
        ops.pooling.pool(HIDDEN, np.array([0, 2, 2, 4]), "mean")
    with pytest.raises(ValueError, match=r"query_start_loc must lie in \[0, 7\]"):
        ops.pooling.pool(HIDDEN, np.array([0, 8]), "last")
    with pytest.raises(ValueError, match="pooling_type must be one of"):
        ops.pooling.pool(HIDDEN, QSL, "max")
    with pytest.raises(TypeError, match="hidden must be a float array"):
        ops.pooling.pool(HIDDEN.astype(np.int64), QSL, "cls")


def test_normalize_matryoshka_and_zero_rows(ops, lib):
    x = np.array([[3.0, 4.0, 12.0], [0.0, 0.0, 0.0]])
    np.testing.assert_allclose(
        lib.np(ops.pooling.normalize(lib(x, "float64"))), [[3 / 13, 4 / 13, 12 / 13], [0, 0, 0]]
    )
    np.testing.assert_allclose(
        lib.np(ops.pooling.normalize(lib(x, "float64"), 2)), [[0.6, 0.8], [0, 0]]
    )
    with pytest.raises(ValueError, match=r"dimensions must be in \[1, 3\]"):
        ops.pooling.normalize(x, 4)
    with pytest.raises(TypeError, match="dimensions must be an int"):
        ops.pooling.normalize(x, True)


def test_normalize_equals_torch_f_normalize(ops):
    x = torch.randn(9, 24, generator=torch.Generator().manual_seed(0))
    want = torch.nn.functional.normalize(x, dim=1)
    torch.testing.assert_close(ops.pooling.normalize(x), want, rtol=1e-6, atol=1e-7)
    short = torch.nn.functional.normalize(x[:, :8], dim=1)
    torch.testing.assert_close(ops.pooling.normalize(x, 8), short, rtol=1e-6, atol=1e-7)


def test_classify_equals_torch_softmax_and_sigmoid(ops):
    logits = torch.randn(5, 4, generator=torch.Generator().manual_seed(1)) * 30
    torch.testing.assert_close(ops.pooling.classify(logits), torch.softmax(logits, dim=1))
    torch.testing.assert_close(ops.pooling.classify(logits, "sigmoid"), torch.sigmoid(logits))
    torch.testing.assert_close(ops.pooling.classify(logits, "none"), logits)
    big = np.array([[1000.0, 1000.0, -1000.0]], np.float32)
    np.testing.assert_array_equal(np.asarray(ops.pooling.classify(big)), [[0.5, 0.5, 0.0]])
    with pytest.raises(ValueError, match="logits row 0 contains NaN or inf"):
        ops.pooling.classify(np.array([[0.0, np.inf]]))
    with pytest.raises(ValueError, match="activation must be one of"):
        ops.pooling.classify(big, "relu")


def test_cosine_equals_torch_and_sentence_transformers(ops):
    a = torch.randn(6, 16, generator=torch.Generator().manual_seed(2))
    b = torch.randn(6, 16, generator=torch.Generator().manual_seed(3))
    b[0] = -2 * a[0]
    a[1] = 0
    want = torch.nn.functional.cosine_similarity(a, b, dim=1)
    got = ops.pooling.cosine_similarity(a, b)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)
    assert got[1] == 0 and abs(float(got[0]) + 1) < 1e-6
    util = pytest.importorskip("sentence_transformers.util")
    torch.testing.assert_close(got, util.pairwise_cos_sim(a, b), rtol=1e-6, atol=1e-7)
    with pytest.raises(ValueError, match="a and b must have the same shape"):
        ops.pooling.cosine_similarity(a, b[:, :3])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_accel_equals_ref_in_every_dtype(dtype):
    from tests.conftest import _load

    ref, accel = _load("ref").pooling, _load("accel").pooling
    gen = torch.Generator().manual_seed(4)
    hidden = (torch.randn(40, 24, generator=gen) * 3).to(dtype)
    qsl = torch.tensor([0, 7, 8, 20, 39])
    tol = dict(rtol=1e-5, atol=1e-6) if dtype != torch.float64 else dict(rtol=1e-12, atol=1e-13)
    for kind in ("last", "cls", "mean", "all"):
        got, want = accel.pool(hidden, qsl, kind), ref.pool(hidden, qsl, kind)
        assert got.dtype == want.dtype
        torch.testing.assert_close(got, want, **tol)
    torch.testing.assert_close(accel.normalize(hidden, 5), ref.normalize(hidden, 5), **tol)
    torch.testing.assert_close(accel.classify(hidden), ref.classify(hidden), **tol)
    torch.testing.assert_close(
        accel.cosine_similarity(hidden, hidden.flip(0)),
        ref.cosine_similarity(hidden, hidden.flip(0)),
        **tol,
    )
