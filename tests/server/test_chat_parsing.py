"""The assembly of an assistant message from model text (`ChatParsing`), fed fixture text:
the embedded model never writes tool calls, so this is where the parsers' wiring is
checked (the engine side of the wiring is in test_endpoints)."""

from __future__ import annotations

import random

import pytest

from pyagent_ref.parsers import get_reasoning_parser, get_tool_parser
from pyagent_ref.server.chat import ChatParsing

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
TEXT = (
    "<think>The user wants the weather.</think>Let me check.\n"
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>'
)


def _parsing(parallel: bool = True) -> ChatParsing:
    return ChatParsing(
        get_reasoning_parser("deepseek_r1")(),
        get_tool_parser("hermes")(TOOLS, seed=0),
        parallel_tool_calls=parallel,
    )


def test_whole_text_gives_reasoning_content_and_calls():
    parsing = _parsing()
    message = parsing.extract(TEXT)
    assert message.reasoning_content == message.reasoning == "The user wants the weather."
    assert message.content == "Let me check.\n"
    assert [(c.function.name, c.function.arguments) for c in message.tool_calls] == [
        ("get_weather", '{"city": "Paris"}'),
        ("get_weather", '{"city": "Rome"}'),
    ]
    assert parsing.tools_called
    assert len(_parsing(parallel=False).extract(TEXT).tool_calls) == 1


@pytest.mark.parametrize("seed", range(5))
def test_streamed_deltas_add_up_to_the_whole(seed):
    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(1, len(TEXT)), 12))
    pieces = [TEXT[a:b] for a, b in zip([0, *cuts], [*cuts, len(TEXT)], strict=True)]
    parsing = _parsing()
    deltas = [d for piece in pieces for d in parsing.stream(piece)] + parsing.finish()
    reasoning = "".join(d.reasoning_content or "" for d in deltas)
    content = "".join(d.content or "" for d in deltas)
    calls: dict[int, dict] = {}
    for d in deltas:
        for call in d.tool_calls or []:
            entry = calls.setdefault(call.index, {"name": None, "arguments": "", "ids": 0})
            if call.id is not None:
                entry["ids"] += 1
                entry["name"] = call.function.name
            entry["arguments"] += call.function.arguments or ""
    whole = _parsing().extract(TEXT)
    assert reasoning == whole.reasoning_content and content == whole.content
    assert [(c["name"], c["arguments"], c["ids"]) for c in calls.values()] == [
        (c.function.name, c.function.arguments, 1) for c in whole.tool_calls
    ]
    assert parsing.tools_called


def test_no_parsers_is_the_text_itself():
    parsing = ChatParsing(None, None)
    assert parsing.extract("plain").content == "plain"
    assert [d.content for d in parsing.stream("pl")] == ["pl"] and parsing.finish() == []
