"""The world's checks and the agreement in every ``--target vllm-scheduler`` run
(harness/vllm_sched/world_checks.py, harness/ledger/world.py, harness/vllm_sched/mirror.py): each has a
deliberate scheduler bug that it alone catches (with it off, the same runs are clean), and a finding
of theirs is written as a report that re-drives the real scheduler."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="needs the real vLLM (ci/setup --vllm)")

from kvspec.harness.ledger.world import WorldFacts  # noqa: E402
from kvspec.harness.mutants.vllm_scheduler import MUTANTS, ONLY_BY, patched  # noqa: E402
from kvspec.harness.vllm_sched.fuzz import one_run, run_seed  # noqa: E402
from kvspec.spec.kv_ledger import KVLedger, write_slot  # noqa: E402
from kvspec.spec.types import BlockId  # noqa: E402

pytestmark = pytest.mark.vllm

RUNS = 12  # seeded runs of 150 engine steps each, as tests/vllm_sched/test_vllm_sched_mutants.py
OFF = {
    "world-facts": {"world_facts": False},
    "conservation": {"conservation": False},
    "agreement": {"agreement": False},
}
KIND = {"world-facts": "kv-ledger", "conservation": "conservation", "agreement": "agreement"}
ONLY = sorted(name for name, m in MUTANTS.items() if m.intended in ONLY_BY)


def test_every_world_check_has_its_mutant() -> None:
    assert sorted(MUTANTS[name].intended or "" for name in ONLY) == sorted(ONLY_BY)


@pytest.mark.parametrize("name", ONLY)
def test_only_its_check_catches_the_mutant(name: str) -> None:
    m = MUTANTS[name]
    assert m.intended is not None
    with patched(name):
        for i in range(RUNS):
            res = one_run(m.family, run_seed(0, i), max_engine_steps=150)
            if res.finding is not None:
                break
        assert res.finding is not None, f"{name} survived {RUNS} runs of {m.family}"
        assert res.finding.finding.kind == KIND[m.intended], res.finding.finding.summary()
        for j in range(i + 1):  # the same runs with that check off: nothing else sees the bug
            other = one_run(m.family, run_seed(0, j), max_engine_steps=150, **OFF[m.intended])  # type: ignore[arg-type]
            assert other.finding is None, f"run {j}: {other.finding.finding.summary()}"


def test_agreement_report_has_both_call_sequences_and_replays(tmp_path: Path) -> None:
    from kvspec.harness.cli import main
    from kvspec.harness.run.catalogue import resolve
    from kvspec.harness.run.fuzzing import run_fuzz
    from kvspec.harness.run.options import FuzzOptions
    from kvspec.harness.traces.report import write_report
    from kvspec.harness.traces.trace import trace_from_json

    opts = FuzzOptions(target="mutant:budget_one_short", families=("full",), seconds=60, seed=0, reduce_seconds=5.0)
    res = run_fuzz(opts, resolve(opts.target))  # its first run is run_seed(0, 0)
    assert res.trace is not None and res.trace["finding"]["kind"] == "agreement", res.stopped
    dest = write_report(tmp_path, trace_from_json(res.trace))
    finding = json.loads((dest / "trace.json").read_text())["finding"]
    assert finding["expected"] and finding["actual"] and finding["expected"] != finding["actual"]
    assert {c["phase"] for c in finding["actual"]} <= {"world", "schedule", "update"}
    assert main(["replay", str(dest), "--target", "mutant:budget_one_short"]) == 1
    assert main(["replay", str(dest), "--target", "vllm-scheduler"]) == 0  # the bug gone, the run agrees
    assert main(["replay", str(dest)]) == 0  # the recorded target: re-drive the real scheduler, not the ops
    (test_file,) = dest.glob("test_replay_*.py")
    assert "replay_recorded" in test_file.read_text()  # replayed by the recorded target's driver


def test_world_facts_gate_connector_writes() -> None:
    ledger = KVLedger()
    write_slot(ledger, BlockId(3), 0, object())  # type: ignore[arg-type]
    facts = WorldFacts(ledger)
    assert not facts.is_delivered("r", 5, delayed=True)  # an asynchronous load not reported finished
    facts.finished("r")
    assert facts.is_delivered("r", 5, delayed=True)
    facts.invalid([3])
    assert BlockId(3) not in ledger.held and not facts.is_delivered("r", 3, delayed=False)
    facts.renewed([3])
    assert facts.is_delivered("r", 3, delayed=False)
    facts.started("r")
    assert not facts.is_delivered("r", 5, delayed=True)


def test_appended_tokens_must_be_sampled() -> None:
    facts = WorldFacts(KVLedger())
    facts.sampled({"a": (4, 7), "b": (5,)})
    assert facts.appended_problem("a", (4,)) is None  # a stop keeps a prefix
    assert facts.appended_problem("b", (6,)) is not None
    assert facts.appended_problem("c", (1,)) is not None  # nothing sampled for it


def test_load_facts_catch_failed_blocks_believed_loaded() -> None:
    """The connector's failed blocks as ledger facts: a scheduler that ignores them is a kv-ledger
    finding with the agreement off (it is one for the agreement too), and nothing without the facts."""
    with patched("invalid_blocks_ignored"):
        for i in range(RUNS):
            res = one_run("connector", run_seed(0, i), max_engine_steps=150, agreement=False)
            if res.finding is not None:
                break
        assert res.finding is not None and res.finding.finding.kind == "kv-ledger", "survived"
        for j in range(i + 1):
            other = one_run("connector", run_seed(0, j), max_engine_steps=150, agreement=False, world_facts=False)
            assert other.finding is None, f"run {j}: {other.finding.finding.summary()}"
