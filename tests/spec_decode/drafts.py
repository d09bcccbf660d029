"""Draft checkpoints for the speculative-decoding tests: pyagent models saved in the HF
layout that `load_model` reads (q/k/v and gate/up split again, the `model.` prefix)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from pyagent_ref.model.llama import LlamaForCausalLM


def hf_state_dict(model: LlamaForCausalLM) -> dict[str, torch.Tensor]:
    """The model's parameters under HF names, the fused projections split."""
    cfg = model.config
    q, kv = cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim
    out = {}
    for name, param in model.named_parameters():
        tensor = param.detach().contiguous()
        prefix = "" if name.startswith("lm_head") else "model."
        if ".qkv_proj." in name:
            for part, piece in zip("qkv", tensor.split([q, kv, kv]), strict=True):
                out[prefix + name.replace("qkv_proj", f"{part}_proj")] = piece.contiguous()
        elif ".gate_up_proj." in name:
            gate, up = tensor.chunk(2)
            out[prefix + name.replace("gate_up_proj", "gate_proj")] = gate.contiguous()
            out[prefix + name.replace("gate_up_proj", "up_proj")] = up.contiguous()
        else:
            out[prefix + name] = tensor
    return out


def save_checkpoint(model: LlamaForCausalLM, path: Path, **config_overrides) -> Path:
    """Write `model` as an HF checkpoint directory (config.json, model.safetensors);
    `config_overrides` change config.json only (e.g. max_position_embeddings)."""
    cfg = model.config
    config = {
        "architectures": [cfg.architecture],
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_hidden_layers,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim,
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta,
        "max_position_embeddings": cfg.max_position_embeddings,
        "tie_word_embeddings": cfg.tie_word_embeddings,
    } | config_overrides
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    save_file(hf_state_dict(model), str(path / "model.safetensors"))
    return path


def noisy_copy(model: LlamaForCausalLM, scale: float, seed: int = 0) -> LlamaForCausalLM:
    """A copy of `model` with Gaussian noise of `scale` times each parameter's std added:
    a draft that agrees with the model often, not always."""
    copy = LlamaForCausalLM(model.config).eval()
    copy.load_state_dict(model.state_dict())
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in copy.parameters():
            noise = torch.randn(param.shape, generator=gen) * param.std() * scale
            param.add_(noise)
    return copy


def save_medusa_heads(
    model: LlamaForCausalLM, path: Path, num_heads: int = 3, scale: float = 0.05, seed: int = 0
):
    """Random Medusa heads for `model` in the layout `MedusaHeads.load` reads. Small
    weights (`scale`) make each head guess about what the LM head says of the state it
    reads, i.e. the last token again: right in the loops a random model falls into,
    wrong elsewhere, and the lower-ranked guesses of a tree sometimes right."""
    hidden = model.config.hidden_size
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for j in range(num_heads):
        tensors[f"heads.{j}.weight"] = torch.randn(hidden, hidden, generator=gen) * scale
        tensors[f"heads.{j}.bias"] = torch.randn(hidden, generator=gen) * scale
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps({"num_heads": num_heads, "hidden_size": hidden}))
    save_file(tensors, str(path / "medusa_heads.safetensors"))
    return path
