"""Drive a target (usually a ``KVCheckTarget``) through the one workload, ``harness.world.workload.run_seeded``.

Every oracle test and the oracle benchmark use this: the scheduler-faithful workload the
Hypothesis state machine runs, here chosen by a seeded RNG.  Nothing steers around the known
vLLM 0.33 wrong-number paths: a ``KVCheckTarget`` recognises them with its own ledger and stops
checking for the run (``stats.known_bugs``), as under ``fuzz --kv-check``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvspec.harness.oracle.target import KVFinding, KVMismatch
from kvspec.harness.targets.base import Unsupported
from kvspec.harness.world.workload import run_seeded
from kvspec.spec.config import KVCacheConfig


@dataclass
class TraceResult:
    ops: int  # operations applied (including the one that failed)
    finding: KVFinding | None  # the oracle's finding, if any
    stopped: str | None  # why the run ended early without a KV finding (the inner target raised)


def drive(target: Any, config: KVCacheConfig, seed: int, actions: int) -> TraceResult:
    """Reset ``target`` and run ``actions`` seeded workload actions on it; stop at the first
    ``KVMismatch`` or other exception of the target."""
    applied = 0

    def count(op: Any, out: Any) -> None:
        nonlocal applied
        applied += 1

    try:
        run_seeded(target, config, seed, actions, on_op=count)
    except KVMismatch as e:
        return TraceResult(applied + 1, e.finding, None)
    except Unsupported as e:
        return TraceResult(applied + 1, None, f"unsupported: {e}")
    except Exception as e:  # noqa: BLE001 - a mutant's allocator may break; not a KV finding
        return TraceResult(applied + 1, None, f"{type(e).__name__}: {e}")
    return TraceResult(applied, None, None)
