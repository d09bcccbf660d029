"""The "auto" ops namespace: per call, the accelerator on host arrays, the reference elsewhere.

pyagent_accel computes on the host only (a CUDA tensor is a TypeError there); the
reference runs wherever its array library does. `by_device(ref, accel)` builds a
namespace of the reference's shape whose every function looks at the device of its
array arguments and calls the twin that can run there, so a model on a GPU keeps its
attention on the GPU while a CPU engine runs every op in Rust, with no branch on the
backend in the callers.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache, wraps
from types import ModuleType
from typing import Any


def on_host(args: tuple, kwargs: dict) -> bool:
    """True unless an argument is a tensor on a device other than the CPU.

    numpy arrays (whose `.device` is the string "cpu"), lists and scalars are host values.
    """
    for value in (*args, *kwargs.values()):
        device = getattr(value, "device", None)
        if device is not None and getattr(device, "type", "cpu") != "cpu":
            return False
    return True


def dispatch(host: Callable[..., Any], device: Callable[..., Any]) -> Callable[..., Any]:
    """`host` for host arrays, `device` (the reference) otherwise; the reference's signature."""

    @wraps(device)
    def op(*args: Any, **kwargs: Any) -> Any:
        return (host if on_host(args, kwargs) else device)(*args, **kwargs)

    return op


@cache
def by_device(ref: ModuleType, accel: ModuleType) -> ModuleType:
    """The ops namespace of `ref`'s shape, each function dispatched by `dispatch`.

    Every module of `ref.MODULES` is rebuilt from its `__all__`: functions the accelerator
    also has are dispatched, constants (and any function it lacks) are the reference's.
    """
    root = ModuleType(f"{ref.__name__}[auto]", ref.__doc__)
    root.MODULES = ref.MODULES
    for module in ref.MODULES:
        ref_mod, accel_mod = getattr(ref, module), getattr(accel, module, None)
        auto = ModuleType(f"{ref_mod.__name__}[auto]", ref_mod.__doc__)
        auto.__all__ = list(ref_mod.__all__)
        for name in ref_mod.__all__:
            value, twin = getattr(ref_mod, name), getattr(accel_mod, name, None)
            callable_twin = callable(value) and not isinstance(value, type) and twin is not None
            setattr(auto, name, dispatch(twin, value) if callable_twin else value)
        setattr(root, module, auto)
    return root
