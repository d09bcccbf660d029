"""Medusa heads: the tree shape, the drafts of given heads, and the shipped heads."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pyagent_ref.ops import spec_decode
from pyagent_ref.spec_decode import SpeculativeConfig
from pyagent_ref.spec_decode.medusa import DEFAULT_HEADS, MEDUSA_TREE, MedusaHeads, MedusaProposer
from pyagent_ref.spec_decode.tree import node_depths, tree_parents


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


def random_heads(seed=0, hidden=8, vocab=50, k=3):
    rng = np.random.default_rng(seed)
    heads = MedusaHeads(
        tuple(rng.normal(size=(hidden, hidden)).astype(np.float32) for _ in range(k)),
        tuple(rng.normal(size=hidden).astype(np.float32) for _ in range(k)),
    )
    lm_head = rng.normal(size=(vocab, hidden)).astype(np.float32)
    return heads, lm_head, rng


def test_drafts_are_each_heads_ranked_tokens():
    heads, lm_head, rng = random_heads()
    h = rng.normal(size=8).astype(np.float32)
    [(tokens, parents)] = MedusaProposer(heads, lm_head).propose_trees(h[None])
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


def test_ties_rank_the_lowest_token_first():
    """Logits with ties everywhere: head ranks follow a stable descending sort."""
    heads = MedusaHeads((np.zeros((2, 2), np.float32),), (np.zeros(2, np.float32),))
    lm_head = np.array([[0, 0], [1, 0], [1, 0], [0, 0], [1, 0], [2, 0]], np.float32)
    tree = [(0,), (1,), (2,), (3,), (4,), (5,)]
    tokens, _ = heads.draft_tree(np.array([1.0, 0.0], np.float32), lm_head, tree)
    assert tokens == [5, 1, 2, 4, 0, 3]


def test_a_batch_of_states_gives_each_its_own_tree():
    heads, lm_head, rng = random_heads(1)
    states = rng.normal(size=(4, 8)).astype(np.float32)
    batched = heads.draft_trees(states, lm_head)
    assert batched == [heads.draft_tree(h, lm_head) for h in states]


@pytest.mark.parametrize("min_path_prob", [0.0, 0.01, 0.05, 0.2, 0.5, 0.99])
def test_min_path_prob_keeps_the_likely_nodes_as_a_tree(min_path_prob):
    """A kept node's path probability (the product of its heads' softmax probabilities
    of the path's tokens) is >= min_path_prob, a dropped one's below it; what is kept is
    the full tree's nodes in order, parents renumbered."""
    heads, lm_head, rng = random_heads(2, vocab=12)
    h = rng.normal(size=8).astype(np.float32)
    full_tokens, full_parents = heads.draft_tree(h, lm_head)
    [(tokens, parents)] = heads.draft_trees(h[None], lm_head, min_path_prob=min_path_prob)
    logits = heads.logits(h, lm_head).astype(np.float64)
    probs = np.exp(logits - logits.max(axis=1, keepdims=True))
    probs /= probs.sum(axis=1, keepdims=True)
    chosen = []  # per node of the full tree: its path probability
    for path in MEDUSA_TREE:
        node = MEDUSA_TREE.index(path)
        ancestors = [MEDUSA_TREE.index(path[:d]) for d in range(1, len(path) + 1)]
        assert ancestors[-1] == node
        chosen.append(np.prod([probs[d, full_tokens[a]] for d, a in enumerate(ancestors)]))
    # (no path probability lies within float32 rounding of these thresholds)
    keep = [p >= min_path_prob for p in chosen]
    assert tokens == [t for t, k in zip(full_tokens, keep, strict=True) if k]
    assert all(0 <= p <= i for i, p in enumerate(parents))
    depths = node_depths(full_parents)
    assert node_depths(parents)[1:] == [depths[i + 1] for i in range(14) if keep[i]]
    if min_path_prob == 0:
        assert (tokens, parents) == (full_tokens, full_parents)


def test_the_tree_shape_and_threshold_come_from_the_config(tmp_path):
    """speculative_token_tree (vLLM's str form too) and medusa_min_path_prob reach the
    proposer; a tree deeper than the heads is refused by name."""
    import torch

    from tests.worker.helpers import tiny_model

    from .drafts import save_medusa_heads

    model = tiny_model()
    path = save_medusa_heads(model, tmp_path, num_heads=2)
    config = SpeculativeConfig(
        "medusa",
        2,
        model=path,
        speculative_token_tree="[(0,), (1,), (0, 0)]",
        medusa_min_path_prob=0.25,
    )
    proposer = MedusaProposer.for_target(config, model)
    assert proposer.tree == ((0,), (1,), (0, 0)) and proposer.min_path_prob == 0.25
    assert MedusaProposer.for_target(SpeculativeConfig("medusa", 1, model=path), model).tree == (
        (0,),
        (1,),
        (2,),
        (3,),
    )
    with (
        torch.no_grad(),
        pytest.raises(ValueError, match=r"speculative_token_tree has paths of depth 3"),
    ):
        MedusaProposer.for_target(
            SpeculativeConfig(
                "medusa", model=path, speculative_token_tree=[(0,), (0, 0), (0, 0, 0)]
            ),
            model,
        )


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
