"""Adapters made with PEFT on HF models, and our model fitted with them.

`make_adapter` builds a PEFT LoRA with random A and B (PEFT's default makes B zero, an
adapter that changes nothing) and, with DoRA, a magnitude moved off its initial norm, so
that every factor changes the logits; it saves the adapter and returns the PEFT model.
"""

from __future__ import annotations

import torch

# the modules PEFT targets in each family: the HF names of q/k/v/o and gate/up/down
TARGETS = {
    "phi3": ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"],
    "gpt-neox": ["query_key_value", "dense", "dense_h_to_4h", "dense_4h_to_h"],
    "gpt-neox-sequential": ["query_key_value", "dense", "dense_h_to_4h", "dense_4h_to_h"],
    "gpt2": ["c_attn", "c_proj", "c_fc"],
}
LLAMA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def make_adapter(
    hf,
    path,
    r: int = 4,
    alpha: float = 8,
    targets=LLAMA_TARGETS,
    use_dora: bool = False,
    use_rslora: bool = False,
    seed: int = 0,
):
    """Save a random PEFT LoRA adapter of `hf` (an HF model, left unchanged) at `path`;
    returns the PEFT model (eval mode) on a copy of it."""
    import copy

    import peft

    torch.manual_seed(seed)
    config = peft.LoraConfig(
        r=r,
        lora_alpha=alpha,
        target_modules=list(targets),
        use_dora=use_dora,
        use_rslora=use_rslora,
        init_lora_weights=False,
        fan_in_fan_out="c_attn" in targets,  # GPT-2's Conv1D
    )
    peft_model = peft.get_peft_model(copy.deepcopy(hf), config).eval()
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.mul_(4.0)  # PEFT's random init is small: make the update count
            if "lora_magnitude_vector" in name:
                param.mul_(1 + 0.2 * torch.randn_like(param))
    peft_model.save_pretrained(path)
    return peft_model


def fit(model, *, max_loras: int = 4, max_rank: int = 8, ops=None):
    """A LoRAManager on our `model` (its projections become LoRALinear)."""
    import pyagent_ref.ops
    from pyagent_ref.lora import LoRAConfig
    from pyagent_ref.lora.manager import LoRAManager

    return LoRAManager(model, LoRAConfig(max_loras, max_rank), ops or pyagent_ref.ops)


def peft_logits(peft_model, tokens, adapter: bool = True) -> torch.Tensor:
    with torch.no_grad():
        if adapter:
            return peft_model(input_ids=torch.tensor([tokens])).logits[0].float()
        with peft_model.disable_adapter():
            return peft_model(input_ids=torch.tensor([tokens])).logits[0].float()
