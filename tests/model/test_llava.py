"""LLaVA (`pyagent_ref.model.llava`) against HF transformers on a tiny random config.

A CLIP tower of 3 layers (the features of layer -2: the checkpoint's last layer is
skipped), a projector and a 2-layer Llama; 16 x 16 images of 4 x 4 patches fill 16
decoder positions each. Logits of a prompt with two images, whole and in prefill chunks
that cut through an image's tokens, then greedy decoding, equal HF's within TOL.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from pyagent_ref.model import AttentionMetadata, load_model  # noqa: E402
from pyagent_ref.ops import block_table as bt  # noqa: E402
from tests.tiny import TINY_LLAMA  # noqa: E402

BLOCK = 4
TOL = dict(rtol=1e-4, atol=1e-4)
IMAGE_TOKEN = 90

TINY_CLIP = dict(
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=3,
    num_attention_heads=4,
    image_size=16,
    patch_size=4,
    projection_dim=32,
)


def build_hf_llava(tower="clip", **overrides):
    """A tiny random HF LLaVA (seeded), eval mode, eager attention; its vision tower
    CLIP's or SigLIP's."""
    torch.manual_seed(0)
    if tower == "clip":
        vision = transformers.CLIPVisionConfig(**TINY_CLIP)
    else:
        vision = transformers.SiglipVisionConfig(
            **{k: v for k, v in TINY_CLIP.items() if k != "projection_dim"}
        )
    config = transformers.LlavaConfig(
        vision_config=vision,
        text_config=transformers.LlamaConfig(
            **TINY_LLAMA, pad_token_id=0, bos_token_id=1, eos_token_id=2
        ),
        image_token_id=IMAGE_TOKEN,
        **overrides,
    )
    config._attn_implementation = "eager"
    return transformers.LlavaForConditionalGeneration(config).eval()


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    hf = build_hf_llava()
    path = tmp_path_factory.mktemp("llava")
    hf.save_pretrained(path)
    return hf, load_model(path, dtype="float32", progress=False)


def images(n, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, 3, 16, 16, generator=gen)


def prompt(n_images):
    """5 text tokens, then per image 16 image tokens and 3 text tokens."""
    ids = [1, 5, 17, 3, 88]
    for i in range(n_images):
        ids += [IMAGE_TOKEN] * 16 + [40 + i, 7, 9]
    return ids


def run(ours, ids, pixels, chunks):
    """Our logits of every position of `ids`, computed in prefill chunks of the given
    sizes over a paged cache; image rows are encoded once and scattered per chunk."""
    caches = [ours.new_kv_cache(64, BLOCK) for _ in ours.layers]
    table = torch.arange(1, 1 + -(-len(ids) // BLOCK))[None]
    rows = ours.encode_images(pixels).reshape(-1, ours.config.hidden_size)
    image_positions = [i for i, t in enumerate(ids) if t == IMAGE_TOKEN]
    out, start = [], 0
    for size in chunks:
        end = start + size
        pos = torch.arange(start, end)
        qsl = torch.tensor([0, size])
        meta = AttentionMetadata(
            slot_mapping=bt.compute_slot_mapping(table, qsl, pos, BLOCK),
            block_table=table,
            query_start_loc=qsl,
            seq_lens=torch.tensor([end]),
        )
        picked = [(j, p - start) for j, p in enumerate(image_positions) if start <= p < end]
        mm = None
        if picked:
            mm = (torch.tensor([r for _, r in picked]), rows[[j for j, _ in picked]])
        with torch.no_grad():
            hidden = ours(torch.tensor(ids[start:end]), pos, meta, caches, mm)
            out.append(ours.compute_logits(hidden))
        start = end
    return torch.cat(out)


def hf_logits(hf, ids, pixels):
    with torch.no_grad():
        return hf(input_ids=torch.tensor([ids]), pixel_values=pixels).logits[0]


def test_image_features_match(pair):
    hf, ours = pair
    pixels = images(2)
    with torch.no_grad():
        theirs = hf.model.get_image_features(pixel_values=pixels, return_dict=True).pooler_output
        torch.testing.assert_close(ours.encode_images(pixels), torch.stack(list(theirs)), **TOL)


@pytest.mark.parametrize("chunks", [[43], [12, 9, 22], [20, 1, 1, 21]], ids=str)
def test_prefill_through_image_tokens_matches(pair, chunks):
    """Whole, and in chunks that start and end inside the images' tokens."""
    hf, ours = pair
    ids, pixels = prompt(2), images(2)
    assert sum(chunks) == len(ids)
    torch.testing.assert_close(run(ours, ids, pixels, chunks), hf_logits(hf, ids, pixels), **TOL)


def test_the_image_changes_the_logits(pair):
    """Two different images behind the same tokens give different logits (the tower is
    not a no-op and its rows land where the image tokens are)."""
    _, ours = pair
    ids = prompt(1)
    a, b = run(ours, ids, images(1, 0), [len(ids)]), run(ours, ids, images(1, 1), [len(ids)])
    assert not torch.allclose(a[-1], b[-1], atol=1e-3)
    torch.testing.assert_close(a[:5], b[:5])  # the text before the image is unchanged


@pytest.mark.parametrize("overrides", [dict(vision_feature_layer=[-3, -1])])
def test_several_feature_layers_and_the_full_strategy(tmp_path, overrides):
    hf = build_hf_llava(vision_feature_select_strategy="full", **overrides)
    hf.save_pretrained(tmp_path)
    ours = load_model(tmp_path, dtype="float32", progress=False)
    pixels = images(1)
    ids = [1, 5] + [IMAGE_TOKEN] * 17 + [7]
    torch.testing.assert_close(run(ours, ids, pixels, [9, 11]), hf_logits(hf, ids, pixels), **TOL)


def test_unsupported_vision_towers_are_refused(tmp_path):
    hf = build_hf_llava()
    hf.save_pretrained(tmp_path)
    import json

    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["vision_config"]["model_type"] = "pixtral"
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="vision_config.model_type"):
        load_model(tmp_path, progress=False)


@pytest.mark.parametrize("strategy, tokens", [("default", 15), ("full", 16)])
def test_a_siglip_tower_matches(tmp_path, strategy, tokens):
    """SigLIP: no class token (the default strategy drops the first patch, as HF does),
    no norm before the layers, a biased patch convolution; its pooling head is skipped."""
    hf = build_hf_llava("siglip", vision_feature_select_strategy=strategy)
    hf.save_pretrained(tmp_path)
    ours = load_model(tmp_path, dtype="float32", progress=False)
    assert ours.vision.num_image_tokens == tokens
    pixels = images(1)
    ids = [1, 5] + [IMAGE_TOKEN] * tokens + [7, 3]
    chunks = [6, len(ids) - 6]  # the first chunk ends inside the image
    torch.testing.assert_close(run(ours, ids, pixels, chunks), hf_logits(hf, ids, pixels), **TOL)


def test_pixel_values_of_the_wrong_size_are_refused(pair):
    _, ours = pair
    with pytest.raises(ValueError, match=r"pixel_values must have shape \(images, 3, 16, 16\)"):
        ours.encode_images(torch.zeros(1, 3, 8, 8))
