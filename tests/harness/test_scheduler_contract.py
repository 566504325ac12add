"""What a scheduler could send (``harness.core.scheduler_contract``): each bound fails on a trace
that breaks it, the world's scheduler keeps every bound in every family, and the reducer no longer
reaches traces the spec accepts but no scheduler sends (with the bounds off, it did, on two corpus
traces)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvspec.harness.check.settings import CheckSettings
from kvspec.harness.core import ops as O
from kvspec.harness.core.scheduler_contract import get_contract_problem, get_pad_allowance
from kvspec.harness.mutants.spec import make_mutant
from kvspec.harness.targets.spec import SpecTarget
from kvspec.harness.traces import reduce as R
from kvspec.harness.traces.trace import read_trace
from kvspec.harness.world.families import FAMILIES, configs, workload_features
from kvspec.harness.world.workload import run_seeded
from kvspec.spec.config import KVCacheConfig, full_attention

CORPUS = Path(__file__).parents[1] / "corpus"
CONFIG = KVCacheConfig(9, (full_attention(4),), 8)  # max_model_len 8


def _prefill(rid: str, prompt: int, new: int, **kw: int) -> list[O.Op]:
    return [O.AddRequest(rid, tuple(range(1, prompt + 1))), O.GetComputedBlocks(rid), O.AllocateSlots(rid, new, **kw)]


def test_a_trace_a_scheduler_makes_is_clean():
    ops = [*_prefill("r", 5, 5), O.SetNumComputedTokens("r", 5), O.AppendOutputTokens("r", (7,))]
    ops += [O.AllocateSlots("r", 1), O.Free("r")]
    assert get_contract_problem(CONFIG, ops) is None


@pytest.mark.parametrize(
    ("ops", "allowance", "problem"),
    [
        (_prefill("r", 9, 9), 0, "step 0: r's prompt of 9 tokens exceeds max_model_len 8"),
        # 6 computed + 3 new: the allocation runs past the model's length.
        (
            [*_prefill("r", 6, 6), O.SetNumComputedTokens("r", 6), O.AppendOutputTokens("r", (1, 2, 3))]
            + [O.AllocateSlots("r", 3)],
            0,
            "step 5: allocate_slots(r) reaches 9 tokens, past max_model_len 8",
        ),
        # The case: a 1-token prompt allocating 3 new tokens.
        (_prefill("r", 1, 3), 0, "step 2: allocate_slots(r) schedules 3 new tokens where the request has 1 left"),
        (_prefill("r", 1, 4), 2, "schedules 4 new tokens where the request has 1 left (and 2 of padding)"),
        ([*_prefill("r", 2, 2), O.AddRequest("idle", (5,))], 0, "request idle is added and never used"),
    ],
    ids=["prompt-past-model", "allocation-past-model", "more-than-the-request-has", "past-the-padding", "unused"],
)
def test_each_bound_fails_on_its_violation(ops, allowance, problem):
    found = get_contract_problem(CONFIG, ops, allowance)
    assert found is not None and problem in found, found


def test_a_padded_decode_is_allowed_as_far_as_the_original_padded():
    ops = _prefill("r", 1, 3)  # a one-token decode padded with two draft slots
    assert get_pad_allowance(ops) == 2
    assert get_contract_problem(CONFIG, ops, get_pad_allowance(ops)) is None


def test_an_unused_request_is_allowed_while_reducing():
    ops = [*_prefill("r", 2, 2), O.AddRequest("idle", (5,))]
    assert get_contract_problem(CONFIG, ops, require_used=False) is None


@pytest.mark.parametrize("family", FAMILIES)
def test_the_worlds_scheduler_keeps_the_bounds(family):
    @settings(max_examples=20, database=None, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(configs(family), st.integers(0, 2**16))
    def check(config: KVCacheConfig, seed: int) -> None:
        ops: list[O.Op] = []
        run_seeded(
            SpecTarget(), config, seed, 60, on_op=lambda op, _: ops.append(op), features=workload_features(family)
        )
        assert get_contract_problem(config, ops, get_pad_allowance(ops), require_used=False) is None

    check()


@pytest.mark.parametrize("bounds", ["on", "off"])
def test_the_reducer_keeps_the_bounds(bounds, monkeypatch):
    """``hits_not_touched`` reduces, against the spec alone, to a 4-token prompt with
    ``max_model_len`` 1; with the bounds, to a trace a scheduler could send."""
    if bounds == "off":
        monkeypatch.setattr(R._Reducer, "is_schedulable", lambda self, config, ops: True)
    trace = read_trace(CORPUS / "hits_not_touched.json")
    mutant = lambda: make_mutant("hits_not_touched")  # noqa: E731 - the corpus file is named after its bug
    checks = CheckSettings(relation=trace.relation)
    found, _ = R.run_ops(trace.config, trace.ops, mutant, checks)
    assert found is not None
    red = R.reduce_trace(trace.config, trace.ops, found, mutant, checks, seconds=10)
    problem = get_contract_problem(red.config, red.ops, get_pad_allowance(trace.ops))
    if bounds == "on":
        assert problem is None, problem
        assert len(red.ops) < len(trace.ops)
    else:
        assert problem is not None and "exceeds max_model_len" in problem, problem
