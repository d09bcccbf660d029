"""The attention backends conform: the attention spec passes on each (torch arrays, the
ci profile), with the cache writes declared missing. `flex` runs eagerly here (it
materialises the scores of every cache slot, through vmap: 30-200 ms a call), so CI
runs its two oracle properties and its error cases; `python -m
conformance pyagent_ref.attention_backends.flex attention --array torch` runs them all."""

from __future__ import annotations

import warnings

import pytest

pytest.importorskip("torch")

from conformance import core  # noqa: E402

FLEX_CORE = [
    "attention.paged_attention.equals_dense_masked_attention",
    "attention.paged_decode_attention.decode_equals_dense_masked_attention",
    "attention.paged_attention.rejects_invalid_input",
    "attention.paged_decode_attention.rejects_invalid_input",
]


@pytest.mark.parametrize(("backend", "only"), [("sdpa", None), ("flex", FLEX_CORE)])
def test_backend_passes_the_attention_spec(backend, only):
    with warnings.catch_warnings():  # flex_attention without torch.compile says so
        warnings.simplefilter("ignore")
        report = core.run(
            f"pyagent_ref.attention_backends.{backend}", ["attention"], "torch", "ci", only
        )
    failed = [f"{o.prop.id}: {o.message}" for o in report.outcomes if o.failed]
    assert not failed
    passed = {o.prop.id for o in report.outcomes if o.status == core.PASS}
    assert passed >= set(only or ()) and len(passed) >= len(only or range(19))
