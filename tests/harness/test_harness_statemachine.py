"""Spec vs spec, every family: the lockstep machine must never report anything.

A report here is a bug in the spec, in its invariants or in the harness' scheduler model (which
must only emit call sequences a real vLLM 0.33 scheduler makes)."""

import pytest

from kvspec.harness.targets.spec import SpecTarget
from kvspec.harness.world.families import FAMILIES

pytestmark = pytest.mark.statemachine


@pytest.mark.parametrize("family", FAMILIES)
def test_spec_vs_spec_never_diverges(family, machine_run):
    stats = machine_run(family, SpecTarget, "spec")
    assert stats.examples > 0 and stats.steps > 0
