"""The one run loop behind ``kvspec fuzz``, ``kvspec mutants``, ``releases diff`` and the workers.

``run_fuzz(opts, target)`` makes the target's driver (``harness.drivers``: the manager lockstep, vLLM's
real scheduler, ...; the catalogue entry ``harness.run.catalogue.CatalogueEntry`` says which), asks it
for its plan, and runs one turn after the other, each a family in rotation with its seed, until the
deadline, a finding, a signal, the plan's last turn or ``should_stop()``.  A finding is reduced by the
same driver, within the time left, and kept as trace JSON in the ``FuzzResult``; ``harness.run.finish``
prints the summary, writes the one report (and the known bugs' and the JUnit XML), and returns the
exit status.  Turn ``t`` of worker ``i`` of ``n`` runs family ``(t + i) % F`` with the seed the driver
derives (``Driver.turn_seed``), so one worker reproduces the single-process run exactly.

Time: with ``bounded`` (``kvspec fuzz``), ``--seconds`` bounds the whole run.  The time left at the
first finding is shared between Hypothesis' shrinking and the reduction in the ratio of
``--shrink-seconds`` to ``--reduce-seconds`` (each still at most its own bound), so the run ends
within ``--seconds`` plus the turn under way, the last replay and the writing of the report (a few
seconds).  Signals: ``harness.run.signals.SIGNALS`` (installed by the CLI and in each worker) turns
SIGINT and SIGTERM into a clean stop that keeps the smallest failing trace recorded so far.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kvspec.harness.core.flight import FLIGHT
from kvspec.harness.drivers.base import DriveHooks, Driver, DriveSettings, Found, TurnOutcome
from kvspec.harness.run.options import FuzzOptions
from kvspec.harness.run.signals import SIGNALS

if TYPE_CHECKING:
    from kvspec.harness.run.catalogue import CatalogueEntry


@dataclass
class FuzzResult:
    """What one run did (picklable: workers send it back)."""

    elapsed: float = 0.0
    examples: int = 0
    steps: int = 0
    events: Counter[str] = field(default_factory=Counter)
    batches: Counter[str] = field(default_factory=Counter)  # family -> turns run
    family_time: dict[str, float] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)  # family -> why the target models none of it
    found_family: str | None = None
    trace: dict[str, Any] | None = None  # the reduced finding, as trace JSON
    summary: str | None = None
    stopped: str | None = None  # the run stopped on an exception that is not a finding
    first_finding_after: float | None = None
    shrunk_steps: int | None = None  # the finding's length after Hypothesis' shrinking, before reduction
    shrink_examples: int = 0  # the examples Hypothesis' shrinking ran
    known: Counter[str] = field(default_factory=Counter)  # known bug id -> hits (harness.ledger.known_bugs)
    known_traces: dict[str, dict[str, Any]] = field(default_factory=dict)  # known bug id -> its first trace
    interrupted: int | None = None  # the signal that stopped the run (the trace, if any: the smallest so far)
    detail: str = ""  # the driver's own figures, for the summary line
    families: tuple[str, ...] = ()  # the families the driver planned to run, then those it skips
    opts: FuzzOptions | None = None  # the options in force, when they differ from those asked (``kvspec fuzz``)

    def add(self, other: FuzzResult) -> None:
        """Merge another worker's counts (not its finding)."""
        self.examples += other.examples
        self.steps += other.steps
        self.events.update(other.events)
        self.batches.update(other.batches)
        for fam, t in other.family_time.items():
            self.family_time[fam] = self.family_time.get(fam, 0.0) + t
        self.skipped.update(other.skipped)
        self.known.update(other.known)
        for bug_id, trace in other.known_traces.items():
            self.known_traces.setdefault(bug_id, trace)


class NothingToRun(Exception):
    """The driver runs none of the chosen families; the message says which it runs (exit 2)."""


def run_fuzz(
    opts: FuzzOptions,
    target: CatalogueEntry,
    worker: int = 0,
    workers: int = 1,
    should_stop: Callable[[], bool] | None = None,
    on_batch: Callable[[FuzzResult, float], None] | None = None,
    settings_overrides: dict[str, Any] | None = None,
    bounded: bool = False,
    announce: Callable[[str], None] | None = None,
) -> FuzzResult:
    """Run ``target`` (its driver) over ``opts.families`` until the deadline (``opts.seconds``), a
    finding, a signal (``SIGNALS``, where installed), the plan's last turn, or ``should_stop()``.
    ``settings_overrides`` go to the profile's Hypothesis settings (e.g. ``database=None``).
    ``bounded``: the deadline bounds shrinking and reduction too (``kvspec fuzz``; the mutant
    campaign's budget is the time to find).  ``announce`` gets the run's lines: a family skipped, the
    first finding.  ``NothingToRun`` when the driver runs none of the chosen families."""
    start = time.monotonic()
    deadline = start + opts.seconds
    hooks = _hooks(opts, start, deadline, bounded, announce)
    driver = target.driver(target.factory, drive_settings(opts, settings_overrides), hooks)
    FLIGHT.note_run({"target": opts.target, "relation": opts.relation})
    with driver.session():
        plan = driver.plan(opts.families)
        if not plan.families:
            raise NothingToRun(f"none of the chosen families runs on target {opts.target}: {plan.note}")
        for fam, why in plan.skipped.items():
            _say(announce, f"kvspec fuzz: family {fam} skipped: {why}")
        if plan.note:
            _say(announce, f"kvspec fuzz: {plan.note}")  # e.g. the checks turned off
        res = FuzzResult(skipped=dict(plan.skipped), families=(*plan.families, *plan.skipped))
        loop = _Loop(opts, driver, res, start, deadline, bounded, announce)
        loop.turns(plan.families, plan.turns, worker, workers, should_stop, on_batch)
        _tally(driver, res, start)
    return res


def drive_settings(opts: FuzzOptions, overrides: dict[str, Any] | None = None) -> DriveSettings:
    """What a driver is told of the run (``harness.drivers.base.DriveSettings``)."""
    from kvspec.harness.run.profiles import generates, profile_settings

    hyp = {"max_examples": opts.batch, "database": _database(opts), **(overrides or {})}
    return DriveSettings(
        target=opts.target,
        checks=opts.checks(),
        seed=opts.seed,
        profile=opts.profile,
        hypothesis=profile_settings(opts.profile, **hyp),
        generates=generates(opts.profile),
        shrink_seconds=opts.shrink_seconds,
        shrink_stall=opts.shrink_stall,
        reduce_seconds=opts.reduce_seconds,
        world_checks=not opts.no_world_checks,
        agreement=not opts.no_agreement,
    )


def _database(opts: FuzzOptions) -> Any:
    from kvspec.harness.run.profiles import database

    return database(opts.db)


def _hooks(
    opts: FuzzOptions, start: float, deadline: float, bounded: bool, announce: Callable[[str], None] | None
) -> DriveHooks:
    def on_found(kind: str, bound: int) -> None:
        _say(announce, _found_line(kind, time.monotonic() - start, bound, opts, bounded))

    return DriveHooks(
        poll=SIGNALS.poll,
        stopping=lambda: SIGNALS.signum is not None,
        ends=deadline,
        deadline=deadline if bounded else None,
        shrink_share=_shrink_share(opts),
        on_found=on_found if announce is not None else None,
    )


class _Loop:
    """The turns of one run, and what each leaves in the ``FuzzResult``."""

    def __init__(
        self,
        opts: FuzzOptions,
        driver: Driver,
        res: FuzzResult,
        start: float,
        deadline: float,
        bounded: bool,
        announce: Callable[[str], None] | None,
    ) -> None:
        self.opts, self.driver, self.res = opts, driver, res
        self.start, self.deadline, self.bounded, self.announce = start, deadline, bounded, announce

    def turns(
        self,
        families: Sequence[str],
        last: int | None,
        worker: int,
        workers: int,
        should_stop: Callable[[], bool] | None,
        on_batch: Callable[[FuzzResult, float], None] | None,
    ) -> None:
        """Turn after turn, each family in rotation with its seed, until the run is over."""
        res, turn = self.res, 0
        while time.monotonic() < self.deadline and res.trace is None and res.stopped is None and turn != last:
            if (should_stop is not None and should_stop()) or SIGNALS.signum is not None:
                break
            if all(f in res.skipped for f in families):
                break
            fam = families[(turn + worker) % len(families)]
            seed = self.driver.turn_seed(self.opts.seed, turn, worker, workers)
            turn += 1
            if fam in res.skipped:
                continue
            FLIGHT.turn(fam, seed)
            t0 = time.monotonic()
            self.record(fam, self.driver.run_turn(fam, seed))
            res.batches[fam] += 1
            res.family_time[fam] = res.family_time.get(fam, 0.0) + time.monotonic() - t0
            res.examples, res.steps = self.driver.progress()
            res.elapsed = time.monotonic() - self.start
            if on_batch is not None:
                on_batch(res, res.elapsed)

    def record(self, fam: str, out: TurnOutcome) -> None:
        """What one turn leaves: a signal, a family skipped, a finding (reduced), or a stop."""
        res = self.res
        if out.interrupted is not None:
            res.interrupted = out.interrupted
        if out.skipped is not None:
            res.skipped[fam] = out.skipped
            _say(self.announce, f"kvspec fuzz: family {fam} skipped: {out.skipped}")
        if out.found is not None:
            self.keep_first(out.found)
            self.keep(self.reduced(out.found))
        elif out.stopped is not None:
            res.found_family, res.stopped = fam, out.stopped

    def reduced(self, found: Found) -> Found:
        """``found`` reduced by its driver within ``--reduce-seconds`` (and, bounded, the time left);
        as it is after a signal."""
        if self.res.interrupted is not None:
            return found
        seconds = float(self.opts.reduce_seconds)
        if self.bounded:
            seconds = min(seconds, self.deadline - time.monotonic())
        if seconds <= 0 or SIGNALS.signum is not None:
            return found
        return self.driver.reduce(found, seconds)

    def keep_first(self, found: Found) -> None:
        """The finding as found, with the flight recorder before it is reduced: if the target crashes
        while it is, the supervisor (``harness.run.supervise``) reports it as it was."""
        if FLIGHT.fd is not None:
            from kvspec.harness.traces.trace import trace_to_json

            FLIGHT.found(trace_to_json(found.trace))

    def keep(self, found: Found) -> None:
        from kvspec.harness.traces.trace import trace_to_json

        res = self.res
        res.found_family, res.shrunk_steps, res.first_finding_after = (
            found.family,
            found.shrunk_steps,
            found.first_after,
        )
        res.shrink_examples = found.shrink_examples
        res.trace, res.summary = trace_to_json(found.trace), found.finding.summary()


def _tally(driver: Driver, res: FuzzResult, start: float) -> None:
    """The driver's counts over the run, into ``res``."""
    res.elapsed = time.monotonic() - start
    tally = driver.tally(res.elapsed)
    res.examples, res.steps, res.events, res.known = tally.examples, tally.steps, tally.events, tally.known
    res.known_traces = dict(tally.known_traces)
    res.skipped.update(tally.skipped)
    res.detail = tally.detail
    if res.interrupted is None:
        res.interrupted = SIGNALS.signum


def _say(announce: Callable[[str], None] | None, line: str) -> None:
    if announce is not None:
        announce(line)


def _shrink_share(opts: FuzzOptions) -> float:
    """The share of the time left at the first finding that shrinking may take (the rest: reduction)."""
    shrink, reduce = float(opts.shrink_seconds), float(opts.reduce_seconds)
    return shrink / (shrink + reduce) if shrink + reduce > 0 else 1.0


def _found_line(kind: str, after: float, shrink_bound: int, opts: FuzzOptions, bounded: bool) -> str:
    """What ``announce`` prints at the first finding (tests and users wait for it)."""
    within = f", within --seconds {opts.seconds:g}" if bounded else ""
    return (
        f"kvspec fuzz: found a failing example after {after:.1f}s ({kind}); {_shrinking(opts, shrink_bound)}, "
        f"then reducing it for up to {float(opts.reduce_seconds):g}s{within} "
        "(SIGINT or SIGTERM: stop and write the smallest so far)"
    )


def _shrinking(opts: FuzzOptions, bound: int) -> str:
    """How the finding will be shrunk (``--shrink-stall``, ``--shrink-seconds``), in words."""
    if opts.shrink_stall == 0:
        return "no Hypothesis shrinking (--shrink-stall 0)"
    return f"shrinking it while that shortens it (stops after {opts.shrink_stall} examples without, or {bound}s)"


def progress_line(elapsed: float, res: FuzzResult, families: Sequence[str], workers: int = 1) -> str:
    who = f"  {workers} workers" if workers > 1 else ""
    return (
        f"\r{elapsed:6.1f}s  {res.steps / max(elapsed, 1e-9):8.0f} steps/s  {res.examples:6d} examples  "
        f"families {len(res.batches)}/{len(families)}{who}   "
    )
