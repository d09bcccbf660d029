"""JSON Schema → grammar, judged by the `jsonschema` package.

The oracle is never our own code: instance validity comes from `jsonschema`, regex truth
from Python's `re`, numbers from `decimal`. Generated schemas are judged both ways: random
instances are accepted exactly when `jsonschema` says they are valid, and random
sentences of the grammar (random walks of the parser) are valid instances. Where the
grammar departs from JSON Schema on purpose (`LOOSENINGS`), the generators stay inside
the exact part (object keys in schema order, floats that are not whole and have no
exponent) and the departures have tests of their own.
"""

from __future__ import annotations

import json
import os
import random
import re
import time
from decimal import Decimal
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from pyagent_ref.structured.earley import EarleyParser
from pyagent_ref.structured.grammar import Grammar, Terminal
from pyagent_ref.structured.json_schema import (
    LOOSENINGS,
    MAX_COUNTED,
    MAX_DEPTH,
    MAX_ENUM,
    SchemaError,
    decimal_range_regex,
    integer_range_regex,
    json_schema_grammar,
)

jsonschema = pytest.importorskip("jsonschema")

MASKBENCH = Path(os.environ.get("MASKBENCH_DIR", "/work/shared/data/maskbench"))


def accepts(grammar: Grammar, text: str) -> bool:
    """Whether the whole of ``text`` (UTF-8) is a sentence of ``grammar``."""
    parser = EarleyParser(grammar)
    return all(parser.push(byte) for byte in text.encode()) and parser.is_accepting()


def valid(schema, instance) -> bool:
    return jsonschema.validators.validator_for(schema)(schema).is_valid(instance)


def test_the_worked_example_of_the_module_docstring():
    schema = {
        "type": "object",
        "properties": {"n": {"type": "integer", "minimum": 1}},
        "required": ["n"],
        "additionalProperties": False,
    }
    grammar = json_schema_grammar(schema, whitespace="")
    shown = {
        name: [[s.pattern if isinstance(s, Terminal) else s for s in alt] for alt in alts]
        for name, alts in grammar.rules.items()
    }
    assert shown == {
        "#": [["#:object"]],
        "#:object": [["'{'", "#:object:from 0", "'}'"]],
        "#:object:from 0": [['"n":', "#/properties/n", "#:object:then 1"]],
        "#:object:then 1": [[]],
        "#/properties/n": [[r"[1-9]\d*"]],
    }
    for text, ok in [('{"n":1}', True), ('{"n":20}', True), ('{"n":0}', False), ("{}", False)]:
        assert accepts(grammar, text) == ok, text
    assert not accepts(grammar, '{"n": 1}')  # compact: no whitespace


# --- numbers ------------------------------------------------------------------------------

bounds = st.one_of(st.none(), st.integers(-130, 130))


@given(bounds, bounds)
def test_integer_range_regex_is_exact(lo, hi):
    pattern = integer_range_regex(lo, hi)
    inside = [n for n in range(-1200, 1200) if (lo is None or n >= lo) and (hi is None or n <= hi)]
    if not inside:
        assert pattern is None
        return
    for n in range(-1200, 1200):
        assert bool(re.fullmatch(pattern, str(n))) == (n in inside), (pattern, n)
    assert bool(re.fullmatch(pattern, "-0")) == (0 in inside)
    for text in ("007", "+1", "1.0", "", "-"):
        assert not re.fullmatch(pattern, text)


decimals = st.decimals(-30, 30, places=2).map(lambda d: d.normalize() + 0)
number_texts = st.one_of(
    decimals.map(lambda d: format(d, "f")),
    decimals.map(lambda d: format(d, "f")).map(lambda t: t + ("0" if "." in t else ".00")),
    st.sampled_from(["-0", "0", "-0.0", "0.000", "30.01", "-30.001", "0.5", "1", "-1"]),
)


@given(st.none() | decimals, st.none() | decimals, st.booleans(), st.booleans(), number_texts)
def test_decimal_range_regex_is_exact(lo, hi, lo_exclusive, hi_exclusive, text):
    pattern = decimal_range_regex(lo, hi, lo_exclusive, hi_exclusive)
    value = Decimal(text)
    expected = (lo is None or value > lo or (value == lo and not lo_exclusive)) and (
        hi is None or value < hi or (value == hi and not hi_exclusive)
    )
    assert (pattern is not None and re.fullmatch(pattern, text) is not None) == expected


@given(
    st.sampled_from([1, 2, 3, 7, 10, 12, 25, 0.5, 0.25, 0.01, 2.5, 1.5, 0.1]),
    st.booleans(),
    number_texts,
)
def test_multiple_of_is_exact_without_exponents(step, integer, text):
    grammar = json_schema_grammar({"type": "integer" if integer else "number", "multipleOf": step})
    value = Decimal(text)
    expected = value % Decimal(repr(step)) == 0 and (not integer or "." not in text)
    assert accepts(grammar, text) == expected


def test_bounded_numbers_and_multiples_with_bounds():
    grammar = json_schema_grammar(
        {"type": "integer", "minimum": 3, "exclusiveMaximum": 30, "multipleOf": 4}
    )
    assert [n for n in range(-5, 40) if accepts(grammar, str(n))] == [4, 8, 12, 16, 20, 24, 28]
    grammar = json_schema_grammar({"type": "number", "exclusiveMinimum": 0, "maximum": 1.5})
    for text, ok in [
        ("0", False),
        ("0.0001", True),
        ("1.5", True),
        ("1.50", True),
        ("1.51", False),
        ("-0", False),
    ]:
        assert accepts(grammar, text) == ok, text


def test_draft4_boolean_exclusive_bounds():
    schema = {"type": "integer", "minimum": 1, "exclusiveMinimum": True, "maximum": 3}
    grammar = json_schema_grammar(schema)
    assert [n for n in range(-3, 6) if accepts(grammar, str(n))] == [2, 3]


# --- strings ------------------------------------------------------------------------------

STRING_ALPHABET = 'ab"\\/\n\t\x00\x1féα😀 '
PATTERNS = ["^a", "b$", "^[a-c]+$", "ab", "", "^(ab|c)*$", "\\\\", '"', "^é?a", "(^a+$)", "a|^b"]


@given(
    st.text(STRING_ALPHABET, max_size=6),
    st.sampled_from(PATTERNS),
    st.none() | st.integers(0, 4),
    st.integers(0, 2),
)
def test_string_lexemes_read_the_json_spelling_of_the_decoded_string(
    text, pattern, longest, shortest
):
    assume(not text.endswith("\n"))  # Python's '$' also matches before a final newline
    schema = {"type": "string", "pattern": pattern, "minLength": shortest}
    if longest is not None:
        schema["maxLength"] = longest
    expected = (
        re.search(pattern, text) is not None
        and len(text) >= shortest
        and (longest is None or len(text) <= longest)
    )
    assert valid(schema, text) == expected  # the oracle agrees with our reading of it
    try:
        grammar = json_schema_grammar(schema)
    except SchemaError as exc:  # no string satisfies the schema
        assert "no JSON value" in str(exc) and not expected
        return
    assert accepts(grammar, json.dumps(text, ensure_ascii=False)) == expected


def test_string_escapes():
    grammar = json_schema_grammar({"type": "string", "pattern": "^a\nb$"})
    assert accepts(grammar, '"a\\nb"') and accepts(grammar, '"a\\u000Ab"')
    assert not accepts(grammar, '"a\nb"')  # a raw control character is not JSON
    any_string = json_schema_grammar({"type": "string"})
    assert accepts(any_string, '"\\"\\\\"') and accepts(any_string, '"\\u001f"')
    assert not accepts(any_string, '"\\/"')  # LOOSENINGS: "string escapes"
    assert not accepts(any_string, '"\\u0041"')
    assert "string escapes" in LOOSENINGS


@pytest.mark.parametrize(
    ("fmt", "good", "bad"),
    [
        ("date", "2024-02-29", "2024-02-30"),
        ("time", "23:59:60.5+01:00", "24:00:00Z"),
        ("date-time", "2022-01-01T12:00:00Z", "2022-01-01 12:00:00"),
        ("uuid", "123e4567-e89b-12d3-a456-426614174000", "123e4567-e89b-12d3-a456"),
        ("ipv4", "192.168.0.255", "256.1.1.1"),
        ("ipv6", "fe80::1", "fe80:::1"),
        ("email", "a.b@example.com", "a@@b"),
        ("hostname", "example.com", "-bad.com"),
        ("uri", "https://example.com/a?b#c", "no scheme"),
        ("duration", "P1DT2H", "1D"),
    ],
)
def test_formats(fmt, good, bad):
    grammar = json_schema_grammar({"type": "string", "format": fmt})
    assert accepts(grammar, json.dumps(good)) and not accepts(grammar, json.dumps(bad))


def test_unknown_formats_are_annotations():
    grammar = json_schema_grammar({"type": "string", "format": "x-unknown"})
    assert accepts(grammar, '"anything"')


def test_large_counts_are_not_enforced():
    grammar = json_schema_grammar({"type": "string", "maxLength": MAX_COUNTED + 1})
    assert accepts(grammar, json.dumps("a" * (MAX_COUNTED + 5)))
    assert "large counts" in LOOSENINGS


# --- objects, arrays, combinators -----------------------------------------------------------


def test_properties_in_schema_order_optional_ones_skippable_then_additional():
    schema = {
        "type": "object",
        "properties": {"b": {"type": "integer"}, "a": {"type": "string"}},
        "required": ["a"],
        "patternProperties": {"^x": {"type": "boolean"}},
        "additionalProperties": {"type": "null"},
    }
    grammar = json_schema_grammar(schema)
    for text, ok in [
        ('{"a": "s"}', True),
        ('{"b": 1, "a": "s"}', True),
        ('{"a": "s", "b": 1}', False),  # LOOSENINGS: "property order"
        ('{"a": "s", "xy": true, "z": null}', True),
        ('{"a": "s", "xy": null}', False),
        ('{"a": "s", "z": 1}', False),
        ('{"a": "s", "b": null}', False),  # a listed name is never an additional property
        ("{}", False),
    ]:
        assert accepts(grammar, text) == ok, text


def test_additional_properties_false_by_option():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    assert accepts(json_schema_grammar(schema), '{"a": 1, "b": 2}')
    closed = json_schema_grammar(schema, additional_properties=False)
    assert not accepts(closed, '{"a": 1, "b": 2}') and accepts(closed, '{"a": 1}')


def test_arrays_prefix_items_and_counts():
    schema = {
        "prefixItems": [{"type": "string"}],
        "items": {"type": "integer"},
        "minItems": 2,
        "maxItems": 3,
    }
    grammar = json_schema_grammar(schema)
    for text, ok in [
        ('["a", 1]', True),
        ('["a", 1, 2]', True),
        ('["a"]', False),
        ('["a", 1, 2, 3]', False),
        ("[1, 2]", False),
    ]:
        assert accepts(grammar, text) == ok, text
    draft4 = {
        "$schema": "http://json-schema.org/draft-04/schema#",
        "items": [{"type": "string"}],
        "additionalItems": False,
    }
    grammar = json_schema_grammar(draft4)
    assert accepts(grammar, '["a"]') and accepts(grammar, "[]") and not accepts(grammar, '["a", 1]')


def test_refs_recursion_anchors_and_ids():
    schema = {
        "$id": "https://example.com/tree.json",
        "$defs": {
            "node": {
                "type": "object",
                "properties": {
                    "v": {"type": "integer"},
                    "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}},
                },
                "required": ["v"],
                "additionalProperties": False,
            },
            "leaf": {"$anchor": "leaf", "type": "null"},
        },
        "anyOf": [{"$ref": "https://example.com/tree.json#/$defs/node"}, {"$ref": "#leaf"}],
    }
    grammar = json_schema_grammar(schema)
    assert accepts(
        grammar, '{"v": 1, "kids": [{"v": 2}, {"v": 3, "kids": [{"v": 4, "kids": []}]}]}'
    )
    assert accepts(grammar, "null")
    assert not accepts(grammar, '{"v": 1, "kids": [{"kids": []}]}')


def test_ref_siblings_follow_the_draft():
    defs = {"s": {"type": "string"}}
    new = {"$defs": defs, "$ref": "#/$defs/s", "maxLength": 2}
    old = {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "definitions": defs,
        "$ref": "#/definitions/s",
        "maxLength": 2,
    }
    assert not accepts(json_schema_grammar(new), '"abc"')
    assert accepts(json_schema_grammar(old), '"abc"')


def test_all_of_merges_and_one_of_is_any_of():
    schema = {"allOf": [{"type": "integer", "minimum": 0}, {"maximum": 5}, {"multipleOf": 2}]}
    grammar = json_schema_grammar(schema)
    assert [n for n in range(-3, 9) if accepts(grammar, str(n))] == [0, 2, 4]
    one_of = json_schema_grammar({"oneOf": [{"type": "integer"}, {"minimum": 0}]})
    assert accepts(one_of, "3")  # valid under both options: LOOSENINGS "oneOf"
    assert not valid({"oneOf": [{"type": "integer"}, {"minimum": 0}]}, 3)


def test_enum_const_and_boolean_schemas():
    grammar = json_schema_grammar(
        {"enum": ["a", 1, None, [1, {"k": True}], "a\n"], "type": ["string", "array"]}
    )
    for text, ok in [
        ('"a"', True),
        ("1", False),
        ("null", False),
        ('[1, {"k": true}]', True),
        ('"a\\n"', True),
    ]:
        assert accepts(grammar, text) == ok, text
    assert accepts(json_schema_grammar({"enum": ["x", "yy"], "minLength": 2}), '"yy"')
    assert not accepts(json_schema_grammar({"enum": ["x", "yy"], "minLength": 2}), '"x"')
    with pytest.raises(SchemaError, match="no JSON value"):
        json_schema_grammar({"const": "x", "minLength": 2})
    assert accepts(json_schema_grammar(True), '{"any": [1, "thing", null]}')
    with pytest.raises(SchemaError, match="no JSON value"):
        json_schema_grammar(False)
    nullable = json_schema_grammar({"type": "string", "nullable": True})
    assert accepts(nullable, "null")  # LOOSENINGS: "nullable"


def test_whitespace_policies():
    schema = {"type": "array", "items": {"type": "object"}}
    text = '[{"a": 1}, {}]'
    assert accepts(json_schema_grammar(schema), text)
    assert accepts(json_schema_grammar(schema), '[ {\n"a" :1 } ,{ } ]')
    assert not accepts(json_schema_grammar(schema), " []")  # none around the value
    assert not accepts(json_schema_grammar(schema, any_whitespace=False), text)
    assert accepts(json_schema_grammar(schema, any_whitespace=False), '[{"a":1},{}]')
    bounded = json_schema_grammar(schema, whitespace="[ ]?")
    assert accepts(bounded, text) and not accepts(bounded, '[{"a":  1}]')
    with pytest.raises(ValueError, match="whitespace"):
        json_schema_grammar(schema, whitespace="(")


# --- errors and limits ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("schema", "message"),
    [
        ({"not": {"type": "string"}}, 'not {"type": "string"} at #: is not supported'),
        (
            {"properties": {"a": {"uniqueItems": True}}},
            "uniqueItems true at #/properties/a: is not supported",
        ),
        ({"type": "strng"}, 'type "strng" at #: must be among'),
        ({"$ref": "other.json#/x"}, '$ref "other.json#/x" at #: remote references'),
        ({"$ref": "#/$defs/missing"}, '$ref "#/$defs/missing" at #: the reference names nothing'),
        ({"items": {"pattern": "(?=a)"}}, 'pattern "(?=a)" at #/items: unsupported regex'),
        ({"minLength": -1}, "minLength -1 at #: must be a non-negative integer"),
        ({"allOf": []}, "allOf [] at #: must be a non-empty array"),
        ({"anyOf": [{"minimum": "0"}]}, 'minimum "0" at #/anyOf/0: must be a number'),
        ({"multipleOf": 0}, "multipleOf 0 at #: must be greater than 0"),
        ({"type": "object", "minProperties": 2}, "minProperties 2 at #: is only supported"),
        (
            {"if": {"type": "string"}, "then": {"minLength": 1}},
            'if {"type": "string"} at #: is not supported',
        ),
        (
            {"type": "object", "patternProperties": {"^(?!a)": {}}},
            'patternProperties "^(?!a)" at #: unsupported regex',
        ),
        ([], "a schema must be an object or a boolean"),
    ],
)
def test_bad_schemas_name_the_keyword_its_value_and_pointer(schema, message):
    with pytest.raises(SchemaError) as info:
        json_schema_grammar(schema)
    assert message in str(info.value)


def test_limits_give_errors_not_hangs():
    start = time.monotonic()
    with pytest.raises(SchemaError, match="MAX_ENUM"):
        json_schema_grammar({"enum": list(range(MAX_ENUM + 1))})
    with pytest.raises(SchemaError, match="too large to compile"):
        json_schema_grammar({"enum": [f"value number {i}" for i in range(MAX_ENUM)]})
    deep: dict = {"type": "integer"}
    for _ in range(MAX_DEPTH + 5):
        deep = {"type": "array", "items": deep}
    with pytest.raises(SchemaError, match="MAX_DEPTH"):
        json_schema_grammar(deep)
    with pytest.raises(SchemaError, match="too large"):
        json_schema_grammar({"type": "integer", "multipleOf": 123456789})
    with pytest.raises(SchemaError, match="no finite JSON value"):
        json_schema_grammar(
            {
                "$defs": {"a": {"type": "array", "items": {"$ref": "#/$defs/a"}, "minItems": 1}},
                "$ref": "#/$defs/a",
            }
        )
    assert time.monotonic() - start < 30


# --- the property: generated schemas, the jsonschema oracle ----------------------------------

NAMES = ["a", "b", "c"]  # property names; instance keys are sorted into this order
KEY_PATTERN = "^[xy]"  # additional names sort after NAMES

leaf_schemas = st.one_of(
    st.fixed_dictionaries(
        {"type": st.just("string")},
        optional={
            "minLength": st.integers(1, 2),
            "maxLength": st.integers(0, 2),
            "pattern": st.sampled_from(["^a", "b$", "^[a-c]*$", "ab", "^(ab|c)*$"]),
        },
    ),
    st.fixed_dictionaries(
        {"type": st.just("integer")},
        optional={
            "minimum": st.integers(-3, 3),
            "exclusiveMaximum": st.integers(-3, 4),
            "multipleOf": st.integers(2, 4),
        },
    ),
    st.fixed_dictionaries(
        {"type": st.just("number")},
        optional={
            "exclusiveMinimum": st.sampled_from([-1.5, 0, 0.25]),
            "maximum": st.sampled_from([0.5, 3, 10.75]),
        },
    ),
    st.sampled_from([{"type": "boolean"}, {"type": "null"}, {"type": ["null", "integer"]}, {}]),
    st.lists(st.sampled_from(["a", 1, 2.5, None, True, [1], {"a": 1}]), min_size=1, max_size=3).map(
        lambda values: {"enum": values}
    ),
    st.sampled_from(["a", 1, None]).map(lambda value: {"const": value}),
)


def _extend(children):
    objects = st.builds(
        lambda props, required, patterns: {
            "type": "object",
            "properties": props,
            **({"required": sorted(k for k in props if k in required)} if required else {}),
            "additionalProperties": False,
            **({"patternProperties": {KEY_PATTERN: patterns}} if patterns is not None else {}),
        },
        st.dictionaries(st.sampled_from(NAMES), children, min_size=1, max_size=3).map(
            lambda d: dict(sorted(d.items()))
        ),
        st.sets(st.sampled_from(NAMES), min_size=1),
        st.none() | children,
    )
    arrays = st.fixed_dictionaries(
        {"items": children},
        optional={
            "prefixItems": st.lists(children, min_size=1, max_size=2),
            "minItems": st.integers(0, 2),
            "maxItems": st.integers(0, 3),
        },
    )
    any_of = st.lists(children, min_size=2, max_size=3).map(lambda options: {"anyOf": options})
    all_of = st.tuples(children, leaf_schemas).map(lambda pair: {"allOf": list(pair)})
    open_objects = children.map(lambda c: {"type": "object", "additionalProperties": c})
    return st.one_of(objects, arrays, any_of, all_of, open_objects)


schemas = st.recursive(leaf_schemas, _extend, max_leaves=6)


def _canonical(instance):
    """``instance`` with every object's keys in the order the grammar reads them."""
    if isinstance(instance, dict):
        order = sorted(
            instance, key=lambda k: (k not in NAMES, NAMES.index(k) if k in NAMES else 0)
        )
        return {k: _canonical(instance[k]) for k in order}
    if isinstance(instance, list):
        return [_canonical(x) for x in instance]
    return instance


def _inside_the_exact_part(instance) -> bool:
    """No float that JSON Schema calls an integer or that json.dumps writes with an
    exponent (`LOOSENINGS`: "number spelling"), no string ending in a newline (Python's
    '$' ignores it) or with a lone surrogate."""
    if isinstance(instance, float):
        return not instance.is_integer() and "e" not in repr(instance)
    if isinstance(instance, str):
        return not instance.endswith("\n") and not any(0xD800 <= ord(c) <= 0xDFFF for c in instance)
    if isinstance(instance, list):
        return all(_inside_the_exact_part(x) for x in instance)
    if isinstance(instance, dict):
        return all(
            _inside_the_exact_part(k) and _inside_the_exact_part(v) for k, v in instance.items()
        )
    return True


def _compile(schema) -> Grammar:
    try:
        return json_schema_grammar(schema)
    except SchemaError as exc:  # only for schemas no instance satisfies
        assume("no JSON value" not in str(exc) and "no finite" not in str(exc))
        raise


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-25, 25)
    | st.sampled_from([0.5, -1.25, 2.5])
    | st.text('abcx"é', max_size=3),
    lambda children: (
        st.lists(children, max_size=3)
        | st.dictionaries(st.sampled_from(NAMES + ["x", "y", "z"]), children, max_size=3)
    ),
    max_leaves=6,
)

SLOW = settings(  # more examples than the profile's: each is cheap and the space is large
    max_examples=200,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    deadline=None,
)


@SLOW
@given(schemas, json_values)
def test_accepted_exactly_when_valid(schema, instance):
    grammar = _compile(schema)
    instance = _canonical(instance)
    assert accepts(grammar, json.dumps(instance, ensure_ascii=False)) == valid(schema, instance)


WALK_BYTES = list(b'{}[],:" ab\\xyn0123456789-.e') + [0xC3, 0xA9]


def random_sentence(grammar: Grammar, rng: random.Random, max_len: int = 80) -> bytes | None:
    """A random sentence: a walk that pushes random allowed bytes, stopping at random where
    the parser accepts (None if it gets no sentence within ``max_len`` bytes)."""
    parser = EarleyParser(grammar)
    out = bytearray()
    while len(out) < max_len:
        if parser.is_accepting() and rng.random() < 0.3:
            return bytes(out)
        allowed = []
        for byte in WALK_BYTES:
            if parser.push(byte):
                parser.pop()
                allowed.append(byte)
        if not allowed:
            break
        closing = [b for b in allowed if b in b'"]}0123456789']
        byte = rng.choice(closing if closing and len(out) > max_len // 2 else allowed)
        parser.push(byte)
        out.append(byte)
    return bytes(out) if parser.is_accepting() else None


@SLOW
@given(schemas, st.randoms(use_true_random=False))
def test_every_sentence_is_a_valid_instance(schema, rng):
    grammar = _compile(schema)
    sentence = random_sentence(grammar, rng)
    assume(sentence is not None)
    instance = json.loads(sentence)
    assert valid(schema, instance), sentence


# --- MaskBench ------------------------------------------------------------------------------


def _maskbench_slice() -> list[Path]:
    files = sorted(MASKBENCH.glob("*.json")) if MASKBENCH.is_dir() else []
    return files[:100] + files[100::80]  # the BFCL head, then every 80th file (all sources)


@pytest.mark.skipif(not MASKBENCH.is_dir(), reason=f"MaskBench data not at {MASKBENCH}")
def test_maskbench_slice():
    """Compile a slice of MaskBench and walk its instances (the benchmark's serialisation)."""
    compiled = refused = instances = agreeing = 0
    disagreements = []
    for path in _maskbench_slice():
        data = json.loads(path.read_text())
        try:
            grammar = json_schema_grammar(data["schema"])
        except SchemaError:
            refused += 1
            continue
        compiled += 1
        for test in data["tests"]:
            text = json.dumps(test["data"], indent=None, ensure_ascii=False)
            instances += 1
            if accepts(grammar, text) == test["valid"]:
                agreeing += 1
            else:
                disagreements.append((path.name, test["valid"]))
    print(
        f"\nMaskBench slice: {compiled} of {compiled + refused} schemas compiled, "
        f"{agreeing} of {instances} instances agree with their label; "
        f"disagreements: {disagreements}"
    )
    assert compiled >= 0.85 * (compiled + refused)
    assert agreeing >= 0.97 * instances
    # an invalid instance accepted is a bug unless a registered superset explains it
    # (elsewhere in MaskBench "oneOf" and "formats" do; in this slice none is needed)
    assert all(expected for _, expected in disagreements), disagreements


LEAVES = [None, True, 0, 3, -1, 2.5, "a", "ab", "abc", "x", [], {}]


def _mutate(value, rng: random.Random):
    """``value`` with one random change deep inside: a key or item removed or added, or a
    node replaced by a small value."""
    if isinstance(value, dict | list) and value and rng.random() < 0.7:
        place = rng.choice(list(value) if isinstance(value, dict) else range(len(value)))
        roll = rng.random()
        if roll < 0.25:
            del value[place]
        elif roll < 0.45 and isinstance(value, dict):
            value[rng.choice([*NAMES, "x", "y"])] = rng.choice(LEAVES)
        elif roll < 0.45:
            value.insert(rng.randrange(len(value) + 1), rng.choice(LEAVES))
        else:
            value[place] = _mutate(value[place], rng)
        return value
    return rng.choice(LEAVES)


@SLOW
@given(schemas, st.randoms(use_true_random=False))
def test_near_valid_instances_are_accepted_exactly_when_valid(schema, rng):
    """Random sentences with one random change: the instances that tell apart a grammar
    slightly too loose or too strict."""
    grammar = _compile(schema)
    sentence = random_sentence(grammar, rng)
    assume(sentence is not None)
    instance = _canonical(_mutate(json.loads(sentence), rng))
    assume(_inside_the_exact_part(instance))
    assert accepts(grammar, json.dumps(instance, ensure_ascii=False)) == valid(schema, instance)
