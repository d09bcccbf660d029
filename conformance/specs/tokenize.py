"""Properties of byte-level BPE tokenization (see `pyagent_ref/tokenize/bpe.py` for the
contract: `BytePairEncoding.encode`, `decode` and `resolve_special_sets`).

What an implementation provides
-------------------------------

A namespace ``tokenize`` holding one function per vocabulary it can load, named like the
vocabulary: ``embedded``, ``llama3``, ``cl100k_base`` (`conformance.bpe_corpus` says where
their files come from). Each takes no argument and returns an *encoding*; the suite calls
it often, so it should cache. An encoding has two methods, called with these keywords:

    encode(text: str, *, allowed_special: "all" | AbstractSet[str],
           disallowed_special: "all" | AbstractSet[str]) -> list[int]
    decode(ids: Sequence[int]) -> str

tiktoken's ``Encoding`` and the reference's `BytePairEncoding` are such objects as they
are. A vocabulary the implementation cannot load is left out, or declared in
``CONFORMANCE_MISSING`` (``"tokenize.cl100k_base": reason``): the vocabulary is the "op"
of the report (``tokenize.llama3.round_trips_the_corpus``).

`pyagent_ref` and `pyagent_accel` keep BPE as a class, ``<package>.tokenize.bpe.
BytePairEncoding``; for a target with such a class the namespace is built from its
constructors (`namespace_of_bpe_class`): ``from_tokenizer_json`` for the embedded model's
and Llama 3's ``tokenizer.json``, ``from_tiktoken`` for the cl100k_base ranks.

The properties
--------------

Round trip (``decode(encode(text)) == text`` for every str without lone surrogates), ids
identical to the reference on the corpus and on generated text, the three fates of a
special token in the text (allowed: its id; disallowed: ValueError; in neither set:
ordinary text), decode of any ids (their bytes joined, each maximal invalid UTF-8
sequence one U+FFFD), and the error classes of bad input. Expected ids of special tokens,
token bytes and the special-token list are the vocabulary's data, read from the
reference's encoding.

They run with ``--array numpy`` only (tokenization takes no arrays), and a vocabulary
whose files are not installed is skipped with the command that installs them.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from hypothesis import strategies as st

from .. import bpe_corpus
from ..bpe_corpus import VOCABULARIES
from ..core import REFERENCE, Case, Ctx, Spec, SuiteError


@functools.cache
def namespace_of_bpe_class(target: str) -> SimpleNamespace | None:
    """The ``tokenize`` namespace of a target that keeps BPE the way the reference does, as
    the class ``<target>.tokenize.bpe.BytePairEncoding`` (pyagent_ref, pyagent_accel): one
    cached loader per vocabulary, calling the class's constructor for the vocabulary's
    published form. None for a target without that module."""
    name = f"{target}.tokenize.bpe"
    try:
        module = importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name is None or not name.startswith(exc.name):
            raise  # the module exists but something it imports does not
        return None
    cls = module.BytePairEncoding

    def embedded() -> Any:
        return cls.from_tokenizer_json(bpe_corpus.embedded_tokenizer_json())

    def llama3() -> Any:
        return cls.from_tokenizer_json(bpe_corpus.llama3_tokenizer_json())

    def cl100k_base() -> Any:
        config = bpe_corpus.cl100k_config()
        return cls.from_tiktoken(
            config["mergeable_ranks"], config["pat_str"], config["special_tokens"]
        )

    loaders = {"embedded": embedded, "llama3": llama3, "cl100k_base": cl100k_base}
    return SimpleNamespace(**{v: functools.cache(load) for v, load in loaders.items()})


def not_run_here(vocabulary: str, array: str) -> str | None:
    """Why the properties of `vocabulary` are skipped in this run, or None."""
    if array != "numpy":
        return "tokenization takes no arrays: its properties run with --array numpy"
    return bpe_corpus.not_installed(vocabulary)


spec = Spec("tokenize", VOCABULARIES, namespace=namespace_of_bpe_class, not_run_here=not_run_here)


def reference(vocabulary: str) -> Any:
    """The reference's encoding of `vocabulary` (its data is the vocabulary's data)."""
    return getattr(namespace_of_bpe_class(REFERENCE), vocabulary)()


def encoding(ctx: Ctx, vocabulary: str) -> Any:
    """The implementation's encoding of `vocabulary`."""
    return ctx.fn(vocabulary)()


@functools.cache
def special_ids(vocabulary: str) -> dict[str, int]:
    """Special token text -> id, in the vocabulary."""
    ref = reference(vocabulary)
    return {text: ref.added_tokens[text].id for text in sorted(ref.special_tokens)}


def each_vocabulary(
    given: Callable[[str], Any] | None = None, *, differential: bool = False
) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Decorator: declare ``func(ctx, vocabulary[, case])`` a property of every vocabulary,
    driven by the strategy ``given(vocabulary)`` if given."""

    def deco(func: Callable[..., None]) -> Callable[..., None]:
        for vocabulary in VOCABULARIES:

            @functools.wraps(func)
            def prop(ctx: Ctx, *case: Any, vocabulary: str = vocabulary) -> None:
                func(ctx, vocabulary, *case)

            strategy = None if given is None else given(vocabulary)
            spec.add(vocabulary, prop, strategy, differential=differential)
        return func

    return deco


# --- strategies -----------------------------------------------------------------------------

NONE: frozenset[str] = frozenset()
SPECIALS_AS_IDS = ("all", "all")
SPECIALS_AS_TEXT = (NONE, NONE)
"""(allowed_special, disallowed_special) for text whose special tokens become their ids, and
for text whose special tokens are ordinary text."""


def specials(vocabulary: str) -> Any:
    """The text of one of the vocabulary's special tokens."""
    return st.deferred(lambda: st.sampled_from(sorted(special_ids(vocabulary))))


def texts(vocabulary: str) -> Any:
    """Text made of `bpe_corpus.FRAGMENTS`, the vocabulary's special tokens and short random
    text; or any text (no lone surrogate: hypothesis draws none)."""
    piece = st.one_of(
        st.sampled_from(bpe_corpus.FRAGMENTS), specials(vocabulary), st.text(max_size=3)
    )
    return st.one_of(st.lists(piece, max_size=25).map("".join), st.text(max_size=40))


@st.composite
def text_cases(draw: Any, vocabulary: str) -> Case:
    """A text and the special sets it is encoded with (special tokens as ids, or as text)."""
    allowed, disallowed = draw(st.sampled_from((SPECIALS_AS_IDS, SPECIALS_AS_TEXT)))
    return Case(
        text=draw(texts(vocabulary)), allowed_special=allowed, disallowed_special=disallowed
    )


@st.composite
def special_cases(draw: Any, vocabulary: str) -> Case:
    """Text with one of the vocabulary's special tokens between two texts."""
    before = draw(texts(vocabulary))
    special = draw(specials(vocabulary))
    return Case(before=before, special=special, after=draw(texts(vocabulary)))


@st.composite
def two_special_cases(draw: Any, vocabulary: str) -> Case:
    """As `special_cases`, and a second, different special token."""
    case = draw(special_cases(vocabulary))
    other = draw(specials(vocabulary).filter(lambda token: token != case.special))
    return Case(before=case.before, special=case.special, after=case.after, other=other)


def id_sequences(vocabulary: str) -> Any:
    """Ids mixing any tokens with single bytes, most of them cutting a character apart or
    not UTF-8 at all: random bytes, and characters without their last byte."""

    def build() -> Any:
        ref = reference(vocabulary)
        byte_ids = [ref.vocab[bytes([b])] for b in range(256)]
        every_id = sorted({*ref.vocab.values(), *(t.id for t in ref.added_tokens.values())})
        as_ids = lambda data: [byte_ids[b] for b in data]  # noqa: E731
        part = st.one_of(
            st.binary(min_size=1, max_size=4).map(as_ids),
            st.text(min_size=1, max_size=2).map(lambda t: as_ids(t.encode("utf-8")[:-1])),
            st.lists(st.sampled_from(every_id), min_size=1, max_size=3),
        )
        return st.lists(part, max_size=6).map(lambda parts: [i for p in parts for i in p])

    return st.deferred(build)


# --- helpers --------------------------------------------------------------------------------


def encode(enc: Any, text: Any, allowed: Any, disallowed: Any) -> list[int]:
    """``enc.encode`` with the special sets, checked to return a list of ints."""
    ids = enc.encode(text, allowed_special=allowed, disallowed_special=disallowed)
    assert isinstance(ids, list), f"encode returned {type(ids).__name__}, not a list"
    bad = [i for i in ids if isinstance(i, bool) or not isinstance(i, int)]
    assert not bad, f"encode returned non-int ids {bad[:3]}"
    return ids


def first_difference(got: list[int], want: list[int], vocabulary: str) -> str:
    """Where two id lists part, with the text of the expected ids there."""
    at = next((i for i, (g, w) in enumerate(zip(got, want, strict=False)) if g != w), None)
    at = min(len(got), len(want)) if at is None else at
    ref = reference(vocabulary)
    offset = len(ref.decode(want[:at]))
    near = ref.decode(want[at : at + 4])
    return (
        f"ids differ from id {at} (text offset {offset}, {near!r}): got {got[at : at + 5]}, "
        f"expected {want[at : at + 5]} ({len(got)} vs {len(want)} ids)"
    )


@functools.cache
def reference_corpus_ids(vocabulary: str) -> dict[str, list[int]]:
    """The reference's ids of each corpus text, every special token allowed."""
    ref = reference(vocabulary)
    return {name: encode(ref, text, *SPECIALS_AS_IDS) for name, text in bpe_corpus.corpus().items()}


def call(enc: Any, method: str, args: tuple[Any, ...]) -> Any:
    """``enc.decode(*args)``, or `encode` with ``args = (text, allowed, disallowed)``."""
    return encode(enc, *args) if method == "encode" else enc.decode(*args)


def raised(enc: Any, method: str, args: tuple[Any, ...]) -> BaseException | None:
    """The exception `call` raises, or None."""
    try:
        call(enc, method, args)
    except Exception as exc:  # noqa: BLE001 - the class is what is being checked
        return exc
    return None


def check_raises(
    expected: type[Exception], ctx: Ctx, vocabulary: str, method: str, *args: Any
) -> None:
    """The implementation's `call` raises `expected`, as the reference's does."""
    what = f"{method}({', '.join(map(repr, args))})"
    ref_exc = raised(reference(vocabulary), method, args)
    if not isinstance(ref_exc, expected):
        raise SuiteError(
            f"the reference raises {type(ref_exc).__name__ if ref_exc else 'nothing'} for "
            f"{what}, the suite expects {expected.__name__}"
        )
    exc = raised(encoding(ctx, vocabulary), method, args)
    assert exc is not None, f"{what}: nothing raised, expected {expected.__name__}"
    assert isinstance(exc, expected), (
        f"{what}: raised {type(exc).__name__}({exc}), expected {expected.__name__}"
    )


# ================================================================================ round trip


@each_vocabulary()
def round_trips_the_corpus(ctx: Ctx, vocabulary: str) -> None:
    """decode(encode(text)) == text on each corpus text (stdlib sources, the Unicode stress
    text), every special token allowed."""
    enc = encoding(ctx, vocabulary)
    for name, text in bpe_corpus.corpus().items():
        back = enc.decode(encode(enc, text, *SPECIALS_AS_IDS))
        if back != text:
            pairs = enumerate(zip(back, text, strict=False))
            at = next((i for i, (a, b) in pairs if a != b), min(len(back), len(text)))
            raise AssertionError(
                f"{name}: decode(encode(text)) differs at character {at}: "
                f"{back[at : at + 20]!r}, text {text[at : at + 20]!r}"
            )


@each_vocabulary(text_cases)
def round_trips_generated_text(ctx: Ctx, vocabulary: str, case: Case) -> None:
    """decode(encode(text)) == text for any text without lone surrogates, its special tokens
    encoded as their ids or as text."""
    enc = encoding(ctx, vocabulary)
    ids = encode(enc, case.text, case.allowed_special, case.disallowed_special)
    back = enc.decode(ids)
    assert back == case.text, f"decode(encode(text)) = {back!r} (ids {ids})"


# ================================================================= identical ids (differential)


@each_vocabulary(differential=True)
def matches_reference_on_the_corpus(ctx: Ctx, vocabulary: str) -> None:
    """The ids of each corpus text equal the reference's, every special token allowed."""
    enc = encoding(ctx, vocabulary)
    for name, text in bpe_corpus.corpus().items():
        got, want = encode(enc, text, *SPECIALS_AS_IDS), reference_corpus_ids(vocabulary)[name]
        assert got == want, f"{name}: {first_difference(got, want, vocabulary)}"


@each_vocabulary(text_cases, differential=True)
def matches_reference_on_generated_text(ctx: Ctx, vocabulary: str, case: Case) -> None:
    """The ids of generated text equal the reference's, special tokens as ids or as text."""
    sets = (case.allowed_special, case.disallowed_special)
    got = encode(encoding(ctx, vocabulary), case.text, *sets)
    want = encode(reference(vocabulary), case.text, *sets)
    assert got == want, first_difference(got, want, vocabulary)


# ============================================================================= special tokens


@each_vocabulary(special_cases)
def allowed_special_tokens_become_their_ids(ctx: Ctx, vocabulary: str, case: Case) -> None:
    """With allowed_special="all", a special token in the text is its id, and the text on
    either side is encoded on its own: encode(a + s + b) = encode(a) + [id(s)] + encode(b)."""
    enc = encoding(ctx, vocabulary)
    got = encode(enc, case.before + case.special + case.after, *SPECIALS_AS_IDS)
    want = [
        *encode(enc, case.before, *SPECIALS_AS_IDS),
        special_ids(vocabulary)[case.special],
        *encode(enc, case.after, *SPECIALS_AS_IDS),
    ]
    assert got == want, f"got {got}, expected {want}"


@each_vocabulary(two_special_cases)
def only_the_allowed_special_tokens_become_ids(ctx: Ctx, vocabulary: str, case: Case) -> None:
    """With allowed_special={s} (and nothing disallowed), s becomes its id and another special
    token o is ordinary text: encode(a + s + b + o) = encode(a) + [id(s)] + encode(b + o)."""
    enc = encoding(ctx, vocabulary)
    sets = (frozenset({case.special}), NONE)
    got = encode(enc, case.before + case.special + case.after + case.other, *sets)
    want = [
        *encode(enc, case.before, *sets),
        special_ids(vocabulary)[case.special],
        *encode(enc, case.after + case.other, *sets),
    ]
    assert got == want, f"got {got}, expected {want}"
    assert special_ids(vocabulary)[case.other] not in got, f"{case.other!r} became its id: {got}"


@each_vocabulary(special_cases)
def disallowed_special_tokens_raise_value_error(ctx: Ctx, vocabulary: str, case: Case) -> None:
    """A disallowed special token in the text raises ValueError: disallowed_special="all"
    (every special token not allowed) or naming it."""
    text = case.before + case.special + case.after
    others = frozenset(special_ids(vocabulary)) - {case.special}
    for allowed, disallowed in ((NONE, "all"), (NONE, frozenset({case.special})), (others, "all")):
        check_raises(ValueError, ctx, vocabulary, "encode", text, allowed, disallowed)


@each_vocabulary(special_cases)
def special_tokens_in_neither_set_are_ordinary_text(ctx: Ctx, vocabulary: str, case: Case) -> None:
    """With nothing allowed or disallowed, special tokens in the text are ordinary text: no id
    of a special token, and decode gives the text back."""
    enc = encoding(ctx, vocabulary)
    text = case.before + case.special + case.after
    ids = encode(enc, text, *SPECIALS_AS_TEXT)
    specials_found = sorted(set(ids) & set(special_ids(vocabulary).values()))
    assert not specials_found, f"ids of special tokens {specials_found} in {ids}"
    assert enc.decode(ids) == text, f"decode(encode(text)) = {enc.decode(ids)!r}"


# ==================================================================================== decode


@each_vocabulary(id_sequences)
def decode_joins_token_bytes_replacing_invalid_utf8(ctx: Ctx, vocabulary: str, ids: Any) -> None:
    """decode(ids) is the tokens' bytes joined and decoded as UTF-8, each maximal invalid or
    incomplete sequence replaced by one U+FFFD (bytes.decode(errors="replace"))."""
    token_bytes = reference(vocabulary).token_bytes(ids)
    want = b"".join(token_bytes).decode("utf-8", errors="replace")
    got = encoding(ctx, vocabulary).decode(ids)
    assert got == want, f"decode gave {got!r}, expected {want!r} (bytes {b''.join(token_bytes)!r})"


@each_vocabulary()
def decode_rejects_ids_of_no_token(ctx: Ctx, vocabulary: str) -> None:
    """An id outside the vocabulary (negative, vocab_size or more, or in a gap of the ids)
    raises ValueError."""
    ref = reference(vocabulary)
    used = {*ref.vocab.values(), *(t.id for t in ref.added_tokens.values())}
    gaps = [i for i in range(ref.vocab_size) if i not in used][:1]
    for bad in (-1, ref.vocab_size, ref.vocab_size + 1000, *gaps):
        check_raises(ValueError, ctx, vocabulary, "decode", [0, bad])


@each_vocabulary()
def decode_rejects_non_int_ids(ctx: Ctx, vocabulary: str) -> None:
    """Ids that are not a sequence of ints (a bool, a str or a float id; a str or None for
    the sequence) raise TypeError."""
    for bad in ([True], [0, "1"], [1.0], "12", None):
        check_raises(TypeError, ctx, vocabulary, "decode", bad)


# ============================================================================== encode errors


@each_vocabulary()
def encode_rejects_non_str(ctx: Ctx, vocabulary: str) -> None:
    """Text that is not a str (bytes, None, an int, a list of str) raises TypeError."""
    for bad in (b"hello", None, 42, ["hello"]):
        check_raises(TypeError, ctx, vocabulary, "encode", bad, *SPECIALS_AS_TEXT)


@each_vocabulary()
def encode_rejects_lone_surrogates(ctx: Ctx, vocabulary: str) -> None:
    """Text with a lone surrogate (which UTF-8 cannot encode) raises ValueError."""
    for bad in ("\ud800", "a\udfffb", "😀\ud83d"):
        check_raises(ValueError, ctx, vocabulary, "encode", bad, *SPECIALS_AS_TEXT)


@each_vocabulary()
def encode_rejects_invalid_special_sets(ctx: Ctx, vocabulary: str) -> None:
    """A special set naming a token that is not special raises ValueError; one that is
    neither "all" nor a set of str (a single token's str, None) raises TypeError."""
    unknown, special = frozenset({"<|not a special token|>"}), next(iter(special_ids(vocabulary)))
    for expected, allowed, disallowed in (
        (ValueError, unknown, NONE),
        (ValueError, NONE, unknown),
        (TypeError, special, "all"),
        (TypeError, None, "all"),
    ):
        check_raises(expected, ctx, vocabulary, "encode", "text", allowed, disallowed)
