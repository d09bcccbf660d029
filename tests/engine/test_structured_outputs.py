"""Structured outputs in the engine, on the embedded default model (a real 4k BPE vocabulary).

Every constrained output must be in the constraint's language (or a viable prefix of it
when cut by max_tokens), whatever the model would have preferred; unconstrained requests
in the same batch must draw exactly the tokens they draw alone.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading

import pytest

from pyagent_ref.engine.llm import LLM, AsyncLLM
from pyagent_ref.sample.params import SamplingParams
from pyagent_ref.structured.constraints import constraint_grammar
from pyagent_ref.structured.earley import EarleyParser

PROMPT = "def main():\n"


@pytest.fixture(scope="module")
def llm():
    return LLM(ops="ref", max_num_batched_tokens=64)


def constrained(max_tokens=48, **constraint) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=max_tokens, structured_outputs=constraint)


def test_regex_output_matches_and_stops_where_the_pattern_ends(llm):
    pattern = r"[0-9]{3}-[a-z]{2,4}\."
    out = llm.generate(PROMPT, constrained(regex=pattern))[0].outputs[0]
    assert re.fullmatch(pattern, out.text), out.text
    assert out.finish_reason == "stop"


def test_choice_picks_one_of_the_strings(llm):
    choices = ["yes", "no", "maybe later"]
    outs = llm.generate(["Is it raining?", PROMPT], constrained(choice=choices))
    for out in outs:
        assert out.outputs[0].text in choices and out.outputs[0].finish_reason == "stop"


def test_sampled_outputs_with_n_all_match(llm):
    pattern = r"(ab|cd)+e?"
    params = SamplingParams(
        n=4, temperature=1.5, seed=7, max_tokens=12, structured_outputs={"regex": pattern}
    )
    for completion in llm.generate(PROMPT, params)[0].outputs:
        text = completion.text
        if completion.finish_reason == "stop":
            assert re.fullmatch(pattern, text), text
        else:  # cut by max_tokens: a prefix of a match
            assert completion.finish_reason == "length"
            assert re.fullmatch(pattern, text) or re.fullmatch(r"(ab|cd)*[ac]?", text), text


@pytest.mark.parametrize(
    "schema",
    [
        {
            "type": "object",
            "properties": {"n": {"type": "integer", "minimum": -1000, "maximum": 1000}},
            "required": ["n"],
            "additionalProperties": False,
        },
        {
            "type": "object",
            "properties": {
                "name": {"type": "string", "maxLength": 8},
                "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3},
                "ok": {"type": "boolean"},
            },
            "required": ["name", "tags", "ok"],
            "additionalProperties": False,
        },
        {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 99}, "maxItems": 4},
    ],
)
def test_json_schema_output_is_valid(llm, schema):
    jsonschema = pytest.importorskip("jsonschema")
    params = constrained(max_tokens=96, json=schema, disable_any_whitespace=True)
    out = llm.generate(PROMPT, params)[0].outputs[0]
    assert out.finish_reason == "stop", out.text
    jsonschema.validate(json.loads(out.text), schema)


def test_json_object_mode_is_json_or_a_viable_prefix(llm):
    """The embedded model pads with newlines and repeats itself: the default whitespace
    (a line break at most at each place) keeps it moving, but it may run out of tokens."""
    params = constrained(max_tokens=64, json_object=True)
    out = llm.generate("Answer in JSON: ", params)[0].outputs[0]
    if out.finish_reason == "stop":
        assert isinstance(json.loads(out.text), dict)
    else:
        assert out.finish_reason == "length"
        parser = EarleyParser(constraint_grammar(params.structured_outputs))
        assert all(parser.push(b) for b in out.text.encode()) and not parser.is_accepting()
    assert "\n\n" not in out.text


def test_unconstrained_neighbours_draw_the_same_tokens(llm):
    free = SamplingParams(temperature=0.8, seed=3, max_tokens=16, ignore_eos=True)
    alone = llm.generate(["import os\n", "class A:\n"], free)
    mixed = llm.generate(
        ["import os\n", PROMPT, "class A:\n"], [free, constrained(regex="[a-z]{5,10}"), free]
    )
    assert [o.outputs[0].token_ids for o in alone] == [
        mixed[0].outputs[0].token_ids,
        mixed[2].outputs[0].token_ids,
    ]


@pytest.mark.parametrize(
    ("constraint", "message"),
    [
        ({"regex": "a(b"}, "structured_outputs.regex cannot be used"),
        ({"json": "{not json"}, "structured_outputs.json"),
        ({"json": {"type": "frobnicate"}}, "structured_outputs.json cannot be used"),
        ({"grammar": "root ::= ("}, "structured_outputs.grammar cannot be used"),
    ],
)
def test_a_bad_constraint_is_an_admission_error_and_queues_nothing(llm, constraint, message):
    good = SamplingParams(temperature=0, max_tokens=4)
    with pytest.raises(ValueError, match=re.escape(message)):
        llm.generate(["import os\n", PROMPT], [good, constrained(**constraint)])
    assert not llm.core.has_unfinished_requests()
    assert llm.generate("import os\n", good)[0].outputs[0].finish_reason == "length"


def test_a_failing_grammar_fails_its_request_alone(llm, monkeypatch):
    class Broken:
        def fill_next_token_bitmask(self, bitmask, index=0):
            raise RuntimeError("boom")

    make = llm.structured.matcher
    monkeypatch.setattr(llm.structured, "matcher", lambda grammar, ends: Broken())
    free = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    outs = llm.generate(["import os\n", PROMPT], [free, constrained(regex="[a-z]+")])
    monkeypatch.setattr(llm.structured, "matcher", make)
    assert outs[0].outputs[0].finish_reason == "length"
    failed = outs[1].outputs[0]
    assert failed.finish_reason == "error" and "RuntimeError: boom" in (failed.error or "")


def test_async_requests_run_while_a_grammar_compiles():
    engine = AsyncLLM(ops="ref", max_num_batched_tokens=64)
    release = threading.Event()
    compile_grammar = engine.structured.compile

    def slow_compile(params):
        engine.structured._pool.submit(release.wait, 30)  # holds the one worker thread
        return compile_grammar(params)

    engine.structured.compile = slow_compile

    async def run(prompt, params):  # (the deltas' text joined, the last finish reason)
        text = ""
        async for out in engine.generate(prompt, params):
            text += out.outputs[0].text
        return text, out.outputs[0].finish_reason

    async def main():
        slow = asyncio.ensure_future(run(PROMPT, constrained(regex="[0-9]{4}")))
        await asyncio.sleep(0)
        fast = await run("import os\n", SamplingParams(temperature=0, max_tokens=8))
        assert not slow.done()  # the other request finished while the grammar was waiting
        release.set()
        return fast, await slow

    fast, slow = asyncio.run(main())
    assert fast[1] == "length"
    assert re.fullmatch("[0-9]{4}", slow[0]) and slow[1] == "stop"


def test_accel_ops_draw_the_same_constrained_tokens(llm):
    pytest.importorskip("pyagent_accel")
    accel = LLM(ops="accel", max_num_batched_tokens=64)
    params = [
        constrained(regex=r"[0-9]{3}-[a-z]{2,4}\."),
        constrained(choice=["yes", "no"]),
        SamplingParams(
            temperature=0.9, seed=5, max_tokens=24, structured_outputs={"regex": "(ab|c)+"}
        ),
    ]
    prompts = [PROMPT, "Is it?", "import os\n"]
    expected = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    assert [o.outputs[0].token_ids for o in accel.generate(prompts, params)] == expected


def test_a_compilation_past_the_timeout_is_an_admission_error(llm, monkeypatch):
    release = threading.Event()
    slow = {"regex": "[a-c]{7}"}  # a key no other test compiles
    monkeypatch.setattr(llm.structured, "compile_timeout_s", 0.2)
    llm.structured._pool.submit(release.wait, 30)  # holds the one compile thread
    try:
        with pytest.raises(ValueError, match=r"structured_outputs.regex .* more than 0.2 s"):
            llm.generate(PROMPT, constrained(**slow))
    finally:
        release.set()
    assert not llm.core.has_unfinished_requests()
    out = llm.generate(PROMPT, constrained(**slow))[0].outputs[0]  # compiled meanwhile
    assert re.fullmatch("[a-c]{7}", out.text)


def test_async_compilation_past_the_timeout_is_an_admission_error():
    engine = AsyncLLM(ops="ref", max_num_batched_tokens=64)
    engine.structured.compile_timeout_s = 0.2
    release = threading.Event()
    engine.structured._pool.submit(release.wait, 30)

    async def main():
        with pytest.raises(ValueError, match="more than 0.2 s"):
            async for _ in engine.generate(PROMPT, constrained(regex="[0-9]{2}")):
                pass
        release.set()
        return [o async for o in engine.generate("import os\n", SamplingParams(max_tokens=2))]

    assert asyncio.run(main())[-1].finished
