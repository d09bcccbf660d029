"""What the benchmarks share: how an op is timed and the line that says where it ran."""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable
from typing import Any


def timeit(fn: Callable[[], Any], budget: float, min_reps: int, max_reps: int) -> float:
    """Median seconds of fn() over repeats sized so the total stays near `budget`."""
    t0 = time.perf_counter()
    fn()  # warm-up (allocator, caches, lazy init); also sizes the repeats
    first = time.perf_counter() - t0
    reps = int(min(max_reps, max(min_reps, budget / max(first, 1e-7))))
    return median_seconds(fn, reps, warm_up=False)


def median_seconds(fn: Callable[[], Any], repeats: int, warm_up: bool = True) -> float:
    """Median seconds of `repeats` calls of fn (after one untimed call if `warm_up`)."""
    if warm_up:
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def machine_line(torch: Any, simd: str) -> str:
    """Python, numpy and torch versions, torch threads, CPUs, accel SIMD level, load."""
    import numpy as np

    return (
        f"python {platform.python_version()}, numpy {np.__version__}, "
        f"torch {torch.__version__ if torch else 'absent'} "
        f"({torch.get_num_threads() if torch else 0} threads), cpus {os.cpu_count()}, "
        f"pyagent_accel SIMD {simd}, load average {os.getloadavg()[0]:.2f}"
    )
