"""`LogprobsColumns`: flat columns that read as vLLM's list of per-position dicts."""

import gc

import numpy as np
import pytest

from pyagent_ref.sample.logprobs import Logprob, Logprobs, LogprobsColumns


def position(top, sampled, sampled_logprob, sampled_rank):
    ids, values = zip(*top, strict=True) if top else ((), ())
    return Logprobs(
        np.array(ids, dtype=np.int64),
        np.array(values, dtype=np.float32),
        sampled,
        sampled_logprob,
        sampled_rank,
    )


def text(token: int) -> str:
    return f"<{token}>"


def test_positions_read_as_dicts_with_the_sampled_token_first_and_shared_ranks():
    cols = LogprobsColumns(text)
    cols.append(position([(7, -0.5), (3, -1.0), (9, -1.0), (4, -2.0)], 9, -1.0, 2))
    cols.append(None)
    cols.append(position([], 5, -3.25, 6))
    assert len(cols) == 3
    first = cols[0]
    assert list(first) == [9, 7, 3, 4]  # the sampled token first, listed once
    assert first[9] == Logprob(-1.0, 2, "<9>")
    assert first[7] == Logprob(-0.5, 1, "<7>")
    assert first[3] == Logprob(-1.0, 2, "<3>")  # tied with 9: the same rank
    assert first[4] == Logprob(-2.0, 4, "<4>")
    assert cols[1] is None and cols[-2] is None
    assert cols[2] == {5: Logprob(-3.25, 6, "<5>")}
    with pytest.raises(IndexError, match="position 3 out of range for 3 positions"):
        cols[3]


def test_slices_and_equality_follow_the_list_of_dicts():
    cols = LogprobsColumns(text)
    for t in range(6):
        cols.append(position([(t, -0.1 * t), (t + 1, -1.0)], t, -0.1 * t, 1))
    as_list = list(cols)
    for s in (slice(2, None), slice(None, 3), slice(1, 5, 2), slice(4, 2), slice(-2, None)):
        part = cols[s]
        assert isinstance(part, LogprobsColumns)
        assert part == as_list[s] and list(part) == as_list[s]
    assert cols == as_list and cols != as_list[:-1] and cols != "x"


def test_many_positions_cost_no_python_object_per_entry():
    """k = 20 logprobs over 2,000 positions: a few arrays, not 2,000 dicts and 42,000
    entries (only containers are counted by gc, so a dict per position would show)."""
    rng = np.random.default_rng(0)
    rows = []
    for _ in range(2000):
        values = np.sort(rng.standard_normal(20).astype(np.float32))[::-1]
        rows.append(Logprobs(rng.integers(0, 4096, 20), values, 1, -0.5, 3))
    gc.collect()
    before = len(gc.get_objects())
    cols = LogprobsColumns(text)
    cols.extend(rows)
    gc.collect()
    assert len(gc.get_objects()) - before < 50
    assert len(cols) == 2000 and len(cols.token_ids) == 2000 * 21
