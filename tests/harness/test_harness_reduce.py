"""Trace reduction (``harness.traces.reduce``): smaller traces that still end in the same finding."""

from pathlib import Path

import pytest

from kvspec.harness.check.lockstep import Finding
from kvspec.harness.check.settings import CheckSettings
from kvspec.harness.core import ops as O
from kvspec.harness.core.scheduler_contract import get_contract_problem, get_pad_allowance
from kvspec.harness.mutants.spec import make_mutant
from kvspec.harness.targets.spec import SpecTarget
from kvspec.harness.traces.reduce import reduce_trace, run_ops, same_finding
from kvspec.harness.traces.trace import read_trace

CORPUS = sorted((Path(__file__).parents[1] / "corpus").glob("*.json"))


SLOW = {"cache_drafts", "hits_not_touched"}  # 5-7 s each: the full tier


@pytest.mark.parametrize(
    "path",
    [pytest.param(p, marks=pytest.mark.full) if p.stem in SLOW else p for p in CORPUS],
    ids=[p.stem for p in CORPUS],
)
def test_reduced_trace_keeps_the_finding_and_is_no_longer(path):
    trace = read_trace(path)
    mutant = lambda: make_mutant(path.stem)  # noqa: E731 - the corpus file is named after its bug
    found, _ = run_ops(trace.config, trace.ops, mutant, CheckSettings(relation=trace.relation))
    assert found is not None
    red = reduce_trace(trace.config, trace.ops, found, mutant, CheckSettings(relation=trace.relation), seconds=20)
    assert len(red.ops) <= len(trace.ops) and red.config.num_blocks <= trace.config.num_blocks
    again, steps = run_ops(red.config, red.ops, mutant, CheckSettings(relation=trace.relation))
    assert again is not None and same_finding(again, found)
    assert len(steps) == len(red.ops)  # the finding is at the last operation
    clean, _ = run_ops(red.config, red.ops, SpecTarget, CheckSettings(relation=trace.relation))
    assert clean is None, "the reduced trace must be valid: the spec against itself finds nothing"
    # ... and one a scheduler could send, every request in it used.
    assert get_contract_problem(red.config, red.ops, get_pad_allowance(trace.ops)) is None


def test_reduction_removes_what_does_not_matter():
    """Unrelated requests and operations around a finding are dropped."""
    trace = read_trace(next(p for p in CORPUS if p.stem == "free_order_appended"))
    noise = [O.AddRequest("noise", (3, 3, 3)), O.GetComputedBlocks("noise"), O.SetStatus("noise", "RUNNING")]
    ops = noise + list(trace.ops)
    mutant = lambda: make_mutant("free_order_appended")  # noqa: E731
    found, _ = run_ops(trace.config, ops, mutant, CheckSettings(relation=trace.relation))
    assert found is not None
    red = reduce_trace(trace.config, ops, found, mutant, seconds=20)
    assert not any(getattr(op, "request_id", None) == "noise" for op in red.ops)


def test_reduction_drops_what_requests_carry_beyond_their_tokens():
    """A salt and an adapter that do not matter to the finding are dropped."""
    import dataclasses

    trace = read_trace(next(p for p in CORPUS if p.stem == "free_order_appended"))
    ops = [
        dataclasses.replace(op, cache_salt="tenant-a", lora=("ad", "/p")) if isinstance(op, O.AddRequest) else op
        for op in trace.ops
    ]
    mutant = lambda: make_mutant("free_order_appended")  # noqa: E731
    found, _ = run_ops(trace.config, ops, mutant, CheckSettings(relation=trace.relation))
    assert found is not None
    red = reduce_trace(trace.config, ops, found, mutant, seconds=20)
    adds = [op for op in red.ops if isinstance(op, O.AddRequest)]
    assert adds and all(op.cache_salt is None and op.lora is None for op in adds), adds


def test_a_trace_without_its_finding_is_refused():
    trace = read_trace(CORPUS[0])
    fake = Finding("divergence", 0, "outcome differs: invented", {"op": "add_request"})
    with pytest.raises(ValueError, match="does not replay to its finding"):
        reduce_trace(trace.config, trace.ops, fake, SpecTarget, seconds=5)


def test_same_finding_tells_findings_apart():
    msg = "outcome differs: block_ids: expected [[1, 2]], got [[2]]"
    a = Finding("divergence", 3, msg, {"op": "allocate_slots"})
    other_numbers = "outcome differs: block_ids: expected [[7]], got [[3, 5, 6]]"
    assert same_finding(a, Finding("divergence", 9, other_numbers, {"op": "allocate_slots"}))
    assert not same_finding(
        a, Finding("divergence", 3, "outcome differs: expected success, got None", {"op": "allocate_slots"})
    )
    assert not same_finding(
        a, Finding("divergence", 3, "state differs after the operation: x", {"op": "allocate_slots"})
    )
    assert not same_finding(a, Finding("divergence", 3, msg, {"op": "free"}))
    assert not same_finding(a, Finding("invariant", 3, msg, {"op": "allocate_slots"}, invariant="i"))


def test_a_finding_of_the_spec_itself_is_reduced_too():
    """``kvspec mutants``' ``self`` mode: the spec carries the bug, so the spec against itself breaks
    the invariant at the failing step too; the reduction still cuts the unrelated requests."""
    from kvspec.harness.mutants.spec import patched_spec

    trace = read_trace(next(p for p in CORPUS if p.stem == "free_order_appended"))
    noise = [O.AddRequest("noise", (3, 3, 3)), O.GetComputedBlocks("noise"), O.SetStatus("noise", "RUNNING")]
    ops = noise + list(trace.ops)
    with patched_spec("free_order_appended", keep=("kvspec.spec.invariants",)):
        found, _ = run_ops(trace.config, ops, SpecTarget, CheckSettings(relation=trace.relation))
        assert found is not None and found.kind == "reference-invariant"
        red = reduce_trace(trace.config, ops, found, SpecTarget, CheckSettings(relation=trace.relation), seconds=20)
        again, steps = run_ops(red.config, red.ops, SpecTarget, CheckSettings(relation=trace.relation))
    assert len(red.ops) < len(ops) and not any(getattr(op, "request_id", None) == "noise" for op in red.ops)
    assert again is not None and same_finding(again, found) and len(steps) == len(red.ops)


def test_the_spec_exception_is_only_for_its_own_finding():
    """The exception is for the finding being reduced, a ``reference-invariant`` one, at the last
    operation: a target's finding is never reduced to a trace the spec itself rejects."""
    from kvspec.harness.mutants.spec import patched_spec
    from kvspec.harness.traces.reduce import is_valid_trace

    trace = read_trace(next(p for p in CORPUS if p.stem == "free_order_appended"))
    with patched_spec("free_order_appended", keep=("kvspec.spec.invariants",)):
        found, steps = run_ops(trace.config, trace.ops, SpecTarget, CheckSettings(relation=trace.relation))
        assert found is not None and found.kind == "reference-invariant"
        ops = [op for op, _ in steps]
        assert is_valid_trace(trace.config, ops, found)
        assert not is_valid_trace(trace.config, ops)
        as_target = Finding("invariant", found.step, found.message, found.op, invariant=found.invariant)
        assert not is_valid_trace(trace.config, ops, as_target)
        assert not is_valid_trace(trace.config, [*ops, ops[-1]], found)  # not at the last operation


def test_a_target_kind_of_finding_the_spec_shares_is_an_invalid_trace(monkeypatch):
    """Only a ``reference-invariant`` finding may be the spec's own: when the spec against itself
    also ends in, say, the same KV-ledger finding, the trace is bad input, not a reduction."""
    import kvspec.harness.traces.reduce as R

    trace = read_trace(CORPUS[0])
    ops = list(trace.ops)
    for kind in ("kv-ledger", "invariant", "reference-raised"):
        shared = Finding(kind, len(ops) - 1, "the same message", {"op": ops[-1].op})
        monkeypatch.setattr(R, "run_ops", lambda *a, shared=shared, **k: (shared, [(op, None) for op in ops]))
        assert not R.is_valid_trace(trace.config, ops, shared), kind
