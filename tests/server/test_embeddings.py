"""POST /v1/embeddings with the openai client: vectors equal HF's pooled hidden states."""

from __future__ import annotations

import base64

import httpx
import numpy as np
import openai
import pytest

from .conftest import API_KEY, MODEL

AUTH = {"Authorization": f"Bearer {API_KEY}"}

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def hf_last_state(ids: list[int]) -> np.ndarray:
    from pyagent_ref.model import default_model_path

    hf = transformers.AutoModel.from_pretrained(default_model_path(), dtype=torch.float32)
    with torch.inference_mode():
        state = hf(torch.tensor([ids])).last_hidden_state[0, -1]
    return (state / state.norm()).numpy()


def test_embeddings_of_texts_and_token_ids(server, client):
    texts = ["def main():\n    return 0\n", "import os"]
    out = client.embeddings.create(model=MODEL, input=texts)
    assert [d.index for d in out.data] == [0, 1] and out.model == MODEL
    ids = [
        httpx.post(server.url + "/tokenize", json={"prompt": t}, headers=AUTH).json()["tokens"]
        for t in texts
    ]
    assert out.usage.prompt_tokens == out.usage.total_tokens == sum(map(len, ids))
    for data, token_ids in zip(out.data, ids, strict=True):
        np.testing.assert_allclose(data.embedding, hf_last_state(token_ids), atol=1e-5)
    by_ids = client.embeddings.create(model=MODEL, input=ids[1])
    np.testing.assert_allclose(by_ids.data[0].embedding, out.data[1].embedding, atol=1e-6)


def test_base64_encoding_and_normalize(server, client):
    floats = client.embeddings.create(model=MODEL, input="hello", encoding_format="float")
    body = {"model": MODEL, "input": "hello", "encoding_format": "base64"}
    raw = httpx.post(server.url + "/v1/embeddings", json=body, headers=AUTH).json()
    decoded = np.frombuffer(base64.b64decode(raw["data"][0]["embedding"]), dtype="<f4")
    np.testing.assert_allclose(decoded, floats.data[0].embedding, atol=1e-6)
    plain = client.embeddings.create(model=MODEL, input="hello", extra_body={"normalize": False})
    norm = np.linalg.norm(plain.data[0].embedding)
    assert abs(np.linalg.norm(floats.data[0].embedding) - 1) < 1e-5 and abs(norm - 1) > 1e-3


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"input": "x", "dimensions": 8}, "dimensions"),
        ({"input": []}, "input"),
        ({"input": [10**9]}, "input"),
        ({"input": "x " * 5000}, "input"),
    ],
)
def test_bad_embedding_requests_are_400s(client, kwargs, param):
    with pytest.raises(openai.BadRequestError) as err:
        client.embeddings.create(model=MODEL, **kwargs)
    assert err.value.body["param"] == param, err.value.body
    assert client.embeddings.create(model=MODEL, input="ok").data  # still serving
