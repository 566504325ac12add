"""What a fuzz run tells a CI system besides its exit status and JUnit: SARIF, GitHub annotations and
the GitHub step summary.

- ``--sarif PATH``: a SARIF 2.1.0 log (what code-scanning services read): one result per finding
  (level ``error``) and per known target bug met (level ``warning``: it does not fail the run), each
  with its rule (``<kind>/<invariant>``, ``known-bug/K1``), the summary as its message, the report
  folder's ``report.md`` as its location, and the replay command.
- Under GitHub Actions (``GITHUB_ACTIONS=true``, read by the CLI: ``FuzzOptions.github_annotations``):
  one ``::error`` workflow command per finding and one ``::warning`` per known bug, printed on
  stdout, where the runner reads them.
- ``GITHUB_STEP_SUMMARY`` (``FuzzOptions.step_summary``): a Markdown section appended to the job's
  summary page: the outcome, the report, how to replay it, the known bugs met.

Every writer here is handed what to say; none reads the environment (the CLI does, ``from_environ``).

Imports: harness.run, harness.traces, harness.ledger.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvspec.harness.run.paths import write_file_atomically

SARIF_VERSION = "2.1.0"
SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"


@dataclass(frozen=True)
class Outcome:
    """One thing a run reports: a finding or a known bug met."""

    rule: str  # ``<kind>/<invariant>`` or ``known-bug/<id>``
    level: str  # ``error`` (fails the run) or ``warning`` (counted, not failing)
    title: str  # one line
    message: str  # the summary
    report: Path | None  # the report folder, if one was written
    replay: str | None  # the command that replays it
    help: str | None = None  # a write-up (a known bug's)


def get_outcomes(target: str, res: Any, report: Path | None, known_reports: dict[str, Path | None]) -> list[Outcome]:
    """The run's finding (if any) and the known bugs it met, as ``Outcome`` s."""
    from kvspec.harness.ledger.known_bugs import get_known_bug
    from kvspec.harness.traces.report import replay_command

    out = []
    if res.trace is not None:
        finding = res.trace.get("finding") or {}
        kind = str(finding.get("kind", "finding"))
        rule = f"{kind}/{finding['invariant']}" if finding.get("invariant") else kind
        replay = replay_command(report, target) if report is not None else None
        out.append(Outcome(rule, "error", f"kvspec: {kind} on target {target}", res.summary or kind, report, replay))
    for bug_id, hits in sorted(res.known.items()):
        bug = get_known_bug(bug_id)
        where = known_reports.get(bug_id)
        replay = f"{replay_command(where, target)} --strict-known" if where is not None else None
        message = f"known bug {bug.id} ({bug.name}): {hits} hits; counted, not failing the run; upstream: {bug.status}"
        out.append(
            Outcome(f"known-bug/{bug.id}", "warning", f"kvspec: known bug {bug.id}", message, where, replay, bug.report)
        )
    return out


def sarif_log(outcomes: list[Outcome], version: str) -> dict[str, Any]:
    """The SARIF 2.1.0 log of ``outcomes`` (module docstring)."""
    rules: dict[str, dict[str, Any]] = {}
    results = []
    for o in outcomes:
        rule = rules.setdefault(o.rule, {"id": o.rule, "shortDescription": {"text": o.title}})
        if o.help:
            rule["help"] = {"text": f"write-up: {o.help}"}
        result: dict[str, Any] = {"ruleId": o.rule, "level": o.level, "message": {"text": o.message}}
        if o.report is not None:
            uri = (o.report / "report.md").as_posix()
            result["locations"] = [{"physicalLocation": {"artifactLocation": {"uri": uri}}}]
        if o.replay:
            result["properties"] = {"replay": o.replay}
        results.append(result)
    driver = {"name": "kvspec", "version": version, "rules": list(rules.values())}
    failed = any(o.level == "error" for o in outcomes)
    run = {"tool": {"driver": driver}, "results": results, "invocations": [{"executionSuccessful": not failed}]}
    return {"$schema": SARIF_SCHEMA, "version": SARIF_VERSION, "runs": [run]}


def write_sarif(path: str | Path, outcomes: list[Outcome], version: str) -> None:
    """``sarif_log`` written atomically to ``path``."""
    write_file_atomically(Path(path), (json.dumps(sarif_log(outcomes, version), indent=2) + "\n").encode())


def github_annotations(outcomes: list[Outcome]) -> list[str]:
    """One GitHub workflow command per outcome (``::error`` or ``::warning``, escaped as the runner
    requires: ``%``, CR and LF in the text; also ``:`` and ``,`` in properties)."""
    lines = []
    for o in outcomes:
        text = o.message + (f" (report: {o.report}; replay: {o.replay})" if o.report is not None else "")
        props = f"title={_escape_property(o.title)}"
        if o.report is not None:
            props += f",file={_escape_property((o.report / 'report.md').as_posix())}"
        lines.append(f"::{o.level} {props}::{_escape_data(text)}")
    return lines


def step_summary(outcomes: list[Outcome], headline: str) -> str:
    """The Markdown section for ``$GITHUB_STEP_SUMMARY``: the run's headline, then each outcome."""
    lines = ["## kvspec fuzz", "", headline, ""]
    for o in outcomes:
        mark = "**Finding**" if o.level == "error" else "Known bug (not failing the run)"
        lines.append(f"- {mark}: {o.message}")
        if o.report is not None:
            lines.append(f"  - report: `{o.report / 'report.md'}`; replay: `{o.replay}`")
        if o.help:
            lines.append(f"  - write-up: `{o.help}`")
    return "\n".join(lines) + "\n"


def append_step_summary(path: str | Path, text: str) -> None:
    """Append ``text`` to the step summary file (GitHub gives each step one; appending is its contract)."""
    with open(path, "a", encoding="utf-8") as f:
        f.write(text)


def _escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")
