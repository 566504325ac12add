"""``kvspec``: the command line users script in CI (also ``python -m harness``).

- ``kvspec fuzz --target T --family F --seconds N --seed S --out DIR``: exit 0 if nothing was
  found, 1 if a report was written, 2 on bad usage or a target that cannot be loaded;
- ``kvspec replay PATH...``: exit 0 if every trace behaves as recorded, 1 otherwise, 2 on a bad file;
- ``kvspec report PATH``: print the report of a trace;
- ``kvspec prove ...``: the Z3 proofs (``harness.proofs``).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from typing import Any

EXIT_OK, EXIT_FOUND, EXIT_USAGE = 0, 1, 2


class UsageError(Exception):
    pass


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kvspec", description="Differential fuzzing of KV-cache managers against kvspec's model of vLLM 0.33.")
    sub = p.add_subparsers(dest="command", required=True)
    f = sub.add_parser("fuzz", help="fuzz a target against the spec for N seconds")
    f.add_argument("--target", default="spec", help="spec, vllm, impl, mutant:NAME or package.module:factory")
    f.add_argument("--family", default="all", help="comma-separated config families, or 'all'")
    f.add_argument("--seconds", type=float, default=60.0)
    f.add_argument("--seed", type=int, default=0)
    f.add_argument("--out", default="kvspec-reports", help="report folder (written only on a finding)")
    f.add_argument("--relation", default="exact", help="equality relation: exact, outcomes, invariants")
    f.add_argument("--profile", default="dev", help="Hypothesis profile: dev, ci, nightly")
    f.add_argument("--step-timeout", type=float, default=10.0, help="seconds one target call may take")
    f.add_argument("--batch", type=int, default=10, help="examples per family before rotating")
    f.add_argument("--shrink-seconds", type=int, default=60, help="time bound for shrinking a finding")
    f.add_argument("--stats", action="store_true", help="print per-family rule and event counts at the end (always on a terminal)")
    f.add_argument("--kv-check", action="store_true", help="also check KV contents with the oracle (harness/oracle.py)")
    r = sub.add_parser("replay", help="replay traces (files or folders); exit 1 if any departs from its record")
    r.add_argument("paths", nargs="+")
    r.add_argument("--target", default=None, help="replay on this target instead of the recorded one")
    r.add_argument("--step-timeout", type=float, default=10.0)
    rp = sub.add_parser("report", help="print the report of a trace")
    rp.add_argument("path")
    sub.add_parser("prove", help="run the Z3 proofs", add_help=False)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "prove":
        try:
            from harness.proofs import prove_main  # type: ignore[attr-defined]
        except ImportError as e:
            print(f"kvspec prove: not available: {e}", file=sys.stderr)
            return EXIT_USAGE
        return int(prove_main(argv[1:]) or 0)
    try:
        args = _parser().parse_args(argv)
    except SystemExit as e:
        return EXIT_USAGE if e.code not in (0, None) else EXIT_OK
    try:
        if args.command == "fuzz":
            return fuzz(args)
        if args.command == "replay":
            return replay_cmd(args)
        if args.command == "report":
            return report_cmd(args)
    except UsageError as e:
        print(f"kvspec {args.command}: {e}", file=sys.stderr)
        return EXIT_USAGE
    return EXIT_USAGE


# --- fuzz ------------------------------------------------------------------------------------------


def fuzz(args: argparse.Namespace) -> int:
    from harness.equality import RELATIONS
    from harness.families import parse_families
    from harness.machine import RunStats, make_machine, run_machine
    from harness.profiles import profile_settings
    from harness.report import write_report
    from harness.mutants import resolve_target
    from harness.targets import TargetLoadError
    from harness.trace import Trace

    try:
        families = parse_families(args.family)
    except ValueError as e:
        raise UsageError(str(e)) from None
    if args.relation not in RELATIONS:
        raise UsageError(f"unknown relation {args.relation!r} (known: {', '.join(RELATIONS)})")
    if args.seconds <= 0:
        raise UsageError("--seconds must be > 0")
    try:
        profile_settings(args.profile)
    except ValueError as e:
        raise UsageError(str(e)) from None
    try:
        factory = resolve_target(args.target)
    except TargetLoadError as e:
        raise UsageError(str(e)) from None

    if args.kv_check:
        from harness.oracle import KVCheckTarget

        inner_factory = factory

        def factory() -> Any:
            return KVCheckTarget(inner_factory())

    stats = RunStats()
    machines = {
        fam: make_machine(fam, factory, args.target, args.relation, stats, args.step_timeout, kv_check=args.kv_check)
        for fam in families
    }
    covered: Counter[str] = Counter()
    tty = sys.stderr.isatty()
    start = time.monotonic()
    stats.started = start
    deadline = start + args.seconds
    batch = 0
    last_print = 0.0
    found = None
    while time.monotonic() < deadline and found is None:
        fam = families[batch % len(families)]
        seed = args.seed * 1_000_003 + batch
        batch += 1
        try:
            run_machine(machines[fam], profile_settings(args.profile, max_examples=args.batch), seed=seed, shrink_seconds=args.shrink_seconds)
        except BaseException as e:  # noqa: BLE001 - a finding, or Hypothesis giving up on the target
            if isinstance(e, KeyboardInterrupt):
                raise
            found = (fam, seed, e)
        covered[fam] += 1
        now = time.monotonic()
        if tty and now - last_print > 0.5:
            last_print = now
            el = now - start
            print(f"\r{el:6.1f}s  {stats.steps / max(el, 1e-9):8.0f} steps/s  {stats.examples:6d} examples  families {len(covered)}/{len(families)}   ",
                  end="", file=sys.stderr, flush=True)
    elapsed = time.monotonic() - start
    if tty:
        print(file=sys.stderr)
    _print_coverage(stats, families, verbose=tty or args.stats)
    if found is None:
        print(f"kvspec fuzz: no finding; target {args.target}, {stats.examples} examples, {stats.steps} steps in {elapsed:.1f}s "
              f"({stats.steps / max(elapsed, 1e-9):.0f} steps/s), families {','.join(families)}")
        return EXIT_OK
    fam, seed, exc = found
    if stats.finding is None or stats.finding_config is None:
        print(f"kvspec fuzz: the run stopped on {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_FOUND
    trace = Trace(
        config=stats.finding_config,
        steps=stats.finding_steps,
        target_name=args.target,
        target_version=stats.target_version,
        seed=seed,
        profile=args.profile,
        family=fam,
        relation=args.relation,
        finding=stats.finding.to_json(),
    )
    path = write_report(args.out, trace)
    print(f"kvspec fuzz: FOUND {stats.finding.summary()} (first failing example after {stats.first_finding_after or 0:.1f}s, then shrunk)")
    print(f"kvspec fuzz: report written to {path} after {elapsed:.1f}s ({len(trace.steps)} steps; replay with: kvspec replay {path})")
    return EXIT_FOUND


def _print_coverage(stats: Any, families: list[str], verbose: bool) -> None:
    if not verbose:
        return
    ev = stats.events
    for fam in families:
        items = sorted((k.split(":", 1)[1], v) for k, v in ev.items() if k.startswith(fam + ":"))
        print(f"  {fam}: " + ", ".join(f"{k} {v}" for k, v in items), file=sys.stderr)


# --- replay / report ---------------------------------------------------------------------------------


def replay_cmd(args: argparse.Namespace) -> int:
    from harness.ops import TraceFormatError
    from harness.replay import replay
    from harness.mutants import resolve_target
    from harness.targets import TargetLoadError
    from harness.trace import find_traces, read_trace

    try:
        paths = find_traces(args.paths)
        traces = [(p, read_trace(p)) for p in paths]
    except TraceFormatError as e:
        raise UsageError(str(e)) from None
    factories: dict[str, object] = {}
    bad = 0
    for p, trace in traces:
        name = args.target or trace.target_name
        if name not in factories:
            try:
                factories[name] = resolve_target(name)
            except TargetLoadError as e:
                raise UsageError(str(e)) from None
        result = replay(trace, factories[name], args.step_timeout)  # type: ignore[arg-type]
        print(f"{'ok  ' if result.ok else 'FAIL'} {p}: {result.message}")
        bad += not result.ok
    print(f"kvspec replay: {len(traces) - bad}/{len(traces)} trace(s) behaved as recorded")
    return EXIT_OK if bad == 0 else EXIT_FOUND


def report_cmd(args: argparse.Namespace) -> int:
    from harness.ops import TraceFormatError
    from harness.report import render_report
    from harness.trace import read_trace

    try:
        trace = read_trace(args.path)
    except TraceFormatError as e:
        raise UsageError(str(e)) from None
    print(render_report(trace), end="")
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
