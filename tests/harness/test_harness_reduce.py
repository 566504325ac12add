"""Trace reduction (``harness.traces.reduce``): smaller traces that still end in the same finding."""

from pathlib import Path

import pytest

from harness.check.lockstep import Finding
from harness.core import ops as O
from harness.mutants.spec import make_mutant
from harness.targets.spec import SpecTarget
from harness.traces.reduce import reduce_trace, run_ops, same_finding
from harness.traces.trace import read_trace

CORPUS = sorted((Path(__file__).parents[1] / "corpus").glob("*.json"))


@pytest.mark.parametrize("path", CORPUS, ids=[p.stem for p in CORPUS])
def test_reduced_trace_keeps_the_finding_and_is_no_longer(path):
    trace = read_trace(path)
    mutant = lambda: make_mutant(path.stem)  # noqa: E731 - the corpus file is named after its bug
    found, _ = run_ops(trace.config, trace.ops, mutant, trace.relation)
    assert found is not None
    red = reduce_trace(trace.config, trace.ops, found, mutant, trace.relation, seconds=20)
    assert len(red.ops) <= len(trace.ops) and red.config.num_blocks <= trace.config.num_blocks
    again, steps = run_ops(red.config, red.ops, mutant, trace.relation)
    assert again is not None and same_finding(again, found)
    assert len(steps) == len(red.ops)  # the finding is at the last operation
    clean, _ = run_ops(red.config, red.ops, SpecTarget, trace.relation, ledger=True)
    assert clean is None, "the reduced trace must be valid: the spec against itself finds nothing"


def test_reduction_removes_what_does_not_matter():
    """Unrelated requests and operations around a finding are dropped."""
    trace = read_trace(next(p for p in CORPUS if p.stem == "free_order_appended"))
    noise = [O.AddRequest("noise", (3, 3, 3)), O.GetComputedBlocks("noise"), O.SetStatus("noise", "RUNNING")]
    ops = noise + list(trace.ops)
    mutant = lambda: make_mutant("free_order_appended")  # noqa: E731
    found, _ = run_ops(trace.config, ops, mutant, trace.relation)
    assert found is not None
    red = reduce_trace(trace.config, ops, found, mutant, seconds=20)
    assert not any(getattr(op, "request_id", None) == "noise" for op in red.ops)


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
