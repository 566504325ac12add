"""A bound on how much a target may grow the process' memory within one lockstep run.

``KVSPEC_TARGET_MEMORY_MB=N`` (unset or 0: off) makes ``Lockstep`` read the resident set size every
``CHECK_EVERY`` steps and report a ``target-memory`` finding once it has grown by more than N MiB
since the target's ``reset()``.  A per-step leak then ends in a finding at a step that the same
trace, replayed with the same bound, reaches again; a ``MemoryError`` raised by a target is a
``target-memory`` finding too, whose reproduction may depend on the process' state.  The whole
process is measured (the harness and the spec included): pick a bound well above what a clean run
of your target grows by (a few MiB for kvspec's own targets).  Before the baseline is read, memory
that earlier runs freed is handed back to the system (glibc ``malloc_trim``), so that a leak shows
up as growth instead of silently refilling it: the same trace then grows alike whatever ran before.
"""

from __future__ import annotations

import ctypes
import functools
import os
import resource
import sys
from collections.abc import Callable

ENV = "KVSPEC_TARGET_MEMORY_MB"
CHECK_EVERY = 16  # steps between two readings of the resident set size (one read ~ 5 us)
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def parse_memory_bound(text: str) -> float | None:
    """The growth bound in MiB that ``KVSPEC_TARGET_MEMORY_MB`` holds (``text``, read at the edges:
    the CLI, the pytest plugin); None when empty or 0; ``ValueError`` naming the variable otherwise."""
    raw = text.strip()
    if not raw:
        return None
    try:
        mb = float(raw)
    except ValueError:
        raise ValueError(f"{ENV}={raw!r}: expected a number of MiB (0 or unset: off)") from None
    return mb if mb > 0 else None


def rss_bytes() -> int:
    """The process' resident set size now (``/proc/self/statm``; elsewhere the peak, from ``resource``)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except OSError:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return int(peak) if sys.platform == "darwin" else int(peak) * 1024


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim`` (None elsewhere)."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    return trim


def release_free_memory() -> None:
    """Hand the heap memory that is free but still resident back to the system (~20 us)."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


class MemoryGuard:
    """The growth check of one run: ``start()`` after the target's reset, ``growth(step)`` per step."""

    def __init__(self, bound_mb: float | None) -> None:
        self.bound_mb = bound_mb
        self.baseline = 0

    def start(self) -> None:
        if self.bound_mb is not None:
            release_free_memory()
            self.baseline = rss_bytes()

    def growth(self, step: int) -> float | None:
        """The growth in MiB when it exceeds the bound at this step (checked every ``CHECK_EVERY``), else None."""
        if self.bound_mb is None or step % CHECK_EVERY:
            return None
        grown = (rss_bytes() - self.baseline) / 2**20
        return grown if grown > self.bound_mb else None

    def message(self, grown_mb: float) -> str:
        return (
            f"the process grew by {grown_mb:.1f} MiB since the target's reset() "
            f"(bound {self.bound_mb:g} MiB, {ENV}): the target seems to leak memory"
        )


def memory_error_message(where: str, e: BaseException) -> str:
    """The message of a ``MemoryError`` finding (it may not reproduce: it depends on the process)."""
    detail = f": {e}" if str(e) else ""
    return (
        f"{where} raised MemoryError{detail} (this may depend on the process' state, not only on the "
        f"trace; set {ENV} to bound the target's growth reproducibly)"
    )
