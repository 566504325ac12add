"""Spec vs spec, every family: the lockstep machine must never report anything.

A report here is a bug in the spec, in its invariants or in the harness' scheduler model (which
must only emit call sequences a real vLLM 0.33 scheduler makes)."""

import pytest

from harness.check.machine import RunStats, make_machine, run_machine
from harness.check.settings import CheckSettings
from harness.run.profiles import profile_settings
from harness.targets.spec import SpecTarget
from harness.world.families import FAMILIES

pytestmark = pytest.mark.statemachine


@pytest.mark.parametrize("family", FAMILIES)
def test_spec_vs_spec_never_diverges(family):
    stats = RunStats()
    cls = make_machine(family, SpecTarget, "spec", CheckSettings(), stats)
    try:
        run_machine(cls, profile_settings("dev", max_examples=15, database=None), seed=2024, shrink_seconds=20)
    except Exception:
        pytest.fail(stats.finding.summary() if stats.finding else "the machine raised without a finding")
    assert stats.examples > 0 and stats.steps > 0
