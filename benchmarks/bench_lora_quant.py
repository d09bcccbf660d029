"""Serving cost of LoRA adapters (part a) on the embedded model, the quantized linear
layer (part b), and the quantized checkpoints of the embedded model (part c).

    python benchmarks/bench_lora_quant.py [--quick] [--part a|b|c|all]
        [--ops auto|ref|accel] [--rank 16]

(a) A batch of 64 decoding requests on the embedded model, timed over its decode steps
only (the prompts are prefilled first, untimed): without LoRA (an engine with no
adapter slots), with LoRA enabled but no request using an adapter, and with the 64
requests spread round-robin over 1, 4 and 16 adapters (rank 16 on q/k/v/o and
gate/up/down, max_loras 16). It prints decode tokens/s of each and the ratio to no
LoRA (the target: >= 0.75 at 16 adapters). The adapters are written in PEFT's format
with random factors, so the run needs no PEFT. Median of 5 runs after a warm-up, the
cases interleaved run by run.

(b) `dequant_matmul` of Qwen3-0.6B's linear layers (hidden 1024, 16 query heads and 8 KV
heads of 128, intermediate 3072: fused qkv 1024 -> 4096, o 2048 -> 1024, fused gate/up
1024 -> 6144, down 3072 -> 1024) on one core: pyagent_accel's fused kernel on int4 codes
in groups of 128 (asymmetric), on int8 codes per channel (symmetric) and its
`dequant_matmul_fp8` on e4m3 codes per tensor with dynamic activation scales (vLLM's
fp8 checkpoints, as `tools/quantize.py --format fp8` writes them), against torch's
`x @ W.T` on the float32 and the bfloat16 weight, at batch 1 (decode: memory-bound) and
64. Each figure is the median CPU time of one call (`time.process_time`, so other load on
the machine does not count; torch and the kernel's thread pool both use one thread), and
the last line sums the four layers at batch 1 (the target: int4 >= 2x float32 torch).

(c) The embedded model in float32 and quantized by `tools/quantize.py` (compressed-tensors
int8 per channel and int4 in groups of 16, GPTQ int4 in groups of 16 by GPTQ's algorithm
with act-order, AWQ-layout int4 in groups of 16 by RTN, vLLM fp8 e4m3 per tensor with
dynamic activations): perplexity on held-out text (the
project's own sources, `tools.quantize.heldout_ids`), the bytes of the model's weights
(parameters and buffers: what stays resident besides the KV cache), decode tokens/s
through the engine at batch 1 and 16 (`--ops`; median of 3 runs, the formats interleaved),
and the share of 16 prompts whose 16 greedy tokens equal float32's.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # pyagent_ref from the checkout

from pyagent_ref.engine.core import EngineConfig, EngineCore  # noqa: E402
from pyagent_ref.lora import LoRARequest  # noqa: E402
from pyagent_ref.model import default_model_path, load_model  # noqa: E402
from pyagent_ref.sample.params import SamplingParams  # noqa: E402
from pyagent_ref.sched import Request  # noqa: E402

MODULES = {
    "self_attn": ("q_proj", "k_proj", "v_proj", "o_proj"),
    "mlp": ("gate_proj", "up_proj", "down_proj"),
}


def write_adapter(path: Path, rank: int, seed: int) -> None:
    """A PEFT-format adapter of the embedded model on every projection, random factors."""
    from safetensors.torch import save_file

    config = json.loads((default_model_path() / "config.json").read_text())
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    q = config["num_attention_heads"] * config["head_dim"]
    kv = config["num_key_value_heads"] * config["head_dim"]
    shapes = {
        "q_proj": (hidden, q),
        "k_proj": (hidden, kv),
        "v_proj": (hidden, kv),
        "o_proj": (q, hidden),
        "gate_proj": (hidden, inter),
        "up_proj": (hidden, inter),
        "down_proj": (inter, hidden),
    }
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(config["num_hidden_layers"]):
        for block, names in MODULES.items():
            for name in names:
                fan_in, fan_out = shapes[name]
                prefix = f"base_model.model.model.layers.{layer}.{block}.{name}"
                a = torch.randn(rank, fan_in, generator=gen) * fan_in**-0.5
                b = torch.randn(fan_out, rank, generator=gen) * 0.01
                tensors[f"{prefix}.lora_A.weight"] = a
                tensors[f"{prefix}.lora_B.weight"] = b
    path.mkdir(parents=True, exist_ok=True)
    save_file(tensors, path / "adapter_model.safetensors")
    targets = [n for names in MODULES.values() for n in names]
    adapter_config = dict(peft_type="LORA", r=rank, lora_alpha=2 * rank, target_modules=targets)
    (path / "adapter_config.json").write_text(json.dumps(adapter_config))


def decode_seconds(core: EngineCore, loras: list[LoRARequest | None], steps: int) -> float:
    """Seconds of `steps` decode steps of 64 requests (prefilled first, untimed)."""
    params = SamplingParams(temperature=0, max_tokens=steps + 1, ignore_eos=True)
    rng = np.random.default_rng(0)
    requests = [
        Request(
            f"r{i}",
            rng.integers(3, 4000, 12).tolist(),
            sampling_params=params,
            max_tokens=steps + 1,
            lora_request=lora,
        )
        for i, lora in enumerate(loras)
    ]
    for request in requests:
        core.add_request(request)
    while any(r.num_output_tokens == 0 for r in requests):
        core.step()
    t0 = time.perf_counter()
    for _ in range(steps):
        core.step()
    elapsed = time.perf_counter() - t0
    while core.has_unfinished_requests():
        core.step()
    core.kv.reset_prefix_cache()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few steps, one run (CI smoke)")
    parser.add_argument("--part", default="all", choices=["a", "b", "c", "all"])
    parser.add_argument("--ops", default="auto", choices=["ref", "accel", "auto"])
    parser.add_argument("--rank", type=int, default=16)
    args = parser.parse_args()
    if args.part in ("a", "all"):
        bench_lora(args)
    if args.part in ("c", "all"):
        bench_quant_formats(args)
    if args.part == "b":
        bench_quant_layers(args.quick)
    elif args.part == "all":  # in a process of its own: its thread pool of one thread
        print(flush=True)
        argv = [sys.executable, __file__, "--part", "b"] + (["--quick"] if args.quick else [])
        subprocess.run(argv, check=True, env=os.environ | {"RAYON_NUM_THREADS": "1"})


# Qwen3-0.6B: (layer, in_features, out_features)
QWEN3_LAYERS = (
    ("qkv", 1024, 4096),
    ("o", 2048, 1024),
    ("gate_up", 1024, 6144),
    ("down", 3072, 1024),
)


def cpu_ms(fn, repeats: int) -> float:
    """Median CPU milliseconds (all threads of the process) of one call of fn."""
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.process_time()
        fn()
        times.append(time.process_time() - t0)
    return statistics.median(times) * 1e3


def bench_quant_layers(quick: bool) -> None:
    """Part (b): the fused int4 / int8 / fp8 linear layer against torch's float32 and bf16."""
    os.environ.setdefault("RAYON_NUM_THREADS", "1")  # before the kernel's pool starts
    from pyagent_accel.ops import quant as accel_quant

    from pyagent_ref.ops import quant

    torch.set_num_threads(1)
    print(
        f"(b) dequant_matmul, Qwen3-0.6B layers, one core ({torch.get_num_threads()} torch "
        f"thread, RAYON_NUM_THREADS={os.environ['RAYON_NUM_THREADS']}), median CPU ms per "
        f"call, load {os.getloadavg()[0]:.2f}"
    )
    header = (
        f"{'layer':<8} {'batch':>5} {'f32 torch':>10} {'bf16 torch':>10} {'int4 accel':>10} "
        f"{'int8 accel':>10} {'fp8 accel':>10} {'f32/int4':>9} {'f32/int8':>9} {'f32/fp8':>9}"
    )
    print(header)
    print("-" * len(header))
    rng = np.random.default_rng(0)
    repeats = 5 if quick else 50
    total = {"f32": 0.0, "int4": 0.0}
    for layer, n, out in QWEN3_LAYERS:
        weight = rng.normal(0.0, n**-0.5, (out, n)).astype(np.float32)
        w32 = torch.from_numpy(weight)
        w16 = w32.to(torch.bfloat16)
        packed = {}
        for bits, group, symmetric in ((4, 128, False), (8, None, True)):
            codes, scales, zeros = quant.quantize(weight, bits, group, symmetric)
            arrays = (quant.pack_int32(codes, bits), scales, zeros)
            packed[bits] = (*(None if a is None else torch.from_numpy(a) for a in arrays), bits)
        fp8 = (*quant.quantize_fp8(w32, "e4m3", "tensor"), "e4m3", "dynamic")
        for batch in (1, 64):
            x = torch.from_numpy(rng.normal(0.0, 1.0, (batch, n)).astype(np.float32))
            x16 = x.to(torch.bfloat16)
            reps = repeats if batch == 1 else max(3, repeats // 5)
            t = {
                "f32": cpu_ms(lambda: x @ w32.T, reps),  # noqa: B023
                "bf16": cpu_ms(lambda: x16 @ w16.T, reps),  # noqa: B023
            }
            for bits in (4, 8):
                call = functools.partial(accel_quant.dequant_matmul, x, *packed[bits])
                want = quant.dequant_matmul(x, *packed[bits])
                assert torch.allclose(call(), want, rtol=1e-4, atol=1e-4), (layer, bits)
                t[f"int{bits}"] = cpu_ms(call, reps)
            call = functools.partial(accel_quant.dequant_matmul_fp8, x, *fp8)
            assert torch.allclose(call(), quant.dequant_matmul_fp8(x, *fp8), 1e-4, 1e-4), layer
            t["fp8"] = cpu_ms(call, reps)
            if batch == 1:
                total["f32"] += t["f32"]
                total["int4"] += t["int4"]
            print(
                f"{layer:<8} {batch:>5} {t['f32']:10.3f} {t['bf16']:10.3f} {t['int4']:10.3f} "
                f"{t['int8']:10.3f} {t['fp8']:10.3f} {t['f32'] / t['int4']:8.2f}x "
                f"{t['f32'] / t['int8']:8.2f}x {t['f32'] / t['fp8']:8.2f}x",
                flush=True,
            )
    ratio = total["f32"] / total["int4"]
    verdict = "met" if ratio >= 2 else "NOT met"
    print(f"target: int4 accel >= 2x float32 torch at batch 1 (4 layers): {ratio:.2f}x ({verdict})")
    print(f"load after: {os.getloadavg()[0]:.2f}")


def bench_lora(args: argparse.Namespace) -> None:
    """Part (a)."""
    steps, runs = (4, 1) if args.quick else (32, 5)
    batch = 64
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"load {os.getloadavg()[0]:.2f}, ops={args.ops}, rank {args.rank}, batch {batch}"
    )
    common = dict(
        dtype="float32", ops=args.ops, max_num_seqs=batch, num_kv_blocks=512, block_size=16
    )
    with tempfile.TemporaryDirectory() as tmp:
        adapters = []
        for i in range(16):
            write_adapter(Path(tmp) / f"a{i}", args.rank, seed=i)
            adapters.append(LoRARequest(f"a{i}", i + 1, str(Path(tmp) / f"a{i}")))
        model = lambda: load_model(default_model_path(), dtype="float32", progress=False)  # noqa: E731
        base = EngineCore(model(), EngineConfig(**common))
        lora = EngineCore(
            model(),
            EngineConfig(
                **common, enable_lora=True, max_loras=16, max_cpu_loras=16, max_lora_rank=16
            ),
        )
        cases = [
            ("no LoRA", base, [None] * batch),
            ("LoRA on, unused", lora, [None] * batch),
            *((f"{n} adapters", lora, [adapters[i % n] for i in range(batch)]) for n in (1, 4, 16)),
        ]
        for _, core, loras in cases:  # warm-up: loads the adapters, fills the slots
            decode_seconds(core, loras, 2)
        times: dict[str, list[float]] = {name: [] for name, _, _ in cases}
        for _ in range(runs):  # the cases interleaved, so that a load change hits them all
            for name, core, loras in cases:
                times[name].append(decode_seconds(core, loras, steps))
        results = {name: batch * steps / statistics.median(t) for name, t in times.items()}
        print(f"{'case':<18} {'decode tok/s':>12} {'vs no LoRA':>10}")
        for name, tps in results.items():
            print(f"{name:<18} {tps:12.1f} {tps / results['no LoRA']:10.2f}")
        ratio = results["16 adapters"] / results["no LoRA"]
        verdict = "met" if ratio >= 0.75 else "NOT met"
        print(f"target: 16 adapters >= 0.75 of no LoRA: {ratio:.2f} ({verdict})")
        print(f"load after: {os.getloadavg()[0]:.2f}")


QUANT_FORMATS = {
    "int8 (ct, channel)": dict(fmt="int8"),
    "int4 (ct, g16)": dict(fmt="int4", group_size=16),
    "gptq int4 g16 act": dict(fmt="gptq", group_size=16, method="gptq", act_order=True),
    "awq int4 g16": dict(fmt="awq", group_size=16),
    "fp8 (vllm, dynamic)": dict(fmt="fp8"),
}


def bench_quant_formats(args: argparse.Namespace) -> None:
    """Part (c)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tools/ of the checkout
    from tools.quantize import heldout_ids, perplexity, quantize_dir

    steps, runs = (4, 1) if args.quick else (32, 3)
    print(f"torch {torch.__version__}, load {os.getloadavg()[0]:.2f}, ops={args.ops}")
    greedy = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    prompts = [[(37 * i + 11 * j) % 4000 + 3 for j in range(4 + i % 5)] for i in range(16)]
    windows = heldout_ids(default_model_path())[: 1 if args.quick else 4]
    with tempfile.TemporaryDirectory() as tmp:
        dirs = {"float32": default_model_path()}
        for name, kw in QUANT_FORMATS.items():
            dirs[name] = quantize_dir(Path(tmp) / str(len(dirs)), **kw)
        from pyagent_ref.engine.llm import LLM
        from pyagent_ref.ops import load as load_ops

        rows: dict[str, dict] = {}
        cores = {}
        for name, path in dirs.items():
            model = load_model(path, dtype="float32", progress=False, ops=load_ops(args.ops))
            size = sum(
                t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers())
            )
            tokens = [
                o.outputs[0].token_ids
                for o in LLM(path, dtype="float32", ops=args.ops).generate(prompts, greedy)
            ]
            rows[name] = dict(ppl=perplexity(model, windows), mib=size / 2**20, tokens=tokens)
            config = EngineConfig(
                dtype="float32", ops=args.ops, max_num_seqs=16, num_kv_blocks=256, block_size=16
            )
            cores[name] = EngineCore(model, config)
        for batch in (1, 16):
            times: dict[str, list[float]] = {name: [] for name in dirs}
            for core in cores.values():
                decode_seconds(core, [None] * batch, 2)  # warm-up
            for _ in range(runs):
                for name, core in cores.items():
                    times[name].append(decode_seconds(core, [None] * batch, steps))
            for name in dirs:
                rows[name][f"tps{batch}"] = batch * steps / statistics.median(times[name])
        base = rows["float32"]
        print(
            f"{'format':<20} {'perplexity':>10} {'vs f32':>7} {'weights MiB':>11} "
            f"{'tok/s b1':>9} {'tok/s b16':>9} {'greedy = f32':>12}"
        )
        for name, r in rows.items():
            same = sum(a == b for a, b in zip(r["tokens"], base["tokens"], strict=True))
            print(
                f"{name:<20} {r['ppl']:10.2f} {r['ppl'] / base['ppl']:7.4f} {r['mib']:11.2f} "
                f"{r['tps1']:9.1f} {r['tps16']:9.1f} {same:>9}/{len(prompts)}"
            )
        print(f"load after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
