"""The rule-based Hypothesis state machine: a faithful vLLM 0.33 scheduler driving the spec and a
target in lockstep (``harness.check.lockstep``), stopping at the first divergence or broken invariant.

Its one rule, ``act``, performs one to ``ACTIONS_PER_RULE`` scheduler actions (a request arrives, an
engine step, a request finishes or is aborted, a remote KV load arrives, a prefix-cache reset, an
event drain), each emitting one or more ``harness.core.ops`` operations: the shared workload's
actions (``harness.world.workload``), with Hypothesis draws as the world's choices.  After the first
finding every example is a shrinking attempt; ``ShrinkStalled`` stops them once they stop helping.
``make_machine`` builds one machine class per (family, target, relation) so that each has its own
example-database key: CI re-tries the past failures of exactly that combination first.
"""

from __future__ import annotations

import dataclasses
import time
import traceback
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn, TypeVar

from hypothesis import assume, settings
from hypothesis import strategies as st
from hypothesis.errors import FailedHealthCheck, Unsatisfiable
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule

from kvspec.harness.check.guard import is_user_stop
from kvspec.harness.check.hypothesis_run import cap_shrinking, run_as_test
from kvspec.harness.check.lockstep import Finding, FindingError, Lockstep
from kvspec.harness.check.settings import CheckSettings
from kvspec.harness.core import ops as O
from kvspec.harness.core.flight import FLIGHT
from kvspec.harness.targets.base import Target, Unsupported, bind_release, get_sched_limits
from kvspec.harness.world.families import configs, near_points, workload_features
from kvspec.harness.world.workload import ACTIONS, ALPHABET, Workload, draw_sched_config
from kvspec.spec.config import KVCacheConfig

T = TypeVar("T")
ACTION_BY_NAME = {a.name: a for a in ACTIONS}
# The actions a rule picks from, in the order Hypothesis shrinks towards; engine steps dominate real
# traffic, so ``step`` is there three times.
RULE_ORDER = ("add_request", "step", "step", "step", "finish", "abort", "kv_arrives", "reset_prefix_cache")
ACTIONS_PER_RULE = 4  # the most workload actions one Hypothesis rule performs
WATERMARK_ODDS = st.integers(0, 3)  # 0: the config gets a KV-cache watermark (built once: see ``configs``)
WATERMARKS = st.sampled_from([0.1, 0.25, 0.4])


@dataclass
class RunStats:
    """Shared by all examples of one fuzzing campaign (rule and operation coverage, speed)."""

    examples: int = 0
    steps: int = 0  # operations applied
    rules: Counter[str] = field(default_factory=Counter)  # family:rule -> times run
    events: Counter[str] = field(default_factory=Counter)  # family:what the scheduler did -> times
    ops: Counter[str] = field(default_factory=Counter)
    unsupported: Counter[str] = field(default_factory=Counter)
    skipped: dict[str, str] = field(default_factory=dict)  # family -> why the target models none of it
    finding: Finding | None = None
    finding_steps: list[tuple[O.Op, Any]] = field(default_factory=list)
    finding_config: KVCacheConfig | None = None
    target_version: str = ""
    started: float = 0.0  # time.monotonic() when the campaign started
    first_finding_after: float | None = None  # seconds to the first failing example (before shrinking)
    known: Counter[str] = field(default_factory=Counter)  # known bug id -> hits (harness.ledger.known_bugs)
    known_first: dict[str, tuple[Finding, list[tuple[O.Op, Any]], KVCacheConfig, str]] = field(
        default_factory=dict
    )  # known bug id -> its first meeting: finding, steps, config, family
    # The shortest failing trace recorded so far (shrinking keeps improving it): what an interrupted
    # run reports (``harness.run.fuzzing``).
    best: tuple[Finding, list[tuple[O.Op, Any]], KVCacheConfig] | None = None
    deadline: float | None = None  # time.monotonic() by which shrinking must be over (``kvspec fuzz --seconds``)
    shrink_share: float = 1.0  # the share of the time left before ``deadline`` that shrinking may take
    on_finding: Callable[[Finding, int], None] | None = None  # called at the first finding, with the shrink bound
    poll: Callable[[], None] | None = None  # called before every operation; raises to stop (a signal came)
    # Shrinking stops (``ShrinkStalled``) once this many examples in a row found no shorter failing
    # trace (None: only Hypothesis' own bounds); ``stalled`` counts them.
    shrink_stall: int | None = None
    stalled: int = 0
    shrink_examples: int = 0  # examples run after the first finding (Hypothesis' shrinking attempts)


class ShrinkStalled(KeyboardInterrupt):
    """Hypothesis' shrinking stopped making progress (``RunStats.shrink_stall`` examples in a row without
    a shorter failing trace): the run goes on with the shortest failing trace so far (``RunStats.best``),
    which kvspec's reducer (``harness.traces.reduce``) shortens much faster than Hypothesis would.  A
    ``KeyboardInterrupt``, so Hypothesis neither takes it for a failure nor shrinks it: it stops.  The
    failing examples Hypothesis found are already in its database."""


class FamilyUnsupported(KeyboardInterrupt):
    """The target refused the first ``RESETS_BEFORE_SKIP`` configs of a family and accepted none
    (``Unsupported`` at reset, e.g. ``v0_20`` on vLLM 0.33): the family is skipped at once, instead
    of after the hundreds of refusals Hypothesis makes before it gives up (about 2 s per run).  A
    ``KeyboardInterrupt``, like ``ShrinkStalled``, so Hypothesis stops without shrinking."""


@dataclass
class Resets:
    """How one machine's resets went in this run: ``ok`` accepted, ``refused`` refused
    (``Unsupported``), ``why`` the last refusal; a family with none accepted is skipped.
    ``declined``: the examples the target refused, at reset or later, by reason."""

    ok: int = 0
    refused: int = 0
    why: str | None = None
    declined: Counter[str] = field(default_factory=Counter)


RESETS_BEFORE_SKIP = 50
"""Refusals in a row, with no accepted reset, before a family is skipped: a family whose configs
the target accepts one time in ten survives them with probability 0.9**50, under 1%."""


def _record_finding(stats: RunStats, finding: Finding, steps: list[tuple[O.Op, Any]], config: KVCacheConfig) -> None:
    """Keep ``finding`` as the latest (what Hypothesis' final replay of the shrunk example leaves) and,
    when no longer than the best so far, as the best; the first one caps shrinking (``_cap_shrinking``)."""
    first = stats.finding is None
    if stats.first_finding_after is None:
        stats.first_finding_after = time.monotonic() - stats.started
    stats.finding, stats.finding_steps, stats.finding_config = finding, steps, config
    if stats.best is None or len(steps) < len(stats.best[1]):
        stats.stalled = 0  # progress
    if stats.best is None or len(steps) <= len(stats.best[1]):
        stats.best = (finding, steps, config)
        FLIGHT.found_steps(finding.to_json(), steps, config)  # kept should the target crash from here on
    if first:
        bound = _cap_shrinking(stats)
        if stats.on_finding is not None:
            stats.on_finding(finding, bound)


def _cap_shrinking(stats: RunStats) -> int:
    """Hypothesis starts shrinking right after the first failing example and reads its bound (set
    by ``run_machine``) then: cut it to ``stats.shrink_share`` of the time left before
    ``stats.deadline`` (``harness.check.hypothesis_run.cap_shrinking``); return the bound."""
    left = None if stats.deadline is None else max(0.0, stats.deadline - time.monotonic()) * stats.shrink_share
    return cap_shrinking(left)


class DrawChoices:
    """``harness.world.workload.Choices`` backed by Hypothesis draws (so choices shrink)."""

    def __init__(self, data: Any) -> None:
        self.data = data.conjecture_data

    def integer(self, lo: int, hi: int, label: str, boundary: int | None = None) -> int:
        if hi <= lo:
            return lo
        points = near_points(boundary, lo, hi) if boundary else ()
        if points and not self.data.draw_boolean():  # half of the time near a multiple (shrinks there)
            return int(points[self._index(len(points))])
        return int(self.data.draw_integer(lo, hi))

    def boolean(self, label: str) -> bool:
        return bool(self.data.draw_boolean())

    def token(self, label: str) -> int:
        return ALPHABET[self._index(len(ALPHABET))]

    def tokens(self, n: int, label: str) -> tuple[int, ...]:
        return tuple(ALPHABET[self._index(len(ALPHABET))] for _ in range(n))

    def choice(self, options: Sequence[T], label: str) -> T:
        return options[self._index(len(options))]

    def _index(self, n: int) -> int:
        assert n > 0, "a choice among no options"
        return int(self.data.draw_integer(0, n - 1)) if n > 1 else 0


class KVMachine(RuleBasedStateMachine):
    """Configured by ``make_machine``, once, at class creation (never changed after): ``family``,
    ``target_factory``, ``checks`` (``CheckSettings``), and the run's per-run objects ``stats``
    (``RunStats``) and ``resets`` (``Resets``), which the examples update.

    Each rule performs one action of the shared workload (``harness.world.workload``) with Hypothesis
    draws as its choices; the workload's scheduler emits operations into ``Lockstep``."""

    family: str
    target_factory: Callable[[], Target]
    checks: CheckSettings
    stats: RunStats
    resets: Resets

    def __init__(self) -> None:
        super().__init__()
        self.ls: Lockstep | None = None
        self.workload: Workload | None = None
        self.found = False  # this example raised a finding (no end-of-run check then)

    # --- plumbing ------------------------------------------------------------------------------

    def _emit(self, op: O.Op) -> Any:
        assert self.ls is not None
        if self.stats.poll is not None:
            self.stats.poll()  # a KeyboardInterrupt: Hypothesis stops at once, even while shrinking
        self.stats.steps += 1
        return self._lockstep_call(self.ls.apply, op)

    def _lockstep_call(self, fn: Callable[..., Any], *args: Any, at_reset: bool = False) -> Any:
        """An example the target cannot model is discarded (at reset, the reason is kept for
        ``run_machine``); a finding is recorded and raised."""
        try:
            return fn(*args)
        except Unsupported as e:
            self.stats.unsupported[str(e)[:80]] += 1
            self.resets.declined[str(e)] += 1
            if at_reset:
                resets = self.resets
                resets.why, resets.refused = str(e), resets.refused + 1
                if not resets.ok and resets.refused >= RESETS_BEFORE_SKIP:
                    raise FamilyUnsupported(str(e)) from None
            assume(False)
        except FindingError as e:
            self.found = True
            self._record(e.finding)
            raise

    def _record(self, finding: Finding) -> None:
        assert self.ls is not None
        _record_finding(self.stats, finding, list(self.ls.steps), self.ls.config)

    def _new_target(self, config: KVCacheConfig) -> Target:
        """A fresh target; a factory that raises (even ``SystemExit``, or a ``KeyboardInterrupt`` of its
        own: ``harness.check.guard.is_user_stop``) is a ``target-raised`` finding at setup."""
        FLIGHT.begin(config)
        try:
            return type(self).target_factory()
        except KeyboardInterrupt as e:
            if is_user_stop(e):
                raise
            self._factory_raised(e, config)
        except BaseException as e:  # noqa: BLE001 - SystemExit from a user's factory must not end kvspec
            self._factory_raised(e, config)

    def _factory_raised(self, e: BaseException, config: KVCacheConfig) -> NoReturn:
        message = f"the target factory raised {type(e).__name__}: {e}"
        finding = Finding("target-raised", None, message, traceback=traceback.format_exc())
        _record_finding(self.stats, finding, [], config)
        raise FindingError(finding) from None

    def _table(self, rid: str) -> tuple[int, ...]:
        assert self.ls is not None and self.ls.tgt_obs is not None
        return self.ls.tgt_obs.tables[0].get(rid, ())

    def _act(self, ch: DrawChoices, name: str) -> None:
        assert self.workload is not None
        self.stats.rules[f"{self.family}:{name}"] += 1
        self.workload.run(name, ch)

    def _check_shrink_progress(self) -> None:
        """Every example after the first finding is one of Hypothesis' shrinking attempts (kvspec
        reports one bug per run): raise ``ShrinkStalled`` once ``stats.shrink_stall`` of them in a row
        found no shorter failing trace."""
        stats = self.stats
        if stats.finding is None:
            return
        stats.shrink_examples += 1
        if stats.shrink_stall is None:
            return
        stats.stalled += 1
        if stats.stalled > stats.shrink_stall:
            raise ShrinkStalled(f"no shorter failing trace in {stats.shrink_stall} shrinking examples")

    # --- rules ---------------------------------------------------------------------------------

    @initialize(data=st.data())
    def setup(self, data: Any) -> None:
        if self.stats.poll is not None:
            self.stats.poll()
        self._check_shrink_progress()
        config = data.draw(configs(self.family), label="config")
        features = workload_features(self.family)
        if data.draw(WATERMARK_ODDS, label="watermark?") == 0:  # vLLM 0.33 KV-cache watermark
            config = dataclasses.replace(config, watermark=data.draw(WATERMARKS, label="watermark"))
        target = self._new_target(config)
        config = bind_release(config, target)
        ch = DrawChoices(data)
        sc = draw_sched_config(ch, config, features=features)
        if limits := get_sched_limits(target):  # scheduler features the target's engine does not have
            unknown = set(limits) - {f.name for f in dataclasses.fields(sc)}
            if unknown:
                raise ValueError(f"the target's sched_limits name no scheduler knob: {sorted(unknown)}")
            sc = dataclasses.replace(sc, **limits)
        if self.checks.kv_check and sc.async_scheduling and sc.num_spec_tokens:
            # The KV-content oracle does not model draft placeholders under async scheduling yet.
            sc = dataclasses.replace(sc, num_spec_tokens=0, num_lookahead_tokens=0)
        self.stats.target_version = str(getattr(target, "version", ""))
        self.ls = Lockstep(config, target, self.checks)
        self._lockstep_call(self.ls.start, at_reset=True)
        self.resets.ok += 1
        self.stats.examples += 1
        self.workload = Workload(config, sc, self._emit, self._table, ch)
        if self.ls.ref is not None:  # what an async load's admission sets aside, on the reference state
            self.workload.sched.transfers.load_reservation = self.ls.ref.load_reservation

    @precondition(lambda machine: machine.workload is not None)
    @rule(data=st.data())
    def act(self, data: Any) -> None:
        """Up to ``ACTIONS_PER_RULE`` workload actions, each picked among those enabled (``RULE_ORDER``:
        engine steps three times over, as they dominate real traffic).  One Hypothesis rule for
        several actions: picking a rule costs Hypothesis more than a checked operation costs kvspec,
        and the choices stay plain integers, which Hypothesis shrinks towards one action, the first
        enabled one, and the reducer (``harness.traces.reduce``) then cuts operation by operation."""
        assert self.workload is not None
        ch = DrawChoices(data)
        for _ in range(ch.integer(1, ACTIONS_PER_RULE, "actions")):
            enabled = [name for name in RULE_ORDER if ACTION_BY_NAME[name].enabled(self.workload)]
            if not enabled:
                return
            self._act(ch, ch.choice(enabled, "action"))

    def teardown(self) -> None:
        try:
            if self.ls is not None and not self.found:
                # A full check if the last steps were glimpsed (large pools, harness.core.glimpse).
                self._lockstep_call(self.ls.finish)
        finally:
            self._count_run()

    def _count_run(self) -> None:
        if self.workload is not None:
            for name, n in (self.workload.sched.counts + self.workload.counts).items():
                self.stats.events[f"{self.family}:{name}"] += n
        if self.ls is not None:
            self.stats.ops.update(self.ls.op_counts)
            self.stats.known.update(self.ls.known_hits)
            for bug_id, (finding, steps) in self.ls.known_first.items():
                self.stats.known_first.setdefault(bug_id, (finding, steps, self.ls.config, self.family))


def make_machine(
    family: str,
    target_factory: Callable[[], Target],
    target_name: str,
    checks: CheckSettings,
    stats: RunStats,
) -> type[KVMachine]:
    """The machine class of ``family`` on ``target_factory``, checked as ``checks`` says, counting into
    ``stats``.  Its name (family, target, relation, oracle) keys its examples in the database."""
    target = target_name.replace(":", "_").replace(".", "_")
    name = f"KVMachine_{family}_{target}_{checks.relation}{'_kv' if checks.kv_check else ''}"
    attrs = {
        "family": family,
        "target_factory": staticmethod(target_factory),
        "checks": checks,
        "stats": stats,
        "resets": Resets(),
    }
    return type(name, (KVMachine,), attrs)


def run_machine(
    cls: type[KVMachine], hyp_settings: settings, seed: int | None = None, shrink_seconds: int = 60
) -> None:
    """Run the machine as one Hypothesis test; raises (after shrinking) on a finding.

    Shrinking is bounded by ``shrink_seconds`` (Hypothesis' own bound is 300 s, an internal
    constant with no setting; ``harness.check.hypothesis_run`` lowers it for the run), and further by
    ``stats.deadline`` when set (``_cap_shrinking``).  A family the
    target cannot build a single config of (``Unsupported`` at every reset, e.g. ``v0_20`` on
    vLLM 0.33; ``FamilyUnsupported`` after ``RESETS_BEFORE_SKIP`` of them) is skipped: recorded in
    ``stats.skipped`` and as the event ``family:unsupported_at_reset``, and not run again.  So is one
    whose examples the target refuses so often (at reset or later) that Hypothesis gives up: the
    skip says how many it refused and the commonest reason.  Giving up with no refusal at all is
    kvspec's own fault and raises.
    """
    if cls.family in cls.stats.skipped:
        return
    try:
        _run(cls, hyp_settings, seed, shrink_seconds)
    except (Unsatisfiable, FailedHealthCheck, FamilyUnsupported):
        r = cls.resets
        if r.why is not None and not r.ok:
            cls.stats.skipped[cls.family] = r.why
            cls.stats.events[f"{cls.family}:unsupported_at_reset"] += 1
            return
        if not r.declined:
            raise
        reason, n = r.declined.most_common(1)[0]
        total = sum(r.declined.values())
        cls.stats.skipped[cls.family] = (
            f"Hypothesis gave up: the target refused {total} examples ({r.ok} accepted at reset), "
            f"{n} of them because: {reason}"
        )
        cls.stats.events[f"{cls.family}:refused"] += 1


def _run(cls: type[KVMachine], hyp_settings: settings, seed: int | None, shrink_seconds: int) -> None:
    """``cls`` as one Hypothesis test; the factory's text is part of its example-database key
    (``harness.check.hypothesis_run.run_as_test``)."""

    def factory() -> KVMachine:
        return cls()

    run_as_test(factory, cls.__name__, hyp_settings, seed, shrink_seconds)
