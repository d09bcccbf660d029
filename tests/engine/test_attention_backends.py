"""attention_backend: the engine's tokens do not depend on which implementation of the
attention contract runs (pyagent_ref.attention_backends)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from pyagent_ref.attention_backends import with_attention_backend  # noqa: E402
from pyagent_ref.engine.llm import LLM  # noqa: E402
from pyagent_ref.ops import load  # noqa: E402
from pyagent_ref.sample.params import SamplingParams  # noqa: E402

PROMPTS = ["Hello world, this is", "def main():\n    print(", "a b c d e f g h i j k l m n"]
ENGINE = dict(block_size=4, num_kv_blocks=64, max_num_batched_tokens=16, max_num_seqs=4)


@pytest.mark.parametrize("backend", ["sdpa", "flex"])
def test_greedy_tokens_equal_the_reference_attention(tiny_llm_dir, backend):
    """Chunked prefills (a budget of 16 tokens), decodes and prefix-cache hits."""
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    prompts = PROMPTS + PROMPTS[:1]  # the last one hits the prefix cache
    ref = LLM(tiny_llm_dir[1], ops="ref", **ENGINE).generate(prompts, params)
    llm = LLM(tiny_llm_dir[1], ops="ref", attention_backend=backend, **ENGINE)
    assert llm.core.ops.attention.paged_attention.__module__.endswith(backend)
    got = llm.generate(prompts, params)
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in ref]


def test_the_namespace_keeps_the_cache_writes_and_every_other_module():
    ops = load("ref")
    flex = with_attention_backend(ops, "flex")
    assert flex.attention.reshape_and_cache is ops.attention.reshape_and_cache
    assert flex.sampling is ops.sampling and flex.MODULES == ops.MODULES
    assert with_attention_backend(ops, "auto") is ops


def test_an_unknown_backend_is_named(tiny_llm_dir):
    with pytest.raises(ValueError, match="attention_backend must be one of .* got 'triton'"):
        LLM(tiny_llm_dir[1], ops="ref", attention_backend="triton", **ENGINE)
