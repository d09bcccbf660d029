"""Speculative decoding through `LLM` on the embedded default model: stop strings that
end inside a step's accepted drafts, n > 1 (parallel samples share the prompt's blocks,
each child has its own drafts), and the same text as decoding without speculation."""

from __future__ import annotations

import pytest

from pyagent_ref.engine.llm import LLM
from pyagent_ref.sample.params import SamplingParams

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3}
PROMPTS = ["import os\n", "def main():\n", "class Parser:\n"]


@pytest.fixture(scope="module")
def engines():
    return LLM(ops="auto"), LLM(ops="auto", speculative_config=NGRAM)


def test_stop_strings_cut_inside_the_accepted_drafts(engines):
    """Stop at a string from the middle of each greedy output: the speculative engine
    stops at the same place with the same text, though its steps emit several tokens."""
    plain, spec = engines
    free = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True)
    for prompt, out in zip(PROMPTS, plain.generate(PROMPTS, free), strict=True):
        text = out.outputs[0].text
        stop = text[len(text) // 2 : len(text) // 2 + 3]
        params = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True, stop=[stop])
        expected = plain.generate(prompt, params)[0].outputs[0]
        got = spec.generate(prompt, params)[0].outputs[0]
        assert (got.text, got.finish_reason, got.stop_reason) == (
            expected.text,
            expected.finish_reason,
            expected.stop_reason,
        )
        assert got.finish_reason == "stop" and stop not in got.text
    assert spec.core.stats.spec.num_accepted_tokens > 0


def test_parallel_samples_each_verify_their_own_drafts(engines):
    """n = 3 greedy children all equal plain greedy decoding; n = 4 sampled children are
    seeded apart, each as long as asked, and drafts of each are accepted."""
    plain, spec = engines
    greedy = SamplingParams(n=3, temperature=0, max_tokens=40, ignore_eos=True)
    expected = plain.generate(PROMPTS[0], greedy)[0].outputs[0].token_ids
    children = spec.generate(PROMPTS[0], greedy)[0].outputs
    assert [c.token_ids for c in children] == [expected] * 3
    spec.core.stats.reset()
    sampled = SamplingParams(n=4, temperature=0.8, seed=11, max_tokens=40, ignore_eos=True)
    children = spec.generate(PROMPTS[1], sampled)[0].outputs
    assert len({tuple(c.token_ids) for c in children}) > 1
    assert all(len(c.token_ids) == 40 for c in children)
    assert spec.core.stats.spec.num_accepted_tokens > 0
