"""GET /metrics: Prometheus metrics under a ``pyagent:`` prefix, with vLLM's meanings.

Read from the engine at scrape time (a custom collector, nothing to keep in sync):

    pyagent:num_requests_running       requests in the running batch
    pyagent:num_requests_waiting       requests waiting for a seat
    pyagent:kv_cache_usage_perc        fraction of KV cache blocks in use, in [0, 1]
    pyagent:prefix_cache_queries_total tokens looked up in the prefix cache
    pyagent:prefix_cache_hits_total    of those, tokens found there
    pyagent:num_preemptions_total      preemptions since the engine started
    pyagent:spec_decode_num_drafts_total, pyagent:spec_decode_num_draft_tokens_total,
    pyagent:spec_decode_num_accepted_tokens_total
        speculative decoding: request-steps that verified drafts, drafts proposed,
        drafts accepted (only with a speculative_config)
    pyagent:spec_decode_num_accepted_tokens_per_pos_total{position}
        drafts accepted at each position of the draft

Counted by the server as outputs stream by (`ServerMetrics.observe`):

    pyagent:prompt_tokens_total        prompt tokens of requests that produced output
    pyagent:generation_tokens_total    tokens generated
    pyagent:request_success_total      finished requests, by finished_reason
    pyagent:time_to_first_token_seconds, pyagent:inter_token_latency_seconds,
    pyagent:e2e_request_latency_seconds
        histograms, from each finished completion's `RequestMetrics`

A registry of its own per server, so that several servers in one process (the tests)
do not share counters.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from ..engine.outputs import RequestOutput
from .engine import ServingEngine

_LATENCY_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5,
    0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip


class _EngineCollector:
    """Gauges and counters that the engine keeps itself, read when scraped."""

    def __init__(self, engine: ServingEngine) -> None:
        self.engine = engine

    def collect(self):
        core = self.engine.core
        kv = core.kv.metrics()
        values = [
            (GaugeMetricFamily, "num_requests_running", "Requests in the running batch.",
             len(core.scheduler.running)),
            (GaugeMetricFamily, "num_requests_waiting", "Requests waiting for a seat.",
             len(core.scheduler.waiting)),
            (GaugeMetricFamily, "kv_cache_usage_perc",
             "Fraction of KV cache blocks in use (1 = all).", kv.usage),
            (CounterMetricFamily, "prefix_cache_queries",
             "Prompt tokens looked up in the prefix cache.", kv.queries),
            (CounterMetricFamily, "prefix_cache_hits",
             "Prompt tokens found in the prefix cache.", kv.hits),
            (CounterMetricFamily, "num_preemptions",
             "Requests preempted since the engine started.", core.stats.preemptions),
        ]  # fmt: skip
        spec = core.stats.spec
        if core.config.speculative_config is not None:
            values += [
                (CounterMetricFamily, "spec_decode_num_drafts",
                 "Request-steps that verified speculative drafts.", spec.num_verified),
                (CounterMetricFamily, "spec_decode_num_draft_tokens",
                 "Speculative draft tokens proposed and verified.", spec.num_draft_tokens),
                (CounterMetricFamily, "spec_decode_num_accepted_tokens",
                 "Speculative draft tokens accepted.", spec.num_accepted_tokens),
            ]  # fmt: skip
        for family, name, doc, value in values:
            yield family(f"pyagent:{name}", doc, value=value)
        if core.config.speculative_config is not None:
            per_position = CounterMetricFamily(
                "pyagent:spec_decode_num_accepted_tokens_per_pos",
                "Speculative draft tokens accepted, by position in the draft.",
                labels=["position"],
            )
            for position, count in enumerate(spec.accepted_per_position):
                per_position.add_metric([str(position)], count)
            yield per_position


class ServerMetrics:
    def __init__(self, engine: ServingEngine) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(_EngineCollector(engine))
        reg = self.registry
        self.prompt_tokens = Counter(
            "pyagent:prompt_tokens", "Prompt tokens of requests.", registry=reg
        )
        self.generation_tokens = Counter(
            "pyagent:generation_tokens", "Generated tokens.", registry=reg
        )
        self.success = Counter(
            "pyagent:request_success",
            "Finished requests, by finish reason.",
            ["finished_reason"],
            registry=reg,
        )
        self.ttft = Histogram(
            "pyagent:time_to_first_token_seconds",
            "Time from arrival to the first generated token.",
            buckets=_LATENCY_BUCKETS,
            registry=reg,
        )
        self.itl = Histogram(
            "pyagent:inter_token_latency_seconds",
            "Time between two consecutive generated tokens of a request.",
            buckets=_LATENCY_BUCKETS,
            registry=reg,
        )
        self.e2e = Histogram(
            "pyagent:e2e_request_latency_seconds",
            "Time from arrival to the last token.",
            buckets=_LATENCY_BUCKETS,
            registry=reg,
        )

    def observe(self, out: RequestOutput, first: bool) -> None:
        """Count one streamed delta of a request (``first``: its first)."""
        if first:
            self.prompt_tokens.inc(len(out.prompt_token_ids))
        self.generation_tokens.inc(sum(len(c.token_ids) for c in out.outputs))
        if not out.finished:
            return
        for comp in out.outputs:
            self.success.labels(comp.finish_reason or "unknown").inc()
        for m in out.metrics:
            if m.ttft is not None:
                self.ttft.observe(m.ttft)
            if m.e2e is not None:
                self.e2e.observe(m.e2e)
            for gap in m.itl:
                self.itl.observe(gap)

    def render(self) -> bytes:
        return generate_latest(self.registry)
