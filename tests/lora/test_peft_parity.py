"""Our forward with LoRA adapters against PEFT's, for every family.

Each case makes a random adapter with PEFT on a tiny random HF model (the families of
`tests/model/test_hf_parity.py`, Qwen2-MoE's attention and shared expert) or on the
embedded model, loads it into our model's slots and compares logits with the PEFT
model's and with the merged model's (`merge_and_unload`), within TOL (float32). The
variants cover ranks 2-8 below the slots' rank 8, rsLoRA and DoRA. A batch that mixes
four adapters and rows without one equals each request run alone.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("peft")

from pyagent_ref.lora import LoRARequest  # noqa: E402
from pyagent_ref.model import default_model_path, load_model  # noqa: E402
from pyagent_ref.ops import load as load_ops  # noqa: E402
from tests.lora.helpers import LLAMA_TARGETS, TARGETS, fit, make_adapter, peft_logits  # noqa: E402
from tests.model import test_moe  # noqa: E402
from tests.model.test_hf_parity import DENSE, FAMILIES, OWN_KEYS, PagedRunner, build_hf  # noqa: E402

TOL = dict(rtol=1e-4, atol=1e-4)
# no pad token id (2 is the embedded model's pad): HF would mask it in generate
PROMPT = [5, 17, 3, 88, 41, 9, 60, 12, 33, 71, 14]
VARIANTS = {
    "r2": dict(r=2, alpha=16),
    "rslora-r4": dict(r=4, alpha=4, use_rslora=True),
    "dora-r8": dict(r=8, alpha=8, use_dora=True),
}
ALL = sorted(FAMILIES | DENSE | OWN_KEYS) + ["qwen2-moe"]
# each family with one variant, in turn
CASES = [(family, list(VARIANTS)[i % len(VARIANTS)]) for i, family in enumerate(ALL)]


def _hf(family):
    return test_moe.build_hf(family) if family in test_moe.FAMILIES else build_hf(family)


def _ours(hf, tmp_path, ops="ref"):
    hf.save_pretrained(tmp_path / "model")
    return load_model(tmp_path / "model", dtype="float32", progress=False, ops=load_ops(ops))


def _check(ours, peft_model, adapter_dir, manager=None):
    """Our logits with the adapter equal PEFT's and the merged model's; without it (an
    empty step state), the base model's."""
    base_logits = peft_logits(peft_model, PROMPT, adapter=False)
    manager = manager or fit(ours)
    request = LoRARequest("a", 1, str(adapter_dir))
    manager.add_adapter(request)
    manager.prepare_step([request], [len(PROMPT)])
    got = PagedRunner(ours).step({0: PROMPT})
    torch.testing.assert_close(got, peft_logits(peft_model, PROMPT), **TOL)
    with torch.no_grad():
        merged = peft_model.merge_and_unload()(input_ids=torch.tensor([PROMPT])).logits[0]
    torch.testing.assert_close(got, merged.float(), **TOL)
    base = PagedRunner(ours)
    manager.prepare_step([None], [len(PROMPT)])
    assert manager.state.indices is None
    torch.testing.assert_close(base.step({0: PROMPT}), base_logits, **TOL)


@pytest.mark.parametrize(("family", "variant"), CASES, ids=[f"{f}-{v}" for f, v in CASES])
def test_logits_equal_peft_and_merged(family, variant, tmp_path):
    hf = _hf(family)
    targets = TARGETS.get(family, LLAMA_TARGETS)
    peft_model = make_adapter(hf, tmp_path / "adapter", targets=targets, **VARIANTS[variant])
    _check(_ours(hf, tmp_path), peft_model, tmp_path / "adapter")


@pytest.fixture(scope="module")
def embedded():
    """The embedded model in float32: HF's and ours."""
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        default_model_path(), dtype=torch.float32
    ).eval()
    return hf


@pytest.mark.parametrize("ops_name", ["ref", "accel"])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_embedded_model_equals_peft(embedded, variant, ops_name, tmp_path):
    if ops_name == "accel":
        pytest.importorskip("pyagent_accel.ops.lora")
    peft_model = make_adapter(embedded, tmp_path / "adapter", **VARIANTS[variant])
    ops = load_ops(ops_name)
    ours = load_model(default_model_path(), dtype="float32", progress=False, ops=ops)
    _check(ours, peft_model, tmp_path / "adapter", fit(ours, ops=ops))


def test_a_batch_mixing_adapters_equals_each_request_alone(embedded, tmp_path):
    """Four adapters (ranks 2, 4, 8 and a DoRA one, two targeting only attention) and two
    rows without one in one prefill batch, then one decode step each: every request's
    logits equal its own run alone and the PEFT model's."""
    specs = [
        dict(r=2, alpha=16),
        dict(r=4, alpha=4, use_rslora=True, targets=["q_proj", "v_proj"]),
        dict(r=8, alpha=8, use_dora=True),
        dict(r=3, alpha=6, targets=["o_proj", "down_proj"], seed=3),
    ]
    peft_models, requests = [], []
    for i, spec in enumerate(specs):
        path = tmp_path / f"adapter{i}"
        peft_models.append(make_adapter(embedded, path, **({"seed": i} | spec)))
        requests.append(LoRARequest(f"a{i}", i + 1, str(path)))
    ours = load_model(default_model_path(), dtype="float32", progress=False)
    manager = fit(ours, max_loras=4)
    prompts = [PROMPT[: 4 + i] for i in range(6)]
    lora_of = [requests[0], None, requests[1], requests[2], None, requests[3]]
    model_of = [peft_models[0], None, peft_models[1], peft_models[2], None, peft_models[3]]

    def run(indices):
        runner = PagedRunner(ours)
        manager.prepare_step([lora_of[i] for i in indices], [len(prompts[i]) for i in indices])
        first = runner.step({i: prompts[i] for i in indices})
        manager.prepare_step([lora_of[i] for i in indices], [1] * len(indices))
        second = runner.step({i: [7] for i in indices})
        bounds = torch.tensor([0] + [len(prompts[i]) for i in indices]).cumsum(0)
        return {i: (first[bounds[k] : bounds[k + 1]], second[k]) for k, i in enumerate(indices)}

    together = run(list(range(6)))
    for i in range(6):
        alone = run([i])[i]
        torch.testing.assert_close(together[i][0], alone[0], **TOL)
        torch.testing.assert_close(together[i][1], alone[1], **TOL)
        hf = model_of[i] or peft_models[0]
        want = peft_logits(hf, prompts[i] + [7], adapter=model_of[i] is not None)
        torch.testing.assert_close(together[i][0], want[:-1], **TOL)
        torch.testing.assert_close(together[i][1], want[-1], **TOL)
