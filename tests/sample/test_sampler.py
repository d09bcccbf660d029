"""The sampler's logits processors: each new stage does what its parameter says, only
to the rows that use it, and a row's token does not depend on the rest of the batch."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import pyagent_ref.ops  # noqa: E402
from pyagent_ref.sample.params import SamplingParams  # noqa: E402
from pyagent_ref.sample.sampler import Sampler, SamplingRow  # noqa: E402

VOCAB = 16


def row(prompt=(1, 2, 3), output=(), seed=7, **params) -> SamplingRow:
    return SamplingRow("r", SamplingParams(**params), seed, list(prompt), list(output))


def logits(batch: int, seed: int = 0) -> torch.Tensor:
    gen = np.random.default_rng(seed)
    return torch.from_numpy(gen.normal(size=(batch, VOCAB)).astype(np.float32))


@pytest.fixture(params=("ref", "accel"))
def sampler(request):
    try:
        return Sampler(pyagent_ref.ops.load(request.param))
    except ImportError:
        pytest.skip("pyagent_accel is not installed")


def processed(sampler, x, rows) -> np.ndarray:
    return sampler._process(x, rows)[0].numpy()


def test_allowed_token_ids_leave_only_those(sampler):
    out = processed(sampler, logits(2), [row(allowed_token_ids=[3, 5]), row()])
    assert np.flatnonzero(np.isfinite(out[0])).tolist() == [3, 5]
    assert np.isfinite(out[1]).all()
    for seed in range(20):
        tokens = sampler(logits(1, seed), [row(seed=seed, allowed_token_ids=[3, 5])]).token_ids
        assert tokens[0] in (3, 5)


def test_bad_words_match_the_output_not_the_prompt(sampler):
    bad = [[7], [4, 9], [1, 2, 6]]
    rows = [
        row(prompt=(1, 2), output=(), bad_words_token_ids=bad),  # prefix only in the prompt
        row(prompt=(5,), output=(8, 4), bad_words_token_ids=bad),
        row(prompt=(5,), output=(1, 2), bad_words_token_ids=bad),
    ]
    out = processed(sampler, logits(3), rows)
    assert np.flatnonzero(np.isinf(out[0])).tolist() == [7]
    assert np.flatnonzero(np.isinf(out[1])).tolist() == [7, 9]
    assert np.flatnonzero(np.isinf(out[2])).tolist() == [6, 7]


def test_no_repeat_ngram_runs_over_prompt_and_output(sampler):
    rows = [row(prompt=(1, 2, 3), output=(1,), no_repeat_ngram_size=2), row(prompt=(1, 2, 3))]
    out = processed(sampler, logits(2), rows)
    assert np.flatnonzero(np.isinf(out[0])).tolist() == [2]
    assert np.isfinite(out[1]).all()


def test_warpers_follow_top_p_and_spare_greedy_rows(sampler):
    x = logits(4)
    rows = [
        row(typical_p=0.2),
        row(typical_p=0.2, temperature=0.0),
        row(epsilon_cutoff=0.1),
        row(eta_cutoff=0.2),
    ]
    out = processed(sampler, x, rows)
    s = pyagent_ref.ops.sampling
    want_typical = s.apply_typical_p(x[:1].numpy(), [0.2])
    np.testing.assert_array_equal(out[0], want_typical[0])
    np.testing.assert_array_equal(out[1], x[1].numpy())  # greedy: typical_p not applied
    np.testing.assert_array_equal(out[2], s.apply_epsilon_cutoff(x[2:3].numpy(), [0.1])[0])
    np.testing.assert_array_equal(out[3], s.apply_eta_cutoff(x[3:4].numpy(), [0.2])[0])
    assert all(np.isinf(r).any() for r in out[[0, 2, 3]])


def test_a_rows_token_does_not_depend_on_the_batch(sampler):
    rows = [
        row(seed=1, allowed_token_ids=[1, 2, 3, 4]),
        row(seed=2, bad_words_token_ids=[[5]], output=(5, 6)),
        row(seed=3, no_repeat_ngram_size=1),
        row(seed=4, typical_p=0.5, epsilon_cutoff=0.01, eta_cutoff=0.05),
        row(seed=5),
    ]
    x = logits(len(rows), seed=3)
    together = sampler(x, rows).token_ids
    alone = [sampler(x[i : i + 1], [r]).token_ids[0] for i, r in enumerate(rows)]
    assert together == alone


def test_verify_sees_drafts_as_output(sampler):
    """Row i of a speculative request is processed with drafts 0 .. i-1 as its output, so
    a bad word whose prefix is a draft bans its last token in the next row only."""
    r = dataclasses.replace(
        row(bad_words_token_ids=[[9, 4]], temperature=0.0), draft_token_ids=[9, 3]
    )
    expanded = [
        dataclasses.replace(r, output_token_ids=[*r.draft_token_ids[:i]], draft_token_ids=())
        for i in range(3)
    ]
    out = processed(sampler, logits(3), expanded)
    assert [bool(np.isinf(o[4])) for o in out] == [False, True, False]


def test_a_row_left_without_tokens_names_its_request(sampler):
    rows = [
        row(),
        dataclasses.replace(
            row(output=(3,), allowed_token_ids=[3], no_repeat_ngram_size=1), request_id="r-dead"
        ),
    ]
    with pytest.raises(ValueError, match="request r-dead: its allowed_token_ids"):
        sampler(logits(2), rows)
