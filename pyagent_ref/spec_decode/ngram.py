"""Prompt lookup (n-gram) proposals: continue the sequence the way it went before.

Code edits, summaries and multi-turn chats repeat long stretches of their prompt. If the
last few tokens already occurred earlier in prompt + output, the tokens that followed
them then are a good guess for what follows now, and costs nothing to propose.
"""

from __future__ import annotations

from collections.abc import Sequence

from .config import SpeculativeConfig


def z_function(seq: Sequence[int]) -> list[int]:
    """z[i] = the length of the longest common prefix of seq and seq[i:] (z[0] = len(seq)).

    Linear time (Gusfield's Z-algorithm): [left, right) is the rightmost window known to
    equal a prefix of seq; inside it z[i] starts from the value already computed at
    i - left, and only comparisons past `right` are new, and each moves `right` forward.
    """
    n = len(seq)
    z = [0] * n
    if n:
        z[0] = n
    left = right = 0
    for i in range(1, n):
        if i < right:
            z[i] = min(right - i, z[i - left])
        while i + z[i] < n and seq[z[i]] == seq[i + z[i]]:
            z[i] += 1
        if i + z[i] > right:
            left, right = i, i + z[i]
    return z


def propose_ngram(
    token_ids: Sequence[int],
    num_speculative_tokens: int,
    prompt_lookup_min: int,
    prompt_lookup_max: int,
) -> list[int]:
    """The tokens that followed the latest earlier occurrence of the longest matching suffix.

    With s = token_ids (prompt + output so far, n tokens): an n-gram of length L matches
    at j if s[j : j + L] == s[n - L : n] and j + L < n (an earlier occurrence, followed
    by at least one token; it may overlap the suffix). The proposal uses the largest L in
    [prompt_lookup_min, prompt_lookup_max] that matches anywhere and, among its matches,
    the most recent one (the largest j); it is s[j + L : j + L + num_speculative_tokens],
    so between 1 and num_speculative_tokens tokens (fewer when the match is close to the
    end). No match (or n <= prompt_lookup_min) proposes nothing: [].

    Linear time in n: on the reversed sequence r, a match of length >= L ending at
    e = j + L - 1 in s is a common prefix of r and r[n - 1 - e:], which `z_function`
    measures for every e at once.

    Raises ValueError / TypeError as `SpeculativeConfig` does for the three settings.
    """
    SpeculativeConfig("ngram", num_speculative_tokens, prompt_lookup_min, prompt_lookup_max)
    s = list(token_ids)
    n = len(s)
    z = z_function(s[::-1])
    best_length, best_end = 0, -1
    for i in range(1, n):  # i = n - 1 - e: e runs from the newest end position down
        length = min(z[i], prompt_lookup_max)
        if length >= prompt_lookup_min and length > best_length:
            best_length, best_end = length, n - 1 - i
    if best_end < 0:
        return []
    return s[best_end + 1 : best_end + 1 + num_speculative_tokens]


class NgramProposer:
    """Proposes drafts by prompt lookup with a `SpeculativeConfig`'s settings."""

    def __init__(self, config: SpeculativeConfig):
        if config.method != "ngram":
            raise ValueError(f"NgramProposer needs method 'ngram', got {config.method!r}")
        self.config = config

    def propose(self, token_ids: Sequence[int]) -> list[int]:
        """`propose_ngram` of the request's prompt + output tokens (at most
        num_speculative_tokens drafts, maybe none)."""
        c = self.config
        return propose_ngram(
            token_ids, c.num_speculative_tokens, c.prompt_lookup_min, c.prompt_lookup_max
        )
