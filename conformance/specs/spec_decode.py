"""Properties of `ops.spec_decode` (see `pyagent_ref/ops/spec_decode.py` for the contract).

Verification (`verify_greedy`, `rejection_sample`): cases are drawn per request (k in 0-4
drafts, a vocabulary of 1-12 tokens so that drafts often equal the target's argmax, logits
with ties and -inf, drafts that are the argmax or any token, q = None, a random
distribution with zeros, or p itself) and flattened into the op's layout, so that batch
invariance can move whole requests around.

The oracle re-derives the verification per request from the docstring, on
`oracles.philox_uniform` and float64 softmax; it also says which requests hold a decision
inside the contract's 1e-9 band, where implementations may differ. The statistical
property is the one that matters for users: decoding with speculation, step after step,
emits tokens distributed exactly as decoding the target alone (chi-square on the joint
distribution of the first k + 1 tokens).

Prompt lookup (`propose_ngram`): up to 40 token ids over alphabets of 1-3 tokens (so that
repeats, overlapping matches and ties between lengths are the rule), plus long sequences
(1000-6000 ids) whose suffix may be planted earlier; the oracle is the
docstring read literally (`oracles.ngram_proposal`: the longest L first, then the latest
occurrence followed by a token). The ids come as lists, tuples and integer arrays of
several dtypes, relabelled to values at the limits of int64 (and beyond, for Python
ints) so that only equality may matter.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import strategies as st

import pyagent_ref.ops.spec_decode  # noqa: F401 - binds pyagent_ref.ops.spec_decode for the reference

from .. import checks, contract, oracles
from ..core import Case, Ctx, Spec, to_numpy
from ._common import (
    FLOAT_DTYPES,
    NEG_INF,
    add_accepts_strided_input,
    add_does_not_modify_inputs,
    add_matches_reference,
    add_rejects_invalid_input,
    error_variants,
    logits_arrays,
    reference_shapes,
)
from .sampling import position_values, seed_values

OPS = contract.names("spec_decode")

spec = Spec("spec_decode", OPS)

SHAPES = reference_shapes("spec_decode")
GREEDY, REJECTION = SHAPES["verify_greedy"], SHAPES["rejection_sample"]
BAND = 1e-9  # the contract's relative band around a decision
INT64_MAX = 2**63 - 1


# --- strategies -----------------------------------------------------------------------------


@st.composite
def requests(draw: Any, dtype: Any, vocab: int, q_kind: str, hot: bool) -> Case:
    """One request: logits (k + 1, vocab), drafts (k,), q (k, vocab) or None, its scalars."""
    k = draw(st.integers(0, 4))
    logits = draw(logits_arrays(batch=k + 1, vocab=vocab, dtype=dtype, bound=8.0))
    firsts = [int(np.argmax(row)) for row in logits]
    drafts = np.array(
        [draw(st.sampled_from((firsts[i], draw(st.integers(0, vocab - 1))))) for i in range(k)],
        dtype=np.int64,
    )
    q = None
    if q_kind == "probs":
        how = draw(st.sampled_from(("random", "p")))
        if how == "p":
            q = np.array([oracles.probs64(row) for row in logits[:k]]).reshape(k, vocab)
        else:
            weights = st.one_of(st.just(0.0), st.floats(0.0, 4.0))
            q = np.array(draw(st.lists(weights, min_size=k * vocab, max_size=k * vocab)))
            q = q.reshape(k, vocab)
            q[np.arange(k), drafts] += draw(st.sampled_from((0.5, 1.0, 0.0)))
            sums = q.sum(axis=1, keepdims=True)
            q = np.divide(q, sums, out=np.zeros_like(q), where=sums > 0)
        q = q.astype(draw(st.sampled_from(FLOAT_DTYPES)))
    temperature = draw(st.sampled_from((1.0, 0.7)) if hot else st.sampled_from((0.0, 1.0)))
    position = min(draw(position_values), INT64_MAX - k)
    return Case(
        logits=logits,
        drafts=drafts,
        q=q,
        temperature=temperature,
        seed=draw(seed_values),
        position=position,
    )


def flatten(reqs: list[Case], vocab: int, dtype: Any, q_kind: str) -> Case:
    """The op's flattened layout for these requests (module docstring of the op)."""
    q = None
    if q_kind == "probs":
        q_dtype = reqs[0].q.dtype if reqs else np.float64
        q = np.concatenate([np.zeros((0, vocab), q_dtype), *[r.q.astype(q_dtype) for r in reqs]])
    return Case(
        target_logits=np.concatenate([np.zeros((0, vocab), dtype), *[r.logits for r in reqs]]),
        draft_token_ids=np.concatenate([np.zeros(0, np.int64), *[r.drafts for r in reqs]]),
        num_draft_tokens=np.array([r.drafts.shape[0] for r in reqs], dtype=np.int64),
        draft_probs=q,
        temperature=np.array([r.temperature for r in reqs], dtype=np.float64),
        seeds=np.array([r.seed for r in reqs], dtype=np.int64),
        positions=np.array([r.position for r in reqs], dtype=np.int64),
        requests=reqs,
    )


@st.composite
def batches(draw: Any, q_kind: str | None = None, hot: bool = False, extra: bool = False) -> Any:
    """A flattened batch of 1-5 requests; with `extra`, also (a batch with those requests
    permuted among others, where each request went)."""
    dtype = draw(st.sampled_from(FLOAT_DTYPES))
    vocab = draw(st.integers(1, 12))
    q_kind = q_kind or draw(st.sampled_from(("none", "probs")))
    one = requests(dtype, vocab, q_kind, hot)
    reqs = draw(st.lists(one, min_size=1, max_size=5))
    case = flatten(reqs, vocab, dtype, q_kind)
    if not extra:
        return case
    more = draw(st.lists(one, max_size=4))
    order = draw(st.permutations(range(len(reqs) + len(more))))
    mixed = [(reqs + more)[i] for i in order]
    where = [order.index(i) for i in range(len(reqs))]
    return case, flatten(mixed, vocab, dtype, q_kind), where


# --- the oracle -----------------------------------------------------------------------------


def first_argmax(row: np.ndarray) -> int:
    return int(np.flatnonzero(row == np.max(row))[0])


def near(a: float, b: float) -> bool:
    return abs(a - b) <= BAND * max(abs(a), abs(b), 1e-300)


def race(scores: np.ndarray) -> tuple[int, bool]:
    """(argmax, lowest index on ties; whether the two best are within the band)."""
    best = first_argmax(scores)
    rest = np.delete(scores, best)
    close = rest.size > 0 and abs(scores[best] - rest.max()) <= BAND * max(1.0, abs(scores[best]))
    return best, bool(close)


def verify_request(r: Case, vocab: int, greedy: bool) -> tuple[list[int], bool]:
    """The tokens request `r` emits, and whether a decision sat in the band."""
    k, out, unsure = r.drafts.shape[0], [], False
    for i in range(k + 1):
        row = r.logits[i]
        if greedy:
            if i < k and int(r.drafts[i]) == first_argmax(row):
                out.append(int(r.drafts[i]))
                continue
            return out + [first_argmax(row)], unsure
        u = np.array(oracles.philox_uniform_row(int(r.seed), int(r.position) + i, vocab + 1))
        p = oracles.probs64(row)
        log_u = np.log(-np.log(u[:vocab]))
        if i == k:  # every draft accepted: the bonus token
            y, close = race(row.astype(np.float64) - log_u)
            return out + [y], unsure or close
        x = int(r.drafts[i])
        q = np.eye(vocab)[x] if r.q is None else r.q[i].astype(np.float64)
        unsure = unsure or near(u[vocab] * q[x], p[x])
        if u[vocab] * q[x] < p[x]:
            out.append(x)
            continue
        residual = np.maximum(p - q, 0.0)
        if residual.max() > 0:
            with np.errstate(divide="ignore"):
                scores = np.log(residual) - log_u
        else:
            scores = row.astype(np.float64) - log_u
        y, close = race(scores)
        return out + [y], unsure or close
    raise AssertionError("unreachable")


def expected(case: Case, greedy: bool = False) -> tuple[list[list[int]], list[bool]]:
    """Per request: its tokens and whether they may differ between implementations."""
    vocab = case.target_logits.shape[1]
    results = [verify_request(r, vocab, greedy or r.temperature == 0) for r in case.requests]
    return [t for t, _ in results], [u for _, u in results]


def emitted(out: np.ndarray) -> list[list[int]]:
    return [[int(t) for t in row if t >= 0] for row in out]


def check_layout(out: Any, case: Case) -> None:
    """int64 (batch, 1 + max k); row b: 1 to k_b + 1 tokens in the vocab, then -1."""
    k = case.num_draft_tokens
    width = 1 + int(k.max(initial=0))
    checks.assert_shape_dtype(out, (k.shape[0], width), np.int64)
    for b, row in enumerate(out):
        n = int(np.sum(row >= 0))
        assert 1 <= n <= k[b] + 1, f"request {b} emitted {n} tokens with {k[b]} drafts: {row}"
        assert np.all(row[n:] == -1) and np.all(row[:n] < case.target_logits.shape[1]), (
            f"request {b}: {row} is not tokens then -1"
        )


def check_against_oracle(out: np.ndarray, case: Case, greedy: bool = False) -> None:
    want, unsure = expected(case, greedy)
    for b, (got, tokens) in enumerate(zip(emitted(out), want, strict=True)):
        if not unsure[b]:
            assert got == tokens, f"request {b}: emitted {got}, the contract gives {tokens}"


# --- verify_greedy --------------------------------------------------------------------------


@spec.prop("verify_greedy", batches())
def emits_the_greedy_chain(ctx: Ctx, case: Case) -> None:
    """Each request emits its drafts while they equal the target row's first argmax, then the
    target's argmax at the first mismatch (or the bonus row's argmax), then -1."""
    out = ctx.call("verify_greedy", *GREEDY.call_args(case))
    check_layout(out, case)
    check_against_oracle(out, case, greedy=True)


@spec.prop("verify_greedy", batches(extra=True), name="batch_invariant")
def greedy_batch_invariant(ctx: Ctx, triple: Any) -> None:
    """A request's tokens do not change when other requests are added or the batch permuted."""
    case, bigger, where = triple
    alone = emitted(ctx.call("verify_greedy", *GREEDY.call_args(case)))
    together = emitted(ctx.call("verify_greedy", *GREEDY.call_args(bigger)))
    for b, w in enumerate(where):
        assert together[w] == alone[b], f"request {b}: {together[w]} in a bigger batch, {alone[b]}"


# --- rejection_sample -----------------------------------------------------------------------


@spec.prop("rejection_sample", batches(), name="follows_the_contract")
def rejection_follows_the_contract(ctx: Ctx, case: Case) -> None:
    """The tokens of an independent implementation of the docstring (Philox uniform `vocab`
    of position + i decides draft i, the race over u[0:vocab] of max(p - q, 0) or p draws the
    last token); requests with a decision inside the 1e-9 band are excused."""
    out = ctx.call("rejection_sample", *REJECTION.call_args(case))
    check_layout(out, case)
    check_against_oracle(out, case)


@spec.prop("rejection_sample", batches())
def greedy_requests_verify_greedily(ctx: Ctx, case: Case) -> None:
    """Requests with temperature 0 emit what `verify_greedy` emits for them."""
    out = emitted(ctx.call("rejection_sample", *REJECTION.call_args(case)))
    want, _ = expected(case, greedy=True)
    for b, r in enumerate(case.requests):
        if r.temperature == 0:
            assert out[b] == want[b], f"greedy request {b}: {out[b]}, expected {want[b]}"


@spec.prop("rejection_sample", batches(hot=True))
def never_emits_a_masked_token(ctx: Ctx, case: Case) -> None:
    """No emitted token, accepted draft or drawn, has a -inf target logit at its position."""
    out = emitted(ctx.call("rejection_sample", *REJECTION.call_args(case)))
    for b, r in enumerate(case.requests):
        for i, token in enumerate(out[b]):
            assert np.isfinite(r.logits[i, token]), f"request {b} emitted masked token {token}"


@spec.prop("rejection_sample", batches(q_kind="none", hot=True))
def no_draft_probs_means_one_hot(ctx: Ctx, case: Case) -> None:
    """draft_probs=None gives the tokens of draft_probs = one-hot(draft_token_ids), exactly."""
    args = list(REJECTION.call_args(case))
    none = ctx.call("rejection_sample", *args)
    vocab = case.target_logits.shape[1]
    args[3] = np.eye(vocab)[case.draft_token_ids].reshape(-1, vocab)
    checks.assert_equal(ctx.call("rejection_sample", *args), none, what="with one-hot q")


@st.composite
def p_equals_q(draw: Any) -> Case:
    case = draw(batches(q_kind="probs", hot=True))
    rows = np.concatenate([r.logits[: r.drafts.shape[0]] for r in case.requests])
    case.draft_probs = np.array([oracles.probs64(x) for x in rows]).reshape(-1, rows.shape[1])
    return case


@spec.prop("rejection_sample", p_equals_q())
def accepts_every_draft_when_q_is_p(ctx: Ctx, case: Case) -> None:
    """With q = p every draft the target can emit is accepted (unless u[vocab] is within the
    band of 1): the ratio p / q is 1."""
    out = emitted(ctx.call("rejection_sample", *REJECTION.call_args(case)))
    vocab = case.target_logits.shape[1]
    for b, r in enumerate(case.requests):
        for i, x in enumerate(r.drafts.tolist()):
            if not np.isfinite(r.logits[i, x]):
                break
            u = oracles.philox_uniform_row(int(r.seed), int(r.position) + i, vocab + 1)[vocab]
            if u > 1 - BAND:
                break
            assert len(out[b]) > i + 1 and out[b][i] == x, f"request {b}: draft {i} rejected"


@spec.prop("rejection_sample", batches(hot=True, extra=True), name="batch_invariant")
def rejection_batch_invariant(ctx: Ctx, triple: Any) -> None:
    """A request's tokens do not change when other requests are added or the batch permuted
    (they depend only on its own rows, seed and position)."""
    case, bigger, where = triple
    alone = emitted(ctx.call("rejection_sample", *REJECTION.call_args(case)))
    together = emitted(ctx.call("rejection_sample", *REJECTION.call_args(bigger)))
    for b, w in enumerate(where):
        assert together[w] == alone[b], f"request {b}: {together[w]} in a bigger batch, {alone[b]}"


@spec.prop("rejection_sample", batches(hot=True))
def deterministic_per_seed(ctx: Ctx, case: Case) -> None:
    """The same inputs give the same tokens, call after call."""
    first = ctx.call("rejection_sample", *REJECTION.call_args(case))
    checks.assert_equal(ctx.call("rejection_sample", *REJECTION.call_args(case)), first)


# Lossless: context-free target and draft "models" over LOSSLESS_VOCAB tokens, given per
# output position (p_n, q_n for n in [0, 2k]); each of LOSSLESS_RUNS requests (its own seed)
# decodes with k drafts per step until it has k + 1 tokens. Without speculation token n
# is drawn from p_n, so the first k + 1 tokens must have the product distribution.
LOSSLESS_VOCAB, LOSSLESS_K, LOSSLESS_RUNS, LOSSLESS_P = 3, 2, 6000, 1e-4
_rng = np.random.default_rng(14)
_P = _rng.dirichlet(np.ones(LOSSLESS_VOCAB), 2 * LOSSLESS_K + 1)
LOSSLESS_CASES = {
    "q arbitrary": (_P, _rng.dirichlet(np.ones(LOSSLESS_VOCAB), 2 * LOSSLESS_K + 1)),
    "q with zeros where p has mass": (_P, np.tile([0.0, 0.2, 0.8], (2 * LOSSLESS_K + 1, 1))),
    "q = p": (_P, _P),
    "q sharper than p": (_P, _P**3 / (_P**3).sum(axis=1, keepdims=True)),
    "deterministic drafts (q = None)": (_P, None),
    "a token p masks": (np.tile([0.0, 0.3, 0.7], (2 * LOSSLESS_K + 1, 1)), _P),
}


def lossless_pvalue(verify: Any, p: np.ndarray, q: np.ndarray | None) -> float:
    """chi-square p-value of the first k + 1 tokens of LOSSLESS_RUNS speculative decodes with
    `verify` (rejection_sample's signature) against the product of p_0 .. p_k. Drafts come
    from a fixed numpy generator (q = None: token n % vocab at position n), so the value is a
    deterministic function of `verify`."""
    from scipy import stats

    vocab, k, runs = LOSSLESS_VOCAB, LOSSLESS_K, LOSSLESS_RUNS
    rng = np.random.default_rng(0)
    with np.errstate(divide="ignore"):
        log_p = np.log(p)
    tokens = np.full((runs, k + 1), -1, np.int64)
    count = np.zeros(runs, np.int64)
    seeds = np.arange(runs, dtype=np.int64) * 7919 + 5
    while np.any(count <= k):
        live = np.flatnonzero(count <= k)
        at = count[live, None] + np.arange(k)  # output position of each draft
        if q is None:
            drafts = at % vocab
            probs = None
        else:
            cdf = np.cumsum(q[at], axis=2)
            drafts = np.sum(rng.random((live.size, k, 1)) * cdf[..., -1:] > cdf, axis=2)
            probs = q[at].reshape(-1, vocab)
        rows = log_p[count[live, None] + np.arange(k + 1)].reshape(-1, vocab)
        out = np.asarray(
            verify(
                rows,
                drafts.reshape(-1),
                np.full(live.size, k),
                probs,
                np.ones(live.size),
                seeds[live],
                count[live],
            )
        )
        for j, b in enumerate(live.tolist()):
            new = [int(t) for t in out[j] if t >= 0][: k + 1 - count[b]]
            tokens[b, count[b] : count[b] + len(new)] = new
            count[b] += len(new)
    if np.any(tokens < 0) or np.any(tokens >= vocab):
        return 0.0
    cells = np.ravel_multi_index(tokens.T, (vocab,) * (k + 1))
    observed = np.bincount(cells, minlength=vocab ** (k + 1)).astype(np.float64)
    want = p[0]
    for n in range(1, k + 1):
        want = np.multiply.outer(want, p[n])
    want = want.reshape(-1) * runs
    if np.any((want == 0) & (observed > 0)):
        return 0.0
    keep = want >= 5
    obs = np.append(observed[keep], observed[~keep].sum())
    exp = np.append(want[keep], want[~keep].sum())
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    return float(stats.chisquare(obs, exp).pvalue)


def lossless(ctx: Ctx) -> None:
    """Decoding with speculation emits tokens distributed as decoding the target alone: the
    first k + 1 tokens of 6000 seeded decodes fit the product of the target's distributions
    (chi-square p > 1e-4), for q arbitrary, q with zeros where p has mass, q = p, q sharper
    than p, deterministic drafts, and a token the target masks."""
    for name, (p, q) in LOSSLESS_CASES.items():
        pvalue = lossless_pvalue(lambda *a: ctx.call("rejection_sample", *a), p, q)
        assert pvalue > LOSSLESS_P, f"{name}: chi-square p-value {pvalue:.3g} <= {LOSSLESS_P}"


spec.add("rejection_sample", lossless)


# --- shared properties ----------------------------------------------------------------------


def returns_int64_rows(op: str) -> Any:
    def returns_documented_types(ctx: Ctx, case: Case) -> None:
        """int64 tokens of shape (batch, 1 + max k), in the logits' library and device."""
        args = [ctx.convert(a) for a in SHAPES[op].call_args(case)]
        out = ctx.fn(op)(*args)
        problem = checks.same_library(out, args[0])
        assert problem is None, problem
        check_layout(np.asarray(ctx.call(op, *SHAPES[op].call_args(case))), case)

    return returns_documented_types


def layout_errors(case: Case) -> list[tuple[str, dict[str, Any], type]]:
    """Broken layouts shared by both ops: {parameter: bad value} and the exception."""
    x, d, k = case.target_logits, case.draft_token_ids, case.num_draft_tokens
    nan, dead = x.copy(), x.copy()
    nan[0, 0], dead[0] = np.nan, NEG_INF
    more = k.copy()
    more[0] += 1
    neg = k.copy()
    neg[0] = -1
    out_of_vocab = np.append(d, x.shape[1])
    return [
        ("integer logits", {"target_logits": x.astype(np.int64)}, TypeError),
        ("logits of shape (rows,)", {"target_logits": x[:, 0]}, ValueError),
        ("a NaN logit", {"target_logits": nan}, ValueError),
        ("a row entirely -inf", {"target_logits": dead}, ValueError),
        ("one logits row too many", {"target_logits": np.concatenate([x, x[:1]])}, ValueError),
        ("float draft ids", {"draft_token_ids": d.astype(np.float64)}, TypeError),
        ("draft ids of shape (N, 1)", {"draft_token_ids": d[:, None]}, ValueError),
        (
            "a draft id == vocab",
            {
                "draft_token_ids": out_of_vocab,
                "num_draft_tokens": more,
                "target_logits": np.concatenate([x, x[:1]]),
            },
            ValueError,
        ),
        ("float counts", {"num_draft_tokens": k.astype(np.float64)}, TypeError),
        ("counts of shape (batch, 1)", {"num_draft_tokens": k[:, None]}, ValueError),
        ("counts summing to N + 1", {"num_draft_tokens": more}, ValueError),
        ("a negative count", {"num_draft_tokens": neg}, ValueError),
    ]


def errors_of(shape: Any, extra: Any = None) -> Any:
    def variants(case: Case) -> list[tuple[str, tuple[Any, ...], type]]:
        broken = layout_errors(case) + (extra(case) if extra else [])
        return [
            (why, tuple(change.get(a, getattr(case, a)) for a in shape.args), exc)
            for why, change, exc in broken
        ]

    return error_variants(batches(q_kind="probs"), variants)


def rejection_errors(case: Case) -> list[tuple[str, dict[str, Any], type]]:
    q, t, s, p = case.draft_probs, case.temperature, case.seeds, case.positions
    bad_q, neg_t, neg_p, over = q.copy(), t.copy(), p.copy(), p.copy()
    neg_t[0], neg_p[0] = -1.0, -1
    over[0] = INT64_MAX - case.num_draft_tokens[0] + 1
    cases = [
        ("integer draft_probs", {"draft_probs": q.astype(np.int64)}, TypeError),
        (
            "draft_probs of shape (N, vocab + 1)",
            {"draft_probs": np.pad(q, ((0, 0), (0, 1)))},
            ValueError,
        ),
        ("a negative temperature", {"temperature": neg_t}, ValueError),
        ("temperature of length batch + 1", {"temperature": np.append(t, 1.0)}, ValueError),
        ("float seeds", {"seeds": s.astype(np.float64)}, TypeError),
        ("seeds of length batch + 1", {"seeds": np.append(s, 1)}, ValueError),
        ("a negative position", {"positions": neg_p}, ValueError),
        ("float positions", {"positions": p.astype(np.float64)}, TypeError),
    ]
    if case.num_draft_tokens[0] > 0:
        cases.append(("a position whose last token overflows", {"positions": over}, ValueError))
    if q.shape[0]:
        bad_q[0, 0] = -0.5
        cases.append(("a negative draft probability", {"draft_probs": bad_q}, ValueError))
        bad_q = q.copy()
        bad_q[-1, -1] = np.nan
        cases.append(("a NaN draft probability", {"draft_probs": bad_q}, ValueError))
    return cases


def comparing(greedy: bool) -> Any:
    def compare(case: Case, got: Any, ref: Any) -> None:
        assert got.dtype == ref.dtype and got.shape == ref.shape, (
            f"{got.dtype}{got.shape}, the reference's {ref.dtype}{ref.shape}"
        )
        _, unsure = expected(case, greedy)
        for b in range(ref.shape[0]):
            if not unsure[b]:
                checks.assert_equal(got[b], ref[b], what=f"tokens of request {b}")

    return compare


for _shape, _extra in ((GREEDY, None), (REJECTION, rejection_errors)):
    _op = _shape.op
    spec.add(_op, returns_int64_rows(_op), batches())
    add_does_not_modify_inputs(spec, _shape, batches(q_kind="probs", hot=True))
    add_accepts_strided_input(spec, _shape, batches(hot=True))
    add_rejects_invalid_input(spec, _shape, errors_of(_shape, _extra))
    add_matches_reference(
        spec,
        _shape,
        batches(hot=_op == "rejection_sample"),
        comparing(greedy=_op == "verify_greedy"),
        "The reference's tokens (requests with a decision in the 1e-9 band excused).",
    )


# --- propose_ngram --------------------------------------------------------------------------

NGRAM = SHAPES["propose_ngram"]
NGRAM_DTYPES = (np.int64, np.int32, np.uint8, np.uint64)
# Relabellings of ids 0, 1, 2 that a narrowing bug collapses: equal modulo 2**32 (int64 arrays)
# and modulo 2**64 (Python ints).
LABELS_INT64 = (7, 7 + 2**32, 7 - 2**63)
LABELS_BIG = (7, 7 + 2**64, 7 - 2**70)


@st.composite
def lookups(draw: Any) -> Case:
    """Up to 40 ids over 1-3 tokens, num_speculative_tokens 1-6, prompt_lookup_min 1-5 and
    prompt_lookup_max up to 4 more."""
    alphabet, n = draw(st.integers(1, 3)), draw(st.integers(0, 40))  # lists' sizes skew small
    lookup_min = draw(st.integers(1, 5))
    return Case(
        token_ids=draw(st.lists(st.integers(0, alphabet - 1), min_size=n, max_size=n)),
        num_speculative_tokens=draw(st.integers(1, 6)),
        prompt_lookup_min=lookup_min,
        prompt_lookup_max=lookup_min + draw(st.integers(0, 4)),
    )


@st.composite
def long_lookups(draw: Any) -> Case:
    """1000-6000 random ids (2, 16 or 1000 tokens) whose last 1-12 ids may also occur at
    a random earlier place, settings as `lookups`."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    n = draw(st.integers(1000, 6000))
    tokens = rng.integers(0, draw(st.sampled_from((2, 16, 1000))), n)
    if draw(st.booleans()):
        m = draw(st.integers(1, 12))
        at = draw(st.integers(0, n - 2 * m - 1))
        tokens[at : at + m] = tokens[n - m :]
    case = draw(lookups())
    case.token_ids = tokens.tolist()
    return case


def ngram_args(case: Case, token_ids: Any = None) -> tuple[Any, ...]:
    """The call's arguments: a copy of the case's token ids, or the ids given."""
    _, *settings = NGRAM.call_args(case)
    return (list(case.token_ids) if token_ids is None else token_ids, *settings)


def expected_proposal(case: Case, tokens: list[int] | None = None) -> list[int]:
    ids = case.token_ids if tokens is None else tokens
    return oracles.ngram_proposal(ids, *NGRAM.call_args(case)[1:])


def check_proposal(got: Any, want: list[int], what: str = "proposal") -> None:
    """`got` is a list of Python ints equal to `want`."""
    assert isinstance(got, list), f"{what}: returned {type(got).__name__}, not a list"
    bad = [t for t in got if isinstance(t, bool) or not isinstance(t, int)]
    assert not bad, f"{what}: {got} holds {type(bad[0]).__name__} items, not ints"
    assert got == want, f"{what}: proposed {got}, the contract gives {want}"


@spec.prop("propose_ngram", lookups())
def proposes_what_the_contract_says(ctx: Ctx, case: Case) -> None:
    """The tokens after the latest earlier occurrence (followed by a token, overlapping
    the suffix or not) of the longest suffix of length in [prompt_lookup_min,
    prompt_lookup_max] that occurs earlier, at most num_speculative_tokens of them; []
    when none occurs."""
    check_proposal(ctx.call_raw("propose_ngram", *ngram_args(case)), expected_proposal(case))


@spec.prop("propose_ngram", long_lookups())
def long_sequences_follow_the_contract(ctx: Ctx, case: Case) -> None:
    """The same on 1000-6000 ids, given as a list and as an int64 array: a match planted
    anywhere (or nowhere) is found."""
    want = expected_proposal(case)
    check_proposal(ctx.call_raw("propose_ngram", *ngram_args(case)), want, "list input")
    ids = np.array(case.token_ids, dtype=np.int64)
    check_proposal(ctx.call_raw("propose_ngram", *ngram_args(case, ids)), want, "array input")


@spec.prop("propose_ngram", lookups())
def proposes_at_most_num_tokens_after_a_match(ctx: Ctx, case: Case) -> None:
    """A list of 0 to num_speculative_tokens ints; a proposal is token_ids[p : p + m] for
    some p >= prompt_lookup_min with m = min(num_speculative_tokens, n - p); nothing is
    proposed from fewer than prompt_lookup_min + 1 ids."""
    s, num, lookup_min, _ = ngram_args(case)
    got = ctx.call_raw("propose_ngram", *ngram_args(case))
    assert isinstance(got, list), f"returned {type(got).__name__}, not a list"
    assert len(got) <= num, f"proposed {len(got)} tokens, more than {num}: {got}"
    if len(s) <= lookup_min:
        assert got == [], f"proposed {got} from {len(s)} ids"
    if got:
        starts = [
            p
            for p in range(lookup_min, len(s))
            if s[p : p + len(got)] == got and len(got) == min(num, len(s) - p)
        ]
        assert starts, f"{got} is not the next min({num}, n - p) ids at any p >= {lookup_min}"


@spec.prop("propose_ngram", lookups())
def more_tokens_extend_the_proposal(ctx: Ctx, case: Case) -> None:
    """num_speculative_tokens only cuts the proposal: with more of them, the proposal with
    fewer is its prefix (the match does not depend on it)."""
    fewer = ctx.call_raw("propose_ngram", *ngram_args(case))
    args = list(ngram_args(case))
    args[1] += 5
    more = ctx.call_raw("propose_ngram", *args)
    assert more[: len(fewer)] == fewer and len(more) >= len(fewer), (
        f"{fewer} with num_speculative_tokens={args[1] - 5}, {more} with {args[1]}"
    )


@spec.prop("propose_ngram", lookups())
def accepts_sequences_and_integer_arrays(ctx: Ctx, case: Case) -> None:
    """A tuple, and 1-D arrays of int64, int32, uint8 and uint64 (contiguous or a strided
    view, in the library under test) propose what the list does, as a list of ints."""
    want = expected_proposal(case)
    tuple_ids = tuple(case.token_ids)
    check_proposal(ctx.call_raw("propose_ngram", *ngram_args(case, tuple_ids)), want, "tuple")
    for dtype in NGRAM_DTYPES:
        ids = np.array(case.token_ids, dtype=dtype)
        what = f"{np.dtype(dtype).name} array"
        check_proposal(ctx.call_raw("propose_ngram", *ngram_args(case, ctx.arr(ids))), want, what)
        view = ctx.strided(ids, "every other column")  # `call_raw` would copy it
        assert np.array_equal(to_numpy(view), ids), "suite: bad view"
        check_proposal(ctx.fn("propose_ngram")(*ngram_args(case, view)), want, f"{what} view")


@spec.prop("propose_ngram", lookups())
def depends_only_on_which_ids_are_equal(ctx: Ctx, case: Case) -> None:
    """Relabelling the ids one-to-one, to values at the limits of int64 that agree in
    their low 32 bits, relabels the proposal the same way (list and int64 array)."""
    relabelled = [LABELS_INT64[t] for t in case.token_ids]
    want = [LABELS_INT64[t] for t in expected_proposal(case)]
    check_proposal(ctx.call_raw("propose_ngram", *ngram_args(case, relabelled)), want, "list")
    ids = np.array(relabelled, dtype=np.int64)
    check_proposal(ctx.call_raw("propose_ngram", *ngram_args(case, ctx.arr(ids))), want, "array")


@spec.prop("propose_ngram", lookups())
def takes_python_ints_of_any_size(ctx: Ctx, case: Case) -> None:
    """A list of ints beyond the range of int64 (equal modulo 2**64) proposes the same ids
    the relabelling of the small ones gives: token ids are ints, not int64."""
    relabelled = [LABELS_BIG[t] for t in case.token_ids]
    want = [LABELS_BIG[t] for t in expected_proposal(case)]
    check_proposal(ctx.call_raw("propose_ngram", *ngram_args(case, relabelled)), want)


@spec.prop("propose_ngram", lookups())
def does_not_modify_its_input(ctx: Ctx, case: Case) -> None:
    """The token ids, a list or an array, are the same after the call."""
    tokens = list(case.token_ids)
    ctx.call_raw("propose_ngram", *ngram_args(case, tokens))
    assert tokens == case.token_ids, f"the list became {tokens}"
    ids = ctx.arr(np.array(case.token_ids, dtype=np.int64))
    ctx.call_raw("propose_ngram", *ngram_args(case, ids))
    checks.assert_equal(to_numpy(ids), np.array(case.token_ids, dtype=np.int64), what="array")


def ngram_errors(case: Case) -> list[tuple[str, tuple[Any, ...], type]]:
    """One thing wrong (or two, to check the order: settings before token ids)."""
    s, num, lo, hi = ngram_args(case)
    floats = np.array(s, dtype=np.float64)
    return [
        ("num_speculative_tokens = 0", (s, 0, lo, hi), ValueError),
        ("a negative num_speculative_tokens", (s, -1, lo, hi), ValueError),
        ("prompt_lookup_min = 0", (s, num, 0, hi), ValueError),
        ("prompt_lookup_max = 0", (s, num, lo, 0), ValueError),
        ("prompt_lookup_min > prompt_lookup_max", (s, num, hi + 1, hi), ValueError),
        ("a float num_speculative_tokens", (s, float(num), lo, hi), TypeError),
        ("a bool prompt_lookup_min", (s, num, True, hi), TypeError),
        ("None as prompt_lookup_max", (s, num, lo, None), TypeError),
        ("a numpy integer setting", (s, np.int64(num), lo, hi), TypeError),
        ("prompt_lookup_min = 0, then a float max", (s, num, 0, float(hi)), ValueError),
        ("a float token id", ([*s, 1.5], num, lo, hi), TypeError),
        ("a bool token id", ([True, *s], num, lo, hi), TypeError),
        ("a str token id", ([*s, "1"], num, lo, hi), TypeError),
        ("a float array", (floats, num, lo, hi), TypeError),
        ("a bool array", (floats > 0, num, lo, hi), TypeError),
        ("a 2-D array", (np.array([s], dtype=np.int64), num, lo, hi), TypeError),
        ("a 0-d array", (np.array(len(s)), num, lo, hi), TypeError),
        ("None as token_ids", (None, num, lo, hi), TypeError),
        ("an int as token_ids", (len(s), num, lo, hi), TypeError),
        ("a float array and num_speculative_tokens = 0", (floats, 0, lo, hi), ValueError),
        ("a float token id and min > max", ([*s, 1.5], num, hi + 1, hi), ValueError),
    ]


add_rejects_invalid_input(spec, NGRAM, error_variants(lookups(), ngram_errors))
