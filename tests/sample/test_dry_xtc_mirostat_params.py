"""SamplingParams: DRY, XTC and mirostat fields, their defaults and their validation."""

from __future__ import annotations

import pytest

from pyagent_ref.sample.params import DRY_SEQUENCE_BREAKERS, SamplingParams


def test_defaults_are_llama_cpp_and_off():
    p = SamplingParams()
    assert (p.dry_multiplier, p.dry_base, p.dry_allowed_length, p.dry_penalty_last_n) == (
        0.0,
        1.75,
        2,
        -1,
    )
    assert p.dry_sequence_breakers == list(DRY_SEQUENCE_BREAKERS) == ["\n", ":", '"', "*"]
    assert p.dry_sequence_breaker_ids is None
    assert (p.xtc_threshold, p.xtc_probability) == (0.1, 0.0)
    assert (p.mirostat_mode, p.mirostat_tau, p.mirostat_eta) == (0, 5.0, 0.1)
    assert not (p.dry or p.xtc or p.mirostat)


def test_switches():
    assert SamplingParams(dry_multiplier=0.8).dry
    assert not SamplingParams(dry_multiplier=0.8, dry_penalty_last_n=0).dry
    assert SamplingParams(xtc_probability=0.5).xtc
    assert not SamplingParams(xtc_probability=0.5, temperature=0).xtc  # greedy: no XTC
    assert SamplingParams(mirostat_mode=2).mirostat


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (dict(dry_multiplier=-1.0), ValueError, r"dry_multiplier must be a number >= 0.*-1.0"),
        (dict(dry_multiplier=float("inf")), ValueError, "dry_multiplier"),
        (dict(dry_base=1.0), ValueError, r"dry_base must be a number > 1, got 1.0"),
        (dict(dry_base=True), ValueError, "dry_base"),
        (dict(dry_allowed_length=0), ValueError, r"dry_allowed_length must be an int >= 1, got 0"),
        (dict(dry_allowed_length=2.0), ValueError, "dry_allowed_length"),
        (dict(dry_penalty_last_n=-2), ValueError, r"dry_penalty_last_n must be an int >= -1"),
        (dict(dry_sequence_breakers=[""]), ValueError, "dry_sequence_breakers must hold non-em"),
        (dict(dry_sequence_breakers=[1]), TypeError, "dry_sequence_breakers must be None, a str"),
        (dict(dry_sequence_breaker_ids=[-1]), ValueError, "dry_sequence_breaker_ids must hold"),
        (dict(dry_sequence_breaker_ids=["a"]), TypeError, "dry_sequence_breaker_ids"),
        (dict(xtc_threshold=1.5), ValueError, r"xtc_threshold must be in \[0, 1\], got 1.5"),
        (dict(xtc_probability=-0.1), ValueError, r"xtc_probability must be in \[0, 1\]"),
        (dict(xtc_probability=float("nan")), ValueError, "xtc_probability"),
        (dict(mirostat_mode=1), ValueError, r"mirostat_mode 1 \(mirostat v1\) is not supported"),
        (dict(mirostat_mode=3), ValueError, r"mirostat_mode must be 0 \(off\) or 2.*got 3"),
        (dict(mirostat_mode=True), ValueError, "mirostat_mode must be 0"),
        (dict(mirostat_tau=0.0), ValueError, r"mirostat_tau must be a number > 0, got 0.0"),
        (dict(mirostat_eta=0.0), ValueError, r"mirostat_eta must be in \(0, 1\], got 0.0"),
        (dict(mirostat_eta=1.5), ValueError, "mirostat_eta"),
    ],
)
def test_bad_values_name_the_field(kwargs, error, match):
    with pytest.raises(error, match=match):
        SamplingParams(**kwargs)


def test_the_forms_taken():
    assert SamplingParams(dry_sequence_breakers="\n").dry_sequence_breakers == ["\n"]
    assert SamplingParams(dry_sequence_breakers=None).dry_sequence_breakers == []
    assert SamplingParams(dry_sequence_breaker_ids=(3, 4)).dry_sequence_breaker_ids == [3, 4]
    edge = SamplingParams(xtc_threshold=0.0, xtc_probability=1.0, mirostat_eta=1.0)
    assert edge.xtc and edge.mirostat_eta == 1.0
