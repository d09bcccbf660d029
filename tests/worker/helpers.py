"""Shared by the worker tests: a tiny random model, an engine on a saved one, a workload."""

from __future__ import annotations

import torch

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
