"""Distributed execution: executors ("uni", "mp", "ray"), tensor parallelism and
pipeline parallelism (see docs/distributed.md)."""

from .executor import Executor, MultiprocExecutor, RayExecutor, UniProcExecutor
from .parallel import BACKENDS, ParallelContext, check_parallel_sizes

__all__ = [
    "BACKENDS",
    "Executor",
    "MultiprocExecutor",
    "ParallelContext",
    "RayExecutor",
    "UniProcExecutor",
    "check_parallel_sizes",
]
