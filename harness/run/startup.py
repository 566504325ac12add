"""Start-up: how long a ``kvspec fuzz`` process takes before its first example, and how old this
process is (what "from a cold start" means in ``kvspec fuzz``'s and ``kvspec mutants``' figures).

``process_seconds()`` is the age of this process: on Linux read from ``/proc`` (interpreter start
included), elsewhere the time since this module was first imported.  ``cold_start_seconds(target)``
runs ``python -m kvspec.harness.run.catalogue TARGET`` in a fresh process, which does what ``kvspec fuzz
--target TARGET`` does before its first example (import kvspec, resolve and build the target, and
its catalogue entry's warm-up: reset it on a first config, import Hypothesis and build the state
machines, or for vLLM's real scheduler build one) and exits; the figure is that process' whole wall
time.  Nothing here is asserted on: the figures are printed.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

_IMPORTED = time.monotonic()


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
    """Wall seconds of a fresh ``python -m kvspec.harness.run.catalogue TARGET`` (None if it failed)."""
    t0 = time.perf_counter()
    try:
        done = subprocess.run(
            [sys.executable, "-m", "kvspec.harness.run.catalogue", target],
            capture_output=True,
            timeout=timeout,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return time.perf_counter() - t0 if done.returncode == 0 else None


def cold_report_seconds(to_report: float, target: str, startups: dict[str, float | None]) -> float | None:
    """``to_report`` plus the start-up of a fresh process for ``target`` (measured once per target, kept
    in ``startups``); None when the start-up could not be measured."""
    if target not in startups:
        startups[target] = cold_start_seconds(target)
    up = startups[target]
    return None if up is None else up + to_report
