"""vLLM's own sampling, layer and prefix-cache hashing functions behind the pyagent op signatures.

    python -m conformance conformance.adapters.vllm

vLLM installs from PyPI without a GPU (`nox -s vllm` builds such an environment:
`pip install --no-deps vllm==<pinned>` plus the pure-Python packages these modules
import). The adapter runs vLLM's CPU code paths: it sets `VLLM_TARGET_DEVICE=cpu`
(unless set) before importing vLLM, so `current_platform` is the CPU platform and
`apply_top_k_top_p` takes its PyTorch path (the Triton kernel is vLLM's GPU path).
Nothing of vLLM is stubbed; modules that need the CUDA extension `vllm._C` are not used.

Every per-row parameter first goes through `SamplingParams.from_optional`, the
constructor vLLM's OpenAI-compatible server builds requests with (its validation, its
clamping), and then into a tensor the way `v1/worker/gpu_input_batch.py` stores it
(float32 parameters, int32 top-k, "disabled" rows as InputBatch encodes them, `None`
when no row of the batch uses the filter). `sampling` (built on first access, which
imports vLLM) provides:

    apply_temperature  Sampler.apply_temperature           greedy rows (t < 1e-5) stored as 0,
                                                           all_random = no greedy row
    apply_top_k        apply_top_k_top_p(logits, k, None)  k outside (0, vocab) -> vocab
    apply_top_p        apply_top_k_top_p(logits, None, p)
    apply_min_p        MinPLogitsProcessor.apply           after update_state(BatchUpdate)
    apply_penalties    apply_all_penalties                 prompt padded with vocab (vLLM's
                                                           pad), output ids as lists; skipped
                                                           when no row has a penalty
    apply_logit_bias   LogitBiasLogitsProcessor.apply      per-row dict {id: bias}, checked by
                                                           SamplingParams._validate_logit_bias
    log_softmax        Sampler.compute_logprobs
    topk_logprobs      Sampler.gather_logprobs             column 0 (the sampled token) split off

`layers` (built on first access too) provides vLLM's PyTorch-native layer code, what its
CustomOps run where no kernel is registered:

    rms_norm      vllm.ir.ops.rms_norm(x, weight, eps) (RMSNorm.forward_native); with a
                  residual, vllm.ir.ops.fused_add_rms_norm, returning (normed, x + residual)
    silu_and_mul  SiluAndMul.forward_native

`hashing` provides:

    cbor_encode   cbor2.dumps(value, canonical=True), the serialization of vLLM's
                  sha256_cbor / xxhash_cbor (vLLM has no encoder of its own)
    root_hash     kv_cache_utils.NONE_HASH after init_none_hash(hash_fn)
    hash_block    kv_cache_utils.hash_block_tokens(hash_fn, parent, tokens, keys or None)
    hash_blocks   get_request_block_hasher(block_size, hash_fn) on a vllm.v1.request.Request
                  with these prompt tokens, block_size and algorithm checked by CacheConfig; a
                  parent is put in NONE_HASH (the parent of a request's first block) for the
                  call; vLLM derives a block's extra keys from the request (LoRA, multimodal
                  features, cache salt), so a per-block list raises NotImplementedError

with the algorithm names mapped to vLLM's CBOR hash functions: "sha256" -> sha256_cbor,
"xxh3_128" -> xxhash_cbor (vLLM's default "sha256" pickles the tuple instead, which no other
language reproduces). `init_none_hash` runs once per algorithm, as once per vLLM process
with that `prefix_caching_hash_algo`.

The glue converts arrays to torch tensors (and numpy results back), clones the logits
(vLLM's functions work in place on the sampler's own buffer) and turns padded id arrays
into vLLM's conventions. It validates nothing itself: what vLLM accepts or rejects is what
is tested. `philox_uniform`, `sample`, the `block_table`, `rope` and `attention` ops, and the
`ALGORITHMS` / `DIGEST_SIZES` constants are declared in CONFORMANCE_MISSING.
"""

from __future__ import annotations

import functools
import logging
import os
from types import SimpleNamespace
from typing import Any

import numpy as np

from . import lazy_namespaces

CONFORMANCE_MISSING = {
    "sampling.apply_typical_p": "vLLM has no typical sampling (a transformers warper)",
    "sampling.apply_epsilon_cutoff": "vLLM has no epsilon sampling (a transformers warper)",
    "sampling.apply_eta_cutoff": "vLLM has no eta sampling (a transformers warper)",
    "sampling.apply_no_repeat_ngram": "vLLM has no no-repeat n-gram filter (a transformers one)",
    "sampling.apply_dry": (
        "vLLM has no DRY penalty (llama.cpp's and koboldcpp's; third-party logits-processor "
        "plugins only)"
    ),
    "sampling.apply_xtc": "vLLM has no XTC sampler (third-party logits-processor plugins only)",
    "sampling.apply_mirostat": "vLLM has no mirostat (a llama.cpp sampler)",
    "sampling.mirostat_update": "vLLM has no mirostat (a llama.cpp sampler)",
    "sampling.apply_allowed_token_ids": (
        "not wrapped yet: vLLM masks allowed_token_ids inside Sampler.apply_logits_processors "
        "with a mask InputBatch builds per request"
    ),
    "sampling.apply_bad_words": (
        "not wrapped yet: vllm.v1.sample.ops.bad_words.apply_bad_words takes Python lists per "
        "request (the output ids, the tokenized words) inside the sampler"
    ),
    "sampling.philox_uniform": (
        "vLLM draws from torch generators (the global one, or a torch.Generator per seeded "
        "request), not from a counter-based generator"
    ),
    "sampling.sample": (
        "vLLM's random_sample divides probs by exponential noise from a stateful "
        "torch.Generator per seeded request: the draw depends on how many draws the "
        "generator made before, not on (seed, position)"
    ),
    "hashing.ALGORITHMS": (
        "vLLM names its algorithms sha256, sha256_cbor, xxhash, xxhash_cbor "
        "(CacheConfig.prefix_caching_hash_algo); the adapter maps sha256 -> sha256_cbor and "
        "xxh3_128 -> xxhash_cbor"
    ),
    "hashing.DIGEST_SIZES": "vLLM has no such table (see hashing.ALGORITHMS)",
    "block_table.*": (
        "vLLM computes slot mappings in a Triton kernel of the model runner's stateful "
        "BlockTable (GPU only), and positions and logits indices inline in "
        "GPUModelRunner._prepare_inputs: there is no CPU function with these signatures"
    ),
    "rope.*": (
        "not wrapped yet: vLLM's RotaryEmbedding classes compute inv_freq and the cos/sin cache "
        "in their constructor (a CustomOp that needs a VllmConfig context)"
    ),
    "attention.*": "vLLM's attention backends are CUDA/Triton kernels (no CPU function)",
    "pooling.*": (
        "not wrapped yet: vLLM's poolers are nn.Modules built from a model's PoolerConfig, "
        "reading its pooling metadata (no stateless function with these signatures)"
    ),
    "tokenize.*": (
        "vLLM encodes with the tokenizers library (conformance.adapters.hf_tokenizers); its "
        "stop strings and detokenizer are compared in tests/conformance/test_vllm_adapter.py"
    ),
}

VERSION: str | None = None

# Our algorithm names -> vLLM's names for the same hash over canonical CBOR.
HASH_FUNCTIONS = {"sha256": "sha256_cbor", "xxh3_128": "xxhash_cbor"}


def _vllm() -> Any:
    """Import vLLM for its CPU platform, or raise an ImportError that says how to install it."""
    global VERSION
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    log = logging.getLogger("vllm")
    if log.level == logging.NOTSET and not log.handlers:
        log.setLevel(logging.ERROR)  # a warning per small temperature would flood the report
    try:
        import vllm
        from vllm.v1.core import kv_cache_utils  # noqa: F401
        from vllm.v1.sample import sampler  # noqa: F401 - the modules the ops need import
    except ImportError as exc:
        raise ImportError(
            "conformance.adapters.vllm needs vLLM and its pure-Python dependencies: "
            f"run `nox -s vllm`, or see the vllm session in noxfile.py ({exc})"
        ) from exc
    VERSION = f"vllm {vllm.__version__}"
    return vllm


# --- conversions ------------------------------------------------------------------------


def _torch(x: Any) -> Any:
    import torch

    return x if isinstance(x, torch.Tensor) else torch.as_tensor(np.asarray(x))


def _back(out: Any, like: Any) -> Any:
    """The result in the library of `like` (numpy in, numpy out)."""
    return out.numpy() if isinstance(like, np.ndarray) else out


def _logits(logits: Any) -> Any:
    """A private copy of the logits: vLLM's functions overwrite the sampler's buffer."""
    return _torch(logits).clone()


def _per_row(values: Any, batch: int, name: str) -> list[Any]:
    """One Python number per row (ValueError if there is not exactly one per row)."""
    flat = _torch(values).tolist() if hasattr(values, "dtype") else list(values)
    if not isinstance(flat, list) or len(flat) != batch or any(isinstance(v, list) for v in flat):
        raise ValueError(f"{name} must have one entry per row ({batch}), got {values!r}")
    return flat


def _rows(ids: Any, batch: int, name: str) -> list[list[int]]:
    """Each row's ids with the padding (negative entries) removed, as vLLM's lists."""
    t = _torch(ids)
    if t.ndim != 2 or len(t) != batch:
        raise ValueError(f"{name} must have {batch} rows, got shape {tuple(t.shape)}")
    return [[v for v in row if v >= 0] for row in t.tolist()]


def _params(**kwargs: Any) -> Any:
    """One row's SamplingParams, built as the OpenAI-compatible server builds them."""
    from vllm import SamplingParams

    return SamplingParams.from_optional(**kwargs)


def _float32(values: list[float]) -> Any:
    """Per-row parameters as InputBatch stores them (float32)."""
    import torch

    return torch.tensor(values, dtype=torch.float32)


def _batch_update(rows: list[Any]) -> Any:
    """The BatchUpdate announcing a batch of new requests, one SamplingParams per row."""
    from vllm.v1.sample.logits_processor.interface import BatchUpdate

    added = [(i, params, None, []) for i, params in enumerate(rows)]
    return BatchUpdate(batch_size=len(rows), removed=[], added=added, moved=[])


@functools.lru_cache(maxsize=8)
def _config(max_num_seqs: int) -> Any:
    """A default VllmConfig whose scheduler holds `max_num_seqs` requests (MinP sizes by it)."""
    from vllm.config import SchedulerConfig, VllmConfig

    scheduler = SchedulerConfig(
        max_num_seqs=max(max_num_seqs, 1), max_model_len=8192, is_encoder_decoder=False
    )
    return VllmConfig(scheduler_config=scheduler)


# --- sampling ---------------------------------------------------------------------------


def apply_temperature(logits: Any, temperature: Any) -> Any:
    """Sampler.apply_temperature; greedy rows (temperature < 1e-5) are stored as 0."""
    from vllm.sampling_params import SamplingType
    from vllm.v1.sample.sampler import Sampler

    rows = [_params(temperature=t) for t in _per_row(temperature, len(logits), "temperature")]
    greedy = [p.sampling_type == SamplingType.GREEDY for p in rows]
    temp = _float32([0.0 if g else p.temperature for p, g in zip(rows, greedy, strict=True)])
    out = Sampler.apply_temperature(_logits(logits), temp, all_random=not any(greedy))
    return _back(out, logits)


def apply_top_k(logits: Any, k: Any) -> Any:
    """apply_top_k_top_p(logits, k, None); InputBatch stores k outside (0, vocab) as vocab."""
    import torch
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p

    vocab = _torch(logits).shape[-1]
    rows = [_params(top_k=v) for v in _per_row(k, len(logits), "k")]
    ks = [p.top_k if 0 < p.top_k < vocab else vocab for p in rows]
    if all(v == vocab for v in ks):  # no row has top-k: the sampler passes k=None
        return _back(_logits(logits), logits)
    out = apply_top_k_top_p(_logits(logits), torch.tensor(ks, dtype=torch.int32), None)
    return _back(out, logits)


def apply_top_p(logits: Any, p: Any) -> Any:
    """apply_top_k_top_p(logits, None, p), p stored in float32."""
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p

    rows = [_params(top_p=v) for v in _per_row(p, len(logits), "p")]
    if all(r.top_p >= 1 for r in rows):  # no row has top-p: the sampler passes p=None
        return _back(_logits(logits), logits)
    out = apply_top_k_top_p(_logits(logits), None, _float32([r.top_p for r in rows]))
    return _back(out, logits)


def apply_min_p(logits: Any, min_p: Any) -> Any:
    """MinPLogitsProcessor for a batch of new requests, then its apply()."""
    import torch
    from vllm.v1.sample.logits_processor.builtin import MinPLogitsProcessor

    rows = [_params(min_p=v) for v in _per_row(min_p, len(logits), "min_p")]
    processor = MinPLogitsProcessor(_config(len(rows)), torch.device("cpu"), is_pin_memory=False)
    processor.update_state(_batch_update(rows))
    return _back(processor.apply(_logits(logits)), logits)


def apply_penalties(
    logits: Any,
    prompt_ids: Any,
    output_ids: Any,
    repetition_penalty: Any,
    frequency_penalty: Any,
    presence_penalty: Any,
) -> Any:
    """apply_all_penalties, the prompt padded with vocab (vLLM's pad), outputs as lists."""
    import torch
    from vllm.utils.torch_utils import make_tensor_with_pad
    from vllm.v1.sample.ops.penalties import apply_all_penalties

    scores = _logits(logits)
    batch, vocab = scores.shape
    r = _per_row(repetition_penalty, batch, "repetition_penalty")
    f = _per_row(frequency_penalty, batch, "frequency_penalty")
    q = _per_row(presence_penalty, batch, "presence_penalty")
    rows = [
        _params(repetition_penalty=a, frequency_penalty=b, presence_penalty=c)
        for a, b, c in zip(r, f, q, strict=True)
    ]
    prompts = _rows(prompt_ids, batch, "prompt_ids")
    outputs = _rows(output_ids, batch, "output_ids")
    if all(
        p.repetition_penalty == 1 and p.frequency_penalty == 0 and p.presence_penalty == 0
        for p in rows
    ):  # InputBatch.no_penalties: the sampler does not call apply_all_penalties
        return _back(scores, logits)
    prompt = make_tensor_with_pad(prompts, pad=vocab, dtype=torch.int64)
    out = apply_all_penalties(
        scores,
        prompt.reshape(batch, -1),
        _float32([p.presence_penalty for p in rows]),
        _float32([p.frequency_penalty for p in rows]),
        _float32([p.repetition_penalty for p in rows]),
        outputs,
    )
    return _back(out, logits)


def apply_logit_bias(logits: Any, token_ids: Any, bias: Any) -> Any:
    """LogitBiasLogitsProcessor for a batch of new requests, each with a {token: bias} dict."""
    import torch
    from vllm.v1.sample.logits_processor.builtin import LogitBiasLogitsProcessor

    scores = _logits(logits)
    batch, vocab = scores.shape
    ids, weights = _torch(token_ids), _torch(bias)
    if len(ids) != batch or len(weights) != batch:
        raise ValueError(f"token_ids and bias must have {batch} rows")
    rows = []
    for b in range(batch):
        pairs = zip(ids[b].tolist(), weights[b].tolist(), strict=True)
        params = _params(logit_bias={t: w for t, w in pairs if t >= 0} or None)
        # SamplingParams.verify's vocabulary check, which reads only this of the ModelConfig
        params._validate_logit_bias(SimpleNamespace(get_vocab_size=lambda: vocab))
        rows.append(params)
    processor = LogitBiasLogitsProcessor(None, torch.device("cpu"), is_pin_memory=False)
    processor.update_state(_batch_update(rows))
    return _back(processor.apply(scores), logits)


def log_softmax(logits: Any) -> Any:
    """Sampler.compute_logprobs: log_softmax in float32."""
    from vllm.v1.sample.sampler import Sampler

    return _back(Sampler.compute_logprobs(_torch(logits)), logits)


def topk_logprobs(logprobs: Any, num: int, sampled: Any) -> Any:
    """Sampler.gather_logprobs; its column 0 is the sampled token, the others the top `num`."""
    import torch
    from vllm.v1.sample.sampler import Sampler

    lp = _torch(logprobs)
    got = Sampler.gather_logprobs(lp, num, token_ids=_torch(sampled).to(torch.int64))
    ids, values, ranks = got.logprob_token_ids, got.logprobs, got.selected_token_ranks
    return tuple(_back(x, logprobs) for x in (values[:, 1:], ids[:, 1:], values[:, 0], ranks))


# --- layers -----------------------------------------------------------------------------


def rms_norm(x: Any, weight: Any, eps: float, residual: Any = None) -> Any:
    """vllm.ir.ops.rms_norm, or fused_add_rms_norm with a residual (RMSNorm.forward_native)."""
    from vllm import ir

    if residual is None:
        return _back(ir.ops.rms_norm(_torch(x), _torch(weight), eps, None), x)
    out, h = ir.ops.fused_add_rms_norm(_torch(x), _torch(residual), _torch(weight), eps, None)
    return _back(out, x), _back(h, x)


def silu_and_mul(x: Any) -> Any:
    """SiluAndMul.forward_native: silu(x[..., :d]) * x[..., d:]."""
    from vllm.model_executor.layers.activation import SiluAndMul

    return _back(SiluAndMul.forward_native(_torch(x)), x)


# --- hashing ----------------------------------------------------------------------------

_ROOTS: dict[str, bytes] = {}  # NONE_HASH per algorithm, computed once (as once per process)


def _hash_fn(algorithm: str) -> Any:
    """vLLM's hash function for one of our algorithm names (other names are given to vLLM
    as they are); sets kv_cache_utils.NONE_HASH for it."""
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core import kv_cache_utils

    name = HASH_FUNCTIONS.get(algorithm, algorithm)
    fn = get_hash_fn_by_name(name)
    if name not in _ROOTS:
        kv_cache_utils.init_none_hash(fn)
        _ROOTS[name] = kv_cache_utils.NONE_HASH
    kv_cache_utils.NONE_HASH = _ROOTS[name]
    return fn


def _tokens(token_ids: Any) -> Any:
    """Arrays become the Python int lists vLLM's requests hold; anything else is passed on."""
    if hasattr(token_ids, "tolist") and hasattr(token_ids, "dtype"):
        return token_ids.tolist()
    return token_ids


def cbor_encode(value: Any) -> bytes:
    """cbor2.dumps(value, canonical=True): what vLLM's *_cbor hash functions hash."""
    import cbor2

    return cbor2.dumps(value, canonical=True)


def root_hash(algorithm: str = "sha256") -> bytes:
    """kv_cache_utils.NONE_HASH, set by init_none_hash for the algorithm's hash function."""
    from vllm.v1.core import kv_cache_utils

    _hash_fn(algorithm)
    return kv_cache_utils.NONE_HASH


def hash_block(
    parent_hash: bytes, token_ids: Any, extra_keys: Any = (), algorithm: str = "sha256"
) -> bytes:
    """hash_block_tokens; no extra keys is None, as generate_block_hash_extra_keys returns."""
    from vllm.v1.core.kv_cache_utils import hash_block_tokens

    fn = _hash_fn(algorithm)
    keys = tuple(extra_keys) if extra_keys else None
    return hash_block_tokens(fn, parent_hash, _tokens(token_ids), keys)


def hash_blocks(
    token_ids: Any,
    block_size: int,
    extra_keys: Any = None,
    algorithm: str = "sha256",
    parent: bytes | None = None,
) -> list[bytes]:
    """The block hasher of a vLLM Request whose prompt is `token_ids`; a parent becomes the
    NONE_HASH the request's chain starts from, for this call."""
    from vllm.config import CacheConfig
    from vllm.v1.core import kv_cache_utils
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher
    from vllm.v1.request import Request

    if extra_keys is not None and any(extra_keys):
        raise NotImplementedError(
            "vLLM derives a block's extra keys from the request (LoRA, multimodal features, "
            "cache salt); it takes no per-block list"
        )
    # EngineCore builds the hasher from its CacheConfig, which validates both settings.
    config = CacheConfig(
        block_size=block_size, prefix_caching_hash_algo=HASH_FUNCTIONS.get(algorithm, algorithm)
    )
    fn = _hash_fn(config.prefix_caching_hash_algo)
    if parent is not None:
        kv_cache_utils.NONE_HASH = parent
    try:
        request = Request(
            request_id="conformance",
            prompt_token_ids=list(_tokens(token_ids)),
            sampling_params=_params(max_tokens=1),
            pooling_params=None,
            block_hasher=get_request_block_hasher(config.block_size, fn),
        )
    finally:
        _hash_fn(config.prefix_caching_hash_algo)  # NONE_HASH back to the algorithm's root
    return list(request.block_hashes)


# `vllm.sampling` etc.: this module's functions named like the reference's ops.
__getattr__ = lazy_namespaces(__name__, globals(), ("sampling", "layers", "hashing"), _vllm)
