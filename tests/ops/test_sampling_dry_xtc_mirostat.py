"""llama.cpp's samplers as ops: hand-computed cases of the docstrings' promises for DRY,
XTC and mirostat v2 (breakers, windows, the coin's entry, keep-the-top, the update)."""

from __future__ import annotations

import math

import numpy as np
import pytest

NEG = -np.inf


def finite(out) -> list[list[int]]:
    return np.isfinite(out).astype(int).tolist()


def dry(ops, lib, tokens, multiplier=1.0, base=2.0, allowed=2, last_n=-1, breakers=(-1,)):
    logits = lib(np.zeros((1, 6)), "float64")
    out = ops.sampling.apply_dry(
        logits,
        lib([tokens], "int64"),
        [multiplier],
        [base],
        [allowed],
        [last_n],
        lib([breakers], "int64"),
    )
    return lib.np(out)[0].tolist()


def test_dry_penalises_what_extends_a_repeat(ops, lib):
    # 1 2 3 4 1 2 3: 4 would extend "1 2 3" (n = 3): 1 * 2 ** (3 - 2)
    assert dry(ops, lib, [1, 2, 3, 4, 1, 2, 3]) == [0, 0, 0, 0, -2, 0]
    # allowed_length 3: n = 3 is just enough (2 ** 0); 4 is not
    assert dry(ops, lib, [1, 2, 3, 4, 1, 2, 3], allowed=3) == [0, 0, 0, 0, -1, 0]
    assert dry(ops, lib, [1, 2, 3, 4, 1, 2, 3], allowed=4) == [0] * 6
    # a loop: 5 5 5 5 -> 5 would extend a repeat of 3 (overlapping the suffix)
    assert dry(ops, lib, [5, 5, 5, 5], allowed=1) == [0, 0, 0, 0, 0, -4]


def test_dry_repeats_stop_at_breakers_and_breakers_are_spared(ops, lib):
    # breaker 2: the repeat 4 extends is only "3" (n = 1 < 2)
    assert dry(ops, lib, [1, 2, 3, 4, 1, 2, 3], breakers=(2,)) == [0] * 6
    # breaker 4: it would extend "1 2 3", but a breaker is never penalised
    assert dry(ops, lib, [1, 2, 3, 4, 1, 2, 3], breakers=(4, -1)) == [0] * 6


def test_dry_window_and_switches(ops, lib):
    tokens = [1, 2, 3, 4, 1, 2, 3]
    assert dry(ops, lib, tokens, last_n=3) == [0] * 6  # "1 2 3" alone: nothing earlier
    assert dry(ops, lib, tokens, last_n=7) == [0, 0, 0, 0, -2, 0]
    assert dry(ops, lib, tokens, last_n=0) == [0] * 6
    assert dry(ops, lib, tokens, multiplier=0.0) == [0] * 6
    # a penalty past float32 lowers the token to the lowest finite value, never masks it
    out = ops.sampling.apply_dry(
        lib(np.zeros((1, 6)), "float32"),
        lib([tokens], "int64"),
        [1e300],
        [2.0],
        [2],
        [-1],
        lib([[-1]], "int64"),
    )
    assert lib.np(out)[0, 4] == np.finfo(np.float32).min


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (dict(multiplier=-1.0), r"multiplier\[0\] must be finite and >= 0, got -1.0"),
        (dict(base=1.0), r"base\[0\] must be finite and > 1, got 1.0"),
        (dict(allowed=0), r"allowed_length\[0\] must be >= 1, got 0"),
        (dict(last_n=-2), r"penalty_last_n\[0\] must be >= -1"),
    ],
)
def test_dry_errors_name_the_parameter(ops, lib, change, match):
    with pytest.raises(ValueError, match=match):
        dry(ops, lib, [1, 2], **change)


def test_xtc_removes_the_likely_tokens_but_the_least(ops, lib):
    logits = lib(np.log([[0.4, 0.3, 0.2, 0.1]] * 3), "float64")
    seeds, positions = lib([1, 2, 3], "int64"), lib([0, 0, 0], "int64")
    out = ops.sampling.apply_xtc(logits, [0.15, 0.35, 0.15], [1.0, 1.0, 0.0], seeds, positions)
    # row 0: 0.4, 0.3, 0.2 pass, 0.2 stays; row 1: one passes; row 2: probability 0
    assert finite(lib.np(out)) == [[0, 0, 1, 1], [1, 1, 1, 1], [1, 1, 1, 1]]


def test_xtc_coin_is_the_entry_past_rejection_samplings(ops, lib):
    logits = lib(np.log([[0.5, 0.5]]), "float64")
    seeds, positions = np.array([42]), np.array([3])
    u = lib.np(ops.sampling.philox_uniform(lib(seeds, "int64"), lib(positions, "int64"), 4))[0, 3]
    below, above = np.nextafter(u, 0.0), np.nextafter(u, 1.0)
    for probability, fires in ((u, False), (below, False), (above, True)):
        out = ops.sampling.apply_xtc(
            logits, [0.5], [probability], lib(seeds, "int64"), lib(positions, "int64")
        )
        # the two tokens are tied: both are the least likely, so nothing is masked either way
        assert finite(lib.np(out)) == [[1, 1]]
        skewed = lib(np.log([[0.6, 0.4]]), "float64")
        out = ops.sampling.apply_xtc(
            skewed, [0.3], [probability], lib(seeds, "int64"), lib(positions, "int64")
        )
        assert finite(lib.np(out)) == ([[0, 1]] if fires else [[1, 1]])


def test_mirostat_masks_by_surprise_and_keeps_the_top(ops, lib):
    logits = lib(np.log([[0.5, 0.25, 0.25]] * 4), "float64")  # surprises 1, 2, 2 bits
    out = ops.sampling.apply_mirostat(logits, [1.5, 2.0, -3.0, math.inf])
    assert finite(lib.np(out)) == [[1, 0, 0], [1, 1, 1], [1, 0, 0], [1, 1, 1]]
    with pytest.raises(ValueError, match=r"mu\[0\] must not be NaN"):
        ops.sampling.apply_mirostat(logits, [math.nan, 1.0, 1.0, 1.0])


def test_mirostat_update_moves_mu_by_the_error(ops, lib):
    logits = lib([[math.log(0.5), math.log(0.25), math.log(0.25)], [0.0, 0.0, NEG]], "float64")
    mu = lib.np(ops.sampling.mirostat_update(logits, [1, 0], [10.0, 10.0], [3.0, 3.0], [0.5, 0.1]))
    # surprises 2 and 1 bits: 10 - 0.5 * (2 - 3) and 10 - 0.1 * (1 - 3)
    np.testing.assert_allclose(mu, [10.5, 10.2], rtol=1e-12)
    masked = lib(np.array([[0.0, NEG]]), "float64")
    with pytest.raises(ValueError, match=r"sampled\[0\] is token 1, masked"):
        ops.sampling.mirostat_update(masked, [1], [1.0], [3.0], [0.1])
    with pytest.raises(ValueError, match=r"eta\[0\] must be in \(0, 1\], got 0.0"):
        ops.sampling.mirostat_update(logits, [0, 0], [1.0, 1.0], [3.0, 3.0], [0.0, 0.1])
