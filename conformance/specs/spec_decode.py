"""Properties of `ops.spec_decode` (see `pyagent_ref/ops/spec_decode.py` for the contract).

Cases are drawn per request (k in 0-4 drafts, a vocabulary of 1-12 tokens so that drafts
often equal the target's argmax, logits with ties and -inf, drafts that are the argmax or
any token, q = None, a random distribution with zeros, or p itself) and flattened into the
op's layout, so that batch invariance can move whole requests around.

The oracle re-derives the verification per request from the docstring, on
`oracles.philox_uniform` and float64 softmax; it also says which requests hold a decision
inside the contract's 1e-9 band, where implementations may differ. The statistical
property is the one that matters for users: decoding with speculation, step after step,
emits tokens distributed exactly as decoding the target alone (chi-square on the joint
distribution of the first k + 1 tokens).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import strategies as st

import pyagent_ref.ops.spec_decode  # noqa: F401 - binds pyagent_ref.ops.spec_decode for the reference

from .. import checks, contract, oracles
from ..core import Case, Ctx, Spec
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
