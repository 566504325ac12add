"""Each safety rule has a deliberate bug that breaks it, and the same schedule leaves the safe
design unbroken (harness/pd/scenarios.py); every rule in the registry is covered."""

import pytest

from kvspec.harness.pd.designs import BUGS, resolve_design
from kvspec.harness.pd.invariants import PD_INVARIANTS
from kvspec.harness.pd.scenarios import SCENARIOS, play


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_bug_breaks_its_rule_and_the_safe_design_does_not(name):
    sc = SCENARIOS[name]
    _, broken = play(sc.design, sc.actions, sc.options, names=[sc.invariant])
    assert broken is not None and broken.name == sc.invariant, f"{name} did not break {sc.invariant}"
    _, safe = play(sc.safe, sc.actions, sc.options)
    assert safe is None, f"{sc.safe.name} broke {safe} on the schedule of {name}"


def test_every_rule_has_a_deliberate_bug():
    assert {b.invariant for b in BUGS.values()} == set(PD_INVARIANTS)
    assert {f"bug:{b}" for b in BUGS} <= set(SCENARIOS)


def test_release_on_cancel_is_unsafe_by_the_shortest_schedule():
    sc = SCENARIOS["bug:release-on-cancel"]
    _, v = play(sc.design, sc.actions, sc.options)
    assert v is not None and v.name == "write_lands_in_held_block"
    assert len(sc.actions) == 10


def test_resolve_design():
    assert resolve_design("bug:no-fence").fence_on_peer_failure is False
    with pytest.raises(ValueError, match="unknown design"):
        resolve_design("bug:nope")
