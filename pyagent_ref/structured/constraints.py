"""A request's constraint (`SamplingParams.structured_outputs`) as a `Grammar`.

One function, `constraint_grammar`, dispatches on the kind of constraint to the stage
that compiles it; everything downstream (the Earley parser, the matcher, the engine)
sees only grammars.
"""

from __future__ import annotations

import json

from .grammar import Grammar, Terminal, choice_grammar

__all__ = ["GENERATION_WHITESPACE", "constraint_grammar"]

GENERATION_WHITESPACE = r"\n?[ \t]{0,16}"
"""The JSON whitespace allowed at each place when a request names none: at most one line
break, then an indentation of at most 16 spaces or tabs. Compact and pretty-printed JSON
pass; an unbounded run (JSON's own ``[ \t\n\r]*``) lets a model pad forever."""


def constraint_grammar(params) -> Grammar:
    """The grammar of a `StructuredOutputsParams`.

    regex: one lexeme; choice: `choice_grammar`; grammar: GBNF / Lark text
    (`ebnf.compile_grammar`); json: the JSON Schema (a dict or its JSON text) by
    `json_schema.json_schema_grammar`, with `GENERATION_WHITESPACE` unless the request
    says otherwise; json_object: the schema ``{"type": "object"}``.

    Raises:
        ValueError (`RegexError`, `GrammarError`, `SchemaError`): a malformed or
            unsupported constraint, naming the problem.
    """
    kind = params.kind
    if kind == "regex":
        return Grammar({"root": ((Terminal.regex(params.regex),),)}, "root")
    if kind == "choice":
        return choice_grammar(params.choice)
    if kind == "grammar":
        from .ebnf import compile_grammar

        return compile_grammar(params.grammar)
    from .json_schema import json_schema_grammar

    schema = {"type": "object"} if kind == "json_object" else params.json
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as exc:
            raise ValueError(f"structured_outputs.json is not valid JSON: {exc}") from None
    whitespace = params.whitespace_pattern
    if whitespace is None and not params.disable_any_whitespace:
        whitespace = GENERATION_WHITESPACE
    return json_schema_grammar(
        schema,
        whitespace=whitespace,
        any_whitespace=not params.disable_any_whitespace,
        additional_properties=not params.disable_additional_properties,
    )
