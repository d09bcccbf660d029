"""Weight loading: single file and shards, dtypes, and the errors that name the culprit."""

from __future__ import annotations

import functools
import json
import re
import shutil
from types import ModuleType

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from safetensors.torch import load_file, save_file  # noqa: E402

from pyagent_ref.model import ModelConfig, load_model  # noqa: E402


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=50,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    model = transformers.LlamaForCausalLM(config)
    single = tmp_path_factory.mktemp("single")
    model.save_pretrained(single)
    sharded = tmp_path_factory.mktemp("sharded")
    model.save_pretrained(sharded, max_shard_size="20KB")
    return single, sharded


def test_sharded_equals_single(hf_dir):
    single, sharded = hf_dir
    assert (sharded / "model.safetensors.index.json").is_file()
    a, b = load_model(single, progress=False), load_model(sharded, progress=False)
    for (name, p), (_, q) in zip(a.named_parameters(), b.named_parameters(), strict=True):
        assert torch.equal(p, q), name


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_dtypes(hf_dir, dtype):
    model = load_model(hf_dir[0], dtype=dtype, progress=False)
    assert {p.dtype for p in model.parameters()} == {getattr(torch, dtype)}
    assert model.rotary.inv_freq.dtype == torch.float32


def test_fused_projections_hold_the_hf_tensors(hf_dir):
    model = load_model(hf_dir[0], progress=False)
    tensors = load_file(hf_dir[0] / "model.safetensors")
    qkv = model.layers[1].self_attn.qkv_proj.weight
    assert torch.equal(qkv[:32], tensors["model.layers.1.self_attn.q_proj.weight"])
    assert torch.equal(qkv[32:48], tensors["model.layers.1.self_attn.k_proj.weight"])
    assert torch.equal(qkv[48:], tensors["model.layers.1.self_attn.v_proj.weight"])
    gate_up = model.layers[0].mlp.gate_up_proj.weight
    assert torch.equal(gate_up[48:], tensors["model.layers.0.mlp.up_proj.weight"])


def _copy(src, dst, edit):
    dst.mkdir()
    (dst / "config.json").write_text((src / "config.json").read_text())
    tensors = load_file(src / "model.safetensors")
    edit(tensors)
    save_file(tensors, dst / "model.safetensors")
    return dst


def _corrupt(src, dst, name, data: bytes):
    """A copy of the model directory `src` at `dst` whose file `name` holds `data`."""
    shutil.copytree(src, dst)
    (dst / name).write_bytes(data)
    return dst


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b'{\n  "architectures": [\n', r"is not valid JSON: Expecting value: line 3 column 1"),
        (b"[1, 2]", "must hold a JSON object, got list"),
        (b'{"vocab_size": "\xff"}', "is not UTF-8 text"),
    ],
    ids=["truncated", "not an object", "not utf-8"],
)
def test_corrupt_config_json_is_named(hf_dir, tmp_path, data, message):
    path = _corrupt(hf_dir[0], tmp_path / "m", "config.json", data)
    with pytest.raises(ValueError, match=re.escape(str(path / "config.json")) + " " + message):
        ModelConfig.from_pretrained(path)
    with pytest.raises(ValueError, match=message):
        load_model(path, progress=False)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b'{"weight_map": {"lm_head.weight": ', "is not valid JSON: Expecting value: line 1"),
        (b'{"metadata": {}}', "'weight_map' must map tensor names to file names, got None"),
        (b'{"weight_map": {"lm_head.weight": 3}}', "must map tensor names to file names"),
    ],
    ids=["truncated", "no weight_map", "not a file name"],
)
def test_corrupt_shard_index_is_named(hf_dir, tmp_path, data, message):
    path = _corrupt(hf_dir[1], tmp_path / "m", "model.safetensors.index.json", data)
    with pytest.raises(ValueError, match=r"model\.safetensors\.index\.json:? .*" + message):
        load_model(path, progress=False)


@pytest.mark.parametrize(
    ("keep", "reason"),
    [(-100, "incomplete metadata"), (0, "header too small"), (20, "")],
    ids=["truncated", "empty", "cut in the header"],
)
def test_unreadable_safetensors_file_is_named(hf_dir, tmp_path, keep, reason):
    data = (hf_dir[0] / "model.safetensors").read_bytes()
    path = _corrupt(hf_dir[0], tmp_path / "m", "model.safetensors", data[:keep])
    expected = re.escape(f"{path / 'model.safetensors'} is not a readable safetensors file: ")
    with pytest.raises(ValueError, match=expected + ".*" + reason):
        load_model(path, progress=False)


def test_truncated_shard_is_named(hf_dir, tmp_path):
    shard = sorted(hf_dir[1].glob("model-*.safetensors"))[-1]
    path = _corrupt(hf_dir[1], tmp_path / "m", shard.name, shard.read_bytes()[:-8])
    with pytest.raises(ValueError, match=re.escape(shard.name) + " is not a readable safetensors"):
        load_model(path, progress=False)


def test_missing_tensor_is_named(hf_dir, tmp_path):
    path = _copy(hf_dir[0], tmp_path / "m", lambda t: t.pop("model.layers.1.mlp.up_proj.weight"))
    with pytest.raises(ValueError, match="layers.1.mlp.gate_up_proj.weight"):
        load_model(path, progress=False)


def test_misshaped_tensor_is_named(hf_dir, tmp_path):
    def edit(t):
        t["model.norm.weight"] = torch.ones(31)

    with pytest.raises(
        ValueError, match=r"'model.norm.weight' has shape \(31,\), expected \(32,\)"
    ):
        load_model(_copy(hf_dir[0], tmp_path / "m", edit), progress=False)


def test_non_float_tensor_is_named(hf_dir, tmp_path):
    def edit(t):
        t["model.norm.weight"] = torch.ones(32, dtype=torch.int64)

    with pytest.raises(
        ValueError,
        match=r"'model.norm.weight' has dtype torch.int64, expected a floating-point dtype",
    ):
        load_model(_copy(hf_dir[0], tmp_path / "m", edit), progress=False)


def test_unexpected_tensor_is_named(hf_dir, tmp_path):
    def edit(t):
        t["model.extra.weight"] = torch.ones(3)

    with pytest.raises(ValueError, match="model.extra.weight"):
        load_model(_copy(hf_dir[0], tmp_path / "m", edit), progress=False)


def test_unsupported_architecture_is_named(hf_dir, tmp_path):
    cfg = json.loads((hf_dir[0] / "config.json").read_text())
    cfg["architectures"] = ["BloomForCausalLM"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="'BloomForCausalLM' is not supported; supported: ") as e:
        load_model(tmp_path, progress=False)
    for supported in ("Gemma2ForCausalLM", "GPT2LMHeadModel", "LlamaForCausalLM"):
        assert supported in str(e.value)


def test_config_needs_one_architecture():
    with pytest.raises(ValueError, match="exactly one architecture"):
        ModelConfig.from_hf({"architectures": []})


def test_missing_files_are_reported(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_model(tmp_path, progress=False)
    sizes = dict(vocab_size=8, hidden_size=8, intermediate_size=8, num_hidden_layers=1)
    config = {"architectures": ["LlamaForCausalLM"], "num_attention_heads": 2, **sizes}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        load_model(tmp_path, progress=False)


def test_bad_dtype(hf_dir):
    with pytest.raises(ValueError, match="'int8'"):
        load_model(hf_dir[0], dtype="int8", progress=False)


@pytest.mark.parametrize(
    ("device", "message"),
    [
        ("gpu", "device must be a torch device such as 'cpu' or 'cuda', got 'gpu'"),
        ("cuda:7", "device 'cuda:7' is not available: torch sees"),
    ],
)
def test_unknown_or_absent_devices_are_named(hf_dir, device, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        load_model(hf_dir, device=device, progress=False)


def _recording(calls: list[str]) -> ModuleType:
    """The reference ops namespace with every layers/rope/attention function recording
    its name in `calls`."""
    import pyagent_ref.ops as ref

    root = ModuleType("recording")
    root.MODULES = ref.MODULES
    for module in ref.MODULES:
        mod, copy = getattr(ref, module), ModuleType(module)
        for name in mod.__all__:
            fn = getattr(mod, name)
            if callable(fn) and module in ("layers", "rope", "attention"):
                fn = functools.partial(_record, calls, f"{module}.{name}", fn)
            setattr(copy, name, fn)
        setattr(root, module, copy)
    return root


def _record(calls, name, fn, *args, **kwargs):
    calls.append(name)
    return fn(*args, **kwargs)


def test_the_model_runs_on_the_ops_namespace_it_is_given(hf_dir):
    """Every layer, RoPE and attention op of a forward comes from the namespace passed to
    `load_model` (and `use_ops` switches it); none is imported directly."""
    from pyagent_ref.model import AttentionMetadata

    calls: list[str] = []
    model = load_model(hf_dir[0], progress=False, ops=_recording(calls))
    shape = model.kv_cache_shape(4, 4)
    caches = [(torch.zeros(shape), torch.zeros(shape)) for _ in model.layers]
    meta = AttentionMetadata(
        slot_mapping=torch.arange(4, 7),
        block_table=torch.tensor([[1]]),
        query_start_loc=torch.tensor([0, 3]),
        seq_lens=torch.tensor([3]),
    )
    with torch.no_grad():
        model(torch.tensor([1, 2, 3]), torch.arange(3), meta, caches)
    layers = len(model.layers)
    assert calls.count("attention.paged_attention") == layers
    assert calls.count("attention.reshape_and_cache") == layers
    assert calls.count("rope.apply_rope") == layers
    assert calls.count("layers.silu_and_mul") == layers
    assert calls.count("layers.rms_norm") == 2 * layers + 1
    assert "rope.rope_inv_freq" in calls  # the RoPE table, built when loading
    calls.clear()
    import pyagent_ref.ops

    model.use_ops(pyagent_ref.ops)
    with torch.no_grad():
        model(torch.tensor([1, 2, 3]), torch.arange(3), meta, caches)
    assert calls == []


def test_no_memory_the_checkpoint_leaves_unfilled_is_read(hf_dir, poisoned_to_empty):
    """Every tensor is loaded or computed (the RoPE tables), none is left as `to_empty`
    made it: with that memory NaN, the model equals a normal load's."""
    model = load_model(hf_dir[0], progress=False)
    tensors = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    assert all(torch.isfinite(t).all() for t in tensors.values())
    poisoned_to_empty.undo()
    clean = load_model(hf_dir[0], progress=False)
    for name, tensor in [*clean.named_parameters(), *clean.named_buffers()]:
        assert torch.equal(tensors[name], tensor), name
