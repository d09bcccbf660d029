"""Paged attention against a dense masked attention over the same keys and values."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pyagent_ref.ops import attention, block_table

torch = pytest.importorskip("torch")

BLOCK = 4


def build(seq_lens, q_lens, num_heads=4, num_kv_heads=2, head_size=8, seed=0, dtype=torch.float32):
    """Random per-request K/V written into a shuffled paged cache, plus queries."""
    gen = torch.Generator().manual_seed(seed)
    max_blocks = max(-(-s // BLOCK) for s in seq_lens)
    num_blocks = 1 + len(seq_lens) * max_blocks
    perm = torch.randperm(num_blocks - 1, generator=gen) + 1
    table = perm[: len(seq_lens) * max_blocks].reshape(len(seq_lens), max_blocks)
    k_cache = torch.zeros(num_blocks, BLOCK, num_kv_heads, head_size, dtype=dtype)
    v_cache = torch.zeros_like(k_cache)
    keys, values = [], []
    for r, s in enumerate(seq_lens):
        k = torch.randn(s, num_kv_heads, head_size, generator=gen).to(dtype)
        v = torch.randn(s, num_kv_heads, head_size, generator=gen).to(dtype)
        slots = block_table.compute_slot_mapping(
            table[r : r + 1], torch.tensor([0, s]), torch.arange(s), BLOCK
        )
        attention.reshape_and_cache(k, v, k_cache, v_cache, slots)
        keys.append(k)
        values.append(v)
    qsl = torch.tensor([0, *np.cumsum(q_lens).tolist()])
    q = torch.randn(int(qsl[-1]), num_heads, head_size, generator=gen).to(dtype)
    return q, k_cache, v_cache, table, qsl, torch.tensor(seq_lens), keys, values


def dense(q, k, v, q_len, window=None, soft_cap=None, slopes=None, mask=None):
    """Plain attention over one sequence, written independently of the op."""
    s, kvh, d = k.shape
    h = q.shape[1]
    k = k.float().repeat_interleave(h // kvh, dim=1)
    v = v.float().repeat_interleave(h // kvh, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.float(), k) / math.sqrt(d)
    qp = torch.arange(s - q_len, s)[:, None]
    kp = torch.arange(s)[None, :]
    if slopes is not None:
        scores = scores + slopes[:, None, None] * (kp - qp)
    if soft_cap is not None:
        scores = soft_cap * torch.tanh(scores / soft_cap)
    ok = kp <= qp
    if window is not None:
        ok &= kp > qp - window
    if mask is not None:
        ok &= mask
    scores = scores.masked_fill(~ok, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)


CASES = {
    "prefill+decode, GQA": dict(seq_lens=[7, 5, 9], q_lens=[7, 1, 3]),
    "MQA": dict(seq_lens=[6, 10], q_lens=[2, 10], num_kv_heads=1),
    "MHA": dict(seq_lens=[3], q_lens=[3], num_kv_heads=4),
}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize(
    "extra",
    [{}, {"sliding_window": 3}, {"soft_cap": 2.0}, {"alibi": True}],
    ids=["plain", "window", "softcap", "alibi"],
)
def test_paged_matches_dense(case, extra):
    kwargs = {k: v for k, v in CASES[case].items() if k not in ("seq_lens", "q_lens")}
    q, kc, vc, table, qsl, lens, keys, values = build(
        CASES[case]["seq_lens"], CASES[case]["q_lens"], **kwargs
    )
    slopes = torch.tensor([0.5, 0.25, 0.125, 0.0625]) if extra.get("alibi") else None
    out = attention.paged_attention(
        q,
        kc,
        vc,
        table,
        qsl,
        lens,
        q.shape[-1] ** -0.5,
        sliding_window=extra.get("sliding_window"),
        soft_cap=extra.get("soft_cap"),
        alibi_slopes=slopes,
    )
    for r in range(len(lens)):
        a, b = int(qsl[r]), int(qsl[r + 1])
        expected = dense(
            q[a:b],
            keys[r],
            values[r],
            b - a,
            extra.get("sliding_window"),
            extra.get("soft_cap"),
            slopes,
        )
        torch.testing.assert_close(out[a:b], expected, rtol=1e-5, atol=1e-5)


def test_custom_mask_restricts_a_tree_of_drafts():
    q, kc, vc, table, qsl, lens, keys, values = build([6], [3])
    # drafts at flattened positions 3, 4, 5: 4 and 5 are siblings, both children of 3
    mask = torch.ones(3, 6, dtype=torch.bool)
    mask[2, 4] = False
    out = attention.paged_attention(q, kc, vc, table, qsl, lens, 8**-0.5, custom_masks=[mask])
    torch.testing.assert_close(
        out, dense(q, keys[0], values[0], 3, mask=mask), rtol=1e-5, atol=1e-5
    )


def test_padding_tokens_get_zeros_and_numpy_agrees():
    q, kc, vc, table, qsl, lens, *_ = build([5], [2])
    q = torch.cat([q, torch.randn(2, *q.shape[1:])])  # two padding tokens
    out = attention.paged_attention(q, kc, vc, table, qsl, lens, 0.3)
    assert torch.all(out[2:] == 0)
    out_np = attention.paged_attention(
        q.numpy(), kc.numpy(), vc.numpy(), table.numpy(), qsl.numpy(), lens.numpy(), 0.3
    )
    np.testing.assert_allclose(out_np, out.numpy(), rtol=1e-5, atol=1e-6)


def test_bfloat16_is_computed_in_float32():
    q, kc, vc, table, qsl, lens, keys, values = build([9], [9], dtype=torch.bfloat16)
    out = attention.paged_attention(q, kc, vc, table, qsl, lens, 8**-0.5)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), dense(q, keys[0], values[0], 9), rtol=2e-2, atol=2e-2)


def test_reshape_and_cache_skips_padding_slots():
    kc = torch.zeros(2, BLOCK, 1, 2)
    vc = torch.zeros_like(kc)
    k = torch.tensor([[[1.0, 1.0]], [[2.0, 2.0]]])
    attention.reshape_and_cache(k, -k, kc, vc, torch.tensor([5, -1]))
    assert kc[1, 1, 0].tolist() == [1.0, 1.0] and vc[1, 1, 0].tolist() == [-1.0, -1.0]
    assert int((kc != 0).sum()) == 2


def test_reshape_and_cache_errors():
    kc = torch.zeros(2, BLOCK, 1, 2)
    k = torch.zeros(1, 1, 2)
    with pytest.raises(ValueError, match="slot_mapping holds 8"):
        attention.reshape_and_cache(k, k, kc, kc.clone(), torch.tensor([8]))
    with pytest.raises(ValueError, match="contiguous"):
        attention.reshape_and_cache(k, k, kc.transpose(0, 1), kc.transpose(0, 1), torch.tensor([0]))
    with pytest.raises(TypeError, match="slot_mapping"):
        attention.reshape_and_cache(k, k, kc, kc.clone(), torch.tensor([0.0]))


def test_paged_attention_errors():
    q, kc, vc, table, qsl, lens, *_ = build([5], [2])
    with pytest.raises(ValueError, match="multiple"):
        attention.paged_attention(q[:, :3], kc, vc, table, qsl, lens, 1.0)
    with pytest.raises(ValueError, match="seq_len 9"):
        attention.paged_attention(q, kc, vc, table, qsl, torch.tensor([9]), 1.0)


@pytest.mark.parametrize(
    "slots",
    [[5, -1, 9, -1], [-1, -1, 3], [-1, -1], [], [0, 7, 2]],
    ids=["mixed", "padding first", "all padding", "empty", "no padding"],
)
@pytest.mark.parametrize("array", ["torch", "numpy"])
def test_reshape_and_cache_graph_safe_path_writes_what_the_eager_path_writes(
    monkeypatch, slots, array
):
    """Under a graph capture or torch.compile the op cannot drop padding by boolean
    indexing; its shape-static path must leave both caches exactly as the eager one."""
    gen = torch.Generator().manual_seed(len(slots))
    kc, vc = (torch.randn(3, BLOCK, 2, 4, generator=gen) for _ in range(2))
    k, v = (torch.randn(len(slots), 2, 4, generator=gen) for _ in range(2))
    sm = torch.tensor(slots, dtype=torch.int64)
    if array == "numpy":
        kc, vc, k, v, sm = (x.numpy() for x in (kc, vc, k, v, sm))
    copy = (lambda x: x.clone()) if array == "torch" else (lambda x: x.copy())
    eager = copy(kc), copy(vc)
    attention.reshape_and_cache(k, v, *eager, sm)
    monkeypatch.setattr(attention, "can_read_values", lambda x: False)
    static = copy(kc), copy(vc)
    attention.reshape_and_cache(k, v, *static, sm)
    for a, b in zip(eager, static, strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_paged_decode_attention_equals_paged_attention_and_zeros_padding():
    q, kc, vc, table, _, lens, keys, values = build([7, 1, 9], [1, 1, 1])
    pad = torch.cat([q[:1], q[1:2], torch.randn(1, *q.shape[1:]), q[2:]])
    pad_table = torch.cat([table[:2], table[:1], table[2:]])
    pad_lens = torch.tensor([7, 1, 0, 9])
    out = attention.paged_decode_attention(pad, kc, vc, pad_table, pad_lens, 0.3, soft_cap=4.0)
    want = attention.paged_attention(
        q, kc, vc, table, torch.tensor([0, 1, 2, 3]), lens, 0.3, soft_cap=4.0
    )
    torch.testing.assert_close(out[[0, 1, 3]], want, rtol=1e-6, atol=1e-6)
    assert torch.all(out[2] == 0)
    with pytest.raises(ValueError, match=r"seq_lens\[3\] = 13 must be in \[0, 12\]"):
        attention.paged_decode_attention(pad, kc, vc, pad_table, torch.tensor([7, 1, 0, 13]), 0.3)
    with pytest.raises(TypeError, match="seq_lens must be integers"):
        attention.paged_decode_attention(pad, kc, vc, pad_table, pad_lens.float(), 0.3)


# --- MLA: the latent cache --------------------------------------------------------------------


def test_concat_and_cache_mla_writes_the_latent_and_skips_padding():
    cache = torch.zeros(2, BLOCK, 5)
    kv_c = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    k_pe = torch.tensor([[-1.0, -2.0], [-3.0, -4.0]])
    attention.concat_and_cache_mla(kv_c, k_pe, cache, torch.tensor([5, -1]))
    assert cache[1, 1].tolist() == [1.0, 2.0, 3.0, -1.0, -2.0]
    assert int((cache != 0).sum()) == 5


def test_concat_and_cache_mla_errors():
    cache = torch.zeros(2, BLOCK, 5)
    kv_c, k_pe = torch.zeros(1, 3), torch.zeros(1, 2)
    with pytest.raises(ValueError, match="slot_mapping holds 8"):
        attention.concat_and_cache_mla(kv_c, k_pe, cache, torch.tensor([8]))
    with pytest.raises(ValueError, match="must add up to the cache's 5"):
        attention.concat_and_cache_mla(kv_c, torch.zeros(1, 3), cache, torch.tensor([0]))
    with pytest.raises(ValueError, match="k_pe must have shape"):
        attention.concat_and_cache_mla(kv_c, torch.zeros(2, 2), cache, torch.tensor([0]))
    with pytest.raises(ValueError, match="kv_cache must have shape"):
        attention.concat_and_cache_mla(kv_c, k_pe, cache[None], torch.tensor([0]))
    with pytest.raises(ValueError, match="contiguous"):
        attention.concat_and_cache_mla(kv_c, k_pe, cache.transpose(0, 1), torch.tensor([0]))
    with pytest.raises(TypeError, match="slot_mapping"):
        attention.concat_and_cache_mla(kv_c, k_pe, cache, torch.tensor([0.0]))


@pytest.mark.parametrize("slots", [[5, -1, 9, -1], [-1, -1, 3], [-1, -1], []])
def test_concat_and_cache_mla_graph_safe_path_writes_what_the_eager_path_writes(monkeypatch, slots):
    gen = torch.Generator().manual_seed(len(slots))
    cache = torch.randn(3, BLOCK, 6, generator=gen)
    kv_c, k_pe = torch.randn(len(slots), 4, generator=gen), torch.randn(len(slots), 2)
    sm = torch.tensor(slots, dtype=torch.int64)
    eager = cache.clone()
    attention.concat_and_cache_mla(kv_c, k_pe, eager, sm)
    monkeypatch.setattr(attention, "can_read_values", lambda x: False)
    static = cache.clone()
    attention.concat_and_cache_mla(kv_c, k_pe, static, sm)
    assert torch.equal(eager, static)


def test_attention_over_the_latent_cache_is_mla_with_absorbed_weights():
    """The algebra the MLA model relies on: per head h, q_nope . (W_uk[h] c_j) + q_pe . k_pe_j
    = (W_uk[h]^T q_nope, q_pe) . (c_j, k_pe_j), and sum_j w_j W_uv[h] c_j = W_uv[h]
    sum_j w_j c_j. So `paged_attention` over the latent cache (one KV head, values = the
    first kv_lora_rank features of the keys) then W_uv gives the attention of the
    expanded per-head keys and values."""
    gen = torch.Generator().manual_seed(3)
    heads, rank, rope, nope, v_dim, seq = 3, 6, 4, 5, 7, 9
    c = torch.randn(seq, rank, generator=gen, dtype=torch.float64)
    k_pe = torch.randn(seq, rope, generator=gen, dtype=torch.float64)
    w_uk = torch.randn(heads, nope, rank, generator=gen, dtype=torch.float64)
    w_uv = torch.randn(heads, v_dim, rank, generator=gen, dtype=torch.float64)
    q_nope = torch.randn(3, heads, nope, generator=gen, dtype=torch.float64)
    q_pe = torch.randn(3, heads, rope, generator=gen, dtype=torch.float64)
    cache = torch.zeros(3, BLOCK, rank + rope, dtype=torch.float64)
    table = torch.tensor([[2, 0, 1]])
    slots = block_table.compute_slot_mapping(
        table, torch.tensor([0, seq]), torch.arange(seq), BLOCK
    )
    attention.concat_and_cache_mla(c, k_pe, cache, slots)
    q_abs = torch.cat([torch.einsum("thn,hnr->thr", q_nope, w_uk), q_pe], dim=-1)
    latent = cache[:, :, None, :]
    qsl, lens = torch.tensor([0, 3]), torch.tensor([seq])
    out = attention.paged_attention(q_abs, latent, latent, table, qsl, lens, 0.3)
    absorbed = torch.einsum("thr,hvr->thv", out[..., :rank], w_uv)
    keys = torch.cat(
        [torch.einsum("hnr,sr->shn", w_uk, c), k_pe[:, None].expand(-1, heads, -1)], -1
    )
    values = torch.einsum("hvr,sr->shv", w_uv, c)
    scores = torch.einsum("thd,shd->hts", torch.cat([q_nope, q_pe], -1), keys) * 0.3
    causal = torch.arange(seq)[None, :] <= torch.arange(seq - 3, seq)[:, None]
    weights = scores.masked_fill(~causal, float("-inf")).softmax(-1)
    naive = torch.einsum("hts,shv->thv", weights, values)
    torch.testing.assert_close(absorbed, naive, rtol=1e-10, atol=1e-10)
