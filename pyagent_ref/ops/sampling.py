"""Sampling ops: logits processors, log-probabilities and seeded sampling.

Every op works on a batch of rows, `logits` of shape (batch, vocab), with its parameters
given per row as arrays of shape (batch,). Masking a token means setting its logit to
-inf. All ops return new arrays and never modify their inputs. One implementation serves
numpy arrays and torch tensors on any device; results come back in the input's library,
dtype and device.

The order a sampler applies them in (vLLM's, with HF's extra warpers after top-p as
HF orders them, and llama.cpp's XTC and mirostat last): the masks
`apply_allowed_token_ids`, `apply_bad_words`, `apply_no_repeat_ngram`, penalties,
`apply_dry` and logit bias on the raw logits, then `apply_temperature`, then
`apply_min_p`, `apply_top_k`, `apply_top_p`, `apply_typical_p`, `apply_epsilon_cutoff`,
`apply_eta_cutoff`, `apply_xtc`, `apply_mirostat`, then `sample` (and, for mirostat,
`mirostat_update` with the drawn token).

Randomness: `sample` draws with the exponential race over `philox_uniform`, a
counter-based generator keyed by each row's seed and counted by (output position,
token index). The same (seed, position, logits row) gives the same token in any
conforming implementation, whatever else is in the batch. The entries of a position's
stream are shared out: 0 .. vocab - 1 to `sample` (and to the token
`spec_decode.rejection_sample` draws), vocab to rejection sampling's acceptance test,
vocab + 1 to the coin of `apply_xtc`.
"""

from __future__ import annotations

import math
from typing import Any

from array_api_compat import device

from ._arrays import bincount_rows, check_logits, first_bad_row, namespace, row_param
from ._sequences import z_function

__all__ = [
    "apply_temperature",
    "apply_top_k",
    "apply_top_p",
    "apply_min_p",
    "apply_typical_p",
    "apply_epsilon_cutoff",
    "apply_eta_cutoff",
    "apply_penalties",
    "apply_logit_bias",
    "apply_allowed_token_ids",
    "apply_bad_words",
    "apply_no_repeat_ngram",
    "apply_dry",
    "apply_xtc",
    "apply_mirostat",
    "mirostat_update",
    "log_softmax",
    "topk_logprobs",
    "philox_uniform",
    "sample",
]

_NEG_INF = float("-inf")


def _probs64(xp: Any, logits: Any) -> Any:
    """softmax over the last axis, computed in float64."""
    x = xp.astype(logits, xp.float64)
    e = xp.exp(x - xp.max(x, axis=1, keepdims=True))
    return e / xp.sum(e, axis=1, keepdims=True)


def apply_temperature(logits: Any, temperature: Any) -> Any:
    """Divide each row's logits by its temperature.

    Row b becomes logits[b] / temperature[b], computed in the logits' dtype. A row with
    temperature 0 is left unchanged: it is a greedy row, and `sample` takes its argmax.

    Args:
        logits: float32 or float64, shape (batch, vocab); finite or -inf entries.
        temperature: numbers, shape (batch,), each finite and >= 0.
    Returns:
        A new array like `logits`.
    Raises:
        TypeError: non-float logits, or a non-numeric temperature.
        ValueError: shapes disagree, or a temperature that is negative or not finite
            (the message names the row and the value).
    """
    xp = check_logits(logits)
    t = row_param(logits, temperature, "temperature", logits.dtype)
    row = first_bad_row(xp, ~(xp.isfinite(t) & (t >= 0)))
    if row is not None:
        raise ValueError(f"temperature[{row}] must be finite and >= 0, got {float(t[row])}")
    t = xp.where(t == 0, xp.ones_like(t), t)
    return logits / xp.reshape(t, (-1, 1))


def apply_top_k(logits: Any, k: Any) -> Any:
    """Keep each row's k largest logits, mask the rest.

    Row b keeps every token whose logit is >= the k[b]-th largest logit of the row, so
    all tokens tied with the k-th value are kept (a row may keep more than k tokens).
    k[b] <= 0 or k[b] >= vocab disables the filter for that row.

    Args:
        logits: float32 or float64, shape (batch, vocab).
        k: integers, shape (batch,).
    Returns:
        A new array like `logits`.
    Raises:
        TypeError: non-float logits, or a non-integer k.
        ValueError: shapes disagree.
    """
    xp = check_logits(logits)
    vocab = logits.shape[1]
    k = row_param(logits, k, "k", xp.int64)
    k = xp.where((k <= 0) | (k >= vocab), vocab, k)
    ordered = xp.sort(logits, axis=1, descending=True)
    kth = xp.take_along_axis(ordered, xp.reshape(k - 1, (-1, 1)), axis=1)
    return xp.where(logits >= kth, logits, _NEG_INF)


def apply_top_p(logits: Any, p: Any) -> Any:
    """Nucleus filter: keep the smallest set of most likely tokens whose mass reaches p.

    Row b: probs = softmax(logits[b]) in float64; sort probs descending and let m be
    the smallest count whose cumulative sum is >= p[b] (m = vocab if none is). Let
    t = the m-th largest probability. Tokens with probability >= t are kept, so tokens
    tied with the last kept one are all kept, and the most likely token always is.
    p[b] == 1 disables the filter for that row.

    Implementations may sum in another order; a token whose decision depends on the
    cumulative sum being within 1e-9 (relative) of p[b] may differ between them.

    Args:
        logits: float32 or float64, shape (batch, vocab).
        p: numbers, shape (batch,), each in (0, 1].
    Returns:
        A new array like `logits`.
    Raises:
        TypeError: non-float logits, or a non-numeric p.
        ValueError: shapes disagree, or a p outside (0, 1] (names the row and value).
    """
    xp = check_logits(logits)
    p = row_param(logits, p, "p", xp.float64)
    row = first_bad_row(xp, ~((p > 0) & (p <= 1)))
    if row is not None:
        raise ValueError(f"p[{row}] must be in (0, 1], got {float(p[row])}")
    probs = _probs64(xp, logits)
    ordered = xp.sort(probs, axis=1, descending=True)
    cum = xp.cumulative_sum(ordered, axis=1)
    below = xp.sum(xp.astype(cum < xp.reshape(p, (-1, 1)), xp.int64), axis=1)
    m = xp.clip(below + 1, max=logits.shape[1])
    t = xp.take_along_axis(ordered, xp.reshape(m - 1, (-1, 1)), axis=1)
    keep = (probs >= t) | xp.reshape(p == 1, (-1, 1))
    return xp.where(keep, logits, _NEG_INF)


def apply_min_p(logits: Any, min_p: Any) -> Any:
    """Mask tokens that are much less likely than the most likely one.

    Row b: with probs = softmax(logits[b]), token i is masked iff
    probs[i] < min_p[b] * max(probs), evaluated as exp(logits[i] - max) < min_p[b] in
    float64. The comparison is strict: tokens at the threshold survive, min_p[b] == 1
    keeps exactly the tokens tied for the max, min_p[b] == 0 changes nothing, and the
    most likely token is never masked. Decisions within 1e-9 (relative) of the
    threshold may differ between implementations.

    Args:
        logits: float32 or float64, shape (batch, vocab).
        min_p: numbers, shape (batch,), each in [0, 1].
    Returns:
        A new array like `logits`.
    Raises:
        TypeError: non-float logits, or a non-numeric min_p.
        ValueError: shapes disagree, or a min_p outside [0, 1] (names row and value).
    """
    xp = check_logits(logits)
    min_p = row_param(logits, min_p, "min_p", xp.float64)
    row = first_bad_row(xp, ~((min_p >= 0) & (min_p <= 1)))
    if row is not None:
        raise ValueError(f"min_p[{row}] must be in [0, 1], got {float(min_p[row])}")
    x = xp.astype(logits, xp.float64)
    ratio = xp.exp(x - xp.max(x, axis=1, keepdims=True))
    return xp.where(ratio < xp.reshape(min_p, (-1, 1)), _NEG_INF, logits)


def _log_probs64(xp: Any, logits: Any) -> tuple[Any, Any, Any]:
    """(q, p, H) of each row in float64: q = log_softmax, p = exp(q) and the entropy
    H = -sum of p * q over the tokens with p > 0 (-inf tokens have q = -inf, p = 0)."""
    x = xp.astype(logits, xp.float64)
    shifted = x - xp.max(x, axis=1, keepdims=True)
    q = shifted - xp.log(xp.sum(xp.exp(shifted), axis=1, keepdims=True))
    p = xp.exp(q)
    entropy = -xp.sum(p * xp.where(p > 0, q, 0.0), axis=1)
    return q, p, entropy


def _cut_below(xp: Any, logits: Any, p: Any, threshold: Any) -> Any:
    """Mask tokens with p < threshold (per row), except those tied for the row's max."""
    top = logits == xp.max(logits, axis=1, keepdims=True)
    return xp.where((p < xp.reshape(threshold, (-1, 1))) & ~top, _NEG_INF, logits)


def apply_typical_p(logits: Any, typical_p: Any) -> Any:
    """Locally typical sampling: keep the tokens whose surprisal is closest to the entropy.

    Row b, in float64: q = log_softmax(logits[b]), p = exp(q), the entropy
    H = -sum(p[i] * q[i] for p[i] > 0) and each token's distance d[i] = |-q[i] - H|
    (+inf for -inf tokens). Order the tokens by d ascending and let m be the smallest
    count whose cumulative p is >= typical_p[b] (m = vocab if none is); t = the m-th
    smallest d. Tokens with d <= t are kept, the rest masked. Equivalently, token i is
    kept iff the mass of the tokens with d strictly smaller than d[i] is < typical_p[b].
    Ties: tokens with equal d (always those with equal logits) are kept or masked
    together; the tokens with the smallest d are always kept (at least one token, HF's
    min_tokens_to_keep=1), and the most likely token may be masked. typical_p[b] == 1
    disables the filter for that row (HF's `TypicalLogitsWarper`, Meister et al. 2022).

    Implementations may sum in another order: a decision whose cumulative mass is
    within 1e-9 (relative) of typical_p[b], or that depends on the order of two tokens
    whose d differ by less than 1e-9 * (1 + |H| + |q|), may differ between them.

    Args:
        logits: float32 or float64, shape (batch, vocab).
        typical_p: numbers, shape (batch,), each in (0, 1].
    Returns:
        A new array like `logits`.
    Raises:
        TypeError: non-float logits, or a non-numeric typical_p.
        ValueError: shapes disagree, or a typical_p outside (0, 1] (names row and value).
    """
    xp = check_logits(logits)
    mass = row_param(logits, typical_p, "typical_p", xp.float64)
    row = first_bad_row(xp, ~((mass > 0) & (mass <= 1)))
    if row is not None:
        raise ValueError(f"typical_p[{row}] must be in (0, 1], got {float(mass[row])}")
    q, p, entropy = _log_probs64(xp, logits)
    d = xp.abs(-q - xp.reshape(entropy, (-1, 1)))
    order = xp.argsort(d, axis=1, stable=True)
    cum = xp.cumulative_sum(xp.take_along_axis(p, order, axis=1), axis=1)
    below = xp.sum(xp.astype(cum < xp.reshape(mass, (-1, 1)), xp.int64), axis=1)
    m = xp.clip(below + 1, max=logits.shape[1])
    t = xp.take_along_axis(xp.take_along_axis(d, order, axis=1), xp.reshape(m - 1, (-1, 1)), axis=1)
    keep = (d <= t) | xp.reshape(mass == 1, (-1, 1))
    return xp.where(keep, logits, _NEG_INF)


def apply_epsilon_cutoff(logits: Any, epsilon: Any) -> Any:
    """Epsilon sampling: mask tokens whose probability is below a fixed floor.

    Row b: with p = exp(log_softmax(logits[b])) in float64, token i is masked iff
    p[i] < epsilon[b] and logits[b, i] < max(logits[b]): the tokens tied for the max
    are always kept (HF's `EpsilonLogitsWarper` with min_tokens_to_keep=1, Hewitt et
    al. 2022). The comparison is strict (p == epsilon survives); epsilon[b] == 0 leaves
    the row unchanged. Decisions within 1e-9 (relative) of epsilon[b] may differ
    between implementations.

    Args:
        logits: float32 or float64, shape (batch, vocab).
        epsilon: numbers, shape (batch,), each in [0, 1).
    Returns:
        A new array like `logits`.
    Raises:
        TypeError: non-float logits, or a non-numeric epsilon.
        ValueError: shapes disagree, or an epsilon outside [0, 1) (names row and value).
    """
    xp = check_logits(logits)
    eps = row_param(logits, epsilon, "epsilon", xp.float64)
    row = first_bad_row(xp, ~((eps >= 0) & (eps < 1)))
    if row is not None:
        raise ValueError(f"epsilon[{row}] must be in [0, 1), got {float(eps[row])}")
    _, p, _ = _log_probs64(xp, logits)
    return _cut_below(xp, logits, p, eps)


def apply_eta_cutoff(logits: Any, eta: Any) -> Any:
    """Eta sampling: a probability floor that falls as the row's entropy rises.

    Row b, in float64: q = log_softmax(logits[b]), p = exp(q), the entropy
    H = -sum(p[i] * q[i] for p[i] > 0) and the floor
    threshold = min(eta[b], sqrt(eta[b]) * exp(-H)). Token i is masked iff
    p[i] < threshold and logits[b, i] < max(logits[b]): the tokens tied for the max are
    always kept (HF's `EtaLogitsWarper` with min_tokens_to_keep=1, Hewitt et al. 2022).
    The comparison is strict; eta[b] == 0 leaves the row unchanged. Decisions within
    1e-9 (relative) of the threshold may differ between implementations.

    Args:
        logits: float32 or float64, shape (batch, vocab).
        eta: numbers, shape (batch,), each in [0, 1).
    Returns:
        A new array like `logits`.
    Raises:
        TypeError: non-float logits, or a non-numeric eta.
        ValueError: shapes disagree, or an eta outside [0, 1) (names row and value).
    """
    xp = check_logits(logits)
    eta = row_param(logits, eta, "eta", xp.float64)
    row = first_bad_row(xp, ~((eta >= 0) & (eta < 1)))
    if row is not None:
        raise ValueError(f"eta[{row}] must be in [0, 1), got {float(eta[row])}")
    _, p, entropy = _log_probs64(xp, logits)
    threshold = xp.minimum(eta, xp.sqrt(eta) * xp.exp(-entropy))
    return _cut_below(xp, logits, p, threshold)


def _token_ids(logits: Any, ids: Any, name: str) -> Any:
    """Padded (batch, n) int64 token ids; entries < 0 are padding."""
    xp = namespace(logits, "logits")
    kind = str(getattr(ids, "dtype", "int")).removeprefix("torch.")
    if "int" not in kind:
        raise TypeError(f"{name} must be an integer array, got dtype {kind}")
    arr = xp.asarray(ids, dtype=xp.int64, device=device(logits))
    if arr.ndim != 2 or arr.shape[0] != logits.shape[0]:
        raise ValueError(
            f"{name} must have shape ({logits.shape[0]}, n), got shape {tuple(arr.shape)}"
        )
    too_big = arr >= logits.shape[1]
    if bool(xp.any(too_big)):
        bad = int(xp.max(arr))
        raise ValueError(f"{name} holds token id {bad}, outside the vocab of {logits.shape[1]}")
    return arr


def apply_penalties(
    logits: Any,
    prompt_ids: Any,
    output_ids: Any,
    repetition_penalty: Any,
    frequency_penalty: Any,
    presence_penalty: Any,
) -> Any:
    """Penalise tokens that already appeared, in the order vLLM and HF apply them.

    For row b and token i, with c = the number of times i occurs in output_ids[b] and
    seen = i occurs in prompt_ids[b] or output_ids[b], computed in the logits' dtype:
      1. repetition: if seen, x = x / r if x > 0 else x * r   (r = repetition_penalty[b])
      2. frequency:  x = x - f * c                            (f = frequency_penalty[b])
      3. presence:   x = x - q * (c > 0)                      (q = presence_penalty[b])
    r == 1, f == 0 and q == 0 disable the respective penalty. -inf logits stay -inf.

    Args:
        logits: float32 or float64, shape (batch, vocab).
        prompt_ids: integers, shape (batch, n_prompt), right-padded with negative
            values (any entry < 0 is padding).
        output_ids: integers, shape (batch, n_output), padded the same way.
        repetition_penalty: numbers, shape (batch,), each finite and > 0.
        frequency_penalty: numbers, shape (batch,), each finite (negative values
            reward repetition, as in the OpenAI API).
        presence_penalty: numbers, shape (batch,), each finite.
    Returns:
        A new array like `logits`.
    Raises:
        TypeError: non-float logits, non-integer ids, non-numeric penalties.
        ValueError: shapes disagree, a token id >= vocab, or a penalty out of range
            (names the row and the value).
    """
    xp = check_logits(logits)
    vocab = logits.shape[1]
    prompt = _token_ids(logits, prompt_ids, "prompt_ids")
    output = _token_ids(logits, output_ids, "output_ids")
    r = row_param(logits, repetition_penalty, "repetition_penalty", logits.dtype)
    f = row_param(logits, frequency_penalty, "frequency_penalty", logits.dtype)
    q = row_param(logits, presence_penalty, "presence_penalty", logits.dtype)
    for name, val, ok in (
        ("repetition_penalty", r, xp.isfinite(r) & (r > 0)),
        ("frequency_penalty", f, xp.isfinite(f)),
        ("presence_penalty", q, xp.isfinite(q)),
    ):
        row = first_bad_row(xp, ~ok)
        if row is not None:
            raise ValueError(f"{name}[{row}] out of range, got {float(val[row])}")
    counts = bincount_rows(xp, output, vocab)
    seen = (counts > 0) | (bincount_rows(xp, prompt, vocab) > 0)
    r2 = xp.reshape(r, (-1, 1))
    x = xp.where(seen, xp.where(logits > 0, logits / r2, logits * r2), logits)
    x = x - xp.reshape(f, (-1, 1)) * xp.astype(counts, logits.dtype)
    return x - xp.reshape(q, (-1, 1)) * xp.astype(counts > 0, logits.dtype)


def apply_logit_bias(logits: Any, token_ids: Any, bias: Any) -> Any:
    """Add per-row biases to chosen tokens (OpenAI's `logit_bias`).

    Row b: logits[b, token_ids[b, j]] += bias[b, j] for every j with token_ids[b, j] >= 0
    (negative ids are padding). A token listed twice gets both biases. The sum is
    computed in float64 and rounded once to the logits' dtype; -inf logits stay -inf.

    Args:
        logits: float32 or float64, shape (batch, vocab).
        token_ids: integers, shape (batch, n), right-padded with negative values.
        bias: finite numbers, shape (batch, n).
    Returns:
        A new array like `logits`.
    Raises:
        TypeError: non-float logits, non-integer token_ids, non-numeric bias.
        ValueError: shapes disagree, a token id >= vocab, or a non-finite bias.
    """
    xp = check_logits(logits)
    ids = _token_ids(logits, token_ids, "token_ids")
    kind = str(getattr(bias, "dtype", "float")).removeprefix("torch.")
    if not ("float" in kind or "int" in kind):
        raise TypeError(f"bias must hold numbers, got dtype {kind}")
    b = xp.asarray(bias, dtype=xp.float64, device=device(logits))
    if tuple(b.shape) != tuple(ids.shape):
        raise ValueError(
            f"bias must have the shape of token_ids {tuple(ids.shape)}, got {tuple(b.shape)}"
        )
    if not bool(xp.all(xp.isfinite(b))):
        raise ValueError("bias must be finite, got a NaN or infinite entry")
    total = bincount_rows(xp, ids, logits.shape[1], weights=b)
    return xp.astype(xp.astype(logits, xp.float64) + total, logits.dtype)


def _lengths(xp: Any, ids: Any, name: str) -> Any:
    """Lengths of the right-padded sequences along the last axis of `ids`: the count of
    leading entries >= 0. A token id after padding is a ValueError naming its index."""
    valid = ids >= 0
    after_pad = xp.cumulative_sum(xp.astype(~valid, xp.int64), axis=-1) > 0
    wrong = valid & after_pad
    if bool(xp.any(wrong)):
        index = [int(i[0]) for i in xp.nonzero(wrong)]
        raise ValueError(
            f"{name}{index} is a token id after padding (padding must come last), "
            f"got {int(ids[tuple(index)])}"
        )
    return xp.sum(xp.astype(valid, xp.int64), axis=-1)


def _at(xp: Any, tokens: Any, index: Any) -> Any:
    """tokens[b, index[b, ...]] for a (batch, n) `tokens` and an index of shape (batch or
    1, ...); an index outside [0, n) gives -1 (which equals no token id)."""
    batch, n = tokens.shape
    shape = (batch, *index.shape[1:])
    pad = xp.full((batch, 1), -1, dtype=xp.int64, device=device(tokens))
    inside = (index >= 0) & (index < n)
    flat = xp.reshape(
        xp.broadcast_to(xp.where(inside, index, n), shape), (batch, math.prod(shape[1:]))
    )
    return xp.reshape(xp.take_along_axis(xp.concat([tokens, pad], axis=1), flat, axis=1), shape)


def _mask_tokens(xp: Any, logits: Any, banned_ids: Any) -> Any:
    """logits with the ids in `banned_ids` (batch, ...; entries < 0 ignored) set to -inf."""
    ids = xp.reshape(banned_ids, (logits.shape[0], math.prod(banned_ids.shape[1:])))
    banned = bincount_rows(xp, ids, logits.shape[1]) > 0
    return xp.where(banned, _NEG_INF, logits)


def apply_allowed_token_ids(logits: Any, allowed: Any) -> Any:
    """Restrict rows to a list of tokens (vLLM's `allowed_token_ids`).

    Row b: if allowed[b] holds no id (every entry < 0, which is padding), the row is
    unchanged; otherwise every token not listed in allowed[b] is masked and the listed
    ones keep their logit (a listed token that is already -inf stays -inf, so a row can
    end up entirely -inf). Order and repetitions of the ids do not matter.

    Args:
        logits: float32 or float64, shape (batch, vocab).
        allowed: integers, shape (batch, n), padded with negative values anywhere.
    Returns:
        A new array like `logits`.
    Raises:
        TypeError: non-float logits, or non-integer allowed.
        ValueError: wrong shapes, or a token id >= vocab.
    """
    xp = check_logits(logits)
    ids = _token_ids(logits, allowed, "allowed")
    listed = bincount_rows(xp, ids, logits.shape[1]) > 0
    open_row = ~xp.any(ids >= 0, axis=1, keepdims=True)
    return xp.where(listed | open_row, logits, _NEG_INF)


def apply_bad_words(logits: Any, token_ids: Any, bad_words: Any) -> Any:
    """Forbid the token that would complete a banned token sequence (vLLM's `bad_words`).

    Row b has the tokens token_ids[b] (its previous tokens, oldest first) and the
    banned sequences bad_words[b, w] for each w. For a sequence s of length L >= 1: its
    last token s[L-1] is masked iff the row's tokens end with s[:L-1] (so a sequence of
    length 1 always bans its token, and one whose prefix is longer than the row's tokens
    bans nothing). A sequence of length 0 bans nothing. Every other logit is unchanged.

    vLLM matches the sequences against the generated tokens only, not the prompt: a
    sampler following it passes the output tokens as token_ids.

    Args:
        logits: float32 or float64, shape (batch, vocab).
        token_ids: integers, shape (batch, n); row b's tokens are its leading entries
            >= 0 and the rest is padding (negative values).
        bad_words: integers, shape (batch, words, max_len); bad_words[b, w] is one
            sequence, its leading entries >= 0, right-padded with negative values. Rows
            with fewer sequences pad with sequences of length 0.
    Returns:
        A new array like `logits`.
    Raises:
        TypeError: non-float logits, non-integer token_ids or bad_words.
        ValueError: wrong shapes, a token id >= vocab, or a token id after padding (the
            message names its index).
    """
    xp = check_logits(logits)
    batch, vocab = logits.shape
    tokens = _token_ids(logits, token_ids, "token_ids")
    n = _lengths(xp, tokens, "token_ids")
    kind = str(getattr(bad_words, "dtype", "int")).removeprefix("torch.")
    if "int" not in kind:
        raise TypeError(f"bad_words must be an integer array, got dtype {kind}")
    words = xp.asarray(bad_words, dtype=xp.int64, device=device(logits))
    if words.ndim != 3 or words.shape[0] != batch:
        raise ValueError(
            f"bad_words must have shape ({batch}, words, max_len), got shape {tuple(words.shape)}"
        )
    if bool(xp.any(words >= vocab)):
        raise ValueError(
            f"bad_words holds token id {int(xp.max(words))}, outside the vocab of {vocab}"
        )
    length = _lengths(xp, words, "bad_words")  # (batch, words)
    dev = device(words)
    # Entry k < L - 1 of a sequence must equal the row's token n - (L - 1) + k.
    k = xp.reshape(xp.arange(max(words.shape[2] - 1, 0), dtype=xp.int64, device=dev), (1, 1, -1))
    prefix_len = xp.expand_dims(length - 1, axis=2)
    expected = _at(xp, tokens, xp.reshape(n, (-1, 1, 1)) - prefix_len + k)
    same = (k >= prefix_len) | (expected == words[:, :, : k.shape[2]])
    matched = xp.all(same, axis=2) & (length > 0)
    pad = xp.full((batch, words.shape[1], 1), -1, dtype=xp.int64, device=dev)
    last_at = xp.where(length > 0, length - 1, words.shape[2])
    last = xp.take_along_axis(xp.concat([words, pad], axis=2), last_at[..., None], axis=2)
    return _mask_tokens(xp, logits, xp.where(matched, last[..., 0], -1))


def apply_no_repeat_ngram(logits: Any, token_ids: Any, n: Any) -> Any:
    """Forbid a token that would repeat an n-gram of the row (HF's `no_repeat_ngram_size`).

    Row b, with tokens t = token_ids[b] (its leading entries >= 0, length len) and
    N = n[b]: token v is masked iff for some i with i + N <= len,
    t[i : i + N - 1] == t[len - N + 1 : len] and t[i + N - 1] == v, i.e. the last N - 1
    tokens followed by v would be an N-gram already present in t. With N == 1 every
    token of t is masked; a row with len < N, or N == 0 (disabled), is unchanged. HF's
    `NoRepeatNGramLogitsProcessor` runs over the whole sequence (prompt and output).

    Args:
        logits: float32 or float64, shape (batch, vocab).
        token_ids: integers, shape (batch, width); row b's tokens are its leading
            entries >= 0 and the rest is padding (negative values).
        n: integers, shape (batch,), each >= 0.
    Returns:
        A new array like `logits`.
    Raises:
        TypeError: non-float logits, non-integer token_ids or n.
        ValueError: wrong shapes, a token id >= vocab, a token id after padding, or a
            negative n (names the row and the value).
    """
    xp = check_logits(logits)
    tokens = _token_ids(logits, token_ids, "token_ids")
    size = _lengths(xp, tokens, "token_ids")
    ngram = row_param(logits, n, "n", xp.int64)
    row = first_bad_row(xp, ngram < 0)
    if row is not None:
        raise ValueError(f"n[{row}] must be >= 0 (0 disables), got {int(ngram[row])}")
    batch, width = tokens.shape
    dev = device(tokens)
    # Window s (the N-gram t[s : s + N]) matches when its first N - 1 tokens are the
    # row's last N - 1: entry k < N - 1 compares t[s + k] with t[len - N + 1 + k].
    start = xp.reshape(xp.arange(width, dtype=xp.int64, device=dev), (1, -1))
    longest = int(xp.max(ngram)) if batch else 0
    k = xp.reshape(xp.arange(max(longest - 1, 0), dtype=xp.int64, device=dev), (1, 1, -1))
    big_n = xp.reshape(ngram, (-1, 1))
    tail = _at(xp, tokens, xp.reshape(size - ngram + 1, (-1, 1, 1)) + k)
    same = (k >= big_n[..., None] - 1) | (_at(xp, tokens, start[..., None] + k) == tail)
    fits = start + big_n <= xp.reshape(size, (-1, 1))
    matched = xp.all(same, axis=2) & (big_n > 0) & fits
    return _mask_tokens(xp, logits, xp.where(matched, _at(xp, tokens, start + big_n - 1), -1))


def _power_or_inf(base: float, exponent: int) -> float:
    """base ** exponent in float64, +inf where it overflows (Python raises instead)."""
    try:
        return base**exponent
    except OverflowError:
        return math.inf


def _dry_repeats(tokens: list[int], breakers: set[int]) -> dict[int, int]:
    """DRY's n(v) of one context: for each token v that would extend a repeat, the length
    of the longest one (see `apply_dry`)."""
    size = len(tokens)
    # r: the tokens after the last breaker; a repeat never reaches back past one
    tail = next((k for k in range(size) if tokens[size - 1 - k] in breakers), size)
    # On the reversed context, z[k] is the longest common suffix of tokens[: size - k]
    # and tokens: the repeat that ends at i = size - 1 - k and that tokens[i + 1] extends.
    z = z_function(tokens[::-1])
    longest: dict[int, int] = {}
    for k in range(1, size):
        repeat = min(z[k], tail)
        follower = tokens[size - k]
        if repeat > longest.get(follower, 0):
            longest[follower] = repeat
    return longest


def apply_dry(
    logits: Any,
    token_ids: Any,
    multiplier: Any,
    base: Any,
    allowed_length: Any,
    penalty_last_n: Any,
    sequence_breakers: Any,
) -> Any:
    """DRY ("Don't Repeat Yourself"): penalise the tokens that would extend a repeat.

    Row b, with t = the row's context (its tokens in token_ids[b], oldest first; only the
    last penalty_last_n[b] of them when that is > 0, all of them when it is -1), L = len(t)
    and B = the ids in sequence_breakers[b]:
      - r = the number of tokens of t after its last breaker (L if t holds none): a
        repeat never reaches back past a sequence breaker;
      - for each i in [0, L - 1): m_i = min(r, the length of the longest common suffix of
        t[: i + 1] and t), the repeat that token t[i + 1] would extend (the last m_i
        tokens of t, followed by t[i + 1], occurred earlier in t; it may overlap them);
      - n(v) = the largest m_i over the i with t[i + 1] == v (0 if there is none);
      - every token v not in B with n(v) >= allowed_length[b] gets
            logits[b, v] - multiplier[b] * base[b] ** (n(v) - allowed_length[b]),
        computed in float64 and rounded once to the logits' dtype; a result below the
        dtype's lowest finite value (a huge penalty) becomes that value, so DRY never
        masks a token. -inf logits stay -inf; every other logit is unchanged.
    multiplier[b] == 0 or penalty_last_n[b] == 0 disables the row (llama.cpp's
    conventions: its dry_penalty_last_n is -1 for the whole context, 0 for off).
    The penalty's power may differ in its last bit between implementations (libm pow);
    results agree within the float tolerance, masks exactly.

    Args:
        logits: float32 or float64, shape (batch, vocab).
        token_ids: integers, shape (batch, width); row b's context is its leading entries
            >= 0 and the rest is padding (negative values). A sampler passes the prompt
            and the output tokens.
        multiplier: numbers, shape (batch,), each finite and >= 0.
        base: numbers, shape (batch,), each finite and > 1.
        allowed_length: integers, shape (batch,), each >= 1.
        penalty_last_n: integers, shape (batch,), each >= -1.
        sequence_breakers: integers, shape (batch, n), the breaker token ids of each row,
            padded with negative values anywhere (order and repetitions do not matter).
    Returns:
        A new array like `logits`.
    Raises:
        TypeError: non-float logits, non-integer ids, allowed_length or penalty_last_n,
            non-numeric multiplier or base.
        ValueError: wrong shapes, a token id >= vocab, a token id after padding, or a
            parameter out of range (names the row and the value).
    """
    xp = check_logits(logits)
    tokens = _token_ids(logits, token_ids, "token_ids")
    size = _lengths(xp, tokens, "token_ids")
    breakers = _token_ids(logits, sequence_breakers, "sequence_breakers")
    mult = row_param(logits, multiplier, "multiplier", xp.float64)
    base = row_param(logits, base, "base", xp.float64)
    allowed = row_param(logits, allowed_length, "allowed_length", xp.int64)
    last_n = row_param(logits, penalty_last_n, "penalty_last_n", xp.int64)
    for name, values, ok, why in (
        ("multiplier", mult, xp.isfinite(mult) & (mult >= 0), "finite and >= 0"),
        ("base", base, xp.isfinite(base) & (base > 1), "finite and > 1"),
        ("allowed_length", allowed, allowed >= 1, ">= 1"),
        ("penalty_last_n", last_n, last_n >= -1, ">= -1 (-1: the whole context, 0: off)"),
    ):
        row = first_bad_row(xp, ~ok)
        if row is not None:
            value = values[row]
            shown = float(value) if name in ("multiplier", "base") else int(value)
            raise ValueError(f"{name}[{row}] must be {why}, got {shown}")
    batch = logits.shape[0]
    penalised: list[list[tuple[int, float]]] = []
    for b in range(batch):
        n_b, last = int(size[b]), int(last_n[b])
        if float(mult[b]) == 0 or last == 0:
            penalised.append([])
            continue
        context = [int(t) for t in tokens[b, :n_b].tolist()]
        if last > 0:
            context = context[-last:]
        stops = {int(t) for t in breakers[b].tolist() if t >= 0}
        floor = int(allowed[b])
        penalised.append(
            [
                (token, float(mult[b]) * _power_or_inf(float(base[b]), repeat - floor))
                for token, repeat in _dry_repeats(context, stops).items()
                if repeat >= floor and token not in stops
            ]
        )
    width = max((len(p) for p in penalised), default=0)
    ids = [[t for t, _ in p] + [-1] * (width - len(p)) for p in penalised]
    amounts = [[a for _, a in p] + [0.0] * (width - len(p)) for p in penalised]
    where = device(logits)
    ids_arr = xp.reshape(xp.asarray(ids, dtype=xp.int64, device=where), (batch, width))
    amount_arr = xp.reshape(xp.asarray(amounts, dtype=xp.float64, device=where), (batch, width))
    penalty = bincount_rows(xp, ids_arr, logits.shape[1], weights=amount_arr)
    out = xp.astype(logits, xp.float64) - penalty
    # clamping before the rounding gives what rounding then clamping gives, without overflow
    lowest = xp.finfo(logits.dtype).min
    out = xp.where(xp.isfinite(logits) & (out < lowest), lowest, out)
    return xp.astype(out, logits.dtype)


def _uniform_at(xp: Any, seeds: Any, positions: Any, index: int) -> Any:
    """philox_uniform(seeds, positions, index + 1)[:, index], computing only the Philox
    block that holds that entry (seeds and positions: checked int64 vectors)."""
    block = index // 2
    zeros = xp.zeros_like(positions)
    counter = (
        zeros + (block & _MASK32),
        zeros + (block >> 32),
        positions & _MASK32,
        positions >> 32,
    )
    x0, x1, x2, x3 = _philox4x32_10(counter, (seeds & _MASK32, (seeds >> 32) & _MASK32))
    lo, hi = (x0, x1) if index % 2 == 0 else (x2, x3)
    return _to_unit_interval(xp, (hi << 20) | (lo >> 12))


def apply_xtc(logits: Any, threshold: Any, probability: Any, seeds: Any, positions: Any) -> Any:
    """XTC ("exclude top choices"): sometimes mask the likely tokens but the least of them.

    Row b, with p = softmax(logits[b]) in float64, the candidates C = the tokens with
    finite logits and p >= threshold[b], and the coin
    u = philox_uniform(seeds, positions, vocab + 2)[b, vocab + 1]:
    if u < probability[b] and C holds at least two tokens, every token of C whose logit
    is larger than the smallest logit in C is masked (the least likely candidate stays,
    and every candidate tied with it). Otherwise the row is unchanged. So probability 0
    disables XTC and probability 1 applies it at every position (u is in (0, 1));
    threshold > 0.5 never finds two candidates. Decisions whose p is within 1e-9
    (relative) of threshold[b] may differ between implementations.

    The coin is entry vocab + 1 of the row's Philox stream at its position (`sample`
    reads entries 0 .. vocab - 1, rejection sampling's acceptance test entry vocab), so
    it is independent of the token drawn there, reproducible from the seed and the same
    whatever else is in the batch (text-generation-webui's and llama.cpp's XTC draw it
    from a generator shared by the whole run).

    Args:
        logits: float32 or float64, shape (batch, vocab).
        threshold: numbers, shape (batch,), each in [0, 1].
        probability: numbers, shape (batch,), each in [0, 1].
        seeds: integers, shape (batch,), see `philox_uniform`.
        positions: integers, shape (batch,), each >= 0 (the output position of the token
            that will be drawn from the row).
    Returns:
        A new array like `logits`.
    Raises:
        TypeError: non-float logits, non-numeric threshold or probability, non-integer
            seeds or positions.
        ValueError: shapes disagree, a threshold or probability outside [0, 1], a negative
            position (names the row and the value).
    """
    xp = check_logits(logits)
    cut = row_param(logits, threshold, "threshold", xp.float64)
    chance = row_param(logits, probability, "probability", xp.float64)
    for name, value in (("threshold", cut), ("probability", chance)):
        row = first_bad_row(xp, ~((value >= 0) & (value <= 1)))
        if row is not None:
            raise ValueError(f"{name}[{row}] must be in [0, 1], got {float(value[row])}")
    seed = row_param(logits, seeds, "seeds", xp.int64)
    pos = row_param(logits, positions, "positions", xp.int64)
    row = first_bad_row(xp, pos < 0)
    if row is not None:
        raise ValueError(f"positions[{row}] must be >= 0, got {int(pos[row])}")
    coin = _uniform_at(xp, seed, pos, logits.shape[1] + 1)
    candidate = (_probs64(xp, logits) >= xp.reshape(cut, (-1, 1))) & xp.isfinite(logits)
    count = xp.sum(xp.astype(candidate, xp.int64), axis=1)
    least = xp.min(xp.where(candidate, logits, float("inf")), axis=1, keepdims=True)
    active = xp.reshape((coin < chance) & (count >= 2), (-1, 1))
    return xp.where(active & candidate & (logits > least), _NEG_INF, logits)


_LN2 = math.log(2.0)


def apply_mirostat(logits: Any, mu: Any) -> Any:
    """Mirostat v2's truncation: mask the tokens more surprising than mu bits.

    Row b, in float64: q = log_softmax(logits[b]) and each token's surprise in bits
    s[i] = -q[i] / ln 2. Token i is masked iff s[i] > mu[b] and logits[b, i] <
    max(logits[b]), evaluated as p[i] < 2 ** -mu[b] with p = exp(q): the tokens tied
    for the most likely always stay (llama.cpp keeps one token when every one is too
    surprising). The comparison is strict; mu[b] == +inf leaves the row unchanged.
    Decisions within 1e-9 (relative) of the threshold may differ between
    implementations.

    Mirostat v2 (Basu et al. 2021, llama.cpp's `mirostat = 2`) per step: mask with the
    request's mu, draw with `sample` from what is left (softmax of the result is the
    renormalised distribution), then `mirostat_update` with the drawn token gives the
    next step's mu. The state mu lives with the request (it starts at 2 * tau).

    Args:
        logits: float32 or float64, shape (batch, vocab).
        mu: numbers, shape (batch,), each not NaN (+inf disables the row).
    Returns:
        A new array like `logits`.
    Raises:
        TypeError: non-float logits, or a non-numeric mu.
        ValueError: shapes disagree, or a NaN mu (names the row and the value).
    """
    xp = check_logits(logits)
    mu = row_param(logits, mu, "mu", xp.float64)
    row = first_bad_row(xp, xp.isnan(mu))
    if row is not None:
        raise ValueError(f"mu[{row}] must not be NaN, got {float(mu[row])}")
    _, p, _ = _log_probs64(xp, logits)
    return _cut_below(xp, logits, p, xp.exp2(-mu))


def mirostat_update(logits: Any, sampled: Any, mu: Any, tau: Any, eta: Any) -> Any:
    """Mirostat v2's learning step: the next mu after drawing `sampled` from `logits`.

    Row b, in float64: q = log_softmax(logits[b]), the observed surprise in bits
    s = -q[sampled[b]] / ln 2, and the result mu[b] - eta[b] * (s - tau[b]): mu falls
    after a surprising token and rises after a predictable one, steering the average
    surprise towards tau. `logits` are those the token was drawn from (after
    `apply_mirostat`), so q is the log-probability renormalised over the kept tokens.
    Within a few ulp of that float64 formula (implementations take log differently).

    Args:
        logits: float32 or float64, shape (batch, vocab).
        sampled: integers, shape (batch,), each a token id in [0, vocab) whose logit is
            finite (a masked token cannot have been drawn).
        mu: numbers, shape (batch,), each finite (the mu the row was masked with).
        tau: numbers, shape (batch,), each finite and > 0 (the target surprise in bits).
        eta: numbers, shape (batch,), each in (0, 1] (the learning rate).
    Returns:
        float64 array of shape (batch,) in the logits' library and device.
    Raises:
        TypeError: non-float logits, non-integer sampled, non-numeric mu, tau or eta.
        ValueError: shapes disagree, a sampled id outside the vocab or masked in its row,
            or a mu, tau or eta out of range (names the row and the value).
    """
    xp = check_logits(logits)
    vocab = logits.shape[1]
    token = row_param(logits, sampled, "sampled", xp.int64)
    row = first_bad_row(xp, (token < 0) | (token >= vocab))
    if row is not None:
        raise ValueError(
            f"sampled[{row}] must be a token id in [0, {vocab}), got {int(token[row])}"
        )
    mu = row_param(logits, mu, "mu", xp.float64)
    tau = row_param(logits, tau, "tau", xp.float64)
    eta = row_param(logits, eta, "eta", xp.float64)
    for name, values, ok, why in (
        ("mu", mu, xp.isfinite(mu), "finite"),
        ("tau", tau, xp.isfinite(tau) & (tau > 0), "finite and > 0"),
        ("eta", eta, (eta > 0) & (eta <= 1), "in (0, 1]"),
    ):
        row = first_bad_row(xp, ~ok)
        if row is not None:
            raise ValueError(f"{name}[{row}] must be {why}, got {float(values[row])}")
    q, _, _ = _log_probs64(xp, logits)
    chosen = xp.reshape(xp.take_along_axis(q, xp.reshape(token, (-1, 1)), axis=1), (-1,))
    row = first_bad_row(xp, xp.isinf(chosen))
    if row is not None:
        raise ValueError(
            f"sampled[{row}] is token {int(token[row])}, masked (-inf) in logits row {row}: "
            "it cannot have been drawn"
        )
    return mu - eta * (-chosen / _LN2 - tau)


def log_softmax(logits: Any) -> Any:
    """Log-probabilities: x - max(x) - log(sum(exp(x - max(x)))) per row.

    Computed in the logits' dtype. -inf entries give -inf.

    Args:
        logits: float32 or float64, shape (batch, vocab), no row entirely -inf.
    Returns:
        A new array like `logits`.
    Raises:
        TypeError: non-float logits.
        ValueError: wrong shape, NaN/+inf, or a row entirely -inf.
    """
    xp = check_logits(logits)
    shifted = logits - xp.max(logits, axis=1, keepdims=True)
    return shifted - xp.log(xp.sum(xp.exp(shifted), axis=1, keepdims=True))


def topk_logprobs(logprobs: Any, num: int, sampled: Any) -> tuple[Any, Any, Any, Any]:
    """The `num` most likely tokens of each row, and the sampled token's logprob and rank.

    Top entries are ordered by logprob descending, ties broken by lower token id. The
    rank of the sampled token is 1 + the number of tokens with a strictly larger
    logprob (so the argmax has rank 1, and tied tokens share a rank).

    Args:
        logprobs: float32 or float64, shape (batch, vocab) (e.g. from `log_softmax`).
        num: int, 0 <= num <= vocab.
        sampled: integers, shape (batch,), each in [0, vocab).
    Returns:
        (values, ids, sampled_logprob, sampled_rank): values like logprobs with shape
        (batch, num); ids int64 (batch, num); sampled_logprob like logprobs, shape
        (batch,); sampled_rank int64, shape (batch,).
    Raises:
        TypeError: non-float logprobs, non-integer num or sampled.
        ValueError: wrong shapes, num outside [0, vocab], sampled outside [0, vocab).
    """
    xp = check_logits(logprobs, "logprobs")
    vocab = logprobs.shape[1]
    if isinstance(num, bool) or not isinstance(num, int):
        raise TypeError(f"num must be an int, got {num!r}")
    if not 0 <= num <= vocab:
        raise ValueError(f"num must be in [0, {vocab}], got {num}")
    s = row_param(logprobs, sampled, "sampled", xp.int64)
    row = first_bad_row(xp, (s < 0) | (s >= vocab))
    if row is not None:
        raise ValueError(f"sampled[{row}] must be a token id in [0, {vocab}), got {int(s[row])}")
    order = xp.argsort(logprobs, axis=1, descending=True, stable=True)[:, :num]
    values = xp.take_along_axis(logprobs, order, axis=1)
    chosen = xp.take_along_axis(logprobs, xp.reshape(s, (-1, 1)), axis=1)
    rank = 1 + xp.sum(xp.astype(logprobs > chosen, xp.int64), axis=1)
    return values, xp.astype(order, xp.int64), xp.reshape(chosen, (-1,)), rank


# --- Philox-4x32-10 -------------------------------------------------------------------

PHILOX_M0, PHILOX_M1 = 0xD2511F53, 0xCD9E8D57  # round multipliers
PHILOX_W0, PHILOX_W1 = 0x9E3779B9, 0xBB67AE85  # key schedule (Weyl) increments
_MASK32 = 0xFFFFFFFF


def _mulhilo(xp: Any, m: int, x: Any) -> tuple[Any, Any]:
    """High and low 32-bit words of m * x; int64 arithmetic wraps, the bits are right."""
    prod = x * m
    return (prod >> 32) & _MASK32, prod & _MASK32


def _philox4x32_10(counter: tuple[Any, Any, Any, Any], key: tuple[Any, Any]) -> tuple:
    """Philox-4x32 with 10 rounds (Salmon et al., SC'11), on int64 arrays of uint32 words.

    One round maps (c0, c1, c2, c3) with key (k0, k1) to
        (hi(M1*c2) ^ c1 ^ k0, lo(M1*c2), hi(M0*c0) ^ c3 ^ k1, lo(M0*c0))
    and between rounds the key advances by (W0, W1) modulo 2**32. Known answer
    (Random123): counter 0, key 0 -> 6627e8d5 e169c58d bc57ac4c 9b00dbd8.
    """
    c0, c1, c2, c3 = counter
    k0, k1 = key
    xp = namespace(c0, "counter")
    for rnd in range(10):
        if rnd:
            k0, k1 = (k0 + PHILOX_W0) & _MASK32, (k1 + PHILOX_W1) & _MASK32
        hi0, lo0 = _mulhilo(xp, PHILOX_M0, c0)
        hi1, lo1 = _mulhilo(xp, PHILOX_M1, c2)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
    return c0, c1, c2, c3


def philox_uniform(seeds: Any, positions: Any, num: int) -> Any:
    """`num` uniform doubles in (0, 1) per row, a pure function of (seed, position, index).

    Bit for bit, for row b and index i in [0, num):
      key     = (seed & 0xFFFFFFFF, seed >> 32)            seed as 64 unsigned bits
      counter = (j & 0xFFFFFFFF, j >> 32, pos & 0xFFFFFFFF, pos >> 32), j = i // 2
      (x0, x1, x2, x3) = Philox-4x32-10(counter, key)
      (lo, hi) = (x0, x1) if i is even else (x2, x3)
      m = ((hi << 32) | lo) >> 12                          52 random bits
      u = (2 * m + 1) * 2**-53                             exact in float64
    so u is never 0 or 1. The stream for a row does not depend on the batch.

    Args:
        seeds: integers, shape (batch,): int64 (the two's-complement bit pattern is the
            key, so negative seeds are valid) or uint64. Its library and device are
            used for the result.
        positions: integers, shape (batch,), each >= 0 (output position of the token).
        num: int >= 0, the number of uniforms per row (the vocab size for `sample`).
    Returns:
        float64 array of shape (batch, num).
    Raises:
        TypeError: non-integer seeds or positions, or a non-int num.
        ValueError: seeds not 1-D, positions of another shape, a negative position or num.
    """
    xp = namespace(seeds, "seeds")
    kind = str(seeds.dtype).removeprefix("torch.")
    if "int" not in kind:
        raise TypeError(f"seeds must be an integer array, got dtype {kind}")
    if seeds.ndim != 1:
        raise ValueError(f"seeds must have shape (batch,), got shape {tuple(seeds.shape)}")
    if isinstance(num, bool) or not isinstance(num, int):
        raise TypeError(f"num must be an int, got {num!r}")
    if num < 0:
        raise ValueError(f"num must be >= 0, got {num}")
    seed = xp.astype(seeds, xp.int64)
    pos = row_param(seeds, positions, "positions", xp.int64)
    row = first_bad_row(xp, pos < 0)
    if row is not None:
        raise ValueError(f"positions[{row}] must be >= 0, got {int(pos[row])}")
    batch, blocks = seeds.shape[0], (num + 1) // 2
    j = xp.reshape(xp.arange(blocks, dtype=xp.int64, device=device(seeds)), (1, blocks))
    zeros = xp.zeros((batch, blocks), dtype=xp.int64, device=device(seeds))
    col = lambda v: xp.reshape(v, (-1, 1)) + zeros  # noqa: E731  (broadcast a row value)
    counter = (j & _MASK32) + zeros, (j >> 32) + zeros, col(pos & _MASK32), col(pos >> 32)
    key = col(seed & _MASK32), col((seed >> 32) & _MASK32)
    x0, x1, x2, x3 = _philox4x32_10(counter, key)
    m = xp.stack([(x1 << 20) | (x0 >> 12), (x3 << 20) | (x2 >> 12)], axis=2)
    return xp.reshape(_to_unit_interval(xp, m), (batch, 2 * blocks))[:, :num]


def _to_unit_interval(xp: Any, m: Any) -> Any:
    """u = (2 * m + 1) * 2**-53 for 52 random bits m: exact in float64, in (0, 1)."""
    return (xp.astype(m, xp.float64) * 2.0 + 1.0) * 2.0**-53


def sample(logits: Any, temperature: Any, seeds: Any, positions: Any) -> Any:
    """Draw one token per row: greedy where temperature is 0, else a seeded random draw.

    `logits` are the final logits (after `apply_temperature` and the filters); the
    temperature is consulted only to pick greedy rows.
      - temperature[b] == 0: token = argmax(logits[b]), the lowest index on ties.
      - otherwise, the exponential race: with u = philox_uniform(seeds, positions, vocab)
        token = argmax_i softmax(logits[b])[i] / -log(u[b, i]), evaluated in float64 as
        argmax_i (logits[b, i] - log(-log(u[b, i]))). This is an exact draw from
        softmax(logits[b]); masked (-inf) tokens are never drawn.
    The token depends only on (seeds[b], positions[b], logits[b]): batch-invariant.

    Args:
        logits: float32 or float64, shape (batch, vocab); no row entirely -inf.
        temperature: numbers, shape (batch,), each >= 0.
        seeds: integers, shape (batch,), see `philox_uniform`.
        positions: integers, shape (batch,), each >= 0.
    Returns:
        int64 token ids, shape (batch,), on the logits' device.
    Raises:
        TypeError / ValueError: as for `philox_uniform` and `apply_temperature`.
    """
    xp = check_logits(logits)
    t = row_param(logits, temperature, "temperature", xp.float64)
    row = first_bad_row(xp, ~(xp.isfinite(t) & (t >= 0)))
    if row is not None:
        raise ValueError(f"temperature[{row}] must be finite and >= 0, got {float(t[row])}")
    seeds_arr = row_param(logits, seeds, "seeds", xp.int64)
    u = philox_uniform(seeds_arr, positions, logits.shape[1])
    score = xp.astype(logits, xp.float64) - xp.log(-xp.log(u))
    drawn = xp.argmax(score, axis=1)
    greedy = xp.argmax(logits, axis=1)
    return xp.astype(xp.where(t == 0, greedy, drawn), xp.int64)
