"""Replay a trace on a target: every step must behave as recorded.

The trace's operations are applied in lockstep (``harness.lockstep``, with the trace's equality
relation), and each outcome is also compared with the one recorded in the trace.  The result says
where and how the run first departed from the record, or that it behaved as recorded.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from harness.equality import outcome_difference
from harness.lockstep import Finding, FindingError, Lockstep
from harness.targets.base import Target, Unsupported
from harness.trace import Trace


@dataclass
class ReplayResult:
    ok: bool
    steps_run: int
    message: str
    finding: Finding | None = None


def replay(trace: Trace, target_factory: Callable[[], Target], step_timeout: float | None = 10.0) -> ReplayResult:
    ls = Lockstep(trace.config, target_factory(), trace.relation, step_timeout)
    try:
        ls.start()
        for i, (op, recorded) in enumerate(trace.steps):
            out = ls.apply(op)
            diff = outcome_difference(recorded, out)
            if diff is not None:
                f = Finding(
                    "differs-from-record", i, f"outcome differs from the recorded one: {diff}", None, recorded, out
                )
                return ReplayResult(False, i + 1, f"step {i} ({op.op}): {f.message}", f)
    except FindingError as e:
        return ReplayResult(False, (e.finding.step or 0) + 1, e.finding.summary(), e.finding)
    except Unsupported as e:
        return ReplayResult(False, 0, f"the target does not support this trace: {e}")
    return ReplayResult(True, len(trace.steps), f"{len(trace.steps)} steps behaved as recorded")
