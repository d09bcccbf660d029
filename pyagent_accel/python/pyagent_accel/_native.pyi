# Private native module: the ops in pyagent_accel.ops wrap these. Not a public API.
from typing import Any, ClassVar

import numpy as np

SIMD: str

class Check:
    FINITE_NONNEG: ClassVar[Check]
    UNIT_OPEN_CLOSED: ClassVar[Check]
    UNIT_CLOSED: ClassVar[Check]
    UNIT_CLOSED_OPEN: ClassVar[Check]
    FINITE_POS: ClassVar[Check]
    FINITE: ClassVar[Check]
    NONNEG: ClassVar[Check]
    INDEX: ClassVar[Check]
    FINITE_ABOVE_ONE: ClassVar[Check]
    POSITIVE: ClassVar[Check]
    AT_LEAST_MINUS_ONE: ClassVar[Check]
    NOT_NAN: ClassVar[Check]

def check_logits(x: np.ndarray, name: str) -> None: ...
def first_bad(values: np.ndarray, check: Check, bound: int = 0) -> int: ...
def apply_temperature(logits: np.ndarray, temperature: np.ndarray) -> np.ndarray: ...
def apply_top_k(logits: np.ndarray, k: np.ndarray) -> np.ndarray: ...
def apply_top_p(logits: np.ndarray, p: np.ndarray) -> np.ndarray: ...
def apply_min_p(logits: np.ndarray, min_p: np.ndarray) -> np.ndarray: ...
def apply_typical_p(logits: np.ndarray, typical_p: np.ndarray) -> np.ndarray: ...
def apply_epsilon_cutoff(logits: np.ndarray, epsilon: np.ndarray) -> np.ndarray: ...
def apply_eta_cutoff(logits: np.ndarray, eta: np.ndarray) -> np.ndarray: ...
def apply_penalties(
    logits: np.ndarray,
    prompt_ids: np.ndarray,
    output_ids: np.ndarray,
    repetition_penalty: np.ndarray,
    frequency_penalty: np.ndarray,
    presence_penalty: np.ndarray,
) -> np.ndarray: ...
def apply_logit_bias(logits: np.ndarray, token_ids: np.ndarray, bias: np.ndarray) -> np.ndarray: ...
def apply_allowed_token_ids(logits: np.ndarray, allowed: np.ndarray) -> np.ndarray: ...
def apply_bad_words(
    logits: np.ndarray, token_ids: np.ndarray, bad_words: np.ndarray
) -> np.ndarray: ...
def apply_no_repeat_ngram(
    logits: np.ndarray, token_ids: np.ndarray, n: np.ndarray
) -> np.ndarray: ...
def apply_dry(
    logits: np.ndarray,
    token_ids: np.ndarray,
    multiplier: np.ndarray,
    base: np.ndarray,
    allowed_length: np.ndarray,
    penalty_last_n: np.ndarray,
    sequence_breakers: np.ndarray,
) -> np.ndarray: ...
def apply_xtc(
    logits: np.ndarray,
    threshold: np.ndarray,
    probability: np.ndarray,
    seeds: np.ndarray,
    positions: np.ndarray,
) -> np.ndarray: ...
def apply_mirostat(logits: np.ndarray, mu: np.ndarray) -> np.ndarray: ...
def mirostat_update(
    logits: np.ndarray, sampled: np.ndarray, mu: np.ndarray, tau: np.ndarray, eta: np.ndarray
) -> np.ndarray: ...
def log_softmax(logits: np.ndarray) -> np.ndarray: ...
def topk_logprobs(
    logprobs: np.ndarray, num: int, sampled: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]: ...
def sample(
    logits: np.ndarray, temperature: np.ndarray, seeds: np.ndarray, positions: np.ndarray
) -> np.ndarray: ...
def philox_uniform(seeds: np.ndarray, positions: np.ndarray, num: int) -> np.ndarray: ...
def philox4x32_10(
    words: list[np.ndarray],
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]: ...
def tokens_from_seq(seq: list[Any] | tuple[Any, ...], name: str) -> np.ndarray: ...
def cbor_encode(value: Any) -> bytes: ...
def root_hash(algorithm: int) -> bytes: ...
def hash_block(parent: bytes, tokens: np.ndarray, extra_keys: Any, algorithm: int) -> bytes: ...
def hash_blocks(
    tokens: np.ndarray, block_size: int, extra_keys: Any, algorithm: int, parent: bytes
) -> list[bytes]: ...
def compute_positions(
    query_start_loc: np.ndarray, num_computed_tokens: np.ndarray, num_tokens: int
) -> np.ndarray: ...
def compute_slot_mapping(
    block_table: np.ndarray, query_start_loc: np.ndarray, positions: np.ndarray, block_size: int
) -> np.ndarray: ...
def compute_logits_indices(query_start_loc: np.ndarray) -> np.ndarray: ...

# attention, layers and rope: float arrays of float16, float32 or float64, or bfloat16 as
# int16 bits
def reshape_and_cache(
    key: np.ndarray,
    value: np.ndarray,
    key_cache: np.ndarray,
    value_cache: np.ndarray,
    slot_mapping: np.ndarray,
    kv_format: str | None = None,
) -> None: ...
def concat_and_cache_mla(
    kv_c: np.ndarray, k_pe: np.ndarray, kv_cache: np.ndarray, slot_mapping: np.ndarray
) -> None: ...
def paged_attention(
    query: np.ndarray,
    key_cache: np.ndarray,
    value_cache: np.ndarray,
    block_table: np.ndarray,
    query_start_loc: np.ndarray,
    seq_lens: np.ndarray,
    scale: float,
    sliding_window: int | None = None,
    soft_cap: float | None = None,
    alibi_slopes: np.ndarray | None = None,
    custom_masks: list[np.ndarray | None] | None = None,
    causal: bool = True,
    kv_format: str | None = None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> np.ndarray: ...
def paged_decode_attention(
    query: np.ndarray,
    key_cache: np.ndarray,
    value_cache: np.ndarray,
    block_table: np.ndarray,
    seq_lens: np.ndarray,
    scale: float,
    sliding_window: int | None = None,
    soft_cap: float | None = None,
    alibi_slopes: np.ndarray | None = None,
    kv_format: str | None = None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> np.ndarray: ...
def rms_norm(
    x: np.ndarray, weight: np.ndarray, eps: float, residual: np.ndarray | None = None
) -> np.ndarray | tuple[np.ndarray, np.ndarray]: ...
def silu_and_mul(x: np.ndarray) -> np.ndarray: ...
def pool_rows(hidden: np.ndarray, query_start_loc: np.ndarray, kind: int) -> np.ndarray: ...
def normalize_rows(x: np.ndarray, dimensions: int) -> np.ndarray: ...
def classify_rows(logits: np.ndarray, kind: int) -> np.ndarray: ...
def cosine_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray: ...
def ssm_conv1d(
    x: np.ndarray,
    weight: np.ndarray,
    bias: np.ndarray,
    state: np.ndarray,
    query_start_loc: np.ndarray,
    channels: int,
    width: int,
    silu: bool,
) -> tuple[np.ndarray, np.ndarray]: ...
def ssm_ssd_scan(
    x: np.ndarray,
    dt: np.ndarray,
    a: np.ndarray,
    b: np.ndarray,
    c: np.ndarray,
    state: np.ndarray,
    query_start_loc: np.ndarray,
    d: np.ndarray,
    dt_bias: np.ndarray,
    dt_softplus: bool,
    heads: int,
    p: int,
    groups: int,
    n: int,
) -> tuple[np.ndarray, np.ndarray]: ...
def ssm_selective_scan(
    x: np.ndarray,
    dt: np.ndarray,
    a: np.ndarray,
    b: np.ndarray,
    c: np.ndarray,
    state: np.ndarray,
    query_start_loc: np.ndarray,
    d: np.ndarray,
    z: np.ndarray,
    dt_bias: np.ndarray,
    dt_softplus: bool,
    channels: int,
    n: int,
) -> tuple[np.ndarray, np.ndarray]: ...
def ssm_state_update(
    state: np.ndarray,
    x: np.ndarray,
    dt: np.ndarray,
    a: np.ndarray,
    b: np.ndarray,
    c: np.ndarray,
    d: np.ndarray,
    dt_bias: np.ndarray,
    dt_softplus: bool,
    seqs: int,
    heads: int,
    p: int,
    groups: int,
    n: int,
) -> tuple[np.ndarray, np.ndarray]: ...
def route_topk_softmax(
    logits: np.ndarray, k: int, renormalize: bool
) -> tuple[np.ndarray, np.ndarray]: ...
def route_grouped_topk(
    logits: np.ndarray,
    k: int,
    num_groups: int,
    topk_groups: int,
    correction_bias: np.ndarray | None,
    sigmoid: bool,
    routed_scaling_factor: float,
    renormalize: bool,
    group_max: bool,
) -> tuple[np.ndarray, np.ndarray]: ...
def fused_moe(
    hidden: np.ndarray,
    w_gate_up: np.ndarray,
    w_down: np.ndarray,
    topk_weights: np.ndarray,
    topk_ids: np.ndarray,
) -> np.ndarray: ...
def gemma_rms_norm(
    x: np.ndarray, weight: np.ndarray, eps: float, residual: np.ndarray | None = None
) -> np.ndarray | tuple[np.ndarray, np.ndarray]: ...
def layer_norm(
    x: np.ndarray,
    weight: np.ndarray,
    bias: np.ndarray,
    eps: float,
    residual: np.ndarray | None = None,
) -> np.ndarray | tuple[np.ndarray, np.ndarray]: ...
def gelu(x: np.ndarray, approximate: str) -> np.ndarray: ...
def gelu_and_mul(x: np.ndarray, approximate: str) -> np.ndarray: ...
def apply_token_bitmask(logits: np.ndarray, bitmask: np.ndarray) -> np.ndarray: ...
def verify_greedy(
    target_logits: np.ndarray, draft_token_ids: np.ndarray, num_draft_tokens: np.ndarray
) -> np.ndarray: ...
def rejection_sample(
    target_logits: np.ndarray,
    draft_token_ids: np.ndarray,
    num_draft_tokens: np.ndarray,
    draft_probs: np.ndarray | None,
    temperature: np.ndarray,
    seeds: np.ndarray,
    positions: np.ndarray,
) -> np.ndarray: ...
def tree_attention_mask(draft_parents: np.ndarray) -> np.ndarray: ...
def verify_tree_greedy(
    target_logits: np.ndarray,
    draft_token_ids: np.ndarray,
    num_draft_tokens: np.ndarray,
    draft_parents: np.ndarray,
) -> np.ndarray: ...
def rejection_sample_tree(
    target_logits: np.ndarray,
    draft_token_ids: np.ndarray,
    num_draft_tokens: np.ndarray,
    draft_parents: np.ndarray,
    temperature: np.ndarray,
    seeds: np.ndarray,
    positions: np.ndarray,
) -> np.ndarray: ...
def ngram_proposal(
    token_ids: list[int] | np.ndarray,
    num_speculative_tokens: int,
    prompt_lookup_min: int,
    prompt_lookup_max: int,
) -> tuple[int, int]: ...
def apply_rope(
    positions: np.ndarray,
    query: np.ndarray,
    key: np.ndarray,
    inv_freq: np.ndarray,
    scale: float,
    is_neox: bool,
) -> tuple[np.ndarray, np.ndarray]: ...
def apply_mrope(
    positions: np.ndarray,
    query: np.ndarray,
    key: np.ndarray,
    inv_freq: np.ndarray,
    sections: list[int],
    scale: float,
    is_neox: bool,
) -> tuple[np.ndarray, np.ndarray]: ...
def rope_inv_freq(
    rotary_dim: int,
    theta: float,
    rope_type: str,
    params: tuple[float, ...],
    attention_factor: float | None = None,
) -> tuple[np.ndarray, float]: ...

class AddedTokenSplitter:
    def __init__(self, passes: list[list[tuple[str, int]]], disallowed: list[str]) -> None: ...
    def meets_disallowed(self, text: str) -> bool: ...

class BpeCore:
    def __init__(
        self,
        vocab: dict[bytes, int],
        merges: list[tuple[bytes, bytes, int]],
        patterns: list[str],
        add_prefix_space: bool,
        ignore_merges: bool,
        decoded: list[tuple[int, bytes]],
    ) -> None: ...
    def encode(self, text: str, splitter: AddedTokenSplitter) -> list[int]: ...
    def encode_batch(self, texts: list[str], splitter: AddedTokenSplitter) -> list[list[int]]: ...
    def decode(self, ids: list[int]) -> str | None: ...

# structured (pyagent_accel.structured): the automaton constructions, then the grammar,
# parser, trie and matcher cores
def nfa_to_dfa(
    start: int,
    accept: int,
    edges: list[list[tuple[int, int, int]]],
    epsilons: list[list[int]],
    max_states: int,
    minimal: bool,
) -> tuple[list[int], list[int], list[bool], int]: ...
def regex_tree_to_dfa(
    tree: list[int], max_nfa_states: int, max_states: int
) -> tuple[list[int], list[int], list[bool], int]: ...
def minimize_dfa(
    dfa: tuple[bytes, list[int], list[bool], int],
) -> tuple[list[int], list[int], list[bool], int]: ...
def product_dfa(
    a: tuple[bytes, list[int], list[bool], int],
    b: tuple[bytes, list[int], list[bool], int],
    subtract: bool,
    max_states: int,
) -> tuple[list[int], list[int], list[bool], int]: ...

class CompiledGrammarCore:
    def __init__(
        self,
        rules: list[list[list[int]]],
        start: int,
        terminals: list[tuple[bytes, list[int], list[bool], int]],
    ) -> None: ...
    def nullable(self) -> list[bool]: ...

class EarleyCore:
    def __init__(self, grammar: CompiledGrammarCore) -> None: ...
    def push(self, byte: int) -> bool: ...
    def pop(self, n: int) -> None: ...
    def is_accepting(self) -> bool: ...
    def num_bytes(self) -> int: ...
    def copy(self) -> EarleyCore: ...

class TokenTrieCore:
    @property
    def vocab_size(self) -> int: ...
    def __init__(self, token_bytes: Any) -> None: ...
    def __len__(self) -> int: ...
    def prefix(self, node: int) -> bytes: ...
    def children(self, node: int) -> list[int]: ...

class MatcherCore:
    def __init__(
        self, parser: EarleyCore, trie: TokenTrieCore, eos_token_ids: list[int]
    ) -> None: ...
    def accept_token(self, token_id: int) -> bool: ...
    def rollback(self, num_tokens: int) -> None: ...
    def is_terminated(self) -> bool: ...
    def num_accepted_tokens(self) -> int: ...
    def allowed_tokens(self) -> list[int]: ...
    def fill_next_token_bitmask(self, bitmask: np.ndarray, index: int) -> None: ...
    def find_jump_forward_bytes(self) -> bytes: ...
    def last_mask_nodes(self) -> int: ...
    def copy(self) -> MatcherCore: ...

def lora_shrink(x: np.ndarray, lora_a: np.ndarray, indices: np.ndarray) -> np.ndarray: ...
def lora_expand(
    y: np.ndarray,
    lora_b: np.ndarray,
    indices: np.ndarray,
    scaling: np.ndarray,
    out: np.ndarray | None,
    output_slices: list[int],
    rank_major: bool,
) -> np.ndarray: ...
def quantize(
    weight: np.ndarray, bits: int, group_size: int, symmetric: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]: ...
def dequantize(codes: np.ndarray, scales: np.ndarray, zeros: np.ndarray | None) -> np.ndarray: ...
def pack_int32(codes: np.ndarray, bits: int) -> np.ndarray: ...
def unpack_int32(packed: np.ndarray, bits: int, size: int) -> np.ndarray: ...
def dequant_matmul(
    x: np.ndarray,
    packed: np.ndarray,
    scales: np.ndarray,
    zeros: np.ndarray | None,
    bits: int,
) -> np.ndarray: ...
def quantize_fp8(
    weight: np.ndarray, e5m2: bool, per_channel: bool
) -> tuple[np.ndarray, np.ndarray]: ...
def dequantize_fp8(codes: np.ndarray, scales: np.ndarray, e5m2: bool) -> np.ndarray: ...
def dequant_matmul_fp8(
    x: np.ndarray,
    codes: np.ndarray,
    scales: np.ndarray,
    e5m2: bool,
    input_scale: float | None,
    dynamic: str | None,
) -> np.ndarray: ...
def gguf_quantize(weight: np.ndarray, fmt: str) -> np.ndarray: ...
def gguf_dequantize(raw: np.ndarray, fmt: str) -> np.ndarray: ...
def gguf_matmul(x: np.ndarray, raw: np.ndarray, fmt: str) -> np.ndarray: ...
