"""Speculative decoding in Rust: a drop-in replacement for `pyagent_ref.ops.spec_decode`.

Same functions, signatures and exceptions (classes, messages, check order) as the
reference, whose docstrings are the contract (the flattened layout and the uniforms are
in its module docstring). Inputs are numpy arrays or torch CPU tensors (torch is
optional and never imported here); the draft ids, counts and per-request parameters may
also be sequences, converted as the reference converts them. The result, int64
(batch, 1 + max k), comes back in the target logits' library. One native call verifies
the whole batch, requests in parallel for large batches, with the GIL released.

The tree ops (`verify_tree_greedy`, `rejection_sample_tree`) walk each request's tree in
the same native call, from the root down the accepted path; `tree_attention_mask` builds
the (k + 1, k + 1) mask row by row from the parents' rows.

`propose_ngram` (prompt lookup) runs the reference's linear-time scan, a Z-function over
the reversed tokens, in one native call that stops at the first match of length
prompt_lookup_max; the GIL is released for sequences of more than 4096 tokens. The
tokens are read where they are (an int64 array) or converted once (any other integer
dtype; a list's items are checked and read in Rust). The proposal is sliced from the
input, so its ints are the reference's, whatever their size.

Exactness: `verify_greedy`, greedy requests and the bonus token (the race over the
logits, as `sampling.sample` draws it) are the reference's tokens exactly. The
acceptance test u * q(x) < p(x) and the race over max(p - q, 0) use p = softmax in
float64 with an exp accurate to 1 ulp (numpy, torch and libm differ in the last bit
too), so only decisions within the contract's 1e-9 relative band may differ.

Differences from the reference:

- Only numpy arrays and torch CPU tensors: a tensor on another device raises TypeError
  (it is never copied silently), as does another array library.
- `target_logits` and `draft_probs` are read in place, in any layout; a row that is not
  contiguous (every other column, column-major) is copied, one row at a time.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import _native
from . import _common as _c

__all__ = [
    "verify_greedy",
    "rejection_sample",
    "tree_attention_mask",
    "verify_tree_greedy",
    "rejection_sample_tree",
    "propose_ngram",
]

_LOGITS = "target_logits"
_SETTING_CAP = 2**63 - 1  # a setting this large acts as an unbounded one


def verify_greedy(target_logits: Any, draft_token_ids: Any, num_draft_tokens: Any) -> Any:
    """Greedy verification: accept drafts while they are the target's argmax.

    Contract: `pyagent_ref.ops.spec_decode.verify_greedy`.
    """
    x, torch_in = _c.logits_array(target_logits, _LOGITS, any_layout=True)
    try:
        counts, drafts = _c.draft_layout(x, draft_token_ids, num_draft_tokens, torch_in)
    except Exception:
        _c.check_logits(x, _LOGITS)  # the reference checks the rows first
        raise
    return _c.wrap(_native.verify_greedy(x, drafts, counts), torch_in)


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

    Contract: `pyagent_ref.ops.spec_decode.rejection_sample`.
    """
    x, torch_in = _c.logits_array(target_logits, _LOGITS, any_layout=True)
    try:
        counts, drafts = _c.draft_layout(x, draft_token_ids, num_draft_tokens, torch_in)
        q = _c.draft_probs_array(draft_probs, x, counts.shape[0], torch_in)
        t, seed, pos = _c.request_scalars(counts, temperature, seeds, positions, torch_in)
    except Exception:
        _c.check_logits(x, _LOGITS)  # the reference checks the rows first
        raise
    return _c.wrap(_native.rejection_sample(x, drafts, counts, q, t, seed, pos), torch_in)


def _draft_parents(draft_parents: Any, counts: np.ndarray, torch_in: bool) -> np.ndarray:
    """draft_parents as int64 (N,), checked as the reference checks it: draft i of each
    request has a parent node in [0, i]."""
    parents = _c.int_vector(draft_parents, "draft_parents", torch_in)
    total = int(counts.sum())
    if parents.ndim != 1 or parents.shape[0] != total:
        raise ValueError(
            f"draft_parents must have shape ({total},) (one per draft), "
            f"got shape {tuple(parents.shape)}"
        )
    starts = np.cumsum(counts) - counts
    index = np.arange(total, dtype=np.int64) - np.repeat(starts, counts)
    bad = np.flatnonzero((parents < 0) | (parents > index))
    if bad.size:
        flat, i = int(bad[0]), int(index[bad[0]])
        where = f"draft_parents[{flat}]" + (f" (draft {i} of its request)" if flat != i else "")
        raise ValueError(f"{where} must be in [0, {i}], got {int(parents[flat])}")
    return parents


def tree_attention_mask(draft_parents: Any) -> Any:
    """Which nodes of a draft tree each node attends to: its ancestors and itself.

    Contract: `pyagent_ref.ops.spec_decode.tree_attention_mask`.
    """
    torch_in = _c.is_torch(draft_parents)
    parents = _c.int_vector(draft_parents, "draft_parents", torch_in)
    if parents.ndim != 1:
        raise ValueError(f"draft_parents must have shape (k,), got {tuple(parents.shape)}")
    return _c.wrap(_native.tree_attention_mask(parents), torch_in)


def verify_tree_greedy(
    target_logits: Any, draft_token_ids: Any, num_draft_tokens: Any, draft_parents: Any
) -> Any:
    """Greedy verification of a draft tree: the longest path of the target's argmax.

    Contract: `pyagent_ref.ops.spec_decode.verify_tree_greedy`.
    """
    x, torch_in = _c.logits_array(target_logits, _LOGITS, any_layout=True)
    try:
        counts, drafts = _c.draft_layout(x, draft_token_ids, num_draft_tokens, torch_in)
        parents = _draft_parents(draft_parents, counts, torch_in)
    except Exception:
        _c.check_logits(x, _LOGITS)  # the reference checks the rows first
        raise
    return _c.wrap(_native.verify_tree_greedy(x, drafts, counts, parents), torch_in)


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

    Contract: `pyagent_ref.ops.spec_decode.rejection_sample_tree`.
    """
    x, torch_in = _c.logits_array(target_logits, _LOGITS, any_layout=True)
    try:
        counts, drafts = _c.draft_layout(x, draft_token_ids, num_draft_tokens, torch_in)
        parents = _draft_parents(draft_parents, counts, torch_in)
        t, seed, pos = _c.request_scalars(counts, temperature, seeds, positions, torch_in)
    except Exception:
        _c.check_logits(x, _LOGITS)  # the reference checks the rows first
        raise
    out = _native.rejection_sample_tree(x, drafts, counts, parents, t, seed, pos)
    return _c.wrap(out, torch_in)


def _check_settings(num_speculative_tokens: Any, lookup_min: Any, lookup_max: Any) -> None:
    """The reference's checks of `propose_ngram`'s settings, in argument order."""
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


def _token_array(token_ids: Any) -> tuple[np.ndarray, np.ndarray]:
    """An integer array of token ids, checked as the reference checks it: (the int64
    codes Rust reads, the ids as a numpy array to slice the proposal from). uint64 ids
    are read as their int64 bits, which are equal exactly when the ids are."""
    kind = _c.dtype_name(token_ids)
    if "int" not in kind or token_ids.ndim != 1:
        raise TypeError(
            f"token_ids must be a 1-D integer array or a sequence of ints, got dtype "
            f"{kind} and shape {tuple(token_ids.shape)}"
        )
    if _c.is_torch(token_ids):
        _c.check_cpu(token_ids, "token_ids")
        ids = _c.tensor_to_numpy(token_ids)
    elif isinstance(token_ids, np.ndarray):
        ids = token_ids
    else:
        raise TypeError(
            f"token_ids must be a numpy array, a torch tensor or a sequence of ints, got "
            f"{type(token_ids).__name__}"
        )
    codes = ids.view(np.int64) if ids.dtype == np.uint64 else ids.astype(np.int64, copy=False)
    return _c.native_array(codes), ids


def propose_ngram(
    token_ids: Any, num_speculative_tokens: int, prompt_lookup_min: int, prompt_lookup_max: int
) -> list[int]:
    """Prompt lookup: the tokens that followed the latest earlier occurrence of the longest
    matching suffix of the sequence.

    Contract: `pyagent_ref.ops.spec_decode.propose_ngram`.
    """
    settings = (num_speculative_tokens, prompt_lookup_min, prompt_lookup_max)
    _check_settings(*settings)
    capped = tuple(min(value, _SETTING_CAP) for value in settings)  # results do not change
    if hasattr(token_ids, "dtype"):
        codes, ids = _token_array(token_ids)
        start, stop = _native.ngram_proposal(codes, *capped)
        return ids[start:stop].tolist()
    tokens = token_ids if type(token_ids) is list else list(token_ids)
    start, stop = _native.ngram_proposal(tokens, *capped)
    return tokens[start:stop]
