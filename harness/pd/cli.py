"""``kvspec pd``: the P/D pre-allocation study (docs/pd-preallocation.md).

- ``kvspec pd check [--design D,...] [--target spec|vllm] [--seconds N] [--scenarios]``: fuzz the
  protocols against their safety rules (exit 0 nothing found, 1 a violation, 2 bad usage);
- ``kvspec pd verify [--design D,...] [--requests N] [--decoders N] [--blocks K] [--loss N] [--dup N]
  [--crash N] [--out FILE]``: the exhaustive model check (``harness.pd.mc``; exit 0 every rule
  holds, 1 a counterexample, 2 bad usage);
- ``kvspec pd simulate [--out docs/figures] [--requests N] [--measure|--no-measure]``: measure the
  manager calls on real vLLM (when installed), run the latency sweep at steady-state loads, the
  goodput bisection per seed and the analytic estimate, and draw every figure (exit 0, or 2 on bad
  usage).
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


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="kvspec pd",
        description="P/D disaggregation with pre-allocation on the decode side: safety and simulation.",
    )
    sub = p.add_subparsers(dest="command", required=True)
    add_check_arguments(sub.add_parser("check", help="fuzz the protocols against their safety rules"))
    add_verify_arguments(sub.add_parser("verify", help="exhaustive model check within stated bounds"))
    add_simulate_arguments(sub.add_parser("simulate", help="measure, simulate and draw the figures"))
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


def add_simulate_arguments(s: argparse.ArgumentParser) -> None:
    s.add_argument(
        "--out",
        default="kvspec-reports/pd-sim",
        help="folder for the PNGs, the tables and the JSON results (default kvspec-reports/pd-sim; "
        "--out docs/figures regenerates the published ones)",
    )
    s.add_argument("--prefix", default="pd2", help="file name prefix of everything written (default pd2)")
    s.add_argument("--requests", type=int, default=4000, help="requests per latency point")
    s.add_argument("--seed", type=int, default=1, help="the first seed")
    s.add_argument("--seeds", type=int, default=10, help="seeds per point (95%% intervals need at least 2)")
    s.add_argument(
        "--quick",
        action="store_true",
        help="a small sweep (2 seeds, 300 requests, 2 loads, 2 workloads, goodput to 5%%)",
    )
    s.add_argument(
        "--workloads",
        default=None,
        help="comma-separated workloads (default: the published set); variants NAME@sigma=S (both lognormal "
        "sigmas), NAME@P-KV=F|unbounded (each P's KV memory, as a fraction of an H200's budget)",
    )
    s.add_argument("--loads", default=None, help="comma-separated loads for latency (fraction of prefill capacity)")
    s.add_argument("--jobs", type=int, default=1, help="processes to spread the seeds over (default 1)")
    s.add_argument("--no-latency", action="store_true", help="skip the latency sweep (goodput only)")
    s.add_argument("--no-goodput", action="store_true", help="skip the goodput bisection")
    s.add_argument("--probe-requests", type=int, default=2000, help="requests per goodput bisection probe")
    s.add_argument(
        "--from-results",
        default=None,
        help="render the tables and figures again from a results JSON (simulates nothing)",
    )
    s.add_argument("--precision", type=float, default=0.015, help="goodput bisection: relative bracket width")
    s.add_argument(
        "--measure",
        dest="measure",
        action="store_true",
        default=None,
        help="measure vLLM's manager calls (default: when vLLM is installed)",
    )
    s.add_argument("--no-measure", dest="measure", action="store_false", help="reuse the stored measurements")
    s.add_argument("--no-figures", action="store_true", help="skip matplotlib (results JSON and tables only)")


def simulate_main(args: argparse.Namespace) -> int:
    """``kvspec pd simulate``: the latency sweep, the goodput bisection and the analytic estimate;
    their JSON, tables and figures."""
    from kvspec.harness.pd.sim.analytic import estimate
    from kvspec.harness.pd.sim.experiment import sweep
    from kvspec.harness.pd.sim.goodput import goodput_sweep

    if args.from_results is not None:
        return _render_again(args)
    chosen = _simulate_choices(args)
    if chosen is None:
        return EXIT_USAGE
    workloads, loads = chosen
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    costs, measured = _manager_costs(args.measure, out / COSTS_FILE)
    points = (
        [] if args.no_latency else sweep(workloads, loads, args.requests, args.seed, costs, _say, args.seeds, args.jobs)
    )
    goodputs = (
        []
        if args.no_goodput
        else goodput_sweep(
            workloads, args.probe_requests, args.seed, args.seeds, costs, args.precision, _say, args.jobs
        )
    )
    estimates = [] if args.no_latency else [estimate(w, load, costs) for w in workloads for load in loads]
    written = [*measured, *_write_results(args, out, loads, points, goodputs, estimates)]
    _say(f"done in {time.monotonic() - start:.1f}s; wrote " + ", ".join(str(p) for p in written))
    return EXIT_OK


SIMULATE_NUMBERS = (
    NumberRange("--requests", 10, 10_000_000),
    NumberRange("--probe-requests", 10, 10_000_000),
    NumberRange("--seeds", 1, 10_000),
    NumberRange("--jobs", 1, 64),
    NumberRange("--precision", 0.001, 1.0),
)


def _simulate_choices(args: argparse.Namespace) -> tuple[list[Any], tuple[float, ...]] | None:
    """The workloads (variants applied) and loads to simulate (``--quick``: a small sweep), checked;
    None (said) on bad usage."""
    from kvspec.harness.pd.sim.experiment import DEFAULT_WORKLOADS, LOADS, WORKLOADS, get_workload

    if args.quick:
        args.seeds, args.requests, args.probe_requests, args.precision = 2, 300, 300, 0.05
        args.loads = args.loads or "0.6,0.9"
        args.workloads = args.workloads or "chat,conv-decode-bound"
    names = ",".join(DEFAULT_WORKLOADS) if args.workloads is None else args.workloads
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
    try:
        workloads = [get_workload(w.strip()) for w in names.split(",") if w.strip()]
    except (KeyError, ValueError) as e:
        print(
            f"kvspec pd simulate: bad workload {e} (known {list(WORKLOADS)}, variants @sigma=S on lognormal ones, "
            "@P-KV=F or @P-KV=unbounded)",
            file=sys.stderr,
        )
        return None
    if not workloads or not loads:
        print("kvspec pd simulate: bad usage (no workloads or no loads)", file=sys.stderr)
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


def _render_again(args: argparse.Namespace) -> int:
    """``--from-results``: the tables and figures of a stored run, written next to it."""
    from kvspec.harness.pd.sim.report import from_json

    path = Path(args.from_results)
    try:
        results = json.loads(path.read_text(encoding="utf-8"))
        points, goodputs, estimates = from_json(results)
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"kvspec pd simulate: cannot read --from-results {path}: {e}", file=sys.stderr)
        return EXIT_USAGE
    for key in ("requests", "probe_requests", "precision"):
        setattr(args, key, results[key])
    args.seed, args.seeds = results["seeds"][0], len(results["seeds"])
    args.prefix = path.name.removesuffix("-sim-results.json")
    run = results.get("argv", [])
    written = _write_results(args, path.parent, tuple(results["loads"]), points, goodputs, estimates, run)
    _say("rendered again; wrote " + ", ".join(str(p) for p in written))
    return EXIT_OK


def _write_results(
    args: argparse.Namespace,
    out: Path,
    loads: tuple[float, ...],
    points: Any,
    goodputs: Any,
    estimates: Any,
    argv: list[str] | None = None,
) -> list[Path]:
    """The results JSON (atomically), the tables and, unless ``--no-figures``, the figures; their paths."""
    from kvspec.harness.pd.sim.report import render_all, to_json

    results = to_json(
        points,
        goodputs,
        estimates,
        requests=args.requests,
        probe_requests=args.probe_requests,
        precision=args.precision,
        seeds=list(range(args.seed, args.seed + args.seeds)),
        loads=list(loads),
        argv=sys.argv[1:] if argv is None else argv,
    )
    path = out / f"{args.prefix}-sim-results.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    tmp.replace(path)
    tables = out / f"{args.prefix}-sim-tables.md"
    tables.write_text(render_all(points, goodputs, estimates), encoding="utf-8")
    written = [path, tables]
    if not args.no_figures:
        from kvspec.harness.pd.sim.figures import draw_all

        written += draw_all(points, goodputs, estimates, out, args.prefix)
    return written
