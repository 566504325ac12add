"""``kvspec fuzz --target vllm-scheduler``: vLLM's real scheduler driven for N seconds, the spec in
lockstep behind its ``KVCacheManager`` (``harness.vllm_sched.driver.run_one``).

Runs follow each other until ``--seconds`` is spent: run ``i`` draws a family of the chosen ones in
turn, a config of it and the scheduler knobs from ``SeededChoices(Random(seed, i))``, so ``--seed``
reproduces a run.  Families the real scheduler cannot run on CPU are skipped with a message.  The
first finding writes the usual report folder (``harness.traces.report.write_report``; its ``trace.json``
holds ordinary harness operations, reduced on the real manager, so ``kvspec replay`` reproduces it
on ``--target vllm`` or ``spec``; ``--target vllm-scheduler`` re-drives the real scheduler from the
run's family and seed, ``replay_scheduler_run``) and exits 1; otherwise a summary (engine steps,
manager calls per second) and exit 0.
SIGINT or SIGTERM (``harness.run.signals``) stops the run before its next engine step: a finding of the
run under way is still written, the summary printed, and the exit status is 130 or 143.
"""

from __future__ import annotations

import contextlib
import random
import sys
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.check.finding import Finding
from harness.ledger.known_bugs import get_known_bug
from harness.run.options import FuzzOptions
from harness.run.signals import signal_name
from harness.targets.base import Unsupported
from harness.traces.trace import Trace
from harness.vllm_sched.build import SchedKnobs
from harness.vllm_sched.driver import SCHED_FAMILIES, RunResult

if TYPE_CHECKING:
    from harness.traces.replay import ReplayResult

EXIT_OK, EXIT_FOUND, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
TARGET_NAME = "vllm-scheduler"


def scheduler_families(families: list[str]) -> tuple[list[str], list[str]]:
    """(families the real scheduler runs, the others): every kvspec layout family it supports; with
    all of kvspec's families chosen (``--family all``), also ``connector`` and ``spec_decode``."""
    from harness.world.families import FAMILIES

    runs = [f for f in families if f in SCHED_FAMILIES]
    if set(FAMILIES) <= set(families):
        runs += [f for f in SCHED_FAMILIES if f not in runs]
    return runs, [f for f in families if f not in SCHED_FAMILIES]


def run_seed(seed: int, i: int) -> int:
    """The seed of run ``i`` of a fuzz run seeded ``seed``."""
    return random.Random(f"{seed}/{i}").getrandbits(63)


def one_run(family: str, seed: int, overrides: Mapping[tuple[str, int], int] | None = None, **kwargs: Any) -> RunResult:
    """Run ``family`` from ``seed`` (config, knobs and workload all drawn from it), with the draws
    a reduction replaced (``harness.vllm_sched.reduce``), if any."""
    from harness.vllm_sched.reduce import run_overridden

    return run_overridden(family, seed, overrides or {}, **kwargs)


def finding_trace(
    res: RunResult,
    family: str,
    seed: int,
    finding: Finding | None = None,
    steps: list[Any] | None = None,
    overrides: Mapping[tuple[str, int], int] | None = None,
) -> Trace:
    """The report trace of a run that ended in a finding (or of ``finding`` at ``steps``: a known bug's
    first meeting, harness.ledger.known_bugs); ``overrides``: the draws a reduction replaced."""
    from harness.targets.vllm import vllm_version
    from harness.vllm_sched.reduce import overrides_to_json

    if finding is None:
        assert res.finding is not None
        finding, steps = res.finding.finding, res.steps
    return Trace(
        config=res.config,
        steps=list(steps or ()),
        target_name=TARGET_NAME if needs_world(finding) else "vllm",
        target_version=vllm_version(),
        seed=seed,
        family=family,
        relation=res.relation,
        finding=finding.to_json(),
        extra={
            "driver": TARGET_NAME,
            "knobs": knobs_json(res.knobs),
            "engine_steps": res.engine_steps,
            **({"choice_overrides": overrides_to_json(overrides)} if overrides else {}),
        },
    )


def write_finding(
    out: str, res: RunResult, family: str, seed: int, reduce_seconds: float, stop: Callable[[], bool] | None = None
) -> Path:
    """The report of a run that ended in a finding, reduced for up to ``reduce_seconds``: first the
    run itself, re-driving the real scheduler with simpler inputs (``harness.vllm_sched.reduce``;
    call this under the scheduler mutant the run had, if any), then its operations, replayed on the
    real manager (``harness.traces.reduce``; it keeps only traces the spec accepts as a caller's), then
    written (``harness.traces.report``)."""
    from harness.run.fuzzing import reduce_finding
    from harness.targets.vllm import VllmTarget
    from harness.traces.report import write_report
    from harness.vllm_sched.reduce import reduce_scheduler_run

    assert res.finding is not None
    start = time.monotonic()
    reduced = reduce_scheduler_run(res, family, seed, 0.7 * reduce_seconds, should_stop=stop)
    small = reduced.result
    assert small.finding is not None
    trace = finding_trace(small, family, seed, overrides=reduced.overrides)
    if not needs_world(small.finding.finding):  # the operations alone reproduce it on the real manager
        left = max(0.0, reduce_seconds - (time.monotonic() - start))
        trace, _ = reduce_finding(trace, small.finding.finding, VllmTarget, left, step_timeout=10.0)
    trace.extra["recorded_steps"] = len(res.steps)
    trace.extra["scheduler_reduction"] = {
        "runs": reduced.runs,
        "seconds": round(reduced.seconds, 3),
        "steps_before": len(res.steps),
        "steps_after": len(small.steps),
    }
    return write_report(out, trace)


def needs_world(finding: Finding) -> bool:
    """Does the finding come from the world's checks or the agreement (``harness.vllm_sched.world_checks``,
    ``harness.vllm_sched.mirror``), so that only re-driving the real scheduler reproduces it
    (``kvspec replay --target vllm-scheduler``), not replaying its operations on a manager?"""
    return finding.kind in ("conservation", "agreement") or finding.witness.get("check") == "world"


def recorded_by_scheduler(paths: Sequence[str]) -> bool:
    """Do the traces under ``paths`` all record ``--target vllm-scheduler`` (a finding that only
    re-driving the real scheduler reproduces, ``needs_world``)?  False when they cannot be read:
    ``kvspec replay`` then says why."""
    from harness.core.strict_json import TraceFormatError
    from harness.traces.folders import find_traces

    try:
        found = find_traces(list(paths))
    except (TraceFormatError, ValueError, OSError):
        return False
    return bool(found.traces) and all(t.target_name == TARGET_NAME for _, t in found.traces)


def replay_hint(finding: Finding, dest: Path) -> str:
    if needs_world(finding):
        return f"kvspec replay {dest}   (re-drives the real scheduler: --target {TARGET_NAME})"
    return f"kvspec replay {dest} --target vllm   (or --target spec)"


def first_finding(families: Sequence[str], seconds: float, seed: int) -> tuple[RunResult | None, str, int, int, float]:
    """Runs of ``families`` in turn (seeded as ``kvspec fuzz`` seeds them) until one ends in a finding
    or ``seconds`` pass: (that run or None, its family, its seed, runs made, seconds to the finding)."""
    start = time.monotonic()
    deadline = start + seconds
    i = 0
    while time.monotonic() < deadline:
        family, s = families[i % len(families)], run_seed(seed, i)
        i += 1
        res = one_run(family, s, deadline=deadline)
        if res.finding is not None:
            return res, family, s, i, time.monotonic() - start
    return None, "", 0, i, time.monotonic() - start


MAX_REPLAY_ENGINE_STEPS = 100_000


def scheduler_run_of(trace: Trace, where: str) -> tuple[str, int, int, dict[tuple[str, int], int]]:
    """(family, run seed, engine steps, the draws its reduction replaced) of a report the real
    scheduler's fuzz wrote, checked: a trace is data, so anything else is a ``ValueError`` naming
    the problem."""
    from harness.vllm_sched.reduce import overrides_from_json

    extra = trace.extra
    if extra.get("driver") != TARGET_NAME:
        raise ValueError(f"{where}: not recorded by --target {TARGET_NAME} (no scheduler run to re-drive)")
    steps = extra.get("engine_steps")
    if trace.family not in SCHED_FAMILIES:
        raise ValueError(f"{where}: family {trace.family!r} is not a scheduler family ({', '.join(SCHED_FAMILIES)})")
    if trace.seed is None or not 0 <= trace.seed < 1 << 63:
        raise ValueError(f"{where}: run seed {trace.seed!r} is not one the scheduler fuzz draws")
    if type(steps) is not int or not 0 <= steps <= MAX_REPLAY_ENGINE_STEPS:
        raise ValueError(f"{where}: extra.engine_steps must be an int in [0, {MAX_REPLAY_ENGINE_STEPS}], got {steps!r}")
    return trace.family, trace.seed, steps, overrides_from_json(extra.get("choice_overrides"), where)


def replay_scheduler_run(trace: Trace, where: str, mutant: str | None = None) -> ReplayResult:
    """``kvspec replay --target vllm-scheduler``: re-drive vLLM's real scheduler from the run's
    recorded inputs (its family and run seed: the driver draws every input from them) for the
    recorded engine steps, the spec in lockstep as in the fuzz; with ``mutant``, under that
    deliberate scheduler bug.  A ``harness.traces.replay.ReplayResult``: not ok when the run ends in a
    finding (the same one as recorded, or another), ok when the finding is gone."""
    from harness.mutants.vllm_scheduler import patched
    from harness.traces.reduce import finding_signature
    from harness.traces.replay import ReplayResult

    family, seed, steps, overrides = scheduler_run_of(trace, where)
    with patched(mutant) if mutant else contextlib.nullcontext():
        res = one_run(family, seed, overrides, max_engine_steps=steps + 1)
    rec = trace.finding or {}
    recorded = finding_signature(
        Finding(str(rec.get("kind")), None, str(rec.get("message", "")), rec.get("op"), invariant=rec.get("invariant"))
    )
    for bug_id, (known, _) in sorted(res.known_first.items()):  # a known bug is counted, not raised
        if finding_signature(known) == recorded:
            msg = f"the recorded finding, known bug {bug_id} (met {res.known_hits[bug_id]} times): {known.summary()}"
            return ReplayResult(False, res.ops, msg, known)
    if res.finding is None:
        return ReplayResult(True, res.ops, f"{res.engine_steps} engine steps of the real scheduler, no finding")
    found = res.finding.finding
    same = "the recorded finding" if finding_signature(found) == recorded else "a new finding"
    return ReplayResult(False, res.ops, f"{same} after {res.engine_steps} engine steps: {found.summary()}", found)


def knobs_json(knobs: SchedKnobs) -> dict[str, Any]:
    return {
        "token_budget": knobs.token_budget,
        "max_num_seqs": knobs.max_num_seqs,
        "num_spec_tokens": knobs.num_spec_tokens,
        "connector": knobs.connector,
    }


def fuzz_scheduler(
    families: list[str],
    seconds: float,
    seed: int,
    out: str,
    say: Callable[[str], None] | None = None,
    relation: str = "exact",
    reduce_seconds: float = 10.0,
    checks: Mapping[str, bool] | None = None,
) -> int:
    """The whole ``kvspec fuzz --target vllm-scheduler`` run; the exit status.  ``checks``: the
    world's checks and the agreement turned off or on (``run_one``'s ``world_facts``,
    ``conservation``, ``agreement``; all on by default)."""
    from harness.run.signals import SIGNALS, Interrupted

    def emit(line: str) -> None:
        (say or (lambda s: print(s, file=sys.stderr, flush=True)))(line)

    with SIGNALS.installed():
        try:
            return _fuzz_scheduler(families, seconds, seed, out, emit, relation, reduce_seconds, dict(checks or {}))
        except Interrupted as e:  # while vLLM was loading
            emit(f"kvspec fuzz: interrupted by {signal_name(e.signum)} while vLLM loaded; nothing run")
            return 128 + e.signum


def _fuzz_scheduler(
    families: list[str],
    seconds: float,
    seed: int,
    out: str,
    emit: Callable[[str], None],
    relation: str,
    reduce_seconds: float,
    checks: dict[str, bool],
) -> int:
    from harness.run.signals import SIGNALS
    from harness.targets.vllm import VllmUnavailable, _vllm
    from harness.traces.report import write_report

    try:
        with SIGNALS.armed():
            _vllm()
    except VllmUnavailable as e:
        emit(f"kvspec fuzz: {e}")
        return EXIT_USAGE
    runs, skipped = scheduler_families(families)
    for f in skipped:
        emit(f"kvspec fuzz: family {f} skipped: the real scheduler does not run it on CPU here")
    if not runs:
        known = ", ".join(SCHED_FAMILIES)
        emit(f"kvspec fuzz: none of the chosen families runs on the real scheduler (choose from {known})")
        return EXIT_USAGE
    off = [name for name, on in checks.items() if not on]
    emit(
        f"kvspec fuzz: target {TARGET_NAME}, families {','.join(runs)}, up to {seconds:g}s, seed {seed}; "
        f"reports to {out}" + (f"; off: {', '.join(off)}" if off else "")
    )
    start = time.monotonic()
    deadline = start + seconds
    totals = {"runs": 0, "engine_steps": 0, "calls": 0, "ops": 0, "requests": 0}
    manager_seconds = 0.0
    known_hits: Counter[str] = Counter()
    known_reports: dict[str, str] = {}
    unsupported: dict[str, str] = {}
    i = 0

    def signalled() -> bool:
        return SIGNALS.signum is not None

    try:
        while time.monotonic() < deadline and not signalled():
            family = runs[i % len(runs)]
            s = run_seed(seed, i)
            i += 1
            if family in unsupported:
                if len(unsupported) == len(runs):
                    break
                continue
            try:
                res = one_run(family, s, None, deadline=deadline, relation=relation, stop=signalled, **checks)
            except Unsupported as e:
                unsupported[family] = str(e)
                emit(f"kvspec fuzz: family {family} skipped (seed {s}): {e}")
                continue
            except Exception as e:  # noqa: BLE001 - the real scheduler itself failed: said, not a traceback
                where = f"{type(e).__name__}: {e}".splitlines()[0][:300]
                emit(f"kvspec fuzz: the real scheduler raised outside a manager call ({where})")
                emit(
                    f"kvspec fuzz: family {family}, run seed {s}; reproduce with: python -c 'from "
                    f'harness.vllm_sched.fuzz import one_run; one_run("{family}", {s})\''
                )
                return EXIT_FOUND
            totals["runs"] += 1
            totals["engine_steps"] += res.engine_steps
            totals["calls"] += res.manager_calls
            totals["ops"] += res.ops
            totals["requests"] += res.requests
            manager_seconds += res.manager_seconds
            known_hits.update(res.known_hits)
            for bug_id, (first, steps) in res.known_first.items():
                if bug_id not in known_reports:
                    trace = finding_trace(res, family, s, first, steps)
                    name = f"known-{bug_id}-{get_known_bug(bug_id).name}"
                    known_reports[bug_id] = str(write_report(out, trace, name=name))
            if res.finding is not None:
                dest = write_finding(out, res, family, s, reduce_seconds, stop=signalled)
                emit(f"kvspec fuzz: {res.finding.finding.summary()}")
                emit(f"kvspec fuzz: family {family}, run seed {s}; report written to {dest}")
                emit(f"kvspec fuzz: replay it with: {replay_hint(res.finding.finding, dest)}")
                return 128 + SIGNALS.signum if SIGNALS.signum is not None else EXIT_FOUND
    except KeyboardInterrupt:  # a signal before the handlers were in place, or a second one
        emit("kvspec fuzz: interrupted; nothing found so far")
        return EXIT_INTERRUPTED
    elapsed = max(time.monotonic() - start, 1e-9)
    if SIGNALS.signum is not None:
        emit(f"kvspec fuzz: interrupted by {signal_name(SIGNALS.signum)}; nothing found so far")
    emit(
        f"kvspec fuzz: no finding in {elapsed:.1f}s: {totals['runs']} scheduler runs, "
        f"{totals['engine_steps']} engine steps ({totals['engine_steps'] / elapsed:.0f}/s), "
        f"{totals['calls']} manager calls mirrored ({totals['calls'] / elapsed:.0f}/s), "
        f"{totals['ops']} operations, {totals['requests']} requests; "
        f"{1e6 * manager_seconds / max(totals['calls'], 1):.1f} us per bare manager call"
    )
    for bug_id, n in sorted(known_hits.items()):
        bug = get_known_bug(bug_id)
        emit(
            f"kvspec fuzz: known bug {bug_id} ({bug.name}): {n} hits; {bug.status}; report "
            f"{known_reports.get(bug_id, '-')}; see {bug.report}"
        )
    return 128 + SIGNALS.signum if SIGNALS.signum is not None else EXIT_OK


def handles(target: str) -> bool:
    """Is ``--target`` this driver's: ``vllm-scheduler``, or ``mutant:NAME`` of a scheduler mutant?"""
    from harness.mutants.vllm_scheduler import MUTANTS

    return target == TARGET_NAME or (target.startswith("mutant:") and target.split(":", 1)[1] in MUTANTS)


def fuzz_cli(opts: FuzzOptions) -> int:
    """``kvspec fuzz`` with ``--target vllm-scheduler`` or ``--target mutant:NAME`` (a deliberate
    scheduler bug of ``harness.mutants.vllm_scheduler``, active for the whole run); options already
    checked by the CLI."""
    unused = [
        opt
        for opt, on in (
            ("--kv-check", opts.kv_check),
            ("--workers", opts.workers > 1),
            ("--junit-xml", opts.junit_xml is not None),
        )
        if on
    ]
    if unused:
        print(
            f"kvspec fuzz: {', '.join(unused)} not used with the real scheduler (one process, no oracle)",
            file=sys.stderr,
        )

    def run() -> int:
        return fuzz_scheduler(
            list(opts.families),
            opts.seconds,
            opts.seed,
            opts.out,
            relation=opts.relation,
            reduce_seconds=opts.reduce_seconds,
            checks={
                "world_facts": not opts.no_world_checks,
                "conservation": not opts.no_world_checks,
                "agreement": not opts.no_agreement,
            },
        )

    if opts.target == TARGET_NAME:
        return run()
    from harness.mutants.vllm_scheduler import patched
    from harness.targets.vllm import VllmUnavailable, _vllm

    try:
        _vllm()
    except VllmUnavailable as e:
        print(f"kvspec fuzz: {e}", file=sys.stderr)
        return EXIT_USAGE
    with patched(opts.target.split(":", 1)[1]):
        return run()
