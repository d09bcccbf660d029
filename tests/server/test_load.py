"""Many concurrent streaming clients with random cancellations, on loopback.

32 clients by default (CI); PYAGENT_SERVER_LOAD_CLIENTS=200 for the issue's full size.
Every stream that is not cancelled completes and is well formed, none is lost, every
KV block is free afterwards, and repeated rounds leave the server's memory flat."""

from __future__ import annotations

import asyncio
import gc
import json
import os
import random
from collections import Counter

import httpx

from .conftest import API_KEY, MODEL, kv_all_free, wait_until

CLIENTS = int(os.environ.get("PYAGENT_SERVER_LOAD_CLIENTS", "32"))


async def _one(http: httpx.AsyncClient, url: str, i: int, rng: random.Random) -> str:
    chat = i % 2 == 0
    max_tokens = rng.randint(4, 24)
    body = {"model": MODEL, "max_tokens": max_tokens, "stream": True, "seed": i}
    if chat:
        body["messages"] = [{"role": "user", "content": f"request {i}"}]
    else:
        body["prompt"] = f"def f{i}("
    path = "/v1/chat/completions" if chat else "/v1/completions"
    cancel_after = rng.randint(1, 5) if rng.random() < 0.3 else None
    events, finish = 0, None
    async with http.stream("POST", url + path, json=body) as r:
        assert r.status_code == 200, await r.aread()
        async for line in r.aiter_lines():
            if not line:
                continue
            assert line.startswith("data: "), line
            if line == "data: [DONE]":
                assert finish in ("stop", "length"), (i, finish)
                return "done"
            event = json.loads(line[6:])
            assert "error" not in event, event
            for choice in event["choices"]:
                finish = choice.get("finish_reason") or finish
            events += 1
            if cancel_after is not None and events >= cancel_after:
                return "cancelled"
    raise AssertionError(f"stream {i} ended without [DONE]")


def _round(server, seed: int) -> list[str]:
    """CLIENTS concurrent streams (30% cancelled), bounded in time; their outcomes."""
    rng = random.Random(seed)

    async def main():
        limits = httpx.Limits(max_connections=CLIENTS)
        headers = {"Authorization": f"Bearer {API_KEY}"}
        async with httpx.AsyncClient(timeout=60, limits=limits, headers=headers) as http:
            return await asyncio.wait_for(
                asyncio.gather(*(_one(http, server.url, i, rng) for i in range(CLIENTS))),
                timeout=120,
            )

    outcomes = asyncio.run(main())
    wait_until(lambda: kv_all_free(server.engine), timeout=30, what="every KV block to be free")
    connections = server.server.server_state.connections
    wait_until(lambda: not connections, timeout=30, what="the server to close every connection")
    return outcomes


def test_concurrent_streams_with_cancellations(server):
    outcomes = _round(server, seed=0)
    assert len(outcomes) == CLIENTS
    assert outcomes.count("done") + outcomes.count("cancelled") == CLIENTS
    assert outcomes.count("done") > 0


def _our_objects() -> Counter[str]:
    """Live objects of pyagent's classes by class, but the prefix cache's records, which
    it keeps by design (up to its size) after their requests are gone."""
    gc.collect()
    count: Counter[str] = Counter()
    for obj in gc.get_objects():
        module = type(obj).__module__
        if isinstance(module, str) and module.startswith("pyagent_ref"):
            if not module.startswith("pyagent_ref.kv_cache"):
                count[f"{module}.{type(obj).__qualname__}"] += 1
    return count


def test_server_memory_stays_flat_under_repeated_load(server):
    """After a warm-up round, three more rounds of CLIENTS requests leave fewer of our
    objects behind than there were requests (a leak of anything per request, its outputs,
    stream, detokenizer or metrics entry, would leave at least one each), and the
    process's resident memory grows by less than 64 MiB (allocator noise)."""
    _round(server, seed=1)  # warm-up: first-use caches, compiled regexes, pools
    objects, rss = _our_objects(), _rss_bytes()
    for seed in (2, 3, 4):
        _round(server, seed)
    grown = _our_objects() - objects
    assert grown.total() < CLIENTS, f"after 3 rounds of {CLIENTS} requests, more live {grown}"
    assert _rss_bytes() - rss < 64 * 2**20, "resident memory grew by more than 64 MiB"
    assert not server.engine.processor.requests


def _rss_bytes() -> int:
    """The process's resident set size (Linux /proc; 0 elsewhere, where only the object
    count is checked)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0
