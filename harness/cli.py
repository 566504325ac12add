"""``kvspec``: the command line users script in CI (also ``python -m harness``).

- ``kvspec fuzz --target T --family F --seconds N --seed S --out DIR``: exit 0 if nothing was
  found, 1 if a report was written, 2 on bad usage or a target that cannot be loaded;
- ``kvspec replay PATH...``: exit 0 if every trace behaves as recorded, 1 otherwise, 2 on a bad file;
- ``kvspec report PATH``: print the report of a trace;
- ``kvspec mutants [--target T]``: the deliberate-bug campaign (``harness.campaign``); exit 1 if one survives;
- ``kvspec prove ...``: the Z3 proofs (``harness.proofs``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from collections.abc import Iterator
from typing import Any

EXIT_OK, EXIT_FOUND, EXIT_USAGE = 0, 1, 2


class UsageError(Exception):
    pass


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="kvspec", description="Differential fuzzing of KV-cache managers against kvspec's model of vLLM 0.33."
    )
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
    f.add_argument("--shrink-seconds", type=int, default=10, help="time bound for Hypothesis' shrinking of a finding")
    f.add_argument(
        "--reduce-seconds",
        type=float,
        default=15.0,
        help="time bound for reducing the shrunk trace by replaying operations (harness/reduce.py); 0: off",
    )
    f.add_argument(
        "--stats", action="store_true", help="print per-family rule and event counts at the end (always on a terminal)"
    )
    f.add_argument("--kv-check", action="store_true", help="also check KV contents with the oracle (harness/oracle.py)")
    f.add_argument(
        "--strict-known", action="store_true", help="known target bugs (harness/known_bugs.py) fail the run too"
    )
    f.add_argument("--no-ledger", action="store_true", help="turn the KV ledger off (harness/ledger.py; on by default)")
    f.add_argument(
        "--db",
        default=None,
        help="example database: a folder or redis://host:port/n (default $KVSPEC_DB, else .hypothesis/examples)",
    )
    f.add_argument(
        "--workers",
        type=int,
        default=1,
        help="N processes, one Hypothesis engine each, on the one database; the first finding stops all",
    )
    f.add_argument("--junit-xml", default=None, metavar="PATH", help="also write JUnit XML: one testcase per family")
    r = sub.add_parser("replay", help="replay traces (files or folders); exit 1 if any departs from its record")
    r.add_argument("paths", nargs="+")
    r.add_argument("--target", default=None, help="replay on this target instead of the recorded one")
    r.add_argument("--step-timeout", type=float, default=10.0)
    r.add_argument("--junit-xml", default=None, metavar="PATH", help="also write JUnit XML: one testcase per trace")
    rp = sub.add_parser("report", help="print the report of a trace")
    rp.add_argument("path")
    sub.add_parser("prove", help="run the Z3 proofs", add_help=False)
    sub.add_parser(
        "pd", help="P/D pre-allocation: `pd check`, `pd simulate` (docs/pd-preallocation.md)", add_help=False
    )
    from harness.campaign import add_parser as add_mutants_parser

    add_mutants_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "prove":
        try:
            from harness.proofs import prove_main
        except ImportError as e:
            print(f"kvspec prove: not available: {e}", file=sys.stderr)
            return EXIT_USAGE
        return int(prove_main(argv[1:]) or 0)
    if argv and argv[0] == "pd":
        return pd_cmd(argv[1:])
    try:
        args = _parser().parse_args(argv)
    except SystemExit as e:
        return EXIT_USAGE if e.code not in (0, None) else EXIT_OK
    try:
        if args.command == "fuzz":
            with _restored_environ("KVSPEC_DB", "KVSPEC_LEDGER", "KVSPEC_STRICT_KNOWN"):
                return fuzz(args)
        if args.command == "replay":
            return replay_cmd(args)
        if args.command == "report":
            return report_cmd(args)
        if args.command == "mutants":
            from harness.campaign import mutants_cmd

            return mutants_cmd(args)
    except UsageError as e:
        print(f"kvspec {args.command}: {e}", file=sys.stderr)
        return EXIT_USAGE
    return EXIT_USAGE


@contextlib.contextmanager
def _restored_environ(*names: str) -> Iterator[None]:
    """``fuzz`` hands its options to worker processes through these variables; the caller's
    environment is put back afterwards (``main`` may be called again in the same process)."""
    saved = {n: os.environ.get(n) for n in names}
    try:
        yield
    finally:
        for n, v in saved.items():
            if v is None:
                os.environ.pop(n, None)
            else:
                os.environ[n] = v


# --- fuzz ------------------------------------------------------------------------------------------


def fuzz(args: argparse.Namespace) -> int:
    from harness.equality import RELATIONS
    from harness.families import parse_families
    from harness.fuzzing import finish_fuzz, fuzz_factory, progress_line, run_fuzz
    from harness.profiles import check_database, profile_settings
    from harness.targets import TargetLoadError

    try:
        families = parse_families(args.family)
    except ValueError as e:
        raise UsageError(str(e)) from None
    if args.relation not in RELATIONS:
        raise UsageError(f"unknown relation {args.relation!r} (known: {', '.join(RELATIONS)})")
    if args.seconds <= 0:
        raise UsageError("--seconds must be > 0")
    if args.workers < 1:
        raise UsageError("--workers must be >= 1")
    try:
        check_database(args.db)
        profile_settings(args.profile)
    except ValueError as e:
        raise UsageError(str(e)) from None
    if args.db:
        os.environ["KVSPEC_DB"] = args.db  # this process' profiles, and the workers it starts
    if args.no_ledger:
        os.environ["KVSPEC_LEDGER"] = "0"  # harness.lockstep.ledger_enabled, here and in the workers
    if args.strict_known:
        os.environ["KVSPEC_STRICT_KNOWN"] = "1"  # harness.known_bugs.strict_known, likewise
    try:
        factory = fuzz_factory(args)
    except TargetLoadError as e:
        raise UsageError(str(e)) from None
    tty = sys.stderr.isatty()
    if args.workers > 1:
        from harness.workers import fuzz_workers

        res = fuzz_workers(args, families, progress=tty)
    else:
        last = [0.0]

        def on_batch(r: Any, elapsed: float) -> None:
            if tty and elapsed - last[0] > 0.5:
                last[0] = elapsed
                print(progress_line(elapsed, r, families), end="", file=sys.stderr, flush=True)

        res = run_fuzz(args, families, factory, on_batch=on_batch)
    if tty:
        print(file=sys.stderr)
    return finish_fuzz(args, families, res, verbose=tty or args.stats)


# --- pd ----------------------------------------------------------------------------------------------


def pd_cmd(argv: list[str]) -> int:
    """``kvspec pd check|simulate``: the P/D pre-allocation study (``harness.pd.cli``)."""
    from harness.pd.cli import main as pd_main

    return pd_main(argv)


# --- replay / report ---------------------------------------------------------------------------------


def replay_cmd(args: argparse.Namespace) -> int:
    from harness.mutants import resolve_target
    from harness.ops import TraceFormatError
    from harness.replay import replay
    from harness.targets import TargetLoadError
    from harness.trace import find_traces, read_trace

    try:
        paths = find_traces(args.paths)
        traces = [(p, read_trace(p)) for p in paths]
    except TraceFormatError as e:
        raise UsageError(str(e)) from None
    factories: dict[str, object] = {}
    bad = 0
    cases = []
    for p, trace in traces:
        name = args.target or trace.target_name
        if name not in factories:
            try:
                factories[name] = resolve_target(name)
            except TargetLoadError as e:
                raise UsageError(str(e)) from None
        t0 = time.monotonic()
        result = replay(trace, factories[name], args.step_timeout)  # type: ignore[arg-type]
        print(f"{'ok  ' if result.ok else 'FAIL'} {p}: {result.message}")
        bad += not result.ok
        cases.append((str(p), name, time.monotonic() - t0, result))
    print(f"kvspec replay: {len(traces) - bad}/{len(traces)} trace(s) behaved as recorded")
    if args.junit_xml:
        from harness.junit import Case, write_junit

        write_junit(
            args.junit_xml,
            "kvspec replay",
            [
                Case(f"kvspec.replay.{target}", path, t)
                if r.ok
                else Case(
                    f"kvspec.replay.{target}",
                    path,
                    t,
                    failure=r.message,
                    failure_type=r.finding.kind if r.finding else "error",
                    details=f"{r.message}\ntrace: {path}\nreplay: kvspec replay {path}\n",
                )
                for path, target, t, r in cases
            ],
            sum(c[2] for c in cases),
        )
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
