"""Reducing a finding of the real scheduler's fuzz by re-driving it with simpler inputs
(``harness.vllm_sched.reduce``): the reduced run is shorter, ends in the same finding, and its
report replays to it, overrides included; overrides in a report are checked as data."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from kvspec.harness.vllm_sched.reduce import OverriddenChoices, overrides_from_json, overrides_to_json
from kvspec.harness.world.workload import SeededChoices


def _draws(ch: object) -> list[int]:
    return [ch.integer(0, 9, label) for label in ("arrivals", "max_tokens", "arrivals", "stop", "arrivals")]  # type: ignore[attr-defined]


def test_an_override_replaces_its_draw_and_keeps_the_others() -> None:
    plain = _draws(SeededChoices(random.Random(3)))
    ch = OverriddenChoices(SeededChoices(random.Random(3)), {("arrivals", 1): 0, ("stop", 0): 99})
    got = _draws(ch)
    # arrivals #1 is the third draw; stop #0 is clamped to the draw's range; the rest are the seed's.
    assert got == [plain[0], plain[1], 0, 9, plain[4]]
    assert ch.counts == {"arrivals": 3, "max_tokens": 1, "stop": 1}


@pytest.mark.parametrize(
    "bad",
    [
        "nope",
        [["arrivals", 0]],
        [["block_size", 0, 1]],  # a config draw: not one a reduction replaces
        [["arrivals", -1, 0]],
        [["arrivals", 0, True]],
        [["arrivals", 0, 10**7]],
    ],
)
def test_overrides_in_a_report_are_checked_as_data(bad: object) -> None:
    with pytest.raises(ValueError, match="extra.choice_overrides"):
        overrides_from_json(bad, "trace.json")


def test_overrides_round_trip() -> None:
    ov = {("arrivals", 3): 0, ("abort", 0): 1}
    assert overrides_from_json(json.loads(json.dumps(overrides_to_json(ov))), "t") == ov
    assert overrides_from_json(None, "t") == {}


@pytest.mark.vllm
def test_a_scheduler_finding_is_reduced_and_its_report_replays(tmp_path: Path) -> None:
    pytest.importorskip("vllm", reason="needs the real vLLM 0.33.0 (ci/setup --vllm)")
    from kvspec.harness.run.catalogue import resolve
    from kvspec.harness.run.fuzzing import run_fuzz
    from kvspec.harness.run.options import FuzzOptions
    from kvspec.harness.traces.trace import trace_from_json
    from kvspec.harness.vllm_sched.fuzz import replay_scheduler_run

    name = "freed_kept_running"
    opts = FuzzOptions(target=f"mutant:{name}", families=("full",), seconds=60, seed=0, reduce_seconds=10)
    res = run_fuzz(opts, resolve(opts.target))  # the scheduler driver of the one loop, the mutant patched in
    assert res.trace is not None, res.stopped
    trace = trace_from_json(res.trace)
    red = trace.extra["scheduler_reduction"]
    assert trace.extra["choice_overrides"] and red["steps_after"] < red["steps_before"] == res.shrunk_steps
    replayed = replay_scheduler_run(trace, "trace.json", mutant=name)
    assert not replayed.ok and "the recorded finding" in replayed.message
    assert replayed.steps_run == red["steps_after"]  # the reduced run, overrides applied, not the original
    assert replay_scheduler_run(trace, "trace.json").ok  # the correct scheduler: the finding is gone


@pytest.mark.vllm
def test_replay_refuses_doctored_overrides(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A report's overrides are data: a bad entry is exit 2 naming the field, before any run."""
    pytest.importorskip("vllm", reason="needs the real vLLM 0.33.0 (ci/setup --vllm)")
    from kvspec.harness.cli import main
    from kvspec.harness.mutants.vllm_scheduler import patched
    from kvspec.harness.traces.report import write_report
    from kvspec.harness.vllm_sched.fuzz import finding_trace, one_run, run_seed

    with patched("hit_off_by_one"):
        res = one_run("full", run_seed(0, 0), max_engine_steps=150)
    assert res.finding is not None
    dest = write_report(tmp_path, finding_trace(res, "full", run_seed(0, 0), overrides={("stop", 0): 1}))
    trace = json.loads((dest / "trace.json").read_text())
    assert trace["extra"]["choice_overrides"] == [["stop", 0, 1]]
    doctored = tmp_path / "doctored.json"
    doctored.write_text(json.dumps({**trace, "extra": {**trace["extra"], "choice_overrides": [["block_size", 0, 1]]}}))
    assert main(["replay", str(doctored), "--target", "vllm-scheduler"]) == 2
    assert "extra.choice_overrides[0]" in capsys.readouterr().err


@pytest.mark.vllm
@pytest.mark.full  # about 10 s; a scheduler finding's reduction and replay stay in the default tier (above)
def test_an_agreement_finding_is_reduced_where_it_happened_and_its_report_replays(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An agreement finding (only re-driving the real scheduler reproduces it) is reduced like any
    other: a candidate that still differs in the same engine step counts (a reduction that let a
    candidate run only the steps before it kept none of them: this finding can come no sooner),
    and the reduced report replays to the finding."""
    pytest.importorskip("vllm", reason="needs the real vLLM 0.33.0 (ci/setup --vllm)")
    from kvspec.harness.run.catalogue import resolve
    from kvspec.harness.run.fuzzing import run_fuzz
    from kvspec.harness.run.options import FuzzOptions
    from kvspec.harness.traces.trace import trace_from_json
    from kvspec.harness.vllm_sched.fuzz import replay_scheduler_run
    from tests.vllm_sched.model_bugs import drop_frees_in_engine_step

    drop_frees_in_engine_step(monkeypatch, at=30)
    opts = FuzzOptions(target="vllm-scheduler", families=("full",), seconds=60, seed=0, reduce_seconds=10)
    res = run_fuzz(opts, resolve(opts.target))
    assert res.trace is not None, res.stopped
    trace = trace_from_json(res.trace)
    assert trace.finding is not None and trace.finding["kind"] == "agreement"
    assert "engine step 30: update: only the real calls free" in trace.finding["message"]
    red = trace.extra["scheduler_reduction"]
    assert trace.extra["choice_overrides"] and red["steps_after"] < red["steps_before"] == res.shrunk_steps
    assert len(trace.steps) == red["steps_after"] and trace.extra["engine_steps"] == 30
    replayed = replay_scheduler_run(trace, "trace.json")
    assert not replayed.ok and "the recorded finding" in replayed.message
    assert replayed.steps_run == red["steps_after"]
