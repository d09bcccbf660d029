"""Independent re-derivations of the specification, used as test oracles.

Nothing here imports `pyagent_ref`: each function is written again from the docstrings
(and the published standards they cite), in plain Python integers and numpy float64,
so that a property comparing an implementation with an oracle is a second opinion,
not the reference checking itself. `conformance.selftest` checks the oracles against
the published known-answer vectors (Random123 for Philox, RFC 8949 Appendix A for CBOR).
"""

from __future__ import annotations

import hashlib
import math
from typing import Any

import numpy as np

# --- Philox-4x32-10 (Salmon, Moraes, Dror, Shaw: "Parallel random numbers: as easy as
# 1, 2, 3", SC'11), on Python ints -------------------------------------------------------

_M0, _M1 = 0xD2511F53, 0xCD9E8D57
_W0, _W1 = 0x9E3779B9, 0xBB67AE85
_U32 = (1 << 32) - 1

#: Random123 known-answer vectors for philox4x32_10: (counter, key) -> output words.
PHILOX_KAT = (
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    (
        (_U32, _U32, _U32, _U32),
        (_U32, _U32),
        (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD),
    ),
    (
        (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
        (0xA4093822, 0x299F31D0),
        (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1),
    ),
)


def philox4x32_10(counter: tuple[int, int, int, int], key: tuple[int, int]) -> tuple[int, ...]:
    """Ten Philox-4x32 rounds on Python ints (the textbook form of the bijection)."""
    x = list(counter)
    k0, k1 = key
    for rnd in range(10):
        if rnd:
            k0, k1 = (k0 + _W0) & _U32, (k1 + _W1) & _U32
        p0, p1 = _M0 * x[0], _M1 * x[2]
        x = [(p1 >> 32) ^ x[1] ^ k0, p1 & _U32, (p0 >> 32) ^ x[3] ^ k1, p0 & _U32]
    return tuple(x)


def philox_uniform_row(seed: int, position: int, num: int) -> list[float]:
    """The `num` uniforms of one row, bit for bit as `sampling.philox_uniform` specifies."""
    seed &= (1 << 64) - 1  # the two's-complement bit pattern of an int64 seed
    key = (seed & _U32, seed >> 32)
    out: list[float] = []
    for j in range((num + 1) // 2):
        x = philox4x32_10((j & _U32, j >> 32, position & _U32, position >> 32), key)
        for lo, hi in ((x[0], x[1]), (x[2], x[3])):
            m = ((hi << 32) | lo) >> 12
            out.append(math.ldexp(2 * m + 1, -53))
    return out[:num]


def philox_uniform(seeds: Any, positions: Any, num: int) -> np.ndarray:
    """`philox_uniform_row` for every row, as a float64 (batch, num) array."""
    rows = [philox_uniform_row(int(s), int(p), num) for s, p in zip(seeds, positions, strict=True)]
    return np.array(rows, dtype=np.float64).reshape(len(rows), num)


def race_scores(logits_row: np.ndarray, u_row: np.ndarray) -> np.ndarray:
    """Exponential-race scores in float64: logits - log(-log(u)); -inf stays -inf."""
    x = np.asarray(logits_row, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        return x - np.log(-np.log(np.asarray(u_row, dtype=np.float64)))


# --- softmax helpers ----------------------------------------------------------------------


def probs64(row: np.ndarray) -> np.ndarray:
    """softmax of one row in float64 (exp(x - max) / sum, the sum taken with fsum)."""
    x = np.asarray(row, dtype=np.float64)
    e = np.exp(x - np.max(x))
    return e / math.fsum(e.tolist())


def logsumexp64(row: np.ndarray) -> float:
    """log(sum(exp(row))) of one row in float64, accurately (fsum)."""
    x = np.asarray(row, dtype=np.float64)
    mx = float(np.max(x))
    if mx == -math.inf:
        return -math.inf
    return mx + math.log(math.fsum(np.exp(x - mx).tolist()))


def surprisal64(row: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """(q, p, H) of one row in float64: q = log_softmax (x - logsumexp, -inf for -inf
    entries), p = exp(q), and the entropy H = -sum p * q over the tokens with p > 0 (fsum)."""
    x = np.asarray(row, dtype=np.float64)
    q = x - logsumexp64(x)
    p = np.exp(q)
    live = p > 0
    return q, p, -math.fsum((p[live] * q[live]).tolist())


def ngram_bans(tokens: list[int], n: int) -> set[int]:
    """The tokens v for which tokens + [v] would end with an n-gram already in `tokens`."""
    if n <= 0 or len(tokens) < n:
        return set()
    tail = tokens[len(tokens) - n + 1 :]
    return {tokens[i + n - 1] for i in range(len(tokens) - n + 1) if tokens[i : i + n - 1] == tail}


def dry_repeats(tokens: list[int], breakers: set[int]) -> dict[int, int]:
    """DRY by brute force: token v -> the longest n such that the last n tokens, none of
    them a breaker, followed by v occur earlier in `tokens` (v not a breaker, n >= 1)."""
    size = len(tokens)
    longest: dict[int, int] = {}
    for i in range(size - 1):  # an earlier occurrence ends at i, followed by tokens[i + 1]
        follower, n = tokens[i + 1], 0
        while n <= i and tokens[i - n] == tokens[size - 1 - n] and tokens[i - n] not in breakers:
            n += 1
        if n and follower not in breakers:
            longest[follower] = max(longest.get(follower, 0), n)
    return longest


def bad_word_bans(tokens: list[int], words: list[list[int]]) -> set[int]:
    """The last token of each non-empty word whose other tokens end `tokens`."""
    banned = set()
    for word in words:
        prefix = word[:-1]
        if word and len(prefix) <= len(tokens) and tokens[len(tokens) - len(prefix) :] == prefix:
            banned.add(word[-1])
    return banned


# --- prompt lookup (spec_decode.propose_ngram), read literally ------------------------------


def ngram_proposal(tokens: list[Any], num: int, lookup_min: int, lookup_max: int) -> list[Any]:
    """Prompt lookup by brute force: for L = lookup_max down to lookup_min, the latest j
    with tokens[j : j + L] equal to the last L tokens and j + L < n (an earlier occurrence,
    followed by a token); the first such (L, j) gives tokens[j + L : j + L + num]. [] when
    no n-gram matches. Quadratic at worst; ids are compared with ==."""
    n = len(tokens)
    for length in range(lookup_max, lookup_min - 1, -1):
        suffix = tokens[n - length :]
        for j in range(n - length - 1, -1, -1):
            if tokens[j] == suffix[0] and tokens[j : j + length] == suffix:
                return tokens[j + length : j + length + num]
    return []


# --- deterministic CBOR (RFC 8949 section 4.2.1), written independently --------------------


def cbor(value: Any) -> bytes:
    """Deterministic CBOR of int / bytes / str / list / tuple (shortest heads)."""

    def head(major: int, arg: int) -> bytes:
        if arg < 0 or arg >= 1 << 64:
            raise ValueError(f"argument {arg} does not fit in 64 bits")
        if arg <= 23:
            return bytes([(major << 5) + arg])
        for extra, width in ((24, 1), (25, 2), (26, 4), (27, 8)):
            if arg < 1 << (8 * width):
                return bytes([(major << 5) + extra]) + arg.to_bytes(width, "big")
        raise AssertionError("unreachable")

    if type(value) is int:
        return head(0, value) if value >= 0 else head(1, -(value + 1))
    if isinstance(value, (bytes, bytearray)):
        return head(2, len(value)) + bytes(value)
    if isinstance(value, str):
        data = value.encode("utf-8")
        return head(3, len(data)) + data
    if isinstance(value, (list, tuple)):
        return head(4, len(value)) + b"".join(cbor(item) for item in value)
    raise TypeError(type(value).__name__)


def cbor_decode(data: bytes) -> Any:
    """Decode deterministic CBOR, raising ValueError on a non-shortest head or trailing bytes.

    Arrays decode to lists, byte strings to bytes, text strings to str.
    """

    def item(i: int) -> tuple[Any, int]:
        if i >= len(data):
            raise ValueError("truncated")
        major, info = data[i] >> 5, data[i] & 31
        i += 1
        if info < 24:
            arg = info
        elif info in (24, 25, 26, 27):
            width = 1 << (info - 24)
            if i + width > len(data):
                raise ValueError("truncated head")
            arg = int.from_bytes(data[i : i + width], "big")
            i += width
            smallest = 24 if width == 1 else 1 << (4 * width)
            if arg < smallest:
                raise ValueError(f"non-shortest head: {arg} in {width} bytes")
        else:
            raise ValueError(f"additional info {info} is not deterministic CBOR")
        if major == 0:
            return arg, i
        if major == 1:
            return -1 - arg, i
        if major in (2, 3):
            if i + arg > len(data):
                raise ValueError("truncated string")
            raw = data[i : i + arg]
            return (bytes(raw) if major == 2 else raw.decode("utf-8")), i + arg
        if major == 4:
            out = []
            for _ in range(arg):
                value, i = item(i)
                out.append(value)
            return out, i
        raise ValueError(f"major type {major} is not used by the encoding")

    value, end = item(0)
    if end != len(data):
        raise ValueError(f"{len(data) - end} trailing bytes")
    return value


#: RFC 8949 Appendix A examples within the encoding's domain (value, hex of the bytes).
RFC8949_EXAMPLES: tuple[tuple[Any, str], ...] = (
    (0, "00"),
    (1, "01"),
    (10, "0a"),
    (23, "17"),
    (24, "1818"),
    (25, "1819"),
    (100, "1864"),
    (1000, "1903e8"),
    (1000000, "1a000f4240"),
    (1000000000000, "1b000000e8d4a51000"),
    (18446744073709551615, "1bffffffffffffffff"),
    (-18446744073709551616, "3bffffffffffffffff"),
    (-1, "20"),
    (-10, "29"),
    (-100, "3863"),
    (-1000, "3903e7"),
    (b"", "40"),
    (b"\x01\x02\x03\x04", "4401020304"),
    ("", "60"),
    ("a", "6161"),
    ("IETF", "6449455446"),
    ('"\\', "62225c"),
    ("\u00fc", "62c3bc"),
    ("\u6c34", "63e6b0b4"),
    ("\U00010151", "64f0908591"),
    ([], "80"),
    ([1, 2, 3], "83010203"),
    ([1, [2, 3], [4, 5]], "8301820203820405"),
    (list(range(1, 26)), "98190102030405060708090a0b0c0d0e0f101112131415161718181819"),
)


def digest(data: bytes, algorithm: str) -> bytes:
    """H of the hashing spec: SHA-256, or XXH3-128 as 16 big-endian bytes."""
    if algorithm == "sha256":
        return hashlib.sha256(data).digest()
    if algorithm == "xxh3_128":
        import xxhash

        return xxhash.xxh3_128_intdigest(data).to_bytes(16, "big")
    raise ValueError(algorithm)


ROOT_LABEL = "pyagent.prefix-cache.v1"


def root_hash(algorithm: str) -> bytes:
    """H(cbor("pyagent.prefix-cache.v1"))."""
    return digest(cbor(ROOT_LABEL), algorithm)


def hash_block(parent: bytes, tokens: list[int], keys: list[Any], algorithm: str) -> bytes:
    """H(cbor([parent, tokens, [list(key) for key in keys]]))."""
    return digest(cbor([bytes(parent), list(tokens), [list(k) for k in keys]]), algorithm)
