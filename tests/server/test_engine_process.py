"""The server with the engine core in its own process (`--engine-process`).

A representative subset of the server's behaviour suites runs again here against a
process-mode engine (the test functions are imported; this module's `server` fixture
overrides the conftest's): streaming, logprobs, metrics, errors, abort on disconnect,
and the load test with cancellations. Then what only this mode has: a core process that
dies (the requests in flight end with "error", new ones are a 503) and leaves no process
behind.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import signal
import threading

import httpx
import openai
import pytest

from pyagent_ref.cli import _add_serve_parser
from pyagent_ref.server import ServerConfig, ServingEngine, build_app

from .conftest import API_KEY, MODEL, ServerThread, wait_until
from .test_endpoints import (  # noqa: F401 - run here against the process-mode server
    test_chat_completion_streaming_n_logprobs,
    test_completion_streaming_matches_and_reports_usage,
    test_disconnect_aborts_and_frees_blocks,
    test_metrics,
)
from .test_errors import test_the_client_raises_the_right_exceptions  # noqa: F401
from .test_load import test_concurrent_streams_with_cancellations  # noqa: F401


@pytest.fixture(scope="module")
def server():
    engine = ServingEngine(num_kv_blocks=1024, max_num_seqs=64, engine_process=True)
    config = ServerConfig(
        served_model_name=MODEL,
        api_key=API_KEY,
        tool_call_parser="hermes",
        reasoning_parser="deepseek_v3",
    )
    srv = ServerThread(build_app(engine, config)).start()
    yield srv
    with contextlib.suppress(AssertionError):
        srv.stop()
    assert not engine.core.process.is_alive()


def test_the_engine_runs_in_another_process(server):
    process = server.engine.core.process
    assert process.is_alive() and process.pid != os.getpid()


def _stream_lines(srv: ServerThread, started: threading.Event, lines: list) -> None:
    body = {"model": MODEL, "prompt": "x", "max_tokens": 500, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", srv.url + "/v1/completions", json=body, timeout=60) as r:
        for line in r.iter_lines():
            if line:
                lines.append(line)
                started.set()


def _complete(srv: ServerThread, answers: list) -> None:
    body = {"model": MODEL, "prompt": "z", "max_tokens": 500, "ignore_eos": True}
    answers.append(httpx.post(srv.url + "/v1/completions", json=body, timeout=60))


def test_a_dead_core_process_ends_streams_with_error_and_is_a_503():
    """SIGKILL the core with a stream and a plain request in flight: both end with the
    core's death as their reason, /health and new requests are 503, nothing hangs and
    no process is left behind."""
    engine = ServingEngine(num_kv_blocks=256, max_num_seqs=4, engine_process=True)
    srv = ServerThread(build_app(engine, ServerConfig(served_model_name=MODEL))).start()
    try:
        started, lines, answers = threading.Event(), [], []
        t = threading.Thread(target=_stream_lines, args=(srv, started, lines))
        t.start()
        plain = threading.Thread(target=_complete, args=(srv, answers))
        plain.start()
        assert started.wait(30)
        wait_until(lambda: len(engine.processor.requests) == 2, what="both requests to run")
        assert httpx.get(srv.url + "/health").status_code == 200
        os.kill(engine.core.process.pid, signal.SIGKILL)
        t.join(30)
        plain.join(30)
        assert not t.is_alive() and not plain.is_alive()
        events = [json.loads(ln[6:]) for ln in lines if ln != "data: [DONE]"]
        error = events[-1]["error"]  # the stream ends with an error event
        assert error["message"].startswith("the request failed in the engine"), error
        assert "the engine core process died (exit code -9)" in error["message"]
        (answer,) = answers  # the plain request: a 500 that says why
        assert answer.status_code == 500
        assert "the engine core process died (exit code -9)" in answer.json()["error"]["message"]
        health = httpx.get(srv.url + "/health")
        assert health.status_code == 503
        assert "the engine core process died" in health.json()["error"]["message"]
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0)
        with pytest.raises(openai.InternalServerError) as info:
            client.completions.create(model=MODEL, prompt="y", max_tokens=2)
        assert info.value.status_code == 503
        assert "the engine core process died" in str(info.value)
        assert httpx.get(srv.url + "/metrics").status_code == 200  # still scraped
        wait_until(lambda: not engine.processor.requests, what="the requests to end")
    finally:
        srv.stop()
    assert not engine.core.process.is_alive()
    assert engine.core.process.exitcode == -signal.SIGKILL  # reaped: no zombie left
    assert engine.core.process not in multiprocessing.active_children()
    assert not os.path.exists(engine.core._dir)  # its sockets' directory is gone


def test_pyagent_serve_runs_the_engine_core_in_its_own_process_by_default():
    parser = argparse.ArgumentParser()
    _add_serve_parser(parser.add_subparsers())
    assert parser.parse_args(["serve"]).engine_process is True
    assert parser.parse_args(["serve", "--no-engine-process"]).engine_process is False
