"""Sampling ops in Rust: drop-in replacements for `pyagent_ref.ops.sampling`.

Same functions, signatures, results and exception classes as the reference, whose
docstrings are the specification. Inputs are numpy arrays or torch CPU tensors (torch
is optional and never imported by this module); results come back in the input's
library and dtype, torch results as zero-copy views of the Rust-filled buffers.

Differences from the reference, all deliberate:

- Only numpy arrays and torch CPU tensors. A tensor on another device raises
  TypeError (it is never copied silently); other array libraries raise TypeError.
- `logits` / `logprobs` are read in place: rows may be strided (`logits[:, :vocab]` of
  a padded array works without a copy), but each row must be contiguous, else
  ValueError (a hidden copy would cost more than the op). Small arguments (per-row
  parameters, id arrays) are converted exactly as the reference converts them.
- torch inputs that require grad are read through `detach()`; results carry no graph.

Exactness, against the numpy and the torch paths of the reference:

- Bit-identical: `apply_temperature`, `apply_top_k`, `apply_penalties`,
  `apply_logit_bias` (same operations in the same dtype, signed zeros included),
  `topk_logprobs`, `_philox4x32_10`, `philox_uniform`, and the tokens of `sample`
  (exact float64 scores x - log(-log(u)) for every token that can win; a token can
  differ only if two scores tie to the last bit, where numpy's and torch's own `log`
  already disagree).
- `apply_min_p` and `apply_top_p` compute exp(x - max) in float64 with a vectorised exp
  accurate to 1 ulp (numpy, torch and libm differ from each other in the last bit too),
  so only decisions within 1e-9 relative of the threshold may differ, as the
  specification allows. top-p sums the probability mass in another order than a
  sorted cumsum (also allowed); it never sorts the vocabulary.
- `apply_allowed_token_ids`, `apply_bad_words`, `apply_no_repeat_ngram`: bit-identical
  (they only copy or mask).
- `apply_dry`: bit-identical (the same float64 subtraction rounded once; the penalty's
  power is libm's pow, as Python's `**` on floats), the masks always.
- `apply_xtc` and `apply_mirostat` compute p = exp(x - max) / S in float64 with the 1-ulp
  exp and numpy's pairwise sum, so only decisions inside the specification's 1e-9 band
  may differ; XTC's coin is bit-identical (`philox_uniform`'s entry vocab + 1).
- `mirostat_update`: within a few ulp of the reference (the last bit of exp and log).
- `apply_typical_p`, `apply_epsilon_cutoff`, `apply_eta_cutoff` compute log_softmax,
  p and the entropy in float64 with the 1-ulp exp and numpy's pairwise sums, so only
  decisions inside the specification's 1e-9 bands may differ; typical-p sorts the row
  by distance to the entropy.
- `log_softmax` sums in numpy's pairwise order, so the only difference is the last bit
  of exp/log: |accel - ref| <= 2 * eps * max(1, |ref|) (eps of the dtype; measured
  under 1 eps, with about 98% of entries identical, the same as torch vs numpy).
"""

from __future__ import annotations

from typing import Any

import numpy as _np

from .. import _native
from . import _common as _c
from ._common import (
    F64,
    I64,
    LOGITS_DTYPE,
    SEEDS,
    Bias,
    Check,
    Count,
    PaddingLast,
    Rows,
    Sequences,
    TokenIds,
    Values,
)

# The reference's names, in its order (tests/test_stubs.py checks they stay equal).
# pylint: disable=duplicate-code
__all__ = [
    "apply_temperature",
    "apply_top_k",
    "apply_top_p",
    "apply_min_p",
    "apply_typical_p",
    "apply_epsilon_cutoff",
    "apply_eta_cutoff",
    "apply_penalties",
    "apply_logit_bias",
    "apply_allowed_token_ids",
    "apply_bad_words",
    "apply_no_repeat_ngram",
    "apply_dry",
    "apply_xtc",
    "apply_mirostat",
    "mirostat_update",
    "log_softmax",
    "topk_logprobs",
    "philox_uniform",
    "sample",
]
# pylint: enable=duplicate-code

PHILOX_M0, PHILOX_M1 = 0xD2511F53, 0xCD9E8D57  # round multipliers
PHILOX_W0, PHILOX_W1 = 0x9E3779B9, 0xBB67AE85  # key schedule (Weyl) increments

_TEMPERATURE = "temperature[{row}] must be finite and >= 0, got {value}"
_POSITION = "positions[{row}] must be >= 0, got {value}"


def _op(native: Any, *steps: _c.Step, main: _c.Main = _c.LOGITS) -> Any:
    return _c.op(__name__, native, *steps, main=main)


# One op per statement: its native function (whose signature is the op's), then what
# the reference does with the arguments after the first, in the reference's order
# (conversions, value checks). The first argument is the logits unless `main` says.

apply_temperature = _op(
    _native.apply_temperature,
    Rows("temperature", LOGITS_DTYPE),
    Values("temperature", Check.FINITE_NONNEG, _TEMPERATURE),
)
apply_top_k = _op(_native.apply_top_k, Rows("k", I64))
apply_top_p = _op(
    _native.apply_top_p,
    Rows("p", F64),
    Values("p", Check.UNIT_OPEN_CLOSED, "p[{row}] must be in (0, 1], got {value}"),
)
apply_min_p = _op(
    _native.apply_min_p,
    Rows("min_p", F64),
    Values("min_p", Check.UNIT_CLOSED, "min_p[{row}] must be in [0, 1], got {value}"),
)
apply_typical_p = _op(
    _native.apply_typical_p,
    Rows("typical_p", F64),
    Values("typical_p", Check.UNIT_OPEN_CLOSED, "typical_p[{row}] must be in (0, 1], got {value}"),
)
apply_epsilon_cutoff = _op(
    _native.apply_epsilon_cutoff,
    Rows("epsilon", F64),
    Values("epsilon", Check.UNIT_CLOSED_OPEN, "epsilon[{row}] must be in [0, 1), got {value}"),
)
apply_eta_cutoff = _op(
    _native.apply_eta_cutoff,
    Rows("eta", F64),
    Values("eta", Check.UNIT_CLOSED_OPEN, "eta[{row}] must be in [0, 1), got {value}"),
)
apply_penalties = _op(
    _native.apply_penalties,
    TokenIds("prompt_ids"),
    TokenIds("output_ids"),
    Rows("repetition_penalty", LOGITS_DTYPE),
    Rows("frequency_penalty", LOGITS_DTYPE),
    Rows("presence_penalty", LOGITS_DTYPE),
    Values(
        "repetition_penalty",
        Check.FINITE_POS,
        "repetition_penalty[{row}] out of range, got {value}",
    ),
    Values("frequency_penalty", Check.FINITE, "frequency_penalty[{row}] out of range, got {value}"),
    Values("presence_penalty", Check.FINITE, "presence_penalty[{row}] out of range, got {value}"),
)
apply_logit_bias = _op(_native.apply_logit_bias, TokenIds("token_ids"), Bias("bias", "token_ids"))
apply_allowed_token_ids = _op(_native.apply_allowed_token_ids, TokenIds("allowed"))
apply_bad_words = _op(
    _native.apply_bad_words,
    TokenIds("token_ids"),
    PaddingLast("token_ids"),
    Sequences("bad_words"),
    PaddingLast("bad_words"),
)
apply_no_repeat_ngram = _op(
    _native.apply_no_repeat_ngram,
    TokenIds("token_ids"),
    PaddingLast("token_ids"),
    Rows("n", I64),
    Values("n", Check.NONNEG, "n[{row}] must be >= 0 (0 disables), got {value}"),
)
apply_dry = _op(
    _native.apply_dry,
    TokenIds("token_ids"),
    PaddingLast("token_ids"),
    TokenIds("sequence_breakers"),
    Rows("multiplier", F64),
    Rows("base", F64),
    Rows("allowed_length", I64),
    Rows("penalty_last_n", I64),
    Values(
        "multiplier", Check.FINITE_NONNEG, "multiplier[{row}] must be finite and >= 0, got {value}"
    ),
    Values("base", Check.FINITE_ABOVE_ONE, "base[{row}] must be finite and > 1, got {value}"),
    Values("allowed_length", Check.POSITIVE, "allowed_length[{row}] must be >= 1, got {value}"),
    Values(
        "penalty_last_n",
        Check.AT_LEAST_MINUS_ONE,
        "penalty_last_n[{row}] must be >= -1 (-1: the whole context, 0: off), got {value}",
    ),
)
apply_xtc = _op(
    _native.apply_xtc,
    Rows("threshold", F64),
    Rows("probability", F64),
    Values("threshold", Check.UNIT_CLOSED, "threshold[{row}] must be in [0, 1], got {value}"),
    Values("probability", Check.UNIT_CLOSED, "probability[{row}] must be in [0, 1], got {value}"),
    Rows("seeds", I64),
    Rows("positions", I64),
    Values("positions", Check.NONNEG, _POSITION),
)
apply_mirostat = _op(
    _native.apply_mirostat,
    Rows("mu", F64),
    Values("mu", Check.NOT_NAN, "mu[{row}] must not be NaN, got {value}"),
)
mirostat_update = _op(
    _native.mirostat_update,
    Rows("sampled", I64),
    Values(
        "sampled", Check.INDEX, "sampled[{row}] must be a token id in [0, {vocab}), got {value}"
    ),
    Rows("mu", F64),
    Rows("tau", F64),
    Rows("eta", F64),
    Values("mu", Check.FINITE, "mu[{row}] must be finite, got {value}"),
    Values("tau", Check.FINITE_POS, "tau[{row}] must be finite and > 0, got {value}"),
    Values("eta", Check.UNIT_OPEN_CLOSED, "eta[{row}] must be in (0, 1], got {value}"),
)
log_softmax = _op(_native.log_softmax)
topk_logprobs = _op(
    _native.topk_logprobs,
    Count("num", at_most_vocab=True),
    Rows("sampled", I64),
    Values(
        "sampled", Check.INDEX, "sampled[{row}] must be a token id in [0, {vocab}), got {value}"
    ),
)
philox_uniform = _op(
    _native.philox_uniform,
    Count("num"),
    Rows("positions", I64),
    Values("positions", Check.NONNEG, _POSITION),
    main=SEEDS,
)
sample = _op(
    _native.sample,
    Rows("temperature", F64),
    Values("temperature", Check.FINITE_NONNEG, _TEMPERATURE),
    Rows("seeds", I64),
    Rows("positions", I64),
    Values("positions", Check.NONNEG, _POSITION),
)


def _philox4x32_10(counter: tuple[Any, Any, Any, Any], key: tuple[Any, Any]) -> tuple:
    """Philox-4x32 with 10 rounds on int64 arrays of uint32 words (broadcast together).

    Contract: `pyagent_ref.ops.sampling._philox4x32_10` (private in both packages: the
    public, specified op is `philox_uniform`). Words must be in [0, 2**32)
    (ValueError otherwise; the reference does not check them and computes garbage).
    Returns four int64 arrays of the broadcast shape.
    """
    c0, c1, c2, c3 = counter
    k0, k1 = key
    if _c.is_torch(c0):
        torch_in = True
    elif isinstance(c0, (_np.ndarray, _np.generic)):
        torch_in = False
    else:
        raise TypeError(f"counter must be a numpy array or a torch tensor, got {type(c0).__name__}")
    words = []
    for name, w in (
        ("counter", c0),
        ("counter", c1),
        ("counter", c2),
        ("counter", c3),
        ("key", k0),
        ("key", k1),
    ):
        if _c.is_torch(w):
            _c.check_cpu(w, name)
            w = _c.tensor_to_numpy(w)
        a = _np.asarray(w)
        if a.dtype.kind not in "iu":
            raise TypeError(f"{name} words must be integers, got dtype {a.dtype}")
        words.append(a)
    shape = _np.broadcast_shapes(*(a.shape for a in words))
    flat = [
        _np.ascontiguousarray(_np.broadcast_to(a, shape), dtype=_c.I64).reshape(-1) for a in words
    ]
    out = _native.philox4x32_10(flat)
    return tuple(_c.wrap(o.reshape(shape), torch_in) for o in out)
