"""ops.moe against HF transformers' own routers and experts, numpy against torch, and the
accelerator against the reference.

The routers are the modules of transformers' modeling code with an identity weight (so
their router logits are the logits given): Mixtral's and Qwen3-MoE's softmax top-k, and
DeepSeek-V3's grouped sigmoid router with a correction bias, DeepSeek-V2's
group-limited greedy one. Logits are drawn continuous (no ties: torch.topk does not
specify how it orders ties); weights must agree within float32 rounding, ids exactly
as sets (HF's DeepSeek routers return them unsorted).
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from pyagent_ref.ops import moe  # noqa: E402

TOL = dict(rtol=2e-6, atol=1e-7)


def _identity_router(router, experts):
    with torch.no_grad():
        router.weight.copy_(torch.eye(experts))
    return router


def _sorted_by_id(weights, ids):
    order = torch.argsort(ids, dim=1)
    return torch.gather(weights, 1, order), torch.gather(ids, 1, order)


@pytest.mark.parametrize("renormalize", [True, False])
def test_topk_softmax_equals_hf_routers(renormalize):
    from transformers.models.mixtral.modeling_mixtral import MixtralTopKRouter
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeTopKRouter

    experts, k = 16, 4
    logits = torch.randn(33, experts, generator=torch.Generator().manual_seed(1)) * 3
    if renormalize:
        cfg = transformers.MixtralConfig(
            hidden_size=experts, num_local_experts=experts, num_experts_per_tok=k
        )
        router = _identity_router(MixtralTopKRouter(cfg), experts)
    else:
        cfg = transformers.Qwen3MoeConfig(
            hidden_size=experts, num_experts=experts, num_experts_per_tok=k, norm_topk_prob=False
        )
        router = _identity_router(Qwen3MoeTopKRouter(cfg), experts)
    with torch.no_grad():
        _, hf_weights, hf_ids = router(logits)
    weights, ids = moe.route_topk_softmax(logits, k, renormalize)
    assert torch.equal(ids, hf_ids)  # both sorted by descending score
    torch.testing.assert_close(weights, hf_weights, **TOL)


@pytest.mark.parametrize("renormalize", [True, False])
def test_grouped_sigmoid_with_bias_equals_deepseek_v3(renormalize):
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter

    experts, k, groups, kept = 32, 6, 8, 3
    gen = torch.Generator().manual_seed(2)
    cfg = transformers.DeepseekV3Config(
        hidden_size=experts,
        n_routed_experts=experts,
        num_experts_per_tok=k,
        n_group=groups,
        topk_group=kept,
        norm_topk_prob=renormalize,
        routed_scaling_factor=2.5,
    )
    router = _identity_router(DeepseekV3TopkRouter(cfg), experts)
    bias = torch.randn(experts, generator=gen) * 0.2
    router.e_score_correction_bias.copy_(bias)
    logits = torch.randn(41, experts, generator=gen) * 2
    with torch.no_grad():
        _, hf_weights, hf_ids = router(logits)
    weights, ids = moe.route_grouped_topk(
        logits, k, groups, kept, bias, "sigmoid", 2.5, renormalize, "top2_sum"
    )
    hf_weights, hf_ids = _sorted_by_id(hf_weights, hf_ids)
    weights, ids = _sorted_by_id(weights, ids)
    assert torch.equal(ids, hf_ids)
    torch.testing.assert_close(weights, hf_weights, **TOL)


def test_grouped_softmax_max_equals_deepseek_v2():
    from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2TopkRouter

    experts, k, groups, kept = 32, 6, 8, 3
    cfg = transformers.DeepseekV2Config(
        hidden_size=experts,
        n_routed_experts=experts,
        num_experts_per_tok=k,
        n_group=groups,
        topk_group=kept,
        topk_method="group_limited_greedy",
        routed_scaling_factor=1.5,
    )
    router = _identity_router(DeepseekV2TopkRouter(cfg), experts)
    logits = torch.randn(41, experts, generator=torch.Generator().manual_seed(3)) * 2
    with torch.no_grad():
        _, hf_weights, hf_ids = router(logits)
    weights, ids = moe.route_grouped_topk(
        logits, k, groups, kept, None, "softmax", 1.5, False, "max"
    )
    hf_weights, hf_ids = _sorted_by_id(hf_weights, hf_ids)
    weights, ids = _sorted_by_id(weights, ids)
    assert torch.equal(ids, hf_ids)
    torch.testing.assert_close(weights, hf_weights, **TOL)


def test_fused_moe_equals_hf_experts():
    from transformers.models.mixtral.modeling_mixtral import MixtralExperts

    tokens, hidden, inter, experts, k = 23, 32, 24, 6, 2
    gen = torch.Generator().manual_seed(4)
    cfg = transformers.MixtralConfig(
        hidden_size=hidden, intermediate_size=inter, num_local_experts=experts
    )
    hf = MixtralExperts(cfg)
    with torch.no_grad():
        hf.gate_up_proj.copy_(torch.randn(experts, 2 * inter, hidden, generator=gen) * 0.2)
        hf.down_proj.copy_(torch.randn(experts, hidden, inter, generator=gen) * 0.2)
    x = torch.randn(tokens, hidden, generator=gen)
    weights, ids = moe.route_topk_softmax(torch.randn(tokens, experts, generator=gen), k, True)
    with torch.no_grad():
        want = hf(x, ids, weights)
        got = moe.fused_moe(x, hf.gate_up_proj, hf.down_proj, weights, ids)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_ties_go_to_the_lower_expert_id():
    logits = np.array([[1.0, 3.0, 3.0, 0.0, 3.0]], np.float32)
    _, ids = moe.route_topk_softmax(logits, 2, True)
    assert ids.tolist() == [[1, 2]]
    # groups {0, 1}, {2, 3}, {4, 5} score alike: the lower group indices are kept
    flat = np.zeros((1, 6), np.float32)
    _, ids = moe.route_grouped_topk(flat, 3, 3, 2)
    assert ids.tolist() == [[0, 1, 2]]


def test_numpy_and_torch_agree():
    rng = np.random.default_rng(5)
    logits = rng.normal(size=(9, 12)).astype(np.float32)
    bias = rng.normal(size=12).astype(np.float32)
    for args in ((4, 4, 2, bias, "sigmoid", 2.0, True), (3, 3, 1, None, "softmax", 1.0, False)):
        w_np, i_np = moe.route_grouped_topk(logits, *args)
        t_bias = None if args[3] is None else torch.from_numpy(bias)
        w_t, i_t = moe.route_grouped_topk(torch.from_numpy(logits), *args[:3], t_bias, *args[4:])
        assert np.array_equal(i_np, i_t.numpy())
        np.testing.assert_allclose(w_np, w_t.numpy(), rtol=1e-6)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_accel_equals_the_reference(dtype):
    accel = pytest.importorskip("pyagent_accel.ops").moe
    gen = torch.Generator().manual_seed(6)
    tokens, hidden, inter, experts = 37, 40, 20, 8
    logits = torch.randn(tokens, experts, generator=gen).to(getattr(torch, dtype))
    weights, ids = accel.route_topk_softmax(logits, 3, True)
    ref_w, ref_ids = moe.route_topk_softmax(logits, 3, True)
    assert torch.equal(ids, ref_ids)
    torch.testing.assert_close(weights, ref_w, rtol=1e-6, atol=1e-7)
    x = torch.randn(tokens, hidden, generator=gen).to(logits.dtype)
    w_gate_up = (torch.randn(experts, 2 * inter, hidden, generator=gen) * 0.2).to(logits.dtype)
    w_down = (torch.randn(experts, hidden, inter, generator=gen) * 0.2).to(logits.dtype)
    got = accel.fused_moe(x, w_gate_up, w_down, weights, ids)
    want = moe.fused_moe(x, w_gate_up, w_down, weights, ids)
    assert got.dtype == want.dtype
    rounding = 1e-5 if dtype == "float32" else 1e-2  # a half result may round either way
    torch.testing.assert_close(got.float(), want.float(), rtol=rounding, atol=rounding)
