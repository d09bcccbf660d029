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
