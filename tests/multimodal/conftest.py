"""A tiny random LLaVA with a byte-level BPE tokenizer that knows "<image>" and a CLIP
image processor of 16 x 16 pixels, shared by the multimodal tests."""

from __future__ import annotations

import pytest

from tests.engine.conftest import tiny_llm_dir  # noqa: F401  (a text-only model)
from tests.tiny import TINY_LLAMA

# a chat template that renders OpenAI-style content parts: "<image>" for an image part
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}"
    "{% for part in m['content'] %}{% if part['type'] == 'text' %}{{ part['text'] }}"
    "{% else %}<image>{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
TINY_CLIP = dict(
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=3,
    num_attention_heads=4,
    image_size=16,
    patch_size=4,
    projection_dim=32,
)
IMAGE_TOKENS = 16  # (16 / 4) ** 2 patches, the class token dropped


@pytest.fixture(scope="session")
def tiny_llava_dir(tmp_path_factory):
    """(HF LlavaForConditionalGeneration, its directory)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("PIL")
    from tests.tokenize.helpers import SPECIALS, train_byte_level_bpe, write_hf_dir

    tk = train_byte_level_bpe(special_tokens=[*SPECIALS, "<image>"])
    path = tmp_path_factory.mktemp("tiny-llava")
    write_hf_dir(
        path, tk, {"eos_token": "</s>", "bos_token": "<s>", "chat_template": CHAT_TEMPLATE}
    )
    torch.manual_seed(2)
    config = transformers.LlavaConfig(
        vision_config=transformers.CLIPVisionConfig(**TINY_CLIP),
        text_config=transformers.LlamaConfig(
            **(TINY_LLAMA | {"vocab_size": tk.get_vocab_size()}),
            eos_token_id=tk.token_to_id("</s>"),
            bos_token_id=None,
            pad_token_id=None,
        ),
        image_token_id=tk.token_to_id("<image>"),
    )
    config._attn_implementation = "eager"
    model = transformers.LlavaForConditionalGeneration(config).eval()
    model.save_pretrained(path)
    processor = transformers.CLIPImageProcessorPil(
        size={"shortest_edge": 16}, crop_size={"height": 16, "width": 16}
    )
    processor.save_pretrained(path)
    return model, path


def random_image(seed: int, size=(20, 24)):
    """A random RGB PIL image (height, width)."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (*size, 3), dtype=np.uint8))
