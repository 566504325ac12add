"""Per-call cost of the manager proxy, side by side: ``python -m kvspec.harness.vllm_sched.bench``.

The same seeded workload (``harness.vllm_sched.driver``; the real scheduler decides identically each
time) runs on the real scheduler bare (no proxy), then with the proxy feeding a sink that does
nothing (the request synchronisation alone), a ``RecordSink`` (``KVSPEC_RECORD``) and a
``ShadowSink`` (``KVSPEC_SHADOW``: the spec in lockstep).  Printed: the bare manager call (µs, timed
inside the proxy) and each mode's extra wall time per mirrored manager call (µs).
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from pathlib import Path
from typing import Any

from kvspec.harness.core import ops as O
from kvspec.harness.vllm_sched.build import build_scheduler
from kvspec.harness.vllm_sched.driver import Driver, draw_config, draw_knobs
from kvspec.harness.vllm_sched.proxy import ManagerProxy, install
from kvspec.harness.vllm_sched.record import RecordSink, ShadowSink
from kvspec.harness.world.workload import SeededChoices


class NullSink:
    done = False

    def request_op(self, op: O.Op, request: Any) -> None:
        pass

    def manager_op(self, op: O.Op, outcome: Any, error: BaseException | None) -> None:
        pass


def run_mode(mode: str, family: str, seed: int, steps: int, tmp: Path) -> tuple[float, ManagerProxy | None]:
    """(wall seconds of ``steps`` engine steps, the proxy or None when bare)."""
    ch = SeededChoices(random.Random(seed))
    config = draw_config(ch, family)
    knobs = draw_knobs(ch, config, family)
    sched, spec_config = build_scheduler(config, knobs)
    proxy = None
    if mode != "bare":
        sink: Any
        if mode == "null":
            sink = NullSink()
        elif mode == "record":
            sink = RecordSink(spec_config, tmp / f"trace-{seed}.json", every=1000)
        else:
            sink = ShadowSink(spec_config, sched.kv_cache_manager, str(tmp / "shadow"), "raise")
        proxy = install(sched, sink)
    driver = Driver(sched, spec_config, knobs, ch)
    t = time.perf_counter()
    for _ in range(steps):
        driver.step()
    if mode == "record":
        assert proxy is not None
        proxy.sink.write()  # type: ignore[attr-defined]
    return time.perf_counter() - t, proxy


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m kvspec.harness.vllm_sched.bench", description=__doc__)
    p.add_argument("--family", default="full")
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--steps", type=int, default=150, help="engine steps per run (records stay under 10,000 ops)")
    args = p.parse_args(argv)
    totals = {m: 0.0 for m in ("bare", "null", "record", "shadow")}
    calls = 0
    bare_call = 0.0
    with tempfile.TemporaryDirectory() as d:
        for seed in range(args.seeds):
            for mode in totals:
                wall, proxy = run_mode(mode, args.family, seed, args.steps, Path(d))
                totals[mode] += wall
                if mode == "null" and proxy is not None:
                    calls += proxy.calls
                    bare_call += proxy.seconds
    calls = max(calls, 1)
    print(f"family {args.family}: {args.seeds} runs x {args.steps} engine steps, {calls} manager calls")
    print(f"  bare manager call (timed in the proxy): {1e6 * bare_call / calls:8.1f} us")
    for mode in ("null", "record", "shadow"):
        extra = (totals[mode] - totals["bare"]) / calls
        print(f"  {mode:7s} overhead per manager call:        {1e6 * extra:8.1f} us   (wall {totals[mode]:.2f}s)")
    print(f"  bare scheduler wall: {totals['bare']:.2f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
