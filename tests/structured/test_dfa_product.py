"""`dfa.intersect` and `dfa.subtract` against Python's `re` on both operands."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from pyagent_ref.structured.dfa import DEAD, compile_regex, intersect, minimize, subtract

PATTERNS = ["a*", "(ab)*", "[ab]{2,3}", "a|b|", "b+a?", "é?a*", ".*a.*", "[^a]*"]


@given(st.sampled_from(PATTERNS), st.sampled_from(PATTERNS), st.text("abé", max_size=5))
def test_product_languages(first, second, text):
    a, b = compile_regex(first), compile_regex(second)
    in_a = re.fullmatch(first, text) is not None
    in_b = re.fullmatch(second, text) is not None
    both, only_a = intersect(a, b), subtract(a, b)
    assert both.match(text.encode()) == (in_a and in_b)
    assert only_a.match(text.encode()) == (in_a and not in_b)
    assert minimize(both) == both and minimize(only_a) == only_a  # already minimal


def test_empty_products_are_dead():
    a, b = compile_regex("a+"), compile_regex("b+")
    assert intersect(a, b).start == DEAD
    assert subtract(a, compile_regex("a*")).start == DEAD
    assert subtract(a, b) == a
