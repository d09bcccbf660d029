"""POST /v1/chat/completions: messages rendered by the chat template, the model's text
turned into an assistant message by the reasoning and tool-call parsers.

The parsers run per completion (`ChatParsing`): the reasoning parser reads the model's
text, the tool parser reads the reasoning parser's content (docs/parsers.md). Streaming
sends each parser delta as it comes, in OpenAI's chunk shape: a call's id, type and name
once, then fragments of its arguments. When a parser is active the text is decoded with
special tokens kept (their markers may be special tokens), unless the request sets
``skip_special_tokens`` itself.

Structured outputs (`structured_outputs`): ``response_format`` json_object / json_schema
constrains the answer to JSON; ``tool_choice`` "required" or a named function constrains it
to calls of the request's tools and reads them back with the forced-call parsers
(`parsers.tools.forced`), whatever the model's own call format; vLLM's
``structured_outputs`` field (regex, choice, grammar, json...) is passed on as it is.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

import jinja2
from fastapi import Request
from fastapi.responses import StreamingResponse

from ..engine.outputs import Logprob, RequestOutput
from ..multimodal.chat import ContentPartError, split_image_parts
from ..observe.logs import new_request_id
from ..parsers import DeltaMessage, ReasoningParser, ToolParser
from ..parsers.tools import check_tools
from ..parsers.tools.forced import (
    NamedToolParser,
    RequiredToolParser,
    named_call_schema,
    required_calls_schema,
)
from .beam import beam_params, run_beam_searches
from .engine import merge, open_streams
from .errors import APIError, bad_request
from .protocol import (
    ChatChoice,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatLogprobs,
    ChatMessage,
    FunctionCall,
    NamedToolChoice,
    TokenLogprob,
    ToolCallOut,
    TopLogprob,
    Usage,
)
from .sampling import CHAT_FIELDS, chat_params
from .state import ServerState
from .streaming import (
    DONE,
    ChunkEvents,
    collect,
    prompt_logprobs_field,
    sse_error,
    until_disconnected,
)

# --- the model's text -> an assistant message -------------------------------------------


class ChatParsing:
    """One completion's text through the reasoning parser, then the tool parser.

    Either may be None. ``parallel_tool_calls=False`` keeps the first call only.
    `extract` reads a whole text; `stream` and `finish` read it delta by delta.
    """

    def __init__(
        self,
        reasoning: ReasoningParser | None,
        tools: ToolParser | None,
        parallel_tool_calls: bool = True,
    ) -> None:
        self.reasoning, self.tools = reasoning, tools
        self.parallel_tool_calls = parallel_tool_calls
        self.tools_called = False

    def extract(self, text: str) -> ChatMessage:
        reasoning, content = None, text
        if self.reasoning is not None:
            split = self.reasoning.extract(text)
            reasoning, content = split.reasoning, split.content
        calls = []
        if self.tools is not None and content is not None:
            found = self.tools.extract(content)
            content, calls = found.content, found.tool_calls
        if not self.parallel_tool_calls:
            calls = calls[:1]
        self.tools_called = bool(calls)
        return ChatMessage(
            role="assistant",
            content=content,
            reasoning_content=reasoning,
            reasoning=reasoning,
            tool_calls=[
                ToolCallOut(
                    id=c.id,
                    type="function",
                    function=FunctionCall(name=c.name, arguments=c.arguments),
                )
                for c in calls
            ]
            or None,
        )

    def stream(self, text: str) -> list[ChatMessage]:
        """The chunks' deltas for the next piece of the model's text."""
        return self._deltas(text, final=False)

    def finish(self) -> list[ChatMessage]:
        """The text is complete: what the parsers held back."""
        return self._deltas("", final=True)

    def _deltas(self, text: str, final: bool) -> list[ChatMessage]:
        if self.reasoning is None:
            split = [DeltaMessage(content=text)] if text else []
        else:
            delta = self.reasoning.finish() if final else self.reasoning.stream(text)
            split = [delta] if delta else []
        if self.tools is None:
            return [self._message(d) for d in split]
        out = []
        for d in split:
            if d.reasoning_content:
                out.append(DeltaMessage(reasoning_content=d.reasoning_content))
            if d.content:
                out.append(self.tools.stream(d.content))
        if final:
            out.append(self.tools.finish())
        return [self._message(d) for d in out if d]

    def _message(self, delta: DeltaMessage) -> ChatMessage:
        calls = [c for c in delta.tool_calls if self.parallel_tool_calls or c.index == 0]
        self.tools_called |= bool(calls)
        return ChatMessage(
            content=delta.content or None,
            reasoning_content=delta.reasoning_content or None,
            reasoning=delta.reasoning_content or None,
            tool_calls=[ToolCallOut(**c.to_openai()) for c in calls] or None,
        )


def chat_logprobs(positions: Sequence[dict[int, Logprob]], top: int) -> ChatLogprobs:
    """The chat API's log-probabilities: each sampled token, and the ``top`` most likely
    tokens at its position (by rank)."""

    def entry(lp: Logprob) -> dict:
        return {
            "token": lp.decoded_token,
            "logprob": lp.logprob,
            "bytes": list(lp.decoded_token.encode()),
        }

    content = []
    for position in positions:
        sampled = next(iter(position.values()))
        best = sorted(position.values(), key=lambda lp: lp.rank)[:top]
        content.append(
            TokenLogprob(**entry(sampled), top_logprobs=[TopLogprob(**entry(lp)) for lp in best])
        )
    return ChatLogprobs(content=content)


def _finish_reason(reason: str | None, parsing: ChatParsing) -> str | None:
    return "tool_calls" if reason == "stop" and parsing.tools_called else reason


# --- the request -> a prompt and parsers ----------------------------------------------------


def structured_outputs(req: ChatCompletionRequest) -> tuple[str, dict] | None:
    """The request's constraint on the answer, as `StructuredOutputsParams` fields, and
    the request field it comes from: ``response_format``, a forced ``tool_choice`` or
    vLLM's ``structured_outputs`` (at most one of them; 400 otherwise)."""
    given = []
    fmt = req.response_format
    if fmt is not None and fmt.type == "json_object":
        given.append(("response_format", {"json_object": True}))
    elif fmt is not None and fmt.type == "json_schema":
        spec = fmt.json_schema or fmt.model_extra  # chat nests it, the Responses API does not
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise APIError(
                400, "response_format json_schema needs a 'schema' object", "response_format"
            )
        given.append(("response_format", {"json": schema}))
    choice = req.tool_choice
    if choice == "required" or isinstance(choice, NamedToolChoice):
        schemas = _tool_schemas(req)
        if choice == "required":
            schema = required_calls_schema(schemas, req.parallel_tool_calls)
        else:
            try:
                schema = named_call_schema(schemas, choice.function.get("name"))
            except ValueError as exc:
                raise APIError(400, str(exc), "tool_choice") from None
        given.append(("tool_choice", {"json": schema}))
    if req.structured_outputs is not None:
        given.append(("structured_outputs", req.structured_outputs))
    if len(given) > 1:
        names = [name for name, _ in given]
        raise APIError(400, f"{names[0]} and {names[1]} both constrain the answer", names[1])
    return given[0] if given else None


def _tool_schemas(req: ChatCompletionRequest) -> dict[str, dict]:
    if not req.tools:
        raise APIError(400, f"tool_choice {req.tool_choice!r} needs tools", "tool_choice")
    try:
        return check_tools([t.model_dump(exclude_none=True) for t in req.tools])
    except (TypeError, ValueError) as exc:
        raise APIError(400, str(exc), "tools") from None


def _render(
    state: ServerState, req: ChatCompletionRequest, with_images: bool = False
) -> list[int] | dict:
    """The rendered token ids of a chat request; `with_images`: a dict prompt with the
    images too when the messages have image parts (without it, image parts are a 400:
    a caller that runs token ids alone cannot take them)."""
    tools = [t.model_dump(exclude_none=True) for t in req.tools] if req.tools else None
    try:
        messages, images = split_image_parts(req.messages)
    except ContentPartError as exc:
        raise APIError(400, str(exc), exc.param) from None
    processor = state.engine.mm_processor
    if images and not processor.supports_images:
        raise APIError(
            400,
            f"{processor.architecture} is a text-only model: it takes no image parts",
            "messages",
        )
    if images and not with_images:
        raise APIError(400, "image parts are not supported with this request's options", "messages")
    try:
        ids = state.tokenizer.apply_chat_template(
            messages,
            tools=tools,
            add_generation_prompt=req.add_generation_prompt,
            tokenize=True,
            **(req.chat_template_kwargs or {}),
        )
    except (ValueError, TypeError, jinja2.TemplateError) as exc:
        raise APIError(
            400, f"messages could not be rendered by the chat template: {exc}", "messages"
        ) from None
    if not images:
        return ids
    return {"prompt_token_ids": ids, "multi_modal_data": {"image": images}}


def _parsing_factory(state: ServerState, req: ChatCompletionRequest):
    """A function making one `ChatParsing` per completion, and whether a parser runs."""
    tool_choice = req.tool_choice or ("auto" if req.tools else "none")
    tools_cls = None
    if tool_choice == "required":
        tools_cls = RequiredToolParser
    elif isinstance(tool_choice, NamedToolChoice):
        tools_cls = functools.partial(NamedToolParser, function=tool_choice.function["name"])
    elif req.tools and tool_choice == "auto":
        if state.tool_parser is None:
            raise APIError(
                400,
                "tool_choice 'auto' needs the server started with --tool-call-parser NAME",
                "tool_choice",
            )
        tools_cls = state.tool_parser
    reasoning_cls = state.reasoning_parser
    tool_dicts = [t.model_dump(exclude_none=True) for t in req.tools or ()]

    def make() -> ChatParsing:
        try:
            reasoning = reasoning_cls(req.chat_template_kwargs) if reasoning_cls else None
        except (TypeError, ValueError) as exc:
            raise APIError(400, str(exc), "chat_template_kwargs") from None
        try:
            tools = tools_cls(tool_dicts) if tools_cls else None
        except (TypeError, ValueError) as exc:
            raise APIError(400, str(exc), "tools") from None
        return ChatParsing(reasoning, tools, req.parallel_tool_calls)

    return make, tools_cls is not None or reasoning_cls is not None


# --- the endpoint ---------------------------------------------------------------------------


@dataclass
class ChatRun:
    """A chat request admitted to the engine: its streams and one parsing per choice."""

    req: ChatCompletionRequest
    rid: str
    model: str
    streams: list[AsyncIterator[RequestOutput]]
    parsings: list[ChatParsing]
    created: int = dataclasses.field(default_factory=lambda: int(time.time()))


async def start_chat(req: ChatCompletionRequest, state: ServerState, request: Request) -> ChatRun:
    """Validate ``req``, render its prompt and add it to the engine (400s on the way)."""
    lora = state.check_model(req.model)
    state.check_serving()
    constraint = structured_outputs(req)
    make_parsing, parsing_active = _parsing_factory(state, req)
    parsings = [make_parsing() for _ in range(max(req.n, 1))]
    params = chat_params(req, not parsing_active, constraint and constraint[1])
    fields = CHAT_FIELDS | {"structured_outputs": constraint[0] if constraint else ""}
    prompt = _render(state, req, with_images=True)
    rid = new_request_id("chatcmpl")  # with X-Request-Id's, if sent
    try:
        streams = await until_disconnected(
            request,
            open_streams(
                state.engine, [prompt], params, rid, state.seats, state.metrics.observe, lora
            ),
        )
    except (ValueError, TypeError, FileNotFoundError) as exc:
        raise bad_request(exc, fields) from None
    return ChatRun(req, rid, state.model_name(req.model), streams, parsings)


async def create_chat_completion(
    req: ChatCompletionRequest, state: ServerState, request: Request
) -> ChatCompletionResponse | StreamingResponse:
    if req.use_beam_search:
        return await _beam_chat(req, state, request)
    run = await start_chat(req, state, request)
    if req.stream:
        return StreamingResponse(_sse(run), media_type="text/event-stream")
    return await chat_response(run, request)


async def _beam_chat(
    req: ChatCompletionRequest, state: ServerState, request: Request
) -> ChatCompletionResponse:
    """``use_beam_search`` (server/beam.py): choice j is the j-th best sequence, read by
    the reasoning and tool parsers like any answer."""
    lora = state.check_model(req.model)
    state.check_serving()
    constraint = structured_outputs(req)
    make_parsing, _ = _parsing_factory(state, req)
    prompt = _render(state, req, with_images=True)
    refused = {"logprobs": req.logprobs, "model (a LoRA adapter)": lora is not None}
    if constraint is not None:
        refused[constraint[0]] = True
    limit = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    field = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
    if limit is None:  # the rest of the context, past the image placeholders' expansion
        ids = prompt
        if isinstance(prompt, dict):
            try:
                ids, _ = state.engine.mm_processor(
                    prompt["prompt_token_ids"], prompt["multi_modal_data"]
                )
            except (ValueError, TypeError) as exc:
                raise APIError(400, str(exc), "messages") from None
        limit = max(state.engine.core.max_model_len - len(ids), 1)
    params = beam_params(req, limit, refused, field)
    rid = new_request_id("chatcmpl")
    [out] = await run_beam_searches(state, request, [prompt], params, rid)
    choices = []
    for j, seq in enumerate(out.sequences):
        parsing = make_parsing()
        message = parsing.extract(seq.text)
        reason = _finish_reason(seq.finish_reason, parsing)
        choices.append(ChatChoice(index=j, message=message, finish_reason=reason))
    generated = sum(len(seq.tokens) - len(prompt) for seq in out.sequences)
    usage = Usage(
        prompt_tokens=len(prompt), completion_tokens=generated, total_tokens=len(prompt) + generated
    )
    model = state.model_name(req.model)
    return ChatCompletionResponse(id=rid, model=model, choices=choices, usage=usage)


async def chat_response(run: ChatRun, request: Request) -> ChatCompletionResponse:
    """The whole answer: every choice's message, parsed."""
    req, top = run.req, run.req.top_logprobs or 0
    choices, prompt_tokens = await until_disconnected(request, collect(run.streams, req.n))
    out = []
    for index, c in choices.items():
        parsing = run.parsings[index]
        message = parsing.extract(c.text)
        out.append(
            ChatChoice(
                index=index,
                message=message,
                logprobs=chat_logprobs(c.logprobs, top) if req.logprobs else None,
                finish_reason=_finish_reason(c.finish_reason, parsing),
                stop_reason=c.stop_reason,
            )
        )
    generated = sum(len(c.token_ids) for c in choices.values())
    usage = Usage(
        prompt_tokens=prompt_tokens[0],
        completion_tokens=generated,
        total_tokens=prompt_tokens[0] + generated,
    )
    first = next(iter(choices.values()), None)
    prompt_logprobs = None
    if req.prompt_logprobs is not None and first is not None:
        prompt_logprobs = prompt_logprobs_field(first.prompt_logprobs)
    return ChatCompletionResponse(
        id=run.rid, model=run.model, choices=out, usage=usage, prompt_logprobs=prompt_logprobs
    )


async def _sse(run: ChatRun) -> AsyncIterator[str]:
    """The chunks as server-sent events, then ``[DONE]``."""
    events = ChunkEvents(
        id=run.rid, object="chat.completion.chunk", created=run.created, model=run.model
    )
    async for chunk in chat_chunks(run):
        if isinstance(chunk, str):
            yield sse_error(chunk)
        elif chunk.usage is not None:
            yield events.usage(chunk.usage)
        else:
            yield events.choice(
                index=chunk.index,
                delta=chunk.delta,
                logprobs=chunk.logprobs,
                finish_reason=chunk.finish_reason,
                stop_reason=chunk.stop_reason,
            )
    yield DONE


@dataclass
class ChatChunk:
    """One chunk of a chat stream (`ChatCompletionChunk`'s content): one choice's delta,
    or the usage alone (``delta`` None)."""

    index: int = 0
    delta: ChatMessage | None = None
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    usage: Usage | None = None


async def chat_chunks(run: ChatRun) -> AsyncIterator[ChatChunk | str]:
    """The chunks: a role chunk per choice, parser deltas as the text comes, the finish
    reason, and the usage (if ``stream_options`` ask for it). A choice that fails
    in the engine yields its error message (a str) instead of its remaining chunks.
    A delta that carries several tokens (a consumer that lagged: `AsyncLLM`) is one
    chunk with their text, and their logprobs if asked for."""
    req, parsings = run.req, run.parsings
    top = req.top_logprobs or 0
    for index in range(len(parsings)):
        yield ChatChunk(index, ChatMessage(role="assistant", content=""))
    prompt_tokens, generated, ended = 0, 0, set()
    async for _, out in merge(run.streams):
        prompt_tokens = len(out.prompt_token_ids)
        for comp in out.outputs:
            index, parsing = comp.index, parsings[comp.index]
            if index in ended:
                continue
            generated += len(comp.token_ids)
            if comp.finish_reason == "error":
                ended.add(index)
                yield f"the request failed in the engine: {comp.error}"
                continue
            deltas = parsing.stream(comp.text) if comp.text else []
            if req.logprobs and comp.logprobs:
                lps = chat_logprobs(comp.logprobs, top)
                yield ChatChunk(index, deltas.pop(0) if deltas else ChatMessage(), lps)
            for delta in deltas:
                yield ChatChunk(index, delta)
            if comp.finish_reason is not None:
                ended.add(index)
                for delta in parsing.finish():
                    yield ChatChunk(index, delta)
                reason = _finish_reason(comp.finish_reason, parsing)
                yield ChatChunk(
                    index, ChatMessage(), finish_reason=reason, stop_reason=comp.stop_reason
                )
    if req.stream_options is not None and req.stream_options.include_usage:
        usage = Usage(
            prompt_tokens=prompt_tokens,
            completion_tokens=generated,
            total_tokens=prompt_tokens + generated,
        )
        yield ChatChunk(usage=usage)
