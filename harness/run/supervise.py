"""A run that survives its target: the run loop in a child process, its crash a finding of the parent.

``supervised(opts, body)`` runs ``body`` (a whole run: the target loaded, the loop run, the
``FuzzResult`` made) in a child (``harness.drivers.isolated.call_isolated``), before any target code
is loaded here.  The child's flight recorder names the example and the operation under way
(``harness.core.flight``).  When the child dies (a signal, ``os._exit``, ``abort``, its standard
streams closed) or outlives ``--seconds`` by ``hang_grace(opts)``, this process makes the finding:

- a finding the child made before it died (it was being reduced) is kept as found;
- otherwise a ``target-crashed`` (or ``target-hung``) finding whose trace is the example's operations
  up to the one the target died in, reduced within ``--reduce-seconds`` by a reducer in its own
  child (the target loaded there, each candidate replayed in a child of it): a crash there too
  leaves the trace as it was.

``kvspec fuzz`` (each ``--workers`` worker too) and each row of ``kvspec mutants`` run this way; the
report is written by the process that survived.  The cost: one fork per run, and a flight record per
operation (``python -m kvspec.harness.bench.supervision``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from kvspec.harness.check.finding import Finding
from kvspec.harness.drivers.isolated import CRASHED, Crash, call_isolated, crash_trace, found_trace, reduce_crash
from kvspec.harness.run.fuzzing import FuzzResult
from kvspec.harness.run.options import FuzzOptions
from kvspec.harness.run.signals import SIGNALS

if TYPE_CHECKING:
    from kvspec.harness.run.catalogue import CatalogueEntry
    from kvspec.harness.traces.trace import Trace


def hang_grace(opts: FuzzOptions) -> float:
    """How long past ``--seconds`` a run may go (the turn under way, the last replay) before it is
    taken for hung and killed."""
    return 20.0 + 2 * opts.step_timeout


def supervised(
    opts: FuzzOptions, body: Callable[[], FuzzResult], entry: Callable[[], CatalogueEntry] | None = None
) -> FuzzResult:
    """``body()`` in a child; its ``FuzzResult``, or the finding its crash is (module docstring).
    ``entry()`` gives the catalogue entry a crash is reduced on (in the reducer's child; default: the
    one ``opts`` names).  ``--in-process``: ``body()`` here, unsupervised."""
    if opts.in_process:
        return body()
    t0 = time.monotonic()
    out = call_isolated(body, seconds=opts.seconds + hang_grace(opts), on_signal=SIGNALS.note)
    if out.crash is None:
        result: FuzzResult = out.value
        return result
    res = crashed(opts, out.crash, entry, left=t0 + opts.seconds - time.monotonic())
    res.elapsed = res.first_finding_after = time.monotonic() - t0
    return res


def crashed(
    opts: FuzzOptions, crash: Crash, entry: Callable[[], CatalogueEntry] | None = None, left: float | None = None
) -> FuzzResult:
    """The ``FuzzResult`` of a run whose process ``crash`` ended (module docstring); its reduction
    within ``--reduce-seconds`` and ``left``, the run's time left (at least a few seconds)."""
    log = crash.log
    res = FuzzResult(found_family=log.family, interrupted=SIGNALS.signum)
    relation = str(log.run.get("relation", opts.relation))
    found = found_trace(log, relation, opts.target, opts.profile)
    if found is not None:
        res.trace = found
        res.summary = f"{Finding(**found['finding']).summary()} (then the process {crash.how}; kept unreduced)"
        res.shrunk_steps = len(found.get("steps", []))
        return res
    trace = crash_trace(crash, relation, opts.target, opts.profile)
    if trace is None:
        res.stopped = f"the target {'hung' if crash.hung else 'crashed'} {log.where()}: the process {crash.how}"
        return res
    res.shrunk_steps = len(trace.steps)
    if not crash.hung and res.interrupted is None:
        seconds = float(opts.reduce_seconds) if left is None else min(float(opts.reduce_seconds), max(left, 5.0))
        trace = _reduced(opts, trace, entry, seconds)
    from kvspec.harness.traces.trace import trace_to_json

    res.trace = trace_to_json(trace)
    res.summary = Finding(**res.trace["finding"]).summary()
    return res


def _reduced(opts: FuzzOptions, trace: Trace, entry: Callable[[], CatalogueEntry] | None, seconds: float) -> Trace:
    """``trace`` reduced by a reducer in its own child, within ``seconds``; as it was when the reducer
    cannot load the target, raises or dies."""
    from kvspec.harness.traces.trace import trace_from_json, trace_to_json

    if seconds <= 0:
        return trace
    print(f"kvspec fuzz: the target crashed; reducing its trace ({len(trace.steps)} steps) for up to {seconds:g}s")
    t0 = time.monotonic()
    try:
        out = call_isolated(
            _reduce_in_child, opts, trace_to_json(trace), entry, seconds, seconds=seconds + 30.0, on_signal=SIGNALS.note
        )
    except Exception as e:  # the reducer could not load the target, or raised: the trace as it was
        print(f"kvspec fuzz: the crash's trace is kept unreduced ({type(e).__name__}: {e})")
        return trace
    if out.crash is not None or out.value is None:
        return trace
    reduced = trace_from_json(out.value, "the reducer's trace")
    print(f"kvspec fuzz: reduced to {len(reduced.steps)} steps in {time.monotonic() - t0:.1f}s")
    return reduced


def _reduce_in_child(
    opts: FuzzOptions, trace_json: dict[str, Any], entry: Callable[[], CatalogueEntry] | None, seconds: float
) -> Any:
    from kvspec.harness.run.catalogue import fuzz_target
    from kvspec.harness.traces.trace import trace_from_json, trace_to_json

    trace = trace_from_json(trace_json, "the crash's trace")
    target = entry() if entry is not None else fuzz_target(opts)
    if trace.finding is None or trace.finding.get("kind") != CRASHED:
        return None
    return trace_to_json(reduce_crash(trace, target.factory, opts.checks(), seconds))
