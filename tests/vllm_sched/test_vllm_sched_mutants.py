"""Every deliberate scheduler bug (harness/mutants/vllm_scheduler.py) is caught by the proxy lockstep
within a few seeded runs of its family, and the correct scheduler passes the same seeds; a manager
bug driven by the real scheduler is caught too; a finding's report replays on spec and vllm."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="needs the real vLLM 0.33.0 (ci/setup --vllm)")

from kvspec.harness.mutants.vllm_scheduler import MUTANTS, patched  # noqa: E402
from kvspec.harness.vllm_sched.fuzz import finding_trace, one_run, run_seed  # noqa: E402

pytestmark = pytest.mark.vllm

RUNS = 12  # seeded runs of 150 engine steps each; every mutant is caught within them


def _first_finding(family: str, mutant: str | None, **checks: bool) -> tuple[int, object]:
    for i in range(RUNS):
        if mutant is None:
            res = one_run(family, run_seed(0, i), max_engine_steps=150, **checks)
        else:
            with patched(mutant):
                res = one_run(family, run_seed(0, i), max_engine_steps=150, **checks)
        if res.finding is not None:
            return i, res
    return -1, None


@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_scheduler_mutant_caught_and_control_clean(name: str) -> None:
    m = MUTANTS[name]
    i, res = _first_finding(m.family, name)
    assert i >= 0, f"scheduler mutant {name} ({m.doc}) survived {RUNS} runs of {m.family}"
    control = one_run(m.family, run_seed(0, i), max_engine_steps=150)
    assert control.finding is None, control.finding.finding.summary()


def test_manager_mutant_caught_through_real_scheduler() -> None:
    from kvspec.harness.mutants import vllm as mutants_vllm

    with mutants_vllm.patched("vllm_free_order_appended"):
        i, res = _first_finding("full", None)
    assert i >= 0
    assert res.finding.finding.kind == "divergence"  # type: ignore[attr-defined]


def test_unknown_mutant_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="unknown scheduler mutant"):
        with patched("no_such_bug"):
            pass


def test_report_of_a_finding_replays(tmp_path: Path) -> None:
    """A lockstep finding's operations reproduce it on spec and vllm (an agreement finding, which the
    model may meet first, re-drives the real scheduler instead: tests/vllm_sched/test_world_checks.py)."""
    from kvspec.harness.cli import main
    from kvspec.harness.traces.report import write_report

    with patched("computed_kept_on_preempt"):
        i, res = _first_finding("full", "computed_kept_on_preempt", agreement=False)
    assert i >= 0
    dest = write_report(tmp_path, finding_trace(res, "full", run_seed(0, i)))  # type: ignore[arg-type]
    assert (dest / "trace.json").is_file() and (dest / "report.md").is_file()
    assert main(["replay", str(dest), "--target", "spec"]) == 1
    assert main(["replay", str(dest), "--target", "vllm"]) == 1


def test_fuzz_cli_with_scheduler_mutant_writes_report_that_replays(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from kvspec.harness.cli import main

    out = tmp_path / "reports"
    args = ["fuzz", "--target", "mutant:freed_kept_running", "--family", "full", "--seconds", "20"]
    assert main([*args, "--out", str(out)]) == 1
    assert "report written to" in capsys.readouterr().out
    (dest,) = out.iterdir()
    assert main(["replay", str(dest)]) == 1  # the recorded target (vllm) is built in
    assert main(["replay", str(dest), "--target", "spec"]) == 1


def test_replay_re_drives_the_real_scheduler(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--target vllm-scheduler re-runs the recorded scheduler run (family, run seed, engine steps):
    under the same scheduler bug it ends in the recorded finding; on the correct scheduler it ends
    clean; a trace that records no scheduler run is refused (exit 2), as is a doctored step count."""
    import json

    from kvspec.harness.cli import main

    out = tmp_path / "reports"
    args = ["fuzz", "--target", "mutant:computed_kept_on_preempt", "--family", "full", "--seconds", "30"]
    assert main([*args, "--out", str(out), "--reduce-seconds", "2"]) == 1
    (dest,) = out.iterdir()
    capsys.readouterr()
    assert main(["replay", str(dest), "--target", "mutant:computed_kept_on_preempt"]) == 1
    assert "FAIL" in (text := capsys.readouterr().out) and "the recorded finding after" in text, text
    assert main(["replay", str(dest), "--target", "vllm-scheduler"]) == 0
    assert "no finding" in capsys.readouterr().out
    trace = json.loads((dest / "trace.json").read_text())
    doctored = tmp_path / "doctored.json"
    doctored.write_text(json.dumps({**trace, "extra": {**trace["extra"], "engine_steps": -1}}))
    assert main(["replay", str(doctored), "--target", "vllm-scheduler"]) == 2
    assert "engine_steps" in capsys.readouterr().err
    plain = tmp_path / "plain.json"
    plain.write_text(json.dumps({k: v for k, v in trace.items() if k != "extra"}))
    assert main(["replay", str(plain), "--target", "vllm-scheduler"]) == 2
    assert "not recorded by --target vllm-scheduler" in capsys.readouterr().err
