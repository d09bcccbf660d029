"""Many concurrent streaming clients with random cancellations, on loopback.

32 clients by default (CI); PYAGENT_SERVER_LOAD_CLIENTS=200 for the issue's full size.
Every stream that is not cancelled completes and is well formed, none is lost, and every
KV block is free afterwards."""

from __future__ import annotations

import asyncio
import json
import os
import random

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


def test_concurrent_streams_with_cancellations(server):
    rng = random.Random(0)

    async def main():
        limits = httpx.Limits(max_connections=CLIENTS)
        headers = {"Authorization": f"Bearer {API_KEY}"}
        async with httpx.AsyncClient(timeout=60, limits=limits, headers=headers) as http:
            return await asyncio.wait_for(
                asyncio.gather(*(_one(http, server.url, i, rng) for i in range(CLIENTS))),
                timeout=120,
            )

    outcomes = asyncio.run(main())
    assert len(outcomes) == CLIENTS
    assert outcomes.count("done") + outcomes.count("cancelled") == CLIENTS
    assert outcomes.count("done") > 0
    wait_until(lambda: kv_all_free(server.engine), timeout=30, what="every KV block to be free")
