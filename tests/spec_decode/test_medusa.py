"""Medusa heads: the tree shape, the drafts of given heads, and the shipped heads."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pyagent_ref.ops import spec_decode
from pyagent_ref.spec_decode.medusa import (
    DEFAULT_HEADS,
    MEDUSA_TREE,
    MedusaHeads,
    MedusaProposer,
    tree_parents,
)


def test_the_default_tree_is_topological_and_its_mask_has_the_paths_depths():
    parents = tree_parents(MEDUSA_TREE)
    assert parents == [0, 0, 0, 0, 1, 1, 1, 2, 2, 3, 5, 5, 6, 8]
    mask = np.asarray(spec_decode.tree_attention_mask(parents))
    assert (mask.sum(axis=1) - 1).tolist() == [0] + [len(path) for path in MEDUSA_TREE]


@pytest.mark.parametrize(
    "tree",
    [[(0,), ()], [(0,), (0,)], [(0, 0), (0,)], [(0,), (-1,)]],
    ids=["empty path", "repeated", "child first", "negative rank"],
)
def test_bad_tree_shapes_are_refused(tree):
    with pytest.raises(ValueError, match=r"tree\[1\]|tree\[0\]"):
        tree_parents(tree)


def test_drafts_are_each_heads_ranked_tokens():
    rng = np.random.default_rng(0)
    hidden, vocab, k = 8, 50, 3
    heads = MedusaHeads(
        tuple(rng.normal(size=(hidden, hidden)).astype(np.float32) for _ in range(k)),
        tuple(rng.normal(size=hidden).astype(np.float32) for _ in range(k)),
    )
    lm_head = rng.normal(size=(vocab, hidden)).astype(np.float32)
    h = rng.normal(size=hidden).astype(np.float32)
    tokens, parents = MedusaProposer(heads, lm_head).propose_tree(h)
    logits = heads.logits(h, lm_head)
    for path, token in zip(MEDUSA_TREE, tokens, strict=True):
        ranked = np.argsort(-logits[len(path) - 1], kind="stable")
        assert token == ranked[path[-1]]
    # siblings are distinct tokens (distinct ranks of one head)
    for node in range(len(tokens) + 1):
        siblings = [t for t, p in zip(tokens, parents, strict=True) if p == node]
        assert len(siblings) == len(set(siblings))
    with pytest.raises(ValueError, match="deeper than the 3 heads"):
        heads.draft_tree(h, lm_head, [(0,), (0, 0), (0, 0, 0), (0, 0, 0, 0)])


def test_zero_heads_are_the_lm_head():
    """A head with W = 0 and b = 0 is the base LM head (the heads' initialisation)."""
    rng = np.random.default_rng(1)
    lm_head = rng.normal(size=(30, 6)).astype(np.float32)
    zero = MedusaHeads((np.zeros((6, 6), np.float32),) * 2, (np.zeros(6, np.float32),) * 2)
    h = rng.normal(size=6).astype(np.float32)
    np.testing.assert_allclose(zero.logits(h, lm_head), np.stack([lm_head @ h] * 2), rtol=1e-6)


def test_the_shipped_heads_fit_the_default_model():
    config = json.loads((DEFAULT_HEADS / "config.json").read_text())
    base = json.loads((DEFAULT_HEADS.parent / "default" / "config.json").read_text())
    heads = MedusaHeads.load()
    assert heads.num_heads == config["num_heads"] == 3
    assert (
        config["hidden_size"] == base["hidden_size"] and config["vocab_size"] == base["vocab_size"]
    )
    for w, b in zip(heads.weights, heads.biases, strict=True):
        assert w.shape == (base["hidden_size"],) * 2 and b.shape == (base["hidden_size"],)
        assert np.all(np.isfinite(w)) and np.any(w != 0)
