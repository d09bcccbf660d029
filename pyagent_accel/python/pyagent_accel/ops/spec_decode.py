"""Verifying draft tokens in Rust: a drop-in replacement for `pyagent_ref.ops.spec_decode`.

Same functions, signatures and exceptions (classes, messages, check order) as the
reference, whose docstrings are the contract (the flattened layout and the uniforms are
in its module docstring). Inputs are numpy arrays or torch CPU tensors (torch is
optional and never imported here); the draft ids, counts and per-request parameters may
also be sequences, converted as the reference converts them. The result, int64
(batch, 1 + max k), comes back in the target logits' library. One native call verifies
the whole batch, requests in parallel for large batches, with the GIL released.

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

from .. import _native
from . import _common as _c

__all__ = ["verify_greedy", "rejection_sample"]

_LOGITS = "target_logits"


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
