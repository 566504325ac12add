"""``kvspec replay``: recorded traces re-run, each by the driver of the target it is replayed on.

Every file is read, every target chosen (``harness.run.catalogue.replay_target``: a trace file never
chooses code to run) and resolved, and every trace checked by its driver before anything runs; then
each trace is replayed (``CatalogueEntry.replay``: the manager lockstep replays its operations,
vLLM's real scheduler re-drives its recorded run) and a line says whether it behaved as recorded.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from kvspec.harness.check.settings import CheckSettings
from kvspec.harness.run.exits import EXIT_FOUND, EXIT_OK
from kvspec.harness.run.options import UsageError

if TYPE_CHECKING:
    from kvspec.harness.run.catalogue import CatalogueEntry
    from kvspec.harness.traces.replay import ReplayResult
    from kvspec.harness.traces.trace import Trace


@dataclass(frozen=True)
class Replay:
    """One trace to replay: where it was read, the trace, and the target it runs on."""

    path: Path
    trace: Trace
    target: str


def replay_paths(
    paths: list[str],
    target: str | None,
    trust: bool,
    checks: CheckSettings,
    assume_release: str | None = None,
    junit_xml: str | None = None,
) -> int:
    """The whole ``kvspec replay``: 0 if every trace behaves as recorded, 1 otherwise; ``UsageError``
    (exit 2) for a bad file or target, before anything runs."""
    replays, entries = _prepared(paths, target, trust, assume_release)
    cases = []
    for r in replays:
        t0 = time.monotonic()
        result = entries[r.target].replay(r.trace, str(r.path), checks)
        print(f"{'ok  ' if result.ok else 'FAIL'} {r.path}: {result.message}")
        cases.append((r, time.monotonic() - t0, result))
    bad = sum(not result.ok for _, _, result in cases)
    print(f"kvspec replay: {len(cases) - bad}/{len(cases)} trace(s) behaved as recorded")
    if junit_xml:
        _write_junit(junit_xml, cases)
    return EXIT_OK if bad == 0 else EXIT_FOUND


def _prepared(
    paths: list[str], target: str | None, trust: bool, assume_release: str | None
) -> tuple[list[Replay], dict[str, CatalogueEntry]]:
    """Every trace read, its target chosen and resolved, and checked by that target's driver."""
    from kvspec.harness.core.strict_json import TraceFormatError
    from kvspec.harness.drivers.base import DriveSettings
    from kvspec.harness.run.catalogue import UntrustedTarget, replay_target, resolve
    from kvspec.harness.targets import TargetLoadError
    from kvspec.harness.traces.folders import find_traces

    try:
        found = find_traces(paths)
        replays = [Replay(p, t, replay_target(t, p, target, trust)) for p, t in found.traces]
        entries = {name: resolve(name, assume_release) for name in dict.fromkeys(r.target for r in replays)}
        for r in replays:
            entries[r.target].make_driver(DriveSettings(target=r.target)).check_trace(r.trace, str(r.path))
    except (TraceFormatError, UntrustedTarget, TargetLoadError, ValueError) as e:
        raise UsageError(str(e)) from None
    for p, why in found.skipped:
        print(f"kvspec replay: skipped {p}: {why}", file=sys.stderr)
    return replays, entries


def _write_junit(path: str, cases: list[tuple[Replay, float, ReplayResult]]) -> None:
    from kvspec.harness.run.junit import Case, write_junit

    out = []
    for r, t, result in cases:
        cls = f"kvspec.replay.{r.target}"
        if result.ok:
            out.append(Case(cls, str(r.path), t))
            continue
        kind = result.finding.kind if result.finding else "error"
        details = f"{result.message}\ntrace: {r.path}\nreplay: kvspec replay {r.path}\n"
        out.append(Case(cls, str(r.path), t, failure=result.message, failure_type=kind, details=details))
    write_junit(path, "kvspec replay", out, sum(t for _, t, _ in cases))
