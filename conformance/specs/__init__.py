"""One spec module per ops module of the reference (`pyagent_ref.ops.MODULES`):
`specs.sampling`, `specs.hashing`, `specs.block_table`, `specs.layers`, `specs.rope`,
`specs.attention`.

Each defines `spec`, a `conformance.core.Spec` holding its properties in report order.
A reference module without a spec module here is reported as unspecified.
"""

from __future__ import annotations

import importlib
import importlib.util
from functools import cache

from .. import contract
from ..core import Spec


@cache
def SPECS() -> dict[str, Spec]:  # noqa: N802 - a constant, computed on first use
    """{ops module name: its Spec} for each reference module that has a spec module."""
    return {
        name: importlib.import_module(f"{__name__}.{name}").spec
        for name in contract.modules()
        if importlib.util.find_spec(f"{__name__}.{name}") is not None
    }
