"""``kvspec releases``: the vLLM releases kvspec models, and what an upgrade between two of them changes.

    kvspec releases                       every supported release: its changes, the installed one
    kvspec releases diff OLD NEW          the behaviour changes met driving OLD and NEW alike
        [--seconds N] [--seed S] [--family F] [--out DIR]

``diff`` exits 1 when it met a change (each printed with the operation, both outcomes, the smallest
trace and the observable, grouped by operation and counted), 0 when it met none, 2 on bad input.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections import Counter
from importlib import metadata
from pathlib import Path
from typing import Any

from kvspec.harness.releases.diff import DiffResult, Met, diff_releases
from kvspec.harness.run.exits import EXIT_FOUND, EXIT_OK, EXIT_USAGE
from kvspec.harness.run.options import (
    DAY,
    FuzzOptions,
    NumberRange,
    UsageError,
    check_choices,
    check_numbers,
    check_writable_folder,
)
from kvspec.spec.releases.line import RELEASES, UnknownRelease, changes_between, require_known


def releases_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="kvspec releases", description="The vLLM releases kvspec models.")
    sub = p.add_subparsers(dest="command")
    d = sub.add_parser("diff", help="the behaviour changes between two releases (exit 1 when any)")
    d.add_argument("old")
    d.add_argument("new")
    d.add_argument("--seconds", type=float, default=60.0, help="the whole run (default 60)")
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--family", default="all", help="config families (comma-separated or 'all')")
    d.add_argument("--out", default="kvspec-reports", help="where the traces of the changes go")
    try:
        args = p.parse_args(argv)
    except SystemExit as e:
        return EXIT_USAGE if e.code not in (0, None) else EXIT_OK
    if args.command is None:
        print(render_list(installed_vllm()))
        return EXIT_OK
    try:
        old, new = require_known(args.old), require_known(args.new)
        check_numbers(args, (NumberRange("--seconds", 0, DAY, low_open=True),))
        families = check_choices(args.family, "exact")
        check_writable_folder("--out", args.out, args.out)
    except (UnknownRelease, UsageError) as e:
        print(f"kvspec releases diff: {e}", file=sys.stderr)
        return EXIT_USAGE
    opts = FuzzOptions(target="releases-diff", families=families, seconds=args.seconds, seed=args.seed, out=args.out)
    return run_diff(old, new, opts)


def installed_vllm() -> str | None:
    """The installed vLLM release, read from its package metadata (vLLM itself is not imported)."""
    try:
        return metadata.version("vllm")
    except metadata.PackageNotFoundError:
        return None


def render_list(installed: str | None) -> str:
    """One line per release: its version, what it changes from the release before (kvspec's
    ``spec.releases`` changes), and which one is installed."""
    span = f"{RELEASES[0]} to {RELEASES[-1]}; 0.33.0 is the base reading"
    lines = [f"kvspec models {len(RELEASES)} vLLM releases ({span}):"]
    for prev, release in zip((None, *RELEASES), RELEASES):
        made = [c.name for c in changes_between(prev, release)] if prev else []
        mark = "  (installed)" if installed and installed.split("+")[0] == release else ""
        what = ", ".join(made) if made else "-"
        lines.append(f"  {release:<8} changes: {what}{mark}")
    if installed and installed.split("+")[0] not in RELEASES:
        lines.append(f"installed vLLM {installed} is not a release kvspec models (see `kvspec fuzz --target vllm`)")
    lines.append("docs/releases.md says what each change does; `kvspec releases diff OLD NEW` shows it.")
    return "\n".join(lines)


def run_diff(old: str, new: str, opts: FuzzOptions) -> int:
    from kvspec.harness.run.catalogue import manager_entry
    from kvspec.harness.run.fuzzing import run_fuzz
    from kvspec.harness.traces.replay import replay
    from kvspec.harness.traces.trace import trace_from_json

    print(
        f"kvspec releases diff: {old} -> {new}: the spec under each, the same seeded workloads, exact relation; "
        f"up to {opts.seconds:g}s, seed {opts.seed}",
        flush=True,
    )

    def run(factory: Any, left: float) -> Any:
        left_opts = FuzzOptions(**{**opts.__dict__, "seconds": left})
        target = manager_entry(opts.target, factory, relation=opts.relation)
        return run_fuzz(left_opts, target, bounded=True, settings_overrides={"database": None})

    def replay_ok(trace: dict[str, Any], factory: Any) -> bool:
        return bool(replay(trace_from_json(trace), factory, opts.checks()).ok)

    def announce(met: Met) -> None:
        print(f"kvspec releases diff: met {met.knob} after {met.found_after:.1f}s", flush=True)

    res = diff_releases(old, new, run, replay_ok, opts.seconds, on_met=announce)
    out = write_traces(res, Path(opts.out))
    print(render_diff(res, out))
    return EXIT_FOUND if res.changed else EXIT_OK


def render_diff(res: DiffResult, out: Path | None) -> str:
    lines = []
    for i, met in enumerate(res.met, 1):
        f = met.finding
        op = f.get("op") or {}
        lines.append(f"change {i}: {met.knob}")
        for c in met.changes:
            lines.append(f"  {c.name} ({c.release}; vLLM {c.models})")
            lines.append(f"    {c.summary}")
        lines.append(f"  met at step {f.get('step')} of {len(met.trace.get('steps', []))}: {_call(op)}")
        lines.append(f"    {res.old}: {json.dumps(f.get('expected'))}")
        lines.append(f"    {res.new}: {json.dumps(f.get('actual'))}")
        lines.append(f"  observable: {f.get('kind')}: {f.get('message')}")
        if out is not None:
            lines.append(f"  trace: {out / (met.knob + '.json')}")
    if res.unattributed is not None:
        f = res.unattributed.get("finding") or {}
        lines.append(f"unattributed: no single modelled change explains: {f.get('message')}")
        if out is not None:
            lines.append(f"  trace: {out / 'unattributed.json'}")
    by_op = Counter(str((m.finding.get("op") or {}).get("op")) for m in res.met)
    grouped = ", ".join(f"{op} {n}" for op, n in sorted(by_op.items()))
    head = (
        f"kvspec releases diff: {res.old} -> {res.new}: {len(res.met)} behaviour change(s) met"
        + (f" ({grouped})" if grouped else "")
        + f" of {len(res.knobs)} modelled; {res.examples} examples, {res.steps} steps in {res.elapsed:.1f}s"
    )
    if not res.changed:
        head += "; no behaviour change met"
    return "\n".join([*lines, head])


def _call(op: dict[str, Any]) -> str:
    args = ", ".join(f"{k}={json.dumps(v)}" for k, v in op.items() if k != "op")
    return f"{op.get('op')}({args})"


def write_traces(res: DiffResult, root: Path) -> Path | None:
    """Each change's trace (and an unattributed one) as ``<root>/releases-diff-OLD-NEW/<knob>.json``,
    each written whole (a temporary file renamed)."""
    items = [(m.knob, m.trace) for m in res.met]
    if res.unattributed is not None:
        items.append(("unattributed", res.unattributed))
    if not items:
        return None
    out = root / f"releases-diff-{res.old}-{res.new}"
    out.mkdir(parents=True, exist_ok=True)
    for name, trace in items:
        fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=out)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(trace, fh, indent=1)
        os.replace(tmp, out / f"{name}.json")
    return out
