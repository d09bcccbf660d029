"""Draft trees in the engine: depths, cutting a tree to the room left, and the accepted
path recovered from the emitted tokens (`spec_decode.tree`)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pyagent_ref.ops import spec_decode as ops
from pyagent_ref.spec_decode.medusa import MEDUSA_TREE, tree_parents
from pyagent_ref.spec_decode.tree import accepted_path, cut_tree, is_chain, node_depths

PARENTS = tree_parents(MEDUSA_TREE)


@st.composite
def trees(draw, max_nodes=12, vocab=4):
    """(tokens, parents) of a random tree: node i + 1's parent in [0, i]."""
    n = draw(st.integers(0, max_nodes))
    parents = [draw(st.integers(0, i)) for i in range(n)]
    tokens = draw(st.lists(st.integers(0, vocab - 1), min_size=n, max_size=n))
    return tokens, parents


def test_depths_of_the_medusa_tree():
    assert node_depths(PARENTS) == [0] + [1] * 4 + [2] * 6 + [3] * 4
    assert is_chain([0, 1, 2]) and not is_chain(PARENTS)


@given(tree=trees(), max_nodes=st.integers(0, 14), max_depth=st.integers(0, 5))
def test_a_cut_tree_is_the_subtree_that_fits(tree, max_nodes, max_depth):
    """Kept: the nodes among the first max_nodes no deeper than max_depth, in order, with
    their parents renumbered (still a tree whose depths are the original ones)."""
    tokens, parents = tree
    kept_tokens, kept_parents = cut_tree(tokens, parents, max_nodes, max_depth)
    depths = node_depths(parents)
    keep = [i for i in range(min(max_nodes, len(tokens))) if depths[i + 1] <= max_depth]
    assert kept_tokens == [tokens[i] for i in keep]
    assert all(0 <= p <= i for i, p in enumerate(kept_parents))
    assert node_depths(kept_parents)[1:] == [depths[i + 1] for i in keep]


@given(tree=trees(), data=st.data())
def test_the_accepted_path_is_the_one_the_greedy_op_walked(tree, data):
    """For target rows drawn at random, verify_tree_greedy's tokens lead back to the
    nodes whose rows drew them: the path's drafts are the emitted tokens, and each
    emitted token is the argmax of its node's row."""
    tokens, parents = tree
    vocab = 4
    logits = np.array(
        data.draw(
            st.lists(
                st.lists(st.floats(-3, 3), min_size=vocab, max_size=vocab),
                min_size=len(tokens) + 1,
                max_size=len(tokens) + 1,
            )
        )
    )
    emitted = [
        int(t)
        for t in ops.verify_tree_greedy(
            logits, np.array(tokens, np.int64), np.array([len(tokens)]), np.array(parents, np.int64)
        )[0]
        if t >= 0
    ]
    path = accepted_path(tokens, parents, emitted)
    assert len(path) == len(emitted)
    assert [tokens[v - 1] for v in path[1:]] == emitted[:-1]
    assert all(parents[v - 1] == u for u, v in zip(path, path[1:], strict=False))
    assert [int(np.argmax(logits[v])) for v in path] == emitted


def test_an_emitted_token_off_the_tree_is_a_value_error():
    with pytest.raises(ValueError, match=r"emitted token 0 \(7\) is no draft under node 0"):
        accepted_path([1, 2], [0, 1], [7, 3])
