"""Model execution: Llama-family models on a paged KV cache, weight loading, and the
embedded default model (`default_model_path`) and its draft (`default_draft_model_path`)."""

from .config import ModelConfig
from .default_model import default_draft_model_path, default_model_path
from .llama import AttentionMetadata, LlamaForCausalLM
from .loader import load_model
from .registry import ARCHITECTURES, resolve_architecture

__all__ = [
    "ARCHITECTURES",
    "AttentionMetadata",
    "LlamaForCausalLM",
    "ModelConfig",
    "default_draft_model_path",
    "default_model_path",
    "load_model",
    "resolve_architecture",
]
