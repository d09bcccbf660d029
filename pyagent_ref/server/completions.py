"""POST /v1/completions: text (or token ids) in, text out; one choice per prompt and n."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Sequence

from fastapi import Request
from fastapi.responses import StreamingResponse

from ..engine.outputs import Logprob, RequestOutput
from ..observe.logs import new_request_id
from .beam import beam_params, run_beam_searches
from .engine import merge, open_streams
from .errors import APIError, bad_request
from .protocol import (
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    CompletionResponse,
    Usage,
)
from .sampling import completion_params
from .state import ServerState
from .streaming import (
    DONE,
    ChunkEvents,
    collect,
    prompt_logprobs_field,
    sse_error,
    until_disconnected,
)


def _prompts(prompt) -> list:
    """One prompt (text, or a list of token ids) or a list of them, as a list."""
    if isinstance(prompt, str) or (prompt and isinstance(prompt[0], int)):
        return [prompt]
    return list(prompt)


def completion_logprobs(
    logprobs: Sequence[dict[int, Logprob] | None], offset: int, first_token: str = ""
) -> CompletionLogprobs:
    """The completions API's parallel lists: each token's text and log-probability, the
    top tokens at its position (the sampled one included, as vLLM does), and where its
    text starts (from the single tokens' texts, counted from ``offset``). A None
    position is an echoed prompt's first token, whose text is ``first_token``."""
    out = CompletionLogprobs()
    for position in logprobs:
        if position is None:
            text, value, top = first_token, None, None
        else:
            sampled = next(iter(position.values()))
            text, value = sampled.decoded_token, sampled.logprob
            top = {lp.decoded_token: lp.logprob for lp in position.values()}
        out.tokens.append(text)
        out.token_logprobs.append(value)
        out.top_logprobs.append(top)
        out.text_offset.append(offset)
        offset += len(text)
    return out


def _echo_logprobs(state: ServerState, prompt_ids: list[int], entries, completion, offset=0):
    """An echoed prompt's logprobs (its first token None) followed by the completion's."""
    first = state.tokenizer.decode(prompt_ids[:1])
    return completion_logprobs([*(entries or [None]), *completion], offset, first)


async def create_completion(
    req: CompletionRequest, state: ServerState, request: Request
) -> CompletionResponse | StreamingResponse:
    lora = state.check_model(req.model)
    state.check_serving()
    params = completion_params(req)
    prompts = _prompts(req.prompt)
    if not prompts:
        raise APIError(400, "prompt must not be empty, got []", "prompt")
    rid = new_request_id("cmpl")  # with X-Request-Id's, if sent
    if req.use_beam_search:
        return await _beam_completion(req, state, request, prompts, rid, lora is not None)
    try:
        streams = await until_disconnected(
            request,
            open_streams(
                state.engine, prompts, params, rid, state.seats, state.metrics.observe, lora
            ),
        )
    except (ValueError, TypeError, FileNotFoundError) as exc:
        raise bad_request(exc) from None
    model = state.model_name(req.model)
    if req.stream:
        include_usage = req.stream_options is not None and req.stream_options.include_usage
        events = _stream(req, state, rid, model, streams, include_usage)
        return StreamingResponse(events, media_type="text/event-stream")
    choices, prompt_tokens = await until_disconnected(request, collect(streams, req.n))
    prompt_texts = [state.tokenizer.decode(p) if not isinstance(p, str) else p for p in prompts]
    prompt_ids = [state.tokenizer.encode(p) if isinstance(p, str) else p for p in prompts]
    response = []
    for index, c in choices.items():
        echo = prompt_texts[index // req.n] if req.echo else ""
        logprobs = None
        if req.logprobs is not None and req.echo:
            ids = prompt_ids[index // req.n]
            logprobs = _echo_logprobs(state, ids, c.prompt_logprobs, c.logprobs)
        elif req.logprobs is not None:
            logprobs = completion_logprobs(c.logprobs, 0)
        response.append(
            CompletionChoice(
                index=index,
                text=echo + c.text,
                logprobs=logprobs,
                finish_reason=c.finish_reason,
                stop_reason=c.stop_reason,
                prompt_logprobs=prompt_logprobs_field(c.prompt_logprobs)
                if req.prompt_logprobs is not None
                else None,
            )
        )
    generated = sum(len(c.token_ids) for c in choices.values())
    usage = Usage(
        prompt_tokens=sum(prompt_tokens),
        completion_tokens=generated,
        total_tokens=sum(prompt_tokens) + generated,
    )
    return CompletionResponse(id=rid, model=model, choices=response, usage=usage)


async def _beam_completion(
    req: CompletionRequest,
    state: ServerState,
    request: Request,
    prompts: list,
    rid: str,
    adapter: bool,
) -> CompletionResponse:
    """``use_beam_search``: choice ``i * n + j`` is prompt i's j-th best sequence."""
    refused = {"logprobs": req.logprobs is not None, "model (a LoRA adapter)": adapter}
    refused["structured_outputs"] = req.structured_outputs is not None
    limit = req.max_tokens
    if limit is None:  # the rest of the context of the longest prompt
        longest = max(
            len(p) if not isinstance(p, str) else len(state.tokenizer.encode(p)) for p in prompts
        )
        limit = max(state.engine.core.max_model_len - longest, 1)
    params = beam_params(req, limit, refused)
    outputs = await run_beam_searches(state, request, prompts, params, rid)
    choices, prompt_tokens, generated = [], 0, 0
    for i, (prompt, out) in enumerate(zip(prompts, outputs, strict=True)):
        ids = state.tokenizer.encode(prompt) if isinstance(prompt, str) else prompt
        echo = (
            (prompt if isinstance(prompt, str) else state.tokenizer.decode(ids)) if req.echo else ""
        )
        prompt_tokens += len(ids)
        for j, seq in enumerate(out.sequences):
            generated += len(seq.tokens) - len(ids)
            choices.append(
                CompletionChoice(
                    index=i * req.n + j, text=echo + seq.text, finish_reason=seq.finish_reason
                )
            )
    usage = Usage(
        prompt_tokens=prompt_tokens,
        completion_tokens=generated,
        total_tokens=prompt_tokens + generated,
    )
    model = state.model_name(req.model)
    return CompletionResponse(id=rid, model=model, choices=choices, usage=usage)


async def _stream(
    req: CompletionRequest,
    state: ServerState,
    rid: str,
    model: str,
    streams: list[AsyncIterator[RequestOutput]],
    include_usage: bool,
) -> AsyncIterator[str]:
    """One event per completion per step that has new text (or its end), then the usage
    (if asked) and ``[DONE]``."""
    events = ChunkEvents(id=rid, object="text_completion", created=int(time.time()), model=model)
    prompt_tokens, generated, ended, offsets = {}, 0, set(), {}
    async for i, out in merge(streams):
        prompt_tokens[i] = len(out.prompt_token_ids)
        for comp in out.outputs:
            index = i * req.n + comp.index
            if index in ended:
                continue
            if comp.finish_reason == "error":
                yield sse_error(f"the request failed in the engine: {comp.error}")
                ended.add(index)
                continue
            text, logprobs = comp.text, None
            echo = req.echo and index not in offsets
            if echo:
                text = (out.prompt or state.tokenizer.decode(out.prompt_token_ids)) + text
            if req.logprobs is not None and echo:
                logprobs = _echo_logprobs(
                    state, out.prompt_token_ids, out.prompt_logprobs, comp.logprobs or []
                )
            elif req.logprobs is not None:
                logprobs = completion_logprobs(comp.logprobs or [], offsets.get(index, 0))
            offsets[index] = offsets.get(index, 0) + len(text)
            generated += len(comp.token_ids)
            if comp.finish_reason is not None:
                ended.add(index)
            elif not text and not comp.token_ids:
                continue
            yield events.choice(
                index=index,
                text=text,
                logprobs=logprobs,
                finish_reason=comp.finish_reason,
                stop_reason=comp.stop_reason,
            )
    if include_usage:
        total = sum(prompt_tokens.values())
        usage = Usage(
            prompt_tokens=total, completion_tokens=generated, total_tokens=total + generated
        )
        yield events.usage(usage)
    yield DONE
