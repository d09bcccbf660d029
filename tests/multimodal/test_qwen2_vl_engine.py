"""Qwen2-VL through the engine: LLM.generate with a tiny random Qwen2-VL equals HF's
greedy generate with images of different sizes in the prompt (dynamic resolution, M-RoPE
positions carried per token), through chunked prefill, a shared image, prefix-cache
hits, preemption; bad images are refused by name."""

from __future__ import annotations

import pytest

from tests.multimodal.conftest import random_image
from tests.tiny import TINY_LLAMA

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("PIL")

from pyagent_ref.sample.params import SamplingParams  # noqa: E402
from tests.multimodal.qwen_vl import (  # noqa: E402
    GREEDY,
    MAX_PIXELS,
    PROMPT,
    assert_matches_hf,
    image_grid,
    make_llm,
    write_tiny_qwen_vl,
)


@pytest.fixture(scope="module")
def tiny_qwen2_vl_dir(tmp_path_factory):
    """(HF Qwen2VLForConditionalGeneration, its directory): `write_tiny_qwen_vl`."""
    path = tmp_path_factory.mktemp("tiny-qwen2-vl")
    vision = dict(
        depth=2,
        embed_dim=32,
        hidden_size=TINY_LLAMA["hidden_size"],
        num_heads=4,
        patch_size=4,
        spatial_merge_size=2,
        temporal_patch_size=2,
    )
    model = write_tiny_qwen_vl(
        path, transformers.Qwen2VLConfig, transformers.Qwen2VLForConditionalGeneration, vision, 3
    )
    return model, path


@pytest.fixture(scope="module")
def llm(tiny_qwen2_vl_dir):
    return make_llm(tiny_qwen2_vl_dir[1])


@pytest.mark.parametrize("size", [(20, 24), (16, 40), (32, 32)], ids=str)
def test_images_of_different_sizes_match_hf(tiny_qwen2_vl_dir, llm, size):
    """Each image fills its own grid's number of positions; greedy equals HF's."""
    hf, path = tiny_qwen2_vl_dir
    image = random_image(0, size)
    out = llm.generate({"prompt": PROMPT, "multi_modal_data": {"image": image}}, GREEDY)[0]
    ids, token = out.prompt_token_ids, hf.config.image_token_id
    assert ids.count(token) == int(image_grid(path, image).prod()) // 4
    assert_matches_hf(out, hf, path, [image])


def test_chunked_prefill_through_the_images_matches_hf(tiny_qwen2_vl_dir):
    """Chunks of 5 tokens start and end inside both images (each encoded once)."""
    hf, path = tiny_qwen2_vl_dir
    llm = make_llm(path, max_num_batched_tokens=5)
    images = [random_image(1, (32, 32)), random_image(2, (16, 24))]
    prompt = PROMPT + " and <|vision_start|><|image_pad|><|vision_end|> too"
    out = llm.generate({"prompt": prompt, "multi_modal_data": {"image": images}}, GREEDY)[0]
    assert llm.core.scheduler.encoder_cache.misses == 2
    llm.shutdown()
    assert_matches_hf(out, hf, path, images)


def test_a_shared_image_and_a_prefix_cache_hit_match_hf(tiny_qwen2_vl_dir):
    """Two requests with the same image and text up to it: the second's prefix (the
    image's blocks included) comes from the prefix cache, and the positions of the rest
    are still the three-row ones: both equal HF."""
    hf, path = tiny_qwen2_vl_dir
    llm = make_llm(path)
    image = random_image(3, (40, 24))
    prompts = [PROMPT + " one thing", PROMPT + " another thing entirely"]
    first = llm.generate({"prompt": prompts[0], "multi_modal_data": {"image": image}}, GREEDY)[0]
    hits_before = llm.core.kv.metrics().hit_rate
    second = llm.generate({"prompt": prompts[1], "multi_modal_data": {"image": image}}, GREEDY)[0]
    assert llm.core.kv.metrics().hit_rate > hits_before
    for out in (first, second):
        assert_matches_hf(out, hf, path, [image])
    llm.shutdown()


def test_two_requests_in_one_step_share_an_image(tiny_qwen2_vl_dir):
    """One encode for both (an encoder-cache hit), each with its own text after it."""
    hf, path = tiny_qwen2_vl_dir
    llm = make_llm(path, enable_prefix_caching=False)
    image = random_image(9, (24, 40))
    prompts = [PROMPT + " first", PROMPT + " the second one"]
    outs = llm.generate(
        [{"prompt": p, "multi_modal_data": {"image": image}} for p in prompts], GREEDY
    )
    cache = llm.core.scheduler.encoder_cache
    assert (cache.misses, cache.hits) == (1, 1)
    for out in outs:
        assert_matches_hf(out, hf, path, [image])
    llm.shutdown()


def test_preempted_requests_recompute_with_their_positions(tiny_qwen2_vl_dir):
    hf, path = tiny_qwen2_vl_dir
    llm = make_llm(path, num_kv_blocks=16, enable_prefix_caching=False, max_model_len=48)
    images = [random_image(4, (32, 32)), random_image(5, (24, 32))]
    prompts = [{"prompt": PROMPT, "multi_modal_data": {"image": im}} for im in images]
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, logprobs=1)
    outs = llm.generate(prompts, params)
    assert llm.core.stats.preemptions > 0
    for image, out in zip(images, outs, strict=True):
        assert_matches_hf(out, hf, path, [image])
    llm.shutdown()


def test_text_only_prompts_match_hf(tiny_qwen2_vl_dir, llm):
    hf, _ = tiny_qwen2_vl_dir
    out = llm.generate("no picture here", GREEDY)[0]
    ids = out.prompt_token_ids
    with torch.no_grad():
        want = hf.generate(
            input_ids=torch.tensor([ids]), max_new_tokens=6, min_new_tokens=6, do_sample=False
        )
    assert out.outputs[0].token_ids == want[0, len(ids) :].tolist()


def test_the_encoder_budget_comes_from_the_processors_max_pixels(tiny_qwen2_vl_dir):
    """The budget per step and the encoder cache hold the largest image at the
    preprocessor's max_pixels (16 positions here), not at HF's default (15680)."""
    llm = make_llm(tiny_qwen2_vl_dir[1], max_num_batched_tokens=8)
    cfg = llm.core.scheduler_config
    assert cfg.max_num_encoder_tokens == cfg.encoder_cache_size == MAX_PIXELS // 8**2
    llm.shutdown()


def test_an_image_beyond_the_encoder_budget_is_refused(tiny_qwen2_vl_dir):
    """An image the processor makes larger than max_pixels (an extreme aspect ratio: the
    short side stays one merge unit, 8 x 352 pixels, 44 positions) is refused at
    admission, by its size; the engine goes on."""
    hf, path = tiny_qwen2_vl_dir
    llm = make_llm(path, max_num_batched_tokens=8)
    wide = random_image(11, (8, 1000))
    assert int(image_grid(path, wide).prod()) // 4 == 44
    with pytest.raises(ValueError, match="fills 44 positions, more than one step may encode"):
        llm.generate({"prompt": PROMPT, "multi_modal_data": {"image": wide}}, GREEDY)
    image = random_image(12, (24, 24))
    out = llm.generate({"prompt": PROMPT, "multi_modal_data": {"image": image}}, GREEDY)[0]
    assert_matches_hf(out, hf, path, [image])
    llm.shutdown()


def test_an_image_the_processor_refuses_is_named(llm):
    with pytest.raises(ValueError, match=r"image 0 \(1000 x 4\): absolute aspect ratio"):
        llm.generate(
            {"prompt": PROMPT, "multi_modal_data": {"image": random_image(8, (4, 1000))}}, GREEDY
        )


def test_the_decoder_on_the_accelerator_matches_hf(tiny_qwen2_vl_dir):
    """M-RoPE and the rest of the decoder on pyagent_accel's twins."""
    native = pytest.importorskip("pyagent_accel._native")
    if not hasattr(native, "apply_mrope"):
        pytest.skip("the installed accelerator predates apply_mrope")
    hf, path = tiny_qwen2_vl_dir
    llm = make_llm(path, ops="accel", max_num_batched_tokens=7)
    image = random_image(10, (24, 24))
    out = llm.generate({"prompt": PROMPT, "multi_modal_data": {"image": image}}, GREEDY)[0]
    assert_matches_hf(out, hf, path, [image])
    llm.shutdown()
