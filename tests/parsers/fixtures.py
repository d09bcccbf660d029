"""Model outputs in each tool-call format, written from the formats' documentation and chat
templates, with what a parser must make of them.

``exact=False`` marks text that goes wrong only after a call's name has been sent: there
the stream has sent that call's beginning, while the whole text is content (see
`pyagent_ref.parsers.tools.base`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

WEATHER = {"city": "Paris", "unit": "celsius"}
NESTED = {
    "query": 'café ☕ 東京 "quoted" \\ back',
    "filters": {"tags": ["a", "b"], "range": {"min": 1, "max": 2.5}, "deep": [[{}], []]},
    "flag": True,
    "none": None,
}
J_WEATHER = '{"city": "Paris", "unit": "celsius"}'
J_NESTED = (
    '{"query": "café ☕ 東京 \\"quoted\\" \\\\ back", "filters": {"tags": ["a", "b"], '
    '"range": {"min": 1, "max": 2.5}, "deep": [[{}], []]}, "flag": true, "none": null}'
)
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string"},
                    "days": {"type": "integer"},
                    "ratio": {"type": "number"},
                    "metric": {"type": "boolean"},
                    "filters": {"type": "object"},
                    "hours": {"type": ["array", "null"]},
                },
            },
        },
    }
]


@dataclass
class Fixture:
    parser: str
    id: str
    text: str
    content: str | None
    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    exact: bool = True
    kwargs: dict[str, Any] = field(default_factory=dict)
    call_ids: list[str] | None = None  # ids the text itself gives


def _f(parser, id, text, content, calls=(), **kw):
    return Fixture(parser, id, text, content, list(calls), **kw)


def _content(parser, id, text, exact=True):
    """A text that is all content."""
    return Fixture(parser, id, text, text, [], exact)


HC = "<tool_call>\n{body}\n</tool_call>"
HERMES = [
    _f(
        "hermes",
        "one",
        HC.format(body=f'{{"name": "get_weather", "arguments": {J_WEATHER}}}'),
        None,
        [("get_weather", WEATHER)],
    ),
    _f(
        "hermes",
        "parallel",
        HC.format(body=f'{{"name": "get_weather", "arguments": {J_WEATHER}}}')
        + "\n"
        + HC.format(body='{"name": "get_time", "arguments": {"zone": "CET"}}'),
        None,
        [("get_weather", WEATHER), ("get_time", {"zone": "CET"})],
    ),
    _f(
        "hermes",
        "content-around",
        "Let me check that for you.\n"
        + HC.format(body=f'{{"name": "get_weather", "arguments": {J_WEATHER}}}')
        + "\nI will report back.",
        "Let me check that for you.\n\nI will report back.",
        [("get_weather", WEATHER)],
    ),
    _f(
        "hermes",
        "nested-unicode",
        HC.format(body=f'{{"name": "search", "arguments": {J_NESTED}}}'),
        None,
        [("search", NESTED)],
    ),
    _f(
        "hermes",
        "string-arguments",
        '<tool_call>{"name": "f", "arguments": "{\\"x\\": 1}"}</tool_call>',
        None,
        [("f", {"x": 1})],
    ),
    _f(
        "hermes",
        "arguments-first",
        '<tool_call>{"arguments": {"x": [1, 2]}, "name": "f"}</tool_call>',
        None,
        [("f", {"x": [1, 2]})],
    ),
    _f("hermes", "no-end-tag", '<tool_call>\n{"name": "f", "arguments": {}}\n', None, [("f", {})]),
    _content("hermes", "plain", "The weather in Paris is sunny, 24 °C."),
    _content("hermes", "marker-in-prose", "Use the <tool_ call> tag, or <tool_call> x"),
    _content(
        "hermes",
        "malformed-json",
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": }\n</tool_call>',
        False,
    ),
    _content(
        "hermes",
        "truncated",
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par',
        False,
    ),
]

LLAMA3 = [
    _f(
        "llama3_json",
        "one",
        f'{{"name": "get_weather", "parameters": {J_WEATHER}}}',
        None,
        [("get_weather", WEATHER)],
    ),
    _f(
        "llama3_json",
        "parallel",
        f'{{"name": "get_weather", "parameters": {J_WEATHER}}}; '
        '{"name": "get_time", "parameters": {"zone": "CET"}}',
        None,
        [("get_weather", WEATHER), ("get_time", {"zone": "CET"})],
    ),
    _f(
        "llama3_json",
        "python-tag",
        f'<|python_tag|>{{"name": "search", "parameters": {J_NESTED}}}',
        None,
        [("search", NESTED)],
    ),
    _f(
        "llama3_json",
        "content-before-tag",
        'Checking.<|python_tag|>{"name": "get_time", "arguments": {"zone": "CET"}}',
        "Checking.",
        [("get_time", {"zone": "CET"})],
    ),
    _f(
        "llama3_json",
        "content-after",
        '  {"name": "f", "parameters": {}} Done.',
        " Done.",
        [("f", {})],
    ),
    _content("llama3_json", "json-answer", '{"answer": 42, "unit": "m"}'),
    _content("llama3_json", "plain", "Paris is the capital of France."),
    _content(
        "llama3_json", "truncated", '{"name": "get_weather", "parameters": {"city": "P', False
    ),
]

PYTHONIC = [
    _f(
        "pythonic",
        "one",
        '[get_weather(city="Paris", unit="celsius")]',
        None,
        [("get_weather", WEATHER)],
    ),
    _f(
        "pythonic",
        "parallel",
        '[get_weather(city="Paris", unit="celsius"), get_time()]',
        None,
        [("get_weather", WEATHER), ("get_time", {})],
    ),
    _f(
        "pythonic",
        "llama4-markers",
        'Let me look.<|python_start|>[search(query="x")]<|python_end|>',
        "Let me look.",
        [("search", {"query": "x"})],
    ),
    _f(
        "pythonic",
        "nested-unicode",
        "[book(name='Zoë ☕ 東京', guests=[{'name': 'A', 'age': 3}], pair=(1, 2), ok=True, "
        'note=None, ratio=0.5, text="a, b) c")]',
        None,
        [
            (
                "book",
                {
                    "name": "Zoë ☕ 東京",
                    "guests": [{"name": "A", "age": 3}],
                    "pair": [1, 2],
                    "ok": True,
                    "note": None,
                    "ratio": 0.5,
                    "text": "a, b) c",
                },
            )
        ],
    ),
    _f(
        "pythonic",
        "triple-quoted",
        '[write(text="""line 1\nline "2", ok""")]',
        None,
        [("write", {"text": 'line 1\nline "2", ok'})],
    ),
    _content("pythonic", "citation", "[1] is the first reference."),
    _content("pythonic", "positional", '[get_weather("Paris")]', False),
    _content("pythonic", "expression", "[f(x=1 + 2)]", False),
    _content("pythonic", "truncated", '[get_weather(city="Paris", unit="cel', False),
]

MISTRAL = [
    _f(
        "mistral",
        "pre-v11",
        f'[TOOL_CALLS][{{"name": "get_weather", "arguments": {J_WEATHER}}}]',
        None,
        [("get_weather", WEATHER)],
    ),
    _f(
        "mistral",
        "pre-v11-parallel",
        'Sure.[TOOL_CALLS] [{"name": "a", "arguments": {}}, '
        f'{{"name": "search", "arguments": {J_NESTED}}}]',
        "Sure.",
        [("a", {}), ("search", NESTED)],
    ),
    _f(
        "mistral",
        "v11",
        f"[TOOL_CALLS]get_weather[ARGS]{J_WEATHER}",
        None,
        [("get_weather", WEATHER)],
    ),
    _f(
        "mistral",
        "v11-parallel",
        f"Two calls.[TOOL_CALLS]get_time[ARGS]{{}}[TOOL_CALLS]search[ARGS]{J_NESTED}",
        "Two calls.",
        [("get_time", {}), ("search", NESTED)],
    ),
    _f(
        "mistral",
        "v13-call-id",
        f"[TOOL_CALLS]get_weather[CALL_ID]A1b2C3d4E[ARGS]{J_WEATHER}",
        None,
        [("get_weather", WEATHER)],
        call_ids=["A1b2C3d4E"],
    ),
    _content("mistral", "bad-name", "[TOOL_CALLS]get weather[ARGS]{}"),
    _content("mistral", "truncated", '[TOOL_CALLS]get_weather[ARGS]{"city": "Pa', False),
    _content("mistral", "plain", "No tools needed: it is 4."),
]

QX = "<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>"


def _qp(name, value):
    return f"<parameter={name}>\n{value}\n</parameter>\n"


QWEN3 = [
    _f(
        "qwen3_xml",
        "typed",
        QX.format(name="get_weather", params=_qp("city", "Paris") + _qp("days", "3")),
        None,
        [("get_weather", {"city": "Paris", "days": 3})],
        kwargs={"tools": TOOLS},
    ),
    _f(
        "qwen3_xml",
        "untyped",
        QX.format(name="get_weather", params=_qp("city", "Paris") + _qp("days", "3")),
        None,
        [("get_weather", {"city": "Paris", "days": "3"})],
    ),
    _f(
        "qwen3_xml",
        "parallel-content",
        "I'll check both.\n\n"
        + QX.format(name="get_weather", params=_qp("city", "Paris"))
        + "\n"
        + QX.format(name="get_time", params=""),
        "I'll check both.\n\n",
        [("get_weather", {"city": "Paris"}), ("get_time", {})],
        kwargs={"tools": TOOLS},
    ),
    _f(
        "qwen3_xml",
        "all-types",
        QX.format(
            name="get_weather",
            params=_qp("city", "Zoë\n  東京 <b>")
            + _qp("ratio", "0.25")
            + _qp("metric", "True")
            + _qp("filters", '{"tags": ["a"], "n": {"m": null}}')
            + _qp("hours", "[1, 2]")
            + _qp("days", "three"),
        ),
        None,
        [
            (
                "get_weather",
                {
                    "city": "Zoë\n  東京 <b>",
                    "ratio": 0.25,
                    "metric": True,
                    "filters": {"tags": ["a"], "n": {"m": None}},
                    "hours": [1, 2],
                    "days": "three",
                },
            )
        ],
        kwargs={"tools": TOOLS},
    ),
    _content(
        "qwen3_xml",
        "bad-element",
        "<tool_call>\n<function=f>\n<oops>\n</function>\n</tool_call>",
        False,
    ),
    _content(
        "qwen3_xml",
        "truncated",
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nPar",
        False,
    ),
]

B, E = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>"
BB, EE, S = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁sep｜>"


def _v3(name, args):
    return f"{B}function{S}{name}\n```json\n{args}\n```{E}"


def _v31(name, args):
    return f"{B}{name}{S}{args}{E}"


DEEPSEEK = [
    _f(
        "deepseek_v3",
        "one",
        f"Sure.{BB}{_v3('get_weather', J_WEATHER)}{EE}",
        "Sure.",
        [("get_weather", WEATHER)],
    ),
    _f(
        "deepseek_v3",
        "parallel",
        f"{BB}{_v3('get_weather', J_WEATHER)}\n{_v3('search', J_NESTED)}{EE}",
        None,
        [("get_weather", WEATHER), ("search", NESTED)],
    ),
    _content("deepseek_v3", "plain", "It is sunny."),
    _f(
        "deepseek_v3",
        "truncated",
        f'{BB}{B}function{S}get_weather\n```json\n{{"city":',
        f'{B}function{S}get_weather\n```json\n{{"city":',  # the outer marker is dropped
        exact=False,
    ),
    _f(
        "deepseek_v31",
        "one",
        f"{BB}{_v31('get_weather', J_WEATHER)}{EE}",
        None,
        [("get_weather", WEATHER)],
    ),
    _f(
        "deepseek_v31",
        "parallel-content",
        f"Both.{BB}{_v31('get_time', '{}')}{_v31('search', J_NESTED)}{EE}",
        "Both.",
        [("get_time", {}), ("search", NESTED)],
    ),
    _f("deepseek_v31", "not-object", f"{BB}{_v31('f', '[1]')}{EE}", f"{B}f{S}[1]{E}", exact=False),
    _f(
        "deepseek_v31",
        "truncated",
        f'{BB}{B}get_weather{S}{{"ci',
        f'{B}get_weather{S}{{"ci',
        exact=False,
    ),
]

GRANITE = [
    _f(
        "granite",
        "one",
        f'<|tool_call|>[{{"name": "get_weather", "arguments": {J_WEATHER}}}]',
        None,
        [("get_weather", WEATHER)],
    ),
    _f(
        "granite",
        "parallel-content",
        'On it. <|tool_call|>[{"name": "get_time", "arguments": {}},\n'
        f' {{"name": "search", "arguments": {J_NESTED}}}]',
        "On it. ",
        [("get_time", {}), ("search", NESTED)],
    ),
    _content("granite", "not-a-list", '<|tool_call|>{"name": "f", "arguments": {}}'),
    _content("granite", "truncated", '<|tool_call|>[{"name": "get_weather", "argu', False),
    _content("granite", "plain", "Granite says hello."),
]

IA, IE = "<|action_start|><|plugin|>", "<|action_end|>"
INTERNLM2 = [
    _f(
        "internlm2",
        "one",
        f'{IA}\n{{"name": "get_weather", "parameters": {J_WEATHER}}}{IE}',
        None,
        [("get_weather", WEATHER)],
    ),
    _f(
        "internlm2",
        "content-two",
        f'I will look it up.{IA}\n{{"name": "get_time", "parameters": {{}}}}{IE}'
        f'{IA}{{"name": "search", "arguments": {J_NESTED}}}{IE}',
        "I will look it up.",
        [("get_time", {}), ("search", NESTED)],
    ),
    _content("internlm2", "malformed", f'{IA}\n{{"nom": "f"}}{IE}'),
    _content("internlm2", "truncated", f'{IA}\n{{"name": "get_weather", "parameters": {{', False),
]

AN = "<|channel|>analysis<|message|>The user wants the weather. Call get_weather.<|end|>"
CALL = (
    "<|start|>assistant<|channel|>commentary to=functions.{name} <|constrain|>json"
    "<|message|>{args}<|call|>"
)
GPT_OSS = [
    _f(
        "gpt_oss",
        "analysis-call",
        AN + CALL.format(name="get_weather", args=J_WEATHER),
        None,
        [("get_weather", WEATHER)],
    ),
    _f(
        "gpt_oss",
        "recipient-in-role",
        AN
        + "<|start|>assistant to=functions.search<|channel|>commentary json<|message|>"
        + J_NESTED
        + "<|call|>",
        None,
        [("search", NESTED)],
    ),
    _f(
        "gpt_oss",
        "final",
        AN + "<|start|>assistant<|channel|>final<|message|>Sunny, 24 °C.<|return|>",
        "Sunny, 24 °C.",
    ),
    _f(
        "gpt_oss",
        "preamble-two-calls",
        "<|channel|>commentary<|message|>Checking both.<|end|>"
        + CALL.format(name="get_time", args="{}").replace("<|call|>", "<|end|>")
        + CALL.format(name="get_weather", args=J_WEATHER),
        "Checking both.",
        [("get_time", {}), ("get_weather", WEATHER)],
    ),
    _f(
        "gpt_oss",
        "no-call-token",
        AN + CALL.format(name="get_weather", args=J_WEATHER)[:-8],
        None,
        [("get_weather", WEATHER)],
    ),
    _f(
        "gpt_oss",
        "builtin-tool",
        '<|channel|>analysis to=browser.search<|message|>{"query": "x"}<|call|>',
        None,
    ),
    _f("gpt_oss", "not-json", CALL.format(name="f", args="not json"), "not json", exact=False),
    _content("gpt_oss", "plain", "Just text, no harmony."),
    _f(
        "gpt_oss",
        "truncated-header",
        AN + "<|start|>assistant<|channel|>comm",
        "<|start|>assistant<|channel|>comm",
    ),
]

TOOL_FIXTURES = (
    HERMES + LLAMA3 + PYTHONIC + MISTRAL + QWEN3 + DEEPSEEK + GRANITE + INTERNLM2 + GPT_OSS
)

# Fragments for random mixes: each format's markers, plus JSON and Python pieces.
COMMON_PIECES = [
    '{"name": "f", "arguments": {',
    '{"name": "g", "parameters": ',
    '"a": 1',
    '"s": "x, y"',
    "}",
    "{",
    "]",
    "[",
    ",",
    ";",
    ":",
    '"',
    "\\",
    " ",
    "\n",
    "text",
    "é☕",
    "null",
    "f(",
    "a=1",
    ")",
    "'",
    '"""',
    "```json\n",
    "```",
    "<",
    ">",
    "|",
    "=",
    "{}",
]
MARKERS = {
    "hermes": ["<tool_call>", "</tool_call>", "<tool_", "</tool_call"],
    "llama3_json": ["<|python_tag|>", "<|python_t"],
    "pythonic": ["<|python_start|>", "<|python_end|>", "[f(a=1)", "[", "g()", "<|python_"],
    "mistral": ["[TOOL_CALLS]", "[ARGS]", "[CALL_ID]", "abcDEF123", "get_weather", "[TOOL_"],
    "qwen3_xml": [
        "<tool_call>",
        "</tool_call>",
        "<function=f>",
        "</function>",
        "<parameter=a>",
        "</parameter>",
        "<function=",
        "<parameter=days>",
        "3",
    ],
    "deepseek_v3": [BB, EE, B, E, S, "function", "f\n", "<｜tool▁"],
    "deepseek_v31": [BB, EE, B, E, S, "f", "<｜tool▁"],
    "granite": ["<|tool_call|>", "<|tool_", '[{"name": "f", "arguments": {}}'],
    "internlm2": [IA, IE, "<|action_start|>", "<|plugin|>", "<|action_"],
    "gpt_oss": [
        "<|start|>",
        "<|channel|>",
        "<|message|>",
        "<|end|>",
        "<|call|>",
        "<|return|>",
        "<|constrain|>",
        "analysis",
        "final",
        "commentary",
        " to=functions.f ",
        " to=browser.search",
        "json",
        "assistant",
        "<|",
    ],
}
