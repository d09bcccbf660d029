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

from pyagent_ref.engine.llm import LLM  # noqa: E402
from pyagent_ref.sample.params import SamplingParams  # noqa: E402

GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=1)
PROMPT = "look: <|vision_start|><|image_pad|><|vision_end|> and say"
# 4 x 4 patches merged 2 x 2: sides are multiples of 8 pixels, between 64 and 16 x 64
MIN_PIXELS, MAX_PIXELS = 8 * 8, 8 * 8 * 16


@pytest.fixture(scope="module")
def tiny_qwen2_vl_dir(tmp_path_factory):
    """(HF Qwen2VLForConditionalGeneration, its directory): a tiny random Qwen2-VL, a
    byte-level BPE tokenizer that knows its vision tokens, Qwen2-VL's image processor."""
    from tests.tokenize.helpers import SPECIALS, train_byte_level_bpe, write_hf_dir

    specials = ["<|image_pad|>", "<|vision_start|>", "<|vision_end|>", "<|video_pad|>"]
    tk = train_byte_level_bpe(special_tokens=[*SPECIALS, *specials])
    path = tmp_path_factory.mktemp("tiny-qwen2-vl")
    write_hf_dir(path, tk, {"eos_token": "</s>", "bos_token": "<s>"})
    torch.manual_seed(3)
    rope = {"rope_type": "mrope", "mrope_section": [2, 3, 3], "rope_theta": 10000.0}
    config = transformers.Qwen2VLConfig(
        text_config=dict(
            **(TINY_LLAMA | {"vocab_size": tk.get_vocab_size()}),
            rope_parameters=rope,
            eos_token_id=tk.token_to_id("</s>"),
            bos_token_id=None,
        ),
        vision_config=dict(
            depth=2,
            embed_dim=32,
            hidden_size=TINY_LLAMA["hidden_size"],
            num_heads=4,
            patch_size=4,
            spatial_merge_size=2,
            temporal_patch_size=2,
        ),
        image_token_id=tk.token_to_id("<|image_pad|>"),
        video_token_id=tk.token_to_id("<|video_pad|>"),
        vision_start_token_id=tk.token_to_id("<|vision_start|>"),
        vision_end_token_id=tk.token_to_id("<|vision_end|>"),
    )
    config._attn_implementation = "eager"
    model = transformers.Qwen2VLForConditionalGeneration(config).eval()
    model.save_pretrained(path)
    processor = transformers.Qwen2VLImageProcessorPil(
        patch_size=4,
        merge_size=2,
        temporal_patch_size=2,
        min_pixels=MIN_PIXELS,
        max_pixels=MAX_PIXELS,
    )
    processor.save_pretrained(path)
    return model, path


def make_llm(path, **kwargs):
    args = dict(
        block_size=4, num_kv_blocks=256, max_num_batched_tokens=64, ops="ref", max_model_len=128
    )
    return LLM(str(path), **(args | kwargs))


def hf_greedy(hf, path, ids, images, n):
    """HF's greedy continuation of expanded prompt ids with the images, and the log
    probability of each of its tokens."""
    processor = transformers.AutoImageProcessor.from_pretrained(path)
    made = processor(images=images, return_tensors="pt")
    input_ids = torch.tensor([ids])
    with torch.no_grad():
        out = hf.generate(
            input_ids=input_ids,
            pixel_values=made["pixel_values"],
            image_grid_thw=made["image_grid_thw"],
            mm_token_type_ids=(input_ids == hf.config.image_token_id).int(),
            max_new_tokens=n,
            min_new_tokens=n,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
        )
    tokens = out.sequences[0, len(ids) :].tolist()
    logprobs = [
        torch.log_softmax(s[0].float(), -1)[t].item()
        for s, t in zip(out.logits, tokens, strict=True)
    ]
    return tokens, logprobs


def assert_matches_hf(out, hf, path, images):
    """Our greedy tokens are HF's, and their log probabilities within 1e-4 (which the
    positions move even where the argmax does not)."""
    completion = out.outputs[0]
    assert completion.finish_reason == "length", completion.error
    tokens, logprobs = hf_greedy(hf, path, out.prompt_token_ids, images, len(completion.token_ids))
    assert completion.token_ids == tokens
    ours = [top[t].logprob for t, top in zip(tokens, completion.logprobs, strict=True)]
    assert ours == pytest.approx(logprobs, abs=1e-4)


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
    grid = transformers.AutoImageProcessor.from_pretrained(path)(images=[image])["image_grid_thw"]
    assert ids.count(token) == int(grid.prod()) // 4
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


def test_an_image_beyond_the_encoder_budget_is_refused(tiny_qwen2_vl_dir):
    """An image with more positions than one step may encode (a preprocessor whose
    max_pixels exceeds the default the budget is sized for) is refused at admission."""
    from pyagent_ref.sched import Request
    from pyagent_ref.sched.request import MultiModalFeature

    llm = make_llm(tiny_qwen2_vl_dir[1])
    budget = llm.core.scheduler_config.max_num_encoder_tokens
    assert budget == 28 * 28 * 1280 // 8**2
    big = Request("big", [1] * 8, mm_features=(MultiModalFeature("h", 0, budget + 1),))
    with pytest.raises(ValueError, match=f"fills {budget + 1} positions, more than one step"):
        llm.core.check_request(big)
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
