"""What shadow costs an engine: output tokens per second on the same workloads, plain, with the
recording (``KVSPEC_RECORD``'s sink: the operations and outcomes kept, no spec), with the
shadow as ``KVSPEC_SHADOW=1`` attaches it (the spec in lockstep behind the manager: each call checked
with glimpses, the whole state at the end), with the whole state also compared at every engine step's
end (``shadow+full``, as the engine worker does), and with every engine check on
(``worker.EngineUnderCheck``).  Runs in the engine venv::

    .venv-engine/bin/python -m kvspec.harness.engine.bench [--rounds 5] [--kind full]

Engines in-process, built once each; the rounds alternate the three so that machine load hits them
alike; the figure is the median round, and the ratios are to the plain engine in the same run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from kvspec.harness.engine.drive import drive, make_llm
from kvspec.harness.engine.models import MODEL_KINDS, write_model
from kvspec.harness.engine.outputs import Counts
from kvspec.harness.engine.workload import draw_workload


def _plain(folder: Path, pool_bytes: int) -> Any:
    return make_llm(folder, pool_bytes)


def _shadowed(folder: Path, pool_bytes: int, full_check_each_step: bool) -> Any:
    from kvspec.harness.vllm_sched.proxy import install
    from kvspec.harness.vllm_sched.record import spec_config_of
    from kvspec.harness.vllm_sched.sink import LockstepSink

    llm = _plain(folder, pool_bytes)
    scheduler = llm.llm_engine.engine_core.engine_core.scheduler
    sink = LockstepSink(spec_config_of(scheduler), scheduler.kv_cache_manager)
    install(scheduler, sink, tolerant=True)
    core = llm.llm_engine.engine_core.engine_core
    step_fn = core.step_fn

    def step_and_check() -> Any:  # the whole state compared at each step's end (the engine worker does)
        out = step_fn()
        sink.finish()
        return out

    if full_check_each_step:
        core.step_fn = step_and_check
    return llm


def _recorded(folder: Path, pool_bytes: int, path: Path) -> Any:
    """An engine whose manager calls are recorded to ``path`` (``KVSPEC_RECORD``'s sink)."""
    from kvspec.harness.vllm_sched.proxy import install
    from kvspec.harness.vllm_sched.record import RecordSink, spec_config_of

    llm = _plain(folder, pool_bytes)
    scheduler = llm.llm_engine.engine_core.engine_core.scheduler
    install(scheduler, RecordSink(spec_config_of(scheduler), path, every=1 << 30), tolerant=True)
    return llm


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kvspec.harness.engine.bench", description=__doc__)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--kind", choices=MODEL_KINDS, default="full")
    ap.add_argument("--workloads", type=int, default=4, help="preemption workloads per round (seeds 0..N-1)")
    ap.add_argument("--models", default=str(Path(sys.prefix) / "kvspec-models"))
    args = ap.parse_args(argv)
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from kvspec.harness.engine.dense import DenseModel
    from kvspec.harness.engine.worker import EngineUnderCheck, pool_bytes

    folder = write_model(args.kind, Path(args.models))
    counts = Counts()
    engines = {
        "plain": _plain(folder, pool_bytes("float32")).llm_engine,
        "record": _recorded(folder, pool_bytes("float32"), Path(tempfile.mkdtemp()) / "trace.json").llm_engine,
        "shadow": _shadowed(folder, pool_bytes("float32"), False).llm_engine,
        "shadow+full": _shadowed(folder, pool_bytes("float32"), True).llm_engine,
        "every check": EngineUnderCheck(args.kind, True, folder, DenseModel(folder), "float32", counts).llm.llm_engine,
    }
    workloads = [draw_workload("preemption", s) for s in range(args.workloads)]
    rates: dict[str, list[float]] = {name: [] for name in engines}
    for _ in range(args.rounds):
        for name, engine in engines.items():
            t, tokens = time.perf_counter(), 0
            for w in workloads:
                out = drive(engine, w, Counts())
                tokens += sum(len(o) for r in out.values() if r for o in r["outputs"])
            rates[name].append(tokens / (time.perf_counter() - t))
    base = statistics.median(rates["plain"])
    print(
        f"engine throughput, model {args.kind}, {args.workloads} preemption workloads, {args.rounds} rounds (median):"
    )
    for name, r in rates.items():
        m = statistics.median(r)
        rounds = ", ".join(f"{x:.0f}" for x in r)
        print(f"  {name:12s} {m:8.0f} output tokens/s   {m / base:5.3f} x plain   (rounds: {rounds})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
