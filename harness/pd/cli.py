"""``kvspec pd``: the P/D pre-allocation study (docs/pd-preallocation.md).

- ``kvspec pd check [--design D,...] [--target spec|vllm] [--seconds N] [--scenarios]``: fuzz the
  protocols against their safety rules (exit 0 nothing found, 1 a violation, 2 bad usage);
- ``kvspec pd verify [--design D,...] [--requests N] [--decoders N] [--blocks K] [--loss N] [--dup N]
  [--crash N] [--out FILE]``: the exhaustive model check (``harness.pd.mc``; exit 0 every rule
  holds, 1 a counterexample, 2 bad usage);
- ``kvspec pd simulate [--out docs/figures] [--requests N] [--measure|--no-measure]``: measure the
  manager calls on real vLLM (when installed), run the simulation sweep and draw every figure
  (exit 0, or 2 on bad usage).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from kvspec.harness.pd.check import add_check_arguments, check_main
from kvspec.harness.pd.mc.cli import add_verify_arguments, verify_main
from kvspec.harness.run.exits import EXIT_OK, EXIT_USAGE
from kvspec.harness.run.options import NumberRange, UsageError, check_numbers, check_writable_folder

COSTS_FILE = "pd-manager-costs.json"
RESULTS_FILE = "pd-sim-results.json"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="kvspec pd",
        description="P/D disaggregation with pre-allocation on the decode side: safety and simulation.",
    )
    sub = p.add_subparsers(dest="command", required=True)
    add_check_arguments(sub.add_parser("check", help="fuzz the protocols against their safety rules"))
    add_verify_arguments(sub.add_parser("verify", help="exhaustive model check within stated bounds"))
    s = sub.add_parser("simulate", help="measure, simulate and draw the figures")
    s.add_argument(
        "--out",
        default="kvspec-reports/pd-sim",
        help="folder for the PNGs, the table and the JSON results (default kvspec-reports/pd-sim; "
        "--out docs/figures regenerates the published ones)",
    )
    s.add_argument("--requests", type=int, default=1000, help="requests per simulated point")
    s.add_argument("--seed", type=int, default=1, help="the first seed")
    s.add_argument("--seeds", type=int, default=10, help="seeds per point (95%% intervals need at least 2)")
    s.add_argument("--quick", action="store_true", help="a small sweep (2 seeds, 300 requests, 2 loads, 2 workloads)")
    s.add_argument("--workloads", default=None, help="comma-separated workloads (default: the published set)")
    s.add_argument("--loads", default=None, help="comma-separated loads (fraction of prefill capacity)")
    s.add_argument(
        "--measure",
        dest="measure",
        action="store_true",
        default=None,
        help="measure vLLM's manager calls (default: when vLLM is installed)",
    )
    s.add_argument("--no-measure", dest="measure", action="store_false", help="reuse the stored measurements")
    s.add_argument("--no-figures", action="store_true", help="skip matplotlib (results JSON only)")
    return p


def main(argv: list[str]) -> int:
    try:
        args = _parser().parse_args(argv)
    except SystemExit as e:
        return EXIT_USAGE if e.code not in (0, None) else EXIT_OK
    if args.command == "check":
        return check_main(args)
    if args.command == "verify":
        return verify_main(args)
    return simulate_main(args)


def _say(msg: str) -> None:
    print(f"kvspec pd simulate: {msg}", file=sys.stderr, flush=True)


def simulate_main(args: argparse.Namespace) -> int:
    """``kvspec pd simulate``: the sweep over workloads, loads and seeds; its JSON, table and figures."""
    from kvspec.harness.pd.sim.experiment import sweep
    from kvspec.harness.pd.sim.stats import aggregate

    chosen = _simulate_choices(args)
    if chosen is None:
        return EXIT_USAGE
    workloads, loads = chosen
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    costs, measured = _manager_costs(args.measure, out / COSTS_FILE)
    points = sweep(workloads, loads, args.requests, args.seed, costs, progress=_say, seeds=args.seeds)
    written = [*measured, *_write_results(args, out, loads, points, aggregate(points))]
    _say(f"done in {time.monotonic() - start:.1f}s; wrote " + ", ".join(str(p) for p in written))
    return EXIT_OK


SIMULATE_NUMBERS = (NumberRange("--requests", 10, 10_000_000), NumberRange("--seeds", 1, 10_000))


def _simulate_choices(args: argparse.Namespace) -> tuple[list[str], tuple[float, ...]] | None:
    """The workloads and loads to simulate (``--quick``: a small sweep), checked; None (said) on bad usage."""
    from kvspec.harness.pd.sim.experiment import DEFAULT_WORKLOADS, LOADS, WORKLOADS

    if args.quick:
        args.seeds, args.requests = 2, 300
        args.loads = args.loads or "0.6,1.0"
        args.workloads = args.workloads or "chat,conv-decode-bound"
    names = ",".join(DEFAULT_WORKLOADS) if args.workloads is None else args.workloads
    workloads = [w.strip() for w in names.split(",") if w.strip()]
    try:
        loads = LOADS if args.loads is None else tuple(float(x) for x in args.loads.split(","))
        check_numbers(args, SIMULATE_NUMBERS)
        for load in loads:
            check_numbers(argparse.Namespace(loads=load), (NumberRange("--loads", 0, 100, low_open=True),))
        check_writable_folder("--out", args.out, args.out)
    except ValueError:
        print(f"kvspec pd simulate: --loads must be numbers, got {args.loads!r}", file=sys.stderr)
        return None
    except UsageError as e:
        print(f"kvspec pd simulate: {e}", file=sys.stderr)
        return None
    bad = [w for w in workloads if w not in WORKLOADS]
    if bad or not loads:
        print(
            f"kvspec pd simulate: bad usage (workloads {bad} unknown; "
            f"known {list(WORKLOADS)}; --requests >= 10; --seeds >= 1; loads > 0)",
            file=sys.stderr,
        )
        return None
    return workloads, loads


def _manager_costs(measure: bool | None, costs_path: Path) -> tuple[Any, list[Path]]:
    """vLLM's manager call costs: measured now (``--measure``; by default when vLLM is installed) and
    stored, else the stored ones, else none (they count as 0); and the files written (the costs, when
    measured)."""
    from kvspec.harness.pd.sim import inputs as X
    from kvspec.harness.pd.sim.measure import measure_manager_costs, read_costs, write_costs

    if measure is None:
        try:
            import vllm  # noqa: F401

            measure = True
        except Exception:
            measure = False
    if measure:
        _say(f"measuring vLLM's KVCacheManager calls on a {X.D_BLOCKS}-block pool")
        write_costs(costs_path, measure_manager_costs(X.D_BLOCKS, progress=_say))
    costs = X.ManagerCosts(read_costs(costs_path) if costs_path.exists() else None)
    if not costs.table:
        _say("no measured manager costs (vLLM not installed, none stored): they count as 0")
    return costs, [costs_path] if measure else []


def _write_results(
    args: argparse.Namespace, out: Path, loads: tuple[float, ...], points: Any, summaries: Any
) -> list[Path]:
    """The results JSON (atomically), the table and, unless ``--no-figures``, the figures; their paths."""
    from kvspec.harness.pd.sim.experiment import to_json
    from kvspec.harness.pd.sim.stats import render_table

    results = {
        "requests": args.requests,
        "seeds": list(range(args.seed, args.seed + args.seeds)),
        "loads": list(loads),
        "summaries": [{**s.__dict__, "stats": {k: list(v) for k, v in s.stats.items()}} for s in summaries],
        "points": to_json(points),
    }
    tmp = out / (RESULTS_FILE + ".tmp")
    tmp.write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    tmp.replace(out / RESULTS_FILE)
    (out / "pd-sim-table.md").write_text(render_table(summaries), encoding="utf-8")
    written = [out / RESULTS_FILE, out / "pd-sim-table.md"]
    if not args.no_figures:
        from kvspec.harness.pd.sim.figures import draw_all

        written += draw_all(points, out)
    return written
