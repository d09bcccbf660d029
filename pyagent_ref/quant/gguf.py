"""llama.cpp's .gguf files: a Llama-architecture model read into the engine, and written.

A .gguf file holds metadata (key -> value: the architecture's hyper-parameters under
"llama.*", the tokenizer under "tokenizer.ggml.*") and named tensors, each in one GGML type.
Reading (`read_config`, `load_gguf`, `load_gguf_tokenizer`):

- the config: `general.architecture` must be "llama"; llama.block_count,
  .embedding_length, .feed_forward_length, .attention.head_count(_kv), .attention.key_length,
  .attention.layer_norm_rms_epsilon, .rope.freq_base and .context_length become the
  config.json keys of `ModelConfig.from_hf`; the vocabulary size is token_embd's rows; the
  embeddings are tied when the file has no `output.weight`.
- the weights: token_embd -> embed_tokens, blk.N.attn_norm / ffn_norm -> the layer's two
  RMS norms, output_norm -> norm (all dequantized to float at load); attn_q, attn_k,
  attn_v, attn_output, ffn_gate, ffn_up, ffn_down and output stay in their GGML type in a
  `GGUFLinear` that multiplies through `ops.gguf.gguf_matmul` (F32 / F16 / BF16 tensors:
  a float matmul). llama.cpp's converter permutes the rows of attn_q and attn_k from
  Hugging Face's rotate-half RoPE layout to GGML's adjacent pairs (per head, row 2i + j of
  the GGML tensor is HF row i + j * head_dim / 2); reading inverts that permutation on whole
  rows, so quantized bytes are moved, never requantized.
- the tokenizer: a byte-level BPE vocabulary (tokenizer.ggml.model "gpt2" with
  pre-tokenizer "gpt-2" or "default": tokens, merges, token types, BOS / EOS / padding ids,
  chat template) becomes a tokenizer.json; other tokenizers need a Hugging Face tokenizer
  directory (`LLM(model, tokenizer=DIR)`, `--tokenizer DIR`) and the error says so.

Writing (`write_gguf`): a Llama-family model directory as a .gguf in F32 or one of
`ops.gguf`'s formats, quantized with `ops.gguf.quantize` (llama.cpp's reference
quantizers); norms stay F32 and a tensor whose rows are not a whole number of the format's
blocks is written F16, as llama.cpp's quantizer falls back.

Errors (ValueError) name the value: a file that is not GGUF, an architecture or tensor type
this reader does not implement, a tensor missing or of the wrong shape.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import torch
from torch import nn

from ..ops import gguf as gguf_ops

FLOAT_TYPES = ("F32", "F16", "BF16")
"""GGML float types read as float weights."""
TYPES = FLOAT_TYPES + gguf_ops.FORMATS
"""Every GGML tensor type the reader takes."""
WRITE_TYPES = ("F32",) + gguf_ops.FORMATS
"""The types `write_gguf` writes."""

_LINEAR = {  # GGUF tensor of block N -> (our module under layers.N, its shard index)
    "attn_q": ("self_attn.qkv_proj", 0),
    "attn_k": ("self_attn.qkv_proj", 1),
    "attn_v": ("self_attn.qkv_proj", 2),
    "attn_output": ("self_attn.o_proj", 0),
    "ffn_gate": ("mlp.gate_up_proj", 0),
    "ffn_up": ("mlp.gate_up_proj", 1),
    "ffn_down": ("mlp.down_proj", 0),
}
_NORMS = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}
_HF_LINEAR = {  # GGUF tensor -> the HF checkpoint name (block N)
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


def is_gguf(path: str | Path) -> bool:
    """Whether `path` names a .gguf file (by its suffix) rather than a model directory."""
    return str(path).endswith(".gguf")


def _gguf() -> Any:
    try:
        import gguf
    except ImportError as exc:
        raise ImportError("reading .gguf files needs gguf: pip install 'pyagent[gguf]'") from exc
    return gguf


# --- reading --------------------------------------------------------------------------------


def open_gguf(path: str | Path) -> Any:
    """A `gguf.GGUFReader` of the file; FileNotFoundError or ValueError naming the file."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no GGUF file {str(path)!r}")
    try:
        return _gguf().GGUFReader(path)
    except (ValueError, OSError, IndexError, KeyError, TypeError) as exc:
        raise ValueError(f"{str(path)!r} is not a readable GGUF file: {exc}") from exc


def _field(reader: Any, key: str, default: Any = None) -> Any:
    field = reader.fields.get(key)
    if field is None:
        if default is None:
            raise ValueError(f"GGUF file lacks metadata key {key!r}")
        return default
    return field.contents()


def _decimal(value: Any) -> float:
    """A float32 metadata value as the shortest decimal that rounds to it (GGUF stores the
    config's 1e-05 as float32 9.99999974e-06; this gives 1e-05 back)."""
    return float(str(np.float32(value)))


def _tensors(reader: Any) -> dict[str, Any]:
    return {t.name: t for t in reader.tensors}


def config_dict(reader: Any) -> dict[str, Any]:
    """The config.json dict (`ModelConfig.from_hf`'s input) of a GGUF file's metadata."""
    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise ValueError(f"GGUF architecture must be 'llama', got {arch!r}")
    tensors = _tensors(reader)
    if "token_embd.weight" not in tensors:
        raise ValueError("GGUF file lacks tensor 'token_embd.weight'")
    if "rope_freqs.weight" in tensors or "llama.rope.scaling.type" in reader.fields:
        raise ValueError("GGUF file uses RoPE scaling (rope_freqs), which this reader lacks")
    hidden = int(_field(reader, "llama.embedding_length"))
    heads = int(_field(reader, "llama.attention.head_count"))
    cfg = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": int(tensors["token_embd.weight"].shape[1]),
        "hidden_size": hidden,
        "intermediate_size": int(_field(reader, "llama.feed_forward_length")),
        "num_hidden_layers": int(_field(reader, "llama.block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(_field(reader, "llama.attention.head_count_kv", heads)),
        "head_dim": int(_field(reader, "llama.attention.key_length", hidden // heads)),
        "max_position_embeddings": int(_field(reader, "llama.context_length")),
        "rms_norm_eps": _decimal(_field(reader, "llama.attention.layer_norm_rms_epsilon")),
        "rope_theta": _decimal(_field(reader, "llama.rope.freq_base", 10000.0)),
        "tie_word_embeddings": "output.weight" not in tensors,
        "hidden_act": "silu",
        "torch_dtype": "float32",
    }
    for key in ("bos", "eos", "padding"):
        if f"tokenizer.ggml.{key}_token_id" in reader.fields:
            name = "pad" if key == "padding" else key
            cfg[f"{name}_token_id"] = int(_field(reader, f"tokenizer.ggml.{key}_token_id"))
    return cfg


def read_config(path: str | Path) -> Any:
    """The `ModelConfig` of a .gguf file (see the module docstring)."""
    from ..model.config import ModelConfig

    return ModelConfig.from_hf(config_dict(open_gguf(path)))


def _type_name(tensor: Any) -> str:
    name = tensor.tensor_type.name
    if name not in TYPES:
        raise ValueError(f"GGUF tensor {tensor.name!r} has type {name}, not one of {TYPES}")
    return name


def _rows(tensor: Any, shape: tuple[int, int]) -> tuple[np.ndarray, str]:
    """(rows, float32 (out, in) for a float type or uint8 (out, bytes) blocks, the type)."""
    kind = _type_name(tensor)
    want = (shape[1], shape[0])  # GGML lists the row length first
    if tuple(int(n) for n in tensor.shape) != want:
        got = tuple(int(n) for n in tensor.shape)
        raise ValueError(f"GGUF tensor {tensor.name!r} has shape {got}, expected {want}")
    data = np.asarray(tensor.data)
    if kind in FLOAT_TYPES:
        flat = data if kind != "BF16" else _gguf().quants.dequantize(data, tensor.tensor_type)
        return np.asarray(flat, np.float32).reshape(shape), kind
    return data.reshape(shape[0], -1), kind


def unpermute_rope_rows(rows: np.ndarray, heads: int) -> np.ndarray:
    """Invert llama.cpp's per-head row permutation of attn_q / attn_k (module docstring)."""
    n = rows.shape[0]
    return rows.reshape(heads, n // heads // 2, 2, -1).swapaxes(1, 2).reshape(rows.shape)


def permute_rope_rows(rows: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's permutation: HF rotate-half rows -> GGML's adjacent pairs, per head."""
    n = rows.shape[0]
    return rows.reshape(heads, 2, n // heads // 2, -1).swapaxes(1, 2).reshape(rows.shape)


class GGUFLinear(nn.Module):
    """y = x @ W^T for W the row-wise concatenation of GGUF tensors (q | k | v, gate | up),
    each kept in its own GGML type: `ops.gguf.gguf_matmul` for a block format, a float
    matmul for F32 / F16 / BF16 (read as float). No bias."""

    def __init__(self, parts: list[tuple[np.ndarray, str]], ops: ModuleType) -> None:
        super().__init__()
        self.ops = ops
        self.formats = [kind for _, kind in parts]
        for i, (data, _) in enumerate(parts):
            self.register_buffer(f"part{i}", torch.from_numpy(np.array(data, copy=True)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        outs = []
        for i, kind in enumerate(self.formats):
            data = getattr(self, f"part{i}")
            if kind in FLOAT_TYPES:
                outs.append(flat @ data.to(flat.dtype).T)
            else:
                outs.append(self.ops.gguf.gguf_matmul(flat, data, kind))
        y = outs[0] if len(outs) == 1 else torch.cat(outs, dim=-1)
        return y.reshape(*x.shape[:-1], y.shape[-1])


def load_gguf(
    path: str | Path,
    dtype: str | None = None,
    device: str = "cpu",
    ops: ModuleType | None = None,
) -> nn.Module:
    """The model of a .gguf file, its linear layers kept in their GGML types.

    Args:
        path: a .gguf file of the "llama" architecture.
        dtype: "float32" (default), "bfloat16" or "float16": the embeddings, norms,
            activations and the float linear layers.
        device: where the model lives.
        ops: the ops namespace the layers call (default the reference).
    Raises:
        FileNotFoundError: no such file.
        ValueError: not a GGUF file, another architecture, a tensor type outside `TYPES`,
            a missing tensor or one of the wrong shape (the message names it).
    """
    from .. import ops as reference_ops
    from ..model.config import DTYPES, ModelConfig
    from ..model.llama import LlamaForCausalLM
    from ..model.loader import TORCH_DTYPES, check_device

    dev = check_device(device)
    reader = open_gguf(path)
    config = ModelConfig.from_hf(config_dict(reader))
    dtype = dtype or "float32"
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    ops = reference_ops if ops is None else ops
    tensors = _tensors(reader)

    def need(name: str) -> Any:
        if name not in tensors:
            raise ValueError(f"GGUF file lacks tensor {name!r}")
        return tensors[name]

    def float_rows(name: str, shape: tuple[int, ...]) -> torch.Tensor:
        tensor = need(name)
        if len(shape) == 1:
            data = np.asarray(tensor.data, np.float32)
            if _type_name(tensor) != "F32" or data.shape != shape:
                raise ValueError(f"GGUF tensor {name!r} must be F32 of shape {shape}")
            return torch.from_numpy(data.copy())
        rows, kind = _rows(tensor, shape)
        if kind not in FLOAT_TYPES:
            rows = gguf_ops.dequantize(rows, kind)
        return torch.from_numpy(np.array(rows, np.float32))

    with torch.device("meta"):
        model = LlamaForCausalLM(config, reference_ops)
    model = model.to_empty(device="cpu").float()
    hidden, head_dim = config.hidden_size, config.head_dim
    q_rows = config.num_attention_heads * head_dim
    kv_rows = config.num_key_value_heads * head_dim
    sizes = {
        "attn_q": (q_rows, hidden),
        "attn_k": (kv_rows, hidden),
        "attn_v": (kv_rows, hidden),
        "attn_output": (hidden, q_rows),
        "ffn_gate": (config.intermediate_size, hidden),
        "ffn_up": (config.intermediate_size, hidden),
        "ffn_down": (hidden, config.intermediate_size),
    }
    with torch.no_grad():
        model.embed_tokens.weight.copy_(
            float_rows("token_embd.weight", (config.vocab_size, hidden))
        )
        model.norm.weight.copy_(float_rows("output_norm.weight", (hidden,)))
        for n, layer in enumerate(model.layers):
            for short, ours in _NORMS.items():
                getattr(layer, ours).weight.copy_(float_rows(f"blk.{n}.{short}.weight", (hidden,)))
            parts: dict[str, list] = {}
            for short, (module, _) in _LINEAR.items():
                rows, kind = _rows(need(f"blk.{n}.{short}.weight"), sizes[short])
                if short in ("attn_q", "attn_k"):
                    heads = config.num_attention_heads if short == "attn_q" else kv_rows // head_dim
                    rows = unpermute_rope_rows(rows, heads)
                parts.setdefault(module, []).append((rows, kind))
            for module, module_parts in parts.items():
                parent, attr = module.split(".")
                setattr(getattr(layer, parent), attr, GGUFLinear(module_parts, ops))
        if not config.tie_word_embeddings:
            rows, kind = _rows(need("output.weight"), (config.vocab_size, hidden))
            model.lm_head = GGUFLinear([(rows, kind)], ops)
    model = model.to(device=dev, dtype=TORCH_DTYPES[dtype])  # buffers of blocks stay uint8
    model.use_ops(ops)
    model.build_rotary()
    return model.eval()


def load_gguf_tokenizer(path: str | Path, backend: str = "library", encoding_class: Any = None):
    """The tokenizer stored in a .gguf file's metadata (byte-level BPE only; see the module
    docstring), loaded like a checkpoint directory's tokenizer.json."""
    from ..tokenize import load_tokenizer

    reader = open_gguf(path)
    model = _field(reader, "tokenizer.ggml.model", "")
    pre = _field(reader, "tokenizer.ggml.pre", "default")
    if model != "gpt2" or pre not in ("gpt-2", "default"):
        raise ValueError(
            f"{str(path)!r} has tokenizer {model!r} (pre-tokenizer {pre!r}); only byte-level BPE "
            f"('gpt2' with pre-tokenizer 'gpt-2') is read from GGUF metadata: pass a Hugging "
            f"Face tokenizer directory (LLM(model, tokenizer=DIR), or --tokenizer DIR)"
        )
    tokens = [str(t) for t in _field(reader, "tokenizer.ggml.tokens")]
    types = list(_field(reader, "tokenizer.ggml.token_type", [1] * len(tokens)))
    merges = [str(m).split(" ") for m in _field(reader, "tokenizer.ggml.merges", [""])]
    merges = [m for m in merges if len(m) == 2]
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True}
    special = [
        {"id": i, "content": tok, "single_word": False, "lstrip": False, "rstrip": False}
        | {"normalized": False, "special": True}
        for i, (tok, kind) in enumerate(zip(tokens, types, strict=True))
        if int(kind) in (3, 4)  # GGML's CONTROL and USER_DEFINED tokens
    ]
    tokenizer_json = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": special,
        "normalizer": None,
        "pre_tokenizer": byte_level | {"use_regex": True},
        "post_processor": byte_level
        | {"add_prefix_space": True, "trim_offsets": False}
        | {"use_regex": True},
        "decoder": byte_level | {"add_prefix_space": True, "use_regex": True},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": {tok: i for i, tok in enumerate(tokens)},
            "merges": merges,
        },
    }
    config: dict[str, Any] = {"tokenizer_class": "PreTrainedTokenizerFast"}
    for key, name in (("bos", "bos_token"), ("eos", "eos_token"), ("padding", "pad_token")):
        if f"tokenizer.ggml.{key}_token_id" in reader.fields:
            config[name] = tokens[int(_field(reader, f"tokenizer.ggml.{key}_token_id"))]
    config["add_bos_token"] = bool(_field(reader, "tokenizer.ggml.add_bos_token", False))
    if "tokenizer.chat_template" in reader.fields:
        config["chat_template"] = str(_field(reader, "tokenizer.chat_template"))
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "tokenizer.json").write_text(json.dumps(tokenizer_json), encoding="utf-8")
        Path(tmp, "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
        return load_tokenizer(tmp, backend, encoding_class)


# --- writing --------------------------------------------------------------------------------


def write_gguf(model_dir: str | Path, out: str | Path, fmt: str = "Q8_0") -> Path:
    """Write a Llama-family model directory (config.json, safetensors, a byte-level BPE
    tokenizer.json) as a .gguf file in `fmt` (one of `WRITE_TYPES`); returns the path.

    Raises:
        ValueError: an unknown fmt (named), a model that is not LlamaForCausalLM.
    """
    gguf = _gguf()
    from safetensors.torch import load_file as load_torch

    from .._files import read_json_object
    from ..model.loader import safetensors_files

    if fmt not in WRITE_TYPES:
        raise ValueError(f"fmt must be one of {WRITE_TYPES}, got {fmt!r}")
    model_dir, out = Path(model_dir), Path(out)
    cfg = read_json_object(model_dir / "config.json")
    if cfg.get("architectures") != ["LlamaForCausalLM"]:
        raise ValueError(f"write_gguf writes LlamaForCausalLM, got {cfg.get('architectures')!r}")
    weights: dict[str, np.ndarray] = {}
    for file in safetensors_files(model_dir):
        for name, tensor in load_torch(str(file)).items():
            weights[name.removeprefix("model.")] = tensor.float().numpy()
    heads, kv_heads = cfg["num_attention_heads"], cfg.get("num_key_value_heads", 0)
    kv_heads = kv_heads or heads
    hidden = cfg["hidden_size"]
    writer = gguf.GGUFWriter(out, "llama")
    writer.add_name(model_dir.name)
    writer.add_context_length(cfg["max_position_embeddings"])
    writer.add_embedding_length(hidden)
    writer.add_block_count(cfg["num_hidden_layers"])
    writer.add_feed_forward_length(cfg["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    head_dim = cfg.get("head_dim") or hidden // heads
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_freq_base(float(cfg.get("rope_theta", 10000.0)))
    writer.add_layer_norm_rms_eps(float(cfg["rms_norm_eps"]))
    writer.add_vocab_size(cfg["vocab_size"])
    _write_tokenizer(writer, model_dir, cfg)

    def put(name: str, w: np.ndarray, quantize: bool = True) -> None:
        kind = fmt if quantize and w.ndim == 2 else "F32"
        if kind != "F32" and w.shape[1] % gguf_ops.BLOCKS[kind][0]:
            writer.add_tensor(name, w.astype(np.float16))
        elif kind == "F32":
            writer.add_tensor(name, w.astype(np.float32))
        else:
            raw = gguf_ops.quantize(w.astype(np.float32), kind)
            writer.add_tensor(name, raw, raw_dtype=gguf.GGMLQuantizationType[kind])

    put("token_embd.weight", weights["embed_tokens.weight"])
    for n in range(cfg["num_hidden_layers"]):
        for short, ours in _NORMS.items():
            put(f"blk.{n}.{short}.weight", weights[f"layers.{n}.{ours}.weight"], False)
        for short, hf in _HF_LINEAR.items():
            w = weights[f"layers.{n}.{hf}.weight"]
            if short in ("attn_q", "attn_k"):
                w = permute_rope_rows(w, heads if short == "attn_q" else kv_heads)
            put(f"blk.{n}.{short}.weight", w)
    put("output_norm.weight", weights["norm.weight"], False)
    if not cfg.get("tie_word_embeddings", False):
        put("output.weight", weights["lm_head.weight"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def _write_tokenizer(writer: Any, model_dir: Path, cfg: dict[str, Any]) -> None:
    """tokenizer.ggml.* of a byte-level BPE tokenizer.json (and tokenizer_config.json)."""
    from .._files import read_json_object

    data = read_json_object(model_dir / "tokenizer.json")
    vocab = data["model"]["vocab"]
    tokens = [""] * len(vocab)
    for token, i in vocab.items():
        tokens[i] = token
    special = {t["id"] for t in data.get("added_tokens", [])}
    merges = [m if isinstance(m, str) else " ".join(m) for m in data["model"]["merges"]]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")
    writer.add_token_list(tokens)
    writer.add_token_types([3 if i in special else 1 for i in range(len(tokens))])
    writer.add_token_merges(merges)
    for key, add in (
        ("bos_token_id", writer.add_bos_token_id),
        ("eos_token_id", writer.add_eos_token_id),
        ("pad_token_id", writer.add_pad_token_id),
    ):
        if cfg.get(key) is not None:
            add(int(cfg[key]))
    config_path = model_dir / "tokenizer_config.json"
    tok_cfg = read_json_object(config_path) if config_path.is_file() else {}
    writer.add_add_bos_token(bool(tok_cfg.get("add_bos_token", False)))
    if isinstance(tok_cfg.get("chat_template"), str):
        writer.add_chat_template(tok_cfg["chat_template"])
