"""CI's fuzzing job against the real vLLM: the CLI exactly as users script it, for a short while
(longer in the full tier).

A finding makes the test fail with the report's first lines; the report folder stays under the
test's tmp dir (and the Hypothesis database keeps the example, so the next run retries it first).
"""

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm")
pytestmark = pytest.mark.vllm


def run_fuzz(tmp_path: Path, *extra: str) -> None:
    out = tmp_path / "reports"
    cmd = [
        sys.executable,
        "-m",
        "kvspec.harness",
        "fuzz",
        "--target",
        "vllm",
        "--family",
        "all",
        "--seed",
        "7",
        "--out",
        str(out),
        *extra,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        reports = sorted(out.glob("*/report.md"))
        detail = reports[0].read_text()[:3000] if reports else proc.stderr[-3000:]
        pytest.fail(f"kvspec fuzz exited {proc.returncode}: {proc.stdout.strip()}\n{detail}")
    assert "no finding" in proc.stdout


@pytest.mark.full  # about 15 s; the default tier fuzzes vLLM through ci/fuzz-vllm (tests/ci/test_ci_fuzz_vllm.py)
def test_fuzz_vllm_against_the_spec(tmp_path, full_tier):
    run_fuzz(tmp_path, "--seconds", "45" if full_tier else "8")


@pytest.mark.full  # about 16 s
def test_fuzz_vllm_kv_contents(tmp_path, full_tier):
    run_fuzz(tmp_path, "--seconds", "30" if full_tier else "6", "--kv-check")
