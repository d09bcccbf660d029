"""pyagent_accel.ops.structured against pyagent_ref (numpy and torch CPU, all float dtypes).

The op only copies or masks, so results are compared bit for bit, on the sizes a real
vocabulary has (128256 tokens) and on the edges: masks narrower and wider than the
logits, strided views, and the same exception (class and message) for each bad input
and for tensors on other devices. The conformance suite
(`python -m conformance pyagent_accel structured`) is the specification check; these
are the accelerator's regression tests.
"""

from __future__ import annotations

import numpy as np
import pytest
from pyagent_accel.ops import structured as A

from pyagent_ref.ops import structured as R

torch = pytest.importorskip("torch")

FLOATS = ["float16", "bfloat16", "float32", "float64"]
# (library, dtype) pairs the reference runs on: numpy has no bfloat16
CASES = [("numpy", d) for d in FLOATS if d != "bfloat16"] + [("torch", d) for d in FLOATS]


def bits(x):
    """The bit patterns of a float array or tensor, as signed ints."""
    if isinstance(x, torch.Tensor):
        x = x.view(torch.int16) if x.dtype == torch.bfloat16 else x
        x = x.numpy()
    return x.view({2: np.int16, 4: np.int32, 8: np.int64}[x.itemsize]).astype(np.int64)


def same_bits(got, want):
    assert type(got) is type(want) and got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(bits(got), bits(want))


def inputs(lib, dtype, batch, vocab, words, seed=0):
    """Logits with NaN, +inf and -inf among them, and a mask mixing all-zero, all-one and
    random words."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch, vocab)).astype(np.float32)
    step = max(vocab // 3, 1)
    x.flat[::step], x.flat[1::step], x[:, -1:] = np.nan, -np.inf, np.inf
    kind = rng.integers(0, 3, (batch, words))
    random = rng.integers(-(2**31), 2**31, (batch, words), dtype=np.int64).astype(np.int32)
    mask = np.where(kind == 0, 0, np.where(kind == 1, -1, random)).astype(np.int32)
    if lib == "numpy":
        return x.astype(dtype), mask
    return torch.from_numpy(x).to(getattr(torch, dtype)), torch.from_numpy(mask)


@pytest.mark.parametrize(("lib", "dtype"), CASES)
@pytest.mark.parametrize(
    ("batch", "vocab", "words"),
    [(1, 128256, 4008), (3, 1000, 32), (2, 1000, 40), (2, 1000, 30), (4, 7, 0), (0, 5, 1)],
)
def test_same_bits_as_the_reference(lib, dtype, batch, vocab, words):
    logits, mask = inputs(lib, dtype, batch, vocab, words)
    same_bits(A.apply_token_bitmask(logits, mask), R.apply_token_bitmask(logits, mask))


@pytest.mark.parametrize(("lib", "dtype"), CASES)
def test_strided_views_are_read_in_place(lib, dtype):
    logits, mask = inputs(lib, dtype, 4, 300, 10)
    views = [
        (logits[::2, ::3], mask[::2]),  # strided logits rows and columns
        (logits[:, :200], mask[:, ::2][:, :7]),  # strided words
        (logits.T.contiguous().T if lib == "torch" else np.asfortranarray(logits), mask),
    ]
    for x, m in views:
        same_bits(A.apply_token_bitmask(x, m), R.apply_token_bitmask(x, m))


def test_torch_bitmask_with_numpy_logits_and_back():
    logits, mask = inputs("numpy", "float32", 2, 100, 4)
    t_mask = torch.from_numpy(mask)
    same_bits(A.apply_token_bitmask(logits, t_mask), R.apply_token_bitmask(logits, t_mask))
    t_logits = torch.from_numpy(logits)
    same_bits(A.apply_token_bitmask(t_logits, mask), R.apply_token_bitmask(t_logits, mask))


def test_inputs_are_not_modified():
    logits, mask = inputs("torch", "bfloat16", 2, 100, 4)
    before = logits.clone()
    out = A.apply_token_bitmask(logits, mask)
    same_bits(logits, before)
    assert out.data_ptr() != logits.data_ptr()


def _error(fn, *args):
    try:
        fn(*args)
    except Exception as exc:  # noqa: BLE001 - the class and message are compared
        return type(exc), str(exc)
    return None


def test_errors_are_the_references():
    x, m = np.zeros((2, 40), np.float32), np.zeros((2, 2), np.int32)
    bad = [
        (np.zeros((2, 40), np.int64), m),
        ([[0.0]], m),
        (x[0], m),
        (x, m.astype(np.int64)),
        (x, m.view(np.uint32)),
        (x, [[0, 0]]),
        (x, m[0]),
        (x, np.zeros((3, 2), np.int32)),
        (torch.zeros(2, 40, dtype=torch.int32), m),
    ]
    for args in bad:
        want = _error(R.apply_token_bitmask, *args)
        assert want is not None
        assert _error(A.apply_token_bitmask, *args) == want


def test_tensors_on_other_devices_are_a_type_error():
    logits, mask = torch.zeros(2, 40), torch.zeros(2, 2, dtype=torch.int32)
    with pytest.raises(TypeError, match="logits is a torch tensor on device meta"):
        A.apply_token_bitmask(logits.to("meta"), mask)
    with pytest.raises(TypeError, match="bitmask is a torch tensor on device meta"):
        A.apply_token_bitmask(logits, mask.to("meta"))
