"""conformance: a property-based conformance suite for the pyagent ops.

Checks any implementation of `pyagent_ref.ops` (the accelerator `pyagent_accel`, an
adapter around a third-party library, your own kernels) against the specification in
the reference's docstrings: invariants, a differential check against `pyagent_ref`,
error behaviour and statistical tests for the random ops. The `tokenize` spec does the
same for byte-level BPE (`pyagent_ref.tokenize.bpe`; adapters for `tokenizers` and
`tiktoken`).

    python -m conformance pyagent_accel --profile ci
    pytest --pyargs conformance -p conformance.pytest_plugin --conformance-impl=pyagent_accel

Programmatic use:

    report = conformance.run("pyagent_accel", array="torch", profile="ci")
    print(conformance.render(report)); assert report.ok
"""

from __future__ import annotations

from .core import Impl, Outcome, Property, Report, Spec, resolve, run, run_property, select
from .profiles import PROFILES
from .profiles import register as register_profiles
from .report import render

__all__ = [
    "PROFILES",
    "Impl",
    "Outcome",
    "Property",
    "Report",
    "Spec",
    "register_profiles",
    "render",
    "resolve",
    "run",
    "run_property",
    "select",
]
