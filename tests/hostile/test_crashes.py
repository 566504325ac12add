"""A target that crashes its process is a finding with a replayable report, never a lost run.

Each case runs ``kvspec fuzz`` (or ``mutants``, ``replay``) as a subprocess on a target of
``tests/hostile/kvspec_crashy.py``: a segfault, ``os._exit``, ``abort`` or closed standard streams in
the factory, ``reset``, an operation or ``observe``; with ``--workers 2``; after a finding was made
and while it is being reduced.  Each must exit 1 with a report whose trace replays to the crash
(``kvspec replay`` exits 1 naming it, and does not crash itself).  The deliberate bug is
``--in-process``: the same target run without the supervisor takes the run down (exit 139, no report).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvspec.harness.core import ops as O
from kvspec.harness.core.flight import FlightRecorder, read_flight

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def kvspec(*argv: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    e = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), str(ROOT)]), **(env or {})}
    cmd = [sys.executable, "-m", "kvspec.harness", *argv]
    return subprocess.run(cmd, capture_output=True, text=True, env=e, cwd=ROOT, timeout=timeout, check=False)


def fuzz(tmp_path: Path, target: str, *extra: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    argv = ["fuzz", "--target", f"kvspec_crashy:{target}", "--family", "full", "--seconds", "30", "--seed", "1"]
    return kvspec(*argv, "--out", str(tmp_path / "out"), "--db", str(tmp_path / "db"), *extra, env=env)


def the_report(tmp_path: Path) -> Path:
    (report,) = (tmp_path / "out").iterdir()
    return report


def no_traceback(run: subprocess.CompletedProcess[str]) -> None:
    assert "Traceback" not in run.stdout + run.stderr, run.stdout + run.stderr


@pytest.mark.parametrize(
    ("target", "how"),
    [
        ("segv_apply", "killed by SIGSEGV"),
        ("exit_apply", "exited with status 3"),
        pytest.param("abort_apply", "killed by SIGABRT", marks=pytest.mark.full),
        pytest.param("segv_reset", "killed by SIGSEGV", marks=pytest.mark.full),
        ("exit_observe", "exited with status 3"),
    ],
)
def test_a_crash_is_a_finding_whose_trace_replays_to_it(tmp_path: Path, target: str, how: str) -> None:
    run = fuzz(tmp_path, target)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "FOUND target-crashed" in run.stdout and how in run.stdout
    no_traceback(run)
    report = the_report(tmp_path)
    trace = json.loads((report / "trace.json").read_text())
    assert trace["finding"]["kind"] == "target-crashed"
    if target == "segv_apply":  # dies at the third allocate_slots: the reduced trace ends with it
        ops = [s["op"] for s in trace["steps"]]
        assert ops[-1] == "allocate_slots" and ops.count("allocate_slots") == 3
    replayed = kvspec("replay", str(report), "--target", f"kvspec_crashy:{target}")
    assert replayed.returncode == 1 and "target-crashed" in replayed.stdout, replayed.stdout + replayed.stderr
    no_traceback(replayed)
    clean = kvspec("replay", str(report), "--target", "kvspec_crashy:plain")
    assert clean.returncode == 0, clean.stdout + clean.stderr  # a valid run: only the crash fails it


def test_the_deliberate_bug_in_process_loses_the_run(tmp_path: Path) -> None:
    run = fuzz(tmp_path, "segv_apply", "--in-process")
    assert run.returncode == -11  # SIGSEGV took the run: what the supervisor prevents
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_closed_standard_streams_are_a_finding(tmp_path: Path) -> None:
    run = fuzz(tmp_path, "close_apply")
    assert run.returncode == 1, run.stdout + run.stderr
    assert (the_report(tmp_path) / "trace.json").exists()


@pytest.mark.full
def test_a_crash_in_the_factory_is_said(tmp_path: Path) -> None:
    run = fuzz(tmp_path, "segv_factory")
    assert run.returncode != 0 and "SIGSEGV" in run.stdout + run.stderr, run.stdout + run.stderr
    no_traceback(run)


def test_a_keyboard_interrupt_of_the_targets_own_is_no_stop(tmp_path: Path) -> None:
    """Raised by the target with no signal behind it: a finding (in an operation) or a usage error (in
    its factory at load), not "interrupted by SIGINT" and exit 130 as before."""
    run = fuzz(tmp_path, "interrupt_apply")
    assert run.returncode == 1 and "FOUND target-raised" in run.stdout and "KeyboardInterrupt" in run.stdout, run.stdout
    run = fuzz(tmp_path, "interrupt_factory")
    assert run.returncode == 2 and "raised KeyboardInterrupt of its own" in run.stderr, run.stdout + run.stderr


def test_a_finding_survives_a_crash_while_it_is_reduced(tmp_path: Path) -> None:
    mark = tmp_path / "mark"
    run = fuzz(tmp_path, "diverge_then_segv", "--relation", "exact", env={"KVSPEC_CRASHY_MARK": str(mark)})
    assert mark.exists()
    assert run.returncode == 1, run.stdout + run.stderr
    assert "kept unreduced" in run.stdout and "SIGSEGV" in run.stdout
    trace = json.loads((the_report(tmp_path) / "trace.json").read_text())
    assert trace["finding"]["kind"] != "target-crashed"  # the finding made first, not the crash after it


def test_a_crash_under_workers_is_a_finding(tmp_path: Path) -> None:
    run = fuzz(tmp_path, "segv_apply", "--workers", "2")
    assert run.returncode == 1, run.stdout + run.stderr
    assert "FOUND target-crashed" in run.stdout
    no_traceback(run)


def test_mutants_keeps_every_row_when_one_crashes(tmp_path: Path) -> None:
    argv = ["mutants", "--target", "kvspec_crashy:plain", "--mutants", "kvspec_crashy:mutants", "--seconds", "20"]
    run = kvspec(*argv, "--control-seconds", "1", "--out", str(tmp_path / "out"))
    assert run.returncode == 0, run.stdout + run.stderr  # both killed: one by its crash, one by a divergence
    table = run.stdout
    assert "segfaults" in table and "diverges" in table and "target-crashed" in table, table
    no_traceback(run)


# --- the flight recorder ---------------------------------------------------------------------------


def test_the_flight_log_names_the_last_operation_and_keeps_its_context(tmp_path: Path) -> None:
    path = tmp_path / "flight"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    rec = FlightRecorder()
    rec.open(fd, lambda c: {"config": c})
    rec.note_run({"relation": "exact"})
    rec.turn("full", 7)
    for i in range(40_000):  # past the size at which an example's start empties the file
        rec.begin(i)
        rec.op(O.AddRequest(f"r{i}", (1, 2, 3)))
    rec.op(O.Free(f"r{i}"))
    os.close(fd)
    log = read_flight(str(path))
    assert path.stat().st_size < 2 << 20
    assert log.run == {"relation": "exact"} and (log.family, log.seed) == ("full", 7)
    assert log.config == {"config": 39_999}
    assert log.ops == [O.AddRequest("r39999", (1, 2, 3)), O.Free("r39999")]


def test_the_flight_log_builds_nothing_but_operations(tmp_path: Path) -> None:
    import marshal
    import pickle
    import struct

    path = tmp_path / "flight"
    data = pickle.dumps(("op", os.system))  # a record naming a function: refused, never called
    path.write_bytes(struct.pack("<I", len(data)) + b"P" + data)
    with pytest.raises(pickle.UnpicklingError, match="never holds"):
        read_flight(str(path))
    data = marshal.dumps(("op_fields", "system", ("echo hi",)))  # a marshalled name that is no operation
    path.write_bytes(struct.pack("<I", len(data)) + b"M" + data)
    with pytest.raises(pickle.UnpicklingError, match="never holds"):
        read_flight(str(path))
