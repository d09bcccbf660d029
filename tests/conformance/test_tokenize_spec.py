"""The tokenize spec (conformance/specs/tokenize.py) on the reference, its Rust twin and the
tokenizers and tiktoken adapters: no unexplained failure, the reference and the twin with
no divergence at all, and every divergence registered for an adapter still shows (so the
registry cannot go stale). Vocabularies whose files are not installed are skipped.
"""

from __future__ import annotations

import importlib
import os

import pytest

from conformance import core, divergences

HF_TOKENIZERS = "conformance.adapters.hf_tokenizers"
TIKTOKEN = "conformance.adapters.tiktoken"
NEEDS = {
    "pyagent_ref": None,
    "pyagent_accel": "pyagent_accel.tokenize.bpe",
    HF_TOKENIZERS: "tokenizers",
    TIKTOKEN: "tiktoken",
}


def _require(module: str | None) -> None:
    if module is None:
        return
    try:
        importlib.import_module(module)
    except ImportError as exc:
        if module.startswith("pyagent_accel") and os.environ.get("PYAGENT_REQUIRE_ACCEL") == "1":
            raise
        pytest.skip(f"{module} does not import: {exc}")


@pytest.mark.parametrize("target", list(NEEDS), ids=lambda t: t.rsplit(".", 1)[-1])
def test_tokenize_spec_conforms_but_for_registered_divergences(target):
    _require(NEEDS[target])
    report = core.run(target, ["tokenize"], profile="ci", native=False)
    assert report.outcomes
    failed = [f"{o.prop.id}: {o.message}" for o in report.outcomes if o.failed]
    assert not failed, failed

    ran = {o.prop.qualified_op for o in report.outcomes if o.status != core.SKIP}
    observed = {
        (o.prop.qualified_op, o.prop.name) for o in report.outcomes if o.status == core.KNOWN
    }
    registered = {(d.op, d.property) for d in divergences.for_implementation(target) if d.op in ran}
    assert registered == observed, (
        f"registered but not observed: {sorted(registered - observed)}; "
        f"observed but not registered: {sorted(observed - registered)}"
    )
    if target in ("pyagent_ref", "pyagent_accel"):
        assert not observed
        assert not [o.prop.id for o in report.outcomes if o.status == core.MISSING]


def test_adapters_declare_what_they_cannot_load():
    """An adapter lacking a vocabulary says why (MISSING with a reason, not 'not provided')."""
    _require("tokenizers")
    report = core.run(HF_TOKENIZERS, ["tokenize"], profile="ci", only=["tokenize.cl100k_base"])
    assert {o.status for o in report.outcomes} <= {core.MISSING, core.SKIP}
    assert all("tiktoken ranks" in o.message for o in report.outcomes if o.status == core.MISSING)
