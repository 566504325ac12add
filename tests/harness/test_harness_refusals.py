"""A family whose examples the target refuses (``Unsupported`` after reset) until Hypothesis gives up
is skipped with how many it refused and why, and the run goes on; giving up with no refusal at all
is kvspec's own fault and still raises (harness/check/machine.py, ``run_machine``)."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis.errors import Unsatisfiable

from kvspec.harness.check.machine import RunStats, make_machine, run_machine
from kvspec.harness.check.settings import CheckSettings
from kvspec.harness.core import ops as O
from kvspec.harness.targets.base import Unsupported
from kvspec.harness.targets.spec import SpecTarget

WHY = "this manager allocates nothing"


class RefusesAllocation(SpecTarget):
    def apply(self, op: O.Op) -> object:
        if isinstance(op, O.AllocateSlots):
            raise Unsupported(WHY)
        return super().apply(op)


def run(factory: object, stats: RunStats) -> None:
    machine = make_machine("full", factory, "refusing", CheckSettings(relation="invariants"), stats)  # type: ignore[arg-type]
    run_machine(machine, settings(max_examples=20, deadline=None, database=None), seed=1, shrink_seconds=1)


def test_a_family_refused_until_hypothesis_gives_up_is_skipped_with_the_reason() -> None:
    stats = RunStats()
    run(RefusesAllocation, stats)  # returns: no exception
    why = stats.skipped["full"]
    assert why.startswith("Hypothesis gave up: the target refused") and why.endswith(f"because: {WHY}"), why
    assert stats.events["full:refused"] == 1


def test_giving_up_with_no_refusal_still_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    import kvspec.harness.check.machine as machine

    def give_up(*args: object, **kwargs: object) -> None:
        raise Unsatisfiable("no example satisfied kvspec's own filters")

    monkeypatch.setattr(machine, "_run", give_up)
    with pytest.raises(Unsatisfiable):
        run(SpecTarget, RunStats())


def test_under_the_invariants_relation_a_request_op_the_book_rejects_is_a_finding() -> None:
    """With no reference spec, the request book stands in for it: an operation on a request never
    added is a ``reference-raised`` finding (the reducer's candidates drop ``add_request``s and
    must see this as "not the same finding"), never a crash of the check."""
    from kvspec.harness.check.finding import FindingError
    from kvspec.harness.check.lockstep import Lockstep
    from kvspec.spec.config import KVCacheConfig, full_attention

    ls = Lockstep(KVCacheConfig(8, (full_attention(4),), 32), SpecTarget(), CheckSettings(relation="invariants"))
    ls.start()
    with pytest.raises(FindingError) as e:
        ls.apply(O.SetNumComputedTokens("ghost", 1))
    assert e.value.finding.kind == "reference-raised" and "never" not in e.value.finding.message
    assert "unknown request 'ghost'" in e.value.finding.message
