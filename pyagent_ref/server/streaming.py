"""What both generation endpoints share: server-sent events, collecting a whole answer,
and noticing a client that went away."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Sequence
from dataclasses import dataclass, field

import msgspec
from fastapi import Request
from pydantic import BaseModel

from ..engine.outputs import CompletionOutput, Logprob, RequestOutput
from .engine import merge
from .errors import APIError
from .protocol import PromptLogprob, PromptLogprobs

DONE = "data: [DONE]\n\n"
_JSON = msgspec.json.Encoder()


class ChunkEvents:
    """The server-sent events (``data: <json>`` and a blank line) of one stream's
    chunks, encoded without a pydantic model per chunk (a stream sends one per token or
    so, and building and dumping the models cost more than the rest of a chunk's way
    out).

    ``fixed``: the fields every chunk of the stream repeats (id, object, created,
    model), encoded once. `choice` adds a chunk's one choice from its fields, those that
    are None left out (as ``model_dump_json(exclude_none=True)`` leaves them out; a
    field that is a model is dumped so); `usage` a chunk without choices. The chunk
    models of protocol.py (`ChatCompletionChunk`, `CompletionResponse`) remain the
    schema: tests/server/test_streaming.py checks that both encodings read the same.
    """

    def __init__(self, **fixed) -> None:
        self._head = "data: " + _JSON.encode(fixed).decode()[:-1] + ',"choices":['

    def choice(self, **fields) -> str:
        body = {
            k: v.model_dump(exclude_none=True) if isinstance(v, BaseModel) else v
            for k, v in fields.items()
            if v is not None
        }
        return self._head + _JSON.encode(body).decode() + "]}\n\n"

    def usage(self, usage: BaseModel) -> str:
        return f'{self._head}],"usage":{usage.model_dump_json(exclude_none=True)}}}\n\n'


def sse_error(message: str) -> str:
    """An error in the middle of a stream (the status line has been sent already)."""
    body = {"error": {"message": message, "type": "server_error", "param": None, "code": None}}
    return f"data: {json.dumps(body)}\n\n"


@dataclass
class Collected:
    """One completion, accumulated from its deltas."""

    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[dict[int, Logprob]] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    error: str | None = None
    prompt_logprobs: list[dict[int, Logprob] | None] | None = None  # if asked for

    def add(self, comp: CompletionOutput) -> None:
        self.text += comp.text
        self.token_ids += comp.token_ids
        self.logprobs += comp.logprobs or []
        if comp.finish_reason is not None:
            self.finish_reason, self.stop_reason = comp.finish_reason, comp.stop_reason
            self.error = comp.error


async def collect(
    streams: list[AsyncIterator[RequestOutput]], n: int
) -> tuple[dict[int, Collected], list[int]]:
    """Every completion of every prompt, by choice index (``prompt * n + completion``),
    and the prompts' token counts. A completion that failed is a 500 (its message)."""
    choices: dict[int, Collected] = {}
    prompt_tokens = [0] * len(streams)
    prompt_logprobs = [None] * len(streams)
    async for i, out in merge(streams):
        prompt_tokens[i] = len(out.prompt_token_ids)
        prompt_logprobs[i] = out.prompt_logprobs or prompt_logprobs[i]
        for comp in out.outputs:
            choices.setdefault(i * n + comp.index, Collected()).add(comp)
    for index, choice in choices.items():
        choice.prompt_logprobs = prompt_logprobs[index // n]
    for choice in choices.values():
        if choice.finish_reason == "error":
            raise APIError(500, f"the request failed in the engine: {choice.error}")
    return dict(sorted(choices.items())), prompt_tokens


def prompt_logprobs_field(
    entries: Sequence[dict[int, Logprob] | None] | None,
) -> PromptLogprobs | None:
    """vLLM's ``prompt_logprobs`` response field from a `RequestOutput`'s."""
    if entries is None:
        return None
    return [
        None
        if entry is None
        else {
            t: PromptLogprob(logprob=lp.logprob, rank=lp.rank, decoded_token=lp.decoded_token)
            for t, lp in entry.items()
        }
        for entry in entries
    ]


async def until_disconnected(request: Request, work: Awaitable):
    """Await ``work``; if the client disconnects first, cancel it (which aborts its engine
    requests and frees their KV blocks) and raise a 499 that nobody will read.

    Starlette cancels a *streaming* response whose client left; a plain response's
    handler runs to its end unless someone watches, which is what this does.
    """
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnect(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    if task.cancelled():
        raise APIError(499, "the client closed the connection")
    return task.result()


async def _disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass
