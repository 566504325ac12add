"""``kvspec fuzz --workers N``: N Hypothesis engines, one per process, on the one example database.

Each worker is the one run loop (``harness.run.fuzzing.run_fuzz``) in a process of the standard
library's ``ProcessPoolExecutor``, with its own seeds and family rotation (worker ``i`` starts at
family ``i``); all of them read and write the example database that ``--db`` / ``KVSPEC_DB`` names (a
folder on one machine, a Redis server across machines).  The parent prints one progress line and
one summary; the first worker to find something sets a shared stop event, the others finish their
current batch and return, and only that first finding is written as a report.

For adaptive, coverage-guided fuzzing on many cores use HypoFuzz on the pytest plugin's state
machines instead (README, docs/ci.md); this is the plain, deterministic-seed common case.
``python -m kvspec.harness.bench.workers`` measures the speed-up of N workers over one.

Signals: each worker handles SIGINT and SIGTERM like the single process (``harness.run.signals.SIGNALS``:
stop, keep the smallest finding so far) and returns.  The workers start with both ignored (the
disposition survives their ``exec``) until their handlers are installed, so a Ctrl-C during their
start-up cannot kill one with a traceback.  The parent only notes a signal; its loop then sets the stop
event and passes the signal on to the workers (again every half second, for one still starting),
and after ``GRACE_SECONDS`` kills those that have not returned.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import queue
import signal
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from typing import Any

from kvspec.harness.run.catalogue import fuzz_target
from kvspec.harness.run.fuzzing import FuzzResult, progress_line, run_fuzz
from kvspec.harness.run.options import FuzzOptions
from kvspec.harness.run.signals import SIGNALS
from kvspec.harness.run.supervise import supervised

GRACE_SECONDS = 10.0  # after a signal, how long the parent waits for the workers' results
_STOP: Any = None  # the shared stop event, in each worker process
_PROGRESS: Any = None  # the queue of (worker, steps, examples, elapsed)


def _init(stop: Any, progress: Any) -> None:
    global _STOP, _PROGRESS
    _STOP, _PROGRESS = stop, progress
    SIGNALS.install()  # for the worker's lifetime


def _work(opts: FuzzOptions, worker: int, workers: int, tty: bool = False) -> FuzzResult:
    """One worker: the fuzzing loop, stopping when another worker found something."""

    def on_batch(res: FuzzResult, elapsed: float) -> None:
        try:
            _PROGRESS.put_nowait((worker, res.steps, res.examples, elapsed, len(res.batches)))
        except queue.Full:
            pass
        if res.trace is not None or res.stopped is not None:
            _STOP.set()

    def announce(line: str) -> None:
        line = line.replace("kvspec fuzz:", f"kvspec fuzz: worker {worker}:", 1)
        print(("\n" if tty else "") + line, file=sys.stderr, flush=True)

    return supervised(
        opts,
        lambda: run_fuzz(
            opts,
            fuzz_target(opts),
            worker,
            workers,
            should_stop=_STOP.is_set,
            on_batch=on_batch,
            bounded=True,
            announce=announce,
        ),
    )


def fuzz_workers(opts: FuzzOptions, progress: bool = False) -> FuzzResult:
    """Run ``opts.workers`` workers; return their merged counts and the first finding (if any)."""
    n = opts.workers
    ctx = multiprocessing.get_context("spawn")  # no fork of a process that may hold threads (vLLM, torch)
    stop = ctx.Event()
    updates = ctx.Queue(maxsize=1000)
    latest: dict[int, tuple[int, int, float, int]] = {}
    results: list[FuzzResult] = []
    signalled: float | None = None  # when the parent saw the signal
    with ProcessPoolExecutor(max_workers=n, mp_context=ctx, initializer=_init, initargs=(stop, updates)) as pool:
        with _signals_ignored():  # inherited by the workers started here (see the module docstring)
            pending: set[Future[FuzzResult]] = {pool.submit(_work, opts, i, n, progress) for i in range(n)}
        while pending:
            done, pending = wait(pending, timeout=0.5, return_when=FIRST_COMPLETED)
            _drain(updates, latest)
            if SIGNALS.signum is not None:
                signalled = signalled or time.monotonic()
                _pass_on(SIGNALS.signum, stop, terminate=time.monotonic() - signalled > GRACE_SECONDS)
            for fut in done:
                results.append(_result(fut))
                if _stops(results[-1]):
                    stop.set()
            if progress and latest:
                agg = FuzzResult(steps=sum(v[0] for v in latest.values()), examples=sum(v[1] for v in latest.values()))
                agg.batches.update({f: 1 for f in opts.families[: max(v[3] for v in latest.values())]})
                el = max(v[2] for v in latest.values())
                print(progress_line(el, agg, opts.families, n), end="", file=sys.stderr, flush=True)
    return _merge(results, SIGNALS.signum)


def _stops(res: FuzzResult) -> bool:
    return res.trace is not None or res.stopped is not None or res.interrupted is not None


def _result(fut: Future[FuzzResult]) -> FuzzResult:
    """A worker's result; one that crashed (or was terminated) is a stopped run, not a traceback."""
    try:
        return fut.result()
    except Exception as e:  # BrokenProcessPool, or what the worker raised
        return FuzzResult(stopped=f"a worker failed: {type(e).__name__}: {e}")


def _merge(results: list[FuzzResult], signum: int | None) -> FuzzResult:
    """The workers' counts added up, with the first finding (the first result with a trace, else the
    first that stopped) and the signal that stopped the run, if any."""
    merged = FuzzResult()
    for res in results:
        merged.add(res)
    merged.elapsed = max((r.elapsed for r in results), default=0.0)
    first = next((r for r in results if r.trace is not None), None) or next((r for r in results if r.stopped), None)
    if first is not None:
        merged.found_family, merged.trace, merged.summary = first.found_family, first.trace, first.summary
        merged.stopped, merged.first_finding_after = first.stopped, first.first_finding_after
        merged.shrunk_steps, merged.shrink_examples = first.shrunk_steps, first.shrink_examples
    merged.interrupted = signum or next((r.interrupted for r in results if r.interrupted is not None), None)
    return merged


def _pass_on(signum: int, stop: Any, terminate: bool) -> None:
    """Stop the workers: the stop event, the signal passed on, and past the grace period, termination."""
    stop.set()
    for child in multiprocessing.active_children():
        with contextlib.suppress(OSError):
            if terminate:
                child.kill()  # SIGKILL: the workers handle SIGTERM
            elif child.pid is not None:
                os.kill(child.pid, signum)


@contextlib.contextmanager
def _signals_ignored() -> Iterator[None]:
    """SIGINT and SIGTERM ignored in this block (workers started in it inherit that); the handlers
    put back after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler if handler is not None else signal.SIG_DFL)


def _drain(updates: Any, latest: dict[int, tuple[int, int, float, int]]) -> None:
    while True:
        try:
            worker, steps, examples, elapsed, fams = updates.get_nowait()
        except queue.Empty:
            return
        latest[worker] = (steps, examples, elapsed, fams)
