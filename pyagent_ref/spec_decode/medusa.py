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

import json
import pathlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

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


def tree_parents(tree: Sequence[tuple[int, ...]]) -> list[int]:
    """The parent node of each path of a tree shape (node i + 1 is path i).

    Raises ValueError for an empty path, a negative rank, a repeated path, or a path whose
    parent path does not come before it.
    """
    node_of: dict[tuple[int, ...], int] = {(): 0}
    parents = []
    for i, path in enumerate(tree):
        path = tuple(path)
        if not path or min(path) < 0:
            raise ValueError(f"tree[{i}] must be a non-empty path of ranks >= 0, got {path}")
        if path in node_of:
            raise ValueError(f"tree[{i}] repeats the path {path}")
        if path[:-1] not in node_of:
            raise ValueError(f"tree[{i}] = {path} comes before its parent path {path[:-1]}")
        parents.append(node_of[path[:-1]])
        node_of[path] = i + 1
    return parents


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

    def logits(self, hidden: Any, lm_head: Any) -> np.ndarray:
        """Each head's logits, (K, vocab): lm_head (vocab, hidden) applied to
        h + SiLU(W_j h + b_j), for the final hidden state `hidden` (hidden,). Computed
        in float32 with torch (its thread setting applies; numpy's BLAS would take every
        core for these small products)."""
        import torch

        h = torch.as_tensor(np.asarray(hidden, dtype=np.float32))
        w = torch.as_tensor(np.stack(self.weights))  # (K, hidden, hidden)
        b = torch.as_tensor(np.stack(self.biases))
        blocks = h + torch.nn.functional.silu(w @ h + b)
        return (blocks @ torch.as_tensor(np.asarray(lm_head, dtype=np.float32)).T).numpy()

    def draft_tree(
        self, hidden: Any, lm_head: Any, tree: Sequence[tuple[int, ...]] = MEDUSA_TREE
    ) -> DraftTree:
        """The draft tree of `tree`'s shape for this hidden state: path (r_1, ..., r_d)
        holds head d's r_d-th most likely token (ties: the lowest token id first).

        Raises ValueError for a bad shape (`tree_parents`) or a path deeper than the heads.
        """
        parents = tree_parents(tree)
        deepest = max((len(path) for path in tree), default=0)
        if deepest > self.num_heads:
            raise ValueError(
                f"tree has paths of depth {deepest}, deeper than the {self.num_heads} heads"
            )
        logits = self.logits(hidden, lm_head)
        ranked = np.argsort(-logits, axis=1, kind="stable")
        tokens = [int(ranked[len(path) - 1, path[-1]]) for path in tree]
        return DraftTree(tokens, parents)


class MedusaProposer:
    """Draft trees for the requests of a model with Medusa heads.

    propose_tree(hidden) is the tree for a request whose last hidden state (after the
    final norm, at the token that produced the last sampled token) is `hidden`. The
    engine keeps those states for it (`needs_hidden_states`); it has no per-request
    state, so finish() does nothing.
    """

    needs_hidden_states = True

    def __init__(
        self,
        heads: MedusaHeads,
        lm_head: Any,
        tree: Sequence[tuple[int, ...]] = MEDUSA_TREE,
    ):
        tree_parents(tree)  # refuse a bad shape now, not at the first step
        self.heads, self.tree = heads, tuple(tuple(p) for p in tree)
        self.lm_head = np.asarray(lm_head, dtype=np.float32)

    @classmethod
    def for_target(cls, config: Any, target: Any) -> MedusaProposer:
        """The proposer of a `SpeculativeConfig` (method "medusa") on the target model:
        the heads of config.model (None: the embedded model's), the target's LM head, and
        the paths of `MEDUSA_TREE` no deeper than config.num_speculative_tokens.

        Raises ValueError if the heads' hidden size or vocabulary differ from the
        target's, or the directory lacks the heads' files.
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
        tree = [
            p for p in MEDUSA_TREE if len(p) <= min(config.num_speculative_tokens, heads.num_heads)
        ]
        return cls(heads, weight.detach().float().cpu().numpy(), tree)

    def propose_tree(self, hidden: Any) -> DraftTree:
        return self.heads.draft_tree(hidden, self.lm_head, self.tree)

    def finish(self, request_id: str, output_token_ids: Sequence[int]) -> None:
        """Nothing to forget: the trees depend on the hidden state alone."""
