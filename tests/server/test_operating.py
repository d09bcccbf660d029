"""Operating a server whose engine core runs in its own process: the X-Request-Id shared
by the answer, the engine request, its spans and its JSON log line; the profiler's
endpoints writing a trace from the core process."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import os
import re

import httpx
import pytest

pytest.importorskip("opentelemetry.sdk")

from pyagent_ref.server import ServerConfig, ServingEngine, build_app  # noqa: E402
from tests.observe.test_profiler import aten_ops  # noqa: E402
from tests.observe.test_tracing import PHASES, by_request, memory_tracer  # noqa: E402

from .conftest import API_KEY, MODEL, ServerThread  # noqa: E402

BODY = {"model": MODEL, "prompt": "def main():", "max_tokens": 5, "ignore_eos": True}


@pytest.fixture(scope="module")
def operated(tmp_path_factory):
    traces = tmp_path_factory.mktemp("traces")
    engine = ServingEngine(
        num_kv_blocks=256, max_num_seqs=8, engine_process=True, profiler_dir=str(traces)
    )
    engine.tracer, exporter = memory_tracer()
    srv = ServerThread(build_app(engine, ServerConfig(served_model_name=MODEL))).start()
    yield srv, exporter, traces
    srv.stop()
    assert not engine.core.process.is_alive()


def test_one_request_id_from_the_header_to_the_spans_and_the_logs(operated):
    srv, exporter, _ = operated
    stream, root = io.StringIO(), logging.getLogger()
    from pyagent_ref.observe.logs import configure_logging

    level = root.level
    handler = configure_logging("info", json_lines=True, stream=stream)
    try:
        r = httpx.post(
            srv.url + "/v1/completions", json=BODY, headers={"X-Request-Id": "op-1"}, timeout=60
        )
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
    assert r.status_code == 200 and r.headers["x-request-id"] == "op-1"
    rid = r.json()["id"]
    assert re.fullmatch(r"cmpl-op-1-[0-9a-f]{8}", rid)
    (root_span, children) = by_request(exporter.get_finished_spans())[(f"{rid}-0", 0)]
    assert set(children) == set(PHASES)
    assert root_span.attributes["gen_ai.usage.output_tokens"] == 5
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    (done,) = [x for x in lines if x["message"].startswith(f"request {rid}-0 finished")]
    assert done["request_id"] == f"{rid}-0" and done["finish_reasons"] == ["length"]
    assert done["logger"] == "pyagent_ref.engine.llm" and done["ttft_s"] > 0


def test_one_request_id_sent_twice_at_once_serves_both(operated):
    """A client's retry may reuse its X-Request-Id while the first attempt runs."""
    srv, _, _ = operated
    body = BODY | {"max_tokens": 40, "temperature": 0}

    async def both():
        async with httpx.AsyncClient(base_url=srv.url, timeout=60) as client:
            headers = {"X-Request-Id": "again"}
            return await asyncio.gather(
                *(client.post("/v1/completions", json=body, headers=headers) for _ in range(2))
            )

    first, second = asyncio.run(both())
    assert first.status_code == second.status_code == 200
    assert first.json()["id"] != second.json()["id"]
    assert first.json()["choices"][0]["text"] == second.json()["choices"][0]["text"]


def test_a_request_id_that_is_not_a_plain_token_is_replaced(operated):
    srv, _, _ = operated
    r = httpx.get(srv.url + "/health", headers={"X-Request-Id": "two words"})
    rid = r.headers["x-request-id"]
    assert len(rid) == 32 and int(rid, 16) >= 0
    assert httpx.get(srv.url + "/health").headers["x-request-id"] != rid


def test_the_profiler_endpoints_trace_the_core_process(operated):
    srv, _, traces = operated
    assert httpx.post(srv.url + "/stop_profile").status_code == 400
    assert httpx.post(srv.url + "/start_profile").status_code == 200
    started_twice = httpx.post(srv.url + "/start_profile")
    assert started_twice.status_code == 400
    assert "already running" in started_twice.json()["error"]["message"]
    assert httpx.post(srv.url + "/v1/completions", json=BODY, timeout=60).status_code == 200
    r = httpx.post(srv.url + "/stop_profile", timeout=60)
    assert r.status_code == 200
    path = r.json()["trace"]
    assert os.path.dirname(path) == str(traces)
    core_pid = srv.engine.core.process.pid
    assert f"pyagent-{core_pid}-" in os.path.basename(path) and core_pid != os.getpid()
    assert {"aten::mm", "aten::linear", "aten::matmul"} & aten_ops(path)


def test_profiling_is_off_without_a_directory(server):
    headers = {"Authorization": f"Bearer {API_KEY}"}
    r = httpx.post(server.url + "/start_profile", headers=headers)
    assert r.status_code == 400
    assert "profiling is not enabled" in r.json()["error"]["message"]


def test_the_serve_flags():
    import argparse

    from pyagent_ref.cli import _add_serve_parser, _engine_args

    parser = argparse.ArgumentParser()
    _add_serve_parser(parser.add_subparsers())
    args = parser.parse_args(
        ["serve", "--otlp-traces-endpoint", "console", "--profiler-dir", "/tmp/t"]
        + ["--log-format", "json"]
    )
    assert _engine_args(args) == {"otlp_traces_endpoint": "console", "profiler_dir": "/tmp/t"}
    assert args.log_format == "json" and parser.parse_args(["serve"]).log_format == "text"
    with pytest.raises(SystemExit):
        parser.parse_args(["serve", "--log-format", "xml"])
