"""Start-up: how long a ``kvspec fuzz`` process takes before its first example, and how old this
process is (what "from a cold start" means in ``kvspec fuzz``'s and ``kvspec mutants``' figures).

``process_seconds()`` is the age of this process: on Linux read from ``/proc`` (interpreter start
included), elsewhere the time since this module was first imported.  ``cold_start_seconds(target)``
runs ``python -m harness.run.startup TARGET`` in a fresh process, which does what ``kvspec fuzz
--target TARGET`` does before its first example (import kvspec, resolve and build the target, reset
it on a first config, import Hypothesis and build the state machine) and exits (for vLLM's real
scheduler, ``python -m harness.vllm_sched.build``, which builds one); the figure is that
process' whole wall time.  Nothing here is asserted on: the figures are printed.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

_IMPORTED = time.monotonic()
# The module a target's start-up runs in (``python -m MODULE TARGET``): vLLM's real scheduler builds one.
WARM_UP = {"vllm-scheduler": "harness.vllm_sched.build"}


def process_seconds() -> float:
    """Seconds since this process started (``/proc/self/stat``'s start time against ``/proc/uptime``;
    elsewhere, since this module was imported)."""
    try:
        stat = Path("/proc/self/stat").read_text()
        start_ticks = int(stat.rsplit(")", 1)[1].split()[19])  # field 22: starttime, in clock ticks
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return time.monotonic() - _IMPORTED


def cold_start_seconds(target: str, timeout: float = 300.0) -> float | None:
    """Wall seconds of a fresh ``python -m harness.run.startup TARGET`` (None if it failed)."""
    t0 = time.perf_counter()
    try:
        done = subprocess.run(
            [sys.executable, "-m", WARM_UP.get(target, "harness.run.startup"), target],
            capture_output=True,
            timeout=timeout,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return time.perf_counter() - t0 if done.returncode == 0 else None


def startup_target(origin: str, target: str) -> str:
    """The target whose start-up a cold ``kvspec fuzz`` of a ``kvspec mutants`` row pays: the built-in
    one its mutant patches (``origin``), or the user's ``package.module:factory`` (``target``, less
    its ``#mutant``)."""
    builtin = {"spec": "spec", "impl": "impl", "vllm": "vllm", "scheduler": "vllm-scheduler"}
    return builtin.get(origin, target.split("#", 1)[0])


def cold_report_seconds(to_report: float, target: str, startups: dict[str, float | None]) -> float | None:
    """``to_report`` plus the start-up of a fresh process for ``target`` (measured once per target, kept
    in ``startups``); None when the start-up could not be measured."""
    if target not in startups:
        startups[target] = cold_start_seconds(target)
    up = startups[target]
    return None if up is None else up + to_report


def warm_up(target: str) -> None:
    """What ``kvspec fuzz --target TARGET`` does before its first example."""
    from harness.check.machine import RunStats, make_machine
    from harness.mutants.registry import resolve_target
    from harness.world.families import FAMILIES
    from spec.config import KVCacheConfig, full_attention
    from spec.types import BlockCount, TokenCount

    factory = resolve_target(target)
    factory().reset(KVCacheConfig(BlockCount(16), (full_attention(16),), TokenCount(256)))
    for family in FAMILIES:
        make_machine(family, factory, target, "exact", RunStats())


if __name__ == "__main__":
    warm_up(sys.argv[1])
