"""The spec calls the scheduler model's spec shares with the lockstep's reference
(harness/targets/spec_journal.py): sharing changes no outcome and no state, a call on another state
or with other arguments is computed, and a deliberate bug in the model is still an ``agreement``
finding of the fuzz, which shares them."""

from __future__ import annotations

from typing import Any

import pytest

from kvspec.harness.bench.lockstep import pool_runs
from kvspec.harness.targets.spec import SpecTarget
from kvspec.harness.targets.spec_journal import SpecJournal
from tests.vllm_sched.model_bugs import forget_frees_on_preemption


def test_sharing_changes_no_outcome_and_no_state() -> None:
    config, ops = pool_runs(actions=120)[1024]
    journal = SpecJournal()
    first, second, alone = SpecTarget(), SpecTarget(), SpecTarget()
    first.journal = second.journal = journal
    for t in (first, second, alone):
        t.reset(config)
    second.state = first.state  # equal values: the second finds the first's calls
    for op in ops:
        outs = [t.apply(op) for t in (first, second, alone)]
        assert outs[0] == outs[1] == outs[2], op
        assert first.state == second.state == alone.state
    assert journal.hits > 0 and journal.misses > 0
    assert first.observe() == second.observe() == alone.observe()


def test_a_call_on_another_state_or_with_other_arguments_is_computed() -> None:
    journal, calls = SpecJournal(), []

    def fn(state: Any, n: int) -> tuple[Any, int]:
        calls.append(n)
        return state, n

    a, b = ["state"], ["state"]  # equal, not the same object
    assert journal.call(fn, a, 1) == (a, 1)
    assert journal.call(fn, a, 1) == (a, 1)  # from the journal
    assert journal.call(fn, a, 2) == (a, 2)
    assert journal.call(fn, b, 1) == (b, 1)
    assert calls == [1, 2, 1] and journal.hits == 1
    journal.clear()
    journal.call(fn, a, 1)
    assert calls == [1, 2, 1, 1]


@pytest.mark.vllm
def test_a_model_bug_is_still_an_agreement_finding_of_the_fuzz(monkeypatch: pytest.MonkeyPatch) -> None:
    """The model forgets to free on preemption (as tests/vllm_sched/test_agreement.py): its spec then
    makes calls on states the reference never had, computed, and the fuzz reports the difference."""
    pytest.importorskip("vllm", reason="needs the real vLLM 0.33.0 (ci/setup --vllm)")
    from kvspec.harness.vllm_sched.fuzz import one_run, run_seed

    forget_frees_on_preemption(monkeypatch)
    kinds = []
    for i in range(6):
        res = one_run("full", run_seed(0, i), max_engine_steps=120)
        if res.finding is not None:
            kinds.append((res.finding.finding.kind, res.finding.finding.message))
    assert kinds, "six runs of small pools and no preemption at all?"
    assert all(kind == "agreement" for kind, _ in kinds), kinds
    assert any("only the real calls free" in message for _, message in kinds), kinds
