"""Algorithms on token sequences that more than one ops module uses (private).

`z_function` measures, for every end position of a sequence at once, how long a suffix
it shares with the whole sequence (on the reversed sequence): prompt lookup
(`spec_decode.propose_ngram`) and DRY (`sampling.apply_dry`) both ask that question.
"""

from __future__ import annotations


def z_function(seq: list[int]) -> list[int]:
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
