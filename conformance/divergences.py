"""The one registry of known divergences: where an implementation knowingly departs
from the specification, and why.

A property that fails for a (implementation, op, property) listed here is reported as
KNOWN DIVERGENCE with the reason, and does not fail the run. The property itself is
never loosened: the same check still fails every other implementation. A listed
divergence that no longer shows is reported too ("divergence not observed"), so the
registry cannot silently go stale.

`implementation` is the target name given to `python -m conformance` (the module name,
without the `.ops` suffix).
"""

from __future__ import annotations

from dataclasses import dataclass

from . import contract


@dataclass(frozen=True)
class Divergence:
    implementation: str
    op: str  # "module.op", e.g. "sampling.apply_top_p"
    property: str  # the property name, e.g. "keeps_tied_tokens_together"
    reason: str


HF = "conformance.adapters.hf_transformers"

# Why Hugging Face transformers differs (transformers/generation/logits_process.py).
_HF_T0 = (
    "TemperatureLogitsWarper(0.0) raises ValueError ('has to be a strictly positive float'): "
    "HF expresses a greedy row as do_sample=False, not as temperature 0"
)
_HF_K_NEGATIVE = (
    "generate() leaves top-k out only for top_k == 0; a negative top_k reaches "
    "TopKLogitsWarper, which raises ValueError instead of disabling the filter"
)
_HF_P_TIES = (
    "TopPLogitsWarper cuts the sorted order at a position (ascending cumsum <= 1 - top_p is "
    "removed), so tokens tied at the boundary are split, even tokens tied for the max"
)
_HF_P_FLOAT32 = (
    "TopPLogitsWarper takes softmax and cumsum in the logits' dtype and compares with the "
    "float64 1 - top_p: float32 rounding (~1e-7) decides tokens outside the 1e-9 band"
)
_HF_MIN_P_FLOAT32 = (
    "MinPLogitsWarper compares probs < min_p * max(probs) with softmax in the logits' dtype: "
    "float32 rounding (~1e-7) decides tokens outside the 1e-9 band of the float64 rule"
)
_HF_NO_FREQ = (
    "transformers has no frequency or presence penalty (OpenAI/vLLM parameters): the "
    "adapter raises NotImplementedError when one is non-zero"
)
_HF_BIAS_FLOAT32 = (
    "SequenceBiasLogitsProcessor keeps the biases in a float32 tensor: a float64 bias is "
    "rounded to float32 before it is added"
)
_HF_BIAS_DUPLICATES = (
    "SequenceBiasLogitsProcessor turns the (tokens, bias) list into a dict: a token listed "
    "twice gets its last bias, not the sum"
)
_HF_NO_VALIDATION = (
    "HF processors validate only their scalar parameter: integer logits are processed (or "
    "fail inside torch with RuntimeError/NotImplementedError), NaN/+inf logits pass through"
)


# Why transformers' Llama modeling code differs (modeling_llama.py, modeling_rope_utils.py).
_HF_RMS_FLOAT32 = (
    "LlamaRMSNorm always normalises in float32 (hidden_states.to(torch.float32)), so float64 "
    "input is rounded to float32 first; the contract computes float64 input in float64"
)
_HF_MODEL_NO_VALIDATION = (
    "the modeling code validates nothing: integer or mis-shaped inputs run until torch "
    "fails (RuntimeError/NotImplementedError) or broadcast silently, and bad RoPE "
    "parameters (odd rotary_dim, unknown type, missing factor) are accepted or raise "
    "KeyError"
)


def _hf_model(module_op: str, prop: str, reason: str) -> Divergence:
    return Divergence(HF, module_op, prop, reason)


ACCEL = "pyagent_accel"
_ACCEL_STRIDES = (
    "pyagent_accel reads the vocab axis of logits as one contiguous slice and raises "
    "ValueError for a non-unit stride there (every other column, column-major) instead of "
    "copying: the Foundation issue asks the accelerator to reject non-contiguous input, never "
    "to copy it silently; padded rows (a row stride larger than the vocab) are accepted"
)
_ACCEL_STRIDED_OPS = contract.ops_taking("sampling", "logits", "logprobs")


def _hf(op: str, prop: str, *reasons: str) -> Divergence:
    return Divergence(HF, f"sampling.{op}", prop, "; ".join(reasons))


DIVERGENCES: tuple[Divergence, ...] = (
    _hf("apply_temperature", "zero_temperature_rows_unchanged", _HF_T0),
    _hf("apply_temperature", "matches_reference", _HF_T0),
    _hf(
        "apply_temperature",
        "rejects_invalid_input",
        _HF_NO_VALIDATION,
        "an infinite temperature is accepted (the check is only t > 0)",
    ),
    _hf("apply_top_k", "disabled_when_k_out_of_range", _HF_K_NEGATIVE),
    _hf("apply_top_k", "matches_reference", _HF_K_NEGATIVE),
    _hf("apply_top_k", "rejects_invalid_input", _HF_NO_VALIDATION),
    _hf("apply_top_p", "keeps_most_likely_token", _HF_P_TIES),
    _hf("apply_top_p", "keeps_tied_tokens_together", _HF_P_TIES),
    _hf("apply_top_p", "follows_cumulative_mass_rule", _HF_P_TIES, _HF_P_FLOAT32),
    _hf("apply_top_p", "decides_near_p_in_float64", _HF_P_FLOAT32),
    _hf("apply_top_p", "kept_mass_reaches_p", _HF_P_FLOAT32),
    _hf("apply_top_p", "kept_set_is_minimal", _HF_P_FLOAT32),
    _hf("apply_top_p", "matches_reference", _HF_P_TIES, _HF_P_FLOAT32),
    _hf(
        "apply_top_p",
        "rejects_invalid_input",
        _HF_NO_VALIDATION,
        "top_p == 0 is accepted and p > 1 never reaches the warper (generate() skips p >= 1)",
    ),
    _hf("apply_min_p", "decides_near_threshold_in_float64", _HF_MIN_P_FLOAT32),
    _hf("apply_min_p", "masks_exactly_below_threshold", _HF_MIN_P_FLOAT32),
    _hf("apply_min_p", "matches_reference", _HF_MIN_P_FLOAT32),
    _hf("apply_min_p", "rejects_invalid_input", _HF_NO_VALIDATION),
    _hf("apply_penalties", "unseen_tokens_unchanged", _HF_NO_FREQ),
    _hf("apply_penalties", "frequency_and_presence_formula", _HF_NO_FREQ),
    _hf("apply_penalties", "penalties_are_applied_in_order", _HF_NO_FREQ),
    _hf("apply_penalties", "padding_and_id_order_do_not_matter", _HF_NO_FREQ),
    _hf("apply_penalties", "does_not_modify_inputs", _HF_NO_FREQ),
    _hf("apply_penalties", "returns_array_like_input", _HF_NO_FREQ),
    _hf("apply_penalties", "accepts_strided_input", _HF_NO_FREQ),
    _hf("apply_penalties", "matches_reference", _HF_NO_FREQ),
    _hf(
        "apply_penalties",
        "rejects_invalid_input",
        _HF_NO_VALIDATION,
        "ids >= vocab are clamped and ignored instead of rejected; an infinite penalty is accepted",
    ),
    _hf("apply_logit_bias", "adds_bias_in_float64", _HF_BIAS_FLOAT32),
    _hf("apply_logit_bias", "duplicate_ids_add_up", _HF_BIAS_DUPLICATES),
    _hf("apply_logit_bias", "matches_reference", _HF_BIAS_FLOAT32, _HF_BIAS_DUPLICATES),
    _hf(
        "apply_logit_bias",
        "rejects_invalid_input",
        _HF_NO_VALIDATION,
        "NaN and infinite biases are accepted",
    ),
    _hf("log_softmax", "rejects_invalid_input", _HF_NO_VALIDATION),
    *(
        _hf_model("layers.rms_norm", prop, _HF_RMS_FLOAT32)
        for prop in ("matches_the_formula", "unit_rms_before_the_weight", "matches_reference")
    ),
    *(
        _hf_model(op, "rejects_invalid_input", _HF_MODEL_NO_VALIDATION)
        for op in (
            "layers.rms_norm",
            "layers.silu_and_mul",
            "rope.rope_inv_freq",
            "rope.apply_rope",
        )
    ),
    *(
        Divergence(ACCEL, f"sampling.{op}", "accepts_strided_input", _ACCEL_STRIDES)
        for op in _ACCEL_STRIDED_OPS
    ),
)


def lookup(implementation: str, op: str, prop: str) -> Divergence | None:
    """The registered divergence for (implementation, "module.op", property), if any."""
    for d in DIVERGENCES:
        if d.implementation == implementation and d.op == op and d.property == prop:
            return d
    return None


def for_implementation(implementation: str) -> list[Divergence]:
    """Every divergence registered for `implementation`."""
    return [d for d in DIVERGENCES if d.implementation == implementation]
