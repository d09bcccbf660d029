"""StopChecker: streamed output equals the single-shot truncation; nothing is retracted."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pyagent_ref.tokenize import StopChecker, find_stop

from .helpers import single_shot

SETTINGS = settings(max_examples=200, deadline=None)
# A small alphabet so that stop strings occur, overlap and share prefixes often.
ALPHABET = "abc é😀"


def longest_held_tail(pending: str, stop: list[str]) -> int:
    """Brute force: the longest suffix of `pending` that is a proper prefix of a stop string."""
    best = 0
    for k in range(1, len(pending) + 1):
        if any(len(s) > k and s.startswith(pending[-k:]) for s in stop):
            best = k
    return best


@st.composite
def split_text(draw):
    text = draw(st.text(ALPHABET, max_size=30))
    cuts = sorted(draw(st.lists(st.integers(0, len(text)), max_size=10)))
    bounds = [0, *cuts, len(text)]
    return text, [text[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]


stop_lists = st.lists(st.text(ALPHABET, min_size=1, max_size=4), max_size=4)


@SETTINGS
@given(split=split_text(), stop=stop_lists, include=st.booleans())
def test_streaming_equals_single_shot(split, stop, include):
    text, deltas = split
    checker = StopChecker(stop, include_stop_str_in_output=include)
    expected, reason = single_shot(text, stop, include)
    emitted = fed = ""
    for delta in deltas:
        unreturned = fed[len(emitted) :] + delta
        fed += delta
        result = checker.update(delta)
        emitted += result.text
        assert expected.startswith(emitted)  # nothing emitted is ever retracted
        assert checker.output_text == emitted
        if result.finished:
            assert reason is not None
            assert result.stop_reason == reason
            break
        # Hold back exactly what a stop string could still need, and nothing else.
        hold = 0 if include else longest_held_tail(unreturned, stop)
        assert len(emitted) == len(fed) - hold
        assert checker.held_back == fed[len(emitted) :]
        assert hold <= max((len(s) for s in stop), default=1) - 1
    else:
        emitted += checker.finish()
        assert reason is None
    assert emitted == expected
    assert checker.finished


@SETTINGS
@given(text=st.text(ALPHABET, max_size=30), stop=stop_lists, include=st.booleans())
def test_find_stop_agrees_with_brute_force(text, stop, include):
    hit = find_stop(text, stop)
    expected, reason = single_shot(text, stop, include)
    if hit is None:
        assert reason is None and expected == text
    else:
        begin, end, s = hit
        assert text[begin:end] == s == reason
        assert expected == (text[:end] if include else text[:begin])


def test_stop_string_across_deltas():
    checker = StopChecker(["</answer>"])
    assert checker.update("The answer is 42<") == ("The answer is 42", False, None)
    assert checker.held_back == "<"
    assert checker.update("/ans") == ("", False, None)
    assert checker.update("wer> and more") == ("", True, "</answer>")
    assert checker.output_text == "The answer is 42"


def test_include_stop_string_truncates_after_it():
    checker = StopChecker(["STOP"], include_stop_str_in_output=True)
    assert checker.update("go ST") == ("go ST", False, None)  # nothing held back
    assert checker.update("OP and beyond") == ("OP", True, "STOP")
    assert checker.output_text == "go STOP"


def test_first_completed_stop_string_wins():
    # "c" completes before "abcd" could: a streaming checker stops at "c".
    checker = StopChecker(["abcd", "c"])
    assert checker.update("xab") == ("x", False, None)
    assert checker.update("cd") == ("ab", True, "c")
    # At the same end, the longer one (starting first) wins, whatever the list order.
    assert StopChecker(["bc", "abc"]).update("xabc") == ("x", True, "abc")


def test_hold_back_only_a_possible_prefix():
    checker = StopChecker(["stop"])
    assert checker.update("a toast, ") == ("a toast, ", False, None)
    assert checker.update("st") == ("", False, None)
    assert checker.update("ar") == ("star", False, None)


def test_stop_token_ids():
    checker = StopChecker(["END"], stop_token_ids=[7, 9])
    assert checker.is_stop_token(9) and not checker.is_stop_token(8)
    assert checker.update("text E", token_id=8) == ("text ", False, None)
    # The stop token releases what was held, since no stop string can complete now.
    assert checker.update("", token_id=9) == ("E", True, 9)
    assert checker.stop_reason == 9
    with pytest.raises(ValueError, match=r"update called after the request stopped \(9\)"):
        checker.update("x")
    # A stop string completed by the same delta wins over the token.
    assert StopChecker(["END"], [7]).update("xEND", token_id=7) == ("x", True, "END")


def test_finish_releases_the_held_text():
    checker = StopChecker(["###"])
    assert checker.update("a ##") == ("a ", False, None)
    assert checker.finish() == "##"
    assert checker.finish() == ""
    assert checker.finished and checker.stop_reason is None


def test_bad_arguments():
    with pytest.raises(TypeError, match="stop must be a list of str, got the str 'x'"):
        StopChecker("x")
    with pytest.raises(ValueError, match=r"stop\[1\] must not be empty"):
        StopChecker(["a", ""])
    with pytest.raises(TypeError, match=r"stop\[0\] must be a str, got 3"):
        StopChecker([3])
    with pytest.raises(ValueError, match=r"stop_token_ids\[0\] must be >= 0, got -1"):
        StopChecker([], [-1])
    with pytest.raises(TypeError, match=r"stop_token_ids\[0\] must be an int"):
        StopChecker([], ["2"])
    with pytest.raises(TypeError, match="delta must be a str, got bytes"):
        StopChecker(["a"]).update(b"a")
