"""Model configuration, read from a Hugging Face `config.json`."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._files import read_json_object

DTYPES = ("float32", "bfloat16", "float16")


@dataclass(frozen=True)
class ModelConfig:
    """What the Llama-family forward pass needs to know, one field per HF key.

    `layer_types[i]` is "full_attention" or "sliding_attention" (empty means every layer
    is full attention); `sliding_window` is the window of the sliding layers.
    `attention_bias` puts biases on q/k/v (Qwen2 always has them); `qk_norm` applies an
    RMSNorm per head to queries and keys before RoPE (Qwen3).
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
    qk_norm: bool = False
    sliding_window: int | None = None
    layer_types: tuple[str, ...] = ()
    dtype: str = "float32"
    bos_token_id: int | None = None
    eos_token_id: tuple[int, ...] = ()
    raw: dict = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.layer_types:
            object.__setattr__(self, "layer_types", ("full_attention",) * self.num_hidden_layers)
        if len(self.layer_types) != self.num_hidden_layers:
            raise ValueError(
                f"layer_types must name {self.num_hidden_layers} layers, got {self.layer_types}"
            )
        kinds = {"full_attention", "sliding_attention"}
        if not set(self.layer_types) <= kinds:
            raise ValueError(f"layer_types must be among {sorted(kinds)}, got {self.layer_types}")
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
        for key in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
        ):
            if key not in cfg:
                raise ValueError(f"config.json for {arch} lacks {key!r}")
        heads = cfg["num_attention_heads"]
        rope = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
        theta = rope.pop("rope_theta", cfg.get("rope_theta", 10000.0))
        if rope.get("rope_type", rope.get("type", "default")) == "default":
            rope = {}
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
        return cls(
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
            attention_bias=bool(cfg.get("attention_bias", False)) or arch == "Qwen2ForCausalLM",
            qk_norm=arch == "Qwen3ForCausalLM",
            sliding_window=window,
            layer_types=layer_types,
            dtype=dtype if dtype in DTYPES else "float32",
            bos_token_id=cfg.get("bos_token_id"),
            eos_token_id=tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,)),
            raw=cfg,
        )

    @classmethod
    def from_pretrained(cls, model_dir: str | Path) -> ModelConfig:
        """Read ``config.json`` of a model directory (see `from_hf`).

        Raises:
            FileNotFoundError: the directory has no config.json.
            ValueError: config.json is not a JSON object (the message names the file and,
                for invalid JSON, the line and column), or lacks what `from_hf` needs.
        """
        path = Path(model_dir) / "config.json"
        if not path.is_file():
            raise FileNotFoundError(f"no config.json in model directory {str(model_dir)!r}")
        return cls.from_hf(read_json_object(path))
