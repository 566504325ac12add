"""Replay a trace on a target: every step must behave as recorded.

The trace's operations are applied in lockstep (``harness.check.lockstep``, with the trace's equality
relation), and each outcome is also compared with the one recorded in the trace.  The result says
where and how the run first departed from the record, or that it behaved as recorded.

A trace is data and never chooses code to run: ``harness.run.catalogue.replay_target`` takes the
target from the command line, or else the trace's recorded one only if it is built in, or if the user
trusts the file (``--trust-trace-target``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from kvspec.harness.check.lockstep import Finding, FindingError, Lockstep
from kvspec.harness.check.settings import DEFAULT_CHECKS, CheckSettings
from kvspec.harness.core.equality import outcome_difference
from kvspec.harness.core.flight import FLIGHT
from kvspec.harness.targets.base import Target, Unsupported
from kvspec.harness.traces.trace import Trace


@dataclass
class ReplayResult:
    ok: bool
    steps_run: int
    message: str
    finding: Finding | None = None


def replay(trace: Trace, target_factory: Callable[[], Target], checks: CheckSettings = DEFAULT_CHECKS) -> ReplayResult:
    """Replay ``trace`` on a fresh target of ``target_factory``, checked as ``checks`` says under the
    trace's own relation: ok when every step behaves as recorded."""
    FLIGHT.begin(trace.config)
    ls = Lockstep(trace.config, target_factory(), replace(checks, relation=trace.relation))
    try:
        ls.start()
        for i, (op, recorded) in enumerate(trace.steps):
            try:
                out = ls.apply(op)
            except (FindingError, Unsupported):
                raise
            except Exception as e:  # an operation the run cannot apply (e.g. an unknown request, no reference)
                msg = f"step {i} ({op.op}) cannot be applied: {type(e).__name__}: {e}"
                return ReplayResult(False, i + 1, msg)
            diff = outcome_difference(recorded, out)
            if diff is not None:
                f = Finding(
                    "differs-from-record", i, f"outcome differs from the recorded one: {diff}", None, recorded, out
                )
                return ReplayResult(False, i + 1, f"step {i} ({op.op}): {f.message}", f)
        ls.finish()  # a full check if the last steps were glimpsed (large pools, harness.core.glimpse)
    except FindingError as e:
        return ReplayResult(False, (e.finding.step or 0) + 1, e.finding.summary(), e.finding)
    except Unsupported as e:
        return ReplayResult(False, 0, f"the target does not support this trace: {e}")
    return ReplayResult(True, len(trace.steps), f"{len(trace.steps)} steps behaved as recorded")
