"""Quantized checkpoints under tensor parallelism: GPTQ, AWQ and compressed-tensors
layers split on their unpacked axes (column-parallel rows; row-parallel input columns in
whole words and groups) give the logits of one process on two gloo ranks (and so do
pipeline stages, each with its own layers' packed weights), and the engine
with tensor_parallel_size=2 draws its tokens; a share that would cut a group, and
act-order, are refused by name."""

from __future__ import annotations

import json
import shutil

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from pyagent_ref.engine.core import EngineConfig, EngineCore  # noqa: E402
from pyagent_ref.sample.params import SamplingParams  # noqa: E402
from pyagent_ref.sched import Request  # noqa: E402
from tests.distributed.ranks import compare_quantized, run_ranks  # noqa: E402
from tests.tiny import TINY_LLAMA  # noqa: E402
from tools.quantize import quantize_dir  # noqa: E402

TOL = 1e-4
PROMPTS = [[5, 17, 3, 88, 41, 9, 60, 2, 33, 71, 14], [8, 1, 96, 45, 45, 12, 7]]
# hidden 64, intermediate 96: a rank's o_proj and down_proj inputs (32 and 48 columns)
# are whole groups of 16 and whole words of 8 int4 (4 int8) codes
CHECKPOINTS = {
    "gptq-int4-g16": dict(fmt="gptq", group_size=16, method="rtn"),
    "gptq-int8-asym": dict(fmt="gptq", bits=8, symmetric=False, method="rtn"),
    "awq-int4-g16": dict(fmt="awq", group_size=16),
    "ct-int8": dict(fmt="int8"),
    "ct-int4-asym-g16": dict(fmt="int4", group_size=16, symmetric=False),
}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("quantized-tp")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        **TINY_LLAMA, eos_token_id=None, bos_token_id=None, pad_token_id=None
    )
    transformers.LlamaForCausalLM(config).eval().save_pretrained(root / "float")
    made = {
        name: quantize_dir(root / name, model_dir=root / "float", **kw)
        for name, kw in CHECKPOINTS.items()
    }
    made["gptq-int4-g32"] = quantize_dir(
        root / "g32", "gptq", group_size=32, model_dir=root / "float", method="rtn"
    )
    # act-order named in the config (the refusal reads no more; the codes are g32's)
    actorder = root / "actorder"
    shutil.copytree(made["gptq-int4-g32"], actorder)
    config = json.loads((actorder / "config.json").read_text())
    config["quantization_config"]["desc_act"] = True
    (actorder / "config.json").write_text(json.dumps(config))
    made["gptq-int4-g32-actorder"] = actorder
    return made


def test_split_quantized_layers_give_the_logits_of_one_process(checkpoints):
    paths = {name: str(checkpoints[name]) for name in CHECKPOINTS}
    for rank, result in enumerate(run_ranks(compare_quantized, (paths, PROMPTS))):
        assert set(result) == {(name, mode) for name in CHECKPOINTS for mode in ("tp", "pp")}
        for (name, mode), (diff, same) in result.items():
            assert diff < TOL, f"rank {rank} {name} {mode}: logits differ by {diff}"
            assert same, f"rank {rank} {name} {mode}: greedy tokens differ"


ENGINE = dict(block_size=4, num_kv_blocks=64, max_num_batched_tokens=16, dtype="float32", ops="ref")


def _greedy(core):
    requests = [
        Request(
            str(i), p, sampling_params=SamplingParams(temperature=0, max_tokens=6), max_tokens=6
        )
        for i, p in enumerate(PROMPTS)
    ]
    try:
        for r in requests:
            core.add_request(r)
        for _ in range(100):
            if not core.has_unfinished_requests():
                break
            core.step()
        return [r.output_token_ids for r in requests]
    finally:
        core.shutdown()


def test_engine_on_a_quantized_checkpoint_with_tensor_parallelism(checkpoints):
    path = str(checkpoints["awq-int4-g16"])
    want = _greedy(EngineCore.from_config(EngineConfig(model=path, **ENGINE)))
    core = EngineCore.from_config(EngineConfig(model=path, **ENGINE, tensor_parallel_size=2))
    assert core.executor.backend == "mp"
    assert _greedy(core) == want


@pytest.mark.parametrize(
    "name, overrides, message",
    [
        # down_proj: a rank's 48 input columns are 1.5 groups of 32
        ("gptq-int4-g32", {}, "group_size=32 does not split layers.0.mlp.down_proj.weight"),
        ("gptq-int4-g32-actorder", {}, "desc_act=True"),
        ("ct-int8", dict(enable_lora=True), "enable_lora=True"),
    ],
)
def test_refused_at_start_naming_the_value(checkpoints, name, overrides, message):
    config = EngineConfig(
        model=str(checkpoints[name]), **ENGINE, tensor_parallel_size=2, **overrides
    )
    with pytest.raises(ValueError, match=message):
        EngineCore.from_config(config)
