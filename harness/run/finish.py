"""The end of ``kvspec fuzz``: the summary, the one report (written so that it is never lost: a
fallback folder under the system temp dir when ``--out`` fails at write time), the known bugs met,
the JUnit XML, and the exit status (``harness.cli`` documents the codes)."""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvspec.harness.drivers.base import signal_name
from kvspec.harness.run.exits import EXIT_FOUND, EXIT_OK, EXIT_UNCHECKED, EXIT_USAGE, exit_on_signal
from kvspec.harness.run.fuzzing import FuzzResult
from kvspec.harness.run.options import FuzzOptions


def finish_fuzz(opts: FuzzOptions, res: FuzzResult, verbose: bool) -> int:
    """Print the coverage and the summary, write the one report and the JUnit XML; the exit status:
    0 nothing found, 1 a finding (its report written, under ``--out`` or, failing that, under the
    system temp dir), ``128 + signal`` after SIGINT (130) or SIGTERM (143), whether a report was
    written or not; 2 when the JUnit XML cannot be written after all and nothing else failed."""
    if verbose:
        for fam in opts.families:
            items = sorted((k.split(":", 1)[1], v) for k, v in res.events.items() if k.startswith(fam + ":"))
            print(f"  {fam}: " + ", ".join(f"{k} {v}" for k, v in items), file=sys.stderr)
    el = res.elapsed
    report = None
    if res.trace is not None:
        report = _report_finding(opts, res)
    elif res.interrupted is not None:
        print(
            f"kvspec fuzz: interrupted by {signal_name(res.interrupted)} after {el:.1f}s: no finding "
            f"({res.steps} steps, {res.examples} examples, target {opts.target}); no report written"
        )
    elif res.stopped is not None:
        print(f"kvspec fuzz: the run stopped on {res.stopped}", file=sys.stderr)
    elif res.steps == 0:
        print(f"kvspec fuzz: CHECKED NOTHING in {el:.1f}s, target {opts.target}: {nothing_checked(res, opts.profile)}")
    else:
        ran = [f for f in _families(opts, res) if f not in res.skipped]
        skipped = f" (skipped: {','.join(res.skipped)})" if res.skipped else ""
        detail = f"; {res.detail}" if res.detail else ""
        print(
            f"kvspec fuzz: no finding; target {opts.target}, {res.examples} examples, {res.steps} steps in {el:.1f}s "
            f"({res.steps / max(el, 1e-9):.0f} steps/s), families {','.join(ran)}{skipped}{detail}"
        )
    known_reports = _print_known(opts, res)
    junit_ok = _write_fuzz_junit_safely(opts, res, report)
    junit_ok &= _tell_ci(opts, res, report, known_reports)
    if res.interrupted is not None:
        return exit_on_signal(res.interrupted)
    if res.trace is not None or res.stopped is not None:
        return EXIT_FOUND
    if res.steps == 0:
        return EXIT_UNCHECKED
    return EXIT_OK if junit_ok else EXIT_USAGE


def nothing_checked(res: FuzzResult, profile: str | None = None) -> str:
    """Why a run checked no operation: each family refused, with the target's reason, nothing stored to
    replay (the ``replay`` profile), or no example finished."""
    from kvspec.harness.run.profiles import generates

    if res.skipped:
        return "every family was refused: " + "; ".join(f"{fam}: {why}" for fam, why in res.skipped.items())
    if profile is not None and not generates(profile):
        return f"profile {profile} only replays the example database, and it holds no example of these families"
    if res.examples == 0:
        return "no example finished within --seconds (a slow start-up? raise --seconds)"
    return f"{res.examples} examples ran but none applied an operation"


def _families(opts: FuzzOptions, res: FuzzResult) -> tuple[str, ...]:
    """The run's families: those its driver planned (it may run fewer or others than were chosen)."""
    return res.families or opts.families


def _report_finding(opts: FuzzOptions, res: FuzzResult) -> Path | None:
    """Write the finding's report (``write_report_safely``) and say what was found and where."""
    from kvspec.harness.run.startup import process_seconds
    from kvspec.harness.traces.report import replay_command
    from kvspec.harness.traces.trace import trace_from_json

    assert res.trace is not None
    trace = trace_from_json(res.trace)
    report = write_report_safely(opts.out, trace)
    if res.interrupted is not None:
        print(
            f"kvspec fuzz: interrupted by {signal_name(res.interrupted)} after {res.elapsed:.1f}s; FOUND {res.summary} "
            f"(first failing example after {res.first_finding_after or 0:.1f}s; the smallest failing trace so far: "
            f"{len(trace.steps)} steps)"
        )
    else:
        print(
            f"kvspec fuzz: FOUND {res.summary} (first failing example after {res.first_finding_after or 0:.1f}s, "
            f"{_shrunk(opts, res)} and reduced to {len(trace.steps)})"
        )
    if report is not None:
        print(
            f"kvspec fuzz: report written to {report} after {res.elapsed:.1f}s "
            f"({process_seconds():.1f}s from the command's start, start-up included; {len(trace.steps)} steps; "
            f"replay with: {replay_command(report, trace.target_name)})"
        )
    return report


def _shrunk(opts: FuzzOptions, res: FuzzResult) -> str:
    """What Hypothesis' shrinking did before the reduction (``--shrink-stall``)."""
    if opts.shrink_stall == 0:
        return f"{res.shrunk_steps} steps, not shrunk (--shrink-stall 0),"
    return f"then shrunk to {res.shrunk_steps} steps in {res.shrink_examples} examples"


def write_report_safely(out: str | Path, trace: Any, name: str | None = None, replace: bool = False) -> Path | None:
    """``write_report`` under ``out``; when that fails (disk full, the folder removed meanwhile), under a
    fresh folder of the system temp dir, said loudly on stderr; when that fails too, the trace JSON is
    printed on stdout.  A finding is never lost.  The path written, or None."""
    from kvspec.harness.traces.report import write_report
    from kvspec.harness.traces.trace import dumps_trace

    try:
        return write_report(out, trace, name=name, replace=replace)
    except OSError as e:
        error = f"{type(e).__name__}: {e}"
    try:
        fallback = Path(tempfile.mkdtemp(prefix="kvspec-reports-"))
        os.chmod(fallback, 0o777 & ~_umask())  # readable like the report in it (mkdtemp makes it 0700)
        path = write_report(fallback, trace, name=name)
    except Exception as e:  # noqa: BLE001 - the last resort below still keeps the finding
        print(
            f"kvspec fuzz: ERROR: could not write the report under {out} ({error}) nor under the temp dir "
            f"({type(e).__name__}: {e}); the trace follows, save it as trace.json to replay it:",
            file=sys.stderr,
        )
        print(dumps_trace(trace))
        return None
    print(
        f"kvspec fuzz: WARNING: could not write the report under {out} ({error}); wrote it to {path} instead",
        file=sys.stderr,
    )
    return path


def _umask() -> int:
    """The process' umask (reading it means setting it: put back at once)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _print_known(opts: FuzzOptions, res: FuzzResult) -> dict[str, Path | None]:
    """The known bugs met (they do not fail the run): hits, and one report each, written once; where
    each report is."""
    from kvspec.harness.ledger.known_bugs import describe_meeting, get_known_bug
    from kvspec.harness.traces.trace import trace_from_json

    written: dict[str, Path | None] = {}
    for bug_id, hits in sorted(res.known.items()):
        bug = get_known_bug(bug_id)
        name = f"known-{bug.id}-{bug.name}"
        where: Path | None = Path(opts.out) / name
        if bug_id in res.known_traces:  # this run's meeting replaces an earlier run's report
            trace = trace_from_json(res.known_traces[bug_id])
            trace.extra.setdefault(
                "what_went_wrong", describe_meeting(bug, str((trace.finding or {}).get("message", "")))
            )
            where = write_report_safely(opts.out, trace, name=name, replace=True)
        print(
            f"kvspec fuzz: known bug {bug.id} ({bug.name}): {hits} hits, counted, not failing the run; "
            f"upstream: {bug.status}; report {where}; see {bug.report}"
        )
        written[bug_id] = where if where is not None and where.exists() else None
    return written


def _tell_ci(opts: FuzzOptions, res: FuzzResult, report: Path | None, known: dict[str, Path | None]) -> bool:
    """SARIF (``--sarif``), GitHub annotations and the step summary (under Actions), as
    ``harness.run.ci_output`` says; False (and said on stderr) when a file cannot be written."""
    from kvspec.harness import __version__
    from kvspec.harness.run import ci_output

    if not (opts.sarif or opts.github_annotations or opts.step_summary):
        return True
    outcomes = ci_output.get_outcomes(opts.target, res, report, known)
    for line in ci_output.github_annotations(outcomes) if opts.github_annotations else ():
        print(line)
    sarif_ok = _written("the SARIF log", opts.sarif, lambda p: ci_output.write_sarif(p, outcomes, __version__))
    summary_ok = _written(
        "the step summary", opts.step_summary, lambda p: ci_output.append_step_summary(p, _ci_summary(res, outcomes))
    )
    return sarif_ok and summary_ok


def _written(what: str, path: str | None, write: Callable[[str], None]) -> bool:
    """``write(path)`` when a path is given; False, and said on stderr, when it cannot be written."""
    if not path:
        return True
    try:
        write(path)
    except OSError as e:
        print(f"kvspec fuzz: ERROR: could not write {what} to {path}: {type(e).__name__}: {e}", file=sys.stderr)
        return False
    return True


def _ci_summary(res: FuzzResult, outcomes: list[Any]) -> str:
    from kvspec.harness.run import ci_output

    if res.trace is not None:
        headline = "**The run failed on a finding**: its report and how to replay it are below."
    else:
        headline = f"No finding: {res.examples} examples, {res.steps} steps in {res.elapsed:.0f}s."
    return ci_output.step_summary(outcomes, headline)


def _write_fuzz_junit_safely(opts: FuzzOptions, res: FuzzResult, report: Any) -> bool:
    """The JUnit XML, if asked for; False (and said on stderr) when it cannot be written after all."""
    return _written("the JUnit XML", opts.junit_xml, lambda p: _write_fuzz_junit(p, opts, res, report))


def _write_fuzz_junit(path: str, opts: FuzzOptions, res: FuzzResult, report: Any) -> None:
    from kvspec.harness.run.junit import Case, write_junit
    from kvspec.harness.traces.report import replay_command

    cls = f"kvspec.fuzz.{opts.target}"
    cases = []
    for fam in _families(opts, res):
        t = res.family_time.get(fam, 0.0)
        if fam == res.found_family and (res.trace is not None or res.stopped is not None):
            msg = res.summary or f"the run stopped on {res.stopped}"
            replay = replay_command(report, opts.target) if report else ""
            details = f"{msg}\nreport: {report}\nreplay: {replay}\n" if report else msg
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
    write_junit(path, "kvspec fuzz", cases, res.elapsed)
