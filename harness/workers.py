"""``kvspec fuzz --workers N``: N Hypothesis engines, one per process, on the one example database.

Each worker is the ordinary fuzzing loop (``harness.fuzzing.run_fuzz``) in a process of the standard
library's ``ProcessPoolExecutor``, with its own seeds and family rotation (worker ``i`` starts at
family ``i``); all of them read and write the example database that ``--db`` / ``KVSPEC_DB`` names (a
folder on one machine, a Redis server across machines).  The parent prints one progress line and
one summary; the first worker to find something sets a shared stop event, the others finish their
current batch and return, and only that first finding is written as a report.

For adaptive, coverage-guided fuzzing on many cores use HypoFuzz on the pytest plugin's state
machines instead (README, docs/ci.md); this is the plain, deterministic-seed common case.
``python -m harness.bench_workers`` measures the speed-up of N workers over one.
"""

from __future__ import annotations

import argparse
import multiprocessing
import queue
import sys
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from typing import Any

from harness.fuzzing import FuzzResult, fuzz_factory, progress_line, run_fuzz

_STOP: Any = None  # the shared stop event, in each worker process
_PROGRESS: Any = None  # the queue of (worker, steps, examples, elapsed)


def _init(stop: Any, progress: Any) -> None:
    global _STOP, _PROGRESS
    _STOP, _PROGRESS = stop, progress


def _work(args: argparse.Namespace, families: list[str], worker: int, workers: int) -> FuzzResult:
    """One worker: the fuzzing loop, stopping when another worker found something."""

    def on_batch(res: FuzzResult, elapsed: float) -> None:
        try:
            _PROGRESS.put_nowait((worker, res.steps, res.examples, elapsed, len(res.batches)))
        except queue.Full:
            pass
        if res.trace is not None or res.stopped is not None:
            _STOP.set()

    return run_fuzz(args, families, fuzz_factory(args), worker, workers, should_stop=_STOP.is_set, on_batch=on_batch)


def fuzz_workers(args: argparse.Namespace, families: list[str], progress: bool = False) -> FuzzResult:
    """Run ``args.workers`` workers; return their merged counts and the first finding (if any)."""
    n = int(args.workers)
    ctx = multiprocessing.get_context("spawn")  # no fork of a process that may hold threads (vLLM, torch)
    stop = ctx.Event()
    updates = ctx.Queue(maxsize=1000)
    latest: dict[int, tuple[int, int, float, int]] = {}
    results: list[FuzzResult] = []
    first: FuzzResult | None = None
    with ProcessPoolExecutor(max_workers=n, mp_context=ctx, initializer=_init, initargs=(stop, updates)) as pool:
        pending: set[Future[FuzzResult]] = {pool.submit(_work, args, families, i, n) for i in range(n)}
        while pending:
            done, pending = wait(pending, timeout=0.5, return_when=FIRST_COMPLETED)
            _drain(updates, latest)
            for fut in done:
                res = fut.result()  # a worker that crashed re-raises here
                results.append(res)
                if first is None and (res.trace is not None or res.stopped is not None):
                    first = res
                    stop.set()
            if progress and latest:
                agg = FuzzResult(steps=sum(v[0] for v in latest.values()), examples=sum(v[1] for v in latest.values()))
                agg.batches.update({f: 1 for f in families[: max(v[3] for v in latest.values())]})
                el = max(v[2] for v in latest.values())
                print(progress_line(el, agg, families, n), end="", file=sys.stderr, flush=True)
    merged = FuzzResult()
    for res in results:
        merged.add(res)
    merged.elapsed = max((r.elapsed for r in results), default=0.0)
    if first is not None:
        merged.found_family, merged.trace, merged.summary = first.found_family, first.trace, first.summary
        merged.stopped, merged.first_finding_after = first.stopped, first.first_finding_after
    return merged


def _drain(updates: Any, latest: dict[int, tuple[int, int, float, int]]) -> None:
    while True:
        try:
            worker, steps, examples, elapsed, fams = updates.get_nowait()
        except queue.Empty:
            return
        latest[worker] = (steps, examples, elapsed, fams)
