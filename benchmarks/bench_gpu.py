"""GPU throughput: our engine vs HF transformers on a Qwen3-0.6B-shaped random model.

    python benchmarks/bench_gpu.py [--device cuda|cpu] [--engines LIST] [--bandwidth-gbs 3350]

The model is built here from a transformers `Qwen3Config` with random weights (no
download): 28 layers, hidden 1024, 16 query / 8 KV heads of 128, vocabulary 151,936, tied
embeddings, bfloat16, with a synthetic byte-level BPE tokenizer of the same vocabulary.
The workload: 256 requests, prompts of 32-512 random tokens, outputs of 64-256 tokens,
ignore_eos, greedy. It prints output tokens/s of
- ours: graph_mode "auto" (CUDA graphs of decode steps), "eager", and compile=True;
- HF `generate` with static batches of 64 (each batch decodes to its longest request);
- HF's continuous batching (`generate_batch`'s manager), where transformers has it;
then where a step of ours goes (schedule, host preparation and copies, forward, sampling,
output processing; a separate run whose timers synchronise the device after each part),
the greedy tokens of ours and HF `generate` for two requests, and each engine's share of
the memory-bandwidth floor: every decode step reads the weights once and each running
request's KV once, at `--bandwidth-gbs` (default 3350 GB/s, an H100 SXM's HBM3: an
assumption, not a measurement). The floor takes ceil(output tokens / max_num_seqs) steps.

`--device cpu` (the default without CUDA) runs a scaled-down shape (2 layers, hidden 64,
vocabulary 512, float32, 8 short requests) so that CI runs it in seconds.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import random
import tempfile
import time
from pathlib import Path

import torch
from bench_engine import hf_continuous_batching

from pyagent_ref.engine.llm import LLM
from pyagent_ref.sample.params import SamplingParams

QWEN3_06B = dict(
    vocab_size=151_936,
    hidden_size=1024,
    intermediate_size=3072,
    num_hidden_layers=28,
    num_attention_heads=16,
    num_key_value_heads=8,
    head_dim=128,
    tie_word_embeddings=True,
    max_position_embeddings=40_960,
    rope_theta=1_000_000.0,
    rms_norm_eps=1e-6,
)
SMOKE = QWEN3_06B | dict(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=1024,
)
# device -> (shape, dtype, requests, prompt lengths, output lengths, max_num_seqs, step tokens)
SETUPS = {
    "cuda": (QWEN3_06B, "bfloat16", 256, (32, 512), (64, 256), 128, 4096),
    "cpu": (SMOKE, "float32", 8, (8, 32), (4, 12), 8, 256),
}
ENGINES = ("ours-auto", "ours-eager", "ours-compile", "hf-static", "hf-continuous")
HF_BATCH = 64
EOS = "<|endoftext|>"


def byte_level_tokenizer(vocab_size: int):
    """A byte-level BPE tokenizer of exactly `vocab_size` ids: the 256 byte symbols, then
    merges of two byte symbols, then of a pair and a byte symbol, then EOS (the last id).
    No training: the merges are enumerated, so any vocabulary size is made in a second."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    wanted = vocab_size - len(alphabet) - 1
    merges = [(a, b) for a in alphabet for b in alphabet][:wanted]
    for a, b in merges[: len(alphabet) ** 2]:  # then triples: a pair merged with a symbol
        if len(merges) >= wanted:
            break
        merges.extend((a + b, c) for c in alphabet[: wanted - len(merges)])
    vocab = {s: i for i, s in enumerate(alphabet)}
    for a, b in merges:
        vocab[a + b] = len(vocab)
    tk = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    tk.add_special_tokens([EOS])
    assert tk.get_vocab_size() == vocab_size, tk.get_vocab_size()
    return tk


def build_model_dir(path: Path, shape: dict, dtype: str, seed: int = 0) -> Path:
    """A checkpoint directory: the random Qwen3 of `shape` in `dtype` and its tokenizer."""
    import transformers

    tk = byte_level_tokenizer(shape["vocab_size"])
    tk.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({"eos_token": EOS}))
    torch.manual_seed(seed)
    eos = tk.token_to_id(EOS)
    config = transformers.Qwen3Config(**shape, eos_token_id=eos, bos_token_id=None)
    model = transformers.Qwen3ForCausalLM(config).to(getattr(torch, dtype)).eval()
    model.save_pretrained(path)
    return path


def workload(n, prompt_lens, output_lens, vocab: int, seed: int = 0):
    """n (prompt ids, max_tokens): uniform random lengths and tokens (never EOS)."""
    rng = random.Random(seed)
    return [
        (
            [rng.randrange(vocab - 1) for _ in range(rng.randint(*prompt_lens))],
            rng.randint(*output_lens),
        )
        for _ in range(n)
    ]


def engine_args(mode, device, dtype, max_seqs: int, step_tokens: int, kv: int, longest: int):
    """Our engine's arguments for `mode` ("auto", "eager": graph_mode; "compile")."""
    args = dict(
        device=device,
        dtype=dtype,
        max_num_seqs=max_seqs,
        max_num_batched_tokens=step_tokens,
        kv_cache_memory_bytes=kv,
        max_model_len=longest,
    )
    return args | ({"compile": True} if mode == "compile" else {"graph_mode": mode})


def run_ours(llm: LLM, jobs) -> tuple[float, list[list[int]]]:
    """Seconds for every job through `llm` (after a 2-request warm-up), and the outputs."""
    params = [SamplingParams(temperature=0, max_tokens=m, ignore_eos=True) for _, m in jobs]
    prompts = [{"prompt_token_ids": ids} for ids, _ in jobs]
    llm.generate(prompts[:2], params[:2])  # graphs recorded, compiled, allocator warm
    sync(llm.config.device)
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params)
    sync(llm.config.device)
    return time.perf_counter() - t0, [list(o.outputs[0].token_ids) for o in outs]


def sync(device: str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def release(device: str) -> None:
    """Free an engine's KV cache and graphs before the next one allocates its own."""
    gc.collect()
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()


class StepTimer:
    """Seconds spent in parts of our step, by wrapping the engine's bound methods on the
    instances (nothing in the engine changes; removing the wrappers restores it). Each
    timed call synchronises the device when it returns, so GPU work is charged to the
    part that queued it; the timed run is therefore a little slower than the others."""

    PARTS = ("schedule", "host prep + copies", "forward", "sampling", "output processing")

    def __init__(self, llm: LLM):
        core, runner = llm.core, llm.core.runner
        self.device = llm.config.device
        self.seconds = dict.fromkeys(self.PARTS, 0.0)
        self.steps = 0
        self._wrap(core.scheduler, "schedule", "schedule")
        self._wrap(runner, "execute", "execute")
        self._wrap(runner, "_forward", "forward")
        self._wrap(runner.model, "compute_logits", "sampling")
        self._wrap(runner, "_sample", "sampling")
        self._wrap(core.scheduler, "update_from_output", "output processing")
        self._wrap(llm, "_process", "output processing")

    def _wrap(self, obj, name: str, part: str) -> None:
        inner = getattr(obj, name)

        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            out = inner(*args, **kwargs)
            if name == "_sample":
                out = list(out)  # a generator: its work happens when it is consumed
            sync(self.device)
            self.seconds[part] = self.seconds.get(part, 0.0) + time.perf_counter() - t0
            if name == "execute" and not args[0].is_empty:
                self.steps += 1
            return out

        setattr(obj, name, timed)  # an instance attribute shadows the method

    def per_step_ms(self) -> dict[str, float]:
        """Milliseconds per step of each part; host prep = execute less forward and sampling."""
        s = dict(self.seconds)
        s["host prep + copies"] = s.pop("execute") - s["forward"] - s["sampling"]
        return {k: 1e3 * s[k] / max(self.steps, 1) for k in self.PARTS}


def run_hf_static(model, jobs, pad: int, device: str) -> float:
    """Seconds for HF `generate` over the jobs in static batches of HF_BATCH (left-padded,
    greedy, each batch decoding until its longest request is done)."""
    t0 = time.perf_counter()
    with torch.inference_mode():
        for i in range(0, len(jobs), HF_BATCH):
            chunk = jobs[i : i + HF_BATCH]
            width = max(len(ids) for ids, _ in chunk)
            longest = max(m for _, m in chunk)
            ids = [[pad] * (width - len(p)) + p for p, _ in chunk]
            mask = [[0] * (width - len(p)) + [1] * len(p) for p, _ in chunk]
            model.generate(
                torch.tensor(ids, device=device),
                attention_mask=torch.tensor(mask, device=device),
                max_new_tokens=longest,
                min_new_tokens=longest,
                do_sample=False,
                pad_token_id=pad,
            )
    sync(device)
    return time.perf_counter() - t0


def hf_greedy(model, prompt: list[int], n: int, device: str) -> list[int]:
    """HF `generate`'s n greedy tokens after `prompt` (one request, no padding)."""
    with torch.inference_mode():
        out = model.generate(
            torch.tensor([prompt], device=device),
            max_new_tokens=n,
            min_new_tokens=n,
            do_sample=False,
            pad_token_id=0,
        )
    return out[0, len(prompt) :].tolist()


def bandwidth_floor(model, shape: dict, jobs, max_seqs: int, gbs: float) -> dict:
    """Seconds of the workload's decode steps if each read the weights once (tied
    embeddings counted once) and each running request's KV once, at `gbs` GB/s."""
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    itemsize = next(model.parameters()).element_size()
    per_token = 2 * shape["num_hidden_layers"] * shape["num_key_value_heads"] * shape["head_dim"]
    kv_token = per_token * itemsize
    kv_reads = sum(sum(len(p) + t for t in range(m)) for p, m in jobs) * kv_token
    steps = math.ceil(sum(m for _, m in jobs) / max_seqs)
    return dict(
        weights=weights,
        kv_token=kv_token,
        steps=steps,
        seconds=(steps * weights + kv_reads) / (gbs * 1e9),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--engines", default=None, help=f"comma-separated, of {ENGINES}")
    parser.add_argument("--requests", type=int, default=None)
    parser.add_argument("--bandwidth-gbs", type=float, default=3350.0)
    parser.add_argument("--ops", default="auto")
    args = parser.parse_args()
    device = args.device
    kind = torch.device(device).type
    shape, dtype, n, prompt_lens, output_lens, max_seqs, step_tokens = SETUPS[
        "cuda" if kind == "cuda" else "cpu"
    ]
    default = ENGINES if kind == "cuda" else tuple(e for e in ENGINES if e != "ours-compile")
    engines = args.engines.split(",") if args.engines else list(default)
    unknown = [e for e in engines if e not in ENGINES]
    if unknown:
        parser.error(f"--engines: unknown {unknown}; known: {ENGINES}")
    jobs = workload(args.requests or n, prompt_lens, output_lens, shape["vocab_size"])
    total = sum(m for _, m in jobs)
    longest = max(len(p) + m for p, m in jobs)
    import transformers

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_model_dir(Path(tmp), shape, dtype)
        hf = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device)
        hf.eval()
        floor = bandwidth_floor(hf, shape, jobs, max_seqs, args.bandwidth_gbs)
        kv = int(1.25 * max_seqs * (longest + 16) * floor["kv_token"])
        print(
            f"model: Qwen3-shaped random, {shape['num_hidden_layers']} layers, hidden "
            f"{shape['hidden_size']}, {shape['num_attention_heads']}/"
            f"{shape['num_key_value_heads']} heads of {shape['head_dim']}, vocab "
            f"{shape['vocab_size']}, {dtype}, {floor['weights'] / 1e6:.1f} MB of weights, "
            f"device {device}"
        )
        print(
            f"workload: {len(jobs)} requests, prompts {prompt_lens[0]}-{prompt_lens[1]}, "
            f"outputs {output_lens[0]}-{output_lens[1]} ({total} output tokens), ignore_eos, "
            f"greedy; ours: max_num_seqs {max_seqs}, {step_tokens} tokens per step, ops "
            f"{args.ops}"
        )
        print(
            f"bandwidth floor: {floor['steps']} decode steps x {floor['weights'] / 1e6:.1f} MB "
            f"+ KV {floor['kv_token'] / 1024:.1f} KiB/token read per step, at "
            f"{args.bandwidth_gbs:.0f} GB/s (assumed) = {floor['seconds']:.3g} s = "
            f"{total / floor['seconds']:.0f} tok/s"
        )
        print(f"{'engine':<28} {'seconds':>9} {'out tok/s':>10} {'of floor':>9}")

        def row(name: str, seconds: float) -> None:
            print(
                f"{name:<28} {seconds:>9.2f} {total / seconds:>10.1f} "
                f"{100 * floor['seconds'] / seconds:>8.3g}%"
            )

        outputs = {}
        for engine in engines:
            if engine.startswith("ours-"):
                mode = engine.split("-", 1)[1]
                llm = LLM(
                    str(model_dir),
                    ops=args.ops,
                    **engine_args(mode, device, dtype, max_seqs, step_tokens, kv, longest),
                )
                seconds, outputs[engine] = run_ours(llm, jobs)
                label = "compile=True" if mode == "compile" else f"graph_mode {mode}"
                row(f"ours, {label}", seconds)
                llm.shutdown()
                del llm
                release(device)
            elif engine == "hf-static":
                row(f"HF generate, batches of {HF_BATCH}", run_hf_static(hf, jobs, 0, device))
            elif hasattr(hf, "continuous_batching_context_manager"):
                blocks = math.ceil(1.25 * max_seqs * (longest + 16) / 16)
                seconds = hf_continuous_batching(
                    hf,
                    [p for p, _ in jobs],
                    [m for _, m in jobs],
                    0,
                    num_blocks=blocks,
                    max_batch_tokens=step_tokens,
                    max_requests=max_seqs,
                )
                row("HF continuous batching", seconds)
            else:
                print(
                    f"{'HF continuous batching':<28} not in transformers {transformers.__version__}"
                )

        mode = "auto" if "ours-auto" in engines else "eager"
        llm = LLM(
            str(model_dir),
            ops=args.ops,
            **engine_args(mode, device, dtype, max_seqs, step_tokens, kv, longest),
        )
        timer = StepTimer(llm)
        _, tokens = run_ours(llm, jobs)
        parts = timer.per_step_ms()
        print(
            f"per step (ours, graph_mode {mode}, {timer.steps} steps, ms): "
            + ", ".join(f"{k} {v:.2f}" for k, v in parts.items())
        )
        llm.shutdown()
        n_check = min(len(jobs), 2)
        same = 0
        for i in range(n_check):
            prompt, m = jobs[i]
            theirs = hf_greedy(hf, prompt, m, device)
            agree = next(
                (j for j, (a, b) in enumerate(zip(tokens[i], theirs, strict=True)) if a != b), m
            )
            same += agree == m
            print(f"greedy request {i}: ours and HF generate agree on {agree}/{m} tokens")
        print(f"greedy agreement: {same}/{n_check} requests identical")


if __name__ == "__main__":
    main()
