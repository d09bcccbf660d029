"""The hypothesis profiles of the project, registered in this one place.

    dev  random exploration with more examples; failures are saved to the local
         example database (.hypothesis/) and replayed first next time.
    ci   deterministic (derandomize, no database) with a modest number of examples, so
         that a run is reproducible and the suite on three targets takes well under
         three minutes on two cores.

Both print the `@reproduce_failure` blob of a failure, have no deadline (the first call
of a torch op or a freshly built extension is slow) and never report more than one
bug per property. `tests/` can share them: `conformance.profiles.register()` then
`settings.load_profile("ci")`.
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings

PROFILES = ("dev", "ci")
DEFAULT_PROFILE = "dev"

_registered = False


def register() -> None:
    """Register the `dev` and `ci` profiles with hypothesis (idempotent)."""
    global _registered
    if _registered:
        return
    common = dict(
        deadline=None,
        print_blob=True,
        report_multiple_bugs=False,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.differing_executors],
    )
    settings.register_profile("dev", max_examples=150, **common)
    settings.register_profile("ci", max_examples=50, derandomize=True, database=None, **common)
    _registered = True


def get(name: str) -> settings:
    """The settings object of profile `name` (ValueError for an unknown name)."""
    register()
    if name not in PROFILES:
        raise ValueError(f"profile must be one of {PROFILES}, got {name!r}")
    return settings.get_profile(name)
