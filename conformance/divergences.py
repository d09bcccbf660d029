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
_HF_WARPERS_FLOAT32 = (
    "TypicalLogitsWarper, EpsilonLogitsWarper and EtaLogitsWarper take log_softmax, the "
    "entropy and the cumulative masses in the logits' dtype: float32 rounding (~1e-7) decides "
    "tokens outside the 1e-9 band of the float64 rule"
)
_HF_ETA_FLOAT32 = (
    "EtaLogitsWarper keeps eta in a float32 tensor (torch.tensor(epsilon)), so the threshold "
    "is computed from eta rounded to float32 (~6e-8 relative) even for float64 logits"
)
_HF_ALLOWED_FORCED = (
    "PrefixConstrainedLogitsProcessor forces a row's allowed tokens to logit 0 when all of "
    "them are already -inf ('so the constraint holds'); the contract leaves them -inf, the row "
    "entirely masked, and does not invent logits"
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

_HF_ROUTER_DTYPE = (
    "Qwen3MoeTopKRouter returns the weights in the router logits' dtype (float16 for float16 "
    "logits, rounded after the float32 softmax) and takes the softmax in float32 even for "
    "float64 logits; the contract returns float32 (float64 for float64 logits)"
)
_HF_ROUTER_TIES = (
    "the routers choose with torch.topk, which orders tied scores arbitrarily (not by the "
    "lower expert id)"
)
_HF_EXPERTS_HALF = (
    "MixtralExperts computes in the weights' dtype: float16 experts round the projections, "
    "the activation and the products to float16, where the contract computes in float32 and "
    "rounds once"
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


VLLM = "conformance.adapters.vllm"

# Why vLLM differs (vllm/sampling_params.py, vllm/v1/sample/, vllm/v1/core/kv_cache_utils.py).
_V_TEMPERATURE = (
    "SamplingParams accepts temperatures in [0, 2] only (VLLMValidationError above 2) and raises a "
    "temperature in (0, 0.01) to 0.01, so most drawn temperatures never reach the division"
)
_V_TEMPERATURE_FLOAT32 = (
    "InputBatch stores the temperature in float32: float64 logits are divided by the rounded value"
)
_V_K_NEGATIVE = (
    "SamplingParams rejects top_k < -1 (VLLMValidationError): only 0 and -1 disable top-k, where "
    "the specification disables the filter for every k <= 0"
)
_V_P_TIES = (
    "apply_top_k_top_p sorts ascending and masks the positions whose cumulative softmax is <= 1 - p"
    " (keeping the last): the cut is a position, so tokens tied at the boundary are split, even "
    "tokens tied for the max"
)
_V_P_FLOAT32 = (
    "InputBatch stores p in float32 and the softmax and cumsum run in the logits' dtype: float32 "
    "rounding (~1e-7) decides tokens outside the 1e-9 band"
)
_V_MIN_P_FLOAT32 = (
    "MinPLogitsProcessor keeps min_p in a float32 tensor and compares probs < min_p * max(probs) "
    "with softmax in the logits' dtype: float32 rounding (~1e-7) decides tokens outside the 1e-9 "
    "band of the float64 rule"
)
_V_PENALTIES_FLOAT32 = (
    "InputBatch stores the three penalties in float32 and the repetition penalty multiplies by 1 / "
    "r: on float64 logits the result is off by the float32 rounding of r, f and q (~1e-8)"
)
_V_BIAS_FLOAT32 = (
    "LogitBiasLogitsProcessor keeps the biases in a float32 tensor: a float64 bias is rounded to "
    "float32 before it is added"
)
_V_BIAS_DICT = (
    "a request's logit_bias is a dict {token: bias} (OpenAI's JSON object), so a token cannot be "
    "listed twice: the adapter's dict keeps the last bias, not the sum"
)
_V_LOGPROBS_FLOAT32 = (
    "Sampler.compute_logprobs is log_softmax(dtype=float32): float64 logits give float32 logprobs"
)
_V_TOPK_TIES = (
    "gather_logprobs takes torch.topk, which orders tied logprobs arbitrarily (not by lower id)"
)
_V_RANK_TIES = (
    "the rank is batched_count_greater_than(logprobs, sampled), which counts logprobs >= the "
    "sampled one: tied tokens share the worst rank (2 for two tokens tied for the max), not the "
    "best"
)
_V_INT32_IDS = "gather_logprobs returns the token ids as int32 ('to reduce the tensor size')"
_V_NO_VALIDATION = (
    "vLLM validates a request's parameters (SamplingParams raises VLLMValidationError, which is not"
    " a ValueError) and nothing in its sampling functions: integer logits are processed or fail "
    "inside torch (RuntimeError), NaN and +inf logits pass through"
)
_V_CBOR2 = (
    "vLLM serializes with cbor2.dumps(canonical=True), which encodes bools, floats, None, dicts and"
    " integers beyond 64 bits (as bignum tags) where the specification's encoding raises"
)
_V_ROOT = (
    "NONE_HASH is hash_fn('vllm-none-hash'), the CBOR of another label than the specification's "
    "'pyagent.prefix-cache.v1', and for xxhash_cbor a random per-process seed unless PYTHONHASHSEED"
    " is set"
)
_V_NULL_KEYS = (
    "vLLM hashes (parent, tokens, extra_keys) with extra_keys None when a block has none: CBOR null"
    " (0xf6) where the specification encodes an empty array (0x80), while blocks with keys hash "
    "alike"
)
_V_HASH_NO_VALIDATION = (
    "hash_block_tokens validates nothing: a str parent or one of any length (an empty one means "
    "NONE_HASH), negative or float tokens and unknown key tags are all hashed"
)
_V_NO_BLOCK_KEYS = (
    "vLLM derives a block's extra keys from the request (LoRA, multimodal features, cache salt) and"
    " takes no per-block list: the adapter raises NotImplementedError for one"
)
_V_CACHE_CONFIG = (
    "CacheConfig (pydantic) coerces a block_size of 4.0 or True to an int instead of raising "
    "TypeError"
)
_V_RMS_FLOAT32 = (
    "vllm.ir.ops.rms_norm and fused_add_rms_norm normalise in float32 whatever the input dtype, so "
    "float64 input is rounded to float32 first, where the contract computes float64 input in "
    "float64"
)
_V_RESIDUAL_FLOAT32 = (
    "fused_add_rms_norm adds x + residual in float32 and returns that sum cast back to x's dtype, "
    "so a float64 residual stream is rounded to float32 (2.8e-170 becomes 0)"
)
_V_LAYERS_NO_VALIDATION = (
    "vLLM's layer code validates nothing: integer inputs run or fail inside torch "
    "(NotImplementedError), and mis-shaped ones broadcast or fail there"
)

# Stop strings and the detokenizer are not ops: tests/conformance/test_vllm_adapter.py compares
# pyagent_ref.tokenize with vLLM's check_stop_strings and IncrementalDetokenizer differentially,
# and every difference it finds must be one of these.
_V_STOP_TIES = (
    "check_stop_strings picks the stop string that ends first and breaks ties by stop-list order: "
    "for stop ['b', 'ab'] and text 'ab' vLLM stops at 'b' (output 'a'), the specification at the "
    "longest, 'ab', which starts first (output '')"
)
_V_STOP_HOLD_BACK = (
    "vLLM holds back max(len(s) for s in stop) - 1 characters of streamed text whatever they are, "
    "where the specification holds back only a suffix that may still start a stop string (same "
    "final text)"
)
_V_DETOK_INCOMPLETE_END = (
    "tokenizers' DecodeStream never emits the bytes of an incomplete character, so an output ending"
    " inside one loses them, where the specification's finish() returns them as U+FFFD, as a full "
    "decode"
)
_V_DETOK_PROMPT_SPLIT = (
    "DecodeStream is primed with the whole prompt: a character split between prompt and output is "
    "emitted whole in the output (or the prompt's bytes as U+FFFD), where the specification drops a"
    " context ending inside a character and decodes the output alone"
)
_V_DETOK_SPACES = (
    "the fast detokenizer ignores spaces_between_special_tokens=True (kept special tokens are "
    "joined to their neighbours without a space), as pyagent_ref.tokenize's docstring notes"
)


def _v(op: str, prop: str, *reasons: str) -> Divergence:
    return Divergence(VLLM, op, prop, "; ".join(reasons))


# Reasons that an engine option removes. The ops keep pyagent's scheme (the properties are
# never loosened), but an engine started with prefix_caching_hash_algo="sha256_cbor" hashes
# its blocks as vLLM's sha256_cbor does (pyagent_ref/kv_cache/vllm_hashing.py: vLLM's
# seed as root, CBOR null for a block without keys, vLLM's untagged key shapes), checked
# byte for byte in tests/kv_cache/test_vllm_hashing.py, so for its block hashes and KV
# events these divergences do not exist.
REMOVED_BY_OPTION = {
    _V_ROOT: 'EngineConfig(prefix_caching_hash_algo="sha256_cbor")',
    _V_NULL_KEYS: 'EngineConfig(prefix_caching_hash_algo="sha256_cbor")',
}


def removed_by(divergence: Divergence) -> list[str]:
    """The options that remove (each reason of) `divergence`, if any."""
    return sorted(
        {REMOVED_BY_OPTION[r] for r in divergence.reason.split("; ") if r in REMOVED_BY_OPTION}
    )


_VLLM_DIVERGENCES = (
    *(
        _v("sampling.apply_temperature", prop, _V_TEMPERATURE)
        for prop in (
            "divides_by_temperature",
            "zero_temperature_rows_unchanged",
            "preserves_token_order",
            "does_not_modify_inputs",
            "returns_array_like_input",
            "accepts_strided_input",
        )
    ),
    _v("sampling.apply_temperature", "matches_reference", _V_TEMPERATURE, _V_TEMPERATURE_FLOAT32),
    _v("sampling.apply_temperature", "rejects_invalid_input", _V_NO_VALIDATION),
    _v("sampling.apply_top_k", "disabled_when_k_out_of_range", _V_K_NEGATIVE),
    _v("sampling.apply_top_k", "matches_reference", _V_K_NEGATIVE),
    _v("sampling.apply_top_k", "rejects_invalid_input", _V_NO_VALIDATION),
    _v("sampling.apply_top_p", "keeps_most_likely_token", _V_P_TIES),
    _v("sampling.apply_top_p", "keeps_tied_tokens_together", _V_P_TIES),
    _v("sampling.apply_top_p", "follows_cumulative_mass_rule", _V_P_TIES, _V_P_FLOAT32),
    _v("sampling.apply_top_p", "decides_near_p_in_float64", _V_P_FLOAT32),
    _v("sampling.apply_top_p", "kept_mass_reaches_p", _V_P_FLOAT32),
    _v("sampling.apply_top_p", "kept_set_is_minimal", _V_P_FLOAT32),
    _v("sampling.apply_top_p", "matches_reference", _V_P_TIES, _V_P_FLOAT32),
    _v("sampling.apply_top_p", "rejects_invalid_input", _V_NO_VALIDATION),
    _v("sampling.apply_min_p", "decides_near_threshold_in_float64", _V_MIN_P_FLOAT32),
    _v("sampling.apply_min_p", "masks_exactly_below_threshold", _V_MIN_P_FLOAT32),
    _v("sampling.apply_min_p", "matches_reference", _V_MIN_P_FLOAT32),
    _v("sampling.apply_min_p", "rejects_invalid_input", _V_NO_VALIDATION),
    *(
        _v("sampling.apply_penalties", prop, _V_PENALTIES_FLOAT32)
        for prop in (
            "repetition_penalty_formula",
            "frequency_and_presence_formula",
            "penalties_are_applied_in_order",
            "matches_reference",
        )
    ),
    _v("sampling.apply_penalties", "rejects_invalid_input", _V_NO_VALIDATION),
    _v("sampling.apply_logit_bias", "adds_bias_in_float64", _V_BIAS_FLOAT32),
    _v("sampling.apply_logit_bias", "duplicate_ids_add_up", _V_BIAS_DICT),
    _v("sampling.apply_logit_bias", "matches_reference", _V_BIAS_FLOAT32, _V_BIAS_DICT),
    _v("sampling.apply_logit_bias", "rejects_invalid_input", _V_NO_VALIDATION),
    *(
        _v("sampling.log_softmax", prop, _V_LOGPROBS_FLOAT32)
        for prop in (
            "rows_logsumexp_to_zero",
            "matches_log_of_softmax",
            "matches_reference",
            "returns_array_like_input",
        )
    ),
    _v("sampling.log_softmax", "rejects_invalid_input", _V_NO_VALIDATION),
    _v("sampling.topk_logprobs", "top_entries_in_order", _V_TOPK_TIES),
    _v("sampling.topk_logprobs", "sampled_logprob_and_rank", _V_RANK_TIES),
    _v("sampling.topk_logprobs", "returns_documented_types", _V_INT32_IDS),
    _v("sampling.topk_logprobs", "matches_reference", _V_TOPK_TIES, _V_RANK_TIES, _V_INT32_IDS),
    _v("sampling.topk_logprobs", "rejects_invalid_input", _V_NO_VALIDATION),
    _v("hashing.cbor_encode", "rejects_invalid_input", _V_CBOR2),
    *(
        _v("hashing.root_hash", prop, _V_ROOT)
        for prop in (
            "root_hash_is_hash_of_cbor_label",
            "root_hash_golden_values",
            "root_hash_defaults_to_sha256",
        )
    ),
    _v("hashing.hash_block", "is_hash_of_cbor_triple", _V_NULL_KEYS),
    _v("hashing.hash_block", "hash_block_golden_vectors", _V_NULL_KEYS),
    _v("hashing.hash_block", "hash_block_matches_reference", _V_NULL_KEYS),
    _v("hashing.hash_block", "rejects_invalid_input", _V_HASH_NO_VALIDATION),
    *(
        _v("hashing.hash_blocks", prop, _V_NO_BLOCK_KEYS)
        for prop in (
            "folds_hash_block",
            "one_hash_per_full_block",
            "prefixes_hash_alike",
            "none_parent_is_root_hash",
            "change_affects_its_block_and_later_ones",
            "array_tokens_chain_like_lists",
        )
    ),
    _v("hashing.hash_blocks", "matches_independent_chain", _V_NULL_KEYS, _V_NO_BLOCK_KEYS),
    _v("hashing.hash_blocks", "hash_blocks_golden_chain", _V_ROOT, _V_NULL_KEYS),
    _v("hashing.hash_blocks", "hash_blocks_matches_reference", _V_NULL_KEYS, _V_NO_BLOCK_KEYS),
    _v("hashing.hash_blocks", "rejects_invalid_input", _V_CACHE_CONFIG, _V_HASH_NO_VALIDATION),
    _v("layers.rms_norm", "matches_the_formula", _V_RMS_FLOAT32),
    _v("layers.rms_norm", "unit_rms_before_the_weight", _V_RMS_FLOAT32),
    _v("layers.rms_norm", "residual_is_fused", _V_RESIDUAL_FLOAT32),
    _v("layers.rms_norm", "matches_reference", _V_RMS_FLOAT32, _V_RESIDUAL_FLOAT32),
    _v("layers.rms_norm", "rejects_invalid_input", _V_LAYERS_NO_VALIDATION),
    _v("layers.silu_and_mul", "rejects_invalid_input", _V_LAYERS_NO_VALIDATION),
    _v("tokenize.find_stop", "ties_at_the_same_end_go_to_the_longest", _V_STOP_TIES),
    _v("tokenize.StopChecker", "holds_back_only_a_possible_stop_start", _V_STOP_HOLD_BACK),
    _v(
        "tokenize.IncrementalDetokenizer",
        "finish_returns_an_incomplete_character",
        _V_DETOK_INCOMPLETE_END,
    ),
    _v(
        "tokenize.IncrementalDetokenizer",
        "drops_a_context_ending_inside_a_character",
        _V_DETOK_PROMPT_SPLIT,
    ),
    _v("tokenize.IncrementalDetokenizer", "spaces_between_special_tokens", _V_DETOK_SPACES),
)


# Why the tokenizer libraries differ (conformance/specs/tokenize.py; the contract is
# pyagent_ref/tokenize/bpe.py). Ids, round trips and decoded text agree on every vocabulary
# they load; what differs is the special-token interface and the handling of bad input.
HF_TOKENIZERS = "conformance.adapters.hf_tokenizers"
TIKTOKEN = "conformance.adapters.tiktoken"

_TOK_ONE_SWITCH = (
    "tokenizers has no per-call special-token sets: it matches every special token, or none "
    "with Tokenizer.encode_special_tokens = True, so the adapter raises NotImplementedError "
    "for a set that is neither all nor none of them"
)
_TOK_NO_DISALLOWED = (
    "tokenizers has no disallowed-special check: a special token it does not match is encoded "
    "as ordinary text, never an error"
)
_TOK_SURROGATE = (
    "tokenizers refuses a str holding a lone surrogate at the Python boundary with TypeError "
    "('TextInputSequence must be str'), where the specification raises ValueError"
)
_TOK_UNKNOWN_ID = (
    "Tokenizer.decode skips an id of no token silently (it decodes to nothing) and raises "
    "OverflowError for a negative id, where the specification raises ValueError"
)
_TOK_BOOL_ID = (
    "Tokenizer.decode takes a bool as an id (True is id 1), where the specification raises "
    "TypeError"
)
_TIK_SURROGATE = (
    "tiktoken encodes text with a lone surrogate after replacing the surrogate with U+FFFD "
    "(encode catches the UnicodeEncodeError), where the specification raises ValueError"
)
_TIK_UNKNOWN_NAMES = (
    "tiktoken does not check that allowed_special and disallowed_special name special tokens: "
    "an unknown name is ignored, where the specification raises ValueError"
)
_TIK_UNKNOWN_ID = (
    "Encoding.decode raises KeyError ('Invalid token for decoding') for an id of no token and "
    "OverflowError for a negative id, where the specification raises ValueError"
)
_TIK_BOOL_ID = (
    "Encoding.decode takes a bool as an id (True is id 1), where the specification raises TypeError"
)


def _tokenizer_divergences(
    target: str, vocabularies: tuple[str, ...], *entries: tuple[str, str]
) -> tuple[Divergence, ...]:
    """The (property, reason) entries for each vocabulary the adapter loads."""
    return tuple(
        Divergence(target, f"tokenize.{vocabulary}", prop, reason)
        for vocabulary in vocabularies
        for prop, reason in entries
    )


_TOKENIZER_DIVERGENCES = (
    *_tokenizer_divergences(
        HF_TOKENIZERS,
        ("embedded", "llama3"),
        ("only_the_allowed_special_tokens_become_ids", _TOK_ONE_SWITCH),
        ("disallowed_special_tokens_raise_value_error", _TOK_NO_DISALLOWED),
        ("encode_rejects_invalid_special_sets", _TOK_ONE_SWITCH),
        ("encode_rejects_lone_surrogates", _TOK_SURROGATE),
        ("decode_rejects_ids_of_no_token", _TOK_UNKNOWN_ID),
        ("decode_rejects_non_int_ids", _TOK_BOOL_ID),
    ),
    *_tokenizer_divergences(
        TIKTOKEN,
        ("embedded", "llama3", "cl100k_base"),
        ("encode_rejects_lone_surrogates", _TIK_SURROGATE),
        ("encode_rejects_invalid_special_sets", _TIK_UNKNOWN_NAMES),
        ("decode_rejects_ids_of_no_token", _TIK_UNKNOWN_ID),
        ("decode_rejects_non_int_ids", _TIK_BOOL_ID),
    ),
)


XGRAMMAR = "conformance.adapters.xgrammar"
LLGUIDANCE = "conformance.adapters.llguidance"

# Why xgrammar's and llguidance's bitmask functions differ (xgrammar/kernels/, llguidance/numpy.py
# and torch.py).
_XG_FLOAT64 = (
    "apply_token_bitmask_inplace takes float32, float16 and bfloat16 logits only: float64 logits "
    "raise ValueError"
)
_XG_PAST_THE_MASK = (
    "xgrammar masks only min(vocab, 32 * words) tokens and leaves the logits past the mask's width "
    "unchanged (with a UserWarning), where the specification masks them (llguidance's rule: a "
    "mask allows only the tokens it describes)"
)
_XG_OVERRUN = (
    "xgrammar 0.2.8's CPU kernel writes -inf for the clear bits of a row's last word past the "
    "vocabulary, into the first tokens of the next row (and past the tensor after the last row: "
    "the adapter leaves spare memory there): a row is masked by its neighbour's mask"
)
_XG_STRIDES = (
    "the CPU kernel takes each row's stride but reads a row as contiguous: a bitmask (or logits) "
    "with a column stride, e.g. every other column, is read at the wrong words"
)
_XG_ERRORS = (
    "every bad argument raises ValueError (non-float logits, a non-int32 mask, wrong dimensions), "
    "where the specification raises TypeError for a wrong type or dtype"
)
_LLG_ERRORS = (
    "llguidance checks with assert statements (AssertionError, or nothing under python -O) and "
    "does not check the logits' dtype: integer logits fail while -inf is written (OverflowError "
    "from numpy, RuntimeError from torch)"
)


def _xg(prop: str, *reasons: str) -> Divergence:
    return Divergence(XGRAMMAR, "structured.apply_token_bitmask", prop, "; ".join(reasons))


# Why xgrammar's and llguidance's matchers differ (`matcher` spec; xgrammar 0.2.8 with
# any_whitespace=True, strict_mode=False; llguidance with its default JSON options).
_XG_FILL_AFTER_EOS = (
    "fill_next_token_bitmask on a terminated GrammarMatcher raises RuntimeError ('has terminated "
    "after accepting the stop token'), where the contract fills an empty mask"
)
_XG_UNTYPED_OBJECT = (
    "a schema without type whose keywords are object keywords (properties) admits only objects, "
    "where JSON Schema applies them to objects and lets every other value through (a string or "
    "a number at the top of such a schema)"
)
_XG_ANYOF_SIBLINGS = (
    "a schema with anyOf is compiled as the anyOf alone, its sibling keywords dropped: "
    '{"type": "object", "properties": {...}, "anyOf": [{"required": ["a"]}, ...]} admits any JSON '
    "value, and objects with any keys and values"
)
_XG_NO_ESCAPES = (
    "a string with a pattern or a length bound is spelled character by character without JSON's "
    'escapes: a backslash is refused (the escaped spellings of allowed characters, such as \\" '
    "or \\u0041, are lost) and, under a length bound, the raw control characters U+0000-U+001F, "
    "which JSON forbids in a string, are allowed"
)
_XG_NEGATIVE_ZERO = (
    "with minimum 0 the minus sign is refused, though -0 and -0.0 equal 0 and satisfy the bound"
)
_XG_MULTIPLE_OF = (
    "multipleOf is ignored on numbers (it holds on integers): under multipleOf 0.01, 12345.678 is "
    "accepted"
)
_XG_DOT_NEWLINE = (
    "in xgrammar's regexes . matches a line feed, which . excludes in the contract's dialect "
    "(Python's, ECMA-262's)"
)
_LLG_EOS_AFTER_STOP = (
    "an EOS accepted once the grammar has stopped (the last token closed the output, is_stopped() "
    "is True) is not recorded: rollback(1) after it undoes the token before it, so the matcher no "
    "longer follows the tokens accepted"
)
_LLG_MASK_AFTER_EOS = (
    "after EOS the mask still allows EOS (and accepts it again), where a terminated matcher "
    "allows nothing"
)
_LLG_CANONICAL = (
    "where the grammar forces the next bytes (the rest of a property name, of true or false, of "
    "an enum value), only the tokens that begin the tokenizer's canonical tokenization of them "
    'are allowed: after {" with "sub" forced, "sub" but not "s" or "su" (the instances\' own '
    "tokens stay allowed), where the contract allows every token whose bytes fit"
)
_LLG_DEL = (
    "JSON strings refuse the DEL character (U+007F), which JSON allows unescaped (only "
    "U+0000-U+001F must be escaped)"
)


def _matcher(implementation: str, kinds: str, prop: str, *reasons: str) -> tuple[Divergence, ...]:
    """The divergence of `prop` for each of the space-separated constraint `kinds`."""
    return tuple(
        Divergence(implementation, f"matcher.{kind}", prop, "; ".join(reasons))
        for kind in kinds.split()
    )


_MATCHER_DIVERGENCES = (
    *_matcher(XGRAMMAR, "json_schema regex grammar", "terminates_only_by_eos", _XG_FILL_AFTER_EOS),
    *_matcher(
        XGRAMMAR, "json_schema", "rejects_invalid_instances", _XG_MULTIPLE_OF, _XG_ANYOF_SIBLINGS
    ),
    *_matcher(
        XGRAMMAR,
        "json_schema",
        "allows_no_token_the_reference_refuses",
        _XG_NO_ESCAPES,
        _XG_MULTIPLE_OF,
        _XG_ANYOF_SIBLINGS,
    ),
    *_matcher(
        XGRAMMAR,
        "json_schema",
        "allows_every_token_the_reference_allows",
        _XG_UNTYPED_OBJECT,
        _XG_NO_ESCAPES,
        _XG_NEGATIVE_ZERO,
    ),
    *_matcher(XGRAMMAR, "regex", "allows_no_token_the_reference_refuses", _XG_DOT_NEWLINE),
    *_matcher(
        LLGUIDANCE,
        "json_schema regex grammar",
        "mask_agrees_with_accept_token",
        _LLG_EOS_AFTER_STOP,
    ),
    *_matcher(
        LLGUIDANCE,
        "json_schema regex grammar",
        "rollback_restores_earlier_masks",
        _LLG_EOS_AFTER_STOP,
    ),
    *_matcher(
        LLGUIDANCE, "json_schema regex grammar", "terminates_only_by_eos", _LLG_MASK_AFTER_EOS
    ),
    *_matcher(
        LLGUIDANCE,
        "json_schema",
        "allows_every_token_the_reference_allows",
        _LLG_CANONICAL,
        _LLG_DEL,
    ),
    *_matcher(LLGUIDANCE, "grammar", "allows_every_token_the_reference_allows", _LLG_CANONICAL),
)


_STRUCTURED_DIVERGENCES = (
    _xg("keeps_exactly_the_allowed_tokens", _XG_FLOAT64, _XG_PAST_THE_MASK, _XG_OVERRUN),
    _xg("masks_tokens_past_the_mask", _XG_PAST_THE_MASK),
    _xg("ignores_bits_past_the_vocab", _XG_OVERRUN),
    _xg("does_not_read_the_values", _XG_OVERRUN),  # seen only when a drawn row has clear bits
    _xg("accepts_strided_input", _XG_STRIDES),
    _xg("returns_array_like_logits", _XG_FLOAT64),
    _xg("rejects_invalid_input", _XG_ERRORS),
    _xg("matches_reference", _XG_FLOAT64, _XG_PAST_THE_MASK, _XG_OVERRUN),
    Divergence(LLGUIDANCE, "structured.apply_token_bitmask", "rejects_invalid_input", _LLG_ERRORS),
)


GGUF_PY = "conformance.adapters.gguf_py"

_GGUF_NO_K_QUANTIZER = (
    "gguf-py 0.19 quantizes Q8_0 and Q4_0 (bit-exact with llama.cpp's reference) but has no "
    "Q4_K or Q6_K quantizer: gguf.quants.quantize raises NotImplementedError for them"
)
_GGUF_NO_VALIDATION = (
    "gguf.quants checks neither dtypes nor the type name's family: integer weights are cast, "
    "int8 bytes are viewed as uint8, and any GGML type name (F16, Q5_K, IQ2_XS) is a format"
)
_GGUF_DIVERGENCES = (
    *(
        Divergence(GGUF_PY, "gguf.quantize", prop, _GGUF_NO_K_QUANTIZER)
        for prop in (
            "returns_documented_types",
            "dequantizes_within_the_format_error",
            "does_not_modify_inputs",
            "matches_reference",
        )
    ),
    Divergence(GGUF_PY, "gguf.quantize", "rejects_invalid_input", _GGUF_NO_VALIDATION),
    Divergence(GGUF_PY, "gguf.dequantize", "rejects_invalid_input", _GGUF_NO_VALIDATION),
)

COMPRESSED_TENSORS = "conformance.adapters.compressed_tensors"

_CT_E4M3_ONLY = (
    "compressed-tensors 0.20's float quantization is e4m3 only (QuantizationArgs type "
    "'float', num_bits 8 is float8_e4m3fn): the adapter raises NotImplementedError for "
    "'e5m2' (on e4m3 its scales and codes are ours bit for bit)"
)
_CT_ZERO_SCALE = (
    "calculate_qparams gives an all-zero tensor or row the scale eps(float32) = 2^-23 "
    "(to avoid a division by 0) where the contract gives 1 (the codes, all 0, agree)"
)
_CT_NO_TYPE_CHECKS = (
    "pack_to_int32 / unpack_from_int32 raise ValueError for a wrong dtype (TypeError in "
    "the contract); quantize and dequantize check nothing: an integer weight reaches "
    "torch.amin (RuntimeError on no rows), int8 codes are viewed as float8 and read"
)
_CT_DIVERGENCES = (
    *(
        Divergence(COMPRESSED_TENSORS, "quant.quantize_fp8", prop, _CT_E4M3_ONLY)
        for prop in ("returns_documented_types", "fp8_round_trips_within_the_format_bound")
    ),
    *(
        Divergence(
            COMPRESSED_TENSORS, "quant.quantize_fp8", prop, f"{_CT_E4M3_ONLY}; {_CT_ZERO_SCALE}"
        )
        for prop in ("scale_is_amax_over_max_and_codes_are_torchs_cast", "matches_reference")
    ),
    Divergence(COMPRESSED_TENSORS, "quant.quantize_fp8", "does_not_modify_inputs", _CT_E4M3_ONLY),
    *(
        Divergence(COMPRESSED_TENSORS, op, "rejects_invalid_input", _CT_NO_TYPE_CHECKS)
        for op in ("quant.pack_int32", "quant.unpack_int32", "quant.quantize_fp8")
    ),
    Divergence(
        COMPRESSED_TENSORS, "quant.dequantize_fp8", "rejects_invalid_input", _CT_NO_TYPE_CHECKS
    ),
)

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
    *(
        _hf(op, prop, _HF_WARPERS_FLOAT32)
        for op, prop in (
            ("apply_typical_p", "keeps_the_smallest_typical_set"),
            ("apply_typical_p", "matches_reference"),
            ("apply_epsilon_cutoff", "masks_below_epsilon"),
            ("apply_epsilon_cutoff", "matches_reference"),
        )
    ),
    _hf("apply_eta_cutoff", "masks_below_entropy_scaled_eta", _HF_WARPERS_FLOAT32, _HF_ETA_FLOAT32),
    _hf("apply_eta_cutoff", "matches_reference", _HF_WARPERS_FLOAT32, _HF_ETA_FLOAT32),
    *(
        _hf("apply_allowed_token_ids", prop, _HF_ALLOWED_FORCED)
        for prop in ("masks_every_unlisted_token", "rows_are_independent", "matches_reference")
    ),
    *(
        _hf(op, "rejects_invalid_input", _HF_NO_VALIDATION)
        for op in (
            "apply_typical_p",
            "apply_epsilon_cutoff",
            "apply_eta_cutoff",
            "apply_allowed_token_ids",
            "apply_bad_words",
            "apply_no_repeat_ngram",
        )
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
            "moe.route_topk_softmax",
            "moe.fused_moe",
        )
    ),
    *(
        _hf_model("moe.route_topk_softmax", prop, _HF_ROUTER_DTYPE)
        for prop in (
            "returns_documented_types",
            "weights_are_the_softmax_probabilities",
            "renormalized_weights_sum_to_one",
        )
    ),
    _hf_model(
        "moe.route_topk_softmax", "picks_the_largest_logits_lowest_id_first", _HF_ROUTER_TIES
    ),
    _hf_model(
        "moe.route_topk_softmax", "matches_reference", f"{_HF_ROUTER_DTYPE}; {_HF_ROUTER_TIES}"
    ),
    _hf_model("moe.fused_moe", "matches_the_formula", _HF_EXPERTS_HALF),
    *(
        Divergence(ACCEL, f"sampling.{op}", "accepts_strided_input", _ACCEL_STRIDES)
        for op in _ACCEL_STRIDED_OPS
    ),
    *_VLLM_DIVERGENCES,
    *_TOKENIZER_DIVERGENCES,
    *_STRUCTURED_DIVERGENCES,
    *_MATCHER_DIVERGENCES,
    *_GGUF_DIVERGENCES,
    *_CT_DIVERGENCES,
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
