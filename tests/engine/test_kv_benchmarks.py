"""The KV groups and KV offload benchmarks run in quick mode, so they cannot rot."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]


def bench(name: str) -> str:
    script = ROOT / "benchmarks" / name
    done = subprocess.run(
        [sys.executable, str(script), "--quick"], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_kv_groups_benchmark_fits_more_sliding_window_requests():
    out = bench("bench_kv_groups.py")
    rows = re.findall(r"^.*?(full|groups) +\d+ +\d+ +(\d+) +\d+ +(\d+)", out, re.MULTILINE)
    assert len(rows) == 6  # 3 models x 2 layouts at one context
    (_, full_held, full_fit), (_, held, fit) = rows[:2]  # Mistral: every layer slides
    assert int(held) < int(full_held) and int(fit) > int(full_fit)


def test_kv_offload_benchmark_raises_the_hit_rate_without_changing_tokens():
    out = bench("bench_kv_offload.py")
    assert "greedy outputs identical with and without offload: True" in out
    rates = [float(r) for r in re.findall(r"^\S.*? +([\d.]+)% ", out, re.MULTILINE)]
    assert len(rates) == 3 and rates[0] < rates[1] == rates[2]
