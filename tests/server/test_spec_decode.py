"""A server with speculative decoding: the same greedy text as without it, streamed in
deltas of several tokens, with the draft counters on /metrics."""

from __future__ import annotations

import contextlib

import httpx
import openai
import pytest

from pyagent_ref.model import default_draft_model_path
from pyagent_ref.server import ServerConfig, ServingEngine, build_app

from .conftest import MODEL, ServerThread, kv_all_free, wait_until

PROMPT = "def add(a, b):\n    return a + b\n\ndef add(a, b):\n"


@pytest.mark.parametrize(
    "spec",
    [
        {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3},
        {"method": "draft_model", "model": str(default_draft_model_path())},
    ],
    ids=["ngram", "draft_model"],
)
def test_speculative_server_streams_the_same_greedy_text(server, client, spec):
    engine = ServingEngine(num_kv_blocks=256, max_num_seqs=8, speculative_config=spec)
    srv = ServerThread(build_app(engine, ServerConfig(served_model_name=MODEL))).start()
    try:
        with openai.OpenAI(base_url=srv.url + "/v1", api_key="-", max_retries=0) as spec_client:
            body = dict(model=MODEL, prompt=PROMPT, max_tokens=48, temperature=0, logprobs=1)
            plain = client.completions.create(**body)
            fast = spec_client.completions.create(**body)
            assert fast.choices[0].text == plain.choices[0].text
            assert fast.choices[0].logprobs.tokens == plain.choices[0].logprobs.tokens
            chunks = list(spec_client.completions.create(**body, stream=True))
            assert "".join(c.choices[0].text for c in chunks if c.choices) == plain.choices[0].text
        metrics = httpx.get(srv.url + "/metrics").text
        counters = {
            line.split()[0]: float(line.split()[-1])
            for line in metrics.splitlines()
            if line.startswith("pyagent:spec_decode")
        }
        assert counters["pyagent:spec_decode_num_draft_tokens_total"] > 0
        assert 0 < counters["pyagent:spec_decode_num_accepted_tokens_total"]
        assert 'pyagent:spec_decode_num_accepted_tokens_per_pos_total{position="0"}' in counters
        wait_until(lambda: kv_all_free(srv.engine), what="every block free")
    finally:
        with contextlib.suppress(AssertionError):
            srv.stop()
