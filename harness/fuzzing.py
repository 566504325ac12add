"""The fuzzing loop behind ``kvspec fuzz``: rotate the families, run one Hypothesis batch per turn,
stop at the deadline, at the first finding, or when told to (``should_stop``).

``run_fuzz`` is what one process does; ``harness.workers`` runs it in N processes on the one example
database.  ``finish_fuzz`` prints the summary, writes the one report (and the JUnit XML), and
returns the exit status.  Batch ``b`` of worker ``i`` of ``n`` runs family ``(b + i) % F`` with seed
``seed * 1_000_003 + b * n + i``, so one worker reproduces the single-process run exactly.
"""

from __future__ import annotations

import argparse
import sys
import time
import unittest
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

EXIT_OK, EXIT_FOUND = 0, 1


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
    known: Counter[str] = field(default_factory=Counter)  # known bug id -> hits (harness.known_bugs)
    known_traces: dict[str, dict[str, Any]] = field(default_factory=dict)  # known bug id -> its first trace

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


def fuzz_factory(args: argparse.Namespace) -> Callable[[], Any]:
    """``--target`` resolved (``TargetLoadError`` if it cannot be), wrapped in the oracle with ``--kv-check``."""
    from harness.mutants import resolve_target

    factory = resolve_target(args.target)
    if not args.kv_check:
        return factory
    from harness.oracle import KVCheckTarget

    def checked() -> Any:
        return KVCheckTarget(factory())

    return checked


def run_fuzz(
    args: argparse.Namespace,
    families: list[str],
    factory: Callable[[], Any],
    worker: int = 0,
    workers: int = 1,
    should_stop: Callable[[], bool] | None = None,
    on_batch: Callable[[FuzzResult, float], None] | None = None,
    settings_overrides: dict[str, Any] | None = None,
) -> FuzzResult:
    """Fuzz until the deadline (``args.seconds``), a finding, or ``should_stop()``.
    ``settings_overrides`` go to the profile's Hypothesis settings (e.g. ``database=None``)."""
    from harness.machine import RunStats, make_machine, run_machine
    from harness.profiles import generates, profile_settings
    from harness.trace import Trace, trace_to_json

    stats = RunStats()
    machines = {
        fam: make_machine(fam, factory, args.target, args.relation, stats, args.step_timeout, kv_check=args.kv_check)
        for fam in families
    }
    res = FuzzResult()
    start = time.monotonic()
    stats.started = start
    deadline = start + args.seconds
    # The replay profile only re-runs the database's examples: one turn per family is all there is.
    last_batch = None if generates(args.profile) else len(families)
    batch = 0
    while time.monotonic() < deadline and res.trace is None and res.stopped is None and batch != last_batch:
        if should_stop is not None and should_stop():
            break
        fam = families[(batch + worker) % len(families)]
        seed = args.seed * 1_000_003 + batch * workers + worker
        batch += 1
        t0 = time.monotonic()
        try:
            run_machine(
                machines[fam],
                profile_settings(args.profile, **{"max_examples": args.batch, **(settings_overrides or {})}),
                seed=seed,
                shrink_seconds=args.shrink_seconds,
            )
        except unittest.SkipTest as e:  # the replay profile with nothing stored for this machine is no run at all
            if last_batch is None:
                res.found_family, res.stopped = fam, f"SkipTest: {e}"
        except BaseException as e:  # noqa: BLE001 - a finding, or Hypothesis giving up on the target
            if isinstance(e, KeyboardInterrupt):
                raise
            res.found_family = fam
            trace = finding_trace(stats, args.target, seed, args.profile, fam, args.relation)
            if trace is None or stats.finding is None:
                res.stopped = f"{type(e).__name__}: {e}"
            else:
                res.shrunk_steps = len(trace.steps)
                trace, finding = reduce_finding(trace, stats.finding, factory, args)
                res.trace = trace_to_json(trace)
                res.summary = finding.summary()
                res.first_finding_after = stats.first_finding_after
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
            target_name=args.target,
            target_version=stats.target_version,
            seed=args.seed,
            profile=args.profile,
            relation=args.relation,
            finding=finding.to_json(),
        )
        res.known_traces.setdefault(bug_id, trace_to_json(known))
    res.skipped = dict(stats.skipped)
    res.elapsed = time.monotonic() - start
    return res


def reduce_finding(trace: Any, finding: Any, factory: Callable[[], Any], args: argparse.Namespace) -> tuple[Any, Any]:
    """The Hypothesis-shrunk finding reduced further by replaying operations (``harness.reduce``)
    for up to ``--reduce-seconds``; the trace unchanged when reduction is off or finds nothing smaller."""
    from harness.reduce import reduce_trace

    seconds = getattr(args, "reduce_seconds", 0.0)
    if seconds <= 0:
        return trace, finding
    try:
        red = reduce_trace(trace.config, trace.ops, finding, factory, trace.relation, seconds, args.step_timeout)
    except ValueError:  # the finding does not replay outside Hypothesis (a flaky target): keep it as shrunk
        return trace, finding
    trace.config, trace.steps, trace.finding = red.config, list(red.steps), red.finding.to_json()
    return trace, red.finding


def finding_trace(stats: Any, target: str, seed: int | None, profile: str | None, family: str, relation: str) -> Any:
    """The ``Trace`` of the finding ``stats`` recorded (None when the run stopped without one)."""
    from harness.trace import Trace

    if stats.finding is None or stats.finding_config is None:
        return None
    return Trace(
        config=stats.finding_config,
        steps=stats.finding_steps,
        target_name=target,
        target_version=stats.target_version,
        seed=seed,
        profile=profile,
        family=family,
        relation=relation,
        finding=stats.finding.to_json(),
    )


def progress_line(elapsed: float, res: FuzzResult, families: list[str], workers: int = 1) -> str:
    who = f"  {workers} workers" if workers > 1 else ""
    return (
        f"\r{elapsed:6.1f}s  {res.steps / max(elapsed, 1e-9):8.0f} steps/s  {res.examples:6d} examples  "
        f"families {len(res.batches)}/{len(families)}{who}   "
    )


def finish_fuzz(args: argparse.Namespace, families: list[str], res: FuzzResult, verbose: bool) -> int:
    """Print the coverage and the summary, write the one report and the JUnit XML; the exit status."""
    from harness.report import write_report
    from harness.trace import trace_from_json

    if verbose:
        for fam in families:
            items = sorted((k.split(":", 1)[1], v) for k, v in res.events.items() if k.startswith(fam + ":"))
            print(f"  {fam}: " + ", ".join(f"{k} {v}" for k, v in items), file=sys.stderr)
    el = res.elapsed
    report = None
    if res.trace is not None:
        trace = trace_from_json(res.trace)
        report = write_report(args.out, trace)
        print(
            f"kvspec fuzz: FOUND {res.summary} (first failing example after {res.first_finding_after or 0:.1f}s, "
            f"then shrunk to {res.shrunk_steps} steps and reduced to {len(trace.steps)})"
        )
        print(
            f"kvspec fuzz: report written to {report} after {el:.1f}s "
            f"({len(trace.steps)} steps; replay with: kvspec replay {report})"
        )
    elif res.stopped is not None:
        print(f"kvspec fuzz: the run stopped on {res.stopped}", file=sys.stderr)
    else:
        print(
            f"kvspec fuzz: no finding; target {args.target}, {res.examples} examples, {res.steps} steps in {el:.1f}s "
            f"({res.steps / max(el, 1e-9):.0f} steps/s), families {','.join(families)}"
        )
    _print_known(args, res)
    if getattr(args, "junit_xml", None):
        _write_fuzz_junit(args, families, res, report)
    return EXIT_OK if res.trace is None and res.stopped is None else EXIT_FOUND


def _print_known(args: argparse.Namespace, res: FuzzResult) -> None:
    """The known bugs met (they do not fail the run): hits, and one report each, written once."""
    from pathlib import Path

    from harness.known_bugs import get_known_bug
    from harness.report import write_report
    from harness.trace import trace_from_json

    for bug_id, hits in sorted(res.known.items()):
        bug = get_known_bug(bug_id)
        name = f"known-{bug.id}-{bug.name}"
        where = Path(args.out) / name
        if not where.exists() and bug_id in res.known_traces:
            where = write_report(args.out, trace_from_json(res.known_traces[bug_id]), name=name)
        print(
            f"kvspec fuzz: known bug {bug.id} ({bug.name}): {hits} hits; {bug.status}; report {where}; see {bug.report}"
        )


def _write_fuzz_junit(args: argparse.Namespace, families: list[str], res: FuzzResult, report: Any) -> None:
    from harness.junit import Case, write_junit

    cls = f"kvspec.fuzz.{args.target}"
    cases = []
    for fam in families:
        t = res.family_time.get(fam, 0.0)
        if fam == res.found_family and (res.trace is not None or res.stopped is not None):
            msg = res.summary or f"the run stopped on {res.stopped}"
            details = f"{msg}\nreport: {report}\nreplay: kvspec replay {report}\n" if report else msg
            cases.append(
                Case(
                    cls,
                    fam,
                    t,
                    failure=msg,
                    failure_type=(res.trace or {}).get("finding", {}).get("kind", "error"),
                    details=details,
                )
            )
        elif fam in res.skipped:
            cases.append(Case(cls, fam, t, skipped=f"the target models none of this family: {res.skipped[fam]}"))
        elif not res.batches.get(fam):
            cases.append(Case(cls, fam, t, skipped="not reached within the time budget"))
        else:
            cases.append(Case(cls, fam, t))
    write_junit(args.junit_xml, "kvspec fuzz", cases, res.elapsed)
