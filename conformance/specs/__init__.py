"""One spec module per ops module of the reference (`pyagent_ref.ops.MODULES`):
`specs.sampling`, `specs.hashing`, `specs.block_table`, `specs.layers`, `specs.rope`,
`specs.attention`, `specs.structured`, `specs.spec_decode`, `specs.moe`, `specs.pooling`; and
one per contract that is not an ops module (`OTHER_CONTRACTS`): `specs.tokenize`, byte-level BPE
(`pyagent_ref.tokenize.bpe`), and `specs.matcher`, the token matchers of structured
output (`pyagent_ref.structured`).

Each defines `spec`, a `conformance.core.Spec` holding its properties in report order.
A reference ops module without a spec module here is reported as unspecified.
"""

from __future__ import annotations

import importlib
import importlib.util
from functools import cache

from .. import contract
from ..core import Spec

OTHER_CONTRACTS = ("tokenize", "matcher")
"""Specs of contracts that are not ops modules (their `Spec.namespace` says where an
implementation keeps them)."""


@cache
def SPECS() -> dict[str, Spec]:  # noqa: N802 - a constant, computed on first use
    """{name: its Spec} for each reference ops module that has a spec module, then for each
    of `OTHER_CONTRACTS`."""
    ops = {
        name: importlib.import_module(f"{__name__}.{name}").spec
        for name in contract.modules()
        if importlib.util.find_spec(f"{__name__}.{name}") is not None
    }
    return ops | {
        name: importlib.import_module(f"{__name__}.{name}").spec for name in OTHER_CONTRACTS
    }
