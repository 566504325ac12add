"""``kvspec pd check``: fuzz P/D protocols against their safety rules, or replay the scripted
counterexamples.

Exit codes as ``kvspec fuzz``: 0 nothing found (or, with ``--scenarios``, every scripted bug broke
its rule and no safe design broke any), 1 a violation was found (a report is written), 2 bad usage
or a target that cannot be loaded.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from kvspec.harness.pd.designs import resolve_design
from kvspec.harness.pd.invariants import PD_INVARIANTS
from kvspec.harness.pd.machine import PDFinding, make_pd_machine, run_pd_machine
from kvspec.harness.pd.scenarios import SCENARIOS, describe, play
from kvspec.harness.run.exits import EXIT_FOUND, EXIT_OK, EXIT_USAGE
from kvspec.harness.run.options import DAY, NumberRange, UsageError, check_numbers, check_writable_folder


def add_check_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--design", default="baseline,proposal", help="comma-separated: baseline, proposal, bug:NAME")
    p.add_argument(
        "--target",
        default="spec",
        help="spec (the model alone) or vllm (also replay every manager call on real vLLM 0.33)",
    )
    p.add_argument("--seconds", type=float, default=60.0, help="time budget, shared by the designs")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--invariant", default=None, help="check only these rules (comma-separated)")
    p.add_argument("--batch", type=int, default=50, help="examples per Hypothesis run")
    p.add_argument("--steps", type=int, default=60, help="rules per example")
    p.add_argument("--shrink-seconds", type=int, default=60)
    p.add_argument("--out", default="kvspec-reports/pd", help="report folder (written only on a finding)")
    p.add_argument("--scenarios", action="store_true", help="replay the scripted counterexamples instead of fuzzing")


PD_CHECK_NUMBERS = (
    NumberRange("--seconds", 0, DAY, low_open=True),
    NumberRange("--batch", 1, 1_000_000),
    NumberRange("--steps", 1, 10_000),
    NumberRange("--shrink-seconds", 0, DAY),
)


def check_main(args: argparse.Namespace) -> int:
    try:
        designs = [resolve_design(d.strip()) for d in args.design.split(",") if d.strip()]
        names = None if args.invariant is None else [n.strip() for n in args.invariant.split(",")]
        unknown = [n for n in names or () if n not in PD_INVARIANTS]
        if unknown:
            raise ValueError(f"unknown invariant(s) {unknown} (known: {', '.join(PD_INVARIANTS)})")
        if args.target not in ("spec", "vllm"):
            raise ValueError(f"unknown target {args.target!r} (spec or vllm)")
        check_numbers(args, PD_CHECK_NUMBERS)
        check_writable_folder("--out", args.out, args.out)
        make_mirror = _mirror_factory(args.target)
    except (ValueError, UsageError) as e:
        print(f"kvspec pd check: {e}", file=sys.stderr)
        return EXIT_USAGE
    if args.scenarios:
        return replay_scenarios(make_mirror)
    found = 0
    share = args.seconds / len(designs)
    for k, design in enumerate(designs):
        found += fuzz_design(design, names, make_mirror, share, args.seed * 1000 + k, args)
    return EXIT_FOUND if found else EXIT_OK


def _mirror_factory(target: str) -> Any:
    if target == "spec":
        return None
    try:
        from kvspec.harness.targets.vllm import VllmTarget

        VllmTarget()
    except Exception as e:  # ImportError, or a vLLM that is not 0.33.0
        raise ValueError(f"target 'vllm' cannot be loaded: {type(e).__name__}: {e}") from None
    from kvspec.harness.pd.mirror import Mirror

    return Mirror


def fuzz_design(design: Any, names: Any, make_mirror: Any, seconds: float, seed: int, args: argparse.Namespace) -> int:
    from kvspec.harness.run.profiles import profile_settings

    cls = make_pd_machine(design, names, make_mirror)
    start = time.monotonic()
    batch = 0
    while time.monotonic() - start < seconds:
        hyp = profile_settings("dev", max_examples=args.batch, stateful_step_count=args.steps)
        try:
            run_pd_machine(cls, hyp, seed=seed * 1_000_003 + batch, shrink_seconds=args.shrink_seconds)
        except BaseException as e:  # a finding (possibly wrapped by Hypothesis), or a crash
            if isinstance(e, KeyboardInterrupt):
                raise
            finding = cls.stats.last_finding
            if finding is None:
                raise
            return report_finding(design.name, args.target, finding, cls.stats, time.monotonic() - start, args.out)
        batch += 1
        el = time.monotonic() - start
        if sys.stderr.isatty():  # progress is for a person watching; a log gets the summary line only
            print(
                f"\r  [{design.name}] {el:6.1f}s  {cls.stats.examples} examples  {cls.stats.steps} steps  no finding",
                end="",
                file=sys.stderr,
                flush=True,
            )
    if sys.stderr.isatty():
        print(file=sys.stderr)
    el = time.monotonic() - start
    print(
        f"kvspec pd check: {design.name}: no finding; target {args.target}, "
        f"{cls.stats.examples} examples, {cls.stats.steps} steps in {el:.1f}s"
    )
    return 0


def report_finding(design: str, target: str, finding: PDFinding, stats: Any, elapsed: float, out: str) -> int:
    v = finding.violation
    print(
        f"kvspec pd check: {design}: FOUND {v.name}: {v.message} "
        f"(after {elapsed:.1f}s, {stats.examples} examples, shrunk)"
    )
    for line in finding.trace:
        print(f"    {line}")
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    stem = folder / f"{design.replace(':', '_')}-{v.name}"
    doc = {"design": design, "target": target, "invariant": v.name, "message": v.message, "trace": finding.trace}
    tmp = stem.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    tmp.replace(stem.with_suffix(".json"))
    md = [f"# {design}: {v.name}", "", v.message, "", f"Target: {target}. Shrunk schedule:", ""]
    md += [f"{i + 1}. `{line}`" for i, line in enumerate(finding.trace)]
    stem.with_suffix(".md").write_text("\n".join(md) + "\n", encoding="utf-8")
    print(f"kvspec pd check: report written to {stem}.md")
    return 1


def replay_scenarios(make_mirror: Any) -> int:
    """Each scripted bug must break its rule; the design it was derived from must break none."""
    bad = 0
    for name, sc in SCENARIOS.items():
        judge = make_mirror().replay if make_mirror is not None else None
        _, broken = play(sc.design, sc.actions, sc.options, names=[sc.invariant], judge=judge)
        judge = make_mirror().replay if make_mirror is not None else None
        _, safe = play(sc.safe, sc.actions, sc.options, judge=judge)
        ok = broken is not None and broken.name == sc.invariant and safe is None
        bad += not ok
        print(
            f"{'ok  ' if ok else 'FAIL'} {name}: breaks {broken.name if broken else 'nothing'}; "
            f"{sc.safe.name} on the same schedule: {safe or 'safe'}"
        )
        if not ok or name == "bug:release-on-cancel":
            print("      " + "; ".join(describe(sc.actions)))
            if broken is not None:
                print(f"      -> {broken}")
    print(f"kvspec pd check: {len(SCENARIOS) - bad}/{len(SCENARIOS)} scenarios behaved as expected")
    return EXIT_OK if bad == 0 else EXIT_FOUND
