"""Prompt lookup against a brute-force reading of its contract, and its settings' errors."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pyagent_ref.ops.spec_decode import _z_function as z_function
from pyagent_ref.ops.spec_decode import propose_ngram
from pyagent_ref.spec_decode import NgramProposer, SpeculativeConfig


def brute_force(s: list[int], k: int, lo: int, hi: int) -> list[int]:
    """Longest n-gram first, then the latest earlier occurrence followed by a token."""
    n = len(s)
    for length in range(hi, lo - 1, -1):
        for j in range(n - length - 1, -1, -1):
            if s[j : j + length] == s[n - length :]:
                return s[j + length : j + length + k]
    return []


# A 3-token alphabet makes repeats (and overlapping matches) common.
sequences = st.lists(st.integers(0, 2), max_size=40)


@given(sequences)
def test_z_function_is_the_longest_common_prefix(s):
    for i, z in enumerate(z_function(s)):
        common = 0
        while i + common < len(s) and s[common] == s[i + common]:
            common += 1
        assert z == common


@given(sequences, st.integers(1, 6), st.integers(1, 5), st.integers(0, 4))
def test_matches_the_brute_force_contract(s, k, lo, extra):
    assert propose_ngram(s, k, lo, lo + extra) == brute_force(s, k, lo, lo + extra)


def test_the_longest_match_wins_then_the_latest():
    # suffix [1, 2]: [1, 2] occurs at 0 (followed by 7) and at 3 (followed by 8);
    # the unigram [2] also occurs at 5 (followed by 9), but a longer match wins.
    s = [1, 2, 7, 1, 2, 8, 2, 9, 1, 2]
    assert propose_ngram(s, 2, 1, 3) == [8, 2]
    assert propose_ngram(s, 2, 1, 1) == [9, 1]  # only unigrams: the latest [2]


def test_overlapping_match_and_short_proposals():
    assert propose_ngram([5, 5, 5], 4, 1, 2) == [5]  # [5, 5] at 0, one token follows
    assert propose_ngram([1, 2, 3], 4, 1, 3) == []  # no repeat
    assert propose_ngram([], 4, 1, 3) == []


def test_proposer_uses_the_config():
    config = SpeculativeConfig(num_speculative_tokens=1, prompt_lookup_min=2, prompt_lookup_max=2)
    assert NgramProposer(config).propose("a", [1, 2, 3], [1, 2]) == [3]
    assert NgramProposer(config).propose("a", [1, 2], [3, 2]) == []  # a unigram is too short


@pytest.mark.parametrize(
    ("kwargs", "error", "names"),
    [
        ({"num_speculative_tokens": 0}, ValueError, "num_speculative_tokens must be >= 1, got 0"),
        ({"prompt_lookup_min": 0}, ValueError, "prompt_lookup_min must be >= 1, got 0"),
        ({"prompt_lookup_min": 3, "prompt_lookup_max": 2}, ValueError, "prompt_lookup_min=3"),
        ({"prompt_lookup_max": 2.0}, TypeError, "prompt_lookup_max must be an int, got 2.0"),
        ({"num_speculative_tokens": True}, TypeError, "num_speculative_tokens must be an int"),
        (
            {"method": "eagle"},
            ValueError,
            "method must be one of ('ngram', 'suffix', 'draft_model', 'medusa'), got 'eagle'",
        ),
    ],
)
def test_bad_settings_name_the_field_and_value(kwargs, error, names):
    with pytest.raises(error) as info:
        SpeculativeConfig(**kwargs)
    assert names in str(info.value)


def test_propose_ngram_checks_its_settings():
    with pytest.raises(ValueError, match="prompt_lookup_min must be <= prompt_lookup_max"):
        propose_ngram([1, 2], 2, 3, 1)
