"""pyagent_accel.ops.block_table against pyagent_ref.ops.block_table (numpy and torch CPU).

Exact results (int64, PAD_SLOT_ID for padding) on random scheduler-like batches in every
int32/int64 combination and memory layout, and the same exception class and message
for each bad input. The conformance suite (`python -m conformance pyagent_accel
block_table`) is the specification check; these are the accelerator's regression tests.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from pyagent_accel.ops import block_table as A

from pyagent_ref.ops import block_table as R

try:
    import torch
except ImportError:  # the numpy cases still run
    torch = None

LIBS = ["numpy", "torch"] if torch is not None else ["numpy"]
needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed")
INTS = [np.int32, np.int64]


def as_lib(x, lib):
    if lib == "torch" and isinstance(x, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(x))
    return x


def to_np(x):
    if torch is not None and isinstance(x, torch.Tensor):
        return x.numpy()
    return np.asarray(x)


def same(a, b):
    assert type(a) is type(b), (type(a), type(b))
    a, b = to_np(a), to_np(b)
    assert a.dtype == b.dtype == np.int64, (a.dtype, b.dtype)
    np.testing.assert_array_equal(a, b)


def outcome(fn, *args):
    try:
        return fn(*args)
    except Exception as exc:  # noqa: BLE001 - the class and message are compared
        return exc


def same_outcome(name, *args):
    r, a = outcome(getattr(R, name), *args), outcome(getattr(A, name), *args)
    if isinstance(r, Exception):
        assert type(a) is type(r) and str(a) == str(r), (name, r, a)
    else:
        same(r, a)


def batch(rng, num_reqs, max_len, max_blocks, block_size, pad):
    lengths = rng.integers(0, max_len + 1, num_reqs)
    qsl = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    cap = max_blocks * block_size
    nct = np.array([rng.integers(0, max(cap - n, 0) + 1) for n in lengths], np.int64)
    table = rng.integers(0, 50_000, (num_reqs, max_blocks))
    return qsl, nct, table, int(qsl[-1]) + pad


@pytest.mark.parametrize("lib", LIBS)
@pytest.mark.parametrize("dtypes", list(itertools.product(INTS, repeat=3)))
def test_random_batches_match_reference(lib, dtypes):
    rng = np.random.default_rng(sum(np.dtype(d).itemsize << i for i, d in enumerate(dtypes)))
    t_dt, q_dt, p_dt = dtypes
    for num_reqs, max_len, max_blocks, bs, pad in [
        (0, 0, 1, 16, 3),
        (1, 1, 1, 1, 0),
        (3, 8, 4, 3, 2),
        (6, 8, 8, 16, 5),
        (64, 1, 256, 16, 0),  # decodes
        (8, 300, 64, 16, 7),  # prefill chunks
    ]:
        qsl, nct, table, n = batch(rng, num_reqs, max_len, max_blocks, bs, pad)
        q, c, t = (as_lib(x.astype(d), lib) for x, d in ((qsl, q_dt), (nct, p_dt), (table, t_dt)))
        same(R.compute_positions(q, c, n), A.compute_positions(q, c, n))
        pos = to_np(R.compute_positions(q, c, n)).copy()
        pos[int(qsl[-1]) :] = rng.integers(-5, 10**6, n - int(qsl[-1]))  # padding: anything
        p = as_lib(pos.astype(p_dt), lib)
        same(R.compute_slot_mapping(t, q, p, bs), A.compute_slot_mapping(t, q, p, bs))
        if np.all(np.diff(qsl) > 0):
            same(R.compute_logits_indices(q), A.compute_logits_indices(q))


@pytest.mark.parametrize("lib", LIBS)
def test_strided_inputs_are_read_in_place(lib):
    rng = np.random.default_rng(3)
    qsl, nct, table, n = batch(rng, 5, 8, 6, 4, 3)
    pos = to_np(R.compute_positions(qsl, nct, n))
    wide = np.zeros((table.shape[0], 2 * table.shape[1]), np.int32)
    wide[:, ::2] = table
    spaced = np.zeros(2 * pos.shape[0], np.int64)
    spaced[::2] = pos
    if lib == "torch":
        tables = [torch.from_numpy(wide)[:, ::2], torch.from_numpy(table).t().contiguous().t()]
        positions = [torch.from_numpy(spaced)[::2]]
    else:  # numpy alone has negative strides
        tables = [wide[:, ::2], np.asfortranarray(table), table[::-1].copy()[::-1]]
        positions = [spaced[::2], pos[::-1].copy()[::-1]]
    q = as_lib(qsl, lib)
    for t in tables:
        assert not t.is_contiguous() if lib == "torch" else not t.flags.c_contiguous
        same(
            R.compute_slot_mapping(t, q, as_lib(pos, lib), 4),
            A.compute_slot_mapping(t, q, as_lib(pos, lib), 4),
        )
    for p in positions:
        t = as_lib(table, lib)
        same(R.compute_slot_mapping(t, q, p, 4), A.compute_slot_mapping(t, q, p, 4))
    strided_qsl = as_lib(np.repeat(qsl, 2), lib)[::2]
    same_outcome("compute_logits_indices", strided_qsl)
    nonempty = as_lib(np.repeat(np.array([0, 2, 5, 6], np.int32), 2), lib)[::2]
    same(R.compute_logits_indices(nonempty), A.compute_logits_indices(nonempty))
    same(
        R.compute_positions(strided_qsl, as_lib(nct, lib), n),
        A.compute_positions(strided_qsl, as_lib(nct, lib), n),
    )


def test_torch_inputs_give_torch_results_without_copies():
    if torch is None:
        pytest.skip("torch is not installed")
    qsl = torch.tensor([0, 3, 4], dtype=torch.int32)
    out = A.compute_positions(qsl, torch.tensor([5, 0]), 6)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.int64
    assert out.tolist() == [5, 6, 7, 0, 0, 0]
    slots = A.compute_slot_mapping(torch.tensor([[1, 2], [3, 4]]), qsl, out, 4)
    assert isinstance(slots, torch.Tensor) and slots.tolist() == [9, 10, 11, 12, -1, -1]


@needs_torch
@pytest.mark.parametrize(
    "call",
    [
        lambda t: A.compute_positions(t, torch.zeros(1, dtype=torch.int64), 2),
        lambda t: A.compute_slot_mapping(
            torch.zeros((1, 1), dtype=torch.int64), t, torch.zeros(2, dtype=torch.int64), 4
        ),
        lambda t: A.compute_logits_indices(t),
    ],
)
def test_tensors_off_the_cpu_are_type_errors(call):
    t = torch.tensor([0, 2], device="meta")
    with pytest.raises(TypeError, match="device meta; pyagent_accel works on CPU arrays only"):
        call(t)


BAD_QSL = [
    np.array([], np.int64),
    np.array([1, 2], np.int64),
    np.array([0, 3, 2], np.int32),
    np.array([[0, 1]], np.int64),
    np.array([0.0, 1.0]),
    np.array([0, 1], np.int16),
    np.array([0, 1], np.uint64),
    np.array([0, 1], ">i8"),
    np.array([True, False]),
    [0, 1],
    np.int64(0),
    None,
]


@pytest.mark.parametrize("lib", LIBS)
@pytest.mark.parametrize("qsl", BAD_QSL, ids=range(len(BAD_QSL)))
def test_bad_query_start_loc_same_errors(lib, qsl):
    try:
        q = as_lib(qsl, lib)
    except (TypeError, ValueError):  # not a torch dtype: the numpy array is still bad input
        q = qsl
    same_outcome("compute_logits_indices", q)
    same_outcome("compute_positions", q, as_lib(np.zeros(1, np.int64), lib), 4)
    same_outcome(
        "compute_slot_mapping",
        as_lib(np.ones((1, 2), np.int64), lib),
        q,
        as_lib(np.zeros(3, np.int64), lib),
        4,
    )


def test_bad_inputs_same_errors():
    i64 = np.int64
    qsl, nct = np.array([0, 3, 4]), np.array([2, 9])
    for args in [
        (qsl, nct, 3),
        (qsl, nct, -1),
        (qsl, nct, 4.0),
        (qsl, nct, True),
        (qsl, nct, np.int64(6)),
        (qsl, nct, 2**64),
        (qsl, nct, -(2**70)),
        (qsl, np.array([2, -9]), 6),
        (qsl, np.array([2, -9, -4]), 6),
        (qsl, np.array([[2, 9]]), 6),
        (qsl, np.array([2.0, 9.0]), 6),
        (np.array([0], i64), np.array([], i64), 0),
        (qsl, np.array([2**63 - 1, 0]), 5),
    ]:
        same_outcome("compute_positions", *args)
    table = np.array([[1, 2, 3], [4, 5, 6]])
    pos = np.array([0, 5, 11, 2, -1])
    for args in [
        (table, qsl, pos, 4),
        (table, qsl, pos, 3),
        (table, qsl, pos, 0),
        (table, qsl, pos, -4),
        (table, qsl, pos, 4.0),
        (table, qsl, pos, True),
        (table, qsl, pos, np.int64(4)),
        (table, qsl, pos, 2**63),
        (table, qsl, pos, 2**62),
        (table, qsl, np.array([0, 5, -11, 2, -1]), 2**63),
        (table, qsl, np.array([0, 5, 12, 2]), 4),
        (table, qsl, np.array([0, 50, 12, -2]), 4),
        (table, qsl, pos[:3], 4),
        (table, np.array([0, 3]), pos, 4),
        (table[0], qsl, pos, 4),
        (table.astype(np.float32), qsl, pos, 4),
        (table, qsl, pos[None], 4),
        (np.zeros((0, 4), i64), np.array([0]), np.array([7, -3]), 16),
        (np.array([[-5]]), np.array([0, 1]), np.array([3]), 4),
        (np.array([[2**62]]), np.array([0, 1]), np.array([3]), 4),
    ]:
        same_outcome("compute_slot_mapping", *args)
    for q in ([0, 2, 2], [0, 0], [0, 1, 3, 3, 9]):
        same_outcome("compute_logits_indices", np.array(q))


def test_outside_the_contract_the_accelerator_follows_the_docstring():
    """Where the reference fails on an edge of its own contract (reported, not mirrored)."""
    # a block table without columns and only padding: the reference raises IndexError
    out = A.compute_slot_mapping(
        np.zeros((2, 0), np.int64), np.array([0, 0, 0]), np.zeros(1, int), 4
    )
    assert out.tolist() == [-1]
    # an int32 step past 2**31 is a decrease (the reference's int32 subtraction wraps)
    with pytest.raises(ValueError, match="non-decreasing, got 2147483647 then -2"):
        A.compute_logits_indices(np.array([0, 2**31 - 1, -2], np.int32))


def test_results_are_fresh_writable_arrays():
    qsl = np.array([0, 2, 5])
    for out in (A.compute_logits_indices(qsl), A.compute_positions(qsl, np.zeros(2, int), 5)):
        assert out.flags.writeable and not np.shares_memory(out, qsl)
        out[:] = 7
    assert qsl.tolist() == [0, 2, 5]
