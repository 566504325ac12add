"""Figures for the KV-content oracle: cost per step, and runs / operations to detection per mutant.

    .venv/bin/python tests/oracle/bench_oracle.py [--seeds 20] [--actions 300]

Prints, per family, the oracle's own time per operation and per model run (inner target and
observations reported apart), and for each mutant the fraction of seeded workload runs
(``harness.world.workload.run_seeded``) in which the oracle alone catches it and the
median number of operations to the first finding.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from configs_oracle import ALL, FAMILIES  # noqa: E402
from oracle_drive import drive  # noqa: E402

from kvspec.harness.mutants.impl import MUTANTS, make_mutant_target  # noqa: E402
from kvspec.harness.oracle.target import KVCheckTarget  # noqa: E402
from kvspec.harness.targets.impl import ImplTarget  # noqa: E402


def cost(seeds: int, actions: int) -> None:
    head = f"{'config':18} {'ops':>6} {'runs':>5} {'tok':>6} {'us/op':>7} {'ms/run':>7}"
    print(f"{head} {'obs us/op':>9} {'inner us/op':>11}")
    for name, config in ALL:
        t = KVCheckTarget(ImplTarget(), device="cpu")
        for seed in range(seeds):
            drive(t, config, seed, actions)
        s = t.stats
        print(
            f"{name:18} {s.ops:6d} {s.model_runs:5d} {s.tokens_checked:6d} {1e6 * s.oracle_seconds / s.ops:7.0f} "
            f"{1e3 * s.oracle_seconds / max(1, s.model_runs):7.2f} {1e6 * s.observe_seconds / s.ops:9.0f} "
            f"{1e6 * s.inner_seconds / s.ops:11.0f}"
        )


def detection(seeds: int, actions: int) -> None:
    families = {
        "reuse_while_referenced": ["full", "sliding_window", "hybrid_equal"],
        "hash_before_write": ["full", "sliding_window", "chunked_local", "hybrid_equal"],
        "window_off_by_one": ["sliding_window", "hybrid_equal"],
        "hash_ignores_lora": ["full", "sliding_window", "hybrid_equal"],
    }
    for mutant in MUTANTS:
        for family in families[mutant]:
            config = FAMILIES[family][0]
            ops, first, other = [], None, 0
            for seed in range(seeds):
                r = drive(KVCheckTarget(make_mutant_target(mutant), device="cpu"), config, seed, actions)
                if r.finding is not None:
                    ops.append(r.ops)
                    first = seed if first is None else first
                elif r.stopped:
                    other += 1
            med = statistics.median(ops) if ops else float("nan")
            print(
                f"{mutant:24} {family:15} caught in {len(ops):2d}/{seeds} runs, first at run "
                f"{'-' if first is None else first + 1}, median {med:.0f} ops to detection"
                + (f", {other} runs ended by the mutant crashing" if other else "")
            )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--actions", type=int, default=300)
    a = ap.parse_args()
    t = time.perf_counter()
    cost(min(a.seeds, 5), a.actions)
    detection(a.seeds, a.actions)
    print(f"total {time.perf_counter() - t:.1f} s")


if __name__ == "__main__":
    main()
