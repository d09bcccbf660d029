"""pyagent_accel.ops.spec_decode against pyagent_ref (numpy and torch CPU, float32/float64).

Tokens are compared on random batches in the flattened layout (drafts that are often the
target's argmax, so that chains of accepted drafts occur; q absent, float32, float64 or p
itself), on a vocabulary of 32000 (the parallel path) and on strided views. Greedy
verification is exact; a random request may differ from the reference only where the
contract allows it: an acceptance test or a race decided within 1e-9 (relative), which
`near_a_decision` finds by redoing the reference's float64 arithmetic. Bad inputs must
raise the reference's exception, class and message. The conformance suite
(`python -m conformance pyagent_accel spec_decode`) is the specification check; these are
the accelerator's regression tests.
"""

from __future__ import annotations

import numpy as np
import pytest
from pyagent_accel.ops import sampling as AS
from pyagent_accel.ops import spec_decode as A

from pyagent_ref.ops import sampling as RS
from pyagent_ref.ops import spec_decode as R

torch = pytest.importorskip("torch")

LIBS = ["numpy", "torch"]
DTYPES = [np.float32, np.float64]
BAND = 1e-9


def batch(rng, vocab, counts, dtype, q_kind="none", greedy_share=0.3):
    """The arguments of rejection_sample for requests with `counts` drafts: logits with a
    few -inf and ties, drafts that are the row's argmax half the time."""
    counts = np.asarray(counts, np.int64)
    rows = int(counts.sum()) + counts.size
    logits = rng.normal(0.0, 2.0, (rows, vocab))
    masked = rng.random((rows, vocab)) < 0.05
    masked[np.arange(rows), np.argmax(logits, axis=1)] = False  # no row entirely -inf
    logits[masked] = -np.inf
    logits[:, 0] = np.where(rng.random(rows) < 0.2, logits.max(axis=1), logits[:, 0])  # ties
    logits = logits.astype(dtype)
    drafts, starts = [], np.cumsum(counts) - counts
    for b, k in enumerate(counts):
        for i in range(k):
            row = logits[starts[b] + b + i]
            drafts.append(int(np.argmax(row)) if rng.random() < 0.5 else int(rng.integers(vocab)))
    drafts = np.array(drafts, np.int64)
    q = None
    if q_kind == "p":
        keep = np.concatenate(
            [np.arange(k) + s + b for b, (k, s) in enumerate(zip(counts, starts, strict=True))]
        )
        q = softmax64(logits[keep.astype(np.int64)])
    elif q_kind != "none":
        q = rng.dirichlet(np.full(vocab, 0.3), drafts.size).reshape(-1, vocab)
        q[np.arange(drafts.size), drafts] += 0.5
        q = (q / q.sum(axis=1, keepdims=True)).astype(q_kind)
    temperature = np.where(rng.random(counts.size) < greedy_share, 0.0, 1.0)
    seeds = rng.integers(-(2**63), 2**63 - 1, counts.size, dtype=np.int64)
    positions = rng.integers(0, 2**40, counts.size, dtype=np.int64)
    return logits, drafts, counts, q, temperature, seeds, positions


def softmax64(x):
    x = np.asarray(x, np.float64)
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def close_race(scores):
    """Whether the two best scores are within the band."""
    top = np.sort(scores[np.isfinite(scores)])[-2:]
    return top.size == 2 and top[1] - top[0] <= BAND * max(1.0, abs(top[1]))


def near_a_decision(args):
    """Per request: whether any decision the contract lets implementations take differently
    (within 1e-9) occurs on its rows: each acceptance test and each race it could run."""
    logits, drafts, counts, q, temperature, seeds, positions = args
    vocab, near = logits.shape[1], []
    for b, k in enumerate(counts.tolist()):
        start, hit = int(counts[:b].sum()), False
        for i in range(k + 1 if temperature[b] else 0):
            row = np.asarray(logits[start + b + i], np.float64)
            u = RS.philox_uniform(seeds[b : b + 1], positions[b : b + 1] + i, vocab + 1)[0]
            gumbel = -np.log(-np.log(u[:vocab]))
            hit |= close_race(row + gumbel)
            if i < k:
                p, x = softmax64(row), int(drafts[start + i])
                if q is None:
                    qi = np.zeros(vocab)
                    qi[x] = 1.0
                else:
                    qi = np.asarray(q[start + i], np.float64)
                hit |= abs(u[vocab] * qi[x] - p[x]) <= BAND * max(u[vocab] * qi[x], p[x])
                with np.errstate(divide="ignore"):
                    hit |= close_race(np.log(np.maximum(p - qi, 0.0)) + gumbel)
        near.append(bool(hit))
    return near


def on(lib, args):
    if lib == "numpy":
        return args
    return tuple(torch.from_numpy(a) if isinstance(a, np.ndarray) else a for a in args)


def as_numpy(out):
    return out.numpy() if isinstance(out, torch.Tensor) else out


def assert_same_tokens(got, want, near=None):
    """Equal int64 results of one library, request by request (those `near` excused)."""
    assert type(got) is type(want) and got.dtype == want.dtype and got.shape == want.shape
    got, want = as_numpy(got), as_numpy(want)
    for b in range(want.shape[0]):
        if near is None or not near[b]:
            np.testing.assert_array_equal(got[b], want[b], err_msg=f"request {b}")


@pytest.mark.parametrize("lib", LIBS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("vocab", [1, 7, 1000])
def test_verify_greedy_is_the_references(lib, dtype, vocab):
    rng = np.random.default_rng(vocab)
    counts = rng.integers(0, 5, 12)
    logits, drafts, counts, *_ = on(lib, batch(rng, vocab, counts, dtype))
    assert_same_tokens(
        A.verify_greedy(logits, drafts, counts), R.verify_greedy(logits, drafts, counts)
    )


@pytest.mark.parametrize("lib", LIBS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("q_kind", ["none", "float32", "float64", "p"])
@pytest.mark.parametrize("vocab", [3, 1000])
def test_rejection_sample_is_the_references(lib, dtype, q_kind, vocab):
    rng = np.random.default_rng(vocab + len(q_kind))
    args = batch(rng, vocab, rng.integers(0, 5, 40), dtype, q_kind)
    near = near_a_decision(args)
    assert sum(near) <= len(near) // 4, "the inputs should mostly be away from the band"
    args = on(lib, args)
    got, want = A.rejection_sample(*args), R.rejection_sample(*args)
    assert_same_tokens(got, want, near)
    accepted = (as_numpy(want)[:, 1:] >= 0).sum()
    assert accepted > 0, "the inputs should accept some drafts"


@pytest.mark.parametrize("q_kind", ["none", "float32"])
def test_a_vocabulary_of_32000_in_parallel(q_kind):
    rng = np.random.default_rng(32000)
    args = batch(rng, 32000, [4] * 8 + [0, 1, 2], np.float32, q_kind, greedy_share=0.2)
    near = near_a_decision(args)
    assert_same_tokens(A.rejection_sample(*args), R.rejection_sample(*args), near)
    greedy = args[:3]
    assert_same_tokens(A.verify_greedy(*greedy), R.verify_greedy(*greedy))


def test_without_drafts_it_is_sample():
    rng = np.random.default_rng(5)
    logits, drafts, counts, _, temperature, seeds, positions = batch(rng, 500, [0] * 16, np.float64)
    out = A.rejection_sample(logits, drafts, counts, None, temperature, seeds, positions)
    sampled = AS.sample(logits, temperature, seeds, positions)
    np.testing.assert_array_equal(out[:, 0], sampled)


def test_one_hot_q_is_no_q():
    rng = np.random.default_rng(6)
    logits, drafts, counts, _, temperature, seeds, positions = batch(rng, 50, [3] * 20, np.float64)
    one_hot = np.eye(50)[drafts]
    without = A.rejection_sample(logits, drafts, counts, None, temperature, seeds, positions)
    with_q = A.rejection_sample(logits, drafts, counts, one_hot, temperature, seeds, positions)
    np.testing.assert_array_equal(with_q, without)


@pytest.mark.parametrize("lib", LIBS)
def test_strided_views_give_the_contiguous_result(lib):
    rng = np.random.default_rng(7)
    logits, drafts, counts, q, *rest = batch(rng, 300, rng.integers(0, 4, 6), np.float32, "float64")
    want = A.rejection_sample(*on(lib, (logits, drafts, counts, q, *rest)))
    for view in (
        lambda a: np.pad(a, ((0, 0), (0, 5)))[:, : a.shape[1]],  # padded rows
        lambda a: np.repeat(a, 2, axis=1)[:, ::2],  # every other column
        np.asfortranarray,  # column-major
    ):
        strided = on(lib, (view(logits), drafts, counts, view(q), *rest))
        assert_same_tokens(A.rejection_sample(*strided), want)
        assert_same_tokens(
            A.verify_greedy(*strided[:3]), A.verify_greedy(*on(lib, (logits, drafts, counts)))
        )


def test_inputs_are_not_modified_and_results_follow_the_logits_library():
    rng = np.random.default_rng(8)
    args = on("torch", batch(rng, 40, [2, 0, 3], np.float32, "float32"))
    before = [a.clone() for a in args if isinstance(a, torch.Tensor)]
    out = A.rejection_sample(*args)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.int64 and out.shape == (3, 4)
    for a, b in zip([a for a in args if isinstance(a, torch.Tensor)], before, strict=True):
        assert torch.equal(a, b)
    mixed = (args[0].numpy(), *args[1:])  # numpy logits, torch rest: a numpy result
    assert isinstance(A.verify_greedy(*mixed[:3]), np.ndarray)
    assert isinstance(A.rejection_sample(*mixed), np.ndarray)


def test_empty_batch():
    empty = (np.zeros((0, 5), np.float32), np.zeros(0, np.int64), np.zeros(0, np.int64))
    assert_same_tokens(A.verify_greedy(*empty), R.verify_greedy(*empty))
    scalars = (None, np.zeros(0), np.zeros(0, np.int64), np.zeros(0, np.int64))
    assert_same_tokens(A.rejection_sample(*empty, *scalars), R.rejection_sample(*empty, *scalars))


def _error(fn, *args):
    try:
        fn(*args)
    except Exception as exc:  # noqa: BLE001 - the class and message are compared
        return type(exc), str(exc)
    return None


def bad_calls(lib):
    """(what, rejection_sample's arguments): one thing broken in each."""
    rng = np.random.default_rng(9)
    logits, drafts, counts, q, t, seeds, pos = batch(rng, 6, [2, 0, 1], np.float64, "float32")
    nan, dead = logits.copy(), logits.copy()
    nan[1, 2], dead[4] = np.nan, -np.inf
    bad_q, neg_q = q.copy(), q.copy()
    bad_q[2, 5], neg_q[0, 0] = np.inf, -0.25
    out_of_vocab, neg_count, neg_t = drafts.copy(), counts.copy(), t.copy()
    neg_pos, overflow = pos.copy(), pos.copy()
    out_of_vocab[1], neg_count[2], neg_t[1], neg_pos[2], overflow[0] = 6, -1, -0.5, -3, 2**63 - 2
    good = (logits, drafts, counts, q, t, seeds, pos)

    def change(**kw):
        names = ("logits", "drafts", "counts", "q", "t", "seeds", "pos")
        return on(lib, tuple(kw.get(n, a) for n, a in zip(names, good, strict=True)))

    return [
        ("list logits", (logits.tolist(), *good[1:])),
        ("integer logits", change(logits=np.where(np.isfinite(logits), logits, 0).astype(int))),
        ("logits of shape (rows,)", change(logits=logits[:, 0])),
        ("empty vocab", change(logits=logits[:, :0])),
        ("a NaN logit", change(logits=nan)),
        ("a row entirely -inf", change(logits=dead)),
        ("a NaN logit and bad counts", change(logits=nan, counts=neg_count)),
        ("a dead row and a bad q", change(logits=dead, q=bad_q)),
        ("one logits row too many", change(logits=np.concatenate([logits, logits[:1]]))),
        ("float draft ids", change(drafts=drafts.astype(np.float64))),
        ("bool draft ids", change(drafts=drafts > 0)),
        ("draft ids of shape (N, 1)", change(drafts=drafts[:, None])),
        ("a draft id == vocab", change(drafts=out_of_vocab)),
        ("draft ids as text", change(drafts="abc")),
        ("float counts", change(counts=counts.astype(np.float32))),
        ("counts of shape (batch, 1)", change(counts=counts[:, None])),
        ("a negative count", change(counts=neg_count)),
        ("counts summing to N + 1", change(counts=counts + np.array([1, 0, 0]))),
        ("q as a list", change(q=q.tolist())),
        ("float16 q", change(q=q.astype(np.float16))),
        ("q of shape (N, vocab + 1)", change(q=np.pad(q, ((0, 0), (0, 1))))),
        ("an infinite q", change(q=bad_q)),
        ("a negative q", change(q=neg_q)),
        ("a negative temperature", change(t=neg_t)),
        ("a NaN temperature", change(t=np.array([1.0, np.nan, 0.0]))),
        ("temperature of length batch + 1", change(t=np.append(t, 1.0))),
        ("bool temperature", change(t=t > 0)),
        ("float seeds", change(seeds=seeds.astype(np.float64))),
        ("seeds as text", change(seeds=["a", "b", "c"])),
        ("a negative position", change(pos=neg_pos)),
        ("a position whose last token overflows", change(pos=overflow)),
        ("positions of length batch - 1", change(pos=pos[:2])),
    ]


@pytest.mark.parametrize("lib", LIBS)
def test_errors_are_the_references(lib):
    for what, args in bad_calls(lib):
        want = _error(R.rejection_sample, *args)
        assert want is not None, f"the reference accepts {what}"
        assert _error(A.rejection_sample, *args) == want, what
        greedy_want = _error(R.verify_greedy, *args[:3])
        assert _error(A.verify_greedy, *args[:3]) == greedy_want, what


def test_tensors_on_other_devices_are_a_type_error():
    rng = np.random.default_rng(10)
    args = on("torch", batch(rng, 8, [1, 2], np.float32, "float32"))
    names = ("target_logits", "draft_token_ids", "num_draft_tokens", "draft_probs")
    for i, name in enumerate(names):
        moved = list(args)
        moved[i] = moved[i].to("meta")
        with pytest.raises(TypeError, match=f"{name} is a torch tensor on device meta"):
            A.rejection_sample(*moved)


# --- trees ------------------------------------------------------------------------------------


def tree_batch(rng, vocab, counts, dtype):
    """rejection_sample_tree's arguments: `batch`'s requests, each a random tree whose
    draft tokens are often the parent row's argmax (so that long paths are accepted)."""
    logits, _, counts, _, temperature, seeds, positions = batch(rng, vocab, counts, dtype)
    parents, tokens, starts = [], [], np.cumsum(counts) - counts
    for b, k in enumerate(counts.tolist()):
        for i in range(k):
            parent = int(rng.integers(0, i + 1))
            row = logits[starts[b] + b + parent]
            best = int(np.argmax(row))
            parents.append(parent)
            tokens.append(best if rng.random() < 0.6 else int(rng.integers(vocab)))
    parents, tokens = np.array(parents, np.int64), np.array(tokens, np.int64)
    return logits, tokens, counts, parents, temperature, seeds, positions


@pytest.mark.parametrize("lib", LIBS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("vocab", [1, 7, 1000, 32000])
def test_tree_ops_are_the_references(lib, dtype, vocab):
    rng = np.random.default_rng(vocab)
    for _ in range(2):
        counts = rng.integers(0, 9, int(rng.integers(1, 40 if vocab < 32000 else 4)))
        args = on(lib, tree_batch(rng, vocab, counts, dtype))
        assert_same_tokens(A.verify_tree_greedy(*args[:4]), R.verify_tree_greedy(*args[:4]))
        # no tree decision of these random float inputs sits within 1e-9 of its threshold
        assert_same_tokens(A.rejection_sample_tree(*args), R.rejection_sample_tree(*args))
        for k in set(np.asarray(counts).tolist()):
            parents = rng.integers(0, np.arange(k) + 1) if k else np.zeros(0, np.int64)
            mask = A.tree_attention_mask(on(lib, (parents,))[0])
            assert type(mask) is type(R.tree_attention_mask(on(lib, (parents,))[0]))
            np.testing.assert_array_equal(as_numpy(mask), R.tree_attention_mask(parents))


def test_tree_errors_are_the_references():
    rng = np.random.default_rng(11)
    logits, tokens, counts, parents, t, seeds, pos = tree_batch(rng, 6, [2, 3], np.float32)
    late, negative = parents.copy(), parents.copy()
    late[3], negative[0] = 2, -1
    calls = {
        "a parent after its draft": (logits, tokens, counts, late),
        "a negative parent": (logits, tokens, counts, negative),
        "one parent too few": (logits, tokens, counts, parents[:-1]),
        "float parents": (logits, tokens, counts, parents.astype(np.float32)),
    }
    for what, args in calls.items():
        want = _error(R.verify_tree_greedy, *args)
        assert want is not None, f"the reference accepts {what}"
        assert _error(A.verify_tree_greedy, *args) == want, what
        assert _error(A.rejection_sample_tree, *args, t, seeds, pos) == _error(
            R.rejection_sample_tree, *args, t, seeds, pos
        ), what
    for bad in ([0, 2], [-1], np.zeros((2, 1), np.int64), [0.0]):
        assert _error(A.tree_attention_mask, bad) == _error(R.tree_attention_mask, bad), bad
    meta = torch.zeros(3, dtype=torch.int64, device="meta")
    with pytest.raises(TypeError, match="draft_parents is a torch tensor on device meta"):
        A.tree_attention_mask(meta)


# --- propose_ngram ----------------------------------------------------------------------------


def repetitive(rng, n, vocab=50):
    """n ids that repeat passages of earlier ones (edits and chats copy their context),
    with a few fresh ids between the copies."""
    ids = list(rng.integers(0, vocab, 64))
    while len(ids) < n:
        start = int(rng.integers(0, len(ids)))
        ids += ids[start : start + int(rng.integers(1, 40))]
        ids += rng.integers(0, vocab, int(rng.integers(0, 3))).tolist()
    return [int(t) for t in ids[:n]]


NGRAM_SETTINGS = [(1, 1, 1), (4, 1, 3), (5, 2, 2), (8, 3, 7), (3, 6, 9)]


@pytest.mark.parametrize("n", [0, 1, 2, 5, 100, 4097, 50_000])
@pytest.mark.parametrize("vocab", [2, 50, 32000])
def test_propose_ngram_is_the_references(n, vocab):
    """Lists, tuples, arrays of several integer dtypes and torch tensors, on both sides
    of the size above which the GIL is released."""
    rng = np.random.default_rng(n * 7 + vocab)
    ids = repetitive(rng, n, vocab)
    inputs = [ids, tuple(ids), np.array(ids, np.int64), torch.tensor(ids, dtype=torch.int64)]
    if vocab < 256:
        inputs += [np.array(ids, np.uint8), torch.tensor(ids, dtype=torch.int16)]
    for settings in NGRAM_SETTINGS:
        want = R.propose_ngram(ids, *settings)
        for token_ids in inputs:
            assert A.propose_ngram(token_ids, *settings) == want, (type(token_ids), settings)


def test_propose_ngram_reads_strided_and_unsigned_arrays():
    ids = np.array([3, 1, 2, 3, 1, 9, 2**64 - 1, 3, 1], np.uint64)
    wide = np.zeros(2 * ids.size, np.uint64)
    wide[::2] = ids
    for token_ids in (ids, wide[::2], ids[::-1], torch.tensor(ids.astype(np.int64))[::2]):
        assert A.propose_ngram(token_ids, 3, 1, 3) == R.propose_ngram(token_ids, 3, 1, 3)
    assert A.propose_ngram(ids, 3, 1, 3) == [9, 2**64 - 1, 3]


def test_propose_ngram_takes_ints_of_any_size_and_returns_the_inputs_items():
    big = [2**70, -(2**64), 5, 2**70, -(2**64), 7, 2**70, -(2**64)]
    assert A.propose_ngram(big, 2, 1, 2) == R.propose_ngram(big, 2, 1, 2) == [7, 2**70]
    items = [1000, 2000, 1000]
    assert A.propose_ngram(items, 1, 1, 1)[0] is items[1]  # sliced from the input, as the reference
    huge = 2**100  # a setting beyond int64 acts as an unbounded one
    ids = [1, 2, 3, 1, 2, 3, 1]
    assert A.propose_ngram(ids, huge, 1, huge) == R.propose_ngram(ids, huge, 1, huge) == [2, 3, 1]
    assert A.propose_ngram(ids, 2, huge, huge) == []


def test_propose_ngram_leaves_its_input_alone():
    ids = repetitive(np.random.default_rng(1), 5000)
    array, before = np.array(ids), list(ids)
    A.propose_ngram(ids, 5, 1, 4)
    A.propose_ngram(array, 5, 1, 4)
    assert ids == before and array.tolist() == before


def test_propose_ngram_errors_are_the_references():
    """Class and message, settings first (in argument order), then the token ids."""
    s = [1, 2, 1]
    bad = [
        (s, 0, 1, 2),
        (s, 1, 0, 2),
        (s, 1, 1, 0),
        (s, 1, 3, 2),
        (s, 2**70, 3, 2),
        (s, 1.0, 1, 2),
        (s, 1, True, 2),
        (s, 1, 1, None),
        (s, np.int64(1), 1, 2),
        (s, 1, 0, 2.0),
        ([1, 2.0], 1, 1, 1),
        ([1, False], 1, 1, 1),
        ([1, "2"], 1, 1, 1),
        ((1, np.int64(2)), 1, 1, 1),
        ([2**70, 1.5], 1, 1, 1),
        (np.array([1.0, 2.0]), 1, 1, 1),
        (np.array([True]), 1, 1, 1),
        (np.zeros((2, 2), np.int64), 1, 1, 1),
        (np.int64(3), 1, 1, 1),
        (torch.tensor([1.0]), 1, 1, 1),
        (torch.zeros((1, 2), dtype=torch.int64), 1, 1, 1),
        (None, 1, 1, 1),
        (5, 1, 1, 1),
        (np.array([1.0]), 0, 1, 1),
        ([1.5], 1, 2, 1),
    ]
    for args in bad:
        want = _error(R.propose_ngram, *args)
        assert want is not None, f"the reference accepts {args}"
        assert _error(A.propose_ngram, *args) == want, args


def test_propose_ngram_rejects_tensors_on_other_devices():
    with pytest.raises(TypeError, match="token_ids is a torch tensor on device meta"):
        A.propose_ngram(torch.zeros(4, dtype=torch.int64, device="meta"), 2, 1, 2)
