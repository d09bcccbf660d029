"""Properties of token matchers: the allowed-token masks of structured output.

A request constrained by a JSON Schema, a regex or a grammar is decoded through a
*matcher*: before each step it fills the bitmask of the tokens allowed next (the layout of
`ops.structured`), and it advances by the token drawn. pyagent_ref's `GrammarMatcher`,
llguidance's ``LLMatcher`` and xgrammar's ``GrammarMatcher`` are such matchers; this spec
holds them to one contract.

What an implementation provides
-------------------------------

A namespace ``matcher`` with one compiler per kind of constraint (the "ops" of the
report), each taking the constraint and the name of a vocabulary
(`matcher_corpus.MATCHER_VOCABULARIES`: its tokenizer.json says what the token ids are):

    json_schema(schema: dict | bool, vocabulary: str) -> CompiledConstraint
    regex(pattern: str, vocabulary: str) -> CompiledConstraint
    grammar(gbnf: str, vocabulary: str) -> CompiledConstraint

A compiler raises an exception (of any class) for a constraint it does not take.
``compiled.matcher()`` returns a fresh `TokenMatcher` at the start of an output:

    fill_next_token_bitmask(bitmask, index=0)   row `index` of an int32 numpy array of
                                                shape (batch, ceil(vocab / 32)), in place
    accept_token(token_id) -> bool
    is_terminated() -> bool
    rollback(num_tokens) -> None

`TokenBackend` is the same thing as one object per vocabulary (what the adapters and the
benchmark build). pyagent_ref and pyagent_accel keep the compiler as the package
``<target>.structured`` (`StructuredPackage`, the namespace `namespace_of_structured_package`
derives from it).

The contract
------------

The *language* of a constraint is a set of byte strings: for ``json_schema`` the JSON
texts of the schema's valid instances with JSON's whitespace (``[ \\t\\n\\r]*``) at each
place JSON allows it, none around the whole value (LLGuidance's default, and what
MaskBench's ``", "`` separators need); for ``regex`` the strings the pattern matches as a
whole; for ``grammar`` the sentences of the GBNF text's ``root`` rule. A token's bytes
are its spelling in the vocabulary; special tokens have none, and ``EOS_TOKEN[vocabulary]``
ends the output. After the tokens accepted so far, with bytes ``p``:

- token t (not EOS) is allowed iff ``p + bytes(t)`` is a prefix of a string of the
  language; EOS is allowed iff ``p`` is in the language; once EOS is accepted the matcher
  is terminated and nothing is allowed;
- the mask has bit ``t % 32`` of word ``t // 32`` set iff t is allowed, for every t of
  the vocabulary (the row's other bits, past the vocabulary, are clear); no other row
  of the bitmask changes;
- ``accept_token(t)`` is True and advances iff t is allowed, and is False and changes
  nothing otherwise;
- ``rollback(n)`` undoes the last n accepted tokens (an undone EOS un-terminates).

The properties
--------------

Each runs over the constraints of its kind in `matcher_corpus` (for ``json_schema``, the
MaskBench slice in ``conformance/data/maskbench``, or the MaskBench files of the directory
named by the environment variable ``CONFORMANCE_MASKBENCH``, those the reference
compiles, spread over it when ``CONFORMANCE_MASKBENCH_LIMIT`` bounds their number: an
exploration, which may find more than the divergences registered from the slice), on the
``embedded`` vocabulary (4,096
tokens, so that the reference's masks take milliseconds): constraints compile; valid
instances are accepted token by token and then end; invalid ones are refused somewhere;
the mask agrees with ``accept_token`` on probed tokens; termination; rollback restores
earlier masks; the fill writes one row; and, differentially, the masks along every
instance allow exactly the tokens the reference allows (two properties: none it refuses,
every one it allows). A constraint an implementation does not compile fails
``compiles_every_constraint`` and is left out of its other properties. They run with
``--array numpy`` (the matchers fill numpy bitmasks; each adapter converts for its
library).
"""

from __future__ import annotations

import functools
import importlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any, Protocol

import numpy as np

from .. import matcher_corpus as corpus
from ..core import REFERENCE, Ctx, Spec
from ..matcher_corpus import Constraint, Instance

KINDS = ("json_schema", "regex", "grammar")
VOCABULARY = "embedded"
"""The vocabulary the properties run on."""

PROBES = 4
"""Tokens of each side of the mask (allowed, refused) that `mask_agrees_with_accept_token`
offers to accept_token at each step, besides the instance's own token and EOS."""


# ============================================================================ the interface


class TokenMatcher(Protocol):
    """One output's matcher (the contract is the module docstring's)."""

    def fill_next_token_bitmask(self, bitmask: Any, index: int = 0) -> None: ...

    def accept_token(self, token_id: int) -> bool: ...

    def is_terminated(self) -> bool: ...

    def rollback(self, num_tokens: int) -> None: ...


class CompiledConstraint(Protocol):
    """A compiled constraint: makes fresh matchers."""

    def matcher(self) -> TokenMatcher: ...


class TokenBackend(Protocol):
    """The compilers of one implementation for one vocabulary."""

    def json_schema(self, schema: Any) -> CompiledConstraint: ...

    def regex(self, pattern: str) -> CompiledConstraint: ...

    def grammar(self, gbnf: str) -> CompiledConstraint: ...


def namespace_of_backends(backend: Callable[[str], TokenBackend]) -> SimpleNamespace:
    """The ``matcher`` namespace of an implementation whose ``backend(vocabulary)`` returns
    its `TokenBackend` for that vocabulary (called once per vocabulary)."""
    cached = functools.cache(backend)

    def json_schema(schema: Any, vocabulary: str) -> CompiledConstraint:
        return cached(vocabulary).json_schema(schema)

    def regex(pattern: str, vocabulary: str) -> CompiledConstraint:
        return cached(vocabulary).regex(pattern)

    def grammar(gbnf: str, vocabulary: str) -> CompiledConstraint:
        return cached(vocabulary).grammar(gbnf)

    return SimpleNamespace(json_schema=json_schema, regex=regex, grammar=grammar)


class StructuredPackage:
    """The `TokenBackend` of a package that keeps the compiler as pyagent_ref does, in
    ``<target>.structured``: `json_schema_grammar` (JSON's whitespace, its default),
    `Terminal.regex`, `compile_grammar`, each a `Grammar`; a matcher is a
    `GrammarMatcher` over an `EarleyParser` of it and the vocabulary's `TokenTrie`."""

    def __init__(self, structured: ModuleType, vocabulary: str) -> None:
        self.structured = structured
        self.trie = structured.TokenTrie(corpus.token_bytes(vocabulary))
        self.eos_token_ids = [corpus.eos_token_id(vocabulary)]

    def json_schema(self, schema: Any) -> _CompiledGrammar:
        return _CompiledGrammar(self, self.structured.json_schema_grammar(schema))

    def regex(self, pattern: str) -> _CompiledGrammar:
        s = self.structured
        return _CompiledGrammar(self, s.Grammar({"root": ((s.Terminal.regex(pattern),),)}, "root"))

    def grammar(self, gbnf: str) -> _CompiledGrammar:
        return _CompiledGrammar(self, self.structured.compile_grammar(gbnf))


class _CompiledGrammar:
    def __init__(self, package: StructuredPackage, grammar: Any) -> None:
        self.package, self.grammar = package, grammar

    def matcher(self) -> Any:
        s = self.package.structured
        return s.GrammarMatcher(
            s.EarleyParser(self.grammar), self.package.trie, self.package.eos_token_ids
        )


@functools.cache
def namespace_of_structured_package(target: str) -> SimpleNamespace | None:
    """The ``matcher`` namespace of a target whose compiler is ``<target>.structured``
    (pyagent_ref, pyagent_accel), or None for a target without that package."""
    name = f"{target}.structured"
    try:
        module = importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name is None or not name.startswith(exc.name):
            raise  # the package exists but something it imports does not
        return None
    return namespace_of_backends(lambda vocabulary: StructuredPackage(module, vocabulary))


def not_run_here(kind: str, array: str) -> str | None:
    """Why the properties of `kind` are skipped in this run, or None."""
    if array != "numpy":
        return "the matchers fill numpy bitmasks: their properties run with --array numpy"
    return None


spec = Spec("matcher", KINDS, namespace=namespace_of_structured_package, not_run_here=not_run_here)


# ================================================================================== helpers


@functools.cache
def constraints(kind: str) -> tuple[Constraint, ...]:
    """The constraints the properties of `kind` run over."""
    if kind != "json_schema":
        return {"regex": corpus.REGEX_CONSTRAINTS, "grammar": corpus.GRAMMAR_CONSTRAINTS}[kind]
    directory = os.environ.get("CONFORMANCE_MASKBENCH")
    if directory is None:
        return tuple(corpus.load_maskbench())
    limit = os.environ.get("CONFORMANCE_MASKBENCH_LIMIT")
    found = corpus.load_maskbench(Path(directory), int(limit) if limit else None)
    return tuple(c for c in found if reference_compiles(c.source))


def reference_compiles(schema: Any) -> bool:
    """Whether the reference compiles `schema` (the properties run on the schemas it does)."""
    try:
        namespace_of_structured_package(REFERENCE).json_schema(schema, VOCABULARY)
    except (ValueError, RecursionError):  # SchemaError, RegexError...: a refusal
        return False
    return True


def compiled(ctx: Ctx, kind: str) -> Iterator[tuple[Constraint, Any]]:
    """(constraint, compiled) for each constraint of `kind` the implementation compiles
    (`compiles_every_constraint` reports the others)."""
    for constraint in constraints(kind):
        try:
            yield constraint, ctx.fn(kind)(constraint.source, VOCABULARY)
        except Exception:  # noqa: BLE001 - a refusal is compiles_every_constraint's finding
            continue


def words() -> int:
    return -(-corpus.vocab_size(VOCABULARY) // 32)


def allowed(matcher: Any) -> frozenset[int]:
    """The ids the matcher's mask allows now, filled into a row that starts all set (so a
    fill that only sets bits shows)."""
    bitmask = np.full((1, words()), -1, np.int32)
    matcher.fill_next_token_bitmask(bitmask, 0)
    bits = np.unpackbits(bitmask.view(np.uint8), axis=1, bitorder="little")[0]
    ids = np.flatnonzero(bits)
    size = corpus.vocab_size(VOCABULARY)
    past = ids[ids >= size]
    assert past.size == 0, f"the mask sets bits past the vocabulary of {size}: {past[:5].tolist()}"
    return frozenset(ids.tolist())


def tokens(instance: Instance) -> list[int]:
    return corpus.encode(VOCABULARY, instance.text)


def eos() -> int:
    return corpus.eos_token_id(VOCABULARY)


def spelled(ids: Any) -> list[str]:
    """Token ids as their bytes (or <id> for a special token), for messages."""
    table = corpus.token_bytes(VOCABULARY)
    return [repr(table[i]) if table[i] is not None else f"<{i}>" for i in sorted(ids)[:8]]


def where(constraint: Constraint, index: int, ids: list[int], step: int) -> str:
    """A step of an instance, for messages: its name and the text accepted so far."""
    table = corpus.token_bytes(VOCABULARY)
    done = b"".join(table[i] or b"" for i in ids[:step])
    return f"{constraint.name} instance {index}, token {step} (after {done[-40:]!r})"


def walk(matcher: Any, ids: list[int]) -> int | None:
    """Accept `ids` in order; the position of the first refused one, or None."""
    for step, token in enumerate(ids):
        if not matcher.accept_token(token):
            return step
    return None


@functools.cache
def reference_masks(kind: str, name: str, index: int) -> tuple[frozenset[int], ...]:
    """The reference's masks along instance `index` of constraint `name`: before each token
    until the reference refuses one (that mask included), and before EOS when it takes
    them all."""
    constraint = next(c for c in constraints(kind) if c.name == name)
    backend = namespace_of_structured_package(REFERENCE)
    matcher = getattr(backend, kind)(constraint.source, VOCABULARY).matcher()
    masks = []
    for token in tokens(constraint.instances[index]):
        masks.append(allowed(matcher))
        if not matcher.accept_token(token):
            return tuple(masks)
    masks.append(allowed(matcher))
    return tuple(masks)


def differential_walk(ctx: Ctx, kind: str, check: Callable[[frozenset, frozenset, str], None]):
    """Walk every instance with the implementation and the reference; `check(mine, ref,
    where)` the masks at each step, while the reference takes the instance's tokens."""
    for constraint, compiled_constraint in compiled(ctx, kind):
        for index, instance in enumerate(constraint.instances):
            ids = tokens(instance)
            matcher = compiled_constraint.matcher()
            for step, ref in enumerate(reference_masks(kind, constraint.name, index)):
                check(allowed(matcher), ref, where(constraint, index, ids, step))
                if step == len(ids) or not matcher.accept_token(ids[step]):
                    break


def each_kind(
    *, differential: bool = False
) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Decorator: declare ``func(ctx, kind)`` a property of every kind of constraint."""

    def deco(func: Callable[..., None]) -> Callable[..., None]:
        for kind in KINDS:

            @functools.wraps(func)
            def prop(ctx: Ctx, kind: str = kind) -> None:
                func(ctx, kind)

            spec.add(kind, prop, differential=differential)
        return func

    return deco


# ============================================================================== compilation


@each_kind()
def compiles_every_constraint(ctx: Ctx, kind: str) -> None:
    """Every constraint of the corpus compiles (the reference compiles them all)."""
    refused = []
    for constraint in constraints(kind):
        try:
            ctx.fn(kind)(constraint.source, VOCABULARY)
        except Exception as exc:  # noqa: BLE001 - the refusal is the finding
            refused.append(f"{constraint.name}: {type(exc).__name__}: {str(exc)[:120]}")
    assert not refused, f"{len(refused)} constraints refused: {'; '.join(refused)}"


# ================================================================================ instances


@each_kind()
def accepts_valid_instances(ctx: Ctx, kind: str) -> None:
    """The tokens of a valid instance are accepted one by one, then EOS, which terminates
    the matcher (which was not terminated before)."""
    for constraint, compiled_constraint in compiled(ctx, kind):
        for index, instance in enumerate(constraint.instances):
            if not instance.valid:
                continue
            ids, matcher = tokens(instance), compiled_constraint.matcher()
            refused = walk(matcher, ids)
            assert refused is None, f"{where(constraint, index, ids, refused)}: refused"
            assert not matcher.is_terminated(), f"{constraint.name} {index}: terminated before EOS"
            assert matcher.accept_token(eos()), f"{constraint.name} {index}: EOS refused at the end"
            assert matcher.is_terminated(), f"{constraint.name} {index}: not terminated by EOS"


@each_kind()
def rejects_invalid_instances(ctx: Ctx, kind: str) -> None:
    """An invalid instance is refused: one of its tokens, or EOS after the last."""
    for constraint, compiled_constraint in compiled(ctx, kind):
        for index, instance in enumerate(constraint.instances):
            if instance.valid:
                continue
            matcher = compiled_constraint.matcher()
            ended = walk(matcher, tokens(instance)) is None and matcher.accept_token(eos())
            assert not ended, f"{constraint.name} instance {index} accepted: {instance.text!r}"


@each_kind()
def mask_agrees_with_accept_token(ctx: Ctx, kind: str) -> None:
    """At each step of every instance, accept_token(t) is True exactly for the tokens the
    mask allows, probed on the instance's token, EOS and a few allowed and refused tokens
    (an accepted probe is rolled back); a refused token changes nothing."""
    for constraint, compiled_constraint in compiled(ctx, kind):
        for index, instance in enumerate(constraint.instances):
            ids, matcher = tokens(instance), compiled_constraint.matcher()
            for step in range(len(ids) + 1):
                mask = allowed(matcher)
                here = where(constraint, index, ids, step)
                for token in probes(mask, ids[step] if step < len(ids) else eos()):
                    took = matcher.accept_token(token)
                    assert took == (token in mask), (
                        f"{here}: accept_token({token} = {spelled([token])[0]}) is {took}, "
                        f"the mask {'allows' if token in mask else 'refuses'} it"
                    )
                    if took:
                        matcher.rollback(1)
                if step == len(ids) or not matcher.accept_token(ids[step]):
                    break


def probes(mask: frozenset[int], token: int) -> list[int]:
    """The instance's `token`, EOS, and up to `PROBES` allowed and `PROBES` refused ids spread
    over the vocabulary."""
    size = corpus.vocab_size(VOCABULARY)
    chosen = [token, eos()]
    inside = sorted(mask)
    chosen += inside[:: max(1, len(inside) // PROBES)][:PROBES]
    spread = range(0, size, max(1, size // (8 * PROBES)))
    chosen += [t for t in spread if t not in mask][:PROBES]
    return list(dict.fromkeys(chosen))


@each_kind()
def terminates_only_by_eos(ctx: Ctx, kind: str) -> None:
    """A matcher is terminated exactly after accepting EOS; then its mask is empty and
    it refuses every token, EOS included."""
    for constraint, compiled_constraint in compiled(ctx, kind):
        for index, instance in enumerate(constraint.instances):
            if not instance.valid:
                continue
            ids, matcher = tokens(instance), compiled_constraint.matcher()
            for step, token in enumerate(ids):
                assert not matcher.is_terminated(), f"{where(constraint, index, ids, step)}"
                matcher.accept_token(token)
            assert matcher.accept_token(eos()) and matcher.is_terminated(), (
                f"{constraint.name} instance {index}: EOS did not terminate"
            )
            mask = allowed(matcher)
            assert not mask, (
                f"{constraint.name} {index}: terminated, the mask allows {spelled(mask)}"
            )
            for token in (eos(), ids[0]):
                assert not matcher.accept_token(token), (
                    f"{constraint.name} {index}: terminated, accept_token({token}) is True"
                )


@each_kind()
def rollback_restores_earlier_masks(ctx: Ctx, kind: str) -> None:
    """After a valid instance and EOS, rollback(1) un-terminates with the mask before EOS,
    rolling back half the tokens gives the mask there, and rolling back the rest the
    initial one; the tokens are then accepted again."""
    for constraint, compiled_constraint in compiled(ctx, kind):
        for index, instance in enumerate(constraint.instances):
            if not instance.valid:
                continue
            ids, matcher = tokens(instance), compiled_constraint.matcher()
            masks = []
            for token in ids:
                masks.append(allowed(matcher))
                assert matcher.accept_token(token), f"{constraint.name} {index}: refused {token}"
            masks.append(allowed(matcher))
            assert matcher.accept_token(eos()), f"{constraint.name} {index}: EOS refused"
            position = len(ids) + 1
            for back in (1, len(ids) // 2, len(ids) - len(ids) // 2):
                matcher.rollback(back)
                position -= back
                here = f"{constraint.name} instance {index}, rolled back to token {position}"
                assert not matcher.is_terminated(), f"{here}: still terminated"
                mask = allowed(matcher)
                assert mask == masks[position], (
                    f"{here}: the mask allows {spelled(mask - masks[position])} more and "
                    f"{spelled(masks[position] - mask)} fewer than it did there"
                )
            refused = walk(matcher, ids)
            assert refused is None, f"{constraint.name} {index}: refused token {refused} again"


@each_kind()
def fills_only_its_row(ctx: Ctx, kind: str) -> None:
    """fill_next_token_bitmask(bitmask, index) writes row `index` only: the mask of a fresh
    matcher lands in row 1 of a 3-row bitmask, the other rows keep their words."""
    for constraint, compiled_constraint in compiled(ctx, kind):
        matcher = compiled_constraint.matcher()
        expected = allowed(matcher)
        bitmask = np.full((3, words()), 0x5A5A5A5A, np.int32)
        matcher.fill_next_token_bitmask(bitmask, 1)
        assert (bitmask[[0, 2]] == 0x5A5A5A5A).all(), f"{constraint.name}: rows 0 or 2 changed"
        bits = np.unpackbits(bitmask[1:2].view(np.uint8), axis=1, bitorder="little")[0]
        assert frozenset(np.flatnonzero(bits).tolist()) == expected, (
            f"{constraint.name}: row 1 differs from the mask filled alone"
        )


# ============================================================================= differential


@each_kind(differential=True)
def allows_no_token_the_reference_refuses(ctx: Ctx, kind: str) -> None:
    """Along every instance (while the reference takes its tokens), the mask allows no
    token the reference's mask refuses."""

    def check(mine: frozenset, ref: frozenset, here: str) -> None:
        extra = mine - ref
        assert not extra, (
            f"{here}: allows {len(extra)} tokens the reference refuses: {spelled(extra)}"
        )

    differential_walk(ctx, kind, check)


@each_kind(differential=True)
def allows_every_token_the_reference_allows(ctx: Ctx, kind: str) -> None:
    """Along every instance (while the reference takes its tokens), the mask allows every
    token the reference's mask allows."""

    def check(mine: frozenset, ref: frozenset, here: str) -> None:
        lost = ref - mine
        assert not lost, f"{here}: refuses {len(lost)} tokens the reference allows: {spelled(lost)}"

    differential_walk(ctx, kind, check)
