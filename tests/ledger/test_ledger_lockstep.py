"""The ledger inside ``harness.check.lockstep`` (on by default): a ``kv-ledger`` finding with a stable,
matchable description, rendered and replayed like any other; ``--no-ledger`` turns it off."""

from __future__ import annotations

import pytest
from ledger_cases import CANDIDATES, FULL_LOAD, FULL_LOAD_OPS

from kvspec.harness.check.lockstep import FindingError, Lockstep
from kvspec.harness.check.settings import CheckSettings
from kvspec.harness.cli import _parser
from kvspec.harness.ledger.finding import match_vllm_033_candidate
from kvspec.harness.run.options import FuzzOptions
from kvspec.harness.targets.base import Unsupported
from kvspec.harness.targets.impl import ImplTarget
from kvspec.harness.targets.spec import SpecTarget
from kvspec.harness.traces.replay import replay
from kvspec.harness.traces.report import render_report, write_report
from kvspec.harness.traces.trace import Trace, read_trace


def run_lockstep(ops, config, target, **kw):
    ls = Lockstep(config, target, CheckSettings(strict_known=True, **kw))  # known vLLM bugs raise here
    ls.start()
    for op in ops:
        ls.apply(op)
    return ls


def test_the_ledger_finding_of_a_lockstep_run():
    with pytest.raises(FindingError) as e:
        run_lockstep(FULL_LOAD_OPS, FULL_LOAD, SpecTarget())
    f = e.value.finding
    assert f.kind == "kv-ledger" and f.invariant == "kv_write_in_real_block" and f.step == len(FULL_LOAD_OPS) - 1
    ledger = f.witness["ledger"]
    assert match_vllm_033_candidate(ledger["signature"]) == "window_full_remote_load"
    assert f.message.startswith(ledger["description"])
    assert ledger["description"] == (
        "kv_write_in_real_block: chunked_local(C=1, bs=1), prompt 2 tokens, position from external load, "
        "recomputed after full remote load"
    )
    assert "## KV ledger" in (f.kv_markdown or "") and "target_after" in f.witness


@pytest.mark.parametrize("candidate", sorted(CANDIDATES))
def test_candidates_are_kv_ledger_findings_in_lockstep(candidate):
    config, ops = CANDIDATES[candidate]
    with pytest.raises(FindingError) as e:
        run_lockstep(ops, config, SpecTarget())
    assert e.value.finding.kind == "kv-ledger"
    assert match_vllm_033_candidate(e.value.finding.witness["ledger"]["signature"]) == candidate


@pytest.mark.parametrize("candidate", sorted(CANDIDATES))
def test_impl_refuses_the_candidates_in_lockstep(candidate):
    """impl refuses each candidate's input (impl/allocator/refusals.py): ``Unsupported``, which the
    state machine takes as an example to discard, never a finding."""
    config, ops = CANDIDATES[candidate]
    with pytest.raises(Unsupported, match="^impl refuses K[123]:"):
        run_lockstep(ops, config, ImplTarget())


def test_report_and_replay(tmp_path, monkeypatch):
    ls = Lockstep(FULL_LOAD, SpecTarget(), CheckSettings(strict_known=True))
    ls.start()
    with pytest.raises(FindingError) as e:
        for op in FULL_LOAD_OPS:
            ls.apply(op)
    trace = Trace(FULL_LOAD, ls.steps, finding=e.value.finding.to_json())
    path = write_report(tmp_path, trace)
    text = (path / "report.md").read_text()
    assert "## KV ledger" in text and "kv_write_in_real_block" in text
    assert render_report(read_trace(path / "trace.json")) == text
    strict = CheckSettings(strict_known=True)  # the replay must see the known bug as a finding
    result = replay(read_trace(path / "trace.json"), SpecTarget, strict)
    assert not result.ok and result.finding is not None and result.finding.kind == "kv-ledger"


def test_the_ledger_can_be_turned_off(monkeypatch):
    run_lockstep(FULL_LOAD_OPS, FULL_LOAD, SpecTarget(), ledger=False)  # no finding
    assert run_lockstep(FULL_LOAD_OPS[:1], FULL_LOAD, SpecTarget(), ledger=False).kv_ledger is None
    monkeypatch.setenv("KVSPEC_LEDGER", "0")  # the old variable: nothing reads the environment below the CLI
    assert run_lockstep(FULL_LOAD_OPS[:1], FULL_LOAD, SpecTarget()).kv_ledger is not None
    assert FuzzOptions(no_ledger=True).checks().ledger is False  # --no-ledger reaches every lockstep this way


def test_cli_flag():
    assert _parser().parse_args(["fuzz", "--no-ledger"]).no_ledger
    assert not _parser().parse_args(["fuzz"]).no_ledger
