"""Replay a trace on a target: every step must behave as recorded.

The trace's operations are applied in lockstep (``harness.check.lockstep``, with the trace's equality
relation), and each outcome is also compared with the one recorded in the trace.  The result says
where and how the run first departed from the record, or that it behaved as recorded.

A trace is data and never chooses code to run: ``replay_target`` takes the target from the command
line, or else the trace's recorded one only if it is built in (``harness.mutants.registry.is_builtin_target``)
or the user trusts the file (``--trust-trace-target``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from harness.check.lockstep import Finding, FindingError, Lockstep
from harness.core.equality import outcome_difference
from harness.targets.base import Target, Unsupported
from harness.traces.trace import Trace


@dataclass
class ReplayResult:
    ok: bool
    steps_run: int
    message: str
    finding: Finding | None = None


class UntrustedTarget(Exception):
    """A trace records a ``package.module:factory`` target and the user chose none (exit 2)."""


def replay_target(trace: Trace, path: str | Path, target: str | None, trust: bool) -> str:
    """The target to replay ``trace`` (read from ``path``) on: ``target`` (``--target``) if given;
    else the recorded one if it is built in, or if ``trust`` (``--trust-trace-target``)."""
    from harness.mutants.registry import is_builtin_target

    if target:
        return target
    if trust or is_builtin_target(trace.target_name):
        return trace.target_name
    raise UntrustedTarget(
        f"{path}: the trace records target {trace.target_name!r}, which is not a built-in target (spec, impl, "
        "vllm, mutant:NAME) but code to import and call; a trace file does not choose code to run. "
        "Choose the target with --target X (e.g. --target spec), or, if you trust this file, "
        "use its recorded target with --trust-trace-target"
    )


def replay(trace: Trace, target_factory: Callable[[], Target], step_timeout: float | None = 10.0) -> ReplayResult:
    ls = Lockstep(trace.config, target_factory(), trace.relation, step_timeout)
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
