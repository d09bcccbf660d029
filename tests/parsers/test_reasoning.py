"""Reasoning parsers: fixtures per format, streamed in every split, fuzzed with random text."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pyagent_ref.parsers.reasoning import REASONING_PARSERS, get_reasoning_parser
from pyagent_ref.parsers.tools import get_tool_parser

from .fixtures import CALL, J_WEATHER
from .helpers import check_reasoning_stream, split, stream

OSS_FINAL = (
    "<|channel|>analysis<|message|>Simple greeting; answer warmly.<|end|>"
    "<|start|>assistant<|channel|>final<|message|>Hello! ☕<|return|>"
)
OSS_CALL = "<|channel|>analysis<|message|>Need the weather.<|end|>" + CALL.format(
    name="get_weather", args=J_WEATHER
)
GRANITE = "Here is my thought process:\nThe user greets me.\nHere is my response:\nHello!"

# (parser, chat_template_kwargs, text, reasoning, content)
FIXTURES = [
    (
        "deepseek_r1",
        {},
        "<think>\nThe user greets.\n</think>\n\nHello!",
        "\nThe user greets.\n",
        "\n\nHello!",
    ),
    (
        "deepseek_r1",
        {},
        "The prompt opened <think>.\n</think>\n\nHi",
        "The prompt opened <think>.\n",
        "\n\nHi",
    ),
    (
        "deepseek_r1",
        {},
        "<think>Still thinking when max_tokens hit",
        "Still thinking when max_tokens hit",
        None,
    ),
    ("deepseek_r1", {}, "<think></think>Hi", None, "Hi"),
    ("deepseek_r1", {}, "Ünïcode 🤔</think>答案", "Ünïcode 🤔", "答案"),
    ("qwen3", {}, "<think>\nLet me think.\n</think>\n\nParis.", "\nLet me think.\n", "\n\nParis."),
    ("qwen3", {}, "Thinking, tag in prompt.</think>Paris.", "Thinking, tag in prompt.", "Paris."),
    ("qwen3", {"enable_thinking": False}, "Paris.", None, "Paris."),
    (
        "qwen3",
        {"enable_thinking": False},
        "Paris </think> is nice.",
        None,
        "Paris </think> is nice.",
    ),
    ("qwen3", {"enable_thinking": False}, "<think>x</think>Paris.", "x", "Paris."),
    ("deepseek_v3", {}, "Hello!", None, "Hello!"),
    ("deepseek_v3", {"thinking": True}, "Hm.</think>Hello!", "Hm.", "Hello!"),
    (
        "mistral",
        {},
        "[THINK]Simple math: 2+2=4.[/THINK]The answer is 4.",
        "Simple math: 2+2=4.",
        "The answer is 4.",
    ),
    ("mistral", {}, "The answer is 4.", None, "The answer is 4."),
    ("mistral", {}, "[THINK]cut off", "cut off", None),
    ("mistral", {}, "[THINK is not the tag", None, "[THINK is not the tag"),
    ("granite", {}, GRANITE, "\nThe user greets me.\n", "\nHello!"),
    ("granite", {}, GRANITE.replace("Here is", "Here's"), "\nThe user greets me.\n", "\nHello!"),
    ("granite", {}, "Here is the answer: 4.", None, "Here is the answer: 4."),
    ("gpt_oss", {}, OSS_FINAL, "Simple greeting; answer warmly.", "Hello! ☕"),
    ("gpt_oss", {}, OSS_CALL, "Need the weather.", CALL.format(name="get_weather", args=J_WEATHER)),
    ("gpt_oss", {}, "<|channel|>analysis<|message|>cut", "cut", None),
    ("gpt_oss", {}, "plain text", None, "plain text"),
]
IDS = [f"{f[0]}-{i}" for i, f in enumerate(FIXTURES)]
PIECES = [
    "<think>",
    "</think>",
    "[THINK]",
    "[/THINK]",
    "Here is my thought process:",
    "Here is my response:",
    "Here's my",
    "<|channel|>",
    "<|message|>",
    "<|end|>",
    "<|start|>",
    "<|return|>",
    "<|call|>",
    "analysis",
    "final",
    "commentary to=functions.f",
    "<th",
    "</",
    "[",
    "<|",
    " ",
    "\n",
    "text",
    "é☕",
]


def test_every_parser_has_fixtures():
    assert {f[0] for f in FIXTURES} == set(REASONING_PARSERS)


@pytest.mark.parametrize(("name", "kwargs", "text", "reasoning", "content"), FIXTURES, ids=IDS)
def test_extract(name, kwargs, text, reasoning, content):
    out = get_reasoning_parser(name)(kwargs).extract(text)
    assert (out.reasoning, out.content) == (reasoning, content)


@pytest.mark.parametrize(("name", "kwargs", "text", "reasoning", "content"), FIXTURES, ids=IDS)
def test_stream_one_character_at_a_time_and_every_prefix(name, kwargs, text, reasoning, content):
    cls = get_reasoning_parser(name)
    check_reasoning_stream(cls, text, list(text), chat_template_kwargs=kwargs)
    for n in range(len(text)):
        check_reasoning_stream(
            cls, text[:n], split(text[:n], range(0, n, 3)), chat_template_kwargs=kwargs
        )


@pytest.mark.parametrize("name", sorted(REASONING_PARSERS))
@given(data=st.data())
def test_stream_random_splits(name, data):
    _, kwargs, text, *_ = data.draw(st.sampled_from([f for f in FIXTURES if f[0] == name]))
    cuts = data.draw(st.lists(st.integers(0, len(text)), max_size=30))
    check_reasoning_stream(
        get_reasoning_parser(name), text, split(text, cuts), chat_template_kwargs=kwargs
    )


@pytest.mark.parametrize("name", sorted(REASONING_PARSERS))
@given(
    text=st.one_of(
        st.text(max_size=60), st.lists(st.sampled_from(PIECES), max_size=20).map("".join)
    ),
    cuts=st.lists(st.integers(0, 200), max_size=10),
    thinking=st.booleans(),
)
def test_fuzz_never_raises(name, text, cuts, thinking):
    kwargs = {"enable_thinking": thinking, "thinking": thinking}
    check_reasoning_stream(
        get_reasoning_parser(name), text, split(text, cuts), chat_template_kwargs=kwargs
    )


def test_gpt_oss_reasoning_then_tool_parser():
    """The server runs the reasoning parser first and the tool parser on its content."""
    reasoning = get_reasoning_parser("gpt_oss")().extract(OSS_CALL)
    calls = get_tool_parser("gpt_oss")().extract(reasoning.content)
    assert reasoning.reasoning == "Need the weather."
    assert calls.content is None
    assert [(c.name, c.arguments) for c in calls.tool_calls] == [("get_weather", J_WEATHER)]
    # and streamed: the reasoning parser's content deltas feed the tool parser
    r, t = get_reasoning_parser("gpt_oss")(), get_tool_parser("gpt_oss")(seed=1)
    deltas = []
    for ch in OSS_CALL:
        if (d := r.stream(ch)) is not None and d.content:
            deltas.append(t.stream(d.content))
    if (d := r.finish()) is not None and d.content:
        deltas.append(t.stream(d.content))
    deltas.append(t.finish())
    args = "".join(c.arguments or "" for d in deltas if d for c in d.tool_calls)
    assert args == J_WEATHER


def test_deltas_are_reasoning_then_content():
    parser = get_reasoning_parser("deepseek_r1")()
    assert parser.stream("<think>ab").to_openai() == {"reasoning_content": "ab"}
    assert parser.stream("c</thi").to_openai() == {"reasoning_content": "c"}
    assert parser.stream("nk>Hi").to_openai() == {"content": "Hi"}
    assert parser.finish() is None
    assert stream(get_reasoning_parser("qwen3")(), ["<thi", "nk>x</think>y"]).reasoning == "x"


def test_configuration_errors():
    with pytest.raises(ValueError, match="unknown reasoning parser 'r1'.*deepseek_r1"):
        get_reasoning_parser("r1")
    with pytest.raises(TypeError):
        get_reasoning_parser(1)
    assert get_reasoning_parser("openai") is get_reasoning_parser("gpt_oss")
    with pytest.raises(TypeError, match="chat_template_kwargs must be a dict"):
        get_reasoning_parser("qwen3")("yes")
    with pytest.raises(
        TypeError, match=r"chat_template_kwargs\['enable_thinking'\] must be a bool"
    ):
        get_reasoning_parser("qwen3")({"enable_thinking": "no"})
    with pytest.raises(TypeError, match="text must be a str"):
        get_reasoning_parser("mistral")().extract(None)
