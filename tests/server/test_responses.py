"""/v1/responses: the request -> chat conversion, the stream's events (fed the parsers'
deltas of fixture text, since the embedded model writes no tool calls), and the live
endpoint through the openai client's `responses` API."""

from __future__ import annotations

import json
import random

import openai
import pytest

from pyagent_ref.parsers import get_reasoning_parser, get_tool_parser
from pyagent_ref.server.chat import ChatParsing
from pyagent_ref.server.errors import APIError
from pyagent_ref.server.protocol import NamedToolChoice, ResponsesRequest
from pyagent_ref.server.responses import ResponseEvents, input_messages, output_items, to_chat

from .conftest import MODEL

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
TEXT = (
    "<think>The user wants the weather.</think>Let me check.\n"
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>'
)


def _parsing() -> ChatParsing:
    return ChatParsing(
        get_reasoning_parser("deepseek_r1")(), get_tool_parser("hermes")(TOOLS, seed=0)
    )


# --- the request -> chat messages ---------------------------------------------------------


def test_input_items_become_chat_messages():
    req = ResponsesRequest(
        instructions="Be brief.",
        input=[
            {"role": "developer", "content": "Use tools."},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
            {"type": "reasoning", "id": "rs_1", "summary": []},
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
            {"type": "function_call", "call_id": "c2", "name": "g", "arguments": '{"a": 1}'},
            {"type": "function_call_output", "call_id": "c1", "output": "42"},
        ],
    )
    assert input_messages(req) == [
        {"role": "system", "content": "Be brief."},
        {"role": "system", "content": "Use tools."},
        {"role": "user", "content": "Hi"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}},
                {
                    "id": "c2",
                    "type": "function",
                    "function": {"name": "g", "arguments": '{"a": 1}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "42"},
    ]
    assert input_messages(ResponsesRequest(input="Hello")) == [{"role": "user", "content": "Hello"}]


def test_tools_and_tool_choice_map_onto_the_chat_request():
    req = ResponsesRequest(
        input="x",
        tools=[{"type": "function", "name": "f", "description": "d", "parameters": {}}],
        tool_choice={"type": "function", "name": "f"},
        max_output_tokens=7,
        stream=True,
    )
    chat = to_chat(req)
    assert chat.tools[0].function.name == "f" and chat.tools[0].function.description == "d"
    assert chat.tool_choice == NamedToolChoice(function={"name": "f"})
    assert chat.max_completion_tokens == 7 and chat.stream_options.include_usage


@pytest.mark.parametrize(
    "fields, param",
    [
        ({"input": []}, "input"),
        ({"input": [{"role": "robot", "content": "x"}]}, "input.0"),
        ({"input": [{"role": "user", "content": [{"type": "input_image"}]}]}, "input.0.content.0"),
        ({"input": [{"role": "user", "content": 5}]}, "input.0.content"),
        ({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}, "input.0.call_id"),
        ({"input": [{"type": "file_search_call"}]}, "input.0.type"),
        ({"input": "x", "store": True}, "store"),
    ],
)
def test_bad_input_is_a_400_naming_the_field(fields, param):
    with pytest.raises(APIError) as err:
        to_chat(ResponsesRequest(**fields))
    assert err.value.status == 400 and err.value.param == param


# --- chat deltas -> stream events -----------------------------------------------------------


class _Run:
    model = MODEL


def _events(deltas) -> list[dict]:
    stream = ResponseEvents(ResponsesRequest(input="x"), "resp_1", 0, _Run())
    raw = [e for d in deltas for e in stream.deltas(d)] + stream.close("completed")
    events = [json.loads(e.split("data: ", 1)[1]) for e in raw]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    return events


@pytest.mark.parametrize("seed", range(4))
def test_streamed_events_rebuild_the_whole_answer(seed):
    """Whatever the split of the model's text, the items the events open, fill and close
    are the items of the whole text: reasoning, the message, each call."""
    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(1, len(TEXT)), 10))
    pieces = [TEXT[a:b] for a, b in zip([0, *cuts], [*cuts, len(TEXT)], strict=True)]
    parsing = _parsing()
    events = _events([d for p in pieces for d in parsing.stream(p)] + parsing.finish())
    done = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    added = [e for e in events if e["type"] == "response.output_item.added"]
    assert [e["output_index"] for e in added] == list(range(len(done)))
    want = [i.model_dump(exclude_none=True) for i in output_items(_parsing().extract(TEXT))]
    for item in done + want:
        item.pop("id")
    assert done == want
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert text == "Let me check.\n"
    args = [e["arguments"] for e in events if e["type"] == "response.function_call_arguments.done"]
    assert args == ['{"city": "Paris"}', '{"city": "Rome"}']


# --- the endpoint ---------------------------------------------------------------------------


def test_response_and_its_stream_agree(client):
    kwargs = dict(model=MODEL, input="Write a function.", max_output_tokens=8, temperature=0)
    whole = client.responses.create(**kwargs, instructions="You write Python.")
    assert whole.object == "response" and whole.status == "incomplete"  # 8 tokens ran out
    assert whole.incomplete_details.reason == "max_output_tokens"
    assert whole.output_text and whole.usage.output_tokens == 8
    assert whole.usage.total_tokens == whole.usage.input_tokens + 8
    kinds, text, final = [], "", None
    for event in client.responses.create(**kwargs, instructions="You write Python.", stream=True):
        kinds.append(event.type)
        if event.type == "response.output_text.delta":
            text += event.delta
        final = event
    assert kinds[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert kinds[-1] == "response.incomplete" and text == whole.output_text
    assert final.response.output_text == text and final.response.usage.output_tokens == 8


def test_a_finished_response_is_completed(client):
    out = client.responses.create(
        model=MODEL,
        input=[{"role": "user", "content": "Hi"}],
        max_output_tokens=64,
        temperature=0,
    )
    assert out.status in ("completed", "incomplete")
    assert (out.status == "completed") == (out.usage.output_tokens < 64)


@pytest.mark.parametrize(
    "extra, param",
    [
        ({"previous_response_id": "resp_1"}, "previous_response_id"),
        ({"tool_choice": {"type": "function", "name": "g"}, "tools": []}, "tool_choice"),
        ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format"),
        ({"max_output_tokens": 0}, "max_output_tokens"),
        ({"temperature": -1.0}, "temperature"),
    ],
)
def test_unsupported_or_bad_fields_are_400s(client, extra, param):
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model=MODEL, input="Hi", **extra)
    assert err.value.body["param"] == param, err.value.body
