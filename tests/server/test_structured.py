"""Structured outputs through the OpenAI API: response_format, forced tool_choice and vLLM's
``structured_outputs`` field, with the real openai client."""

from __future__ import annotations

import json

import openai
import pytest

from .conftest import MODEL

jsonschema = pytest.importorskip("jsonschema")

MESSAGES = [{"role": "user", "content": "Give me the weather."}]
WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 12},
        "days": {"type": "integer", "minimum": 1, "maximum": 14},
    },
    "required": ["city", "days"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "parameters": {
                "type": "object",
                "properties": {"zone": {"enum": ["UTC", "CET"]}},
                "required": ["zone"],
                "additionalProperties": False,
            },
        },
    },
]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


def chat(client, **kwargs):
    kwargs = {"model": MODEL, "messages": MESSAGES, "temperature": 0, "max_tokens": 128} | kwargs
    return client.chat.completions.create(**kwargs)


def test_json_object_and_json_schema_response_formats(client):
    out = chat(client, response_format={"type": "json_object"}).choices[0]
    if out.finish_reason == "stop":  # the embedded model may also write a key forever
        assert isinstance(json.loads(out.message.content), dict)
    else:
        assert out.finish_reason == "length" and out.message.content.startswith("{")
    response_format = {"type": "json_schema", "json_schema": {"name": "w", "schema": WEATHER}}
    out = chat(client, response_format=response_format).choices[0]
    assert out.finish_reason == "stop"
    jsonschema.validate(json.loads(out.message.content), WEATHER)


def test_tool_choice_required_makes_valid_calls(client):
    out = chat(client, tools=TOOLS, tool_choice="required").choices[0]
    assert out.finish_reason == "tool_calls" and out.message.tool_calls
    for call in out.message.tool_calls:
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


def test_a_named_tool_choice_calls_that_function_streaming_or_not(client):
    choice = {"type": "function", "function": {"name": "get_weather"}}
    whole = chat(client, tools=TOOLS, tool_choice=choice).choices[0].message
    assert [c.function.name for c in whole.tool_calls] == ["get_weather"]
    jsonschema.validate(json.loads(whole.tool_calls[0].function.arguments), WEATHER)
    names, arguments = [], ""
    for chunk in chat(client, tools=TOOLS, tool_choice=choice, stream=True):
        for call in chunk.choices[0].delta.tool_calls or () if chunk.choices else ():
            names += [call.function.name] if call.function.name else []
            arguments += call.function.arguments or ""
    assert names == ["get_weather"] and arguments == whole.tool_calls[0].function.arguments


def test_vllm_structured_outputs_field_on_completions(client):
    out = client.completions.create(
        model=MODEL,
        prompt="The code is ",
        max_tokens=16,
        temperature=0,
        extra_body={"structured_outputs": {"regex": "[A-Z]{3}-[0-9]{3}"}},
    )
    assert out.choices[0].text[:7] and out.choices[0].finish_reason == "stop"
    assert len(out.choices[0].text) == 7


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"response_format": {"type": "json_schema", "json_schema": {}}}, "response_format"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": 3}}}},
            "response_format",
        ),
        (
            {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "x"}}},
            "tool_choice",
        ),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"extra_body": {"structured_outputs": {"regex": "("}}}, "structured_outputs"),
        ({"extra_body": {"structured_outputs": {"regexp": "a"}}}, "structured_outputs"),
        (
            {
                "response_format": {"type": "json_object"},
                "extra_body": {"structured_outputs": {"regex": "a"}},
            },
            "structured_outputs",
        ),
    ],
)
def test_bad_constraints_are_400s_naming_the_field(client, kwargs, param):
    with pytest.raises(openai.BadRequestError) as err:
        chat(client, **kwargs)
    assert err.value.body["param"] == param, err.value.body
    assert chat(client, max_tokens=2).choices[0].finish_reason == "length"  # still serving
