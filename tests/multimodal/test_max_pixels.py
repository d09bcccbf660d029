"""The Qwen2-VL family's max_pixels read from preprocessor_config.json without
transformers (`multimodal.processor.preprocessor_max_pixels`, the engine's encoder
budget) is the one HF's image processor uses, in each layout of the file."""

from __future__ import annotations

import json

import pytest

from pyagent_ref.multimodal.processor import preprocessor_max_pixels

BASE = {"image_processor_type": "Qwen2VLImageProcessor", "patch_size": 4, "merge_size": 2}


@pytest.mark.parametrize(
    "extra",
    [
        {"size": {"longest_edge": 4096, "shortest_edge": 64}},  # transformers 5's
        {"max_pixels": 4096, "min_pixels": 64},  # the released checkpoints'
        {"max_pixels": 4096, "min_pixels": 64, "size": {"max_pixels": 4096, "min_pixels": 64}},
        {"max_pixels": 4096, "size": {"longest_edge": 99, "shortest_edge": 64}},
        {},  # HF's default
    ],
    ids=["size", "top-level", "both-legacy", "top-level-wins", "default"],
)
def test_max_pixels_is_the_image_processors(tmp_path, extra):
    transformers = pytest.importorskip("transformers")
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(BASE | extra))
    hf = transformers.AutoImageProcessor.from_pretrained(tmp_path).size["longest_edge"]
    ours = preprocessor_max_pixels(tmp_path)
    assert ours == (4096 if extra else None)
    assert hf == (4096 if extra else 28 * 28 * 1280)


def test_no_file_and_bad_values(tmp_path):
    assert preprocessor_max_pixels(tmp_path) is None
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(BASE | {"max_pixels": 0}))
    with pytest.raises(ValueError, match="max_pixels must be an int >= 1, got 0"):
        preprocessor_max_pixels(tmp_path)
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(BASE | {"size": 7}))
    with pytest.raises(ValueError, match="a JSON object with an object as its size"):
        preprocessor_max_pixels(tmp_path)


def test_the_encoder_budget_of_one_image(tmp_path):
    """Positions of the largest image: from max_pixels for the Qwen2-VL family (HF's
    default without a preprocessor config), the tower's fixed count for LLaVA."""
    from types import SimpleNamespace

    pytest.importorskip("torch")
    from pyagent_ref.model.qwen2_vl import Qwen2VLVisionConfig
    from pyagent_ref.multimodal.processor import max_image_positions

    vision = Qwen2VLVisionConfig.from_hf(
        {
            "vision_config": {"embed_dim": 32, "num_heads": 4, "patch_size": 4},
            "mrope_section": [2, 3, 3],
            "image_token_id": 5,
        }
    )
    for arch in ("Qwen2VLForConditionalGeneration", "Qwen2_5_VLForConditionalGeneration"):
        assert max_image_positions(tmp_path, arch, vision) == 28 * 28 * 1280 // 8**2
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(BASE | {"max_pixels": 4096}))
    assert max_image_positions(tmp_path, "Qwen2VLForConditionalGeneration", vision) == 64
    llava = SimpleNamespace(num_image_tokens=576)
    assert max_image_positions(tmp_path, "LlavaForConditionalGeneration", llava) == 576
