"""Detokenizer and stop checker driven together, one token at a time, as the engine does."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pyagent_ref.tokenize import IncrementalDetokenizer, StopChecker

from .helpers import id_batches, single_shot

SETTINGS = settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def stream_request(tok, ids, *, stop, stop_token_ids, include, skip=True):
    """The per-request loop: returns (streamed pieces, stop reason or "length")."""
    detok = IncrementalDetokenizer(
        tok, skip_special_tokens=skip, spaces_between_special_tokens=False
    )
    checker = StopChecker(stop, stop_token_ids, include_stop_str_in_output=include)
    pieces = []
    for token_id in ids:
        if checker.is_stop_token(token_id):
            # The stop token's own text is part of the output only if asked for; either
            # way the stream ends, so the detokenizer gives up what it holds.
            delta = detok.add_tokens([token_id]) if include else ""
            delta += detok.finish()
        else:
            delta = detok.add_tokens([token_id])
        result = checker.update(delta, token_id=token_id)
        pieces.append(result.text)
        if result.finished:
            return pieces, result.stop_reason
    # Out of tokens (max_tokens): release what both still hold.
    result = checker.update(detok.finish())
    pieces.append(result.text)
    if result.finished:
        return pieces, result.stop_reason
    pieces.append(checker.finish())
    return pieces, "length"


@SETTINGS
@given(data=st.data(), include=st.booleans(), skip=st.booleans())
def test_stream_equals_single_shot(hf_tok, data, include, skip):
    ids = [i for b in data.draw(id_batches(hf_tok)) for i in b]
    stop = data.draw(st.lists(st.text("ab é日😀", min_size=1, max_size=3), max_size=3))
    stop_ids = data.draw(st.sets(st.sampled_from([hf_tok.eos_token_id, *ids[:3]]), max_size=2))
    pieces, reason = stream_request(
        hf_tok, ids, stop=stop, stop_token_ids=stop_ids, include=include, skip=skip
    )
    # Single shot: the ids up to the first stop token (its text only if included), decoded
    # at once, then cut at the first stop string.
    cut = next((k for k, i in enumerate(ids) if i in stop_ids), None)
    kept = ids if cut is None else ids[: cut + 1] if include else ids[:cut]
    text = hf_tok.decode(kept, skip_special_tokens=skip)
    expected, string_reason = single_shot(text, stop, include)
    assert "".join(pieces) == expected
    if string_reason is not None:
        assert reason == string_reason
    else:
        assert reason == ("length" if cut is None else ids[cut])


def test_eos_in_the_middle_of_an_emoji_stream(tiktoken_tok):
    tok = tiktoken_tok
    emoji = [tok.encoding.encode_single_token(bytes([b])) for b in "😀".encode()]
    ids = [*tok.encode("hi "), *emoji[:2], tok.eos_token_id, *tok.encode("never")]
    pieces, reason = stream_request(
        tok, ids, stop=["zz"], stop_token_ids=[tok.eos_token_id], include=False
    )
    assert reason == tok.eos_token_id
    assert "".join(pieces) == "hi \ufffd"  # the cut emoji, as decode would show it


@pytest.mark.parametrize("include", [False, True])
def test_stop_string_split_over_tokens(hf_tok, include):
    ids = hf_tok.encode("Réponse: 日本😀 FIN trop loin", add_special_tokens=False)
    pieces, reason = stream_request(hf_tok, ids, stop=["FIN"], stop_token_ids=[], include=include)
    assert reason == "FIN"
    assert "".join(pieces) == ("Réponse: 日本😀 FIN" if include else "Réponse: 日本😀 ")
