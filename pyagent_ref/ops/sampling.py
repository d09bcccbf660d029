"""Sampling ops: logits processors, log-probabilities and seeded sampling.

Every op works on a batch of rows, `logits` of shape (batch, vocab), with its parameters
given per row as arrays of shape (batch,). Masking a token means setting its logit to
-inf. All ops return new arrays and never modify their inputs. One implementation serves
numpy arrays and torch tensors on any device; results come back in the input's library,
dtype and device.

The order a sampler applies them in (vLLM's): penalties and logit bias on the raw
logits, then `apply_temperature`, then `apply_min_p`, `apply_top_k`, `apply_top_p`,
then `sample`.

Randomness: `sample` draws with the exponential race over `philox_uniform`, a
counter-based generator keyed by each row's seed and counted by (output position,
token index). The same (seed, position, logits row) gives the same token in any
conforming implementation, whatever else is in the batch.
"""

from __future__ import annotations

from typing import Any

from array_api_compat import device

from ._arrays import bincount_rows, check_logits, first_bad_row, namespace, row_param

__all__ = [
    "apply_temperature",
    "apply_top_k",
    "apply_top_p",
    "apply_min_p",
    "apply_penalties",
    "apply_logit_bias",
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
    u = (xp.astype(m, xp.float64) * 2.0 + 1.0) * 2.0**-53
    return xp.reshape(u, (batch, 2 * blocks))[:, :num]


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
