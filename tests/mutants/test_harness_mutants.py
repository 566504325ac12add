"""Every deliberate bug must be reported within the ``ci`` profile, as a divergence or invariant."""

import pytest

from harness.check.machine import RunStats, make_machine, run_machine
from harness.check.settings import CheckSettings
from harness.mutants.spec import MUTANTS, make_mutant
from harness.run.profiles import profile_settings

pytestmark = pytest.mark.mutant


@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_mutant_is_reported(name):
    stats = RunStats()
    cls = make_machine(MUTANTS[name].family, lambda: make_mutant(name), f"mutant:{name}", CheckSettings(), stats)
    with pytest.raises(AssertionError):  # FindingError is an AssertionError
        run_machine(cls, profile_settings("ci", database=None), seed=11, shrink_seconds=5)
    assert stats.finding is not None, f"mutant {name} was not reported"
    assert stats.finding.kind in ("divergence", "invariant"), stats.finding.summary()


def test_spec_itself_is_not_reported_in_the_mutant_families():
    """The control: the same runs against the unmutated spec find nothing."""
    from harness.targets.spec import SpecTarget

    for family in sorted({m.family for m in MUTANTS.values()}):
        stats = RunStats()
        cls = make_machine(family, SpecTarget, "spec", CheckSettings(), stats)
        try:
            run_machine(cls, profile_settings("dev", max_examples=10, database=None), seed=11, shrink_seconds=5)
        except Exception:
            pytest.fail(stats.finding.summary() if stats.finding else "raised without a finding")
