"""The manager lockstep driver: Hypothesis' state machine (``harness.check.machine``) draws the
workload, the spec and the target are stepped together (``harness.check.lockstep``).

One turn is one Hypothesis batch (``DriveSettings.hypothesis``: the profile, ``--batch`` examples) of
one family, seeded ``(seed * 1_000_003 + turn * workers + worker) mod 2**64`` (so one worker reproduces the
single-process run).  A failing example is Hypothesis' to shrink while that helps
(``--shrink-stall``; off by default), then the reducer's (``harness.traces.reduce``).  The state
machines are made once per run, one per family, and share the run's ``RunStats``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import time
import unittest
from collections import Counter
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any

from kvspec.harness.check.machine import KVMachine, RunStats, ShrinkStalled, make_machine, run_machine
from kvspec.harness.drivers.base import (
    DriveHooks,
    DriveSettings,
    Found,
    Interrupted,
    Plan,
    Tally,
    TurnOutcome,
    reduce_finding,
)
from kvspec.harness.drivers.isolated import CRASHED, replay_isolated
from kvspec.harness.targets.base import get_declined_families
from kvspec.harness.traces.replay import ReplayResult, replay
from kvspec.harness.traces.trace import Trace, trace_to_json

KNOWN_PREFIX = re.compile(r"known bug K\d+ \([^)]*\): ")
"""How a known bug's finding message starts (``harness.check.lockstep``: the bug's id and name)."""
KNOWN_REDUCE_SECONDS = 5.0
KNOWN_REDUCE_SHARE = 0.1
"""A known bug's first trace is reduced for up to a tenth of the run's time, at most 5 s, after the
run: its report (written once per ``--out`` folder) shows the smallest scenario found."""


class LockstepDriver:
    """``kvspec fuzz`` on a manager target (``spec``, ``vllm``, ``impl``, ``mutant:NAME``, a user's
    ``package.module:factory``): the module docstring."""

    one_process = False
    kv_check = True

    def __init__(self, factory: Callable[[], Any], settings: DriveSettings, hooks: DriveHooks) -> None:
        self.factory, self.settings, self.hooks = factory, settings, hooks
        self.stats = RunStats(poll=hooks.poll, shrink_stall=settings.shrink_stall)
        self.stats.started = time.monotonic()
        if hooks.deadline is not None:
            self.stats.deadline, self.stats.shrink_share = hooks.deadline, hooks.shrink_share
        if hooks.on_found is not None:
            on_found = hooks.on_found
            self.stats.on_finding = lambda finding, bound: on_found(finding.kind, bound)
        self.machines: dict[str, type[KVMachine]] = {}

    def session(self) -> AbstractContextManager[None]:
        return contextlib.nullcontext()

    def plan(self, families: Sequence[str]) -> Plan:
        """Every chosen family the target does not decline (``declined_families``, with why), its
        machine made now (a family the target refuses at every reset is skipped when met); under the
        ``replay`` profile, one turn per family."""
        declined = get_declined_families(self.factory)  # on the factory (a class): no target is built here
        skipped = {fam: declined[fam] for fam in families if fam in declined}
        run = tuple(fam for fam in families if fam not in skipped)
        self.machines = {fam: self.machine(fam) for fam in run}
        return Plan(run, skipped, turns=None if self.settings.generates else len(run))

    def machine(self, family: str) -> type[KVMachine]:
        return make_machine(family, self.factory, self.settings.target, self.settings.checks, self.stats)

    def turn_seed(self, seed: int, turn: int, worker: int, workers: int) -> int:
        """Taken modulo 2**64, so that any ``--seed`` (negative, or ``$(date +%s%N)``) gives a seed a
        trace can record (its field holds 64 bits)."""
        return (seed * 1_000_003 + turn * workers + worker) % SEED_RANGE

    def run_turn(self, family: str, seed: int | None) -> TurnOutcome:
        """One batch: a finding is recorded (the shortest so far when shrinking was cut short by a
        signal or by ``--shrink-stall``); Hypothesis giving up on the target with no finding stops the
        run."""
        s = self.settings
        try:
            run_machine(self.machines[family], s.hypothesis, seed=seed, shrink_seconds=s.shrink_seconds)
        except unittest.SkipTest as e:  # the replay profile with nothing stored for this machine: no run at all
            return TurnOutcome(stopped=None if not s.generates else f"SkipTest: {e}")
        except Interrupted as e:  # while generating or shrinking: the smallest failing trace so far, as it is
            return TurnOutcome(found=self.found(family, seed, shortest=True), interrupted=e.signum)
        except ShrinkStalled:  # shrinking stopped helping: the smallest failing trace so far, to be reduced
            return TurnOutcome(found=self.found(family, seed, shortest=True))
        except BaseException as e:  # noqa: BLE001 - a finding, or Hypothesis giving up on the target
            if isinstance(e, KeyboardInterrupt):
                raise
            found = self.found(family, seed)
            return TurnOutcome(found=found, stopped=None if found else f"{type(e).__name__}: {e}")
        return TurnOutcome(skipped=self.stats.skipped.get(family))

    def progress(self) -> tuple[int, int]:
        return self.stats.examples, self.stats.steps

    def found(self, family: str, seed: int | None, shortest: bool = False) -> Found | None:
        """The finding the run recorded (``shortest``: the smallest so far), as a ``Found``; None if none."""
        trace = finding_trace(self.stats, self.settings, seed, family, shortest)
        if trace is None:
            return None
        finding = recorded(self.stats, shortest)[0]
        st = self.stats
        return Found(trace, finding, family, st.first_finding_after, len(trace.steps), st.shrink_examples)

    def reduce(self, found: Found, seconds: float) -> Found:
        trace, finding = reduce_finding(
            found.trace, found.finding, self.factory, self.settings.checks, seconds, self.hooks.stopping
        )
        found.trace, found.finding = trace, finding
        return found

    def tally(self, elapsed: float) -> Tally:
        st, s = self.stats, self.settings
        seconds = min(KNOWN_REDUCE_SECONDS, elapsed * KNOWN_REDUCE_SHARE)
        known_traces = {
            bug_id: trace_to_json(
                self.reduce_known(
                    run_trace(st, s, finding, steps, config, s.seed % SEED_RANGE, family), finding, seconds
                )
            )
            for bug_id, (finding, steps, config, family) in st.known_first.items()
        }
        return Tally(st.examples, st.steps, Counter(st.events), Counter(st.known), known_traces, dict(st.skipped))

    def reduce_known(self, trace: Trace, finding: Any, seconds: float) -> Trace:
        """A known bug's first meeting (``finding``, its message naming the bug), reduced as a finding
        is for up to ``seconds``: replayed with ``strict_known``, where the bug is raised rather than
        counted, and kept while it still raises it; the message names the bug again.  As recorded
        when it does not replay so, or nothing smaller does."""
        from kvspec.harness.traces.reduce import run_ops

        named = KNOWN_PREFIX.match(finding.message)
        if named is None or seconds <= 0 or self.hooks.stopping():
            return trace
        checks = dataclasses.replace(self.settings.checks, strict_known=True)
        try:
            strict, _ = run_ops(trace.config, trace.ops, self.factory, checks)
        except Exception:  # noqa: BLE001 - a target that does not replay outside the run: keep it as recorded
            return trace
        if strict is None or (strict.kind, strict.invariant) != (finding.kind, finding.invariant):
            return trace
        trace, reduced = reduce_finding(trace, strict, self.factory, checks, seconds, self.hooks.stopping)
        if trace.finding is not None and not KNOWN_PREFIX.match(str(trace.finding.get("message", ""))):
            trace.finding["message"] = named.group(0) + reduced.message
        return trace

    def check_trace(self, trace: Trace, where: str) -> None:
        return None

    def replay(self, trace: Trace, where: str) -> ReplayResult:
        """In this process; a trace that ends in a crash (or hang) in a child (``harness.drivers.isolated``)."""
        if (trace.finding or {}).get("kind") in (CRASHED, "target-hung"):
            return replay_isolated(trace, self.factory, self.settings.checks)
        return replay(trace, self.factory, self.settings.checks)


def recorded(stats: RunStats, best: bool = False) -> tuple[Any, list[tuple[Any, Any]], Any]:
    """The finding ``stats`` recorded last (``best``: the shortest so far, when there is one), with its
    steps and config; the finding is None when there is none."""
    if best and stats.best is not None:
        return stats.best
    return stats.finding, stats.finding_steps, stats.finding_config


def finding_trace(
    stats: RunStats, settings: DriveSettings, seed: int | None, family: str, best: bool = False
) -> Trace | None:
    """The ``Trace`` of the finding ``stats`` recorded last (``best``: the shortest so far); None when
    the run stopped without one."""
    finding, steps, config = recorded(stats, best)
    if finding is None or config is None:
        return None
    return run_trace(stats, settings, finding, list(steps), config, seed, family)


def run_trace(
    stats: RunStats,
    settings: DriveSettings,
    finding: Any,
    steps: list[tuple[Any, Any]],
    config: Any,
    seed: int | None,
    family: str | None = None,
) -> Trace:
    """The ``Trace`` of ``finding`` at ``steps`` of ``config`` in this run (its target, release,
    profile and relation), ``seed`` the batch's (a finding) or the run's (a known bug's first meeting)."""
    return Trace(
        config=config,
        steps=steps,
        target_name=settings.target,
        target_version=stats.target_version,
        seed=seed,
        profile=settings.profile,
        family=family,
        relation=settings.checks.relation,
        finding=finding.to_json(),
    )


SEED_RANGE = 1 << 64  # a trace's seed is recorded in 64 bits (harness.traces.trace)
