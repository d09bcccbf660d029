"""Shared by the worker and engine tests: a tiny random model, an engine on a saved one,
workloads (fixed, and random ones for hypothesis)."""

from __future__ import annotations

import torch
from hypothesis import assume, currently_in_test_context
from hypothesis import strategies as st

from pyagent_ref.engine.core import EngineConfig, EngineCore
from pyagent_ref.model import load_model
from pyagent_ref.model.config import ModelConfig
from pyagent_ref.model.llama import LlamaForCausalLM
from pyagent_ref.sample.params import SamplingParams
from pyagent_ref.sched import Request

PROMPTS = [
    [5, 17, 3, 88, 41, 9, 60, 2, 33, 71, 14],
    [8, 1, 96, 45, 45, 12, 7],
    [5, 17, 3, 88, 41, 9, 1],
    [30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48],
    [2],
]


def requests():
    out = []
    for i, p in enumerate(PROMPTS):
        temperature = 0.8 if i % 2 else 0.0  # sampled and greedy requests side by side
        params = SamplingParams(temperature=temperature, max_tokens=12)
        out.append(Request(str(i), p, sampling_params=params, seed=100 + i, max_tokens=12))
    return out


def generate(core):
    reqs = requests()
    for r in reqs:
        core.add_request(r)
    while core.has_unfinished_requests():
        core.step()
    return [r.output_token_ids for r in reqs]


def make_engine(path, device="cpu", **overrides):
    config = dict(
        block_size=4, num_kv_blocks=64, max_num_batched_tokens=16, max_num_seqs=8, ops="ref"
    )
    model = load_model(path, device=device, progress=False)
    return EngineCore(model, EngineConfig(device=device, **(config | overrides)))


def tiny_model(**overrides):
    fields = dict(
        architecture="LlamaForCausalLM",
        vocab_size=50,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(ModelConfig(**(fields | overrides))).eval()


# (prompt over the tiny model's 50 ids, max_tokens, sampled?) per request
WORKLOADS = st.lists(
    st.tuples(
        st.lists(st.integers(0, 49), min_size=1, max_size=20),
        st.integers(1, 10),
        st.booleans(),
    ),
    min_size=1,
    max_size=6,
)
# engine settings that make random workloads chunk prompts, preempt and hit the prefix cache
ENGINE_SETTINGS = dict(
    block_size=st.sampled_from([2, 4, 8]),
    num_blocks=st.integers(12, 40),
    budget=st.integers(8, 32),
    caching=st.booleans(),
)


def run_workload(model, workload, block_size, num_blocks, budget, caching, **config):
    """Every request of a `WORKLOADS` example through an engine with `ENGINE_SETTINGS`
    (sampled requests at temperature 0.9, top_p 0.95, seeded by their index); their tokens."""
    core = EngineCore(
        model,
        EngineConfig(
            block_size=block_size,
            num_kv_blocks=num_blocks,
            max_num_batched_tokens=budget,
            max_num_seqs=4,
            enable_prefix_caching=caching,
            **config,
        ),
    )
    # few blocks lower max_model_len: a request that does not fit is refused, not run
    if currently_in_test_context():  # a drawn workload
        assume(all(len(prompt) + n <= core.max_model_len for prompt, n, _ in workload))
    reqs = []
    for i, (prompt, n, sample) in enumerate(workload):
        params = SamplingParams(temperature=0.9 if sample else 0.0, top_p=0.95, max_tokens=n)
        reqs.append(Request(str(i), prompt, sampling_params=params, seed=i, max_tokens=n))
        core.add_request(reqs[-1])
    while core.has_unfinished_requests():
        core.step()
    return [r.output_token_ids for r in reqs]
