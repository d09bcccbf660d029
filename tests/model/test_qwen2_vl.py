"""Qwen2-VL (`pyagent_ref.model.qwen2_vl`) against HF transformers on a tiny random config.

A 2-block vision tower (width 32, patches of 2 x 4 x 4 values per channel, 2 x 2 merge)
and a 2-layer Qwen2 with M-RoPE sections (2, 3, 3). Images of different patch grids fill
different numbers of decoder positions (dynamic resolution). Logits of a prompt with
two images, whole and in prefill chunks that start and end inside the images, equal
HF's within TOL.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from pyagent_ref.model import AttentionMetadata, load_model  # noqa: E402
from pyagent_ref.multimodal.mrope import mrope_positions  # noqa: E402
from pyagent_ref.ops import block_table as bt  # noqa: E402
from tests.tiny import TINY_LLAMA  # noqa: E402

BLOCK = 4
TOL = dict(rtol=1e-4, atol=2e-4)
IMAGE_TOKEN = 90
TINY_QWEN2_VL_VISION = dict(
    depth=2,
    embed_dim=32,
    hidden_size=TINY_LLAMA["hidden_size"],
    num_heads=4,
    patch_size=4,
    spatial_merge_size=2,
    temporal_patch_size=2,
)
PATCH_VALUES = 3 * 2 * 4 * 4


def build_hf_qwen2_vl():
    """A tiny random HF Qwen2-VL (seeded), eval mode, eager attention."""
    torch.manual_seed(0)
    rope = {"rope_type": "mrope", "mrope_section": [2, 3, 3], "rope_theta": 10000.0}
    config = transformers.Qwen2VLConfig(
        text_config=dict(**TINY_LLAMA, rope_parameters=rope, bos_token_id=1, eos_token_id=2),
        vision_config=TINY_QWEN2_VL_VISION,
        image_token_id=IMAGE_TOKEN,
        video_token_id=91,
        vision_start_token_id=92,
        vision_end_token_id=93,
    )
    config._attn_implementation = "eager"
    return transformers.Qwen2VLForConditionalGeneration(config).eval()


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    hf = build_hf_qwen2_vl()
    path = tmp_path_factory.mktemp("qwen2_vl")
    hf.save_pretrained(path)
    return hf, load_model(path, dtype="float32", progress=False)


GRIDS = torch.tensor([[1, 4, 6], [1, 2, 2]])  # 6 and 1 decoder positions


def patches(grids, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(int(grids.prod(-1).sum()), PATCH_VALUES, generator=gen)


def prompt(grids):
    """Per image: 2 text tokens (the last one a vision start), its image tokens; then 3."""
    ids, spans = [], []
    for i, (t, h, w) in enumerate(grids.tolist()):
        ids += [40 + i, 92]
        spans.append((len(ids), (t, h // 2, w // 2)))
        ids += [IMAGE_TOKEN] * (t * h * w // 4)
    return ids + [93, 7, 9], spans


def run(ours, ids, spans, pixels, grids, chunks):
    """Our logits of every position of `ids`, in prefill chunks of the given sizes over a
    paged cache, with three-row positions; image rows encoded once."""
    caches = [ours.new_kv_cache(64, BLOCK) for _ in ours.layers]
    table = torch.arange(1, 1 + -(-len(ids) // BLOCK))[None]
    rows = torch.cat(ours.encode_images(pixels, grids))
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
        pos3 = torch.from_numpy(mrope_positions(pos.numpy(), spans))
        with torch.no_grad():
            hidden = ours(torch.tensor(ids[start:end]), pos3, meta, caches, mm)
            out.append(ours.compute_logits(hidden))
        start = end
    return torch.cat(out)


def hf_logits(hf, ids, pixels, grids):
    input_ids = torch.tensor([ids])
    with torch.no_grad():
        return hf(
            input_ids=input_ids,
            pixel_values=pixels,
            image_grid_thw=grids,
            mm_token_type_ids=(input_ids == IMAGE_TOKEN).int(),
        ).logits[0]


@pytest.mark.parametrize("grids", [GRIDS, torch.tensor([[1, 2, 4], [1, 6, 2], [1, 4, 4]])], ids=str)
def test_image_features_match(pair, grids):
    """Images of different grids: as many rows each as its merged grid has cells."""
    hf, ours = pair
    pixels = patches(grids)
    with torch.no_grad():
        theirs = hf.model.get_image_features(
            pixel_values=pixels, image_grid_thw=grids, return_dict=True
        ).pooler_output
        mine = ours.encode_images(pixels, grids)
    assert [len(m) for m in mine] == [int(g.prod()) // 4 for g in grids]
    for a, b in zip(mine, theirs, strict=True):
        torch.testing.assert_close(a, b, **TOL)


def test_the_vision_rotary_table_is_computed_not_read_from_empty_memory(
    pair, tmp_path, poisoned_to_empty
):
    """No tensor the checkpoint lacks is read as `to_empty` left it (NaN here)."""
    hf, _ = pair
    hf.save_pretrained(tmp_path)
    ours = load_model(tmp_path, dtype="float32", progress=False)
    pixels = patches(GRIDS)
    with torch.no_grad():
        theirs = hf.model.get_image_features(
            pixel_values=pixels, image_grid_thw=GRIDS, return_dict=True
        ).pooler_output
        mine = ours.encode_images(pixels, GRIDS)
    for a, b in zip(mine, theirs, strict=True):
        torch.testing.assert_close(a, b, **TOL)


@pytest.mark.parametrize("chunks", [[14], [3, 2, 9], [3, 1, 1, 2, 7]], ids=str)
def test_prefill_through_image_tokens_matches(pair, chunks):
    """Whole, and in chunks that start and end inside the first image's tokens."""
    hf, ours = pair
    ids, spans = prompt(GRIDS)
    assert sum(chunks) == len(ids)
    pixels = patches(GRIDS)
    torch.testing.assert_close(
        run(ours, ids, spans, pixels, GRIDS, chunks), hf_logits(hf, ids, pixels, GRIDS), **TOL
    )


def test_a_larger_image_matches(pair):
    hf, ours = pair
    grids = torch.tensor([[1, 6, 8]])  # 12 positions, h != w
    ids, spans = prompt(grids)
    pixels = patches(grids, seed=1)
    torch.testing.assert_close(
        run(ours, ids, spans, pixels, grids, [9, len(ids) - 9]),
        hf_logits(hf, ids, pixels, grids),
        **TOL,
    )


@pytest.mark.parametrize(
    "grids, n_patches, match",
    [
        ([[1, 3, 4]], 12, "grid_thw must be"),
        ([[1, 4, 4, 1]], 16, "grid_thw must be"),
        ([[0, 4, 4]], 0, "grid_thw must be"),
        ([[1, 4, 4]], 15, "pixel_values must have shape"),
    ],
)
def test_mismatched_grids_are_named(pair, grids, n_patches, match):
    _, ours = pair
    with pytest.raises(ValueError, match=match):
        ours.encode_images(torch.zeros(n_patches, PATCH_VALUES), torch.tensor(grids))


def test_bad_mrope_section_is_named(tmp_path):
    import json

    hf = build_hf_qwen2_vl()
    hf.save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["text_config"]["rope_parameters"]["mrope_section"] = [2, 3, 4]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="mrope_section"):
        load_model(tmp_path, dtype="float32", progress=False)
