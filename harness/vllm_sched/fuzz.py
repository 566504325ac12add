"""The real-scheduler driver: ``kvspec fuzz --target vllm-scheduler`` (and ``mutant:NAME`` of a
deliberate scheduler bug), vLLM's real scheduler driven with the spec in lockstep behind its
``KVCacheManager`` (``harness.vllm_sched.driver.run_one``), run by the one loop (``harness.run.fuzzing``).

One turn is one run of the real scheduler: turn ``i`` draws a family of the chosen ones in turn, a
config of it and the scheduler knobs from ``SeededChoices(Random(seed, i))`` (``run_seed``), so
``--seed`` reproduces a run.  Families the real scheduler cannot run on CPU are skipped with a message.
A finding is reduced first where its inputs are (the scheduler re-driven with simpler world draws,
``harness.vllm_sched.reduce``), then, when its operations alone reproduce it, by replaying them on the
real manager (``harness.traces.reduce``).  Its ``trace.json`` holds ordinary harness operations, so
``kvspec replay`` reproduces it on ``--target vllm`` or ``spec``; a finding only the world's checks or
the agreement see records ``--target vllm-scheduler``, whose replay re-drives the real scheduler from
the run's family and seed (``replay_scheduler_run``).
"""

from __future__ import annotations

import contextlib
import random
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from kvspec.harness.check.finding import Finding
from kvspec.harness.drivers.base import DriveHooks, DriveSettings, Found, Plan, Tally, TurnOutcome
from kvspec.harness.targets.base import Unsupported
from kvspec.harness.traces.trace import Trace, trace_to_json
from kvspec.harness.vllm_sched.build import SchedKnobs
from kvspec.harness.vllm_sched.driver import SCHED_FAMILIES, RunResult

if TYPE_CHECKING:
    from kvspec.harness.traces.replay import ReplayResult

TARGET_NAME = "vllm-scheduler"


def scheduler_families(families: list[str]) -> tuple[list[str], list[str]]:
    """(families the real scheduler runs, the others): every kvspec layout family it supports; with
    all of kvspec's families chosen (``--family all``), also ``connector`` and ``spec_decode``."""
    from kvspec.harness.world.families import FAMILIES

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
    from kvspec.harness.vllm_sched.reduce import run_overridden

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
    from kvspec.harness.targets.vllm import vllm_version
    from kvspec.harness.vllm_sched.reduce import overrides_to_json

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
        relation=res.checks.relation,
        finding=finding.to_json(),
        extra={
            "driver": TARGET_NAME,
            "knobs": knobs_json(res.knobs),
            "engine_steps": res.engine_steps,
            **({"choice_overrides": overrides_to_json(overrides)} if overrides else {}),
        },
    )


def needs_world(finding: Finding) -> bool:
    """Does the finding come from the world's checks or the agreement (``harness.vllm_sched.world_checks``,
    ``harness.vllm_sched.mirror``), so that only re-driving the real scheduler reproduces it
    (``kvspec replay --target vllm-scheduler``), not replaying its operations on a manager?"""
    return finding.kind in ("conservation", "agreement") or finding.witness.get("check") == "world"


MAX_REPLAY_ENGINE_STEPS = 100_000


def scheduler_run_of(trace: Trace, where: str) -> tuple[str, int, int, dict[tuple[str, int], int]]:
    """(family, run seed, engine steps, the draws its reduction replaced) of a report the real
    scheduler's fuzz wrote, checked: a trace is data, so anything else is a ``ValueError`` naming
    the problem."""
    from kvspec.harness.vllm_sched.reduce import overrides_from_json

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
    from kvspec.harness.mutants.vllm_scheduler import patched
    from kvspec.harness.traces.reduce import finding_signature
    from kvspec.harness.traces.replay import ReplayResult

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


class SchedulerDriver:
    """vLLM's real scheduler as a driver of the one loop (module docstring); ``mutant``: a deliberate
    scheduler bug (``harness.mutants.vllm_scheduler``) patched in for the whole run."""

    one_process = True  # one real scheduler per process; no --workers
    kv_check = False  # no KV-content oracle behind the real scheduler

    def __init__(
        self, factory: Callable[[], Any], settings: DriveSettings, hooks: DriveHooks, mutant: str | None = None
    ) -> None:
        self.settings, self.hooks, self.mutant = settings, hooks, mutant
        self.started = time.monotonic()
        self.totals: Counter[str] = Counter()  # runs, engine steps, manager calls, operations, requests
        self.manager_seconds = 0.0
        self.known: Counter[str] = Counter()
        self.known_traces: dict[str, dict[str, Any]] = {}

    def session(self) -> AbstractContextManager[None]:
        from kvspec.harness.mutants.vllm_scheduler import patched

        return patched(self.mutant) if self.mutant else contextlib.nullcontext()

    def plan(self, families: Sequence[str]) -> Plan:
        runs, others = scheduler_families(list(families))
        skipped = {f: "the real scheduler does not run it on CPU here" for f in others}
        off = [name for name, on in self.world_checks().items() if not on]
        note = f"choose from {', '.join(SCHED_FAMILIES)}" if not runs else (f"off: {', '.join(off)}" if off else "")
        return Plan(tuple(runs), skipped, note=note)

    def world_checks(self) -> dict[str, bool]:
        """``run_one``'s switches for the world's checks and the agreement."""
        s = self.settings
        return {"world_facts": s.world_checks, "conservation": s.world_checks, "agreement": s.agreement}

    def turn_seed(self, seed: int, turn: int, worker: int, workers: int) -> int:
        return run_seed(seed, turn * workers + worker)

    def run_turn(self, family: str, seed: int | None) -> TurnOutcome:
        """One run of the real scheduler: a family it cannot build is skipped; the scheduler raising
        outside a manager call stops the run, saying how to reproduce it."""
        assert seed is not None, "the real scheduler's runs are always seeded"
        try:
            res = one_run(
                family,
                seed,
                None,
                deadline=self.hooks.ends,
                checks=self.settings.checks,
                stop=self.hooks.stopping,
                **self.world_checks(),
            )
        except Unsupported as e:
            return TurnOutcome(skipped=f"{e} (seed {seed})")
        except Exception as e:  # noqa: BLE001 - the real scheduler itself failed: said, not a traceback
            where = f"{type(e).__name__}: {e}".splitlines()[0][:300]
            return TurnOutcome(
                stopped=f"the real scheduler raised outside a manager call ({where}); family {family}, run seed "
                f"{seed}; reproduce with: python -c 'from kvspec.harness.vllm_sched.fuzz import one_run; "
                f'one_run("{family}", {seed})\''
            )
        self.count(res, family, seed)
        if res.finding is None:
            return TurnOutcome()
        after = time.monotonic() - self.started
        found = Found(finding_trace(res, family, seed), res.finding.finding, family, after, len(res.steps))
        found.state = (res, seed)
        return TurnOutcome(found=found)

    def count(self, res: RunResult, family: str, seed: int) -> None:
        """A run's figures into the totals; the first meeting of each known bug as its trace."""
        self.totals.update(
            runs=1, engine_steps=res.engine_steps, calls=res.manager_calls, ops=res.ops, requests=res.requests
        )
        self.manager_seconds += res.manager_seconds
        self.known.update(res.known_hits)
        for bug_id, (first, steps) in res.known_first.items():
            if bug_id not in self.known_traces:
                self.known_traces[bug_id] = trace_to_json(finding_trace(res, family, seed, first, steps))

    def progress(self) -> tuple[int, int]:
        return self.totals["runs"], self.totals["ops"]

    def reduce(self, found: Found, seconds: float) -> Found:
        """First the run itself, re-driving the real scheduler with simpler inputs (under the
        session's mutant, if any), then its operations replayed on the real manager
        (``harness.drivers.base.reduce_finding``: it keeps only traces the spec accepts as a
        caller's), when they alone reproduce the finding: the run gets 70% of ``seconds`` then, all
        of them for a finding only re-driving the scheduler reproduces (an ``agreement``, say)."""
        from kvspec.harness.drivers.base import reduce_finding
        from kvspec.harness.targets.vllm import VllmTarget
        from kvspec.harness.vllm_sched.reduce import reduce_scheduler_run

        res, seed = found.state
        start = time.monotonic()
        share = 1.0 if needs_world(found.finding) else 0.7
        reduced = reduce_scheduler_run(res, found.family, seed, share * seconds, should_stop=self.hooks.stopping)
        small = reduced.result
        assert small.finding is not None
        trace = finding_trace(small, found.family, seed, overrides=reduced.overrides)
        finding = small.finding.finding
        if not needs_world(finding):  # the operations alone reproduce it on the real manager
            left = max(0.0, seconds - (time.monotonic() - start))
            trace, finding = reduce_finding(trace, finding, VllmTarget, small.checks, left, self.hooks.stopping)
        trace.extra["recorded_steps"] = len(res.steps)
        trace.extra["scheduler_reduction"] = {
            "runs": reduced.runs,
            "seconds": round(reduced.seconds, 3),
            "steps_before": len(res.steps),
            "steps_after": len(small.steps),
        }
        found.trace, found.finding = trace, finding
        return found

    def tally(self, elapsed: float) -> Tally:
        t = self.totals
        detail = (
            f"{t['runs']} scheduler runs, {t['engine_steps']} engine steps ({t['engine_steps'] / elapsed:.0f}/s), "
            f"{t['calls']} manager calls mirrored ({t['calls'] / elapsed:.0f}/s), {t['requests']} requests; "
            f"{1e6 * self.manager_seconds / max(t['calls'], 1):.1f} us per bare manager call"
        )
        return Tally(
            t["runs"], t["ops"], known=Counter(self.known), known_traces=dict(self.known_traces), detail=detail
        )

    def check_trace(self, trace: Trace, where: str) -> None:
        scheduler_run_of(trace, where)

    def replay(self, trace: Trace, where: str) -> ReplayResult:
        return replay_scheduler_run(trace, where, self.mutant)
