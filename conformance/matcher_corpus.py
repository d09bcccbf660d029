"""The constraints and vocabularies on which token matchers are checked, all offline.

Used by the `matcher` spec (`conformance/specs/matcher.py`), the llguidance and xgrammar
adapters and `benchmarks/bench_structured.py`.

Constraints (`Constraint`: a source and instances labelled valid or not), by kind:

* ``json_schema``: MaskBench test files (`load_maskbench`): a slice of thirteen ships in
  ``conformance/data/maskbench`` (its README says which and under what licence); the
  whole benchmark is a directory of such files. Instances are serialised as MaskBench
  does: ``json.dumps(data, ensure_ascii=False)``, whose ``", "`` and ``": "`` separators
  need the grammar's whitespace;
* ``regex`` and ``grammar`` (GBNF): small hand-written sets, `REGEX_CONSTRAINTS` and
  `GRAMMAR_CONSTRAINTS`.

Vocabularies are those of `bpe_corpus` that ship a ``tokenizer.json`` (``embedded``,
``llama3``). Their data (the bytes of each token, the id that ends an output, the ids of
an instance's text) is read through the reference (`token_bytes`, `encode`), which the
tokenize spec and tests/structured/test_vocab.py check against the tokenizers library.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import bpe_corpus

MATCHER_VOCABULARIES = ("embedded", "llama3")
"""The vocabularies a matcher is built for: those published as a tokenizer.json."""

EOS_TOKEN = {"embedded": "<|eos|>", "llama3": "<|end_of_text|>"}
"""The special token that ends an output, per vocabulary: the one token allowed exactly
where the constraint's output may end."""

MASKBENCH_SLICE = Path(__file__).parent / "data" / "maskbench"


@dataclass(frozen=True)
class Instance:
    """A text and whether the constraint admits it as a whole output."""

    text: str
    valid: bool


@dataclass(frozen=True)
class Constraint:
    """A constraint of one kind (a JSON Schema as parsed JSON, a regex, a GBNF text) and
    texts labelled with whether they satisfy it."""

    name: str
    source: Any
    instances: tuple[Instance, ...]

    def __repr__(self) -> str:
        return self.name


# ---------------------------------------------------------------------------- vocabularies


def _check_vocabulary(vocabulary: str) -> None:
    if vocabulary not in MATCHER_VOCABULARIES:
        raise ValueError(f"vocabulary must be one of {MATCHER_VOCABULARIES}, got {vocabulary!r}")


@functools.cache
def _reference_encoding(vocabulary: str) -> Any:
    from pyagent_ref.tokenize.bpe import BytePairEncoding

    _check_vocabulary(vocabulary)
    return BytePairEncoding.from_tokenizer_json(bpe_corpus.tokenizer_json(vocabulary))


@functools.cache
def token_bytes(vocabulary: str) -> tuple[bytes | None, ...]:
    """The bytes of every token id of `vocabulary` (None for special tokens)."""
    from pyagent_ref.structured.vocab import token_bytes as read_token_bytes
    from pyagent_ref.tokenize.bpe import BPETokenizer

    return tuple(read_token_bytes(BPETokenizer(_reference_encoding(vocabulary))))


def vocab_size(vocabulary: str) -> int:
    """The number of token ids of `vocabulary` (special tokens included)."""
    return len(token_bytes(vocabulary))


@functools.cache
def eos_token_id(vocabulary: str) -> int:
    """The id of `EOS_TOKEN[vocabulary]`."""
    return _reference_encoding(vocabulary).added_tokens[EOS_TOKEN[vocabulary]].id


def encode(vocabulary: str, text: str) -> list[int]:
    """The ids of `text` (special-token look-alikes are ordinary text)."""
    none: frozenset[str] = frozenset()
    return _reference_encoding(vocabulary).encode(
        text, allowed_special=none, disallowed_special=none
    )


# ----------------------------------------------------------------------------- constraints


def maskbench_text(data: Any) -> str:
    """An instance as MaskBench serialises it: ``json.dumps`` with ``", "`` / ``": "``."""
    return json.dumps(data, indent=None, ensure_ascii=False)


def maskbench_constraint(path: Path) -> Constraint:
    """One MaskBench file as a ``json_schema`` constraint."""
    data = json.loads(path.read_text(encoding="utf-8"))
    instances = tuple(
        Instance(maskbench_text(test["data"]), bool(test["valid"])) for test in data["tests"]
    )
    return Constraint(path.stem, data["schema"], instances)


def maskbench_files(directory: Path = MASKBENCH_SLICE, limit: int | None = None) -> list[Path]:
    """The ``*.json`` files of a MaskBench directory, sorted by name; with `limit`, that
    many spread evenly over them (the files are named by source, so every source is
    sampled, not only the first by name).

    Raises:
        ValueError: `directory` is not a directory, or holds no ``*.json`` file.
    """
    if not directory.is_dir():
        raise ValueError(f"directory {str(directory)!r} is not a directory")
    files = sorted(directory.glob("*.json"))
    if not files:
        raise ValueError(f"directory {str(directory)!r} holds no MaskBench *.json file")
    if limit is None or limit >= len(files):
        return files
    return [files[i * len(files) // limit] for i in range(limit)]


def load_maskbench(
    directory: Path = MASKBENCH_SLICE, limit: int | None = None
) -> Iterator[Constraint]:
    """The ``json_schema`` constraints of `maskbench_files(directory, limit)`, one by one."""
    for path in maskbench_files(directory, limit):
        yield maskbench_constraint(path)


def _labelled(
    name: str, source: str, valid: tuple[str, ...], invalid: tuple[str, ...]
) -> Constraint:
    instances = tuple(Instance(t, True) for t in valid) + tuple(Instance(t, False) for t in invalid)
    return Constraint(name, source, instances)


REGEX_CONSTRAINTS = (
    _labelled(
        "digits-dash-letters",
        r"[0-9]{3}-[a-z]+",
        ("123-abc", "007-x"),
        ("123-", "12-abc", "123-abC", "1234-abc"),
    ),
    _labelled("alternation-star", r"(ab|cd)*e", ("e", "abcdabe", "cdcde"), ("ab", "abce", "ee")),
    _labelled(
        "quoted-string",
        r'"([^"\\]|\\.)*"',
        ('"plain"', r'"a \"quoted\" word"', '""'),
        ('"open', '"a"b"', "'single'"),
    ),
    _labelled(
        "unicode-email",
        r"[a-zé]{1,6}@[a-z]+\.(com|org)",
        ("élan@site.org", "a@b.com"),
        ("toolong@x.com", "name@site.net", "@site.com"),
    ),
)
"""Regexes (the whole output matches), with valid and invalid outputs."""

ARITHMETIC = """\
root ::= expr
expr ::= term (("+" | "-") term)*
term ::= factor (("*" | "/") factor)*
factor ::= [0-9]+ | "(" expr ")"
"""

STRING_LIST = """\
root ::= "[" ( item ( ", " item )* )? "]"
item ::= "\\"" [a-z]* "\\""
"""

KEY_VALUES = """\
root ::= pair ("\\n" pair)*
pair ::= key "=" value
key ::= [a-z_]+
value ::= "true" | "false" | [0-9]+
"""

GRAMMAR_CONSTRAINTS = (
    _labelled(
        "arithmetic",
        ARITHMETIC,
        ("1+2*(3-4)", "12/3", "(((7)))"),
        ("1+", "(1", "1++2", "()"),
    ),
    _labelled("string-list", STRING_LIST, ('["a", "bc"]', "[]", '[""]'), ('["a",]', '["A"]', "[")),
    _labelled(
        "key-values",
        KEY_VALUES,
        ("debug=true", "max_depth=12\nverbose=false"),
        ("debug=yes", "=1", "a=1\n"),
    ),
)
"""GBNF grammars (start rule ``root``), with valid and invalid outputs."""
