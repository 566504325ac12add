"""Hostile input to every entry: a clear exit code and a message naming the problem, no traceback,
no hang, nothing overwritten.

Each case is a ``kvspec`` command run as a user would (a subprocess), with the exit code and a
fragment of the message it must give.  The deliberate bugs: before these checks, ``--seconds nan``
ran ``releases diff`` and ``pd check`` to an exit 0 having checked nothing, ``pd verify --out`` an
existing file overwrote it, a FIFO in the example database hung ``fuzz``, and a seed past 1.8e13 lost
the report to a ``TraceFormatError``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvspec.harness.cli import main

ROOT = Path(__file__).resolve().parents[2]
BUG = ["--target", "mutant:hit_cap_num_tokens", "--family", "full"]  # found within about a second
FULL = pytest.mark.full  # the slower variants of a case: bash ci/test --full


def kvspec(*argv: str, timeout: float = 120, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "kvspec.harness", *argv]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, env=env, timeout=timeout, check=False)


def clean(run: subprocess.CompletedProcess[str], code: int, fragment: str) -> None:
    both = run.stdout + run.stderr
    assert run.returncode == code, both
    assert fragment in both, both
    assert "Traceback" not in both, both


USAGE = [
    (["releases", "diff", "0.33.0", "0.34.0", "--seconds", "nan"], "--seconds must be > 0"),
    (["releases", "diff", "0.33.0", "0.34.0", "--seconds", "1e300"], "--seconds must be > 0 and <= 86400"),
    (["releases", "diff", "0.33.0", "0.34.0", "--out", "{file}"], "is a file, not a folder"),
    (["pd", "check", "--seconds", "nan"], "--seconds must be > 0"),
    (["pd", "check", "--steps", "100000000"], "--steps must be >= 1 and <= 10000"),
    (["pd", "check", "--shrink-seconds", "-1"], "--shrink-seconds must be >= 0"),
    (["pd", "check", "--out", "{file}"], "is a file, not a folder"),
    (["pd", "simulate", "--loads", "1e308", "--no-figures", "--out", "{dir}/sim"], "--loads must be > 0 and <= 100"),
    (["pd", "simulate", "--loads", "nan", "--no-figures", "--out", "{dir}/sim"], "--loads must be > 0"),
    (["pd", "simulate", "--seeds", "0", "--no-figures", "--out", "{dir}/sim"], "--seeds must be >= 1"),
    (["pd", "verify", "--out", "{file}"], "already exists; kvspec never overwrites a file"),
    (["pd", "verify", "--requests", "50"], "--requests must be >= 1 and <= 8"),
    (["pd", "verify", "--max-states", "0"], "--max-states must be >= 1"),
    (["fuzz", "--target", "spec", "--db", "{file}"], "not a folder (examples would be lost)"),
    (["fuzz", "--target", "spec", "--db", "/dev/null"], "not a folder (examples would be lost)"),
]


@pytest.mark.parametrize(("argv", "fragment"), USAGE, ids=[" ".join(a[:2] + a[-2:]) for a, _ in USAGE])
def test_bad_usage_exits_2_naming_the_problem(
    tmp_path: Path, argv: list[str], fragment: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """In this process (``kvspec.harness.cli.main``, what the command runs): fast, and a traceback
    would fail the test by escaping."""
    existing = tmp_path / "precious.txt"
    existing.write_text("keep me\n")
    argv = [a.format(file=existing, dir=tmp_path) for a in argv]
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert fragment in captured.out + captured.err, captured.out + captured.err
    assert existing.read_text() == "keep me\n"  # nothing overwritten


@pytest.mark.parametrize(
    "seed", ["18000000000000000000000", pytest.param("-5", marks=FULL), pytest.param("1796362862007177138", marks=FULL)]
)  # the last: date +%s%N
def test_any_seed_keeps_its_report(tmp_path: Path, seed: str) -> None:
    run = kvspec("fuzz", *BUG, "--seconds", "30", "--seed", seed, "--out", str(tmp_path / "out"), "--db", str(tmp_path))
    clean(run, 1, "report written to")
    (report,) = (tmp_path / "out").iterdir()
    assert 0 <= json.loads((report / "trace.json").read_text())["seed"] < 1 << 64


def test_a_fifo_and_a_device_link_in_the_database_are_passed_over(tmp_path: Path) -> None:
    db = tmp_path / "db"
    first = kvspec("fuzz", *BUG, "--seconds", "30", "--db", str(db), "--out", str(tmp_path / "a"))
    assert first.returncode == 1
    folders = [d for d in db.iterdir() if d.is_dir()]
    assert folders, "the finding was not saved: nothing to plant next to it"
    for d in folders:
        os.mkfifo(d / "fifo")
        (d / "zero").symlink_to("/dev/zero")
    again = kvspec("fuzz", *BUG, "--seconds", "30", "--db", str(db), "--out", str(tmp_path / "b"), timeout=90)
    clean(again, 1, "FOUND")


PLUGIN = [
    (["--kvspec-target", "spec", "--kvspec-step-timeout", "-1"], "--kvspec-step-timeout must be > 0"),
    pytest.param(["--kvspec-target", "spec", "--kvspec-step-timeout", "nan"], "--kvspec-step-timeout", marks=FULL),
    pytest.param(["--kvspec-target", "spec", "--kvspec-shrink-seconds", "-3"], "--kvspec-shrink", marks=FULL),
    (["--kvspec-target", "spec", "--kvspec-out", "{file}"], "--kvspec-out"),
    pytest.param(["--kvspec-only"], "--kvspec-only needs --kvspec-target", marks=FULL),
]


@pytest.mark.parametrize(("argv", "fragment"), PLUGIN)
def test_the_pytest_plugin_checks_its_options(tmp_path: Path, argv: list[str], fragment: str) -> None:
    existing = tmp_path / "precious.txt"
    existing.write_text("keep me\n")
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *(a.format(file=existing) for a in argv)]
    run = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, timeout=120, check=False)
    assert run.returncode == 4 and fragment in run.stdout + run.stderr, run.stdout + run.stderr
    assert existing.read_text() == "keep me\n"


@pytest.mark.parametrize("signum", [signal.SIGINT, pytest.param(signal.SIGTERM, marks=FULL)])
@pytest.mark.parametrize(
    "argv",
    [
        pytest.param(["pd", "check", "--seconds", "100"], marks=FULL),  # about 8 s: the full tier
        ["pd", "verify", "--requests", "3", "--dup", "3"],
    ],
)
def test_a_signal_stops_pd_cleanly(tmp_path: Path, argv: list[str], signum: signal.Signals) -> None:
    cmd = [sys.executable, "-m", "kvspec.harness", *argv]
    if argv[1] == "check":
        cmd += ["--out", str(tmp_path / "pd")]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=ROOT,
        env=env,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # a background shell ignores it
    )
    time.sleep(3)
    p.send_signal(signum)
    out, _ = p.communicate(timeout=30)
    assert p.returncode == 128 + signum, out
    assert "Traceback" not in out and "interrupted by" in out, out
