"""Helpers of the CI-integration tests: the CLI in a subprocess, with kvspec on PATH."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent


def env(**extra: str) -> dict[str, str]:
    """The environment a user's CI has: kvspec on PATH, the repository importable (examples/)."""
    e = dict(os.environ)
    e["PATH"] = f"{VENV_BIN}{os.pathsep}{e.get('PATH', '')}"
    e["PYTHONPATH"] = f"{REPO}{os.pathsep}{e.get('PYTHONPATH', '')}"
    e.pop("KVSPEC_DB", None)
    e.update(extra)
    return e


def kvspec(*args: str, cwd: Path, timeout: float = 120, **extra: str) -> subprocess.CompletedProcess[str]:
    """``kvspec ARGS`` (as ``python -m kvspec.harness``) in ``cwd``."""
    return subprocess.run(
        [sys.executable, "-m", "kvspec.harness", *args],
        cwd=cwd,
        env=env(**extra),
        text=True,
        capture_output=True,
        timeout=timeout,
    )
