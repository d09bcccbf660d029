"""Speculative-decoding ops: verifying a batch of draft tokens against the target model.

A proposer (n-gram lookup: `propose_ngram`; a draft model, ...) guesses the next k tokens
of a request;
the target model scores the request's last token and the k drafts in one forward pass,
giving k + 1 rows of logits; verification keeps the longest acceptable prefix of the
drafts and then emits one token of its own, so every step emits between 1 and k + 1
tokens. Verified this way, speculation changes the speed, never the output distribution.

Layout (vLLM's flattened one), for a batch of `batch` requests, request b with
k_b = num_draft_tokens[b] drafts, N = sum(k_b), start_b = k_0 + ... + k_{b-1}:

    draft_token_ids  (N,)               request b's drafts are
                                        draft_token_ids[start_b : start_b + k_b]
    draft_probs      (N, vocab) | None  q: row start_b + i is the distribution draft i
                                        was drawn from; None for deterministic drafts
                                        (n-gram), meaning q = one-hot(draft)
    target_logits    (N + batch, vocab) request b's k_b + 1 rows start at row start_b + b:
                                        row i (i < k_b) scores draft i, row k_b the
                                        token after the last draft (the bonus token)
    result           (batch, 1 + max k) int64: request b's emitted tokens, then -1

Randomness: `rejection_sample` uses `sampling.philox_uniform`, keyed by the request's
seed. The token the request emits at output position n = positions[b] + i reads the
stream of position n, num = vocab + 1, so the Philox counters of distinct positions never
overlap:
    u[n, vocab]         decides whether draft i is accepted;
    u[n, 0 : vocab]     draw the token emitted instead (the recovered or the bonus
                        token) by the exponential race of `sampling.sample`.
With no drafts the op therefore emits exactly the token `sampling.sample` draws at that
position. Losslessness needs the drafts to be independent of these uniforms: a draft
model sampling with `sampling.sample` must use another seed than the verification.

Trees (`tree_attention_mask`, `verify_tree_greedy`, `rejection_sample_tree`): a proposer
with several guesses per position (Medusa heads, EAGLE) drafts a token tree. Request b's
tree has k_b + 1 nodes: node 0, the root, is the request's last token (not a draft), and
node i + 1 is draft i, whose parent is node draft_parents[start_b + i], in [0, i] (nodes
in topological order; the siblings of a node are its children in node order). A chain
(draft_parents = 0, 1, ..., k_b - 1) is the linear case above. The layout is the flat
one with target row i scoring node i (the token after the path root -> node i), and

    draft_parents    (N,)               request b's are draft_parents[start_b : start_b + k_b]
    result           (batch, 1 + max depth) int64, depth = the depth of the deepest node

The target model scores all k_b + 1 nodes in one forward pass, node i at position
(position of the root) + depth(i), attending to the context and to node i's ancestors
and itself only (`tree_attention_mask`).
`rejection_sample_tree` at output position n = positions[b] + d (d = the depth of the
node being verified) reads u = philox_uniform(seed, n, vocab + c) for a node with c
children; a prefix of the stream is the same whatever its length, so
    u[vocab + j]        decides whether the node's j-th child is accepted;
    u[0 : vocab]        draw the token emitted instead (as in the linear case).
A chain therefore reads exactly the uniforms `rejection_sample` reads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from array_api_compat import array_namespace, device

from ._arrays import FLOAT_DTYPE_NAMES, check_logits, dtype_name, first_bad_row, row_param
from ._sequences import z_function as _z_function
from .sampling import philox_uniform

__all__ = [
    "verify_greedy",
    "rejection_sample",
    "tree_attention_mask",
    "verify_tree_greedy",
    "rejection_sample_tree",
    "propose_ngram",
]

_NEG_INF = float("-inf")
_INT64_MAX = 2**63 - 1


@dataclass(frozen=True)
class _Grid:
    """The batch on a (batch, width) grid, width = 1 + max k: cell (b, i), i <= k_b, stands
    for request b's target row i (flat row `row`) and, when i < k_b, for its draft i
    (flat draft `slot`, token `draft`). Elsewhere row is 0, slot is N and draft is -1, so
    gathers stay in bounds; `is_row` and `is_draft` mark the real cells."""

    counts: Any  # k, int64 (batch,)
    index: Any  # i, int64 (batch, width)
    is_row: Any
    is_draft: Any
    row: Any
    slot: Any
    draft: Any


def _validated(target_logits: Any, draft_token_ids: Any, num_draft_tokens: Any) -> tuple:
    """Check the flattened layout (module docstring); return (xp, counts, drafts), int64 on
    the logits' device."""
    xp = check_logits(target_logits, "target_logits")
    where, vocab = device(target_logits), target_logits.shape[1]
    arrays = []
    for name, value in (
        ("num_draft_tokens", num_draft_tokens),
        ("draft_token_ids", draft_token_ids),
    ):
        kind = dtype_name(value) if hasattr(value, "dtype") else "int"
        if "int" not in kind:
            raise TypeError(f"{name} must hold integers, got dtype {kind}")
        try:
            arrays.append(xp.asarray(value, dtype=xp.int64, device=where))
        except (TypeError, ValueError, OverflowError, RuntimeError) as exc:
            raise TypeError(f"{name} must be array-like of integers, got {value!r}") from exc
    counts, drafts = arrays
    if counts.ndim != 1:
        raise ValueError(f"num_draft_tokens must have shape (batch,), got {tuple(counts.shape)}")
    bad = first_bad_row(xp, counts < 0)
    if bad is not None:
        raise ValueError(f"num_draft_tokens[{bad}] must be >= 0, got {int(counts[bad])}")
    batch, total = counts.shape[0], int(xp.sum(counts))
    if drafts.ndim != 1 or drafts.shape[0] != total:
        raise ValueError(
            f"draft_token_ids must have shape ({total},) (the sum of num_draft_tokens), "
            f"got shape {tuple(drafts.shape)}"
        )
    if target_logits.shape[0] != total + batch:
        raise ValueError(
            f"target_logits must have {total + batch} rows (one per draft and one per "
            f"request), got shape {tuple(target_logits.shape)}"
        )
    bad = first_bad_row(xp, (drafts < 0) | (drafts >= vocab))
    if bad is not None:
        raise ValueError(f"draft_token_ids[{bad}] must be in [0, {vocab}), got {int(drafts[bad])}")
    return xp, counts, drafts


def _grid(target_logits: Any, draft_token_ids: Any, num_draft_tokens: Any) -> tuple[Any, _Grid]:
    """Validate the flattened layout; return (xp, the batch's grid)."""
    xp, counts, drafts = _validated(target_logits, draft_token_ids, num_draft_tokens)
    where, batch, total = device(counts), counts.shape[0], drafts.shape[0]
    width = 1 + (int(xp.max(counts)) if batch else 0)
    cell = xp.reshape(xp.arange(width, dtype=xp.int64, device=where), (1, width))
    k = xp.reshape(counts, (batch, 1))
    index = cell + xp.zeros_like(k)
    is_row, is_draft = index <= k, index < k
    first = xp.reshape(xp.cumulative_sum(counts) - counts, (batch, 1))
    request = xp.reshape(xp.arange(batch, dtype=xp.int64, device=where), (batch, 1))
    slot = xp.where(is_draft, first + index, total)
    with_pad = xp.concat([drafts, xp.asarray([-1], dtype=xp.int64, device=where)])
    draft = xp.reshape(xp.take(with_pad, xp.reshape(slot, (-1,))), slot.shape)
    row = xp.where(is_row, first + request + index, 0)
    return xp, _Grid(counts, index, is_row, is_draft, row, slot, draft)


def _on_grid(xp: Any, x: Any, index: Any) -> Any:
    """Rows of the 2-D `x` gathered at a grid of row indices: shape (*index.shape, columns)."""
    return xp.reshape(xp.take(x, xp.reshape(index, (-1,)), axis=0), (*index.shape, x.shape[1]))


def _emit(xp: Any, grid: _Grid, accepted: Any, own: Any) -> Any:
    """Each request's leading accepted drafts, then `own` at the first rejected draft (or at
    the bonus cell when none is rejected), then -1. `accepted`, `own`: (batch, width)."""
    rejected = xp.astype(grid.is_draft & ~accepted, xp.int64)
    leading = grid.is_draft & (xp.cumulative_sum(rejected, axis=1) == 0)
    a = xp.reshape(xp.sum(xp.astype(leading, xp.int64), axis=1), (-1, 1))
    last = xp.take_along_axis(own, a, axis=1)
    return xp.where(grid.index < a, grid.draft, xp.where(grid.index == a, last, -1))


def _target_argmax(xp: Any, target_logits: Any, grid: _Grid) -> Any:
    """argmax of each cell's target row (lowest index on ties), (batch, width)."""
    flat = xp.astype(xp.argmax(target_logits, axis=1), xp.int64)
    return xp.reshape(xp.take(flat, xp.reshape(grid.row, (-1,))), grid.row.shape)


def verify_greedy(target_logits: Any, draft_token_ids: Any, num_draft_tokens: Any) -> Any:
    """Greedy verification: accept drafts while they are the target's argmax.

    For request b (layout in the module docstring) let t_i = argmax of its target row i
    (the lowest index on ties) and a = the number of leading drafts with draft_i == t_i
    (0 <= a <= k_b). The request emits draft_0 .. draft_{a-1}, then t_a: the target's
    token at the first mismatch, or its bonus token when a == k_b. These are the next
    a + 1 tokens of greedy decoding with the target model.

    Args:
        target_logits: float32 or float64, shape (N + batch, vocab); -inf entries allowed,
            not a row entirely -inf.
        draft_token_ids: integers, shape (N,), each in [0, vocab).
        num_draft_tokens: integers, shape (batch,), each >= 0, summing to N; read on the
            host (the width of the result depends on it).
    Returns:
        int64, shape (batch, 1 + max(num_draft_tokens)) (1 column for an empty batch), on
        the logits' device: row b holds its a + 1 tokens, then -1.
    Raises:
        TypeError: non-float logits, non-integer draft ids or counts, or an argument that is
            not an array (the counts and ids may also be sequences of ints).
        ValueError: shapes disagree (the message gives the expected and the actual shape),
            a negative count, a draft id outside the vocab, NaN/+inf logits or a row entirely
            -inf (the message names the index and the value).
    """
    xp, grid = _grid(target_logits, draft_token_ids, num_draft_tokens)
    target = _target_argmax(xp, target_logits, grid)
    return _emit(xp, grid, grid.draft == target, target)


def _draft_probs(xp: Any, draft_probs: Any, shape: tuple[int, int], where: Any) -> Any:
    """Validate q; return it as float64 with a zero row appended (the grid's padding slot)."""
    kind = dtype_name(draft_probs) if hasattr(draft_probs, "dtype") else type(draft_probs).__name__
    if kind not in FLOAT_DTYPE_NAMES:
        raise TypeError(f"draft_probs must be None or float32 or float64, got {kind}")
    q = xp.asarray(draft_probs, dtype=xp.float64, device=where)
    if tuple(q.shape) != shape:
        raise ValueError(
            f"draft_probs must have shape {shape} (drafts, vocab), got {tuple(q.shape)}"
        )
    bad = first_bad_row(xp, xp.any(~(xp.isfinite(q) & (q >= 0)), axis=1))
    if bad is not None:
        raise ValueError(f"draft_probs row {bad} must be finite and >= 0, got {q[bad]}")
    return xp.concat([q, xp.zeros((1, shape[1]), dtype=xp.float64, device=where)])


def rejection_sample(
    target_logits: Any,
    draft_token_ids: Any,
    num_draft_tokens: Any,
    draft_probs: Any,
    temperature: Any,
    seeds: Any,
    positions: Any,
) -> Any:
    """Verify drafts so that the emitted tokens are distributed exactly as the target's.

    Layout and uniforms as in the module docstring. Greedy requests (temperature[b] == 0)
    are verified as `verify_greedy` does. For the others, with p_i = softmax(target row i)
    and q_i = draft_probs[start_b + i] (one-hot(draft_i) when draft_probs is None), both in
    float64, and u = philox_uniform(seed, positions[b] + i, vocab + 1)[0] for row i:
      - draft x = draft_i is accepted iff u[vocab] * q_i[x] < p_i[x] (probability
        min(1, p_i[x] / q_i[x]); a draft with q_i[x] == 0 is accepted iff p_i[x] > 0);
      - a = the number of leading accepted drafts; the request emits draft_0 .. draft_{a-1}
        and then one token y drawn by the exponential race over u[0 : vocab]:
        y = argmax_j (log r_j - log(-log u[j])) with the lowest j on ties, where
          r = max(p_a - q_a, 0) if a < k_b (the recovered distribution, unnormalised);
              if r is all zero (p_a <= q_a, only by rounding), r = p_a;
          r = p_{k_b} (the bonus token) if a == k_b;
        log r_j is computed as target_logits[row, j] when r = p (as `sampling.sample`
        does), and -inf where r_j == 0.
    If each draft was drawn from its q, independently of these uniforms, the emitted
    tokens have the distribution of sampling the target rows one after the other. The
    tokens of request b depend only on its own inputs (batch-invariant). A decision where
    u[vocab] * q_i[x] is within 1e-9 (relative) of p_i[x], or a race whose two best scores
    are within 1e-9 (relative), may differ between implementations (softmax rounding).

    Args:
        target_logits: float32 or float64, shape (N + batch, vocab), the final logits
            (after temperature and filters); -inf allowed, not a row entirely -inf.
        draft_token_ids: integers, shape (N,), each in [0, vocab).
        num_draft_tokens: integers, shape (batch,), each >= 0, summing to N (read on the
            host).
        draft_probs: None, or float32/float64 of shape (N, vocab): each row finite, >= 0
            (a probability distribution; its sum is not checked).
        temperature: numbers, shape (batch,), each finite and >= 0 (only 0 or not matters).
        seeds: integers, shape (batch,), see `sampling.philox_uniform`.
        positions: integers, shape (batch,): the output position of request b's first
            emitted token, each >= 0 with positions[b] + num_draft_tokens[b] < 2**63.
    Returns:
        int64, shape (batch, 1 + max(num_draft_tokens)), on the logits' device: row b holds
        its a + 1 emitted tokens, then -1.
    Raises:
        TypeError: as `verify_greedy`, non-float draft_probs, non-numeric temperature,
            non-integer seeds or positions.
        ValueError: as `verify_greedy`, draft_probs of another shape or with a negative or
            non-finite entry, a temperature < 0 or not finite, a negative position or one
            whose last token would overflow (the messages name the index and the value).
    """
    xp, grid = _grid(target_logits, draft_token_ids, num_draft_tokens)
    where, (batch, width), vocab = device(target_logits), grid.index.shape, target_logits.shape[1]
    num_drafts = target_logits.shape[0] - batch
    q = None if draft_probs is None else _draft_probs(xp, draft_probs, (num_drafts, vocab), where)
    like = grid.index[:, 0]
    t = row_param(like, temperature, "temperature", xp.float64)
    bad = first_bad_row(xp, ~(xp.isfinite(t) & (t >= 0)))
    if bad is not None:
        raise ValueError(f"temperature[{bad}] must be finite and >= 0, got {float(t[bad])}")
    seed = row_param(like, seeds, "seeds", xp.int64)
    pos = row_param(like, positions, "positions", xp.int64)
    bad = first_bad_row(xp, (pos < 0) | (pos > _INT64_MAX - grid.counts))
    if bad is not None:
        raise ValueError(
            f"positions[{bad}] must be in [0, 2**63 - 1 - num_draft_tokens[{bad}]], "
            f"got {int(pos[bad])}"
        )

    cell_pos = xp.where(grid.is_row, xp.reshape(pos, (-1, 1)) + grid.index, 0)
    cell_seed = xp.reshape(seed, (-1, 1)) + xp.zeros_like(cell_pos)
    u = philox_uniform(xp.reshape(cell_seed, (-1,)), xp.reshape(cell_pos, (-1,)), vocab + 1)
    u = xp.reshape(u, (batch, width, vocab + 1))
    logits = _on_grid(xp, xp.astype(target_logits, xp.float64), grid.row)
    e = xp.exp(logits - xp.max(logits, axis=2, keepdims=True))
    p = e / xp.sum(e, axis=2, keepdims=True)
    x = xp.reshape(xp.where(grid.is_draft, grid.draft, 0), (batch, width, 1))
    if q is None:
        tokens = xp.reshape(xp.arange(vocab, dtype=xp.int64, device=where), (1, 1, vocab))
        q_cells = xp.astype(tokens == x, xp.float64)
    else:
        q_cells = _on_grid(xp, q, grid.slot)
    px = xp.take_along_axis(p, x, axis=2)[..., 0]
    qx = xp.take_along_axis(q_cells, x, axis=2)[..., 0]
    accepted = u[..., vocab] * qx < px

    r = xp.clip(p - q_cells, min=0.0)
    from_p = ~xp.reshape(grid.is_draft, (batch, width, 1)) | ~xp.any(r > 0, axis=2, keepdims=True)
    log_r = xp.where(r > 0, xp.log(xp.where(r > 0, r, 1.0)), _NEG_INF)
    scores = xp.where(from_p, logits, log_r) - xp.log(-xp.log(u[..., :vocab]))
    own = xp.astype(xp.argmax(scores, axis=2), xp.int64)

    greedy = xp.reshape(t == 0, (batch, 1))
    target = _target_argmax(xp, target_logits, grid)
    accepted = xp.where(greedy, grid.draft == target, accepted)
    return _emit(xp, grid, accepted, xp.where(greedy, target, own))


# --- trees ------------------------------------------------------------------------------------


def _integers(xp: Any, value: Any, name: str, where: Any) -> Any:
    """`value` (an integer array or a sequence of ints) as int64 on `where`: TypeError else."""
    kind = dtype_name(value) if hasattr(value, "dtype") else "int"
    if "int" not in kind:
        raise TypeError(f"{name} must hold integers, got dtype {kind}")
    try:
        return xp.asarray(value, dtype=xp.int64, device=where)
    except (TypeError, ValueError, OverflowError, RuntimeError) as exc:
        raise TypeError(f"{name} must be array-like of integers, got {value!r}") from exc


def _check_parents(parents: list[int], counts: list[int], name: str) -> None:
    """Each tree's parents in topological order: the parent of draft i is a node in [0, i]."""
    flat = 0
    for k in counts:
        for i in range(k):
            if not 0 <= parents[flat] <= i:
                where = f"{name}[{flat}]" + (f" (draft {i} of its request)" if flat != i else "")
                raise ValueError(f"{where} must be in [0, {i}], got {parents[flat]}")
            flat += 1


def tree_attention_mask(draft_parents: Any) -> Any:
    """Which nodes of a draft tree each node attends to: its ancestors and itself.

    For one tree of k drafts (module docstring: node 0 is the root, node i + 1 is draft i,
    whose parent is node draft_parents[i]): mask[i, j] is True iff node j is on the path
    from the root to node i, node i included. Row by row:
        mask[0]     = (True, False, ..., False)
        mask[i + 1] = mask[draft_parents[i]] with column i + 1 set
    So the mask is lower triangular with a True diagonal, siblings (and cousins) never
    see each other, and a chain (draft_parents = 0, 1, ..., k - 1) gives the causal
    triangle. Row i holds depth(i) + 1 True values (the root has depth 0): node i runs at
    position root_position + sum(mask[i]) - 1. In `attention.paged_attention` the mask is
    the last k + 1 rows and columns of the request's custom mask, whose context columns
    are all True.

    Args:
        draft_parents: integers, shape (k,), k >= 0 (an integer array, numpy or torch, or
            a sequence of ints), each draft_parents[i] in [0, i].
    Returns:
        bool, shape (k + 1, k + 1), in the library and on the device of draft_parents
        (numpy for a sequence).
    Raises:
        TypeError: non-integer parents.
        ValueError: parents not of shape (k,), or a parent outside [0, i] (the message
            names the index and the value).
    """
    xp = array_namespace(draft_parents) if hasattr(draft_parents, "dtype") else np
    where = device(draft_parents) if hasattr(draft_parents, "dtype") else "cpu"
    parents = _integers(xp, draft_parents, "draft_parents", where)
    if parents.ndim != 1:
        raise ValueError(f"draft_parents must have shape (k,), got {tuple(parents.shape)}")
    parents = parents.tolist()
    _check_parents(parents, [len(parents)], "draft_parents")
    k = len(parents)
    rows = [[j == 0 for j in range(k + 1)]]
    for i, parent in enumerate(parents):
        rows.append([*rows[parent][: i + 1], True, *[False] * (k - i - 1)])
    return xp.asarray(rows, dtype=xp.bool, device=where)


@dataclass(frozen=True)
class _Tree:
    """One request's draft tree, on the host: node v's target row is first_row + v."""

    first_row: int
    tokens: list[int]  # tokens[v] for node v >= 1 (tokens[0] = -1: the root is no draft)
    parents: list[int]  # parents[v] for node v >= 1 (parents[0] = -1)
    children: list[list[int]]  # children[v]: the nodes whose parent is v, in node order
    depth: int  # of the deepest node


def _trees(
    target_logits: Any, draft_token_ids: Any, num_draft_tokens: Any, draft_parents: Any
) -> tuple[Any, Any, list[_Tree]]:
    """Validate the flattened tree layout (module docstring); return (xp, the counts on
    the logits' device, each request's tree)."""
    xp, counts, drafts = _validated(target_logits, draft_token_ids, num_draft_tokens)
    parents = _integers(xp, draft_parents, "draft_parents", device(target_logits))
    if parents.ndim != 1 or parents.shape[0] != drafts.shape[0]:
        raise ValueError(
            f"draft_parents must have shape ({drafts.shape[0]},) (one per draft), "
            f"got shape {tuple(parents.shape)}"
        )
    ks, tokens, parents = counts.tolist(), drafts.tolist(), parents.tolist()
    _check_parents(parents, ks, "draft_parents")
    trees, start = [], 0
    for b, k in enumerate(ks):
        tree_parents = [-1, *parents[start : start + k]]
        children: list[list[int]] = [[] for _ in range(k + 1)]
        depths = [0] * (k + 1)
        for v in range(1, k + 1):
            children[tree_parents[v]].append(v)
            depths[v] = depths[tree_parents[v]] + 1
        tree_tokens = [-1, *tokens[start : start + k]]
        trees.append(_Tree(start + b, tree_tokens, tree_parents, children, max(depths)))
        start += k
    return xp, counts, trees


def _result(xp: Any, paths: list[list[int]], trees: list[_Tree], where: Any) -> Any:
    """Each request's tokens then -1, int64 (batch, 1 + max depth) on `where`."""
    width = 1 + max((tree.depth for tree in trees), default=0)
    rows = [path + [-1] * (width - len(path)) for path in paths]
    return xp.reshape(xp.asarray(rows, dtype=xp.int64, device=where), (len(paths), width))


def _greedy_path(tree: _Tree, argmax: list[int]) -> list[int]:
    """From the root: emit the target's token t at the node, descend into the first child
    holding t; stop at a node without one."""
    path, node = [], 0
    while node is not None:
        t = argmax[tree.first_row + node]
        path.append(t)
        node = next((c for c in tree.children[node] if tree.tokens[c] == t), None)
    return path


def verify_tree_greedy(
    target_logits: Any, draft_token_ids: Any, num_draft_tokens: Any, draft_parents: Any
) -> Any:
    """Greedy verification of a draft tree: the longest path of the target's argmax.

    For request b (tree layout in the module docstring) let t_v = argmax of node v's
    target row (the lowest index on ties). Starting at the root, at node v the request
    emits t_v and moves to the first child of v (in node order) whose token is t_v; it
    stops at a node with no such child. The emitted tokens are the path's drafts, then the
    target's token after them (a correction, or the bonus token at a leaf): the next
    depth + 1 tokens of greedy decoding with the target. A chain tree emits what
    `verify_greedy` emits. The accepted nodes are recovered from the tokens by the same
    descent (the first child holding the next token).

    Args:
        target_logits: float32 or float64, shape (N + batch, vocab); -inf entries allowed,
            not a row entirely -inf.
        draft_token_ids: integers, shape (N,), each in [0, vocab).
        num_draft_tokens: integers, shape (batch,), each >= 0, summing to N.
        draft_parents: integers, shape (N,): draft i of request b has parent node
            draft_parents[start_b + i], in [0, i] (0 = the root).
    Returns:
        int64, shape (batch, 1 + the largest depth of a tree) (1 column for an empty
        batch or drafts-free trees), on the logits' device: row b holds its tokens, then -1.
    Raises:
        TypeError: as `verify_greedy`, non-integer parents.
        ValueError: as `verify_greedy`, parents of another shape or a parent outside
            [0, i] (the message names the index and the value).
    """
    xp, _, trees = _trees(target_logits, draft_token_ids, num_draft_tokens, draft_parents)
    argmax = xp.argmax(target_logits, axis=1).tolist()
    paths = [_greedy_path(tree, argmax) for tree in trees]
    return _result(xp, paths, trees, device(target_logits))


def _sampled_path(
    tree: _Tree, p_at_parent: list[float], u_tries: list[list[float]]
) -> tuple[list[int], int, list[int]]:
    """The walk of `rejection_sample_tree` for one request: (accepted tokens, the node it
    stops at, the tokens rejected there). p_at_parent[v] = p(token of v) under its
    parent's row; u_tries[d][j] decides the j-th child tried at depth d."""
    accepted, node = [], 0
    while True:
        mass, rejected, chosen = 1.0, [], None
        for j, child in enumerate(tree.children[node]):
            x = tree.tokens[child]
            r_x = 0.0 if x in rejected else p_at_parent[child]
            if u_tries[len(accepted)][j] * max(mass, 0.0) < r_x:
                chosen = child
                break
            mass -= r_x
            rejected.append(x)
        if chosen is None:
            return accepted, node, rejected
        accepted.append(tree.tokens[chosen])
        node = chosen


def rejection_sample_tree(
    target_logits: Any,
    draft_token_ids: Any,
    num_draft_tokens: Any,
    draft_parents: Any,
    temperature: Any,
    seeds: Any,
    positions: Any,
) -> Any:
    """Verify a tree of deterministic drafts so that the emitted tokens are distributed
    exactly as the target's (multi-candidate recursive rejection, SpecInfer's).

    Tree layout and uniforms as in the module docstring. Greedy requests (temperature[b]
    == 0) are verified as `verify_tree_greedy` does. For the others, starting at the root
    at depth d = 0, at node v with p = softmax(target row v) in float64 and u =
    philox_uniform(seed, positions[b] + d, vocab + c)[0] (c = v's number of children):
      - r = p and m = 1; the children x_0, x_1, ... (their tokens, in node order) are
        tried in turn: child j is accepted iff u[vocab + j] * max(m, 0) < r[x_j]
        (probability r[x_j] / m); if rejected, m <- m - r[x_j] and r[x_j] <- 0 (r is p
        with the rejected tokens zeroed, m its mass; a token repeated among siblings is
        rejected the second time);
      - on acceptance the request emits x_j and continues at that child, at depth d + 1;
      - otherwise (all children rejected, or none) it emits one token y by the
        exponential race over u[0 : vocab], y = argmax_j (log w_j - log(-log u[j])) with
        the lowest j on ties, where w = r if a child was rejected and r is not all zero,
        else w = p (log w computed as the target logits, as `sampling.sample` does), and
        stops. log w_j = -inf where w_j == 0.
    A chain tree emits what `rejection_sample` emits with draft_probs=None.

    Why it is lossless (the drafts fixed in advance, independent of the uniforms): at a
    node, the walk reaches child j having rejected the tokens R (mass p(R)) with
    probability m = 1 - p(R), and accepts x_j there with probability p(x_j) / m, so
    P(emit x_j) = p(x_j) for every distinct child token; it reaches the race with
    probability 1 - p(all children) and the race draws y outside them with probability
    p(y) / (1 - p(all children)): every token is emitted with probability p(y). After
    emitting y at an accepted child the walk continues with that child's row, the target's
    distribution given y; after the race it stops. Each depth reads its own position's
    stream and each try its own entry, so the decisions are independent and the emitted
    tokens are those of sampling the target token after token.

    The tokens of request b depend only on its own inputs (batch-invariant). A decision
    where u[vocab + j] * m is within 1e-9 (relative) of r[x_j], or a race whose two best
    scores are within 1e-9 (relative), may differ between implementations.

    Args:
        target_logits: float32 or float64, shape (N + batch, vocab), the final logits
            (after the request's processors, temperature and filters); -inf allowed, not a
            row entirely -inf.
        draft_token_ids: integers, shape (N,), each in [0, vocab).
        num_draft_tokens: integers, shape (batch,), each >= 0, summing to N.
        draft_parents: integers, shape (N,), as in `verify_tree_greedy`.
        temperature: numbers, shape (batch,), each finite and >= 0 (only 0 or not matters).
        seeds: integers, shape (batch,), see `sampling.philox_uniform`.
        positions: integers, shape (batch,): the output position of the token emitted at
            the root, each >= 0 with positions[b] + num_draft_tokens[b] < 2**63.
    Returns:
        int64, shape (batch, 1 + the largest depth of a tree), on the logits' device: row
        b holds its tokens (the accepted path's drafts and one token), then -1.
    Raises:
        TypeError: as `verify_tree_greedy`, non-numeric temperature, non-integer seeds or
            positions.
        ValueError: as `verify_tree_greedy`, a temperature < 0 or not finite, a negative
            position or one whose last token would overflow (the messages name the index
            and the value).
    """
    xp, counts, trees = _trees(target_logits, draft_token_ids, num_draft_tokens, draft_parents)
    where, vocab = device(target_logits), target_logits.shape[1]
    t = row_param(counts, temperature, "temperature", xp.float64)
    bad = first_bad_row(xp, ~(xp.isfinite(t) & (t >= 0)))
    if bad is not None:
        raise ValueError(f"temperature[{bad}] must be finite and >= 0, got {float(t[bad])}")
    seed = row_param(counts, seeds, "seeds", xp.int64)
    pos = row_param(counts, positions, "positions", xp.int64)
    bad = first_bad_row(xp, (pos < 0) | (pos > _INT64_MAX - counts))
    if bad is not None:
        raise ValueError(
            f"positions[{bad}] must be in [0, 2**63 - 1 - num_draft_tokens[{bad}]], "
            f"got {int(pos[bad])}"
        )
    batch = len(trees)
    if batch == 0:
        return _result(xp, [], trees, where)

    logits = xp.astype(target_logits, xp.float64)
    e = xp.exp(logits - xp.max(logits, axis=1, keepdims=True))
    p = e / xp.sum(e, axis=1, keepdims=True)
    # p(token of v) under its parent's row, for every node (the root: a dummy read)
    rows = [tree.first_row + max(v, 0) for tree in trees for v in tree.parents]
    cols = [max(x, 0) for tree in trees for x in tree.tokens]
    at = xp.asarray(rows, dtype=xp.int64, device=where) * vocab + xp.asarray(
        cols, dtype=xp.int64, device=where
    )
    p_at_parent = xp.take(xp.reshape(p, (-1,)), at).tolist()

    # the uniforms of every (request, depth): positions[b] + d, vocab + (most children) each
    width = 1 + max(tree.depth for tree in trees)
    tries = max(len(c) for tree in trees for c in tree.children)
    depth = xp.reshape(xp.arange(width, dtype=xp.int64, device=where), (1, width))
    cell_pos = xp.where(
        depth <= xp.reshape(xp.asarray([tr.depth for tr in trees], device=where), (-1, 1)),
        xp.reshape(pos, (-1, 1)) + depth,
        0,
    )
    cell_seed = xp.reshape(seed, (-1, 1)) + xp.zeros_like(cell_pos)
    u = philox_uniform(xp.reshape(cell_seed, (-1,)), xp.reshape(cell_pos, (-1,)), vocab + tries)
    u_tries = xp.reshape(u[:, vocab:], (batch, width, tries)).tolist()

    greedy = (t == 0).tolist()
    argmax = xp.argmax(target_logits, axis=1).tolist()
    paths, ends, rejected_at_end, first = [], [], [], 0
    for b, tree in enumerate(trees):
        if greedy[b]:
            paths.append(_greedy_path(tree, argmax))
            ends.append((tree.first_row, 0))
            rejected_at_end.append([])
        else:
            k = len(tree.tokens)
            accepted, node, rejected = _sampled_path(
                tree, p_at_parent[first : first + k], u_tries[b]
            )
            paths.append(accepted)
            ends.append((tree.first_row + node, len(accepted)))
            rejected_at_end.append(rejected)
        first += len(tree.tokens)

    # the race at each request's last node: over r (p with the rejected tokens zeroed) or p
    end_rows = xp.asarray([row for row, _ in ends], dtype=xp.int64, device=where)
    end_cells = xp.asarray(
        [b * width + d for b, (_, d) in enumerate(ends)], dtype=xp.int64, device=where
    )
    most = max(1, max(len(tokens) for tokens in rejected_at_end))
    padded = [tokens + [-1] * (most - len(tokens)) for tokens in rejected_at_end]
    rejected = xp.reshape(xp.asarray(padded, dtype=xp.int64, device=where), (batch, most, 1))
    vocab_ids = xp.reshape(xp.arange(vocab, dtype=xp.int64, device=where), (1, 1, vocab))
    gone = xp.any(rejected == vocab_ids, axis=1)
    r = xp.where(gone, 0.0, xp.take(p, end_rows, axis=0))
    has_rejected = xp.reshape(xp.asarray([bool(x) for x in rejected_at_end], device=where), (-1, 1))
    from_p = ~has_rejected | ~xp.any(r > 0, axis=1, keepdims=True)
    log_r = xp.where(r > 0, xp.log(xp.where(r > 0, r, 1.0)), _NEG_INF)
    scores = xp.where(from_p, xp.take(logits, end_rows, axis=0), log_r)
    scores = scores - xp.log(-xp.log(xp.take(u, end_cells, axis=0)[:, :vocab]))
    own = xp.argmax(scores, axis=1).tolist()
    paths = [path if greedy[b] else [*path, own[b]] for b, path in enumerate(paths)]
    return _result(xp, paths, trees, where)


# --- proposing: prompt lookup -----------------------------------------------------------------


def _lookup_settings(num_speculative_tokens: Any, lookup_min: Any, lookup_max: Any) -> None:
    """The checks of `propose_ngram`'s three settings, in argument order."""
    settings = {
        "num_speculative_tokens": num_speculative_tokens,
        "prompt_lookup_min": lookup_min,
        "prompt_lookup_max": lookup_max,
    }
    for name, value in settings.items():
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an int, got {value!r}")
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    if lookup_min > lookup_max:
        raise ValueError(
            f"prompt_lookup_min must be <= prompt_lookup_max, got "
            f"prompt_lookup_min={lookup_min}, prompt_lookup_max={lookup_max}"
        )


def _token_list(token_ids: Any) -> list[int]:
    """token_ids (a sequence of ints or a 1-D integer array) as a list of ints."""
    if hasattr(token_ids, "dtype"):
        kind = dtype_name(token_ids)
        if "int" not in kind or token_ids.ndim != 1:
            raise TypeError(
                f"token_ids must be a 1-D integer array or a sequence of ints, got dtype "
                f"{kind} and shape {tuple(token_ids.shape)}"
            )
        return [int(t) for t in token_ids.tolist()]
    tokens = list(token_ids)
    for i, t in enumerate(tokens):
        if isinstance(t, bool) or not isinstance(t, int):
            raise TypeError(f"token_ids[{i}] must be an int, got {t!r}")
    return tokens


def propose_ngram(
    token_ids: Any, num_speculative_tokens: int, prompt_lookup_min: int, prompt_lookup_max: int
) -> list[int]:
    """Prompt lookup: the tokens that followed the latest earlier occurrence of the longest
    matching suffix of the sequence.

    With s = token_ids (prompt + output so far, n tokens): an n-gram of length L matches
    at j if s[j : j + L] == s[n - L : n] and j + L < n (an earlier occurrence, followed
    by at least one token; it may overlap the suffix). The proposal uses the largest L in
    [prompt_lookup_min, prompt_lookup_max] that matches anywhere and, among its matches,
    the most recent one (the largest j); it is s[j + L : j + L + num_speculative_tokens],
    so between 1 and num_speculative_tokens tokens (fewer when the match is close to the
    end). No match (or n <= prompt_lookup_min) proposes nothing: [].

    Linear time in n: on the reversed sequence r, a match of length >= L ending at
    e = j + L - 1 in s is a common prefix of r and r[n - 1 - e:], which the Z-function of
    r measures for every e at once.

    Args:
        token_ids: a sequence of ints or a 1-D integer array (numpy, torch).
        num_speculative_tokens: the most tokens proposed, an int >= 1.
        prompt_lookup_min: the shortest suffix searched for, an int >= 1.
        prompt_lookup_max: the longest, an int >= prompt_lookup_min.
    Returns:
        a list of 0 to num_speculative_tokens ints.
    Raises:
        TypeError: a setting that is not an int, token ids that are not integers.
        ValueError: a setting < 1, or prompt_lookup_min > prompt_lookup_max (the message
            names the settings and their values).
    """
    _lookup_settings(num_speculative_tokens, prompt_lookup_min, prompt_lookup_max)
    s = _token_list(token_ids)
    n = len(s)
    z = _z_function(s[::-1])
    best_length, best_end = 0, -1
    for i in range(1, n):  # i = n - 1 - e: e runs from the newest end position down
        length = min(z[i], prompt_lookup_max)
        if length >= prompt_lookup_min and length > best_length:
            best_length, best_end = length, n - 1 - i
    if best_end < 0:
        return []
    return s[best_end + 1 : best_end + 1 + num_speculative_tokens]
