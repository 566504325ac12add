"""Record and shadow in a real engine (issue 34), through the plugin exactly as `vllm serve` loads it
(``vllm.general_plugins``), with vLLM's own engine-core process: a recorded trace of each model kind
is written whole at shutdown and replays exactly on the spec and on the real manager; shadow checks
and says so; the engine's default configuration is refused by name while the engine serves on.
Needs the engine venv (``bash ci/setup --engine``): full tier."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from kvspec.harness.engine.driver import EngineUnavailable, engine_python
from kvspec.harness.engine.models import MODEL_KINDS

ROOT = Path(__file__).resolve().parents[2]
try:
    PY = str(engine_python())
except EngineUnavailable:
    PY = ""
pytestmark = [pytest.mark.full, pytest.mark.skipif(not PY, reason="no engine venv: bash ci/setup --engine")]


def engine(*argv: str, **env: str) -> subprocess.CompletedProcess[str]:
    cmd = [PY, "-W", "ignore", "-m", "kvspec.harness.engine.plugin_run", *argv]
    return subprocess.run(
        cmd, capture_output=True, text=True, cwd=ROOT, env={**os.environ, **env}, timeout=300, check=False
    )


def replay(trace: Path, target: str) -> subprocess.CompletedProcess[str]:
    cmd = [PY, "-W", "ignore", "-m", "kvspec.harness", "replay", str(trace), "--target", target]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=300, check=False)


@pytest.mark.parametrize("kind", MODEL_KINDS)
def test_a_recorded_engine_replays_exactly_on_the_spec_and_the_real_manager(kind: str, tmp_path: Path) -> None:
    trace = tmp_path / "trace.json"
    run = engine("--kind", kind, "--family", "preemption", "--seed", "1", KVSPEC_RECORD=str(trace))
    assert run.returncode == 0, run.stderr[-3000:]
    served = json.loads(run.stdout.strip().splitlines()[-1])
    t = json.loads(trace.read_text())
    assert t["config"]["profile"].startswith("vllm-0.32") and t["target"]["version"].startswith("vllm 0.32")
    adds = {s["request_id"] for s in t["steps"] if s["op"] == "add_request"}
    frees = {s["request_id"] for s in t["steps"] if s["op"] == "free"}
    assert len(adds) >= served["requests"] and adds == frees  # whole: every request's last free is in it
    for target in ("spec", "vllm"):
        r = replay(trace, target)
        assert r.returncode == 0 and "behaved as recorded" in r.stdout, (target, r.stdout, r.stderr[-2000:])


def test_shadow_checks_a_real_engine_and_says_so(tmp_path: Path) -> None:
    run = engine(
        "--kind",
        "hybrid",
        "--family",
        "shared_prefix",
        "--seed",
        "2",
        KVSPEC_SHADOW="1",
        KVSPEC_SHADOW_OUT=str(tmp_path / "reports"),
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "kvspec shadow: the spec checks this scheduler's manager" in run.stderr
    assert "operations checked against the spec, no finding" in run.stderr
    assert not (tmp_path / "reports").exists()


def test_the_engines_default_retention_is_refused_by_name_and_the_engine_serves_on(tmp_path: Path) -> None:
    trace = tmp_path / "trace.json"
    run = engine("--kind", "sliding", "--engine-defaults", KVSPEC_RECORD=str(trace))
    assert run.returncode == 0, run.stderr[-3000:]
    assert "not recording this scheduler: prefix_cache_retention_interval=0" in run.stderr
    assert json.loads(run.stdout.strip().splitlines()[-1])["requests"] > 0 and not trace.exists()
