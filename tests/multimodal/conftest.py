"""The multimodal tests' shared pieces: the tiny LLaVA's shape (its directory is the
root conftest's `tiny_llava_dir`), its chat template, random images, and the engine
tests' text-only model."""

from __future__ import annotations

from tests.engine.conftest import tiny_llm_dir  # noqa: F401  (a text-only model)

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


def random_image(seed: int, size=(20, 24)):
    """A random RGB PIL image (height, width)."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (*size, 3), dtype=np.uint8))
