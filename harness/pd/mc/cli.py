"""``kvspec pd verify``: run the exhaustive search for one or more designs and report.

Exit 0: the search completed and every safety and liveness rule holds for every design named;
1: a rule fails (the shortest counterexample is printed, and written as JSON to ``--out``) or the
search hit ``--max-states`` before completing; 2: bad usage.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from kvspec.harness.pd.mc.designs import resolve_mc_design
from kvspec.harness.pd.mc.model import FAULTS, PRESETS, SAFETY, Bounds
from kvspec.harness.pd.mc.search import LIVENESS, Result, explore
from kvspec.harness.run.exits import EXIT_FOUND, EXIT_INCOMPLETE, EXIT_OK, EXIT_USAGE
from kvspec.harness.run.options import NumberRange, UsageError, check_new_file, check_numbers

BOUND_FIELDS = ("requests", "decoders", "blocks", "loss", "dup", "crash")


def add_verify_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--design", default="proposal", help="comma-separated designs (or bug:NAME)")
    p.add_argument(
        "--bounds",
        default="faults,contention",
        help="comma-separated bound sets: faults (1 request, 2 decode instances, a lost and a duplicated "
        "message, a crash), contention (2 requests for 1 decode instance's 1 block, no fault); the "
        "numbers below, when given, replace them with one set built on faults",
    )
    p.add_argument("--requests", type=int, default=None, help="requests (each arrives once)")
    p.add_argument("--decoders", type=int, default=None, help="decode instances")
    p.add_argument("--blocks", type=int, default=None, help="blocks per decode instance (one per reservation)")
    p.add_argument("--loss", type=int, default=None, help="control messages that may be lost")
    p.add_argument("--dup", type=int, default=None, help="control messages that may be duplicated")
    p.add_argument("--crash", type=int, default=None, help="instance crashes (P or a D)")
    p.add_argument("--no-symmetry", action="store_true", help="explore every renaming (brute force)")
    p.add_argument("--max-states", type=int, default=5_000_000, help="give up past this many states (exit 3)")
    p.add_argument("--out", default=None, help="write the results (and counterexamples) here as JSON")


def _say(msg: str) -> None:
    print(f"kvspec pd verify: {msg}", flush=True)


def describe_bounds(b: Bounds) -> str:
    return (
        f"{b.requests} request(s), {b.decoders} decode instance(s) with {b.blocks} block(s) each, "
        f"up to {b.loss} lost and {b.dup} duplicated control message(s), {b.crash} crash(es) of P or a D; "
        "messages delivered in any order, transfers may fail, time-outs may fire at any moment"
    )


VERIFY_NUMBERS = (
    NumberRange("--requests", 1, 8),
    NumberRange("--decoders", 1, 8),
    NumberRange("--blocks", 1, 64),
    NumberRange("--loss", 0, 8),
    NumberRange("--dup", 0, 8),
    NumberRange("--crash", 0, 8),
    NumberRange("--max-states", 1, 50_000_000),
)
"""The bounds ``pd verify`` searches within: past these the state space outgrows any machine's memory
(``--max-states`` is the search's own bound, exit 3 when reached)."""


def chosen_bounds(args: argparse.Namespace) -> list[tuple[str, Bounds]]:
    """The named bound sets to search: ``--bounds``, or one ``custom`` set when a number is given."""
    given = {k: getattr(args, k) for k in BOUND_FIELDS if getattr(args, k) is not None}
    if given:
        return [("custom", replace(FAULTS, **given))]
    names = [n.strip() for n in args.bounds.split(",") if n.strip()]
    unknown = [n for n in names if n not in PRESETS]
    if unknown or not names:
        raise ValueError(f"--bounds {args.bounds!r}: expected names among {', '.join(PRESETS)}")
    return [(n, PRESETS[n]) for n in dict.fromkeys(names)]


def verify_main(args: argparse.Namespace) -> int:
    try:
        designs = [resolve_mc_design(n.strip()) for n in args.design.split(",") if n.strip()]
        check_numbers(args, VERIFY_NUMBERS)
        sets = chosen_bounds(args)
        if not designs or any(min(b.requests, b.decoders, b.blocks) < 1 for _, b in sets):
            raise ValueError("--requests, --decoders and --blocks must be at least 1, and --design non-empty")
        if args.out is not None:
            check_new_file("--out", args.out)
    except (ValueError, UsageError) as e:
        print(f"kvspec pd verify: {e}", file=sys.stderr)
        return EXIT_USAGE
    for name, bounds in sets:
        _say(f"bounds {name}: {describe_bounds(bounds)}")
    _say("symmetry: " + ("off (every renaming)" if args.no_symmetry else "requests and decode instances renamed"))
    results = []
    for name, bounds in sets:
        for g in designs:
            _say(f"design {g.name}, bounds {name}: searching ...")
            r = explore(
                g, bounds, symmetry=not args.no_symmetry, max_states=args.max_states, progress=_progress(g.name)
            )
            results.append(r)
            report(r, name)
    if args.out:
        write_json(Path(args.out), [to_json(r) for r in results])
    if any(r.rule is not None for r in results):
        return EXIT_FOUND
    return EXIT_OK if all(r.completed for r in results) else EXIT_INCOMPLETE  # no verdict within --max-states


def _progress(design: str, every: float = 5.0) -> Callable[[int, int], None]:
    """A line every ``every`` seconds while a search runs: states and transitions so far."""
    last = [time.monotonic()]

    def say(states: int, transitions: int) -> None:
        if time.monotonic() - last[0] >= every:
            last[0] = time.monotonic()
            _say(f"design {design}: {states} states, {transitions} transitions so far ...")

    return say


def report(r: Result, bounds_name: str = "") -> None:
    d = f"design {r.design}" + (f", bounds {bounds_name}" if bounds_name else "")
    done = "search completed" if r.completed else "search stopped at --max-states (incomplete)"
    _say(f"{d}: {r.states} states, {r.transitions} transitions, {r.seconds:.1f}s; {done}")
    if r.rule is None and r.completed:
        rules = ", ".join(list(SAFETY) + list(LIVENESS))
        _say(f"{d}: every rule holds ({rules})")
    elif r.rule is not None:
        _say(f"{d}: VIOLATION of {r.rule}: {r.message}")
        _say(f"shortest counterexample ({len(r.trace)} steps):")
        for k, label in enumerate(r.trace, 1):
            print(f"  {k:3d}. {label}", flush=True)


def to_json(r: Result) -> dict[str, Any]:
    b = r.bounds
    return {
        "design": r.design,
        "bounds": {k: getattr(b, k) for k in ("requests", "decoders", "blocks", "loss", "dup", "crash")},
        "states": r.states,
        "transitions": r.transitions,
        "completed": r.completed,
        "seconds": round(r.seconds, 2),
        "rule": r.rule,
        "message": r.message,
        "counterexample": r.trace,
    }


def write_json(path: Path, data: object) -> None:
    """Atomically: a reader sees the old file or the whole new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    tmp.replace(path)
