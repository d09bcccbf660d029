"""The filters HF and vLLM have beside top-k/top-p/min-p: hand-computed cases of each
docstring's promises (ties, disabled values, padding, error messages)."""

from __future__ import annotations

import math

import numpy as np
import pytest

NEG = -np.inf


def finite(out) -> list[list[int]]:
    return np.isfinite(out).astype(int).tolist()


def test_typical_p_keeps_the_tokens_nearest_the_entropy(ops, lib):
    # tokens with equal logits have equal d: kept together although one reaches the mass
    logits = lib([[1.0, 1.0, 1.0, -4.0]], "float64")
    assert finite(lib.np(ops.sampling.apply_typical_p(logits, [0.1]))) == [[1, 1, 1, 0]]
    # p = (0.7, 0.2, 0.1): H = 0.8018; d = (0.445, 0.808, 1.501): 0.7 first
    logits = lib(np.log([[0.7, 0.2, 0.1]] * 3), "float64")
    out = lib.np(ops.sampling.apply_typical_p(logits, [0.5, 0.8, 1.0]))
    assert finite(out) == [[1, 0, 0], [1, 1, 0], [1, 1, 1]]


def test_typical_p_may_mask_the_most_likely_token(ops, lib):
    # p = (0.9, 0.05, 0.05): H = 0.394, d(0.9) = 0.289, d(0.05) = 2.6 -> 0.9 first;
    # with a flat tail the most likely token is the atypical one
    p = np.array([[0.4] + [0.6 / 30] * 30])
    out = lib.np(ops.sampling.apply_typical_p(lib(np.log(p), "float64"), [0.5]))
    assert finite(out) == [[0] + [1] * 30]


def test_typical_p_rejects_values_outside_the_unit_interval(ops, lib):
    for bad in (0.0, 1.5, math.nan):
        with pytest.raises(ValueError, match=r"typical_p\[0\]"):
            ops.sampling.apply_typical_p(lib([[0.0, 1.0]]), [bad])


def test_epsilon_cutoff_is_strict_and_keeps_the_tied_maxima(ops, lib):
    logits = lib(np.log([[0.25, 0.25, 0.25, 0.125, 0.125]] * 3), "float64")
    out = lib.np(ops.sampling.apply_epsilon_cutoff(logits, [0.0, 0.125, 0.5]))
    assert finite(out) == [[1] * 5, [1] * 5, [1, 1, 1, 0, 0]]
    with pytest.raises(ValueError, match=r"epsilon\[0\] must be in \[0, 1\), got 1.0"):
        ops.sampling.apply_epsilon_cutoff(logits, [1.0, 0.0, 0.0])


def test_eta_cutoff_scales_with_the_entropy(ops, lib):
    # uniform over 4: H = ln 4, threshold = min(eta, sqrt(eta) / 4); p = 0.25 each
    logits = lib([[0.0, 0.0, 0.0, 0.0, NEG]], "float64")
    assert finite(lib.np(ops.sampling.apply_eta_cutoff(logits, [0.9]))) == [[1, 1, 1, 1, 0]]
    # p = (0.5, 0.5 - 1e-3, 1e-3): sqrt(0.04) * exp(-H) > 1e-3, so the small one goes
    logits = lib(np.log([[0.5, 0.499, 0.001]]), "float64")
    assert finite(lib.np(ops.sampling.apply_eta_cutoff(logits, [0.04]))) == [[1, 1, 0]]
    assert finite(lib.np(ops.sampling.apply_eta_cutoff(logits, [0.0]))) == [[1, 1, 1]]


def test_allowed_token_ids_mask_the_rest_and_an_empty_row_allows_all(ops, lib):
    logits = lib([[1.0, 2.0, 3.0, 4.0]] * 2)
    allowed = np.array([[2, -1, 0, 2], [-1, -1, -1, -1]])
    out = lib.np(ops.sampling.apply_allowed_token_ids(logits, allowed))
    assert out.tolist() == [[1.0, NEG, 3.0, NEG], [1.0, 2.0, 3.0, 4.0]]
    with pytest.raises(ValueError, match="outside the vocab of 4"):
        ops.sampling.apply_allowed_token_ids(logits, np.array([[4], [0]]))


def test_bad_words_ban_the_last_token_after_their_prefix(ops, lib):
    logits = lib(np.zeros((2, 6)))
    tokens = np.array([[1, 2, 3, -1], [3, -1, -1, -1]])
    words = np.array(
        [
            [[2, 3, 4], [3, 5, -1], [1, 2, -1], [0, -1, -1]],
            [[2, 3, 4], [3, 5, -1], [-1, -1, -1], [-1, -1, -1]],
        ]
    )
    out = lib.np(ops.sampling.apply_bad_words(logits, tokens, words))
    assert finite(out) == [[0, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 0]]
    with pytest.raises(ValueError, match=r"token_ids\[0, 2\] is a token id after padding"):
        ops.sampling.apply_bad_words(logits, np.array([[1, -1, 2], [0, 0, 0]]), words)
    with pytest.raises(ValueError, match=r"bad_words must have shape \(2, words, max_len\)"):
        ops.sampling.apply_bad_words(logits, tokens, words[0])


def test_no_repeat_ngram_bans_the_completions_of_seen_ngrams(ops, lib):
    logits = lib(np.zeros((4, 5)))
    tokens = np.array([[1, 2, 1, 3, 1, -1]] * 4)
    out = lib.np(ops.sampling.apply_no_repeat_ngram(logits, tokens, [0, 1, 2, 3]))
    # n=1: every seen token; n=2: after "1" came 2 and 3; n=3: "3 1" never followed
    assert finite(out) == [[1] * 5, [1, 0, 0, 0, 1], [1, 1, 0, 0, 1], [1] * 5]
    with pytest.raises(ValueError, match=r"n\[1\] must be >= 0"):
        ops.sampling.apply_no_repeat_ngram(logits, tokens, [0, -1, 0, 0])
