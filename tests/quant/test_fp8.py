"""FP8 checkpoints: tools/quantize.py --format fp8 writes vLLM's fp8 layout, which loads
into Fp8Linear layers (weights equal to the float ones within e4m3's rounding), keeps the
default model's perplexity and greedy tokens through the engine; compressed-tensors'
float-quantized layout (per-channel scales, per-token dynamic activations) and vLLM's
static activation scheme load too; Fp8Linear stacks fused parts exactly; bad configs and
tensors fail at load with the value named."""

from __future__ import annotations

import json
import shutil

import pytest

torch = pytest.importorskip("torch")

from safetensors.torch import load_file, save_file  # noqa: E402

from pyagent_ref.engine.llm import LLM  # noqa: E402
from pyagent_ref.model import default_model_path, load_model  # noqa: E402
from pyagent_ref.ops import load as load_ops  # noqa: E402
from pyagent_ref.ops import quant as quant_ops  # noqa: E402
from pyagent_ref.quant import fp8  # noqa: E402
from pyagent_ref.sample.params import SamplingParams  # noqa: E402
from tools.quantize import heldout_ids, perplexity, quantize_dir  # noqa: E402

E4M3_REL = 2.0**-4  # half e4m3's mantissa step, relative


@pytest.fixture(scope="module")
def fp8_dir(tmp_path_factory):
    return quantize_dir(tmp_path_factory.mktemp("q") / "fp8", "fp8")


def _rewrite(src, dst, config, tensors=None):
    """A copy of checkpoint `src` at `dst` with another quantization_config (and tensors)."""
    shutil.copytree(src, dst)
    full = json.loads((dst / "config.json").read_text())
    full["quantization_config"] = config
    (dst / "config.json").write_text(json.dumps(full))
    if tensors is not None:
        save_file(tensors, dst / "model.safetensors")
    return dst


def test_the_tool_writes_vllms_fp8_layout(fp8_dir):
    qc = json.loads((fp8_dir / "config.json").read_text())["quantization_config"]
    assert qc == fp8.config()
    tensors = load_file(fp8_dir / "model.safetensors")
    weight = tensors["model.layers.0.self_attn.q_proj.weight"]
    scale = tensors["model.layers.0.self_attn.q_proj.weight_scale"]
    assert weight.dtype == torch.float8_e4m3fn and scale.dtype == torch.float32
    assert scale.shape == ()
    source = load_file(default_model_path() / "model.safetensors")
    w = source["model.layers.0.self_attn.q_proj.weight"].float()
    assert float(scale) == float(w.abs().max() / 448)  # amax / max, float32
    # the codes are torch's own cast of w / s
    torch.testing.assert_close(weight.float(), (w / scale).to(torch.float8_e4m3fn).float())
    assert tensors["model.norm.weight"].dtype == source["model.norm.weight"].dtype


def test_layers_load_as_fp8_linear_with_the_float_weights(fp8_dir):
    model = load_model(fp8_dir, dtype="float32", progress=False)
    base = load_model(default_model_path(), dtype="float32", progress=False)
    qkv = model.layers[1].self_attn.qkv_proj
    assert isinstance(qkv, fp8.Fp8Linear) and qkv.input_scale == "dynamic"
    assert qkv.codes.dtype == torch.uint8 and qkv.scales.shape == (qkv.out_features, 1)
    want = base.layers[1].self_attn.qkv_proj.weight
    scale = qkv.scales.expand_as(want)
    bound = E4M3_REL * want.abs() + 2.0**-10 * scale
    assert ((qkv.dequantized() - want).abs() <= bound * (1 + 1e-6)).all()


def test_perplexity_within_one_percent_of_float32(fp8_dir):
    windows = heldout_ids(default_model_path())[:2]
    base = perplexity(load_model(default_model_path(), dtype="float32", progress=False), windows)
    quant = perplexity(load_model(fp8_dir, dtype="float32", progress=False), windows)
    assert abs(quant / base - 1) < 0.01, (quant, base)


PROMPTS = [[(37 * i + 11 * j) % 4000 + 3 for j in range(4 + i % 5)] for i in range(8)]


def _agreeing_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_greedy_generation_through_the_engine(fp8_dir):
    """The fp8 checkpoint serves through LLM on the default ops (the accelerator's table
    kernel where installed). Its greedy tokens follow float32's for a while: the first
    token on every prompt (these synthetic prompts leave the small model unsure, so later
    tokens part: 1 to 12 equal tokens per prompt when this was written)."""
    greedy = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    engine = dict(dtype="float32", block_size=4, num_kv_blocks=64)
    want = [o.outputs[0].token_ids for o in LLM(**engine).generate(PROMPTS, greedy)]
    got = [o.outputs[0].token_ids for o in LLM(fp8_dir, **engine).generate(PROMPTS, greedy)]
    prefixes = [_agreeing_prefix(a, b) for a, b in zip(got, want, strict=True)]
    print(f"fp8 greedy tokens equal to float32's before the first difference: {prefixes}")
    assert min(prefixes) >= 1, (got, want)


def _per_channel_tensors(fp8_dir, static: bool):
    """The fp8 checkpoint's tensors with per-channel scales (out, 1), or with a static
    input_scale per layer."""
    tensors = load_file(fp8_dir / "model.safetensors")
    source = load_file(default_model_path() / "model.safetensors")
    for name in [n for n in tensors if n.endswith(".weight_scale")]:
        module = name.removesuffix(".weight_scale")
        w = source[f"{module}.weight"].float()
        if static:
            tensors[f"{module}.input_scale"] = torch.tensor([0.5 + len(module) % 3 / 8])
        else:
            codes, scales = quant_ops.quantize_fp8(w, "e4m3", "channel")
            tensors[f"{module}.weight"] = codes.view(torch.float8_e4m3fn)
            tensors[name] = scales
    return tensors


def _ct_config(input_activations):
    weights = dict(num_bits=8, type="float", symmetric=True, strategy="channel", dynamic=False)
    group = dict(targets=["Linear"], weights=weights, input_activations=input_activations)
    return {
        "quant_method": "compressed-tensors",
        "format": "float-quantized",
        "config_groups": {"group_0": group},
        "ignore": ["lm_head"],
    }


def test_compressed_tensors_float_quantized_per_channel_loads(fp8_dir, tmp_path):
    acts = dict(num_bits=8, type="float", symmetric=True, strategy="token", dynamic=True)
    path = _rewrite(
        fp8_dir, tmp_path / "ct", _ct_config(acts), _per_channel_tensors(fp8_dir, False)
    )
    model = load_model(path, dtype="float32", progress=False)
    down = model.layers[0].mlp.down_proj
    assert down.input_scale == "dynamic_per_token" and down.scales.shape == (256, 1)
    base = load_model(default_model_path(), dtype="float32", progress=False)
    windows = heldout_ids(default_model_path())[:1]
    assert abs(perplexity(model, windows) / perplexity(base, windows) - 1) < 0.01


def test_static_activation_scales_load_and_fused_parts_take_the_largest(fp8_dir, tmp_path):
    config = dict(fp8.config(), activation_scheme="static")
    tensors = _per_channel_tensors(fp8_dir, True)
    path = _rewrite(fp8_dir, tmp_path / "static", config, tensors)
    layer = load_model(path, dtype="float32", progress=False).layers[0]
    prefix = "model.layers.0.self_attn"
    parts = [float(tensors[f"{prefix}.{p}_proj.input_scale"]) for p in "qkv"]
    assert layer.self_attn.qkv_proj.input_scale == max(parts)
    assert layer.self_attn.o_proj.input_scale == float(tensors[f"{prefix}.o_proj.input_scale"])


def test_fused_parts_compute_x_times_the_stacked_weight():
    g = torch.Generator().manual_seed(0)
    ws = [torch.randn(r, 32, generator=g) for r in (16, 8, 8)]
    pers = ("tensor", "channel", "tensor")
    parts = [
        fp8.Fp8Weight(*quant_ops.quantize_fp8(w, "e4m3", p), "e4m3")
        for w, p in zip(ws, pers, strict=True)
    ]
    for ops in ("ref", "auto"):
        layer = fp8.Fp8Linear.stack(parts, 32, 32, "qkv", load_ops(ops))
        weight = torch.cat([quant_ops.dequantize_fp8(p.codes, p.scales) for p in parts])
        torch.testing.assert_close(layer.dequantized(), weight, rtol=0, atol=0)
        x = torch.randn(3, 2, 32, generator=g)
        torch.testing.assert_close(layer(x), x @ weight.T, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match=r"qkv: fp8 parts of shapes \[\(16, 32\)"):
        fp8.Fp8Linear.stack(parts[:1], 32, 32, "qkv", load_ops("ref"))


@pytest.mark.parametrize(
    "change,message",
    [
        (dict(fmt="e5m2"), "fmt must be one of \\('e4m3',\\), got 'e5m2'"),
        (dict(weight_block_size=[128, 128]), "weight_block_size \\[128, 128\\]"),
        (dict(activation_scheme="per_token"), "activation_scheme must be"),
    ],
)
def test_bad_fp8_configs_are_named(fp8_dir, tmp_path, change, message):
    path = _rewrite(fp8_dir, tmp_path / "bad", dict(fp8.config(), **change))
    with pytest.raises(ValueError, match=message):
        load_model(path, progress=False)


@pytest.mark.parametrize(
    "weights,acts,message",
    [
        (dict(strategy="block"), None, "weights strategy must be 'tensor' or 'channel'"),
        (dict(num_bits=4), None, "weights num_bits must be 8"),
        (dict(symmetric=False), None, "weights symmetric must be True"),
        ({}, dict(type="float", num_bits=8, strategy="token", dynamic=False), "strategy 'token'"),
        ({}, dict(type="int", num_bits=8, strategy="tensor"), "input_activations must be"),
    ],
)
def test_bad_compressed_tensors_float_configs_are_named(fp8_dir, tmp_path, weights, acts, message):
    config = _ct_config(acts)
    config["config_groups"]["group_0"]["weights"].update(weights)
    path = _rewrite(fp8_dir, tmp_path / "bad", config)
    with pytest.raises(ValueError, match=message):
        load_model(path, progress=False)


def test_bad_fp8_tensors_are_named(fp8_dir, tmp_path):
    name = "model.layers.0.mlp.down_proj"
    tensors = load_file(fp8_dir / "model.safetensors")
    tensors[f"{name}.weight"] = tensors[f"{name}.weight"].float()
    path = _rewrite(fp8_dir, tmp_path / "dtype", fp8.config(), tensors)
    with pytest.raises(ValueError, match=f"'{name}.weight' must be 2-D torch.float8_e4m3fn"):
        load_model(path, progress=False)
    static = dict(fp8.config(), activation_scheme="static")
    path = _rewrite(fp8_dir, tmp_path / "static", static)
    with pytest.raises(ValueError, match="lacks tensor 'model.layers.0.*input_scale'"):
        load_model(path, progress=False)
