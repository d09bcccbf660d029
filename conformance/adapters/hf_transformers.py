"""Hugging Face transformers' own logits processors behind the pyagent op signatures.

    python -m conformance conformance.adapters.hf_transformers

`sampling` (built on first access, which imports transformers) provides:

    apply_temperature  TemperatureLogitsWarper          per row; skipped where t == 1
    apply_top_k        TopKLogitsWarper                 per row; skipped where k == 0
    apply_top_p        TopPLogitsWarper                 per row; skipped where p >= 1
    apply_min_p        MinPLogitsWarper                 per row
    apply_penalties    RepetitionPenaltyLogitsProcessor per row, on the row's prompt + output
                       ids (padding removed); skipped where r == 1. transformers has no
                       frequency/presence penalty: a non-zero one raises NotImplementedError
    apply_logit_bias   SequenceBiasLogitsProcessor      per row, single-token sequences
    log_softmax        LogitNormalization

The glue does what `GenerationMixin._get_logits_processor` does and nothing more: it
builds one processor per row (HF takes one scalar parameter per processor), skips a
processor where generate() would not add it (temperature 1, top_k 0, top_p >= 1,
repetition_penalty 1), converts numpy inputs to torch and the result back to the input's
library, and raises ValueError when a per-row parameter does not have one entry per
row. It does not validate anything else: what HF accepts or rejects is what is tested.

`topk_logprobs`, `philox_uniform`, `sample`, the `hashing` ops and the `block_table` ops
have no counterpart and are declared in CONFORMANCE_MISSING (reported as MISSING with the
reason).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np

CONFORMANCE_MISSING = {
    "sampling.topk_logprobs": "transformers has no op for it (generate() returns raw scores)",
    "sampling.philox_uniform": (
        "transformers draws from the global torch RNG, not a counter-based generator"
    ),
    "sampling.sample": (
        "transformers samples with torch.multinomial on the global torch RNG: not seeded per "
        "row, so neither reproducible per request nor batch-invariant"
    ),
    "hashing.*": "transformers has no prefix cache, hence no block hashes",
    "block_table.*": (
        "transformers computes its paged-cache indices inside the stateful allocators of its "
        "continuous batching, from Python lists: there is no array op with these signatures"
    ),
}

_NAMESPACE: SimpleNamespace | None = None
VERSION: str | None = None


def _hf() -> Any:
    """transformers.generation.logits_process, or an ImportError that says what to install."""
    global VERSION
    try:
        import transformers
        from transformers.generation import logits_process
    except ImportError as exc:
        raise ImportError(
            "conformance.adapters.hf_transformers needs transformers and torch: "
            "pip install transformers torch (or pip install 'pyagent[hf,torch]')"
        ) from exc
    VERSION = f"transformers {transformers.__version__}"
    return logits_process


def _torch(x: Any) -> Any:
    import torch

    return x if isinstance(x, torch.Tensor) else torch.as_tensor(np.asarray(x))


def _back(out: Any, like: Any) -> Any:
    """The result in the library of `like` (numpy in, numpy out)."""
    return out.numpy() if isinstance(like, np.ndarray) else out


def _per_row(values: Any, batch: int, name: str) -> list[Any]:
    """One Python number per row (ValueError if there is not exactly one per row)."""
    flat = _torch(values).tolist() if hasattr(values, "dtype") else list(values)
    if not isinstance(flat, list) or len(flat) != batch or any(isinstance(v, list) for v in flat):
        raise ValueError(f"{name} must have one entry per row ({batch}), got {values!r}")
    return flat


def _no_ids() -> Any:
    import torch

    return torch.zeros((1, 0), dtype=torch.long)


def _rowwise(logits: Any, params: list[Any], make: Any, skip: Any, ids: Any = None) -> Any:
    """Apply `make(param)` (a processor) to each row, except rows where `skip(param)`."""
    import torch

    scores = _torch(logits)
    rows = []
    for b, param in enumerate(params):
        row = scores[b : b + 1]
        rows.append(row if skip(param) else make(param)(ids(b) if ids else _no_ids(), row))
    return _back(torch.cat(rows) if rows else scores.clone(), logits)


def apply_temperature(logits: Any, temperature: Any) -> Any:
    """TemperatureLogitsWarper(float(t)) per row; generate() adds none for t == 1."""
    lp = _hf()
    t = _per_row(temperature, len(logits), "temperature")
    return _rowwise(logits, t, lambda v: lp.TemperatureLogitsWarper(float(v)), lambda v: v == 1)


def apply_top_k(logits: Any, k: Any) -> Any:
    """TopKLogitsWarper(top_k=k) per row; generate() adds none for top_k == 0."""
    lp = _hf()
    ks = _per_row(k, len(logits), "k")
    return _rowwise(logits, ks, lambda v: lp.TopKLogitsWarper(top_k=v), lambda v: v == 0)


def apply_top_p(logits: Any, p: Any) -> Any:
    """TopPLogitsWarper(top_p=p) per row; generate() adds none for top_p >= 1."""
    lp = _hf()
    ps = _per_row(p, len(logits), "p")
    return _rowwise(logits, ps, lambda v: lp.TopPLogitsWarper(top_p=float(v)), lambda v: v >= 1)


def apply_min_p(logits: Any, min_p: Any) -> Any:
    """MinPLogitsWarper(min_p=m) per row (generate() adds it whenever min_p is set)."""
    lp = _hf()
    ms = _per_row(min_p, len(logits), "min_p")
    return _rowwise(logits, ms, lambda v: lp.MinPLogitsWarper(min_p=float(v)), lambda v: False)


def apply_penalties(
    logits: Any,
    prompt_ids: Any,
    output_ids: Any,
    repetition_penalty: Any,
    frequency_penalty: Any,
    presence_penalty: Any,
) -> Any:
    """RepetitionPenaltyLogitsProcessor on each row's prompt + output ids (padding removed)."""
    import torch

    lp = _hf()
    batch = len(logits)
    r = _per_row(repetition_penalty, batch, "repetition_penalty")
    f = _per_row(frequency_penalty, batch, "frequency_penalty")
    q = _per_row(presence_penalty, batch, "presence_penalty")
    if any(v != 0 for v in (*f, *q)):
        raise NotImplementedError("transformers has no frequency or presence penalty")
    prompt, output = _torch(prompt_ids), _torch(output_ids)
    if len(prompt) != batch or len(output) != batch:
        raise ValueError(f"prompt_ids and output_ids must have {batch} rows")

    def ids(b: int) -> Any:
        seq = torch.cat([prompt[b][prompt[b] >= 0], output[b][output[b] >= 0]])
        return seq.to(torch.long).reshape(1, -1)

    return _rowwise(
        logits,
        r,
        lambda v: lp.RepetitionPenaltyLogitsProcessor(penalty=float(v)),
        lambda v: v == 1,
        ids,
    )


def apply_logit_bias(logits: Any, token_ids: Any, bias: Any) -> Any:
    """SequenceBiasLogitsProcessor with one single-token sequence per (id, bias) of a row."""
    lp = _hf()
    batch = len(logits)
    ids, weights = _torch(token_ids), _torch(bias)
    if len(ids) != batch or len(weights) != batch:
        raise ValueError(f"token_ids and bias must have {batch} rows")
    pairs = [
        [
            [[int(t)], float(w)]
            for t, w in zip(ids[b].tolist(), weights[b].tolist(), strict=True)
            if t >= 0
        ]
        for b in range(batch)
    ]
    rows = list(range(batch))
    return _rowwise(
        logits,
        rows,
        lambda b: lp.SequenceBiasLogitsProcessor(sequence_bias=pairs[b]),
        lambda b: not pairs[b],
    )


def log_softmax(logits: Any) -> Any:
    """LogitNormalization (scores.log_softmax(dim=-1)) on the whole batch."""
    lp = _hf()
    return _back(lp.LogitNormalization()(_no_ids(), _torch(logits)), logits)


def __getattr__(name: str) -> Any:
    """`sampling` is built on first access, importing transformers (clear ImportError)."""
    global _NAMESPACE
    if name == "sampling":
        if _NAMESPACE is None:
            _hf()
            _NAMESPACE = SimpleNamespace(
                apply_temperature=apply_temperature,
                apply_top_k=apply_top_k,
                apply_top_p=apply_top_p,
                apply_min_p=apply_min_p,
                apply_penalties=apply_penalties,
                apply_logit_bias=apply_logit_bias,
                log_softmax=log_softmax,
            )
        return _NAMESPACE
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
