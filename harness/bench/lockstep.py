"""Where a lockstep step's time goes, and whether it grows with the pool (issue: speed).

``python -m kvspec.harness.bench lockstep [--target vllm] [--examples 30] [--json PATH]``

1. Per family, the fuzzing machine (``harness.check.machine``, Hypothesis, ledger and invariants on) runs
   ``--examples`` examples against ``--target``; its wall time per applied operation is the
   "in Hypothesis" column.  The target is wrapped in a recorder, and the longest recorded run of
   the family is then replayed outside Hypothesis, each way in turn: the target's bare calls, the
   spec alone, lockstep without checks (spec and target compared, no invariants, no ledger), and
   full lockstep (invariants and ledger, whole observations compared after every operation), and
   glimpse (full lockstep with the default cadence of ``harness.core.glimpse``: for pools above 256
   blocks, glimpses after most operations, a full check every ``num_blocks // 64`` and at the end),
   and steps (glimpse without the end-of-run full check: what each step costs, the end-of-run
   check being one O(pool) cost per run, spread over this run's operations in the glimpse column).
   The table gives µs per operation and the ratio to the bare target.
2. Pool size: one seeded decode-heavy workload (block size 16, full attention) at 16, 1,024 and
   65,536 blocks, replayed the same four ways: the cost per operation should not grow with the pool.

Only prints (and writes ``--json``); nothing is asserted on timing anywhere.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvspec.harness.check.lockstep import Lockstep
from kvspec.harness.check.settings import CheckSettings
from kvspec.harness.core import ops as O
from kvspec.harness.core.observation import Observation
from kvspec.harness.targets.base import Target
from kvspec.spec.config import KVCacheConfig, full_attention
from kvspec.spec.types import BlockCount, TokenCount

Run = tuple[KVCacheConfig, list[O.Op]]
POOL_SIZES = (16, 1024, 65536)
MODES = ("bare", "spec", "lockstep", "full", "glimpse", "steps")


class Recorder:
    """A target that passes everything to ``inner`` and keeps each run's config and operations."""

    def __init__(self, inner: Target, runs: list[Run]) -> None:
        self.inner, self.runs = inner, runs
        self.name = inner.name

    @property
    def version(self) -> str:
        return self.inner.version

    def reset(self, config: KVCacheConfig) -> None:
        self.inner.reset(config)
        self.runs.append((config, []))

    def apply(self, op: O.Op) -> Any:
        out = self.inner.apply(op)
        self.runs[-1][1].append(op)
        return out

    def observe(self) -> Observation:
        return self.inner.observe()


def time_mode(mode: str, factory: Callable[[], Target], run: Run, repeat: int = 3) -> float:
    """Seconds per operation of ``run`` replayed one way (best of ``repeat``)."""
    from kvspec.harness.targets.spec import SpecTarget

    config, ops = run
    best = float("inf")
    for _ in range(repeat):
        if mode in ("bare", "spec"):
            t: Any = factory() if mode == "bare" else SpecTarget()
            t.reset(config)
            t0 = time.perf_counter()
            for op in ops:
                t.apply(op)
        else:
            full = mode != "lockstep"
            every = None if mode in ("glimpse", "steps") else 1
            checks = CheckSettings(step_timeout=None, ledger=full, full_check_every=every)
            ls = Lockstep(config, factory(), checks, check_spec_invariants=full)
            ls.start()
            t0 = time.perf_counter()
            for op in ops:
                ls.apply(op)
            if mode != "steps":
                ls.finish()
        best = min(best, time.perf_counter() - t0)
    return best / max(1, len(ops))


def family_rows(target: str, factory: Callable[[], Target], families: list[str], examples: int) -> list[dict[str, Any]]:
    from kvspec.harness.check.machine import RunStats, make_machine, run_machine
    from kvspec.harness.run.profiles import profile_settings

    rows = []
    for family in families:
        runs: list[Run] = []
        stats = RunStats()
        cls = make_machine(family, lambda runs=runs: Recorder(factory(), runs), target, CheckSettings(), stats)  # type: ignore[misc]
        t0 = time.perf_counter()
        try:
            run_machine(cls, profile_settings("dev", max_examples=examples, database=None), seed=1, shrink_seconds=1)
        except Exception as e:  # noqa: BLE001 - a finding: still report the speed
            print(f"{family}: the machine stopped: {stats.finding.summary() if stats.finding else e}")
        hyp = (time.perf_counter() - t0) / max(1, stats.steps)
        if stats.skipped.get(family) or not runs:
            continue
        run = max(runs, key=lambda r: len(r[1]))
        row: dict[str, Any] = {"family": family, "ops": len(run[1]), "hypothesis_us": 1e6 * hyp}
        for mode in MODES:
            row[f"{mode}_us"] = 1e6 * time_mode(mode, factory, run)
        rows.append(row)
    return rows


def pool_runs(seed: int = 3, actions: int = 400) -> dict[int, Run]:
    """One seeded workload per pool size (full attention, block size 16, prompts up to 512 tokens)."""
    from kvspec.harness.targets.spec import SpecTarget
    from kvspec.harness.world.workload import run_seeded

    out: dict[int, Run] = {}
    for n in POOL_SIZES:
        config = KVCacheConfig(BlockCount(n), (full_attention(16),), TokenCount(512))
        ops: list[O.Op] = []

        def record(op: O.Op, _out: Any, ops: list[O.Op] = ops) -> None:
            ops.append(op)

        run_seeded(SpecTarget(), config, seed, actions, on_op=record)
        out[n] = (config, ops)
    return out


def pool_rows(factory: Callable[[], Target]) -> list[dict[str, Any]]:
    rows = []
    for n, run in pool_runs().items():
        row: dict[str, Any] = {"num_blocks": n, "ops": len(run[1])}
        for mode in MODES:
            row[f"{mode}_us"] = 1e6 * time_mode(mode, factory, run, repeat=1 if n > 10_000 else 3)
        rows.append(row)
    return rows


def print_table(rows: list[dict[str, Any]], key: str, hypothesis: bool) -> None:
    cols = [*MODES, *(["hypothesis"] if hypothesis else [])]
    print(f"{key:>20} {'ops':>5} " + " ".join(f"{c + ' us':>13}" for c in cols) + "   x bare: " + " ".join(cols[1:]))
    for r in rows:
        bare = r["bare_us"]
        us = " ".join(f"{r[c + '_us']:13.1f}" for c in cols)
        ratios = " ".join(f"{r[c + '_us'] / bare:.1f}" for c in cols[1:])
        print(f"{r[key]!s:>20} {r['ops']:5d} {us}   {ratios}")


def bench_lockstep(target: str, families: list[str], examples: int, json_path: str | None) -> None:
    from kvspec.harness.run.catalogue import resolve

    factory = resolve(target).factory
    print(f"target {target}: µs per operation, replayed outside Hypothesis unless labelled (best of 3)")
    fam = family_rows(target, factory, families, examples)
    print_table(fam, "family", hypothesis=True)
    calls = sum(r["ops"] for r in fam) / max(1e-9, sum(r["ops"] * r["full_us"] for r in fam) / 1e6)
    hyp = sum(r["ops"] for r in fam) / max(1e-9, sum(r["ops"] * r["hypothesis_us"] for r in fam) / 1e6)
    print(f"checked calls/s over these families: full lockstep {calls:,.0f}, in Hypothesis {hyp:,.0f}")
    print("\npool size (full attention, block size 16, one seeded decode-heavy workload per size):")
    pool = pool_rows(factory)
    print_table(pool, "num_blocks", hypothesis=False)
    if json_path:
        report = {"target": target, "families": fam, "pool": pool, "full_calls_per_s": calls, "hyp_calls_per_s": hyp}
        Path(json_path).write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {json_path}")


def add_parser(sub: Any) -> None:
    p = sub.add_parser("lockstep", help="where a lockstep step's time goes; cost against the pool size")
    p.add_argument("--target", default="vllm", help="spec, impl, vllm, ...")
    p.add_argument("--family", default="all", help="families for the first table (default all)")
    p.add_argument("--examples", type=int, default=30, help="Hypothesis examples per family")
    p.add_argument("--json", help="also write the figures as JSON here")


def main(args: argparse.Namespace) -> None:
    from kvspec.harness.world.families import parse_families

    bench_lockstep(args.target, parse_families(args.family), args.examples, args.json)
