"""``kvspec``: the command line users script in CI (also ``python -m harness``).

- ``kvspec fuzz --target T --family F --seconds N --seed S --out DIR``: exit 0 if nothing was
  found, 1 if a report was written (under DIR, or, if DIR cannot be written after all, under a fresh
  folder of the system temp dir, said on stderr), 2 on bad usage (every option is checked before any
  work: numbers finite and in range, DIR a folder that can be created and written) or a target that
  cannot be loaded, 130 on SIGINT and 143 on SIGTERM (the run stops cleanly; a finding already made,
  even one still being shrunk or reduced, is written first, the smallest trace so far, and the
  message says where).  ``--seconds`` bounds the whole run, shrinking and reduction included, plus a
  few seconds for the batch under way and the report;
- ``kvspec replay PATH...``: exit 0 if every trace behaves as recorded, 1 otherwise, 2 on a bad file;
- ``kvspec report PATH``: print the report of a trace;
- ``kvspec mutants [--target T]``: the deliberate-bug campaign (``harness.campaign``); exit 1 if one survives;
- ``kvspec prove ...``: the Z3 proofs (``harness.proofs``).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from harness.run.options import FuzzOptions, MutantsOptions, UsageError, fuzz_environ

EXIT_OK, EXIT_FOUND, EXIT_USAGE = 0, 1, 2


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="kvspec", description="Differential fuzzing of KV-cache managers against kvspec's model of vLLM 0.33."
    )
    sub = p.add_subparsers(dest="command", required=True)
    D = FuzzOptions  # the defaults (class attributes of the dataclass), so the two cannot drift
    f = sub.add_parser("fuzz", help="fuzz a target against the spec for N seconds")
    f.add_argument("--target", default=D.target, help="spec, vllm, impl, mutant:NAME or package.module:factory")
    f.add_argument("--family", default="all", help="comma-separated config families, or 'all'")
    f.add_argument(
        "--seconds", type=float, default=D.seconds, help="wall-time bound of the whole run, shrinking included (> 0)"
    )
    f.add_argument("--seed", type=int, default=D.seed, help="any integer")
    f.add_argument("--out", default=D.out, help="report folder (written only on a finding; checked writable first)")
    f.add_argument(
        "--relation",
        default=None,
        help="equality relation: exact, outcomes, invariants (default: the target's own; vLLM and impl: exact, "
        "a manager that is not vLLM: invariants; the first line says which and why)",
    )
    f.add_argument("--profile", default=D.profile, help="Hypothesis profile: dev, ci, nightly")
    f.add_argument(
        "--step-timeout", type=float, default=D.step_timeout, help="seconds one target call may take (> 0, <= 86400)"
    )
    f.add_argument("--batch", type=int, default=D.batch, help="examples per family before rotating (>= 1)")
    f.add_argument(
        "--shrink-seconds",
        type=int,
        default=D.shrink_seconds,
        help="time bound for Hypothesis' shrinking of a finding (0..86400; also capped by the time --seconds leaves)",
    )
    f.add_argument(
        "--shrink-stall",
        type=int,
        default=D.shrink_stall,
        help="let Hypothesis shrink a finding until this many examples in a row found no shorter failing trace, "
        "before the reduction takes over from the shortest one (0..1000000; default 0: the reduction alone, "
        "which reaches traces as short, faster)",
    )
    f.add_argument(
        "--reduce-seconds",
        type=float,
        default=D.reduce_seconds,
        help="time bound for reducing the shrunk trace by replaying operations (harness/traces/reduce.py); 0: off "
        "(0..86400; also capped by the time --seconds leaves)",
    )
    f.add_argument(
        "--stats", action="store_true", help="print per-family rule and event counts at the end (always on a terminal)"
    )
    f.add_argument("--kv-check", action="store_true", help="also check KV contents with the oracle (harness/oracle/)")
    f.add_argument(
        "--strict-known", action="store_true", help="known target bugs (harness/ledger/known_bugs.py) fail the run too"
    )
    f.add_argument("--no-ledger", action="store_true", help="turn the KV ledger off (harness/ledger/; on by default)")
    f.add_argument(
        "--no-agreement",
        action="store_true",
        help="--target vllm-scheduler: do not compare kvspec's scheduler model with the real one (on by default)",
    )
    f.add_argument(
        "--no-world-checks",
        action="store_true",
        help="--target vllm-scheduler: turn the world's facts in the ledger and conservation off (on by default)",
    )
    f.add_argument(
        "--db",
        default=None,
        help="example database: a folder or redis://host:port/n (default $KVSPEC_DB, else .hypothesis/examples)",
    )
    f.add_argument(
        "--workers",
        type=int,
        default=D.workers,
        help="N processes (1..256), one Hypothesis engine each, on the one database; the first finding stops all",
    )
    f.add_argument("--junit-xml", default=None, metavar="PATH", help="also write JUnit XML: one testcase per family")
    r = sub.add_parser(
        "replay",
        help="replay traces (files or folders); exit 1 if any departs from its record, 2 on a bad file",
        description="Replay traces: exit 0 if every one behaves as recorded, 1 if one departs from its record, "
        "2 on bad usage or a bad trace file.  A folder is walked for kvspec traces (*.json files with a "
        "'kvspec_trace' field; other .json files are skipped and listed, hidden folders and virtualenvs not "
        "entered).  A trace is data: its recorded target is used only if it is built in (spec, impl, vllm, "
        "mutant:NAME); a recorded package.module:factory needs --target or --trust-trace-target.",
    )
    r.add_argument("paths", nargs="+", help="trace files, or folders holding them")
    r.add_argument(
        "--target",
        default=None,
        help="replay on this target (spec, vllm, impl, mutant:NAME or package.module:factory) "
        "instead of the one each trace records",
    )
    r.add_argument(
        "--trust-trace-target",
        action="store_true",
        help="use a trace's recorded package.module:factory target: imports and calls code the trace file "
        "names, so only for trace files you trust (without it such a trace is refused, exit 2)",
    )
    r.add_argument("--step-timeout", type=float, default=10.0)
    r.add_argument("--junit-xml", default=None, metavar="PATH", help="also write JUnit XML: one testcase per trace")
    rp = sub.add_parser("report", help="print the report of a trace; exit 2 on a bad file")
    rp.add_argument("path", help="a trace file, or a report folder holding trace.json")
    sub.add_parser("prove", help="run the Z3 proofs", add_help=False)
    sub.add_parser(
        "pd", help="P/D pre-allocation: `pd check`, `pd simulate` (docs/pd-preallocation.md)", add_help=False
    )
    sub.add_parser(
        "releases", help="the vLLM releases kvspec models; `releases diff OLD NEW` (docs/releases.md)", add_help=False
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
    if argv and argv[0] == "releases":
        from harness.releases.cli import releases_main

        return releases_main(argv[1:])
    try:
        args = _parser().parse_args(argv)
    except SystemExit as e:
        return EXIT_USAGE if e.code not in (0, None) else EXIT_OK
    try:
        if args.command == "fuzz":
            opts = FuzzOptions.from_namespace(args)
            with fuzz_environ(opts):
                return fuzz(opts, relation_given=args.relation is not None)
        if args.command == "replay":
            return replay_cmd(args)
        if args.command == "report":
            return report_cmd(args)
        if args.command == "mutants":
            from harness.campaign import mutants_cmd

            return mutants_cmd(MutantsOptions.from_namespace(args))
    except UsageError as e:
        print(f"kvspec {args.command}: {e}", file=sys.stderr)
        return EXIT_USAGE
    return EXIT_USAGE


# --- fuzz ------------------------------------------------------------------------------------------


def fuzz(opts: FuzzOptions, relation_given: bool = True) -> int:
    """``kvspec fuzz``, its options already checked (``FuzzOptions.from_namespace``) and set in the
    environment (``fuzz_environ``); without ``relation_given`` the target's own relation replaces
    ``opts.relation`` (``harness.run.relation_choice``): the run with SIGINT and SIGTERM handled
    (``harness.run.signals.SIGNALS``: a clean stop that keeps a finding), then the summary and the
    report (``finish_fuzz``)."""
    from harness.run.finish import finish_fuzz
    from harness.run.fuzzing import FuzzResult
    from harness.run.signals import SIGNALS, Interrupted
    from harness.vllm_sched.fuzz import fuzz_cli, handles

    if handles(opts.target):  # vLLM's real scheduler drives the manager (harness/vllm_sched/)
        return fuzz_cli(opts)
    tty = sys.stderr.isatty()
    with SIGNALS.installed():
        try:
            with SIGNALS.armed():
                opts, factory, choice = _load_fuzz_target(opts, relation_given)
            workers = f", {opts.workers} workers" if opts.workers > 1 else ""
            print(
                f"kvspec fuzz: target {opts.target}, families {','.join(opts.families)}, up to {opts.seconds:g}s, "
                f"seed {opts.seed}{workers}; reports to {opts.out}\n"
                f"kvspec fuzz: {choice.line(ledger=not opts.no_ledger)}",
                file=sys.stderr,
                flush=True,
            )
            res = _run_fuzz(opts, factory, tty)
        except Interrupted as e:  # while the target was loading
            res = FuzzResult(interrupted=e.signum)
        if tty:
            print(file=sys.stderr)
        return finish_fuzz(opts, res, verbose=tty or opts.stats)


def _run_fuzz(opts: FuzzOptions, factory: Any, tty: bool) -> Any:
    """One process (a progress line on a terminal) or ``--workers`` processes; the ``FuzzResult``."""
    from harness.run.fuzzing import progress_line, run_fuzz

    if opts.workers > 1:
        from harness.run.workers import fuzz_workers

        return fuzz_workers(opts, progress=tty)
    last = [0.0]

    def on_batch(r: Any, elapsed: float) -> None:
        if tty and elapsed - last[0] > 0.5:
            last[0] = elapsed
            print(progress_line(elapsed, r, opts.families), end="", file=sys.stderr, flush=True)

    def announce(line: str) -> None:
        print(("\n" if tty else "") + line, file=sys.stderr, flush=True)

    return run_fuzz(opts, factory, on_batch=on_batch, bounded=True, announce=announce)


def _load_fuzz_target(opts: FuzzOptions, relation_given: bool) -> tuple[FuzzOptions, Any, Any]:
    """The target factory ``--target`` names (wrapped for ``--kv-check``), ``opts`` under the relation
    in force (``--relation``, else the target's own: ``harness.run.relation_choice``) and that choice,
    whose line the run prints first.  ``UsageError`` when the target cannot be loaded (also when
    loading it raises ``SystemExit``) or declares a relation that does not exist."""
    from dataclasses import replace

    from harness.mutants.registry import is_builtin_target
    from harness.run.fuzzing import kv_checked, target_of
    from harness.run.relation_choice import choose_relation
    from harness.targets import TargetLoadError

    try:
        factory = target_of(opts)
    except TargetLoadError as e:
        raise UsageError(str(e)) from None
    given = opts.relation if relation_given else None
    choice = choose_relation(given, opts.target, None if is_builtin_target(opts.target) else factory)
    return replace(opts, relation=choice.relation), kv_checked(opts, factory), choice


# --- pd ----------------------------------------------------------------------------------------------


def pd_cmd(argv: list[str]) -> int:
    """``kvspec pd check|simulate``: the P/D pre-allocation study (``harness.pd.cli``)."""
    from harness.pd.cli import main as pd_main

    return pd_main(argv)


# --- replay / report ---------------------------------------------------------------------------------


def replay_cmd(args: argparse.Namespace) -> int:
    from harness.core.glimpse import check_full_check_every_env
    from harness.core.strict_json import TraceFormatError
    from harness.mutants.registry import resolve_target
    from harness.targets import TargetLoadError
    from harness.traces.folders import find_traces
    from harness.traces.replay import UntrustedTarget, replay, replay_target

    if not 0 <= args.step_timeout <= 86400:  # NaN too
        raise UsageError(f"--step-timeout must be in [0, 86400] seconds (0: none), got {args.step_timeout}")
    try:
        check_full_check_every_env()  # KVSPEC_FULL_CHECK_EVERY (harness.core.glimpse)
    except ValueError as e:
        raise UsageError(str(e)) from None
    from harness.vllm_sched.fuzz import handles, recorded_by_scheduler

    if not args.target and recorded_by_scheduler(args.paths):
        args.target = "vllm-scheduler"  # findings only re-driving the real scheduler reproduces
    if args.target and handles(args.target):
        return _replay_scheduler(args)
    # Every file is read and every target chosen and loaded before anything runs.
    try:
        found = find_traces(args.paths)
        traces = [(p, t, replay_target(t, p, args.target, args.trust_trace_target)) for p, t in found.traces]
        factories = {name: resolve_target(name) for name in dict.fromkeys(name for _, _, name in traces)}
    except (TraceFormatError, UntrustedTarget, TargetLoadError) as e:
        raise UsageError(str(e)) from None
    for p, why in found.skipped:
        print(f"kvspec replay: skipped {p}: {why}", file=sys.stderr)
    bad = 0
    cases = []
    for p, trace, name in traces:
        t0 = time.monotonic()
        result = replay(trace, factories[name], args.step_timeout)
        print(f"{'ok  ' if result.ok else 'FAIL'} {p}: {result.message}")
        bad += not result.ok
        cases.append((str(p), name, time.monotonic() - t0, result))
    print(f"kvspec replay: {len(traces) - bad}/{len(traces)} trace(s) behaved as recorded")
    if args.junit_xml:
        from harness.run.junit import Case, write_junit

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


def _replay_scheduler(args: argparse.Namespace) -> int:
    """``kvspec replay --target vllm-scheduler`` (or ``mutant:NAME`` of a scheduler mutant): each
    report of the real scheduler's fuzz re-drives the real scheduler from its recorded run
    (``harness.vllm_sched.fuzz.replay_scheduler_run``); every file is checked before any run."""
    from harness.core.strict_json import TraceFormatError
    from harness.targets.vllm import VllmUnavailable, _vllm
    from harness.traces.folders import find_traces
    from harness.vllm_sched.fuzz import TARGET_NAME, replay_scheduler_run, scheduler_run_of

    try:
        found = find_traces(args.paths)
        for p, t in found.traces:
            scheduler_run_of(t, str(p))
        _vllm()
    except (TraceFormatError, ValueError, VllmUnavailable) as e:
        raise UsageError(str(e)) from None
    if args.junit_xml:
        raise UsageError(f"--junit-xml is not written by --target {args.target}")
    for p, why in found.skipped:
        print(f"kvspec replay: skipped {p}: {why}", file=sys.stderr)
    mutant = None if args.target == TARGET_NAME else args.target.split(":", 1)[1]
    bad = 0
    for p, trace in found.traces:
        result = replay_scheduler_run(trace, str(p), mutant)
        print(f"{'ok  ' if result.ok else 'FAIL'} {p}: {result.message}")
        bad += not result.ok
    print(f"kvspec replay: {len(found.traces) - bad}/{len(found.traces)} scheduler run(s) ended without a finding")
    return EXIT_OK if bad == 0 else EXIT_FOUND


def report_cmd(args: argparse.Namespace) -> int:
    from harness.core.strict_json import TraceFormatError
    from harness.traces.report import render_report
    from harness.traces.trace import read_trace

    try:
        trace = read_trace(args.path)
    except TraceFormatError as e:
        raise UsageError(str(e)) from None
    print(render_report(trace), end="")
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
