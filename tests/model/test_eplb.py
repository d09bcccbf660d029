"""Expert-parallel load balancing: the placement algorithm's properties, the load window,
and MoE layers that run their experts as placed without changing a logit."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pyagent_ref.model.eplb import (
    ExpertLoadWindow,
    ExpertPlacement,
    balanced_packing,
    rebalance_experts,
    replicate_experts,
)

loads = st.lists(st.integers(0, 50), min_size=1, max_size=12).map(np.array)


def packing_oracle(weights, packs):
    """The packing spec, written as a simulation over (total, pack) pairs."""
    per_pack = len(weights) // packs
    state = [[0.0, p, 0] for p in range(packs)]  # total, pack, items
    out = [None] * len(weights)
    for item in sorted(range(len(weights)), key=lambda i: (-weights[i], i)):
        total, pack, n = min(s for s in state if s[2] < per_pack)
        out[item] = pack
        state[pack] = [total + weights[item], pack, n + 1]
    return out


@settings(max_examples=200, deadline=None)
@given(
    st.integers(1, 4).flatmap(
        lambda m: st.tuples(st.just(m), loads.filter(lambda w: len(w) % m == 0))
    )
)
def test_balanced_packing_fills_every_pack_and_follows_the_greedy_rule(case):
    packs, weights = case
    got = balanced_packing(weights, packs)
    assert np.bincount(got, minlength=packs).tolist() == [len(weights) // packs] * packs
    assert got.tolist() == packing_oracle(weights.tolist(), packs)


@settings(max_examples=200, deadline=None)
@given(loads.filter(lambda w: len(w) <= 5), st.integers(0, 4))
def test_replication_minimises_the_largest_load_per_replica(load, extra):
    """No other way to give each expert >= 1 replica, num_replicas in all, has a smaller
    largest load / replicas (brute force over every assignment)."""
    total = len(load) + extra
    counts = replicate_experts(load, total)
    assert counts.sum() == total and counts.min() >= 1
    best = min(
        max(load / np.array(c))
        for c in itertools.product(range(1, extra + 2), repeat=len(load))
        if sum(c) == total
    )
    assert max(load / counts) == pytest.approx(best)


@st.composite
def cluster(draw):
    """(load (layers, E), P, R, G, N) with every divisibility the algorithm needs."""
    nodes = draw(st.integers(1, 3))
    ranks = nodes * draw(st.integers(1, 3))
    groups = draw(st.sampled_from([1, nodes, 2 * nodes, 3]))
    experts = groups * draw(st.integers(1, 4))
    slots = ranks * draw(st.integers(-(-experts // ranks), -(-experts // ranks) + 2))
    layers = draw(st.integers(1, 3))
    load = np.array(
        draw(st.lists(st.integers(0, 100), min_size=layers * experts, max_size=layers * experts))
    )
    return load.reshape(layers, experts), slots, ranks, groups, nodes


@settings(max_examples=150, deadline=None)
@given(cluster())
def test_every_expert_is_placed_and_every_rank_fills_its_slots(case):
    load, slots, ranks, groups, nodes = case
    placement = rebalance_experts(load, slots, ranks, groups, nodes)
    table = placement.physical_to_logical
    assert table.shape == (load.shape[0], slots)
    counts = placement.replica_counts()
    assert counts.min() >= 1 and (counts.sum(axis=1) == slots).all()  # replicas <= slots
    ranks_load = placement.rank_loads(load)
    np.testing.assert_allclose(ranks_load.sum(axis=1), load.sum(axis=1))  # no load lost
    if groups % nodes == 0:  # hierarchical: a group's experts all live on one node
        per_node, per_group = slots // nodes, load.shape[1] // groups
        for row in table:
            node_of_expert = {}
            for slot, expert in enumerate(row):
                node = slot // per_node
                assert node_of_expert.setdefault(expert // per_group, node) == node


def test_a_skewed_load_is_spread_and_reported():
    rng = np.random.default_rng(0)
    load = (1000 / np.arange(1, 65) ** 1.2)[rng.permutation(64)][None, :]  # one hot expert
    before = ExpertPlacement.identity(1, 64, 8).imbalance(load)
    after = rebalance_experts(load, 72, 8).imbalance(load)
    assert before[0] > 2.5 and after[0] < 1.1
    uniform = np.ones((2, 16))
    assert rebalance_experts(uniform, 16, 4).imbalance(uniform).tolist() == [1.0, 1.0]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((np.ones((1, 8)), 10, 4), r"num_physical_experts \(10\) must be a multiple of num_ranks"),
        ((np.ones((1, 8)), 4, 4), r"must be at least the 8 experts"),
        ((np.ones((1, 8)), 8, 4, 1, 3), r"num_ranks \(4\) must be a multiple of num_nodes \(3\)"),
        ((np.ones((1, 8)), 8, 4, 3), r"num_groups \(3\) must divide the 8 experts"),
        ((-np.ones((1, 8)), 8, 4), "finite loads >= 0"),
        ((np.ones(8), 8, 4), "must have 2 axes"),
    ],
)
def test_counts_that_do_not_divide_are_refused(args, message):
    with pytest.raises(ValueError, match=message):
        rebalance_experts(*args)


def test_identity_needs_the_ep_size_to_divide_the_experts():
    with pytest.raises(ValueError, match=r"num_ranks \(3\) must divide the 8 experts"):
        ExpertPlacement.identity(1, 8, 3)
    with pytest.raises(ValueError, match="must place each of 4 experts"):
        ExpertPlacement(np.array([[0, 1, 1, 2]]), 2, 4)


@settings(max_examples=50, deadline=None)
@given(st.integers(1, 4), st.lists(st.lists(st.integers(0, 5), max_size=6), min_size=1, max_size=9))
def test_the_window_sums_the_last_steps(window, steps):
    w = ExpertLoadWindow(num_layers=1, num_experts=6, window=window)
    for i, ids in enumerate(steps):
        if i:
            w.advance()
        w.record(0, np.array(ids, np.int64))
    want = np.zeros(6, np.int64)
    for ids in steps[-window:]:
        want += np.bincount(np.array(ids, np.int64), minlength=6)
    assert w.load()[0].tolist() == want.tolist()


# --- the MoE layer ----------------------------------------------------------------------------

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def moe_models(tmp_path_factory):
    """{name: (our model, prompt)} for a Mixtral and a DeepSeek-V3 (4 experts each)."""
    from pyagent_ref.model import load_model
    from tests.model import test_deepseek, test_moe

    out = {}
    for name, build in (("mixtral", test_moe.build_hf), ("v3", test_deepseek.build_hf)):
        path = tmp_path_factory.mktemp(name)
        build("mixtral" if name == "mixtral" else "v3").save_pretrained(path)
        out[name] = load_model(path, dtype="float32", progress=False)
    return out


@pytest.mark.parametrize("name", ["mixtral", "v3"])
def test_a_placement_changes_no_logit_and_spreads_tokens_over_replicas(
    moe_models, name, monkeypatch
):
    """Expert 0 with three replicas, the others one: the same logits, and each of
    expert 0's slots receives tokens; the window counts every routing choice."""
    from types import SimpleNamespace

    from tests.model.test_hf_parity import PROMPTS, PagedRunner

    model = moe_models[name]
    blocks = model.moe_blocks()
    want = PagedRunner(model).step({0: PROMPTS[0], 1: PROMPTS[1]})
    used = []

    def fused_moe(x, gate_up, down, weights, ids):
        used.append(ids.clone())
        return model.ops.moe.fused_moe(x, gate_up, down, weights, ids)

    moe_ops = SimpleNamespace(**vars(model.ops.moe) | {"fused_moe": fused_moe})
    for block in blocks:
        monkeypatch.setattr(block, "ops", SimpleNamespace(moe=moe_ops))
    table = np.tile(np.array([0, 1, 0, 2, 3, 0]), (len(blocks), 1))
    window = model.record_expert_load(window=4)
    model.apply_expert_placement(ExpertPlacement(table, num_ranks=3, num_experts=4))
    try:
        got = PagedRunner(model).step({0: PROMPTS[0], 1: PROMPTS[1]})
    finally:
        model.apply_expert_placement(None)
        model.record_expert_load(None)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    slots = set(torch.cat([u.reshape(-1) for u in used]).tolist())
    assert {0, 2, 5} <= slots  # expert 0's three replicas all served tokens
    load = window.load()
    tokens = len(PROMPTS[0]) + len(PROMPTS[1])
    assert load.shape == (len(blocks), 4) and load.sum() == len(blocks) * tokens * blocks[0].top_k


def test_a_placement_for_other_layers_is_refused(moe_models):
    model = moe_models["mixtral"]
    with pytest.raises(ValueError, match="placement must cover 2 MoE layers of 4 experts"):
        model.apply_expert_placement(ExpertPlacement.identity(1, 4, 2))
    with pytest.raises(ValueError, match="must place each of the 4 experts"):
        model.moe_blocks()[0].set_placement(torch.tensor([0, 1, 1, 2]))


# --- the engine -------------------------------------------------------------------------------


def _greedy_tokens(model, **engine):
    from pyagent_ref.engine.core import EngineConfig, EngineCore
    from pyagent_ref.sample.params import SamplingParams
    from pyagent_ref.sched import Request

    core = EngineCore(
        model,
        EngineConfig(block_size=4, num_kv_blocks=64, max_num_batched_tokens=8, **engine),
    )
    prompts = [[5, 17, 3, 88, 41, 9, 60, 2, 33], [8, 1, 96, 45, 45, 12, 7], [3, 3, 4]]
    requests = [
        Request(str(i), p, sampling_params=SamplingParams(temperature=0, max_tokens=6))
        for i, p in enumerate(prompts)
    ]
    for r in requests:
        core.add_request(r)
    while core.has_unfinished_requests():
        core.step()
    return [r.output_token_ids for r in requests], core


@pytest.mark.parametrize("name", ["mixtral", "v3"])
def test_the_engine_rebalances_without_changing_a_token(moe_models, name):
    model = moe_models[name]
    want, _ = _greedy_tokens(model)
    eplb = dict(num_ranks=2, num_redundant_experts=2, window_size=4, step_interval=3)
    try:
        got, core = _greedy_tokens(model, eplb=eplb)
        assert core.eplb.rebalances >= 2 and core.runner.record_graphs is False
        assert core.eplb.window.load().sum() > 0
        counts = core.eplb.placement.replica_counts()
        assert counts.shape == (len(model.moe_blocks()), 4) and (counts.sum(axis=1) == 6).all()
        assert core.eplb.imbalance().shape == (len(model.moe_blocks()),)
    finally:
        model.apply_expert_placement(None)
        model.record_expert_load(None)
    assert got == want


def test_engine_eplb_errors_name_the_value(moe_models):
    from pyagent_ref.engine.core import EngineConfig, EngineCore
    from tests.worker.helpers import tiny_model

    with pytest.raises(ValueError, match=r"num_physical_experts \(5\) must be a multiple"):
        EngineCore(
            moe_models["mixtral"], EngineConfig(eplb={"num_ranks": 2, "num_redundant_experts": 1})
        )
    with pytest.raises(ValueError, match="has no MoE layer"):
        EngineCore(tiny_model(), EngineConfig(eplb={"num_ranks": 1}))
    with pytest.raises(ValueError, match=r"eplb has unknown keys \['ranks'\]"):
        EngineConfig(eplb={"ranks": 2})
    with pytest.raises(ValueError, match="eplb.window_size must be an int >= 1"):
        EngineConfig(eplb={"num_ranks": 2, "window_size": 0})
