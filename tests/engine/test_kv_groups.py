"""KV cache groups from the model's layer_types: sliding-window layers keep only their
window, greedy tokens stay those of HF transformers and of the all-full-attention KV."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from pyagent_ref.engine.core import EngineConfig, EngineCore, kv_cache_groups  # noqa: E402
from pyagent_ref.kv_cache import (  # noqa: E402
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroup,
    SlidingWindowSpec,
)
from pyagent_ref.model import load_model  # noqa: E402
from pyagent_ref.model.config import ModelConfig  # noqa: E402
from pyagent_ref.ops import load as load_ops  # noqa: E402
from pyagent_ref.sample.params import SamplingParams  # noqa: E402
from pyagent_ref.sched import Request  # noqa: E402
from pyagent_ref.worker.model_runner import ModelRunner  # noqa: E402
from tests.tiny import TINY_LLAMA  # noqa: E402
from tests.worker.helpers import tiny_model  # noqa: E402

WINDOW = 5
PROMPTS = [
    [5, 17, 3, 88, 41, 9, 60, 2, 33, 71, 14, 19, 23, 57, 8, 40, 12],
    [8, 1, 96, 45, 45, 12, 7],
    [5, 17, 3, 88, 41, 9, 60, 2, 33, 71, 14, 19, 23, 57, 8, 40, 90],
    [30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48],
]
COMMON = TINY_LLAMA | {"num_hidden_layers": 4, "max_position_embeddings": 128}
COMMON["sliding_window"] = WINDOW
MODELS = {
    # every layer slides (Mistral)
    "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM, {}),
    # sliding and full layers alternate (Gemma 2's pattern, on Qwen2)
    "alternating": (
        transformers.Qwen2Config,
        transformers.Qwen2ForCausalLM,
        dict(
            use_sliding_window=True,
            layer_types=["sliding_attention", "full_attention"] * 2,
        ),
    ),
}


@pytest.fixture(scope="module", params=sorted(MODELS))
def windowed(request, tmp_path_factory):
    """(HF model, our model) of a tiny random model with sliding-window layers."""
    config_cls, model_cls, extra = MODELS[request.param]
    torch.manual_seed(0)
    config = config_cls(**COMMON, **extra)
    config._attn_implementation = "eager"
    hf = model_cls(config).eval()
    path = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(path)
    return hf, load_model(path, progress=False)


def engine(model, **overrides):
    config = dict(block_size=4, num_kv_blocks=64, max_num_batched_tokens=8, max_num_seqs=4)
    return EngineCore(model, EngineConfig(ops="ref", **(config | overrides)))


def greedy(i, prompt, n=10):
    params = SamplingParams(temperature=0, max_tokens=n)
    return Request(str(i), prompt, sampling_params=params, max_tokens=n)


def run(core, requests):
    for r in requests:
        core.add_request(r)
    while core.has_unfinished_requests():
        core.step()
    return [r.output_token_ids for r in requests]


def test_groups_follow_layer_types():
    def config(layer_types):
        return ModelConfig(
            "MistralForCausalLM", 50, 32, 48, len(layer_types), 4, 2, 8,
            sliding_window=4096, layer_types=tuple(layer_types),
        )  # fmt: skip

    full, sliding = "full_attention", "sliding_attention"
    (group,) = kv_cache_groups(config([sliding] * 32), 16, 2)
    assert group.spec == SlidingWindowSpec(16, 2, 8, 2, sliding_window=4096)
    assert len(group.layer_names) == 32
    groups = kv_cache_groups(config([sliding, full] * 16), 16, 2)
    assert [type(g.spec) for g in groups] == [SlidingWindowSpec, FullAttentionSpec]
    assert groups[1].layer_names == tuple(f"layers.{i}" for i in range(1, 32, 2))
    # 5:1 (Gemma 3): groups of the rarest kind's size, here 4 layers
    groups = kv_cache_groups(config(([sliding] * 5 + [full]) * 4), 16, 2)
    assert [len(g.layer_names) for g in groups] == [4] * 6
    assert sum(isinstance(g.spec, SlidingWindowSpec) for g in groups) == 5
    (group,) = kv_cache_groups(config([sliding, full] * 16), 16, 2, hybrid=False)
    assert type(group.spec) is FullAttentionSpec and len(group.layer_names) == 32


def test_groups_of_equal_size_share_the_kv_memory():
    layers = ModelConfig(
        "Qwen2ForCausalLM", 50, 32, 48, 32, 4, 8, 128, sliding_window=4096,
        layer_types=("sliding_attention", "full_attention") * 16,
    )  # fmt: skip
    hybrid = KVCacheConfig.from_memory(2**30, kv_cache_groups(layers, 16, 2))
    full = KVCacheConfig.from_memory(2**30, kv_cache_groups(layers, 16, 2, hybrid=False))
    page = 2 * 16 * 8 * 128 * 2
    assert full.num_blocks == 2**30 // (32 * page)
    assert hybrid.num_kv_tensors == 16 and hybrid.num_blocks == 2**30 // (16 * page)


def test_layers_of_a_group_read_their_own_tensors_and_tables():
    """Layer i of every group shares KV tensor i; the two groups' block tables differ
    once the sliding window has dropped blocks."""
    model = tiny_model(
        num_hidden_layers=4,
        sliding_window=WINDOW,
        layer_types=("sliding_attention", "full_attention") * 2,
    )
    groups, ops = kv_cache_groups(model.config, 4, 4), load_ops("ref")
    runner = ModelRunner(model, 8, 4, ops, kv_groups=groups)
    assert runner.layer_groups == [[0, 2], [1, 3]]
    caches = runner.kv_caches
    assert caches[0] is caches[1] and caches[2] is caches[3] and caches[0] is not caches[2]
    unknown = (KVCacheGroup(groups[0].spec, ("layers.9",)),)
    with pytest.raises(ValueError, match=r"the model lacks: \['layers.9'\]"):
        ModelRunner(model, 8, 4, ops, kv_groups=unknown)
    with pytest.raises(ValueError, match="each of the 4 layers exactly once"):
        ModelRunner(model, 8, 4, ops, kv_groups=groups[:1])


def test_greedy_tokens_equal_hf_generate_with_prompts_longer_than_the_window(windowed):
    hf, ours = windowed
    got = run(engine(ours), [greedy(i, p) for i, p in enumerate(PROMPTS)])
    for tokens, p in zip(got, PROMPTS, strict=True):
        want = hf.generate(torch.tensor([p]), max_new_tokens=10, do_sample=False)[0, len(p) :]
        assert tokens == want.tolist()


def test_sliding_window_groups_hold_only_the_window(windowed):
    _, ours = windowed
    core = engine(ours, enable_prefix_caching=False)
    request = greedy(0, PROMPTS[3], n=20)
    core.add_request(request)
    held = []
    while core.has_unfinished_requests():
        core.step()
        if core.has_unfinished_requests():
            held.append([sum(not b.is_null for b in g) for g in core.kv.get_blocks(request).blocks])
    sliding = [
        i for i, g in enumerate(core.kv.config.groups) if isinstance(g.spec, SlidingWindowSpec)
    ]
    # decoding token t reads tokens t-4 .. t: at most 2 blocks of 4, plus the growing one
    assert all(blocks[i] <= 3 for blocks in held for i in sliding)
    full = [i for i in range(len(core.kv.config.groups)) if i not in sliding]
    assert all(held[-1][i] == 10 for i in full)  # 38 tokens: every block kept


def test_prefix_hits_on_hybrid_groups_draw_the_same_tokens(windowed):
    _, ours = windowed
    core = engine(ours)
    first = run(core, [greedy(0, PROMPTS[0])])
    again = run(core, [greedy(1, PROMPTS[0]), greedy(2, PROMPTS[2])])
    assert again[0] == first[0]
    assert core.kv.metrics().hits >= 2 * 16  # both reuse the 4 cached blocks of prompt 0
    alone = run(engine(ours, enable_prefix_caching=False), [greedy(3, PROMPTS[2])])
    assert again[1] == alone[0]


SLIDING, FULL = "sliding_attention", "full_attention"


@settings(deadline=None, max_examples=15)
@given(
    layer_types=st.sampled_from(
        [(SLIDING, FULL) * 2, (SLIDING, FULL, SLIDING, SLIDING), (SLIDING,) * 4]
    ),
    workload=st.lists(
        st.tuples(st.lists(st.integers(0, 49), min_size=1, max_size=24), st.integers(1, 10)),
        min_size=1,
        max_size=5,
    ),
    shared=st.lists(st.integers(0, 49), max_size=12),
    num_blocks=st.integers(13, 40),
    budget=st.integers(4, 16),
    caching=st.booleans(),
    graph_mode=st.sampled_from(["eager", "static"]),
)
def test_hybrid_groups_draw_the_tokens_of_full_attention_kv(
    layer_types, workload, shared, num_blocks, budget, caching, graph_mode
):
    """Chunked prefill, preemption (small caches), prefix hits, padded decode batches
    on the CUDA-graph buffers ("static"): giving sliding layers their own KV cache
    groups changes no token (the all-full-attention KV, run eagerly, is the engine's
    layout before groups followed layer_types). Both engines get the memory of
    `num_blocks` full-attention blocks."""
    model = tiny_model(num_hidden_layers=4, sliding_window=WINDOW, layer_types=layer_types)
    block_bytes = 4 * 2 * 4 * 2 * 8 * 4  # 4 layers, K and V, 4 tokens, 2 heads of 8, fp32
    outputs = []
    for full_kv in (True, False):
        core = engine(
            model,
            num_kv_blocks=None,
            kv_cache_memory_bytes=num_blocks * block_bytes,
            max_num_batched_tokens=budget,
            enable_prefix_caching=caching,
            disable_hybrid_kv_cache_manager=full_kv,
            graph_mode="eager" if full_kv else graph_mode,
        )
        requests = [greedy(i, shared + p, n) for i, (p, n) in enumerate(workload)]
        outputs.append(run(core, requests))
    assert outputs[0] == outputs[1]
