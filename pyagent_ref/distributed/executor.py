"""Executors: how the engine core drives the model's ranks, behind one interface.

    EngineCore --SchedulerOutput--> Executor.execute_model --> every rank's ModelRunner
               <--ModelRunnerOutput-- the output rank's (tp_rank 0 of the last stage)

- "uni": one `ModelRunner` in the engine's own process (world size 1).
- "mp": one process per rank (multiprocessing, spawn), each a `worker.Worker`; the ranks
  meet in a torch.distributed process group (gloo on CPU, NCCL on CUDA) through a TCP
  store the driver opens on 127.0.0.1 at a free port. Calls go down a pipe per rank.
- "ray": the same workers as Ray actors, one per bundle of a placement group, so the
  ranks may sit on several machines of a Ray cluster; the store listens on the driver's
  node address.

Failure: every wait is bounded (timeout_s). A rank that dies, raises or does not answer
takes the executor down: the remaining ranks are stopped (their collectives cannot go on
without it), the step's requests fail with the reason, and every later step fails its
requests at once with the same reason, so that all requests end and nothing hangs.
"""

from __future__ import annotations

import os
import socket
import time
import weakref
from abc import ABC, abstractmethod
from multiprocessing.connection import wait

from .._processes import passive_openmp
from ..sched.outputs import ModelRunnerOutput, SchedulerOutput
from .worker import WorkerSpec, serve


class Executor(ABC):
    """Runs steps on the model's ranks. `execute_model` returns the output rank's
    `ModelRunnerOutput`; `forget` drops requests from every rank's batch (after a failed
    step); the KV cache calls serve the engine's sleep and wake-up."""

    backend: str
    world_size: int = 1

    @abstractmethod
    def execute_model(self, sched: SchedulerOutput) -> ModelRunnerOutput: ...

    @abstractmethod
    def forget(self, req_ids: list[str]) -> None: ...

    @abstractmethod
    def allocate_kv_cache(self) -> None: ...

    @abstractmethod
    def release_kv_cache(self) -> None: ...

    @abstractmethod
    def shutdown(self) -> None:
        """Stop the workers (idempotent)."""


class UniProcExecutor(Executor):
    """The runner in the engine's process."""

    backend = "uni"

    def __init__(self, runner) -> None:
        self.runner = runner

    def execute_model(self, sched: SchedulerOutput) -> ModelRunnerOutput:
        return self.runner.execute(sched)

    def forget(self, req_ids: list[str]) -> None:
        self.runner.batch.forget(req_ids)

    def allocate_kv_cache(self) -> None:
        self.runner.allocate_kv_cache()

    def release_kv_cache(self) -> None:
        self.runner.release_kv_cache()

    def shutdown(self) -> None:
        """Nothing to stop: the runner lives in this process."""


class _RemoteExecutor(Executor):
    """What "mp" and "ray" share: calls on every rank, and going down for good."""

    runner = None
    down: str | None = None

    def execute_model(self, sched: SchedulerOutput) -> ModelRunnerOutput:
        if self.down is not None and sched.is_empty:
            return ModelRunnerOutput({})  # nothing to run: the requests already ended
        return self._call_all("execute_model", sched)[self.spec.output_rank]

    def forget(self, req_ids: list[str]) -> None:
        if self.down is None:
            self._call_all("forget", list(req_ids))

    def allocate_kv_cache(self) -> None:
        self._call_all("allocate_kv_cache")

    def release_kv_cache(self) -> None:
        self._call_all("release_kv_cache")

    def _call_all(self, method: str, *args) -> list:
        if self.down is not None:
            raise RuntimeError(f"the {self.backend} executor is down: {self.down}")
        return self._call(method, *args)

    def _go_down(self, reason: str) -> RuntimeError:
        """Stop every worker, remember why, and return the error to raise."""
        self.down = reason
        self.shutdown()
        return RuntimeError(f"the {self.backend} executor is down: {reason}")

    @abstractmethod
    def _call(self, method: str, *args) -> list: ...


class MultiprocExecutor(_RemoteExecutor):
    """One spawned process per rank (see the module docstring).

    Raises (at start):
        RuntimeError: a rank failed to start (its error is in the message) or did not
            report ready within timeout_s.
    """

    backend = "mp"

    def __init__(self, spec: WorkerSpec, timeout_s: float = 300.0) -> None:
        import multiprocessing

        import torch.distributed as dist

        self.timeout_s = timeout_s
        self.world_size = spec.world_size
        self._store = dist.TCPStore("127.0.0.1", 0, None, True, wait_for_workers=False)
        self.spec = spec = WorkerSpec(
            **{**vars(spec), "store_host": "127.0.0.1", "store_port": self._store.port}
        )
        context = multiprocessing.get_context("spawn")
        self.procs, self.conns = [], []
        for rank in range(spec.world_size):
            mine, theirs = context.Pipe()
            proc = context.Process(
                target=serve, args=(spec, rank, theirs), daemon=True, name=f"pyagent-rank{rank}"
            )
            with passive_openmp():
                proc.start()
            theirs.close()
            self.procs.append(proc)
            self.conns.append(mine)
        self._finalizer = weakref.finalize(self, _stop_processes, self.procs, self.conns)
        self.pids = self._collect()  # each rank's ("ok", pid) once it is ready

    def _call(self, method: str, *args) -> list:
        for rank, conn in enumerate(self.conns):
            try:
                conn.send((method, args))
            except (BrokenPipeError, OSError):
                raise self._go_down(self._death(rank)) from None
        return self._collect()

    def _death(self, rank: int) -> str:
        proc = self.procs[rank]
        proc.join(timeout=1)
        return f"worker rank {rank} (pid {proc.pid}) died (exit code {proc.exitcode})"

    def _died_besides(self, rank: int, sentinels: dict) -> int | None:
        """Another rank that ended abnormally (killed, crashed) within the last second,
        or None (a rank that reported its error and returned exits with 0)."""
        others = [s for s, r in sentinels.items() if r != rank]
        for sentinel in wait(others, timeout=1.0):
            proc = self.procs[sentinels[sentinel]]
            proc.join(timeout=1)
            if proc.exitcode not in (0, None):
                return sentinels[sentinel]
        return None

    def _collect(self) -> list:
        """Every rank's reply; the first death, error or timeout takes the executor down."""
        results: list = [None] * self.world_size
        pending = dict(enumerate(self.conns))
        sentinels = {proc.sentinel: rank for rank, proc in enumerate(self.procs)}
        deadline = time.monotonic() + self.timeout_s
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                raise self._go_down(
                    f"worker rank(s) {sorted(pending)} did not answer within {self.timeout_s} s"
                )
            ready = wait([*pending.values(), *sentinels], timeout=left)
            conns = [c for c in ready if not isinstance(c, int)]
            for conn in conns:
                rank = self.conns.index(conn)
                try:
                    status, value = conn.recv()
                except (EOFError, OSError):
                    raise self._go_down(self._death(rank)) from None
                if status == "error":
                    died = self._died_besides(rank, sentinels)
                    if died is not None:  # the cause of this rank's failed collective
                        raise self._go_down(self._death(died))
                    raise self._go_down(f"worker rank {rank} raised {value}")
                results[rank] = value
                del pending[rank]
            if not conns:  # only sentinels: a process ended
                rank = sentinels[next(c for c in ready if isinstance(c, int))]
                raise self._go_down(self._death(rank))
        return results

    def shutdown(self) -> None:
        self._finalizer()


def _stop_processes(procs, conns, grace_s: float = 5.0) -> None:
    """Ask each worker to stop, then kill those still running after grace_s."""
    for conn in conns:
        try:
            conn.send(None)
        except (BrokenPipeError, OSError):
            pass
    deadline = time.monotonic() + grace_s
    for proc in procs:
        proc.join(timeout=max(0.0, deadline - time.monotonic()))
        if proc.is_alive():
            proc.kill()
            proc.join(timeout=grace_s)
    for conn in conns:
        conn.close()


class RayExecutor(_RemoteExecutor):
    """The workers as Ray actors in a placement group (see the module docstring).

    Args:
        spec: as for "mp" (the store address is filled in here).
        ray_address: None (the Ray instance this process already joined, else a local
            one started here and stopped at shutdown), or a cluster's address
            ("host:port", "ray://host:port", "auto").
        timeout_s: the bound on every wait.
    Raises:
        ValueError: a ray_address that does not answer, or a cluster without
            world_size free CPUs (GPUs on CUDA) for the placement group.
    """

    backend = "ray"

    def __init__(
        self, spec: WorkerSpec, ray_address: str | None = None, timeout_s: float = 300.0
    ) -> None:
        import ray
        from ray.util.placement_group import placement_group, remove_placement_group

        self.timeout_s, self.world_size = timeout_s, spec.world_size
        self._ray, self._remove_pg = ray, remove_placement_group
        self.started_ray, self.actors, self.pg = False, [], None
        if not ray.is_initialized():
            if ray_address is not None:
                check_ray_address(ray_address)
            try:
                ray.init(address=ray_address, log_to_driver=False)
            except ConnectionError as exc:
                raise ValueError(f"ray_address={ray_address!r} does not answer: {exc}") from exc
            self.started_ray = ray_address is None
        resource = "GPU" if spec.device == "cuda" else "CPU"
        have = ray.cluster_resources().get(resource, 0)
        if have < spec.world_size:
            raise ValueError(
                f"the Ray cluster has {have:g} {resource}s, fewer than the "
                f"{spec.world_size} ranks of tensor_parallel_size={spec.tp_size} x "
                f"pipeline_parallel_size={spec.pp_size}"
            )
        self.pg = placement_group([{resource: 1}] * spec.world_size, strategy="PACK")
        try:
            ray.get(self.pg.ready(), timeout=timeout_s)
        except ray.exceptions.GetTimeoutError:
            remove_placement_group(self.pg)
            raise ValueError(
                f"no placement of {spec.world_size} x {{{resource!r}: 1}} on the Ray cluster "
                f"within {timeout_s} s (are the {resource}s taken?)"
            ) from None
        try:
            self._start_actors(spec, resource)
        except BaseException:
            self.shutdown()  # no actor or placement group outlives a failed start
            raise

    def _start_actors(self, spec: WorkerSpec, resource: str) -> None:
        import torch.distributed as dist
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        ray = self._ray
        host = ray.util.get_node_ip_address()
        self._store = dist.TCPStore(host, 0, None, True, wait_for_workers=False)
        self.spec = spec = WorkerSpec(
            **{**vars(spec), "store_host": host, "store_port": self._store.port}
        )
        gpu = resource == "GPU"
        actor = ray.remote(num_cpus=0 if gpu else 1, num_gpus=1 if gpu else 0)(RayWorker)
        env = {"env_vars": {"PYTHONPATH": os.environ.get("PYTHONPATH", "")}}
        self.actors = [
            actor.options(
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    self.pg, placement_group_bundle_index=rank
                ),
                runtime_env=env,
            ).remote(spec, rank)
            for rank in range(spec.world_size)
        ]
        self.pids = self._call("pid")

    def _call(self, method: str, *args) -> list:
        ray = self._ray
        refs = [ray.put(a) for a in args]  # one copy in the object store for every rank
        futures = [a.call.remote(method, *refs) for a in self.actors]
        try:
            return ray.get(futures, timeout=self.timeout_s)
        except ray.exceptions.GetTimeoutError:
            raise self._go_down(f"the workers did not answer within {self.timeout_s} s") from None
        except ray.exceptions.RayError as exc:
            raise self._go_down(f"a worker failed: {exc}") from None

    def shutdown(self) -> None:
        ray = self._ray
        for actor in self.actors:
            ray.kill(actor)
        self.actors = []
        if self.pg is not None:
            self._remove_pg(self.pg)
            self.pg = None
        if self.started_ray:
            ray.shutdown()
            self.started_ray = False


class RayWorker:
    """A `Worker` in a Ray actor: built in the actor, called by method name."""

    def __init__(self, spec: WorkerSpec, rank: int) -> None:
        from .worker import Worker

        self.worker = Worker(spec, rank)

    def call(self, method: str, *args):
        return getattr(self.worker, method)(*args)


def check_ray_address(address: str, timeout_s: float = 5.0) -> None:
    """ValueError naming `address` if it is "host:port" (or "ray://host:port") and
    nothing accepts a TCP connection there within timeout_s ("auto" is left to Ray)."""
    if address == "auto":
        return
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(
            f"ray_address must be 'host:port', 'ray://host:port' or 'auto', got {address!r}"
        )
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as exc:
        raise ValueError(f"ray_address={address!r} does not answer: {exc}") from None


def check_devices(device: str, world_size: int) -> None:
    """ValueError if this machine has fewer devices than ranks: GPUs on CUDA, CPU cores
    on the CPU (each rank computes on its own)."""
    import torch

    if device.startswith("cuda"):
        have, what = (torch.cuda.device_count() if torch.cuda.is_available() else 0), "CUDA devices"
    else:
        have, what = os.cpu_count() or 1, "CPU cores"
    if world_size > have:
        raise ValueError(
            f"tensor_parallel_size x pipeline_parallel_size = {world_size} ranks, but this "
            f"machine has {have} {what}"
        )
