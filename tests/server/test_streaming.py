"""`ChunkEvents`: a stream's chunks encoded without a model per chunk read exactly as the
chunk models of protocol.py dump them (``model_dump_json(exclude_none=True)``)."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from pyagent_ref.server.protocol import (
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatLogprobs,
    ChatMessage,
    CompletionChoice,
    CompletionLogprobs,
    CompletionResponse,
    FunctionCall,
    TokenLogprob,
    ToolCallOut,
    TopLogprob,
    Usage,
)
from pyagent_ref.server.streaming import ChunkEvents

maybe_text = st.none() | st.text(max_size=8)
logprob = st.floats(allow_nan=False, max_value=0.0)  # -inf included: null in both
top = st.builds(
    TopLogprob,
    token=st.text(max_size=4),
    logprob=logprob,
    bytes=st.lists(st.integers(0, 255), max_size=4),
)
token_logprob = st.builds(
    TokenLogprob,
    token=st.text(max_size=4),
    logprob=logprob,
    bytes=st.lists(st.integers(0, 255), max_size=4),
    top_logprobs=st.lists(top, max_size=3),
)
call = st.builds(
    ToolCallOut,
    index=st.none() | st.integers(0, 3),
    id=maybe_text,
    type=st.none() | st.just("function"),
    function=st.none() | st.builds(FunctionCall, name=maybe_text, arguments=maybe_text),
)
message = st.builds(
    ChatMessage,
    role=st.none() | st.just("assistant"),
    content=maybe_text,
    reasoning_content=maybe_text,
    reasoning=maybe_text,
    tool_calls=st.none() | st.lists(call, min_size=1, max_size=2),
)
reason = st.none() | st.sampled_from(["stop", "length", "tool_calls", "abort"])
stop_reason = st.none() | st.integers(0, 9) | st.text(max_size=4)
fixed = st.fixed_dictionaries(
    {"id": st.text(max_size=12), "created": st.integers(0, 2**40), "model": st.text(max_size=12)}
)
usage = st.builds(
    Usage,
    prompt_tokens=st.integers(0, 99),
    completion_tokens=st.integers(0, 99),
    total_tokens=st.integers(0, 200),
)


def sse(chunk) -> str:
    """The chunk as its model dumps it: what the server sent before `ChunkEvents`."""
    return f"data: {chunk.model_dump_json(exclude_none=True)}\n\n"


def _read(event: str) -> dict:
    assert event.startswith("data: ") and event.endswith("\n\n") and "\n" not in event[:-2]
    return json.loads(event[6:])


@given(
    fixed,
    st.integers(0, 7),
    message,
    st.none() | st.builds(ChatLogprobs, content=st.lists(token_logprob, max_size=3)),
    reason,
    stop_reason,
)
def test_a_chat_chunk_reads_as_the_model_dumps_it(fixed, index, delta, logprobs, finish, stop):
    events = ChunkEvents(object="chat.completion.chunk", **fixed)
    got = events.choice(
        index=index, delta=delta, logprobs=logprobs, finish_reason=finish, stop_reason=stop
    )
    choice = ChatChunkChoice(
        index=index, delta=delta, logprobs=logprobs, finish_reason=finish, stop_reason=stop
    )
    assert _read(got) == _read(sse(ChatCompletionChunk(**fixed, choices=[choice])))


@given(
    fixed,
    st.integers(0, 7),
    st.text(max_size=8),
    st.none()
    | st.builds(
        CompletionLogprobs,
        tokens=st.lists(st.text(max_size=3), max_size=3),
        token_logprobs=st.lists(st.none() | logprob, max_size=3),
        top_logprobs=st.lists(
            st.none() | st.dictionaries(st.text(max_size=3), logprob, max_size=2), max_size=3
        ),
        text_offset=st.lists(st.integers(0, 50), max_size=3),
    ),
    reason,
    stop_reason,
)
def test_a_completion_chunk_reads_as_the_model_dumps_it(fixed, index, text, logprobs, finish, stop):
    events = ChunkEvents(object="text_completion", **fixed)
    got = events.choice(
        index=index, text=text, logprobs=logprobs, finish_reason=finish, stop_reason=stop
    )
    choice = CompletionChoice(
        index=index, text=text, logprobs=logprobs, finish_reason=finish, stop_reason=stop
    )
    assert _read(got) == _read(sse(CompletionResponse(**fixed, choices=[choice])))


@given(fixed, usage)
def test_the_usage_chunk_reads_as_the_model_dumps_it(fixed, usage):
    chat = ChunkEvents(object="chat.completion.chunk", **fixed).usage(usage)
    assert _read(chat) == _read(sse(ChatCompletionChunk(**fixed, choices=[], usage=usage)))
    text = ChunkEvents(object="text_completion", **fixed).usage(usage)
    assert _read(text) == _read(sse(CompletionResponse(**fixed, choices=[], usage=usage)))
