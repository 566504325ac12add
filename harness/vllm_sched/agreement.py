"""Does kvspec's scheduler model (``harness/world/scheduler.py``) make the manager calls vLLM's real
scheduler makes?  Same inputs, both schedulers, the two call sequences compared.

One run: the real 0.33.0 ``Scheduler`` is driven as ``kvspec fuzz --target vllm-scheduler`` drives it
(``harness.vllm_sched.driver``), and the ``Driver`` records what the world did in each engine step;
then kvspec's model replays those steps (``harness.vllm_sched.mirror.ModelMirror``, where the relation
``compare_step`` is described).  ``kvspec fuzz --target vllm-scheduler`` checks the same relation in
every run, step by step; this command only measures it.

A run agrees up to its first differing step; the rest of it is not compared (the two schedulers'
states differ from there).  ``python -m kvspec.harness.vllm_sched.agreement --seconds 600`` prints the
figure (steps and calls that agree, runs that agree whole) and each kind of first difference; it
exits 1 when a run differs (as ``kvspec fuzz`` would report it), 0 when every run agrees whole.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from kvspec.harness.core import ops as O
from kvspec.harness.vllm_sched.build import SchedKnobs, build_scheduler
from kvspec.harness.vllm_sched.driver import SCHED_FAMILIES, Driver, draw_config, draw_knobs
from kvspec.harness.vllm_sched.mirror import Call, ModelMirror, WorldStep
from kvspec.harness.vllm_sched.proxy import install
from kvspec.harness.world.workload import SeededChoices
from kvspec.spec.config import KVCacheConfig

T = TypeVar("T")


class CallLog:
    """A proxy sink (``harness.vllm_sched.proxy``) that keeps the real scheduler's manager calls,
    each with the phase of the engine step it came in."""

    def __init__(self) -> None:
        self.phase = "world"
        self.calls: list[Call] = []

    @property
    def done(self) -> bool:
        return False

    def request_op(self, op: O.Op, request: Any) -> None:
        pass

    def manager_op(self, op: O.Op, outcome: Any, error: BaseException | None) -> None:
        self.calls.append((self.phase, op))


@dataclass
class RunAgreement:
    """One run compared: steps and calls up to the first difference, and that difference."""

    family: str
    seed: int
    engine_steps: int = 0
    steps_agreed: int = 0
    calls: int = 0  # the real scheduler's manager calls in the compared steps
    calls_agreed: int = 0
    difference: str | None = None  # the kind of the first difference (None: the whole run agrees)
    detail: str = ""


def compare_run(family: str, seed: int, max_engine_steps: int = 200) -> RunAgreement:
    """Run ``family`` from ``seed`` on the real scheduler, replay it on the model, compare."""
    ch = SeededChoices(random.Random(seed))
    config = draw_config(ch, family)
    knobs = draw_knobs(ch, config, family)
    sched, spec_config = build_scheduler(config, knobs)
    log = CallLog()
    install(sched, log)

    def on_phase(phase: str) -> None:
        log.phase = phase

    driver = Driver(sched, spec_config, knobs, ch, on_phase=on_phase)
    real_steps: list[list[Call]] = []
    for _ in range(max_engine_steps):
        start = len(log.calls)
        driver.step()
        real_steps.append(log.calls[start:])
    assert driver.world is not None
    return replay_on_model(family, seed, spec_config, knobs, driver.world, real_steps)


def replay_on_model(
    family: str,
    seed: int,
    config: KVCacheConfig,
    knobs: SchedKnobs,
    world: list[WorldStep],
    real_steps: list[list[Call]],
) -> RunAgreement:
    """Drive kvspec's scheduler model through the recorded ``world`` against the spec and compare
    its manager calls with ``real_steps`` step by step."""
    mirror = ModelMirror(config, knobs)
    res = RunAgreement(family, seed, engine_steps=len(world))
    for step, real in zip(world, real_steps, strict=True):
        diff = mirror.step(step, real)
        res.calls += len(real)
        if diff is not None:
            res.difference = diff.kind
            res.detail = f"step {res.steps_agreed}: {diff.detail}"
            break
        res.steps_agreed += 1
        res.calls_agreed += len(real)
    return res


@dataclass
class Agreement:
    """Runs compared, summed."""

    runs: list[RunAgreement] = field(default_factory=list)
    skipped: Counter[str] = field(default_factory=Counter)

    def summary(self) -> dict[str, Any]:
        runs = self.runs
        steps = sum(r.engine_steps for r in runs)
        kinds = Counter(r.difference for r in runs if r.difference)
        return {
            "runs": len(runs),
            "runs_agreeing": sum(r.difference is None for r in runs),
            "engine_steps": steps,
            "steps_agreed": sum(r.steps_agreed for r in runs),
            "calls_compared": sum(r.calls for r in runs),
            "calls_agreed": sum(r.calls_agreed for r in runs),
            "first_differences": dict(kinds.most_common()),
            "by_family": {
                f: f"{sum(r.difference is None for r in runs if r.family == f)}/{sum(r.family == f for r in runs)}"
                for f in sorted({r.family for r in runs})
            },
            "skipped": dict(self.skipped),
        }


def measure(families: Sequence[str], seconds: float, seed: int, max_engine_steps: int = 200) -> Agreement:
    """Compare runs of ``families`` in turn (run ``i`` seeded as ``kvspec fuzz`` seeds it) until
    ``seconds`` are spent."""
    from kvspec.harness.targets.base import Unsupported
    from kvspec.harness.vllm_sched.fuzz import run_seed

    out = Agreement()
    deadline = time.monotonic() + seconds
    i = 0
    while time.monotonic() < deadline:
        family = families[i % len(families)]
        s = run_seed(seed, i)
        i += 1
        try:
            out.runs.append(compare_run(family, s, max_engine_steps))
        except Unsupported as e:
            out.skipped[f"{family}: {e}"] += 1
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m kvspec.harness.vllm_sched.agreement",
        description="kvspec's scheduler model against vLLM's real scheduler: same inputs, manager calls compared",
    )
    ap.add_argument("--family", default="all", help=f"comma-separated, or all ({', '.join(SCHED_FAMILIES)})")
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=200, help="engine steps per run")
    ap.add_argument("--show", type=int, default=3, help="print the first N differences in full")
    ap.add_argument("--json", action="store_true", help="print the summary as JSON")
    args = ap.parse_args(argv)
    families = list(SCHED_FAMILIES) if args.family == "all" else args.family.split(",")
    unknown = [f for f in families if f not in SCHED_FAMILIES]
    if unknown:
        ap.error(f"unknown families {unknown} (known: {', '.join(SCHED_FAMILIES)})")
    if not (args.seconds > 0 and args.steps > 0):
        ap.error("--seconds and --steps must be > 0")
    result = measure(families, args.seconds, args.seed, args.steps)
    summary = result.summary()
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        s = summary
        print(
            f"runs {s['runs']}: {s['runs_agreeing']} agree whole; engine steps {s['steps_agreed']}/{s['engine_steps']} "
            f"({100 * s['steps_agreed'] / max(s['engine_steps'], 1):.1f}%) agree; manager calls "
            f"{s['calls_agreed']}/{s['calls_compared']} ({100 * s['calls_agreed'] / max(s['calls_compared'], 1):.1f}%)"
        )
        print("agreeing runs by family: " + ", ".join(f"{f} {v}" for f, v in s["by_family"].items()))
        for kind, n in s["first_differences"].items():
            print(f"  first difference x{n}: {kind}")
        for r in [r for r in result.runs if r.difference][: args.show]:
            print(f"- {r.family} seed {r.seed}: {r.detail[:2000]}")
        for why, n in s["skipped"].items():
            print(f"  skipped x{n}: {why}")
    return 1 if summary["first_differences"] else 0


if __name__ == "__main__":
    sys.exit(main())
