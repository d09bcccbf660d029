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

Trees (`tree_attention_mask`, `verify_tree_greedy`, `rejection_sample_tree`): trees of 0-6
drafts shaped as a chain, a star or any tree, whose tokens are the parent row's argmax,
its n-th most likely token (Medusa's top-k siblings), a copy of a sibling's token or any
token. The oracle walks the tree as the docstring says; a chain must give exactly the
linear ops' tokens; the lossless property decodes a Markov target with draft trees
(chi-square on the first 3 tokens).

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
def requests(draw: Any, dtype: Any, vocab: int, q_kind: str, hot: bool, q_dtype: Any) -> Case:
    """One request: logits (k + 1, vocab), drafts (k,), q (k, vocab) of `q_dtype` or None,
    its scalars. (One q dtype per batch: a request moved to a batch of another q dtype
    would see its q rounded differently.)"""
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
        q = q.astype(q_dtype)
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
    one = requests(dtype, vocab, q_kind, hot, draw(st.sampled_from(FLOAT_DTYPES)))
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


def scalar_errors(case: Case) -> list[tuple[str, dict[str, Any], type]]:
    """Bad temperatures, seeds and positions."""
    t, s, p = case.temperature, case.seeds, case.positions
    neg_t, neg_p, over = t.copy(), p.copy(), p.copy()
    neg_t[0], neg_p[0] = -1.0, -1
    over[0] = INT64_MAX - case.num_draft_tokens[0] + 1
    cases = [
        ("a negative temperature", {"temperature": neg_t}, ValueError),
        ("temperature of length batch + 1", {"temperature": np.append(t, 1.0)}, ValueError),
        ("float seeds", {"seeds": s.astype(np.float64)}, TypeError),
        ("seeds of length batch + 1", {"seeds": np.append(s, 1)}, ValueError),
        ("a negative position", {"positions": neg_p}, ValueError),
        ("float positions", {"positions": p.astype(np.float64)}, TypeError),
    ]
    if case.num_draft_tokens[0] > 0:
        cases.append(("a position whose last token overflows", {"positions": over}, ValueError))
    return cases


def rejection_errors(case: Case) -> list[tuple[str, dict[str, Any], type]]:
    q = case.draft_probs
    bad_q = q.copy()
    cases = [
        ("integer draft_probs", {"draft_probs": q.astype(np.int64)}, TypeError),
        (
            "draft_probs of shape (N, vocab + 1)",
            {"draft_probs": np.pad(q, ((0, 0), (0, 1)))},
            ValueError,
        ),
        *scalar_errors(case),
    ]
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


# --- trees: shared strategies and the oracle ------------------------------------------------

GREEDY_TREE, REJECTION_TREE = SHAPES["verify_tree_greedy"], SHAPES["rejection_sample_tree"]
MASK = SHAPES["tree_attention_mask"]


@st.composite
def tree_parents(draw: Any, k: int) -> list[int]:
    """Parents of k drafts: a chain, a star (all children of the root) or any tree."""
    shape = draw(st.sampled_from(("chain", "star", "any")))
    if shape == "chain":
        return list(range(k))
    if shape == "star":
        return [0] * k
    return [draw(st.integers(0, i)) for i in range(k)]


@st.composite
def tree_requests(draw: Any, dtype: Any, vocab: int, hot: bool) -> Case:
    """One request: logits (k + 1, vocab), a tree of k in 0-6 drafts whose tokens are the
    parent row's argmax, its n-th most likely token (n = the number of earlier siblings:
    Medusa's top-k), a copy of an earlier sibling's token, or any token."""
    k = draw(st.integers(0, 6))
    parents = draw(tree_parents(k))
    logits = draw(logits_arrays(batch=k + 1, vocab=vocab, dtype=dtype, bound=8.0))
    tokens: list[int] = []
    for i, parent in enumerate(parents):
        siblings = [tokens[j] for j in range(i) if parents[j] == parent]
        ranked = np.argsort(-logits[parent].astype(np.float64), kind="stable")
        options = [first_argmax(logits[parent]), int(ranked[len(siblings) % vocab])]
        options += [draw(st.integers(0, vocab - 1)), *siblings[:1]]
        tokens.append(draw(st.sampled_from(options)))
    temperature = draw(st.sampled_from((1.0, 0.7)) if hot else st.sampled_from((0.0, 1.0)))
    return Case(
        logits=logits,
        drafts=np.array(tokens, dtype=np.int64),
        parents=np.array(parents, dtype=np.int64),
        temperature=temperature,
        seed=draw(seed_values),
        position=min(draw(position_values), INT64_MAX - k),
    )


def flatten_trees(reqs: list[Case], vocab: int, dtype: Any) -> Case:
    """The op's flattened tree layout for these requests (module docstring of the op)."""
    case = flatten(reqs, vocab, dtype, "none")
    case.draft_parents = np.concatenate([np.zeros(0, np.int64), *[r.parents for r in reqs]])
    return case


@st.composite
def tree_batches(draw: Any, hot: bool = False, extra: bool = False) -> Any:
    """A flattened batch of 1-5 trees; with `extra`, as `batches`."""
    dtype = draw(st.sampled_from(FLOAT_DTYPES))
    vocab = draw(st.integers(1, 12))
    one = tree_requests(dtype, vocab, hot)
    reqs = draw(st.lists(one, min_size=1, max_size=5))
    case = flatten_trees(reqs, vocab, dtype)
    if not extra:
        return case
    more = draw(st.lists(one, max_size=4))
    order = draw(st.permutations(range(len(reqs) + len(more))))
    mixed = [(reqs + more)[i] for i in order]
    where = [order.index(i) for i in range(len(reqs))]
    return case, flatten_trees(mixed, vocab, dtype), where


def children_of(parents: np.ndarray) -> list[list[int]]:
    """children[v]: the nodes whose parent is v, in node order (node i + 1 is draft i)."""
    children: list[list[int]] = [[] for _ in range(parents.shape[0] + 1)]
    for i, parent in enumerate(parents.tolist()):
        children[parent].append(i + 1)
    return children


def depth_of(parents: np.ndarray) -> list[int]:
    depth = [0]
    for parent in parents.tolist():
        depth.append(depth[parent] + 1)
    return depth


def verify_tree_request(r: Case, vocab: int, greedy: bool) -> tuple[list[int], bool]:
    """The tokens request `r` emits (the docstring read literally), and whether a decision
    sat in the band."""
    children, tokens = children_of(r.parents), [-1, *r.drafts.tolist()]
    node, out, unsure = 0, [], False
    while True:
        row, kids = r.logits[node], children[node]
        if greedy:
            t = first_argmax(row)
            out.append(t)
            node = next((c for c in kids if tokens[c] == t), None)
            if node is None:
                return out, unsure
            continue
        u = oracles.philox_uniform_row(int(r.seed), int(r.position) + len(out), vocab + len(kids))
        p = oracles.probs64(row)
        residual, mass, chosen = p.copy(), 1.0, None
        for j, child in enumerate(kids):
            x = tokens[child]
            unsure = unsure or near(u[vocab + j] * max(mass, 0.0), residual[x])
            if u[vocab + j] * max(mass, 0.0) < residual[x]:
                chosen = child
                break
            mass -= residual[x]
            residual[x] = 0.0
        if chosen is not None:
            out.append(tokens[chosen])
            node = chosen
            continue
        log_u = np.log(-np.log(np.array(u[:vocab])))
        if kids and residual.max() > 0:
            with np.errstate(divide="ignore"):
                scores = np.log(residual) - log_u
        else:
            scores = row.astype(np.float64) - log_u
        y, close = race(scores)
        return out + [y], unsure or close


def expected_trees(case: Case, greedy: bool = False) -> tuple[list[list[int]], list[bool]]:
    """Per request: its tokens and whether they may differ between implementations."""
    vocab = case.target_logits.shape[1]
    results = [verify_tree_request(r, vocab, greedy or r.temperature == 0) for r in case.requests]
    return [t for t, _ in results], [u for _, u in results]


def check_tree_layout(out: Any, case: Case) -> None:
    """int64 (batch, 1 + max depth); row b: 1 to depth_b + 1 tokens in the vocab, then -1."""
    depths = [max(depth_of(r.parents)) for r in case.requests]
    width = 1 + max(depths, default=0)
    checks.assert_shape_dtype(out, (len(depths), width), np.int64)
    for b, row in enumerate(out):
        n = int(np.sum(row >= 0))
        assert 1 <= n <= depths[b] + 1, f"request {b} emitted {n} tokens, depth {depths[b]}: {row}"
        assert np.all(row[n:] == -1) and np.all(row[:n] < case.target_logits.shape[1]), (
            f"request {b}: {row} is not tokens then -1"
        )


def check_trees_against_oracle(out: np.ndarray, case: Case, greedy: bool = False) -> None:
    want, unsure = expected_trees(case, greedy)
    for b, (got, tokens) in enumerate(zip(emitted(out), want, strict=True)):
        if not unsure[b]:
            assert got == tokens, f"request {b}: emitted {got}, the contract gives {tokens}"


def on_a_path(case: Case, out: np.ndarray) -> None:
    """Every emitted token but the last is a draft on one path from the root: the first
    child of the previous node holding it."""
    for b, (r, tokens) in enumerate(zip(case.requests, emitted(out), strict=True)):
        children, node = children_of(r.parents), 0
        for token in tokens[:-1]:
            node = next((c for c in children[node] if r.drafts[c - 1] == token), None)
            assert node is not None, f"request {b}: {tokens} is not a path of its tree"


# --- tree_attention_mask --------------------------------------------------------------------


@st.composite
def mask_cases(draw: Any) -> Case:
    """The parents of 0-12 drafts (a chain, a star or any tree), as int64, int32 or a list."""
    k = draw(st.integers(0, 12))
    parents = draw(tree_parents(k))
    kind = draw(st.sampled_from(("int64", "int32", "list")))
    return Case(draft_parents=parents if kind == "list" else np.array(parents, dtype=kind))


def ancestors_or_self(parents: list[int]) -> np.ndarray:
    """The mask read literally: walk up from each node to the root."""
    k = len(parents)
    mask = np.zeros((k + 1, k + 1), dtype=bool)
    for i in range(k + 1):
        node = i
        while True:
            mask[i, node] = True
            if node == 0:
                break
            node = parents[node - 1]
    return mask


@spec.prop("tree_attention_mask", mask_cases())
def mask_holds_ancestors_and_self(ctx: Ctx, case: Case) -> None:
    """bool (k + 1, k + 1) in the input's library: mask[i, j] iff node j is on the path from
    the root to node i (siblings and cousins never see each other)."""
    out = ctx.call_raw("tree_attention_mask", case.draft_parents)
    if isinstance(case.draft_parents, np.ndarray):
        like = ctx.arr(case.draft_parents)
        problem = checks.same_library(out, like)
        assert problem is None, problem
    parents = [int(p) for p in case.draft_parents]
    got = to_numpy(out)
    checks.assert_shape_dtype(got, (len(parents) + 1,) * 2, np.bool_)
    checks.assert_equal(got, ancestors_or_self(parents), what="the mask")


@spec.prop("tree_attention_mask", mask_cases())
def mask_rows_count_depth(ctx: Ctx, case: Case) -> None:
    """Row i holds depth(i) + 1 True values (positions are root + depth), the diagonal is
    True, and a chain gives the causal lower triangle."""
    got = ctx.call("tree_attention_mask", case.draft_parents)
    parents = np.array([int(p) for p in case.draft_parents], dtype=np.int64)
    checks.assert_equal(got.sum(axis=1), np.array(depth_of(parents)) + 1, what="row sums")
    assert got.diagonal().all(), "a node does not attend to itself"
    k = parents.shape[0]
    chain = ctx.call("tree_attention_mask", np.arange(k, dtype=np.int64))
    checks.assert_equal(chain, np.tril(np.ones((k + 1, k + 1), bool)), what="a chain's mask")


def mask_errors(case: Case) -> list[tuple[str, tuple[Any, ...], type]]:
    parents = [int(p) for p in case.draft_parents]
    cases = [
        ("float parents", (np.array(parents, dtype=np.float64),), TypeError),
        ("parents of shape (k, 1)", (np.array(parents, dtype=np.int64)[:, None],), ValueError),
        ("a parent after its node", ([*parents, len(parents) + 1],), ValueError),
        ("a negative parent", ([*parents, -1],), ValueError),
    ]
    return cases


add_rejects_invalid_input(spec, MASK, error_variants(mask_cases(), mask_errors))
add_does_not_modify_inputs(spec, MASK, mask_cases())
add_matches_reference(
    spec,
    MASK,
    mask_cases(),
    lambda case, got, ref: checks.assert_equal(got, ref, what="the mask"),
    "The reference's mask, exactly.",
)


# --- verify_tree_greedy ---------------------------------------------------------------------


@spec.prop("verify_tree_greedy", tree_batches())
def emits_the_greedy_path(ctx: Ctx, case: Case) -> None:
    """From the root, each request emits the target's argmax at its node and moves to the
    first child holding it, until no child does (then the argmax there is its last token)."""
    out = ctx.call("verify_tree_greedy", *GREEDY_TREE.call_args(case))
    check_tree_layout(out, case)
    check_trees_against_oracle(out, case, greedy=True)
    on_a_path(case, out)


@spec.prop("verify_tree_greedy", batches(q_kind="none"))
def a_chain_is_verify_greedy(ctx: Ctx, case: Case) -> None:
    """A chain tree (draft i's parent is node i) emits what `verify_greedy` emits."""
    chain = np.concatenate([np.zeros(0, np.int64), *[np.arange(k) for k in case.num_draft_tokens]])
    got = ctx.call("verify_tree_greedy", *GREEDY.call_args(case), chain)
    checks.assert_equal(got, ctx.ref("verify_greedy", *GREEDY.call_args(case)), what="chain")


@spec.prop("verify_tree_greedy", tree_batches(extra=True), name="batch_invariant")
def tree_greedy_batch_invariant(ctx: Ctx, triple: Any) -> None:
    """A request's tokens do not change when other requests are added or the batch permuted."""
    case, bigger, where = triple
    alone = emitted(ctx.call("verify_tree_greedy", *GREEDY_TREE.call_args(case)))
    together = emitted(ctx.call("verify_tree_greedy", *GREEDY_TREE.call_args(bigger)))
    for b, w in enumerate(where):
        assert together[w] == alone[b], f"request {b}: {together[w]} in a bigger batch, {alone[b]}"


# --- rejection_sample_tree ------------------------------------------------------------------


@spec.prop("rejection_sample_tree", tree_batches(hot=True), name="follows_the_contract")
def tree_rejection_follows_the_contract(ctx: Ctx, case: Case) -> None:
    """The tokens of an independent implementation of the docstring (child j of a node at
    depth d decided by uniform vocab + j of position + d against p with the rejected
    siblings zeroed; the race over that residual, or over the logits at a leaf); requests
    with a decision inside the 1e-9 band are excused."""
    out = ctx.call("rejection_sample_tree", *REJECTION_TREE.call_args(case))
    check_tree_layout(out, case)
    check_trees_against_oracle(out, case)
    on_a_path(case, out)


@spec.prop("rejection_sample_tree", tree_batches())
def greedy_trees_verify_greedily(ctx: Ctx, case: Case) -> None:
    """Requests with temperature 0 emit what `verify_tree_greedy` emits for them."""
    out = emitted(ctx.call("rejection_sample_tree", *REJECTION_TREE.call_args(case)))
    want = emitted(ctx.ref("verify_tree_greedy", *GREEDY_TREE.call_args(case)))
    for b, r in enumerate(case.requests):
        if r.temperature == 0:
            assert out[b] == want[b], f"greedy request {b}: {out[b]}, expected {want[b]}"


@spec.prop("rejection_sample_tree", batches(q_kind="none", hot=True))
def a_chain_is_rejection_sample(ctx: Ctx, case: Case) -> None:
    """A chain tree reads the uniforms `rejection_sample` reads and emits its tokens
    (draft_probs=None; requests with a decision in the 1e-9 band excused)."""
    chain = np.concatenate([np.zeros(0, np.int64), *[np.arange(k) for k in case.num_draft_tokens]])
    args = REJECTION.call_args(case)
    got = ctx.call("rejection_sample_tree", *args[:3], chain, *args[4:])
    want = ctx.ref("rejection_sample", *args)
    _, unsure = expected(case)
    for b in range(want.shape[0]):
        if not unsure[b]:
            checks.assert_equal(got[b], want[b], what=f"tokens of chain request {b}")


@spec.prop("rejection_sample_tree", tree_batches(hot=True))
def tree_never_emits_a_masked_token(ctx: Ctx, case: Case) -> None:
    """No emitted token has a -inf target logit at the node it was emitted from."""
    out = ctx.call("rejection_sample_tree", *REJECTION_TREE.call_args(case))
    for b, (r, tokens) in enumerate(zip(case.requests, emitted(out), strict=True)):
        children, node = children_of(r.parents), 0
        for token in tokens:
            assert np.isfinite(r.logits[node, token]), f"request {b} emitted masked {token}"
            node = next((c for c in children[node] if r.drafts[c - 1] == token), node)


@spec.prop("rejection_sample_tree", tree_batches(hot=True, extra=True), name="batch_invariant")
def tree_rejection_batch_invariant(ctx: Ctx, triple: Any) -> None:
    """A request's tokens do not change when other requests are added or the batch permuted."""
    case, bigger, where = triple
    alone = emitted(ctx.call("rejection_sample_tree", *REJECTION_TREE.call_args(case)))
    together = emitted(ctx.call("rejection_sample_tree", *REJECTION_TREE.call_args(bigger)))
    for b, w in enumerate(where):
        assert together[w] == alone[b], f"request {b}: {together[w]} in a bigger batch, {alone[b]}"


# Lossless for trees: a Markov target over TREE_VOCAB tokens (the token after y has the
# distribution P[y]; the first, P0), a fixed tree shape with deterministic draft tokens
# from a numpy generator; each of TREE_RUNS requests decodes until it has TREE_LENGTH
# tokens, which must have the chain's distribution P0(y0) P[y0](y1) P[y1](y2).
TREE_VOCAB, TREE_LENGTH, TREE_RUNS, TREE_P = 3, 3, 6000, 1e-4
_tree_rng = np.random.default_rng(41)
_P0 = _tree_rng.dirichlet(np.ones(TREE_VOCAB))
_PT = _tree_rng.dirichlet(np.ones(TREE_VOCAB), TREE_VOCAB)
TREE_CASES = {
    # (P0, P, draft parents, how the drafts are chosen)
    "three guesses at the root, two below the first": (_P0, _PT, [0, 0, 0, 1, 1], "random"),
    "the target's top tokens (Medusa-like)": (_P0, _PT, [0, 0, 1, 1, 2], "top"),
    "repeated siblings": (_P0, _PT, [0, 0, 0, 1], "same"),
    "a deep branch and a masked token": (
        np.array([0.0, 0.4, 0.6]),
        np.array([[0.5, 0.5, 0.0], [0.0, 0.3, 0.7], [0.2, 0.0, 0.8]]),
        [0, 1, 2, 0, 4],
        "random",
    ),
}


def tree_lossless_pvalue(
    verify: Any, p0: np.ndarray, p: np.ndarray, parents: list[int], drafting: str
) -> float:
    """chi-square p-value of the first TREE_LENGTH tokens of TREE_RUNS decodes verified by
    `verify` (rejection_sample_tree's signature) against the Markov chain (p0, p). Draft
    tokens: "random" (a numpy generator), "top" (the target's most likely tokens at the
    parent, siblings in rank order) or "same" (every sibling the same random token)."""
    from scipy import stats

    vocab, length, runs, k = TREE_VOCAB, TREE_LENGTH, TREE_RUNS, len(parents)
    rng = np.random.default_rng(0)
    with np.errstate(divide="ignore"):
        log_p0, log_p = np.log(p0), np.log(p)
    rank = np.argsort(-p, axis=1, kind="stable")
    tokens = np.full((runs, length), -1, np.int64)
    count = np.zeros(runs, np.int64)
    seeds = np.arange(runs, dtype=np.int64) * 7919 + 5
    children = children_of(np.array(parents, dtype=np.int64))
    while np.any(count < length):
        live = np.flatnonzero(count < length)
        rows, drafts = [], []
        for b in live.tolist():
            last = int(tokens[b, count[b] - 1]) if count[b] else -1
            node_token = [last]
            for i, parent in enumerate(parents):
                above = node_token[parent]
                if drafting == "top":
                    order = rank[above] if above >= 0 else np.argsort(-p0, kind="stable")
                    x = int(order[children[parent].index(i + 1) % vocab])
                elif drafting == "same" and children[parent].index(i + 1) > 0:
                    x = node_token[children[parent][0]]
                else:
                    x = int(rng.integers(vocab))
                node_token.append(x)
            rows += [log_p[t] if t >= 0 else log_p0 for t in node_token]
            drafts += node_token[1:]
        out = np.asarray(
            verify(
                np.array(rows),
                np.array(drafts, dtype=np.int64),
                np.full(live.size, k),
                np.tile(np.array(parents, dtype=np.int64), live.size),
                np.ones(live.size),
                seeds[live],
                count[live],
            )
        )
        for j, b in enumerate(live.tolist()):
            new = [int(t) for t in out[j] if t >= 0][: length - count[b]]
            tokens[b, count[b] : count[b] + len(new)] = new
            count[b] += len(new)
    if np.any(tokens < 0) or np.any(tokens >= vocab):
        return 0.0
    cells = np.ravel_multi_index(tokens.T, (vocab,) * length)
    observed = np.bincount(cells, minlength=vocab**length).astype(np.float64)
    want = p0
    for _ in range(1, length):
        want = want[..., None] * p  # want[..., a] * p[a, b]
    want = want.reshape(-1) * runs
    if np.any((want == 0) & (observed > 0)):
        return 0.0
    keep = want >= 5
    obs = np.append(observed[keep], observed[~keep].sum())
    exp = np.append(want[keep], want[~keep].sum())
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    return float(stats.chisquare(obs, exp).pvalue)


def tree_lossless(ctx: Ctx) -> None:
    """Decoding with draft trees emits tokens distributed as decoding the target alone: the
    first 3 tokens of 6000 seeded decodes fit a Markov target (chi-square p > 1e-4), for
    random guesses, the target's top tokens, repeated siblings, a deep branch and a masked
    token."""
    for name, (p0, p, parents, drafting) in TREE_CASES.items():
        pvalue = tree_lossless_pvalue(
            lambda *a: ctx.call("rejection_sample_tree", *a), p0, p, parents, drafting
        )
        assert pvalue > TREE_P, f"{name}: chi-square p-value {pvalue:.3g} <= {TREE_P}"


spec.add("rejection_sample_tree", tree_lossless)


def tree_errors(case: Case) -> list[tuple[str, dict[str, Any], type]]:
    """Broken parents (on top of the broken layouts)."""
    parents = case.draft_parents
    cases = [
        ("float parents", {"draft_parents": parents.astype(np.float64)}, TypeError),
        ("one parent too many", {"draft_parents": np.append(parents, 0)}, ValueError),
        ("parents of shape (N, 1)", {"draft_parents": parents[:, None]}, ValueError),
    ]
    if parents.shape[0]:
        late = parents.copy()
        late[-1] = parents.shape[0] + 1
        cases.append(("a parent after its draft", {"draft_parents": late}, ValueError))
        negative = parents.copy()
        negative[0] = -1
        cases.append(("a negative parent", {"draft_parents": negative}, ValueError))
    return cases


def tree_errors_of(shape: Any, extra: Any = None) -> Any:
    def variants(case: Case) -> list[tuple[str, tuple[Any, ...], type]]:
        broken = []
        for why, change, exc in layout_errors(case):
            ids = change.get("draft_token_ids", case.draft_token_ids)
            if ids.ndim == 1 and ids.shape[0] > case.draft_token_ids.shape[0]:
                # one more draft (request 0's), the root its parent
                change = {**change, "draft_parents": np.append(case.draft_parents, 0)}
            broken.append((why, change, exc))
        broken += tree_errors(case) + (extra(case) if extra else [])
        return [
            (why, tuple(change.get(a, getattr(case, a)) for a in shape.args), exc)
            for why, change, exc in broken
        ]

    return error_variants(tree_batches(), variants)


def comparing_trees(greedy: bool) -> Any:
    def compare(case: Case, got: Any, ref: Any) -> None:
        assert got.dtype == ref.dtype and got.shape == ref.shape, (
            f"{got.dtype}{got.shape}, the reference's {ref.dtype}{ref.shape}"
        )
        _, unsure = expected_trees(case, greedy)
        for b in range(ref.shape[0]):
            if not unsure[b]:
                checks.assert_equal(got[b], ref[b], what=f"tokens of request {b}")

    return compare


def returns_tree_rows(op: str) -> Any:
    def returns_documented_types(ctx: Ctx, case: Case) -> None:
        """int64 tokens of shape (batch, 1 + max depth), in the logits' library and device."""
        args = [ctx.convert(a) for a in SHAPES[op].call_args(case)]
        out = ctx.fn(op)(*args)
        problem = checks.same_library(out, args[0])
        assert problem is None, problem
        check_tree_layout(np.asarray(ctx.call(op, *SHAPES[op].call_args(case))), case)

    return returns_documented_types


for _shape, _extra in ((GREEDY_TREE, None), (REJECTION_TREE, scalar_errors)):
    _op = _shape.op
    spec.add(_op, returns_tree_rows(_op), tree_batches())
    add_does_not_modify_inputs(spec, _shape, tree_batches(hot=True))
    add_accepts_strided_input(spec, _shape, tree_batches(hot=True))
    add_rejects_invalid_input(spec, _shape, tree_errors_of(_shape, _extra))
    add_matches_reference(
        spec,
        _shape,
        tree_batches(hot=_op == "rejection_sample_tree"),
        comparing_trees(greedy=_op == "verify_tree_greedy"),
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
