"""Qwen2-VL's three-row positions (`multimodal.mrope`) against HF's `get_rope_index`."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pyagent_ref.multimodal.mrope import mrope_delta, mrope_positions

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

IMAGE = 9


@pytest.fixture(scope="module")
def hf_model():
    config = transformers.Qwen2VLConfig(
        text_config=dict(
            vocab_size=16,
            hidden_size=16,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=16,
            rope_parameters={"rope_type": "mrope", "mrope_section": [1, 1, 2]},
        ),
        vision_config=dict(depth=1, embed_dim=16, hidden_size=16, num_heads=2),
        image_token_id=IMAGE,
    )
    return transformers.Qwen2VLModel(config)


# Qwen2-VL's prompts put <|vision_start|> before every image: a text token at least
# (HF groups adjacent image tokens into one run, and without images uses 1-D positions)
layouts = st.lists(
    st.tuples(st.integers(1, 4), st.integers(1, 4), st.integers(1, 4)), min_size=1, max_size=3
).flatmap(lambda images: st.tuples(st.just(images), st.integers(0, 4)))


@settings(max_examples=25, deadline=None)
@given(layouts)
def test_matches_hf_get_rope_index(hf_model, layout):
    """Text runs and images of (1, h, w) merged grids in any order; then decode indices
    continue with the delta, as HF's generate adds its rope_deltas."""
    images, tail = layout
    ids, spans, grids = [], [], []
    for text, h, w in images:
        ids += [1] * text
        spans.append((len(ids), (1, h, w)))
        grids.append([1, 2 * h, 2 * w])  # patch grid: the merge is 2 x 2
        ids += [IMAGE] * (h * w)
    ids += [1] * tail
    input_ids = torch.tensor([ids])
    want, delta = hf_model.get_rope_index(
        input_ids,
        mm_token_type_ids=(input_ids == IMAGE).int(),
        image_grid_thw=torch.tensor(grids) if grids else None,
    )
    got = mrope_positions(range(len(ids) + 3), spans)
    np.testing.assert_array_equal(got[:, : len(ids)], want[:, 0].numpy())
    assert mrope_delta(spans) == int(delta)
    decode = np.arange(len(ids), len(ids) + 3) + int(delta)
    np.testing.assert_array_equal(got[:, len(ids) :], np.stack([decode] * 3))


@given(st.lists(st.integers(0, 40), max_size=12))
def test_any_subset_of_indices_gets_its_own_positions(indices):
    """A chunk, a decode step or the rest after a prefix-cache hit: the positions of an
    index do not depend on which other indices are computed with it."""
    spans = [(3, (1, 2, 3)), (12, (1, 4, 2))]
    whole = mrope_positions(range(41), spans)
    np.testing.assert_array_equal(
        mrope_positions(indices, spans).reshape(3, -1), whole[:, indices].reshape(3, -1)
    )


def test_text_only_is_three_equal_rows():
    np.testing.assert_array_equal(mrope_positions(range(5), []), np.stack([np.arange(5)] * 3))
    assert mrope_delta([]) == 0


@pytest.mark.parametrize(
    "positions, spans, match",
    [
        ([0, -1], [], "positions must be >= 0"),
        ([0], [(0, (1, 0, 2))], "grid"),
        ([0], [(0, (1, 2))], "grid"),
        ([0], [(0, (1, 2, 2)), (3, (1, 1, 1))], "overlap"),
    ],
)
def test_bad_input_is_named(positions, spans, match):
    with pytest.raises(ValueError, match=match):
        mrope_positions(positions, spans)
