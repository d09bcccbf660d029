"""A tiny random Llama saved in HF layout, shared by the engine tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tiny_hf(tmp_path_factory):
    """(HF model, directory) of a 2-layer random Llama with vocab 97."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=97,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        eos_token_id=None,
        bos_token_id=None,
        pad_token_id=None,
    )
    model = transformers.LlamaForCausalLM(config).eval()
    path = tmp_path_factory.mktemp("tiny-llama")
    model.save_pretrained(path)
    return model, path
