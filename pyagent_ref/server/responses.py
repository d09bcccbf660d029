"""POST /v1/responses: OpenAI's Responses API, run as a chat completion.

A request becomes a chat completion request (`to_chat`): ``instructions`` a system
message, each ``input`` item a message (a ``function_call`` item the assistant's tool
call, a ``function_call_output`` a tool message), the flat function tools the chat API's
tools. It then runs exactly as a chat completion does (chat template, reasoning and
tool-call parsers, `chat.start_chat`), and the assistant's message becomes the
response's output items (`output_items`): a ``reasoning`` item, a ``message`` with one
``output_text`` part, one ``function_call`` item per call.

Streaming turns the chat chunks into the API's events (`ResponseEvents`). Responses are
not stored: ``store`` must be false or absent, and ``previous_response_id`` is not a
field this server knows (a 400 naming it).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import StreamingResponse

from .chat import ChatRun, chat_chunks, chat_response, start_chat
from .errors import APIError
from .protocol import (
    ChatCompletionRequest,
    ChatMessage,
    FunctionCallItem,
    FunctionDefinition,
    MessageItem,
    NamedToolChoice,
    OutputItem,
    OutputText,
    ReasoningItem,
    ReasoningText,
    ResponseObject,
    ResponsesRequest,
    ResponsesToolChoice,
    ResponseUsage,
    StreamOptions,
    Tool,
    Usage,
)
from .state import ServerState

# the chat request's field -> the responses request's, in error answers
RESPONSES_FIELDS = {
    "messages": "input",
    "max_completion_tokens": "max_output_tokens",
    "max_tokens": "max_output_tokens",
    "response_format": "text.format",
}
_ROLES = {"user": "user", "system": "system", "developer": "system", "assistant": "assistant"}


# --- the request -> a chat completion request ---------------------------------------------


def _text(content: Any, where: str, param: str) -> str:
    """A message's content: a str, or text parts (input_text / output_text) joined."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise APIError(
            400,
            f"{where}.content must be a str or a list of text parts, got {type(content).__name__}",
            f"{param}.content",
        )
    texts = []
    for j, part in enumerate(content):
        ok = isinstance(part, dict) and part.get("type") in ("input_text", "output_text", "text")
        if not (ok and isinstance(part.get("text"), str)):
            raise APIError(
                400,
                f"{where}.content[{j}]: only text parts are supported, got {part!r}",
                f"{param}.content.{j}",
            )
        texts.append(part["text"])
    return "\n".join(texts)


def _string(item: dict, key: str, where: str, param: str) -> str:
    value = item.get(key)
    if not isinstance(value, str):
        raise APIError(400, f"{where} needs a str {key!r}, got {value!r}", f"{param}.{key}")
    return value


def input_messages(req: ResponsesRequest) -> list[dict]:
    """The chat messages of ``instructions`` and ``input``."""
    messages = [] if req.instructions is None else [{"role": "system", "content": req.instructions}]
    items = [{"role": "user", "content": req.input}] if isinstance(req.input, str) else req.input
    for i, item in enumerate(items):
        where, param, kind = f"input[{i}]", f"input.{i}", item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in _ROLES:
                raise APIError(
                    400, f"{where}.role must be one of {sorted(_ROLES)}, got {role!r}", param
                )
            content = _text(item.get("content"), where, param)
            messages.append({"role": _ROLES[role], "content": content})
        elif kind == "function_call":
            call = {
                "id": _string(item, "call_id", where, param),
                "type": "function",
                "function": {
                    "name": _string(item, "name", where, param),
                    "arguments": _string(item, "arguments", where, param),
                },
            }
            last = messages[-1] if messages else {}
            if last.get("role") == "assistant" and "tool_calls" in last:
                last["tool_calls"].append(call)  # calls made in one turn, one message
            else:
                messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            call_id = _string(item, "call_id", where, param)
            output = _string(item, "output", where, param)
            messages.append({"role": "tool", "tool_call_id": call_id, "content": output})
        elif kind != "reasoning":  # earlier reasoning is not shown to the model again
            raise APIError(
                400, f"{where}: input items of type {kind!r} are not supported", f"{param}.type"
            )
    if not messages:
        raise APIError(400, "input must hold at least one message", "input")
    return messages


def to_chat(req: ResponsesRequest) -> ChatCompletionRequest:
    """The chat completion request that computes ``req``'s response."""
    if req.store:
        raise APIError(400, "store=true is not supported: this server keeps no responses", "store")
    choice = req.tool_choice
    if isinstance(choice, ResponsesToolChoice):
        choice = NamedToolChoice(function={"name": choice.name})
    tools = [
        Tool(function=FunctionDefinition(**t.model_dump(exclude={"type"}, exclude_none=True)))
        for t in req.tools or ()
    ]
    return ChatCompletionRequest(
        model=req.model,
        messages=input_messages(req),
        max_completion_tokens=req.max_output_tokens,
        temperature=req.temperature,
        top_p=req.top_p,
        tools=tools or None,
        tool_choice=choice,
        parallel_tool_calls=req.parallel_tool_calls,
        response_format=req.text.format if req.text else None,
        stream=req.stream,
        stream_options=StreamOptions(include_usage=True) if req.stream else None,
        user=req.user,
    )


# --- the answer -> output items -------------------------------------------------------------


def _new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def output_items(message: ChatMessage, status: str = "completed") -> list[OutputItem]:
    """The output items of an assistant message: reasoning, text, then each tool call."""
    items: list[OutputItem] = []
    if message.reasoning_content:
        text = [ReasoningText(text=message.reasoning_content)]
        items.append(ReasoningItem(id=_new_id("rs"), content=text, status=status))
    if message.content:
        text = [OutputText(text=message.content)]
        items.append(MessageItem(id=_new_id("msg"), status=status, content=text))
    for call in message.tool_calls or ():
        items.append(
            FunctionCallItem(
                id=_new_id("fc"),
                call_id=call.id,
                name=call.function.name,
                arguments=call.function.arguments,
                status=status,
            )
        )
    return items


def response_object(
    req: ResponsesRequest,
    rid: str,
    created: int,
    model: str,
    output: list[OutputItem],
    finish_reason: str | None,
    usage: Usage | None,
) -> ResponseObject:
    """The response: ``incomplete`` (reason max_output_tokens) when the budget ran out."""
    cut = finish_reason == "length"
    return ResponseObject(
        id=rid,
        created_at=created,
        model=model,
        status="incomplete" if cut else "completed",
        output=output,
        usage=None
        if usage is None
        else ResponseUsage(
            input_tokens=usage.prompt_tokens,
            output_tokens=usage.completion_tokens,
            total_tokens=usage.total_tokens,
        ),
        incomplete_details={"reason": "max_output_tokens"} if cut else None,
        instructions=req.instructions,
        max_output_tokens=req.max_output_tokens,
        temperature=req.temperature,
        top_p=req.top_p,
        tools=req.tools or [],
        tool_choice=req.tool_choice or "auto",
        parallel_tool_calls=req.parallel_tool_calls,
        metadata=req.metadata,
    )


# --- the endpoint ---------------------------------------------------------------------------


async def create_response(
    req: ResponsesRequest, state: ServerState, request: Request
) -> ResponseObject | StreamingResponse:
    try:
        run = await start_chat(to_chat(req), state, request)
    except APIError as exc:
        exc.param = RESPONSES_FIELDS.get(exc.param, exc.param)
        raise
    rid, created = _new_id("resp"), int(time.time())
    if req.stream:
        events = ResponseEvents(req, rid, created, run)
        return StreamingResponse(events.sse(), media_type="text/event-stream")
    answer = await chat_response(run, request)
    choice = answer.choices[0]
    status = "incomplete" if choice.finish_reason == "length" else "completed"
    output = output_items(choice.message, status)
    return response_object(req, rid, created, run.model, output, choice.finish_reason, answer.usage)


class ResponseEvents:
    """The stream of one response: its chat chunks as the Responses API's events.

    ``response.created`` and ``response.in_progress`` first; then each output item in
    turn: ``response.output_item.added``; its deltas (``response.reasoning_text.delta``;
    ``response.content_part.added`` then ``response.output_text.delta``;
    ``response.function_call_arguments.delta``); their ``.done`` events and
    ``response.output_item.done``. Last, ``response.completed`` (``response.incomplete``
    when the token budget ran out, ``response.failed`` when the engine failed) with the
    whole response. A delta of another kind, or a new tool call, closes the open item.
    Every event carries its ``sequence_number``.
    """

    def __init__(self, req: ResponsesRequest, rid: str, created: int, run: ChatRun) -> None:
        self.req, self.rid, self.created, self.run = req, rid, created, run
        self.sequence = 0
        self.done: list[OutputItem] = []
        self.open: OutputItem | None = None
        self.status = "in_progress"

    def event(self, kind: str, **fields: Any) -> str:
        body = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return f"event: {kind}\ndata: {json.dumps(body)}\n\n"

    def response(self, finish_reason: str | None = None, usage: Usage | None = None) -> dict:
        out = response_object(
            self.req, self.rid, self.created, self.run.model, self.done, finish_reason, usage
        )
        if self.status in ("in_progress", "failed"):
            out.status = self.status
        return out.model_dump(exclude_none=True)

    async def sse(self) -> AsyncIterator[str]:
        yield self.event("response.created", response=self.response())
        yield self.event("response.in_progress", response=self.response())
        finish_reason, usage = None, None
        async for chunk in chat_chunks(self.run):
            if isinstance(chunk, str):  # the engine failed
                for event in self.close("incomplete"):
                    yield event
                self.status = "failed"
                failed = self.response() | {"error": {"code": "server_error", "message": chunk}}
                yield self.event("response.failed", response=failed)
                return
            usage = chunk.usage or usage
            if chunk.delta is not None:
                finish_reason = chunk.finish_reason or finish_reason
                for event in self.deltas(chunk.delta):
                    yield event
        status = "incomplete" if finish_reason == "length" else "completed"
        for event in self.close(status):
            yield event
        self.status = status
        yield self.event(f"response.{status}", response=self.response(finish_reason, usage))

    def deltas(self, delta: ChatMessage) -> list[str]:
        """The events of one chat delta, opening and closing items as its kind changes."""
        events = []
        if delta.reasoning_content:
            if not isinstance(self.open, ReasoningItem):
                events += self.close("completed")
                item = ReasoningItem(id=_new_id("rs"), content=[], status="in_progress")
                events += self.start(item)
                item.content.append(ReasoningText(text=""))
            events.append(self.text_delta("response.reasoning_text.delta", delta.reasoning_content))
        if delta.content:
            if not isinstance(self.open, MessageItem):
                events += self.close("completed")
                item = MessageItem(id=_new_id("msg"), status="in_progress", content=[])
                events += self.start(item)
                self.open.content.append(OutputText(text=""))
                part = self.open.content[0].model_dump()
                events.append(self.event("response.content_part.added", **self.where(), part=part))
            events.append(self.text_delta("response.output_text.delta", delta.content))
        for call in delta.tool_calls or ():
            if call.id is not None:  # a new call begins
                events += self.close("completed")
                name = call.function.name if call.function else None
                item = FunctionCallItem(
                    id=_new_id("fc"),
                    call_id=call.id,
                    name=name or "",
                    arguments="",
                    status="in_progress",
                )
                events += self.start(item)
            fragment = call.function.arguments if call.function else None
            if fragment and isinstance(self.open, FunctionCallItem):
                self.open.arguments += fragment
                events.append(
                    self.event(
                        "response.function_call_arguments.delta",
                        item_id=self.open.id,
                        output_index=len(self.done),
                        delta=fragment,
                    )
                )
        return events

    def where(self) -> dict:
        return {"item_id": self.open.id, "output_index": len(self.done), "content_index": 0}

    def start(self, item: OutputItem) -> list[str]:
        self.open = item
        added = item.model_dump(exclude_none=True)
        return [self.event("response.output_item.added", output_index=len(self.done), item=added)]

    def text_delta(self, kind: str, text: str) -> str:
        self.open.content[0].text += text
        return self.event(kind, **self.where(), delta=text)

    def close(self, status: str) -> list[str]:
        """The ``.done`` events of the open item, if any."""
        item, events = self.open, []
        if item is None:
            return events
        item.status = status
        if isinstance(item, ReasoningItem):
            text = item.content[0].text
            events.append(self.event("response.reasoning_text.done", **self.where(), text=text))
        elif isinstance(item, MessageItem):
            part = item.content[0]
            events.append(self.event("response.output_text.done", **self.where(), text=part.text))
            events.append(
                self.event("response.content_part.done", **self.where(), part=part.model_dump())
            )
        else:
            events.append(
                self.event(
                    "response.function_call_arguments.done",
                    item_id=item.id,
                    output_index=len(self.done),
                    arguments=item.arguments,
                )
            )
        dumped = item.model_dump(exclude_none=True)
        index = len(self.done)
        events.append(self.event("response.output_item.done", output_index=index, item=dumped))
        self.done.append(item)
        self.open = None
        return events
