"""The engine as the server drives it: `AsyncLLM`, plus what streaming over HTTP needs.

Where the engine steps: `AsyncLLM` already runs each `EngineCore.step` in a worker
thread (``asyncio.to_thread``), so the server's event loop parses HTTP, serializes and
writes chunks while the model computes. Between two steps the loop detokenizes the
step's tokens and hands each stream its delta (`AsyncLLM._run`). With
``engine_process=True`` (``pyagent serve --engine-process``) the core steps in a
process of its own instead (`engine.core_proc`) and the loop collects its outputs.

`ServingEngine` adds two things to `AsyncLLM` (whose deltas carry each new token's
log-probabilities, and on the last one the `RequestMetrics`):

* `stream`, which aborts its request for sure when the consumer goes away: starlette
  cancels a streaming response whose client disconnected with an anyio cancel scope,
  which cancels every ``await`` again, so the abort is shielded;
* `Seats`: how many requests are in flight, for the server's queue limit (429).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence

import anyio

from ..engine.llm import AsyncLLM, Prompt
from ..engine.outputs import RequestOutput
from ..lora import LoRARequest
from ..sample.params import SamplingParams
from .errors import APIError


class Seats:
    """Completions in flight (admitted or being admitted), up to ``limit``."""

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self.taken = 0

    def take(self, count: int) -> None:
        """Take ``count`` seats, or raise a 429 when the queue is full."""
        if self.limit is not None and self.taken + count > self.limit:
            raise APIError(
                429,
                f"the server's queue is full: {self.taken} completions in flight and a "
                f"limit of {self.limit} (max_num_seqs + --max-queue); retry later",
                code="queue_full",
            )
        self.taken += count

    def give(self, count: int) -> None:
        self.taken -= count


class ServingEngine(AsyncLLM):
    """`AsyncLLM` whose streams abort their request however the consumer leaves."""

    async def stream(
        self,
        prompt: Prompt,
        params: SamplingParams,
        request_id: str,
        seats: Seats,
        lora_request: LoRARequest | None = None,
    ) -> AsyncIterator[RequestOutput]:
        """`generate`, giving back the request's seats and aborting it (if it has not
        finished) however the consumer leaves, cancelled or not."""
        finished = False
        try:
            async for out in self.generate(prompt, params, request_id, lora_request):
                finished = out.finished
                yield out
        finally:
            seats.give(params.n)
            if not finished:
                with anyio.CancelScope(shield=True):
                    await self.abort(request_id)


async def open_streams(
    engine: ServingEngine,
    prompts: Sequence[Prompt],
    params: SamplingParams,
    request_id: str,
    seats: Seats,
    observe: Callable[[RequestOutput, bool], None] = lambda out, first: None,
    lora_request: LoRARequest | None = None,
) -> list[AsyncIterator[RequestOutput]]:
    """Admit every prompt (request ids ``request_id-i``, with the LoRA adapter of
    ``lora_request``) and wait for its first output. ``observe(delta, is_first)`` sees
    every delta (the server's metrics).

    Waiting for the first outputs before the HTTP response starts is what lets an
    admission error (a prompt too long, a token id outside the vocabulary) be a 400
    rather than an error in the middle of a stream. If any prompt is rejected, the ones
    admitted are aborted and the first rejection (in prompt order) is raised.
    """
    seats.take(params.n * len(prompts))
    streams = [
        engine.stream(p, params, f"{request_id}-{i}", seats, lora_request)
        for i, p in enumerate(prompts)
    ]
    firsts = await asyncio.gather(*(anext(s) for s in streams), return_exceptions=True)
    errors = [f for f in firsts if isinstance(f, BaseException)]
    if errors:
        for s in streams:
            await s.aclose()
        raise errors[0]
    return [_prepend(first, s, observe) for first, s in zip(firsts, streams, strict=True)]


async def _prepend(first: RequestOutput, rest: AsyncIterator[RequestOutput], observe):
    try:
        observe(first, True)
        yield first
        if not first.finished:
            async for out in rest:
                observe(out, False)
                yield out
    finally:
        await rest.aclose()


async def merge(streams: list[AsyncIterator[RequestOutput]]):
    """``(prompt index, delta)`` from several streams as they come (one: in order)."""
    if len(streams) == 1:
        try:
            async for out in streams[0]:
                yield 0, out
        finally:
            await streams[0].aclose()
        return
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(i: int, stream) -> None:
        try:
            async for out in stream:
                queue.put_nowait((i, out))
        except BaseException as exc:
            queue.put_nowait((i, exc))
            raise
        finally:
            await stream.aclose()

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    try:
        remaining = len(streams)
        while remaining:
            i, out = await queue.get()
            if isinstance(out, BaseException):
                raise out
            remaining -= out.finished
            yield i, out
    finally:
        for task in tasks:
            task.cancel()
        with anyio.CancelScope(shield=True):
            await asyncio.gather(*tasks, return_exceptions=True)
