"""LoRA on a quantized base (QLoRA serving): the engine with an adapter on an int4
checkpoint gives the tokens of the same adapter on the float checkpoint of the int4
model's dequantized weights."""

from __future__ import annotations

import json
import shutil

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("peft")

from safetensors.torch import load_file, save_file  # noqa: E402

from pyagent_ref.engine.llm import LLM  # noqa: E402
from pyagent_ref.lora import LoRARequest  # noqa: E402
from pyagent_ref.model import default_model_path  # noqa: E402
from pyagent_ref.ops import quant as quant_ops  # noqa: E402
from pyagent_ref.quant import compressed_tensors as ct_format  # noqa: E402
from pyagent_ref.quant import quant_scheme  # noqa: E402
from pyagent_ref.sample.params import SamplingParams  # noqa: E402
from tests.lora.helpers import make_adapter  # noqa: E402
from tools.quantize import quantize_dir  # noqa: E402

PROMPTS = [[5, 17, 3, 88, 41, 9, 60, 12], [8, 1, 96, 45, 45, 12, 7], [300, 31, 502, 33, 34]]
GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
ENGINE = dict(dtype="float32", block_size=4, num_kv_blocks=128, enable_lora=True, ops="ref")


def _dequantized_dir(qdir, out):
    """A float32 checkpoint whose projections are the compressed-tensors checkpoint's
    dequantized weights (and no quantization_config)."""
    config = json.loads((qdir / "config.json").read_text())
    scheme = quant_scheme(config)
    del config["quantization_config"]
    tensors = load_file(qdir / "model.safetensors")
    result = {}
    for name, t in tensors.items():
        module, _, suffix = name.rpartition(".")
        if suffix not in ct_format.SUFFIXES:
            result[name] = t
        elif suffix == "weight_packed":
            stored = {
                s: tensors[f"{module}.{s}"]
                for s in ct_format.SUFFIXES
                if f"{module}.{s}" in tensors
            }
            w = ct_format.convert(module, stored, scheme)
            codes = quant_ops.unpack_int32(w.packed, w.bits, w.in_features)
            result[f"{module}.weight"] = quant_ops.dequantize(codes, w.scales, w.zeros)
    out.mkdir()
    save_file(result, out / "model.safetensors")
    (out / "config.json").write_text(json.dumps(config))
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copy(qdir / name, out / name)
    return out


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """(int4 checkpoint, float32 checkpoint of its dequantized weights, adapter dirs)."""
    root = tmp_path_factory.mktemp("qlora")
    qdir = quantize_dir(root / "int4", "int4", group_size=16, symmetric=False)
    fdir = _dequantized_dir(qdir, root / "dequantized")
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        default_model_path(), dtype=torch.float32
    )
    adapters = {}
    for dora in (False, True):
        adapters[dora] = root / f"adapter-{dora}"
        make_adapter(hf, adapters[dora], r=4, alpha=16, use_dora=dora)
    return qdir, fdir, adapters


@pytest.mark.parametrize("dora", [False, True])
def test_adapter_on_int4_base_equals_adapter_on_its_dequantized_weights(checkpoints, dora):
    qdir, fdir, adapters = checkpoints
    request = LoRARequest("a", 1, str(adapters[dora]))
    outs = {}
    for name, path in (("quantized", qdir), ("float", fdir)):
        llm = LLM(path, **ENGINE)
        outs[name] = [
            [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY, lora)]
            for lora in (request, None)
        ]
    assert outs["quantized"] == outs["float"]
    assert outs["quantized"][0] != outs["quantized"][1]  # the adapter changes the tokens
