"""No false finding at any seed (issue 33 item 5): ``kvspec fuzz --target vllm-scheduler`` on the correct
vLLM exits 0 seed after seed, and the runs it once failed agree whatever Python's string hashing.

Those runs (``--seed 3`` and ``--seed 2``, ``--family all``: a ``connector`` run each) fail two running
requests together after a synchronous load reported an invalid block (``fail`` policy).  vLLM's
``update_from_output`` finishes them with one ``finish_requests`` call over a set of request ids, so
it frees them in string-hash order (``PYTHONHASHSEED``); kvspec's model freed them in running order,
and the agreement reported the difference as a finding in about four processes of six.  The model
now leaves that order to the world and the agreement answers it from the real run
(``harness.vllm_sched.mirror``).  A hash seed under which the real order is not the running order is
set in a subprocess, so the check is the same on every run of the tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="needs the real vLLM 0.33.0 (ci/setup --vllm)")

pytestmark = pytest.mark.vllm

ROOT = Path(__file__).resolve().parents[2]

FAILED_TOGETHER = {4647394379995828843: 40, 2170220648682147374: 126}
"""Connector run seed -> engine steps to compare: the run of ``--seed 3`` (two running requests failed
together in engine step 38) and that of ``--seed 2`` (engine step 124)."""

COMPARE = """
import json, sys
from vllm.v1.core.sched.scheduler import Scheduler
from kvspec.harness.vllm_sched.agreement import compare_run

together = []  # each finish_requests call given more than one request: its ids as vLLM walks them
finish = Scheduler.finish_requests

def counting(self, request_ids, status):
    if request_ids is not None and not isinstance(request_ids, str) and len(set(request_ids)) > 1:
        together.append(list(set(request_ids)))
    return finish(self, request_ids, status)

Scheduler.finish_requests = counting
runs = [compare_run("connector", seed, steps) for seed, steps in json.loads(sys.argv[1])]
print(json.dumps({"differences": [r.detail for r in runs if r.difference], "together": together}))
"""


@pytest.mark.full  # about 10 s: two interpreters with different string hashing
def test_requests_failed_together_agree_whatever_the_string_hashing() -> None:
    env = {**os.environ, "PYTHONHASHSEED": "1"}  # the real order is not the running order here
    proc = subprocess.run(
        [sys.executable, "-c", COMPARE, json.dumps(list(FAILED_TOGETHER.items()))],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["together"], "the runs no longer fail requests together: this test checks nothing"
    assert out["differences"] == [], out["differences"]


def _fuzz(seed: int, seconds: int, out: Path) -> int:
    """``kvspec fuzz --target vllm-scheduler --family all`` at ``seed`` (a known bug's report may be
    written under ``out``: a known bug is counted, not a finding)."""
    from kvspec.harness.cli import main

    args = ["fuzz", "--target", "vllm-scheduler", "--family", "all", "--seconds", str(seconds)]
    return main([*args, "--seed", str(seed), "--out", str(out)])


@pytest.mark.parametrize("seed", [0, *(pytest.param(s, marks=pytest.mark.full) for s in (1, 2, 3))])
def test_fuzz_is_clean_at_a_handful_of_seeds(seed: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = _fuzz(seed, 4, tmp_path)
    out, err = capsys.readouterr()
    assert rc == 0, out + err


@pytest.mark.full
@pytest.mark.parametrize("seed", range(10))
def test_fuzz_is_clean_at_seeds_0_to_9(seed: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The reported command, ``--seconds 120`` at each seed (about 20 minutes in all)."""
    rc = _fuzz(seed, 120, tmp_path)
    out, err = capsys.readouterr()
    assert rc == 0, out + err
