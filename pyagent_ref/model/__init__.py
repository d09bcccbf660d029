"""Model execution: Llama-family models on a paged KV cache, and weight loading."""

from .config import ModelConfig
from .llama import AttentionMetadata, LlamaForCausalLM
from .loader import load_model
from .registry import ARCHITECTURES, resolve_architecture

__all__ = [
    "ARCHITECTURES",
    "AttentionMetadata",
    "LlamaForCausalLM",
    "ModelConfig",
    "load_model",
    "resolve_architecture",
]
