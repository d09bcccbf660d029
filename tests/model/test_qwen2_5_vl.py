"""Qwen2.5-VL (`pyagent_ref.model.qwen2_5_vl`) against HF transformers on a tiny random
config.

A 3-block vision tower (width 32, SwiGLU of 48, patches of 2 x 4 x 4 values per
channel, 2 x 2 merge) with windows of 16 pixels (2 x 2 merge units) and full attention
in block 1 only, on the 2-layer Qwen2 with M-RoPE sections (2, 3, 3) of the Qwen2-VL
test (whose helpers run both models). Logits of prompts with images of different
grids, some not a multiple of the window (cut-short windows at the edges), whole and in
prefill chunks that start and end inside the images, equal HF's within TOL.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from pyagent_ref.model import load_model  # noqa: E402
from pyagent_ref.model.qwen2_5_vl import window_order  # noqa: E402
from tests.model.test_qwen2_vl import (  # noqa: E402
    IMAGE_TOKEN,
    PATCH_VALUES,
    TINY_QWEN2_VL_VISION,
    TOL,
    hf_logits,
    patches,
    prompt,
    run,
)
from tests.tiny import TINY_LLAMA  # noqa: E402

TINY_QWEN2_5_VL_VISION = dict(
    depth=3,
    hidden_size=32,
    out_hidden_size=TINY_LLAMA["hidden_size"],
    intermediate_size=48,
    num_heads=4,
    patch_size=4,
    spatial_merge_size=2,
    temporal_patch_size=2,
    window_size=16,  # 16 / (4 * 2): windows of 2 x 2 merge units
    fullatt_block_indexes=[1],
)
GRIDS = torch.tensor([[1, 4, 6], [1, 2, 2]])  # units 2 x 3 (a cut-short window), 1 x 1
MORE_GRIDS = torch.tensor([[1, 8, 8], [1, 6, 2], [1, 2, 10]])  # 4 x 4, 3 x 1, 1 x 5


def build_hf_qwen2_5_vl(**vision):
    """A tiny random HF Qwen2.5-VL (seeded), eval mode, eager attention."""
    torch.manual_seed(0)
    rope = {"rope_type": "mrope", "mrope_section": [2, 3, 3], "rope_theta": 10000.0}
    config = transformers.Qwen2_5_VLConfig(
        text_config=dict(**TINY_LLAMA, rope_parameters=rope, bos_token_id=1, eos_token_id=2),
        vision_config=TINY_QWEN2_5_VL_VISION | vision,
        image_token_id=IMAGE_TOKEN,
        video_token_id=91,
        vision_start_token_id=92,
        vision_end_token_id=93,
    )
    config._attn_implementation = "eager"
    return transformers.Qwen2_5_VLForConditionalGeneration(config).eval()


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    hf = build_hf_qwen2_5_vl()
    path = tmp_path_factory.mktemp("qwen2_5_vl")
    hf.save_pretrained(path)
    return hf, load_model(path, dtype="float32", progress=False)


def hf_image_features(hf, pixels, grids):
    with torch.no_grad():
        return hf.model.get_image_features(
            pixel_values=pixels, image_grid_thw=grids, return_dict=True
        ).pooler_output


@pytest.mark.parametrize("grids", [GRIDS, MORE_GRIDS, torch.tensor([[1, 10, 14]])], ids=str)
def test_window_order_is_hfs(grids):
    """The units' window order and the windows' lengths are those of HF's window index."""
    from transformers.vision_utils import get_vision_window_index

    order, lengths = window_order(grids, merge=2, side=2)
    index, cu = get_vision_window_index(grids, spatial_merge_size=2, window_size=16, patch_size=4)
    assert order.tolist() == index.tolist()
    assert [4 * n for n in lengths] == torch.diff(cu).tolist()


@pytest.mark.parametrize("grids", [GRIDS, MORE_GRIDS], ids=str)
def test_image_features_match(pair, grids):
    """Images of different grids, whole windows and cut-short ones at the edges."""
    hf, ours = pair
    pixels = patches(grids)
    mine = ours.encode_images(pixels, grids)
    assert [len(m) for m in mine] == [int(g.prod()) // 4 for g in grids]
    for a, b in zip(mine, hf_image_features(hf, pixels, grids), strict=True):
        torch.testing.assert_close(a, b, **TOL)


def test_windows_matter(tmp_path):
    """With every block attending over the whole image the features are HF's for that
    config and differ from the windowed ones: the windows are not a no-op here."""
    hf = build_hf_qwen2_5_vl(fullatt_block_indexes=[0, 1, 2])
    hf.save_pretrained(tmp_path)
    ours = load_model(tmp_path, dtype="float32", progress=False)
    windowed = build_hf_qwen2_5_vl()
    windowed.load_state_dict(hf.state_dict())
    pixels = patches(GRIDS)
    mine = torch.cat(ours.encode_images(pixels, GRIDS))
    torch.testing.assert_close(mine, torch.cat(hf_image_features(hf, pixels, GRIDS)), **TOL)
    assert not torch.allclose(mine, torch.cat(hf_image_features(windowed, pixels, GRIDS)))


def test_nothing_is_read_from_empty_memory(pair, tmp_path, poisoned_to_empty):
    """No tensor the checkpoint lacks is read as `to_empty` left it (NaN here)."""
    hf, _ = pair
    hf.save_pretrained(tmp_path)
    ours = load_model(tmp_path, dtype="float32", progress=False)
    pixels = patches(GRIDS)
    theirs = hf_image_features(hf, pixels, GRIDS)
    for a, b in zip(ours.encode_images(pixels, GRIDS), theirs, strict=True):
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


def test_larger_images_of_several_grids_match(pair):
    hf, ours = pair
    ids, spans = prompt(MORE_GRIDS)
    pixels = patches(MORE_GRIDS, seed=1)
    torch.testing.assert_close(
        run(ours, ids, spans, pixels, MORE_GRIDS, [11, 9, len(ids) - 20]),
        hf_logits(hf, ids, pixels, MORE_GRIDS),
        **TOL,
    )


@pytest.mark.parametrize(
    "key, value, match",
    [
        ("window_size", 4, "window_size must be at least patch_size"),
        ("fullatt_block_indexes", [3], "fullatt_block_indexes must be distinct"),
        ("fullatt_block_indexes", [1, 1], "fullatt_block_indexes must be distinct"),
        ("intermediate_size", 0, "intermediate_size must be an int >= 1"),
    ],
)
def test_bad_vision_configs_are_named(pair, tmp_path, key, value, match):
    import json

    hf, _ = pair
    hf.save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["vision_config"][key] = value
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=match):
        load_model(tmp_path, dtype="float32", progress=False)


def test_the_qwen2_vl_tower_config_is_not_read_as_qwen2_5s():
    """The two configs name the tower's width differently (embed_dim / hidden_size)."""
    from pyagent_ref.model.qwen2_5_vl import Qwen2_5_VLVisionConfig
    from pyagent_ref.model.qwen2_vl import Qwen2VLVisionConfig

    common = {"mrope_section": [2, 3, 3], "image_token_id": IMAGE_TOKEN}
    old = Qwen2VLVisionConfig.from_hf({**common, "vision_config": TINY_QWEN2_VL_VISION})
    new = Qwen2_5_VLVisionConfig.from_hf({**common, "vision_config": TINY_QWEN2_5_VL_VISION})
    assert (old.embed_dim, old.out_size, old.hidden_act) == (32, 64, "quick_gelu")
    assert (new.embed_dim, new.out_size, new.intermediate_size) == (32, 64, 48)
    assert (new.hidden_act, new.window_units, new.fullatt_block_indexes) == ("silu", 2, (1,))
    assert old.patch_values == new.patch_values == PATCH_VALUES


def test_the_module_examples_run():
    import doctest

    from pyagent_ref.model import qwen2_5_vl

    result = doctest.testmod(qwen2_5_vl)
    assert result.attempted > 0 and result.failed == 0
