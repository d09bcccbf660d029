"""Tool-call parsers: fixtures per format, streamed in every split, fuzzed with random text."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pyagent_ref.parsers import ToolCall
from pyagent_ref.parsers.tools import TOOL_PARSERS, get_tool_parser

from .fixtures import COMMON_PIECES, MARKERS, TOOL_FIXTURES
from .helpers import as_calls, check_tool_stream, split

FIXTURE_IDS = [f"{f.parser}-{f.id}" for f in TOOL_FIXTURES]


def test_every_parser_has_fixtures_and_markers():
    assert {f.parser for f in TOOL_FIXTURES} == set(TOOL_PARSERS) == set(MARKERS)
    for name in TOOL_PARSERS:
        mine = [f for f in TOOL_FIXTURES if f.parser == name]
        assert any(len(f.calls) > 1 for f in mine) or name == "mistral" or len(mine) > 3
        assert any(not f.calls for f in mine), f"{name}: no fixture that is content only"


@pytest.mark.parametrize("fx", TOOL_FIXTURES, ids=FIXTURE_IDS)
def test_extract(fx):
    out = get_tool_parser(fx.parser)(**fx.kwargs).extract(fx.text)
    assert out.content == fx.content
    assert [(c.name, json.loads(c.arguments)) for c in out.tool_calls] == fx.calls
    assert out.tools_called == bool(fx.calls)
    if fx.call_ids is not None:
        assert [c.id for c in out.tool_calls] == fx.call_ids


@pytest.mark.parametrize("fx", TOOL_FIXTURES, ids=FIXTURE_IDS)
def test_stream_one_character_at_a_time(fx):
    check_tool_stream(get_tool_parser(fx.parser), fx.text, list(fx.text), fx.exact, **fx.kwargs)


@pytest.mark.parametrize("fx", TOOL_FIXTURES, ids=FIXTURE_IDS)
def test_stream_in_one_piece(fx):
    check_tool_stream(get_tool_parser(fx.parser), fx.text, [fx.text], fx.exact, **fx.kwargs)


@pytest.mark.parametrize("name", sorted(TOOL_PARSERS))
@given(data=st.data())
def test_stream_random_splits(name, data):
    """Any split of a fixture into deltas gives the non-streaming result."""
    fx = data.draw(st.sampled_from([f for f in TOOL_FIXTURES if f.parser == name]))
    cuts = data.draw(st.lists(st.integers(0, len(fx.text)), max_size=30))
    check_tool_stream(get_tool_parser(name), fx.text, split(fx.text, cuts), fx.exact, **fx.kwargs)


@pytest.mark.parametrize("fx", [f for f in TOOL_FIXTURES if f.calls], ids=lambda f: f.id)
def test_every_prefix_of_a_call(fx):
    """Truncated anywhere (max_tokens): no exception, and the stream agrees on the content
    and on every call that the prefix still holds whole."""
    cls = get_tool_parser(fx.parser)
    for n in range(len(fx.text) + 1):
        prefix = fx.text[:n]
        out = cls(**fx.kwargs).extract(prefix)
        assert len(out.tool_calls) <= len(fx.calls)
        check_tool_stream(cls, prefix, split(prefix, range(0, n, 5)), False, **fx.kwargs)


def _mix(name):
    return st.lists(st.sampled_from(MARKERS[name] + COMMON_PIECES), max_size=25).map("".join)


@pytest.mark.parametrize("name", sorted(TOOL_PARSERS))
@given(data=st.data())
def test_fuzz_markers_never_raise(name, data):
    """Random mixes of the format's markers and JSON/Python pieces: no exception, and the
    stream agrees with the whole text (content; the calls of the whole are streamed too)."""
    text = data.draw(_mix(name))
    cuts = data.draw(st.lists(st.integers(0, len(text)), max_size=10))
    check_tool_stream(get_tool_parser(name), text, split(text, cuts), exact=False)


@pytest.mark.parametrize("name", sorted(TOOL_PARSERS))
@given(text=st.text(max_size=80), cuts=st.lists(st.integers(0, 80), max_size=8))
def test_fuzz_random_text_never_raises(name, text, cuts):
    check_tool_stream(get_tool_parser(name), text, split(text, cuts), exact=False)


# -- ids ------------------------------------------------------------------------------

TWO_CALLS = (
    '<tool_call>{"name": "a", "arguments": {}}</tool_call>'
    '<tool_call>{"name": "b", "arguments": {}}</tool_call>'
)


def test_ids_openai_style_and_reproducible_with_a_seed():
    cls = get_tool_parser("hermes")
    ids = [c.id for c in cls().extract(TWO_CALLS).tool_calls]
    assert all(re.fullmatch(r"call_[A-Za-z0-9]{24}", i) for i in ids) and ids[0] != ids[1]
    seeded = [[c.id for c in cls(seed=3).extract(TWO_CALLS).tool_calls] for _ in range(2)]
    assert seeded[0] == seeded[1]
    assert [c.id for c in cls(seed=4).extract(TWO_CALLS).tool_calls] != seeded[0]


def test_id_factory():
    counter = iter(range(100))
    parser = get_tool_parser("hermes")(id_factory=lambda: f"id{next(counter)}")
    assert [c.id for c in parser.extract(TWO_CALLS).tool_calls] == ["id0", "id1"]


def test_mistral_ids_are_nine_alphanumerics():
    out = get_tool_parser("mistral")().extract("[TOOL_CALLS]a[ARGS]{}[TOOL_CALLS]b[ARGS]{}")
    assert all(re.fullmatch(r"[A-Za-z0-9]{9}", c.id) for c in out.tool_calls)


def test_to_openai_shapes():
    call = ToolCall("call_1", "f", '{"x": 1}')
    assert call.to_openai() == {
        "id": "call_1",
        "type": "function",
        "function": {"name": "f", "arguments": '{"x": 1}'},
    }
    parser = get_tool_parser("hermes")(seed=0)
    first = parser.stream('Hi <tool_call>{"name": "f", "arguments": {"x"')
    assert first.to_openai() == {
        "content": "Hi ",
        "tool_calls": [
            {
                "index": 0,
                "id": first.tool_calls[0].id,
                "type": "function",
                "function": {"name": "f", "arguments": '{"x"'},
            }
        ],
    }
    assert parser.stream(": 1}}").to_openai() == {
        "tool_calls": [{"index": 0, "function": {"arguments": ": 1}"}}]
    }
    assert parser.stream("</tool_call>") is None and parser.finish() is None


def test_partial_marker_is_held_back():
    parser = get_tool_parser("hermes")()
    assert parser.stream("Hello <tool_").content == "Hello "
    assert parser.stream("x> world").content == "<tool_x> world"


# -- configuration errors ---------------------------------------------------------------


def test_unknown_parser_lists_the_known_ones():
    with pytest.raises(ValueError, match="unknown tool parser 'nope'.*hermes.*qwen3_xml"):
        get_tool_parser("nope")
    with pytest.raises(TypeError):
        get_tool_parser(None)
    assert get_tool_parser("qwen3_coder") is get_tool_parser("qwen3_xml")
    assert get_tool_parser("openai") is get_tool_parser("gpt_oss")


@pytest.mark.parametrize(
    ("tools", "error", "match"),
    [
        ("get_weather", TypeError, "tools must be a list"),
        ([1], TypeError, r"tools\[0\] must be a dict"),
        ([{"type": "function"}], ValueError, r"tools\[0\] has no 'function'"),
        ([{"function": "f"}], TypeError, r"tools\[0\]\['function'\] must be a dict"),
        ([{"function": {"name": ""}}], ValueError, r"\['name'\] must be a non-empty str"),
        ([{"function": {"name": "f", "parameters": []}}], TypeError, r"\['parameters'\]"),
    ],
)
def test_bad_tools(tools, error, match):
    with pytest.raises(error, match=match):
        get_tool_parser("qwen3_xml")(tools)


def test_bad_arguments():
    cls = get_tool_parser("hermes")
    with pytest.raises(TypeError, match="seed"):
        cls(seed="1")
    with pytest.raises(TypeError, match="id_factory"):
        cls(id_factory="x")
    with pytest.raises(TypeError, match="text must be a str"):
        cls().extract(b"x")
    with pytest.raises(TypeError, match="delta must be a str"):
        cls().stream(None)


def test_qwen3_untyped_when_no_schema_and_typed_union():
    tools = [
        {
            "type": "function",
            "function": {
                "name": "f",
                "parameters": {
                    "properties": {
                        "n": {"type": ["null", "integer"]},
                        "s": {"type": ["string", "integer"]},
                    }
                },
            },
        }
    ]
    text = (
        "<tool_call>\n<function=f>\n<parameter=n>\n5\n</parameter>\n<parameter=s>\n5\n"
        "</parameter>\n<parameter=x>\n5\n</parameter>\n</function>\n</tool_call>"
    )
    out = get_tool_parser("qwen3_xml")(tools).extract(text)
    assert json.loads(out.tool_calls[0].arguments) == {"n": 5, "s": "5", "x": "5"}


def test_arguments_are_the_models_own_json_text():
    text = '<tool_call>{"name": "f", "arguments": {"b": 1,  "a": [ 2 ]}}</tool_call>'
    assert as_calls(get_tool_parser("hermes")(seed=0).extract(text))[0]["arguments"] == (
        '{"b": 1,  "a": [ 2 ]}'
    )


@pytest.mark.parametrize("name", sorted(TOOL_PARSERS))
@given(data=st.data())
def test_fuzz_mutated_fixtures(name, data):
    """Fixtures with pieces inserted, cut out, or another fixture appended: no exception,
    and the stream agrees with the whole text."""
    fixtures = [f for f in TOOL_FIXTURES if f.parser == name]
    fx = data.draw(st.sampled_from(fixtures))
    text = fx.text
    for _ in range(data.draw(st.integers(0, 3))):
        i = data.draw(st.integers(0, len(text)))
        if data.draw(st.booleans()):
            text = text[:i] + data.draw(st.sampled_from(MARKERS[name] + COMMON_PIECES)) + text[i:]
        else:
            text = text[:i] + text[data.draw(st.integers(i, min(len(text), i + 10))) :]
    if data.draw(st.booleans()):
        text += data.draw(st.sampled_from(fixtures)).text
    cuts = data.draw(st.lists(st.integers(0, len(text)), max_size=20))
    check_tool_stream(get_tool_parser(name), text, split(text, cuts), False, **fx.kwargs)


DEEP = "[" * 3000 + "]" * 3000


@pytest.mark.parametrize("name", sorted(TOOL_PARSERS))
def test_deeply_nested_arguments_never_raise(name):
    """Nesting deeper than `json` and `ast` recurse is content, not a RecursionError."""
    for fx in [f for f in TOOL_FIXTURES if f.parser == name and f.calls]:
        text = fx.text.replace('"Paris"', DEEP).replace("'x'", DEEP)
        check_tool_stream(get_tool_parser(name), text, split(text, [len(text) // 2]), False)


def test_command_line_options():
    import argparse

    from pyagent_ref.parsers import add_parser_arguments

    cli = argparse.ArgumentParser()
    add_parser_arguments(cli)
    args = cli.parse_args(["--tool-call-parser", "hermes", "--reasoning-parser", "qwen3"])
    assert (args.tool_call_parser, args.reasoning_parser) == ("hermes", "qwen3")
    for name in ("auto", "openai", "qwen3_coder"):
        assert cli.parse_args(["--tool-call-parser", name]).tool_call_parser == name
    assert cli.parse_args([]).tool_call_parser is None


@pytest.mark.parametrize(
    ("template", "name"),
    [
        ("{{ '<tool_call>\\n' }}{{ tool_call | tojson }}{{ '\\n</tool_call>' }}", "hermes"),
        ("<tool_call>\n<function={{ name }}>\n<parameter={{ k }}>", "qwen3_xml"),
        ("{{ '[TOOL_CALLS]' + name + '[ARGS]' + args }}", "mistral"),
        (
            "'<｜tool▁call▁begin｜>' + tool['type'] + '<｜tool▁sep｜>' + name + '\\n```json\\n'",
            "deepseek_v3",
        ),
        ("'<｜tool▁call▁begin｜>' + name + '<｜tool▁sep｜>' + arguments", "deepseek_v31"),
        ("{{ '<|tool_call|>' + tool_calls | tojson }}", "granite"),
        ("<|action_start|><|plugin|>\n{{ call }}<|action_end|>", "internlm2"),
        ("<|start|>assistant<|channel|>commentary to=functions.{{ name }}", "gpt_oss"),
        ("{{- '<|python_start|>' }}[{{ name }}(...)]", "pythonic"),
        ("[func_name1(params_name1=params_value1, params_name2=params_value2...)]", "pythonic"),
        ("{{- '<|python_tag|>' + tool_call.name + '.call(' }}", "llama3_json"),
        ("{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}", None),
    ],
)
def test_detect_tool_parser(template, name):
    from pyagent_ref.parsers.tools import detect_tool_parser

    assert detect_tool_parser(template) == name
