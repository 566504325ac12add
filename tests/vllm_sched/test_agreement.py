"""kvspec's scheduler model against vLLM's real scheduler (harness/vllm_sched/agreement.py): on the
families where the model is complete, the same inputs give the same manager calls, step for step;
a deliberate bug in the model shows up as a difference naming the step and both calls; the
relation tolerates only what it says (calls of different requests interleaved in the output
step) and nothing else."""

from __future__ import annotations

import pytest

from kvspec.harness.core import ops as O
from kvspec.harness.world.scheduler import Scheduler
from kvspec.harness.world.transfer import KVTransfers

pytest.importorskip("vllm", reason="needs the real vLLM 0.33.0 (ci/setup --vllm)")

from kvspec.harness.vllm_sched.agreement import compare_run, main  # noqa: E402
from kvspec.harness.vllm_sched.driver import SCHED_FAMILIES  # noqa: E402
from kvspec.harness.vllm_sched.fuzz import run_seed  # noqa: E402
from kvspec.harness.vllm_sched.mirror import compare_step  # noqa: E402
from tests.vllm_sched.model_bugs import forget_frees_on_preemption  # noqa: E402

pytestmark = pytest.mark.vllm

# Every family; connector runs differ now and then in the named ways (docs/vllm-scheduler.md), not in these.
AGREEING = SCHED_FAMILIES


@pytest.mark.parametrize("family", AGREEING)
def test_model_makes_the_real_schedulers_manager_calls(family: str) -> None:
    for i in range(3):
        res = compare_run(family, run_seed(0, i), max_engine_steps=120)
        assert res.difference is None, res.detail
        assert res.steps_agreed == 120 and res.calls_agreed == res.calls > 0


def test_a_model_that_forgets_to_free_on_preemption_differs(monkeypatch: pytest.MonkeyPatch) -> None:
    forget_frees_on_preemption(monkeypatch)
    found = [compare_run("full", run_seed(0, i), max_engine_steps=120) for i in range(6)]
    differing = [r for r in found if r.difference is not None]
    assert differing, "six runs of small pools and no preemption at all?"
    assert any(r.difference == "schedule: only the real calls free" for r in differing), [
        r.difference for r in differing
    ]
    assert all(r.detail.startswith(f"step {r.steps_agreed}: ") for r in differing)


def test_a_model_that_pads_a_decode_behind_an_admission_differs(monkeypatch: pytest.MonkeyPatch) -> None:
    # vLLM 0.33 pads a one-token admission to 1 + k only when the running loop scheduled a request
    # (or the request has computed tokens); a model that pads it when the running loop scheduled
    # nothing pads where vLLM does not.
    original = Scheduler._admit_waiting

    def admit(self: Scheduler, budget: int, scheduled: dict[str, int], padded: set[str], prefill: bool) -> None:
        if not scheduled:
            scheduled["a request admitted just before"] = 0
            original(self, budget, scheduled, padded, prefill)
            del scheduled["a request admitted just before"]
        else:
            original(self, budget, scheduled, padded, prefill)

    monkeypatch.setattr(Scheduler, "_admit_waiting", admit)
    kinds = {compare_run("spec_decode", run_seed(0, i), max_engine_steps=150).difference for i in range(8)}
    assert "schedule: allocate_slots differs in num_new_tokens" in kinds, kinds


def test_a_model_that_sets_nothing_aside_for_a_load_differs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(KVTransfers, "reservation", lambda self, inflight_prefills, reqs: 0)
    kinds = {compare_run("connector", run_seed(0, i), max_engine_steps=150).difference for i in range(3)}
    assert kinds == {"schedule: allocate_slots differs in reserved_blocks"}, kinds


def _alloc(rid: str, n: int) -> O.AllocateSlots:
    return O.AllocateSlots(rid, n)


def test_the_relation_orders_frees_and_each_requests_calls_only() -> None:
    real = [("update", O.CacheBlocks("a", 4)), ("update", O.Free("a")), ("update", O.CacheBlocks("b", 8))]
    interleaved = [("update", O.CacheBlocks("a", 4)), ("update", O.CacheBlocks("b", 8)), ("update", O.Free("a"))]
    assert compare_step(real, interleaved) is None
    two_frees = [("update", O.Free("a")), ("update", O.Free("b"))]
    diff = compare_step(two_frees, list(reversed(two_frees)))
    assert diff is not None and diff.kind == "update: the order of frees: free differs in request_id"
    diff = compare_step(real, real[:2])
    assert diff is not None and diff.kind == "update: only the real calls cache_blocks"
    # Before and in schedule(), order across requests counts.
    sched = [("schedule", _alloc("a", 1)), ("schedule", _alloc("b", 1))]
    diff = compare_step(sched, list(reversed(sched)))
    assert diff is not None and diff.kind == "schedule: allocate_slots differs in request_id"
    diff = compare_step(sched, [("schedule", _alloc("a", 2)), sched[1]])
    assert diff is not None and diff.kind == "schedule: allocate_slots differs in num_new_tokens"
    # A call in another phase is a difference, even with the same calls overall.
    moved = [("world", O.Free("a"))]
    assert compare_step(moved, [("schedule", O.Free("a"))]) is not None


def test_cli_prints_the_figure(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--family", "full", "--seconds", "2", "--steps", "40", "--seed", "3"]) == 0
    out = capsys.readouterr().out
    assert "agree whole" in out and "full " in out
    with pytest.raises(SystemExit):
        main(["--family", "nope"])


def test_cli_exits_1_when_it_shows_a_difference(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # A check that prints a difference and exits 0 is a silent green.
    monkeypatch.setattr(KVTransfers, "reservation", lambda self, inflight_prefills, reqs: 0)
    assert main(["--family", "connector", "--seconds", "1", "--steps", "150", "--seed", "0"]) == 1
    assert "first difference x" in capsys.readouterr().out


def test_an_async_load_holding_another_loads_invalid_block_fails_as_in_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    # vLLM 0.33 _handle_invalid_blocks scans the asynchronous loads before the running requests: a
    # load still pending whose prefix hit holds a block a synchronous load reports invalid is
    # truncated and fails on arrival.  Found by a 10-minute clean run (connector, this run seed),
    # where the real scheduler freed the request at arrival and the model cached its blocks.
    seed = 7557762028972791337
    assert (res := compare_run("connector", seed, max_engine_steps=200)).difference is None, res.detail
    monkeypatch.setattr(KVTransfers, "_poison_holders", lambda self, invalid, recompute, holding: [])
    res = compare_run("connector", seed, max_engine_steps=200)
    assert res.difference == "schedule: real free / model cache_blocks", res.detail
