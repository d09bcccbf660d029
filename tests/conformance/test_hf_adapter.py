"""The HF transformers adapter stays honest: on numpy and torch input its report has no
unexplained failure, and the divergences registered for its model-layer ops still show.

(Some sampling divergences sit on float32 rounding boundaries that 50 derandomized
examples may not reach; only the layer, RoPE and MoE ones are checked for staleness here.)
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from conformance import core, divergences  # noqa: E402

HF = "conformance.adapters.hf_transformers"


def test_hf_transformers_conforms_but_for_its_registered_divergences():
    observed = set()
    for array in ("numpy", "torch"):
        report = core.run(HF, array=array, profile="ci")
        failed = [f"{o.prop.id}: {o.message}" for o in report.outcomes if o.failed]
        assert not failed, f"{array}: {failed}"
        observed |= {
            (f"{o.prop.module}.{o.prop.op}", o.prop.name)
            for o in report.outcomes
            if o.status == core.KNOWN
        }
    registered = {
        (d.op, d.property)
        for d in divergences.for_implementation(HF)
        if d.op.startswith(("layers.", "rope.", "moe.")) and (d.op, d.property) not in SHOWN_BELOW
    }
    assert registered, "no layer or RoPE divergence registered for transformers"
    assert registered - observed == set(), "registered divergences that no longer show"


# registered divergences that the ci profile's 50 derandomized examples reach or not
# depending on hypothesis' version (a float16 case large enough to round visibly): each is
# shown on a fixed case instead
SHOWN_BELOW = {("moe.fused_moe", "matches_the_formula")}


def test_mixtral_experts_in_float16_still_diverge_from_the_formula():
    """The registered `_HF_EXPERTS_HALF` divergence on a fixed float16 case of the spec's
    shapes (about 1 in 11 random ones shows it): MixtralExperts rounds its projections to
    float16, beyond the spec's tolerance for one final rounding, where the reference
    stays within it."""
    import numpy as np

    from conformance.adapters import hf_transformers
    from conformance.core import Case
    from conformance.specs.moe import moe_oracle, moe_tol
    from pyagent_ref.ops import moe as reference

    rng = np.random.default_rng(24)
    tokens, hidden, experts, inter, k = 4, 12, 3, 8, 2
    half = lambda *shape: rng.uniform(-2, 2, shape).astype(np.float16)  # noqa: E731
    case = Case(
        hidden=half(tokens, hidden),
        w_gate_up=half(experts, 2 * inter, hidden),
        w_down=half(experts, hidden, inter),
        topk_weights=rng.uniform(0, 1, (tokens, k)).astype(np.float32),
        topk_ids=rng.integers(0, experts, (tokens, k)),
    )
    args = (case.hidden, case.w_gate_up, case.w_down, case.topk_weights, case.topk_ids)
    want, mag = moe_oracle(case)
    tol = moe_tol(case, want, mag)
    theirs = np.asarray(hf_transformers.moe.fused_moe(*args), np.float64)
    ours = np.asarray(reference.fused_moe(*args), np.float64)
    assert (np.abs(ours - want) <= tol).all()
    assert (np.abs(theirs - want) > tol).any(), "MixtralExperts meets the tolerance now"
