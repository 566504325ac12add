"""``kvspec fuzz`` never loses a finding and never prints a traceback for bad usage or a signal.

- every bad option (a numeric one out of range, nan or inf; an ``--out`` or ``--junit-xml`` that cannot
  be written) exits 2 before any work, naming the option;
- SIGINT and SIGTERM stop the run cleanly (130, 143): a finding already made, even one still being
  shrunk or reduced, is written as a complete, replayable report (the smallest trace so far);
- ``--seconds`` bounds the whole run, shrinking and reduction included;
- a report that cannot be written under ``--out`` after all goes to the system temp dir;
- report folders are readable by other users (not ``mkdtemp``'s 0700);
- a target (factory) raising ``SystemExit`` is a finding or a usage error, never a silent exit 0.

The subprocess tests wait for the line ``kvspec fuzz`` prints at the first finding before signalling,
with ``--shrink-seconds`` large enough that the run is surely still shrinking then.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import kvspec.harness.run.fuzzing
import kvspec.harness.run.workers
import kvspec.harness.traces.reduce
import kvspec.harness.traces.report
from kvspec.harness.check.settings import CheckSettings
from kvspec.harness.cli import main
from kvspec.harness.mutants.spec import make_mutant
from kvspec.harness.traces.replay import replay
from kvspec.harness.traces.trace import read_trace

ROOT = Path(__file__).resolve().parents[2]
BUG = ["--target", "mutant:hit_cap_num_tokens", "--family", "full"]  # found within about a second
FOUND = "found a failing example"


# --- bad usage: exit 2 before any work ---------------------------------------------------------------

BAD = [
    # (extra arguments, the option named, a fragment of the message); {file} is an existing file
    (["--out", "{file}"], "--out", "is a file, not a folder"),
    (["--out", "{file}/reports"], "--out", "is a file, not a folder"),
    (["--out", ""], "--out", "empty"),
    (["--junit-xml", "{file}/junit.xml"], "--junit-xml", "is a file, not a folder"),
    (["--junit-xml", "{dir}"], "--junit-xml", "not a file name"),
    (["--junit-xml", ""], "--junit-xml", "not a file name"),
    (["--seconds", "nan"], "--seconds", "got nan"),
    (["--seconds", "inf"], "--seconds", "got inf"),
    (["--seconds", "0"], "--seconds", "> 0"),
    (["--seconds", "-5"], "--seconds", "> 0"),
    (["--step-timeout", "-1"], "--step-timeout", "got -1"),
    (["--step-timeout", "nan"], "--step-timeout", "got nan"),
    (["--step-timeout", "inf"], "--step-timeout", "got inf"),
    (["--step-timeout", "0"], "--step-timeout", "> 0"),
    (["--step-timeout", "1e12"], "--step-timeout", "<= 86400"),
    (["--batch", "0"], "--batch", ">= 1"),
    (["--batch", "-3"], "--batch", ">= 1"),
    (["--shrink-seconds", "-1"], "--shrink-seconds", ">= 0"),
    (["--shrink-stall", "-1"], "--shrink-stall", ">= 0"),
    (["--shrink-seconds", "nan"], "--shrink-seconds", "invalid int value"),
    (["--reduce-seconds", "-1"], "--reduce-seconds", ">= 0"),
    (["--reduce-seconds", "nan"], "--reduce-seconds", "got nan"),
    (["--reduce-seconds", "inf"], "--reduce-seconds", "got inf"),
    (["--workers", "0"], "--workers", "must be >= 1"),
    (["--workers", "-2"], "--workers", ">= 1"),
    (["--workers", "100000"], "--workers", "<= 256"),
    (["--seed", "nan"], "--seed", "invalid int value"),
]


@pytest.fixture
def no_fuzzing(monkeypatch, tmp_path):
    """Fail the test if fuzzing starts; run in ``tmp_path`` (so a default ``--out`` would show there)."""

    def started(*args, **kwargs):
        raise AssertionError("fuzzing started despite a usage error")

    monkeypatch.setattr(kvspec.harness.run.fuzzing, "run_fuzz", started)
    monkeypatch.setattr(kvspec.harness.run.workers, "fuzz_workers", started)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a-file").write_text("not a folder\n")
    (tmp_path / "a-dir").mkdir()


@pytest.mark.parametrize("extra, option, fragment", BAD, ids=[" ".join(b[0]) or "empty" for b in BAD])
def test_bad_usage_exits_2_before_any_work(no_fuzzing, tmp_path, capsys, extra, option, fragment):
    args = [a.format(file=tmp_path / "a-file", dir=tmp_path / "a-dir") for a in extra]
    before = sorted(p.name for p in tmp_path.iterdir())
    t0 = time.monotonic()
    assert main(["fuzz", *BUG, "--out", str(tmp_path / "reports"), *args]) == 2
    err = capsys.readouterr().err
    assert option in err and fragment in err, err
    assert "Traceback" not in err
    assert time.monotonic() - t0 < 10
    assert sorted(p.name for p in tmp_path.iterdir()) == before, "a usage error wrote something"


def test_bad_out_message_names_the_path(no_fuzzing, tmp_path, capsys):
    assert main(["fuzz", *BUG, "--out", str(tmp_path / "a-file" / "deeper" / "reports")]) == 2
    err = capsys.readouterr().err
    assert f"--out '{tmp_path / 'a-file' / 'deeper' / 'reports'}'" in err and str(tmp_path / "a-file") in err


def test_out_check_leaves_nothing_behind(no_fuzzing, tmp_path, capsys):
    """The writability probe creates the folder and a temp file, and removes both again: the check
    passes (fuzzing would start, here the stub says so) and no folder is left."""
    with pytest.raises(AssertionError, match="fuzzing started"):
        main(["fuzz", *BUG, "--out", str(tmp_path / "new" / "reports"), "--seconds", "1"])
    assert not (tmp_path / "new").exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a chmod 0500 folder anyway (tests run as root here)")
def test_unwritable_out_exits_2(no_fuzzing, tmp_path, capsys):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    assert main(["fuzz", *BUG, "--out", str(locked / "reports")]) == 2
    assert "cannot create it or write in it" in capsys.readouterr().err


# --- SystemExit from a target ------------------------------------------------------------------------

FACTORIES = """
    import sys
    from kvspec.harness.targets.spec import SpecTarget

    calls = 0

    def exits_at_load():
        sys.exit(0)

    def exits_later():
        global calls
        calls += 1
        if calls > 1:
            raise SystemExit(0)
        return SpecTarget()

    class ExitingTarget(SpecTarget):
        def apply(self, op):
            raise SystemExit(0)

    def exits_in_apply():
        return ExitingTarget()
"""


@pytest.fixture
def factories(tmp_path, monkeypatch):
    (tmp_path / "kvspec_exit_factories.py").write_text(textwrap.dedent(FACTORIES))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    yield "kvspec_exit_factories"
    sys.modules.pop("kvspec_exit_factories", None)


def test_factory_exiting_at_load_is_a_usage_error(factories, capsys):
    assert main(["fuzz", "--target", f"{factories}:exits_at_load", "--family", "full", "--seconds", "2"]) == 2
    err = capsys.readouterr().err
    assert "SystemExit" in err and "Traceback" not in err


@pytest.mark.parametrize("factory", ["exits_later", "exits_in_apply"])
def test_target_exiting_later_is_a_finding(factories, tmp_path, capsys, factory):
    argv = ["fuzz", "--target", f"{factories}:{factory}", "--family", "full", "--seconds", "3", "--out", "r"]
    assert main([*argv, "--shrink-seconds", "1", "--reduce-seconds", "1", "--db", str(tmp_path / "db")]) == 1
    out = capsys.readouterr().out
    assert "FOUND target-raised" in out and "SystemExit" in out
    assert len(list((tmp_path / "r").glob("*/trace.json"))) == 1


# --- reports: permissions, and a place to go when --out fails after all --------------------------------


def run_bug_in_process(tmp_path: Path, *extra: str) -> int:
    argv = ["fuzz", *BUG, "--seconds", "2", "--shrink-seconds", "1", "--reduce-seconds", "1"]
    return main([*argv, "--db", str(tmp_path / "db"), "--out", str(tmp_path / "reports"), *extra])


def test_report_folder_is_readable_by_others(tmp_path, capsys):
    old = os.umask(0o022)
    try:
        assert run_bug_in_process(tmp_path) == 1
    finally:
        os.umask(old)
    (report,) = (tmp_path / "reports").iterdir()
    assert report.stat().st_mode & 0o777 == 0o755
    assert (tmp_path / "reports").stat().st_mode & 0o005 == 0o005
    files = list(report.iterdir())
    assert len(files) == 3 and all(f.stat().st_mode & 0o777 == 0o644 for f in files)


def test_report_goes_to_the_temp_dir_when_out_fails_later(tmp_path, monkeypatch, capsys):
    """Disk full (or the folder removed) after the check: the finding is written under the temp dir."""
    real = kvspec.harness.traces.report.write_report
    reports = tmp_path / "reports"

    def full_disk(out_dir, trace, name=None, replace=False):
        if Path(out_dir) == reports:
            raise OSError(28, "No space left on device")
        return real(out_dir, trace, name, replace)

    monkeypatch.setattr(kvspec.harness.traces.report, "write_report", full_disk)
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    assert run_bug_in_process(tmp_path) == 1
    out, err = capsys.readouterr()
    assert "No space left on device" in err and "wrote it to" in err
    (report,) = (tmp_path / "tmp").glob("kvspec-reports-*/*")
    assert str(report) in err and str(report) in out
    assert {p.name for p in report.iterdir()} >= {"trace.json", "report.md"}


# --- signals --------------------------------------------------------------------------------------


def start_fuzz(tmp_path: Path, *args: str) -> tuple[subprocess.Popen[bytes], Path, Path]:
    out, err = tmp_path / "stdout", tmp_path / "stderr"
    cmd = [
        sys.executable,
        "-m",
        "kvspec.harness",
        "fuzz",
        *args,
        "--db",
        str(tmp_path / "db"),
        "--out",
        str(tmp_path / "r"),
    ]
    with out.open("wb") as o, err.open("wb") as e:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=o, stderr=e)
    return proc, out, err


def wait_for_line(proc: subprocess.Popen[bytes], path: Path, needle: str, timeout: float = 30.0) -> None:
    end = time.monotonic() + timeout
    while needle not in path.read_text():
        assert proc.poll() is None, f"exited {proc.returncode} before {needle!r}: {path.read_text()}"
        assert time.monotonic() < end, f"no {needle!r} within {timeout}s: {path.read_text()}"
        time.sleep(0.05)


def finish(proc: subprocess.Popen[bytes], out: Path, err: Path) -> tuple[int, str, str]:
    try:
        rc = proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    return rc, out.read_text(), err.read_text()


def assert_replayable_report(tmp_path: Path, stdout: str) -> None:
    """One complete report folder whose trace replays to the same kind of finding (``kvspec replay``: exit 1)."""
    (report,) = (tmp_path / "r").iterdir()
    names = {p.name for p in report.iterdir()}
    assert {"trace.json", "report.md"} <= names and any(n.startswith("test_replay_") for n in names), names
    assert str(report) in stdout
    kind = json.loads((report / "trace.json").read_text())["finding"]["kind"]
    replay_cmd = [sys.executable, "-m", "kvspec.harness", "replay", str(report)]
    r = subprocess.run(replay_cmd, cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 1 and f"FAIL {report}" in r.stdout and f": {kind} at " in r.stdout, r.stdout + r.stderr


@pytest.mark.parametrize(
    "sig, code, workers",
    [(signal.SIGINT, 130, "1"), (signal.SIGTERM, 143, "2")],
    ids=["SIGINT-one-process", "SIGTERM-two-workers"],
)
def test_signal_while_shrinking_writes_the_finding(tmp_path, sig, code, workers):
    long_shrink = ("--shrink-seconds", "600", "--shrink-stall", "1000000")  # surely still shrinking at the signal
    proc, out, err = start_fuzz(tmp_path, *BUG, "--seconds", "60", *long_shrink, "--workers", workers)
    wait_for_line(proc, err, FOUND)
    t0 = time.monotonic()
    proc.send_signal(sig)
    rc, stdout, stderr = finish(proc, out, err)
    assert rc == code, stdout + stderr
    assert time.monotonic() - t0 < 20
    assert "Traceback" not in stderr, stderr
    assert f"interrupted by {sig.name}" in stdout and "report written to" in stdout, stdout
    assert_replayable_report(tmp_path, stdout)


def test_signal_before_any_finding(tmp_path):
    proc, out, err = start_fuzz(tmp_path, "--target", "spec", "--family", "full", "--seconds", "60")
    wait_for_line(proc, err, "kvspec fuzz: target spec")
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    rc, stdout, stderr = finish(proc, out, err)
    assert rc == 130 and "Traceback" not in stderr, stdout + stderr
    (line,) = stdout.splitlines()
    assert "interrupted by SIGINT" in line and "no finding" in line and " steps" in line
    assert not (tmp_path / "r").exists()


def test_signal_while_reducing_writes_the_reduced_so_far(tmp_path, monkeypatch, capsys):
    """In process, deterministic: SIGINT arrives at the reducer's third candidate replay; the reducer
    stops there and the report holds its trace so far, which still replays to the finding."""
    real, calls = kvspec.harness.traces.reduce.run_ops, []

    def signalling_run_ops(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            os.kill(os.getpid(), signal.SIGINT)
        return real(*args, **kwargs)

    monkeypatch.setattr(kvspec.harness.traces.reduce, "run_ops", signalling_run_ops)
    # --seconds 60 (not 2): on a loaded machine the finding may come after 2 s, leaving the reducer no time.
    assert run_bug_in_process(tmp_path, "--seconds", "60", "--reduce-seconds", "600", "--in-process") == 130
    stdout = capsys.readouterr().out
    assert "interrupted by SIGINT" in stdout and "report written to" in stdout
    assert 3 <= len(calls) <= 6, "the reducer went on after the signal"
    (report,) = (tmp_path / "reports").iterdir()
    result = replay(read_trace(report / "trace.json"), lambda: make_mutant("hit_cap_num_tokens"))
    assert not result.ok and result.finding is not None and result.finding.kind == "divergence"


def test_the_best_so_far_is_the_shortest_failing_trace():
    """What a signal during shrinking writes: the shortest trace recorded, not merely the latest."""
    from kvspec.harness.check.lockstep import Finding
    from kvspec.harness.check.machine import RunStats, _record_finding

    trace = read_trace(ROOT / "tests" / "corpus" / "hit_cap_num_tokens.json")
    stats, seen = RunStats(), []
    stats.on_finding = lambda finding, bound: seen.append(finding.message)
    for n in (5, 3, 4):
        _record_finding(stats, Finding("divergence", n - 1, f"{n} steps"), trace.steps[:n], trace.config)
    assert stats.finding is not None and stats.finding.message == "4 steps"  # the latest
    assert stats.best is not None and stats.best[0].message == "3 steps" and len(stats.best[1]) == 3
    assert seen == ["5 steps"]  # announced once, at the first


def test_reducer_stops_when_told():
    trace = read_trace(ROOT / "tests" / "corpus" / "hit_cap_num_tokens.json")
    mutant = lambda: make_mutant("hit_cap_num_tokens")  # noqa: E731
    found, _ = kvspec.harness.traces.reduce.run_ops(
        trace.config, trace.ops, mutant, CheckSettings(relation=trace.relation)
    )
    assert found is not None
    red = kvspec.harness.traces.reduce.reduce_trace(
        trace.config, trace.ops, found, mutant, seconds=600, should_stop=lambda: True
    )
    assert red.replays == 1 and red.seconds < 5  # only the first replay, which checks the finding


# --- --seconds bounds the wall time ------------------------------------------------------------------


def test_seconds_bounds_shrinking_and_reduction(tmp_path):
    t0 = time.monotonic()
    slow = ("--shrink-seconds", "60", "--shrink-stall", "1000000", "--reduce-seconds", "60")
    proc, out, err = start_fuzz(tmp_path, *BUG, "--seconds", "3", *slow)
    rc, stdout, stderr = finish(proc, out, err)
    assert rc == 1 and "Traceback" not in stderr, stdout + stderr
    assert time.monotonic() - t0 < 25, "shrinking or reduction ran past --seconds"
    assert "report written to" in stdout
    (report,) = (tmp_path / "r").iterdir()
    assert (report / "trace.json").exists()


@pytest.mark.parametrize("value", ["abc", "nan MiB"])
def test_a_bad_memory_bound_in_the_environment_is_a_usage_error(no_fuzzing, tmp_path, capsys, monkeypatch, value):
    """``KVSPEC_TARGET_MEMORY_MB`` (kvspec.harness.check.memory_guard) is checked with the options, before any work."""
    monkeypatch.setenv("KVSPEC_TARGET_MEMORY_MB", value)
    assert main(["fuzz", *BUG, "--out", str(tmp_path / "reports")]) == 2
    err = capsys.readouterr().err
    assert "KVSPEC_TARGET_MEMORY_MB" in err and "Traceback" not in err, err


@pytest.mark.parametrize("command", ["fuzz", "replay"])
@pytest.mark.parametrize("value", ["0", "every", "-1"])
def test_a_bad_full_check_cadence_is_a_usage_error(no_fuzzing, tmp_path, capsys, monkeypatch, command, value):
    """``KVSPEC_FULL_CHECK_EVERY`` (kvspec.harness.core.glimpse) is checked with the options, before any work."""
    monkeypatch.setenv("KVSPEC_FULL_CHECK_EVERY", value)
    argv = ["fuzz", *BUG, "--out", str(tmp_path / "reports")] if command == "fuzz" else ["replay", "tests/corpus"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "KVSPEC_FULL_CHECK_EVERY" in err and "Traceback" not in err, err
    assert not (tmp_path / "reports").exists()
