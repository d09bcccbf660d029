"""ops.lora against PEFT's own LoRA layers, numpy against torch, and the accelerator
against the reference at engine shapes (bfloat16 slots, fused q/k/v slices, in place).

PEFT computes each adapted Linear as base(x) + lora_B(lora_A(x)) * scaling: one such
layer per adapter, each token through its own, must equal shrink then expand over the
adapters stacked in slots.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from pyagent_ref.ops import lora  # noqa: E402

TOL = dict(rtol=1e-5, atol=1e-5)


def slots(seed, num_loras=3, rank=4, in_features=24, out_features=40, slices=1):
    gen = torch.Generator().manual_seed(seed)
    a = torch.randn(num_loras, slices * rank, in_features, generator=gen) / in_features**0.5
    b = torch.randn(num_loras, out_features, rank, generator=gen)
    return a, b


def test_each_token_gets_its_own_peft_layer():
    peft = pytest.importorskip("peft")
    gen = torch.Generator().manual_seed(0)
    base = torch.nn.Linear(24, 40)
    layers = []
    for i, (r, alpha, rslora) in enumerate([(2, 4, False), (4, 16, True), (4, 3, False)]):
        config = peft.LoraConfig(r=r, lora_alpha=alpha, use_rslora=rslora, init_lora_weights=False)
        layer = peft.tuners.lora.Linear(
            base,
            f"a{i}",
            r=r,
            lora_alpha=alpha,
            use_rslora=rslora,
            init_lora_weights=False,
            config=config,
        )
        layers.append(layer.eval())
    x = torch.randn(7, 24, generator=gen)
    indices = torch.tensor([0, -1, 2, 1, 1, -1, 0])
    a = torch.zeros(3, 4, 24)
    b = torch.zeros(3, 40, 4)
    scaling = torch.zeros(3)
    for i, layer in enumerate(layers):
        name = f"a{i}"
        r = layer.r[name]
        a[i, :r] = layer.lora_A[name].weight.detach()
        b[i, :, :r] = layer.lora_B[name].weight.detach()
        scaling[i] = layer.scaling[name]
    with torch.no_grad():
        out = base(x)
        lora.lora_expand(lora.lora_shrink(x, a, indices), b, indices, scaling, out)
        for t, i in enumerate(indices.tolist()):
            want = base(x[t : t + 1]) if i < 0 else layers[i](x[t : t + 1])
            torch.testing.assert_close(out[t : t + 1], want, **TOL)


def test_numpy_and_torch_agree():
    a, b = slots(1, slices=3)
    x = torch.randn(9, 24, generator=torch.Generator().manual_seed(2))
    indices = torch.tensor([2, 0, -1, 1, 1, 2, -1, 0, 2])
    scaling = torch.tensor([1.0, 0.5, 2.0])
    y_t = lora.lora_shrink(x, a, indices)
    y_n = lora.lora_shrink(x.numpy(), a.numpy(), indices.numpy())
    np.testing.assert_allclose(y_t.numpy(), y_n, rtol=1e-6, atol=1e-6)
    d_t = lora.lora_expand(y_t, b, indices, scaling, output_slices=(20, 10, 10))
    d_n = lora.lora_expand(y_n, b.numpy(), indices.numpy(), scaling.numpy(), None, (20, 10, 10))
    np.testing.assert_allclose(d_t.numpy(), d_n, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    ("dtype", "tokens"), [(torch.float32, 64), (torch.bfloat16, 300), (torch.float16, 1)]
)
def test_accel_equals_the_reference_at_engine_shapes(dtype, tokens):
    """A fused q/k/v projection (hidden 256, q 256, k and v 64), 16 slots of rank 16 in
    the model's dtype, tokens over 16 adapters and none; in place into the base output
    (the accelerator in parallel for 300 tokens)."""
    accel = pytest.importorskip("pyagent_accel.ops.lora")
    gen = torch.Generator().manual_seed(tokens)
    a = (torch.randn(16, 48, 256, generator=gen) / 16).to(dtype)
    b = torch.randn(16, 384, 16, generator=gen).to(dtype)
    x = torch.randn(tokens, 256, generator=gen).to(dtype)
    indices = torch.randint(-1, 16, (tokens,), generator=gen)
    scaling = torch.rand(16, generator=gen) * 2
    y_ref, y_acc = lora.lora_shrink(x, a, indices), accel.lora_shrink(x, a, indices)
    assert y_acc.dtype == torch.float32
    torch.testing.assert_close(y_acc, y_ref, rtol=1e-4, atol=1e-4)
    out = torch.randn(tokens, 384, generator=gen).to(dtype)
    want, got = out.clone(), out.clone()
    lora.lora_expand(y_ref, b, indices, scaling, want, (256, 64, 64))
    assert accel.lora_expand(y_ref, b, indices, scaling, got, (256, 64, 64)) is got
    tol = dict(rtol=1e-4, atol=1e-4) if dtype == torch.float32 else dict(rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(got, want, **tol)
    none = indices < 0
    assert torch.equal(got[none], out[none])  # rows without an adapter keep their bits
    strided = torch.zeros(tokens, 2 * 384, dtype=dtype)[:, ::2]  # through a copy, written back
    strided.copy_(out)
    accel.lora_expand(y_ref, b, indices, scaling, strided, (256, 64, 64))
    torch.testing.assert_close(strided, want, **tol)
    rank_major = b.transpose(1, 2).contiguous().transpose(1, 2)  # LoRALinear's layout
    assert not rank_major.is_contiguous()
    got = out.clone()
    accel.lora_expand(y_ref, rank_major, indices, scaling, got, (256, 64, 64))
    torch.testing.assert_close(got, want, **tol)
    delta = lora.lora_expand(y_ref, b, indices, scaling, None, (256, 64, 64))
    got_delta = accel.lora_expand(y_ref, rank_major, indices, scaling, None, (256, 64, 64))
    torch.testing.assert_close(got_delta, delta, rtol=1e-4, atol=1e-4)


def test_accel_refuses_device_tensors_and_names_bad_indices():
    accel = pytest.importorskip("pyagent_accel.ops.lora")
    a, _ = slots(3)
    x = torch.randn(2, 24)
    with pytest.raises(ValueError, match=r"indices\[1\] is 3, outside \[-1, 3\)"):
        accel.lora_shrink(x, a, torch.tensor([0, 3]))
    with pytest.raises(TypeError, match="lora_a must have x's dtype float32"):
        accel.lora_shrink(x, a.double(), torch.tensor([0, 1]))
    meta = torch.empty(2, 24, device="meta")
    with pytest.raises(TypeError, match="device meta"):
        accel.lora_shrink(meta, a.to("meta"), torch.tensor([0, 1]))
