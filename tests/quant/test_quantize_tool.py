"""tools/quantize.py: GPTQ's algorithm against round-to-nearest on a layer's calibration
activations, the quality of the quantized default model (perplexity on held-out text,
greedy generation through the engine), and the command line."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from pyagent_ref.engine.llm import LLM  # noqa: E402
from pyagent_ref.model import default_model_path, load_model  # noqa: E402
from pyagent_ref.ops import quant as quant_ops  # noqa: E402
from pyagent_ref.sample.params import SamplingParams  # noqa: E402
from tools.quantize import gptq_quantize, heldout_ids, main, perplexity, quantize_dir  # noqa: E402


def _layer(seed: int, out_features: int = 48, in_features: int = 64, tokens: int = 512):
    """A weight and activations X whose features are correlated and of unequal scale
    (as a transformer's are): where GPTQ's error feedback has something to gain."""
    g = torch.Generator().manual_seed(seed)
    mix = torch.randn(in_features, in_features, generator=g) / in_features**0.5
    scale = torch.exp(torch.randn(in_features, generator=g))
    x = (
        torch.randn(tokens, in_features, generator=g) @ mix
        + 0.3 * torch.randn(tokens, in_features, generator=g)
    ) * scale
    w = torch.randn(out_features, in_features, generator=g)
    return w, x.double()


def _error(x, w, codes, scales, zeros, g_idx=None):
    deq = quant_ops.dequantize(codes, scales.double(), zeros)
    return float(torch.linalg.norm(x @ w.double().T - x @ deq.T))


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize(
    "bits,group_size,symmetric,act_order",
    [(4, None, True, False), (4, 16, True, False), (4, 16, False, True), (8, None, True, False)],
)
def test_gptq_reconstructs_the_layer_better_than_rtn(seed, bits, group_size, symmetric, act_order):
    """||X W^T - X Q^T|| is smaller with GPTQ's codes than with RTN's (by a margin)."""
    w, x = _layer(seed)
    hessian = 2 * x.T @ x / x.shape[0]
    codes, scales, zeros, g_idx = gptq_quantize(
        w, hessian, bits, group_size, symmetric, act_order=act_order
    )
    if act_order:  # dequantize by g_idx: scales[:, g_idx[i]] for column i
        deq = (
            codes.double() - (0 if zeros is None else zeros.double()[:, g_idx])
        ) * scales.double()[:, g_idx]
        gptq_err = float(torch.linalg.norm(x @ w.double().T - x @ deq.T))
    else:
        assert g_idx is None
        gptq_err = _error(x, w, codes, scales, zeros)
    rtn_err = _error(x, w, *quant_ops.quantize(w, bits, group_size, symmetric))
    assert gptq_err < 0.9 * rtn_err, (gptq_err, rtn_err)


def test_gptq_with_an_identity_hessian_is_rtn():
    """With uncorrelated inputs of equal scale no column's error can be compensated by
    another's: GPTQ's codes are exactly round-to-nearest's."""
    w, _ = _layer(0)
    for group_size in (None, 16):
        codes, scales, zeros, _ = gptq_quantize(w, torch.eye(64), 4, group_size, False, damp=0.0)
        rtn = quant_ops.quantize(w.double(), 4, group_size, False)
        assert torch.equal(codes, rtn[0])
        torch.testing.assert_close(scales, rtn[1].float())
        assert torch.equal(zeros, rtn[2])


@pytest.fixture(scope="module")
def int8_dir(tmp_path_factory):
    return quantize_dir(tmp_path_factory.mktemp("q") / "int8", "int8")


def test_int8_perplexity_within_one_percent_of_float32(int8_dir):
    windows = heldout_ids(default_model_path())[:2]
    base = perplexity(load_model(default_model_path(), dtype="float32", progress=False), windows)
    quant = perplexity(load_model(int8_dir, dtype="float32", progress=False), windows)
    assert abs(quant / base - 1) < 0.01, (quant, base)


PROMPTS = [[(37 * i + 11 * j) % 4000 + 3 for j in range(4 + i % 5)] for i in range(16)]


def test_int8_greedy_generation_through_the_engine(int8_dir):
    """The int8 checkpoint serves through LLM; its greedy tokens equal float32's on most
    prompts (14 of 16 at least; all 16, 16 new tokens each, when this was written)."""
    greedy = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    engine = dict(dtype="float32", block_size=4, num_kv_blocks=128)
    want = [o.outputs[0].token_ids for o in LLM(**engine).generate(PROMPTS, greedy)]
    got = [o.outputs[0].token_ids for o in LLM(int8_dir, **engine).generate(PROMPTS, greedy)]
    same = sum(a == b for a, b in zip(got, want, strict=True))
    print(f"int8 greedy equal to float32 on {same} of {len(PROMPTS)} prompts")
    assert same >= 14, (got, want)


def test_command_line_writes_a_loadable_checkpoint(tmp_path, capsys):
    main(["--format", "awq", "--group-size", "16", str(tmp_path / "awq")])
    assert "wrote" in capsys.readouterr().out
    qc = json.loads((tmp_path / "awq" / "config.json").read_text())["quantization_config"]
    assert qc == dict(quant_method="awq", bits=4, group_size=16, zero_point=True, version="gemm")
    model = load_model(tmp_path / "awq", progress=False)
    assert model.layers[0].mlp.down_proj.scales0.shape == (256, 688 // 16)


@pytest.mark.parametrize(
    "kw,message",
    [
        (dict(fmt="nf4"), "format must be one of"),
        (dict(fmt="awq", bits=8), "bits 8 is not available for format 'awq'"),
        (dict(fmt="int4", act_order=True), "act_order needs method 'gptq'"),
        (dict(fmt="int4", group_size=128), "divide in_features 688, got 128"),
    ],
)
def test_tool_errors_name_the_value(tmp_path, kw, message):
    with pytest.raises(ValueError, match=message):
        quantize_dir(tmp_path / "out", **kw)
