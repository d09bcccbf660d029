"""The reference's declarations: the one place the suite learns what an ops module holds.

An op's name and parameters are written once, in `pyagent_ref.ops.<module>`: its name in the
module's `__all__`, its parameters in its signature. The spec modules, the mutants and the
divergence registry read them from here instead of spelling them again, so adding or
renaming an op or a parameter in the reference is seen everywhere at once.
"""

from __future__ import annotations

import importlib
import inspect
from types import ModuleType

REFERENCE_OPS = "pyagent_ref.ops"


def modules() -> tuple[str, ...]:
    """The reference's ops modules (`pyagent_ref.ops.MODULES`), in order."""
    return tuple(importlib.import_module(REFERENCE_OPS).MODULES)


def reference_module(module: str) -> ModuleType:
    """`pyagent_ref.ops.<module>`."""
    return importlib.import_module(f"{REFERENCE_OPS}.{module}")


def names(module: str) -> tuple[str, ...]:
    """The public names of the reference module (functions and constants), in `__all__` order."""
    return tuple(reference_module(module).__all__)


def functions(module: str) -> tuple[str, ...]:
    """The public functions of the reference module, in `__all__` order."""
    ref = reference_module(module)
    return tuple(n for n in names(module) if inspect.isfunction(getattr(ref, n)))


def parameters(module: str, op: str) -> tuple[str, ...]:
    """The parameter names of the reference function `module.op`, in order."""
    return tuple(inspect.signature(getattr(reference_module(module), op)).parameters)


def ops_taking(module: str, *first: str) -> tuple[str, ...]:
    """The functions of `module` whose first parameter is one of `first` (e.g. the ops
    that take a logits array)."""
    return tuple(op for op in functions(module) if (parameters(module, op) or ("",))[0] in first)
