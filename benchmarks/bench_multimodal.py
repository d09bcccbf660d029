"""Encoder-cache hit rate and time to first token on a workload where requests share images.

    python benchmarks/bench_multimodal.py            # 32 requests, 4 distinct images
    python benchmarks/bench_multimodal.py --quick    # a smoke run (seconds)

A random LLaVA-shaped model is built in a temporary directory (a CLIP tower on 112 x 112
images with 14 x 14 patches: 64 image positions, 4 layers of width 256; a 4-layer Llama of
width 256 with the embedded default model's tokenizer). All requests arrive at once; each
carries one image between a short text all share and a question of its own. Two workloads
run in one process with the same engine options: "shared" draws each request's image
among a few distinct ones, "distinct" gives every request an image of its own (nothing to
share). Each runs with the prefix cache off (only the encoder cache can share: the decoder
computes every image's positions anyway) and on (a repeated image at the same place also
shares its KV blocks, so the decoder skips it too). Prints, per run: images encoded,
encoder-cache hit rate, mean and p90 TTFT, wall time.
This is a measurement, not a test: it never fails on a figure.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # pyagent_ref from the checkout

import torch  # noqa: E402
from _timing import machine_line  # noqa: E402

from pyagent_ref.engine.llm import LLM  # noqa: E402
from pyagent_ref.model import default_model_path  # noqa: E402
from pyagent_ref.sample.params import SamplingParams  # noqa: E402

IMAGE_SIZE, PATCH = 112, 14


def build_model(path: Path) -> int:
    """A random LLaVA in `path`; returns its image token id."""
    import transformers

    default = Path(default_model_path())
    vocab = json.loads((default / "config.json").read_text())["vocab_size"]
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(default / name, path / name)
    image_token = vocab - 1
    torch.manual_seed(0)
    config = transformers.LlavaConfig(
        vision_config=transformers.CLIPVisionConfig(
            hidden_size=256,
            intermediate_size=512,
            num_hidden_layers=4,
            num_attention_heads=4,
            image_size=IMAGE_SIZE,
            patch_size=PATCH,
        ),
        text_config=transformers.LlamaConfig(
            vocab_size=vocab,
            hidden_size=256,
            intermediate_size=512,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=1024,
        ),
        image_token_id=image_token,
    )
    transformers.LlavaForConditionalGeneration(config).save_pretrained(path)
    transformers.CLIPImageProcessorPil(
        size={"shortest_edge": IMAGE_SIZE}, crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE}
    ).save_pretrained(path)
    return image_token


def workload(n: int, distinct: int, image_token: int, seed: int) -> list[dict]:
    """n prompts: 4 text tokens all share, the image, 12 text tokens of their own; images
    drawn among `distinct` random ones."""
    rng = np.random.default_rng(seed)
    images = [rng.integers(0, 256, (128, 160, 3), dtype=np.uint8) for _ in range(distinct)]
    common = rng.integers(10, 3000, 4).tolist()
    return [
        {
            "prompt_token_ids": common + [image_token] + rng.integers(10, 3000, 12).tolist(),
            "multi_modal_data": {"image": images[i % distinct]},
        }
        for i in range(n)
    ]


def run(path: Path, prompts: list[dict], prefix_caching: bool) -> dict:
    llm = LLM(
        str(path),
        ops="auto",
        block_size=16,
        num_kv_blocks=1024,
        max_num_batched_tokens=512,
        enable_prefix_caching=prefix_caching,
    )
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    llm.generate(prompts[:1], params)  # warm-up (lazy init, the image processor)
    cache = llm.core.scheduler.encoder_cache
    hits, misses = cache.hits, cache.misses
    t0 = time.perf_counter()
    outs = llm.generate(prompts[1:], params)
    wall = time.perf_counter() - t0
    ttfts = sorted(m.ttft for o in outs for m in o.metrics if m.ttft is not None)
    hits, misses = cache.hits - hits, cache.misses - misses
    llm.shutdown()
    return dict(
        encoded=misses,
        hit_rate=hits / max(hits + misses, 1),
        ttft=statistics.mean(ttfts),
        ttft_p90=ttfts[int(0.9 * (len(ttfts) - 1))],
        wall=wall,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run")
    args = parser.parse_args()
    n, distinct = (9, 2) if args.quick else (33, 4)
    try:  # the engine runs ops="auto": the accelerator's twins where it is installed
        import pyagent_accel._native as accel_native

        simd = accel_native.SIMD
    except ImportError:
        simd = None
    print(machine_line(torch, simd))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp)
        image_token = build_model(path)
        print(f"{n - 1} timed requests, {(IMAGE_SIZE // PATCH) ** 2} image positions each")
        print(
            f"{'workload':<10}{'prefix':>8}{'encoded':>9}{'hit rate':>10}"
            f"{'TTFT ms':>10}{'p90 ms':>9}{'wall s':>8}"
        )
        for name, k in (("shared", distinct), ("distinct", n)):
            prompts = workload(n, k, image_token, seed=1)
            for prefix in (False, True):
                r = run(path, prompts, prefix)
                print(
                    f"{name:<10}{'on' if prefix else 'off':>8}{r['encoded']:>9}"
                    f"{r['hit_rate']:>10.2f}{r['ttft'] * 1e3:>10.1f}{r['ttft_p90'] * 1e3:>9.1f}"
                    f"{r['wall']:>8.2f}"
                )


if __name__ == "__main__":
    main()
