"""Which class implements which `architectures` name of a config.json."""

from __future__ import annotations

from torch import nn

from .bert import BertForSequenceClassification, BertModel
from .deepseek import DeepseekForCausalLM
from .llama import LlamaForCausalLM
from .llava import LlavaForConditionalGeneration
from .mamba import Mamba2ForCausalLM, MambaHybridForCausalLM
from .moe import MixtralForCausalLM, QwenMoeForCausalLM
from .qwen2_5_vl import Qwen2_5_VLForConditionalGeneration
from .qwen2_vl import Qwen2VLForConditionalGeneration

ARCHITECTURES: dict[str, type[nn.Module]] = {
    "LlamaForCausalLM": LlamaForCausalLM,
    "MistralForCausalLM": LlamaForCausalLM,
    "Qwen2ForCausalLM": LlamaForCausalLM,
    "Qwen3ForCausalLM": LlamaForCausalLM,
    # the dense families of `families`: the same decoder with their declared differences
    "GemmaForCausalLM": LlamaForCausalLM,
    "Gemma2ForCausalLM": LlamaForCausalLM,
    "Gemma3ForCausalLM": LlamaForCausalLM,
    "Phi3ForCausalLM": LlamaForCausalLM,
    "Olmo2ForCausalLM": LlamaForCausalLM,
    "GPTNeoXForCausalLM": LlamaForCausalLM,
    "GPT2LMHeadModel": LlamaForCausalLM,
    # the mixtures of experts of `moe`: the decoder with sparse MoE blocks
    "MixtralForCausalLM": MixtralForCausalLM,
    "Qwen2MoeForCausalLM": QwenMoeForCausalLM,
    "Qwen3MoeForCausalLM": QwenMoeForCausalLM,
    # multi-head latent attention on the MoE decoder (`deepseek`)
    "DeepseekV2ForCausalLM": DeepseekForCausalLM,
    "DeepseekV3ForCausalLM": DeepseekForCausalLM,
    # state-space layers (`mamba`): Mamba-2 alone, and among attention layers (Bamba)
    "Mamba2ForCausalLM": Mamba2ForCausalLM,
    "BambaForCausalLM": MambaHybridForCausalLM,
    # encoders (`bert`): bidirectional, prompts pooled instead of continued
    "BertModel": BertModel,
    "BertForSequenceClassification": BertForSequenceClassification,
    # vision-language (`llava`): a CLIP tower and a projector feeding the decoder
    "LlavaForConditionalGeneration": LlavaForConditionalGeneration,
    # dynamic-resolution vision and M-RoPE (`qwen2_vl`), with window attention (`qwen2_5_vl`)
    "Qwen2VLForConditionalGeneration": Qwen2VLForConditionalGeneration,
    "Qwen2_5_VLForConditionalGeneration": Qwen2_5_VLForConditionalGeneration,
}


def resolve_architecture(name: str) -> type[nn.Module]:
    """The model class for an architecture name; ValueError naming it if unsupported."""
    try:
        return ARCHITECTURES[name]
    except KeyError:
        raise ValueError(
            f"architecture {name!r} is not supported; supported: {sorted(ARCHITECTURES)}"
        ) from None
