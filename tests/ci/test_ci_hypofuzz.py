"""HypoFuzz runs kvspec's state machines: ``hypothesis fuzz`` (HypoFuzz's command) on the pytest
plugin's ``TestKVSpec_<family>`` tests finds a deliberate bug and records it in the shared example
database (HypoFuzz's failure keys).  Full tier (up to a minute): ``bash ci/test --full``."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest
from ci_helpers import VENV_BIN, env

pytestmark = pytest.mark.full


def failures(tmp_path) -> int:
    from hypofuzz.database import FailureState, HypofuzzDatabase
    from hypothesis.database import DirectoryBasedExampleDatabase

    raw = DirectoryBasedExampleDatabase(str(tmp_path / ".hypothesis" / "examples"))
    db = HypofuzzDatabase(raw)
    return sum(len(list(db.failures(state=s).fetch(k))) for k in raw.fetch(b"hypofuzz.test_keys") for s in FailureState)


def test_hypofuzz_finds_a_mutant_through_the_plugin(tmp_path):
    pytest.importorskip("hypofuzz")
    cmd = [
        str(VENV_BIN / "hypothesis"),
        "fuzz",
        "-n",
        "1",
        "--no-dashboard",
        "--",
        "-p",
        "no:cacheprovider",
        "--hypothesis-profile",
        "default",  # as docs/ci.md says: under CI, Hypothesis' own ci profile is derandomized
        "--kvspec-target",
        "mutant:hits_not_touched",
        "--kvspec-family",
        "full",
        "--kvspec-only",
    ]
    proc = subprocess.Popen(
        cmd,
        cwd=tmp_path,
        env=env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        text=True,
    )
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and proc.poll() is None and not failures(tmp_path):
            time.sleep(2)
        found = failures(tmp_path)
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            out, _ = proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
    assert "using 1 process to fuzz 1 test" in out, out[-2000:]
    assert found, out[-2000:]
