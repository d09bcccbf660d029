"""Qwen2.5-VL through the engine: LLM.generate with a tiny random Qwen2.5-VL (windows of
2 x 2 merge units, full attention in one block of three) equals HF's greedy generate
with images of different sizes in the prompt, whole windows and cut-short ones, through
chunked prefill and a prefix-cache hit; a video is refused by name. The engine path is
Qwen2-VL's (`test_qwen2_vl_engine`): these check the windowed tower inside it."""

from __future__ import annotations

import pytest

from tests.multimodal.conftest import random_image
from tests.tiny import TINY_LLAMA

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("PIL")

from tests.multimodal.qwen_vl import (  # noqa: E402
    GREEDY,
    PROMPT,
    assert_matches_hf,
    image_grid,
    make_llm,
    write_tiny_qwen_vl,
)


@pytest.fixture(scope="module")
def tiny_qwen2_5_vl_dir(tmp_path_factory):
    """(HF Qwen2_5_VLForConditionalGeneration, its directory): `write_tiny_qwen_vl`."""
    path = tmp_path_factory.mktemp("tiny-qwen2.5-vl")
    vision = dict(
        depth=3,
        hidden_size=32,
        out_hidden_size=TINY_LLAMA["hidden_size"],
        intermediate_size=48,
        num_heads=4,
        patch_size=4,
        spatial_merge_size=2,
        temporal_patch_size=2,
        window_size=16,
        fullatt_block_indexes=[1],
    )
    model = write_tiny_qwen_vl(
        path,
        transformers.Qwen2_5_VLConfig,
        transformers.Qwen2_5_VLForConditionalGeneration,
        vision,
        seed=5,
    )
    return model, path


@pytest.fixture(scope="module")
def llm(tiny_qwen2_5_vl_dir):
    engine = make_llm(tiny_qwen2_5_vl_dir[1])
    yield engine
    engine.shutdown()


# merged grids 2 x 3 (a window cut short), 4 x 4 (whole windows), 5 x 3
@pytest.mark.parametrize("size", [(20, 24), (32, 32), (40, 24)], ids=str)
def test_images_of_different_sizes_match_hf(tiny_qwen2_5_vl_dir, llm, size):
    hf, path = tiny_qwen2_5_vl_dir
    image = random_image(0, size)
    out = llm.generate({"prompt": PROMPT, "multi_modal_data": {"image": image}}, GREEDY)[0]
    token = hf.config.image_token_id
    assert out.prompt_token_ids.count(token) == int(image_grid(path, image).prod()) // 4
    assert_matches_hf(out, hf, path, [image])


def test_chunked_prefill_through_the_images_matches_hf(tiny_qwen2_5_vl_dir):
    """Chunks of 5 tokens start and end inside both images (each encoded once)."""
    hf, path = tiny_qwen2_5_vl_dir
    llm = make_llm(path, max_num_batched_tokens=5)
    images = [random_image(1, (32, 32)), random_image(2, (16, 24))]
    prompt = PROMPT + " and <|vision_start|><|image_pad|><|vision_end|> too"
    out = llm.generate({"prompt": prompt, "multi_modal_data": {"image": images}}, GREEDY)[0]
    assert llm.core.scheduler.encoder_cache.misses == 2
    llm.shutdown()
    assert_matches_hf(out, hf, path, images)


def test_a_prefix_cache_hit_matches_hf(tiny_qwen2_5_vl_dir):
    """The second request's prefix, the image's blocks included, comes from the cache."""
    hf, path = tiny_qwen2_5_vl_dir
    llm = make_llm(path)
    image = random_image(3, (40, 24))
    prompts = [PROMPT + " one thing", PROMPT + " another thing entirely"]
    first = llm.generate({"prompt": prompts[0], "multi_modal_data": {"image": image}}, GREEDY)[0]
    hits_before = llm.core.kv.metrics().hit_rate
    second = llm.generate({"prompt": prompts[1], "multi_modal_data": {"image": image}}, GREEDY)[0]
    assert llm.core.kv.metrics().hit_rate > hits_before
    llm.shutdown()
    for out in (first, second):
        assert_matches_hf(out, hf, path, [image])


def test_a_video_is_refused_by_name(llm):
    frames = [random_image(4, (16, 16)), random_image(5, (16, 16))]
    with pytest.raises(ValueError, match="modality 'video', but Qwen2_5_VLForConditional"):
        llm.generate({"prompt": PROMPT, "multi_modal_data": {"video": frames}}, GREEDY)
