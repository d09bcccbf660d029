"""The "ray" executor: the workers as Ray actors in a placement group of a local Ray
instance (`ray.init(num_cpus=2)`), drawing the tokens of one process; an address where
no Ray answers is refused at start, naming it."""

from __future__ import annotations

import socket

import pytest

torch = pytest.importorskip("torch")
ray = pytest.importorskip("ray")

from pyagent_ref.engine.core import EngineConfig, EngineCore  # noqa: E402
from tests.distributed.test_executor import ENGINE, model_dir, run, workload  # noqa: E402, F401


def test_an_address_without_ray_is_refused_naming_it(model_dir):  # noqa: F811
    if ray.is_initialized():
        pytest.skip("this process already joined a Ray instance")
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{s.getsockname()[1]}"
    config = EngineConfig(
        model=str(model_dir),
        **ENGINE,
        tensor_parallel_size=2,
        distributed_executor_backend="ray",
        ray_address=address,
    )
    with pytest.raises(ValueError, match=f"ray_address='{address}' does not answer"):
        EngineCore.from_config(config)


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.mark.usefixtures("local_ray")
def test_ray_actors_draw_the_tokens_of_one_process(model_dir):  # noqa: F811
    want = run(EngineCore.from_config(EngineConfig(model=str(model_dir), **ENGINE)), workload())
    core = EngineCore.from_config(
        EngineConfig(
            model=str(model_dir),
            **ENGINE,
            tensor_parallel_size=2,
            distributed_executor_backend="ray",
        )
    )
    try:
        assert core.executor.backend == "ray" and len(core.executor.actors) == 2
        assert run(core, workload()) == want
    finally:
        core.shutdown()
    assert core.executor.actors == [] and core.executor.pg is None
