"""LLM.generate with the filters of the sampler: allowed_token_ids, bad_words,
no_repeat_ngram_size, typical_p, epsilon_cutoff and eta_cutoff, each respected."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from pyagent_ref.engine.llm import LLM  # noqa: E402
from pyagent_ref.sample.params import SamplingParams  # noqa: E402

ENGINE = dict(block_size=4, num_kv_blocks=128, max_num_batched_tokens=16, max_num_seqs=8, ops="ref")
PROMPT = "Hello world, this is"


@pytest.fixture(scope="module")
def llm(tiny_llm_dir):
    return LLM(tiny_llm_dir[1], **ENGINE)


def generate(llm, **kwargs):
    params = SamplingParams(**(dict(max_tokens=16, ignore_eos=True) | kwargs))
    return llm.generate(PROMPT, params)[0].outputs[0]


def contains(seq: list[int], part: list[int]) -> bool:
    return any(seq[i : i + len(part)] == part for i in range(len(seq) - len(part) + 1))


def test_allowed_token_ids_are_the_only_ones_generated(llm):
    allowed = llm.tokenizer.encode("abc xyz", add_special_tokens=False)
    for seed in range(3):
        out = generate(llm, seed=seed, allowed_token_ids=allowed)
        assert len(out.token_ids) == 16 and set(out.token_ids) <= set(allowed)


def test_allowed_token_ids_outside_the_vocab_are_rejected(llm):
    with pytest.raises(ValueError, match="allowed_token_ids holds token id 1000000"):
        generate(llm, allowed_token_ids=[1, 10**6])


def test_bad_words_are_never_generated(llm):
    greedy = generate(llm, temperature=0)
    words = [llm.tokenizer.decode([t]).strip() for t in greedy.token_ids]
    word = next(w for w in words if w.isalpha())
    banned = llm._bad_words_token_ids(SamplingParams(bad_words=[word]))
    assert banned and all(banned)
    assert any(contains(greedy.token_ids, seq) for seq in banned)
    out = generate(llm, temperature=0, bad_words=[word])
    assert not any(contains(out.token_ids, seq) for seq in banned)
    for seed in range(3):
        sampled = generate(llm, seed=seed, bad_words=[word])
        assert not any(contains(sampled.token_ids, seq) for seq in banned)


def test_no_repeat_ngram_size_leaves_no_repeated_ngram(llm):
    ids = llm.tokenizer.encode(PROMPT)

    def repeats(out) -> int:
        seq = ids + list(out.token_ids)
        bigrams = list(zip(seq, seq[1:], strict=False))
        return len(bigrams) - len(set(bigrams))

    assert repeats(generate(llm, temperature=0, max_tokens=48)) > 0  # the model does repeat
    assert repeats(generate(llm, temperature=0, max_tokens=48, no_repeat_ngram_size=2)) == 0


def test_epsilon_cutoff_draws_only_tokens_above_it(llm):
    # logprobs are those of the logits before temperature (1 here) and the warpers
    for seed in range(3):
        out = generate(llm, seed=seed, epsilon_cutoff=0.02, logprobs=1)
        for token, entry in zip(out.token_ids, out.logprobs, strict=True):
            sampled = entry[token]
            assert sampled.rank == 1 or math.exp(sampled.logprob) >= 0.02 * (1 - 1e-5)


def test_typical_p_and_eta_cutoff_run_and_are_seeded(llm):
    for kwargs in (
        dict(typical_p=0.3),
        dict(eta_cutoff=0.05),
        dict(typical_p=0.9, eta_cutoff=0.01),
    ):
        first = generate(llm, seed=11, **kwargs)
        assert len(first.token_ids) == 16
        assert generate(llm, seed=11, **kwargs).token_ids == first.token_ids


def test_typical_p_one_keeps_the_plain_draw(llm):
    assert generate(llm, seed=5, typical_p=1.0).token_ids == generate(llm, seed=5).token_ids


FILTERS = [
    dict(allowed_token_ids=list(range(40, 90))),
    dict(bad_words=["the", "is"]),
    dict(no_repeat_ngram_size=2, temperature=0),
    dict(typical_p=0.5),
    dict(epsilon_cutoff=0.01),
    dict(eta_cutoff=0.01),
]


@pytest.fixture(scope="module")
def accel_llm(tiny_llm_dir):
    pytest.importorskip("pyagent_accel.ops")
    return LLM(tiny_llm_dir[1], **(ENGINE | {"ops": "accel"}))


@pytest.mark.parametrize("kwargs", FILTERS, ids=lambda k: ",".join(k))
def test_accel_ops_draw_the_reference_tokens(llm, accel_llm, kwargs):
    params = dict(seed=3) | kwargs
    assert generate(accel_llm, **params).token_ids == generate(llm, **params).token_ids
