"""Request spans (observe.tracing) from an offline engine, a server whose core runs in
its own process, and an OTLP/HTTP collector on 127.0.0.1: one span per completion, its
phases laid end to end on the engine's own timestamps, errors marked."""

from __future__ import annotations

import http.server
import threading

import pytest

pytest.importorskip("opentelemetry.sdk")

from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (  # noqa: E402
    InMemorySpanExporter,
)
from opentelemetry.trace import StatusCode  # noqa: E402

from pyagent_ref.engine.llm import LLM  # noqa: E402
from pyagent_ref.engine.outputs import CompletionOutput, RequestMetrics, RequestOutput  # noqa: E402
from pyagent_ref.observe.tracing import RequestTracer  # noqa: E402
from pyagent_ref.sample.params import SamplingParams  # noqa: E402

PHASES = ("queued", "prefill", "decode", "detokenize")


def memory_tracer() -> tuple[RequestTracer, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return RequestTracer(provider), exporter


def by_request(spans) -> dict:
    """{(request id, completion index): (request span, {phase: span})}."""
    roots = {s.context.span_id: s for s in spans if s.name == "llm_request"}
    out = {}
    for root in roots.values():
        key = (root.attributes["gen_ai.request.id"], root.attributes["pyagent.completion.index"])
        mine = [s for s in spans if s.parent and s.parent.span_id == root.context.span_id]
        children = {s.name: s for s in mine}
        out[key] = (root, children)
    return out


def check_request(root, children, metrics: RequestMetrics, finish_reason: str) -> None:
    """The phases tile the request; their lengths are the engine's metrics."""
    assert set(children) == set(PHASES)
    q, p, d, t = (children[name] for name in PHASES)
    assert all(c.context.trace_id == root.context.trace_id for c in children.values())
    assert root.start_time <= q.start_time <= q.end_time == p.start_time
    assert p.start_time <= p.end_time == d.start_time == t.start_time
    assert d.end_time == t.end_time == root.end_time
    ns = 1e-9
    assert (p.end_time - root.start_time) * ns == pytest.approx(metrics.ttft, abs=2e-6)
    assert (root.end_time - root.start_time) * ns == pytest.approx(metrics.e2e, abs=2e-6)
    assert (q.end_time - q.start_time) * ns == pytest.approx(metrics.queued_s, abs=2e-6)
    a = root.attributes
    assert a["gen_ai.usage.input_tokens"] == metrics.num_prompt_tokens
    assert a["gen_ai.usage.output_tokens"] == metrics.num_generated_tokens
    assert a["gen_ai.response.finish_reasons"] == (finish_reason,)
    assert a["gen_ai.latency.time_to_first_token"] == metrics.ttft
    assert 0 < t.attributes["pyagent.detokenize_s"] == metrics.detokenize_s
    assert metrics.detokenize_s < metrics.e2e


def test_an_offline_engine_traces_every_completion():
    llm = LLM(num_kv_blocks=64, max_num_seqs=4)
    llm.tracer, exporter = memory_tracer()
    outs = llm.generate(
        ["def main():", "import os"],
        [
            SamplingParams(temperature=0, max_tokens=6, ignore_eos=True),
            SamplingParams(temperature=1.0, seed=3, n=2, max_tokens=4, ignore_eos=True),
        ],
    )
    spans = by_request(exporter.get_finished_spans())
    assert len(spans) == 3
    for out in outs:
        for comp, m in zip(out.outputs, out.metrics, strict=True):
            root, children = spans[(out.request_id, comp.index)]
            check_request(root, children, m, "length")
    llm.shutdown()


def test_a_failed_completion_is_an_error_span_and_a_tracer_bug_fails_nothing():
    tracer, exporter = memory_tracer()
    metrics = RequestMetrics(10.0, None, None, [], 0.5, 3, 0, 0)  # never scheduled
    comp = CompletionOutput(0, "", [], finish_reason="error", error="the core died")
    tracer.trace(RequestOutput("r", "x", [1, 2, 3], [comp], True, [metrics]))
    (root,) = exporter.get_finished_spans()  # no phase happened: no child span
    assert root.status.status_code == StatusCode.ERROR
    assert root.status.description == "the core died"
    assert root.attributes["error.type"] == "engine_error"
    assert (root.end_time - root.start_time) == pytest.approx(0.5e9, abs=2e3)

    llm = LLM(num_kv_blocks=64, max_num_seqs=4)

    class Broken:
        def trace(self, out):
            raise RuntimeError("exporter bug")

    llm.tracer = Broken()
    (out,) = llm.generate("x", SamplingParams(max_tokens=2, ignore_eos=True))
    assert out.outputs[0].finish_reason == "length"


def test_the_endpoint_option():
    with pytest.raises(ValueError, match="otlp_traces_endpoint must be an http"):
        RequestTracer.from_endpoint("collector:4318")
    with pytest.raises(ValueError, match="otlp_traces_endpoint must be None or a URL"):
        LLM(otlp_traces_endpoint="")
    RequestTracer.from_endpoint("console").shutdown()


class _Collector(http.server.BaseHTTPRequestHandler):
    bodies: list = []

    def do_POST(self):  # noqa: N802 - http.server's name
        self.bodies.append((self.path, self.rfile.read(int(self.headers["Content-Length"]))))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


def test_spans_reach_an_otlp_collector():
    pytest.importorskip("opentelemetry.exporter.otlp.proto.http")
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    collector = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Collector)
    thread = threading.Thread(target=collector.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{collector.server_address[1]}/v1/traces"
        llm = LLM(num_kv_blocks=64, max_num_seqs=4, otlp_traces_endpoint=url)
        (out,) = llm.generate("x", SamplingParams(max_tokens=3, ignore_eos=True))
        llm.shutdown()  # flushes the batch
    finally:
        collector.shutdown()
        thread.join(10)
        collector.server_close()
    names, ids = [], set()
    for path, body in _Collector.bodies:
        assert path == "/v1/traces"
        message = ExportTraceServiceRequest.FromString(body)
        for resource_spans in message.resource_spans:
            service = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
            assert service["service.name"] == "pyagent"
            for scope in resource_spans.scope_spans:
                for span in scope.spans:
                    names.append(span.name)
                    attributes = {a.key: a.value.string_value for a in span.attributes}
                    ids.add(attributes.get("gen_ai.request.id"))
    assert sorted(names) == sorted(["llm_request", *PHASES])
    assert ids == {out.request_id, None}  # the phases carry no request id of their own
