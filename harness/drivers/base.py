"""What the one run loop (``harness.run.loop``) and a driver say to each other.

A driver is made once per run (per worker process) from the target and the run's settings
(``DriveSettings``, ``DriveHooks``); the loop then asks it for its ``plan`` (the families it runs and
why it skips the others), and for one ``run_turn(family, seed)`` after the other until the deadline,
a finding, a signal or the plan's last turn.  A turn that ends in a finding gives a ``Found`` (its
trace as recorded), which the loop has the same driver ``reduce`` within the time left.  At the end
the loop reads the driver's ``tally``.  ``replay`` re-runs a recorded trace the way the driver made
it.  The loop owns the deadline, the seeds' order, signals, reports, the summary and exit codes; a
driver owns what one example is.
"""

from __future__ import annotations

import signal
import time
from collections import Counter
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from kvspec.harness.check.finding import Finding
from kvspec.harness.check.settings import DEFAULT_CHECKS, CheckSettings
from kvspec.harness.traces.trace import Trace

if TYPE_CHECKING:
    from kvspec.harness.traces.reduce import Runner
    from kvspec.harness.traces.replay import ReplayResult


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM during a run (raised by the loop's poll inside an example, or by the
    handler while a target loads; ``harness.run.signals``).  A ``KeyboardInterrupt``, so Hypothesis
    neither takes it for a failure nor shrinks it: it stops."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal_name(signum))
        self.signum = signum


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


@dataclass(frozen=True)
class DriveSettings:
    """What a driver is told about the run: the target's name (recorded in traces), how steps are
    checked, and the run's knobs (``harness.run.options.FuzzOptions`` builds it)."""

    target: str
    checks: CheckSettings = DEFAULT_CHECKS
    seed: int = 0
    profile: str = "dev"  # the Hypothesis profile's name (recorded in traces)
    hypothesis: Any = None  # the Hypothesis settings one lockstep turn runs under (its batch of examples)
    generates: bool = True  # the profile makes new examples (``replay`` only re-runs the database's)
    shrink_seconds: int = 10
    shrink_stall: int = 0
    reduce_seconds: float = 15.0
    world_checks: bool = True  # vLLM's real scheduler: the world's facts and conservation
    agreement: bool = True  # vLLM's real scheduler: kvspec's scheduler model beside the real one


@dataclass
class DriveHooks:
    """What the loop lends a driver: ``poll`` (raises ``Interrupted`` once a signal came; called
    before every step), ``stopping`` (a signal came), ``ends`` (the run's end), ``deadline``
    (``time.monotonic()`` by which shrinking must be over; None: unbounded), ``shrink_share`` (the share
    of the time left at a finding that shrinking may take) and ``on_found(kind, shrink_bound)`` (the
    first failing example, before shrinking)."""

    poll: Callable[[], None] = lambda: None
    stopping: Callable[[], bool] = lambda: False
    ends: float | None = None  # ``time.monotonic()`` at which the run's time is up (a turn under way may stop)
    deadline: float | None = None
    shrink_share: float = 1.0
    on_found: Callable[[str, int], None] | None = None


@dataclass
class Found:
    """A finding as a turn recorded it: its ``trace`` (config, steps, finding), the ``finding``, its
    family and when it was first met; ``shrunk_steps`` its length before the reduction; ``state``:
    what the driver needs to reduce it (its own)."""

    trace: Trace
    finding: Finding
    family: str
    first_after: float | None = None
    shrunk_steps: int = 0
    shrink_examples: int = 0
    state: Any = None


@dataclass
class TurnOutcome:
    """One turn: ``found`` a finding (``interrupted``: a signal came while it was shrunk, keep it as it
    is), ``stopped`` the run cannot go on and says why (not a finding), ``skipped`` the target models
    none of this family (why; the family is not run again)."""

    found: Found | None = None
    stopped: str | None = None
    skipped: str | None = None
    interrupted: int | None = None


@dataclass(frozen=True)
class Plan:
    """The families a driver runs, in turn order; the chosen ones it does not run, with why; the most
    turns the run makes (None: until the deadline); a note the run says at its start (or, when no
    family runs, in its error)."""

    families: tuple[str, ...]
    skipped: dict[str, str] = field(default_factory=dict)
    turns: int | None = None
    note: str = ""


@dataclass
class Tally:
    """What a driver counted over the run: examples (runs), checked steps, events by family, known bugs
    met (id -> hits) and the first trace of each (as JSON), the families skipped, the target's version,
    and a phrase of the driver's own figures for the summary line."""

    examples: int = 0
    steps: int = 0
    events: Counter[str] = field(default_factory=Counter)
    known: Counter[str] = field(default_factory=Counter)
    known_traces: dict[str, dict[str, Any]] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    detail: str = ""


class Driver(Protocol):
    """The small object that turns one example into checked steps (module docstring)."""

    one_process: bool  # cannot run under --workers (one process only)
    kv_check: bool  # can wrap the target in the KV-content oracle

    def session(self) -> AbstractContextManager[None]:
        """Held around the whole run (e.g. a deliberate bug patched in); ``contextlib.nullcontext()``."""
        ...

    def plan(self, families: Sequence[str]) -> Plan: ...

    def turn_seed(self, seed: int, turn: int, worker: int, workers: int) -> int:
        """The seed of turn ``turn`` of worker ``worker`` of ``workers`` in a run seeded ``seed``."""
        ...

    def run_turn(self, family: str, seed: int | None) -> TurnOutcome:
        """One turn of ``family`` from ``seed`` (None: Hypothesis' own, under pytest)."""
        ...

    def progress(self) -> tuple[int, int]:
        """(examples, checked steps) so far: cheap, asked after every turn."""
        ...

    def reduce(self, found: Found, seconds: float) -> Found:
        """``found`` made smaller within ``seconds`` (stopping early once ``hooks.stopping()``)."""
        ...

    def tally(self, elapsed: float) -> Tally: ...

    def check_trace(self, trace: Trace, where: str) -> None:
        """``ValueError`` naming the problem if this driver cannot replay ``trace`` (read from ``where``)."""
        ...

    def replay(self, trace: Trace, where: str) -> ReplayResult: ...


def reduce_finding(
    trace: Trace,
    finding: Finding,
    factory: Callable[[], Any],
    checks: CheckSettings,
    seconds: float,
    should_stop: Callable[[], bool],
    deadline: float | None = None,
    runner: Runner | None = None,
) -> tuple[Trace, Finding]:
    """``trace`` (ending in ``finding``) reduced by replaying operations on ``factory``'s targets
    (``harness.traces.reduce``) for up to ``seconds``, and not past ``deadline`` (``should_stop()``
    ends it with the smallest trace so far); the trace unchanged when reduction is off or finds
    nothing smaller, or when it does not replay outside the run (a flaky target, a factory that
    raises, even ``SystemExit``).  ``runner`` replays one candidate (``harness.traces.reduce.run_ops``
    unless given: a crashing target's in a child, ``harness.drivers.isolated``)."""
    from kvspec.harness.traces.reduce import reduce_trace, run_ops

    if deadline is not None:
        seconds = min(seconds, deadline - time.monotonic())
    if seconds <= 0 or should_stop():
        return trace, finding
    try:
        config, ops, run = trace.config, trace.ops, runner or run_ops
        red = reduce_trace(config, ops, finding, factory, checks, seconds, should_stop=should_stop, runner=run)
    except KeyboardInterrupt:
        raise
    except BaseException:  # noqa: BLE001 - see the docstring: keep it as recorded
        return trace, finding
    recorded = len(trace.steps)
    trace.config, trace.steps, trace.finding = red.config, list(red.steps), red.finding.to_json()
    trace.extra.setdefault("recorded_steps", recorded)  # for the report's "reduced from"
    return trace, red.finding


__all__ = [
    "DriveHooks",
    "DriveSettings",
    "Driver",
    "Found",
    "Interrupted",
    "Plan",
    "Tally",
    "TurnOutcome",
    "reduce_finding",
    "signal_name",
]
