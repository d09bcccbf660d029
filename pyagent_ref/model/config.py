"""Model configuration, read from a Hugging Face `config.json`."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._files import read_json_object
from .families import FAMILIES, check_rope_scaling, hf_activation

DTYPES = ("float32", "bfloat16", "float16")
DEEPSEEK_ARCHITECTURES = ("DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM")
MOE_ARCHITECTURES = (
    "MixtralForCausalLM",
    "Qwen2MoeForCausalLM",
    "Qwen3MoeForCausalLM",
    *DEEPSEEK_ARCHITECTURES,
)
# DeepSeek's routers, by `topk_method`: V2's softmax top-k over all experts ("greedy") or
# within the best groups by their best expert ("group_limited_greedy"); V3's sigmoid
# scores with a correction bias, groups scored by the sum of their two best ("noaux_tc")
# state-space families: Mamba-2 alone, and Bamba's Mamba-2 layers among attention layers
MAMBA_ARCHITECTURES = ("Mamba2ForCausalLM", "BambaForCausalLM")
DEEPSEEK_TOPK_METHODS = {
    "DeepseekV2ForCausalLM": ("greedy", "group_limited_greedy"),
    "DeepseekV3ForCausalLM": ("noaux_tc",),
}


def _require(cfg: dict[str, Any], key: str, arch: str) -> Any:
    if key not in cfg:
        raise ValueError(f"config.json for {arch} lacks {key!r}")
    return cfg[key]


def _int_at_least(cfg: dict[str, Any], key: str, arch: str, low: int, default: Any = None) -> int:
    value = cfg.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"config.json for {arch}: {key} must be an int >= {low}, got {value!r}")
    return value


@dataclass(frozen=True)
class GroupedRouting:
    """DeepSeek's router (`ops.moe.route_grouped_topk`): scores by `scoring` ("softmax" or
    "sigmoid"), steered by a per-expert correction bias when `correction_bias` (V3), the
    best `topk_groups` of `num_groups` expert groups scored by `group_score` ("max": V2,
    "top2_sum": V3), the chosen weights times `routed_scaling_factor`."""

    scoring: str
    num_groups: int
    topk_groups: int
    group_score: str
    correction_bias: bool
    routed_scaling_factor: float

    @classmethod
    def from_hf(cls, arch: str, cfg: dict[str, Any], experts: int) -> GroupedRouting:
        """The router of a DeepSeek-V2 or V3 config.json; ValueError naming the key of a
        value the router does not implement."""
        method = cfg.get("topk_method") or DEEPSEEK_TOPK_METHODS[arch][0]
        if method not in DEEPSEEK_TOPK_METHODS[arch]:
            raise ValueError(
                f"config.json for {arch}: topk_method {method!r} is not supported; "
                f"supported: {DEEPSEEK_TOPK_METHODS[arch]}"
            )
        v3 = arch == "DeepseekV3ForCausalLM"
        scoring = "sigmoid" if v3 else "softmax"
        if cfg.get("scoring_func", scoring) != scoring:
            raise ValueError(
                f"config.json for {arch}: scoring_func {cfg['scoring_func']!r} is not supported "
                f"(only {scoring!r})"
            )
        groups, topk_groups = 1, 1
        if method != "greedy":
            groups = _int_at_least(cfg, "n_group", arch, 1)
            topk_groups = _int_at_least(cfg, "topk_group", arch, 1)
            if experts % groups or topk_groups > groups:
                raise ValueError(
                    f"config.json for {arch}: n_group must divide n_routed_experts ({experts}) "
                    f"and topk_group ({topk_groups}) must be at most n_group, got {groups}"
                )
        scaling = cfg.get("routed_scaling_factor", 1.0)
        if not isinstance(scaling, (int, float)) or not abs(scaling) < float("inf"):
            raise ValueError(
                f"config.json for {arch}: routed_scaling_factor must be a finite number, "
                f"got {scaling!r}"
            )
        return cls(
            scoring=scoring,
            num_groups=groups,
            topk_groups=topk_groups,
            group_score="top2_sum" if v3 else "max",
            correction_bias=v3,
            routed_scaling_factor=float(scaling),
        )


@dataclass(frozen=True)
class MoEConfig:
    """The sparse MLP of a mixture-of-experts family (see `model.moe`).

    `sparse_layers` are the decoder layers whose MLP is the MoE block (the others keep a
    dense MLP of the model's `intermediate_size`); each of the `num_experts` experts is a
    gated MLP of `intermediate_size`. A token goes to its `top_k` experts by softmax
    routing, renormalised to sum to 1 if `renormalize`, or by DeepSeek's group-limited
    router when `grouped` is set. A shared expert (Qwen2-MoE, DeepSeek's
    `n_shared_experts` experts as one MLP), when `shared_expert_intermediate_size` > 0,
    runs on every token, scaled by sigmoid(shared_expert_gate(x)) if `shared_expert_gate`.
    """

    num_experts: int
    top_k: int
    intermediate_size: int
    renormalize: bool
    sparse_layers: tuple[int, ...]
    shared_expert_intermediate_size: int = 0
    shared_expert_gate: bool = False
    grouped: GroupedRouting | None = None

    @classmethod
    def from_hf(cls, arch: str, cfg: dict[str, Any]) -> MoEConfig:
        """The MoE keys of a Mixtral, Qwen2-MoE, Qwen3-MoE or DeepSeek-V2/V3 config.json.

        Raises:
            ValueError: a missing key, or a value the MoE block does not implement (the
                message names the key and the value).
        """
        act = cfg.get("hidden_act", "silu")
        if act != "silu":
            raise ValueError(f"config.json for {arch}: hidden_act {act!r} is not supported")
        layers = cfg["num_hidden_layers"]
        if arch in DEEPSEEK_ARCHITECTURES:
            return cls._deepseek(arch, cfg, layers)
        # transformers 5 writes Qwen3-MoE's num_experts as num_local_experts, like Mixtral's
        key = "num_local_experts" if "num_local_experts" in cfg else "num_experts"
        experts = _require(cfg, key, arch)
        if arch == "MixtralForCausalLM":
            inter, renormalize, sparse = cfg["intermediate_size"], True, tuple(range(layers))
        else:
            inter = _require(cfg, "moe_intermediate_size", arch)
            renormalize = bool(cfg.get("norm_topk_prob", False))
            step = cfg.get("decoder_sparse_step", 1)
            if not isinstance(step, int) or step < 1:
                raise ValueError(
                    f"config.json for {arch}: decoder_sparse_step must be an int >= 1, got {step!r}"
                )
            dense = set(cfg.get("mlp_only_layers") or ())
            sparse = tuple(
                i for i in range(layers) if i not in dense and experts > 0 and (i + 1) % step == 0
            )
        top_k = _require(cfg, "num_experts_per_tok", arch)
        if sparse and not 1 <= top_k <= experts:
            raise ValueError(
                f"config.json for {arch}: num_experts_per_tok must be in [1, {experts}] "
                f"(num_experts), got {top_k!r}"
            )
        shared = 0
        if arch == "Qwen2MoeForCausalLM":
            shared = int(cfg.get("shared_expert_intermediate_size") or 0)
        return cls(
            num_experts=experts,
            top_k=top_k,
            intermediate_size=inter,
            renormalize=renormalize,
            sparse_layers=sparse,
            shared_expert_intermediate_size=shared,
            shared_expert_gate=shared > 0,
        )

    @classmethod
    def _deepseek(cls, arch: str, cfg: dict[str, Any], layers: int) -> MoEConfig:
        """DeepSeek-V2/V3: the first `first_k_dense_replace` layers dense, the others sparse
        with `n_routed_experts` routed experts and `n_shared_experts` shared ones."""
        experts = _int_at_least(cfg, "n_routed_experts", arch, 1)
        if cfg.get("moe_layer_freq", 1) != 1:
            raise ValueError(
                f"config.json for {arch}: moe_layer_freq={cfg['moe_layer_freq']!r} is not "
                f"supported (only 1)"
            )
        # HF's DeepSeek-V2 ignores norm_topk_prob, DeepSeek's own code renormalises (and then
        # skips routed_scaling_factor): a checkpoint that sets it is refused, not guessed at
        renormalize = bool(cfg.get("norm_topk_prob", False))
        if renormalize and arch == "DeepseekV2ForCausalLM":
            raise ValueError(f"config.json for {arch}: norm_topk_prob=True is not supported")
        first_dense = _int_at_least(cfg, "first_k_dense_replace", arch, 0, default=0)
        top_k = _require(cfg, "num_experts_per_tok", arch)
        grouped = GroupedRouting.from_hf(arch, cfg, experts)
        size = experts // grouped.num_groups
        if not isinstance(top_k, int) or not 1 <= top_k <= grouped.topk_groups * size:
            raise ValueError(
                f"config.json for {arch}: num_experts_per_tok must be in "
                f"[1, {grouped.topk_groups * size}] (topk_group x experts per group), got {top_k!r}"
            )
        inter = _require(cfg, "moe_intermediate_size", arch)
        return cls(
            num_experts=experts,
            top_k=top_k,
            intermediate_size=inter,
            renormalize=renormalize,
            sparse_layers=tuple(range(first_dense, layers)),
            shared_expert_intermediate_size=inter * int(cfg.get("n_shared_experts") or 0),
            grouped=grouped,
        )


@dataclass(frozen=True)
class MLAConfig:
    """Multi-head latent attention (DeepSeek-V2/V3, `model.deepseek`).

    Queries: hidden -> (q_lora_rank, RMSNorm, when set) -> heads x (qk_nope_head_dim +
    qk_rope_head_dim). Keys and values: hidden -> a latent of kv_lora_rank features
    (RMSNorm-ed) plus a shared rotary key of qk_rope_head_dim; the latent expands to
    per-head keys (qk_nope_head_dim, followed by the shared rotary part) and values
    (v_head_dim). The cache keeps the latent and the rotary key: `latent_size` numbers
    per token and layer.
    """

    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    q_lora_rank: int | None = None

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def latent_size(self) -> int:
        """Numbers per token and layer in the cache: kv_lora_rank + qk_rope_head_dim."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    @classmethod
    def from_hf(cls, arch: str, cfg: dict[str, Any]) -> MLAConfig:
        """The MLA keys of a DeepSeek-V2/V3 config.json; ValueError naming a missing or
        invalid one (qk_rope_head_dim must be even: RoPE turns pairs)."""
        sizes = {
            key: _int_at_least(cfg, key, arch, 1)
            for key in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
        }
        if sizes["qk_rope_head_dim"] % 2:
            raise ValueError(
                f"config.json for {arch}: qk_rope_head_dim must be even, "
                f"got {sizes['qk_rope_head_dim']}"
            )
        q_lora = cfg.get("q_lora_rank")
        if q_lora is not None:
            q_lora = _int_at_least(cfg, "q_lora_rank", arch, 1)
        return cls(q_lora_rank=q_lora, **sizes)


def _json_float(value: Any) -> Any:
    """A float of config.json: transformers 5 writes infinity as {"__float__": "Infinity"}
    (4.x as the bare Infinity, which json reads as a float)."""
    if isinstance(value, dict) and set(value) == {"__float__"}:
        return float(value["__float__"])
    return value


@dataclass(frozen=True)
class MambaConfig:
    """The Mamba-2 mixer of a state-space or hybrid model (`model.mamba`).

    The mixer projects the hidden state to a gate z, the convolution's input xBC
    (`intermediate_size` channels of x, then B and C: `n_groups` x `state_size` each)
    and one step size per head; xBC goes through a causal depthwise convolution of width
    `conv_kernel` (with a bias when `conv_bias`) and silu; x (`num_heads` heads of
    `head_dim`) runs through the SSD scan with A = -exp(A_log), D and dt_bias per head,
    softplus step sizes, chunks of `chunk_size` tokens; the result is normalised per
    group with a silu(z) gate (RMSNorm of eps `norm_eps`) and projected back (in and out
    projections with biases when `proj_bias`). A request keeps, per Mamba layer, a
    convolution state of conv_dim x (conv_kernel - 1) inputs and an SSM state of
    num_heads x head_dim x state_size numbers (float32).
    """

    num_heads: int
    head_dim: int
    state_size: int
    n_groups: int
    conv_kernel: int
    chunk_size: int
    conv_bias: bool
    proj_bias: bool
    norm_eps: float

    @property
    def intermediate_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def conv_dim(self) -> int:
        """Channels of the convolution: x, then B and C."""
        return self.intermediate_size + 2 * self.n_groups * self.state_size

    @classmethod
    def from_hf(cls, arch: str, cfg: dict[str, Any]) -> MambaConfig:
        """The Mamba-2 keys of a Mamba2 (num_heads, head_dim, state_size, n_groups,
        conv_kernel, chunk_size, expand, use_conv_bias, use_bias, layer_norm_epsilon) or a
        Bamba config.json (the same as mamba_n_heads, mamba_d_head, ..., rms_norm_eps).

        Raises:
            ValueError: a missing or invalid key, heads x head_dim not expand x hidden_size,
                n_groups not dividing the heads, or a value the mixer does not implement:
                a hidden_act other than silu, a time_step_limit other than (0, inf)
                (the message names the key).
        """
        bamba = arch == "BambaForCausalLM"
        key = (lambda name: f"mamba_{name}") if bamba else (lambda name: name)
        names = dict(
            num_heads=key("n_heads"),
            head_dim=key("d_head"),
            state_size=key("d_state"),
            n_groups=key("n_groups"),
            conv_kernel=key("d_conv"),
            chunk_size=key("chunk_size"),
            expand=key("expand"),
        )
        if not bamba:
            names |= dict(num_heads="num_heads", head_dim="head_dim", state_size="state_size")
            names |= dict(conv_kernel="conv_kernel", expand="expand")
        # transformers' defaults for keys a config.json may lack
        defaults = dict(n_groups=1 if bamba else 8, conv_kernel=4, chunk_size=256, expand=2)
        hidden = cfg["hidden_size"]
        if bamba and cfg.get("mamba_d_head", "auto") == "auto":
            heads = _int_at_least(cfg, names["num_heads"], arch, 1)
            cfg = cfg | {"mamba_d_head": cfg.get("mamba_expand", 2) * hidden // heads}
        sizes = {
            field: _int_at_least(cfg, name, arch, 1, defaults.get(field))
            for field, name in names.items()
        }
        expand = sizes.pop("expand")
        if sizes["num_heads"] * sizes["head_dim"] != expand * hidden:
            raise ValueError(
                f"config.json for {arch}: {names['num_heads']} x {names['head_dim']} "
                f"({sizes['num_heads']} x {sizes['head_dim']}) must equal {names['expand']} x "
                f"hidden_size ({expand} x {hidden})"
            )
        if sizes["num_heads"] % sizes["n_groups"]:
            raise ValueError(
                f"config.json for {arch}: {names['n_groups']} ({sizes['n_groups']}) must "
                f"divide {names['num_heads']} ({sizes['num_heads']})"
            )
        if cfg.get("hidden_act", "silu") != "silu":
            raise ValueError(
                f"config.json for {arch}: hidden_act {cfg['hidden_act']!r} is not supported "
                f"(the Mamba-2 mixer's convolution takes silu)"
            )
        limit = [_json_float(v) for v in cfg.get("time_step_limit") or (0.0, float("inf"))]
        if limit != [0.0, float("inf")]:
            raise ValueError(
                f"config.json for {arch}: time_step_limit {limit} is not supported (only "
                f"[0.0, inf]: step sizes are not clamped)"
            )
        eps = cfg.get("rms_norm_eps" if bamba else "layer_norm_epsilon", 1e-6 if bamba else 1e-5)
        return cls(
            conv_bias=bool(cfg.get(key("conv_bias") if bamba else "use_conv_bias", True)),
            proj_bias=bool(cfg.get(key("proj_bias") if bamba else "use_bias", False)),
            norm_eps=float(eps),
            **sizes,
        )


NORMS = ("rms", "gemma_rms", "layer")
NORM_PLACEMENTS = ("pre", "sandwich", "post", "parallel", "mamba")
ACTIVATIONS = ("silu", "gelu", "gelu_tanh")


@dataclass(frozen=True)
class ModelConfig:
    """What the decoder's forward pass needs to know, one field per HF key.

    `layer_types[i]` is "full_attention" or "sliding_attention" (empty means every layer
    is full attention); `sliding_window` is the window of the sliding layers.
    `attention_bias` puts biases on q/k/v (Qwen2 always has them); `qk_norm` normalises
    queries and keys before RoPE: "head" per head (Qwen3, Gemma 3), "projection" over
    the whole projection (OLMo 2).

    The fields after `raw` are the declared differences of the families beyond Llama
    (`families`); their defaults are Llama's:
    `norm`: "rms" (`ops.layers.rms_norm`), "gemma_rms" ((1 + weight) scale) or "layer"
    (LayerNorm with a bias), `rms_norm_eps` being the eps of every norm.
    `norm_placement`: "pre" (norm before attention and before the MLP), "sandwich"
    (Gemma 2/3: before and after each), "post" (OLMo 2: after each), "parallel"
    (GPT-NeoX: attention and MLP both read the layer's input) or "mamba" (Mamba-2: one
    norm before the mixer, no MLP).
    `hidden_act`: "silu", "gelu" or "gelu_tanh"; `gated_mlp`: gate/up projections
    (act(gate) * up) or a single up projection; `mlp_bias`, `o_proj_bias`: biases.
    `partial_rotary_factor`: the share of each head RoPE rotates; `local_rope_theta` and
    `local_rope_scaling`: the RoPE of sliding layers when it differs (Gemma 3).
    `attention_scale`: the softmax scale (default head_dim ** -0.5);
    `attn_logit_softcapping`, `final_logit_softcapping`: cap * tanh(x / cap) on the
    attention scores and on the logits (Gemma 2). `embedding_multiplier` scales the token
    embeddings (Gemma: sqrt(hidden_size)); `position_embedding` is "rope" or "learned"
    (GPT-2: a table of positions added to the embeddings). `moe` describes the sparse MLP of a
    mixture-of-experts family (None for a dense model). `mla` describes multi-head latent
    attention (DeepSeek-V2/V3; None for the decoder's attention), `head_dim` then being
    the q/k head size (nope + rope); `rope_interleaved` rotates pairs (2i, 2i + 1) (GPT-J's
    layout, DeepSeek's) instead of (i, i + d/2). `mamba` describes the Mamba-2 mixer of
    the "mamba" layers of `layer_types` (Mamba-2, Bamba; None without such layers);
    `position_embedding` "none" means no positional signal (a pure state-space model).
    An encoder (BERT, `model.bert`) has `is_causal` False (every token attends to every
    token of its sequence), `type_vocab_size` token types (segment A / B of a pair)
    added to the embeddings, and `num_labels` outputs of its classification head (0: no
    head).
    """

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    qk_norm: str | None = None
    sliding_window: int | None = None
    layer_types: tuple[str, ...] = ()
    dtype: str = "float32"
    bos_token_id: int | None = None
    eos_token_id: tuple[int, ...] = ()
    moe: MoEConfig | None = None
    raw: dict = field(default_factory=dict, repr=False, compare=False)
    norm: str = "rms"
    norm_placement: str = "pre"
    hidden_act: str = "silu"
    gated_mlp: bool = True
    mlp_bias: bool = False
    o_proj_bias: bool = False
    partial_rotary_factor: float = 1.0
    local_rope_theta: float | None = None
    local_rope_scaling: dict | None = None
    attention_scale: float | None = None
    attn_logit_softcapping: float | None = None
    final_logit_softcapping: float | None = None
    embedding_multiplier: float | None = None
    position_embedding: str = "rope"
    mla: MLAConfig | None = None
    rope_interleaved: bool = False
    mamba: MambaConfig | None = None
    is_causal: bool = True
    type_vocab_size: int = 0
    num_labels: int = 0

    @property
    def rotary_dim(self) -> int:
        """The features of each head RoPE rotates (even): MLA's qk_rope_head_dim, else
        head_dim times partial_rotary_factor."""
        if self.mla is not None:
            return self.mla.qk_rope_head_dim
        return int(self.head_dim * self.partial_rotary_factor) // 2 * 2

    def __post_init__(self) -> None:
        for name, allowed in (
            ("norm", NORMS),
            ("norm_placement", NORM_PLACEMENTS),
            ("hidden_act", ACTIVATIONS),
            ("qk_norm", (None, "head", "projection")),
            ("position_embedding", ("rope", "learned", "none")),
        ):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {getattr(self, name)!r}")
        if not self.gated_mlp and self.hidden_act == "silu":
            raise ValueError("an MLP without a gate (gated_mlp=False) takes a gelu hidden_act")
        if not self.layer_types:
            object.__setattr__(self, "layer_types", ("full_attention",) * self.num_hidden_layers)
        if len(self.layer_types) != self.num_hidden_layers:
            raise ValueError(
                f"layer_types must name {self.num_hidden_layers} layers, got {self.layer_types}"
            )
        kinds = {"full_attention", "sliding_attention", "mamba"}
        if not set(self.layer_types) <= kinds:
            raise ValueError(f"layer_types must be among {sorted(kinds)}, got {self.layer_types}")
        if ("mamba" in self.layer_types) != (self.mamba is not None):
            raise ValueError("mamba layers need a mamba config, and a mamba config mamba layers")
        if "sliding_attention" in self.layer_types and not self.sliding_window:
            raise ValueError(
                f"sliding_attention layers need a sliding_window, got {self.sliding_window!r}"
            )

    @classmethod
    def from_hf(cls, cfg: dict[str, Any]) -> ModelConfig:
        """Build from the dict of a `config.json` (transformers 4.x and 5.x layouts)."""
        archs = cfg.get("architectures") or []
        if len(archs) != 1:
            raise ValueError(f"config.json must name exactly one architecture, got {archs!r}")
        arch = archs[0]
        family = FAMILIES.get(arch)
        if family is not None:
            cfg = family.hf_keys(cfg)
        for key in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
        ):
            _require(cfg, key, arch)
        heads = cfg["num_attention_heads"]
        rope = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
        theta = rope.pop("rope_theta", cfg.get("rope_theta", 10000.0))
        partial = rope.pop("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0))
        rope = check_rope_scaling(rope, "rope_scaling")
        num_layers = cfg["num_hidden_layers"]
        window = cfg.get("sliding_window")
        if arch.startswith("Qwen") and not cfg.get("use_sliding_window", False):
            window = None
        layer_types = tuple(cfg.get("layer_types") or ())
        if not layer_types:
            sliding = "sliding_attention" if window else "full_attention"
            layer_types = (sliding,) * num_layers
        if window is None:
            layer_types = ("full_attention",) * num_layers
        eos = cfg.get("eos_token_id")
        dtype = str(cfg.get("dtype") or cfg.get("torch_dtype") or "float32")
        fields = dict(
            architecture=arch,
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_hidden_layers=num_layers,
            num_attention_heads=heads,
            num_key_value_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            rope_theta=float(theta),
            rope_scaling=rope or None,
            max_position_embeddings=cfg.get("max_position_embeddings", 2048),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            attention_bias=(
                bool(cfg.get("attention_bias", False))
                or arch == "Qwen2ForCausalLM"
                or (arch == "Qwen2MoeForCausalLM" and bool(cfg.get("qkv_bias", True)))
            ),
            qk_norm="head" if arch in ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM") else None,
            sliding_window=window,
            layer_types=layer_types,
            dtype=dtype if dtype in DTYPES else "float32",
            bos_token_id=cfg.get("bos_token_id"),
            eos_token_id=tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,)),
            moe=MoEConfig.from_hf(arch, cfg) if arch in MOE_ARCHITECTURES else None,
            mla=MLAConfig.from_hf(arch, cfg) if arch in DEEPSEEK_ARCHITECTURES else None,
            mamba=MambaConfig.from_hf(arch, cfg) if arch in MAMBA_ARCHITECTURES else None,
            raw=cfg,
            partial_rotary_factor=float(partial),
            hidden_act=hf_activation(cfg.get("hidden_act", "silu"), "hidden_act"),
        )
        if family is not None:
            fields.update(family.fields(cfg, fields))
        return cls(**fields)

    @classmethod
    def from_pretrained(cls, model_dir: str | Path) -> ModelConfig:
        """Read ``config.json`` of a model directory (see `from_hf`), or the metadata of a
        .gguf file (`pyagent_ref.quant.gguf.read_config`).

        Raises:
            FileNotFoundError: the directory has no config.json.
            ValueError: config.json is not a JSON object (the message names the file and,
                for invalid JSON, the line and column), or lacks what `from_hf` needs.
        """
        from ..quant.gguf import is_gguf, read_config

        if is_gguf(model_dir):  # the metadata of a llama.cpp file
            return read_config(model_dir)
        path = Path(model_dir) / "config.json"
        if not path.is_file():
            raise FileNotFoundError(f"no config.json in model directory {str(model_dir)!r}")
        return cls.from_hf(read_json_object(path))
