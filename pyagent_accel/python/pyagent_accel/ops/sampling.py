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
- `log_softmax` sums in numpy's pairwise order, so the only difference is the last bit
  of exp/log: |accel - ref| <= 2 * eps * max(1, |ref|) (eps of the dtype; measured
  under 1 eps, with about 98% of entries identical, the same as torch vs numpy).
"""

from __future__ import annotations

from typing import Any

import numpy as _np

from .. import _native
from . import _common as _c

__all__ = [
    "apply_temperature",
    "apply_top_k",
    "apply_top_p",
    "apply_min_p",
    "apply_penalties",
    "apply_logit_bias",
    "log_softmax",
    "topk_logprobs",
    "philox_uniform",
    "sample",
]

PHILOX_M0, PHILOX_M1 = 0xD2511F53, 0xCD9E8D57  # round multipliers
PHILOX_W0, PHILOX_W1 = 0x9E3779B9, 0xBB67AE85  # key schedule (Weyl) increments


def apply_temperature(logits: Any, temperature: Any) -> Any:
    """Divide each row's logits by its temperature (0 leaves the row unchanged).

    Contract: `pyagent_ref.ops.sampling.apply_temperature`.
    """
    x, torch_in = _c.logits_array(logits)
    try:
        t = _c.row_param(torch_in, x.shape[0], temperature, "temperature", x.dtype)
        _c.check_values(
            t, "finite_nonneg", "temperature[{row}] must be finite and >= 0, got {value}"
        )
    except Exception:
        _c.check_logits(x)
        raise
    return _c.wrap(_native.apply_temperature(x, t), torch_in)


def apply_top_k(logits: Any, k: Any) -> Any:
    """Keep each row's k largest logits (and ties with the k-th), mask the rest.

    Contract: `pyagent_ref.ops.sampling.apply_top_k`.
    """
    x, torch_in = _c.logits_array(logits)
    try:
        kk = _c.row_param(torch_in, x.shape[0], k, "k", _c.I64)
    except Exception:
        _c.check_logits(x)
        raise
    return _c.wrap(_native.apply_top_k(x, kk), torch_in)


def apply_top_p(logits: Any, p: Any) -> Any:
    """Nucleus filter: keep the smallest set of most likely tokens whose mass reaches p.

    Contract: `pyagent_ref.ops.sampling.apply_top_p`.
    """
    x, torch_in = _c.logits_array(logits)
    try:
        pp = _c.row_param(torch_in, x.shape[0], p, "p", _c.F64)
        _c.check_values(pp, "unit_open_closed", "p[{row}] must be in (0, 1], got {value}")
    except Exception:
        _c.check_logits(x)
        raise
    return _c.wrap(_native.apply_top_p(x, pp), torch_in)


def apply_min_p(logits: Any, min_p: Any) -> Any:
    """Mask tokens that are much less likely than the most likely one.

    Contract: `pyagent_ref.ops.sampling.apply_min_p`.
    """
    x, torch_in = _c.logits_array(logits)
    try:
        mp = _c.row_param(torch_in, x.shape[0], min_p, "min_p", _c.F64)
        _c.check_values(mp, "unit_closed", "min_p[{row}] must be in [0, 1], got {value}")
    except Exception:
        _c.check_logits(x)
        raise
    return _c.wrap(_native.apply_min_p(x, mp), torch_in)


def apply_penalties(
    logits: Any,
    prompt_ids: Any,
    output_ids: Any,
    repetition_penalty: Any,
    frequency_penalty: Any,
    presence_penalty: Any,
) -> Any:
    """Penalise tokens that already appeared (repetition, frequency, presence).

    Contract: `pyagent_ref.ops.sampling.apply_penalties`.
    """
    x, torch_in = _c.logits_array(logits)
    batch, vocab = x.shape
    try:
        prompt = _c.token_ids(torch_in, batch, vocab, prompt_ids, "prompt_ids")
        output = _c.token_ids(torch_in, batch, vocab, output_ids, "output_ids")
        r = _c.row_param(torch_in, batch, repetition_penalty, "repetition_penalty", x.dtype)
        f = _c.row_param(torch_in, batch, frequency_penalty, "frequency_penalty", x.dtype)
        q = _c.row_param(torch_in, batch, presence_penalty, "presence_penalty", x.dtype)
        for name, val, kind in (
            ("repetition_penalty", r, "finite_pos"),
            ("frequency_penalty", f, "finite"),
            ("presence_penalty", q, "finite"),
        ):
            _c.check_values(val, kind, name + "[{row}] out of range, got {value}")
    except Exception:
        _c.check_logits(x)
        raise
    return _c.wrap(_native.apply_penalties(x, prompt, output, r, f, q), torch_in)


def apply_logit_bias(logits: Any, token_ids: Any, bias: Any) -> Any:
    """Add per-row biases to chosen tokens (OpenAI's `logit_bias`).

    Contract: `pyagent_ref.ops.sampling.apply_logit_bias`.
    """
    x, torch_in = _c.logits_array(logits)
    batch, vocab = x.shape
    try:
        ids = _c.token_ids(torch_in, batch, vocab, token_ids, "token_ids")
        kind = str(getattr(bias, "dtype", "float")).removeprefix("torch.")
        if not ("float" in kind or "int" in kind):
            raise TypeError(f"bias must hold numbers, got dtype {kind}")
        if _c.is_torch(bias):
            _c.check_cpu(bias, "bias")
        if torch_in:
            torch = _c.torch_module()
            b = _c.tensor_to_numpy(torch.asarray(bias, dtype=torch.float64, device="cpu"))
        else:
            b = _np.asarray(bias, dtype=_c.F64)
        if tuple(b.shape) != tuple(ids.shape):
            raise ValueError(
                f"bias must have the shape of token_ids {tuple(ids.shape)}, got {tuple(b.shape)}"
            )
        b = _c.native_array(b)
        if _native.first_bad(b.reshape(-1), "finite", 0) >= 0:
            raise ValueError("bias must be finite, got a NaN or infinite entry")
    except Exception:
        _c.check_logits(x)
        raise
    return _c.wrap(_native.apply_logit_bias(x, ids, b), torch_in)


def log_softmax(logits: Any) -> Any:
    """Log-probabilities: x - max(x) - log(sum(exp(x - max(x)))) per row.

    Contract: `pyagent_ref.ops.sampling.log_softmax` (float tolerance: see the module
    docstring).
    """
    x, torch_in = _c.logits_array(logits)
    return _c.wrap(_native.log_softmax(x), torch_in)


def topk_logprobs(logprobs: Any, num: int, sampled: Any) -> tuple[Any, Any, Any, Any]:
    """The `num` most likely tokens of each row, and the sampled token's logprob and rank.

    Contract: `pyagent_ref.ops.sampling.topk_logprobs`.
    """
    x, torch_in = _c.logits_array(logprobs, "logprobs")
    batch, vocab = x.shape
    try:
        if isinstance(num, bool) or not isinstance(num, int):
            raise TypeError(f"num must be an int, got {num!r}")
        if not 0 <= num <= vocab:
            raise ValueError(f"num must be in [0, {vocab}], got {num}")
        s = _c.row_param(torch_in, batch, sampled, "sampled", _c.I64)
        message = "sampled[{row}] must be a token id in [0, " + str(vocab) + "), got {value}"
        _c.check_values(s, "index", message, vocab)
    except Exception:
        _c.check_logits(x, "logprobs")
        raise
    values, ids, chosen, rank = _native.topk_logprobs(x, num, s)
    return (
        _c.wrap(values, torch_in),
        _c.wrap(ids, torch_in),
        _c.wrap(chosen, torch_in),
        _c.wrap(rank, torch_in),
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


def philox_uniform(seeds: Any, positions: Any, num: int) -> Any:
    """`num` uniform doubles in (0, 1) per row, a pure function of (seed, position, index).

    Contract: `pyagent_ref.ops.sampling.philox_uniform` (bit-identical).
    """
    if isinstance(seeds, _np.ndarray):
        torch_in = False
    elif _c.is_torch(seeds):
        _c.check_cpu(seeds, "seeds")
        torch_in = True
    elif isinstance(seeds, _np.generic):
        seeds, torch_in = _np.asarray(seeds), False
    else:
        raise TypeError(
            f"seeds must be a numpy array or a torch tensor, got {type(seeds).__name__}"
        )
    kind = _c.dtype_name(seeds)
    if "int" not in kind:
        raise TypeError(f"seeds must be an integer array, got dtype {kind}")
    if seeds.ndim != 1:
        raise ValueError(f"seeds must have shape (batch,), got shape {tuple(seeds.shape)}")
    if isinstance(num, bool) or not isinstance(num, int):
        raise TypeError(f"num must be an int, got {num!r}")
    if num < 0:
        raise ValueError(f"num must be >= 0, got {num}")
    if torch_in:
        seed = _c.tensor_to_numpy(seeds.to(_c.torch_dtype(_c.I64)))
    else:
        seed = seeds.astype(_c.I64, copy=False)
    seed = _c.native_array(seed)
    pos = _c.row_param(torch_in, seed.shape[0], positions, "positions", _c.I64)
    _c.check_values(pos, "nonneg", "positions[{row}] must be >= 0, got {value}")
    return _c.wrap(_native.philox_uniform(seed, pos, num), torch_in)


def sample(logits: Any, temperature: Any, seeds: Any, positions: Any) -> Any:
    """Draw one token per row: greedy where temperature is 0, else a seeded random draw.

    Contract: `pyagent_ref.ops.sampling.sample` (same tokens). Greedy rows draw no
    uniforms; random rows score exactly only the tokens that can still win.
    """
    x, torch_in = _c.logits_array(logits)
    batch = x.shape[0]
    try:
        t = _c.row_param(torch_in, batch, temperature, "temperature", _c.F64)
        _c.check_values(
            t, "finite_nonneg", "temperature[{row}] must be finite and >= 0, got {value}"
        )
        s = _c.row_param(torch_in, batch, seeds, "seeds", _c.I64)
        pos = _c.row_param(torch_in, batch, positions, "positions", _c.I64)
        _c.check_values(pos, "nonneg", "positions[{row}] must be >= 0, got {value}")
    except Exception:
        _c.check_logits(x)
        raise
    return _c.wrap(_native.sample(x, t, s, pos), torch_in)
