"""Time and operations to first detection: the KV ledger alone vs the torch oracle alone, same seeds.

    .venv/bin/python tests/ledger/bench_ledger.py [--seeds 5] [--actions 300] [--target vllm]
    .venv/bin/python tests/ledger/bench_ledger.py --cost [--examples 10] [--target vllm]

Each row runs the one workload (``harness.world.workload.run_seeded``) on the same seeds, once wrapped in
the ledger (``harness.ledger.checker.LedgerCheckTarget``) and once in the oracle
(``harness.oracle.target.KVCheckTarget``), and prints the first seed that is caught, the operations and the
seconds (target included) until it is caught.  The impl mutants run on ``impl``; the three vLLM 0.33
candidate bugs run on ``--target`` (vllm, spec or impl: all three share the bugs), the oracle told
not to recognise known bugs (``known_bugs=False``) so that it reports their wrong numbers.  No
timing is asserted anywhere; this only prints.

``--cost`` runs the fuzzing state machine (``harness.check.machine``, every family; known bugs are
counted, not failing) with the ledger on and off, same seeds, and prints steps/s both ways and the
ledger's own time per operation.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from ledger_cases import is_known_vllm_trigger  # noqa: E402

from kvspec.harness.check.settings import CheckSettings
from kvspec.harness.ledger.checker import LedgerCheckTarget  # noqa: E402
from kvspec.harness.ledger.finding import LedgerMismatch  # noqa: E402
from kvspec.harness.mutants.impl import make_mutant_target  # noqa: E402
from kvspec.harness.oracle.target import KVCheckTarget, KVMismatch  # noqa: E402
from kvspec.harness.run.catalogue import resolve
from kvspec.harness.world.workload import run_seeded  # noqa: E402
from kvspec.spec.config import KVCacheConfig, chunked_local, full_attention, sliding_window  # noqa: E402

FULL = KVCacheConfig(24, (full_attention(4),), 120)
SWA = KVCacheConfig(24, (sliding_window(4, 7),), 120)
MUTANT_ROWS = [
    ("reuse_while_referenced", FULL),
    ("hash_before_write", FULL),
    ("window_off_by_one", SWA),
    ("hash_ignores_lora", FULL),
]
CANDIDATE_ROWS = [  # (candidate, config)
    ("chunk_not_block_multiple", KVCacheConfig(30, (chunked_local(2, 5),), 80)),
    ("window_invalid_block_recovery", KVCacheConfig(30, (sliding_window(2, 3),), 80)),
    ("window_full_remote_load", KVCacheConfig(30, (chunked_local(1, 2),), 40)),
]


def first_detection(
    wrap: Callable[[Any], Any], make: Callable[[], Any], config: KVCacheConfig, seeds: int, actions: int
) -> tuple[int | None, int, float, str]:
    """(first seed caught, operations run in all seeds until then, seconds, what was found)."""
    ops = 0
    t0 = time.perf_counter()

    def count(op: Any, out: Any) -> None:
        nonlocal ops
        ops += 1

    for seed in range(seeds):
        try:
            run_seeded(wrap(make()), config, seed, actions, on_op=count)
        except LedgerMismatch as e:
            what = is_known_vllm_trigger(e.finding) or e.finding.invariant
            return seed, ops + 1, time.perf_counter() - t0, what
        except KVMismatch as e:
            return seed, ops + 1, time.perf_counter() - t0, e.finding.kind
        except Exception as e:  # noqa: BLE001 - a mutant's allocator may break
            return seed, ops + 1, time.perf_counter() - t0, f"crash {type(e).__name__}"
    return None, ops, time.perf_counter() - t0, "-"


def row(name: str, make: Callable[[], Any], config: KVCacheConfig, seeds: int, actions: int, known: bool) -> None:
    """``known``: the oracle recognises known target bugs (and stops checking at them)."""
    cells = []
    oracle = lambda t: KVCheckTarget(t, device="cpu", known_bugs=known)  # noqa: E731
    for label, wrap in (("ledger", LedgerCheckTarget), ("oracle", oracle)):
        seed, ops, secs, what = first_detection(wrap, make, config, seeds, actions)
        where = "not caught" if seed is None else f"seed {seed}"
        cells.append(f"{label}: {where:>15} {ops:6d} ops {secs:7.2f} s  {what:29}")
    print(f"{name:34} | " + " | ".join(cells))


def cost(target: str, examples: int) -> None:
    import os

    from kvspec.harness.check.machine import RunStats, make_machine, run_machine
    from kvspec.harness.ledger import checker as ledger
    from kvspec.harness.run.profiles import profile_settings
    from kvspec.harness.world.families import FAMILIES

    spent = [0.0, 0]
    check = ledger.LedgerChecker.check

    def timed(self: Any, *args: Any) -> Any:
        t = time.perf_counter()
        try:
            return check(self, *args)
        finally:
            spent[0] += time.perf_counter() - t
            spent[1] += 1

    ledger.LedgerChecker.check = timed  # type: ignore[method-assign]
    factory = resolve(target).factory
    totals = {"on": [0, 0.0], "off": [0, 0.0]}
    for family in FAMILIES:
        for mode in ("on", "off"):
            stats = RunStats()
            cls = make_machine(family, factory, f"{target}-{mode}", CheckSettings(ledger=mode == "on"), stats)
            t0 = time.perf_counter()
            try:
                run_machine(
                    cls, profile_settings("dev", max_examples=examples, database=None), seed=1, shrink_seconds=5
                )
            except Exception as e:  # noqa: BLE001
                print(f"{family} ({mode}): stopped: {stats.finding.summary() if stats.finding else e}")
            totals[mode][0] += stats.steps
            totals[mode][1] += time.perf_counter() - t0
    os.environ.pop("KVSPEC_LEDGER")
    for mode, (steps, secs) in totals.items():
        print(f"ledger {mode:3}: {steps} steps in {secs:.1f} s = {steps / secs:.0f} steps/s")
    print(
        f"ledger's own time: {1e6 * spent[0] / max(1, spent[1]):.1f} us/op over {spent[1]} ops "
        f"({100 * spent[0] / totals['on'][1]:.1f}% of the ledger-on run)"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--actions", type=int, default=300)
    ap.add_argument("--target", default="vllm", help="target for the vLLM candidate rows: vllm, spec or impl")
    ap.add_argument("--cost", action="store_true", help="steps/s of the fuzzing machine with the ledger on and off")
    ap.add_argument("--examples", type=int, default=10, help="--cost: examples per family and mode")
    a = ap.parse_args()
    if a.cost:
        cost(a.target, a.examples)
        return
    head = f"{'first detection':>15} {'ops':>10} {'time':>9}  {'found':29}"
    print(f"{'case':34} | ledger: {head} | oracle: {head}")
    for mutant, config in MUTANT_ROWS:
        row(f"mutant {mutant}", lambda m=mutant: make_mutant_target(m), config, a.seeds, a.actions, True)  # type: ignore[misc]
    factory = resolve(a.target).factory
    for name, config in CANDIDATE_ROWS:
        row(f"{a.target} {name}", factory, config, a.seeds, a.actions, False)


if __name__ == "__main__":
    main()
