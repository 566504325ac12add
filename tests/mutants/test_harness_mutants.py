"""Every deliberate bug must be reported within the ``ci`` profile, as a divergence or invariant."""

import pytest

from kvspec.harness.mutants.spec import MUTANTS, make_mutant

pytestmark = pytest.mark.mutant


SLOW = {"cache_drafts", "hits_not_touched"}
"""8-10 s each to find from scratch: the full tier (every tier replays their corpus traces, which must
still catch them: tests/corpus)."""


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.full) if n in SLOW else n for n in sorted(MUTANTS)])
def test_mutant_is_reported(name, machine_run):
    kw = {"examples": None, "seed": 11, "shrink_seconds": 5, "profile": "ci", "expect": "finding"}
    stats = machine_run(MUTANTS[name].family, lambda: make_mutant(name), f"mutant:{name}", **kw)
    assert stats.finding is not None, f"mutant {name} was not reported"
    assert stats.finding.kind in ("divergence", "invariant"), stats.finding.summary()


def test_spec_itself_is_not_reported_in_the_mutant_families(machine_run):
    """The control: the same runs against the unmutated spec find nothing."""
    from kvspec.harness.targets.spec import SpecTarget

    for family in sorted({m.family for m in MUTANTS.values()}):
        machine_run(family, SpecTarget, "spec", examples=10, seed=11, shrink_seconds=5)
