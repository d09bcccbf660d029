"""Quantized checkpoints made by tools/quantize.py: each format loads through the loader
into QuantLinear layers whose weight is the one the format's layout stores (read here a
second way, by the formula of the format's documentation, element by element), runs in the
engine, and bad checkpoints fail at load with the value named. compressed-tensors' own
compressor reads our pack-quantized layers and writes layers we read, with equal weights.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from safetensors.torch import load_file, save_file  # noqa: E402

from pyagent_ref.model import default_model_path, load_model  # noqa: E402
from pyagent_ref.ops import quant as quant_ops  # noqa: E402
from pyagent_ref.quant import QuantScheme  # noqa: E402
from pyagent_ref.quant import compressed_tensors as ct_format  # noqa: E402
from pyagent_ref.quant.linear import QuantLinear  # noqa: E402
from tools.quantize import quantize_dir  # noqa: E402

CHECKPOINTS = {
    "gptq-int4-g16": dict(fmt="gptq", group_size=16, method="rtn"),
    "gptq-int8-asym-v2": dict(fmt="gptq", bits=8, symmetric=False, method="rtn"),
    "gptq-int4-actorder": dict(fmt="gptq", group_size=16, method="gptq", act_order=True),
    "awq-int4-g16": dict(fmt="awq", group_size=16),
    "int8": dict(fmt="int8"),
    "int4-asym-g16": dict(fmt="int4", group_size=16, symmetric=False),
}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("quantized")
    made = {}
    for name, kw in CHECKPOINTS.items():
        made[name] = quantize_dir(root / name, **kw)
        if name == "gptq-int8-asym-v2":  # rewrite as gptq_v2: zero points as they are
            _to_gptq_v2(made[name])
    return made


def _to_gptq_v2(path):
    tensors = load_file(path / "model.safetensors")
    for name, t in tensors.items():
        if name.endswith("qzeros"):  # 8-bit fields: add one to each, mod 256
            u = t.view(torch.uint8).long()
            tensors[name] = ((u + 1) % 256).to(torch.uint8).view(torch.int32)
    save_file(tensors, path / "model.safetensors")
    config = json.loads((path / "config.json").read_text())
    config["quantization_config"]["checkpoint_format"] = "gptq_v2"
    (path / "config.json").write_text(json.dumps(config))


# --- the formats' weights read by their documented formulas --------------------------------


def _fields(words, bits, axis):
    """Unsigned fields of int32 words along `axis`: element i of that axis holds field
    i % k of word i // k (k = 32 / bits) at bits [(i % k) * bits, ...)."""
    words = np.asarray(words).view(np.uint32)
    k = 32 // bits
    n = words.shape[axis] * k
    idx = np.arange(n)
    picked = np.take(words, idx // k, axis=axis)
    shift = ((idx % k) * bits).astype(np.uint32)
    shape = [1, 1]
    shape[axis] = n
    return ((picked >> shift.reshape(shape)) & (2**bits - 1)).astype(np.int64)


def _reference_weight(tensors, prefix, qc):
    """The float weight (out, in) of one layer of a checkpoint, by the format's formula."""
    method = qc["quant_method"]
    if method == "gptq":
        bits = qc["bits"]
        u = _fields(tensors[f"{prefix}.qweight"], bits, 0)  # (in, out)
        uz = _fields(tensors[f"{prefix}.qzeros"], bits, 1)  # (groups, out)
        if qc["checkpoint_format"] == "gptq":
            uz = (uz + 1) % 2**bits
        g = tensors[f"{prefix}.g_idx"].numpy().astype(np.int64)
        s = tensors[f"{prefix}.scales"].float().numpy()
        return ((u - uz[g]) * s[g]).T
    if method == "awq":
        order = [0, 2, 4, 6, 1, 3, 5, 7]  # field j holds element order[j]
        inverse = np.argsort(order)

        def unpack(words):
            f = _fields(words, 4, 1).reshape(words.shape[0], -1, 8)
            return f[:, :, inverse].reshape(words.shape[0], -1)

        u, uz = unpack(tensors[f"{prefix}.qweight"]), unpack(tensors[f"{prefix}.qzeros"])
        s = tensors[f"{prefix}.scales"].float().numpy()
        size = u.shape[0] // s.shape[0]
        g = np.arange(u.shape[0]) // size
        return ((u - uz[g]) * s[g]).T
    bits = qc["config_groups"]["group_0"]["weights"]["num_bits"]
    q = _fields(tensors[f"{prefix}.weight_packed"], bits, 1) - 2 ** (bits - 1)
    s = tensors[f"{prefix}.weight_scale"].float().numpy()
    z = np.zeros_like(s, dtype=np.int64)
    if f"{prefix}.weight_zero_point" in tensors:
        z = _fields(tensors[f"{prefix}.weight_zero_point"], bits, 0) - 2 ** (bits - 1)
    g = np.arange(q.shape[1]) // (q.shape[1] // s.shape[1])
    return (q - z[:, g]) * s[:, g]


@pytest.mark.parametrize("name", CHECKPOINTS)
def test_loaded_layers_hold_the_stored_weights(checkpoints, name):
    path = checkpoints[name]
    qc = json.loads((path / "config.json").read_text())["quantization_config"]
    tensors = load_file(path / "model.safetensors")
    model = load_model(path, dtype="float32", progress=False)
    for layer in (0, len(model.layers) - 1):
        p = f"model.layers.{layer}"
        fused = {
            "self_attn.qkv_proj": ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"],
            "self_attn.o_proj": ["self_attn.o_proj"],
            "mlp.gate_up_proj": ["mlp.gate_proj", "mlp.up_proj"],
            "mlp.down_proj": ["mlp.down_proj"],
        }
        for ours, theirs in fused.items():
            module = model.get_submodule(f"layers.{layer}.{ours}")
            assert isinstance(module, QuantLinear)
            expected = np.concatenate([_reference_weight(tensors, f"{p}.{t}", qc) for t in theirs])
            np.testing.assert_allclose(module.dequantized().numpy(), expected, rtol=1e-6, atol=0)
    if name.endswith("actorder"):
        assert model.layers[0].mlp.down_proj.perm0 is not None


@pytest.mark.parametrize("name", CHECKPOINTS)
def test_quantized_model_stays_close_to_float(checkpoints, name):
    """The last hidden states of a prompt: within a format-sized distance of float32's,
    on the reference ops and on the default ("auto": the accelerator's fused kernel)."""
    from tools.quantize import forward

    ids = list(range(5, 45))
    ref = forward(load_model(default_model_path(), dtype="float32", progress=False), ids)
    tol = 0.1 if "int8" in name else 0.5
    outs = []
    for ops in ("ref", "auto"):
        from pyagent_ref.ops import load as load_ops

        model = load_model(checkpoints[name], dtype="float32", progress=False, ops=load_ops(ops))
        outs.append(forward(model, ids))
        rel = (outs[-1] - ref).norm() / ref.norm()
        assert rel < tol, (ops, float(rel))
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-4, atol=1e-4)


# --- compressed-tensors, the library, reads and writes the same layers ---------------------


@pytest.mark.parametrize("bits,group_size,symmetric", [(4, 16, False), (8, None, True)])
def test_compressed_tensors_library_agrees(bits, group_size, symmetric):
    ct_base = pytest.importorskip("compressed_tensors.compressors.pack_quantized.base")
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme

    strategy = "group" if group_size else "channel"
    theirs = QuantizationScheme(
        targets=["Linear"],
        weights=QuantizationArgs(
            num_bits=bits, type="int", symmetric=symmetric, strategy=strategy, group_size=group_size
        ),
    )
    ours = QuantScheme("compressed-tensors", bits, group_size, symmetric)
    w = torch.randn(48, 64, generator=torch.Generator().manual_seed(bits))
    codes, scales, zeros = quant_ops.quantize(w, bits, group_size, symmetric)
    weight = quant_ops.dequantize(codes, scales, zeros)
    compressor = ct_base.PackedQuantizationCompressor
    # ours written, theirs read
    stored = {
        k.split(".", 1)[1]: v for k, v in ct_format.store("l", codes, scales, zeros, ours).items()
    }
    torch.testing.assert_close(
        compressor.decompress(stored, theirs)["weight"], weight, rtol=0, atol=0
    )
    # theirs written, ours read
    state = {"weight": weight, "weight_scale": scales}
    if not symmetric:
        state["weight_zero_point"] = zeros
    written = compressor.compress(state, theirs)
    read = ct_format.convert("l", written, ours)
    got = quant_ops.dequantize(
        quant_ops.unpack_int32(read.packed, bits, 64), read.scales, read.zeros
    )
    torch.testing.assert_close(got, weight, rtol=0, atol=0)


# --- bad checkpoints --------------------------------------------------------------------------


def _edited(src, dst, config=None, tensors=None):
    shutil.copytree(src, dst)
    if config is not None:
        data = json.loads((dst / "config.json").read_text())
        config(data["quantization_config"])
        (dst / "config.json").write_text(json.dumps(data))
    if tensors is not None:
        t = load_file(dst / "model.safetensors")
        tensors(t)
        save_file(t, dst / "model.safetensors")
    return dst


@pytest.mark.parametrize(
    "name,config,tensors,message",
    [
        ("int8", lambda qc: qc.update(quant_method="bitsandbytes"), None, "'bitsandbytes'"),
        ("gptq-int4-g16", lambda qc: qc.update(bits=3), None, "bits must be one of (4, 8), got 3"),
        ("gptq-int4-g16", lambda qc: qc.update(group_size=24), None, "group_size 24"),
        ("gptq-int4-g16", lambda qc: qc.update(checkpoint_format="gptq_v9"), None, "gptq_v9"),
        ("awq-int4-g16", lambda qc: qc.update(version="gemv"), None, "'gemv'"),
        ("awq-int4-g16", lambda qc: qc.update(group_size=24), None, "group_size 24"),
        ("int4-asym-g16", lambda qc: qc.update(format="int-quantized"), None, "int-quantized"),
        (
            "gptq-int4-g16",
            None,
            lambda t: t.pop("model.layers.1.self_attn.k_proj.qzeros"),
            "model.layers.1.self_attn.k_proj.qzeros",
        ),
        (
            "awq-int4-g16",
            None,
            lambda t: t.update({"model.layers.0.mlp.up_proj.qweight": torch.zeros(3, 3)}),
            "model.layers.0.mlp.up_proj.qweight",
        ),
        (
            "int8",
            None,
            lambda t: t.update({"model.layers.0.mlp.down_proj.weight_scale": torch.ones(256, 2)}),
            "model.layers.0.mlp.down_proj.weight_scale",
        ),
        (
            "gptq-int4-g16",
            None,
            lambda t: t.update(
                {"model.layers.0.mlp.gate_proj.g_idx": torch.zeros(256, dtype=torch.int32)}
            ),
            "model.layers.0.mlp.gate_proj.g_idx",
        ),
    ],
)
def test_bad_checkpoints_fail_at_load_naming_the_value(
    checkpoints, tmp_path, name, config, tensors, message
):
    path = _edited(checkpoints[name], tmp_path / "bad", config, tensors)
    with pytest.raises(ValueError) as info:
        load_model(path, dtype="float32", progress=False)
    assert message in str(info.value)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_quantized_model_on_cuda_matches_cpu(checkpoints):
    """The layers' codes go to the model's device; the reference ops run there."""
    from pyagent_ref.ops import load as load_ops
    from tools.quantize import forward

    ids = list(range(5, 45))
    path = checkpoints["gptq-int4-actorder"]
    cpu = forward(load_model(path, dtype="float32", progress=False), ids)
    model = load_model(path, dtype="float32", device="cuda", progress=False, ops=load_ops("ref"))
    assert model.layers[0].mlp.down_proj.packed0.device.type == "cuda"
    torch.testing.assert_close(forward(model, ids).cpu(), cpu, rtol=1e-4, atol=1e-4)


def test_tensor_parallelism_that_would_cut_a_group_is_refused(checkpoints):
    """The embedded model's down_proj has 688 input columns: 344 per rank of TP=2, 21.5
    groups of 16 (tests/distributed/test_quantized.py splits checkpoints that divide)."""
    from pyagent_ref.engine.core import EngineConfig, EngineCore

    config = EngineConfig(
        model=str(checkpoints["gptq-int4-g16"]),
        dtype="float32",
        num_kv_blocks=32,
        tensor_parallel_size=2,
    )
    with pytest.raises(ValueError, match="group_size=16 does not split layers.0.mlp.down_proj"):
        EngineCore.from_config(config)
