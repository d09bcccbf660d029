"""LoRA under tensor and pipeline parallelism: adapters cut like their base layers
(`distributed.lora`), on two gloo ranks, give the logits of one process within TOL and
its greedy tokens, for a batch mixing two adapters and a row without one; the engine
with tensor_parallel_size=2 and enable_lora draws the tokens of one process; DoRA and
OLMo 2's sharded q/k norms are refused by name."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("peft")

from pyagent_ref.engine.core import EngineConfig, EngineCore  # noqa: E402
from pyagent_ref.lora import LoRARequest  # noqa: E402
from pyagent_ref.sample.params import SamplingParams  # noqa: E402
from pyagent_ref.sched import Request  # noqa: E402
from tests.distributed.ranks import compare_lora, run_ranks  # noqa: E402
from tests.lora.helpers import LLAMA_TARGETS, TARGETS, make_adapter  # noqa: E402
from tests.model import test_hf_parity, test_moe  # noqa: E402

TOL = 1e-4  # float32: the shards' partial sums are added in another order
PROMPTS = [[5, 17, 3, 88, 41, 9, 60, 12], [8, 1, 96, 45, 45, 12, 7], [30, 31, 50, 33, 34]]
ADAPTERS = ["a", None, "b"]  # per prompt: two adapters and the base model
# a replicated KV head (one KV head, TP=2); biases on row-parallel layers and Conv1D
# (GPT-2); an MoE's shared expert, whose down_proj is reduced with the routed experts
BUILDERS = {
    "llama-one-kv-head": lambda: test_hf_parity.build_hf("llama", num_key_value_heads=1),
    "gpt2": lambda: test_hf_parity.build_hf("gpt2"),
    "qwen2-moe": lambda: test_moe.build_hf("qwen2-moe"),
}


def _save(family, root):
    """The model saved at root / family with adapters "a" (r=4, every projection) and
    "b" (rsLoRA r=8, attention only) and "dora" (DoRA r=2)."""
    hf = BUILDERS[family]()
    path = root / family
    hf.save_pretrained(path)
    targets = TARGETS.get(family, LLAMA_TARGETS)
    make_adapter(hf, path / "a", r=4, alpha=16, targets=targets, seed=1)
    attention = targets[:4] if family != "gpt2" else targets[:2]
    make_adapter(hf, path / "b", r=8, alpha=8, use_rslora=True, targets=attention, seed=2)
    make_adapter(hf, path / "dora", r=2, alpha=4, use_dora=True, targets=targets, seed=3)
    return str(path)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora-tp")
    return {family: _save(family, root) for family in BUILDERS}


def test_adapters_cut_like_their_layers_give_the_logits_of_one_process(models):
    results = run_ranks(compare_lora, (models, ADAPTERS, PROMPTS))
    for rank, result in enumerate(results):
        for (family, mode), (diff, same) in result.items():
            assert diff < TOL, f"rank {rank} {family} {mode}: logits differ by {diff}"
            assert same, f"rank {rank} {family} {mode}: greedy tokens differ"
    assert set(results[0]) == {(f, m) for f in BUILDERS for m in ("tp", "pp")}


def _greedy(core, model_dir):
    requests = [
        Request(
            str(i),
            prompt,
            sampling_params=SamplingParams(temperature=0, max_tokens=6, ignore_eos=True),
            max_tokens=6,
            lora_request=None if d is None else LoRARequest(d, i + 1, f"{model_dir}/{d}"),
        )
        for i, (prompt, d) in enumerate(zip(PROMPTS, ADAPTERS, strict=True))
    ]
    for r in requests:
        core.add_request(r)
    for _ in range(100):
        if not core.has_unfinished_requests():
            break
        core.step()
    assert not core.has_unfinished_requests()
    return [r.output_token_ids for r in requests]


ENGINE = dict(block_size=4, num_kv_blocks=64, max_num_batched_tokens=16, dtype="float32", ops="ref")


def test_engine_with_tensor_parallel_lora_draws_the_tokens_of_one_process(models):
    path = models["llama-one-kv-head"]
    lora = dict(enable_lora=True, max_loras=2, max_lora_rank=8)
    want = _greedy(EngineCore.from_config(EngineConfig(model=path, **ENGINE, **lora)), path)
    core = EngineCore.from_config(
        EngineConfig(model=path, **ENGINE, **lora, tensor_parallel_size=2)
    )
    try:
        assert core.executor.backend == "mp"
        assert _greedy(core, path) == want
        with pytest.raises(ValueError, match="use_dora=True is not supported"):
            core.add_lora(LoRARequest("dora", 9, f"{path}/dora"))
    finally:
        core.shutdown()
    assert not any(p.is_alive() for p in core.executor.procs)


def test_olmo2_sharded_qk_norms_with_lora_are_refused_by_name(tmp_path):
    test_hf_parity.build_hf("olmo2").save_pretrained(tmp_path / "olmo2")
    config = EngineConfig(
        model=str(tmp_path / "olmo2"), **ENGINE, enable_lora=True, tensor_parallel_size=2
    )
    with pytest.raises(ValueError, match="enable_lora=True with tensor_parallel_size=2: Olmo2"):
        EngineCore.from_config(config)
