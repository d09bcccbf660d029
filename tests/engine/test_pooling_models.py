"""Pooling models in the engine: runner / task, encoder scheduling, the pooling API.

An encoder (BERT) serves only pooling requests, each prompt computed whole in one step
and never from the prefix cache; a decoder serves both unless runner says otherwise.
Requests an engine does not serve, and settings a model cannot have, are refused with a
message naming the setting.
"""

from __future__ import annotations

import asyncio
import json
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from pyagent_ref.engine.llm import LLM, AsyncLLM, score_pairs  # noqa: E402
from pyagent_ref.model.pooling import PoolingParams  # noqa: E402
from pyagent_ref.sample.params import SamplingParams  # noqa: E402

TEXTS = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The girl is carrying a baby.",
    "A monkey is playing drums.",
    "Someone in a gorilla costume is playing a set of drums.",
]


@pytest.fixture(scope="module")
def minilm(minilm_path):
    # a budget smaller than the batch: prompts wait for a step, never split
    return LLM(str(minilm_path), ops="ref", max_num_batched_tokens=32)


def test_encoder_prompts_run_whole_and_batch_invariant(minilm):
    assert all(len(minilm.tokenizer.encode(t)) <= 32 for t in TEXTS)
    assert sum(len(minilm.tokenizer.encode(t)) for t in TEXTS) > 32
    steps = minilm.core.stats.steps
    batch = minilm.embed(TEXTS)
    assert minilm.core.stats.steps - steps >= 2  # the budget forced more than one step
    for text, out in zip(TEXTS, batch, strict=True):
        alone = minilm.embed(text)[0]
        np.testing.assert_allclose(out.embedding, alone.embedding, atol=1e-6)
    assert not minilm.core.kv.enable_caching  # an encoder's KV is never shared
    assert minilm.core.kv.pool.num_free_blocks == minilm.core.kv.pool.num_blocks - 1


def test_encoder_limits_are_named(minilm, minilm_path):
    assert minilm.core.max_model_len == 32  # lowered to one step's budget
    with pytest.raises(ValueError, match="more than max_model_len=32"):
        minilm.embed("word " * 40)
    with pytest.raises(ValueError, match="max_num_batched_tokens allows in one step"):
        LLM(str(minilm_path), ops="ref", max_num_batched_tokens=32, max_model_len=64)
    with pytest.raises(ValueError, match="an encoder"):
        LLM(str(minilm_path), ops="ref", kv_offload={"cpu_blocks": 4})


def test_runner_and_task_are_checked(minilm, minilm_path):
    with pytest.raises(ValueError, match="runner='generate': BertModel is an encoder-only model"):
        LLM(str(minilm_path), runner="generate")
    with pytest.raises(ValueError, match="task='classify' is not supported by BertModel"):
        LLM(str(minilm_path), task="classify")
    with pytest.raises(ValueError, match="task='embed' needs runner='pooling'"):
        LLM(str(minilm_path), runner="generate", task="embed")
    with pytest.raises(ValueError, match="runner must be one of"):
        LLM(str(minilm_path), runner="embed")
    with pytest.raises(ValueError, match=r"does not generate \(runner='auto', BertModel\)"):
        minilm.generate("hello")
    with pytest.raises(ValueError, match="needs a model with a classification head"):
        minilm.classify("hello")


def test_a_decoder_serves_what_its_runner_says():
    generating = LLM(ops="ref", runner="generate")
    with pytest.raises(ValueError, match=r"task 'embed' is not served .*runner='generate'"):
        generating.embed("import os")
    assert generating.generate("import os", SamplingParams(max_tokens=2))[0].outputs[0].token_ids
    pooling = LLM(ops="ref", task="embed")
    with pytest.raises(ValueError, match=r"does not generate \(runner='auto'"):
        pooling.generate("import os")
    assert len(pooling.embed("import os")[0].embedding) == pooling.pooler_config.hidden_size


def test_score_pairs_like_vllm():
    assert score_pairs("q", ["a", "b"]) == [("q", "a"), ("q", "b")]
    assert score_pairs(["q", "r"], ["a", "b"]) == [("q", "a"), ("r", "b")]
    assert score_pairs("q", "a") == [("q", "a")]
    with pytest.raises(ValueError, match="data_1 must hold one text or as many as data_2"):
        score_pairs(["q", "r"], ["a", "b", "c"])
    with pytest.raises(ValueError, match="data_2 must not be empty"):
        score_pairs("q", [])
    with pytest.raises(TypeError, match="data_1 must be a str or a list of str"):
        score_pairs([1], "a")


def test_bi_encoder_score_is_the_cosine_of_embeddings(minilm):
    vectors = {t: np.array(o.embedding) for t, o in zip(TEXTS, minilm.embed(TEXTS), strict=True)}
    scores = minilm.score(TEXTS[0], TEXTS[1:])
    for text, out in zip(TEXTS[1:], scores, strict=True):
        assert abs(out.score - float(vectors[TEXTS[0]] @ vectors[text])) < 1e-6
    assert scores[0].score > 0.5 > scores[1].score  # bread is closer to food than a baby is
    pairwise = minilm.score(TEXTS[3:], TEXTS[:2])
    assert abs(pairwise[1].score - float(vectors[TEXTS[4]] @ vectors[TEXTS[1]])) < 1e-6
    with pytest.raises(ValueError, match="activation applies to a cross-encoder"):
        minilm.score("a", "b", PoolingParams(activation=False))


def test_matryoshka_dimensions(minilm, minilm_path, tmp_path):
    with pytest.raises(ValueError, match="dimensions=64 needs a Matryoshka model"):
        minilm.embed("x", PoolingParams(dimensions=64))
    for name in os.listdir(minilm_path):  # the same model, declared Matryoshka
        if name != "config.json":
            os.symlink(minilm_path / name, tmp_path / name)
    config = json.loads((minilm_path / "config.json").read_text())
    config["matryoshka_dimensions"] = [64, 128]
    (tmp_path / "config.json").write_text(json.dumps(config))
    llm = LLM(str(tmp_path), ops="ref")
    full = np.array(llm.embed(TEXTS[0], PoolingParams(normalize=False))[0].embedding)
    short = np.array(llm.embed(TEXTS[0], PoolingParams(dimensions=64))[0].embedding)
    np.testing.assert_allclose(short, full[:64] / np.linalg.norm(full[:64]), atol=1e-6)
    with pytest.raises(ValueError, match=r"dimensions=100 is not supported: .*\[64, 128\]"):
        llm.embed("x", PoolingParams(dimensions=100))


def test_pooling_params_are_validated():
    with pytest.raises(ValueError, match="pooling_type must be one of"):
        PoolingParams("max")
    with pytest.raises(TypeError, match="dimensions must be an int"):
        PoolingParams(dimensions=1.5)
    with pytest.raises(ValueError, match="softmax .* must agree with activation"):
        PoolingParams(activation=True, softmax=False, task="classify")
    assert PoolingParams(softmax=False, task="classify").activation is False
    with pytest.raises(ValueError, match="dimensions applies to embeddings"):
        PoolingParams(dimensions=8, task="score")


def test_async_classify_score_and_embed_together(tiny_bert_dirs):
    _, path = tiny_bert_dirs["score"]
    engine = AsyncLLM(str(path), ops="ref")

    async def main():
        return await asyncio.gather(
            engine.score("a query", ["a document", "another one"]),
            engine.classify("a text"),
        )

    scores, probs = asyncio.run(main())
    assert [len(s.prompt_token_ids) > 0 for s in scores] == [True, True]
    assert 0 < probs.probs[0] < 1  # one label: a sigmoid
    sync = LLM(str(path), ops="ref").score("a query", ["a document", "another one"])
    assert [s.score for s in scores] == pytest.approx([s.score for s in sync], abs=1e-6)
