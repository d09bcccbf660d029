"""Images through the engine: LLM.generate with a tiny random LLaVA equals HF generate;
the encoder cache, its budget, the prefix cache keyed by image hashes, bad inputs."""

from __future__ import annotations

import numpy as np
import pytest

from tests.multimodal.conftest import IMAGE_TOKENS, random_image

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("PIL")

from pyagent_ref.engine.llm import LLM  # noqa: E402
from pyagent_ref.sample.params import SamplingParams  # noqa: E402

GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
PROMPT = "describe <image> in words"


def make_llm(path, **kwargs):
    args = dict(
        block_size=4, num_kv_blocks=256, max_num_batched_tokens=64, ops="ref", max_model_len=128
    )
    return LLM(str(path), **(args | kwargs))


def hf_greedy(hf, processor_dir, ids, images, n):
    """HF's greedy continuation of expanded prompt ids with the images' pixel values."""
    import transformers

    processor = transformers.AutoImageProcessor.from_pretrained(processor_dir)
    pixels = processor(images=images, return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        out = hf.generate(
            input_ids=torch.tensor([ids]),
            pixel_values=pixels,
            max_new_tokens=n,
            do_sample=False,
            min_new_tokens=n,
        )
    return out[0, len(ids) :].tolist()


@pytest.fixture(scope="module")
def llm(tiny_llava_dir):
    return make_llm(tiny_llava_dir[1])


def test_the_placeholder_is_expanded_and_greedy_matches_hf(tiny_llava_dir, llm):
    hf, path = tiny_llava_dir
    image = random_image(0)
    out = llm.generate({"prompt": PROMPT, "multi_modal_data": {"image": image}}, GREEDY)[0]
    ids = out.prompt_token_ids
    token = hf.config.image_token_id
    assert ids.count(token) == IMAGE_TOKENS
    first = ids.index(token)
    assert ids[first : first + IMAGE_TOKENS] == [token] * IMAGE_TOKENS
    assert out.outputs[0].token_ids == hf_greedy(hf, path, ids, [image], 6)


@pytest.mark.parametrize("budget", [5, 11])
def test_chunked_prefill_through_images_matches_hf(tiny_llava_dir, budget):
    """Chunks of 5 or 11 tokens cut through both images' 16 placeholders; each image
    is encoded once and consumed in pieces."""
    hf, path = tiny_llava_dir
    llm = make_llm(path, max_num_batched_tokens=budget)
    images = [random_image(1), random_image(2, (30, 17))]
    prompt = {"prompt": "<image> and <image>: which?", "multi_modal_data": {"image": images}}
    out = llm.generate(prompt, GREEDY)[0]
    assert out.outputs[0].token_ids == hf_greedy(hf, path, out.prompt_token_ids, images, 6)
    cache = llm.core.scheduler.encoder_cache
    assert (cache.misses, cache.hits) == (2, 0)
    llm.shutdown()


def test_a_shared_image_is_encoded_once_and_shares_prefix_blocks(tiny_llava_dir):
    hf, path = tiny_llava_dir
    llm = make_llm(path)
    image = random_image(3)
    prompts = [
        {"prompt": f"{PROMPT} {suffix}", "multi_modal_data": {"image": image}}
        for suffix in ("please", "now")
    ]
    first = llm.generate(prompts[0], GREEDY)[0]
    hits_before = llm.core.kv.metrics().hit_rate
    second = llm.generate(prompts[1], GREEDY)[0]
    cache = llm.core.scheduler.encoder_cache
    # the second request's prefix (text + the image's blocks) comes from the prefix
    # cache: the image is not even encoded again
    assert cache.misses == 1
    assert llm.core.kv.metrics().hit_rate > hits_before
    for out in (first, second):
        assert out.outputs[0].token_ids == hf_greedy(hf, path, out.prompt_token_ids, [image], 6)
    llm.shutdown()


def test_concurrent_requests_share_one_encoder_output(tiny_llava_dir):
    """Without prefix caching, two requests of one step with the same image encode it
    once: the second references the first's entry (a hit)."""
    _, path = tiny_llava_dir
    llm = make_llm(path, enable_prefix_caching=False)
    image = random_image(4)
    prompts = [{"prompt": PROMPT, "multi_modal_data": {"image": image}}] * 2
    a, b = llm.generate(prompts, GREEDY)
    assert a.outputs[0].token_ids == b.outputs[0].token_ids
    cache = llm.core.scheduler.encoder_cache
    assert (cache.misses, cache.hits) == (1, 1)
    assert llm.core.runner.encoder_outputs.keys() == cache.sizes.keys()
    llm.shutdown()


def test_different_images_never_share_prefix_blocks(tiny_llava_dir):
    """The same placeholder tokens with another image: no block after the image's
    first is a hit, and the output follows the image (HF's)."""
    hf, path = tiny_llava_dir
    llm = make_llm(path)
    outs = [
        llm.generate({"prompt": PROMPT, "multi_modal_data": {"image": random_image(s)}}, GREEDY)[0]
        for s in (5, 6)
    ]
    assert llm.core.scheduler.encoder_cache.misses == 2
    for seed, out in zip((5, 6), outs, strict=True):
        expected = hf_greedy(hf, path, out.prompt_token_ids, [random_image(seed)], 6)
        assert out.outputs[0].token_ids == expected
    llm.shutdown()


def test_the_encoder_budget_defers_an_image_to_a_later_step(tiny_llava_dir):
    """A cache of one image: a second image waits until the first is consumed and its
    entry evicted; both requests finish with HF's tokens."""
    hf, path = tiny_llava_dir
    llm = make_llm(path, encoder_cache_size=IMAGE_TOKENS, enable_prefix_caching=False)
    images = [random_image(7), random_image(8)]
    prompts = [{"prompt": PROMPT, "multi_modal_data": {"image": im}} for im in images]
    outs = llm.generate(prompts, GREEDY)
    for image, out in zip(images, outs, strict=True):
        assert out.outputs[0].token_ids == hf_greedy(hf, path, out.prompt_token_ids, [image], 6)
    assert llm.core.scheduler.encoder_cache.misses == 2
    assert len(llm.core.runner.encoder_outputs) <= 1
    llm.shutdown()


@pytest.mark.parametrize(
    "data, error",
    [
        ({"image": b"not an image"}, "image 0 could not be decoded"),
        ({"image": "https://example.com/cat.png"}, "must be a base64 data URL"),
        ({"audio": np.zeros(8)}, "modality 'audio'"),
        ({"image": [random_image(0)] * 5}, r"5 images, more than the 4 allowed"),
        ({"image": [random_image(0)] * 2}, r"1 image placeholder token\(s\) .* for 2 image"),
        ("cat.png", "multi_modal_data must be a dict"),
    ],
)
def test_bad_inputs_are_refused_and_others_unaffected(llm, data, error):
    with pytest.raises((ValueError, TypeError), match=error):
        llm.generate({"prompt": PROMPT, "multi_modal_data": data}, GREEDY)
    ok = llm.generate({"prompt": PROMPT, "multi_modal_data": {"image": random_image(0)}}, GREEDY)
    assert len(ok[0].outputs[0].token_ids) == 6


def test_placeholders_without_an_image_are_refused(llm):
    with pytest.raises(ValueError, match="image placeholder token.*but no multi_modal_data"):
        llm.generate(PROMPT, GREEDY)


def test_a_text_only_model_refuses_images(tiny_llm_dir):
    llm = LLM(str(tiny_llm_dir[1]), block_size=4, num_kv_blocks=64, ops="ref")
    with pytest.raises(ValueError, match="text-only model: it takes no multi_modal_data"):
        llm.generate({"prompt": "hi", "multi_modal_data": {"image": random_image(0)}})
    llm.shutdown()


def test_preempted_requests_recompute_their_images(tiny_llava_dir):
    """A KV cache too small for both requests: one is preempted (its blocks and its
    encoder-cache references dropped) and recomputes its prompt, image rows included
    (from the encoder cache, which still holds them: no image is encoded twice)."""
    hf, path = tiny_llava_dir
    llm = make_llm(path, num_kv_blocks=17, enable_prefix_caching=False, max_model_len=48)
    images = [random_image(9), random_image(10)]
    prompts = [{"prompt": PROMPT, "multi_modal_data": {"image": im}} for im in images]
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    outs = llm.generate(prompts, params)
    assert llm.core.stats.preemptions > 0
    for image, out in zip(images, outs, strict=True):
        assert out.outputs[0].token_ids == hf_greedy(hf, path, out.prompt_token_ids, [image], 12)
    cache = llm.core.scheduler.encoder_cache
    assert cache.misses == 2 and cache.hits >= 1 and not cache.held
    llm.shutdown()


def test_the_decoder_on_the_accelerator_matches_hf(tiny_llava_dir):
    pytest.importorskip("pyagent_accel.ops")
    hf, path = tiny_llava_dir
    llm = make_llm(path, ops="accel", max_num_batched_tokens=7)
    image = random_image(12)
    out = llm.generate({"prompt": PROMPT, "multi_modal_data": {"image": image}}, GREEDY)[0]
    assert out.outputs[0].token_ids == hf_greedy(hf, path, out.prompt_token_ids, [image], 6)
    llm.shutdown()


def test_chat_takes_image_parts(tiny_llava_dir, llm):
    """LLM.chat with an image_url part (a data URL) is generate with the rendered prompt
    and the image."""
    import base64
    import io

    image = random_image(14)
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    url = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
    parts = [{"type": "text", "text": "what?"}, {"type": "image_url", "image_url": {"url": url}}]
    out = llm.chat([{"role": "user", "content": parts}], GREEDY)[0]
    hf, path = tiny_llava_dir
    assert out.outputs[0].token_ids == hf_greedy(hf, path, out.prompt_token_ids, [image], 6)
    with pytest.raises(ValueError, match=r"messages.0.content.1: a content part must be text"):
        llm.chat([{"role": "user", "content": [parts[0], {"type": "audio"}]}], GREEDY)


def test_a_failed_encoding_fails_its_request_only_and_is_not_cached(tiny_llava_dir):
    """The vision tower raises once: the step's request ends with an error, its image's
    encoder-cache entry is dropped, and the same image then serves a later request."""
    hf, path = tiny_llava_dir
    llm = make_llm(path)
    model, encode = llm.core.runner.model, llm.core.runner.model.encode_images
    calls = []

    def flaky(pixels):
        calls.append(len(pixels))
        if len(calls) == 1:
            raise RuntimeError("tower down")
        return encode(pixels)

    model.encode_images = flaky
    image = random_image(15)
    prompt = {"prompt": PROMPT, "multi_modal_data": {"image": image}}
    failed = llm.generate(prompt, GREEDY)[0]
    assert failed.outputs[0].finish_reason == "error"
    assert "tower down" in failed.outputs[0].error
    assert not llm.core.scheduler.encoder_cache.sizes
    out = llm.generate(prompt, GREEDY)[0]
    assert out.outputs[0].token_ids == hf_greedy(hf, path, out.prompt_token_ids, [image], 6)
    assert calls == [1, 1]
    llm.shutdown()


def test_images_cross_to_an_engine_core_in_its_own_process(tiny_llava_dir):
    """Pixel values travel with the request to the core's process: the same greedy
    tokens as in-process, a shared image encoded once there."""
    import asyncio

    from pyagent_ref.engine.llm import AsyncLLM

    _, path = tiny_llava_dir
    args = dict(block_size=4, num_kv_blocks=256, max_num_batched_tokens=64, ops="ref")
    images = [random_image(1), random_image(2, (30, 17))]
    prompts = [
        {"prompt": "<image> and <image>: which?", "multi_modal_data": {"image": images}},
        {"prompt": PROMPT, "multi_modal_data": {"image": images[0]}},
    ]
    expected = [o.outputs[0].token_ids for o in make_llm(path).generate(prompts, GREEDY)]

    async def run():
        engine = AsyncLLM(str(path), engine_process=True, max_model_len=128, **args)
        try:

            async def tokens(i, prompt):  # the stream's deltas, joined
                got = []
                async for out in engine.generate(prompt, GREEDY, request_id=str(i)):
                    got += out.outputs[0].token_ids
                return got

            return await asyncio.wait_for(
                asyncio.gather(*(tokens(i, p) for i, p in enumerate(prompts))), 120
            )
        finally:
            await engine.shutdown()

    assert asyncio.run(run()) == expected


def test_beam_search_with_an_image_matches_hf_num_beams(tiny_llava_dir, llm):
    """Every beam of a step carries the prompt's image (encoded once): the beams equal
    HF's greedy `num_beams` search with the same pixel values."""
    import transformers

    from pyagent_ref.engine.beam_search import BeamSearchParams

    hf, path = tiny_llava_dir
    image = random_image(5)
    params = BeamSearchParams(beam_width=3, max_tokens=5, ignore_eos=True)
    [out] = llm.beam_search({"prompt": PROMPT, "multi_modal_data": {"image": image}}, params)
    ids = out.sequences[0].tokens[: -params.max_tokens]
    assert ids.count(hf.config.image_token_id) == IMAGE_TOKENS
    pixels = transformers.AutoImageProcessor.from_pretrained(path)(
        images=[image], return_tensors="pt"
    )["pixel_values"]
    with torch.no_grad():
        theirs = hf.generate(
            input_ids=torch.tensor([ids]),
            pixel_values=pixels,
            num_beams=3,
            num_return_sequences=3,
            do_sample=False,
            max_new_tokens=5,
            min_new_tokens=5,
            pad_token_id=0,
        )
    assert [seq.tokens for seq in out.sequences] == theirs.tolist()
