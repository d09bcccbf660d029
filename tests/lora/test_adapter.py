"""Reading adapters (what is refused, and how it is named) and the manager's cache and slots."""

from __future__ import annotations

import json
import shutil

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("peft")

from pyagent_ref.lora import LoRAConfig, LoRARequest  # noqa: E402
from pyagent_ref.lora.adapter import load_adapter  # noqa: E402
from pyagent_ref.model import default_model_path, load_model  # noqa: E402
from tests.lora.helpers import fit, make_adapter  # noqa: E402
from tests.model.test_hf_parity import build_hf  # noqa: E402


@pytest.fixture(scope="module")
def hf():
    return transformers.AutoModelForCausalLM.from_pretrained(
        default_model_path(), dtype=torch.float32
    ).eval()


@pytest.fixture(scope="module")
def adapters(hf, tmp_path_factory):
    """Directories of five small adapters of the embedded model (ranks 2..6)."""
    root = tmp_path_factory.mktemp("adapters")
    for i in range(5):
        make_adapter(hf, root / f"a{i}", r=2 + i, targets=["q_proj", "v_proj"], seed=i)
    return root


@pytest.fixture
def ours():
    return load_model(default_model_path(), dtype="float32", progress=False)


def request(adapters, i, lora_id=None):
    return LoRARequest(f"a{i}", lora_id or i + 1, str(adapters / f"a{i}"))


def copy(adapters, tmp_path, i=0):
    dst = tmp_path / "copy"
    shutil.copytree(adapters / f"a{i}", dst)
    return dst


def edit_config(path, **changes):
    config = json.loads((path / "adapter_config.json").read_text())
    (path / "adapter_config.json").write_text(json.dumps(config | changes))


def load(ours, path, max_rank=8):
    manager = fit(ours, max_rank=max_rank)
    return load_adapter(LoRARequest("x", 1, str(path)), ours, manager.layers, max_rank)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (dict(modules_to_save=["lm_head"]), r"modules_to_save=\['lm_head'\] is not supported"),
        (dict(bias="all"), r"bias='all' is not supported"),
        (dict(peft_type="IA3"), r"peft_type='IA3' is not supported"),
        (dict(rank_pattern={"q_proj": 8}), r"rank_pattern=.* is not supported"),
        (dict(r=0), r"r must be an int >= 1"),
        (dict(lora_alpha="big"), r"lora_alpha must be a finite number"),
        (dict(use_dora="yes"), r"use_dora must be true or false"),
    ],
)
def test_configurations_that_cannot_be_served_name_the_key(ours, adapters, tmp_path, change, match):
    path = copy(adapters, tmp_path)
    edit_config(path, **change)
    with pytest.raises(ValueError, match=match):
        load(ours, path)


def test_rank_above_max_lora_rank(ours, adapters):
    with pytest.raises(ValueError, match=r"rank r=6 exceeds max_lora_rank=4"):
        load(ours, adapters / "a4", max_rank=4)


def test_missing_and_corrupt_files(ours, adapters, tmp_path):
    with pytest.raises(FileNotFoundError, match="no directory"):
        load(ours, tmp_path / "nowhere")
    path = copy(adapters, tmp_path)
    (path / "adapter_config.json").write_text("{not json")
    with pytest.raises(ValueError, match="adapter_config.json is not valid JSON"):
        load(ours, path)
    shutil.rmtree(path)
    path = copy(adapters, tmp_path)
    data = (path / "adapter_model.safetensors").read_bytes()
    (path / "adapter_model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="adapter_model.safetensors is not a readable"):
        load(ours, path)
    (path / "adapter_model.safetensors").rename(path / "adapter_model.bin")
    with pytest.raises(FileNotFoundError, match=r"found \['adapter_model.bin'\]: only safetensors"):
        load(ours, path)


def test_unknown_target_modules_are_named(ours, hf, tmp_path):
    """An adapted LM head (a model without tied embeddings) or embedding: refused, named."""
    tiny = build_hf("llama")
    tiny.save_pretrained(tmp_path / "tiny")
    tiny_ours = load_model(tmp_path / "tiny", dtype="float32", progress=False)
    make_adapter(tiny, tmp_path / "head", targets=["lm_head"])
    with pytest.raises(ValueError, match=r"target module 'lm_head' is not supported"):
        load(tiny_ours, tmp_path / "head")
    make_adapter(hf, tmp_path / "embed", targets=["embed_tokens"])
    with pytest.raises(
        ValueError,
        match=r"tensor 'base_model.model.model.embed_tokens.*"
        r"is not supported",
    ):
        load(ours, tmp_path / "embed")


def test_an_adapter_of_another_base_model_is_refused(ours, tmp_path):
    """An adapter made on a model of another hidden size: the first tensor is named."""
    make_adapter(build_hf("llama"), tmp_path / "other", targets=["q_proj"])
    with pytest.raises(ValueError, match=r"lora_A.weight has shape \(4, 64\), expected \(4, 256\)"):
        load(ours, tmp_path / "other")


def test_a_module_without_its_b_is_refused(ours, adapters, tmp_path):
    from safetensors.torch import load_file, save_file

    path = copy(adapters, tmp_path)
    tensors = load_file(path / "adapter_model.safetensors")
    name = next(n for n in tensors if n.endswith("q_proj.lora_B.weight"))
    del tensors[name]
    save_file(tensors, path / "adapter_model.safetensors")
    with pytest.raises(ValueError, match=r"has \['A'\], expected \['A', 'B'\]"):
        load(ours, path)


def test_ids_name_one_adapter(ours, adapters, tmp_path):
    """An id in use for other files, or reused later for other weights, is refused: the id
    keys the prefix cache."""
    manager = fit(ours)
    manager.add_adapter(request(adapters, 0))
    with pytest.raises(ValueError, match="lora_int_id 1 is adapter 'a0'"):
        manager.add_adapter(request(adapters, 1, lora_id=1))
    manager.remove_adapter(1)
    with pytest.raises(ValueError, match="lora_int_id 1 was adapter 'a0' with other weights"):
        manager.add_adapter(LoRARequest("a0", 1, str(adapters / "a1")))
    manager.add_adapter(request(adapters, 0))  # the same weights again: fine


def test_host_cache_evicts_the_least_recently_used_but_never_a_pinned_one(ours, adapters):
    import pyagent_ref.ops
    from pyagent_ref.lora.manager import LoRAManager

    manager = LoRAManager(ours, LoRAConfig(max_loras=1, max_cpu_loras=3), pyagent_ref.ops)
    for i in range(3):
        manager.add_adapter(request(adapters, i))
    manager.pin_adapter(1)
    manager.pin_adapter(2)
    with pytest.raises(ValueError, match="cannot pin more than max_cpu_loras - max_loras = 2"):
        manager.pin_adapter(3)
    manager.add_adapter(request(adapters, 3))  # 3 is the only unpinned one
    assert [r.lora_int_id for r in manager.list_adapters()] == [1, 2, 4]
    manager.add_adapter(request(adapters, 0))  # used again: the most recent
    manager.remove_adapter(2)  # unpinned with it
    manager.add_adapter(request(adapters, 4))
    manager.add_adapter(request(adapters, 2))  # evicts 4, the least recent unpinned
    assert [r.lora_int_id for r in manager.list_adapters()] == [1, 5, 3]
    with pytest.raises(ValueError, match="no LoRA adapter with id 9"):
        manager.pin_adapter(9)


def test_slots_are_reused_least_recently_used_first(ours, adapters):
    manager = fit(ours, max_loras=2)
    a, b, c = (request(adapters, i) for i in range(3))
    manager.prepare_step([a, None, b], [2, 1, 3])
    assert manager.state.indices.tolist() == [0, 0, -1, 1, 1, 1]
    manager.prepare_step([b], [1])
    manager.prepare_step([c, b], [1, 1])  # a's slot was used least recently
    assert manager.slots == [3, 2] and manager.state.indices.tolist() == [0, 1]
    manager.prepare_step([None], [4])
    assert manager.state.indices is None
    with pytest.raises(RuntimeError, match="more than max_loras=2"):
        manager.prepare_step([a, b, c], [1, 1, 1])


def test_an_adapter_gone_from_disk_fails_only_its_requests(ours, adapters, tmp_path):
    """Evicted from the host cache, then deleted: a step that needs it runs its tokens
    without an adapter and reports the error; the other requests keep theirs."""
    path = copy(adapters, tmp_path, 2)
    gone = LoRARequest("gone", 7, str(path))
    manager = fit(ours, max_loras=2)
    manager.add_adapter(gone)
    manager.remove_adapter(7)
    shutil.rmtree(path)
    errors = manager.prepare_step([request(adapters, 0), gone], [2, 2])
    assert list(errors) == [1] and "'gone' failed to load" in errors[1]
    assert manager.state.indices.tolist() == [0, 0, -1, -1]
