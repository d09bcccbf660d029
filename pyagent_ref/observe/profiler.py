"""The profiler switch: torch.profiler started and stopped on demand, each run written
as a trace file (Chrome trace JSON; open it in Perfetto or chrome://tracing).

``profiler_dir`` (`EngineConfig`, ``--profiler-dir``) enables it; then
`LLM.start_profile` / `stop_profile`, `AsyncLLM`'s, or the server's POST /start_profile
and /stop_profile (vLLM's endpoints) record what the engine core does in between, in
the core's process when it has its own. CPU activity always, CUDA's too when the
engine runs on a CUDA device; shapes are recorded, stacks are not (their cost).
"""

from __future__ import annotations

import os
import time
from pathlib import Path


class Profiler:
    """One torch.profiler run at a time, written under ``trace_dir`` when stopped."""

    def __init__(self, trace_dir: str | os.PathLike, cuda: bool = False) -> None:
        self.trace_dir = Path(trace_dir)
        self.cuda = cuda
        self._profile = None

    @property
    def running(self) -> bool:
        return self._profile is not None

    def start(self) -> None:
        """Start recording; RuntimeError if a run is already going."""
        import torch.profiler

        if self._profile is not None:
            raise RuntimeError("the profiler is already running; stop_profile first")
        activities = [torch.profiler.ProfilerActivity.CPU]
        if self.cuda:
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self.trace_dir.mkdir(parents=True, exist_ok=True)
        profile = torch.profiler.profile(
            activities=activities,
            record_shapes=True,
            # every thread: AsyncLLM steps the engine in worker threads
            experimental_config=_all_threads(),
        )
        profile.start()
        self._profile = profile

    def stop(self) -> str:
        """Stop recording and write the trace; returns its path. RuntimeError if no
        run is going."""
        if self._profile is None:
            raise RuntimeError("the profiler is not running; start_profile first")
        profile, self._profile = self._profile, None
        profile.stop()
        name = f"pyagent-{os.getpid()}-{time.strftime('%Y%m%d-%H%M%S')}-{time.monotonic_ns()}"
        path = self.trace_dir / f"{name}.pt.trace.json"
        profile.export_chrome_trace(str(path))
        return str(path)


def _all_threads():
    """Kineto's profile_all_threads where this torch has it (2.6 on), else None (then
    only the thread that started the profiler is recorded)."""
    import torch.profiler

    try:
        return torch.profiler._ExperimentalConfig(profile_all_threads=True)
    except (AttributeError, TypeError):
        return None
