"""A random Llama with a byte-level BPE tokenizer, shared by the engine tests."""

from __future__ import annotations

import pytest

from tests.tiny import TINY_LLAMA

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture(scope="session")
def tiny_llm_dir(tmp_path_factory):
    """A directory with a random Llama and a byte-level BPE tokenizer of the same vocab."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from tests.tokenize.helpers import train_byte_level_bpe, write_hf_dir

    tk = train_byte_level_bpe()
    path = tmp_path_factory.mktemp("tiny-llm")
    write_hf_dir(
        path, tk, {"eos_token": "</s>", "bos_token": "<s>", "chat_template": CHAT_TEMPLATE}
    )
    torch.manual_seed(1)
    config = transformers.LlamaConfig(
        **(TINY_LLAMA | {"vocab_size": tk.get_vocab_size()}),
        eos_token_id=tk.token_to_id("</s>"),
        bos_token_id=None,
        pad_token_id=None,
    )
    model = transformers.LlamaForCausalLM(config).eval()
    model.save_pretrained(path)
    return model, path
