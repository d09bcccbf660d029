"""The Qwen2-VL family's engine tests' shared pieces: a tiny random model directory (HF's
model, a byte-level BPE tokenizer that knows the vision tokens, Qwen2-VL's image
processor), the engine on it, and HF's greedy `generate` to compare with."""

from __future__ import annotations

import pytest

from tests.tiny import TINY_LLAMA

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from pyagent_ref.engine.llm import LLM  # noqa: E402
from pyagent_ref.sample.params import SamplingParams  # noqa: E402

GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=1)
PROMPT = "look: <|vision_start|><|image_pad|><|vision_end|> and say"
# 4 x 4 patches merged 2 x 2: sides are multiples of 8 pixels, between 64 and 16 x 64
MIN_PIXELS, MAX_PIXELS = 8 * 8, 8 * 8 * 16


def write_tiny_qwen_vl(path, config_class, model_class, vision_config: dict, seed: int):
    """Write a tiny random HF model of `model_class` (Qwen2-VL's or Qwen2.5-VL's, seeded,
    eval mode, eager attention) with `vision_config` into `path`, with a tokenizer that
    knows its vision tokens and Qwen2-VL's image processor at MIN/MAX_PIXELS; return
    the HF model."""
    from tests.tokenize.helpers import SPECIALS, train_byte_level_bpe, write_hf_dir

    specials = ["<|image_pad|>", "<|vision_start|>", "<|vision_end|>", "<|video_pad|>"]
    tk = train_byte_level_bpe(special_tokens=[*SPECIALS, *specials])
    write_hf_dir(path, tk, {"eos_token": "</s>", "bos_token": "<s>"})
    torch.manual_seed(seed)
    rope = {"rope_type": "mrope", "mrope_section": [2, 3, 3], "rope_theta": 10000.0}
    config = config_class(
        text_config=dict(
            **(TINY_LLAMA | {"vocab_size": tk.get_vocab_size()}),
            rope_parameters=rope,
            eos_token_id=tk.token_to_id("</s>"),
            bos_token_id=None,
        ),
        vision_config=vision_config,
        image_token_id=tk.token_to_id("<|image_pad|>"),
        video_token_id=tk.token_to_id("<|video_pad|>"),
        vision_start_token_id=tk.token_to_id("<|vision_start|>"),
        vision_end_token_id=tk.token_to_id("<|vision_end|>"),
    )
    config._attn_implementation = "eager"
    model = model_class(config).eval()
    model.save_pretrained(path)
    processor = transformers.Qwen2VLImageProcessorPil(
        patch_size=4,
        merge_size=2,
        temporal_patch_size=2,
        min_pixels=MIN_PIXELS,
        max_pixels=MAX_PIXELS,
    )
    processor.save_pretrained(path)
    return model


def make_llm(path, **kwargs):
    args = dict(
        block_size=4, num_kv_blocks=256, max_num_batched_tokens=64, ops="ref", max_model_len=128
    )
    return LLM(str(path), **(args | kwargs))


def image_grid(path, image):
    """The patch grid (t, h, w) the model directory's image processor makes of `image`."""
    made = transformers.AutoImageProcessor.from_pretrained(path)(images=[image])
    return made["image_grid_thw"][0]


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
