"""Tree verification: lossless for arbitrary targets and trees (chi-square), a worked
example of the greedy path, and the attention mask with the nodes' positions."""

from __future__ import annotations

import numpy as np
import pytest

from conformance.specs.spec_decode import TREE_P, TREE_VOCAB, tree_lossless_pvalue


def random_case(seed: int) -> tuple[np.ndarray, np.ndarray, list[int], str]:
    """A Markov target over TREE_VOCAB tokens with a few impossible transitions, a random
    tree of 4-7 drafts and a drafting rule."""
    rng = np.random.default_rng(seed)
    p0 = rng.dirichlet(np.ones(TREE_VOCAB))
    p = rng.dirichlet(np.full(TREE_VOCAB, 0.7), TREE_VOCAB)
    p[rng.integers(TREE_VOCAB), rng.integers(TREE_VOCAB)] = 0.0
    p /= p.sum(axis=1, keepdims=True)
    k = int(rng.integers(4, 8))
    parents = [int(rng.integers(0, i + 1)) for i in range(k)]
    return p0, p, parents, ("random", "top", "same")[seed % 3]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_tree_verification_is_lossless(ops, seed):
    p0, p, parents, drafting = random_case(seed)
    pvalue = tree_lossless_pvalue(ops.spec_decode.rejection_sample_tree, p0, p, parents, drafting)
    assert pvalue > TREE_P, f"parents {parents}, {drafting} drafts: p-value {pvalue:.3g}"


def test_greedy_takes_the_longest_argmax_path(ops):
    # root -> {1: token 2, 2: token 1}; node 1 -> {3: token 0}; node 2 -> {4: token 3}
    parents, tokens = [0, 0, 1, 2], [2, 1, 0, 3]
    logits = np.full((5, 4), -1.0)
    logits[0, 1] = logits[2, 3] = logits[4, 2] = 1.0  # root wants 1, node 2 wants 3, node 4 2
    logits[1, 0] = logits[3, 0] = 1.0
    out = ops.spec_decode.verify_tree_greedy(logits, tokens, [4], parents)
    # path root -> node 2 (token 1) -> node 4 (token 3), then node 4's bonus token 2
    assert out.tolist() == [[1, 3, 2]]


def test_mask_and_positions_of_a_tree(ops):
    parents = [0, 0, 1, 1, 2]  # root: two guesses; two more after the first; one after the second
    mask = np.asarray(ops.spec_decode.tree_attention_mask(parents))
    assert mask.astype(int).tolist() == [
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [1, 0, 1, 0, 0, 0],
        [1, 1, 0, 1, 0, 0],
        [1, 1, 0, 0, 1, 0],
        [1, 0, 1, 0, 0, 1],
    ]
    assert (mask.sum(axis=1) - 1).tolist() == [0, 1, 1, 2, 2, 2]  # depths: position offsets
