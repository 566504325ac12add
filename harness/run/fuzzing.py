"""The fuzzing loop behind ``kvspec fuzz``: rotate the families, run one Hypothesis batch per turn,
stop at the deadline, at the first finding, on SIGINT or SIGTERM, or when told to (``should_stop``).

``run_fuzz`` is what one process does; ``harness.run.workers`` runs it in N processes on the one example
database.  ``harness.run.finish.finish_fuzz`` prints the summary, writes the one report (and the JUnit XML), and
returns the exit status.  Batch ``b`` of worker ``i`` of ``n`` runs family ``(b + i) % F`` with seed
``seed * 1_000_003 + b * n + i``, so one worker reproduces the single-process run exactly.

Time: with ``bounded`` (``kvspec fuzz``), ``--seconds`` bounds the whole run.  The time left at the
first finding is shared between Hypothesis' shrinking and the trace reduction in the ratio of
``--shrink-seconds`` to ``--reduce-seconds`` (each still at most its own bound), so the run ends
within ``--seconds`` plus the batch under way, the last replay and the writing of the report (a
few seconds).  Signals: ``harness.run.signals.SIGNALS`` (installed by the CLI and in each worker) turns SIGINT and
SIGTERM into a clean stop that keeps the smallest failing trace recorded so far (``RunStats.best``, or the
reducer's current trace) and exits ``128 + signal`` (130, 143).
"""

from __future__ import annotations

import time
import unittest
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from harness.run.options import FuzzOptions
from harness.run.signals import SIGNALS, Interrupted

EXIT_OK, EXIT_FOUND, EXIT_USAGE = 0, 1, 2


@dataclass
class FuzzResult:
    """What one fuzzing process did (picklable: workers send it back)."""

    elapsed: float = 0.0
    examples: int = 0
    steps: int = 0
    events: Counter[str] = field(default_factory=Counter)
    batches: Counter[str] = field(default_factory=Counter)  # family -> batches run
    family_time: dict[str, float] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)  # family -> why the target models none of it
    found_family: str | None = None
    trace: dict[str, Any] | None = None  # the shrunk finding, as trace JSON
    summary: str | None = None
    stopped: str | None = None  # the run stopped on an exception that is not a finding
    first_finding_after: float | None = None
    shrunk_steps: int | None = None  # the finding's length after Hypothesis' shrinking, before reduction
    shrink_examples: int = 0  # the examples Hypothesis' shrinking ran
    known: Counter[str] = field(default_factory=Counter)  # known bug id -> hits (harness.ledger.known_bugs)
    known_traces: dict[str, dict[str, Any]] = field(default_factory=dict)  # known bug id -> its first trace
    interrupted: int | None = None  # the signal that stopped the run (the trace, if any: the smallest so far)

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


def fuzz_factory(opts: FuzzOptions) -> Callable[[], Any]:
    """``--target`` resolved (``TargetLoadError`` if it cannot be, also when loading it raises
    ``SystemExit``), wrapped in the oracle with ``--kv-check``."""
    return kv_checked(opts, target_of(opts))


def target_of(opts: FuzzOptions) -> Callable[[], Any]:
    """``--target`` resolved, unwrapped (``TargetLoadError`` if it cannot be, also on ``SystemExit``)."""
    from harness.mutants.registry import resolve_target
    from harness.targets import TargetLoadError

    try:
        return resolve_target(opts.target)
    except (TargetLoadError, KeyboardInterrupt):
        raise
    except BaseException as e:  # noqa: BLE001 - SystemExit from a user's module or factory must not end kvspec
        raise TargetLoadError(f"target {opts.target!r}: loading it raised {type(e).__name__}: {e}") from None


def kv_checked(opts: FuzzOptions, factory: Callable[[], Any]) -> Callable[[], Any]:
    """``factory`` wrapped in the KV-content oracle with ``--kv-check``, else as it is."""
    if not opts.kv_check:
        return factory
    from harness.oracle.target import KVCheckTarget

    def checked() -> Any:
        return KVCheckTarget(factory())

    return checked


def run_fuzz(
    opts: FuzzOptions,
    factory: Callable[[], Any],
    worker: int = 0,
    workers: int = 1,
    should_stop: Callable[[], bool] | None = None,
    on_batch: Callable[[FuzzResult, float], None] | None = None,
    settings_overrides: dict[str, Any] | None = None,
    bounded: bool = False,
    announce: Callable[[str], None] | None = None,
) -> FuzzResult:
    """Fuzz ``opts.families`` until the deadline (``opts.seconds``), a finding, a signal (``SIGNALS``,
    where installed), or ``should_stop()``.  ``settings_overrides`` go to the profile's Hypothesis settings (e.g.
    ``database=None``).  ``bounded``: the deadline bounds shrinking and reduction too (``kvspec fuzz``;
    the mutant campaign's budget is the time to find).  ``announce`` gets one line at the first finding."""
    from harness.check.machine import RunStats, ShrinkStalled, make_machine, run_machine
    from harness.run.profiles import generates, profile_settings
    from harness.traces.trace import Trace, trace_to_json

    stats = RunStats(poll=SIGNALS.poll, shrink_stall=opts.shrink_stall)
    machines = {
        fam: make_machine(fam, factory, opts.target, opts.relation, stats, opts.step_timeout, kv_check=opts.kv_check)
        for fam in opts.families
    }
    res = FuzzResult()
    start = time.monotonic()
    stats.started = start
    deadline = start + opts.seconds
    if bounded:
        stats.deadline, stats.shrink_share = deadline, _shrink_share(opts)
    if announce is not None:
        stats.on_finding = lambda finding, bound: announce(_found_line(finding, stats, bound, opts, bounded))
    # The replay profile only re-runs the database's examples: one turn per family is all there is.
    last_batch = None if generates(opts.profile) else len(opts.families)
    batch = 0
    while time.monotonic() < deadline and res.trace is None and res.stopped is None and batch != last_batch:
        if (should_stop is not None and should_stop()) or SIGNALS.signum is not None:
            break
        fam = opts.families[(batch + worker) % len(opts.families)]
        seed = opts.seed * 1_000_003 + batch * workers + worker
        batch += 1
        t0 = time.monotonic()
        try:
            run_machine(
                machines[fam],
                profile_settings(opts.profile, **{"max_examples": opts.batch, **(settings_overrides or {})}),
                seed=seed,
                shrink_seconds=opts.shrink_seconds,
            )
        except unittest.SkipTest as e:  # the replay profile with nothing stored for this machine is no run at all
            if last_batch is None:
                res.found_family, res.stopped = fam, f"SkipTest: {e}"
        except Interrupted as e:  # while generating or shrinking: the smallest failing trace so far, as it is
            res.interrupted = e.signum
            _keep_finding(res, stats, opts, seed, fam, factory, None, shortest=True)
        except ShrinkStalled:  # shrinking stopped helping: the smallest failing trace so far, reduced
            _keep_finding(res, stats, opts, seed, fam, factory, deadline if bounded else None, shortest=True)
        except BaseException as e:  # noqa: BLE001 - a finding, or Hypothesis giving up on the target
            if isinstance(e, KeyboardInterrupt):
                raise
            res.found_family = fam
            if not _keep_finding(res, stats, opts, seed, fam, factory, deadline if bounded else None):
                res.stopped = f"{type(e).__name__}: {e}"
        res.batches[fam] += 1
        res.family_time[fam] = res.family_time.get(fam, 0.0) + time.monotonic() - t0
        res.examples, res.steps = stats.examples, stats.steps
        res.elapsed = time.monotonic() - start
        if on_batch is not None:
            on_batch(res, res.elapsed)
    res.examples, res.steps = stats.examples, stats.steps
    res.events = Counter(stats.events)
    res.known = Counter(stats.known)
    for bug_id, (finding, steps, config) in stats.known_first.items():
        known = Trace(
            config=config,
            steps=steps,
            target_name=opts.target,
            target_version=stats.target_version,
            seed=opts.seed,
            profile=opts.profile,
            relation=opts.relation,
            finding=finding.to_json(),
        )
        res.known_traces.setdefault(bug_id, trace_to_json(known))
    res.skipped = dict(stats.skipped)
    res.elapsed = time.monotonic() - start
    if res.interrupted is None:
        res.interrupted = SIGNALS.signum
    return res


def _shrink_share(opts: FuzzOptions) -> float:
    """The share of the time left at the first finding that shrinking may take (the rest: reduction)."""
    shrink, reduce = float(opts.shrink_seconds), float(opts.reduce_seconds)
    return shrink / (shrink + reduce) if shrink + reduce > 0 else 1.0


def _found_line(finding: Any, stats: Any, shrink_bound: int, opts: FuzzOptions, bounded: bool) -> str:
    """What ``announce`` prints at the first finding (tests and users wait for it)."""
    after = stats.first_finding_after or 0.0
    within = f", within --seconds {opts.seconds:g}" if bounded else ""
    return (
        f"kvspec fuzz: found a failing example after {after:.1f}s ({finding.kind}); {_shrinking(opts, shrink_bound)}, "
        f"then reducing it for up to {float(opts.reduce_seconds):g}s{within} "
        "(SIGINT or SIGTERM: stop and write the smallest so far)"
    )


def _shrinking(opts: FuzzOptions, bound: int) -> str:
    """How the finding will be shrunk (``--shrink-stall``, ``--shrink-seconds``), in words."""
    if opts.shrink_stall == 0:
        return "no Hypothesis shrinking (--shrink-stall 0)"
    return f"shrinking it while that shortens it (stops after {opts.shrink_stall} examples without, or {bound}s)"


def _keep_finding(
    res: FuzzResult,
    stats: Any,
    opts: FuzzOptions,
    seed: int,
    fam: str,
    factory: Callable[[], Any],
    deadline: float | None,
    shortest: bool = False,
) -> bool:
    """Put the finding ``stats`` recorded into ``res``: Hypothesis' shrunk one, or (``shortest``:
    shrinking was stopped) the smallest recorded so far; reduced (within ``deadline``), except after a
    signal (``res.interrupted``), which keeps it as it is.  False when there is none."""
    from harness.traces.trace import trace_to_json

    trace = finding_trace(stats, opts.target, seed, opts.profile, fam, opts.relation, best=shortest)
    if trace is None:
        return False
    res.found_family, res.shrunk_steps, res.first_finding_after = fam, len(trace.steps), stats.first_finding_after
    res.shrink_examples = stats.shrink_examples
    finding = recorded(stats, shortest)[0]
    if res.interrupted is None:
        trace, finding = reduce_finding(trace, finding, factory, opts.reduce_seconds, opts.step_timeout, deadline)
    res.trace, res.summary = trace_to_json(trace), finding.summary()
    return True


def reduce_finding(
    trace: Any,
    finding: Any,
    factory: Callable[[], Any],
    seconds: float,
    step_timeout: float,
    deadline: float | None = None,
) -> tuple[Any, Any]:
    """The Hypothesis-shrunk finding reduced further by replaying operations (``harness.traces.reduce``)
    for up to ``seconds`` (``--reduce-seconds``; each target call up to ``step_timeout``), and not past
    ``deadline`` (a signal stops it with the smallest trace so far); the trace unchanged when reduction
    is off or finds nothing smaller."""
    from harness.traces.reduce import reduce_trace

    if deadline is not None:
        seconds = min(seconds, deadline - time.monotonic())
    if seconds <= 0 or SIGNALS.signum is not None:
        return trace, finding
    try:
        red = reduce_trace(
            trace.config,
            trace.ops,
            finding,
            factory,
            trace.relation,
            seconds,
            step_timeout,
            should_stop=lambda: SIGNALS.signum is not None,
        )
    except KeyboardInterrupt:
        raise
    except BaseException:  # noqa: BLE001 - it does not replay outside Hypothesis (a flaky target, a factory
        return trace, finding  # that raises, even SystemExit): keep it as shrunk
    trace.config, trace.steps, trace.finding = red.config, list(red.steps), red.finding.to_json()
    return trace, red.finding


def recorded(stats: Any, best: bool = False) -> tuple[Any, list[tuple[Any, Any]], Any]:
    """The finding ``stats`` recorded last (``best``: the shortest so far, when there is one), with its
    steps and config; the finding is None when there is none."""
    if best and stats.best is not None:
        return stats.best  # type: ignore[no-any-return]
    return stats.finding, stats.finding_steps, stats.finding_config


def finding_trace(
    stats: Any,
    target: str,
    seed: int | None,
    profile: str | None,
    family: str,
    relation: str,
    best: bool = False,
) -> Any:
    """The ``Trace`` of the finding ``stats`` recorded last (``best``: the shortest so far); None when
    the run stopped without one."""
    from harness.traces.trace import Trace

    finding, steps, config = recorded(stats, best)
    if finding is None or config is None:
        return None
    return Trace(
        config=config,
        steps=list(steps),
        target_name=target,
        target_version=stats.target_version,
        seed=seed,
        profile=profile,
        family=family,
        relation=relation,
        finding=finding.to_json(),
    )


def progress_line(elapsed: float, res: FuzzResult, families: Sequence[str], workers: int = 1) -> str:
    who = f"  {workers} workers" if workers > 1 else ""
    return (
        f"\r{elapsed:6.1f}s  {res.steps / max(elapsed, 1e-9):8.0f} steps/s  {res.examples:6d} examples  "
        f"families {len(res.batches)}/{len(families)}{who}   "
    )
