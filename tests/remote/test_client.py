"""`RemoteLLM` against a real pyagent server behind a fault injector (uvicorn on
127.0.0.1, port 0): answers delayed past the client's timeout, connections dropped
mid-answer, 5xx and 429 statuses; a refused connection; the circuit breaker opening
and probing; a rejected request. Every wait is bounded."""

from __future__ import annotations

import asyncio
import collections
import json
import socket
import time

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("tenacity")

from pyagent_ref.remote import (  # noqa: E402
    CircuitBreaker,
    RateLimiter,
    RemoteLLM,
    RemoteRequestError,
    RetryPolicy,
    request_body,
)
from pyagent_ref.sample.params import SamplingParams, StructuredOutputsParams  # noqa: E402
from pyagent_ref.server import ServerConfig, ServingEngine, build_app  # noqa: E402
from tests.server.conftest import ServerThread  # noqa: E402

MODEL = "tiny"
DELAY_S = 1.0  # an injected delay; the clients here time out well before it
GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
FAST = RetryPolicy(max_attempts=5, backoff_s=0.01, max_backoff_s=0.05)


class Faults:
    """ASGI middleware: each POST takes the next fault of ``script`` (none left: it is
    served as is). A fault is a status (answered with an OpenAI-shaped error body;
    429/503 with Retry-After: 0), "drop" (a 200 whose body stops halfway, then the
    connection closes), "delay" (served after DELAY_S), "html" (a 200 that is not JSON)
    or "empty" (a 200 of ``{}``)."""

    def __init__(self, app) -> None:
        self.app = app
        self.script: collections.deque = collections.deque()
        self.posts = 0

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            return await self.app(scope, receive, send)
        self.posts += 1
        fault = self.script.popleft() if self.script else None
        if isinstance(fault, int):
            body = {"error": {"message": f"injected {fault}", "type": "server_error"}}
            headers = [(b"content-type", b"application/json")]
            if fault in (429, 503):
                headers.append((b"retry-after", b"0"))
            await send({"type": "http.response.start", "status": fault, "headers": headers})
            await send({"type": "http.response.body", "body": json.dumps(body).encode()})
        elif fault in ("html", "empty"):  # a proxy's page; JSON that is no completion
            page = b"<html>bad gateway</html>" if fault == "html" else b"{}"
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": page})
        elif fault == "drop":
            headers = [(b"content-type", b"application/json"), (b"content-length", b"500")]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": b'{"id": "cmpl-', "more_body": True})
            raise ConnectionAbortedError("injected: the connection drops mid-answer")
        else:
            if fault == "delay":
                await asyncio.sleep(DELAY_S)
            await self.app(scope, receive, send)


@pytest.fixture(scope="module")
def backend():
    engine = ServingEngine(num_kv_blocks=256, max_num_seqs=8)
    faults = Faults(build_app(engine, ServerConfig(served_model_name=MODEL)))
    srv = ServerThread(faults).start()
    yield srv, faults
    srv.stop()


def remote(srv, **kwargs) -> RemoteLLM:
    kwargs = {"retry": FAST, "timeout_s": 0.5 * DELAY_S} | kwargs
    return RemoteLLM(srv.url + "/v1", **kwargs)


def texts(outs) -> list[str]:
    return [c.text for o in outs for c in o.outputs]


def test_every_fault_is_retried_through_to_the_same_answer(backend):
    srv, faults = backend
    prompts = ["def main():\n    print(", "import os\n"]
    with remote(srv) as llm:
        assert llm.model == MODEL  # asked of /v1/models
        expected = llm.generate(prompts, GREEDY)
        assert [o.outputs[0].finish_reason for o in expected] == ["length", "length"]
        for fault in (503, 500, 502, 429, "drop", "delay", "html"):
            faults.script.extend([fault, fault])
            posts = faults.posts
            start = time.monotonic()
            got = llm.generate(prompts[0], GREEDY)
            assert texts(got) == texts(expected[:1]), fault
            assert faults.posts == posts + 3 and not faults.script, fault
            assert time.monotonic() - start < 2 * DELAY_S + 5
        assert llm.breaker.state == "closed"


def test_an_answer_that_is_no_completion_ends_that_prompt_with_error(backend):
    srv, faults = backend
    with remote(srv, model=MODEL) as llm:
        faults.script.append("empty")
        (out,) = llm.generate("x", GREEDY)
    assert out.outputs[0].finish_reason == "error"
    assert out.outputs[0].error.startswith("the server's answer is not a completion (KeyError")


def test_chat_and_token_id_prompts(backend):
    srv, faults = backend
    with remote(srv, model=MODEL) as llm:
        faults.script.extend(["drop", 503])
        (out,) = llm.chat([{"role": "user", "content": "hi"}], GREEDY)
        assert out.outputs[0].finish_reason == "length" and out.outputs[0].text
        (out,) = llm.generate({"prompt_token_ids": [5, 6, 7]}, GREEDY)
        assert out.prompt_token_ids == [5, 6, 7] and out.outputs[0].text
        n2 = SamplingParams(temperature=1.0, seed=1, n=2, max_tokens=4)
        (out,) = llm.generate("x", n2)
        assert [c.index for c in out.outputs] == [0, 1]


def test_spent_retries_end_that_prompt_with_error_and_leave_the_others(backend):
    srv, faults = backend
    with remote(srv, model=MODEL, retry=RetryPolicy(3, 0.01, 0.02), max_concurrency=1) as llm:
        faults.script.extend([503, 500, 503])  # the first prompt's three attempts
        first, second = llm.generate(["a", "b"], GREEDY)
        (comp,) = first.outputs
        assert comp.finish_reason == "error"
        assert comp.error == "RemoteHTTPError: the server answered 503: injected 503"
        assert second.outputs[0].finish_reason == "length"


def test_the_circuit_opens_fails_fast_and_closes_after_a_good_probe(backend):
    srv, faults = backend
    breaker = CircuitBreaker(failure_threshold=2, reset_timeout_s=0.3)
    once = RetryPolicy(max_attempts=1)
    with remote(srv, model=MODEL, retry=once, breaker=breaker, max_concurrency=1) as llm:
        faults.script.extend([500, "drop"])
        outs = llm.generate(["a", "b", "c"], GREEDY)
        posts = faults.posts
        assert [o.outputs[0].finish_reason for o in outs] == ["error"] * 3
        assert outs[2].outputs[0].error.startswith("CircuitOpenError: the circuit breaker is open")
        assert breaker.state == "open"
        (again,) = llm.generate("d", GREEDY)  # fails fast: the server sees nothing
        assert again.outputs[0].finish_reason == "error" and faults.posts == posts
        time.sleep(0.35)
        assert breaker.state == "half_open"
        (probe,) = llm.generate("e", GREEDY)
        assert probe.outputs[0].finish_reason == "length" and breaker.state == "closed"


def test_the_rate_limit_spaces_the_attempts_of_concurrent_prompts(backend):
    srv, faults = backend
    sent = []

    class Recorded(RateLimiter):
        def acquire(self) -> float:
            waited = super().acquire()
            sent.append(time.monotonic())
            return waited

    limiter = Recorded(10, burst=1)
    with remote(srv, model=MODEL, rate_limiter=limiter, max_concurrency=4) as llm:
        faults.script.append(503)  # its retry waits for a token too
        start = time.monotonic()
        outs = llm.generate(["a", "b", "c", "d"], GREEDY)
    assert [o.outputs[0].finish_reason for o in outs] == ["length"] * 4
    assert len(sent) == 5  # the k-th attempt went out k/10 s after the start at the soonest
    assert all(t >= start + k / 10 - 1e-3 for k, t in enumerate(sorted(sent)))


def test_a_rejected_request_raises_once_and_is_not_retried(backend):
    srv, faults = backend
    with remote(srv, model="no-such-model") as llm:
        posts = faults.posts
        with pytest.raises(RemoteRequestError, match="the server answered 404: the model") as info:
            llm.generate("x", GREEDY)
        assert isinstance(info.value, ValueError) and info.value.status == 404
        assert faults.posts == posts + 1
        assert llm.breaker.state == "closed"  # the server is fine


def test_a_server_that_is_not_there():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again: nothing listens there
    llm = RemoteLLM(f"http://127.0.0.1:{port}/v1", model="m", retry=RetryPolicy(3, 0.01, 0.02))
    with llm:
        (out,) = llm.generate("x", GREEDY)
    assert out.outputs[0].finish_reason == "error"
    assert out.outputs[0].error.startswith("ConnectError")


def test_the_request_body_sends_extras_only_when_set():
    assert request_body(SamplingParams(max_tokens=5)) == {
        "n": 1,
        "temperature": 1.0,
        "top_p": 1.0,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "max_tokens": 5,
    }
    params = SamplingParams(
        top_k=5, stop="x", seed=3, logit_bias={3: 1.0}, structured_outputs={"regex": "a+"}
    )
    body = request_body(params)
    assert body["top_k"] == 5 and body["stop"] == ["x"] and body["seed"] == 3
    assert body["logit_bias"] == {"3": 1.0} and body["structured_outputs"]["regex"] == "a+"
    assert StructuredOutputsParams(**body["structured_outputs"]) == params.structured_outputs
    with pytest.raises(ValueError, match="logprobs cannot be sent to a remote server"):
        request_body(SamplingParams(logprobs=2))
    with pytest.raises(ValueError, match="base_url must be an http"):
        RemoteLLM("localhost:8000")
