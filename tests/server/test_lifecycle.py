"""A server with one seat and no queue: 429, sleep (503), graceful shutdown (drain); with
the engine in this process and in its own (--engine-process)."""

from __future__ import annotations

import threading

import httpx
import openai
import pytest

from pyagent_ref.server import ServerConfig, ServingEngine, build_app

from .conftest import MODEL, ServerThread, kv_all_free


@pytest.fixture(scope="module", params=["thread", "process"])
def small_server(request):
    engine = ServingEngine(
        num_kv_blocks=256, max_num_seqs=1, engine_process=request.param == "process"
    )
    srv = ServerThread(build_app(engine, ServerConfig(served_model_name=MODEL, max_queue=0)))
    yield srv.start()
    if srv.thread.is_alive():
        srv.stop()


def _long_stream(srv: ServerThread, started: threading.Event, result: list) -> None:
    body = {"model": MODEL, "prompt": "x", "max_tokens": 60, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", srv.url + "/v1/completions", json=body, timeout=60) as r:
        lines = []
        for line in r.iter_lines():
            if line:
                lines.append(line)
                started.set()
        result.append(lines)


def test_a_full_queue_is_429_and_sleep_is_503(small_server):
    client = openai.OpenAI(base_url=small_server.url + "/v1", api_key="x", max_retries=0)
    started, result = threading.Event(), []
    t = threading.Thread(target=_long_stream, args=(small_server, started, result))
    t.start()
    assert started.wait(30)
    with pytest.raises(openai.RateLimitError):
        client.completions.create(model=MODEL, prompt="y", max_tokens=2)
    t.join(60)
    assert result and result[0][-1] == "data: [DONE]"
    assert client.completions.create(model=MODEL, prompt="y", max_tokens=2).choices
    engine = small_server.engine
    small_server.call(engine.sleep())
    try:
        with pytest.raises(openai.InternalServerError) as info:
            client.completions.create(model=MODEL, prompt="y", max_tokens=2)
        assert info.value.status_code == 503
    finally:
        small_server.call(engine.wake_up())
    assert client.completions.create(model=MODEL, prompt="y", max_tokens=2).choices


def test_shutdown_drains_the_requests_in_flight(small_server):
    started, result = threading.Event(), []
    t = threading.Thread(target=_long_stream, args=(small_server, started, result))
    t.start()
    assert started.wait(30)
    small_server.stop()
    t.join(60)
    lines = result[0]
    assert lines[-1] == "data: [DONE]" and '"finish_reason":"length"' in lines[-2]
    assert kv_all_free(small_server.engine) and not small_server.engine.core.accepting
    process = getattr(small_server.engine.core, "process", None)  # --engine-process
    assert process is None or process.exitcode == 0  # shut down and reaped
