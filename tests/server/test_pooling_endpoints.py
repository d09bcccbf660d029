"""The pooling endpoints on real pooling models: /v1/embeddings serving all-MiniLM-L6-v2
(equal to sentence-transformers), /v1/score and /rerank over it (cosine of embeddings),
and /classify, /score, /rerank over a random cross-encoder and classifier."""

from __future__ import annotations

import base64
import contextlib

import httpx
import numpy as np
import pytest

from pyagent_ref.server import ServerConfig, ServingEngine, build_app

from .conftest import ServerThread

TEXTS = ["A man is eating food.", "A man is eating a piece of bread.", "A monkey plays drums."]


def _server(path):
    engine = ServingEngine(str(path), ops="ref", engine_process=False)
    return ServerThread(build_app(engine, ServerConfig(served_model_name="m"))).start()


@pytest.fixture(scope="module")
def minilm_server(minilm_path):
    srv = _server(minilm_path)
    yield srv
    with contextlib.suppress(AssertionError):
        srv.stop()


@pytest.fixture(scope="module")
def cross_servers(tiny_bert_dirs):
    servers = {kind: _server(tiny_bert_dirs[kind][1]) for kind in ("score", "classify")}
    yield servers
    for srv in servers.values():
        with contextlib.suppress(AssertionError):
            srv.stop()


def post(srv, path, body):
    return httpx.post(srv.url + path, json=body, timeout=60)


def test_embeddings_of_minilm_equal_sentence_transformers(minilm_server, minilm_path):
    st = pytest.importorskip("sentence_transformers")
    want = st.SentenceTransformer(str(minilm_path), device="cpu").encode(TEXTS)
    out = post(minilm_server, "/v1/embeddings", {"input": TEXTS}).json()
    got = np.array([d["embedding"] for d in out["data"]])
    np.testing.assert_allclose(got, want, atol=1e-5)
    raw = post(minilm_server, "/v1/embeddings", {"input": TEXTS[0], "encoding_format": "base64"})
    decoded = np.frombuffer(base64.b64decode(raw.json()["data"][0]["embedding"]), "<f4")
    np.testing.assert_allclose(decoded, got[0], atol=1e-7)
    bad = post(minilm_server, "/v1/embeddings", {"input": "x", "dimensions": 64})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "dimensions"


def test_score_and_rerank_by_cosine(minilm_server):
    vectors = [
        np.array(d["embedding"])
        for d in post(minilm_server, "/v1/embeddings", {"input": TEXTS}).json()["data"]
    ]
    out = post(minilm_server, "/v1/score", {"text_1": TEXTS[0], "text_2": TEXTS[1:]}).json()
    assert [d["index"] for d in out["data"]] == [0, 1] and out["object"] == "list"
    for d, v in zip(out["data"], vectors[1:], strict=True):
        assert abs(d["score"] - float(vectors[0] @ v)) < 1e-5
    body = {"query": TEXTS[0], "documents": [TEXTS[2], TEXTS[1]], "top_n": 1}
    for path in ("/rerank", "/v1/rerank", "/v2/rerank"):
        ranked = post(minilm_server, path, body).json()
        assert [r["index"] for r in ranked["results"]] == [1]
        assert ranked["results"][0]["document"] == {"text": TEXTS[1]}
        assert ranked["usage"]["total_tokens"] > 0
    bad = post(minilm_server, "/score", {"text_1": ["a", "b"], "text_2": ["a", "b", "c"]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "text_1"
    bad = post(minilm_server, "/classify", {"input": "a"})
    assert bad.status_code == 400 and "classification head" in bad.json()["error"]["message"]


def test_cross_encoder_classify_score_and_rerank(cross_servers, tiny_bert_dirs):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    hf, path = tiny_bert_dirs["classify"]
    tok = transformers.AutoTokenizer.from_pretrained(str(path))
    with torch.inference_mode():
        probs = torch.softmax(hf(**tok(TEXTS[:2], padding=True, return_tensors="pt")).logits, 1)
    out = post(cross_servers["classify"], "/classify", {"input": TEXTS[:2]}).json()
    for d, p in zip(out["data"], probs, strict=True):
        np.testing.assert_allclose(d["probs"], p.numpy(), atol=1e-6)
        assert d["num_classes"] == 3
        assert d["label"] == ("negative", "neutral", "positive")[int(p.argmax())]
    bad = post(cross_servers["classify"], "/v1/score", {"text_1": "a", "text_2": "b"})
    assert bad.status_code == 400 and "3 labels" in bad.json()["error"]["message"]

    hf, path = tiny_bert_dirs["score"]
    docs = [TEXTS[1], TEXTS[2], "drums"]
    with torch.inference_mode():
        pairs = tok([TEXTS[0]] * 3, docs, padding=True, return_tensors="pt")
        want = torch.sigmoid(hf(**pairs).logits[:, 0])
    scores = post(cross_servers["score"], "/v1/score", {"text_1": TEXTS[0], "text_2": docs}).json()
    np.testing.assert_allclose([d["score"] for d in scores["data"]], want.numpy(), atol=1e-6)
    ranked = post(
        cross_servers["score"],
        "/rerank",
        {"query": TEXTS[0], "documents": docs, "return_documents": False},
    ).json()
    assert [r["index"] for r in ranked["results"]] == torch.argsort(-want).tolist()
    assert all("document" not in r for r in ranked["results"])
    bad = post(cross_servers["score"], "/v1/embeddings", {"input": "a"})
    assert bad.status_code == 400 and "task 'embed' is not served" in bad.json()["error"]["message"]
