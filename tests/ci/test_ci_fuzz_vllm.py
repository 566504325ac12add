"""``bash ci/fuzz-vllm`` (README, docs/ci.md) runs as documented on whichever supported vLLM release is
installed, and says clearly when none is."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def fuzz_vllm(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    import os

    return subprocess.run(
        ["bash", "ci/fuzz-vllm", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, **(env or {})},
    )


@pytest.mark.vllm
def test_it_fuzzes_the_installed_release(tmp_path: Path) -> None:
    import vllm

    r = fuzz_vllm("--seconds", "2", "--family", "full", "--out", str(tmp_path / "reports"))
    assert r.returncode == 0, r.stderr[-2000:]
    assert f"ci/fuzz-vllm: fuzzing vLLM {vllm.__version__}, family=full, 2s in all" in r.stderr
    assert "ci/fuzz-vllm: no findings" in r.stderr


def test_without_vllm_it_says_how_to_install_it(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"
    python.write_text('#!/bin/sh\nexec python3 -I -c "import sys; sys.exit(1)"\n')  # no vLLM to import
    python.chmod(0o755)
    r = fuzz_vllm("--seconds", "4", env={"KVSPEC_VENV": str(venv)})
    assert r.returncode == 2
    assert "vLLM is not installed in" in r.stderr and "ci/setup --vllm" in r.stderr
