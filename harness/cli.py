"""``kvspec``: the command line users script in CI (also ``python -m kvspec.harness``).

- ``kvspec fuzz --target T --family F --seconds N --seed S --out DIR``: exit 0 if nothing was
  found, 1 if a report was written (under DIR, or, if DIR cannot be written after all, under a fresh
  folder of the system temp dir, said on stderr), 2 on bad usage (every option is checked before any
  work: numbers finite and in range, DIR a folder that can be created and written) or a target that
  cannot be loaded, 4 if the run checked nothing (every family refused, or no example finished: the
  line says why), 130 on SIGINT and 143 on SIGTERM (the run stops cleanly; a finding already made,
  even one still being shrunk or reduced, is written first, the smallest trace so far, and the
  message says where).  ``--seconds`` bounds the whole run, shrinking and reduction included, plus a
  few seconds for the batch under way and the report.  The target runs in a supervised child
  (``harness.run.supervise``): one that crashes (a signal, ``os._exit``, ``abort``) is a
  ``target-crashed`` finding with its report, unless ``--in-process``;
- ``kvspec replay PATH...``: exit 0 if every trace behaves as recorded, 1 otherwise, 2 on a bad file;
- ``kvspec report PATH``: print the report of a trace;
- ``kvspec mutants [--target T]``: the deliberate-bug campaign (``harness.campaign``); exit 1 if one survives;
- ``kvspec prove ...``: the Z3 proofs (``harness.proofs``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

from kvspec.harness.run.exits import EXIT_OK, EXIT_USAGE, exit_on_signal
from kvspec.harness.run.options import DefaultsShown, FuzzOptions, MutantsOptions, UsageError


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="kvspec", description="Differential fuzzing of KV-cache managers against kvspec's model of vLLM 0.33."
    )
    sub = p.add_subparsers(dest="command", required=True)
    _add_fuzz(sub)
    _add_replay(sub)
    rp = sub.add_parser("report", help="print the report of a trace; exit 2 on a bad file")
    rp.add_argument("path", help="a trace file, or a report folder holding trace.json")
    sub.add_parser("prove", help="run the Z3 proofs", add_help=False)
    sub.add_parser(
        "pd", help="P/D pre-allocation: `pd check`, `pd simulate` (docs/pd-preallocation.md)", add_help=False
    )
    sub.add_parser(
        "releases", help="the vLLM releases kvspec models; `releases diff OLD NEW` (docs/releases.md)", add_help=False
    )
    from kvspec.harness.campaign import add_parser as add_mutants_parser

    add_mutants_parser(sub)
    from kvspec.harness.engine_cli import add_engine_parser

    add_engine_parser(sub)
    return p


TARGETS_HELP = (
    "spec, vllm, impl, vllm-fixed, vllm-scheduler, vllm-engine, sglang, mutant:NAME or package.module:factory"
)


def _add_fuzz(sub: Any) -> None:
    """``kvspec fuzz``: its options, the defaults read from ``FuzzOptions`` (so the two cannot drift)."""
    D = FuzzOptions
    f = sub.add_parser("fuzz", help="fuzz a target against the spec for N seconds", formatter_class=DefaultsShown)
    f.add_argument("--target", default=D.target, help=TARGETS_HELP)
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
    _add_fuzz_finding(f)
    _add_fuzz_checks(f)
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
    f.add_argument(
        "--sarif",
        default=None,
        metavar="PATH",
        help="also write a SARIF 2.1.0 log: the finding (error) and the known bugs met (warning), for code scanning",
    )


def _add_fuzz_finding(f: argparse.ArgumentParser) -> None:
    """``kvspec fuzz``'s options for what happens to a finding: shrinking and reduction."""
    D = FuzzOptions
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


def _add_fuzz_checks(f: argparse.ArgumentParser) -> None:
    """``kvspec fuzz``'s switches for what is checked and shown."""
    f.add_argument(
        "--stats", action="store_true", help="print per-family rule and event counts at the end (always on a terminal)"
    )
    f.add_argument("--kv-check", action="store_true", help="also check KV contents with the oracle (harness/oracle/)")
    f.add_argument(
        "--in-process",
        action="store_true",
        help="run the target in kvspec's own process, not in a supervised child: no report if it crashes "
        "(for a debugger; harness/run/supervise.py)",
    )
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


def _add_replay(sub: Any) -> None:
    r = sub.add_parser(
        "replay",
        help="replay traces (files or folders); exit 1 if any departs from its record, 2 on a bad file",
        description="Replay traces: exit 0 if every one behaves as recorded, 1 if one departs from its record, "
        "2 on bad usage or a bad trace file.  A folder is walked for kvspec traces (*.json files with a "
        "'kvspec_trace' field; other .json files are skipped and listed, hidden folders and virtualenvs not "
        "entered).  A trace is data: its recorded target is used only if it is built in (spec, impl, vllm, "
        "vllm-fixed, vllm-scheduler, mutant:NAME); a recorded package.module:factory needs --target or "
        "--trust-trace-target.  Each trace is replayed by its target's driver: a finding of vLLM's real "
        "scheduler that only its run shows re-drives the real scheduler.",
    )
    r.add_argument("paths", nargs="+", help="trace files, or folders holding them")
    r.add_argument("--target", default=None, help=f"replay on this target ({TARGETS_HELP}) instead of the recorded one")
    r.add_argument(
        "--trust-trace-target",
        action="store_true",
        help="use a trace's recorded package.module:factory target: imports and calls code the trace file "
        "names, so only for trace files you trust (without it such a trace is refused, exit 2)",
    )
    r.add_argument("--step-timeout", type=float, default=10.0)
    r.add_argument(
        "--strict-known", action="store_true", help="a known target bug (harness/ledger/known_bugs.py) is a finding too"
    )
    r.add_argument("--junit-xml", default=None, metavar="PATH", help="also write JUnit XML: one testcase per trace")


def main(argv: list[str] | None = None) -> int:
    """``kvspec``'s exit status; SIGINT or SIGTERM outside ``fuzz``'s own handling (start-up, ``pd``,
    ``releases``, ``replay``): 130 or 143 and one line, never a traceback."""
    with _stopped_by_signals() as stopped:
        try:
            return _main(argv)
        except KeyboardInterrupt:
            signum = stopped[0] if stopped else signal.SIGINT
            print(f"kvspec: interrupted by {signal.Signals(signum).name}", file=sys.stderr)
            return exit_on_signal(signum)


FORCED_STOP_SECONDS = 5.0  # after SIGINT/SIGTERM outside fuzz's own handling, the most the clean stop may take


@contextlib.contextmanager
def _stopped_by_signals() -> Iterator[list[int]]:
    """SIGINT and SIGTERM raise ``KeyboardInterrupt`` in this block (the signal kept in the list), and
    arm a watchdog: a stop still under way ``FORCED_STOP_SECONDS`` later (the exception swallowed in a
    library's ``finally`` or a garbage-collector callback) ends the process with ``128 + signal``.
    ``kvspec fuzz`` replaces both handlers with its own clean stop (``harness.run.signals``)."""
    stopped: list[int] = []

    def on_signal(signum: int, frame: Any) -> None:
        if stopped:
            return  # the stop is under way, its watchdog armed
        stopped.append(signum)
        threading.Thread(target=_forced_stop, args=(signum,), daemon=True).start()
        raise KeyboardInterrupt

    def unraisable(info: Any) -> None:  # the stop swallowed where Python cannot raise it: no traceback
        if not isinstance(info.exc_value, KeyboardInterrupt):
            saved_hook(info)

    handled = (signal.SIGINT, signal.SIGTERM)
    try:
        saved = {s: signal.signal(s, on_signal) for s in handled}
    except ValueError:  # not the main thread
        yield stopped
        return
    saved_hook, sys.unraisablehook = sys.unraisablehook, unraisable
    try:
        yield stopped
    finally:
        sys.unraisablehook = saved_hook
        for s, handler in saved.items():
            signal.signal(s, handler)


def _forced_stop(signum: int) -> None:
    time.sleep(FORCED_STOP_SECONDS)
    with contextlib.suppress(Exception):
        print(
            f"kvspec: interrupted by {signal.Signals(signum).name} (stopped after {FORCED_STOP_SECONDS:g}s)",
            file=sys.stderr,
            flush=True,
        )
    os._exit(exit_on_signal(signum))


def _main(argv: list[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    passthrough = _passthrough(argv)
    if passthrough is not None:
        return passthrough
    try:
        args = _parser().parse_args(argv)
    except SystemExit as e:
        return EXIT_USAGE if e.code not in (0, None) else EXIT_OK
    try:
        if args.command == "fuzz":
            return fuzz(FuzzOptions.from_namespace(args, os.environ), relation_given=args.relation is not None)
        if args.command == "engine":
            from kvspec.harness.engine_cli import engine_options

            opts = engine_options(args, _parser())
            return fuzz(opts, relation_given=False)
        if args.command == "replay":
            return replay_cmd(args)
        if args.command == "report":
            return report_cmd(args)
        if args.command == "mutants":
            from kvspec.harness.campaign import mutants_cmd

            return mutants_cmd(MutantsOptions.from_namespace(args))
    except UsageError as e:
        print(f"kvspec {args.command}: {e}", file=sys.stderr)
        return EXIT_USAGE
    return EXIT_USAGE


def _passthrough(argv: list[str]) -> int | None:
    """``prove``, ``pd`` and ``releases`` parse their own arguments: their exit status, else None."""
    if argv and argv[0] == "prove":
        try:
            from kvspec.harness.proofs import prove_main
        except ImportError as e:
            print(f"kvspec prove: not available: {e}", file=sys.stderr)
            return EXIT_USAGE
        return int(prove_main(argv[1:]) or 0)
    if argv and argv[0] == "pd":
        from kvspec.harness.pd.cli import main as pd_main

        return pd_main(argv[1:])
    if argv and argv[0] == "releases":
        from kvspec.harness.releases.cli import releases_main

        return releases_main(argv[1:])
    return None


# --- fuzz ------------------------------------------------------------------------------------------


def fuzz(opts: FuzzOptions, relation_given: bool = True) -> int:
    """``kvspec fuzz``, its options already checked (``FuzzOptions.from_namespace``); without
    ``relation_given`` the target's own relation replaces ``opts.relation``: the target resolved
    (``harness.run.catalogue``) and the one run loop run with SIGINT and SIGTERM handled, both in a
    child process this one outlives (``harness.run.supervise``: a target that crashes is a finding),
    then the summary and the report (``harness.run.finish``)."""
    from kvspec.harness.run.finish import finish_fuzz
    from kvspec.harness.run.signals import SIGNALS
    from kvspec.harness.run.supervise import supervised

    tty = sys.stderr.isatty()
    with SIGNALS.installed():
        res = supervised(opts, lambda: _fuzz_run(opts, relation_given, tty))
        if tty:
            print(file=sys.stderr)
        return finish_fuzz(res.opts or opts, res, verbose=tty or opts.stats)


def _fuzz_run(opts: FuzzOptions, relation_given: bool, tty: bool) -> Any:
    """The supervised part of ``kvspec fuzz``: the target loaded, the run made; its ``FuzzResult``
    carries the options in force (the relation chosen, options the driver cannot use dropped)."""
    from kvspec.harness.run.fuzzing import FuzzResult, NothingToRun
    from kvspec.harness.run.signals import SIGNALS, Interrupted

    try:
        with SIGNALS.armed():
            opts, target, choice = _load_fuzz_target(opts, relation_given)
        opts = _unused_options(opts, target)
        workers = f", {opts.workers} workers" if opts.workers > 1 else ""
        print(
            f"kvspec fuzz: target {opts.target}, families {','.join(opts.families)}, up to {opts.seconds:g}s, "
            f"seed {opts.seed}{workers}; reports to {opts.out}\n"
            f"kvspec fuzz: {choice.line(ledger=not opts.no_ledger)}",
            file=sys.stderr,
            flush=True,
        )
        res = _run_fuzz(opts, target, tty)
    except Interrupted as e:  # while the target was loading
        res = FuzzResult(interrupted=e.signum)
    except NothingToRun as e:
        raise UsageError(str(e)) from None
    res.opts = opts
    return res


def _run_fuzz(opts: FuzzOptions, target: Any, tty: bool) -> Any:
    """One process (a progress line on a terminal) or ``--workers`` processes; the ``FuzzResult``."""
    from kvspec.harness.run.fuzzing import progress_line, run_fuzz

    if opts.workers > 1:
        from kvspec.harness.run.workers import fuzz_workers

        return fuzz_workers(opts, progress=tty)
    last = [0.0]

    def on_batch(r: Any, elapsed: float) -> None:
        if tty and elapsed - last[0] > 0.5:
            last[0] = elapsed
            print(progress_line(elapsed, r, opts.families), end="", file=sys.stderr, flush=True)

    def announce(line: str) -> None:
        print(("\n" if tty else "") + line, file=sys.stderr, flush=True)

    return run_fuzz(opts, target, on_batch=on_batch, bounded=True, announce=announce)


def _load_fuzz_target(opts: FuzzOptions, relation_given: bool) -> tuple[FuzzOptions, Any, Any]:
    """The catalogue entry ``--target`` names (its targets wrapped for ``--kv-check``), ``opts`` under the
    relation in force (``--relation``, else the target's own: ``harness.run.relation_choice``) and that
    choice, whose line the run prints first.  ``UsageError`` when the target cannot be loaded or
    declares a relation that does not exist."""
    from dataclasses import replace

    from kvspec.harness.check.guard import is_user_stop
    from kvspec.harness.run.catalogue import fuzz_target
    from kvspec.harness.run.relation_choice import choose_relation
    from kvspec.harness.targets import TargetLoadError

    try:
        target = fuzz_target(opts)
    except TargetLoadError as e:
        raise UsageError(str(e)) from None
    except KeyboardInterrupt as e:
        if is_user_stop(e):  # a real signal while loading (``SIGNALS.armed``)
            raise
        raise UsageError(f"target {opts.target!r}: loading it raised KeyboardInterrupt of its own") from None
    choice = choose_relation(opts.relation if relation_given else None, target)
    return replace(opts, relation=choice.relation), target, choice


def _unused_options(opts: FuzzOptions, target: Any) -> FuzzOptions:
    """``opts`` without what the target's driver cannot do (``--workers``: one process only;
    ``--kv-check``: no oracle behind it), said on stderr."""
    from dataclasses import replace

    unused = []
    if opts.kv_check and not target.kv_check:
        unused.append("--kv-check")
    if opts.workers > 1 and target.one_process:
        unused.append("--workers")
    if not unused:
        return opts
    print(f"kvspec fuzz: {', '.join(unused)} not used with target {opts.target} (its driver cannot)", file=sys.stderr)
    return replace(opts, workers=1, kv_check=False)


# --- replay / report ---------------------------------------------------------------------------------


def replay_cmd(args: argparse.Namespace) -> int:
    from kvspec.harness.check.settings import CheckSettings
    from kvspec.harness.run.options import from_environ
    from kvspec.harness.run.replays import replay_paths

    if not 0 <= args.step_timeout <= 86400:  # NaN too
        raise UsageError(f"--step-timeout must be in [0, 86400] seconds (0: none), got {args.step_timeout}")
    env = from_environ(os.environ)
    checks = CheckSettings(
        step_timeout=args.step_timeout,
        strict_known=args.strict_known,
        memory_mb=env["memory_mb"],
        full_check_every=env["full_check_every"],
    )
    return replay_paths(args.paths, args.target, args.trust_trace_target, checks, env["assume_release"], args.junit_xml)


def report_cmd(args: argparse.Namespace) -> int:
    from kvspec.harness.core.strict_json import TraceFormatError
    from kvspec.harness.traces.report import render_report
    from kvspec.harness.traces.trace import read_trace

    try:
        trace = read_trace(args.path)
    except TraceFormatError as e:
        raise UsageError(str(e)) from None
    print(render_report(trace), end="")
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
