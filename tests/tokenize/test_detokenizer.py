"""IncrementalDetokenizer: deltas add up to the full decode and never split a character."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from pyagent_ref.tokenize import HFTokenizer, IncrementalDetokenizer, TiktokenTokenizer

from .helpers import id_batches

FFFD = "\ufffd"
SETTINGS = settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def spaced_text(tok, ids, skip):
    """text() of the docstring with spaces_between_special_tokens, spelled out by hand."""
    pieces, run = [], []
    for i in ids:
        if i in tok.all_special_ids:
            if skip:
                continue
            if run:
                pieces.append(tok.decode(run))
                run = []
            pieces.append(tok.decode([i]))
        else:
            run.append(i)
    if run:
        pieces.append(tok.decode(run))
    return " ".join(pieces)


def run_stream(tok, batches, **kwargs):
    detok = IncrementalDetokenizer(tok, **kwargs)
    deltas = [detok.add_tokens(batch) for batch in batches]
    assert detok.output_text == "".join(deltas)
    return detok, deltas, detok.finish()


def check_deltas(deltas, rest, full):
    """The contract: the pieces add up; before finish() no delta breaks a character."""
    streamed = "".join(deltas)
    assert streamed + rest == full
    if not full.endswith(FFFD):
        assert rest == ""  # nothing was held back at the end
    position = 0
    for delta in deltas:
        assert full.startswith(delta, position)  # never retracted
        assert not delta.endswith(FFFD)  # a character may still be incomplete there
        for k, char in enumerate(delta):
            if char == FFFD:
                assert full[position + k] == FFFD
        position += len(delta)


@pytest.fixture(params=["hf", "tiktoken"])
def tok(request, hf_tok):
    if request.param == "hf":
        return hf_tok
    return request.getfixturevalue("tiktoken_tok")


@SETTINGS
@given(data=st.data(), skip=st.booleans())
def test_deltas_add_up_to_decode(tok, data, skip):
    batches = data.draw(id_batches(tok))
    ids = [i for b in batches for i in b]
    detok, deltas, rest = run_stream(
        tok, batches, skip_special_tokens=skip, spaces_between_special_tokens=False
    )
    check_deltas(deltas, rest, tok.decode(ids, skip_special_tokens=skip))
    assert detok.output_ids == ids


@SETTINGS
@given(data=st.data(), skip=st.booleans())
def test_spaces_between_special_tokens(tok, data, skip):
    batches = data.draw(id_batches(tok))
    ids = [i for b in batches for i in b]
    _, deltas, rest = run_stream(
        tok, batches, skip_special_tokens=skip, spaces_between_special_tokens=True
    )
    check_deltas(deltas, rest, spaced_text(tok, ids, skip))


@SETTINGS
@given(data=st.data())
def test_prompt_context_does_not_change_byte_level_text(tok, data):
    prompt = [i for b in data.draw(id_batches(tok)) for i in b]
    batches = data.draw(id_batches(tok))
    ids = [i for b in batches for i in b]
    _, deltas, rest = run_stream(
        tok, batches, prompt_ids=prompt, spaces_between_special_tokens=False
    )
    check_deltas(deltas, rest, tok.decode(ids, skip_special_tokens=True))


def test_one_token_at_a_time_holds_a_split_emoji(tiktoken_tok):
    tok = tiktoken_tok
    emoji = "😀".encode()
    byte_ids = [tok.encoding.encode_single_token(bytes([b])) for b in emoji]
    detok = IncrementalDetokenizer(tok)
    assert [detok.add_tokens([i]) for i in tok.encode("ok ")] == list("ok ")
    assert [detok.add_tokens([i]) for i in byte_ids] == ["", "", "", "😀"]
    assert detok.finish() == ""
    assert detok.output_text == "ok 😀"


def test_offsets_of_the_worked_example():
    """The example of docs/tokenize.md: one token per byte, "é" is two tokens."""
    tiktoken = pytest.importorskip("tiktoken")
    enc = tiktoken.Encoding(
        "bytes",
        pat_str=r"\S+|\s+",
        mergeable_ranks={bytes([b]): b for b in range(256)},
        special_tokens={"<eos>": 256},
    )
    tok = TiktokenTokenizer(enc, eos_token="<eos>")
    ids = tok.encode("Hé!")
    assert ids == [72, 195, 169, 33]
    detok = IncrementalDetokenizer(tok)
    steps = []
    for i in [*ids, 256]:
        delta = detok.add_tokens([i])
        steps.append((delta, detok.offsets))
    assert steps == [
        ("H", (0, 1)),
        ("", (0, 1)),  # 0xC3 alone: "H\ufffd" ends with U+FFFD, hold
        ("é", (1, 3)),
        ("!", (3, 4)),
        ("", (3, 4)),  # <eos> is skipped
    ]


def test_unfinished_character_at_the_end_comes_out_of_finish(hf_tok):
    a, lead = hf_tok.backend.token_to_id("a"), hf_tok.backend.token_to_id("ð")  # ð is 0xF0
    detok = IncrementalDetokenizer(hf_tok)
    assert detok.add_tokens([a, lead]) == ""  # a batch is held as a whole
    assert detok.finish() == "a" + FFFD
    detok = IncrementalDetokenizer(hf_tok)
    assert detok.add_tokens([a]) == "a"
    assert detok.add_tokens([lead]) == ""
    assert detok.finish() == FFFD
    assert detok.finish() == ""
    with pytest.raises(ValueError, match="after finish"):
        detok.add_tokens([1])


def test_skip_and_spaces_on_a_known_sequence(hf_tok):
    start, end = hf_tok.encode("<|im_start|><|im_end|>")
    ids = [start, *hf_tok.encode("hé", add_special_tokens=False), end]
    for skip, spaces, expected in [
        (True, True, "hé"),
        (True, False, "hé"),
        (False, False, "<|im_start|>hé<|im_end|>"),
        (False, True, "<|im_start|> hé <|im_end|>"),
    ]:
        detok = IncrementalDetokenizer(
            hf_tok, skip_special_tokens=skip, spaces_between_special_tokens=spaces
        )
        text = "".join(detok.add_tokens([i]) for i in ids) + detok.finish()
        assert text == expected, (skip, spaces)


@pytest.fixture(scope="module")
def sentencepiece_like():
    """A BPE with Metaspace: "▁" marks spaces and the decoder drops a text's first space."""
    tk = Tokenizer(models.BPE(unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Metaspace()
    tk.decoder = decoders.Metaspace()
    trainer = trainers.BpeTrainer(vocab_size=120, special_tokens=["<unk>"], show_progress=False)
    tk.train_from_iterator(["Hello world, hello world again."] * 10, trainer)
    return HFTokenizer(tk)


def test_prompt_context_keeps_the_leading_space(sentencepiece_like):
    tok = sentencepiece_like
    ids = tok.encode("Hello world")
    assert tok.convert_ids_to_tokens(ids) == ["▁Hello", "▁world"]
    with_context = IncrementalDetokenizer(tok, prompt_ids=ids[:1])
    assert with_context.add_tokens(ids[1:]) == " world"
    without = IncrementalDetokenizer(tok)
    assert without.add_tokens(ids[1:]) == "world"


def test_prompt_ending_inside_a_character_is_dropped(tiktoken_tok):
    tok = tiktoken_tok
    lead, *rest = [tok.encoding.encode_single_token(bytes([b])) for b in "é".encode()]
    detok = IncrementalDetokenizer(tok, prompt_ids=[*tok.encode("x"), lead])
    assert detok.add_tokens(rest) == ""  # an orphan continuation byte: U+FFFD, held
    assert detok.add_tokens(tok.encode("!")) == FFFD + "!"  # as decode(output ids) says
    assert tok.decode([*rest, *tok.encode("!")]) == FFFD + "!"


def test_bad_arguments(hf_tok):
    with pytest.raises(ValueError, match="context_tokens must be >= 0, got -1"):
        IncrementalDetokenizer(hf_tok, context_tokens=-1)
    with pytest.raises(TypeError, match="skip_special_tokens must be a bool"):
        IncrementalDetokenizer(hf_tok, skip_special_tokens=None)
    detok = IncrementalDetokenizer(hf_tok)
    with pytest.raises(ValueError, match=r"ids\[1\] = -3 is outside the vocabulary"):
        detok.add_tokens([5, -3])
    assert detok.output_ids == []  # a rejected batch leaves no trace
