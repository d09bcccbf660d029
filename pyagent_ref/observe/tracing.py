"""OpenTelemetry traces of requests: one span per request, its phases as child spans.

    llm_request                 arrival -> finished   (attributes below)
      ├─ queued                 queued -> first scheduled
      ├─ prefill                first scheduled -> first token
      ├─ decode                 first token -> finished
      └─ detokenize             first token -> finished; pyagent.detokenize_s: the time
                                the frontend spent detokenizing and matching stop strings

Spans are built when a request finishes, from the timestamps the engine keeps anyway
(`RequestMetrics`, on time.monotonic), shifted onto the wall clock OpenTelemetry
wants: nothing is timed twice. With n > 1 each completion is a span of its own (its own
times), all with the parent's request id. A phase that did not happen (an aborted
request never scheduled) has no span.

Attributes of ``llm_request`` follow OpenTelemetry's GenAI conventions where one exists
(``gen_ai.request.id``, ``gen_ai.usage.input_tokens``, ``gen_ai.usage.output_tokens``,
``gen_ai.response.finish_reasons``), and vLLM's latency names
(``gen_ai.latency.time_in_queue``, ``.time_to_first_token``, ``.e2e``); plus
``pyagent.num_preemptions`` and, for a failed completion, ``error.type`` and an ERROR
status with the error message.

`RequestTracer.from_endpoint` builds a tracer provider that exports in batches to an
OTLP/HTTP collector (``--otlp-traces-endpoint http://host:4318/v1/traces``) or, for
"console", prints each span as JSON; tests pass a provider with an in-memory exporter.
"""

from __future__ import annotations

import time

from ..engine.outputs import CompletionOutput, RequestMetrics, RequestOutput

try:
    from opentelemetry import trace
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        ConsoleSpanExporter,
        SimpleSpanProcessor,
    )
except ImportError as exc:  # pragma: no cover - the otel extra installs them
    raise ImportError(
        f"tracing needs the OpenTelemetry SDK ({exc}): pip install 'pyagent[otel]'"
    ) from exc

SERVICE_NAME = "pyagent"


class RequestTracer:
    """Turns finished `RequestOutput`s into spans on ``provider``'s tracer."""

    def __init__(self, provider: trace.TracerProvider) -> None:
        self.provider = provider
        self.tracer = provider.get_tracer("pyagent_ref")

    @classmethod
    def from_endpoint(cls, endpoint: str) -> RequestTracer:
        """ "console": spans printed to stdout as they end; else an OTLP/HTTP traces
        endpoint (needs opentelemetry-exporter-otlp-proto-http), exported in batches."""
        if not isinstance(endpoint, str) or not endpoint:
            raise ValueError(f"otlp_traces_endpoint must be a URL or 'console', got {endpoint!r}")
        provider = TracerProvider(resource=Resource.create({"service.name": SERVICE_NAME}))
        if endpoint == "console":
            provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter()))
        else:
            if not endpoint.startswith(("http://", "https://")):
                raise ValueError(
                    f"otlp_traces_endpoint must be an http(s) URL or 'console', got {endpoint!r}"
                )
            try:
                from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            except ImportError as exc:
                raise ImportError(
                    f"an OTLP endpoint needs opentelemetry-exporter-otlp-proto-http ({exc}): "
                    "pip install 'pyagent[otel]'"
                ) from exc
            provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
        return cls(provider)

    def trace(self, out: RequestOutput) -> None:
        """The spans of one finished request (one per completion)."""
        shift_ns = time.time_ns() - time.monotonic_ns()  # monotonic -> wall clock
        for comp, m in zip(out.outputs, out.metrics, strict=False):
            self._completion(out, comp, m, shift_ns)

    def _completion(
        self, out: RequestOutput, comp: CompletionOutput, m: RequestMetrics, shift_ns: int
    ) -> None:
        def at(seconds_after_arrival: float) -> int:
            return int((m.arrival + seconds_after_arrival) * 1e9) + shift_ns

        end = m.e2e if m.e2e is not None else time.monotonic() - m.arrival
        attributes = {
            "gen_ai.request.id": out.request_id,
            "gen_ai.usage.input_tokens": m.num_prompt_tokens,
            "gen_ai.usage.output_tokens": m.num_generated_tokens,
            "gen_ai.response.finish_reasons": [comp.finish_reason or "unknown"],
            "gen_ai.latency.e2e": end,
            "pyagent.completion.index": comp.index,
            "pyagent.num_preemptions": m.num_preemptions,
        }
        if m.queued_s is not None:
            attributes["gen_ai.latency.time_in_queue"] = m.queued_s
        if m.ttft is not None:
            attributes["gen_ai.latency.time_to_first_token"] = m.ttft
        span = self.tracer.start_span(
            "llm_request", start_time=at(0), attributes=attributes, kind=trace.SpanKind.SERVER
        )
        if comp.finish_reason == "error":
            span.set_attribute("error.type", "engine_error")
            span.set_status(trace.Status(trace.StatusCode.ERROR, comp.error or "error"))
        context = trace.set_span_in_context(span)
        phases = []
        if m.scheduled_s is not None:
            if m.queued_s is not None:
                phases.append(("queued", m.scheduled_s - m.queued_s, m.scheduled_s, {}))
            if m.ttft is not None:
                phases.append(("prefill", m.scheduled_s, m.ttft, {}))
        if m.ttft is not None:
            phases.append(("decode", m.ttft, end, {}))
            phases.append(("detokenize", m.ttft, end, {"pyagent.detokenize_s": m.detokenize_s}))
        for name, start, stop, extra in phases:
            child = self.tracer.start_span(
                name, context=context, start_time=at(start), attributes=extra
            )
            child.end(end_time=at(max(start, stop)))
        span.end(end_time=at(end))

    def shutdown(self) -> None:
        """Export what is pending and stop (the provider's exporters)."""
        shutdown = getattr(self.provider, "shutdown", None)
        if shutdown is not None:
            shutdown()
