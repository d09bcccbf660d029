"""JSON Schema → `Grammar`: the sentences are the JSON texts of the schema's valid instances.

How a schema becomes a grammar
------------------------------
A schema is a *conjunction* of keywords: an instance is valid when every keyword holds.
``allOf`` and ``$ref`` only add more schemas to the conjunction, so the compiler first
*flattens* a schema into its parts (`_Compiler.conjuncts`: the schema, the targets of its
``$ref``, its ``allOf`` members, recursively; each part known by its JSON pointer). Then:

1. ``anyOf`` / ``oneOf`` of a part is *distributed*: the conjunction becomes one grammar
   alternative per option, each the conjunction plus that option (`_Compiler.alternatives`).
2. Otherwise each JSON type the ``type`` keywords allow (all six if none) is one
   alternative, compiled from the keywords that apply to that type (``minLength`` only
   to strings...), as JSON Schema defines them (`_Compiler.typed_alternatives`):

   * ``null``, ``true|false``: literal lexemes;
   * numbers: one lexeme, the regex of the numbers in the bounds (`integer_range_regex`,
     `decimal_range_regex`), intersected with a divisibility automaton for ``multipleOf``;
   * strings: one lexeme, the intersection of the length bound, each ``pattern`` and each
     known ``format``, every one a regex tree over the *decoded* characters rewritten to
     read their JSON spelling (`json_string_tree`: ``"`` as ``\\"``, a newline as ``\\n``
     or ``\\u000a``...);
   * arrays: rules that count items (``prefixItems``, ``items``, ``minItems``...);
   * objects: rules that spell the ``properties`` in schema order, each optional one
     possibly absent, then any additional properties (``patternProperties`` and
     ``additionalProperties``), whose names are lexemes that exclude the listed names;
   * ``enum`` / ``const``: one lexeme of the allowed values' spellings.

Each conjunction is one rule, named by its parts' pointers and compiled once
(memoised), so a recursive ``$ref`` becomes a recursive rule, which the Earley parser
handles. Strings and numbers are lexemes (DFAs), never rules over characters.

A worked example (compact whitespace, ``whitespace=""``)::

    {"type": "object", "properties": {"n": {"type": "integer", "minimum": 1}},
     "required": ["n"], "additionalProperties": false}

gives the rules (terminals in quotes, as regexes)::

    #               := #:object
    #:object        := '{' #:object:from 0 '}'
    #:object:from 0 := '"n":' #/properties/n #:object:then 1
    #:object:then 1 := (nothing: no additional properties)
    #/properties/n  := '[1-9]\\d*'

whose sentences are ``{"n":1}``, ``{"n":2}``... (tests/structured/test_json_schema.py
runs this example).

Whitespace
----------
``whitespace`` is a regex (vLLM's ``whitespace_pattern``) matched once at each place JSON
allows whitespace: after ``{`` ``[`` ``,`` ``:`` and before ``}`` ``]`` ``,`` ``:``, never
before or after the whole value. The default is JSON's own whitespace, unbounded
(``[ \\t\\n\\r]*``), which is LLGuidance's default. We chose it because MaskBench, whose
masks we compare with LLGuidance's, serialises its instances with Python's
``json.dumps(data, indent=None, ensure_ascii=False)``: ``", "`` and ``": "`` separators,
which a compact grammar would refuse. ``any_whitespace=False`` (vLLM's
``disable_any_whitespace``) is compact JSON: no whitespace at all.

What is exact, loosened or refused
----------------------------------
Exact, unless listed below: ``type`` (and lists of types), ``enum``, ``const``,
``properties``, ``required``, ``additionalProperties``, ``patternProperties``,
``items``, ``prefixItems``, ``additionalItems``, ``minItems``, ``maxItems``,
``minLength``, ``maxLength``, ``pattern``, ``minimum``, ``maximum``,
``exclusiveMinimum``, ``exclusiveMaximum`` (numbers and draft 4's booleans),
``multipleOf``, ``anyOf``, ``allOf``, ``$ref`` (local, ``$id`` and anchors), ``$defs`` /
``definitions``, ``true`` / ``false`` schemas. Annotations (``title``, ``default``...) and
keywords JSON Schema does not define are ignored, as the specification says. The
departures from JSON Schema are registered, with their reasons, in `LOOSENINGS`
(a *superset* accepts some invalid texts; a *subset* refuses some valid ones). Keywords in
`UNSUPPORTED` raise `SchemaError`, which names the keyword, its value and its JSON pointer.
"""

from __future__ import annotations

import json
import math
import urllib.parse
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from decimal import Decimal

from .dfa import DFA, automata
from .earley import EarleyParser
from .grammar import Grammar, GrammarError, Symbol, Terminal
from .nfa import NFA
from .regex import (
    MAX_CODE_POINT,
    Alt,
    Chars,
    Concat,
    Node,
    RegexError,
    Repeat,
    complement,
    map_chars,
    normalize_ranges,
    parse_regex,
)

__all__ = [
    "JSON_WHITESPACE",
    "LOOSENINGS",
    "UNSUPPORTED",
    "SchemaError",
    "decimal_range_regex",
    "integer_range_regex",
    "json_schema_grammar",
    "json_string_tree",
    "natural_range_regex",
]

JSON_WHITESPACE = r"[ \t\n\r]*"
"""JSON's whitespace (RFC 8259), any amount: the default ``whitespace``."""

MAX_COUNTED = 1000
"""The largest ``maxLength``/``minLength``/``maxItems``/``minItems`` enforced (see `LOOSENINGS`)."""

MAX_RULES = 20_000
"""The most conjunctions (grammar rules) one schema may need."""

MAX_DEPTH = 100
"""The deepest nesting of subschemas (and of ``anyOf`` choices) compiled."""

MAX_MULTIPLE_STATES = 10_000
"""The most states of the divisibility automaton of ``multipleOf``."""

MAX_ENUM = 10_000
"""The most values an ``enum`` may list."""

MAX_PATTERN_REGIONS = 64
"""The most key regions that overlapping ``patternProperties`` may cut the names into."""

LOOSENINGS: dict[str, str] = {
    "oneOf": "superset: oneOf is compiled as anyOf (an instance valid under two options is "
    "accepted, JSON Schema refuses it); exclusion would need schema complements",
    "property order": "subset: properties appear in the order of 'properties' (then the "
    "required names 'properties' lacks), each optional one possibly absent, then the "
    "additional ones; the order LLGuidance and XGrammar impose",
    "duplicate keys": "subset: an additional property may not repeat a name of "
    "'properties'; additional names may repeat each other (superset, as LLGuidance)",
    "number spelling": "subset: an integer is written without fraction or exponent (1.0 "
    "is an integer to JSON Schema); a number with bounds or multipleOf is written without "
    "an exponent; enum/const numbers are spelled as json.dumps spells them",
    "string escapes": "subset: a character is written raw unless JSON requires an escape "
    "('\"', '\\\\', U+0000-U+001F: the short escape or \\u00XX); '\\/' and \\uXXXX "
    "escapes of other characters are refused (as LLGuidance's default)",
    "large counts": f"superset: a minLength/maxLength/minItems/maxItems above {MAX_COUNTED} "
    "is not enforced (the automaton or rules would grow with the count)",
    "formats": "superset: 'date' and 'date-time' accept Feb 29 of any year, 'email', "
    "'uri', 'hostname' are simplified syntaxes (see FORMATS); unknown formats are "
    "annotations (ignored, as JSON Schema says)",
    "regex '.'": "superset: '.' in a pattern matches \\r, U+2028 and U+2029, which "
    "ECMA-262's does not (Python's meaning, see regex.py)",
    "nullable": "superset: OpenAPI's 'nullable: true' adds null to 'type' (JSON Schema "
    "validators ignore it)",
    "$ref siblings": "drafts 4-7 ignore the keywords beside $ref; 2019-09 and later (and "
    "schemas without $schema) apply them, as the drafts say",
}
"""Where the grammar departs from JSON Schema on purpose: name → direction and reason."""

UNSUPPORTED = frozenset(
    {
        "not",
        "if",
        "contains",
        "minContains",
        "maxContains",
        "propertyNames",
        "dependencies",
        "dependentRequired",
        "dependentSchemas",
        "unevaluatedProperties",
        "unevaluatedItems",
        "$dynamicRef",
        "$recursiveRef",
        "uniqueItems",
        "minProperties",
        "maxProperties",
    }
)
"""Assertion keywords that raise `SchemaError` (``uniqueItems: false``, an ``if`` without
``then``/``else``, and ``minProperties``/``maxProperties`` that the rest of the schema
already implies are accepted)."""

FORMATS: dict[str, str] = {
    "date": r"\d{4}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12]\d|3[01])"
    r"|(?:0[469]|11)-(?:0[1-9]|[12]\d|30)|02-(?:0[1-9]|1\d|2\d))",
    "time": r"(?:[01]\d|2[0-3]):[0-5]\d:(?:[0-5]\d|60)(?:\.\d+)?"
    r"(?:[zZ]|[+-](?:[01]\d|2[0-3]):[0-5]\d)",
    "uuid": r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}",
    "ipv4": r"(?:(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)\.){3}(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)",
    "hostname": r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
    r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*",
    "email": r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+(?:\.[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)*"
    r"@[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*",
    "uri": r"[A-Za-z][A-Za-z0-9+.-]*:[^\x00-\x20\"<>\\^`{|}\x7f]*",
    "duration": r"P(?:\d+W|(?:\d+Y)?(?:\d+M)?(?:\d+D)?(?:T(?:\d+H)?(?:\d+M)?(?:\d+(?:\.\d+)?S)?)?)",
}
"""The formats enforced, as regexes of the decoded string (``date-time`` and ``ipv6`` are
built from these below). A format not listed is an annotation and is ignored."""

_H16 = r"[0-9a-fA-F]{1,4}"
_IPV6_TAILS = [  # n groups before '::' and m after, n + m <= 7; or 8 groups and no '::'
    rf"(?:{_H16}:){{7}}{_H16}",
    *(
        rf"(?:(?:{_H16}:){{0,{n - 1}}}{_H16})?::(?:(?:{_H16}:){{0,{6 - n}}}{_H16})?"
        if n
        else rf"::(?:(?:{_H16}:){{0,6}}{_H16})?"
        for n in range(8)
    ),
]
FORMATS["ipv6"] = "(?:" + "|".join(_IPV6_TAILS) + ")"
FORMATS["date-time"] = FORMATS["date"] + "[tT]" + FORMATS["time"]

_ANNOTATIONS = frozenset(
    {
        "$schema",
        "$id",
        "id",
        "$anchor",
        "$dynamicAnchor",
        "$recursiveAnchor",
        "$vocabulary",
        "$comment",
        "$defs",
        "definitions",
        "title",
        "description",
        "default",
        "examples",
        "readOnly",
        "writeOnly",
        "deprecated",
        "contentMediaType",
        "contentEncoding",
        "contentSchema",
        "then",
        "else",
    }
)
_VALUE_KEYWORDS = frozenset(
    {
        "minLength",
        "maxLength",
        "pattern",
        "format",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "multipleOf",
        "properties",
        "patternProperties",
        "additionalProperties",
        "required",
        "items",
        "prefixItems",
        "additionalItems",
        "minItems",
        "maxItems",
    }
)
"""The keywords (besides ``type``) that an ``enum``'s values are checked against."""
_TYPES = ("null", "boolean", "object", "array", "string", "number", "integer")
_OLD_DRAFTS = ("draft-03", "draft-04", "draft-06", "draft-07")


class SchemaError(GrammarError):
    """A schema that is malformed, unsupported or too large: names the keyword, its value
    and the JSON pointer of the schema that holds it."""

    def __init__(self, problem: str, keyword: str | None = None, value=None, pointer: str = "#"):
        self.problem, self.keyword, self.pointer = problem, keyword, pointer
        shown = json.dumps(value, default=repr)
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        where = f"{keyword} {shown} at {pointer}" if keyword else f"schema at {pointer}"
        super().__init__(f"{where}: {problem}")


def json_schema_grammar(
    schema,
    *,
    whitespace: str | None = None,
    any_whitespace: bool = True,
    additional_properties: bool = True,
) -> Grammar:
    """The grammar of the JSON texts valid under ``schema`` (module docstring: how, and
    where it is loosened).

    Args:
        schema: a JSON Schema, as parsed JSON (a dict, or True / False).
        whitespace: a regex (our dialect) for the whitespace allowed, matched once at each
            place JSON allows whitespace; None: ``any_whitespace`` decides.
        any_whitespace: True: JSON's whitespace (`JSON_WHITESPACE`); False: none.
        additional_properties: False: a schema with ``properties`` or
            ``patternProperties`` but no ``additionalProperties`` allows no other
            properties (vLLM's ``disable_additional_properties``).
    Returns:
        A `Grammar`; its rules are named by the JSON pointers of the schemas they
        compile (``#`` for the whole schema).
    Raises:
        SchemaError: a malformed or unsupported schema, a schema no instance satisfies, or
            one over a limit (`MAX_RULES`, `MAX_DEPTH`, the automata's state limits);
            the message names the keyword, its value and its JSON pointer.
        ValueError: a bad ``whitespace`` regex (naming it).
    """
    if whitespace is None:
        whitespace = JSON_WHITESPACE if any_whitespace else ""
    try:
        space = parse_regex(whitespace)
    except RegexError as exc:
        raise ValueError(f"whitespace {whitespace!r} is not a valid regex: {exc}") from None
    compiler = _Compiler(schema, space, additional_properties)
    start = compiler.value(compiler.conjunction([(schema, "#")]))
    if start is None:
        raise SchemaError("no JSON value satisfies the schema")
    try:
        return Grammar(compiler.rules, start)
    except SchemaError:
        raise
    except GrammarError as exc:  # a recursive rule that can derive nothing
        raise SchemaError(f"no finite JSON value satisfies it ({exc})") from None


# --- numbers ------------------------------------------------------------------------------


def natural_range_regex(lo: int, hi: int | None) -> str:
    """A regex of the decimal naturals in [lo, hi] (``hi`` None: no upper bound), written
    without leading zeros; ``0 <= lo <= hi``.

    Split by number of digits; for one length the range is a lexicographic range of digit
    strings (`_same_length_range`).
    """
    if hi is None:
        digits = len(str(lo))
        if lo == 0:
            return r"(?:0|[1-9]\d*)"
        if str(lo) == "1" + "0" * (digits - 1):
            return rf"[1-9]\d{{{digits - 1},}}" if digits > 1 else r"[1-9]\d*"
        longer = rf"[1-9]\d{{{digits},}}"
        return _alt([_same_length_range(str(lo), "9" * digits), longer])
    options = []
    for length in range(len(str(lo)), len(str(hi)) + 1):
        first = max(lo, 10 ** (length - 1) if length > 1 else 0)
        last = min(hi, 10**length - 1)
        options.append(_same_length_range(str(first), str(last)))
    return _alt(options)


def _same_length_range(a: str, b: str) -> str:
    """The digit strings of ``len(a)`` digits between ``a`` and ``b`` (a <= b) in order.

    Equal first digits: that digit, then the range of the rest. Else three pieces: a's first
    digit then at least a's rest; a digit strictly between then anything; b's first digit
    then at most b's rest (one piece when the rests are 0...0 and 9...9).
    """
    if not a:
        return ""
    if a[0] == b[0]:
        return a[0] + _same_length_range(a[1:], b[1:])
    rest = len(a) - 1
    low, high = int(a[0]), int(b[0])
    if a[1:] == "0" * rest and b[1:] == "9" * rest:
        return _digit_class(low, high) + _any_digits(rest)
    options = [a[0] + _same_length_range(a[1:], "9" * rest)]
    if low + 1 <= high - 1:
        options.append(_digit_class(low + 1, high - 1) + _any_digits(rest))
    options.append(b[0] + _same_length_range("0" * rest, b[1:]))
    return _alt(options)


def _digit_class(low: int, high: int) -> str:
    """The digits low..high as a regex."""
    if (low, high) == (0, 9):
        return r"\d"
    return str(low) if low == high else f"[{low}-{high}]"


def _any_digits(count: int) -> str:
    """Exactly ``count`` digits as a regex."""
    return {0: "", 1: r"\d"}.get(count, rf"\d{{{count}}}")


def integer_range_regex(lo: int | None, hi: int | None) -> str | None:
    """A regex of the JSON integers in [lo, hi] (None: unbounded on that side), or None if
    the range is empty. Canonical spellings only (no leading zeros, no ``+``), plus ``-0``
    when 0 is in the range (JSON's ``-0`` is 0)."""
    if lo is not None and hi is not None and lo > hi:
        return None
    options = []
    if hi is None or hi >= 0:  # 0 and the positive integers
        options.append(natural_range_regex(max(lo or 0, 0), hi))
    if lo is None or lo <= 0:  # the negative integers, by magnitude, and -0
        smallest = 0 if hi is None or hi >= 0 else -hi
        options.append("-" + natural_range_regex(smallest, None if lo is None else -lo))
    return _alt(options)


def decimal_range_regex(
    lo: Decimal | None, hi: Decimal | None, lo_exclusive: bool = False, hi_exclusive: bool = False
) -> str | None:
    """A regex of the JSON numbers written without exponent (``-?int(.digits)?``) whose value
    lies between ``lo`` and ``hi`` (None: unbounded; exclusive flags as JSON Schema's),
    or None if there is none.

    A number is a sign and a magnitude; each sign gives a magnitude range
    (`_magnitude_regex`): ``x`` in [lo, hi] is ``+m`` with m in [max(lo, 0), hi], or ``-m``
    with m in [max(-hi, 0), -lo].
    """
    options = []
    positive = _side(lo, lo_exclusive, hi, hi_exclusive)
    if positive is not None:
        options.append(_magnitude_regex(*positive))
    negative = _side(
        None if hi is None else -hi, hi_exclusive, None if lo is None else -lo, lo_exclusive
    )
    if negative is not None:
        options.append("-" + _magnitude_regex(*negative))
    return _alt([o for o in options if o is not None]) if options else None


def _side(lo, lo_exclusive, hi, hi_exclusive):
    """The magnitude range (low, low exclusive, high, high exclusive) of one sign's
    numbers in the range, or None: magnitudes start at 0 (inclusive) below ``lo`` <= 0."""
    if lo is None or lo < 0:
        lo, lo_exclusive = Decimal(0), False
    if hi is not None and (hi < lo or (hi == lo and (lo_exclusive or hi_exclusive))):
        return None
    return lo, lo_exclusive, hi, hi_exclusive


def _magnitude_regex(lo: Decimal, lo_exclusive: bool, hi: Decimal | None, hi_exclusive: bool):
    """Unsigned decimals ``int(.digits)?`` in the range (0 <= lo <= hi), or None.

    The integer part decides unless it equals an end's integer part; then the fraction
    digits are compared with that end's (`_fraction_between` and its one-sided forms).
    """
    lo_int, lo_frac = _split(lo)
    options = []
    if hi is None:
        options.append(str(lo_int) + _fraction_at_least(lo_frac, lo_exclusive, r"\."))
        options.append(natural_range_regex(lo_int + 1, None) + r"(?:\.\d+)?")
        return _alt(options)
    hi_int, hi_frac = _split(hi)
    if lo_int == hi_int:
        fraction = _fraction_between(lo_frac, lo_exclusive, hi_frac, hi_exclusive, r"\.")
        return None if fraction is None else str(lo_int) + fraction
    options.append(str(lo_int) + _fraction_at_least(lo_frac, lo_exclusive, r"\."))
    if lo_int + 1 <= hi_int - 1:
        options.append(natural_range_regex(lo_int + 1, hi_int - 1) + r"(?:\.\d+)?")
    upper = _fraction_at_most(hi_frac, hi_exclusive, r"\.")
    if upper is not None:
        options.append(str(hi_int) + upper)
    return _alt(options)


def _split(value: Decimal) -> tuple[int, str]:
    """(integer part, fraction digits without trailing zeros) of a non-negative decimal."""
    text = format(value, "f")
    whole, _, fraction = text.partition(".")
    return int(whole), fraction.rstrip("0")


# The fraction helpers read the fraction digits C of a number (maybe none) and compare the
# value 0.C with 0.R for a digit string R without trailing zeros. ``lead`` is what is
# written before the first digit: r"\." for the whole fraction, "" inside it. A result that
# allows no digits at all allows the fraction to be absent.


def _fraction_at_least(r: str, strict: bool, lead: str) -> str:
    """Fractions with 0.C >= 0.R (> if ``strict``)."""
    if not r:
        if strict:  # some digit is not 0
            return lead + r"\d*[1-9]\d*"
        return rf"(?:{lead}\d+)?" if lead else r"\d*"
    first = int(r[0])
    options = [lead + r[0] + _fraction_at_least(r[1:], strict, "")]
    if first < 9:
        options.append(lead + _digit_class(first + 1, 9) + r"\d*")
    return _alt(options)


def _fraction_at_most(r: str, strict: bool, lead: str) -> str | None:
    """Fractions with 0.C <= 0.R (< if ``strict``), or None if there is none."""
    if not r:
        if strict:
            return None
        return rf"(?:{lead}0+)?" if lead else "0*"
    first = int(r[0])
    options = [""]  # no more digits: 0.C < 0.R
    if first > 0:
        options.append(lead + _digit_class(0, first - 1) + r"\d*")
    rest = _fraction_at_most(r[1:], strict, "")
    if rest is not None:
        options.append(lead + r[0] + rest)
    return _alt(options)


def _fraction_between(a: str, a_strict: bool, b: str, b_strict: bool, lead: str) -> str | None:
    """Fractions with 0.A <= 0.C <= 0.B (strict as told), for 0.A <= 0.B; or None."""
    if not a and not a_strict:
        return _fraction_at_most(b, b_strict, lead)
    if not a and not b:  # 0 < C ... <= 0
        return None
    a0, b0 = (a or "0")[0], b[0]
    if a0 == b0:
        rest = _fraction_between(a[1:], a_strict, b[1:], b_strict, "")
        return None if rest is None else lead + a0 + rest
    options = [lead + a0 + _fraction_at_least(a[1:], a_strict, "")]
    if int(a0) + 1 <= int(b0) - 1:
        options.append(lead + _digit_class(int(a0) + 1, int(b0) - 1) + r"\d*")
    upper = _fraction_at_most(b[1:], b_strict, "")
    if upper is not None:
        options.append(lead + b0 + upper)
    return _alt(options)


def _alt(options: list[str]) -> str:
    """``options`` as one regex: a group of alternatives (or the only one)."""
    unique = list(dict.fromkeys(options))
    return unique[0] if len(unique) == 1 else "(?:" + "|".join(unique) + ")"


def _multiple_of_dfa(step: Decimal, fraction: bool) -> DFA:
    """The DFA of the exponent-free JSON numbers (integers only unless ``fraction``) that
    are multiples of ``step`` > 0.

    Write step = p / 10**s (p an integer). x is a multiple of step iff x * 10**s is an
    integer divisible by p: reading x's digits as if the point were s places further
    right, the remainder mod p must end at 0, and no fraction digit past the s-th may be
    anything but 0. A state is the remainder so far, and where the point is: in the
    integer part, or j fraction digits past it (0 <= j <= s); p * (s + 2) + 5 states.
    """
    _, digits, exponent = step.normalize().as_tuple()
    s = max(0, -exponent)
    p = int("".join(map(str, digits))) * 10 ** max(0, exponent)
    if p * (s + 2) > MAX_MULTIPLE_STATES:
        raise RegexError(f"multipleOf needs more than {MAX_MULTIPLE_STATES} automaton states")
    edges: list[list[tuple[int, int, int]]] = []
    epsilons: list[list[int]] = []

    def state() -> int:
        edges.append([])
        epsilons.append([])
        return len(edges) - 1

    def on(source: int, char: str, target: int) -> None:
        edges[source].append((ord(char), ord(char), target))

    start, unsigned, zero, accept, zeros = (state() for _ in range(5))
    integer = [state() for _ in range(p)]  # integer part read (not starting with 0)
    fractions = [[state() for _ in range(p)] for _ in range(s + 1)]  # j digits past '.'
    on(start, "-", unsigned)
    epsilons[start].append(unsigned)
    on(unsigned, "0", zero)
    for d in range(1, 10):
        on(unsigned, str(d), integer[d % p])
    for r in range(p):
        for d in range(10):
            on(integer[r], str(d), integer[(10 * r + d) % p])
    for q, r in ((zero, 0), *((integer[r], r) for r in range(p))):
        if r * 10**s % p == 0:
            epsilons[q].append(accept)
        if fraction:
            on(q, ".", fractions[0][r])
    for j in range(s + 1):
        for r in range(p):
            if j < s:
                for d in range(10):
                    on(fractions[j][r], str(d), fractions[j + 1][(10 * r + d) % p])
            if j >= 1 and r * 10 ** (s - j) % p == 0:
                epsilons[fractions[j][r]].append(accept)
    on(fractions[s][0], "0", zeros)
    on(zeros, "0", zeros)
    epsilons[zeros].append(accept)
    return automata().minimal_dfa(NFA(start, accept, edges, epsilons))


# --- strings ------------------------------------------------------------------------------

_QUOTE, _BACKSLASH = 0x22, 0x5C
_SHORT_ESCAPES = {0x08: "b", 0x0C: "f", 0x0A: "n", 0x0D: "r", 0x09: "t"}
_ANY_CHAR = Chars(((0, MAX_CODE_POINT),))


def _char(code: int) -> Chars:
    return Chars(((code, code),))


def _text(text: str) -> Node:
    """The tree of exactly ``text``."""
    return Concat(tuple(_char(ord(c)) for c in text))


def _hex_digits() -> Chars:
    return Chars(((0x30, 0x39), (0x41, 0x46), (0x61, 0x66)))


def _hex_digit(value: int) -> Chars:
    """One hex digit of ``value`` (0-15), either case."""
    text = f"{value:x}"
    return Chars(normalize_ranges({(ord(text), ord(text)), (ord(text.upper()), ord(text.upper()))}))


_MUST_ESCAPE: tuple[tuple[int, int], ...] = (
    (0x00, 0x1F),
    (_QUOTE, _QUOTE),
    (_BACKSLASH, _BACKSLASH),
)
_ALL_CONTROL_ESCAPES = Alt(
    (
        Concat((_text("\\u00"), Chars(((0x30, 0x31),)), _hex_digits())),
        Concat((_char(_BACKSLASH), Chars(normalize_ranges((ord(c), ord(c)) for c in "bfnrt")))),
    )
)


def _escapes(code: int) -> list[Node]:
    """The JSON spellings of a character that JSON requires to be escaped."""
    if code in (_QUOTE, _BACKSLASH):
        return [_text("\\" + chr(code))]
    spellings: list[Node] = [Concat((_text("\\u00"), _hex_digit(code >> 4), _hex_digit(code & 15)))]
    if code in _SHORT_ESCAPES:
        spellings.append(_text("\\" + _SHORT_ESCAPES[code]))
    return spellings


def _json_chars(node: Chars) -> Node:
    """The JSON spellings of one character of ``node``: raw, or escaped where JSON
    requires it (`LOOSENINGS`: "string escapes")."""
    if len(node.ranges) == 1 and node.ranges[0][0] == node.ranges[0][1]:  # one character
        code = node.ranges[0][0]
        if code > 0x1F and code not in (_QUOTE, _BACKSLASH):
            return node
    raw = _intersect_ranges(node.ranges, complement(_MUST_ESCAPE))
    escaped = [
        c for lo, hi in _intersect_ranges(node.ranges, _MUST_ESCAPE) for c in range(lo, hi + 1)
    ]
    options: list[Node] = [Chars(raw)] if raw else []
    if sum(c <= 0x1F for c in escaped) == 32:  # every control character: one short form
        options.append(_ALL_CONTROL_ESCAPES)
        escaped = [c for c in escaped if c > 0x1F]
    for code in escaped:
        options += _escapes(code)
    if not options:
        return Chars(())
    return options[0] if len(options) == 1 else Alt(tuple(options))


def _intersect_ranges(a, b) -> tuple[tuple[int, int], ...]:
    """The code points in both normalized range tuples."""
    return normalize_ranges(
        (max(lo, c), min(hi, d)) for lo, hi in a for c, d in b if max(lo, c) <= min(hi, d)
    )


def json_string_tree(node: Node) -> Node:
    """The regex tree of the JSON string texts (quotes included) of the strings ``node``
    matches: every set of characters becomes their JSON spellings (`_json_chars`)."""
    return Concat((_char(_QUOTE), map_chars(node, _json_chars), _char(_QUOTE)))


def _search_tree(pattern: str) -> Node:
    """The tree of the strings in which ``pattern`` finds a match (ECMA-262 search, as JSON
    Schema's ``pattern``): a top-level alternative not anchored by ``^`` gets any prefix,
    and one not anchored by ``$`` any suffix (`regex.parse_regex` matches whole strings and
    drops the anchors). Alternatives anchored alike share their prefix and suffix, which
    keeps the automaton of ``red|blue|...`` small."""
    anything = Repeat(_ANY_CHAR, 0, None)
    while _is_one_group(pattern):  # "(^a+$)": the anchors are at the top level all the same
        pattern = pattern[3:-1] if pattern.startswith("(?:") else pattern[1:-1]
    groups: dict[tuple[bool, bool], list[Node]] = {}
    for alternative in _top_level_alternatives(pattern):
        starts = alternative.startswith("^")
        ends = alternative.endswith("$") and not _escaped_at(alternative, len(alternative) - 1)
        groups.setdefault((starts, ends), []).append(parse_regex(alternative))
    options = [
        Concat(
            (() if starts else (anything,))
            + (cores[0] if len(cores) == 1 else Alt(tuple(cores)),)
            + (() if ends else (anything,))
        )
        for (starts, ends), cores in groups.items()
    ]
    return options[0] if len(options) == 1 else Alt(tuple(options))


def _is_one_group(pattern: str) -> bool:
    """Whether ``pattern`` is one plain or ``(?:`` group around everything."""
    if not (pattern.startswith("(") and pattern.endswith(")")) or _escaped_at(
        pattern, len(pattern) - 1
    ):
        return False
    if pattern.startswith("(?") and not pattern.startswith("(?:"):
        return False
    inner = pattern[3:-1] if pattern.startswith("(?:") else pattern[1:-1]
    return _top_level_alternatives(inner) is not None and _balanced(inner)


def _balanced(pattern: str) -> bool:
    """Whether every group of ``pattern`` closes within it (outside classes and escapes)."""
    depth, in_class, i = 0, False, 0
    while i < len(pattern):
        char = pattern[i]
        if char == "\\":
            i += 2
            continue
        if in_class:
            in_class = char != "]"
        elif char == "[":
            in_class = True
        elif char in "()":
            depth += 1 if char == "(" else -1
            if depth < 0:
                return False
        i += 1
    return depth == 0


def _escaped_at(pattern: str, i: int) -> bool:
    """Whether the character at ``i`` is escaped (an odd number of backslashes before it)."""
    count = 0
    while i - count - 1 >= 0 and pattern[i - count - 1] == "\\":
        count += 1
    return count % 2 == 1


def _top_level_alternatives(pattern: str) -> list[str]:
    """``pattern`` split at the ``|`` outside groups and classes."""
    parts, depth, in_class, start, i = [], 0, False, 0, 0
    while i < len(pattern):
        char = pattern[i]
        if char == "\\":
            i += 2
            continue
        if in_class:
            in_class = char != "]"
        elif char == "[":
            in_class = True
        elif char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        elif char == "|" and depth == 0:
            parts.append(pattern[start:i])
            start = i + 1
        i += 1
    return [*parts, pattern[start:]]


def _node_dfa(node: Node) -> DFA:
    return automata().node_dfa(node)


# --- literal values -----------------------------------------------------------------------


def _json_key(value) -> str:
    """A text equal for JSON-equal values: numbers by value (1 and 1.0 alike), booleans
    apart from numbers, objects whatever their key order."""

    def normal(v):
        if isinstance(v, float) and v.is_integer():
            return int(v)
        if isinstance(v, list):
            return [normal(x) for x in v]
        if isinstance(v, dict):
            return {k: normal(x) for k, x in v.items()}
        return v

    return json.dumps(normal(value), sort_keys=True)


def _json_type(value) -> str:
    """The JSON Schema type of a parsed JSON value (``integer`` for whole numbers)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer()):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


# --- the compiler -------------------------------------------------------------------------

Part = tuple[str, dict]
"""One schema of a conjunction: (its JSON pointer, the schema object)."""


@dataclass(frozen=True)
class _Conjunction:
    """Schemas that must all hold. ``distributed`` names the ``anyOf``/``oneOf`` keywords
    (``pointer/anyOf``) already turned into alternatives."""

    parts: tuple[Part, ...]
    distributed: frozenset[str] = frozenset()
    depth: int = 0

    @property
    def key(self) -> tuple[frozenset[str], frozenset[str]]:
        return frozenset(p for p, _ in self.parts), self.distributed

    def values(self, keyword: str) -> Iterator[tuple[object, str]]:
        """(value, pointer) of ``keyword`` in each part that has it."""
        for pointer, schema in self.parts:
            if keyword in schema:
                yield schema[keyword], pointer

    @property
    def pointer(self) -> str:
        """The pointer of the last part (for labels and messages)."""
        return self.parts[-1][0] if self.parts else "any value"

    def has(self, keyword: str) -> bool:
        return any(keyword in schema for _, schema in self.parts)


@dataclass
class _Region:
    """Additional property names: ``keys`` (a DFA of JSON string texts) that match the
    ``patternProperties`` numbered in ``patterns`` and no others."""

    keys: DFA
    patterns: frozenset[int]


class _Compiler:
    """One schema's translation: ``rules`` grows as conjunctions are compiled (`value`)."""

    def __init__(self, root, space: Node, additional_properties: bool):
        self.root = root
        self.space = space
        self.additional_properties = additional_properties
        self.rules: dict[str, tuple[tuple[Symbol, ...], ...]] = {}
        self.memo: dict[tuple, str | None] = {}
        self.names: set[str] = set()
        dialect = root.get("$schema", "") if isinstance(root, dict) else ""
        self.old_draft = isinstance(dialect, str) and any(d in dialect for d in _OLD_DRAFTS)
        self.ids = dict(_ids(root, "#"))
        self.pattern_dfas: dict[tuple[str, bool], DFA] = {}

    # -- flattening: a schema, its $ref targets and allOf members ---------------------

    def conjunction(self, schemas: Iterable[tuple[object, str]], depth: int = 0):
        """The conjunction of ``schemas`` ((schema, pointer) pairs), or None if one is false."""
        parts: list[Part] = []
        seen: set[str] = set()
        for schema, pointer in schemas:
            more = self.conjuncts(schema, pointer, seen)
            if more is None:
                return None
            parts += more
        return _Conjunction(tuple(parts), depth=depth)

    def conjuncts(self, schema, pointer: str, seen: set[str]) -> list[Part] | None:
        """``schema`` flattened: itself, its ``$ref`` target and ``allOf`` members, each
        flattened (a part already in ``seen`` is not repeated: A and A is A); None if one
        of them is ``false``.

        The parts come in the order of the schema's keywords (the schema itself where its
        ``properties`` are), because that order is the order of the properties
        (`LOOSENINGS`: "property order"; LLGuidance's rule too).
        """
        if schema is True or pointer in seen:
            return []
        if schema is False:
            return None
        if not isinstance(schema, dict):
            raise SchemaError("a schema must be an object or a boolean", None, schema, pointer)
        seen.add(pointer)
        ref_only = self.old_draft and "$ref" in schema  # drafts 4-7 ignore $ref's siblings
        parts: list[Part] = []
        for keyword in _applicator_order(schema):
            if keyword == "$ref":
                target, target_pointer = self.resolve(schema["$ref"], pointer)
                more = self.conjuncts(target, target_pointer, seen)
            elif keyword == "allOf" and not ref_only:
                more = self.all_of(schema["allOf"], pointer, seen)
            elif keyword == "self" and not ref_only:
                more = [(pointer, schema)]
            else:
                continue
            if more is None:
                return None
            parts += more
        return parts

    def all_of(self, members, pointer: str, seen: set[str]) -> list[Part] | None:
        """The parts of every member of ``allOf`` (None if one is false)."""
        if not isinstance(members, list) or not members:
            raise SchemaError("must be a non-empty array of schemas", "allOf", members, pointer)
        parts: list[Part] = []
        for i, member in enumerate(members):
            more = self.conjuncts(member, f"{pointer}/allOf/{i}", seen)
            if more is None:
                return None
            parts += more
        return parts

    def resolve(self, ref, pointer: str) -> tuple[object, str]:
        """The schema a ``$ref`` names, and its pointer: ``#/json/pointer``, ``#anchor``,
        an ``$id`` of the document, or an ``$id`` followed by a fragment."""
        if not isinstance(ref, str):
            raise SchemaError("must be a string", "$ref", ref, pointer)
        if ref in self.ids:
            target_pointer = self.ids[ref]
        else:
            base, _, fragment = ref.partition("#")
            if base and base not in self.ids:
                raise SchemaError("remote references are not supported", "$ref", ref, pointer)
            base_pointer = self.ids[base] if base else "#"
            if fragment and not fragment.startswith("/"):
                if "#" + fragment not in self.ids:
                    raise SchemaError("no such anchor", "$ref", ref, pointer)
                target_pointer = self.ids["#" + fragment]
            else:
                target_pointer = base_pointer + urllib.parse.unquote(fragment)
        target = self.root
        for token in target_pointer.split("/")[1:]:
            token = token.replace("~1", "/").replace("~0", "~")
            if isinstance(target, dict) and token in target:
                target = target[token]
            elif isinstance(target, list) and token.isdigit() and int(token) < len(target):
                target = target[int(token)]
            else:
                raise SchemaError("the reference names nothing", "$ref", ref, pointer)
        return target, target_pointer

    # -- one rule per conjunction -----------------------------------------------------

    def value(self, conjunction: _Conjunction | None) -> str | None:
        """The rule of the JSON texts valid under ``conjunction`` (None if there are none,
        or the conjunction is None)."""
        if conjunction is None:
            return None
        key = conjunction.key
        if key in self.memo:
            return self.memo[key]
        if len(self.memo) >= MAX_RULES:
            raise SchemaError(f"the schema needs more than {MAX_RULES} rules (MAX_RULES)")
        if conjunction.depth > MAX_DEPTH:
            pointer = conjunction.parts[-1][0] if conjunction.parts else "#"
            raise SchemaError(
                f"subschemas nested deeper than {MAX_DEPTH} (MAX_DEPTH)", pointer=pointer
            )
        name = self.rule_name(conjunction)
        self.memo[key] = name  # a recursive reference finds the rule while it is built
        alternatives = tuple(dict.fromkeys(self.alternatives(conjunction)))
        if not alternatives:
            if name in _referenced(self.rules):
                self.rules[name] = ()
            self.memo[key] = None
            return None
        self.rules[name] = alternatives
        return name

    def rule_name(self, conjunction: _Conjunction, suffix: str = "") -> str:
        """A new rule name made of the parts' pointers (``any`` for the empty conjunction)."""
        base = " & ".join(dict.fromkeys(p for p, _ in conjunction.parts)) or "any"
        base += suffix
        name, n = base, 1
        while name in self.names:
            n += 1
            name = f"{base} ({n})"
        self.names.add(name)
        return name

    def alternatives(self, conjunction: _Conjunction) -> list[tuple[Symbol, ...]]:
        """The rule's alternatives: one per option of the first ``anyOf``/``oneOf`` not yet
        distributed (`LOOSENINGS`: "oneOf"), else one per JSON type (`typed_alternatives`)."""
        for pointer, schema in conjunction.parts:
            for keyword in ("anyOf", "oneOf"):
                label = f"{pointer}/{keyword}"
                if keyword not in schema or label in conjunction.distributed:
                    continue
                options = schema[keyword]
                if not isinstance(options, list) or not options:
                    raise SchemaError(
                        "must be a non-empty array of schemas", keyword, options, pointer
                    )
                result = []
                for i, option in enumerate(options):
                    seen = {p for p, _ in conjunction.parts}
                    more = self.conjuncts(option, f"{label}/{i}", seen)
                    if more is None:
                        continue
                    at = conjunction.parts.index((pointer, schema))
                    if _applicator_order(schema).index(keyword) > _applicator_order(schema).index(
                        "self"
                    ):
                        at += 1  # the option's properties come after this part's
                    chosen = _Conjunction(
                        conjunction.parts[:at] + tuple(more) + conjunction.parts[at:],
                        conjunction.distributed | {label},
                        conjunction.depth + 1,
                    )
                    symbol = self.value(chosen)
                    if symbol is not None:
                        result.append((symbol,))
                return result
        return self.typed_alternatives(conjunction)

    def typed_alternatives(self, conjunction: _Conjunction) -> list[tuple[Symbol, ...]]:
        """One alternative per JSON type allowed, from the keywords of that type."""
        for pointer, schema in conjunction.parts:
            _check_keywords(schema, pointer)
        types = self.types(conjunction)
        if conjunction.has("enum") or conjunction.has("const"):
            return self.enum_alternatives(conjunction, types)
        alternatives: list[Symbol | None] = []
        if "null" in types:
            alternatives.append(Terminal.literal("null"))
        if "boolean" in types:
            alternatives.append(Terminal.regex("true|false"))
        if "number" in types or "integer" in types:
            alternatives.append(self.number(conjunction, integer="number" not in types))
        if "string" in types:
            alternatives.append(self.string(conjunction))
        if "array" in types:
            alternatives.append(self.array(conjunction))
        if "object" in types:
            alternatives.append(self.object(conjunction))
        return [(symbol,) for symbol in alternatives if symbol is not None]

    def types(self, conjunction: _Conjunction) -> set[str]:
        """The JSON types every ``type`` keyword allows (``integer`` within ``number``)."""
        allowed = set(_TYPES)
        for pointer, schema in conjunction.parts:
            if "type" not in schema:
                continue
            value = schema["type"]
            names = value if isinstance(value, list) else [value]
            if not names or any(name not in _TYPES for name in names):
                raise SchemaError(f"must be among {', '.join(_TYPES)}", "type", value, pointer)
            these = set(names) | ({"integer"} if "number" in names else set())
            if schema.get("nullable") is True:  # LOOSENINGS: "nullable"
                these.add("null")
            allowed &= these
        return allowed

    # -- enum and const -----------------------------------------------------------------

    def enum_alternatives(self, conjunction: _Conjunction, types: set[str]):
        """One lexeme: the spellings of the values every ``enum``/``const`` allows that
        satisfy the other keywords (checked by parsing each value with their grammar)."""
        candidates: dict[str, object] | None = None  # JSON key -> value
        for keyword in ("enum", "const"):
            for value, pointer in conjunction.values(keyword):
                if keyword == "enum" and (not isinstance(value, list) or not value):
                    raise SchemaError("must be a non-empty array", "enum", value, pointer)
                allowed = value if keyword == "enum" else [value]
                if len(allowed) > MAX_ENUM:
                    raise SchemaError(
                        f"more than {MAX_ENUM} values (MAX_ENUM)", keyword, value, pointer
                    )
                keyed = {_json_key(v): v for v in allowed}
                candidates = (
                    keyed
                    if candidates is None
                    else {k: v for k, v in candidates.items() if k in keyed}
                )
        unique = [
            v
            for v in (candidates or {}).values()
            if _json_type(v) in types or (_json_type(v) == "integer" and "number" in types)
        ]
        others = [
            (p, {k: v for k, v in s.items() if k not in ("enum", "const")})
            for p, s in conjunction.parts
        ]
        if any(k in _VALUE_KEYWORDS for _, s in others for k in s):
            rest = _Conjunction(tuple(others), conjunction.distributed, conjunction.depth + 1)
            unique = [v for v in unique if self.satisfies(v, rest)]
        if not unique:
            return []
        tree = (
            Alt(tuple(self.literal(v) for v in unique))
            if len(unique) > 1
            else self.literal(unique[0])
        )
        label = f"enum at {conjunction.pointer}: " + json.dumps(unique)[:60]
        return [(self.terminal(tree, label, conjunction.pointer, "enum", unique),)]

    def satisfies(self, value, conjunction: _Conjunction) -> bool:
        """Whether ``value``'s compact text is a sentence of ``conjunction``'s grammar (a
        separate compiler: this one's rules may be unfinished)."""
        other = _Compiler(self.root, Concat(()), self.additional_properties)
        start = other.value(conjunction)
        if start is None:
            return False
        rules = dict(other.rules)
        rules["$start"] = ((start,),)
        try:
            parser = EarleyParser(Grammar(rules, "$start"))
        except GrammarError:
            return False
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
        return all(parser.push(b) for b in text.encode()) and parser.is_accepting()

    def literal(self, value) -> Node:
        """The tree of ``value``'s JSON spellings (whitespace as the policy allows)."""
        if isinstance(value, str):
            return json_string_tree(_text(value))
        if isinstance(value, list):
            if not value:
                return Concat((_char(ord("[")), self.space, _char(ord("]"))))
            items: list[Node] = [Concat((_char(ord("[")), self.space))]
            for i, item in enumerate(value):
                if i:
                    items.append(self.punctuation(","))
                items.append(self.literal(item))
            return Concat((*items, Concat((self.space, _char(ord("]"))))))
        if isinstance(value, dict):
            if not value:
                return Concat((_char(ord("{")), self.space, _char(ord("}"))))
            items = [Concat((_char(ord("{")), self.space))]
            for i, (key, item) in enumerate(value.items()):
                if i:
                    items.append(self.punctuation(","))
                items += [json_string_tree(_text(key)), self.punctuation(":"), self.literal(item)]
            return Concat((*items, Concat((self.space, _char(ord("}"))))))
        return _text(json.dumps(value))

    def punctuation(self, char: str) -> Node:
        """``,`` or ``:`` with whitespace on both sides."""
        return Concat((self.space, _char(ord(char)), self.space))

    def terminal(self, tree: Node, label: str, pointer: str, keyword: str, value) -> Terminal:
        """`Terminal.from_node`, with automaton limits reported as a `SchemaError`."""
        try:
            return Terminal.from_node(tree, label)
        except RegexError as exc:
            raise SchemaError(f"too large to compile ({exc})", keyword, value, pointer) from None

    # -- numbers --------------------------------------------------------------------------

    def number(self, conjunction: _Conjunction, integer: bool) -> Terminal | None:
        """The lexeme of the numbers (or integers) within every bound and ``multipleOf``."""
        lo, lo_exclusive, hi, hi_exclusive = None, False, None, False
        for pointer, schema in conjunction.parts:
            draft4_lo = schema.get("exclusiveMinimum") is True
            draft4_hi = schema.get("exclusiveMaximum") is True
            for keyword, exclusive in (
                ("minimum", draft4_lo),
                ("exclusiveMinimum", True),
                ("maximum", draft4_hi),
                ("exclusiveMaximum", True),
            ):
                bound = schema.get(keyword)
                if bound is None or (keyword.startswith("exclusive") and isinstance(bound, bool)):
                    continue
                value = _decimal(bound, keyword, pointer)
                if keyword.endswith("inimum"):
                    if lo is None or value > lo or (value == lo and exclusive):
                        lo, lo_exclusive = value, exclusive
                elif hi is None or value < hi or (value == hi and exclusive):
                    hi, hi_exclusive = value, exclusive
        if integer:
            low = None if lo is None else math.floor(lo) + 1 if lo_exclusive else math.ceil(lo)
            high = None if hi is None else math.ceil(hi) - 1 if hi_exclusive else math.floor(hi)
            pattern = integer_range_regex(low, high)
        elif lo is None and hi is None:
            pattern = r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?"
        else:
            pattern = decimal_range_regex(lo, hi, lo_exclusive, hi_exclusive)
        if pattern is None:
            return None
        steps = list(conjunction.values("multipleOf"))
        if not steps:
            return Terminal.regex(pattern)
        dfa = Terminal.regex(pattern).dfa
        for step, pointer in steps:
            value = _decimal(step, "multipleOf", pointer)
            if value <= 0:
                raise SchemaError("must be greater than 0", "multipleOf", step, pointer)
            try:
                dfa = automata().intersect(dfa, _multiple_of_dfa(value, fraction=not integer))
            except RegexError as exc:
                raise SchemaError(
                    f"too large to compile ({exc})", "multipleOf", step, pointer
                ) from None
        label = f"{'integer' if integer else 'number'} {pattern} multipleOf " + ",".join(
            str(s) for s, _ in steps
        )
        return Terminal.from_dfa(dfa, label) if dfa.start >= 0 else None

    # -- strings --------------------------------------------------------------------------

    def string(self, conjunction: _Conjunction) -> Terminal | None:
        """The lexeme of the strings within the length bounds that match every ``pattern``
        and known ``format``: one tree, or the intersection of several automata."""
        shortest, longest = 0, None
        for value, pointer in conjunction.values("minLength"):
            shortest = max(shortest, _count(value, "minLength", pointer))
        for value, pointer in conjunction.values("maxLength"):
            count = _count(value, "maxLength", pointer)
            longest = count if longest is None else min(longest, count)
        if longest is not None and shortest > longest:
            return None
        if shortest > MAX_COUNTED:  # LOOSENINGS: "large counts"
            shortest = 0
        if longest is not None and longest > MAX_COUNTED:
            longest = None
        constraints: list[tuple[Node, str, str, object]] = []  # tree, keyword, pointer, value
        if shortest or longest is not None:
            length = Repeat(_ANY_CHAR, shortest, longest)
            constraints.append(
                (
                    length,
                    "maxLength" if longest is not None else "minLength",
                    conjunction.parts[-1][0],
                    longest,
                )
            )
        for value, pointer in conjunction.values("pattern"):
            if not isinstance(value, str):
                raise SchemaError("must be a string", "pattern", value, pointer)
            try:
                constraints.append((_search_tree(value), "pattern", pointer, value))
            except RegexError as exc:
                raise SchemaError(f"unsupported regex: {exc}", "pattern", value, pointer) from None
        for value, pointer in conjunction.values("format"):
            if isinstance(value, str) and value in FORMATS:
                constraints.append((parse_regex(FORMATS[value]), "format", pointer, value))
        if not constraints:
            return Terminal.from_node(json_string_tree(Repeat(_ANY_CHAR, 0, None)), "string")
        terminals = [
            self.terminal(
                json_string_tree(tree), f"string ({keyword} {value!r})", pointer, keyword, value
            )
            for tree, keyword, pointer, value in constraints
        ]
        if len(terminals) == 1:
            return terminals[0]
        dfa = terminals[0].dfa
        for terminal, (_, keyword, pointer, value) in zip(
            terminals[1:], constraints[1:], strict=True
        ):
            try:
                dfa = automata().intersect(dfa, terminal.dfa)
            except RegexError as exc:
                raise SchemaError(
                    f"too large to compile ({exc})", keyword, value, pointer
                ) from None
        label = "string (" + ", ".join(f"{k} {v!r}" for _, k, _, v in constraints) + ")"
        return Terminal.from_dfa(dfa, label) if dfa.start >= 0 else None

    # -- arrays ---------------------------------------------------------------------------

    def array(self, conjunction: _Conjunction) -> str | None:
        """Rules that count items: position j's schema is the conjunction of each part's
        schema for position j (its ``prefixItems`` / tuple ``items`` entry, else its
        ``items`` / ``additionalItems``), between ``minItems`` and ``maxItems``."""
        fewest, most = 0, None
        for value, pointer in conjunction.values("minItems"):
            fewest = max(fewest, _count(value, "minItems", pointer))
        for value, pointer in conjunction.values("maxItems"):
            count = _count(value, "maxItems", pointer)
            most = count if most is None else min(most, count)
        if fewest > MAX_COUNTED:  # LOOSENINGS: "large counts"
            fewest = 0
        if most is not None and most > MAX_COUNTED:
            most = None
        layouts = [_item_layout(schema, pointer) for pointer, schema in conjunction.parts]
        prefix_length = max((len(prefix) for prefix, _ in layouts), default=0)
        depth = conjunction.depth + 1

        def item(j: int) -> str | None:
            schemas = [prefix[j] if j < len(prefix) else rest for prefix, rest in layouts]
            return self.value(self.conjunction([s for s in schemas if s is not None], depth))

        items: list[str] = []
        for j in range(prefix_length):
            symbol = item(j)
            if symbol is None:
                most = j if most is None else min(most, j)
                break
            items.append(symbol)
        rest = item(prefix_length) if most is None or most > prefix_length else None
        if rest is None and (most is None or most > len(items)):
            most = len(items)
        if most is not None and fewest > most:
            return None
        name = self.rule_name(conjunction, ":array")
        open_, close = self.bracket("["), self.bracket("]")
        comma = self.separator(",")
        # "after j": what may follow the first j items. Past the prefix and minItems,
        # with no maxItems, every position is alike: one rule loops.
        last = max(len(items), fewest, 1) if most is None else most
        for j in range(last, 0, -1):
            alternatives = [(close,)] if j >= fewest else []
            if most is None or j < most:
                following = f"{name}:after {min(j + 1, last)}"
                alternatives.append((comma, items[j] if j < len(items) else rest, following))
            self.rules[f"{name}:after {j}"] = tuple(alternatives)
        tail = f"{name}:after 1" if last >= 1 else None
        alternatives: list[tuple[Symbol, ...]] = []
        if fewest == 0:
            alternatives.append((self.empty("[", "]"),))
        if most is None or most >= 1:
            alternatives.append((open_, items[0] if items else rest, tail))
        self.rules[name] = tuple(alternatives)
        return name

    def bracket(self, char: str) -> Terminal:
        """An opening bracket with whitespace after, or a closing one with whitespace before."""
        tree = (
            Concat((_char(ord(char)), self.space))
            if char in "[{"
            else Concat((self.space, _char(ord(char))))
        )
        return Terminal.from_node(tree, repr(char))

    def separator(self, char: str) -> Terminal:
        return Terminal.from_node(self.punctuation(char), repr(char))

    def empty(self, open_: str, close: str) -> Terminal:
        tree = Concat((_char(ord(open_)), self.space, _char(ord(close))))
        return Terminal.from_node(tree, repr(open_ + close))

    # -- objects --------------------------------------------------------------------------

    def object(self, conjunction: _Conjunction) -> str | None:
        """Rules for the named properties, in order, then the additional ones.

        Each part that has ``properties``, ``patternProperties`` or
        ``additionalProperties`` constrains every property: a listed name by its schema,
        else by each matching pattern's schema, else by ``additionalProperties``. A
        property's schema is the conjunction over the parts. Names come in the order of
        ``properties`` (then the ``required`` names not listed); the additional
        properties' names are split into regions by the patterns they match.
        """
        parts = [(p, s) for p, s in conjunction.parts if _is_object_part(s)]
        names: list[str] = []
        for pointer, schema in parts:
            properties = schema.get("properties", {})
            if not isinstance(properties, dict):
                raise SchemaError("must be an object of schemas", "properties", properties, pointer)
            names += properties
        required: list[str] = []
        for value, pointer in conjunction.values("required"):
            if not isinstance(value, list) or not all(isinstance(n, str) for n in value):
                raise SchemaError("must be an array of strings", "required", value, pointer)
            required += value
        names = list(dict.fromkeys(names + required))
        required_set = set(required)
        depth = conjunction.depth + 1
        named: list[tuple[str, str]] = []  # (name, value rule)
        for name in names:
            schemas = [self.property_schema(name, p, s) for p, s in parts]
            symbol = self.value(self.conjunction(schemas, depth))
            if symbol is None:
                if name in required_set:
                    return None
                continue
            named.append((name, symbol))
        self.check_property_counts(conjunction, named, required_set, parts)
        try:
            regions = self.additional_regions(parts, names)
        except RegexError as exc:
            problem = f"the names of additional properties are too large to compile ({exc})"
            raise SchemaError(problem, "properties", names, conjunction.pointer) from None
        additional: list[tuple[Terminal, str]] = []
        for region in regions:
            schemas = []
            for index, (pointer, schema) in enumerate(parts):
                matched = [
                    (s, f"{pointer}/patternProperties/{_escape_pointer(pat)}")
                    for i, (pat, s) in enumerate(_pattern_properties(schema, pointer))
                    if (index, i) in region.patterns
                ]
                schemas += matched or [self.additional_schema(pointer, schema)]
            symbol = self.value(self.conjunction(schemas, depth))
            if symbol is not None:
                label = f"property name at {conjunction.pointer}"
                additional.append((Terminal.from_dfa(region.keys, label), symbol))
        return self.object_rules(conjunction, named, required_set, additional)

    def property_schema(self, name: str, pointer: str, schema: dict) -> tuple[object, str]:
        """What one part says of property ``name``: see `object`."""
        properties = schema.get("properties", {})
        if name in properties:
            return properties[name], f"{pointer}/properties/{_escape_pointer(name)}"
        matched = [
            (s, f"{pointer}/patternProperties/{_escape_pointer(pattern)}")
            for pattern, s in _pattern_properties(schema, pointer)
            if self.pattern_dfa(pattern, pointer).match(name.encode())
        ]
        if len(matched) == 1:
            return matched[0]
        if matched:
            return {"allOf": [s for s, _ in matched]}, f"{pointer}/patternProperties:{name}"
        return self.additional_schema(pointer, schema)

    def additional_schema(self, pointer: str, schema: dict) -> tuple[object, str]:
        """A part's ``additionalProperties`` (False under ``additional_properties=False``
        when the part lists properties or patterns but says nothing of others)."""
        if "additionalProperties" in schema:
            return schema["additionalProperties"], f"{pointer}/additionalProperties"
        listed = "properties" in schema or "patternProperties" in schema
        return (not listed or self.additional_properties), f"{pointer}/additionalProperties"

    def pattern_dfa(self, pattern: str, pointer: str, spelled: bool = False) -> DFA:
        """The DFA of the names in which ``pattern`` finds a match: decoded names, or their
        JSON spellings (quotes included) if ``spelled``."""
        if (pattern, spelled) not in self.pattern_dfas:
            try:
                tree = _search_tree(pattern)
                dfa = _node_dfa(json_string_tree(tree) if spelled else tree)
            except RegexError as exc:
                raise SchemaError(
                    f"unsupported regex: {exc}", "patternProperties", pattern, pointer
                ) from None
            self.pattern_dfas[pattern, spelled] = dfa
        return self.pattern_dfas[pattern, spelled]

    def additional_regions(self, parts: list[Part], names: list[str]) -> list[_Region]:
        """The names of additional properties, split by the patterns they match.

        Start from every JSON string but the listed names; each pattern splits every
        region into the names it matches and those it does not (empty regions dropped).
        """
        if self.closed(parts):
            return []
        any_key = Terminal.from_node(json_string_tree(Repeat(_ANY_CHAR, 0, None)), "string").dfa
        keys = any_key
        if names:
            listed = (
                Alt(tuple(json_string_tree(_text(n)) for n in names))
                if len(names) > 1
                else json_string_tree(_text(names[0]))
            )
            keys = automata().subtract(any_key, _node_dfa(listed))
        regions = [_Region(keys, frozenset())]
        for index, (pointer, schema) in enumerate(parts):
            for i, (pattern, _) in enumerate(_pattern_properties(schema, pointer)):
                matching = self.pattern_dfa(pattern, pointer, spelled=True)
                split = []
                for region in regions:
                    inside = automata().intersect(region.keys, matching)
                    outside = automata().subtract(region.keys, matching)
                    if inside.start >= 0:
                        split.append(_Region(inside, region.patterns | {(index, i)}))
                    if outside.start >= 0:
                        split.append(_Region(outside, region.patterns))
                if len(split) > MAX_PATTERN_REGIONS:
                    raise SchemaError(
                        f"overlapping patterns cut names into over {MAX_PATTERN_REGIONS} regions",
                        "patternProperties",
                        pattern,
                        pointer,
                    )
                regions = split
        return regions

    def closed(self, parts: list[Part]) -> bool:
        """Whether some part allows no property but those it lists in ``properties``."""
        return any(
            self.additional_schema(p, s)[0] is False and not s.get("patternProperties")
            for p, s in parts
        )

    def check_property_counts(self, conjunction, named, required_set, parts) -> None:
        """Accept ``minProperties``/``maxProperties`` only where the rest implies them."""
        for value, pointer in conjunction.values("minProperties"):
            if _count(value, "minProperties", pointer) > len(required_set):
                raise SchemaError(
                    "is only supported when 'required' implies it", "minProperties", value, pointer
                )
        for value, pointer in conjunction.values("maxProperties"):
            if not self.closed(parts) or _count(value, "maxProperties", pointer) < len(named):
                raise SchemaError(
                    "is only supported when the properties cannot outnumber it",
                    "maxProperties",
                    value,
                    pointer,
                )

    def object_rules(self, conjunction, named, required_set, additional) -> str | None:
        """Rules of ``{ named properties in order, then additional ones }``.

        ``from i``: properties i.. when none was written yet (so at least one comes);
        ``then i``: properties i.. after some were written (each begins with a comma); i
        = n is the additional properties. A required property must appear, an optional one
        may be skipped. The lexeme of a name includes its colon, and in ``then`` rules the
        comma before it.
        """
        name = self.rule_name(conjunction, ":object")
        n = len(named)
        comma, colon = self.separator(","), self.separator(":")
        head: list[str | None] = [None] * (n + 1)
        tail = [f"{name}:then {i}" for i in range(n + 1)]
        self.rules[tail[n]] = (
            (),
            *((comma, key, colon, value, tail[n]) for key, value in additional),
        )
        if additional:
            head[n] = f"{name}:from {n}"
            self.rules[head[n]] = tuple((key, colon, value, tail[n]) for key, value in additional)
        for i in range(n - 1, -1, -1):
            key, value = named[i]
            spelled = Concat((json_string_tree(_text(key)), self.punctuation(":")))
            optional = key not in required_set
            if i > 0:
                later = Terminal.from_node(
                    Concat((self.punctuation(","), spelled)), f",{json.dumps(key)}:"
                )
                self.rules[tail[i]] = ((later, value, tail[i + 1]),) + (
                    ((tail[i + 1],),) if optional else ()
                )
            first = Terminal.from_node(spelled, f"{json.dumps(key)}:")
            head[i] = f"{name}:from {i}"
            heads: tuple = ((first, value, tail[i + 1]),)
            if optional and head[i + 1] is not None:
                heads += ((head[i + 1],),)
            self.rules[head[i]] = heads
        alternatives: list[tuple[Symbol, ...]] = []
        if not required_set:
            alternatives.append((self.empty("{", "}"),))
        if head[0] is not None:
            alternatives.append((self.bracket("{"), head[0], self.bracket("}")))
        if not alternatives:
            return None
        self.rules[name] = tuple(alternatives)
        return name


def _applicator_order(schema: dict) -> list[str]:
    """``$ref``, ``allOf``, ``anyOf``, ``oneOf`` and ``self`` (the schema's own keywords,
    placed where its ``properties`` are, else first) in the schema's key order."""
    keys = [k for k in schema if k in ("$ref", "allOf", "anyOf", "oneOf", "properties")]
    order = ["self" if k == "properties" else k for k in keys]
    return order if "self" in order else ["self", *order]


def _referenced(rules) -> set[str]:
    return {s for alts in rules.values() for alt in alts for s in alt if isinstance(s, str)}


def _is_object_part(schema: dict) -> bool:
    return any(k in schema for k in ("properties", "patternProperties", "additionalProperties"))


def _pattern_properties(schema: dict, pointer: str) -> list[tuple[str, object]]:
    value = schema.get("patternProperties", {})
    if not isinstance(value, dict):
        raise SchemaError("must be an object of schemas", "patternProperties", value, pointer)
    return list(value.items())


def _item_layout(schema: dict, pointer: str) -> tuple[list, tuple | None]:
    """One part's array layout: ([(schema, pointer) per prefix position], (schema,
    pointer) of the items after them), whether written as 2020-12's ``prefixItems`` +
    ``items`` or the older tuple ``items`` + ``additionalItems``."""
    if isinstance(schema.get("items"), list):
        prefix = [(s, f"{pointer}/items/{i}") for i, s in enumerate(schema["items"])]
        return prefix, (schema.get("additionalItems", True), f"{pointer}/additionalItems")
    prefix_items = schema.get("prefixItems", [])
    if not isinstance(prefix_items, list):
        raise SchemaError("must be an array of schemas", "prefixItems", prefix_items, pointer)
    prefix = [(s, f"{pointer}/prefixItems/{i}") for i, s in enumerate(prefix_items)]
    return prefix, (schema.get("items", True), f"{pointer}/items")


def _check_keywords(schema: dict, pointer: str) -> None:
    """Raise `SchemaError` for a keyword in `UNSUPPORTED` that would constrain anything."""
    for keyword in UNSUPPORTED & schema.keys():
        value = schema[keyword]
        harmless = (
            (keyword == "uniqueItems" and value is False)
            or (keyword == "if" and "then" not in schema and "else" not in schema)
            or (keyword in ("minProperties", "maxProperties"))  # checked by `object`
            or (
                keyword in ("dependencies", "dependentRequired", "dependentSchemas") and value == {}
            )
        )
        if not harmless:
            raise SchemaError("is not supported", keyword, value, pointer)


def _count(value, keyword: str, pointer: str) -> int:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise SchemaError("must be a non-negative integer", keyword, value, pointer)
    return value


def _decimal(value, keyword: str, pointer: str) -> Decimal:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise SchemaError("must be a number", keyword, value, pointer)
    return Decimal(value) if isinstance(value, int) else Decimal(repr(value))


def _escape_pointer(token: str) -> str:
    return token.replace("~", "~0").replace("/", "~1")


def _ids(schema, pointer: str) -> Iterator[tuple[str, str]]:
    """(identifier, pointer) of every ``$id`` / draft-4 ``id`` / ``$anchor`` in the document
    (the keys a ``$ref`` may use: ``#name`` for anchors)."""
    if isinstance(schema, dict):
        for keyword in ("$id", "id"):
            value = schema.get(keyword)
            if isinstance(value, str) and value:
                yield value.rstrip("#"), pointer
                if "#" in value and not value.endswith("#"):
                    yield "#" + value.partition("#")[2], pointer
        if isinstance(schema.get("$anchor"), str):
            yield "#" + schema["$anchor"], pointer
        for key, value in schema.items():
            if key not in ("enum", "const", "default", "examples"):
                yield from _ids(value, f"{pointer}/{_escape_pointer(key)}")
    elif isinstance(schema, list):
        for i, value in enumerate(schema):
            yield from _ids(value, f"{pointer}/{i}")
