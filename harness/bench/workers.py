"""The speed-up of ``kvspec fuzz --workers N`` over one worker, for the same wall-clock seconds.

    python -m kvspec.harness.bench.workers --seconds 20 --workers 1,2 --target spec --family full

Each run fuzzes a target that finds nothing (the spec by default) for ``--seconds`` through the same
process pool (``harness.run.workers``), so both sides pay the same start-up, and counts the examples and
the operations applied.  The speed-up is the ratio of operations (and of examples) to the one-worker
run.  The database is a fresh folder per run, so no run replays another's examples.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

from kvspec.harness.run.options import FuzzOptions


def bench_options(target: str, family: str, seconds: float, workers: int, seed: int = 0) -> FuzzOptions:
    """The fuzz run measured: ``kvspec fuzz``'s defaults but for these."""
    from kvspec.harness.world.families import parse_families

    return FuzzOptions(
        target=target, families=tuple(parse_families(family)), seconds=seconds, seed=seed, workers=workers
    )


def measure(target: str, family: str, seconds: float, workers: int, seed: int = 0) -> dict[str, float]:
    from kvspec.harness.run.workers import fuzz_workers

    opts = bench_options(target, family, seconds, workers, seed)
    with tempfile.TemporaryDirectory(prefix="kvspec-bench-db-") as db:
        res = fuzz_workers(replace(opts, db=db))
    if res.trace is not None or res.stopped is not None:
        raise SystemExit(
            f"bench_workers: the target reported something ({res.summary or res.stopped}); pick one that passes"
        )
    return {
        "workers": workers,
        "seconds": res.elapsed,
        "examples": res.examples,
        "steps": res.steps,
        "steps_per_s": res.steps / max(res.elapsed, 1e-9),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m kvspec.harness.bench.workers", description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--workers", default="1,2", help="comma-separated worker counts; the first is the baseline")
    p.add_argument("--target", default="spec")
    p.add_argument("--family", default="full")
    p.add_argument("--json", default=None, help="also write the figures here")
    a = p.parse_args(argv)
    try:
        counts = [int(x) for x in a.workers.split(",")]
        if not counts or min(counts) < 1 or a.seconds <= 0:
            raise ValueError
    except ValueError:
        print(
            "bench_workers: --workers takes positive integers (e.g. 1,2) and --seconds a positive number",
            file=sys.stderr,
        )
        return 2
    rows = [measure(a.target, a.family, a.seconds, n) for n in counts]
    base = rows[0]
    print(
        f"{'workers':>7}  {'seconds':>7}  {'examples':>8}  {'operations':>10}  {'ops/s':>8}  "
        "speed-up (ops)  speed-up (examples)"
    )
    for r in rows:
        print(
            f"{r['workers']:>7.0f}  {r['seconds']:>7.1f}  {r['examples']:>8.0f}  {r['steps']:>10.0f}  "
            f"{r['steps_per_s']:>8.0f}  "
            f"{r['steps'] / max(base['steps'], 1):>14.2f}  {r['examples'] / max(base['examples'], 1):>19.2f}"
        )
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
