"""The sampler's DRY, XTC and mirostat stages: each does what its parameter says, only to
the rows that use it; mirostat's mu comes back per row; speculative verification handles
them as plain decoding does."""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import pyagent_ref.ops  # noqa: E402
from pyagent_ref.sample.params import SamplingParams  # noqa: E402
from pyagent_ref.sample.sampler import Sampler, SamplingRow  # noqa: E402

VOCAB = 16


def row(prompt=(1, 2, 3), output=(), seed=7, mu=None, drafts=(), **params) -> SamplingRow:
    return SamplingRow(
        "r",
        SamplingParams(**params),
        seed,
        list(prompt),
        list(output),
        draft_token_ids=list(drafts),
        mirostat_mu=mu,
    )


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


def test_dry_penalises_the_token_that_continues_a_loop(sampler):
    loop = (4, 5, 6) * 3  # ... 4 5 6 4 5 6: 4 would extend a repeat of 6 tokens
    x = logits(3)
    rows = [
        row(prompt=loop, dry_multiplier=1.0, dry_base=2.0, dry_allowed_length=2),
        row(prompt=loop),  # DRY off
        row(prompt=loop, dry_multiplier=1.0, dry_sequence_breaker_ids=[6]),  # ends with one
    ]
    out = processed(sampler, x, rows)
    want = x[0].numpy().copy()
    want[4] -= 2.0 ** (6 - 2)  # after "4 5 6 4 5 6" the longest repeat 4 extends is 6 long
    np.testing.assert_array_equal(out[0], want)
    np.testing.assert_array_equal(out[1:], x[1:].numpy())


def test_dry_sees_prompt_and_output():
    s = Sampler(pyagent_ref.ops.load("ref"))
    x = logits(1)
    split = processed(s, x, [row(prompt=(4, 5), output=(6, 4, 5), dry_multiplier=1.0)])
    whole = processed(s, x, [row(prompt=(4, 5, 6, 4, 5), dry_multiplier=1.0)])
    np.testing.assert_array_equal(split, whole)
    assert split[0, 6] < x[0, 6].item()


def test_xtc_removes_all_likely_tokens_but_the_least(sampler):
    x = torch.full((2, VOCAB), -10.0)
    x[:, 3], x[:, 7], x[:, 9] = 3.0, 2.5, 2.0  # three tokens well above threshold 0.1
    rows = [row(xtc_probability=1.0, xtc_threshold=0.1), row(xtc_probability=0.0)]
    out = processed(sampler, x, rows)
    assert np.flatnonzero(np.isinf(out[0])).tolist() == [3, 7]
    assert np.isfinite(out[1]).all()
    for seed in range(10):
        token = sampler(x[:1], [row(seed=seed, xtc_probability=1.0)]).token_ids[0]
        assert token not in (3, 7)


def test_xtc_leaves_greedy_rows_alone(sampler):
    x = logits(1)
    greedy = row(temperature=0, xtc_probability=1.0, xtc_threshold=0.0)
    assert sampler(x, [greedy]).token_ids == [int(x.argmax())]


def test_mirostat_truncates_by_mu_and_returns_the_next_mu(sampler):
    x = logits(3)
    rows = [row(mirostat_mode=2, mirostat_tau=1.0), row(mirostat_mode=2, mu=0.5), row()]
    out = sampler(x, rows)
    assert out.mirostat_mu[2] is None
    for b, mu in ((0, 2.0), (1, 0.5)):  # mu starts at 2 * tau
        p = torch.softmax(x[b].double(), 0)
        kept = p >= 2.0**-mu
        kept[p.argmax()] = True
        renormalised = p[out.token_ids[b]] / p[kept].sum()
        assert kept[out.token_ids[b]]
        surprise = -math.log2(renormalised.item())
        tau = rows[b].params.mirostat_tau
        assert out.mirostat_mu[b] == pytest.approx(mu - 0.1 * (surprise - tau), rel=1e-9)


def test_rows_are_batch_invariant(sampler):
    rows = [
        row(seed=1, dry_multiplier=2.0, prompt=(1, 2) * 5),
        row(seed=2, xtc_probability=0.7, xtc_threshold=0.05),
        row(seed=3, mirostat_mode=2, mu=3.0),
        row(seed=4),
    ]
    x = logits(4, seed=5)
    together = sampler(x, rows)
    for i, r in enumerate(rows):
        alone = sampler(x[i : i + 1], [r])
        assert alone.token_ids[0] == together.token_ids[i]
        assert alone.mirostat_mu[0] == together.mirostat_mu[i]


def test_verify_handles_mirostat_rows_without_drafts(sampler):
    rows = [row(seed=3, mirostat_mode=2, mu=3.0), row(seed=4, drafts=(5, 6))]
    x = logits(4, seed=2)  # 1 row for the first request, 3 for the second
    (tokens, _, mu), (_, _, none) = sampler.verify(x, rows)
    plain = sampler(x[:1], rows[:1])
    assert none is None and len(tokens) == 1
    assert mu == plain.mirostat_mu[0]
    with pytest.raises(ValueError, match="mirostat requests take no speculative drafts"):
        sampler.verify(logits(2), [row(mirostat_mode=2, drafts=(1,))])
