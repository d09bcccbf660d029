"""Speculative decoding of requests with structured outputs, on the embedded default
model: drafts are cut where the grammar refuses one, each verification row is masked by
the grammar's state after the drafts before it, and the outputs are those of decoding
without speculation (greedy: token for token) and always in the constraint's language."""

from __future__ import annotations

import json
import re

import pytest

from pyagent_ref.engine import core as engine_core
from pyagent_ref.engine.llm import LLM
from pyagent_ref.sample.params import SamplingParams

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3}
PROMPT = "def main():\n"
CONSTRAINTS = [
    {"regex": r"(ab,|cd,){4,12}\."},
    {"regex": r"[0-9]{2}(-[0-9]{2}){3,6}"},
    {
        "json": {
            "type": "array",
            "items": {"enum": ["red", "green", "blue"]},
            "minItems": 3,
            "maxItems": 8,
        }
    },
    {"choice": ["one two one two", "three three three"]},
]


@pytest.fixture(scope="module")
def engines():
    return LLM(ops="ref"), LLM(ops="ref", speculative_config=NGRAM)


def params(constraint, **kwargs):
    return SamplingParams(
        **({"temperature": 0, "max_tokens": 40} | kwargs), structured_outputs=constraint
    )


def test_greedy_speculation_equals_greedy_decoding_under_a_grammar(engines, monkeypatch):
    plain, spec = engines
    cuts = []

    def allowed_prefix(grammar, drafts):
        kept = original(grammar, drafts)
        cuts.append(len(kept) < len(drafts))
        return kept

    original = engine_core._allowed_prefix
    monkeypatch.setattr(engine_core, "_allowed_prefix", allowed_prefix)
    spec.core.stats.reset()
    prompts = [PROMPT, "x = [", "import os\n"]
    for constraint in CONSTRAINTS:
        expected = [o.outputs[0].token_ids for o in plain.generate(prompts, params(constraint))]
        got = spec.generate(prompts, params(constraint))
        assert [o.outputs[0].token_ids for o in got] == expected, constraint
    stats = spec.core.stats.spec
    assert stats.num_accepted_tokens > 0  # drafts were verified under the masks
    assert any(cuts) and not all(cuts)  # some drafts the grammar refused were cut


@pytest.mark.parametrize("constraint", CONSTRAINTS[:3], ids=["regex", "dashes", "json"])
def test_sampled_speculative_outputs_stay_in_the_language(engines, constraint):
    _, spec = engines
    outs = spec.generate(
        [PROMPT] * 4, params(constraint, temperature=1.0, seed=3, n=2, max_tokens=60)
    )
    for completion in (c for o in outs for c in o.outputs):
        assert completion.finish_reason == "stop", completion
        if "json" in constraint:
            value = json.loads(completion.text)
            assert 3 <= len(value) <= 8 and set(value) <= {"red", "green", "blue"}
        else:
            assert re.fullmatch(constraint["regex"], completion.text), completion.text
