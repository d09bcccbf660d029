"""Behaviour of the sampling ops, with hand-computed expectations.

The property-based and differential checks live in `conformance`; these tests pin the
specific cases each docstring promises (ties, disabled values, error messages).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

NEG = -np.inf


def test_temperature_divides_and_zero_is_untouched(ops, lib):
    out = ops.sampling.apply_temperature(lib([[1.0, -2.0], [4.0, 8.0]]), [0.5, 0.0])
    np.testing.assert_array_equal(lib.np(out), [[2.0, -4.0], [4.0, 8.0]])


@pytest.mark.parametrize("bad", [-0.1, math.inf, math.nan])
def test_temperature_rejects_bad_values(ops, lib, bad):
    with pytest.raises(ValueError, match=r"temperature\[1\]"):
        ops.sampling.apply_temperature(lib([[1.0], [2.0]]), [1.0, bad])


def test_top_k_keeps_ties_at_the_kth_value(ops, lib):
    logits = lib([[1.0, 3.0, 3.0, 0.0], [1.0, 3.0, 3.0, 0.0], [5.0, 1.0, 2.0, NEG]])
    out = lib.np(ops.sampling.apply_top_k(logits, [1, 2, 0]))
    np.testing.assert_array_equal(out[0], [NEG, 3.0, 3.0, NEG])
    np.testing.assert_array_equal(out[1], [NEG, 3.0, 3.0, NEG])
    np.testing.assert_array_equal(out[2], [5.0, 1.0, 2.0, NEG])  # k = 0 disables


def test_top_k_at_or_above_vocab_disables(ops, lib):
    logits = lib([[0.5, 0.25, 0.125]])
    for k in (3, 4, 10**9):
        np.testing.assert_array_equal(lib.np(ops.sampling.apply_top_k(logits, [k])), lib.np(logits))


def test_top_p_keeps_smallest_prefix_reaching_p(ops, lib):
    logits = lib(np.log([[0.5, 0.3, 0.2]] * 3), "float64")
    out = lib.np(ops.sampling.apply_top_p(logits, [0.45, 0.6, 0.95]))
    assert np.isfinite(out).sum(axis=1).tolist() == [1, 2, 3]


def test_top_p_keeps_boundary_ties_and_the_top_token(ops, lib):
    logits = lib([[0.0, 0.0, -5.0, -5.0], [10.0, -10.0, -10.0, -10.0]])
    out = lib.np(ops.sampling.apply_top_p(logits, [0.3, 1e-9]))
    np.testing.assert_array_equal(np.isfinite(out), [[1, 1, 0, 0], [1, 0, 0, 0]])


def test_top_p_one_disables(ops, lib):
    logits = lib([[0.0, -30.0, -60.0, NEG]])
    np.testing.assert_array_equal(lib.np(ops.sampling.apply_top_p(logits, [1.0])), lib.np(logits))


@pytest.mark.parametrize("bad", [0.0, -0.5, 1.5, math.nan])
def test_top_p_rejects_p_outside_unit_interval(ops, lib, bad):
    with pytest.raises(ValueError, match=r"p\[0\]"):
        ops.sampling.apply_top_p(lib([[0.0, 1.0]]), [bad])


def test_min_p_is_strict_and_keeps_the_argmax(ops, lib):
    # probabilities relative to the max: 1, 0.5, 0.25
    logits = lib(np.log([[4.0, 2.0, 1.0]] * 4), "float64")
    out = lib.np(ops.sampling.apply_min_p(logits, [0.0, 0.3, 0.6, 1.0]))
    np.testing.assert_array_equal(np.isfinite(out), [[1, 1, 1], [1, 1, 0], [1, 0, 0], [1, 0, 0]])


def test_min_p_one_keeps_all_tied_maxima(ops, lib):
    out = lib.np(ops.sampling.apply_min_p(lib([[2.0, 2.0, 1.0]]), [1.0]))
    np.testing.assert_array_equal(np.isfinite(out), [[1, 1, 0]])


def test_penalties_match_hand_computation(ops, lib):
    logits = lib([[2.0, -2.0, 1.0, 0.5], [2.0, -2.0, 1.0, 0.5]])
    prompt = lib([[0, -1], [-1, -1]], "int64")
    output = lib([[1, 1], [2, -1]], "int64")
    out = lib.np(
        ops.sampling.apply_penalties(logits, prompt, output, [2.0, 1.0], [0.5, 0.25], [1.0, 0.0])
    )
    # row 0: token 0 seen in prompt (2 / 2); token 1 twice in output (-2 * 2 - 2 * 0.5 - 1)
    np.testing.assert_allclose(out[0], [1.0, -6.0, 1.0, 0.5])
    # row 1: no repetition or presence penalty; token 2 once (1 - 0.25)
    np.testing.assert_allclose(out[1], [2.0, -2.0, 0.75, 0.5])


def test_penalties_disabled_are_identity(ops, lib):
    logits = lib([[2.0, -2.0, NEG]])
    out = ops.sampling.apply_penalties(
        logits, lib([[0, 1]], "int64"), lib([[2, 2]], "int64"), [1.0], [0.0], [0.0]
    )
    np.testing.assert_array_equal(lib.np(out), lib.np(logits))


def test_penalties_reject_out_of_vocab_ids(ops, lib):
    with pytest.raises(ValueError, match="output_ids"):
        ops.sampling.apply_penalties(
            lib([[0.0, 1.0]]), lib([[0]], "int64"), lib([[2]], "int64"), [1.0], [0.0], [0.0]
        )


def test_penalties_reject_nonpositive_repetition(ops, lib):
    with pytest.raises(ValueError, match=r"repetition_penalty\[0\]"):
        ops.sampling.apply_penalties(
            lib([[0.0, 1.0]]), lib([[0]], "int64"), lib([[1]], "int64"), [0.0], [0.0], [0.0]
        )


def test_logit_bias_adds_and_duplicates_accumulate(ops, lib):
    logits = lib([[0.0, 1.0, 2.0], [0.0, 1.0, NEG]])
    ids = lib([[1, 1], [2, -1]], "int64")
    out = lib.np(ops.sampling.apply_logit_bias(logits, ids, lib([[0.5, 0.25], [100.0, 7.0]])))
    np.testing.assert_array_equal(out, [[0.0, 1.75, 2.0], [0.0, 1.0, NEG]])


def test_log_softmax_is_normalised(ops, lib):
    logits = lib([[1.0, 2.0, NEG, 3.0]], "float64")
    out = lib.np(ops.sampling.log_softmax(logits))
    expected = np.array([1.0, 2.0, 3.0]) - math.log(math.exp(1) + math.exp(2) + math.exp(3))
    np.testing.assert_allclose(out[0, [0, 1, 3]], expected, rtol=1e-12)
    assert out[0, 2] == NEG


def test_topk_logprobs_orders_ties_by_token_id_and_ranks(ops, lib):
    lp = lib([[-1.0, -0.5, -1.0, -3.0]], "float64")
    values, ids, chosen, rank = ops.sampling.topk_logprobs(lp, 3, lib([2], "int64"))
    assert lib.np(ids).tolist() == [[1, 0, 2]]
    np.testing.assert_array_equal(lib.np(values), [[-0.5, -1.0, -1.0]])
    assert lib.np(chosen).tolist() == [-1.0]
    assert lib.np(rank).tolist() == [2]  # one token is strictly more likely


def test_topk_logprobs_rejects_num_above_vocab(ops, lib):
    with pytest.raises(ValueError, match="num"):
        ops.sampling.topk_logprobs(lib([[0.0, -1.0]]), 3, [0])


def test_sample_greedy_takes_lowest_index_on_ties(ops, lib):
    logits = lib([[1.0, 5.0, 5.0], [NEG, 0.0, 0.0]])
    tokens = ops.sampling.sample(logits, [0.0, 0.0], lib([7, 7], "int64"), lib([0, 0], "int64"))
    assert lib.np(tokens).tolist() == [1, 1]


def test_sample_never_draws_a_masked_token(ops, lib):
    logits = lib([[NEG, 0.0, NEG, 0.0]] * 64)
    seeds = lib(np.arange(64), "int64")
    tokens = lib.np(ops.sampling.sample(logits, [1.0] * 64, seeds, lib([3] * 64, "int64")))
    assert set(tokens.tolist()) == {1, 3}


def test_sample_is_batch_invariant(ops, lib):
    rng = np.random.default_rng(1)
    rows = rng.normal(0, 2, size=(6, 50))
    seeds = np.array([11, -5, 2**62, 3, 4, 5], dtype=np.int64)
    pos = np.array([0, 1, 2, 3, 4, 99], dtype=np.int64)
    full = lib.np(ops.sampling.sample(lib(rows), [1.0] * 6, lib(seeds, "int64"), lib(pos, "int64")))
    perm = [5, 3, 1]
    part = ops.sampling.sample(
        lib(rows[perm]), [1.0] * 3, lib(seeds[perm], "int64"), lib(pos[perm], "int64")
    )
    assert lib.np(part).tolist() == full[perm].tolist()


def test_sample_rejects_an_all_masked_row(ops, lib):
    with pytest.raises(ValueError, match=r"row 1"):
        ops.sampling.sample(lib([[0.0, 1.0], [NEG, NEG]]), [1.0, 1.0], [0, 0], [0, 0])


def test_sample_rejects_integer_logits(ops, lib):
    with pytest.raises(TypeError, match="logits"):
        ops.sampling.sample(lib([[0, 1]], "int64"), [1.0], [0], [0])


PHILOX_KAT = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    (
        (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
        (0xA4093822, 0x299F31D0),
        (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1),
    ),
]


@pytest.mark.parametrize(("counter", "key", "expected"), PHILOX_KAT)
def test_philox_known_answers(ops, lib, counter, key, expected):
    words = [lib([c], "int64") for c in counter]
    keys = [lib([k], "int64") for k in key]
    out = ops.sampling._philox4x32_10(tuple(words), tuple(keys))
    assert tuple(int(lib.np(w)[0]) for w in out) == expected


def test_philox_uniform_bit_layout(ops, lib):
    """Seed 0, position 0: uniforms 0 and 1 come from the first known-answer block."""
    u = lib.np(ops.sampling.philox_uniform(lib([0], "int64"), lib([0], "int64"), 3))
    x0, x1, x2, x3 = PHILOX_KAT[0][2]
    for i, (lo, hi) in enumerate(((x0, x1), (x2, x3))):
        m = ((hi << 32) | lo) >> 12
        assert u[0, i] == (2 * m + 1) * 2.0**-53
    assert u.shape == (1, 3) and u.dtype == np.float64


def test_philox_uniform_negative_seed_is_its_bit_pattern(ops):
    a = ops.sampling.philox_uniform(np.array([-1], dtype=np.int64), [5], 8)
    b = ops.sampling.philox_uniform(np.array([2**64 - 1], dtype=np.uint64), [5], 8)
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_philox_uniform_rejects_negative_positions(ops):
    with pytest.raises(ValueError, match=r"positions\[1\]"):
        ops.sampling.philox_uniform(np.array([0, 0], dtype=np.int64), [0, -3], 4)


def test_results_stay_in_the_input_library_and_dtype(ops, lib):
    logits = lib([[0.0, 1.0]], "float64")
    out = ops.sampling.apply_top_k(logits, [1])
    assert type(out) is type(logits) and str(out.dtype).endswith("float64")
    tokens = ops.sampling.sample(logits, [1.0], lib([0], "int64"), lib([0], "int64"))
    assert type(tokens) is type(logits) and str(tokens.dtype).endswith("int64")


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


@pytest.mark.cuda
@pytest.mark.skipif(not _cuda_available(), reason="needs a CUDA device")
def test_reference_on_cuda_draws_the_cpu_tokens():
    import torch

    import pyagent_ref.ops

    ops = pyagent_ref.ops.load("ref")
    logits = torch.randn(8, 1000, generator=torch.Generator().manual_seed(0))
    args = ([0.8] * 8, torch.arange(8), torch.full((8,), 5))
    on_cpu = ops.sampling.sample(ops.sampling.apply_top_p(logits, [0.9] * 8), *args)
    on_gpu = ops.sampling.sample(
        ops.sampling.apply_top_p(logits.cuda(), [0.9] * 8),
        *(a if isinstance(a, list) else a.cuda() for a in args),
    )
    assert on_gpu.device.type == "cuda"
    assert on_gpu.cpu().tolist() == on_cpu.tolist()


def test_accel_rejects_cuda_tensors_without_copying():
    """A CUDA tensor is a TypeError for the accelerator (checked with a fake device)."""
    torch = pytest.importorskip("torch")
    try:
        import pyagent_accel.ops as accel
    except ImportError:
        pytest.skip("pyagent_accel is not installed")
    meta = torch.empty((2, 4), device="meta")
    with pytest.raises(TypeError, match="logits"):
        accel.sampling.apply_top_k(meta, [1, 1])
