"""One spec module per ops module: `specs.sampling`, `specs.hashing`, `specs.block_table`,
`specs.layers`, `specs.rope`, `specs.attention`.

Each defines `spec`, a `conformance.core.Spec` holding its properties in report order.
"""

from __future__ import annotations

import importlib
from functools import cache

from ..core import Spec

MODULES = ("sampling", "hashing", "block_table", "layers", "rope", "attention")


@cache
def SPECS() -> dict[str, Spec]:  # noqa: N802 - a constant, computed on first use
    """{ops module name: its Spec}, importing the spec modules on first use."""
    return {name: importlib.import_module(f"{__name__}.{name}").spec for name in MODULES}
