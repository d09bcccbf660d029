"""LLM.generate with DRY, XTC and mirostat v2 on the embedded default model: each is
seeded (reproducible), batch-invariant (a request's tokens alone and in a batch agree)
and does what it says; mirostat's state moves, survives preemption and keeps its
requests out of speculative decoding."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from pyagent_ref.engine.llm import LLM  # noqa: E402
from pyagent_ref.sample.params import SamplingParams  # noqa: E402
from pyagent_ref.spec_decode import SpeculativeConfig  # noqa: E402

LOOPING = "for i in range("  # the greedy continuation repeats itself
PROMPTS = [LOOPING, "def main(argv):\n", "import os\n"]
SETTINGS = {
    "dry": dict(dry_multiplier=0.8, dry_allowed_length=2),
    "xtc": dict(xtc_probability=0.5, xtc_threshold=0.1),
    "mirostat": dict(mirostat_mode=2, mirostat_tau=3.0, mirostat_eta=0.2),
}


@pytest.fixture(scope="module")
def llm():
    return LLM(ops="ref", max_num_batched_tokens=64)


def params(max_tokens=24, **kwargs) -> SamplingParams:
    return SamplingParams(**(dict(max_tokens=max_tokens, ignore_eos=True) | kwargs))


def tokens(llm, prompts, p) -> list[list[int]]:
    return [list(o.outputs[0].token_ids) for o in llm.generate(prompts, p)]


def repeated_trigrams(context: list[int], start: int) -> int:
    """Tokens at index >= start that end a 3-gram seen earlier in `context`."""
    count = 0
    for i in range(max(start, 2), len(context)):
        gram = context[i - 2 : i + 1]
        if any(context[j - 2 : j + 1] == gram for j in range(2, i)):
            count += 1
    return count


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_seeded_and_batch_invariant(llm, name):
    p = params(seed=11, **SETTINGS[name])
    alone = tokens(llm, [LOOPING], p)[0]
    assert tokens(llm, [LOOPING], p)[0] == alone  # the seed decides
    # in a batch beside requests with other settings: the same tokens
    others = [params(seed=3), params(seed=5, **SETTINGS[sorted(SETTINGS)[0]])]
    outs = llm.generate([LOOPING, *PROMPTS[1:]], [p, *others])
    assert list(outs[0].outputs[0].token_ids) == alone
    assert tokens(llm, [LOOPING], params(seed=12, **SETTINGS[name]))[0] != alone


def test_dry_breaks_greedy_repetition(llm):
    prompt = llm.tokenizer.encode(LOOPING)
    greedy = tokens(llm, [LOOPING], params(max_tokens=40, temperature=0))[0]
    assert repeated_trigrams(prompt + greedy, len(prompt)) > 5  # the model loops
    # a penalty too large to pay, no breakers: no output token completes a repeated
    # 3-gram (allowed_length 2: the last 2 tokens followed by it occurred before)
    dry = params(
        max_tokens=40,
        temperature=0,
        dry_multiplier=1e4,
        dry_allowed_length=2,
        dry_sequence_breakers=[],
    )
    out = tokens(llm, [LOOPING], dry)[0]
    assert repeated_trigrams(prompt + out, len(prompt)) == 0


def test_xtc_never_emits_the_top_token_when_two_pass(llm):
    threshold, fired = 0.1, 0
    p = params(max_tokens=32, seed=7, xtc_probability=1.0, xtc_threshold=threshold, logprobs=2)
    out = llm.generate(PROMPTS, p)
    for o in out:
        for token, entries in zip(o.outputs[0].token_ids, o.outputs[0].logprobs, strict=True):
            # raw logprobs at temperature 1 with no other filter: XTC's probabilities
            top = sorted(entries.values(), key=lambda e: e.rank)
            if len([e for e in top if e.rank <= 2 and math.exp(e.logprob) >= threshold]) >= 2:
                fired += 1
                first = next(t for t, e in entries.items() if e.rank == 1)
                assert token != first
    assert fired > 0


def test_mirostat_mu_moves_and_steers(llm, monkeypatch):
    sampler = llm.core.runner.sampler
    seen = []  # (mu the row was truncated with, the mu it returned) per step

    def recording(logits, rows):
        out = sampler(logits, rows)
        seen.extend((r.mirostat_mu, mu) for r, mu in zip(rows, out.mirostat_mu, strict=True))
        return out

    monkeypatch.setattr(llm.core.runner, "sampler", recording)
    tau = 3.0
    llm.generate([LOOPING], params(max_tokens=12, seed=1, mirostat_mode=2, mirostat_tau=tau))
    assert seen[0][0] is None  # the first token: mu = 2 * tau
    assert all(after is not None for _, after in seen)
    for (_, after), (before, _) in zip(seen, seen[1:], strict=False):
        assert before == after  # each step starts from the mu the last one left
    assert len({after for _, after in seen}) > 1
    # a lower target surprise (tau 0.5 bits, not the default 5): less surprising tokens
    default_tau = llm.generate(
        [LOOPING], params(max_tokens=32, seed=2, mirostat_mode=2, logprobs=0)
    )
    low_tau = llm.generate(
        [LOOPING], params(max_tokens=32, seed=2, mirostat_mode=2, mirostat_tau=0.5, logprobs=0)
    )

    def mean_surprise(out) -> float:
        o = out[0].outputs[0]
        values = [-o.logprobs[i][t].logprob for i, t in enumerate(o.token_ids)]
        return sum(values) / len(values)

    assert mean_surprise(low_tau) < mean_surprise(default_tau)


def test_mirostat_survives_preemption(llm):
    """A cache too small for the batch preempts and recomputes requests: the mirostat
    request resumes with the mu it had, and draws what it draws alone."""
    p = params(max_tokens=20, seed=4, mirostat_mode=2, mirostat_tau=2.0)
    alone = tokens(llm, [LOOPING], p)[0]
    small = LLM(ops="ref", block_size=4, num_kv_blocks=20, max_num_batched_tokens=16)
    batch = [p] + [params(max_tokens=20, seed=s) for s in (1, 2, 3)]
    outs = small.generate([LOOPING, *PROMPTS[1:], LOOPING], batch)
    assert small.core.stats.preemptions > 0
    assert list(outs[0].outputs[0].token_ids) == alone


def test_mirostat_requests_get_no_drafts():
    spec = SpeculativeConfig(method="ngram", num_speculative_tokens=3)
    llm = LLM(ops="ref", speculative_config=spec, max_num_batched_tokens=64)
    sampler, drafted = llm.core.runner.sampler, []

    def recording(logits, rows):
        drafted.extend(r.request_id for r in rows if r.draft_token_ids)
        return sampler.verify(logits, rows)

    llm.core.runner.sampler.verify = recording
    looping = params(max_tokens=24, temperature=0)
    outs = llm.generate(
        [LOOPING, LOOPING], [looping, params(max_tokens=24, seed=3, mirostat_mode=2)]
    )
    ids = [o.request_id for o in outs]
    assert ids[0] in drafted and ids[1] not in drafted
