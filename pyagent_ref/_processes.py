"""What every process pyagent spawns shares: the engine core, P/D instances, "mp" ranks."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator


@contextlib.contextmanager
def passive_openmp() -> Iterator[None]:
    """os.environ with OMP_WAIT_POLICY=PASSIVE (unless it is set already) while the block
    runs, for the processes it spawns to inherit.

    Their OpenMP threads then sleep between parallel regions rather than spin. Several
    processes spinning on a machine as busy as its cores take the CPU each other needs:
    oversubscribed, steps ran many times slower (P/D: documents' first tokens 5 s instead
    of 0.1-0.6 s on two busy cores)."""
    saved = os.environ.get("OMP_WAIT_POLICY")
    os.environ["OMP_WAIT_POLICY"] = saved or "PASSIVE"
    try:
        yield
    finally:
        if saved is None:
            del os.environ["OMP_WAIT_POLICY"]
        else:
            os.environ["OMP_WAIT_POLICY"] = saved
