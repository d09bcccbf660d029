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
    apply_typical_p    TypicalLogitsWarper              per row; skipped where typical_p >= 1
    apply_epsilon_cutoff EpsilonLogitsWarper            per row; skipped where epsilon == 0
    apply_eta_cutoff   EtaLogitsWarper                  per row; skipped where eta == 0
    apply_allowed_token_ids PrefixConstrainedLogitsProcessor  per row, the row's ids as the
                       allowed tokens; skipped where the row has none
    apply_bad_words    NoBadWordsLogitsProcessor        per row, input_ids = the row's tokens
                       (padding removed), its non-empty sequences; skipped where it has none
    apply_no_repeat_ngram NoRepeatNGramLogitsProcessor  per row, input_ids = the row's
                       tokens (padding removed); skipped where n == 0
    log_softmax        LogitNormalization

The glue does what `GenerationMixin._get_logits_processor` does and nothing more: it
builds one processor per row (HF takes one scalar parameter per processor), skips a
processor where generate() would not add it (temperature 1, top_k 0, top_p >= 1,
repetition_penalty 1, typical_p >= 1, epsilon/eta 0, no_repeat_ngram_size 0, no bad
words or allowed ids), converts numpy inputs to torch and the result back to the input's
library, and raises ValueError when a per-row parameter does not have one entry per
row. It does not validate anything else: what HF accepts or rejects is what is tested.

`layers` and `rope` (built on first access too) wrap the Llama modeling code:

    rms_norm           LlamaRMSNorm with the given weight; with a residual, the decoder
                       layer's add h = x + residual first, returning (norm(h), h)
    silu_and_mul       ACT2FN["silu"](gate) * up, as LlamaMLP applies it
    rope_inv_freq      ROPE_INIT_FUNCTIONS[rope_type] (LlamaRotaryEmbedding's own default)
                       on a LlamaConfig with head_dim = rotary_dim and rope_parameters =
                       {"rope_type", "rope_theta"} | rope_scaling
    apply_rope         cos/sin from LlamaRotaryEmbedding.forward (its inv_freq and
                       attention_scaling set to the arguments), then the NeoX
                       apply_rotary_pos_emb of modeling_llama or the interleaved one of
                       modeling_gptj, on the first 2 * len(inv_freq) features (the split
                       GPT-J and Phi attention do for partial rotary)

`moe` (built on first access too) wraps the MoE modeling code, routers given an identity
weight so that their router logits are the logits passed in:

    route_topk_softmax Qwen3MoeTopKRouter with norm_topk_prob = renormalize (Mixtral's
                       router is the same with renormalisation always on)
    fused_moe          MixtralExperts holding w_gate_up and w_down

`moe.route_grouped_topk` is declared missing: transformers has only two fixed variants of
it, inside DeepSeek's router modules (tests/ops/test_moe.py compares both with the
reference).

`topk_logprobs`, `philox_uniform`, `sample`, llama.cpp's samplers (`apply_dry`,
`apply_xtc`, `apply_mirostat`, `mirostat_update`), the `hashing`, `block_table` and
`attention` ops have no counterpart and are declared in CONFORMANCE_MISSING (reported as
MISSING with the reason), as is `tokenize` (the `hf_tokenizers` adapter covers it).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import lazy_namespaces

CONFORMANCE_MISSING = {
    "sampling.topk_logprobs": "transformers has no op for it (generate() returns raw scores)",
    "sampling.apply_dry": (
        "transformers has no DRY processor (llama.cpp's and koboldcpp's repetition penalty)"
    ),
    "sampling.apply_xtc": (
        "transformers has no XTC warper (text-generation-webui's and llama.cpp's sampler)"
    ),
    "sampling.apply_mirostat": "transformers has no mirostat warper (a llama.cpp sampler)",
    "sampling.mirostat_update": "transformers has no mirostat warper (a llama.cpp sampler)",
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
    "rope.ROPE_TYPES": "transformers' ROPE_INIT_FUNCTIONS has more types (longrope, ...)",
    "attention.*": (
        "transformers' paged attention runs inside its continuous-batching cache classes "
        "(per-layer state, its own block layout): there is no stateless op with these "
        "signatures"
    ),
    "moe.route_grouped_topk": (
        "transformers has two fixed variants inside stateful router modules, not the op: "
        "DeepseekV3TopkRouter (sigmoid scores, groups by their top-2 sum, which raises for a "
        "group of one expert, a correction bias) and DeepseekV2TopkRouter (softmax scores, "
        "groups by their best score, no bias, no renormalisation); tests/ops/test_moe.py "
        "compares both with the reference"
    ),
    "pooling.*": (
        "transformers has no pooling ops: its models return hidden states (and a classifier "
        "its logits), sentence-transformers pools them; tests/ops/test_pooling.py compares "
        "the ops with torch's and sentence-transformers' functions"
    ),
    "tokenize.*": (
        "transformers' fast tokenizers are the tokenizers library: see "
        "conformance.adapters.hf_tokenizers"
    ),
}

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


def apply_typical_p(logits: Any, typical_p: Any) -> Any:
    """TypicalLogitsWarper(mass) per row; generate() adds none for typical_p >= 1."""
    lp = _hf()
    ms = _per_row(typical_p, len(logits), "typical_p")
    return _rowwise(logits, ms, lambda v: lp.TypicalLogitsWarper(mass=float(v)), lambda v: v >= 1)


def apply_epsilon_cutoff(logits: Any, epsilon: Any) -> Any:
    """EpsilonLogitsWarper(epsilon) per row; generate() adds none for epsilon_cutoff 0."""
    lp = _hf()
    es = _per_row(epsilon, len(logits), "epsilon")
    return _rowwise(logits, es, lambda v: lp.EpsilonLogitsWarper(float(v)), lambda v: v == 0)


def apply_eta_cutoff(logits: Any, eta: Any) -> Any:
    """EtaLogitsWarper(eta) per row; generate() adds none for eta_cutoff 0."""
    lp = _hf()
    es = _per_row(eta, len(logits), "eta")
    return _rowwise(logits, es, lambda v: lp.EtaLogitsWarper(float(v)), lambda v: v == 0)


def _leading(ids: Any) -> list[int]:
    """A right-padded id row as a list: its entries before the first negative one."""
    out = []
    for t in _torch(ids).tolist():
        if t < 0:
            break
        out.append(int(t))
    return out


def _row_ids(token_ids: Any, batch: int, name: str) -> Any:
    """The (1, len) input_ids of each row, padding removed."""
    import torch

    ids = _torch(token_ids)
    if len(ids) != batch:
        raise ValueError(f"{name} must have {batch} rows")
    return lambda b: torch.tensor([_leading(ids[b])], dtype=torch.long).reshape(1, -1)


def apply_allowed_token_ids(logits: Any, allowed: Any) -> Any:
    """PrefixConstrainedLogitsProcessor allowing the row's ids, on rows that list some."""
    lp = _hf()
    batch = len(logits)
    ids = _torch(allowed)
    if len(ids) != batch:
        raise ValueError(f"allowed must have {batch} rows")
    lists = [[int(t) for t in ids[b].tolist() if t >= 0] for b in range(batch)]
    return _rowwise(
        logits,
        list(range(batch)),
        lambda b: lp.PrefixConstrainedLogitsProcessor(lambda _batch, _ids: lists[b], 1),
        lambda b: not lists[b],
    )


def apply_bad_words(logits: Any, token_ids: Any, bad_words: Any) -> Any:
    """NoBadWordsLogitsProcessor with the row's non-empty sequences, on the row's tokens."""
    lp = _hf()
    batch = len(logits)
    words = _torch(bad_words)
    if len(words) != batch:
        raise ValueError(f"bad_words must have {batch} rows")
    seqs = [[s for s in (_leading(w) for w in words[b]) if s] for b in range(batch)]
    return _rowwise(
        logits,
        list(range(batch)),
        lambda b: lp.NoBadWordsLogitsProcessor(bad_words_ids=seqs[b], eos_token_id=None),
        lambda b: not seqs[b],
        _row_ids(token_ids, batch, "token_ids"),
    )


def apply_no_repeat_ngram(logits: Any, token_ids: Any, n: Any) -> Any:
    """NoRepeatNGramLogitsProcessor(n) per row on the row's tokens; none for n == 0."""
    lp = _hf()
    batch = len(logits)
    ns = _per_row(n, batch, "n")
    return _rowwise(
        logits,
        ns,
        lambda v: lp.NoRepeatNGramLogitsProcessor(v),
        lambda v: v == 0,
        _row_ids(token_ids, batch, "token_ids"),
    )


def log_softmax(logits: Any) -> Any:
    """LogitNormalization (scores.log_softmax(dim=-1)) on the whole batch."""
    lp = _hf()
    return _back(lp.LogitNormalization()(_no_ids(), _torch(logits)), logits)


# --- layers -----------------------------------------------------------------------------


def rms_norm(x: Any, weight: Any, eps: float, residual: Any = None) -> Any:
    """LlamaRMSNorm(hidden, eps) carrying `weight`; with `residual`, h = x + residual first."""
    import torch
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    h = _torch(x) if residual is None else _torch(x) + _torch(residual)
    norm = LlamaRMSNorm(h.shape[-1], eps=eps)
    norm.weight = torch.nn.Parameter(_torch(weight), requires_grad=False)
    with torch.no_grad():
        out = norm(h)
    return _back(out, x) if residual is None else (_back(out, x), _back(h, x))


def silu_and_mul(x: Any) -> Any:
    """ACT2FN["silu"] on the gate half times the up half (LlamaMLP's act_fn(gate) * up)."""
    from transformers.activations import ACT2FN

    t = _torch(x)
    d = t.shape[-1] // 2
    return _back(ACT2FN["silu"](t[..., :d]) * t[..., d:], x)


# --- rope -------------------------------------------------------------------------------


def _rope_config(rotary_dim: int, theta: float, rope_scaling: Any, max_pos: int) -> Any:
    """A LlamaConfig with these RoPE settings (transformers' warnings about unusual
    parameter combinations, which the suite draws on purpose, are silenced)."""
    from transformers import LlamaConfig
    from transformers.utils import logging as hf_logging

    params = {"rope_theta": theta} | dict(rope_scaling or {})
    if "rope_type" not in params and "type" not in params:
        params["rope_type"] = "default"
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        return LlamaConfig(
            hidden_size=4 * rotary_dim,
            num_attention_heads=4,
            head_dim=rotary_dim,
            max_position_embeddings=max_pos,
            rope_parameters=params,
        )
    finally:
        hf_logging.set_verbosity(verbosity)


def rope_inv_freq(
    rotary_dim: int,
    theta: float,
    rope_scaling: Any = None,
    max_position_embeddings: int = 2048,
    seq_len: Any = None,
    like: Any = None,
) -> Any:
    """transformers' RoPE init function for the type, on an equivalent LlamaConfig."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    config = _rope_config(rotary_dim, theta, rope_scaling, max_position_embeddings)
    rope_type = config.rope_parameters["rope_type"]
    if rope_type == "default":
        inv_freq, scale = LlamaRotaryEmbedding.compute_default_rope_parameters(config)
    else:
        inv_freq, scale = ROPE_INIT_FUNCTIONS[rope_type](config, None, seq_len=seq_len)
    if like is None or isinstance(like, np.ndarray):
        return inv_freq.numpy(), float(scale)
    return inv_freq.to(like.device), float(scale)


def apply_rope(
    positions: Any,
    query: Any,
    key: Any,
    inv_freq: Any,
    scale: float = 1.0,
    is_neox: bool = True,
) -> Any:
    """cos/sin as LlamaRotaryEmbedding.forward computes them, then HF's rotation."""
    import torch
    from transformers.models.gptj import modeling_gptj
    from transformers.models.llama import modeling_llama

    q, k, freq = _torch(query), _torch(key), _torch(inv_freq)
    half = freq.shape[0]
    rotary = modeling_llama.LlamaRotaryEmbedding(_rope_config(2 * half, 10000.0, None, 2048))
    rotary.inv_freq, rotary.attention_scaling = freq, scale
    pos = _torch(positions)[None, :]
    with torch.no_grad():
        cos, sin = rotary(q, pos)  # (1, tokens, 2 * half), q's dtype
    cos, sin = cos[0], sin[0]
    rot = 2 * half
    if is_neox:
        q_rot, k_rot = modeling_llama.apply_rotary_pos_emb(
            q[..., :rot], k[..., :rot], cos, sin, unsqueeze_dim=1
        )
    else:  # GPT-J: sin/cos of each pair, interleaved
        cos_h, sin_h = cos[None, :, :half], sin[None, :, :half]
        q_rot = modeling_gptj.apply_rotary_pos_emb(q[None, ..., :rot], sin_h, cos_h)[0]
        k_rot = modeling_gptj.apply_rotary_pos_emb(k[None, ..., :rot], sin_h, cos_h)[0]
    q_out = torch.cat([q_rot, q[..., rot:]], dim=-1)
    k_out = torch.cat([k_rot, k[..., rot:]], dim=-1)
    return _back(q_out, query), _back(k_out, key)


# --- moe --------------------------------------------------------------------------------


def _router(router: Any, logits: Any) -> tuple[Any, Any]:
    """(weights, ids) of an HF router module given an identity weight (router logits =
    `logits`), in the library of `logits`."""
    import torch

    x = _torch(logits)
    with torch.no_grad():
        router.weight = torch.nn.Parameter(
            torch.eye(x.shape[1], dtype=router.weight.dtype), requires_grad=False
        )
        _, weights, ids = router(x)
    return _back(weights, logits), _back(ids, logits)


def route_topk_softmax(logits: Any, k: int, renormalize: bool) -> tuple[Any, Any]:
    """Qwen3MoeTopKRouter (softmax, topk, norm_topk_prob) on the logits."""
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeTopKRouter

    experts = logits.shape[1]
    config = Qwen3MoeConfig(
        hidden_size=experts, num_experts=experts, num_experts_per_tok=k, norm_topk_prob=renormalize
    )
    router = Qwen3MoeTopKRouter(config).to(_torch(logits).dtype)
    return _router(router, logits)


def fused_moe(
    hidden: Any,
    w_gate_up: Any,
    w_down: Any,
    topk_weights: Any,
    topk_ids: Any,
    activation: str = "silu",
) -> Any:
    """MixtralExperts holding the weights, on the routed tokens."""
    import torch
    from transformers import MixtralConfig
    from transformers.models.mixtral.modeling_mixtral import MixtralExperts

    gate_up, down = _torch(w_gate_up), _torch(w_down)
    config = MixtralConfig(
        hidden_size=gate_up.shape[2],
        intermediate_size=gate_up.shape[1] // 2,
        num_local_experts=gate_up.shape[0],
        hidden_act=activation,
    )
    config._experts_implementation = "eager"  # the Python loop over experts
    experts = MixtralExperts(config)
    experts.gate_up_proj = torch.nn.Parameter(gate_up, requires_grad=False)
    experts.down_proj = torch.nn.Parameter(down, requires_grad=False)
    with torch.no_grad():
        out = experts(_torch(hidden), _torch(topk_ids).long(), _torch(topk_weights))
    return _back(out, hidden)


# `hf_transformers.sampling` etc.: this module's functions named like the reference's ops.
__getattr__ = lazy_namespaces(__name__, globals(), ("sampling", "layers", "rope", "moe"), _hf)
