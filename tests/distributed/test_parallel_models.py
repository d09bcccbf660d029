"""Tensor and pipeline parallelism of every model family, on two gloo ranks: each rank
loads its share of the model (`loading.load_share`, `DistributedModel`) and the step's
logits equal the whole model's within TOL, with the same greedy tokens (a prefill of
two prompts in one batch, so that PP runs two micro-batches, then a decode step). BERT
(an encoder: its final hidden states, one step) runs with TP only; LLaVA's first prompt
holds an image."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from pyagent_ref.distributed.model import micro_batches, stage_layers  # noqa: E402
from pyagent_ref.distributed.parallel import check_parallel_sizes  # noqa: E402
from pyagent_ref.model.config import ModelConfig  # noqa: E402
from tests.distributed.ranks import compare_families, run_ranks  # noqa: E402
from tests.model import test_deepseek, test_hf_parity, test_llava, test_mamba, test_moe  # noqa: E402
from tests.tiny import TINY_BERT  # noqa: E402

TOL = 1e-4  # float32: the shards' partial sums are added in another order
PROMPTS = [[5, 17, 3, 88, 41, 9, 60, 2, 33, 71, 14], [8, 1, 96, 45, 45, 12, 7]]
# LLaVA: an image's 16 tokens in the first prompt
SPECIAL = {"llava": [[1, 5, *[test_llava.IMAGE_TOKEN] * 16, 40, 7, 9], PROMPTS[1]]}
# families a mode does not split, and the words of their refusal
REFUSED = {("bert", "pp"): "is an encoder"}


# one family of each kind of difference (the others differ from these in RoPE scaling
# alone): tied head, q/k/v biases, per-head q/k norms, soft caps, sliding windows with a
# local RoPE, partial rotary, no gate with learned positions, parallel residual, the norm
# over the projection (a sharded norm; with one KV head, replicated); MoE with and
# without a shared expert; latent attention with q straight from the hidden state and
# through q_lora_rank; Mamba-2 with its groups split and with one group (B and C
# replicated, the gated norm sharded), Bamba; LLaVA; BERT
DENSE = ["llama-tied", "qwen2", "qwen3", "gemma2", "gemma3", "phi3", "gpt2", "gpt-neox", "olmo2"]


def _bert(_):
    torch.manual_seed(0)
    return transformers.BertModel(transformers.BertConfig(vocab_size=97, **TINY_BERT)).eval()


def _builders():
    out = {f: test_hf_parity.build_hf for f in DENSE}
    out |= {f: test_moe.build_hf for f in ("mixtral", "qwen2-moe")}
    out["deepseek-v2-lite"] = lambda _: test_deepseek.build_hf("v2-lite")
    out["deepseek-v3"] = lambda _: test_deepseek.build_hf("v3")
    # GQA with fewer KV heads than ranks: the one KV head is replicated on both ranks
    out["llama-one-kv-head"] = lambda _: test_hf_parity.build_hf("llama", num_key_value_heads=1)
    out["olmo2-one-kv-head"] = lambda _: test_hf_parity.build_hf("olmo2", num_key_value_heads=1)
    out["mamba2"] = lambda _: test_mamba.build_hf("mamba2")
    out["mamba2-one-group"] = lambda _: test_mamba.build_hf("mamba2", n_groups=1)
    out["bamba"] = lambda _: test_mamba.build_hf("bamba")
    out["llava"] = lambda _: test_llava.build_hf_llava()
    out["bert"] = _bert
    return out


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    dirs = {}
    for family, build in _builders().items():
        path = tmp_path_factory.mktemp(family)
        build(family).save_pretrained(path)
        dirs[family] = str(path)
    ranks = run_ranks(compare_families, (dirs, PROMPTS, SPECIAL))
    assert ranks[0].keys() == ranks[1].keys()
    return ranks


@pytest.mark.parametrize("mode", ["tp", "pp"])
@pytest.mark.parametrize("family", sorted(_builders()))
def test_split_model_gives_the_whole_models_logits(results, family, mode):
    for rank_results in results:  # every rank computes the same logits
        found = rank_results[family, mode]
        if (family, mode) in REFUSED:
            assert isinstance(found, str) and REFUSED[family, mode] in found
            continue
        diff, same_tokens = found
        assert diff < TOL and same_tokens


def _config(**overrides) -> ModelConfig:
    from tests.tiny import TINY_LLAMA

    return ModelConfig.from_hf(
        {"architectures": ["LlamaForCausalLM"], "model_type": "llama"} | TINY_LLAMA | overrides
    )


@pytest.mark.parametrize(
    "overrides, tp, pp, message",
    [
        ({}, 3, 1, "does not divide num_attention_heads=4"),
        (
            {"num_attention_heads": 6, "num_key_value_heads": 6},
            4,
            1,
            "does not divide num_attention_heads=6",
        ),
        ({"num_attention_heads": 8, "num_key_value_heads": 3}, 2, 1, "num_key_value_heads=3"),
        ({"intermediate_size": 90}, 4, 1, "intermediate_size=90"),
        ({}, 1, 3, "pipeline_parallel_size=3 exceeds the 2 decoder layers"),
        ({}, 0, 1, "tensor_parallel_size must be an int >= 1, got 0"),
    ],
)
def test_sizes_that_do_not_split_are_named(overrides, tp, pp, message):
    with pytest.raises(ValueError, match=message):
        check_parallel_sizes(_config(**overrides), tp, pp)


@given(st.integers(1, 200), st.data())
def test_stages_hold_every_layer_once_in_order(layers, data):
    pp = data.draw(st.integers(1, layers))
    split = [list(stage_layers(layers, s, pp)) for s in range(pp)]
    assert sum(split, []) == list(range(layers)) and all(split)
    assert max(map(len, split)) - min(map(len, split)) <= 1


@given(st.integers(0, 300), st.integers(1, 16))
def test_micro_batches_cut_whole_requests(num_reqs, count):
    bounds = micro_batches(num_reqs, count)
    assert len(bounds) == min(num_reqs, count)
    assert [a for a, _ in bounds[1:]] == [b for _, b in bounds[:-1]]  # contiguous
    assert all(b > a for a, b in bounds)
    if bounds:
        assert bounds[0][0] == 0 and bounds[-1][1] == num_reqs


def _mamba_config(**overrides) -> ModelConfig:
    config_cls, _, kwargs = test_mamba.FAMILIES["mamba2"]
    raw = config_cls(**(kwargs | overrides)).to_dict()
    return ModelConfig.from_hf(raw | {"architectures": ["Mamba2ForCausalLM"]})


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"num_heads": 3, "head_dim": 32, "n_groups": 1}, "does not divide .*heads=3"),
        ({"num_heads": 12, "head_dim": 8, "n_groups": 3}, "n_groups=3"),
    ],
)
def test_mamba_mixers_that_do_not_split_are_named(overrides, message):
    check_parallel_sizes(_mamba_config(), 2, 1)  # 8 heads, 2 groups: split
    check_parallel_sizes(_mamba_config(n_groups=1), 2, 1)  # one group: replicated
    with pytest.raises(ValueError, match=f"tensor_parallel_size=2 .*{message}"):
        check_parallel_sizes(_mamba_config(hidden_size=48, **overrides), 2, 1)


def test_an_encoder_is_not_cut_into_stages():
    raw = transformers.BertConfig(vocab_size=97, **TINY_BERT).to_dict()
    config = ModelConfig.from_hf(raw | {"architectures": ["BertModel"]})
    check_parallel_sizes(config, 2, 1)
    with pytest.raises(ValueError, match="pipeline_parallel_size=2: BertModel is an encoder"):
        check_parallel_sizes(config, 1, 2)
