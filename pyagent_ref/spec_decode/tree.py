"""Draft trees in the engine: tree shapes, depths, cutting a tree to the room a request
has, and the path verification accepted.

A tree of k drafts is laid out as in `ops.spec_decode`: node 0 is the root (the request's
last known token), node i + 1 is draft i, whose parent is node parents[i], in [0, i]
(parents come first). A chain (parents 0, 1, ..., k - 1) is a linear draft.
"""

from __future__ import annotations

from collections.abc import Sequence


def tree_parents(tree: Sequence[tuple[int, ...]]) -> list[int]:
    """The parent node of each path of a tree shape (node i + 1 is path i). A shape is
    a list of paths of ranks: the path (r_1, ..., r_d) is the node at depth d that holds
    the r_d-th guess after its parent, the path (r_1, ..., r_{d-1}) (the root for d = 1).

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


def node_depths(parents: Sequence[int]) -> list[int]:
    """depths[v] of node v (the root, v = 0, has depth 0; node i + 1 has its parent's + 1)."""
    depths = [0]
    for parent in parents:
        depths.append(depths[parent] + 1)
    return depths


def is_chain(parents: Sequence[int]) -> bool:
    """Whether the tree is a linear draft (draft i's parent is node i)."""
    return all(parent == i for i, parent in enumerate(parents))


def subtree(
    tokens: Sequence[int], parents: Sequence[int], keep: Sequence[bool]
) -> tuple[list[int], list[int]]:
    """The drafts i with keep[i], renumbered (still parents-first).

    Raises ValueError if a kept draft's parent is not kept (the result would not be a
    tree).
    """
    new_index = {0: 0}
    kept_tokens, kept_parents = [], []
    for i, (token, parent, kept) in enumerate(zip(tokens, parents, keep, strict=True)):
        if not kept:
            continue
        if parent not in new_index:
            raise ValueError(f"draft {i} is kept but its parent node {parent} is not")
        kept_parents.append(new_index[parent])
        kept_tokens.append(token)
        new_index[i + 1] = len(kept_tokens)
    return kept_tokens, kept_parents


def cut_tree(
    tokens: Sequence[int], parents: Sequence[int], max_nodes: int, max_depth: int
) -> tuple[list[int], list[int]]:
    """The subtree of the drafts among the first `max_nodes` whose depth is at most
    `max_depth` (a kept node's ancestors are kept, being earlier and shallower). Used to
    fit a tree into the KV slots (one per node) and the output tokens (one per depth) a
    request has left."""
    depths = node_depths(parents)
    keep = [i < max_nodes and depths[i + 1] <= max_depth for i in range(len(tokens))]
    return subtree(tokens, parents, keep)


def accepted_path(
    tokens: Sequence[int], parents: Sequence[int], emitted: Sequence[int]
) -> list[int]:
    """The nodes verification accepted, root first: [0, v_1, ..., v_{m-1}] for m emitted
    tokens, where v_d is the first child of v_{d-1} (in node order) holding emitted[d - 1].
    The tree ops never accept a later copy of a token whose first copy among the siblings
    was rejected, so this descent finds the accepted nodes. Emitted token d was drawn
    from the target row of node path[d].

    Raises ValueError if an emitted draft is no child of the path so far (the emitted
    tokens do not come from this tree).
    """
    children: dict[int, list[int]] = {}
    for i, parent in enumerate(parents):
        children.setdefault(parent, []).append(i + 1)
    path = [0]
    for d, token in enumerate(emitted[:-1]):
        node = next((c for c in children.get(path[-1], ()) if tokens[c - 1] == token), None)
        if node is None:
            raise ValueError(
                f"emitted token {d} ({token}) is no draft under node {path[-1]} of the tree"
            )
        path.append(node)
    return path
