"""Settings are passed down, not read: the environment is read at the edges only (the CLI, the pytest
plugin, the campaign, the vLLM plugin entry point), never by the code that checks (issue 32).

The scan reads the source of every module in the folders below ``harness/run/`` (and of the vLLM
plugin's record/shadow module, the one edge among them, which is named) for any reading of the
environment: ``os.environ``, ``os.getenv``, ``os.environb``, ``from os import environ``."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BELOW_RUN = (
    "core",
    "world",
    "targets",
    "ledger",
    "oracle",
    "mutants",
    "check",
    "traces",
    "drivers",
    "vllm_sched",
    "engine",
    "sglang",
)
EDGES = {
    "harness/vllm_sched/record.py",  # KVSPEC_RECORD / KVSPEC_SHADOW in a user's vLLM process (its plugin)
    "harness/engine/driver.py",  # KVSPEC_ENGINE_VENV: where the engine venv is, and the worker's environment
    "harness/engine/worker.py",  # the engine worker's process entry point (vLLM's in-process switches)
    "harness/engine/plugin_run.py",  # a plain engine's process entry point (--in-process)
    "harness/engine/bench.py",  # the engine benchmark's process entry point (in-process engines)
    "harness/sglang/load.py",  # KVSPEC_SGLANG_VENV: where the sglang venv is
}
READERS = {"environ", "getenv", "environb", "getenvb", "putenv", "unsetenv"}


def environment_reads(source: str) -> list[int]:
    """The lines of ``source`` that read (or write) the process environment."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr in READERS and getattr(node.value, "id", None) == "os":
            lines.append(node.lineno)
        elif isinstance(node, ast.ImportFrom) and node.module == "os" and {a.name for a in node.names} & READERS:
            lines.append(node.lineno)
    return sorted(lines)


@pytest.mark.parametrize(
    "source, found",
    [
        ("import os\nx = os.environ.get('KVSPEC_LEDGER', '1')\n", [2]),
        ("import os\n\ndef f():\n    return os.getenv('X')\n", [4]),
        ("from os import environ as e\n", [1]),
        ("import os\nos.environ['X'] = '1'\n", [2]),
        ("import os\nn = os.cpu_count()\n", []),
    ],
)
def test_the_scan_sees_every_way_of_reading_the_environment(source: str, found: list[int]) -> None:
    assert environment_reads(source) == found


def test_nothing_below_run_reads_the_environment() -> None:
    bad = []
    for folder in BELOW_RUN:
        for path in sorted((ROOT / "harness" / folder).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel in EDGES:
                continue
            bad += [f"{rel}:{n}" for n in environment_reads(path.read_text())]
    assert not bad, "reads the environment below harness/run/ (pass it in the options instead): " + ", ".join(bad)


def test_the_named_edges_exist() -> None:
    for rel in EDGES:
        assert environment_reads((ROOT / rel).read_text()), f"{rel} no longer reads the environment: drop it"
