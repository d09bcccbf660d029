"""Deliberately wrong implementations: the suite must catch every one of them.

Each mutant is the reference with one op replaced by a plausible bug (the kind a port to
another language or a fast kernel tends to have). `conformance.selftest` runs the op's
properties on each mutant and fails if a mutant survives, which shows that the
properties can fail; it also lists the properties no mutant kills.

A mutant validates its arguments with the reference first (so it raises the right
errors unless the bug is about errors), then computes the wrong answer in numpy and
returns it in the input's library.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import numpy as np

from pyagent_ref.ops import _fp8
from pyagent_ref.ops import attention as A
from pyagent_ref.ops import block_table as BT
from pyagent_ref.ops import gguf as GG
from pyagent_ref.ops import hashing as H
from pyagent_ref.ops import layers as L
from pyagent_ref.ops import lora as LO
from pyagent_ref.ops import moe as M
from pyagent_ref.ops import pooling as P
from pyagent_ref.ops import quant as Q
from pyagent_ref.ops import rope as R
from pyagent_ref.ops import sampling as S
from pyagent_ref.ops import spec_decode as SD
from pyagent_ref.ops import ssm as SS
from pyagent_ref.ops import structured as ST
from pyagent_ref.tokenize import bpe as T

from . import bpe_corpus, contract
from .core import REFERENCE, Impl, library_of, to_numpy

NEG_INF = float("-inf")


@dataclass(frozen=True)
class Mutant:
    name: str
    module: str
    op: str
    bug: str
    fn: Callable[..., Any]


MUTANTS: list[Mutant] = []


def mutant(module: str, op: str, bug: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        MUTANTS.append(Mutant(fn.__name__, module, op, bug, fn))
        return fn

    return deco


def _np(x: Any) -> np.ndarray:
    return np.array(to_numpy(x), copy=True) if hasattr(x, "dtype") else np.asarray(x)


def _back(like: Any, arr: np.ndarray) -> Any:
    """`arr` in the library of `like`."""
    if library_of(like) == "torch":
        import torch

        return torch.from_numpy(np.ascontiguousarray(arr)).to(like.device)
    return arr


def _probs(row: np.ndarray, dtype: Any = np.float64) -> np.ndarray:
    x = row.astype(dtype)
    e = np.exp(x - x.max())
    return e / e.sum()


# --- sampling -------------------------------------------------------------------------------


@mutant("sampling", "apply_temperature", "multiplies by the temperature instead of dividing")
def temperature_multiplies(logits: Any, temperature: Any) -> Any:
    S.apply_temperature(logits, temperature)
    x, t = _np(logits), _np(temperature).astype(_np(logits).dtype)
    return _back(logits, x * np.where(t == 0, 1, t)[:, None])


@mutant("sampling", "apply_temperature", "greedy rows (t = 0) are divided by a tiny temperature")
def temperature_zero_as_tiny(logits: Any, temperature: Any) -> Any:
    S.apply_temperature(logits, temperature)
    x, t = _np(logits), _np(temperature).astype(_np(logits).dtype)
    return _back(logits, x / np.where(t == 0, 1e-2, t)[:, None])


@mutant(
    "sampling", "apply_temperature", "no validation: negative/NaN temperatures are silently fixed"
)
def temperature_unvalidated(logits: Any, temperature: Any) -> Any:
    t = np.abs(_np(temperature).astype(np.float64))
    t = np.where(np.isfinite(t), t, 1.0)
    if t.shape != (_np(logits).shape[0],) or _np(temperature).dtype == bool:
        return S.apply_temperature(logits, temperature)
    return S.apply_temperature(logits, _back(logits, t))


@mutant("sampling", "apply_temperature", "writes the result into the input and returns it")
def temperature_in_place(logits: Any, temperature: Any) -> Any:
    out = S.apply_temperature(logits, temperature)
    logits[...] = out
    return logits


@mutant("sampling", "apply_temperature", "returns float64 for float32 logits")
def temperature_promotes(logits: Any, temperature: Any) -> Any:
    return _back(logits, _np(S.apply_temperature(logits, temperature)).astype(np.float64))


def _keep(logits: Any, keep: np.ndarray) -> Any:
    x = _np(logits)
    return _back(logits, np.where(keep, x, NEG_INF).astype(x.dtype))


@mutant("sampling", "apply_top_k", "keeps exactly k tokens, dropping ties at the k-th by index")
def top_k_drops_ties(logits: Any, k: Any) -> Any:
    S.apply_top_k(logits, k)
    x, k = _np(logits), _np(k)
    keep = np.zeros(x.shape, bool)
    for b, row in enumerate(x):
        kk = row.size if k[b] <= 0 or k[b] >= row.size else int(k[b])
        keep[b, np.argsort(-row, kind="stable")[:kk]] = True
    return _keep(logits, keep)


@mutant("sampling", "apply_top_k", "keeps k + 1 tokens")
def top_k_off_by_one(logits: Any, k: Any) -> Any:
    kk = _np(k).astype(np.int64)
    kk = np.where((kk > 0) & (kk < _np(logits).shape[1]), kk + 1, kk)
    S.apply_top_k(logits, k)
    return S.apply_top_k(logits, _back(logits, kk))


@mutant("sampling", "apply_top_k", "keeps k - 1 tokens")
def top_k_one_short(logits: Any, k: Any) -> Any:
    kk = _np(k).astype(np.int64)
    kk = np.where((kk > 1) & (kk < _np(logits).shape[1]), kk - 1, kk)
    S.apply_top_k(logits, k)
    return S.apply_top_k(logits, _back(logits, kk))


@mutant("sampling", "apply_top_k", "k <= 0 keeps one token instead of disabling the filter")
def top_k_zero_keeps_one(logits: Any, k: Any) -> Any:
    S.apply_top_k(logits, k)
    kk = _np(k).astype(np.int64)
    return S.apply_top_k(logits, _back(logits, np.where(kk <= 0, 1, kk)))


@mutant("sampling", "apply_top_k", "lowers the kept logits by 1")
def top_k_changes_values(logits: Any, k: Any) -> Any:
    out = _np(S.apply_top_k(logits, k))
    return _back(logits, out - 1)


def _top_p(logits: Any, p: Any, dtype: Any = np.float64, extra: int = 0, ties: bool = True) -> Any:
    S.apply_top_p(logits, p)
    x, p = _np(logits), _np(p).astype(np.float64)
    keep = np.ones(x.shape, bool)
    for b, row in enumerate(x):
        if p[b] == 1:
            continue
        probs = _probs(row, dtype)
        order = np.argsort(-probs, kind="stable")
        cum = np.cumsum(probs[order])
        m = min(int(np.sum(cum < p[b])) + 1 + extra, row.size)
        keep[b] = probs >= probs[order[m - 1]] if ties else np.isin(np.arange(row.size), order[:m])
    return _keep(logits, keep)


@mutant("sampling", "apply_top_p", "keeps exactly m tokens, dropping ties with the last one")
def top_p_drops_ties(logits: Any, p: Any) -> Any:
    return _top_p(logits, p, ties=False)


@mutant("sampling", "apply_top_p", "keeps one token more than the smallest set")
def top_p_one_more(logits: Any, p: Any) -> Any:
    return _top_p(logits, p, extra=1)


@mutant("sampling", "apply_top_p", "computes softmax and the cumulative sum in float32")
def top_p_float32(logits: Any, p: Any) -> Any:
    return _top_p(logits, p, dtype=np.float32)


@mutant("sampling", "apply_top_p", "treats p == 1 like any other p (cuts the zero-mass tail)")
def top_p_one_filters(logits: Any, p: Any) -> Any:
    pp = _np(p).astype(np.float64)
    S.apply_top_p(logits, p)
    return _top_p(logits, _back(logits, np.where(pp == 1, 1 - 1e-3, pp)))


@mutant("sampling", "apply_top_p", "adds 0.5 to the kept logits")
def top_p_changes_values(logits: Any, p: Any) -> Any:
    return _back(logits, _np(S.apply_top_p(logits, p)) + 0.5)


@mutant("sampling", "apply_min_p", "compares probabilities with min_p unscaled by the max")
def min_p_unscaled(logits: Any, min_p: Any) -> Any:
    S.apply_min_p(logits, min_p)
    x, m = _np(logits), _np(min_p).astype(np.float64)
    return _keep(logits, np.stack([_probs(row) >= m[b] for b, row in enumerate(x)]))


@mutant("sampling", "apply_min_p", "computes the ratio exp(x - max) in float32")
def min_p_float32(logits: Any, min_p: Any) -> Any:
    S.apply_min_p(logits, min_p)
    x, m = _np(logits).astype(np.float32), _np(min_p).astype(np.float32)
    ratio = np.exp(x - x.max(1, keepdims=True))
    return _keep(logits, ~(ratio < m[:, None]))


@mutant("sampling", "apply_min_p", "masks tokens tied for the max when min_p == 1 (uses <=)")
def min_p_non_strict(logits: Any, min_p: Any) -> Any:
    S.apply_min_p(logits, min_p)
    x, m = _np(logits).astype(np.float64), _np(min_p).astype(np.float64)
    ratio = np.exp(x - x.max(1, keepdims=True))
    keep = ~(ratio <= m[:, None]) | (m[:, None] == 0)
    return _keep(logits, keep)


@mutant("sampling", "apply_min_p", "halves the kept logits")
def min_p_changes_values(logits: Any, min_p: Any) -> Any:
    return _back(logits, _np(S.apply_min_p(logits, min_p)) / 2)


def _penalties(
    logits,
    prompt_ids,
    output_ids,
    r,
    f,
    q,
    *,
    prompt=True,
    count_prompt=False,
    order="rfq",
    wrap=False,
):
    S.apply_penalties(logits, prompt_ids, output_ids, r, f, q)
    x = _np(logits)
    dt = x.dtype
    pid, oid = _np(prompt_ids).astype(np.int64), _np(output_ids).astype(np.int64)
    if wrap:
        pid, oid = pid % x.shape[1], oid % x.shape[1]
    r, f, q = (_np(v).astype(dt)[:, None] for v in (r, f, q))
    c = np.zeros(x.shape, np.int64)
    seen = np.zeros(x.shape, bool)
    for b in range(x.shape[0]):
        for t in oid[b][oid[b] >= 0]:
            c[b, t] += 1
            seen[b, t] = True
        for t in pid[b][pid[b] >= 0]:
            seen[b, t] |= prompt
            c[b, t] += count_prompt
    y = x.copy()
    for step in order:
        if step == "r":
            y = np.where(seen, np.where(y > 0, y / r, y * r), y)
        elif step == "f":
            y = y - f * c.astype(dt)
        else:
            y = y - q * (c > 0).astype(dt)
    return _back(logits, y.astype(dt))


@mutant("sampling", "apply_penalties", "the repetition penalty ignores prompt tokens")
def penalties_ignore_prompt(*args: Any) -> Any:
    return _penalties(*args, prompt=False)


@mutant("sampling", "apply_penalties", "frequency counts include the prompt")
def penalties_count_prompt(*args: Any) -> Any:
    return _penalties(*args, count_prompt=True)


@mutant("sampling", "apply_penalties", "frequency and presence before repetition")
def penalties_wrong_order(*args: Any) -> Any:
    return _penalties(*args, order="fqr")


@mutant("sampling", "apply_penalties", "padding ids wrap around to the end of the vocab")
def penalties_padding_wraps(*args: Any) -> Any:
    return _penalties(*args, wrap=True)


@mutant("sampling", "apply_logit_bias", "a token listed twice gets only its last bias")
def bias_last_wins(logits: Any, token_ids: Any, bias: Any) -> Any:
    S.apply_logit_bias(logits, token_ids, bias)
    x, ids, w = _np(logits), _np(token_ids), _np(bias).astype(np.float64)
    y = x.astype(np.float64)
    for b in range(x.shape[0]):
        last = {int(t): float(w[b, j]) for j, t in enumerate(ids[b]) if t >= 0}
        for t, v in last.items():
            y[b, t] += v
    return _back(logits, y.astype(x.dtype))


@mutant("sampling", "apply_logit_bias", "rounds the bias to float32 before adding it")
def bias_float32(logits: Any, token_ids: Any, bias: Any) -> Any:
    return S.apply_logit_bias(logits, token_ids, _back(logits, _np(bias).astype(np.float32)))


@mutant("sampling", "log_softmax", "computes float64 rows in float32")
def log_softmax_float32(logits: Any) -> Any:
    x = _np(logits)
    out = _np(S.log_softmax(_back(logits, x.astype(np.float32))))
    return _back(logits, out.astype(x.dtype))


@mutant("sampling", "log_softmax", "forgets the normalisation (returns x - max)")
def log_softmax_unnormalised(logits: Any) -> Any:
    S.log_softmax(logits)
    x = _np(logits)
    return _back(logits, x - x.max(1, keepdims=True))


@mutant("sampling", "topk_logprobs", "breaks ties by the higher token id")
def topk_ties_high_id(logprobs: Any, num: int, sampled: Any) -> Any:
    values, ids, chosen, rank = S.topk_logprobs(logprobs, num, sampled)
    x = _np(logprobs)
    order = np.stack(
        [sorted(range(x.shape[1]), key=lambda i: (-x[b, i], -i))[:num] for b in range(x.shape[0])]
    ).reshape(x.shape[0], num)
    return (
        _back(logprobs, np.take_along_axis(x, order, 1)),
        _back(logprobs, order.astype(np.int64)),
        chosen,
        rank,
    )


@mutant("sampling", "topk_logprobs", "rank counts tied tokens as better (>=)")
def topk_rank_non_strict(logprobs: Any, num: int, sampled: Any) -> Any:
    values, ids, chosen, rank = S.topk_logprobs(logprobs, num, sampled)
    x, s = _np(logprobs), _np(sampled).astype(np.int64)
    r = np.array([int(np.sum(x[b] >= x[b, s[b]])) for b in range(x.shape[0])], np.int64)
    return values, ids, chosen, _back(logprobs, r)


def _philox(seeds: Any, positions: Any, num: int, *, swap=False, position=None, closed=False):
    S.philox_uniform(seeds, positions, num)
    from . import oracles

    s = _np(seeds).astype(np.int64) if _np(seeds).dtype != np.uint64 else _np(seeds).view(np.int64)
    pos = _np(positions).astype(np.int64)
    rows = []
    for b in range(s.shape[0]):
        p = int(pos[b]) if position is None else position(b, int(pos[b]))
        seed = int(s[b]) & (2**64 - 1)
        out = []
        for j in range((num + 1) // 2):
            x = oracles.philox4x32_10(
                (j, 0, p & 0xFFFFFFFF, p >> 32), (seed & 0xFFFFFFFF, seed >> 32)
            )
            pairs = ((x[2], x[3]), (x[0], x[1])) if swap else ((x[0], x[1]), (x[2], x[3]))
            for lo, hi in pairs:
                m = ((hi << 32) | lo) >> 12
                out.append(math.ldexp(m, -52) if closed else math.ldexp(2 * m + 1, -53))
        rows.append(out[:num])
    return _back(seeds, np.array(rows, np.float64).reshape(s.shape[0], num))


@mutant("sampling", "philox_uniform", "uses the two halves of each Philox block in the wrong order")
def philox_swapped_halves(seeds: Any, positions: Any, num: int) -> Any:
    return _philox(seeds, positions, num, swap=True)


@mutant("sampling", "philox_uniform", "counts by row index instead of position (batch-dependent)")
def philox_counts_rows(seeds: Any, positions: Any, num: int) -> Any:
    return _philox(seeds, positions, num, position=lambda b, p: b)


@mutant("sampling", "philox_uniform", "maps the 52 bits to [0, 1) (m * 2**-52)")
def philox_closed_interval(seeds: Any, positions: Any, num: int) -> Any:
    return _philox(seeds, positions, num, closed=True)


def _sample(
    logits, temperature, seeds, positions, *, score=None, greedy_last=False, row_seed=False
):
    tokens = _np(S.sample(logits, temperature, seeds, positions))
    x = _np(logits).astype(np.float64)
    t = _np(temperature).astype(np.float64)
    s = _np(seeds)
    if row_seed:
        s = s.astype(np.int64) + np.arange(s.shape[0])
    u = _np(
        S.philox_uniform(
            np.asarray(s).astype(np.int64) if s.dtype != np.uint64 else s,
            _np(positions),
            x.shape[1],
        )
    )
    for b in range(x.shape[0]):
        if t[b] == 0:
            if greedy_last:
                tokens[b] = int(np.flatnonzero(x[b] == x[b].max())[-1])
            continue
        sc = (score or (lambda xb, ub, tb: xb - np.log(-np.log(ub))))(x[b], u[b], t[b])
        tokens[b] = int(np.argmax(sc))
    return _back(logits, tokens.astype(np.int64))


@mutant("sampling", "sample", "adds the uniform instead of Gumbel noise (argmax(x + u))")
def sample_uniform_noise(*args: Any) -> Any:
    return _sample(*args, score=lambda x, u, t: x + u)


@mutant("sampling", "sample", "samples from softmax(2 * logits)")
def sample_sharpened(*args: Any) -> Any:
    return _sample(*args, score=lambda x, u, t: 2 * x - np.log(-np.log(u)))


@mutant("sampling", "sample", "applies the temperature again")
def sample_divides_by_temperature(*args: Any) -> Any:
    return _sample(*args, score=lambda x, u, t: x / t - np.log(-np.log(u)))


@mutant("sampling", "sample", "greedy rows take the last of tied maxima")
def sample_greedy_last_tie(*args: Any) -> Any:
    return _sample(*args, greedy_last=True)


@mutant("sampling", "sample", "mixes the row index into the seed (batch-dependent)")
def sample_row_seeded(*args: Any) -> Any:
    return _sample(*args, row_seed=True)


# --- generic bugs of the logits ops -----------------------------------------------------------


def _in_place(op: Callable[..., Any]) -> Callable[..., Any]:
    def fn(logits: Any, *args: Any) -> Any:
        out = op(logits, *args)
        logits[...] = out
        return logits

    return fn


def _lenient(
    op: Callable[..., Any], arg: int, fix: Callable[[np.ndarray], np.ndarray]
) -> Callable[..., Any]:
    """`op` with argument number `arg` silently repaired instead of rejected."""

    def fn(*args: Any) -> Any:
        args = list(args)
        value = args[arg]
        if hasattr(value, "dtype") and _np(value).dtype.kind in "fiu":
            args[arg] = _back(value, fix(_np(value)))
        return op(*args)

    return fn


for _op, _arg, _fix, _what in (
    (
        "apply_top_p",
        1,
        lambda p: np.clip(np.nan_to_num(p, nan=1.0), 1e-9, 1.0),
        "p outside (0, 1] is clipped",
    ),
    (
        "apply_min_p",
        1,
        lambda m: np.clip(np.nan_to_num(m, nan=0.0), 0.0, 1.0),
        "min_p outside [0, 1] is clipped",
    ),
    (
        "apply_penalties",
        3,
        lambda r: np.where(np.isfinite(r) & (r > 0), r, 1.0),
        "a bad repetition_penalty means 1",
    ),
    (
        "sample",
        1,
        lambda t: np.where(np.isfinite(t) & (t >= 0), t, 0.0),
        "a bad temperature means greedy",
    ),
    (
        "apply_typical_p",
        1,
        lambda p: np.clip(np.nan_to_num(p, nan=1.0), 1e-9, 1.0),
        "typical_p outside (0, 1] is clipped",
    ),
    (
        "apply_epsilon_cutoff",
        1,
        lambda e: np.clip(np.nan_to_num(e, nan=0.0), 0.0, 0.999),
        "epsilon outside [0, 1) is clipped",
    ),
    (
        "apply_eta_cutoff",
        1,
        lambda e: np.clip(np.nan_to_num(e, nan=0.0), 0.0, 0.999),
        "eta outside [0, 1) is clipped",
    ),
    ("apply_no_repeat_ngram", 2, lambda n: np.clip(n, 0, None), "a negative n means 0"),
    (
        "apply_dry",
        3,
        lambda b: np.where(np.isfinite(b) & (b > 1), b, 1.75),
        "a bad base means 1.75",
    ),
    (
        "apply_xtc",
        1,
        lambda t: np.clip(np.nan_to_num(t, nan=0.1), 0.0, 1.0),
        "threshold outside [0, 1] is clipped",
    ),
    ("apply_mirostat", 1, lambda m: np.nan_to_num(m, nan=np.inf), "a NaN mu means +inf"),
    (
        "mirostat_update",
        4,
        lambda e: np.clip(np.nan_to_num(e, nan=0.1), 1e-9, 1.0),
        "eta outside (0, 1] is clipped",
    ),
    ("philox_uniform", 1, lambda p: np.abs(p), "negative positions are made positive"),
    ("topk_logprobs", 2, lambda s: np.clip(s, 0, None), "negative sampled ids are clipped to 0"),
):
    MUTANTS.append(
        Mutant(f"{_op}_lenient", "sampling", _op, _what, _lenient(getattr(S, _op), _arg, _fix))
    )


def _requires_contiguous(op: Callable[..., Any]) -> Callable[..., Any]:
    def fn(logits: Any, *args: Any) -> Any:
        contiguous = (
            logits.is_contiguous() if library_of(logits) == "torch" else logits.flags.c_contiguous
        )
        if not contiguous:
            raise ValueError("logits must be C-contiguous")
        return op(logits, *args)

    return fn


for _op in contract.ops_taking("sampling", "logits", "logprobs"):
    MUTANTS.append(
        Mutant(
            f"{_op}_requires_contiguous",
            "sampling",
            _op,
            "rejects a non-contiguous main array",
            _requires_contiguous(getattr(S, _op)),
        )
    )

for _op in (
    "apply_top_k",
    "apply_top_p",
    "apply_min_p",
    "apply_penalties",
    "apply_logit_bias",
    "apply_typical_p",
    "apply_epsilon_cutoff",
    "apply_eta_cutoff",
    "apply_allowed_token_ids",
    "apply_bad_words",
    "apply_no_repeat_ngram",
    "apply_dry",
    "apply_xtc",
    "apply_mirostat",
    "log_softmax",
):
    MUTANTS.append(
        Mutant(
            f"{_op}_in_place",
            "sampling",
            _op,
            "writes the result into the input and returns it",
            _in_place(getattr(S, _op)),
        )
    )


@mutant("sampling", "apply_temperature", "breaks ties by adding 1e-3 * token index")
def temperature_jitters_ties(logits: Any, temperature: Any) -> Any:
    out = _np(S.apply_temperature(logits, temperature))
    return _back(logits, (out + 1e-3 * np.arange(out.shape[1])).astype(out.dtype))


@mutant("sampling", "apply_penalties", "computes float64 logits in float32")
def penalties_float32(logits: Any, *args: Any) -> Any:
    x = _np(logits)
    out = _np(S.apply_penalties(_back(logits, x.astype(np.float32)), *args))
    return _back(logits, out.astype(x.dtype))


@mutant(
    "sampling",
    "apply_logit_bias",
    "padding id -1 indexes the last token (Python negative indexing)",
)
def bias_padding_indexes_last(logits: Any, token_ids: Any, bias: Any) -> Any:
    S.apply_logit_bias(logits, token_ids, bias)
    x, ids, w = _np(logits), _np(token_ids).astype(np.int64), _np(bias).astype(np.float64)
    y = x.astype(np.float64)
    for b in range(x.shape[0]):
        for j, t in enumerate(ids[b]):
            y[b, t] += w[b, j]
    return _back(logits, y.astype(x.dtype))


@mutant("sampling", "log_softmax", "normalises by the other tokens' mass only")
def log_softmax_excludes_max(logits: Any) -> Any:
    S.log_softmax(logits)
    x = _np(logits).astype(np.float64)
    shifted = x - x.max(1, keepdims=True)
    rest = np.exp(shifted).sum(1, keepdims=True) - 1
    return _back(logits, (shifted - np.log(np.where(rest > 0, rest, 1))).astype(_np(logits).dtype))


@mutant("sampling", "log_softmax", "breaks ties by subtracting 1e-4 * token index")
def log_softmax_jitters_ties(logits: Any) -> Any:
    out = _np(S.log_softmax(logits))
    return _back(logits, (out - 1e-4 * np.arange(out.shape[1])).astype(out.dtype))


@mutant("sampling", "philox_uniform", "returns float32")
def philox_float32(seeds: Any, positions: Any, num: int) -> Any:
    return _back(seeds, _np(S.philox_uniform(seeds, positions, num)).astype(np.float32))


@mutant("sampling", "philox_uniform", "numbers the blocks from the end (the stream depends on num)")
def philox_depends_on_num(seeds: Any, positions: Any, num: int) -> Any:
    u = _np(S.philox_uniform(seeds, positions, 2 * ((num + 1) // 2)))
    blocks = u.reshape(u.shape[0], -1, 2)[:, ::-1, :].reshape(u.shape[0], -1)
    return _back(seeds, np.ascontiguousarray(blocks[:, :num]))


@mutant("sampling", "philox_uniform", "saturates uint64 seeds >= 2**63 to 2**63 - 1")
def philox_saturates_uint64(seeds: Any, positions: Any, num: int) -> Any:
    s = _np(seeds)
    if s.dtype == np.uint64:
        s = np.minimum(s, np.uint64(2**63 - 1)).astype(np.int64)
    return S.philox_uniform(_back(seeds, s), positions, num)


@mutant("sampling", "philox_uniform", "combines the two uniforms of a block with max")
def philox_max_of_halves(seeds: Any, positions: Any, num: int) -> Any:
    u = _np(S.philox_uniform(seeds, positions, num + 1))
    return _back(seeds, np.ascontiguousarray(np.maximum(u[:, :num], u[:, 1 : num + 1])))


@mutant("sampling", "philox_uniform", "advances the positions array in place")
def philox_advances_positions(seeds: Any, positions: Any, num: int) -> Any:
    out = S.philox_uniform(seeds, positions, num)
    positions += 1
    return out


@mutant("sampling", "sample", "replaces -inf by 0 before drawing (nan_to_num)")
def sample_masks_as_zero(logits: Any, temperature: Any, seeds: Any, positions: Any) -> Any:
    S.sample(logits, temperature, seeds, positions)
    x = _np(logits)
    return S.sample(
        _back(logits, np.where(np.isneginf(x), 0, x).astype(x.dtype)), temperature, seeds, positions
    )


@mutant("sampling", "sample", "returns int32 token ids")
def sample_int32(*args: Any) -> Any:
    return _back(args[0], _np(S.sample(*args)).astype(np.int32))


@mutant("sampling", "sample", "overwrites the logits with the race scores")
def sample_scores_in_place(logits: Any, temperature: Any, seeds: Any, positions: Any) -> Any:
    out = S.sample(logits, temperature, seeds, positions)
    logits[...] = logits - 1
    return out


def _typical(
    logits: Any,
    typical_p: Any,
    *,
    key: str = "distance",
    dtype: Any = np.float64,
    ties: bool = True,
    one_disables: bool = True,
) -> Any:
    """apply_typical_p with one thing changed: the order (`key`: distance, reversed or
    surprisal), the dtype, tie handling, or typical_p == 1 not disabling."""
    S.apply_typical_p(logits, typical_p)
    x, mass = _np(logits).astype(dtype), _np(typical_p).astype(np.float64)
    keep = np.ones(x.shape, bool)
    for b, row in enumerate(x):
        if mass[b] == 1 and one_disables:
            continue
        with np.errstate(divide="ignore", invalid="ignore"):
            q = row - row.max() - np.log(np.exp(row - row.max()).sum())
            p = np.exp(q)
            h = -np.sum(np.where(p > 0, p * q, 0))
            d = {"distance": np.abs(-q - h), "reversed": -np.abs(-q - h), "surprisal": -q}[key]
        d = np.where(np.isfinite(row), d, np.inf)
        order = np.argsort(d, kind="stable")
        m = min(int(np.sum(np.cumsum(p[order]) < mass[b])) + 1, row.size)
        if ties:
            keep[b] = d <= d[order[m - 1]]
        else:
            keep[b] = False
            keep[b, order[:m]] = True
    return _keep(logits, keep)


@mutant("sampling", "apply_typical_p", "orders tokens by distance to the entropy descending")
def typical_reversed(logits: Any, typical_p: Any) -> Any:
    return _typical(logits, typical_p, key="reversed")


@mutant("sampling", "apply_typical_p", "orders tokens by surprisal (top-p), not its distance to H")
def typical_by_surprisal(logits: Any, typical_p: Any) -> Any:
    return _typical(logits, typical_p, key="surprisal")


@mutant("sampling", "apply_typical_p", "keeps exactly m tokens, dropping ties with the last one")
def typical_drops_ties(logits: Any, typical_p: Any) -> Any:
    return _typical(logits, typical_p, ties=False)


@mutant("sampling", "apply_typical_p", "computes the entropy and the masses in float32")
def typical_float32(logits: Any, typical_p: Any) -> Any:
    return _typical(logits, typical_p, dtype=np.float32)


@mutant("sampling", "apply_typical_p", "treats typical_p == 1 like any other value")
def typical_one_filters(logits: Any, typical_p: Any) -> Any:
    return _typical(logits, typical_p, one_disables=False)


def _cutoff(
    logits: Any,
    threshold: Any,
    *,
    keep_max: bool = True,
    dtype: Any = np.float64,
) -> Any:
    """Mask p < threshold(row, p, H) (a function), by default sparing the tied maxima."""
    x = _np(logits).astype(dtype)
    keep = np.ones(x.shape, bool)
    for b, row in enumerate(x):
        with np.errstate(divide="ignore", invalid="ignore"):
            q = row - row.max() - np.log(np.exp(row - row.max()).sum())
            p = np.exp(q)
            h = float(-np.sum(np.where(p > 0, p * q, 0)))
        t = threshold(b, h)
        keep[b] = ~(p < t)
        if keep_max:
            keep[b] |= row == row.max()
    return _keep(logits, keep)


@mutant("sampling", "apply_epsilon_cutoff", "may mask the most likely token (no keep-max rule)")
def epsilon_masks_max(logits: Any, epsilon: Any) -> Any:
    S.apply_epsilon_cutoff(logits, epsilon)
    e = _np(epsilon).astype(np.float64)
    return _cutoff(logits, lambda b, h: e[b], keep_max=False)


@mutant("sampling", "apply_epsilon_cutoff", "compares exp(x - max) (min-p's ratio), not p")
def epsilon_on_ratio(logits: Any, epsilon: Any) -> Any:
    S.apply_epsilon_cutoff(logits, epsilon)
    x, e = _np(logits).astype(np.float64), _np(epsilon).astype(np.float64)
    return _keep(logits, ~(np.exp(x - x.max(1, keepdims=True)) < e[:, None]))


@mutant("sampling", "apply_epsilon_cutoff", "computes the probabilities in float32")
def epsilon_float32(logits: Any, epsilon: Any) -> Any:
    S.apply_epsilon_cutoff(logits, epsilon)
    e = _np(epsilon).astype(np.float32)
    return _cutoff(logits, lambda b, h: e[b], dtype=np.float32)


@mutant("sampling", "apply_eta_cutoff", "drops the sqrt: min(eta, eta * exp(-H))")
def eta_without_sqrt(logits: Any, eta: Any) -> Any:
    S.apply_eta_cutoff(logits, eta)
    e = _np(eta).astype(np.float64)
    return _cutoff(logits, lambda b, h: min(e[b], e[b] * math.exp(-h)))


@mutant("sampling", "apply_eta_cutoff", "takes the entropy in bits")
def eta_entropy_in_bits(logits: Any, eta: Any) -> Any:
    S.apply_eta_cutoff(logits, eta)
    e = _np(eta).astype(np.float64)
    return _cutoff(logits, lambda b, h: min(e[b], math.sqrt(e[b]) * math.exp(-h / math.log(2))))


@mutant("sampling", "apply_eta_cutoff", "may mask the most likely token (no keep-max rule)")
def eta_masks_max(logits: Any, eta: Any) -> Any:
    S.apply_eta_cutoff(logits, eta)
    e = _np(eta).astype(np.float64)
    return _cutoff(logits, lambda b, h: min(e[b], math.sqrt(e[b]) * math.exp(-h)), keep_max=False)


def _ban(logits: Any, banned: list[set[int]]) -> Any:
    keep = np.ones(_np(logits).shape, bool)
    for b, ids in enumerate(banned):
        keep[b, sorted(ids)] = False
    return _keep(logits, keep)


def _rows(ids: Any) -> list[list[int]]:
    """Right-padded rows as lists of their leading ids >= 0."""
    out = []
    for row in _np(ids).tolist():
        n = next((i for i, t in enumerate(row) if t < 0), len(row))
        out.append(row[:n])
    return out


@mutant("sampling", "apply_allowed_token_ids", "a row without ids masks every token")
def allowed_empty_row_masks_all(logits: Any, allowed: Any) -> Any:
    S.apply_allowed_token_ids(logits, allowed)
    vocab = _np(logits).shape[1]
    listed = [{t for t in row if t >= 0} for row in _np(allowed).tolist()]
    return _ban(logits, [set(range(vocab)) - ids for ids in listed])


@mutant("sampling", "apply_allowed_token_ids", "padding ids wrap around to the end of the vocab")
def allowed_padding_wraps(logits: Any, allowed: Any) -> Any:
    S.apply_allowed_token_ids(logits, allowed)
    vocab = _np(logits).shape[1]
    banned = []
    for row in _np(allowed).tolist():
        listed = {t % vocab for t in row} if any(t >= 0 for t in row) else set(range(vocab))
        banned.append(set(range(vocab)) - listed)
    return _ban(logits, banned)


def _bad_words(logits: Any, token_ids: Any, bad_words: Any, rule: Callable[..., bool]) -> Any:
    """Ban each sequence's last token where rule(tokens, sequence) holds."""
    S.apply_bad_words(logits, token_ids, bad_words)
    words = _np(bad_words)
    banned = []
    for b, tokens in enumerate(_rows(token_ids)):
        seqs = [s for s in _rows(words[b]) if s] if words.shape[1] else []
        banned.append({s[-1] for s in seqs if rule(tokens, s)})
    return _ban(logits, banned)


@mutant("sampling", "apply_bad_words", "bans where the tokens end with the whole sequence")
def bad_words_full_sequence(logits: Any, token_ids: Any, bad_words: Any) -> Any:
    return _bad_words(
        logits, token_ids, bad_words, lambda t, s: len(s) <= len(t) and t[len(t) - len(s) :] == s
    )


@mutant("sampling", "apply_bad_words", "bans every sequence's last token, prefix or not")
def bad_words_ignore_prefix(logits: Any, token_ids: Any, bad_words: Any) -> Any:
    return _bad_words(logits, token_ids, bad_words, lambda t, s: True)


@mutant("sampling", "apply_bad_words", "matches the prefix anywhere in the tokens, not at the end")
def bad_words_prefix_anywhere(logits: Any, token_ids: Any, bad_words: Any) -> Any:
    def anywhere(t: list[int], s: list[int]) -> bool:
        k = len(s) - 1
        return any(t[i : i + k] == s[:-1] for i in range(len(t) - k + 1))

    return _bad_words(logits, token_ids, bad_words, anywhere)


def _ngrams(logits: Any, token_ids: Any, n: Any, shift: int = 0, last_window: bool = True) -> Any:
    """apply_no_repeat_ngram with n + shift, or without the last window of the row."""
    S.apply_no_repeat_ngram(logits, token_ids, n)
    banned = []
    for tokens, size in zip(_rows(token_ids), _np(n).tolist(), strict=True):
        size = size + shift if size else 0
        ids: set[int] = set()
        if size > 0 and len(tokens) >= size:
            tail = tokens[len(tokens) - size + 1 :]
            stop = len(tokens) - size + (1 if last_window else 0)
            ids = {tokens[i + size - 1] for i in range(stop) if tokens[i : i + size - 1] == tail}
        banned.append(ids)
    return _ban(logits, banned)


@mutant("sampling", "apply_no_repeat_ngram", "matches (n - 1)-grams (off by one in n)")
def ngram_one_short(logits: Any, token_ids: Any, n: Any) -> Any:
    return _ngrams(logits, token_ids, n, shift=-1)


@mutant("sampling", "apply_no_repeat_ngram", "matches (n + 1)-grams (off by one in n)")
def ngram_one_long(logits: Any, token_ids: Any, n: Any) -> Any:
    return _ngrams(logits, token_ids, n, shift=1)


@mutant("sampling", "apply_no_repeat_ngram", "skips the last window of the row")
def ngram_skips_last_window(logits: Any, token_ids: Any, n: Any) -> Any:
    return _ngrams(logits, token_ids, n, last_window=False)


@mutant("sampling", "apply_typical_p", "takes the entropy over the whole batch (batch-dependent)")
def typical_batch_entropy(logits: Any, typical_p: Any) -> Any:
    S.apply_typical_p(logits, typical_p)
    x = _np(logits).astype(np.float64)
    mass = _np(typical_p).astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = x - x.max(1, keepdims=True)
        q = q - np.log(np.exp(q).sum(1, keepdims=True))
        p = np.exp(q)
        h = -np.sum(np.where(p > 0, p * q, 0)) / x.shape[0]  # the batch's mean entropy
    keep = np.ones(x.shape, bool)
    for b in range(x.shape[0]):
        if mass[b] == 1:
            continue
        d = np.where(np.isfinite(x[b]), np.abs(-q[b] - h), np.inf)
        order = np.argsort(d, kind="stable")
        m = min(int(np.sum(np.cumsum(p[b][order]) < mass[b])) + 1, d.size)
        keep[b] = d <= d[order[m - 1]]
    return _keep(logits, keep)


@mutant("sampling", "apply_epsilon_cutoff", "normalises the softmax over the whole batch")
def epsilon_batch_softmax(logits: Any, epsilon: Any) -> Any:
    S.apply_epsilon_cutoff(logits, epsilon)
    x, e = _np(logits).astype(np.float64), _np(epsilon).astype(np.float64)
    z = np.exp(x - x.max())
    p = z / z.sum()
    return _keep(logits, ~(p < e[:, None]) | (x == x.max(1, keepdims=True)))


@mutant("sampling", "apply_epsilon_cutoff", "epsilon 0 falls back to a default of 3e-4")
def epsilon_zero_default(logits: Any, epsilon: Any) -> Any:
    S.apply_epsilon_cutoff(logits, epsilon)
    e = _np(epsilon).astype(np.float64)
    return _cutoff(logits, lambda b, h: e[b] or 3e-4)


@mutant("sampling", "apply_eta_cutoff", "eta 0 falls back to a default of 3e-4")
def eta_zero_default(logits: Any, eta: Any) -> Any:
    S.apply_eta_cutoff(logits, eta)
    e = np.where(_np(eta) == 0, 3e-4, _np(eta)).astype(np.float64)
    return _cutoff(logits, lambda b, h: min(e[b], math.sqrt(e[b]) * math.exp(-h)))


@mutant("sampling", "apply_eta_cutoff", "uses the first row's entropy for every row")
def eta_first_row_entropy(logits: Any, eta: Any) -> Any:
    S.apply_eta_cutoff(logits, eta)
    e = _np(eta).astype(np.float64)
    first: list[float] = []

    def threshold(b: int, h: float) -> float:
        first.append(h) if not first else None
        return min(e[b], math.sqrt(e[b]) * math.exp(-first[0]))

    return _cutoff(logits, threshold)


@mutant("sampling", "apply_allowed_token_ids", "a row without ids allows the ids of any row")
def allowed_union_for_empty_rows(logits: Any, allowed: Any) -> Any:
    S.apply_allowed_token_ids(logits, allowed)
    vocab = _np(logits).shape[1]
    rows = [{t for t in row if t >= 0} for row in _np(allowed).tolist()]
    union = set().union(*rows) or set(range(vocab))
    return _ban(logits, [set(range(vocab)) - (ids or union) for ids in rows])


@mutant("sampling", "apply_allowed_token_ids", "ids >= vocab are ignored, not rejected")
def allowed_ignores_big_ids(logits: Any, allowed: Any) -> Any:
    vocab = _np(logits).shape[1]
    ids = _np(allowed)
    if ids.dtype.kind in "iu":
        ids = np.where(ids >= vocab, -1, ids)
        if ids.ndim == 2 and ids.shape[0] == _np(logits).shape[0]:
            return S.apply_allowed_token_ids(logits, ids)
    return S.apply_allowed_token_ids(logits, allowed)


@mutant("sampling", "apply_bad_words", "matches each row's tokens against every row's sequences")
def bad_words_batch_sequences(logits: Any, token_ids: Any, bad_words: Any) -> Any:
    S.apply_bad_words(logits, token_ids, bad_words)
    words = _np(bad_words)
    every = [s for b in range(words.shape[0]) for s in _rows(words[b]) if s] if words.size else []
    banned = [
        {s[-1] for s in every if len(s) - 1 <= len(t) and t[len(t) - len(s) + 1 :] == s[:-1]}
        for t in _rows(token_ids)
    ]
    return _ban(logits, banned)


@mutant("sampling", "apply_bad_words", "takes a sequence's last token from its last column")
def bad_words_last_column(logits: Any, token_ids: Any, bad_words: Any) -> Any:
    S.apply_bad_words(logits, token_ids, bad_words)
    words = _np(bad_words)
    banned = []
    for b, t in enumerate(_rows(token_ids)):
        ids = set()
        for s in words[b].tolist() if words.shape[2] else []:
            prefix = s[:-1]
            if s[-1] >= 0 and len(prefix) <= len(t) and t[len(t) - len(prefix) :] == prefix:
                ids.add(s[-1])
        banned.append(ids)
    return _ban(logits, banned)


@mutant("sampling", "apply_bad_words", "a token id after padding is ignored, not rejected")
def bad_words_ignore_after_padding(logits: Any, token_ids: Any, bad_words: Any) -> Any:
    words = _np(bad_words)
    if words.dtype.kind in "iu" and words.ndim == 3:
        after = np.cumsum(words < 0, axis=-1) > 0
        bad_words = _back(logits, np.where(after, -1, words))
    return S.apply_bad_words(logits, token_ids, bad_words)


@mutant("sampling", "apply_no_repeat_ngram", "n == 0 bans every seen token, like n == 1")
def ngram_zero_bans_seen(logits: Any, token_ids: Any, n: Any) -> Any:
    S.apply_no_repeat_ngram(logits, token_ids, n)
    ones = _back(logits, np.maximum(_np(n), 1).astype(np.int64))
    return S.apply_no_repeat_ngram(logits, token_ids, ones)


@mutant("sampling", "apply_no_repeat_ngram", "uses the batch's largest n for every enabled row")
def ngram_batch_max(logits: Any, token_ids: Any, n: Any) -> Any:
    S.apply_no_repeat_ngram(logits, token_ids, n)
    sizes = _np(n).astype(np.int64)
    same = np.where(sizes > 0, sizes.max(initial=0), 0)
    return S.apply_no_repeat_ngram(logits, token_ids, _back(logits, same))


# --- hashing --------------------------------------------------------------------------------


def _cbor_long_heads(value: Any) -> bytes:
    """CBOR whose small arguments (< 24) take a 1-byte extension instead of the head."""

    def head(major: int, n: int) -> bytes:
        if n < 256:
            return bytes([major << 5 | 24, n])
        return H._head(major, n)

    if isinstance(value, bool):
        raise TypeError("bool")
    if isinstance(value, int):
        H.cbor_encode(value)
        return head(0, value) if value >= 0 else head(1, -1 - value)
    if isinstance(value, (bytes, bytearray)):
        return head(2, len(value)) + bytes(value)
    if isinstance(value, str):
        return head(3, len(value.encode())) + value.encode()
    if isinstance(value, (list, tuple)):
        return head(4, len(value)) + b"".join(_cbor_long_heads(v) for v in value)
    raise TypeError(type(value).__name__)


@mutant("hashing", "cbor_encode", "never uses the 1-byte head for small arguments")
def cbor_long_heads(value: Any) -> bytes:
    return _cbor_long_heads(value)


@mutant("hashing", "cbor_encode", "encodes bool as an integer")
def cbor_accepts_bool(value: Any) -> bytes:
    def fix(v: Any) -> Any:
        if isinstance(v, bool):
            return int(v)
        return [fix(x) for x in v] if isinstance(v, (list, tuple)) else v

    return H.cbor_encode(fix(value))


@mutant("hashing", "cbor_encode", "encodes text strings as byte strings")
def cbor_text_as_bytes(value: Any) -> bytes:
    def fix(v: Any) -> Any:
        if isinstance(v, str):
            return v.encode()
        return [fix(x) for x in v] if isinstance(v, (list, tuple)) else v

    H.cbor_encode(value)
    return H.cbor_encode(fix(value))


@mutant("hashing", "root_hash", "hashes the label without CBOR framing")
def root_hash_raw_label(algorithm: str = "sha256") -> bytes:
    H.root_hash(algorithm)
    if algorithm == "sha256":
        return hashlib.sha256(H.ROOT_LABEL.encode()).digest()
    import xxhash

    return xxhash.xxh3_128(H.ROOT_LABEL.encode()).digest()


@mutant("hashing", "hash_block", "ignores the extra keys")
def hash_block_ignores_keys(
    parent_hash: bytes, token_ids: Any, extra_keys: Any = (), algorithm: str = "sha256"
) -> bytes:
    H.hash_block(parent_hash, token_ids, extra_keys, algorithm)
    return H.hash_block(parent_hash, token_ids, (), algorithm)


@mutant("hashing", "hash_block", "xxh3_128 digest little-endian")
def hash_block_little_endian(
    parent_hash: bytes, token_ids: Any, extra_keys: Any = (), algorithm: str = "sha256"
) -> bytes:
    out = H.hash_block(parent_hash, token_ids, extra_keys, algorithm)
    return out[::-1] if algorithm == "xxh3_128" else out


@mutant("hashing", "hash_block", "accepts bool tokens as 0/1")
def hash_block_accepts_bool(
    parent_hash: bytes, token_ids: Any, extra_keys: Any = (), algorithm: str = "sha256"
) -> bytes:
    if isinstance(token_ids, list):
        token_ids = [int(t) if isinstance(t, bool) else t for t in token_ids]
    return H.hash_block(parent_hash, token_ids, extra_keys, algorithm)


@mutant("hashing", "hash_blocks", "hashes every block on the root (no chaining)")
def hash_blocks_unchained(
    token_ids: Any,
    block_size: int,
    extra_keys: Any = None,
    algorithm: str = "sha256",
    parent: Any = None,
) -> list[bytes]:
    out = H.hash_blocks(token_ids, block_size, extra_keys, algorithm, parent)
    tokens = list(token_ids.tolist() if hasattr(token_ids, "tolist") else token_ids)
    first = parent or H.root_hash(algorithm)
    return [
        H.hash_block(
            first,
            tokens[i * block_size : (i + 1) * block_size],
            () if extra_keys is None else extra_keys[i],
            algorithm,
        )
        for i in range(len(out))
    ]


@mutant("hashing", "hash_blocks", "also hashes the trailing partial block")
def hash_blocks_partial(
    token_ids: Any,
    block_size: int,
    extra_keys: Any = None,
    algorithm: str = "sha256",
    parent: Any = None,
) -> list[bytes]:
    out = H.hash_blocks(token_ids, block_size, extra_keys, algorithm, parent)
    tokens = list(token_ids.tolist() if hasattr(token_ids, "tolist") else token_ids)
    if len(tokens) % block_size:
        out.append(
            H.hash_block(
                out[-1] if out else (parent or H.root_hash(algorithm)),
                tokens[len(out) * block_size :],
                (),
                algorithm,
            )
        )
    return out


@mutant("hashing", "hash_blocks", "ignores the parent argument")
def hash_blocks_ignores_parent(
    token_ids: Any,
    block_size: int,
    extra_keys: Any = None,
    algorithm: str = "sha256",
    parent: Any = None,
) -> list[bytes]:
    H.hash_blocks(token_ids, block_size, extra_keys, algorithm, parent)
    return H.hash_blocks(token_ids, block_size, extra_keys, algorithm, None)


@mutant("hashing", "hash_blocks", "block_size 0 returns [] instead of raising")
def hash_blocks_zero_block(
    token_ids: Any,
    block_size: int,
    extra_keys: Any = None,
    algorithm: str = "sha256",
    parent: Any = None,
) -> list[bytes]:
    if block_size == 0:
        return []
    return H.hash_blocks(token_ids, block_size, extra_keys, algorithm, parent)


@mutant("hashing", "cbor_encode", "rejects bytearray (only bytes accepted)")
def cbor_rejects_bytearray(value: Any) -> bytes:
    def check(v: Any) -> None:
        if isinstance(v, bytearray):
            raise TypeError("bytearray")
        if isinstance(v, (list, tuple)):
            for x in v:
                check(x)

    check(value)
    return H.cbor_encode(value)


@mutant("hashing", "root_hash", "an unknown algorithm falls back to sha256")
def root_hash_falls_back(algorithm: str = "sha256") -> bytes:
    return H.root_hash(algorithm if algorithm in H.ALGORITHMS else "sha256")


@mutant("hashing", "hash_block", "xxh3_128 is computed as xxh3_64 (8 bytes)")
def hash_block_xxh3_64(
    parent_hash: bytes, token_ids: Any, extra_keys: Any = (), algorithm: str = "sha256"
) -> bytes:
    out = H.hash_block(parent_hash, token_ids, extra_keys, algorithm)
    if algorithm != "xxh3_128":
        return out
    import xxhash

    return xxhash.xxh3_64(
        H.cbor_encode([bytes(parent_hash), list(token_ids), [list(k) for k in extra_keys]])
    ).digest()


@mutant("hashing", "hash_block", "hashes at most 8 tokens (fixed-size buffer)")
def hash_block_truncates(
    parent_hash: bytes, token_ids: Any, extra_keys: Any = (), algorithm: str = "sha256"
) -> bytes:
    H.hash_block(parent_hash, token_ids, extra_keys, algorithm)
    return H.hash_block(parent_hash, list(token_ids)[:8], extra_keys, algorithm)


@mutant("hashing", "hash_block", "ignores the parent hash")
def hash_block_ignores_parent(
    parent_hash: bytes, token_ids: Any, extra_keys: Any = (), algorithm: str = "sha256"
) -> bytes:
    H.hash_block(parent_hash, token_ids, extra_keys, algorithm)
    return H.hash_block(H.root_hash(algorithm), token_ids, extra_keys, algorithm)


@mutant("hashing", "hash_block", "hashes an array's raw bytes instead of its values")
def hash_block_array_bytes(
    parent_hash: bytes, token_ids: Any, extra_keys: Any = (), algorithm: str = "sha256"
) -> bytes:
    out = H.hash_block(parent_hash, token_ids, extra_keys, algorithm)
    if hasattr(token_ids, "dtype"):
        raw = _np(token_ids).tobytes()
        return H._digest(
            H.cbor_encode([bytes(parent_hash), raw, [list(k) for k in extra_keys]]), algorithm
        )
    return out


@mutant("hashing", "hash_blocks", "parent=None chains on zero bytes, not the root hash")
def hash_blocks_zero_parent(
    token_ids: Any,
    block_size: int,
    extra_keys: Any = None,
    algorithm: str = "sha256",
    parent: Any = None,
) -> list[bytes]:
    H.hash_blocks(token_ids, block_size, extra_keys, algorithm, parent)
    return H.hash_blocks(
        token_ids, block_size, extra_keys, algorithm, parent or bytes(H.DIGEST_SIZES[algorithm])
    )


@mutant(
    "hashing", "hash_blocks", "iterates an array into numpy/torch scalars, which it then rejects"
)
def hash_blocks_array_scalars(
    token_ids: Any,
    block_size: int,
    extra_keys: Any = None,
    algorithm: str = "sha256",
    parent: Any = None,
) -> list[bytes]:
    tokens = list(token_ids) if hasattr(token_ids, "dtype") else token_ids
    return H.hash_blocks(tokens, block_size, extra_keys, algorithm, parent)


# --- block_table ----------------------------------------------------------------------------


@mutant("block_table", "compute_positions", "restarts every request at 0 (ignores num_computed)")
def positions_ignore_computed(query_start_loc: Any, num_computed_tokens: Any, n: Any) -> Any:
    BT.compute_positions(query_start_loc, num_computed_tokens, n)
    zeros = _back(num_computed_tokens, np.zeros(_np(num_computed_tokens).shape, np.int64))
    return BT.compute_positions(query_start_loc, zeros, n)


@mutant("block_table", "compute_positions", "padding tokens continue the last request's positions")
def positions_padding_continues(query_start_loc: Any, num_computed_tokens: Any, n: Any) -> Any:
    out = _np(BT.compute_positions(query_start_loc, num_computed_tokens, n))
    q = _np(query_start_loc).astype(np.int64)
    if q.shape[0] > 1 and q[-1] > 0:
        out[q[-1] :] = out[q[-1] - 1] + 1 + np.arange(n - q[-1])
    return _back(query_start_loc, out)


@mutant("block_table", "compute_positions", "returns positions in query_start_loc's dtype")
def positions_keep_dtype(query_start_loc: Any, num_computed_tokens: Any, n: Any) -> Any:
    out = _np(BT.compute_positions(query_start_loc, num_computed_tokens, n))
    return _back(query_start_loc, out.astype(_np(query_start_loc).dtype))


@mutant("block_table", "compute_positions", "num_tokens < query_start_loc[-1] truncates")
def positions_truncate(query_start_loc: Any, num_computed_tokens: Any, n: Any) -> Any:
    try:
        return BT.compute_positions(query_start_loc, num_computed_tokens, n)
    except ValueError:
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise
        total = int(_np(query_start_loc)[-1])
        return BT.compute_positions(query_start_loc, num_computed_tokens, total)[:n]


@mutant("block_table", "compute_positions", "advances num_computed_tokens in place")
def positions_advance_computed(query_start_loc: Any, num_computed_tokens: Any, n: Any) -> Any:
    out = BT.compute_positions(query_start_loc, num_computed_tokens, n)
    q, c = _np(query_start_loc).astype(np.int64), _np(num_computed_tokens)
    num_computed_tokens[...] = _back(num_computed_tokens, (c + q[1:] - q[:-1]).astype(c.dtype))
    return out


def _slots(
    block_table: Any,
    query_start_loc: Any,
    positions: Any,
    block_size: Any,
    *,
    row0: bool = False,
    offset: bool = True,
    pad: int = BT.PAD_SLOT_ID,
    shift: int = 0,
    wrap: bool = False,
    int16: bool = False,
) -> Any:
    """compute_slot_mapping with one of the bugs, in numpy (validated by the reference)."""
    try:
        BT.compute_slot_mapping(block_table, query_start_loc, positions, block_size)
    except ValueError as exc:
        if not (wrap and "past the block table" in str(exc)):
            raise
    table = _np(block_table)
    if int16 and table.dtype == np.int32:
        table = table.astype(np.int16)
    table = table.astype(np.int64)
    q, p = _np(query_start_loc).astype(np.int64), _np(positions).astype(np.int64)
    out = np.full(p.shape[0], pad, np.int64)
    for r in range(q.shape[0] - 1):
        for t in range(q[r], q[r + 1]):
            col = (p[t] + shift) // block_size
            col = col % table.shape[1] if wrap else min(col, table.shape[1] - 1)
            block = table[0 if row0 else r, col]
            out[t] = block * block_size + (p[t] % block_size if offset else 0)
    return _back(block_table, out)


_SLOT_BUGS: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("slots_first_row", "looks every request's blocks up in row 0 of the table", {"row0": True}),
    (
        "slots_no_offset",
        "forgets the offset in the block (slot = block * block_size)",
        {"offset": False},
    ),
    ("slots_padding_zero", "padding tokens get slot 0", {"pad": 0}),
    ("slots_next_position", "takes the block of position p + 1 (off by one)", {"shift": 1}),
    (
        "slots_past_table_wraps",
        "a position past the table wraps (column % columns)",
        {"wrap": True},
    ),
    ("slots_int16_ids", "reads int32 block ids through a 16-bit type", {"int16": True}),
)
for _name, _what, _kwargs in _SLOT_BUGS:
    MUTANTS.append(
        Mutant(
            _name,
            "block_table",
            "compute_slot_mapping",
            _what,
            lambda *args, _kw=_kwargs: _slots(*args, **_kw),
        )
    )


@mutant("block_table", "compute_slot_mapping", "returns int32 slots")
def slots_int32(block_table: Any, query_start_loc: Any, positions: Any, block_size: Any) -> Any:
    out = BT.compute_slot_mapping(block_table, query_start_loc, positions, block_size)
    return _back(block_table, _np(out).astype(np.int32))


@mutant("block_table", "compute_slot_mapping", "writes the slots into positions")
def slots_into_positions(block_table: Any, query_start_loc: Any, positions: Any, bs: Any) -> Any:
    out = BT.compute_slot_mapping(block_table, query_start_loc, positions, bs)
    positions[...] = _back(positions, _np(out).astype(_np(positions).dtype))
    return out


@mutant("block_table", "compute_logits_indices", "returns query_start_loc[1:] (one past the end)")
def logits_one_past(query_start_loc: Any) -> Any:
    BT.compute_logits_indices(query_start_loc)
    return _back(query_start_loc, _np(query_start_loc).astype(np.int64)[1:])


@mutant("block_table", "compute_logits_indices", "a request without tokens is not an error")
def logits_allow_empty(query_start_loc: Any) -> Any:
    try:
        return BT.compute_logits_indices(query_start_loc)
    except ValueError as exc:
        if "no scheduled tokens" not in str(exc):
            raise
        return _back(query_start_loc, _np(query_start_loc).astype(np.int64)[1:] - 1)


@mutant("block_table", "compute_logits_indices", "returns indices in query_start_loc's dtype")
def logits_keep_dtype(query_start_loc: Any) -> Any:
    out = _np(BT.compute_logits_indices(query_start_loc))
    return _back(query_start_loc, out.astype(_np(query_start_loc).dtype))


@mutant("block_table", "compute_logits_indices", "subtracts 1 in place, returns a view")
def logits_in_place(query_start_loc: Any) -> Any:
    BT.compute_logits_indices(query_start_loc)
    query_start_loc[1:] -= 1
    return query_start_loc[1:]


def _contiguous_only(op: Callable[..., Any]) -> Callable[..., Any]:
    def fn(*args: Any) -> Any:
        for a in args:
            lib = library_of(a)
            if (
                lib == "torch"
                and not a.is_contiguous()
                or lib == "numpy"
                and not (a.flags.c_contiguous)
            ):
                raise ValueError("arrays must be C-contiguous")
        return op(*args)

    return fn


for _op in ("compute_positions", "compute_slot_mapping", "compute_logits_indices"):
    MUTANTS.append(
        Mutant(
            f"{_op}_requires_contiguous",
            "block_table",
            _op,
            "rejects non-contiguous arrays",
            _contiguous_only(getattr(BT, _op)),
        )
    )


# --- layers ---------------------------------------------------------------------------------


@mutant("layers", "rms_norm", "adds eps outside the square root")
def rms_norm_eps_outside(x: Any, weight: Any, eps: float, residual: Any = None) -> Any:
    L.rms_norm(x, weight, eps, residual)
    h = _np(x) if residual is None else _np(x) + _np(residual)
    h64 = h.astype(np.float64)
    normed = h64 / (np.sqrt(np.mean(h64 * h64, axis=-1, keepdims=True)) + eps)
    out = _back(x, (_np(weight).astype(np.float64) * normed).astype(h.dtype))
    return out if residual is None else (out, _back(x, h))


@mutant("layers", "silu_and_mul", "applies silu to the up half instead of the gate half")
def silu_swapped_halves(x: Any) -> Any:
    L.silu_and_mul(x)
    a = _np(x)
    d = a.shape[-1] // 2
    return L.silu_and_mul(_back(x, np.concatenate([a[..., d:], a[..., :d]], axis=-1)))


def _norm_input64(x: Any, residual: Any) -> tuple[np.ndarray, np.ndarray]:
    """(h = x (+ residual) in x's dtype, h in float64) for a normalisation mutant."""
    h = _np(x) if residual is None else _np(x) + _np(residual)
    return h, h.astype(np.float64)


def _norm_output(x: Any, residual: Any, h: np.ndarray, y64: np.ndarray) -> Any:
    out = _back(x, y64.astype(h.dtype))
    return out if residual is None else (out, _back(x, h))


@mutant("layers", "gemma_rms_norm", "scales by weight instead of 1 + weight")
def gemma_scales_by_weight(x: Any, weight: Any, eps: float, residual: Any = None) -> Any:
    L.gemma_rms_norm(x, weight, eps, residual)
    h, h64 = _norm_input64(x, residual)
    normed = h64 / np.sqrt(np.mean(h64 * h64, axis=-1, keepdims=True) + eps)
    return _norm_output(x, residual, h, normed * _np(weight).astype(np.float64))


def _layer_norm64(h64: np.ndarray, weight: Any, bias: Any, eps: float, ddof: int = 0) -> Any:
    centred = h64 - h64.mean(axis=-1, keepdims=True)
    n = h64.shape[-1]
    var = np.sum(centred * centred, axis=-1, keepdims=True) / max(n - ddof, 1)
    w, b = _np(weight).astype(np.float64), _np(bias).astype(np.float64)
    return centred / np.sqrt(var + eps) * w + b


@mutant("layers", "layer_norm", "leaves out the bias")
def layer_norm_without_bias(
    x: Any, weight: Any, bias: Any, eps: float, residual: Any = None
) -> Any:
    L.layer_norm(x, weight, bias, eps, residual)
    h, h64 = _norm_input64(x, residual)
    return _norm_output(x, residual, h, _layer_norm64(h64, weight, np.zeros_like(_np(bias)), eps))


@mutant("layers", "layer_norm", "divides by the unbiased variance (n - 1)")
def layer_norm_unbiased_variance(
    x: Any, weight: Any, bias: Any, eps: float, residual: Any = None
) -> Any:
    L.layer_norm(x, weight, bias, eps, residual)
    h, h64 = _norm_input64(x, residual)
    return _norm_output(x, residual, h, _layer_norm64(h64, weight, bias, eps, ddof=1))


def _gelu64(x: np.ndarray, approximate: str, cubic: float = 0.044715) -> np.ndarray:
    x = x.astype(np.float64)
    if approximate == "tanh":
        return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + cubic * x**3)))
    return 0.5 * x * (1.0 + np.vectorize(math.erf, otypes=[np.float64])(x / math.sqrt(2.0)))


def _gelu_back(x: Any, y64: np.ndarray) -> Any:
    return _back(x, y64.astype(_np(x).dtype))


@mutant("layers", "gelu", "the tanh form's cubic coefficient 0.44715 (a dropped zero)")
def gelu_tanh_constant_wrong(x: Any, approximate: str = "none") -> Any:
    L.gelu(x, approximate)
    return _gelu_back(x, _gelu64(_np(x), approximate, cubic=0.44715))


@mutant("layers", "gelu", "computes the tanh form when asked for the erf form")
def gelu_always_tanh(x: Any, approximate: str = "none") -> Any:
    L.gelu(x, approximate)
    return _gelu_back(x, _gelu64(_np(x), "tanh"))


@mutant("layers", "gelu", "computes the erf form when asked for the tanh form")
def gelu_always_erf(x: Any, approximate: str = "none") -> Any:
    L.gelu(x, approximate)
    return _gelu_back(x, _gelu64(_np(x), "none"))


@mutant("layers", "gelu_and_mul", "applies gelu to the up half instead of the gate half")
def gelu_and_mul_swapped_halves(x: Any, approximate: str = "none") -> Any:
    L.gelu_and_mul(x, approximate)
    a = _np(x)
    d = a.shape[-1] // 2
    return L.gelu_and_mul(_back(x, np.concatenate([a[..., d:], a[..., :d]], axis=-1)), approximate)


@mutant("layers", "gelu_and_mul", "ignores approximate (always the erf form)")
def gelu_and_mul_always_erf(x: Any, approximate: str = "none") -> Any:
    L.gelu_and_mul(x, approximate)
    return L.gelu_and_mul(x, "none")


# --- rope -----------------------------------------------------------------------------------


@mutant("rope", "rope_inv_freq", "ignores linear scaling")
def inv_freq_ignores_linear(
    rotary_dim: int, theta: float, rope_scaling: Any = None, *a: Any
) -> Any:
    sc = dict(rope_scaling or {})
    if sc.get("rope_type", sc.get("type")) == "linear":
        sc = {}
    return R.rope_inv_freq(rotary_dim, theta, sc or None, *a)


@mutant("rope", "rope_inv_freq", "rounds inv_freq to bfloat16 (computed in the model dtype)")
def inv_freq_in_bfloat16(rotary_dim: int, theta: float, *a: Any) -> Any:
    inv, scale = R.rope_inv_freq(rotary_dim, theta, *a)
    bits = _np(inv).astype(np.float32).view(np.uint32)  # positive finite: no overflow below
    bits = (bits + np.uint32(0x7FFF) + ((bits >> 16) & 1)) & np.uint32(
        0xFFFF0000
    )  # to nearest even
    return _back(inv, bits.view(np.float32)), scale


@mutant("rope", "apply_rope", "rotates the wrong way (angle -p * inv_freq)")
def rope_wrong_sign(positions: Any, query: Any, key: Any, inv_freq: Any, *a: Any) -> Any:
    R.apply_rope(positions, query, key, inv_freq, *a)
    return R.apply_rope(positions, query, key, -inv_freq, *a)


@mutant("rope", "apply_rope", "always uses the NeoX pairing")
def rope_always_neox(
    positions: Any, query: Any, key: Any, inv_freq: Any, scale: float = 1.0, is_neox: bool = True
) -> Any:
    return R.apply_rope(positions, query, key, inv_freq, scale, True)


@mutant("rope", "apply_mrope", "turns every pair by the first position row")
def mrope_first_row_only(
    positions: Any, query: Any, key: Any, inv_freq: Any, sections: Any, *a: Any
) -> Any:
    rows = len(tuple(sections))
    R.apply_mrope(positions, query, key, inv_freq, sections, *a)
    first = np.broadcast_to(positions[:1], (rows, positions.shape[1]))
    return R.apply_mrope(np.ascontiguousarray(first), query, key, inv_freq, sections, *a)


@mutant("rope", "apply_mrope", "gives the sections to the rows in reverse order")
def mrope_reversed_rows(
    positions: Any, query: Any, key: Any, inv_freq: Any, sections: Any, *a: Any
) -> Any:
    R.apply_mrope(positions, query, key, inv_freq, sections, *a)
    return R.apply_mrope(np.ascontiguousarray(positions[::-1]), query, key, inv_freq, sections, *a)


@mutant("rope", "apply_mrope", "offsets row r's positions by r (rows not interchangeable)")
def mrope_offsets_rows(
    positions: Any, query: Any, key: Any, inv_freq: Any, sections: Any, *a: Any
) -> Any:
    R.apply_mrope(positions, query, key, inv_freq, sections, *a)
    shifted = positions + np.arange(positions.shape[0], dtype=positions.dtype)[:, None]
    return R.apply_mrope(shifted, query, key, inv_freq, sections, *a)


@mutant("rope", "apply_mrope", "takes sections that do not sum to d / 2 (the last one stretched)")
def mrope_stretches_sections(
    positions: Any, query: Any, key: Any, inv_freq: Any, sections: Any, *a: Any
) -> Any:
    sections = [int(n) for n in sections]
    if sections and min(sections) >= 0 and len(sections) == positions.shape[0]:
        sections[-1] += inv_freq.shape[0] - sum(sections)
        if sections[-1] < 0:
            sections = [inv_freq.shape[0]] + [0] * (len(sections) - 1)
    return R.apply_mrope(positions, query, key, inv_freq, sections, *a)


# --- attention ------------------------------------------------------------------------------


@mutant("attention", "paged_attention", "maps query head h to KV head h % num_kv_heads")
def attention_kv_head_modulo(query: Any, key_cache: Any, *a: Any, **kw: Any) -> Any:
    A.paged_attention(query, key_cache, *a, **kw)
    heads, kv = query.shape[1], key_cache.shape[2]
    group = heads // kv
    # the reference reads KV head h' // group for head h'; send head h to h' with
    # h' // group == h % kv
    where = np.array([(h % kv) * group + h // kv for h in range(heads)])
    q = _np(query)
    moved = np.empty_like(q)
    moved[:, where] = q
    out = _np(A.paged_attention(_back(query, moved), key_cache, *a, **kw))
    return _back(query, np.ascontiguousarray(out[:, where]))


@mutant("attention", "paged_attention", "ignores the sliding window")
def attention_ignores_window(*args: Any) -> Any:
    args = list(args)
    if len(args) > 7:
        args[7] = None
    return A.paged_attention(*args)


@mutant("attention", "paged_attention", "ignores the custom masks (tree attention)")
def attention_ignores_custom_masks(*args: Any) -> Any:
    A.paged_attention(*args)  # the reference's errors for bad masks
    return A.paged_attention(*args[:10], None, *args[11:])


@mutant("attention", "paged_attention", "reads each mask's query rows in reverse order")
def attention_reverses_custom_masks(*args: Any) -> Any:
    A.paged_attention(*args)
    masks = args[10] if len(args) > 10 else None
    if masks is None:
        return A.paged_attention(*args)
    flipped = [None if m is None else _back(m, _np(m)[::-1].copy()) for m in masks]
    return A.paged_attention(*args[:10], flipped, *args[11:])


@mutant("attention", "paged_attention", "always causal (an encoder sees only earlier keys)")
def attention_always_causal(*args: Any) -> Any:
    A.paged_attention(*args)  # the reference's errors
    return A.paged_attention(*args[:11], True)


@mutant("attention", "reshape_and_cache", "writes padding tokens too (slot -1: the last slot)")
def cache_writes_padding(
    key: Any, value: Any, key_cache: Any, value_cache: Any, slots: Any, *fp8: Any
) -> Any:
    A.reshape_and_cache(key, value, key_cache, value_cache, slots, *fp8)
    n, b = key_cache.shape[:2]
    s = _np(slots)
    last = _back(slots, np.where(s < 0, n * b - 1, -1).astype(s.dtype))
    A.reshape_and_cache(key, value, key_cache, value_cache, last, *fp8)
    return None


def _fp8_args(args: tuple[Any, ...], at: int) -> tuple[list[Any], str]:
    """args (every argument before kv_cache_dtype, at position `at`, given) as a list
    completed with the defaults of kv_cache_dtype, k_scale and v_scale; the
    kv_cache_dtype."""
    full = list(args) + ["auto", 1.0, 1.0][len(args) - at :]
    return full, full[at]


@mutant("attention", "paged_attention", "reads an fp8 cache without its scales (k_scale, v_scale)")
def attention_fp8_ignores_scales(*args: Any) -> Any:
    A.paged_attention(*args)  # the reference's errors
    args, _ = _fp8_args(args, 12)
    return A.paged_attention(*args[:13], 1.0, 1.0)


@mutant("attention", "paged_decode_attention", "reads an fp8 cache without its v_scale")
def decode_fp8_ignores_v_scale(*args: Any) -> Any:
    A.paged_decode_attention(*args)
    args, _ = _fp8_args(args, 9)
    return A.paged_decode_attention(*args[:11], 1.0)


@mutant("attention", "paged_decode_attention", "reads fp8_e5m2 codes as e4m3 (wrong format)")
def decode_fp8_wrong_format(*args: Any) -> Any:
    A.paged_decode_attention(*args)
    args, name = _fp8_args(args, 9)
    if name == "fp8_e5m2":
        args[9] = "fp8_e4m3"
    return A.paged_decode_attention(*args)


@mutant("attention", "reshape_and_cache", "no saturation: an fp8 value beyond max becomes NaN")
def cache_fp8_no_saturation(
    key: Any, value: Any, key_cache: Any, value_cache: Any, slots: Any, *fp8: Any
) -> Any:
    A.reshape_and_cache(key, value, key_cache, value_cache, slots, *fp8)
    name, k_scale, v_scale = fp8 or ("auto", 1.0, 1.0)
    if name == "auto":
        return None
    top = 448.0 if name != "fp8_e5m2" else 57344.0
    n, b, h, d = key_cache.shape
    s = _np(slots)
    for cache, x, scale in ((key_cache, key, k_scale), (value_cache, value, v_scale)):
        y = _np(x).astype(np.float32) / np.float32(scale)
        flat = _np(cache).reshape(n * b, h, d)
        for t in np.flatnonzero(s >= 0).tolist():
            flat[s[t]] = np.where(np.abs(y[t]) > top, 0x7F, flat[s[t]])
        cache.reshape(n * b, h, d)[...] = _back(cache, flat)
    return None


@mutant("attention", "reshape_and_cache", "writes fp8 (e4m3) codes for fp8_e5m2 (wrong format)")
def cache_fp8_wrong_format(
    key: Any, value: Any, key_cache: Any, value_cache: Any, slots: Any, *fp8: Any
) -> Any:
    A.reshape_and_cache(key, value, key_cache, value_cache, slots, *fp8)
    if fp8 and fp8[0] == "fp8_e5m2":
        A.reshape_and_cache(key, value, key_cache, value_cache, slots, "fp8", *fp8[1:])
    return None


@mutant("attention", "concat_and_cache_mla", "writes k_pe before kv_c in the slot")
def mla_cache_swaps_parts(kv_c: Any, k_pe: Any, kv_cache: Any, slots: Any) -> Any:
    A.concat_and_cache_mla(kv_c, k_pe, kv_cache, slots)  # the reference's errors
    n, b, width = kv_cache.shape
    flat = kv_cache.reshape(n * b, width)
    for t, s in enumerate(_np(slots).tolist()):
        if s >= 0:
            row = np.concatenate([_np(k_pe)[t], _np(kv_c)[t]])
            flat[s] = _back(kv_cache, row.astype(_np(kv_cache).dtype))
    return None


@mutant("attention", "concat_and_cache_mla", "writes padding tokens too (slot -1: the last slot)")
def mla_cache_writes_padding(kv_c: Any, k_pe: Any, kv_cache: Any, slots: Any) -> Any:
    A.concat_and_cache_mla(kv_c, k_pe, kv_cache, slots)
    n, b, width = kv_cache.shape
    for t in np.flatnonzero(_np(slots) < 0).tolist():
        row = np.concatenate([_np(kv_c)[t], _np(k_pe)[t]]).astype(_np(kv_cache).dtype)
        kv_cache.reshape(n * b, width)[-1] = _back(kv_cache, row)
    return None


@mutant(
    "attention", "concat_and_cache_mla", "rounds the latent to float16 (a half-precision cache)"
)
def mla_cache_rounds_to_half(kv_c: Any, k_pe: Any, kv_cache: Any, slots: Any) -> Any:
    half = [_back(x, _np(x).astype(np.float16).astype(_np(x).dtype)) for x in (kv_c, k_pe)]
    A.concat_and_cache_mla(*half, kv_cache, slots)
    return None


@mutant(
    "attention",
    "paged_attention",
    "scales the keys in place, so one cache as K and V is read scaled",
)
def attention_prescales_shared_cache(*args: Any) -> Any:
    """A kernel that multiplies the key cache by the softmax scale in place (and undoes it
    after): right for two caches, but values read from the same array come out scaled."""
    args = list(args)
    if args[1] is args[2]:
        args[2] = _back(args[2], _np(args[2]) * args[6])
    return A.paged_attention(*args)


def _decode_with_lens(args: tuple[Any, ...], change: Callable[[np.ndarray, int], Any]) -> Any:
    """paged_decode_attention with seq_lens replaced by change(seq_lens, capacity)."""
    args = list(args)
    capacity = args[3].shape[1] * args[1].shape[1]
    lens = _np(args[4])
    args[4] = _back(args[4], np.asarray(change(lens, capacity), dtype=lens.dtype))
    return A.paged_decode_attention(*args)


@mutant("attention", "paged_decode_attention", "reads one position past each sequence")
def decode_reads_one_more(*args: Any) -> Any:
    return _decode_with_lens(args, lambda s, cap: np.where(s > 0, np.minimum(s + 1, cap), 0))


@mutant("attention", "paged_decode_attention", "padding requests attend to their first slot")
def decode_padding_attends(*args: Any) -> Any:
    return _decode_with_lens(args, lambda s, cap: np.maximum(s, 1))


@mutant("attention", "paged_decode_attention", "ignores the sliding window")
def decode_ignores_window(*args: Any) -> Any:
    args = list(args)
    if len(args) > 6:
        args[6] = None
    return A.paged_decode_attention(*args)


# --- structured -----------------------------------------------------------------------------
# Each mutant decides token i's fate from a wrong reading of the bitmask: `_masked_by` turns
# a rule keep(words, i) -> bool (words: one row of the mask as Python ints) into the op.


def _masked_by(keep: Callable[[list[int], int], bool]) -> Callable[[Any, Any], Any]:
    def apply(logits: Any, bitmask: Any) -> Any:
        ST.apply_token_bitmask(logits, bitmask)  # the reference's errors
        x, m = _np(logits), _np(bitmask)
        out = x.copy()
        for b in range(x.shape[0]):
            words = [int(w) for w in m[b]]
            for i in range(x.shape[1]):
                if not keep(words, i):
                    out[b, i] = NEG_INF
        return _back(logits, out)

    return apply


def _bit(words: list[int], i: int, word: int, bit: int) -> bool:
    return word < len(words) and (words[word] >> bit) & 1 == 1


@mutant("structured", "apply_token_bitmask", "reads the bits of a word most significant first")
def bitmask_msb_first(logits: Any, bitmask: Any) -> Any:
    return _masked_by(lambda w, i: _bit(w, i, i // 32, 31 - i % 32))(logits, bitmask)


@mutant("structured", "apply_token_bitmask", "token 32w + 31 reads word w + 1 (rounds i / 32 up)")
def bitmask_word_off_by_one(logits: Any, bitmask: Any) -> Any:
    return _masked_by(lambda w, i: _bit(w, i, (i + 1) // 32, i % 32))(logits, bitmask)


@mutant("structured", "apply_token_bitmask", "masks the tokens whose bit is set, keeps the others")
def bitmask_inverted(logits: Any, bitmask: Any) -> Any:
    return _masked_by(lambda w, i: not _bit(w, i, i // 32, i % 32))(logits, bitmask)


@mutant(
    "structured",
    "apply_token_bitmask",
    "tests a bit as (w >> j) % 2 == 1 with C's signed remainder: a negative word allows nothing",
)
def bitmask_signed_remainder(logits: Any, bitmask: Any) -> Any:
    def keep(w: list[int], i: int) -> bool:
        if i // 32 >= len(w):
            return False
        shifted = w[i // 32] >> (i % 32)
        return int(math.fmod(shifted, 2)) == 1

    return _masked_by(keep)(logits, bitmask)


@mutant(
    "structured",
    "apply_token_bitmask",
    "handles whole words only: the tokens of a last, partial word are left unchanged",
)
def bitmask_ignores_partial_word(logits: Any, bitmask: Any) -> Any:
    vocab = _np(logits).shape[1]
    full = vocab // 32 * 32
    return _masked_by(lambda w, i: i >= full or _bit(w, i, i // 32, i % 32))(logits, bitmask)


@mutant(
    "structured",
    "apply_token_bitmask",
    "leaves the tokens past the mask's width unchanged (xgrammar's rule)",
)
def bitmask_keeps_tokens_past_the_mask(logits: Any, bitmask: Any) -> Any:
    return _masked_by(lambda w, i: i >= 32 * len(w) or _bit(w, i, i // 32, i % 32))(logits, bitmask)


@mutant("structured", "apply_token_bitmask", "applies the first row's mask to every row")
def bitmask_first_row_for_all(logits: Any, bitmask: Any) -> Any:
    m = _np(bitmask)
    return ST.apply_token_bitmask(logits, _back(bitmask, np.repeat(m[:1], m.shape[0], axis=0)))


@mutant(
    "structured", "apply_token_bitmask", "rejects NaN and +inf logits (validates like sampling)"
)
def bitmask_rejects_non_finite(logits: Any, bitmask: Any) -> Any:
    if not np.all(np.isfinite(_np(logits)) | np.isneginf(_np(logits))):
        raise ValueError("logits contains NaN or +inf")
    return ST.apply_token_bitmask(logits, bitmask)


@mutant("structured", "apply_token_bitmask", "takes an int64 bitmask, one word per element")
def bitmask_takes_int64(logits: Any, bitmask: Any) -> Any:
    m = _np(bitmask)
    if m.dtype == np.int64:
        m = m.astype(np.int32)
    return ST.apply_token_bitmask(logits, _back(bitmask, m) if m.ndim else bitmask)


@mutant("structured", "apply_token_bitmask", "computes half-precision logits in float32")
def bitmask_promotes_half(logits: Any, bitmask: Any) -> Any:
    out = _np(ST.apply_token_bitmask(logits, bitmask))
    return _back(logits, out.astype(np.float32) if out.dtype == np.float16 else out)


@mutant("structured", "apply_token_bitmask", "masks the logits in place and returns them")
def bitmask_in_place(logits: Any, bitmask: Any) -> Any:
    out = ST.apply_token_bitmask(logits, bitmask)
    logits[...] = out
    return logits


@mutant(
    "structured", "apply_token_bitmask", "ignores the strides: reads the logits' memory as rows"
)
def bitmask_ignores_strides(logits: Any, bitmask: Any) -> Any:
    ST.apply_token_bitmask(logits, bitmask)
    if library_of(logits) == "torch":
        flat = to_numpy(logits.as_strided((logits.numel(),), (1,)))
    else:
        flat = np.lib.stride_tricks.as_strided(logits, (logits.size,), (logits.itemsize,))
    as_rows = np.array(flat, copy=True).reshape(logits.shape)
    return ST.apply_token_bitmask(_back(logits, as_rows), bitmask)


# --- spec_decode ----------------------------------------------------------------------------
# Each mutant verifies request by request in numpy, as the contract says except for one
# `bug`; it validates with the reference first, so it raises the reference's errors.


def _verify(args: tuple[Any, ...], bug: str, greedy: bool) -> Any:
    x = _np(args[0]).astype(np.float64)
    drafts, counts = _np(args[1]).astype(np.int64), _np(args[2]).astype(np.int64)
    q = None if greedy or args[3] is None else _np(args[3]).astype(np.float64)
    t, seeds, pos = (np.zeros(counts.size), None, None) if greedy else map(_np, args[4:])
    vocab = x.shape[1]
    out = np.full((counts.size, 1 + int(counts.max(initial=0))), -1, np.int64)
    for b, k in enumerate(counts.tolist()):
        start, tokens = int(counts[:b].sum()), []
        for i in range(k + 1):
            row, draft = x[start + b + i], int(drafts[start + i]) if i < k else -1
            draft_prev = int(drafts[start + i - 1]) if i else -1
            if t[b] == 0:
                best = (
                    vocab - 1 - int(np.argmax(row[::-1]))
                    if bug == "last tie"
                    else int(np.argmax(row))
                )
                if i < k and draft == best:
                    tokens.append(draft)
                    continue
                if i == k and bug == "no bonus":
                    break
                tokens += [draft, best] if bug == "off by one" and i < k else [best]
                break
            at, seed = np.array([pos[b] + i], np.int64), seeds[0 if bug == "first seed" else b]
            u = _np(S.philox_uniform(np.array([seed], np.int64), at, vocab + 1))[0]
            if bug == "reused uniform":
                u[vocab] = _np(S.philox_uniform(np.array([seed], np.int64), at - i, vocab + 1))[
                    0, vocab
                ]
            p, gumbel = _probs(row), np.log(-np.log(u[:vocab]))
            qi = np.eye(vocab)[draft] if q is None or i == k else q[start + i]
            qi = np.full(vocab, 1 / vocab) if q is None and bug == "uniform q" else qi
            if i == k:
                score = row
                if bug == "bonus from q" and k:
                    last = np.eye(vocab)[draft_prev] if q is None else q[start + i - 1]
                    score = np.log(last)
                tokens.append(int(np.argmax(score - gumbel)))
                break
            if u[vocab] * qi[draft] < p[draft] * (2.0 if bug == "lenient" else 1.0):
                tokens.append(draft)
                continue
            r = p - qi if bug == "no max" else np.maximum(p - qi, 0.0)
            score = np.log(r) if np.any(r > 0) else row
            tokens += [draft] if bug == "off by one" else []
            tokens.append(int(np.argmax(score - gumbel)))
            break
        out[b, : len(tokens)] = tokens[: out.shape[1]]
    return _back(args[0], out)


for _bug, _what in (
    ("last tie", "takes the last argmax among tied target logits"),
    ("off by one", "also emits the first mismatching draft, before the target's token"),
    ("no bonus", "emits no bonus token when every draft is accepted"),
):
    MUTANTS.append(
        Mutant(
            f"greedy_{_bug.replace(' ', '_')}",
            "spec_decode",
            "verify_greedy",
            _what,
            lambda *a, _b=_bug: (SD.verify_greedy(*a), _verify(a, _b, greedy=True))[1],
        )
    )

for _bug, _what in (
    ("reused uniform", "decides every draft of a request with the uniform of its first position"),
    ("lenient", "lenient acceptance: accepts with probability min(1, 2 p(x) / q(x))"),
    ("no max", "draws the recovered token from p - q without max(., 0)"),
    ("bonus from q", "draws the bonus token from the last draft's q instead of p"),
    ("off by one", "counts the first rejected draft as accepted (emits it, then a token)"),
    ("last tie", "greedy requests take the last argmax among tied target logits"),
    ("first seed", "draws every request with the seed of the first"),
    ("uniform q", "takes draft_probs=None as a uniform q instead of one-hot"),
):
    MUTANTS.append(
        Mutant(
            f"rejection_{_bug.replace(' ', '_')}",
            "spec_decode",
            "rejection_sample",
            _what,
            lambda *a, _b=_bug: (SD.rejection_sample(*a), _verify(a, _b, greedy=False))[1],
        )
    )


# Trees: each mutant walks request by request in numpy, as the contract says except for
# one `bug`; it validates with the reference first, so it raises the reference's errors.


def _tree_walk(
    rows: np.ndarray, tokens: list[int], parents: list[int], bug: str, mode: Any
) -> list[int]:
    """One request's emitted tokens; mode = None (greedy) or (seed, position)."""
    vocab = rows.shape[1]
    depth = [0]
    for parent in parents[1:]:
        depth.append(depth[parent] + 1)
    children: list[list[int]] = [[] for _ in tokens]
    for v in range(1, len(tokens)):
        if bug == "cousins":  # every node one level deeper, whoever its parent
            for w in range(len(tokens)):
                if depth[w] == depth[v] - 1:
                    children[w].append(v)
        else:
            children[parents[v]].append(v)
    out, node = [], 0
    while True:
        row, kids = rows[node], children[node]
        if mode is None:
            t = vocab - 1 - int(np.argmax(row[::-1])) if bug == "last tie" else int(np.argmax(row))
            holding = [c for c in kids if tokens[c] == t]
            if bug == "no bonus" and not kids and out:
                return out
            out.append(t)
            if not holding:
                return out
            node = holding[-1] if bug == "last sibling" else holding[0]
            continue
        seed, position = mode
        at = position + (node if bug == "position by node" else len(out))
        u = _np(S.philox_uniform(np.array([seed], np.int64), np.array([at]), vocab + len(kids)))[0]
        p = _probs(row)
        r, mass, chosen = p.copy(), 1.0, None
        for j, child in enumerate(kids):
            x = tokens[child]
            uj = u[vocab] if bug == "reused uniform" else u[vocab + j]
            m = 1.0 if bug in ("no zeroing", "no renormalisation") else max(mass, 0.0)
            rx = p[x] if bug == "no zeroing" else r[x]
            if uj * m < rx:
                chosen = child
                break
            mass -= r[x]
            r[x] = 0.0
        if chosen is not None:
            out.append(tokens[chosen])
            node = chosen
            continue
        if kids and bug in ("no zeroing", "residual keeps siblings"):
            r = np.maximum(p - np.eye(vocab)[tokens[kids[-1]]], 0.0)
        with np.errstate(divide="ignore"):
            score = np.log(r) if kids and np.any(r > 0) else row
        out.append(int(np.argmax(score - np.log(-np.log(u[:vocab])))))
        return out


def _verify_tree(args: tuple[Any, ...], bug: str, greedy: bool) -> Any:
    x = _np(args[0]).astype(np.float64)
    drafts, counts = _np(args[1]).astype(np.int64), _np(args[2]).astype(np.int64)
    parents = _np(args[3]).astype(np.int64)
    t, seeds, pos = (np.zeros(counts.size), None, None) if greedy else map(_np, args[4:])
    paths = []
    for b, k in enumerate(counts.tolist()):
        start = int(counts[:b].sum())
        rows = x[start + b : start + b + k + 1]
        tokens = [-1, *drafts[start : start + k].tolist()]
        tree = [-1, *parents[start : start + k].tolist()]
        seed = None if seeds is None else int(seeds[0 if bug == "first seed" else b])
        mode = None if t[b] == 0 else (seed, int(pos[b]))
        paths.append(_tree_walk(rows, tokens, tree, bug, mode))
    width, start = 1, 0
    for k in counts.tolist():  # 1 + the deepest node of the batch
        d = [0]
        for parent in parents[start : start + k].tolist():
            d.append(d[parent] + 1)
        width, start = max(width, 1 + max(d)), start + k
    out = np.full((counts.size, width), -1, np.int64)
    for b, path in enumerate(paths):
        out[b, : min(len(path), width)] = path[:width]
    return _back(args[0], out)


for _bug, _what in (
    ("last sibling", "descends into the last child holding the target's token, not the first"),
    ("cousins", "accepts a node one level deeper whose parent was not accepted"),
    ("last tie", "takes the last argmax among tied target logits"),
    ("no bonus", "emits no bonus token at an accepted leaf"),
):
    MUTANTS.append(
        Mutant(
            f"tree_greedy_{_bug.replace(' ', '_')}",
            "spec_decode",
            "verify_tree_greedy",
            _what,
            lambda *a, _b=_bug: (SD.verify_tree_greedy(*a), _verify_tree(a, _b, greedy=True))[1],
        )
    )

for _bug, _what in (
    ("reused uniform", "decides every sibling with the same uniform (vocab)"),
    (
        "no zeroing",
        "keeps rejected siblings in p (no zeroing, no renormalising) and in the residual",
    ),
    ("residual keeps siblings", "draws the residual with only the last rejected sibling zeroed"),
    ("no renormalisation", "accepts a later sibling with probability r(x), not r(x) / m"),
    ("cousins", "tries every node one level deeper, also those whose parent was rejected"),
    ("position by node", "reads the uniforms of position + node index instead of + depth"),
    ("first seed", "draws every request with the seed of the first"),
    ("last tie", "greedy requests take the last argmax among tied target logits"),
):
    MUTANTS.append(
        Mutant(
            f"tree_rejection_{_bug.replace(' ', '_')}",
            "spec_decode",
            "rejection_sample_tree",
            _what,
            lambda *a, _b=_bug: (SD.rejection_sample_tree(*a), _verify_tree(a, _b, greedy=False))[
                1
            ],
        )
    )


def _mask_mutant(bug: str) -> Callable[..., Any]:
    def fn(draft_parents: Any) -> Any:
        want = SD.tree_attention_mask(draft_parents)
        parents = [int(v) for v in draft_parents]
        k = len(parents)
        mask = np.eye(k + 1, dtype=bool)
        mask[:, 0] = True
        for i, parent in enumerate(parents):
            if bug == "causal":
                mask[i + 1, : i + 1] = True
            elif bug == "parent only":
                mask[i + 1, parent] = True
            else:
                mask[i + 1] |= mask[parent]
                if bug == "siblings":
                    mask[i + 1, [j + 1 for j in range(i) if parents[j] == parent]] = True
        if bug == "transposed":
            mask = mask.T.copy()
        return _back(want, mask) if hasattr(want, "dtype") else mask

    return fn


for _bug, _what in (
    ("siblings", "lets a node see its earlier siblings"),
    ("causal", "the causal triangle, whatever the tree"),
    ("parent only", "a node sees the root, its parent and itself, not every ancestor"),
    ("transposed", "mask[j, i] for mask[i, j] (descendants instead of ancestors)"),
):
    MUTANTS.append(
        Mutant(
            f"tree_mask_{_bug.replace(' ', '_')}",
            "spec_decode",
            "tree_attention_mask",
            _what,
            _mask_mutant(_bug),
        )
    )


# Prompt lookup: each mutant is the contract read literally (`_lookup`) but for one `bug`;
# the lookup mutants validate with the reference first, so they raise its errors.


def _lookup(tokens: list[Any], num: int, lo: int, hi: int, bug: str = "") -> tuple[int, int]:
    """The proposal as a range [start, stop) of `tokens` ((0, 0) for none)."""
    n = len(tokens)
    lengths = range(hi, lo - 1, -1)
    if bug == "shortest":
        lengths = range(lo, hi + 1)
    elif bug == "no min":
        lengths = range(hi, 0, -1)
    elif bug == "no max":
        lengths = range(n, lo - 1, -1)
    for length in (length for length in lengths if length <= n):
        last = n - length if bug == "suffix itself" else n - length - 1
        starts = range(last + 1) if bug == "earliest" else range(last, -1, -1)
        for j in starts:
            if tokens[j : j + length] != tokens[n - length :]:
                continue
            if bug == "full proposals" and j + length + num > n:
                continue
            start = j + length + (bug == "slice start")
            return start, min(start + num + (bug == "slice end"), n)
    return 0, 0


def _proposal(tokens: list[Any], num: int, lo: int, hi: int, bug: str = "") -> list[Any]:
    start, stop = _lookup(tokens, num, lo, hi, bug)
    return tokens[start:stop]


def _lookup_mutant(bug: str) -> Callable[..., Any]:
    def fn(token_ids: Any, num: Any, lo: Any, hi: Any) -> Any:
        SD.propose_ngram(token_ids, num, lo, hi)
        return _proposal(SD._token_list(token_ids), num, lo, hi, bug)

    return fn


for _bug, _what in (
    ("earliest", "follows the earliest occurrence of the suffix instead of the latest"),
    ("shortest", "matches the shortest n-gram first instead of the longest"),
    ("suffix itself", "counts the suffix itself as an occurrence (j + L == n allowed)"),
    ("slice start", "proposes from one token too late (j + L + 1)"),
    ("slice end", "proposes num_speculative_tokens + 1 tokens"),
    ("no min", "ignores prompt_lookup_min (n-grams down to length 1)"),
    ("no max", "ignores prompt_lookup_max (the longest suffix of any length)"),
    ("full proposals", "skips occurrences followed by fewer than num_speculative_tokens"),
):
    MUTANTS.append(
        Mutant(
            f"ngram_{_bug.replace(' ', '_')}",
            "spec_decode",
            "propose_ngram",
            _what,
            _lookup_mutant(_bug),
        )
    )


@mutant("spec_decode", "propose_ngram", "checks the token ids before the settings")
def ngram_tokens_first(token_ids: Any, num: Any, lo: Any, hi: Any) -> Any:
    tokens = SD._token_list(token_ids)
    SD.propose_ngram(tokens, num, lo, hi)
    return _proposal(tokens, num, lo, hi)


@mutant("spec_decode", "propose_ngram", "takes bools for ints (settings and token ids)")
def ngram_accepts_bools(token_ids: Any, num: Any, lo: Any, hi: Any) -> Any:
    tokens = [int(t) if isinstance(t, bool) else t for t in SD._token_list(token_ids)]
    ints = [int(v) if isinstance(v, bool) else v for v in (num, lo, hi)]
    SD.propose_ngram(tokens, *ints)
    return _proposal(tokens, *ints)


@mutant("spec_decode", "propose_ngram", "compares the ids in int32 (truncated)")
def ngram_int32_ids(token_ids: Any, num: Any, lo: Any, hi: Any) -> Any:
    SD.propose_ngram(token_ids, num, lo, hi)
    tokens = SD._token_list(token_ids)
    start, stop = _lookup([(t + 2**31) % 2**32 - 2**31 for t in tokens], num, lo, hi)
    return tokens[start:stop]


@mutant("spec_decode", "propose_ngram", "reads a list through np.asarray(token_ids, int64)")
def ngram_int64_lists(token_ids: Any, num: Any, lo: Any, hi: Any) -> Any:
    SD.propose_ngram(token_ids, num, lo, hi)
    if isinstance(token_ids, list) and token_ids:
        token_ids = np.asarray(token_ids, dtype=np.int64)
    return _proposal(SD._token_list(token_ids), num, lo, hi)


@mutant("spec_decode", "propose_ngram", "reads an array's buffer as if it were contiguous")
def ngram_ignores_strides(token_ids: Any, num: Any, lo: Any, hi: Any) -> Any:
    SD.propose_ngram(token_ids, num, lo, hi)
    if library_of(token_ids) == "torch":
        token_ids = token_ids.as_strided(token_ids.shape, (1,))
    elif isinstance(token_ids, np.ndarray) and token_ids.size:
        token_ids = np.lib.stride_tricks.as_strided(
            token_ids, token_ids.shape, (token_ids.itemsize,)
        )
    return _proposal(SD._token_list(token_ids), num, lo, hi)


@mutant("spec_decode", "propose_ngram", "reverses the token ids in place to scan them")
def ngram_reverses_in_place(token_ids: Any, num: Any, lo: Any, hi: Any) -> Any:
    out = SD.propose_ngram(token_ids, num, lo, hi)
    if isinstance(token_ids, list):
        token_ids.reverse()
    elif library_of(token_ids) == "torch":
        token_ids.copy_(token_ids.flip(0))
    elif isinstance(token_ids, np.ndarray):
        token_ids[:] = token_ids[::-1].copy()
    return out


# --- tokenize -------------------------------------------------------------------------------
# A tokenize mutant is a loader of the embedded vocabulary (`tokenize.embedded`): it returns
# the reference's encoding of it as a subclass with one method changed.


def encoding_mutant(name: str, bug: str) -> Callable[[type], type]:
    """Decorator: a subclass of the reference's BytePairEncoding, loaded with the embedded
    vocabulary, is the mutant `name` of `tokenize.embedded`."""

    def deco(cls: type) -> type:
        def load() -> Any:
            # the reference's encoding, as an instance of `cls` (as pyagent_accel builds its own)
            encoding = T.BytePairEncoding.from_tokenizer_json(bpe_corpus.embedded_tokenizer_json())
            mutated = cls.__new__(cls)
            mutated.__dict__.update(vars(encoding))
            return mutated

        MUTANTS.append(Mutant(name, "tokenize", "embedded", bug, functools.cache(load)))
        return cls

    return deco


@encoding_mutant(
    "bpe_merges_left_to_right", "merges the leftmost mergeable pair, not the lowest rank"
)
class _MergesLeftToRight(T.BytePairEncoding):
    def _encode_piece(self, piece: bytes) -> tuple[int, ...]:
        parts, i = [bytes([b]) for b in piece], 0
        while i < len(parts) - 1:
            if (parts[i], parts[i + 1]) in self.merges:
                parts[i : i + 2] = [parts[i] + parts[i + 1]]
                i = max(i - 1, 0)
            else:
                i += 1
        return tuple(self.vocab[part] for part in parts)


@encoding_mutant("bpe_specials_always_allowed", "matches every special token, whatever the sets")
class _SpecialsAlwaysAllowed(T.BytePairEncoding):
    def encode(self, text: Any, *, allowed_special: Any, disallowed_special: Any) -> list[int]:
        T.resolve_special_sets(self.special_tokens, allowed_special, disallowed_special)
        return super().encode(text, allowed_special="all")


@encoding_mutant("bpe_specials_never_ids", "encodes allowed special tokens as ordinary text")
class _SpecialsNeverIds(T.BytePairEncoding):
    def encode(self, text: Any, *, allowed_special: Any, disallowed_special: Any) -> list[int]:
        _, disallowed = T.resolve_special_sets(
            self.special_tokens, allowed_special, disallowed_special
        )
        return super().encode(text, allowed_special=frozenset(), disallowed_special=disallowed)


@encoding_mutant(
    "bpe_ignores_unknown_special_names",
    "ignores names in the special sets that are not special tokens (as tiktoken does)",
)
class _IgnoresUnknownSpecialNames(T.BytePairEncoding):
    def encode(self, text: Any, *, allowed_special: Any, disallowed_special: Any) -> list[int]:
        def known(names: Any) -> Any:
            return names if isinstance(names, str) else frozenset(names) & self.special_tokens

        return super().encode(
            text,
            allowed_special=known(allowed_special),
            disallowed_special=known(disallowed_special),
        )


@encoding_mutant("bpe_encodes_bytes", "takes UTF-8 bytes as text instead of raising TypeError")
class _EncodesBytes(T.BytePairEncoding):
    def encode(self, text: Any, **sets: Any) -> list[int]:
        return super().encode(text.decode("utf-8") if isinstance(text, bytes) else text, **sets)


@encoding_mutant(
    "bpe_replaces_lone_surrogates", "replaces a lone surrogate with U+FFFD (as tiktoken does)"
)
class _ReplacesLoneSurrogates(T.BytePairEncoding):
    def encode(self, text: Any, **sets: Any) -> list[int]:
        if isinstance(text, str):
            text = text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
        return super().encode(text, **sets)


@encoding_mutant("bpe_normalizes_nfc", "encodes the NFC normal form of the text")
class _NormalizesNfc(T.BytePairEncoding):
    def encode(self, text: Any, **sets: Any) -> list[int]:
        if isinstance(text, str):
            text = unicodedata.normalize("NFC", text)
        return super().encode(text, **sets)


@encoding_mutant("bpe_decode_drops_invalid_bytes", "decode drops invalid UTF-8 instead of U+FFFD")
class _DecodeDropsInvalidBytes(T.BytePairEncoding):
    def decode(self, ids: Any) -> str:
        return b"".join(self.token_bytes(ids)).decode("utf-8", errors="ignore")


@encoding_mutant(
    "bpe_decode_skips_special_tokens", "decode leaves special tokens out (skip_special_tokens)"
)
class _DecodeSkipsSpecialTokens(T.BytePairEncoding):
    def decode(self, ids: Any) -> str:
        special = {self.added_tokens[text].id for text in self.special_tokens}
        return super().decode(
            [i for i in ids if i not in special] if isinstance(ids, list) else ids
        )


@encoding_mutant(
    "bpe_decode_skips_unknown_ids", "decode skips ids outside the vocabulary (as tokenizers does)"
)
class _DecodeSkipsUnknownIds(T.BytePairEncoding):
    def decode(self, ids: Any) -> str:
        if isinstance(ids, list):
            ids = [i for i in ids if not isinstance(i, int) or 0 <= i < self.vocab_size]
        return super().decode(ids)


@encoding_mutant("bpe_decode_takes_bools", "decode takes a bool as an id (as tiktoken does)")
class _DecodeTakesBools(T.BytePairEncoding):
    def decode(self, ids: Any) -> str:
        if isinstance(ids, list):
            ids = [int(i) if isinstance(i, bool) else i for i in ids]
        return super().decode(ids)


# --- matcher --------------------------------------------------------------------------------
# A matcher mutant is the reference's compiler of JSON Schemas (`matcher.json_schema`) whose
# matchers are the reference's GrammarMatcher with one method changed.


class _Matcher:
    """The reference's matcher, every call passed on (the mutants override one)."""

    def __init__(self, matcher: Any) -> None:
        self.matcher = matcher

    def fill_next_token_bitmask(self, bitmask: Any, index: int = 0) -> None:
        self.matcher.fill_next_token_bitmask(bitmask, index)

    def accept_token(self, token_id: int) -> bool:
        return self.matcher.accept_token(token_id)

    def is_terminated(self) -> bool:
        return self.matcher.is_terminated()

    def rollback(self, num_tokens: int) -> None:
        self.matcher.rollback(num_tokens)


def matcher_mutant(name: str, bug: str) -> Callable[[type], type]:
    """Decorator: the reference's ``matcher.json_schema`` whose matchers are instances of the
    `_Matcher` subclass `cls` is the mutant `name`."""

    def deco(cls: type) -> type:
        def json_schema(schema: Any, vocabulary: str) -> Any:
            compiled = _reference_json_schema(schema, vocabulary)
            return SimpleNamespace(matcher=lambda: cls(compiled.matcher()))

        MUTANTS.append(Mutant(name, "matcher", "json_schema", bug, json_schema))
        return cls

    return deco


def _set_bit(bitmask: Any, index: int, token: int, value: bool) -> None:
    row = bitmask[index].view(np.uint32)
    bit = np.uint32(1) << np.uint32(token % 32)
    row[token // 32] = row[token // 32] | bit if value else row[token // 32] & ~bit


@matcher_mutant("matcher_forgets_eos", "never allows EOS: an output cannot end")
class _ForgetsEos(_Matcher):
    def fill_next_token_bitmask(self, bitmask: Any, index: int = 0) -> None:
        super().fill_next_token_bitmask(bitmask, index)
        for token in self.matcher.eos_token_ids:
            _set_bit(bitmask, index, token, False)

    def accept_token(self, token_id: int) -> bool:
        return token_id not in self.matcher.eos_token_ids and super().accept_token(token_id)


@matcher_mutant("matcher_allows_one_more", "the mask allows one token the grammar refuses")
class _AllowsOneMore(_Matcher):
    def fill_next_token_bitmask(self, bitmask: Any, index: int = 0) -> None:
        super().fill_next_token_bitmask(bitmask, index)
        allowed = set(self.matcher.allowed_tokens())
        spelled = self.matcher.trie.token_bytes
        extra = next(t for t, b in enumerate(spelled) if b is not None and t not in allowed)
        _set_bit(bitmask, index, extra, True)


@matcher_mutant("matcher_ignores_rollback", "rollback does nothing")
class _IgnoresRollback(_Matcher):
    def rollback(self, num_tokens: int) -> None:
        pass


@matcher_mutant("matcher_goes_on_after_eos", "EOS sets the flag but the matcher goes on")
class _GoesOnAfterEos(_Matcher):
    def __init__(self, matcher: Any) -> None:
        super().__init__(matcher)
        self.ended = False

    def fill_next_token_bitmask(self, bitmask: Any, index: int = 0) -> None:
        if self.ended:
            self.matcher.rollback(1)  # the mask of the state before EOS
            self.matcher.fill_next_token_bitmask(bitmask, index)
            self.matcher.accept_token(self.matcher.eos_token_ids[0])
        else:
            super().fill_next_token_bitmask(bitmask, index)

    def accept_token(self, token_id: int) -> bool:
        if self.ended:
            return token_id not in self.matcher.eos_token_ids and self._after_eos(token_id)
        took = super().accept_token(token_id)
        self.ended = took and self.matcher.is_terminated()
        return took

    def _after_eos(self, token_id: int) -> bool:
        self.matcher.rollback(1)
        took = self.matcher.accept_token(token_id)
        if took:
            self.matcher.rollback(1)
        self.matcher.accept_token(self.matcher.eos_token_ids[0])
        return took

    def is_terminated(self) -> bool:
        return self.ended

    def rollback(self, num_tokens: int) -> None:
        super().rollback(num_tokens)
        self.ended = self.matcher.is_terminated()


@matcher_mutant("matcher_fills_row_zero", "fills row 0 whatever the index")
class _FillsRowZero(_Matcher):
    def fill_next_token_bitmask(self, bitmask: Any, index: int = 0) -> None:
        super().fill_next_token_bitmask(bitmask, 0)


def _reference_json_schema(schema: Any, vocabulary: str) -> Any:
    from .specs.matcher import namespace_of_structured_package

    return namespace_of_structured_package(REFERENCE).json_schema(schema, vocabulary)


@mutant("matcher", "json_schema", "refuses every schema with anyOf or oneOf")
def matcher_refuses_alternatives(schema: Any, vocabulary: str) -> Any:
    if any(f'"{keyword}"' in json.dumps(schema) for keyword in ("anyOf", "oneOf")):
        raise ValueError("anyOf and oneOf are not supported")
    return _reference_json_schema(schema, vocabulary)


BOUNDS = ("minimum", "maximum", "minLength", "maxLength", "minItems", "maxItems", "pattern")


@mutant("matcher", "json_schema", "ignores the bounds of values (minimum, maxLength, pattern...)")
def matcher_ignores_bounds(schema: Any, vocabulary: str) -> Any:
    def unbounded(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: unbounded(v) for k, v in node.items() if k not in BOUNDS}
        return [unbounded(v) for v in node] if isinstance(node, list) else node

    return _reference_json_schema(unbounded(schema), vocabulary)


# --- DRY, XTC and mirostat v2 ------------------------------------------------------------------


def _dry(
    logits: Any,
    token_ids: Any,
    multiplier: Any,
    base: Any,
    allowed_length: Any,
    penalty_last_n: Any,
    sequence_breakers: Any,
    *,
    shift: int = 0,
    exponent_shift: int = 0,
    cap_at_breakers: bool = True,
    spare_breakers: bool = True,
    window: bool = True,
    clamp: bool = True,
) -> Any:
    """apply_dry by brute force with one thing changed: the length a repeat must reach
    (allowed_length + shift), the exponent, breakers (not capping the repeat, or penalised
    themselves), the penalty_last_n window ignored, or no clamp (a huge penalty masks)."""
    S.apply_dry(
        logits, token_ids, multiplier, base, allowed_length, penalty_last_n, sequence_breakers
    )
    x = _np(logits)
    out = x.astype(np.float64)
    mult, bases = _np(multiplier).astype(np.float64), _np(base).astype(np.float64)
    floors, lasts = _np(allowed_length).tolist(), _np(penalty_last_n).tolist()
    for b, tokens in enumerate(_rows(token_ids)):
        if mult[b] == 0 or lasts[b] == 0:
            continue
        if lasts[b] > 0 and window:
            tokens = tokens[-lasts[b] :]
        stops = {t for t in _np(sequence_breakers)[b].tolist() if t >= 0}
        size, longest = len(tokens), {}
        for i in range(size - 1):
            n = 0
            while (
                n <= i
                and tokens[i - n] == tokens[size - 1 - n]
                and not (cap_at_breakers and tokens[i - n] in stops)
            ):
                n += 1
            follower = tokens[i + 1]
            if n and (follower not in stops or not spare_breakers):
                longest[follower] = max(longest.get(follower, 0), n)
        floor = floors[b] + shift
        for token, n in longest.items():
            if n >= floor:
                with np.errstate(over="ignore"):
                    power = float(np.power(bases[b], n - floors[b] + exponent_shift))
                out[b, token] -= mult[b] * power
    with np.errstate(over="ignore"):
        rounded = out.astype(x.dtype)
    if clamp:
        lowest = np.finfo(x.dtype).min
        rounded = np.where(np.isfinite(x) & (rounded < lowest), lowest, rounded)
    return _back(logits, rounded)


@mutant("sampling", "apply_dry", "penalises only repeats longer than allowed_length (off by one)")
def dry_allowed_off_by_one(*args: Any) -> Any:
    return _dry(*args, shift=1)


@mutant("sampling", "apply_dry", "exponent n - allowed_length + 1")
def dry_exponent_off_by_one(*args: Any) -> Any:
    return _dry(*args, exponent_shift=1)


@mutant("sampling", "apply_dry", "a repeat reaches back across a sequence breaker")
def dry_crosses_breakers(*args: Any) -> Any:
    return _dry(*args, cap_at_breakers=False)


@mutant("sampling", "apply_dry", "penalises breaker tokens too")
def dry_penalises_breakers(*args: Any) -> Any:
    return _dry(*args, spare_breakers=False)


@mutant("sampling", "apply_dry", "ignores penalty_last_n > 0 (always the whole context)")
def dry_ignores_window(*args: Any) -> Any:
    return _dry(*args, window=False)


@mutant("sampling", "apply_dry", "a penalty beyond the dtype masks the token (no clamp)")
def dry_masks_on_overflow(*args: Any) -> Any:
    return _dry(*args, clamp=False)


def _xtc(
    logits: Any,
    threshold: Any,
    probability: Any,
    seeds: Any,
    positions: Any,
    *,
    keep: str = "least",
    entry: Callable[[int], int] = lambda vocab: vocab + 1,
) -> Any:
    """apply_xtc with one thing changed: which candidate stays (`keep`: least or most likely)
    or the coin's entry of the stream (`entry(vocab)`)."""
    S.apply_xtc(logits, threshold, probability, seeds, positions)
    x = _np(logits)
    vocab = x.shape[1]
    u = _np(S.philox_uniform(seeds, positions, vocab + 2))
    coins = u[:, entry(vocab)]
    cut, chance = _np(threshold).astype(np.float64), _np(probability).astype(np.float64)
    keep_mask = np.ones(x.shape, bool)
    for b, row in enumerate(x):
        p = _probs(row)
        candidate = np.isfinite(row) & (p >= cut[b])
        if not (coins[b] < chance[b] and candidate.sum() >= 2):
            continue
        if keep == "least":
            keep_mask[b] = ~(candidate & (row > row[candidate].min()))
        else:
            keep_mask[b] = ~(candidate & (row < row[candidate].max()))
    return _keep(logits, keep_mask)


@mutant("sampling", "apply_xtc", "keeps the most likely candidate instead of the least")
def xtc_keeps_the_most_likely(*args: Any) -> Any:
    return _xtc(*args, keep="most")


@mutant("sampling", "apply_xtc", "reuses sample's coin: entry 0 of the stream")
def xtc_reuses_sample_coin(*args: Any) -> Any:
    return _xtc(*args, entry=lambda vocab: 0)


@mutant("sampling", "apply_xtc", "reuses rejection sampling's coin: entry vocab")
def xtc_reuses_acceptance_coin(*args: Any) -> Any:
    return _xtc(*args, entry=lambda vocab: vocab)


@mutant("sampling", "apply_xtc", "ignores the probability: fires at every position")
def xtc_ignores_probability(logits: Any, threshold: Any, probability: Any, *rest: Any) -> Any:
    return _xtc(logits, threshold, _back(probability, np.ones(_np(probability).shape)), *rest)


def _mirostat_cut(logits: Any, mu: Any, *, base: float = 2.0, keep_max: bool = True) -> Any:
    S.apply_mirostat(logits, mu)
    x = _np(logits)
    m = _np(mu).astype(np.float64)
    keep = np.ones(x.shape, bool)
    for b, row in enumerate(x):
        p = _probs(row)
        keep[b] = ~(p < base ** -m[b])
        if keep_max:
            keep[b] |= row == row.max()
    return _keep(logits, keep)


@mutant("sampling", "apply_mirostat", "surprise in nats: masks p < e ** -mu")
def mirostat_cut_in_nats(logits: Any, mu: Any) -> Any:
    return _mirostat_cut(logits, mu, base=math.e)


@mutant("sampling", "apply_mirostat", "may mask every token (no keep-the-top rule)")
def mirostat_masks_max(logits: Any, mu: Any) -> Any:
    return _mirostat_cut(logits, mu, keep_max=False)


def _mirostat_update(
    logits: Any, sampled: Any, mu: Any, tau: Any, eta: Any, *, log: Any = math.log2, sign: int = 1
) -> Any:
    out = _np(S.mirostat_update(logits, sampled, mu, tau, eta))
    x = _np(logits).astype(np.float64)
    m, t, e = (_np(v).astype(np.float64) for v in (mu, tau, eta))
    for b, token in enumerate(_np(sampled).tolist()):
        p = _probs(x[b])[token]
        out[b] = m[b] - sign * e[b] * (-log(p) - t[b])
    return _back(logits, out)


@mutant("sampling", "mirostat_update", "takes the surprise in nats (log, not log2)")
def mirostat_update_in_nats(*args: Any) -> Any:
    return _mirostat_update(*args, log=math.log)


@mutant("sampling", "mirostat_update", "moves mu the wrong way (mu + eta * error)")
def mirostat_update_wrong_sign(*args: Any) -> Any:
    return _mirostat_update(*args, sign=-1)


@mutant("sampling", "mirostat_update", "does not update mu")
def mirostat_update_stays(logits: Any, sampled: Any, mu: Any, tau: Any, eta: Any) -> Any:
    S.mirostat_update(logits, sampled, mu, tau, eta)
    return _back(logits, _np(mu).astype(np.float64))


# --- moe ------------------------------------------------------------------------------------


def _routed(like: Any, weights: np.ndarray, ids: np.ndarray, dtype: Any) -> tuple[Any, Any]:
    return _back(like, weights.astype(dtype)), _back(like, ids.astype(np.int64))


def _topk_softmax(logits: Any, k: int, renormalize: bool, ties_high: bool = False) -> Any:
    w_ref, _ = M.route_topk_softmax(logits, k, renormalize)
    x = _np(logits).astype(np.float64)
    if ties_high:  # among equal logits, the higher id first
        rev = np.argsort(-x[:, ::-1], axis=1, kind="stable")[:, :k]
        ids = x.shape[1] - 1 - rev
    else:
        ids = np.argsort(-x, axis=1, kind="stable")[:, :k]
    p = np.exp(x - x.max(axis=1, keepdims=True)) if x.size else x
    p = p / p.sum(axis=1, keepdims=True) if x.size else p
    w = np.take_along_axis(p, ids, axis=1)
    if renormalize and w.size:
        w = w / w.sum(axis=1, keepdims=True)
    return _routed(logits, w, ids, _np(w_ref).dtype)


@mutant("moe", "route_topk_softmax", "never renormalises the chosen weights")
def topk_softmax_no_renormalize(logits: Any, k: int, renormalize: bool) -> Any:
    M.route_topk_softmax(logits, k, renormalize)
    return _topk_softmax(logits, k, False)


@mutant("moe", "route_topk_softmax", "breaks ties between equal logits by the higher expert id")
def topk_softmax_ties_high_id(logits: Any, k: int, renormalize: bool) -> Any:
    M.route_topk_softmax(logits, k, renormalize)
    return _topk_softmax(logits, k, renormalize, ties_high=True)


@mutant("moe", "route_topk_softmax", "returns the chosen experts in id order, not score order")
def topk_softmax_ids_sorted(logits: Any, k: int, renormalize: bool) -> Any:
    w, ids = (_np(a) for a in M.route_topk_softmax(logits, k, renormalize))
    order = np.argsort(ids, axis=1, kind="stable")
    return _routed(
        logits, np.take_along_axis(w, order, 1), np.take_along_axis(ids, order, 1), w.dtype
    )


def _grouped(
    *args: Any,
    bias_in_weights=False,
    by_max=False,
    no_groups=False,
    scale_first=False,
    ties_high=False,
) -> Any:
    logits, k, num_groups, topk_groups, bias, scoring, scale, renormalize, group_score = (
        list(args) + [None, "sigmoid", 1.0, True, "top2_sum"][len(args) - 4 :]
    )
    w_ref, _ = M.route_grouped_topk(*args)
    x = _np(logits).astype(np.float64)
    tokens, experts = x.shape
    if scoring == "sigmoid":
        s = 1 / (1 + np.exp(-x))
    else:
        s = np.exp(x - x.max(axis=1, keepdims=True)) if x.size else x
        s = s / s.sum(axis=1, keepdims=True) if x.size else s
    b = s if bias is None else s + _np(bias).astype(np.float64)
    size = experts // num_groups
    g = b.reshape(tokens, num_groups, size)
    per_group = (
        g.max(axis=2)
        if by_max or group_score == "max"
        else -np.sort(-g, axis=2)[:, :, :2].sum(axis=2)
    )
    kept = np.argsort(-per_group, axis=1, kind="stable")[:, :topk_groups]
    in_kept = (np.arange(experts)[None, :, None] // size == kept[:, None, :]).any(axis=2)
    if no_groups:
        in_kept[:] = True
    candidates = np.where(in_kept, b, -np.inf)
    if ties_high:  # among equal scores, the higher id first
        ids = experts - 1 - np.argsort(-candidates[:, ::-1], axis=1, kind="stable")[:, :k]
    else:
        ids = np.argsort(-candidates, axis=1, kind="stable")[:, :k]
    w = np.take_along_axis(b if bias_in_weights else s, ids, axis=1)
    if scale_first:
        w = w * scale
    if renormalize:
        w = w / (w.sum(axis=1, keepdims=True) + 1e-20)
    if not scale_first:
        w = w * scale
    return _routed(logits, w, ids, _np(w_ref).dtype)


@mutant("moe", "route_grouped_topk", "weights the experts by their biased scores")
def grouped_bias_in_weights(*args: Any) -> Any:
    return _grouped(*args, bias_in_weights=True)


@mutant("moe", "route_grouped_topk", "scores a group by its best expert instead of its top 2")
def grouped_groups_by_max(*args: Any) -> Any:
    return _grouped(*args, by_max=True)


@mutant("moe", "route_grouped_topk", "ignores the groups: top-k over every expert")
def grouped_ignores_groups(*args: Any) -> Any:
    return _grouped(*args, no_groups=True)


@mutant("moe", "route_grouped_topk", "breaks ties between equal scores by the higher expert id")
def grouped_ties_high_id(*args: Any) -> Any:
    return _grouped(*args, ties_high=True)


@mutant("moe", "route_grouped_topk", "scales by routed_scaling_factor before renormalising")
def grouped_scales_first(*args: Any) -> Any:
    return _grouped(*args, scale_first=True)


def _fused(hidden: Any, w_gate_up: Any, w_down: Any, weights: Any, ids: Any, **bug: bool) -> Any:
    h, wgu, wd = (_np(a).astype(np.float64) for a in (hidden, w_gate_up, w_down))
    w, e = _np(weights).astype(np.float64), _np(ids).astype(np.int64)
    inter = wgu.shape[1] // 2
    out = np.zeros(h.shape)
    for t in range(e.shape[0]):
        for j in range(1 if bug.get("first_slot") else e.shape[1]):
            gu = wgu[e[t, j]] @ h[t]
            g, u = (gu[inter:], gu[:inter]) if bug.get("swapped") else (gu[:inter], gu[inter:])
            y = wd[e[t, j]] @ (g / (1 + np.exp(-g)) * u)
            out[t] += y if bug.get("unweighted") else w[t, j] * y
    return _back(hidden, out.astype(_np(hidden).dtype))


@mutant("moe", "fused_moe", "does not multiply the experts' outputs by the routing weights")
def fused_moe_unweighted(hidden: Any, w_gate_up: Any, w_down: Any, *rest: Any) -> Any:
    M.fused_moe(hidden, w_gate_up, w_down, *rest)
    return _fused(hidden, w_gate_up, w_down, *rest[:2], unweighted=True)


@mutant("moe", "fused_moe", "applies silu to the up half instead of the gate half")
def fused_moe_swapped_halves(hidden: Any, w_gate_up: Any, w_down: Any, *rest: Any) -> Any:
    M.fused_moe(hidden, w_gate_up, w_down, *rest)
    return _fused(hidden, w_gate_up, w_down, *rest[:2], swapped=True)


@mutant("moe", "fused_moe", "uses only each token's first expert")
def fused_moe_first_slot_only(hidden: Any, w_gate_up: Any, w_down: Any, *rest: Any) -> Any:
    M.fused_moe(hidden, w_gate_up, w_down, *rest)
    return _fused(hidden, w_gate_up, w_down, *rest[:2], first_slot=True)


@mutant("moe", "fused_moe", "computes every expert on every token (reads unused experts)")
def fused_moe_dense(
    hidden: Any, w_gate_up: Any, w_down: Any, weights: Any, ids: Any, *rest: Any
) -> Any:
    out = M.fused_moe(hidden, w_gate_up, w_down, weights, ids, *rest)
    poison = np.isnan(_np(w_gate_up)).any() or np.isnan(_np(w_down)).any()
    return _back(hidden, _np(out) * np.nan) if poison else out


# --- lora -----------------------------------------------------------------------------------


def _shrink(x: Any, lora_a: Any, indices: Any, **bug: bool) -> Any:
    """lora_shrink in numpy, with one of the bugs below."""
    LO.lora_shrink(x, lora_a, indices)
    h, a, idx = _np(x).astype(np.float64), _np(lora_a).astype(np.float64), _np(indices)
    y = np.zeros((h.shape[0], a.shape[1]))
    if bug.get("dense"):  # every slot's product, masked by a one-hot of the index
        onehot = (idx[:, None] == np.arange(a.shape[0])[None, :]).astype(np.float64)
        return _back(x, np.einsum("tl,lri,ti->tr", onehot, a, h).astype(np.float32))
    order = np.argsort(idx, kind="stable") if bug.get("sorted") else np.arange(len(idx))
    for row, t in enumerate(order):
        i = int(idx[t])
        if i >= 0 or bug.get("wraps"):
            y[row if bug.get("sorted") else t] = a[i] @ h[t]
    dtype = np.float64 if _np(x).dtype == np.float64 else np.float32
    return _back(x, y.astype(_np(x).dtype if bug.get("keeps_dtype") else dtype))


@mutant("lora", "lora_shrink", "gives tokens without an adapter (index -1) the last slot")
def shrink_wraps_minus_one(x: Any, lora_a: Any, indices: Any) -> Any:
    return _shrink(x, lora_a, indices, wraps=True)


@mutant("lora", "lora_shrink", "sorts the tokens by slot and leaves the results sorted")
def shrink_results_in_slot_order(x: Any, lora_a: Any, indices: Any) -> Any:
    return _shrink(x, lora_a, indices, sorted=True)


@mutant("lora", "lora_shrink", "multiplies every slot by a one-hot mask (reads unused slots)")
def shrink_reads_every_slot(x: Any, lora_a: Any, indices: Any) -> Any:
    return _shrink(x, lora_a, indices, dense=True)


@mutant("lora", "lora_shrink", "takes indices below -1 for 'no adapter' instead of refusing them")
def shrink_accepts_any_negative_index(x: Any, lora_a: Any, indices: Any) -> Any:
    idx = _np(indices)
    if idx.dtype.kind in "iu" and idx.shape == (_np(x).shape[:1]):
        indices = _back(indices, np.maximum(idx, -1))
    return LO.lora_shrink(x, lora_a, indices)


@mutant("lora", "lora_shrink", "returns x's dtype instead of the compute dtype")
def shrink_keeps_input_dtype(x: Any, lora_a: Any, indices: Any) -> Any:
    return _shrink(x, lora_a, indices, keeps_dtype=True)


def _expand(
    y: Any,
    lora_b: Any,
    indices: Any,
    scaling: Any,
    out: Any = None,
    output_slices: Any = None,
    **bug: bool,
) -> Any:
    """lora_expand in numpy, with one of the bugs below."""
    ref_out = None if out is None else _back(out, _np(out))
    LO.lora_expand(y, lora_b, indices, scaling, ref_out, output_slices)
    v, b, idx = _np(y).astype(np.float64), _np(lora_b).astype(np.float64), _np(indices)
    s = _np(scaling).astype(np.float64)
    rank = b.shape[2]
    sizes = list(output_slices or (b.shape[1],))
    delta = np.zeros((v.shape[0], b.shape[1]))
    if bug.get("dense"):  # every slot's product, masked by a one-hot of the index
        onehot = (idx[:, None] == np.arange(b.shape[0])[None, :]).astype(np.float64)
        if len(sizes) == 1:
            delta = np.einsum("tl,l,lor,tr->to", onehot, s, b, v)
    for t, i in enumerate(idx.tolist()):
        if i < 0 or bug.get("dense") and len(sizes) == 1:
            continue
        start = 0
        for n, size in enumerate(sizes):
            cols = slice(0, rank) if bug.get("first_slice") else slice(n * rank, (n + 1) * rank)
            scale = 1.0 if bug.get("unscaled") else s[0] if bug.get("first_scale") else s[i]
            delta[t, start : start + size] = scale * (b[i, start : start + size] @ v[t, cols])
            start += size
    compute = np.float64 if _np(y).dtype == np.float64 else np.float32
    if out is None:
        return _back(y, delta.astype(compute))
    o = _np(out)
    rows = np.ones(len(idx), bool) if bug.get("every_row") else idx >= 0
    new = o.copy()
    new[rows] = (o[rows].astype(np.float64) + delta[rows]).astype(o.dtype)
    if bug.get("new_array"):
        return _back(out, new)
    out[...] = _back(out, new)
    return out


@mutant("lora", "lora_expand", "does not multiply by the adapter's scaling")
def expand_unscaled(*args: Any, **kwargs: Any) -> Any:
    return _expand(*args, **kwargs, unscaled=True)


@mutant("lora", "lora_expand", "scales every token by slot 0's scaling")
def expand_first_scaling(*args: Any, **kwargs: Any) -> Any:
    return _expand(*args, **kwargs, first_scale=True)


@mutant("lora", "lora_expand", "every output slice reads the first slice's rank columns")
def expand_first_slice_columns(*args: Any, **kwargs: Any) -> Any:
    return _expand(*args, **kwargs, first_slice=True)


@mutant("lora", "lora_expand", "rewrites the rows of tokens without an adapter (out + 0)")
def expand_rewrites_every_row(*args: Any, **kwargs: Any) -> Any:
    return _expand(*args, **kwargs, every_row=True)


@mutant("lora", "lora_expand", "multiplies every slot by a one-hot mask (reads unused slots)")
def expand_reads_every_slot(*args: Any, **kwargs: Any) -> Any:
    return _expand(*args, **kwargs, dense=True)


@mutant("lora", "lora_expand", "returns a new array instead of adding into out")
def expand_not_in_place(*args: Any, **kwargs: Any) -> Any:
    return _expand(*args, **kwargs, new_array=True)


# --- quant ----------------------------------------------------------------------------------


def _rtn(weight: Any, bits: int, group_size: Any, symmetric: bool, **bug: bool) -> Any:
    """quantize in numpy, with one of the bugs below."""
    Q.quantize(weight, bits, group_size, symmetric)
    w = _np(weight)
    c = np.float64 if w.dtype == np.float64 else np.float32
    rows, columns = w.shape
    size = group_size or columns
    w = w.astype(c).reshape(rows, columns // size, size)
    lo, hi = np.minimum(w.min(axis=2), c(0)), np.maximum(w.max(axis=2), c(0))
    if bug.get("range_without_zero"):
        lo, hi = w.min(axis=2), w.max(axis=2)
    qmin, qmax = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    half_range = qmax if bug.get("absmax_over_qmax") else (qmax - qmin) / 2
    s = np.maximum(-lo, hi) / c(half_range) if symmetric else (hi - lo) / c(qmax - qmin)
    s = np.where(s == 0, c(1), s).astype(c)
    z = np.zeros_like(s) if symmetric else np.clip(qmin - np.round(lo / s), qmin, qmax)
    v = w / s[:, :, None]
    v = np.floor(v + 0.5) if bug.get("half_up") else np.round(v)
    q = np.clip(v + z[:, :, None], qmin, qmax).reshape(rows, columns).astype(np.int8)
    zeros = None if symmetric and not bug.get("zeros_when_symmetric") else z.astype(np.int8)
    return tuple(None if a is None else _back(weight, a) for a in (q, s, zeros))


@mutant("quant", "quantize", "symmetric scale absmax / qmax (7 for int4) instead of / 7.5")
def quantize_over_qmax(*args: Any) -> Any:
    return _rtn(*args, absmax_over_qmax=True)


@mutant("quant", "quantize", "rounds ties up (floor(v + 0.5)) instead of to even")
def quantize_rounds_half_up(*args: Any) -> Any:
    return _rtn(*args, half_up=True)


@mutant("quant", "quantize", "leaves 0 out of an asymmetric group's range")
def quantize_range_without_zero(*args: Any) -> Any:
    return _rtn(*args, range_without_zero=True)


@mutant("quant", "quantize", "returns zero points of 0 for symmetric instead of None")
def quantize_zeros_when_symmetric(*args: Any) -> Any:
    return _rtn(*args, zeros_when_symmetric=True)


def _dequant(codes: Any, scales: Any, zeros: Any = None, **bug: bool) -> Any:
    """dequantize in numpy, with one of the bugs below."""
    Q.dequantize(codes, scales, zeros)
    q, s = _np(codes), _np(scales)
    c = np.float64 if s.dtype == np.float64 else np.float32
    rows, columns = q.shape
    groups = s.shape[1]
    group = (
        np.arange(columns) % groups
        if bug.get("interleaved")
        else np.arange(columns) // (columns // groups)
    )
    v = q.astype(c)
    if zeros is not None:
        z = _np(zeros).astype(c)[:, group]
        v = v + z if bug.get("adds_zero") else v - z
    if bug.get("half_precision") and s.dtype == np.float16:
        return _back(codes, (v.astype(np.float16) * s[:, group]).astype(c))
    return _back(codes, v * s.astype(c)[:, group])


@mutant("quant", "dequantize", "adds the zero point instead of subtracting it")
def dequantize_adds_zero(*args: Any) -> Any:
    return _dequant(*args, adds_zero=True)


@mutant("quant", "dequantize", "column i in group i % groups instead of i // group_size")
def dequantize_interleaved_groups(*args: Any) -> Any:
    return _dequant(*args, interleaved=True)


@mutant("quant", "dequantize", "multiplies in float16 for float16 scales")
def dequantize_in_half(*args: Any) -> Any:
    return _dequant(*args, half_precision=True)


def _words(codes: Any, bits: int, **bug: bool) -> Any:
    """pack_int32 in numpy, with one of the bugs below."""
    Q.pack_int32(codes, bits)
    q = _np(codes).astype(np.int64)
    per_word = 32 // bits
    rows, n = q.shape
    words = -(-n // per_word)
    fields = np.zeros((rows, words * per_word), np.int64)
    fields[:, :n] = (q & (2**bits - 1)) if bug.get("twos_complement") else q + 2 ** (bits - 1)
    fields = fields.reshape(rows, words, per_word)
    shifts = np.arange(per_word) * bits
    if bug.get("msb_first"):
        shifts = shifts[::-1]
    packed = (fields << shifts).sum(axis=2) & 0xFFFFFFFF
    return _back(codes, packed.astype(np.uint32).view(np.int32))


@mutant("quant", "pack_int32", "stores codes in two's complement instead of offset by 2^(b-1)")
def pack_twos_complement(codes: Any, bits: int) -> Any:
    return _words(codes, bits, twos_complement=True)


@mutant("quant", "pack_int32", "masks codes outside the b-bit range instead of refusing them")
def pack_wraps_out_of_range(codes: Any, bits: int) -> Any:
    q = _np(codes)
    if q.dtype == np.int8 and q.ndim == 2 and bits in Q.BITS:
        wrapped = ((q.astype(np.int64) + 2 ** (bits - 1)) % 2**bits) - 2 ** (bits - 1)
        codes = _back(codes, wrapped.astype(np.int8))
    return Q.pack_int32(codes, bits)


@mutant("quant", "pack_int32", "puts the first code in the top bits of the word")
def pack_msb_first(codes: Any, bits: int) -> Any:
    return _words(codes, bits, msb_first=True)


def _fields(packed: Any, bits: int, size: int, **bug: bool) -> Any:
    """unpack_int32 in numpy, with one of the bugs below."""
    Q.unpack_int32(packed, bits, size)
    p = _np(packed).view(np.uint32).astype(np.int64)
    per_word = 32 // bits
    order = np.arange(per_word)
    if bug.get("awq_order") and per_word == 8:  # AWQ's interleaving of int4 columns
        order = np.array([0, 4, 1, 5, 2, 6, 3, 7])
    fields = (p[:, :, None] >> (order * bits)) & (2**bits - 1)
    if bug.get("sign_extends"):
        fields = np.where(fields >= 2 ** (bits - 1), fields - 2**bits, fields)
    else:
        fields = fields - 2 ** (bits - 1)
    return _back(
        packed, fields.reshape(p.shape[0], p.shape[1] * per_word)[:, :size].astype(np.int8)
    )


@mutant("quant", "unpack_int32", "sign-extends each field instead of subtracting the offset")
def unpack_sign_extends(packed: Any, bits: int, size: int) -> Any:
    return _fields(packed, bits, size, sign_extends=True)


@mutant("quant", "unpack_int32", "reads int4 words in AWQ's interleaved column order")
def unpack_awq_order(packed: Any, bits: int, size: int) -> Any:
    return _fields(packed, bits, size, awq_order=True)


def _linear(x: Any, packed: Any, scales: Any, zeros: Any, bits: int, **bug: bool) -> Any:
    """dequant_matmul in numpy, with one of the bugs below."""
    Q.dequant_matmul(x, packed, scales, zeros, bits)
    xs = _np(x)
    c = np.float64 if xs.dtype == np.float64 else np.float32
    codes = Q.unpack_int32(_np(packed), bits, xs.shape[1])
    z = None if bug.get("ignores_zeros") else zeros if zeros is None else _np(zeros)
    w = Q.dequantize(codes, _np(scales).astype(c), z)
    y = xs.astype(c) @ w.T
    return _back(x, y if bug.get("compute_dtype") else y.astype(xs.dtype))


@mutant("quant", "dequant_matmul", "ignores the zero points")
def matmul_ignores_zeros(*args: Any) -> Any:
    return _linear(*args, ignores_zeros=True)


@mutant("quant", "dequant_matmul", "returns the compute dtype instead of x's")
def matmul_returns_compute_dtype(*args: Any) -> Any:
    return _linear(*args, compute_dtype=True)


def _fp8_quant(weight: Any, fmt: str = "e4m3", per: str = "tensor", **bug: bool) -> Any:
    """quantize_fp8 in numpy, with one of the bugs below."""
    Q.quantize_fp8(weight, fmt, per)
    w = _np(weight).astype(np.float32)
    fmt_ = Q.FP8_FORMATS["e4m3" if bug.get("e4m3_max") else fmt]
    axis = 1 if per == "channel" and not bug.get("per_tensor") else (0, 1)
    if w.shape[0] == 0:
        scales = np.ones((0 if axis == 1 else 1, 1), np.float32)
    else:
        scales = (np.abs(w).max(axis=axis, keepdims=True) / np.float32(fmt_.max)).astype(np.float32)
        if per == "channel" and bug.get("per_tensor"):
            scales = np.broadcast_to(scales, (w.shape[0], 1)).copy()
    if not bug.get("zero_scale"):
        scales = np.where(scales == 0, np.float32(1), scales)
    y = w / scales
    if bug.get("truncates"):
        table = _fp8.values(Q.FP8_FORMATS[fmt])[: Q.FP8_FORMATS[fmt].max_code + 1]
        a = np.abs(y).reshape(-1)
        codes = np.clip(np.searchsorted(table, a, side="right") - 1, 0, None)
        codes = codes.reshape(y.shape) + 0x80 * np.signbit(y)
        codes = codes.astype(np.uint8)
    else:
        codes = _fp8.encode(np, y, 1.0, Q.FP8_FORMATS[fmt], "cpu")
    return _back(weight, codes), _back(weight, scales)


@mutant("quant", "quantize_fp8", "divides by e4m3's max 448 for e5m2 weights too")
def fp8_quantize_e4m3_max(*args: Any) -> Any:
    return _fp8_quant(*args, e4m3_max=True)


@mutant("quant", "quantize_fp8", "rounds toward zero (drops the extra mantissa bits)")
def fp8_quantize_truncates(*args: Any) -> Any:
    return _fp8_quant(*args, truncates=True)


@mutant("quant", "quantize_fp8", "per channel: every row gets the tensor's scale")
def fp8_quantize_per_tensor(*args: Any) -> Any:
    return _fp8_quant(*args, per_tensor=True)


@mutant("quant", "quantize_fp8", "a zero tensor or row gets scale 0 (codes of NaN)")
def fp8_quantize_zero_scale(*args: Any) -> Any:
    return _fp8_quant(*args, zero_scale=True)


def _fp8_dequant(codes: Any, scales: Any, fmt: str = "e4m3", **bug: bool) -> Any:
    """dequantize_fp8 in numpy, with one of the bugs below."""
    Q.dequantize_fp8(codes, scales, fmt)
    q, s = _np(codes), _np(scales).astype(np.float32)
    fmt_ = Q.FP8_FORMATS[fmt]
    values = _fp8.values(fmt_) * np.float32(0.5 if bug.get("bias_off_by_one") else 1)
    if bug.get("no_sign"):
        values = np.abs(values)
    w = values[q.astype(np.int64)]
    return _back(codes, (w / s if bug.get("divides") else w * s).astype(np.float32))


@mutant("quant", "dequantize_fp8", "exponent bias one too large (every value halved)")
def fp8_dequantize_bias(*args: Any) -> Any:
    return _fp8_dequant(*args, bias_off_by_one=True)


@mutant("quant", "dequantize_fp8", "divides by the scale instead of multiplying")
def fp8_dequantize_divides(*args: Any) -> Any:
    return _fp8_dequant(*args, divides=True)


@mutant("quant", "dequantize_fp8", "ignores the sign bit")
def fp8_dequantize_no_sign(*args: Any) -> Any:
    return _fp8_dequant(*args, no_sign=True)


def _fp8_linear(
    x: Any, codes: Any, scales: Any, fmt: str = "e4m3", input_scale: Any = None, **bug: bool
) -> Any:
    """dequant_matmul_fp8 in numpy, with one of the bugs below."""
    Q.dequant_matmul_fp8(x, codes, scales, fmt, input_scale)
    xs = _np(x)
    c = np.float64 if xs.dtype == np.float64 else np.float32
    fmt_ = Q.FP8_FORMATS[fmt]
    xc = xs.astype(c)
    if input_scale is not None and not bug.get("ignores_input_scale"):
        x32 = xs.astype(np.float32)
        if input_scale in Q.DYNAMIC_SCALES:
            per_token = (input_scale == "dynamic_per_token") != bool(bug.get("swaps_extent"))
            axis = 1 if per_token else None
            amax = np.abs(x32).max(axis=axis, keepdims=True) if x32.size else np.zeros(1)
            s_x = (amax / np.float32(fmt_.max)).astype(np.float32)
            s_x = np.where(s_x == 0, np.float32(1), s_x)
        else:
            s_x = np.float32(input_scale)
        q = _fp8.encode(np, x32 / s_x, 1.0, fmt_, "cpu")
        xc = _fp8.decode(q, fmt_).astype(c) * np.asarray(s_x).astype(c)
    w = Q.dequantize_fp8(_np(codes), _np(scales), fmt).astype(c)
    return _back(x, (xc @ w.T).astype(xs.dtype))


@mutant("quant", "dequant_matmul_fp8", "ignores input_scale (never quantizes the activations)")
def fp8_matmul_ignores_input_scale(*args: Any) -> Any:
    return _fp8_linear(*args, ignores_input_scale=True)


@mutant("quant", "dequant_matmul_fp8", "dynamic scales per token for per tensor and vice versa")
def fp8_matmul_swaps_dynamic_extent(*args: Any) -> Any:
    return _fp8_linear(*args, swaps_extent=True)


def implementation(m: Mutant) -> Impl:
    """An Impl that is the reference except for mutant `m`."""
    modules = {}
    for name, mod in (
        ("sampling", S),
        ("hashing", H),
        ("block_table", BT),
        ("layers", L),
        ("rope", R),
        ("attention", A),
        ("structured", ST),
        ("spec_decode", SD),
        ("moe", M),
        ("lora", LO),
        ("pooling", P),
        ("ssm", SS),
        ("quant", Q),
        ("gguf", GG),
    ):
        ns = SimpleNamespace(**{k: getattr(mod, k) for k in mod.__all__})
        if name == m.module:
            setattr(ns, m.op, m.fn)
        modules[name] = ns
    from .specs.tokenize import namespace_of_bpe_class

    modules["tokenize"] = SimpleNamespace(**vars(namespace_of_bpe_class(REFERENCE)))
    if m.module == "tokenize":
        setattr(modules["tokenize"], m.op, m.fn)
    from .specs.matcher import namespace_of_structured_package

    modules["matcher"] = SimpleNamespace(**vars(namespace_of_structured_package(REFERENCE)))
    if m.module == "matcher":
        setattr(modules["matcher"], m.op, m.fn)
    return Impl(
        target=f"mutant:{m.name}", root=SimpleNamespace(**modules), label=f"mutant {m.name}"
    )


# --- pooling --------------------------------------------------------------------------------


def _spans_of(query_start_loc: Any) -> list[tuple[int, int]]:
    q = [int(v) for v in _np(query_start_loc)]
    return list(zip(q[:-1], q[1:], strict=True))


@mutant("pooling", "pool", "mean divides by the span's length + 1 (counts a separator)")
def pool_mean_off_by_one(hidden: Any, query_start_loc: Any, pooling_type: str) -> Any:
    out = P.pool(hidden, query_start_loc, pooling_type)
    if pooling_type != "mean":
        return out
    fixed = _np(out)
    for r, (s, e) in enumerate(_spans_of(query_start_loc)):
        fixed[r] = fixed[r] * (e - s) / (e - s + 1)
    return _back(hidden, fixed)


@mutant("pooling", "pool", "last takes the row after the span (the next request's first)")
def pool_last_reads_one_past(hidden: Any, query_start_loc: Any, pooling_type: str) -> Any:
    out = P.pool(hidden, query_start_loc, pooling_type)
    if pooling_type != "last":
        return out
    h, fixed = _np(hidden), _np(out)
    for r, (_, e) in enumerate(_spans_of(query_start_loc)):
        if e < h.shape[0]:
            fixed[r] = h[e]
    return _back(hidden, fixed)


@mutant("pooling", "pool", "cls takes the last row (pooling types swapped)")
def pool_cls_is_last(hidden: Any, query_start_loc: Any, pooling_type: str) -> Any:
    P.pool(hidden, query_start_loc, pooling_type)
    return P.pool(hidden, query_start_loc, "last" if pooling_type == "cls" else pooling_type)


@mutant("pooling", "pool", "all returns the whole hidden array, padding rows included")
def pool_all_keeps_padding(hidden: Any, query_start_loc: Any, pooling_type: str) -> Any:
    out = P.pool(hidden, query_start_loc, pooling_type)
    if pooling_type != "all" or _np(out).shape[0] == 0:
        return out
    start = _spans_of(query_start_loc)[0][0]
    return _back(hidden, _np(P.pool(hidden, np.array([start, hidden.shape[0]]), "all")))


@mutant("pooling", "pool", "mean in the input's dtype (float16 sums overflow and round)")
def pool_mean_in_input_dtype(hidden: Any, query_start_loc: Any, pooling_type: str) -> Any:
    out = P.pool(hidden, query_start_loc, pooling_type)
    h = _np(hidden)
    if pooling_type != "mean" or h.dtype != np.float16:
        return out
    rows = [
        np.sum(h[s:e], axis=0, dtype=np.float16) / np.float16(e - s)
        for s, e in _spans_of(query_start_loc)
    ]
    fixed = np.stack(rows).astype(np.float32) if rows else _np(out)
    return _back(hidden, fixed)


@mutant("pooling", "normalize", "normalizes the whole row, then truncates (Matryoshka)")
def normalize_then_truncate(x: Any, dimensions: int | None = None) -> Any:
    P.normalize(x, dimensions)
    full = _np(P.normalize(x))
    return _back(x, np.ascontiguousarray(full[:, :dimensions]))


@mutant("pooling", "normalize", "zero rows become NaN (no floor on the norm)")
def normalize_without_floor(x: Any, dimensions: int | None = None) -> Any:
    out = _np(P.normalize(x, dimensions))
    y = _np(x).astype(out.dtype)[:, : out.shape[1]]
    with np.errstate(invalid="ignore", divide="ignore"):
        return _back(x, y / np.sqrt((y * y).sum(axis=1, keepdims=True)))


@mutant("pooling", "classify", "softmax without subtracting the row's max (overflows)")
def classify_softmax_unshifted(logits: Any, activation: str = "softmax") -> Any:
    out = _np(P.classify(logits, activation))
    if activation != "softmax":
        return _back(logits, out)
    x = _np(logits).astype(out.dtype)
    with np.errstate(over="ignore", invalid="ignore"):
        e = np.exp(x)
        return _back(logits, e / e.sum(axis=1, keepdims=True))


@mutant("pooling", "classify", "sigmoid where softmax is asked (one label's rule for all)")
def classify_sigmoid_for_softmax(logits: Any, activation: str = "softmax") -> Any:
    P.classify(logits, activation)
    return P.classify(logits, "sigmoid" if activation == "softmax" else activation)


@mutant("pooling", "cosine_similarity", "divides by the norm of a twice (forgets b's)")
def cosine_forgets_b(a: Any, b: Any) -> Any:
    out = _np(P.cosine_similarity(a, b))
    x, y = _np(a).astype(np.float64), _np(b).astype(np.float64)
    na = np.maximum(np.sqrt((x * x).sum(axis=1)), 1e-8)
    nb = np.maximum(np.sqrt((y * y).sum(axis=1)), 1e-8)
    return _back(a, (out * nb / na).astype(out.dtype))


# --- ssm ------------------------------------------------------------------------------------


def _conv(x: Any, weight: Any, bias: Any, conv_state: Any, qsl: Any, act: Any, bug: str) -> Any:
    """The convolution in numpy with one bug: "flipped" (weight[c, 0] on the token
    itself), "ahead" (the window one token later: reads the next token) or
    "first_state" (new_state keeps the first w - 1 inputs, not the last)."""
    out_ref, state_ref = SS.causal_conv1d(x, weight, bias, conv_state, qsl, act)
    xs, w, st = _np(x).astype(np.float64), _np(weight).astype(np.float64), _np(conv_state)
    b = np.zeros(xs.shape[1]) if bias is None else _np(bias).astype(np.float64)
    k = w.shape[1] - 1
    w = w[:, ::-1] if bug == "flipped" else w
    out, finals = np.zeros(xs.shape), []
    for s, (a, e) in enumerate(_spans_of(qsl)):
        xx = np.concatenate([st[s].T.astype(np.float64), xs[a:e], np.zeros((1, xs.shape[1]))])
        shift = 1 if bug == "ahead" else 0
        for j in range(e - a):
            out[a + j] = b + np.sum(w.T * xx[j + shift : j + shift + k + 1], axis=0)
        kept = xx[:k] if bug == "first_state" else xx[len(xx) - 1 - k : len(xx) - 1]
        finals.append(kept.T)
    if act == "silu":
        out = out / (1 + np.exp(-out))
    state = np.stack(finals).astype(st.dtype) if finals else st
    return _back(x, out.astype(_np(out_ref).dtype)), _back(x, state.reshape(_np(state_ref).shape))


@mutant("ssm", "causal_conv1d", "drops the carried state (every sequence starts from zeros)")
def conv_drops_state(x: Any, weight: Any, bias: Any, conv_state: Any, *rest: Any) -> Any:
    return SS.causal_conv1d(x, weight, bias, conv_state * 0, *rest)


@mutant("ssm", "causal_conv1d", "is not causal: the window reaches one token ahead")
def conv_reads_ahead(*args: Any) -> Any:
    return _conv(*args[:5], args[5] if len(args) > 5 else None, bug="ahead")


@mutant("ssm", "causal_conv1d", "flips the kernel (weight[c, 0] multiplies the token itself)")
def conv_flipped(*args: Any) -> Any:
    return _conv(*args[:5], args[5] if len(args) > 5 else None, bug="flipped")


@mutant("ssm", "causal_conv1d", "new_state keeps the first w - 1 inputs, not the last")
def conv_keeps_first_inputs(*args: Any) -> Any:
    return _conv(*args[:5], args[5] if len(args) > 5 else None, bug="first_state")


def _by_chunks(state: Any, qsl: Any, size: int, call: Any) -> Any:
    """`call(state, qsl)` with each sequence cut into sequences of `size` tokens, every
    piece but the first starting from zeros (the state dropped between chunks); returns
    its (y, new_state) for the original sequences."""
    pieces, first, last = [0], [], []
    for a, e in _spans_of(qsl):
        first.append(len(pieces) - 1)
        for b in range(a, e, size) if e > a else [a]:
            pieces.append(min(b + size, e))
        last.append(len(pieces) - 2)
    st = _np(state)
    starts = np.zeros((len(pieces) - 1, *st.shape[1:]), st.dtype)
    starts[first] = st
    qsl_np = np.asarray(pieces, dtype=np.int64)
    y, new = call(_back(state, starts), _back(qsl, qsl_np))
    return y, _back(y, _np(new)[last])


@mutant("ssm", "causal_conv1d", "writes new_state into conv_state in place")
def conv_state_in_place(x: Any, weight: Any, bias: Any, conv_state: Any, *rest: Any) -> Any:
    out, new = SS.causal_conv1d(x, weight, bias, conv_state, *rest)
    conv_state[...] = new
    return out, conv_state


@mutant("ssm", "selective_scan", "returns y in x's dtype (float16 for float16 x)")
def scan_y_in_input_dtype(x: Any, *rest: Any, **kw: Any) -> Any:
    y, h = SS.selective_scan(x, *rest, **kw)
    return _back(x, _np(y).astype(_np(x).dtype)), h


@mutant("ssm", "selective_scan", "drops the carried state (every sequence starts from zeros)")
def scan_drops_state(x: Any, dt: Any, A: Any, B: Any, C: Any, state: Any, *rest: Any) -> Any:
    return SS.selective_scan(x, dt, A, B, C, state * 0, *rest)


@mutant("ssm", "selective_scan", "by chunks, drops the state between chunks")
def scan_chunks_forget_state(
    x: Any, dt: Any, A: Any, B: Any, C: Any, state: Any, qsl: Any, *rest: Any, **kw: Any
) -> Any:
    bound = dict(zip(("D", "z", "dt_bias", "dt_softplus", "chunk_size"), rest, strict=False))
    bound |= kw
    size = bound.get("chunk_size")
    SS.selective_scan(x, dt, A, B, C, state, qsl, **bound)
    if size is None:
        return SS.selective_scan(x, dt, A, B, C, state, qsl, **bound)
    return _by_chunks(
        state,
        qsl,
        size,
        lambda st, q: SS.selective_scan(x, dt, A, B, C, st, q, **bound),
    )


@mutant("ssm", "selective_scan", "wrong discretisation: decay 1 + delta A, not exp(delta A)")
def scan_euler_decay(
    x: Any, dt: Any, A: Any, B: Any, C: Any, state: Any, qsl: Any, *rest: Any, **kw: Any
) -> Any:
    """Mamba-1 with decay 1 + delta A (Euler) instead of exp(delta A)."""
    y_ref, h_ref = SS.selective_scan(x, dt, A, B, C, state, qsl, *rest, **kw)
    bound = dict(zip(("D", "z", "dt_bias", "dt_softplus", "chunk_size"), rest, strict=False))
    bound |= kw
    f = lambda v: None if v is None else _np(v).astype(np.float64)  # noqa: E731
    xs, d, a, b, c = f(x), f(dt), f(A), f(B), f(C)
    if bound.get("dt_bias") is not None:
        d = d + f(bound["dt_bias"])
    if bound.get("dt_softplus"):
        d = np.logaddexp(0.0, d)
    y, finals = np.zeros(xs.shape), []
    for s, (lo, hi) in enumerate(_spans_of(qsl)):
        h = f(state[s])
        for t in range(lo, hi):
            h = (1 + d[t][:, None] * a) * h + (d[t] * xs[t])[:, None] * b[t][None, :]
            y[t] = h @ c[t]
        finals.append(h)
    if bound.get("D") is not None:
        y = y + f(bound["D"]) * xs
    if bound.get("z") is not None:
        z = f(bound["z"])
        y = y * z / (1 + np.exp(-z))
    h = np.stack(finals) if finals else _np(h_ref).astype(np.float64)
    return _back(x, y.astype(_np(y_ref).dtype)), _back(x, h.astype(_np(h_ref).dtype))


@mutant("ssm", "selective_scan", "gates by sigmoid(z) instead of silu(z)")
def scan_sigmoid_gate(
    x: Any, dt: Any, A: Any, B: Any, C: Any, state: Any, qsl: Any, *rest: Any, **kw: Any
) -> Any:
    bound = dict(zip(("D", "z", "dt_bias", "dt_softplus", "chunk_size"), rest, strict=False))
    bound |= kw
    z = bound.pop("z", None)
    y, h = SS.selective_scan(x, dt, A, B, C, state, qsl, z=z, **bound)
    if z is None:
        return y, h
    y, _ = SS.selective_scan(x, dt, A, B, C, state, qsl, **bound)
    zz = _np(z).astype(_np(y).dtype)
    return _back(x, _np(y) / (1 + np.exp(-zz))), h


def _ssd_args(rest: tuple[Any, ...], kw: dict[str, Any]) -> dict[str, Any]:
    return dict(zip(("chunk_size", "D", "dt_bias", "dt_softplus"), rest, strict=False)) | kw


@mutant("ssm", "ssd_scan", "drops the carried state (every sequence starts from zeros)")
def ssd_drops_state(x: Any, dt: Any, A: Any, B: Any, C: Any, state: Any, *rest: Any) -> Any:
    return SS.ssd_scan(x, dt, A, B, C, state * 0, *rest)


@mutant("ssm", "ssd_scan", "drops the state between chunks")
def ssd_chunks_forget_state(
    x: Any, dt: Any, A: Any, B: Any, C: Any, state: Any, qsl: Any, *rest: Any, **kw: Any
) -> Any:
    bound = _ssd_args(rest, kw)
    SS.ssd_scan(x, dt, A, B, C, state, qsl, **bound)
    return _by_chunks(
        state,
        qsl,
        bound.get("chunk_size", 256),
        lambda st, q: SS.ssd_scan(x, dt, A, B, C, st, q, **bound),
    )


def _heads_read(like: Any, BC: Any, heads: int) -> Any:
    """B or C given one group per head, head h reading group h % groups (interleaved,
    where the contract has consecutive heads share a group)."""
    v = _np(BC)
    return _back(like, v[:, np.arange(heads) % v.shape[1]])


@mutant("ssm", "ssd_scan", "head h reads group h % groups, not h // (heads / groups)")
def ssd_groups_interleaved(x: Any, dt: Any, A: Any, B: Any, C: Any, *rest: Any) -> Any:
    SS.ssd_scan(x, dt, A, B, C, *rest)
    heads = x.shape[1]
    return SS.ssd_scan(x, dt, A, _heads_read(B, B, heads), _heads_read(C, C, heads), *rest)


@mutant("ssm", "ssd_scan", "takes chunk_size < 1 as 1 instead of raising")
def ssd_clamps_chunk_size(*args: Any, **kw: Any) -> Any:
    bound = _ssd_args(args[7:], kw)
    size = bound.get("chunk_size", 256)
    if isinstance(size, int) and not isinstance(size, bool) and size < 1:
        bound["chunk_size"] = 1
    return SS.ssd_scan(*args[:7], **bound)


@mutant("ssm", "ssd_scan", "leaves out the D skip connection")
def ssd_without_d(
    x: Any, dt: Any, A: Any, B: Any, C: Any, state: Any, qsl: Any, *rest: Any, **kw: Any
) -> Any:
    bound = _ssd_args(rest, kw)
    SS.ssd_scan(x, dt, A, B, C, state, qsl, **bound)
    return SS.ssd_scan(x, dt, A, B, C, state, qsl, **(bound | {"D": None}))


def _update_args(rest: tuple[Any, ...], kw: dict[str, Any]) -> dict[str, Any]:
    return dict(zip(("D", "dt_bias", "dt_softplus"), rest, strict=False)) | kw


@mutant("ssm", "selective_state_update", "y read from the state before the update")
def update_reads_old_state(
    state: Any, x: Any, dt: Any, A: Any, B: Any, C: Any, *rest: Any, **kw: Any
) -> Any:
    bound = _update_args(rest, kw)
    y, new = SS.selective_state_update(state, x, dt, A, B, C, **bound)
    heads, groups = x.shape[1], B.shape[1]
    c = _np(C).astype(np.float64)[:, np.arange(heads) // (heads // groups)]
    old = np.einsum("shpn,shn->shp", _np(state).astype(np.float64), c)
    if bound.get("D") is not None:
        old = old + _np(bound["D"]).astype(np.float64)[:, None] * _np(x).astype(np.float64)
    return _back(x, old.astype(_np(y).dtype)), new


@mutant("ssm", "selective_state_update", "writes the new state into state in place")
def update_in_place(state: Any, *rest: Any, **kw: Any) -> Any:
    y, new = SS.selective_state_update(state, *rest, **kw)
    state[...] = _back(state, _np(new).astype(_np(state).dtype))
    return y, state


@mutant("ssm", "selective_state_update", "ignores dt_bias")
def update_ignores_dt_bias(
    state: Any, x: Any, dt: Any, A: Any, B: Any, C: Any, *rest: Any, **kw: Any
) -> Any:
    bound = _update_args(rest, kw)
    SS.selective_state_update(state, x, dt, A, B, C, **bound)
    return SS.selective_state_update(state, x, dt, A, B, C, **(bound | {"dt_bias": None}))


@mutant("ssm", "selective_state_update", "the step size skips softplus")
def update_without_softplus(
    state: Any, x: Any, dt: Any, A: Any, B: Any, C: Any, *rest: Any, **kw: Any
) -> Any:
    bound = _update_args(rest, kw)
    SS.selective_state_update(state, x, dt, A, B, C, **bound)
    return SS.selective_state_update(state, x, dt, A, B, C, **(bound | {"dt_softplus": False}))


# --- gguf -----------------------------------------------------------------------------------


def _blocks(raw: Any, fmt: str) -> np.ndarray:
    """A copy of raw's bytes as (blocks, type_size) (after the reference's own checks)."""
    GG.dequantize(raw, fmt)
    return _np(raw).reshape(-1, GG.BLOCKS[fmt][1])


def _dequantize_bytes(raw: Any, fmt: str, edit: Callable[[np.ndarray], None]) -> Any:
    """The reference's dequantize of raw's blocks after `edit` (in place) when fmt matches."""
    b = _blocks(raw, fmt)
    edit(b)
    return _back(raw, _np(GG.dequantize(b.reshape(_np(raw).shape), fmt)))


@mutant("gguf", "dequantize", "Q4_0: weights 2j and 2j + 1 in byte j (interleaved nibbles)")
def dequantize_q4_0_interleaved(raw: Any, fmt: str) -> Any:
    w = _np(GG.dequantize(raw, fmt))
    if fmt == "Q4_0":
        blocks = w.reshape(-1, 2, 16)
        w = np.stack([blocks[:, 0], blocks[:, 1]], axis=2).reshape(w.shape)
    return _back(raw, w)


def _no_high_bits(b: np.ndarray) -> None:
    b[:, 4:12] &= 63


@mutant("gguf", "dequantize", "Q4_K: ignores the high two bits of the scales and mins 4-7")
def dequantize_q4_k_six_bits_lost(raw: Any, fmt: str) -> Any:
    return _dequantize_bytes(raw, fmt, _no_high_bits if fmt == "Q4_K" else lambda b: None)


def _flip_dmin_sign(b: np.ndarray) -> None:
    b[:, 3] ^= 0x80


@mutant("gguf", "dequantize", "Q4_K: adds dmin * m instead of subtracting it")
def dequantize_q4_k_adds_min(raw: Any, fmt: str) -> Any:
    return _dequantize_bytes(raw, fmt, _flip_dmin_sign if fmt == "Q4_K" else lambda b: None)


def _reverse_high_bits(b: np.ndarray) -> None:
    qh = b[:, 128:192].copy()
    b[:, 128:192] = sum(((qh >> (2 * t)) & 3) << (6 - 2 * t) for t in range(4))


@mutant("gguf", "dequantize", "Q6_K: reads the 2-bit high fields of qh from the top down")
def dequantize_q6_k_high_bits_reversed(raw: Any, fmt: str) -> Any:
    return _dequantize_bytes(raw, fmt, _reverse_high_bits if fmt == "Q6_K" else lambda b: None)


def _q8_q4(weight: Any, fmt: str, **bug: bool) -> Any:
    """quantize with Q8_0 / Q4_0 in numpy, with one of the bugs below (other formats: the
    reference)."""
    out = GG.quantize(weight, fmt)
    if fmt not in ("Q8_0", "Q4_0"):
        return out
    f32 = np.float32
    x = _np(weight).astype(f32).reshape(-1, 32)
    if fmt == "Q8_0":
        d = np.max(np.abs(x), axis=1) / f32(128 if bug.get("over_128") else 127)
        inverse = np.divide(f32(1), d, out=np.zeros_like(d), where=d != 0)
        v = x * inverse[:, None]
        q = np.trunc(v) + np.where(np.abs(v - np.trunc(v)) >= 0.5, np.sign(v), 0)
        codes = q.astype(np.int8).view(np.uint8)
    else:
        top = np.max(np.abs(x), axis=1)  # the bug: |m| / 8 instead of m / -8
        d = top / f32(8)
        inverse = np.divide(f32(1), d, out=np.zeros_like(d), where=d != 0)
        q = np.clip(np.floor(x * inverse[:, None] + f32(8.5)), 0, 15).astype(np.uint8)
        codes = q[:, :16] | (q[:, 16:] << 4)
    half = d.astype(np.float16).view(np.uint8).reshape(-1, 2)
    return _back(weight, np.concatenate([half, codes], axis=1).reshape(_np(out).shape))


@mutant("gguf", "quantize", "Q8_0: d = max|w| / 128 instead of / 127")
def quantize_q8_0_over_128(weight: Any, fmt: str) -> Any:
    return _q8_q4(weight, fmt, over_128=True)


@mutant("gguf", "quantize", "Q4_0: d = max|w| / 8 (the sign of the largest entry dropped)")
def quantize_q4_0_unsigned_max(weight: Any, fmt: str) -> Any:
    return _q8_q4(weight, fmt, unsigned=True)


@mutant("gguf", "quantize", "Q4_K: packs weights 2l and 2l + 1 into byte l of a chunk")
def quantize_q4_k_interleaved(weight: Any, fmt: str) -> Any:
    raw = _np(GG.quantize(weight, fmt))
    if fmt == "Q4_K" and raw.size:
        b = raw.reshape(-1, 144)
        qs = b[:, 16:].reshape(-1, 4, 32)
        codes = np.concatenate([qs & 15, qs >> 4], axis=2)  # (blocks, chunk, 64) in order
        b[:, 16:] = (codes[:, :, 0::2] | (codes[:, :, 1::2] << 4)).reshape(-1, 128)
    return _back(weight, raw)


@mutant("gguf", "quantize", "Q6_K: writes qh before ql")
def quantize_q6_k_qh_first(weight: Any, fmt: str) -> Any:
    raw = _np(GG.quantize(weight, fmt))
    if fmt == "Q6_K" and raw.size:
        b = raw.reshape(-1, 210)
        b[:, :192] = np.concatenate([b[:, 128:192], b[:, :128]], axis=1)
    return _back(weight, raw)


def _gguf_linear(x: Any, raw: Any, fmt: str, **bug: bool) -> Any:
    """gguf_matmul in numpy, with one of the bugs below."""
    GG.gguf_matmul(x, raw, fmt)
    xs = _np(x)
    c = np.float64 if xs.dtype == np.float64 else np.float32
    w = _np(GG.dequantize(raw, fmt))
    if bug.get("half_weight"):
        w = w.astype(np.float16)
    y = xs.astype(c) @ w.astype(c).T
    return _back(x, y if bug.get("compute_dtype") else y.astype(xs.dtype))


@mutant("gguf", "gguf_matmul", "rounds the dequantized weight to float16")
def gguf_matmul_half_weight(*args: Any) -> Any:
    return _gguf_linear(*args, half_weight=True)


@mutant("gguf", "gguf_matmul", "returns the compute dtype instead of x's")
def gguf_matmul_compute_dtype(*args: Any) -> Any:
    return _gguf_linear(*args, compute_dtype=True)
