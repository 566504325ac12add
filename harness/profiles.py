"""Hypothesis profiles for the harness: ``dev`` (quick), ``ci`` (the mutant catch budget), ``nightly``.

All share one example database under ``.hypothesis/examples`` (override with ``KVSPEC_DB``), so a
CI job that caches that folder re-tries past failures first.  Deadlines are off: a slow target is
caught by the harness' per-step timeout, not by Hypothesis.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings
from hypothesis.database import DirectoryBasedExampleDatabase

PROFILES = {
    "dev": dict(max_examples=30, stateful_step_count=40),
    "ci": dict(max_examples=500, stateful_step_count=50),
    "nightly": dict(max_examples=2000, stateful_step_count=80),
}


def database() -> DirectoryBasedExampleDatabase:
    return DirectoryBasedExampleDatabase(os.environ.get("KVSPEC_DB", ".hypothesis/examples"))


def profile_settings(name: str, **overrides: object) -> settings:
    """Settings of profile ``name`` (``ValueError`` for an unknown one), with ``overrides``."""
    if name not in PROFILES:
        raise ValueError(f"unknown profile {name!r} (known: {', '.join(PROFILES)})")
    kw: dict[str, object] = dict(
        deadline=None,
        report_multiple_bugs=False,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
        database=database(),
        print_blob=False,
    )
    kw.update(PROFILES[name])
    kw.update(overrides)
    return settings(**kw)  # type: ignore[arg-type]


for _name in PROFILES:
    settings.register_profile(f"kvspec-{_name}", profile_settings(_name))
