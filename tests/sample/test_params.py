"""SamplingParams: the new filters' fields, their defaults and their validation."""

from __future__ import annotations

import pytest

from pyagent_ref.sample.params import SamplingParams


def test_defaults_disable_every_filter():
    p = SamplingParams()
    assert (p.typical_p, p.epsilon_cutoff, p.eta_cutoff, p.no_repeat_ngram_size) == (1, 0, 0, 0)
    assert p.allowed_token_ids is None and p.bad_words is None and p.bad_words_token_ids is None


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (dict(typical_p=0.0), ValueError, r"typical_p must be in \(0, 1\].*got 0.0"),
        (dict(typical_p=1.5), ValueError, "typical_p must be in"),
        (dict(typical_p=float("nan")), ValueError, "typical_p"),
        (dict(epsilon_cutoff=1.0), ValueError, r"epsilon_cutoff must be in \[0, 1\), got 1.0"),
        (dict(epsilon_cutoff=-0.1), ValueError, "epsilon_cutoff"),
        (dict(eta_cutoff=1.0), ValueError, r"eta_cutoff must be in \[0, 1\), got 1.0"),
        (dict(eta_cutoff="0.1"), ValueError, "eta_cutoff"),
        (dict(allowed_token_ids=[]), ValueError, "allowed_token_ids must be None or name at"),
        (dict(allowed_token_ids=[3, -1]), ValueError, "allowed_token_ids must hold token ids"),
        (dict(allowed_token_ids=5), TypeError, "allowed_token_ids must be None or a list"),
        (dict(allowed_token_ids=[1.5]), TypeError, "allowed_token_ids"),
        (dict(bad_words=[" "]), ValueError, "bad_words must hold words that are not empty"),
        (dict(bad_words=[3]), TypeError, "bad_words must be None, a str or a list of str"),
        (dict(bad_words_token_ids=[[]]), ValueError, "bad_words_token_ids must hold non-empty"),
        (dict(bad_words_token_ids=[[1, -2]]), ValueError, "bad_words_token_ids"),
        (dict(bad_words_token_ids=[1, 2]), TypeError, "bad_words_token_ids"),
        (dict(no_repeat_ngram_size=-1), ValueError, "no_repeat_ngram_size must be an int >= 0"),
        (dict(no_repeat_ngram_size=2.0), ValueError, "no_repeat_ngram_size"),
        # integers past int64 and past float32's range are refused by name, not an
        # OverflowError (found by tests/engine/test_reliability.py's fuzz)
        (dict(no_repeat_ngram_size=2**70), ValueError, r"no_repeat_ngram_size .*got 1180591"),
        (dict(top_k=2**63), ValueError, "top_k"),
        (dict(epsilon_cutoff=10**400), ValueError, r"epsilon_cutoff must be in \[0, 1\)"),
        (dict(temperature=10**39), ValueError, "temperature"),
        (dict(seed=2**64), ValueError, "seed must be None or a 64-bit int"),
    ],
)
def test_bad_values_name_the_field(kwargs, error, match):
    with pytest.raises(error, match=match):
        SamplingParams(**kwargs)


def test_the_forms_vllm_takes():
    assert SamplingParams(bad_words="darn").bad_words == ["darn"]
    assert SamplingParams(allowed_token_ids=(4, 2)).allowed_token_ids == [4, 2]
    assert SamplingParams(bad_words_token_ids=((1, 2),)).bad_words_token_ids == [[1, 2]]
    edge = SamplingParams(typical_p=1.0, epsilon_cutoff=0.0, eta_cutoff=0.999)
    assert edge.eta_cutoff == 0.999


def test_the_largest_integers_the_ops_take_are_accepted():
    assert SamplingParams(seed=2**64 - 1, top_k=2**63 - 1, temperature=10**38).seed == 2**64 - 1
