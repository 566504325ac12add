"""Real engines at work (issue 34): ``kvspec engine`` runs the tiny full, sliding-window and hybrid
models with every check on and exits 0 saying which checks ran; each engine-path mutant is caught by
the check written for it.  Needs the engine venv (``bash ci/setup --engine``): full tier."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvspec.harness.engine.driver import EngineUnavailable, engine_python
from kvspec.harness.mutants.vllm_engine import MUTANTS

ROOT = Path(__file__).resolve().parents[2]


try:
    engine_python()
    HAVE_ENGINE = True
except EngineUnavailable:
    HAVE_ENGINE = False
needs_engine = pytest.mark.skipif(not HAVE_ENGINE, reason="no engine venv: bash ci/setup --engine")


def kvspec(*argv: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "kvspec.harness", *argv]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env, timeout=timeout, check=False)


@pytest.mark.full
@needs_engine
def test_engines_run_clean_with_every_check_on(tmp_path: Path) -> None:
    run = kvspec("engine", "--seconds", "60", "--seed", "1", "--out", str(tmp_path))
    both = run.stdout + run.stderr
    assert run.returncode == 0, both
    assert "checks on: shadow, tables, KV tensors, poison, outputs, prompt logprobs" in both
    assert "no finding" in both and "KV tensors (" in both and " 0 engine steps" not in both


@pytest.mark.full
@needs_engine
@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_each_engine_mutant_is_caught_by_its_check(name: str, tmp_path: Path) -> None:
    run = kvspec("fuzz", "--target", f"mutant:{name}", "--seconds", "120", "--out", str(tmp_path))
    assert run.returncode == 1, run.stdout + run.stderr
    (trace,) = tmp_path.glob("*/trace.json")
    assert json.loads(trace.read_text())["finding"]["kind"] == MUTANTS[name].intended


def test_without_an_engine_venv_the_run_says_how_to_make_one(tmp_path: Path) -> None:
    env_venv = tmp_path / "nope"
    run = subprocess.run(
        [sys.executable, "-m", "kvspec.harness", "engine", "--seconds", "5", "--out", str(tmp_path / "r")],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT), "KVSPEC_ENGINE_VENV": str(env_venv)},
    )
    assert run.returncode == 2, run.stdout + run.stderr
    assert "ci/setup --engine" in run.stderr and "Traceback" not in run.stderr


def test_an_unknown_engine_family_is_refused_by_name() -> None:
    run = kvspec("engine", "--family", "slidingwindow", "--seconds", "5", timeout=60)
    assert run.returncode == 2 and "unknown engine family slidingwindow" in run.stderr, run.stderr
