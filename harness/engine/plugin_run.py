"""A plain engine running one workload, for the record/shadow plugin (``KVSPEC_RECORD``,
``KVSPEC_SHADOW``: ``harness.vllm_sched.record``) to attach to as it would in a user's ``vllm serve``:
no kvspec hook besides the plugin, vLLM's default engine-core process unless ``--in-process``.

    KVSPEC_RECORD=trace.json python -m kvspec.harness.engine.plugin_run --kind sliding --family preemption
    python -m kvspec.harness replay trace.json --target spec      # then --target vllm

Runs in the engine venv; prints one JSON line (requests, outputs' lengths) and exits 0 once the
engine has shut down (the trace is written at the scheduler's shutdown).  ``--engine-defaults``
keeps the engine's own configuration (``prefix_cache_retention_interval=0`` since 0.32, which the
plugin refuses for sliding-window groups) instead of dense retention.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from kvspec.harness.engine.drive import drive, make_llm
from kvspec.harness.engine.models import MODEL_KINDS, write_model
from kvspec.harness.engine.outputs import Counts
from kvspec.harness.engine.workload import ENGINE_FAMILIES, draw_workload


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kvspec.harness.engine.plugin_run", description=__doc__)
    ap.add_argument("--kind", choices=MODEL_KINDS, default="full")
    ap.add_argument("--family", choices=ENGINE_FAMILIES, default="preemption")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--models", default=str(Path(sys.prefix) / "kvspec-models"))
    ap.add_argument("--pool-bytes", type=int, default=1 << 19, help="KV-cache memory (default: 16 blocks a layer)")
    ap.add_argument("--in-process", action="store_true", help="VLLM_ENABLE_V1_MULTIPROCESSING=0")
    ap.add_argument("--engine-defaults", action="store_true", help="keep the engine's retention interval")
    args = ap.parse_args(argv)
    if args.in_process:
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    folder = write_model(args.kind, Path(args.models))
    llm = make_llm(folder, args.pool_bytes, engine_defaults=args.engine_defaults)
    counts = Counts()
    results = drive(llm.llm_engine, draw_workload(args.family, args.seed), counts)
    llm.llm_engine.engine_core.shutdown()
    lengths = [None if r is None else [len(o) for o in r["outputs"]] for _, r in sorted(results.items())]
    print(json.dumps({"requests": counts.c["requests"], "aborts": counts.c["aborts"], "outputs": lengths}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
