"""Medusa heads: a draft tree from the target model's own last hidden state.

A Medusa head is a small block on top of the target's final hidden state h (after the
final norm) that guesses a token further ahead than the LM head does: the LM head on h
gives the next token y (the request's last sampled token, the tree's root), head j
(j = 1 .. K) guesses the token j places after y:

    head_j(h) = lm_head . (h + SiLU(W_j h + b_j))        logits over the vocabulary

Each head offers several candidates (its most likely tokens); a fixed tree shape says
which combinations become drafts. The shape is a list of paths: the path (r_1, ..., r_d)
is the node at depth d whose token at depth i is head i's r_i-th most likely token (rank
0 = the most likely), its parent the path (r_1, ..., r_{d-1}) (the root for d = 1).
`MEDUSA_TREE`, the default, spends 14 drafts on 3 heads like Medusa's sparse trees: more
candidates where the guesses are surer (the first head, the top ranks)::

    depth 1:  0   1   2   3           head 1's four best tokens
    depth 2:  00  01  02  10  11  20   head 2's best tokens after the three best of head 1
    depth 3:  000 001 010 100          head 3's after the surest depth-2 nodes

The drafts are deterministic (a function of h), so the tree is verified losslessly by
`ops.spec_decode.rejection_sample_tree` (sampling) or `verify_tree_greedy` (greedy),
the target reading the nodes in one forward pass with `ops.spec_decode.tree_attention_mask`.
The heads shipped for the embedded default model are in `pyagent_ref/model/default_medusa`
(made by `tools/train_medusa_heads.py`, with their measured accuracy).
"""

from __future__ import annotations

import functools
import json
import math
import pathlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from .tree import subtree, tree_parents

DEFAULT_HEADS = pathlib.Path(__file__).resolve().parent.parent / "model" / "default_medusa"

MEDUSA_TREE: tuple[tuple[int, ...], ...] = (
    (0,),
    (1,),
    (2,),
    (3,),
    (0, 0),
    (0, 1),
    (0, 2),
    (1, 0),
    (1, 1),
    (2, 0),
    (0, 0, 0),
    (0, 0, 1),
    (0, 1, 0),
    (1, 0, 0),
)
"""The default tree shape: 14 paths of head ranks, parents before children."""


class DraftTree(NamedTuple):
    """A draft tree in the layout of `ops.spec_decode`: draft i holds tokens[i] and its
    parent is node parents[i] (0 = the root, i.e. the last sampled token; j + 1 = draft j)."""

    tokens: list[int]
    parents: list[int]


@dataclass(frozen=True)
class MedusaHeads:
    """K heads: weights[j] (hidden, hidden) and biases[j] (hidden,) of head j + 1."""

    weights: tuple[np.ndarray, ...]
    biases: tuple[np.ndarray, ...]

    @classmethod
    def load(cls, path: str | pathlib.Path = DEFAULT_HEADS) -> MedusaHeads:
        """The heads of a directory with `config.json` and `medusa_heads.safetensors`
        (by default, those of the embedded default model)."""
        from safetensors.numpy import load_file

        path = pathlib.Path(path)
        config = json.loads((path / "config.json").read_text())
        tensors = load_file(str(path / "medusa_heads.safetensors"))
        k = int(config["num_heads"])
        return cls(
            tuple(tensors[f"heads.{j}.weight"].astype(np.float32) for j in range(k)),
            tuple(tensors[f"heads.{j}.bias"].astype(np.float32) for j in range(k)),
        )

    @property
    def num_heads(self) -> int:
        return len(self.weights)

    @functools.cached_property
    def _stacked(self):
        """The heads as torch tensors: weights (K, hidden, hidden), biases (K, hidden)."""
        import torch

        return torch.as_tensor(np.stack(self.weights)), torch.as_tensor(np.stack(self.biases))

    def logits(self, hidden: Any, lm_head: Any, num_heads: int | None = None) -> np.ndarray:
        """Each head's logits, (..., K, vocab): lm_head (vocab, hidden) applied to
        h + SiLU(W_j h + b_j), for final hidden states `hidden` (..., hidden); only the
        first `num_heads` heads (None: all K). Computed in float32 with torch (its thread
        setting applies; numpy's BLAS would take every core for these small products)."""
        import torch

        h = torch.as_tensor(np.asarray(hidden, dtype=np.float32))
        w, b = (x[:num_heads] for x in self._stacked)
        blocks = h.unsqueeze(-2) + torch.nn.functional.silu(
            torch.einsum("koi,...i->...ko", w, h) + b
        )
        return (blocks @ torch.as_tensor(np.asarray(lm_head, dtype=np.float32)).T).numpy()

    def draft_trees(
        self,
        hidden: Any,
        lm_head: Any,
        tree: Sequence[tuple[int, ...]] = MEDUSA_TREE,
        min_path_prob: float = 0.0,
    ) -> list[DraftTree]:
        """The draft tree of `tree`'s shape for each of the hidden states `hidden`
        (batch, hidden): path (r_1, ..., r_d) holds head d's r_d-th most likely token
        (ties: the lowest token id first). With min_path_prob > 0, only the nodes whose
        path probability, the product of the heads' probabilities (softmax of their
        logits) of the path's tokens, is at least min_path_prob are kept: a child's is at
        most its parent's, so what is kept is a tree (maybe empty), renumbered.

        Raises ValueError for a bad shape (`tree_parents`) or a path deeper than the heads.
        """
        parents = tree_parents(tree)
        deepest = max((len(path) for path in tree), default=0)
        if deepest > self.num_heads:
            raise ValueError(
                f"tree has paths of depth {deepest}, deeper than the {self.num_heads} heads"
            )
        # how many of its best tokens each head must rank
        ranks = [1 + max(path[d] for path in tree if len(path) > d) for d in range(deepest)]
        logits = self.logits(hidden, lm_head, deepest)
        trees = []
        for head_logits in logits:
            ranked = [_best(row, r) for row, r in zip(head_logits, ranks, strict=True)]
            tokens = [int(ranked[len(path) - 1][path[-1]]) for path in tree]
            if min_path_prob <= 0:
                trees.append(DraftTree(tokens, parents))
                continue
            logp = head_logits - _logsumexp(head_logits)[:, None]
            path_logp = [
                sum(logp[d, ranked[d][rank]] for d, rank in enumerate(path)) for path in tree
            ]
            keep = [lp >= math.log(min_path_prob) for lp in path_logp]
            trees.append(DraftTree(*subtree(tokens, parents, keep)))
        return trees

    def draft_tree(
        self, hidden: Any, lm_head: Any, tree: Sequence[tuple[int, ...]] = MEDUSA_TREE
    ) -> DraftTree:
        """`draft_trees` for one hidden state (hidden,), every node of the shape kept."""
        return self.draft_trees(np.asarray(hidden)[None], lm_head, tree)[0]


def _best(row: np.ndarray, r: int) -> np.ndarray:
    """The r largest entries' indices, largest first, ties lowest index first (the first r
    of a stable argsort of -row), in time linear in the row for a small r."""
    if r >= len(row):
        return np.argsort(-row, kind="stable")[:r]
    kth = np.partition(row, len(row) - r)[len(row) - r]  # the r-th largest value
    candidates = np.flatnonzero(row >= kth)  # increasing ids, every tie included
    return candidates[np.argsort(-row[candidates], kind="stable")[:r]]


def _logsumexp(x: np.ndarray) -> np.ndarray:
    top = x.max(axis=-1)
    return top + np.log(np.exp(x - top[..., None]).sum(axis=-1))


class MedusaProposer:
    """Draft trees for the requests of a model with Medusa heads.

    propose_trees(hidden) are the trees for requests whose last hidden states (after
    the final norm, at the token that produced the last sampled token) are the rows of
    `hidden`: the paths of `tree` (a shape, `tree_parents`), keeping only the nodes whose
    path probability is at least min_path_prob (`MedusaHeads.draft_trees`). The engine
    keeps those states for it (`needs_hidden_states`); it has no per-request state, so
    finish() does nothing.
    """

    needs_hidden_states = True

    def __init__(
        self,
        heads: MedusaHeads,
        lm_head: Any,
        tree: Sequence[tuple[int, ...]] = MEDUSA_TREE,
        min_path_prob: float = 0.0,
    ):
        tree_parents(tree)  # refuse a bad shape now, not at the first step
        self.heads, self.tree = heads, tuple(tuple(p) for p in tree)
        self.lm_head = np.asarray(lm_head, dtype=np.float32)
        self.min_path_prob = min_path_prob

    @classmethod
    def for_target(cls, config: Any, target: Any) -> MedusaProposer:
        """The proposer of a `SpeculativeConfig` (method "medusa") on the target model:
        the heads of config.model (None: the embedded model's), the target's LM head, the
        paths of config.speculative_token_tree (None: `MEDUSA_TREE`) no deeper than
        config.num_speculative_tokens, and config.medusa_min_path_prob.

        Raises ValueError if the heads' hidden size differs from the target's, the
        directory lacks the heads' files, or speculative_token_tree is deeper than the
        heads.
        """
        path = pathlib.Path(config.model or DEFAULT_HEADS)
        if not (path / "config.json").is_file():
            raise ValueError(f"speculative model {str(path)!r} holds no Medusa heads config.json")
        heads = MedusaHeads.load(path)
        weight = target.embed_tokens.weight if target.lm_head is None else target.lm_head.weight
        vocab, hidden = weight.shape
        if heads.weights[0].shape[0] != hidden:
            raise ValueError(
                f"Medusa heads of hidden size {heads.weights[0].shape[0]} ({path}) do not fit "
                f"the target model's hidden size {hidden}"
            )
        shape = config.speculative_token_tree
        if shape is None:  # the default shape, as deep as the heads go
            shape = [p for p in MEDUSA_TREE if len(p) <= heads.num_heads]
        deepest = max(len(p) for p in shape)
        if deepest > heads.num_heads:
            raise ValueError(
                f"speculative_token_tree has paths of depth {deepest}, deeper than the "
                f"{heads.num_heads} Medusa heads of {path}"
            )
        tree = [p for p in shape if len(p) <= config.num_speculative_tokens]
        return cls(heads, weight.detach().float().cpu().numpy(), tree, config.medusa_min_path_prob)

    def propose_trees(self, hidden: Any) -> list[DraftTree]:
        return self.heads.draft_trees(hidden, self.lm_head, self.tree, self.min_path_prob)

    def finish(self, request_id: str, output_token_ids: Sequence[int]) -> None:
        """Nothing to forget: the trees depend on the hidden state alone."""
