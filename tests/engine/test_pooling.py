"""Pooling requests (`LLM.embed`): the model's final hidden states pooled, equal to HF's."""

from __future__ import annotations

import asyncio

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from pyagent_ref.engine.llm import LLM, AsyncLLM  # noqa: E402
from pyagent_ref.model import default_model_path  # noqa: E402
from pyagent_ref.model.pooling import PoolingParams  # noqa: E402
from pyagent_ref.sample.params import SamplingParams  # noqa: E402

# the first is longer than the step budget, so its prefill (and its pooling) is chunked
TEXTS = ["def main(argv):\n    for arg in argv:\n        print(arg, len(arg))\n", "import os"]


@pytest.fixture(scope="module")
def llm():
    return LLM(ops="ref", max_num_batched_tokens=16)


@pytest.fixture(scope="module")
def hf():
    return transformers.AutoModel.from_pretrained(default_model_path(), dtype=torch.float32)


def expected(hf, ids, pooling_type, normalize=True):
    with torch.inference_mode():
        states = hf(torch.tensor([ids])).last_hidden_state[0]
    vector = {"last": states[-1], "mean": states.mean(0), "cls": states[0]}[pooling_type]
    return vector / vector.norm() if normalize else vector


@pytest.mark.parametrize("pooling_type", ["last", "mean", "cls"])
def test_embeddings_equal_hf_hidden_states_pooled(llm, hf, pooling_type):
    assert len(llm.tokenizer.encode(TEXTS[0])) > 16
    for normalize in (True, False):
        outs = llm.embed(TEXTS, PoolingParams(pooling_type, normalize))
        for text, out in zip(TEXTS, outs, strict=True):
            assert out.finish_reason == "stop"
            assert out.prompt_token_ids == llm.tokenizer.encode(text)
            want = expected(hf, out.prompt_token_ids, pooling_type, normalize)
            torch.testing.assert_close(torch.tensor(out.embedding), want, atol=1e-5, rtol=1e-5)


def test_a_warm_prefix_cache_does_not_change_mean_pooling(llm):
    params = PoolingParams("mean")
    llm.generate(TEXTS[0], SamplingParams(max_tokens=1))  # caches the prompt's blocks
    first, second = llm.embed([TEXTS[0], TEXTS[0]], params)  # (chunked differently)
    alone = torch.tensor(llm.embed(TEXTS[0], params)[0].embedding)
    for out in (first, second):
        torch.testing.assert_close(torch.tensor(out.embedding), alone, atol=1e-6, rtol=1e-6)


def test_generation_next_to_pooling_draws_the_same_tokens(llm):
    params = SamplingParams(temperature=0.7, seed=1, max_tokens=12, ignore_eos=True)
    alone = llm.generate(TEXTS, params)
    engine = llm.core
    rid = "pool-alongside"
    llm._admit([llm._validate(TEXTS[1], SamplingParams(max_tokens=1), rid, False, PoolingParams())])
    mixed = llm.generate(TEXTS, params)
    assert [o.outputs[0].token_ids for o in mixed] == [o.outputs[0].token_ids for o in alone]
    assert not engine.has_unfinished_requests()
    llm._done.pop(rid, None)


def test_bad_pooling_params_are_named():
    with pytest.raises(ValueError, match="pooling_type must be one of"):
        PoolingParams("max")
    with pytest.raises(TypeError, match="normalize must be a bool"):
        PoolingParams("last", normalize=1)


def test_async_embed_runs_with_streams(hf):
    engine = AsyncLLM(ops="ref", max_num_batched_tokens=16)

    async def main():
        async def stream():
            return [o async for o in engine.generate("import os\n", SamplingParams(max_tokens=8))]

        generated, embedded = await asyncio.gather(stream(), engine.embed(TEXTS[0]))
        return generated, embedded

    generated, embedded = asyncio.run(main())
    assert generated[-1].finished and embedded.finish_reason == "stop"
    want = expected(hf, embedded.prompt_token_ids, "last")
    torch.testing.assert_close(torch.tensor(embedded.embedding), want, atol=1e-5, rtol=1e-5)
